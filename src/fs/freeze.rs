//! Holding changes at the door: a point-in-time export of an attached volume (`rmemfs admin
//! export`) freezes the file system's changes while it copies; reads go on, and changing
//! requests wait until it ends ("writers briefly wait").
//!
//! One reader-writer lock: each changing request holds it shared for its whole handling (the
//! FUSE adapter knows which requests change anything), the freeze holds it exclusively. The
//! lock prefers a waiting writer, so a stream of changes cannot starve the freeze.

use super::Fs;
use crate::sync::{RwLockReadGuard, RwLockWriteGuard};

/// While held, no change to the file system is being made or can begin.
pub struct Frozen<'a> {
    _gate: RwLockWriteGuard<'a, ()>,
}

/// While held, a change may be made (no freeze is on).
pub struct ChangeAdmitted<'a> {
    _gate: RwLockReadGuard<'a, ()>,
}

impl Fs {
    /// Waits until no freeze is on; changes may then be made until the result is dropped.
    pub fn admit_change(&self) -> ChangeAdmitted<'_> {
        ChangeAdmitted {
            _gate: self.change_gate.read(),
        }
    }

    /// Holds new changes, unless one is being made (none: try again later).
    pub fn try_freeze(&self) -> Option<Frozen<'_>> {
        Some(Frozen {
            _gate: self.change_gate.try_write()?,
        })
    }

    /// Waits until the changes being made end, and holds new ones until the result is
    /// dropped.
    pub fn freeze(&self) -> Frozen<'_> {
        Frozen {
            _gate: self.change_gate.write(),
        }
    }
}
