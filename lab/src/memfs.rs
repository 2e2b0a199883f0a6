//! `rmemfs-bench memfs`: an in-memory FUSE file system with the kernel's writeback cache, the
//! peer that `lab/scripts/bench-fio.sh` sets beside rmemfs (#27).
//!
//! It keeps every file's bytes in a `Vec` in this process and nothing else: no network, no
//! copies, no registration. So its figures are what FUSE with the writeback cache allows on
//! this machine for a file system whose data costs nothing to reach, the ceiling a memory file
//! system over FUSE can approach. One lock over the whole tree: the kernel's cache gathers
//! small writes into large requests, so the daemon is rarely the bottleneck.

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request,
};
use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// All changes come through this daemon: the kernel may keep names and attributes.
const TTL: Duration = Duration::from_secs(60);
const ROOT: u64 = 1;
/// Largest write request asked for (FUSE's limit without the max_pages sysctl).
const MAX_WRITE: u32 = 1 << 20;

struct Node {
    kind: FileType,
    perm: u16,
    nlink: u32,
    data: Vec<u8>,
    children: BTreeMap<OsString, u64>,
    mtime: SystemTime,
    /// Unlinked: writes back to it are dropped.
    orphan: bool,
}

struct Tree {
    nodes: HashMap<u64, Node>,
    next: u64,
}

/// The file system: a tree of nodes under one lock.
pub struct MemFs {
    tree: Mutex<Tree>,
}

impl Node {
    fn new(kind: FileType, perm: u16) -> Node {
        Node {
            kind,
            perm,
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            data: Vec::new(),
            children: BTreeMap::new(),
            mtime: SystemTime::now(),
            orphan: false,
        }
    }

    fn attr(&self, ino: u64) -> FileAttr {
        let size = self.data.len() as u64;
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: self.mtime,
            mtime: self.mtime,
            ctime: self.mtime,
            crtime: self.mtime,
            kind: self.kind,
            perm: self.perm,
            nlink: self.nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }
}

impl Default for MemFs {
    fn default() -> Self {
        let mut nodes = HashMap::new();
        nodes.insert(ROOT, Node::new(FileType::Directory, 0o777));
        MemFs {
            tree: Mutex::new(Tree {
                nodes,
                next: ROOT + 1,
            }),
        }
    }
}

fn errno(e: i32) -> Errno {
    Errno::from_i32(e)
}

impl Tree {
    /// Makes `name` in directory `parent`; its attributes, or an errno.
    fn make(
        &mut self,
        parent: u64,
        name: &OsStr,
        kind: FileType,
        mode: u32,
    ) -> Result<FileAttr, i32> {
        let dir = self.nodes.get(&parent).ok_or(libc::ENOENT)?;
        if dir.kind != FileType::Directory {
            return Err(libc::ENOTDIR);
        }
        if dir.children.contains_key(name) {
            return Err(libc::EEXIST);
        }
        let ino = self.next;
        self.next += 1;
        let node = Node::new(kind, (mode & 0o7777) as u16);
        let attr = node.attr(ino);
        self.nodes.insert(ino, node);
        let dir = self.nodes.get_mut(&parent).expect("checked");
        dir.children.insert(name.to_owned(), ino);
        if kind == FileType::Directory {
            dir.nlink += 1;
        }
        Ok(attr)
    }

    /// Removes `name` from `parent` (a directory only if `dir` and it is empty).
    fn remove(&mut self, parent: u64, name: &OsStr, dir: bool) -> Result<(), i32> {
        let ino = *self
            .nodes
            .get(&parent)
            .and_then(|p| p.children.get(name))
            .ok_or(libc::ENOENT)?;
        let node = &self.nodes[&ino];
        match (dir, node.kind == FileType::Directory) {
            (true, false) => return Err(libc::ENOTDIR),
            (false, true) => return Err(libc::EISDIR),
            (true, true) if !node.children.is_empty() => return Err(libc::ENOTEMPTY),
            _ => {}
        }
        // The node stays (the kernel may still write back cached pages of it, and must not
        // hear ENOENT), but its bytes go: a benchmark peer, not a POSIX reference, so an
        // unlinked file that is still open reads as empty.
        let n = self.nodes.get_mut(&ino).expect("looked up");
        n.data = Vec::new();
        n.orphan = true;
        let p = self.nodes.get_mut(&parent).expect("looked up");
        p.children.remove(name);
        if dir {
            p.nlink -= 1;
        }
        Ok(())
    }
}

