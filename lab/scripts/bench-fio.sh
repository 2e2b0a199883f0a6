#!/usr/bin/env bash
# The peer benchmark (#13, #27): fio on tmpfs; on two FUSE peers, an in-memory FUSE file system
# with the writeback cache (`rmemfs-bench memfs`) and sshfs over loopback (an sshd of its own
# on a free loopback port, to a tmpfs directory); on rmemfs over the in-process fabric (no network: the
# ceiling of rmemfs's own code plus FUSE); on rmemfs over tcp with one server, with two
# servers and one copy of each chunk (striped), and with two servers and two copies; next to
# the raw fabric numbers of `rmemfs-bench fabric` (the lab crate: build with
# `cargo build --release --workspace`). One command, one run; about 10 minutes by default.
#
#   lab/scripts/bench-fio.sh
#   SIZE=1G RUNTIME=30 OUT=/tmp/bench lab/scripts/bench-fio.sh
#
# Settings (environment):
#   SIZE         file size of each fio job (default 1G, as 1 MiB jobs then run for about a
#                second here; K/M/G suffixes, powers of two)
#   RUNTIME      seconds per job (default 10)
#   OUT          directory for the results (default target/bench-fio): one fio JSON and one
#                `rmemfs stats` snapshot per target and job, bench-fabric.txt, summary.json
#                (figures, ratios, the daemon's requests per job) and chart.svg
#   SERVER_SIZE  arena of each memory server (default 2 x SIZE + 64M, at least 4G: a pool
#                above the mount's writeback low-water mark, so the kernel's writeback cache
#                is on as on any pool of a few GiB; arenas cost RAM only where used)
#   RMEMFS_BIN, RMEMFS_MOUNT_ARGS as for mount-tests/run.sh
#   RMEMFS_BENCH_BIN  the rmemfs-bench binary (default: next to RMEMFS_BIN)
#   TARGETS      the targets to run, of: tmpfs memfs sshfs rmemfs-inproc rmemfs-1 rmemfs-2r1
#                rmemfs-2 (the default: all of these) and rmemfs-1-backed,
#                rmemfs-1-backed-disk (one server with `serve --backing`, its file on tmpfs in
#                /dev/shm, or on the disk file system of BACKING_DIR, default /var/tmp)
#   JOBS         the jobs to run (default: all of them, below)
#
# Jobs (lab/fio/*.fio, psync, direct=0): seq-write and seq-read with 1 MiB blocks, rand-write
# and rand-read with 4 KiB blocks, each by one job and by four at once (-4j: each job its own
# file of SIZE/4), time based; seq-fresh and seq-overwrite, one pass of 1 MiB writes into a new
# file and over a laid-out one. The write jobs end with an fsync. direct=0 means the page cache
# is in the path, as for any program: reads that wrap around a file already read can be
# served from it. A read job's files are laid out, written back and dropped from the page
# cache before it starts, so it times reads alone. Prints a table per target and job (MB/s, IOPS, p50/p99, the daemon's top
# requests), the ratios between targets, 4-jobs/1-job and fresh/overwrite.
# Needs root and /dev/fuse; installs fio when missing (Debian).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh

SIZE=${SIZE:-1G}
RUNTIME=${RUNTIME:-10}
OUT=${OUT:-target/bench-fio}
export SIZE RUNTIME
# shellcheck disable=SC2206 # word splitting of the lists is meant
JOBS=(${JOBS:-seq-write seq-write-4j seq-fresh seq-overwrite seq-read seq-read-4j
  rand-write rand-write-4j rand-read rand-read-4j})
TARGETS=" ${TARGETS:-tmpfs memfs sshfs rmemfs-inproc rmemfs-1 rmemfs-2r1 rmemfs-2} "
BACKING_DIR=${BACKING_DIR:-/var/tmp}
# want TARGET: whether TARGET is to run.
want() { [[ $TARGETS == *" $1 "* ]]; }

