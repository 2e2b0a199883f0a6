//! Real RDMA: the fabric over libibverbs, through the `sideway` binding (built with the `verbs`
//! cargo feature). This is the only file that touches verbs.
//!
//! - One device context and protection domain per fabric; the device is named (`rxe0`) or the
//!   first one with an active port is taken. The GID is named or chosen as RoCE v2 (an
//!   IPv4-mapped address first, because RoCE v2 routes by IP).
//! - One RC queue pair per server connection. Its handshake (QP number, PSN, LID, GID, MTU)
//!   rides the existing control connection as the `Connect`/`Connected` blobs, so no rdma_cm
//!   is needed (rdma_cm cannot resolve routes over rxe on `lo`).
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
    Access, AlignedBuf, CompletionQueue, DeregisterError, Exchange, Fabric, FabricError, InFlight,
    LocalMr, OpCounters, Opcode, PeerGuard, QueuePair, Registry, WcStatus, WorkRequest,
};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Arc, Mutex, Weak};
use rdma_mummy_sys as sys;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid, GidType};
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionChannel};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, Mtu, PortState};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, QueuePair as _, QueuePairAttribute, QueuePairState,
};
use sideway::ibverbs::AccessFlags;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
const PSN_MASK: u32 = 0x00ff_ffff;
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

/// The verbs fabric: one device, one protection domain, one completion poller.
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
    pd: Arc<ProtectionDomain>,
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

/// An error and its causes, `outer: inner: ...` (sideway's errors keep the errno in a cause).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

fn unavailable(reason: impl Into<String>) -> FabricError {
    FabricError::Unavailable {
        fabric: "verbs",
        reason: reason.into(),
    }
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
        let mut names = Vec::new();
        let mut chosen = None;
        for dev in list.iter() {
            let name = dev.name();
            names.push(name.clone());
            let wanted = match &config.device {
                Some(want) => *want == name,
                None => true,
            };
            if !wanted {
                continue;
            }
            let ctx = match dev.open() {
                Ok(ctx) => ctx,
                Err(e) if config.device.is_some() => {
                    return Err(unavailable(format!(
                        "cannot open {name}: {}",
                        with_causes(&e)
                    )))
                }
                Err(_) => continue,
            };
            let port = match ctx.query_port(PORT) {
                Ok(p) => p,
                Err(e) => return Err(unavailable(format!("cannot query {name} port 1: {e}"))),
            };
            if port.port_state() != PortState::Active {
                if config.device.is_some() {
                    return Err(unavailable(format!(
                        "{name} port 1 is not active ({:?})",
                        port.port_state()
                    )));
                }
                continue;
            }
            chosen = Some((name, ctx, port.lid(), port.active_mtu()));
            break;
        }
        let Some((device, ctx, lid, mtu)) = chosen else {
            return Err(unavailable(match &config.device {
                Some(d) => format!("no RDMA device named {d} (found: {})", names.join(", ")),
                None => format!(
                    "no RDMA device has an active port (found: {})",
                    names.join(", ")
                ),
            }));
        };
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
            pd,
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

    fn create_qp(&self) -> Result<BasicQueuePair, FabricError> {
        let mut builder = self.shared.pd.create_qp_builder();
        builder
            .setup_max_send_wr(QP_DEPTH as u32)
            // No receives are ever posted: the data path is one-sided.
            .setup_max_recv_wr(1)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .setup_send_cq(self.shared.cq.clone())
            .setup_recv_cq(self.shared.cq.clone());
        let mut qp = builder
            .build()
            .map_err(|e| unavailable(format!("cannot create a queue pair: {e}")))?;
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(PORT)
            .setup_access_flags(
                AccessFlags::LocalWrite | AccessFlags::RemoteRead | AccessFlags::RemoteWrite,
            );
        qp.modify(&attr)
            .map_err(|e| unavailable(format!("cannot move a queue pair to INIT: {e}")))?;
        Ok(qp)
    }

    fn endpoint(&self, qp: &BasicQueuePair, psn: u32) -> Endpoint {
        Endpoint {
            qpn: qp.qp_number(),
            psn,
            lid: self.shared.lid,
            mtu: self.shared.mtu as u8,
            gid: self.shared.gid.raw,
        }
    }

    /// INIT → RTR → RTS towards `remote`.
    fn connect_qp(
        &self,
        qp: &mut BasicQueuePair,
        local_psn: u32,
        remote: &Endpoint,
    ) -> Result<(), String> {
        let mtu = Mtu::from((self.shared.mtu as u32).min(remote.mtu as u32));
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(mtu)
            .setup_dest_qp_num(remote.qpn)
            .setup_rq_psn(remote.psn)
            .setup_max_dest_read_atomic(self.shared.rd_atomic)
            .setup_min_rnr_timer(12);
        let mut ah = AddressHandleAttribute::new();
        ah.setup_dest_lid(remote.lid)
            .setup_port(PORT)
            .setup_service_level(0)
            .setup_grh_src_gid_index(self.shared.gid_index as u8)
            .setup_grh_dest_gid(&Gid { raw: remote.gid })
            .setup_grh_hop_limit(64);
        attr.setup_address_vector(&ah);
        qp.modify(&attr).map_err(|e| format!("RTR: {e}"))?;
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(local_psn)
            .setup_timeout(self.ack_timeout)
            .setup_retry_cnt(RETRY_COUNT)
            .setup_rnr_retry(RETRY_COUNT)
            .setup_max_read_atomic(self.shared.rd_atomic);
        qp.modify(&attr).map_err(|e| format!("RTS: {e}"))
    }

    fn register_raw(
        &self,
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
        let mr = unsafe { self.shared.pd.reg_mr(addr as usize, len, flags) }.map_err(|e| {
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
            rkey,
            addr as u64,
            len as u64,
            access,
            Some(Box::new(resource)),
            owner,
        ))
    }
}

