/* engine/engine: internals of dsp_ctx / dsp_seq / dsp_generate (public API in dspark.h). */
#ifndef DSP_ENGINE_ENGINE_H
#define DSP_ENGINE_ENGINE_H

#include "dspark.h"
#include "engine/stop.h"
#include "model/forward.h"
#include "sample/rng.h"
#include "sample/sample.h"
#include "spec/spec.h"
#include "tok/tok.h"

#define DSP_ENGINE_MAX_ROWS 64   /* logits rows per round (1 + the largest draft) */

struct dsp_ctx {
    dsp_model *m;
    dsp_fwd *fwd;
    int n_vocab;
    int max_rows;
    float *logits;               /* (max_rows, n_vocab) */
    void *scratch_mem, *dist_mem;
    dsp_sample_scratch scratch;
    dsp_sample_dist dist;
    int32_t bpos[4096], bseq[4096]; /* batch scratch (prefill chunks are <= max_batch_tokens) */
};

struct dsp_seq {
    dsp_ctx *c;
    dsp_kv_seq kv;
    int32_t *tokens;   /* (cap) the sequence's tokens; the first kv.n_tokens have cached KV */
    uint32_t n_tokens, cap;
};

/* dsp_gen_params -> sampler parameters, validated (the message names the field). */
dsp_status dsp_engine_sample_params(const dsp_ctx *c, const dsp_gen_params *p, dsp_sample_params *sp);
/* end-of-generation token (eos, eot, <|im_end|>, ...) */
bool dsp_engine_is_eog(const dsp_model *m, int32_t tok);
/* dsp_generate with an explicit drafter (NULL: the one p->mode asks for; the caller keeps
 * ownership of a drafter it passes, which is reset first) and a verifier fault (tests only; NONE
 * otherwise). This is how tests plug in drafters that supply q or want taps. */
dsp_status dsp_engine_generate(dsp_ctx *c, dsp_seq *s, const int32_t *prompt, size_t n_prompt, const dsp_gen_params *p,
                               dsp_drafter *drafter, dsp_spec_fault fault, dsp_token_cb cb, void *user, dsp_gen_result *res);

#endif
