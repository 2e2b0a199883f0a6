//! What a change touches, as the engine checks it ([`crate::engine::Touch`]): every key
//! the change writes, and every key whose state its checks read that the change does not
//! write. The second kind is what makes the optimistic check sound: a change's checks read
//! its names (one exists or not), its directories (one is empty) and the inodes it changes,
//! all written by the change itself, except a directory's move, whose check that it does
//! not go below itself reads every directory above its new parent. Those are touched too,
//! so two moves that together would make a cycle touch each other's directory and cannot
//! both be appended.
//!
//! A name in a directory has a key of its own ([`name_key`]), touched exclusively by the
//! change that adds, removes or reads it; the directory itself is touched *shared* by such
//! a change, whose effect on it (the entry, a [`Change::DirStamp`] of its times and link
//! count) commutes with another client's change of another name there. So clients making
//! different names in one directory are appended at once, while a change that reads or
//! sets the directory as a whole (`rmdir`'s emptiness, a `chmod`, a move of it) touches it
//! exclusively and is refused past any of theirs it has not seen.

use crate::meta::{Change, Ino, Kind, TableView};
use sha2::{Digest, Sha256};

/// The first key of names ([`name_key`]): far above any inode number the engine gives, far
/// below the servers' keys ([`server_key`]) and the rebuilder's role.
const NAME_KEYS: u64 = 1 << 62;

/// The key of name `name` in directory `dir`: a hash into `NAME_KEYS..NAME_KEYS + 2^61`, the
/// same on every client and build (SHA-256; two names that collide only refuse each other's
/// changes for nothing).
pub(super) fn name_key(dir: Ino, name: &[u8]) -> Ino {
    let mut h = Sha256::new();
    h.update(dir.to_le_bytes());
    h.update(name);
    let digest = h.finalize();
    let bits = u64::from_le_bytes(digest[..8].try_into().expect("8 bytes of 32"));
    NAME_KEYS | (bits & ((1 << 61) - 1))
}

/// What a change touches (each sorted, once, and no key in both).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Touched {
    /// Keys the change writes, or reads whole.
    pub(super) exclusive: Vec<Ino>,
    /// Directories it adds or removes a name in (see the module doc).
    pub(super) shared: Vec<Ino>,
    /// Of those, the ones whose turn it claims ([`Touched::claiming`]), touched whole.
    pub(super) claimed: Vec<Ino>,
    /// Of the shared ones, those whose turn this client held, its table caught up with
    /// them, when the change was sent ([`super::State::under_turn`]).
    pub(super) under_turn: Vec<Ino>,
}

impl Touched {
    /// `keys`, all touched exclusively.
    pub(super) fn exclusive(mut keys: Vec<Ino>) -> Touched {
        keys.sort_unstable();
        keys.dedup();
        Touched {
            exclusive: keys,
            ..Touched::default()
        }
    }

    /// The change claims the turns of `claim` (directories no other client worked in lately:
    /// [`super::State::claim_quiet_dirs`]): those it adds a name to are touched whole, since
    /// their holder answers for their names from its table (a lookup that finds nothing
    /// there does not catch up), so the engine must refuse the claim if another client added
    /// a name this table has not seen. A refusal there is still passed, not held
    /// ([`Touched::passes`]): the change runs again beside the others, claiming nothing.
    pub(super) fn claiming(&mut self, claim: &[Ino]) {
        for dir in claim {
            if let Ok(i) = self.shared.binary_search(dir) {
                self.shared.remove(i);
                self.exclusive.push(*dir);
                self.claimed.push(*dir);
            }
        }
        self.exclusive.sort_unstable();
    }

    /// Sorted, once each; a key touched both ways is touched exclusively.
    fn settled(mut self) -> Touched {
        self.exclusive.sort_unstable();
        self.exclusive.dedup();
        self.shared.sort_unstable();
        self.shared.dedup();
        let exclusive = &self.exclusive;
        self.shared.retain(|k| exclusive.binary_search(k).is_err());
        self
    }

    /// What this change and `other` touch together.
    pub(super) fn with(&self, other: &Touched) -> Touched {
        Touched {
            exclusive: [&self.exclusive[..], &other.exclusive].concat(),
            shared: [&self.shared[..], &other.shared].concat(),
            claimed: [&self.claimed[..], &other.claimed].concat(),
            under_turn: [&self.under_turn[..], &other.under_turn].concat(),
        }
        .settled()
    }

