#!/usr/bin/env python3
"""The library's Python package against real servers, beside real mounts (mount-tests
library):

    library_check.py hold SERVERS NAME SRC       copies the files of SRC into the volume as
                                                 its holder (fsynced), then closes it
    library_check.py follow SERVERS NAME SRC     as a follower: every file of SRC reads back
                                                 the same with read and with read_many; a
                                                 write is refused (EROFS); a forked child's
                                                 call fails with EBADF
    library_check.py killed SERVERS NAME MANIFEST ROUND  a holder (making the volume in round
                                                 1) writing files and fsyncing each,
                                                 recording it in MANIFEST, until killed
    library_check.py manifest MNT MANIFEST       every file MANIFEST records is in MNT whole
"""
import errno
import hashlib
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import rmemfs  # noqa: E402


def files_of(src):
    return sorted(f for f in os.listdir(src) if os.path.isfile(os.path.join(src, f)))


def hold(servers, name, src):
    with rmemfs.open_volume(servers, name, mode="hold", create=True) as v:
        v.mkdir("/lib")
        for f in files_of(src):
            data = open(os.path.join(src, f), "rb").read()
            fh = v.open("/lib/" + f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            for at in range(0, len(data), 1 << 20):
                v.write(fh, data[at:at + (1 << 20)])
            v.fsync(fh)
            v.close_file(fh)
    print("held: wrote %d files" % len(files_of(src)))


def follow(servers, name, src):
    v = rmemfs.open_volume(servers, name, mode="follow")
    names = v.listdir("/lib")
    assert sorted(names) == files_of(src), (sorted(names), files_of(src))
    reads = 0
    for f in files_of(src):
        want = open(os.path.join(src, f), "rb").read()
        assert v.stat("/lib/" + f).st_size == len(want), f
        fh = v.open("/lib/" + f)
        got = v.read(fh, len(want) + 10)
        assert got == want, "read of %s differs" % f
        rng = random.Random(f)
        ranges = [(fh, rng.randrange(max(1, len(want))), rng.choice([1, 4096, 70000]))
                  for _ in range(64)]
        for (_, off, n), blob in zip(ranges, v.read_many(ranges)):
            assert blob == want[off:off + n], "read_many of %d at %d in %s" % (n, off, f)
            reads += 1
        v.close_file(fh)
    try:
        v.open("/lib/new", os.O_WRONLY | os.O_CREAT)
        raise AssertionError("a follower wrote")
    except OSError as e:
        assert e.errno == errno.EROFS, e
    try:
        v.stat("/lib/nothing")
        raise AssertionError("stat of a missing file")
    except FileNotFoundError:
        pass
    pid = os.fork()
    if pid == 0:
        try:
            v.listdir("/lib")
            os._exit(1)
        except OSError as e:
            os._exit(0 if e.errno == errno.EBADF and "fork" in str(e) else 2)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0, "a forked child's call: exit %d" % os.WEXITSTATUS(status)
    assert v.listdir("/lib"), "the parent goes on after a fork"
    v.close()
    print("followed: %d files and %d read_many ranges read back; writes refused; fork refused"
          % (len(files_of(src)), reads))


def killed(servers, name, manifest, round_):
    v = rmemfs.open_volume(servers, name, mode="hold", create=round_ == "1")
    v.mkdir("/k" + round_)
    log = open(manifest, "a", buffering=1)
    rng = random.Random(round_)
    n = 0
    while True:
        n += 1
        data = rng.randbytes(rng.choice([10, 5000, 300000, 1 << 20]))
        path = "/k%s/f%d" % (round_, n)
        fh = v.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        v.write(fh, data)
        v.fsync(fh)
        v.close_file(fh)
        log.write("%s %d %s\n" % (path, len(data), hashlib.sha256(data).hexdigest()))


def check_manifest(mnt, manifest):
    n = 0
    for line in open(manifest):
        parts = line.split()
        if len(parts) != 3:
            continue  # a torn last line
        path, size, digest = parts[0], int(parts[1]), parts[2]
        data = open(mnt + path, "rb").read()
        assert len(data) == size and hashlib.sha256(data).hexdigest() == digest, path
        n += 1
    assert n > 0, "the killed holder fsynced nothing"
    print("every fsynced file whole: %d" % n)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "hold":
        hold(*sys.argv[2:5])
    elif cmd == "follow":
        follow(*sys.argv[2:5])
    elif cmd == "killed":
        killed(*sys.argv[2:6])
    else:
        check_manifest(*sys.argv[2:4])
