#!/usr/bin/env bash
# The rxe tier: real RDMA (soft-RoCE) tests in one VM boot.
#
#   tools/test-rxe.sh
#
# Builds the verbs-enabled binary and the conformance test binary on the host (the `verbs`
# feature needs cmake, libclang and libibverbs headers: installed here when missing), then boots
# the rxe VM (tools/rxe-vm.sh) once and runs inside it:
#   1. the fabric conformance suite on the verbs fabric (rxe0);
#   2. mount tests over verbs: memory servers started with `serve --fabric verbs` in the guest,
#      mounts that pick verbs from the servers' hello (checked in `rmemfs stats`), then copy and
#      compare, fio with crc32c verify, and a memory server killed mid-use (EIO, no hang).
# Settings: RMEMFS_RXE_TIMEOUT (seconds for the VM, default 840: the tier must stay under 15
# minutes), RMEMFS_RXE_MOUNT_TESTS (default "cp_tree fio_verify server_death").
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v cc >/dev/null 2>&1 || need+=(gcc)
ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 || ls /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1 || need+=(libclang-dev)
[ -e /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing ${need[*]} (to build the verbs fabric)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
fi

echo "== building the verbs fabric (cargo --features verbs)"
cargo build --release --features verbs
cp target/release/rmemfs target/release/rmemfs-verbs
echo "== verbs unit tests (host: no device needed)"
cargo test --release --features verbs --lib fabric::verbs
conformance=$(cargo test --release --features verbs --test conformance --no-run 2>&1 |
  sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -n 1)
[ -x "$conformance" ] || { echo "could not find the conformance test binary" >&2; exit 1; }
# Leave target/release/rmemfs as the default build expects it (the next `cargo build --release`
# relinks it anyway).

tests=${RMEMFS_RXE_MOUNT_TESTS:-cp_tree fio_verify server_death}
guest_script="set -e
echo '== [rxe] fabric conformance on verbs (rxe0)'
$conformance verbs --test-threads=1
echo '== [rxe] mount tests over verbs'
RMEMFS_BIN=target/release/rmemfs-verbs RMEMFS_SERVE_ARGS='--fabric verbs' \
RMEMFS_EXPECT_FABRIC=verbs RMEMFS_TEST_SERVER_SIZE=128M RMEMFS_TEST_FIO_SIZE=16M \
RMEMFS_MOUNT_ARGS='--op-timeout 5' RMEMFS_TEST_TIMEOUT=240 mount-tests/run.sh $tests"

echo "== rxe VM: conformance and mount tests over real soft-RoCE"
tools/rxe-vm.sh --timeout "${RMEMFS_RXE_TIMEOUT:-840}" -- "$guest_script"
