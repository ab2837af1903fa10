/* spec/block: the block drafter's two forward steps on backend ops (see block.h).
 *
 * Context step (every target forward), rows = the target's batch rows:
 *   C = rmsnorm(taps . fc^T) * hidden_norm                      (n, n_embd)
 *   per layer l: k = k_norm(C . Wk^T) with RoPE at the row's position, v = C . Wv^T -> store (l)
 * (C does not go through the layer's input norm: DRAFTERS.md §1.5.)
 *
 * Draft step (per round), rows = every drafting request's block [anchor, MASK x (n_slots-1)] at
 * positions start..start+n_slots-1, each attending to its sequence's keys [0, start + n_slots):
 *   x = embed(block);  per layer (pre-norm, as the target's): h = rmsnorm(x) * in_norm;
 *   q, k, v = h . W^T; q_norm / k_norm per head, RoPE; k, v -> store at the block positions;
 *   x += attention . Wo^T;  x += down(silu(gate(h')) * up(h')), h' = rmsnorm(x) * post_norm
 *   logits = (rmsnorm(x) * norm)[drafting slots] . head^T          -> host
 * then per slot k, sequentially (DSpark): prev = anchor (k = 0) or draft[k-1];
 *   confidence logit c_k = w . [h_k ; W1[prev]] + b                (host; h_k the normed row)
 *   Markov bias = W2 . W1[prev] (one small forward for all requests) added to slot k's logits;
 *   draft[k] = argmax (or a sample of softmax(z / T), whose distribution is kept as q).
 * With a draft vocabulary (block.h) "head" and W2 are gathered copies of N token rows: z has N
 * entries, argmax / samples / top-3 map back through vids, and q is scattered onto the whole
 * vocabulary (zero outside the subset).
 * Everything a step needs is allocated at attach; a step allocates nothing. */
#include "spec/block_internal.h"

#include "core/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void wfree(dsp_block_drafter *d, dsp_bweight **w) {
    if (*w) d->be->ops->weight_destroy(d->be, *w);
    *w = NULL;
}

void dsp_block_destroy(dsp_block_drafter *d) {
    if (!d) return;
    if (d->be) {
        const dsp_backend_ops *o = d->be->ops;
        dsp_buf *bufs[] = {d->x, d->h, d->q, d->k, d->v, d->att, d->gate, d->up, d->logits, d->mk_e, d->mk_y, d->mk_w1f, d->inv_freq};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) o->buf_destroy(d->be, bufs[i]);
        if (d->store) o->kv_destroy(d->be, d->store);
        wfree(d, &d->b_fc), wfree(d, &d->b_hnorm), wfree(d, &d->b_norm), wfree(d, &d->b_w2);
        if (d->own_embd) wfree(d, &d->b_embd);
        if (d->own_head) wfree(d, &d->b_head);
        for (int l = 0; d->layers && l < d->info.n_layers; l++) {
            blk_layer *L = &d->layers[l];
            dsp_bweight **ws[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->wo, &L->bq, &L->bk, &L->bv, &L->q_norm, &L->k_norm,
                                  &L->ffn_norm, &L->ffn_gate, &L->ffn_up, &L->ffn_down};
            for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) wfree(d, ws[i]);
        }
    }
    free(d->layers);
    free(d->btok), free(d->bpos), free(d->bseq), free(d->bkeys), free(d->brow), free(d->bseqs), free(d->bout0), free(d->bmrow);
    free(d->hlogits), free(d->hhid), free(d->he), free(d->hbias), free(d->conf_wf), free(d->btoks), free(d->bn), free(d->banchor);
    free(d->mk_pwf), free(d->mk_pbf), free(d->mk_state);
    free(d->vids), free(d->head_sub_mem), free(d->w2_sub_mem);
    dsp_model_destroy(d->m);
    free(d);
}

