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
//! `[i*f, (i+1)*f)`), one-sided as ever; a 4 KiB read touches one server. A part of a read
//! whose data fragment is gone is decoded from the same bytes of any K other fragments (the
//! code works on each 64-byte column apart), so a degraded read costs K times its bytes and
//! the decoding of them, never a whole stripe.

use super::*;
use crate::config::{EC_FRAGMENT_ALIGN, EC_MIN_CHUNK};
use crate::meta::{Coding, FileData, Stripe};

/// The length of each fragment of a chunk of `len` bytes cut into `k`.
pub(super) fn frag_len(len: u64, k: u8) -> u64 {
    crate::fabric::mem::round_up(len.div_ceil(k as u64).max(1), EC_FRAGMENT_ALIGN)
}

/// Decode buffers (degraded reads read fragments into them, one per decode): as many as
/// decodes may run at once, the FUSE threads' default (more would wait for the cores anyway).
pub(super) const DECODE_BUFFERS: usize = 4;

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

    /// Whether chunk `c` is for an erasure code to take: copies of at least
    /// [`EC_MIN_CHUNK`] bytes.
    fn wants_encoding(c: &Chunk) -> bool {
        c.stripe().is_none() && c.len >= EC_MIN_CHUNK && !c.replicas().is_empty()
    }

    /// Whether `coding`'s fragments have servers enough to go to now (K+M up, not draining).
    pub fn may_encode(&self, coding: Coding) -> bool {
        self.pool.placeable_servers() >= coding.width()
    }

    /// Whether chunk `c` can be encoded with `coding` now: it wants it, its copies are all
    /// live, and the fragments have servers to go to.
    fn encodable(&self, c: &Chunk, coding: Coding) -> bool {
        Self::wants_encoding(c)
            && self.live_copies(c).count() == c.replicas().len()
            && self.may_encode(coding)
    }

    /// Chunk indexes of `chunks` an erasure code is to take (now or once it can).
    pub(super) fn to_encode(&self, chunks: &ChunkMap) -> Vec<u64> {
        chunks
            .iter()
            .filter(|(_, c)| Self::wants_encoding(c))
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

    /// Encodes chunk `idx` with `coding` (the file's map locked, so no write races it): its bytes read
    /// from a copy, the parity computed, K+M fragments written to fresh extents on distinct
    /// servers, then the map switched to them and the copies let go of. Returns the bytes
    /// written (0: not encodable now; the chunk keeps its copies).
    pub(super) fn encode_chunk(
        &self,
        chunks: &mut ChunkMap,
        idx: u64,
        coding: Coding,
    ) -> Result<u64> {
        let Some(c) = chunks
            .get(&idx)
            .cloned()
            .filter(|c| self.encodable(c, coding))
        else {
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

    /// The reads of `n` bytes at `in_chunk` of encoded chunk `c`, landing at local address
    /// `dst`: a read op for each part of the range in a data fragment that is readable, and
    /// a [`LostPart`] for each part in one that is lost, on a server down, or in `avoid`.
    pub(super) fn fragment_reads(
        &self,
        c: &Chunk,
        in_chunk: u64,
        n: u64,
        dst: u64,
        avoid: &[u32],
    ) -> (Vec<RemoteOp>, Vec<LostPart>) {
        let (mut ops, mut lost) = (Vec::new(), Vec::new());
        let Some(s) = c.stripe() else {
            return (ops, lost);
        };
        let f = s.frag_len;
        let readable =
            |r: &Replica| self.pool.is_live(ServerId(r.server)) && !avoid.contains(&r.server);
        // Decided once, so the decoding later takes from the window exactly what was read.
        let read: Vec<bool> = s
            .frags
            .iter()
            .map(|r| r.as_ref().is_some_and(readable))
            .collect();
        let mut pos = in_chunk;
        while pos < in_chunk + n {
            let frag = (pos / f) as usize;
            let off = pos % f;
            let len = (f - off).min(in_chunk + n - pos);
            let at = dst + (pos - in_chunk);
            match s.frags.get(frag).copied().flatten() {
                Some(r) if read[frag] => ops.push(RemoteOp {
                    opcode: Opcode::Read,
                    local: Sge {
                        addr: at,
                        len,
                        lkey: 0,
                    },
                    remote: region(c, &r),
                    offset: off,
                }),
                _ => lost.push(LostPart {
                    frag,
                    off,
                    len,
                    dst: at,
                    window: ReadWindow {
                        read: read.clone(),
                        from: in_chunk,
                        to: in_chunk + n,
                        dst,
                    },
                }),
            }
            pos += len;
        }
        (ops, lost)
    }

    /// Reads `part` of encoded chunk `c` (chunk `idx`), whose data fragment is gone, by
    /// decoding the same bytes of any K other fragments: the code works on each 64-byte
    /// column of the fragments apart, so only the columns the part covers are decoded, from
    /// shards the read's batch brought (a sequential read's other data fragments) and
    /// shards read now (a degraded read costs at most K times its bytes, never a whole
    /// stripe). The bytes land at `part.dst`, inside `b`.
    pub(super) fn read_lost_part(
        &self,
        c: &Chunk,
        idx: u64,
        part: &LostPart,
        b: &Bounce,
        avoid: &[u32],
    ) -> Result<()> {
        let s = c.stripe().ok_or_else(|| lost(idx))?;
        for cols in part.rounds(s.k) {
            let mut failed: Vec<u32> = avoid.to_vec();
            let taken = self.decode_bufs.take()?;
            loop {
                let mut plan = self.plan_decode(c, idx, part, cols, b, &failed)?;
                let buf = taken.bounce();
                let ops = plan.reads(c, buf.buf.addr());
                let done = match ops.is_empty() {
                    true => Ok(()),
                    false => self.run_ops(self.pin(buf.buf.addr(), plan.read_bytes())?, &ops),
                };
                if let Err(e) = done {
                    self.avoid_failed(e, &mut failed)?;
                    continue;
                }
                plan.take_reads();
                self.decode_planned(s, idx, part, &plan, b, buf)?;
                break;
            }
        }
        Ok(())
    }

    /// The first round of decoding `part` (see [`Self::read_lost_part`]) planned to run in
    /// the read's own batch: its shards to read go to a decode buffer beside the window's
    /// reads, so a degraded sequential read costs one round trip as a healthy one does.
    /// None: the part takes more than one round (it is read after the batch).
    pub(super) fn early_decode(
        &self,
        c: &Chunk,
        idx: u64,
        part: &LostPart,
        b: &Bounce,
        avoid: &[u32],
    ) -> Result<Option<EarlyDecode<'_>>> {
        let s = c.stripe().ok_or_else(|| lost(idx))?;
        let mut rounds = part.rounds(s.k);
        let (Some(cols), None) = (rounds.next(), rounds.next()) else {
            return Ok(None);
        };
        let plan = self.plan_decode(c, idx, part, cols, b, avoid)?;
        let buf = self.decode_bufs.take()?;
        let ops = plan.reads(c, buf.bounce().buf.addr());
        Ok(Some(EarlyDecode { plan, buf, ops }))
    }

    /// Decodes `part` with the shards an [`EarlyDecode`] read in the window's batch.
    pub(super) fn finish_early_decode(
        &self,
        c: &Chunk,
        idx: u64,
        part: &LostPart,
        mut early: EarlyDecode<'_>,
        b: &Bounce,
    ) -> Result<()> {
        let s = c.stripe().ok_or_else(|| lost(idx))?;
        early.plan.take_reads();
        self.decode_planned(s, idx, part, &early.plan, b, early.buf.bounce())
    }

    /// Which K fragments decode `part`'s columns `cols`: those the read's batch brought into
    /// `b` first, then live ones not in `failed` to read; fewer than K is EIO.
    fn plan_decode(
        &self,
        c: &Chunk,
        idx: u64,
        part: &LostPart,
        (col, cols): (u64, u64),
        b: &Bounce,
        failed: &[u32],
    ) -> Result<DecodePlan> {
        let s = c.stripe().ok_or_else(|| lost(idx))?;
        let (k, m) = (s.k as usize, s.m as usize);
        let others = || (0..s.frags.len()).filter(|&i| i != part.frag);
        let shards: Vec<(usize, Source)> = others()
            .filter_map(|i| {
                let at = part.window.holds(i, s.frag_len, col, cols, b.buf.addr())?;
                Some((i, Source::Window(at)))
            })
            .take(k)
            .collect();
        let mut to_read = Vec::new();
        for (i, r) in self.live_fragments(s, failed) {
            if shards.len() + to_read.len() == k {
                break;
            }
            if i != part.frag && !shards.iter().any(|(j, _)| *j == i) {
                to_read.push((i, r));
            }
        }
        if shards.len() + to_read.len() < k {
            return Err(Error::new(
                libc::EIO,
                format!(
                    "chunk {idx}: {} of its {} fragments are readable; {k} are needed",
                    shards.len() + to_read.len(),
                    k + m
                ),
            ));
        }
        Ok(DecodePlan {
            col,
            cols,
            shards,
            to_read,
        })
    }

    /// Decodes `plan`'s columns of `part`'s fragment from its shards (in `b` and `buf`) and
    /// writes the part's bytes among them to `b`.
    fn decode_planned(
        &self,
        s: &Stripe,
        idx: u64,
        part: &LostPart,
        plan: &DecodePlan,
        b: &Bounce,
        buf: &Bounce,
    ) -> Result<()> {
        let (k, m) = (s.k as usize, s.m as usize);
        let (col, cols) = (plan.col, plan.cols);
        // SAFETY: every read into either buffer completed (a batch waits for each of its
        // ops), and both are this thread's alone (`b` is the read's loan, the decode buffer
        // held by the caller): nothing writes these bytes while the views live. The decoded
        // bytes written to `b` meanwhile are the lost fragment's, which no view covers (the
        // views in `b` are other fragments' bytes).
        let shard = |src: &Source| unsafe {
            match *src {
                Source::Window(at) => b.buf.quiet_bytes(at as usize, cols as usize),
                Source::Read(at) => buf.buf.quiet_bytes(at as usize, cols as usize),
            }
        };
        let shards: Vec<(usize, &[u8])> = plan
            .shards
            .iter()
            .map(|(i, src)| (*i, shard(src)))
            .collect();
        // The part's bytes within these columns.
        let end = part.off + part.len;
        let (from, to) = (part.off.max(col), end.min(col + cols));
        let at = part.dst + (from - part.off) - b.buf.addr();
        super::decode::restore(k, m, part.frag, &shards, |bytes| {
            b.buf.write_at(
                at as usize,
                &bytes[(from - col) as usize..(to - col) as usize],
            )
        })
        .map_err(|e| Error::new(e.errno, format!("chunk {idx}: {e}")))
    }
}

/// How one round of a lost part's decoding gets its K shards.
struct DecodePlan {
    /// The fragment columns decoded, `[col, col+cols)`.
    col: u64,
    cols: u64,
    /// Shards at hand: in the read's window, or (after [`DecodePlan::take_reads`]) read.
    shards: Vec<(usize, Source)>,
    /// Fragments to read the columns of, into a decode buffer one after another.
    to_read: Vec<(usize, Replica)>,
}

impl DecodePlan {
    /// The reads of `to_read`'s columns into the decode buffer at `base`.
    fn reads(&self, c: &Chunk, base: u64) -> Vec<RemoteOp> {
        self.to_read
            .iter()
            .enumerate()
            .map(|(j, (_, r))| RemoteOp {
                opcode: Opcode::Read,
                local: Sge {
                    addr: base + j as u64 * self.cols,
                    len: self.cols,
                    lkey: 0,
                },
                remote: region(c, r),
                offset: self.col,
            })
            .collect()
    }

    /// The decode buffer's bytes the reads fill.
    fn read_bytes(&self) -> u64 {
        self.to_read.len() as u64 * self.cols
    }

    /// The reads done: their shards join the others.
    fn take_reads(&mut self) {
        let cols = self.cols;
        let read = std::mem::take(&mut self.to_read);
        let at = |j: usize| Source::Read(j as u64 * cols);
        self.shards
            .extend(read.iter().enumerate().map(|(j, (i, _))| (*i, at(j))));
    }
}

/// A lost part's first decoding round planned into a read's batch ([`DataStore::early_decode`]):
/// the reads to add to the batch, and the buffer they fill.
pub(super) struct EarlyDecode<'a> {
    plan: DecodePlan,
    buf: super::buffers::Lent<'a>,
    pub ops: Vec<RemoteOp>,
}

