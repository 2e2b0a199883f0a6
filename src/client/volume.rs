//! The pool's side of volumes: claiming a volume on every server (one epoch above all
//! earlier ones), setting its root, listing its extents for collection, and holding frees
//! back until the journal has committed the record that let go of them.
//!
//! Why frees wait: a volume's namespace is rebuilt from its journal after a crash. If an
//! extent were freed (and handed to another file) before the record dropping its last
//! reference committed, a replay would point a file at memory that now holds someone else's
//! bytes. So while a volume is attached, [`Pool::free`] keeps each free with the journal's
//! last assigned sequence number, and lets it go once that much is committed
//! ([`Pool::release_frees`]) and every follower of the volume (`mount --read-only` on other
//! hosts) has applied that much: a follower reads chunks by the maps it has replayed, so
//! memory it may still map is not handed to another file. The followers are asked through
//! the servers only while a committed free waits, at most every
//! [`crate::config::FOLLOWER_FLOOR_POLL`]; an answer counts only for frees committed before
//! it was asked (a follower that attaches later reads the journal past them).

use super::{control::ControlConn, Pool, PoolConfig, PoolError};
use crate::fabric::RemoteRegion;
use crate::proto::{ClaimMode, Message, RefusalCode, VolumeInfo};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Condvar, Mutex};
use std::collections::VecDeque;
use std::net::SocketAddr;

/// What the daemon asks of every server for its volume.
#[derive(Debug, Clone)]
pub struct VolumeSpec {
    pub name: String,
    /// `host pid N`: what a refused second daemon is told.
    pub holder: String,
    /// Make the volume (`--create`) instead of attaching to it.
    pub create: bool,
    /// Fence a live holder (`--takeover`).
    pub takeover: bool,
    /// What this pool is to the volume.
    pub role: VolumeRole,
}

/// What a pool is to its volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VolumeRole {
    /// Its one holder (the journal's writer).
    #[default]
    Hold,
    /// A follower, read-only (`--read-only`): no epoch, no fencing, nothing allocated.
    Follow,
    /// One of its many writers (`--meta`): `holder` is the engine's session name.
    Share,
}

impl VolumeSpec {
    /// How a server that comes back (or joins) is claimed: adopted by a holder, followed by
    /// a follower, joined by a member.
    pub fn rejoin_mode(&self) -> ClaimMode {
        match self.role {
            VolumeRole::Hold => ClaimMode::Adopt,
            VolumeRole::Follow => ClaimMode::Follow,
            VolumeRole::Share => ClaimMode::Share,
        }
    }
}

/// One server's answer to the claim.
#[derive(Debug, Clone, Default)]
pub struct Claim {
    pub epoch: u64,
    /// The server did not hold the volume (a new one, or a server that restarted empty).
    pub created: bool,
    pub root: Vec<u8>,
    pub extents: u64,
    pub bytes: u64,
}

/// The volume's frees held back until their journal record commits and every follower has
/// applied it (see the module doc).
#[derive(Default)]
pub struct FreeGate {
    /// The last journal sequence number handed out.
    pub assigned: AtomicU64,
    committed: AtomicU64,
    held: Mutex<VecDeque<(u64, RemoteRegion)>>,
    /// Signalled when held frees go (an allocation on a full pool waits for them).
    released: Condvar,
    followers: Mutex<FollowersHeard>,
    /// Every free waits for the floor, even one whose change is committed already (a shared
    /// volume: its members may read by maps older than what this client applied).
    always_floor: AtomicBool,
}

/// The followers' floor as last heard.
#[derive(Default)]
struct FollowersHeard {
    /// What was committed when they were asked: the floor speaks for frees up to it.
    asked_at: u64,
    /// The lowest sequence number every follower had applied (`u64::MAX`: none follows).
    floor: u64,
    when: Option<std::time::Instant>,
}

impl FreeGate {
    /// Keeps `region` until what is assigned now is committed; false if it already is.
    fn hold(&self, region: RemoteRegion) -> bool {
        let mut held = self.held.lock();
        let lsn = self.assigned.load(Ordering::SeqCst);
        let committed = self.committed.load(Ordering::SeqCst);
        let free_from = match self.always_floor.load(Ordering::SeqCst) {
            true => self.release_limit(committed),
            false => committed,
        };
        if lsn <= free_from {
            return false;
        }
        held.push_back((lsn, region));
        true
    }

