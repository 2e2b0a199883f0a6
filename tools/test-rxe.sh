#!/usr/bin/env bash
# The rxe tier: real RDMA (soft-RoCE) tests in one VM boot.
#
#   tools/test-rxe.sh [--build-only]
#
# --build-only: the host's part alone (builds and clippy).
# Builds the verbs-enabled binary (the packages it needs: tools/build-verbs.sh --install-only)
# and the conformance test binary on the
# host, then boots
# the rxe VM (tools/rxe-vm.sh) once and runs inside it:
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

tools/build-verbs.sh --install-only
# One cargo invocation, one feature set, for everything the guest runs: the binary (`testing`
# adds only test hooks, which stay off), the C library, and the two test binaries. Built apart,
# they compiled the library twice: a test target brings in the dev-dependencies, whose
# features (num-traits' std, bitflags' std) change the hash of every crate above them, so
# `cargo build` and `cargo test` could not share one build of the library (about 200 s).
echo "== building the verbs fabric (rmemfs --features verbs,testing: binary, C library, tests)"
features=rmemfs/verbs,rmemfs/testing
cargo build --release -p rmemfs -p rmemfs-c --features "$features" --lib --bin rmemfs \
  --test conformance --test server_bin
cp target/release/rmemfs target/release/rmemfs-verbs
echo "== cargo clippy -D warnings with the verbs fabric"
cargo clippy --workspace --all-targets --features "$features" -- -D warnings
# The verbs fabric's unit tests need no device: they run in every build's `cargo test`
# (src/fabric/verbs/endpoint.rs), so none is built here. The two test binaries' paths (the
# build above left them fresh: this only names them).
test_binary() {
  cargo test --release -p rmemfs --features "$features" --test "$1" --no-run 2>&1 |
    sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -n 1
}
conformance=$(test_binary conformance)
[ -x "$conformance" ] || { echo "could not find the conformance test binary" >&2; exit 1; }
server_tests=$(test_binary server_bin)
[ -x "$server_tests" ] || { echo "could not find the server test binary" >&2; exit 1; }
if [ "${1:-}" = --build-only ]; then
  echo "== rxe tier: host part done (the VM runs with tools/test-rxe.sh)"
  exit 0
fi

tests=${RMEMFS_RXE_MOUNT_TESTS:-cp_tree fio_verify server_death replica_pair secret backed_restart erasure_coded library_c}
guest_script="set -e
echo '== [rxe] fabric conformance on verbs (rxe0)'
$conformance verbs --test-threads=1
echo '== [rxe] memory server security tests on verbs'
RMEMFS_TEST_FABRIC=verbs RMEMFS_BIN=target/release/rmemfs-verbs $server_tests --test-threads=1 \
  only_clients_holding_the_secret a_session_cannot_reach_another a_client_over_its_quota
echo '== [rxe] mount tests over verbs'
RMEMFS_BIN=target/release/rmemfs-verbs RMEMFS_SERVE_ARGS='--fabric verbs' \
RMEMFS_EXPECT_FABRIC=verbs RMEMFS_TEST_SERVER_SIZE=128M RMEMFS_TEST_FIO_SIZE=16M \
RMEMFS_TEST_BACKED_SIZE=96M RMEMFS_TEST_TREE_FILES=60 RMEMFS_TEST_EC_FILES=2 \
RMEMFS_MOUNT_ARGS='--op-timeout 5' RMEMFS_TEST_TIMEOUT=240 mount-tests/run.sh $tests"

echo "== rxe VM: conformance and mount tests over real soft-RoCE"
tools/rxe-vm.sh --timeout "${RMEMFS_RXE_TIMEOUT:-1500}" -- "$guest_script"
