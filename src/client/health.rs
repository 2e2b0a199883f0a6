//! One server's health: heartbeats, failure, reconnecting with backoff (resuming the
//! session, or admitting the server empty once its copies are forgotten), and what the pool
//! last heard of its room.

use super::parked::{forget_session, take_parked, Parked};
use super::*;

/// One server's connections, replaced as a whole when the pool reconnects.
pub(super) struct Link {
    pub(super) control: ControlConn,
    pub(super) qp: Arc<dyn QueuePair>,
}

pub(super) struct Health {
    pub(super) state: ServerState,
    pub(super) since: SystemTime,
    /// The next reconnect attempt is not before this, and the wait after a failed one.
    pub(super) next_attempt: Instant,
    pub(super) backoff: crate::sync::Backoff,
}

impl Health {
    /// Back, but out of service until the caller has dealt with its copies (`Pool::admit`).
    pub(super) fn rejoining(&mut self) {
        self.state = ServerState::Rejoining;
        self.since = SystemTime::now();
    }
}

pub(super) struct Server {
    pub(super) id: ServerId,
    pub(super) addr: SocketAddr,
    pub(super) link: Mutex<Arc<Link>>,
    /// Not up: operations refuse it at once (a fast check on the data path).
    pub(super) failed: AtomicBool,
    /// Out of placement (`rmemfs admin drain`), still read and written.
    pub(super) draining: AtomicBool,
    pub(super) health: Mutex<Health>,
    /// When the heartbeat now unanswered was sent (none outstanding: `None`).
    pub(super) beat_sent: Arc<Mutex<Option<Instant>>>,
    /// Extents let go of (address, key) while the server was down, or whose free the
    /// connection lost: freed there when it resumes this pool's session, forgotten if it
    /// comes back empty.
    pub(super) unfreed: Arc<Mutex<Parked>>,
    /// Frees sent to it and answered.
    pub(super) frees: Arc<FreesOut>,
    /// Extents it granted ahead of demand (see [`stock`]).
    pub(super) stock: Arc<Mutex<stock::Stock>>,
    /// Times it went down or came back up.
    pub(super) transitions: AtomicU64,
}

impl Server {
    pub(super) fn link(&self) -> Arc<Link> {
        self.link.lock().clone()
    }
    /// Its capacity as last heard on the current control connection.
    pub(super) fn capacity(&self) -> Capacity {
        *self.link().control.capacity.lock()
    }
    pub(super) fn is_failed(&self) -> bool {
        if self.failed.load(Ordering::SeqCst) {
            return true;
        }
        let broken = {
            let l = self.link.lock();
            l.control.is_dead() || !l.qp.is_connected()
        };
        if broken {
            self.mark_failed();
        }
        broken
    }
    /// The server is given up on: both connections are closed, so operations still queued
    /// on it fail at once (and are retried on other copies) instead of waiting out a frozen
    /// server, and a server that was only slow learns that this client is gone.
    pub(super) fn mark_failed(&self) {
        if !self.failed.swap(true, Ordering::SeqCst) {
            log::error!("memory server {} ({}) is down", self.addr, self.id);
            {
                let mut h = self.health.lock();
                h.state = ServerState::Down;
                h.since = SystemTime::now();
                h.backoff.reset();
                h.next_attempt = Instant::now() + h.backoff.current();
            }
            *self.beat_sent.lock() = None;
            // Its stock is this session's memory there: freed if the session resumes.
            let stocked = self.stock.lock().drain();
            self.unfreed.lock().keep_current(stocked);
            self.transitions.fetch_add(1, Ordering::SeqCst);
            let link = self.link();
            link.control.kill();
            link.qp.disconnect();
        }
    }
    pub(super) fn failed_error(&self) -> PoolError {
        PoolError::ServerFailed {
            server: self.id,
            addr: self.addr,
        }
    }
}

/// A server is up again (resumed, or admitted empty): used from now on.
pub(super) fn back_up(h: &mut Health, failed: &AtomicBool, transitions: &AtomicU64) {
    h.state = ServerState::Up;
    h.since = SystemTime::now();
    transitions.fetch_add(1, Ordering::SeqCst);
    failed.store(false, Ordering::SeqCst);
}

/// What [`open_link`] opened: the link, what a resumed session held (`(extents, bytes,
/// rekeyed)`), and the volume's claim.
pub(super) struct Opened {
    pub(super) link: Link,
    /// Extents, bytes, rekeyed, behind (as `Message::Resumed` says).
    pub(super) resumed: Option<(u64, u64, bool, bool)>,
    pub(super) claimed: Option<super::volume::Claim>,
}

