//! The journal's room on a full pool (see the parent's "Why a spare"): the [`Spare`] each
//! journal server keeps for the next checkpoint, the [`Reserve`] that refuses growth past it,
//! and the writer's placing, keeping and growing of it.

use super::Writer;
use crate::client::volume::FreeGate;
use crate::client::Pool;
use crate::error::{Error, Result};
use crate::fabric::ServerId;
use crate::meta::Change;
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::Mutex;
use crate::volume::root::Place;
use std::time::Instant;

/// How far the namespace may grow before the spare can no longer hold its next checkpoint:
/// set by the writer at each checkpoint, read by the namespace's [`Recorder`] (which may do
/// no I/O) to refuse growth past it.
///
/// The bound: an image grows by no more than the records that grew it, so the next
/// checkpoint takes at most the last one's bytes plus those of every growing record since.
#[derive(Default)]
pub(in crate::volume) struct Reserve {
    state: Mutex<ReserveState>,
    /// Bytes of growing records ever recorded.
    pub(super) grown: AtomicU64,
    /// A refused change asks the committer to try for a larger spare.
    pub(super) wanted: AtomicBool,
}

#[derive(Default, Clone)]
struct ReserveState {
    /// The journal servers (where the spare is).
    servers: Vec<u32>,
    /// The last checkpoint's bytes, `grown` when it was cut, and the spare's bytes.
    base: u64,
    grown_at: u64,
    cap: u64,
    /// Bytes of a ring: the growth a spare allows for without refusing anything.
    ring: u64,
    last_try: Option<Instant>,
}

impl ReserveState {
    /// What the next checkpoint may take now, with `more` bytes of growing records.
    fn bound(&self, grown: u64, more: u64) -> u64 {
        self.base + grown.saturating_sub(self.grown_at) + more
    }
}

impl Reserve {
    /// `grown`, as a checkpoint reads it with the sequence number it is cut at.
    pub(super) fn grown(&self) -> u64 {
        self.grown.load(Ordering::SeqCst)
    }

    pub(super) fn set(&self, servers: &[u32], base: u64, grown_at: u64, cap: u64, ring: u64) {
        let mut r = self.state.lock();
        *r = ReserveState {
            servers: servers.to_vec(),
            base,
            grown_at,
            cap,
            ring,
            last_try: Some(Instant::now()),
        };
    }

    /// A spare of `cap` bytes now stands (none: an attempt failed).
    pub(super) fn spare_now(&self, cap: Option<u64>) {
        let mut r = self.state.lock();
        if let Some(cap) = cap {
            r.cap = cap;
        }
        r.last_try = Some(Instant::now());
    }

    /// Bytes a spare needs to take a ring's growth from now on.
    pub(super) fn need(&self) -> (Vec<u32>, u64) {
        let r = self.state.lock();
        let need = r.bound(self.grown(), r.ring);
        (r.servers.clone(), need)
    }

    /// Whether the committer should try for a larger spare now: the spare holds less than
    /// a ring's growth, and a refused change asked, or it was not tried for a while.
    pub(super) fn due(&self) -> bool {
        let wanted = self.wanted.swap(false, Ordering::SeqCst);
        let r = self.state.lock();
        let short = r.cap < r.bound(self.grown(), r.ring);
        short
            && (wanted
                || r.last_try
                    .is_none_or(|t| t.elapsed() >= crate::config::JOURNAL_HEAL_RETRY))
    }

    /// Admits a record of `len` bytes: one that grows the namespace past what the spare
    /// holds is refused (ENOSPC) unless the journal servers have (as last heard) the room
    /// for a larger spare, which the committer is then asked to take.
    pub(super) fn admit(&self, pool: &Pool, changes: &[Change], len: u64) -> Result<()> {
        match growth(changes) {
            Growth::None => return Ok(()),
            Growth::Data => {
                // Chunks are refused by the pool when it is full; counted all the same.
                self.grown.fetch_add(len, Ordering::SeqCst);
                return Ok(());
            }
            Growth::Names => {}
        }
        let r = self.state.lock();
        let after = r.bound(self.grown(), len);
        if after > r.cap {
            self.wanted.store(true, Ordering::SeqCst);
            let room = pool
                .status()
                .iter()
                .filter(|s| r.servers.contains(&s.id.0))
                .all(|s| !s.failed && s.capacity.largest_free >= after + r.ring);
            if !room {
                return Err(Error::new(
                    libc::ENOSPC,
                    "the pool is full: the volume keeps the room for its next checkpoint",
                ));
            }
        }
        self.grown.fetch_add(len, Ordering::SeqCst);
        Ok(())
    }
}

