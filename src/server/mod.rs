//! The memory server (`rmemfs serve`): lends a slab of its RAM to clients.
//!
//! It maps its arena once at start and hands out extents of it. Each extent is registered with
//! the fabric (pinned, given an rkey with remote read/write access) when it is allocated and
//! deregistered when freed, so the arena costs pinned memory only where clients use it, and
//! registration really happens per allocation (FRRWP overlaps with exactly that cost).
//!
//! The server's own logic only runs the control protocol (`proto`): hello and mutual
//! authentication ([`crate::auth`]), fabric connection setup, allocation, free, capacity.
//! Each extent is restricted to the session that allocated it; per-client quotas, a cap on
//! clients and on connections per peer address, and a deadline on the handshake keep one
//! client (or a stranger) from taking the server. File data never passes through it; the fabric's "NIC"
//! serves one-sided READ and WRITE against registered extents.
//!
//! A client that says `Goodbye` (an unmount) gets its extents freed at once. A control
//! connection that merely drops (a cut link, a client that gave up on a slow reply) keeps its
//! extents for a lease (`--lease`): the client reconnects, authenticates anew and `Resume`s
//! with its old session token, and finds its data intact; only an expired lease frees the
//! memory. TCP keepalive on control connections notices a vanished client host within the
//! server's control timeout (shorter than the client's op timeout). A peer that breaks the
//! protocol has its connection closed with a logged reason; everyone else keeps being served.

pub mod alloc;

use crate::auth::{self, Nonce, Secret, Token};
use crate::fabric::{mem::page_size, DeregisterError, Fabric, LocalMr, PeerGuard, SessionKey};
use crate::proto::{
    self, Capacity, FrameError, Message, RefusalCode, ServerCounters, PROTOCOL_VERSION,
};
use crate::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use crate::sync::{Arc, Condvar, Mutex};
use alloc::ExtentAllocator;
use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The default control port (`rmemfs serve` and `--servers host` without a port).
pub const DEFAULT_PORT: u16 = 7471;

/// Control threads need little stack: frames are at most 64 KiB and live on the heap.
const SESSION_STACK: usize = 256 * 1024;

/// The server's memory: one anonymous mapping, never exposed as a Rust slice (remote peers
/// write it through the fabric at any time).
struct Arena {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the arena is a raw mapping owned by the server; it is only accessed through raw
// pointers by the fabric after bounds checks against registrations.
unsafe impl Send for Arena {}
// SAFETY: as above; no references to its bytes are ever created.
unsafe impl Sync for Arena {}

/// `madvise` advice that faults every page of a range in, writable (Linux 5.14+;
/// include/uapi/asm-generic/mman-common.h; not in the libc crate this builds with).
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// How a reserved arena came out ([`Arena::reserve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserved {
    /// Every page faulted in and locked in RAM (no swap, no reclaim).
    Locked,
    /// Every page faulted in, but not locked (the memlock limit is below the arena); the
    /// host may still swap it out under pressure.
    Populated,
}

impl Arena {
    /// Faults every page of the arena in now (and locks it where the memlock limit allows),
    /// so the first write into it costs what a later one does and the host cannot take the
    /// memory back under pressure. Done before the server listens: no client exists yet,
    /// so nothing else touches the arena meanwhile.
    fn reserve(&self) -> io::Result<Reserved> {
        // SAFETY: the range is this arena's own mapping; the advice only faults its pages in
        // (their contents stay zero).
        let r =
            unsafe { libc::madvise(self.ptr as *mut libc::c_void, self.len, MADV_POPULATE_WRITE) };
        if r != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(e);
            }
            // A kernel before 5.14: touch each page instead.
            let page = page_size();
            for off in (0..self.len).step_by(page) {
                // SAFETY: `off` is inside the mapping, which is writable; nothing else holds
                // a reference to its bytes (no client exists yet), and the byte is zero.
                unsafe { std::ptr::write_volatile(self.ptr.add(off), 0) };
            }
        }
        // SAFETY: locking our own mapping's pages; the result is checked.
        let locked = unsafe { libc::mlock(self.ptr as *const libc::c_void, self.len) } == 0;
        Ok(if locked {
            Reserved::Locked
        } else {
            Reserved::Populated
        })
    }

    fn map(len: usize) -> io::Result<Arena> {
        // SAFETY: a fresh anonymous private mapping; the result is checked. NORESERVE: the
        // arena only costs RAM where clients write (and where extents are pinned).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Arena {
            ptr: ptr as *mut u8,
            len,
        })
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping. The server (and with it every session holding
        // registrations into the arena) is gone by the time the arena drops.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// Settings of a memory server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// Arena size in bytes.
    pub size: u64,
    /// The op timeout its clients use: the server's own timeouts (a client's `Hello`, the
    /// drain of operations on a freed extent) are derived from it and shorter
    /// ([`crate::config::server_control_timeout`]).
    pub client_op_timeout: Duration,
    /// The shared secret clients must prove they hold (none: anyone who reaches the port).
    pub secret: Secret,
    /// Most bytes one client session may hold (`--max-client-memory`); none: the arena.
    pub max_client_memory: Option<u64>,
    /// Most authenticated clients at once (`--max-clients`).
    pub max_clients: u32,
    /// Most control connections from one peer address at once.
    pub max_connections_per_peer: u32,
    /// How long a dropped session's extents are kept for its client to resume (`--lease`;
    /// zero: freed at once).
    pub lease: Duration,
    /// Reserve the arena at start (fault it in, lock it where allowed) instead of taking
    /// pages as clients first write them (`serve` does unless `--lazy`; the embedded server
    /// of a mount stays lazy).
    pub reserve: bool,
}

