//! The client side of the memory pool: connections to a list of memory servers, placement of
//! allocations across them by free capacity, and one-sided reads and writes of remote extents.
//!
//! Each server has a control connection (allocation, free, capacity) and a fabric queue pair
//! (data). All queue pairs share one completion queue whose completions are handed, in the
//! fabric's completion context, to the batch they belong to, which wakes its waiter: no
//! reaping thread sits between the network and the caller. Failures name the server: a transport error marks that
//! server failed, and later operations on its extents fail at once instead of waiting again.
//!
//! A failed server is not given up for good: [`Pool::try_reconnect`] (called with backoff by
//! the mount's upkeep thread) opens new connections and asks the server to resume the old
//! session. A server that still holds it (a link flap, a pause, within its lease) is up again
//! with every extent intact, and the extents this pool let go of meanwhile are freed there;
//! a server that does not (a new process, an expired lease) comes back empty and is only
//! admitted once the caller has forgotten every copy it listed on it ([`Pool::admit`]).

pub mod control;
pub mod frrwp;
mod stock;

use crate::auth::Secret;
use crate::fabric::{
    Completion, CompletionQueue, Fabric, FabricError, Opcode, QueuePair, RemoteRegion, ServerId,
    Sge, WcStatus, WorkRequest,
};
use crate::proto::{Capacity, Message, RefusalCode};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Arc, Condvar, Mutex};
use control::ControlConn;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

/// Pool failures. Every variant that concerns one server names it.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("memory server {addr} is unreachable: {reason}")]
    Unreachable { addr: SocketAddr, reason: String },
    #[error("memory server {addr} refused the handshake: {reason}")]
    Handshake { addr: SocketAddr, reason: String },
    #[error("{reason}")]
    Auth { addr: SocketAddr, reason: String },
    #[error("lost the control connection to memory server {addr}: {reason}")]
    ControlLost { addr: SocketAddr, reason: String },
    #[error("memory server {addr} ({server}) has failed")]
    ServerFailed { server: ServerId, addr: SocketAddr },
    #[error("{opcode:?} on memory server {addr} ({server}) failed: {status:?}")]
    Op {
        server: ServerId,
        addr: SocketAddr,
        opcode: Opcode,
        status: WcStatus,
    },
    #[error("no memory server has {requested} contiguous bytes free")]
    NoSpace { requested: u64 },
    /// Nothing could be placed because no server is up (not for want of room: EIO).
    #[error("no memory server is up to hold {requested} bytes")]
    NoServerUp { requested: u64 },
    #[error("memory server {addr} refused: {message}")]
    Refused {
        addr: SocketAddr,
        code: RefusalCode,
        message: String,
    },
    #[error("{0}")]
    Fabric(#[from] FabricError),
    #[error("bad request: {0}")]
    Invalid(String),
}

impl PoolError {
    /// The server an operation failed on, or that failed, if the error is about one server's
    /// data path (what a replicated write drops that server's copy for).
    pub fn failed_server(&self) -> Option<ServerId> {
        match self {
            PoolError::ServerFailed { server, .. } => Some(*server),
            PoolError::Op {
                server,
                status: WcStatus::TransportError | WcStatus::RemoteAccessError,
                ..
            } => Some(*server),
            _ => None,
        }
    }
}

/// Client settings.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Shown in server logs.
    pub client_name: String,
    /// Connect and control-reply timeout.
    pub timeout: Duration,
    /// The shared secret the servers hold (none: servers without one).
    pub secret: Secret,
    /// On a fabric that delivers completions from its own threads (tcp), a small batch's
    /// waiter spins up to [`SPIN_WAIT`] for them before it sleeps (`mount --busy-poll`): one
    /// thread wake-up fewer per small op, for a core spent spinning.
    pub busy_poll: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            client_name: format!("rmemfs-{}", std::process::id()),
            timeout: crate::config::OP_TIMEOUT,
            secret: Secret::none(),
            busy_poll: false,
        }
    }
}

/// Where a server stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerState {
    /// Serving.
    Up,
    /// Failed (dead, frozen, cut off, or it broke a connection); the pool keeps trying to
    /// reconnect.
    Down,
    /// Reconnected, but it did not hold this pool's session any more (a new process, or the
    /// lease ran out): not used until every copy listed on it is forgotten ([`Pool::admit`]).
    Rejoining,
}

/// One live server's room for new extents as last heard ([`Pool::room`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// Free bytes, with this pool's stock there.
    pub free: u64,
    /// No extent longer than this fits (the largest free extent, with the stock that may
    /// join it when given back).
    pub largest_free: u64,
}

/// What the pool knows of one server.
#[derive(Debug, Clone)]
pub struct ServerStatus {
    pub id: ServerId,
    pub addr: SocketAddr,
    pub capacity: Capacity,
    /// Not up (down or rejoining).
    pub failed: bool,
    pub state: ServerState,
    /// When it entered that state.
    pub since: SystemTime,
    /// Times it went down since the pool connected.
    pub downs: u64,
}

/// How a failed server came back ([`Pool::try_reconnect`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejoin {
    /// It still held this pool's session: up again, every extent intact.
    Resumed { extents: u64, bytes: u64 },
    /// It holds nothing of ours: the caller forgets every copy on it, then [`Pool::admit`]s it.
    Empty,
}

/// One server's connections, replaced as a whole when the pool reconnects.
struct Link {
    control: ControlConn,
    qp: Arc<dyn QueuePair>,
}

struct Health {
    state: ServerState,
    since: SystemTime,
    /// The next reconnect attempt is not before this, and the wait after a failed one.
    next_attempt: Instant,
    backoff: Duration,
}

struct Server {
    id: ServerId,
    addr: SocketAddr,
    link: Mutex<Arc<Link>>,
    /// Not up: operations refuse it at once (a fast check on the data path).
    failed: AtomicBool,
    health: Mutex<Health>,
    /// When the heartbeat now unanswered was sent (none outstanding: `None`).
    beat_sent: Arc<Mutex<Option<Instant>>>,
    /// Extents let go of (address, key) while the server was down, or whose free the
    /// connection lost: freed there when it resumes this pool's session, forgotten if it
    /// comes back empty.
    unfreed: Arc<Mutex<Parked>>,
    /// Frees sent to it and answered.
    frees: Arc<FreesOut>,
    /// Extents it granted ahead of demand (see [`stock`]).
    stock: Arc<Mutex<stock::Stock>>,
    /// Times it went down or came back up.
    transitions: AtomicU64,
}

/// Frees kept for a server's session (address, key), and which session that is: a free
/// parked by a late answer after the server came back without the session is dropped, so it
/// can never free an extent of the new session that happens to have the same address and
/// key (as verbs keys may, after a server restart).
#[derive(Default)]
struct Parked {
    /// Bumped each time the server comes back without this pool's session.
    session: u64,
    frees: Vec<(u64, u64)>,
}

impl Parked {
    /// Keeps a free sent in `session`, unless that session is gone.
    fn keep(&mut self, session: u64, addr: u64, rkey: u64) {
        if session == self.session {
            self.frees.push((addr, rkey));
        }
    }

    /// Keeps frees of extents of the current session.
    fn keep_current(&mut self, extents: impl IntoIterator<Item = (u64, u64)>) {
        self.frees.extend(extents);
    }
}

