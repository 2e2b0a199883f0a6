//! What upkeep has done, for the report: the rebuild's progress, the panics its threads
//! contained, and the drain under way. Upkeep owns these; the mount hands them to the report
//! (`crate::report::Parts`).

use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Upkeep's figures for one mount.
#[derive(Debug, Default)]
pub struct UpkeepFigures {
    /// What the background rebuild has done.
    pub rebuild: RebuildStats,
    /// What the encoder of cold chunks has done (`--redundancy ec:K+M`).
    pub encode: super::encode::EncodeStats,
    /// Panics of the upkeep threads, each contained.
    pub panics: UpkeepPanics,
    /// The drain running now (`rmemfs admin drain`), if any.
    pub drain: crate::sync::Mutex<Option<DrainRun>>,
}

/// A drain under way: which server, since when, and how many bytes of copies it had to move
/// (progress, rate and ETA follow from what is left now).
#[derive(Debug, Clone)]
pub struct DrainRun {
    pub server: String,
    pub started: std::time::Instant,
    pub bytes_at_start: u64,
}

/// What `stats` shows of the rebuild.
#[derive(Debug, Default)]
pub struct RebuildStats {
    pub running: AtomicBool,
    pub passes: AtomicU64,
    pub chunks_rebuilt: AtomicU64,
    pub bytes_copied: AtomicU64,
    /// Bytes per second of the last pass that copied anything.
    pub last_rate: AtomicU64,
    /// Chunks the last pass could not bring back to full strength.
    pub left_degraded: AtomicU64,
}

/// The upkeep threads, by the names `stats` counts their panics under.
pub const UPKEEP_THREADS: [&str; 5] = [
    "heartbeat",
    "reconnect",
    "rebuild",
    "write-behind",
    "encode",
];

/// Panics of each upkeep thread (in [`UPKEEP_THREADS`] order): each one logged, and the
/// thread went on with its next round.
#[derive(Debug, Default)]
pub struct UpkeepPanics([AtomicU64; UPKEEP_THREADS.len()]);

impl UpkeepPanics {
    fn slot(&self, thread: &str) -> &AtomicU64 {
        let i = UPKEEP_THREADS.iter().position(|t| *t == thread);
        &self.0[i.unwrap_or_else(|| unreachable!("{thread} is no upkeep thread"))]
    }

    pub fn count(&self, thread: &str) {
        self.slot(thread).fetch_add(1, Ordering::Relaxed);
    }

    /// Panics of `thread` (one of [`UPKEEP_THREADS`]) so far.
    pub fn of(&self, thread: &str) -> u64 {
        self.slot(thread).load(Ordering::Relaxed)
    }
}
