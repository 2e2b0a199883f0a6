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

# tree_tar OUT N: prints the path of the tar of a source-like tree of N files (~175 MB for
# 10,000), made once per N and kept in OUT for later runs (bench-meta, bench-volume).
tree_tar() {
  local out=$1 n=$2 tar=$1/tree-$2.tar
  if [ ! -s "$tar" ]; then
    echo "# making a $n-file tree" >&2
    python3 - "$BASE/tree" "$n" <<'PY'
import os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(13)
# Like a crate registry's sources: directories of a dozen files, two or three deep; file sizes
# log-normal around 5 KiB with a long tail (mean ~17 KiB).
made = 0
while made < n:
    d = os.path.join(root, "crate%04d" % (made // 60), "src", "m%02d" % ((made // 12) % 5))
    os.makedirs(d, exist_ok=True)
    for _ in range(min(12, n - made)):
        size = min(int(rng.lognormvariate(8.6, 1.5)), 8 << 20)
        with open(os.path.join(d, "f%05d.rs" % made), "wb") as f:
            f.write(rng.randbytes(size))
        made += 1
PY
    tar cf "$tar.part" -C "$BASE/tree" . && mv "$tar.part" "$tar"
    rm -rf "$BASE/tree"
  fi
  echo "$tar"
}

# wait_rebuilt MNT: waits (10 min at most) until MNT's stats show a server down and every
# chunk back at two copies; prints the last stats.
wait_rebuilt() {
  local st k
  for ((k = 0; k < 6000; k++)); do
    st=$("$BIN" stats "$1")
    grep -qE "^chunks: [0-9]+ copies each; .* degraded 0, lost 0$" <<<"$st" &&
      grep -q "DOWN" <<<"$st" && break
    sleep 0.1
  done
  printf '%s\n' "$st"
}

# start_servers N SIZE: N memory servers of SIZE each (start_server); their addresses,
# comma-separated, in SERVER_ADDRS, their pids in SERVER_PIDS.
start_servers() {
  local i
  SERVER_ADDRS="" SERVER_PIDS=()
  for ((i = 0; i < $1; i++)); do
    start_server "$2"
    SERVER_ADDRS+=${SERVER_ADDRS:+,}$SERVER_ADDR
    SERVER_PIDS+=("$SERVER_PID")
  done
}

# shared_bench_init NAME: the start of a benchmark of shared volumes: its packages, lib_init
# NAME, a Redis of its own (stopped on exit, with the cleanup), and TREE_TAR, the tar of the
# TAR_FILES-file tree (made once, kept in target/bench-shared).
shared_bench_init() {
  ensure_packages python3:python3 tar:tar bc:bc redis-server:redis-server
  lib_init "$1"
  start_redis --own-trap
  trap 'kill "$REDIS_PID" 2>/dev/null || true; cleanup' EXIT
  mkdir -p target/bench-shared
  TREE_TAR=$(tree_tar "$(cd target/bench-shared && pwd)" "$TAR_FILES")
}

# fill_empty MNT FROM TO PER: empty files f<FROM>..f<TO-1> under MNT, PER to a directory
# (d<i / PER>, made as needed).
fill_empty() {
  python3 - "$1" "$2" "$3" "$4" <<'PY'
import os, sys
root, lo, hi, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
for i in range(lo, hi):
    d = f"{root}/d{i // per}"
    if i % per == 0:
        os.makedirs(d, exist_ok=True)
    os.close(os.open(f"{d}/f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
PY
}
