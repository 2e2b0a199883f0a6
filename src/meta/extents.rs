//! A regular file's extent map: chunk index to remote chunk, and the bytes it holds
//! (`st_blocks`).
//!
//! The map changes only through [`ChunkMap`]'s mutators, which keep the held-bytes count in
//! step and log each change: whoever changes a map hands that log to the namespace in the
//! batch of the operation that made it ([`super::batch::Batch::extents`]), so a journal sees
//! every chunk change. Reads use the map like a `BTreeMap`.

use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::{Arc, RwLock};
use std::collections::BTreeMap;

pub use super::stripe::{Coding, Redundancy, Stripe};

/// Most copies of a chunk a mount keeps (`--replicas`): four survive any three failures, as
/// an `ec:K+3` code's stripes do (its data being written keeps four copies), and every
/// further copy costs a full write to one more server.
pub const MAX_REPLICAS: usize = 4;

/// One copy of a chunk: an extent on one memory server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Replica {
    pub server: u32,
    pub addr: u64,
    pub rkey: u64,
}

/// One remote chunk of a file: `len` bytes of server memory, on every replica, holding the
/// file bytes from the chunk's start offset. `len` may be less than the chunk size (a small
/// file's only chunk). Every listed replica holds the chunk's current bytes: a replica that
/// misses a write is taken out of the list before that write is acknowledged. An encoded
/// chunk has no replica but a [`Stripe`] of fragments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub len: u64,
    count: u8,
    replicas: [Replica; MAX_REPLICAS],
    stripe: Option<Arc<Stripe>>,
}

impl Chunk {
    /// A chunk of `len` bytes with no replica yet.
    pub fn new(len: u64) -> Chunk {
        Chunk {
            len,
            count: 0,
            replicas: [Replica::default(); MAX_REPLICAS],
            stripe: None,
        }
    }

    /// A chunk of `len` bytes held by `replicas` (at most [`MAX_REPLICAS`] are kept).
    pub fn with_replicas(len: u64, replicas: &[Replica]) -> Chunk {
        let mut c = Chunk::new(len);
        for r in replicas {
            c.add(*r);
        }
        c
    }

    /// A chunk of `len` bytes held as the fragments of `stripe`.
    pub fn encoded(len: u64, stripe: Stripe) -> Chunk {
        Chunk {
            stripe: Some(Arc::new(stripe)),
            ..Chunk::new(len)
        }
    }

    /// The fragments of an encoded chunk.
    pub fn stripe(&self) -> Option<&Stripe> {
        self.stripe.as_deref()
    }

    /// The copies (none for an encoded chunk).
    pub fn replicas(&self) -> &[Replica] {
        &self.replicas[..self.count as usize]
    }

    /// Every extent that holds a part of the chunk: its copies, or its fragments.
    pub fn extents(&self) -> Vec<Replica> {
        match self.stripe() {
            Some(s) => s.present().map(|(_, r)| r).collect(),
            None => self.replicas().to_vec(),
        }
    }

    /// The bytes each of [`Chunk::extents`] is long.
    pub fn extent_len(&self) -> u64 {
        self.stripe().map_or(self.len, |s| s.frag_len)
    }

    /// Adds a replica; false if the chunk has [`MAX_REPLICAS`] already, one on that server,
    /// or is encoded.
    pub fn add(&mut self, r: Replica) -> bool {
        if self.stripe.is_some()
            || self.count as usize == MAX_REPLICAS
            || self.on(r.server).is_some()
        {
            return false;
        }
        self.replicas[self.count as usize] = r;
        self.count += 1;
        true
    }

    /// The replica (or fragment) on `server`, if any.
    pub fn on(&self, server: u32) -> Option<Replica> {
        match self.stripe() {
            Some(s) => s.present().map(|(_, r)| r).find(|r| r.server == server),
            None => self.replicas().iter().find(|r| r.server == server).copied(),
        }
    }

    /// Takes the replica on `server` out (it missed a write or its server is gone); of an
    /// encoded chunk, the fragment there is marked lost (the others keep their positions).
    pub fn remove(&mut self, server: u32) -> Option<Replica> {
        if let Some(s) = &mut self.stripe {
            let i = s
                .frags
                .iter()
                .position(|f| f.is_some_and(|r| r.server == server))?;
            return Arc::make_mut(s).frags[i].take();
        }
        let i = self.replicas().iter().position(|r| r.server == server)?;
        let r = self.replicas[i];
        self.replicas.copy_within(i + 1..self.count as usize, i);
        self.count -= 1;
        // The slot let go of is cleared: chunks with the same copies compare equal (a change
        // of a chunk map is one only if something listed changed: `ChunkMap::update`).
        self.replicas[self.count as usize] = Replica::default();
        Some(r)
    }

