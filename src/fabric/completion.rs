//! The completion queue every fabric delivers into, and the counters every fabric keeps.

use super::*;

/// Fabric-wide operation counters (every fabric keeps them; tests and `stats` read them).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct OpCounters {
    pub reads: u64,
    pub writes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub failed: u64,
    pub registrations: u64,
    pub deregistrations: u64,
    pub deregistration_batches: u64,
    /// Remote requests this side's NIC refused (each one closes its data connection).
    pub remote_refused: u64,
    /// This side's requests the peer's NIC refused as remote access errors (each one
    /// closed its connection).
    pub remote_errors: u64,
}

/// The completion queue every fabric delivers into (the verbs fabric's poller moves device
/// completions here). Every posted work request's completion arrives exactly once. Requests
/// a queue pair carries out complete in posting order; a request refused before it reaches
/// the wire (a bad local SGE, a QP already broken) may complete ahead of earlier ones still in
/// flight.
pub struct CompletionQueue {
    tx: crossbeam_channel::Sender<Completion>,
    rx: crossbeam_channel::Receiver<Completion>,
    handler: Option<CompletionHandler>,
}

impl Default for CompletionQueue {
    fn default() -> Self {
        // Unbounded: a NIC thread must never block on a consumer that is itself blocked posting.
        let (tx, rx) = crossbeam_channel::unbounded();
        CompletionQueue {
            tx,
            rx,
            handler: None,
        }
    }
}

impl CompletionQueue {
    /// A queue to reap from with [`CompletionQueue::poll`] and [`CompletionQueue::wait`].
    pub fn new() -> Arc<CompletionQueue> {
        Arc::new(CompletionQueue::default())
    }

    /// Completions go straight to `handler`, called by the thread that completes them (a NIC
    /// or poller thread), instead of waiting to be reaped. Saves the hand-off to a reaping
    /// thread; the handler must be quick and must not block.
    pub fn with_handler(handler: CompletionHandler) -> Arc<CompletionQueue> {
        Arc::new(CompletionQueue {
            handler: Some(handler),
            ..CompletionQueue::default()
        })
    }

    pub(crate) fn push(&self, c: Completion) {
        match &self.handler {
            Some(h) => h(c),
            // The receiver lives in `self`, so the channel cannot be disconnected.
            None => {
                let _ = self.tx.send(c);
            }
        }
    }

    /// Moves up to `max` ready completions into `out` without blocking; returns how many.
    pub fn poll(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        let mut n = 0;
        while n < max {
            match self.rx.try_recv() {
                Ok(c) => {
                    out.push(c);
                    n += 1;
                }
                Err(_) => break,
            }
        }
        n
    }

    /// Waits up to `timeout` for one completion.
    pub fn wait(&self, timeout: Duration) -> Option<Completion> {
        self.rx.recv_timeout(timeout).ok()
    }
}