impl Filesystem for MemFs {
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_readahead(MAX_WRITE);
        config
            .add_capabilities(fuser::InitFlags::FUSE_WRITEBACK_CACHE)
            .map_err(|_| std::io::Error::other("the kernel offers no writeback cache"))?;
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let tree = self.tree.lock().unwrap();
        match tree.nodes.get(&parent.0).and_then(|p| p.children.get(name)) {
            Some(&ino) => reply.entry(&TTL, &tree.nodes[&ino].attr(ino), Generation(0)),
            None => reply.error(errno(libc::ENOENT)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.tree.lock().unwrap().nodes.get(&ino.0) {
            Some(n) => reply.attr(&TTL, &n.attr(ino.0)),
            None => reply.error(errno(libc::ENOENT)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut tree = self.tree.lock().unwrap();
        let Some(n) = tree.nodes.get_mut(&ino.0) else {
            return reply.error(errno(libc::ENOENT));
        };
        if let Some(size) = size {
            n.data.resize(size as usize, 0);
        }
        if let Some(mode) = mode {
            n.perm = (mode & 0o7777) as u16;
        }
        if let Some(t) = mtime {
            n.mtime = match t {
                fuser::TimeOrNow::SpecificTime(t) => t,
                fuser::TimeOrNow::Now => SystemTime::now(),
            };
        }
        reply.attr(&TTL, &n.attr(ino.0));
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let made =
            self.tree
                .lock()
                .unwrap()
                .make(parent.0, name, FileType::Directory, mode & !umask);
        match made {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let made =
            self.tree
                .lock()
                .unwrap()
                .make(parent.0, name, FileType::RegularFile, mode & !umask);
        match made {
            Ok(attr) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(0),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.tree.lock().unwrap().remove(parent.0, name, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.tree.lock().unwrap().remove(parent.0, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: fuser::OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let tree = self.tree.lock().unwrap();
        let Some(n) = tree.nodes.get(&ino.0) else {
            return reply.error(errno(libc::ENOENT));
        };
        let start = (offset as usize).min(n.data.len());
        let end = (start + size as usize).min(n.data.len());
        reply.data(&n.data[start..end]);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut tree = self.tree.lock().unwrap();
        let Some(n) = tree.nodes.get_mut(&ino.0) else {
            return reply.error(errno(libc::ENOENT));
        };
        if n.orphan {
            return reply.written(data.len() as u32);
        }
        let end = offset as usize + data.len();
        if n.data.len() < end {
            n.data.resize(end, 0);
        }
        n.data[offset as usize..end].copy_from_slice(data);
        n.mtime = SystemTime::now();
        reply.written(data.len() as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    /// The bytes are where they will stay.
    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _ds: bool, reply: ReplyEmpty) {
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let tree = self.tree.lock().unwrap();
        let Some(n) = tree.nodes.get(&ino.0) else {
            return reply.error(errno(libc::ENOENT));
        };
        let entries = [
            (ino.0, FileType::Directory, OsString::from(".")),
            (ROOT, FileType::Directory, OsString::from("..")),
        ]
        .into_iter()
        .chain(
            n.children
                .iter()
                .map(|(name, &i)| (i, tree.nodes[&i].kind, name.clone())),
        );
        for (k, (i, kind, name)) in entries.enumerate().skip(offset as usize) {
            if reply.add(INodeNo(i), k as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // Room as the machine's memory: this peer has no arena of its own.
        let free = rmemfs::size::mem_available().unwrap_or(8 << 30) / 4096;
        reply.statfs(free, free, free, 1 << 20, 1 << 20, 4096, 255, 4096);
    }
}

/// Mounts the in-memory file system at `dir` and serves it with `threads` threads until it
/// is unmounted (prints "ready" once mounted).
pub fn run(dir: &Path, threads: usize) -> Result<(), String> {
    use std::io::Write;
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("memfs".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    config.n_threads = Some(threads.max(1));
    config.clone_fd = threads > 1;
    let session = fuser::Session::new(MemFs::default(), dir, &config)
        .map_err(|e| format!("cannot mount memfs on {}: {e}", dir.display()))?;
    println!("ready");
    let _ = std::io::stdout().flush();
    session.run().map_err(|e| format!("memfs: {e}"))
}