    /// The chunk with each extent's server renumbered by `to` (none: that server's extents
    /// are gone: copies leave the list, fragments are marked lost).
    pub fn renumbered(&self, to: impl Fn(u32) -> Option<u32>) -> Chunk {
        let moved = |r: &Replica| {
            Some(Replica {
                server: to(r.server)?,
                ..*r
            })
        };
        match self.stripe() {
            Some(s) => Chunk::encoded(
                self.len,
                Stripe {
                    frags: s.frags.iter().map(|f| f.as_ref().and_then(moved)).collect(),
                    ..s.clone()
                },
            ),
            None => {
                let copies: Vec<Replica> = self.replicas().iter().filter_map(moved).collect();
                Chunk::with_replicas(self.len, &copies)
            }
        }
    }

    /// Gives the extent on `server` the key `rkey` (its server restarted with new keys).
    pub fn rekey(&mut self, server: u32, rkey: u64) {
        if let Some(s) = &mut self.stripe {
            for r in Arc::make_mut(s).frags.iter_mut().flatten() {
                if r.server == server {
                    r.rkey = rkey;
                }
            }
            return;
        }
        if let Some(r) = self.replicas[..self.count as usize]
            .iter_mut()
            .find(|r| r.server == server)
        {
            r.rkey = rkey;
        }
    }
}

/// One change to an extent map: chunk `idx` is now `chunk` (none: gone). `before` is what
/// it replaced, so a change the namespace refused can be undone ([`ChunkMap::undo`]); only
/// `idx` and `chunk` are recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtentChange {
    pub idx: u64,
    pub chunk: Option<Chunk>,
    pub before: Option<Chunk>,
}

/// A file's chunks by index. Every change goes through a mutator here: it keeps `held`
/// (shared with the file's [`FileData`], read by `stat` without this map's lock) and logs the
/// change for the namespace (see the module doc).
#[derive(Debug, Default)]
pub struct ChunkMap {
    map: BTreeMap<u64, Chunk>,
    held: Arc<AtomicU64>,
    log: Vec<ExtentChange>,
    /// The bytes past the file's size, in the chunk it ends in, may not be zero (nor the same
    /// on every copy): a write there failed, or a crash cut an append before its record (a
    /// map a journal replayed). A grow zeroes them first (`data::shapes`), once.
    tail_unknown: bool,
}

