//! A shared volume's file locks, kept in its metadata engine ([`crate::fs::LockKeeper`]):
//! each inode's table is changed by compare-and-swap under this client's session, so a lock
//! excludes every other client, and a client whose session ended (evicted after it was
//! fenced at the memory servers) can take none.

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
        }
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
        let who = self.owner(owner);
        change_locks(&*self.engine, &self.who, ino, |t| {
            t.release_owner(&who, kind)
        })
        .map_err(lock_err)?;
        Ok(())
    }
}
