//! A shared client's session in the engine: its heartbeats, on a thread of their own, and the
//! eviction of clients whose heartbeats stopped.
//!
//! Why a thread of its own: the poller waits for the memory servers (`follow_at`, frees), and
//! one frozen server holds it for the control timeout (10 s, as long as a session's lease):
//! heartbeats sent from there let every healthy session run out at once, and the first
//! client back evicted all the others. Why eviction is all or nothing: a client not yet
//! closed at one server could still write its copies there (and free memory others name) after
//! its locks went to another, so its session and locks stay until every server of the volume
//! has closed it (tried again each poll).

use super::*;

/// A heartbeat every second: a tenth of the session's lease, so nine may be lost (or late,
/// on a loaded machine) before it runs out, and well under [`crate::engine::ENGINE_AWAY`].
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// Beats until the client stops (not while paused by a test freezing it).
pub(super) fn beat_loop(s: &State) {
    while !s.stop.load(Ordering::SeqCst) {
        std::thread::park_timeout(HEARTBEAT_EVERY);
        if s.stop.load(Ordering::SeqCst) || s.paused.load(Ordering::SeqCst) {
            continue;
        }
        if let Err(e) = s.beat() {
            log::warn!("shared volume: {e}");
        }
    }
}

impl State {
    /// One heartbeat.
    pub(super) fn beat(&self) -> std::result::Result<(), String> {
        self.engine
            .heartbeat(&self.who, SESSION_TTL)
            .map_err(|e| e.to_string())
    }

    /// Evicts every client whose session ran out: fenced at every server of the volume, then
    /// its locks dropped and its session forgotten. One that some server has not closed yet
    /// keeps its session and locks (tried again by the next poll).
    pub(super) fn evict_expired(
        &self,
        pool: &crate::client::Pool,
    ) -> std::result::Result<(), String> {
        for gone in self.engine.expired_sessions().map_err(|e| e.to_string())? {
            if gone == self.who {
                continue;
            }
            let (closed, of) = pool.evict(&gone);
            if closed < of {
                log::warn!(
                    "shared volume: '{gone}' stopped its heartbeats: closed at {closed} of \
                     {of} servers; its locks stay until every server has closed it"
                );
                continue;
            }
            log::warn!("shared volume: '{gone}' stopped its heartbeats: evicted from {of} servers");
            crate::engine::drop_session_locks(&*self.engine, &self.who, &gone)
                .map_err(|e| e.to_string())?;
            // Files it had open: their drops fall to this client (settled after the next
            // poll's catch-up).
            let marked = self.engine.marked_by(&gone).map_err(|e| e.to_string())?;
            self.engine.drop_session(&gone).map_err(|e| e.to_string())?;
            self.to_settle.lock().extend(marked);
            // What it allocated and never logged: collected after the next catch-up, from
            // the whole table, by this client if it holds it or will (a small volume), else
            // by the keeper (`keeper`).
            if self.is_whole() || !self.large.load(Ordering::SeqCst) {
                self.to_collect.lock().push(gone);
            } else if let Err(e) = self.engine.owe_collection(&gone) {
                log::warn!("shared volume: what '{gone}' left is collected here: {e}");
                self.to_collect.lock().push(gone);
            }
        }
        Ok(())
    }

    /// Frees what evicted clients allocated and no change names: memory a client took for a
    /// write and died before appending the write's change. Run after a catch-up that followed
    /// their sessions' end, so the table holds every change they appended; each free waits
    /// until every member has applied what this client has (a copy a change let go of is
    /// freed by that change's client, and may still be read until then). A server that did
    /// not answer is asked again by the next poll. How many extents went.
    pub(super) fn collect_evicted(&self, fs: &Fs) -> usize {
        // What no change names is read from the whole table: not until this client holds it.
        if !self.is_whole() {
            return 0;
        }
        let gone = std::mem::take(&mut *self.to_collect.lock());
        if gone.is_empty() {
            return 0;
        }
        let named = fs.named_extents();
        let applied = self.applied.load(Ordering::SeqCst);
        let pool = fs.data().pool();
        let mut freed = 0;
        for who in gone {
            let mut answered = true;
            for s in pool.status().iter().filter(|s| !s.failed) {
                match pool.member_extents(s.id, &who) {
                    Ok(extents) => {
                        for (addr, len, rkey) in extents {
                            if named.contains(&(s.id.0, addr)) {
                                continue;
                            }
                            let region = crate::fabric::RemoteRegion {
                                server: s.id,
                                addr,
                                len,
                                rkey,
                            };
                            self.gate.hold_after(applied, region);
                            freed += 1;
                        }
                    }
                    Err(e) => {
                        log::warn!("shared volume: what '{who}' left on {}: {e}", s.addr);
                        answered = false;
                    }
                }
            }
            if !answered {
                self.to_collect.lock().push(who.clone());
            } else if let Err(e) = self.engine.collected(&who) {
                log::warn!("shared volume: '{who}' stays owed (collected again): {e}");
            }
            if freed > 0 {
                log::warn!(
                    "shared volume: '{who}' left {freed} extents no change names: freed once \
                     every member has applied change {applied}"
                );
            }
        }
        freed
    }
}
