//! Replaying committed [`Change`]s into a table: what a volume's journal does on re-attach,
//! and how the tests prove that every change goes through a batch (a table rebuilt from the
//! changes a journal saw matches the live one, see [`Meta::digest`]).

use super::batch::{Change, Seed};
use super::{Body, Dir, FileData, Ino, Inode, Meta};
use crate::error::{Error, Result};
use crate::sync::Arc;
use std::collections::BTreeMap;

/// Per inode: its kind and attributes, and its contents (see [`Meta::digest`]).
pub type Digest = BTreeMap<Ino, (String, String)>;

fn missing(what: &str, ino: Ino) -> Error {
    Error::new(
        libc::EIO,
        format!("journal replay: {what} of missing inode {ino}"),
    )
}

impl Meta {
    /// Applies one committed change (unlogged: it is already in the journal).
    pub fn apply(&mut self, change: &Change) -> Result<()> {
        match change {
            Change::Make {
                ino,
                kind,
                attrs,
                seed,
                xattrs,
            } => {
                let body = match seed {
                    Seed::File => Body::File(Arc::new(FileData::replayed())),
                    Seed::Dir { parent } => Body::Dir(Box::new(Dir::new(*parent))),
                    Seed::Symlink(t) => Body::Symlink(t.clone()),
                    Seed::Special => Body::Special,
                };
                let inode = Inode {
                    kind: *kind,
                    attrs: *attrs,
                    lookups: 0,
                    opens: 0,
                    body,
                    xattrs: xattrs.clone().map(Box::new),
                };
                self.place(*ino, inode);
            }
            Change::Attrs { ino, attrs } => {
                self.get_mut(*ino)
                    .ok_or_else(|| missing("attributes", *ino))?
                    .attrs = *attrs
            }
            Change::Entry { dir, name, ino } => {
                let d = self
                    .get_mut(*dir)
                    .and_then(Inode::dir_mut)
                    .ok_or_else(|| missing("an entry", *dir))?;
                match (d.get(name).is_some(), ino) {
                    (true, Some(i)) => d.replace(name, *i),
                    (false, Some(i)) => d.insert(name, *i),
                    (_, None) => {
                        d.remove(name);
                    }
                }
            }
            Change::Parent { dir, parent } => self
                .get_mut(*dir)
                .and_then(Inode::dir_mut)
                .ok_or_else(|| missing("the parent", *dir))?
                .set_parent(*parent),
            Change::Xattr { ino, name, value } => {
                let i = self
                    .get_mut(*ino)
                    .ok_or_else(|| missing("an attribute", *ino))?;
                let map = i.xattrs.get_or_insert_with(Default::default);
                match value {
                    Some(v) => {
                        map.insert(name.clone(), v.clone());
                    }
                    None => {
                        map.remove(name);
                    }
                }
                if map.is_empty() {
                    i.xattrs = None;
                }
            }
            Change::Extent { ino, idx, chunk } => {
                let f = self
                    .get(*ino)
                    .and_then(Inode::file)
                    .ok_or_else(|| missing("a chunk", *ino))?;
                f.chunks.write().apply(*idx, chunk.clone());
            }
            Change::Drop { ino } => {
                self.remove(*ino);
            }
            Change::EntryAt {
                dir,
                name,
                ino,
                cookie,
            } => {
                let d = self
                    .get_mut(*dir)
                    .and_then(Inode::dir_mut)
                    .ok_or_else(|| missing("an entry", *dir))?;
                d.remove(name);
                d.place(name, *ino, *cookie);
            }
            Change::Cookies { dir, next } => self
                .get_mut(*dir)
                .and_then(Inode::dir_mut)
                .ok_or_else(|| missing("the cookies", *dir))?
                .keep_cookies_from(*next),
            Change::DirStamp { dir, time, links } => {
                let d = self
                    .get_mut(*dir)
                    .filter(|i| i.dir().is_some())
                    .ok_or_else(|| missing("a directory's stamp", *dir))?;
                super::batch::stamp(&mut d.attrs, *time, *links);
            }
            // A table nothing else uses (a replay, a checkpoint's image): a live one forgets
            // the copies with no namespace lock held (`fs::follow`).
            Change::Born {
                server,
                birth,
                stale,
            } => {
                if self.born_forgets(*server, birth, *stale) {
                    for (_, f) in self.files() {
                        f.chunks.write().forget_server(*server);
                    }
                }
                self.set_birth(*server, birth);
            }
        }
        Ok(())
    }

    /// Every inode with a name (or the root), described for comparing two tables: its
    /// attributes, and its contents (entries, target, extended attributes, chunks). Takes
    /// each file's chunk lock: for a table nothing else uses (a replayed one); a live table
    /// goes through [`Meta::digest_without_chunks`] and reads the chunk maps after.
    pub fn digest(&self) -> Digest {
        let (mut out, files) = self.digest_without_chunks();
        add_chunks(&mut out, &files);
        out
    }

