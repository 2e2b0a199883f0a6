//! An engine in this process's memory, for tests: the same rules as the Redis engine
//! (an append checked against the versions and turns of what it touches, a checkpoint trims
//! the log, turns and sessions run out),
//! so the conformance tests hold both to one contract and the shared mount can be tested
//! without a Redis server.

use super::{
    Appended, Checkpoint, EngineError, KeyOp, Marks, MetaEngine, NamesPage, StateDump, StateLoad,
    Touch, ENGINE_AWAY, SHARED_FORMAT,
};
use crate::sync::{Arc, Condvar, Mutex};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

#[derive(Default)]
struct State {
    head: u64,
    log: BTreeMap<u64, Vec<u8>>,
    checkpoint: Option<Checkpoint>,
    /// Each inode's version: the last change that touched it.
    versions: HashMap<u64, u64>,
    /// Each key's shared version (see [`crate::engine::Touch`]).
    shared_versions: HashMap<u64, u64>,
    /// What a key with no version kept reads as ([`MetaEngine::trim_versions`]).
    version_floor: u64,
    /// A mutant: keys with no version kept read as 0 ([`MemEngine::floorless`]).
    floorless: bool,
    /// Turned inodes: the holder and when its lease runs out.
    turns: HashMap<u64, (String, Instant)>,
    /// Turned inodes another client asked for since they were taken.
    wanted: HashSet<u64>,
    /// Each holder's inodes asked for, not yet heard ([`MetaEngine::wanted`]).
    asked: HashMap<String, Vec<u64>>,
    sessions: HashMap<String, Instant>,
    /// Files marked open, by the clients marking them.
    open: HashMap<u64, HashSet<String>>,
    locks: BTreeMap<u64, Vec<u8>>,
    servers: Option<Vec<String>>,
    /// None: a volume of format 1 (or none yet).
    format: Option<u32>,
    /// The last inode number given out.
    last_ino: u64,
    /// When a session's heartbeat (or start) last reached the engine (see
    /// [`super::ENGINE_AWAY`]).
    last_beat: Option<Instant>,
    /// [`ENGINE_AWAY`] unless a test shortened it.
    away: Option<Duration>,
    /// Faults tests arm ([`MemEngine::fail_next`]): an operation's name and how many of its
    /// next calls fail.
    faults: HashMap<&'static str, u32>,
    /// Reads of the log so far ([`MemEngine::reads`]).
    reads: u64,
    /// The client whose appends that claim a turn wait, once taken, before they answer
    /// ([`MemEngine::hold_claim_answers`]), and how many wait now.
    claims_held_for: Option<String>,
    claims_waiting: usize,
    /// The namespace's state beside the log ([`super::state`]), and whether it is whole;
    /// the writes that made it, by LSN (a log that loses its last changes loses their
    /// writes too: [`MemEngine::lose_last`]).
    namespace: StateDump,
    whole: bool,
    noted_inodes: Option<u64>,
    owed: std::collections::BTreeSet<String>,
    state_writes: Vec<(u64, Vec<KeyOp>)>,
    /// What runs once the next listing of the state's inodes is made, before it is answered
    /// ([`MemEngine::after_state_listing`]); the same for a page of names
    /// ([`MemEngine::after_names_page`]).
    after_listing: Option<Box<dyn FnOnce() + Send>>,
    after_page: Option<Box<dyn FnOnce() + Send>>,
}

mod controls;
mod rules;
use rules::{ask, live, other_holder};

/// One volume's engine state; clones share it (several clients of one engine).
#[derive(Clone, Default)]
pub struct MemEngine {
    state: Arc<(Mutex<State>, Condvar)>,
}

impl MemEngine {
    pub fn new() -> MemEngine {
        MemEngine::default()
    }
}

impl MetaEngine for MemEngine {
    fn describe(&self) -> String {
        "an in-memory engine".into()
    }

    fn head(&self) -> Result<u64, EngineError> {
        let mut s = self.state.0.lock();
        s.fault("head")?;
        Ok(s.head)
    }

