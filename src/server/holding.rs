//! What a control session holds: extents allocated and freed, a departed session's extents
//! taken over by its resume, and what happens to them when the session ends (kept for its
//! lease, parked with its volume, or freed).

use super::session::Session;
use super::*;

impl Session {
    /// Takes over the extents of the departed session whose token was `old`: from the
    /// leases, or from a control connection still open (the client saw it fail before this
    /// server did), which is closed first. Only before this session has a data path or
    /// extents of its own.
    pub(super) fn resume(
        &mut self,
        tag: u64,
        old: &Token,
        current: &Token,
    ) -> Result<Message, String> {
        if !self.extents.is_empty()
            || !self.guards.is_empty()
            || self.volume.is_some()
            || self.follows.is_some()
            || self.member.is_some()
            || old == current
        {
            return Err("Resume must come first after Welcome".into());
        }
        let key = token_digest(old);
        if let Some(reply) = self.resume_volume(tag, &key) {
            return reply;
        }
        let shared = self.shared.clone();
        let taken = shared.live_tokens.lock().get(&key).copied();
        if let Some(conn) = taken {
            if let Some(s) = shared.sessions.lock().get(&conn) {
                log::info!(
                    "client '{}' resumes a session whose connection is still open: closing it",
                    self.client_name
                );
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        let deadline = Instant::now() + shared.control_timeout;
        let mut departed = shared.departed.lock();
        let found = loop {
            if let Some(d) = departed.remove(&key) {
                break Some(d);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !shared.live_tokens.lock().contains_key(&key) {
                break None;
            }
            departed = shared.departures.wait_timeout(departed, left).0;
        };
        drop(departed);
        let Some(d) = found else {
            log::info!(
                "client '{}' from {:?} asked to resume a session this server does not hold",
                self.client_name,
                self.peer
            );
            return Ok(Message::Refused {
                tag,
                code: RefusalCode::NotFound,
                message: "no such session here (the server restarted or its lease expired)".into(),
            });
        };
        log::info!(
            "client '{}' from {:?} resumed its session: {} extents ({} bytes) kept",
            self.client_name,
            self.peer,
            d.extents.len(),
            d.held
        );
        bump(&shared.refusals.resumed_sessions);
        let rekeyed = d.rekeyed;
        self.rekeyed = rekeyed;
        self.id = d.id;
        self.held = d.held;
        let extents = d.extents.len() as u64;
        self.extents = d.extents;
        // A backed server's file now names this session's token: the next resume shows it.
        self.note_owner();
        Ok(Message::Resumed {
            tag,
            extents,
            bytes: self.held,
            rekeyed,
            behind: d.behind,
        })
    }

    pub(super) fn alloc(&mut self, tag: u64, len: u64) -> Message {
        let refuse = |code, message: String| Message::Refused { tag, code, message };
        if self.shared.stop.load(Ordering::SeqCst) {
            return refuse(RefusalCode::ShuttingDown, "server is shutting down".into());
        }
        let total = self.shared.arena.len as u64;
        let quota = self.shared.max_client_memory;
        if self.held.saturating_add(len) > quota {
            bump(&self.shared.refusals.refused_quota);
            return refuse(
                RefusalCode::NoSpace,
                format!(
                    "this client holds {} bytes; {len} more would pass its quota of {quota} \
                     bytes (--max-client-memory)",
                    self.held
                ),
            );
        }
        if len > total {
            return refuse(
                RefusalCode::BadLength,
                format!("{len} bytes is more than the whole arena ({total} bytes)"),
            );
        }
        let Some((offset, rlen)) = self.shared.alloc.lock().alloc(len) else {
            bump(&self.shared.refusals.refused_no_space);
            let cap = self.shared.capacity();
            return refuse(
                RefusalCode::NoSpace,
                format!(
                    "no free extent of {len} bytes (free {}, largest free extent {})",
                    cap.free, cap.largest_free
                ),
            );
        };
        // SAFETY: `offset + rlen <= arena.len` by the allocator's construction, so the range
        // lies inside the arena mapping, which outlives every registration (it is dropped
        // last, after all sessions have released their extents).
        // Only this session's data connections may reach it.
        let registered = unsafe {
            let ptr = self.shared.arena.ptr.add(offset as usize);
            self.shared
                .fabric
                .register_extent(ptr, rlen as usize, self.id)
        };
        let mr = match registered {
            Ok(mr) => mr,
            Err(e) => {
                self.shared.alloc.lock().free(offset, rlen);
                log::warn!("registration of a {rlen}-byte extent failed: {e}");
                return refuse(RefusalCode::RegistrationFailed, e.to_string());
            }
        };
        if self.member.is_none() {
            self.held += rlen;
        }
        let (addr, rkey) = (mr.addr(), mr.rkey());
        if let Some(b) = &self.shared.backing {
            b.write_slot(&super::backing::SlotEntry {
                offset,
                len: rlen,
                rkey,
                session: self.id,
            });
            // Its record, made with its first extent, stays while it lives (a resume
            // renews it): later allocations need none. A member's are the volume's.
            if self.extents.is_empty() && self.member.is_none() {
                self.note_owner();
            }
        }
        let extent = Extent {
            mr,
            offset,
            len: rlen,
        };
        if self.member.is_some() {
            self.keep_shared(addr, extent);
        } else {
            self.extents.insert(addr, extent);
        }
        self.shared.extents.fetch_add(1, Ordering::SeqCst);
        Message::Allocated {
            tag,
            addr,
            len: rlen,
            rkey,
            capacity: self.shared.capacity(),
        }
    }

    pub(super) fn free(&mut self, tag: u64, addr: u64, rkey: u64) -> Message {
        if self.member.is_some() {
            return self.free_shared(tag, addr, rkey);
        }
        match self.extents.get(&addr) {
            Some(e) if e.mr.rkey() == rkey => {}
            _ => {
                return Message::Refused {
                    tag,
                    code: RefusalCode::NotFound,
                    message: format!("no extent at {addr:#x} with that rkey on this connection"),
                }
            }
        }
        let extent = self.extents.remove(&addr).expect("checked above");
        self.held -= extent.len;
        self.shared.release(extent);
        Message::Freed {
            tag,
            capacity: self.shared.capacity(),
        }
    }

    /// The control connection is gone. A client that said `Goodbye`, a stopping server or a
    /// zero lease: everything is freed now. Otherwise the extents wait for the client to
    /// resume, until the lease runs out.
    pub(super) fn depart(&mut self) {
        if self.depart_volume() || self.depart_follower() || self.depart_member() {
            if let Handshake::Welcomed { token } = &self.state {
                let key = token_digest(token);
                let mut live = self.shared.live_tokens.lock();
                if live.get(&key) == Some(&self.conn) {
                    live.remove(&key);
                }
            }
            self.shared.clients.fetch_sub(1, Ordering::SeqCst);
            self.state = Handshake::New;
            return;
        }
        let token = match &self.state {
            Handshake::Welcomed { token } => *token,
            _ => return self.release_all(),
        };
        let key = token_digest(&token);
        {
            let mut live = self.shared.live_tokens.lock();
            if live.get(&key) == Some(&self.conn) {
                live.remove(&key);
            }
        }
        let keep = !self.goodbye
            && !self.shared.stop.load(Ordering::SeqCst)
            && !self.shared.lease.is_zero()
            && !self.extents.is_empty();
        if keep {
            log::info!(
                "client '{}' from {:?} left without goodbye: keeping its {} extents ({} bytes) \
                 for a lease of {:?}",
                self.client_name,
                self.peer,
                self.extents.len(),
                self.held,
                self.shared.lease
            );
            self.guards.clear();
            let d = Departed {
                id: self.id,
                extents: std::mem::take(&mut self.extents),
                held: std::mem::take(&mut self.held),
                expires: Instant::now() + self.shared.lease,
                client_name: self.client_name.clone(),
                rekeyed: self.rekeyed,
                // Told at its resume, if it was behind.
                behind: false,
            };
            self.shared.departed.lock().insert(key, d);
            self.shared.clients.fetch_sub(1, Ordering::SeqCst);
            self.state = Handshake::New;
        } else {
            self.release_all();
        }
        self.shared.departures.notify_all();
    }

    /// Records this session as the owner of its extents in a backed server's file (a
    /// volume's holder is recorded with the volume), before the change is answered.
    pub(super) fn note_owner(&self) {
        let (Some(b), Some(token), None) = (&self.shared.backing, self.token(), &self.volume)
        else {
            return;
        };
        let record = super::backing::SessionRecord {
            id: self.id,
            token: super::backing::hex(&token_digest(&token)),
            client: self.client_name.clone(),
            // Resumed (told, if it was behind) or new: nothing more to tell.
            behind: false,
        };
        if b.note_session(record) {
            self.shared.save_owners();
        }
    }

    /// `Persist`: a backed server writes its arena and tables back to the medium first.
    pub(super) fn persist(&self, tag: u64) -> Message {
        if let Some(b) = &self.shared.backing {
            if let Err(e) = b.persist() {
                log::error!(
                    "backing file {}: write-back failed: {e}",
                    b.path().display()
                );
                return Message::Refused {
                    tag,
                    code: RefusalCode::Io,
                    message: format!("the server's backing file failed to take a write: {e}"),
                };
            }
        }
        Message::Persisted { tag }
    }

    pub(super) fn release_all(&mut self) {
        let n = self.extents.len();
        if let (Some(b), None) = (&self.shared.backing, &self.volume) {
            b.forget_session(self.id);
        }
        for (_, e) in std::mem::take(&mut self.extents) {
            self.shared.release(e);
        }
        if n > 0 {
            log::info!("released {n} extents of a departed client");
        }
        self.guards.clear();
        self.held = 0;
        if self.welcomed() && !self.observer {
            self.shared.clients.fetch_sub(1, Ordering::SeqCst);
            self.state = Handshake::New;
        }
    }
}
