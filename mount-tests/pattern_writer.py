#!/usr/bin/env python3
"""Writers for the write-behind kill loop (volumes.sh volume_crash_behind): files whose every
8-byte word names the file and the word's place, so a byte found anywhere tells whose it is.

    pattern_writer.py write DIR MANIFEST ROUND WRITERS
        WRITERS threads create files r{ROUND}-{writer}-{i} in DIR and append to each in
        pieces of 8 bytes to 64 KiB (most never fsynced); one file in four is fsynced with
        DIR, and its name and fsynced size go into MANIFEST (outside the mount); one in five
        of a writer's earlier files is unlinked again (its name struck from MANIFEST first),
        so later files get memory that held other files' bytes. Runs until killed or until
        the mount fails.
    pattern_writer.py check DIR MANIFEST
        Every fsynced file holds its fsynced bytes, and every word of every file in DIR is
        its own or zero (bytes the kernel's writeback cache had not sent): never another
        file's, never anything else. Prints "ok: N files, M fsynced" or the first mismatch.
"""
import os
import random
import struct
import sys
import threading

PIECE_MAX_WORDS = 8192  # 64 KiB
FILES_PER_WRITER = 4096  # a file's id (24 bits): round (8), writer (4), file (12)


def file_id(name):
    r, w, i = name[1:].split("-")
    return (int(r) << 16) | (int(w) << 12) | int(i)


def pattern(fid, offset, length):
    """Word k of the file is (fid << 40) + k + 1: never zero, and it names its file."""
    first = (fid << 40) + offset // 8 + 1
    return struct.pack("<%dQ" % (length // 8), *range(first, first + length // 8))


def write(d, manifest, rnd, writers):
    assert rnd < 256 and writers <= 16
    lock = threading.Lock()
    dfd = os.open(d, os.O_RDONLY)

    def log(line):
        with lock, open(manifest, "a") as m:
            m.write(line + "\n")
            m.flush()
            os.fsync(m.fileno())

    def one(w):
        rng = random.Random((rnd << 8) | w)
        made = []
        try:
            for i in range(FILES_PER_WRITER):
                name = "r%d-%d-%d" % (rnd, w, i)
                fid = file_id(name)
                fd = os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                size = 0
                for _ in range(rng.randint(1, 4)):
                    n = 8 * rng.randint(1, PIECE_MAX_WORDS)
                    os.write(fd, pattern(fid, size, n))
                    size += n
                if rng.randrange(4) == 0:
                    os.fsync(fd)
                    os.fsync(dfd)
                    log("+ %s %d" % (name, size))
                os.close(fd)
                made.append(name)
                if i > 0 and rng.randrange(5) == 0:
                    victim = made.pop(rng.randrange(len(made) - 1))
                    log("- %s" % victim)
                    os.unlink(os.path.join(d, victim))
        except OSError:
            return  # the daemon was killed

    threads = [threading.Thread(target=one, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def check(d, manifest):
    fsynced = {}
    with open(manifest) as m:
        for line in m:
            parts = line.split()
            if parts[0] == "+":
                fsynced[parts[1]] = int(parts[2])
            else:
                fsynced.pop(parts[1], None)
    names = [n for n in os.listdir(d) if n.startswith("r")]
    for name in names:
        fid = file_id(name)
        with open(os.path.join(d, name), "rb") as f:
            data = f.read()
        for w in range(len(data) // 8):
            got = data[8 * w:8 * w + 8]
            if got != b"\0" * 8 and got != pattern(fid, 8 * w, 8):
                owner = struct.unpack("<Q", got)[0]
                sys.exit("%s: word %d of %d holds %#x (file %#x's?), neither its own nor zero"
                         % (name, w, len(data) // 8, owner, owner >> 40))
    for name, n in fsynced.items():
        if name not in names:
            sys.exit("%s was fsynced with %d bytes and is gone" % (name, n))
        with open(os.path.join(d, name), "rb") as f:
            data = f.read(n)
        if data != pattern(file_id(name), 0, n):
            sys.exit("%s: its %d fsynced bytes differ" % (name, n))
    print("ok: %d files, %d fsynced" % (len(names), len(fsynced)))


if sys.argv[1] == "write":
    write(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
else:
    check(sys.argv[2], sys.argv[3])