impl Server {
    fn link(&self) -> Arc<Link> {
        self.link.lock().clone()
    }
    /// Its capacity as last heard on the current control connection.
    fn capacity(&self) -> Capacity {
        *self.link().control.capacity.lock()
    }
    fn is_failed(&self) -> bool {
        if self.failed.load(Ordering::SeqCst) {
            return true;
        }
        let broken = {
            let l = self.link.lock();
            l.control.is_dead() || !l.qp.is_connected()
        };
        if broken {
            self.mark_failed();
        }
        broken
    }
    /// The server is given up on: both connections are closed, so operations still queued
    /// on it fail at once (and are retried on other copies) instead of waiting out a frozen
    /// server, and a server that was only slow learns that this client is gone.
    fn mark_failed(&self) {
        if !self.failed.swap(true, Ordering::SeqCst) {
            log::error!("memory server {} ({}) is down", self.addr, self.id);
            {
                let mut h = self.health.lock();
                h.state = ServerState::Down;
                h.since = SystemTime::now();
                h.backoff = crate::config::RECONNECT_BACKOFF_MIN;
                h.next_attempt = Instant::now() + h.backoff;
            }
            *self.beat_sent.lock() = None;
            // Its stock is this session's memory there: freed if the session resumes.
            let stocked = self.stock.lock().drain();
            self.unfreed.lock().keep_current(stocked);
            self.transitions.fetch_add(1, Ordering::SeqCst);
            let link = self.link();
            link.control.kill();
            link.qp.disconnect();
        }
    }
    fn failed_error(&self) -> PoolError {
        PoolError::ServerFailed {
            server: self.id,
            addr: self.addr,
        }
    }
}

/// The free of an extent on a server that is not up ([`Pool::free`]), asked while the frees
/// kept for it were `session`'s: kept for that session (sent if the server resumes it, or
/// with the next free if it resumed meanwhile), dropped if the server came back without it
/// (the memory went with the old process or lease, and a free kept would reach the new
/// session, where an extent may have the same address and key).
fn park_free(health: &Mutex<Health>, unfreed: &Mutex<Parked>, session: u64, addr: u64, rkey: u64) {
    if health.lock().state != ServerState::Rejoining {
        unfreed.lock().keep(session, addr, rkey);
    }
}

/// A server came back without this pool's session ([`Rejoin::Empty`]): the frees kept for the
/// old session are forgotten, and the server waits (`Rejoining`) for [`Pool::admit`]. In one
/// step under the health lock: a free that sees the server down still has the old session's
/// number, and one that sees the new number sees it rejoining ([`park_free`]).
fn forget_session(health: &Mutex<Health>, unfreed: &Mutex<Parked>) {
    let mut h = health.lock();
    {
        let mut parked = unfreed.lock();
        parked.session += 1;
        parked.frees.clear();
    }
    h.state = ServerState::Rejoining;
    h.since = SystemTime::now();
}

/// A server resumed this pool's session ([`Rejoin::Resumed`]): the frees kept while it was
/// down, taken out to be sent on the new link before it is up again.
fn take_parked(health: &Mutex<Health>, unfreed: &Mutex<Parked>) -> Vec<(u64, u64)> {
    let _h = health.lock();
    std::mem::take(&mut unfreed.lock().frees)
}

/// A server is up again (resumed, or admitted empty): used from now on.
fn back_up(h: &mut Health, failed: &AtomicBool, transitions: &AtomicU64) {
    h.state = ServerState::Up;
    h.since = SystemTime::now();
    transitions.fetch_add(1, Ordering::SeqCst);
    failed.store(false, Ordering::SeqCst);
}

/// One one-sided operation on a remote extent: `local.len` bytes at `offset` into `remote`.
#[derive(Debug, Clone, Copy)]
pub struct RemoteOp {
    pub opcode: Opcode,
    pub local: Sge,
    pub remote: RemoteRegion,
    pub offset: u64,
}

/// Completions outstanding for one `execute` call.
struct Batch {
    state: Mutex<BatchState>,
    done: Condvar,
    /// When it was begun (posting follows at once), for the batch latencies.
    started: Instant,
}

impl Batch {
    fn new(n: usize) -> Batch {
        Batch {
            started: Instant::now(),
            state: Mutex::new(BatchState {
                remaining: n,
                failure: None,
                refused: None,
            }),
            done: Condvar::new(),
        }
    }

    /// Waits for every member; returns the first failure by op index and a refusal, if any.
    /// Every posted request completes (queue pairs guarantee it, with bounded timeouts). A
    /// conditional write completes when its allocation is answered; if a batch makes no
    /// progress for `stall`, `on_stall` gives up on the servers that have not answered (their
    /// reply handlers then fail the writes), so this wait ends.
    fn wait(
        &self,
        stall: Duration,
        on_stall: &dyn Fn(),
    ) -> (Option<(usize, WcStatus)>, Option<PoolError>) {
        let mut st = self.state.lock();
        let mut seen = st.remaining;
        while st.remaining > 0 {
            let (g, timed_out) = self.done.wait_timeout(st, stall);
            st = g;
            if timed_out && st.remaining == seen {
                drop(st);
                on_stall();
                st = self.state.lock();
            }
            seen = st.remaining;
        }
        (st.failure, st.refused.take())
    }
}

struct BatchState {
    remaining: usize,
    /// The first failure, by op index.
    failure: Option<(usize, WcStatus)>,
    /// A conditional write that could not be posted (its allocation was refused, or the
    /// server went away before answering).
    refused: Option<PoolError>,
}

/// Batches of at most this many bytes are small: their waiter polls the fabric for a while
/// before sleeping (a 4 KiB read should cost one RDMA round trip, not two thread wake-ups).
const SPIN_MAX_BYTES: u64 = crate::config::SMALL_OP_BYTES;
/// How long a small batch's waiter polls before it sleeps: a hundred RDMA round trips on
/// hardware (µs each), one or two on soft-RoCE under emulation (a 4 KiB read takes 0.2 to
/// 0.3 ms there); bounded so that a dead or slow server costs at most this much CPU per small
/// op. (Under emulation 2 ms measured no better than 0.5 ms: 2113 against 1810 µs p50.)
const SPIN_WAIT: Duration = Duration::from_micros(500);

/// How long `--busy-poll` spins for a small op on a fabric with its own delivery threads
/// (tcp) before sleeping: about one loopback round trip here (a 4 KiB read's p50 is 70 to
/// 75 µs without it), so most completions are caught while a slow one costs little CPU
/// and leaves the core to the threads that deliver it.
const BUSY_POLL_WAIT: Duration = Duration::from_micros(100);

/// Bits of a work-request id that index the op within its batch; the rest is the batch id.
const BATCH_INDEX_BITS: u32 = 24;

struct Dispatch {
    batches: Mutex<HashMap<u64, Arc<Batch>>>,
}

impl Dispatch {
    fn deliver(&self, c: Completion) {
        let batch_id = c.wr_id >> BATCH_INDEX_BITS;
        let index = (c.wr_id & ((1 << BATCH_INDEX_BITS) - 1)) as usize;
        let batch = self.batches.lock().get(&batch_id).cloned();
        let Some(batch) = batch else {
            log::error!("completion for unknown batch {batch_id}");
            return;
        };
        let mut st = batch.state.lock();
        if c.status != WcStatus::Success && st.failure.is_none_or(|(i, _)| index < i) {
            st.failure = Some((index, c.status));
        }
        // Release the local registration before the waiter wakes, so that when `execute`
        // returns, none of its buffers is still counted as in use.
        drop(c);
        st.remaining -= 1;
        if st.remaining == 0 {
            batch.done.notify_all();
        }
    }