/// Opens one server's connections: the control session (authenticated), then, when
/// `resume` names an earlier session's token, the request to resume it (`Some((extents,
/// bytes))` if the server still held it), then the data path.
pub(super) fn open_link(
    fabric: &Arc<dyn Fabric>,
    cq: &Arc<CompletionQueue>,
    config: &PoolConfig,
    addr: SocketAddr,
    resume: Option<crate::auth::Token>,
    claim: Option<(crate::proto::ClaimMode, u64)>,
) -> Result<Opened, PoolError> {
    let control = ControlConn::connect(addr, &config.client_name, config.timeout, &config.secret)?;
    if control.hello.fabric != fabric.name() {
        return Err(PoolError::Handshake {
            addr,
            reason: format!(
                "server uses the '{}' fabric, this client '{}'",
                control.hello.fabric,
                fabric.name()
            ),
        });
    }
    let resumed = match resume {
        None => None,
        Some(token) => match control.request(|tag| Message::Resume { tag, token })? {
            Message::Resumed {
                extents,
                bytes,
                rekeyed,
                behind,
                ..
            } => Some((extents, bytes, rekeyed, behind)),
            Message::Refused {
                code: code @ crate::proto::RefusalCode::Fenced,
                message,
                ..
            } => {
                return Err(PoolError::Refused {
                    addr,
                    code,
                    message,
                })
            }
            Message::Refused { .. } => None,
            other => return Err(PoolError::Invalid(format!("unexpected reply {other:?}"))),
        },
    };
    // A volume's new session (not a resumed one) claims the volume before anything else, so
    // every extent it allocates is the volume's.
    let claimed = match (resumed, claim, &config.volume) {
        (None, Some((mode, min_epoch)), Some(spec)) => {
            Some(super::volume::claim(&control, spec, mode, min_epoch)?)
        }
        _ => None,
    };
    let mut exchange = |blob: Vec<u8>| -> Result<Vec<u8>, FabricError> {
        let reply = control.request(|tag| Message::Connect { tag, blob });
        match reply {
            Ok(Message::Connected { blob, .. }) => Ok(blob),
            Ok(other) => Err(FabricError::Handshake {
                addr,
                reason: format!("unexpected reply {other:?}"),
            }),
            Err(e) => Err(FabricError::Handshake {
                addr,
                reason: e.to_string(),
            }),
        }
    };
    let qp = fabric.connect(addr, &mut exchange, cq.clone(), &control.token)?;
    Ok(Opened {
        link: Link { control, qp },
        resumed,
        claimed,
    })
}

impl Pool {
    /// Changes whenever a server goes down or comes back up, joins, is drained or removed.
    pub fn generation(&self) -> u64 {
        self.servers
            .iter()
            .map(|s| s.transitions.load(Ordering::SeqCst))
            .sum::<u64>()
            + self.membership.load(Ordering::SeqCst)
    }

    /// Failed servers due for a reconnect attempt (their backoff has passed).
    pub fn due_for_reconnect(&self) -> Vec<ServerId> {
        let now = Instant::now();
        self.servers
            .iter()
            .filter(|s| s.is_failed())
            .filter(|s| {
                let h = s.health.lock();
                h.state == ServerState::Down && h.next_attempt <= now
            })
            .map(|s| s.id)
            .collect()
    }

