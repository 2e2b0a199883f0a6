//! Sessions on Redis: each client's expiry (its heartbeats), the sessions that ran out, a
//! session's end with its keys, and the files each session marks open (`open:INO`, the
//! sessions marking it; `opened:WHO`, what a session marks).

use super::RedisEngine;
use crate::engine::EngineError;
use std::time::Duration;

impl RedisEngine {
    /// Sets `who`'s expiry `ttl` from now (Redis's clock); only if it exists unless `start`.
    pub(super) fn session(&self, who: &str, ttl: Duration, start: bool) -> Result<(), EngineError> {
        let set: i64 = self.with(|c| {
            self.scripts
                .heartbeat
                .key(&self.keys.sessions)
                .key(&self.keys.beat)
                .arg(who)
                .arg(ttl.as_millis() as u64)
                .arg(if start { "1" } else { "0" })
                .arg(self.away.as_millis() as u64)
                .invoke(c)
        })?;
        match set {
            1 => Ok(()),
            _ => Err(EngineError::NoSession { who: who.into() }),
        }
    }

    /// [`crate::engine::MetaEngine::drop_session`].
    pub(super) fn end_session_keys(&self, who: &str) -> Result<(), EngineError> {
        let marked = self.open_marks_of(who)?;
        self.with(|c| {
            let mut p = ::redis::pipe();
            p.cmd("HDEL")
                .arg(&self.keys.sessions)
                .arg(who)
                .ignore()
                .cmd("DEL")
                .arg(format!("{}{who}", self.keys.asked))
                .ignore()
                .cmd("DEL")
                .arg(format!("{}{who}", self.keys.opened))
                .ignore();
            for ino in &marked {
                p.cmd("SREM")
                    .arg(format!("{}{ino}", self.keys.open))
                    .arg(who)
                    .ignore();
            }
            p.query::<()>(c)
        })
    }

    /// [`crate::engine::MetaEngine::mark_open`].
    pub(super) fn add_open_mark(&self, who: &str, ino: u64) -> Result<(), EngineError> {
        let done: i64 = self.with(|c| {
            self.scripts
                .mark_open
                .key(&self.keys.sessions)
                .key(&self.keys.open)
                .key(&self.keys.opened)
                .arg(who)
                .arg(ino)
                .invoke(c)
        })?;
        match done {
            1 => Ok(()),
            _ => Err(EngineError::NoSession { who: who.into() }),
        }
    }

    /// [`crate::engine::MetaEngine::unmark_open`].
    pub(super) fn remove_open_marks(&self, who: &str, inos: &[u64]) -> Result<(), EngineError> {
        if inos.is_empty() {
            return Ok(());
        }
        self.with(|c| {
            let mut p = ::redis::pipe();
            for ino in inos {
                p.cmd("SREM")
                    .arg(format!("{}{ino}", self.keys.open))
                    .arg(who)
                    .ignore()
                    .cmd("SREM")
                    .arg(format!("{}{who}", self.keys.opened))
                    .arg(*ino)
                    .ignore();
            }
            p.query::<()>(c)
        })
    }

    /// [`crate::engine::MetaEngine::open_elsewhere`].
    pub(super) fn open_by_another(
        &self,
        who: &str,
        ino: u64,
    ) -> Result<Option<String>, EngineError> {
        let mut by: Vec<String> = self.with(|c| {
            ::redis::cmd("SMEMBERS")
                .arg(format!("{}{ino}", self.keys.open))
                .query(c)
        })?;
        by.sort();
        Ok(by.into_iter().find(|w| w != who))
    }

    /// [`crate::engine::MetaEngine::marked_by`].
    pub(super) fn open_marks_of(&self, who: &str) -> Result<Vec<u64>, EngineError> {
        let mut inos: Vec<u64> = self.with(|c| {
            ::redis::cmd("SMEMBERS")
                .arg(format!("{}{who}", self.keys.opened))
                .query(c)
        })?;
        inos.sort_unstable();
        Ok(inos)
    }
}
