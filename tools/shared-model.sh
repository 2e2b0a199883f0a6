#!/usr/bin/env bash
# The shared model check (mount-tests `volume_shared_check`'s `model` part: workers on two
# mounts of one Redis-backed volume change a shared directory under a flock, checked against
# a log they keep there) for ROUNDS rounds on one pair of mounts, WORKERS workers each, with
# two CPU hogs running, as the 2-core CI machine is loaded by the test itself. Stops at the
# first failure, naming its seed. Before the flock was made its open file's (the kernel's
# lock owner named a reopened file as the closed one's), 6 workers failed within 11 rounds.
#
#   ROUNDS=150 WORKERS=6 tools/shared-model.sh
#   A_ARGS="-o write_behind" tools/shared-model.sh   # the first mount writes behind
set -uo pipefail
cd "$(dirname "$0")/.."
yes >/dev/null &
hog1=$!
yes >/dev/null &
hog2=$!
trap 'kill $hog1 $hog2 2>/dev/null' EXIT
RMEMFS_MODEL_ROUNDS=${ROUNDS:-50} RMEMFS_MODEL_WORKERS=${WORKERS:-6} RMEMFS_MODEL_A_ARGS=${A_ARGS:-} \
  mount-tests/run.sh volume_shared_model
