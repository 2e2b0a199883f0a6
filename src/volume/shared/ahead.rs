//! This client's own changes that its table holds ahead of the log it has applied: a change
//! is made in the table before the engine gives it its place, and other clients' changes
//! before that place may not be applied yet. They touch none of its inodes (the engine
//! checked), so the order they meet in the table does not matter; but a catch-up must not
//! apply this client's own again, and a change must name, for each inode it touches, the
//! newest version the table holds (a change of its own past the applied log may be newer).

use std::collections::{BTreeMap, HashMap};

#[derive(Default)]
pub(super) struct Ahead {
    /// Own changes past the applied log: LSN to the inodes each touched.
    changes: BTreeMap<u64, Vec<u64>>,
    /// Each inode touched by an own change past the applied log: the newest such change.
    latest: HashMap<u64, u64>,
    /// Changes past the applied log whose first changes are this client's own, in the table
    /// already: the writes held back of an append whose answer was lost ([`super::behind`]).
    /// LSN to how many.
    prefixes: BTreeMap<u64, usize>,
    /// Appends sent, and those answered (noted here if taken): a catch-up waits for every
    /// append sent before its read, so it knows which of the changes it read are its own.
    pub(super) sent: u64,
    pub(super) answered: u64,
}

impl Ahead {
    /// The version of `key` the table holds, the log being applied through `applied`.
    pub(super) fn seen(&self, key: u64, applied: u64) -> u64 {
        self.latest.get(&key).copied().unwrap_or(0).max(applied)
    }

    /// Own change `lsn`, touching `keys`, is in the table.
    pub(super) fn noted(&mut self, lsn: u64, keys: &[u64]) {
        for k in keys {
            let at = self.latest.entry(*k).or_default();
            *at = (*at).max(lsn);
        }
        self.changes.insert(lsn, keys.to_vec());
    }

    /// The first `n` changes of change `lsn`, touching `keys`, are in the table (the rest
    /// is applied from the log as another client's).
    pub(super) fn noted_prefix(&mut self, lsn: u64, n: usize, keys: &[u64]) {
        for k in keys {
            let at = self.latest.entry(*k).or_default();
            *at = (*at).max(lsn);
        }
        self.prefixes.insert(lsn, n);
    }

    /// How many of change `lsn`'s first changes the table holds already (see
    /// [`Ahead::noted_prefix`]).
    pub(super) fn own_prefix(&self, lsn: u64) -> usize {
        self.prefixes.get(&lsn).copied().unwrap_or(0)
    }

    /// Whether change `lsn` is one of this client's own ahead of the applied log.
    pub(super) fn is_own(&self, lsn: u64) -> bool {
        self.changes.contains_key(&lsn)
    }

    /// The log is applied through `applied`: what it covers is no longer ahead.
    pub(super) fn applied(&mut self, applied: u64) {
        let later = self.changes.split_off(&(applied + 1));
        self.changes = later;
        let later = self.prefixes.split_off(&(applied + 1));
        self.prefixes = later;
        self.latest.retain(|_, lsn| *lsn > applied);
    }

    /// The table was replaced by a checkpoint: none of this client's changes is ahead of it
    /// any more (those past it are read from the log like any other).
    pub(super) fn forget(&mut self) {
        self.changes.clear();
        self.latest.clear();
        self.prefixes.clear();
    }

    pub(super) fn is_empty(&self) -> bool {
        self.changes.is_empty() && self.prefixes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_changes_ahead_raise_what_is_seen_until_the_log_covers_them() {
        let mut a = Ahead::default();
        a.noted(7, &[2, 3]);
        a.noted(9, &[3]);
        assert_eq!(a.seen(2, 5), 7);
        assert_eq!(a.seen(3, 5), 9);
        assert_eq!(a.seen(4, 5), 5);
        assert!(a.is_own(7) && a.is_own(9) && !a.is_own(8));
        a.applied(8);
        assert_eq!(a.seen(2, 8), 8);
        assert_eq!(a.seen(3, 8), 9);
        assert!(!a.is_own(7) && a.is_own(9));
        a.applied(9);
        assert!(a.is_empty());
    }

    #[test]
    fn an_own_prefix_raises_what_is_seen_and_goes_with_the_log() {
        let mut a = Ahead::default();
        a.noted_prefix(12, 2, &[5]);
        assert_eq!(a.seen(5, 10), 12);
        assert_eq!(a.own_prefix(12), 2);
        assert!(!a.is_own(12) && !a.is_empty());
        a.applied(12);
        assert_eq!(a.own_prefix(12), 0);
        assert!(a.is_empty());
    }
}
