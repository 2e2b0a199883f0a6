//! The namespace's state beside the engine's log (shared format 7, [`crate::engine::state`]):
//! which hash holds what, each change as writes of them (sent with its append, run by the
//! engine in the same step), and the changes that build a table from them.
//!
//! Why: a client that can read one inode or one directory as of the log's head need not load
//! the whole namespace to serve (JuiceFS's model; see doc/VOLUMES.md). The hashes are
//! images, as the log's records are: a change's writes overwrite what it changes, except
//! where two clients' changes commute (names added to one directory at once: its link
//! count is a sum, its times a maximum, [`Change::DirStamp`]), which the engine adds up.
//! A copy of a chunk keeps the LSN of the change that listed it, and a server's births
//! theirs, so a table built from the state forgets what a birth forgot, in the log's order.

use super::*;
use crate::engine::{KeyOp, StateDump};
use crate::meta::{Digest, Loaded};
use std::time::SystemTime;

// Which hash holds what (the engine's layout, `crate::engine::state`): an inode's hash
// holds its `Make` (its extended attributes apart) under `m`, its last `Attrs` under `a`
// (none: the `Make`'s), a directory's parent since a move under `p` (none: its `Make`'s),
// the links its names' stamps moved and their latest time since its attributes were set
// under `l` and `t`, each extended attribute under `x:NAME` and each chunk under `c:INDEX`
// (`LSN record`); a directory's names hash, name to inode; the births, LSN to birth.
use crate::engine::state::{BORN, INODE, NAMES};
const MADE: &[u8] = b"m";
const ATTRS: &[u8] = b"a";
const PARENT: &[u8] = b"p";
const LINKS: &[u8] = b"l";
const STAMPED: &[u8] = b"t";
const XATTR: &[u8] = b"x:";
const CHUNK: &[u8] = b"c:";

fn field(prefix: &[u8], rest: &[u8]) -> Vec<u8> {
    [prefix, rest].concat()
}

/// Inodes a table's image is written in at a time ([`State::make_state_whole`]).
const IMAGE_SLICE: usize = 1_000;

/// Images written before the state is left not whole for the next client that joins (each
/// refused because another client changed the volume meanwhile).
const IMAGE_TRIES: usize = 5;

fn hash_of(prefix: &str, ino: Ino) -> String {
    format!("{prefix}{ino}")
}

fn number(n: u64) -> Vec<u8> {
    n.to_string().into_bytes()
}

