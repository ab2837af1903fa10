/* spec/spec: drafters and the lossless verifier (DESIGN.md §1 steps 2 and 4, DRAFTERS.md §3-4).
 *
 * A round of speculative decoding: the drafter proposes up to k tokens d1..dk after the committed
 * sequence; the engine runs the target once over [last, d1..dk] (k+1 logits rows); the verifier
 * decides, position by position, which drafts are accepted and which token follows them (the
 * bonus/correction token); the engine emits those tokens, truncates the target KV to the committed
 * length and tells the drafter what was committed (observe).
 *
 * Drafter interface (a small vtable; the engine owns one drafter per generation):
 *   propose  up to k_max draft tokens after tokens[0, n) and, when the drafter samples its drafts
 *            (supplies_q), the distribution q_i each d_i was drawn from, (k, n_vocab). A
 *            deterministic drafter (prompt lookup, argmax block drafters) leaves q alone: its q is
 *            one-hot and the verifier uses sample-and-match (DRAFTERS.md §3.3).
 *   observe  what was committed since the last call: the new tokens, how many of the last
 *            proposal's drafts were accepted, and, for drafters that asked for taps (n_taps > 0),
 *            the target's hidden states at the committed rows of the last forward (prefill chunks
 *            and verify blocks: the anchor + the accepted drafts; DRAFTERS.md §1.8 "carry-over hidden
 *            states"). The first observe of a generation carries the whole prompt.
 *   reset    forget everything (a new, unrelated sequence follows).
 * A drafter never sees rejected drafts as committed, so it needs no rollback of its own beyond
 * what it chooses to keep about its last proposal.
 *
 * This per-request interface serves drafters that run on the host (prompt lookup, tests' drafters).
 * Block drafters (DFlash, DSpark: spec/block.h) are models: one is loaded per engine, keeps its K/V
 * in a backend KV store beside the target's, and drafts for all requests of a round in one batched
 * forward (engine/draft.c); the verifier below is the same for both.
 *
 * Verifier (dsp_spec_verify): a pure function of (logits rows, draft, q, history, params, rng).
 * For each position i the processed target distribution p_i is computed by the same sampler as
 * plain decoding, on the hypothetical history committed + d1..di, so every logit processor
 * (penalties, bias, temperature, top-k/p, min-p) sees exactly what sequential decoding would see.
 *
 * RNG consumption (the contract that makes seeded runs reproducible):
 *   - one-hot drafts (and greedy, any drafter): exactly ONE uniform per emitted token, used to
 *     draw t_i ~ p_i by the sampler's inverse CDF; the draft is accepted iff t_i == d_{i+1}, else
 *     t_i is the correction; after all k accepted, t_k is the bonus. Plain decoding also draws one
 *     uniform per token from the same inverse CDF, and the verify logits are bit-identical to
 *     plain decoding's (batch invariance), so lookup output equals baseline output token for token
 *     for the same seed, at every temperature and every draft length.
 *   - drafts with q: per draft position one uniform for the acceptance test u < p(d)/q(d); on a
 *     rejection a second uniform for the residual norm(max(0, p - q)); after all k accepted, one
 *     uniform for the bonus from p_k. The drafter's own sampling uses its own stream. The output is
 *     an exact sample of the target (DRAFTERS.md §3.2) and reproducible for a given seed provided
 *     the drafter's proposals are a deterministic function of the tokens and the seed; it is a
 *     different sample path from baseline's. */
#ifndef DSP_SPEC_SPEC_H
#define DSP_SPEC_SPEC_H

#include "core/status.h"
#include "sample/rng.h"
#include "sample/sample.h"

#include <stdbool.h>
#include <stdint.h>

#define DSP_SPEC_MAX_TAPS 16

typedef struct dsp_drafter dsp_drafter;

/* What was committed since the last observe. */
typedef struct dsp_spec_commit {
    const int32_t *tokens;  /* the whole committed sequence (prompt + generated) */
    uint32_t n_tokens;      /* its length */
    uint32_t n_new;         /* tokens committed since the last observe (the tail of tokens) */
    int32_t n_drafted;      /* drafts of the last proposal that were verified (0: none) */
    int32_t n_accepted;     /* of which the verifier accepted */
    /* Target hidden states of committed rows, (n_tap_rows, n_taps, n_embd), for the positions
     * [tap_pos, tap_pos + n_tap_rows); NULL when the drafter asked for no taps. After a verify these
     * are the anchor and the accepted drafts (the bonus token has not been through the target). */
    const float *taps;
    uint32_t tap_pos;
    int32_t n_tap_rows;
} dsp_spec_commit;

