//! A file's requests: open and close, reads and writes, seeks for data, copies and
//! preallocation.

use super::*;

impl FuseFs {
    /// How the kernel treats a new handle: writes that bypass its cache when the pool is
    /// short of room (see [`Fs::direct_writes`]), or when the handle only writes on a shared
    /// volume; else cached.
    ///
    /// Why a shared volume's write-only handles write directly: its mount has no writeback
    /// cache, so the kernel sends each write at once anyway, but through the page cache it
    /// copies the bytes there first and splits a write at a page it fills only in part (a
    /// `tar x` file's two records took three requests); and the next open of the file on
    /// this mount drops those pages (close-to-open), so keeping them helps nothing. Directly,
    /// each `write(2)` is one request (`tar xf` of 3,000 files in 0.87 of the time,
    /// `lab/scripts/ab-shared.sh`). A handle that reads too stays cached: its reads use the
    /// pages its writes left, and only a handle that can read can map the file.
    pub(super) fn open_flags(&self, flags: i32) -> FopenFlags {
        let mode = crate::fs::OpenMode::from_flags(flags);
        let write_only_shared = mode.write && !mode.read && self.fs.is_shared();
        if mode.write && (write_only_shared || self.fs.direct_writes()) {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        }
    }
}

/// OPEN, contained here (not by the dispatch): on a shared volume the kernel's cache of the
/// file is dropped between the open and its answer.
pub(super) fn open(f: &FuseFs, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
    if !f.fs.is_shared() {
        return f.contain("open", req, || match f.fs.open(ino.0, flags.0) {
            Ok(fh) => reply.opened(FileHandle(fh), f.open_flags(flags.0)),
            Err(e) => reply.error(errno(&e)),
        });
    }
    // Close-to-open on a shared volume: the door caught up with other clients; their
    // sizes and bytes then replace what the kernel cached, before the open is answered
    // but after the door (a write of this file waiting there holds its pages' locks,
    // which the kernel's invalidation takes).
    let mut reply = Some(reply);
    let mut opened = None;
    f.contain("open", req, || match f.fs.open(ino.0, flags.0) {
        Ok(fh) => opened = Some(fh),
        Err(e) => reply.take().expect("not answered yet").error(errno(&e)),
    });
    match (opened, reply) {
        (Some(fh), Some(reply)) => {
            f.fs.forget_cached_inode(ino.0);
            reply.opened(FileHandle(fh), f.open_flags(flags.0))
        }
        // A contained panic: answered as any other.
        (None, Some(reply)) => reply.error(Errno::EIO),
        _ => {}
    }
}

pub(super) fn read(
    f: &FuseFs,
    ino: INodeNo,
    fh: FileHandle,
    offset: u64,
    size: u32,
    reply: ReplyData,
) {
    match f.fs.read_buf(ino.0, fh.0, offset, size) {
        Ok(data) => reply.data(data.bytes()),
        Err(e) => reply.error(errno(&e)),
    }
}

pub(super) fn write(
    f: &FuseFs,
    ino: INodeNo,
    fh: FileHandle,
    offset: u64,
    data: &[u8],
    who: Caller,
    reply: ReplyWrite,
) {
    // `data` lies in this event loop's request buffer, which lives as long as the
    // session: it can be registered and sent as it is.
    // SAFETY: `data` lies in one of fuser's request buffers, which stay mapped (and are
    // not written by the kernel or fuser while this request is handled) for the whole
    // session: the contract of `RequestBuffer::new`.
    let payload = unsafe { RequestBuffer::new(data) };
    match f.fs.write_in_place(ino.0, fh.0, offset, payload, who) {
        Ok(n) => reply.written(n),
        Err(e) => reply.error(errno(&e)),
    }
}

/// A close: where file locks are kept here, the closing process's POSIX locks on the
/// file go (any close drops them, as POSIX says); elsewhere there is nothing to do (and
/// the kernel, told ENOSYS, stops asking).
pub(super) fn flush(f: &FuseFs, ino: INodeNo, lock_owner: LockOwner, reply: ReplyEmpty) {
    if !f.fs.keeps_locks() {
        return nothing_to_sync(reply);
    }
    locks::release(&f.fs, ino.0, lock_owner.0, crate::fs::LockKind::Posix);
    // A shared volume's writes held back reach the engine before the close returns.
    match f.fs.send_shared_writes() {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

pub(super) fn release(
    f: &FuseFs,
    ino: INodeNo,
    fh: FileHandle,
    lock_owner: Option<LockOwner>,
    reply: ReplyEmpty,
) {
    // The kernel names an owner when this file took a `flock`, which is the file's own
    // (`locks::flock_owner`): let go before its handle goes.
    if lock_owner.is_some() {
        locks::release(
            &f.fs,
            ino.0,
            locks::flock_owner(fh),
            crate::fs::LockKind::Flock,
        );
    }
    f.fs.release(fh.0);
    reply.ok();
}

pub(super) fn lseek(
    f: &FuseFs,
    ino: INodeNo,
    fh: FileHandle,
    offset: i64,
    whence: i32,
    reply: ReplyLseek,
) {
    // SEEK_SET/CUR/END are the kernel's own; only data and holes reach a file system.
    let data = match whence {
        libc::SEEK_DATA => true,
        libc::SEEK_HOLE => false,
        _ => return reply.error(Errno::from_i32(libc::EINVAL)),
    };
    let Ok(offset) = u64::try_from(offset) else {
        return reply.error(Errno::from_i32(libc::ENXIO));
    };
    match f.fs.seek_data_hole(ino.0, fh.0, offset, data) {
        Ok(at) => reply.offset(at as i64),
        Err(e) => reply.error(errno(&e)),
    }
}

/// `from` and `to` are each a file, its handle and an offset in it.
pub(super) fn copy_file_range(
    f: &FuseFs,
    from: (INodeNo, FileHandle, u64),
    to: (INodeNo, FileHandle, u64),
    len: u64,
    who: Caller,
    reply: ReplyWrite,
) {
    // A reply carries a u32 count: copy at most that much per request (the kernel
    // asks again for the rest).
    let len = len.min(u32::MAX as u64 & !(crate::fs::BLOCK - 1));
    let r = f.fs.copy_file_range(
        from.0 .0, from.1 .0, from.2, to.0 .0, to.1 .0, to.2, len, who,
    );
    match r {
        Ok(n) => reply.written(n as u32),
        Err(e) => reply.error(errno(&e)),
    }
}

pub(super) fn poll(events: PollEvents, reply: ReplyPoll) {
    // Files in memory never block: always readable and writable, as on tmpfs.
    let ready =
        PollEvents::POLLIN | PollEvents::POLLOUT | PollEvents::POLLRDNORM | PollEvents::POLLWRNORM;
    reply.poll(events & ready);
}
