//! Software RDMA over TCP: the fabric for machines without an RDMA NIC.
//!
//! It keeps RDMA's semantics so that everything above it (and its cost model) is the same as on
//! verbs: registrations pin memory (`mlock`) and live in a key table; a server's "NIC" threads
//! execute READ and WRITE directly against registered memory after checking rkey, bounds and
//! access, without the server's control logic; completions are reaped from a queue.
//!
//! Data path, per queue pair: one TCP connection, a sender thread and a receiver thread on the
//! client, one NIC thread on the server. Requests are a 32-byte header, followed for WRITE by the
//! payload sent with `sendmsg` straight from the registered buffer; READ payloads are received
//! with `recv` straight into it, and on the server straight into and out of the arena. Many
//! requests are in flight per connection (the server answers in order). Nothing is allocated per
//! operation on the hot path. A connection that fails or makes no progress for `op_timeout`
//! completes everything outstanding with [`WcStatus::TransportError`].

use super::mem::{recv_exact_raw, send_all_raw, AlignedBuf, InFlight, KeyTable, RawSlice};
use super::{
    Access, CompletionQueue, DeregisterError, Exchange, Fabric, FabricError, LocalMr, OpCounters,
    Opcode, PeerGuard, QueuePair, SoftCq, WcStatus, WorkRequest, MAX_OP_LEN,
};
use crate::fabric::Completion;
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Arc, Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::thread;
use std::time::{Duration, Instant};

/// First bytes of a data connection, so a control client or a stray peer is told apart.
const DATA_MAGIC: [u8; 8] = *b"RMFSDAT1";
const REQ_HEADER: usize = 32;
const RESP_HEADER: usize = 24;
const OP_READ: u8 = 1;
const OP_WRITE: u8 = 2;

/// How often a blocked socket call wakes up to check for timeouts and shutdown.
const TICK: Duration = Duration::from_millis(200);

/// Posted requests buffered ahead of the sender thread before `post` applies back-pressure
/// (verbs QPs have a send queue depth of the same order).
const SEND_QUEUE_DEPTH: usize = crate::config::TCP_SEND_QUEUE_DEPTH;

/// NIC threads only need a little stack: a header and a drain buffer.
const NIC_STACK: usize = 256 * 1024;

/// Tunables of the TCP fabric.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    /// An operation that sees no progress on its connection for this long fails with a
    /// transport error (a dead or frozen peer never hangs a waiter).
    pub op_timeout: Duration,
    pub connect_timeout: Duration,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            op_timeout: crate::config::OP_TIMEOUT,
            connect_timeout: Duration::from_secs(5),
        }
    }
}

/// The TCP software fabric (client and server roles share one instance per process).
pub struct TcpFabric {
    table: Arc<KeyTable>,
    config: TcpConfig,
    nic: Mutex<Option<Nic>>,
}

struct Nic {
    /// Where the NIC's listener is bound (the server's listen address with port 0).
    bound: SocketAddr,
    shared: Arc<NicShared>,
}

struct NicShared {
    table: Arc<KeyTable>,
    op_timeout: Duration,
    stop: AtomicBool,
    /// Live data connections, so a shutdown (or a test "killing" the server) can cut them.
    conns: Mutex<HashMap<u64, TcpStream>>,
    next_conn: AtomicU64,
}

impl TcpFabric {
    pub fn new(config: TcpConfig) -> Arc<TcpFabric> {
        Arc::new(TcpFabric {
            table: Arc::new(KeyTable::new()),
            config,
            nic: Mutex::new(None),
        })
    }

    /// Stops serving data: closes the NIC listener and every data connection, as if the
    /// server's NIC went dark. Clients see transport errors.
    pub fn shutdown_nic(&self) {
        if let Some(nic) = self.nic.lock().take() {
            nic.shared.stop.store(true, Ordering::SeqCst);
            for (_, c) in nic.shared.conns.lock().drain() {
                let _ = c.shutdown(Shutdown::Both);
            }
            // Wake the accept loop so it sees `stop`.
            let _ = TcpStream::connect_timeout(
                &super::reachable(nic.bound),
                Duration::from_millis(200),
            );
        }
    }

