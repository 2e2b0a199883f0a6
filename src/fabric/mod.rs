//! The transport: what the rest of rmemfs sees of RDMA.
//!
//! The model is the verbs model, cut down to what a memory pool needs: local memory is
//! *registered* (pinned, given an lkey, and an rkey if remote peers may touch it); a client
//! *connects* a queue pair to a server; it *posts* batches of one-sided READ and WRITE work
//! requests naming a local scatter entry `{addr, len, lkey}` and a remote `{addr, rkey}`; and it
//! *reaps* completions, each with a status, from a completion queue. The remote CPU takes no
//! part in data operations.
//!
//! Three implementations sit behind these traits: [`tcp`] (software RDMA over TCP, the default
//! on machines without an RDMA NIC), [`local`] (in-process, for tests, with fault injection and
//! op counters), and `verbs` (real RDMA, behind the `verbs` cargo feature). Nothing outside this
//! module tree knows which one is in use.
//!
//! Lifetime rule: a work request keeps its local registration alive and counted as *in use*
//! until its completion is reaped (dropped). Deregistering a region that is in use fails with
//! [`DeregisterError::Busy`] and leaves it registered, so a cache above can only evict idle
//! regions, and no operation ever lands in memory that was handed back.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

mod completion;
pub mod live;
#[cfg(any(test, feature = "inprocess-fabric"))]
pub mod local;
pub mod mem;
pub mod registry;
pub mod tcp;
#[cfg(feature = "verbs")]
pub mod verbs;
// The verbs fabric's plain data (its exchanged endpoint, its ACK timeout) needs no device:
// its tests run in every build.
#[cfg(all(test, not(feature = "verbs")))]
#[path = "verbs/endpoint.rs"]
mod verbs_endpoint;

pub use completion::{CompletionQueue, OpCounters};

/// Bytes of a session token.
pub const TOKEN_LEN: usize = 32;
/// What a data connection presents to join its control session: derived from the shared
/// secret by both ends of the handshake (`crate::auth`), only carried by the fabric.
pub type Token = [u8; TOKEN_LEN];

/// A random 64-bit value from the operating system's CSPRNG (registration keys).
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("the operating system's random source failed");
    u64::from_le_bytes(b)
}

pub use live::{LiveSession, Serving};
pub use mem::AlignedBuf;
pub use registry::{InFlight, RegionEntry, Registry};

/// Access rights of a registration, as in `ibv_access_flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access(u8);

impl Access {
    /// No rights beyond reading the region locally (the source of a WRITE).
    pub const NONE: Access = Access(0);
    /// The fabric may write into the region (needed as the target of a READ).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Remote peers may READ from the region.
    pub const REMOTE_READ: Access = Access(2);
    /// Remote peers may WRITE into the region.
    pub const REMOTE_WRITE: Access = Access(4);
    /// What a client's I/O buffer needs.
    pub const LOCAL: Access = Access(1);
    /// What a server's extent needs.
    pub const REMOTE: Access = Access(1 | 2 | 4);

    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
    pub fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }
    pub fn bits(self) -> u8 {
        self.0
    }
    /// Whether peers may reach the region at all.
    pub fn remote(self) -> bool {
        self.0 & (Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0) != 0
    }
}

/// Identifies a memory server within one client's pool (its index in the server list).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServerId(pub u32);

impl fmt::Display for ServerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "server#{}", self.0)
    }
}

/// An authenticated client session as a server's fabric sees it: its id (what extents are
/// restricted to), the token its data connections present, and whether they may only READ
/// (a volume's follower is served as the volume's session, read-only).
#[derive(Debug, Clone, Copy)]
pub struct SessionKey {
    pub id: u64,
    pub token: Token,
    pub read_only: bool,
}

/// A region of a server's memory that a client may READ and WRITE: a copyable token, the
/// counterpart of what crosses the wire in `Allocated`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    pub server: ServerId,
    pub addr: u64,
    pub len: u64,
    /// 64 bits: on the software fabrics a CSPRNG value (not guessable); a device's 32-bit
    /// rkey fits.
    pub rkey: u64,
}

