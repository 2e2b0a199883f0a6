#!/usr/bin/env bash
# rmemfs on real soft-RoCE against perftest on the same link, in one VM boot.
#
#   lab/scripts/bench-rxe.sh                 # build on the host, boot the rxe VM, run, print ratios
#   SIZE=64M RUNTIME=20 lab/scripts/bench-rxe.sh
#
# Under TCG emulation absolute figures measure the emulator (rxe runs ~30 MB/s there); only the
# ratios within one boot mean something. In the guest:
#   1. perftest on rxe0: ib_read_bw and ib_write_bw at 1 MiB, ib_read_lat at 4 KiB;
#   2. fio on rmemfs over verbs (a memory server process with `serve --fabric verbs`, a mount
#      that takes verbs from its hello): 1 MiB sequential write and read, 4 KiB random read
#      (lab/fio/*.fio: psync, one job, page cache in the path, caches invalidated first);
#      and the floor under the 4 KiB read: `rmemfs-bench fuse-floor` (a null FUSE file system's
#      round trip and 4 KiB read in this guest) + ib_read_lat;
#   3. the mount's switches on verbs (lab/scripts/bench-switches.sh): --reg-cache mrrc|lru|none and
#      --write-path frrwp|serial;
#   4. `rmemfs-bench frrwp --fabric verbs`: serial against FRRWP writes to fresh memory.
# Prints the ratios rmemfs/ib_read_bw, rmemfs/ib_write_bw and rmemfs p50/ib_read_lat, and draws
# them in chart.svg; results and logs in target/bench-rxe/.
#
# Settings: SIZE (fio file size, default 128M), RUNTIME (cap per fio job, default 30 s),
# SWITCH_FILES and SWITCH_MB (bench-switches, default 2 files of 16 MiB), FRRWP_ITERS (20),
# PARTS (default "tcp switches frrwp": the optional parts after perftest and fio; tcp is
# 4 KiB random reads over the TCP fabric in the same guest, for what FUSE costs there).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=target/bench-rxe

if [ "${1:-}" != --in-vm ]; then
  # Host side: build with the verbs feature, then run this script inside the VM.
  need=()
  command -v bc >/dev/null 2>&1 || need+=(bc)
  command -v python3 >/dev/null 2>&1 || need+=(python3)
  if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  tools/build-verbs.sh
  rm -rf "$OUT" && mkdir -p "$OUT"
  exec tools/rxe-vm.sh --timeout "${RMEMFS_RXE_TIMEOUT:-1500}" -- \
    env SIZE="${SIZE:-128M}" RUNTIME="${RUNTIME:-30}" SWITCH_FILES="${SWITCH_FILES:-2}" \
    SWITCH_MB="${SWITCH_MB:-16}" FRRWP_ITERS="${FRRWP_ITERS:-20}" \
    PARTS="${PARTS-tcp switches frrwp}" lab/scripts/bench-rxe.sh --in-vm
fi

# --- inside the VM ---------------------------------------------------------------------------
export RMEMFS_BIN=target/release/rmemfs-verbs RMEMFS_SERVE_ARGS="--fabric verbs --device rxe0"
export RMEMFS_BENCH_BIN=target/release/rmemfs-bench-verbs
export RMEMFS_EXPECT_FABRIC=verbs
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh
DEV=${RMEMFS_RXE_DEVICE:-rxe0}
check_bench bars fuse-floor || exit 2
lib_init bench-rxe

# perftest TOOL ARGS...: server and client of TOOL on $DEV over loopback (GID 1 is the
# IPv4-mapped 127.0.0.1); the client's report goes to $OUT/TOOL.txt. perftest's cycle timer
# sometimes reports `inf` under TCG: up to three tries.
perftest() {
  local tool=$1 try
  shift
  for try in 1 2 3; do
    timeout 120 "$tool" -d "$DEV" -x 1 -F "$@" >"$OUT/$tool-server.txt" 2>&1 &
    sleep 2
    timeout 120 "$tool" -d "$DEV" -x 1 -F "$@" 127.0.0.1 >"$OUT/$tool.txt" 2>&1 || true
    wait || true
    grep -q inf "$OUT/$tool.txt" || return 0
    echo "# $tool reported inf (try $try)" >&2
  done
}
echo "== perftest on $DEV"
perftest ib_read_bw -s 1048576 -n 200 -t 16
perftest ib_write_bw -s 1048576 -n 200 -t 16
perftest ib_read_lat -s 4096 -n 1000
tail -n 3 "$OUT"/ib_*.txt | grep -v '^$' || true

echo "== fio on rmemfs over verbs ($SIZE per job, cap ${RUNTIME}s)"
start_server 768M
mount_fs "$BASE/mnt" "$SERVER_ADDR"
for job in seq-write seq-read rand-read; do
  case $job in seq-*) bs=1M ;; *) bs=4k ;; esac
  echo "== fio $job (bs $bs)"
  DIR=$BASE/mnt BS=$bs SIZE=$SIZE RUNTIME=$RUNTIME timeout -k 10 600 \
    fio --output-format=json --output="$OUT/fio-$job.json" "lab/fio/$job.fio"
done
"$BIN" stats "$BASE/mnt" >"$OUT/stats-fio.txt"
# The floor under the 4 KiB read: a FUSE round trip with no file-system code in this guest.
echo "== the FUSE round trip (rmemfs-bench fuse-floor)"
FLOOR_ITERS=${FLOOR_ITERS:-2000} fuse_floor "$BASE/mnt" "$OUT/fuse-floor.txt"
cat "$OUT/fuse-floor.txt"
unmount_fs "$BASE/mnt"
kill_servers "${ALL_SERVER_PIDS[@]}"

