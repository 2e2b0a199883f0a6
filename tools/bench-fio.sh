#!/usr/bin/env bash
# fio throughput and latency of rmemfs over the in-process fabric (no network: the ceiling of
# rmemfs's own code plus FUSE), over one and over two memory servers (loopback), against tmpfs,
# next to the raw fabric numbers of `rmemfs-bench fabric` (the lab crate: build with
# `cargo build --release --workspace`).
#
#   tools/bench-fio.sh
#   SIZE=1G RUNTIME=30 OUT=/tmp/bench tools/bench-fio.sh
#
# Settings (environment):
#   SIZE         file size of each fio job (default 256M; K/M/G suffixes, powers of two)
#   RUNTIME      seconds per job (default 10)
#   OUT          directory for the results (default target/bench-fio): one fio JSON per target
#                and job, bench-fabric.txt, summary.json
#   SERVER_SIZE  arena of each memory server (default 2 x SIZE + 64M)
#   RMEMFS_BIN, RMEMFS_MOUNT_ARGS as for mount-tests/run.sh
#   RMEMFS_BENCH_BIN  the rmemfs-bench binary (default: next to RMEMFS_BIN)
#
# Jobs (tools/fio/*.fio, psync, direct=0, time based): seq-write and seq-read with 1 MiB blocks,
# rand-write and rand-read with 4 KiB blocks, and both reads by four jobs at once (-4j: each job
# its own file of SIZE/4); the write jobs end with an fsync. direct=0 means the page cache is in the path, as
# for any program: reads that wrap around a file already read can be served from it.
# Needs root and /dev/fuse; installs fio when missing (Debian).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=mount-tests/lib.sh
. mount-tests/lib.sh

SIZE=${SIZE:-256M}
RUNTIME=${RUNTIME:-10}
OUT=${OUT:-target/bench-fio}
export SIZE RUNTIME
JOBS=(seq-write seq-read seq-read-4j rand-write rand-read rand-read-4j)

ensure_packages fio:fio python3:python3 fusermount3:fuse3 pgrep:procps numfmt:coreutils
check_prereqs mount serve || exit 2
check_bench fabric mount || exit 2
if ! size_bytes=$(numfmt --from=iec "$SIZE" 2>/dev/null); then
  echo "SIZE=$SIZE is not a size like 256M or 1G" >&2
  exit 2