/// How a batch may grow the namespace's image.
#[derive(PartialEq)]
enum Growth {
    /// Not at all (attributes, removals, a rename in place).
    None,
    /// By chunks, whose memory the pool refuses when it is full.
    Data,
    /// By inodes, names or extended attributes: refused on a full pool.
    Names,
}

/// Whether a batch grows the namespace's image: it makes an inode, sets an extended
/// attribute or adds more names than it removes (refused on a full pool), or adds chunks or
/// longer names than it removes (a rename to a longer name: counted, not refused, as a
/// rename over an existing name shrinks the image by that name's entry, which the records
/// do not show).
fn growth(changes: &[Change]) -> Growth {
    let mut names = 0i64;
    let mut name_bytes = 0i64;
    let mut data = false;
    for c in changes {
        match c {
            Change::Make { .. } | Change::Xattr { value: Some(_), .. } => return Growth::Names,
            Change::Entry {
                ino: Some(_), name, ..
            }
            | Change::EntryAt { name, .. } => {
                names += 1;
                name_bytes += name.len() as i64;
            }
            Change::Entry {
                ino: None, name, ..
            } => {
                names -= 1;
                name_bytes -= name.len() as i64;
            }
            Change::Extent { chunk: Some(_), .. } => data = true,
            _ => {}
        }
    }
    match (names > 0, data || name_bytes > 0) {
        (true, _) => Growth::Names,
        (false, true) => Growth::Data,
        (false, false) => Growth::None,
    }
}

/// Extents on each journal server set aside for the next checkpoint: its capacity (the
/// smallest of its copies) and the sequence number from which nothing names it (a follower
/// behind it may still read it as a checkpoint).
#[derive(Default)]
pub(in crate::volume) struct Spare {
    pub(super) places: Vec<Place>,
    pub(super) cap: u64,
    pub(super) freed_at: u64,
    /// Each place's server's session mark when the place was known good ([`session_marks`]): a
    /// server that came back without the session since lost it.
    pub(super) downs: Vec<u64>,
}

/// The session each place's server holds of this pool (see [`Pool::session_mark`]; a server
/// down counts as none): a place stays good while its server keeps the session, across lost
/// links that resume (a short one must not cost a full pool its spare).
pub(in crate::volume) fn session_marks(pool: &Pool, places: &[Place]) -> Vec<u64> {
    places
        .iter()
        .map(|p| {
            pool.session_mark(crate::fabric::ServerId(p.server))
                .unwrap_or(u64::MAX)
        })
        .collect()
}

impl Spare {
    /// Whether every place's server stayed up since the places were known good.
    pub(super) fn intact(&self, pool: &Pool) -> bool {
        self.downs.len() == self.places.len() && session_marks(pool, &self.places) == self.downs
    }

    pub(super) fn on(&self, servers: &[u32]) -> bool {
        !self.places.is_empty()
            && self.places.len() == servers.len()
            && self.places.iter().all(|p| servers.contains(&p.server))
    }
}

impl Writer {
    /// `len` bytes on each of `servers`, all or none; with the bytes reserved on each (the
    /// smallest).
    pub(super) fn alloc_all(
        &self,
        servers: &[u32],
        len: u64,
    ) -> std::result::Result<(Vec<Place>, u64), String> {
        let mut places = Vec::new();
        let mut cap = u64::MAX;
        for &s in servers {
            match self.pool.alloc_on(ServerId(s), len) {
                Ok(r) => {
                    cap = cap.min(r.len);
                    places.push(Place {
                        server: s,
                        addr: r.addr,
                        rkey: r.rkey,
                    });
                }
                Err(e) => {
                    self.free(&places, len);
                    return Err(format!("cannot allocate journal space: {e}"));
                }
            }
        }
        Ok((places, cap))
    }

    /// What the next checkpoint may take: the last one's `len` plus a ring of records.
    pub(super) fn spare_need(&self, servers: &[u32], len: u64) -> u64 {
        len + self.root.ring_len.max(self.ring_len(servers))
    }

