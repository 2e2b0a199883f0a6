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
//! What this first version leaves out (say so in doc/VOLUMES.md): checkpoints (the log grows;
//! attach replays it whole), the rebuild (a member makes no new copies), and a file unlinked
//! by one client while open on another (gone there).

use super::read;
use crate::client::volume::FreeGate;
use crate::data::DataStore;
use crate::engine::MetaEngine;
use crate::error::{Error, Result};
use crate::fs::{Fs, FsConfig, Turns};
use crate::meta::{record, Change, Meta};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

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

struct State {
    engine: Arc<dyn MetaEngine>,
    /// This client's session name: what it holds turns under, and what the servers evict.
    who: String,
    fs: Weak<Fs>,
    /// The last change this client's table holds.
    applied: AtomicU64,
    /// One change of this client at a time: a local change holds it with the engine's turn,
    /// and the poller's catch-up holds it too (so no change is applied twice).
    busy: Mutex<bool>,
    free: Condvar,
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
    thread: Option<std::thread::JoinHandle<()>>,
    /// Not joined: it ends once the file system (which keeps its channel open) is gone.
    _notifier: std::thread::JoinHandle<()>,
}

impl State {
    fn claim(&self) {
        let mut busy = self.busy.lock();
        while *busy {
            busy = self.free.wait(busy);
        }
        *busy = true;
    }

    fn try_claim(&self) -> bool {
        let mut busy = self.busy.lock();
        !std::mem::replace(&mut *busy, true)
    }

    fn release(&self) {
        *self.busy.lock() = false;
        self.free.notify_one();
    }

