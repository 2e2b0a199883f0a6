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
mod arena;
mod backing;
mod follow;
mod handshake;
mod holding;
mod release;
mod report;
mod restart;
mod session;
mod share;
pub mod volume;

use crate::auth::{self, Nonce, Secret, Token};
use crate::fabric::{mem::page_size, DeregisterError, Fabric, LocalMr, PeerGuard, SessionKey};
use crate::proto::{
    self, Capacity, FrameError, Message, RefusalCode, ServerCounters, PROTOCOL_VERSION,
};
use crate::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use crate::sync::{Arc, Condvar, Mutex};
use alloc::ExtentAllocator;
use arena::Arena;
pub use arena::Reserved;
pub use report::ServerReport;
use session::{keep_alive, Handshake, Session};
use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The default control port (`rmemfs serve` and `--servers host` without a port).
pub const DEFAULT_PORT: u16 = 7471;

/// Control threads need little stack: frames are at most 64 KiB and live on the heap.
const SESSION_STACK: usize = 256 * 1024;

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
    /// Keep the arena and the extent table in this file (`--backing`): a restart comes
    /// back with every extent ([`backing`]).
    pub backing: Option<std::path::PathBuf>,
    /// The host's boot this server runs in, as its backing file records it (none: the
    /// kernel's `boot_id`). A test gives another to play a restart after a power loss.
    pub boot_id: Option<String>,
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
            backing: None,
            boot_id: None,
        }
    }
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
    /// Its extents were registered again under new keys (a backed server's restart on a
    /// fabric whose device issues keys): its resume says so.
    rekeyed: bool,
    /// Restored from a file behind what its client wrote ([`backing::SessionRecord::behind`]):
    /// its resume says so, and its client takes its copies here for stale where it has others.
    behind: bool,
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
    /// The session threads, so shutdown can wait for them: once it returns, nothing of this
    /// server runs (a backed server's file may be mapped by its successor).
    session_threads: Mutex<Vec<JoinHandle<()>>>,
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
    /// Volumes by name ([`volume`]).
    volumes: Mutex<HashMap<String, volume::Volume>>,
    /// Signalled when a volume's holder leaves (a claim that fences one waits for it).
    volume_changes: Condvar,
    /// The backing file's tables, when the arena is a file's (`--backing`).
    backing: Option<backing::Backing>,
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
        let mut allocator = ExtentAllocator::new(size, page);
        let boot = config.boot_id.clone().or_else(backing::host_boot);
        let (arena, backing, restored) = match &config.backing {
            None => {
                let arena = Arena::map(size as usize).map_err(|e| {
                    io::Error::new(e.kind(), format!("cannot map a {size}-byte arena: {e}"))
                })?;
                (arena, None, restart::Restored::default())
            }
            Some(path) => {
                if !fabric.chooses_keys() {
                    backing::pinnable_by_device(path).map_err(|why| {
                        io::Error::new(io::ErrorKind::InvalidInput, format!("--backing: {why}"))
                    })?;
                }
                let (b, arena, found) = backing::Backing::open(path, size, page)?;
                let restored = match found {
                    Some(found) => {
                        let whole =
                            backing::Run::left_whole(found.owners.run.as_ref(), boot.as_deref());
                        if !whole {
                            log::warn!(
                                "backing file {}: the host restarted since the last server \
                                 using it stopped, and that one did not stop in order (a power \
                                 loss?): it holds what was written back, maybe less than its \
                                 clients wrote; resumed clients take their copies here for stale \
                                 where they have others",
                                path.display()
                            );
                        }
                        let r = restart::restore(
                            &fabric,
                            &arena,
                            &b,
                            &mut allocator,
                            found,
                            config.lease,
                            !whole,
                        )?;
                        b.clear_free(&arena, &allocator);
                        r
                    }
                    None => restart::Restored::default(),
                };
                (arena, Some(b), restored)
            }
        };
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
            alloc: Mutex::new(allocator),
            instance: instance_id(),
            stop: AtomicBool::new(false),
            clients: AtomicU32::new(0),
            extents: AtomicU64::new(restored.extents),
            sessions: Mutex::new(HashMap::new()),
            session_threads: Mutex::new(Vec::new()),
            next_session: AtomicU64::new(restored.next_session),
            lease: config.lease,
            live_tokens: Mutex::new(HashMap::new()),
            departed: Mutex::new(restored.departed),
            departures: Condvar::new(),
            refusals: Refusals::default(),
            volumes: Mutex::new(restored.volumes),
            volume_changes: Condvar::new(),
            backing,
            arena,
        });
        if let Some(b) = &shared.backing {
            // Before anyone is served: a power loss from now on leaves a file that says so.
            b.begin_run(boot);
            shared.save_owners();
            b.persist_owners().map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "backing file {}: cannot write back: {e}",
                        b.path().display()
                    ),
                )
            })?;
        }
        let s = shared.clone();
        let accept = thread::Builder::new()
            .name("serve-accept".into())
            .spawn(move || accept_loop(listener, s))?;
        let s = shared.clone();
        let reaper = thread::Builder::new()
            .name("lease-reaper".into())
            .spawn(move || release::reap_leases(&s))?;
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

    /// Reads this server's report, for its metrics endpoint.
    pub fn report_source(&self) -> Arc<dyn Fn() -> ServerReport + Send + Sync> {
        let shared = self.shared.clone();
        let addr = self.local_addr.to_string();
        Arc::new(move || {
            let mut report = ServerReport::new(
                &addr,
                shared.fabric.name(),
                shared.instance,
                shared.capacity(),
                shared.clients.load(Ordering::SeqCst),
                shared.extents.load(Ordering::SeqCst),
                &shared.counters(),
            );
            report.backed = shared.backing.is_some();
            report
        })
    }

    /// Stops accepting, closes every control connection (their extents are freed) and waits
    /// for the accept loop.
    pub fn shutdown(&mut self) {
        if self.shared.stop.swap(true, Ordering::SeqCst) {
            return;
        }
        // A backed server keeps every session's and volume's extents in its file, as a crash
        // would: the releases below only let go of this process's registrations.
        if let Some(b) = &self.shared.backing {
            b.freeze();
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
        // Their connections are closed: each ends within its own bounded waits.
        let threads = std::mem::take(&mut *self.shared.session_threads.lock());
        for h in threads {
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
        self.shared.release_volumes();
        if let Some(b) = &self.shared.backing {
            match b.persist().and_then(|()| b.end_run_clean()) {
                Ok(()) => log::info!(
                    "backing file {}: written back; every extent is kept for a restart",
                    b.path().display()
                ),
                Err(e) => log::error!(
                    "backing file {}: write-back failed: {e}",
                    b.path().display()
                ),
            }
        }
    }

    /// Sessions whose extents are kept for a lease.
    pub fn departed_sessions(&self) -> usize {
        self.shared.departed.lock().len()
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

pub(super) fn bump(counter: &AtomicU64) {
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
                    volume: None,
                    follows: None,
                    member: None,
                    rekeyed: false,
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
        match spawned {
            Ok(h) => {
                let mut threads = shared.session_threads.lock();
                threads.retain(|t| !t.is_finished());
                threads.push(h);
            }
            Err(e) => {
                log::error!("cannot start a session thread: {e}");
                shared.sessions.lock().remove(&id);
            }
        }
    }
}
