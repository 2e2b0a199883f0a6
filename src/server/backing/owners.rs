//! The owners of a backed server's extents, as its file keeps them: the sessions and volumes
//! (two image slots, A/B, the newer valid one wins) and the server run that wrote them (what
//! tells a restart whether the file holds every store or only what was written back). Apart
//! from the extent table (in the parent) because it changes with owners, not with extents.

use super::{Backing, OWNERS_HEADER, OWNERS_SLOT};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io;

/// A session that owns extents, as the file keeps it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(in crate::server) struct SessionRecord {
    pub(in crate::server) id: u64,
    /// Hex of the digest of its last token (what its resume presents).
    pub(in crate::server) token: String,
    pub(in crate::server) client: String,
    /// Restored from a file behind what its client wrote (a power loss), and not resumed
    /// since: its resume must say so, also after another restart in the same boot.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(in crate::server) behind: bool,
}

/// A volume, as the file keeps it ([`super::volume`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(in crate::server) struct VolumeRecord {
    pub(in crate::server) name: String,
    pub(in crate::server) session_id: u64,
    pub(in crate::server) epoch: u64,
    pub(in crate::server) holder: String,
    pub(in crate::server) token: Option<String>,
    pub(in crate::server) fenced: Vec<String>,
    pub(in crate::server) root: String,
    /// Many writers ([`super::share`]), and the names evicted from it.
    #[serde(default)]
    pub(in crate::server) shared: bool,
    #[serde(default)]
    pub(in crate::server) evicted: Vec<String>,
    /// As a session's `behind`: its holder's next resume must say the file was behind.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(in crate::server) behind: bool,
}

/// Everything that owns extents, one image of it.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(in crate::server) struct OwnersImage {
    pub(in crate::server) sessions: Vec<SessionRecord>,
    pub(in crate::server) volumes: Vec<VolumeRecord>,
    /// The server run that wrote the image (absent in files from before it was kept).
    #[serde(default)]
    pub(in crate::server) run: Option<Run>,
}

/// The server run a backing file was last served by: what tells, at a restart, whether the
/// file holds every store into it or only what was written back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(in crate::server) struct Run {
    /// The host's boot it ran in (`/proc/sys/kernel/random/boot_id`; none if unreadable).
    pub(in crate::server) boot: Option<String>,
    /// It stopped in order: everything was written back, then this was.
    pub(in crate::server) clean: bool,
}

impl Run {
    /// Whether a file last served by this run holds every store made into it, for a server
    /// starting in `boot`: it stopped in order, or the host did not restart since (stores
    /// into a shared mapping outlive the process in the page cache). Otherwise (a power loss,
    /// a kernel crash) it holds only what was written back, which may be older than what
    /// clients were told was written.
    pub(in crate::server) fn left_whole(run: Option<&Run>, boot: Option<&str>) -> bool {
        run.is_some_and(|r| r.clean || (r.boot.is_some() && r.boot.as_deref() == boot))
    }
}

/// This boot of the host, as the kernel names it.
pub(in crate::server) fn host_boot() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

pub(in crate::server) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(in crate::server) fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

pub(super) struct OwnersState {
    pub(super) generation: u64,
    pub(super) sessions: HashMap<u64, SessionRecord>,
    /// This run, as each image records it.
    pub(super) run: Option<Run>,
}

impl Backing {
    pub(super) fn owners_ptr(&self, slot: u64) -> *mut u8 {
        // SAFETY: both owners slots lie inside the mapping (layout).
        unsafe {
            self.base
                .add((self.layout.owners_offset + slot * OWNERS_SLOT) as usize)
        }
    }

    pub(super) fn read_owners(&self) -> (u64, OwnersImage) {
        let mut best: Option<(u64, OwnersImage)> = None;
        for slot in 0..2 {
            let p = self.owners_ptr(slot);
            let mut head = [0u8; OWNERS_HEADER];
            // SAFETY: the slot's header lies inside the mapping; no one else runs yet.
            unsafe { std::ptr::copy_nonoverlapping(p, head.as_mut_ptr(), OWNERS_HEADER) };
            let generation = u64::from_le_bytes(head[..8].try_into().expect("8"));
            let len = u64::from_le_bytes(head[8..16].try_into().expect("8"));
            let crc = u32::from_le_bytes(head[16..20].try_into().expect("4"));
            if generation == 0 || len > OWNERS_SLOT - OWNERS_HEADER as u64 {
                continue;
            }
            // SAFETY: `len` fits in the slot (checked), inside the mapping.
            let body =
                unsafe { std::slice::from_raw_parts(p.add(OWNERS_HEADER), len as usize) }.to_vec();
            let mut h = crc32fast::Hasher::new();
            h.update(&head[..16]);
            h.update(&body);
            if h.finalize() != crc {
                log::warn!(
                    "backing file {}: owners image {slot} is torn; ignored",
                    self.path.display()
                );
                continue;
            }
            let Ok(image) = serde_json::from_slice::<OwnersImage>(&body) else {
                log::warn!(
                    "backing file {}: owners image {slot} does not parse; ignored",
                    self.path.display()
                );
                continue;
            };
            if best.as_ref().is_none_or(|(g, _)| generation > *g) {
                best = Some((generation, image));
            }
        }
        best.unwrap_or_default()
    }

