//! A table that holds part of the namespace: a shared volume's client that loads inodes and
//! directories' names as they are used, from the engine's state (shared format 7), instead
//! of the whole namespace before it serves.
//!
//! What it holds: inodes, each whole (attributes, extended attributes, chunks), and of its
//! directories, those whose names it holds *complete* (every name, and every inode a name
//! leads to); the others are *unloaded* ([`Meta::names_unloaded`]): their attributes are
//! held and kept, their names are not, and nothing may be decided on them (the file
//! system's lookups say so, [`crate::error::Error::unloaded`], and the client loads them).
//! Other clients' changes are applied to what the table holds only ([`Meta::held_changes`]);
//! a load brings the table to the engine's head first, then installs what it read as of
//! that head ([`Meta::install`]), so both are of one change.

use super::{Change, Ino, Inode, Meta, Name, ROOT_INO};
use crate::error::Result;
use std::collections::{BTreeSet, HashMap, HashSet};

/// What a client read of the engine's state to load ([`Meta::install`]): the changes that
/// make inodes and set their parts and names, and chunks and servers' births with the LSN
/// that placed each, in the log's order.
#[derive(Debug, Default)]
pub struct Loaded {
    pub changes: Vec<Change>,
    pub placed: Vec<(u64, Change)>,
}

/// What a table applies of other clients' records ([`Meta::held_of`]).
pub struct Applicable<'c> {
    pub changes: Vec<&'c Change>,
    /// Each name changed in a directory the table holds without its names, once (a
    /// directory whose names went unloaded in these records may have some applied too).
    pub unheld_names: Vec<(Ino, &'c Name)>,
}

impl Meta {
    /// From now on the table holds the root's attributes and none of its names: it loads
    /// what it is asked for ([`Meta::install`]).
    pub fn start_partial(&mut self) {
        self.unloaded = Some(BTreeSet::from([ROOT_INO]));
    }

    /// Whether the table holds part of the namespace only.
    pub fn is_partial(&self) -> bool {
        self.unloaded.is_some()
    }

    /// Whether directory `dir`'s names are not held (a partial table's directory not yet
    /// loaded, or loaded and then changed by another client in a way it did not hold).
    pub fn names_unloaded(&self, dir: Ino) -> bool {
        self.unloaded.as_ref().is_some_and(|u| u.contains(&dir))
    }

    /// Up to `most` directories whose names are not held, lowest inode first.
    pub fn unloaded_dirs(&self, most: usize) -> Vec<Ino> {
        self.unloaded
            .iter()
            .flatten()
            .copied()
            .filter(|d| self.inodes.contains_key(d))
            .take(most)
            .collect()
    }

    /// Forgets what the table holds below the directories the kernel let go of since the
    /// last call: a partial table that is to hold what its client uses (a large volume's
    /// client other than its keeper) drops what the kernel dropped. A directory let go of,
    /// with no handle open and not `kept` (this client's turn on it, say), loses its names
    /// (it is unloaded after); then every inode nothing leads to any more goes
    /// ([`Meta::sweep`]). What is forgotten is loaded again at its next use, as a join loads
    /// it. Nothing after the kernel's references were pinned (a connection taken over: the
    /// counts of what it holds are not known). Returns what went.
    pub fn forget_let_go(&mut self, kept: &dyn Fn(Ino) -> bool) -> Vec<Inode> {
        if self.let_go.is_empty() || self.refs_pinned {
            return Vec::new();
        }
        let mut forgot = false;
        for dir in std::mem::take(&mut self.let_go) {
            if !self.unused(dir, kept) {
                continue;
            }
            if let Some(d) = self.get_mut(dir).and_then(Inode::dir_mut) {
                d.drop_names();
                forgot = true;
                if let Some(u) = self.unloaded.as_mut() {
                    u.insert(dir);
                }
            }
        }
        match forgot {
            true => self.sweep(kept),
            false => Vec::new(),
        }
    }

