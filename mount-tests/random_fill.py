#!/usr/bin/env python3
"""Random 4 KiB writes over SPAN MiB of FILE (each block 1.5 times on average), then its fsync
(data.sh writeback_room): `random_fill.py FILE SPAN_MIB`.

Prints where the first error came ("write ENOSPC", "fsync ENOSPC"), or "none".
"""
import errno, os, random, sys
path, span_mib = sys.argv[1], int(sys.argv[2])
blocks = span_mib * 256
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
rng = random.Random(7)
block = os.urandom(4096)
try:
    for _ in range(blocks * 3 // 2):
        os.pwrite(fd, block, rng.randrange(blocks) * 4096)
except OSError as e:
    print("write", errno.errorcode[e.errno]); sys.exit(0)
try:
    os.fsync(fd)
except OSError as e:
    print("fsync", errno.errorcode[e.errno]); sys.exit(0)
print("none")
