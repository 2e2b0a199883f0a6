#!/usr/bin/env python3
"""A writer for the volume kill loop: creates, writes, appends, renames and unlinks files
under DIR, and after each fsync of a file and its directory records in MANIFEST (outside the
mount) what the path must hold from then on. Before each operation it records the path's
state before and after ("pending"), so a check after a crash knows the one operation that
may or may not have landed (its paths need only read without error). Runs until killed or until the mount fails.

    volume_writer.py write DIR MANIFEST SEED [MAX_BYTES]
    volume_writer.py check DIR MANIFEST       (prints "ok N" or the first mismatch; exit 1)
"""
import hashlib
import os
import random
import sys

ABSENT = "absent"
progress = 0  # the operation the writer is at (said when it stops)


def state_of(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return ABSENT
    return "%d:%s" % (len(data), hashlib.sha256(data).hexdigest())


def state_bytes(data):
    return "%d:%s" % (len(data), hashlib.sha256(data).hexdigest())


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# What the writer's live files hold at most (it unlinks once past it): it runs as long as
# its test does, and a test's pool must not fill with its files (a longer run is not a
# full pool).
MAX_BYTES = 128 << 20


def write(top, manifest, seed, max_bytes=MAX_BYTES):
    rng = random.Random(seed)
    raw = open(manifest, "a", buffering=1)

    class Log:
        """Writes manifest lines with paths relative to the mount (checked under any)."""

        @staticmethod
        def write(line):
            kind, path, rest = line.split(" ", 2)
            raw.write("%s %s %s" % (kind, os.path.relpath(path, top), rest))

    log = Log()
    known = {}  # path -> content, as last confirmed
    n = 0
    global progress
    sub = os.path.join(top, "d%d" % seed)
    os.makedirs(sub, exist_ok=True)
    fsync_path(top)
    fsync_path(sub)
    while True:
        n += 1
        progress = n
        op = rng.choice(["create", "create", "append", "rename", "unlink", "overwrite"])
        names = sorted(known)
        if op in ("append", "rename", "unlink", "overwrite") and not names:
            op = "create"
        elif names and sum(len(d) for d in known.values()) > max_bytes:
            op = "unlink"
        if op == "create":
            path = os.path.join(sub, "f%d" % n)
            data = rng.randbytes(rng.choice([0, 10, 4000, 70000, 1 << 20]))
            log.write("P %s %s %s\n" % (path, ABSENT, state_bytes(data)))
            with open(path, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            fsync_path(sub)
            known[path] = data
            log.write("C %s %s\n" % (path, state_bytes(data)))
        elif op in ("append", "overwrite"):
            path = rng.choice(names)
            old = known[path]
            extra = rng.randbytes(rng.randint(1, 3000))
            new = old + extra if op == "append" else extra + old[len(extra):]
            log.write("P %s %s %s\n" % (path, state_bytes(old), state_bytes(new)))
            with open(path, "ab" if op == "append" else "r+b") as f:
                f.write(extra)
                f.flush()
                os.fsync(f.fileno())
            known[path] = new
            log.write("C %s %s\n" % (path, state_bytes(new)))
        elif op == "rename":
            path = rng.choice(names)
            to = os.path.join(sub, "r%d" % n)
            data = known[path]
            log.write("P %s %s %s\n" % (path, state_bytes(data), ABSENT))
            log.write("P %s %s %s\n" % (to, ABSENT, state_bytes(data)))
            os.rename(path, to)
            fsync_path(sub)
            del known[path]
            known[to] = data
            log.write("C %s %s\n" % (path, ABSENT))
            log.write("C %s %s\n" % (to, state_bytes(data)))
        else:
            path = rng.choice(names)
            log.write("P %s %s %s\n" % (path, state_bytes(known[path]), ABSENT))
            os.unlink(path)
            fsync_path(sub)
            del known[path]
            log.write("C %s %s\n" % (path, ABSENT))


def check(top, manifest):
    confirmed = {}
    pending = {}
    for line in open(manifest):
        parts = line.split()
        if len(parts) < 3:
            continue  # a torn last line (the writer died writing it)
        if parts[0] == "P" and len(parts) == 4:
            pending[parts[1]] = (parts[2], parts[3])
        elif parts[0] == "C":
            confirmed[parts[1]] = parts[2]
            pending.pop(parts[1], None)
    checked = 0
    for rel, want in sorted(confirmed.items()):
        path = os.path.join(top, rel)
        got = state_of(path)
        if rel in pending:
            continue  # touched again by the operation in flight
        if got != want:
            print("MISMATCH %s: holds %s, fsynced state %s" % (rel, got, want))
            return 1
        checked += 1
    # The operation in flight when the daemon died may have landed in part (a file created
    # but not yet written): its paths must only read without error.
    for rel in pending:
        state_of(os.path.join(top, rel))
    print("ok %d" % checked)
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "write":
        try:
            limit = int(sys.argv[5]) if len(sys.argv) > 5 else MAX_BYTES
            write(sys.argv[2], sys.argv[3], int(sys.argv[4]), limit)
        except OSError as e:
            # The mount died under us (that is the point); which operation, and how, tells a
            # writer stopped by the kill from one stopped early by an error.
            print("volume_writer: stopped at operation %d: %s" % (progress, e), file=sys.stderr)
            sys.exit(0)
    else:
        sys.exit(check(sys.argv[2], sys.argv[3]))
