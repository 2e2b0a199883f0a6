//! Capacity: what `statfs` reports (the whole chunks the live servers can still place), and
//! the write-through decision it feeds under the writeback cache.

use super::{Fs, StatFs, BLOCK};
use crate::meta::NAME_MAX;

/// The most chunks that fit, each with `copies` copies on distinct servers, when server `i`
/// has room for `per_server[i]` chunks: the largest `n` with `sum(min(room, n)) >= copies * n`
/// (a server can hold at most one copy of each chunk).
pub fn placeable_chunks(per_server: &[u64], copies: u64) -> u64 {
    let fits = |n: u64| {
        per_server
            .iter()
            .map(|&r| r.min(n))
            .fold(0u64, u64::saturating_add)
            >= copies.saturating_mul(n)
    };
    let (mut lo, mut hi) = (0u64, per_server.iter().sum::<u64>() / copies.max(1));
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

impl Fs {
    /// Capacity as a program can use it: the whole chunks the servers that are up can still
    /// take, with every chunk's copies on distinct servers, so that what `statfs` calls free
    /// can be allocated (a partly used chunk's room counts for nothing; fragmentation inside
    /// a server's arena is not seen, its free bytes are taken as whole chunks).
    pub fn statfs(&self) -> StatFs {
        // Frees go out without waiting (an unlink makes no round trip): their answers carry
        // the capacity this counts.
        self.data.settle_frees(crate::config::STATFS_FREES_WAIT);
        self.statfs_as_heard()
    }

    /// [`Fs::statfs`] from the capacity last heard, frees still in flight not counted (for
    /// decisions that must not wait, such as [`Fs::direct_writes`] on every open).
    fn statfs_as_heard(&self) -> StatFs {
        let cs = self.data.chunk_size();
        let up = self.data.live_capacity();
        let copies = self.data.replicas().min(up.len()).max(1) as u64;
        let chunks = |bytes: fn(&crate::data::ServerRoom) -> u64| {
            let per_server: Vec<u64> = up.iter().map(|c| bytes(c) / cs).collect();
            placeable_chunks(&per_server, copies)
        };
        let files = self.inode_count() as u64;
        StatFs {
            block_size: BLOCK as u32,
            blocks: chunks(|c| c.total) * (cs / BLOCK),
            blocks_free: chunks(|c| c.free) * (cs / BLOCK),
            // Metadata is local and bounded only by the daemon's memory.
            files: files + (1 << 32),
            files_free: 1 << 32,
            name_max: NAME_MAX as u32,
        }
    }

    /// Whether a handle opened for writing now should bypass the kernel's writeback cache.
    /// Cached writes meet a full pool only when written back, and the kernel reports that
    /// at `fsync` or `close`: with the mount's dirty data kept below the pool's free room
    /// ([`crate::fs::dirty_limit`]), new handles write through only once the pool is nearly
    /// full; without (a user's mount), whenever the pool has less room than the mount may
    /// hold dirty. Writing through, ENOSPC comes back from `write` itself.
    pub fn direct_writes(&self) -> bool {
        if !self.config.writeback {
            return false;
        }
        let (room, low_water) = (self.free_room(), self.config.writeback_low_water);
        self.dirty_limit
            .get()
            .map_or(room < low_water, |limit| limit.direct(room, low_water))
    }

    /// Free bytes of file data the pool can still take, copies counted, as last heard.
    pub fn free_room(&self) -> u64 {
        let s = self.statfs_as_heard();
        s.blocks_free.saturating_mul(s.block_size as u64)
    }

    /// The dirty limit this mount keeps, in bytes (0: none kept).
    pub fn dirty_limit_bytes(&self) -> u64 {
        self.dirty_limit.get().map_or(0, |l| l.bytes())
    }

    /// Keeps the kernel's dirty data for this mount below the pool's free room from now on,
    /// through `limit` (the mount sets it once mounted).
    pub fn keep_dirty_limit(&self, limit: crate::fs::dirty_limit::DirtyLimit) {
        if self.config.writeback && self.dirty_limit.set(limit).is_ok() {
            self.follow_room();
        }
    }

    /// The pool refused a write for room (ENOSPC): writers still cached stop being throttled
    /// ([`crate::fs::dirty_limit::DirtyLimit::refused`]).
    pub fn pool_refused_room(&self) {
        if let Some(limit) = self.dirty_limit.get() {
            limit.refused(self.free_room());
        }
    }

    /// Brings the dirty limit in step with the pool's free room (the upkeep does this every
    /// heartbeat, so the limit follows room taken by other clients too).
    pub fn follow_room(&self) {
        if let Some(limit) = self.dirty_limit.get() {
            limit.follow(self.free_room());
        }
    }
}
