"""rmemfs inside a Python program: a volume opened without FUSE (doc/LIBRARY.md).

    import rmemfs
    vol = rmemfs.open_volume("10.0.0.1,10.0.0.2", "data", mode="follow")
    fh = vol.open("/train/shard-0001", os.O_RDONLY)
    blobs = vol.read_many([(fh, 0, 4096), (fh, 1 << 20, 4096)])

A thin ctypes layer over the C ABI (librmemfs_c.so, `cargo build --release -p rmemfs-c`):
found through RMEMFS_LIB, next to this package, or in the repository's target/release.
Errors are OSError with errno (FileNotFoundError and the like, as os raises them).
"""
import ctypes
import os

__all__ = ["open_volume", "Volume", "FOLLOW", "HOLD"]

FOLLOW, HOLD = 0, 1


class _Stat(ctypes.Structure):
    _fields_ = [("ino", ctypes.c_uint64), ("mode", ctypes.c_uint32), ("nlink", ctypes.c_uint32),
                ("uid", ctypes.c_uint32), ("gid", ctypes.c_uint32), ("size", ctypes.c_uint64),
                ("mtime_ns", ctypes.c_int64), ("ctime_ns", ctypes.c_int64)]


class _Read(ctypes.Structure):
    _fields_ = [("fh", ctypes.c_uint64), ("offset", ctypes.c_uint64), ("buf", ctypes.c_void_p),
                ("len", ctypes.c_uint64), ("got", ctypes.c_int64)]


def _find_lib():
    here = os.path.dirname(os.path.abspath(__file__))
    tried = [os.environ.get("RMEMFS_LIB"), os.path.join(here, "librmemfs_c.so"),
             os.path.join(here, "..", "..", "target", "release", "librmemfs_c.so")]
    for p in tried:
        if p and os.path.exists(p):
            return p
    raise ImportError("librmemfs_c.so not found (set RMEMFS_LIB, or build it: "
                      "cargo build --release -p rmemfs-c); tried %s" % [t for t in tried if t])


_lib = ctypes.CDLL(_find_lib(), use_errno=True)
_P, _S, _U64, _I64, _INT, _U32 = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64,
                                  ctypes.c_int64, ctypes.c_int, ctypes.c_uint32)
for _name, _args, _ret in [
    ("rmemfs_last_error", [], ctypes.c_char_p),
    ("rmemfs_open_volume", [_S, _S, _S, _INT, _INT], _P),
    ("rmemfs_close_volume", [_P], None),
    ("rmemfs_stat", [_P, _S, ctypes.POINTER(_Stat)], _I64),
    ("rmemfs_listdir", [_P, _S, ctypes.c_char_p, ctypes.c_size_t], _I64),
    ("rmemfs_mkdir", [_P, _S, _U32], _I64),
    ("rmemfs_unlink", [_P, _S], _I64),
    ("rmemfs_rmdir", [_P, _S], _I64),
    ("rmemfs_rename", [_P, _S, _S], _I64),
    ("rmemfs_open", [_P, _S, _INT, _U32], _I64),
    ("rmemfs_close", [_P, _U64], _I64),
    ("rmemfs_pread", [_P, _U64, _P, ctypes.c_size_t, _U64], _I64),
    ("rmemfs_read", [_P, _U64, _P, ctypes.c_size_t], _I64),
    ("rmemfs_pwrite", [_P, _U64, _P, ctypes.c_size_t, _U64], _I64),
    ("rmemfs_write", [_P, _U64, _P, ctypes.c_size_t], _I64),
    ("rmemfs_fsync", [_P, _U64], _I64),
    ("rmemfs_read_many", [_P, ctypes.POINTER(_Read), ctypes.c_size_t], _I64),
]:
    _f = getattr(_lib, _name)
    _f.argtypes, _f.restype = _args, _ret


def _error(errno, path=None):
    message = (_lib.rmemfs_last_error() or b"").decode(errors="replace")
    e = OSError(errno, "%s: %s" % (os.strerror(errno), message) if message else os.strerror(errno))
    if path is not None:
        e = OSError(errno, e.strerror, path)
    return e


def _check(r, path=None):
    if r < 0:
        raise _error(-r, path)
    return r


def _b(s):
    return s.encode() if isinstance(s, str) else s


