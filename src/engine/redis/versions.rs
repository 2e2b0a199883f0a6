//! The versions on Redis (`vers`, `svers` and their floor `vfloor`): a key's version read
//! with the floor in one transaction, and the trim that forgets versions at or below a floor
//! (see [`crate::engine::MetaEngine::trim_versions`]).

use super::RedisEngine;
use crate::engine::EngineError;
#[cfg(doc)]
use crate::engine::MetaEngine;

impl RedisEngine {
    /// [`MetaEngine::version`].
    pub(super) fn read_version(&self, key: u64) -> Result<u64, EngineError> {
        // One transaction: a version trimmed between the two reads would read as an older
        // floor.
        let (v, floor): (Option<u64>, Option<u64>) = self.with(|c| {
            ::redis::pipe()
                .atomic()
                .cmd("HGET")
                .arg(&self.keys.vers)
                .arg(key)
                .cmd("GET")
                .arg(&self.keys.vfloor)
                .query(c)
        })?;
        Ok(v.or(floor).unwrap_or(0))
    }

    /// [`MetaEngine::trim_versions`]: the floor raised, then each hash listed a batch at a
    /// time and its stale keys removed by the script.
    pub(super) fn trim_versions_upto(&self, upto: u64, kept: u64) -> Result<u64, EngineError> {
        /// Keys listed, and checked by the script, per call: a call's time in Redis stays
        /// short (about a millisecond) however many versions the volume keeps.
        const BATCH: usize = 1000;
        // Raises the floor, then removes the keys of `stale` in `hash` at or below it.
        let trim = |hash: &String, stale: &[u64]| -> Result<u64, EngineError> {
            self.with(|c| {
                self.scripts
                    .trim_versions
                    .key(&self.keys.vfloor)
                    .key(&self.keys.head)
                    .key(hash)
                    .arg(upto)
                    .arg(stale)
                    .invoke(c)
            })
        };
        // The floor first, so every key listed below it is one the script may remove.
        let mut removed = trim(&self.keys.vers, &[])?;
        for hash in [&self.keys.vers, &self.keys.svers] {
            let mut cursor = 0u64;
            loop {
                let (next, listed): (u64, Vec<(u64, u64)>) = self.with(|c| {
                    ::redis::cmd("HSCAN")
                        .arg(hash)
                        .arg(cursor)
                        .arg("COUNT")
                        .arg(BATCH)
                        .query(c)
                })?;
                let stale: Vec<u64> = listed
                    .iter()
                    .filter(|(k, v)| *v <= upto && *k < kept)
                    .map(|(k, _)| *k)
                    .collect();
                if !stale.is_empty() {
                    removed += trim(hash, &stale)?;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(removed)
    }
}
