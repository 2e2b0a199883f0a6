//! The namespace: inodes, directories, symlinks, extended attributes and the per-file extent
//! map from file offset to remote chunks, changed only through batches ([`batch`]).
//!
//! All metadata lives in the mount daemon's memory; only file *data* lives on memory servers.
//! So `ls -l` of a large directory or `cp -a` of a tree of small files costs no network round
//! trip for metadata. Nothing here knows about the fabric or FUSE: chunks are plain
//! records (a length and the `{server, addr, rkey}` of each replica), and the file system core (`fs`) decides what they mean.
//!
//! Memory per inode is kept small (a few hundred bytes with its directory entry) so that a
//! million files fit comfortably: optional parts (extended attributes, directory tables, symlink
//! targets) are boxed and absent when unused.

pub mod batch;
mod dir;
pub mod extents;
pub mod image;
mod journal;
pub mod locks;
mod partial;
pub mod record;
mod replay;
mod stripe;

pub use batch::{Batch, Change};
pub use dir::{Dir, FIRST_ENTRY_COOKIE};
pub use extents::{
    Chunk, ChunkMap, Coding, ExtentChange, FileData, Redundancy, Replica, Stripe, MAX_REPLICAS,
};
pub use image::Image;
pub use journal::{AfterRecord, Journal, SendLater, UnsentWrite};
pub use partial::{Applicable, Loaded};
pub use replay::{add_chunks, Digest};

use crate::sync::Arc;
use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

/// An entry's name, shared between a directory's two indexes and the listings of open
/// directory streams (immutable bytes: a plain reference count, outside the `sync` story).
pub type Name = std::sync::Arc<[u8]>;

pub type Ino = u64;

/// The root directory's inode number (FUSE's `FUSE_ROOT_ID`).
pub const ROOT_INO: Ino = 1;

/// Longest name in a directory (as in most Linux file systems).
pub const NAME_MAX: usize = 255;

/// What an inode is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl Kind {
    /// The `S_IFMT` bits.
    pub fn mode_bits(self) -> u32 {
        match self {
            Kind::File => libc::S_IFREG,
            Kind::Dir => libc::S_IFDIR,
            Kind::Symlink => libc::S_IFLNK,
            Kind::Fifo => libc::S_IFIFO,
            Kind::Socket => libc::S_IFSOCK,
            Kind::CharDevice => libc::S_IFCHR,
            Kind::BlockDevice => libc::S_IFBLK,
        }
    }

    /// The kind named by a mode's `S_IFMT` bits (0 means a regular file, as `mknod` allows).
    pub fn from_mode(mode: u32) -> Option<Kind> {
        Some(match mode & libc::S_IFMT {
            0 | libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDevice,
            libc::S_IFBLK => Kind::BlockDevice,
            _ => return None,
        })
    }
}

/// Extended attributes: name to value.
pub type Xattrs = BTreeMap<Box<[u8]>, Box<[u8]>>;

/// What an inode holds besides its attributes.
#[derive(Debug)]
pub enum Body {
    File(Arc<FileData>),
    Dir(Box<Dir>),
    Symlink(Box<[u8]>),
    /// FIFOs, sockets and device nodes: the kernel handles their I/O.
    Special,
}

/// The attributes of an inode that the namespace keeps (what `stat` and `chattr` show).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attrs {
    /// Permission bits (`0o7777`).
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub rdev: u32,
    pub size: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    /// Birth time (`statx`'s `stx_btime`): when the inode was made, never changed.
    pub btime: SystemTime,
    /// Inode flags (`chattr`): the `FS_*_FL` bits of [`crate::fs::INODE_FLAGS`].
    pub flags: u32,
    /// Made by `O_TMPFILE` (without `O_EXCL`) and never linked: `link` may give it a first
    /// name, which any other inode without links refuses (ENOENT).
    pub tmpfile: bool,
    /// Bytes the file already held may be being written in place on every copy of their
    /// chunks (volumes): after a crash its copies may disagree, so attach makes them agree
    /// (see `fs::overwrite`). Journaled before the first such write goes out.
    pub overwriting: bool,
}

/// A lookup count no run of forgets brings to zero, nor any run of lookups overflows (see
/// [`Meta::pin_kernel_refs`]).
const PINNED_REFS: u64 = u64::MAX / 2;

/// An inode: its attributes (kept by the namespace, journaled), what the kernel holds of it
/// (session state), and its contents. Its attributes read as its own fields (`Deref`).
#[derive(Debug)]
pub struct Inode {
    pub kind: Kind,
    pub attrs: Attrs,
    /// References the kernel holds (FUSE lookup count).
    pub lookups: u64,
    /// Open file handles.
    pub opens: u32,
    pub body: Body,
    pub xattrs: Option<Box<Xattrs>>,
}

