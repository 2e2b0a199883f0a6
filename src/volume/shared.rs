//! A shared volume's client (`rmemfs mount DIR --volume NAME --meta redis://…`): one of many
//! writers of one namespace kept in a metadata engine ([`crate::engine`]).
//!
//! How: the client replays the engine's log into its own table, as a follower replays a
//! journal, and decides its own changes on that table by the namespace's rules (`fs` over
//! `meta`), as any mount does. Each change's batch is appended to the engine with what it
//! touches ([`touch`]) and the version of each its table holds; the engine takes it only if
//! no other client changed those inodes since, and gives it its place in the log. A change
//! the engine refuses is undone and decided again on a table caught up
//! ([`crate::fs::Turns`]); a change of a file's data first takes the file's turn
//! ([`turns`]). So clients working on different directories and files append at once, each
//! change in one engine round trip, and the log is still one serial history: every change
//! was decided on exactly the state of the inodes it touched that the log gives at its
//! place. No change is answered before the engine holds it; a write's size and times may be
//! held back while this client holds the file's turn, until its next change, `fsync`, a
//! close or an unlock ([`behind`]), as a local file system holds a write's data until
//! `fsync`.
//!
//! A change is in this client's table before its place is known: the table may hold it
//! ahead of other clients' changes the log puts before it, which touch none of its inodes
//! (the engine checked), so their order does not matter there ([`ahead`]). A poller keeps
//! the table (and the kernel, told what to forget) within [`crate::config::FOLLOW_POLL`] of
//! the engine, reports how far it has applied to the memory servers (frees wait for every
//! member), and evicts clients whose sessions expired: fenced at every memory server first,
//! so nothing they still send lands in memory given to another, and only then are their
//! file locks ([`super::locks`]) dropped; heartbeats have a thread of their own
//! ([`session`]).
//!
//! The engine's log is bounded by checkpoints ([`super::engine_image`]): a client whose
//! table is [`crate::config::SHARED_CHECKPOINT_EVERY`] changes past the last one, once every
//! member has applied them, writes its table as of the last change it applied (with no own
//! change ahead of it), and the engine trims the log up to it; a client joins from the
//! newest one, and one that fell behind the trim loads it whole (as a follower does).
//!
//! What this version leaves out (say so in doc/VOLUMES.md): the rebuild (a member makes no
//! new copies).

mod ahead;
mod append;
mod behind;
mod births;
mod catchup;
mod controls;
mod keeper;
mod load;
#[cfg(all(test, feature = "shuttle"))]
mod model_tests;
mod open;
mod session;
mod state;
mod touch;
mod turns;

use ahead::Ahead;
use append::EngineRecorder;
use catchup::{poll_loop, poll_once};
pub use keeper::{Standing, StandingSource};
pub use turns::CHECKPOINT_ROLE;
use turns::{linger_loop, HeldTurns, SharedTurns};

use super::{engine_image, read};
use crate::client::volume::FreeGate;
use crate::data::DataStore;
use crate::engine::{EngineError, KeyOp, Marks, MetaEngine, Touch, SHARED_FORMAT};
use crate::error::{Error, Result};
use crate::fs::{Fs, FsConfig, HeldTurn, Turns};
use crate::meta::{record, Change, Ino, Meta, TableView};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Arc, Condvar, Mutex, Weak};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Appends of one change that a server's new birth may refuse before it fails: each means
/// that server restarted empty again meanwhile.
const BORN_RETRIES: usize = 4;

/// How long a turn lasts if it is not renewed or given back (a client frozen or cut off
/// while holding it): others wait that long at most. Renewed by every change that touches
/// its inode.
const TURN_LEASE: Duration = Duration::from_secs(2);

/// The turn is counted as this client's until this long before its lease (as this client's
/// clock measures from the request that renewed it) runs out: the round trip, a descheduled
/// thread and clock rates all fit well inside; past it the turn is taken again.
const TURN_MARGIN: Duration = Duration::from_millis(500);

/// How long a turn stays after its last change: the next change of the same file or
/// directory usually follows within a few FUSE round trips (50-100 µs each here; a `tar x`
/// spends about 2 ms on a file), so a copy's writes take the turn once. A client that asks
/// for a lingering turn does not wait for this: the holder is told at once
/// ([`MetaEngine::wanted`]).
const TURN_LINGER: Duration = Duration::from_millis(50);

/// How long a turn another client asks for is kept, from when it was taken, before it goes
/// back: a directory many clients fill at once passes from one to the next, and each pass
/// costs about four round trips (given back, taken, caught up, the change again); kept this
/// long, a holder makes tens of changes (one round trip each) per pass. Three clients
/// creating in one directory here made 3,052 creates/s with 2 ms, 3,760 with 5, 4,260 with
/// 10 (`ONE_DIR` in the bench's one-directory row); a client asking for a turn taken
/// recently waits this long at most.
const TURN_MIN_HOLD: Duration = Duration::from_millis(10);

