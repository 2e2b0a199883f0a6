//! Background rebuild: chunks that lost a copy (its server died) get it back on another
//! server with room, so the pool can lose the next server without losing data.
//!
//! Writes already repair the chunks they touch; the rebuild covers the rest. One pass visits
//! every file and, in each, every chunk short of copies: the chunk's copy happens with that
//! file's chunk map locked for writing, so no write races it (a write either lands before the
//! copy, and is copied, or after, and goes to every copy), and foreground I/O on the file
//! waits at most one chunk copy. Passes run when the set of live servers changes, and again
//! after [`RETRY`] while a pass left chunks degraded (no room anywhere). The copy rate is
//! held to `--rebuild-rate` so foreground traffic keeps the rest of the link.

use crate::fs::Fs;
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How often the rebuild thread looks at the live servers.
const SCAN_INTERVAL: Duration = Duration::from_secs(1);
/// A pass that left chunks degraded (no server with room) is tried again this often: room
/// comes back when files are removed, without any server changing state.
const RETRY: Duration = Duration::from_secs(30);

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

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PassOutcome {
    pub chunks_rebuilt: u64,
    pub bytes_copied: u64,
    pub left_degraded: u64,
}

/// A stop signal the rebuild waits on (so unmount does not wait out a pause).
#[derive(Default)]
pub struct Stop {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl Stop {
    pub fn stop(&self) {
        *self.stopped.lock() = true;
        self.wake.notify_all();
    }
    pub fn is_stopped(&self) -> bool {
        *self.stopped.lock()
    }
    /// Waits up to `d`; true if stopped.
    fn wait(&self, d: Duration) -> bool {
        let deadline = Instant::now() + d;
        let mut stopped = self.stopped.lock();
        while !*stopped {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            stopped = self.wake.wait_timeout(stopped, left).0;
        }
        *stopped
    }
}

/// One rebuild pass over every file, copying at most `rate` bytes per second (0: as fast as
/// it goes). Stops early when `stop` is signalled.
pub fn pass(fs: &Fs, rate: u64, stop: &Stop) -> PassOutcome {
    let data = fs.data();
    let stats = fs.rebuild_stats();
    stats.running.store(true, Ordering::Relaxed);
    let start = Instant::now();
    let mut out = PassOutcome::default();
    for file in fs.files() {
        let todo = data.degraded(&file.chunks.read());
        for idx in todo {
            if stop.is_stopped() {
                break;
            }
            let copied = data.rebuild_chunk(&mut file.chunks.write(), idx);
            if copied == 0 {
                continue;
            }
            out.chunks_rebuilt += 1;
            out.bytes_copied += copied;
            stats.chunks_rebuilt.fetch_add(1, Ordering::Relaxed);
            stats.bytes_copied.fetch_add(copied, Ordering::Relaxed);
            if rate > 0 {
                // Pace: the bytes so far may take no less than bytes / rate.
                let due = Duration::from_secs_f64(out.bytes_copied as f64 / rate as f64);
                if let Some(ahead) = due.checked_sub(start.elapsed()) {
                    stop.wait(ahead);
                }
            }
        }
        out.left_degraded += data.degraded(&file.chunks.read()).len() as u64;
    }
    if out.bytes_copied > 0 {
        let secs = start.elapsed().as_secs_f64().max(1e-6);
        stats
            .last_rate
            .store((out.bytes_copied as f64 / secs) as u64, Ordering::Relaxed);
        log::info!(
            "rebuild: {} chunks ({} bytes) copied in {:.1} s; {} still short of copies",
            out.chunks_rebuilt,
            out.bytes_copied,
            secs,
            out.left_degraded
        );
    }
    stats
        .left_degraded
        .store(out.left_degraded, Ordering::Relaxed);
    stats.passes.fetch_add(1, Ordering::Relaxed);
    stats.running.store(false, Ordering::Relaxed);
    out
}

/// The upkeep threads of a mount: heartbeats to every server (a dead, frozen or cut-off one
/// is marked failed within the detection time, the op timeout, even while idle) and the
/// rebuild. Both stop (and are joined) on drop.
pub struct Rebuilder {
    stop: Arc<Stop>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// Heartbeats per detection time: a server is given up on between 3/4 and 1 of it after it
/// stops answering.
const BEATS_PER_DETECTION: u32 = 4;

impl Rebuilder {
    /// Starts rebuilding `fs` in the background at most `rate` bytes per second (0: no limit).
    /// Nothing runs with one copy per chunk.
    pub fn start(fs: Arc<Fs>, rate: u64, detection: Duration) -> std::io::Result<Rebuilder> {
        let stop = Arc::new(Stop::default());
        let (s, pool) = (stop.clone(), fs.data().pool().clone());
        let heartbeat = std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(move || {
                while !s.wait(detection / BEATS_PER_DETECTION) {
                    pool.heartbeat(detection);
                }
            })?;
        let s = stop.clone();
        let rebuild = std::thread::Builder::new()
            .name("rebuild".into())
            .spawn(move || {
                if fs.data().replicas() < 2 {
                    return;
                }
                let mut live = fs.data().pool().live_servers();
                let mut retry_at: Option<Instant> = None;
                while !s.wait(SCAN_INTERVAL) {
                    let now_live = fs.data().pool().live_servers();
                    let changed = now_live != live;
                    live = now_live;
                    if changed || retry_at.is_some_and(|t| Instant::now() >= t) {
                        let out = pass(&fs, rate, &s);
                        retry_at = (out.left_degraded > 0).then(|| Instant::now() + RETRY);
                    }
                }
            })?;
        Ok(Rebuilder {
            stop,
            threads: vec![heartbeat, rebuild],
        })
    }
}

impl Drop for Rebuilder {
    fn drop(&mut self) {
        self.stop.stop();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
