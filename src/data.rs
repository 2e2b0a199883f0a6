//! File data on the pool: turns byte ranges of a file into one-sided READs and WRITEs of its
//! remote chunks.
//!
//! A file is cut into chunks of `chunk_size` bytes; chunk `i` holds file bytes
//! `[i*chunk_size, (i+1)*chunk_size)`. Chunks are allocated on first write, each on the server
//! with the most free memory, so a file can outgrow any one server and large I/O reaches
//! several servers at once (all ops of one request are posted before any is waited for).
//! A file's *first* chunk starts page-sized and doubles as the file grows, so small files cost
//! pages, not whole chunks; later chunks are allocated whole. Servers zero extents they hand
//! out, so unwritten parts of a chunk read as zeros, like holes.
//!
//! Every local buffer handed to the fabric is registered through the registration cache
//! (`mrrc`): write payloads go straight from the caller's buffer when the caller vouches that
//! it lives as long as the mount (FUSE's request buffers), otherwise through a bounce buffer;
//! reads land in bounce buffers from a small pool. The cache turns repeated use of the same
//! buffers into hits, so registration (pinning) is paid once, not per operation.

use crate::client::frrwp::Ticket;
use crate::client::{Pool, RemoteOp};
use crate::error::{Error, Result};
use crate::fabric::mem::page_size;
use crate::fabric::{AlignedBuf, Opcode, RemoteRegion, ServerId, Sge};
use crate::fuse::RequestBuffer;
use crate::meta::Chunk;
use crate::mrrc::{CacheConfig, CacheStats, FabricRegistrar, Pinned, Policy, RegCache};
use crate::sync::{Arc, Condvar, Mutex};
use std::collections::BTreeMap;

/// Bytes moved per round of remote operations: the largest FUSE request (1 MiB on current
/// kernels), so a request needs one bounce buffer and one round.
pub use crate::config::IO_SIZE;

/// How writes to fresh remote memory proceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WritePath {
    /// Allocate (and wait for the rkey), register locally, then write (the paper's Fig. 5).
    Serial,
    /// FRRWP: tagged allocation first, local registration meanwhile, conditional writes.
    Frrwp,
}

impl std::str::FromStr for WritePath {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<WritePath, String> {
        match s {
            "serial" => Ok(WritePath::Serial),
            "frrwp" => Ok(WritePath::Frrwp),
            other => Err(format!("unknown write path '{other}' (serial, frrwp)")),
        }
    }
}

/// A bounce buffer (registered through the cache when used).
struct Bounce {
    buf: Arc<AlignedBuf>,
}

/// Chunk I/O over a pool of memory servers.
pub struct DataStore {
    // Declared first so it is dropped first: registrations go before the buffers they cover.
    cache: RegCache<FabricRegistrar>,
    pool: Arc<Pool>,
    chunk_size: u64,
    write_path: WritePath,
    free_bufs: Mutex<Vec<Bounce>>,
    buf_returned: Condvar,
    bufs_made: Mutex<usize>,
    max_bufs: usize,
    /// Zeros, for clearing the tail of a chunk on truncate.
    zeros: Bounce,
}

/// A bounce buffer on loan; goes back to the pool on drop.
struct Loan<'a> {
    store: &'a DataStore,
    bounce: Option<Bounce>,
}

impl Loan<'_> {
    fn b(&self) -> &Bounce {
        self.bounce.as_ref().expect("present until drop")
    }
}

impl Drop for Loan<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.bounce.take() {
            self.store.free_bufs.lock().push(b);
            self.store.buf_returned.notify_one();
        }
    }
}

fn region(c: &Chunk) -> RemoteRegion {
    RemoteRegion {
        server: ServerId(c.server),
        addr: c.addr,
        len: c.len,
        rkey: c.rkey,
    }
}

/// The bytes of a write, and whether they may be registered where they lie.
pub enum Payload<'a> {
    /// Copied into a pooled bounce buffer before it is sent.
    Copy(&'a [u8]),
    /// Registered and sent in place: only the FUSE adapter can vouch for such memory.
    InPlace(RequestBuffer<'a>),
}

impl<'a> Payload<'a> {
    pub fn bytes(&self) -> &'a [u8] {
        match self {
            Payload::Copy(b) => b,
            Payload::InPlace(r) => r.bytes(),
        }
    }
}