    /// One attempt to reconnect to failed server `id` and resume this pool's session there.
    /// `None`: not down, or not reachable yet (the next attempt backs off). A resumed
    /// server is up again at once; one that came back empty waits for [`Pool::admit`].
    pub fn try_reconnect(&self, id: ServerId) -> Option<Rejoin> {
        let s = self.server(id).ok()?;
        if s.health.lock().state != ServerState::Down {
            return None;
        }
        if self.fenced().is_some() {
            // Another daemon holds the volume now: this one claims nothing anywhere again.
            return None;
        }
        let (old, old_instance) = {
            let l = s.link();
            (l.control.token, l.control.hello.instance)
        };
        // A server that lost the volume (restarted) joins it again, empty.
        let claim = self
            .config
            .volume
            .as_ref()
            .map(|spec| (spec.rejoin_mode(), self.epoch()));
        let Opened {
            link,
            resumed,
            claimed,
        } = match open_link(
            &self.fabric,
            &self.cq,
            &self.config,
            s.addr,
            Some(old),
            claim,
        ) {
            Ok(l) => l,
            Err(PoolError::Refused {
                code: crate::proto::RefusalCode::Fenced,
                message,
                ..
            }) => {
                self.set_fenced(format!("memory server {}: {message}", s.addr));
                let mut h = s.health.lock();
                h.backoff.exhaust();
                h.next_attempt = Instant::now() + h.backoff.current();
                return None;
            }
            Err(e) => {
                let mut h = s.health.lock();
                log::debug!("memory server {} ({id}) still unreachable: {e}", s.addr);
                h.next_attempt = Instant::now() + h.backoff.grow();
                return None;
            }
        };
        let link = Arc::new(link);
        if resumed.is_none() {
            // A new session: what was parked or stocked for the old one is forgotten before
            // the new link is published, so nothing sent on it is mistaken for the old
            // session's (see [`Parked`] and [`stock`]).
            forget_session(&s.health, &s.unfreed);
            s.stock.lock().reset();
        }
        *s.link.lock() = link.clone();
        if let Some(c) = claimed {
            if let Some(old) = self.claims.lock().get_mut(id.0 as usize) {
                *old = c;
            }
        }
        let Some((extents, bytes, rekeyed, behind)) = resumed else {
            log::warn!(
                "memory server {} ({id}) is back without this mount's session (restarted, \
                 or its lease ran out): its copies are gone; admitting it empty",
                s.addr
            );
            return Some(Rejoin::Empty);
        };
        // Restarted from its backing file on a fabric whose device issues keys: its
        // extents' new keys, by address, before anything is sent there.
        let keys: Option<std::collections::HashMap<u64, u64>> = if rekeyed {
            match self.session_extents(id) {
                Ok(list) => Some(list.into_iter().map(|(a, _, k)| (a, k)).collect()),
                Err(e) => {
                    log::warn!(
                        "memory server {} ({id}): cannot list its new keys: {e}",
                        s.addr
                    );
                    link.control.kill();
                    let mut h = s.health.lock();
                    h.next_attempt = Instant::now() + h.backoff.current();
                    return None;
                }
            }
        } else {
            None
        };
        let unfreed = take_parked(&s.health, &s.unfreed);
        let n = unfreed.len();
        for (addr, rkey) in unfreed {
            let rkey = match &keys {
                None => rkey,
                Some(k) => match k.get(&addr) {
                    Some(&new) => new,
                    None => continue,
                },
            };
            let _ = link
                .control
                .request(|tag| Message::Free { tag, addr, rkey });
        }
        // Restored after a power loss, and this mount wrote there before it: what it wrote
        // since the server's last write-back is not there.
        if behind && link.control.hello.instance != old_instance {
            log::warn!(
                "memory server {} ({id}) is back from a backing file that may hold less than \
                 was written to it (a restart after a power loss): session resumed with \
                 {extents} extents ({bytes} bytes); its copies are taken for stale where \
                 chunks have others",
                s.addr
            );
            s.health.lock().rejoining();
            return Some(Rejoin::Behind { keys });
        }
        if let Some(keys) = keys {
            log::warn!(
                "memory server {} ({id}) is back from its backing file with new keys: session \
                 resumed with {extents} extents ({bytes} bytes); {n} extents let go of \
                 meanwhile freed; its copies take the new keys before it is used",
                s.addr
            );
            s.health.lock().rejoining();
            return Some(Rejoin::Rekeyed { keys });
        }
        log::warn!(
            "memory server {} ({id}) is back: session resumed with {extents} extents \
             ({bytes} bytes); {n} extents let go of meanwhile freed",
            s.addr
        );
        back_up(&mut s.health.lock(), &s.failed, &s.transitions);
        Some(Rejoin::Resumed { extents, bytes })
    }

    /// Test hook: cuts this pool off server `id` as a lost link would (both connections
    /// closed from this side, no goodbye), so the server keeps the session for its lease.
    #[cfg(feature = "testing")]
    pub fn cut(&self, id: ServerId) {
        if let Ok(s) = self.server(id) {
            s.mark_failed();
            s.health.lock().next_attempt = Instant::now();
        }
    }

    /// Test hook: this pool's process dies (no goodbye, nothing more sent): every server
    /// is cut off as by [`Pool::cut`].
    #[cfg(feature = "testing")]
    pub fn crash(&self) {
        for s in &self.servers {
            self.cut(s.id);
        }
    }

    /// Puts a server that came back empty ([`Rejoin::Empty`]) into service, once the caller
    /// has forgotten every copy it listed on it.
    pub fn admit(&self, id: ServerId) {
        let Ok(s) = self.server(id) else { return };
        let mut h = s.health.lock();
        if h.state != ServerState::Rejoining {
            return;
        }
        back_up(&mut h, &s.failed, &s.transitions);
        drop(h);
        log::warn!("memory server {} ({id}) is up again (empty)", s.addr);
    }