    /// Completes `count` ops of a batch that will never be posted.
    fn fail(&self, batch_id: u64, count: usize, why: PoolError) {
        let batch = self.batches.lock().get(&batch_id).cloned();
        let Some(batch) = batch else { return };
        let mut st = batch.state.lock();
        st.refused.get_or_insert(why);
        st.remaining -= count;
        if st.remaining == 0 {
            batch.done.notify_all();
        }
    }
}

/// A connected pool of memory servers.
/// The kinds of fabric batch whose latency (post to last completion) the pool keeps:
/// reads, writes to allocated memory, writes that include conditional writes to fresh
/// memory (FRRWP), and batches of both reads and writes.
pub const BATCH_KINDS: [&str; 4] = ["read", "write", "write_fresh", "mixed"];

pub struct Pool {
    fabric: Arc<dyn Fabric>,
    /// Latencies of finished batches by [`BATCH_KINDS`] (`stats`, metrics).
    batch_latency: crate::requests::RequestStats,
    servers: Vec<Server>,
    /// Shared by every queue pair, reconnected ones included.
    cq: Arc<CompletionQueue>,
    config: PoolConfig,
    dispatch: Arc<Dispatch>,
    next_batch: AtomicU64,
    /// How long a batch may make no progress before its unanswered allocations are given up.
    timeout: Duration,
}

/// One server's frees: how many were sent and how many answered (in order: one connection),
/// and the waiters for an answer ([`Pool::free`] at the cap, [`Pool::settle_frees`]).
#[derive(Default)]
struct FreesOut {
    /// (sent, answered)
    counts: Mutex<(u64, u64)>,
    answered: Condvar,
}

impl FreesOut {
    fn answer(&self) {
        self.counts.lock().1 += 1;
        self.answered.notify_all();
    }

    /// Waits until `done(sent, answered)` or `deadline`; returns whether it holds.
    fn wait_until(&self, deadline: Instant, done: impl Fn(u64, u64) -> bool) -> bool {
        self.wait_then(deadline, done, |_| {})
    }

    /// Counts one more free sent once fewer than `cap` are unanswered, or at `deadline`
    /// (checked and counted under one lock, so concurrent frees never pass the cap together).
    fn reserve(&self, cap: u64, deadline: Instant) {
        self.wait_then(
            deadline,
            |sent, answered| sent - answered < cap,
            |c| c.0 += 1,
        );
    }

    /// Waits until `done(sent, answered)` or `deadline`, then runs `then` on the counts under
    /// the same lock; returns whether `done` held.
    fn wait_then(
        &self,
        deadline: Instant,
        done: impl Fn(u64, u64) -> bool,
        then: impl FnOnce(&mut (u64, u64)),
    ) -> bool {
        let mut c = self.counts.lock();
        let mut held = done(c.0, c.1);
        while !held {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            c = self.answered.wait_timeout(c, left).0;
            held = done(c.0, c.1);
        }
        then(&mut c);
        held
    }
}

/// Opens one server's connections: the control session (authenticated), then, when
/// `resume` names an earlier session's token, the request to resume it (`Some((extents,
/// bytes))` if the server still held it), then the data path.
fn open_link(
    fabric: &Arc<dyn Fabric>,
    cq: &Arc<CompletionQueue>,
    config: &PoolConfig,
    addr: SocketAddr,
    resume: Option<crate::auth::Token>,
) -> Result<(Link, Option<(u64, u64)>), PoolError> {
    let control = ControlConn::connect(addr, &config.client_name, config.timeout, &config.secret)?;
    if control.hello.fabric != fabric.name() {
        return Err(PoolError::Handshake {
            addr,
            reason: format!(
                "server uses the '{}' fabric, this client '{}'",
                control.hello.fabric,
                fabric.name()
            ),
        });
    }
    let resumed = match resume {
        None => None,
        Some(token) => match control.request(|tag| Message::Resume { tag, token })? {
            Message::Resumed { extents, bytes, .. } => Some((extents, bytes)),
            Message::Refused { .. } => None,
            other => return Err(PoolError::Invalid(format!("unexpected reply {other:?}"))),
        },
    };
    let mut exchange = |blob: Vec<u8>| -> Result<Vec<u8>, FabricError> {
        let reply = control.request(|tag| Message::Connect { tag, blob });
        match reply {
            Ok(Message::Connected { blob, .. }) => Ok(blob),
            Ok(other) => Err(FabricError::Handshake {
                addr,
                reason: format!("unexpected reply {other:?}"),
            }),
            Err(e) => Err(FabricError::Handshake {
                addr,
                reason: e.to_string(),
            }),
        }
    };
    let qp = fabric.connect(addr, &mut exchange, cq.clone(), &control.token)?;
    Ok((Link { control, qp }, resumed))
}

impl Pool {
    /// Connects to every server (control connection and fabric queue pair). Any server that
    /// cannot be reached fails the whole connect with an error naming it.
    pub fn connect(
        fabric: Arc<dyn Fabric>,
        addrs: &[SocketAddr],
        config: &PoolConfig,
    ) -> Result<Pool, PoolError> {
        if addrs.is_empty() {
            return Err(PoolError::Invalid("no memory servers given".into()));
        }
        let dispatch = Arc::new(Dispatch {
            batches: Mutex::new(HashMap::new()),
        });
        let d = dispatch.clone();
        let cq = fabric.create_cq_with_handler(Arc::new(move |c| d.deliver(c)));
        let mut servers = Vec::with_capacity(addrs.len());
        for (i, &addr) in addrs.iter().enumerate() {
            let (link, _) = open_link(&fabric, &cq, config, addr, None)?;
            servers.push(Server {
                id: ServerId(i as u32),
                addr,
                link: Mutex::new(Arc::new(link)),
                failed: AtomicBool::new(false),
                health: Mutex::new(Health {
                    state: ServerState::Up,
                    since: SystemTime::now(),
                    next_attempt: Instant::now(),
                    backoff: crate::config::RECONNECT_BACKOFF_MIN,
                }),
                beat_sent: Arc::new(Mutex::new(None)),
                unfreed: Arc::default(),
                frees: Arc::default(),
                stock: Arc::default(),
                transitions: AtomicU64::new(0),
            });
        }
        Ok(Pool {
            fabric,
            batch_latency: crate::requests::RequestStats::with_ops(&BATCH_KINDS),
            servers,
            cq,
            config: config.clone(),
            dispatch,
            next_batch: AtomicU64::new(1),
            timeout: config.timeout,
        })
    }

    /// Latencies of the fabric batches finished so far, by kind ([`BATCH_KINDS`]).
    pub fn batch_latency(&self) -> Vec<crate::requests::OpSummary> {
        self.batch_latency.summary()
    }

    /// Changes whenever a server goes down or comes back up.
    pub fn generation(&self) -> u64 {
        self.servers
            .iter()
            .map(|s| s.transitions.load(Ordering::SeqCst))
            .sum()
    }

    /// Failed servers due for a reconnect attempt (their backoff has passed).
    pub fn due_for_reconnect(&self) -> Vec<ServerId> {
        let now = Instant::now();
        self.servers
            .iter()
            .filter(|s| s.is_failed())
            .filter(|s| {
                let h = s.health.lock();
                h.state == ServerState::Down && h.next_attempt <= now
            })
            .map(|s| s.id)
            .collect()
    }

