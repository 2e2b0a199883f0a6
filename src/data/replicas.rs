//! Copies: healing a chunk before it is written, the rebuild of one chunk, forgetting the
//! copies of a server that came back empty, and counting chunks by health.

use super::*;

impl DataStore {
    /// Counts `chunks` by how many of their copies are on live servers.
    pub(super) fn health(&self, chunks: &ChunkMap, into: &mut ReplicaHealth) {
        let want = self.replicas();
        for c in chunks.values() {
            let moving = self.moving_copies(c) as u64;
            if moving > 0 {
                into.moving += 1;
                into.moving_bytes += moving * c.extent_len();
            }
            if let Some(s) = c.stripe() {
                let live = self.live_fragment_count(s);
                into.encoded += 1;
                into.stripe_bytes += s.present().count() as u64 * s.frag_len;
                if live < s.frags.len() {
                    into.stripes_degraded += 1;
                }
                if live < s.k as usize {
                    into.lost += 1;
                } else if live < s.frags.len() {
                    into.degraded += 1;
                } else {
                    into.healthy += 1;
                }
                continue;
            }
            into.copy_bytes += c.replicas().len() as u64 * c.len;
            let live = self.live_copies(c).count();
            if live == 0 {
                into.lost += 1;
            } else if live < want {
                into.degraded += 1;
            } else {
                into.healthy += 1;
                if c.replicas().len() > want {
                    into.surplus += 1;
                }
            }
        }
    }

    /// Before chunk `idx` is written: copies on servers that went down leave it (they would
    /// miss this write), missing copies are placed again where there is room (best effort),
    /// and a chunk left with fewer than `--min-replicas` copies is refused with EIO.
    pub(super) fn heal(&self, chunks: &mut ChunkMap, idx: u64) -> Result<()> {
        chunks
            .update(idx, |c| self.heal_chunk(idx, c))
            .unwrap_or(Ok(()))
    }

    /// Takes the copies on servers that are down out of chunk `c` (they would miss, or
    /// missed, writes) while a live copy remains; false, changing nothing, when none is live
    /// (the chunk is lost and keeps its copies listed, so reads fail instead of seeing a hole).
    fn let_go_of_dead_copies(&self, c: &mut Chunk) -> bool {
        let dead: Vec<u32> = c
            .replicas()
            .iter()
            .filter(|r| !self.pool.is_live(ServerId(r.server)))
            .map(|r| r.server)
            .collect();
        if dead.len() == c.replicas().len() {
            return false;
        }
        for server in dead {
            self.let_go(c, server);
        }
        true
    }

