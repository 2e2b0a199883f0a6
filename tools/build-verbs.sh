#!/usr/bin/env bash
# Builds rmemfs and the lab with the verbs fabric (`--workspace --features verbs`; the lab's
# `verbs` feature forwards to rmemfs's) in its own target directory (target/verbs, so that
# target/release keeps the default build, which other tiers may be running meanwhile) and
# leaves the binaries at target/release/rmemfs-verbs and target/release/rmemfs-bench-verbs. The feature's binding (sideway) needs cmake, a C compiler,
# libclang and the libibverbs headers: installed here (Debian) when missing. Used by
# tools/test-rxe.sh and lab/scripts/bench-rxe.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v cc >/dev/null 2>&1 || need+=(gcc)
# libclang itself (bindgen loads it), not libclang-cpp, which other packages bring along.
ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 ||
  ls /usr/lib/x86_64-linux-gnu/libclang-[0-9]*.so* >/dev/null 2>&1 || need+=(libclang-dev)
[ -e /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing ${need[*]} (to build the verbs fabric)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=900 update -qq && apt-get install -o DPkg::Lock::Timeout=900 -y -qq "${need[@]}" >/dev/null
fi
echo "== building the verbs fabric (cargo --workspace --features verbs)"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/verbs}
cargo build --release --workspace --features rmemfs/verbs
mkdir -p target/release
cp "$CARGO_TARGET_DIR/release/rmemfs" target/release/rmemfs-verbs
cp "$CARGO_TARGET_DIR/release/rmemfs-bench" target/release/rmemfs-bench-verbs