    /// One attempt to reconnect to failed server `id` and resume this pool's session there.
    /// `None`: not down, or not reachable yet (the next attempt backs off). A resumed
    /// server is up again at once; one that came back empty waits for [`Pool::admit`].
    pub fn try_reconnect(&self, id: ServerId) -> Option<Rejoin> {
        let s = self.server(id).ok()?;
        if s.health.lock().state != ServerState::Down {
            return None;
        }
        let old = s.link().control.token;
        let (link, resumed) =
            match open_link(&self.fabric, &self.cq, &self.config, s.addr, Some(old)) {
                Ok(l) => l,
                Err(e) => {
                    let mut h = s.health.lock();
                    log::debug!("memory server {} ({id}) still unreachable: {e}", s.addr);
                    h.backoff = (h.backoff * 2).min(crate::config::RECONNECT_BACKOFF_MAX);
                    h.next_attempt = Instant::now() + h.backoff;
                    return None;
                }
            };
        let link = Arc::new(link);
        if resumed.is_none() {
            // A new session: what was parked or stocked for the old one is forgotten before
            // the new link is published, so nothing sent on it is mistaken for the old
            // session's (see [`Parked`] and [`stock`]).
            forget_session(&s.health, &s.unfreed);
            s.stock.lock().reset();
        }
        *s.link.lock() = link.clone();
        let Some((extents, bytes)) = resumed else {
            log::warn!(
                "memory server {} ({id}) is back without this mount's session (restarted, \
                 or its lease ran out): its copies are gone; admitting it empty",
                s.addr
            );
            return Some(Rejoin::Empty);
        };
        let unfreed = take_parked(&s.health, &s.unfreed);
        let n = unfreed.len();
        for (addr, rkey) in unfreed {
            let _ = link
                .control
                .request(|tag| Message::Free { tag, addr, rkey });
        }
        log::warn!(
            "memory server {} ({id}) is back: session resumed with {extents} extents \
             ({bytes} bytes); {n} extents let go of meanwhile freed",
            s.addr
        );
        back_up(&mut s.health.lock(), &s.failed, &s.transitions);
        Some(Rejoin::Resumed { extents, bytes })
    }

    /// Test hook: cuts this pool off server `id` as a lost link would (both connections
    /// closed from this side, no goodbye), so the server keeps the session for its lease.
    #[cfg(feature = "testing")]
    pub fn cut(&self, id: ServerId) {
        if let Ok(s) = self.server(id) {
            s.mark_failed();
            s.health.lock().next_attempt = Instant::now();
        }
    }

    /// Puts a server that came back empty ([`Rejoin::Empty`]) into service, once the caller
    /// has forgotten every copy it listed on it.
    pub fn admit(&self, id: ServerId) {
        let Ok(s) = self.server(id) else { return };
        let mut h = s.health.lock();
        if h.state != ServerState::Rejoining {
            return;
        }
        back_up(&mut h, &s.failed, &s.transitions);
        drop(h);
        log::warn!("memory server {} ({id}) is up again (empty)", s.addr);
    }

    pub fn fabric(&self) -> &Arc<dyn Fabric> {
        &self.fabric
    }