    /// Applies what others appended since this table's last change (only while claimed).
    /// Inside a request (`in_request`), the kernel is told by the notifier thread.
    fn catch_up(&self, fs: &Fs, in_request: bool) -> Result<usize> {
        let mut n = 0;
        loop {
            let after = self.applied.load(Ordering::SeqCst);
            let got = self
                .engine
                .read_after(after, READ_BATCH)
                .map_err(engine_err)?;
            if got.is_empty() {
                return Ok(n);
            }
            let mut records = Vec::with_capacity(got.len());
            for (lsn, bytes) in &got {
                let read = record::read(bytes, *lsn);
                if let Some(why) = read::stop_reason(&read.stop) {
                    return Err(Error::new(libc::EIO, why));
                }
                let Some(r) = read.records.into_iter().next() else {
                    return Err(Error::new(
                        libc::EIO,
                        format!("the engine's change {lsn} is no record"),
                    ));
                };
                records.push(r);
            }
            let last = records.last().map_or(after, |r| r.0);
            if in_request {
                let told = fs.apply_followed_quietly(&records)?;
                let _ = self.notify.send(Notice::Tell(told));
            } else {
                fs.apply_followed(&records)?;
            }
            n += records.len();
            self.applied.store(last, Ordering::SeqCst);
            if got.len() < READ_BATCH {
                return Ok(n);
            }
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
    fn drop(&mut self) {
        if let Err(e) = self.0.engine.give_turn(&self.0.who) {
            log::warn!("giving the write turn back: {e} (it runs out by itself)");
        }
        self.0.release();
    }
}

struct SharedTurns(Arc<State>);

impl Turns for SharedTurns {
    fn begin(&self, fs: &Fs) -> Option<Box<dyn std::any::Any + Send>> {
        let s = &self.0;
        s.claim();
        if let Err(e) = s.engine.take_turn(&s.who, TURN_LEASE, TURN_WAIT) {
            log::error!("the write turn: {e}");
            s.release();
            return None;
        }
        let turn = Turn(s.clone());
        if let Err(e) = s.catch_up(fs, true) {
            log::error!("catching up with the engine: {}", e.message);
            return None;
        }
        Some(Box::new(turn))
    }

    fn sync_kernel(&self, fs: &Fs) -> bool {
        let s = &self.0;
        s.claim();
        let r = s.catch_up(fs, false);
        s.release();
        if let Err(e) = r {
            log::warn!("catching up with the engine: {}", e.message);
            return false;
        }
        // And what requests caught up with before, still with the notifier.
        let (done, flushed) = crossbeam_channel::bounded(1);
        s.notify.send(Notice::Flushed(done)).is_ok() && flushed.recv().is_ok()
    }

    fn refresh(&self, fs: &Fs) {
        let s = &self.0;
        // A change under way (maybe this very request's: a create that looks its name up)
        // caught up when it began: no wait for it.
        if !s.try_claim() {
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
        s.engine.append(&s.who, lsn, &bytes).map_err(|e| {
            Error::new(
                libc::EIO,
                format!("{e} (a change made out of turn is refused: it must wait for the turn)"),
            )
        })?;
        s.applied.store(lsn, Ordering::SeqCst);
        // Frees of what this change let go of wait for it to be applied everywhere.
        s.gate.assigned.store(lsn, Ordering::SeqCst);
        Ok(())
    }
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
    engine
        .start_session(&who, SESSION_TTL)
        .map_err(|e| e.to_string())?;
    let meta = Meta::new(0o755, config.root_uid, config.root_gid);
    let fs = Arc::new(Fs::with_meta(data, config, meta));
    let gate = Arc::new(FreeGate::default());
    let (notify, told) = crossbeam_channel::unbounded::<Notice>();
    let state = Arc::new(State {
        engine,
        who,
        fs: Arc::downgrade(&fs),
        applied: AtomicU64::new(0),
        busy: Mutex::new(false),
        free: Condvar::new(),
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
    fs.set_turns(Box::new(SharedTurns(state.clone())));
    fs.set_lock_keeper(Box::new(super::locks::EngineLocks::new(
        state.engine.clone(),
        state.who.clone(),
    )));
    pool.set_free_gate(gate);
    pool.follow_at(state.applied.load(Ordering::SeqCst));
    let s = state.clone();
    let thread = std::thread::Builder::new()
        .name("volume-shared".into())
        .spawn(move || poll_loop(&s))
        .map_err(|e| format!("cannot start the shared volume's poller: {e}"))?;
    let weak = Arc::downgrade(&fs);
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
            thread: Some(thread),
            _notifier: notifier,
        },
    ))
}

fn poll_loop(s: &State) {
    while !s.stop.load(Ordering::SeqCst) {
        std::thread::park_timeout(crate::config::FOLLOW_POLL);
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
        if s.paused.load(Ordering::SeqCst) {
            continue;
        }
        let Some(fs) = s.fs.upgrade() else {
            return;
        };
        if let Err(e) = poll_once(s, &fs) {
            log::warn!("shared volume: {e}");
        }
    }
}

/// One round of the poller (see the module doc).
fn poll_once(s: &State, fs: &Fs) -> std::result::Result<(), String> {
    // A change under way catches up itself.
    if s.try_claim() {
        let r = s.catch_up(fs, false);
        s.release();
        r.map_err(|e| e.message)?;
    }
    let pool = fs.data().pool();
    let applied = s.applied.load(Ordering::SeqCst);
    pool.follow_at(applied);
    pool.release_frees(&s.gate, applied);
    s.engine
        .heartbeat(&s.who, SESSION_TTL)
        .map_err(|e| e.to_string())?;
    for gone in s.engine.expired_sessions().map_err(|e| e.to_string())? {
        if gone == s.who {
            continue;
        }
        // Fenced at the servers before its session is forgotten: whatever it still sends
        // lands nowhere.
        let servers = pool.evict(&gone);
        log::warn!(
            "shared volume: '{gone}' stopped its heartbeats: evicted from {servers} servers"
        );
        // Then its locks go to whoever waits for them.
        crate::engine::drop_session_locks(&*s.engine, &s.who, &gone).map_err(|e| e.to_string())?;
        s.engine.drop_session(&gone).map_err(|e| e.to_string())?;
    }
    Ok(())
}

impl SharedClient {
    /// One round of the poller now (tests).
    pub fn poll_now(&self) -> std::result::Result<(), String> {
        let fs = self.state.fs.upgrade().ok_or("the file system is gone")?;
        poll_once(&self.state, &fs)
    }

    /// Stops (or resumes) the poller's own rounds: no catch-up, no heartbeat (a test freezing
    /// a client).
    #[cfg(feature = "testing")]
    pub fn pause(&self, paused: bool) {
        self.state.paused.store(paused, Ordering::SeqCst);
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
        let (engine, who) = (&*self.state.engine, &self.state.who);
        if let Err(e) = crate::engine::drop_session_locks(engine, who, who) {
            log::warn!("leaving the shared volume: its file locks stay until eviction: {e}");
        }
        let _ = engine.drop_session(who);
    }
}
