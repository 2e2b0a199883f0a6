#!/usr/bin/env python3
"""BIN MNT ADDRS: `rmemfs mount -f` under NOTIFY_SOCKET sends READY=1 once mounted. Prints the
message, whether MNT was a mount point when it came, and the daemon's exit status after umount.
"""
import os, socket, subprocess, sys, tempfile
binary, mnt, addrs = sys.argv[1:4]
path = os.path.join(tempfile.mkdtemp(), "notify")
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
s.settimeout(60)
env = dict(os.environ, NOTIFY_SOCKET=path)
p = subprocess.Popen([binary, "mount", "-f", mnt, "--servers", addrs], env=env,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
msg = s.recv(256).decode()
live = os.path.ismount(mnt)
subprocess.run(["umount", mnt], check=True)
print(msg, live, p.wait(60))
