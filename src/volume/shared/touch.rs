//! What a change touches, as the engine checks it ([`crate::engine::Touch`]): every inode
//! the change writes, and every inode whose state its checks read that the change does not
//! write. The second kind is what makes the optimistic check sound: a change's checks read
//! its directories (a name exists or not, a directory is empty: entries live in their
//! directory's inode) and the inodes it changes, all written by the change itself, except a
//! directory's move, whose check that it does not go below itself reads every directory
//! above its new parent. Those are touched too, so two moves that together would make a
//! cycle touch each other's directory and cannot both be appended.

use crate::meta::{Change, Ino, Kind, TableView};

/// The key a server's births are appended under ([`Change::Born`]): two clients that find a
/// server reborn at once append one birth, the other's is refused and caught up. Counted
/// down from below the rebuild role's key (`turns::REBUILD_ROLE`), far above any inode.
pub(super) fn server_key(server: u32) -> Ino {
    u64::MAX - 1 - u64::from(server)
}

/// The server whose births `key` is the key of ([`server_key`]), if it is one.
pub(super) fn server_of_key(key: Ino) -> Option<u32> {
    let below = (u64::MAX - 1).checked_sub(key)?;
    (below < crate::client::MAX_SERVERS as u64).then_some(below as u32)
}

/// The birth keys of every server a chunk copy `changes` name is on (sorted, once each):
/// the change reads each server's birth (its copies there were made in the one this table
/// holds), and is refused if another was appended since.
pub(super) fn servers_named(changes: &[Change]) -> Vec<Ino> {
    let mut keys: Vec<Ino> = changes
        .iter()
        .filter_map(|c| match c {
            Change::Extent {
                chunk: Some(chunk), ..
            } => Some(chunk.replicas()),
            _ => None,
        })
        .flatten()
        .map(|r| server_key(r.server))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// `changes` without their chunk copies on `server` (written to a birth of it that is gone).
/// A chunk left with no copy fails: the write it records is lost.
pub(super) fn without_copies_on(
    changes: &[Change],
    server: u32,
) -> crate::error::Result<Vec<Change>> {
    changes
        .iter()
        .map(|c| match c {
            Change::Extent {
                ino,
                idx,
                chunk: Some(chunk),
            } if chunk.on(server).is_some() => {
                let mut kept = chunk.clone();
                kept.remove(server);
                if kept.replicas().is_empty() {
                    return Err(crate::error::Error::new(
                        libc::EIO,
                        format!(
                            "chunk {idx} of inode {ino} had its only copy on memory server \
                             {server}, which restarted empty before the write was logged"
                        ),
                    ));
                }
                Ok(Change::Extent {
                    ino: *ino,
                    idx: *idx,
                    chunk: Some(kept),
                })
            }
            c => Ok(c.clone()),
        })
        .collect()
}

/// The inodes `changes` touch (sorted, once each), and those whose turn the change claims:
/// the files and directories it makes, which its maker usually writes or fills next (no
/// other client can know them before the change is appended).
pub(super) fn touched(changes: &[Change], table: &TableView<'_>) -> (Vec<Ino>, Vec<Ino>) {
    touched_reading(changes, table, true)
}

/// [`touched`]; without `ancestors`, a move's checks are not named (the model tests' mutant,
/// which must let two moves make a cycle).
pub(super) fn touched_reading(
    changes: &[Change],
    table: &TableView<'_>,
    ancestors: bool,
) -> (Vec<Ino>, Vec<Ino>) {
    let mut keys = Vec::new();
    let mut claim = Vec::new();
    for c in changes {
        match c {
            Change::Make { ino, kind, .. } => {
                keys.push(*ino);
                if matches!(kind, Kind::File | Kind::Dir) {
                    claim.push(*ino);
                }
            }
            Change::Attrs { ino, .. }
            | Change::Xattr { ino, .. }
            | Change::Extent { ino, .. }
            | Change::Drop { ino } => keys.push(*ino),
            Change::Entry { dir, .. }
            | Change::EntryAt { dir, .. }
            | Change::Cookies { dir, .. } => keys.push(*dir),
            Change::Parent { dir, parent } => {
                keys.push(*dir);
                if ancestors {
                    keys.extend(table.ancestors(*parent));
                }
            }
            Change::Born { server, .. } => keys.push(server_key(*server)),
        }
    }
    keys.sort_unstable();
    keys.dedup();
    claim.sort_unstable();
    claim.dedup();
    (keys, claim)
}

/// The directories whose names `changes` add or remove (sorted, once each): a client that
/// changes a directory no other client is working in claims its turn with the change
/// ([`super::State::claim_quiet_dirs`]).
pub(super) fn dirs_named(changes: &[Change]) -> Vec<Ino> {
    let mut dirs: Vec<Ino> = changes
        .iter()
        .filter_map(|c| match c {
            Change::Entry { dir, .. } | Change::EntryAt { dir, .. } => Some(*dir),
            _ => None,
        })
        .collect();
    dirs.sort_unstable();
    dirs.dedup();
    dirs
}

/// The files `changes` make (marked open by the appending client: a create opens what it
/// makes; one made and not opened, `mknod`, has its mark taken off by the poller) and the
/// inodes they drop (refused while another client has them open).
pub(super) fn opened_and_dropped(changes: &[Change]) -> (Vec<Ino>, Vec<Ino>) {
    let mut opened = Vec::new();
    let mut dropped = Vec::new();
    for c in changes {
        match c {
            Change::Make {
                ino,
                kind: Kind::File,
                ..
            } => opened.push(*ino),
            Change::Drop { ino } => dropped.push(*ino),
            _ => {}
        }
    }
    (opened, dropped)
}
