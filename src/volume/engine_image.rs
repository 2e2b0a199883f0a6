//! A shared volume's checkpoint in its metadata engine ([`crate::engine::Checkpoint`]): one
//! client's table as of one change, so the engine's log can be trimmed (else it grows without
//! end, and a client that joins replays it all). The image is the next inode number (8 bytes,
//! little-endian), then the table as journal frames (`meta::record`, as a volume's
//! checkpoint): made from a table nothing changes meanwhile, it is exactly the namespace as
//! of the client's last applied change.

use super::journal::CHANGES_PER_FRAME;
use super::read;
use crate::fs::{Fs, FsConfig};
use crate::meta::{record, Meta};

/// The image of `fs`'s table (which must not change meanwhile).
pub(super) fn encode(fs: &Fs) -> Vec<u8> {
    let (mut image, births) = fs.inspect_meta(|m| (m.image(), m.births()));
    image.add_chunks();
    // The servers' births first: replayed into an empty table they forget nothing.
    image.changes.splice(0..0, births);
    let mut out = image.next_ino.to_le_bytes().to_vec();
    for (i, group) in image.changes.chunks(CHANGES_PER_FRAME).enumerate() {
        out.extend(record::encode(i as u64, group));
    }
    out
}

/// The table an image holds.
pub(super) fn decode(bytes: &[u8], config: &FsConfig) -> Result<Meta, String> {
    let (head, frames) = bytes
        .split_first_chunk::<8>()
        .ok_or("the engine's checkpoint is shorter than its header")?;
    let read = record::read(frames, 0);
    if let Some(why) = read::stop_reason(&read.stop) {
        return Err(why);
    }
    if read.end != frames.len() {
        return Err("the engine's checkpoint ends in a damaged frame".into());
    }
    let mut meta = Meta::new(0o755, config.root_uid, config.root_gid);
    for (n, changes) in read.records {
        for c in &changes {
            meta.apply(c)
                .map_err(|e| format!("the engine's checkpoint, frame {n}: {}", e.message))?;
        }
    }
    meta.number_from(u64::from_le_bytes(*head));
    Ok(meta)
}
