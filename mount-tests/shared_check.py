#!/usr/bin/env python3
"""Checks many writers of one shared volume (`mount --meta`) on two mounts (run.sh volume_shared_check).

  shared_check.py locks A B
      Locks exclude across clients: a flock and an fcntl write lock taken on A refuse B's
      (EWOULDBLOCK, and F_GETLK on B names A's lock), a read lock on each is shared, an
      fcntl lock goes with any close by its process, and a blocked flock on B is granted
      once A lets go.
  shared_check.py reopen A B GATE
      A flock is its open file's: a process opens a file on A, flocks it and closes it while
      A's daemon holds that file's RELEASE back (GATE exists: the testing build's
      RMEMFS_TESTING_FLOCK_RELEASE_GATE), then opens the file again (on one CPU, so the
      kernel's lock owner, the address of its open file, is most likely the closed one's):
      a non-blocking flock is refused while the old file's lock is not let go; GATE removed,
      a blocking one is granted, and B cannot take the lock while it is held.
  shared_check.py interrupt A B PID_B
      While A holds a flock and an fcntl lock of a file, a process on B blocked in flock is
      killed (SIGKILL) and one blocked in fcntl(F_SETLKW) gets a signal whose handler raises:
      each ends at once (the kernel's INTERRUPT ends the daemon's wait: EINTR), neither took
      the lock, and once A lets go B takes both. PID_B (B's daemon) is the barrier: its
      thread named lock-wait shows the request is waiting there.
  shared_check.py waiters A B PID_B K
      2K processes on B, all on one CPU, wait in flock for a file B's own process (on that
      CPU too) holds, K started one at a time, then K at once: every one reaches B's daemon,
      and that process's next requests on B (a create, a write, its close) still end
      (with FUSE over io_uring, requests go to the queue of the caller's CPU, and each
      waiting lock holds one of its entries: the daemon adds entries rather than let the
      waits take them all, and each added entry makes a request of its own on that CPU, so
      the kernel hands out requests it queued before the entry came), and once it lets go
      every waiter takes the lock in turn.
  shared_check.py c2o A B ROUNDS
      Close-to-open: a file written and closed on one mount, opened on the other, reads every
      byte (sizes from 0 to 3 MiB, growing and shrinking, alternating sides).
  shared_check.py sustain A B SECS
      A file written on A is opened on B and unlinked on A: its name goes on both mounts,
      and for SECS seconds B writes random spans through its handle and reads the whole file
      back from the servers (its cached pages dropped first): every byte as written.
  shared_check.py writers DIR SECS MANIFEST
      Writes files into DIR for SECS seconds (random sizes below 16 KiB, a pause of 20 ms
      after each, so three writers stay within small servers; each fsynced and closed); each
      one the file system acknowledged (every call succeeded) is added to MANIFEST (outside
      the mounts) with its digest; failures (EIO while the engine is away) are counted.
  shared_check.py verify MANIFEST MOUNT... -- DIR
      Every file of MANIFEST (written under DIR of the first mount) reads back with its digest
      on every mount, and DIR lists the same names on every mount.
  shared_check.py model A B WORKERS OPS SEED
      WORKERS processes, alternately on A and B, each change a tree of their own and, under a
      flock of shared/.lock, a shared directory (creates, renames over names, unlinks, appends).
      Under the lock each reads the shared log of the operations so far (close-to-open: it was
      written and closed by whoever held the lock before), replays it into a model, picks an
      operation the model says is valid, checks that the file system agrees (every operation
      must succeed, every file it reads must hold the model's bytes), and appends it to the log.
      At the end both mounts must show each tree and the shared directory as the models say.
  shared_check.py storm A B N
      Four processes, two per mount, create N files each in one directory and remove them,
      with no lock: every call succeeds (none hangs: each client's poller applies the others'
      names there and tells its kernel while the others' creations hold the directory), and
      the directory ends empty on both mounts.
  shared_check.py freeze A B PID_A TTL
      A process on A holds a flock on shared file f; A's daemon (PID_A) is frozen (SIGSTOP)
      past the session timeout TTL: a blocked flock on B is granted after at least TTL, B
      writes; A's daemon is resumed (SIGCONT): the process on A fails to write, and the file
      holds only B's bytes, on both mounts.
"""
import errno
import fcntl
import multiprocessing
import os
import queue
import random
import signal
import struct
import subprocess
import sys
import time


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def write_file(path, data, flags=os.O_WRONLY | os.O_CREAT | os.O_TRUNC):
    fd = os.open(path, flags, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def eventually(what, check, bound=5.0):
    """Polls `check` until it returns None (no difference) or `bound` seconds pass (an
    error of the file system meanwhile, as a name listed just before another client removed
    it, counts as a difference)."""
    deadline = time.monotonic() + bound
    while True:
        try:
            diff = check()
        except OSError as e:
            diff = f"{e}"
        if diff is None:
            return
        if time.monotonic() > deadline:
            fail(f"{what}: {diff}")
        time.sleep(0.05)


def blocked_flock(path):
    """Whether a non-blocking exclusive flock of `path` is refused."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def check_locks(a, b):
    fa, fb = f"{a}/locked", f"{b}/locked"
    write_file(fa, b"x" * 100)
    eventually("B sees the file", lambda: None if os.path.exists(fb) else "not there")
    # flock: exclusive across clients, shared read locks.
    ha = os.open(fa, os.O_RDWR)
    fcntl.flock(ha, fcntl.LOCK_EX)
    if not blocked_flock(fb):
        fail("B took a flock that A holds")
    fcntl.flock(ha, fcntl.LOCK_UN)
    hb = os.open(fb, os.O_RDONLY)
    fcntl.flock(ha, fcntl.LOCK_SH)
    fcntl.flock(hb, fcntl.LOCK_SH | fcntl.LOCK_NB)
    # Its flock goes with its last close, which the kernel tells the daemon after close()
    # returns (FUSE's RELEASE is asynchronous): A's try succeeds within a bound.
    os.close(hb)

    def upgrade():
        try:
            fcntl.flock(ha, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return None
        except BlockingIOError:
            return "B's shared flock outlived its close"
    eventually("A's exclusive flock after B closed", upgrade)
    # fcntl locks: a write lock over bytes 10..19 on A excludes B there, not beside it.
    fcntl.flock(ha, fcntl.LOCK_UN)
    fcntl.lockf(ha, fcntl.LOCK_EX, 10, 10)
    hb = os.open(fb, os.O_RDWR)
    try:
        fcntl.lockf(hb, fcntl.LOCK_EX | fcntl.LOCK_NB, 5, 10)
        fail("B took an fcntl lock over A's bytes")
    except OSError as e:
        if e.errno not in (errno.EAGAIN, errno.EACCES):
            raise
    fcntl.lockf(hb, fcntl.LOCK_EX | fcntl.LOCK_NB, 5, 20)
    fcntl.lockf(hb, fcntl.LOCK_UN, 5, 20)
    # F_GETLK on B names A's lock: its type and range.
    q = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 100, 0)
    got = struct.unpack("hhqqi", fcntl.fcntl(hb, fcntl.F_GETLK, q))
    if got[0] != fcntl.F_WRLCK or got[2] != 10 or got[3] != 10:
        fail(f"F_GETLK on B answered {got}, not A's write lock over 10..19")
    # Any close by A's process drops its fcntl locks (POSIX), even of another descriptor.
    os.close(os.open(fa, os.O_RDONLY))
    fcntl.lockf(hb, fcntl.LOCK_EX | fcntl.LOCK_NB, 0, 100)
    fcntl.lockf(hb, fcntl.LOCK_UN, 0, 100)
    os.close(hb)
    # A blocked flock on B is granted once A lets go.
    fcntl.flock(ha, fcntl.LOCK_EX)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        fd = os.open(fb, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(w, b"g")
        os._exit(0)
    os.close(w)
    # A barrier, not a timing guess: the child is still blocked while A holds the lock.
    os.set_blocking(r, False)
    time.sleep(0.5)
    try:
        early = os.read(r, 1)
    except BlockingIOError:
        early = b""
    if early:
        fail("B's blocked flock was granted while A held it")
    os.set_blocking(r, True)
    t = time.monotonic()
    fcntl.flock(ha, fcntl.LOCK_UN)
    if os.read(r, 1) != b"g":
        fail("B's blocked flock never ended")
    os.waitpid(child, 0)
    os.close(ha)
    print(f"locks: exclusive across mounts; a blocked flock granted "
          f"{(time.monotonic() - t) * 1000:.0f} ms after the release")


def check_reopen(a, b, gate):
    fa, fb = f"{a}/reopened", f"{b}/reopened"
    write_file(fa, b"")
    eventually("B sees the file", lambda: None if os.path.exists(fb) else "not there")
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    write_file(gate, b"")
    try:
        old = os.open(fa, os.O_RDWR)
        fcntl.flock(old, fcntl.LOCK_EX)
        os.close(old)  # its RELEASE waits at the gate
        fd = os.open(fa, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fail("a flock of a file opened again was granted while the closed file's lock "
                 "was not let go yet (it counted as the closed file's own)")
        except BlockingIOError:
            pass
    finally:
        os.unlink(gate)
    fcntl.flock(fd, fcntl.LOCK_EX)
    if not blocked_flock(fb):
        fail("B took the flock of a file opened again on A while A holds it")
    os.close(fd)
    eventually("B takes the lock once A let go",
               lambda: "still refused" if blocked_flock(fb) else None)
    print("reopen: a flock taken by a file opened again waited for the closed file's "
          "release, and held against B")


def lock_waits(pid):
    """How many lock requests daemon `pid` is waiting on (its threads named lock-wait)."""
    n = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/comm") as f:
                n += f.read().strip() == "lock-wait"
        except OSError:
            pass
    return n


def until_waits(pid, n, what):
    deadline = time.monotonic() + 10
    while lock_waits(pid) != n:
        if time.monotonic() > deadline:
            fail(what)
        time.sleep(0.01)


def exited_within(child, bound):
    """The child's wait status once it ended, or None if it still runs after `bound` s."""
    deadline = time.monotonic() + bound
    while True:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)


