#!/usr/bin/env bash
# The rxe tier: real RDMA (soft-RoCE) tests in one VM boot.
#
#   tools/test-rxe.sh [--build-only]
#
# Builds on the host (tools/test-build.sh: the test command's one build, which has the verbs
# fabric; the packages it needs come from tools/build-verbs.sh --install-only), unless
# RMEMFS_RXE_CONFORMANCE and RMEMFS_RXE_SERVER_TESTS name the two test binaries of a build
# already made (tools/test.sh does, running this beside its real-mount tiers); --build-only
# stops there. Then boots the rxe VM (tools/rxe-vm.sh) once and runs inside it:
#   1. the fabric conformance suite on the verbs fabric (rxe0), and the memory server's
#      security tests (secret, another session's extent, quotas) with `serve --fabric verbs`;
#   2. mount tests over verbs: memory servers started with `serve --fabric verbs` in the guest,
#      mounts that pick verbs from the servers' hello (checked in `rmemfs stats`), then copy and
#      compare, fio with crc32c verify, a memory server killed mid-use (EIO, no hang), and
#      one of two servers killed during fio verify with two copies (no error at all), and
#      backed servers (`serve --backing` on tmpfs) restarted in place: the mount resumes under
#      the device's new keys, and a volume attaches again after everything was killed;
#      erasure-coded files (ec:4+2 on seven servers) read back decoded with two servers
#      killed, and rebuilt; and a program reading through the C library (library_c).
# Settings: RMEMFS_RXE_TIMEOUT (seconds for the VM, default 1500: a guard against a VM that
# hangs, not a speed check; each mount test has its own 240 s timeout. The VM runs under TCG,
# whose speed follows the host's: the run fitted in the old 840 s until a slow day,
# 2026-12-02, when it did not), RMEMFS_RXE_MOUNT_TESTS (default "cp_tree fio_verify
# server_death replica_pair secret backed_restart erasure_coded library_c").
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=tools/test-build.sh
. tools/test-build.sh
conformance=${RMEMFS_RXE_CONFORMANCE:-}
server_tests=${RMEMFS_RXE_SERVER_TESTS:-}
if [ -z "$conformance" ] || [ -z "$server_tests" ]; then
  echo "== building (tools/test-build.sh: the workspace with the verbs fabric, test profile)"
  test_build
  conformance=$(test_binary conformance)
  server_tests=$(test_binary server_bin)
fi
[ -x "$conformance" ] || { echo "could not find the conformance test binary" >&2; exit 1; }
[ -x "$server_tests" ] || { echo "could not find the server test binary" >&2; exit 1; }
if [ "${1:-}" = --build-only ]; then
  echo "== rxe tier: host part done (the VM runs with tools/test-rxe.sh)"
  exit 0
fi

tests=${RMEMFS_RXE_MOUNT_TESTS:-cp_tree fio_verify server_death replica_pair secret backed_restart erasure_coded library_c}
guest_script="set -e
echo '== [rxe] fabric conformance on verbs (rxe0)'
$conformance rdma_device:: --test-threads=1
echo '== [rxe] memory server security tests on verbs'
RMEMFS_TEST_FABRIC=verbs RMEMFS_BIN=$TEST_BIN $server_tests --test-threads=1 \
  only_clients_holding_the_secret a_session_cannot_reach_another a_client_over_its_quota
echo '== [rxe] mount tests over verbs'
RMEMFS_BIN=$TEST_BIN RMEMFS_SERVE_ARGS='--fabric verbs' \
RMEMFS_EXPECT_FABRIC=verbs RMEMFS_TEST_SERVER_SIZE=128M RMEMFS_TEST_FIO_SIZE=16M \
RMEMFS_TEST_BACKED_SIZE=96M RMEMFS_TEST_TREE_FILES=30 RMEMFS_TEST_EC_FILES=2 \
RMEMFS_MOUNT_ARGS='--op-timeout 5' RMEMFS_TEST_TIMEOUT=240 mount-tests/run.sh $tests"

echo "== rxe VM: conformance and mount tests over real soft-RoCE"
tools/rxe-vm.sh --timeout "${RMEMFS_RXE_TIMEOUT:-1500}" -- "$guest_script"
