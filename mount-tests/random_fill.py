#!/usr/bin/env python3
"""Random 4 KiB writes over 64 MiB of FILE, then its fsync (data.sh writeback_room).

Prints where the first error came ("write ENOSPC", "fsync ENOSPC"), or "none".
"""
import errno, os, random, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
rng = random.Random(7)
block = os.urandom(4096)
try:
    for _ in range(64 * 256 * 2):
        os.pwrite(fd, block, rng.randrange(64 * 256) * 4096)
except OSError as e:
    print("write", errno.errorcode[e.errno]); sys.exit(0)
try:
    os.fsync(fd)
except OSError as e:
    print("fsync", errno.errorcode[e.errno]); sys.exit(0)
print("none")