impl ServerConfig {
    /// A server on `listen` lending `size` bytes, for clients with the default op timeout,
    /// without a secret and with the default limits.
    pub fn new(listen: SocketAddr, size: u64) -> ServerConfig {
        ServerConfig {
            listen,
            size,
            client_op_timeout: crate::config::OP_TIMEOUT,
            secret: Secret::none(),
            max_client_memory: None,
            max_clients: crate::config::MAX_CLIENTS,
            max_connections_per_peer: crate::config::MAX_CONNECTIONS_PER_PEER,
            lease: crate::config::LEASE,
            reserve: false,
        }
    }
}

/// `rmemfs stats --server --json`'s object: the server's memory, clients and extents, and
/// its counters under [`ServerCounters::KEYS`] (`null` for remote refusals on verbs, which
/// the NIC refuses unseen by software).
pub fn stats_json(
    addr: &str,
    fabric: &str,
    instance: u64,
    capacity: Capacity,
    clients: u32,
    extents: u64,
    counters: &ServerCounters,
) -> serde_json::Value {
    let mut v = serde_json::json!({
        "server": addr,
        "fabric": fabric,
        "instance": format!("{instance:#x}"),
        "free_bytes": capacity.free,
        "total_bytes": capacity.total,
        "largest_free_bytes": capacity.largest_free,
        "clients": clients,
        "extents": extents,
    });
    for ((_, value), key) in counters.fields().into_iter().zip(ServerCounters::KEYS) {
        v[key] = if key == "remote_refused" && fabric == "verbs" {
            serde_json::Value::Null
        } else {
            value.into()
        };
    }
    v
}

struct Extent {
    mr: LocalMr,
    offset: u64,
    len: u64,
}

/// A session whose control connection dropped without `Goodbye`: its extents wait for the
/// client to resume until `expires`.
struct Departed {
    /// The session id its extents are restricted to (the resuming session takes it over).
    id: u64,
    extents: HashMap<u64, Extent>,
    held: u64,
    expires: Instant,
    client_name: String,
}

/// What departed sessions are filed under: a digest of their last session token, so a lookup
/// by a token a stranger presents does not compare secrets in variable time.
type TokenDigest = [u8; 32];

fn token_digest(token: &Token) -> TokenDigest {
    use sha2::Digest;
    sha2::Sha256::digest(token).into()
}

struct Shared {
    fabric: Arc<dyn Fabric>,
    /// The address the control listener is bound to (possibly a wildcard): the fabric serves
    /// data on the same interfaces.
    listen: SocketAddr,
    /// A client's time to complete its handshake, and a freed extent's time to drain.
    control_timeout: Duration,
    secret: Secret,
    max_client_memory: u64,
    max_clients: u32,
    max_connections_per_peer: u32,
    /// Control connections per peer address.
    per_peer: Mutex<HashMap<std::net::IpAddr, u32>>,
    alloc: Mutex<ExtentAllocator>,
    instance: u64,
    stop: AtomicBool,
    clients: AtomicU32,
    extents: AtomicU64,
    /// Control connections, so shutdown can close them.
    sessions: Mutex<HashMap<u64, TcpStream>>,
    next_session: AtomicU64,
    lease: Duration,
    /// Authenticated control connections by their token's digest (to take over a session
    /// whose client resumes before this server noticed the old connection was gone).
    live_tokens: Mutex<HashMap<TokenDigest, u64>>,
    /// Sessions within their lease.
    departed: Mutex<HashMap<TokenDigest, Departed>>,
    /// Signalled when a session departs (a takeover waits for it) and on shutdown (the
    /// lease reaper waits on it).
    departures: Condvar,
    refusals: Refusals,
    // Declared last: dropped after everything that may hold registrations into it.
    arena: Arena,
}

/// A running memory server.
pub struct MemoryServer {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    accept: Option<JoinHandle<()>>,
    reaper: Option<JoinHandle<()>>,
}

