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
//! **Replicas.** With `--replicas N` every chunk lives on N distinct servers (placed by free
//! memory, like single chunks). A write goes to every copy and returns once all of them hold
//! it; a copy whose write fails is taken out of the chunk's list before the write returns, so
//! a listed copy never holds older bytes than the others (a chunk whose only copy fails keeps
//! it, and the write fails: nothing silently turns into a hole). Before writing, a chunk short
//! of copies gets replacements on other servers with room, copied from a live copy under the
//! file's lock (so no write races the copy). Reads go to one live copy, spread by chunk
//! index, and move to another when one fails; EIO only when no copy is left.
//!
//! Every local buffer handed to the fabric is registered through the registration cache
//! (`mrrc`): write payloads go straight from the caller's buffer when the caller vouches that
//! it lives as long as the mount (FUSE's request buffers), otherwise through a bounce buffer;
//! reads land in bounce buffers from a small pool. The cache turns repeated use of the same
//! buffers into hits, so registration (pinning) is paid once, not per operation.

use crate::client::frrwp::Ticket;
use crate::client::{Pool, RemoteOp, Room};
use crate::error::{Error, Result};
use crate::fabric::mem::page_size;
use crate::fabric::{AlignedBuf, Opcode, RemoteRegion, ServerId, Sge};
use crate::meta::{Chunk, ChunkMap, Replica, MAX_REPLICAS};
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
    /// Copies kept of every chunk (`--replicas`).
    replicas: usize,
    /// Fewest copies a write may land on (`--min-replicas`); fewer is EIO.
    min_replicas: usize,
    /// What chunk copies (replacing a lost replica) go through: one at a time, and only after
    /// a failure, so one buffer is enough and stays registered in the cache.
    repair_buf: Mutex<Bounce>,
}

/// How many copies of each chunk there are, as `stats` counts them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaHealth {
    /// Chunks with every copy on a live server.
    pub healthy: u64,
    /// Chunks with fewer live copies than `--replicas`, but at least one.
    pub degraded: u64,
    /// Chunks with no copy on a live server.
    pub lost: u64,
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

/// File bytes read for a reply: in the pooled buffer the fabric read them into (a FUSE-sized
/// read), or owned (larger ones).
pub struct ReadBuf<'a>(ReadBytes<'a>);

enum ReadBytes<'a> {
    Loaned(Loan<'a>, usize),
    Owned(Vec<u8>),
}

impl ReadBuf<'_> {
    /// No bytes (a read at or past the end of the file).
    pub fn empty() -> ReadBuf<'static> {
        ReadBuf(ReadBytes::Owned(Vec::new()))
    }

    pub fn bytes(&self) -> &[u8] {
        match &self.0 {
            // SAFETY: every operation on the loaned buffer completed before `read_buf`
            // returned (a batch waits for each of its ops, failed ones too), and the loan
            // keeps the buffer this value's alone until it is dropped: nothing writes it
            // while the view lives.
            ReadBytes::Loaned(loan, len) => unsafe { loan.b().buf.quiet_bytes(0, *len) },
            ReadBytes::Owned(v) => v,
        }
    }

    /// The bytes as an owned vector (copied out of a loaned buffer, moved out of an owned one).
    pub fn into_vec(self) -> Vec<u8> {
        match self.0 {
            ReadBytes::Owned(v) => v,
            ReadBytes::Loaned(..) => self.bytes().to_vec(),
        }
    }
}

/// The copy `r` of chunk `c`, as the pool addresses it.
fn region(c: &Chunk, r: &Replica) -> RemoteRegion {
    RemoteRegion {
        server: ServerId(r.server),
        addr: r.addr,
        len: c.len,
        rkey: r.rkey,
    }
}

fn replica(r: &RemoteRegion) -> Replica {
    Replica {
        server: r.server.0,
        addr: r.addr,
        rkey: r.rkey,
    }
}

/// A chunk held by freshly allocated `regions` (as long as the shortest of them).
fn chunk_of(regions: &[RemoteRegion]) -> Chunk {
    let len = regions.iter().map(|r| r.len).min().unwrap_or(0);
    let copies: Vec<Replica> = regions.iter().map(replica).collect();
    Chunk::with_replicas(len, &copies)
}

