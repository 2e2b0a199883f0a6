/* The C ABI from C (mount-tests library_c): holds volume ARGV[2] on servers ARGV[1], writes
 * /c/data (3 MiB, i*7 % 251), fsyncs, reads it back whole and with rmemfs_read_many, lists
 * /c, checks errors come back as negative errnos with a message, and closes the volume. */
#include "rmemfs.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIZE (3 << 20)
#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, ": %s\n", rmemfs_last_error()); return 1; } while (0)

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: %s SERVERS NAME\n", argv[0]); return 2; }
    rmemfs_volume *v = rmemfs_open_volume(argv[1], argv[2], NULL, RMEMFS_HOLD, 1);
    if (!v) FAIL("open_volume (errno %d)", errno);
    unsigned char *data = malloc(SIZE), *back = malloc(SIZE);
    for (int i = 0; i < SIZE; i++) data[i] = (unsigned char)(i * 7 % 251);
    if (rmemfs_mkdir(v, "/c", 0755) < 0) FAIL("mkdir");
    int64_t fh = rmemfs_open(v, "/c/data", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fh < 0) FAIL("open for writing");
    if (rmemfs_write(v, fh, data, SIZE) != SIZE) FAIL("write");
    if (rmemfs_fsync(v, fh) < 0 || rmemfs_close(v, fh) < 0) FAIL("fsync and close");
    struct rmemfs_stat st;
    if (rmemfs_stat(v, "/c/data", &st) < 0 || st.size != SIZE) FAIL("stat");
    fh = rmemfs_open(v, "/c/data", O_RDONLY, 0);
    if (fh < 0) FAIL("open for reading");
    if (rmemfs_pread(v, fh, back, SIZE, 0) != SIZE || memcmp(back, data, SIZE)) FAIL("read back");
    struct rmemfs_read reads[64];
    static unsigned char bufs[64][4096];
    for (int i = 0; i < 64; i++) {
        reads[i] = (struct rmemfs_read){ .fh = (uint64_t)fh, .offset = (uint64_t)i * 49157,
                                         .buf = bufs[i], .len = 4096, .got = -1 };
    }
    if (rmemfs_read_many(v, reads, 64) < 0) FAIL("read_many");
    for (int i = 0; i < 64; i++)
        if (reads[i].got != 4096 || memcmp(bufs[i], data + reads[i].offset, 4096)) FAIL("read_many range %d", i);
    char names[64];
    int64_t n = rmemfs_listdir(v, "/c", names, sizeof names);
    if (n != 5 || strcmp(names, "data")) FAIL("listdir gave %lld bytes", (long long)n);
    if (rmemfs_stat(v, "/c/none", &st) != -ENOENT || !*rmemfs_last_error()) FAIL("stat of a missing file");
    if (rmemfs_close(v, fh) < 0) FAIL("close");
    rmemfs_close_volume(v);
    printf("C: wrote, read back and read_many'd 3 MiB; listdir and errors as documented\n");
    return 0;
}