impl MemoryServer {
    /// Maps the arena, binds the listener and starts serving in background threads.
    pub fn start(config: &ServerConfig, fabric: Arc<dyn Fabric>) -> io::Result<MemoryServer> {
        let page = page_size() as u64;
        if config.size < page {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("arena size {} is smaller than a page", config.size),
            ));
        }
        let size = config.size & !(page - 1);
        let arena = Arena::map(size as usize).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot map a {size}-byte arena: {e}"))
        })?;
        if config.reserve {
            // Faulting in more than the host has would end in the OOM killer, not an error.
            if let Some(available) = crate::size::mem_available() {
                if size > available {
                    return Err(io::Error::new(
                        io::ErrorKind::OutOfMemory,
                        format!(
                            "cannot reserve a {size}-byte arena: this host has {available} \
                             bytes available (a smaller --size, or --lazy to take pages as \
                             clients write)"
                        ),
                    ));
                }
            }
            let start = std::time::Instant::now();
            let how = arena.reserve().map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "cannot reserve a {size}-byte arena ({e}): this host cannot lend that \
                         much (a smaller --size, or --lazy to take pages as clients write)"
                    ),
                )
            })?;
            log::info!(
                "arena of {size} bytes reserved in {:.2} s ({})",
                start.elapsed().as_secs_f64(),
                match how {
                    Reserved::Locked => "locked in RAM",
                    Reserved::Populated =>
                        "not locked: the memlock limit is below the arena, so the host may swap it",
                }
            );
        }
        let listener = TcpListener::bind(config.listen).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot listen on {}: {e}", config.listen))
        })?;
        let local_addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            fabric,
            listen: local_addr,
            control_timeout: crate::config::server_control_timeout(config.client_op_timeout),
            secret: config.secret.clone(),
            max_client_memory: config.max_client_memory.unwrap_or(u64::MAX),
            max_clients: config.max_clients,
            max_connections_per_peer: config.max_connections_per_peer,
            per_peer: Mutex::new(HashMap::new()),
            alloc: Mutex::new(ExtentAllocator::new(size, page)),
            instance: instance_id(),
            stop: AtomicBool::new(false),
            clients: AtomicU32::new(0),
            extents: AtomicU64::new(0),
            sessions: Mutex::new(HashMap::new()),
            next_session: AtomicU64::new(1),
            lease: config.lease,
            live_tokens: Mutex::new(HashMap::new()),
            departed: Mutex::new(HashMap::new()),
            departures: Condvar::new(),
            refusals: Refusals::default(),
            arena,
        });
        let s = shared.clone();
        let accept = thread::Builder::new()
            .name("serve-accept".into())
            .spawn(move || accept_loop(listener, s))?;
        let s = shared.clone();
        let reaper = thread::Builder::new()
            .name("lease-reaper".into())
            .spawn(move || reap_leases(&s))?;
        Ok(MemoryServer {
            shared,
            local_addr,
            accept: Some(accept),
            reaper: Some(reaper),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn capacity(&self) -> Capacity {
        self.shared.capacity()
    }

    pub fn clients(&self) -> u32 {
        self.shared.clients.load(Ordering::SeqCst)
    }

    /// What the server has refused so far (also `rmemfs stats --server`).
    pub fn counters(&self) -> ServerCounters {
        self.shared.counters()
    }

    /// Reads this server's `stats --server --json` object, for its metrics endpoint.
    pub fn stats_source(&self) -> crate::metrics::Source {
        let shared = self.shared.clone();
        let addr = self.local_addr.to_string();
        Arc::new(move || {
            stats_json(
                &addr,
                shared.fabric.name(),
                shared.instance,
                shared.capacity(),
                shared.clients.load(Ordering::SeqCst),
                shared.extents.load(Ordering::SeqCst),
                &shared.counters(),
            )
        })
    }

    /// Stops accepting, closes every control connection (their extents are freed) and waits
    /// for the accept loop.
    pub fn shutdown(&mut self) {
        if self.shared.stop.swap(true, Ordering::SeqCst) {
            return;
        }
        for (_, s) in self.shared.sessions.lock().drain() {
            let _ = s.shutdown(Shutdown::Both);
        }
        // Wake the accept loop.
        let wake = crate::fabric::reachable(self.local_addr);
        let _ = TcpStream::connect_timeout(&wake, Duration::from_millis(500));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        self.shared.departures.notify_all();
        if let Some(h) = self.reaper.take() {
            let _ = h.join();
        }
        // Leases end with the server.
        let left: Vec<Departed> = self
            .shared
            .departed
            .lock()
            .drain()
            .map(|(_, d)| d)
            .collect();
        for d in left {
            for (_, e) in d.extents {
                self.shared.release(e);
            }
        }
    }

    /// Sessions whose extents are kept for a lease.
    pub fn departed_sessions(&self) -> usize {
        self.shared.departed.lock().len()
    }
}

/// Frees the extents of sessions whose lease has run out; until the server stops.
fn reap_leases(shared: &Shared) {
    /// How often expiry is checked at most: leases are whole seconds, so this keeps a lease
    /// within a quarter second of its length.
    const TICK: Duration = Duration::from_millis(250);
    let mut departed = shared.departed.lock();
    while !shared.stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        let expired: Vec<TokenDigest> = departed
            .iter()
            .filter(|(_, d)| d.expires <= now)
            .map(|(k, _)| *k)
            .collect();
        if !expired.is_empty() {
            let gone: Vec<Departed> = expired.iter().filter_map(|k| departed.remove(k)).collect();
            drop(departed);
            for d in gone {
                log::info!(
                    "lease of client '{}' expired: releasing its {} extents ({} bytes)",
                    d.client_name,
                    d.extents.len(),
                    d.held
                );
                for (_, e) in d.extents {
                    shared.release(e);
                }
            }
            departed = shared.departed.lock();
            continue;
        }
        departed = shared.departures.wait_timeout(departed, TICK).0;
    }
}

