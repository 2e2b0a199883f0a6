//! Extent shapes: allocation (fallocate), truncation, punching, collapsing and inserting
//! ranges, and giving chunks back.

use super::*;

impl DataStore {
    /// Allocates every chunk covering `[offset, offset+len)` (fallocate), all or nothing.
    ///
    /// A range whose missing chunks cannot be placed (every copy of each on a distinct
    /// server, by the servers' room as last heard, and again after asking them) is refused
    /// with ENOSPC before anything is allocated: the cost of the check is bounded by the
    /// chunks the file already has and the servers, never by the range. What the check cannot
    /// see (fragmentation, other clients) may still refuse a chunk partway: the chunks this
    /// call allocated are then given back. A short first chunk is grown last, so a refusal
    /// before it leaves it as it was.
    pub(super) fn allocate(&self, chunks: &mut ChunkMap, offset: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let cs = self.chunk_size;
        let (first, last) = (offset / cs, (offset + len - 1) / cs);
        // The first chunk alone may be shorter than a chunk: its length, if it needs one.
        let head = if first == 0 {
            let needed = (offset + len).min(cs);
            let current = chunks.get(&0).map_or(0, |c| c.len);
            (current < needed).then(|| self.target_len(0, current, needed))
        } else {
            None
        };
        let from = first.max(1);
        let whole = if last >= from {
            last - from + 1 - chunks.range(from..=last).count() as u64
        } else {
            0
        };
        if !self.fits(head, whole) {
            self.pool.refresh();
            if !self.fits(head, whole) {
                return Err(Error::new(
                    libc::ENOSPC,
                    format!(
                        "fallocate needs {} copies of {} chunks on distinct memory servers; \
                         their free memory cannot hold them",
                        self.replicas(),
                        whole + head.is_some() as u64
                    ),
                ));
            }
        }
        let loan = self.loan()?;
        let mut added = Vec::new();
        let grow_head = head.is_some() && chunks.contains_key(&0);
        let mut res = Ok(());
        for (idx, in_chunk, n, _) in self.pieces(offset, len) {
            if chunks.contains_key(&idx) {
                continue;
            }
            res = self.ensure(chunks, idx, in_chunk + n, loan.bounce());
            if res.is_err() {
                break;
            }
            added.push(idx);
        }
        if res.is_ok() && grow_head {
            res = self.ensure(chunks, 0, (offset + len).min(cs), loan.bounce());
        }
        if res.is_err() {
            for idx in added {
                let c = chunks.remove(&idx).expect("added");
                self.free_chunk(&c);
            }
        }
        res
    }

    /// Whether the live servers' room as last heard can hold the copies of a first chunk of
    /// `head` bytes (if any) and of `whole` chunks of [`Self::chunk_size`]: every chunk's
    /// copies on distinct servers, as [`Pool::alloc_replicas`] places them. An upper bound
    /// (a server's free memory may be in pieces smaller than a chunk); O(servers).
    pub(super) fn fits(&self, head: Option<u64>, whole: u64) -> bool {
        let mut room = self.pool.room();
        // With fewer servers up than copies kept, one copy on each ([`Self::place`]).
        let copies = self.replicas().min(room.len());
        if copies == 0 {
            return head.is_none() && whole == 0;
        }
        if let Some(len) = head {
            // Placed first, on the servers with the most free memory that can hold it.
            room.sort_by(|a, b| {
                let fits = |r: &Room| r.largest_free.min(r.free) >= len;
                fits(b).cmp(&fits(a)).then(b.free.cmp(&a.free))
            });
            for r in &mut room[..copies] {
                if r.largest_free.min(r.free) < len {
                    return false;
                }
                r.free -= len;
            }
        }
        // Whole chunks on distinct servers fit if and only if each server, counted for at
        // most one copy of each chunk, makes up every copy: sum of min(room, chunks) >=
        // copies * chunks (greedy by most room, which is how placement goes, reaches it).
        let cs = self.chunk_size;
        let held: u64 = room
            .iter()
            .map(|r| {
                let n = if r.largest_free.min(r.free) >= cs {
                    r.free / cs
                } else {
                    0
                };
                n.min(whole)
            })
            .sum();
        held >= whole.saturating_mul(copies as u64)
    }