    /// The control timeout (connects, replies, stalled conditional writes).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn server(&self, id: ServerId) -> Result<&Server, PoolError> {
        self.servers
            .get(id.0 as usize)
            .ok_or_else(|| PoolError::Invalid(format!("no {id} in this pool")))
    }

    /// The pool's view of every server.
    pub fn status(&self) -> Vec<ServerStatus> {
        self.servers
            .iter()
            .map(|s| {
                let failed = s.is_failed();
                let (state, since) = {
                    let h = s.health.lock();
                    (h.state, h.since)
                };
                ServerStatus {
                    id: s.id,
                    addr: s.addr,
                    capacity: s.capacity(),
                    failed,
                    state,
                    since,
                    downs: s.transitions.load(Ordering::SeqCst).div_ceil(2),
                }
            })
            .collect()
    }

    /// Asks every live server for its current capacity.
    pub fn refresh(&self) -> Vec<ServerStatus> {
        for s in &self.servers {
            if s.is_failed() {
                continue;
            }
            // The reply thread notes the capacity it carries.
            if s.link()
                .control
                .request(|tag| Message::Stat { tag })
                .is_err()
            {
                s.mark_failed();
            }
        }
        self.status()
    }

    /// One heartbeat round (call it a few times per `detection`): a live server whose last
    /// heartbeat has gone unanswered for `detection` is marked failed (a frozen or cut-off
    /// server is noticed even while no operation is waiting on it); the others get a new
    /// one, whose answer also refreshes what placement knows of their free memory.
    pub fn heartbeat(&self, detection: Duration) {
        for s in &self.servers {
            if s.is_failed() {
                continue;
            }
            let sent = *s.beat_sent.lock();
            match sent {
                Some(t) if t.elapsed() >= detection => {
                    log::error!(
                        "memory server {} ({}) missed its heartbeats for {:?}",
                        s.addr,
                        s.id,
                        t.elapsed()
                    );
                    s.mark_failed();
                }
                Some(_) => {}
                None => {
                    *s.beat_sent.lock() = Some(Instant::now());
                    let beat = s.beat_sent.clone();
                    let sent = s.link().control.send_with_handler(
                        |tag| Message::Stat { tag },
                        Box::new(move |reply| {
                            if let Some(Message::Stats { .. }) = reply {
                                *beat.lock() = None;
                            }
                        }),
                    );
                    if sent.is_err() {
                        s.mark_failed();
                    }
                }
            }
        }
    }

    /// Total and free bytes over live servers.
    pub fn capacity(&self) -> Capacity {
        let mut c = Capacity::default();
        for s in self.status().into_iter().filter(|s| !s.failed) {
            c.total += s.capacity.total;
            c.free += s.capacity.free;
            c.largest_free = c.largest_free.max(s.capacity.largest_free);
        }
        c
    }

    /// Each live server's room as last heard, for checking a placement before it is made:
    /// its free bytes plus what this pool holds in stock there (an allocation refused for
    /// room gets the stock back first, see [`Pool::alloc_on`]).
    pub fn room(&self) -> Vec<Room> {
        self.servers
            .iter()
            .filter(|s| !s.is_failed())
            .map(|s| {
                let c = s.capacity();
                let stocked = s.stock.lock().bytes();
                Room {
                    free: c.free + stocked,
                    largest_free: c.largest_free + stocked,
                }
            })
            .collect()
    }

    /// Whether `id` is up (its connections work, as far as the pool knows).
    pub fn is_live(&self, id: ServerId) -> bool {
        self.server(id).is_ok_and(|s| !s.is_failed())
    }

    /// Servers that are up.
    pub fn live_servers(&self) -> usize {
        self.servers.iter().filter(|s| !s.is_failed()).count()
    }

    /// Allocates `len` bytes on each of `n` distinct live servers, none of them in `exclude`,
    /// in placement order (room first, then most free memory). If fewer servers are up than
    /// that, one copy on each live one; if the live servers cannot hold as many copies as
    /// there are of them, nothing is kept and the answer is `NoSpace` (so a pool of two
    /// servers keeping two copies is full when one of them is).
    pub fn alloc_replicas(
        &self,
        len: u64,
        n: usize,
        exclude: &[ServerId],
    ) -> Result<Vec<RemoteRegion>, PoolError> {
        let candidates: Vec<usize> = self
            .placement(len)
            .into_iter()
            .filter(|i| !exclude.contains(&ServerId(*i as u32)))
            .collect();
        let want = n.min(candidates.len());
        let mut got = Vec::with_capacity(want);
        let mut full = false;
        let mut failed = None;
        for i in candidates {
            if got.len() == want {
                break;
            }
            match self.alloc_on(ServerId(i as u32), len) {
                Ok(r) => got.push(r),
                Err(PoolError::Refused {
                    code: RefusalCode::NoSpace,
                    ..
                }) => full = true,
                Err(e @ PoolError::ServerFailed { .. })
                | Err(e @ PoolError::ControlLost { .. }) => {
                    failed = Some(e);
                    continue;
                }
                Err(e) => {
                    self.free_all(&got);
                    return Err(e);
                }
            }
        }
        // Short because a live server had no room: full. Short because servers failed on
        // the way: fewer copies (the caller decides whether that is enough). Nothing at all
        // because every server tried failed, or none is up: that is no lack of room (EIO,
        // not ENOSPC).
        if got.is_empty() || (got.len() < want && full) {
            self.free_all(&got);
            if got.is_empty() && !full {
                return Err(self.nothing_placed(len, failed));
            }
            return Err(PoolError::NoSpace { requested: len });
        }
        Ok(got)
    }

    /// Gives extents back, ignoring servers that cannot take them (gone, or refusing).
    pub fn free_all(&self, regions: &[RemoteRegion]) {
        for r in regions {
            if let Err(e) = self.free(*r) {
                log::debug!("freeing an extent on {}: {e}", r.server);
            }
        }
    }

    /// Live servers in placement order for `len` bytes: those that (as last heard) can hold
    /// it first, then by free memory.
    fn placement(&self, len: u64) -> Vec<usize> {
        let mut order: Vec<(u64, u64, usize)> = self
            .servers
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_failed())
            .map(|(i, s)| {
                let c = s.capacity();
                (c.largest_free, c.free, i)
            })
            .collect();
        // Servers that (as last heard) can hold it first, then by free bytes.
        order.sort_by(|a, b| {
            let fits = |x: &(u64, u64, usize)| x.0 >= len;
            fits(b).cmp(&fits(a)).then(b.1.cmp(&a.1))
        });
        order.into_iter().map(|(_, _, i)| i).collect()
    }

    /// Allocates `len` bytes on the live server with the most free memory that can hold it,
    /// falling back to the others when one refuses for lack of space.
    pub fn alloc(&self, len: u64) -> Result<RemoteRegion, PoolError> {
        let (mut full, mut failed) = (false, None);
        for i in self.placement(len) {
            match self.alloc_on(ServerId(i as u32), len) {
                Ok(r) => return Ok(r),
                Err(PoolError::Refused {
                    code: RefusalCode::NoSpace,
                    ..
                }) => full = true,
                Err(e @ PoolError::ServerFailed { .. })
                | Err(e @ PoolError::ControlLost { .. }) => failed = Some(e),
                Err(e) => return Err(e),
            }
        }
        if full {
            return Err(PoolError::NoSpace { requested: len });
        }
        Err(self.nothing_placed(len, failed))
    }

    /// The error of an allocation of `len` bytes that placed nothing and was refused for
    /// room nowhere: the failure of the servers tried, or that no server is up (a pool whose
    /// servers are down is not full: EIO), or else the lack of room the live servers were
    /// last heard of (ENOSPC).
    pub(crate) fn nothing_placed(&self, len: u64, failed: Option<PoolError>) -> PoolError {
        match failed {
            Some(e @ (PoolError::ServerFailed { .. } | PoolError::ControlLost { .. })) => e,
            _ if self.live_servers() == 0 => PoolError::NoServerUp { requested: len },
            _ => PoolError::NoSpace { requested: len },
        }
    }

    /// Allocates on one given server. Refused for lack of room while this pool holds extents
    /// in stock there, it gives those back and asks once more.
    pub fn alloc_on(&self, id: ServerId, len: u64) -> Result<RemoteRegion, PoolError> {
        match self.alloc_on_once(id, len) {
            Err(PoolError::Refused {
                code: RefusalCode::NoSpace,
                ..
            }) if self.drain_stock(self.server(id)?) => self.alloc_on_once(id, len),
            other => other,
        }
    }

    fn alloc_on_once(&self, id: ServerId, len: u64) -> Result<RemoteRegion, PoolError> {
        let s = self.server(id)?;
        if s.is_failed() {
            return Err(s.failed_error());
        }
        let reply = s.link().control.request(|tag| Message::Alloc { tag, len });
        match reply {
            Ok(Message::Allocated {
                addr, len, rkey, ..
            }) => Ok(RemoteRegion {
                server: id,
                addr,
                len,
                rkey,
            }),
            Ok(Message::Refused { code, message, .. }) => {
                if code == RefusalCode::NoSpace {
                    // Keep placement honest until the next reply refreshes it.
                    let link = s.link();
                    let mut c = link.control.capacity.lock();
                    c.largest_free = c.largest_free.min(len.saturating_sub(1));
                }
                Err(PoolError::Refused {
                    addr: s.addr,
                    code,
                    message,
                })
            }
            Ok(other) => Err(PoolError::Invalid(format!("unexpected reply {other:?}"))),
            Err(e) => {
                s.mark_failed();
                Err(e)
            }
        }
    }

    /// Gives an extent back to its server, without waiting for the answer: an unlink or a
    /// truncation costs no round trip. The request goes out on the server's control
    /// connection, which the server serves in order, so whatever this pool asks of it later
    /// (an allocation, a `Stat`) finds the memory free. At most
    /// [`config::FREES_IN_FLIGHT_MAX`](crate::config::FREES_IN_FLIGHT_MAX) are unanswered per
    /// server (more wait), so the allocations and heartbeats queued behind them stay prompt.
    /// The answer updates the capacity last heard ([`Pool::settle_frees`] waits for the
    /// answers still out, for `statfs`). A free that cannot be sent, or whose connection
    /// breaks first, is kept with the frees of a server that is down: sent again if the server
    /// resumes this pool's session (a second free of an extent already freed is refused by
    /// its key), forgotten if it comes back without it.
    pub fn free(&self, region: RemoteRegion) -> Result<(), PoolError> {
        let s = self.server(region.server)?;
        let (addr, rkey) = (region.addr, region.rkey);
        // The session the extent is of, as far as this pool knows: read before the server's
        // failure is seen, so a server that comes back without it meanwhile has a newer one.
        let session = s.unfreed.lock().session;
        if s.is_failed() {
            // Freed there if the server comes back holding this session.
            park_free(&s.health, &s.unfreed, session, addr, rkey);
            return Err(s.failed_error());
        }
        // Frees parked after the server rejoined (a lost answer handled late) go along: they
        // belong to this session (see [`Parked`]).
        let parked = std::mem::take(&mut s.unfreed.lock().frees);
        for (a, k) in parked {
            if self.send_free(s, a, k).is_err() {
                break;
            }
        }
        self.send_free(s, addr, rkey)
    }

    /// Sends one free (see [`Pool::free`]) once fewer than the cap are unanswered.
    fn send_free(&self, s: &Server, addr: u64, rkey: u64) -> Result<(), PoolError> {
        // A server that answers nothing for the op timeout is the heartbeat's to catch: the
        // free goes out anyway, queued behind the others.
        s.frees.reserve(
            crate::config::FREES_IN_FLIGHT_MAX,
            Instant::now() + self.timeout,
        );
        let (unfreed, frees) = (s.unfreed.clone(), s.frees.clone());
        let session = s.unfreed.lock().session;
        let sent = s.link().control.send_with_handler(
            |tag| Message::Free { tag, addr, rkey },
            Box::new(move |reply| {
                match reply {
                    Some(Message::Freed { .. }) => {}
                    Some(other) => log::debug!("freeing the extent at {addr:#x}: {other:?}"),
                    None => unfreed.lock().keep(session, addr, rkey),
                }
                frees.answer();
            }),
        );
        if let Err(e) = sent {
            // Not sent, and its handler is never called: kept for a resumed session.
            s.frees.answer();
            s.unfreed.lock().keep(session, addr, rkey);
            s.mark_failed();
            return Err(e);
        }
        Ok(())
    }

    /// Waits until every free sent so far to a live server has been answered (at most
    /// `wait`), so the capacity last heard from each counts what was given back. Frees sent
    /// meanwhile are not waited for: a steady `rm -rf` does not hold this up.
    pub fn settle_frees(&self, wait: Duration) {
        let deadline = Instant::now() + wait;
        for s in self.servers.iter().filter(|s| !s.is_failed()) {
            let target = s.frees.counts.lock().0;
            if !s
                .frees
                .wait_until(deadline, |_, answered| answered >= target)
            {
                return;
            }
        }
    }

    /// Runs a batch of one-sided operations (on any mix of servers, all posted before any is
    /// waited for) and returns when every one has completed. The first failure, in op order,
    /// is the error; a transport failure marks its server failed.
    pub fn execute(&self, ops: &[RemoteOp]) -> Result<(), PoolError> {
        if ops.is_empty() {
            return Ok(());
        }
        self.check_ops(ops)?;
        let (batch_id, batch) = self.begin_batch(ops.len())?;
        self.post_ops(batch_id, 0, ops);
        let small = ops.iter().map(|op| op.local.len).sum::<u64>() <= SPIN_MAX_BYTES;
        if small {
            self.poll_briefly(&batch);
        }
        let kind = if ops.iter().all(|op| op.opcode == Opcode::Read) {
            "read"
        } else if ops.iter().all(|op| op.opcode == Opcode::Write) {
            "write"
        } else {
            "mixed"
        };
        self.finish_batch(
            batch_id,
            batch,
            kind,
            |i| (ops[i].remote.server, ops[i].opcode),
            &|| {},
        )
    }

    /// On a fabric whose completions can be polled from here (verbs), polls for up to
    /// [`SPIN_WAIT`] before the batch waiter goes to sleep: a small op's completion then never
    /// waits for the poller thread to wake and wake this thread in turn. On other fabrics,
    /// with [`PoolConfig::busy_poll`], spins as long for their threads to deliver it.
    fn poll_briefly(&self, batch: &Batch) {
        let deadline = Instant::now() + SPIN_WAIT;
        let busy_deadline = Instant::now() + BUSY_POLL_WAIT;
        while batch.state.lock().remaining > 0 {
            match self.fabric.progress() {
                None if !self.config.busy_poll => return,
                None if Instant::now() >= busy_deadline => return,
                None => std::hint::spin_loop(),
                // Other threads' completions count as progress too: the deadline holds
                // whatever this thread delivers.
                Some(_) if Instant::now() >= deadline => return,
                Some(0) => std::hint::spin_loop(),
                Some(_) => {}
            }
        }
    }

    fn check_ops(&self, ops: &[RemoteOp]) -> Result<(), PoolError> {
        for op in ops {
            let s = self.server(op.remote.server)?;
            if op
                .offset
                .checked_add(op.local.len)
                .is_none_or(|end| end > op.remote.len)
            {
                return Err(PoolError::Invalid(format!(
                    "{} bytes at offset {} exceed a {}-byte extent",
                    op.local.len, op.offset, op.remote.len
                )));
            }
            if s.is_failed() {
                return Err(s.failed_error());
            }
        }
        Ok(())
    }

    fn begin_batch(&self, n: usize) -> Result<(u64, Arc<Batch>), PoolError> {
        if n >= 1 << BATCH_INDEX_BITS {
            return Err(PoolError::Invalid("batch too large".into()));
        }
        let batch_id = self.next_batch.fetch_add(1, Ordering::Relaxed);
        let batch = Arc::new(Batch::new(n));
        self.dispatch.batches.lock().insert(batch_id, batch.clone());
        Ok((batch_id, batch))
    }

    /// Posts `ops` as batch members `base..`, each server's ops in one call.
    fn post_ops(&self, batch_id: u64, base: usize, ops: &[RemoteOp]) {
        let mut per_server: Vec<Vec<WorkRequest>> = vec![Vec::new(); self.servers.len()];
        for (i, op) in ops.iter().enumerate() {
            per_server[op.remote.server.0 as usize].push(WorkRequest {
                wr_id: (batch_id << BATCH_INDEX_BITS) | (base + i) as u64,
                opcode: op.opcode,
                local: op.local,
                remote_addr: op.remote.addr + op.offset,
                rkey: op.remote.rkey,
            });
        }
        for (s, wrs) in self.servers.iter().zip(&per_server) {
            if !wrs.is_empty() {
                s.link().qp.post(wrs);
            }
        }
    }

    /// Waits for every member of a batch; `who(i)` names the server and opcode of member `i`
    /// for the error.
    fn finish_batch(
        &self,
        batch_id: u64,
        batch: Arc<Batch>,
        kind: &'static str,
        who: impl Fn(usize) -> (ServerId, Opcode),
        on_stall: &dyn Fn(),
    ) -> Result<(), PoolError> {
        let (failure, refused) = batch.wait(self.timeout, on_stall);
        self.batch_latency
            .record(kind, batch.started.elapsed().as_nanos() as u64);
        self.dispatch.batches.lock().remove(&batch_id);
        if let Some(e) = refused {
            return Err(e);
        }
        match failure {
            None => Ok(()),
            Some((i, status)) => {
                let (server, opcode) = who(i);
                let s = self.server(server)?;
                if status == WcStatus::TransportError {
                    s.mark_failed();
                }
                Err(PoolError::Op {
                    server: s.id,
                    addr: s.addr,
                    opcode,
                    status,
                })
            }
        }
    }

    /// Reads `local.len` bytes at `offset` of `remote` into `local`.
    pub fn read(&self, remote: RemoteRegion, offset: u64, local: Sge) -> Result<(), PoolError> {
        self.execute(&[RemoteOp {
            opcode: Opcode::Read,
            local,
            remote,
            offset,
        }])
    }

    /// Writes `local` to `offset` of `remote`.
    pub fn write(&self, remote: RemoteRegion, offset: u64, local: Sge) -> Result<(), PoolError> {
        self.execute(&[RemoteOp {
            opcode: Opcode::Write,
            local,
            remote,
            offset,
        }])
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        for s in &self.servers {
            let link = s.link();
            // An unmount: the server frees this pool's extents now rather than keep them
            // for a lease.
            if !s.failed.load(Ordering::SeqCst) {
                link.control.goodbye();
            }
            link.qp.disconnect();
            link.control.kill();
        }
    }
}

