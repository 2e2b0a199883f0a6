//! Whole-extent transfers for a volume's own records (its journal ring and checkpoint):
//! bytes written at once to every copy, or read from one.
//!
//! Why here: the data store owns the registration of local buffers (the MRRC) and the one
//! way to run a batch of one-sided operations; the volume only says what goes where.
//!
//! The bytes go through a bounce buffer of the store's, a window at a time: the caller's
//! memory is the heap's, and the registration cache may only hold memory that stays mapped
//! as long as it does ([`crate::regcache::FabricRegistrar`]). A heap buffer freed and
//! allocated again at the same address may sit on new pages, while a cached registration
//! still pins the old ones: a device (verbs) then sends the old pages' bytes, or reads into
//! them while the new buffer stays zero. The software fabrics move bytes by address and never
//! showed it.

use super::{DataStore, IO_SIZE};
use crate::client::{PoolError, RemoteOp};
use crate::fabric::{Opcode, RemoteRegion, Sge};

impl DataStore {
    /// Writes `bytes` at `offset` into every region of `to`, a window of [`IO_SIZE`] at a
    /// time (each window one batch, to every region). The error names a server that failed.
    pub fn write_regions(
        &self,
        to: &[RemoteRegion],
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), PoolError> {
        fits(to, offset, bytes.len())?;
        let loan = self.loan().map_err(|e| PoolError::Invalid(e.message))?;
        let b = loan.bounce();
        for (w, window) in bytes.chunks(IO_SIZE).enumerate() {
            b.buf.write_at(0, window);
            self.transfer_window(
                Opcode::Write,
                to,
                offset + (w * IO_SIZE) as u64,
                b,
                window.len(),
            )?;
        }
        Ok(())
    }

    /// Reads `len` bytes at `offset` of `from`.
    pub fn read_region(
        &self,
        from: RemoteRegion,
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>, PoolError> {
        fits(&[from], offset, len)?;
        let mut out = vec![0u8; len];
        let loan = self.loan().map_err(|e| PoolError::Invalid(e.message))?;
        let b = loan.bounce();
        for (w, window) in out.chunks_mut(IO_SIZE).enumerate() {
            let at = offset + (w * IO_SIZE) as u64;
            self.transfer_window(Opcode::Read, &[from], at, b, window.len())?;
            b.buf.read_at(0, window);
        }
        Ok(out)
    }

    /// One batch moving the first `len` bytes of bounce buffer `b` to or from `offset` of
    /// each region.
    fn transfer_window(
        &self,
        opcode: Opcode,
        regions: &[RemoteRegion],
        offset: u64,
        b: &super::Bounce,
        len: usize,
    ) -> Result<(), PoolError> {
        let base = b.buf.addr();
        let pinned = self
            .pin(base, len as u64)
            .map_err(|e| PoolError::Invalid(e.message))?;
        let ops: Vec<RemoteOp> = regions
            .iter()
            .map(|r| RemoteOp {
                opcode,
                local: Sge {
                    addr: base,
                    len: len as u64,
                    lkey: 0,
                },
                remote: *r,
                offset,
            })
            .collect();
        self.run_ops(pinned, &ops)
    }

    /// The local ranges the registration cache holds, as `(start, end)` (tests: only the
    /// store's own buffers may be there).
    #[cfg(feature = "testing")]
    pub fn cached_ranges(&self) -> Vec<(u64, u64)> {
        self.cache.stack()
    }
}

/// `len` bytes at `offset` must fit every region.
fn fits(regions: &[RemoteRegion], offset: u64, len: usize) -> Result<(), PoolError> {
    match regions.iter().find(|r| offset + len as u64 > r.len) {
        Some(r) => Err(PoolError::Invalid(format!(
            "{len} bytes at {offset} do not fit the {}-byte extent on {}",
            r.len, r.server
        ))),
        None => Ok(()),
    }
}