/// ACK retries before a request fails with a transport error (the verbs maximum).
const RETRY_COUNT: u8 = 7;

/// The QP's local ACK timeout exponent (4.096 µs × 2^t) so that all retries together take
/// about `op_timeout`.
fn ack_timeout_for(op_timeout: Duration) -> u8 {
    let per_try_us = op_timeout.as_micros() as f64 / f64::from(RETRY_COUNT + 1);
    let t = (per_try_us / 4.096).max(1.0).log2().floor() as i64;
    // 14 (67 ms) keeps rxe under TCG, where one 1 MiB transfer takes 30 ms, from retrying
    // spuriously; 24 (69 s) is far beyond any timeout anyone sets.
    t.clamp(14, 24) as u8
}

/// A device registration; deregisters (`ibv_dereg_mr`) when the last holder lets go.
struct DeviceMr {
    _mr: Arc<MemoryRegion>,
    len: u64,
    pinned: Arc<AtomicU64>,
}

impl Drop for DeviceMr {
    fn drop(&mut self) {
        self.pinned.fetch_sub(self.len, Ordering::Relaxed);
    }
}

/// The data-path address of one side of a QP, as exchanged in the `Connect` blobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Endpoint {
    qpn: u32,
    psn: u32,
    lid: u16,
    mtu: u8,
    gid: [u8; 16],
}

const BLOB_MAGIC: &[u8; 4] = b"RMVB";
const BLOB_VERSION: u8 = 1;
const BLOB_LEN: usize = 4 + 1 + 1 + 2 + 4 + 4 + 16;

