//! A backed server's restart ([`super::backing`]): every extent its table lists is taken
//! back from the allocator and registered again under the key its client holds, then handed
//! to its owner as a crash would have left it: a session's as a departed session within a
//! fresh lease (its client resumes it with its last token), a volume's as parked with the
//! volume (its holder resumes, or a new holder claims it). Extents of no known owner (a
//! session that had not been recorded yet) are freed.

use super::backing::{unhex, Backing, Found, SessionRecord, SlotEntry};
use super::volume::Volume;
use super::{Arena, Departed, Extent, ExtentAllocator, TokenDigest};
use crate::fabric::Fabric;
use crate::sync::Arc;
use std::collections::HashMap;
use std::io;
use std::time::{Duration, Instant};

/// What a restart hands the new server.
pub(super) struct Restored {
    pub(super) departed: HashMap<TokenDigest, Departed>,
    pub(super) volumes: HashMap<String, Volume>,
    /// Above every session id the file names (ids are extents' owners).
    pub(super) next_session: u64,
    pub(super) extents: u64,
}

impl Default for Restored {
    fn default() -> Self {
        Restored {
            departed: HashMap::new(),
            volumes: HashMap::new(),
            next_session: 1,
            extents: 0,
        }
    }
}

fn digest(hex: &str) -> Option<TokenDigest> {
    unhex(hex)?.try_into().ok()
}

/// Hands `found`'s extents back to their owners. `behind`: the file may hold less than its
/// clients wrote ([`super::backing::Run::left_whole`]); every owner is then marked so, as are
/// those still marked from an earlier start, until their resume tells them.
pub(super) fn restore(
    fabric: &Arc<dyn Fabric>,
    arena: &Arena,
    backing: &Backing,
    alloc: &mut ExtentAllocator,
    found: Found,
    lease: Duration,
    behind: bool,
) -> io::Result<Restored> {
    let start = Instant::now();
    let owners = &found.owners;
    if !behind
        && (owners.sessions.iter().any(|s| s.behind) || owners.volumes.iter().any(|v| v.behind))
    {
        log::warn!(
            "backing file {}: restored at an earlier start from a file behind its clients' \
             writes, and not every client resumed since: those still take their copies here \
             for stale",
            backing.path().display()
        );
    }
    // A device that issues its own keys (verbs) gives each extent a new one: the table
    // takes it, and each owner's next resume says so (its client lists the new keys).
    let rekeyed = !fabric.chooses_keys();
    let mut r = Restored::default();
    let mut volumes_by_session: HashMap<u64, String> = HashMap::new();
    for rec in &found.owners.volumes {
        volumes_by_session.insert(rec.session_id, rec.name.clone());
        r.next_session = r.next_session.max(rec.session_id + 1);
    }
    let sessions: HashMap<u64, _> = found
        .owners
        .sessions
        .iter()
        .filter_map(|s| Some((s.id, (digest(&s.token)?, s))))
        .collect();
    let mut parked: HashMap<String, HashMap<u64, Extent>> = HashMap::new();
    let mut orphans = 0u64;
    let mut bytes = 0u64;
    let mut kept_sessions = Vec::new();
    for e in &found.extents {
        let volume = volumes_by_session.get(&e.session);
        let session = sessions.get(&e.session);
        if (volume.is_none() && session.is_none()) || !alloc.take(e.offset, e.len) {
            orphans += 1;
            backing.clear_slot(e.offset);
            continue;
        }
        let ptr = arena.ptr.wrapping_add(e.offset as usize);
        // SAFETY: the extent lies inside the arena (the table's slots are checked against
        // its length), which outlives every registration; it is registered once (slots do
        // not overlap, and the allocator handed the range out just now).
        let mr = unsafe {
            if rekeyed {
                fabric.register_extent(ptr, e.len as usize, e.session)
            } else {
                fabric.reregister_extent(ptr, e.len as usize, e.session, e.rkey)
            }
        }
        .map_err(|err| {
            io::Error::other(format!(
                "backing file {}: cannot register the extent at offset {:#x} again: {err}",
                backing.path().display(),
                e.offset
            ))
        })?;
        if rekeyed {
            backing.write_slot(&SlotEntry {
                rkey: mr.rkey(),
                ..*e
            });
        }
        let extent = Extent {
            mr,
            offset: e.offset,
            len: e.len,
        };
        r.next_session = r.next_session.max(e.session + 1);
        r.extents += 1;
        bytes += e.len;
        match (volume, session) {
            (Some(name), _) => {
                parked
                    .entry(name.clone())
                    .or_default()
                    .insert(extent.mr.addr(), extent);
            }
            (None, Some((digest, rec))) => {
                let d = r.departed.entry(*digest).or_insert_with(|| {
                    let behind = behind || rec.behind;
                    kept_sessions.push(SessionRecord {
                        behind,
                        ..(*rec).clone()
                    });
                    Departed {
                        id: rec.id,
                        extents: HashMap::new(),
                        held: 0,
                        expires: Instant::now() + lease,
                        client_name: rec.client.clone(),
                        rekeyed,
                        behind,
                    }
                });
                d.held += extent.len;
                d.extents.insert(extent.mr.addr(), extent);
            }
            (None, None) => unreachable!("orphans are skipped above"),
        }
    }
    for rec in found.owners.volumes {
        let extents = parked.remove(&rec.name).unwrap_or_default();
        let name = rec.name.clone();
        r.volumes
            .insert(name, Volume::restored(rec, extents, rekeyed, behind));
    }
    backing.adopt_sessions(kept_sessions);
    log::info!(
        "backing file {}: restored {} extents ({bytes} bytes) in {:.2} s: {} sessions wait \
         for their clients to resume (lease {:?}), {} volumes; {orphans} extents of no known \
         owner freed, {} damaged table slots dropped",
        backing.path().display(),
        r.extents,
        start.elapsed().as_secs_f64(),
        r.departed.len(),
        lease,
        r.volumes.len(),
        found.bad_slots
    );
    Ok(r)
}
