#!/usr/bin/env python3
"""What volumes.sh's live export writes and checks (file i holds "i," repeated to 64 KiB):
  write MNT FINISHED STOP: writes f-1, f-2, ... into MNT, each number into FINISHED once its
    file is whole, until STOP exists;
  check MNT N: f-1 .. f-N in MNT hold their bytes.
"""
import os, sys


def content(i):
    return (b"%d," % i) * (65536 // len(b"%d," % i))


if sys.argv[1] == "write":
    mnt, finished, stop = sys.argv[2:5]
    i = 0
    with open(finished, "w") as log:
        while not os.path.exists(stop):
            i += 1
            with open(f"{mnt}/f-{i}", "wb") as f:
                f.write(content(i))
            log.write(f"{i}\n")
            log.flush()
    print(f"wrote {i} files without an error")
else:
    mnt, n = sys.argv[2], int(sys.argv[3])
    for i in range(1, n + 1):
        with open(f"{mnt}/f-{i}", "rb") as f:
            if f.read() != content(i):
                sys.exit(f"f-{i} differs in the copy")
