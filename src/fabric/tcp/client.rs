//! The client side of the TCP fabric: a queue pair is one TCP connection to a server's NIC, a
//! send queue ([`SendQueue`]) drained by whoever holds the turn (a poster sending a small
//! request inline, or the sender thread), and a receiver thread that matches responses to the
//! requests outstanding, in order, and delivers their completions.
//!
//! Nothing here is called while a lock of the queue pair is held: refused requests are
//! completed after the send queue's lock is released, and completions are delivered outside
//! the outstanding list's lock.

use super::sendq::SendQueue;
use super::wire::{recv_exact_raw, send_all_raw, RawSlice, Request, Response, RESP_HEADER};
use crate::fabric::{
    CompletionQueue, FabricError, InFlight, Opcode, QueuePair, Registry, WcStatus, WorkRequest,
};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Arc, Mutex};
use std::collections::VecDeque;
use std::io;
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::thread;
use std::time::{Duration, Instant};

/// Posted requests buffered ahead of the sender before `post` applies back-pressure.
const SEND_QUEUE_DEPTH: usize = crate::config::TCP_SEND_QUEUE_DEPTH;

/// QP threads only need a little stack: a header and the raw I/O loop.
const QP_STACK: usize = 256 * 1024;

/// Requests worth sending on the poster's own thread: no payload, or a small one. Saves a
/// thread hand-off (two context switches) per operation; large payloads of a multi-request
/// batch go to the sender thread, so one request's payload does not hold up the posting of the
/// rest (which may be bound for other servers). A post of a single request is sent inline
/// whatever its size: its poster is about to wait for it anyway.
const INLINE_MAX: u64 = crate::config::SMALL_OP_BYTES;

fn inline_ok(wr: &WorkRequest) -> bool {
    wr.opcode == Opcode::Read || wr.local.len <= INLINE_MAX
}

struct Posted {
    wr: WorkRequest,
    hold: InFlight,
}