    pub(super) fn heal_chunk(&self, idx: u64, c: &mut Chunk) -> Result<()> {
        if !self.let_go_of_dead_copies(c) {
            return Err(lost(idx));
        }
        if c.replicas().len() < self.replicas() && self.repair(idx, c) > 0 {
            self.copied_on_write
                .fetch_add(1, crate::sync::atomic::Ordering::Relaxed);
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
    pub(super) fn let_go(&self, c: &mut Chunk, server: u32) {
        if let Some(gone) = c.remove(server) {
            self.retire(region(c, &gone));
        }
    }

    /// Lets go of one copy of `c` on a draining server, if it has one; whether it did.
    fn let_go_of_a_draining_copy(&self, c: &mut Chunk) -> bool {
        let leaving = c
            .replicas()
            .iter()
            .rev()
            .find(|r| self.pool.is_draining(ServerId(r.server)))
            .map(|r| r.server);
        leaving.inspect(|&server| self.let_go(c, server)).is_some()
    }

    /// Takes every copy on `server` out of `chunks` (that server came back without them);
    /// returns how many. A chunk left with no copy is lost: it stays listed, so reads of it
    /// fail with EIO instead of reading a hole.
    pub(super) fn forget_copies(&self, chunks: &mut ChunkMap, server: ServerId) -> u64 {
        chunks.forget_server(server.0)
    }

    /// Gives every copy on `server` the key `keys` lists for its address (the server
    /// restarted from its backing file and its device issued new keys); a copy at an address
    /// it does not list is taken out (the server holds nothing there). Returns how many
    /// copies changed.
    pub(super) fn rekey_copies(
        &self,
        chunks: &mut ChunkMap,
        server: ServerId,
        keys: &std::collections::HashMap<u64, u64>,
    ) -> u64 {
        let mut n = 0;
        chunks.update_all(|c| {
            let Some(r) = c.on(server.0) else { return };
            match keys.get(&r.addr) {
                Some(&rkey) if rkey == r.rkey => {}
                Some(&rkey) => {
                    c.rekey(server.0, rkey);
                    n += 1;
                }
                None => {
                    c.remove(server.0);
                    n += 1;
                }
            }
        });
        n
    }

    /// Server `server` is back from a backing file that may hold less than was written to it
    /// ([`crate::client::Rejoin::Behind`]; it is not live yet): every chunk with a live copy
    /// elsewhere lets go of its copy there (the rebuild makes a new one from a copy known
    /// whole), and the others keep it, the best there is, under the key `keys` lists for its
    /// address (a copy at an address it does not list is taken out: nothing is there).
    /// The copies let go of join `gone`, for the caller to free once the server is admitted
    /// (a free sent to a server still rejoining is dropped); returns the copies kept.
    pub(super) fn let_go_of_behind_copies(
        &self,
        chunks: &mut ChunkMap,
        server: ServerId,
        keys: Option<&std::collections::HashMap<u64, u64>>,
        gone: &mut Vec<RemoteRegion>,
    ) -> u64 {
        let mut kept = 0;
        chunks.update_all(|c| {
            let Some(r) = c.on(server.0) else { return };
            let rkey = match keys {
                None => Some(r.rkey),
                Some(k) => k.get(&r.addr).copied(),
            };
            let Some(rkey) = rkey else {
                c.remove(server.0);
                return;
            };
            if rkey != r.rkey {
                c.rekey(server.0, rkey);
            }
            let readable_elsewhere = match c.stripe() {
                Some(s) => self.live_fragment_count(s) >= s.k as usize,
                None => self.live_copies(c).next().is_some(),
            };
            if readable_elsewhere {
                if let Some(copy) = c.remove(server.0) {
                    gone.push(super::region(c, &copy));
                }
            } else {
                kept += 1;
            }
        });
        kept
    }

    /// Chunk indexes of `chunks` with fewer live copies than `--replicas`.
    pub(super) fn degraded(&self, chunks: &ChunkMap) -> Vec<u64> {
        let want = self.replicas();
        chunks
            .iter()
            .filter(|(_, c)| match c.stripe() {
                Some(s) => self.live_fragment_count(s) < s.frags.len(),
                None => self.live_copies(c).count() < want,
            })
            .map(|(i, _)| *i)
            .collect()
    }

    /// Chunk indexes of `chunks` whose copies are out of step with `--replicas`: short of
    /// live copies, or holding more than it (lowered live). What a rebuild pass visits.
    pub(super) fn out_of_step(&self, chunks: &ChunkMap) -> Vec<u64> {
        let want = self.replicas();
        chunks
            .iter()
            .filter(|(_, c)| {
                let short = match c.stripe() {
                    Some(s) => self.live_fragment_count(s) < s.frags.len(),
                    None => self.live_copies(c).count() < want || c.replicas().len() > want,
                };
                short || self.moving_copies(c) > 0
            })
            .map(|(i, _)| *i)
            .collect()
    }

    /// Copies (or fragments) of `c` on servers being drained (to be moved off).
    pub(super) fn moving_copies(&self, c: &Chunk) -> usize {
        c.extents()
            .iter()
            .filter(|r| self.pool.is_draining(ServerId(r.server)))
            .count()
    }

    /// Copies of `c` that stay where they are: on live servers not being drained.
    fn settled_copies(&self, c: &Chunk) -> usize {
        self.live_copies(c)
            .filter(|r| !self.pool.is_draining(ServerId(r.server)))
            .count()
    }

    /// Rebuild of one chunk (called with the file's chunk map locked, so no write races the
    /// copy): missing copies are placed and copied, and copies on dead servers leave it once
    /// the live ones make the count. Returns the bytes copied (0: nothing to do, or no room).
    pub(super) fn rebuild_chunk(&self, chunks: &mut ChunkMap, idx: u64) -> u64 {
        // An encoded chunk short of fragments (or with one on a draining server) becomes
        // copies again, decoded from what is left; the encoder makes it a whole stripe
        // again once its file is cold (see `coding`).
        if chunks.get(&idx).is_some_and(|c| c.stripe().is_some()) {
            return self.thaw(chunks, idx).unwrap_or_else(|e| {
                log::warn!("chunk {idx} stays degraded: decoding it failed: {e}");
                0
            });
        }
        chunks
            .update(idx, |c| self.rebuild_copies(idx, c))
            .unwrap_or(0)
    }

    pub(super) fn rebuild_copies(&self, idx: u64, c: &mut Chunk) -> u64 {
        if self.live_copies(c).next().is_none() {
            return 0; // lost: nothing to copy from
        }
        let want = self.replicas();
        let missing = want.saturating_sub(self.settled_copies(c));
        // The new copies need slots: where the chunk cannot list them beside its copies on
        // down servers (four copies, one server down), those go first.
        if c.replicas().len() + missing > crate::meta::extents::MAX_REPLICAS {
            self.let_go_of_dead_copies(c);
        }
        // A drain: the new copies are written before the ones on the draining server go,
        // so the chunk never has fewer than `want`.
        let added = if missing > 0 { self.repair(idx, c) } else { 0 };
        // Copies on servers that are down missed no write (a write lets go of them first:
        // `heal_chunk`), and are whole again if their server resumes this mount's session.
        // They go once the live copies make the count without them; until then (no server
        // with room, or none but the holders: two servers, one frozen) they stay listed,
        // and a server that resumes needs no copy of what was not written meanwhile.
        if self.live_copies(c).count() < want {
            return added as u64 * c.len;
        }
        self.let_go_of_dead_copies(c);
        // Copies beyond the count go: those on draining servers first, then the last placed
        // (their extents given back once the chunk map without them is committed, as any
        // free).
        while c.replicas().len() > want {
            if !self.let_go_of_a_draining_copy(c) {
                let last = c.replicas()[c.replicas().len() - 1].server;
                self.let_go(c, last);
            }
        }
        added as u64 * c.len
    }

    /// Places the missing copies of chunk `idx` (counting those on draining servers as
    /// missing) on live servers in placement that hold none of it and
    /// copies its bytes there from a live copy; returns how many it added. Best effort:
    /// without room or another live server the chunk stays degraded (and counted so in
    /// `stats`).
    pub(super) fn repair(&self, idx: u64, c: &mut Chunk) -> usize {
        // No more than the chunk has slots for: its free ones, and those of its copies on
        // draining servers, each of which a new copy replaces in place (a chunk with every
        // slot taken, four copies, is drained too).
        let draining = c
            .replicas()
            .iter()
            .filter(|r| self.pool.is_draining(ServerId(r.server)))
            .count();
        let room = crate::meta::extents::MAX_REPLICAS.saturating_sub(c.replicas().len()) + draining;
        let missing = self
            .replicas()
            .saturating_sub(self.settled_copies(c))
            .min(room);
        if missing == 0 {
            return 0;
        }
        let holders: Vec<ServerId> = c.replicas().iter().map(|r| ServerId(r.server)).collect();
        let placeable_holders = holders
            .iter()
            .filter(|&&h| self.pool.is_live(h) && !self.pool.is_draining(h))
            .count();
        if self.pool.placeable_servers() <= placeable_holders {
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
                // Each one listed (on a server that holds none of the chunk, within its
                // slots, or in the slot of a copy on a draining server, which goes now that
                // its bytes are on the new one): one that could not be is given back, never
                // left unlisted.
                let (listed, unlisted): (Vec<_>, Vec<_>) = new.into_iter().partition(|r| {
                    c.add(replica(r)) || (self.let_go_of_a_draining_copy(c) && c.add(replica(r)))
                });
                if !unlisted.is_empty() {
                    log::warn!("chunk {idx}: {} new copies had no slot", unlisted.len());
                    self.pool.free_all(&unlisted);
                }
                log::debug!(
                    "chunk {idx}: {} new copies ({} bytes each)",
                    listed.len(),
                    c.len
                );
                listed.len()
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
    /// another remains; on an error `to` is left whole (the caller frees it).
    pub(super) fn copy_chunk(
        &self,
        from: &Chunk,
        to: &mut Vec<RemoteRegion>,
        buf: &Bounce,
    ) -> Result<()> {
        let mut failed = Vec::new();
        let targets: &Vec<RemoteRegion> = to;
        self.copy_windows(
            0,
            from.len,
            buf,
            &mut failed,
            &mut None,
            |failed| {
                let copy = self.pick(from, 0, failed)?;
                Some(region(from, &copy))
            },
            |_, failed| {
                targets
                    .iter()
                    .filter(|r| !failed.contains(&r.server.0))
                    .copied()
                    .collect()
            },
            |failed| targets.iter().any(|r| !failed.contains(&r.server.0)),
        )?;
        let (gone, kept): (Vec<RemoteRegion>, Vec<RemoteRegion>) =
            to.iter().partition(|r| failed.contains(&r.server.0));
        if kept.is_empty() {
            return Err(lost(0));
        }
        *to = kept;
        self.pool.free_all(&gone);
        Ok(())
    }

    /// Copies `len` bytes window by window through `b` (a read lands before its writes go
    /// out): each window is read from the region `source` gives (the servers that failed so
    /// far passed over; none left: chunk `idx` is lost) and written to the
    /// regions `targets` gives for the server read from. A server that fails goes into
    /// `failed` and is passed over from then on; after a failed write the copy goes on
    /// while `go_on` says so. `read_from` names the server last read from.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn copy_windows(
        &self,
        idx: u64,
        len: u64,
        b: &Bounce,
        failed: &mut Vec<u32>,
        read_from: &mut Option<u32>,
        source: impl Fn(&[u32]) -> Option<RemoteRegion>,
        targets: impl Fn(u32, &[u32]) -> Vec<RemoteRegion>,
        go_on: impl Fn(&[u32]) -> bool,
    ) -> Result<()> {
        let base = b.buf.addr();
        let mut at = 0;
        while at < len {
            let n = (len - at).min(IO_SIZE as u64);
            let local = Sge {
                addr: base,
                len: n,
                lkey: 0,
            };
            let from = loop {
                let remote = source(failed).ok_or_else(|| lost(idx))?;
                let read = RemoteOp {
                    opcode: Opcode::Read,
                    local,
                    remote,
                    offset: at,
                };
                match self.run_ops(self.pin(base, n)?, &[read]) {
                    Ok(()) => break remote.server.0,
                    Err(e) => match e.failed_server() {
                        Some(s) if !failed.contains(&s.0) => failed.push(s.0),
                        _ => return Err(e.into()),
                    },
                }
            };
            *read_from = Some(from);
            loop {
                let writes: Vec<RemoteOp> = targets(from, failed)
                    .into_iter()
                    .map(|remote| RemoteOp {
                        opcode: Opcode::Write,
                        local,
                        remote,
                        offset: at,
                    })
                    .collect();
                let e = match self.run_ops(self.pin(base, n)?, &writes) {
                    Ok(()) => break,
                    Err(e) => e,
                };
                match e.failed_server() {
                    Some(s) if !failed.contains(&s.0) => {
                        failed.push(s.0);
                        if !go_on(failed) {
                            return Err(e.into());
                        }
                    }
                    _ => return Err(e.into()),
                }
            }
            at += n;
        }
        Ok(())
    }
}
