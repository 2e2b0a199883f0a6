#!/usr/bin/env bash
# Volumes (#29's speed targets) beside the same work without a volume, in one run, over two
# memory servers (two copies of every chunk, two journal copies):
#   1. `tar xf` of the TAR_FILES-file tree (bench-meta's), `sync -f`, and `rm -rf`;
#   2. FSYNCS times: create an empty file, then fsync it and its directory (a metadata-only
#      barrier): the pair's p50 and p99 against `rmemfs-bench fabric`'s 4 KiB WRITE p50;
#   3. SQLITE_TXNS small sqlite transactions (default rollback journal);
#   4. `git add` and `git commit` of GIT_FILES files;
#   5. ATTACH_FILES empty files made on each mount, with the longest metadata operation of
#      the run (`stats`' max_us), then attach of the volume after its daemon was killed
#      (SIGKILL): the time `rmemfs mount --volume` takes (checkpoint plus replay);
#   6. `rmemfs volume export` of a volume holding EXPORT_MB MiB to a directory on tmpfs, then
#      again (nothing changed: only the namespace is written);
#   7. with BUILD=1 (the default; needs cargo and this repository's crates in ~/.cargo): a
#      debug `cargo build --offline` of this repository (git archive HEAD), sources and
#      target directory on each mount (the volume's first, so a warm page cache cannot
#      flatter it).
#
#   lab/scripts/bench-volume.sh
#   TAR_FILES=3000 ATTACH_FILES=20000 lab/scripts/bench-volume.sh
#
# Prints a line per step, then the table with ratios (volume / private). Needs root,
# /dev/fuse and the lab (`cargo build --release --workspace`).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh
TAR_FILES=${TAR_FILES:-10000}
FSYNCS=${FSYNCS:-1000}
SQLITE_TXNS=${SQLITE_TXNS:-1000}
GIT_FILES=${GIT_FILES:-1000}
ATTACH_FILES=${ATTACH_FILES:-100000}
EXPORT_MB=${EXPORT_MB:-2048}
BUILD=${BUILD:-1}
# Each of the two servers: room for the export volume and the many-files run in two copies.
SERVER_SIZE=${SERVER_SIZE:-4G}
OUT=${OUT:-target/bench-volume}
ensure_packages python3:python3 tar:tar sqlite3:sqlite3 git:git
check_prereqs mount serve stats || exit 2
check_bench fabric || exit 2
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
lib_init volume
tree=$(tree_tar "$OUT" "$TAR_FILES")

echo "== the fabric: 4 KiB WRITE at depth 1" >&2
timeout -k 10 600 "$BENCH_BIN" fabric --rmemfs "$BIN" --sizes 4K --depths 1 --bytes 16M \
  --clients 1 >"$OUT/fabric.txt"

start_server "$SERVER_SIZE"
a=$SERVER_ADDR
start_server "$SERVER_SIZE"
addrs=$a,$SERVER_ADDR
mount_fs "$BASE/private" "$addrs"
mount_fs "$BASE/volume" "$addrs" --volume bench --create

results=$OUT/results.tsv
: >"$results"
record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$results"; echo "   $1 $2: $3" >&2; }
secs() { python3 -c 'import sys,time; t=time.monotonic(); import subprocess; subprocess.run(sys.argv[1:], check=True); print("%.3f" % (time.monotonic()-t))' "$@"; }

for t in private volume; do
  m=$BASE/$t
  echo "== $t: tar xf, sync, rm -rf" >&2
  mkdir -p "$m/tree"
  record "$t" tar_xf "$(secs tar xf "$tree" -C "$m/tree")"
  record "$t" sync "$(secs sync -f "$m/tree")"
  record "$t" rm_rf "$(secs rm -rf "$m/tree")"
  echo "== $t: $FSYNCS fsyncs of a new empty file and its directory" >&2
  python3 - "$m" "$FSYNCS" >"$OUT/$t-fsync.txt" <<'PY'
