/* engine/stop: see stop.h. */
#include "engine/stop.h"

#include "core/status.h"

#include <stdlib.h>
#include <string.h>

dsp_status dsp_stop_init(dsp_stop *st, const char *const *stops, int n) {
    memset(st, 0, sizeof *st);
    size_t maxlen = 0;
    for (int i = 0; i < n && stops[i]; i++) {
        if (i >= DSP_MAX_STOP) return dsp_error(DSP_ERR_INVALID_ARG, "stop: at most %d stop strings", DSP_MAX_STOP);
        size_t l = strlen(stops[i]);
        if (!l) continue;
        st->s[st->n] = stops[i];
        st->len[st->n++] = l;
        if (l > maxlen) maxlen = l;
    }
    st->cap = 256 + 2 * maxlen;
    st->buf = malloc(st->cap);
    st->out = malloc(st->cap);
    if (!st->buf || !st->out) {
        dsp_stop_free(st);
        return dsp_error(DSP_ERR_NOMEM, "no memory");
    }
    return DSP_OK;
}

void dsp_stop_free(dsp_stop *st) {
    free(st->buf);
    free(st->out);
    memset(st, 0, sizeof *st);
}

/* longest suffix of p[0..n) that is a proper prefix of some stop string */
static size_t holdback(const dsp_stop *st, const char *p, size_t n) {
    size_t best = 0;
    for (int i = 0; i < st->n; i++) {
        size_t m = st->len[i] - 1 < n ? st->len[i] - 1 : n;
        for (size_t k = m; k > best; k--)
            if (!memcmp(p + n - k, st->s[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

static bool grow(dsp_stop *st, size_t need) {
    if (need <= st->cap) return true;
    size_t nc = need * 2;
    char *nb = realloc(st->buf, nc);
    if (!nb) return false;
    st->buf = nb;
    char *no = realloc(st->out, nc);
    if (!no) return false;
    st->out = no;
    st->cap = nc;
    return true;
}

bool dsp_stop_feed(dsp_stop *st, const char *text, size_t n, const char **emit, size_t *n_emit) {
    *emit = st->out;
    *n_emit = 0;
    if (st->hit) return true;
    if (st->n == 0) { /* nothing to match: pass through */
        *emit = text;
        *n_emit = n;
        return false;
    }
    if (!grow(st, st->n_pend + n)) { /* out of memory: pass through (a split stop may be missed) */
        *emit = text;
        *n_emit = n;
        return false;
    }
    memcpy(st->buf + st->n_pend, text, n);
    size_t len = st->n_pend + n, first = (size_t)-1;
    for (int i = 0; i < st->n; i++)
        for (size_t j = 0; j + st->len[i] <= len && j < first; j++)
            if (!memcmp(st->buf + j, st->s[i], st->len[i])) {
                first = j;
                break;
            }
    if (first != (size_t)-1) {
        st->hit = true;
        memcpy(st->out, st->buf, first);
        *n_emit = first;
        st->n_pend = 0;
        return true;
    }
    size_t h = holdback(st, st->buf, len);
    *n_emit = len - h;
    memcpy(st->out, st->buf, *n_emit);
    memmove(st->buf, st->buf + *n_emit, h);
    st->n_pend = h;
    return false;
}

void dsp_stop_flush(dsp_stop *st, const char **emit, size_t *n_emit) {
    *emit = st->buf;
    *n_emit = st->hit ? 0 : st->n_pend;
    st->n_pend = 0;
}
