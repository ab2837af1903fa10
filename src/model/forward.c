/* model/forward: the llama-family forward pass over a ragged batch. See forward.h.
 *
 * Per layer (pre-norm decoder):
 *   h = rmsnorm(x) * attn_norm
 *   q, k, v = h·Wq, h·Wk, h·Wv (+ bias: qwen2); per-head rmsnorm of q, k (qwen3); RoPE(q, k)
 *   k, v -> KV cache at (seq, pos);  a = causal GQA attention over the sequence's cache
 *   x += a·Wo
 *   h = rmsnorm(x) * ffn_norm;  x += (silu(h·Wgate) * h·Wup)·Wdown
 * logits = (rmsnorm(x) * output_norm)·Wout, for the requested rows only.
 *
 * Written once, as backend ops (backend/backend.h) on backend buffers: the same code runs on the
 * CPU and on the GPU. The host only builds the batch description, writes the inputs and reads the
 * logits (and taps) back. */
#include "model/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct fwd_layer {
    dsp_bweight *attn_norm, *wq, *wk, *wv, *wo, *bq, *bk, *bv, *q_norm, *k_norm;
    dsp_bweight *ffn_norm, *ffn_gate, *ffn_up, *ffn_down;
} fwd_layer;

struct dsp_fwd {
    const dsp_model *m;
    const dsp_hparams *hp;
    dsp_backend *be;
    bool own_be;
    dsp_kv_pool kv;
    dsp_kv_store *store;
    int max_tokens, max_logits, max_taps;
    uint32_t n_ctx;
    int q_dim, kv_dim;
    /* weights as the backend holds them */
    dsp_bweight *tok_embd, *out_norm, *output;
    fwd_layer *layers;         /* (n_layer) */
    /* activations, (max_tokens, width) */
    dsp_buf *x, *h, *q, *k, *v, *att, *gate, *up;
    dsp_buf *logits;           /* (max_logits, n_vocab) */
    dsp_buf *taps;             /* (max_tokens, max_taps, n_embd) when max_taps > 0 */
    dsp_buf *inv_freq;         /* (rope_dim / 2) */
    dsp_rope rope;
    int32_t *n_keys;           /* (max_tokens) host scratch for the batch description */
    int32_t *next;             /* (max_tokens) host scratch: next expected position per sequence */
};

dsp_fwd_params dsp_fwd_default_params(void) {
    dsp_fwd_params p;
    memset(&p, 0, sizeof p);
    p.max_batch_tokens = 512;
    p.block_tokens = 16;
    return p;
}

dsp_kv_pool *dsp_fwd_kv(dsp_fwd *f) { return &f->kv; }
dsp_backend *dsp_fwd_backend(dsp_fwd *f) { return f->be; }
const dsp_buf *dsp_fwd_taps(const dsp_fwd *f) { return f->taps; }
const dsp_buf *dsp_fwd_logits(const dsp_fwd *f) { return f->logits; }
uint32_t dsp_fwd_n_ctx(const dsp_fwd *f) { return f->n_ctx; }
int dsp_fwd_max_batch(const dsp_fwd *f) { return f->max_tokens; }
int dsp_fwd_max_logits(const dsp_fwd *f) { return f->max_logits; }
int dsp_fwd_n_vocab(const dsp_fwd *f) { return f->hp->n_vocab; }
int dsp_fwd_n_embd(const dsp_fwd *f) { return f->hp->n_embd; }
const dsp_bweight *dsp_fwd_embd(const dsp_fwd *f) { return f->tok_embd; }
const dsp_bweight *dsp_fwd_output(const dsp_fwd *f) { return f->output; }

dsp_status dsp_fwd_seq_init(dsp_fwd *f, dsp_kv_seq *s) { return dsp_kv_seq_init(s, f->n_ctx, f->kv.block_tokens, 0); }

static dsp_status copy_block(void *ctx, uint32_t dst, uint32_t src) {
    dsp_fwd *f = ctx;
    return f->be->ops->kv_copy_block(f->be, f->store, dst, src);
}

static void wfree(dsp_fwd *f, dsp_bweight *w) {
    if (w) f->be->ops->weight_destroy(f->be, w);
}

