//! File locks through FUSE, on a shared volume only (elsewhere the kernel keeps them and
//! never asks): `fcntl` record locks (GETLK, SETLK, SETLKW) and `flock` (SETLK with
//! `FUSE_LK_FLOCK`). A POSIX owner's locks on a file go at its FLUSH (any close by the
//! process), a `flock` owner's at the RELEASE that names it.
//!
//! A blocking request that meets another owner's lock waits on its own thread, asking the
//! engine again every [`crate::config::LOCK_WAIT_POLL`] at most, so the FUSE workers go on
//! serving. (fuser answers the kernel's INTERRUPT with ENOSYS, so such a wait ends only with
//! the lock, or with an error when this client's session has ended.)

use super::reply::errno;
use crate::fs::{FileLock, Fs, HeldLock, LockKind, LockType};
use fuser::{Errno, ReplyEmpty, ReplyLock};
use std::sync::Arc;

/// The request's lock, or EINVAL for a type that is none of the three.
pub(super) fn file_lock(
    kind: LockKind,
    typ: i32,
    start: u64,
    end: u64,
    pid: u32,
) -> Option<FileLock> {
    let typ = match typ {
        libc::F_RDLCK => Some(LockType::Read),
        libc::F_WRLCK => Some(LockType::Write),
        libc::F_UNLCK => None,
        _ => return None,
    };
    Some(FileLock {
        kind,
        typ,
        start,
        end,
        pid,
    })
}

/// F_GETLK: the conflicting lock, or F_UNLCK over the asked range.
pub(super) fn test(fs: &Fs, ino: u64, owner: u64, lock: &FileLock, reply: ReplyLock) {
    match fs.test_lock(ino, owner, lock) {
        Ok(Some(held)) => reply.locked(held.start, held.end, type_code(&held), held.pid),
        Ok(None) => reply.locked(lock.start, lock.end, libc::F_UNLCK, 0),
        Err(e) => reply.error(errno(&e)),
    }
}

fn type_code(held: &HeldLock) -> i32 {
    match held.typ {
        LockType::Read => libc::F_RDLCK,
        LockType::Write => libc::F_WRLCK,
    }
}

/// SETLK/SETLKW (and `flock`): taken, refused with EAGAIN, or (`sleep`) waited for.
pub(super) fn set(
    fs: &Arc<Fs>,
    ino: u64,
    owner: u64,
    lock: FileLock,
    sleep: bool,
    reply: ReplyEmpty,
) {
    match fs.set_lock(ino, owner, &lock) {
        Ok(None) => granted(fs, &lock, reply),
        Ok(Some(_)) if !sleep => reply.error(Errno::from_i32(libc::EAGAIN)),
        Ok(Some(_)) => {
            let fs = fs.clone();
            let waiter = std::thread::Builder::new()
                .name("lock-wait".into())
                .spawn(move || wait(&fs, ino, owner, &lock, reply));
            if let Err(e) = waiter {
                log::error!("cannot start a thread to wait for a lock: {e}");
                // The reply went with the closure that never ran: fuser answers EIO.
            }
        }
        Err(e) => reply.error(errno(&e)),
    }
}

fn wait(fs: &Fs, ino: u64, owner: u64, lock: &FileLock, reply: ReplyEmpty) {
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        std::thread::sleep(pause);
        pause = (pause * 2).min(crate::config::LOCK_WAIT_POLL);
        match fs.set_lock(ino, owner, lock) {
            Ok(None) => return granted(fs, lock, reply),
            Ok(Some(_)) => continue,
            Err(e) => return reply.error(errno(&e)),
        }
    }
}

/// A lock taken: what other clients changed before they let it go is seen first (the
/// table caught up, the kernel told), as NFS revalidates its caches when a lock is taken.
/// (A lock request holds no directory lock: the kernel may be told of names here.)
fn granted(fs: &Fs, lock: &FileLock, reply: ReplyEmpty) {
    if lock.typ.is_some() && !fs.sync_kernel_shared() {
        log::warn!("a lock was taken, but the namespace could not be brought up to date");
    }
    reply.ok()
}

/// A POSIX owner's close of `ino` (FLUSH), or the release of a `flock` owner's file.
pub(super) fn release(fs: &Fs, ino: u64, owner: u64, kind: LockKind) {
    if let Err(e) = fs.release_locks(ino, owner, kind) {
        log::warn!(
            "releasing the locks of owner {owner:#x} on inode {ino}: {}",
            e.message
        );
    }
}
