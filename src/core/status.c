/* core/status: see status.h. */
#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DSP_ERRBUF 1024
static _Thread_local char g_err[DSP_ERRBUF];

const char *dsp_status_to_string(dsp_status st) {
    switch (st) {
    case DSP_OK: return "ok";
    case DSP_ERR_INVALID_ARG: return "invalid argument";
    case DSP_ERR_IO: return "i/o error";
    case DSP_ERR_FORMAT: return "bad file format";
    case DSP_ERR_UNSUPPORTED: return "unsupported";
    case DSP_ERR_NOMEM: return "out of memory";
    case DSP_ERR_NOT_FOUND: return "not found";
    case DSP_ERR_RANGE: return "out of range";
    case DSP_ERR_TEMPLATE: return "chat template error";
    case DSP_ERR_CANCELLED: return "cancelled";
    case DSP_ERR_BUSY: return "busy";
    case DSP_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

dsp_status dsp_error(dsp_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return st;
}

void dsp_error_prefix(const char *fmt, ...) {
    char pre[DSP_ERRBUF], old[DSP_ERRBUF];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    memcpy(old, g_err, sizeof old);
    /* truncation is fine: the message is for people */
    size_t n = strlen(pre);
    if (n > sizeof g_err - 3) n = sizeof g_err - 3;
    memcpy(g_err, pre, n);
    g_err[n] = ':';
    g_err[n + 1] = ' ';
    size_t m = strlen(old);
    if (m > sizeof g_err - n - 3) m = sizeof g_err - n - 3;
    memcpy(g_err + n + 2, old, m);
    g_err[n + 2 + m] = '\0';
}

void dsp_error_clear(void) { g_err[0] = '\0'; }

const char *dsp_last_error(void) { return g_err; }

void dsp_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "dspark: internal assertion failed: %s (%s:%d)\n", expr, file, line);
    abort();
}