    /// Cuts the data to `size` bytes: zeroes the rest of the chunk it ends in (so a later
    /// extension reads zeros there), then frees whole chunks past it. The zeroing is what
    /// may fail (a remote write): it goes first, so a failed truncate frees nothing.
    pub(super) fn truncate(&self, chunks: &mut ChunkMap, size: u64) -> Result<()> {
        let cs = self.chunk_size;
        if !size.is_multiple_of(cs) && chunks.contains_key(&(size / cs)) {
            self.zero_in_chunk(chunks, size / cs, size % cs, cs)?;
        }
        let keep = size.div_ceil(cs);
        let gone: Vec<u64> = chunks.range(keep..).map(|(i, _)| *i).collect();
        for i in gone {
            let c = chunks.remove(&i).expect("listed");
            self.free_chunk(&c);
        }
        chunks.set_tail_unknown(false);
        Ok(())
    }

    /// Before a file of `size` bytes grows to show `[size, to)` (a write at `to` past its
    /// end, a truncate up to `to`, an allocation that moves the end to `to`): if what its
    /// chunks hold past `size` may be a failed append's bytes ([`ChunkMap::tail_unknown`]),
    /// zeroes that range on every copy, so the grown file reads zeros there. The cost follows
    /// the growth, never a preallocation past it; the flag goes once no chunk reaches past
    /// `to`.
    pub(super) fn zero_past_end(&self, chunks: &mut ChunkMap, size: u64, to: u64) -> Result<()> {
        if !chunks.tail_unknown() || to <= size {
            return Ok(());
        }
        let cs = self.chunk_size;
        let shown: Vec<u64> = chunks
            .range(size / cs..=(to - 1) / cs)
            .map(|(i, _)| *i)
            .collect();
        for idx in shown {
            let base = idx * cs;
            let from = size.saturating_sub(base);
            if from < chunks[&idx].len {
                self.zero_in_chunk(chunks, idx, from, (to - base).min(cs))?;
            }
        }
        let reach = chunks.iter().next_back().map_or(0, |(i, c)| i * cs + c.len);
        if to >= reach {
            chunks.set_tail_unknown(false);
        }
        Ok(())
    }

    /// Zeroes bytes `[from, to)` of chunk `idx` (as far as the chunk reaches) on every copy.
    pub(super) fn zero_in_chunk(
        &self,
        chunks: &mut ChunkMap,
        idx: u64,
        from: u64,
        to: u64,
    ) -> Result<()> {
        let zeros = self.zeros.buf.addr();
        self.write_replicated(chunks, &[idx], (zeros, IO_SIZE as u64), |chunks| {
            let c = &chunks[&idx];
            let mut ops = Vec::new();
            let mut at = from;
            let to = to.min(c.len);
            while at < to {
                let n = (to - at).min(IO_SIZE as u64);
                for copy in c.replicas() {
                    ops.push(RemoteOp {
                        opcode: Opcode::Write,
                        local: Sge {
                            addr: zeros,
                            len: n,
                            lkey: 0,
                        },
                        remote: region(c, copy),
                        offset: at,
                    });
                }
                at += n;
            }
            ops
        })
    }

    /// Punches a hole over file bytes `[offset, offset+len)`: the parts inside of the chunks
    /// it cuts (at most two) are zeroed, then the chunks wholly inside are given back to their
    /// servers; a failed zeroing (a remote write) returns before anything is freed. The cost
    /// follows the chunks the file has there, never the length of the range.
    pub(super) fn punch(&self, chunks: &mut ChunkMap, offset: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let cs = self.chunk_size;
        let end = offset.saturating_add(len);
        let mut whole = Vec::new();
        let inside: Vec<u64> = chunks
            .range(offset / cs..=(end - 1) / cs)
            .map(|(i, _)| *i)
            .collect();
        for idx in inside {
            let base = idx * cs;
            let from = offset.max(base) - base;
            let to = end.min(base + cs) - base;
            let c = chunks[&idx].clone();
            if from == 0 && to >= c.len {
                whole.push(idx);
            } else if from < c.len {
                self.zero_in_chunk(chunks, idx, from, to)?;
            }
        }
        for idx in whole {
            let c = chunks.remove(&idx).expect("listed");
            self.free_chunk(&c);
        }
        Ok(())
    }

