/* sample/sample: logit processors, processed distribution, samplers, logprobs. See sample.h for
 * the pipeline and its semantics; this file owns the algorithms:
 *   - float -> ordered uint32 keys and an exact select of the k-th largest key: a lower bound
 *     from the maxima of 64-key blocks, then a radix select (three passes of 11/11/10 bits) over
 *     the keys above it; O(n), no sort, result independent of input order;
 *   - penalties from counts rebuilt in scratch over the history windows, then zeroed again
 *     (invariant: scratch gen_count / win_count are all zero between calls);
 *   - top-p by sorting only a growing top-m prefix (m = 64, x8, ...) until the mass is reached;
 *     small prefixes by qsort, large ones by a stable LSD radix sort (same order, O(n));
 *   - step 6 over a whole row (no top-k) through the CPU kernel table (backend/cpu/ops.h,
 *     sample_*: weights with the own exp, masses, p, keys), vectorized where the CPU allows and
 *     bit-identical in every table; with top-k, over the few survivors one by one here.
 * Nothing here allocates, uses globals or threads; every sum has a fixed order. */
#include "sample/sample.h"

#include "backend/cpu/ops.h"
#include "sample/sample_kernels.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DSP_SAMPLE_MAX_VOCAB (1 << 24)
#define KB DSP_SAMPLE_KEY_BLOCK /* keys per block of the block maxima (64) */

/* ---- params, history ------------------------------------------------------------------------ */

dsp_sample_params dsp_sample_params_default(void) {
    dsp_sample_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repetition_penalty = 1.0f;
    p.repetition_last_n = 64;
    return p;
}

bool dsp_sample_params_plain_greedy(const dsp_sample_params *p) {
    return p->temperature == 0.0f && p->n_logit_bias == 0 && (p->repetition_penalty == 1.0f || p->repetition_last_n == 0) &&
           p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f;
}

