/* tok/nfc: see nfc.h. Code points are held as cp | ccc << 24 while normalizing, so that ordering
 * and composition never look a combining class up twice. */
#include "tok/nfc.h"

#include "core/utf8.h"
#include "tok/nfc_table.h"

#include <stdlib.h>
#include <string.h>

#define S_BASE 0xAC00u /* Hangul syllables */
#define S_COUNT 11172u
#define L_BASE 0x1100u
#define V_BASE 0x1161u
#define T_BASE 0x11A7u /* T_BASE itself is "no final consonant" */
#define L_COUNT 19u
#define V_COUNT 21u
#define T_COUNT 28u
#define CP_MASK 0x1FFFFFu
#define PAIR_MASK ((UINT64_C(1) << 42) - 1)
#define N(a) (sizeof(a) / sizeof((a)[0]))

enum { QC_YES, QC_MAYBE, QC_NO };

void dsp_nfc_scratch_free(dsp_nfc_scratch *sc) {
    free(sc->cp);
    free(sc->tmp);
    free(sc->out);
    memset(sc, 0, sizeof *sc);
}

/* ---- table lookups --------------------------------------------------------------------------- */

static inline bool in_block(uint32_t cp) { return cp < 0x110000 && (nfc_block[cp >> 11] >> ((cp >> 8) & 7)) & 1; }

static uint8_t ccc_of(uint32_t cp) {
    if (cp < 0x300 || !in_block(cp)) return 0;
    size_t lo = 0, hi = N(nfc_ccc);
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        uint32_t c = nfc_ccc[m] >> 8;
        if (c == cp) return (uint8_t)(nfc_ccc[m] & 0xFF);
        if (c < cp) lo = m + 1;
        else hi = m;
    }
    return 0;
}

/* index into nfc_decomp, or -1 */
static long decomp_find(uint32_t cp) {
    if (cp < 0xC0 || !in_block(cp)) return -1;
    size_t lo = 0, hi = N(nfc_decomp);
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        uint32_t c = (uint32_t)(nfc_decomp[m] >> 42) & CP_MASK;
        if (c == cp) return (long)m;
        if (c < cp) lo = m + 1;
        else hi = m;
    }
    return -1;
}

static bool is_maybe(uint32_t cp) {
    size_t lo = 0, hi = N(nfc_maybe);
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if (nfc_maybe[m] == cp) return true;
        if (nfc_maybe[m] < cp) lo = m + 1;
        else hi = m;
    }
    return false;
}

static int qc_of(uint32_t cp) {
    if (cp < 0x300 || !in_block(cp)) return QC_YES;
    long k = decomp_find(cp);
    if (k >= 0 && (nfc_decomp[k] >> 63)) return QC_NO;
    return is_maybe(cp) ? QC_MAYBE : QC_YES;
}

/* the primary composite of a + b, or 0 */
static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE && b < T_BASE + T_COUNT)
        return a + (b - T_BASE);
    uint64_t key = (uint64_t)a << 21 | b;
    size_t lo = 0, hi = N(nfc_comp);
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        uint64_t e = nfc_decomp[nfc_comp[m]];
        if ((e & PAIR_MASK) == key) return (uint32_t)(e >> 42) & CP_MASK;
        if ((e & PAIR_MASK) < key) lo = m + 1;
        else hi = m;
    }
    return 0;
}

/* ---- UTF-8 (the text is valid) --------------------------------------------------------------- */

static inline uint32_t next_cp(const uint8_t *s, size_t n, size_t *i) {
    size_t l;
    uint32_t cp = dsp_utf8_decode(s + *i, n - *i, &l);
    *i += l;
    return cp;
}

/* ---- quick check ----------------------------------------------------------------------------- */

/* n when s is NFC by the quick check; else the offset of the last normalization boundary (a
 * character with class 0 and quick check Yes, which nothing before it can compose or reorder
 * with) at or before the first character that fails it, and that character's offset in *bad. */
static size_t qc_scan(const uint8_t *s, size_t n, size_t *bad) {
    size_t i = 0, boundary = 0;
    uint8_t last = 0;
    while (i < n) {
        if (i + 8 <= n) { /* eight ASCII bytes at once */
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & UINT64_C(0x8080808080808080))) {
                i += 8;
                boundary = i - 1, last = 0;
                continue;
            }
        }
        size_t at = i;
        if (s[i] < 0xCC) { /* below U+0300: class 0, quick check Yes */
            i += s[i] < 0x80 ? 1 : 2;
            boundary = at, last = 0;
            continue;
        }
        uint32_t cp = next_cp(s, n, &i);
        if (!in_block(cp)) {
            boundary = at, last = 0;
            continue;
        }
        uint8_t cc = ccc_of(cp);
        if ((cc && last > cc) || qc_of(cp) != QC_YES) {
            *bad = at;
            return boundary;
        }
        if (!cc) boundary = at;
        last = cc;
    }
    return n;
}

/* the first normalization boundary after the character at i, or n */
static size_t next_boundary(const uint8_t *s, size_t i, size_t n) {
    next_cp(s, n, &i);
    while (i < n) {
        size_t at = i;
        uint32_t cp = next_cp(s, n, &i);
        if (cp < 0x300 || !in_block(cp) || (!ccc_of(cp) && qc_of(cp) == QC_YES)) return at;
    }
    return n;
}

bool dsp_nfc_quick_check(const char *s, size_t n) {
    size_t bad;
    return qc_scan((const uint8_t *)s, n, &bad) == n;
}

/* ---- normalization --------------------------------------------------------------------------- */

