//! Erasure-coded chunks (`--redundancy ec:K+M`): a chunk's bytes as K data fragments and M
//! parity fragments on K+M servers, so M servers may be lost for (K+M)/K times the data
//! instead of M+1 copies.
//!
//! Why chunks are encoded only once cold: a stripe is never written in place. Data being
//! written keeps M+1 copies (the same two-fault promise for 4+2); the encoder
//! (`upkeep::encode`) turns a chunk whose file no write has touched for
//! [`EC_COLD_AFTER`] into a stripe: fragments written to fresh extents, then the map switched
//! to them in one change, then the copies freed. A write, truncate or punch that reaches an
//! encoded chunk first makes it copies again ([`DataStore::thaw`]). So a stripe's fragments
//! always decode to the chunk's bytes: a crash between a fragment's write and its parity's
//! leaves fragments no map names (freed as any unnamed extent), never a torn stripe, and no
//! two updates of one stripe's parity can race.
//!
//! Reads: a byte range reads the data fragments that hold it (fragment `i` holds chunk bytes
//! `[i*f, (i+1)*f)`), one-sided as ever; a 4 KiB read touches one server. With a data
//! fragment's server down, any K fragments are read whole and decoded; the last decoded
//! stripe is kept, so a sequential read of a degraded chunk decodes it once.

use super::*;
use crate::config::{EC_FRAGMENT_ALIGN, EC_MIN_CHUNK};
use crate::meta::{Coding, FileData, Stripe};

/// The length of each fragment of a chunk of `len` bytes cut into `k`.
pub(super) fn frag_len(len: u64, k: u8) -> u64 {
    crate::fabric::mem::round_up(len.div_ceil(k as u64).max(1), EC_FRAGMENT_ALIGN)
}

/// The stripe last decoded, by its id (a degraded sequential read decodes it once).
#[derive(Default)]
pub(super) struct Decoded {
    last: Option<(u64, Arc<Vec<u8>>)>,
}

fn code_error(e: reed_solomon_simd::Error) -> Error {
    Error::new(libc::EIO, format!("erasure code: {e}"))
}

impl DataStore {
    /// Encodes cold chunks with `coding` (see the module doc).
    pub fn encoded(mut self, coding: Coding) -> DataStore {
        self.coding = Some(coding);
        self
    }

    /// Tests: the encoder stops for good between a stripe's fragments written and the map
    /// switched to them, as a daemon killed at that moment does.
    #[cfg(feature = "testing")]
    pub fn die_before_switch(&self) {
        self.die_before_switch.store(true, Ordering::Relaxed);
    }

    /// Counts a file cold once no write touched it for `after` (tests: at once; the mount
    /// keeps [`EC_COLD_AFTER`]).
    pub fn cold_after(mut self, after: std::time::Duration) -> DataStore {
        self.cold_after = after;
        self
    }

    /// The erasure code cold chunks are encoded with, if any.
    pub fn coding(&self) -> Option<Coding> {
        self.coding
    }

    /// Whether `file` has gone untouched by writes long enough to be encoded.
    pub fn is_cold(&self, file: &FileData) -> bool {
        file.changed_ago() >= self.cold_after
    }

    /// Whether chunk `c` is to be encoded: copies (all live) of at least [`EC_MIN_CHUNK`]
    /// bytes, on a store that encodes, with K+M servers up to take the fragments.
    fn encodable(&self, c: &Chunk) -> bool {
        let Some(coding) = self.coding else {
            return false;
        };
        c.stripe().is_none()
            && c.len >= EC_MIN_CHUNK
            && !c.replicas().is_empty()
            && self.live_copies(c).count() == c.replicas().len()
            && self.pool.placeable_servers() >= coding.width()
    }

    /// Chunk indexes of `chunks` the encoder would take.
    pub(super) fn to_encode(&self, chunks: &ChunkMap) -> Vec<u64> {
        chunks
            .iter()
            .filter(|(_, c)| self.encodable(c))
            .map(|(i, _)| *i)
            .collect()
    }