/// How long after another client wanted a directory's turn (or changed the directory first)
/// this client's changes there stop claiming it unasked: a directory one client works in
/// alone is claimed by its next change, so that a lookup there finding nothing needs no
/// round trip (about a third of a create's time in an existing directory here), while one
/// that clients share passes between them only when a change needs it. Long beside a turn's
/// pass (four round trips), so a shared directory is claimed again a few times a minute at
/// most.
const QUIET_DIR_AFTER: Duration = Duration::from_secs(5);

/// How long an append whose answer was lost (the engine went away as it ran: Redis killed
/// or restarted, the connection cut) waits for the engine to come back and show, in its log,
/// whether it took it: answered by what the log says, a create the engine took is not failed
/// (then, tried again, refused as existing). As long as a session lives: past it, this client
/// is evicted anyway. The table's lock is held meanwhile (the engine is away for every
/// change alike).
const LOST_ANSWER_WAIT: Duration = SESSION_TTL;

/// The first pause between reads of the log while the engine is away, doubled up to
/// [`LOST_ANSWER_MAX_PAUSE`] (a Redis restart takes a fraction of a second to seconds).
const LOST_ANSWER_FIRST_PAUSE: Duration = Duration::from_millis(10);
const LOST_ANSWER_MAX_PAUSE: Duration = Duration::from_secs(1);

/// How long a session lives without a heartbeat (one a second, [`session::HEARTBEAT_EVERY`]):
/// past it, another client evicts it from the memory servers.
pub const SESSION_TTL: Duration = Duration::from_secs(10);

/// Changes read from the engine in one request.
const READ_BATCH: usize = 1024;

/// Inode numbers asked of the engine at once: one request per this many new inodes.
const INO_BATCH: u64 = 1024;

/// Fewer numbers at hand than this and the next change asks for more first: no change makes
/// more than two inodes (a rename's whiteout, a create).
const INOS_LOW: u64 = 16;

struct State {
    engine: Arc<dyn MetaEngine>,
    /// This client's session name: what it holds turns under, and what the servers evict.
    who: String,
    /// The last change this table holds with every change before it.
    applied: AtomicU64,
    /// The last checkpoint this client knows of (loaded or written).
    checkpointed: AtomicU64,
    /// How many changes past it the next is due
    /// ([`crate::config::shared_checkpoint_every`]).
    checkpoint_every: u64,
    /// For loading checkpoints (the root's owner).
    config: FsConfig,
    /// This client's changes in its table past `applied`. Taken under the table's lock by
    /// an append (never the other way round).
    ahead: Mutex<Ahead>,
    /// Signalled when an append is answered.
    answered: Condvar,
    /// One catch-up at a time (so no change is applied twice).
    catching: Mutex<()>,
    turns: Mutex<HeldTurns>,
    /// Signalled when turns have been given back.
    given: Condvar,
    gate: Arc<FreeGate>,
    /// This client's file locks in the engine (releases that failed are retried by polls).
    locks: Arc<super::locks::EngineLocks>,
    /// Invalidations of changes applied inside a request, sent by the notifier thread once
    /// the request may have been answered (see [`Fs::tell_followed`]).
    notify: crossbeam_channel::Sender<Notice>,
    stop: AtomicBool,
    /// The table holds the whole namespace (not a partial one still loading: [`load`]).
    whole: AtomicBool,
    /// The volume holds more inodes than `whole_under`: only its keeper loads the whole
    /// namespace ([`keeper`]).
    large: AtomicBool,
    /// The most inodes of a volume every client loads whole
    /// ([`crate::config::shared_whole_under`]; tests lower it).
    whole_under: AtomicU64,
    /// When the next keeper's round is due ([`keeper`]).
    keeper_next: Mutex<Instant>,
    /// Inodes forgotten since the allocator last gave memory back ([`keeper`]).
    forgotten_since_trim: AtomicU64,
    /// The namespace's inodes as this client last noted or read them ([`keeper`]).
    noted_inodes: AtomicU64,
    /// This client holds the keeper's role ([`keeper`]).
    keeper: AtomicBool,
    /// When this client joined (a client not whole asks for the keeper's role a moment
    /// after).
    joined: Mutex<Instant>,
    /// The poller's rounds are left to [`SharedClient::poll_now`] (a test freezing a client).
    paused: AtomicBool,
    /// The last change applied, as the engine's log held it (its LSN and bytes): read again
    /// by each catch-up, to find a log that lost changes this table holds.
    tip: Mutex<Option<(u64, Vec<u8>)>>,
    /// Files this client marks open in the engine, and since when ([`open`]).
    marked: Mutex<HashMap<Ino, Instant>>,
    /// Inodes whose drop fell to this client (their marks went), settled by the poller.
    to_settle: Mutex<Vec<Ino>>,
    /// Evicted clients whose unlogged allocations are still to be collected
    /// ([`State::collect_evicted`]).
    to_collect: Mutex<Vec<String>>,
    /// Whether writes may be held back ([`behind`]; tests turn it off to reach the
    /// immediate append's failures).
    hold_writes: AtomicBool,
    /// The lingering thread hears which turns are wanted but gives none back and sends no
    /// held writes ([`SharedClient::pause_linger`]: tests of what a request sends itself).
    linger_paused: AtomicBool,
    /// Rounds the lingering thread has ended, what it heard handled
    /// ([`SharedClient::linger_rounds`]).
    linger_rounds: AtomicU64,
    /// How long an append whose answer was lost waits for the engine to tell whether it took
    /// it (ms; [`LOST_ANSWER_WAIT`], tests shorten it).
    lost_answer_wait_ms: AtomicU64,
    /// The most names a directory may have to be loaded in one step ([`load`]).
    names_in_one_load: AtomicU64,
    /// Writes answered and not appended yet ([`behind`]). Taken under the table's lock by
    /// an append (never the other way round).
    behind: Mutex<behind::Behind>,
    /// Set once the engine lost changes this table holds: every change and catch-up fails
    /// (EIO) naming it, for good.
    lost: Mutex<Option<String>>,
}

