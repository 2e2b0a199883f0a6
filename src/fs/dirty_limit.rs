//! The kernel's dirty data for this mount kept below what the pool can still take.
//!
//! Under the writeback cache a `write()` lands in the page cache and meets the pool only when
//! the kernel writes it back; a full pool then answers ENOSPC at `fsync` or `close`, not at
//! `write`. To keep that rare, the kernel's dirty (and under-writeback) pages of this mount
//! are held below the pool's free room through the mount's bdi `max_bytes` (Linux 6.2+;
//! FUSE bdis have `strict_limit`, so writers are throttled at it), set to the room less a
//! margin and lowered as the room shrinks. So the cache stays on until the pool is nearly
//! full, and only then do new writable handles write through ([`DirtyLimit::direct`]).
//! Once the pool has refused data for room ([`DirtyLimit::refused`]), a handle still cached
//! is no longer throttled: its dirty pages cannot be written back anyway, and a one-page
//! limit would hold its writer to a round trip per page until it learns so at `fsync`.
//! A mount that cannot write the bdi's settings (a user's) keeps the older rule: write
//! through whenever the room is below what the mount may hold dirty at most.

use crate::config::{
    DIRTY_LIMIT_MARGIN, DIRTY_LIMIT_MARGIN_PARTS, FULL_POOL_DIRTY_LIMIT, WRITE_THROUGH_BELOW,
};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::Mutex;
use std::path::PathBuf;

/// The smallest limit set: one page (the kernel counts dirty data in pages).
const PAGE: u64 = 4096;

/// The bdi's `max_bytes` for a pool with `room` free bytes (of file data, copies counted)
/// when the mount may hold `ceiling` dirty bytes at most: the room less a share and a fixed
/// margin (the kernel's throttle lets writers overshoot a little, and other clients of the
/// same servers take room too), never above the ceiling.
pub fn limit_for(room: u64, ceiling: u64) -> u64 {
    room.saturating_sub(room / DIRTY_LIMIT_MARGIN_PARTS)
        .saturating_sub(DIRTY_LIMIT_MARGIN)
        .min(ceiling)
}

/// Whether `max_bytes` set to `current` must change for a pool of `room`: lowered at once
/// (dirty data must never outgrow the room), raised only once the target grew by a
/// sixteenth (each change is a sysfs write and a recalculation in the kernel).
fn needs_change(current: u64, target: u64) -> bool {
    target < current || target > current.saturating_add(current / 16)
}

/// One mount's dirty limit. Its lock is held only for the write of the bdi file, so two
/// updates (an open and the upkeep's) never land out of order.
#[derive(Debug)]
pub struct DirtyLimit {
    /// `/sys/class/bdi/DEV/max_bytes` of the mount, while it can be written.
    max_bytes: Mutex<Option<PathBuf>>,
    /// The most this mount may hold dirty in any case (its share of the machine's allowance).
    ceiling: u64,
    /// What `max_bytes` was last set to (0: never set).
    set: AtomicU64,
    /// The pool refused data for room, and has not had [`WRITE_THROUGH_BELOW`] free since.
    full: AtomicBool,
}

impl DirtyLimit {
    /// A limit kept through `max_bytes` (the mount's bdi file), under `ceiling`.
    pub fn new(max_bytes: Option<PathBuf>, ceiling: u64) -> DirtyLimit {
        DirtyLimit {
            max_bytes: Mutex::new(max_bytes),
            ceiling,
            set: AtomicU64::new(0),
            full: AtomicBool::new(false),
        }
    }

    /// The limit now in force (0: not kept, the low-water rule applies).
    pub fn bytes(&self) -> u64 {
        self.set.load(Ordering::Relaxed)
    }

    /// Keeps the limit in step with a pool of `room` free bytes. False when it cannot be
    /// kept (no bdi file, or it refused a write: then never tried again).
    pub fn follow(&self, room: u64) -> bool {
        let mut file = self.max_bytes.lock();
        let Some(path) = file.as_ref() else {
            return false;
        };
        if room >= WRITE_THROUGH_BELOW {
            self.full.store(false, Ordering::Relaxed);
        }
        let target = match self.full.load(Ordering::Relaxed) {
            true => FULL_POOL_DIRTY_LIMIT.min(self.ceiling),
            false => limit_for(room, self.ceiling),
        };
        let current = self.set.load(Ordering::Relaxed);
        if current != 0 && !needs_change(current, target) {
            return true;
        }
        // Never 0 (no dirty data at all): one page keeps writers throttled to a crawl, and
        // new handles write through long before.
        let value = target.max(PAGE);
        match std::fs::write(path, value.to_string()) {
            Ok(()) => {
                if current == 0 {
                    log::info!(
                        "dirty data of this mount kept below the pool's free room \
                         ({} = {value})",
                        path.display()
                    );
                }
                self.set.store(value, Ordering::Relaxed);
                true
            }
            Err(e) => {
                log::info!(
                    "cannot keep {} ({e}): new writable handles write through whenever the \
                     pool has less room than the mount may hold dirty",
                    path.display()
                );
                *file = None;
                self.set.store(0, Ordering::Relaxed);
                false
            }
        }
    }