typedef struct dsp_drafter_ops {
    const char *name;
    /* Propose at most k_max (>= 1) drafts following tokens[0, n); returns how many (0 = no draft:
     * the round is a plain decode step). q: (k_max, n_vocab) or NULL; written only by drafters
     * with supplies_q (row i = the distribution draft[i] was drawn from). */
    int32_t (*propose)(dsp_drafter *d, const int32_t *tokens, uint32_t n, int32_t k_max, int32_t *draft, float *q);
    void (*observe)(dsp_drafter *d, const dsp_spec_commit *c);
    void (*reset)(dsp_drafter *d);
    void (*destroy)(dsp_drafter *d);
} dsp_drafter_ops;

/* The common head of every drafter (a drafter struct embeds it first). */
struct dsp_drafter {
    const dsp_drafter_ops *ops;
    bool supplies_q;                       /* drafts are sampled from q: rejection sampling (§3.2) */
    int32_t n_taps;                        /* target layers whose hidden states observe wants */
    int32_t tap_layers[DSP_SPEC_MAX_TAPS]; /* (n_taps) */
};

static inline int32_t dsp_drafter_propose(dsp_drafter *d, const int32_t *tokens, uint32_t n, int32_t k_max, int32_t *draft, float *q) {
    return d->ops->propose(d, tokens, n, k_max, draft, q);
}
static inline void dsp_drafter_observe(dsp_drafter *d, const dsp_spec_commit *c) { d->ops->observe(d, c); }
static inline void dsp_drafter_reset(dsp_drafter *d) { d->ops->reset(d); }
static inline void dsp_drafter_destroy(dsp_drafter *d) {
    if (d) d->ops->destroy(d);
}

/* ---- prompt lookup ---------------------------------------------------------------------------- */

typedef struct dsp_lookup_params {
    int32_t min_n, max_n;   /* n-gram sizes tried, longest first (1 <= min_n <= max_n <= 16) */
    int32_t max_draft;      /* drafts per round at most (<= DSP_MAX_DRAFT) */
    uint32_t capacity;      /* most tokens the sequence will hold (sizes the index) */
    bool adaptive;          /* shrink/grow the draft length from the acceptance seen (see lookup.c) */
} dsp_lookup_params;

dsp_status dsp_lookup_create(const dsp_lookup_params *p, dsp_drafter **out);

/* Introspection for tests and statistics: the match length (n) of the last non-empty proposal. */
int32_t dsp_lookup_last_match(const dsp_drafter *d);
/* How many tokens before the cursor that match agrees with (n or more, up to 32): hybrid mode
 * uses the lookup proposal instead of the block drafter when it is long enough. */
int32_t dsp_lookup_last_len(const dsp_drafter *d);

/* ---- verifier --------------------------------------------------------------------------------- */

/* Verify k drafts against the target logits rows (k+1, n_vocab): row i is the target's output after
 * the committed tokens + draft[0, i). q: (k, n_vocab) or NULL for one-hot drafts. h: the committed
 * history; on return it holds the committed history + the out tokens. out (k+1): the accepted
 * drafts then the bonus/correction token; *n_out = accepted + 1. d ends up holding p of the last
 * out position. See the top of this file for the rules and the RNG consumption. */
dsp_status dsp_spec_verify(const float *logits, int32_t n_vocab, int32_t k, const int32_t *draft, const float *q, dsp_sample_history *h,
                           const dsp_sample_params *sp, dsp_rng *rng, dsp_sample_scratch *s, dsp_sample_dist *d, int32_t *out,
                           int32_t *n_out);
/* The same verifier for plain greedy parameters (dsp_sample_params_plain_greedy) from the rows'
 * argmax ids alone (k+1; -1 for a row with no finite logit), e.g. computed on the GPU so that no
 * vocabulary row crosses PCIe: the same out, history and RNG draws as dsp_spec_verify on the rows
 * those ids came from. Other parameters are refused (DSP_ERR_INVALID_ARG). */
dsp_status dsp_spec_verify_argmax(const int32_t *argmax, int32_t n_vocab, int32_t k, const int32_t *draft, dsp_sample_history *h,
                                  const dsp_sample_params *sp, dsp_rng *rng, int32_t *out, int32_t *n_out);

#endif
