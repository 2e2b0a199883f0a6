//! Figures the core keeps for others to fill and report: the FUSE adapter's request
//! counts, the upkeep threads' rebuild and panic counts. Plain counters, no logic: the
//! report (`crate::report`) reads them, and the core needs neither the adapter nor upkeep.

use crate::requests::RequestStats;
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The figures one mount keeps.
#[derive(Default)]
pub struct Figures {
    /// Requests the FUSE adapter answered, per operation.
    pub requests: RequestStats,
    /// Requests whose handler panicked (answered EIO by the FUSE adapter).
    pub contained_panics: AtomicU64,
    /// How the kernel's requests reach the adapter, as INIT settled it.
    pub fuse_transport: std::sync::OnceLock<&'static str>,
    /// The daemon's admin socket (`mount::admin`), once it listens.
    pub admin_socket: std::sync::OnceLock<String>,
    /// Requests the adapter is handling now.
    pub in_flight: AtomicU64,
    /// Requests the kernel sent again (FUSE_NOTIFY_RESEND) because an earlier daemon of a
    /// kept connection read them but never answered.
    pub resent: AtomicU64,
    /// What the background rebuild has done.
    pub rebuild: RebuildStats,
    /// Panics of the upkeep threads (heartbeat, reconnect, rebuild), each contained.
    pub upkeep_panics: UpkeepPanics,
    /// The drain running now (`rmemfs admin drain`), if any.
    pub drain: crate::sync::Mutex<Option<DrainRun>>,
    /// What a volume's follower has done (`--read-only`; unset otherwise).
    pub follow: std::sync::OnceLock<std::sync::Arc<FollowCounters>>,
}

/// What a follower of a volume has done ([`crate::volume::follow`]).
#[derive(Debug, Default)]
pub struct FollowCounters {
    /// The last journal record applied.
    pub applied: AtomicU64,
    /// Records applied since the mount.
    pub records: AtomicU64,
    /// Looks at the journal's tail.
    pub polls: AtomicU64,
    /// Checkpoints loaded whole (it fell behind the ring).
    pub reloads: AtomicU64,
    /// Invalidations sent to the kernel.
    pub invalidations: AtomicU64,
    /// Polls that failed.
    pub errors: AtomicU64,
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
pub const UPKEEP_THREADS: [&str; 3] = ["heartbeat", "reconnect", "rebuild"];

/// Panics of each upkeep thread (in [`UPKEEP_THREADS`] order): each one logged, and the
/// thread went on with its next round.
#[derive(Debug, Default)]
pub struct UpkeepPanics([AtomicU64; 3]);

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

    /// `{"heartbeat": n, "reconnect": n, "rebuild": n}`, for `stats --json`.
    pub fn to_json(&self) -> serde_json::Value {
        UPKEEP_THREADS
            .iter()
            .map(|t| (t.to_string(), self.of(t).into()))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

/// A volume's journal, as the report shows it (`stats`: the `journal` section).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalStats {
    /// The epoch this daemon holds the volume at.
    pub epoch: u64,
    /// The last record committed on every live journal copy.
    pub committed: u64,
    /// Groups of records written (one replicated WRITE each).
    pub groups: u64,
    /// Bytes of records written.
    pub bytes: u64,
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Frees waiting for the commit of the record that let go of their extents.
    pub frees_held: u64,
}
