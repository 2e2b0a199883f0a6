//! File locks through FUSE, on a shared volume only (elsewhere the kernel keeps them and
//! never asks): `fcntl` record locks (GETLK, SETLK, SETLKW) and `flock` (SETLK with
//! `FUSE_LK_FLOCK`). A POSIX owner's locks on a file go at its FLUSH (any close by the
//! process), a `flock` owner's at the RELEASE that names it.
//!
//! A blocking request that meets another owner's lock waits on its own thread, asking the
//! engine again every [`crate::config::LOCK_WAIT_POLL`] at most, so the FUSE workers go on
//! serving. A signal to the waiting process ends the wait: the kernel sends an INTERRUPT
//! naming the request, and the wait answers EINTR at its next look (a process killed while
//! waiting is otherwise unkillable: the kernel waits out a request the daemon has read).

use super::reply::errno;
use crate::fs::{FileLock, Fs, HeldLock, LockKind, LockType};
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::{Arc, Mutex};
use fuser::{Errno, ReplyEmpty, ReplyLock};
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

/// How long an interrupt of a request that is not waiting for a lock is kept, in case its
/// request is about to wait (the INTERRUPT comes on /dev/fuse, the request perhaps on a ring
/// thread that has not reached the wait yet). Interrupts of other requests (which end soon
/// on their own) are dropped after it.
const EARLY_INTERRUPT_KEPT: std::time::Duration = std::time::Duration::from_secs(1);
/// At most this many such interrupts are kept (a burst of signals to busy processes).
const EARLY_INTERRUPTS_MAX: usize = 256;

/// Blocked lock requests an interrupt may end, by the kernel's request id; and interrupts
/// that came before their request was waiting.
#[derive(Default)]
pub(super) struct Interrupts {
    state: Mutex<InterruptState>,
}

#[derive(Default)]
struct InterruptState {
    waiting: HashMap<u64, Arc<AtomicBool>>,
    early: VecDeque<(u64, Instant)>,
}

impl Interrupts {
    /// The kernel's INTERRUPT of request `unique`.
    pub(super) fn interrupt(&self, unique: u64) {
        let mut st = self.state.lock();
        if let Some(flag) = st.waiting.get(&unique) {
            flag.store(true, Ordering::SeqCst);
            return;
        }
        let now = Instant::now();
        while st.early.len() >= EARLY_INTERRUPTS_MAX
            || st
                .early
                .front()
                .is_some_and(|(_, at)| now.duration_since(*at) > EARLY_INTERRUPT_KEPT)
        {
            st.early.pop_front();
        }
        st.early.push_back((unique, now));
    }

    /// Request `unique` is about to wait: its flag, already set if it was interrupted.
    fn waiting(&self, unique: u64) -> Arc<AtomicBool> {
        let mut st = self.state.lock();
        let early = st.early.iter().position(|(u, _)| *u == unique);
        if let Some(i) = early {
            st.early.remove(i);
        }
        let flag = Arc::new(AtomicBool::new(early.is_some()));
        st.waiting.insert(unique, flag.clone());
        flag
    }

    fn done(&self, unique: u64) {
        self.state.lock().waiting.remove(&unique);
    }
}

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
/// A lock request as the kernel sent it.
pub(super) struct LockRequest {
    pub unique: u64,
    pub ino: u64,
    pub owner: u64,
    pub lock: FileLock,
    /// SETLKW or a blocking `flock`: wait for a conflicting lock to go.
    pub sleep: bool,
}

pub(super) fn set(fs: &Arc<Fs>, interrupts: &Arc<Interrupts>, r: LockRequest, reply: ReplyEmpty) {
    match fs.set_lock(r.ino, r.owner, &r.lock) {
        Ok(None) => granted(fs, &r.lock, reply),
        Ok(Some(_)) if !r.sleep => reply.error(Errno::from_i32(libc::EAGAIN)),
        Ok(Some(_)) => {
            let (fs, interrupts) = (fs.clone(), interrupts.clone());
            let interrupted = interrupts.waiting(r.unique);
            let waiter = std::thread::Builder::new()
                .name("lock-wait".into())
                .spawn(move || {
                    wait(&fs, &r, &interrupted, reply);
                    interrupts.done(r.unique);
                });
            if let Err(e) = waiter {
                log::error!("cannot start a thread to wait for a lock: {e}");
                // The reply went with the closure that never ran: fuser answers EIO.
            }
        }
        Err(e) => reply.error(errno(&e)),
    }
}

