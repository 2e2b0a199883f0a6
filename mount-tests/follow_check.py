#!/usr/bin/env python3
"""Checks a volume's followers against its holder (mount-tests/hosts.sh volume_followers).

  follow_check.py visible WRITER READER N BOUND
      Writes and fsyncs N small files on the holder's mount, one at a time, and times how
      long each takes to appear, whole, on the follower's mount. Prints the median and the
      maximum; fails if one takes longer than BOUND seconds.
  follow_check.py overwrite WRITER READER BOUND
      A file the follower holds open and has read (its pages cached) is overwritten in place
      and fsynced on the holder: the open handle must read the new bytes within BOUND seconds
      (the follower invalidated its cached pages), and only old or new bytes meanwhile.
"""
import os
import statistics
import sys
import time


def write_fsync(path, data):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_or_none(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def visible(writer, reader, n, bound):
    os.makedirs(os.path.join(writer, "visible"), exist_ok=True)
    took = []
    for i in range(n):
        name = os.path.join("visible", f"f{i:04d}")
        data = (f"file {i} " * 50).encode()
        write_fsync(os.path.join(writer, name), data)
        t0 = time.monotonic()
        while True:
            got = read_or_none(os.path.join(reader, name))
            if got == data:
                break
            if got is not None and len(got) > 0 and not data.startswith(got):
                sys.exit(f"{name} on the follower holds bytes the holder never wrote")
            if time.monotonic() - t0 > bound:
                sys.exit(f"{name} not seen whole on the follower within {bound} s")
            time.sleep(0.002)
        took.append(time.monotonic() - t0)
    print(
        f"visible on the follower after the holder's fsync, {n} files: median "
        f"{statistics.median(took) * 1000:.0f} ms, max {max(took) * 1000:.0f} ms"
    )


def overwrite(writer, reader, bound):
    name = "overwritten"
    old, new = b"A" * 65536, b"B" * 65536
    write_fsync(os.path.join(writer, name), old)
    t0 = time.monotonic()
    while read_or_none(os.path.join(reader, name)) != old:
        if time.monotonic() - t0 > bound:
            sys.exit("the first version never reached the follower")
        time.sleep(0.005)
    # One handle kept open on the follower: its pages stay in the page cache (an open
    # without FOPEN_KEEP_CACHE would drop them) until the follower invalidates them.
    rfd = os.open(os.path.join(reader, name), os.O_RDONLY)
    try:
        assert os.pread(rfd, len(old), 0) == old
        fd = os.open(os.path.join(writer, name), os.O_WRONLY)
        try:
            os.pwrite(fd, new, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        t0 = time.monotonic()
        while True:
            got = os.pread(rfd, len(new), 0)
            if got == new:
                break
            # A mix may be read while the holder's in-place write lands (documented), but
            # every byte is the old or the new one.
            if len(got) != len(new) or set(got) - {ord("A"), ord("B")}:
                sys.exit(f"the follower read {len(got)} bytes that are neither version")
            if time.monotonic() - t0 > bound:
                sys.exit(f"the follower still reads its cached old bytes {bound} s after the fsync")
            time.sleep(0.005)
    finally:
        os.close(rfd)
    print(f"the overwrite reached the follower's open handle in {(time.monotonic() - t0) * 1000:.0f} ms")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "visible":
        visible(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
    elif cmd == "overwrite":
        overwrite(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        sys.exit(__doc__)
