//! Writes: to every copy of the chunks a window touches, allocating or growing chunks on the
//! serial path (FRRWP's conditional path is in `frrwp`); a copy whose write fails leaves the
//! chunk before the write returns.

use super::*;

impl DataStore {
    /// Writes `payload` at file `offset`, allocating or growing chunks as needed. Returns once
    /// the bytes are in remote memory. A [`Payload::InPlace`] lies in memory that stays mapped
    /// for the life of this store (FUSE's request buffers): it is registered through the cache
    /// and sent as it is, without a bounce copy.
    pub(super) fn write(
        &self,
        chunks: &mut ChunkMap,
        offset: u64,
        payload: Payload<'_>,
    ) -> Result<()> {
        let stable = matches!(payload, Payload::InPlace(_));
        let data = payload.bytes();
        let loan = self.loan()?;
        let b = loan.bounce();
        for (w, window) in data.chunks(IO_SIZE).enumerate() {
            let woff = offset + (w * IO_SIZE) as u64;
            let wlen = window.len() as u64;
            if self.grow_first_writing(chunks, woff, window, stable, b) {
                continue;
            }
            // Chunks are made room for before the payload goes into the bounce buffer: growing
            // a short first chunk copies its old bytes through that same buffer. With FRRWP
            // only growth happens here; new chunks are allocated by the conditional path.
            for (idx, in_chunk, n, _) in self.pieces(woff, wlen) {
                let grow = chunks.get(&idx).is_some_and(|c| c.len < in_chunk + n);
                if grow || self.write_path == WritePath::Serial {
                    self.ensure(chunks, idx, in_chunk + n, b)?;
                }
            }
            let base = if stable {
                window.as_ptr() as u64
            } else {
                b.buf.write_at(0, window);
                b.buf.addr()
            };
            if self.write_path == WritePath::Frrwp {
                self.write_window_frrwp(chunks, woff, base, wlen, b)?;
                continue;
            }
            // Serial (Fig. 5): allocations were answered (above) before the buffer is
            // registered and the writes are posted.
            self.write_window(chunks, woff, base, wlen)?;
        }
        Ok(())
    }

    /// Writes one window (local bytes at `base`) to every copy of its chunks, which exist.
    pub(super) fn write_window(
        &self,
        chunks: &mut ChunkMap,
        woff: u64,
        base: u64,
        wlen: u64,
    ) -> Result<()> {
        let idxs: Vec<u64> = self.pieces(woff, wlen).map(|p| p.0).collect();
        self.write_replicated(chunks, &idxs, (base, wlen), |chunks| {
            self.window_ops(chunks, woff, base, wlen)
        })
    }