impl Drop for MemoryServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn instance_id() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ ((std::process::id() as u64) << 32)
}

impl Shared {
    /// Deregisters an extent, waiting (bounded) for in-flight one-sided operations so the
    /// space is not handed to someone else while an old write may still land in it.
    fn release(&self, extent: Extent) {
        let mut mr = extent.mr;
        let start = Instant::now();
        loop {
            match self.fabric.deregister(vec![mr]) {
                Ok(()) => break,
                Err(DeregisterError::Busy(mut v)) => {
                    mr = v.pop().expect("one region was passed");
                    if start.elapsed() > self.control_timeout {
                        // An operation on it is still running (a peer trickling a payload).
                        // Handing the range to someone else could let that operation land in
                        // their data: quarantine it instead (its key is gone, its memory is
                        // never reused by this server).
                        log::warn!(
                            "extent at {:#x} ({} bytes) still busy after {:?}; quarantined",
                            mr.addr(),
                            extent.len,
                            self.control_timeout
                        );
                        drop(mr);
                        self.extents.fetch_sub(1, Ordering::SeqCst);
                        return;
                    }
                    thread::sleep(Duration::from_millis(1));
                }
            }
        }
        // Free space is kept zeroed (a fresh mapping is zero already), so extents are handed
        // out zeroed without work on the allocation path: a client never sees another
        // client's old bytes, and file holes inside a chunk read as zeros.
        // SAFETY: the extent lies inside the arena (it was allocated from it) and is no longer
        // registered, so no remote peer can reach it while it is cleared.
        unsafe {
            std::ptr::write_bytes(
                self.arena.ptr.add(extent.offset as usize),
                0,
                extent.len as usize,
            )
        };
        self.alloc.lock().free(extent.offset, extent.len);
        self.extents.fetch_sub(1, Ordering::SeqCst);
    }

    fn capacity(&self) -> Capacity {
        let a = self.alloc.lock();
        Capacity {
            total: a.total(),
            free: a.free_bytes(),
            largest_free: a.largest_free(),
        }
    }
}

