//! Real RDMA: the fabric over libibverbs, through the `sideway` binding (built with the `verbs`
//! cargo feature). Nothing outside this directory touches verbs: [`device`] picks the device
//! and GID, [`qp`] holds the queue pairs, [`poller`] routes completions.
//!
//! - One device context per fabric; the device is named (`rxe0`) or the first one with an
//!   active port is taken. The GID is named or chosen as RoCE v2 (an
//!   IPv4-mapped address first, because RoCE v2 routes by IP).
//! - One RC queue pair per server connection. Its handshake (QP number, PSN, LID, GID, MTU)
//!   rides the existing control connection as the `Connect`/`Connected` blobs, so no rdma_cm
//!   is needed (rdma_cm cannot resolve routes over rxe on `lo`).
//! - Isolation is the device's: a server gives every client session its own protection domain
//!   (its QP and its extents live there), so a key handed to another session is refused by the
//!   NIC with a remote access error, whatever the key's value. The client side and local
//!   buffers use the fabric's own protection domain.
//! - Registrations are real `ibv_reg_mr`s, kept in the same [`Registry`] as the software
//!   fabrics under the device's lkey: the table gives the in-use counts that stop a cache from
//!   deregistering memory an operation still uses, and refuses bad local SGEs before they reach
//!   the device (with the same `LocalProtectionError` the other fabrics give).
//! - All QPs share one device CQ with a completion channel; one poller thread sleeps on the
//!   channel (no busy polling: the machines this runs on have two cores), drains the CQ and
//!   hands completions to each QP's software CQ. Work request ids carry the QP's slot and a
//!   sequence number, so the poller finds the request without a lookup table per device.
//! - A QP keeps at most [`QP_DEPTH`] requests on the device; more wait in a FIFO backlog that
//!   the poller feeds as completions come in, so `post` never fails for lack of room.
//! - As on any RC QP, an error completion moves the QP to the error state: later requests
//!   complete with transport errors (unlike the TCP fabric, which survives access errors;
//!   [`Fabric::errors_break_qp`] tells callers which rule holds).

use super::{
    Access, AlignedBuf, CompletionQueue, Exchange, Fabric, FabricError, InFlight, LocalMr, Opcode,
    PeerGuard, QueuePair, Registry, SessionKey, Token, WcStatus, WorkRequest,
};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Arc, Mutex, Weak};
use rdma_mummy_sys as sys;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionChannel};
use sideway::ibverbs::device::DeviceList;
use sideway::ibverbs::device_context::{DeviceContext, Mtu};
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, QueuePair as _, QueuePairAttribute, QueuePairState,
};
use sideway::ibverbs::AccessFlags;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod device;
mod endpoint;
mod poller;
mod qp;

use device::{choose_gid, unavailable, with_causes, DeviceMr};
use endpoint::{ack_timeout_for, Endpoint, PSN_MASK, RETRY_COUNT};
use poller::{drain, poll_loop};
pub use qp::VerbsQp;
use qp::*;

/// The port every QP uses (RoCE and rxe devices have one).
const PORT: u8 = 1;
/// Requests one QP keeps on the device; deep enough for the file system's batches (it posts
/// at most a few dozen 1 MiB requests at once), small enough that 64 QPs fit the shared CQ.
const QP_DEPTH: usize = crate::config::VERBS_QP_DEPTH;
/// Entries of the shared CQ (fewer if the device allows fewer); every request on the device
/// has one reserved, so the CQ bounds the number of QPs (slots in the top bits of a wr_id).
const CQ_DEPTH: u32 = 8192;
/// RDMA READs a QP keeps outstanding (initiator) and accepts (responder), or the device's
/// limit if lower; rxe allows 128.
const MAX_RD_ATOMIC: u8 = 16;

/// wr_id layout: QP slot in the top 16 bits, sequence number below.
const SEQ_BITS: u32 = 48;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
/// How often the poller looks at its stop flag while no completion arrives.
const POLL_TICK_MS: i32 = 100;

/// What the verbs fabric needs to know.
#[derive(Debug, Clone)]
pub struct VerbsConfig {
    /// Device name (`rxe0`, `mlx5_0`); `None` takes the first with an active port.
    pub device: Option<String>,
    /// GID table index; `None` picks a RoCE v2 GID.
    pub gid_index: Option<u32>,
    /// A request that cannot be delivered fails after about this long (it sets the QP's ACK
    /// timeout and retry count).
    pub op_timeout: Duration,
}

