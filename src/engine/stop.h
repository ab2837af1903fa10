/* engine/stop: stop-string matching over streamed text.
 *
 * Text arrives in whole UTF-8 characters. The matcher emits every byte that can no longer be the
 * start of a stop string and holds back the longest tail that is still a prefix of one; when a stop
 * string appears, the text before it is emitted and nothing after. So no byte past a stop is ever
 * emitted, including stop strings split across tokens. */
#ifndef DSP_ENGINE_STOP_H
#define DSP_ENGINE_STOP_H

#include "dspark.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct dsp_stop {
    const char *s[DSP_MAX_STOP];
    size_t len[DSP_MAX_STOP];
    int n;
    char *buf;        /* held-back bytes, then the newly fed ones */
    size_t n_pend, cap;
    char *out;        /* what the last call emitted (cap bytes) */
    bool hit;
} dsp_stop;

/* stops: NULL-terminated list (at most DSP_MAX_STOP); empty strings are ignored. */
dsp_status dsp_stop_init(dsp_stop *st, const char *const *stops, int n);
void dsp_stop_free(dsp_stop *st);
/* Feed text; *emit and *n_emit receive the bytes now safe to emit (valid until the next call).
 * Returns true if a stop string was found (then the emitted bytes end right before it). */
bool dsp_stop_feed(dsp_stop *st, const char *text, size_t n, const char **emit, size_t *n_emit);
/* End of generation without a stop: flush everything held back. */
void dsp_stop_flush(dsp_stop *st, const char **emit, size_t *n_emit);

#endif
