//! The journal's writer: the ring's groups (appended to every live copy, a failed copy
//! dropped from the root before the write it missed counts) and the checkpoints that bound
//! the ring (written beside the last one, then the root pointed at them on every server).

use super::*;
use crate::data::DataStore;

fn gone() -> String {
    "the file system is gone".to_string()
}

impl Writer {
    /// The data store the records go through.
    pub(super) fn data(&self) -> std::result::Result<Arc<DataStore>, String> {
        self.view.data().ok_or_else(gone)
    }

    /// Sets the root (one generation up) on every live server.
    pub(super) fn publish(&mut self, mut root: Root) -> std::result::Result<(), String> {
        root.generation = self.root.generation + 1;
        root.epoch = self.pool.epoch();
        let bytes = root.encode();
        if bytes.len() > crate::proto::MAX_ROOT_LEN {
            return Err(format!(
                "the volume's root would take {} bytes (at most {}): too many servers",
                bytes.len(),
                crate::proto::MAX_ROOT_LEN
            ));
        }
        // On backed servers, what the new root points at reaches the medium before it does
        // (one write-back need not keep the order of the stores it writes).
        self.pool.persist();
        self.pool
            .set_root(&bytes)
            .map_err(|e| format!("cannot set the volume's root: {e}"))?;
        self.pool.persist();
        self.root = root;
        Ok(())
    }

    /// Live servers for the journal's copies (none being drained): those of the current
    /// ring first.
    pub(super) fn journal_servers(&self) -> Vec<u32> {
        let live: Vec<u32> = self
            .pool
            .status()
            .iter()
            .filter(|s| !s.failed && !s.draining)
            .map(|s| s.id.0)
            .collect();
        let mut out: Vec<u32> = self
            .root
            .ring
            .iter()
            .map(|p| p.server)
            .filter(|s| live.contains(s))
            .collect();
        for s in live {
            if out.len() >= JOURNAL_COPIES {
                break;
            }
            if !out.contains(&s) {
                out.push(s);
            }
        }
        out.truncate(JOURNAL_COPIES);
        out
    }

    /// Bytes of a new ring copy: the configured size, but at most a share of the smallest
    /// of `servers` (a small pool still takes a volume; it checkpoints more often).
    pub(super) fn ring_len(&self, servers: &[u32]) -> u64 {
        let smallest = self
            .pool
            .status()
            .iter()
            .filter(|s| servers.contains(&s.id.0))
            .map(|s| s.capacity.total)
            .min()
            .unwrap_or(0);
        let share = smallest / crate::config::JOURNAL_RING_SHARE;
        let page = crate::fabric::mem::page_size() as u64;
        self.options.ring_bytes.min(share.max(page)) / page * page
    }

    pub(super) fn free(&self, places: &[Place], len: u64) {
        for p in places {
            let _ = self.pool.free(region(p, len));
        }
    }

