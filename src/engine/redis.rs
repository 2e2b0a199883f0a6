//! The metadata engine on Redis (`--meta redis://HOST:PORT[/DB]`): one volume's log, its
//! checkpoint, the inodes' versions and turns, and the sessions, each a key under
//! `rmemfs:{VOLUME}:` (the braces are a hash tag: in a Redis Cluster every key of a volume
//! sits in one slot, which the scripts below need).
//!
//! Every step that must be atomic is one Lua script (Redis runs a script alone): the append
//! checks the versions and turns of what the change touches before it adds the record, so a
//! change decided on a stale table, or touching a file another client holds, is never added; the checkpoint is stored and the log trimmed in one step;
//! session times are the Redis server's clock (`TIME`), so clients' clocks may differ.
//!
//! Keys: `head` (the last change's number), `log` (a stream, entry `LSN-1` holding the record
//! under `r`), `vers` (a hash: inode number to the last change that touched it), `turns` (a
//! hash: inode number to `EXPIRY_MS HOLDER`), `wanted` (a set: turned inodes another client
//! asked for), `ckpt` (a hash: `lsn`, `image`), `sessions` (a hash: name to the Redis time its
//! heartbeat runs out, in ms), `locks` (a hash: inode number to its lock table,
//! `meta::locks`), `asked:NAME` (a list: inodes of NAME's turns others asked for, which
//! NAME waits on), `servers` (the memory servers' addresses in the volume's order, one per
//! line), `format` (the shared format, [`super::SHARED_FORMAT`]; absent: format 1), `nextino`
//! (the last inode number given out), and `turn`, format 1's one write turn, which an
//! upgraded volume holds for ever ([`super::FORMAT_1_FENCE`]) so that no format-1 client
//! appends again.

use super::{Appended, Checkpoint, EngineError, MetaEngine, Touch, FORMAT_1_FENCE, SHARED_FORMAT};
use crate::sync::Mutex;
use std::time::{Duration, Instant};

/// A last line of the `servers` key of a volume in shared format 2 or later, which this
/// build skips: a format-1 client reads it as one more server, so it refuses to mount, naming
/// the volume's servers with this line among them (its list never matches a mount's).
const SERVERS_FORMAT_LINE: &str = "(shared format 2: mount with an rmemfs that speaks it)";

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

/// Who holds a turn, from its value `EXPIRY_MS HOLDER` (`t`) at Redis time `now`: `h` is nil
/// when the turn is free or run out.
macro_rules! turn_holder {
    () => {
        r#"
local function holder(t, now)
  if not t then return nil end
  local sp = string.find(t, ' ')
  if tonumber(string.sub(t, 1, sp - 1)) < now then return nil end
  return string.sub(t, sp + 1)
end
"#
    };
}

