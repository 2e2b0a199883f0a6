//! The registry every fabric shares: the protection domain of one "NIC" (keys to
//! registrations, their pins and in-use counts), the checks every posted work request goes
//! through (the local SGE when it is posted, the remote key, bounds and access where it is
//! served), and the delivery of completions with the counters `stats` reports.
//!
//! The TCP, in-process and verbs fabrics all call these, so a refused request behaves the
//! same on every fabric and the lifetime rule lives in one place: a work request holds an
//! [`InFlight`] on its region until its completion is dropped, and a region in use is never
//! deregistered.

mod pin;

use pin::Unpinned;
pub use pin::{check_range, Pin};

use super::live::LiveSession;
use super::mem::{memlock_limit_text, page_size, round_up, AlignedBuf};
use super::Token;
use super::{
    Access, Completion, CompletionQueue, DeregisterError, FabricError, LocalMr, OpCounters, Opcode,
    WcStatus, WorkRequest, MAX_OP_LEN,
};
use crate::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use crate::sync::{Arc, RwLock};
use std::any::Any;
use std::collections::HashMap;
use std::io;

/// One registration as the fabric's "NIC" sees it.
pub struct RegionEntry {
    pub addr: u64,
    pub len: u64,
    pub lkey: u32,
    pub rkey: u64,
    pub access: Access,
    in_flight: AtomicU32,
    /// The session allowed to reach this region remotely (0: only peers without a session,
    /// i.e. tests that skip the control handshake). A memory server restricts each extent to
    /// the client session it was allocated for.
    session: AtomicU64,
    /// The pin (or device registration); released when the last holder goes.
    _resource: Option<Box<dyn Any + Send + Sync>>,
    /// Keeps an owned buffer alive as long as the registration or any op using it.
    _owner: Option<Arc<AlignedBuf>>,
}

impl std::fmt::Debug for RegionEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionEntry")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("lkey", &self.lkey)
            .field("access", &self.access)
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

impl RegionEntry {
    /// Lets only `session` reach this region remotely.
    pub fn restrict_to(&self, session: u64) {
        self.session.store(session, Ordering::Release);
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }
    /// True if `[addr, addr+len)` lies inside this region.
    pub fn covers(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.addr + self.len)
    }
}

/// Proof that an operation is using a region: the region stays registered and its memory
/// alive until this is dropped (which happens when the completion is reaped).
#[derive(Debug)]
pub struct InFlight(Arc<RegionEntry>);