    /// Fragments of `s` on live servers, not in `avoid`.
    fn live_fragments<'s>(
        &'s self,
        s: &'s Stripe,
        avoid: &'s [u32],
    ) -> impl Iterator<Item = (usize, Replica)> + 's {
        s.present()
            .filter(|(_, r)| self.pool.is_live(ServerId(r.server)) && !avoid.contains(&r.server))
    }

    /// How many of `s`'s fragments are on live servers.
    pub(super) fn live_fragment_count(&self, s: &Stripe) -> usize {
        self.live_fragments(s, &[]).count()
    }

    /// Encodes chunk `idx` (the file's map locked, so no write races it): its bytes read
    /// from a copy, the parity computed, K+M fragments written to fresh extents on distinct
    /// servers, then the map switched to them and the copies let go of. Returns the bytes
    /// written (0: not encodable now; the chunk keeps its copies).
    pub(super) fn encode_chunk(&self, chunks: &mut ChunkMap, idx: u64) -> Result<u64> {
        let Some(c) = chunks.get(&idx).cloned() else {
            return Ok(0);
        };
        let Some(coding) = self.coding.filter(|_| self.encodable(&c)) else {
            return Ok(0);
        };
        let (k, m) = (coding.k as usize, coding.m as usize);
        let f = frag_len(c.len, coding.k);
        let mut bytes = vec![0u8; f as usize * k];
        self.read(chunks, idx * self.chunk_size, &mut bytes[..c.len as usize])?;
        let parity =
            reed_solomon_simd::encode(k, m, bytes.chunks(f as usize)).map_err(code_error)?;
        let regions = self.pool.alloc_replicas(f, k + m, &[])?;
        if regions.len() < k + m {
            self.pool.free_all(&regions);
            return Ok(0);
        }
        let frags: Vec<&[u8]> = bytes
            .chunks(f as usize)
            .chain(parity.iter().map(|p| p.as_slice()))
            .collect();
        if let Err(e) = self.write_fragments(&regions, &frags) {
            self.pool.free_all(&regions);
            return Err(e);
        }
        #[cfg(feature = "testing")]
        if self.die_before_switch.load(Ordering::Relaxed) {
            // The daemon dies here: fragments written, no map names them.
            return Err(Error::new(libc::EIO, "died before the map switch (test)"));
        }
        let mut id = [0u8; 8];
        getrandom::fill(&mut id).map_err(|e| Error::new(libc::EIO, format!("random id: {e}")))?;
        let stripe = Stripe {
            id: u64::from_le_bytes(id),
            k: coding.k,
            m: coding.m,
            frag_len: f,
            frags: regions.iter().map(|r| Some(replica(r))).collect(),
        };
        chunks.insert(idx, Chunk::encoded(c.len, stripe));
        self.free_chunk(&c);
        Ok(f * (k + m) as u64)
    }

    /// Writes `frags[i]` to `regions[i]`, as many at once as one bounce buffer holds.
    fn write_fragments(&self, regions: &[RemoteRegion], frags: &[&[u8]]) -> Result<()> {
        let loan = self.loan()?;
        let b = loan.bounce();
        let base = b.buf.addr();
        // (fragment, offset in it, bytes) pieces, packed into rounds of IO_SIZE.
        let mut round: Vec<RemoteOp> = Vec::new();
        let mut used = 0usize;
        let flush = |round: &mut Vec<RemoteOp>, used: &mut usize| -> Result<()> {
            if !round.is_empty() {
                self.run_ops(self.pin(base, *used as u64)?, round)?;
            }
            round.clear();
            *used = 0;
            Ok(())
        };
        for (remote, bytes) in regions.iter().zip(frags) {
            for (w, window) in bytes.chunks(IO_SIZE).enumerate() {
                if used + window.len() > IO_SIZE {
                    flush(&mut round, &mut used)?;
                }
                b.buf.write_at(used, window);
                round.push(RemoteOp {
                    opcode: Opcode::Write,
                    local: Sge {
                        addr: base + used as u64,
                        len: window.len() as u64,
                        lkey: 0,
                    },
                    remote: *remote,
                    offset: (w * IO_SIZE) as u64,
                });
                used += window.len();
            }
        }
        flush(&mut round, &mut used)
    }

    /// Makes encoded chunk `idx` copies again (before a write, truncate or punch reaches it,
    /// or to rebuild it after a fragment's loss): its bytes read (decoded if need be),
    /// written to `--replicas` fresh copies, the map switched to them and the fragments let
    /// go of. Returns the bytes written (0: not encoded).
    pub(super) fn thaw(&self, chunks: &mut ChunkMap, idx: u64) -> Result<u64> {
        let Some(c) = chunks.get(&idx).filter(|c| c.stripe().is_some()).cloned() else {
            return Ok(0);
        };
        let mut bytes = vec![0u8; c.len as usize];
        self.read(chunks, idx * self.chunk_size, &mut bytes)?;
        let regions = self.place(c.len)?;
        let frags: Vec<&[u8]> = regions.iter().map(|_| bytes.as_slice()).collect();
        if let Err(e) = self.write_fragments(&regions, &frags) {
            self.pool.free_all(&regions);
            return Err(e);
        }
        let copies: Vec<Replica> = regions.iter().map(replica).collect();
        chunks.insert(idx, Chunk::with_replicas(c.len, &copies));
        self.free_chunk(&c);
        Ok(c.len * copies.len() as u64)
    }

    /// Makes every encoded chunk holding bytes of `[start, end)` copies again (see
    /// [`Self::thaw`]): what a change of those bytes needs first.
    pub(super) fn thaw_range(&self, chunks: &mut ChunkMap, start: u64, end: u64) -> Result<()> {
        if end <= start {
            return Ok(());
        }
        let cs = self.chunk_size;
        let idxs: Vec<u64> = chunks
            .range(start / cs..=(end - 1) / cs)
            .filter(|(_, c)| c.stripe().is_some())
            .map(|(i, _)| *i)
            .collect();
        for idx in idxs {
            self.thaw(chunks, idx)?;
        }
        Ok(())
    }

    /// The read ops for `n` bytes at `in_chunk` of encoded chunk `c`, landing at local
    /// address `dst`: one per data fragment the range crosses. None if a fragment needed is
    /// lost, on a server down, or in `avoid` (the range is read degraded instead).
    pub(super) fn fragment_reads(
        &self,
        c: &Chunk,
        in_chunk: u64,
        n: u64,
        dst: u64,
        avoid: &[u32],
    ) -> Option<Vec<RemoteOp>> {
        let s = c.stripe()?;
        let f = s.frag_len;
        let mut ops = Vec::new();
        let mut pos = in_chunk;
        while pos < in_chunk + n {
            let i = (pos / f) as usize;
            let off = pos % f;
            let len = (f - off).min(in_chunk + n - pos);
            let r = s.frags.get(i).copied().flatten()?;
            if !self.pool.is_live(ServerId(r.server)) || avoid.contains(&r.server) {
                return None;
            }
            ops.push(RemoteOp {
                opcode: Opcode::Read,
                local: Sge {
                    addr: dst + (pos - in_chunk),
                    len,
                    lkey: 0,
                },
                remote: region(c, &r),
                offset: off,
            });
            pos += len;
        }
        Some(ops)
    }

    /// Reads piece `(idx, in_chunk, n, at)` of encoded chunk `c` (`n` bytes at `in_chunk`
    /// of chunk `idx`) by decoding it from any K fragments, into `b` at `at`.
    pub(super) fn read_degraded(
        &self,
        c: &Chunk,
        (idx, in_chunk, n, at): (u64, u64, u64, u64),
        b: &Bounce,
        avoid: &[u32],
    ) -> Result<()> {
        let s = c.stripe().ok_or_else(|| lost(idx))?;
        let cached = self
            .decoded
            .lock()
            .last
            .as_ref()
            .filter(|(id, _)| *id == s.id)
            .map(|(_, bytes)| bytes.clone());
        let bytes = match cached {
            Some(bytes) => bytes,
            None => {
                let bytes = Arc::new(self.decode(c, idx, avoid)?);
                self.decoded.lock().last = Some((s.id, bytes.clone()));
                bytes
            }
        };
        let from = in_chunk as usize;
        b.buf.write_at(at as usize, &bytes[from..from + n as usize]);
        Ok(())
    }

    /// The `c.len` bytes of encoded chunk `c`, from any K of its fragments (data ones
    /// first: with all K of them no arithmetic is needed). A fragment whose read fails is
    /// passed over; fewer than K left is EIO.
    fn decode(&self, c: &Chunk, idx: u64, avoid: &[u32]) -> Result<Vec<u8>> {
        let s = c.stripe().ok_or_else(|| lost(idx))?;
        let (k, m, f) = (s.k as usize, s.m as usize, s.frag_len as usize);
        let mut failed: Vec<u32> = avoid.to_vec();
        let read = loop {
            let chosen: Vec<(usize, Replica)> = self.live_fragments(s, &failed).take(k).collect();
            if chosen.len() < k {
                return Err(Error::new(
                    libc::EIO,
                    format!(
                        "chunk {idx}: {} of its {} fragments are readable; {k} are needed",
                        chosen.len(),
                        k + m
                    ),
                ));
            }
            match self.read_fragments(c, &chosen)? {
                Ok(read) => break read,
                Err(e) => match e.failed_server() {
                    Some(s) if !failed.contains(&s.0) => failed.push(s.0),
                    _ => return Err(e.into()),
                },
            }
        };
        let mut out = vec![0u8; f * k];
        let (data, parity): (Vec<_>, Vec<_>) = read.into_iter().partition(|(i, _)| *i < k);
        for (i, bytes) in &data {
            out[i * f..(i + 1) * f].copy_from_slice(bytes);
        }
        if data.len() < k {
            let parity = parity.into_iter().map(|(i, b)| (i - k, b));
            let restored = reed_solomon_simd::decode(k, m, data, parity).map_err(code_error)?;
            for (i, bytes) in restored {
                out[i * f..(i + 1) * f].copy_from_slice(&bytes);
            }
        }
        out.truncate(c.len as usize);
        Ok(out)
    }

    /// Reads the whole of each fragment `frags` names, as many at once as one buffer holds
    /// (the inner error: a fragment's read failed, naming its server).
    #[allow(clippy::type_complexity)]
    fn read_fragments(
        &self,
        c: &Chunk,
        frags: &[(usize, Replica)],
    ) -> Result<std::result::Result<Vec<(usize, Vec<u8>)>, crate::client::PoolError>> {
        let f = c.extent_len();
        let buf = self.decode_buf.lock();
        let base = buf.buf.addr();
        let mut out: Vec<(usize, Vec<u8>)> = frags.iter().map(|(i, _)| (*i, Vec::new())).collect();
        // (fragment's place in `frags`, offset in the fragment, bytes, offset in the buffer)
        let mut round: Vec<(usize, u64, u64, u64)> = Vec::new();
        let mut used = 0u64;
        let run = |round: &mut Vec<(usize, u64, u64, u64)>,
                   used: &mut u64,
                   out: &mut Vec<(usize, Vec<u8>)>|
         -> Result<std::result::Result<(), crate::client::PoolError>> {
            if round.is_empty() {
                return Ok(Ok(()));
            }
            let ops: Vec<RemoteOp> = round
                .iter()
                .map(|&(j, off, len, at)| RemoteOp {
                    opcode: Opcode::Read,
                    local: Sge {
                        addr: base + at,
                        len,
                        lkey: 0,
                    },
                    remote: region(c, &frags[j].1),
                    offset: off,
                })
                .collect();
            if let Err(e) = self.run_ops(self.pin(base, *used)?, &ops) {
                return Ok(Err(e));
            }
            for &(j, _, len, at) in round.iter() {
                out[j]
                    .1
                    .extend_from_slice(&buf.buf.to_vec(at as usize, len as usize));
            }
            round.clear();
            *used = 0;
            Ok(Ok(()))
        };
        for j in 0..frags.len() {
            let mut off = 0;
            while off < f {
                let len = (f - off).min(IO_SIZE as u64);
                if used + len > IO_SIZE as u64 {
                    if let Err(e) = run(&mut round, &mut used, &mut out)? {
                        return Ok(Err(e));
                    }
                }
                round.push((j, off, len, used));
                used += len;
                off += len;
            }
        }
        Ok(run(&mut round, &mut used, &mut out)?.map(|()| out))
    }
}
