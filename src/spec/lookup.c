/* spec/lookup: prompt-lookup (n-gram) drafting (DRAFTERS.md §4).
 *
 * Proposal: take the suffix of the committed sequence (prompt + generated) of length n, for n from
 * max_n down to min_n; at the first n whose n-gram occurred earlier, take its most recent earlier
 * occurrence and propose the tokens that followed it. When the continuation runs into the suffix
 * itself (a repeating pattern), it continues with the drafted tokens, i.e. the period is extended:
 * "a b a b" with suffix "a b" proposes "a b a b ...". No match: no draft, and the round is a plain
 * decode step, which costs what baseline costs.
 *
 * Index: one open-addressing hash table, key = hash(n, the n tokens), value = the position right
 * after the n-gram (where its continuation starts). When token j is committed, the n-grams ending
 * at j-1 (n = min_n..max_n) are inserted with value j, overwriting older entries of the same key,
 * so a lookup finds the most recent occurrence whose continuation exists (hence an *earlier*
 * occurrence than the current suffix). Insert and lookup are O(max_n) per n, so the cost per
 * committed token is O(max_n^2) = O(1) for bounded max_n, independent of the context length; a
 * lookup verifies the tokens behind the stored position, so hash collisions never produce a wrong
 * match (they can only hide an older one). The table is sized from the sequence capacity at creation
 * (load factor <= 1/2), so it never grows and never needs deletion: committed tokens are never
 * rolled back within a generation (rejected drafts are never observed).
 *
 * Defaults min_n = 2, max_n = 4. n = 1 matches almost every token in ordinary text and predicts
 * poorly (a single token such as "the" or "," is followed by many different things); n = 2 is the
 * shortest context that identifies a position in copied text (identifiers, quoted phrases, code
 * lines) often enough to catch the start of a copy one token earlier than n = 3 would; longer
 * matches are preferred when they exist (n = 4 beats n = 2 on repetitive text because it
 * disambiguates the common bigrams); going past 4 rarely changes the chosen occurrence in our
 * prompt sets but delays drafting at the start of each copied span. The draft length adaptation
 * below keeps the false 2-gram matches of general chat cheap.
 *
 * Draft length (adaptive = true): the proposal is capped at k_cur, which starts at max_draft,
 * doubles after a round whose drafts were all accepted and drops to accepted + 1 after a rejection
 * (the shape of Hugging Face's assisted-generation heuristic), and at twice the length of the match
 * (the suffix compared backwards with the occurrence, up to 32 tokens): a bare 2-gram match, the
 * usual false positive of general chat, drafts at most 4 tokens, while a long copied span drafts the
 * full max_draft (mlx-dspark grows drafts with the match depth in the same way). Both are pure
 * functions of the tokens, so seeded runs stay reproducible, and neither affects the output
 * (lossless), only how many rows a round verifies. */
#include "spec/spec.h"

#include "dspark.h"

#include <stdlib.h>
#include <string.h>

typedef struct slot {
    uint64_t key;   /* 0 = empty */
    uint32_t pos;   /* continuation start */
    uint32_t n;     /* n-gram length */
} slot;

typedef struct lookup {
    dsp_drafter base;
    dsp_lookup_params p;
    slot *tab;
    uint32_t mask;        /* table size - 1 */
    uint32_t n_indexed;   /* tokens[0, n_indexed) are indexed */
    int32_t k_cur;        /* current draft length cap */
    int32_t last_match;   /* n of the last proposal's match */
    int32_t last_len;     /* how far that match reaches back (up to 32 tokens) */
} lookup;

static uint64_t ngram_hash(const int32_t *t, int32_t n) {
    uint64_t h = 0x243F6A8885A308D3ull ^ (uint64_t)n;
    for (int32_t i = 0; i < n; i++) {
        h ^= (uint32_t)t[i];
        h *= 0x9E3779B97F4A7C15ull;
        h ^= h >> 31;
    }
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return h | 1; /* never 0 (empty) */
}

static void index_upto(lookup *L, const int32_t *tokens, uint32_t n) {
    for (uint32_t j = L->n_indexed > 0 ? L->n_indexed : 1; j < n; j++) {
        /* token j exists: n-grams ending at j-1 get continuation j */
        for (int32_t g = L->p.min_n; g <= L->p.max_n && (uint32_t)g <= j; g++) {
            uint64_t key = ngram_hash(tokens + j - (uint32_t)g, g);
            uint32_t i = (uint32_t)key & L->mask;
            while (L->tab[i].key && L->tab[i].key != key) i = (i + 1) & L->mask;
            L->tab[i].key = key;
            L->tab[i].pos = j;
            L->tab[i].n = (uint32_t)g;
        }
    }
    if (n > L->n_indexed) L->n_indexed = n;
}

