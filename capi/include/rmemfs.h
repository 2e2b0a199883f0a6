/* rmemfs inside a program: a volume opened without FUSE (doc/LIBRARY.md).
 *
 * Link with -lrmemfs_c (target/release/librmemfs_c.so, built by
 * `cargo build --release -p rmemfs-c`). Calls return 0 or a count on success and a
 * negative errno on failure; rmemfs_last_error() says why (this thread's last failure).
 * rmemfs_open_volume returns NULL and sets errno. A volume may be used from several threads;
 * after fork(), a child's calls fail with -EBADF (open the volume again in the child). */
#ifndef RMEMFS_H
#define RMEMFS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rmemfs_volume rmemfs_volume;

/* mode: follow (read-only, beside the holder) or hold (the one writer, fenced). */
#define RMEMFS_FOLLOW 0
#define RMEMFS_HOLD 1

struct rmemfs_stat {
    uint64_t ino;
    uint32_t mode; /* file type and permission bits, as st_mode */
    uint32_t nlink;
    uint32_t uid;
    uint32_t gid;
    uint64_t size;
    int64_t mtime_ns;
    int64_t ctime_ns;
};

/* One read of rmemfs_read_many; got is set to the bytes read. */
struct rmemfs_read {
    uint64_t fh;
    uint64_t offset;
    void *buf;
    uint64_t len;
    int64_t got;
};

const char *rmemfs_last_error(void);
/* servers: comma-separated host[:port]; secret_file may be NULL. */
rmemfs_volume *rmemfs_open_volume(const char *servers, const char *name,
                                  const char *secret_file, int mode, int create);
void rmemfs_close_volume(rmemfs_volume *v);

int64_t rmemfs_stat(const rmemfs_volume *v, const char *path, struct rmemfs_stat *out);
/* Names, each NUL-terminated, into buf; returns the bytes the listing takes (larger than
 * len: call again with a larger buffer). */
int64_t rmemfs_listdir(const rmemfs_volume *v, const char *path, char *buf, size_t len);
int64_t rmemfs_mkdir(const rmemfs_volume *v, const char *path, uint32_t mode);
int64_t rmemfs_unlink(const rmemfs_volume *v, const char *path);
int64_t rmemfs_rmdir(const rmemfs_volume *v, const char *path);
int64_t rmemfs_rename(const rmemfs_volume *v, const char *from, const char *to);

/* flags as open(2): O_RDONLY, O_WRONLY, O_RDWR, O_CREAT, O_EXCL, O_TRUNC, O_APPEND. */
int64_t rmemfs_open(const rmemfs_volume *v, const char *path, int flags, uint32_t mode);
int64_t rmemfs_close(const rmemfs_volume *v, uint64_t fh);
int64_t rmemfs_pread(const rmemfs_volume *v, uint64_t fh, void *buf, size_t len, uint64_t offset);
int64_t rmemfs_read(const rmemfs_volume *v, uint64_t fh, void *buf, size_t len);
int64_t rmemfs_pwrite(const rmemfs_volume *v, uint64_t fh, const void *buf, size_t len,
                      uint64_t offset);
int64_t rmemfs_write(const rmemfs_volume *v, uint64_t fh, const void *buf, size_t len);
int64_t rmemfs_fsync(const rmemfs_volume *v, uint64_t fh);
/* n reads at once, their one-sided reads in flight together. */
int64_t rmemfs_read_many(const rmemfs_volume *v, struct rmemfs_read *reads, size_t n);

#ifdef __cplusplus
}
#endif
#endif