static dsp_status copy_block(void *ctx, uint32_t dst, uint32_t src) {
    dsp_block_drafter *d = ctx;
    return d->be->ops->kv_copy_block(d->be, d->store, dst, src);
}

static dsp_status wup(dsp_block_drafter *d, const dsp_tensor *t, dsp_bweight **out) {
    *out = NULL;
    return t ? d->be->ops->weight_create(d->be, t, out) : DSP_OK;
}

static dsp_status buf(dsp_block_drafter *d, size_t rows, size_t width, dsp_buf **out) {
    return d->be->ops->buf_create(d->be, rows * (width ? width : 1), out);
}

dsp_status dsp_block_attach(dsp_block_drafter *d, dsp_backend *be, dsp_kv_pool *pool, const dsp_bweight *target_embd,
                            const dsp_bweight *target_head, const dsp_block_limits *lim) {
    DSP_ASSERT(!d->be);
    if (lim->max_ctx_rows < 1 || lim->max_reqs < 1 || lim->n_ctx < 1)
        return dsp_error(DSP_ERR_INVALID_ARG, "drafter limits: %d context rows, %d requests, context %u", lim->max_ctx_rows, lim->max_reqs,
                         lim->n_ctx);
    d->be = be;
    d->pool = pool;
    d->lim = *lim;
    const dsp_block_info *in = &d->info;
    const dsp_hparams *hp = &d->m->hp;
    const dsp_backend_ops *o = be->ops;
    const size_t E = (size_t)hp->n_embd, V = (size_t)hp->n_vocab, qd = (size_t)hp->n_head * (size_t)hp->head_dim;
    const size_t kvd = (size_t)hp->n_head_kv * (size_t)hp->head_dim, F = (size_t)hp->n_ff, r = (size_t)in->markov_rank;
    const size_t R = (size_t)lim->max_reqs, nd = (size_t)in->n_draft;
    if (lim->n_vocab_draft < 0 || lim->n_vocab_draft > (int32_t)V)
        return dsp_error(DSP_ERR_INVALID_ARG, "draft vocabulary of %d tokens: the target's vocabulary has %zu (0 = all of it)", lim->n_vocab_draft, V);
    d->max_rows = lim->max_ctx_rows > lim->max_reqs * in->block ? lim->max_ctx_rows : lim->max_reqs * in->block;
    const size_t T = (size_t)d->max_rows;
    int width = (int)(E > F ? E : F);
    if ((int)qd > width) width = (int)qd;
    if (in->n_taps * hp->n_embd > width) width = in->n_taps * hp->n_embd;
    if ((int)r > width) width = (int)r;
    dsp_be_limits bl = {d->max_rows, width, hp->n_head / hp->n_head_kv, lim->n_ctx, hp->rope_dim};
    dsp_status st;
    if ((st = o->reserve(be, &bl)) || (st = o->kv_create(be, hp->n_layer, (int)kvd, pool->block_tokens, pool->n_blocks, &d->store)) ||
        (st = dsp_kv_pool_add_store(pool, copy_block, d)))
        return st;
    /* weights */
    if ((st = wup(d, d->fc, &d->b_fc)) || (st = wup(d, d->hidden_norm, &d->b_hnorm)) || (st = wup(d, d->norm, &d->b_norm)))
        return st;
    /* the draft vocabulary: gathered copies of the head's and W2's rows */
    d->Vd = (int)V;
    if (lim->n_vocab_draft > 0 && lim->n_vocab_draft < (int32_t)V && (st = dsp_block_pick_vocab(d, lim->n_vocab_draft))) return st;
    const size_t Vd = (size_t)d->Vd;
    d->info.draft_vocab = d->Vd;
    if (!d->vids) d->info.draft_vocab_source = "full";
    if ((st = wup(d, d->mk_w2 && d->vids ? &d->w2_sub : d->mk_w2, &d->b_w2))) return st;
    if (in->shares_embd && target_embd) d->b_embd = (dsp_bweight *)target_embd;
    else if ((st = wup(d, d->embd, &d->b_embd))) return st;
    else d->own_embd = true;
    if (d->vids) {
        if ((st = wup(d, &d->head_sub, &d->b_head))) return st;
        d->own_head = true;
    } else if (in->shares_head && target_head) d->b_head = (dsp_bweight *)target_head;
    else if (in->shares_head && d->head == d->embd && d->own_embd) d->b_head = d->b_embd; /* a tied target without its forward */
    else if ((st = wup(d, d->head, &d->b_head))) return st;
    else d->own_head = true;
    if (!(d->layers = calloc((size_t)hp->n_layer, sizeof *d->layers))) return dsp_error(DSP_ERR_NOMEM, "no memory");
    for (int l = 0; l < hp->n_layer; l++) {
        const dsp_layer_weights *W = &d->m->w.layers[l];
        blk_layer *L = &d->layers[l];
        if ((st = wup(d, W->attn_norm, &L->attn_norm)) || (st = wup(d, W->wq, &L->wq)) || (st = wup(d, W->wk, &L->wk)) ||
            (st = wup(d, W->wv, &L->wv)) || (st = wup(d, W->wo, &L->wo)) || (st = wup(d, W->bq, &L->bq)) || (st = wup(d, W->bk, &L->bk)) ||
            (st = wup(d, W->bv, &L->bv)) || (st = wup(d, W->q_norm, &L->q_norm)) || (st = wup(d, W->k_norm, &L->k_norm)) ||
            (st = wup(d, W->ffn_norm, &L->ffn_norm)) || (st = wup(d, W->ffn_gate, &L->ffn_gate)) || (st = wup(d, W->ffn_up, &L->ffn_up)) ||
            (st = wup(d, W->ffn_down, &L->ffn_down)))
            return st;
    }
    /* buffers */
    if ((st = buf(d, T, E, &d->x)) || (st = buf(d, T, E, &d->h)) || (st = buf(d, T, qd, &d->q)) || (st = buf(d, T, kvd, &d->k)) ||
        (st = buf(d, T, kvd, &d->v)) || (st = buf(d, T, qd, &d->att)) || (st = buf(d, T, F, &d->gate)) || (st = buf(d, T, F, &d->up)) ||
        (st = buf(d, R * nd, Vd, &d->logits)) || (st = buf(d, 1, (size_t)hp->rope_dim / 2, &d->inv_freq)) ||
        (r && ((st = buf(d, R, r, &d->mk_e)) || (st = buf(d, R, Vd, &d->mk_y)))))
        return st;
    d->btok = malloc(T * sizeof(int32_t));
    d->bpos = malloc(T * sizeof(int32_t));
    d->bseq = malloc(T * sizeof(int32_t));
    d->bkeys = malloc(T * sizeof(int32_t));
    d->brow = malloc(T * sizeof(int32_t));
    d->bseqs = malloc(R * sizeof *d->bseqs);
    d->bout0 = malloc(R * sizeof *d->bout0);
    d->bmrow = malloc(R * sizeof *d->bmrow);
    d->hlogits = malloc(R * nd * Vd * sizeof(float));
    d->hhid = malloc(R * nd * E * sizeof(float));
    d->he = malloc(R * (r ? r : 1) * sizeof(float));
    d->hbias = malloc(R * (r ? Vd : 1) * sizeof(float));
    d->conf_wf = malloc((E + r) * sizeof(float));
    d->btoks = malloc(R * nd * sizeof(int32_t));
    d->bn = malloc(R * sizeof(int));
    d->banchor = malloc(R * sizeof(int32_t));
    float *inv = malloc((size_t)(hp->rope_dim / 2 > 0 ? hp->rope_dim / 2 : 1) * sizeof(float));
    if (!d->btok || !d->bpos || !d->bseq || !d->bkeys || !d->brow || !d->bseqs || !d->bout0 || !d->bmrow || !d->hlogits || !d->hhid || !d->he || !d->hbias ||
        !d->conf_wf || !d->btoks || !d->bn || !d->banchor || !inv) {
        free(inv);
        return dsp_error(DSP_ERR_NOMEM, "no memory for the drafter's scratch (%zu rows, vocabulary %zu)", T, V);
    }
    const float *ff = d->m->w.rope_freqs ? (const float *)d->m->w.rope_freqs->data : NULL;
    for (int i = 0; i < hp->rope_dim / 2; i++) {
        float v = 1.0f / powf(hp->rope_base, (float)(2 * i) / (float)hp->rope_dim);
        inv[i] = ff ? v / ff[i] : v;
    }
    o->buf_write(be, d->inv_freq, 0, inv, (size_t)hp->rope_dim / 2);
    free(inv);
    d->rope = (dsp_rope){hp->rope_dim, true, hp->rope_scale, hp->rope_attn_factor, d->inv_freq};
    /* DSP_DRAFT_HOST_CHAIN=1 keeps the slots' chain on the host (for comparisons) */
    const char *hc = getenv("DSP_DRAFT_HOST_CHAIN");
    d->host_chain = hc && *hc && strcmp(hc, "0");
    if (r && o->markov_greedy && !d->host_chain && !d->vids && in->markov_type == DSP_MARKOV_VANILLA) { /* W1 as f32 rows on the backend: the greedy chain runs there */
        float *w1 = malloc(V * r * sizeof(float));
        if (!w1) return dsp_error(DSP_ERR_NOMEM, "no memory for the Markov head's W1 as f32 (%zu x %zu)", V, r);
        const size_t rb = dsp_dtype_row_bytes(d->mk_w1->type, (uint64_t)r);
        for (size_t t = 0; t < V && !st; t++) st = dsp_dequantize_row(d->mk_w1->type, (const uint8_t *)d->mk_w1->data + t * rb, w1 + t * r, (uint64_t)r);
        if (!st) st = buf(d, V, r, &d->mk_w1f);
        if (!st) o->buf_write(be, d->mk_w1f, 0, w1, V * r);
        free(w1);
        if (st) return st;
    }
    if (d->conf_w) {
        size_t n = (size_t)d->conf_w->ne[0];
        if ((st = dsp_dequantize_row(d->conf_w->type, d->conf_w->data, d->conf_wf, n))) return st;
        d->conf_bias = ((const float *)d->conf_b->data)[0];
    }
    if (d->mk_pw) { /* the gated / rnn head's projection as f32 rows, and the rnn state */
        const size_t in_w = (size_t)d->mk_pw->ne[0], out_w = (size_t)d->mk_pw->ne[1];
        const size_t rb = dsp_dtype_row_bytes(d->mk_pw->type, (uint64_t)in_w);
        d->mk_pwf = malloc(in_w * out_w * sizeof(float));
        d->mk_pbf = malloc(out_w * sizeof(float));
        d->mk_state = malloc(R * (r + out_w) * sizeof(float));
        if (!d->mk_pwf || !d->mk_pbf || !d->mk_state) return dsp_error(DSP_ERR_NOMEM, "no memory for the Markov head's projection");
        for (size_t i = 0; i < out_w && !st; i++)
            st = dsp_dequantize_row(d->mk_pw->type, (const uint8_t *)d->mk_pw->data + i * rb, d->mk_pwf + i * in_w, (uint64_t)in_w);
        if (!st) st = dsp_dequantize_row(d->mk_pb->type, d->mk_pb->data, d->mk_pbf, (uint64_t)out_w);
        if (st) return st;
    }
    return DSP_OK;
}

