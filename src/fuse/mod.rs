//! The FUSE adapter: the only module that touches fuser. Every handler calls `fs` and replies
//! exactly once, with the result or its errno.
//!
//! Every handler runs inside [`FuseFs::contain`]: a panic (a bug) fails that one request with
//! EIO (fuser answers EIO for a reply dropped unsent, and the unwinding drops it), is logged
//! with the request, and the worker goes on serving. Without it one bug ended the session and
//! took every file of the mount with it.

mod connection;
mod ioctl;
mod locks;
mod reply;

pub use connection::FUSECTL;
use ioctl::inode_flags_ioctl;
use reply::{
    caller, creator, empty, entry, errno, file_attr, file_type, nothing_to_sync, set_time, sync,
    xattr,
};

use crate::data::RequestBuffer;
use crate::error::Error;
use crate::fs::{Attr, Caller, Fs, SetAttr, SetTime};
use crate::meta::Kind;
use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType,
    Filesystem, FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner,
    OpenFlags, PollEvents, PollFlags, PollNotifier, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek,
    ReplyOpen, ReplyPoll, ReplyStatfs, ReplyStatx, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

/// The requests that change nothing (a freeze lets them through). Every other one may change
/// the namespace or a file's data (a release or forget may drop an unlinked file).
const READ_ONLY_OPS: [&str; 21] = [
    "lookup",
    "getattr",
    "statx",
    "read",
    "readdir",
    "readdirplus",
    "opendir",
    "releasedir",
    "readlink",
    "statfs",
    "getxattr",
    "listxattr",
    "access",
    "lseek",
    "poll",
    "fsync",
    "fsyncdir",
    // File locks and FLUSH (which releases them) change no file.
    "getlk",
    "setlk",
    "flock",
    "flush",
];

/// The bit the kernel sets in the id of a request it sends again (FUSE_NOTIFY_RESEND).
const FUSE_UNIQUE_RESEND: u64 = 1 << 63;

/// Largest write request we ask the kernel for (its cap on current kernels is 1 MiB).
const MAX_WRITE: u32 = crate::config::IO_SIZE as u32;

/// The fuser file system: a thin shell around [`Fs`].
pub struct FuseFs {
    fs: Arc<Fs>,
    offers: Offers,
    /// The fuse control file system's `abort` file of this mount's connection, known once it
    /// is mounted ([`FuseFs::connection`]): how a failed io_uring queue ends the connection.
    abort_file: Arc<std::sync::OnceLock<std::path::PathBuf>>,
    /// How long the kernel may keep entries and attributes ([`crate::config::ATTR_TTL`];
    /// shorter on a shared volume).
    ttl: std::time::Duration,
    /// Each inode's FUSE generation on a connection kept across daemons (see
    /// `mount::keeper`); none: every generation is 0.
    generations: Option<Generations>,
    /// Lock requests waiting on their own threads, which an INTERRUPT ends.
    interrupts: Arc<locks::Interrupts>,
}

/// An inode's FUSE generation, by number.
pub type Generations = Box<dyn Fn(u64) -> u64 + Send + Sync>;

/// What the mount asks of the kernel at INIT beyond what it always asks.
#[derive(Debug, Clone, Copy)]
pub struct Offers {
    /// READDIRPLUS (`-o nordirplus`: no).
    pub readdirplus: bool,
    /// FUSE over io_uring (`-o io_uring`).
    pub io_uring: bool,
}

impl FuseFs {
    pub fn new(fs: Arc<Fs>, offers: Offers) -> FuseFs {
        let ttl = if fs.is_shared() {
            crate::config::SHARED_CACHE_TTL
        } else {
            crate::config::ATTR_TTL
        };
        FuseFs {
            fs,
            ttl,
            offers,
            abort_file: Arc::default(),
            generations: None,
            interrupts: Arc::default(),
        }
    }

    /// Answers each inode's FUSE generation with `generations` (of its number).
    pub fn with_generations(mut self, generations: Generations) -> FuseFs {
        self.generations = Some(generations);
        self
    }

    /// The FUSE generation of inode `ino`.
    fn generation(&self, ino: u64) -> u64 {
        self.generations.as_ref().map_or(0, |g| g(ino))
    }

