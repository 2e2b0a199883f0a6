//! Local buffers for remote I/O: bounce buffers on loan from a small pool, registered through
//! the registration cache, and the running of a batch of ops over them.

use super::{Bounce, DataStore, IO_SIZE};
use crate::client::RemoteOp;
use crate::error::Result;
use crate::fabric::{AlignedBuf, Sge};
use crate::regcache::Pinned;
use crate::sync::{Arc, Condvar, Mutex};

impl DataStore {
    pub(super) fn make_bounce() -> Result<Bounce> {
        Ok(Bounce {
            buf: Arc::new(AlignedBuf::new(IO_SIZE)?),
        })
    }

    /// Registrations covering `[addr, addr+len)`, from the cache.
    pub(super) fn pin(&self, addr: u64, len: u64) -> Result<Pinned> {
        Ok(self.cache.acquire(addr, len)?)
    }

    /// [`Self::pin`] of each of `ranges` (address, length), all or none: what was pinned
    /// before one failed is given back.
    pub(super) fn pin_all(&self, ranges: &[(u64, u64)]) -> Result<Vec<Pinned>> {
        let mut out = Vec::with_capacity(ranges.len());
        for &(addr, len) in ranges {
            match self.pin(addr, len) {
                Ok(p) => out.push(p),
                Err(e) => {
                    for p in out {
                        self.cache.release(p);
                    }
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// Splits the local range `[addr, addr+len)` at the boundaries of `pinned`'s
    /// registrations: `(sge, offset into the range, already registered)` for each part.
    pub(super) fn split(pinned: &[Pinned], addr: u64, len: u64) -> Vec<(Sge, u64, bool)> {
        let mut out = Vec::new();
        let (mut at, end) = (addr, addr + len);
        while at < end {
            let piece = pinned
                .iter()
                .flat_map(|p| &p.pieces)
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
    pub(super) fn run_ops(
        &self,
        pinned: Pinned,
        ops: &[RemoteOp],
    ) -> std::result::Result<(), crate::client::PoolError> {
        self.run_ops_pinned(vec![pinned], ops)
    }

    /// As [`Self::run_ops`], with local ranges in any of several pinned buffers (a read's
    /// window and a decode buffer filled in one batch).
    pub(super) fn run_ops_pinned(
        &self,
        pinned: Vec<Pinned>,
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
        for p in pinned {
            self.cache.release(p);
        }
        res
    }

    /// A bounce buffer from the I/O pool (see [`BouncePool`]).
    pub(super) fn loan(&self) -> Result<Lent<'_>> {
        self.io_bufs.take()
    }
}

/// Bounce buffers lent one at a time, made on first need up to a bound and kept (each is
/// registered through the cache once, on its first use): the I/O pool every read and write
/// borrows from, and the decode buffers of degraded reads (`coding`).
pub(super) struct BouncePool {
    free: Mutex<Vec<Bounce>>,
    returned: Condvar,
    made: Mutex<usize>,
    max: usize,
}

impl BouncePool {
    /// A pool of at most `max` buffers (at least one).
    pub(super) fn new(max: usize) -> BouncePool {
        BouncePool {
            free: Mutex::new(Vec::new()),
            returned: Condvar::new(),
            made: Mutex::new(0),
            max: max.max(1),
        }
    }

    /// A free buffer, a new one while fewer than the bound exist, else the next returned.
    pub(super) fn take(&self) -> Result<Lent<'_>> {
        let mut free = self.free.lock();
        loop {
            if let Some(b) = free.pop() {
                return Ok(Lent {
                    pool: self,
                    bounce: Some(b),
                });
            }
            {
                let mut made = self.made.lock();
                if *made < self.max {
                    *made += 1;
                    drop(made);
                    drop(free);
                    return match DataStore::make_bounce() {
                        Ok(b) => Ok(Lent {
                            pool: self,
                            bounce: Some(b),
                        }),
                        Err(e) => {
                            *self.made.lock() -= 1;
                            Err(e)
                        }
                    };
                }
            }
            free = self.returned.wait(free);
        }
    }
}

/// A bounce buffer lent from a [`BouncePool`]; back to it on drop.
pub(super) struct Lent<'a> {
    pool: &'a BouncePool,
    bounce: Option<Bounce>,
}

impl Lent<'_> {
    pub(super) fn bounce(&self) -> &Bounce {
        self.bounce.as_ref().expect("present until drop")
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.bounce.take() {
            self.pool.free.lock().push(b);
            self.pool.returned.notify_one();
        }
    }
}
