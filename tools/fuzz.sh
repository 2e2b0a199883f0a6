#!/usr/bin/env bash
# Runs the libFuzzer targets (fuzz/, cargo-fuzz) for SECONDS each (default 600), all of them
# or the named ones: tools/fuzz.sh [SECONDS] [TARGET...]
#
# Each target starts from its seed corpus (fuzz/corpus/<target>/, never written to) plus what
# earlier runs found (fuzz/work/<target>/, git-ignored, where libFuzzer adds new inputs).
# Prints per target the executions and whether it crashed; exits non-zero if any target
# crashed, naming the crash artifact (fuzz/artifacts/<target>/...). Copy that file to
# fuzz/regressions/<target>/ so `cargo test --features testing --test fuzz_regressions` keeps
# checking it. cargo-fuzz needs nightly flags: on a stable toolchain RUSTC_BOOTSTRAP=1 allows
# them. Installs cargo-fuzz when missing. FUZZ_BUILD_ONLY=1 builds the targets and stops.
# The test command does not fuzz (its build alone took about 1,100 CPU-seconds): it replays
# the seed corpus and the regressions (tests/fuzz_regressions.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

secs=${1:-600}
[ $# -gt 0 ] && shift
if ! [[ $secs =~ ^[0-9]+$ ]] || [ "$secs" -eq 0 ]; then
  echo "usage: tools/fuzz.sh [SECONDS] [TARGET...]  (SECONDS a positive integer)" >&2
  exit 2
fi
if [ $# -gt 0 ]; then
  targets=("$@")
else
  targets=()
  for f in fuzz/fuzz_targets/*.rs; do
    t=${f##*/}
    targets+=("${t%.rs}")
  done
fi

if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

echo "== cargo fuzz build (${targets[*]})"
for t in "${targets[@]}"; do
  if [ ! -f "fuzz/fuzz_targets/$t.rs" ]; then
    echo "no fuzz target $t (fuzz/fuzz_targets/$t.rs)" >&2
    exit 2
  fi
  cargo fuzz build "$t"
done
[ "${FUZZ_BUILD_ONLY:-0}" = 1 ] && exit 0

# run_target T: runs target T for $secs, printing its summary line last; non-zero on a crash.
run_target() {
  local t=$1 work seeds log extra=() asan rc execs rate artifact
  work="$root/fuzz/work/$t"
  seeds="$root/fuzz/corpus/$t"
  log="$root/fuzz/work/$t.log"
  mkdir -p "$work" "$seeds"
  asan=${ASAN_OPTIONS:-}
  case $t in
    # The NIC (and the memory server) serve each connection on its own thread, which may
    # still be exiting when the check returns (or when the run ends): LeakSanitizer would report that thread's
    # thread-local bookkeeping (__cxa_thread_atexit_impl) as a leak, both per input
    # (libFuzzer's -detect_leaks) and at exit (ASan's own check).
    nic_stream | control_session)
      extra=(-detect_leaks=0)
      asan=${asan:+$asan:}detect_leaks=0
      ;;
  esac
  echo "== $t: ${secs}s"
  # -timeout: an input that runs this long is a hang, reported like a crash.
  if ASAN_OPTIONS=$asan cargo fuzz run "$t" "$work" "$seeds" -- \
    -max_total_time="$secs" -timeout=30 -print_final_stats=1 "${extra[@]}" >"$log" 2>&1; then
    rc=0
  else
    rc=$?
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *\([0-9]*\).*/\1/p' "$log" | tail -n 1)
  artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
  if [ "$rc" -eq 0 ]; then
    echo "$t: ${execs:-?} executions in ${secs}s (${rate:-?}/s), no crash"
  else
    tail -n 40 "$log"
    echo "$t: CRASH (exit $rc) after ${execs:-?} executions; artifact: ${artifact:-none, see $log}"
    return 1
  fi
}

# FUZZ_PARALLEL=1: every target at once (the same wall time for all, their CPU shared).
crashed=0
summary=()
outs=()
pids=()
mkdir -p "$root/fuzz/work"
for t in "${targets[@]}"; do
  out="$root/fuzz/work/$t.out"
  outs+=("$out")
  if [ "${FUZZ_PARALLEL:-0}" = 1 ]; then
    run_target "$t" >"$out" 2>&1 &
    pids+=($!)
  else
    run_target "$t" 2>&1 | tee "$out" || crashed=1
  fi
done
for pid in "${pids[@]}"; do wait "$pid" || crashed=1; done
for out in "${outs[@]}"; do
  [ "${FUZZ_PARALLEL:-0}" = 1 ] && cat "$out"
  summary+=("$(tail -n 1 "$out")")
done

echo "== summary"
printf '%s\n' "${summary[@]}"
exit "$crashed"