#[cfg(test)]
mod parked_tests {
    use super::Parked;

    #[test]
    fn a_free_parked_for_a_session_that_is_gone_is_dropped() {
        let mut p = Parked::default();
        p.keep(0, 0x1000, 7);
        assert_eq!(p.frees, [(0x1000, 7)]);
        // The server came back without the session: what was kept goes, and a late answer
        // from the old session is not kept for the new one.
        p.session += 1;
        p.frees.clear();
        p.keep(0, 0x2000, 8);
        assert!(p.frees.is_empty());
        p.keep(1, 0x3000, 9);
        assert_eq!(p.frees, [(0x3000, 9)]);
    }
}

#[cfg(all(test, feature = "shuttle"))]
mod model_tests {
    use super::*;
    use crate::meta::{Chunk, Replica};
    use crate::sync::thread;

    pub(super) fn completion(batch: u64, index: usize, status: WcStatus) -> Completion {
        let wr = WorkRequest {
            wr_id: (batch << BATCH_INDEX_BITS) | index as u64,
            opcode: Opcode::Read,
            local: Sge {
                addr: 0,
                len: 8,
                lkey: 1,
            },
            remote_addr: 0,
            rkey: 1,
        };
        Completion::new(&wr, status, None)
    }

    /// A batch spread over two servers: each server's completion context delivers its
    /// members (one of them a refusal) while the waiter waits. The waiter wakes exactly when
    /// the last member is in, never before (no lost or early wake-up in any interleaving), and
    /// sees the first failure by op index whatever order they arrived in.
    #[test]
    fn model_batch_completion_across_servers() {
        shuttle::check_random(
            || {
                let dispatch = Arc::new(Dispatch {
                    batches: Mutex::new(HashMap::new()),
                });
                let batch = Arc::new(Batch::new(4));
                dispatch.batches.lock().insert(7, batch.clone());
                let server_a = {
                    let d = dispatch.clone();
                    thread::spawn(move || {
                        d.deliver(completion(7, 0, WcStatus::Success));
                        d.deliver(completion(7, 3, WcStatus::RemoteAccessError));
                    })
                };
                let server_b = {
                    let d = dispatch.clone();
                    thread::spawn(move || {
                        d.deliver(completion(7, 2, WcStatus::TransportError));
                        d.fail(7, 1, PoolError::Invalid("allocation refused".into()));
                    })
                };
                let (failure, refused) = batch.wait(Duration::from_secs(3600), &|| {});
                assert_eq!(
                    batch.state.lock().remaining,
                    0,
                    "woke before the last member"
                );
                assert_eq!(failure, Some((2, WcStatus::TransportError)));
                assert!(matches!(refused, Some(PoolError::Invalid(_))));
                server_a.join().unwrap();
                server_b.join().unwrap();
            },
            3000,
        );
    }

