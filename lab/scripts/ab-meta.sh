#!/usr/bin/env bash
# A/B of metadata work on a private mount (no --volume, no Redis): OLD and NEW binaries
# alternate ROUNDS times, each over a memory server of its own binary: tar xf of the 10,000-file tree + sync,
# rm -rf of it, then 20,000 empty files created, stat'ed and removed by one process. Shows
# that a change leaves the embedded default's metadata speed alone.
#
#   lab/scripts/ab-meta.sh OLD_RMEMFS NEW_RMEMFS      # ROUNDS=3 by default
#   OLD_ARGS="-o no_write_behind" lab/scripts/ab-meta.sh target/release/rmemfs target/release/rmemfs
#   VOLUME=1 lab/scripts/ab-meta.sh OLD NEW          # each round on a fresh volume
#   VOLUME=new lab/scripts/ab-meta.sh BIN BIN        # a private mount against a volume
# OLD_ARGS / NEW_ARGS: extra `rmemfs mount` arguments for each side (one binary, two settings).
# VOLUME=1: each side's round mounts a volume of its own (`--volume NAME --create`) and removes
# it after (`rmemfs volume rm`), so the journal's cost is in the figures. VOLUME=new: only the
# NEW side does (one binary twice: a volume's cost beside a private mount's).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh
OLD=$1 NEW=$2 ROUNDS=${ROUNDS:-3}
read -ra OLD_MOUNT <<<"${OLD_ARGS:-}"
read -ra NEW_MOUNT <<<"${NEW_ARGS:-}"
lib_init abmeta
mkdir -p target/bench-meta
tar=$(tree_tar "$(cd target/bench-meta && pwd)" "${TAR_FILES:-10000}")
# Each side over a server of its own binary: binaries of different protocol versions
# compare too (the two servers are alike: same size, same host, both idle between turns).
BIN=$OLD
start_server 4G
OLD_SERVER=$SERVER_ADDR
BIN=$NEW
start_server 4G
NEW_SERVER=$SERVER_ADDR
for r in $(seq 1 "$ROUNDS"); do
  for which in old new; do
    if [ $which = old ]; then
      BIN=$OLD server=$OLD_SERVER args=("${OLD_MOUNT[@]}")
    else
      BIN=$NEW server=$NEW_SERVER args=("${NEW_MOUNT[@]}")
    fi
    vol=ab-$which-$r
    on_volume=0
    case ${VOLUME:-0} in 1) on_volume=1 ;; new) [ $which = new ] && on_volume=1 ;; esac
    [ $on_volume = 1 ] && args+=(--volume "$vol" --create)
    mount_fs "$BASE/m" "$server" "${args[@]}"
    t0=$(date +%s.%N); tar xf "$tar" -C "$BASE/m"; sync -f "$BASE/m"
    t1=$(date +%s.%N); rm -rf "${BASE:?}/m/"*; t2=$(date +%s.%N)
    small=$(python3 - "$BASE/m" <<'PY'
import os, sys, time
d = os.path.join(sys.argv[1], "s"); os.mkdir(d); n = 20000; out = []
for phase in ("create", "stat", "remove"):
    t = time.perf_counter()
    for i in range(n):
        p = f"{d}/f{i}"
        if phase == "create": os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
        elif phase == "stat": os.stat(p)
        else: os.unlink(p)
    out.append(f"{phase}={n / (time.perf_counter() - t):.0f}/s")
print(" ".join(out))
PY
)
    unmount_fs "$BASE/m"
    if [ $on_volume = 1 ]; then "$BIN" volume rm "$vol" --servers "$server" >/dev/null; fi
    printf '%s round %s: tar %.2f s, rm %.2f s, %s\n' $which "$r" "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t1" | bc)" "$small"
  done
done
