//! The metadata engine on Redis (`--meta redis://HOST:PORT[/DB]`): one volume's log, its
//! checkpoint, the inodes' versions and turns, and the sessions, each a key under
//! `rmemfs:{VOLUME}:` (the braces are a hash tag: in a Redis Cluster every key of a volume
//! sits in one slot, which the scripts below need).
//!
//! Every step that must be atomic is one Lua script (`scripts.rs`; Redis runs a script
//! alone): the append checks the versions and turns of what the change touches before it
//! adds the record, so a change decided on a stale table, or touching a file another client
//! holds, is never added; the checkpoint is stored and the log trimmed in one step; session
//! times are the Redis server's clock (`TIME`), so clients' clocks may differ. The turns'
//! waits (a take tried again, a holder blocked on its queue) are in `turns.rs`.
//!
//! Keys: `head` (the last change's number), `log` (a stream, entry `LSN-1` holding the record
//! under `r`), `vers` and `svers` (hashes: a key, an inode or a name, to the last change
//! that touched it exclusively, and shared: [`super::Touch`]), `vfloor` (what a key with no
//! version kept reads as: [`super::MetaEngine::trim_versions`]), `turns` (a
//! hash: inode number to `EXPIRY_MS HOLDER`), `wanted` (a set: turned inodes another client
//! asked for), `ckpt` (a hash: `lsn`, `image`), `sessions` (a hash: name to the Redis time its
//! heartbeat runs out, in ms), `beat` (the Redis time a heartbeat last arrived, in ms: see
//! [`super::ENGINE_AWAY`]), `locks` (a hash: inode number to its lock table,
//! `meta::locks`), `open:INO` and `opened:NAME` (sets: the clients that mark a file open, and
//! the files a client marks), `asked:NAME` (a list: inodes of NAME's turns others asked for, which
//! NAME waits on), `servers` (the memory servers' addresses in the volume's order, one per
//! line), `format` (the shared format, [`super::SHARED_FORMAT`]; absent: format 1), `nextino`
//! (the last inode number given out), and `turn`, format 1's one write turn, which an
//! upgraded volume holds for ever ([`super::FORMAT_1_FENCE`]) so that no format-1 client
//! appends again. The namespace's state beside the log ([`super::state`]) is hashes
//! `s:NAME`, and `s:info` (`whole`), written by the append script (`state.rs`).

mod connect;
mod scripts;
mod sessions;
mod settings;
mod state;
mod turns;
mod versions;

use super::{
    Appended, Checkpoint, EngineError, Marks, MetaEngine, Touch, FORMAT_1_FENCE, SHARED_FORMAT,
};
use crate::sync::Mutex;
use scripts::Scripts;
use std::time::Duration;

/// A last line of the `servers` key of a volume in shared format 2 or later, which this
/// build skips: a format-1 client reads it as one more server, so it refuses to mount, naming
/// the volume's servers with this line among them (its list never matches a mount's).
const SERVERS_FORMAT_LINE: &str = "(shared format 7: mount with an rmemfs that speaks it)";

/// How every format line starts (an older one, left by a build that upgraded the volume
/// before this one, is skipped as well).
const SERVERS_FORMAT_PREFIX: &str = "(shared format";

/// How long a request to Redis may take before the engine counts as unavailable: a live
/// Redis answers in well under a millisecond here; this covers a loaded one. (A request
/// whose answer timed out may still run until about then: see the shared client's
/// give-backs.)
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// One volume's keys on one Redis server.
pub struct RedisEngine {
    /// Its URL as messages show it (a password replaced by `***`).
    url: String,
    client: ::redis::Client,
    /// One connection, made again after a failure (requests are short and few per change).
    conn: Mutex<Option<::redis::Connection>>,
    /// The connection [`MetaEngine::wanted`] blocks on.
    waiting: Mutex<Option<::redis::Connection>>,
    keys: Keys,
    scripts: Scripts,
    /// [`super::ENGINE_AWAY`] unless a test shortened it.
    away: Duration,
}

struct Keys {
    head: String,
    log: String,
    vers: String,
    /// The shared versions (see [`crate::engine::Touch`]).
    svers: String,
    /// What a key with no version kept reads as ([`MetaEngine::trim_versions`]).
    vfloor: String,
    turns: String,
    wanted: String,
    /// The prefix of each holder's queue of inodes asked for (`asked:NAME`, a list).
    asked: String,
    /// The prefix of each file's open marks (`open:INO`, a set of clients).
    open: String,
    /// The prefix of each client's marks (`opened:NAME`, a set of inodes).
    opened: String,
    ckpt: String,
    sessions: String,
    /// Evicted sessions whose memory the keeper is to collect.
    owed: String,
    beat: String,
    locks: String,
    servers: String,
    format: String,
    nextino: String,
    /// Format 1's one write turn: fenced on an upgraded volume.
    turn: String,
    /// What every key of the volume starts with (`rmemfs:{VOLUME}:`): the state's hashes
    /// ([`super::state`]) are named under it.
    prefix: String,
    /// The state's own facts (`whole`: [`MetaEngine::state_whole`]).
    state_info: String,
}

