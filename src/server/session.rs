//! One client's control session: the handshake (hello, mutual proofs, a fabric connection),
//! then allocation, free, capacity and resume requests, until goodbye or a drop (which
//! starts the session's lease). This room runs the session's loop and routes its requests;
//! the handshake is in [`super::handshake`], what the session holds (allocations, frees, a
//! resume, its end) in [`super::holding`].

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
            Message::MemberExtents { tag, who, after } => self.member_extents(tag, &who, after),
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
        Message::MemberExtents { .. } => "MemberExtents",
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