impl EarlyDecode<'_> {
    /// The decode buffer's range the reads fill (to pin beside the window).
    pub fn pinned_range(&self) -> (u64, u64) {
        (self.buf.bounce().buf.addr(), self.plan.read_bytes())
    }
}

/// A part of a read in a data fragment that cannot be read: decoded instead.
pub(super) struct LostPart {
    /// The data fragment, the offset in it and the bytes.
    pub frag: usize,
    pub off: u64,
    pub len: u64,
    /// Where the bytes go (a local address inside the read's buffer).
    pub dst: u64,
    /// What the read's batch brought of the same chunk (the decoding takes shards from it).
    pub window: ReadWindow,
}

impl LostPart {
    /// The part's fragment columns, in rounds that fill a decode buffer with K shards at
    /// most: `(col, cols)` each.
    fn rounds(&self, k: u8) -> impl Iterator<Item = (u64, u64)> {
        let per_round = (IO_SIZE as u64 / k as u64) / EC_FRAGMENT_ALIGN * EC_FRAGMENT_ALIGN;
        let end = crate::fabric::mem::round_up(self.off + self.len, EC_FRAGMENT_ALIGN);
        let start = self.off / EC_FRAGMENT_ALIGN * EC_FRAGMENT_ALIGN;
        (start..end)
            .step_by(per_round as usize)
            .map(move |col| (col, (end - col).min(per_round)))
    }
}

/// The bytes of one encoded chunk a read's batch brought into its buffer: chunk bytes
/// `[from, to)` at local address `dst`, from the fragments `read` marks.
pub(super) struct ReadWindow {
    read: Vec<bool>,
    from: u64,
    to: u64,
    dst: u64,
}

impl ReadWindow {
    /// The offset in the buffer at `base` of data fragment `i`'s columns `[col, col+cols)`
    /// (each `frag_len` long), if the batch read them.
    fn holds(&self, i: usize, frag_len: u64, col: u64, cols: u64, base: u64) -> Option<u64> {
        let start = i as u64 * frag_len + col;
        let whole = self.read.get(i) == Some(&true)
            && col + cols <= frag_len
            && self.from <= start
            && start + cols <= self.to;
        whole.then(|| self.dst + (start - self.from) - base)
    }
}

/// Where a shard for decoding is: in the read's own buffer, or read into the decode buffer
/// (offsets in each).
enum Source {
    Window(u64),
    Read(u64),
}
