#!/usr/bin/env bash
# Builds rmemfs and the lab with the verbs fabric (`--workspace --features verbs`; the lab's
# `verbs` feature forwards to rmemfs's) and leaves the binaries at target/release/rmemfs-verbs
# and target/release/rmemfs-bench-verbs. The feature's binding (sideway) needs cmake, a C
# compiler, libclang and the libibverbs headers: installed here (Debian) when missing
# (`--install-only`: that alone). Used by tools/test-rxe.sh and lab/scripts/bench-rxe.sh.
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
[ "${1:-}" = --install-only ] && exit 0
echo "== building the verbs fabric (cargo --workspace --features verbs)"
cargo build --release --workspace --features rmemfs/verbs
cp target/release/rmemfs target/release/rmemfs-verbs
cp target/release/rmemfs-bench target/release/rmemfs-bench-verbs