    /// The NIC's data port, starting the NIC on first use. It listens on the same address as
    /// the server's control listener (`listen`), so a wildcard listen serves every interface
    /// and every client that reached the control port can reach the data port.
    fn nic_port(&self, listen: SocketAddr) -> Result<u16, FabricError> {
        let mut nic = self.nic.lock();
        if let Some(n) = nic.as_ref() {
            return Ok(n.bound.port());
        }
        let listener = TcpListener::bind(SocketAddr::new(listen.ip(), 0)).map_err(|e| {
            FabricError::Connect {
                addr: listen,
                source: e,
            }
        })?;
        let bound = listener.local_addr().map_err(|e| FabricError::Connect {
            addr: listen,
            source: e,
        })?;
        let port = bound.port();
        let shared = Arc::new(NicShared {
            table: self.table.clone(),
            op_timeout: self.config.op_timeout,
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
        });
        let s = shared.clone();
        thread::Builder::new()
            .name("nic-accept".into())
            .spawn(move || nic_accept_loop(listener, s))
            .map_err(|e| FabricError::Register(format!("spawn NIC thread: {e}")))?;
        *nic = Some(Nic { bound, shared });
        Ok(port)
    }
}

impl Fabric for TcpFabric {
    fn name(&self) -> &'static str {
        "tcp"
    }

    unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<LocalMr, FabricError> {
        // SAFETY: forwarded contract.
        unsafe { self.table.register(addr, len, access, None) }
    }

    fn register_buf(&self, buf: Arc<AlignedBuf>, access: Access) -> Result<LocalMr, FabricError> {
        self.table.clone().register_owned(buf, access)
    }

    fn deregister(&self, mrs: Vec<LocalMr>) -> Result<(), DeregisterError> {
        self.table.deregister_batch(mrs)
    }

    fn connect(
        &self,
        server: SocketAddr,
        exchange: &mut Exchange<'_>,
        cq: Arc<dyn CompletionQueue>,
    ) -> Result<Arc<dyn QueuePair>, FabricError> {
        let cq = SoftCq::downcast(cq)?;
        let reply = exchange(Vec::new())?;
        let port = match reply.as_slice() {
            [a, b] => u16::from_le_bytes([*a, *b]),
            _ => {
                return Err(FabricError::Handshake {
                    addr: server,
                    reason: format!("expected a 2-byte data port, got {} bytes", reply.len()),
                })
            }
        };
        let data_addr = SocketAddr::new(server.ip(), port);
        let mut stream = TcpStream::connect_timeout(&data_addr, self.config.connect_timeout)
            .map_err(|e| FabricError::Connect {
                addr: data_addr,
                source: e,
            })?;
        let setup = |s: &mut TcpStream| -> io::Result<()> {
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(TICK))?;
            s.set_write_timeout(Some(TICK))?;
            s.write_all(&DATA_MAGIC)
        };
        setup(&mut stream).map_err(|e| FabricError::Handshake {
            addr: data_addr,
            reason: e.to_string(),
        })?;
        TcpQp::start(stream, self.table.clone(), cq, self.config.op_timeout)
            .map(|qp| qp as Arc<dyn QueuePair>)
    }

    fn accept(
        &self,
        _blob: &[u8],
        listen: SocketAddr,
    ) -> Result<(Vec<u8>, PeerGuard), FabricError> {
        let port = self.nic_port(listen)?;
        Ok((port.to_le_bytes().to_vec(), Box::new(())))
    }

    fn counters(&self) -> OpCounters {
        self.table.counters.snapshot()
    }

    fn pinned_bytes(&self) -> u64 {
        self.table.pinned.load(Ordering::Relaxed)
    }
}

impl Drop for TcpFabric {
    fn drop(&mut self) {
        self.shutdown_nic();
    }
}

// ---------------------------------------------------------------------------------------------
// Client side.

struct Posted {
    wr: WorkRequest,
    hold: InFlight,
}

/// Requests waiting to go on the wire, and whose turn it is to send. Exactly one party sends
/// at a time (`sending`), popping in order, so wire order is post order.
struct SendQueue {
    queue: VecDeque<Posted>,
    sending: bool,
    closed: bool,
    next_seq: u64,
}

struct QpShared {
    stream: TcpStream,
    send: Mutex<SendQueue>,
    /// Signalled when there is work for the sender thread.
    work: Condvar,
    /// Signalled when the queue has room again.
    space: Condvar,
    table: Arc<KeyTable>,
    cq: Arc<SoftCq>,
    /// Requests sent (or being sent) whose responses have not arrived, in order.
    pending: Mutex<VecDeque<Posted>>,
    dead: AtomicBool,
    op_timeout: Duration,
    epoch: Instant,
    /// Milliseconds since `epoch` of the last byte moved in either direction.
    last_progress: AtomicU64,
}