    /// Takes out every inode nothing holds: the root, what the kernel, a handle or `kept`
    /// holds, and whatever a directory whose names are held leads to from those, stay (so a
    /// held directory still leads only to inodes the table holds, hard links included);
    /// the rest goes (left without a held name by a forgotten directory, a directory whose
    /// names went unloaded, a file loaded by number). Returns what went. O(the table), in
    /// a loop of its own (no recursion: a tree may be deep).
    fn sweep(&mut self, kept: &dyn Fn(Ino) -> bool) -> Vec<Inode> {
        let mut reached: HashSet<Ino> = HashSet::new();
        let mut todo: Vec<Ino> = self
            .inodes
            .iter()
            .filter(|(ino, i)| **ino == ROOT_INO || i.lookups > 0 || i.opens > 0 || kept(**ino))
            .map(|(ino, _)| *ino)
            .collect();
        while let Some(ino) = todo.pop() {
            if !reached.insert(ino) {
                continue;
            }
            if !self.names_held(ino) {
                continue;
            }
            if let Some(d) = self.inodes.get(&ino).and_then(|i| i.dir()) {
                todo.extend(d.entries_after(0).map(|(_, _, child)| child));
            }
        }
        let unreached: Vec<Ino> = self
            .inodes
            .keys()
            .filter(|i| !reached.contains(i))
            .copied()
            .collect();
        let gone: Vec<Inode> = unreached
            .into_iter()
            .filter_map(|i| self.remove(i))
            .collect();
        if let Some(u) = self.unloaded.as_mut() {
            u.retain(|d| self.inodes.contains_key(d));
        }
        gone
    }

    /// Whether the kernel let a directory go since the last [`Meta::forget_let_go`].
    pub fn has_let_go(&self) -> bool {
        !self.let_go.is_empty()
    }

    /// Whether `ino` is held by nothing but the table: no kernel reference, no handle, not
    /// `kept`, not the root.
    fn unused(&self, ino: Ino, kept: &dyn Fn(Ino) -> bool) -> bool {
        ino != ROOT_INO
            && !kept(ino)
            && self
                .inodes
                .get(&ino)
                .is_some_and(|i| i.lookups == 0 && i.opens == 0)
    }

    /// The table holds every directory's names: it is whole from now on (the caller loaded
    /// the inodes no name leads to first). False while a directory's names are not held.
    pub fn finish_partial(&mut self) -> bool {
        let dirs: Vec<Ino> = self.unloaded.iter().flatten().copied().collect();
        let held: Vec<Ino> = dirs
            .into_iter()
            .filter(|d| self.inodes.contains_key(d))
            .collect();
        if !held.is_empty() {
            return false;
        }
        self.unloaded = None;
        self.let_go.clear();
        true
    }

