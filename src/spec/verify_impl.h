/* spec/verify_impl: the verifier's body, with the deliberately wrong rules the statistical test
 * needs. Included by verify.c with DSP_SPEC_FAULT_NONE (a constant: the faults compile away from
 * the library) and by tests/test_spec_verify.c, the only place that turns them on. See spec.h for
 * the rules and the RNG consumption contract.
 *
 * Invariant: the processed distribution p_i at verify position i is computed exactly as plain
 * decoding computes it at that position: the same sampler, the same history (committed tokens +
 * the drafts before i, pushed onto the history one by one), the same logits bits. Everything the
 * verifier decides is therefore a function of the same p_i sequential decoding would use. */
#ifndef DSP_SPEC_VERIFY_IMPL_H
#define DSP_SPEC_VERIFY_IMPL_H

#include "spec/spec.h"

/* Deliberately wrong rules, for tests only: the statistical test must reject each of them. */
typedef enum dsp_spec_fault {
    DSP_SPEC_FAULT_NONE = 0,
    DSP_SPEC_FAULT_RESAMPLE_P,     /* on a rejection, draw the correction from p, not the residual */
    DSP_SPEC_FAULT_IGNORE_Q,       /* accept with probability p(d) whatever q(d) is */
    DSP_SPEC_FAULT_STALE_HISTORY,  /* process every position on the committed history only */
} dsp_spec_fault;

/* The rows are either logits (k+1, n_vocab) or, for plain greedy parameters only
 * (dsp_sample_params_plain_greedy), their argmax ids (k+1; -1 where no logit is finite) as the
 * sampler's step 0 and 5 define it: then the one-hot rule needs nothing else of the row, and the
 * decisions, the history and the RNG draws are the same as from the logits. */
static inline dsp_status dsp_spec_verify_impl(const float *logits, const int32_t *argmax, int32_t n_vocab, int32_t k, const int32_t *draft,
                                              const float *q, dsp_sample_history *h, const dsp_sample_params *sp, dsp_rng *rng,
                                              dsp_sample_scratch *s, dsp_sample_dist *d, const dsp_spec_fault fault, int32_t *out,
                                              int32_t *n_out) {
    *n_out = 0;
    if (k < 0 || (k > 0 && !draft)) return dsp_error(DSP_ERR_INVALID_ARG, "verify: %d drafts", k);
    if (argmax && (fault != DSP_SPEC_FAULT_NONE || !dsp_sample_params_plain_greedy(sp)))
        return dsp_error(DSP_ERR_INVALID_ARG, "verify: argmax rows need plain greedy parameters (no penalties, no bias)");
    const uint32_t base = h->len;
    /* greedy is exact with the one-hot rule whatever q is (p is one-hot on the argmax) */
    const bool onehot = !q || sp->temperature == 0.0f;
    for (int32_t i = 0; i <= k; i++) {
        int32_t best = -1; /* argmax rows: the token p is one-hot on */
        dsp_status st = DSP_OK;
        if (argmax) {
            best = argmax[i];
            if (best < 0 || best >= n_vocab)
                st = dsp_error(DSP_ERR_INVALID_ARG, "logits: none of the %d values is finite (NaN counts as -inf)", n_vocab);
        } else {
            const float *row = logits + (size_t)i * (size_t)n_vocab;
            dsp_sample_history stale = *h;
            stale.len = base;
            st = dsp_sample_process(row, fault == DSP_SPEC_FAULT_STALE_HISTORY ? &stale : h, sp, s, d);
        }
        if (st) {
            dsp_sample_history_pop(h, h->len - base);
            *n_out = 0;
            return st;
        }
        int32_t tok;
        bool accepted = false;
        if (i == k) {
            const double u = dsp_rng_uniform(rng);
            tok = argmax ? best : dsp_sample_from_dist(d, u); /* bonus: all drafts accepted */
        } else if (argmax) {
            (void)dsp_rng_uniform(rng); /* the draw greedy sampling from the logits makes too */
            tok = best;
            accepted = tok == draft[i];
        } else if (onehot) {
            if (fault == DSP_SPEC_FAULT_RESAMPLE_P || fault == DSP_SPEC_FAULT_IGNORE_Q) {
                /* wrong: accept with probability p(d), then correct from p (d not excluded) */
                accepted = dsp_rng_uniform(rng) < (double)d->p[draft[i]];
                tok = accepted ? draft[i] : dsp_sample_from_dist(d, dsp_rng_uniform(rng));
            } else {
                tok = dsp_sample_from_dist(d, dsp_rng_uniform(rng)); /* sample-and-match (§3.3) */
                accepted = tok == draft[i];
            }
        } else {
            const float *qi = q + (size_t)i * (size_t)n_vocab;
            const int32_t dt = draft[i];
            const double u = dsp_rng_uniform(rng);
            if (fault == DSP_SPEC_FAULT_IGNORE_Q) accepted = u < (double)d->p[dt];
            else accepted = dsp_sample_accept(d, dt, qi[dt], u);
            if (accepted) tok = dt;
            else if (fault == DSP_SPEC_FAULT_RESAMPLE_P) tok = dsp_sample_from_dist(d, dsp_rng_uniform(rng));
            else tok = dsp_sample_from_residual(d, qi, dsp_rng_uniform(rng));
        }
        out[(*n_out)++] = tok;
        if ((st = dsp_sample_history_push(h, tok))) { /* the caller sizes the history for k + 1 more */
            dsp_sample_history_pop(h, h->len - base);
            *n_out = 0;
            return st;
        }
        if (!accepted) break;
    }
    return DSP_OK;
}

#endif
