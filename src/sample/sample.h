/* sample/sample: logit processors, the processed distribution, samplers, logprobs.
 *
 * The sampler is a pure function of (logits, history, params, uniform): no globals, no hidden
 * state, no allocation. The speculative verifier calls it position by position on a hypothetical
 * history (push a draft token, process, decide, push the next ... pop what was rejected).
 *
 * Pipeline (dsp_sample_process), in this order, on one row of V logits:
 *   0. read: NaN is read as -inf (the token can never be chosen); +inf is read as FLT_MAX (so
 *      several +inf tokens tie and share the mass). If no value is finite afterwards the call
 *      fails with DSP_ERR_INVALID_ARG: there is nothing to sample.
 *   1. logit bias:        z[t] += bias        (entries applied in order; a repeated token gets the sum)
 *   2. repetition penalty (llama.cpp semantics): for each token present in the last
 *      repetition_last_n tokens of the history *prompt included* (-1: the whole history),
 *      z = z > 0 ? z / penalty : z * penalty. Applied once per distinct token.
 *   3. frequency penalty  (OpenAI/vLLM): z -= (float)count * frequency_penalty
 *   4. presence penalty   (OpenAI/vLLM): z -= presence_penalty if count > 0
 *      where count is the number of occurrences among the *generated* tokens only (history
 *      positions >= n_prompt), as vLLM does; the prompt never counts for 3 and 4. A result of
 *      2-4 above FLT_MAX (a penalty below 1 on a huge logit) is FLT_MAX, as in step 0.
 *   The result is dist->logits (float, V). Order 1-4 is vLLM's and llama.cpp's (bias first).
 *   5. temperature 0: greedy. dist->argmax = the largest processed logit, ties to the lowest id;
 *      p is one-hot on it. Truncation is skipped (every rule below keeps the top token anyway).
 *   6. temperature T > 0, in Hugging Face's warper order:
 *      w_i = exp((z_i - z_max) / T) in double, with the project's own exp (dsp_sample_exp,
 *      sample/sample_kernels.h: within 1 ulp of glibc's, the same bits on every machine and in every
 *      kernel table; exp(0) = 1, so w_argmax = 1 exactly);
 *      top-k: keep tokens with z >= the k-th largest z; ties at the boundary are all kept (as HF
 *             and vLLM do; llama.cpp keeps exactly k). Radix selection, O(V), no sort.
 *      top-p: order the survivors by (z desc, id asc); keep the shortest prefix whose cumulative
 *             w reaches top_p * (sum of surviving w), i.e. a token is kept iff the mass strictly
 *             before it is < top_p of the total (HF's rule); ties with the last kept token are
 *             all kept. Partial: only a growing top-m set is sorted.
 *      min-p: keep tokens with w >= min_p * w_max (= min_p), relative to the top token (HF).
 *      Tokens whose w underflows to 0 are not kept. p_i = w_i / sum(kept w), else 0.
 *   Every sum runs in a fixed order (ascending id unless stated), in double, single-threaded
 *   (vector kernels compute the weights and p several tokens at a time but add them one by one):
 *   the same inputs give the same bits on every run and every x86-64 machine, whichever kernel
 *   table runs: p, kept, n_kept and p_sum are IEEE arithmetic with -ffp-contract=off and the own
 *   exp. log_mass alone calls libm (log), as do the RAW logprobs (exp, log).
 *   Differences from Hugging Face (the test oracle, tests/fixtures/sampling): HF computes in
 *   float32 (we agree within 1e-5 relative on p); HF's unstable sort keeps an arbitrary part of a
 *   tie group straddling the top-p boundary, we keep all of it; HF applies the repetition penalty
 *   to every input id (our repetition_last_n = -1) and has no presence/frequency/bias processors.
 *
 * Sampling from p with a uniform u in [0, 1): inverse CDF over the kept tokens in ascending id
 * order: the first token whose running sum of p exceeds u * p_sum. Greedy ignores u.
 *
 * Memory: the caller provides two buffers sized at start-up: a dist (result: processed logits,
 * p, kept ids; one per distribution that must stay alive) and a scratch (working space, one per
 * thread; its count tables are all zero between calls, which every call restores). */
#ifndef DSP_SAMPLE_SAMPLE_H
#define DSP_SAMPLE_SAMPLE_H

#include "core/status.h"
#include "sample/rng.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DSP_SAMPLE_MAX_LOGPROBS 20     /* OpenAI's top_logprobs limit */
#define DSP_SAMPLE_MAX_BIAS 1024       /* logit_bias entries per request */
#define DSP_SAMPLE_BIAS_LIMIT 100.0f   /* |bias| <= 100 (OpenAI's range) */
#define DSP_SAMPLE_PENALTY_LIMIT 2.0f  /* |presence|, |frequency| <= 2 (OpenAI's range) */
#define DSP_SAMPLE_RESIDUAL_EPS 1e-8   /* residual mass below this: sample from p instead */
#define DSP_SAMPLE_Q_FLOOR 1e-8        /* q is clamped to this in the acceptance ratio */