    /// A gate whose every free waits for the floor (a shared volume's, see `always_floor`).
    pub fn waiting_for_the_floor() -> FreeGate {
        let gate = FreeGate::default();
        gate.always_floor.store(true, Ordering::SeqCst);
        gate
    }

    /// Keeps `region` until change `lsn` (or a later one held before it) is committed and
    /// applied by every follower and member: memory nothing names any more as of `lsn`.
    pub fn hold_after(&self, lsn: u64, region: RemoteRegion) {
        let mut held = self.held.lock();
        let lsn = held.back().map_or(lsn, |(l, _)| lsn.max(*l));
        held.push_back((lsn, region));
    }

    /// Frees held back now.
    pub fn held(&self) -> usize {
        self.held.lock().len()
    }

    /// Waits until no free is held back, or until `deadline`.
    pub fn wait_released(&self, deadline: std::time::Instant) {
        let mut held = self.held.lock();
        while !held.is_empty() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return;
            }
            held = self.released.wait_timeout(held, left).0;
        }
    }

    /// Whether a committed free waits only for the followers (the committer then asks them
    /// even while no record is pending).
    pub fn waits_for_followers(&self) -> bool {
        let committed = self.committed.load(Ordering::SeqCst);
        self.held
            .lock()
            .front()
            .is_some_and(|(lsn, _)| *lsn <= committed)
    }

    /// Up to where frees may go: committed, and applied by every follower asked after.
    fn release_limit(&self, committed: u64) -> u64 {
        let f = self.followers.lock();
        committed.min(f.asked_at).min(f.floor)
    }
}

/// Asks `addr` for its volumes (an observer session: no client slot used).
pub fn list_volumes(addr: SocketAddr, config: &PoolConfig) -> Result<Vec<VolumeInfo>, PoolError> {
    let conn =
        ControlConn::connect_observer(addr, &config.client_name, config.timeout, &config.secret)?;
    let mut all = Vec::new();
    let mut after = String::new();
    loop {
        match conn.request(|tag| Message::VolumeList {
            tag,
            after: after.clone(),
        })? {
            Message::Volumes { volumes, more, .. } => {
                let last = volumes.last().map(|v| v.name.clone());
                all.extend(volumes);
                match (more, last) {
                    (true, Some(l)) => after = l,
                    _ => return Ok(all),
                }
            }
            other => return Err(unexpected(addr, &other)),
        }
    }
}

/// Removes volume `name` from `addr`, freeing its extents there.
pub fn drop_volume(addr: SocketAddr, config: &PoolConfig, name: &str) -> Result<(), PoolError> {
    let conn = ControlConn::connect(addr, &config.client_name, config.timeout, &config.secret)?;
    let reply = conn.request(|tag| Message::VolumeDrop {
        tag,
        name: name.into(),
    })?;
    conn.goodbye();
    match reply {
        Message::VolumeDone { .. } => Ok(()),
        Message::Refused { code, message, .. } => Err(PoolError::Refused {
            addr,
            code,
            message,
        }),
        other => Err(unexpected(addr, &other)),
    }
}

pub(super) fn unexpected(addr: SocketAddr, m: &Message) -> PoolError {
    PoolError::Invalid(format!("memory server {addr} answered {m:?}"))
}

/// Claims `spec`'s volume on a fresh control connection (before its data path).
pub(super) fn claim(
    control: &ControlConn,
    spec: &VolumeSpec,
    mode: ClaimMode,
    min_epoch: u64,
) -> Result<Claim, PoolError> {
    match control.request(|tag| Message::VolumeClaim {
        tag,
        name: spec.name.clone(),
        holder: spec.holder.clone(),
        mode,
        takeover: spec.takeover,
        min_epoch,
    })? {
        Message::VolumeClaimed {
            epoch,
            created,
            root,
            extents,
            bytes,
            ..
        } => Ok(Claim {
            epoch,
            created,
            root,
            extents,
            bytes,
        }),
        Message::Refused { code, message, .. } => Err(PoolError::Refused {
            addr: control.addr,
            code,
            message,
        }),
        other => Err(unexpected(control.addr, &other)),
    }
}

