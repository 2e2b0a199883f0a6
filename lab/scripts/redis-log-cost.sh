#!/usr/bin/env bash
# What the shared log's structure costs inside an append script (#44: is a log as a Redis list
# worth a format change over the stream it is?): on a Redis of its own (loopback, no
# persistence), N scripts each of three kinds, alternating ROUNDS times: `INCR` alone (the
# head), `INCR` and `XADD` of a 180-byte record at the new id (the log as it is), `INCR` and
# `RPUSH` of it (a list). Prints Redis's own time per script (`INFO commandstats`) and the
# medians.
#
#   lab/scripts/redis-log-cost.sh        # N=20000 ROUNDS=3
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh
N=${N:-20000} ROUNDS=${ROUNDS:-3}
ensure_packages python3:python3 redis-server:redis-server
lib_init redislog
start_redis --own-trap
trap 'kill "$REDIS_PID" 2>/dev/null || true; cleanup' EXIT
python3 - "$REDIS_URL" "$N" "$ROUNDS" <<'PY'
import re, socket, statistics, sys
url, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
host, port = url.removeprefix("redis://").split(":")
s = socket.create_connection((host, int(port)))
f = s.makefile("rb")

def send(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    s.sendall(out)

def reply():
    line = f.readline()
    kind, rest = line[:1], line[1:].strip()
    if kind == b"$":
        return None if int(rest) < 0 else f.read(int(rest) + 2)[:-2]
    if kind == b"*":
        return [reply() for _ in range(int(rest))]
    if kind == b"-":
        raise SystemExit(f"redis: {rest.decode()}")
    return rest

def call(*args):
    send(*args)
    return reply()

kinds = {
    "incr alone": "return redis.call('INCR', KEYS[1])",
    "incr + xadd (the log now)": "local lsn = redis.call('INCR', KEYS[1]) "
    "redis.call('XADD', KEYS[2], lsn .. '-1', 'r', ARGV[1]) return lsn",
    "incr + rpush (a list)": "local lsn = redis.call('INCR', KEYS[1]) "
    "redis.call('RPUSH', KEYS[2], ARGV[1]) return lsn",
}
shas = {k: call("SCRIPT", "LOAD", src).decode() for k, src in kinds.items()}
record = b"r" * 180
seen = {k: [] for k in kinds}
for r in range(rounds):
    for i, (k, sha) in enumerate(shas.items()):
        call("CONFIG", "RESETSTAT")
        for _ in range(n):
            call("EVALSHA", sha, 2, f"head{i}", f"log{i}", record)
        stats = call("INFO", "commandstats").decode()
        us = float(re.search(r"cmdstat_evalsha:.*?usec_per_call=([\d.]+)", stats).group(1))
        seen[k].append(us)
        print(f"round {r + 1}  {k:28} {us:6.2f} us per script")
print("medians (us per script, Redis's own time):")
base = statistics.median(seen["incr alone"])
for k, v in seen.items():
    m = statistics.median(v)
    print(f"  {k:28} {m:6.2f}  (+{m - base:.2f} over incr alone)")
PY
