/* core/log: see log.h. One fprintf per message so lines from different threads do not interleave. */
#include "core/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dsp_log_level g_level = DSP_LOG_INFO;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static const char *const g_names[] = {"debug", "info", "warn", "error", "none"};

/* DSPARK_LOG=debug|info|warn|error|none, once, before the first message or level call: every
 * program linking the library (the CLI, the benchmarks, the tests) honours it. */
static void init_level(void) {
    const char *v = getenv("DSPARK_LOG");
    if (!v || !*v) return;
    for (int i = 0; i <= DSP_LOG_NONE; i++)
        if (!strcmp(v, g_names[i])) {
            g_level = (dsp_log_level)i;
            return;
        }
    fprintf(stderr, "dspark warn: DSPARK_LOG=%s is not one of debug, info, warn, error, none: ignored\n", v);
}

void dsp_log_set_level(dsp_log_level level) {
    pthread_once(&g_once, init_level);
    g_level = level;
}

dsp_log_level dsp_log_get_level(void) {
    pthread_once(&g_once, init_level);
    return g_level;
}

void dsp_log(dsp_log_level level, const char *fmt, ...) {
    pthread_once(&g_once, init_level);
    if (level < g_level) return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "dspark %s: %s\n", g_names[level], buf);
}