impl Endpoint {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(BLOB_LEN);
        v.extend_from_slice(BLOB_MAGIC);
        v.push(BLOB_VERSION);
        v.push(self.mtu);
        v.extend_from_slice(&self.lid.to_le_bytes());
        v.extend_from_slice(&self.qpn.to_le_bytes());
        v.extend_from_slice(&self.psn.to_le_bytes());
        v.extend_from_slice(&self.gid);
        v
    }

    fn decode(b: &[u8]) -> Result<Endpoint, String> {
        if b.len() != BLOB_LEN || &b[..4] != BLOB_MAGIC {
            return Err(format!(
                "not a verbs endpoint ({} bytes; is the peer on another fabric?)",
                b.len()
            ));
        }
        if b[4] != BLOB_VERSION {
            return Err(format!(
                "verbs endpoint version {} (expected {BLOB_VERSION})",
                b[4]
            ));
        }
        let mtu = b[5];
        if !(1..=5).contains(&mtu) {
            return Err(format!("invalid path MTU code {mtu}"));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let mut gid = [0; 16];
        gid.copy_from_slice(&b[16..32]);
        Ok(Endpoint {
            mtu,
            lid: u16::from_le_bytes([b[6], b[7]]),
            qpn: u32_at(8) & PSN_MASK,
            psn: u32_at(12) & PSN_MASK,
            gid,
        })
    }
}

/// A random 24-bit starting PSN (stale packets of an earlier QP must not fit in).
fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom writes at most `b.len()` bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, b.len(), 0) };
    if n != b.len() as isize {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(1);
        return t & PSN_MASK;
    }
    u32::from_le_bytes(b) & PSN_MASK
}

/// Index of the GID to use: the named one, else an IPv4-mapped RoCE v2 GID, else any
/// non-zero RoCE v2 GID, else any non-zero GID (InfiniBand).
fn choose_gid(ctx: &Arc<DeviceContext>, wanted: Option<u32>) -> Result<(u32, Gid), String> {
    if let Some(i) = wanted {
        let gid = ctx
            .query_gid(PORT, i)
            .map_err(|e| format!("cannot read GID index {i}: {e}"))?;
        if gid.is_zero() {
            return Err(format!("GID index {i} is empty"));
        }
        return Ok((i, gid));
    }
    let table = ctx
        .query_gid_table()
        .map_err(|e| format!("cannot read the GID table: {e}"))?;
    let usable: Vec<_> = table
        .iter()
        .filter(|e| e.port_num() == u32::from(PORT) && !e.gid().is_zero())
        .collect();
    let v4_mapped = |g: &Gid| g.raw[..10].iter().all(|&b| b == 0) && g.raw[10..12] == [0xff; 2];
    let pick = usable
        .iter()
        .find(|e| e.gid_type() == GidType::RoceV2 && v4_mapped(&e.gid()))
        .or_else(|| usable.iter().find(|e| e.gid_type() == GidType::RoceV2))
        .or_else(|| usable.first())
        .ok_or("no usable GID on port 1 (does its network interface have an address?)")?;
    Ok((pick.gid_index(), pick.gid()))
}

