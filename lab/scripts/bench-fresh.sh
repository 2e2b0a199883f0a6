#!/usr/bin/env bash
# A fresh file against an overwrite (#13: "fresh files as fast as overwrites"). On one memory
# server and one mount, ROUNDS times: dd SIZE in 1 MiB blocks (with fsync) into a new file,
# dd over the same file again, remove it. Round 1 writes memory the server never used; later
# rounds get extents the server used before (freed extents are zeroed and stay resident).
# Prints each round and, for rounds 2 on, the medians: MB/s fresh, MB/s overwrite, and
# fresh/overwrite (the target is 0.9). Page caches are dropped before each dd. Draws
# OUT/chart.svg (default OUT target/bench-fresh): both speeds per round.
#
#   lab/scripts/bench-fresh.sh
#   SIZE=1G ROUNDS=7 lab/scripts/bench-fresh.sh
#
# On a VM whose host backs guest memory lazily, the first touch of any page (the server's
# arena, the client's page cache) also costs a fault in the host: round 1 shows that, and
# varies from run to run. Needs root and /dev/fuse (as mount-tests/run.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh

SIZE=${SIZE:-1G}
ROUNDS=${ROUNDS:-5}
OUT=${OUT:-target/bench-fresh}
check_prereqs mount serve || exit 2
check_bench bars || exit 2
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if ! size_bytes=$(numfmt --from=iec "$SIZE" 2>/dev/null); then
  echo "SIZE=$SIZE is not a size like 256M or 1G" >&2
  exit 2
fi
count=$((size_bytes >> 20))
lib_init bench-fresh

# dd_seconds ARGS...: seconds one dd of $count MiB took.
dd_seconds() {
  local start end
  sync
  echo 3 >/proc/sys/vm/drop_caches
  start=$(date +%s.%N)
  timeout -k 10 600 dd if=/dev/zero bs=1M count="$count" conv=fsync "$@" status=none
  end=$(date +%s.%N)
  awk -v s="$start" -v e="$end" 'BEGIN { print e - s }'
}

start_server "$((size_bytes / 1048576 + 64))M"
mount_fs "$BASE/mnt" "$SERVER_ADDR"
results=$BASE/results
: >"$results"
: >"$OUT/rounds.txt"
printf '%-6s %12s %16s %8s\n' round "fresh MB/s" "overwrite MB/s" ratio
for ((round = 1; round <= ROUNDS; round++)); do
  fresh=$(dd_seconds of="$BASE/mnt/f")
  over=$(dd_seconds of="$BASE/mnt/f" conv=notrunc)
  timeout -k 10 120 rm "$BASE/mnt/f"
  line=$(awk -v b="$size_bytes" -v f="$fresh" -v o="$over" \
    'BEGIN { printf "%.0f %.0f %.2f", b / f / 1e6, b / o / 1e6, o / f }')
  [ "$round" -gt 1 ] && echo "$line" >>"$results"
  echo "$line" >>"$OUT/rounds.txt"
  # shellcheck disable=SC2086 # three numbers
  printf '%-6s %12s %16s %8s\n' "$round" $line
done
unmount_fs "$BASE/mnt"
kill_servers "$SERVER_PID"
echo
[ "$ROUNDS" -gt 1 ] && awk -v n_rounds="$ROUNDS" 'BEGIN { n = 0 } { f[n] = $1; o[n] = $2; r[n] = $3; n++ }
  function median(a, n,   i, j, t) {
    for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[int(n / 2)] : (a[n / 2 - 1] + a[n / 2]) / 2
  }
  END { printf "medians of rounds 2-%d (%s, 1 MiB blocks, fsync): fresh %.0f MB/s, overwrite %.0f MB/s, fresh/overwrite %.2f\n",
        n_rounds, size, median(f, n), median(o, n), median(r, n) }' size="$SIZE" "$results"
awk -v size="$SIZE" '
  { f[NR] = $1; o[NR] = $2 }
  END {
    printf "{\"title\": \"a fresh %s file against overwriting it, one server (dd bs=1M, fsync)\",\n", size
    printf " \"series\": [\"fresh file\", \"overwrite\"],\n"
    printf " \"panels\": [{\"heading\": \"per round (round 1: memory the server never used)\", \"unit\": \"MB/s\",\n   \"groups\": ["
    for (i = 1; i <= NR; i++) printf "%s\"round %d\"", (i > 1 ? ", " : ""), i
    printf "], \"values\": ["
    for (i = 1; i <= NR; i++) printf "%s[%s, %s]", (i > 1 ? ", " : ""), f[i], o[i]
    print "]}]}"
  }' "$OUT/rounds.txt" >"$OUT/spec.json"
draw_chart "$OUT/spec.json" "$OUT/chart.svg"