impl Default for VerbsConfig {
    fn default() -> Self {
        VerbsConfig {
            device: None,
            gid_index: None,
            op_timeout: crate::config::OP_TIMEOUT,
        }
    }
}

/// The verbs fabric: one device, one completion poller, a protection domain for local use and
/// one per client session served.
pub struct VerbsFabric {
    shared: Arc<Shared>,
    table: Arc<Registry>,
    poller: Mutex<Option<JoinHandle<()>>>,
    /// Server side: the QPs accepted for clients, so a test can break them all at once.
    peers: Mutex<Vec<Weak<Mutex<Option<BasicQueuePair>>>>>,
    ack_timeout: u8,
    op_timeout: Duration,
}

/// What the poller thread and every QP share.
struct Shared {
    ctx: Arc<DeviceContext>,
    /// The fabric's own protection domain: a client's QPs and local buffers.
    pd: Arc<ProtectionDomain>,
    /// Server side: each client session's protection domain, alive while its QP or one of its
    /// extents is (both hold it).
    session_pds: Mutex<HashMap<u64, Weak<ProtectionDomain>>>,
    channel: Arc<CompletionChannel>,
    cq: Arc<BasicCompletionQueue>,
    gid_index: u32,
    gid: Gid,
    lid: u16,
    mtu: Mtu,
    /// Outstanding RDMA READs per QP, within the device's limits.
    rd_atomic: u8,
    /// QPs the shared CQ has room for.
    max_qps: usize,
    /// Client QPs by slot, for routing completions.
    slots: Mutex<Vec<Option<Weak<VerbsQp>>>>,
    /// Held while draining the CQ, by the poller or by a caller in `progress`.
    drain_lock: Mutex<()>,
    /// Source of work-request sequence numbers for every QP of this fabric.
    seqs: Arc<AtomicU64>,
    stop: AtomicBool,
}

