//! Volumes on a memory server: extents owned by a named volume rather than by a session,
//! an epoch per volume that fences an old holder, and the volume's root (where its journal
//! and checkpoint are).
//!
//! Why here: a volume must outlive the daemon that holds it (its namespace is journaled into
//! extents on these servers), and a stale daemon must never land a byte after another has
//! taken the volume over. The server is the one place both can be enforced: a holder's
//! session owns the volume's extents while it is connected; when it goes (crash, unmount,
//! lost link) they are parked with the volume, never freed by a lease; a new holder's claim
//! bumps the epoch and first closes the old holder's control and data connections (on verbs
//! its queue pairs), so its one-sided operations fail from then on, and its token may no
//! longer resume. The new holder takes over the same session id, so the volume's extents
//! keep their keys and the journal's chunk maps stay valid.

mod claim;

use super::backing::{hex, unhex, VolumeRecord};
use super::session::Session;
use super::{token_digest, Extent, Shared, TokenDigest};
use crate::proto::{
    ClaimMode, Message, RefusalCode, VolumeInfo, EXTENTS_PER_LIST, MAX_VOLUMES_PER_LIST,
};
use std::collections::HashMap;
use std::net::Shutdown;
use std::time::Instant;

/// Tokens of fenced holders remembered per volume (each a claim that took over from a
/// holder): enough for any realistic run of takeovers between two resumes.
const FENCED_REMEMBERED: usize = 16;

/// Bytes of a shared volume's birth: random, so two births of one volume never match.
const SHARED_BIRTH_LEN: usize = 16;

/// Longest volume name; names are `[A-Za-z0-9._-]`, so they are safe in logs and paths.
pub const MAX_VOLUME_NAME: usize = 64;

/// Whether `name` may name a volume.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_VOLUME_NAME
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

pub(super) struct Volume {
    /// The session id the volume's extents are registered to (every holder takes it).
    pub(super) session_id: u64,
    pub(super) epoch: u64,
    /// The current or last holder (`host pid N`).
    holder: String,
    /// The holder's control connection, while one is connected.
    conn: Option<u64>,
    /// The current or last holder's token: it may resume (a lost link).
    token: Option<TokenDigest>,
    /// Holders a later claim fenced: their resume is refused.
    fenced: Vec<TokenDigest>,
    last_heard: Instant,
    /// The volume's extents while no holder is connected (a shared volume's, always).
    pub(super) parked: HashMap<u64, Extent>,
    pub(super) extents: u64,
    pub(super) bytes: u64,
    pub(super) root: Vec<u8>,
    /// Sessions that read the volume and never write it, by control connection
    /// ([`super::follow`]).
    pub(super) followers: HashMap<u64, super::follow::Follower>,
    /// Many writers, not one holder ([`super::share`]): its members by control connection,
    /// and the names evicted from it (refused from then on).
    pub(super) shared: bool,
    pub(super) members: HashMap<u64, super::share::Member>,
    pub(super) evicted: Vec<String>,
    /// Which member allocated each of a shared volume's extents (by address), so that the
    /// extents of one evicted before it logged them can be collected
    /// ([`super::share`]'s `member_extents`). Not kept across a backed server's restart.
    pub(super) allocated_by: HashMap<u64, String>,
    /// Its extents were registered again under new keys since its holder last resumed (a
    /// backed server's restart on a fabric whose device issues keys).
    rekeyed: bool,
    /// Restored from a file behind what its holder wrote, and not resumed since
    /// ([`super::backing::SessionRecord::behind`]).
    behind: bool,
}

impl Volume {
    /// How a backed server's file keeps it ([`super::backing`]).
    pub(super) fn record(&self, name: &str) -> VolumeRecord {
        VolumeRecord {
            name: name.to_string(),
            session_id: self.session_id,
            epoch: self.epoch,
            holder: self.holder.clone(),
            token: self.token.as_ref().map(|t| hex(t)),
            fenced: self.fenced.iter().map(|t| hex(t)).collect(),
            root: hex(&self.root),
            shared: self.shared,
            evicted: self.evicted.clone(),
            behind: self.behind,
        }
    }

    /// A new, empty volume whose extents are registered to `session_id`, at `epoch`, held
    /// last by `holder` (none connected yet).
    fn new(session_id: u64, epoch: u64, holder: String) -> Volume {
        Volume {
            session_id,
            epoch,
            holder,
            conn: None,
            token: None,
            fenced: Vec::new(),
            last_heard: Instant::now(),
            parked: HashMap::new(),
            extents: 0,
            bytes: 0,
            root: Vec::new(),
            rekeyed: false,
            behind: false,
            followers: HashMap::new(),
            shared: false,
            members: HashMap::new(),
            evicted: Vec::new(),
            allocated_by: HashMap::new(),
        }
    }