impl QpShared {
    fn touch(&self) {
        self.last_progress
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
    fn stalled(&self) -> bool {
        let last = Duration::from_millis(self.last_progress.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last) > self.op_timeout
    }

    fn complete(&self, wr: &WorkRequest, status: WcStatus, hold: Option<InFlight>) {
        self.table.counters.count(wr.opcode, status, wr.local.len);
        self.cq.push(Completion::new(wr, status, hold));
    }

    /// Marks the connection dead and fails everything outstanding.
    fn fail_all(&self, why: &dyn std::fmt::Display) {
        self.fail_all_as(why, false)
    }

    /// As `fail_all`; `deliberate` (the client hung up itself) logs quietly.
    fn fail_all_as(&self, why: &dyn std::fmt::Display, deliberate: bool) {
        let drained: Vec<Posted> = {
            let mut pending = self.pending.lock();
            if !self.dead.swap(true, Ordering::SeqCst) {
                log::log!(
                    if deliberate {
                        log::Level::Debug
                    } else {
                        log::Level::Warn
                    },
                    "tcp fabric: connection to {:?} closed: {why}",
                    self.stream.peer_addr().ok()
                );
            }
            pending.drain(..).collect()
        };
        let _ = self.stream.shutdown(Shutdown::Both);
        for p in drained {
            self.complete(&p.wr, WcStatus::TransportError, Some(p.hold));
        }
    }
}

/// A client queue pair of the TCP fabric.
pub struct TcpQp {
    shared: Arc<QpShared>,
}

impl TcpQp {
    fn start(
        stream: TcpStream,
        table: Arc<KeyTable>,
        cq: Arc<SoftCq>,
        op_timeout: Duration,
    ) -> Result<Arc<TcpQp>, FabricError> {
        let shared = Arc::new(QpShared {
            stream,
            send: Mutex::new(SendQueue {
                queue: VecDeque::with_capacity(SEND_QUEUE_DEPTH),
                sending: false,
                closed: false,
                next_seq: 0,
            }),
            work: Condvar::new(),
            space: Condvar::new(),
            table,
            cq,
            pending: Mutex::new(VecDeque::with_capacity(SEND_QUEUE_DEPTH)),
            dead: AtomicBool::new(false),
            op_timeout,
            epoch: Instant::now(),
            last_progress: AtomicU64::new(0),
        });
        let spawn_err = |e: io::Error| FabricError::Register(format!("spawn QP thread: {e}"));
        let s = shared.clone();
        thread::Builder::new()
            .name("qp-send".into())
            .stack_size(NIC_STACK)
            .spawn(move || qp_sender(s))
            .map_err(spawn_err)?;
        let s = shared.clone();
        thread::Builder::new()
            .name("qp-recv".into())
            .stack_size(NIC_STACK)
            .spawn(move || qp_receiver(s))
            .map_err(spawn_err)?;
        Ok(Arc::new(TcpQp { shared }))
    }
}

impl QueuePair for TcpQp {
    fn post(&self, wrs: &[WorkRequest]) {
        self.post_impl(wrs, true)
    }

    fn post_deferred(&self, wrs: &[WorkRequest]) {
        self.post_impl(wrs, false)
    }

    fn is_connected(&self) -> bool {
        !self.shared.dead.load(Ordering::SeqCst)
    }

