//! Model-checked races of the shared volume's protocol (shuttle): clients deciding changes on
//! their own tables (the real [`Meta`] and its batches), appending them through the real
//! [`Appender`] with the real [`touch::touched`] to the in-memory engine (each engine
//! call one atomic step), catching up through the real [`foreign`] filter, and deciding again
//! after a conflict as [`Fs::changing`] does. In every interleaving shuttle tries: the log,
//! replayed alone from nothing, passes every change's checks at its place (no cycle, no name
//! twice); every client's table ends equal to that replay; each operation's answer is the one
//! the log's order gives. Mutants of the protocol (a move that does not name the directories
//! its check reads; appends that claim to have seen everything; every inode touched shared;
//! a client's own shared touches counted as having seen the directory; trimmed versions
//! read as never touched) must be caught. A trim of the engine's versions up to its head
//! lands somewhere in every run. A client that joins on the root alone and loads what it
//! uses races too ([`lazy`]), with its own mutants (the state and the log's head read in
//! two steps; what was loaded installed before the table reached that head).

use super::append::{refused, Appender};
use super::catchup::foreign;
use super::*;
use crate::engine::mem::MemEngine;
use crate::meta::{Body, Dir, Inode, Journal, Kind, ROOT_INO};
use crate::sync::thread;
use races::{agree, one_directory, races};

mod lazy;
mod races;

/// How a model client names what its changes touch (the protocol, or a mutant of it).
#[derive(Clone, Copy)]
enum Protocol {
    /// The keys as [`touch::touched_as`] names them (the real protocol, or its mutants).
    Touch(touch::Protocol),
    /// Every append says it saw every inode's newest version.
    SeenEverything,
    /// A client's own change that touched a directory shared counts as its table having
    /// seen every change of that directory before it ([`Ahead::noted`] raising shared keys).
    AheadRaisesShared,
    /// The engine's trimmed versions read as never touched, not as the versions' floor
    /// ([`MemEngine::floorless`]).
    FloorlessTrim,
    /// A load reads the log's head, then the state, in two steps (not one script).
    LoadHeadApart,
    /// A load installs what it read before its table is caught up to the state's head.
    LoadInstallFirst,
}

/// The engine a run of `protocol` appends to.
fn engine_for(protocol: Protocol) -> Arc<MemEngine> {
    let engine = MemEngine::new();
    if matches!(protocol, Protocol::FloorlessTrim) {
        engine.floorless();
    }
    Arc::new(engine)
}

/// Trims the engine's versions up to its head at some point of the run, as a checkpoint
/// does up to its own (which every member has applied; here clients may lag behind it,
/// which the floor must catch).
fn trimmer(engine: &Arc<MemEngine>) -> thread::JoinHandle<()> {
    let e = engine.clone();
    thread::spawn(move || {
        let head = e.head().unwrap();
        e.trim_versions(head, touch::BIRTH_KEYS).unwrap();
    })
}

const REAL: Protocol = Protocol::Touch(touch::Protocol::Real);

struct Shared {
    who: String,
    engine: Arc<MemEngine>,
    ahead: Mutex<Ahead>,
    answered: Condvar,
    applied: AtomicU64,
    protocol: Protocol,
    /// Turns this client's changes claimed (the inodes they made): given back when the
    /// change ends (the product's lingering thread gives them back later).
    claimed: Mutex<Vec<Ino>>,
}

struct Recorder(Arc<Shared>);

impl Journal for Recorder {
    fn record(&mut self, changes: &[Change], table: &TableView<'_>) -> Result<()> {
        let s = &self.0;
        let named = match s.protocol {
            Protocol::Touch(p) => p,
            _ => touch::Protocol::Real,
        };
        let (keys, claim) = touch::touched_as(changes, table, named);
        if let Some(dir) = touch::names_read_unloaded(changes, table) {
            return Err(Error::unloaded(dir));
        }
        let state = super::state::ops_of(changes, false);
        let applied = match s.protocol {
            Protocol::SeenEverything => AtomicU64::new(u64::MAX / 2),
            _ => AtomicU64::new(s.applied.load(Ordering::SeqCst)),
        };
        let appender = Appender {
            engine: &*s.engine,
            who: &s.who,
            ahead: &s.ahead,
            answered: &s.answered,
            applied: &applied,
            lost_answer_wait: Duration::ZERO,
        };
        let sent = appender.append(
            &record::encode(0, changes),
            &keys,
            &claim,
            Marks {
                state: &state,
                ..Marks::default()
            },
            &[],
            true,
        );
        if let Ok(done) = &sent.answer {
            s.claimed.lock().extend(claim);
            if matches!(s.protocol, Protocol::AheadRaisesShared) {
                s.ahead.lock().noted(done.lsn, &keys.all());
            }
        }
        sent.answer.map(|_| ()).map_err(|e| refused(e, &keys))
    }

