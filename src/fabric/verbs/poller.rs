//! The completion poller: one thread per fabric sleeps on the completion channel (no busy
//! polling: these machines have two cores), drains the shared CQ and routes each completion
//! to its queue pair by the slot in its wr_id.

use super::*;

/// The completion poller: sleeps on the completion channel, drains the shared CQ, and routes
/// each completion to its QP.
pub(super) fn poll_loop(shared: &Shared) {
    // SAFETY: the raw CQ pointer is only used while `shared`, which owns the CQ, is alive.
    let cq_ptr = unsafe { sideway::ibverbs::completion::CompletionQueue::cq(&*shared.cq) };
    let mut last_watch = Instant::now();
    let drain_locked = || {
        // A panicking handler must not stop the poller for good: the lock guards no data.
        let _guard = shared.drain_lock.lock();
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
pub(super) fn drain(shared: &Shared) -> usize {
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