static void decompose(uint32_t cp, uint32_t *out, size_t *n) {
    if (cp >= S_BASE && cp < S_BASE + S_COUNT) {
        uint32_t si = cp - S_BASE;
        out[(*n)++] = L_BASE + si / (V_COUNT * T_COUNT);
        out[(*n)++] = V_BASE + (si % (V_COUNT * T_COUNT)) / T_COUNT;
        if (si % T_COUNT) out[(*n)++] = T_BASE + si % T_COUNT;
        return;
    }
    long k = decomp_find(cp);
    if (k < 0) {
        out[(*n)++] = cp | (uint32_t)ccc_of(cp) << 24;
        return;
    }
    decompose((uint32_t)(nfc_decomp[k] >> 21) & CP_MASK, out, n);
    uint32_t b = (uint32_t)nfc_decomp[k] & CP_MASK;
    if (b) decompose(b, out, n);
}

/* Canonical ordering: every run of non-zero classes sorted by class, stably. Long runs take a
 * counting sort through tmp (room for n), so that text made of thousands of marks stays linear. */
static void reorder(uint32_t *c, size_t n, uint32_t *tmp) {
    for (size_t i = 0; i < n;) {
        if (!(c[i] >> 24)) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < n && (c[j] >> 24)) j++;
        if (j - i <= 32) {
            for (size_t k = i + 1; k < j; k++) {
                uint32_t x = c[k];
                size_t m = k;
                while (m > i && (c[m - 1] >> 24) > (x >> 24)) c[m] = c[m - 1], m--;
                c[m] = x;
            }
        } else {
            size_t at[256] = {0}, sum = 0;
            for (size_t k = i; k < j; k++) at[c[k] >> 24]++;
            for (int cl = 0; cl < 256; cl++) {
                size_t cnt = at[cl];
                at[cl] = sum;
                sum += cnt;
            }
            for (size_t k = i; k < j; k++) tmp[at[c[k] >> 24]++] = c[k];
            memcpy(c + i, tmp, (j - i) * sizeof *c);
        }
        i = j;
    }
}

static size_t compose_all(uint32_t *c, size_t n) {
    size_t w = 0;
    long starter = -1;
    for (size_t r = 0; r < n; r++) {
        uint32_t x = c[r], cc = x >> 24;
        if (starter >= 0) {
            bool adjacent = (size_t)starter + 1 == w;
            uint32_t last = c[w - 1] >> 24;
            if (adjacent || (last != 0 && last < cc)) { /* not blocked */
                uint32_t p = compose(c[starter] & CP_MASK, x & CP_MASK);
                if (p) { /* a composite is a starter (tools/gen_nfc_table.py checks) */
                    c[starter] = p;
                    continue;
                }
            }
        }
        if (cc == 0) starter = (long)w;
        c[w++] = x;
    }
    return w;
}

static dsp_status reserve(void **p, size_t *cap, size_t need, size_t el) {
    if (need <= *cap) return DSP_OK;
    size_t nc = *cap ? *cap : 256;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, nc * el);
    if (!q) return dsp_error(DSP_ERR_NOMEM, "NFC: no memory for %zu code points", need);
    *p = q;
    *cap = nc;
    return DSP_OK;
}

/* append s[0..n) to sc->out at *o */
static dsp_status append(dsp_nfc_scratch *sc, size_t *o, const char *s, size_t n, size_t max_out) {
    if (n > max_out - *o) return dsp_error(DSP_ERR_RANGE, "NFC: the normalized text is longer than %zu bytes", max_out);
    dsp_status st = reserve((void **)&sc->out, &sc->out_cap, *o + n + 1, 1);
    if (st) return st;
    memcpy(sc->out + *o, s, n);
    *o += n;
    return DSP_OK;
}

/* NFC of s[0..n), a stretch between normalization boundaries, appended at *o */
static dsp_status normalize_span(dsp_nfc_scratch *sc, const uint8_t *s, size_t n, size_t *o, size_t max_out) {
    dsp_status st;
    size_t ncp = 0;
    for (size_t i = 0; i < n;) {
        if (ncp + DSP_NFC_MAX_DECOMP > sc->cp_cap &&
            (st = reserve((void **)&sc->cp, &sc->cp_cap, ncp + DSP_NFC_MAX_DECOMP + (n - i), sizeof *sc->cp)))
            return st;
        decompose(next_cp(s, n, &i), sc->cp, &ncp);
    }
    if ((st = reserve((void **)&sc->tmp, &sc->tmp_cap, ncp, sizeof *sc->tmp))) return st;
    reorder(sc->cp, ncp, sc->tmp);
    ncp = compose_all(sc->cp, ncp);
    char buf[4];
    for (size_t k = 0; k < ncp; k++)
        if ((st = append(sc, o, buf, dsp_utf8_encode(sc->cp[k] & CP_MASK, buf), max_out))) return st;
    return DSP_OK;
}

dsp_status dsp_nfc_normalize(const char *s, size_t n, size_t max_out, dsp_nfc_scratch *sc, const char **out, size_t *out_len) {
    const uint8_t *u = (const uint8_t *)s;
    size_t pos = 0, o = 0, bad;
    dsp_status st;
    /* copy what passes the quick check, normalize each stretch around a character that fails it */
    for (;;) {
        size_t b = pos + qc_scan(u + pos, n - pos, &bad);
        if (b == n) {
            if (pos == 0) {
                *out = s, *out_len = n;
                return DSP_OK;
            }
            if ((st = append(sc, &o, s + pos, n - pos, max_out))) return st;
            break;
        }
        size_t e = next_boundary(u, pos + bad, n);
        if ((st = append(sc, &o, s + pos, b - pos, max_out)) || (st = normalize_span(sc, u + b, e - b, &o, max_out))) return st;
        pos = e;
        if (pos == n) break;
    }
    sc->out[o] = '\0';
    *out = sc->out, *out_len = o;
    return DSP_OK;
}
