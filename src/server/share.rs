//! A shared volume's writers on a memory server: many client sessions, each a member of the
//! volume, that allocate, write and free its extents at once (a volume whose namespace lives
//! in a metadata engine such as Redis, not in one holder's journal).
//!
//! Why the server keeps members apart from a holder: with many writers no session may own
//! the memory (one writer frees what another made, and a writer that dies must not take the
//! files' data with it), and each writer must be fenced on its own. So a member's extents are
//! the volume's from the start (kept with the volume, never freed by a lease), any member may
//! free any of them, and its data connections are served as the volume's session. A member
//! the engine has given up on (its heartbeats stopped) is evicted by name by another member
//! (`Evict`): its connections are closed first, so it can never write into memory the engine
//! then hands to another file, and the name is refused from then on. Members report how far
//! they have applied the engine's changes (`FollowAt`), as followers do, so frees wait for
//! every member and follower ([`super::follow`]).

use super::session::Session;
use super::Extent;
use crate::proto::{Message, RefusalCode};
use std::collections::HashMap;
use std::time::Instant;

/// Names evicted from a volume that are remembered (each a member the engine gave up on):
/// enough for any realistic run of evictions; older ones are refused by the engine itself.
const EVICTED_REMEMBERED: usize = 256;

/// How often an eviction looks again for its member's departure, should a departure come
/// between a look and the wait (each is also woken by every departure).
const EVICT_LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// One member of a shared volume, by its control connection.
pub(super) struct Member {
    /// The name it joined under (the engine's session name): what `Evict` names.
    pub(super) who: String,
    /// The engine's change it has applied (0 until it says).
    pub(super) lsn: u64,
    pub(super) last_heard: Instant,
}

/// What a member session is a member of.
pub(super) struct Membership {
    pub(super) volume: String,
}

fn refuse(tag: u64, code: RefusalCode, message: String) -> Message {
    Message::Refused { tag, code, message }
}

impl Session {
    /// `VolumeClaim` with `ClaimMode::Share`: joins (or makes) shared volume `name` as `who`.
    pub(super) fn join(&mut self, tag: u64, name: String, who: String) -> Message {
        let shared = self.shared.clone();
        let mut vols = shared.volumes.lock();
        let created = !vols.contains_key(&name);
        if created {
            if vols.len() >= crate::config::MAX_VOLUMES_PER_SERVER {
                return refuse(
                    tag,
                    RefusalCode::NoSpace,
                    format!(
                        "this server keeps {} volumes already (the most it keeps)",
                        vols.len()
                    ),
                );
            }
            vols.insert(name.clone(), super::volume::Volume::shared(self.id));
            log::info!("shared volume '{name}' made for {who}");
        }
        let v = vols.get_mut(&name).expect("present");
        if !v.shared {
            return refuse(
                tag,
                RefusalCode::Held,
                format!(
                    "volume '{name}' has one holder, not many writers: attach it without a \
                     metadata engine"
                ),
            );
        }
        if v.evicted.contains(&who) {
            return refuse(
                tag,
                RefusalCode::Fenced,
                format!(
                    "'{who}' was evicted from volume '{name}' (its engine session ended): it \
                     may not write again"
                ),
            );
        }
        v.members.insert(
            self.conn,
            Member {
                who: who.clone(),
                lsn: 0,
                last_heard: Instant::now(),
            },
        );
        self.id = v.session_id;
        let reply = Message::VolumeClaimed {
            tag,
            epoch: v.epoch,
            created,
            root: v.root.clone(),
            extents: v.extents,
            bytes: v.bytes,
        };
        log::info!(
            "shared volume '{name}': {who} joins ({} members)",
            v.members.len()
        );
        self.member = Some(Membership { volume: name });
        drop(vols);
        shared.save_owners();
        reply
    }

    /// Keeps a member's new extent with its volume.
    pub(super) fn keep_shared(&self, addr: u64, extent: Extent) {
        let m = self.member.as_ref().expect("a member");
        if let Some(v) = self.shared.volumes.lock().get_mut(&m.volume) {
            v.bytes += extent.len;
            v.parked.insert(addr, extent);
            v.extents = v.parked.len() as u64;
            if let Some(me) = v.members.get(&self.conn) {
                v.allocated_by.insert(addr, me.who.clone());
            }
        }
    }

    /// `MemberExtents`: the extents of the volume that evicted member `who` allocated and no
    /// one freed, above `after` (refused for a member not evicted: a live one may not have
    /// logged its newest yet).
    pub(super) fn member_extents(&self, tag: u64, who: &str, after: u64) -> Message {
        let Some(m) = self.member.as_ref() else {
            return refuse(
                tag,
                RefusalCode::NoVolume,
                "MemberExtents from a session that is no member of a shared volume".into(),
            );
        };
        let vols = self.shared.volumes.lock();
        let Some(v) = vols.get(&m.volume) else {
            return refuse(tag, RefusalCode::NoVolume, "the volume was removed".into());
        };
        if !v.evicted.iter().any(|e| e == who) {
            return refuse(
                tag,
                RefusalCode::NotFound,
                format!("'{who}' is no evicted member of volume '{}'", m.volume),
            );
        }
        let mut all: Vec<(u64, u64, u64)> = v
            .allocated_by
            .iter()
            .filter(|(&a, by)| by.as_str() == who && (a > after || (after == 0 && a == 0)))
            .filter_map(|(a, _)| v.parked.get(a).map(|e| (*a, e.len, e.mr.rkey())))
            .collect();
        all.sort_unstable();
        let more = all.len() > crate::proto::EXTENTS_PER_LIST;
        all.truncate(crate::proto::EXTENTS_PER_LIST);
        Message::ExtentList {
            tag,
            extents: all,
            more,
        }
    }