impl std::ops::Deref for Inode {
    type Target = Attrs;
    fn deref(&self) -> &Attrs {
        &self.attrs
    }
}

impl std::ops::DerefMut for Inode {
    fn deref_mut(&mut self) -> &mut Attrs {
        &mut self.attrs
    }
}

impl Inode {
    /// A new inode of `kind` made now: one link (two for a directory), nothing held.
    pub fn new(kind: Kind, perm: u16, uid: u32, gid: u32, body: Body) -> Inode {
        let now = now();
        Inode {
            kind,
            attrs: Attrs {
                perm,
                uid,
                gid,
                nlink: if kind == Kind::Dir { 2 } else { 1 },
                rdev: 0,
                size: 0,
                atime: now,
                mtime: now,
                ctime: now,
                btime: now,
                flags: 0,
                tmpfile: false,
                overwriting: false,
            },
            lookups: 0,
            opens: 0,
            body,
            xattrs: None,
        }
    }

    pub fn dir(&self) -> Option<&Dir> {
        match &self.body {
            Body::Dir(d) => Some(d),
            _ => None,
        }
    }
    pub(super) fn dir_mut(&mut self) -> Option<&mut Dir> {
        match &mut self.body {
            Body::Dir(d) => Some(d),
            _ => None,
        }
    }
    pub fn file(&self) -> Option<&Arc<FileData>> {
        match &self.body {
            Body::File(f) => Some(f),
            _ => None,
        }
    }
    /// No name, no open handle: the data can go.
    pub fn is_orphan(&self) -> bool {
        self.nlink == 0 && self.opens == 0
    }
}