void dsp_fwd_destroy(dsp_fwd *f) {
    if (!f) return;
    if (f->be) {
        const dsp_backend_ops *o = f->be->ops;
        dsp_buf *bufs[] = {f->x, f->h, f->q, f->k, f->v, f->att, f->gate, f->up, f->logits, f->taps, f->inv_freq};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) o->buf_destroy(f->be, bufs[i]);
        if (f->store) o->kv_destroy(f->be, f->store);
        if (f->output != f->tok_embd) wfree(f, f->output);
        wfree(f, f->tok_embd);
        wfree(f, f->out_norm);
        if (f->layers)
            for (int l = 0; l < f->hp->n_layer; l++) {
                fwd_layer *L = &f->layers[l];
                dsp_bweight *ws[] = {L->attn_norm, L->wq, L->wk, L->wv, L->wo, L->bq, L->bk, L->bv, L->q_norm, L->k_norm,
                                     L->ffn_norm, L->ffn_gate, L->ffn_up, L->ffn_down};
                for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) wfree(f, ws[i]);
            }
        if (f->own_be) dsp_backend_destroy(f->be);
    }
    free(f->layers);
    dsp_kv_pool_destroy(&f->kv);
    free(f->n_keys), free(f->next);
    free(f);
}

/* upload (CPU: wrap) one weight; NULL tensors (optional weights) stay NULL */
static dsp_status wup(dsp_fwd *f, const dsp_tensor *t, dsp_bweight **out) {
    *out = NULL;
    return t ? f->be->ops->weight_create(f->be, t, out) : DSP_OK;
}

static dsp_status upload_weights(dsp_fwd *f) {
    const dsp_weights *w = &f->m->w;
    dsp_status st;
    if ((st = wup(f, w->tok_embd, &f->tok_embd)) || (st = wup(f, w->out_norm, &f->out_norm))) return st;
    if (w->output == w->tok_embd) f->output = f->tok_embd;
    else if ((st = wup(f, w->output, &f->output))) return st;
    f->layers = calloc((size_t)f->hp->n_layer, sizeof *f->layers);
    if (!f->layers) return dsp_error(DSP_ERR_NOMEM, "no memory");
    for (int l = 0; l < f->hp->n_layer; l++) {
        const dsp_layer_weights *W = &w->layers[l];
        fwd_layer *L = &f->layers[l];
        if ((st = wup(f, W->attn_norm, &L->attn_norm)) || (st = wup(f, W->wq, &L->wq)) || (st = wup(f, W->wk, &L->wk)) ||
            (st = wup(f, W->wv, &L->wv)) || (st = wup(f, W->wo, &L->wo)) || (st = wup(f, W->bq, &L->bq)) || (st = wup(f, W->bk, &L->bk)) ||
            (st = wup(f, W->bv, &L->bv)) || (st = wup(f, W->q_norm, &L->q_norm)) || (st = wup(f, W->k_norm, &L->k_norm)) ||
            (st = wup(f, W->ffn_norm, &L->ffn_norm)) || (st = wup(f, W->ffn_gate, &L->ffn_gate)) || (st = wup(f, W->ffn_up, &L->ffn_up)) ||
            (st = wup(f, W->ffn_down, &L->ffn_down)))
            return st;
    }
    return DSP_OK;
}

