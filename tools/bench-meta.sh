#!/usr/bin/env bash
# Metadata at scale: the mount daemon's resident memory with many files, and the time of
# `ls -l` on a 10,000-entry directory and `cp -a` of a 10,000-file tree. Metadata is local to
# the daemon, so none of these makes a round trip to a memory server per file (only file
# contents move over the fabric).
#
#   tools/bench-meta.sh            # 100,000 files
#   FILES=20000 tools/bench-meta.sh
#
# Needs root and /dev/fuse; uses one memory server started here (so the daemon's figure does
# not include the server's arena).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=mount-tests/lib.sh
. mount-tests/lib.sh
FILES=${FILES:-100000}
check_prereqs mount serve || exit 2
lib_init meta
start_server 2G
mount_fs "$BASE/mnt" "$SERVER_ADDR"
PID=$(daemon_pids "$BASE/mnt" | head -1)
rss() { awk '/VmRSS/ {print $2}' "/proc/$PID/status"; }
base_kib=$(rss)
start=$(date +%s.%N)
python3 - "$BASE/mnt/many" "$FILES" <<'PY'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
os.mkdir(d)
for i in range(n):
    sub = os.path.join(d, "d%03d" % (i // 10000))
    if i % 10000 == 0:
        os.mkdir(sub)
    with open(os.path.join(sub, "f%06d" % i), "w") as f:
        f.write("x" * 100)
PY
created=$(echo "$(date +%s.%N) - $start" | bc)
after_kib=$(rss)
per_file=$(( (after_kib - base_kib) * 1024 / FILES ))
echo "files created: $FILES in ${created}s"
echo "daemon RSS: $((base_kib / 1024)) MiB at mount, $((after_kib / 1024)) MiB with $FILES files: $per_file bytes per file"
echo "target: under 200 MiB + 1 KiB/file = $(( 200 + FILES / 1024 )) MiB"
t0=$(date +%s.%N); n=$(ls -l "$BASE/mnt/many/d000" | wc -l); t1=$(date +%s.%N)
echo "ls -l of a directory of $((n - 1)) entries: $(echo "$t1 - $t0" | bc)s"
t0=$(date +%s.%N); cp -a "$BASE/mnt/many/d000" "$BASE/mnt/copy"; t1=$(date +%s.%N)
echo "cp -a of a $((n - 1))-file tree inside the mount: $(echo "$t1 - $t0" | bc)s"
