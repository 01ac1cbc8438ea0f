/* Helpers shared by the fuzz targets whose parsers read files: a private scratch directory
 * (on /dev/shm when there is one, so writing each input is cheap) made once per process and
 * removed with its files when the process exits. */
#ifndef UST_FUZZ_UTIL_H
#define UST_FUZZ_UTIL_H

#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char fuzz_dir_path[256];

static inline void fuzz_dir_remove(void) {
    DIR *d = opendir(fuzz_dir_path);
    if (!d) return;
    char path[512];
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", fuzz_dir_path, e->d_name);
            unlink(path);
        }
    closedir(d);
    rmdir(fuzz_dir_path);
}

static inline const char *fuzz_dir(void) {
    if (!fuzz_dir_path[0]) {
        snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/ust-fuzz-XXXXXX",
                 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
        if (!mkdtemp(fuzz_dir_path)) abort();
        atexit(fuzz_dir_remove);
    }
    return fuzz_dir_path;
}

/* Writes data to fuzz_dir()/name and returns the path (static buffer per slot). */
static inline const char *fuzz_file(int slot, const char *name, const uint8_t *data, size_t size) {
    static char paths[4][512];
    snprintf(paths[slot], sizeof paths[slot], "%s/%s", fuzz_dir(), name);
    int fd = open(paths[slot], O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) abort();
    for (size_t off = 0; off < size;) {
        ssize_t k = write(fd, data + off, size - off);
        if (k <= 0) abort();
        off += (size_t)k;
    }
    close(fd);
    return paths[slot];
}

static inline uint32_t fuzz_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#endif