if [[ " $PARTS " == *" tcp "* ]]; then
  # The same 4 KiB random reads over the TCP fabric in the same guest: what FUSE and the
  # daemon cost here without RDMA in the path.
  echo "== fio rand-read on rmemfs over the tcp fabric (reference)"
  # shellcheck disable=SC2034 # read by start_server and mount_fs (mount-tests/lib.sh)
  SERVE_ARGS=(--fabric tcp)
  # shellcheck disable=SC2034
  EXPECT_FABRIC=tcp
  start_server 256M
  mount_fs "$BASE/mnt-tcp" "$SERVER_ADDR"
  DIR=$BASE/mnt-tcp BS=4k SIZE=$SIZE RUNTIME=$RUNTIME timeout -k 10 600 \
    fio --output-format=json --output="$OUT/fio-tcp-rand-read.json" lab/fio/rand-read.fio
  unmount_fs "$BASE/mnt-tcp"
  kill_servers "${ALL_SERVER_PIDS[@]}"
fi

if [[ " $PARTS " == *" switches "* ]]; then
  echo "== the mount's switches on verbs"
  FILES=$SWITCH_FILES MB=$SWITCH_MB OUT=$OUT/switches lab/scripts/bench-switches.sh |
    tee "$OUT/switches.txt"
fi
if [[ " $PARTS " == *" frrwp "* ]]; then
  echo "== rmemfs-bench frrwp on verbs"
  timeout -k 10 900 "$BENCH_BIN" frrwp --rmemfs "$BIN" --fabric verbs --device "$DEV" \
    --iters "$FRRWP_ITERS" |
    tee "$OUT/frrwp.txt"
fi

python3 - "$OUT" "$SIZE" <<'PY'
import json, os, sys
sys.path.insert(0, "lab/scripts")
from fio_result import fio_side  # noqa: E402

out, size = sys.argv[1:3]


def perftest(name, column):
    """The figure in `column` (0-based) of the result line of a perftest report."""
    for line in open(os.path.join(out, name + ".txt")):
        f = line.split()
        if len(f) > column and f[0].isdigit() and f[1].isdigit():
            return float(f[column])
    raise SystemExit(f"no result line in {name}.txt")


def fio(job):
    f = fio_side(os.path.join(out, f"fio-{job}.json"), job)
    return f["mib_s"], f["p50_us"], f["iops"]


# perftest: MB/sec is 2^20 bytes per second; columns: bytes iters peak average msgrate.
read_bw = perftest("ib_read_bw", 3)
write_bw = perftest("ib_write_bw", 3)
# ib_read_lat: bytes iters t_min t_max t_typical ...
read_lat = perftest("ib_read_lat", 4)
w_bw, _, _ = fio("seq-write")
r_bw, _, _ = fio("seq-read")
_, rr_p50, rr_iops = fio("rand-read")
print()
print(f"# rmemfs over verbs (rxe0, TCG guest) against perftest on the same rxe0, one boot; fio {size} psync")
print(f"{'measure':<34} {'rmemfs':>12} {'perftest':>12} {'ratio':>7} {'target':>8}")
print(f"{'1 MiB seq read, MiB/s':<34} {r_bw:>12.1f} {read_bw:>12.1f} {r_bw / read_bw:>7.2f} {'>= 0.90':>8}")
print(f"{'1 MiB seq write, MiB/s':<34} {w_bw:>12.1f} {write_bw:>12.1f} {w_bw / write_bw:>7.2f} {'>= 0.80':>8}")
print(f"{'4 KiB rand read p50 / read_lat, us':<34} {rr_p50:>12.1f} {read_lat:>12.1f} {rr_p50 / read_lat:>7.2f} {'<= 3.00':>8}")
print(f"(4 KiB random read: {rr_iops:.0f} IOPS)")
# The floor: a read is at least a FUSE read that misses the page cache and an RDMA READ, one
# after the other.
floor = json.load(open(os.path.join(out, "fuse-floor.json")))
for measure, what in [("getxattr", "round trip (getxattr)"),
                      ("read_4k", "4 KiB read missing the page cache")]:
    p50 = floor[measure]["null"]["p50_us"]
    print(f"(a null FUSE file system's {what}: p50 {p50:.1f} us; + ib_read_lat = "
          f"{p50 + read_lat:.1f} us = {(p50 + read_lat) / read_lat:.2f}x ib_read_lat)")
tcp = os.path.join(out, "fio-tcp-rand-read.json")
if os.path.exists(tcp):
    _, t_p50, t_iops = fio("tcp-rand-read")
    print(f"(the same over the tcp fabric in this guest: p50 {t_p50:.1f} us, {t_iops:.0f} IOPS)")
spec = {
    "title": f"rmemfs over verbs against perftest, one rxe boot (TCG guest; fio {size} psync)",
    "series": ["rmemfs (fio)", "perftest"],
    "panels": [
        {"heading": "1 MiB: fio seq against ib_read_bw / ib_write_bw", "unit": "MiB/s",
         "groups": ["read", "write"], "values": [[r_bw, read_bw], [w_bw, write_bw]]},
        {"heading": "4 KiB read: fio rand-read p50 against ib_read_lat", "unit": "microseconds",
         "groups": ["latency"], "values": [[rr_p50, read_lat]]},
    ],
}
with open(os.path.join(out, "spec.json"), "w") as f:
    json.dump(spec, f, indent=1)
PY
draw_chart "$OUT/spec.json" "$OUT/chart.svg"
cleanup
