//! The metadata engine on Redis (`--meta redis://HOST:PORT[/DB]`): one volume's log, its
//! checkpoint, the write turn and the sessions, each a key under `rmemfs:{VOLUME}:` (the
//! braces are a hash tag: in a Redis Cluster every key of a volume sits in one slot, which
//! the scripts below need).
//!
//! Every step that must be atomic is one Lua script (Redis runs a script alone): the append
//! checks the turn and the log's head before it adds the record, so a client whose turn
//! lapsed can never add a change; the checkpoint is stored and the log trimmed in one step;
//! session times are the Redis server's clock (`TIME`), so clients' clocks may differ.
//!
//! Keys: `head` (the last change's number), `log` (a stream, entry `LSN-1` holding the record
//! under `r`), `ckpt` (a hash: `lsn`, `image`), `turn` (the holder's name, with a lease
//! expiry), `sessions` (a hash: name to the Redis time its heartbeat runs out, in ms),
//! `locks` (a hash: inode number to its lock table, `meta::locks`), `servers` (the memory
//! servers' addresses in the volume's order, one per line).

use super::{Checkpoint, EngineError, MetaEngine};
use crate::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a request to Redis may take before the engine counts as unavailable: a live
/// Redis answers in well under a millisecond here; this covers a loaded one.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The start of a script that needs session `ARGV[who]` (of hash `KEYS[sessions]`) to live:
/// there, and its last heartbeat not run out by Redis's clock.
macro_rules! live_session {
    ($sessions:literal, $who:literal, $refused:literal) => {
        concat!(
            "local t = redis.call('TIME')\n",
            "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n",
            "local exp = redis.call('HGET', KEYS[",
            $sessions,
            "], ARGV[",
            $who,
            "])\n",
            "if not exp or tonumber(exp) < now then return ",
            $refused,
            " end\n"
        )
    };
}

const APPEND: &str = concat!(
    live_session!("4", "3", "{-2, 0, 0}"),
    r#"
if redis.call('GET', KEYS[3]) ~= ARGV[3] then return {-1, 0, 0} end
local head = tonumber(redis.call('GET', KEYS[1]) or '0')
if head + 1 ~= tonumber(ARGV[1]) then return {0, head, 0} end
redis.call('XADD', KEYS[2], ARGV[1] .. '-1', 'r', ARGV[2])
redis.call('SET', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[3], ARGV[4])
return {1, head + 1, redis.call('EXISTS', KEYS[5])}
"#
);

const SWAP_LOCKS: &str = concat!(
    live_session!("2", "1", "-2"),
    r#"
local cur = redis.call('HGET', KEYS[1], ARGV[2]) or ''
if cur ~= ARGV[3] then return 0 end
if ARGV[4] == '' then redis.call('HDEL', KEYS[1], ARGV[2])
else redis.call('HSET', KEYS[1], ARGV[2], ARGV[4]) end
return 1
"#
);

const PUT_CHECKPOINT: &str = r#"
local cur = redis.call('HGET', KEYS[1], 'lsn')
if cur and tonumber(ARGV[1]) <= tonumber(cur) then return 0 end
redis.call('HSET', KEYS[1], 'lsn', ARGV[1], 'image', ARGV[2])
redis.call('XTRIM', KEYS[2], 'MINID', (tonumber(ARGV[1]) + 1) .. '-0')
return 1
"#;

/// Takes the turn (`KEYS[1]`) for `ARGV[1]` and reads the log (`KEYS[2]`) from id `ARGV[3]`
/// (`ARGV[4]` entries at most; none when `ARGV[3]` is empty), or marks it wanted (`KEYS[3]`).
const TAKE_TURN: &str = r#"
local cur = redis.call('GET', KEYS[1])
if cur == false or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  redis.call('DEL', KEYS[3])
  if ARGV[3] == '' then return {'', {}} end
  return {'', redis.call('XRANGE', KEYS[2], ARGV[3], '+', 'COUNT', ARGV[4])}
end
redis.call('SET', KEYS[3], '1', 'PX', ARGV[2])
return {cur, {}}
"#;

const GIVE_TURN: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"#;

const HEARTBEAT: &str = r#"
if ARGV[3] == '0' and redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], now + tonumber(ARGV[2]))
return 1
"#;

const EXPIRED: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  if tonumber(all[i + 1]) < now then table.insert(out, all[i]) end
end
return out
"#;

