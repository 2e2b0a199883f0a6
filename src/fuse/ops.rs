//! The dispatch table: fuser's `Filesystem`, each request contained (see
//! [`FuseFs::contain`]) and handed to the room of its concern (`dir`, `file`, `attr`, `locks`,
//! `ioctl`, `init`); a request that is only a translation to [`Fs`] is answered here.

use super::*;

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
        self.negotiate(config);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.contain("lookup", req, || {
            let found = self.fs.lookup(parent.0, name.as_bytes());
            entry(reply, &self.ttl, found, self.gen());
        });
    }

    fn forget(&self, req: &Request, ino: INodeNo, nlookup: u64) {
        self.contain("forget", req, || self.fs.forget(ino.0, nlookup));
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.contain("getattr", req, || attr::getattr(self, ino, reply));
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
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
            ctime,
        };
        self.contain("setattr", req, || {
            attr::setattr(self, req, ino, &set, reply)
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
        let who = creator(req, umask);
        self.contain("mknod", req, || {
            dir::mknod(self, parent, name, mode, rdev, who, reply)
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
        let who = creator(req, umask);
        self.contain("mkdir", req, || {
            dir::mkdir(self, parent, name, mode, who, reply)
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
            dir::symlink(self, req, parent, link_name, target, reply)
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
            dir::rename(
                self,
                req,
                (parent, name),
                (newparent, newname),
                flags,
                reply,
            )
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
            dir::link(self, ino, newparent, newname, reply)
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        file::open(self, req, ino, flags, reply)
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
            file::read(self, ino, fh, offset, size, reply)
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
            file::write(self, ino, fh, offset, data, who, reply)
        });
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.contain("flush", req, || file::flush(self, ino, lock_owner, reply));
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
            file::release(self, ino, fh, lock_owner, reply)
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
            self.set_lock(req, ino, lock_owner.0, lock, sleep, reply)
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
        fh: FileHandle,
        _lock_owner: LockOwner,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        self.contain("flock", req, || {
            let lock = locks::file_lock(crate::fs::LockKind::Flock, typ, 0, u64::MAX, pid);
            self.set_lock(req, ino, locks::flock_owner(fh), lock, sleep, reply)
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
        self.contain("opendir", req, || dir::opendir(self, ino, reply));
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        self.contain("readdir", req, || {
            dir::readdir(self, ino, fh, offset, reply)
        });
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.contain("readdirplus", req, || {
            dir::readdirplus(self, ino, fh, offset, reply)
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
        self.contain("statfs", req, || attr::statfs(self, reply));
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
            let set = self
                .fs
                .setxattr(ino.0, name.as_bytes(), value, flags, caller(req));
            empty(reply, set);
        });
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.contain("getxattr", req, || {
            let name = name.as_bytes();
            if figures::reads_report(ino.0, name) {
                return xattr(reply, Ok((self.report)(name == STATS_JSON_XATTR)), size);
            }
            xattr(reply, self.fs.getxattr(ino.0, name), size);
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
        let who = creator(req, umask);
        self.contain("create", req, || {
            dir::create(self, parent, Some(name), mode, flags, who, reply)
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
        let who = creator(req, umask);
        self.contain("tmpfile", req, || {
            dir::create(self, parent, None, mode, flags, who, reply)
        });
    }

    fn statx(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: Option<FileHandle>,
        _flags: u32,
        _mask: u32,
        reply: ReplyStatx,
    ) {
        self.contain("statx", req, || attr::statx(self, ino, reply));
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
            file::lseek(self, ino, fh, offset, whence, reply)
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
        let (from, to) = ((ino_in, fh_in, offset_in), (ino_out, fh_out, offset_out));
        self.contain("copy_file_range", req, || {
            file::copy_file_range(self, from, to, len, caller(req), reply)
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
        self.contain("poll", req, || file::poll(events, reply));
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
            let who = caller(req);
            let done = self.fs.fallocate(ino.0, fh.0, offset, length, mode, who);
            empty(reply, done);
        });
    }
}