/// The state's writes of `changes`. An `image` (a whole table's, [`State::make_state_whole`])
/// also clears what each inode it makes held: what an earlier image left, which the changes
/// since did not all overwrite.
pub(super) fn ops_of(changes: &[Change], image: bool) -> Vec<KeyOp> {
    let mut ops = Vec::with_capacity(changes.len() * 2);
    let put = |hash: String, field: Vec<u8>, value: Vec<u8>| KeyOp::Put { hash, field, value };
    let remove = |hash: String, field: Vec<u8>| KeyOp::Remove { hash, field };
    let clear = |hash: String| KeyOp::Clear { hash };
    for c in changes {
        match c {
            Change::Make {
                ino,
                kind,
                attrs,
                seed,
                xattrs,
            } => {
                let made = Change::Make {
                    ino: *ino,
                    kind: *kind,
                    attrs: *attrs,
                    seed: seed.clone(),
                    xattrs: None,
                };
                if image {
                    ops.push(clear(hash_of(INODE, *ino)));
                    ops.push(clear(hash_of(NAMES, *ino)));
                }
                let hash = hash_of(INODE, *ino);
                ops.push(put(hash.clone(), MADE.to_vec(), record::encode(0, &[made])));
                for (name, value) in xattrs.iter().flatten() {
                    ops.push(put(hash.clone(), field(XATTR, name), value.to_vec()));
                }
            }
            Change::Attrs { ino, .. } => {
                let hash = hash_of(INODE, *ino);
                let one = record::encode(0, std::slice::from_ref(c));
                ops.push(put(hash.clone(), ATTRS.to_vec(), one));
                ops.push(remove(hash.clone(), LINKS.to_vec()));
                ops.push(remove(hash, STAMPED.to_vec()));
            }
            Change::Entry {
                dir,
                name,
                ino: Some(ino),
            }
            | Change::EntryAt { dir, name, ino, .. } => {
                ops.push(put(hash_of(NAMES, *dir), name.to_vec(), number(*ino)));
            }
            Change::Entry {
                dir,
                name,
                ino: None,
            } => ops.push(remove(hash_of(NAMES, *dir), name.to_vec())),
            Change::Parent { dir, parent } => {
                ops.push(put(hash_of(INODE, *dir), PARENT.to_vec(), number(*parent)));
            }
            Change::Xattr { ino, name, value } => {
                let (hash, f) = (hash_of(INODE, *ino), field(XATTR, name));
                ops.push(match value {
                    Some(v) => put(hash, f, v.to_vec()),
                    None => remove(hash, f),
                });
            }
            Change::Extent { ino, idx, chunk } => {
                let (hash, f) = (hash_of(INODE, *ino), field(CHUNK, &number(*idx)));
                ops.push(match chunk {
                    Some(_) => KeyOp::PutPlaced {
                        hash,
                        field: f,
                        value: record::encode(0, std::slice::from_ref(c)),
                    },
                    None => remove(hash, f),
                });
            }
            Change::Drop { ino } => {
                ops.push(clear(hash_of(INODE, *ino)));
                ops.push(clear(hash_of(NAMES, *ino)));
            }
            // Each table places the names it holds.
            Change::Cookies { .. } => {}
            // By place and server: an image's births all have its one place.
            Change::Born { server, .. } => ops.push(KeyOp::PutAtPlace {
                hash: BORN.to_string(),
                field: number(u64::from(*server)),
                value: record::encode(0, std::slice::from_ref(c)),
            }),
            Change::DirStamp { dir, time, links } => {
                let hash = hash_of(INODE, *dir);
                if *links != 0 {
                    ops.push(KeyOp::Add {
                        hash: hash.clone(),
                        field: LINKS.to_vec(),
                        by: i64::from(*links),
                    });
                }
                let since = time
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap_or_default();
                ops.push(KeyOp::Later {
                    hash,
                    field: STAMPED.to_vec(),
                    secs: since.as_secs(),
                    nanos: since.subsec_nanos(),
                });
            }
        }
    }
    ops
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::new(libc::EIO, format!("the engine's state: {what}"))
}

fn parse_number<T: std::str::FromStr>(bytes: &[u8], what: &str) -> Result<T> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(format!("{what} '{}'", String::from_utf8_lossy(bytes))))
}

/// The one change a state value's record holds.
fn recorded(bytes: &[u8]) -> Result<Vec<Change>> {
    catchup::entry_changes(0, bytes)
}

/// What `state` holds, as changes ([`Loaded`]): inodes first, then their attributes,
/// parents, extended attributes, names and stamps; apart, chunks and servers' births with
/// their LSNs, in the log's order (a birth forgets the copies listed on its server before
/// it).
pub(super) fn changes_of(state: &StateDump) -> Result<Loaded> {
    let (mut made, mut attrs, mut rest, mut stamps) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut placed: Vec<(u64, u8, Change)> = Vec::new();
    for (name, fields) in state {
        if let Some(ino) = name.strip_prefix(INODE) {
            let ino: Ino = parse_number(ino.as_bytes(), "an inode")?;
            let (mut links, mut time) = (None, None);
            for (f, v) in fields {
                match f.as_slice() {
                    MADE => made.extend(recorded(v)?),
                    ATTRS => attrs.extend(recorded(v)?),
                    PARENT => rest.push(Change::Parent {
                        dir: ino,
                        parent: parse_number(v, "a parent")?,
                    }),
                    LINKS => links = Some(parse_number::<i32>(v, "a link count")?),
                    STAMPED => {
                        let (secs, nanos) =
                            crate::engine::state::parse_time(v).ok_or_else(|| {
                                bad(format!("a stamp '{}'", String::from_utf8_lossy(v)))
                            })?;
                        time = Some(SystemTime::UNIX_EPOCH + Duration::new(secs, nanos));
                    }
                    f if f.starts_with(XATTR) => rest.push(Change::Xattr {
                        ino,
                        name: f[XATTR.len()..].into(),
                        value: Some(v.as_slice().into()),
                    }),
                    f if f.starts_with(CHUNK) => {
                        let (lsn, record) = split_place(v)?;
                        for c in recorded(record)? {
                            placed.push((lsn, 1, c));
                        }
                    }
                    f => {
                        return Err(bad(format!(
                            "inode {ino}'s field '{}'",
                            String::from_utf8_lossy(f)
                        )))
                    }
                }
            }
            if links.is_some() || time.is_some() {
                stamps.push(Change::DirStamp {
                    dir: ino,
                    time: time.unwrap_or(SystemTime::UNIX_EPOCH),
                    links: links.unwrap_or(0),
                });
            }
        } else if let Some(dir) = name.strip_prefix(NAMES) {
            let dir: Ino = parse_number(dir.as_bytes(), "a directory")?;
            for (n, child) in fields {
                rest.push(Change::Entry {
                    dir,
                    name: n.as_slice().into(),
                    ino: Some(parse_number(child, "an entry's inode")?),
                });
            }
        } else if name == BORN {
            for (place, record) in fields {
                let lsn = place.split(|b| *b == b':').next().unwrap_or_default();
                for c in recorded(record)? {
                    placed.push((parse_number(lsn, "a birth's place")?, 0, c));
                }
            }
        } else {
            return Err(bad(format!("a hash '{name}' of no known kind")));
        }
    }
    // A birth before a copy at one place: an image's births come first.
    placed.sort_by_key(|(lsn, order, _)| (*lsn, *order));
    made.extend(attrs);
    made.extend(rest);
    made.extend(stamps);
    Ok(Loaded {
        changes: made,
        placed: placed.into_iter().map(|(lsn, _, c)| (lsn, c)).collect(),
    })
}

