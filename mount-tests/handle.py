"""handle.py FILE: takes FILE's handle (name_to_handle_at), drops the kernel's caches, opens
the handle (open_by_handle_at, through the directory's fd for the mount) and prints the first
line of the file: a file system whose handles go stale with the caches fails here."""
import os, sys, ctypes, ctypes.util, struct
libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
path = sys.argv[1].encode()
buf = ctypes.create_string_buffer(8 + 128)
struct.pack_into("I", buf, 0, 128)
mount_id = ctypes.c_int()
r = libc.name_to_handle_at(-100, path, buf, ctypes.byref(mount_id), 0)
assert r == 0, os.strerror(ctypes.get_errno())
open("/proc/sys/vm/drop_caches", "w").write("3")
mfd = os.open(os.path.dirname(sys.argv[1]), os.O_RDONLY)
fd = libc.open_by_handle_at(mfd, buf, os.O_RDONLY)
assert fd >= 0, "open_by_handle_at: " + os.strerror(ctypes.get_errno())
print(os.read(fd, 100).decode().strip())