impl InFlight {
    /// Another hold on the same region, for a second party (a sender thread) that touches the
    /// memory independently of when the completion is reaped.
    pub fn another(&self) -> InFlight {
        self.0.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.0.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Atomic counters behind [`OpCounters`].
#[derive(Debug, Default)]
pub struct Counters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub failed: AtomicU64,
    pub registrations: AtomicU64,
    pub deregistrations: AtomicU64,
    pub deregistration_batches: AtomicU64,
    /// Remote requests refused (bad key, bounds, access or session) by this side's NIC.
    pub remote_refused: AtomicU64,
    /// This side's requests the peer's NIC refused (each closed its connection).
    pub remote_errors: AtomicU64,
}

impl Counters {
    pub fn snapshot(&self) -> OpCounters {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        OpCounters {
            reads: l(&self.reads),
            writes: l(&self.writes),
            bytes_read: l(&self.bytes_read),
            bytes_written: l(&self.bytes_written),
            failed: l(&self.failed),
            registrations: l(&self.registrations),
            deregistrations: l(&self.deregistrations),
            deregistration_batches: l(&self.deregistration_batches),
            remote_refused: l(&self.remote_refused),
            remote_errors: l(&self.remote_errors),
        }
    }
    /// Counts one finished operation.
    pub fn count(&self, opcode: super::Opcode, status: super::WcStatus, len: u64) {
        use super::{Opcode, WcStatus};
        if status != WcStatus::Success {
            self.failed.fetch_add(1, Ordering::Relaxed);
            if status == WcStatus::RemoteAccessError {
                self.remote_errors.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        let (ops, bytes) = match opcode {
            Opcode::Read => (&self.reads, &self.bytes_read),
            Opcode::Write => (&self.writes, &self.bytes_written),
        };
        ops.fetch_add(1, Ordering::Relaxed);
        bytes.fetch_add(len, Ordering::Relaxed);
    }
}

/// The protection domain of a software fabric: keys to registrations.
#[derive(Debug)]
pub struct Registry {
    /// Registrations by lkey (what local scatter entries name).
    map: RwLock<HashMap<u32, Arc<RegionEntry>>>,
    /// Registrations that peers may reach, by rkey (what remote requests name).
    remote: RwLock<HashMap<u64, Arc<RegionEntry>>>,
    /// Authenticated client sessions by token: a data connection presents the token and is
    /// served as that session (and only that session's regions are reachable through it).
    sessions: RwLock<HashMap<Token, Arc<LiveSession>>>,
    pub pinned: Arc<AtomicU64>,
    /// Bytes registered without a pin because the memlock limit refused one.
    pub unpinned: Arc<AtomicU64>,
    /// Whether the notice of the first refused pin was given (once per registry).
    pin_refused: AtomicBool,
    pub counters: Counters,
}

/// What a data connection is served as: a session's id (the regions restricted to it are
/// reachable), and whether it may only READ them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionAccess {
    pub session: u64,
    pub read_only: bool,
}

impl SessionAccess {
    /// Reads and writes as `session`.
    pub fn full(session: u64) -> SessionAccess {
        SessionAccess {
            session,
            read_only: false,
        }
    }
}

/// Keeps a session's token registered; dropped when the control session ends, which fences
/// the session (see [`LiveSession`]).
pub struct SessionGuard {
    registry: Arc<Registry>,
    token: Token,
    live: Arc<LiveSession>,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        if !self.live.leave() {
            return;
        }
        {
            let mut sessions = self.registry.sessions.write();
            // Not a session opened anew under the same token since.
            if sessions
                .get(&self.token)
                .is_some_and(|l| Arc::ptr_eq(l, &self.live))
            {
                sessions.remove(&self.token);
            }
        }
        self.live.fence();
    }
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    pub fn new() -> Registry {
        Registry {
            map: RwLock::new(HashMap::new()),
            remote: RwLock::new(HashMap::new()),
            sessions: RwLock::new(HashMap::new()),
            pinned: Arc::new(AtomicU64::new(0)),
            unpinned: Arc::new(AtomicU64::new(0)),
            pin_refused: AtomicBool::new(false),
            counters: Counters::default(),
        }
    }

    /// Keys from the CSPRNG: knowing earlier keys tells nothing of the next one (a counter
    /// let a client that registered twice compute every key). The rkey, which peers name, has
    /// 64 bits; both are unique in their tables.
    fn fresh_keys(&self) -> (u32, u64) {
        let lkey = loop {
            let key = super::random_u64() as u32;
            if key != 0 && !self.map.read().contains_key(&key) {
                break key;
            }
        };
        let rkey = loop {
            let key = super::random_u64();
            if key != 0 && !self.remote.read().contains_key(&key) {
                break key;
            }
        };
        (lkey, rkey)
    }

    /// Registers an authenticated session's token (server side, when the session sets up its
    /// data path); the guard removes it when the session ends.
    pub fn open_session(self: &Arc<Self>, key: super::SessionKey) -> SessionGuard {
        let mut sessions = self.sessions.write();
        // Each data path the session sets up (one per queue pair) holds a guard of it.
        if let Some(live) = sessions.get(&key.token) {
            if live.join() {
                return SessionGuard {
                    registry: self.clone(),
                    token: key.token,
                    live: live.clone(),
                };
            }
        }
        let live = LiveSession::new(SessionAccess {
            session: key.id,
            read_only: key.read_only,
        });
        // One whose last guard is going: it fences itself (after this, so not under the lock).
        sessions.insert(key.token, live.clone());
        SessionGuard {
            registry: self.clone(),
            token: key.token,
            live,
        }
    }

    /// The session a data connection's token names, if it is live.
    pub fn session_for(&self, token: &Token) -> Option<SessionAccess> {
        self.sessions.read().get(token).map(|l| l.access)
    }

    /// The live session a data connection's token names: its requests are served through it.
    pub fn live_session(&self, token: &Token) -> Option<Arc<LiveSession>> {
        self.sessions.read().get(token).cloned()
    }

    /// Registers a range with pinning (software fabrics). Where the memlock limit refuses
    /// the pin, the range is registered unpinned (and counted apart), with a notice the first
    /// time: a software fabric needs no pin to be correct, and a user's mount must not fail
    /// its writes past `ulimit -l`.
    ///
    /// # Safety
    /// As [`super::Fabric::register`].
    pub unsafe fn register(
        self: &Arc<Self>,
        addr: *mut u8,
        len: usize,
        access: Access,
        owner: Option<Arc<AlignedBuf>>,
    ) -> Result<LocalMr, FabricError> {
        // SAFETY: forwarded contract.
        unsafe { self.register_as(addr, len, access, owner, None) }
    }