typedef struct dsp_sample_bias {
    int32_t token; /* in [0, V) */
    float bias;    /* in [-100, 100]; added to the raw logit */
} dsp_sample_bias;

typedef struct dsp_sample_params {
    float temperature;         /* 0 = greedy (argmax, lowest id on ties); > 0 divides the logits; finite */
    int32_t top_k;             /* keep the k largest logits (boundary ties kept); 0 = off; k >= V = off */
    float top_p;               /* nucleus mass in (0, 1]; 1 = off */
    float min_p;               /* in [0, 1]: drop tokens with p < min_p * p_max; 0 = off */
    float presence_penalty;    /* [-2, 2], OpenAI: subtracted once if the token was generated */
    float frequency_penalty;   /* [-2, 2], OpenAI: subtracted per generated occurrence */
    float repetition_penalty;  /* > 0, llama.cpp/HF/vLLM formula; 1 = off */
    int32_t repetition_last_n; /* window of the repetition penalty over prompt + generated tokens:
                                  the last N history tokens; -1 = whole history; 0 = off. llama.cpp's
                                  default is 64 (and it feeds the prompt into that window too) */
    const dsp_sample_bias *logit_bias; /* (n_logit_bias) additive biases, or NULL */
    uint32_t n_logit_bias;             /* <= DSP_SAMPLE_MAX_BIAS */
} dsp_sample_params;

/* temperature 1, no truncation, no penalties (repetition_last_n = 64 if a penalty is set later). */
dsp_sample_params dsp_sample_params_default(void);
/* Range checks of every field against a vocabulary of n_vocab tokens; the message names the field. */
dsp_status dsp_sample_params_validate(const dsp_sample_params *p, int32_t n_vocab);
/* Greedy with no processor that can move the argmax (no bias, no penalty): the token is then the
 * raw logits' argmax as step 0 reads them (NaN as -inf, +inf as FLT_MAX, lowest id on ties), which
 * a backend can compute where the logits are (dsp_spec_verify_argmax). */
bool dsp_sample_params_plain_greedy(const dsp_sample_params *p);
/* That token for one row of raw logits: the first index of the largest value read as step 0 reads
 * it; -1 if no value is finite then. */
int32_t dsp_sample_argmax(const float *logits, int32_t n_vocab);

/* The token history seen by the penalties: prompt tokens, then generated ones. A view over
 * caller-owned storage; push/pop are O(1) (the verifier pushes hypothetical draft tokens and pops
 * the rejected ones). Counts are rebuilt from the list on each process call, in scratch, in
 * O(tokens inside the penalty windows), so the history itself holds no per-vocabulary table. */
typedef struct dsp_sample_history {
    int32_t *tokens;   /* (cap) tokens[0, n_prompt) prompt, [n_prompt, len) generated */
    uint32_t cap;
    uint32_t len;
    uint32_t n_prompt;
} dsp_sample_history;

/* buf[0, n_prompt) must already hold the prompt; len starts at n_prompt. */
dsp_status dsp_sample_history_init(dsp_sample_history *h, int32_t *buf, uint32_t cap, uint32_t n_prompt);
/* Append a generated token; DSP_ERR_RANGE when full. Ids are checked against V when processed. */
dsp_status dsp_sample_history_push(dsp_sample_history *h, int32_t token);
/* Drop the last n generated tokens; DSP_ERR_RANGE if fewer than n were generated (the prompt stays). */
dsp_status dsp_sample_history_pop(dsp_sample_history *h, uint32_t n);

/* Working space for dsp_sample_process. Fields are private; the buffers live in caller memory. */
struct dsp_cpu_ops;
typedef struct dsp_sample_scratch {
    int32_t n_vocab;
    /* the CPU kernel table for step 6 (dsp_cpu_ops_best() at init; NULL means that too). Every
     * table gives the same bits (backend/cpu/ops.h); a test may point it at another one. */
    const struct dsp_cpu_ops *ops;
    uint32_t *tmp;      /* (V + 2 ceil(V/64)) selection keys and block maxima */
    double *w;          /* (V) weights: of every token, or of the top-k candidates */
    uint32_t *key;      /* (V) ordered keys of the logits (top-p), or of the top-k candidates */
    int32_t *id;        /* (V) the top-k candidates' ids, ascending */
    uint64_t *items;    /* (2V) top-p prefix being sorted, and its radix buffer */
    uint32_t *gen_count; /* (V) all zero between calls */
    uint32_t *win_count; /* (V) all zero between calls */
} dsp_sample_scratch;