    /// Writes to every copy of the chunks `idxs`: `ops` builds the writes from the current
    /// metadata, from local memory `local` (address, length). First each chunk is healed
    /// ([`Self::heal`]); a copy whose write fails is then taken out of its chunk (while
    /// another copy remains) and the writes are run again on what is left, which is
    /// harmless (the same bytes to the same places). Returns once every listed copy holds
    /// the bytes; EIO if a chunk is left with fewer than `--min-replicas` copies, or a
    /// chunk's last copy fails.
    pub(super) fn write_replicated(
        &self,
        chunks: &mut ChunkMap,
        idxs: &[u64],
        local: (u64, u64),
        ops: impl Fn(&ChunkMap) -> Vec<RemoteOp>,
    ) -> Result<()> {
        let mut idxs = idxs.to_vec();
        idxs.dedup();
        // Every failed round takes one server's copies out, so this ends.
        for _round in 0..=MAX_REPLICAS * idxs.len().max(1) {
            for &idx in &idxs {
                self.heal(chunks, idx)?;
            }
            let ops = ops(chunks);
            if ops.is_empty() {
                return Ok(());
            }
            let e = match self.run_ops(self.pin(local.0, local.1)?, &ops) {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            let Some(server) = e.failed_server() else {
                return Err(e.into());
            };
            log::warn!("a write to {server} failed ({e}); its copies leave the chunks written");
            for &idx in &idxs {
                let last_copy = chunks.update(idx, |c| {
                    if c.on(server.0).is_none() {
                        return false;
                    }
                    if c.replicas().len() == 1 {
                        return true;
                    }
                    self.let_go(c, server.0);
                    false
                });
                if last_copy == Some(true) {
                    // The last copy: keep it listed (a read must fail, not see a hole).
                    return Err(e.into());
                }
            }
        }
        Err(Error::new(libc::EIO, "a write kept failing on every copy"))
    }

    /// New copies of a chunk of `len` bytes: `--replicas` of them, or one per live server if
    /// fewer are up; ENOSPC if the live servers cannot hold that many, EIO if that is fewer
    /// than `--min-replicas`.
    pub(super) fn place(&self, len: u64) -> Result<Vec<RemoteRegion>> {
        let regions = match self.stocked(len) {
            Some(r) => r,
            None => self.pool.alloc_replicas(len, self.replicas(), &[])?,
        };
        if regions.len() < self.min_replicas {
            self.pool.free_all(&regions);
            return Err(Error::new(
                libc::EIO,
                format!(
                    "only {} memory servers are up; --min-replicas is {}",
                    regions.len(),
                    self.min_replicas
                ),
            ));
        }
        Ok(regions)
    }

    /// Extents for every copy of a new chunk of `len` bytes from the pool's stock (no round
    /// trip), if it holds them on enough servers.
    pub(super) fn stocked(&self, len: u64) -> Option<Vec<RemoteRegion>> {
        self.pool
            .take_stocked(len, self.replicas(), self.min_replicas)
    }

    /// Write ops for a window whose chunks all exist: one per piece and copy.
    pub(super) fn window_ops(
        &self,
        chunks: &ChunkMap,
        woff: u64,
        base: u64,
        wlen: u64,
    ) -> Vec<RemoteOp> {
        let mut ops = Vec::new();
        for (idx, in_chunk, n, at) in self.pieces(woff, wlen) {
            let c = &chunks[&idx];
            for copy in c.replicas() {
                ops.push(RemoteOp {
                    opcode: Opcode::Write,
                    local: Sge {
                        addr: base + at,
                        len: n,
                        lkey: 0,
                    },
                    remote: region(c, copy),
                    offset: in_chunk,
                });
            }
        }
        ops
    }

    /// The length to give chunk `idx` so it covers `needed` bytes, growing from `current`.
    /// A first chunk that must grow is given twice what is needed (at least twice what it
    /// had): a file written in small appends without the writeback cache (a shared volume's
    /// `tar x`, in 10 KiB records) would otherwise move its bytes at nearly every write (a
    /// move is an allocation, a copy and a free, about 600 µs here against 150 for an
    /// append that fits). Room left stays within what doubling leaves: under half the chunk.
    pub(super) fn target_len(&self, idx: u64, current: u64, needed: u64) -> u64 {
        if idx > 0 {
            return self.chunk_size;
        }
        let page = page_size() as u64;
        let grown = match current {
            0 => needed,
            _ => needed.saturating_mul(2),
        };
        (grown.div_ceil(page) * page)
            .max(current * 2)
            .min(self.chunk_size)
    }

    /// Grows a short first chunk and writes a window that lies in it alone, in one round of
    /// writes: its old bytes are read into `b`, then written to the new extents beside the
    /// window (a read and a write, where a move and then the window's write cost a read and
    /// two writes). A file written in small appends without the writeback cache (a shared
    /// volume's `tar x`) grows its first chunk at nearly its second write. False, with
    /// nothing changed, where it does not apply or a step fails: the caller then moves the
    /// chunk and writes as before (which takes a failed copy out, or reports the error),
    /// the old chunk untouched and the new extents given back.
    fn grow_first_writing(
        &self,
        chunks: &mut ChunkMap,
        woff: u64,
        window: &[u8],
        stable: bool,
        b: &Bounce,
    ) -> bool {
        let (wlen, end) = (window.len() as u64, woff + window.len() as u64);
        let Some(old) = chunks.get(&0).cloned() else {
            return false;
        };
        // The old bytes the window does not cover, and the window unless it is sent from
        // where it lies, side by side in the buffer.
        let kept = old.len.min(woff);
        let in_buffer = kept + if stable { 0 } else { wlen };
        if end > self.chunk_size
            || old.len >= end
            || old.stripe().is_some()
            || in_buffer > b.buf.len() as u64
        {
            return false;
        }
        let Ok(regions) = self.place(self.target_len(0, old.len, end)) else {
            return false;
        };
        let base = b.buf.addr();
        let wrote = (|| -> Result<()> {
            if kept > 0 {
                let copy = self.pick(&old, 0, &[]).ok_or_else(|| lost(0))?;
                let read = RemoteOp {
                    opcode: Opcode::Read,
                    local: Sge {
                        addr: base,
                        len: kept,
                        lkey: 0,
                    },
                    remote: region(&old, &copy),
                    offset: 0,
                };
                self.run_ops(self.pin(base, kept)?, &[read])?;
            }
            let at = match stable {
                true => window.as_ptr() as u64,
                false => {
                    b.buf.write_at(kept as usize, window);
                    base + kept
                }
            };
            let mut ranges = Vec::with_capacity(2);
            if in_buffer > 0 {
                ranges.push((base, in_buffer));
            }
            if stable {
                ranges.push((at, wlen));
            }
            let pinned = self.pin_all(&ranges)?;
            let mut writes = Vec::with_capacity(2 * regions.len());
            for remote in &regions {
                let piece = |addr, len, offset| RemoteOp {
                    opcode: Opcode::Write,
                    local: Sge { addr, len, lkey: 0 },
                    remote: *remote,
                    offset,
                };
                if kept > 0 {
                    writes.push(piece(base, kept, 0));
                }
                writes.push(piece(at, wlen, woff));
            }
            Ok(self.run_ops_pinned(pinned, &writes)?)
        })();
        match wrote {
            Ok(()) => {
                self.free_chunk(&old);
                chunks.insert(0, chunk_of(&regions));
                true
            }
            Err(e) => {
                log::debug!("growing a first chunk with its write: {e}; moved, then written");
                self.pool.free_all(&regions);
                false
            }
        }
    }

    /// Makes chunk `idx` at least `needed` bytes long: allocates it (every copy), or moves a
    /// short first chunk into larger extents (copying its bytes through `b`).
    pub(super) fn ensure(
        &self,
        chunks: &mut ChunkMap,
        idx: u64,
        needed: u64,
        b: &Bounce,
    ) -> Result<()> {
        let current = chunks.get(&idx).cloned();
        if current.as_ref().is_some_and(|c| c.len >= needed) {
            return Ok(());
        }
        let len = self.target_len(idx, current.as_ref().map_or(0, |c| c.len), needed);
        let mut regions = self.place(len)?;
        if let Some(old) = current {
            if let Err(e) = self.copy_chunk(&old, &mut regions, b) {
                self.pool.free_all(&regions);
                return Err(e);
            }
            self.free_chunk(&old);
        }
        chunks.insert(idx, chunk_of(&regions));
        Ok(())
    }
}