/// KEYS: head, log, sessions, vers, turns, wanted, the prefix of holders' queues of asked
/// inodes (`asked:`; see [`MetaEngine::wanted`]). ARGV: who, record, lease (ms), the count
/// of touched inodes, each touched inode and the version its client saw, then the inodes
/// claimed. Returns `{code, a, b, wanted}`: 1 appended (a: the LSN, wanted: turns to give
/// back); -1 a conflict (a: the inode, b: its version); -3 busy (a: the inode, b: its
/// holder); -2 no session.
const APPEND: &str = concat!(
    live_session!("3", "1", "{-2, '', '', {}}"),
    turn_holder!(),
    r#"
local n = tonumber(ARGV[4])
for i = 0, n - 1 do
  local key = ARGV[5 + 2 * i]
  local h = holder(redis.call('HGET', KEYS[5], key), now)
  if h and h ~= ARGV[1] then
    if redis.call('SADD', KEYS[6], key) == 1 then redis.call('RPUSH', KEYS[7] .. h, key) end
    return {-3, key, h, {}}
  end
  local v = redis.call('HGET', KEYS[4], key)
  if v and tonumber(v) > tonumber(ARGV[6 + 2 * i]) then return {-1, key, v, {}} end
end
local lsn = redis.call('INCR', KEYS[1])
redis.call('XADD', KEYS[2], lsn .. '-1', 'r', ARGV[2])
local mine = (now + tonumber(ARGV[3])) .. ' ' .. ARGV[1]
local wanted = {}
for i = 0, n - 1 do
  local key = ARGV[5 + 2 * i]
  redis.call('HSET', KEYS[4], key, lsn)
  if holder(redis.call('HGET', KEYS[5], key), now) == ARGV[1] then
    redis.call('HSET', KEYS[5], key, mine)
    if redis.call('SISMEMBER', KEYS[6], key) == 1 then table.insert(wanted, key) end
  end
end
for i = 5 + 2 * n, #ARGV do
  redis.call('HSET', KEYS[5], ARGV[i], mine)
  redis.call('SREM', KEYS[6], ARGV[i])
end
return {1, tostring(lsn), '', wanted}
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

/// KEYS: turns, vers, wanted, sessions, the prefix of holders' queues of asked inodes.
/// ARGV: who, the inode, lease (ms). Returns `{1,
/// version}` taken, `{0, holder}` held by another (now marked wanted), `{-2, ''}` no session.
const TAKE_TURN: &str = concat!(
    live_session!("4", "1", "{-2, ''}"),
    turn_holder!(),
    r#"
local h = holder(redis.call('HGET', KEYS[1], ARGV[2]), now)
if h and h ~= ARGV[1] then
  if redis.call('SADD', KEYS[3], ARGV[2]) == 1 then redis.call('RPUSH', KEYS[5] .. h, ARGV[2]) end
  return {0, h}
end
redis.call('HSET', KEYS[1], ARGV[2], (now + tonumber(ARGV[3])) .. ' ' .. ARGV[1])
redis.call('SREM', KEYS[3], ARGV[2])
return {1, redis.call('HGET', KEYS[2], ARGV[2]) or '0'}
"#
);

/// KEYS: turns, wanted. ARGV: who, then the inodes.
const GIVE_TURNS: &str = r#"
for i = 2, #ARGV do
  local t = redis.call('HGET', KEYS[1], ARGV[i])
  if t and string.sub(t, string.find(t, ' ') + 1) == ARGV[1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
    redis.call('SREM', KEYS[2], ARGV[i])
  end
end
return 1
"#;

/// KEYS: nextino. ARGV: how many, the floor. Returns the first number given.
const ALLOC_INOS: &str = r#"
local floor = tonumber(ARGV[2]) - 1
if tonumber(redis.call('GET', KEYS[1]) or '0') < floor then
  redis.call('SET', KEYS[1], floor)
end
return redis.call('INCRBY', KEYS[1], ARGV[1]) - tonumber(ARGV[1]) + 1
"#;

/// KEYS: servers, format, turn. ARGV: the servers, the format, the fence. 1 made, 0 there.
const CREATE_VOLUME: &str = r#"
if redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  redis.call('SET', KEYS[2], ARGV[2])
  redis.call('SET', KEYS[3], ARGV[3])
  return 1
end
return 0
"#;

/// KEYS: format, sessions, turn, servers. ARGV: who, the format, the fence, the servers'
/// format line. Returns the live sessions other than `who` (none: upgraded, or in a format
/// already).
const UPGRADE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return {} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local all = redis.call('HGETALL', KEYS[2])
local others = {}
for i = 1, #all, 2 do
  if all[i] ~= ARGV[1] and tonumber(all[i + 1]) >= now then table.insert(others, all[i]) end
end
if #others > 0 then return others end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[3], ARGV[3])
local servers = redis.call('GET', KEYS[4])
if servers then redis.call('SET', KEYS[4], servers .. '\n' .. ARGV[4]) end
return {}
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
    /// The connection [`MetaEngine::wanted`] blocks on.
    waiting: Mutex<Option<::redis::Connection>>,
    keys: Keys,
    scripts: Scripts,
}

struct Keys {
    head: String,
    log: String,
    vers: String,
    turns: String,
    wanted: String,
    /// The prefix of each holder's queue of inodes asked for (`asked:NAME`, a list).
    asked: String,
    ckpt: String,
    sessions: String,
    locks: String,
    servers: String,
    format: String,
    nextino: String,
    /// Format 1's one write turn: fenced on an upgraded volume.
    turn: String,
}

struct Scripts {
    append: ::redis::Script,
    put_checkpoint: ::redis::Script,
    take_turn: ::redis::Script,
    give_turns: ::redis::Script,
    alloc_inos: ::redis::Script,
    create_volume: ::redis::Script,
    upgrade: ::redis::Script,
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
            waiting: Mutex::new(None),
            keys: Keys {
                head: k("head"),
                log: k("log"),
                vers: k("vers"),
                turns: k("turns"),
                wanted: k("wanted"),
                asked: k("asked:"),
                ckpt: k("ckpt"),
                sessions: k("sessions"),
                locks: k("locks"),
                servers: k("servers"),
                format: k("format"),
                nextino: k("nextino"),
                turn: k("turn"),
            },
            scripts: Scripts {
                append: ::redis::Script::new(APPEND),
                put_checkpoint: ::redis::Script::new(PUT_CHECKPOINT),
                take_turn: ::redis::Script::new(TAKE_TURN),
                give_turns: ::redis::Script::new(GIVE_TURNS),
                alloc_inos: ::redis::Script::new(ALLOC_INOS),
                create_volume: ::redis::Script::new(CREATE_VOLUME),
                upgrade: ::redis::Script::new(UPGRADE),
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
        lease: Duration,
    ) -> Result<Appended, EngineError> {
        let (code, a, b, wanted): (i64, String, String, Vec<u64>) = self.with(|c| {
            let mut script = self.scripts.append.prepare_invoke();
            for k in [
                &self.keys.head,
                &self.keys.log,
                &self.keys.sessions,
                &self.keys.vers,
                &self.keys.turns,
                &self.keys.wanted,
                &self.keys.asked,
            ] {
                script.key(k);
            }
            script
                .arg(who)
                .arg(record)
                .arg(lease.as_millis().max(1) as u64)
                .arg(touched.len());
            for t in touched {
                script.arg(t.key).arg(t.seen);
            }
            for k in claim {
                script.arg(*k);
            }
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
            }),
            -1 => Err(EngineError::Conflict {
                key: number(&a)?,
                lsn: number(&b)?,
            }),
            -3 => Err(EngineError::Busy {
                key: number(&a)?,
                holder: b,
            }),
            _ => Err(EngineError::NoSession { who: who.into() }),
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

    fn take_turn(
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
        let mut pause = Duration::from_micros(50);
        loop {
            let (taken, what): (i64, String) = self.with(|c| {
                self.scripts
                    .take_turn
                    .key(&self.keys.turns)
                    .key(&self.keys.vers)
                    .key(&self.keys.wanted)
                    .key(&self.keys.sessions)
                    .key(&self.keys.asked)
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
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_micros(250));
        }
    }

    fn give_turns(&self, who: &str, keys: &[u64]) -> Result<(), EngineError> {
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

    fn wanted(&self, who: &str, wait: Duration) -> Result<Vec<u64>, EngineError> {
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
                found: 1,
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
        self.with(|c| self.scripts.expired.key(&self.keys.sessions).invoke(c))
    }

    fn drop_session(&self, who: &str) -> Result<(), EngineError> {
        self.with(|c| {
            ::redis::pipe()
                .cmd("HDEL")
                .arg(&self.keys.sessions)
                .arg(who)
                .ignore()
                .cmd("DEL")
                .arg(format!("{}{who}", self.keys.asked))
                .ignore()
                .query::<()>(c)
        })
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
                .filter(|l| *l != SERVERS_FORMAT_LINE)
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

    fn locked_inodes(&self) -> Result<Vec<u64>, EngineError> {
        self.with(|c| ::redis::cmd("HKEYS").arg(&self.keys.locks).query(c))
    }
}
