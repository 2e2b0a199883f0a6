//! Reads: one live copy of each chunk, spread by chunk index, moving to another copy when one
//! fails; EIO only when none is left. An encoded chunk is read from the data fragments that
//! hold the range, or decoded from any K fragments when one of those is gone (`coding`).

use super::*;

impl DataStore {
    pub(super) fn live_copies<'c>(
        &'c self,
        c: &'c Chunk,
    ) -> impl Iterator<Item = &'c Replica> + 'c {
        c.replicas()
            .iter()
            .filter(|r| self.pool.is_live(ServerId(r.server)))
    }

    /// The copy of chunk `idx` to read: a live one not in `avoid`, spread over the copies by
    /// chunk index (so a large read of several chunks uses every server holding them).
    pub(super) fn pick(&self, c: &Chunk, idx: u64, avoid: &[u32]) -> Option<Replica> {
        let live: Vec<&Replica> = self
            .live_copies(c)
            .filter(|r| !avoid.contains(&r.server))
            .collect();
        if live.is_empty() {
            return None;
        }
        Some(*live[(idx % live.len() as u64) as usize])
    }

    /// Splits `[offset, offset+len)` into per-chunk pieces: `(chunk index, offset in chunk,
    /// length, offset in the range)`.
    pub(super) fn pieces(
        &self,
        offset: u64,
        len: u64,
    ) -> impl Iterator<Item = (u64, u64, u64, u64)> + '_ {
        let cs = self.chunk_size;
        let mut pos = offset;
        let end = offset + len;
        std::iter::from_fn(move || {
            if pos >= end {
                return None;
            }
            let idx = pos / cs;
            let in_chunk = pos % cs;
            let n = (cs - in_chunk).min(end - pos);
            let piece = (idx, in_chunk, n, pos - offset);
            pos += n;
            Some(piece)
        })
    }

    /// Reads `len` file bytes at `offset`. Up to [`IO_SIZE`] (a FUSE read) they stay in the
    /// pooled buffer the fabric read them into, and go on from there without another copy.
    pub(super) fn read_buf(
        &self,
        chunks: &ChunkMap,
        offset: u64,
        len: usize,
    ) -> Result<ReadBuf<'_>> {
        if len > IO_SIZE {
            let mut out = vec![0u8; len];
            self.read(chunks, offset, &mut out)?;
            return Ok(ReadBuf(ReadBytes::Owned(out)));
        }
        let loan = self.loan()?;
        self.read_window(chunks, offset, len, loan.bounce())?;
        Ok(ReadBuf(ReadBytes::Loaned(loan, len)))
    }

    /// Reads file bytes at `offset` into `out`.
    pub(super) fn read(&self, chunks: &ChunkMap, offset: u64, out: &mut [u8]) -> Result<()> {
        let loan = self.loan()?;
        let b = loan.bounce();
        for (w, window) in out.chunks_mut(IO_SIZE).enumerate() {
            self.read_window(chunks, offset + (w * IO_SIZE) as u64, window.len(), b)?;
            b.buf.read_at(0, window);
        }
        Ok(())
    }

    /// Reads `len` (at most [`IO_SIZE`]) file bytes at `woff` into the start of `b`, holes as
    /// zeros. A copy that fails is avoided and the window read again from the others.
    pub(super) fn read_window(
        &self,
        chunks: &ChunkMap,
        woff: u64,
        len: usize,
        b: &Bounce,
    ) -> Result<()> {
        let base = b.buf.addr();
        self.zero_holes(chunks, woff, len as u64, b, 0);
        let mut avoid: Vec<u32> = Vec::new();
        loop {
            let mut ops = Vec::new();
            // Parts of encoded chunks in a fragment that is gone: decoded after the batch.
            let mut degraded = Vec::new();
            self.read_ops(
                chunks,
                woff,
                len as u64,
                base,
                &avoid,
                &mut ops,
                &mut degraded,
            )?;
            // The first lost part's missing shards are read in this batch too (a degraded
            // sequential read: one lost fragment per chunk).
            let early = match degraded.first() {
                Some((idx, part)) => self.early_decode(&chunks[idx], *idx, part, b, &avoid)?,
                None => None,
            };
            let mut ranges = Vec::with_capacity(2);
            if let Some(e) = early.as_ref().filter(|e| !e.ops.is_empty()) {
                ranges.push(e.pinned_range());
                ops.extend_from_slice(&e.ops);
            }
            let done = match ops.is_empty() {
                true => Ok(()),
                false => {
                    ranges.push((base, len as u64));
                    self.run_ops_pinned(self.pin_all(&ranges)?, &ops)
                }
            };
            match done {
                Ok(()) => {
                    let mut rest = degraded.iter();
                    if let Some(e) = early {
                        let (idx, part) = rest.next().expect("planned from the first");
                        self.finish_early_decode(&chunks[idx], *idx, part, e, b)?;
                    }
                    for (idx, part) in rest {
                        self.read_lost_part(&chunks[idx], *idx, part, b, &avoid)?;
                    }
                    return Ok(());
                }
                Err(e) => self.avoid_failed(e, &mut avoid)?,
            }
        }
    }

    /// Zeroes what no chunk covers of `[woff, woff+len)` read to `at` in `b` (the buffer is
    /// reused).
    fn zero_holes(&self, chunks: &ChunkMap, woff: u64, len: u64, b: &Bounce, at: u64) {
        for (idx, in_chunk, n, off) in self.pieces(woff, len) {
            let covered = covered(chunks, idx, in_chunk, n);
            if covered < n {
                b.buf
                    .zero((at + off + covered) as usize, (n - covered) as usize);
            }
        }
    }

    /// The reads of `[woff, woff+len)` to local address `dst`: one op per piece from a live
    /// copy not in `avoid` (or from the data fragments holding it), and the parts of encoded
    /// chunks whose fragment is gone (to decode).
    #[allow(clippy::too_many_arguments)]
    fn read_ops(
        &self,
        chunks: &ChunkMap,
        woff: u64,
        len: u64,
        dst: u64,
        avoid: &[u32],
        ops: &mut Vec<RemoteOp>,
        degraded: &mut Vec<(u64, super::coding::LostPart)>,
    ) -> Result<()> {
        for (idx, in_chunk, n, at) in self.pieces(woff, len) {
            let covered = covered(chunks, idx, in_chunk, n);
            if covered == 0 {
                continue;
            }
            let c = &chunks[&idx];
            if c.stripe().is_some() {
                let (reads, lost) = self.fragment_reads(c, in_chunk, covered, dst + at, avoid);
                ops.extend(reads);
                degraded.extend(lost.into_iter().map(|part| (idx, part)));
                continue;
            }
            let copy = self.pick(c, idx, avoid).ok_or_else(|| lost(idx))?;
            ops.push(RemoteOp {
                opcode: Opcode::Read,
                local: Sge {
                    addr: dst + at,
                    len: covered,
                    lkey: 0,
                },
                remote: region(c, &copy),
                offset: in_chunk,
            });
        }
        Ok(())
    }

    /// A batch failed: its server is avoided from now on (the caller reads again), unless it
    /// was avoided already or no server is named (the error is the read's).
    pub(super) fn avoid_failed(
        &self,
        e: crate::client::PoolError,
        avoid: &mut Vec<u32>,
    ) -> Result<()> {
        match e.failed_server() {
            Some(s) if !avoid.contains(&s.0) => {
                log::warn!("read from {s} failed ({e}); reading another copy");
                avoid.push(s.0);
                Ok(())
            }
            _ => Err(e.into()),
        }
    }

    /// Reads many ranges at once (a program's `read_many`): `(chunks, offset, out)` each,
    /// holes as zeros. Ranges are packed into one loaned buffer, up to [`IO_SIZE`] at a
    /// time, and each pack's reads go out in one batch (every one in flight at once); a
    /// range longer than a pack is read alone.
    pub(super) fn read_ranges(&self, reads: &mut [(&ChunkMap, u64, &mut [u8])]) -> Result<()> {
        let loan = self.loan()?;
        let b = loan.bounce();
        let base = b.buf.addr();
        let mut i = 0;
        while i < reads.len() {
            if reads[i].2.len() > IO_SIZE {
                let (chunks, offset, out) = &mut reads[i];
                self.read(chunks, *offset, out)?;
                i += 1;
                continue;
            }
            // The pack: reads i..end, each at its offset in the buffer.
            let (mut end, mut used) = (i, 0);
            while end < reads.len() && used + reads[end].2.len() <= IO_SIZE {
                used += reads[end].2.len();
                end += 1;
            }
            let pack = &mut reads[i..end];
            let mut at = 0;
            let places: Vec<u64> = pack
                .iter()
                .map(|r| {
                    let p = at;
                    at += r.2.len() as u64;
                    p
                })
                .collect();
            for ((chunks, offset, out), &p) in pack.iter().zip(&places) {
                self.zero_holes(chunks, *offset, out.len() as u64, b, p);
            }
            let mut avoid = Vec::new();
            loop {
                let (mut ops, mut degraded) = (Vec::new(), Vec::new());
                let mut lost_in = Vec::new();
                for (n, ((chunks, offset, out), &p)) in pack.iter().zip(&places).enumerate() {
                    let before = degraded.len();
                    let len = out.len() as u64;
                    self.read_ops(
                        chunks,
                        *offset,
                        len,
                        base + p,
                        &avoid,
                        &mut ops,
                        &mut degraded,
                    )?;
                    lost_in.extend(std::iter::repeat_n(n, degraded.len() - before));
                }
                let done = match ops.is_empty() {
                    true => Ok(()),
                    false => self.run_ops(self.pin(base, used as u64)?, &ops),
                };
                match done {
                    Ok(()) => {
                        for ((idx, part), n) in degraded.iter().zip(&lost_in) {
                            let chunks = pack[*n].0;
                            self.read_lost_part(&chunks[idx], *idx, part, b, &avoid)?;
                        }
                        break;
                    }
                    Err(e) => self.avoid_failed(e, &mut avoid)?,
                }
            }
            for ((_, _, out), &p) in pack.iter_mut().zip(&places) {
                b.buf.read_at(p as usize, out);
            }
            i = end;
        }
        Ok(())
    }
}

/// Of the piece `n` bytes long at `in_chunk` of chunk `idx`, what the chunk holds (the rest
/// is a hole: no chunk, or past a short chunk's end).
fn covered(chunks: &ChunkMap, idx: u64, in_chunk: u64, n: u64) -> u64 {
    chunks
        .get(&idx)
        .map_or(0, |c| c.len.saturating_sub(in_chunk).min(n))
}