    /// A member frees an extent of its volume (any member's).
    pub(super) fn free_shared(&self, tag: u64, addr: u64, rkey: u64) -> Message {
        let m = self.member.as_ref().expect("a member");
        let extent = {
            let mut vols = self.shared.volumes.lock();
            let Some(v) = vols.get_mut(&m.volume) else {
                return refuse(tag, RefusalCode::NoVolume, "the volume was removed".into());
            };
            match v.parked.get(&addr) {
                Some(e) if e.mr.rkey() == rkey => {}
                _ => {
                    return refuse(
                        tag,
                        RefusalCode::NotFound,
                        format!("no extent of the volume at {addr:#x} with that rkey"),
                    )
                }
            }
            let e = v.parked.remove(&addr).expect("checked above");
            v.allocated_by.remove(&addr);
            v.bytes -= e.len;
            v.extents = v.parked.len() as u64;
            e
        };
        self.shared.release(extent);
        Message::Freed {
            tag,
            capacity: self.shared.capacity(),
        }
    }

    /// `Evict`: a member fences another of the same volume by the name it joined under.
    pub(super) fn evict(&mut self, tag: u64, who: String) -> Result<Message, String> {
        let m = self
            .member
            .as_ref()
            .ok_or("Evict from a session that is no member of a shared volume")?;
        let conns: Vec<u64> = {
            let mut vols = self.shared.volumes.lock();
            let Some(v) = vols.get_mut(&m.volume) else {
                return Ok(refuse(
                    tag,
                    RefusalCode::NoVolume,
                    "the volume was removed".into(),
                ));
            };
            if !v.evicted.contains(&who) {
                v.evicted.push(who.clone());
                if v.evicted.len() > EVICTED_REMEMBERED {
                    v.evicted.remove(0);
                }
            }
            v.members
                .iter()
                .filter(|(_, mem)| mem.who == who)
                .map(|(c, _)| *c)
                .collect()
        };
        let volume = m.volume.clone();
        log::warn!(
            "shared volume '{volume}': evicting '{who}' ({} connections closed)",
            conns.len()
        );
        // Its control connections close; each departure closes its data connections.
        self.shared.close_connections(&conns);
        self.shared.save_owners();
        // Granted only once each has departed, its data connections closed
        // (`depart_member`): nothing it posted lands after the answer, so the evictor may
        // hand its memory to others.
        let open = || {
            let vols = self.shared.volumes.lock();
            vols.get(&volume).map_or(0, |v| {
                v.members.keys().filter(|c| conns.contains(c)).count()
            })
        };
        let deadline = Instant::now() + self.shared.control_timeout;
        loop {
            let left_open = open();
            if left_open == 0 {
                return Ok(Message::VolumeDone { tag });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(refuse(
                    tag,
                    RefusalCode::Held,
                    format!(
                        "'{who}' is evicted, but {left_open} of its connections did not close \
                         within {:?}: ask again",
                        self.shared.control_timeout
                    ),
                ));
            }
            // Bounded: a departure between the look and the wait is seen a tick later.
            let departed = self.shared.departed.lock();
            drop(
                self.shared
                    .departures
                    .wait_timeout(departed, left.min(EVICT_LOOK_EVERY)),
            );
        }
    }

    /// Notes that a member was heard, and how far it has applied (from `FollowAt`).
    pub(super) fn heard_member(&self, lsn: Option<u64>) {
        if let Some(m) = &self.member {
            if let Some(me) = self
                .shared
                .volumes
                .lock()
                .get_mut(&m.volume)
                .and_then(|v| v.members.get_mut(&self.conn))
            {
                me.last_heard = Instant::now();
                if let Some(l) = lsn {
                    me.lsn = me.lsn.max(l);
                }
            }
        }
    }

    /// The member's connection is gone: its extents stay with the volume. Returns false if
    /// this session is no member.
    pub(super) fn depart_member(&mut self) -> bool {
        let Some(m) = self.member.take() else {
            return false;
        };
        // Its data connections close first: nothing it posted lands after this.
        self.guards.clear();
        if let Some(v) = self.shared.volumes.lock().get_mut(&m.volume) {
            if let Some(me) = v.members.remove(&self.conn) {
                log::info!(
                    "shared volume '{}': {} left ({} members remain); its extents stay",
                    m.volume,
                    me.who,
                    v.members.len()
                );
            }
        }
        // An eviction waits for this.
        self.shared.departures.notify_all();
        true
    }
}

/// The lowest change every member of `members` has applied.
pub(super) fn members_floor(members: &HashMap<u64, Member>) -> Option<u64> {
    members.values().map(|m| m.lsn).min()
}
