//! Local metadata: inodes, directories, symlinks, extended attributes and the per-file extent
//! map from file offset to remote chunks.
//!
//! All metadata lives in the mount daemon's memory; only file *data* lives on memory servers.
//! So `ls -l` of a large directory or `cp -a` of a tree of small files costs no network round
//! trip for metadata. Nothing here knows about the fabric or FUSE: chunks are plain
//! records (a length and the `{server, addr, rkey}` of each replica), and the file system core (`fs`) decides what they mean.
//!
//! Memory per inode is kept small (a few hundred bytes with its directory entry) so that a
//! million files fit comfortably: optional parts (extended attributes, directory tables, symlink
//! targets) are boxed and absent when unused.

use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::{Arc, RwLock};
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

/// Most copies of a chunk a mount keeps (`--replicas`): three survive any two failures, and
/// every further copy costs a full write to one more server.
pub const MAX_REPLICAS: usize = 3;

/// One copy of a chunk: an extent on one memory server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Replica {
    pub server: u32,
    pub addr: u64,
    pub rkey: u64,
}

/// One remote chunk of a file: `len` bytes of server memory, on every replica, holding the
/// file bytes from the chunk's start offset. `len` may be less than the chunk size (a small
/// file's only chunk). Every listed replica holds the chunk's current bytes: a replica that
/// misses a write is taken out of the list before that write is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub len: u64,
    count: u8,
    replicas: [Replica; MAX_REPLICAS],
}

impl Chunk {
    /// A chunk of `len` bytes with no replica yet.
    pub fn new(len: u64) -> Chunk {
        Chunk {
            len,
            count: 0,
            replicas: [Replica::default(); MAX_REPLICAS],
        }
    }

    /// A chunk of `len` bytes held by `replicas` (at most [`MAX_REPLICAS`] are kept).
    pub fn with_replicas(len: u64, replicas: &[Replica]) -> Chunk {
        let mut c = Chunk::new(len);
        for r in replicas {
            c.add(*r);
        }
        c
    }

    pub fn replicas(&self) -> &[Replica] {
        &self.replicas[..self.count as usize]
    }

    /// Adds a replica; false if the chunk has [`MAX_REPLICAS`] already or one on that server.
    pub fn add(&mut self, r: Replica) -> bool {
        if self.count as usize == MAX_REPLICAS || self.on(r.server).is_some() {
            return false;
        }
        self.replicas[self.count as usize] = r;
        self.count += 1;
        true
    }

    /// The replica on `server`, if any.
    pub fn on(&self, server: u32) -> Option<Replica> {
        self.replicas().iter().find(|r| r.server == server).copied()
    }

    /// Takes the replica on `server` out (it missed a write or its server is gone).
    pub fn remove(&mut self, server: u32) -> Option<Replica> {
        let i = self.replicas().iter().position(|r| r.server == server)?;
        let r = self.replicas[i];
        self.replicas.copy_within(i + 1..self.count as usize, i);
        self.count -= 1;
        Some(r)
    }
}

/// A regular file's extent map: chunk index to chunk. Guarded by its own lock so that data I/O
/// never holds the metadata lock; the lock is held across the remote I/O that uses the chunks,
/// so a truncate cannot free a chunk while a read or write is using it.
#[derive(Debug, Default)]
pub struct FileData {
    pub chunks: RwLock<BTreeMap<u64, Chunk>>,
    /// Bytes the chunks hold (of one copy): `st_blocks`. Kept beside the map so `stat` needs
    /// no chunk lock (that lock is held across remote I/O); updated by whoever changes the
    /// map, through [`FileData::tracking`].
    held: AtomicU64,
}

