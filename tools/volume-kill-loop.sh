#!/usr/bin/env bash
# The volume kill loop at length: the mount test volume_crash with 50 rounds (the test tier
# runs 5). Each round a writer records every fsynced state, the daemon is killed at a random
# moment and the volume attached again; every fsynced state must be there. Needs root and
# /dev/fuse, as mount-tests/run.sh does. ROUNDS=N to change the count.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --offline 2>/dev/null || cargo build --release
RMEMFS_VOLUME_ROUNDS=${ROUNDS:-50} RMEMFS_TEST_TIMEOUT=${RMEMFS_TEST_TIMEOUT:-1800} \
  exec mount-tests/run.sh volume_crash
