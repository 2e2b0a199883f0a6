//! An engine in this process's memory, for tests: the same rules as the Redis engine
//! (append only in turn and in order, a checkpoint trims the log, turns and sessions run out),
//! so the conformance tests hold both to one contract and the shared mount can be tested
//! without a Redis server.

use super::{Checkpoint, EngineError, MetaEngine};
use crate::sync::{Arc, Condvar, Mutex};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

#[derive(Default)]
struct State {
    head: u64,
    log: BTreeMap<u64, Vec<u8>>,
    checkpoint: Option<Checkpoint>,
    /// The turn's holder and when its lease runs out.
    turn: Option<(String, Instant)>,
    sessions: HashMap<String, Instant>,
    locks: BTreeMap<u64, Vec<u8>>,
    servers: Option<Vec<String>>,
    /// Another client waited for the turn since it was last taken.
    wanted: bool,
}

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

/// Whether session `who` is there and its last heartbeat has not run out.
fn live(sessions: &HashMap<String, Instant>, who: &str) -> bool {
    sessions
        .get(who)
        .is_some_and(|until| *until >= Instant::now())
}

fn holds(turn: &Option<(String, Instant)>, who: &str) -> bool {
    matches!(turn, Some((h, until)) if h == who && *until > Instant::now())
}

impl MetaEngine for MemEngine {
    fn describe(&self) -> String {
        "an in-memory engine".into()
    }

    fn head(&self) -> Result<u64, EngineError> {
        Ok(self.state.0.lock().head)
    }

    fn append(
        &self,
        who: &str,
        lsn: u64,
        record: &[u8],
        lease: Duration,
    ) -> Result<bool, EngineError> {
        let mut s = self.state.0.lock();
        if !live(&s.sessions, who) {
            return Err(EngineError::NoSession { who: who.into() });
        }
        if !holds(&s.turn, who) {
            return Err(EngineError::NotYourTurn { who: who.into() });
        }
        if s.head + 1 != lsn {
            return Err(EngineError::Behind { head: s.head });
        }
        s.log.insert(lsn, record.to_vec());
        s.head = lsn;
        s.turn = Some((who.to_string(), Instant::now() + lease));
        Ok(s.wanted)
    }

    fn read_after(&self, after: u64, max: usize) -> Result<Vec<(u64, Vec<u8>)>, EngineError> {
        let s = self.state.0.lock();
        Ok(s.log
            .range(after + 1..)
            .take(max)
            .map(|(l, r)| (*l, r.clone()))
            .collect())
    }

    fn put_checkpoint(&self, checkpoint: &Checkpoint) -> Result<(), EngineError> {
        let mut s = self.state.0.lock();
        if s.checkpoint
            .as_ref()
            .is_some_and(|c| c.lsn >= checkpoint.lsn)
        {
            return Ok(());
        }
        s.log = s.log.split_off(&(checkpoint.lsn + 1));
        s.checkpoint = Some(checkpoint.clone());
        Ok(())
    }

    fn checkpoint(&self) -> Result<Option<Checkpoint>, EngineError> {
        Ok(self.state.0.lock().checkpoint.clone())
    }

    fn take_turn(&self, who: &str, lease: Duration, wait: Duration) -> Result<(), EngineError> {
        let start = Instant::now();
        let (lock, cv) = &*self.state;
        let mut s = lock.lock();
        loop {
            let now = Instant::now();
            match s.turn.clone() {
                Some((h, until)) if h != who && until > now => {
                    s.wanted = true;
                    let left = wait.saturating_sub(start.elapsed());
                    if left.is_zero() {
                        return Err(EngineError::TurnBusy {
                            holder: h,
                            waited: start.elapsed(),
                        });
                    }
                    // Woken when the turn is given back; else when its lease may have run out.
                    let until = (until - now).min(left);
                    s = cv.wait_timeout(s, until).0;
                }
                _ => {
                    s.turn = Some((who.to_string(), now + lease));
                    s.wanted = false;
                    return Ok(());
                }
            }
        }
    }

    fn give_turn(&self, who: &str) -> Result<(), EngineError> {
        let (lock, cv) = &*self.state;
        let mut s = lock.lock();
        if matches!(&s.turn, Some((h, _)) if h == who) {
            s.turn = None;
            cv.notify_all();
        }
        Ok(())
    }

    fn start_session(&self, who: &str, ttl: Duration) -> Result<(), EngineError> {
        self.state
            .0
            .lock()
            .sessions
            .insert(who.to_string(), Instant::now() + ttl);
        Ok(())
    }

    fn heartbeat(&self, who: &str, ttl: Duration) -> Result<(), EngineError> {
        match self.state.0.lock().sessions.get_mut(who) {
            Some(until) => {
                *until = Instant::now() + ttl;
                Ok(())
            }
            None => Err(EngineError::NoSession { who: who.into() }),
        }
    }

    fn expired_sessions(&self) -> Result<Vec<String>, EngineError> {
        let now = Instant::now();
        let mut out: Vec<String> = self
            .state
            .0
            .lock()
            .sessions
            .iter()
            .filter(|(_, until)| **until < now)
            .map(|(w, _)| w.clone())
            .collect();
        out.sort();
        Ok(out)
    }

    fn drop_session(&self, who: &str) -> Result<(), EngineError> {
        self.state.0.lock().sessions.remove(who);
        Ok(())
    }

    fn create_volume(&self, servers: &[String]) -> Result<bool, EngineError> {
        let mut st = self.state.0.lock();
        if st.servers.is_some() {
            return Ok(false);
        }
        st.servers = Some(servers.to_vec());
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
}
