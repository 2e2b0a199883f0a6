//! A shared volume's client (`rmemfs mount DIR --volume NAME --meta redis://…`): one of many
//! writers of one namespace kept in a metadata engine ([`crate::engine`]).
//!
//! How: the client replays the engine's log into its own table, as a follower replays a
//! journal. Each change waits its turn at the door ([`crate::fs::Turns`]): it takes the
//! engine's write turn, catches up with what other clients appended, and runs against a table
//! that is up to date; the namespace's rules (`fs` over `meta`) decide it as for any mount,
//! and its batch is appended to the engine as the next record before the change is answered
//! (the engine refuses an append out of turn or out of order). So clients' changes are one
//! serial history, and each sees every change before its own. Between changes a poller keeps
//! the table (and the kernel, told what to forget) within [`crate::config::FOLLOW_POLL`] of
//! the engine, reports how far it has applied to the memory servers (frees wait for every
//! member), renews this client's session, and evicts clients whose sessions expired: fenced at
//! every memory server first, so nothing they still send lands in memory given to another,
//! and only then are their file locks ([`super::locks`]) dropped.
//!
//! The engine's log is bounded by checkpoints ([`super::engine_image`]): a client whose
//! table is [`crate::config::SHARED_CHECKPOINT_EVERY`] changes past the last one, once every
//! member has applied them, writes its table as of its last change, and the engine trims the
//! log up to it; a client joins from the newest one, and one that fell behind the trim loads
//! it whole (as a follower does).
//!
//! What this first version leaves out (say so in doc/VOLUMES.md): the rebuild (a member makes
//! no new copies), and a file unlinked by one client while open on another (gone there).

mod catchup;

use catchup::{poll_loop, poll_once};

use super::{engine_image, read};
use crate::client::volume::FreeGate;
use crate::data::DataStore;
use crate::engine::MetaEngine;
use crate::error::{Error, Result};
use crate::fs::{Fs, FsConfig, Turns};
use crate::meta::{record, Change, Meta};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

/// How long this client's write turn lasts if it is not given back (a client frozen or cut
/// off while holding it): others wait that long at most. A change holds it for a few round
/// trips; renewed by every change.
const TURN_LEASE: Duration = Duration::from_secs(2);

/// How long a change waits for the turn before it fails (EIO): a turn held by a frozen client
/// runs out after [`TURN_LEASE`], so this is well past it.
const TURN_WAIT: Duration = Duration::from_secs(30);

/// How long a session lives without a heartbeat (one every poll): past it, another client
/// evicts it from the memory servers.
pub const SESSION_TTL: Duration = Duration::from_secs(10);

/// Changes read from the engine in one request.
const READ_BATCH: usize = 1024;

/// How long this client keeps the write turn after a change when no other client asked for
/// it: its next change usually follows within a FUSE round trip (50-100 µs here), so a burst
/// (a `tar x`, an `rm -rf`) takes the turn once, and each change costs one engine round trip
/// (its append) instead of four. Another client that asks is told by the next append and
/// gets the turn after that change; one that asks while this client is idle waits this long.
const TURN_LINGER: Duration = Duration::from_millis(2);

/// The turn is counted as this client's until this long before its lease (as this client's
/// clock measures from the request that renewed it) runs out: the round trip, a descheduled
/// thread and clock rates all fit well inside; past it the turn is taken again.
const TURN_MARGIN: Duration = Duration::from_millis(500);

/// Who may use the table, and whether this client holds the engine's write turn.
#[derive(Default)]
struct Claim {
    /// A change (or a catch-up, or the turn going back) of this client is under way.
    busy: bool,
    /// What is under way is a change (at the door).
    changing: bool,
    /// Until when the write turn is surely this client's (none: not held).
    turn_until: Option<Instant>,
    /// Another client waits for the turn: it goes back after this change.
    wanted: bool,
    /// Changes begun so far (the lingering turn goes back only if none began meanwhile).
    begun: u64,
}

