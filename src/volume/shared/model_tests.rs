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
//! lands somewhere in every run.

use super::append::{refused, Appender};
use super::catchup::foreign;
use super::*;
use crate::engine::mem::MemEngine;
use crate::meta::{Body, Dir, Inode, Journal, Kind, ROOT_INO};
use crate::sync::thread;

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
            crate::engine::Marks::default(),
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
    fn join(engine: &Arc<MemEngine>, who: &str, protocol: Protocol, inos: u64) -> Client {
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
        let c = Client {
            shared,
            meta: Mutex::new(meta),
        };
        c.catch_up();
        c
    }

    /// As the product's catch-up: read after the applied log, skip this client's own.
    fn catch_up(&self) {
        let s = &self.shared;
        loop {
            let after = s.applied.load(Ordering::SeqCst);
            let got = s.engine.read_after(after, READ_BATCH).unwrap();
            let Some((last, _)) = got.last() else {
                return;
            };
            let records = foreign(&s.ahead.lock(), &got).unwrap();
            {
                let mut meta = self.meta.lock();
                for (_, changes) in &records {
                    for c in changes {
                        meta.apply(c).unwrap();
                    }
                }
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
        let answer = loop {
            tries += 1;
            assert!(tries < 1000, "a change lost 1000 times in a row");
            let decided = op(&mut self.meta.lock());
            match decided {
                Ok(()) => break Ok(()),
                Err(e) => match e.conflict {
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
                },
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
            let dir = meta
                .get(parent)
                .and_then(Inode::dir)
                .ok_or_else(|| Error::new(libc::ENOENT, "no parent"))?;
            if dir.get(name).is_some() {
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
            let src = meta
                .get(parent)
                .and_then(Inode::dir)
                .and_then(|d| d.get(name))
                .ok_or_else(missing)?;
            let dst = meta.get(to).and_then(Inode::dir).ok_or_else(missing)?;
            if dst.get(new).is_some() {
                return Err(Error::new(libc::EEXIST, "taken"));
            }
            if within(meta, to, src) {
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
            let ino = meta
                .get(parent)
                .and_then(Inode::dir)
                .and_then(|d| d.get(name))
                .ok_or_else(|| Error::new(libc::ENOENT, "no such entry"))?;
            if !meta
                .get(ino)
                .and_then(Inode::dir)
                .is_some_and(Dir::is_empty)
            {
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

    /// The inode `path` (names from the root) leads to.
    fn resolve(&self, path: &[&[u8]]) -> Option<Ino> {
        let meta = self.meta.lock();
        path.iter().try_fold(ROOT_INO, |at, name| {
            meta.get(at).and_then(Inode::dir).and_then(|d| d.get(name))
        })
    }
}

/// Whether `ino` is `ancestor` or below it (the rename's check, as `fs` makes it).
fn within(meta: &Meta, mut ino: Ino, ancestor: Ino) -> bool {
    for _ in 0..64 {
        if ino == ancestor {
            return true;
        }
        match meta.get(ino).and_then(Inode::dir) {
            Some(d) if d.parent() != ino => ino = d.parent(),
            _ => return false,
        }
    }
    true // a cycle: below everything on it
}

/// Every directory of `meta` reaches the root by its parents, and every name leads to an
/// inode the table holds.
fn well_formed(meta: &Meta) -> std::result::Result<(), String> {
    for ino in meta.inos() {
        let Some(d) = meta.get(ino).and_then(Inode::dir) else {
            continue;
        };
        if !within(meta, ino, ROOT_INO) {
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

/// The races, two clients (and a third joining midway): two moves that together would make
/// a cycle (`/p/a/f/e` and `/q/b/c/d`: one moves `a` into `d`, the other `b` into `e`; no
/// inode is written by both, only the directories above each new parent are read by the
/// other's check), two creates of one name, a removal racing a move of the same entry.
fn races(protocol: Protocol) {
    let engine = engine_for(protocol);
    let setup = Client::join(&engine, "setup", REAL, 1000);
    for path in [
        &[&b"p"[..]][..],
        &[b"p", b"a"],
        &[b"p", b"a", b"f"],
        &[b"p", b"a", b"f", b"e"],
        &[b"q"],
        &[b"q", b"b"],
        &[b"q", b"b", b"c"],
        &[b"q", b"b", b"c", b"d"],
        &[b"gone"],
    ] {
        let (name, above) = path.split_last().unwrap();
        let parent = setup.resolve(above).unwrap();
        setup.mkdir(parent, name).unwrap();
    }
    let at = |path: &[&[u8]]| setup.resolve(path).unwrap();
    let (p, q) = (at(&[b"p"]), at(&[b"q"]));
    let d = at(&[b"q", b"b", b"c", b"d"]);
    let e = at(&[b"p", b"a", b"f", b"e"]);
    let one = Arc::new(Client::join(&engine, "one", protocol, 2000));
    let two = Arc::new(Client::join(&engine, "two", protocol, 3000));
    let t1 = {
        let c = one.clone();
        thread::spawn(move || {
            let moved = c.rename(p, b"a", d, b"a").is_ok();
            let made = c.mkdir(ROOT_INO, b"same").is_ok();
            let removed = c.rmdir(ROOT_INO, b"gone").is_ok();
            (moved, made, removed)
        })
    };
    let t2 = {
        let c = two.clone();
        thread::spawn(move || {
            let moved = c.rename(q, b"b", e, b"b").is_ok();
            let made = c.mkdir(ROOT_INO, b"same").is_ok();
            let renamed = c.rename(ROOT_INO, b"gone", ROOT_INO, b"kept").is_ok();
            (moved, made, renamed)
        })
    };
    // A client joining while the changes land, and the versions trimmed.
    let late = {
        let e = engine.clone();
        thread::spawn(move || Client::join(&e, "late", REAL, 4000))
    };
    let trim = trimmer(&engine);
    let (moved1, made1, removed) = t1.join().unwrap();
    let (moved2, made2, renamed) = t2.join().unwrap();
    let late = late.join().unwrap();
    trim.join().unwrap();
    let truth = replayed(&engine);
    assert!(!(moved1 && moved2), "both moves were taken: a cycle");
    assert!(moved1 || moved2, "neither move was taken");
    assert!(
        made1 != made2,
        "one name made {} times",
        made1 as u8 + made2 as u8
    );
    assert!(removed != renamed, "removed {removed}, moved {renamed}");
    agree(&[&*one, &*two, &late, &setup], &truth);
}

/// Every client's table, caught up, holds the log's history.
fn agree(clients: &[&Client], truth: &Meta) {
    for c in clients {
        c.catch_up();
        let (mine, log) = (digest(&c.meta.lock()), digest(truth));
        if mine != log {
            let diff: Vec<_> = mine
                .iter()
                .filter(|(ino, d)| log.get(ino) != Some(d))
                .map(|(ino, d)| (ino, d, log.get(ino)))
                .collect();
            panic!(
                "{}'s table differs from the log's history: {diff:?}",
                c.shared.who
            );
        }
    }
}

/// The races of two clients changing directories at once: two names made in one (`/many`:
/// both taken), a name made in one the other removes (`/box`), and one removed by a client
/// that made and removed a name of its own there first (`/box2`: its own changes there say
/// nothing of the other's, which its table may not hold yet).
fn one_directory(protocol: Protocol) {
    let engine = engine_for(protocol);
    let setup = Client::join(&engine, "setup", REAL, 1000);
    for name in [&b"many"[..], b"box", b"box2"] {
        setup.mkdir(ROOT_INO, name).unwrap();
    }
    let at = |name: &[u8]| setup.resolve(&[name]).unwrap();
    let (many, boxed, box2) = (at(b"many"), at(b"box"), at(b"box2"));
    let one = Arc::new(Client::join(&engine, "one", protocol, 2000));
    let two = Arc::new(Client::join(&engine, "two", protocol, 3000));
    let t1 = {
        let c = one.clone();
        thread::spawn(move || {
            let in_box2 = c.mkdir(box2, b"u").is_ok();
            let beside = c.mkdir(many, b"x1").is_ok();
            let boxed = c.mkdir(boxed, b"in").is_ok();
            (beside, boxed, in_box2)
        })
    };
    let t2 = {
        let c = two.clone();
        thread::spawn(move || {
            c.mkdir(box2, b"t").unwrap();
            c.rmdir(box2, b"t").unwrap();
            let unboxed2 = c.rmdir(ROOT_INO, b"box2").is_ok();
            let beside = c.mkdir(many, b"x2").is_ok();
            let unboxed = c.rmdir(ROOT_INO, b"box").is_ok();
            (beside, unboxed, unboxed2)
        })
    };
    let trim = trimmer(&engine);
    let (beside1, boxed, in_box2) = t1.join().unwrap();
    trim.join().unwrap();
    let (beside2, unboxed, unboxed2) = t2.join().unwrap();
    let truth = replayed(&engine);
    assert!(
        beside1 && beside2,
        "two names in one directory: {beside1} {beside2}"
    );
    assert!(
        boxed != unboxed,
        "made in the box {boxed}, the box removed {unboxed}"
    );
    assert!(
        in_box2 != unboxed2,
        "made in box2 {in_box2}, box2 removed {unboxed2}"
    );
    agree(&[&*one, &*two, &setup], &truth);
}

#[test]
fn model_shared_changes_are_one_serial_history() {
    shuttle::check_random(|| races(REAL), 1000);
    shuttle::check_random(|| one_directory(REAL), 1000);
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
    ] {
        let caught = std::panic::catch_unwind(|| {
            shuttle::check_random(
                move || {
                    races(mutant);
                    one_directory(mutant);
                },
                300,
            )
        });
        let why = match caught {
            Ok(()) => panic!("the model missed the mutant: {name}"),
            Err(panic) => crate::error::panic_message(&*panic),
        };
        // Caught by the promise it breaks, not by the model itself failing.
        assert!(broken.iter().any(|b| why.contains(b)), "{name}: {why}");
    }
}