/* ---- context step ----------------------------------------------------------------------------- */

/* k, v of layer l from the rows of `in` (n rows of n_embd) -> the store at the batch positions */
static void layer_kv(dsp_block_drafter *d, const blk_layer *L, int l, const dsp_buf *in, int n) {
    const dsp_backend_ops *o = d->be->ops;
    const dsp_hparams *hp = &d->m->hp;
    const int kvd = hp->n_head_kv * hp->head_dim;
    const dsp_bweight *w[2] = {L->wk, L->wv};
    dsp_buf *y[2] = {d->k, d->v};
    o->matmul(d->be, 2, w, y, in, n);
    if (L->bk) o->add_bias(d->be, d->k, L->bk, n, kvd), o->add_bias(d->be, d->v, L->bv, n, kvd);
    o->norm_rope(d->be, d->k, L->k_norm, hp->rms_eps, hp->n_head_kv, hp->head_dim, &d->rope);
    o->kv_write(d->be, d->store, l, d->k, d->v);
}

dsp_status dsp_block_context(dsp_block_drafter *d, const dsp_buf *taps, int n, const int32_t *tokens, const int32_t *pos, const int32_t *seq,
                             int n_seqs, dsp_kv_seq *const *seqs) {
    DSP_ASSERT(n >= 1 && n <= d->lim.max_ctx_rows);
    const dsp_backend_ops *o = d->be->ops;
    const dsp_hparams *hp = &d->m->hp;
    for (int i = 0; i < n; i++) d->bkeys[i] = pos[i] + 1;
    dsp_be_batch bb = {n, tokens, pos, seq, d->bkeys, n_seqs, (const dsp_kv_seq *const *)seqs};
    dsp_status st = o->begin(d->be, &bb);
    if (st) return st;
    o->matmul(d->be, 1, (const dsp_bweight *const *)&d->b_fc, &d->x, taps, n);
    o->rmsnorm(d->be, d->x, d->x, d->b_hnorm, n, hp->n_embd, hp->rms_eps, NULL);
    for (int l = 0; l < hp->n_layer; l++) layer_kv(d, &d->layers[l], l, d->x, n);
    return o->end(d->be);
}

