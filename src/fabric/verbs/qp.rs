//! Queue pairs: creation and the INIT → RTR → RTS handshake (the endpoint blob that rides the
//! control connection), posting with a backlog beyond the device's depth, completion of
//! requests, and the watchdog that breaks a QP which makes no progress.

use super::device::unavailable;
use super::*;

/// A random 24-bit starting PSN (stale packets of an earlier QP must not fit in).
pub(super) fn random_psn() -> u32 {
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

impl VerbsFabric {
    /// A queue pair in `pd`; its peer may WRITE into this side's regions only if
    /// `remote_write` (a volume's follower may only READ).
    pub(super) fn create_qp(
        &self,
        pd: &Arc<ProtectionDomain>,
        remote_write: bool,
    ) -> Result<BasicQueuePair, FabricError> {
        let mut builder = pd.create_qp_builder();
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
            .setup_access_flags(if remote_write {
                AccessFlags::LocalWrite | AccessFlags::RemoteRead | AccessFlags::RemoteWrite
            } else {
                AccessFlags::LocalWrite | AccessFlags::RemoteRead
            });
        qp.modify(&attr)
            .map_err(|e| unavailable(format!("cannot move a queue pair to INIT: {e}")))?;
        Ok(qp)
    }

    pub(super) fn endpoint(&self, qp: &BasicQueuePair, psn: u32) -> Endpoint {
        Endpoint {
            qpn: qp.qp_number(),
            psn,
            lid: self.shared.lid,
            mtu: self.shared.mtu as u8,
            gid: self.shared.gid.raw,
        }
    }

    /// INIT → RTR → RTS towards `remote`.
    pub(super) fn connect_qp(
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
}

/// A request the QP owns until its completion: the request and its hold on the local region.
pub(super) struct Pending {
    pub(super) wr: WorkRequest,
    pub(super) hold: InFlight,
    pub(super) seq: u64,
}

pub(super) struct QpState {
    pub(super) qp: BasicQueuePair,
    /// Sequence numbers come from one fabric-wide counter, not per QP: a slot is reused once
    /// its QP is gone, and a stale completion of the old QP must never match a request of the
    /// new one.
    pub(super) seqs: Arc<AtomicU64>,
    /// Posted to the device, in posting order (RC completes in that order).
    pub(super) on_device: VecDeque<Pending>,
    /// Waiting for room on the device.
    pub(super) backlog: VecDeque<Pending>,
    /// An error completion moved the QP to the error state, or it was disconnected.
    pub(super) broken: bool,
    /// When a request last completed, or was posted to an idle device queue.
    pub(super) last_progress: Instant,
}

/// A client QP.
pub struct VerbsQp {
    pub(super) slot: u64,
    pub(super) op_timeout: Duration,
    pub(super) table: Arc<Registry>,
    pub(super) cq: Arc<CompletionQueue>,
    pub(super) connected: AtomicBool,
    pub(super) state: Mutex<QpState>,
}

impl QpState {
    /// Moves backlog requests onto the device while there is room. Requests the device
    /// refuses, and every request once the QP is broken and drained, come back as failed.
    pub(super) fn pump(&mut self, slot: u64, failed: &mut Vec<Pending>) {
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
                // Checked to fit when posted (a device rkey has 32 bits).
                rkey: p.wr.rkey as u32,
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
    pub(super) fn move_to_error(&mut self) {
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Error);
        if let Err(e) = self.qp.modify(&attr) {
            log::warn!("cannot move a queue pair to the error state: {e}");
        }
    }
}

impl VerbsQp {
    /// Delivers failed requests as transport errors.
    pub(super) fn fail(&self, failed: Vec<Pending>) {
        for p in failed {
            self.finish(p, WcStatus::TransportError);
        }
    }

    pub(super) fn finish(&self, p: Pending, status: WcStatus) {
        self.table.complete(&self.cq, &p.wr, status, Some(p.hold));
    }

    /// The poller's entry: the device completed request `seq`.
    pub(super) fn complete(&self, seq: u64, status: u32) {
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
pub(super) fn map_status(status: u32) -> WcStatus {
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
    pub(super) fn watchdog(&self) {
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
                if u32::try_from(wr.rkey).is_err() {
                    // No device key has more than 32 bits: cut short, it could name another
                    // region. Refused as the responder would refuse a bad key.
                    self.table
                        .complete(&self.cq, wr, WcStatus::RemoteAccessError, None);
                    return None;
                }
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
        let st = self.state.get_mut();
        if !st.on_device.is_empty() {
            log::debug!(
                "queue pair dropped with {} requests on the device",
                st.on_device.len()
            );
        }
    }
}