impl Fabric for VerbsFabric {
    fn name(&self) -> &'static str {
        "verbs"
    }

    unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<LocalMr, FabricError> {
        self.register_raw(addr, len, access, None)
    }

    fn register_buf(&self, buf: Arc<AlignedBuf>, access: Access) -> Result<LocalMr, FabricError> {
        let (ptr, len) = (buf.as_ptr(), buf.len());
        self.register_raw(ptr, len, access, Some(buf))
    }

    fn deregister(&self, mrs: Vec<LocalMr>) -> Result<(), DeregisterError> {
        // Verbs has no batched deregistration call; the batch still takes the table lock once
        // and leaves busy regions registered.
        self.table.deregister_batch(mrs)
    }

    fn connect(
        &self,
        server: SocketAddr,
        exchange: &mut Exchange<'_>,
        cq: Arc<CompletionQueue>,
    ) -> Result<Arc<dyn QueuePair>, FabricError> {
        let mut qp = self.create_qp()?;
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

    fn accept(&self, blob: &[u8], _local: SocketAddr) -> Result<(Vec<u8>, PeerGuard), FabricError> {
        let bad = |reason: String| FabricError::Handshake {
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            reason,
        };
        let remote = Endpoint::decode(blob).map_err(bad)?;
        let mut qp = self.create_qp()?;
        let psn = random_psn();
        self.connect_qp(&mut qp, psn, &remote).map_err(bad)?;
        let reply = self.endpoint(&qp, psn).encode();
        let qp = Arc::new(Mutex::new(Some(qp)));
        let mut peers = self.peers.lock();
        peers.retain(|w| w.strong_count() > 0);
        peers.push(Arc::downgrade(&qp));
        Ok((reply, Box::new(qp)))
    }

    fn pinned_bytes(&self) -> u64 {
        self.table.pinned.load(Ordering::Relaxed)
    }

    fn counters(&self) -> OpCounters {
        self.table.counters.snapshot()
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

/// A request the QP owns until its completion: the request and its hold on the local region.
struct Pending {
    wr: WorkRequest,
    hold: InFlight,
    seq: u64,
}

struct QpState {
    qp: BasicQueuePair,
    /// Sequence numbers come from one fabric-wide counter, not per QP: a slot is reused once
    /// its QP is gone, and a stale completion of the old QP must never match a request of the
    /// new one.
    seqs: Arc<AtomicU64>,
    /// Posted to the device, in posting order (RC completes in that order).
    on_device: VecDeque<Pending>,
    /// Waiting for room on the device.
    backlog: VecDeque<Pending>,
    /// An error completion moved the QP to the error state, or it was disconnected.
    broken: bool,
    /// When a request last completed, or was posted to an idle device queue.
    last_progress: Instant,
}

/// A client QP.
pub struct VerbsQp {
    slot: u64,
    op_timeout: Duration,
    table: Arc<Registry>,
    cq: Arc<CompletionQueue>,
    connected: AtomicBool,
    state: Mutex<QpState>,
}

impl QpState {
    /// Moves backlog requests onto the device while there is room. Requests the device
    /// refuses, and every request once the QP is broken and drained, come back as failed.
    fn pump(&mut self, slot: u64, failed: &mut Vec<Pending>) {
        if self.broken {
            if self.on_device.is_empty() {
                failed.extend(self.backlog.drain(..));
            }
            return;
        }
        let n = self
            .backlog
            .len()
            .min(QP_DEPTH.saturating_sub(self.on_device.len()));
        if n == 0 {
            return;
        }
        let mut sges: Vec<sys::ibv_sge> = Vec::with_capacity(n);
        let mut wrs: Vec<sys::ibv_send_wr> = (0..n)
            // SAFETY: ibv_send_wr is a plain C struct for which all-zero is a valid value.
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        let first_seq = self.seqs.fetch_add(n as u64, Ordering::Relaxed);
        for (i, p) in self.backlog.iter_mut().take(n).enumerate() {
            p.seq = (first_seq + i as u64) & SEQ_MASK;
            sges.push(sys::ibv_sge {
                addr: p.wr.local.addr,
                // MAX_OP_LEN (checked in `post`) fits in 32 bits.
                length: p.wr.local.len as u32,
                lkey: p.wr.local.lkey,
            });
        }
        let sge_base = sges.as_mut_ptr();
        for (i, p) in self.backlog.iter().take(n).enumerate() {
            let wr = &mut wrs[i];
            wr.wr_id = (slot << SEQ_BITS) | p.seq;
            wr.opcode = match p.wr.opcode {
                Opcode::Read => sys::ibv_wr_opcode::IBV_WR_RDMA_READ,
                Opcode::Write => sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            };
            wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
            wr.wr.rdma = sys::rdma_t {
                remote_addr: p.wr.remote_addr,
                rkey: p.wr.rkey,
            };
            if p.wr.local.len > 0 {
                // SAFETY: `i < n == sges.len()`; `sges` is not touched again before the post.
                wr.sg_list = unsafe { sge_base.add(i) };
                wr.num_sge = 1;
            }
        }
        let base = wrs.as_mut_ptr();
        for i in 1..n {
            // SAFETY: `i < n`, inside the vector, which is not touched except through `base`
            // from here until the post returns.
            unsafe { (*base.add(i - 1)).next = base.add(i) };
        }
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is live (owned by `self`); the WR list and its SGEs live in `wrs` and
        // `sges` until the call returns (the provider copies them); every SGE names a region
        // held in use by its `Pending` until the completion is reaped.
        let rc = unsafe { sys::ibv_post_send(self.qp.qp().as_ptr(), base, &mut bad) };
        let posted = if rc == 0 {
            n
        } else {
            // Requests before `bad` were posted; it and the rest were not.
            let k = if bad.is_null() {
                0
            } else {
                // SAFETY: the provider sets `bad` to an element of the list it was given.
                (unsafe { bad.offset_from(base) }).clamp(0, n as isize) as usize
            };
            log::warn!(
                "ibv_post_send failed ({}); {} of {n} requests not posted",
                std::io::Error::from_raw_os_error(rc),
                n - k
            );
            self.broken = true;
            k
        };
        if self.on_device.is_empty() {
            self.last_progress = Instant::now();
        }
        self.on_device.extend(self.backlog.drain(..posted));
        if self.broken {
            self.move_to_error();
            if self.on_device.is_empty() {
                failed.extend(self.backlog.drain(..));
            }
        }
    }

    /// Moves the QP to the error state: the device flushes what it holds, with completions.
    fn move_to_error(&mut self) {
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Error);
        if let Err(e) = self.qp.modify(&attr) {
            log::warn!("cannot move a queue pair to the error state: {e}");
        }
    }
}

impl VerbsQp {
    /// Delivers failed requests as transport errors.
    fn fail(&self, failed: Vec<Pending>) {
        for p in failed {
            self.finish(p, WcStatus::TransportError);
        }
    }

    fn finish(&self, p: Pending, status: WcStatus) {
        self.table.complete(&self.cq, &p.wr, status, Some(p.hold));
    }

    /// The poller's entry: the device completed request `seq`.
    fn complete(&self, seq: u64, status: u32) {
        let mut failed = Vec::new();
        let done = {
            let mut st = self.state.lock();
            let pos = st.on_device.iter().position(|p| p.seq == seq);
            let Some(pos) = pos else {
                log::warn!("completion for an unknown request {seq} (status {status})");
                return;
            };
            let p = st.on_device.remove(pos).expect("position is in range");
            st.last_progress = Instant::now();
            let status = map_status(status);
            if status != WcStatus::Success && !st.broken {
                // RC: the device has moved the QP to the error state and flushes the rest.
                st.broken = true;
                self.connected.store(false, Ordering::Release);
            }
            st.pump(self.slot, &mut failed);
            (p, status)
        };
        self.finish(done.0, done.1);
        self.fail(failed);
    }
}

/// The fabric's status for a raw `ibv_wc_status`.
fn map_status(status: u32) -> WcStatus {
    use sys::ibv_wc_status as s;
    match status {
        s::IBV_WC_SUCCESS => WcStatus::Success,
        s::IBV_WC_REM_ACCESS_ERR | s::IBV_WC_REM_INV_REQ_ERR => WcStatus::RemoteAccessError,
        s::IBV_WC_LOC_PROT_ERR | s::IBV_WC_LOC_LEN_ERR | s::IBV_WC_LOC_ACCESS_ERR => {
            WcStatus::LocalProtectionError
        }
        _ => WcStatus::TransportError,
    }
}

impl VerbsQp {
    /// The poller's periodic check. A request with no progress for the op timeout breaks the
    /// QP (the device then flushes everything with errors): the transport's own retry timer is
    /// the first line, but rxe's has been seen never to fire when the peer QP vanished. If even
    /// the flush does not come within another op timeout, the requests are failed here; the QP
    /// is in the error state by then, so the device no longer touches their memory.
    fn watchdog(&self) {
        let mut failed = Vec::new();
        {
            let mut st = self.state.lock();
            if st.on_device.is_empty() || st.last_progress.elapsed() < self.op_timeout {
                return;
            }
            if !st.broken {
                log::warn!(
                    "no completion for {:?} with {} requests on the device: failing the queue pair",
                    self.op_timeout,
                    st.on_device.len()
                );
                st.broken = true;
                st.last_progress = Instant::now();
                st.move_to_error();
            } else if st.qp.state() != QueuePairState::Error {
                // The move to the error state failed: the device may still own the requests,
                // so their memory stays held. Try again on the next tick.
                st.last_progress = Instant::now();
                st.move_to_error();
            } else {
                log::warn!(
                    "the device never flushed {} requests; failing them",
                    st.on_device.len()
                );
                failed.extend(st.on_device.drain(..));
                st.pump(self.slot, &mut failed);
            }
        }
        self.connected.store(false, Ordering::Release);
        self.fail(failed);
    }
}

impl QueuePair for VerbsQp {
    fn post(&self, wrs: &[WorkRequest]) {
        // The local check (and the completion of a refused request) happens before the QP's
        // lock is taken: no completion is delivered while holding it.
        let admitted: Vec<Pending> = wrs
            .iter()
            .filter_map(|wr| {
                self.table.admit(&self.cq, wr).map(|hold| Pending {
                    wr: *wr,
                    hold,
                    seq: 0,
                })
            })
            .collect();
        let mut failed = Vec::new();
        {
            let mut st = self.state.lock();
            st.backlog.extend(admitted);
            st.pump(self.slot, &mut failed);
        }
        if !failed.is_empty() {
            self.connected.store(false, Ordering::Release);
        }
        self.fail(failed);
    }

    fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    fn disconnect(&self) {
        self.connected.store(false, Ordering::Release);
        let mut failed = Vec::new();
        {
            let mut st = self.state.lock();
            if !st.broken {
                st.broken = true;
                st.move_to_error();
            }
            st.pump(self.slot, &mut failed);
        }
        self.fail(failed);
    }
}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        // Requests still on the device die with the QP (ibv_destroy_qp, in BasicQueuePair's
        // drop, stops the device touching their memory before their holds are released).
        let st = self.state.get_mut().unwrap();
        if !st.on_device.is_empty() {
            log::debug!(
                "queue pair dropped with {} requests on the device",
                st.on_device.len()
            );
        }
    }
}