    fn append(
        &self,
        who: &str,
        record: &[u8],
        touched: &[Touch],
        claim: &[u64],
        marks: Marks<'_>,
        lease: Duration,
    ) -> Result<Appended, EngineError> {
        let mut s = self.state.0.lock();
        s.fault("append")?;
        if !live(&s.sessions, who) {
            return Err(EngineError::NoSession { who: who.into() });
        }
        for key in marks.dropped {
            if let Some(holder) = s.open_elsewhere(who, *key) {
                return Err(EngineError::Held { key: *key, holder });
            }
        }
        for t in touched {
            if let Some(holder) = other_holder(&s.turns, t.key, who) {
                let holder = holder.to_string();
                ask(&mut s, t.key, &holder);
                self.state.1.notify_all();
                return Err(EngineError::Busy { key: t.key, holder });
            }
            let lsn = s.checked_version(t.key, t.shared, Some(who));
            if lsn > t.seen {
                return Err(EngineError::Conflict { key: t.key, lsn });
            }
        }
        // Keys only checked (servers' births) are kept by every trim.
        for t in marks.checked {
            let lsn = s.versions.get(&t.key).copied().unwrap_or(0);
            if lsn > t.seen {
                return Err(EngineError::Conflict { key: t.key, lsn });
            }
        }
        s.head += 1;
        let lsn = s.head;
        s.log.insert(lsn, record.to_vec());
        super::state::apply(&mut s.namespace, lsn, marks.state);
        s.state_writes.push((lsn, marks.state.to_vec()));
        let until = Instant::now() + lease;
        let mut wanted = Vec::new();
        let mut held = Vec::new();
        for t in touched {
            let mine = s.turns.get(&t.key);
            if t.shared && mine.is_some_and(|(h, until)| h == who && *until > Instant::now()) {
                held.push(t.key);
            }
            if t.shared {
                s.shared_versions.insert(t.key, lsn);
            } else {
                s.versions.insert(t.key, lsn);
            }
            if let Some((h, u)) = s.turns.get_mut(&t.key) {
                // Only a turn that has not run out, as Redis's (one run out is no one's).
                if h == who && *u > Instant::now() {
                    *u = until;
                    if s.wanted.contains(&t.key) {
                        wanted.push(t.key);
                    }
                }
            }
        }
        for key in claim {
            s.turns.insert(*key, (who.to_string(), until));
            s.wanted.remove(key);
        }
        for key in marks.opened {
            s.open.entry(*key).or_default().insert(who.to_string());
        }
        if !claim.is_empty() && s.claims_held_for.as_deref() == Some(who) {
            s.claims_waiting += 1;
            self.state.1.notify_all();
            while s.claims_held_for.as_deref() == Some(who) {
                s = self.state.1.wait(s);
            }
            s.claims_waiting -= 1;
        }
        // Taken, but the answer lost on the way (Redis killed as it answered).
        s.fault("append_answer")?;
        Ok(Appended { lsn, wanted, held })
    }

    fn version(&self, key: u64) -> Result<u64, EngineError> {
        let mut s = self.state.0.lock();
        s.fault("version")?;
        Ok(s.exclusive_version(key))
    }

    fn trim_versions(&self, upto: u64, kept: u64) -> Result<u64, EngineError> {
        let mut s = self.state.0.lock();
        s.fault("trim_versions")?;
        let floor = s.version_floor.max(upto.min(s.head));
        s.version_floor = floor;
        let before = s.versions.len() + s.shared_versions.len();
        s.versions.retain(|k, v| *v > floor || *k >= kept);
        s.shared_versions.retain(|k, v| *v > floor || *k >= kept);
        Ok((before - s.versions.len() - s.shared_versions.len()) as u64)
    }