impl FileData {
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Runs `op` on `chunks` (this file's, locked by the caller), which may change only the
    /// chunks with indexes in `range`, and accounts for what it changed there in `held`
    /// (whether or not it succeeded: a failed write may have allocated some).
    pub fn tracking<R>(
        &self,
        chunks: &mut BTreeMap<u64, Chunk>,
        range: std::ops::RangeInclusive<u64>,
        op: impl FnOnce(&mut BTreeMap<u64, Chunk>) -> R,
    ) -> R {
        let sum =
            |c: &BTreeMap<u64, Chunk>| -> u64 { c.range(range.clone()).map(|(_, c)| c.len).sum() };
        let before = sum(chunks);
        let r = op(chunks);
        let after = sum(chunks);
        if after >= before {
            self.held.fetch_add(after - before, Ordering::Relaxed);
        } else {
            self.held.fetch_sub(before - after, Ordering::Relaxed);
        }
        r
    }
}

/// A directory's entries. Each entry gets a cookie, increasing and never reused within the
/// directory, which serves as its `readdir` offset: offsets stay valid while entries come and
/// go (cookies 1 and 2 are "." and "..").
#[derive(Debug)]
pub struct Dir {
    pub parent: Ino,
    by_cookie: BTreeMap<u64, (Name, Ino)>,
    by_name: HashMap<Name, u64>,
    next_cookie: u64,
}

/// The first cookie given to a real entry.
pub const FIRST_ENTRY_COOKIE: u64 = 3;

impl Dir {
    pub fn new(parent: Ino) -> Dir {
        Dir {
            parent,
            by_cookie: BTreeMap::new(),
            by_name: HashMap::new(),
            next_cookie: FIRST_ENTRY_COOKIE,
        }
    }
    pub fn get(&self, name: &[u8]) -> Option<Ino> {
        self.by_name.get(name).map(|c| self.by_cookie[c].1)
    }
    pub fn insert(&mut self, name: &[u8], ino: Ino) {
        debug_assert!(!self.by_name.contains_key(name));
        let c = self.next_cookie;
        self.next_cookie += 1;
        let name: Name = name.into();
        self.by_cookie.insert(c, (name.clone(), ino));
        self.by_name.insert(name, c);
    }
    /// Points an existing name at another inode, keeping its cookie.
    pub fn replace(&mut self, name: &[u8], ino: Ino) {
        let c = self.by_name[name];
        self.by_cookie.get_mut(&c).expect("consistent").1 = ino;
    }
    pub fn remove(&mut self, name: &[u8]) -> Option<Ino> {
        let c = self.by_name.remove(name)?;
        self.by_cookie.remove(&c).map(|(_, ino)| ino)
    }
    pub fn len(&self) -> usize {
        self.by_name.len()
    }
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
    /// Entries with a cookie greater than `after`, in cookie order.
    pub fn entries_after(&self, after: u64) -> impl Iterator<Item = (u64, &[u8], Ino)> {
        self.by_cookie
            .range(after.saturating_add(1)..)
            .map(|(c, (n, i))| (*c, &n[..], *i))
    }
    /// The names in cookie order, with their cookies: what one directory read lists (see
    /// `Fs::readdir`). Names are shared, not copied.
    pub fn listing(&self) -> Vec<(u64, Name)> {
        self.by_cookie
            .iter()
            .map(|(c, (n, _))| (*c, n.clone()))
            .collect()
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

#[derive(Debug)]
pub struct Inode {
    pub kind: Kind,
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
    /// References the kernel holds (FUSE lookup count).
    pub lookups: u64,
    /// Open file handles.
    pub opens: u32,
    pub body: Body,
    pub xattrs: Option<Box<Xattrs>>,
    /// Inode flags (`chattr`): the `FS_*_FL` bits of [`crate::fs::INODE_FLAGS`].
    pub flags: u32,
    /// Made by `O_TMPFILE` (without `O_EXCL`) and never linked: `link` may give it a first
    /// name, which any other inode without links refuses (ENOENT).
    pub tmpfile: bool,
}

impl Inode {
    pub fn dir(&self) -> Option<&Dir> {
        match &self.body {
            Body::Dir(d) => Some(d),
            _ => None,
        }
    }
    pub fn dir_mut(&mut self) -> Option<&mut Dir> {
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

/// The inode table.
#[derive(Debug)]
pub struct Meta {
    inodes: HashMap<Ino, Inode>,
    next_ino: Ino,
}

impl Meta {
    /// A table holding just the root directory.
    pub fn new(root_perm: u16, uid: u32, gid: u32) -> Meta {
        let now = now();
        let mut inodes = HashMap::new();
        inodes.insert(
            ROOT_INO,
            Inode {
                kind: Kind::Dir,
                perm: root_perm,
                uid,
                gid,
                nlink: 2,
                rdev: 0,
                size: 0,
                atime: now,
                mtime: now,
                ctime: now,
                btime: now,
                lookups: 1, // the kernel's permanent reference to the root
                opens: 0,
                body: Body::Dir(Box::new(Dir::new(ROOT_INO))),
                xattrs: None,
                flags: 0,
                tmpfile: false,
            },
        );
        Meta {
            inodes,
            next_ino: ROOT_INO + 1,
        }
    }

    /// Every regular file's data.
    pub fn files(&self) -> impl Iterator<Item = &Arc<FileData>> {
        self.inodes.values().filter_map(|i| i.file())
    }

    pub fn get(&self, ino: Ino) -> Option<&Inode> {
        self.inodes.get(&ino)
    }
    pub fn get_mut(&mut self, ino: Ino) -> Option<&mut Inode> {
        self.inodes.get_mut(&ino)
    }

    /// Adds a new inode (numbers are never reused, so the FUSE generation can stay 0).
    pub fn insert(&mut self, inode: Inode) -> Ino {
        let ino = self.next_ino;
        self.next_ino += 1;
        self.inodes.insert(ino, inode);
        ino
    }

    /// Drops an inode from the table once nothing refers to it any more (no name, no open
    /// handle, no kernel reference). Returns it so the caller can release its data.
    pub fn reap(&mut self, ino: Ino) -> Option<Inode> {
        match self.inodes.get(&ino) {
            Some(i) if i.is_orphan() && i.lookups == 0 && ino != ROOT_INO => {
                self.inodes.remove(&ino)
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_cookies_are_stable_and_never_reused() {
        let mut d = Dir::new(ROOT_INO);
        d.insert(b"a", 10);
        d.insert(b"b", 11);
        d.insert(b"c", 12);
        let first: Vec<_> = d
            .entries_after(0)
            .map(|(c, n, _)| (c, n.to_vec()))
            .collect();
        assert_eq!(first[0], (3, b"a".to_vec()));
        // Resume after "a" while "b" is removed and "d" added: "c" keeps its offset.
        d.remove(b"b");
        d.insert(b"d", 13);
        let rest: Vec<_> = d
            .entries_after(3)
            .map(|(c, n, _)| (c, n.to_vec()))
            .collect();
        assert_eq!(rest, vec![(5, b"c".to_vec()), (6, b"d".to_vec())]);
        d.replace(b"c", 99);
        assert_eq!(d.get(b"c"), Some(99));
        assert_eq!(d.len(), 3);
    }

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
