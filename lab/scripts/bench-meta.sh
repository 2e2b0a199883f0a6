#!/usr/bin/env bash
# Metadata-heavy work on rmemfs against tmpfs, in one run (#13 item 6 and its tar target);
# rmemfs through /dev/fuse and, where the kernel has it, again through FUSE over io_uring
# (`-o io_uring`, shown as rmemfs-ring; same memory server):
#   1. a source-like tree of TAR_FILES files (~175 MB for 10,000: sizes drawn from a fixed seed,
#      most a few KiB, a few of several MiB) extracted with `tar xf`, flushed with `sync -f`,
#      then removed with `rm -rf`; on rmemfs also the FUSE requests per extracted file, by
#      operation, from `rmemfs stats --json` before and after;
#   2. FILES files of 100 bytes created by one python process (10,000 per directory), the mount
#      daemon's resident memory with them, `ls -l` of one 10,000-entry directory and `cp -a` of
#      it inside the same file system;
#   3. the floor under steps 1's times: a FUSE round trip of a null file system
#      (`rmemfs-bench fuse-floor`, no rmemfs code) times the requests the kernel sent per
#      file (and the same through io_uring), beside the same round trip on rmemfs;
#   4. with BUILD=1 (the default; needs cargo and this repository's crates in ~/.cargo): a
#      debug `cargo build --offline` of this repository (git archive HEAD) with its source and
#      target directory inside the file system.
# Metadata is local to the daemon: only file contents cross the fabric.
#
#   lab/scripts/bench-meta.sh                       # 10,000-file tree, 100,000 small files
#   TAR_FILES=3000 FILES=20000 lab/scripts/bench-meta.sh
#
# Prints a line per step, then the table; OUT (default target/bench-meta) gets summary.json,
# chart.svg and the tree's tar. Needs root and /dev/fuse; one memory server started here (so the
# daemon's figure does not include the server's arena).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh
FILES=${FILES:-100000}
TAR_FILES=${TAR_FILES:-10000}
BUILD=${BUILD:-1}
OUT=${OUT:-target/bench-meta}
ensure_packages python3:python3 tar:tar bc:bc bindfs:bindfs
check_prereqs mount serve stats || exit 2
check_bench bars fuse-floor || exit 2
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT/summary.json" "$OUT/spec.json" "$OUT/chart.svg"
lib_init meta

tree_tar=$(tree_tar "$OUT" "$TAR_FILES")
tree_bytes=$(tar tvf "$tree_tar" | awk '{ s += $3 } END { print s }')

start_server 4G
mount_fs "$BASE/rmemfs" "$SERVER_ADDR" -o no_io_uring
# rmemfs again through FUSE over io_uring, where this kernel has it (same server).
targets=(tmpfs rmemfs)
if has_fuse_uring; then
  mount_fs "$BASE/rmemfs-ring" "$SERVER_ADDR" -o io_uring
  targets+=(rmemfs-ring)
fi
mkdir -p "$BASE/tmpfs"
mount -t tmpfs -o size=4G tmpfs "$BASE/tmpfs"
# The peer for the tree (#27): bindfs, a libfuse passthrough file system, over a tmpfs.
mkdir -p "$BASE/bindfs-src" "$BASE/bindfs"
mount -t tmpfs -o size=4G tmpfs "$BASE/bindfs-src"
bindfs "$BASE/bindfs-src" "$BASE/bindfs"

# seconds CMD...: how long CMD took; fails when CMD does (command substitution drops set -e,
# so callers check: `s=$(seconds ...) || exit 1`).
seconds() {
  local t0 t1
  t0=$(date +%s.%N)
  "$@" || return
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc
}

results=$BASE/results.tsv # target, measure, seconds
: >"$results"
record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$results"; echo "   $1 $2: $3 s" >&2; }
# timed TARGET MEASURE CMD...: records how long CMD took; a failed CMD ends the benchmark.
timed() {
  local target=$1 measure=$2 secs
  shift 2
  secs=$(seconds "$@") || { echo "$target: $measure failed: $*" >&2; exit 1; }
  record "$target" "$measure" "$secs"
}