/// How to claim the volume on each of `addrs`: attach where it is known, adopt where a
/// server restarted without it, create everywhere with `--create`. Returns the modes and the
/// epoch to claim at least (one above every epoch any server has seen).
pub fn plan_claims(
    addrs: &[SocketAddr],
    config: &PoolConfig,
    spec: &VolumeSpec,
) -> Result<(Vec<ClaimMode>, u64), PoolError> {
    if spec.role == VolumeRole::Share {
        // The engine says whether the volume exists (and makes it: `--create` is its), the
        // servers host its memory.
        return Ok((vec![ClaimMode::Share; addrs.len()], 0));
    }
    let mut known = Vec::with_capacity(addrs.len());
    let mut names = std::collections::BTreeSet::new();
    let mut epoch = 0;
    for &addr in addrs {
        let vols = list_volumes(addr, config)?;
        let mine = vols.iter().find(|v| v.name == spec.name);
        if let Some(v) = mine {
            epoch = epoch.max(v.epoch);
        }
        known.push(mine.is_some());
        names.extend(vols.into_iter().map(|v| v.name));
    }
    let any = known.iter().any(|k| *k);
    if spec.create {
        if any {
            return Err(PoolError::Refused {
                addr: addrs[known.iter().position(|k| *k).expect("one knows it")],
                code: RefusalCode::VolumeExists,
                message: format!(
                    "volume '{}' exists already: attach to it without --create (or remove it \
                     with `rmemfs volume rm`)",
                    spec.name
                ),
            });
        }
        return Ok((vec![ClaimMode::Create; addrs.len()], 1));
    }
    if spec.role == VolumeRole::Follow && any {
        // A follower claims no epoch; a server that does not know the volume refuses it,
        // naming what it holds.
        return Ok((vec![ClaimMode::Follow; addrs.len()], 0));
    }
    if !any {
        let list = if names.is_empty() {
            "none".to_string()
        } else {
            names.into_iter().collect::<Vec<_>>().join(", ")
        };
        return Err(PoolError::Refused {
            addr: addrs[0],
            code: RefusalCode::NoVolume,
            message: format!(
                "no volume '{}' on these servers (known volumes: {list}); --create makes one",
                spec.name
            ),
        });
    }
    let modes = known
        .iter()
        .map(|&k| {
            if k {
                ClaimMode::Attach
            } else {
                ClaimMode::Adopt
            }
        })
        .collect();
    Ok((modes, epoch + 1))
}

impl Pool {
    /// The claims made at connect, by server (none: not a volume mount); a server that came
    /// back empty, its claim then.
    pub fn claims(&self) -> Vec<Claim> {
        self.claims.lock().clone()
    }

    /// Server `id`'s claim now (see [`Pool::claims`]): a shared volume's birth there is its
    /// root.
    pub fn claim(&self, id: crate::fabric::ServerId) -> Option<Claim> {
        self.claims.lock().get(id.0 as usize).cloned()
    }

    /// The volume's epoch (the highest any server granted).
    pub fn epoch(&self) -> u64 {
        self.claims
            .lock()
            .iter()
            .map(|c| c.epoch)
            .max()
            .unwrap_or(0)
    }

    /// Whether another daemon took this pool's volume over (every operation then fails).
    pub fn fenced(&self) -> Option<String> {
        self.fenced.lock().clone()
    }

    pub(super) fn set_fenced(&self, why: String) {
        {
            let mut f = self.fenced.lock();
            if f.is_some() {
                return;
            }
            log::error!("{why}");
            *f = Some(why);
        }
        // Fenced on one server is fenced on all: every link is let go, so a server this daemon
        // got back meanwhile (one that restarted without the volume and so took its claim)
        // sees its holder gone and the volume's holder takes it at once.
        for s in self.servers.iter() {
            s.mark_failed();
        }
    }

    /// Asks every live backed server (`serve --backing`) to write what it holds back to its
    /// medium, all at once, and waits: a volume commit is durable on them past a power loss
    /// (as far as their medium is: doc/OPERATIONS.md). Servers without a backing file are not
    /// asked. A server that cannot persist is logged; one that does not answer is failed.
    pub fn persist(&self) {
        let backed = |s: &super::Server| s.link().control.hello.backed;
        for (s, answer) in self.ask_live(backed, |tag| Message::Persist { tag }) {
            match answer {
                Ok(Message::Persisted { .. }) => {}
                Ok(other) => log::error!("{}", unexpected(s.addr, &other)),
                Err(e) => {
                    log::warn!("memory server {}: persist failed: {e}", s.addr);
                    s.mark_failed();
                }
            }
        }
    }

