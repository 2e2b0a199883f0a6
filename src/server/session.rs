//! One client's control session: the handshake (hello, mutual proofs, a fabric connection),
//! then allocation, free, capacity and resume requests, until goodbye or a drop (which
//! starts the session's lease).

use super::*;

pub(super) struct Session {
    pub(super) shared: Arc<Shared>,
    /// Unique in this server's life, never 0 (0 is "no session" to the fabric). A session
    /// that resumes an earlier one takes over that one's id (its extents are restricted to it).
    pub(super) id: u64,
    /// This control connection (its entry in `Shared::sessions`).
    pub(super) conn: u64,
    pub(super) peer: Option<SocketAddr>,
    pub(super) client_name: String,
    /// This client's extents, by remote address.
    pub(super) extents: HashMap<u64, Extent>,
    /// Bytes those extents hold (against the quota).
    pub(super) held: u64,
    /// Server-side halves of the client's data paths.
    pub(super) guards: Vec<PeerGuard>,
    pub(super) state: Handshake,
    /// The client said `Goodbye`: free everything now, no lease.
    pub(super) goodbye: bool,
    /// Its failure is counted already (as a wrong secret or --max-clients refusal, or by
    /// `count_failure`).
    pub(super) failure_counted: bool,
    /// An observer (`rmemfs stats --server`): not a client, asks only for `Stats`.
    pub(super) observer: bool,
    /// The volume this session holds ([`super::volume`]): its extents are the volume's.
    pub(super) volume: Option<String>,
    /// The volume this session follows, read-only ([`super::follow`]).
    pub(super) follows: Option<super::follow::Following>,
    /// The shared volume this session writes as one of many ([`super::share`]).
    pub(super) member: Option<super::share::Membership>,
    /// It resumed extents that got new keys (a backed server's restart on verbs) and has not
    /// listed them yet: if it goes first, the next resume says `rekeyed` again.
    pub(super) rekeyed: bool,
}

/// Where a control session is in its handshake.
pub(super) enum Handshake {
    /// Nothing received yet.
    New,
    /// `Challenge` sent; waiting for the client's proof.
    Challenged {
        client_nonce: Nonce,
        server_nonce: Nonce,
        client_name: String,
    },
    /// Authenticated: serving requests as this session, whose data connections present
    /// `token`.
    Welcomed { token: Token },
}

/// Why a session ended early.
#[derive(Debug, thiserror::Error)]
pub(super) enum SessionError {
    #[error("{0}")]
    Frame(#[from] FrameError),
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("protocol violation: {0}")]
    Violation(String),
}