fn lost(idx: u64) -> Error {
    Error::new(
        libc::EIO,
        format!("chunk {idx}: no copy is left on a live memory server"),
    )
}

/// A write payload in memory that stays mapped, and unchanged while the write runs, for the
/// whole life of the mount (a FUSE request buffer), so it may be registered in place
/// (through the registration cache, which keeps registrations after the write returns) and
/// sent without a copy. Made only through the `unsafe` constructor, whose caller vouches for
/// that memory.
pub struct RequestBuffer<'a> {
    bytes: &'a [u8],
}

impl<'a> RequestBuffer<'a> {
    /// # Safety
    /// `bytes` must stay mapped for as long as the registration cache may hold a
    /// registration of it (the life of the mount), and must not change while a write of it
    /// runs. fuser's request buffers (the FUSE adapter) are such memory.
    pub unsafe fn new(bytes: &'a [u8]) -> RequestBuffer<'a> {
        RequestBuffer { bytes }
    }

    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// For tests of the in-place path: leaks `data`, so it lives (and stays mapped) forever.
    #[cfg(feature = "testing")]
    pub fn leaked(data: Vec<u8>) -> RequestBuffer<'static> {
        RequestBuffer { bytes: data.leak() }
    }
}

/// One live server's size and free bytes (for `statfs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerRoom {
    pub total: u64,
    pub free: u64,
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
            replicas: 1,
            min_replicas: 1,
            repair_buf: Mutex::new(Self::make_bounce()?),
        })
    }

    /// Keeps `replicas` copies of every chunk (1 to [`MAX_REPLICAS`]) and fails writes that
    /// would land on fewer than `min_replicas` of them.
    pub fn replicated(mut self, replicas: usize, min_replicas: usize) -> Result<DataStore> {
        if !(1..=MAX_REPLICAS).contains(&replicas) {
            return Err(Error::new(
                libc::EINVAL,
                format!("--replicas {replicas}: between 1 and {MAX_REPLICAS}"),
            ));
        }
        if !(1..=replicas).contains(&min_replicas) {
            return Err(Error::new(
                libc::EINVAL,
                format!("--min-replicas {min_replicas}: between 1 and --replicas ({replicas})"),
            ));
        }
        self.replicas = replicas;
        self.min_replicas = min_replicas;
        Ok(self)
    }

    /// Copies kept of every chunk.
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// Counts `chunks` by how many of their copies are on live servers.
    pub fn health(&self, chunks: &ChunkMap, into: &mut ReplicaHealth) {
        for c in chunks.values() {
            let live = self.live_copies(c).count();
            if live == 0 {
                into.lost += 1;
            } else if live < self.replicas {
                into.degraded += 1;
            } else {
                into.healthy += 1;
            }
        }
    }

    fn live_copies<'c>(&'c self, c: &'c Chunk) -> impl Iterator<Item = &'c Replica> + 'c {
        c.replicas()
            .iter()
            .filter(|r| self.pool.is_live(ServerId(r.server)))
    }

    /// The copy of chunk `idx` to read: a live one not in `avoid`, spread over the copies by
    /// chunk index (so a large read of several chunks uses every server holding them).
    fn pick(&self, c: &Chunk, idx: u64, avoid: &[u32]) -> Option<Replica> {
        let live: Vec<&Replica> = self
            .live_copies(c)
            .filter(|r| !avoid.contains(&r.server))
            .collect();
        if live.is_empty() {
            return None;
        }
        Some(*live[(idx % live.len() as u64) as usize])
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The total and free bytes of every live server, as last heard (frees still in
    /// flight not counted).
    pub fn live_capacity(&self) -> Vec<ServerRoom> {
        self.pool
            .status()
            .into_iter()
            .filter(|s| !s.failed)
            .map(|s| ServerRoom {
                total: s.capacity.total,
                free: s.capacity.free,
            })
            .collect()
    }

    /// Waits up to `wait` for the answers to frees in flight (they carry the capacity).
    pub fn settle_frees(&self, wait: std::time::Duration) {
        self.pool.settle_frees(wait);
    }

    /// Where the copies of each chunk are: `[[chunk index, [server address, ...]], ...]`.
    pub fn placement(&self, chunks: &ChunkMap) -> serde_json::Value {
        let servers = self.pool.status();
        let addr = |id: u32| servers.get(id as usize).map(|s| s.addr.to_string());
        let list: Vec<serde_json::Value> = chunks
            .iter()
            .map(|(idx, c)| {
                let copies: Vec<_> = c.replicas().iter().map(|r| addr(r.server)).collect();
                serde_json::json!([idx, copies])
            })
            .collect();
        serde_json::Value::Array(list)
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
    /// The pool's error names the server that failed.
    fn run_ops(
        &self,
        pinned: Pinned,
        ops: &[RemoteOp],
    ) -> std::result::Result<(), crate::client::PoolError> {
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
        res
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

    /// Reads `len` file bytes at `offset`. Up to [`IO_SIZE`] (a FUSE read) they stay in the
    /// pooled buffer the fabric read them into, and go on from there without another copy.
    pub fn read_buf(&self, chunks: &ChunkMap, offset: u64, len: usize) -> Result<ReadBuf<'_>> {
        if len > IO_SIZE {
            let mut out = vec![0u8; len];
            self.read(chunks, offset, &mut out)?;
            return Ok(ReadBuf(ReadBytes::Owned(out)));
        }
        let loan = self.loan()?;
        self.read_window(chunks, offset, len, loan.b())?;
        Ok(ReadBuf(ReadBytes::Loaned(loan, len)))
    }

    /// Reads file bytes at `offset` into `out`.
    pub fn read(&self, chunks: &ChunkMap, offset: u64, out: &mut [u8]) -> Result<()> {
        let loan = self.loan()?;
        let b = loan.b();
        for (w, window) in out.chunks_mut(IO_SIZE).enumerate() {
            self.read_window(chunks, offset + (w * IO_SIZE) as u64, window.len(), b)?;
            b.buf.read_at(0, window);
        }
        Ok(())
    }

    /// Reads `len` (at most [`IO_SIZE`]) file bytes at `woff` into the start of `b`, holes as
    /// zeros. A copy that fails is avoided and the window read again from the others.
    fn read_window(&self, chunks: &ChunkMap, woff: u64, len: usize, b: &Bounce) -> Result<()> {
        let base = b.buf.addr();
        // Of the piece `n` bytes long at `in_chunk` of chunk `idx`, what the chunk holds (the
        // rest is a hole: no chunk, or past a short chunk's end).
        let covered = |idx: u64, in_chunk: u64, n: u64| {
            chunks
                .get(&idx)
                .map_or(0, |c| c.len.saturating_sub(in_chunk).min(n))
        };
        // The buffer is reused: what no chunk covers is zeroed here.
        for (idx, in_chunk, n, at) in self.pieces(woff, len as u64) {
            let covered = covered(idx, in_chunk, n);
            if covered < n {
                b.buf.zero((at + covered) as usize, (n - covered) as usize);
            }
        }
        let mut avoid: Vec<u32> = Vec::new();
        loop {
            let mut ops = Vec::new();
            for (idx, in_chunk, n, at) in self.pieces(woff, len as u64) {
                let covered = covered(idx, in_chunk, n);
                if covered == 0 {
                    continue;
                }
                let c = &chunks[&idx];
                let copy = self.pick(c, idx, &avoid).ok_or_else(|| lost(idx))?;
                ops.push(RemoteOp {
                    opcode: Opcode::Read,
                    local: Sge {
                        addr: base + at,
                        len: covered,
                        lkey: 0,
                    },
                    remote: region(c, &copy),
                    offset: in_chunk,
                });
            }
            if ops.is_empty() {
                return Ok(());
            }
            match self.run_ops(self.pin(base, len as u64)?, &ops) {
                Ok(()) => return Ok(()),
                Err(e) => match e.failed_server() {
                    Some(s) if !avoid.contains(&s.0) => {
                        log::warn!("read from {s} failed ({e}); reading another copy");
                        avoid.push(s.0);
                    }
                    _ => return Err(e.into()),
                },
            }
        }
    }

    /// Writes `payload` at file `offset`, allocating or growing chunks as needed. Returns once
    /// the bytes are in remote memory. A [`Payload::InPlace`] lies in memory that stays mapped
    /// for the life of this store (FUSE's request buffers): it is registered through the cache
    /// and sent as it is, without a bounce copy.
    pub fn write(&self, chunks: &mut ChunkMap, offset: u64, payload: Payload<'_>) -> Result<()> {
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
            self.write_window(chunks, woff, base, wlen)?;
        }
        Ok(())
    }

    /// Writes one window (local bytes at `base`) to every copy of its chunks, which exist.
    fn write_window(&self, chunks: &mut ChunkMap, woff: u64, base: u64, wlen: u64) -> Result<()> {
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
    fn write_replicated(
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

    /// Before chunk `idx` is written: copies on servers that went down leave it (they would
    /// miss this write), missing copies are placed again where there is room (best effort),
    /// and a chunk left with fewer than `--min-replicas` copies is refused with EIO.
    fn heal(&self, chunks: &mut ChunkMap, idx: u64) -> Result<()> {
        chunks
            .update(idx, |c| self.heal_chunk(idx, c))
            .unwrap_or(Ok(()))
    }

    fn heal_chunk(&self, idx: u64, c: &mut Chunk) -> Result<()> {
        let dead: Vec<u32> = c
            .replicas()
            .iter()
            .filter(|r| !self.pool.is_live(ServerId(r.server)))
            .map(|r| r.server)
            .collect();
        if dead.len() == c.replicas().len() {
            return Err(lost(idx));
        }
        for server in dead {
            self.let_go(c, server);
        }
        if c.replicas().len() < self.replicas {
            self.repair(idx, c);
        }
        if c.replicas().len() < self.min_replicas {
            return Err(Error::new(
                libc::EIO,
                format!(
                    "chunk {idx} has {} live copies and no server with room for more; \
                     --min-replicas is {}",
                    c.replicas().len(),
                    self.min_replicas
                ),
            ));
        }
        Ok(())
    }

    /// Takes chunk `c`'s copy on `server` out of it (it missed, or may miss, a write) and
    /// gives the extent back: at once to a live server, or once a down server resumes this
    /// mount's session ([`Pool::free`] remembers it).
    fn let_go(&self, c: &mut Chunk, server: u32) {
        if let Some(gone) = c.remove(server) {
            let _ = self.pool.free(region(c, &gone));
        }
    }

    /// Takes every copy on `server` out of `chunks` (that server came back without them);
    /// returns how many. A chunk left with no copy is lost: it stays listed, so reads of it
    /// fail with EIO instead of reading a hole.
    pub fn forget_copies(&self, chunks: &mut ChunkMap, server: ServerId) -> u64 {
        let mut n = 0;
        chunks.update_all(|c| {
            if c.remove(server.0).is_some() {
                n += 1;
            }
        });
        n
    }

    /// Chunk indexes of `chunks` with fewer live copies than `--replicas` (what a rebuild
    /// pass visits).
    pub fn degraded(&self, chunks: &ChunkMap) -> Vec<u64> {
        chunks
            .iter()
            .filter(|(_, c)| self.live_copies(c).count() < self.replicas)
            .map(|(i, _)| *i)
            .collect()
    }

    /// Rebuild of one chunk (called with the file's chunk map locked, so no write races the
    /// copy): copies on dead servers leave it while a live copy remains, and missing copies
    /// are placed and copied. Returns the bytes copied (0: nothing to do, or no room).
    pub fn rebuild_chunk(&self, chunks: &mut ChunkMap, idx: u64) -> u64 {
        chunks
            .update(idx, |c| self.rebuild_copies(idx, c))
            .unwrap_or(0)
    }

    fn rebuild_copies(&self, idx: u64, c: &mut Chunk) -> u64 {
        let dead: Vec<u32> = c
            .replicas()
            .iter()
            .filter(|r| !self.pool.is_live(ServerId(r.server)))
            .map(|r| r.server)
            .collect();
        if dead.len() == c.replicas().len() {
            return 0; // lost: nothing to copy from
        }
        for server in dead {
            self.let_go(c, server);
        }
        if c.replicas().len() >= self.replicas {
            return 0;
        }
        self.repair(idx, c) as u64 * c.len
    }

    /// Places the missing copies of chunk `idx` on live servers that hold none of it and
    /// copies its bytes there from a live copy; returns how many it added. Best effort:
    /// without room or another live server the chunk stays degraded (and counted so in
    /// `stats`).
    fn repair(&self, idx: u64, c: &mut Chunk) -> usize {
        let missing = self.replicas - c.replicas().len();
        let holders: Vec<ServerId> = c.replicas().iter().map(|r| ServerId(r.server)).collect();
        if self.pool.live_servers() <= holders.len() {
            return 0;
        }
        let mut new = match self.pool.alloc_replicas(c.len, missing, &holders) {
            Ok(v) => v,
            Err(e) => {
                log::debug!("chunk {idx} stays degraded: {e}");
                return 0;
            }
        };
        let buf = self.repair_buf.lock();
        match self.copy_chunk(c, &mut new, &buf) {
            Ok(()) => {
                for r in &new {
                    c.add(replica(r));
                }
                log::debug!(
                    "chunk {idx}: {} new copies ({} bytes each)",
                    new.len(),
                    c.len
                );
                new.len()
            }
            Err(e) => {
                self.pool.free_all(&new);
                log::warn!("chunk {idx} stays degraded: copying it failed: {e}");
                0
            }
        }
    }

    /// Copies the `from.len` bytes of chunk `from` (read from any live copy) to every region
    /// of `to`, through `buf`. A target that fails is dropped from `to` (and freed) while
    /// another remains.
    fn copy_chunk(&self, from: &Chunk, to: &mut Vec<RemoteRegion>, buf: &Bounce) -> Result<()> {
        let base = buf.buf.addr();
        let mut copied = 0;
        while copied < from.len {
            let n = (from.len - copied).min(IO_SIZE as u64);
            let local = Sge {
                addr: base,
                len: n,
                lkey: 0,
            };
            let mut avoid = Vec::new();
            loop {
                let copy = self.pick(from, 0, &avoid).ok_or_else(|| lost(0))?;
                let read = RemoteOp {
                    opcode: Opcode::Read,
                    local,
                    remote: region(from, &copy),
                    offset: copied,
                };
                match self.run_ops(self.pin(base, n)?, &[read]) {
                    Ok(()) => break,
                    Err(e) => match e.failed_server() {
                        Some(s) => avoid.push(s.0),
                        None => return Err(e.into()),
                    },
                }
            }
            // The writes start only once the read has landed (two rounds).
            loop {
                let writes: Vec<RemoteOp> = to
                    .iter()
                    .map(|r| RemoteOp {
                        opcode: Opcode::Write,
                        local,
                        remote: *r,
                        offset: copied,
                    })
                    .collect();
                let e = match self.run_ops(self.pin(base, n)?, &writes) {
                    Ok(()) => break,
                    Err(e) => e,
                };
                match e.failed_server() {
                    Some(s) if to.len() > 1 => {
                        let i = to.iter().position(|r| r.server == s).expect("one of ours");
                        let gone = to.remove(i);
                        self.pool.free_all(&[gone]);
                    }
                    _ => return Err(e.into()),
                }
            }
            copied += n;
        }
        Ok(())
    }

    /// New copies of a chunk of `len` bytes: `--replicas` of them, or one per live server if
    /// fewer are up; ENOSPC if the live servers cannot hold that many, EIO if that is fewer
    /// than `--min-replicas`.
    fn place(&self, len: u64) -> Result<Vec<RemoteRegion>> {
        let regions = match self.stocked(len) {
            Some(r) => r,
            None => self.pool.alloc_replicas(len, self.replicas, &[])?,
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
    fn stocked(&self, len: u64) -> Option<Vec<RemoteRegion>> {
        self.pool
            .take_stocked(len, self.replicas, self.min_replicas)
    }

    /// Write ops for a window whose chunks all exist: one per piece and copy.
    fn window_ops(&self, chunks: &ChunkMap, woff: u64, base: u64, wlen: u64) -> Vec<RemoteOp> {
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

    /// One window of a write with FRRWP: tagged allocations for missing chunks go out first
    /// (one per copy), the local buffer is registered meanwhile, and the writes to new chunks
    /// are submitted as conditional writes that the reply thread posts when each rkey
    /// arrives. Anything short of full success (a server full or failing) goes on through
    /// the serial path, which places and heals copies and writes again.
    fn write_window_frrwp(
        &self,
        chunks: &mut ChunkMap,
        woff: u64,
        base: u64,
        wlen: u64,
        b: &Bounce,
    ) -> Result<()> {
        // Existing chunks first lose copies on servers that went down (or get new ones).
        for (idx, _, _, _) in self.pieces(woff, wlen) {
            self.heal(chunks, idx)?;
        }
        // 1. Tagged requests for chunks that do not exist yet (one per chunk index and copy),
        //    unless the pool has their extents in stock.
        let mut tickets: Vec<(u64, Ticket)> = Vec::new();
        for (idx, in_chunk, n, _) in self.pieces(woff, wlen) {
            // (Short chunks were grown by the caller.)
            if !chunks.contains_key(&idx) && !tickets.iter().any(|(i, _)| *i == idx) {
                let len = self.target_len(idx, 0, in_chunk + n);
                // From stock, the chunk exists at once and is written like any other.
                if let Some(regions) = self.stocked(len) {
                    chunks.insert(idx, chunk_of(&regions));
                    continue;
                }
                match self.pool.begin_alloc_replicas(len, self.replicas) {
                    Ok(ts) => tickets.extend(ts.into_iter().map(|t| (idx, t))),
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
            let mine: Vec<usize> = (0..tickets.len())
                .filter(|&k| tickets[k].0 == idx)
                .collect();
            if mine.is_empty() {
                let c = &chunks[&idx];
                for copy in c.replicas() {
                    ops.extend(parts.iter().map(|&(sge, d, _)| RemoteOp {
                        opcode: Opcode::Write,
                        local: sge,
                        remote: region(c, copy),
                        offset: in_chunk + d,
                    }));
                }
            }
            for k in mine {
                crws[k]
                    .1
                    .extend(parts.iter().map(|&(sge, d, _)| (sge, in_chunk + d)));
            }
        }
        let res = self.pool.execute_frrwp(&ops, &crws);
        self.cache.release(pinned);
        // A chunk one of whose servers was full is given back whole: the serial path places
        // it again on servers with room for every copy, or answers ENOSPC.
        let full: Vec<u64> = tickets
            .iter()
            .filter(|(_, t)| t.refused_for_space())
            .map(|(i, _)| *i)
            .collect();
        self.adopt(chunks, &tickets);
        // A new chunk granted on fewer servers than `--min-replicas` (the others down or
        // silent) is not acknowledged here: the serial path heals it (places the missing
        // copies where it can) or refuses the write with EIO.
        let short = tickets.iter().any(|(idx, _)| {
            chunks
                .get(idx)
                .is_none_or(|c| c.replicas().len() < self.min_replicas)
        });
        if res.is_ok() && full.is_empty() && !short {
            return Ok(());
        }
        for idx in full {
            if let Some(c) = chunks.remove(&idx) {
                self.free_chunk(&c);
            }
        }
        for (idx, in_chunk, n, _) in self.pieces(woff, wlen) {
            self.ensure(chunks, idx, in_chunk + n, b)?;
        }
        self.write_window(chunks, woff, base, wlen)
    }

    /// Records every extent the tickets were granted as the file's chunks (the copies of
    /// one chunk index together), whatever happened to the writes (they are the file's now,
    /// zeroed, and freed with it): waits, bounded by the control timeout, for answers still on
    /// their way, so nothing granted is leaked. A copy whose write did not land is rewritten
    /// by the caller before the write returns.
    fn adopt(&self, chunks: &mut ChunkMap, tickets: &[(u64, Ticket)]) {
        let mut granted: BTreeMap<u64, Vec<RemoteRegion>> = BTreeMap::new();
        for (idx, t) in tickets {
            if let Some(r) = t.wait_region(self.pool.timeout()) {
                granted.entry(*idx).or_default().push(r);
            }
        }
        for (idx, regions) in granted {
            chunks.insert(idx, chunk_of(&regions));
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

    /// Makes chunk `idx` at least `needed` bytes long: allocates it (every copy), or moves a
    /// short first chunk into larger extents (copying its bytes through `b`).
    fn ensure(&self, chunks: &mut ChunkMap, idx: u64, needed: u64, b: &Bounce) -> Result<()> {
        let current = chunks.get(&idx).copied();
        if current.is_some_and(|c| c.len >= needed) {
            return Ok(());
        }
        let len = self.target_len(idx, current.map_or(0, |c| c.len), needed);
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

    /// Allocates every chunk covering `[offset, offset+len)` (fallocate), all or nothing.
    ///
    /// A range whose missing chunks cannot be placed (every copy of each on a distinct
    /// server, by the servers' room as last heard, and again after asking them) is refused
    /// with ENOSPC before anything is allocated: the cost of the check is bounded by the
    /// chunks the file already has and the servers, never by the range. What the check cannot
    /// see (fragmentation, other clients) may still refuse a chunk partway: the chunks this
    /// call allocated are then given back. A short first chunk is grown last, so a refusal
    /// before it leaves it as it was.
    pub fn allocate(&self, chunks: &mut ChunkMap, offset: u64, len: u64) -> Result<()> {
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
                        self.replicas,
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
            res = self.ensure(chunks, idx, in_chunk + n, loan.b());
            if res.is_err() {
                break;
            }
            added.push(idx);
        }
        if res.is_ok() && grow_head {
            res = self.ensure(chunks, 0, (offset + len).min(cs), loan.b());
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
    fn fits(&self, head: Option<u64>, whole: u64) -> bool {
        let mut room = self.pool.room();
        // With fewer servers up than copies kept, one copy on each ([`Self::place`]).
        let copies = self.replicas.min(room.len());
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
    pub fn truncate(&self, chunks: &mut ChunkMap, size: u64) -> Result<()> {
        let cs = self.chunk_size;
        if size % cs != 0 && chunks.contains_key(&(size / cs)) {
            self.zero_in_chunk(chunks, size / cs, size % cs, cs)?;
        }
        let keep = size.div_ceil(cs);
        let gone: Vec<u64> = chunks.range(keep..).map(|(i, _)| *i).collect();
        for i in gone {
            let c = chunks.remove(&i).expect("listed");
            self.free_chunk(&c);
        }
        Ok(())
    }

    /// Zeroes bytes `[from, to)` of chunk `idx` (as far as the chunk reaches) on every copy.
    fn zero_in_chunk(&self, chunks: &mut ChunkMap, idx: u64, from: u64, to: u64) -> Result<()> {
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
    pub fn punch(&self, chunks: &mut ChunkMap, offset: u64, len: u64) -> Result<()> {
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
            let c = chunks[&idx];
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
    fn shift_chunks(&self, chunks: &mut ChunkMap, from: u64, delta: i64) {
        let moving = chunks.split_off(from);
        for (idx, c) in moving {
            chunks.insert(idx.saturating_add_signed(delta), c);
        }
    }

    /// Copies file bytes `[src, src+len)` to `dst` through a bounce window, back to front
    /// when the destination lies above the source so nothing is overwritten before it is
    /// read. Holes are copied as zeros written (allocating where the destination has none).
    fn copy_within(&self, chunks: &mut ChunkMap, src: u64, dst: u64, len: u64) -> Result<()> {
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
    pub fn collapse(&self, chunks: &mut ChunkMap, offset: u64, len: u64, size: u64) -> Result<()> {
        let cs = self.chunk_size;
        if offset % cs == 0 && len % cs == 0 {
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
    pub fn insert(&self, chunks: &mut ChunkMap, offset: u64, len: u64, size: u64) -> Result<()> {
        let cs = self.chunk_size;
        if offset % cs == 0 && len % cs == 0 {
            self.shift_chunks(chunks, offset / cs, (len / cs) as i64);
            return Ok(());
        }
        // As in collapse: room for every byte the copy writes, before it moves any.
        self.allocate(chunks, offset + len, size - offset)?;
        self.copy_within(chunks, offset, offset + len, size - offset)?;
        self.punch(chunks, offset, len)
    }

    /// Gives every copy of a chunk back (a server that is gone took its memory with it).
    fn free_chunk(&self, c: &Chunk) {
        for copy in c.replicas() {
            if let Err(e) = self.pool.free(region(c, copy)) {
                log::debug!("freeing a chunk on server {}: {e}", copy.server);
            }
        }
    }

    /// Gives every chunk back (unlinked file, last close).
    pub fn release(&self, chunks: BTreeMap<u64, Chunk>) {
        for c in chunks.values() {
            self.free_chunk(c);
        }
    }
}