    /// Where a checkpoint of `len` bytes goes: the spare if it fits and no follower may still
    /// read it, else new extents with room to spare, else new extents of `len`. The bool:
    /// taken from the spare.
    pub(super) fn place_checkpoint(
        &mut self,
        gate: &FreeGate,
        servers: &[u32],
        len: u64,
    ) -> std::result::Result<(Vec<Place>, u64, bool, Vec<u64>), String> {
        if !self.spare.places.is_empty() && !self.spare.intact(&self.pool) {
            // A server of the spare went down since: it may have come back without it.
            let gone = std::mem::take(&mut self.spare);
            self.free(&gone.places, gone.cap);
        }
        if self.spare.cap >= len
            && self.spare.on(servers)
            && self.pool.released(gate, self.spare.freed_at)
        {
            let s = std::mem::take(&mut self.spare);
            return Ok((s.places, s.cap, true, s.downs));
        }
        if self.spare.on(servers) && self.spare.cap < len {
            log::warn!(
                "the volume's checkpoint ({len} bytes) outgrew its spare ({} bytes)",
                self.spare.cap
            );
        }
        let roomy = self.spare_need(servers, len);
        let (places, cap) = match self.alloc_all(servers, roomy) {
            Ok(got) => got,
            Err(_) => self.alloc_all(servers, len)?,
        };
        let downs = session_marks(&self.pool, &places);
        Ok((places, cap, false, downs))
    }

    /// After a checkpoint of `len` bytes: the spare for the next is the old checkpoint or the
    /// old spare if either is large enough, else new extents; on a full pool the largest of
    /// them, short (growth refused until a large one is had). The others are freed.
    pub(super) fn keep_spare(&mut self, old: Spare, servers: &[u32], len: u64, grown_at: u64) {
        let ring = self.root.ring_len.max(self.ring_len(servers));
        let need = len + self.reserve.grown().saturating_sub(grown_at) + ring;
        let mut candidates = Vec::new();
        for c in [old, std::mem::take(&mut self.spare)] {
            if c.intact(&self.pool) {
                candidates.push(c);
            } else {
                self.free(&c.places, c.cap);
            }
        }
        // A spare of the size needed now where the pool has room (an old one may be larger
        // than the namespace needs any more: it goes back), else an old one that fits.
        let fits = candidates
            .iter()
            .position(|c| c.cap >= need && c.on(servers));
        let pick = match self.alloc_all(servers, need) {
            Ok((places, cap)) => Some(Spare {
                downs: session_marks(&self.pool, &places),
                places,
                cap,
                freed_at: 0,
            }),
            Err(_) if fits.is_some() => fits.map(|i| candidates.swap_remove(i)),
            Err(e) => {
                // The largest there is, short: growth is refused past what it holds.
                log::warn!(
                    "the volume's journal cannot set aside {need} bytes for its next \
                         checkpoint ({e}): what grows the namespace past its room gets ENOSPC"
                );
                candidates
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.on(servers))
                    .max_by_key(|(_, c)| c.cap)
                    .map(|(i, _)| i)
                    .map(|i| candidates.swap_remove(i))
            }
        };
        for c in &candidates {
            self.free(&c.places, c.cap);
        }
        if let Some(spare) = pick {
            self.spare = spare;
        }
        self.reserve
            .set(servers, len, grown_at, self.spare.cap, ring);
    }

    /// Tries again for a spare as large as the reserve needs (the pool had no room for it).
    pub(super) fn grow_spare(&mut self, gate: &FreeGate) {
        if !self.spare.places.is_empty() && !self.pool.released(gate, self.spare.freed_at) {
            // The spare is the last checkpoint, which a follower may still read: it goes back
            // only once every follower is past it (tried again at the next retry).
            self.reserve.spare_now(None);
            return;
        }
        let (servers, need) = self.reserve.need();
        match self.alloc_all(&servers, need) {
            Ok((places, cap)) => {
                let old = std::mem::replace(
                    &mut self.spare,
                    Spare {
                        downs: session_marks(&self.pool, &places),
                        places,
                        cap,
                        freed_at: 0,
                    },
                );
                self.free(&old.places, old.cap);
                log::info!("the volume's journal has the room for its next checkpoint again");
                self.reserve.spare_now(Some(cap));
            }
            Err(_) => self.reserve.spare_now(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &[u8], ino: Option<u64>) -> Change {
        Change::Entry {
            dir: 1,
            name: name.into(),
            ino,
        }
    }

    #[test]
    fn a_rename_to_a_longer_name_counts_as_growth_and_is_not_refused() {
        let rename = |from: &[u8], to: &[u8]| growth(&[entry(from, None), entry(to, Some(5))]);
        assert!(rename(b"a", b"a much longer name") == Growth::Data);
        assert!(rename(b"same", b"size") == Growth::None);
        assert!(rename(b"a longer name", b"short") == Growth::None);
        assert!(growth(&[entry(b"new", Some(6))]) == Growth::Names);
        assert!(growth(&[entry(b"gone", None)]) == Growth::None);
    }
}
