//! The namespace's state on Redis ([`crate::engine::state`]): each of its hashes a key
//! `rmemfs:{VOLUME}:s:NAME`, written by the append script (and [`RedisEngine::put_state_at`])
//! from the writes each change sends, four arguments each.

use super::{unavailable, RedisEngine};
use crate::engine::state::{time_value, INFO_HASH, INODE, STATE_PREFIX};
use crate::engine::{EngineError, KeyOp, NamesPage, StateDump, StateLoad};

/// How many state writes one [`RedisEngine::put_state_at`] call sends at most: a table's
/// image goes a part at a time, so no one script holds Redis for long.
pub(super) const PUT_STATE_BATCH: usize = 2_000;

/// Adds `ops` to a script's arguments: a code, the hash, the field and the value each (the
/// scripts' `state_ops`).
pub(super) fn push_ops(script: &mut ::redis::ScriptInvocation<'_>, ops: &[KeyOp]) {
    for op in ops {
        let (code, hash, field, value): (&str, &str, &[u8], Vec<u8>) = match op {
            KeyOp::Put { hash, field, value } => ("P", hash, field, value.clone()),
            KeyOp::PutPlaced { hash, field, value } => ("L", hash, field, value.clone()),
            KeyOp::PutAtPlace { hash, field, value } => ("N", hash, field, value.clone()),
            KeyOp::Remove { hash, field } => ("R", hash, field, Vec::new()),
            KeyOp::Clear { hash } => ("C", hash, b"", Vec::new()),
            KeyOp::Add { hash, field, by } => ("A", hash, field, by.to_string().into_bytes()),
            KeyOp::Later {
                hash,
                field,
                secs,
                nanos,
            } => ("T", hash, field, time_value(*secs, *nanos)),
        };
        script.arg(code).arg(hash).arg(field).arg(value);
    }
}

impl RedisEngine {
    /// Every state hash, each read whole (`HGETALL`) after a `SCAN` for their names: as of
    /// one moment only for a volume no client changes meanwhile.
    pub(super) fn state_dump(&self) -> Result<StateDump, EngineError> {
        let prefix = &self.keys.prefix;
        let names: Vec<String> = self.with(|c| {
            let found =
                ::redis::Commands::scan_match::<_, String>(c, format!("{prefix}{STATE_PREFIX}*"))?;
            found.collect()
        })?;
        let mut out = StateDump::new();
        for name in names {
            let hash = name
                .strip_prefix(prefix.as_str())
                .ok_or_else(|| unavailable(format!("a state key '{name}' outside the volume")))?;
            if hash == INFO_HASH {
                continue;
            }
            let fields: Vec<(Vec<u8>, Vec<u8>)> =
                self.with(|c| ::redis::cmd("HGETALL").arg(&name).query(c))?;
            if !fields.is_empty() {
                out.insert(hash.to_string(), fields.into_iter().collect());
            }
        }
        Ok(out)
    }

    /// [`crate::engine::MetaEngine::put_state`]: [`PUT_STATE_BATCH`] writes a call, each
    /// call checking the head again; whole marked by the last.
    pub(super) fn put_state_at(
        &self,
        at: u64,
        ops: &[KeyOp],
        whole: bool,
    ) -> Result<bool, EngineError> {
        let batches: Vec<&[KeyOp]> = if ops.is_empty() {
            vec![&[]]
        } else {
            ops.chunks(PUT_STATE_BATCH).collect()
        };
        let last = batches.len() - 1;
        for (i, batch) in batches.into_iter().enumerate() {
            let done: i64 = self.with(|c| {
                let mut script = self.scripts.put_state.prepare_invoke();
                script
                    .key(&self.keys.head)
                    .key(&self.keys.prefix)
                    .key(&self.keys.state_info)
                    .arg(at)
                    .arg(if whole && i == last { "1" } else { "0" });
                push_ops(&mut script, batch);
                script.invoke(c)
            })?;
            if done != 1 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// [`crate::engine::MetaEngine::load_state`]: one script, so one moment.
    pub(super) fn load_parts(
        &self,
        dirs: &[u64],
        inodes: &[u64],
        names_at_most: u64,
    ) -> Result<StateLoad, EngineError> {
        let (head, flat, too_big): (u64, Vec<Vec<u8>>, Vec<u64>) = self.with(|c| {
            let mut script = self.scripts.load_state.prepare_invoke();
            script
                .key(&self.keys.head)
                .key(&self.keys.prefix)
                .arg(names_at_most)
                .arg(dirs.len());
            for d in dirs.iter().chain(inodes) {
                script.arg(*d);
            }
            script.invoke(c)
        })?;
        let mut dump = StateDump::new();
        for t in flat.chunks(3) {
            let [hash, field, value] = t else {
                return Err(unavailable("the state's load answered a partial triple"));
            };
            let hash = String::from_utf8(hash.clone())
                .map_err(|_| unavailable("the state's load answered a hash not in UTF-8"))?;
            dump.entry(hash)
                .or_default()
                .insert(field.clone(), value.clone());
        }
        Ok(StateLoad {
            head,
            dump,
            too_big,
        })
    }

    /// [`crate::engine::MetaEngine::names_page`]: one script, so one moment.
    pub(super) fn names_page_of(
        &self,
        dir: u64,
        cursor: u64,
        count: u64,
    ) -> Result<NamesPage, EngineError> {
        let (head, next, flat): (u64, u64, Vec<Vec<u8>>) = self.with(|c| {
            self.scripts
                .names_page
                .key(&self.keys.head)
                .key(&self.keys.prefix)
                .arg(dir)
                .arg(cursor)
                .arg(count.max(1))
                .invoke(c)
        })?;
        let mut names = Vec::with_capacity(flat.len() / 2);
        for pair in flat.chunks(2) {
            let [name, child] = pair else {
                return Err(unavailable("a page of names answered a name alone"));
            };
            let ino = std::str::from_utf8(child)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| unavailable("a page of names named no inode"))?;
            names.push((name.clone(), ino));
        }
        Ok(NamesPage { names, next, head })
    }

    /// [`crate::engine::MetaEngine::state_inodes`]: a `SCAN` for the inodes' hashes.
    pub(super) fn made_inodes(&self) -> Result<Vec<u64>, EngineError> {
        let prefix = format!("{}{INODE}", self.keys.prefix);
        let names: Vec<String> = self.with(|c| {
            ::redis::Commands::scan_match::<_, String>(c, format!("{prefix}*"))?.collect()
        })?;
        Ok(names
            .iter()
            .filter_map(|n| n.strip_prefix(&prefix)?.parse().ok())
            .collect())
    }

    /// [`crate::engine::MetaEngine::state_whole`].
    pub(super) fn state_whole_mark(&self) -> Result<bool, EngineError> {
        let whole: Option<String> = self.with(|c| {
            ::redis::cmd("HGET")
                .arg(&self.keys.state_info)
                .arg("whole")
                .query(c)
        })?;
        Ok(whole.is_some())
    }
}