# openssh-server is installed for the sshfs peer's own sshd only: the package's system
# service must not start (it would listen on every interface), so a policy-rc.d holds it
# back while it installs, unless the machine has one already.
policy=/usr/sbin/policy-rc.d
made_policy=0
if ! command -v sshd >/dev/null 2>&1 && [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
fi
ensure_packages fio:fio python3:python3 fusermount3:fuse3 pgrep:procps numfmt:coreutils \
  sshfs:sshfs sshd:openssh-server
[ "$made_policy" = 1 ] && rm -f "$policy"

# start_loopback_sshd DIR: an sshd of its own on a free loopback port (SSHD_PORT, SSHD_PID),
# root's login by a throwaway key (DIR/id) only; for the sshfs peer. Ends with the run.
start_loopback_sshd() {
  local dir=$1 i
  mkdir -p "$dir" /run/sshd
  chmod 700 "$dir"
  ssh-keygen -q -t ed25519 -N "" -f "$dir/host" </dev/null
  ssh-keygen -q -t ed25519 -N "" -f "$dir/id" </dev/null
  cp "$dir/id.pub" "$dir/authorized_keys"
  SSHD_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$(command -v sshd)" -D -e -f /dev/null -p "$SSHD_PORT" -o ListenAddress=127.0.0.1 \
    -o HostKey="$dir/host" -o AuthorizedKeysFile="$dir/authorized_keys" -o UsePAM=no \
    -o PermitRootLogin=prohibit-password -o PasswordAuthentication=no -o StrictModes=no \
    -o "Subsystem=sftp internal-sftp" -o PidFile=none 2>"$dir/sshd.log" &
  SSHD_PID=$!
  trap 'kill "$SSHD_PID" 2>/dev/null || true; cleanup' EXIT
  for ((i = 0; i < 50; i++)); do
    ssh -p "$SSHD_PORT" -i "$dir/id" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
      -o BatchMode=yes root@127.0.0.1 true 2>/dev/null && return 0
    sleep 0.2
  done
  echo "the loopback sshd did not accept the key: $(tail -n 3 "$dir/sshd.log")" >&2
  return 1
}
check_prereqs mount serve || exit 2
check_bench fabric mount || exit 2
if ! size_bytes=$(numfmt --from=iec "$SIZE" 2>/dev/null); then
  echo "SIZE=$SIZE is not a size like 256M or 1G" >&2
  exit 2
fi
server_mib=$((size_bytes * 2 / 1048576 + 64))
[ "$server_mib" -lt 4096 ] && server_mib=4096
SERVER_SIZE=${SERVER_SIZE:-${server_mib}M}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/*.json "$OUT"/*.stats "$OUT/bench-fabric.txt" "$OUT/chart.svg"
lib_init bench

if want rmemfs-1; then
  echo "== rmemfs-bench fabric --sizes 1M --depths 1,4 --bytes 256M --latency-iters 200 --clients 1"
  timeout -k 10 1200 "$BENCH_BIN" fabric --rmemfs "$BIN" --sizes 1M --depths 1,4 --bytes 256M \
    --latency-iters 200 --clients 1 | tee "$OUT/bench-fabric.txt"
fi

# run_jobs TARGET DIR: the jobs on DIR; results in $OUT/TARGET-JOB.json, and for an rmemfs
# mount the daemon's request counts after each job in $OUT/TARGET-JOB.stats. Each job's file
# is removed afterwards, so a target needs room for one file at a time.
run_jobs() {
  local target=$1 dir=$2 job bs jsize n=0
  for job in "${JOBS[@]}"; do
    n=$((n + 1))
    case $job in seq-*) bs=1M ;; *) bs=4k ;; esac
    # Four jobs read four files of a quarter of SIZE each: the same room as one job.
    case $job in *-4j) jsize=$((size_bytes / 4)) ;; *) jsize=$SIZE ;; esac
    echo "== $target: job $n of ${#JOBS[@]}, $job (bs $bs, size $jsize, ${RUNTIME}s)"
    case $job in
      *-read*)
        # The files a read job reads are laid out first, written back and dropped from the
        # page cache: the job then times reads alone, not the layout's writeback beside them.
        SIZE=$jsize DIR=$dir BS=$bs timeout -k 10 600 \
          fio --create_only=1 --output=/dev/null "lab/fio/$job.fio"
        drop_caches "$dir"
        if [ "$target" != tmpfs ]; then
          timeout -k 10 30 "$BIN" stats "$dir" >"$OUT/$target-$job.before.stats" 2>&1 || true
        fi
        ;;
    esac
    SIZE=$jsize DIR=$dir BS=$bs timeout -k 10 $((RUNTIME + 600)) \
      fio --output-format=json --output="$OUT/$target-$job.json" "lab/fio/$job.fio"
    if [ "$target" != tmpfs ]; then
      timeout -k 10 30 "$BIN" stats "$dir" >"$OUT/$target-$job.stats" 2>&1 || true
    fi
    # shellcheck disable=SC2016 # expanded by the inner bash
    timeout -k 10 120 bash -c 'rm -f "$1/$2".*' _ "$dir" "$job"
  done
}

if want tmpfs; then
echo "== tmpfs ($SERVER_SIZE)"
mkdir -p "$BASE/tmpfs"
mount -t tmpfs -o "size=$SERVER_SIZE" tmpfs "$BASE/tmpfs"
run_jobs tmpfs "$BASE/tmpfs"
timeout -k 10 60 umount "$BASE/tmpfs"
fi

# The peers (#27): an in-memory FUSE file system with the writeback cache (rmemfs-bench
# memfs: no rmemfs code, its bytes in the daemon's memory), and sshfs over loopback.
if want memfs; then
echo "== memfs (an in-memory FUSE file system with the writeback cache)"
mkdir -p "$BASE/memfs"
"$BENCH_BIN" memfs "$BASE/memfs" >"$BASE/logs/memfs.log" 2>&1 &
memfs_pid=$!
for ((i = 0; i < 100; i++)); do is_mounted "$BASE/memfs" && break; sleep 0.1; done
is_mounted "$BASE/memfs" || { echo "memfs did not mount: $(tail -n 3 "$BASE/logs/memfs.log")" >&2; exit 1; }
run_jobs memfs "$BASE/memfs"
timeout -k 10 60 umount "$BASE/memfs"
wait "$memfs_pid" || true
fi

if want sshfs; then
echo "== sshfs over loopback (to a directory on tmpfs)"
start_loopback_sshd "$BASE/sshd"
mkdir -p "$BASE/sshfs-src" "$BASE/sshfs"
mount -t tmpfs -o "size=$SERVER_SIZE" tmpfs "$BASE/sshfs-src"
sshfs -p "$SSHD_PORT" -o "IdentityFile=$BASE/sshd/id,StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null" \
  "root@127.0.0.1:$BASE/sshfs-src" "$BASE/sshfs"
run_jobs sshfs "$BASE/sshfs"
timeout -k 10 60 umount "$BASE/sshfs"
timeout -k 10 60 umount "$BASE/sshfs-src"
kill "$SSHD_PID" 2>/dev/null || true
fi

if want rmemfs-inproc; then
echo "== rmemfs over the in-process fabric ($SERVER_SIZE; no network on the data path)"
mount_inproc "$BASE/mnt-0" "$SERVER_SIZE" || exit 1
run_jobs rmemfs-inproc "$BASE/mnt-0"
unmount_inproc "$BASE/mnt-0"
fi

# One server: in RAM (rmemfs-1), and backed by a file (`serve --backing`) on tmpfs and on
# a disk file system: what keeping the extents across a restart costs.
for target in rmemfs-1 rmemfs-1-backed rmemfs-1-backed-disk; do
  want "$target" || continue
  backing=()
  case $target in
    rmemfs-1-backed) backing=(--backing "$(mktemp -u /dev/shm/rmemfs-bench-backing.XXXXXX)") ;;
    rmemfs-1-backed-disk) backing=(--backing "$(mktemp -u "$BACKING_DIR/rmemfs-bench-backing.XXXXXX")") ;;
  esac
  echo "== $target: one server ($SERVER_SIZE)${backing[*]:+, ${backing[*]}}"
  start_server "$SERVER_SIZE" "${backing[@]}"
  pids=("$SERVER_PID")
  mount_fs "$BASE/$target" "$SERVER_ADDR"
  run_jobs "$target" "$BASE/$target"
  unmount_fs "$BASE/$target"
  kill_servers "${pids[@]}"
  [ ${#backing[@]} = 0 ] || rm -f "${backing[1]}"
done

# Two servers: striped with one copy of each chunk (rmemfs-2r1), and with two copies, one
# on each server (rmemfs-2, the default for two servers).
for replicas in 1 2; do
  target=rmemfs-2
  [ "$replicas" = 1 ] && target=rmemfs-2r1
  want "$target" || continue
  echo "== rmemfs over two servers ($SERVER_SIZE each), $replicas cop$([ "$replicas" = 1 ] && echo y || echo ies) of each chunk"
  start_server "$SERVER_SIZE"
  pids=("$SERVER_PID")
  addrs=$SERVER_ADDR
  start_server "$SERVER_SIZE"
  pids+=("$SERVER_PID")
  addrs+=,$SERVER_ADDR
  mount_fs "$BASE/$target" "$addrs" --replicas "$replicas"
  run_jobs "$target" "$BASE/$target"
  unmount_fs "$BASE/$target"
  kill_servers "${pids[@]}"
done

echo
python3 - "$OUT" "$SIZE" "$RUNTIME" "$SERVER_SIZE" "${JOBS[*]}" <<'PY'
import json, os, re, sys
sys.path.insert(0, "lab/scripts")
from fio_result import fio_side  # noqa: E402

out, size, runtime, server_size = sys.argv[1:5]
run_order = sys.argv[5].split()  # JOBS: the stats snapshots are cumulative in this order
targets = ["tmpfs", "memfs", "sshfs", "rmemfs-inproc", "rmemfs-1", "rmemfs-1-backed",
           "rmemfs-1-backed-disk", "rmemfs-2r1", "rmemfs-2"]
jobs = ["seq-read", "seq-read-4j", "seq-write", "seq-write-4j", "seq-fresh", "seq-overwrite",
        "rand-read", "rand-read-4j", "rand-write", "rand-write-4j"]


def request_counts(path):
    """The per-operation request counts of an `rmemfs stats` snapshot."""
    counts, inside = {}, False
    if not os.path.exists(path):
        return None
    for line in open(path):
        if line.startswith("requests:"):
            inside = True
            continue
        if inside:
            parts = line.split()
            if line.startswith("  ") and len(parts) == 5 and parts[1].isdigit():
                counts[parts[0]] = int(parts[1])
            else:
                inside = False
    return counts


results = {}
for target in targets:
    before = {}
    for job in run_order:
        path = os.path.join(out, f"{target}-{job}.json")
        if not os.path.exists(path):
            continue
        f = fio_side(path, job)
        r = results.setdefault(target, {})[job] = {
            "mb_s": f["mb_s"],
            "iops": f["iops"],
            "p50_us": f["p50_us"],
            "p99_us": f["p99_us"],
        }
        # The daemon's requests during this job (after its files were laid out, for reads).
        laid_out = request_counts(os.path.join(out, f"{target}-{job}.before.stats"))
        if laid_out is not None:
            before = laid_out
        now = request_counts(os.path.join(out, f"{target}-{job}.stats"))
        if now is not None:
            r["requests"] = {op: n - before.get(op, 0) for op, n in now.items()
                             if n - before.get(op, 0) > 0}
            before = now

print(f"# fio: size {size}, {runtime} s per job, psync, direct=0; MB/s = 10^6 bytes/s; "
      "completion latency")
print(f"{'target':<14} {'job':<14} {'MB/s':>9} {'IOPS':>10} {'p50 us':>9} {'p99 us':>9}  "
      "daemon requests during the job (top 3)")
for target in targets:
    for job in jobs:
        r = results.get(target, {}).get(job)
        if not r:
            continue
        top = sorted(r.get("requests", {}).items(), key=lambda kv: -kv[1])[:3]
        total = sum(r.get("requests", {}).values())
        reqs = " ".join(f"{op} {n}" for op, n in top) + (f" (of {total})" if total else "")
        print(f"{target:<14} {job:<14} {r['mb_s']:>9.1f} {r['iops']:>10.0f} "
              f"{r['p50_us']:>9.1f} {r['p99_us']:>9.1f}  {reqs}")


def ratio(a, b):
    return a / b if a and b else None


def fmt(x):
    return f"{x:.2f}x" if x is not None else "-"


def mb(target, job):
    return results.get(target, {}).get(job, {}).get("mb_s", 0)


ratios = {}
print()
cols = [("1/memfs", "rmemfs-1", "memfs"), ("1/sshfs", "rmemfs-1", "sshfs"),
        ("inproc/tmpfs", "rmemfs-inproc", "tmpfs"), ("1/inproc", "rmemfs-1", "rmemfs-inproc"),
        ("1/tmpfs", "rmemfs-1", "tmpfs"), ("2r1/1", "rmemfs-2r1", "rmemfs-1"),
        ("2/1", "rmemfs-2", "rmemfs-1"), ("2/inproc", "rmemfs-2", "rmemfs-inproc"),
        ("backed/1", "rmemfs-1-backed", "rmemfs-1"),
        ("disk/1", "rmemfs-1-backed-disk", "rmemfs-1")]
cols = [c for c in cols if c[1] in results and c[2] in results]
print(f"{'job':<14} " + " ".join(f"{c[0]:>12}" for c in cols) + "   (MB/s ratios)")
for job in [j for j in jobs if any(j in r for r in results.values())]:
    ratios[job] = {name: ratio(mb(a, job), mb(b, job)) for name, a, b in cols}
    print(f"{job:<14} " + " ".join(f"{fmt(ratios[job][c[0]]):>12}" for c in cols))

print()
scaling = {}
for target in targets:
    for job in ["seq-read", "seq-write", "rand-read", "rand-write"]:
        one, four = mb(target, job), mb(target, job + "-4j")
        if one and four:
            scaling.setdefault(target, {})[job] = four / one
    fresh, over = mb(target, "seq-fresh"), mb(target, "seq-overwrite")
    if fresh and over:
        scaling.setdefault(target, {})["fresh/overwrite"] = fresh / over
for target, row in scaling.items():
    print(f"{target:<14} 4 jobs / 1 job: " +
          ", ".join(f"{job} {v:.2f}x" for job, v in row.items() if job != "fresh/overwrite") +
          (f"; fresh / overwrite {row['fresh/overwrite']:.2f}x" if "fresh/overwrite" in row
           else ""))
four_1, four_inproc = mb("rmemfs-1", "seq-read-4j"), mb("rmemfs-inproc", "seq-read-4j")
if four_1 and four_inproc:
    print(f"seq-read 4 jobs, rmemfs-1 / inproc = {four_1 / four_inproc:.2f}x")

# Lines like "WRITE    1MiB      4         2176       2778     78%":
# op, size, depth, fabric MB/s, tcp MB/s, ratio.
fabric = {}
line_re = re.compile(r"^(READ|WRITE)\s+(\S+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%\s*$")
fabric_path = os.path.join(out, "bench-fabric.txt")
fabric_lines = open(fabric_path).read().splitlines() if os.path.exists(fabric_path) else []
for line in fabric_lines:
    m = line_re.match(line)
    if m:
        op, sz, depth, fab, tcp, pct = m.groups()
        fabric[f"{op} {sz} depth {depth}"] = {
            "fabric_mb_s": float(fab), "tcp_mb_s": float(tcp), "ratio_pct": float(pct)}

print()
fabric_ratios = {}
for job, op in [("seq-read", "READ"), ("seq-write", "WRITE")]:
    key = f"{op} 1MiB depth 4"
    fab = fabric.get(key, {}).get("fabric_mb_s")
    fs = mb("rmemfs-1", job)
    if fab and fs:
        fabric_ratios[job] = fs / fab
        print(f"rmemfs-1 {job} / fabric {key}: {fs:.0f} / {fab:.0f} MB/s = {fs / fab:.2f}x")
    else:
        print(f"rmemfs-1 {job} / fabric {key}: missing ({'no fabric line' if not fab else 'no fio result'})")

summary = {
    "config": {"size": size, "runtime_s": int(runtime), "server_size": server_size},
    "results": results,
    "ratios": ratios,
    "scaling": scaling,
    "fabric": fabric,
    "fs_vs_fabric": fabric_ratios,
}
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
PY
"$BENCH_BIN" chart "$OUT/summary.json" "$OUT/chart.svg"
echo
echo "# results in $OUT: summary.json, chart.svg, <target>-<job>.json (fio), <target>-<job>.stats"
echo "# (rmemfs stats after the job), bench-fabric.txt"
