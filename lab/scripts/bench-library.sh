#!/usr/bin/env bash
# The library (#47) against a follower mount, in one run on loopback: two memory servers, a
# holder mount writes SIZE of random bytes to one file and unmounts; then a follower mount and
# the library (Python, follow mode) read it, ROUNDS alternating rounds (medians), READS random
# 4 KiB reads each way (one at a time through the mount and the library, and read_many 64 at a
# time), the whole file sequentially, and a 4-process loader of 64 KiB samples. Then the
# checkpoint check: a Python holder writes CKPT of files through the library, and a follower
# mount reads them back identical (time and MB/s printed).
#
#   SIZE=1G READS=10000 ROUNDS=3 lab/scripts/bench-library.sh
#
# Needs root and /dev/fuse; builds nothing (cargo build --release -p rmemfs -p rmemfs-c first).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh

SIZE=${SIZE:-1G}
READS=${READS:-10000}
ROUNDS=${ROUNDS:-3}
CKPT=${CKPT:-1G}
check_prereqs mount serve || exit 2
SO=$(dirname "$BIN")/librmemfs_c.so
[ -f "$SO" ] || { echo "error: $SO missing: cargo build --release -p rmemfs-c" >&2; exit 2; }
export RMEMFS_LIB=$SO
size_bytes=$(numfmt --from=iec "$SIZE")
ckpt_bytes=$(numfmt --from=iec "$CKPT")
server_size=$(((size_bytes + ckpt_bytes) * 2 / 2 / 1048576 * 3 / 2 + 256))M
lib_init benchlib
ADDRS=""
for _ in 1 2; do
  start_server "$server_size" >/dev/null
  ADDRS+=${ADDRS:+,}$SERVER_ADDR
done
mnt=$BASE/mnt
mkdir -p "$mnt"
mount_fs "$mnt" "$ADDRS" --volume blib --create
head -c "$size_bytes" /dev/urandom >"$mnt/data"
sync -f "$mnt/data"
unmount_fs "$mnt"
mount_fs "$mnt" "$ADDRS" --volume blib --read-only
echo "== $SIZE file, $READS random reads, $ROUNDS rounds (alternating), two servers on loopback" >&2
python3 lab/scripts/bench_library.py "$ADDRS" blib "$mnt" data "$READS" "$ROUNDS"
unmount_fs "$mnt"
# Checkpoints: a program holding the volume writes them; a follower mount reads them back.
python3 - "$ADDRS" blib "$ckpt_bytes" "$BASE/ckpt.sha" <<'PY'
import hashlib, os, sys, time
sys.path.insert(0, "python")
import rmemfs
servers, name, total, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
piece = os.urandom(1 << 20)
with rmemfs.open_volume(servers, name, mode="hold") as v:
    v.mkdir("/ckpt")
    t = time.perf_counter()
    sums = []
    for i in range(max(1, total // (256 << 20))):
        fh = v.open("/ckpt/step%d" % i, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        h = hashlib.sha256()
        for j in range(min(total, 256 << 20) >> 20):
            block = bytes([i, j & 255]) + piece[2:]
            v.write(fh, block)
            h.update(block)
        v.fsync(fh)
        v.close_file(fh)
        sums.append("%s  step%d" % (h.hexdigest(), i))
    dt = time.perf_counter() - t
open(out, "w").write("\n".join(sums) + "\n")
print("checkpoints: %d MiB written through the library (hold) in %.2f s: %.0f MB/s"
      % (total >> 20, dt, total / dt / 1e6))
PY
mount_fs "$mnt" "$ADDRS" --volume blib --read-only
(cd "$mnt/ckpt" && sha256sum -c --quiet "$BASE/ckpt.sha") && echo "checkpoints: read back identical through a follower mount"
unmount_fs "$mnt"
