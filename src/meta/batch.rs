//! The one way the namespace changes: a [`Batch`] of typed [`Change`]s, one per operation.
//!
//! Why: a journal (volumes) must see every change to inodes, directory entries, chunk maps
//! and extended attributes, in one place, and replay them; a shared-metadata engine must be
//! able to implement the same calls. So `fs` never holds a `&mut Inode`: it opens a batch on
//! the table, makes its changes through the batch's methods (each fallible, each applied at
//! once so the operation reads its own writes), and commits. The commit hands the changes to
//! the [`super::Journal`] whole; if the journal refuses them, or the batch is dropped uncommitted
//! (an error part way through an operation), every change is undone, so an operation's
//! changes count whole or not at all.
//!
//! Chunk changes are the exception to undo: they record remote memory already allocated,
//! written or freed, so they are facts the batch carries to the journal, not intentions.
//! What the kernel holds (lookup counts, open handles) is the mount's session state, not
//! the namespace's, and is kept beside it (see [`super::Meta::hold`]).

use super::extents::{Chunk, ExtentChange, FileData};
use super::journal::{AfterRecord, UnsentWrite};
use super::{Attrs, Ino, Inode, Kind, Meta, Name, Xattrs};
use crate::error::{Error, Result};
use crate::sync::Arc;

/// What a new inode holds besides its attributes, as a journal records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seed {
    File,
    Dir { parent: Ino },
    Symlink(Box<[u8]>),
    Special,
}

/// One change to the namespace, enough to replay it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Inode `ino` is made.
    Make {
        ino: Ino,
        kind: Kind,
        attrs: Attrs,
        seed: Seed,
        xattrs: Option<Xattrs>,
    },
    /// Inode `ino`'s attributes are now `attrs`.
    Attrs { ino: Ino, attrs: Attrs },
    /// Name `name` in directory `dir` now leads to `ino` (none: the name is gone). A name
    /// that existed keeps its place (its `readdir` cookie).
    Entry {
        dir: Ino,
        name: Name,
        ino: Option<Ino>,
    },
    /// Directory `dir` now sits in `parent`.
    Parent { dir: Ino, parent: Ino },
    /// Extended attribute `name` of `ino` is now `value` (none: removed).
    Xattr {
        ino: Ino,
        name: Box<[u8]>,
        value: Option<Box<[u8]>>,
    },
    /// Chunk `idx` of file `ino` is now `chunk` (none: gone).
    Extent {
        ino: Ino,
        idx: u64,
        chunk: Option<Chunk>,
    },
    /// Inode `ino` is gone (no name, no handle, no reference), with its chunks.
    Drop { ino: Ino },
    /// Name `name` in directory `dir` leads to `ino` at `readdir` cookie `cookie` (a
    /// checkpoint's image keeps every entry's place).
    EntryAt {
        dir: Ino,
        name: Name,
        ino: Ino,
        cookie: u64,
    },
    /// Directory `dir` gives its next entry cookie `next` (a checkpoint's image: cookies are
    /// never reused, even those of entries gone since).
    Cookies { dir: Ino, next: u64 },
    /// Memory server `server` (by its place in the volume's order) holds the volume since
    /// its birth `birth` (a token the server made when it made the volume: a server that
    /// restarted empty has a new one). On a shared volume, where no one client sees every
    /// restart, this puts the restart at one place in the history: every copy listed on the
    /// server before it is forgotten there (when the birth is not the one the table knew,
    /// or none was known and `stale`), so no client ever reads another birth's memory; the
    /// copies listed after it were made in it.
    Born {
        server: u32,
        birth: Box<[u8]>,
        stale: bool,
    },
    /// Directory `dir` had a name added or removed at `time`, which moved its link count by
    /// `links` (a subdirectory made or moved in: 1; gone or moved out: -1). Its times become
    /// `time` unless later already, so stamps of different clients' changes, applied in any
    /// order, leave one result ([`stamp`]; see [`super::Journal::commuting_dirs`]).
    DirStamp {
        dir: Ino,
        time: std::time::SystemTime,
        links: i32,
    },
}

/// What a [`Change::DirStamp`] does to its directory's attributes: commutes with every other
/// stamp (the times only move forward, the link counts add).
pub(super) fn stamp(a: &mut Attrs, time: std::time::SystemTime, links: i32) {
    a.nlink = a.nlink.wrapping_add_signed(links);
    a.mtime = a.mtime.max(time);
    a.ctime = a.ctime.max(time);
}