impl Session {
    pub(super) fn run(&mut self, stream: &mut TcpStream) -> Result<(), SessionError> {
        stream.set_nodelay(true)?;
        // The whole handshake must finish within the control timeout, however the peer
        // trickles it.
        let deadline = std::time::Instant::now() + self.shared.control_timeout;
        loop {
            if !self.welcomed() {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return Err(SessionError::Violation(
                        "handshake not completed in time".into(),
                    ));
                }
                stream.set_read_timeout(Some(left))?;
            }
            let msg = match proto::read_frame(stream) {
                Ok(m) => m,
                Err(FrameError::Closed) => return Ok(()),
                Err(e @ FrameError::Proto(_)) => {
                    self.count_failure();
                    let _ = proto::write_frame(
                        stream,
                        &Message::Fatal {
                            message: e.to_string(),
                        },
                    );
                    return Err(e.into());
                }
                Err(e) => return Err(e.into()),
            };
            if let Message::Fatal { message } = &msg {
                if matches!(self.state, Handshake::Challenged { .. }) {
                    // It refused this server's proof: it holds another secret, or none.
                    bump(&self.shared.refusals.refused_secret);
                    self.failure_counted = true;
                }
                log::warn!("client {:?} gave up: {message}", self.peer);
                return Ok(());
            }
            if matches!(msg, Message::Goodbye) && self.welcomed() {
                self.goodbye = true;
                return Ok(());
            }
            let reply = match self.handle(msg) {
                Ok(r) => Some(r),
                Err(why) => {
                    self.count_failure();
                    let _ = proto::write_frame(
                        stream,
                        &Message::Fatal {
                            message: why.clone(),
                        },
                    );
                    return Err(SessionError::Violation(why));
                }
            };
            if self.welcomed() {
                stream.set_read_timeout(None)?;
            }
            match reply {
                Some(reply) => proto::write_frame(stream, &reply)?,
                None => return Ok(()),
            }
        }
    }

    /// Counts how the session ended: a handshake that never finished, or a protocol
    /// violation after it (a client that merely disconnects counts as neither).
    pub(super) fn count_end(&mut self, ended: &Result<(), SessionError>) {
        if !self.welcomed()
            || matches!(
                ended,
                Err(SessionError::Violation(_) | SessionError::Frame(FrameError::Proto(_)))
            )
        {
            self.count_failure();
        }
    }

    /// Counts this session's failure, once, and before the peer can see it (a `Fatal` or
    /// the close): a failed handshake, or after it a protocol violation.
    pub(super) fn count_failure(&mut self) {
        if std::mem::replace(&mut self.failure_counted, true) {
            return;
        }
        let r = &self.shared.refusals;
        bump(if self.welcomed() {
            &r.protocol_violations
        } else {
            &r.failed_handshakes
        });
    }

    /// The session token, once welcomed.
    pub(super) fn token(&self) -> Option<Token> {
        match &self.state {
            Handshake::Welcomed { token } => Some(*token),
            _ => None,
        }
    }

    pub(super) fn welcomed(&self) -> bool {
        matches!(self.state, Handshake::Welcomed { .. })
    }

    /// The handshake: `Hello` → `Challenge` (the server's proof) → `Proof` (the client's) →
    /// `Welcome`. `Err` ends the session with a `Fatal` saying why.
    pub(super) fn handshake(&mut self, msg: Message) -> Result<Message, String> {
        let shared = self.shared.clone();
        match (std::mem::replace(&mut self.state, Handshake::New), msg) {
            (
                Handshake::New,
                Message::Hello {
                    version,
                    client_name,
                    nonce,
                    observer,
                },
            ) => {
                self.observer = observer;
                if version != PROTOCOL_VERSION {
                    return Err(format!(
                        "protocol version {version} not supported (server speaks \
                         {PROTOCOL_VERSION})"
                    ));
                }
                if !observer && shared.clients.load(Ordering::SeqCst) >= shared.max_clients {
                    bump(&shared.refusals.refused_max_clients);
                    self.failure_counted = true;
                    log::warn!(
                        "refused client {:?} ('{client_name}'): {} clients already (--max-clients)",
                        self.peer,
                        shared.max_clients
                    );
                    return Err(format!(
                        "the server already serves {} clients (its --max-clients)",
                        shared.max_clients
                    ));
                }
                let server_nonce = auth::random_bytes::<{ auth::NONCE_LEN }>();
                let proof = shared.secret.server_proof(&auth::Transcript {
                    client_nonce: &nonce,
                    server_nonce: &server_nonce,
                    client_name: &client_name,
                });
                self.state = Handshake::Challenged {
                    client_nonce: nonce,
                    server_nonce,
                    client_name,
                };
                Ok(Message::Challenge {
                    version: PROTOCOL_VERSION,
                    nonce: server_nonce,
                    authenticated: shared.secret.is_set(),
                    proof,
                })
            }
            (
                Handshake::Challenged {
                    client_nonce,
                    server_nonce,
                    client_name,
                },
                Message::Proof { proof },
            ) => {
                let t = auth::Transcript {
                    client_nonce: &client_nonce,
                    server_nonce: &server_nonce,
                    client_name: &client_name,
                };
                if !auth::proofs_match(&proof, &shared.secret.client_proof(&t)) {
                    bump(&shared.refusals.refused_secret);
                    self.failure_counted = true;
                    log::warn!(
                        "refused client {:?} ('{client_name}'): it does not hold this server's \
                         secret",
                        self.peer
                    );
                    return Err(
                        "authentication failed: wrong secret (check --secret-file on \
                                the mount and on the server)"
                            .into(),
                    );
                }
                let token = shared.secret.session_token(&t);
                self.state = Handshake::Welcomed { token };
                self.client_name = client_name.clone();
                shared
                    .live_tokens
                    .lock()
                    .insert(token_digest(&token), self.conn);
                if !self.observer {
                    shared.clients.fetch_add(1, Ordering::SeqCst);
                }
                log::info!(
                    "client '{client_name}' connected from {:?}{}",
                    self.peer,
                    if shared.secret.is_set() {
                        " (authenticated)"
                    } else {
                        ""
                    }
                );
                Ok(Message::Welcome {
                    version: PROTOCOL_VERSION,
                    server_instance: shared.instance,
                    fabric: shared.fabric.name().into(),
                    capacity: shared.capacity(),
                    backed: shared.backing.is_some(),
                })
            }
            (Handshake::New, other) => Err(format!("expected Hello first, got {}", kind(&other))),
            (_, other) => Err(format!("expected Proof, got {}", kind(&other))),
        }
    }

    /// Answers one message; `Err` is a protocol violation that ends the session.
    pub(super) fn handle(&mut self, msg: Message) -> Result<Message, String> {
        let token = match &self.state {
            Handshake::Welcomed { token } => *token,
            _ => return self.handshake(msg),
        };
        if self.observer && !matches!(msg, Message::Stat { .. } | Message::VolumeList { .. }) {
            return Err(format!(
                "an observer may only ask for Stats and VolumeList, not {}",
                kind(&msg)
            ));
        }
        self.heard();
        if self.follows.is_some()
            && !matches!(
                msg,
                Message::Connect { .. }
                    | Message::FollowAt { .. }
                    | Message::Stat { .. }
                    | Message::VolumeList { .. }
            )
        {
            return Err(format!(
                "a follower may only connect, follow, and ask for Stats and VolumeList, not {}",
                kind(&msg)
            ));
        }
        if self.member.is_some()
            && matches!(
                msg,
                Message::Resume { .. }
                    | Message::VolumeClaim { .. }
                    | Message::VolumeRoot { .. }
                    | Message::VolumeDrop { .. }
            )
        {
            return Err(format!(
                "a member of a shared volume may not send {}",
                kind(&msg)
            ));
        }
        Ok(match msg {
            Message::Connect { tag, blob } => {
                // A follower's data connections are served as the volume's session, read-only.
                let (id, read_only) = match &self.follows {
                    Some(f) => (f.session_id, true),
                    None => (self.id, false),
                };
                let session = SessionKey {
                    id,
                    token,
                    read_only,
                };
                match self
                    .shared
                    .fabric
                    .accept(&blob, self.shared.listen, session)
                {
                    Ok((blob, guard)) => {
                        self.guards.push(guard);
                        Message::Connected { tag, blob }
                    }
                    Err(e) => Message::Refused {
                        tag,
                        code: RefusalCode::RegistrationFailed,
                        message: format!("data path setup failed: {e}"),
                    },
                }
            }
            Message::Resume { tag, token: old } => return self.resume(tag, &old, &token),
            Message::Alloc { tag, len } => {
                let reply = self.alloc(tag, len);
                self.note_usage();
                reply
            }
            Message::Free { tag, addr, rkey } => {
                let reply = self.free(tag, addr, rkey);
                self.note_usage();
                reply
            }
            Message::VolumeClaim {
                tag,
                name,
                holder,
                mode,
                takeover,
                min_epoch,
            } => return self.claim(tag, name, holder, mode, takeover, min_epoch),
            Message::VolumeRoot { tag, root } => self.set_root(tag, root),
            Message::VolumeExtents { tag, after } => {
                let list = self.list_extents(tag, after);
                if matches!(list, Message::ExtentList { more: false, .. }) {
                    // It has heard every key.
                    self.rekeyed = false;
                }
                list
            }
            Message::VolumeList { tag, after } => self.list_volumes(tag, &after),
            Message::VolumeDrop { tag, name } => self.drop_volume(tag, &name),
            Message::Persist { tag } => self.persist(tag),
            Message::FollowAt { tag, lsn } => return self.follow_at(tag, lsn),
            Message::Followers { tag } => return self.followers(tag),
            Message::Evict { tag, who } => return self.evict(tag, who),
            Message::Stat { tag } => Message::Stats {
                tag,
                capacity: self.shared.capacity(),
                extents: self.shared.extents.load(Ordering::SeqCst),
                clients: self.shared.clients.load(Ordering::SeqCst),
                counters: self.shared.counters(),
                session: crate::proto::Holding {
                    extents: self.extents.len() as u64,
                    bytes: self.held,
                },
            },
            other => return Err(format!("unexpected {} from a client", kind(&other))),
        })
    }

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
    fn note_owner(&self) {
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
    fn persist(&self, tag: u64) -> Message {
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

pub(super) fn kind(m: &Message) -> &'static str {
    match m {
        Message::Hello { .. } => "Hello",
        Message::Challenge { .. } => "Challenge",
        Message::Proof { .. } => "Proof",
        Message::Welcome { .. } => "Welcome",
        Message::Connect { .. } => "Connect",
        Message::Connected { .. } => "Connected",
        Message::Alloc { .. } => "Alloc",
        Message::Allocated { .. } => "Allocated",
        Message::Free { .. } => "Free",
        Message::Freed { .. } => "Freed",
        Message::Stat { .. } => "Stat",
        Message::Stats { .. } => "Stats",
        Message::Refused { .. } => "Refused",
        Message::Fatal { .. } => "Fatal",
        Message::Resume { .. } => "Resume",
        Message::Resumed { .. } => "Resumed",
        Message::Goodbye => "Goodbye",
        Message::VolumeClaim { .. } => "VolumeClaim",
        Message::VolumeClaimed { .. } => "VolumeClaimed",
        Message::VolumeRoot { .. } => "VolumeRoot",
        Message::VolumeDone { .. } => "VolumeDone",
        Message::VolumeExtents { .. } => "VolumeExtents",
        Message::ExtentList { .. } => "ExtentList",
        Message::VolumeList { .. } => "VolumeList",
        Message::Volumes { .. } => "Volumes",
        Message::VolumeDrop { .. } => "VolumeDrop",
        Message::Persist { .. } => "Persist",
        Message::Persisted { .. } => "Persisted",
        Message::FollowAt { .. } => "FollowAt",
        Message::FollowRoot { .. } => "FollowRoot",
        Message::Followers { .. } => "Followers",
        Message::FollowerFloor { .. } => "FollowerFloor",
        Message::Evict { .. } => "Evict",
    }
}

/// TCP keepalive on a control connection: a client host that vanished (powered off, link cut)
/// is noticed after `idle` plus three one-second probes, and its session departs (its lease
/// starts) instead of holding a slot forever. `TCP_USER_TIMEOUT` bounds unacknowledged
/// replies the same way.
pub(super) fn keep_alive(stream: &TcpStream, idle: Duration) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    /// Probes one second apart, three of them: a live peer's kernel answers the first.
    const PROBE_INTERVAL_SECS: libc::c_int = 1;
    const PROBES: libc::c_int = 3;
    let fd = stream.as_raw_fd();
    let idle_secs = idle.as_secs().clamp(1, 3600) as libc::c_int;
    let user_timeout_ms = idle.as_millis().clamp(1000, 3_600_000) as libc::c_int;
    let set = |level: libc::c_int, name: libc::c_int, value: libc::c_int| {
        // SAFETY: `fd` is an open socket owned by `stream`; the option value is a live local
        // int of the size passed.
        let r = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                &value as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, idle_secs)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, PROBE_INTERVAL_SECS)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, PROBES)?;
    set(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, user_timeout_ms)
}
