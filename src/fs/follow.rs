//! A follower's file system (`mount --volume NAME --read-only`): read-only, its namespace
//! changed only by what the volume's holder committed, read from the holder's journal
//! ([`crate::volume::follow`]), and the kernel told what to forget.
//!
//! Why apart from [`Meta::apply`] alone: a live file system has readers. A read holds its
//! file's chunk map across the remote I/O and then takes the namespace lock, so chunk locks
//! come first. Applying under the namespace lock, a change to a chunk map would wait for a
//! read that waits for that lock. So changes to files the table already has are applied to
//! their maps first, with no namespace lock (each waits only for the reads of its file that
//! use the old chunks, which finish before the follower says it has applied the record: the
//! holder frees memory only then); then the rest under the namespace lock, where a file made
//! in the same records is nobody else's yet.

use super::Fs;
use crate::error::Result;
use crate::meta::{Applicable, Change, FileData, Ino, Loaded, Meta, Name};
use crate::sync::Arc;
use std::collections::{HashMap, HashSet};

/// What the kernel must forget after a change it did not make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalidation {
    /// The inode's attributes and cached pages.
    Inode(Ino),
    /// Name `name` in directory `dir` (a lookup the kernel cached).
    Entry { dir: Ino, name: Name },
}

/// Sends invalidations to the kernel (the FUSE adapter's).
pub type Invalidate = Box<dyn Fn(&[Invalidation]) + Send + Sync>;

impl Fs {
    /// Sets where a follower's invalidations go (once; later calls are ignored).
    pub fn on_followed(&self, tell: Invalidate) {
        let _ = self.invalidate.set(tell);
    }

    /// Tells the kernel what to forget (see [`Fs::apply_followed`]). Never from inside a
    /// request: the kernel's invalidation of a name waits for its directory's lock, which the
    /// request's caller may hold until it is answered.
    pub fn tell_followed(&self, what: &[Invalidation]) {
        if let (Some(tell), false) = (self.invalidate.get(), what.is_empty()) {
            tell(what);
        }
    }

    /// Tells the kernel to forget inode `ino`'s attributes and cached pages now: a shared
    /// volume's open so sees what other clients closed before. Only where no request that
    /// may hold the file's page locks (a write) waits for what the caller holds: an OPEN
    /// without the writeback cache, after the door.
    pub fn forget_cached_inode(&self, ino: Ino) {
        self.tell_followed(&[Invalidation::Inode(ino)]);
    }

    /// Applies records the holder committed (in order), and tells the kernel what changed.
    /// Returns the invalidations sent. Sent with no lock held: the kernel's invalidation
    /// may wait for requests in flight, which may wait for these locks.
    pub fn apply_followed(&self, records: &[(u64, Vec<Change>)]) -> Result<Vec<Invalidation>> {
        let out = self.apply_followed_quietly(records)?;
        self.tell_followed(&out);
        Ok(out)
    }

    /// As [`Fs::apply_followed`], without telling the kernel: what it must forget is returned
    /// (a change applied inside a request, whose invalidations go out after it).
    pub fn apply_followed_quietly(
        &self,
        records: &[(u64, Vec<Change>)],
    ) -> Result<Vec<Invalidation>> {
        let Applicable {
            changes,
            unheld_names,
        } = self.meta.lock().held_of(records);
        // Names the table no longer holds may still be in the kernel's cache.
        let mut out: Vec<Invalidation> = unheld_names
            .into_iter()
            .map(|(dir, name)| Invalidation::Entry {
                dir,
                name: name.clone(),
            })
            .collect();
        // A server's birth changes every file's map: applied between the changes before it
        // and those after, each part as a whole.
        for part in changes.split_inclusive(|c| matches!(c, Change::Born { .. })) {
            match part.split_last() {
                Some((
                    Change::Born {
                        server,
                        birth,
                        stale,
                    },
                    before,
                )) => {
                    out.extend(self.apply_changes(before)?);
                    self.apply_birth(*server, birth, *stale);
                }
                _ => out.extend(self.apply_changes(part)?),
            }
        }
        Ok(out)
    }

    /// [`Change::Born`] on a live table: the copies on the server are forgotten file by
    /// file with no namespace lock (as a chunk change is, see the module doc), then the
    /// birth is noted.
    fn apply_birth(&self, server: u32, birth: &[u8], stale: bool) {
        let files: Vec<Arc<FileData>> = {
            let meta = self.meta.lock();
            match meta.born_forgets(server, birth, stale) {
                true => meta.files().map(|(_, f)| f.clone()).collect(),
                false => Vec::new(),
            }
        };
        for f in &files {
            self.data().forget_followed(f, server);
        }
        self.meta.lock().set_birth(server, birth);
    }