struct QpShared {
    stream: TcpStream,
    sendq: SendQueue<Posted>,
    registry: Arc<Registry>,
    cq: Arc<CompletionQueue>,
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
    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    fn complete(&self, wr: &WorkRequest, status: WcStatus, hold: Option<InFlight>) {
        self.registry.complete(&self.cq, wr, status, hold);
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
    pub(super) fn start(
        stream: TcpStream,
        registry: Arc<Registry>,
        cq: Arc<CompletionQueue>,
        op_timeout: Duration,
    ) -> Result<Arc<TcpQp>, FabricError> {
        let shared = Arc::new(QpShared {
            stream,
            sendq: SendQueue::new(SEND_QUEUE_DEPTH),
            registry,
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
            .stack_size(QP_STACK)
            .spawn(move || qp_sender(s))
            .map_err(spawn_err)?;
        let s = shared.clone();
        thread::Builder::new()
            .name("qp-recv".into())
            .stack_size(QP_STACK)
            .spawn(move || qp_receiver(s))
            .map_err(spawn_err)?;
        Ok(Arc::new(TcpQp { shared }))
    }

    /// Queues `wrs`; with `allow_inline`, the poster sends them itself when nobody else is.
    fn post_impl(&self, wrs: &[WorkRequest], allow_inline: bool) {
        let s = &*self.shared;
        for wr in wrs {
            // The local side is checked here, as a NIC checks the lkey when it fetches the WQE.
            let Some(hold) = s.registry.admit(&s.cq, wr) else {
                continue;
            };
            if let Err(p) = s.sendq.push(Posted { wr: *wr, hold }, &|| s.is_dead()) {
                s.complete(&p.wr, WcStatus::TransportError, Some(p.hold));
            }
        }
        let single = wrs.len() == 1;
        let turn = s.sendq.take_turn(|head, queued| {
            allow_inline && ((single && queued == 1) || inline_ok(&head.wr))
        });
        if let Some(mut turn) = turn {
            // The first request of a single post goes inline whatever its size; after it,
            // only small ones (the sender thread takes the rest when the turn is dropped).
            let mut allow_large = single;
            while let Some((posted, seq)) = turn.next(|p| allow_large || inline_ok(&p.wr)) {
                allow_large = false;
                send_one(s, posted, seq);
            }
        }
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
        !self.shared.is_dead()
    }

    fn disconnect(&self) {
        self.shared.sendq.close();
        self.shared.fail_all_as(&"disconnected by the client", true);
    }
}

impl Drop for TcpQp {
    fn drop(&mut self) {
        self.disconnect();
    }
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
        if s.is_dead() {
            drop(pending);
            s.complete(&wr, WcStatus::TransportError, Some(posted.hold));
            return;
        }
        pending.push_back(posted);
    }
    let header = Request {
        opcode: wr.opcode,
        rkey: wr.rkey,
        addr: wr.remote_addr,
        len: wr.local.len,
        seq,
    }
    .encode();
    let mut parts = [
        RawSlice {
            ptr: header.as_ptr(),
            len: header.len(),
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
        !s.is_dead() && !s.stalled()
    };
    s.touch();
    // SAFETY: the header is on our stack; the payload range was checked against a live
    // registration by `admit`, and `send_hold` keeps that registration (and an owned buffer)
    // alive until this call returns.
    let res = unsafe { send_all_raw(s.stream.as_raw_fd(), &parts, &mut keep_waiting) };
    drop(send_hold);
    match res {
        Err(e) => s.fail_all(&format_args!("send: {e}")),
        Ok(()) => s.touch(),
    }
}

fn qp_sender(s: Arc<QpShared>) {
    // One request per turn: a poster may take the turn in between and send its own small
    // requests without waiting behind a large payload.
    while let Some(mut turn) = s.sendq.wait_turn() {
        if let Some((posted, seq)) = turn.next(|_| true) {
            send_one(&s, posted, seq);
        }
    }
}

fn qp_receiver(s: Arc<QpShared>) {
    let fd = s.stream.as_raw_fd();
    let mut expect_seq: u64 = 0;
    loop {
        let mut header = [0u8; RESP_HEADER];
        let mut last_got = 0;
        let mut keep_waiting = |got: usize| {
            if s.is_dead() {
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
        let resp = match Response::decode(&header) {
            Ok(r) => r,
            Err(e) => {
                s.fail_all(&format_args!("{e} from peer"));
                return;
            }
        };
        let Some(posted) = s.pending.lock().pop_front() else {
            s.fail_all(&"response with no request outstanding");
            return;
        };
        if resp.seq != expect_seq
            || (resp.status == WcStatus::Success && resp.len != posted.wr.local.len)
        {
            s.pending.lock().push_front(posted);
            s.fail_all(&format_args!(
                "response {} out of order (expected {expect_seq})",
                resp.seq
            ));
            return;
        }
        expect_seq += 1;
        if posted.wr.opcode == Opcode::Read && resp.status == WcStatus::Success {
            let mut last = 0;
            let mut keep_waiting = |got: usize| {
                if got != last {
                    last = got;
                    s.touch();
                }
                !s.is_dead() && !s.stalled()
            };
            // SAFETY: the local range was checked against a registration with LOCAL_WRITE by
            // `admit`; `posted.hold` keeps it registered and alive until completion.
            let res = unsafe {
                recv_exact_raw(
                    fd,
                    posted.wr.local.addr as *mut u8,
                    resp.len as usize,
                    &mut keep_waiting,
                )
            };
            if let Err(e) = res {
                s.complete(&posted.wr, WcStatus::TransportError, Some(posted.hold));
                s.fail_all(&format_args!("receive payload: {e}"));
                return;
            }
        }
        if resp.status != WcStatus::Success {
            // The NIC closes the connection after an error, as an RC queue pair breaks: mark
            // it dead before anyone sees this completion, so whoever reaps it sees a broken QP
            // (not one that breaks a moment later, when the close arrives).
            s.dead.store(true, Ordering::SeqCst);
            log::warn!(
                "tcp fabric: {:?} on {:?} refused ({:?}); the connection is closed",
                posted.wr.opcode,
                s.stream.peer_addr().ok(),
                resp.status
            );
            s.complete(&posted.wr, resp.status, Some(posted.hold));
            s.fail_all(&"remote error");
            return;
        }
        s.complete(&posted.wr, resp.status, Some(posted.hold));
    }
}