    /// The server that went down, in the rejoin models: chunk copies are on servers 0 and
    /// this one; rebuild and heal place new copies on server 2.
    const GONE: u32 = 1;
    const REPLICAS: usize = 2;
    /// An extent let go of on [`GONE`] before the models start (parked for its session).
    const EARLIER: (u64, u64) = (0xe000, 0xe0);

    /// File `f`'s copy on [`GONE`] (of the session it went down with).
    fn old_copy(f: u64) -> Replica {
        Replica {
            server: GONE,
            addr: 0x10_000 * (f + 1),
            rkey: 0x10 + f,
        }
    }

    /// A server that went down holding a copy of each of two files' chunk, as the pool's
    /// standing of it (the real [`Health`] and [`Parked`], changed by the real
    /// [`park_free`], [`forget_session`], [`take_parked`] and [`back_up`]) and the files'
    /// chunk maps (the real lock and [`Chunk`]); the steps of the data path that use them
    /// mirror [`crate::data::DataStore`]'s (a [`Pool`] needs TCP control connections, which
    /// cannot run under the model checker).
    struct RejoinModel {
        health: Mutex<Health>,
        unfreed: Mutex<Parked>,
        failed: AtomicBool,
        transitions: AtomicU64,
        /// Frees sent to [`GONE`] on its new link (address, key).
        wire: Mutex<Vec<(u64, u64)>>,
        /// Copies on [`GONE`] that rebuild or heal took out of their chunk.
        let_go: Mutex<Vec<(u64, u64)>>,
        files: [crate::sync::RwLock<std::collections::BTreeMap<u64, Chunk>>; 2],
        next_addr: AtomicU64,
    }

    impl RejoinModel {
        fn new() -> RejoinModel {
            let file = |f: u64| {
                let here = Replica {
                    server: 0,
                    addr: 0x1000 * (f + 1),
                    rkey: 1 + f,
                };
                let c = Chunk::with_replicas(4096, &[here, old_copy(f)]);
                crate::sync::RwLock::new([(0, c)].into_iter().collect())
            };
            RejoinModel {
                health: Mutex::new(Health {
                    state: ServerState::Down,
                    since: SystemTime::now(),
                    next_attempt: Instant::now(),
                    backoff: Duration::from_millis(100),
                }),
                unfreed: Mutex::new(Parked {
                    session: 0,
                    frees: vec![EARLIER],
                }),
                failed: AtomicBool::new(true),
                transitions: AtomicU64::new(1),
                wire: Mutex::new(Vec::new()),
                let_go: Mutex::new(Vec::new()),
                files: [file(0), file(1)],
                next_addr: AtomicU64::new(0x100_000),
            }
        }

        fn is_live(&self, server: u32) -> bool {
            server != GONE || !self.failed.load(Ordering::SeqCst)
        }

        /// [`Pool::free`] of an extent on [`GONE`].
        fn free(&self, addr: u64, rkey: u64) {
            let session = self.unfreed.lock().session;
            if self.failed.load(Ordering::SeqCst) {
                park_free(&self.health, &self.unfreed, session, addr, rkey);
                return;
            }
            let parked = std::mem::take(&mut self.unfreed.lock().frees);
            let mut wire = self.wire.lock();
            wire.extend(parked);
            wire.push((addr, rkey));
        }

        /// `DataStore::rebuild_chunk`, or `heal` before a write, of file `f`'s chunk (under
        /// its chunk map's write lock): copies on dead servers leave it (`let_go`: taken out,
        /// then freed), and a chunk short of copies gets one on server 2.
        fn upkeep(&self, f: usize) {
            let mut chunks = self.files[f].write();
            let Some(c) = chunks.get_mut(&0) else { return };
            let dead: Vec<u32> = c
                .replicas()
                .iter()
                .filter(|r| !self.is_live(r.server))
                .map(|r| r.server)
                .collect();
            if dead.len() == c.replicas().len() {
                return;
            }
            for server in dead {
                if let Some(gone) = c.remove(server) {
                    self.let_go.lock().push((gone.addr, gone.rkey));
                    self.free(gone.addr, gone.rkey);
                }
            }
            if c.replicas().len() < REPLICAS && c.on(2).is_none() {
                let addr = self.next_addr.fetch_add(0x1000, Ordering::SeqCst);
                let new = Replica {
                    server: 2,
                    addr,
                    rkey: addr,
                };
                assert!(c.add(new), "a new copy's extent leaked");
            }
        }

        /// `rebuild::pass`: each file's degraded chunks found under the read lock, then
        /// rebuilt under the write lock.
        fn rebuild_pass(&self) {
            for f in 0..self.files.len() {
                let degraded = self.files[f].read().values().any(|c| {
                    c.replicas()
                        .iter()
                        .filter(|r| self.is_live(r.server))
                        .count()
                        < REPLICAS
                });
                if degraded {
                    self.upkeep(f);
                }
            }
        }