    fn disconnect(&self) {
        {
            let mut q = self.shared.send.lock();
            q.closed = true;
            self.shared.work.notify_all();
            self.shared.space.notify_all();
        }
        self.shared.fail_all_as(&"disconnected by the client", true);
    }
}

impl TcpQp {
    /// Queues `wrs`; with `allow_inline`, the poster sends them itself when nobody else is.
    fn post_impl(&self, wrs: &[WorkRequest], allow_inline: bool) {
        let s = &*self.shared;
        let mut q = s.send.lock();
        for wr in wrs {
            // The local side is checked here, as a NIC checks the lkey when it fetches the WQE.
            let need = match wr.opcode {
                Opcode::Read => Access::LOCAL_WRITE,
                Opcode::Write => Access::NONE,
            };
            let hold = if wr.local.len <= MAX_OP_LEN {
                s.table
                    .acquire(wr.local.lkey, wr.local.addr, wr.local.len, need)
            } else {
                None
            };
            let Some(hold) = hold else {
                s.complete(wr, WcStatus::LocalProtectionError, None);
                continue;
            };
            // Back-pressure: a full send queue waits for the sender to make room.
            while q.queue.len() >= SEND_QUEUE_DEPTH && !q.closed && !s.dead.load(Ordering::SeqCst) {
                s.work.notify_one();
                q = s.space.wait(q);
            }
            if q.closed || s.dead.load(Ordering::SeqCst) {
                s.complete(wr, WcStatus::TransportError, Some(hold));
                continue;
            }
            q.queue.push_back(Posted { wr: *wr, hold });
        }
        if q.sending {
            return; // whoever is sending will get to these
        }
        let single = wrs.len() == 1 && q.queue.len() == 1;
        match q.queue.front() {
            Some(head) if allow_inline && (single || inline_ok(&head.wr)) => {
                q.sending = true;
                send_inline(s, q, single);
            }
            Some(_) => s.work.notify_one(),
            None => {}
        }
    }
}

impl Drop for TcpQp {
    fn drop(&mut self) {
        self.disconnect();
    }
}

fn encode_request(wr: &WorkRequest, seq: u64) -> [u8; REQ_HEADER] {
    let mut h = [0u8; REQ_HEADER];
    h[0] = match wr.opcode {
        Opcode::Read => OP_READ,
        Opcode::Write => OP_WRITE,
    };
    h[4..8].copy_from_slice(&wr.rkey.to_le_bytes());
    h[8..16].copy_from_slice(&wr.remote_addr.to_le_bytes());
    h[16..24].copy_from_slice(&wr.local.len.to_le_bytes());
    h[24..32].copy_from_slice(&seq.to_le_bytes());
    h
}

/// Sends one request (header, and payload for a WRITE) on the wire. Called by whoever holds
/// the send turn: a poster sending inline, or the sender thread.
fn send_one(s: &QpShared, posted: Posted, seq: u64) {
    let wr = posted.wr;
    // The sender reads the payload independently of when the completion is reaped (the
    // connection may fail mid-send and the completion go out first): its own hold keeps the
    // buffer registered and alive until the bytes are handed to the kernel.
    let send_hold = (wr.opcode == Opcode::Write).then(|| posted.hold.another());
    {
        let mut pending = s.pending.lock();
        if s.dead.load(Ordering::SeqCst) {
            drop(pending);
            s.complete(&wr, WcStatus::TransportError, Some(posted.hold));
            return;
        }
        pending.push_back(posted);
    }
    let header = encode_request(&wr, seq);
    let mut parts = [
        RawSlice {
            ptr: header.as_ptr(),
            len: REQ_HEADER,
        },
        RawSlice {
            ptr: wr.local.addr as *const u8,
            len: 0,
        },
    ];
    if send_hold.is_some() {
        parts[1].len = wr.local.len as usize;
    }
    let mut last_sent = 0;
    let mut keep_waiting = |sent: usize| {
        if sent != last_sent {
            last_sent = sent;
            s.touch();
        }
        !s.dead.load(Ordering::SeqCst) && !s.stalled()
    };
    s.touch();
    // SAFETY: the header is on our stack; the payload range was checked against a live
    // registration by `acquire`, and `send_hold` keeps that registration (and an owned buffer)
    // alive until this call returns.
    let res = unsafe { send_all_raw(s.stream.as_raw_fd(), &parts, &mut keep_waiting) };
    drop(send_hold);
    match res {
        Err(e) => s.fail_all(&format_args!("send: {e}")),
        Ok(()) => s.touch(),
    }
}

/// Requests worth sending on the poster's own thread: no payload, or a small one. Saves a
/// thread hand-off (two context switches) per operation; large payloads of a multi-request
/// batch go to the sender thread, so one request's payload does not hold up the posting of the
/// rest (which may be bound for other servers). A post of a single request is sent inline
/// whatever its size: its poster is about to wait for it anyway.
const INLINE_MAX: u64 = crate::config::SMALL_OP_BYTES;

fn inline_ok(wr: &WorkRequest) -> bool {
    wr.opcode == Opcode::Read || wr.local.len <= INLINE_MAX
}

/// Takes send turns while the queue's head is small; returns with the turn released, handing
/// any remaining work to the sender thread.
fn send_inline<'a>(
    s: &'a QpShared,
    mut q: crate::sync::MutexGuard<'a, SendQueue>,
    mut allow_large: bool,
) {
    while let Some(head) = q.queue.front() {
        if !inline_ok(&head.wr) && !allow_large {
            break;
        }
        allow_large = false;
        let posted = q.queue.pop_front().expect("non-empty");
        let seq = q.next_seq;
        q.next_seq += 1;
        s.space.notify_one();
        drop(q);
        send_one(s, posted, seq);
        q = s.send.lock();
    }
    q.sending = false;
    if !q.queue.is_empty() {
        s.work.notify_one();
    }
}