fi
SERVER_SIZE=${SERVER_SIZE:-$((size_bytes * 2 / 1048576 + 64))M}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/*.json "$OUT/bench-fabric.txt"
lib_init bench

echo "== rmemfs-bench fabric --sizes 1M --depths 1,4 --bytes 256M --latency-iters 200 --clients 1"
timeout -k 10 1200 "$BENCH_BIN" fabric --rmemfs "$BIN" --sizes 1M --depths 1,4 --bytes 256M \
  --latency-iters 200 --clients 1 | tee "$OUT/bench-fabric.txt"

# run_jobs TARGET DIR: the four jobs on DIR; results in $OUT/TARGET-JOB.json. Each job's file is
# removed afterwards, so a target needs room for one file at a time.
run_jobs() {
  local target=$1 dir=$2 job bs jsize
  for job in "${JOBS[@]}"; do
    case $job in seq-*) bs=1M ;; *) bs=4k ;; esac
    # Four jobs read four files of a quarter of SIZE each: the same room as one job.
    case $job in *-4j) jsize=$((size_bytes / 4)) ;; *) jsize=$SIZE ;; esac
    echo "== $target: $job (bs $bs, size $jsize, ${RUNTIME}s)"
    SIZE=$jsize DIR=$dir BS=$bs timeout -k 10 $((RUNTIME + 600)) \
      fio --output-format=json --output="$OUT/$target-$job.json" "tools/fio/$job.fio"
    # shellcheck disable=SC2016 # expanded by the inner bash
    timeout -k 10 120 bash -c 'rm -f "$1/$2".*' _ "$dir" "$job"
  done
}

echo "== tmpfs ($SERVER_SIZE)"
mkdir -p "$BASE/tmpfs"
mount -t tmpfs -o "size=$SERVER_SIZE" tmpfs "$BASE/tmpfs"
run_jobs tmpfs "$BASE/tmpfs"
timeout -k 10 60 umount "$BASE/tmpfs"

echo "== rmemfs over the in-process fabric ($SERVER_SIZE; no network on the data path)"
# The ceiling of rmemfs's own code plus FUSE: the product's mount with an embedded server and
# the in-process fabric (`rmemfs-bench mount`), in the foreground of a background job.
mkdir -p "$BASE/mnt-0"
"$BENCH_BIN" mount "$BASE/mnt-0" --size "$SERVER_SIZE" >"$BASE/logs/mount-inproc.log" 2>&1 &
inproc_pid=$!
for ((i = 0; i < 150; i++)); do
  is_mounted "$BASE/mnt-0" && break
  kill -0 "$inproc_pid" 2>/dev/null || break
  sleep 0.2
done
if ! is_mounted "$BASE/mnt-0"; then
  echo "rmemfs-bench mount failed: $(tail -n 3 "$BASE/logs/mount-inproc.log")" >&2
  exit 1
fi
run_jobs rmemfs-inproc "$BASE/mnt-0"
timeout -k 10 60 umount "$BASE/mnt-0"
wait "$inproc_pid"

echo "== rmemfs over one server ($SERVER_SIZE)"
start_server "$SERVER_SIZE"
pids=("$SERVER_PID")
mount_fs "$BASE/mnt-1" "$SERVER_ADDR"
run_jobs rmemfs-1 "$BASE/mnt-1"
unmount_fs "$BASE/mnt-1"
kill_servers "${pids[@]}"

echo "== rmemfs over two servers ($SERVER_SIZE each)"
start_server "$SERVER_SIZE"
pids=("$SERVER_PID")
addrs=$SERVER_ADDR
start_server "$SERVER_SIZE"
pids+=("$SERVER_PID")
addrs+=,$SERVER_ADDR
mount_fs "$BASE/mnt-2" "$addrs"
run_jobs rmemfs-2 "$BASE/mnt-2"
unmount_fs "$BASE/mnt-2"
kill_servers "${pids[@]}"

echo
python3 - "$OUT" "$SIZE" "$RUNTIME" "$SERVER_SIZE" <<'PY'
import json, os, re, sys

out, size, runtime, server_size = sys.argv[1:5]
targets = ["tmpfs", "rmemfs-inproc", "rmemfs-1", "rmemfs-2"]
jobs = ["seq-read", "seq-read-4j", "seq-write", "rand-read", "rand-read-4j", "rand-write"]


def load(path):
    text = open(path).read()
    return json.loads(text[text.index("{"):])  # fio may print notes before the JSON


results = {}
for target in targets:
    for job in jobs:
        path = os.path.join(out, f"{target}-{job}.json")
        if not os.path.exists(path):
            continue
        j = load(path)["jobs"][0]
        side = j["read"] if "read" in job else j["write"]
        pct = side.get("clat_ns", {}).get("percentile", {})
        results.setdefault(target, {})[job] = {
            "mb_s": side["bw_bytes"] / 1e6,
            "iops": side["iops"],
            "p50_us": pct.get("50.000000", 0) / 1e3,
            "p99_us": pct.get("99.000000", 0) / 1e3,
        }

print(f"# fio: size {size}, {runtime} s per job, psync, direct=0; MB/s = 10^6 bytes/s; "
      "completion latency")
print(f"{'target':<13} {'job':<11} {'MB/s':>9} {'IOPS':>10} {'p50 us':>9} {'p99 us':>9}")
for target in targets:
    for job in jobs:
        r = results.get(target, {}).get(job)
        if r:
            print(f"{target:<13} {job:<11} {r['mb_s']:>9.1f} {r['iops']:>10.0f} "
                  f"{r['p50_us']:>9.1f} {r['p99_us']:>9.1f}")


def ratio(a, b):
    return a / b if b else None


def fmt(x):
    return f"{x:.2f}x" if x is not None else "-"


ratios = {}
print()
print(f"{'job':<11} {'inproc/tmpfs':>13} {'rmemfs-1/inproc':>16} {'rmemfs-1/tmpfs':>15} "
      f"{'rmemfs-2/rmemfs-1':>18}   (MB/s)")
for job in jobs:
    t = results.get("tmpfs", {}).get(job, {}).get("mb_s", 0)
    r0 = results.get("rmemfs-inproc", {}).get(job, {}).get("mb_s", 0)
    r1 = results.get("rmemfs-1", {}).get(job, {}).get("mb_s", 0)
    r2 = results.get("rmemfs-2", {}).get(job, {}).get("mb_s", 0)
    ratios[job] = {"inproc_vs_tmpfs": ratio(r0, t), "rmemfs1_vs_inproc": ratio(r1, r0),
                   "rmemfs1_vs_tmpfs": ratio(r1, t), "rmemfs2_vs_rmemfs1": ratio(r2, r1)}
    print(f"{job:<11} {fmt(ratios[job]['inproc_vs_tmpfs']):>13} "
          f"{fmt(ratios[job]['rmemfs1_vs_inproc']):>16} "
          f"{fmt(ratios[job]['rmemfs1_vs_tmpfs']):>15} "
          f"{fmt(ratios[job]['rmemfs2_vs_rmemfs1']):>18}")

# Lines like "WRITE    1MiB      4         2176       2778     78%":
# op, size, depth, fabric MB/s, tcp MB/s, ratio.
fabric = {}
line_re = re.compile(r"^(READ|WRITE)\s+(\S+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%\s*$")
with open(os.path.join(out, "bench-fabric.txt")) as f:
    for line in f:
        m = line_re.match(line)
        if m:
            op, sz, depth, fab, tcp, pct = m.groups()
            fabric[f"{op} {sz} depth {depth}"] = {
                "fabric_mb_s": float(fab), "tcp_mb_s": float(tcp), "ratio_pct": float(pct)}

print()
for target in ["rmemfs-inproc", "rmemfs-1"]:
    for job in ["seq-read", "rand-read"]:
        one = results.get(target, {}).get(job, {}).get("mb_s")
        four = results.get(target, {}).get(job + "-4j", {}).get("mb_s")
        if one and four:
            print(f"{target} {job}: 4 jobs / 1 job = {four:.0f} / {one:.0f} MB/s = {four / one:.2f}x")
one_inproc = results.get("rmemfs-inproc", {}).get("seq-read-4j", {}).get("mb_s")
four_1 = results.get("rmemfs-1", {}).get("seq-read-4j", {}).get("mb_s")
if one_inproc and four_1:
    print(f"seq-read 4 jobs, rmemfs-1 / inproc = {four_1 / one_inproc:.2f}x")

print()
fabric_ratios = {}
for job, op in [("seq-read", "READ"), ("seq-write", "WRITE")]:
    key = f"{op} 1MiB depth 4"
    fab = fabric.get(key, {}).get("fabric_mb_s")
    fs = results.get("rmemfs-1", {}).get(job, {}).get("mb_s")
    if fab and fs:
        fabric_ratios[job] = fs / fab
        print(f"rmemfs-1 {job} / fabric {key}: {fs:.0f} / {fab:.0f} MB/s = {fs / fab:.2f}x")
    else:
        print(f"rmemfs-1 {job} / fabric {key}: missing ({'no fabric line' if not fab else 'no fio result'})")

summary = {
    "config": {"size": size, "runtime_s": int(runtime), "server_size": server_size},
    "results": results,
    "ratios": ratios,
    "fabric": fabric,
    "fs_vs_fabric": fabric_ratios,
}
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
print(f"\n# results in {out} (summary.json, <target>-<job>.json, bench-fabric.txt)")
PY
