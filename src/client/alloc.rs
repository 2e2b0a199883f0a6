//! Allocation: placing extents (and their copies) on the servers with the most room, the
//! stock of small extents granted ahead, and frees (sent without waiting, kept for a server
//! that is down).

use super::*;

/// One server's frees: how many were sent and how many answered (in order: one connection),
/// and the waiters for an answer ([`Pool::free`] at the cap, [`Pool::settle_frees`]).
#[derive(Default)]
pub(super) struct FreesOut {
    /// (sent, answered)
    pub(super) counts: Mutex<(u64, u64)>,
    pub(super) answered: Condvar,
}

impl FreesOut {
    pub(super) fn answer(&self) {
        self.counts.lock().1 += 1;
        self.answered.notify_all();
    }

    /// Waits until `done(sent, answered)` or `deadline`; returns whether it holds.
    pub(super) fn wait_until(&self, deadline: Instant, done: impl Fn(u64, u64) -> bool) -> bool {
        self.wait_then(deadline, done, |_| {})
    }

    /// Counts one more free sent once fewer than `cap` are unanswered, or at `deadline`
    /// (checked and counted under one lock, so concurrent frees never pass the cap together).
    pub(super) fn reserve(&self, cap: u64, deadline: Instant) {
        self.wait_then(
            deadline,
            |sent, answered| sent - answered < cap,
            |c| c.0 += 1,
        );
    }

    /// Waits until `done(sent, answered)` or `deadline`, then runs `then` on the counts under
    /// the same lock; returns whether `done` held.
    pub(super) fn wait_then(
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

impl Pool {
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
        match self.try_alloc_replicas(len, n, exclude) {
            // Not for a repair (`exclude`: copies placed beside existing ones, best effort,
            // often under a rebuild's file lock).
            Err(PoolError::NoSpace { .. })
                if exclude.is_empty() && self.await_frees_in_flight() =>
            {
                self.try_alloc_replicas(len, n, exclude)
            }
            other => other,
        }
    }

    /// On a full pool: waits (at most [`crate::config::FULL_POOL_FREES_WAIT`]) for the frees
    /// already made and not yet back at their servers (held behind a volume's journal, or
    /// sent and unanswered), so the capacity heard counts them. False if there were none.
    fn await_frees_in_flight(&self) -> bool {
        let deadline = Instant::now() + crate::config::FULL_POOL_FREES_WAIT;
        let gate = self.free_gate.lock().clone();
        let held =
            |g: &Option<Arc<super::volume::FreeGate>>| g.as_ref().is_some_and(|g| g.held() > 0);
        let unanswered = self.servers.iter().filter(|s| !s.is_failed()).any(|s| {
            let (sent, answered) = *s.frees.counts.lock();
            answered < sent
        });
        if !held(&gate) && !unanswered {
            return false;
        }
        // The committer releases held frees after each commit, and says so.
        if let Some(gate) = &gate {
            gate.wait_released(deadline);
        }
        self.settle_frees(deadline.saturating_duration_since(Instant::now()));
        true
    }

    fn try_alloc_replicas(
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
    pub(super) fn placement(&self, len: u64) -> Vec<usize> {
        let mut order: Vec<(u64, u64, usize)> = self
            .servers
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_failed() && !s.draining.load(Ordering::SeqCst))
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

    pub(super) fn alloc_on_once(&self, id: ServerId, len: u64) -> Result<RemoteRegion, PoolError> {
        if self.follows() {
            return Err(PoolError::Invalid(
                "a follower of a volume allocates nothing (its holder writes)".into(),
            ));
        }
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
        if self.hold_free(region) {
            return Ok(());
        }
        self.free_now(region)
    }

    /// [`Pool::free`] without waiting for a volume's journal.
    pub(super) fn free_now(&self, region: RemoteRegion) -> Result<(), PoolError> {
        if self.follows() {
            // The holder's memory: only the holder frees it (a follower's server would
            // close the session that tried).
            return Ok(());
        }
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
    pub(super) fn send_free(&self, s: &Server, addr: u64, rkey: u64) -> Result<(), PoolError> {
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
}