size_t dsp_sample_scratch_bytes(int32_t n_vocab);
/* mem: at least dsp_sample_scratch_bytes(n_vocab) bytes, 16-byte aligned, outliving s. */
dsp_status dsp_sample_scratch_init(dsp_sample_scratch *s, void *mem, size_t bytes, int32_t n_vocab);

/* A processed distribution. Buffers live in caller memory (dsp_sample_dist_init). */
typedef struct dsp_sample_dist {
    int32_t n_vocab;
    float *logits;     /* (V) processed logits after steps 0-4, before temperature */
    float *p;          /* (V) processed probabilities; exactly 0 outside the kept set */
    int32_t *kept;     /* (V) ids with p > 0, ascending; n_kept of them are valid */
    int32_t n_kept;    /* >= 1 after a successful process */
    int32_t argmax;    /* largest processed logit, lowest id on ties; always kept */
    bool greedy;       /* temperature 0: p is one-hot on argmax */
    float temperature; /* as processed */
    double log_mass;   /* log sum over kept of exp((z - z_max) / T); 0 when greedy */
    double p_sum;      /* sum of p over kept, ascending id, in double (the inverse-CDF total) */
} dsp_sample_dist;

size_t dsp_sample_dist_bytes(int32_t n_vocab);
/* mem: at least dsp_sample_dist_bytes(n_vocab) bytes, 16-byte aligned, outliving d. */
dsp_status dsp_sample_dist_init(dsp_sample_dist *d, void *mem, size_t bytes, int32_t n_vocab);

/* logits (V = d->n_vocab) + history + params -> d. Validates params and history ids; on error d
 * is unspecified and s keeps its invariant. h may be NULL (no history). */
dsp_status dsp_sample_process(const float *logits, const dsp_sample_history *h,
                              const dsp_sample_params *params, dsp_sample_scratch *s,
                              dsp_sample_dist *d);

/* Sample from p with a uniform u in [0, 1) (see the top of this file). Greedy returns argmax. */
int32_t dsp_sample_from_dist(const dsp_sample_dist *d, double u);

/* Rejection-sampling helpers for the verifier (DRAFTERS.md section 3.2). q (V) is the
 * distribution the draft token was drawn from.
 *   accept: u < min(1, p(x) / max(q(x), 1e-8)), computed in double.
 *   residual: sample from norm(max(0, p - q)) with u (ascending-id inverse CDF); when the residual
 *   mass is <= 1e-8 (p and q agree) it samples from p instead, as DeepSpec does.
 *   residual_onehot: the same with q = one-hot(draft), i.e. p without the draft, renormalised. */
bool dsp_sample_accept(const dsp_sample_dist *d, int32_t token, float q_token, double u);
int32_t dsp_sample_from_residual(const dsp_sample_dist *d, const float *q, double u);
int32_t dsp_sample_from_residual_onehot(const dsp_sample_dist *d, int32_t draft, double u);

/* Plain decoding step: process, draw exactly one uniform from rng (also when greedy, so the
 * stream position equals the number of sampled tokens), sample. */
dsp_status dsp_sample_token(const float *logits, const dsp_sample_history *h,
                            const dsp_sample_params *params, dsp_rng *rng,
                            dsp_sample_scratch *s, dsp_sample_dist *d, int32_t *token);

/* ---- log-probabilities -------------------------------------------------------------------- */

typedef enum dsp_sample_logprob_mode {
    /* Default. The model's own log-softmax of the raw logits (NaN as -inf), before bias,
     * penalties, temperature and truncation: what vLLM returns by default. */
    DSP_SAMPLE_LOGPROBS_RAW = 0,
    /* log of the processed distribution p (the one sampled from): -inf outside the kept set;
     * greedy: 0 for argmax, -inf elsewhere. */
    DSP_SAMPLE_LOGPROBS_PROCESSED = 1,
} dsp_sample_logprob_mode;

typedef struct dsp_sample_logprob {
    int32_t token;
    float logprob; /* may be -inf (the server shows -inf as -9999.0, like vLLM) */
} dsp_sample_logprob;

/* Log-probability of `token` and the n_top (<= 20) most likely alternatives, most likely first,
 * ties to the lowest id. RAW ranks by raw logit and reads logits (n_vocab of them; d unused, may be
 * NULL); PROCESSED ranks by processed logit and reads d (from dsp_sample_process on the same row;
 * logits unused). *n_out = min(n_top, V). top may be NULL when n_top is 0. */
dsp_status dsp_sample_logprobs(const float *logits, int32_t n_vocab, const dsp_sample_dist *d,
                               dsp_sample_logprob_mode mode, int32_t token, int32_t n_top,
                               dsp_sample_logprob *chosen, dsp_sample_logprob *top, int32_t *n_out);

#endif