    /// The pool's view of every server.
    pub fn status(&self) -> Vec<ServerStatus> {
        self.servers
            .iter()
            .map(|s| {
                let failed = s.is_failed();
                let (state, since) = {
                    let h = s.health.lock();
                    (h.state, h.since)
                };
                ServerStatus {
                    id: s.id,
                    addr: s.addr,
                    capacity: s.capacity(),
                    failed,
                    state,
                    since,
                    downs: s.transitions.load(Ordering::SeqCst).div_ceil(2),
                    draining: s.draining.load(Ordering::SeqCst),
                }
            })
            .collect()
    }

    /// Asks every live server for its current capacity.
    pub fn refresh(&self) -> Vec<ServerStatus> {
        for s in &self.servers {
            if s.is_failed() {
                continue;
            }
            // The reply thread notes the capacity it carries.
            if s.link()
                .control
                .request(|tag| Message::Stat { tag })
                .is_err()
            {
                s.mark_failed();
            }
        }
        self.status()
    }

    /// One heartbeat round (call it a few times per `detection`): a live server whose last
    /// heartbeat has gone unanswered for `detection` is marked failed (a frozen or cut-off
    /// server is noticed even while no operation is waiting on it); the others get a new
    /// one, whose answer also refreshes what placement knows of their free memory.
    pub fn heartbeat(&self, detection: Duration) {
        for s in &self.servers {
            if s.is_failed() {
                continue;
            }
            let sent = *s.beat_sent.lock();
            match sent {
                Some(t) if t.elapsed() >= detection => {
                    log::error!(
                        "memory server {} ({}) missed its heartbeats for {:?}",
                        s.addr,
                        s.id,
                        t.elapsed()
                    );
                    s.mark_failed();
                }
                Some(_) => {}
                None => {
                    *s.beat_sent.lock() = Some(Instant::now());
                    let beat = s.beat_sent.clone();
                    let sent = s.link().control.send_with_handler(
                        |tag| Message::Stat { tag },
                        Box::new(move |reply| {
                            if let Some(Message::Stats { .. }) = reply {
                                *beat.lock() = None;
                            }
                        }),
                    );
                    if sent.is_err() {
                        s.mark_failed();
                    }
                }
            }
        }
    }

    /// Total and free bytes over live servers.
    pub fn capacity(&self) -> Capacity {
        let mut c = Capacity::default();
        for s in self.status().into_iter().filter(|s| !s.failed) {
            c.total += s.capacity.total;
            c.free += s.capacity.free;
            c.largest_free = c.largest_free.max(s.capacity.largest_free);
        }
        c
    }

    /// Each live server's room as last heard, for checking a placement before it is made:
    /// its free bytes plus what this pool holds in stock there (an allocation refused for
    /// room gets the stock back first, see [`Pool::alloc_on`]).
    pub fn room(&self) -> Vec<Room> {
        self.servers
            .iter()
            .filter(|s| !s.is_failed())
            .map(|s| {
                let c = s.capacity();
                let stocked = s.stock.lock().bytes();
                Room {
                    free: c.free + stocked,
                    largest_free: c.largest_free + stocked,
                }
            })
            .collect()
    }

    /// Whether `id` is up (its connections work, as far as the pool knows).
    pub fn is_live(&self, id: ServerId) -> bool {
        self.server(id).is_ok_and(|s| !s.is_failed())
    }

    /// Which of this pool's sessions server `id` holds now, while it is up: the number
    /// changes only when it comes back without the last one (its memory gone), not when a
    /// lost link resumes. None while it is down.
    pub fn session_mark(&self, id: ServerId) -> Option<u64> {
        let s = self.server(id).ok()?;
        let mark = s.unfreed.lock().session;
        (!s.is_failed()).then_some(mark)
    }

    /// Servers that are up.
    pub fn live_servers(&self) -> usize {
        self.servers.iter().filter(|s| !s.is_failed()).count()
    }

    /// Servers that are up and in placement (not draining): where new copies may go.
    pub fn placeable_servers(&self) -> usize {
        self.servers
            .iter()
            .filter(|s| !s.is_failed() && !s.draining.load(Ordering::SeqCst))
            .count()
    }
}

#[cfg(test)]
mod parked_tests {
    use super::Parked;

    #[test]
    pub(super) fn a_free_parked_for_a_session_that_is_gone_is_dropped() {
        let mut p = Parked::default();
        p.keep(0, 0x1000, 7);
        assert_eq!(p.frees, [(0x1000, 7)]);
        // The server came back without the session: what was kept goes, and a late answer
        // from the old session is not kept for the new one.
        p.session += 1;
        p.frees.clear();
        p.keep(0, 0x2000, 8);
        assert!(p.frees.is_empty());
        p.keep(1, 0x3000, 9);
        assert_eq!(p.frees, [(0x3000, 9)]);
    }
}