/* ---- draft step ------------------------------------------------------------------------------- */

/* top-3 of a row (ties: the lower id first, as torch.topk/argmax on the CPU) */
static void top3(const float *z, int V, int32_t *ids, float *vals) {
    for (int t = 0; t < DSP_BLOCK_TOPK; t++) ids[t] = -1, vals[t] = -INFINITY;
    for (int i = 0; i < V; i++) {
        float v = z[i];
        if (!(v > vals[DSP_BLOCK_TOPK - 1])) continue;
        int t = DSP_BLOCK_TOPK - 1;
        while (t > 0 && v > vals[t - 1]) {
            vals[t] = vals[t - 1], ids[t] = ids[t - 1];
            t--;
        }
        vals[t] = v, ids[t] = i;
    }
}

static int32_t argmax(const float *z, int V) {
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (z[i] > z[best]) best = i;
    return best;
}

/* x ~ softmax(z / T) by the inverse CDF of one uniform; q receives the distribution (q may be z) */
static int32_t sample(const float *z, int V, float T, dsp_rng *rng, float *q) {
    float mx = z[argmax(z, V)];
    double sum = 0;
    for (int i = 0; i < V; i++) sum += (q[i] = expf((z[i] - mx) / T));
    for (int i = 0; i < V; i++) q[i] = (float)(q[i] / sum);
    double u = dsp_rng_uniform(rng), c = 0;
    int32_t last = 0;
    for (int i = 0; i < V; i++) {
        if (q[i] <= 0) continue;
        last = i;
        c += q[i];
        if (u < c) return i;
    }
    return last;
}

