//! Copies made to agree after a crash. A write over bytes a chunk already holds goes to each
//! copy in place; a daemon that dies part way leaves one copy new and another old, and reads
//! that move from one copy to another (a server lost, a rebuild) would return both. The
//! namespace marks a file before such a write (`fs::overwrite`); attach calls
//! [`DataStore::reconcile`] on each marked file's chunks: the first live copy in the chunk's
//! order is copied over the others, as md RAID's resync after a crash does for the regions
//! its write-intent bitmap names.

use super::*;

impl DataStore {
    /// Whether a chunk holding bytes of `[start, end)` has more than one copy (a write there
    /// in place could leave them disagreeing).
    pub(super) fn shares_copies(&self, chunks: &ChunkMap, start: u64, end: u64) -> bool {
        if start >= end {
            return false;
        }
        let cs = self.chunk_size;
        chunks
            .range(start / cs..=(end - 1) / cs)
            .any(|(&idx, c)| idx * cs + c.len > start && c.replicas().len() > 1)
    }

    /// Makes every live copy of every chunk in `chunks` hold what the chunk's first live copy
    /// holds. Copies on servers that are down leave their chunks (they could not be made to
    /// agree; the rebuild places new ones), as does a copy that fails to be read or written
    /// while another remains. Returns the chunks whose copies were written; a chunk with no
    /// live copy is left as it is (its reads fail).
    pub(super) fn reconcile(&self, chunks: &mut ChunkMap) -> Result<u64> {
        let loan = self.loan()?;
        let b = loan.bounce();
        let idxs: Vec<u64> = chunks.iter().map(|(&i, _)| i).collect();
        let mut written = 0;
        for idx in idxs {
            let done = chunks.update(idx, |c| self.reconcile_chunk(idx, c, b));
            if let Some(Err(e)) = &done {
                log::warn!("chunk {idx}: its copies could not be made to agree ({e})");
            }
            written += u64::from(matches!(done, Some(Ok(true))));
        }
        Ok(written)
    }

    /// [`Self::reconcile`] for one chunk: true if copies were written.
    fn reconcile_chunk(&self, idx: u64, c: &mut Chunk, b: &Bounce) -> Result<bool> {
        let dead: Vec<u32> = c
            .replicas()
            .iter()
            .filter(|r| !self.pool.is_live(ServerId(r.server)))
            .map(|r| r.server)
            .collect();
        if dead.len() == c.replicas().len() {
            return Ok(false);
        }
        for server in dead {
            self.let_go(c, server);
        }
        if c.replicas().len() < 2 {
            return Ok(false);
        }
        // Copies that failed: left out of every later window, and let go of at the end.
        let mut failed: Vec<u32> = Vec::new();
        let mut source = None;
        // Window by window, from the first copy in the chunk's order that has not failed.
        let copies = c.replicas();
        let copied = self.copy_windows(
            idx,
            c.len,
            b,
            &mut failed,
            &mut source,
            |failed| {
                let from = copies.iter().find(|r| !failed.contains(&r.server))?;
                Some(region(c, from))
            },
            |from, failed| {
                copies
                    .iter()
                    .filter(|r| r.server != from && !failed.contains(&r.server))
                    .map(|r| region(c, r))
                    .collect()
            },
            |_| true,
        );
        if let (Err(_), Some(source)) = (&copied, source) {
            // Cut part way by an error no server is to blame for: the copies may still
            // disagree, so only the one read from stays (the rebuild copies it again).
            failed.extend(
                c.replicas()
                    .iter()
                    .map(|r| r.server)
                    .filter(|&s| s != source),
            );
        }
        for server in failed {
            if c.replicas().len() > 1 {
                self.let_go(c, server);
            }
        }
        copied.map(|()| true)
    }

    /// The bytes of each copy of chunk `idx`, by server (tests: whether copies agree).
    #[cfg(feature = "testing")]
    pub(super) fn copies_of(&self, chunks: &ChunkMap, idx: u64) -> Result<Vec<(u32, Vec<u8>)>> {
        let Some(c) = chunks.get(&idx) else {
            return Ok(Vec::new());
        };
        let loan = self.loan()?;
        let b = loan.bounce();
        let mut out = Vec::new();
        for r in c.replicas() {
            let mut bytes = vec![0u8; c.len as usize];
            for (w, window) in bytes.chunks_mut(IO_SIZE).enumerate() {
                let local = Sge {
                    addr: b.buf.addr(),
                    len: window.len() as u64,
                    lkey: 0,
                };
                let read = RemoteOp {
                    opcode: Opcode::Read,
                    local,
                    remote: region(c, r),
                    offset: (w * IO_SIZE) as u64,
                };
                self.run_ops(self.pin(local.addr, local.len)?, &[read])?;
                b.buf.read_at(0, window);
            }
            out.push((r.server, bytes));
        }
        Ok(out)
    }

    /// Writes `bytes` at `offset` of chunk `idx`'s copy on `server` only (tests: a write a
    /// crash cut after one copy).
    #[cfg(feature = "testing")]
    pub(super) fn write_one_copy(
        &self,
        chunks: &ChunkMap,
        idx: u64,
        server: u32,
        offset: u64,
        bytes: &[u8],
    ) -> Result<()> {
        let c = chunks.get(&idx).ok_or_else(|| lost(idx))?;
        let r = c.on(server).ok_or_else(|| lost(idx))?;
        assert!(bytes.len() <= IO_SIZE && offset + bytes.len() as u64 <= c.len);
        let loan = self.loan()?;
        let b = loan.bounce();
        b.buf.write_at(0, bytes);
        let write = RemoteOp {
            opcode: Opcode::Write,
            local: Sge {
                addr: b.buf.addr(),
                len: bytes.len() as u64,
                lkey: 0,
            },
            remote: region(c, &r),
            offset,
        };
        Ok(self.run_ops(self.pin(b.buf.addr(), bytes.len() as u64)?, &[write])?)
    }
}