/// One volume's keys on one Redis server.
pub struct RedisEngine {
    url: String,
    client: ::redis::Client,
    /// One connection, made again after a failure (requests are short and few per change).
    conn: Mutex<Option<::redis::Connection>>,
    keys: Keys,
    scripts: Scripts,
}

struct Keys {
    head: String,
    log: String,
    ckpt: String,
    turn: String,
    /// Set while a client waits for the turn: the holder's next append is told.
    wanted: String,
    sessions: String,
    locks: String,
    servers: String,
}

struct Scripts {
    append: ::redis::Script,
    put_checkpoint: ::redis::Script,
    take_turn: ::redis::Script,
    give_turn: ::redis::Script,
    heartbeat: ::redis::Script,
    expired: ::redis::Script,
    swap_locks: ::redis::Script,
}

fn unavailable(e: impl std::fmt::Display) -> EngineError {
    EngineError::Unavailable(e.to_string())
}

impl RedisEngine {
    /// The engine for volume `volume` at `url` (`redis://HOST:PORT[/DB]`); connects once to
    /// say early if Redis is not there.
    pub fn open(url: &str, volume: &str) -> Result<RedisEngine, EngineError> {
        let client = ::redis::Client::open(url)
            .map_err(|e| EngineError::Unavailable(format!("{url}: {e}")))?;
        let k = |what: &str| format!("rmemfs:{{{volume}}}:{what}");
        let engine = RedisEngine {
            url: url.to_string(),
            client,
            conn: Mutex::new(None),
            keys: Keys {
                head: k("head"),
                log: k("log"),
                ckpt: k("ckpt"),
                turn: k("turn"),
                wanted: k("wanted"),
                sessions: k("sessions"),
                locks: k("locks"),
                servers: k("servers"),
            },
            scripts: Scripts {
                append: ::redis::Script::new(APPEND),
                put_checkpoint: ::redis::Script::new(PUT_CHECKPOINT),
                take_turn: ::redis::Script::new(TAKE_TURN),
                give_turn: ::redis::Script::new(GIVE_TURN),
                heartbeat: ::redis::Script::new(HEARTBEAT),
                expired: ::redis::Script::new(EXPIRED),
                swap_locks: ::redis::Script::new(SWAP_LOCKS),
            },
        };
        engine.with(|_| Ok(()))?;
        engine.warn_without_aof();
        Ok(engine)
    }