static float dot(const float *a, const float *b, size_t n) {
    float s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* The gated / rnn Markov head's W2 input (block.h's DSP_MARKOV_*), in place of e = W1[prev], for
 * slot k of request j with normed hidden h; the rnn state of request j restarts at slot 0. */
static void markov_latent(dsp_block_drafter *d, int j, int k, const float *h, float *e) {
    const int r = d->info.markov_rank, E = d->m->hp.n_embd;
    const float *W = d->mk_pwf, *b = d->mk_pbf;
    float *st = d->mk_state + (size_t)j * (size_t)(r + d->mk_pw->ne[1]), *z = st + r; /* (request j's state and scratch) */
    if (d->info.markov_type == DSP_MARKOV_GATED) { /* g = sigmoid(P [h ; e] + b); u = g * e */
        float *g = z;
        for (int i = 0; i < r; i++) {
            const float *w = W + (size_t)i * (size_t)(E + r);
            g[i] = sigmoidf(dot(w, h, (size_t)E) + dot(w + E, e, (size_t)r) + b[i]);
        }
        for (int i = 0; i < r; i++) e[i] *= g[i];
        return;
    }
    /* rnn: (gate, cand, out) = P [s ; e ; h] + b */
    if (k == 0) memset(st, 0, sizeof(float) * (size_t)r);
    for (int i = 0; i < 3 * r; i++) {
        const float *w = W + (size_t)i * (size_t)(2 * r + E);
        z[i] = dot(w, st, (size_t)r) + dot(w + r, e, (size_t)r) + dot(w + 2 * r, h, (size_t)E) + b[i];
    }
    for (int i = 0; i < r; i++) {
        const float gt = sigmoidf(z[i]);
        st[i] = gt * st[i] + (1.0f - gt) * tanhf(z[r + i]);
        e[i] = tanhf(z[2 * r + i]);
    }
}

