//! The Lua scripts of the Redis engine: every step that must be atomic is one script (Redis
//! runs a script alone). Session times are the Redis server's clock (`TIME`).

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

/// The state's writes of a change ([`crate::engine::KeyOp`]): ARGV from `first` on, four
/// each (a code, the hash's name under the prefix `KEYS[prefix]`, the field, the value).
/// `state_ops_known` says whether every code is one (checked before anything is written:
/// a script that stops half way keeps what it wrote); `run_state_ops` runs them as change
/// `lsn`.
macro_rules! state_ops {
    () => {
        r#"
local function state_ops_known(first, count)
  for i = first, first + 4 * count - 1, 4 do
    if not string.find('PLNRCAT', ARGV[i], 1, true) or #ARGV[i] ~= 1 then return false end
  end
  return true
end
local function later(cur, v)
  if not cur then return true end
  local cs, cn = string.match(cur, '(%d+) (%d+)')
  local s, n = string.match(v, '(%d+) (%d+)')
  cs, cn, s, n = tonumber(cs), tonumber(cn), tonumber(s), tonumber(n)
  return cs < s or (cs == s and cn < n)
end
local function run_state_ops(prefix, lsn, first, count)
  for i = first, first + 4 * count - 1, 4 do
    local op, h, f, v = ARGV[i], prefix .. ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
    if op == 'P' then redis.call('HSET', h, f, v)
    elseif op == 'L' then redis.call('HSET', h, f, lsn .. ' ' .. v)
    elseif op == 'N' then redis.call('HSET', h, lsn .. ':' .. f, v)
    elseif op == 'R' then redis.call('HDEL', h, f)
    elseif op == 'C' then redis.call('DEL', h)
    elseif op == 'A' then
      if redis.call('HINCRBY', h, f, v) == 0 then redis.call('HDEL', h, f) end
    elseif op == 'T' then
      if later(redis.call('HGET', h, f), v) then redis.call('HSET', h, f, v) end
    end
  end
end
"#
    };
}

