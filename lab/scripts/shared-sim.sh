#!/usr/bin/env bash
# Many clients of one shared volume, on paper (#44): `rmemfs-shared-sim` (the lab crate) prints
# creates per second of 1 to 128 clients, rmemfs's shared format 2 beside JuiceFS's protocol,
# in clients' own directories and in one shared directory, at 0.1, 0.2 and 1 ms round trips to
# the engine, then the model at this machine's round trip beside the figures measured here
# (lab/scripts/bench-shared.sh); writes target/shared-sim/shared-sim.csv and its chart,
# target/shared-sim/chart.svg (`rmemfs-bench bars`: creates per second against clients, a
# panel per round trip, log axis).
#
# Arguments are passed on (`--help` lists them: round trips, client counts, measured figures).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="${CARGO_TARGET_DIR:-target}/release/rmemfs-shared-sim"
if [ ! -x "$BIN" ] || ! "$BIN" --help >/dev/null 2>&1; then
  echo "== cargo build --release -p rmemfs-lab --bin rmemfs-shared-sim"
  cargo build --release -p rmemfs-lab --bin rmemfs-shared-sim
fi
"$BIN" "$@"
BENCH="${CARGO_TARGET_DIR:-target}/release/rmemfs-bench"
if [ ! -x "$BENCH" ]; then
  echo "== cargo build --release -p rmemfs-lab --bin rmemfs-bench"
  cargo build --release -p rmemfs-lab --bin rmemfs-bench
fi
python3 - target/shared-sim/shared-sim.csv <<'PY' >target/shared-sim/spec.json
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1])))
curves = ["rmemfs_own", "rmemfs_one_dir", "juicefs_own", "juicefs_one_dir"]
panels = []
for rtt in sorted({r["rtt_ms"] for r in rows}, key=float):
    at = [r for r in rows if r["rtt_ms"] == rtt]
    panels.append({"heading": f"round trip {rtt} ms", "unit": "creates per second",
                   "log": True, "groups": [f"{r['clients']} clients" for r in at],
                   "values": [[float(r[c]) for c in curves] for r in at]})
print(json.dumps({"title": "many clients of one shared volume, on paper (MVA)",
                  "series": ["rmemfs, own dirs", "rmemfs, one dir", "JuiceFS, own dirs",
                             "JuiceFS, one dir"], "panels": panels}, indent=1))
PY
"$BENCH" bars target/shared-sim/spec.json target/shared-sim/chart.svg
echo "# chart: target/shared-sim/chart.svg"
