//! The Redis settings a shared volume depends on, checked when the engine opens: persistence
//! (warned about when off) and key eviction (refused when it may drop any key).

use super::{EngineError, RedisEngine};

impl RedisEngine {
    /// Says so when Redis keeps no append-only file: a restart of it would lose the whole
    /// namespace. (A Redis that hides `CONFIG` is not asked twice.)
    pub(super) fn warn_without_aof(&self) {
        let got: Result<Vec<String>, _> =
            self.with(|c| ::redis::cmd("CONFIG").arg("GET").arg("appendonly").query(c));
        if let Ok(pair) = got {
            if pair.get(1).is_some_and(|v| v == "no") {
                log::warn!(
                    "{}: Redis keeps no append-only file (appendonly no): a restart of Redis \
                     loses the volume's namespace; run it with appendonly yes",
                    self.url
                );
            }
        }
    }

    /// Refuses a Redis that evicts any key under memory pressure (`maxmemory-policy allkeys-*`):
    /// it would drop log entries, versions or sessions of the namespace silently. Its keys have
    /// no expiry, so the `volatile-*` policies leave them; with `noeviction` a full Redis
    /// refuses the append, and the change fails (EIO) and is undone. (A Redis that hides
    /// `CONFIG` is taken as it is.)
    pub(super) fn refuse_eviction(&self) -> Result<(), EngineError> {
        let got: Result<Vec<String>, _> = self.with(|c| {
            ::redis::cmd("CONFIG")
                .arg("GET")
                .arg("maxmemory-policy")
                .query(c)
        });
        match got.ok().and_then(|pair| pair.get(1).cloned()) {
            Some(policy) if policy.starts_with("allkeys") => {
                Err(EngineError::Unavailable(format!(
                    "{}: Redis evicts keys when full (maxmemory-policy {policy}), which would \
                     lose the volume's namespace; set maxmemory-policy noeviction",
                    self.url
                )))
            }
            _ => Ok(()),
        }
    }
}