/// How to take one change back.
enum Undo {
    Unmake(Ino),
    Attrs(Ino, Attrs),
    /// The entry led to `old` (an inode and its cookie) or was absent.
    Entry {
        dir: Ino,
        name: Name,
        old: Option<(Ino, u64)>,
    },
    Parent(Ino, Ino),
    Xattr(Ino, Box<[u8]>, Option<Box<[u8]>>),
    Restore(Ino, Box<Inode>),
}

/// One operation's changes to the namespace (see the module doc). Reads go through `Deref`
/// to the table; dropped uncommitted, the batch undoes its changes.
pub struct Batch<'m> {
    meta: &'m mut Meta,
    redo: Vec<Change>,
    undo: Vec<Undo>,
}

fn gone(ino: Ino) -> Error {
    Error::new(libc::ENOENT, format!("no inode {ino}"))
}

impl<'m> Batch<'m> {
    pub(super) fn new(meta: &'m mut Meta) -> Batch<'m> {
        Batch {
            meta,
            redo: Vec::new(),
            undo: Vec::new(),
        }
    }

    fn inode_mut(&mut self, ino: Ino) -> Result<&mut Inode> {
        self.meta.get_mut(ino).ok_or_else(|| gone(ino))
    }

    fn dir_mut(&mut self, dir: Ino) -> Result<&mut super::Dir> {
        self.inode_mut(dir)?
            .dir_mut()
            .ok_or_else(|| Error::new(libc::ENOTDIR, format!("inode {dir} is no directory")))
    }

    /// Adds `inode` to the table under a new number.
    pub fn make(&mut self, inode: Inode) -> Ino {
        let seed = super::image::seed_of(&inode.body);
        let change = (
            inode.kind,
            inode.attrs,
            seed,
            inode.xattrs.as_deref().cloned(),
        );
        let ino = self.meta.insert(inode);
        let (kind, attrs, seed, xattrs) = change;
        self.redo.push(Change::Make {
            ino,
            kind,
            attrs,
            seed,
            xattrs,
        });
        self.undo.push(Undo::Unmake(ino));
        ino
    }

    /// Changes `ino`'s attributes.
    pub fn update(&mut self, ino: Ino, change: impl FnOnce(&mut Attrs)) -> Result<()> {
        let i = self.inode_mut(ino)?;
        let old = i.attrs;
        change(&mut i.attrs);
        let attrs = i.attrs;
        if attrs != old {
            self.redo.push(Change::Attrs { ino, attrs });
            self.undo.push(Undo::Attrs(ino, old));
        }
        Ok(())
    }

    /// Sets the time of a change of `ino` (and of its contents, with `modified`) to now.
    pub fn touch(&mut self, ino: Ino, modified: bool) -> Result<()> {
        let now = super::now();
        self.update(ino, |a| {
            a.ctime = now;
            if modified {
                a.mtime = now;
            }
        })
    }

    /// A name was added to or removed from directory `dir`, which moved its link count by
    /// `links`: its times become now. Logged as a [`Change::DirStamp`] where the journal
    /// asks for commuting directory changes, else as its attributes.
    pub fn stamp_dir(&mut self, dir: Ino, links: i32) -> Result<()> {
        let now = super::now();
        if !self.meta.journal.commuting_dirs() {
            return self.update(dir, |a| {
                a.nlink = a.nlink.wrapping_add_signed(links);
                a.ctime = now;
                a.mtime = now;
            });
        }
        self.dir_mut(dir)?;
        let i = self.inode_mut(dir)?;
        let old = i.attrs;
        stamp(&mut i.attrs, now, links);
        self.redo.push(Change::DirStamp {
            dir,
            time: now,
            links,
        });
        self.undo.push(Undo::Attrs(dir, old));
        Ok(())
    }

    fn entry(&mut self, dir: Ino, name: &[u8], ino: Option<Ino>) -> Result<Option<Ino>> {
        let d = self.dir_mut(dir)?;
        let old = d.get(name);
        let cookie = d.cookie(name);
        let placed = match (old, ino) {
            (None, None) => return Ok(None),
            (None, Some(i)) => {
                d.insert(name, i);
                d.cookie(name)
            }
            (Some(_), Some(i)) => {
                d.replace(name, i);
                None
            }
            (Some(_), None) => {
                d.remove(name);
                None
            }
        };
        let name: Name = name.into();
        // A new entry is journaled with its cookie, so a replay over a checkpoint taken while
        // operations went on places it exactly where it was; in a log of commuting changes
        // each table places it (two clients would give one cookie to two names).
        let placed = placed.filter(|_| !self.meta.journal.commuting_dirs());
        self.redo.push(match (ino, placed) {
            (Some(ino), Some(cookie)) => Change::EntryAt {
                dir,
                name: name.clone(),
                ino,
                cookie,
            },
            _ => Change::Entry {
                dir,
                name: name.clone(),
                ino,
            },
        });
        self.undo.push(Undo::Entry {
            dir,
            name,
            old: old.zip(cookie),
        });
        Ok(old)
    }

    /// Adds entry `name` (which must not exist) to `dir`, leading to `ino`.
    pub fn insert_entry(&mut self, dir: Ino, name: &[u8], ino: Ino) -> Result<()> {
        if self.dir_mut(dir)?.get(name).is_some() {
            return Err(Error::new(libc::EEXIST, "the name exists"));
        }
        self.entry(dir, name, Some(ino)).map(|_| ())
    }

    /// Points entry `name` of `dir` (which must exist) at `ino`, keeping its place.
    pub fn replace_entry(&mut self, dir: Ino, name: &[u8], ino: Ino) -> Result<()> {
        if self.dir_mut(dir)?.get(name).is_none() {
            return Err(Error::new(libc::ENOENT, "no such name"));
        }
        self.entry(dir, name, Some(ino)).map(|_| ())
    }

    /// Removes entry `name` from `dir`; returns the inode it led to.
    pub fn remove_entry(&mut self, dir: Ino, name: &[u8]) -> Result<Option<Ino>> {
        self.entry(dir, name, None)
    }

    /// Records that directory `dir` now sits in `parent`.
    pub fn set_parent(&mut self, dir: Ino, parent: Ino) -> Result<()> {
        let d = self.dir_mut(dir)?;
        let old = d.parent();
        d.set_parent(parent);
        self.redo.push(Change::Parent { dir, parent });
        self.undo.push(Undo::Parent(dir, old));
        Ok(())
    }

    fn xattr(&mut self, ino: Ino, name: &[u8], value: Option<Box<[u8]>>) -> Result<()> {
        let i = self.inode_mut(ino)?;
        let old = match &value {
            Some(v) => i
                .xattrs
                .get_or_insert_with(Default::default)
                .insert(name.into(), v.clone()),
            None => {
                let old = i.xattrs.as_mut().and_then(|m| m.remove(name));
                if i.xattrs.as_ref().is_some_and(|m| m.is_empty()) {
                    i.xattrs = None;
                }
                old
            }
        };
        self.redo.push(Change::Xattr {
            ino,
            name: name.into(),
            value,
        });
        self.undo.push(Undo::Xattr(ino, name.into(), old));
        Ok(())
    }

    /// Sets extended attribute `name` of `ino`.
    pub fn set_xattr(&mut self, ino: Ino, name: &[u8], value: &[u8]) -> Result<()> {
        self.xattr(ino, name, Some(value.into()))
    }

    /// Removes extended attribute `name` of `ino`; false if it had none.
    pub fn remove_xattr(&mut self, ino: Ino, name: &[u8]) -> Result<bool> {
        let had = self
            .meta
            .get(ino)
            .ok_or_else(|| gone(ino))?
            .xattrs
            .as_ref()
            .is_some_and(|m| m.contains_key(name));
        if had {
            self.xattr(ino, name, None)?;
        }
        Ok(had)
    }

    /// Carries the chunk changes of file `ino` (taken from its map's log) into this batch.
    pub fn extents(&mut self, ino: Ino, log: Vec<ExtentChange>) {
        self.redo.extend(log.into_iter().map(|e| Change::Extent {
            ino,
            idx: e.idx,
            chunk: e.chunk,
        }));
    }

    /// Drops `ino` from the table if nothing refers to it any more (no name, no open handle,
    /// no kernel reference); true if it went.
    pub fn drop_if_unused(&mut self, ino: Ino) -> bool {
        let reaped = self.meta.reap(ino);
        self.dropped(ino, reaped).is_some()
    }

    /// Drops `ino` if no name and no handle hold it and it is no directory, though the kernel
    /// may still hold references to it (a shared volume's unlink: the kernel's FORGET then
    /// finds it gone). Its data, if it was a file that was dropped (`Some(None)`: dropped,
    /// no data).
    pub fn drop_unlinked(&mut self, ino: Ino) -> Option<Option<Arc<FileData>>> {
        let reaped = self.meta.reap_unlinked(ino);
        self.dropped(ino, reaped)
    }

    /// `reaped` (inode `ino`, taken out of the table) is dropped, undone by putting it back:
    /// its data, if it was a file.
    fn dropped(&mut self, ino: Ino, reaped: Option<Inode>) -> Option<Option<Arc<FileData>>> {
        let inode = reaped?;
        let file = inode.file().cloned();
        self.redo.push(Change::Drop { ino });
        self.undo.push(Undo::Restore(ino, Box::new(inode)));
        Some(file)
    }

    /// The changes so far.
    pub fn changes(&self) -> &[Change] {
        &self.redo
    }

    /// Hands the changes to the journal; if it refuses them they are undone and its error
    /// returned.
    pub fn commit(self) -> Result<()> {
        self.commit_as(None)
    }

    /// [`Batch::commit`] of a write's changes of file `ino`, `then` run once they are
    /// recorded (see [`super::Journal::record_write`]).
    /// `unsent`: see [`super::Journal::record_write`].
    pub fn commit_write(
        self,
        ino: Ino,
        then: AfterRecord,
        unsent: Option<UnsentWrite<'_>>,
    ) -> Result<()> {
        self.commit_as(Some((ino, then, unsent)))
    }

    fn commit_as(
        mut self,
        write_of: Option<(Ino, AfterRecord, Option<UnsentWrite<'_>>)>,
    ) -> Result<()> {
        if self.redo.is_empty() {
            if let Some((_, then, unsent)) = write_of {
                // Nothing recorded names it, and nothing will carry it: sent now.
                if let Some(u) = unsent {
                    (u.now)();
                }
                then();
            }
            return Ok(());
        }
        let redo = std::mem::take(&mut self.redo);
        let table = super::TableView {
            inodes: &self.meta.inodes,
            unloaded: self.meta.unloaded.as_ref(),
        };
        let recorded = match write_of {
            Some((ino, then, unsent)) => self
                .meta
                .journal
                .record_write(ino, &redo, &table, then, unsent),
            None => self.meta.journal.record(&redo, &table),
        };
        match recorded {
            Ok(()) => {
                self.undo.clear();
                self.meta.commits += 1;
                self.meta.changes += redo.len() as u64;
                Ok(())
            }
            Err(e) => Err(e), // dropping self undoes
        }
    }

    fn roll_back(&mut self) {
        while let Some(u) = self.undo.pop() {
            let m = &mut *self.meta;
            match u {
                Undo::Unmake(ino) => {
                    m.remove(ino);
                }
                Undo::Attrs(ino, a) => {
                    if let Some(i) = m.get_mut(ino) {
                        i.attrs = a;
                    }
                }
                Undo::Entry { dir, name, old } => {
                    if let Some(d) = m.get_mut(dir).and_then(Inode::dir_mut) {
                        match (d.get(&name).is_some(), old) {
                            (true, Some((o, _))) => d.replace(&name, o),
                            (false, Some((o, cookie))) => d.restore(&name, o, cookie),
                            (true, None) => {
                                d.remove(&name);
                            }
                            (false, None) => {}
                        }
                    }
                }
                Undo::Parent(dir, p) => {
                    if let Some(d) = m.get_mut(dir).and_then(Inode::dir_mut) {
                        d.set_parent(p);
                    }
                }
                Undo::Xattr(ino, name, old) => {
                    if let Some(i) = m.get_mut(ino) {
                        let map = i.xattrs.get_or_insert_with(Default::default);
                        match old {
                            Some(v) => {
                                map.insert(name, v);
                            }
                            None => {
                                map.remove(&name);
                            }
                        }
                        if map.is_empty() {
                            i.xattrs = None;
                        }
                    }
                }
                Undo::Restore(ino, inode) => m.restore(ino, *inode),
            }
        }
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        if !self.undo.is_empty() {
            self.roll_back();
        }
    }
}

impl std::ops::Deref for Batch<'_> {
    type Target = Meta;
    fn deref(&self) -> &Meta {
        self.meta
    }
}

impl std::ops::DerefMut for Batch<'_> {
    /// The table's own methods (kernel references) through the batch; its inodes stay
    /// reachable for change only through the batch's methods.
    fn deref_mut(&mut self) -> &mut Meta {
        self.meta
    }
}

#[cfg(test)]
mod tests;