    /// Moves every chunk at index `from` or above by `delta` chunks (down when negative):
    /// what collapse and insert do when their range is whole chunks. Chunks that would move
    /// below `from + delta` must be gone already.
    pub(super) fn shift_chunks(&self, chunks: &mut ChunkMap, from: u64, delta: i64) {
        let moving = chunks.split_off(from);
        for (idx, c) in moving {
            chunks.insert(idx.saturating_add_signed(delta), c);
        }
    }

    /// Copies file bytes `[src, src+len)` to `dst` through a bounce window, back to front
    /// when the destination lies above the source so nothing is overwritten before it is
    /// read. Holes are copied as zeros written (allocating where the destination has none).
    pub(super) fn copy_within(
        &self,
        chunks: &mut ChunkMap,
        src: u64,
        dst: u64,
        len: u64,
    ) -> Result<()> {
        let step = IO_SIZE as u64;
        let mut buf = vec![0u8; IO_SIZE];
        let windows = len.div_ceil(step);
        for w in 0..windows {
            let w = if dst > src { windows - 1 - w } else { w };
            let at = w * step;
            let n = (len - at).min(step) as usize;
            buf[..n].fill(0);
            self.read(chunks, src + at, &mut buf[..n])?;
            self.write(chunks, dst + at, Payload::Copy(&buf[..n]))?;
        }
        Ok(())
    }

    /// Removes file bytes `[offset, offset+len)` of a `size`-byte file, moving what follows
    /// down (`FALLOC_FL_COLLAPSE_RANGE`); the caller checked `offset + len < size`. Whole
    /// chunks are given back and the later ones renumbered; other ranges are copied.
    pub(super) fn collapse(
        &self,
        chunks: &mut ChunkMap,
        offset: u64,
        len: u64,
        size: u64,
    ) -> Result<()> {
        let cs = self.chunk_size;
        if offset.is_multiple_of(cs) && len.is_multiple_of(cs) {
            self.punch(chunks, offset, len)?;
            self.shift_chunks(chunks, (offset + len) / cs, -((len / cs) as i64));
            return Ok(());
        }
        // The copy writes every byte where it goes: the chunks there are allocated first
        // (all or nothing), so it does not run out of room after moving some bytes.
        self.allocate(chunks, offset, size - offset - len)?;
        self.copy_within(chunks, offset + len, offset, size - offset - len)?;
        self.truncate(chunks, size - len)
    }

    /// Opens a hole of `len` bytes at `offset` in a `size`-byte file, moving what follows up
    /// (`FALLOC_FL_INSERT_RANGE`); the caller checked `offset < size`. Whole chunks are
    /// renumbered; other ranges are copied and the opened range zeroed.
    pub(super) fn insert(
        &self,
        chunks: &mut ChunkMap,
        offset: u64,
        len: u64,
        size: u64,
    ) -> Result<()> {
        let cs = self.chunk_size;
        if offset.is_multiple_of(cs) && len.is_multiple_of(cs) {
            self.shift_chunks(chunks, offset / cs, (len / cs) as i64);
            return Ok(());
        }
        // As in collapse: room for every byte the copy writes, before it moves any.
        self.allocate(chunks, offset + len, size - offset)?;
        self.copy_within(chunks, offset, offset + len, size - offset)?;
        self.punch(chunks, offset, len)
    }

    /// Gives every copy of a chunk back once the operation is done (see `io::RETIRED`; a
    /// server that is gone took its memory with it).
    pub(super) fn free_chunk(&self, c: &Chunk) {
        for r in regions(c) {
            self.retire(r);
        }
    }

    /// Gives every chunk back (unlinked file, last close).
    pub fn release(&self, chunks: BTreeMap<u64, Chunk>) {
        for c in chunks.values() {
            self.free_chunk(c);
        }
    }
}
