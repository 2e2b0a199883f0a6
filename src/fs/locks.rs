//! File locks (`fcntl` record locks and `flock`) on a shared volume, where they must hold
//! across clients. A private mount keeps none here: the kernel keeps them (the FUSE adapter
//! does not offer lock requests), which is exact for one client and costs nothing.
//!
//! The keeper ([`LockKeeper`], a shared volume's client) holds them in the metadata engine,
//! so a lock taken on one client excludes the others, and an evicted client's locks go with
//! its session (after it is fenced at the memory servers).

use super::Fs;
use crate::error::{Error, Result};
pub use crate::meta::locks::{FileLock, HeldLock, LockKind, LockType};

/// Where a shared volume keeps its locks.
pub trait LockKeeper: Send + Sync {
    /// Takes or releases (`lock.typ` None) a lock of `owner` on `ino` (a record lock's: the
    /// kernel's lock owner; a `flock`'s: the open file's handle, as the FUSE adapter says);
    /// `Some` (nothing taken) is another owner's conflicting lock.
    fn set(&self, ino: u64, owner: u64, lock: &FileLock) -> Result<Option<HeldLock>>;

    /// The lock of another owner that `lock` would conflict with, if any.
    fn test(&self, ino: u64, owner: u64, lock: &FileLock) -> Result<Option<HeldLock>>;

    /// Drops every lock of kind `kind` that `owner` holds on `ino` (cheap when none).
    fn release(&self, ino: u64, owner: u64, kind: LockKind) -> Result<()>;
}

impl<K: LockKeeper> LockKeeper for crate::sync::Arc<K> {
    fn set(&self, ino: u64, owner: u64, lock: &FileLock) -> Result<Option<HeldLock>> {
        (**self).set(ino, owner, lock)
    }

    fn test(&self, ino: u64, owner: u64, lock: &FileLock) -> Result<Option<HeldLock>> {
        (**self).test(ino, owner, lock)
    }

    fn release(&self, ino: u64, owner: u64, kind: LockKind) -> Result<()> {
        (**self).release(ino, owner, kind)
    }
}

impl Fs {
    /// Whether locks are kept here (a shared volume), not by the kernel.
    pub fn keeps_locks(&self) -> bool {
        self.locks.as_ref().is_some()
    }

    fn keeper(&self) -> Result<&dyn LockKeeper> {
        self.locks.as_deref().ok_or_else(|| {
            crate::error::Error::new(libc::ENOSYS, "locks are kept by the kernel here")
        })
    }

    /// See [`LockKeeper::set`]. An unlock comes after this client's writes held back are
    /// in the engine: who locks next sees them. A lock taken is answered only once the table
    /// has caught up with the engine, so it shows what the lock's last holder changed before
    /// letting go; if that cannot be read ([`Fs::catch_up_shared`]), the lock is let go again
    /// and the answer is EIO, never a lock over a stale view. (Letting go a record lock
    /// unlocks its range: a lock the owner held there before goes too, as when `fcntl`
    /// converts a lock and fails.)
    pub fn set_lock(&self, ino: u64, owner: u64, lock: &FileLock) -> Result<Option<HeldLock>> {
        let keeper = self.keeper()?;
        if lock.typ.is_none() {
            self.send_shared_writes()?;
        }
        let conflict = keeper.set(ino, owner, lock)?;
        if conflict.is_some() || lock.typ.is_none() {
            return Ok(conflict);
        }
        if let Err(e) = self.catch_up_shared() {
            let undone = match lock.kind {
                LockKind::Flock => keeper.release(ino, owner, LockKind::Flock),
                LockKind::Posix => keeper
                    .set(
                        ino,
                        owner,
                        &FileLock {
                            typ: None,
                            ..lock.clone()
                        },
                    )
                    .map(drop),
            };
            if let Err(u) = undone {
                log::warn!("letting go a lock taken on a stale view: {}", u.message);
            }
            return Err(Error::new(
                libc::EIO,
                format!(
                    "a lock was taken, but what others changed before could not be read: {}",
                    e.message
                ),
            ));
        }
        Ok(None)
    }

    /// See [`LockKeeper::test`].
    pub fn test_lock(&self, ino: u64, owner: u64, lock: &FileLock) -> Result<Option<HeldLock>> {
        self.keeper()?.test(ino, owner, lock)
    }

    /// See [`LockKeeper::release`]; nothing where the kernel keeps locks.
    pub fn release_locks(&self, ino: u64, owner: u64, kind: LockKind) -> Result<()> {
        match self.locks.as_ref() {
            Some(k) => {
                self.send_shared_writes()?;
                k.release(ino, owner, kind)
            }
            None => Ok(()),
        }
    }
}
