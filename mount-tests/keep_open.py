#!/usr/bin/env python3
"""Programs keep their open files while the daemon of a supervised volume mount dies and
another takes its connection over (mount-tests: volume_keep).

keep_open.py MNT SERVER_PID

SERVER_PID: the volume's one memory server, frozen (SIGSTOP) in the last round so that an
fsync is certainly read by the daemon and unanswered when it is killed: the kernel must send
it again to the next daemon (FUSE_NOTIFY_RESEND), or the fsync would never return. The mount
needs an --op-timeout longer than that round (else the journal fails the fsync first).

Opens, on MNT: a file being written, a file being read, a file unlinked while open, and a
directory stream. Then, three times (kill -9 of the daemon twice, SIGHUP to the supervisor
once: a planned restart), ends the daemon while a thread keeps stat()ing, and checks after
each that every descriptor still works, with the same bytes; that no request failed; and
that a new daemon serves (its pid changed). Prints one line per round, exits 1 on the first
broken promise.
"""
import hashlib
import os
import signal
import sys
import threading
import time


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def daemon_and_supervisor(mnt):
    """(daemon pid, supervisor pid): the supervisor is the mount process whose parent is not
    one; the daemon is its child."""
    procs = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if b"mount" in argv and mnt.encode() in argv and b"--supervise" in argv:
            procs[int(pid)] = ppid
    daemons = [p for p, pp in procs.items() if pp in procs]
    sups = [p for p, pp in procs.items() if pp not in procs]
    return (daemons[0] if daemons else None, sups[0] if sups else None)


