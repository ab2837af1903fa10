/* model/forward: the llama-family forward pass over a ragged batch. See forward.h.
 *
 * Per layer (pre-norm decoder):
 *   h = rmsnorm(x) * attn_norm
 *   q, k, v = h·Wq, h·Wk, h·Wv (+ bias: qwen2); per-head rmsnorm of q, k (qwen3); RoPE(q, k)
 *   k, v -> KV cache at (seq, pos);  a = causal GQA attention over the sequence's cache
 *   x += a·Wo
 *   h = rmsnorm(x) * ffn_norm;  x += (silu(h·Wgate) * h·Wup)·Wdown
 * logits = (rmsnorm(x) * output_norm)·Wout, for the requested rows only. */
#include "model/forward.h"

#include "backend/cpu/ops.h"
#include "core/quant.h"
#include "core/threads.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dsp_fwd {
    const dsp_model *m;
    const dsp_hparams *hp;
    const dsp_weights *w;
    dsp_pool *pool;
    const dsp_cpu_ops *ops; /* kernels for this CPU, chosen once */
    dsp_kv_pool kv;
    int max_tokens;
    uint32_t n_ctx;
    int q_dim, kv_dim, max_in;
    float *inv_freq;   /* (rope_dim/2) */
    /* activations, (max_tokens, width) */
    float *x, *h, *q, *k, *v, *att, *gate, *up, *rope_cs;
    /* per thread */
    float *wrow;       /* (n_threads, DSP_CPU_MM_ROWS, mm_stride) dequantized weight rows, 64-byte aligned */
    size_t wrow_per_thread;
    float *scores;     /* (n_threads, heads per kv head, n_ctx) attention scores */
    int32_t *seq_first; /* per-batch scratch: first row of each seq (sized at run by n_seqs <= max_tokens) */
};

dsp_fwd_params dsp_fwd_default_params(void) {
    dsp_fwd_params p = {0, 512, 0, 0, 16};
    return p;
}

dsp_kv_pool *dsp_fwd_kv(dsp_fwd *f) { return &f->kv; }
uint32_t dsp_fwd_n_ctx(const dsp_fwd *f) { return f->n_ctx; }
int dsp_fwd_max_batch(const dsp_fwd *f) { return f->max_tokens; }
int dsp_fwd_n_vocab(const dsp_fwd *f) { return f->hp->n_vocab; }
int dsp_fwd_n_embd(const dsp_fwd *f) { return f->hp->n_embd; }

dsp_status dsp_fwd_seq_init(dsp_fwd *f, dsp_kv_seq *s) { return dsp_kv_seq_init(s, f->n_ctx, f->kv.block_tokens); }

void dsp_fwd_destroy(dsp_fwd *f) {
    if (!f) return;
    dsp_pool_destroy(f->pool);
    dsp_kv_pool_destroy(&f->kv);
    free(f->inv_freq);
    free(f->x), free(f->h), free(f->q), free(f->k), free(f->v), free(f->att), free(f->gate), free(f->up), free(f->rope_cs);
    free(f->wrow), free(f->scores), free(f->seq_first);
    free(f);
}

/* 64-byte aligned: full-width vector loads of activation rows (whose widths are multiples of 16 in
 * every model we know) then never straddle a cache line */
static float *falloc(size_t n, bool *ok) {
    size_t bytes = ((n ? n : 1) * sizeof(float) + 63) / 64 * 64;
    float *p = aligned_alloc(64, bytes);
    if (!p) *ok = false;
    return p;
}