    /// Of other clients' `records` (in the log's order), the changes this table applies: all
    /// of a whole table's, of a partial one's those [`Meta::held_changes`] keeps, every
    /// record filtered before any is applied. With them, the names changed in directories
    /// the table holds without their names (it held them once, or another client's link
    /// unloaded them in these records): the kernel may hold a lookup of one, which the
    /// caller tells it to forget, as it does for a name it applies.
    pub fn held_of<'c>(&mut self, records: &'c [(u64, Vec<Change>)]) -> Applicable<'c> {
        if self.unloaded.is_none() {
            return Applicable {
                changes: records.iter().flat_map(|(_, c)| c).collect(),
                unheld_names: Vec::new(),
            };
        }
        let mut kept = HashSet::new();
        let changes = records
            .iter()
            .flat_map(|(_, c)| self.held_changes(&c.iter().collect::<Vec<_>>(), &mut kept))
            .collect();
        let mut seen = HashSet::new();
        let unheld_names = records
            .iter()
            .flat_map(|(_, c)| c)
            .filter_map(|c| match c {
                // Of a directory the kernel holds: it holds no name under one it let go.
                Change::Entry { dir, name, .. } | Change::EntryAt { dir, name, .. }
                    if self.inodes.get(dir).is_some_and(|d| d.lookups > 0)
                        && self.names_unloaded(*dir) =>
                {
                    Some((*dir, name))
                }
                _ => None,
            })
            .filter(|(dir, name)| seen.insert((*dir, &name[..])))
            .collect();
        Applicable {
            changes,
            unheld_names,
        }
    }

    /// Which of `changes` (one record's, another client's) a partial table applies: those
    /// of what it holds, and the inodes the record makes in a directory whose names it
    /// holds (or in one the record makes there). A whole table applies all. A name another
    /// client puts in a complete directory, leading to an inode this table does not hold (a
    /// link, a move from a directory not held), leaves that directory unloaded: its next use
    /// loads it again, with that inode.
    ///
    /// `kept`: the inodes earlier records of the same catch-up made and kept (applied after
    /// all of them are filtered), to which this record's changes apply as well.
    pub fn held_changes<'c>(
        &mut self,
        changes: &[&'c Change],
        kept: &mut HashSet<Ino>,
    ) -> Vec<&'c Change> {
        if self.unloaded.is_none() {
            return changes.to_vec();
        }
        let made: HashSet<Ino> = changes
            .iter()
            .filter_map(|c| match c {
                Change::Make { ino, .. } => Some(*ino),
                _ => None,
            })
            .collect();
        // Made and named in a complete directory (or in one made so): twice over, for a
        // directory made with a name in it.
        let mut kept_made: HashSet<Ino> = std::mem::take(kept);
        for _ in 0..2 {
            for c in changes {
                if let Change::Entry {
                    dir, ino: Some(x), ..
                }
                | Change::EntryAt { dir, ino: x, .. } = c
                {
                    if made.contains(x) && (self.names_held(*dir) || kept_made.contains(dir)) {
                        kept_made.insert(*x);
                    }
                }
            }
        }
        // Once every directory held has its names (a client finishing its load), every
        // inode made is kept, named or not (a file made with `O_TMPFILE` after the load's
        // last look at the state's inodes).
        let all_names = self
            .unloaded
            .iter()
            .flatten()
            .all(|d| !self.inodes.contains_key(d));
        if all_names {
            kept_made.extend(made.iter().copied());
        }
        let held = |m: &Meta, ino: &Ino| m.inodes.contains_key(ino) || kept_made.contains(ino);
        let mut out = Vec::with_capacity(changes.len());
        let mut now_unloaded = Vec::new();
        for c in changes {
            let keep = match c {
                Change::Make { ino, .. } => kept_made.contains(ino),
                Change::Attrs { ino, .. }
                | Change::Xattr { ino, .. }
                | Change::Extent { ino, .. }
                | Change::Drop { ino }
                | Change::Parent { dir: ino, .. }
                | Change::DirStamp { dir: ino, .. } => held(self, ino),
                Change::Entry {
                    dir, ino: Some(x), ..
                }
                | Change::EntryAt { dir, ino: x, .. }
                    if (self.names_held(*dir) || kept_made.contains(dir)) && !held(self, x) =>
                {
                    now_unloaded.push(*dir);
                    false
                }
                Change::Entry { dir, .. }
                | Change::EntryAt { dir, .. }
                | Change::Cookies { dir, .. } => self.names_held(*dir) || kept_made.contains(dir),
                Change::Born { .. } => true,
            };
            if keep {
                out.push(*c);
            }
        }
        *kept = kept_made;
        if let Some(u) = self.unloaded.as_mut() {
            u.extend(now_unloaded);
            for c in &out {
                if let Change::Drop { ino } = c {
                    u.remove(ino);
                }
            }
        }
        out
    }

    /// Whether a load of `ino` (with its names, if a directory) would bring nothing: it is
    /// held, and a directory's names with it.
    pub fn holds_whole(&self, ino: Ino) -> bool {
        match self.inodes.get(&ino) {
            Some(i) => i.dir().is_none() || !self.names_unloaded(ino),
            None => false,
        }
    }

    /// Whether directory `dir` is held with all its names.
    fn names_held(&self, dir: Ino) -> bool {
        self.inodes.get(&dir).is_some_and(|i| i.dir().is_some()) && !self.names_unloaded(dir)
    }

    /// Installs what a load read of the engine's state, as of the change the table is at:
    /// each inode it did not hold (`fresh`: ones it holds, made again from the state: the
    /// root at a join), and the names of `dirs`, which are complete then. A directory it
    /// makes is unloaded unless among `dirs`. A chunk's copy on a server whose birth after
    /// it forgot it (in the births' order) is left out; births the table does not know are
    /// noted.
    pub fn install(&mut self, dirs: &[Ino], fresh: &[Ino], loaded: Loaded) -> Result<()> {
        let mut forget_before: HashMap<u32, u64> = HashMap::new();
        let mut known: HashMap<u32, Box<[u8]>> = HashMap::new();
        for (lsn, c) in &loaded.placed {
            if let Change::Born {
                server,
                birth,
                stale,
            } = c
            {
                let forgets = match known.get(server) {
                    Some(k) => k != birth,
                    None => *stale,
                };
                if forgets {
                    forget_before.insert(*server, *lsn);
                }
                known.insert(*server, birth.clone());
            }
        }
        for (server, birth) in known {
            if self.birth(server).is_none() {
                self.set_birth(server, &birth);
            }
        }
        let mut newly: HashSet<Ino> = fresh.iter().copied().collect();
        let mut names: HashMap<Ino, Vec<(super::Name, Ino)>> =
            dirs.iter().map(|d| (*d, Vec::new())).collect();
        for c in &loaded.changes {
            match c {
                Change::Make { ino, kind, .. } if !self.inodes.contains_key(ino) => {
                    self.apply(c)?;
                    newly.insert(*ino);
                    if *kind == super::Kind::Dir {
                        if let Some(u) = self.unloaded.as_mut() {
                            u.insert(*ino);
                        }
                    }
                }
                Change::Attrs { ino, .. }
                | Change::Xattr { ino, .. }
                | Change::Parent { dir: ino, .. }
                | Change::DirStamp { dir: ino, .. }
                    if newly.contains(ino) =>
                {
                    self.apply(c)?
                }
                Change::Entry {
                    dir,
                    name,
                    ino: Some(child),
                } => {
                    if let Some(n) = names.get_mut(dir) {
                        n.push((name.clone(), *child));
                    }
                }
                _ => {}
            }
        }
        for (lsn, c) in loaded.placed {
            if let Change::Extent {
                ino,
                idx,
                chunk: Some(mut chunk),
            } = c
            {
                if !newly.contains(&ino) {
                    continue;
                }
                for (server, before) in &forget_before {
                    if lsn < *before {
                        chunk.remove(*server);
                    }
                }
                self.apply(&Change::Extent {
                    ino,
                    idx,
                    chunk: Some(chunk),
                })?;
            }
        }
        for (dir, listed) in names {
            let Some(d) = self.get_mut(dir).and_then(super::Inode::dir_mut) else {
                continue;
            };
            let now: HashSet<&[u8]> = listed.iter().map(|(n, _)| &n[..]).collect();
            let gone: Vec<Box<[u8]>> = d
                .entries_after(0)
                .filter(|(_, n, _)| !now.contains(n))
                .map(|(_, n, _)| n.into())
                .collect();
            for n in gone {
                d.remove(&n);
            }
            for (n, child) in listed {
                match d.get(&n) {
                    Some(i) if i == child => {}
                    Some(_) => d.replace(&n, child),
                    None => d.insert(&n, child),
                }
            }
            if let Some(u) = self.unloaded.as_mut() {
                u.remove(&dir);
            }
        }
        Ok(())
    }
}