    /// As [`Registry::register`], under remote key `rkey` when given (a backed server's
    /// restart registers its extents again under the keys its clients hold); an rkey
    /// already in use is refused.
    ///
    /// # Safety
    /// As [`super::Fabric::register`].
    pub unsafe fn register_as(
        self: &Arc<Self>,
        addr: *mut u8,
        len: usize,
        access: Access,
        owner: Option<Arc<AlignedBuf>>,
        rkey: Option<u64>,
    ) -> Result<LocalMr, FabricError> {
        check_range(addr, len)?;
        if let Some(key) = rkey {
            if key == 0 || self.remote.read().contains_key(&key) {
                return Err(FabricError::Register(format!(
                    "remote key {key:#x} is taken or invalid"
                )));
            }
        }
        let resource: Box<dyn Any + Send + Sync> = match Pin::new(addr, len, self.pinned.clone()) {
            Ok(pin) => Box::new(pin),
            Err(FabricError::PinLimit { limit, .. }) => {
                if !self.pin_refused.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "memory is registered without pinning from here on: the memlock limit \
                         ({limit}, `ulimit -l`) allows no more; the tcp fabric works unpinned"
                    );
                }
                self.unpinned.fetch_add(len as u64, Ordering::Relaxed);
                Box::new(Unpinned {
                    len: len as u64,
                    unpinned: self.unpinned.clone(),
                })
            }
            Err(e) => return Err(e),
        };
        Ok(match rkey {
            None => self.insert(addr as u64, len as u64, access, Some(resource), owner),
            Some(rkey) => {
                let lkey = self.fresh_keys().0;
                self.insert_keyed(
                    lkey,
                    rkey,
                    addr as u64,
                    len as u64,
                    access,
                    Some(resource),
                    owner,
                )
            }
        })
    }

    /// Registers an owned buffer (safe: the registration keeps it alive).
    pub fn register_owned(
        self: Arc<Self>,
        buf: Arc<AlignedBuf>,
        access: Access,
    ) -> Result<LocalMr, FabricError> {
        let (ptr, len) = (buf.as_ptr(), buf.len());
        // SAFETY: the buffer is kept alive by the registration entry itself.
        unsafe { self.register(ptr, len, access, Some(buf)) }
    }

    /// Adds a registration whose resource (pin or device MR) the caller created.
    pub fn insert(
        self: &Arc<Self>,
        addr: u64,
        len: u64,
        access: Access,
        resource: Option<Box<dyn Any + Send + Sync>>,
        owner: Option<Arc<AlignedBuf>>,
    ) -> LocalMr {
        let (lkey, rkey) = self.fresh_keys();
        self.insert_keyed(lkey, rkey, addr, len, access, resource, owner)
    }

    /// Adds a registration whose keys a device chose (the verbs fabric). The device never
    /// hands out a live key twice, so `lkey` is unique in the table.
    #[allow(clippy::too_many_arguments)]
    pub fn insert_keyed(
        self: &Arc<Self>,
        lkey: u32,
        rkey: u64,
        addr: u64,
        len: u64,
        access: Access,
        resource: Option<Box<dyn Any + Send + Sync>>,
        owner: Option<Arc<AlignedBuf>>,
    ) -> LocalMr {
        let key = lkey;
        let entry = Arc::new(RegionEntry {
            addr,
            len,
            lkey,
            rkey,
            access,
            in_flight: AtomicU32::new(0),
            session: AtomicU64::new(0),
            _resource: resource,
            _owner: owner,
        });
        self.map.write().insert(key, entry.clone());
        if access.remote() {
            self.remote.write().insert(rkey, entry.clone());
        }
        self.counters.registrations.fetch_add(1, Ordering::Relaxed);
        LocalMr {
            entry,
            table: self.clone(),
        }
    }

    /// Checks `[addr, addr+len)` against the registration named by `key` and marks it in use.
    /// `None` if the key is unknown, the range is out of bounds, or access is missing.
    pub fn acquire(&self, key: u32, addr: u64, len: u64, need: Access) -> Option<InFlight> {
        let map = self.map.read();
        let entry = map.get(&key)?;
        if !entry.access.contains(need) || !entry.covers(addr, len) {
            return None;
        }
        entry.in_flight.fetch_add(1, Ordering::AcqRel);
        Some(InFlight(entry.clone()))
    }

    /// Removal of a dropped `LocalMr`'s entry. Only that very entry goes: a device may reuse
    /// a key once its registration is gone, and the key may name a newer region by now.
    pub fn remove(&self, entry: &Arc<RegionEntry>) {
        // Lock order everywhere: `map`, then `remote`.
        let mut map = self.map.write();
        let mut remote = self.remote.write();
        if remote
            .get(&entry.rkey)
            .is_some_and(|e| Arc::ptr_eq(e, entry))
        {
            remote.remove(&entry.rkey);
        }
        let ours = map.get(&entry.lkey).is_some_and(|e| Arc::ptr_eq(e, entry));
        if ours && map.remove(&entry.lkey).is_some() {
            self.counters
                .deregistrations
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Deregisters a batch under one lock; regions in use are returned, still registered.
    pub fn deregister_batch(&self, mrs: Vec<LocalMr>) -> Result<(), DeregisterError> {
        let mut busy = Vec::new();
        let mut idle = Vec::with_capacity(mrs.len());
        {
            let mut map = self.map.write();
            let mut remote = self.remote.write();
            for mr in mrs {
                // Checked under both write locks: `acquire` and `admit_remote` increment under
                // a read lock, so no operation can start between this check and the removal.
                if mr.entry.in_flight() > 0 {
                    busy.push(mr);
                } else {
                    map.remove(&mr.entry.lkey);
                    if remote
                        .get(&mr.entry.rkey)
                        .is_some_and(|e| Arc::ptr_eq(e, &mr.entry))
                    {
                        remote.remove(&mr.entry.rkey);
                    }
                    idle.push(mr);
                }
            }
        }
        if !idle.is_empty() {
            self.counters
                .deregistrations
                .fetch_add(idle.len() as u64, Ordering::Relaxed);
            self.counters
                .deregistration_batches
                .fetch_add(1, Ordering::Relaxed);
        }
        drop(idle); // unpins; their keys are already gone, so `LocalMr::drop` is a no-op
        if busy.is_empty() {
            Ok(())
        } else {
            Err(DeregisterError::Busy(busy))
        }
    }

    /// The check a NIC makes when it takes a work request off the send queue: the local SGE
    /// lies inside a registration of this registry with the access the opcode needs (a READ
    /// writes into it), and the length is one a single operation may have. On success the
    /// region is held in use until the completion goes; on failure the request completes at
    /// once with [`WcStatus::LocalProtectionError`] and `None` is returned.
    pub fn admit(&self, cq: &CompletionQueue, wr: &WorkRequest) -> Option<InFlight> {
        let need = match wr.opcode {
            Opcode::Read => Access::LOCAL_WRITE,
            Opcode::Write => Access::NONE,
        };
        let hold = (wr.local.len <= MAX_OP_LEN)
            .then(|| self.acquire(wr.local.lkey, wr.local.addr, wr.local.len, need))
            .flatten();
        if hold.is_none() {
            self.complete(cq, wr, WcStatus::LocalProtectionError, None);
        }
        hold
    }

    /// The check the target's NIC makes: `rkey` names a registration that covers
    /// `[addr, addr+len)` and lets remote peers do `opcode` there. The hold keeps the region
    /// registered while the operation touches it.
    /// `peer` is what the request came in as: a region restricted to another session is
    /// refused as if the key did not exist, and a read-only peer may not write.
    pub fn admit_remote(
        &self,
        peer: SessionAccess,
        opcode: Opcode,
        rkey: u64,
        addr: u64,
        len: u64,
    ) -> Option<InFlight> {
        let need = match opcode {
            Opcode::Read => Access::REMOTE_READ,
            Opcode::Write => Access::REMOTE_WRITE,
        };
        if len > MAX_OP_LEN || (peer.read_only && opcode == Opcode::Write) {
            return None;
        }
        let remote = self.remote.read();
        let entry = remote.get(&rkey)?;
        if !entry.access.contains(need)
            || !entry.covers(addr, len)
            || entry.session.load(Ordering::Acquire) != peer.session
        {
            return None;
        }
        entry.in_flight.fetch_add(1, Ordering::AcqRel);
        Some(InFlight(entry.clone()))
    }

    /// Delivers the completion of `wr` (posted through this registry) and counts it.
    pub fn complete(
        &self,
        cq: &CompletionQueue,
        wr: &WorkRequest,
        status: WcStatus,
        hold: Option<InFlight>,
    ) {
        self.counters.count(wr.opcode, status, wr.local.len);
        cq.push(Completion::new(wr, status, hold));
    }

    pub fn len(&self) -> usize {
        self.map.read().len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests;