        /// `rebuild::forget_server`: every copy on [`GONE`] leaves every file; how many.
        fn forget_server(&self) -> usize {
            self.files
                .iter()
                .map(|f| {
                    f.write()
                        .values_mut()
                        .filter_map(|c| c.remove(GONE))
                        .count()
                })
                .sum()
        }

        /// Runs the rebuild (both files) and a write to file 0 (healing its chunk) against
        /// `reconnect`; returns what `reconnect` returned.
        fn race<T: Send + 'static>(
            self: &Arc<Self>,
            reconnect: impl FnOnce(&RejoinModel) -> T + Send + 'static,
        ) -> T {
            let rebuild = {
                let w = self.clone();
                thread::spawn(move || w.rebuild_pass())
            };
            let write = {
                let w = self.clone();
                thread::spawn(move || w.upkeep(0))
            };
            let r = {
                let w = self.clone();
                thread::spawn(move || reconnect(&w))
            };
            rebuild.join().unwrap();
            write.join().unwrap();
            r.join().unwrap()
        }

        /// Every chunk keeps its copy on server 0, has at most [`REPLICAS`] copies and none
        /// twice on a server.
        fn check_chunks(&self) {
            for (f, file) in self.files.iter().enumerate() {
                let c = file.read()[&0];
                let servers: Vec<u32> = c.replicas().iter().map(|r| r.server).collect();
                assert!(
                    servers.contains(&0),
                    "file {f} lost a live copy: {servers:?}"
                );
                assert!(servers.len() <= REPLICAS, "file {f}: {servers:?}");
                let mut distinct = servers.clone();
                distinct.sort();
                distinct.dedup();
                assert_eq!(distinct.len(), servers.len(), "file {f}: {servers:?}");
            }
        }
    }

    /// [`GONE`] comes back without the session (a new process) while the rebuild and a
    /// write's heal let go of its copies: the reconnect forgets the session, then every copy
    /// on it (`forget_server`), then admits it. In every interleaving each old copy leaves its
    /// chunk exactly once (let go or forgotten), the other copies stay, and no free of the old
    /// session is kept for the new one or sent to it (where an extent with the same address
    /// and key would be freed under a live copy).
    #[test]
    fn model_rejoin_empty_versus_rebuild_and_heal() {
        shuttle::check_random(
            || {
                let w = Arc::new(RejoinModel::new());
                let forgotten = w.race(|w| {
                    forget_session(&w.health, &w.unfreed);
                    let n = w.forget_server();
                    let mut h = w.health.lock();
                    if h.state == ServerState::Rejoining {
                        back_up(&mut h, &w.failed, &w.transitions);
                    }
                    n
                });
                assert_eq!(w.health.lock().state, ServerState::Up);
                assert!(!w.failed.load(Ordering::SeqCst));
                w.check_chunks();
                for file in &w.files {
                    assert!(file.read()[&0].on(GONE).is_none(), "an old copy stayed");
                }
                let let_go = w.let_go.lock().clone();
                assert_eq!(
                    let_go.len() + forgotten,
                    2,
                    "let go {let_go:?}, {forgotten} forgotten"
                );
                let parked = w.unfreed.lock();
                assert_eq!(parked.session, 1);
                assert!(
                    parked.frees.is_empty(),
                    "frees of the old session kept for the new one: {:?}",
                    parked.frees
                );
                assert!(
                    w.wire.lock().is_empty(),
                    "old frees sent: {:?}",
                    w.wire.lock()
                );
            },
            3000,
        );
    }

    /// [`GONE`] comes back holding the session (within its lease) while the rebuild and a
    /// write's heal decide about its copies: the reconnect sends the frees kept while it was
    /// down, then puts it back up. In every interleaving each copy is either kept (the
    /// server is up with it) or let go and rebuilt on another server, never half of each;
    /// every extent let go of is freed exactly once, in its session (sent, or still kept for
    /// the next free: none leaked, none freed twice), and no listed copy is freed.
    #[test]
    fn model_rejoin_resumed_versus_rebuild_and_heal() {
        shuttle::check_random(
            || {
                let w = Arc::new(RejoinModel::new());
                w.race(|w| {
                    let sent = take_parked(&w.health, &w.unfreed);
                    w.wire.lock().extend(sent);
                    back_up(&mut w.health.lock(), &w.failed, &w.transitions);
                });
                assert_eq!(w.health.lock().state, ServerState::Up);
                w.check_chunks();
                let parked = w.unfreed.lock();
                assert_eq!(parked.session, 0);
                let mut freed: Vec<(u64, u64)> = w.wire.lock().clone();
                freed.extend(parked.frees.iter().copied());
                freed.sort();
                let mut let_go = w.let_go.lock().clone();
                let_go.push(EARLIER);
                let_go.sort();
                assert_eq!(freed, let_go, "freed (sent or kept) against let go");
                for (f, file) in w.files.iter().enumerate() {
                    let c = file.read()[&0];
                    assert_eq!(c.replicas().len(), REPLICAS, "file {f} left short");
                    let old = old_copy(f as u64);
                    let kept = c.on(GONE).is_some();
                    assert_ne!(
                        kept,
                        freed.contains(&(old.addr, old.rkey)),
                        "file {f}: its copy on {GONE} kept {kept}, freed {freed:?}"
                    );
                }
            },
            3000,
        );
    }

    /// Two threads free (at most 2 unanswered) while the reply thread answers in order and
    /// a `statfs` settles: the cap holds in every interleaving (checked and counted under one
    /// lock), no waiter misses the answer that frees it, and a settle returns only once every
    /// free sent before it was answered.
    #[test]
    fn model_frees_keep_their_cap_and_settle_waits_for_what_came_before() {
        const CAP: u64 = 2;
        shuttle::check_random(
            || {
                let frees = Arc::new(FreesOut::default());
                let far = Instant::now() + Duration::from_secs(3600);
                // The wire: frees sent, for the reply thread to answer.
                let wire = Arc::new((Mutex::new(0u64), Condvar::new()));
                let freers: Vec<_> = (0..2)
                    .map(|_| {
                        let (f, wire) = (frees.clone(), wire.clone());
                        thread::spawn(move || {
                            for _ in 0..2 {
                                f.reserve(CAP, far);
                                let (sent, answered) = *f.counts.lock();
                                assert!(sent - answered <= CAP, "{sent} sent, {answered} answered");
                                *wire.0.lock() += 1;
                                wire.1.notify_all();
                            }
                        })
                    })
                    .collect();
                let replier = {
                    let (f, wire) = (frees.clone(), wire.clone());
                    thread::spawn(move || {
                        // Answers each free once it is on the wire, in order.
                        for k in 1..=4 {
                            let mut on_wire = wire.0.lock();
                            while *on_wire < k {
                                on_wire = wire.1.wait(on_wire);
                            }
                            drop(on_wire);
                            f.answer();
                        }
                    })
                };
                let target = frees.counts.lock().0;
                assert!(frees.wait_until(far, |_, answered| answered >= target));
                assert!(
                    frees.counts.lock().1 >= target,
                    "settled before its frees' answers"
                );
                for t in freers {
                    t.join().unwrap();
                }
                replier.join().unwrap();
                assert_eq!(*frees.counts.lock(), (4, 4));
            },
            3000,
        );
    }
}