    /// Writes a checkpoint of the namespace as of the last sequence number handed out, and
    /// starts the ring over behind it (a fresh ring with `fresh_ring`: at attach). Returns
    /// that sequence number.
    pub(in crate::volume) fn checkpoint(
        &mut self,
        gate: &FreeGate,
        fresh_ring: bool,
    ) -> std::result::Result<u64, String> {
        let data = self.data()?;
        // The sequence number first, then the table a slice at a time (see meta::image).
        let (mut inos, lsn, grown_at) = self
            .view
            .inspect_meta(|m| {
                (
                    m.inode_numbers(),
                    gate.assigned.load(Ordering::SeqCst),
                    self.reserve.grown(),
                )
            })
            .ok_or_else(gone)?;
        inos.sort_unstable();
        let mut image = crate::meta::Image::default();
        for slice in inos.chunks(self.options.checkpoint_slice.max(1)) {
            image.extend(
                self.view
                    .inspect_meta(|m| m.image_of(slice))
                    .ok_or_else(gone)?,
            );
        }
        image.add_chunks();
        // Every chunk the image names holds its bytes before the image is written (a write
        // answered before it was sent may have made it; see `data::behind`).
        data.send_all_behind();
        let (mut files, mut bytes) = (0u64, 0u64);
        for c in &image.changes {
            if let Change::Make {
                kind: crate::meta::Kind::File,
                attrs,
                ..
            } = c
            {
                files += 1;
                bytes += attrs.size;
            }
        }
        let mut frames = Vec::new();
        for (i, group) in image.changes.chunks(CHANGES_PER_FRAME).enumerate() {
            frames.extend(record::encode(i as u64, group));
        }
        let servers = self.journal_servers();
        if servers.is_empty() {
            return Err("no memory server is up to hold the volume's checkpoint".into());
        }
        let ckpt_len = (frames.len() as u64).max(1);
        let (checkpoint, cap, from_spare, downs) =
            self.place_checkpoint(gate, &servers, ckpt_len)?;
        // Extents that hold no checkpoint after all go back where they came from.
        let put_back = |w: &mut Writer, places: Vec<Place>| {
            if from_spare {
                w.spare = Spare {
                    places,
                    cap,
                    freed_at: 0,
                    downs: downs.clone(),
                };
            } else {
                w.free(&places, cap);
            }
        };
        let regions: Vec<RemoteRegion> = checkpoint.iter().map(|p| region(p, ckpt_len)).collect();
        if let Err(e) = data.write_regions(&regions, 0, &frames) {
            put_back(self, checkpoint);
            return Err(format!("cannot write the volume's checkpoint: {e}"));
        }
        let old_ring = std::mem::take(&mut self.root.ring);
        // A ring short of copies (a server failed, or came back empty) is made whole again
        // here: a fresh one on every journal server. On a full pool the old ring goes on, as
        // far as it is live (its records are all in the checkpoint, and a reader stops at their
        // lower sequence numbers); the copies are tried again later.
        let mut fresh_ring = fresh_ring || old_ring.len() < servers.len();
        let (ring, ring_len) = if fresh_ring {
            let len = self.ring_len(&servers);
            match self.alloc_all(&servers, len) {
                Ok((ring, _)) => {
                    self.heal_after = None;
                    (ring, len)
                }
                Err(e)
                    if old_ring
                        .iter()
                        .any(|p| self.pool.is_live(ServerId(p.server))) =>
                {
                    log::warn!("the volume's journal keeps its old ring for now: {e}");
                    self.heal_after = Some(Instant::now() + JOURNAL_HEAL_RETRY);
                    fresh_ring = false;
                    (old_ring.clone(), self.root.ring_len)
                }
                Err(e) => {
                    put_back(self, checkpoint);
                    self.root.ring = old_ring;
                    return Err(e);
                }
            }
        } else {
            (old_ring.clone(), self.root.ring_len)
        };
        let old = self.root.clone();
        let root = Root {
            generation: 0,
            epoch: 0,
            servers: old.servers.clone(),
            chunk_size: data.chunk_size(),
            checkpoint: checkpoint.clone(),
            checkpoint_len: frames.len() as u64,
            checkpoint_lsn: lsn,
            next_ino: image.next_ino,
            ring: ring.clone(),
            ring_len,
            files,
            bytes,
            checkpoint_unix: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        };
        if let Err(e) = self.publish(root) {
            // A server may have stored the root and lost only its answer: the new checkpoint
            // and ring stay allocated (collected at the next attach if nothing names them).
            self.root.ring = old_ring;
            return Err(e);
        }
        // Nothing names the old checkpoint (nor, after a fresh ring, the old ring) now: the
        // old checkpoint may be the next one's spare.
        let old_checkpoint = Spare {
            places: old.checkpoint.clone(),
            cap: std::mem::replace(&mut self.checkpoint_cap, cap),
            freed_at: lsn,
            downs: std::mem::replace(&mut self.checkpoint_marks, downs),
        };
        self.keep_spare(old_checkpoint, &servers, ckpt_len, grown_at);
        if fresh_ring {
            self.free(&old_ring, old.ring_len);
        }
        self.tail = 0;
        self.written.checkpoints.fetch_add(1, Ordering::Relaxed);
        log::info!(
            "volume checkpoint at sequence {lsn}: {files} files, {} bytes of records",
            frames.len()
        );
        Ok(lsn)
    }