fn wait(fs: &Fs, r: &LockRequest, interrupted: &AtomicBool, reply: ReplyEmpty) {
    let mut pause = crate::sync::Backoff::new(
        std::time::Duration::from_millis(1),
        crate::config::LOCK_WAIT_POLL,
    );
    loop {
        pause.sleep();
        if interrupted.load(Ordering::SeqCst) {
            return reply.error(Errno::from_i32(libc::EINTR));
        }
        match fs.set_lock(r.ino, r.owner, &r.lock) {
            Ok(None) => return granted(fs, &r.lock, reply),
            Ok(Some(_)) => continue,
            Err(e) => return reply.error(errno(&e)),
        }
    }
}

/// A lock taken: what other clients changed before they let it go is seen first, as NFS
/// revalidates its caches when a lock is taken: the table caught up ([`Fs::set_lock`]
/// answers only then), and the answer goes once the kernel was told what to forget, from
/// the thread that tells it. The request's thread does not wait for that: the kernel's
/// invalidation of a name waits for its directory's lock, which a lookup may hold while it
/// waits for a ring entry that this request would hold (so the answer is deferred, and the
/// ring adds entries while answers are).
fn granted(fs: &Fs, lock: &FileLock, reply: ReplyEmpty) {
    if lock.typ.is_none() {
        return reply.ok();
    }
    fs.tell_kernel_then(Box::new(move |told| {
        if !told {
            log::warn!("a lock was taken, but the kernel could not be told what changed");
        }
        reply.ok()
    }));
}

/// Who holds a `flock`: the open file (its handle here), never the kernel's lock owner. A
/// flock belongs to the open file description, and the kernel names it by the address of
/// its `struct file`, which a new open may be given while the RELEASE of the old one (sent
/// after `close()` returned) is still on its way: the new file's lock would count as the
/// old one's, already held, and that RELEASE would then let it go while its process holds it
/// (another client took the lock with it held: CI saw a shared log lose a line so). A handle
/// is never given twice.
pub(super) fn flock_owner(fh: fuser::FileHandle) -> u64 {
    fh.0
}

/// A POSIX owner's close of `ino` (FLUSH), or the release of a `flock` owner's file.
pub(super) fn release(fs: &Fs, ino: u64, owner: u64, kind: LockKind) {
    #[cfg(feature = "testing")]
    if kind == LockKind::Flock {
        flock_release_gate();
    }
    if let Err(e) = fs.release_locks(ino, owner, kind) {
        log::warn!(
            "releasing the locks of owner {owner:#x} on inode {ino}: {}",
            e.message
        );
    }
}

/// Tests only (the mount tests' build): while the file named by
/// `RMEMFS_TESTING_FLOCK_RELEASE_GATE` exists, a flock's release waits (30 s at most), so a
/// mount test holds a closed file's RELEASE back while its process opens the file again: a
/// barrier the test lifts, never a pause.
#[cfg(feature = "testing")]
fn flock_release_gate() {
    let Some(gate) = std::env::var_os("RMEMFS_TESTING_FLOCK_RELEASE_GATE") else {
        return;
    };
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    while std::path::Path::new(&gate).exists() && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

impl super::FuseFs {
    /// SETLK/SETLKW and `flock`: `lock` as parsed (none: EINVAL), taken for `owner` (see
    /// [`flock_owner`]).
    pub(super) fn set_lock(
        &self,
        req: &fuser::Request,
        ino: fuser::INodeNo,
        owner: u64,
        lock: Option<FileLock>,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let Some(lock) = lock else {
            return reply.error(Errno::EINVAL);
        };
        let r = LockRequest {
            unique: req.unique().0,
            ino: ino.0,
            owner,
            lock,
            sleep,
        };
        set(&self.fs, &self.interrupts, r, reply)
    }
}