    /// Applies `changes` (no birth among them), as [`Fs::apply_followed_quietly`].
    fn apply_changes(&self, changes: &[&Change]) -> Result<Vec<Invalidation>> {
        if changes.is_empty() {
            return Ok(Vec::new());
        }
        // The files the table has now, for the changes to their maps.
        let existing: HashMap<Ino, Arc<FileData>> = {
            let meta = self.meta.lock();
            changes
                .iter()
                .filter_map(|c| match c {
                    Change::Extent { ino, .. } | Change::Drop { ino } => Some(*ino),
                    _ => None,
                })
                .filter_map(|ino| Some((ino, meta.get(ino)?.file()?.clone())))
                .collect()
        };
        // Files made (again) in these records: their maps are applied with the namespace.
        let mut made: HashSet<Ino> = HashSet::new();
        let mut late = Vec::with_capacity(changes.len());
        for c in changes {
            match c {
                Change::Make { ino, .. } => {
                    made.insert(*ino);
                    late.push(*c);
                }
                Change::Extent { ino, idx, chunk } if !made.contains(ino) => {
                    if let Some(f) = existing.get(ino) {
                        self.data().apply_followed(f, *idx, chunk.clone());
                    }
                }
                Change::Drop { ino } => {
                    if let Some(f) = existing.get(ino).filter(|_| !made.contains(ino)) {
                        // Reads of it still running finish first; later ones find nothing.
                        self.data().forget_map(f);
                    }
                    late.push(*c);
                }
                _ => late.push(*c),
            }
        }
        let mut out = Vec::new();
        {
            let mut meta = self.meta.lock();
            for c in late {
                if let Change::Extent { ino, .. } = c {
                    if meta.get(*ino).is_none() {
                        continue;
                    }
                }
                meta.apply(c)?;
            }
        }
        let mut seen: HashSet<Ino> = HashSet::new();
        for c in changes {
            match c {
                Change::Attrs { ino, .. }
                | Change::Extent { ino, .. }
                | Change::Xattr { ino, .. }
                | Change::Drop { ino }
                | Change::Parent { dir: ino, .. }
                | Change::DirStamp { dir: ino, .. } => {
                    if seen.insert(*ino) {
                        out.push(Invalidation::Inode(*ino));
                    }
                }
                Change::Entry { dir, name, .. } | Change::EntryAt { dir, name, .. } => {
                    out.push(Invalidation::Entry {
                        dir: *dir,
                        name: name.clone(),
                    })
                }
                // The file's bytes are the same on its other copies.
                Change::Make { .. } | Change::Cookies { .. } | Change::Born { .. } => {}
            }
        }
        Ok(out)
    }

    /// Installs what a shared client loaded into its partial table (see
    /// [`Meta::install`]); nothing once the table is whole (a checkpoint replaced it).
    pub fn install_loaded(&self, dirs: &[Ino], fresh: &[Ino], loaded: Loaded) -> Result<()> {
        let mut meta = self.meta.lock();
        match meta.is_partial() {
            true => meta.install(dirs, fresh, loaded),
            false => Ok(()),
        }
    }

    /// Forgets what a partial table holds below the directories the kernel let go of, but
    /// what `kept` holds ([`Meta::forget_let_go`]); how many inodes went.
    pub fn forget_let_go(&self, kept: &dyn Fn(Ino) -> bool) -> usize {
        let gone = self.meta.lock().forget_let_go(kept);
        gone.len()
    }

    /// A partial table that holds every directory's names is whole from now on (see
    /// [`Meta::finish_partial`]); whether the table is whole.
    pub fn finish_partial(&self) -> bool {
        self.meta.lock().finish_partial()
    }

    /// Replaces the whole namespace with `fresh` (a follower that fell behind the ring
    /// reloads the checkpoint), keeping what the kernel holds, and tells the kernel what
    /// differs. Returns the invalidations sent.
    pub fn replace_followed(&self, fresh: Meta) -> Vec<Invalidation> {
        let out = self.replace_followed_quietly(fresh);
        self.tell_followed(&out);
        out
    }

    /// As [`Fs::replace_followed`], without telling the kernel (what it must forget is
    /// returned).
    pub fn replace_followed_quietly(&self, fresh: Meta) -> Vec<Invalidation> {
        self.replace_followed_quietly_then(fresh, || ())
    }

    /// As [`Fs::replace_followed_quietly`], running `swapped` under the table's lock once
    /// the table is replaced (no change is made between: a shared client forgets then what
    /// its own changes added to the old table).
    pub fn replace_followed_quietly_then(
        &self,
        mut fresh: Meta,
        swapped: impl FnOnce(),
    ) -> Vec<Invalidation> {
        let (out, old_files) = {
            let mut meta = self.meta.lock();
            fresh.carry_refs(&meta);
            fresh.carry_journal(&mut meta);
            let out = differences(&meta, &fresh);
            let old = std::mem::replace(&mut *meta, fresh);
            swapped();
            let files: Vec<Arc<FileData>> = old.files().map(|(_, f)| f.clone()).collect();
            (out, files)
        };
        // Reads still using the old maps finish first; later ones use the new table.
        for f in old_files {
            self.data().forget_map(&f);
        }
        out
    }
}

/// What differs between two tables: inodes whose attributes, kind or presence changed, and
/// names that lead elsewhere (or nowhere) now.
fn differences(old: &Meta, new: &Meta) -> Vec<Invalidation> {
    let mut out = Vec::new();
    let inos: HashSet<Ino> = old.inos().chain(new.inos()).collect();
    for ino in inos {
        let (a, b) = (old.get(ino), new.get(ino));
        let same = match (a, b) {
            (Some(a), Some(b)) => a.kind == b.kind && a.attrs == b.attrs,
            _ => false,
        };
        if !same {
            out.push(Invalidation::Inode(ino));
        }
        let names = |i: Option<&crate::meta::Inode>| -> HashMap<Vec<u8>, Ino> {
            i.and_then(|i| i.dir())
                .map(|d| {
                    d.entries_after(0)
                        .map(|(_, n, ino)| (n.to_vec(), ino))
                        .collect()
                })
                .unwrap_or_default()
        };
        let (na, nb) = (names(a), names(b));
        for (name, ino_a) in &na {
            if nb.get(name) != Some(ino_a) {
                out.push(Invalidation::Entry {
                    dir: ino,
                    name: name.as_slice().into(),
                });
            }
        }
        for name in nb.keys().filter(|n| !na.contains_key(*n)) {
            out.push(Invalidation::Entry {
                dir: ino,
                name: name.as_slice().into(),
            });
        }
    }
    out
}
