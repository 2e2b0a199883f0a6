//! What a volume gives the file system, before the file system is shared: where `fsync`
//! waits (a holder's journal, [`Barrier`]), where a shared volume's changes take their turn
//! ([`super::Turns`]) and where its file locks are kept ([`super::LockKeeper`]). Each is
//! known once the volume is attached, so each is an argument of [`Fs::joined`], not a slot
//! filled later: the file system never changes mode while it serves.

use super::{Fs, LockKeeper, Turns};
use crate::data::DataStore;
use crate::error::Result;
use crate::meta::Meta;
use crate::sync::{Arc, Mutex, Weak};
use std::collections::HashMap;

/// What makes `fsync` durable: a volume's journal, which returns once every metadata change
/// made so far is committed on every live journal copy. A mount without one has nothing to
/// make durable.
pub trait Barrier: Send + Sync {
    fn sync(&self) -> Result<()>;
    /// The journal's figures, for the report.
    fn stats(&self) -> JournalStats;
    /// Server `server`'s extents have new keys, by address (a backed server restarted on a
    /// fabric whose device issues keys): the journal's own places there take them.
    fn rekey(&self, server: u32, keys: &HashMap<u64, u64>) -> Result<()>;
}

/// A volume's journal, as the report shows it (`stats`: the `journal` section).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalStats {
    /// The epoch this daemon holds the volume at.
    pub epoch: u64,
    /// The last record committed on every live journal copy.
    pub committed: u64,
    /// Groups of records written (one replicated WRITE each).
    pub groups: u64,
    /// Bytes of records written.
    pub bytes: u64,
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Frees waiting for the commit of the record that let go of their extents.
    pub frees_held: u64,
}

/// A volume's part in the file system (none of them: a private namespace).
#[derive(Default)]
pub struct VolumeHooks {
    /// The holder's journal, for `fsync`.
    pub barrier: Option<Arc<dyn Barrier>>,
    /// A shared volume's turns.
    pub turns: Option<Box<dyn Turns>>,
    /// A shared volume's file locks (none: the kernel keeps them).
    pub locks: Option<Box<dyn LockKeeper>>,
}

impl Fs {
    /// This file system as a volume's: `hooks` in place, before it is shared.
    pub fn joined(mut self, hooks: VolumeHooks) -> Fs {
        self.barrier = hooks.barrier;
        self.turns = hooks.turns;
        self.locks = hooks.locks;
        self
    }

    /// Gives the journal's places on `server` their new keys ([`Barrier::rekey`]); nothing
    /// without a volume.
    pub fn rekey_journal(&self, server: u32, keys: &HashMap<u64, u64>) -> Result<()> {
        self.barrier
            .as_ref()
            .map_or(Ok(()), |b| b.rekey(server, keys))
    }

    /// The volume's journal figures (none: no volume).
    pub fn journal_stats(&self) -> Option<JournalStats> {
        self.barrier.as_ref().map(|b| b.stats())
    }

    /// `fsync`/`fsyncdir`: `None` without a volume (nothing to make durable).
    pub fn sync(&self) -> Option<Result<()>> {
        // A shared volume's changes are in the engine once answered, but its writes' may be
        // held back.
        if let Some(t) = &self.turns {
            return Some(t.send_writes());
        }
        self.barrier.as_ref().map(|b| b.sync())
    }
}

/// What a volume's journal reads of the file system from its own thread: the table (a
/// checkpoint's image) and the data store (to write records). Held weakly: the file system
/// owns both, and a journal that outlives it finds them gone. The journal is made before
/// the file system is shared (see [`Fs::joined`]), so it cannot hold the file system itself.
#[derive(Clone)]
pub struct JournalView {
    meta: Weak<Mutex<Meta>>,
    data: Weak<DataStore>,
}

impl JournalView {
    /// Reads the namespace under its lock; `None` once the file system is gone.
    pub fn inspect_meta<R>(&self, f: impl FnOnce(&Meta) -> R) -> Option<R> {
        self.meta.upgrade().map(|m| f(&m.lock()))
    }

    /// The data store; `None` once the file system is gone.
    pub fn data(&self) -> Option<Arc<DataStore>> {
        self.data.upgrade()
    }
}

impl Fs {
    /// What a volume's journal reads of this file system.
    pub fn journal_view(&self) -> JournalView {
        JournalView {
            meta: Arc::downgrade(&self.meta),
            data: Arc::downgrade(&self.data),
        }
    }
}