    fn commuting_dirs(&self) -> bool {
        true
    }
}

struct Client {
    shared: Arc<Shared>,
    meta: Mutex<Meta>,
}

impl Client {
    /// A client that joined by replaying the whole log.
    fn join(engine: &Arc<MemEngine>, who: &str, protocol: Protocol, inos: u64) -> Client {
        let c = Client::new(engine, who, protocol, inos);
        c.catch_up();
        c
    }

    /// A client with an empty table and a session, given inode numbers `inos..`.
    fn new(engine: &Arc<MemEngine>, who: &str, protocol: Protocol, inos: u64) -> Client {
        engine
            .start_session(who, Duration::from_secs(3600))
            .unwrap();
        let shared = Arc::new(Shared {
            who: who.into(),
            engine: engine.clone(),
            ahead: Mutex::new(Ahead::default()),
            answered: Condvar::new(),
            applied: AtomicU64::new(0),
            protocol,
            claimed: Mutex::new(Vec::new()),
        });
        let mut meta = Meta::new_shared(0o755, 0, 0);
        meta.set_journal(Box::new(Recorder(shared.clone())));
        meta.give_inos(inos..inos + 100);
        Client {
            shared,
            meta: Mutex::new(meta),
        }
    }

    /// As the product's catch-up: read after the applied log, skip this client's own.
    fn catch_up(&self) {
        self.catch_up_through(u64::MAX);
    }

    /// [`Client::catch_up`] up to change `through` (a load's head) at most; a partial
    /// table takes the changes of what it holds ([`Meta::held_of`], as [`Fs::apply_followed`]
    /// does).
    fn catch_up_through(&self, through: u64) {
        let s = &self.shared;
        loop {
            let after = s.applied.load(Ordering::SeqCst);
            if after >= through {
                return;
            }
            let mut got = s.engine.read_after(after, READ_BATCH).unwrap();
            got.retain(|(lsn, _)| *lsn <= through);
            let Some((last, _)) = got.last() else {
                return;
            };
            let records = foreign(&s.ahead.lock(), &got).unwrap();
            {
                let mut meta = self.meta.lock();
                let changes = meta.held_of(&records).changes;
                for c in changes {
                    if let Err(e) = meta.apply(c) {
                        panic!("{}'s table cannot take {c:?}: {e}", s.who);
                    }
                }
                self.check_held(&meta);
            }
            s.applied.store(*last, Ordering::SeqCst);
            s.ahead.lock().applied(*last);
        }
    }

    /// A change decided on this table, as [`Fs::changing`] runs it: again after a conflict,
    /// caught up and holding the turn of the inode it lost on (turns taken in inode order,
    /// so it cannot lose on one twice and two clients never wait for each other's), and a
    /// failure again once on a table caught up.
    fn change(&self, op: impl Fn(&mut Meta) -> Result<()>) -> Result<()> {
        let s = &self.shared;
        let mut fresh = false;
        let mut held: Vec<Ino> = Vec::new();
        let mut tries = 0;
        let mut loaded = None;
        let answer = loop {
            tries += 1;
            assert!(tries < 1000, "a change lost 1000 times in a row");
            let decided = op(&mut self.meta.lock());
            match decided {
                Ok(()) => break Ok(()),
                // What a partial table lacks: loaded, and the change decided again (ENOENT
                // where the last load brought nothing of it: gone meanwhile).
                Err(e) if e.unloaded.is_some() => {
                    let ino = e.unloaded.unwrap();
                    if loaded == Some(ino) {
                        break Err(Error::new(libc::ENOENT, e.message));
                    }
                    self.load(&[ino], &[ino]);
                    loaded = Some(ino);
                }
                // A catch-up may unload what was loaded (another client's name put there).
                Err(e) => {
                    loaded = None;
                    match e.conflict {
                        // A directory shared with others: passed, as [`Fs::changing`] does.
                        Some(ino) if e.conflict_shared => {
                            s.engine.give_turns(&s.who, &held).unwrap();
                            held.clear();
                            self.take_turn(ino);
                            self.catch_up();
                            s.engine.give_turns(&s.who, &[ino]).unwrap();
                        }
                        Some(ino) => {
                            if !held.contains(&ino) {
                                let (again, keys) = crate::fs::turns_in_order(&held, ino);
                                if again {
                                    s.engine.give_turns(&s.who, &held).unwrap();
                                    held.clear();
                                }
                                for key in keys {
                                    if !held.contains(&key) {
                                        self.take_turn(key);
                                        held.push(key);
                                    }
                                }
                            }
                            self.catch_up();
                        }
                        None if !fresh => {
                            self.catch_up();
                            fresh = true;
                        }
                        None => break Err(e),
                    }
                }
            }
        };
        held.append(&mut s.claimed.lock());
        s.engine.give_turns(&s.who, &held).unwrap();
        answer
    }

