#!/usr/bin/env bash
# The mount's switches side by side, in one run against one memory server (a separate
# process): --reg-cache mrrc|lru|none and --write-path frrwp|serial. For each setting: write
# new files (fresh remote memory: allocation on every chunk), overwrite them (chunks exist),
# and read them back with cold caches; MB/s from dd, plus the registration cache counters.
# Prints a row per setting as it finishes, then draws OUT/chart.svg (default OUT
# target/bench-switches; the figures are in OUT/results.tsv and the chart's spec.json).
#
#   lab/scripts/bench-switches.sh            # 8 files of 32 MiB per setting
#   FILES=4 MB=64 lab/scripts/bench-switches.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh
FILES=${FILES:-8}
MB=${MB:-32}
OUT=${OUT:-target/bench-switches}
check_prereqs mount serve stats || exit 2
check_bench bars || exit 2
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
: >"$OUT/results.tsv"
lib_init switches
start_server "$((FILES * MB * 2 + 256))M"
ADDR=$SERVER_ADDR

rate() { # dd's MB/s figure from its last line
  sed -n 's/.*, \([0-9.]*\) \([MG]\)B\/s$/\1 \2/p' | awk '{ if ($2 == "G") print $1 * 1000; else print $1 }'
}
run() {
  local label=$1 w_new=0 w_over=0 r=0 i
  shift
  mount_fs "$BASE/mnt" "$ADDR" "$@"
  for ((i = 0; i < FILES; i++)); do
    w_new=$(echo "$w_new + $(dd if=/dev/zero of="$BASE/mnt/f$i" bs=1M count="$MB" 2>&1 | rate)" | bc)
  done
  for ((i = 0; i < FILES; i++)); do
    w_over=$(echo "$w_over + $(dd if=/dev/zero of="$BASE/mnt/f$i" bs=1M count="$MB" conv=notrunc 2>&1 | rate)" | bc)
  done
  sync; echo 3 >/proc/sys/vm/drop_caches
  for ((i = 0; i < FILES; i++)); do
    r=$(echo "$r + $(dd if="$BASE/mnt/f$i" of=/dev/null bs=1M 2>&1 | rate)" | bc)
  done
  local hits
  hits=$("$BIN" stats "$BASE/mnt" | sed -n 's/.*hit ratio \([0-9.]*%\).*/\1/p')
  local regs
  regs=$("$BIN" stats "$BASE/mnt" | sed -n '3s/ *registrations \([0-9]*\).*batches.*/\1/p')
  local row
  row=$(printf "%.0f\t%.0f\t%.0f" "$(echo "$w_new / $FILES" | bc -l)" \
    "$(echo "$w_over / $FILES" | bc -l)" "$(echo "$r / $FILES" | bc -l)")
  [[ $label == "("* ]] || printf "%s\t%s\n" "$label" "$row" >>"$OUT/results.tsv"
  # shellcheck disable=SC2086 # three figures
  printf "%-22s %12s %12s %10s %10s %8s\n" "$label" ${row//$'\t'/ } "$hits" "$regs"
  rm -f "$BASE"/mnt/f*
  unmount_fs "$BASE/mnt"
}
echo "# $FILES files x $MB MiB per setting, dd bs=1M, one memory server process on loopback"
printf "%-22s %12s %12s %10s %10s %8s\n" "setting" "new MB/s" "overwr MB/s" "read MB/s" "cache hit" "regs"
run "(warm-up: server pages)" --reg-cache mrrc
run "reg-cache mrrc" --reg-cache mrrc
run "reg-cache lru" --reg-cache lru
run "reg-cache none" --reg-cache none
run "write-path frrwp" --write-path frrwp
run "write-path serial" --write-path serial

# The chart: one bar per setting in each of the three measures.
awk -F'\t' -v files="$FILES" -v mb="$MB" '
  { name[NR] = $1; v[NR, 1] = $2; v[NR, 2] = $3; v[NR, 3] = $4 }
  END {
    printf "{\"title\": \"the mount'"'"'s switches: %d files x %d MiB, dd bs=1M, one server on loopback\",\n", files, mb
    printf " \"series\": ["
    for (i = 1; i <= NR; i++) printf "%s\"%s\"", (i > 1 ? ", " : ""), name[i]
    printf "],\n \"panels\": [{\"heading\": \"dd throughput per setting\", \"unit\": \"MB/s\",\n"
    printf "   \"groups\": [\"new files\", \"overwrite\", \"read, cold cache\"], \"values\": ["
    for (m = 1; m <= 3; m++) {
      printf "%s[", (m > 1 ? ", " : "")
      for (i = 1; i <= NR; i++) printf "%s%s", (i > 1 ? ", " : ""), v[i, m]
      printf "]"
    }
    print "]}]}"
  }' "$OUT/results.tsv" >"$OUT/spec.json"
draw_chart "$OUT/spec.json" "$OUT/chart.svg"
