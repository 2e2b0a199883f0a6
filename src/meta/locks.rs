//! File locks of a shared volume (POSIX record locks and BSD `flock`), as one inode's table.
//!
//! Why here, as plain data: on a private mount the kernel keeps locks itself; on a shared
//! volume they must hold across clients, so each inode's locks are one small table kept in
//! the metadata engine and changed by compare-and-swap (`engine`). The rules live here once,
//! for every engine, testable against a model (`tests` below): a lock conflicts with another
//! owner's lock of the same kind (POSIX and BSD locks never meet, as on Linux) over a common
//! byte when either is a write lock; an owner's new lock replaces what it held over that range
//! (splitting and merging ranges, as `fcntl` does); unlocking a range may split a lock.
//!
//! An owner is the client's session and the kernel's lock owner (a process's files table
//! for POSIX locks, an open file for `flock`): eviction of a session drops all its locks.

use serde::{Deserialize, Serialize};

/// POSIX record locks (`fcntl`) or BSD locks (`flock`): they never conflict with each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LockKind {
    Posix,
    Flock,
}

/// Shared (read) or exclusive (write).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockType {
    Read,
    Write,
}

/// Who holds a lock: a client's session and the kernel's owner id within it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockOwner {
    pub session: String,
    pub owner: u64,
}

/// One held lock over bytes `start..=end` (`end` u64::MAX: to the end of any file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldLock {
    pub who: LockOwner,
    pub kind: LockKind,
    pub typ: LockType,
    pub start: u64,
    pub end: u64,
    /// The process that took it, for `F_GETLK`'s answer.
    pub pid: u32,
}

/// A request: take `typ` (None: unlock) over `start..=end`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileLock {
    pub kind: LockKind,
    pub typ: Option<LockType>,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
}

/// One inode's locks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockTable {
    pub locks: Vec<HeldLock>,
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 <= b.1 && b.0 <= a.1
}

impl LockTable {
    /// The table stored as `bytes` (empty: no locks).
    pub fn decode(bytes: &[u8]) -> Result<LockTable, String> {
        if bytes.is_empty() {
            return Ok(LockTable::default());
        }
        serde_json::from_slice(bytes).map_err(|e| format!("a lock table that does not parse: {e}"))
    }

    /// The stored form (empty when no lock is held, so the engine can drop the key).
    pub fn encode(&self) -> Vec<u8> {
        if self.locks.is_empty() {
            return Vec::new();
        }
        serde_json::to_vec(self).expect("a lock table always serializes")
    }

    /// The first lock of another owner than `who` that `req` (a lock, not an unlock)
    /// conflicts with.
    pub fn conflict(&self, who: &LockOwner, req: &FileLock) -> Option<&HeldLock> {
        let typ = req.typ?;
        self.locks.iter().find(|l| {
            l.kind == req.kind
                && l.who != *who
                && (typ == LockType::Write || l.typ == LockType::Write)
                && overlaps((l.start, l.end), (req.start, req.end))
        })
    }

    /// Takes or releases for `who` as `req` says; a conflicting lock of another owner is
    /// returned (nothing changed) instead.
    pub fn apply(&mut self, who: &LockOwner, req: &FileLock) -> Result<(), HeldLock> {
        if let Some(c) = self.conflict(who, req) {
            return Err(c.clone());
        }
        self.cut(who, req.kind, req.start, req.end);
        if let Some(typ) = req.typ {
            self.locks.push(HeldLock {
                who: who.clone(),
                kind: req.kind,
                typ,
                start: req.start,
                end: req.end,
                pid: req.pid,
            });
            self.merge(who, req.kind, typ);
        }
        Ok(())
    }

    /// Removes `who`'s locks of `kind` over `start..=end`, splitting those that reach past.
    fn cut(&mut self, who: &LockOwner, kind: LockKind, start: u64, end: u64) {
        let mut kept = Vec::with_capacity(self.locks.len() + 1);
        for l in self.locks.drain(..) {
            if l.kind != kind || l.who != *who || !overlaps((l.start, l.end), (start, end)) {
                kept.push(l);
                continue;
            }
            if l.start < start {
                kept.push(HeldLock {
                    end: start - 1,
                    ..l.clone()
                });
            }
            if l.end > end {
                kept.push(HeldLock {
                    start: end + 1,
                    ..l
                });
            }
        }
        self.locks = kept;
    }

    /// Joins `who`'s locks of one kind and type that overlap or touch (as the kernel does).
    fn merge(&mut self, who: &LockOwner, kind: LockKind, typ: LockType) {
        let (mut mine, rest): (Vec<_>, Vec<_>) = self
            .locks
            .drain(..)
            .partition(|l| l.who == *who && l.kind == kind && l.typ == typ);
        mine.sort_by_key(|l| l.start);
        let mut joined: Vec<HeldLock> = Vec::with_capacity(mine.len());
        for l in mine {
            match joined.last_mut() {
                Some(last) if last.end == u64::MAX || l.start <= last.end + 1 => {
                    last.end = last.end.max(l.end);
                }
                _ => joined.push(l),
            }
        }
        self.locks = rest;
        self.locks.extend(joined);
    }