impl DataStore {
    /// `max_bufs` bounds the bounce buffers (and so the concurrent I/O rounds).
    pub fn new(
        pool: Arc<Pool>,
        chunk_size: u64,
        max_bufs: usize,
        policy: Policy,
        cache: CacheConfig,
        write_path: WritePath,
    ) -> Result<DataStore> {
        let page = page_size() as u64;
        if chunk_size < page || !chunk_size.is_power_of_two() {
            return Err(Error::new(
                libc::EINVAL,
                format!("chunk size {chunk_size} must be a power of two of at least {page}"),
            ));
        }
        let zeros = Self::make_bounce()?;
        Ok(DataStore {
            cache: RegCache::new(FabricRegistrar(pool.fabric().clone()), policy, cache),
            pool,
            chunk_size,
            write_path,
            free_bufs: Mutex::new(Vec::new()),
            buf_returned: Condvar::new(),
            bufs_made: Mutex::new(0),
            max_bufs: max_bufs.max(1),
            zeros,
        })
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The largest file size (EFBIG beyond it): 2^32 chunks, 4 PiB with 1 MiB chunks. Far
    /// more than a rack's memory can hold, and it keeps a file's chunk index within 32 bits,
    /// so no size a caller can name makes the extent map or a loop over it unbounded.
    pub fn max_file_size(&self) -> u64 {
        self.chunk_size
            .saturating_mul(1 << 32)
            .min(crate::config::MAX_FILE_SIZE)
    }

    /// The end of `[offset, offset+len)`, or EFBIG if it passes [`Self::max_file_size`].
    pub fn check_end(&self, offset: u64, len: u64) -> Result<u64> {
        offset
            .checked_add(len)
            .filter(|&end| end <= self.max_file_size())
            .ok_or_else(|| {
                Error::new(
                    libc::EFBIG,
                    format!(
                        "{len} bytes at offset {offset} pass the largest file size ({})",
                        self.max_file_size()
                    ),
                )
            })
    }
    pub fn chunk_size(&self) -> u64 {
        self.chunk_size
    }

    /// Registration cache counters.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }
    pub fn cache_policy(&self) -> Policy {
        self.cache.policy()
    }

    fn make_bounce() -> Result<Bounce> {
        Ok(Bounce {
            buf: Arc::new(AlignedBuf::new(IO_SIZE)?),
        })
    }

    /// Registrations covering `[addr, addr+len)`, from the cache.
    fn pin(&self, addr: u64, len: u64) -> Result<Pinned> {
        Ok(self.cache.acquire(addr, len)?)
    }

    /// Splits the local range `[addr, addr+len)` at the boundaries of `pinned`'s
    /// registrations: `(sge, offset into the range, already registered)` for each part.
    fn split(pinned: &Pinned, addr: u64, len: u64) -> Vec<(Sge, u64, bool)> {
        let mut out = Vec::new();
        let (mut at, end) = (addr, addr + len);
        while at < end {
            let piece = pinned
                .pieces
                .iter()
                .find(|p| p.addr <= at && at < p.addr + p.len)
                .expect("local ranges lie inside the pinned range");
            let n = (piece.addr + piece.len).min(end) - at;
            let sge = Sge {
                addr: at,
                len: n,
                lkey: piece.lkey,
            };
            out.push((sge, at - addr, piece.cached));
            at += n;
        }
        out
    }

    /// Runs `ops` (whose local ranges lie inside `pinned`'s pieces), splitting any op whose
    /// local range crosses from one registration into the next, then gives the registrations
    /// back to the cache. On an overlap lookup the ops on already-registered pieces go first.
    fn run(&self, pinned: Pinned, ops: &[RemoteOp]) -> Result<()> {
        let mut split = Vec::with_capacity(ops.len());
        for op in ops {
            for (local, delta, cached) in Self::split(&pinned, op.local.addr, op.local.len) {
                let part = RemoteOp {
                    local,
                    offset: op.offset + delta,
                    ..*op
                };
                split.push((cached, part));
            }
        }
        split.sort_by_key(|(cached, _)| !*cached); // stable: cached pieces first
        let ops: Vec<RemoteOp> = split.into_iter().map(|(_, op)| op).collect();
        let res = self.pool.execute(&ops);
        self.cache.release(pinned);
        Ok(res?)
    }

    fn loan(&self) -> Result<Loan<'_>> {
        let mut free = self.free_bufs.lock();
        loop {
            if let Some(b) = free.pop() {
                return Ok(Loan {
                    store: self,
                    bounce: Some(b),
                });
            }
            {
                let mut made = self.bufs_made.lock();
                if *made < self.max_bufs {
                    *made += 1;
                    drop(made);
                    drop(free);
                    return match Self::make_bounce() {
                        Ok(b) => Ok(Loan {
                            store: self,
                            bounce: Some(b),
                        }),
                        Err(e) => {
                            *self.bufs_made.lock() -= 1;
                            Err(e)
                        }
                    };
                }
            }
            free = self.buf_returned.wait(free);
        }
    }

