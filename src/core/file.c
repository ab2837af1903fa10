/* core/file: see file.h. */
#include "core/file.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