dsp_status dsp_sample_params_validate(const dsp_sample_params *p, int32_t n_vocab) {
    if (!p) return dsp_error(DSP_ERR_INVALID_ARG, "sample params: NULL");
    if (n_vocab < 1 || n_vocab > DSP_SAMPLE_MAX_VOCAB)
        return dsp_error(DSP_ERR_INVALID_ARG, "sample: vocabulary size %d out of [1, %d]", n_vocab,
                         DSP_SAMPLE_MAX_VOCAB);
    if (!(p->temperature >= 0.0f && p->temperature <= FLT_MAX))
        return dsp_error(DSP_ERR_INVALID_ARG, "temperature %g: must be finite and >= 0",
                         (double)p->temperature);
    if (p->top_k < 0)
        return dsp_error(DSP_ERR_INVALID_ARG, "top_k %d: must be >= 0 (0 disables)", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return dsp_error(DSP_ERR_INVALID_ARG, "top_p %g: must be in (0, 1]", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return dsp_error(DSP_ERR_INVALID_ARG, "min_p %g: must be in [0, 1]", (double)p->min_p);
    if (!(fabsf(p->presence_penalty) <= DSP_SAMPLE_PENALTY_LIMIT))
        return dsp_error(DSP_ERR_INVALID_ARG, "presence_penalty %g: must be in [-2, 2]",
                         (double)p->presence_penalty);
    if (!(fabsf(p->frequency_penalty) <= DSP_SAMPLE_PENALTY_LIMIT))
        return dsp_error(DSP_ERR_INVALID_ARG, "frequency_penalty %g: must be in [-2, 2]",
                         (double)p->frequency_penalty);
    if (!(p->repetition_penalty > 0.0f && p->repetition_penalty <= FLT_MAX))
        return dsp_error(DSP_ERR_INVALID_ARG, "repetition_penalty %g: must be finite and > 0",
                         (double)p->repetition_penalty);
    if (p->repetition_last_n < -1)
        return dsp_error(DSP_ERR_INVALID_ARG,
                         "repetition_last_n %d: must be >= -1 (-1 = whole history, 0 = off)",
                         p->repetition_last_n);
    if (p->n_logit_bias > DSP_SAMPLE_MAX_BIAS)
        return dsp_error(DSP_ERR_INVALID_ARG, "logit_bias: %u entries, at most %d", p->n_logit_bias,
                         DSP_SAMPLE_MAX_BIAS);
    if (p->n_logit_bias && !p->logit_bias)
        return dsp_error(DSP_ERR_INVALID_ARG, "logit_bias: %u entries but no array", p->n_logit_bias);
    for (uint32_t i = 0; i < p->n_logit_bias; i++) {
        const dsp_sample_bias *b = &p->logit_bias[i];
        if (b->token < 0 || b->token >= n_vocab)
            return dsp_error(DSP_ERR_INVALID_ARG, "logit_bias[%u]: token %d outside the vocabulary (%d)",
                             i, b->token, n_vocab);
        if (!(fabsf(b->bias) <= DSP_SAMPLE_BIAS_LIMIT))
            return dsp_error(DSP_ERR_INVALID_ARG, "logit_bias[%u] (token %d): bias %g not in [-100, 100]",
                             i, b->token, (double)b->bias);
    }
    return DSP_OK;
}

dsp_status dsp_sample_history_init(dsp_sample_history *h, int32_t *buf, uint32_t cap, uint32_t n_prompt) {
    if (!h || (!buf && cap)) return dsp_error(DSP_ERR_INVALID_ARG, "sample history: NULL buffer");
    if (n_prompt > cap)
        return dsp_error(DSP_ERR_RANGE, "sample history: prompt of %u tokens exceeds capacity %u",
                         n_prompt, cap);
    h->tokens = buf;
    h->cap = cap;
    h->len = n_prompt;
    h->n_prompt = n_prompt;
    return DSP_OK;
}

dsp_status dsp_sample_history_push(dsp_sample_history *h, int32_t token) {
    if (h->len >= h->cap)
        return dsp_error(DSP_ERR_RANGE, "sample history: full (%u tokens)", h->cap);
    h->tokens[h->len++] = token;
    return DSP_OK;
}

dsp_status dsp_sample_history_pop(dsp_sample_history *h, uint32_t n) {
    if (n > h->len - h->n_prompt)
        return dsp_error(DSP_ERR_RANGE, "sample history: cannot pop %u of %u generated tokens", n,
                         h->len - h->n_prompt);
    h->len -= n;
    return DSP_OK;
}

/* ---- buffers -------------------------------------------------------------------------------- */

static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }
/* blocks of KB keys; scratch tmp: up to V keys, then two lists of block maxima (kth_largest) */
static size_t n_blocks(size_t n) { return (n + KB - 1) / KB; }
static size_t tmp_len(size_t v) { return v + 2 * n_blocks(v); }

size_t dsp_sample_scratch_bytes(int32_t n_vocab) {
    if (n_vocab < 1 || n_vocab > DSP_SAMPLE_MAX_VOCAB) return 0;
    size_t v = (size_t)n_vocab;
    return align16(v * sizeof(double)) + align16(2 * v * sizeof(uint64_t)) + 4 * align16(v * sizeof(uint32_t)) +
           align16(tmp_len(v) * sizeof(uint32_t));
}

dsp_status dsp_sample_scratch_init(dsp_sample_scratch *s, void *mem, size_t bytes, int32_t n_vocab) {
    size_t need = dsp_sample_scratch_bytes(n_vocab);
    if (!need) return dsp_error(DSP_ERR_INVALID_ARG, "sample scratch: vocabulary size %d", n_vocab);
    if (!s || !mem || bytes < need || ((uintptr_t)mem & 15))
        return dsp_error(DSP_ERR_INVALID_ARG,
                         "sample scratch: need %zu bytes, 16-byte aligned (got %zu at %p)", need,
                         bytes, mem);
    size_t v = (size_t)n_vocab;
    char *m = mem;
    s->n_vocab = n_vocab;
    s->ops = dsp_cpu_ops_best();
    s->w = (double *)(void *)m;
    m += align16(v * sizeof(double));
    s->key = (uint32_t *)(void *)m;
    m += align16(v * sizeof(uint32_t));
    s->id = (int32_t *)(void *)m;
    m += align16(v * sizeof(uint32_t));
    s->items = (uint64_t *)(void *)m;
    m += align16(2 * v * sizeof(uint64_t));
    s->tmp = (uint32_t *)(void *)m;
    m += align16(tmp_len(v) * sizeof(uint32_t));
    s->gen_count = (uint32_t *)(void *)m;
    m += align16(v * sizeof(uint32_t));
    s->win_count = (uint32_t *)(void *)m;
    memset(s->gen_count, 0, v * sizeof(uint32_t));
    memset(s->win_count, 0, v * sizeof(uint32_t));
    return DSP_OK;
}

size_t dsp_sample_dist_bytes(int32_t n_vocab) {
    if (n_vocab < 1 || n_vocab > DSP_SAMPLE_MAX_VOCAB) return 0;
    return 3 * align16((size_t)n_vocab * 4);
}

dsp_status dsp_sample_dist_init(dsp_sample_dist *d, void *mem, size_t bytes, int32_t n_vocab) {
    size_t need = dsp_sample_dist_bytes(n_vocab);
    if (!need) return dsp_error(DSP_ERR_INVALID_ARG, "sample dist: vocabulary size %d", n_vocab);
    if (!d || !mem || bytes < need || ((uintptr_t)mem & 15))
        return dsp_error(DSP_ERR_INVALID_ARG,
                         "sample dist: need %zu bytes, 16-byte aligned (got %zu at %p)", need, bytes,
                         mem);
    char *m = mem;
    size_t part = align16((size_t)n_vocab * 4);
    memset(d, 0, sizeof *d);
    d->n_vocab = n_vocab;
    d->logits = (float *)(void *)m;
    d->p = (float *)(void *)(m + part);
    d->kept = (int32_t *)(void *)(m + 2 * part);
    return DSP_OK;
}

/* ---- selection ------------------------------------------------------------------------------ */

/* NaN -> -inf, +inf -> FLT_MAX (sample.h step 0). */
static float read_logit(float x) {
    if (x != x) return -INFINITY;
    if (x > FLT_MAX) return FLT_MAX;
    return x;
}

int32_t dsp_sample_argmax(const float *logits, int32_t n_vocab) {
    int32_t best = 0;
    float bv = -INFINITY;
    for (int32_t i = 0; i < n_vocab; i++) {
        /* only a value above the best can win once read (NaN and -inf never are; +inf is read as
         * FLT_MAX), so the common case is one comparison */
        if (!(logits[i] > bv)) continue;
        const float z = read_logit(logits[i]);
        if (z > bv) bv = z, best = i;
    }
    return bv == -INFINITY ? -1 : best;
}

/* The float with key k (+0 for the key of -0 and +0): for a non-NaN z, dsp_sample_key(z) >= k iff
 * z >= funkey(k), which lets the kernels compare logits instead of keys. */
static float funkey(uint32_t k) {
    uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* One digit of radix_kth_largest: count, find the bucket holding the k-th largest of t[0, *n),
 * keep only that bucket (*n, *k updated); returns the bucket. Large inputs count into four
 * interleaved tables: logits put long runs into a few buckets, and one table would make each
 * increment wait for the previous one to the same counter. */
static inline uint32_t radix_digit(uint32_t *t, size_t *n_io, size_t *k_io, int shift, uint32_t mask) {
    uint32_t h[4][2048];
    const size_t n = *n_io, nt = n >= 4096 ? 4 : 1;
    for (size_t j = 0; j < nt; j++) memset(h[j], 0, ((size_t)mask + 1) * sizeof h[j][0]);
    size_t i = 0;
    if (nt == 4)
        for (; i + 4 <= n; i += 4) {
            h[0][(t[i] >> shift) & mask]++;
            h[1][(t[i + 1] >> shift) & mask]++;
            h[2][(t[i + 2] >> shift) & mask]++;
            h[3][(t[i + 3] >> shift) & mask]++;
        }
    for (; i < n; i++) h[0][(t[i] >> shift) & mask]++;
    uint32_t b = mask;
    size_t above = 0, k = *k_io;
    for (;; b--) {
        size_t c = h[0][b];
        for (size_t j = 1; j < nt; j++) c += h[j][b];
        if (above + c >= k) break;
        above += c;
        if (b == 0) break; /* unreachable when 1 <= k <= n */
    }
    size_t m = 0;
    for (size_t i0 = 0; i0 < n; i0 += 64) {
        const size_t i1 = n - i0 < 64 ? n : i0 + 64;
        int any = 0; /* vectorizable; the bucket is usually small */
        for (i = i0; i < i1; i++) any |= ((t[i] >> shift) & mask) == b;
        if (!any) continue;
        for (i = i0; i < i1; i++) {
            t[m] = t[i];
            m += ((t[i] >> shift) & mask) == b;
        }
    }
    *n_io = m;
    *k_io = k - above;
    return b;
}

/* The k-th largest (1 <= k <= n) of t[0, n); t is clobbered. MSD radix select over digits of
 * 11, 11 and 10 bits. */
static uint32_t radix_kth_largest(uint32_t *t, size_t n, size_t k) {
    uint32_t r = radix_digit(t, &n, &k, 21, 0x7ff) << 21;
    r |= radix_digit(t, &n, &k, 10, 0x7ff) << 10;
    return r | radix_digit(t, &n, &k, 0, 0x3ff);
}

/* bm[b] = the largest of key[KB b, KB b + KB) (fewer in the last block), for keys at hand (the
 * kernels' sample_keys makes both from the logits) */
static void block_max(const uint32_t *key, size_t n, uint32_t *bm) {
    for (size_t b = 0; b < n_blocks(n); b++) {
        const size_t j0 = b * KB, j1 = n - j0 < KB ? n : j0 + KB;
        uint32_t mx = 0;
        for (size_t j = j0; j < j1; j++) mx = key[j] > mx ? key[j] : mx;
        bm[b] = mx;
    }
}

/* The k-th largest (1 <= k <= n) of key[0, n) (unchanged), given its block maxima bm; tmp holds
 * n + n_blocks(n) uint32.
 * When k is at most the number of blocks: tau = the k-th largest block maximum is a lower bound
 * (k blocks each hold a key >= tau), so the answer is the k-th largest of the keys >= tau, which
 * lie in the blocks whose maximum is >= tau: usually a few hundred keys. Otherwise radix select
 * over them all. Either way the k-th largest value, exactly. */
static uint32_t kth_largest(const uint32_t *key, const uint32_t *bm, size_t n, size_t k, uint32_t *tmp) {
    const size_t nb = n_blocks(n);
    if (k > nb) {
        memcpy(tmp, key, n * sizeof *tmp);
        return radix_kth_largest(tmp, n, k);
    }
    memcpy(tmp + n, bm, nb * sizeof *tmp);
    const uint32_t tau = radix_kth_largest(tmp + n, nb, k);
    size_t m = 0;
    for (size_t b = 0; b < nb; b++) {
        if (bm[b] < tau) continue;
        const size_t j1 = n - b * KB < KB ? n : b * KB + KB;
        for (size_t j = b * KB; j < j1; j++) {
            tmp[m] = key[j];
            m += key[j] >= tau;
        }
    }
    return radix_kth_largest(tmp, m, k);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Sort a[0, n) ascending. The items are (~key << 32 | j), gathered in ascending j, so sorting on
 * the high half alone with a stable LSD radix sort gives the same order as a full sort: (key
 * desc, id asc), a total order, hence a unique result whichever path runs. Result in a; b is a
 * buffer of n items. */
static void sort_items(uint64_t *a, uint64_t *b, size_t n) {
    if (n < 1024) {
        qsort(a, n, sizeof *a, cmp_u64);
        return;
    }
    static const int shift[3] = {32, 43, 54};
    static const uint32_t mask[3] = {0x7ff, 0x7ff, 0x3ff};
    uint64_t *src = a, *dst = b;
    for (int pass = 0; pass < 3; pass++) {
        size_t pos[2048] = {0};
        for (size_t i = 0; i < n; i++) pos[(src[i] >> shift[pass]) & mask[pass]]++;
        size_t sum = 0;
        for (uint32_t d = 0; d <= mask[pass]; d++) {
            size_t c = pos[d];
            pos[d] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++) dst[pos[(src[i] >> shift[pass]) & mask[pass]]++] = src[i];
        uint64_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != a) memcpy(a, src, n * sizeof *a); /* odd pass count: the result is in b */
}

/* Top-p over the candidates j < n (ascending id) with keys key[j] (block maxima bm) and weights
 * w[j], whose weights sum (ascending) to total: the key of the last token to keep; every token
 * with a key >= it is kept (sample.h step 6). tmp holds n + n_blocks(n) uint32, items 2n uint64.
 * The result is the key where the running sum in (key desc, id asc) order first reaches the
 * target, or 0 (keep all) if it never does: a function of the candidates alone, not of how many
 * are gathered per round. So tokens with a -inf logit may be passed or not: they come last in
 * that order and add 0, and the answer is the same. */
static uint32_t top_p_threshold(const uint32_t *key, const uint32_t *bm, const double *w, size_t n, double total,
                                double top_p, uint32_t *tmp, uint64_t *items) {
    const double target = top_p * total;
    size_t m = n < 64 ? n : 64;
    for (;;) {
        const uint32_t thr = kth_largest(key, bm, n, m, tmp);
        size_t ng = 0;
        for (size_t b = 0; b < n_blocks(n); b++) {
            if (bm[b] < thr) continue; /* most blocks hold nothing to gather */
            const size_t j1 = n - b * KB < KB ? n : b * KB + KB;
            for (size_t j = b * KB; j < j1; j++)
                if (key[j] >= thr) items[ng++] = ((uint64_t)~key[j] << 32) | (uint64_t)j;
        }
        sort_items(items, items + n, ng);
        double cum = 0.0;
        for (size_t i = 0; i < ng; i++) {
            const uint32_t j = (uint32_t)items[i];
            cum += w[j];
            if (cum >= target) return key[j];
        }
        /* The gathered prefix holds less than the target: widen it. With everything gathered
         * (rounding left cum a hair below target) keep everything. */
        if (ng == n) return 0;
        m = n / 8 < m ? n : m * 8;
    }
}

/* ---- processing ----------------------------------------------------------------------------- */

/* Steps 2-4 of sample.h. Counts are built in scratch over the window positions, applied once per
 * distinct token (a token's counts are zeroed when applied, so later visits skip it), which also
 * restores the all-zero invariant. */
static dsp_status apply_penalties(float *z, int32_t n_vocab, const dsp_sample_history *h,
                                  const dsp_sample_params *p, dsp_sample_scratch *s) {
    const bool rep_on = p->repetition_penalty != 1.0f && p->repetition_last_n != 0;
    const bool pf_on = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    if (!h || h->len == 0 || (!rep_on && !pf_on)) return DSP_OK;
    if (h->len > h->cap || h->n_prompt > h->len || !h->tokens)
        return dsp_error(DSP_ERR_INVALID_ARG, "sample history: len %u, n_prompt %u, cap %u inconsistent",
                         h->len, h->n_prompt, h->cap);
    const uint32_t len = h->len;
    const uint32_t gen_start = pf_on ? h->n_prompt : len;
    uint32_t win_start = len;
    if (rep_on)
        win_start = (p->repetition_last_n < 0 || (uint32_t)p->repetition_last_n >= len)
                        ? 0 : len - (uint32_t)p->repetition_last_n;
    const uint32_t start = gen_start < win_start ? gen_start : win_start;
    const int32_t *tok = h->tokens;
    for (uint32_t i = start; i < len; i++)
        if (tok[i] < 0 || tok[i] >= n_vocab)
            return dsp_error(DSP_ERR_INVALID_ARG,
                             "sample history: token %d at position %u outside the vocabulary (%d)",
                             tok[i], i, n_vocab);
    uint32_t *gen = s->gen_count, *win = s->win_count;
    for (uint32_t i = start; i < len; i++) {
        if (i >= gen_start) gen[tok[i]]++;
        if (i >= win_start) win[tok[i]]++;
    }
    const float rp = p->repetition_penalty, fp = p->frequency_penalty, pp = p->presence_penalty;
    for (uint32_t i = start; i < len; i++) {
        const int32_t t = tok[i];
        const uint32_t g = gen[t], w = win[t];
        if (!g && !w) continue;
        float x = z[t];
        if (w) x = x > 0.0f ? x / rp : x * rp;
        if (g) {
            x = x - (float)g * fp;
            x = x - pp;
        }
        /* a penalty below 1 can take FLT_MAX past the float range: step 0's rule again, or the
         * token would be +inf and step 6 would keep nothing */
        z[t] = x > FLT_MAX ? FLT_MAX : x;
        gen[t] = 0;
        win[t] = 0;
    }
    return DSP_OK;
}

dsp_status dsp_sample_process(const float *logits, const dsp_sample_history *h,
                              const dsp_sample_params *prm, dsp_sample_scratch *s,
                              dsp_sample_dist *d) {
    if (!logits || !prm || !s || !d || !d->logits)
        return dsp_error(DSP_ERR_INVALID_ARG, "sample: NULL argument");
    const int32_t V = d->n_vocab;
    if (s->n_vocab != V)
        return dsp_error(DSP_ERR_INVALID_ARG, "sample: scratch sized for %d tokens, dist for %d",
                         s->n_vocab, V);
    dsp_status st = dsp_sample_params_validate(prm, V);
    if (st) return st;

    /* steps 0-4 */
    float *z = d->logits;
    for (int32_t i = 0; i < V; i++) z[i] = read_logit(logits[i]);
    for (uint32_t j = 0; j < prm->n_logit_bias; j++) z[prm->logit_bias[j].token] += prm->logit_bias[j].bias;
    st = apply_penalties(z, V, h, prm, s);
    if (st) return st;

    /* the kernels are bit-identical in every table (ops.h); the table is only a matter of speed */
    const dsp_cpu_ops *o = s->ops ? s->ops : dsp_cpu_ops_best();
    int64_t best = o->argmax(z, V);
    if (best < 0)
        return dsp_error(DSP_ERR_INVALID_ARG,
                         "logits: none of the %d values is finite (NaN counts as -inf)", V);
    /* The kernel reads +inf as FLT_MAX (step 0's rule), but a penalty can overflow a processed
     * logit to +inf (FLT_MAX / a repetition penalty < 1), which is larger: then the first +inf
     * is the argmax. Both lie at or after the kernel's answer. */
    if (z[best] == FLT_MAX)
        for (int64_t i = best; i < V; i++)
            if (z[i] == INFINITY) {
                best = i;
                break;
            }
    d->argmax = (int32_t)best;
    d->temperature = prm->temperature;

    if (prm->temperature == 0.0f) { /* step 5 */
        memset(d->p, 0, (size_t)V * sizeof *d->p);
        d->greedy = true;
        d->p[best] = 1.0f;
        d->kept[0] = (int32_t)best;
        d->n_kept = 1;
        d->log_mass = 0.0;
        d->p_sum = 1.0;
        return DSP_OK;
    }
    d->greedy = false;

    /* step 6. Every rule keeps a token iff key >= a threshold (top-k, top-p; 0 = off) and
     * w > 0 && w >= min_w, so the kept set, its mass and p are filters over the candidates in
     * ascending id, whichever way the candidates are held. */
    const double zmax = (double)z[best], T = (double)prm->temperature, min_w = (double)prm->min_p;
    const bool top_p_on = prm->top_p < 1.0f;
    double mass = 0.0, psum = 0.0;
    int32_t nk = 0;
    if (prm->top_k > 0 && prm->top_k < V) {
        /* top-k: the candidates are the few survivors, gathered (ascending id) with their weights */
        uint32_t *key = s->key, *bm = s->tmp + V + n_blocks((size_t)V);
        o->sample_keys(z, V, key, bm);
        const uint32_t k_thr = kth_largest(key, bm, (size_t)V, (size_t)prm->top_k, s->tmp);
        double *w = s->w;
        int32_t *id = s->id;
        size_t n = 0; /* key[] is compacted in place: n <= i */
        for (int32_t i0 = 0; i0 < V; i0 += KB) {
            if (bm[i0 / KB] < k_thr) continue; /* survivors are rare */
            const int32_t i1 = V - i0 < KB ? V : i0 + KB;
            for (int32_t i = i0; i < i1; i++) {
                if (key[i] < k_thr || z[i] == -INFINITY) continue;
                w[n] = dsp_sample_exp(((double)z[i] - zmax) / T);
                key[n] = key[i];
                id[n] = i;
                n++;
            }
        }
        uint32_t p_thr = 0;
        if (top_p_on) {
            double total = 0.0;
            for (size_t j = 0; j < n; j++) total += w[j];
            uint32_t *cbm = s->tmp + n + n_blocks(n);
            block_max(key, n, cbm);
            p_thr = top_p_threshold(key, cbm, w, n, total, (double)prm->top_p, s->tmp, s->items);
        }
        /* min-p, and drop underflowed weights; w_max = 1 (exp(0)) so the bound is min_p itself */
        for (size_t j = 0; j < n; j++)
            if (key[j] >= p_thr && w[j] > 0.0 && w[j] >= min_w) mass += w[j];
        memset(d->p, 0, (size_t)V * sizeof *d->p);
        for (size_t j = 0; j < n; j++) {
            if (!(key[j] >= p_thr && w[j] > 0.0 && w[j] >= min_w)) continue;
            float pj = (float)(w[j] / mass);
            if (pj > 0.0f) {
                d->p[id[j]] = pj;
                d->kept[nk++] = id[j];
                psum += (double)pj;
            }
        }
    } else {
        /* every token is a candidate (a -inf logit has w = 0, which no rule keeps): whole-row
         * kernels, vectorized where the CPU allows. Without top-p the weights' own sum (over
         * w >= min_w) is the mass; with it, their sum over all is top-p's total. */
        double *w = s->w;
        const double total = o->sample_weights(z, V, zmax, T, top_p_on ? 0.0 : min_w, w);
        float z_thr = -INFINITY;
        mass = total;
        if (top_p_on) {
            uint32_t *bm = s->tmp + V + n_blocks((size_t)V);
            o->sample_keys(z, V, s->key, bm);
            const uint32_t p_thr = top_p_threshold(s->key, bm, w, (size_t)V, total, (double)prm->top_p, s->tmp, s->items);
            if (p_thr) z_thr = funkey(p_thr);
            mass = o->sample_mass(z, w, V, z_thr, min_w);
        }
        psum = o->sample_probs(z, w, V, z_thr, min_w, mass, d->p, d->kept, &nk);
    }
    d->n_kept = nk;
    d->log_mass = log(mass);
    d->p_sum = psum;
    return DSP_OK;
}

/* ---- sampling ------------------------------------------------------------------------------- */

int32_t dsp_sample_from_dist(const dsp_sample_dist *d, double u) {
    if (d->greedy) return d->argmax;
    const double target = u * d->p_sum;
    double cum = 0.0;
    for (int32_t j = 0; j < d->n_kept; j++) {
        cum += (double)d->p[d->kept[j]];
        if (cum > target) return d->kept[j];
    }
    return d->kept[d->n_kept - 1]; /* u * p_sum rounded up to p_sum */
}

bool dsp_sample_accept(const dsp_sample_dist *d, int32_t token, float q_token, double u) {
    double px = (token >= 0 && token < d->n_vocab) ? (double)d->p[token] : 0.0;
    double q = (double)q_token > DSP_SAMPLE_Q_FLOOR ? (double)q_token : DSP_SAMPLE_Q_FLOOR;
    return u < px / q;
}

/* Residual norm(max(0, p - q)) over the kept set (the residual is 0 elsewhere); q == NULL means
 * one-hot on `draft`. */
static int32_t residual_sample(const dsp_sample_dist *d, const float *q, int32_t draft, double u) {
    double total = 0.0;
    for (int32_t j = 0; j < d->n_kept; j++) {
        int32_t t = d->kept[j];
        double r = (double)d->p[t] - (q ? (double)q[t] : (t == draft ? 1.0 : 0.0));
        if (r > 0.0) total += r;
    }
    if (!(total > DSP_SAMPLE_RESIDUAL_EPS)) return dsp_sample_from_dist(d, u);
    const double target = u * total;
    double cum = 0.0;
    int32_t last = d->argmax;
    for (int32_t j = 0; j < d->n_kept; j++) {
        int32_t t = d->kept[j];
        double r = (double)d->p[t] - (q ? (double)q[t] : (t == draft ? 1.0 : 0.0));
        if (r > 0.0) {
            cum += r;
            last = t;
            if (cum > target) return t;
        }
    }
    return last;
}

int32_t dsp_sample_from_residual(const dsp_sample_dist *d, const float *q, double u) {
    return residual_sample(d, q, -1, u);
}

int32_t dsp_sample_from_residual_onehot(const dsp_sample_dist *d, int32_t draft, double u) {
    return residual_sample(d, NULL, draft, u);
}

dsp_status dsp_sample_token(const float *logits, const dsp_sample_history *h,
                            const dsp_sample_params *params, dsp_rng *rng,
                            dsp_sample_scratch *s, dsp_sample_dist *d, int32_t *token) {
    if (!rng || !token) return dsp_error(DSP_ERR_INVALID_ARG, "sample: NULL argument");
    dsp_status st = dsp_sample_process(logits, h, params, s, d);
    if (st) return st;
    double u = dsp_rng_uniform(rng);
    *token = dsp_sample_from_dist(d, u);
    return DSP_OK;
}

/* ---- logprobs ------------------------------------------------------------------------------- */

/* The n largest of x (read through read_logit), most likely first, ties to the lowest id:
 * insertion into a sorted array of at most 20. */
static int32_t top_n_by_value(const float *x, int32_t V, int32_t n, dsp_sample_logprob *out) {
    float val[DSP_SAMPLE_MAX_LOGPROBS];
    int32_t cnt = 0;
    if (n <= 0) return 0;
    for (int32_t i = 0; i < V; i++) {
        float v = read_logit(x[i]);
        if (cnt == n && !(v > val[cnt - 1])) continue;
        int32_t pos = cnt < n ? cnt : n - 1;
        /* equal values stay ahead: they were seen first, with a lower id */
        while (pos > 0 && v > val[pos - 1]) {
            val[pos] = val[pos - 1];
            out[pos].token = out[pos - 1].token;
            pos--;
        }
        val[pos] = v;
        out[pos].token = i;
        if (cnt < n) cnt++;
    }
    return cnt;
}

static float processed_logprob(const dsp_sample_dist *d, int32_t t) {
    if (d->p[t] <= 0.0f) return -INFINITY;
    if (d->greedy) return 0.0f;
    double zmax = (double)d->logits[d->argmax];
    return (float)(((double)d->logits[t] - zmax) / (double)d->temperature - d->log_mass);
}

dsp_status dsp_sample_logprobs(const float *logits, int32_t n_vocab, const dsp_sample_dist *d,
                               dsp_sample_logprob_mode mode, int32_t token, int32_t n_top,
                               dsp_sample_logprob *chosen, dsp_sample_logprob *top, int32_t *n_out) {
    if (!chosen || !n_out || (n_top > 0 && !top))
        return dsp_error(DSP_ERR_INVALID_ARG, "logprobs: NULL argument");
    if (n_top < 0 || n_top > DSP_SAMPLE_MAX_LOGPROBS)
        return dsp_error(DSP_ERR_INVALID_ARG, "logprobs: top %d not in [0, %d]", n_top,
                         DSP_SAMPLE_MAX_LOGPROBS);
    if (mode == DSP_SAMPLE_LOGPROBS_PROCESSED) {
        if (!d || !d->logits || d->n_kept < 1)
            return dsp_error(DSP_ERR_INVALID_ARG, "logprobs: processed mode needs a processed dist");
        n_vocab = d->n_vocab;
    } else if (mode == DSP_SAMPLE_LOGPROBS_RAW) {
        if (!logits) return dsp_error(DSP_ERR_INVALID_ARG, "logprobs: raw mode needs the logits");
    } else {
        return dsp_error(DSP_ERR_INVALID_ARG, "logprobs: unknown mode %d", (int)mode);
    }
    if (n_vocab < 1 || token < 0 || token >= n_vocab)
        return dsp_error(DSP_ERR_INVALID_ARG, "logprobs: token %d outside the vocabulary (%d)", token,
                         n_vocab);
    if (n_top > n_vocab) n_top = n_vocab;

    if (mode == DSP_SAMPLE_LOGPROBS_PROCESSED) {
        *n_out = top_n_by_value(d->logits, n_vocab, n_top, top);
        for (int32_t i = 0; i < *n_out; i++) top[i].logprob = processed_logprob(d, top[i].token);
        chosen->token = token;
        chosen->logprob = processed_logprob(d, token);
        return DSP_OK;
    }
    /* raw log-softmax: lse = m + log(sum exp(x - m)), ascending id, double */
    double m = -INFINITY;
    for (int32_t i = 0; i < n_vocab; i++) {
        double v = (double)read_logit(logits[i]);
        if (v > m) m = v;
    }
    if (m == -INFINITY)
        return dsp_error(DSP_ERR_INVALID_ARG,
                         "logits: none of the %d values is finite (NaN counts as -inf)", n_vocab);
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; i++) sum += exp((double)read_logit(logits[i]) - m);
    const double lse = m + log(sum);
    *n_out = top_n_by_value(logits, n_vocab, n_top, top);
    for (int32_t i = 0; i < *n_out; i++)
        top[i].logprob = (float)((double)read_logit(logits[top[i].token]) - lse);
    chosen->token = token;
    chosen->logprob = (float)((double)read_logit(logits[token]) - lse);
    return DSP_OK;
}