dsp_status dsp_fwd_create(const dsp_model *m, const dsp_fwd_params *pp, dsp_fwd **out) {
    *out = NULL;
    if (!m->has_weights) return dsp_error(DSP_ERR_INVALID_ARG, "model was loaded vocab-only; it cannot run a forward pass");
    dsp_fwd_params p = pp ? *pp : dsp_fwd_default_params();
    const dsp_hparams *hp = &m->hp;
    if (p.max_batch_tokens <= 0) p.max_batch_tokens = 512;
    if (p.max_batch_tokens > 65536) return dsp_error(DSP_ERR_INVALID_ARG, "max batch tokens %d too large (at most 65536)", p.max_batch_tokens);
    if (p.max_logits <= 0) p.max_logits = p.max_batch_tokens < 64 ? p.max_batch_tokens : 64;
    if (p.max_logits > p.max_batch_tokens) p.max_logits = p.max_batch_tokens;
    if (p.max_taps < 0 || p.max_taps > 64) return dsp_error(DSP_ERR_INVALID_ARG, "max taps %d out of range (0..64)", p.max_taps);
    if (p.block_tokens <= 0) p.block_tokens = 16;
    if (p.n_ctx == 0) p.n_ctx = (uint32_t)(hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096);
    if (p.n_ctx > (uint32_t)hp->n_ctx_train)
        return dsp_error(DSP_ERR_INVALID_ARG, "context %u is larger than the model's training context %d", p.n_ctx, hp->n_ctx_train);
    if (p.kv_tokens == 0) p.kv_tokens = p.n_ctx;
    dsp_fwd *f = calloc(1, sizeof *f);
    if (!f) return dsp_error(DSP_ERR_NOMEM, "no memory");
    f->m = m;
    f->hp = hp;
    f->max_tokens = p.max_batch_tokens;
    f->max_logits = p.max_logits;
    f->max_taps = p.max_taps;
    f->n_ctx = p.n_ctx;
    f->q_dim = hp->q_dim;
    f->kv_dim = hp->kv_dim;
    dsp_status st = DSP_OK;
    if (p.backend) {
        f->be = p.backend;
    } else {
        dsp_backend_params bp = {.kind = DSP_BACKEND_CPU, .n_threads = p.n_threads, .f32_activations = p.f32_activations};
        st = dsp_backend_create(&bp, &f->be);
        f->own_be = true;
    }
    uint32_t n_blocks = (uint32_t)(((uint64_t)p.kv_tokens + (uint64_t)p.block_tokens - 1) / (uint64_t)p.block_tokens);
    if (!st) st = dsp_kv_pool_create(&f->kv, p.block_tokens, n_blocks, p.prefix_cache);
    if (st) {
        dsp_fwd_destroy(f);
        return st;
    }
    const dsp_backend_ops *o = f->be->ops;
    int max_in = hp->n_embd;
    if (hp->n_ff > max_in) max_in = hp->n_ff;
    if (f->q_dim > max_in) max_in = f->q_dim;
    dsp_be_limits lim = {f->max_tokens, max_in, hp->n_head / hp->n_head_kv, f->n_ctx, hp->rope_dim};
    size_t T = (size_t)f->max_tokens, E = (size_t)hp->n_embd;
    if ((st = o->reserve(f->be, &lim)) || (st = o->kv_create(f->be, hp->n_layer, f->kv_dim, p.block_tokens, n_blocks, &f->store)) ||
        (st = dsp_kv_pool_add_store(&f->kv, copy_block, f)) || (st = upload_weights(f)) || (st = o->buf_create(f->be, T * E, &f->x)) ||
        (st = o->buf_create(f->be, T * E, &f->h)) || (st = o->buf_create(f->be, T * (size_t)f->q_dim, &f->q)) ||
        (st = o->buf_create(f->be, T * (size_t)f->kv_dim, &f->k)) || (st = o->buf_create(f->be, T * (size_t)f->kv_dim, &f->v)) ||
        (st = o->buf_create(f->be, T * (size_t)f->q_dim, &f->att)) || (st = o->buf_create(f->be, T * (size_t)hp->n_ff, &f->gate)) ||
        (st = o->buf_create(f->be, T * (size_t)hp->n_ff, &f->up)) ||
        (st = o->buf_create(f->be, (size_t)f->max_logits * (size_t)hp->n_vocab, &f->logits)) ||
        (st = o->buf_create(f->be, (size_t)hp->rope_dim / 2, &f->inv_freq)) ||
        (f->max_taps > 0 && (st = o->buf_create(f->be, T * (size_t)f->max_taps * E, &f->taps)))) {
        dsp_fwd_destroy(f);
        return st;
    }
    f->n_keys = malloc(T * sizeof *f->n_keys);
    f->next = malloc(T * sizeof *f->next);
    float *inv = malloc((size_t)(hp->rope_dim / 2 > 0 ? hp->rope_dim / 2 : 1) * sizeof(float));
    if (!f->n_keys || !f->next || !inv) {
        free(inv);
        dsp_fwd_destroy(f);
        return dsp_error(DSP_ERR_NOMEM, "no memory for the forward scratch (%zu tokens)", T);
    }
    const float *ff = m->w.rope_freqs ? (const float *)m->w.rope_freqs->data : NULL;
    for (int i = 0; i < hp->rope_dim / 2; i++) {
        float v = 1.0f / powf(hp->rope_base, (float)(2 * i) / (float)hp->rope_dim);
        inv[i] = ff ? v / ff[i] : v;
    }
    o->buf_write(f->be, f->inv_freq, 0, inv, (size_t)hp->rope_dim / 2);
    free(inv);
    f->rope = (dsp_rope){hp->rope_dim, hp->rope_neox, hp->rope_scale, hp->rope_attn_factor, f->inv_freq};
    *out = f;
    return DSP_OK;
}