/// One-sided operation kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opcode {
    /// Remote memory to the local buffer.
    Read,
    /// Local buffer to remote memory.
    Write,
}

/// A local scatter/gather entry: a byte range inside a registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub len: u64,
    pub lkey: u32,
}

/// A one-sided work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkRequest {
    /// Returned in the completion; chosen by the poster.
    pub wr_id: u64,
    pub opcode: Opcode,
    pub local: Sge,
    pub remote_addr: u64,
    pub rkey: u64,
}

/// Largest single operation, as with RDMA's 2^31 message limit (kept lower: a software peer
/// must never be asked to stream more than this in one go).
pub const MAX_OP_LEN: u64 = 1 << 30;

/// Completion status, mirroring the verbs work-completion statuses that matter here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcStatus {
    Success,
    /// Bad rkey, out of the remote region's bounds, or no permission (`IBV_WC_REM_ACCESS_ERR`).
    RemoteAccessError,
    /// The local SGE is not inside a registered region with the right access
    /// (`IBV_WC_LOC_PROT_ERR`).
    LocalProtectionError,
    /// The peer is gone, timed out, or the connection was closed (`IBV_WC_RETRY_EXC_ERR` and
    /// flushes after it).
    TransportError,
}

/// A reaped completion. Holding it keeps the local region counted as in use; drop it when done.
#[derive(Debug)]
pub struct Completion {
    pub wr_id: u64,
    pub opcode: Opcode,
    pub status: WcStatus,
    /// Bytes transferred (0 on failure).
    pub byte_len: u64,
    pub(crate) _hold: Option<InFlight>,
}

impl Completion {
    pub(crate) fn new(wr: &WorkRequest, status: WcStatus, hold: Option<InFlight>) -> Self {
        Completion {
            wr_id: wr.wr_id,
            opcode: wr.opcode,
            status,
            byte_len: if status == WcStatus::Success {
                wr.local.len
            } else {
                0
            },
            _hold: hold,
        }
    }
}

/// Registration and connection failures (not per-operation failures: those are completions).
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    #[error(
        "cannot pin {len} bytes: the locked-memory limit (ulimit -l, RLIMIT_MEMLOCK) is {limit}; \
         raise it (ulimit -l unlimited, or LimitMEMLOCK= in a systemd unit) or run as root"
    )]
    PinLimit { len: u64, limit: String },
    #[error("cannot register memory: {0}")]
    Register(String),
    #[error("invalid registration: {0}")]
    InvalidRegion(&'static str),
    #[error("cannot reach {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("fabric handshake with {addr} failed: {reason}")]
    Handshake { addr: SocketAddr, reason: String },
    #[error("the {fabric} fabric is not available: {reason}")]
    Unavailable {
        fabric: &'static str,
        reason: String,
    },
}

/// Deregistration of a batch left some regions registered.
#[derive(Debug)]
pub enum DeregisterError {
    /// These regions have operations in flight and stay registered.
    Busy(Vec<LocalMr>),
}

/// A registration of local memory. Owns the registration: dropping it deregisters (immediately
/// for new operations; the pin is released once in-flight operations are reaped).
#[derive(Debug)]
pub struct LocalMr {
    pub(crate) entry: Arc<RegionEntry>,
    pub(crate) table: Arc<Registry>,
}