def check_interrupt(a, b, pid_b):
    fa, fb = f"{a}/interrupted", f"{b}/interrupted"
    write_file(fa, b"i" * 10)
    eventually("B sees the file", lambda: None if os.path.exists(fb) else "not there")
    ha = os.open(fa, os.O_RDWR)
    fcntl.flock(ha, fcntl.LOCK_EX)
    fcntl.lockf(ha, fcntl.LOCK_EX)
    until_waits(pid_b, 0, "B's daemon waits on a lock before the test")
    # A blocking flock on B, killed while it waits.
    child = os.fork()
    if child == 0:
        # Not A's open file: its flock would stay held as long as this child lives.
        os.close(ha)
        fd = os.open(fb, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os._exit(3)
    until_waits(pid_b, 1, "B's blocked flock never reached its daemon")
    t = time.monotonic()
    os.kill(child, signal.SIGKILL)
    if exited_within(child, 10) is None:
        os.close(ha)
        fail("a process killed while its flock waited on B still runs 10 s later "
             "(its daemon's wait was not ended)")
    killed_ms = (time.monotonic() - t) * 1000
    until_waits(pid_b, 0, "the killed request's wait outlived it in B's daemon")
    # A blocking fcntl lock on B, and a signal whose handler raises.
    child = os.fork()
    if child == 0:
        def on_signal(_sig, _frame):
            raise InterruptedError()
        signal.signal(signal.SIGUSR1, on_signal)
        os.close(ha)
        fd = os.open(fb, os.O_RDWR)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)
            os._exit(3)
        except InterruptedError:
            os._exit(0)
    until_waits(pid_b, 1, "B's blocked fcntl lock never reached its daemon")
    t = time.monotonic()
    os.kill(child, signal.SIGUSR1)
    status = exited_within(child, 10)
    if status is None:
        os.close(ha)
        fail("a process signalled while its fcntl lock waited on B still waits 10 s later")
    if os.waitstatus_to_exitcode(status) != 0:
        fail(f"the signalled fcntl lock on B ended with {os.waitstatus_to_exitcode(status)} "
             "(3: granted while A held it)")
    signalled_ms = (time.monotonic() - t) * 1000
    until_waits(pid_b, 0, "the signalled request's wait outlived it in B's daemon")
    # Neither left a lock behind: once A lets go, B takes both.
    fcntl.lockf(ha, fcntl.LOCK_UN)
    fcntl.flock(ha, fcntl.LOCK_UN)
    hb = os.open(fb, os.O_RDWR)

    def take_both():
        try:
            fcntl.flock(hb, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.lockf(hb, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return None
        except OSError as e:
            return f"B cannot lock after A let go: {e}"
    eventually("B's locks after A let go", take_both)
    os.close(hb)
    os.close(ha)
    print(f"interrupt: a killed flock wait ended in {killed_ms:.0f} ms, a signalled fcntl "
          f"wait in {signalled_ms:.0f} ms (EINTR); no lock left behind")


def waits_within(pid, n, bound):
    """Whether at least `n` lock requests wait in daemon `pid` within `bound` seconds."""
    deadline = time.monotonic() + bound
    while lock_waits(pid) < n:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def fail_off_cpu(cpu, children, msg):
    """Fails, leaving CPU `cpu` first (requests made there may never be served, and the exit
    closes this process's files on B) and killing `children` (waiting there, they would keep
    the caller's pipe open)."""
    for c in children:
        os.kill(c, signal.SIGKILL)
    others = os.sched_getaffinity(0) | set(range(os.cpu_count() or 1))
    os.sched_setaffinity(0, (others - {cpu}) or others)
    print(msg, flush=True)
    fail(msg)


def check_waiters(a, b, pid_b, k):
    fa, fb = f"{a}/waited", f"{b}/waited"
    write_file(fa, b"")
    eventually("B sees the file", lambda: None if os.path.exists(fb) else "not there")
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    held = os.open(fb, os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)
    until_waits(pid_b, 0, "B's daemon waits on a lock before the test")
    # K waiters one at a time, each in B's daemon before the next starts (the entry the
    # daemon adds for each is registered before the next request comes), then K more in a
    # burst: a request that comes while every entry is taken waits in the kernel for the
    # queue's next answer (it is not handed to an entry registered later), so each added
    # entry makes a request of its own there, whose answer hands the queued ones out.
    children = []

    def waiter(i):
        child = os.fork()
        if child == 0:
            os.close(held)
            fd = os.open(fb, os.O_RDWR | os.O_APPEND)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, f"{i}\n".encode())
            os._exit(0)
        children.append(child)

    for i in range(k):
        waiter(i)
        if not waits_within(pid_b, i + 1, 10):
            fail_off_cpu(cpu, children, f"{lock_waits(pid_b)} of {i + 1} blocked flocks on B "
                         "reached its daemon in 10 s")
    for i in range(k, 2 * k):
        waiter(i)
    if not waits_within(pid_b, 2 * k, 10):
        fail_off_cpu(cpu, children, f"{lock_waits(pid_b)} of {2 * k} blocked flocks on B "
                     f"reached its daemon in 10 s (the last {k} started at once)")
    k *= 2
    # The holder's own requests, on the waiters' CPU, in a child so a hang is seen.
    child = os.fork()
    if child == 0:
        write_file(f"{b}/while-waited", b"w" * 4096)
        os._exit(0)
    if exited_within(child, 10) is None:
        fail_off_cpu(cpu, children + [child], f"a create, write and close on B did not end in 10 s while {k} "
                     "flocks waited on its CPU (their waits took every entry of its queue)")
    os.close(held)
    for c in children:
        status = exited_within(c, 10)
        if status is None or os.waitstatus_to_exitcode(status) != 0:
            fail(f"a waiter on B did not take the lock and write after the holder let go: {status}")
    lines = sorted(read_file(fb).decode().split())
    if lines != sorted(str(i) for i in range(k)):
        fail(f"the waiters wrote {lines}, not each once")
    print(f"waiters: {k} flocks waited on CPU {cpu} of B; its other requests went on, "
          "each waiter took the lock in turn")


def check_c2o(a, b, rounds):
    rng = random.Random(7)
    for i in range(rounds):
        src, dst = (a, b) if i % 2 == 0 else (b, a)
        size = rng.choice([0, 1, 4095, 4096, 65537, 1 << 20, 3 << 20, rng.randrange(1 << 21)])
        data = os.urandom(size)
        if i > 0:
            # The reader has the old version cached (pages and size).
            read_file(f"{dst}/c2o")
        write_file(f"{src}/c2o", data)
        got = read_file(f"{dst}/c2o")
        if got != data:
            fail(f"round {i}: {len(data)} bytes closed on {src}, {len(got)} read on {dst} "
                 f"({'same' if got == data[:len(got)] else 'other'} bytes)")
    print(f"close-to-open: {rounds} rounds, every byte seen on the other mount")


def check_sustain(a, b, secs):
    size = 4 << 20
    data = bytearray(os.urandom(size))
    write_file(f"{a}/sustained", data)
    fd = os.open(f"{b}/sustained", os.O_RDWR)
    rounds = 0
    try:
        os.unlink(f"{a}/sustained")
        eventually("the unlinked name gone on B",
                   lambda: "still listed" if "sustained" in os.listdir(b) else None)
        rng = random.Random(3)
        end = time.monotonic() + secs
        while time.monotonic() < end:
            off = rng.randrange(size)
            n = min(rng.randrange(1, 1 << 16), size - off)
            chunk = os.urandom(n)
            if os.pwrite(fd, chunk, off) != n:
                fail("a short write through the handle")
            data[off:off + n] = chunk
            # From the servers, not B's page cache.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            got = os.pread(fd, size, 0)
            if got != data:
                bad = next(i for i in range(min(len(got), size)) if got[i] != data[i]) \
                    if len(got) == size else len(got)
                fail(f"round {rounds}: the unlinked file read through B's handle differs "
                     f"at byte {bad}")
            rounds += 1
    except OSError as e:
        fail(f"round {rounds}: {e} through B's handle of the file unlinked on A")
    finally:
        os.close(fd)
    print(f"sustained: a file unlinked on A, read and written through B's handle for "
          f"{secs:g} s ({rounds} rounds): every byte right")


def check_writers(d, secs, manifest, size_max=16 << 10, pause=0.02):
    import hashlib
    os.makedirs(d, exist_ok=True)
    rng = random.Random(os.getpid())
    n = failed = 0
    end = time.monotonic() + secs
    with open(manifest, "a") as m:
        while time.monotonic() < end:
            name = f"w{n}"
            n += 1
            data = os.urandom(rng.randrange(1, size_max))
            try:
                fd = os.open(f"{d}/{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError:
                failed += 1
                time.sleep(0.05)
                continue
            m.write(f"{name} {hashlib.sha256(data).hexdigest()}\n")
            m.flush()
            time.sleep(pause)
    print(f"writers: {n - failed} files acknowledged, {failed} refused")


def check_verify(manifest, mounts, d):
    import hashlib
    with open(manifest) as m:
        entries = [line.split() for line in m if line.strip()]
    for mnt in mounts:
        for name, digest in entries:
            got = hashlib.sha256(read_file(f"{mnt}/{d}/{name}")).hexdigest()
            if got != digest:
                fail(f"{mnt}/{d}/{name}: acknowledged bytes differ")
    listings = {mnt: sorted(os.listdir(f"{mnt}/{d}")) for mnt in mounts}
    first = listings[mounts[0]]
    for mnt, names in listings.items():
        if names != first:
            fail(f"{d} lists {len(names)} names on {mnt}, {len(first)} on {mounts[0]}")
    print(f"verify: {len(entries)} acknowledged files of {d} whole on {len(mounts)} mounts, "
          f"listings equal")


# --- the model checker ---

def replay(log):
    """The shared directory's model: name -> bytes, from the log's lines."""
    files = {}
    for line in log.decode().splitlines():
        op, *args = line.split(" ")
        if op == "create":
            files[args[0]] = bytes.fromhex(args[1]) if len(args) > 1 else b""
        elif op == "rename":
            files[args[1]] = files.pop(args[0])
        elif op == "unlink":
            del files[args[0]]
        elif op == "append":
            files[args[0]] += bytes.fromhex(args[1])
    return files


def shared_step(root, rng, who, k):
    d = f"{root}/shared"
    lock = os.open(f"{d}/.lock", os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        log = read_file(f"{d}/.log")
        model = replay(log)
        for name, want in model.items():
            got = read_file(f"{d}/{name}")
            if got != want:
                # What tells a stale read from a lost line: the log read again (size and
                # tail) after a moment, still under the lock.
                size = os.stat(f"{d}/.log").st_size
                time.sleep(0.5)
                again = read_file(f"{d}/.log")
                fail(f"{who}: shared/{name} holds {got!r}, the model {want!r} (the log: "
                     f"{len(log)} bytes read, stat {size}; read again {len(again)} bytes, its "
                     f"model {'the same' if replay(again) == model else 'differs'}; its last "
                     f"lines {again.decode(errors='replace').splitlines()[-3:]})")
        names = sorted(model)
        choice = rng.random()
        if not names or choice < 0.35:
            name, data = f"s{who}-{k}", os.urandom(rng.randrange(1, 64))
            write_file(f"{d}/{name}", data, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            line = f"create {name} {data.hex()}"
        elif choice < 0.55:
            src = rng.choice(names)
            dst = rng.choice(names) if rng.random() < 0.5 else f"r{who}-{k}"
            if dst == src:
                dst = f"r{who}-{k}"
            os.rename(f"{d}/{src}", f"{d}/{dst}")
            line = f"rename {src} {dst}"
        elif choice < 0.7:
            name = rng.choice(names)
            os.unlink(f"{d}/{name}")
            line = f"unlink {name}"
        else:
            name, data = rng.choice(names), os.urandom(rng.randrange(1, 32))
            write_file(f"{d}/{name}", data, os.O_WRONLY | os.O_APPEND)
            line = f"append {name} {data.hex()}"
        write_file(f"{d}/.log", (line + "\n").encode(), os.O_WRONLY | os.O_APPEND)
    finally:
        os.close(lock)  # the flock goes with the last close


def own_step(root, rng, who, k, model):
    d = f"{root}/own{who}"
    names = sorted(model)
    choice = rng.random()
    if not names or choice < 0.4:
        name, data = f"f{k}", os.urandom(rng.randrange(0, 200_000))
        write_file(f"{d}/{name}", data)
        model[name] = data
    elif choice < 0.6:
        src, dst = rng.choice(names), f"g{k}"
        os.rename(f"{d}/{src}", f"{d}/{dst}")
        model[dst] = model.pop(src)
    elif choice < 0.75:
        name = rng.choice(names)
        os.unlink(f"{d}/{name}")
        del model[name]
    else:
        name = rng.choice(names)
        got = read_file(f"{d}/{name}")
        if got != model[name]:
            fail(f"worker {who}: own{who}/{name} reads {len(got)} bytes, not its own {len(model[name])}")
        data = os.urandom(rng.randrange(1, 4096))
        write_file(f"{d}/{name}", data, os.O_WRONLY | os.O_APPEND)
        model[name] += data


def worker(root, who, ops, seed, out):
    rng = random.Random(seed * 1000 + who)
    os.mkdir(f"{root}/own{who}")
    model = {}
    for k in range(ops):
        if rng.random() < 0.5:
            shared_step(root, rng, who, k)
        else:
            own_step(root, rng, who, k, model)
    out.put((who, {n: d.hex() for n, d in model.items()}))


def tree(d):
    return {n: read_file(f"{d}/{n}") for n in os.listdir(d) if not n.startswith(".")}


def check_model(a, b, workers, ops, seed):
    os.mkdir(f"{a}/shared")
    write_file(f"{a}/shared/.lock", b"")
    write_file(f"{a}/shared/.log", b"")
    eventually("B sees shared/", lambda: None if os.path.exists(f"{b}/shared/.log") else "not yet")
    out = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=worker, args=(a if w % 2 == 0 else b, w, ops, seed, out))
             for w in range(workers)]
    t = time.monotonic()
    for p in procs:
        p.start()
    models = {}
    while len(models) < len(procs):
        try:
            who, model = out.get(timeout=1)
            models[who] = model
        except queue.Empty:
            # A worker that failed said why and never reports: fail now, not at the timeout.
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if failed:
                for p in procs:
                    p.kill()
                fail(f"a worker failed (exit {failed[0]})")
    for p in procs:
        p.join()
        if p.exitcode != 0:
            fail(f"a worker failed (exit {p.exitcode})")
    took = time.monotonic() - t
    log = read_file(f"{a}/shared/.log")
    shared = replay(log)
    for root in (a, b):
        eventually(f"shared/ on {root} against the model",
                   lambda: None if tree(f"{root}/shared") == shared
                   else f"names {sorted(tree(f'{root}/shared'))} vs {sorted(shared)}")
        for w, m in models.items():
            want = {n: bytes.fromhex(h) for n, h in m.items()}
            eventually(f"own{w} on {root} against its model",
                       lambda: None if tree(f"{root}/own{w}") == want
                       else f"names {sorted(tree(f'{root}/own{w}'))} vs {sorted(want)}")
    print(f"model: {workers} workers x {ops} ops ({len(log.splitlines())} on the shared "
          f"directory) in {took:.1f} s; both mounts match the models")


def storm_worker(root, i, n):
    d = f"{root}/storm"
    for k in range(n):
        write_file(f"{d}/p{i}-{k}", b"s")
    for k in range(n):
        os.unlink(f"{d}/p{i}-{k}")


def check_storm(a, b, n):
    os.mkdir(f"{a}/storm")
    eventually("B sees storm/", lambda: None if os.path.isdir(f"{b}/storm") else "not yet")
    t = time.monotonic()
    procs = [multiprocessing.Process(target=storm_worker, args=(a if i % 2 == 0 else b, i, n))
             for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            fail(f"a storm worker failed (exit {p.exitcode})")
    took = time.monotonic() - t
    for root in (a, b):
        eventually(f"storm/ on {root} empty",
                   lambda: None if not os.listdir(f"{root}/storm") else os.listdir(f"{root}/storm")[:5])
    print(f"storm: 4 processes on 2 mounts made and removed {4 * n} files in one directory "
          f"in {took:.1f} s")


def check_freeze(a, b, pid_a, ttl):
    fa, fb = f"{a}/frozen", f"{b}/frozen"
    write_file(fa, b"")
    eventually("B sees the file", lambda: None if os.path.exists(fb) else "not there")
    # The holder on A: takes the lock, says so, then writes when told (and says how it went).
    holder = subprocess.Popen([sys.executable, "-c", """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.readline()
try:
    os.pwrite(fd, b"A" * 4096, 0)
    os.fsync(fd)
    print("wrote", flush=True)
except OSError as e:
    print("refused", e.errno, flush=True)
""", fa], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if holder.stdout.readline().strip() != "locked":
        fail("the holder on A did not take its lock")
    if not blocked_flock(fb):
        fail("B took the lock A's process holds")
    os.kill(pid_a, signal.SIGSTOP)
    try:
        t = time.monotonic()
        fd = os.open(fb, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)  # blocks until A's session is evicted
        waited = time.monotonic() - t
        # A's session runs out ttl after its last heartbeat, which came at most a second
        # (HEARTBEAT_EVERY, src/volume/shared/session.rs) before the freeze.
        if waited < ttl - 1.1:
            fail(f"B took A's lock after {waited:.1f} s, inside A's session ({ttl} s)")
        os.pwrite(fd, b"B" * 100, 0)
        os.close(fd)
    finally:
        os.kill(pid_a, signal.SIGCONT)
    holder.stdin.write("go\n")
    holder.stdin.flush()
    said = holder.stdout.readline().strip()
    holder.wait()
    if said == "wrote":
        fail("A's process wrote after its daemon was evicted")
    want = b"B" * 100
    if read_file(fb) != want:
        fail(f"B reads {read_file(fb)[:16]!r}..., not only its own bytes")
    print(f"freeze: B's flock granted {waited:.1f} s after A froze (session {ttl} s); "
          f"A's write after SIGCONT: {said}; the file holds B's bytes only")


def main():
    if sys.argv[1] == "writers":
        return check_writers(sys.argv[2], float(sys.argv[3]), sys.argv[4])
    if sys.argv[1] == "verify":
        split = sys.argv.index("--")
        return check_verify(sys.argv[2], sys.argv[3:split], sys.argv[split + 1])
    cmd, a, b = sys.argv[1:4]
    rest = sys.argv[4:]
    if cmd == "locks":
        check_locks(a, b)
    elif cmd == "reopen":
        check_reopen(a, b, rest[0])
    elif cmd == "interrupt":
        check_interrupt(a, b, int(rest[0]))
    elif cmd == "waiters":
        check_waiters(a, b, int(rest[0]), int(rest[1]))
    elif cmd == "c2o":
        check_c2o(a, b, int(rest[0]))
    elif cmd == "sustain":
        check_sustain(a, b, float(rest[0]))
    elif cmd == "model":
        check_model(a, b, int(rest[0]), int(rest[1]), int(rest[2]))
    elif cmd == "storm":
        check_storm(a, b, int(rest[0]))
    elif cmd == "freeze":
        check_freeze(a, b, int(rest[0]), float(rest[1]))
    else:
        fail(f"unknown check {cmd}")


if __name__ == "__main__":
    main()