    /// Takes inode `key`'s turn, letting the others run while another client holds it.
    fn take_turn(&self, key: Ino) {
        let s = &self.shared;
        loop {
            match s
                .engine
                .take_turn(&s.who, key, Duration::from_secs(3600), Duration::ZERO)
            {
                Ok(_) => return,
                Err(EngineError::TurnBusy { .. }) => thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
    }

    fn mkdir(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.change(|meta| {
            if dir_of(meta, parent)?.get(name).is_some() {
                return Err(Error::new(libc::EEXIST, "taken"));
            }
            let mut b = meta.batch();
            let body = Body::Dir(Box::new(Dir::new(parent)));
            let ino = b.make(Inode::new(Kind::Dir, 0o755, 0, 0, body));
            b.insert_entry(parent, name, ino)?;
            b.stamp_dir(parent, 1)?;
            b.commit()
        })
    }

    /// Moves directory `parent/name` to `to/new` (no replacing).
    fn rename(&self, parent: Ino, name: &[u8], to: Ino, new: &[u8]) -> Result<()> {
        self.change(|meta| {
            let missing = || Error::new(libc::ENOENT, "no such entry");
            let src = dir_of(meta, parent)?.get(name).ok_or_else(missing)?;
            if dir_of(meta, to)?.get(new).is_some() {
                return Err(Error::new(libc::EEXIST, "taken"));
            }
            if within(meta, to, src)? {
                return Err(Error::new(libc::EINVAL, "below itself"));
            }
            let mut b = meta.batch();
            b.remove_entry(parent, name)?;
            b.insert_entry(to, new, src)?;
            if parent != to {
                b.set_parent(src, to)?;
                b.stamp_dir(parent, -1)?;
                b.stamp_dir(to, 1)?;
            } else {
                b.stamp_dir(parent, 0)?;
            }
            b.commit()
        })
    }

    fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.change(|meta| {
            let ino = dir_of(meta, parent)?
                .get(name)
                .ok_or_else(|| Error::new(libc::ENOENT, "no such entry"))?;
            if !dir_of(meta, ino)?.is_empty() {
                return Err(Error::new(libc::ENOTEMPTY, "not empty"));
            }
            let mut b = meta.batch();
            b.remove_entry(parent, name)?;
            b.stamp_dir(parent, -1)?;
            b.update(ino, |a| a.nlink = 0)?;
            b.drop_if_unused(ino);
            b.commit()
        })
    }

    /// The trees two moves race in (`/p/a/f/e` and `/q/b/c/d`: moving `a` into `d` and `b`
    /// into `e` together would make a cycle), and directories `others` in the root.
    fn cycle_tree(&self, others: &[&[u8]]) {
        let tree: [&[&[u8]]; 8] = [
            &[b"p"],
            &[b"p", b"a"],
            &[b"p", b"a", b"f"],
            &[b"p", b"a", b"f", b"e"],
            &[b"q"],
            &[b"q", b"b"],
            &[b"q", b"b", b"c"],
            &[b"q", b"b", b"c", b"d"],
        ];
        for path in tree {
            let (name, above) = path.split_last().unwrap();
            self.mkdir(self.resolve(above).unwrap(), name).unwrap();
        }
        for name in others {
            self.mkdir(ROOT_INO, name).unwrap();
        }
    }

    /// The inode `path` (names from the root) leads to.
    fn resolve(&self, path: &[&[u8]]) -> Option<Ino> {
        let meta = self.meta.lock();
        path.iter().try_fold(ROOT_INO, |at, name| {
            meta.get(at).and_then(Inode::dir).and_then(|d| d.get(name))
        })
    }
}

/// Whether `ino` is `ancestor` or below it (the rename's check, as `fs` makes it): on a
/// partial table, loading each directory of the walk it does not hold.
fn within(meta: &Meta, mut ino: Ino, ancestor: Ino) -> Result<bool> {
    for _ in 0..64 {
        if ino == ancestor {
            return Ok(true);
        }
        let Some(i) = meta.get(ino) else {
            return match meta.is_partial() {
                true => Err(Error::unloaded(ino)),
                false => Ok(false),
            };
        };
        match i.dir() {
            Some(d) if d.parent() != ino => ino = d.parent(),
            _ => return Ok(false),
        }
    }
    Ok(true) // a cycle: below everything on it
}

/// Directory `ino` with its names, as the file system reads it: [`Error::unloaded`] where a
/// partial table does not hold them.
fn dir_of(meta: &Meta, ino: Ino) -> Result<&Dir> {
    let i = meta.get(ino).ok_or_else(|| match meta.is_partial() {
        true => Error::unloaded(ino),
        false => Error::new(libc::ENOENT, "no such directory"),
    })?;
    let d = i
        .dir()
        .ok_or_else(|| Error::new(libc::ENOTDIR, "not a directory"))?;
    match meta.names_unloaded(ino) {
        true => Err(Error::unloaded(ino)),
        false => Ok(d),
    }
}

/// Every directory of `meta` reaches the root by its parents, and every name leads to an
/// inode the table holds.
fn well_formed(meta: &Meta) -> std::result::Result<(), String> {
    for ino in meta.inos() {
        let Some(d) = meta.get(ino).and_then(Inode::dir) else {
            continue;
        };
        if !within(meta, ino, ROOT_INO).unwrap_or(false) {
            return Err(format!(
                "directory {ino} is on a cycle, cut off from the root"
            ));
        }
        for (_, name, target) in d.entries_after(0) {
            if meta.get(target).is_none() {
                return Err(format!("{ino}/{name:?} leads to a missing inode {target}"));
            }
        }
    }
    Ok(())
}

/// The engine's log replayed alone from nothing, checked after every change: the state a
/// serial history gives.
fn replayed(engine: &MemEngine) -> Meta {
    let mut meta = Meta::new_shared(0o755, 0, 0);
    for (lsn, bytes) in engine.read_after(0, 10_000).unwrap() {
        for c in super::catchup::entry_changes(lsn, &bytes).unwrap() {
            meta.apply(&c).unwrap();
        }
        if let Err(why) = well_formed(&meta) {
            panic!("after change {lsn} of the log: {why}");
        }
    }
    meta
}

/// What every client's table must agree on: each directory's names (each table places
/// those others add, so their `readdir` cookies differ), every inode's attributes.
fn digest(meta: &Meta) -> crate::meta::Digest {
    meta.digest_of_names()
}

#[test]
fn model_shared_changes_are_one_serial_history() {
    shuttle::check_random(|| races(REAL), 1000);
    shuttle::check_random(|| one_directory(REAL), 1000);
    shuttle::check_random(|| lazy::lazy_join(REAL, false), 1000);
    // PCT finds the orders of few preemptions a load's window needs (a change landing
    // between two of its steps) in far fewer runs than random choices do.
    shuttle::check_pct(|| lazy::lazy_join(REAL, false), 1000, 3);
    // A joiner that forgets what it loaded between its changes.
    shuttle::check_random(|| lazy::lazy_join(REAL, true), 500);
    shuttle::check_pct(|| lazy::lazy_join(REAL, true), 500, 3);
}

/// The checker has teeth: each mutant of the protocol is caught in some interleaving.
#[test]
fn model_shared_protocol_mutants_are_caught() {
    for (mutant, name, broken) in [
        (
            Protocol::Touch(touch::Protocol::NoAncestors),
            "a move that does not name the directories it checks",
            &["cycle"][..],
        ),
        (
            Protocol::Touch(touch::Protocol::AllShared),
            "every inode touched shared",
            &[
                "cut off",
                "cycle",
                "missing inode",
                "differs",
                "box removed true",
            ],
        ),
        (
            Protocol::AheadRaisesShared,
            "own shared touches counted as seeing the directory",
            &["cut off", "missing inode", "differs", "box2 removed true"],
        ),
        (
            Protocol::FloorlessTrim,
            "trimmed versions read as never touched",
            &[
                "made 2 times",
                "cycle",
                "missing inode",
                "differs",
                "removed true, moved true",
                "box removed true",
                "box2 removed true",
            ],
        ),
        (
            Protocol::SeenEverything,
            "appends that claim to have seen everything",
            &[
                "made 2 times",
                "missing inode",
                "differs",
                "removed true, moved true",
            ],
        ),
        (
            Protocol::LoadHeadApart,
            "a load that reads the log's head and the state in two steps",
            &["cannot take", "differs", "missing inode"],
        ),
        (
            Protocol::LoadInstallFirst,
            "a load that installs before its table reaches the state's head",
            &["cannot take", "differs", "missing inode"],
        ),
    ] {
        let caught = std::panic::catch_unwind(|| {
            shuttle::check_random(
                move || {
                    races(mutant);
                    one_directory(mutant);
                },
                300,
            );
            // Up to 3,000 PCT runs: a caught mutant stops at its first failing run (a few
            // dozen here), and the load's window needs a change landing between two of its
            // steps, which 300 runs missed in about one of ten checks.
            shuttle::check_pct(move || lazy::lazy_join(mutant, false), 3000, 3);
        });
        let why = match caught {
            Ok(()) => panic!("the model missed the mutant: {name}"),
            Err(panic) => crate::error::panic_message(&*panic),
        };
        // Caught by the promise it breaks, not by the model itself failing.
        assert!(broken.iter().any(|b| why.contains(b)), "{name}: {why}");
    }
}