impl LocalMr {
    pub fn addr(&self) -> u64 {
        self.entry.addr
    }
    pub fn len(&self) -> u64 {
        self.entry.len
    }
    pub fn is_empty(&self) -> bool {
        self.entry.len == 0
    }
    pub fn lkey(&self) -> u32 {
        self.entry.lkey
    }
    pub fn rkey(&self) -> u64 {
        self.entry.rkey
    }
    pub fn access(&self) -> Access {
        self.entry.access
    }
    /// Lets only the client session `session` reach this region remotely (a memory server
    /// restricts each extent to the session it was allocated for).
    pub fn restrict_to(&self, session: u64) {
        self.entry.restrict_to(session);
    }
    /// Operations posted with this region whose completions have not been reaped yet.
    pub fn in_flight(&self) -> u32 {
        self.entry.in_flight()
    }
    /// The scatter entry for `len` bytes at `offset` into this region.
    pub fn sge(&self, offset: u64, len: u64) -> Sge {
        Sge {
            addr: self.entry.addr + offset,
            len,
            lkey: self.entry.lkey,
        }
    }
}

impl Drop for LocalMr {
    fn drop(&mut self) {
        self.table.remove(&self.entry);
    }
}

/// A connection to one server's memory.
pub trait QueuePair: Send + Sync {
    /// Posts a batch. Never blocks on the network for long and never fails as a call: every
    /// request gets a completion, failures included.
    fn post(&self, wrs: &[WorkRequest]);
    /// As `post`, but never does the sending on the caller's thread (for callers that must
    /// not block, such as a thread that routes control replies).
    fn post_deferred(&self, wrs: &[WorkRequest]) {
        self.post(wrs)
    }
    /// False once the connection has failed; every later request completes with
    /// [`WcStatus::TransportError`].
    fn is_connected(&self) -> bool;
    /// Breaks the connection: outstanding requests complete with transport errors.
    fn disconnect(&self);
}

/// The control-channel exchange a fabric uses to set up its data path: sends the client's blob
/// in a `Connect` message and returns the server's `Connected` blob.
pub type Exchange<'a> = dyn FnMut(Vec<u8>) -> Result<Vec<u8>, FabricError> + 'a;

/// Receives completions from a queue made by [`Fabric::create_cq_with_handler`].
pub type CompletionHandler = Arc<dyn Fn(Completion) + Send + Sync>;

/// Keeps a server-side data path alive for as long as the client's control session lasts.
pub type PeerGuard = Box<dyn std::any::Any + Send>;

/// A fabric: one "NIC" with its protection domain (key table), used by clients and servers.
pub trait Fabric: Send + Sync {
    /// Short name, as shown in logs and in the server's `Welcome`.
    fn name(&self) -> &'static str;

    /// The fabric's registry (its protection domain): every registration, check and
    /// completion goes through it.
    fn registry(&self) -> &Arc<Registry>;

    /// Registers `len` bytes at `addr` (pins them and gives them keys). The software fabrics
    /// pin with `mlock` (this default); verbs registers with the device.
    ///
    /// # Safety
    /// The memory must stay valid (mapped, not freed) until the returned region is dropped or
    /// deregistered *and* every operation posted with it has been reaped.
    unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<LocalMr, FabricError> {
        // SAFETY: forwarded contract.
        unsafe { self.registry().register(addr, len, access, None) }
    }

    /// Server side: registers an extent that only the client session `session` may reach
    /// remotely. The software fabrics check the session on every remote request (this
    /// default); verbs registers it in that session's own protection domain, so the device
    /// refuses every other session's queue pairs.
    ///
    /// # Safety
    /// As for [`Fabric::register`].
    unsafe fn register_extent(
        &self,
        addr: *mut u8,
        len: usize,
        session: u64,
    ) -> Result<LocalMr, FabricError> {
        // SAFETY: forwarded contract.
        let mr = unsafe { self.register(addr, len, Access::REMOTE) }?;
        mr.restrict_to(session);
        Ok(mr)
    }

    /// Whether this fabric chooses its own remote keys, so that a backed server's restart
    /// can register its extents again under the keys its clients hold
    /// ([`Fabric::reregister_extent`]). The software fabrics do; a device issues its own.
    fn chooses_keys(&self) -> bool {
        true
    }