    /// Appends `bytes` (records up to `last`) to every ring copy. A copy whose server failed
    /// is dropped from the ring, and the root saying so is set, before the write counts.
    pub(super) fn append(
        &mut self,
        gate: &FreeGate,
        bytes: &[u8],
        last: u64,
    ) -> std::result::Result<u64, String> {
        if self.tail + bytes.len() as u64 > self.root.ring_len {
            return self.checkpoint(gate, false);
        }
        // A ring short of copies while more servers are up (one failed, or came back) is
        // made whole before the next group: else a rolling restart, one server after another,
        // takes the journal's last copy with the last server.
        let live_copies = self
            .root
            .ring
            .iter()
            .filter(|p| self.pool.is_live(ServerId(p.server)))
            .count();
        let due =
            live_copies < JOURNAL_COPIES && self.heal_after.is_none_or(|t| Instant::now() >= t);
        if due && live_copies < self.journal_servers().len() {
            log::info!(
                "the volume's journal has {live_copies} live copies; a fresh ring restores them"
            );
            match self.checkpoint(gate, true) {
                // It says itself whether the ring was made whole (`heal_after`).
                Ok(lsn) => return Ok(lsn),
                Err(e) => {
                    // It goes on with the copies it has; tried again in a while.
                    log::warn!("the journal's copies cannot be restored yet: {e}");
                    self.heal_after = Some(Instant::now() + JOURNAL_HEAL_RETRY);
                }
            }
        }
        loop {
            let live: Vec<Place> = self
                .root
                .ring
                .iter()
                .copied()
                .filter(|p| self.pool.is_live(ServerId(p.server)))
                .collect();
            if live.is_empty() {
                return Err("every copy of the volume's journal is on a failed server".into());
            }
            if live.len() < self.root.ring.len() {
                let mut root = self.root.clone();
                root.ring = live.clone();
                let gone: Vec<Place> = self
                    .root
                    .ring
                    .iter()
                    .copied()
                    .filter(|p| !live.contains(p))
                    .collect();
                let len = self.root.ring_len;
                self.publish(root)?;
                // No root names them now: freed when their servers answer again.
                self.free(&gone, len);
            }
            let regions: Vec<RemoteRegion> =
                live.iter().map(|p| region(p, self.root.ring_len)).collect();
            match self.data()?.write_regions(&regions, self.tail, bytes) {
                Ok(()) => {
                    self.tail += bytes.len() as u64;
                    self.written.groups.fetch_add(1, Ordering::Relaxed);
                    self.written
                        .bytes
                        .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                    return Ok(last);
                }
                Err(e) => match e.failed_server() {
                    Some(failed) if live.len() > 1 => {
                        // Its removal is in the root before the write it missed counts.
                        log::warn!("a journal copy failed ({e}); going on without it");
                        let mut root = self.root.clone();
                        root.ring.retain(|p| p.server != failed.0);
                        let gone: Vec<Place> = self
                            .root
                            .ring
                            .iter()
                            .copied()
                            .filter(|p| p.server == failed.0)
                            .collect();
                        let len = self.root.ring_len;
                        self.publish(root)?;
                        self.free(&gone, len);
                    }
                    _ => return Err(format!("cannot write the volume's journal: {e}")),
                },
            }
        }
    }
}

#[cfg(feature = "testing")]
impl Writer {
    /// See [`VolumeJournal::tear_next_group`].
    pub(super) fn tear(&mut self, bytes: &[u8], n: usize) {
        let Ok(data) = self.data() else { return };
        for (i, p) in self.root.ring.iter().enumerate() {
            let part = if i == 0 {
                bytes
            } else {
                &bytes[..n.min(bytes.len())]
            };
            let _ = data.write_regions(&[region(p, self.root.ring_len)], self.tail, part);
        }
    }
}