    /// The pool refused a write for room (ENOSPC) with `room` free as last heard: until it has
    /// [`WRITE_THROUGH_BELOW`] free again, cached writers are not throttled (what they dirty
    /// is refused at write-back and reported at `fsync` or `close`, as it would be later).
    pub fn refused(&self, room: u64) {
        if room < WRITE_THROUGH_BELOW {
            self.full.store(true, Ordering::Relaxed);
            self.follow(room);
        }
    }

    /// Whether a handle opened for writing on a pool of `room` free bytes should bypass the
    /// kernel's cache: with the limit kept, once the room is nearly gone; without, whenever
    /// the room is below `low_water` (what the mount may hold dirty).
    pub fn direct(&self, room: u64, low_water: u64) -> bool {
        if self.follow(room) {
            room < WRITE_THROUGH_BELOW
        } else {
            room < low_water
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_limit_leaves_a_margin_and_never_exceeds_the_ceiling() {
        let ceiling = 1900 * MIB;
        let l = limit_for(1536 * MIB, ceiling);
        assert!(l < 1536 * MIB - DIRTY_LIMIT_MARGIN, "{l}");
        assert!(
            l > 1024 * MIB,
            "most of a 1.5 GiB pool stays cacheable: {l}"
        );
        assert_eq!(limit_for(64 << 30, ceiling), ceiling);
        assert_eq!(limit_for(DIRTY_LIMIT_MARGIN / 2, ceiling), 0);
    }

    #[test]
    fn lowered_at_once_raised_by_a_sixteenth() {
        assert!(needs_change(100 * MIB, 99 * MIB));
        assert!(!needs_change(100 * MIB, 105 * MIB));
        assert!(needs_change(100 * MIB, 107 * MIB));
    }

    #[test]
    fn a_limit_it_cannot_write_falls_back_to_the_low_water_rule() {
        let l = DirtyLimit::new(Some("/proc/no/such/bdi/max_bytes".into()), 1 << 30);
        assert!(!l.follow(512 * MIB));
        assert_eq!(l.bytes(), 0);
        // 512 MiB of room under a 1 GiB low-water mark: written through.
        assert!(l.direct(512 * MIB, 1 << 30));
        assert!(!l.direct(2 << 30, 1 << 30));
    }

    #[test]
    fn a_kept_limit_follows_the_room_and_writes_through_only_when_nearly_full() {
        let dir = std::env::temp_dir().join(format!("rmemfs-dirty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("max_bytes");
        std::fs::write(&file, "0").unwrap();
        let l = DirtyLimit::new(Some(file.clone()), 1 << 30);
        let read = || {
            std::fs::read_to_string(&file)
                .unwrap()
                .parse::<u64>()
                .unwrap()
        };
        assert!(!l.direct(512 * MIB, 1 << 30), "cached on a 512 MiB pool");
        assert_eq!(read(), limit_for(512 * MIB, 1 << 30));
        // The room shrinks: the limit follows at once.
        assert!(!l.direct(300 * MIB, 1 << 30));
        assert_eq!(read(), limit_for(300 * MIB, 1 << 30));
        assert_eq!(l.bytes(), read());
        // Nearly full: written through.
        assert!(l.direct(WRITE_THROUGH_BELOW - 1, 1 << 30));
        // Full, a cached writer's pages refused: no longer throttled to a crawl...
        l.follow(MIB);
        assert_eq!(read(), PAGE, "one page with 1 MiB of room");
        l.refused(0);
        assert_eq!(read(), FULL_POOL_DIRTY_LIMIT);
        l.follow(MIB);
        assert_eq!(read(), FULL_POOL_DIRTY_LIMIT, "still full");
        assert!(l.direct(MIB, 1 << 30), "new handles still write through");
        // ...until the pool has room again: the limit follows it, lowered at once.
        l.follow(WRITE_THROUGH_BELOW);
        assert_eq!(read(), limit_for(WRITE_THROUGH_BELOW, 1 << 30));
        l.follow(MIB);
        assert_eq!(read(), PAGE);
        // A refusal with room enough is another client's doing, not a full pool.
        l.refused(WRITE_THROUGH_BELOW);
        assert_eq!(read(), PAGE);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