/* continuation start of the most recent earlier occurrence of tokens[len-g, len), or 0 */
static uint32_t find(const lookup *L, const int32_t *tokens, uint32_t len, int32_t g) {
    const int32_t *suf = tokens + len - (uint32_t)g;
    uint64_t key = ngram_hash(suf, g);
    for (uint32_t i = (uint32_t)key & L->mask; L->tab[i].key; i = (i + 1) & L->mask) {
        if (L->tab[i].key != key || L->tab[i].n != (uint32_t)g) continue;
        uint32_t pos = L->tab[i].pos;
        if (pos >= (uint32_t)g && pos < len && !memcmp(tokens + pos - (uint32_t)g, suf, sizeof(int32_t) * (size_t)g)) return pos;
        return 0; /* a colliding key: keep the miss (only ever hides an older occurrence) */
    }
    return 0;
}

static int32_t lk_propose(dsp_drafter *d, const int32_t *tokens, uint32_t n, int32_t k_max, int32_t *draft, float *q) {
    (void)q;
    lookup *L = (lookup *)d;
    index_upto(L, tokens, n);
    int32_t k = k_max < L->p.max_draft ? k_max : L->p.max_draft;
    if (L->p.adaptive && k > L->k_cur) k = L->k_cur;
    if (k <= 0) return 0;
    for (int32_t g = L->p.max_n; g >= L->p.min_n; g--) {
        if ((uint32_t)g >= n) continue;
        uint32_t pos = find(L, tokens, n, g);
        if (!pos) continue;
        /* how far the match really reaches back (bounded: O(1)); a short match drafts little */
        uint32_t ext = (uint32_t)g;
        while (ext < 32 && ext < pos && tokens[pos - 1 - ext] == tokens[n - 1 - ext]) ext++;
        if (L->p.adaptive && (int64_t)k > 2 * (int64_t)ext) k = (int32_t)(2 * ext);
        L->last_len = (int32_t)ext;
        for (int32_t i = 0; i < k; i++) {
            uint32_t src = pos + (uint32_t)i;
            draft[i] = src < n ? tokens[src] : draft[src - n];
        }
        L->last_match = g;
        return k;
    }
    return 0;
}

static void lk_observe(dsp_drafter *d, const dsp_spec_commit *c) {
    lookup *L = (lookup *)d;
    index_upto(L, c->tokens, c->n_tokens);
    if (c->n_drafted > 0) {
        if (c->n_accepted == c->n_drafted) {
            L->k_cur = L->k_cur * 2 > L->p.max_draft ? L->p.max_draft : L->k_cur * 2;
        } else {
            L->k_cur = c->n_accepted + 1;
        }
    }
}

static void lk_reset(dsp_drafter *d) {
    lookup *L = (lookup *)d;
    memset(L->tab, 0, sizeof(slot) * ((size_t)L->mask + 1));
    L->n_indexed = 0;
    L->k_cur = L->p.max_draft;
    L->last_match = 0;
    L->last_len = 0;
}

static void lk_destroy(dsp_drafter *d) {
    lookup *L = (lookup *)d;
    free(L->tab);
    free(L);
}

static const dsp_drafter_ops lookup_ops = {"lookup", lk_propose, lk_observe, lk_reset, lk_destroy};

dsp_status dsp_lookup_create(const dsp_lookup_params *p, dsp_drafter **out) {
    *out = NULL;
    if (p->min_n < 1 || p->max_n < p->min_n || p->max_n > 16)
        return dsp_error(DSP_ERR_INVALID_ARG, "lookup n-gram sizes: need 1 <= min (%d) <= max (%d) <= 16", p->min_n, p->max_n);
    if (p->max_draft < 1 || p->max_draft > DSP_MAX_DRAFT)
        return dsp_error(DSP_ERR_INVALID_ARG, "max_draft must be between 1 and %d (got %d)", DSP_MAX_DRAFT, p->max_draft);
    if (p->capacity < 1 || p->capacity > (1u << 26)) return dsp_error(DSP_ERR_INVALID_ARG, "lookup capacity %u out of range", p->capacity);
    uint64_t entries = (uint64_t)p->capacity * (uint64_t)(p->max_n - p->min_n + 1);
    uint64_t size = 64;
    while (size < 2 * entries) size <<= 1;
    lookup *L = calloc(1, sizeof *L);
    slot *tab = calloc((size_t)size, sizeof(slot));
    if (!L || !tab) {
        free(L);
        free(tab);
        return dsp_error(DSP_ERR_NOMEM, "no memory for the lookup index (%llu slots)", (unsigned long long)size);
    }
    L->base.ops = &lookup_ops;
    L->p = *p;
    L->tab = tab;
    L->mask = (uint32_t)(size - 1);
    L->k_cur = p->max_draft;
    *out = &L->base;
    return DSP_OK;
}

int32_t dsp_lookup_last_match(const dsp_drafter *d) { return ((const lookup *)d)->last_match; }
int32_t dsp_lookup_last_len(const dsp_drafter *d) { return ((const lookup *)d)->last_len; }
