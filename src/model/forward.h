/* model/forward: one target forward over a ragged batch (DESIGN.md §1).
 *
 * Every sequence in the batch contributes some tokens at consecutive positions starting at its
 * current KV length: a prefill chunk, one decode token, or 1+k verify tokens are all the same call.
 * Logits are computed only for the rows asked for; hidden states of chosen layers (taps, for block
 * drafters) can be returned for every row.
 *
 * Batch invariance (DESIGN.md §2): the logits of a token at a position are bit-identical however
 * the batch around it is composed. Each kernel computes an output element with a reduction order
 * fixed by the reduction length alone; threads split work by output element, never inside a sum.
 *
 * All memory is sized at dsp_fwd_create from the limits (max batch tokens, context length, KV
 * pool); dsp_fwd_run allocates nothing. */
#ifndef DSP_MODEL_FORWARD_H
#define DSP_MODEL_FORWARD_H

#include "backend/backend.h"
#include "kv/kv.h"
#include "model/model.h"

typedef struct dsp_fwd_params {
    dsp_backend *backend;   /* where it runs (not owned); NULL: a CPU backend of n_threads, owned */
    int n_threads;          /* for the owned CPU backend: threads including the caller; 0 = physical cores */
    bool f32_activations;   /* for the owned CPU backend: dsp_backend_params.f32_activations */
    int max_batch_tokens;   /* most tokens in one dsp_fwd_run (default 512) */
    int max_logits;         /* most logits rows in one dsp_fwd_run (default min(max_batch_tokens, 64)) */
    int max_taps;           /* most tap layers per run (default 0: taps are not available) */
    uint32_t n_ctx;         /* most tokens in one sequence (default min(training context, 4096)) */
    uint32_t kv_tokens;     /* KV pool capacity in tokens over all sequences (default n_ctx) */
    int block_tokens;       /* KV block size (default 16) */
    bool prefix_cache;      /* publish/attach full blocks across sequences (kv.h) */
} dsp_fwd_params;

typedef struct dsp_batch {
    int n_tokens;
    const int32_t *tokens;     /* (n_tokens) token ids */
    const int32_t *seq;        /* (n_tokens) index into the seqs array of dsp_fwd_run */
    const int32_t *pos;        /* (n_tokens) absolute positions */
    int n_logits;
    const int32_t *logit_rows; /* (n_logits) batch rows whose logits are wanted */
    int n_taps;
    const int32_t *tap_layers; /* (n_taps) layer outputs to return for every row */
} dsp_batch;

typedef struct dsp_fwd dsp_fwd;

dsp_fwd_params dsp_fwd_default_params(void);
dsp_status dsp_fwd_create(const dsp_model *m, const dsp_fwd_params *p, dsp_fwd **out);
void dsp_fwd_destroy(dsp_fwd *f);

dsp_kv_pool *dsp_fwd_kv(dsp_fwd *f);
dsp_backend *dsp_fwd_backend(dsp_fwd *f);
int dsp_fwd_max_logits(const dsp_fwd *f);
/* the backend buffer the last run's taps are in: (n_tokens, n_taps, n_embd) */
const dsp_buf *dsp_fwd_taps(const dsp_fwd *f);
/* the backend buffer the last run's logits are in: (n_logits, n_vocab); dsp_fwd_run with logits ==
 * NULL leaves them there (for the backend's argmax / top_logprobs, without a download) */
const dsp_buf *dsp_fwd_logits(const dsp_fwd *f);
uint32_t dsp_fwd_n_ctx(const dsp_fwd *f);
int dsp_fwd_max_batch(const dsp_fwd *f);
int dsp_fwd_n_vocab(const dsp_fwd *f);
int dsp_fwd_n_embd(const dsp_fwd *f);
/* The token embedding and the output matrix as the backend holds them (block drafters share
 * them instead of uploading them again). */
const dsp_bweight *dsp_fwd_embd(const dsp_fwd *f);
const dsp_bweight *dsp_fwd_output(const dsp_fwd *f);
dsp_status dsp_fwd_seq_init(dsp_fwd *f, dsp_kv_seq *s); /* empty sequence with capacity n_ctx (salt 0) */

/* Run the batch. Preconditions are checked (bad input is an error, nothing is changed): ids in
 * vocabulary, seq indices valid, each sequence's positions consecutive from its KV length, the
 * context limit. On success each sequence's KV length is its last position + 1.
 * logits: (n_logits, n_vocab) in logit_rows order on the host, may be NULL (they stay in
 * dsp_fwd_logits then). taps: (n_tokens, n_taps, n_embd) on the host, may be NULL (they stay in
 * dsp_fwd_taps then). */
dsp_status dsp_fwd_run(dsp_fwd *f, dsp_kv_seq *const *seqs, int n_seqs, const dsp_batch *b, float *logits, float *taps);
/* After a dsp_fwd_run (which may pass logits = NULL then): the sampler's greedy token of each of
 * its first n_rows logits rows (backend.h argmax: -1 for a row with no finite logit), computed where
 * the logits are, so that no vocabulary row crosses to the host. DSP_ERR_UNSUPPORTED if the
 * backend cannot (dsp_fwd_has_argmax). */
bool dsp_fwd_has_argmax(const dsp_fwd *f);
dsp_status dsp_fwd_argmax(dsp_fwd *f, int n_rows, int32_t *out);

#endif