for target in "${targets[@]}" bindfs; do
  dir=$BASE/$target
  echo "== $target: the $TAR_FILES-file tree ($((tree_bytes / 1000000)) MB)" >&2
  sync
  echo 3 >/proc/sys/vm/drop_caches
  cat "$tree_tar" >/dev/null # the tar itself from the page cache, for every target
  [ "$target" = rmemfs ] && "$BIN" stats --json "$dir" >"$BASE/before.json"
  timed "$target" "tar xf" timeout -k 10 600 tar xf "$tree_tar" -C "$dir"
  timed "$target" "sync" timeout -k 10 600 sync -f "$dir"
  [ "$target" = rmemfs ] && "$BIN" stats --json "$dir" >"$BASE/after.json"
  timed "$target" "rm -rf" timeout -k 10 600 find "$dir" -mindepth 1 -delete
  if [ "$target" = rmemfs ]; then "$BIN" stats --json "$dir" >"$BASE/removed.json"; fi
done
echo "== the FUSE round trip: a null file system (and through io_uring), and rmemfs" >&2
fuse_floor "$BASE/rmemfs" "$OUT/fuse-floor.txt"

for target in "${targets[@]}"; do
  dir=$BASE/$target
  echo "== $target: $FILES files of 100 bytes" >&2
  [ "$target" = rmemfs ] && base_kib=$(awk '/VmRSS/ { print $2 }' \
    "/proc/$(daemon_pids "$dir" | head -1)/status")
  timed "$target" "create $FILES files" python3 -c '
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
os.mkdir(d)
for i in range(n):
    sub = os.path.join(d, "d%03d" % (i // 10000))
    if i % 10000 == 0:
        os.mkdir(sub)
    with open(os.path.join(sub, "f%06d" % i), "w") as f:
        f.write("x" * 100)
' "$dir/many" "$FILES"
  [ "$target" = rmemfs ] && after_kib=$(awk '/VmRSS/ { print $2 }' \
    "/proc/$(daemon_pids "$dir" | head -1)/status")
  entries=$(find "$dir/many/d000" -mindepth 1 -maxdepth 1 | wc -l)
  sync
  echo 3 >/proc/sys/vm/drop_caches
  timed "$target" "ls -l $entries entries" sh -c 'ls -l "$1" >/dev/null' sh "$dir/many/d000"
  timed "$target" "cp -a $entries files" cp -a "$dir/many/d000" "$dir/copy"
done
if [ "$BUILD" = 1 ]; then
  if ! command -v cargo >/dev/null 2>&1; then
    echo "# no cargo: the build step is skipped" >&2
  else
    # rmemfs first: whatever the first build warms (the crates' sources in the page cache)
    # then helps tmpfs, so the comparison does not flatter rmemfs.
    for target in "${targets[@]:1}" tmpfs; do
      dir=$BASE/$target/build
      echo "== $target: cargo build (debug) of this repository" >&2
      mkdir -p "$dir"
      git archive HEAD | tar x -C "$dir"
      sync
      timed "$target" "cargo build" timeout -k 10 1800 env -u CARGO_TARGET_DIR \
        cargo build --offline --quiet --manifest-path "$dir/Cargo.toml"
      rm -rf "$dir"
    done
  fi
fi
unmount_fs "$BASE/rmemfs"
[ "${#targets[@]}" -gt 2 ] && unmount_fs "$BASE/rmemfs-ring"
umount "$BASE/tmpfs"
umount "$BASE/bindfs"
umount "$BASE/bindfs-src"

python3 - "$results" "$BASE/before.json" "$BASE/after.json" "$TAR_FILES" "$FILES" \
  "$base_kib" "$after_kib" "$OUT" "$BASE/removed.json" <<'PY'
import json, os, sys
results, before, after, tar_files, files, base_kib, after_kib, out, removed = sys.argv[1:10]
tar_files, files, base_kib, after_kib = int(tar_files), int(files), int(base_kib), int(after_kib)
rows = {}
measures = []
for line in open(results):
    target, measure, secs = line.rstrip("\n").split("\t")
    rows.setdefault(target, {})[measure] = float(secs)
    if measure not in measures:
        measures.append(measure)
targets = [t for t in ["tmpfs", "rmemfs", "rmemfs-ring"] if t in rows]
peer = rows.get("bindfs", {})
print(f"\n# metadata-heavy work, seconds (one run; tmpfs, and rmemfs with one memory server "
      f"through /dev/fuse and, as rmemfs-ring, through FUSE over io_uring)")
print(f"{'measure':<26}" + "".join(f"{t:>12}" for t in targets)
      + "".join(f"{t + '/tmpfs':>18}" for t in targets[1:]))
for m in measures:
    t = rows["tmpfs"][m]
    print(f"{m:<26}" + "".join(f"{rows[x][m]:>12.3f}" for x in targets)
          + "".join(f"{(rows[x][m] / t if t else 0):>17.1f}x" for x in targets[1:]))
if peer:
    print("\n# the tree against bindfs (a libfuse passthrough file system over tmpfs), seconds "
          "and rmemfs / bindfs")
    for m in [m for m in measures if m in peer]:
        print(f"{m:<26}{'bindfs':>8} {peer[m]:.3f}" + "".join(
            f"   {t} {rows[t][m]:.3f} ({rows[t][m] / peer[m]:.2f}x)"
            for t in targets[1:] if m in rows[t] and peer[m]))
req = lambda path: {op: v["count"] for op, v in json.load(open(path))["requests"].items()}
def per_file_of(b, a):
    return {op: (a[op] - b.get(op, 0)) / tar_files for op in a if a[op] - b.get(op, 0) > 0}
per_file = per_file_of(req(before), req(after))
per_file_rm = per_file_of(req(after), req(removed))
total, total_rm = sum(per_file.values()), sum(per_file_rm.values())
print(f"\n# FUSE requests per extracted file (tar xf and sync -f, {tar_files} files): {total:.2f}")
print("  " + ", ".join(f"{op} {n:.2f}" for op, n in sorted(per_file.items(), key=lambda x: -x[1])))
print(f"# and per removed file (rm -rf): {total_rm:.2f}")
print("  " + ", ".join(f"{op} {n:.2f}" for op, n in sorted(per_file_rm.items(), key=lambda x: -x[1])))
# The floor: every answered request (forgets are not) costs at least a FUSE round trip with
# no file-system code behind it: the null file system's mean (means, as the steps' times are
# sums). rmemfs's own round trip on the same request beside it.
floor_us = {key: v["mean_us"] for key, v in
            json.load(open(os.path.join(out, "fuse-floor.json")))["getxattr"].items()}
print(f"\n# the floor: one FUSE round trip (getxattr, mean) takes {floor_us['null']:.1f} us on a null "
      f"file system, {floor_us['rmemfs']:.1f} us on rmemfs"
      + (f", {floor_us['null_ring']:.1f} us on the null file system through io_uring"
         if "null_ring" in floor_us else ""))
floors = {}
for key, target in [("null", "rmemfs"), ("null_ring", "rmemfs-ring")]:
    if key not in floor_us or target not in rows:
        continue
    for m, ops in [("tar xf", per_file), ("rm -rf", per_file_rm)]:
        n = sum(v for op, v in ops.items() if op != "forget")
        floors[f"{target} {m}"] = n * tar_files * floor_us[key] / 1e6
        print(f"  {target} {m}: {n:.2f} answered requests x {tar_files} files x "
              f"{floor_us[key]:.1f} us = {floors[f'{target} {m}']:.2f} s before any work "
              f"(measured {rows[target][m]:.2f} s)")
per = (after_kib - base_kib) * 1024 // files
print(f"\n# mount daemon RSS: {base_kib // 1024} MiB at mount, {after_kib // 1024} MiB with {files} "
      f"files: {per} bytes per file (target: under 200 MiB + 1 KiB per file)")
summary = {"seconds": rows, "requests_per_tar_file": per_file,
           "requests_per_removed_file": per_file_rm, "fuse_round_trip_mean_us": floor_us,
           "fuse_floor_seconds": floors,
           "daemon_rss_kib": {"at_mount": base_kib, "with_files": after_kib},
           "tar_files": tar_files, "files": files}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=2)
spec = {"title": f"metadata-heavy work: a {tar_files}-file tree and {files} small files",
        "series": targets,
        "panels": [{"heading": "time per step (one run)", "unit": "seconds", "log": True,
                    "groups": measures,
                    "values": [[rows[t][m] for t in targets] for m in measures]}]}
json.dump(spec, open(os.path.join(out, "spec.json"), "w"), indent=1)
PY
draw_chart "$OUT/spec.json" "$OUT/chart.svg"
