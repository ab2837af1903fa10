/* core/log: see log.h. One fprintf per message so lines from different threads do not interleave. */
#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>

static dsp_log_level g_level = DSP_LOG_INFO;

void dsp_log_set_level(dsp_log_level level) { g_level = level; }
dsp_log_level dsp_log_get_level(void) { return g_level; }

void dsp_log(dsp_log_level level, const char *fmt, ...) {
    if (level < g_level) return;
    static const char *tag[] = {"debug", "info", "warn", "error"};
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "dspark %s: %s\n", tag[level], buf);
}
