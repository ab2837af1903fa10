/* core/file: see file.h. */
#define _DEFAULT_SOURCE /* madvise(MADV_DONTNEED) */
#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static dsp_status open_regular(const char *path, int *fd, uint64_t *size) {
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0) return dsp_error(DSP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(*fd, &sb) != 0) {
        int e = errno;
        close(*fd);
        return dsp_error(DSP_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(*fd);
        return dsp_error(DSP_ERR_IO, "%s: not a regular file", path);
    }
    *size = (uint64_t)sb.st_size;
    return DSP_OK;
}

/* the live mappings, for dsp_file_drop_pages (a weight file is mapped once per model; more than
 * DROP_MAPS at once simply are not registered) */
#define DROP_MAPS 64
static struct {
    pthread_mutex_t mu;
    const uint8_t *start[DROP_MAPS];
    size_t size[DROP_MAPS];
} g_maps = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void maps_set(const void *old_start, const void *start, size_t size) {
    pthread_mutex_lock(&g_maps.mu);
    for (int i = 0; i < DROP_MAPS; i++)
        if (g_maps.start[i] == old_start) {
            g_maps.start[i] = start, g_maps.size[i] = size;
            break;
        }
    pthread_mutex_unlock(&g_maps.mu);
}

bool dsp_file_drop_pages(const void *p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + page - 1) / page * page, b = ((uintptr_t)p + n) / page * page;
    bool done = false;
    if (!p || b <= a) return false;
    pthread_mutex_lock(&g_maps.mu); /* held across madvise: the mapping cannot be closed under it */
    for (int i = 0; i < DROP_MAPS && !done; i++)
        if (g_maps.start[i] && (const uint8_t *)p >= g_maps.start[i] && (const uint8_t *)p + n <= g_maps.start[i] + g_maps.size[i])
            done = madvise((void *)a, b - a, MADV_DONTNEED) == 0;
    pthread_mutex_unlock(&g_maps.mu);
    return done;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

bool dsp_mem_populate(void *p, size_t n) {
    if (!p || !n) return true;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), s = (uintptr_t)p, a = (s + page - 1) / page * page, b = (s + n) / page * page;
    const bool done = b > a && madvise((void *)a, b - a, MADV_POPULATE_WRITE) == 0;
    if (!done && b > a && (errno == ENOMEM || errno == EFAULT)) return false;
    /* the partial pages at either end, or every page where madvise did not run (EINVAL: an older
     * kernel); a step of one page from p lands in every page of the range but the last */
    volatile uint8_t *c = p;
    for (size_t i = 0; i < n; i += page)
        if (!done || s + i < a || s + i >= b) c[i] = c[i];
    c[n - 1] = c[n - 1];
    return true;
}

void *dsp_mem_map(size_t n) {
    if (!n) return NULL;
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE), len = (n + pg - 1) / pg * pg;
    if (len < n || len > SIZE_MAX - 2 * pg) return NULL;
    uint8_t *p = mmap(NULL, len + 2 * pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    if (mprotect(p + pg, len, PROT_READ | PROT_WRITE)) {
        munmap(p, len + 2 * pg);
        return NULL;
    }
    return p + pg;
}

void dsp_mem_unmap(void *p, size_t n) {
    if (!p) return;
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE), len = (n + pg - 1) / pg * pg;
    munmap((uint8_t *)p - pg, len + 2 * pg);
}

dsp_status dsp_file_map_open(const char *path, dsp_file_map *m) {
    memset(m, 0, sizeof *m);
    int fd = -1;
    uint64_t size = 0;
    dsp_status st = open_regular(path, &fd, &size);
    if (st) return st;
    if (size == 0) {
        close(fd);
        return dsp_error(DSP_ERR_FORMAT, "%s: empty file", path);
    }
    if (size > SIZE_MAX) {
        close(fd);
        return dsp_error(DSP_ERR_IO, "%s: too large to map", path);
    }
    void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) return dsp_error(DSP_ERR_IO, "%s: cannot mmap: %s", path, strerror(e));
    m->data = p;
    m->size = size;
    m->map = p;
    m->map_size = (size_t)size;
    maps_set(NULL, p, m->map_size);
    return DSP_OK;
}

void dsp_file_map_close(dsp_file_map *m) {
    if (m->map) maps_set(m->map, NULL, 0), munmap(m->map, m->map_size);
    memset(m, 0, sizeof *m);
}

dsp_status dsp_file_read(const char *path, size_t max_bytes, char **out, size_t *len) {
    *out = NULL;
    if (len) *len = 0;
    bool is_stdin = !strcmp(path, "-");
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) return dsp_error(DSP_ERR_IO, "%s: %s", path, strerror(errno));
    /* read up to one byte past the limit, to tell "exactly max_bytes" from "more" */
    size_t limit = max_bytes < SIZE_MAX - 1 ? max_bytes + 1 : SIZE_MAX - 1;
    size_t cap = 0, n = 0;
    char *buf = NULL;
    dsp_status st = DSP_OK;
    for (;;) {
        if (n == cap) {
            size_t ncap = !cap ? (limit < 4096 ? limit : 4096) : cap > limit / 2 ? limit : cap * 2;
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                st = dsp_error(DSP_ERR_NOMEM, "%s: out of memory after %zu bytes", path, n);
                break;
            }
            buf = nb;
            cap = ncap;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (n > max_bytes) {
            st = dsp_error(DSP_ERR_RANGE, "%s: larger than %zu bytes", path, max_bytes);
            break;
        }
        if (r == 0) {
            if (ferror(f)) st = dsp_error(DSP_ERR_IO, "%s: read error", path);
            break;
        }
    }
    if (!is_stdin) fclose(f);
    if (st) {
        free(buf);
        return st;
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return DSP_OK;
}

bool dsp_file_is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

bool dsp_file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

char *dsp_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t o = a;
    if (a && dir[a - 1] != '/') p[o++] = '/';
    memcpy(p + o, name, b + 1);
    return p;
}
