//! Holding changes at the door: a point-in-time export of an attached volume (`rmemfs admin
//! export`) freezes the file system's changes while it copies; reads go on, and changing
//! requests wait until it ends ("writers briefly wait").
//!
//! One reader-writer lock: each changing request holds it shared for its whole handling (the
//! FUSE adapter knows which requests change anything), the freeze holds it exclusively. The
//! lock prefers a waiting writer, so a stream of changes cannot starve the freeze.
//!
//! A shared volume's changes also wait for their turn at the door ([`Turns`]): many clients
//! write one namespace, one change at a time, each on an up-to-date table.

use super::Fs;
use crate::sync::{RwLockReadGuard, RwLockWriteGuard};

/// While held, no change to the file system is being made or can begin.
pub struct Frozen<'a> {
    _gate: RwLockWriteGuard<'a, ()>,
}

/// While held, a change may be made (no freeze is on; on a shared volume, this client holds
/// the write turn and its table is up to date).
pub struct ChangeAdmitted<'a> {
    _gate: RwLockReadGuard<'a, ()>,
    _turn: Option<Box<dyn std::any::Any + Send>>,
}

/// Where a change waits its turn: a shared volume's metadata engine
/// ([`crate::volume::shared`]).
pub trait Turns: Send + Sync {
    /// Takes the write turn and brings the table up to date; the turn is held until the
    /// result is dropped. None if it could not be taken (the change's record is then
    /// refused, and the change fails).
    fn begin(&self, fs: &Fs) -> Option<Box<dyn std::any::Any + Send>>;

    /// Brings the table up to date without the turn (a lookup that found nothing).
    fn refresh(&self, fs: &Fs);

    /// Brings the table up to date and tells the kernel everything it must forget before
    /// returning (a file lock granted); false if that failed. Only from a request whose
    /// caller holds no directory lock (the kernel's invalidation of a name waits for it).
    fn sync_kernel(&self, fs: &Fs) -> bool;
}

impl Fs {
    /// Waits until no freeze is on (and, on a shared volume, for the write turn); changes
    /// may then be made until the result is dropped.
    pub fn admit_change(&self) -> ChangeAdmitted<'_> {
        let gate = self.change_gate.read();
        let turn = self.turns.as_ref().and_then(|t| t.begin(self));
        ChangeAdmitted {
            _gate: gate,
            _turn: turn,
        }
    }

    /// On a shared volume, brings the table up to date; false (nothing done) elsewhere.
    pub fn refresh_shared(&self) -> bool {
        match self.turns.as_ref() {
            Some(t) => {
                t.refresh(self);
                true
            }
            None => false,
        }
    }

    /// Whether this is a shared volume's client (many writers, see [`Turns`]).
    pub fn is_shared(&self) -> bool {
        self.turns.as_ref().is_some()
    }

    /// On a shared volume, see [`Turns::sync_kernel`]; true (nothing to do) elsewhere.
    pub fn sync_kernel_shared(&self) -> bool {
        self.turns.as_ref().is_none_or(|t| t.sync_kernel(self))
    }

    /// Waits until the changes being made end, and holds new ones until the result is
    /// dropped.
    pub fn freeze(&self) -> Frozen<'_> {
        Frozen {
            _gate: self.change_gate.write(),
        }
    }
}
