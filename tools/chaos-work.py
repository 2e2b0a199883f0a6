#!/usr/bin/env python3
"""The workload and the checks of tools/chaos.sh.

`writer`: one writer of the chaos run. It creates files of random bytes, overwrites ranges of
them, truncates them and punches holes in them, and counts an operation as acknowledged only
once its fsync() returned 0; it keeps the exact expected content of every file it owns. When
the run asks it to pause (a barrier: the file WORK/pause), it finishes its operation, writes
its manifest (name -> size and SHA-256 of the acknowledged content) and says so
(WORK/paused-W, naming the pause's generation); on resume it forgets the files the run found lost (WORK/lost).

`dump`: the placement of every file in the manifests (the xattr user.rmemfs.placement), taken
while the writers are paused, just before a kill.

`verify`: reads every file of the manifests back (after the caches were dropped) and checks
it: the acknowledged bytes exactly, or, only where the placement dump before the kills put
every copy of one of its chunks on the killed servers, EIO (never other bytes, never zeros).
Names the files found lost in WORK/lost.

`acks`: no operation may have been acknowledged while fewer servers than --min-replicas were
up: an acknowledged operation that began and ended inside such a window fails the run.

Writers draw their choices from a seeded generator (the run's seed and the writer's number),
so a run's sequence of operations can be replayed.
"""

import argparse
import ctypes
import errno
import hashlib
import json
import os
import random
import sys
import time