dsp_status dsp_block_draft(dsp_block_drafter *d, dsp_block_req *reqs, int n) {
    DSP_ASSERT(n >= 1 && n <= d->lim.max_reqs);
    const dsp_backend_ops *o = d->be->ops;
    const dsp_block_info *in = &d->info;
    const dsp_hparams *hp = &d->m->hp;
    const int E = hp->n_embd, V = d->Vd, r = in->markov_rank; /* V: the draft vocabulary's size */
    const int qd = hp->n_head * hp->head_dim;
    const int32_t *vids = d->vids;
    dsp_status st;
    /* the rows; the KV blocks of the block positions */
    int rows = 0, n_out = 0, max_want = 0;
    int *out0 = d->bout0;
    for (int j = 0; j < n; j++) {
        dsp_block_req *q = &reqs[j];
        DSP_ASSERT(q->n_slots >= 1 && q->n_slots <= in->block && q->n_want >= 1 && q->n_want <= q->n_slots - in->slot0);
        DSP_ASSERT(q->start + (uint32_t)q->n_slots <= d->lim.n_ctx);
        if ((st = dsp_kv_seq_reserve(d->pool, q->kv, q->start + (uint32_t)q->n_slots)) || (st = dsp_kv_seq_make_writable(d->pool, q->kv, q->start)))
            return st;
        d->bseqs[j] = q->kv;
        out0[j] = n_out;
        for (int s = 0; s < q->n_slots; s++) {
            d->btok[rows + s] = s ? in->mask_token : q->anchor;
            d->bpos[rows + s] = (int32_t)q->start + s;
            d->bseq[rows + s] = j;
            d->bkeys[rows + s] = (int32_t)q->start + q->n_slots;
        }
        for (int i = 0; i < q->n_want; i++) d->brow[n_out++] = rows + in->slot0 + i;
        rows += q->n_slots;
        if (q->n_want > max_want) max_want = q->n_want;
        q->n_draft = q->n_want;
    }
    dsp_be_batch bb = {rows, d->btok, d->bpos, d->bseq, d->bkeys, n, (const dsp_kv_seq *const *)d->bseqs};
    if ((st = o->begin(d->be, &bb))) return st;
    dsp_backend *be = d->be;
    const size_t nE = (size_t)rows * (size_t)E;
    const float scale = 1.0f / sqrtf((float)hp->head_dim);
    o->embed(be, d->x, d->b_embd, E);
    for (int l = 0; l < hp->n_layer; l++) {
        const blk_layer *L = &d->layers[l];
        o->rmsnorm(be, d->h, d->x, L->attn_norm, rows, E, hp->rms_eps, NULL);
        o->matmul(be, 1, (const dsp_bweight *const *)&L->wq, &d->q, d->h, rows);
        if (L->bq) o->add_bias(be, d->q, L->bq, rows, qd);
        o->norm_rope(be, d->q, L->q_norm, hp->rms_eps, hp->n_head, hp->head_dim, &d->rope);
        layer_kv(d, L, l, d->h, rows);
        o->attention(be, d->att, d->q, d->store, l, hp->n_head, hp->n_head_kv, hp->head_dim, scale);
        o->matmul(be, 1, (const dsp_bweight *const *)&L->wo, &d->h, d->att, rows);
        o->add(be, d->x, d->h, nE);
        o->rmsnorm(be, d->h, d->x, L->ffn_norm, rows, E, hp->rms_eps, NULL);
        const dsp_bweight *wgu[2] = {L->ffn_gate, L->ffn_up};
        dsp_buf *ygu[2] = {d->gate, d->up};
        o->matmul(be, 2, wgu, ygu, d->h, rows);
        o->swiglu(be, d->gate, d->up, (size_t)rows * (size_t)hp->n_ff);
        o->matmul(be, 1, (const dsp_bweight *const *)&L->ffn_down, &d->h, d->gate, rows);
        o->add(be, d->x, d->h, nE);
    }
    o->rmsnorm(be, d->h, d->x, d->b_norm, n_out, E, hp->rms_eps, d->brow);
    o->matmul(be, 1, (const dsp_bweight *const *)&d->b_head, &d->logits, d->h, n_out);
    /* greedy requests that want no top-3 need only the tokens: the slots' chain runs on the backend
     * when it can (ops->markov_greedy; ops->argmax without a Markov head), and n_out vocabulary
     * rows stay there; else the rows come to the host. The device chain feeds token ids back into
     * W1, so with a draft vocabulary (argmax indices into vids) it runs only without a Markov head */
    bool on_dev = r ? d->mk_w1f != NULL && !vids : o->argmax != NULL && !d->host_chain;
    for (int j = 0; j < n && on_dev; j++) on_dev = reqs[j].temperature <= 0 && !reqs[j].top && (!r || reqs[j].markov);
    if ((st = o->end(be))) return st;
    if (on_dev) {
        if (r) {
            for (int j = 0; j < n; j++) d->bn[j] = reqs[j].n_draft, d->banchor[j] = reqs[j].anchor;
            st = o->markov_greedy(be, d->logits, V, d->mk_w1f, r, d->b_w2, d->mk_e, d->mk_y, n, out0, d->bn, d->banchor, d->btoks);
        } else {
            st = o->argmax(be, d->logits, n_out, V, d->btoks);
        }
        if (st) return st;
        for (int j = 0; j < n; j++)
            for (int k = 0; k < reqs[j].n_draft; k++) {
                const int32_t x = d->btoks[out0[j] + k];
                reqs[j].draft[k] = vids && x >= 0 ? vids[x] : x;
            }
    } else if ((st = o->buf_read(be, d->logits, 0, d->hlogits, (size_t)n_out * (size_t)V))) {
        return st;
    }
    bool any_conf = false, any_latent = false; /* the normed hidden rows feed the confidence head and the gated / rnn Markov head */
    for (int j = 0; j < n; j++) any_conf |= reqs[j].confidence && d->conf_w, any_latent |= reqs[j].markov && d->mk_pw;
    if ((any_conf || any_latent) && (st = o->buf_read(be, d->h, 0, d->hhid, (size_t)n_out * (size_t)E))) return st;
    if (on_dev && !any_conf) return DSP_OK;
    /* the slots in order: Markov bias and confidence need the previous slot's token (with the
     * chain on the device, the tokens are known and only the confidences' truncation remains) */
    const size_t row_w1 = r ? dsp_dtype_row_bytes(d->mk_w1->type, (uint64_t)r) : 0;
    int *mrow = d->bmrow;
    for (int k = 0; k < max_want; k++) {
        int m = 0;
        bool markov_rows = false;
        for (int j = 0; j < n; j++) {
            dsp_block_req *q = &reqs[j];
            mrow[j] = -1;
            if (k >= q->n_draft) continue;
            int32_t prev = k ? q->draft[k - 1] : q->anchor;
            bool conf = q->confidence && d->conf_w, need_e = (!on_dev && q->markov && r > 0) || (conf && in->conf_with_markov);
            float *e = d->he + (size_t)m * (size_t)(r ? r : 1);
            if (need_e && (st = dsp_dequantize_row(d->mk_w1->type, (const uint8_t *)d->mk_w1->data + (size_t)prev * row_w1, e, (uint64_t)r)))
                return st;
            if (conf) {
                const float *hk = d->hhid + (size_t)(out0[j] + k) * (size_t)E;
                float c = dot(d->conf_wf, hk, (size_t)E) + d->conf_bias;
                if (in->conf_with_markov) c += dot(d->conf_wf + E, e, (size_t)r);
                q->conf[k] = c;
                if (c < q->stop_below) { /* truncated here: no draft at k or later */
                    q->n_draft = k;
                    continue;
                }
            }
            if (!on_dev && q->markov && d->mk_pw) markov_latent(d, j, k, d->hhid + (size_t)(out0[j] + k) * (size_t)E, e);
            if (need_e) mrow[j] = m++;
            markov_rows |= !on_dev && q->markov && r > 0;
        }
        if (on_dev) continue;
        if (markov_rows) { /* bias = W2 . W1[prev] for every request's previous token, one forward */
            for (int i = 0; i < m; i++) d->btok[i] = 0, d->bpos[i] = 0, d->bseq[i] = 0, d->bkeys[i] = 1;
            dsp_be_batch mb = {m, d->btok, d->bpos, d->bseq, d->bkeys, 1, (const dsp_kv_seq *const *)d->bseqs};
            o->buf_write(be, d->mk_e, 0, d->he, (size_t)m * (size_t)r);
            if ((st = o->begin(be, &mb))) return st;
            o->matmul(be, 1, (const dsp_bweight *const *)&d->b_w2, &d->mk_y, d->mk_e, m);
            if ((st = o->end(be)) || (st = o->buf_read(be, d->mk_y, 0, d->hbias, (size_t)m * (size_t)V))) return st;
        }
        for (int j = 0; j < n; j++) {
            dsp_block_req *q = &reqs[j];
            if (k >= q->n_draft) continue;
            float *z = d->hlogits + (size_t)(out0[j] + k) * (size_t)V;
            if (q->markov && r > 0) {
                const float *b = d->hbias + (size_t)mrow[j] * (size_t)V;
                for (int i = 0; i < V; i++) z[i] += b[i];
            }
            if (q->top) {
                top3(z, V, q->top_ids[k], q->top_vals[k]);
                for (int t = 0; vids && t < DSP_BLOCK_TOPK; t++)
                    if (q->top_ids[k][t] >= 0) q->top_ids[k][t] = vids[q->top_ids[k][t]];
            }
            if (q->temperature > 0) {
                /* q's row is over the whole vocabulary: the subset's probabilities, zero elsewhere */
                float *qk = q->q + (size_t)k * (size_t)hp->n_vocab;
                int32_t x = sample(z, V, q->temperature, q->rng, vids ? z : qk);
                if (vids) {
                    memset(qk, 0, sizeof(float) * (size_t)hp->n_vocab);
                    for (int i = 0; i < V; i++) qk[vids[i]] = z[i];
                }
                q->draft[k] = vids ? vids[x] : x;
            } else {
                int32_t x = argmax(z, V);
                q->draft[k] = vids ? vids[x] : x;
            }
        }
    }
    return DSP_OK;
}
