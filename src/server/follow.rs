//! A volume's followers on a memory server: sessions that read a volume and never write it
//! (`rmemfs mount --volume NAME --read-only`), while its one holder keeps writing.
//!
//! Why here: the server is where "never write" can be enforced and where the holder can
//! learn how far its followers have read. A follower claims the volume with
//! [`ClaimMode::Follow`](crate::proto::ClaimMode): its data connections are then served as the
//! volume's session, read-only (the software fabrics' check; on verbs the queue pair's
//! access flags leave out remote write), and it may allocate, free or set nothing. It reports
//! the journal sequence number it has applied (`FollowAt`); the holder asks for the lowest
//! (`Followers`) and frees no extent whose last reference was dropped after it, so no
//! follower reads memory handed to another file. A follower silent past the lease is cut off
//! (its connections closed): a frozen one holds the holder's frees back that long at most.

use super::session::Session;
use super::Shared;
use crate::proto::{Message, RefusalCode};
use std::net::Shutdown;
use std::time::Instant;

/// One follower of a volume, by its control connection.
pub(super) struct Follower {
    /// The journal sequence number it has applied (0 until it says).
    lsn: u64,
    last_heard: Instant,
    /// Cut off for silence; its session is departing.
    cut: bool,
    /// `host pid N`, for the log.
    who: String,
}

/// What a follower session follows.
pub(super) struct Following {
    pub(super) volume: String,
    /// The volume's session id: its data connections are served as that session.
    pub(super) session_id: u64,
}

impl Session {
    /// `VolumeClaim` with `ClaimMode::Follow`.
    pub(super) fn follow(&mut self, tag: u64, name: String, who: String) -> Message {
        let shared = self.shared.clone();
        let mut vols = shared.volumes.lock();
        let Some(v) = vols.get_mut(&name) else {
            drop(vols);
            return Message::Refused {
                tag,
                code: RefusalCode::NoVolume,
                message: format!(
                    "no volume '{name}' on this server (it holds: {})",
                    shared.known_volumes()
                ),
            };
        };
        v.followers.insert(
            self.conn,
            Follower {
                lsn: 0,
                last_heard: Instant::now(),
                cut: false,
                who: who.clone(),
            },
        );
        log::info!(
            "volume '{name}': {who} follows it (read-only), {} followers",
            v.followers.len()
        );
        let reply = Message::VolumeClaimed {
            tag,
            epoch: v.epoch,
            created: false,
            root: v.root.clone(),
            extents: v.extents,
            bytes: v.bytes,
        };
        self.follows = Some(Following {
            volume: name,
            session_id: v.session_id,
        });
        reply
    }

    /// `FollowAt`: the follower (or a shared volume's member) has applied the journal (the
    /// engine's changes) through `lsn`.
    pub(super) fn follow_at(&mut self, tag: u64, lsn: u64) -> Result<Message, String> {
        if let Some(m) = &self.member {
            let name = m.volume.clone();
            self.heard_member(Some(lsn));
            let vols = self.shared.volumes.lock();
            let v = vols.get(&name).ok_or("the volume was removed")?;
            return Ok(Message::FollowRoot {
                tag,
                epoch: v.epoch,
                root: v.root.clone(),
            });
        }
        let f = self
            .follows
            .as_ref()
            .ok_or("FollowAt from a session that follows no volume")?;
        let mut vols = self.shared.volumes.lock();
        let Some(v) = vols.get_mut(&f.volume) else {
            return Ok(Message::Refused {
                tag,
                code: RefusalCode::NoVolume,
                message: format!("volume '{}' was removed", f.volume),
            });
        };
        if let Some(me) = v.followers.get_mut(&self.conn) {
            me.lsn = me.lsn.max(lsn);
            me.last_heard = Instant::now();
        }
        Ok(Message::FollowRoot {
            tag,
            epoch: v.epoch,
            root: v.root.clone(),
        })
    }

    /// `Followers`: how far the followers (and a shared volume's members) of the volume this
    /// session holds or writes have read.
    pub(super) fn followers(&self, tag: u64) -> Result<Message, String> {
        let name = self
            .volume
            .as_ref()
            .or(self.member.as_ref().map(|m| &m.volume))
            .ok_or("Followers from a session that holds no volume")?;
        let vols = self.shared.volumes.lock();
        let (followers, floor) = vols.get(name).map_or((0, u64::MAX), |v| {
            let floor = v
                .followers
                .values()
                .map(|f| f.lsn)
                .chain(super::share::members_floor(&v.members))
                .min();
            (
                (v.followers.len() + v.members.len()) as u32,
                floor.unwrap_or(u64::MAX),
            )
        });
        Ok(Message::FollowerFloor {
            tag,
            followers,
            floor,
        })
    }

    /// Notes that a follower was heard.
    pub(super) fn heard_follower(&self) {
        if let Some(f) = &self.follows {
            if let Some(me) = self
                .shared
                .volumes
                .lock()
                .get_mut(&f.volume)
                .and_then(|v| v.followers.get_mut(&self.conn))
            {
                me.last_heard = Instant::now();
            }
        }
    }

    /// The follower's connection is gone: it holds nothing back any more. Returns false if
    /// this session follows no volume.
    pub(super) fn depart_follower(&mut self) -> bool {
        let Some(f) = self.follows.take() else {
            return false;
        };
        // Its data connections close first: nothing it asked for is read after this.
        self.guards.clear();
        if let Some(v) = self.shared.volumes.lock().get_mut(&f.volume) {
            if let Some(me) = v.followers.remove(&self.conn) {
                log::info!(
                    "volume '{}': follower {} left ({} remain)",
                    f.volume,
                    me.who,
                    v.followers.len()
                );
            }
        }
        true
    }
}

impl Shared {
    /// Closes the control connections of followers silent past the lease (frozen or cut
    /// off): their departure closes their data connections, and the holder's frees go on.
    pub(super) fn cut_silent_followers(&self) {
        let mut silent = Vec::new();
        for (name, v) in self.volumes.lock().iter_mut() {
            for (conn, f) in v.followers.iter_mut() {
                if !f.cut && f.last_heard.elapsed() > self.lease {
                    f.cut = true;
                    silent.push(*conn);
                    log::warn!(
                        "volume '{name}': follower {} silent for {:.1} s (past the lease): \
                         cutting it off",
                        f.who,
                        f.last_heard.elapsed().as_secs_f64()
                    );
                }
            }
        }
        self.close_connections(&silent);
    }

    /// Closes the control connections `conns` (their sessions then depart).
    pub(super) fn close_connections(&self, conns: &[u64]) {
        let sessions = self.sessions.lock();
        for c in conns {
            if let Some(s) = sessions.get(c) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}
