#!/usr/bin/env bash
# Trace-driven simulation of the registration caches (MRRC, LRU pin-down, no cache), after §7
# of the MRRC paper: runs `rmemfs-mrrc-sim` (the lab crate) on the Cello92-like and HTTPD-like workloads with a
# fixed seed, writes target/mrrc-sim/{cello,httpd}.{csv,svg}, and prints, per cache size, MRRC's
# hit ratio against LRU's and MRRC's total registration cost (formula 1) against LRU and no
# cache.
#
# Environment: SEED (default 42), REQUESTS (default 100000), SIZES (comma-separated pages;
# default the command's own range).
set -euo pipefail
cd "$(dirname "$0")/../.."

SEED=${SEED:-42}
REQUESTS=${REQUESTS:-100000}
OUT=target/mrrc-sim
BIN="${CARGO_TARGET_DIR:-target}/release/rmemfs-mrrc-sim"

if [ ! -x "$BIN" ] || ! "$BIN" --help >/dev/null 2>&1; then
  echo "== cargo build --release -p rmemfs-lab --bin rmemfs-mrrc-sim"
  cargo build --release -p rmemfs-lab --bin rmemfs-mrrc-sim
fi

size_args=()
if [ -n "${SIZES:-}" ]; then
  size_args=(--sizes "$SIZES")
fi

for w in cello httpd; do
  echo "== rmemfs-mrrc-sim --workload $w --seed $SEED --requests $REQUESTS"
  "$BIN" --workload "$w" --seed "$SEED" --requests "$REQUESTS" --out "$OUT" \
    ${size_args[@]+"${size_args[@]}"}
  echo
done

echo "== summary (seed $SEED, $REQUESTS requests; hit = request needing no registration)"
for w in cello httpd; do
  awk -F, -v w="$w" '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    {
      s = $col["cache_pages"]; p = $col["policy"]
      if (!(s in seen)) { seen[s] = 1; order[n++] = s }
      hit[p, s] = $col["hit_pct"]; strict[p, s] = $col["strict_hit_pct"]
      cost[p, s] = $col["total_cost_ms"]
    }
    END {
      printf "%s\n", w
      printf "  %7s  %8s  %8s  %7s  %15s  %10s  %10s\n", "pages", "MRRC hit", "LRU hit", \
        "diff", "MRRC strict hit", "MRRC/LRU", "MRRC/none"
      printf "  %7s  %8s  %8s  %7s  %15s  %10s  %10s\n", "", "%", "%", "points", "%", \
        "cost", "cost"
      ge = 0; cheaper = 0; below_lru = 0
      for (i = 0; i < n; i++) {
        s = order[i]
        d = hit["mrrc", s] - hit["lru", s]
        rl = cost["lru", s] > 0 ? cost["mrrc", s] / cost["lru", s] : 0
        rn = cost["none", s] > 0 ? cost["mrrc", s] / cost["none", s] : 0
        printf "  %7d  %8.2f  %8.2f  %+7.2f  %15.2f  %10.3f  %10.3f\n", s, hit["mrrc", s], \
          hit["lru", s], d, strict["mrrc", s], rl, rn
        if (d >= 0) ge++
        if (rl < 1) below_lru++
        if (rn < 1) cheaper++
      }
      printf "  MRRC hit ratio >= LRU at %d of %d sizes; MRRC cost below LRU at %d of %d, " \
        "below no cache at %d of %d\n\n", ge, n, below_lru, n, cheaper, n
    }' "$OUT/$w.csv"
done
echo "figures: $OUT/cello.svg $OUT/httpd.svg"