fn qp_sender(s: Arc<QpShared>) {
    let mut q = s.send.lock();
    loop {
        if !q.sending && !q.queue.is_empty() {
            let posted = q.queue.pop_front().expect("non-empty");
            let seq = q.next_seq;
            q.next_seq += 1;
            q.sending = true;
            s.space.notify_one();
            drop(q);
            send_one(&s, posted, seq);
            q = s.send.lock();
            q.sending = false;
            continue;
        }
        if q.closed && q.queue.is_empty() {
            return;
        }
        q = s.work.wait(q);
    }
}

fn qp_receiver(s: Arc<QpShared>) {
    let fd = s.stream.as_raw_fd();
    let mut expect_seq: u64 = 0;
    loop {
        let mut header = [0u8; RESP_HEADER];
        let mut last_got = 0;
        let mut keep_waiting = |got: usize| {
            if s.dead.load(Ordering::SeqCst) {
                return false;
            }
            if got != last_got {
                last_got = got;
                s.touch();
            }
            if got == 0 && s.pending.lock().is_empty() {
                // Idle connection: nothing is owed to us, so silence is fine.
                s.touch();
                return true;
            }
            !s.stalled()
        };
        // SAFETY: the destination is a local array of exactly RESP_HEADER bytes.
        let res =
            unsafe { recv_exact_raw(fd, header.as_mut_ptr(), RESP_HEADER, &mut keep_waiting) };
        if let Err(e) = res {
            s.fail_all(&format_args!("receive: {e}"));
            return;
        }
        s.touch();
        let status = match header[0] {
            0 => WcStatus::Success,
            1 => WcStatus::RemoteAccessError,
            other => {
                s.fail_all(&format_args!("bad status byte {other} from peer"));
                return;
            }
        };
        let seq = u64::from_le_bytes(header[8..16].try_into().unwrap());
        let len = u64::from_le_bytes(header[16..24].try_into().unwrap());
        let Some(posted) = s.pending.lock().pop_front() else {
            s.fail_all(&"response with no request outstanding");
            return;
        };
        if seq != expect_seq || (status == WcStatus::Success && len != posted.wr.local.len) {
            s.pending.lock().push_front(posted);
            s.fail_all(&format_args!(
                "response {seq} out of order (expected {expect_seq})"
            ));
            return;
        }
        expect_seq += 1;
        if posted.wr.opcode == Opcode::Read && status == WcStatus::Success {
            let mut last = 0;
            let mut keep_waiting = |got: usize| {
                if got != last {
                    last = got;
                    s.touch();
                }
                !s.dead.load(Ordering::SeqCst) && !s.stalled()
            };
            // SAFETY: the local range was checked against a registration with LOCAL_WRITE by
            // `acquire`; `posted.hold` keeps it registered and alive until completion.
            let res = unsafe {
                recv_exact_raw(
                    fd,
                    posted.wr.local.addr as *mut u8,
                    len as usize,
                    &mut keep_waiting,
                )
            };
            if let Err(e) = res {
                s.complete(&posted.wr, WcStatus::TransportError, Some(posted.hold));
                s.fail_all(&format_args!("receive payload: {e}"));
                return;
            }
        }
        s.complete(&posted.wr, status, Some(posted.hold));
    }
}

// ---------------------------------------------------------------------------------------------
// Server side: the "NIC".

fn nic_accept_loop(listener: TcpListener, nic: Arc<NicShared>) {
    for conn in listener.incoming() {
        if nic.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = conn else { continue };
        let id = nic.next_conn.fetch_add(1, Ordering::Relaxed);
        match stream.try_clone() {
            Ok(c) => nic.conns.lock().insert(id, c),
            Err(_) => continue,
        };
        let n = nic.clone();
        let spawned = thread::Builder::new()
            .name("nic".into())
            .stack_size(NIC_STACK)
            .spawn(move || {
                let peer = stream.peer_addr().ok();
                if let Err(e) = nic_serve(&n, &stream) {
                    log::info!("tcp fabric: data connection from {peer:?} closed: {e}");
                }
                // The clone in `conns` keeps the socket open: shut it down so the peer sees
                // the end at once rather than after its timeout.
                let _ = stream.shutdown(Shutdown::Both);
                n.conns.lock().remove(&id);
            });
        if let Err(e) = spawned {
            log::error!("tcp fabric: cannot spawn a NIC thread: {e}");
        }
    }
}