/* ---- the pass ------------------------------------------------------------------------------- */

static dsp_status validate(dsp_fwd *f, dsp_kv_seq *const *seqs, int n_seqs, const dsp_batch *b) {
    const dsp_hparams *hp = f->hp;
    if (b->n_tokens < 1 || b->n_tokens > f->max_tokens)
        return dsp_error(DSP_ERR_INVALID_ARG, "batch of %d tokens (must be 1..%d)", b->n_tokens, f->max_tokens);
    if (n_seqs < 1 || n_seqs > f->max_tokens) return dsp_error(DSP_ERR_INVALID_ARG, "batch has %d sequences", n_seqs);
    if (b->n_logits < 0 || b->n_logits > b->n_tokens || b->n_logits > f->max_logits)
        return dsp_error(DSP_ERR_INVALID_ARG, "%d logit rows for %d tokens (at most %d)", b->n_logits, b->n_tokens, f->max_logits);
    if (b->n_taps < 0 || b->n_taps > f->max_taps)
        return dsp_error(DSP_ERR_INVALID_ARG, "%d tap layers asked, this forward was created for at most %d", b->n_taps, f->max_taps);
    for (int t = 0; t < b->n_taps; t++)
        if (b->tap_layers[t] < -1 || b->tap_layers[t] >= hp->n_layer) /* -1: the embedding output */
            return dsp_error(DSP_ERR_INVALID_ARG, "tap layer %d out of range (model has %d layers)", b->tap_layers[t], hp->n_layer);
    for (int r = 0; r < b->n_logits; r++)
        if (b->logit_rows[r] < 0 || b->logit_rows[r] >= b->n_tokens)
            return dsp_error(DSP_ERR_INVALID_ARG, "logit row %d out of range", b->logit_rows[r]);
    int32_t *next = f->next;
    for (int s = 0; s < n_seqs; s++) next[s] = (int32_t)seqs[s]->n_tokens;
    for (int i = 0; i < b->n_tokens; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= hp->n_vocab)
            return dsp_error(DSP_ERR_INVALID_ARG, "token id %d out of range (vocabulary %d)", b->tokens[i], hp->n_vocab);
        int s = b->seq[i];
        if (s < 0 || s >= n_seqs) return dsp_error(DSP_ERR_INVALID_ARG, "row %d: sequence index %d out of range", i, s);
        if (b->pos[i] != next[s])
            return dsp_error(DSP_ERR_INVALID_ARG, "row %d: position %d, expected %d (positions of a sequence must continue its cache)", i,
                             b->pos[i], next[s]);
        if ((uint32_t)b->pos[i] >= f->n_ctx)
            return dsp_error(DSP_ERR_RANGE, "context length exceeded: position %d, the context is %u tokens", b->pos[i], f->n_ctx);
        next[s]++;
    }
    return DSP_OK;
}

