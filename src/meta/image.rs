//! The namespace as changes: what a volume's checkpoint holds, so that replaying it into an
//! empty table (then the journal after it) rebuilds the table.
//!
//! Why in slices: a checkpoint of a million inodes must not stall operations, so it takes
//! the table's lock for one slice of inodes at a time ([`Meta::image_of`]), and reads chunk
//! maps with no table lock at all ([`Image::add_chunks`]; a writer holds its file's chunk map
//! while it waits for the table to commit its chunk changes). Every part is read later than
//! the sequence number the checkpoint covers, so it is newer, never older: the journal's
//! records after that number re-apply what changed meanwhile, as images, and the replay ends
//! where the table is.

use super::batch::{Change, Seed};
use super::{Body, FileData, Ino, Meta, ROOT_INO};
use crate::sync::Arc;

/// A table's inodes and entries, and the files whose chunks are still to be read.
#[derive(Default)]
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
    /// Every inode number in the table (a checkpoint then copies them a slice at a time,
    /// [`Meta::image_of`], letting operations run between slices).
    pub fn inode_numbers(&self) -> Vec<Ino> {
        self.inodes.keys().copied().collect()
    }

    /// Copies inodes `inos` (those still there) as changes, with their directories'
    /// entries at their cookies (chunks excepted: [`Image::add_chunks`]).
    ///
    /// Taken a slice at a time, the image is fuzzy: each slice is as of its own moment,
    /// every one later than the sequence number the checkpoint covers. Replaying the journal
    /// from that number over it ends where the table is, because records are images: a
    /// re-made inode's entries and chunks all come after its `Make`, an entry placed again
    /// lands at its journaled cookie, and the rest overwrites with the same values.
    pub fn image_of(&self, inos: &[Ino]) -> Image {
        let mut changes = Vec::with_capacity(inos.len() * 2);
        let mut files = Vec::new();
        for &ino in inos {
            let Some(i) = self.inodes.get(&ino) else {
                continue; // gone since the numbers were taken: the journal says so
            };
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
            if let Some(d) = i.dir() {
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

    /// The whole table as changes at once (tests; a checkpoint goes a slice at a time).
    pub fn image(&self) -> Image {
        let mut inos = self.inode_numbers();
        inos.sort_unstable();
        self.image_of(&inos)
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
    /// Appends a later slice (its next inode number is the newer).
    pub fn extend(&mut self, later: Image) {
        self.changes.extend(later.changes);
        self.files.extend(later.files);
        self.next_ino = self.next_ino.max(later.next_ino);
    }

    /// The regular files the image holds (an export reads their chunks itself).
    pub fn take_files(&mut self) -> Vec<(Ino, Arc<FileData>)> {
        std::mem::take(&mut self.files)
    }

    /// Reads every file's chunk map (outside the table's lock) into the image.
    pub fn add_chunks(&mut self) {
        for (ino, f) in std::mem::take(&mut self.files) {
            let map = f.chunks.read();
            for (idx, c) in map.iter() {
                self.changes.push(Change::Extent {
                    ino,
                    idx: *idx,
                    chunk: Some(c.clone()),
                });
            }
        }
    }
}
