#!/usr/bin/env bash
# Where one shared-volume client's time goes (#44): on a fresh shared volume (`--meta`, Redis
# on loopback, two memory servers), `tar xf` of the TAR_FILES-file tree against the same tree
# with every file emptied (same directories, modes, owners, times), alternating ROUNDS times;
# then a file made as tar makes it (create, a 6,144-byte and a 5,015-byte write, utime,
# fchmod, close), 500 times, each step timed; then the mount's request and fabric counts and
# Redis's time per script. Prints results only.
#
#   lab/scripts/shared-costs.sh [RMEMFS]     # ROUNDS=3 TAR_FILES=3000; default target/release
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh
BIN=$(realpath "${1:-target/release/rmemfs}")
ROUNDS=${ROUNDS:-3} TAR_FILES=${TAR_FILES:-3000}
shared_bench_init sharedcosts
tar=$TREE_TAR
empty=$BASE/empty.tar
mkdir "$BASE/emptied"
tar xf "$tar" -C "$BASE/emptied"
find "$BASE/emptied" -type f -exec truncate -s 0 {} +
tar cf "$empty" -C "$BASE/emptied" .
rm -rf "$BASE/emptied"
start_servers 2 1G
mnt=$BASE/mnt
mkdir -p "$mnt"
mount_fs "$mnt" "$SERVER_ADDRS" --volume costs --create --meta "$REDIS_URL"
for ((r = 1; r <= ROUNDS; r++)); do
  for kind in full emptied; do
    from=$tar
    [ "$kind" = emptied ] && from=$empty
    mkdir "$mnt/$kind$r"
    t0=$(date +%s.%N)
    tar xf "$from" -C "$mnt/$kind$r"
    t1=$(date +%s.%N)
    echo "tar-x-$kind-s $(echo "$t1 - $t0" | bc)"
  done
done
mkdir "$mnt/files"
redis-cli -u "$REDIS_URL" config resetstat >/dev/null
"$BIN" stats --json "$mnt" >"$BASE/before.json"
python3 - "$mnt/files" <<'PY'
import os, sys, time
d, n = sys.argv[1], 500
steps = ["create", "write-6144", "write-5015", "utime", "fchmod", "close"]
spent = [0.0] * len(steps)
for i in range(n):
    t = [time.perf_counter()]
    fd = os.open(f"{d}/f{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    t.append(time.perf_counter())
    os.write(fd, b"a" * 6144)
    t.append(time.perf_counter())
    os.write(fd, b"b" * 5015)
    t.append(time.perf_counter())
    os.utime(fd, (1, 2))
    t.append(time.perf_counter())
    os.fchmod(fd, 0o644)
    t.append(time.perf_counter())
    os.close(fd)
    t.append(time.perf_counter())
    for k in range(len(steps)):
        spent[k] += t[k + 1] - t[k]
for name, s in zip(steps, spent):
    print(f"{name}-us {s / n * 1e6:.0f}")
PY
"$BIN" stats --json "$mnt" >"$BASE/after.json"
python3 - "$BASE/before.json" "$BASE/after.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
get = lambda s, *k: (lambda v: v if isinstance(v, (int, float)) else 0)(
    __import__("functools").reduce(lambda o, x: o.get(x, {}) if isinstance(o, dict) else {}, k, s))
for label, keys in [("fuse-writes", ("requests", "write", "count")),
                    ("fuse-setattrs", ("requests", "setattr", "count")),
                    ("fabric-reads", ("fabric", "reads")),
                    ("fabric-writes", ("fabric", "writes"))]:
    print(f"{label}-per-file {(get(b, *keys) - get(a, *keys)) / 500:.2f}")
PY
redis-cli -u "$REDIS_URL" info commandstats | tr -d '\r' |
  sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),usec=[0-9]*,usec_per_call=\([0-9.]*\),.*/scripts-per-file \1 redis-us-per-script \2/p' |
  awk '{printf "scripts-per-file %.2f\nredis-us-per-script %s\n", $2 / 500, $4}'
unmount_fs "$mnt"
