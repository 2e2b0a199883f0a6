//! Local buffers for remote I/O: bounce buffers on loan from a small pool, registered through
//! the registration cache, and the running of a batch of ops over them.

use super::{Bounce, DataStore, Loan, IO_SIZE};
use crate::client::RemoteOp;
use crate::error::Result;
use crate::fabric::{AlignedBuf, Sge};
use crate::regcache::Pinned;
use crate::sync::Arc;

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

    pub(super) fn loan(&self) -> Result<Loan<'_>> {
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
}