    fn read_after(&self, after: u64, max: usize) -> Result<Vec<(u64, Vec<u8>)>, EngineError> {
        let mut s = self.state.0.lock();
        s.fault("read_after")?;
        s.reads += 1;
        Ok(s.log
            .range(after + 1..)
            .take(max)
            .map(|(l, r)| (*l, r.clone()))
            .collect())
    }

    fn put_checkpoint(&self, checkpoint: &Checkpoint, trim: u64) -> Result<(), EngineError> {
        let mut s = self.state.0.lock();
        if s.checkpoint
            .as_ref()
            .is_some_and(|c| c.lsn >= checkpoint.lsn)
        {
            return Ok(());
        }
        s.log = s.log.split_off(&(trim.min(checkpoint.lsn) + 1));
        s.checkpoint = Some(checkpoint.clone());
        Ok(())
    }

    fn checkpoint(&self) -> Result<Option<Checkpoint>, EngineError> {
        Ok(self.state.0.lock().checkpoint.clone())
    }

    fn checkpoint_lsn(&self) -> Result<Option<u64>, EngineError> {
        Ok(self.state.0.lock().checkpoint.as_ref().map(|c| c.lsn))
    }

    fn take_turn(
        &self,
        who: &str,
        key: u64,
        lease: Duration,
        wait: Duration,
    ) -> Result<u64, EngineError> {
        let start = Instant::now();
        let (lock, cv) = &*self.state;
        let mut s = lock.lock();
        loop {
            let now = Instant::now();
            match s.turns.get(&key).cloned() {
                Some((h, until)) if h != who && until > now => {
                    if !live(&s.sessions, who) {
                        return Err(EngineError::NoSession { who: who.into() });
                    }
                    ask(&mut s, key, &h);
                    cv.notify_all();
                    let left = wait.saturating_sub(start.elapsed());
                    if left.is_zero() {
                        return Err(EngineError::TurnBusy {
                            key,
                            holder: h,
                            waited: start.elapsed(),
                        });
                    }
                    // Woken when a turn is given back; else when its lease may have run out.
                    let until = (until - now).min(left);
                    s = cv.wait_timeout(s, until).0;
                }
                _ => {
                    if !live(&s.sessions, who) {
                        return Err(EngineError::NoSession { who: who.into() });
                    }
                    s.turns.insert(key, (who.to_string(), now + lease));
                    s.wanted.remove(&key);
                    return Ok(s.checked_version(key, false, None));
                }
            }
        }
    }

    fn give_turns(&self, who: &str, keys: &[u64]) -> Result<(), EngineError> {
        let (lock, cv) = &*self.state;
        let mut s = lock.lock();
        for key in keys {
            if matches!(s.turns.get(key), Some((h, _)) if h == who) {
                s.turns.remove(key);
                s.wanted.remove(key);
            }
        }
        cv.notify_all();
        Ok(())
    }

