//! Who is in the pool: the servers a mount was started with, those an admin adds to a live
//! mount, those being drained (kept for reads and writes of what they hold, out of placement)
//! and those removed (forgotten: never used, reconnected or counted again).
//!
//! Why a fixed array of slots: every layer above names a server by its index ([`ServerId`]),
//! and the data path holds `&Server` borrows without a lock. Slots that are filled once and
//! never move let a server join while those borrows live; the count of filled slots is
//! published after the slot, so a reader sees only whole servers.

use super::health::{open_link, Health, Opened, Server};
use super::*;
use crate::sync::atomic::AtomicUsize;
use std::sync::OnceLock;

/// Most servers one pool can ever have had (those removed count): a mount grows by
/// `add-server` a few times in its life, and a volume's root names at most 255 servers.
pub const MAX_SERVERS: usize = 64;

pub(super) struct Members {
    slots: Box<[OnceLock<Server>]>,
    len: AtomicUsize,
    /// Held while a server joins (one at a time, so ids stay dense).
    joining: Mutex<()>,
}

impl Members {
    pub(super) fn new(servers: Vec<Server>) -> Members {
        let slots: Box<[OnceLock<Server>]> = (0..MAX_SERVERS).map(|_| OnceLock::new()).collect();
        let len = servers.len();
        for (slot, s) in slots.iter().zip(servers) {
            let _ = slot.set(s);
        }
        Members {
            slots,
            len: AtomicUsize::new(len),
            joining: Mutex::new(()),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    pub(super) fn get(&self, i: usize) -> Option<&Server> {
        if i >= self.len() {
            return None;
        }
        self.slots[i].get()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Server> + '_ {
        self.slots[..self.len()].iter().filter_map(OnceLock::get)
    }
}

impl std::ops::Index<usize> for Members {
    type Output = Server;
    fn index(&self, i: usize) -> &Server {
        self.get(i).expect("a server id this pool gave out")
    }
}

impl<'a> IntoIterator for &'a Members {
    type Item = &'a Server;
    type IntoIter = Box<dyn Iterator<Item = &'a Server> + 'a>;
    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

/// A new server for the pool, up, with `link`.
pub(super) fn new_server(id: ServerId, addr: SocketAddr, link: health::Link) -> Server {
    Server {
        id,
        addr,
        link: Mutex::new(Arc::new(link)),
        failed: AtomicBool::new(false),
        draining: AtomicBool::new(false),
        health: Mutex::new(Health {
            state: ServerState::Up,
            since: SystemTime::now(),
            next_attempt: Instant::now(),
            backoff: crate::sync::Backoff::new(
                crate::config::RECONNECT_BACKOFF_MIN,
                crate::config::RECONNECT_BACKOFF_MAX,
            ),
        }),
        beat_sent: Arc::new(Mutex::new(None)),
        unfreed: Arc::default(),
        frees: Arc::default(),
        stock: Arc::default(),
        transitions: AtomicU64::new(0),
    }
}

/// What this mount holds on one server, as the server counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub extents: u64,
    pub bytes: u64,
}

impl Pool {
    /// Adds the server at `addr` to the pool (`rmemfs admin add-server`): connected,
    /// authenticated, on the pool's fabric, with a volume claimed at the pool's epoch before
    /// any extent lands there. It joins out of placement: [`Pool::set_draining`]`(id,
    /// false)` puts it in. Returns its id.
    pub fn add_server(&self, addr: SocketAddr) -> Result<ServerId, PoolError> {
        let _one = self.servers.joining.lock();
        if let Some(s) = self
            .servers
            .iter()
            .find(|s| s.addr == addr && s.state() != ServerState::Removed)
        {
            return Err(PoolError::Invalid(format!(
                "memory server {addr} is in this pool already ({})",
                s.id
            )));
        }
        // A server removed before (a rolling restart) takes its old slot: ids stay few.
        let reused = self
            .servers
            .iter()
            .find(|s| s.addr == addr)
            .map(|s| s.id.0 as usize);
        let id = reused.unwrap_or_else(|| self.servers.len());
        if id >= MAX_SERVERS {
            return Err(PoolError::Invalid(format!(
                "this pool has had {MAX_SERVERS} servers, its most"
            )));
        }
        if let Some(why) = self.fenced() {
            return Err(PoolError::Invalid(why));
        }
        let claim = self
            .config
            .volume
            .as_ref()
            .map(|spec| (spec.rejoin_mode(), self.epoch()));
        let Opened { link, claimed, .. } =
            open_link(&self.fabric, &self.cq, &self.config, addr, None, claim)?;
        if let Some(c) = claimed {
            if c.epoch != self.epoch() {
                // The server knew the volume at another epoch (it held it before, or an older
                // holder's record): using it would split the volume's fencing. Nothing was
                // placed there.
                link.control.goodbye();
                link.qp.disconnect();
                link.control.kill();
                return Err(PoolError::Invalid(format!(
                    "memory server {addr} holds this volume at epoch {}, this mount's is {}: \
                     not added (a server that held the volume rejoins once restarted, or \
                     after `rmemfs volume rm` run against it alone)",
                    c.epoch,
                    self.epoch()
                )));
            }
            let mut claims = self.claims.lock();
            match claims.get_mut(id) {
                Some(old) => *old = c,
                None => claims.push(c),
            }
        }
        match reused.and_then(|i| self.servers.get(i)) {
            Some(s) => {
                // A new session there: nothing kept for the old one applies.
                super::parked::forget_session(&s.health, &s.unfreed);
                s.stock.lock().reset();
                *s.link.lock() = Arc::new(link);
                s.draining.store(true, Ordering::SeqCst);
                *s.beat_sent.lock() = None;
                let mut h = s.health.lock();
                h.state = ServerState::Up;
                h.since = SystemTime::now();
                s.failed.store(false, Ordering::SeqCst);
            }
            None => {
                let server = new_server(ServerId(id as u32), addr, link);
                // Out of placement until the caller says (a volume names it in its root
                // first).
                server.draining.store(true, Ordering::SeqCst);
                self.servers
                    .slots
                    .get(id)
                    .expect("checked against MAX_SERVERS")
                    .set(server)
                    .map_err(|_| PoolError::Invalid("a server slot was taken twice".into()))?;
                self.servers.len.store(id + 1, Ordering::Release);
            }
        }
        self.membership.fetch_add(1, Ordering::SeqCst);
        log::warn!("memory server {addr} (server#{id}) added to the pool");
        Ok(ServerId(id as u32))
    }

    /// Takes server `id` out of placement (or puts it back): nothing new lands there, what
    /// it holds stays readable and writable until the rebuild has moved it, and its stock
    /// is given back now.
    pub fn set_draining(&self, id: ServerId, draining: bool) -> Result<(), PoolError> {
        let s = self.server(id)?;
        if s.state() == ServerState::Removed {
            return Err(PoolError::Invalid(format!("{id} ({}) was removed", s.addr)));
        }
        if s.draining.swap(draining, Ordering::SeqCst) != draining {
            // A change the rebuild thread sees as a change of servers.
            self.membership.fetch_add(1, Ordering::SeqCst);
        }
        if draining && !s.is_failed() {
            self.drain_stock(s);
        }
        Ok(())
    }

    /// Whether `id` is out of placement (draining or removed).
    pub fn is_draining(&self, id: ServerId) -> bool {
        self.server(id)
            .is_ok_and(|s| s.draining.load(Ordering::SeqCst))
    }

    /// What this mount holds on server `id` (asked of the server): its session's extents,
    /// which with a volume are the volume's there. Stock the reply thread took meanwhile is
    /// given back first when the server is draining.
    pub fn held_on(&self, id: ServerId) -> Result<Held, PoolError> {
        let s = self.server(id)?;
        if s.is_failed() {
            return Err(s.failed_error());
        }
        if s.draining.load(Ordering::SeqCst) {
            self.drain_stock(s);
        }
        match s.link().control.request(|tag| Message::Stat { tag })? {
            Message::Stats { session, .. } => Ok(Held {
                extents: session.extents,
                bytes: session.bytes,
            }),
            other => Err(PoolError::Invalid(format!("unexpected reply {other:?}"))),
        }
    }

    /// Forgets drained server `id` (`rmemfs admin remove`): it says goodbye and its
    /// connections close; the pool never uses, reconnects to or counts it again. Refused
    /// unless it is draining and holds nothing of this mount (a server that is down cannot
    /// be asked, so it cannot be removed this way: drain it once it is back).
    pub fn remove_server(&self, id: ServerId) -> Result<(), PoolError> {
        self.check_removable(id)?;
        let s = self.server(id)?;
        {
            let mut h = s.health.lock();
            s.failed.store(true, Ordering::SeqCst);
            h.state = ServerState::Removed;
            h.since = SystemTime::now();
        }
        self.membership.fetch_add(1, Ordering::SeqCst);
        let link = s.link();
        link.control.goodbye();
        link.qp.disconnect();
        link.control.kill();
        log::warn!("memory server {} ({id}) removed from the pool", s.addr);
        Ok(())
    }

    /// Whether server `id` may be removed: it is draining, and it says it holds no extent
    /// of this pool's session.
    pub fn check_removable(&self, id: ServerId) -> Result<(), PoolError> {
        let s = self.server(id)?;
        if !s.draining.load(Ordering::SeqCst) {
            return Err(PoolError::Invalid(format!(
                "memory server {} is not drained: `rmemfs admin drain MOUNT {}` first",
                s.addr, s.addr
            )));
        }
        let held = self.held_on(id)?;
        if held.extents > 0 {
            return Err(PoolError::Invalid(format!(
                "memory server {} still holds {} extents ({} bytes) of this mount: the drain \
                 has not finished (drain it again)",
                s.addr, held.extents, held.bytes
            )));
        }
        Ok(())
    }

    /// The id of the server at `addr` (not removed).
    pub fn server_at(&self, addr: SocketAddr) -> Option<ServerId> {
        self.servers
            .iter()
            .find(|s| s.addr == addr && s.state() != ServerState::Removed)
            .map(|s| s.id)
    }
}

impl Server {
    pub(super) fn state(&self) -> ServerState {
        self.health.lock().state
    }
}