impl ChunkMap {
    /// Whether the bytes past the file's end may hold what a failed append left.
    pub fn tail_unknown(&self) -> bool {
        self.tail_unknown
    }
    pub fn set_tail_unknown(&mut self, unknown: bool) {
        self.tail_unknown = unknown;
    }
    pub fn get(&self, idx: &u64) -> Option<&Chunk> {
        self.map.get(idx)
    }
    pub fn contains_key(&self, idx: &u64) -> bool {
        self.map.contains_key(idx)
    }
    pub fn range<R: std::ops::RangeBounds<u64>>(
        &self,
        range: R,
    ) -> std::collections::btree_map::Range<'_, u64, Chunk> {
        self.map.range(range)
    }
    pub fn iter(&self) -> std::collections::btree_map::Iter<'_, u64, Chunk> {
        self.map.iter()
    }
    pub fn values(&self) -> std::collections::btree_map::Values<'_, u64, Chunk> {
        self.map.values()
    }
    pub fn len(&self) -> usize {
        self.map.len()
    }
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn account(&self, added: u64, removed: u64) {
        if added >= removed {
            self.held.fetch_add(added - removed, Ordering::Relaxed);
        } else {
            self.held.fetch_sub(removed - added, Ordering::Relaxed);
        }
    }

    /// Sets chunk `idx`, returning the one it replaces.
    pub fn insert(&mut self, idx: u64, chunk: Chunk) -> Option<Chunk> {
        let len = chunk.len;
        let old = self.map.insert(idx, chunk.clone());
        self.account(len, old.as_ref().map_or(0, |c| c.len));
        self.log.push(ExtentChange {
            idx,
            chunk: Some(chunk),
            before: old.clone(),
        });
        old
    }

    /// Takes chunk `idx` out of the map.
    pub fn remove(&mut self, idx: &u64) -> Option<Chunk> {
        let old = self.map.remove(idx)?;
        self.account(0, old.len);
        self.log.push(ExtentChange {
            idx: *idx,
            chunk: None,
            before: Some(old.clone()),
        });
        Some(old)
    }

    /// Changes chunk `idx` in place (its copies, its length); none if there is no such chunk.
    pub fn update<R>(&mut self, idx: u64, change: impl FnOnce(&mut Chunk) -> R) -> Option<R> {
        let c = self.map.get_mut(&idx)?;
        let before = c.clone();
        let r = change(c);
        let after = c.clone();
        if after != before {
            self.account(after.len, before.len);
            self.log.push(ExtentChange {
                idx,
                chunk: Some(after),
                before: Some(before),
            });
        }
        Some(r)
    }

    /// Changes every chunk in place (see [`ChunkMap::update`]).
    pub fn update_all(&mut self, mut change: impl FnMut(&mut Chunk)) {
        let idxs: Vec<u64> = self.map.keys().copied().collect();
        for idx in idxs {
            self.update(idx, &mut change);
        }
    }

    /// Takes every copy on `server` out (it lost them: it restarted empty); how many. A chunk
    /// left with no copy stays listed, so reads of it fail instead of reading a hole.
    pub fn forget_server(&mut self, server: u32) -> u64 {
        let mut n = 0;
        self.update_all(|c| {
            if c.remove(server).is_some() {
                n += 1;
            }
        });
        n
    }

    /// Takes the chunks at `from` and above out, in order.
    pub fn split_off(&mut self, from: u64) -> Vec<(u64, Chunk)> {
        let idxs: Vec<u64> = self.map.range(from..).map(|(i, _)| *i).collect();
        idxs.into_iter()
            .filter_map(|i| Some((i, self.remove(&i)?)))
            .collect()
    }

    /// Empties the map of a file that is going away, unlogged: the inode's drop is the
    /// namespace's record of it.
    pub fn take_all(&mut self) -> BTreeMap<u64, Chunk> {
        self.held.store(0, Ordering::Relaxed);
        self.log.clear();
        std::mem::take(&mut self.map)
    }

    /// Sets chunk `idx` as a committed change says (none: gone), unlogged: the change is in
    /// the journal already (a replay, a follower's).
    pub fn apply(&mut self, idx: u64, chunk: Option<Chunk>) {
        match chunk {
            Some(c) => {
                self.insert(idx, c);
            }
            None => {
                self.remove(&idx);
            }
        }
        self.take_log();
    }

    /// The changes since the last call, for the namespace's batch.
    pub fn take_log(&mut self) -> Vec<ExtentChange> {
        std::mem::take(&mut self.log)
    }

    /// Undoes `log` (changes taken from this map that the namespace refused), last first,
    /// unlogged.
    pub fn undo(&mut self, log: &[ExtentChange]) {
        let pending = std::mem::take(&mut self.log);
        for e in log.iter().rev() {
            self.apply(e.idx, e.before.clone());
        }
        self.log = pending;
    }

    /// Whether changes wait to be handed to the namespace.
    pub fn has_log(&self) -> bool {
        !self.log.is_empty()
    }
}

impl std::ops::Index<&u64> for ChunkMap {
    type Output = Chunk;
    fn index(&self, idx: &u64) -> &Chunk {
        &self.map[idx]
    }
}

impl FromIterator<(u64, Chunk)> for ChunkMap {
    fn from_iter<I: IntoIterator<Item = (u64, Chunk)>>(iter: I) -> ChunkMap {
        let mut m = ChunkMap::default();
        for (idx, c) in iter {
            m.insert(idx, c);
        }
        m.log.clear();
        m
    }
}

/// A regular file's data: its extent map, under its own lock so that data I/O never holds
/// the metadata lock; the lock is held across the remote I/O that uses the chunks, so a
/// truncate cannot free a chunk while a read or write is using it.
#[derive(Debug)]
pub struct FileData {
    pub chunks: RwLock<ChunkMap>,
    /// Bytes the chunks hold (of one copy): `st_blocks`, kept by the map's mutators.
    held: Arc<AtomicU64>,
    /// When a write last changed the file's bytes, in milliseconds since [`epoch`] (0:
    /// not since this process started): an erasure code encodes only files left alone.
    changed_ms: AtomicU64,
}