impl State {
    /// A client's state before it catches up: its table holds the log up to `from`.
    fn new(
        engine: Arc<dyn MetaEngine>,
        who: String,
        config: FsConfig,
        from: u64,
        gate: Arc<FreeGate>,
        notify: crossbeam_channel::Sender<Notice>,
    ) -> State {
        let locks = Arc::new(super::locks::EngineLocks::new(engine.clone(), who.clone()));
        State {
            engine,
            who,
            locks,
            applied: AtomicU64::new(from),
            checkpointed: AtomicU64::new(from),
            checkpoint_every: crate::config::shared_checkpoint_every(),
            config,
            ahead: Mutex::new(Ahead::default()),
            answered: Condvar::new(),
            catching: Mutex::new(()),
            turns: Mutex::new(HeldTurns::default()),
            given: Condvar::new(),
            gate,
            notify,
            stop: AtomicBool::new(false),
            whole: AtomicBool::new(true),
            large: AtomicBool::new(false),
            whole_under: AtomicU64::new(crate::config::shared_whole_under()),
            keeper: AtomicBool::new(false),
            keeper_next: Mutex::new(Instant::now()),
            forgotten_since_trim: AtomicU64::new(0),
            noted_inodes: AtomicU64::new(0),
            joined: Mutex::new(Instant::now()),
            tip: Mutex::new(None),
            marked: Mutex::new(HashMap::new()),
            to_settle: Mutex::new(Vec::new()),
            to_collect: Mutex::new(Vec::new()),
            lost: Mutex::new(None),
            behind: Mutex::new(Default::default()),
            hold_writes: AtomicBool::new(true),
            linger_paused: AtomicBool::new(false),
            linger_rounds: AtomicU64::new(0),
            lost_answer_wait_ms: AtomicU64::new(LOST_ANSWER_WAIT.as_millis() as u64),
            names_in_one_load: AtomicU64::new(load::NAMES_IN_ONE_LOAD),
            paused: AtomicBool::new(false),
        }
    }
}

/// A running shared volume client: its poller stops (and is joined) on drop.
pub struct SharedClient {
    state: Arc<State>,
    /// The file system this client keeps up to date (weak: the mount owns it).
    fs: Weak<Fs>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Renews the session ([`session::beat_loop`]).
    beater: Option<std::thread::JoinHandle<()>>,
    /// Gives lingering turns back ([`linger_loop`]).
    lingerer: Option<std::thread::JoinHandle<()>>,
    /// Not joined: it ends once the file system (which keeps its channel open) is gone.
    _notifier: std::thread::JoinHandle<()>,
}

fn engine_err(e: EngineError) -> Error {
    Error::new(libc::EIO, e.to_string())
}