    /// Every key touched, either way.
    pub(super) fn all(&self) -> Vec<Ino> {
        let mut all = [&self.exclusive[..], &self.shared].concat();
        all.sort_unstable();
        all
    }

    /// Whether a refusal on `key` is passed rather than held: a directory this change
    /// touches shared, or would have but for its claim ([`crate::fs::Turns::pass`]).
    pub(super) fn passes(&self, key: Ino) -> bool {
        self.shared.binary_search(&key).is_ok() || self.claimed.contains(&key)
    }
}

/// The key a server's births are appended under ([`Change::Born`]): two clients that find a
/// server reborn at once append one birth, the other's is refused and caught up. Counted
/// down from below the rebuild role's key (`turns::REBUILD_ROLE`), far above any inode.
pub(super) fn server_key(server: u32) -> Ino {
    u64::MAX - 1 - u64::from(server)
}

/// The lowest of the servers' birth keys ([`server_key`]): the engine keeps their versions
/// when it trims the others (`MetaEngine::trim_versions`), since a conflict on one is taken
/// for the server's new birth ([`super::append`]), never for the floor of the versions.
pub(super) const BIRTH_KEYS: Ino = u64::MAX - crate::client::MAX_SERVERS as u64;

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

/// What `changes` touch, and the inodes whose turn the change claims (sorted, once each):
/// the files and directories it makes, which its maker usually writes or fills next (no
/// other client can know them before the change is appended).
pub(super) fn touched(changes: &[Change], table: &TableView<'_>) -> (Touched, Vec<Ino>) {
    touched_as(changes, table, Protocol::Real)
}

/// How [`touched_as`] names what a change touches: the protocol, or a mutant of it (the
/// model tests', which must be caught).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Protocol {
    Real,
    /// A move's check of the directories above its new parent goes unnamed.
    NoAncestors,
    /// Every inode is touched shared, even by a change that reads it whole (names are not).
    AllShared,
}

/// [`touched`], as `protocol` names it.
pub(super) fn touched_as(
    changes: &[Change],
    table: &TableView<'_>,
    protocol: Protocol,
) -> (Touched, Vec<Ino>) {
    let mut keys = Touched::default();
    let mut claim = Vec::new();
    for c in changes {
        match c {
            Change::Make { ino, kind, .. } => {
                keys.exclusive.push(*ino);
                if matches!(kind, Kind::File | Kind::Dir) {
                    claim.push(*ino);
                }
            }
            Change::Xattr { ino, .. } | Change::Extent { ino, .. } | Change::Drop { ino } => {
                keys.exclusive.push(*ino)
            }
            Change::Attrs { ino, .. } => keys.exclusive.push(*ino),
            Change::Entry { dir, name, .. } | Change::EntryAt { dir, name, .. } => {
                keys.exclusive.push(name_key(*dir, name));
                keys.shared.push(*dir);
            }
            Change::DirStamp { dir, .. } => keys.shared.push(*dir),
            Change::Cookies { dir, .. } => keys.exclusive.push(*dir),
            Change::Parent { dir, parent } => {
                keys.exclusive.push(*dir);
                if protocol != Protocol::NoAncestors {
                    keys.exclusive.extend(table.ancestors(*parent));
                }
            }
            Change::Born { server, .. } => keys.exclusive.push(server_key(*server)),
        }
    }
    if protocol == Protocol::AllShared {
        let (names, inodes) = keys.exclusive.iter().partition(|k| **k >= NAME_KEYS);
        keys.exclusive = names;
        keys.shared.extend::<Vec<Ino>>(inodes);
    }
    claim.sort_unstable();
    claim.dedup();
    (keys.settled(), claim)
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

/// A directory whose names `changes` add, remove or renumber (or drop), which a partial
/// table does not hold: such a change is never decided (a table that does not hold a
/// directory's names cannot check a name is free, or the directory empty). A change of its
/// attributes alone reads none.
pub(super) fn names_read_unloaded(changes: &[Change], table: &TableView<'_>) -> Option<Ino> {
    changes
        .iter()
        .filter_map(|c| match c {
            Change::Entry { dir, .. }
            | Change::EntryAt { dir, .. }
            | Change::Cookies { dir, .. } => Some(*dir),
            Change::Drop { ino } => Some(*ino),
            _ => None,
        })
        .find(|d| table.names_unloaded(*d))
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