dsp_status dsp_fwd_run(dsp_fwd *f, dsp_kv_seq *const *seqs, int n_seqs, const dsp_batch *b, float *logits, float *taps) {
    dsp_status st = validate(f, seqs, n_seqs, b);
    if (st) return st;
    /* KV space: every sequence's new end (next[] holds it after validate) */
    for (int s = 0; s < n_seqs; s++) {
        if ((uint32_t)f->next[s] == seqs[s]->n_tokens) continue;
        if ((st = dsp_kv_seq_reserve(&f->kv, seqs[s], (uint32_t)f->next[s])) ||
            (st = dsp_kv_seq_make_writable(&f->kv, seqs[s], seqs[s]->n_tokens)))
            return st;
    }
    const dsp_hparams *hp = f->hp;
    dsp_backend *be = f->be;
    const dsp_backend_ops *o = be->ops;
    const int n = b->n_tokens, E = hp->n_embd, nt = b->n_taps;
    const size_t nE = (size_t)n * (size_t)E;
    for (int i = 0; i < n; i++) f->n_keys[i] = b->pos[i] + 1; /* causal */
    dsp_be_batch bb = {n, b->tokens, b->pos, b->seq, f->n_keys, n_seqs, (const dsp_kv_seq *const *)seqs};
    if ((st = o->begin(be, &bb))) return st;
    o->embed(be, f->x, f->tok_embd, E);
    const float scale = 1.0f / sqrtf((float)hp->head_dim);
    for (int t = 0; t < nt; t++) /* tap -1: the embedding output, the input of layer 0 */
        if (b->tap_layers[t] == -1) o->copy_rows(be, f->taps, (size_t)nt * E, (size_t)t * E, f->x, (size_t)E, 0, n, (size_t)E);
    for (int l = 0; l < hp->n_layer; l++) {
        const fwd_layer *L = &f->layers[l];
        o->rmsnorm(be, f->h, f->x, L->attn_norm, n, E, hp->rms_eps, NULL);
        const dsp_bweight *wqkv[3] = {L->wq, L->wk, L->wv};
        dsp_buf *yqkv[3] = {f->q, f->k, f->v};
        o->matmul(be, 3, wqkv, yqkv, f->h, n);
        if (L->bq) {
            o->add_bias(be, f->q, L->bq, n, f->q_dim);
            o->add_bias(be, f->k, L->bk, n, f->kv_dim);
            o->add_bias(be, f->v, L->bv, n, f->kv_dim);
        }
        o->norm_rope(be, f->q, L->q_norm, hp->rms_eps, hp->n_head, hp->head_dim, &f->rope);
        o->norm_rope(be, f->k, L->k_norm, hp->rms_eps, hp->n_head_kv, hp->head_dim, &f->rope);
        o->kv_write(be, f->store, l, f->k, f->v);
        o->attention(be, f->att, f->q, f->store, l, hp->n_head, hp->n_head_kv, hp->head_dim, scale);
        o->matmul(be, 1, (const dsp_bweight *const *)&L->wo, &f->h, f->att, n);
        o->add(be, f->x, f->h, nE);
        o->rmsnorm(be, f->h, f->x, L->ffn_norm, n, E, hp->rms_eps, NULL);
        const dsp_bweight *wgu[2] = {L->ffn_gate, L->ffn_up};
        dsp_buf *ygu[2] = {f->gate, f->up};
        o->matmul(be, 2, wgu, ygu, f->h, n);
        o->swiglu(be, f->gate, f->up, (size_t)n * (size_t)hp->n_ff);
        o->matmul(be, 1, (const dsp_bweight *const *)&L->ffn_down, &f->h, f->gate, n);
        o->add(be, f->x, f->h, nE);
        for (int t = 0; t < nt; t++)
            if (b->tap_layers[t] == l) o->copy_rows(be, f->taps, (size_t)nt * E, (size_t)t * E, f->x, (size_t)E, 0, n, (size_t)E);
    }
    if (b->n_logits > 0) {
        o->rmsnorm(be, f->h, f->x, f->out_norm, b->n_logits, E, hp->rms_eps, b->logit_rows);
        o->matmul(be, 1, (const dsp_bweight *const *)&f->output, &f->logits, f->h, b->n_logits);
    }
    st = o->end(be);
    if (!st && b->n_logits > 0 && logits) st = o->buf_read(be, f->logits, 0, logits, (size_t)b->n_logits * (size_t)hp->n_vocab);
    if (!st && nt > 0 && taps) st = o->buf_read(be, f->taps, 0, taps, (size_t)n * (size_t)nt * E);
    if (st) return st;
    /* commit the new lengths: the KV is written */
    for (int i = 0; i < n; i++) {
        dsp_kv_seq *s = seqs[b->seq[i]];
        if ((uint32_t)b->pos[i] + 1 > s->n_tokens) s->n_tokens = (uint32_t)b->pos[i] + 1;
    }
    return DSP_OK;
}

bool dsp_fwd_has_argmax(const dsp_fwd *f) { return f->be->ops->argmax != NULL; }

dsp_status dsp_fwd_argmax(dsp_fwd *f, int n_rows, int32_t *out) {
    if (!f->be->ops->argmax) return dsp_error(DSP_ERR_UNSUPPORTED, "the %s backend has no argmax", f->be->ops->name);
    if (n_rows < 1 || n_rows > f->max_logits) return dsp_error(DSP_ERR_INVALID_ARG, "argmax of %d logits rows (at most %d)", n_rows, f->max_logits);
    return f->be->ops->argmax(f->be, f->logits, n_rows, f->hp->n_vocab, out);
}
