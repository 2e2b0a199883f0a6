//! The pool's side of following a volume: a follower (or a shared volume's member) reports
//! how far it has applied the journal and learns where the journal is now (`FollowAt`), a
//! holder learns how far its followers have read (`Followers`) before it lets a free go (see
//! [`super::volume::FreeGate`]), and a member fences another (`Evict`).

use super::volume::unexpected;
use super::Pool;
use crate::proto::Message;

/// What one server says of the volume a follower follows.
#[derive(Debug, Clone)]
pub struct FollowedRoot {
    pub epoch: u64,
    pub root: Vec<u8>,
}

impl Pool {
    /// Whether this pool follows a volume (read-only: it allocates and frees nothing).
    pub fn follows(&self) -> bool {
        self.config
            .volume
            .as_ref()
            .is_some_and(|v| v.role == super::volume::VolumeRole::Follow)
    }

    /// Tells every live server that this follower has applied the journal through `lsn` and
    /// asks each where the journal is now: the answers of those that gave one (a server that
    /// does not answer is failed, as any request's).
    pub fn follow_at(&self, lsn: u64) -> Vec<FollowedRoot> {
        let mut roots = Vec::new();
        for (s, answer) in self.ask_every_live(|tag| Message::FollowAt { tag, lsn }) {
            match answer {
                Ok(Message::FollowRoot { epoch, root, .. }) => {
                    roots.push(FollowedRoot { epoch, root })
                }
                Ok(other) => log::warn!("{}", unexpected(s.addr, &other)),
                Err(e) => {
                    log::warn!("memory server {}: following failed: {e}", s.addr);
                    s.mark_failed();
                }
            }
        }
        roots
    }

    /// Sends `build`'s request to every live server at once, then waits for each answer.
    fn ask_every_live(
        &self,
        build: impl Fn(u64) -> Message,
    ) -> Vec<(&super::Server, Result<Message, super::PoolError>)> {
        self.ask_live(|_| true, build)
    }

    /// Sends `build`'s request at once to every live server that `which` picks, then waits
    /// for each answer.
    pub(super) fn ask_live(
        &self,
        which: impl Fn(&super::Server) -> bool,
        build: impl Fn(u64) -> Message,
    ) -> Vec<(&super::Server, Result<Message, super::PoolError>)> {
        let asked: Vec<_> = self
            .servers
            .iter()
            .filter(|s| !s.is_failed() && which(s))
            .map(|s| {
                let link = s.link();
                let rx = link.control.send(&build);
                (s, link, rx)
            })
            .collect();
        asked
            .into_iter()
            .map(|(s, link, rx)| (s, rx.and_then(|rx| link.control.wait(rx))))
            .collect()
    }

    /// Fences member `who` of this pool's shared volume at every server (its engine session
    /// ended): its connections are closed and the name refused from then on. How many
    /// servers did it, of how many (a failed server did not: `who` may still reach it).
    pub fn evict(&self, who: &str) -> (usize, usize) {
        let mut done = 0;
        for s in self.servers.iter().filter(|s| !s.is_failed()) {
            match s.link().control.request(|tag| Message::Evict {
                tag,
                who: who.to_string(),
            }) {
                Ok(Message::VolumeDone { .. }) => done += 1,
                Ok(other) => log::warn!("{}", unexpected(s.addr, &other)),
                Err(e) => log::warn!("memory server {}: cannot evict '{who}': {e}", s.addr),
            }
        }
        (done, self.servers.len())
    }

    /// The extents of this pool's shared volume on server `id` that evicted member `who`
    /// allocated and no one freed (`(addr, len, rkey)`).
    pub fn member_extents(
        &self,
        id: crate::fabric::ServerId,
        who: &str,
    ) -> Result<Vec<(u64, u64, u64)>, super::PoolError> {
        self.extent_list(id, |tag, after| Message::MemberExtents {
            tag,
            who: who.to_string(),
            after,
        })
    }

    /// The lowest journal sequence number every follower of this pool's volume has applied,
    /// over the live servers that answer (`u64::MAX`: none follows).
    pub fn follower_floor(&self) -> u64 {
        let mut floor = u64::MAX;
        for (s, answer) in self.ask_every_live(|tag| Message::Followers { tag }) {
            match answer {
                Ok(Message::FollowerFloor { floor: f, .. }) => floor = floor.min(f),
                Ok(other) => {
                    // Not knowing, hold every free back.
                    log::warn!("{}", unexpected(s.addr, &other));
                    floor = 0;
                }
                Err(e) => {
                    log::warn!(
                        "memory server {}: cannot ask for its followers: {e}",
                        s.addr
                    );
                    s.mark_failed();
                }
            }
        }
        floor
    }
}