    /// Notes a session that owns extents (its first, or a resume under a new token).
    /// True if the record changed (the owners must be saved).
    pub(in crate::server) fn note_session(&self, record: SessionRecord) -> bool {
        let mut o = self.owners.lock();
        if o.sessions.get(&record.id) == Some(&record) {
            return false;
        }
        o.sessions.insert(record.id, record);
        true
    }

    /// Forgets a session whose extents are all gone (saved with the next image).
    pub(in crate::server) fn forget_session(&self, id: u64) {
        self.owners.lock().sessions.remove(&id);
    }

    /// The sessions restored from the file, so later images keep them.
    pub(in crate::server) fn adopt_sessions(
        &self,
        records: impl IntoIterator<Item = SessionRecord>,
    ) {
        let mut o = self.owners.lock();
        for r in records {
            o.sessions.insert(r.id, r);
        }
    }

    /// Writes a new owners image with `volumes` (taken by the caller under its lock; the
    /// sessions are this writer's): into the older slot, then it counts.
    pub(in crate::server) fn save_owners(&self, volumes: impl FnOnce() -> Vec<VolumeRecord>) {
        if self.frozen() {
            return;
        }
        let mut o = self.owners.lock();
        let mut sessions: Vec<SessionRecord> = o.sessions.values().cloned().collect();
        sessions.sort_by_key(|s| s.id);
        let image = OwnersImage {
            sessions,
            volumes: volumes(),
            run: o.run.clone(),
        };
        self.write_image(&mut o, &image);
    }

    /// Starts run `boot`: from now on the file may hold stores not yet written back, and a
    /// restart after a power loss must know (see [`Run::left_whole`]). Every image says so from
    /// now on; the caller saves and writes back the first before anyone is served, so an
    /// older image that says "stopped in order" cannot outlive it on the medium.
    pub(in crate::server) fn begin_run(&self, boot: Option<String>) {
        self.owners.lock().run = Some(Run { boot, clean: false });
    }

    /// Ends the run in order, after the last write-back: the newest image (as frozen) is
    /// written again saying so, and written back.
    pub(in crate::server) fn end_run_clean(&self) -> io::Result<()> {
        let mut o = self.owners.lock();
        let (_, mut image) = self.read_owners();
        let Some(run) = image.run.as_mut() else {
            return Ok(());
        };
        run.clean = true;
        self.write_image(&mut o, &image);
        drop(o);
        self.persist_owners()
    }

    /// Writes `image` into the older slot; then it counts.
    fn write_image(&self, o: &mut OwnersState, image: &OwnersImage) {
        let body = serde_json::to_vec(image).expect("the owners image serializes");
        if body.len() + OWNERS_HEADER > OWNERS_SLOT as usize {
            log::error!(
                "backing file {}: the owners image ({} bytes) is larger than its slot: owners \
                 changed since are NOT kept across a restart",
                self.path.display(),
                body.len()
            );
            return;
        }
        let generation = o.generation + 1;
        let p = self.owners_ptr(generation % 2);
        let mut head = [0u8; OWNERS_HEADER];
        head[..8].copy_from_slice(&generation.to_le_bytes());
        head[8..16].copy_from_slice(&(body.len() as u64).to_le_bytes());
        let mut h = crc32fast::Hasher::new();
        h.update(&head[..16]);
        h.update(&body);
        head[16..20].copy_from_slice(&h.finalize().to_le_bytes());
        // SAFETY: the slot (header and body, checked to fit) lies inside the mapping and is
        // only written under `owners`; the other slot keeps the last image meanwhile.
        unsafe {
            std::ptr::copy_nonoverlapping(body.as_ptr(), p.add(OWNERS_HEADER), body.len());
            std::ptr::copy_nonoverlapping(head.as_ptr(), p, OWNERS_HEADER);
        }
        o.generation = generation;
    }

    /// Writes the owners images (only) back to the medium, and waits: what marks a run's
    /// start and its clean end, without the whole arena's write-back (seconds on a slow host,
    /// where a restart must stay within the mount's rebuild delay).
    pub(in crate::server) fn persist_owners(&self) -> io::Result<()> {
        // SAFETY: msync of this server's own mapping, over both owners slots (page-aligned:
        // see `Layout`), which lie inside it.
        let r = unsafe {
            libc::msync(
                self.owners_ptr(0).cast(),
                (2 * OWNERS_SLOT) as usize,
                libc::MS_SYNC,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}