dsp_status dsp_fwd_create(const dsp_model *m, const dsp_fwd_params *pp, dsp_fwd **out) {
    *out = NULL;
    if (!m->has_weights) return dsp_error(DSP_ERR_INVALID_ARG, "model was loaded vocab-only; it cannot run a forward pass");
    dsp_fwd_params p = pp ? *pp : dsp_fwd_default_params();
    const dsp_hparams *hp = &m->hp;
    if (p.n_threads <= 0) p.n_threads = dsp_physical_cores();
    if (p.max_batch_tokens <= 0) p.max_batch_tokens = 512;
    if (p.block_tokens <= 0) p.block_tokens = 16;
    if (p.n_ctx == 0) p.n_ctx = (uint32_t)(hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096);
    if (p.n_ctx > (uint32_t)hp->n_ctx_train)
        return dsp_error(DSP_ERR_INVALID_ARG, "context %u is larger than the model's training context %d", p.n_ctx, hp->n_ctx_train);
    if (p.kv_tokens == 0) p.kv_tokens = p.n_ctx;
    if (p.max_batch_tokens > 65536) return dsp_error(DSP_ERR_INVALID_ARG, "max batch tokens %d too large", p.max_batch_tokens);
    dsp_fwd *f = calloc(1, sizeof *f);
    if (!f) return dsp_error(DSP_ERR_NOMEM, "no memory");
    f->m = m;
    f->hp = hp;
    f->w = &m->w;
    f->max_tokens = p.max_batch_tokens;
    f->n_ctx = p.n_ctx;
    f->q_dim = hp->n_head * hp->head_dim;
    f->kv_dim = hp->n_head_kv * hp->head_dim;
    f->ops = dsp_cpu_ops_best();
    f->max_in = hp->n_embd;
    if (hp->n_ff > f->max_in) f->max_in = hp->n_ff;
    if (f->q_dim > f->max_in) f->max_in = f->q_dim;
    dsp_status st = dsp_pool_create(p.n_threads, &f->pool);
    if (!st) st = dsp_kv_pool_create(&f->kv, hp->n_layer, f->kv_dim, p.block_tokens, (p.kv_tokens + (uint32_t)p.block_tokens - 1) / (uint32_t)p.block_tokens);
    if (st) {
        dsp_fwd_destroy(f);
        return st;
    }
    size_t T = (size_t)f->max_tokens;
    int nt = dsp_pool_size(f->pool);
    bool ok = true;
    f->inv_freq = falloc((size_t)hp->rope_dim / 2, &ok);
    f->x = falloc(T * hp->n_embd, &ok);
    f->h = falloc(T * hp->n_embd, &ok);
    f->q = falloc(T * f->q_dim, &ok);
    f->k = falloc(T * f->kv_dim, &ok);
    f->v = falloc(T * f->kv_dim, &ok);
    f->att = falloc(T * f->q_dim, &ok);
    f->gate = falloc(T * hp->n_ff, &ok);
    f->up = falloc(T * hp->n_ff, &ok);
    f->rope_cs = falloc(T * hp->rope_dim, &ok);
    f->wrow_per_thread = (size_t)DSP_CPU_MM_ROWS * (size_t)dsp_cpu_mm_stride(f->max_in);
    f->wrow = aligned_alloc(64, (size_t)nt * f->wrow_per_thread * sizeof(float));
    if (!f->wrow) ok = false;
    f->scores = falloc((size_t)nt * (size_t)(hp->n_head / hp->n_head_kv) * f->n_ctx, &ok);
    f->seq_first = malloc(T * sizeof *f->seq_first);
    if (!ok || !f->seq_first) {
        dsp_fwd_destroy(f);
        return dsp_error(DSP_ERR_NOMEM, "no memory for the forward scratch (%zu tokens)", T);
    }
    const float *ff = f->w->rope_freqs ? (const float *)f->w->rope_freqs->data : NULL;
    for (int i = 0; i < hp->rope_dim / 2; i++) {
        float inv = 1.0f / powf(hp->rope_base, (float)(2 * i) / (float)hp->rope_dim);
        f->inv_freq[i] = ff ? inv / ff[i] : inv;
    }
    *out = f;
    return DSP_OK;
}

/* ---- matmul: y[i, j] = sum_k x[i, k] * W[j, k] (+ bias[j]) ---------------------------------- */

/* A job of up to 3 matmuls over the same activations (q/k/v, gate/up): one pool run, tasks are
 * DSP_CPU_MM_ROWS-row chunks of each weight in turn. Each output element is computed by one task
 * with the kernel's fixed order, so the split never changes a value. */