    fn wanted(&self, who: &str, wait: Duration) -> Result<Vec<u64>, EngineError> {
        let (lock, cv) = &*self.state;
        let deadline = Instant::now() + wait;
        let mut s = lock.lock();
        loop {
            if let Some(asked) = s.asked.remove(who).filter(|a| !a.is_empty()) {
                return Ok(asked);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Vec::new());
            }
            s = cv.wait_timeout(s, deadline - now).0;
        }
    }

    fn alloc_inos(&self, n: u64, floor: u64) -> Result<u64, EngineError> {
        let mut s = self.state.0.lock();
        s.last_ino = s.last_ino.max(floor.saturating_sub(1));
        let first = s.last_ino + 1;
        s.last_ino += n;
        Ok(first)
    }

    fn format(&self) -> Result<Option<u32>, EngineError> {
        Ok(self.state.0.lock().format)
    }

    fn upgrade(&self, who: &str) -> Result<(), EngineError> {
        let mut s = self.state.0.lock();
        let found = s.format.unwrap_or(1);
        if found >= SHARED_FORMAT {
            return Ok(());
        }
        let mut live_others: Vec<String> = s
            .sessions
            .keys()
            .filter(|w| *w != who && live(&s.sessions, w))
            .cloned()
            .collect();
        if !live_others.is_empty() {
            live_others.sort();
            return Err(EngineError::Format {
                found,
                ours: SHARED_FORMAT,
                live: live_others,
            });
        }
        s.format = Some(SHARED_FORMAT);
        Ok(())
    }

    fn start_session(&self, who: &str, ttl: Duration) -> Result<(), EngineError> {
        let mut s = self.state.0.lock();
        s.beat(ttl);
        s.sessions.insert(who.to_string(), Instant::now() + ttl);
        Ok(())
    }

    fn heartbeat(&self, who: &str, ttl: Duration) -> Result<(), EngineError> {
        let mut s = self.state.0.lock();
        s.fault("heartbeat")?;
        s.beat(ttl);
        if !live(&s.sessions, who) {
            return Err(EngineError::NoSession { who: who.into() });
        }
        s.sessions.insert(who.to_string(), Instant::now() + ttl);
        Ok(())
    }

    fn expired_sessions(&self) -> Result<Vec<String>, EngineError> {
        let now = Instant::now();
        let s = self.state.0.lock();
        if s.away() {
            return Ok(Vec::new());
        }
        let mut out: Vec<String> = s
            .sessions
            .iter()
            .filter(|(_, until)| **until < now)
            .map(|(w, _)| w.clone())
            .collect();
        out.sort();
        Ok(out)
    }

    fn drop_session(&self, who: &str) -> Result<(), EngineError> {
        let mut s = self.state.0.lock();
        s.sessions.remove(who);
        s.open.retain(|_, by| {
            by.remove(who);
            !by.is_empty()
        });
        Ok(())
    }

    fn remove_volume(&self) -> Result<(), EngineError> {
        let mut s = self.state.0.lock();
        let mut live: Vec<String> = s
            .sessions
            .keys()
            .filter(|w| live(&s.sessions, w))
            .cloned()
            .collect();
        if !live.is_empty() {
            live.sort();
            return Err(EngineError::InUse { live });
        }
        *s = State::default();
        Ok(())
    }

    fn mark_open(&self, who: &str, ino: u64) -> Result<(), EngineError> {
        let mut s = self.state.0.lock();
        if !live(&s.sessions, who) {
            return Err(EngineError::NoSession { who: who.into() });
        }
        s.open.entry(ino).or_default().insert(who.to_string());
        Ok(())
    }

    fn unmark_open(&self, who: &str, inos: &[u64]) -> Result<(), EngineError> {
        let mut s = self.state.0.lock();
        for ino in inos {
            if let Some(by) = s.open.get_mut(ino) {
                by.remove(who);
                if by.is_empty() {
                    s.open.remove(ino);
                }
            }
        }
        Ok(())
    }

    fn open_elsewhere(&self, who: &str, ino: u64) -> Result<Option<String>, EngineError> {
        Ok(self.state.0.lock().open_elsewhere(who, ino))
    }

    fn marked_by(&self, who: &str) -> Result<Vec<u64>, EngineError> {
        let s = self.state.0.lock();
        let mut out: Vec<u64> = s
            .open
            .iter()
            .filter(|(_, by)| by.contains(who))
            .map(|(ino, _)| *ino)
            .collect();
        out.sort_unstable();
        Ok(out)
    }

    fn create_volume(&self, servers: &[String]) -> Result<bool, EngineError> {
        let mut st = self.state.0.lock();
        if st.servers.is_some() {
            return Ok(false);
        }
        st.servers = Some(servers.to_vec());
        st.format = Some(SHARED_FORMAT);
        st.whole = true;
        Ok(true)
    }

    fn servers(&self) -> Result<Option<Vec<String>>, EngineError> {
        Ok(self.state.0.lock().servers.clone())
    }

    /// It keeps one volume, which has no name: listed as `(in-memory)` once made.
    fn volumes(&self) -> Result<Vec<String>, EngineError> {
        let made = self.state.0.lock().servers.is_some();
        Ok(if made {
            vec!["(in-memory)".into()]
        } else {
            Vec::new()
        })
    }

    fn locks(&self, ino: u64) -> Result<Vec<u8>, EngineError> {
        Ok(self
            .state
            .0
            .lock()
            .locks
            .get(&ino)
            .cloned()
            .unwrap_or_default())
    }

    fn swap_locks(&self, who: &str, ino: u64, old: &[u8], new: &[u8]) -> Result<bool, EngineError> {
        let mut s = self.state.0.lock();
        s.fault("swap_locks")?;
        if !live(&s.sessions, who) {
            return Err(EngineError::NoSession { who: who.into() });
        }
        if s.locks.get(&ino).map_or(&[][..], |t| t.as_slice()) != old {
            return Ok(false);
        }
        if new.is_empty() {
            s.locks.remove(&ino);
        } else {
            s.locks.insert(ino, new.to_vec());
        }
        Ok(true)
    }

    fn locked_inodes(&self) -> Result<Vec<u64>, EngineError> {
        Ok(self.state.0.lock().locks.keys().copied().collect())
    }

    fn state(&self) -> Result<StateDump, EngineError> {
        let mut s = self.state.0.lock();
        s.fault("state")?;
        Ok(s.namespace.clone())
    }

    fn put_state(&self, at: u64, ops: &[KeyOp], whole: bool) -> Result<bool, EngineError> {
        let mut s = self.state.0.lock();
        s.fault("put_state")?;
        if s.head != at {
            return Ok(false);
        }
        super::state::apply(&mut s.namespace, at, ops);
        s.state_writes.push((at, ops.to_vec()));
        s.whole |= whole;
        Ok(true)
    }

    fn load_state(
        &self,
        dirs: &[u64],
        inodes: &[u64],
        names_at_most: u64,
    ) -> Result<StateLoad, EngineError> {
        let mut s = self.state.0.lock();
        s.fault("load_state")?;
        let (dump, too_big) = super::state::load(&s.namespace, dirs, inodes, names_at_most);
        Ok(StateLoad {
            head: s.head,
            dump,
            too_big,
        })
    }

    fn names_page(&self, dir: u64, cursor: u64, count: u64) -> Result<NamesPage, EngineError> {
        let (page, then) = {
            let mut s = self.state.0.lock();
            s.fault("names_page")?;
            let (names, next) = super::state::names_page(&s.namespace, dir, cursor, count);
            let page = NamesPage {
                names,
                next,
                head: s.head,
            };
            (page, s.after_page.take())
        };
        if let Some(then) = then {
            then();
        }
        Ok(page)
    }

    fn state_inodes(&self) -> Result<Vec<u64>, EngineError> {
        let (listed, then) = {
            let mut s = self.state.0.lock();
            (super::state::inodes(&s.namespace), s.after_listing.take())
        };
        if let Some(then) = then {
            then();
        }
        Ok(listed)
    }

    fn state_whole(&self) -> Result<bool, EngineError> {
        Ok(self.state.0.lock().whole)
    }

    fn note_inodes(&self, n: u64) -> Result<(), EngineError> {
        let mut s = self.state.0.lock();
        s.fault("note_inodes")?;
        s.noted_inodes = Some(n);
        Ok(())
    }

    fn noted_inodes(&self) -> Result<Option<u64>, EngineError> {
        Ok(self.state.0.lock().noted_inodes)
    }

    fn owe_collection(&self, who: &str) -> Result<(), EngineError> {
        let mut s = self.state.0.lock();
        s.fault("owe_collection")?;
        s.owed.insert(who.to_string());
        Ok(())
    }

    fn owed_collections(&self) -> Result<Vec<String>, EngineError> {
        Ok(self.state.0.lock().owed.iter().cloned().collect())
    }

    fn collected(&self, who: &str) -> Result<(), EngineError> {
        self.state.0.lock().owed.remove(who);
        Ok(())
    }
}
