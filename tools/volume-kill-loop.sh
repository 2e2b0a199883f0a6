#!/usr/bin/env bash
# The volume kill loops at length: the mount tests volume_crash and volume_crash_behind with
# 50 rounds each (the test tier runs 5 and 4). Each round writers record every fsynced state,
# the daemon is killed at a random moment and the volume attached again; every fsynced state
# must be there, and (volume_crash_behind) no file may hold a byte it was never written.
# Needs root and /dev/fuse, as mount-tests/run.sh does. ROUNDS=N to change the count.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --offline 2>/dev/null || cargo build --release
RMEMFS_VOLUME_ROUNDS=${ROUNDS:-50} RMEMFS_TEST_TIMEOUT=${RMEMFS_TEST_TIMEOUT:-1800} \
  exec mount-tests/run.sh volume_crash volume_crash_behind