/// The completion poller: sleeps on the completion channel, drains the shared CQ, and routes
/// each completion to its QP.
fn poll_loop(shared: &Shared) {
    // SAFETY: the raw CQ pointer is only used while `shared`, which owns the CQ, is alive.
    let cq_ptr = unsafe { sideway::ibverbs::completion::CompletionQueue::cq(&*shared.cq) };
    let mut last_watch = Instant::now();
    let drain_locked = || {
        // A panicking handler must not stop the poller for good: the lock guards no data.
        let _guard = shared.drain_lock.lock().unwrap_or_else(|e| e.into_inner());
        drain(shared)
    };
    while !shared.stop.load(Ordering::Acquire) {
        if last_watch.elapsed() >= Duration::from_millis(POLL_TICK_MS as u64) {
            last_watch = Instant::now();
            let slots = shared.slots.lock().clone();
            for qp in slots.iter().flatten().filter_map(Weak::upgrade) {
                qp.watchdog();
            }
        }
        drain_locked();
        // SAFETY: the CQ is live; arming it asks for one event on the next completion.
        let rc = unsafe { sys::ibv_req_notify_cq(cq_ptr.as_ptr(), 0) };
        if rc != 0 {
            log::warn!(
                "ibv_req_notify_cq failed ({}); polling every {POLL_TICK_MS} ms",
                std::io::Error::from_raw_os_error(rc)
            );
        }
        // A completion may have arrived between the drain and the arming.
        if drain_locked() > 0 {
            continue;
        }
        let mut pfd = libc::pollfd {
            fd: shared.channel.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, POLL_TICK_MS) };
        if n > 0 {
            let mut ev_cq: *mut sys::ibv_cq = std::ptr::null_mut();
            let mut ev_ctx: *mut libc::c_void = std::ptr::null_mut();
            // SAFETY: the channel is live and non-blocking; out-pointers are valid.
            let rc = unsafe {
                sys::ibv_get_cq_event(
                    shared.channel.comp_channel().as_ptr(),
                    &mut ev_cq,
                    &mut ev_ctx,
                )
            };
            if rc == 0 && !ev_cq.is_null() {
                // SAFETY: acknowledging the one event just received on this CQ.
                unsafe { sys::ibv_ack_cq_events(ev_cq, 1) };
            }
        }
    }
}

