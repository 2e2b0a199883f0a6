//! Between the core's types and fuser's: errnos, attributes, callers, times, and the replies
//! several handlers share.

use super::*;

pub(super) fn errno(e: &Error) -> Errno {
    if e.errno == libc::EIO {
        log::warn!("I/O error: {}", e.message);
    } else {
        log::debug!("{}", e.message);
    }
    Errno::from_i32(e.errno)
}

pub(super) fn file_type(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDevice => FileType::CharDevice,
        Kind::BlockDevice => FileType::BlockDevice,
    }
}

pub(super) fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.btime,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: crate::fs::BLOCK as u32,
        flags: 0,
    }
}

/// The caller of a creation, with the umask its request carries (applied in the core, where
/// a default ACL may overrule it).
pub(super) fn creator(req: &Request, umask: u32) -> Caller {
    Caller {
        umask,
        ..caller(req)
    }
}

pub(super) fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
        // Only creations carry one (and apply it in the core, where a default ACL may
        // overrule it).
        umask: 0,
        cap_fsetid: req.uid() == 0,
    }
}

pub(super) fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::SpecificTime(t) => SetTime::At(t),
        TimeOrNow::Now => SetTime::Now,
    }
}

/// Answers an entry: the inode's attributes and its FUSE generation (`generation` of its
/// number).
pub(super) fn entry(
    reply: ReplyEntry,
    ttl: &std::time::Duration,
    r: crate::error::Result<Attr>,
    generation: impl Fn(u64) -> u64,
) {
    match r {
        Ok(a) => reply.entry(ttl, &file_attr(&a), Generation(generation(a.ino))),
        Err(e) => reply.error(errno(&e)),
    }
}

pub(super) fn empty(reply: ReplyEmpty, r: crate::error::Result<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

/// FLUSH (every `close`), FSYNCDIR, and FSYNC where nothing waits behind: ENOSYS, so the
/// kernel stops sending them and saves a round trip per close and per fsync. The daemon has
/// nothing to do at those points: metadata lives in its memory, and a WRITE is answered once
/// every copy holds the data (write-behind aside, whose FSYNC is answered: `data::behind`).
/// What they must guarantee the kernel does before it would ask (and also once it no longer
/// asks): it writes back the file's dirty pages and its times and waits for the answers, and
/// returns an error any of those writes met. POSIX locks are the kernel's (no GETLK/SETLK
/// here), so no lock waits for FLUSH's lock owner either.
pub(super) fn nothing_to_sync(reply: ReplyEmpty) {
    reply.error(Errno::from_i32(libc::ENOSYS));
}

/// FSYNC and FSYNCDIR: on a volume, the journal's barrier (every metadata change so far
/// committed on every live journal copy); without one, [`nothing_to_sync`].
pub(super) fn sync(fs: &crate::fs::Fs, reply: ReplyEmpty) {
    answer_sync(fs.sync(), reply)
}

/// FSYNC: [`crate::fs::Fs::fsync`] (the file's writes answered before they were sent, then
/// the volume's barrier), or [`nothing_to_sync`].
pub(super) fn fsync(fs: &crate::fs::Fs, ino: u64, reply: ReplyEmpty) {
    answer_sync(fs.fsync(ino), reply)
}

fn answer_sync(synced: Option<crate::error::Result<()>>, reply: ReplyEmpty) {
    match synced {
        None => nothing_to_sync(reply),
        Some(Ok(())) => reply.ok(),
        Some(Err(e)) => reply.error(errno(&e)),
    }
}

pub(super) fn xattr(reply: ReplyXattr, r: crate::error::Result<Vec<u8>>, size: u32) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(Errno::from_i32(libc::ERANGE)),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(errno(&e)),
    }
}