def wait_new_daemon(mnt, old, seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        d, _ = daemon_and_supervisor(mnt)
        if d is not None and d != old:
            return d
        time.sleep(0.1)
    fail(f"no new daemon within {seconds} s")


def wait_stopped(pid, seconds=30):
    """Returns once every thread of `pid` is stopped: kill(SIGSTOP) returns when the signal is
    queued, and the process stops only once one of its threads takes it, so a request sent
    just after kill() could still be served."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                continue
        if states and all(s in ("T", "t") for s in states):
            return
        time.sleep(0.01)
    os.kill(pid, signal.SIGCONT)
    fail(f"the server {pid} did not stop within {seconds} s of SIGSTOP")


def stats(mnt):
    """The mount's report, read in this process (what `rmemfs stats --json` reads): a child
    process would flush, at its exit, the files it inherited, which waits on a frozen
    server."""
    import json
    return json.loads(os.getxattr(mnt, "user.rmemfs.stats.json"))


def main():
    mnt, server = sys.argv[1], int(sys.argv[2])
    daemon, sup = daemon_and_supervisor(mnt)
    if daemon is None or sup is None:
        fail("no supervised daemon for " + mnt)
    os.makedirs(f"{mnt}/dir", exist_ok=True)
    for i in range(50):
        with open(f"{mnt}/dir/e{i:03}", "w") as f:
            f.write(str(i))
    written = bytearray()
    w = os.open(f"{mnt}/log", os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    ro_bytes = os.urandom(300_000)
    with open(f"{mnt}/ro", "wb") as f:
        f.write(ro_bytes)
    r = os.open(f"{mnt}/ro", os.O_RDONLY)
    gone_bytes = os.urandom(70_000)
    g = os.open(f"{mnt}/gone", os.O_RDWR | os.O_CREAT, 0o600)
    os.write(g, gone_bytes)
    os.fsync(g)
    os.unlink(f"{mnt}/gone")
    dfd = os.open(f"{mnt}/dir", os.O_RDONLY | os.O_DIRECTORY)
    d_fd = os.open(f"{mnt}/dir", os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(d_fd)
    os.close(d_fd)

    errors = []
    stop = threading.Event()
    statted = [0]

    def stat_loop():
        while not stop.is_set():
            try:
                os.stat(f"{mnt}/dir/e{statted[0] % 50:03}")
                os.stat(mnt)
                statted[0] += 1
            except OSError as e:
                errors.append(repr(e))

    t = threading.Thread(target=stat_loop, daemon=True)
    t.start()
    for rnd, how in enumerate(["kill -9", "SIGHUP", "kill -9"], 1):
        chunk = f"round {rnd} before\n".encode() * 100
        os.write(w, chunk)
        written += chunk
        os.fsync(w)
        before = statted[0]
        if how == "SIGHUP":
            os.kill(sup, signal.SIGHUP)
        else:
            os.kill(daemon, signal.SIGKILL)
        new = wait_new_daemon(mnt, daemon)
        # The same descriptors, served by the new daemon.
        chunk = f"round {rnd} after\n".encode() * 100
        os.write(w, chunk)
        written += chunk
        os.fsync(w)
        got = os.pread(w, len(written) + 10, 0)
        if got != bytes(written):
            fail(f"round {rnd}: the file being written reads back wrong ({len(got)} bytes, "
                 f"expected {len(written)})")
        if os.pread(r, len(ro_bytes) + 10, 0) != ro_bytes:
            fail(f"round {rnd}: the file held open for reading changed")
        if os.pread(g, len(gone_bytes) + 10, 0) != gone_bytes:
            fail(f"round {rnd}: the file unlinked while open is lost")
        names = sorted(e.name for e in os.scandir(dfd))
        if names != [f"e{i:03}" for i in range(50)]:
            fail(f"round {rnd}: the held directory lists {len(names)} entries")
        with open(f"{mnt}/new{rnd}", "w") as f:
            f.write("made by the new daemon")
        deadline = time.monotonic() + 30
        while statted[0] <= before + 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        if statted[0] <= before + 10:
            fail(f"round {rnd}: stat() made no progress after the restart")
        if errors:
            fail(f"round {rnd}: requests failed across the restart: {errors[:3]}")
        print(f"round {rnd} ({how}): daemon {daemon} -> {new}; every descriptor intact, "
              f"{statted[0]} stats without an error", flush=True)
        daemon = new
    stop.set()
    t.join()
    if errors:
        fail(f"requests failed: {errors[:3]}")

    # Round 4: an fsync in the daemon's hands when it dies. The data is flushed before the
    # freeze, so the fsync is the daemon's own (a journal commit of the chmod), not the
    # kernel's writeback, whose writes the daemon answers from another thread. The chmod
    # comes after the freeze (a metadata change does no I/O of its own): made before it, its
    # record could be committed within the commit interval, before the freeze, and the fsync
    # would then have nothing to wait for.
    chunk = b"round 4, written before the kill\n" * 100
    os.write(w, chunk)
    written += chunk
    os.fsync(w)
    os.kill(server, signal.SIGSTOP)
    wait_stopped(server)
    os.fchmod(w, 0o640)
    outcome = []

    def fsync_it():
        try:
            os.fsync(w)
            outcome.append("ok")
        except OSError as e:
            outcome.append(repr(e))

    f = threading.Thread(target=fsync_it, daemon=True)
    try:
        f.start()
        # In flight: the fsync and this report's own request (the report reads local
        # figures only, so the frozen server does not hold it).
        deadline = time.monotonic() + 30
        while stats(mnt)["fuse"]["in_flight"] < 2:
            if time.monotonic() > deadline or outcome:
                fail(f"the fsync never reached the daemon (outcome {outcome})")
            time.sleep(0.05)
        os.kill(daemon, signal.SIGKILL)
        old = daemon
        deadline = time.monotonic() + 30
        while daemon_and_supervisor(mnt)[0] == old and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        os.kill(server, signal.SIGCONT)
    daemon = wait_new_daemon(mnt, old)
    f.join(60)
    if outcome != ["ok"]:
        fail(f"the fsync the dead daemon held did not complete: {outcome or 'still waiting'}")
    if os.pread(w, len(written) + 10, 0) != bytes(written):
        fail("round 4: the file reads back wrong")
    if os.fstat(w).st_mode & 0o777 != 0o640:
        fail("round 4: the fsynced chmod is lost")
    s = stats(mnt)
    resent = s["fuse"]["resent"]
    if resent < 1:
        fail("round 4: the new daemon answered no request sent again")
    print(f"round 4 (kill -9 with an fsync in flight, server frozen): daemon {old} -> "
          f"{daemon}; the fsync returned 0, {resent} request(s) answered after being sent "
          f"again")
    print("sha256 of the written file: " + hashlib.sha256(written).hexdigest()[:16])
    for fd in (w, r, g, dfd):
        os.close(fd)


if __name__ == "__main__":
    main()