    /// Server side, a backed server's restart: registers an extent for `session` again,
    /// under the remote key `rkey` it had before (its clients' chunk maps name it).
    ///
    /// # Safety
    /// As for [`Fabric::register`].
    unsafe fn reregister_extent(
        &self,
        addr: *mut u8,
        len: usize,
        session: u64,
        rkey: u64,
    ) -> Result<LocalMr, FabricError> {
        if !self.chooses_keys() {
            return Err(FabricError::Register(format!(
                "the {} fabric issues its own keys: an extent cannot be registered again \
                 under its old key",
                self.name()
            )));
        }
        // SAFETY: forwarded contract.
        let mr = unsafe {
            self.registry()
                .register_as(addr, len, Access::REMOTE, None, Some(rkey))
        }?;
        mr.restrict_to(session);
        Ok(mr)
    }

    /// Registers an owned buffer; the registration keeps the buffer alive.
    fn register_buf(&self, buf: Arc<AlignedBuf>, access: Access) -> Result<LocalMr, FabricError> {
        self.registry().clone().register_owned(buf, access)
    }

    /// Deregisters a batch in one go (one trip to the device, one lock). Regions with
    /// operations in flight are returned, still registered.
    fn deregister(&self, mrs: Vec<LocalMr>) -> Result<(), DeregisterError> {
        self.registry().deregister_batch(mrs)
    }

    /// A completion queue to reap from (the same type on every fabric).
    fn create_cq(&self) -> Arc<CompletionQueue> {
        CompletionQueue::new()
    }

    /// A completion queue whose completions go to `handler` as they arrive
    /// ([`CompletionQueue::with_handler`]).
    fn create_cq_with_handler(&self, handler: CompletionHandler) -> Arc<CompletionQueue> {
        CompletionQueue::with_handler(handler)
    }

    /// Client side: connects a queue pair to the server whose control connection reaches
    /// `server`, using `exchange` for any handshake the data path needs. `token` is the
    /// control session's token ([`crate::auth`]): the data connection presents it, and the
    /// server serves it as that session (all zeros: no session, for tests that skip the
    /// control handshake on the in-process fabric).
    fn connect(
        &self,
        server: SocketAddr,
        exchange: &mut Exchange<'_>,
        cq: Arc<CompletionQueue>,
        token: &Token,
    ) -> Result<Arc<dyn QueuePair>, FabricError>;

    /// Server side: answers a client's `Connect` blob. `listen` is the address the server's
    /// control listener is bound to, wildcard included: a software fabric serves data on the
    /// same interfaces, so every client that reached the control port reaches the data port.
    /// `session` is the authenticated control session asking: its data connections are
    /// served as that session, and only while the returned guard lives.
    fn accept(
        &self,
        blob: &[u8],
        listen: SocketAddr,
        session: SessionKey,
    ) -> Result<(Vec<u8>, PeerGuard), FabricError>;

    /// Bytes currently pinned by registrations of this fabric.
    fn pinned_bytes(&self) -> u64 {
        self.registry()
            .pinned
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes registered without a pin because the memlock limit refused one (software
    /// fabrics only; verbs cannot register unpinned memory).
    fn unpinned_bytes(&self) -> u64 {
        self.registry()
            .unpinned
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Operation and registration counters (operations this side initiated).
    fn counters(&self) -> OpCounters {
        self.registry().counters.snapshot()
    }

    /// Delivers completions that are ready, on the caller's thread, without blocking; true if
    /// it delivered any. A fabric whose completions wait in a device queue (verbs) lets a
    /// waiter that expects a quick answer poll instead of sleeping until a poller thread wakes
    /// it: two thread wake-ups fewer on the path of a small read. The software fabrics deliver
    /// from their own threads and have nothing to drive here.
    /// Returns how many it delivered, or `None` if this fabric has nothing to drive.
    fn progress(&self) -> Option<usize> {
        None
    }

    /// True if an error completion breaks the queue pair for good, as on an RC QP in verbs
    /// (every later request fails with a transport error); false if the QP goes on serving.
    fn errors_break_qp(&self) -> bool {
        false
    }
}

/// An address this host can connect to that reaches a listener bound to `bound`: loopback
/// for a wildcard bind (a listener on all interfaces is on loopback too).
pub fn reachable(bound: SocketAddr) -> SocketAddr {
    match bound.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::from(([127, 0, 0, 1], bound.port()))
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, bound.port()))
        }
        _ => bound,
    }
}

