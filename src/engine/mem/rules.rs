//! The in-memory engine's rules, as the Redis engine's scripts keep them: which version a
//! touch is checked against (the versions' floor, the appender's own turn), who holds a
//! turn, whether a session lives, the engine away, faults tests arm.

use super::{EngineError, State, ENGINE_AWAY};
use std::collections::HashMap;
use std::time::{Duration, Instant};

impl State {
    /// The version of `key` a touch (`shared` or not) is checked against: a shared one
    /// against the exclusive version, an exclusive one against both (see [`Touch`]).
    /// What a version not kept reads as where `who` (if any) appends: never touched under
    /// its own turn (no other client changed the key since it took it), the floor elsewhere.
    pub(super) fn no_version(&self, key: u64, who: Option<&str>) -> u64 {
        let own = who.is_some_and(|w| {
            matches!(self.turns.get(&key), Some((h, until)) if h == w && *until > Instant::now())
        });
        match own {
            true => 0,
            false => self.floor(),
        }
    }

    pub(super) fn checked_version(&self, key: u64, shared: bool, who: Option<&str>) -> u64 {
        let none = self.no_version(key, who);
        let exclusive = self.versions.get(&key).copied().unwrap_or(none);
        if shared {
            return exclusive;
        }
        exclusive.max(self.shared_versions.get(&key).copied().unwrap_or(none))
    }

    /// Key `key`'s exclusive version (the floor where none is kept).
    pub(super) fn exclusive_version(&self, key: u64) -> u64 {
        self.versions.get(&key).copied().unwrap_or(self.floor())
    }

    /// What a key with no version kept reads as.
    pub(super) fn floor(&self) -> u64 {
        match self.floorless {
            true => 0,
            false => self.version_floor,
        }
    }

    /// A client other than `who` marking `ino` open.
    pub(super) fn open_elsewhere(&self, who: &str, ino: u64) -> Option<String> {
        let mut others: Vec<&String> = self.open.get(&ino)?.iter().filter(|w| *w != who).collect();
        others.sort();
        others.first().map(|w| w.to_string())
    }

    /// Whether no heartbeat reached the engine for [`ENGINE_AWAY`].
    pub(super) fn away(&self) -> bool {
        let away = self.away.unwrap_or(ENGINE_AWAY);
        self.last_beat.is_some_and(|b| b.elapsed() > away)
    }

    /// A heartbeat reached the engine: after [`ENGINE_AWAY`] without one (the engine was
    /// away), every session is renewed for `ttl` first.
    pub(super) fn beat(&mut self, ttl: Duration) {
        let now = Instant::now();
        if self.away() {
            for until in self.sessions.values_mut() {
                *until = (*until).max(now + ttl);
            }
        }
        self.last_beat = Some(now);
    }

    /// Fails this call of `op` if a test armed a fault for it, as an unreachable engine would.
    pub(super) fn fault(&mut self, op: &'static str) -> Result<(), EngineError> {
        match self.faults.get_mut(op) {
            Some(n) if *n > 0 => {
                *n -= 1;
                let why = format!("{op}: a fault armed by a test");
                // Taken, its answer lost; else never reached.
                Err(match op {
                    "append_answer" => EngineError::Unavailable(why),
                    _ => EngineError::Unreached(why),
                })
            }
            _ => Ok(()),
        }
    }
}

/// Whether session `who` is there and its last heartbeat has not run out.
pub(super) fn live(sessions: &HashMap<String, Instant>, who: &str) -> bool {
    sessions
        .get(who)
        .is_some_and(|until| *until >= Instant::now())
}

/// Marks `key`'s turn, held by `holder`, wanted: the holder hears it once.
pub(super) fn ask(s: &mut State, key: u64, holder: &str) {
    if s.wanted.insert(key) {
        s.asked.entry(holder.to_string()).or_default().push(key);
    }
}

/// Who else holds `key`'s turn (none: free, run out, or `who`'s own).
pub(super) fn other_holder<'a>(
    turns: &'a HashMap<u64, (String, Instant)>,
    key: u64,
    who: &str,
) -> Option<&'a str> {
    match turns.get(&key) {
        Some((h, until)) if h != who && *until > Instant::now() => Some(h),
        _ => None,
    }
}
