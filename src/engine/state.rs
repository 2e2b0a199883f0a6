//! The namespace's state in the engine, beside its log: hashes of the volume's inodes,
//! names and chunks, kept by each append as one step with it (shared format 7).
//!
//! Why: the log alone makes every client load the whole namespace before it serves (a
//! checkpoint, then the log after it). With the state beside it a client can read one
//! inode or one directory as of the log's head (JuiceFS's model), which a join bounded
//! in time, and memory by use, need. The engine does not read the changes: the client
//! turns each change into writes of named hashes ([`KeyOp`]), which the engine runs after
//! the append's checks, in the same step, so the state is always the log's at its head.
//! Which hash holds what is the shared volume's business (`volume::shared::state`).

use std::collections::BTreeMap;

/// Every hash of the state, by name (its key under the volume's prefix, `s:` first): each
/// field and its value.
pub type StateDump = BTreeMap<String, BTreeMap<Vec<u8>, Vec<u8>>>;

/// What every state hash's name starts with.
pub const STATE_PREFIX: &str = "s:";

/// The state's own facts, not the namespace's (`whole`: see
/// [`super::MetaEngine::state_whole`]); left out of [`StateDump`]s.
pub const INFO_HASH: &str = "s:info";

/// The state's layout, as [`super::MetaEngine::load_state`] reads it: a hash per inode
/// (`s:i:INO`: its make, attributes, a directory's parent and its names' stamps, extended
/// attributes, chunks: whatever the volume puts there), a hash per directory of its names
/// (`s:d:INO`: name to inode number), and the servers' births (`s:born`). One hash per
/// inode: a load reads each in one call.
pub const INODE: &str = "s:i:";
pub const NAMES: &str = "s:d:";
pub const BORN: &str = "s:born";

/// What [`super::MetaEngine::load_state`] read: the log's head, the state's parts as of
/// it, and the directories asked for whose names it did not read (more than it was allowed:
/// read a page at a time, [`super::MetaEngine::names_page`]).
#[derive(Debug, Default)]
pub struct StateLoad {
    pub head: u64,
    pub dump: StateDump,
    pub too_big: Vec<u64>,
}

/// A page of a directory's names ([`super::MetaEngine::names_page`]): each name and the
/// inode it leads to; where the next page starts (0: this was the last); and the log's
/// head, of one moment.
#[derive(Debug, Default)]
pub struct NamesPage {
    pub names: Vec<(Vec<u8>, u64)>,
    pub next: u64,
    pub head: u64,
}

/// What [`load`] reads of `state`: the names of `dirs` (those of at most `names_at_most`
/// names), each inode they name and each of `inodes` (its hash), and the servers' births
/// (the in-memory engine's [`super::MetaEngine::load_state`], and the reference for
/// Redis's); the directories left out.
pub fn load(
    state: &StateDump,
    dirs: &[u64],
    inodes: &[u64],
    names_at_most: u64,
) -> (StateDump, Vec<u64>) {
    let mut out = StateDump::new();
    let mut too_big = Vec::new();
    let mut inos: Vec<u64> = inodes.to_vec();
    for dir in dirs {
        let hash = format!("{NAMES}{dir}");
        if let Some(names) = state.get(&hash) {
            if names.len() as u64 > names_at_most {
                too_big.push(*dir);
                continue;
            }
            for child in names.values() {
                if let Some(ino) = std::str::from_utf8(child).ok().and_then(|s| s.parse().ok()) {
                    inos.push(ino);
                }
            }
            out.insert(hash, names.clone());
        }
    }
    for ino in inos {
        let hash = format!("{INODE}{ino}");
        if let Some(h) = state.get(&hash) {
            out.insert(hash, h.clone());
        }
    }
    if let Some(born) = state.get(BORN) {
        out.insert(BORN.to_string(), born.clone());
    }
    (out, too_big)
}

/// Up to `count` of directory `dir`'s names in `state` from the `cursor`th (in the names'
/// order), and the cursor of the next page (0: none).
pub fn names_page(
    state: &StateDump,
    dir: u64,
    cursor: u64,
    count: u64,
) -> (Vec<(Vec<u8>, u64)>, u64) {
    let Some(names) = state.get(&format!("{NAMES}{dir}")) else {
        return (Vec::new(), 0);
    };
    let page: Vec<(Vec<u8>, u64)> = names
        .iter()
        .skip(cursor as usize)
        .take(count.max(1) as usize)
        .filter_map(|(name, child)| {
            let ino = std::str::from_utf8(child).ok()?.parse().ok()?;
            Some((name.clone(), ino))
        })
        .collect();
    let end = cursor + count.max(1);
    (page, if end < names.len() as u64 { end } else { 0 })
}