/// The fabric names `serve` and `mount` accept.
pub const FABRIC_NAMES: &[&str] = &["tcp", "verbs"];

/// Which data fabric to use, and the RDMA device for `verbs`.
#[derive(clap::Args, Debug, Clone)]
pub struct FabricArgs {
    /// Data fabric: `tcp` (software RDMA over TCP, works everywhere) or `verbs` (real RDMA
    /// through libibverbs: RoCE, InfiniBand, soft-RoCE). `serve` defaults to tcp; `mount` uses
    /// what the first server announces (tcp for the embedded server).
    #[arg(long)]
    pub fabric: Option<String>,
    /// RDMA device for the verbs fabric (e.g. rxe0, mlx5_0); default: the first active one.
    #[arg(long)]
    pub device: Option<String>,
    /// GID table index for the verbs fabric; default: a RoCE v2 GID (IPv4-mapped first).
    #[arg(long)]
    pub gid_index: Option<u32>,
}

impl FabricArgs {
    /// How to open the fabric these options name, with `--op-timeout`'s `op_timeout`.
    pub fn options(&self, op_timeout: Duration) -> FabricOptions {
        FabricOptions {
            op_timeout,
            device: self.device.clone(),
            gid_index: self.gid_index,
        }
    }
}

/// How to open a fabric by name (`--fabric`, `--device`, `--gid-index`, `--op-timeout`).
#[derive(Debug, Clone)]
pub struct FabricOptions {
    pub op_timeout: Duration,
    /// RDMA device (verbs only); `None` takes the first active one.
    pub device: Option<String>,
    /// GID index (verbs only); `None` picks a RoCE v2 GID.
    pub gid_index: Option<u32>,
}

impl Default for FabricOptions {
    fn default() -> Self {
        FabricOptions {
            op_timeout: crate::config::OP_TIMEOUT,
            device: None,
            gid_index: None,
        }
    }
}

/// Opens the fabric called `name` (`tcp` or `verbs`).
pub fn open(name: &str, options: &FabricOptions) -> Result<Arc<dyn Fabric>, FabricError> {
    match name {
        "tcp" => Ok(tcp::TcpFabric::new(tcp::TcpConfig {
            op_timeout: options.op_timeout,
            ..tcp::TcpConfig::default()
        })),
        "verbs" => open_verbs(options),
        other => Err(FabricError::Unavailable {
            fabric: "requested",
            reason: format!(
                "unknown fabric '{other}' (expected one of: {})",
                FABRIC_NAMES.join(", ")
            ),
        }),
    }
}

#[cfg(feature = "verbs")]
fn open_verbs(options: &FabricOptions) -> Result<Arc<dyn Fabric>, FabricError> {
    let fabric = verbs::VerbsFabric::open(&verbs::VerbsConfig {
        device: options.device.clone(),
        gid_index: options.gid_index,
        op_timeout: options.op_timeout,
    })?;
    Ok(fabric)
}

#[cfg(not(feature = "verbs"))]
fn open_verbs(_options: &FabricOptions) -> Result<Arc<dyn Fabric>, FabricError> {
    Err(FabricError::Unavailable {
        fabric: "verbs",
        reason: "this rmemfs was built without it: rebuild with `cargo build --release \
                 --features verbs` (needs cmake, libclang-dev and libibverbs-dev), or use \
                 --fabric tcp"
            .into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_flags_compose() {
        assert!(Access::REMOTE.contains(Access::LOCAL_WRITE));
        assert!(Access::REMOTE.contains(Access::REMOTE_READ.union(Access::REMOTE_WRITE)));
        assert!(!Access::LOCAL.contains(Access::REMOTE_READ));
    }
}
