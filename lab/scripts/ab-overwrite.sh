#!/usr/bin/env bash
# A/B of writes over bytes a volume's files hold (what the overwrite mark costs: one journal
# commit before a file's first such write while it is open; doc/VOLUMES.md, "Overwrites agree
# after a crash"). OLD and NEW binaries alternate ROUNDS times, each on two memory servers of
# its own binary (two copies per chunk: only then is a file marked) and a fresh volume per
# round:
#   reopen  FILES files of 64 KiB each overwritten in place once: open, a 4 KiB pwrite at 0,
#           close (the worst case: every file pays the mark's commit)
#   held    one 64 MiB file open once, RANDOM_WRITES 4 KiB pwrites at random places, fsync
#           every 100 (a database: the mark once)
#   append  FILES new files of 64 KiB written in 16 appends (never marked)
#
#   lab/scripts/ab-overwrite.sh OLD_RMEMFS NEW_RMEMFS     # ROUNDS=3 FILES=1000
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh
OLD=$1 NEW=$2 ROUNDS=${ROUNDS:-3}
export FILES=${FILES:-1000} RANDOM_WRITES=${RANDOM_WRITES:-5000}
lib_init abover
# Two servers of binary $1; their addresses in PAIR (not a subshell: the cleanup must know
# their PIDs).
servers() {
  BIN=$1
  start_server 1G
  PAIR=$SERVER_ADDR
  start_server 1G
  PAIR=$PAIR,$SERVER_ADDR
}
servers "$OLD"
OLD_SERVERS=$PAIR
servers "$NEW"
NEW_SERVERS=$PAIR
for r in $(seq 1 "$ROUNDS"); do
  for which in old new; do
    if [ $which = old ]; then BIN=$OLD srv=$OLD_SERVERS; else BIN=$NEW srv=$NEW_SERVERS; fi
    vol=abo-$which-$r
    mount_fs "$BASE/m" "$srv" --volume "$vol" --create
    figures=$(python3 - "$BASE/m" <<'PY'
import os, random, sys, time
d = sys.argv[1]; n = int(os.environ["FILES"]); k = int(os.environ["RANDOM_WRITES"])
block, body = b"x" * 4096, b"y" * 65536
for i in range(n):
    with open(f"{d}/f{i}", "wb") as f: f.write(body)
big = f"{d}/big"
with open(big, "wb") as f:
    for _ in range(1024): f.write(body)
os.sync()
out = []
t = time.perf_counter()
for i in range(n):
    fd = os.open(f"{d}/f{i}", os.O_WRONLY); os.pwrite(fd, block, 0); os.close(fd)
out.append(f"reopen={n / (time.perf_counter() - t):.0f}/s")
rng = random.Random(7)
fd = os.open(big, os.O_WRONLY)
t = time.perf_counter()
for j in range(k):
    os.pwrite(fd, block, rng.randrange(16384) * 4096)
    if j % 100 == 99: os.fsync(fd)
out.append(f"held={k / (time.perf_counter() - t):.0f}/s")
os.close(fd)
t = time.perf_counter()
for i in range(n):
    with open(f"{d}/a{i}", "wb") as f:
        for _ in range(16): f.write(block * 4); f.flush()
out.append(f"append={n / (time.perf_counter() - t):.0f}/s")
print(" ".join(out))
PY
)
    unmount_fs "$BASE/m"
    "$BIN" volume rm "$vol" --servers "$srv" >/dev/null
    printf '%s round %s: %s\n' $which "$r" "$figures"
  done
done
