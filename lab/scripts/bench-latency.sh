#!/usr/bin/env bash
# Where a 4 KiB random read's time goes (#13 item 7), in one run:
#   1. plain TCP 4 KiB request/response and the fabric's own 4 KiB READ at depth 1
#      (`rmemfs-bench fabric`): the loopback round trip and its thread wake-ups;
#   2. fio 4 KiB random reads (lab/fio/rand-read.fio: psync, one job, every block from the
#      file system) on the in-process mount (FUSE and rmemfs's code, no network) and on a tcp
#      mount of one memory server, each through /dev/fuse and through FUSE over io_uring
#      (`-o io_uring`, where the kernel has it; on tcp the ring also with `--busy-poll`), each
#      time with the daemon's own figures from
#      `rmemfs stats --json`: the read handler's time (from FUSE's request to the reply) and
#      the fabric batches inside it (post to last completion).
#   3. the FUSE round trip with no file-system code (`rmemfs-bench fuse-floor`, a null file
#      system) beside the same request on the tcp mount, and the null file system's 4 KiB
#      read that misses the page cache: with the fabric's READ, the floor under the target.
# The split, per read, from means: FUSE and the kernel = fio's completion latency - the
# handler; rmemfs's code = the handler - its fabric batches; the fabric batch against the
# fabric's bare READ and plain TCP. Prints a table and draws OUT/chart.svg (default OUT
# target/bench-latency).
#
#   lab/scripts/bench-latency.sh
#   SIZE=256M RUNTIME=8 lab/scripts/bench-latency.sh
#
# Needs root and /dev/fuse; installs fio when missing (Debian).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh

SIZE=${SIZE:-256M}
RUNTIME=${RUNTIME:-8}
OUT=${OUT:-target/bench-latency}
ensure_packages fio:fio python3:python3
check_prereqs mount serve stats || exit 2
check_bench bars fabric mount fuse-floor || exit 2
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/*.json "$OUT"/*.txt "$OUT/chart.svg"
lib_init bench-latency

echo "== the fabric and plain TCP, 4 KiB at depth 1" >&2
timeout -k 10 600 "$BENCH_BIN" fabric --rmemfs "$BIN" --sizes 4K --depths 1 --bytes 16M \
  --clients 1 >"$OUT/fabric.txt"

# fio_with_stats NAME DIR: fio rand-read on DIR, the daemon's stats before and after.
fio_with_stats() {
  local name=$1 dir=$2
  echo "== fio 4 KiB random reads: $name" >&2
  "$BIN" stats --json "$dir" >"$OUT/$name-before.json"
  DIR=$dir BS=4k SIZE=$SIZE RUNTIME=$RUNTIME timeout -k 10 $((RUNTIME + 600)) \
    fio --output-format=json --output="$OUT/$name-fio.json" lab/fio/rand-read.fio >/dev/null
  "$BIN" stats --json "$dir" >"$OUT/$name-after.json"
  timeout -k 10 120 rm -f "$dir"/rand-read.*
}

# Room for the fio file and the mount's own use, as the tcp server below.
size_bytes=$(numfmt --from=iec "$SIZE")
room="$((size_bytes / 1048576 + 256))M"
# The transports: /dev/fuse, and FUSE over io_uring where this kernel has it; on tcp also the
# ring with the fabric's bounded busy-poll (--busy-poll: the handler spins for its completion
# instead of sleeping on the ring thread's CPU).
transports=(dev)
if has_fuse_uring; then transports+=(uring); fi
tcp_transports=("${transports[@]}")
if has_fuse_uring; then tcp_transports+=(uring-poll); fi
opts_of() {
  case $1 in
    dev) echo "-o no_io_uring" ;;
    uring) echo "-o io_uring" ;;
    uring-poll) echo "-o io_uring --busy-poll" ;;
  esac
}
for tr in "${transports[@]}"; do
  # shellcheck disable=SC2046 # the options are words
  mount_inproc "$BASE/mnt-$tr" "$room" $(opts_of "$tr") || exit 1
  fio_with_stats "inproc-$tr" "$BASE/mnt-$tr"
  unmount_inproc "$BASE/mnt-$tr"
done

start_server "$room"
for tr in "${tcp_transports[@]}"; do
  # shellcheck disable=SC2046
  mount_fs "$BASE/mnt-tcp-$tr" "$SERVER_ADDR" $(opts_of "$tr")
  fio_with_stats "tcp-$tr" "$BASE/mnt-tcp-$tr"
  if [ "$tr" = dev ]; then
    echo "== the FUSE round trip: a null file system, and rmemfs" >&2
    fuse_floor "$BASE/mnt-tcp-$tr" "$OUT/fuse-floor.txt"
  fi
  unmount_fs "$BASE/mnt-tcp-$tr"
done

python3 - "$OUT" "$SIZE" <<'PY'
import json, os, re, sys
sys.path.insert(0, "lab/scripts")
from fio_result import fio_side  # noqa: E402
out, size = sys.argv[1:3]

def fabric_p50(what):
    for line in open(os.path.join(out, "fabric.txt")):
        if line.startswith(what):
            return float(line[len(what):].split()[0])
    raise SystemExit(f"no '{what}' line in fabric.txt")

tcp_p50 = fabric_p50("plain TCP req/resp 4KiB")
read_p50 = fabric_p50("fabric READ 4KiB")

def run(name):
    read = fio_side(os.path.join(out, f"{name}-fio.json"), rw="read")
    before, after = (json.load(open(os.path.join(out, f"{name}-{w}.json"))) for w in ("before", "after"))

    def delta_mean(section, op):
        b = before.get(section, {}).get(op, {"count": 0, "total_ns": 0})
        a = after.get(section, {}).get(op, {"count": 0, "total_ns": 0})
        n = a["count"] - b["count"]
        total_us = (a["total_ns"] - b["total_ns"]) / 1e3
        return n, (total_us / n if n else 0.0)

    reads, handler = delta_mean("requests", "read")
    batches, batch = delta_mean("fabric_batches", "read")
    # Batches per read request (readahead may gather several blocks into one request).
    per_read = batches / reads if reads else 0.0
    return {"iops": read["iops"], "p50_us": read["p50_us"],
            "mean_us": read["mean_us"], "reads": reads, "handler_us": handler,
            "batch_us": batch, "batches_per_read": per_read}

names = [n for n in ["inproc-dev", "inproc-uring", "tcp-dev", "tcp-uring", "tcp-uring-poll"]
         if os.path.exists(os.path.join(out, f"{n}-fio.json"))]
label = {"inproc-dev": "in-process", "inproc-uring": "in-proc ring",
         "tcp-dev": "tcp", "tcp-uring": "tcp ring", "tcp-uring-poll": "ring, polled"}
r = {n: run(n) for n in names}
print(f"\n# a 4 KiB random read (fio psync, {size}, one job), microseconds; means unless p50")
print("# (ring: FUSE over io_uring, -o io_uring; polled: with --busy-poll; tcp: one memory server)")
print(f"{'':<34}" + "".join(f"{label[n]:>14}" for n in names))
for key, what in [("p50_us", "fio completion p50"), ("mean_us", "fio completion mean"),
                  ("iops", "IOPS")]:
    print(f"{what:<34}" + "".join(f"{r[n][key]:>14.1f}" for n in names))
split = {}
for name, x in r.items():
    fabric = x["batch_us"] * x["batches_per_read"]
    split[name] = {"fuse_kernel": x["mean_us"] - x["handler_us"],
                   "rmemfs_code": x["handler_us"] - fabric, "fabric": fabric}
for key, what in [("fuse_kernel", "FUSE and kernel (fio - handler)"),
                  ("rmemfs_code", "rmemfs's code (handler - fabric)"),
                  ("fabric", "fabric batches in the handler")]:
    print(f"{what:<34}" + "".join(f"{split[n][key]:>14.1f}" for n in names))
print(f"{'read requests':<34}" + "".join(f"{r[n]['reads']:>14}" for n in names))
print(f"\n# the fabric alone (rmemfs-bench fabric, depth 1, p50): READ 4 KiB {read_p50:.1f} us; "
      f"plain TCP request/response 4 KiB {tcp_p50:.1f} us")
for n in [n for n in names if n.startswith("tcp")]:
    ratio = r[n]["p50_us"] / read_p50
    print(f"# target: fio p50 <= 1.2x the fabric's READ p50: {label[n]}: "
          f"{r[n]['p50_us']:.1f} / {read_p50:.1f} = {ratio:.2f}x")
# The floor: a read is at least one FUSE read that misses the page cache (of a null file
# system: no file-system code) and one fabric READ, one after the other.
fuse = json.load(open(os.path.join(out, "fuse-floor.json")))
for key, what in [("null", "/dev/fuse"), ("null_ring", "io_uring")]:
    if key in fuse["read_4k"]:
        p50 = fuse["read_4k"][key]["p50_us"]
        floor = p50 + read_p50
        print(f"# the floor through {what}: a null FUSE file system's 4 KiB read that misses the "
              f"page cache (p50 {p50:.1f} us) + the fabric's READ = {floor:.1f} us = "
              f"{floor / read_p50:.2f}x the fabric's READ")
json.dump({"runs": r, "split_us": split, "fabric_read_p50_us": read_p50,
           "plain_tcp_p50_us": tcp_p50, "fuse_floor_us": fuse},
          open(os.path.join(out, "summary.json"), "w"), indent=2)
groups = ["FUSE and kernel", "rmemfs's code", "fabric batch"]
keys = ["fuse_kernel", "rmemfs_code", "fabric"]
spec = {"title": f"where a 4 KiB random read's time goes (fio psync, {size}; means)",
        "series": [label[n] for n in names],
        "panels": [
            {"heading": "per read, from the daemon's own timing", "unit": "microseconds",
             "groups": groups,
             "values": [[max(split[n][k], 0) for n in names] for k in keys]},
            {"heading": "whole read (fio p50) against the bare fabric (READ p50)",
             "unit": "microseconds",
             "groups": ["fio p50", "fabric READ p50"],
             "values": [[r[n]["p50_us"] for n in names], [read_p50 if n.startswith("tcp") else 0 for n in names]]},
        ]}
json.dump(spec, open(os.path.join(out, "spec.json"), "w"), indent=1)
PY
draw_chart "$OUT/spec.json" "$OUT/chart.svg"