    /// Says so when Redis keeps no append-only file: a restart of it would lose the whole
    /// namespace. (A Redis that hides `CONFIG` is not asked twice.)
    fn warn_without_aof(&self) {
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

    /// Runs `f` on the connection (made if there is none); a failed request drops it, so the
    /// next one connects again.
    fn with<T>(
        &self,
        f: impl FnOnce(&mut ::redis::Connection) -> ::redis::RedisResult<T>,
    ) -> Result<T, EngineError> {
        let mut slot = self.conn.lock();
        if slot.is_none() {
            let c = self
                .client
                .get_connection_with_timeout(REQUEST_TIMEOUT)
                .map_err(|e| EngineError::Unavailable(format!("{}: {e}", self.url)))?;
            c.set_read_timeout(Some(REQUEST_TIMEOUT))
                .and_then(|()| c.set_write_timeout(Some(REQUEST_TIMEOUT)))
                .map_err(unavailable)?;
            *slot = Some(c);
        }
        let c = slot.as_mut().expect("connected above");
        f(c).map_err(|e| {
            *slot = None;
            EngineError::Unavailable(format!("{}: {e}", self.url))
        })
    }
}

impl RedisEngine {
    /// Sets `who`'s expiry `ttl` from now (Redis's clock); only if it exists unless `start`.
    fn session(&self, who: &str, ttl: Duration, start: bool) -> Result<(), EngineError> {
        let set: i64 = self.with(|c| {
            self.scripts
                .heartbeat
                .key(&self.keys.sessions)
                .arg(who)
                .arg(ttl.as_millis() as u64)
                .arg(if start { "1" } else { "0" })
                .invoke(c)
        })?;
        match set {
            1 => Ok(()),
            _ => Err(EngineError::NoSession { who: who.into() }),
        }
    }
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

impl RedisEngine {
    /// Takes the turn (see [`MetaEngine::take_turn`]), and in the same step reads the log
    /// after `read.0` (`read.1` entries at most).
    fn take_turn_reading(
        &self,
        who: &str,
        lease: Duration,
        wait: Duration,
        read: Option<(u64, usize)>,
    ) -> Result<Vec<(u64, Vec<u8>)>, EngineError> {
        let start = Instant::now();
        let (from, max) = match read {
            Some((after, max)) => (format!("{}-0", after + 1), max),
            None => (String::new(), 0),
        };
        // Backoff between tries: short first (a turn is held for one change), up to 1 ms.
        let mut pause = Duration::from_micros(50);
        loop {
            let (holder, rows): (String, Vec<LogEntry>) = self.with(|c| {
                self.scripts
                    .take_turn
                    .key(&self.keys.turn)
                    .key(&self.keys.log)
                    .key(&self.keys.wanted)
                    .arg(who)
                    .arg(lease.as_millis().max(1) as u64)
                    .arg(&from)
                    .arg(max)
                    .invoke(c)
            })?;
            if holder.is_empty() {
                return log_entries(rows);
            }
            if start.elapsed() >= wait {
                return Err(EngineError::TurnBusy {
                    holder,
                    waited: start.elapsed(),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }
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
        lsn: u64,
        record: &[u8],
        lease: Duration,
    ) -> Result<bool, EngineError> {
        let (done, head, wanted): (i64, u64, i64) = self.with(|c| {
            self.scripts
                .append
                .key(&self.keys.head)
                .key(&self.keys.log)
                .key(&self.keys.turn)
                .key(&self.keys.sessions)
                .key(&self.keys.wanted)
                .arg(lsn)
                .arg(record)
                .arg(who)
                .arg(lease.as_millis().max(1) as u64)
                .invoke(c)
        })?;
        match done {
            1 => Ok(wanted == 1),
            0 => Err(EngineError::Behind { head }),
            -2 => Err(EngineError::NoSession { who: who.into() }),
            _ => Err(EngineError::NotYourTurn { who: who.into() }),
        }
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

    fn put_checkpoint(&self, checkpoint: &Checkpoint) -> Result<(), EngineError> {
        let _: i64 = self.with(|c| {
            self.scripts
                .put_checkpoint
                .key(&self.keys.ckpt)
                .key(&self.keys.log)
                .arg(checkpoint.lsn)
                .arg(checkpoint.image.as_slice())
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

    fn take_turn(&self, who: &str, lease: Duration, wait: Duration) -> Result<(), EngineError> {
        self.take_turn_reading(who, lease, wait, None).map(|_| ())
    }

    fn take_turn_after(
        &self,
        who: &str,
        lease: Duration,
        wait: Duration,
        after: u64,
        max: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, EngineError> {
        self.take_turn_reading(who, lease, wait, Some((after, max)))
    }

    fn give_turn(&self, who: &str) -> Result<(), EngineError> {
        let _: i64 = self.with(|c| {
            self.scripts
                .give_turn
                .key(&self.keys.turn)
                .arg(who)
                .invoke(c)
        })?;
        Ok(())
    }

    fn start_session(&self, who: &str, ttl: Duration) -> Result<(), EngineError> {
        self.session(who, ttl, true)
    }

    fn heartbeat(&self, who: &str, ttl: Duration) -> Result<(), EngineError> {
        self.session(who, ttl, false)
    }

    fn expired_sessions(&self) -> Result<Vec<String>, EngineError> {
        self.with(|c| self.scripts.expired.key(&self.keys.sessions).invoke(c))
    }

    fn drop_session(&self, who: &str) -> Result<(), EngineError> {
        let _: i64 = self.with(|c| {
            ::redis::cmd("HDEL")
                .arg(&self.keys.sessions)
                .arg(who)
                .query(c)
        })?;
        Ok(())
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
        // One address per line; SET NX answers OK having stored, nil when the key exists.
        let stored: Option<String> = self.with(|c| {
            ::redis::cmd("SET")
                .arg(&self.keys.servers)
                .arg(servers.join("\n"))
                .arg("NX")
                .query(c)
        })?;
        Ok(stored.is_some())
    }

    fn servers(&self) -> Result<Option<Vec<String>>, EngineError> {
        let stored: Option<String> =
            self.with(|c| ::redis::cmd("GET").arg(&self.keys.servers).query(c))?;
        Ok(stored.map(|list| list.lines().map(str::to_string).collect()))
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

    fn locked_inodes(&self) -> Result<Vec<u64>, EngineError> {
        self.with(|c| ::redis::cmd("HKEYS").arg(&self.keys.locks).query(c))
    }
}