/// The process's start, as [`FileData`]'s change times count it.
fn epoch() -> std::time::Instant {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *START.get_or_init(std::time::Instant::now)
}

impl Default for FileData {
    fn default() -> FileData {
        let map = ChunkMap::default();
        FileData {
            held: map.held.clone(),
            chunks: RwLock::new(map),
            changed_ms: AtomicU64::new(0),
        }
    }
}

impl FileData {
    /// The data of a file a journal replay makes: whatever an append the crash cut wrote
    /// past its size may still be there.
    pub fn replayed() -> FileData {
        let f = FileData::default();
        f.chunks.write().set_tail_unknown(true);
        f
    }

    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// A write is changing the file's bytes now.
    pub fn touch(&self) {
        let ms = epoch().elapsed().as_millis() as u64;
        self.changed_ms.store(ms.max(1), Ordering::Relaxed);
    }

    /// How long since a write last changed the file's bytes (since the process started, if
    /// none did).
    pub fn changed_ago(&self) -> std::time::Duration {
        let then = std::time::Duration::from_millis(self.changed_ms.load(Ordering::Relaxed));
        epoch().elapsed().saturating_sub(then)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy taken out leaves nothing behind: the chunk equals one made with the copies
    /// left, so a map whose chunk lost a copy and got it back logs no change.
    #[test]
    fn a_chunk_without_a_copy_equals_one_made_without_it() {
        let r = |server| Replica {
            server,
            addr: 0x1000 * u64::from(server + 1),
            rkey: 7,
        };
        let mut c = Chunk::with_replicas(4096, &[r(0), r(1), r(2)]);
        assert_eq!(c.remove(1), Some(r(1)));
        assert_eq!(c, Chunk::with_replicas(4096, &[r(0), r(2)]));
        assert_eq!(c.remove(2), Some(r(2)));
        assert!(c.add(r(2)));
        assert_eq!(c, Chunk::with_replicas(4096, &[r(0), r(2)]));
    }

    fn chunk(len: u64, server: u32) -> Chunk {
        Chunk::with_replicas(
            len,
            &[Replica {
                server,
                addr: 0x1000,
                rkey: 1,
            }],
        )
    }

    #[test]
    fn every_change_is_logged_and_counted_in_held() {
        let f = FileData::default();
        let mut m = f.chunks.write();
        m.insert(0, chunk(100, 0));
        m.insert(1, chunk(50, 1));
        assert_eq!(f.held(), 150);
        m.update(0, |c| c.len = 40);
        assert_eq!(f.held(), 90);
        // An update that changes nothing logs nothing.
        m.update(1, |_| ());
        m.remove(&1);
        assert_eq!(f.held(), 40);
        let log = m.take_log();
        let idxs: Vec<_> = log
            .iter()
            .map(|e| (e.idx, e.chunk.as_ref().map(|c| c.len)))
            .collect();
        assert_eq!(
            idxs,
            vec![(0, Some(100)), (1, Some(50)), (0, Some(40)), (1, None)]
        );
        assert!(!m.has_log());
        m.insert(5, chunk(10, 0));
        assert_eq!(m.split_off(1).len(), 1);
        assert_eq!((f.held(), m.len()), (40, 1));
        m.take_all();
        assert_eq!(f.held(), 0);
    }

    #[test]
    fn refused_changes_are_undone_last_first() {
        let f = FileData::default();
        let mut m = f.chunks.write();
        m.insert(0, chunk(100, 0));
        m.take_log();
        let start: Vec<(u64, Chunk)> = m.iter().map(|(i, c)| (*i, c.clone())).collect();
        m.update(0, |c| c.len = 60);
        m.insert(0, chunk(80, 1));
        m.insert(3, chunk(10, 1));
        m.remove(&0);
        let log = m.take_log();
        m.insert(9, chunk(5, 0));
        m.undo(&log);
        let after: Vec<(u64, Chunk)> = m.iter().map(|(i, c)| (*i, c.clone())).collect();
        let mut want = start;
        want.push((9, chunk(5, 0)));
        assert_eq!(after, want);
        assert_eq!(f.held(), 105);
        // Changes made since are still to be logged; the undo logs nothing of its own.
        assert_eq!(m.take_log().len(), 1);
    }
}
