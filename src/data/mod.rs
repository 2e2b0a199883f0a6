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
//! (`regcache`): write payloads go straight from the caller's buffer when the caller vouches that
//! it lives as long as the mount (FUSE's request buffers), otherwise through a bounce buffer;
//! reads land in bounce buffers from a small pool. The cache turns repeated use of the same
//! buffers into hits, so registration (pinning) is paid once, not per operation.

use crate::client::frrwp::Ticket;
use crate::client::{Pool, RemoteOp, Room};
use crate::error::{Error, Result};
use crate::fabric::mem::page_size;
use crate::fabric::{AlignedBuf, Opcode, RemoteRegion, ServerId, Sge};
use crate::meta::{Chunk, ChunkMap, Replica, MAX_REPLICAS};
use crate::regcache::{CacheConfig, CacheStats, FabricRegistrar, Policy, RegCache};
use crate::sync::atomic::{AtomicUsize, Ordering};
use crate::sync::{Arc, Condvar, Mutex};
use std::collections::BTreeMap;

pub use balance::Ledger;
pub use behind::WriteBehindStats;
pub use io::{FileIo, FileView};

mod balance;
mod behind;
mod buffers;
mod coding;
mod decode;
mod frrwp;
mod io;
mod read;
mod reconcile;
mod remote;
mod replicas;
mod shapes;
mod write;

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
    io_bufs: buffers::BouncePool,
    /// Zeros, for clearing the tail of a chunk on truncate.
    zeros: Bounce,
    /// Copies kept of every chunk (`--replicas`; `rmemfs admin set-replicas` changes it live,
    /// and the rebuild brings every chunk to it).
    replicas: AtomicUsize,
    /// Fewest copies a write may land on (`--min-replicas`); fewer is EIO.
    min_replicas: usize,
    /// What chunk copies (replacing a lost replica) go through: one at a time, and only after
    /// a failure, so one buffer is enough and stays registered in the cache.
    repair_buf: Mutex<Bounce>,
    /// Chunks given a new copy on the write path (a copy was on a server that was down),
    /// beside the rebuild's own count: what a restarted server's absence cost in copies.
    copied_on_write: crate::sync::atomic::AtomicU64,
    /// The erasure code cold chunks are encoded with (`--redundancy ec:K+M`; see `coding`).
    coding: Option<crate::meta::Coding>,
    /// How long a file goes unwritten before its chunks are encoded.
    cold_after: std::time::Duration,
    /// What degraded reads of encoded chunks read fragments into (`coding::DecodeBuffers`):
    /// a few, registered in the cache once, so decodes run on every core at once.
    decode_bufs: buffers::BouncePool,
    #[cfg(feature = "testing")]
    die_before_switch: crate::sync::atomic::AtomicBool,
    /// Writes answered before they are remote (private mounts; see `behind`). After `cache`,
    /// so its arena's registrations go first.
    behind: Option<behind::WriteBehind>,
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
    /// Of the healthy ones, chunks with more copies than `--replicas` (lowered live: the
    /// rebuild drops the extra ones).
    pub surplus: u64,
    /// Of all of them, chunks held as erasure-coded stripes (the others are copies), and
    /// of those, stripes with a fragment lost or on a server down.
    pub encoded: u64,
    pub stripes_degraded: u64,
    /// Bytes of server memory the chunks' copies hold (every copy), and the stripes'
    /// fragments.
    pub copy_bytes: u64,
    pub stripe_bytes: u64,
    /// Chunks with a copy on a server being drained, and the bytes of those copies (what a
    /// drain has left to move).
    pub moving: u64,
    pub moving_bytes: u64,
}

/// File bytes read for a reply: in the pooled buffer the fabric read them into (a FUSE-sized
/// read), or owned (larger ones).
pub struct ReadBuf<'a>(ReadBytes<'a>);

enum ReadBytes<'a> {
    Loaned(buffers::Lent<'a>, usize),
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
            ReadBytes::Loaned(loan, len) => unsafe { loan.bounce().buf.quiet_bytes(0, *len) },
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

/// The copy (or fragment) `r` of chunk `c`, as the pool addresses it.
fn region(c: &Chunk, r: &Replica) -> RemoteRegion {
    RemoteRegion {
        server: ServerId(r.server),
        addr: r.addr,
        len: c.extent_len(),
        rkey: r.rkey,
    }
}

/// Every extent of chunk `c` (its copies, or its fragments), as the pool addresses them.
fn regions(c: &Chunk) -> Vec<RemoteRegion> {
    c.extents().iter().map(|r| region(c, r)).collect()
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
    /// Chunks given a new copy on the write path ([`DataStore::copied_on_write`]).
    pub fn copied_on_write(&self) -> u64 {
        self.copied_on_write
            .load(crate::sync::atomic::Ordering::Relaxed)
    }

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
            io_bufs: buffers::BouncePool::new(max_bufs),
            zeros,
            replicas: AtomicUsize::new(1),
            min_replicas: 1,
            repair_buf: Mutex::new(Self::make_bounce()?),
            copied_on_write: Default::default(),
            coding: None,
            cold_after: crate::config::EC_COLD_AFTER,
            decode_bufs: buffers::BouncePool::new(coding::DECODE_BUFFERS),
            #[cfg(feature = "testing")]
            die_before_switch: Default::default(),
            behind: None,
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
        self.replicas = AtomicUsize::new(replicas);
        self.min_replicas = min_replicas;
        Ok(self)
    }

    /// Copies kept of every chunk.
    pub fn replicas(&self) -> usize {
        self.replicas.load(Ordering::Relaxed)
    }

    /// Keeps `replicas` copies of every chunk from now on: new chunks get them, and the
    /// rebuild adds or drops copies of the others. Fewer than `--min-replicas`, or more than
    /// the live servers can hold apart, is refused.
    pub fn set_replicas(&self, replicas: usize) -> Result<()> {
        if !(1..=MAX_REPLICAS).contains(&replicas) {
            return Err(Error::new(
                libc::EINVAL,
                format!("{replicas} copies: between 1 and {MAX_REPLICAS}"),
            ));
        }
        if replicas < self.min_replicas {
            return Err(Error::new(
                libc::EINVAL,
                format!(
                    "{replicas} copies is below --min-replicas ({}): writes would fail",
                    self.min_replicas
                ),
            ));
        }
        let live = self.pool.live_servers();
        if replicas > live {
            return Err(Error::new(
                libc::EINVAL,
                format!("{replicas} copies need {replicas} live servers; {live} are up"),
            ));
        }
        self.replicas.store(replicas, Ordering::Relaxed);
        Ok(())
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
    pub(super) fn placement(&self, chunks: &ChunkMap) -> serde_json::Value {
        let servers = self.pool.status();
        let addr = |id: u32| servers.get(id as usize).map(|s| s.addr.to_string());
        let list: Vec<serde_json::Value> = chunks
            .iter()
            .map(|(idx, c)| {
                let copies: Vec<_> = c.extents().iter().map(|r| addr(r.server)).collect();
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
}