impl Claim {
    fn holds_turn(&self) -> bool {
        self.turn_until.is_some_and(|until| Instant::now() < until)
    }
}

struct State {
    engine: Arc<dyn MetaEngine>,
    /// This client's session name: what it holds turns under, and what the servers evict.
    who: String,
    /// The last change this client's table holds.
    applied: AtomicU64,
    /// The last checkpoint this client knows of (loaded or written).
    checkpointed: AtomicU64,
    /// For loading checkpoints (the root's owner).
    config: FsConfig,
    /// One change of this client at a time: a local change holds it with the engine's turn,
    /// and the poller's catch-up holds it too (so no change is applied twice).
    claim: Mutex<Claim>,
    free: Condvar,
    /// Wakes the thread that gives a lingering turn back.
    linger: Condvar,
    gate: Arc<FreeGate>,
    /// Invalidations of changes applied inside a request, sent by the notifier thread once
    /// the request may have been answered (see [`Fs::tell_followed`]).
    notify: crossbeam_channel::Sender<Notice>,
    stop: AtomicBool,
    /// The poller's rounds are left to [`SharedClient::poll_now`] (a test freezing a client).
    paused: AtomicBool,
}

/// A running shared volume client: its poller stops (and is joined) on drop.
pub struct SharedClient {
    state: Arc<State>,
    /// The file system this client keeps up to date (weak: the mount owns it).
    fs: Weak<Fs>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Gives a lingering write turn back ([`linger_loop`]).
    lingerer: Option<std::thread::JoinHandle<()>>,
    /// Not joined: it ends once the file system (which keeps its channel open) is gone.
    _notifier: std::thread::JoinHandle<()>,
}

impl State {
    /// Waits until no change of this client is under way and claims the table; true if
    /// this client holds the write turn.
    fn claim(&self) -> bool {
        let mut c = self.claim.lock();
        while c.busy {
            c = self.free.wait(c);
        }
        c.busy = true;
        c.holds_turn()
    }

    fn try_claim(&self) -> bool {
        let mut c = self.claim.lock();
        !std::mem::replace(&mut c.busy, true)
    }

    /// Claims the table unless a change is under way (false: it is, and it caught up when
    /// it began).
    fn claim_unless_changing(&self) -> bool {
        let mut c = self.claim.lock();
        loop {
            if c.changing {
                return false;
            }
            if !c.busy {
                c.busy = true;
                return true;
            }
            c = self.free.wait(c);
        }
    }

    fn release(&self) {
        let mut c = self.claim.lock();
        c.busy = false;
        c.changing = false;
        drop(c);
        self.free.notify_all();
    }

    /// The turn is this client's until `lease` after `sent` (less the margin); `wanted`: another
    /// client asked for it.
    fn turn_renewed(&self, sent: Instant, wanted: bool) {
        let mut c = self.claim.lock();
        c.turn_until = Some(sent + TURN_LEASE - TURN_MARGIN);
        c.wanted |= wanted;
    }

    /// Gives the turn back (only while claimed).
    fn give_turn(&self) {
        {
            let mut c = self.claim.lock();
            c.turn_until = None;
            c.wanted = false;
        }
        if let Err(e) = self.engine.give_turn(&self.who) {
            log::warn!("giving the write turn back: {e} (it runs out by itself)");
        }
    }
}

fn engine_err(e: crate::engine::EngineError) -> Error {
    Error::new(libc::EIO, e.to_string())
}

/// What the notifier thread is given.
enum Notice {
    /// Invalidations of changes applied inside a request.
    Tell(Vec<crate::fs::Invalidation>),
    /// Answered once everything sent before it has been told.
    Flushed(crossbeam_channel::Sender<()>),
}

/// The turn of one change: given back when dropped.
struct Turn(Arc<State>);