typedef struct mm_job {
    dsp_fwd *f;
    int n_mats;
    const dsp_tensor *w[3];
    float *y[3];
    int first_task[4]; /* task index where matrix m starts; first_task[n_mats] = n_tasks */
    const float *x;
    int n_rows;        /* rows of x */
} mm_job;

static void mm_task(void *ctx, int task, int thread) {
    mm_job *j = ctx;
    int m = 0;
    while (task >= j->first_task[m + 1]) m++;
    const dsp_tensor *w = j->w[m];
    int64_t in = (int64_t)w->ne[0], out = (int64_t)w->ne[1];
    int64_t r0 = (int64_t)(task - j->first_task[m]) * DSP_CPU_MM_ROWS, r1 = r0 + DSP_CPU_MM_ROWS < out ? r0 + DSP_CPU_MM_ROWS : out;
    j->f->ops->matmul(w->type, w->data, dsp_dtype_row_bytes(w->type, (uint64_t)in), in, r0, r1, j->x, in, j->n_rows, j->y[m], out,
                      j->f->wrow + (size_t)thread * j->f->wrow_per_thread);
}

static void add_bias(const dsp_tensor *bias, float *y, int n_rows, int64_t out) {
    if (!bias) return;
    const float *b = bias->data;
    for (int i = 0; i < n_rows; i++)
        for (int64_t r = 0; r < out; r++) y[(size_t)i * out + r] += b[r];
}

/* y_m[i, r] = sum_k x[i, k] * W_m[r, k] for each of the n matrices (same input width) */
static void matmul_n(dsp_fwd *f, int n, const dsp_tensor *const *w, float *const *y, const float *x, int n_rows) {
    mm_job j = {.f = f, .n_mats = n, .x = x, .n_rows = n_rows};
    j.first_task[0] = 0;
    for (int m = 0; m < n; m++) {
        j.w[m] = w[m];
        j.y[m] = y[m];
        j.first_task[m + 1] = j.first_task[m] + (int)((w[m]->ne[1] + DSP_CPU_MM_ROWS - 1) / DSP_CPU_MM_ROWS);
    }
    dsp_pool_run(f->pool, j.first_task[n], mm_task, &j);
}

static void matmul(dsp_fwd *f, const dsp_tensor *w, const dsp_tensor *bias, const float *x, int n_rows, float *y) {
    matmul_n(f, 1, &w, &y, x, n_rows);
    add_bias(bias, y, n_rows, (int64_t)w->ne[1]);
}

/* ---- attention ------------------------------------------------------------------------------ */

typedef struct att_job {
    dsp_fwd *f;
    int layer;
    dsp_kv_seq *const *seqs;
    const dsp_batch *b;
} att_job;

/* One task = one token x one KV head: the group of query heads that share it (GQA) is served by a
 * single pass over the keys and values. Per head the order is fixed: scores in key order, softmax,
 * then o = sum_t p_t * v_t accumulated in key order. */
static void att_task(void *ctx, int task, int thread) {
    att_job *j = ctx;
    dsp_fwd *f = j->f;
    const dsp_hparams *hp = f->hp;
    const dsp_cpu_ops *ops = f->ops;
    const int grp = hp->n_head / hp->n_head_kv, hd = hp->head_dim;
    const int i = task / hp->n_head_kv, kvh = task % hp->n_head_kv;
    const dsp_kv_seq *s = j->seqs[j->b->seq[i]];
    const uint32_t n_keys = (uint32_t)j->b->pos[i] + 1; /* causal: keys at positions 0..pos */
    const float *q = f->q + (size_t)i * f->q_dim + (size_t)kvh * grp * hd;
    float *sc = f->scores + (size_t)thread * grp * f->n_ctx;
    const float scale = 1.0f / sqrtf((float)hd);
    for (uint32_t t = 0; t < n_keys; t++) {
        const float *kr = dsp_kv_k(&f->kv, s, j->layer, t) + (size_t)kvh * hd;
        for (int g = 0; g < grp; g++) sc[(size_t)g * f->n_ctx + t] = ops->dot(q + (size_t)g * hd, kr, hd) * scale;
    }
    for (int g = 0; g < grp; g++) ops->softmax(sc + (size_t)g * f->n_ctx, n_keys);
    float *o = f->att + (size_t)i * f->q_dim + (size_t)kvh * grp * hd;
    memset(o, 0, (size_t)grp * hd * sizeof(float));
    for (uint32_t t = 0; t < n_keys; t++) {
        const float *vr = dsp_kv_v(&f->kv, s, j->layer, t) + (size_t)kvh * hd;
        for (int g = 0; g < grp; g++) ops->axpy(o + (size_t)g * hd, sc[(size_t)g * f->n_ctx + t], vr, hd);
    }
}

