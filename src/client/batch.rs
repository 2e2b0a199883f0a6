//! Batches of one-sided operations: posted together, completed in the fabric's completion
//! context, waited for by spinning briefly then sleeping.

use super::*;

/// Completions outstanding for one `execute` call.
pub(super) struct Batch {
    pub(super) state: Mutex<BatchState>,
    pub(super) done: Condvar,
    /// When it was begun (posting follows at once), for the batch latencies.
    pub(super) started: Instant,
}

impl Batch {
    pub(super) fn new(n: usize) -> Batch {
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
    pub(super) fn wait(
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

pub(super) struct BatchState {
    pub(super) remaining: usize,
    /// The first failure, by op index.
    pub(super) failure: Option<(usize, WcStatus)>,
    /// A conditional write that could not be posted (its allocation was refused, or the
    /// server went away before answering).
    pub(super) refused: Option<PoolError>,
}

/// Batches of at most this many bytes are small: their waiter polls the fabric for a while
/// before sleeping (a 4 KiB read should cost one RDMA round trip, not two thread wake-ups).
pub(super) const SPIN_MAX_BYTES: u64 = crate::config::SMALL_OP_BYTES;
/// How long a small batch's waiter polls before it sleeps: a hundred RDMA round trips on
/// hardware (µs each), one or two on soft-RoCE under emulation (a 4 KiB read takes 0.2 to
/// 0.3 ms there); bounded so that a dead or slow server costs at most this much CPU per small
/// op. (Under emulation 2 ms measured no better than 0.5 ms: 2113 against 1810 µs p50.)
pub(super) const SPIN_WAIT: Duration = Duration::from_micros(500);

/// How long `--busy-poll` spins for a small op on a fabric with its own delivery threads
/// (tcp) before sleeping: about one loopback round trip here (a 4 KiB read's p50 is 70 to
/// 75 µs without it), so most completions are caught while a slow one costs little CPU
/// and leaves the core to the threads that deliver it.
pub(super) const BUSY_POLL_WAIT: Duration = Duration::from_micros(100);

/// Bits of a work-request id that index the op within its batch; the rest is the batch id.
pub(super) const BATCH_INDEX_BITS: u32 = 24;

pub(super) struct Dispatch {
    pub(super) batches: Mutex<HashMap<u64, Arc<Batch>>>,
}

impl Dispatch {
    pub(super) fn deliver(&self, c: Completion) {
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
    pub(super) fn fail(&self, batch_id: u64, count: usize, why: PoolError) {
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

impl Pool {
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
    pub(super) fn poll_briefly(&self, batch: &Batch) {
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

    pub(super) fn check_ops(&self, ops: &[RemoteOp]) -> Result<(), PoolError> {
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

    pub(super) fn begin_batch(&self, n: usize) -> Result<(u64, Arc<Batch>), PoolError> {
        if n >= 1 << BATCH_INDEX_BITS {
            return Err(PoolError::Invalid("batch too large".into()));
        }
        let batch_id = self.next_batch.fetch_add(1, Ordering::Relaxed);
        let batch = Arc::new(Batch::new(n));
        self.dispatch.batches.lock().insert(batch_id, batch.clone());
        Ok((batch_id, batch))
    }

    /// Posts `ops` as batch members `base..`, each server's ops in one call.
    pub(super) fn post_ops(&self, batch_id: u64, base: usize, ops: &[RemoteOp]) {
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
    pub(super) fn finish_batch(
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
