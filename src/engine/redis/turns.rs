//! The turns' waits on Redis: a take tried again while another client holds the turn, and
//! a holder blocked on its queue of turns others asked for (a connection of its own).

use super::{unavailable, RedisEngine, REQUEST_TIMEOUT};
use crate::engine::EngineError;
use std::time::{Duration, Instant};

impl RedisEngine {
    /// [`crate::engine::MetaEngine::take_turn`]: tried again with backoff while another holds it.
    pub(super) fn take_turn_waiting(
        &self,
        who: &str,
        key: u64,
        lease: Duration,
        wait: Duration,
    ) -> Result<u64, EngineError> {
        let start = Instant::now();
        // Backoff between tries: short first (a turn is held for a few changes), up to a
        // quarter of a millisecond (the holder gives it back at once when asked, after its
        // minimum hold).
        let mut pause =
            crate::sync::Backoff::new(Duration::from_micros(50), Duration::from_micros(250));
        loop {
            let (taken, what): (i64, String) = self.with(|c| {
                self.scripts
                    .take_turn
                    .key(&self.keys.turns)
                    .key(&self.keys.vers)
                    .key(&self.keys.wanted)
                    .key(&self.keys.sessions)
                    .key(&self.keys.asked)
                    .key(&self.keys.svers)
                    .key(&self.keys.vfloor)
                    .arg(who)
                    .arg(key)
                    .arg(lease.as_millis().max(1) as u64)
                    .invoke(c)
            })?;
            match taken {
                1 => {
                    return what
                        .parse()
                        .map_err(|_| unavailable(format!("inode {key}'s version is '{what}'")))
                }
                -2 => return Err(EngineError::NoSession { who: who.into() }),
                _ if start.elapsed() >= wait => {
                    return Err(EngineError::TurnBusy {
                        key,
                        holder: what,
                        waited: start.elapsed(),
                    })
                }
                _ => {}
            }
            pause.sleep();
        }
    }

    /// [`crate::engine::MetaEngine::give_turns`].
    pub(super) fn give_turns_now(&self, who: &str, keys: &[u64]) -> Result<(), EngineError> {
        if keys.is_empty() {
            return Ok(());
        }
        let _: i64 = self.with(|c| {
            let mut script = self.scripts.give_turns.prepare_invoke();
            script.key(&self.keys.turns).key(&self.keys.wanted).arg(who);
            for k in keys {
                script.arg(*k);
            }
            script.invoke(c)
        })?;
        Ok(())
    }

    /// [`crate::engine::MetaEngine::wanted`]: a blocking pop of this holder's queue.
    pub(super) fn wait_wanted(&self, who: &str, wait: Duration) -> Result<Vec<u64>, EngineError> {
        // On a connection of its own: the wait blocks it.
        let mut slot = self.waiting.lock();
        if slot.is_none() {
            let c = self
                .client
                .get_connection_with_timeout(REQUEST_TIMEOUT)
                .map_err(|e| EngineError::Unavailable(format!("{}: {e}", self.url)))?;
            *slot = Some(c);
        }
        let c = slot.as_mut().expect("connected above");
        let queue = format!("{}{who}", self.keys.asked);
        let got: ::redis::RedisResult<Option<(String, u64)>> = c
            .set_read_timeout(Some(wait + REQUEST_TIMEOUT))
            .and_then(|()| {
                ::redis::cmd("BLPOP")
                    .arg(&queue)
                    .arg(wait.as_secs_f64().max(0.001))
                    .query(c)
            });
        let first = match got {
            Ok(Some((_, key))) => key,
            Ok(None) => return Ok(Vec::new()),
            Err(e) => {
                *slot = None;
                return Err(EngineError::Unavailable(format!("{}: {e}", self.url)));
            }
        };
        // And whatever else was asked meanwhile.
        let rest: Vec<u64> = ::redis::pipe()
            .atomic()
            .cmd("LRANGE")
            .arg(&queue)
            .arg(0)
            .arg(-1)
            .cmd("DEL")
            .arg(&queue)
            .ignore()
            .query::<(Vec<u64>,)>(c)
            .map(|(rest,)| rest)
            .map_err(|e| {
                *slot = None;
                EngineError::Unavailable(format!("{}: {e}", self.url))
            })?;
        Ok(std::iter::once(first).chain(rest).collect())
    }
}