import os, sys, time
top, n = sys.argv[1], int(sys.argv[2])
d = os.path.join(top, "fsync")
os.makedirs(d, exist_ok=True)
dfd = os.open(d, os.O_RDONLY)
lat = []
for i in range(n):
    fd = os.open(os.path.join(d, "f%d" % i), os.O_CREAT | os.O_WRONLY, 0o644)
    t = time.perf_counter()
    os.fsync(fd)
    os.fsync(dfd)
    lat.append((time.perf_counter() - t) * 1e6)
    os.close(fd)
lat.sort()
print("%.1f %.1f" % (lat[len(lat) // 2], lat[len(lat) * 99 // 100]))
PY
  read -r p50 p99 <"$OUT/$t-fsync.txt"
  record "$t" fsync_p50_us "$p50"
  record "$t" fsync_p99_us "$p99"
  echo "== $t: $SQLITE_TXNS sqlite transactions" >&2
  record "$t" sqlite "$(secs python3 -c '
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
c.execute("create table t (k integer primary key, v text)")
c.commit()
for i in range(int(sys.argv[2])):
    c.execute("insert into t (v) values (?)", ("x" * 100,))
    c.commit()
' "$m/db.sqlite" "$SQLITE_TXNS")"
  echo "== $t: git add and commit of $GIT_FILES files" >&2
  mkdir -p "$m/repo"
  python3 -c '
import os, sys
for i in range(int(sys.argv[2])):
    with open(os.path.join(sys.argv[1], "f%04d.txt" % i), "w") as f:
        f.write("line %d\n" % i * 20)
' "$m/repo" "$GIT_FILES"
  git -C "$m/repo" init -q
  record "$t" git_commit "$(secs sh -c 'cd "$1" && git add -A && git -c user.name=b -c user.email=b@b commit -qm bench' _ "$m/repo")"
done

echo "== $ATTACH_FILES empty files on each mount, then attach of the volume after kill -9" >&2
for t in private volume; do
  python3 -c '
import os, sys
top, n = sys.argv[1], int(sys.argv[2])
for d in range(0, n, 10000):
    p = os.path.join(top, "many", "d%03d" % (d // 10000))
    os.makedirs(p, exist_ok=True)
    for i in range(d, min(n, d + 10000)):
        open(os.path.join(p, "f%d" % i), "w").close()
fd = os.open(os.path.join(top, "many"), os.O_RDONLY)
os.fsync(fd)
' "$BASE/$t" "$ATTACH_FILES"
  # The longest metadata operation of the whole run (the journal's checkpoints on a volume).
  "$BIN" stats --json "$BASE/$t" >"$OUT/$t-stats.json"
  record "$t" op_max_ms "$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["requests"]; print("%.1f" % (max(v.get("max_us",0) for k,v in r.items() if k in ("create","mknod","mkdir","write","setattr","release","lookup","getattr")) / 1000))' "$OUT/$t-stats.json")"
done
record volume checkpoints "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["journal"]["checkpoints"])' "$OUT/volume-stats.json")"
kill -9 "$(daemon_pids "$BASE/volume")"
wait_daemon_gone "$BASE/volume" 20
# The kernel ends the dead daemon's connection once its io_uring queues are cancelled, which
# can finish a while after the process (seconds after a long build on the mount): attach
# once the mount point says so (ENOTCONN), as a user's script would.
for ((k = 0; k < 150; k++)); do
  gone=$(timeout -k 2 5 stat "$BASE/volume" 2>&1 || true)
  grep -q "Transport endpoint is not connected" <<<"$gone" && break
  sleep 0.2
done
record volume attach_s "$(secs "$BIN" mount "$BASE/volume" --servers "$addrs" --volume bench)"
found=$(find "$BASE/volume/many" -type f | wc -l)
[ "$found" -eq "$ATTACH_FILES" ] || { echo "attach found $found of $ATTACH_FILES files" >&2; exit 1; }

echo "== export of a volume of $EXPORT_MB MiB to tmpfs" >&2
mount_fs "$BASE/export-src" "$addrs" --volume exported --create
for ((i = 0; i < EXPORT_MB / 256; i++)); do
  dd if=/dev/urandom of="$BASE/export-src/f$i" bs=1M count=256 status=none
done
unmount_fs "$BASE/export-src"
mkdir -p "$BASE/export-dst"
mount -t tmpfs -o size=$((EXPORT_MB + 512))M tmpfs "$BASE/export-dst"
"$BIN" volume export exported "$BASE/export-dst/x" --servers "$addrs" >"$OUT/export-1.txt" \
  2>>"$BASE/logs/export.log"
"$BIN" volume export exported "$BASE/export-dst/x" --servers "$addrs" >"$OUT/export-2.txt" \
  2>>"$BASE/logs/export.log"
mbs() { grep -o '[0-9]* MB/s' "$1" | cut -d' ' -f1; }
record volume export_mb_s "$(mbs "$OUT/export-1.txt")"
record volume export_again_s "$(grep -o 'in [0-9.]* s' "$OUT/export-2.txt" | cut -d' ' -f2)"
umount "$BASE/export-dst"

# Last: the kill -9 and attach above once found the volume's mount still live when a build
# had run on it just before (not reproduced by hand); here nothing follows the build.
if [ "$BUILD" = 1 ] && command -v cargo >/dev/null 2>&1; then
  for t in volume private; do
    dir=$BASE/$t/build
    echo "== $t: cargo build (debug) of this repository" >&2
    mkdir -p "$dir"
    git archive HEAD | tar x -C "$dir"
    sync -f "$dir"
    record "$t" cargo_build "$(secs timeout -k 10 1800 env -u CARGO_TARGET_DIR cargo build \
      --offline --quiet --manifest-path "$dir/Cargo.toml")"
    rm -rf "$dir"
  done
elif [ "$BUILD" = 1 ]; then
  echo "# no cargo: the build step is skipped" >&2
fi


python3 - "$results" "$OUT/fabric.txt" "$TAR_FILES" "$ATTACH_FILES" <<'PY'
import sys
rows, fabric, tar_files, attach_files = sys.argv[1:5]
r = {}
for line in open(rows):
    t, k, v = line.rstrip("\n").split("\t")
    r[(t, k)] = float(v)
write_p50 = None
for line in open(fabric):
    if line.startswith("fabric WRITE 4KiB"):
        write_p50 = float(line[len("fabric WRITE 4KiB"):].split()[0])
print("\n# volumes against private mounts (two servers, two copies), one run")
print(f"{'':<34}{'private':>12}{'volume':>12}{'ratio':>8}")
for k, what in [("tar_xf", f"tar xf, {tar_files} files (s)"), ("sync", "sync -f (s)"),
                ("rm_rf", "rm -rf (s)"), ("fsync_p50_us", "fsync file+dir p50 (us)"),
                ("fsync_p99_us", "fsync file+dir p99 (us)"),
                ("sqlite", "sqlite transactions (s)"), ("git_commit", "git add+commit (s)"),
                ("cargo_build", "cargo build, debug (s)")]:
    if ("volume", k) not in r:
        continue
    p, v = r[("private", k)], r[("volume", k)]
    print(f"{what:<34}{p:>12.3f}{v:>12.3f}{(v / p if p else float('inf')):>8.2f}")
print(f"{f'attach after kill -9, {attach_files} files (s)':<34}{'':>12}{r[('volume', 'attach_s')]:>12.3f}")
p, v = r[("private", "op_max_ms")], r[("volume", "op_max_ms")]
print(f"{'longest metadata op (ms)':<34}{p:>12.1f}{v:>12.1f}{v / p:>8.2f}"
      f"   (the volume wrote {int(r[('volume', 'checkpoints')])} checkpoints)")
print(f"{'export to tmpfs (MB/s)':<34}{'':>12}{r[('volume', 'export_mb_s')]:>12.0f}")
print(f"{'export again, nothing changed (s)':<34}{'':>12}{r[('volume', 'export_again_s')]:>12.3f}")
if write_p50:
    print(f"\n# fsync p50 {r[('volume', 'fsync_p50_us')]:.1f} us against the fabric's 4 KiB WRITE "
          f"p50 {write_p50:.1f} us: {r[('volume', 'fsync_p50_us')] / write_p50:.2f}x (target 2x)")
PY