impl VerbsFabric {
    /// Opens the device and starts the completion poller.
    pub fn open(config: &VerbsConfig) -> Result<Arc<VerbsFabric>, FabricError> {
        let list = DeviceList::new().map_err(|e| {
            unavailable(format!(
                "cannot list RDMA devices ({}): libibverbs1 and ibverbs-providers must be \
                 installed and the kernel must have RDMA support (this one may not); use \
                 --fabric tcp on machines without RDMA",
                with_causes(&e)
            ))
        })?;
        if list.is_empty() {
            return Err(unavailable(
                "no RDMA device found (ibv_devices lists none): load a driver, e.g. \
                 `modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0`, or use \
                 --fabric tcp",
            ));
        }
        let (device, ctx, lid, mtu) = device::open_device(&list, config.device.as_deref())?;
        let (gid_index, gid) = choose_gid(&ctx, config.gid_index)
            .map_err(|e| unavailable(format!("{device}: {e}")))?;
        let dev = ctx
            .query_device()
            .map_err(|e| unavailable(format!("{device}: cannot query the device: {e}")))?;
        let rd_atomic = i64::from(MAX_RD_ATOMIC)
            .min(i64::from(dev.max_qp_rd_atom()))
            .min(i64::from(dev.max_qp_init_rd_atom()))
            .max(1) as u8;
        let cq_depth = CQ_DEPTH.min(dev.max_cqe().max(QP_DEPTH as i32) as u32);
        let pd = ctx.alloc_pd().map_err(|e| {
            unavailable(format!(
                "{device}: cannot allocate a protection domain: {e}"
            ))
        })?;
        let channel = ctx.create_comp_channel().map_err(|e| {
            unavailable(format!("{device}: cannot create a completion channel: {e}"))
        })?;
        channel
            .set_nonblocking(true)
            .map_err(|e| unavailable(format!("{device}: completion channel: {e}")))?;
        let cq = ctx
            .create_cq_builder()
            .setup_cqe(cq_depth)
            .setup_comp_channel(&channel, 0)
            .build()
            .map_err(|e| unavailable(format!("{device}: cannot create a completion queue: {e}")))?;
        let table = Arc::new(Registry::new());
        let shared = Arc::new(Shared {
            ctx,
            pd,
            session_pds: Mutex::new(HashMap::new()),
            channel,
            cq,
            gid_index,
            gid,
            lid,
            mtu,
            rd_atomic,
            max_qps: cq_depth as usize / QP_DEPTH,
            slots: Mutex::new(Vec::new()),
            drain_lock: Mutex::new(()),
            seqs: Arc::new(AtomicU64::new(0)),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let poller = std::thread::Builder::new()
            .name(format!("verbs-poll-{device}"))
            .spawn(move || poll_loop(&s))
            .map_err(|e| unavailable(format!("cannot start the completion poller: {e}")))?;
        log::info!(
            "verbs fabric on {device} port {PORT}, GID index {gid_index} ({gid}), MTU {mtu:?}"
        );
        Ok(Arc::new(VerbsFabric {
            shared,
            table,
            poller: Mutex::new(Some(poller)),
            peers: Mutex::new(Vec::new()),
            ack_timeout: ack_timeout_for(config.op_timeout),
            op_timeout: config.op_timeout,
        }))
    }

    /// Server side: destroys every accepted QP, as if this server had died. Clients see their
    /// requests fail with transport errors once their retries or their op timeout run out.
    pub fn shutdown_peers(&self) {
        for peer in self.peers.lock().drain(..) {
            if let Some(qp) = peer.upgrade() {
                drop(qp.lock().take());
            }
        }
    }

    /// The protection domain of client session `session` (made on first use). The device call
    /// runs outside the map's lock; of two threads racing for one session, the first to
    /// insert wins and the other's domain is dropped unused.
    fn session_pd(&self, session: u64) -> Result<Arc<ProtectionDomain>, FabricError> {
        let live =
            |pds: &HashMap<u64, Weak<ProtectionDomain>>| pds.get(&session).and_then(Weak::upgrade);
        if let Some(pd) = live(&self.shared.session_pds.lock()) {
            return Ok(pd);
        }
        let fresh = self.shared.ctx.alloc_pd().map_err(|e| {
            unavailable(format!(
                "cannot allocate a protection domain for a client session: {e}"
            ))
        })?;
        let mut pds = self.shared.session_pds.lock();
        if let Some(pd) = live(&pds) {
            return Ok(pd);
        }
        pds.retain(|_, w| w.strong_count() > 0);
        pds.insert(session, Arc::downgrade(&fresh));
        Ok(fresh)
    }

    fn register_raw(
        &self,
        pd: &Arc<ProtectionDomain>,
        addr: *mut u8,
        len: usize,
        access: Access,
        owner: Option<Arc<AlignedBuf>>,
    ) -> Result<LocalMr, FabricError> {
        super::registry::check_range(addr, len)?;
        // Local write only where the device writes (READ targets) or remote peers do (verbs
        // requires it with remote write); a WRITE source may be read-only memory.
        let mut flags = AccessFlags::none();
        if access.contains(Access::LOCAL_WRITE) || access.contains(Access::REMOTE_WRITE) {
            flags |= AccessFlags::LocalWrite;
        }
        if access.contains(Access::REMOTE_READ) {
            flags |= AccessFlags::RemoteRead;
        }
        if access.contains(Access::REMOTE_WRITE) {
            flags |= AccessFlags::RemoteWrite;
        }
        // SAFETY: the caller of `Fabric::register` guarantees the range stays valid until the
        // registration and every operation using it are gone; `register_buf` keeps its buffer
        // alive through the table entry.
        let mr = unsafe { pd.reg_mr(addr as usize, len, flags) }.map_err(|e| {
            use sideway::ibverbs::memory_region::RegisterMemoryRegionErrorKind as Kind;
            match &e.0 {
                // The pinning limit (RLIMIT_MEMLOCK) is the usual reason for ENOMEM here.
                Kind::Ibverbs(io) if io.raw_os_error() == Some(libc::ENOMEM) => {
                    FabricError::PinLimit {
                        len: len as u64,
                        limit: super::mem::memlock_limit_text(),
                    }
                }
                _ => {
                    FabricError::Register(format!("ibv_reg_mr of {len} bytes: {}", with_causes(&e)))
                }
            }
        })?;
        let (lkey, rkey) = (mr.lkey(), mr.rkey());
        let pinned = self.table.pinned.clone();
        pinned.fetch_add(len as u64, Ordering::Relaxed);
        let resource = DeviceMr {
            _mr: mr,
            len: len as u64,
            pinned,
        };
        // The table's access is what we check locally: every verbs MR can be a READ target
        // (LocalWrite is always set), but the local rule must match the other fabrics.
        Ok(self.table.insert_keyed(
            lkey,
            u64::from(rkey),
            addr as u64,
            len as u64,
            access,
            Some(Box::new(resource)),
            owner,
        ))
    }
}

impl Fabric for VerbsFabric {
    /// Verbs has no batched deregistration call; a batch still takes the registry's lock once
    /// and leaves busy regions registered (the default `deregister`).
    fn registry(&self) -> &Arc<Registry> {
        &self.table
    }

    fn name(&self) -> &'static str {
        "verbs"
    }

    /// The device issues every key: a backed server's restart registers its extents under
    /// new ones, and the resuming sessions learn them (doc/OPERATIONS.md).
    fn chooses_keys(&self) -> bool {
        false
    }

    unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<LocalMr, FabricError> {
        self.register_raw(&self.shared.pd, addr, len, access, None)
    }

    /// The extent goes into the session's protection domain: only that session's QP can
    /// reach it.
    unsafe fn register_extent(
        &self,
        addr: *mut u8,
        len: usize,
        session: u64,
    ) -> Result<LocalMr, FabricError> {
        let pd = self.session_pd(session)?;
        let mr = self.register_raw(&pd, addr, len, Access::REMOTE, None)?;
        mr.restrict_to(session);
        Ok(mr)
    }

    fn register_buf(&self, buf: Arc<AlignedBuf>, access: Access) -> Result<LocalMr, FabricError> {
        let (ptr, len) = (buf.as_ptr(), buf.len());
        self.register_raw(&self.shared.pd, ptr, len, access, Some(buf))
    }

    fn connect(
        &self,
        server: SocketAddr,
        exchange: &mut Exchange<'_>,
        cq: Arc<CompletionQueue>,
        _token: &Token,
    ) -> Result<Arc<dyn QueuePair>, FabricError> {
        let mut qp = self.create_qp(&self.shared.pd, true)?;
        let psn = random_psn();
        let reply = exchange(self.endpoint(&qp, psn).encode())?;
        let handshake = |reason: String| FabricError::Handshake {
            addr: server,
            reason,
        };
        let remote = Endpoint::decode(&reply).map_err(handshake)?;
        self.connect_qp(&mut qp, psn, &remote).map_err(handshake)?;
        let mut slots = self.shared.slots.lock();
        let index = match slots
            .iter()
            .position(|s| s.as_ref().is_none_or(|w| w.strong_count() == 0))
        {
            Some(i) => i,
            None if slots.len() < self.shared.max_qps => {
                slots.push(None);
                slots.len() - 1
            }
            None => {
                return Err(unavailable(format!(
                    "too many queue pairs ({}) on one fabric",
                    self.shared.max_qps
                )))
            }
        };
        let qp = Arc::new(VerbsQp {
            slot: index as u64,
            op_timeout: self.op_timeout,
            table: self.table.clone(),
            cq,
            connected: AtomicBool::new(true),
            state: Mutex::new(QpState {
                qp,
                seqs: self.shared.seqs.clone(),
                on_device: VecDeque::new(),
                backlog: VecDeque::new(),
                broken: false,
                last_progress: Instant::now(),
            }),
        });
        slots[index] = Some(Arc::downgrade(&qp));
        Ok(qp)
    }

    /// The QP is reachable only through this handshake, which rides the authenticated control
    /// session, and lives in that session's protection domain with its extents.
    fn accept(
        &self,
        blob: &[u8],
        _listen: SocketAddr,
        session: SessionKey,
    ) -> Result<(Vec<u8>, PeerGuard), FabricError> {
        let bad = |reason: String| FabricError::Handshake {
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            reason,
        };
        let remote = Endpoint::decode(blob).map_err(bad)?;
        let pd = self.session_pd(session.id)?;
        // A follower's QP lives in the volume's domain but lets its peer only READ: the
        // device enforces it (IBV_ACCESS_REMOTE_WRITE left out of the QP's access flags).
        let mut qp = self.create_qp(&pd, !session.read_only)?;
        let psn = random_psn();
        self.connect_qp(&mut qp, psn, &remote).map_err(bad)?;
        let reply = self.endpoint(&qp, psn).encode();
        let qp = Arc::new(Mutex::new(Some(qp)));
        let mut peers = self.peers.lock();
        peers.retain(|w| w.strong_count() > 0);
        peers.push(Arc::downgrade(&qp));
        Ok((reply, Box::new(qp)))
    }

    fn errors_break_qp(&self) -> bool {
        true
    }

    fn progress(&self) -> Option<usize> {
        // Whoever holds the lock is draining already; the caller will see its completions.
        Some(match self.shared.drain_lock.try_lock() {
            Some(_guard) => drain(&self.shared),
            None => 0,
        })
    }
}

impl Drop for VerbsFabric {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.poller.lock().take() {
            let _ = t.join();
        }
    }
}