    /// A new shared volume whose extents are registered to `session_id`.
    /// A shared volume made now. Its root (no member sets it) is its birth: random bytes
    /// every member is given when it joins, kept in a backing file, new when the server
    /// restarted empty and made the volume again. Members put each birth in the volume's
    /// history ([`crate::meta::Change::Born`]), so none reads memory of an earlier one.
    pub(super) fn shared(session_id: u64) -> Volume {
        Volume {
            shared: true,
            root: crate::auth::random_bytes::<SHARED_BIRTH_LEN>().to_vec(),
            ..Volume::new(session_id, 1, crate::proto::SHARED_VOLUME_HOLDER.into())
        }
    }

    /// A volume from a backed server's file, its holder gone (a restart): its extents
    /// parked, its last holder free to resume and the fenced ones still fenced.
    pub(super) fn restored(
        rec: VolumeRecord,
        parked: HashMap<u64, Extent>,
        rekeyed: bool,
        behind: bool,
    ) -> Volume {
        let digest = |h: &String| unhex(h).and_then(|b| TokenDigest::try_from(b).ok());
        Volume {
            token: rec.token.as_ref().and_then(digest),
            fenced: rec.fenced.iter().filter_map(digest).collect(),
            extents: parked.len() as u64,
            bytes: parked.values().map(|e| e.len).sum(),
            parked,
            root: unhex(&rec.root).unwrap_or_default(),
            rekeyed,
            behind: behind || rec.behind,
            shared: rec.shared,
            evicted: rec.evicted,
            ..Volume::new(rec.session_id, rec.epoch, rec.holder)
        }
    }

    /// `connected`: its holder's control connection is open (see [`Shared::holder_connected`]).
    fn info(&self, name: &str, connected: bool) -> VolumeInfo {
        VolumeInfo {
            name: name.to_string(),
            epoch: self.epoch,
            holder: self.holder.clone(),
            live: connected || !self.members.is_empty(),
            idle_secs: self.last_heard.elapsed().as_secs(),
            extents: self.extents,
            bytes: self.bytes,
            root: self.root.clone(),
        }
    }
}

impl Shared {
    /// Whether volume `v`'s holder is connected here: it has a session whose control
    /// connection its peer has not closed (a daemon that died a moment ago has closed it;
    /// its session departs when its thread reads the close).
    fn holder_connected(&self, v: &Volume) -> bool {
        v.conn.is_some_and(|c| {
            self.sessions
                .lock()
                .get(&c)
                .is_some_and(|s| !peer_closed(s))
        })
    }
}

/// Whether the peer of control connection `stream` has closed it (or it broke), without
/// consuming anything its session thread has still to read. `POLLRDHUP` reports the peer's
/// close even while bytes it sent before closing are still queued (a peek would see those
/// bytes and call the peer alive: a daemon killed just after a heartbeat was refused as live).
fn peer_closed(stream: &std::net::TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut fd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack, for a socket this server owns, with a zero timeout
    // (never blocks); poll only writes `revents` and leaves the socket's queue and flags alone.
    let n = unsafe { libc::poll(&mut fd, 1, 0) };
    match n {
        1 => fd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0,
        0 => false,
        _ => !matches!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EINTR)
        ),
    }
}

fn refuse(tag: u64, code: RefusalCode, message: String) -> Message {
    Message::Refused { tag, code, message }
}

impl Shared {
    /// Frees the parked extents of every volume (the server stops: its memory goes).
    pub(super) fn release_volumes(&self) {
        let parked: Vec<Extent> = self
            .volumes
            .lock()
            .values_mut()
            .flat_map(|v| std::mem::take(&mut v.parked).into_values())
            .collect();
        for e in parked {
            self.release(e);
        }
    }

    pub(super) fn known_volumes(&self) -> String {
        let vols = self.volumes.lock();
        let mut names: Vec<&String> = vols.keys().collect();
        names.sort();
        if names.is_empty() {
            "none".into()
        } else {
            names
                .iter()
                .map(|n| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        }
    }
}

impl Session {
    /// Notes that the holder was heard (a silent holder may be replaced after the lease).
    pub(super) fn heard(&self) {
        self.heard_follower();
        self.heard_member(None);
        if let Some(name) = &self.volume {
            if let Some(v) = self.shared.volumes.lock().get_mut(name) {
                v.last_heard = Instant::now();
            }
        }
    }

    /// Keeps the volume's figures (`volume ls`) in step with this holder's extents.
    pub(super) fn note_usage(&self) {
        if let Some(name) = &self.volume {
            if let Some(v) = self.shared.volumes.lock().get_mut(name) {
                v.extents = self.extents.len() as u64;
                v.bytes = self.held;
            }
        }
    }

