/* core/utf8: see utf8.h. */
#include "core/utf8.h"

#include <stdlib.h>
#include <string.h>

size_t dsp_utf8_seq(const void *sv, size_t n) {
    const uint8_t *s = sv;
    if (n == 0) return 0;
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    /* second-byte ranges exclude overlongs (E0, F0), surrogates (ED) and > U+10FFFF (F4) */
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return 0;
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k < len; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    return len;
}

bool dsp_utf8_valid(const void *sv, size_t n) {
    const uint8_t *s = sv;
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t l = dsp_utf8_seq(s + i, n - i);
        if (!l) return false;
        i += l;
    }
    return true;
}

uint32_t dsp_utf8_decode(const void *sv, size_t n, size_t *len) {
    const uint8_t *s = sv;
    size_t l = n ? dsp_utf8_len(s[0]) : 1;
    if (l > n) {
        if (len) *len = n;
        return DSP_UTF8_BAD;
    }
    if (len) *len = l;
    if (l == 1) return s[0];
    uint32_t cp = s[0] & (0x7F >> l);
    for (size_t i = 1; i < l; i++) cp = (cp << 6) | (s[i] & 0x3F);
    return cp;
}

size_t dsp_utf8_encode(uint32_t cp, char *o) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t dsp_utf8_count(const void *sv, size_t n) {
    const uint8_t *s = sv;
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += (s[i] & 0xC0) != 0x80;
    return c;
}

size_t dsp_utf8_prev(const void *sv, size_t n) {
    const uint8_t *s = sv;
    size_t i = n;
    while (i > 0) {
        i--;
        if ((s[i] & 0xC0) != 0x80) break;
    }
    return i;
}

/* ---- lossy decoding ------------------------------------------------------------------------- */

static const uint8_t k_fffd[3] = {0xEF, 0xBF, 0xBD};

static void state_reset(dsp_utf8_state *st) {
    st->n_pend = st->need = 0;
    st->lo = 0x80;
    st->hi = 0xBF;
}

size_t dsp_utf8_feed(dsp_utf8_state *st, const uint8_t *in, size_t n, uint8_t *out) {
    size_t o = 0;
    if (st->lo == 0) state_reset(st); /* zero-initialized state */
    for (size_t i = 0; i < n; i++) {
        uint8_t b = in[i];
        if (st->need == 0) {
            if (b < 0x80) {
                out[o++] = b;
            } else if (b >= 0xC2 && b <= 0xDF) {
                st->need = 1;
                st->pend[st->n_pend++] = b;
            } else if (b >= 0xE0 && b <= 0xEF) {
                if (b == 0xE0) st->lo = 0xA0;
                if (b == 0xED) st->hi = 0x9F;
                st->need = 2;
                st->pend[st->n_pend++] = b;
            } else if (b >= 0xF0 && b <= 0xF4) {
                if (b == 0xF0) st->lo = 0x90;
                if (b == 0xF4) st->hi = 0x8F;
                st->need = 3;
                st->pend[st->n_pend++] = b;
            } else {
                memcpy(out + o, k_fffd, 3);
                o += 3;
            }
            continue;
        }
        if (b < st->lo || b > st->hi) { /* the maximal subpart so far is one U+FFFD; b starts afresh */
            state_reset(st);
            memcpy(out + o, k_fffd, 3);
            o += 3;
            i--;
            continue;
        }
        st->lo = 0x80;
        st->hi = 0xBF;
        st->pend[st->n_pend++] = b;
        if (st->n_pend == st->need + 1) {
            memcpy(out + o, st->pend, st->n_pend);
            o += st->n_pend;
            state_reset(st);
        }
    }
    return o;
}

size_t dsp_utf8_finish(dsp_utf8_state *st, uint8_t *out) {
    size_t o = 0;
    if (st->lo != 0 && st->need) {
        memcpy(out, k_fffd, 3);
        o = 3;
    }
    state_reset(st);
    return o;
}

char *dsp_utf8_sanitize(const char *s, size_t n, size_t *out_len) {
    *out_len = 0;
    if (n > (SIZE_MAX - 5) / 3) return NULL;
    char *t = malloc(3 * n + 5);
    if (!t) return NULL;
    dsp_utf8_state st = {0};
    size_t o = dsp_utf8_feed(&st, (const uint8_t *)s, n, (uint8_t *)t);
    o += dsp_utf8_finish(&st, (uint8_t *)t + o);
    t[o] = '\0';
    *out_len = o;
    return t;
}