/// Polls the shared CQ dry and delivers; returns how many completions it handled. Callers hold
/// `drain_lock`, so completions of one QP are delivered in order.
fn drain(shared: &Shared) -> usize {
    /// Completions taken from the device per `ibv_poll_cq`.
    const ROUND: usize = 32;
    // SAFETY: the raw CQ pointer is only used while `shared`, which owns the CQ, is alive.
    let cq = unsafe { sideway::ibverbs::completion::CompletionQueue::cq(&*shared.cq) };
    // SAFETY: ibv_wc is a plain C struct for which all-zero is a valid value.
    let mut wcs: [sys::ibv_wc; ROUND] = unsafe { std::mem::zeroed() };
    let mut total = 0;
    loop {
        // Polled straight into a stack array: this runs in the small-batch spin loop, so it
        // allocates nothing.
        // SAFETY: the CQ is live and `wcs` has room for ROUND entries.
        let n = unsafe { sys::ibv_poll_cq(cq.as_ptr(), ROUND as i32, wcs.as_mut_ptr()) };
        if n < 0 {
            log::error!(
                "polling the completion queue failed: {}",
                std::io::Error::from_raw_os_error(-n)
            );
        }
        if n <= 0 {
            return total;
        }
        let polled = &wcs[..n as usize];
        total += polled.len();
        let slots = shared.slots.lock().clone();
        for wc in polled {
            let slot = (wc.wr_id >> SEQ_BITS) as usize;
            match slots
                .get(slot)
                .and_then(|s| s.as_ref())
                .and_then(Weak::upgrade)
            {
                Some(qp) => qp.complete(wc.wr_id & SEQ_MASK, wc.status),
                None => log::debug!("completion for a closed queue pair (slot {slot})"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_blob_round_trips_and_rejects_junk() {
        let e = Endpoint {
            qpn: 0x12_3456,
            psn: 0xab_cdef,
            lid: 7,
            mtu: 3,
            gid: [9; 16],
        };
        assert_eq!(Endpoint::decode(&e.encode()).unwrap(), e);
        assert!(Endpoint::decode(&[]).is_err());
        assert!(Endpoint::decode(&[0u8; 2]).is_err());
        let mut bad = e.encode();
        bad[4] = 99;
        assert!(Endpoint::decode(&bad).is_err());
        let mut bad = e.encode();
        bad[5] = 0;
        assert!(Endpoint::decode(&bad).is_err());
    }

    #[test]
    fn ack_timeout_tracks_the_op_timeout() {
        // 4.096 µs × 2^t × 8 tries ≈ the op timeout, within a factor of two.
        for secs in [1u64, 3, 10, 60] {
            let t = ack_timeout_for(Duration::from_secs(secs));
            let total = 4.096e-6 * f64::from(1u32 << t) * f64::from(RETRY_COUNT + 1);
            assert!(
                total <= secs as f64 && total * 2.0 > secs as f64,
                "{secs}s: t={t}"
            );
        }
        assert_eq!(ack_timeout_for(Duration::from_millis(1)), 14);
    }
}
