//! FRRWP windows: tagged allocations for missing chunks go out first, the local buffer is
//! registered meanwhile, and writes to the new chunks are conditional on the tags.

use super::*;

impl DataStore {
    /// One window of a write with FRRWP: tagged allocations for missing chunks go out first
    /// (one per copy), the local buffer is registered meanwhile, and the writes to new chunks
    /// are submitted as conditional writes that the reply thread posts when each rkey
    /// arrives. Anything short of full success (a server full or failing) goes on through
    /// the serial path, which places and heals copies and writes again.
    pub(super) fn write_window_frrwp(
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
                match self.pool.begin_alloc_replicas(len, self.replicas()) {
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
            let parts = Self::split(std::slice::from_ref(&pinned), base + at, n);
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
    pub(super) fn adopt(&self, chunks: &mut ChunkMap, tickets: &[(u64, Ticket)]) {
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
}