    /// Splits `[offset, offset+len)` into per-chunk pieces: `(chunk index, offset in chunk,
    /// length, offset in the range)`.
    fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = (u64, u64, u64, u64)> + '_ {
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

    /// Reads file bytes at `offset` into `out` (which the caller zeroed: holes stay zero).
    pub fn read(&self, chunks: &BTreeMap<u64, Chunk>, offset: u64, out: &mut [u8]) -> Result<()> {
        let loan = self.loan()?;
        let b = loan.b();
        let base = b.buf.addr();
        for (w, window) in out.chunks_mut(IO_SIZE).enumerate() {
            let woff = offset + (w * IO_SIZE) as u64;
            let mut ops = Vec::new();
            let mut copies = Vec::new();
            for (idx, in_chunk, n, at) in self.pieces(woff, window.len() as u64) {
                let Some(c) = chunks.get(&idx) else { continue };
                // Only the part of the piece the chunk actually covers; the rest is a hole.
                let covered = c.len.saturating_sub(in_chunk).min(n);
                if covered == 0 {
                    continue;
                }
                ops.push(RemoteOp {
                    opcode: Opcode::Read,
                    local: Sge {
                        addr: base + at,
                        len: covered,
                        lkey: 0,
                    },
                    remote: region(c),
                    offset: in_chunk,
                });
                copies.push((at as usize, covered as usize));
            }
            if !ops.is_empty() {
                self.run(self.pin(base, window.len() as u64)?, &ops)?;
            }
            for (at, n) in copies {
                b.buf.read_at(at, &mut window[at..at + n]);
            }
        }
        Ok(())
    }

    /// Writes `payload` at file `offset`, allocating or growing chunks as needed. Returns once
    /// the bytes are in remote memory. A [`Payload::InPlace`] lies in memory that stays mapped
    /// for the life of this store (FUSE's request buffers): it is registered through the cache
    /// and sent as it is, without a bounce copy.
    pub fn write(
        &self,
        chunks: &mut BTreeMap<u64, Chunk>,
        offset: u64,
        payload: Payload<'_>,
    ) -> Result<()> {
        let stable = matches!(payload, Payload::InPlace(_));
        let data = payload.bytes();
        let loan = self.loan()?;
        let b = loan.b();
        for (w, window) in data.chunks(IO_SIZE).enumerate() {
            let woff = offset + (w * IO_SIZE) as u64;
            let wlen = window.len() as u64;
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
            let ops = self.window_ops(chunks, woff, base, wlen);
            self.run(self.pin(base, wlen)?, &ops)?;
        }
        Ok(())
    }

    /// Write ops for a window whose chunks all exist.
    fn window_ops(
        &self,
        chunks: &BTreeMap<u64, Chunk>,
        woff: u64,
        base: u64,
        wlen: u64,
    ) -> Vec<RemoteOp> {
        self.pieces(woff, wlen)
            .map(|(idx, in_chunk, n, at)| RemoteOp {
                opcode: Opcode::Write,
                local: Sge {
                    addr: base + at,
                    len: n,
                    lkey: 0,
                },
                remote: region(&chunks[&idx]),
                offset: in_chunk,
            })
            .collect()
    }