impl Drop for Turn {
    /// The change is done: the turn goes back now if another client asked for it, else
    /// after [`TURN_LINGER`] without a change (the lingering thread).
    fn drop(&mut self) {
        let s = &self.0;
        let (now, linger) = {
            let c = s.claim.lock();
            (c.wanted || !c.holds_turn(), c.turn_until.is_some())
        };
        if now {
            s.give_turn();
        }
        s.release();
        if linger && !now {
            s.linger.notify_one();
        }
    }
}

/// The lingering thread: gives the write turn back once no change began for
/// [`TURN_LINGER`].
fn linger_loop(s: &State) {
    let mut c = s.claim.lock();
    while !s.stop.load(Ordering::SeqCst) {
        if c.turn_until.is_none() || c.busy {
            c = s.linger.wait_timeout(c, Duration::from_millis(100)).0;
            continue;
        }
        let begun = c.begun;
        c = s.linger.wait_timeout(c, TURN_LINGER).0;
        if c.busy || c.begun != begun || c.turn_until.is_none() {
            continue;
        }
        c.busy = true;
        drop(c);
        s.give_turn();
        s.release();
        c = s.claim.lock();
    }
}

struct SharedTurns(Arc<State>);

impl Turns for SharedTurns {
    fn begin(&self, fs: &Fs) -> Option<Box<dyn std::any::Any + Send>> {
        let s = &self.0;
        let held = s.claim();
        {
            let mut c = s.claim.lock();
            c.begun += 1;
            c.changing = true;
        }
        let turn = Turn(s.clone());
        if held {
            // No other client can have appended since this client's last change or take.
            return Some(Box::new(turn));
        }
        let sent = Instant::now();
        let applied = s.applied.load(Ordering::SeqCst);
        let got = match s
            .engine
            .take_turn_after(&s.who, TURN_LEASE, TURN_WAIT, applied, READ_BATCH)
        {
            Ok(got) => got,
            Err(e) => {
                log::error!("the write turn: {e}");
                drop(turn);
                return None;
            }
        };
        s.turn_renewed(sent, false);
        let caught_up = match got.first() {
            // A checkpoint trimmed changes this table lacks: load it, then read on.
            Some((first, _)) if *first != applied + 1 => s
                .reload(fs, true, *first)
                .and_then(|()| s.catch_up(fs, true).map(|_| ())),
            _ => s.apply(fs, &got, true).and_then(|()| match got.len() {
                READ_BATCH => s.catch_up(fs, true).map(|_| ()),
                _ => Ok(()),
            }),
        };
        if let Err(e) = caught_up {
            log::error!("catching up with the engine: {}", e.message);
            return None;
        }
        Some(Box::new(turn))
    }

    fn sync_kernel(&self, fs: &Fs) -> bool {
        let s = &self.0;
        s.claim();
        let r = s.catch_up(fs, true);
        s.release();
        if let Err(e) = r {
            log::warn!("catching up with the engine: {}", e.message);
            return false;
        }
        // Told by the notifier, with what catch-ups before queued: waited for unclaimed.
        let (done, flushed) = crossbeam_channel::bounded(1);
        s.notify.send(Notice::Flushed(done)).is_ok() && flushed.recv().is_ok()
    }

    fn refresh(&self, fs: &Fs) {
        let s = &self.0;
        // A change under way (maybe this very request's: a create that looks its name up)
        // caught up when it began: no wait for it.
        if !s.claim_unless_changing() {
            return;
        }
        let r = s.catch_up(fs, true);
        s.release();
        if let Err(e) = r {
            log::warn!("catching up with the engine: {}", e.message);
        }
    }
}

/// Appends each committed batch to the engine as the next change.
struct EngineRecorder(Arc<State>);

