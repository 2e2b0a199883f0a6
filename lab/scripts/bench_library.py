#!/usr/bin/env python3
"""The library against a follower mount, from one Python process (lab/scripts/bench-library.sh
runs it; its figures and ratios in doc/BENCHMARKING.md):

    bench_library.py SERVERS NAME MNT FILE READS ROUNDS

FILE is in the volume (at /FILE) and in the mount (MNT/FILE). Each round, alternating the
order: READS random 4 KiB reads with os.pread through the mount (readahead off, the page
cache dropped first), with the library's pread, and with read_many 64 at a time; the whole
file read sequentially in 1 MiB reads both ways; a loader of 4 processes reading random
64 KiB samples, each its own volume (follow) or through the mount. Medians printed.
"""
import multiprocessing as mp
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import rmemfs  # noqa: E402

KIB4, MIB, SAMPLE, BATCH = 4096, 1 << 20, 64 << 10, 64


def drop_caches(path):
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def offsets(n, size, align, seed):
    rng = random.Random(seed)
    return [rng.randrange(size // align) * align for _ in range(n)]


def mount_preads(path, offs, length):
    """Seconds for os.pread of `length` at each of `offs` through the mount, readahead off."""
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    t = time.perf_counter()
    for o in offs:
        assert len(os.pread(fd, length, o)) == length
    dt = time.perf_counter() - t
    os.close(fd)
    return dt


def mount_random(path, offs):
    drop_caches(path)
    return len(offs) / mount_preads(path, offs, KIB4)


def lib_random(v, fh, offs):
    t = time.perf_counter()
    for o in offs:
        assert len(v.pread(fh, KIB4, o)) == KIB4
    return len(offs) / (time.perf_counter() - t)


def lib_many(v, fh, offs):
    bufs = [bytearray(KIB4) for _ in range(BATCH)]
    t = time.perf_counter()
    for i in range(0, len(offs), BATCH):
        part = offs[i:i + BATCH]
        got = v.read_many([(fh, o, KIB4) for o in part], into=bufs[:len(part)])
        assert all(g == KIB4 for g in got)
    return len(offs) / (time.perf_counter() - t)


def mount_seq(path, size):
    drop_caches(path)
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        n = 0
        while True:
            b = f.read(MIB)
            if not b:
                break
            n += len(b)
    assert n == size
    return size / (time.perf_counter() - t) / 1e6


def lib_seq(v, path, size):
    fh = v.open(path)
    t = time.perf_counter()
    n = 0
    while True:
        b = v.read(fh, MIB)
        if not b:
            break
        n += len(b)
    dt = time.perf_counter() - t
    v.close_file(fh)
    assert n == size
    return size / dt / 1e6


def loader_worker(args):
    kind, servers, name, path, size, seed, samples = args
    offs = offsets(samples, size, SAMPLE, seed)
    # Timed from the first read (a worker's volume is opened before: once per worker).
    if kind == "mount":
        dt = mount_preads(path, offs, SAMPLE)
    else:
        with rmemfs.open_volume(servers, name, mode="follow") as v:
            fh = v.open(path)
            t = time.perf_counter()
            for o in offs:
                assert len(v.pread(fh, SAMPLE, o)) == SAMPLE
            dt = time.perf_counter() - t
    return samples, dt


def loader(kind, servers, name, path, size, samples, procs=4):
    if kind == "mount":
        drop_caches(path)
    ctx = mp.get_context("spawn")  # each worker opens its own volume (no fork after open)
    with ctx.Pool(procs) as pool:
        done = pool.map(loader_worker, [(kind, servers, name, path, size, s, samples)
                                        for s in range(procs)])
    # All samples over the slowest worker's reading time.
    return sum(n for n, _ in done) / max(dt for _, dt in done)


def main():
    servers, name, mnt, fname, reads, rounds = sys.argv[1:7]
    reads, rounds = int(reads), int(rounds)
    mpath, vpath = os.path.join(mnt, fname), "/" + fname
    size = os.stat(mpath).st_size
    v = rmemfs.open_volume(servers, name, mode="follow")
    fh = v.open(vpath)
    figures = {}

    def add(k, x):
        figures.setdefault(k, []).append(x)
        print("   %-26s %.1f" % (k, x), file=sys.stderr)

    for r in range(rounds):
        offs = offsets(reads, size, KIB4, r)
        steps = [
            ("mount_pread_4k_per_s", lambda: mount_random(mpath, offs)),
            ("lib_pread_4k_per_s", lambda: lib_random(v, fh, offs)),
            ("lib_read_many64_4k_per_s", lambda: lib_many(v, fh, offs)),
            ("mount_seq_1m_mb_s", lambda: mount_seq(mpath, size)),
            ("lib_seq_1m_mb_s", lambda: lib_seq(v, vpath, size)),
            ("mount_loader4_samples_s", lambda: loader("mount", servers, name, mpath, size, 2000)),
            ("lib_loader4_samples_s", lambda: loader("lib", servers, name, vpath, size, 2000)),
        ]
        if r % 2:
            steps.reverse()
        print("== round %d of %d" % (r + 1, rounds), file=sys.stderr)
        for k, f in steps:
            add(k, f())
    med = {k: statistics.median(x) for k, x in figures.items()}
    print("| figure | through the mount | library | library / mount | #47's target |")
    print("| --- | --- | --- | --- | --- |")
    rows = [("4 KiB random reads per second, one at a time", "mount_pread_4k_per_s",
             "lib_pread_4k_per_s", ">= 1.2"),
            ("4 KiB random reads per second, read_many 64 at a time", "mount_pread_4k_per_s",
             "lib_read_many64_4k_per_s", ">= 4"),
            ("sequential 1 MiB reads (MB/s)", "mount_seq_1m_mb_s", "lib_seq_1m_mb_s", ">= 1.2"),
            ("loader, 4 processes, 64 KiB samples per second", "mount_loader4_samples_s",
             "lib_loader4_samples_s", "")]
    for label, a, b, target in rows:
        print("| %s | %.0f | %.0f | %.2f | %s |" % (label, med[a], med[b], med[b] / med[a], target))
    v.close_file(fh)
    v.close()


if __name__ == "__main__":
    main()