    /// SETLK/SETLKW and `flock`: `lock` as parsed (none: EINVAL).
    fn set_lock(
        &self,
        req: &Request,
        ino: INodeNo,
        owner: LockOwner,
        lock: Option<crate::fs::FileLock>,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let Some(lock) = lock else {
            return reply.error(Errno::EINVAL);
        };
        let r = locks::LockRequest {
            unique: req.unique().0,
            ino: ino.0,
            owner: owner.0,
            lock,
            sleep,
        };
        locks::set(&self.fs, &self.interrupts, r, reply)
    }

    /// [`FuseFs::generation`], to hand to a reply.
    fn gen(&self) -> impl Fn(u64) -> u64 + '_ {
        move |ino| self.generation(ino)
    }

    /// How the kernel treats a new handle: writes that bypass its cache when the pool is
    /// short of room (see [`Fs::direct_writes`]), else cached.
    /// Answers a create or tmpfile: the new inode, open with `flags`.
    fn created(&self, reply: ReplyCreate, made: crate::error::Result<(Attr, u64)>, flags: i32) {
        match made {
            Ok((a, fh)) => reply.created(
                &self.ttl,
                &file_attr(&a),
                Generation(self.generation(a.ino)),
                FileHandle(fh),
                self.open_flags(flags),
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn open_flags(&self, flags: i32) -> FopenFlags {
        if crate::fs::OpenMode::from_flags(flags).write && self.fs.direct_writes() {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        }
    }

    /// Runs one handler; a panic inside it becomes EIO for this request only. A request
    /// that may change the file system waits while it is frozen (see [`Fs::freeze`]).
    fn contain(&self, op: &'static str, req: &Request, handler: impl FnOnce()) {
        let _admitted = (!READ_ONLY_OPS.contains(&op)).then(|| self.fs.admit_change());
        let start = std::time::Instant::now();
        let figures = self.fs.figures();
        figures.in_flight.fetch_add(1, Ordering::Relaxed);
        if req.unique().0 & FUSE_UNIQUE_RESEND != 0 {
            figures.resent.fetch_add(1, Ordering::Relaxed);
        }
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(handler));
        figures.in_flight.fetch_sub(1, Ordering::Relaxed);
        figures
            .requests
            .record(op, start.elapsed().as_nanos() as u64);
        if let Err(panic) = outcome {
            let why = crate::error::panic_message(&*panic);
            self.fs.count_contained_panic();
            log::error!(
                "bug: {op} (request {}, pid {}, uid {}) panicked: {why}; answered EIO, the mount \
                 goes on",
                req.unique().0,
                req.pid(),
                req.uid()
            );
        }
    }
}

impl Filesystem for FuseFs {
    /// An io_uring queue that cannot be served would hold every request made on its CPU
    /// forever: the connection is aborted (callers get an error, the session ends as if
    /// unmounted, the daemon exits cleanly), not the process.
    fn ring_failed(&self, queue: u16, error: &std::io::Error) -> bool {
        log::error!(
            "FUSE over io_uring: queue {queue} failed ({error}); aborting the FUSE connection \
             (the mount then answers ENOTCONN; `rmemfs mount` on it mounts again)"
        );
        self.abort_connection()
    }

    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_readahead(MAX_WRITE);
        // POSIX ACLs: the kernel enforces them and asks for them by getxattr; creations
        // arrive unmasked (the umask apart), as a default ACL may overrule the umask.
        if self.fs.acl_enabled() {
            let acl = InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK;
            if let Err(missing) = config.add_capabilities(acl) {
                log::warn!("the kernel lacks {missing:?}: POSIX ACLs are off");
            }
        }
        // The writeback cache: the kernel gathers small writes in its page cache and sends
        // them back in large requests; `fsync` and `close` wait for them (and a write
        // returns only when every copy holds it).
        if self.fs.writeback_enabled() {
            if let Err(missing) = config.add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE) {
                log::warn!("the kernel lacks {missing:?}: writes go through one by one");
            }
            // Handles opened while the pool is short of room bypass the cache; shared
            // mmap of them must still work (SQLite's -shm files).
            if let Err(missing) = config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP) {
                log::info!("the kernel lacks {missing:?}");
            }
        }
        // Set-ID bits are cleared here on write, truncate and chown (`fs`): the kernel
        // then stops asking for security.capability before every write (its inodes may be
        // marked S_NOSEC), and flags writers without CAP_FSETID.
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2) {
            log::warn!("the kernel lacks {missing:?}: every write costs a getxattr");
        }
        // Lookups and creations in one directory may run in parallel (the metadata lock
        // orders them here), and symlink targets, which never change, may be cached.
        let more = InitFlags::FUSE_PARALLEL_DIROPS | InitFlags::FUSE_CACHE_SYMLINKS;
        if let Err(missing) = config.add_capabilities(more) {
            log::info!("the kernel lacks {missing:?}");
        }
        // READDIRPLUS: a directory read carries each entry's attributes, so `ls -l` and
        // `find -ls` need no LOOKUP per entry. AUTO lets the kernel use it where lookups
        // follow directory reads (the first read of a directory, then as advised), so a
        // plain `ls` of a huge directory does not instantiate an inode per entry.
        if self.offers.readdirplus {
            let plus = InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO;
            if let Err(missing) = config.add_capabilities(plus) {
                log::info!("the kernel lacks {missing:?}");
            }
        }
        // FUSE over io_uring: requests come through per-CPU rings instead of /dev/fuse reads
        // and writes, a third of the round trip here (fuser's ring threads serve them).
        let ring = self.offers.io_uring
            && match config.add_capabilities(InitFlags::FUSE_OVER_IO_URING) {
                Ok(()) => true,
                Err(missing) => {
                    log::warn!("the kernel lacks {missing:?}: requests come through /dev/fuse");
                    false
                }
            };
        self.fs
            .set_fuse_transport(if ring { "io_uring" } else { "/dev/fuse" });
        // A shared volume's file locks must hold across clients: the kernel asks for them
        // (elsewhere it keeps them itself, exact for one client and free).
        if self.fs.keeps_locks() {
            let locks = InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS;
            if let Err(missing) = config.add_capabilities(locks) {
                log::warn!("the kernel lacks {missing:?}: file locks hold on this client only");
            }
        }
        // File handles (NFS export, name_to_handle_at) decode through LOOKUP of "." and "..".
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_EXPORT_SUPPORT) {
            log::warn!("the kernel lacks {missing:?}: file handles go stale");
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.contain("lookup", req, || {
            entry(
                reply,
                &self.ttl,
                self.fs.lookup(parent.0, name.as_bytes()),
                self.gen(),
            );
        });
    }

    fn forget(&self, req: &Request, ino: INodeNo, nlookup: u64) {
        self.contain("forget", req, || {
            self.fs.forget(ino.0, nlookup);
        });
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.contain("getattr", req, || match self.fs.getattr(ino.0) {
            Ok(a) => reply.attr(&self.ttl, &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.contain("setattr", req, || {
            let set = SetAttr {
                mode,
                uid,
                gid,
                size,
                atime: atime.map(set_time),
                mtime: mtime.map(set_time),
                ctime,
            };
            match self.fs.setattr(ino.0, &set, caller(req)) {
                Ok(a) => reply.attr(&self.ttl, &file_attr(&a)),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        self.contain("readlink", req, || match self.fs.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.contain("mknod", req, || {
            let who = creator(req, umask);
            entry(
                reply,
                &self.ttl,
                self.fs.mknod(parent.0, name.as_bytes(), mode, rdev, who),
                self.gen(),
            );
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.contain("mkdir", req, || {
            let who = creator(req, umask);
            entry(
                reply,
                &self.ttl,
                self.fs.mkdir(parent.0, name.as_bytes(), mode, who),
                self.gen(),
            );
        });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.contain("unlink", req, || {
            empty(reply, self.fs.unlink(parent.0, name.as_bytes()));
        });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.contain("rmdir", req, || {
            empty(reply, self.fs.rmdir(parent.0, name.as_bytes()));
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.contain("symlink", req, || {
            entry(
                reply,
                &self.ttl,
                self.fs.symlink(
                    parent.0,
                    link_name.as_bytes(),
                    target.as_os_str().as_bytes(),
                    caller(req),
                ),
                self.gen(),
            );
        });
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.contain("rename", req, || {
            empty(
                reply,
                self.fs.rename(
                    parent.0,
                    name.as_bytes(),
                    newparent.0,
                    newname.as_bytes(),
                    flags.bits(),
                    caller(req),
                ),
            );
        });
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.contain("link", req, || {
            entry(
                reply,
                &self.ttl,
                self.fs.link(ino.0, newparent.0, newname.as_bytes()),
                self.gen(),
            );
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if !self.fs.is_shared() {
            return self.contain("open", req, || match self.fs.open(ino.0, flags.0) {
                Ok(fh) => reply.opened(FileHandle(fh), self.open_flags(flags.0)),
                Err(e) => reply.error(errno(&e)),
            });
        }
        // Close-to-open on a shared volume: the door caught up with other clients; their
        // sizes and bytes then replace what the kernel cached, before the open is answered
        // but after the door (a write of this file waiting there holds its pages' locks,
        // which the kernel's invalidation takes).
        let mut reply = Some(reply);
        let mut opened = None;
        self.contain("open", req, || match self.fs.open(ino.0, flags.0) {
            Ok(fh) => opened = Some(fh),
            Err(e) => reply.take().expect("not answered yet").error(errno(&e)),
        });
        match (opened, reply) {
            (Some(fh), Some(reply)) => {
                self.fs.forget_cached_inode(ino.0);
                reply.opened(FileHandle(fh), self.open_flags(flags.0))
            }
            // A contained panic: answered as any other.
            (None, Some(reply)) => reply.error(Errno::EIO),
            _ => {}
        }
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.contain("read", req, || {
            match self.fs.read_buf(ino.0, fh.0, offset, size) {
                Ok(data) => reply.data(data.bytes()),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // The kernel flags a writer without CAP_FSETID (FUSE_HANDLE_KILLPRIV_V2).
        let who = Caller {
            cap_fsetid: !write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID),
            ..caller(req)
        };
        self.contain("write", req, || {
            // `data` lies in this event loop's request buffer, which lives as long as the
            // session: it can be registered and sent as it is.
            // SAFETY: `data` lies in one of fuser's request buffers, which stay mapped (and are
            // not written by the kernel or fuser while this request is handled) for the whole
            // session: the contract of `RequestBuffer::new`.
            let payload = unsafe { RequestBuffer::new(data) };
            match self.fs.write_in_place(ino.0, fh.0, offset, payload, who) {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    /// A close: where file locks are kept here, the closing process's POSIX locks on the
    /// file go (any close drops them, as POSIX says); elsewhere there is nothing to do (and
    /// the kernel, told ENOSYS, stops asking).
    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.contain("flush", req, || {
            if !self.fs.keeps_locks() {
                return nothing_to_sync(reply);
            }
            locks::release(&self.fs, ino.0, lock_owner.0, crate::fs::LockKind::Posix);
            reply.ok();
        });
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.contain("release", req, || {
            // The kernel names the owner when this file took a `flock`.
            if let Some(owner) = lock_owner {
                locks::release(&self.fs, ino.0, owner.0, crate::fs::LockKind::Flock);
            }
            self.fs.release(fh.0);
            reply.ok();
        });
    }

    fn getlk(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        self.contain("getlk", req, || {
            match locks::file_lock(crate::fs::LockKind::Posix, typ, start, end, pid) {
                Some(lock) => locks::test(&self.fs, ino.0, lock_owner.0, &lock, reply),
                None => reply.error(Errno::EINVAL),
            }
        });
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        self.contain("setlk", req, || {
            let lock = locks::file_lock(crate::fs::LockKind::Posix, typ, start, end, pid);
            self.set_lock(req, ino, lock_owner, lock, sleep, reply)
        });
    }

    /// Only a mount that keeps file locks here takes interrupts (they end a blocked lock
    /// wait; every other request ends soon on its own). Elsewhere ENOSYS, and the kernel
    /// sends no more.
    fn interrupt(&self, _req: &Request, unique: fuser::RequestId) -> Result<(), Errno> {
        if !self.fs.keeps_locks() {
            return Err(Errno::ENOSYS);
        }
        self.interrupts.interrupt(unique.0);
        Ok(())
    }

    fn flock(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        self.contain("flock", req, || {
            let lock = locks::file_lock(crate::fs::LockKind::Flock, typ, 0, u64::MAX, pid);
            self.set_lock(req, ino, lock_owner, lock, sleep, reply)
        });
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.contain("fsync", req, || reply::fsync(&self.fs, ino.0, reply));
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.contain("opendir", req, || match self.fs.opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.contain("readdir", req, || {
            let res = self.fs.readdir(ino.0, fh.0, offset, &mut |e| {
                !reply.add(
                    INodeNo(e.ino),
                    e.offset,
                    file_type(e.kind),
                    OsStr::from_bytes(&e.name),
                )
            });
            match res {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.contain("readdirplus", req, || {
            let res = self.fs.readdirplus(ino.0, fh.0, offset, &mut |e, a| {
                !reply.add(
                    INodeNo(e.ino),
                    e.offset,
                    OsStr::from_bytes(&e.name),
                    &self.ttl,
                    &file_attr(a),
                    Generation(self.generation(e.ino)),
                )
            });
            match res {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn releasedir(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.contain("releasedir", req, || {
            self.fs.releasedir(fh.0);
            reply.ok();
        });
    }

    fn fsyncdir(
        &self,
        req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.contain("fsyncdir", req, || sync(&self.fs, reply));
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.contain("statfs", req, || {
            let s = self.fs.statfs();
            reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_free,
                s.files,
                s.files_free,
                s.block_size,
                s.name_max,
                s.block_size,
            );
        });
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        // The fault hook's adapter-side fault: an io_uring queue fails.
        #[cfg(feature = "testing")]
        if name.as_bytes() == crate::fs::INJECT_PANIC_XATTR && value == b"ring" {
            fuser::fail_a_ring_for_test();
            reply.ok();
            return;
        }
        self.contain("setxattr", req, || {
            empty(
                reply,
                self.fs
                    .setxattr(ino.0, name.as_bytes(), value, flags, caller(req)),
            );
        });
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.contain("getxattr", req, || {
            xattr(reply, self.fs.getxattr(ino.0, name.as_bytes()), size);
        });
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.contain("listxattr", req, || {
            xattr(reply, self.fs.listxattr(ino.0), size);
        });
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.contain("removexattr", req, || {
            empty(reply, self.fs.removexattr(ino.0, name.as_bytes()));
        });
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.contain("access", req, || {
            empty(reply, self.fs.access(ino.0, mask.bits(), caller(req)));
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.contain("create", req, || {
            let who = creator(req, umask);
            let made = self.fs.create(parent.0, name.as_bytes(), mode, flags, who);
            self.created(reply, made, flags);
        });
    }

    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.contain("tmpfile", req, || {
            let who = creator(req, umask);
            let made = self.fs.tmpfile(parent.0, mode, flags, who);
            self.created(reply, made, flags);
        });
    }

    /// Asked when a caller wants the birth time (the basic stats come by `getattr`).
    fn statx(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: Option<FileHandle>,
        _flags: u32,
        _mask: u32,
        reply: ReplyStatx,
    ) {
        self.contain("statx", req, || match self.fs.getattr(ino.0) {
            Ok(a) => reply.statx(&self.ttl, &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn lseek(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.contain("lseek", req, || {
            // SEEK_SET/CUR/END are the kernel's own; only data and holes reach a file system.
            let data = match whence {
                libc::SEEK_DATA => true,
                libc::SEEK_HOLE => false,
                _ => return reply.error(Errno::from_i32(libc::EINVAL)),
            };
            let Ok(offset) = u64::try_from(offset) else {
                return reply.error(Errno::from_i32(libc::ENXIO));
            };
            match self.fs.seek_data_hole(ino.0, fh.0, offset, data) {
                Ok(at) => reply.offset(at as i64),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.contain("copy_file_range", req, || {
            // A reply carries a u32 count: copy at most that much per request (the kernel
            // asks again for the rest).
            let len = len.min(u32::MAX as u64 & !(crate::fs::BLOCK - 1));
            let r = self.fs.copy_file_range(
                ino_in.0,
                fh_in.0,
                offset_in,
                ino_out.0,
                fh_out.0,
                offset_out,
                len,
                caller(req),
            );
            match r {
                Ok(n) => reply.written(n as u32),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn poll(
        &self,
        req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ph: PollNotifier,
        events: PollEvents,
        _flags: PollFlags,
        reply: ReplyPoll,
    ) {
        self.contain("poll", req, || {
            // Files in memory never block: always readable and writable, as on tmpfs.
            let ready = PollEvents::POLLIN
                | PollEvents::POLLOUT
                | PollEvents::POLLRDNORM
                | PollEvents::POLLWRNORM;
            reply.poll(events & ready);
        });
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        self.contain("ioctl", req, || {
            match inode_flags_ioctl(&self.fs, ino.0, cmd, in_data) {
                Ok(out) => reply.ioctl(0, &out),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.contain("fallocate", req, || {
            empty(
                reply,
                self.fs
                    .fallocate(ino.0, fh.0, offset, length, mode, caller(req)),
            );
        });
    }
}