/// A placed value's LSN and record (`LSN record`).
fn split_place(value: &[u8]) -> Result<(u64, &[u8])> {
    let space = value
        .iter()
        .position(|b| *b == b' ')
        .ok_or_else(|| bad("a placed value without its place"))?;
    Ok((
        parse_number(&value[..space], "a place")?,
        &value[space + 1..],
    ))
}

impl State {
    /// Writes this client's table, as of its last applied change, to the engine's state
    /// unless the state is whole already (a volume upgraded from format 6, or one whose
    /// upgrading client stopped before it was done): at join, before this client changes
    /// anything. Each part is written only while the log's head is that change: a change
    /// of another client meanwhile (whose writes land on a state this image had not
    /// finished) has the image written again, from the table caught up, over what is
    /// there. After [`IMAGE_TRIES`] the state is left not whole (nothing reads it as whole
    /// then) for the next client that joins.
    pub(super) fn make_state_whole(&self, fs: &Fs) -> Result<()> {
        for _ in 0..IMAGE_TRIES {
            if self.engine.state_whole().map_err(engine_err)? {
                return Ok(());
            }
            let at = self.applied.load(Ordering::SeqCst);
            if self.write_image(fs, at)? {
                log::info!("shared volume: the engine's state written whole, as of change {at}");
                return Ok(());
            }
            self.catch_up(fs, false)?;
        }
        log::warn!(
            "shared volume: the engine's state is not whole (other clients kept changing the \
             volume while its image was written); the next client to join writes it"
        );
        Ok(())
    }

    /// Writes the table's image as of change `at`, a slice of inodes at a time; false if
    /// the log's head moved past `at` meanwhile.
    fn write_image(&self, fs: &Fs, at: u64) -> Result<bool> {
        let (mut inos, births) = fs.inspect_meta(|m| (m.inode_numbers(), m.births()));
        inos.sort_unstable();
        let mut slices: Vec<&[Ino]> = inos.chunks(IMAGE_SLICE).collect();
        if slices.is_empty() {
            slices.push(&[]);
        }
        let last = slices.len() - 1;
        for (i, slice) in slices.into_iter().enumerate() {
            let mut image = fs.inspect_meta(|m| m.image_of(slice));
            image.add_chunks();
            let mut changes = if i == 0 { births.clone() } else { Vec::new() };
            changes.extend(image.changes);
            let ops = ops_of(&changes, true);
            if !self
                .engine
                .put_state(at, &ops, i == last)
                .map_err(engine_err)?
            {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The digest ([`Meta::digest_by_names`]) of the table the engine's state holds.
    pub(super) fn state_digest(&self) -> Result<Digest> {
        let dump = self.engine.state().map_err(engine_err)?;
        let mut meta = Meta::new_shared(0o755, self.config.root_uid, self.config.root_gid);
        let loaded = changes_of(&dump)?;
        for c in loaded
            .changes
            .iter()
            .chain(loaded.placed.iter().map(|(_, c)| c))
        {
            meta.apply(c).map_err(|e| bad(e.message))?;
        }
        Ok(meta.digest_by_names())
    }
}