/* ---- the pass ------------------------------------------------------------------------------- */

static dsp_status validate(dsp_fwd *f, dsp_kv_seq *const *seqs, int n_seqs, const dsp_batch *b) {
    const dsp_hparams *hp = f->hp;
    if (b->n_tokens < 1 || b->n_tokens > f->max_tokens)
        return dsp_error(DSP_ERR_INVALID_ARG, "batch of %d tokens (must be 1..%d)", b->n_tokens, f->max_tokens);
    if (n_seqs < 1 || n_seqs > f->max_tokens) return dsp_error(DSP_ERR_INVALID_ARG, "batch has %d sequences", n_seqs);
    if (b->n_logits < 0 || b->n_logits > b->n_tokens) return dsp_error(DSP_ERR_INVALID_ARG, "%d logit rows for %d tokens", b->n_logits, b->n_tokens);
    for (int t = 0; t < b->n_taps; t++)
        if (b->tap_layers[t] < 0 || b->tap_layers[t] >= hp->n_layer)
            return dsp_error(DSP_ERR_INVALID_ARG, "tap layer %d out of range (model has %d layers)", b->tap_layers[t], hp->n_layer);
    for (int r = 0; r < b->n_logits; r++)
        if (b->logit_rows[r] < 0 || b->logit_rows[r] >= b->n_tokens)
            return dsp_error(DSP_ERR_INVALID_ARG, "logit row %d out of range", b->logit_rows[r]);
    /* next expected position per sequence, tracked in seq_first[] (reused as scratch) */
    int32_t *next = f->seq_first;
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
    const dsp_hparams *hp = f->hp;
    const dsp_weights *w = f->w;
    int n = b->n_tokens, E = hp->n_embd, hd = hp->head_dim;
    /* KV space: every sequence's new end (seq_first[] holds it after validate) */
    for (int s = 0; s < n_seqs; s++) {
        if ((uint32_t)f->seq_first[s] == seqs[s]->n_tokens) continue;
        if ((st = dsp_kv_seq_reserve(&f->kv, seqs[s], (uint32_t)f->seq_first[s])) ||
            (st = dsp_kv_seq_make_writable(&f->kv, seqs[s], seqs[s]->n_tokens)))
            return st;
    }
    /* embeddings */
    size_t erow = dsp_dtype_row_bytes(w->tok_embd->type, (uint64_t)E);
    const dsp_cpu_ops *ops = f->ops;
    for (int i = 0; i < n; i++)
        ops->dequant_row(w->tok_embd->type, (const uint8_t *)w->tok_embd->data + (size_t)b->tokens[i] * erow, f->x + (size_t)i * E, (int64_t)E);
    /* RoPE (cos, sin) per row */
    int half = hp->rope_dim / 2;
    for (int i = 0; i < n; i++) {
        float p = (float)b->pos[i] / hp->rope_scale, *cs = f->rope_cs + (size_t)i * hp->rope_dim;
        for (int k = 0; k < half; k++) {
            float a = p * f->inv_freq[k];
            cs[2 * k] = cosf(a) * hp->rope_attn_factor; /* yarn; exactly 1 otherwise */
            cs[2 * k + 1] = sinf(a) * hp->rope_attn_factor;
        }
    }
    for (int l = 0; l < hp->n_layer; l++) {
        const dsp_layer_weights *L = &w->layers[l];
        for (int i = 0; i < n; i++) ops->rmsnorm(f->h + (size_t)i * E, f->x + (size_t)i * E, L->attn_norm->data, E, hp->rms_eps);
        {
            const dsp_tensor *wqkv[3] = {L->wq, L->wk, L->wv};
            float *yqkv[3] = {f->q, f->k, f->v};
            matmul_n(f, 3, wqkv, yqkv, f->h, n);
            add_bias(L->bq, f->q, n, f->q_dim);
            add_bias(L->bk, f->k, n, f->kv_dim);
            add_bias(L->bv, f->v, n, f->kv_dim);
        }
        for (int i = 0; i < n; i++) {
            const float *cs = f->rope_cs + (size_t)i * hp->rope_dim;
            for (int h = 0; h < hp->n_head; h++) {
                float *qh = f->q + (size_t)i * f->q_dim + (size_t)h * hd;
                if (L->q_norm) ops->rmsnorm(qh, qh, L->q_norm->data, hd, hp->rms_eps);
                ops->rope(qh, cs, hp->rope_dim, hp->rope_neox);
            }
            for (int h = 0; h < hp->n_head_kv; h++) {
                float *kh = f->k + (size_t)i * f->kv_dim + (size_t)h * hd;
                if (L->k_norm) ops->rmsnorm(kh, kh, L->k_norm->data, hd, hp->rms_eps);
                ops->rope(kh, cs, hp->rope_dim, hp->rope_neox);
            }
            const dsp_kv_seq *s = seqs[b->seq[i]];
            memcpy(dsp_kv_k(&f->kv, s, l, (uint32_t)b->pos[i]), f->k + (size_t)i * f->kv_dim, (size_t)f->kv_dim * sizeof(float));
            memcpy(dsp_kv_v(&f->kv, s, l, (uint32_t)b->pos[i]), f->v + (size_t)i * f->kv_dim, (size_t)f->kv_dim * sizeof(float));
        }
        att_job aj = {f, l, seqs, b};
        dsp_pool_run(f->pool, n * hp->n_head_kv, att_task, &aj);
        matmul(f, L->wo, NULL, f->att, n, f->h);
        for (size_t i = 0; i < (size_t)n * E; i++) f->x[i] += f->h[i];
        for (int i = 0; i < n; i++) ops->rmsnorm(f->h + (size_t)i * E, f->x + (size_t)i * E, L->ffn_norm->data, E, hp->rms_eps);
        {
            const dsp_tensor *wgu[2] = {L->ffn_gate, L->ffn_up};
            float *ygu[2] = {f->gate, f->up};
            matmul_n(f, 2, wgu, ygu, f->h, n);
        }
        for (int i = 0; i < n; i++) ops->swiglu(f->gate + (size_t)i * hp->n_ff, f->up + (size_t)i * hp->n_ff, hp->n_ff);
        matmul(f, L->ffn_down, NULL, f->gate, n, f->h);
        for (size_t i = 0; i < (size_t)n * E; i++) f->x[i] += f->h[i];
        for (int t = 0; t < b->n_taps; t++)
            if (b->tap_layers[t] == l)
                for (int i = 0; i < n; i++)
                    memcpy(taps + ((size_t)i * b->n_taps + t) * E, f->x + (size_t)i * E, (size_t)E * sizeof(float));
    }
    /* commit the new lengths before the head: the KV is written */
    for (int i = 0; i < n; i++) {
        dsp_kv_seq *s = seqs[b->seq[i]];
        if ((uint32_t)b->pos[i] + 1 > s->n_tokens) s->n_tokens = (uint32_t)b->pos[i] + 1;
    }
    if (b->n_logits > 0) {
        for (int r = 0; r < b->n_logits; r++)
            ops->rmsnorm(f->h + (size_t)r * E, f->x + (size_t)b->logit_rows[r] * E, w->out_norm->data, E, hp->rms_eps);
        matmul(f, w->output, NULL, f->h, b->n_logits, logits);
    }
    return DSP_OK;
}
