#!/usr/bin/env python3
"""O_TMPFILE in DIR (data.sh linux_semantics): an unnamed file, written, then named by linkat;
one opened with O_EXCL can never be named. Prints what DIR listed before the linkat and the
error linking the O_EXCL one.
"""
import os, sys, errno, ctypes
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, AT_SYMLINK_FOLLOW = -100, 0x400
def name(fd, path):  # linkat through /proc, as the O_TMPFILE man page shows
    if libc.linkat(AT_FDCWD, b"/proc/self/fd/%d" % fd, AT_FDCWD, path.encode(), AT_SYMLINK_FOLLOW):
        return errno.errorcode[ctypes.get_errno()]
    return "linked"
d = sys.argv[1]
fd = os.open(d, os.O_TMPFILE | os.O_RDWR, 0o640)
os.write(fd, b"unnamed until now")
listed = os.listdir(d)
assert name(fd, d + "/named") == "linked"
ex = os.open(d, os.O_TMPFILE | os.O_RDWR | os.O_EXCL, 0o600)
refused = name(ex, d + "/never")
print(listed, refused)