/// What the notifier thread is given.
enum Notice {
    /// Invalidations of changes applied inside a request.
    Tell(Vec<crate::fs::Invalidation>),
    /// Run (with true) once everything sent before it has been told.
    Flushed(crate::fs::KernelTold),
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
    // A read is no change: access times are not kept, as with `noatime` (JuiceFS's default
    // too).
    config.atime = crate::fs::Atime::Never;
    config.dir_atime = false;
    config.fixed_access_times = true;
    engine
        .start_session(&who, SESSION_TTL)
        .map_err(|e| e.to_string())?;
    match engine.format().map_err(|e| e.to_string())? {
        Some(SHARED_FORMAT) => {}
        Some(found) if found > SHARED_FORMAT => {
            return Err(EngineError::Format {
                found,
                ours: SHARED_FORMAT,
                live: Vec::new(),
            }
            .to_string())
        }
        // An older format (none: format 1): upgraded once no other client is live.
        older => {
            let found = older.unwrap_or(1);
            engine.upgrade(&who).map_err(|e| e.to_string())?;
            log::warn!(
                "shared volume on {}: upgraded from format {found} to {SHARED_FORMAT} \
                 (clients of an older rmemfs can no longer change it)",
                engine.describe()
            );
        }
    }
    // Where the engine's state is whole, the root and its names as of the log's head: the
    // rest is loaded as it is used ([`load`]). Else the newest checkpoint, then the log
    // after it.
    let partial = engine.state_whole().map_err(|e| e.to_string())?;
    let (meta, from) = match partial {
        true => load::join_partial(&*engine, &config)?,
        false => match engine.checkpoint().map_err(|e| e.to_string())? {
            Some(c) => (engine_image::decode(&c.image, &config)?, c.lsn),
            None => (Meta::new_shared(0o755, config.root_uid, config.root_gid), 0),
        },
    };
    // Shared once the engine's turns and locks are its own (below).
    let fs = Fs::with_meta(data, config.clone(), meta);
    let gate = Arc::new(FreeGate::waiting_for_the_floor());
    let (notify, told) = crossbeam_channel::unbounded::<Notice>();
    let state = Arc::new(State::new(engine, who, config, from, gate.clone(), notify));
    state.whole.store(!partial, Ordering::SeqCst);
    // Before the poller starts: whether it loads the rest of the namespace (a failure:
    // the poller's next round asks again, loading meanwhile as on a small volume).
    if let Err(e) = state.claim_keeper_role(&fs) {
        log::warn!("shared volume: whether it is large (next round): {e}");
    }
    let replayed = state
        .catch_up(&fs, false)
        .map_err(|e| format!("replaying the engine's log: {}", e.message))?;
    log::info!(
        "shared volume joined as '{}' on {}: {replayed} changes replayed, {} inodes",
        state.who,
        state.engine.describe(),
        fs.inode_count()
    );
    // A volume upgraded from format 6 has no state beside its log yet.
    state
        .make_state_whole(&fs)
        .map_err(|e| format!("writing the engine's state: {}", e.message))?;
    // Each server's birth in the history before anything is read there.
    state
        .record_births(&fs)
        .map_err(|e| format!("recording the memory servers' births: {}", e.message))?;
    fs.set_journal(Box::new(EngineRecorder(state.clone())));
    let fs = Arc::new(fs.joined(crate::fs::VolumeHooks {
        barrier: None,
        turns: Some(Box::new(SharedTurns(state.clone()))),
        locks: Some(Box::new(state.locks.clone())),
    }));
    // A new volume's root is dated once, by its first client (before, it showed 1970).
    let dated = {
        let _door = fs.admit_change();
        fs.date_new_root()
    };
    match dated {
        Ok(true) => log::info!("shared volume: its root dated now (a new volume)"),
        Ok(false) => {}
        Err(e) => log::warn!("shared volume: its root is not dated: {}", e.message),
    }
    pool.set_free_gate(gate);
    pool.follow_at(state.applied.load(Ordering::SeqCst));
    let (s, weak) = (state.clone(), Arc::downgrade(&fs));
    let thread = std::thread::Builder::new()
        .name("volume-shared".into())
        .spawn(move || poll_loop(&s, &weak))
        .map_err(|e| format!("cannot start the shared volume's poller: {e}"))?;
    let s = state.clone();
    let beater = std::thread::Builder::new()
        .name("volume-beat".into())
        .spawn(move || session::beat_loop(&s))
        .map_err(|e| format!("cannot start the shared volume's heartbeats: {e}"))?;
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
                    (Notice::Flushed(then), Some(_)) => then(true),
                    (Notice::Flushed(then), None) => return then(false),
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
            beater: Some(beater),
            lingerer: Some(lingerer),
            _notifier: notifier,
        },
    ))
}

impl Drop for SharedClient {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        for t in [self.thread.take(), self.beater.take()]
            .into_iter()
            .flatten()
        {
            t.thread().unpark();
            let _ = t.join();
        }
        if let Some(t) = self.lingerer.take() {
            let _ = t.join();
        }
        self.state.give_all();
        self.state.give_keeper_role();
        let (engine, who) = (&*self.state.engine, &self.state.who);
        if let Err(e) = crate::engine::drop_session_locks(engine, who, who) {
            log::warn!("leaving the shared volume: its file locks stay until eviction: {e}");
        }
        let _ = engine.drop_session(who);
    }
}