/// The inodes `state` holds (the names of its inode hashes).
pub fn inodes(state: &StateDump) -> Vec<u64> {
    state
        .keys()
        .filter_map(|k| k.strip_prefix(INODE)?.parse().ok())
        .collect()
}

/// One write to a state hash (`hash`: its name, [`STATE_PREFIX`] first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyOp {
    /// `field` is `value`.
    Put {
        hash: String,
        field: Vec<u8>,
        value: Vec<u8>,
    },
    /// `field` is the change's LSN, a space, then `value`: a value whose place in the
    /// history matters (a chunk's copies, which a later birth of their server forgets).
    PutPlaced {
        hash: String,
        field: Vec<u8>,
        value: Vec<u8>,
    },
    /// The field named by the change's LSN, a colon and `field` is `value` (a history: a
    /// server's births, by place and server).
    PutAtPlace {
        hash: String,
        field: Vec<u8>,
        value: Vec<u8>,
    },
    /// `field` is gone.
    Remove { hash: String, field: Vec<u8> },
    /// The whole hash is gone.
    Clear { hash: String },
    /// `field`, a signed count, has `by` added (gone when it reaches 0): commutes with every
    /// other add, as a directory's link count moved by names of different clients.
    Add {
        hash: String,
        field: Vec<u8>,
        by: i64,
    },
    /// `field`, a time (`SECS NANOS`), becomes `(secs, nanos)` unless later already.
    Later {
        hash: String,
        field: Vec<u8>,
        secs: u64,
        nanos: u32,
    },
}

/// A time as [`KeyOp::Later`] keeps it.
pub fn time_value(secs: u64, nanos: u32) -> Vec<u8> {
    format!("{secs} {nanos}").into_bytes()
}

/// A time [`KeyOp::Later`] kept.
pub fn parse_time(value: &[u8]) -> Option<(u64, u32)> {
    let (s, n) = std::str::from_utf8(value).ok()?.split_once(' ')?;
    Some((s.parse().ok()?, n.parse().ok()?))
}

/// Runs `ops` of the change at `lsn` on `state`, as the Redis engine's script does (the
/// in-memory engine's state, and a reference for tests).
pub fn apply(state: &mut StateDump, lsn: u64, ops: &[KeyOp]) {
    for op in ops {
        match op {
            KeyOp::Put { hash, field, value } => {
                state
                    .entry(hash.clone())
                    .or_default()
                    .insert(field.clone(), value.clone());
            }
            KeyOp::PutPlaced { hash, field, value } => {
                let mut v = format!("{lsn} ").into_bytes();
                v.extend_from_slice(value);
                state
                    .entry(hash.clone())
                    .or_default()
                    .insert(field.clone(), v);
            }
            KeyOp::PutAtPlace { hash, field, value } => {
                let mut f = format!("{lsn}:").into_bytes();
                f.extend_from_slice(field);
                state
                    .entry(hash.clone())
                    .or_default()
                    .insert(f, value.clone());
            }
            KeyOp::Remove { hash, field } => {
                if let Some(h) = state.get_mut(hash) {
                    h.remove(field);
                    if h.is_empty() {
                        state.remove(hash);
                    }
                }
            }
            KeyOp::Clear { hash } => {
                state.remove(hash);
            }
            KeyOp::Add { hash, field, by } => {
                let h = state.entry(hash.clone()).or_default();
                let now = h
                    .get(field)
                    .and_then(|v| std::str::from_utf8(v).ok()?.parse::<i64>().ok())
                    .unwrap_or(0)
                    + by;
                if now == 0 {
                    h.remove(field);
                } else {
                    h.insert(field.clone(), now.to_string().into_bytes());
                }
                if h.is_empty() {
                    state.remove(hash);
                }
            }
            KeyOp::Later {
                hash,
                field,
                secs,
                nanos,
            } => {
                let h = state.entry(hash.clone()).or_default();
                let cur = h.get(field).and_then(|v| parse_time(v));
                if cur.is_none_or(|c| c < (*secs, *nanos)) {
                    h.insert(field.clone(), time_value(*secs, *nanos));
                }
            }
        }
    }
}