    /// `VolumeRoot`: only the holder sets it.
    pub(super) fn set_root(&mut self, tag: u64, root: Vec<u8>) -> Message {
        let Some(name) = &self.volume else {
            return refuse(
                tag,
                RefusalCode::NotFound,
                "this session holds no volume".into(),
            );
        };
        if let Some(v) = self.shared.volumes.lock().get_mut(name) {
            v.root = root;
        }
        self.shared.save_owners();
        Message::VolumeDone { tag }
    }

    /// `VolumeExtents`: the holder's extents above `after`.
    pub(super) fn list_extents(&self, tag: u64, after: u64) -> Message {
        let mut all: Vec<(u64, u64, u64)> = self
            .extents
            .iter()
            .filter(|(&a, _)| a > after || (after == 0 && a == 0))
            .map(|(&a, e)| (a, e.len, e.mr.rkey()))
            .collect();
        all.sort_unstable();
        let more = all.len() > EXTENTS_PER_LIST;
        all.truncate(EXTENTS_PER_LIST);
        Message::ExtentList {
            tag,
            extents: all,
            more,
        }
    }

    /// `VolumeList`.
    pub(super) fn list_volumes(&self, tag: u64, after: &str) -> Message {
        let vols = self.shared.volumes.lock();
        let mut names: Vec<&String> = vols.keys().filter(|n| n.as_str() > after).collect();
        names.sort();
        let more = names.len() > MAX_VOLUMES_PER_LIST;
        let volumes = names
            .into_iter()
            .take(MAX_VOLUMES_PER_LIST)
            .map(|n| vols[n].info(n, self.shared.holder_connected(&vols[n])))
            .collect();
        Message::Volumes { tag, volumes, more }
    }

    /// `VolumeDrop`: frees every extent of a volume no holder is connected to.
    pub(super) fn drop_volume(&mut self, tag: u64, name: &str) -> Message {
        let shared = self.shared.clone();
        let deadline = Instant::now() + shared.control_timeout;
        let gone = {
            let mut vols = shared.volumes.lock();
            // A holder that died a moment ago (its connection closed, its session not yet
            // departed) is waited for, as a claim waits for it: `volume rm` right after a
            // crash is not refused.
            while vols
                .get(name)
                .is_some_and(|v| v.conn.is_some() && !shared.holder_connected(v))
                && Instant::now() < deadline
            {
                let left = deadline.saturating_duration_since(Instant::now());
                vols = shared.volume_changes.wait_timeout(vols, left).0;
            }
            match vols.get(name) {
                None => {
                    return refuse(
                        tag,
                        RefusalCode::NoVolume,
                        format!("no volume '{name}' on this server"),
                    )
                }
                Some(v) if !v.members.is_empty() => {
                    return refuse(
                        tag,
                        RefusalCode::Held,
                        format!(
                            "shared volume '{name}' has {} writers attached: unmount them first",
                            v.members.len()
                        ),
                    )
                }
                Some(v) if v.conn.is_some() => {
                    return refuse(
                        tag,
                        RefusalCode::Held,
                        format!(
                            "volume '{name}' is held by {} (epoch {}): unmount it first",
                            v.holder, v.epoch
                        ),
                    )
                }
                Some(_) => vols.remove(name).expect("present"),
            }
        };
        // Its followers are cut off first: none reads memory freed below.
        let followers: Vec<u64> = gone.followers.keys().copied().collect();
        if !followers.is_empty() {
            log::info!(
                "volume '{name}': closing its {} followers before it is removed",
                followers.len()
            );
            shared.close_connections(&followers);
        }
        // Forgotten in the file before its extents are freed: a crash between leaves them
        // of no owner, freed at the restart.
        shared.save_owners();
        log::info!(
            "volume '{name}' removed: freeing its {} extents ({} bytes)",
            gone.parked.len(),
            gone.bytes
        );
        for (_, e) in gone.parked {
            shared.release(e);
        }
        Message::VolumeDone { tag }
    }
}

#[cfg(test)]
mod tests {
    use super::peer_closed;
    use std::io::Write;
    use std::net::{Shutdown, TcpListener, TcpStream};

    #[test]
    fn a_peer_that_closed_after_sending_is_closed_though_its_bytes_are_unread() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        assert!(!peer_closed(&server), "an open, quiet peer is alive");
        client.write_all(b"heartbeat").unwrap();
        // Sent and not yet read by the session thread: still alive.
        let mut queued = 0;
        while queued == 0 {
            queued = server.peek(&mut [0u8; 16]).unwrap();
        }
        assert!(!peer_closed(&server), "a peer with unread bytes is alive");
        client.shutdown(Shutdown::Both).unwrap();
        // The close follows the bytes on loopback; poll until the FIN is in (bounded).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !peer_closed(&server) {
            assert!(
                std::time::Instant::now() < deadline,
                "the close was never seen"
            );
            std::thread::yield_now();
        }
        // Its bytes are still there for the session thread to read.
        assert_eq!(server.peek(&mut [0u8; 16]).unwrap(), 9);
    }
}