/// The time stamped on inodes: the clock the kernel stamps a FUSE inode's times with
/// (CLOCK_REALTIME_COARSE, the `current_time` of a file system without multigrain
/// timestamps). Under the writeback cache the kernel sets a file's mtime and ctime itself,
/// from that clock; a finer one here would give times (a birth time) that read as later
/// than the kernel's that follow them.
pub fn now() -> SystemTime {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`, which lives across the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    match (rc, u64::try_from(ts.tv_sec)) {
        (0, Ok(secs)) => SystemTime::UNIX_EPOCH + std::time::Duration::new(secs, ts.tv_nsec as u32),
        _ => SystemTime::now(),
    }
}

/// What a journal may read of the table a batch changed: a shared volume's append names the
/// directories whose state a move's checks read.
pub struct TableView<'a> {
    inodes: &'a HashMap<Ino, Box<Inode>>,
    unloaded: Option<&'a std::collections::BTreeSet<Ino>>,
}

impl TableView<'_> {
    /// Whether directory `dir`'s names are not held (a partial table: see
    /// [`Meta::names_unloaded`]): nothing may be decided on them.
    pub fn names_unloaded(&self, dir: Ino) -> bool {
        self.unloaded.is_some_and(|u| u.contains(&dir))
    }

    /// Directory `dir` and every directory above it, up to the root.
    pub fn ancestors(&self, mut dir: Ino) -> Vec<Ino> {
        let mut out = vec![dir];
        while let Some(parent) = self
            .inodes
            .get(&dir)
            .and_then(|i| i.dir())
            .map(|d| d.parent())
            .filter(|p| *p != dir && !out.contains(p))
        {
            out.push(parent);
            dir = parent;
        }
        out
    }
}

/// The inode table. Its inodes change only through a [`Batch`] ([`Meta::batch`]); what the
/// kernel holds of them (lookups, open handles) through [`Meta::hold`] and its kin.
pub struct Meta {
    /// Boxed: the table's own entries stay 16 bytes, so its growth (a hash table doubling,
    /// which moves every entry under the lock) moves those instead of whole inodes: at a
    /// million files the longest create went from 465 to 62 ms (lab/scripts/bench-volume.sh).
    inodes: HashMap<Ino, Box<Inode>>,
    next_ino: Ino,
    /// Numbers a shared volume's engine gave this client for its new inodes (others make
    /// theirs at once); none: `next_ino` counts them.
    given_inos: Option<std::ops::Range<Ino>>,
    journal: Box<dyn Journal>,
    /// Each memory server's birth as a shared volume's history last gave it
    /// ([`Change::Born`]): the chunk copies the table lists there were made in it.
    births: std::collections::BTreeMap<u32, Box<[u8]>>,
    /// Batches committed, and the changes they held (`stats`).
    commits: u64,
    changes: u64,
    /// A partial table's directories whose names it does not hold ([`partial`]); none: the
    /// table holds the whole namespace.
    unloaded: Option<std::collections::BTreeSet<Ino>>,
    /// A partial table's directories the kernel let go of (no lookup left), for
    /// [`Meta::forget_let_go`].
    let_go: std::collections::BTreeSet<Ino>,
    /// The kernel's references were pinned ([`Meta::pin_kernel_refs`]): what it holds is
    /// not known, so nothing is forgotten.
    refs_pinned: bool,
}

impl std::fmt::Debug for Meta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meta")
            .field("inodes", &self.inodes.len())
            .field("next_ino", &self.next_ino)
            .field("commits", &self.commits)
            .finish()
    }
}

impl Meta {
    /// A table holding just the root directory.
    pub fn new(root_perm: u16, uid: u32, gid: u32) -> Meta {
        let mut root = Inode::new(
            Kind::Dir,
            root_perm,
            uid,
            gid,
            Body::Dir(Box::new(Dir::new(ROOT_INO))),
        );
        root.lookups = 1; // the kernel's permanent reference to the root
        let mut inodes = HashMap::new();
        inodes.insert(ROOT_INO, Box::new(root));
        Meta {
            inodes,
            next_ino: ROOT_INO + 1,
            given_inos: None,
            journal: Box::new(journal::InMemory),
            births: Default::default(),
            commits: 0,
            changes: 0,
            unloaded: None,
            let_go: Default::default(),
            refs_pinned: false,
        }
    }

    /// A shared volume's table before its log ([`Meta::new`]): the root's times are the
    /// epoch, the same on every client (the log's changes of the root move them forward;
    /// its name changes only as [`Change::DirStamp`]s, which leave the rest as they are),
    /// not each client's clock at its join.
    pub fn new_shared(root_perm: u16, uid: u32, gid: u32) -> Meta {
        let mut meta = Meta::new(root_perm, uid, gid);
        if let Some(root) = meta.get_mut(ROOT_INO) {
            let epoch = SystemTime::UNIX_EPOCH;
            (root.attrs.atime, root.attrs.mtime) = (epoch, epoch);
            (root.attrs.ctime, root.attrs.btime) = (epoch, epoch);
        }
        meta
    }

    /// Opens a batch of changes (see [`batch`]).
    pub fn batch(&mut self) -> Batch<'_> {
        Batch::new(self)
    }

    /// Where committed batches go from now on.
    pub fn set_journal(&mut self, journal: Box<dyn Journal>) {
        self.journal = journal;
    }

    /// Batches committed so far.
    pub fn commits(&self) -> u64 {
        self.commits
    }

    /// Changes committed so far.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// The kernel took `n` more references to `ino` (a lookup, a created or listed entry).
    pub fn hold(&mut self, ino: Ino, n: u64) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.lookups += n;
        }
    }

    /// The kernel dropped `n` references to `ino`.
    pub fn release_refs(&mut self, ino: Ino, n: u64) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.lookups = i.lookups.saturating_sub(n);
            if i.lookups == 0 && i.kind == Kind::Dir && self.unloaded.is_some() {
                self.let_go.insert(ino);
            }
        }
    }

    /// Every inode held as if the kernel had looked it up without end: a daemon that takes
    /// over a kept FUSE connection cannot know the lookup counts the kernel holds (they died
    /// with the daemon that answered those lookups), so nothing is dropped for want of
    /// references until a fresh attach collects orphans. Forgets then count down from here.
    pub fn pin_kernel_refs(&mut self) {
        self.refs_pinned = true;
        for i in self.inodes.values_mut() {
            i.lookups = i.lookups.max(PINNED_REFS);
        }
    }

    /// A handle to `ino` was opened.
    pub fn opened(&mut self, ino: Ino) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.opens += 1;
        }
    }

    /// A handle to `ino` was closed.
    pub fn closed(&mut self, ino: Ino) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.opens = i.opens.saturating_sub(1);
        }
    }

    /// Every regular file's data, with its inode number.
    pub fn files(&self) -> impl Iterator<Item = (Ino, &Arc<FileData>)> {
        self.inodes
            .iter()
            .filter_map(|(ino, i)| Some((*ino, i.file()?)))
    }

    pub fn get(&self, ino: Ino) -> Option<&Inode> {
        self.inodes.get(&ino).map(|i| &**i)
    }
    fn get_mut(&mut self, ino: Ino) -> Option<&mut Inode> {
        self.inodes.get_mut(&ino).map(|i| &mut **i)
    }

    fn remove(&mut self, ino: Ino) -> Option<Inode> {
        self.inodes.remove(&ino).map(|i| *i)
    }

    fn restore(&mut self, ino: Ino, inode: Inode) {
        self.inodes.insert(ino, Box::new(inode));
    }

    /// Puts `inode` in the table under number `ino` (a replayed creation).
    fn place(&mut self, ino: Ino, inode: Inode) {
        self.inodes.insert(ino, Box::new(inode));
        self.next_ino = self.next_ino.max(ino + 1);
    }

    /// Adds a new inode (numbers are never reused, so the FUSE generation can stay 0).
    fn insert(&mut self, inode: Inode) -> Ino {
        let ino = match &mut self.given_inos {
            Some(given) => given
                .next()
                .expect("a shared volume's change has inode numbers at hand (Turns::prepare)"),
            None => {
                self.next_ino += 1;
                self.next_ino - 1
            }
        };
        self.inodes.insert(ino, Box::new(inode));
        ino
    }

    /// New inodes take their numbers from `given` from now on (a shared volume's engine
    /// gave them to this client).
    pub fn give_inos(&mut self, given: std::ops::Range<Ino>) {
        self.given_inos = Some(given);
    }

    /// How many given numbers are left (none given: none).
    pub fn inos_left(&self) -> u64 {
        self.given_inos
            .as_ref()
            .map_or(0, |r| r.end.saturating_sub(r.start))
    }

    /// Drops an inode from the table once nothing refers to it any more (no name, no open
    /// handle, no kernel reference). Returns it so the caller can release its data.
    fn reap(&mut self, ino: Ino) -> Option<Inode> {
        self.reap_if(ino, |i| i.lookups == 0)
    }

    /// Takes `ino` out of the table if no name and no handle hold it and it is no directory,
    /// whatever references the kernel holds (see [`Batch::drop_unlinked`]).
    fn reap_unlinked(&mut self, ino: Ino) -> Option<Inode> {
        self.reap_if(ino, |i| i.kind != Kind::Dir)
    }

    /// Takes orphan `ino` (no name, no open handle; never the root) out of the table if
    /// `also` holds for it.
    fn reap_if(&mut self, ino: Ino, also: impl Fn(&Inode) -> bool) -> Option<Inode> {
        match self.inodes.get(&ino) {
            Some(i) if i.is_orphan() && also(i) && ino != ROOT_INO => {
                self.inodes.remove(&ino).map(|i| *i)
            }
            _ => None,
        }
    }

    pub fn len(&self) -> usize {
        self.inodes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.inodes.is_empty()
    }

    /// Every inode number in the table.
    pub fn inos(&self) -> impl Iterator<Item = Ino> + '_ {
        self.inodes.keys().copied()
    }

    /// Takes the kernel's references and the open handles of each inode from `old` (a
    /// follower that reloads the whole namespace keeps what its kernel holds).
    /// Takes over `old`'s journal (a shared client's table replaced by a checkpoint goes on
    /// recording its changes where the old one did).
    pub fn carry_journal(&mut self, old: &mut Meta) {
        self.journal = std::mem::replace(&mut old.journal, Box::new(journal::InMemory));
        self.given_inos = old.given_inos.take();
    }

    /// Server `server`'s birth as the history last gave it (see [`Change::Born`]).
    pub fn birth(&self, server: u32) -> Option<&[u8]> {
        self.births.get(&server).map(|b| &**b)
    }

    /// Every server's birth the table knows, as the changes that give them (a checkpoint's
    /// image starts with them).
    pub fn births(&self) -> Vec<Change> {
        self.births
            .iter()
            .map(|(&server, birth)| Change::Born {
                server,
                birth: birth.clone(),
                stale: false,
            })
            .collect()
    }

    /// Whether [`Change::Born`] `(server, birth, stale)` forgets the copies listed on
    /// `server`: a birth other than the one the table knows (the server restarted empty
    /// since), or the first one given for a server whose copies are known `stale`.
    pub fn born_forgets(&self, server: u32, birth: &[u8], stale: bool) -> bool {
        match self.births.get(&server) {
            Some(known) => **known != *birth,
            None => stale,
        }
    }

    /// Notes server `server`'s birth (the caller forgot its copies there, if due).
    pub fn set_birth(&mut self, server: u32, birth: &[u8]) {
        self.births.insert(server, birth.into());
    }

    pub fn carry_refs(&mut self, old: &Meta) {
        self.refs_pinned |= old.refs_pinned;
        for (ino, i) in self.inodes.iter_mut() {
            if let Some(o) = old.inodes.get(ino) {
                i.lookups = o.lookups;
                i.opens = o.opens;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_stays_small() {
        // A million files must fit: keep the fixed part of an inode compact.
        assert!(
            std::mem::size_of::<Inode>() <= 160,
            "{}",
            std::mem::size_of::<Inode>()
        );
    }
}
