//! How lent memory comes back: an extent released (its registration gone once no operation
//! uses it, its bytes zeroed, its slot in the backing file cleared), and the extents of
//! sessions whose lease ran out; the owners image saved before a change of owner is
//! answered.

use super::*;

/// Frees the extents of sessions whose lease has run out; until the server stops.
pub(super) fn reap_leases(shared: &Shared) {
    /// How often expiry is checked at most: leases are whole seconds, so this keeps a lease
    /// within a quarter second of its length.
    const TICK: Duration = Duration::from_millis(250);
    let mut departed = shared.departed.lock();
    let mut flushed = Instant::now();
    while !shared.stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        if let Some(b) = &shared.backing {
            if now.duration_since(flushed) >= crate::config::BACKING_FLUSH_INTERVAL {
                drop(departed);
                if let Err(e) = b.persist() {
                    log::error!(
                        "backing file {}: write-back failed: {e}",
                        b.path().display()
                    );
                }
                flushed = Instant::now();
                departed = shared.departed.lock();
                continue;
            }
        }
        let expired: Vec<TokenDigest> = departed
            .iter()
            .filter(|(_, d)| d.expires <= now)
            .map(|(k, _)| *k)
            .collect();
        if !expired.is_empty() {
            let gone: Vec<Departed> = expired.iter().filter_map(|k| departed.remove(k)).collect();
            drop(departed);
            for d in gone {
                if let Some(b) = &shared.backing {
                    b.forget_session(d.id);
                }
                log::info!(
                    "lease of client '{}' expired: releasing its {} extents ({} bytes)",
                    d.client_name,
                    d.extents.len(),
                    d.held
                );
                for (_, e) in d.extents {
                    shared.release(e);
                }
            }
            departed = shared.departed.lock();
            continue;
        }
        drop(departed);
        shared.cut_silent_followers();
        departed = shared.departed.lock();
        departed = shared.departures.wait_timeout(departed, TICK).0;
    }
}

impl Shared {
    /// Deregisters an extent, waiting (bounded) for in-flight one-sided operations so the
    /// space is not handed to someone else while an old write may still land in it.
    pub(super) fn release(&self, extent: Extent) {
        if self.backing.as_ref().is_some_and(|b| b.frozen()) {
            // Stopping: the file keeps the extent for a restart; only this process's
            // registration goes.
            drop(extent.mr);
            self.extents.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        let mut mr = extent.mr;
        let start = Instant::now();
        loop {
            match self.fabric.deregister(vec![mr]) {
                Ok(()) => break,
                Err(DeregisterError::Busy(mut v)) => {
                    mr = v.pop().expect("one region was passed");
                    if start.elapsed() > self.control_timeout {
                        // An operation on it is still running (a peer trickling a payload).
                        // Handing the range to someone else could let that operation land in
                        // their data: quarantine it instead (its key is gone, its memory is
                        // never reused by this server).
                        log::warn!(
                            "extent at {:#x} ({} bytes) still busy after {:?}; quarantined",
                            mr.addr(),
                            extent.len,
                            self.control_timeout
                        );
                        drop(mr);
                        if let Some(b) = &self.backing {
                            // A restart finds it free and zeroes it.
                            b.clear_slot(extent.offset);
                        }
                        self.extents.fetch_sub(1, Ordering::SeqCst);
                        return;
                    }
                    thread::sleep(Duration::from_millis(1));
                }
            }
        }
        // Free space is kept zeroed (a fresh mapping is zero already), so extents are handed
        // out zeroed without work on the allocation path: a client never sees another
        // client's old bytes, and file holes inside a chunk read as zeros.
        // SAFETY: the extent lies inside the arena (it was allocated from it) and is no longer
        // registered, so no remote peer can reach it while it is cleared.
        unsafe {
            std::ptr::write_bytes(
                self.arena.ptr.add(extent.offset as usize),
                0,
                extent.len as usize,
            )
        };
        if let Some(b) = &self.backing {
            b.clear_slot(extent.offset);
        }
        self.alloc.lock().free(extent.offset, extent.len);
        self.extents.fetch_sub(1, Ordering::SeqCst);
    }

    /// Writes the owners image of a backed server (its sessions and volumes) before a change
    /// of owner is answered. Not under the volumes' lock (this takes it).
    pub(super) fn save_owners(&self) {
        if let Some(b) = &self.backing {
            b.save_owners(|| {
                self.volumes
                    .lock()
                    .iter()
                    .map(|(name, v)| v.record(name))
                    .collect()
            });
        }
    }

    pub(super) fn capacity(&self) -> Capacity {
        let a = self.alloc.lock();
        Capacity {
            total: a.total(),
            free: a.free_bytes(),
            largest_free: a.largest_free(),
        }
    }
}