/// The counters behind [`ServerCounters`] that only the server's own logic sees.
#[derive(Default)]
struct Refusals {
    resumed_sessions: AtomicU64,
    refused_secret: AtomicU64,
    failed_handshakes: AtomicU64,
    refused_peer_cap: AtomicU64,
    refused_max_clients: AtomicU64,
    refused_quota: AtomicU64,
    refused_no_space: AtomicU64,
    protocol_violations: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Shared {
    fn counters(&self) -> ServerCounters {
        let r = &self.refusals;
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ServerCounters {
            leased_sessions: self.departed.lock().len() as u64,
            resumed_sessions: l(&r.resumed_sessions),
            refused_secret: l(&r.refused_secret),
            failed_handshakes: l(&r.failed_handshakes),
            refused_peer_cap: l(&r.refused_peer_cap),
            refused_max_clients: l(&r.refused_max_clients),
            refused_quota: l(&r.refused_quota),
            refused_no_space: l(&r.refused_no_space),
            protocol_violations: l(&r.protocol_violations),
            remote_refused: self.fabric.counters().remote_refused,
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                log::warn!("accept: {e}");
                // Out of file descriptors and the like: back off instead of spinning.
                thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let peer_ip = stream.peer_addr().map(|a| a.ip()).ok();
        if let Some(ip) = peer_ip {
            let mut per_peer = shared.per_peer.lock();
            let n = per_peer.entry(ip).or_insert(0);
            if *n >= shared.max_connections_per_peer {
                drop(per_peer);
                bump(&shared.refusals.refused_peer_cap);
                log::warn!(
                    "refused a connection from {ip}: it already has {} (the limit per peer)",
                    shared.max_connections_per_peer
                );
                let mut s = stream;
                let _ = proto::write_frame(
                    &mut s,
                    &Message::Fatal {
                        message: format!("too many connections from {ip}"),
                    },
                );
                continue;
            }
            *n += 1;
        }
        let id = shared.next_session.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = keep_alive(&stream, shared.control_timeout) {
            log::warn!("cannot enable keepalive on a control connection: {e}");
        }
        if let Ok(clone) = stream.try_clone() {
            shared.sessions.lock().insert(id, clone);
        }
        let s = shared.clone();
        let spawned = thread::Builder::new()
            .name(format!("session-{id}"))
            .stack_size(SESSION_STACK)
            .spawn(move || {
                let peer = stream.peer_addr().ok();
                let mut session = Session {
                    shared: s.clone(),
                    id,
                    conn: id,
                    peer,
                    client_name: String::new(),
                    extents: HashMap::new(),
                    held: 0,
                    guards: Vec::new(),
                    state: Handshake::New,
                    goodbye: false,
                    failure_counted: false,
                    observer: false,
                };
                let mut stream = stream;
                let ended = session.run(&mut stream);
                // Counted before the connection closes: whoever sees it closed sees the count.
                session.count_end(&ended);
                drop(stream);
                match ended {
                    Ok(()) => log::info!("client {peer:?} disconnected"),
                    Err(e) => log::warn!("client {peer:?}: closing connection: {e}"),
                }
                session.depart();
                s.sessions.lock().remove(&id);
                if let Some(ip) = peer_ip {
                    let mut per_peer = s.per_peer.lock();
                    if let Some(n) = per_peer.get_mut(&ip) {
                        *n -= 1;
                        if *n == 0 {
                            per_peer.remove(&ip);
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            log::error!("cannot start a session thread: {e}");
            shared.sessions.lock().remove(&id);
        }
    }
}

struct Session {
    shared: Arc<Shared>,
    /// Unique in this server's life, never 0 (0 is "no session" to the fabric). A session
    /// that resumes an earlier one takes over that one's id (its extents are restricted to it).
    id: u64,
    /// This control connection (its entry in `Shared::sessions`).
    conn: u64,
    peer: Option<SocketAddr>,
    client_name: String,
    /// This client's extents, by remote address.
    extents: HashMap<u64, Extent>,
    /// Bytes those extents hold (against the quota).
    held: u64,
    /// Server-side halves of the client's data paths.
    guards: Vec<PeerGuard>,
    state: Handshake,
    /// The client said `Goodbye`: free everything now, no lease.
    goodbye: bool,
    /// Its failure is counted already (as a wrong secret or --max-clients refusal, or by
    /// `count_failure`).
    failure_counted: bool,
    /// An observer (`rmemfs stats --server`): not a client, asks only for `Stats`.
    observer: bool,
}

/// Where a control session is in its handshake.
enum Handshake {
    /// Nothing received yet.
    New,
    /// `Challenge` sent; waiting for the client's proof.
    Challenged {
        client_nonce: Nonce,
        server_nonce: Nonce,
        client_name: String,
    },
    /// Authenticated: serving requests as this session, whose data connections present
    /// `token`.
    Welcomed { token: Token },
}

/// Why a session ended early.
#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("{0}")]
    Frame(#[from] FrameError),
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("protocol violation: {0}")]
    Violation(String),
}

impl Session {
    fn run(&mut self, stream: &mut TcpStream) -> Result<(), SessionError> {
        stream.set_nodelay(true)?;
        // The whole handshake must finish within the control timeout, however the peer
        // trickles it.
        let deadline = std::time::Instant::now() + self.shared.control_timeout;
        loop {
            if !self.welcomed() {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return Err(SessionError::Violation(
                        "handshake not completed in time".into(),
                    ));
                }
                stream.set_read_timeout(Some(left))?;
            }
            let msg = match proto::read_frame(stream) {
                Ok(m) => m,
                Err(FrameError::Closed) => return Ok(()),
                Err(e @ FrameError::Proto(_)) => {
                    self.count_failure();
                    let _ = proto::write_frame(
                        stream,
                        &Message::Fatal {
                            message: e.to_string(),
                        },
                    );
                    return Err(e.into());
                }
                Err(e) => return Err(e.into()),
            };
            if let Message::Fatal { message } = &msg {
                if matches!(self.state, Handshake::Challenged { .. }) {
                    // It refused this server's proof: it holds another secret, or none.
                    bump(&self.shared.refusals.refused_secret);
                    self.failure_counted = true;
                }
                log::warn!("client {:?} gave up: {message}", self.peer);
                return Ok(());
            }
            if matches!(msg, Message::Goodbye) && self.welcomed() {
                self.goodbye = true;
                return Ok(());
            }
            let reply = match self.handle(msg) {
                Ok(r) => Some(r),
                Err(why) => {
                    self.count_failure();
                    let _ = proto::write_frame(
                        stream,
                        &Message::Fatal {
                            message: why.clone(),
                        },
                    );
                    return Err(SessionError::Violation(why));
                }
            };
            if self.welcomed() {
                stream.set_read_timeout(None)?;
            }
            match reply {
                Some(reply) => proto::write_frame(stream, &reply)?,
                None => return Ok(()),
            }
        }
    }

    /// Counts how the session ended: a handshake that never finished, or a protocol
    /// violation after it (a client that merely disconnects counts as neither).
    fn count_end(&mut self, ended: &Result<(), SessionError>) {
        if !self.welcomed()
            || matches!(
                ended,
                Err(SessionError::Violation(_) | SessionError::Frame(FrameError::Proto(_)))
            )
        {
            self.count_failure();
        }
    }

    /// Counts this session's failure, once, and before the peer can see it (a `Fatal` or
    /// the close): a failed handshake, or after it a protocol violation.
    fn count_failure(&mut self) {
        if std::mem::replace(&mut self.failure_counted, true) {
            return;
        }
        let r = &self.shared.refusals;
        bump(if self.welcomed() {
            &r.protocol_violations
        } else {
            &r.failed_handshakes
        });
    }

    fn welcomed(&self) -> bool {
        matches!(self.state, Handshake::Welcomed { .. })
    }

    /// The handshake: `Hello` → `Challenge` (the server's proof) → `Proof` (the client's) →
    /// `Welcome`. `Err` ends the session with a `Fatal` saying why.
    fn handshake(&mut self, msg: Message) -> Result<Message, String> {
        let shared = self.shared.clone();
        match (std::mem::replace(&mut self.state, Handshake::New), msg) {
            (
                Handshake::New,
                Message::Hello {
                    version,
                    client_name,
                    nonce,
                    observer,
                },
            ) => {
                self.observer = observer;
                if version != PROTOCOL_VERSION {
                    return Err(format!(
                        "protocol version {version} not supported (server speaks \
                         {PROTOCOL_VERSION})"
                    ));
                }
                if !observer && shared.clients.load(Ordering::SeqCst) >= shared.max_clients {
                    bump(&shared.refusals.refused_max_clients);
                    self.failure_counted = true;
                    log::warn!(
                        "refused client {:?} ('{client_name}'): {} clients already (--max-clients)",
                        self.peer,
                        shared.max_clients
                    );
                    return Err(format!(
                        "the server already serves {} clients (its --max-clients)",
                        shared.max_clients
                    ));
                }
                let server_nonce = auth::random_bytes::<{ auth::NONCE_LEN }>();
                let proof = shared.secret.server_proof(&auth::Transcript {
                    client_nonce: &nonce,
                    server_nonce: &server_nonce,
                    client_name: &client_name,
                });
                self.state = Handshake::Challenged {
                    client_nonce: nonce,
                    server_nonce,
                    client_name,
                };
                Ok(Message::Challenge {
                    version: PROTOCOL_VERSION,
                    nonce: server_nonce,
                    authenticated: shared.secret.is_set(),
                    proof,
                })
            }
            (
                Handshake::Challenged {
                    client_nonce,
                    server_nonce,
                    client_name,
                },
                Message::Proof { proof },
            ) => {
                let t = auth::Transcript {
                    client_nonce: &client_nonce,
                    server_nonce: &server_nonce,
                    client_name: &client_name,
                };
                if !auth::proofs_match(&proof, &shared.secret.client_proof(&t)) {
                    bump(&shared.refusals.refused_secret);
                    self.failure_counted = true;
                    log::warn!(
                        "refused client {:?} ('{client_name}'): it does not hold this server's \
                         secret",
                        self.peer
                    );
                    return Err(
                        "authentication failed: wrong secret (check --secret-file on \
                                the mount and on the server)"
                            .into(),
                    );
                }
                let token = shared.secret.session_token(&t);
                self.state = Handshake::Welcomed { token };
                self.client_name = client_name.clone();
                shared
                    .live_tokens
                    .lock()
                    .insert(token_digest(&token), self.conn);
                if !self.observer {
                    shared.clients.fetch_add(1, Ordering::SeqCst);
                }
                log::info!(
                    "client '{client_name}' connected from {:?}{}",
                    self.peer,
                    if shared.secret.is_set() {
                        " (authenticated)"
                    } else {
                        ""
                    }
                );
                Ok(Message::Welcome {
                    version: PROTOCOL_VERSION,
                    server_instance: shared.instance,
                    fabric: shared.fabric.name().into(),
                    capacity: shared.capacity(),
                })
            }
            (Handshake::New, other) => Err(format!("expected Hello first, got {}", kind(&other))),
            (_, other) => Err(format!("expected Proof, got {}", kind(&other))),
        }
    }

    /// Answers one message; `Err` is a protocol violation that ends the session.
    fn handle(&mut self, msg: Message) -> Result<Message, String> {
        let token = match &self.state {
            Handshake::Welcomed { token } => *token,
            _ => return self.handshake(msg),
        };
        if self.observer && !matches!(msg, Message::Stat { .. }) {
            return Err(format!(
                "an observer may only ask for Stats, not {}",
                kind(&msg)
            ));
        }
        Ok(match msg {
            Message::Connect { tag, blob } => {
                let session = SessionKey { id: self.id, token };
                match self
                    .shared
                    .fabric
                    .accept(&blob, self.shared.listen, session)
                {
                    Ok((blob, guard)) => {
                        self.guards.push(guard);
                        Message::Connected { tag, blob }
                    }
                    Err(e) => Message::Refused {
                        tag,
                        code: RefusalCode::RegistrationFailed,
                        message: format!("data path setup failed: {e}"),
                    },
                }
            }
            Message::Resume { tag, token: old } => return self.resume(tag, &old, &token),
            Message::Alloc { tag, len } => self.alloc(tag, len),
            Message::Free { tag, addr, rkey } => self.free(tag, addr, rkey),
            Message::Stat { tag } => Message::Stats {
                tag,
                capacity: self.shared.capacity(),
                extents: self.shared.extents.load(Ordering::SeqCst),
                clients: self.shared.clients.load(Ordering::SeqCst),
                counters: self.shared.counters(),
            },
            other => return Err(format!("unexpected {} from a client", kind(&other))),
        })
    }

    /// Takes over the extents of the departed session whose token was `old`: from the
    /// leases, or from a control connection still open (the client saw it fail before this
    /// server did), which is closed first. Only before this session has a data path or
    /// extents of its own.
    fn resume(&mut self, tag: u64, old: &Token, current: &Token) -> Result<Message, String> {
        if !self.extents.is_empty() || !self.guards.is_empty() || old == current {
            return Err("Resume must come first after Welcome".into());
        }
        let key = token_digest(old);
        let shared = self.shared.clone();
        let taken = shared.live_tokens.lock().get(&key).copied();
        if let Some(conn) = taken {
            if let Some(s) = shared.sessions.lock().get(&conn) {
                log::info!(
                    "client '{}' resumes a session whose connection is still open: closing it",
                    self.client_name
                );
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        let deadline = Instant::now() + shared.control_timeout;
        let mut departed = shared.departed.lock();
        let found = loop {
            if let Some(d) = departed.remove(&key) {
                break Some(d);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !shared.live_tokens.lock().contains_key(&key) {
                break None;
            }
            departed = shared.departures.wait_timeout(departed, left).0;
        };
        drop(departed);
        let Some(d) = found else {
            log::info!(
                "client '{}' from {:?} asked to resume a session this server does not hold",
                self.client_name,
                self.peer
            );
            return Ok(Message::Refused {
                tag,
                code: RefusalCode::NotFound,
                message: "no such session here (the server restarted or its lease expired)".into(),
            });
        };
        log::info!(
            "client '{}' from {:?} resumed its session: {} extents ({} bytes) kept",
            self.client_name,
            self.peer,
            d.extents.len(),
            d.held
        );
        bump(&shared.refusals.resumed_sessions);
        self.id = d.id;
        self.held = d.held;
        let extents = d.extents.len() as u64;
        self.extents = d.extents;
        Ok(Message::Resumed {
            tag,
            extents,
            bytes: self.held,
        })
    }

    fn alloc(&mut self, tag: u64, len: u64) -> Message {
        let refuse = |code, message: String| Message::Refused { tag, code, message };
        if self.shared.stop.load(Ordering::SeqCst) {
            return refuse(RefusalCode::ShuttingDown, "server is shutting down".into());
        }
        let total = self.shared.arena.len as u64;
        let quota = self.shared.max_client_memory;
        if self.held.saturating_add(len) > quota {
            bump(&self.shared.refusals.refused_quota);
            return refuse(
                RefusalCode::NoSpace,
                format!(
                    "this client holds {} bytes; {len} more would pass its quota of {quota} \
                     bytes (--max-client-memory)",
                    self.held
                ),
            );
        }
        if len > total {
            return refuse(
                RefusalCode::BadLength,
                format!("{len} bytes is more than the whole arena ({total} bytes)"),
            );
        }
        let Some((offset, rlen)) = self.shared.alloc.lock().alloc(len) else {
            bump(&self.shared.refusals.refused_no_space);
            let cap = self.shared.capacity();
            return refuse(
                RefusalCode::NoSpace,
                format!(
                    "no free extent of {len} bytes (free {}, largest free extent {})",
                    cap.free, cap.largest_free
                ),
            );
        };
        // SAFETY: `offset + rlen <= arena.len` by the allocator's construction, so the range
        // lies inside the arena mapping, which outlives every registration (it is dropped
        // last, after all sessions have released their extents).
        // Only this session's data connections may reach it.
        let registered = unsafe {
            let ptr = self.shared.arena.ptr.add(offset as usize);
            self.shared
                .fabric
                .register_extent(ptr, rlen as usize, self.id)
        };
        let mr = match registered {
            Ok(mr) => mr,
            Err(e) => {
                self.shared.alloc.lock().free(offset, rlen);
                log::warn!("registration of a {rlen}-byte extent failed: {e}");
                return refuse(RefusalCode::RegistrationFailed, e.to_string());
            }
        };
        self.held += rlen;
        let (addr, rkey) = (mr.addr(), mr.rkey());
        self.extents.insert(
            addr,
            Extent {
                mr,
                offset,
                len: rlen,
            },
        );
        self.shared.extents.fetch_add(1, Ordering::SeqCst);
        Message::Allocated {
            tag,
            addr,
            len: rlen,
            rkey,
            capacity: self.shared.capacity(),
        }
    }

    fn free(&mut self, tag: u64, addr: u64, rkey: u64) -> Message {
        match self.extents.get(&addr) {
            Some(e) if e.mr.rkey() == rkey => {}
            _ => {
                return Message::Refused {
                    tag,
                    code: RefusalCode::NotFound,
                    message: format!("no extent at {addr:#x} with that rkey on this connection"),
                }
            }
        }
        let extent = self.extents.remove(&addr).expect("checked above");
        self.held -= extent.len;
        self.shared.release(extent);
        Message::Freed {
            tag,
            capacity: self.shared.capacity(),
        }
    }

    /// The control connection is gone. A client that said `Goodbye`, a stopping server or a
    /// zero lease: everything is freed now. Otherwise the extents wait for the client to
    /// resume, until the lease runs out.
    fn depart(&mut self) {
        let token = match &self.state {
            Handshake::Welcomed { token } => *token,
            _ => return self.release_all(),
        };
        let key = token_digest(&token);
        {
            let mut live = self.shared.live_tokens.lock();
            if live.get(&key) == Some(&self.conn) {
                live.remove(&key);
            }
        }
        let keep = !self.goodbye
            && !self.shared.stop.load(Ordering::SeqCst)
            && !self.shared.lease.is_zero()
            && !self.extents.is_empty();
        if keep {
            log::info!(
                "client '{}' from {:?} left without goodbye: keeping its {} extents ({} bytes) \
                 for a lease of {:?}",
                self.client_name,
                self.peer,
                self.extents.len(),
                self.held,
                self.shared.lease
            );
            self.guards.clear();
            let d = Departed {
                id: self.id,
                extents: std::mem::take(&mut self.extents),
                held: std::mem::take(&mut self.held),
                expires: Instant::now() + self.shared.lease,
                client_name: self.client_name.clone(),
            };
            self.shared.departed.lock().insert(key, d);
            self.shared.clients.fetch_sub(1, Ordering::SeqCst);
            self.state = Handshake::New;
        } else {
            self.release_all();
        }
        self.shared.departures.notify_all();
    }

    fn release_all(&mut self) {
        let n = self.extents.len();
        for (_, e) in std::mem::take(&mut self.extents) {
            self.shared.release(e);
        }
        if n > 0 {
            log::info!("released {n} extents of a departed client");
        }
        self.guards.clear();
        self.held = 0;
        if self.welcomed() && !self.observer {
            self.shared.clients.fetch_sub(1, Ordering::SeqCst);
            self.state = Handshake::New;
        }
    }
}

fn kind(m: &Message) -> &'static str {
    match m {
        Message::Hello { .. } => "Hello",
        Message::Challenge { .. } => "Challenge",
        Message::Proof { .. } => "Proof",
        Message::Welcome { .. } => "Welcome",
        Message::Connect { .. } => "Connect",
        Message::Connected { .. } => "Connected",
        Message::Alloc { .. } => "Alloc",
        Message::Allocated { .. } => "Allocated",
        Message::Free { .. } => "Free",
        Message::Freed { .. } => "Freed",
        Message::Stat { .. } => "Stat",
        Message::Stats { .. } => "Stats",
        Message::Refused { .. } => "Refused",
        Message::Fatal { .. } => "Fatal",
        Message::Resume { .. } => "Resume",
        Message::Resumed { .. } => "Resumed",
        Message::Goodbye => "Goodbye",
    }
}

/// TCP keepalive on a control connection: a client host that vanished (powered off, link cut)
/// is noticed after `idle` plus three one-second probes, and its session departs (its lease
/// starts) instead of holding a slot forever. `TCP_USER_TIMEOUT` bounds unacknowledged
/// replies the same way.
fn keep_alive(stream: &TcpStream, idle: Duration) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    /// Probes one second apart, three of them: a live peer's kernel answers the first.
    const PROBE_INTERVAL_SECS: libc::c_int = 1;
    const PROBES: libc::c_int = 3;
    let fd = stream.as_raw_fd();
    let idle_secs = idle.as_secs().clamp(1, 3600) as libc::c_int;
    let user_timeout_ms = idle.as_millis().clamp(1000, 3_600_000) as libc::c_int;
    let set = |level: libc::c_int, name: libc::c_int, value: libc::c_int| {
        // SAFETY: `fd` is an open socket owned by `stream`; the option value is a live local
        // int of the size passed.
        let r = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                &value as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, idle_secs)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, PROBE_INTERVAL_SECS)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, PROBES)?;
    set(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, user_timeout_ms)
}