KIB = 1024
MIB = 1024 * KIB
# Files of 64 KiB to 2 MiB: one to three 1 MiB chunks, so a file spans servers.
FILE_UNIT = 64 * KIB
FILE_UNITS_MAX = 32
# Overwrites, truncates and punches go to a writer's newest files, so older files stay
# untouched for a while (as in most workloads) and a lost copy of theirs waits for the
# rebuild instead of being healed at once by the next write.
HOT_FILES = 4
# The mix once a writer has half its files: few new files (each makes the oldest go once
# a writer has its KEEP files), so a file lives for many seconds.
OPS = ["new"] + ["overwrite"] * 4 + ["truncate"] * 2 + ["punch"] * 2
# Overwrites and punches of up to 256 KiB: inside one chunk or across a chunk boundary.
RANGE_MAX = 256 * KIB
PLACEMENT_XATTR = "user.rmemfs.placement"
# The mount's chunk size (rmemfs's default, which tools/chaos.sh keeps).
CHUNK = MIB
# How often a paused writer looks for the end of the pause (a barrier, not a timer: the order
# is decided by the files, the poll only bounds the wake-up delay).
POLL = 0.02

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def punch(fd, off, length):
    if _libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def chunk_end(pos, size):
    """Where the chunk holding file offset `pos` ends, or the file's end if sooner."""
    return min(size, (pos // CHUNK + 1) * CHUNK)


def digest(data):
    return hashlib.sha256(data).hexdigest()


def write_json(path, value):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def read_lines(path):
    try:
        with open(path) as f:
            return [line.strip() for line in f if line.strip()]
    except FileNotFoundError:
        return []


class Writer:
    def __init__(self, args):
        self.dir = args.dir
        self.work = args.work
        self.id = args.id
        self.strict = args.strict
        self.keep = args.keep
        self.pace = args.pace
        self.rng = random.Random(f"{args.seed}-{args.id}")
        self.files = {}  # name -> bytearray: the acknowledged content
        self.n = 0
        self.counts = {}
        self.acks = open(os.path.join(self.work, f"acks-{self.id}"), "a", buffering=1)

    def path(self, name):
        return os.path.join(self.dir, name)

    def fail(self, what):
        with open(os.path.join(self.work, "errors"), "a") as f:
            f.write(f"writer {self.id}: {what}\n")
        sys.exit(1)

    def count(self, key):
        self.counts[key] = self.counts.get(key, 0) + 1

    def op(self):
        names = list(self.files)
        if len(names) < self.keep // 2 or not names:
            kind = "new"
        elif len(names) >= self.keep:
            kind = "delete"
        else:
            kind = self.rng.choice(OPS)
        if kind == "new":
            name = f"{self.id}-{self.n + 1}"
        elif kind == "delete":
            name = names[0]  # the oldest (names keep their creation order)
        else:
            name = self.rng.choice(names[-HOT_FILES:])
        data = self.files.get(name, bytearray())
        t0 = time.time()
        try:
            new = self.apply(kind, name, data)
        except OSError as e:
            self.refused(kind, name, e, t0)
            return
        if kind == "new":
            self.n += 1
        if new is None:
            self.files.pop(name, None)
        else:
            self.files[name] = new
        self.count(kind)
        self.acks.write(f"{t0:.3f} {time.time():.3f} {kind} {name} {self.detail}\n")

    def apply(self, kind, name, data):
        """Does one operation; returns the file's content once acknowledged (None: removed)."""
        path = self.path(name)
        self.detail = f"size={len(data)}"
        if kind == "delete":
            os.unlink(path)
            return None
        if kind == "new":
            data = bytearray(self.rng.randbytes(self.rng.randint(1, FILE_UNITS_MAX) * FILE_UNIT))
            fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            return data
        data = bytearray(data)
        fd = os.open(path, os.O_WRONLY)
        try:
            if kind == "overwrite":
                off = self.rng.randrange(len(data) + 1)
                piece = self.rng.randbytes(self.rng.randint(1, RANGE_MAX))
                self.detail += f" off={off} len={len(piece)}"
                if os.pwrite(fd, piece, off) != len(piece):
                    raise OSError(errno.EIO, "short write")
                if off + len(piece) > len(data):
                    data.extend(bytes(off + len(piece) - len(data)))
                data[off:off + len(piece)] = piece
            elif kind == "truncate":
                size = self.rng.randrange(len(data) * 3 // 2 + 2)
                # Whether the tail the daemon zeroes (to the end of the chunk cut) held data.
                self.detail += f" live={int(any(data[size:chunk_end(size, len(data))]))}"
                os.ftruncate(fd, size)
                self.detail += f" to={size}"
                data = data[:size] + bytearray(max(0, size - len(data)))
            elif kind == "punch":
                off = self.rng.randrange(len(data) + 1)
                length = self.rng.randint(1, RANGE_MAX)
                end = min(len(data), off + length)
                # Whether the parts zeroed in the chunks cut at either end held data.
                live_start = any(data[off:min(end, chunk_end(off, end))])
                live_end = any(data[max(off, end // CHUNK * CHUNK):end])
                self.detail += f" live={int(live_start)}{int(live_end)}"
                punch(fd, off, length)
                self.detail += f" off={off} len={length}"
                if end > off:
                    data[off:end] = bytes(end - off)
            os.fsync(fd)
        finally:
            os.close(fd)
        return data

    def refused(self, kind, name, e, t0):
        """An operation that failed: the run fails when no failure is allowed; otherwise the
        file's content is no longer known, so it leaves the manifest (and is removed)."""
        if self.strict:
            self.fail(f"{kind} {name} failed: {e}")
        self.count(f"refused-{kind}")
        with open(os.path.join(self.work, f"refused-{self.id}"), "a") as f:
            f.write(f"{t0:.3f} {time.time():.3f} {kind} {name} {e.strerror}\n")
        self.files.pop(name, None)
        try:
            os.unlink(self.path(name))
        except OSError:
            pass  # a file that cannot be removed now is not in the manifest, and is ignored

    def write_manifest(self):
        manifest = {n: [len(d), digest(d)] for n, d in self.files.items()}
        write_json(os.path.join(self.work, f"manifest-{self.id}.json"),
                   {"files": manifest, "counts": self.counts})

    def pause(self, generation):
        """Pause `generation` of the run: the manifest, then WORK/paused-W naming the
        generation, then a wait until that pause is over (removed, or a new one)."""
        self.write_manifest()
        write_json(os.path.join(self.work, f"paused-{self.id}"), generation)
        while pause_generation(self.work) == generation:
            time.sleep(POLL)
        for name in read_lines(os.path.join(self.work, "lost")):
            self.files.pop(name, None)

    def run(self):
        stop = os.path.join(self.work, "stop")
        done = None
        while not os.path.exists(stop):
            generation = pause_generation(self.work)
            if generation is not None and generation != done:
                self.pause(generation)
                done = generation
                continue
            self.op()
            time.sleep(self.pace)
        self.write_manifest()


def pause_generation(work):
    """The generation of the pause the run asks for (WORK/pause), or None."""
    try:
        with open(os.path.join(work, "pause")) as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def manifests(work):
    out = {}
    for entry in sorted(os.listdir(work)):
        if entry.startswith("manifest-") and entry.endswith(".json"):
            with open(os.path.join(work, entry)) as f:
                out.update(json.load(f)["files"])
    return out


def cmd_dump(args):
    dump = {}
    for name in manifests(args.work):
        raw = os.getxattr(os.path.join(args.dir, name), PLACEMENT_XATTR)
        dump[name] = json.loads(raw)
    write_json(args.out, dump)
    print(f"{len(dump)} files, {sum(len(p) for p in dump.values())} chunks")


def at_risk(placement, killed):
    """Chunks whose every copy is on a killed server."""
    return [idx for idx, copies in placement if copies and all(c in killed for c in copies)]


def cmd_verify(args):
    files = manifests(args.work)
    killed = set(filter(None, args.killed.split(",")))
    dump = {}
    if args.dump:
        with open(args.dump) as f:
            dump = json.load(f)
    ok = lost = 0
    predicted = 0
    problems = []
    lost_names = []
    for name, (size, want) in sorted(files.items()):
        path = os.path.join(args.dir, name)
        risky = at_risk(dump.get(name, []), killed) if killed else []
        predicted += bool(risky)
        try:
            with open(path, "rb") as f:
                got = f.read()
        except OSError as e:
            if e.errno == errno.EIO and risky:
                lost += 1
                lost_names.append(name)
                continue
            problems.append(f"{name}: {e.strerror} (every chunk had a copy on a live server)"
                            if e.errno == errno.EIO else f"{name}: {e}")
            continue
        if len(got) != size or digest(got) != want:
            zeros = got.count(0) == len(got)
            problems.append(f"{name}: {len(got)} bytes read, {size} acknowledged"
                            f"{', all zeros' if zeros else ''}: content differs")
            continue
        if risky and args.expect_lost:
            # Readable although its chunk's every copy was on a killed server when the dump
            # was taken: only if a copy was made since (rebuild or heal) on a live server.
            now = dict((i, c) for i, c in json.loads(os.getxattr(path, PLACEMENT_XATTR)))
            if any(not set(now.get(i, [])) - killed for i in risky):
                problems.append(f"{name}: read back although chunks {risky} have no copy off "
                                f"the killed servers")
                continue
        ok += 1
    if args.lost_out:
        with open(args.lost_out, "a") as f:
            for name in lost_names:
                f.write(name + "\n")
    print(f"{len(files)} files: {ok} read back exactly, {lost} lost as predicted "
          f"({predicted} at risk by the placement dump)")
    for p in problems[:20]:
        print(f"  PROBLEM {p}", file=sys.stderr)
    sys.exit(1 if problems else 0)


def stores_bytes(kind, detail):
    """Whether an acknowledged operation stored bytes on the servers (so needs the minimum
    of copies), from its detail (size=, to=, off=, len=): a new file or an overwrite does;
    a truncate does when it cuts a chunk (its tail is zeroed); a punch when it cuts into a
    chunk's data (that part is zeroed). Removing a file, growing one (the new bytes are a
    hole) or dropping whole chunks stores none. A cut whose zeroed part held no data (live=,
    from the acknowledged content before the operation) is not counted: the daemon may hold
    no chunk there (a hole left by growing the file) and store nothing, and zeros written over
    zeros lose nothing."""
    f = dict(kv.split("=") for kv in detail)
    live = f.pop("live", "11")
    f = {k: int(v) for k, v in f.items()}
    if kind in ("new", "overwrite"):
        return True
    if kind == "truncate":
        return f["to"] < f["size"] and f["to"] % CHUNK != 0 and live[0] == "1"
    if kind == "punch":
        start, end = f["off"], min(f["off"] + f["len"], f["size"])
        cut_has_data = {start: live[0] == "1", end: live[-1] == "1"}
        partial = [p for p in (start, end)
                   if p % CHUNK != 0 and start < end and cut_has_data[p]]
        # A cut at `end` that reaches the file's end takes the chunk's whole data.
        return any(p == start or end < f["size"] for p in partial)
    return False


def cmd_acks(args):
    windows = []
    for line in read_lines(args.windows):
        a, b = line.split()[:2]
        windows.append((float(a), float(b)))
    bad = []
    for entry in sorted(os.listdir(args.work)):
        if entry.startswith("acks-"):
            for line in read_lines(os.path.join(args.work, entry)):
                t0, t1, kind, name, *detail = line.split()
                if not stores_bytes(kind, detail):
                    continue
                for a, b in windows:
                    if a <= float(t0) and float(t1) <= b:
                        bad.append(f"{line} (inside {a}..{b})")
    for b in bad[:20]:
        print(f"  PROBLEM {b}", file=sys.stderr)
    print(f"{len(windows)} windows below the minimum copies: {len(bad)} operations that "
          f"stored bytes acknowledged inside them")
    sys.exit(1 if bad else 0)


def cmd_counts(args):
    total = {}
    for entry in sorted(os.listdir(args.work)):
        if entry.startswith("manifest-") and entry.endswith(".json"):
            with open(os.path.join(args.work, entry)) as f:
                for k, v in json.load(f)["counts"].items():
                    total[k] = total.get(k, 0) + v
    print(" ".join(f"{k} {v}" for k, v in sorted(total.items())))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("writer")
    w.add_argument("--dir", required=True)
    w.add_argument("--work", required=True)
    w.add_argument("--id", required=True)
    w.add_argument("--seed", required=True)
    w.add_argument("--keep", type=int, default=24)
    w.add_argument("--pace", type=float, default=0.05,
                   help="seconds between operations (leaves the servers and the mount CPU)")
    w.add_argument("--strict", action="store_true", help="any failed operation fails the run")
    d = sub.add_parser("dump")
    d.add_argument("--dir", required=True)
    d.add_argument("--work", required=True)
    d.add_argument("--out", required=True)
    v = sub.add_parser("verify")
    v.add_argument("--dir", required=True)
    v.add_argument("--work", required=True)
    v.add_argument("--killed", default="", help="addresses of the killed servers")
    v.add_argument("--dump", help="the placement dump taken before the kill")
    v.add_argument("--expect-lost", action="store_true",
                   help="the killed servers are still down: chunks at risk must be gone")
    v.add_argument("--lost-out", help="append the names of lost files here")
    a = sub.add_parser("acks")
    a.add_argument("--work", required=True)
    a.add_argument("--windows", required=True)
    c = sub.add_parser("counts")
    c.add_argument("--work", required=True)
    args = p.parse_args()
    if args.cmd == "writer":
        Writer(args).run()
    else:
        {"dump": cmd_dump, "verify": cmd_verify, "acks": cmd_acks, "counts": cmd_counts}[
            args.cmd](args)


if __name__ == "__main__":
    main()
