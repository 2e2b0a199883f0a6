#!/usr/bin/env bash
# Many clients of one shared volume, on paper (#44): `rmemfs-shared-sim` (the lab crate) prints
# creates per second of 1 to 128 clients, rmemfs's shared format 2 beside JuiceFS's protocol,
# in clients' own directories and in one shared directory, at 0.1, 0.2 and 1 ms round trips to
# the engine, then the model at this machine's round trip beside the figures measured here
# (lab/scripts/bench-shared.sh); writes target/shared-sim/shared-sim.csv.
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
