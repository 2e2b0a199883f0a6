//! A shared volume's file locks, kept in its metadata engine ([`crate::fs::LockKeeper`]):
//! each inode's table is changed by compare-and-swap under this client's session, so a lock
//! excludes every other client, and a client whose session ended (evicted after it was
//! fenced at the memory servers) can take none.
//!
//! A release the engine did not take (unreachable) is not forgotten: it is tried again by
//! every poll of the client ([`EngineLocks::retry_releases`]) until the engine has it, so a
//! close during an engine outage does not leave other clients waiting for the lock forever.

use crate::engine::{change_locks, EngineError, MetaEngine};
use crate::error::{Error, Result};
use crate::fs::{FileLock, HeldLock, LockKeeper, LockKind};
use crate::meta::locks::LockOwner;
use crate::sync::{Arc, Mutex};
use std::collections::HashSet;

pub(super) struct EngineLocks {
    engine: Arc<dyn MetaEngine>,
    who: String,
    /// What this client may hold: (inode, owner, kind) it has locked, until released. Only
    /// this client takes locks for its owners, so a close with nothing here costs nothing.
    held: Mutex<HashSet<(u64, u64, LockKind)>>,
    /// Releases answered to the kernel but not yet taken by the engine (tried again).
    unreleased: Mutex<HashSet<(u64, u64, LockKind)>>,
}

fn lock_err(e: EngineError) -> Error {
    Error::new(libc::EIO, format!("file locks: {e}"))
}

impl EngineLocks {
    pub(super) fn new(engine: Arc<dyn MetaEngine>, who: String) -> EngineLocks {
        EngineLocks {
            engine,
            who,
            held: Mutex::new(HashSet::new()),
            unreleased: Mutex::new(HashSet::new()),
        }
    }

    /// Releases `owner`'s locks of `kind` on `ino` in the engine.
    fn release_now(
        &self,
        ino: u64,
        owner: u64,
        kind: LockKind,
    ) -> std::result::Result<(), EngineError> {
        let who = self.owner(owner);
        change_locks(&*self.engine, &self.who, ino, |t| {
            t.release_owner(&who, kind)
        })
        .map(|_| ())
    }

    /// Tries again each release the engine did not take; the number still waiting. A
    /// session that ended has no locks left to release (whoever evicted it dropped them).
    pub(super) fn retry_releases(&self) -> usize {
        let waiting: Vec<_> = self.unreleased.lock().iter().copied().collect();
        for key @ (ino, owner, kind) in waiting {
            match self.release_now(ino, owner, kind) {
                Ok(()) | Err(EngineError::NoSession { .. }) => {
                    self.unreleased.lock().remove(&key);
                }
                Err(e) => log::warn!("file locks: a release of inode {ino} waits: {e}"),
            }
        }
        self.unreleased.lock().len()
    }

    /// Sends a release still waiting for `key` first, so it cannot undo a lock taken after it.
    fn settle_unreleased(&self, key: (u64, u64, LockKind)) -> Result<()> {
        if self.unreleased.lock().contains(&key) {
            self.release_now(key.0, key.1, key.2).map_err(lock_err)?;
            self.unreleased.lock().remove(&key);
        }
        Ok(())
    }

    fn owner(&self, owner: u64) -> LockOwner {
        LockOwner {
            session: self.who.clone(),
            owner,
        }
    }
}

impl LockKeeper for EngineLocks {
    fn set(&self, ino: u64, owner: u64, lock: &FileLock) -> Result<Option<HeldLock>> {
        self.settle_unreleased((ino, owner, lock.kind))?;
        let who = self.owner(owner);
        if lock.typ.is_some() {
            // Noted before it is taken: a close racing with the grant still releases it.
            self.held.lock().insert((ino, owner, lock.kind));
        }
        let got = change_locks(&*self.engine, &self.who, ino, |t| t.apply(&who, lock).err())
            .map_err(lock_err)?;
        Ok(got)
    }

    fn test(&self, ino: u64, owner: u64, lock: &FileLock) -> Result<Option<HeldLock>> {
        let stored = self.engine.locks(ino).map_err(lock_err)?;
        let table =
            crate::meta::locks::LockTable::decode(&stored).map_err(|e| Error::new(libc::EIO, e))?;
        Ok(table.conflict(&self.owner(owner), lock).cloned())
    }

    fn release(&self, ino: u64, owner: u64, kind: LockKind) -> Result<()> {
        if !self.held.lock().remove(&(ino, owner, kind)) {
            return Ok(());
        }
        match self.release_now(ino, owner, kind) {
            Ok(()) | Err(EngineError::NoSession { .. }) => Ok(()),
            Err(e) => {
                // The kernel's close cannot wait: the release is the poller's to retry.
                self.unreleased.lock().insert((ino, owner, kind));
                Err(lock_err(e))
            }
        }
    }
}