class Stat:
    """What stat gives: st_ino, st_mode, st_nlink, st_uid, st_gid, st_size, st_mtime_ns,
    st_ctime_ns (the os.stat_result names)."""

    def __init__(self, s):
        self.st_ino, self.st_mode, self.st_nlink = s.ino, s.mode, s.nlink
        self.st_uid, self.st_gid, self.st_size = s.uid, s.gid, s.size
        self.st_mtime_ns, self.st_ctime_ns = s.mtime_ns, s.ctime_ns


class Volume:
    """An open volume; close() (or a with block) commits a holder's changes."""

    def __init__(self, servers, name, secret_file=None, mode="follow", create=False):
        m = {"follow": FOLLOW, "hold": HOLD}.get(mode, mode)
        self._v = _lib.rmemfs_open_volume(_b(servers), _b(name),
                                          _b(secret_file) if secret_file else None, m,
                                          1 if create else 0)
        if not self._v:
            raise _error(ctypes.get_errno())

    def close(self):
        if self._v:
            _lib.rmemfs_close_volume(self._v)
            self._v = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    def stat(self, path):
        s = _Stat()
        _check(_lib.rmemfs_stat(self._v, _b(path), ctypes.byref(s)), path)
        return Stat(s)

    def listdir(self, path="/"):
        size = 4096
        while True:
            buf = ctypes.create_string_buffer(size)
            n = _check(_lib.rmemfs_listdir(self._v, _b(path), buf, size), path)
            if n <= size:
                return [x.decode(errors="surrogateescape") for x in buf.raw[:n].split(b"\0")[:-1]]
            size = n

    def mkdir(self, path, mode=0o777):
        _check(_lib.rmemfs_mkdir(self._v, _b(path), mode), path)

    def unlink(self, path):
        _check(_lib.rmemfs_unlink(self._v, _b(path)), path)

    def rmdir(self, path):
        _check(_lib.rmemfs_rmdir(self._v, _b(path)), path)

    def rename(self, src, dst):
        _check(_lib.rmemfs_rename(self._v, _b(src), _b(dst)), src)

    def open(self, path, flags=os.O_RDONLY, mode=0o666):
        return _check(_lib.rmemfs_open(self._v, _b(path), flags, mode), path)

    def close_file(self, fh):
        _check(_lib.rmemfs_close(self._v, fh))

    def pread(self, fh, length, offset):
        buf = ctypes.create_string_buffer(length)
        n = _check(_lib.rmemfs_pread(self._v, fh, buf, length, offset))
        return buf.raw[:n]

    def read(self, fh, length):
        buf = ctypes.create_string_buffer(length)
        n = _check(_lib.rmemfs_read(self._v, fh, buf, length))
        return buf.raw[:n]

    def pwrite(self, fh, data, offset):
        return _check(_lib.rmemfs_pwrite(self._v, fh, data, len(data), offset))

    def write(self, fh, data):
        return _check(_lib.rmemfs_write(self._v, fh, data, len(data)))

    def fsync(self, fh):
        _check(_lib.rmemfs_fsync(self._v, fh))

    def read_many(self, reads, into=None):
        """Serves every (fh, offset, length) of `reads` at once; a list of bytes. With
        `into` (writable buffers, one per read, e.g. bytearrays or numpy arrays), the bytes
        land there without a copy and the counts are returned."""
        n = len(reads)
        reqs = (_Read * n)()
        bufs = []
        for i, (fh, offset, length) in enumerate(reads):
            if into is None:
                b = ctypes.create_string_buffer(length)
            else:
                b = (ctypes.c_char * length).from_buffer(into[i])
            bufs.append(b)
            reqs[i].fh, reqs[i].offset, reqs[i].len = fh, offset, length
            reqs[i].buf = ctypes.addressof(b)
        _check(_lib.rmemfs_read_many(self._v, reqs, n))
        if into is not None:
            return [reqs[i].got for i in range(n)]
        return [bufs[i].raw[:reqs[i].got] for i in range(n)]


def open_volume(servers, name, secret_file=None, mode="follow", create=False):
    """Opens volume `name` on `servers` ("host[:port],..." or a list): mode "follow"
    (read-only beside the holder) or "hold" (the one writer)."""
    if not isinstance(servers, (str, bytes)):
        servers = ",".join(servers)
    return Volume(servers, name, secret_file, mode, create)