    /// Drops every lock of kind `kind` of `who` (a POSIX owner's close, a `flock` file's release).
    pub fn release_owner(&mut self, who: &LockOwner, kind: LockKind) -> bool {
        let before = self.locks.len();
        self.locks.retain(|l| !(l.who == *who && l.kind == kind));
        self.locks.len() != before
    }

    /// Drops every lock of session `session` (evicted, or unmounted).
    pub fn release_session(&mut self, session: &str) -> bool {
        let before = self.locks.len();
        self.locks.retain(|l| l.who.session != session);
        self.locks.len() != before
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// Bytes 0..SPAN; `end` SPAN-1 stands for "to the end".
    const SPAN: u64 = 12;

    fn owner(i: u8) -> LockOwner {
        LockOwner {
            session: format!("s{}", i % 2),
            owner: u64::from(i / 2),
        }
    }

    /// The reference: each owner's lock type per byte, per kind.
    type Model = HashMap<(u8, bool), HashMap<u64, LockType>>;

    fn model_apply(
        m: &mut Model,
        o: u8,
        flock: bool,
        typ: Option<LockType>,
        s: u64,
        e: u64,
    ) -> bool {
        let conflict = typ.is_some_and(|t| {
            m.iter().any(|((oo, fl), bytes)| {
                owner(*oo) != owner(o)
                    && *fl == flock
                    && (s..=e).any(|b| {
                        bytes
                            .get(&b)
                            .is_some_and(|held| t == LockType::Write || *held == LockType::Write)
                    })
            })
        });
        if conflict {
            return false;
        }
        let mine = m.entry((o, flock)).or_default();
        for b in s..=e {
            match typ {
                Some(t) => mine.insert(b, t),
                None => mine.remove(&b),
            };
        }
        true
    }

    fn table_bytes(t: &LockTable, o: u8, flock: bool) -> HashMap<u64, LockType> {
        let kind = if flock {
            LockKind::Flock
        } else {
            LockKind::Posix
        };
        let mut out = HashMap::new();
        for l in t
            .locks
            .iter()
            .filter(|l| l.who == owner(o) && l.kind == kind)
        {
            for b in l.start..=l.end.min(SPAN - 1) {
                assert!(
                    out.insert(b, l.typ).is_none(),
                    "two locks of one owner on byte {b}"
                );
            }
        }
        out
    }

    fn op() -> impl Strategy<Value = (u8, bool, Option<bool>, u64, u64)> {
        (
            0u8..4,
            any::<bool>(),
            proptest::option::of(any::<bool>()),
            0..SPAN,
            0..SPAN,
        )
    }

    proptest! {
        /// Any sequence of locks and unlocks by four owners of two sessions: granted exactly
        /// when the byte model grants it, and then holding exactly the model's bytes.
        #[test]
        fn table_matches_byte_model(ops in proptest::collection::vec(op(), 1..40)) {
            let mut table = LockTable::default();
            let mut model = Model::new();
            for (o, flock, typ, a, b) in ops {
                let (s, e) = (a.min(b), a.max(b));
                let typ = typ.map(|w| if w { LockType::Write } else { LockType::Read });
                let req = FileLock {
                    kind: if flock { LockKind::Flock } else { LockKind::Posix },
                    typ,
                    start: s,
                    end: e,
                    pid: 7,
                };
                let granted = model_apply(&mut model, o, flock, typ, s, e);
                prop_assert_eq!(table.apply(&owner(o), &req).is_ok(), granted);
                let table = LockTable::decode(&table.encode()).unwrap();
                for o in 0..4 {
                    for fl in [false, true] {
                        let want = model.get(&(o, fl)).cloned().unwrap_or_default();
                        prop_assert_eq!(table_bytes(&table, o, fl), want);
                    }
                }
            }
        }
    }

    #[test]
    fn locks_to_the_end_merge_and_split() {
        let mut t = LockTable::default();
        let req = |typ, start, end| FileLock {
            kind: LockKind::Posix,
            typ,
            start,
            end,
            pid: 1,
        };
        t.apply(&owner(0), &req(Some(LockType::Write), 10, u64::MAX))
            .unwrap();
        t.apply(&owner(0), &req(Some(LockType::Write), 0, 9))
            .unwrap();
        assert_eq!(t.locks.len(), 1, "adjacent locks merge: {t:?}");
        t.apply(&owner(0), &req(None, 100, 199)).unwrap();
        assert_eq!(t.locks.len(), 2, "an unlock in the middle splits: {t:?}");
        assert!(t.release_session("s0"));
        assert!(t.locks.is_empty() && t.encode().is_empty());
    }
}
