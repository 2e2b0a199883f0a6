#!/usr/bin/env python3
"""Writes BYTES to PATH through a handle opened write-only ("w") or read-write ("rw") and prints
how many of the file's pages the kernel's page cache then holds, seen through a mapping made
before the write (so no open after the write: on a shared volume every open drops the file's
pages, close-to-open, which is why `fincore` cannot tell).

    cached_pages.py PATH w|rw BYTES
"""
import ctypes
import os
import sys

path, how, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
page = os.sysconf("SC_PAGE_SIZE")
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
PROT_READ, MAP_SHARED = 1, 1

os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644))
rfd = os.open(path, os.O_RDONLY)
addr = libc.mmap(None, size, PROT_READ, MAP_SHARED, rfd, 0)
if addr in (None, ctypes.c_void_p(-1).value):
    sys.exit(f"mmap: {os.strerror(ctypes.get_errno())}")
flags = {"w": os.O_WRONLY, "rw": os.O_RDWR}[how]
wfd = os.open(path, flags)
data = os.urandom(size)
done = 0
while done < size:
    done += os.write(wfd, data[done:])
os.close(wfd)
vec = ctypes.create_string_buffer(size // page)
if libc.mincore(addr, size, vec) != 0:
    sys.exit(f"mincore: {os.strerror(ctypes.get_errno())}")
print(sum(b & 1 for b in vec.raw))
os.close(rfd)