    /// [`Meta::digest`] with the files' chunk maps left out, and the files to read them from
    /// (with [`add_chunks`], once the table's lock is released: chunk locks come first).
    /// A table whose journal has each table place the names others add
    /// ([`super::Journal::commuting_dirs`]) leaves the places out ([`Meta::digest_of_names`]).
    pub fn digest_without_chunks(&self) -> (Digest, Vec<(Ino, Arc<FileData>)>) {
        self.digest_placed(!self.journal.commuting_dirs())
    }

    /// [`Meta::digest_without_chunks`] with each directory's entries by name, their
    /// `readdir` cookies left out: the tables of a shared volume's clients, each of which
    /// places the names others add ([`super::Journal::commuting_dirs`]), agree on this.
    pub fn digest_of_names(&self) -> Digest {
        self.digest_placed(false).0
    }

    /// [`Meta::digest`] with each directory's entries by name, as a shared volume's clients
    /// agree on it ([`Meta::digest_of_names`], chunks read): a table built from the engine's
    /// state against theirs. Takes each file's chunk lock, as [`Meta::digest`].
    pub fn digest_by_names(&self) -> Digest {
        let (mut out, files) = self.digest_placed(false);
        add_chunks(&mut out, &files);
        out
    }

    fn digest_placed(&self, places: bool) -> (Digest, Vec<(Ino, Arc<FileData>)>) {
        let mut out = BTreeMap::new();
        let mut files = Vec::new();
        for (ino, i) in &self.inodes {
            if i.nlink == 0 && *ino != super::ROOT_INO {
                continue;
            }
            // The overwrite mark is the journal's bookkeeping (attach takes it away), not
            // what the namespace holds.
            let attrs = super::Attrs {
                overwriting: false,
                ..i.attrs
            };
            let attrs = format!("{:?} {attrs:?}", i.kind);
            let body = match &i.body {
                Body::File(f) => {
                    files.push((*ino, f.clone()));
                    String::new()
                }
                Body::Dir(d) if places => format!(
                    "in {} {:?}",
                    d.parent(),
                    d.entries_after(0).collect::<Vec<_>>()
                ),
                Body::Dir(d) => {
                    let mut names: Vec<_> = d.entries_after(0).map(|(_, n, i)| (n, i)).collect();
                    names.sort_unstable();
                    format!("in {} {names:?}", d.parent())
                }
                Body::Symlink(t) => format!("-> {t:?}"),
                Body::Special => String::new(),
            };
            out.insert(*ino, (attrs, format!("{body} xattrs {:?}", i.xattrs)));
        }
        (out, files)
    }
}

/// Adds each file's chunks to its digest entry.
pub fn add_chunks(digest: &mut Digest, files: &[(Ino, Arc<FileData>)]) {
    for (ino, f) in files {
        if let Some((_, contents)) = digest.get_mut(ino) {
            *contents = format!("{}{contents}", chunks_of(f));
        }
    }
}

fn chunks_of(f: &FileData) -> String {
    format!("{:?}", f.chunks.read().iter().collect::<Vec<_>>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::{Chunk, Kind, Replica};

    fn copies(meta: &Meta, ino: Ino) -> Vec<u32> {
        let f = meta.get(ino).and_then(Inode::file).unwrap();
        let map = f.chunks.read();
        let c = map.get(&0).unwrap();
        c.replicas().iter().map(|r| r.server).collect()
    }

    #[test]
    fn a_new_birth_forgets_the_copies_there_and_the_same_one_nothing() {
        let mut meta = Meta::new(0o755, 0, 0);
        let mut b = meta.batch();
        let ino = b.make(Inode::new(
            Kind::File,
            0o644,
            0,
            0,
            Body::File(Default::default()),
        ));
        b.commit().unwrap();
        let on = |server| Replica {
            server,
            addr: 0x1000,
            rkey: 1,
        };
        let born = |birth: &[u8], stale| Change::Born {
            server: 1,
            birth: birth.into(),
            stale,
        };
        let chunk = Change::Extent {
            ino,
            idx: 0,
            chunk: Some(Chunk::with_replicas(4096, &[on(0), on(1)])),
        };
        meta.apply(&chunk).unwrap();
        // A first birth of a volume the server kept: its copies stay.
        meta.apply(&born(b"one", false)).unwrap();
        assert_eq!(copies(&meta, ino), [0, 1]);
        // The same birth again (two clients found it at once): nothing.
        meta.apply(&born(b"one", true)).unwrap();
        assert_eq!(copies(&meta, ino), [0, 1]);
        // Another birth: the copies there are forgotten, the others kept.
        meta.apply(&born(b"two", false)).unwrap();
        assert_eq!(copies(&meta, ino), [0]);
        assert_eq!(meta.birth(1), Some(&b"two"[..]));
        // A first birth whose claim had to make the volume again: stale.
        meta.apply(&Change::Born {
            server: 0,
            birth: (*b"zero").into(),
            stale: true,
        })
        .unwrap();
        assert_eq!(copies(&meta, ino), Vec::<u32>::new());
    }
}
