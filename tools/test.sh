#!/usr/bin/env bash
# Runs every test tier that this machine can run: formatting and lints, the model-checked
# races, unit and property tests (the file system against a reference model, and the fuzz
# targets' corpus and regressions), the fabric conformance suite (tcp and in-process fabrics),
# the memory-server tests through the binary, real mounts (mount-tests/), and the rxe tier
# (tools/test-rxe.sh: the verbs fabric on real soft-RoCE in a qemu VM, beside the real mounts;
# RMEMFS_SKIP_RXE=1 leaves it out for a quick local run). Everything runs from one build
# (tools/test-build.sh). Fuzzing itself (new inputs) is a long run: tools/fuzz.sh. Installs
# what the tests need when it is missing (Debian).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v setpriv >/dev/null 2>&1 || need_apt+=(util-linux)
command -v prlimit >/dev/null 2>&1 || need_apt+=(util-linux)
command -v cc >/dev/null 2>&1 || need_apt+=(gcc)
# The metadata engine's tests (tests/engines.rs) start their own redis-server.
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== installing ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=900 update -qq && apt-get install -o DPkg::Lock::Timeout=900 -y -qq "${need_apt[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "rmemfs needs a Rust toolchain (1.88 or newer): install it with rustup (https://rustup.rs)" >&2
  exit 1
fi
for component in rustfmt clippy; do
  if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
    rustup component add "$component" >/dev/null 2>&1 || true
  fi
done

SKIPPED=()  # tiers this machine could not run, each with its reason (printed at the end)

# Every tier's wall time and CPU time, printed as a table at the end (also when a tier fails),
# so the time the command takes can be read per tier and kept under its 30-minute budget. The
# CPU time (user and system, of every process the tier ran) over the wall time says how busy
# the tier kept the two cores: a tier that mostly waits is one to overlap.
TIER_NAMES=() TIER_SECS=() TIER_CPU=() OVERLAP_TIMES=()
TIMES_FILE=$(mktemp -u)  # one file per shell ($BASHPID): the overlapped jobs count too
# children_cpu: sets CHILDREN_CPU to the CPU seconds of the processes this shell has waited
# for, so far. It runs `times` as a builtin in this shell, never in a command substitution,
# whose subshell has children of its own (none).
children_cpu() {
  local file=$TIMES_FILE.$BASHPID line
  times >"$file"
  line=$(tail -n 1 "$file")  # "1m2.345s 0m6.789s": the children's user and system time
  CHILDREN_CPU=0
  if [[ $line =~ ^([0-9]+)m([0-9]+)[.0-9]*s\ ([0-9]+)m([0-9]+) ]]; then
    CHILDREN_CPU=$((BASH_REMATCH[1] * 60 + 10#${BASH_REMATCH[2]} + BASH_REMATCH[3] * 60 + 10#${BASH_REMATCH[4]}))
  fi
}
tier_started=$SECONDS tier_cpu_started=0 tier_name=""
tier() {
  tier_end
  children_cpu
  tier_name=$1 tier_started=$SECONDS tier_cpu_started=$CHILDREN_CPU
  echo "== $1"
}
tier_end() {
  if [ -n "$tier_name" ]; then
    TIER_NAMES+=("$tier_name") TIER_SECS+=($((SECONDS - tier_started)))
    children_cpu
    TIER_CPU+=($((CHILDREN_CPU - tier_cpu_started)))
    tier_name=""
  fi
}
print_tier_times() {
  local status=${1:-$?} i
  tier_end
  echo "== time per tier (s): wall, CPU"
  for i in "${!TIER_NAMES[@]}"; do
    printf '%6d %6d  %s\n' "${TIER_SECS[$i]}" "${TIER_CPU[$i]}" "${TIER_NAMES[$i]%% (*}"
  done
  for i in "${!OVERLAP_TIMES[@]}"; do
    printf '%6d %6d%s\n' ${OVERLAP_TIMES[$i]%%  *} "  ${OVERLAP_TIMES[$i]#*  }"
  done
  children_cpu
  printf '%6d %6d  total\n' "$SECONDS" "$CHILDREN_CPU"
  rm -f "$TIMES_FILE".*
  return "$status"
}
trap print_tier_times EXIT

# A clean clone builds everything cold: incremental compilation's caches only cost time then.
if [ -n "${CI:-}" ]; then export CARGO_INCREMENTAL=0; fi

# Overlapped: the rxe tier's VM (tools/test-rxe.sh), on what the build made, beside the
# real-mount tiers, which wait much of the time (daemons starting, timeouts, failovers): about
# 800 s under TCG, which would otherwise come after everything. It starts right after the
# build: the unit tests' run beside its boot is short and light (62 s of wall time, 41
# CPU-seconds in ci12), and the VM's tail was what kept the command over 30 minutes. At nice 10, so that the
# tiers beside it (whose failure detection counts time too) come first. Its output is
# printed, and its failure fails the run, once the mounts are done (a failing mount tier
# stops it).
OVERLAP_DIR=$(mktemp -d)
RXE_PID=""
rxe_overlapped() {
  local t0 c0 rc=0
  children_cpu
  t0=$SECONDS c0=$CHILDREN_CPU
  nice -n 10 tools/test-rxe.sh >"$OVERLAP_DIR/rxe.log" 2>&1 </dev/null || rc=$?
  children_cpu
  echo "$((SECONDS - t0)) $((CHILDREN_CPU - c0)) $rc" >"$OVERLAP_DIR/rxe.done"
}
# Its own process group (set -m), so that a failing run can stop it (the VM too).
stop_overlapped() { [ -z "$RXE_PID" ] || kill -- "-$RXE_PID" 2>/dev/null || true; }
trap 'status=$?; stop_overlapped; print_tier_times "$status"' EXIT

tier "cargo fmt --check, and the code's map (tools/check-layout.py)"
cargo fmt --all -- --check
python3 tools/check-layout.py
tier "cargo clippy -D warnings (default features, then with the verbs fabric)"
# The verbs fabric's binding needs cmake, libclang and the libibverbs headers (Debian).
tools/build-verbs.sh --install-only
cargo clippy --workspace --all-targets --features rmemfs/testing -- -D warnings
cargo clippy --workspace --all-targets --features rmemfs/testing,rmemfs/verbs -- -D warnings
tier "model-checked races (shuttle: batch completion, FRRWP, registration cache, send queue, shared volumes' protocol and a client's turns, the journal's commit of writes answered before they were sent)"
cargo clippy --lib --tests --features shuttle -- -D warnings
# The packages and features of the build below (tools/test-build.sh) and the model checker:
# so cargo resolves the dependencies as that build does, and those compiled here are its
# own (`cargo test --lib --features shuttle` alone compiled about 60 of them again). rmemfs
# itself at opt-level 0 here (its dependencies stay at the profile's 2): the library's build
# with the model checker took 105 s of wall time at opt-level 2, 34 s at 0, and the model
# tests 2 s against 5 s. `::model_`: every model test's name starts with `model_` (the lab's
# `cost_model_on_a_hand_made_trace` is no model test, and would run outside shuttle).
cargo test --workspace --lib --features rmemfs/testing,rmemfs/verbs,rmemfs/shuttle \
  --config 'profile.test.package.rmemfs.opt-level=0' ::model_
# shellcheck source=tools/test-build.sh
. tools/test-build.sh
tier "build (tools/test-build.sh: the workspace, every target, once; test profile, with the verbs fabric)"
test_build
# The real mounts run the binary of this build (opt-level 2, debug assertions on).
export RMEMFS_BIN=$TEST_BIN
if [ "${RMEMFS_SKIP_RXE:-0}" = 1 ]; then
  echo "!! SKIPPED: the rxe tier (RMEMFS_SKIP_RXE=1)"
  SKIPPED+=("rxe tier: RMEMFS_SKIP_RXE=1")
else
  # The two test binaries the guest runs, of the build above (named, not built again).
  RMEMFS_RXE_CONFORMANCE=$(test_binary conformance)
  RMEMFS_RXE_SERVER_TESTS=$(test_binary server_bin)
  for b in "$RMEMFS_RXE_CONFORMANCE" "$RMEMFS_RXE_SERVER_TESTS"; do
    [ -x "$b" ] || { echo "!! the build left no test binary for the rxe tier ('$b')" >&2; exit 1; }
  done
  export RMEMFS_RXE_CONFORMANCE RMEMFS_RXE_SERVER_TESTS
  echo "== starting the rxe tier beside the unit tests and the real mounts (tools/test-rxe.sh: the VM; its output at the end)"
  set -m
  rxe_overlapped &
  RXE_PID=$!
  set +m
fi
tier "cargo test (unit, property, conformance, server, in-process mounts; the lab's simulator)"
# The verbs fabric's conformance suite needs a device: it runs in the rxe tier.
echo "== (the verbs fabric's conformance suite, rdma_device::, runs in the rxe tier's VM, not here)"
cargo test "${TEST_BUILD_FLAGS[@]}" -- --skip rdma_device::
# Mounts take FUSE over io_uring by default where the kernel has it: the main run must then
# be served by the rings (a silent fall back to /dev/fuse would test the other path twice).
# shellcheck source=mount-tests/lib.sh
if (. mount-tests/lib.sh && has_fuse_uring); then uring=1; else uring=0; fi
tier "real mounts (mount-tests/run.sh; the default: FUSE over io_uring where the kernel has it)"
if [ "$uring" = 1 ]; then
  RMEMFS_EXPECT_FUSE=io_uring mount-tests/run.sh
else
  echo "!! this kernel's fuse module has no enable_uring: the default is /dev/fuse here"
  SKIPPED+=("FUSE over io_uring: not in this kernel (the main run went through /dev/fuse)")
  mount-tests/run.sh
fi
if [ "$uring" = 1 ]; then
  tier "real mounts through /dev/fuse (-o no_io_uring; the data-path tests again)"
  RMEMFS_MOUNT_ARGS="-o no_io_uring" RMEMFS_EXPECT_FUSE=/dev/fuse mount-tests/run.sh cp_tree \
    tar_roundtrip git sqlite posix_cases concurrent_writers fio_verify enospc absurd_sizes \
    server_death replica_failover replica_freeze replica_pair writeback linux_semantics \
    daemon_death
fi
tier "real mounts on volumes (--volume; the data-path tests again, each mount a new volume)"
# The shared servers twice the default size: fio_verify fills the default pair exactly, and a
# volume's journal ring takes 1/16 of each server.
RMEMFS_TEST_VOLUME=1 RMEMFS_TEST_SERVER_SIZE=512M mount-tests/run.sh cp_tree tar_roundtrip git sqlite posix_cases \
  concurrent_writers fio_verify replica_failover replica_pair atime_remount
tier "failures on separate test hosts (mount-tests/hosts.sh: kill, freeze, cut, restart)"
mount-tests/hosts.sh
tier "chaos, short (tools/chaos.sh 60: faults on random test hosts, some overlapping, while files are written)"
# On the default transport (FUSE over io_uring where the kernel has it, proven by stats).
if [ "$uring" = 1 ]; then
  RMEMFS_EXPECT_FUSE=io_uring tools/chaos.sh 60
else
  tools/chaos.sh 60
fi
if [ -n "$RXE_PID" ]; then
  tier "rxe tier (tools/test-rxe.sh, overlapped: waiting for its VM)"
  wait "$RXE_PID" || true
  echo "== (overlapped) rxe tier: the VM's conformance and mount tests over real soft-RoCE"
  cat "$OVERLAP_DIR/rxe.log" 2>/dev/null || true
  read -r secs cpu rc <"$OVERLAP_DIR/rxe.done" 2>/dev/null || { secs=0 cpu=0 rc=unfinished; }
  OVERLAP_TIMES+=("$secs $cpu  (overlapped) rxe tier")
  # Reaped by this tier's wait, the job's CPU is its own line, not this tier's.
  tier_cpu_started=$((tier_cpu_started + cpu))
  RXE_PID=""
  if [ "$rc" != 0 ]; then
    echo "!! (overlapped) rxe tier failed (exit $rc)"
    exit 1
  fi
fi
if [ ${#SKIPPED[@]} -gt 0 ]; then
  echo "== ${#SKIPPED[@]} tier(s) SKIPPED:"
  printf '   - %s\n' "${SKIPPED[@]}"
else
  echo "== every tier ran (none skipped)"
fi