/// KEYS: head, log, sessions, vers, turns, wanted, the prefix of holders' queues of asked
/// inodes (`asked:`; see [`crate::engine::MetaEngine::wanted`]), the prefix of files' open
/// marks (`open:INO`, a set of clients), the prefix of clients' marks (`opened:NAME`, a set
/// of inodes), svers (the shared versions: [`crate::engine::Touch`]), vfloor (what a key
/// with no version kept reads as: [`crate::engine::MetaEngine::trim_versions`]). ARGV: who, record,
/// lease (ms), the counts of touched, claimed, opened and dropped inodes, each touched key,
/// the version its client saw and `s` (shared) or `x` (exclusive), then the inodes claimed,
/// opened, dropped, then each key only checked (against its exclusive version) and the
/// version seen, then the state's writes ([`state_ops`]), then how many there are; KEYS also
/// the prefix of the state's hashes. Returns `{code, a, b, wanted, held}`: 1 appended (a: the LSN, wanted:
/// turns to give back, held: the keys touched shared whose turn `who` held); -1 a conflict
/// (a: the key, b: its version); -3 busy (a: the key, b: its holder); -4 held open (a: the
/// inode, b: a client that has it open); -2 no session. The touched keys' turns and
/// versions are read, and their versions written, one call per hash.
const APPEND: &str = concat!(
    live_session!("3", "1", "{-2, '', '', {}, {}}"),
    turn_holder!(),
    state_ops!(),
    r#"
-- HMGET of `keys` in `hash`, 500 at a time (Lua's unpack has a limit): each value, or false.
local function many(hash, keys)
  local out = {}
  for s = 1, #keys, 500 do
    local got = redis.call('HMGET', hash, unpack(keys, s, math.min(s + 499, #keys)))
    for j = 1, #got do out[s + j - 1] = got[j] end
  end
  return out
end
"#,
    r#"
local nops = tonumber(ARGV[#ARGV])
local ofirst = #ARGV - 4 * nops
if not state_ops_known(ofirst, nops) then return redis.error_reply('an unknown state write') end
local n = tonumber(ARGV[4])
local cbase = 8 + 3 * n
local obase = cbase + tonumber(ARGV[5])
local dbase = obase + tonumber(ARGV[6])
for i = dbase, dbase + tonumber(ARGV[7]) - 1 do
  for _, w in ipairs(redis.call('SMEMBERS', KEYS[8] .. ARGV[i])) do
    if w ~= ARGV[1] then return {-4, ARGV[i], w, {}, {}} end
  end
end
-- Each touched key's turn and versions, read in one call per hash.
local keys, exclusive = {}, {}
for i = 1, n do
  keys[i] = ARGV[5 + 3 * i]
  exclusive[i] = ARGV[7 + 3 * i] == 'x'
end
local turns, vers, svers = many(KEYS[5], keys), many(KEYS[4], keys), many(KEYS[10], keys)
local vfloor = redis.call('GET', KEYS[11]) or '0'
local mine_before = {}
for i = 1, n do
  local key = keys[i]
  local h = holder(turns[i], now)
  if h and h ~= ARGV[1] then
    if redis.call('SADD', KEYS[6], key) == 1 then redis.call('RPUSH', KEYS[7] .. h, key) end
    return {-3, key, h, {}, {}}
  end
  mine_before[i] = h == ARGV[1]
  local seen = tonumber(ARGV[6 + 3 * i])
  -- A version not kept reads as the floor, but under the appender's own turn as never
  -- touched: no other client changed the key since the turn was taken, and the take caught
  -- its table up with the key.
  local none = mine_before[i] and '0' or vfloor
  local v, sv = vers[i] or none, svers[i] or none
  if tonumber(v) > seen then return {-1, key, v, {}, {}} end
  if exclusive[i] and tonumber(sv) > seen then return {-1, key, sv, {}, {}} end
end
-- Keys only checked (servers' births) are kept by every trim: one not there was never touched.
for i = dbase + tonumber(ARGV[7]), ofirst - 1, 2 do
  local v = redis.call('HGET', KEYS[4], ARGV[i])
  if v and tonumber(v) > tonumber(ARGV[i + 1]) then return {-1, ARGV[i], v, {}, {}} end
end
local lsn = redis.call('INCR', KEYS[1])
redis.call('XADD', KEYS[2], lsn .. '-1', 'r', ARGV[2])
run_state_ops(KEYS[12], lsn, ofirst, nops)
local mine = (now + tonumber(ARGV[3])) .. ' ' .. ARGV[1]
local wanted = {}
local held = {}
local xset, sset = {}, {}
for i = 1, n do
  local key = keys[i]
  if exclusive[i] then
    table.insert(xset, key)
    table.insert(xset, lsn)
  else
    table.insert(sset, key)
    table.insert(sset, lsn)
  end
  if mine_before[i] then
    if not exclusive[i] then table.insert(held, key) end
    redis.call('HSET', KEYS[5], key, mine)
    if redis.call('SISMEMBER', KEYS[6], key) == 1 then table.insert(wanted, key) end
  end
end
for s = 1, #xset, 1000 do
  redis.call('HSET', KEYS[4], unpack(xset, s, math.min(s + 999, #xset)))
end
for s = 1, #sset, 1000 do
  redis.call('HSET', KEYS[10], unpack(sset, s, math.min(s + 999, #sset)))
end
for i = cbase, obase - 1 do
  redis.call('HSET', KEYS[5], ARGV[i], mine)
  redis.call('SREM', KEYS[6], ARGV[i])
end
for i = obase, dbase - 1 do
  redis.call('SADD', KEYS[8] .. ARGV[i], ARGV[1])
  redis.call('SADD', KEYS[9] .. ARGV[1], ARGV[i])
end
return {1, tostring(lsn), '', wanted, held}
"#
);

/// KEYS: sessions, the prefix of files' open marks, the prefix of clients' marks. ARGV: who,
/// the inode. Returns 1 marked, -2 no session.
const MARK_OPEN: &str = concat!(
    live_session!("1", "1", "-2"),
    r#"
redis.call('SADD', KEYS[2] .. ARGV[2], ARGV[1])
redis.call('SADD', KEYS[3] .. ARGV[1], ARGV[2])
return 1
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

/// KEYS: ckpt, log. ARGV: the checkpoint's LSN, its image, the LSN the log is trimmed up to
/// (at most the checkpoint's). Returns 1 stored, 0 a newer one is there.
const PUT_CHECKPOINT: &str = r#"
local cur = redis.call('HGET', KEYS[1], 'lsn')
if cur and tonumber(ARGV[1]) <= tonumber(cur) then return 0 end
redis.call('HSET', KEYS[1], 'lsn', ARGV[1], 'image', ARGV[2])
redis.call('XTRIM', KEYS[2], 'MINID', (tonumber(ARGV[3]) + 1) .. '-0')
return 1
"#;

/// KEYS: turns, vers, wanted, sessions, the prefix of holders' queues of asked inodes,
/// svers, vfloor. ARGV: who, the inode, lease (ms). Returns `{1, version}` taken (the newer
/// of the two; the floor for a version not kept), `{0, holder}` held by another (now marked
/// wanted), `{-2, ''}` no session.
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
local vfloor = redis.call('GET', KEYS[7]) or '0'
local v = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or vfloor)
local sv = tonumber(redis.call('HGET', KEYS[6], ARGV[2]) or vfloor)
return {1, tostring(math.max(v, sv))}
"#
);

/// KEYS: vfloor, head, one hash of versions (vers or svers). ARGV: the floor asked for, then
/// keys of that hash. Raises the floor to the one asked for (never past the head), then
/// removes each key whose version is at or below it (read here: an append may have set it
/// since the caller listed it). Returns how many it removed.
const TRIM_VERSIONS: &str = r#"
local head = tonumber(redis.call('GET', KEYS[2]) or '0')
local floor = math.max(tonumber(redis.call('GET', KEYS[1]) or '0'), math.min(tonumber(ARGV[1]), head))
redis.call('SET', KEYS[1], floor)
local removed = 0
for i = 2, #ARGV do
  local v = redis.call('HGET', KEYS[3], ARGV[i])
  if v and tonumber(v) <= floor then
    redis.call('HDEL', KEYS[3], ARGV[i])
    removed = removed + 1
  end
end
return removed
"#;

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

/// KEYS: servers, format, turn, the state's info hash. ARGV: the servers, the format, the
/// fence. 1 made (its state whole: empty), 0 there.
const CREATE_VOLUME: &str = r#"
if redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  redis.call('SET', KEYS[2], ARGV[2])
  redis.call('SET', KEYS[3], ARGV[3])
  redis.call('HSET', KEYS[4], 'whole', '1')
  return 1
end
return 0
"#;

/// KEYS: head, the prefix of the state's hashes, the state's info hash. ARGV: the head the
/// writes are of, `1` to mark the state whole after them, then the state's writes
/// ([`state_ops`]). Returns 1 written, 0 the head moved (nothing written).
const PUT_STATE: &str = concat!(
    state_ops!(),
    r#"
local head = tonumber(redis.call('GET', KEYS[1]) or '0')
if head ~= tonumber(ARGV[1]) then return 0 end
local count = (#ARGV - 2) / 4
if not state_ops_known(3, count) then return redis.error_reply('an unknown state write') end
run_state_ops(KEYS[2], head, 3, count)
if ARGV[2] == '1' then redis.call('HSET', KEYS[3], 'whole', '1') end
return 1
"#
);

/// KEYS: head, the prefix of the state's hashes. ARGV: the most names a directory may have
/// to be read, how many directories, the directories, then inodes. Returns `{head, triples,
/// too_big}`: the log's head, then each hash, field and value read
/// ([`crate::engine::state::load`]: the directories' names, the hash of each inode they name
/// and of each inode given, the servers' births), then the directories left out.
const LOAD_STATE: &str = r#"
local p = KEYS[2]
local out, too_big = {}, {}
local function emit(h, f, v)
  out[#out + 1] = h
  out[#out + 1] = f
  out[#out + 1] = v
end
local most = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local inos = {}
for i = 3, 2 + n do
  local h = 's:d:' .. ARGV[i]
  if redis.call('HLEN', p .. h) > most then
    too_big[#too_big + 1] = ARGV[i]
  else
    local names = redis.call('HGETALL', p .. h)
    for j = 1, #names, 2 do
      emit(h, names[j], names[j + 1])
      inos[#inos + 1] = names[j + 1]
    end
  end
end
for i = 3 + n, #ARGV do inos[#inos + 1] = ARGV[i] end
for _, ino in ipairs(inos) do
  local h = 's:i:' .. ino
  local all = redis.call('HGETALL', p .. h)
  for j = 1, #all, 2 do emit(h, all[j], all[j + 1]) end
end
local born = redis.call('HGETALL', p .. 's:born')
for j = 1, #born, 2 do emit('s:born', born[j], born[j + 1]) end
return {redis.call('GET', KEYS[1]) or '0', out, too_big}
"#;

/// KEYS: head, the prefix of the state's hashes. ARGV: the directory, the cursor, about
/// how many names. Returns `{head, next cursor, names}`: a page of the directory's names
/// (`HSCAN`: each name and its inode, flat), with the log's head.
const NAMES_PAGE: &str = r#"
local got = redis.call('HSCAN', KEYS[2] .. 's:d:' .. ARGV[1], ARGV[2], 'COUNT', ARGV[3])
return {redis.call('GET', KEYS[1]) or '0', got[1], got[2]}
"#;

/// KEYS: format, sessions, turn, servers. ARGV: who, the format, the fence, the servers'
/// format line. Returns the live sessions other than `who` (none: upgraded, or in a format
/// already).
const UPGRADE: &str = r#"
local found = tonumber(redis.call('GET', KEYS[1]) or '1')
if found >= tonumber(ARGV[2]) then return {} end
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
if servers then
  local kept = {}
  for line in string.gmatch(servers, '[^\n]+') do
    if string.sub(line, 1, 14) ~= '(shared format' then table.insert(kept, line) end
  end
  table.insert(kept, ARGV[4])
  redis.call('SET', KEYS[4], table.concat(kept, '\n'))
end
return {}
"#;

/// KEYS: sessions, beat. ARGV: who, the lease (ms), "1" to start the session, the engine's
/// time away (ms, [`super::super::ENGINE_AWAY`]). After that long without a heartbeat,
/// every session is renewed first (the engine was away, not the clients); an expired
/// session is never renewed. Returns 1, or 0 (no such live session).
const HEARTBEAT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if last > 0 and now - last > tonumber(ARGV[4]) then
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    if tonumber(all[i + 1]) < now + ttl then redis.call('HSET', KEYS[1], all[i], now + ttl) end
  end
end
redis.call('SET', KEYS[2], now)
if ARGV[3] == '0' then
  local exp = redis.call('HGET', KEYS[1], ARGV[1])
  if not exp or tonumber(exp) < now then return 0 end
end
redis.call('HSET', KEYS[1], ARGV[1], now + ttl)
return 1
"#;

/// KEYS: sessions, beat. ARGV: the engine's time away (ms). None while no heartbeat arrived
/// for that long.
const EXPIRED: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if last > 0 and now - last > tonumber(ARGV[1]) then return {} end
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  if tonumber(all[i + 1]) < now then table.insert(out, all[i]) end
end
return out
"#;

/// Every script, loaded once per engine (each is sent by its hash after its first use).
pub(super) struct Scripts {
    pub(super) append: ::redis::Script,
    pub(super) put_checkpoint: ::redis::Script,
    pub(super) trim_versions: ::redis::Script,
    pub(super) take_turn: ::redis::Script,
    pub(super) give_turns: ::redis::Script,
    pub(super) alloc_inos: ::redis::Script,
    pub(super) create_volume: ::redis::Script,
    pub(super) upgrade: ::redis::Script,
    pub(super) heartbeat: ::redis::Script,
    pub(super) expired: ::redis::Script,
    pub(super) swap_locks: ::redis::Script,
    pub(super) mark_open: ::redis::Script,
    pub(super) put_state: ::redis::Script,
    pub(super) load_state: ::redis::Script,
    pub(super) names_page: ::redis::Script,
}

impl Scripts {
    pub(super) fn new() -> Scripts {
        Scripts {
            append: ::redis::Script::new(APPEND),
            put_checkpoint: ::redis::Script::new(PUT_CHECKPOINT),
            trim_versions: ::redis::Script::new(TRIM_VERSIONS),
            take_turn: ::redis::Script::new(TAKE_TURN),
            give_turns: ::redis::Script::new(GIVE_TURNS),
            alloc_inos: ::redis::Script::new(ALLOC_INOS),
            create_volume: ::redis::Script::new(CREATE_VOLUME),
            upgrade: ::redis::Script::new(UPGRADE),
            heartbeat: ::redis::Script::new(HEARTBEAT),
            expired: ::redis::Script::new(EXPIRED),
            swap_locks: ::redis::Script::new(SWAP_LOCKS),
            mark_open: ::redis::Script::new(MARK_OPEN),
            put_state: ::redis::Script::new(PUT_STATE),
            load_state: ::redis::Script::new(LOAD_STATE),
            names_page: ::redis::Script::new(NAMES_PAGE),
        }
    }
}
