//! Reading a volume back from its servers: the newest root, the servers' order, the
//! checkpoint from any copy that reads whole, and the ring copy with the longest valid run of
//! records. Attach and followers (`mount --read-only`) both start here.

use super::journal::region;
use super::root::{Place, Root};
use crate::data::DataStore;
use crate::fabric::RemoteRegion;
use crate::meta::{record, Change, Chunk, Meta};

/// Records as the journal frames them: sequence number and changes.
pub(super) type Records = Vec<(u64, Vec<Change>)>;

/// The newest root among `roots` ([`Root::order`]; empty ones are no root).
pub(super) fn newest_root<'a>(
    roots: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Option<Root>, String> {
    let mut best: Option<Root> = None;
    for bytes in roots {
        if let Some(r) = Root::decode(bytes)? {
            if best.as_ref().is_none_or(|b| r.order() > b.order()) {
                best = Some(r);
            }
        }
    }
    Ok(best)
}

/// Each of the root's servers as this pool's index (`servers`, in its order): none for one
/// removed (an empty name) or attached without (`without`).
pub(super) fn permutation(
    root: &Root,
    servers: &[String],
    without: &[String],
) -> Result<Vec<Option<u32>>, String> {
    root.servers
        .iter()
        .map(|s| match servers.iter().position(|a| a == s) {
            Some(i) => Ok(Some(i as u32)),
            // A server drained and removed (`rmemfs admin remove`): nothing names it.
            None if s.is_empty() => Ok(None),
            None if without.contains(s) => Ok(None),
            None => Err(format!(
                "the volume's server {s} is not among --servers ({}): give every server \
                 of the volume, or --force-without {s} if it is gone for good (its copies \
                 are then forgotten)",
                servers.join(",")
            )),
        })
        .collect()
}

/// `c` with its copies renumbered to this pool's servers; copies on a server attached
/// without (`--force-without`) are gone.
fn remap_chunk(c: &Chunk, perm: &[Option<u32>]) -> Chunk {
    c.renumbered(|server| perm[server as usize])
}

/// `records`' changes with their chunk copies renumbered to this pool's servers.
pub(super) fn renumber(records: &mut Records, perm: &[Option<u32>]) -> Result<(), String> {
    for (lsn, changes) in records.iter_mut() {
        for c in changes.iter_mut() {
            if let Change::Extent {
                chunk: Some(chunk), ..
            } = c
            {
                if chunk
                    .extents()
                    .iter()
                    .any(|r| r.server as usize >= perm.len())
                {
                    return Err(format!("journal record {lsn} names an unknown server"));
                }
                *chunk = remap_chunk(chunk, perm);
            }
        }
    }
    Ok(())
}

/// Applies `records` (renumbered by `perm`) to `meta`; how many there were.
pub(super) fn apply_all(
    meta: &mut Meta,
    mut records: Records,
    perm: &[Option<u32>],
) -> Result<usize, String> {
    renumber(&mut records, perm)?;
    let n = records.len();
    for (lsn, changes) in records {
        for c in &changes {
            meta.apply(c)
                .map_err(|e| format!("replaying record {lsn}: {}", e.message))?;
        }
    }
    Ok(n)
}

/// Why reading stopped, if it is an error rather than the journal's end.
pub(super) fn stop_reason(stop: &record::Stop) -> Option<String> {
    match stop {
        record::Stop::NewerFormat { found } => Some(format!(
            "the volume's journal is format {found}; this rmemfs reads formats up to {}: \
             upgrade rmemfs to attach it",
            record::RECORD_VERSION
        )),
        record::Stop::Malformed(why) => Some(format!("the volume's journal is damaged: {why}")),
        _ => None,
    }
}

/// The checkpoint's records, from any copy that reads whole (`usable` says where a place
/// can be read, or not); none if the root names no checkpoint.
pub(super) fn read_checkpoint(
    data: &DataStore,
    root: &Root,
    usable: impl Fn(&Place) -> Option<RemoteRegion>,
) -> Result<Option<Records>, String> {
    if root.checkpoint_len == 0 && root.checkpoint.is_empty() {
        return Ok(None);
    }
    for p in &root.checkpoint {
        let Some(r) = usable(p) else { continue };
        let r = RemoteRegion {
            len: root.checkpoint_len.max(1),
            ..r
        };
        match data.read_region(r, 0, root.checkpoint_len as usize) {
            Ok(bytes) => {
                let read = record::read(&bytes, 0);
                if let Some(why) = stop_reason(&read.stop) {
                    return Err(why);
                }
                if read.end == bytes.len() {
                    return Ok(Some(read.records));
                }
                log::warn!("a copy of the volume's checkpoint is damaged; trying another");
            }
            Err(e) => log::warn!("cannot read a copy of the volume's checkpoint: {e}"),
        }
    }
    Err(
        "no copy of the volume's checkpoint can be read (every server holding one is down \
         or restarted)"
            .into(),
    )
}

/// The ring's records after the checkpoint, from the copy with the longest valid run, and
/// where that run ends in the ring (where the next record goes).
pub(super) fn read_ring(
    data: &DataStore,
    root: &Root,
    usable: impl Fn(&Place) -> Option<RemoteRegion>,
) -> Result<(Records, u64), String> {
    let mut ring: Option<(Records, u64)> = None;
    for p in &root.ring {
        let Some(r) = usable(p) else { continue };
        let r = RemoteRegion {
            len: root.ring_len,
            ..r
        };
        match data.read_region(r, 0, root.ring_len as usize) {
            Ok(bytes) => {
                let read = record::read(&bytes, root.checkpoint_lsn + 1);
                if let Some(why) = stop_reason(&read.stop) {
                    return Err(why);
                }
                if ring.as_ref().is_none_or(|b| read.records.len() > b.0.len()) {
                    ring = Some((read.records, read.end as u64));
                }
            }
            Err(e) => log::warn!("cannot read a copy of the volume's journal: {e}"),
        }
    }
    match ring {
        Some(r) => Ok(r),
        None if root.ring.is_empty() => Ok((Vec::new(), 0)),
        None => Err(
            "no copy of the volume's journal can be read (every server holding one \
                     is down or restarted)"
                .into(),
        ),
    }
}

/// Where place `p` can be read on this pool: its server renumbered by `perm`, if that one
/// is live and `fits` it.
pub(super) fn place_region(
    p: &Place,
    perm: &[Option<u32>],
    fits: impl Fn(u32) -> bool,
    rkey: impl Fn(u32, &Place) -> u64,
) -> Option<RemoteRegion> {
    let id = (*perm.get(p.server as usize)?)?;
    fits(id).then(|| RemoteRegion {
        server: crate::fabric::ServerId(id),
        rkey: rkey(id, p),
        ..region(p, 0)
    })
}
