# The lab's shell helpers: what benchmarks need beyond the mount tests' library (which this
# sources: packages, servers, mounts, cleanup): the lab binary, the no-network mount, the FUSE
# floor, charts.
# shellcheck shell=bash
# shellcheck source=mount-tests/lib.sh
. mount-tests/lib.sh

# check_bench SUBCOMMAND...: BENCH_BIN exists and has the subcommands (after check_prereqs).
check_bench() {
  local sub
  if [ ! -x "$BENCH_BIN" ]; then
    echo "error: $BENCH_BIN not found: build the lab with 'cargo build --release --workspace'" \
      "(or set RMEMFS_BENCH_BIN)" >&2
    return 1
  fi
  for sub in "$@"; do
    if ! timeout 30 "$BENCH_BIN" "$sub" --help >/dev/null 2>&1; then
      echo "error: $BENCH_BIN has no '$sub' subcommand" >&2
      return 1
    fi
  done
}

# mount_inproc MNT SIZE [OPTION...]: the product's mount over the in-process fabric with an embedded
# server of SIZE (`rmemfs-bench mount`, in a background job: INPROC_PID), the ceiling of
# rmemfs's own code plus FUSE with no network on the data path. unmount_inproc MNT ends it.
INPROC_PID=""
mount_inproc() {
  local mnt=$1 size=$2 i
  shift 2
  mkdir -p "$mnt"
  "$BENCH_BIN" mount "$mnt" --size "$size" "$@" >"$BASE/logs/mount-inproc.log" 2>&1 &
  INPROC_PID=$!
  for ((i = 0; i < 150; i++)); do
    is_mounted "$mnt" && return 0
    kill -0 "$INPROC_PID" 2>/dev/null || break
    sleep 0.2
  done
  echo "rmemfs-bench mount failed: $(tail -n 3 "$BASE/logs/mount-inproc.log")" >&2
  return 1
}
unmount_inproc() {
  timeout -k 10 60 umount "$1"
  wait "$INPROC_PID"
}

# fuse_floor MNT OUT: the FUSE round trip of a null file system (through io_uring too where
# the kernel has it) beside the same request on the rmemfs mount MNT (`rmemfs-bench
# fuse-floor`); its table in OUT, its figures in OUT with .json for .txt (for the scripts'
# summaries). FLOOR_ITERS: calls per file system (the lab's default if unset; fewer where a
# round trip is slow, as under emulation).
fuse_floor() {
  local mnt=$1 out=$2 flags=()
  has_fuse_uring && flags+=(--uring)
  [ -n "${FLOOR_ITERS:-}" ] && flags+=(--iters "$FLOOR_ITERS")
  touch "$mnt/floor"
  timeout -k 10 600 "$BENCH_BIN" fuse-floor "${flags[@]}" --against "$mnt/floor" \
    --json "${out%.txt}.json" >"$out"
  rm -f "$mnt/floor"
}

# draw_chart SPEC SVG: a benchmark's chart from its spec (`rmemfs-bench bars`, the lab's
# bars module; scripts that draw call `check_bench bars` first, so a missing lab fails early).
draw_chart() {
  "$BENCH_BIN" bars "$1" "$2"
  echo "# chart: $2"
}
