//! Whole-extent transfers for a volume's own records (its journal ring and checkpoint):
//! bytes written at once to every copy, or read from one.
//!
//! Why here: the data store owns the registration of local buffers (the MRRC) and the one
//! way to run a batch of one-sided operations; the volume only says what goes where.

use super::DataStore;
use crate::client::{PoolError, RemoteOp};
use crate::fabric::{Opcode, RemoteRegion, Sge};

impl DataStore {
    /// Writes `bytes` at `offset` into every region of `to` in one batch of one-sided
    /// WRITEs (each at most [`super::IO_SIZE`]). The error names a server that failed.
    pub fn write_regions(
        &self,
        to: &[RemoteRegion],
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), PoolError> {
        self.transfer(
            Opcode::Write,
            to,
            offset,
            bytes.as_ptr() as u64,
            bytes.len(),
        )
    }

    /// Reads `len` bytes at `offset` of `from`.
    pub fn read_region(
        &self,
        from: RemoteRegion,
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>, PoolError> {
        let mut out = vec![0u8; len];
        self.transfer(Opcode::Read, &[from], offset, out.as_mut_ptr() as u64, len)?;
        Ok(out)
    }

    /// One batch moving `len` bytes of local memory at `base` to or from `offset` of each
    /// region; the caller's buffer outlives the call, which waits for every completion.
    fn transfer(
        &self,
        opcode: Opcode,
        regions: &[RemoteRegion],
        offset: u64,
        base: u64,
        len: usize,
    ) -> Result<(), PoolError> {
        if len == 0 {
            return Ok(());
        }
        if let Some(r) = regions.iter().find(|r| offset + len as u64 > r.len) {
            return Err(PoolError::Invalid(format!(
                "{len} bytes at {offset} do not fit the {}-byte extent on {}",
                r.len, r.server
            )));
        }
        let pinned = self
            .pin(base, len as u64)
            .map_err(|e| PoolError::Invalid(e.message))?;
        let mut ops = Vec::new();
        let mut done = 0;
        while done < len {
            let n = (len - done).min(super::IO_SIZE);
            for r in regions {
                ops.push(RemoteOp {
                    opcode,
                    local: Sge {
                        addr: base + done as u64,
                        len: n as u64,
                        lkey: 0,
                    },
                    remote: *r,
                    offset: offset + done as u64,
                });
            }
            done += n;
        }
        self.run_ops(pinned, &ops)
    }
}