fn nic_serve(nic: &NicShared, stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(TICK))?;
    stream.set_write_timeout(Some(TICK))?;
    let fd = stream.as_raw_fd();
    let stalled = |since: &mut Instant, moved: bool| {
        if moved {
            *since = Instant::now();
        }
        !nic.stop.load(Ordering::SeqCst) && since.elapsed() <= nic.op_timeout
    };
    let mut magic = [0u8; 8];
    let mut since = Instant::now();
    // SAFETY: local array of the right size.
    unsafe {
        recv_exact_raw(fd, magic.as_mut_ptr(), 8, &mut |g| {
            stalled(&mut since, g > 0)
        })?
    };
    if magic != DATA_MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "bad data-connection magic",
        ));
    }
    let table = &nic.table;
    loop {
        let mut h = [0u8; REQ_HEADER];
        let mut last = 0;
        let mut since = Instant::now();
        let mut keep_waiting = |got: usize| {
            if nic.stop.load(Ordering::SeqCst) {
                return false;
            }
            if got == 0 {
                return true; // idle between requests
            }
            let moved = got != last;
            last = got;
            stalled(&mut since, moved)
        };
        // SAFETY: local array of REQ_HEADER bytes.
        match unsafe { recv_exact_raw(fd, h.as_mut_ptr(), REQ_HEADER, &mut keep_waiting) } {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            r => r?,
        }
        let op = h[0];
        let rkey = u32::from_le_bytes(h[4..8].try_into().unwrap());
        let raddr = u64::from_le_bytes(h[8..16].try_into().unwrap());
        let len = u64::from_le_bytes(h[16..24].try_into().unwrap());
        let seq: [u8; 8] = h[24..32].try_into().unwrap();
        if (op != OP_READ && op != OP_WRITE) || len > MAX_OP_LEN || h[1..4] != [0, 0, 0] {
            // Not something a well-behaved QP sends: the stream cannot be trusted any more.
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("malformed request (op {op}, len {len})"),
            ));
        }
        let (need, opcode) = if op == OP_READ {
            (Access::REMOTE_READ, Opcode::Read)
        } else {
            (Access::REMOTE_WRITE, Opcode::Write)
        };
        let hold = table.acquire(rkey, raddr, len, need);
        let status = if hold.is_some() {
            WcStatus::Success
        } else {
            WcStatus::RemoteAccessError
        };
        let mut resp = [0u8; RESP_HEADER];
        resp[0] = if hold.is_some() { 0 } else { 1 };
        resp[8..16].copy_from_slice(&seq);
        resp[16..24].copy_from_slice(&len.to_le_bytes());
        let mut since = Instant::now();
        let mut last = 0;
        let mut progress = |done: usize| {
            let moved = done != last;
            last = done;
            stalled(&mut since, moved)
        };
        if opcode == Opcode::Write {
            match &hold {
                // SAFETY: `acquire` checked that [raddr, raddr+len) lies inside a live
                // registration with REMOTE_WRITE; `hold` keeps it registered meanwhile.
                Some(_) => unsafe {
                    recv_exact_raw(fd, raddr as *mut u8, len as usize, &mut progress)?
                },
                None => drain(stream, len)?,
            }
        }
        let payload_len = if opcode == Opcode::Read && hold.is_some() {
            len as usize
        } else {
            0
        };
        let parts = [
            RawSlice {
                ptr: resp.as_ptr(),
                len: RESP_HEADER,
            },
            RawSlice {
                ptr: raddr as *const u8,
                len: payload_len,
            },
        ];
        // SAFETY: the response header is local; a non-empty payload range was checked by
        // `acquire` (REMOTE_READ, in bounds) and `hold` keeps it registered while we send.
        unsafe { send_all_raw(fd, &parts, &mut progress)? };
        table.counters.count(opcode, status, len);
        drop(hold);
    }
}

/// Reads and discards `len` payload bytes of a refused WRITE, keeping the stream in step.
fn drain(mut stream: &TcpStream, mut len: u64) -> io::Result<()> {
    let mut scratch = [0u8; 16 * 1024];
    let deadline = Instant::now();
    while len > 0 {
        let want = scratch.len().min(len as usize);
        match stream.read(&mut scratch[..want]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => len -= n as u64,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                // A refused payload gets a generous but bounded time to arrive.
                if deadline.elapsed() > Duration::from_secs(60) {
                    return Err(e);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