impl crate::meta::Journal for EngineRecorder {
    fn record(&mut self, changes: &[Change]) -> Result<()> {
        let s = &self.0;
        let lsn = s.applied.load(Ordering::SeqCst) + 1;
        let bytes = record::encode(lsn, changes);
        let sent = Instant::now();
        match s.engine.append(&s.who, lsn, &bytes, TURN_LEASE) {
            Ok(wanted) => s.turn_renewed(sent, wanted),
            Err(e) => {
                // Whatever this client thought, the turn is not its own.
                s.claim.lock().turn_until = None;
                return Err(Error::new(
                    libc::EIO,
                    format!(
                        "{e} (a change made out of turn is refused: it must wait for the turn)"
                    ),
                ));
            }
        }
        s.applied.store(lsn, Ordering::SeqCst);
        // Frees of what this change let go of wait for it to be applied everywhere.
        s.gate.assigned.store(lsn, Ordering::SeqCst);
        Ok(())
    }
}

/// The servers in the volume's order: chunk maps name servers by their place in it, so every
/// client connects to them in the order the first one gave (stored in the engine). The same
/// servers in another order are reordered; other servers are refused, naming both lists.
/// With `create` the volume is made, `given` its order (refused when it exists); without,
/// a name the engine does not hold is refused, naming the ones it does.
pub fn server_order(
    engine: &dyn MetaEngine,
    name: &str,
    given: &[String],
    create: bool,
) -> std::result::Result<Vec<String>, String> {
    let failed = |e: crate::engine::EngineError| e.to_string();
    if create {
        if !engine.create_volume(given).map_err(failed)? {
            return Err(format!(
                "volume '{name}' exists already in {}: attach to it without --create",
                engine.describe()
            ));
        }
        log::info!("shared volume '{name}' made in {}", engine.describe());
        return Ok(given.to_vec());
    }
    let Some(stored) = engine.servers().map_err(failed)? else {
        let known = engine.volumes().map_err(failed)?;
        let list = if known.is_empty() {
            "none".to_string()
        } else {
            known.join(", ")
        };
        return Err(format!(
            "no volume '{name}' in {} (known volumes: {list}); --create makes one",
            engine.describe()
        ));
    };
    let mut a = stored.clone();
    let mut b = given.to_vec();
    a.sort();
    b.sort();
    if a != b {
        return Err(format!(
            "the shared volume's memory servers are {}; this mount names {} (give the same \
             servers, in any order)",
            stored.join(","),
            given.join(",")
        ));
    }
    if stored != given {
        log::info!(
            "the shared volume's servers, in its order: {}",
            stored.join(",")
        );
    }
    Ok(stored)
}