    /// Sets the volume's root on every live server; how many took it.
    pub fn set_root(&self, root: &[u8]) -> Result<usize, PoolError> {
        let mut set = 0;
        let mut last = None;
        for s in self.servers.iter().filter(|s| !s.is_failed()) {
            let reply = s.link().control.request(|tag| Message::VolumeRoot {
                tag,
                root: root.to_vec(),
            });
            match reply {
                Ok(Message::VolumeDone { .. }) => set += 1,
                Ok(other) => last = Some(unexpected(s.addr, &other)),
                Err(e) => {
                    s.mark_failed();
                    last = Some(e);
                }
            }
        }
        match (set, last) {
            (0, Some(e)) => Err(e),
            _ => Ok(set),
        }
    }

    /// Every extent this pool's session holds on server `id` (`(addr, len, rkey)`): a volume
    /// holder's are the volume's.
    pub fn session_extents(
        &self,
        id: crate::fabric::ServerId,
    ) -> Result<Vec<(u64, u64, u64)>, PoolError> {
        self.extent_list(id, |tag, after| Message::VolumeExtents { tag, after })
    }

    /// Every extent server `id` lists in answer to `ask` (a request for the extents above an
    /// address), page by page (`ExtentList`s, each cut short at `more`).
    pub(super) fn extent_list(
        &self,
        id: crate::fabric::ServerId,
        ask: impl Fn(u64, u64) -> Message,
    ) -> Result<Vec<(u64, u64, u64)>, PoolError> {
        let s = self.server(id)?;
        let mut all = Vec::new();
        let mut after = 0;
        loop {
            match s.link().control.request(|tag| ask(tag, after))? {
                Message::ExtentList { extents, more, .. } => {
                    let last = extents.last().map(|e| e.0);
                    all.extend(extents);
                    match (more, last) {
                        (true, Some(l)) => after = l,
                        _ => return Ok(all),
                    }
                }
                other => return Err(unexpected(s.addr, &other)),
            }
        }
    }

    /// Holds frees back behind `gate` from now on (a volume's journal is running).
    pub fn set_free_gate(&self, gate: crate::sync::Arc<FreeGate>) {
        *self.free_gate.lock() = Some(gate);
    }

    /// Whether `region`'s free waits for the journal (see the module doc).
    pub(super) fn hold_free(&self, region: RemoteRegion) -> bool {
        let gate = self.free_gate.lock().clone();
        gate.is_some_and(|g| g.hold(region))
    }

    /// Whether memory the journal stopped naming at `lsn` may be written again: that much is
    /// committed and every follower has applied it (asked now if the last answer does not
    /// say so). The journal reuses its old checkpoint's extents this way.
    pub fn released(&self, gate: &FreeGate, lsn: u64) -> bool {
        let committed = gate.committed.load(Ordering::SeqCst);
        if lsn > committed {
            return false;
        }
        if gate.release_limit(committed) >= lsn {
            return true;
        }
        let floor = self.follower_floor();
        *gate.followers.lock() = FollowersHeard {
            asked_at: committed,
            floor,
            when: Some(std::time::Instant::now()),
        };
        floor >= lsn
    }

    /// The journal committed everything up to `lsn`: frees waiting for it go out, once
    /// every follower has applied them too (asked at most every
    /// [`crate::config::FOLLOWER_FLOOR_POLL`]).
    pub fn release_frees(&self, gate: &FreeGate, lsn: u64) {
        gate.committed.fetch_max(lsn, Ordering::SeqCst);
        let committed = gate.committed.load(Ordering::SeqCst);
        let Some(oldest) = gate.held.lock().front().map(|(l, _)| *l) else {
            return;
        };
        if oldest > committed {
            return;
        }
        if oldest > gate.release_limit(committed) {
            let due = gate
                .followers
                .lock()
                .when
                .is_none_or(|t| t.elapsed() >= crate::config::FOLLOWER_FLOOR_POLL);
            if due {
                // Asked outside the gate's locks: a round trip to every server.
                let floor = self.follower_floor();
                let mut f = gate.followers.lock();
                *f = FollowersHeard {
                    asked_at: committed,
                    floor,
                    when: Some(std::time::Instant::now()),
                };
            }
        }
        let limit = gate.release_limit(committed);
        let due: Vec<RemoteRegion> = {
            let mut held = gate.held.lock();
            let mut due = Vec::new();
            while held.front().is_some_and(|(l, _)| *l <= limit) {
                due.push(held.pop_front().expect("checked").1);
            }
            due
        };
        let released = !due.is_empty();
        for r in due {
            if let Err(e) = self.free_now(r) {
                log::debug!("freeing an extent on {}: {e}", r.server);
            }
        }
        if released {
            // Once sent: a waiter goes on to wait for their answers (`Pool::settle_frees`).
            gate.released.notify_all();
        }
    }
}
