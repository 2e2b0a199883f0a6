//! The namespace as changes: what a volume's checkpoint holds, so that replaying it into an
//! empty table (then the journal after it) rebuilds the table.
//!
//! Why in two steps: the checkpoint takes the table's lock only to copy inodes and entries;
//! chunk maps are read after it is let go ([`Image::add_chunks`]), because a writer holds its
//! file's chunk map while it waits for the table to commit its chunk changes. A chunk map read
//! later than the table is newer, never older: the journal records after the checkpoint's
//! sequence number re-apply those changes as images, so the replay ends in the same place.

use super::batch::{Change, Seed};
use super::{Body, FileData, Ino, Inode, Meta, ROOT_INO};
use crate::sync::Arc;

/// A table's inodes and entries, and the files whose chunks are still to be read.
pub struct Image {
    pub changes: Vec<Change>,
    files: Vec<(Ino, Arc<FileData>)>,
    /// The number the next new inode takes.
    pub next_ino: Ino,
}

/// What a new inode of this body is seeded with (see [`Change::Make`]).
pub(super) fn seed_of(body: &Body) -> Seed {
    match body {
        Body::File(_) => Seed::File,
        Body::Dir(d) => Seed::Dir { parent: d.parent() },
        Body::Symlink(t) => Seed::Symlink(t.clone()),
        Body::Special => Seed::Special,
    }
}

impl Meta {
    /// Copies the table as changes (chunks excepted: [`Image::add_chunks`]).
    pub fn image(&self) -> Image {
        let mut inos: Vec<Ino> = self.inodes.keys().copied().collect();
        inos.sort_unstable();
        let mut changes = Vec::with_capacity(inos.len() * 2);
        let mut files = Vec::new();
        for &ino in &inos {
            let i: &Inode = &self.inodes[&ino];
            if ino == ROOT_INO {
                changes.push(Change::Attrs {
                    ino,
                    attrs: i.attrs,
                });
                for (name, value) in i.xattrs.iter().flat_map(|x| x.iter()) {
                    changes.push(Change::Xattr {
                        ino,
                        name: name.clone(),
                        value: Some(value.clone()),
                    });
                }
            } else {
                changes.push(Change::Make {
                    ino,
                    kind: i.kind,
                    attrs: i.attrs,
                    seed: seed_of(&i.body),
                    xattrs: i.xattrs.as_deref().cloned(),
                });
            }
            if let Some(f) = i.file() {
                files.push((ino, f.clone()));
            }
        }
        for &ino in &inos {
            if let Some(d) = self.inodes[&ino].dir() {
                for (cookie, name, child) in d.entries_after(0) {
                    changes.push(Change::EntryAt {
                        dir: ino,
                        name: name.into(),
                        ino: child,
                        cookie,
                    });
                }
                changes.push(Change::Cookies {
                    dir: ino,
                    next: d.next_cookie(),
                });
            }
        }
        Image {
            changes,
            files,
            next_ino: self.next_ino,
        }
    }

    /// The number the next new inode takes.
    pub fn next_ino(&self) -> Ino {
        self.next_ino
    }

    /// New inodes take numbers from `n` on at least (a replayed volume's: numbers are never
    /// reused, so file handles of removed files stay stale).
    pub fn number_from(&mut self, n: Ino) {
        self.next_ino = self.next_ino.max(n);
    }

    /// Inodes without a name (unlinked while open when the daemon died).
    pub fn orphans(&self) -> Vec<Ino> {
        self.inodes
            .iter()
            .filter(|(ino, i)| **ino != ROOT_INO && i.nlink == 0)
            .map(|(ino, _)| *ino)
            .collect()
    }
}

impl Image {
    /// Reads every file's chunk map (outside the table's lock) into the image.
    pub fn add_chunks(&mut self) {
        for (ino, f) in std::mem::take(&mut self.files) {
            let map = f.chunks.read();
            for (idx, c) in map.iter() {
                self.changes.push(Change::Extent {
                    ino,
                    idx: *idx,
                    chunk: Some(*c),
                });
            }
        }
    }
}