/// Joins the shared volume the pool claimed with [`crate::proto::ClaimMode::Share`] under
/// `who`, its namespace in `engine`: the file system, kept in step with the other clients.
pub fn join(
    data: DataStore,
    mut config: FsConfig,
    engine: Arc<dyn MetaEngine>,
    who: String,
) -> std::result::Result<(Arc<Fs>, SharedClient), String> {
    let pool = data.pool().clone();
    // The kernel must see other clients' sizes and times.
    config.writeback = false;
    // A read is no change (it takes no turn): access times are not kept, as with `noatime`
    // (JuiceFS's default too).
    config.atime = crate::fs::Atime::Never;
    config.dir_atime = false;
    config.fixed_access_times = true;
    engine
        .start_session(&who, SESSION_TTL)
        .map_err(|e| e.to_string())?;
    // The newest checkpoint, then the log after it.
    let (meta, from) = match engine.checkpoint().map_err(|e| e.to_string())? {
        Some(c) => (engine_image::decode(&c.image, &config)?, c.lsn),
        None => (Meta::new(0o755, config.root_uid, config.root_gid), 0),
    };
    // Shared once the engine's turns and locks are its own (below).
    let fs = Fs::with_meta(data, config.clone(), meta);
    let gate = Arc::new(FreeGate::default());
    let (notify, told) = crossbeam_channel::unbounded::<Notice>();
    let state = Arc::new(State {
        engine,
        who,
        applied: AtomicU64::new(from),
        checkpointed: AtomicU64::new(from),
        config,
        claim: Mutex::new(Claim::default()),
        free: Condvar::new(),
        linger: Condvar::new(),
        gate: gate.clone(),
        notify,
        stop: AtomicBool::new(false),
        paused: AtomicBool::new(false),
    });
    state.claim();
    let replayed = state.catch_up(&fs, false);
    state.release();
    let replayed = replayed.map_err(|e| format!("replaying the engine's log: {}", e.message))?;
    log::info!(
        "shared volume joined as '{}' on {}: {replayed} changes replayed, {} inodes",
        state.who,
        state.engine.describe(),
        fs.inode_count()
    );
    fs.set_journal(Box::new(EngineRecorder(state.clone())));
    let fs = Arc::new(fs.joined(crate::fs::VolumeHooks {
        barrier: None,
        turns: Some(Box::new(SharedTurns(state.clone()))),
        locks: Some(Box::new(super::locks::EngineLocks::new(
            state.engine.clone(),
            state.who.clone(),
        ))),
    }));
    pool.set_free_gate(gate);
    pool.follow_at(state.applied.load(Ordering::SeqCst));
    let (s, weak) = (state.clone(), Arc::downgrade(&fs));
    let thread = std::thread::Builder::new()
        .name("volume-shared".into())
        .spawn(move || poll_loop(&s, &weak))
        .map_err(|e| format!("cannot start the shared volume's poller: {e}"))?;
    let s = state.clone();
    let lingerer = std::thread::Builder::new()
        .name("volume-turn".into())
        .spawn(move || linger_loop(&s))
        .map_err(|e| format!("cannot start the shared volume's turn keeper: {e}"))?;
    let (weak, weak_fs) = (Arc::downgrade(&fs), Arc::downgrade(&fs));
    let notifier = std::thread::Builder::new()
        .name("volume-notify".into())
        .spawn(move || {
            // Ends when the last sender (the state) goes.
            for notice in told {
                match (notice, weak.upgrade()) {
                    (Notice::Tell(batch), Some(fs)) => fs.tell_followed(&batch),
                    (Notice::Flushed(done), Some(_)) => {
                        let _ = done.send(());
                    }
                    (_, None) => return,
                }
            }
        })
        .map_err(|e| format!("cannot start the shared volume's notifier: {e}"))?;
    Ok((
        fs,
        SharedClient {
            state,
            fs: weak_fs,
            thread: Some(thread),
            lingerer: Some(lingerer),
            _notifier: notifier,
        },
    ))
}

impl SharedClient {
    /// One round of the poller now (tests): it catches up unless a change is under way.
    pub fn poll_now(&self) -> std::result::Result<(), String> {
        let fs = self.fs.upgrade().ok_or("the file system is gone")?;
        poll_once(&self.state, &fs, true)
    }

    /// Stops (or resumes) the poller's own rounds: no catch-up, no heartbeat (a test freezing
    /// a client).
    #[cfg(feature = "testing")]
    pub fn pause(&self, paused: bool) {
        self.state.paused.store(paused, Ordering::SeqCst);
    }

    /// A checkpoint of this client's table now, whoever lags (tests; the poller writes them
    /// on its own).
    pub fn checkpoint_now(&self) -> std::result::Result<(), String> {
        let fs = self.fs.upgrade().ok_or("the file system is gone")?;
        self.state.checkpoint(&fs, true).map(|_| ())
    }

    /// This client's session name.
    pub fn who(&self) -> &str {
        &self.state.who
    }

    /// The last change this client's table holds.
    pub fn applied(&self) -> u64 {
        self.state.applied.load(Ordering::SeqCst)
    }
}

impl Drop for SharedClient {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        if let Some(t) = self.lingerer.take() {
            self.state.linger.notify_all();
            let _ = t.join();
        }
        if self.state.claim.lock().turn_until.is_some() {
            self.state.give_turn();
        }
        let (engine, who) = (&*self.state.engine, &self.state.who);
        if let Err(e) = crate::engine::drop_session_locks(engine, who, who) {
            log::warn!("leaving the shared volume: its file locks stay until eviction: {e}");
        }
        let _ = engine.drop_session(who);
    }
}