    /// One window of a write with FRRWP: tagged allocations for missing chunks go out first,
    /// the local buffer is registered meanwhile, and the writes to new chunks are submitted as
    /// conditional writes that the reply thread posts when each rkey arrives.
    fn write_window_frrwp(
        &self,
        chunks: &mut BTreeMap<u64, Chunk>,
        woff: u64,
        base: u64,
        wlen: u64,
        b: &Bounce,
    ) -> Result<()> {
        // 1. Tagged requests for chunks that do not exist yet (one per chunk index).
        let mut tickets: Vec<(u64, Ticket)> = Vec::new();
        for (idx, in_chunk, n, _) in self.pieces(woff, wlen) {
            // (Short chunks were grown by the caller.)
            if !chunks.contains_key(&idx) && !tickets.iter().any(|(i, _)| *i == idx) {
                let len = self.target_len(idx, 0, in_chunk + n);
                match self.pool.begin_alloc(len) {
                    Ok(t) => tickets.push((idx, t)),
                    Err(e) => {
                        self.adopt(chunks, &tickets);
                        return Err(e.into());
                    }
                }
            }
        }
        // 2. Local registration, overlapping the servers' allocation and registration.
        let pinned = match self.pin(base, wlen) {
            Ok(p) => p,
            Err(e) => {
                self.adopt(chunks, &tickets);
                return Err(e);
            }
        };
        // 3. Writes to existing chunks go out now; writes to new ones are conditional.
        let mut ops = Vec::new();
        let mut crws: Vec<(&Ticket, Vec<(Sge, u64)>)> =
            tickets.iter().map(|(_, t)| (t, Vec::new())).collect();
        for (idx, in_chunk, n, at) in self.pieces(woff, wlen) {
            let parts = Self::split(&pinned, base + at, n);
            match tickets.iter().position(|(i, _)| *i == idx) {
                Some(k) => crws[k]
                    .1
                    .extend(parts.into_iter().map(|(sge, d, _)| (sge, in_chunk + d))),
                None => ops.extend(parts.into_iter().map(|(sge, d, _)| RemoteOp {
                    opcode: Opcode::Write,
                    local: sge,
                    remote: region(&chunks[&idx]),
                    offset: in_chunk + d,
                })),
            }
        }
        let res = self.pool.execute_frrwp(&ops, &crws);
        self.cache.release(pinned);
        let out_of_space = tickets.iter().any(|(_, t)| t.refused_for_space());
        self.adopt(chunks, &tickets);
        match res {
            Ok(()) => Ok(()),
            // The chosen server was full: the serial path tries the others.
            Err(_) if out_of_space => {
                for (idx, in_chunk, n, _) in self.pieces(woff, wlen) {
                    self.ensure(chunks, idx, in_chunk + n, b)?;
                }
                let ops = self.window_ops(chunks, woff, base, wlen);
                self.run(self.pin(base, wlen)?, &ops)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Records every extent the tickets were granted as the file's chunks, whatever happened
    /// to the writes (they are the file's now, zeroed, and freed with it): waits, bounded by
    /// the control timeout, for answers still on their way, so nothing granted is leaked.
    fn adopt(&self, chunks: &mut BTreeMap<u64, Chunk>, tickets: &[(u64, Ticket)]) {
        for (idx, t) in tickets {
            if let Some(r) = t.wait_region(self.pool.timeout()) {
                chunks.insert(
                    *idx,
                    Chunk {
                        server: r.server.0,
                        addr: r.addr,
                        len: r.len,
                        rkey: r.rkey,
                    },
                );
            }
        }
    }

    /// The length to give chunk `idx` so it covers `needed` bytes, growing from `current`.
    fn target_len(&self, idx: u64, current: u64, needed: u64) -> u64 {
        if idx > 0 {
            return self.chunk_size;
        }
        let page = page_size() as u64;
        let needed = needed.div_ceil(page) * page;
        needed.max(current * 2).min(self.chunk_size)
    }

    /// Makes chunk `idx` at least `needed` bytes long: allocates it, or moves a short first
    /// chunk into a larger extent (copying its bytes through `b`).
    fn ensure(
        &self,
        chunks: &mut BTreeMap<u64, Chunk>,
        idx: u64,
        needed: u64,
        b: &Bounce,
    ) -> Result<()> {
        let current = chunks.get(&idx).copied();
        if current.is_some_and(|c| c.len >= needed) {
            return Ok(());
        }
        let len = self.target_len(idx, current.map_or(0, |c| c.len), needed);
        let r = self.pool.alloc(len)?;
        let new = Chunk {
            server: r.server.0,
            addr: r.addr,
            len: r.len,
            rkey: r.rkey,
        };
        if let Some(old) = current {
            let base = b.buf.addr();
            let mut copied = 0;
            while copied < old.len {
                let n = (old.len - copied).min(IO_SIZE as u64);
                let local = Sge {
                    addr: base,
                    len: n,
                    lkey: 0,
                };
                let read = RemoteOp {
                    opcode: Opcode::Read,
                    local,
                    remote: region(&old),
                    offset: copied,
                };
                let write = RemoteOp {
                    opcode: Opcode::Write,
                    remote: r,
                    ..read
                };
                // Two rounds: the write must not start before the read has landed.
                let res = self
                    .pin(base, n)
                    .and_then(|p| self.run(p, &[read]))
                    .and_then(|()| self.pin(base, n))
                    .and_then(|p| self.run(p, &[write]));
                if let Err(e) = res {
                    let _ = self.pool.free(r);
                    return Err(e);
                }
                copied += n;
            }
            self.free_chunk(&old);
        }
        chunks.insert(idx, new);
        Ok(())
    }

    /// Allocates every chunk covering `[offset, offset+len)` (fallocate).
    ///
    /// A range whose missing chunks the pool cannot hold (as its servers last reported, and
    /// again after asking them) is refused with ENOSPC before anything is allocated: the cost
    /// of the check is bounded by the chunks the file already has, never by the range.
    pub fn allocate(&self, chunks: &mut BTreeMap<u64, Chunk>, offset: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let cs = self.chunk_size;
        let (first, last) = (offset / cs, (offset + len - 1) / cs);
        let present = chunks.range(first..=last).count() as u64;
        let missing_bytes = (last - first + 1 - present).saturating_mul(cs);
        let no_room = |free: u64| {
            Error::new(
                libc::ENOSPC,
                format!(
                    "fallocate needs up to {missing_bytes} bytes of remote memory; the pool has                      {free} free"
                ),
            )
        };
        if missing_bytes > self.pool.capacity().total {
            return Err(no_room(self.pool.capacity().free));
        }
        if missing_bytes > self.pool.capacity().free {
            self.pool.refresh();
            let free = self.pool.capacity().free;
            if missing_bytes > free {
                return Err(no_room(free));
            }
        }
        let loan = self.loan()?;
        for (idx, in_chunk, n, _) in self.pieces(offset, len) {
            self.ensure(chunks, idx, in_chunk + n, loan.b())?;
        }
        Ok(())
    }

    /// Cuts the data to `size` bytes: frees whole chunks past it and zeroes the rest of the
    /// chunk it ends in, so a later extension reads zeros there.
    pub fn truncate(&self, chunks: &mut BTreeMap<u64, Chunk>, size: u64) -> Result<()> {
        let cs = self.chunk_size;
        let keep = size.div_ceil(cs);
        let gone: Vec<u64> = chunks.range(keep..).map(|(i, _)| *i).collect();
        for i in gone {
            let c = chunks.remove(&i).expect("listed");
            self.free_chunk(&c);
        }
        if size % cs != 0 {
            if let Some(c) = chunks.get(&(size / cs)) {
                let from = size % cs;
                let zeros = self.zeros.buf.addr();
                let mut ops = Vec::new();
                let mut at = from;
                while at < c.len {
                    let n = (c.len - at).min(IO_SIZE as u64);
                    ops.push(RemoteOp {
                        opcode: Opcode::Write,
                        local: Sge {
                            addr: zeros,
                            len: n,
                            lkey: 0,
                        },
                        remote: region(c),
                        offset: at,
                    });
                    at += n;
                }
                if !ops.is_empty() {
                    self.run(self.pin(zeros, IO_SIZE as u64)?, &ops)?;
                }
            }
        }
        Ok(())
    }

    fn free_chunk(&self, c: &Chunk) {
        if let Err(e) = self.pool.free(region(c)) {
            // The server is gone (and its memory with it) or refused: nothing to give back.
            log::debug!("freeing a chunk on server {}: {e}", c.server);
        }
    }

    /// Gives every chunk back (unlinked file, last close).
    pub fn release(&self, chunks: BTreeMap<u64, Chunk>) {
        for c in chunks.values() {
            self.free_chunk(c);
        }
    }
}
