/* spec/cost: what `--max-draft auto` decides with (README "--max-draft auto").
 *
 * Acceptance model: per request, geometric: each drafted position is accepted with probability p
 * when the ones before it were. A round that verified k drafts and accepted a of them observed a
 * successes and, when a < k, one failure. p = (S + 1) / (T + 2) (Laplace's prior: 1/2 when
 * nothing is known) with the counts S, T decayed by 0.9 every decoding round, drafted or not: the
 * estimate follows the text (memory ~10 rounds), and a request that stopped drafting drifts back
 * towards 1/2, so it tries again and re-learns (exploration without a schedule).
 *
 * Cost model: the profile (dspark.h dsp_spec_profile): the time of an n-row target forward
 * relative to a 1-row forward, c(n - 1) = rel[n], measured at a context of ctx_tokens, plus
 * ctx_rel_per_key for every key a row attends to beyond that, plus the block drafter's cost.
 *
 * Choice (Algorithm 1 of the DSpark paper with R requests, SPS = 1 / time): the candidates (q, i)
 * "verify draft i of request q" are ranked in decreasing order of their expected survival a_q(i)
 * (p_q^i, or DSpark's confidence products; ties: the shorter prefix first), and the round takes the
 * prefix of that ranking with the most expected tokens per unit time, (R + sum a) / (O + D + T(rows)),
 * the empty prefix included: every draft adds a row to the one forward of the whole round, so the
 * more rows the round already has (other requests, their drafts, prefill chunks), the larger a draft's
 * survival must be to pay for its row, and a round whose drafts are not expected to pay drafts
 * nothing (baseline's round). The best prefix, not the first that stops improving: a measured curve
 * is not concave (flat stretches between kernel block sizes), and a longer prefix can win after a
 * shorter one did not. For a fixed number of extra rows the top of the ranking is the set with the
 * largest expected gain (a_q is non-increasing in i, so it is a set of prefixes). The rule decides
 * whether to verify draft i from the estimates alone, never from the drafted tokens, so the output
 * stays lossless. O is the round's host time outside the forward and the block drafter (lookup,
 * verification, emission), measured by the engine; it is paid with or without drafts. The engine
 * also measures how far real rounds of each kind (no drafts, lookup's, the block drafter's) run
 * from the profile's prediction and passes the ratio of drafting rounds to plain ones as
 * draft_scale (engine/draft.c, "the calibration"). Drafting at all must beat
 * the empty prefix by DSP_COST_MARGIN: the estimates of the drafts that rank first are biased high
 * (they rank first partly because they came out high), and a round near break-even is better left
 * plain.
 * With R = 1 it is the k maximising (1 + sum_{i<=k} p^i) / (O + D + c(k)).
 *
 * Prior: a request starts from the engine's pooled acceptance of the same bucket (all requests'
 * drafting rounds, slower decay), weighted as DSP_ACCEPT_PRIOR_W trials, instead of knowing nothing:
 * a short request does not spend its first rounds learning that 2-token lookup matches in chat are
 * mostly wrong. */
#ifndef DSP_SPEC_COST_H
#define DSP_SPEC_COST_H

#include "dspark.h"

typedef struct dsp_accept {
    float s, t;  /* decayed successes and trials */
} dsp_accept;

static inline void dsp_accept_init(dsp_accept *a) { a->s = a->t = 0; }

/* Prompt lookup's proposals are kept apart by how far their match reaches back (a 2-token match in
 * chat is mostly chance, a 16-token one is a copy): buckets 1..4 for 2-3, 4-7, 8-15, 16+ tokens;
 * bucket 0 is for every other drafter. */
#define DSP_ACCEPT_BUCKETS 5
static inline int dsp_accept_bucket(int32_t match_len) {
    return match_len < 4 ? 1 : match_len < 8 ? 2 : match_len < 16 ? 3 : 4;
}
/* one decoding round: k drafts verified, acc accepted (k = 0: no drafts this round) */
void dsp_accept_round(dsp_accept *a, int32_t k, int32_t acc);
float dsp_accept_p(const dsp_accept *a);
/* The engine's pooled counts: every request's drafting rounds (k > 0 only), decayed by 0.99 per
 * round: they describe the drafter on this workload, not one text. */
void dsp_accept_pool(dsp_accept *pool, int32_t k, int32_t acc);
/* A new request's estimate from the pooled one: DSP_ACCEPT_PRIOR_W trials at its rate. */
#define DSP_ACCEPT_PRIOR_W 4.0f
void dsp_accept_init_prior(dsp_accept *a, const dsp_accept *pool);

/* relative time of a forward of `rows` rows, `extra_keys` keys in total beyond ctx_tokens */
float dsp_cost_time(const dsp_spec_profile *p, int rows, double extra_keys);

typedef struct dsp_cost_req {
    float p;             /* acceptance probability per position (when a == NULL) */
    const float *a;      /* (kmax) expected survival of drafts 1..kmax, non-increasing; NULL: p^i */
    int32_t kmax;        /* drafts available */
    uint32_t ctx;        /* the request's context length (keys per row) */
    int32_t k;           /* out: drafts to verify */
} dsp_cost_req;

/* Expected tokens per unit of time of a round of base_rows decoding requests in which one of them
 * verifies the best prefix of its k drafts (1..k), each accepted with probability p after the ones
 * before it: max over j of (base_rows + sum_{i<=j} p^i) / (cost + c(base_rows + j)); k = 0: no
 * drafts, base_rows / (cost + c(base_rows)). */
double dsp_cost_rate(const dsp_spec_profile *p, int base_rows, float cost, float acc_p, int32_t k);

/* Choose k for every request of a round: base_rows rows are in the forward anyway (one per decoding
 * request, prefill chunks), base_extra_keys their keys beyond ctx_tokens, n_tokens the tokens they
 * decide for sure (the decoding requests). Costs in units of a 1-row forward: sunk_cost is paid
 * whatever is chosen (the round's host time, a drafter that already ran), draft_cost only when some
 * request verifies a draft (a block drafter that has not run yet). */
#define DSP_COST_MARGIN 0.05 /* a round drafts only when it expects >= 5% more tokens per unit time */
void dsp_cost_choose(const dsp_spec_profile *p, int base_rows, double base_extra_keys, int n_tokens, float sunk_cost, float draft_cost,
                     dsp_cost_req *reqs, int n);
/* The same with at most max_drafts drafts in all (the prefixes of the ranking up to that length;
 * max_drafts < 0: no limit), and a round with drafts taking draft_scale times what the profile
 * predicts relative to a round without (1: as predicted; the engine's measured calibration,
 * engine/draft.c). The engine limits a round's drafts while a prompt is being prefilled next to
 * decoding requests (engine.h, "Chunked prefill next to decodes"). */
void dsp_cost_choose_max(const dsp_spec_profile *p, int base_rows, double base_extra_keys, int n_tokens, float sunk_cost, float draft_cost,
                         float draft_scale, dsp_cost_req *reqs, int n, int max_drafts);

/* Profile cache: the file for a key (under $XDG_CACHE_HOME/dspark or ~/.cache/dspark), read
 * (false when absent, unreadable or for another key) and written (best effort). */
void dsp_cost_cache_path(const char *key, char *path, size_t cap);
bool dsp_cost_cache_read(const char *path, const char *key, dsp_spec_profile *p);
void dsp_cost_cache_write(const char *path, const char *key, const dsp_spec_profile *p);

#endif