fn unavailable(e: impl std::fmt::Display) -> EngineError {
    EngineError::Unavailable(e.to_string())
}

/// A log entry as XRANGE answers it: its id, and its fields (`r`: the record).
type LogEntry = (String, Vec<(String, Vec<u8>)>);

/// The records of log entries, by LSN (an entry's id is `LSN-1`).
fn log_entries(rows: Vec<LogEntry>) -> Result<Vec<(u64, Vec<u8>)>, EngineError> {
    rows.into_iter()
        .map(|(id, fields)| {
            let lsn = id
                .split('-')
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .ok_or_else(|| unavailable(format!("a log entry with id '{id}'")))?;
            let record = fields
                .into_iter()
                .find(|(f, _)| f == "r")
                .map(|(_, v)| v)
                .ok_or_else(|| unavailable(format!("log entry {id} holds no record")))?;
            Ok((lsn, record))
        })
        .collect()
}

impl MetaEngine for RedisEngine {
    fn describe(&self) -> String {
        self.url.clone()
    }

    fn head(&self) -> Result<u64, EngineError> {
        let head: Option<u64> = self.with(|c| ::redis::cmd("GET").arg(&self.keys.head).query(c))?;
        Ok(head.unwrap_or(0))
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
        let (code, a, b, wanted, held): (i64, String, String, Vec<u64>, Vec<u64>) =
            self.with(|c| {
                let mut script = self.scripts.append.prepare_invoke();
                for k in [
                    &self.keys.head,
                    &self.keys.log,
                    &self.keys.sessions,
                    &self.keys.vers,
                    &self.keys.turns,
                    &self.keys.wanted,
                    &self.keys.asked,
                    &self.keys.open,
                    &self.keys.opened,
                    &self.keys.svers,
                    &self.keys.vfloor,
                    &self.keys.prefix,
                ] {
                    script.key(k);
                }
                script
                    .arg(who)
                    .arg(record)
                    .arg(lease.as_millis().max(1) as u64)
                    .arg(touched.len())
                    .arg(claim.len())
                    .arg(marks.opened.len())
                    .arg(marks.dropped.len());
                for t in touched {
                    script
                        .arg(t.key)
                        .arg(t.seen)
                        .arg(if t.shared { "s" } else { "x" });
                }
                for k in claim.iter().chain(marks.opened).chain(marks.dropped) {
                    script.arg(*k);
                }
                for t in marks.checked {
                    script.arg(t.key).arg(t.seen);
                }
                state::push_ops(&mut script, marks.state);
                script.arg(marks.state.len());
                script.invoke(c)
            })?;
        let number = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| unavailable(format!("the append script answered '{v}'")))
        };
        match code {
            1 => Ok(Appended {
                lsn: number(&a)?,
                wanted,
                held,
            }),
            -1 => Err(EngineError::Conflict {
                key: number(&a)?,
                lsn: number(&b)?,
            }),
            -3 => Err(EngineError::Busy {
                key: number(&a)?,
                holder: b,
            }),
            -4 => Err(EngineError::Held {
                key: number(&a)?,
                holder: b,
            }),
            _ => Err(EngineError::NoSession { who: who.into() }),
        }
    }

    fn version(&self, key: u64) -> Result<u64, EngineError> {
        self.read_version(key)
    }

    fn trim_versions(&self, upto: u64, kept: u64) -> Result<u64, EngineError> {
        self.trim_versions_upto(upto, kept)
    }

    fn read_after(&self, after: u64, max: usize) -> Result<Vec<(u64, Vec<u8>)>, EngineError> {
        let rows: Vec<LogEntry> = self.with(|c| {
            ::redis::cmd("XRANGE")
                .arg(&self.keys.log)
                .arg(format!("{}-0", after + 1))
                .arg("+")
                .arg("COUNT")
                .arg(max)
                .query(c)
        })?;
        log_entries(rows)
    }

    fn put_checkpoint(&self, checkpoint: &Checkpoint, trim: u64) -> Result<(), EngineError> {
        let _: i64 = self.with(|c| {
            self.scripts
                .put_checkpoint
                .key(&self.keys.ckpt)
                .key(&self.keys.log)
                .arg(checkpoint.lsn)
                .arg(checkpoint.image.as_slice())
                .arg(trim.min(checkpoint.lsn))
                .invoke(c)
        })?;
        Ok(())
    }

    fn checkpoint(&self) -> Result<Option<Checkpoint>, EngineError> {
        let (lsn, image): (Option<u64>, Option<Vec<u8>>) = self.with(|c| {
            ::redis::cmd("HMGET")
                .arg(&self.keys.ckpt)
                .arg("lsn")
                .arg("image")
                .query(c)
        })?;
        Ok(lsn.zip(image).map(|(lsn, image)| Checkpoint { lsn, image }))
    }

    fn checkpoint_lsn(&self) -> Result<Option<u64>, EngineError> {
        self.with(|c| {
            ::redis::cmd("HGET")
                .arg(&self.keys.ckpt)
                .arg("lsn")
                .query(c)
        })
    }

    fn take_turn(
        &self,
        who: &str,
        key: u64,
        lease: Duration,
        wait: Duration,
    ) -> Result<u64, EngineError> {
        self.take_turn_waiting(who, key, lease, wait)
    }

    fn give_turns(&self, who: &str, keys: &[u64]) -> Result<(), EngineError> {
        self.give_turns_now(who, keys)
    }

    fn wanted(&self, who: &str, wait: Duration) -> Result<Vec<u64>, EngineError> {
        self.wait_wanted(who, wait)
    }

    fn alloc_inos(&self, n: u64, floor: u64) -> Result<u64, EngineError> {
        self.with(|c| {
            self.scripts
                .alloc_inos
                .key(&self.keys.nextino)
                .arg(n)
                .arg(floor)
                .invoke(c)
        })
    }

    fn format(&self) -> Result<Option<u32>, EngineError> {
        self.with(|c| ::redis::cmd("GET").arg(&self.keys.format).query(c))
    }

    fn upgrade(&self, who: &str) -> Result<(), EngineError> {
        let live: Vec<String> = self.with(|c| {
            self.scripts
                .upgrade
                .key(&self.keys.format)
                .key(&self.keys.sessions)
                .key(&self.keys.turn)
                .key(&self.keys.servers)
                .arg(who)
                .arg(SHARED_FORMAT)
                .arg(FORMAT_1_FENCE)
                .arg(SERVERS_FORMAT_LINE)
                .invoke(c)
        })?;
        match live.is_empty() {
            true => Ok(()),
            false => Err(EngineError::Format {
                found: self.format()?.unwrap_or(1),
                ours: SHARED_FORMAT,
                live,
            }),
        }
    }

    fn start_session(&self, who: &str, ttl: Duration) -> Result<(), EngineError> {
        self.session(who, ttl, true)
    }

    fn heartbeat(&self, who: &str, ttl: Duration) -> Result<(), EngineError> {
        self.session(who, ttl, false)
    }

    fn expired_sessions(&self) -> Result<Vec<String>, EngineError> {
        self.with(|c| {
            self.scripts
                .expired
                .key(&self.keys.sessions)
                .key(&self.keys.beat)
                .arg(self.away.as_millis() as u64)
                .invoke(c)
        })
    }

    fn drop_session(&self, who: &str) -> Result<(), EngineError> {
        self.end_session_keys(who)
    }

    fn remove_volume(&self) -> Result<(), EngineError> {
        let live: Vec<String> = self.with(|c| {
            let t: (u64, u64) = ::redis::cmd("TIME").query(c)?;
            let now = t.0 * 1000 + t.1 / 1000;
            let all: Vec<(String, u64)> =
                ::redis::cmd("HGETALL").arg(&self.keys.sessions).query(c)?;
            Ok(all
                .into_iter()
                .filter(|(_, until)| *until >= now)
                .map(|(w, _)| w)
                .collect())
        })?;
        if !live.is_empty() {
            return Err(EngineError::InUse { live });
        }
        // Every key of the volume shares its prefix (`rmemfs:{VOLUME}:`).
        let prefix = self.keys.head.trim_end_matches("head").to_string();
        let keys: Vec<String> = self.with(|c| {
            let found = ::redis::Commands::scan_match::<_, String>(c, format!("{prefix}*"))?;
            found.collect()
        })?;
        for batch in keys.chunks(512) {
            self.with(|c| ::redis::cmd("DEL").arg(batch).query::<()>(c))?;
        }
        Ok(())
    }

    fn mark_open(&self, who: &str, ino: u64) -> Result<(), EngineError> {
        self.add_open_mark(who, ino)
    }

    fn unmark_open(&self, who: &str, inos: &[u64]) -> Result<(), EngineError> {
        self.remove_open_marks(who, inos)
    }

    fn open_elsewhere(&self, who: &str, ino: u64) -> Result<Option<String>, EngineError> {
        self.open_by_another(who, ino)
    }

    fn marked_by(&self, who: &str) -> Result<Vec<u64>, EngineError> {
        self.open_marks_of(who)
    }

    fn volumes(&self) -> Result<Vec<String>, EngineError> {
        let (head, tail) = ("rmemfs:{", "}:servers");
        let keys: Vec<String> = self.with(|c| {
            let found = ::redis::Commands::scan_match::<_, String>(c, format!("{head}*{tail}"))?;
            found.collect()
        })?;
        let mut names: Vec<String> = keys
            .iter()
            .filter_map(|k| k.strip_prefix(head)?.strip_suffix(tail))
            .map(str::to_string)
            .collect();
        names.sort();
        Ok(names)
    }

    fn create_volume(&self, servers: &[String]) -> Result<bool, EngineError> {
        let made: i64 = self.with(|c| {
            self.scripts
                .create_volume
                .key(&self.keys.servers)
                .key(&self.keys.format)
                .key(&self.keys.turn)
                .key(&self.keys.state_info)
                .arg(format!("{}\n{SERVERS_FORMAT_LINE}", servers.join("\n")))
                .arg(SHARED_FORMAT)
                .arg(FORMAT_1_FENCE)
                .invoke(c)
        })?;
        Ok(made == 1)
    }

    fn servers(&self) -> Result<Option<Vec<String>>, EngineError> {
        let stored: Option<String> =
            self.with(|c| ::redis::cmd("GET").arg(&self.keys.servers).query(c))?;
        Ok(stored.map(|list| {
            list.lines()
                .filter(|l| !l.starts_with(SERVERS_FORMAT_PREFIX))
                .map(str::to_string)
                .collect()
        }))
    }

    fn locks(&self, ino: u64) -> Result<Vec<u8>, EngineError> {
        let got: Option<Vec<u8>> =
            self.with(|c| ::redis::cmd("HGET").arg(&self.keys.locks).arg(ino).query(c))?;
        Ok(got.unwrap_or_default())
    }

    fn swap_locks(&self, who: &str, ino: u64, old: &[u8], new: &[u8]) -> Result<bool, EngineError> {
        let done: i64 = self.with(|c| {
            self.scripts
                .swap_locks
                .key(&self.keys.locks)
                .key(&self.keys.sessions)
                .arg(who)
                .arg(ino)
                .arg(old)
                .arg(new)
                .invoke(c)
        })?;
        match done {
            -2 => Err(EngineError::NoSession { who: who.into() }),
            d => Ok(d == 1),
        }
    }

    fn state(&self) -> Result<super::StateDump, EngineError> {
        self.state_dump()
    }

    fn put_state(&self, at: u64, ops: &[super::KeyOp], whole: bool) -> Result<bool, EngineError> {
        self.put_state_at(at, ops, whole)
    }

    fn load_state(
        &self,
        dirs: &[u64],
        inodes: &[u64],
        names_at_most: u64,
    ) -> Result<super::StateLoad, EngineError> {
        self.load_parts(dirs, inodes, names_at_most)
    }

    fn names_page(
        &self,
        dir: u64,
        cursor: u64,
        count: u64,
    ) -> Result<super::NamesPage, EngineError> {
        self.names_page_of(dir, cursor, count)
    }

    fn state_inodes(&self) -> Result<Vec<u64>, EngineError> {
        self.made_inodes()
    }

    fn state_whole(&self) -> Result<bool, EngineError> {
        self.state_whole_mark()
    }

    fn note_inodes(&self, n: u64) -> Result<(), EngineError> {
        self.with(|c| {
            ::redis::cmd("HSET")
                .arg(&self.keys.state_info)
                .arg("inodes")
                .arg(n)
                .query(c)
        })
    }

    fn owe_collection(&self, who: &str) -> Result<(), EngineError> {
        self.with(|c| ::redis::cmd("SADD").arg(&self.keys.owed).arg(who).query(c))
    }

    fn owed_collections(&self) -> Result<Vec<String>, EngineError> {
        self.with(|c| ::redis::cmd("SMEMBERS").arg(&self.keys.owed).query(c))
    }

    fn collected(&self, who: &str) -> Result<(), EngineError> {
        self.with(|c| ::redis::cmd("SREM").arg(&self.keys.owed).arg(who).query(c))
    }

    fn noted_inodes(&self) -> Result<Option<u64>, EngineError> {
        self.with(|c| {
            ::redis::cmd("HGET")
                .arg(&self.keys.state_info)
                .arg("inodes")
                .query(c)
        })
    }

    fn locked_inodes(&self) -> Result<Vec<u64>, EngineError> {
        self.with(|c| ::redis::cmd("HKEYS").arg(&self.keys.locks).query(c))
    }
}
