/* tests/backend_diff: a "dual" backend that runs every op on two backends, a reference (the CPU)
 * and a device under test (the GPU), and compares what each op wrote, so that a wrong forward is
 * traced to the first op that went wrong.
 *
 * Buffers, weights and KV stores are pairs. Each op runs on both backends and queues the output
 * range it writes; at a sync point every queued range is read from both, compared (NMSE, max
 * |diff|, non-finite values) and, with resync, the reference's values are written into the
 * device's buffer, so that the next op starts from identical inputs and each op is judged alone.
 * Sync points:
 *   DIFF_EACH   after every op: each op on its own (the device cannot fuse ops then);
 *   DIFF_FUSED  after embed, matmul and attention only: the device still fuses add -> rmsnorm ->
 *               matmul, swiglu -> matmul and norm_rope q, k + kv_write (cuda_backend.cu), and the
 *               ranges those fused ops wrote are compared at the next sync point;
 * and with resync off the differences compound as they would in the device's own forward.
 * buf_read returns the device's values. Sits in front of model/forward.c unchanged (fp.backend).
 * Header-only: static functions for one test program. */
#ifndef DSP_TEST_BACKEND_DIFF_H
#define DSP_TEST_BACKEND_DIFF_H

#include "backend/backend.h"
#include "core/status.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { DIFF_EACH, DIFF_FUSED } diff_sync;

typedef struct dbuf {
    dsp_buf *r, *d;
    size_t n;
} dbuf;
typedef struct dweight {
    dsp_bweight *r, *d;
    int64_t rows;   /* matmul output width (ne[1]) */
    char name[64];
} dweight;
typedef struct dkv {
    dsp_kv_store *r, *d;
} dkv;

typedef struct diff_pending {
    dbuf *b;
    size_t n;
    char label[96];
} diff_pending;

/* the largest error seen per op label with the layer number taken out ("blk.N." -> "blk.*.") */
typedef struct diff_stat {
    char key[96];
    double max_nmse;
    int count;
} diff_stat;

#define DIFF_MAX_PENDING 16
#define DIFF_MAX_STATS 64

typedef struct diff_be {
    dsp_backend base; /* first: the forward sees a dsp_backend */
    dsp_backend *r, *d;
    diff_sync sync;
    bool resync;
    double tol, tol_attn; /* NMSE above which an op is reported */
    bool in_fwd;
    int n_fwd, n_op;      /* forwards begun, ops in this forward */
    int n_tok;            /* rows of the current forward */
    char ctx[64];         /* the last weight an op used: names the layer */
    diff_pending pend[DIFF_MAX_PENDING];
    int n_pend;
    /* results */
    long compared, bad;
    char first_bad[512];
    diff_stat stats[DIFF_MAX_STATS];
    int n_stats;
    dsp_status err; /* first failure of an underlying call */
} diff_be;

static diff_be *diff_of(dsp_backend *be) { return (diff_be *)be; }
static dbuf *dbuf_of(const dsp_buf *b) { return (dbuf *)(void *)(uintptr_t)b; }
static dweight *dw_of(const dsp_bweight *w) { return (dweight *)(void *)(uintptr_t)w; }
static dkv *dkv_of(const dsp_kv_store *k) { return (dkv *)(void *)(uintptr_t)k; }
static dsp_buf *rb(const dsp_buf *b) { return dbuf_of(b)->r; }
static dsp_buf *db(const dsp_buf *b) { return dbuf_of(b)->d; }
static dsp_bweight *rw(const dsp_bweight *w) { return w ? dw_of(w)->r : NULL; }
static dsp_bweight *dwt(const dsp_bweight *w) { return w ? dw_of(w)->d : NULL; }

static void diff_note(diff_be *x, dsp_status st) {
    if (st && !x->err) {
        x->err = st;
        fprintf(stderr, "backend_diff: %s\n", dsp_last_error());
    }
}

static void diff_stat_add(diff_be *x, const char *label, double e) {
    char key[96];
    size_t o = 0;
    for (const char *p = label; *p && o + 1 < sizeof key; p++) {
        if (!strncmp(p, "blk.", 4)) { /* blk.17. -> blk.*. */
            const char *q = p + 4;
            while (*q >= '0' && *q <= '9') q++;
            if (q > p + 4 && *q == '.' && o + 7 < sizeof key) {
                memcpy(key + o, "blk.*.", 6), o += 6;
                p = q;
                continue;
            }
        }
        if (*p == '#') break; /* "#op" suffixes do not split the statistics */
        key[o++] = *p;
    }
    key[o] = 0;
    int i = 0;
    while (i < x->n_stats && strcmp(x->stats[i].key, key)) i++;
    if (i == x->n_stats) {
        if (i == DIFF_MAX_STATS) return;
        snprintf(x->stats[i].key, sizeof x->stats[i].key, "%s", key);
        x->stats[i].max_nmse = 0, x->stats[i].count = 0;
        x->n_stats++;
    }
    if (e > x->stats[i].max_nmse || e != e) x->stats[i].max_nmse = e;
    x->stats[i].count++;
}

/* compare (and with resync, copy) every pending range */
static void diff_flush(diff_be *x) {
    for (int i = 0; i < x->n_pend; i++) {
        diff_pending *p = &x->pend[i];
        float *a = malloc(p->n * sizeof(float)), *g = malloc(p->n * sizeof(float));
        if (!a || !g) abort();
        diff_note(x, x->r->ops->buf_read(x->r, p->b->r, 0, a, p->n));
        diff_note(x, x->d->ops->buf_read(x->d, p->b->d, 0, g, p->n));
        double num = 0, den = 0, maxd = 0;
        size_t bad_at = SIZE_MAX, nonfinite = 0;
        for (size_t k = 0; k < p->n; k++) {
            const double dd = (double)g[k] - (double)a[k];
            if (!isfinite(g[k]) && isfinite(a[k])) nonfinite++;
            if (!isfinite(g[k]) || !isfinite(a[k])) continue;
            num += dd * dd, den += (double)a[k] * a[k];
            if (fabs(dd) > maxd) maxd = fabs(dd), bad_at = k;
        }
        const double e = nonfinite ? INFINITY : den > 0 ? num / den : num;
        const bool attn = !strncmp(p->label, "attention", 9);
        const bool bad = nonfinite || !(e <= (attn ? x->tol_attn : x->tol));
        x->compared++;
        diff_stat_add(x, p->label, e);
        if (bad) {
            x->bad++;
            if (!x->first_bad[0])
                snprintf(x->first_bad, sizeof x->first_bad,
                         "forward %d op %d: %s: nmse %.3g, max |diff| %.3g at [%zu] (ref %.6g, dev %.6g), %zu non-finite of %zu",
                         x->n_fwd, x->n_op, p->label, e, maxd, bad_at == SIZE_MAX ? 0 : bad_at,
                         bad_at == SIZE_MAX ? 0.0 : (double)a[bad_at], bad_at == SIZE_MAX ? 0.0 : (double)g[bad_at], nonfinite,
                         p->n);
        }
        if (x->resync) x->d->ops->buf_write(x->d, p->b->d, 0, a, p->n);
        free(a), free(g);
    }
    x->n_pend = 0;
}

static void diff_queue(diff_be *x, const dsp_buf *b, size_t n, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void diff_queue(diff_be *x, const dsp_buf *b, size_t n, const char *fmt, ...) {
    if (x->n_pend == DIFF_MAX_PENDING) diff_flush(x);
    diff_pending *p = &x->pend[x->n_pend++];
    p->b = dbuf_of(b), p->n = n;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->label, sizeof p->label, fmt, ap);
    va_end(ap);
}

/* after an op: sync now (EACH always; FUSED at embed, matmul and attention) */
static void diff_after(diff_be *x, bool fused_point) {
    x->n_op++;
    if (x->sync == DIFF_EACH || fused_point) diff_flush(x);
}

static void diff_ctx(diff_be *x, const dsp_bweight *w) {
    if (w) snprintf(x->ctx, sizeof x->ctx, "%s", dw_of(w)->name);
}

/* ---- the ops table ---- */

static void diff_destroy(dsp_backend *be) { free(diff_of(be)); }

static dsp_status diff_reserve(dsp_backend *be, const dsp_be_limits *lim) {
    diff_be *x = diff_of(be);
    dsp_status st = x->r->ops->reserve(x->r, lim);
    return st ? st : x->d->ops->reserve(x->d, lim);
}

static dsp_status diff_buf_create(dsp_backend *be, size_t n, dsp_buf **out) {
    diff_be *x = diff_of(be);
    dbuf *b = calloc(1, sizeof *b);
    if (!b) return dsp_error(DSP_ERR_NOMEM, "no memory");
    dsp_status st = x->r->ops->buf_create(x->r, n, &b->r);
    if (!st) st = x->d->ops->buf_create(x->d, n, &b->d);
    if (st) {
        if (b->r) x->r->ops->buf_destroy(x->r, b->r);
        free(b);
        return st;
    }
    b->n = n;
    *out = (dsp_buf *)(void *)b;
    return DSP_OK;
}

static void diff_buf_destroy(dsp_backend *be, dsp_buf *b) {
    if (!b) return;
    diff_be *x = diff_of(be);
    x->r->ops->buf_destroy(x->r, rb(b));
    x->d->ops->buf_destroy(x->d, db(b));
    free(dbuf_of(b));
}

static dsp_status diff_weight_create(dsp_backend *be, const dsp_tensor *t, dsp_bweight **out) {
    diff_be *x = diff_of(be);
    dweight *w = calloc(1, sizeof *w);
    if (!w) return dsp_error(DSP_ERR_NOMEM, "no memory");
    dsp_status st = x->r->ops->weight_create(x->r, t, &w->r);
    if (!st) st = x->d->ops->weight_create(x->d, t, &w->d);
    if (st) {
        if (w->r) x->r->ops->weight_destroy(x->r, w->r);
        free(w);
        return st;
    }
    w->rows = (int64_t)t->ne[1];
    snprintf(w->name, sizeof w->name, "%.*s", (int)(t->name.len < 60 ? t->name.len : 60), t->name.ptr ? t->name.ptr : "");
    *out = (dsp_bweight *)(void *)w;
    return DSP_OK;
}

static void diff_weight_destroy(dsp_backend *be, dsp_bweight *w) {
    if (!w) return;
    diff_be *x = diff_of(be);
    x->r->ops->weight_destroy(x->r, rw(w));
    x->d->ops->weight_destroy(x->d, dwt(w));
    free(dw_of(w));
}

static dsp_status diff_kv_create(dsp_backend *be, int n_layers, int kv_dim, int block_tokens, uint32_t n_blocks, dsp_kv_store **out) {
    diff_be *x = diff_of(be);
    dkv *k = calloc(1, sizeof *k);
    if (!k) return dsp_error(DSP_ERR_NOMEM, "no memory");
    dsp_status st = x->r->ops->kv_create(x->r, n_layers, kv_dim, block_tokens, n_blocks, &k->r);
    if (!st) st = x->d->ops->kv_create(x->d, n_layers, kv_dim, block_tokens, n_blocks, &k->d);
    if (st) {
        if (k->r) x->r->ops->kv_destroy(x->r, k->r);
        free(k);
        return st;
    }
    *out = (dsp_kv_store *)(void *)k;
    return DSP_OK;
}

static void diff_kv_destroy(dsp_backend *be, dsp_kv_store *k) {
    if (!k) return;
    diff_be *x = diff_of(be);
    x->r->ops->kv_destroy(x->r, dkv_of(k)->r);
    x->d->ops->kv_destroy(x->d, dkv_of(k)->d);
    free(dkv_of(k));
}

static dsp_status diff_kv_copy_block(dsp_backend *be, dsp_kv_store *k, uint32_t dst, uint32_t src) {
    diff_be *x = diff_of(be);
    dsp_status st = x->r->ops->kv_copy_block(x->r, dkv_of(k)->r, dst, src);
    return st ? st : x->d->ops->kv_copy_block(x->d, dkv_of(k)->d, dst, src);
}

static void diff_buf_write(dsp_backend *be, dsp_buf *b, size_t off, const float *src, size_t n) {
    diff_be *x = diff_of(be);
    x->r->ops->buf_write(x->r, rb(b), off, src, n);
    x->d->ops->buf_write(x->d, db(b), off, src, n);
}

static dsp_status diff_buf_read(dsp_backend *be, const dsp_buf *b, size_t off, float *dst, size_t n) {
    diff_be *x = diff_of(be);
    if (x->in_fwd) diff_flush(x);
    return x->d->ops->buf_read(x->d, db(b), off, dst, n);
}

static dsp_status diff_begin(dsp_backend *be, const dsp_be_batch *b) {
    diff_be *x = diff_of(be);
    dsp_status st = x->r->ops->begin(x->r, b);
    if (!st) st = x->d->ops->begin(x->d, b);
    if (st) return st;
    x->in_fwd = true, x->n_fwd++, x->n_op = 0, x->n_pend = 0, x->n_tok = b->n_tokens;
    return DSP_OK;
}

static dsp_status diff_end(dsp_backend *be) {
    diff_be *x = diff_of(be);
    diff_flush(x); /* inside the forward: resync writes are still ordered before what follows */
    x->in_fwd = false;
    dsp_status st = x->r->ops->end(x->r), st2 = x->d->ops->end(x->d);
    if (!st) st = st2;
    if (!st) st = x->err;
    return st;
}

static void diff_embed(dsp_backend *be, dsp_buf *out, const dsp_bweight *t, int dim) {
    diff_be *x = diff_of(be);
    x->r->ops->embed(x->r, rb(out), rw(t), dim);
    x->d->ops->embed(x->d, db(out), dwt(t), dim);
    diff_ctx(x, t);
    diff_queue(x, out, (size_t)x->n_tok * dim, "embed %s", x->ctx);
    diff_after(x, true);
}

static void diff_rmsnorm(dsp_backend *be, dsp_buf *out, const dsp_buf *in, const dsp_bweight *w, int n_rows, int dim, float eps,
                         const int32_t *rows) {
    diff_be *x = diff_of(be);
    x->r->ops->rmsnorm(x->r, rb(out), rb(in), rw(w), n_rows, dim, eps, rows);
    x->d->ops->rmsnorm(x->d, db(out), db(in), dwt(w), n_rows, dim, eps, rows);
    diff_ctx(x, w);
    diff_queue(x, out, (size_t)n_rows * dim, "rmsnorm %s%s", w ? x->ctx : "(no weight)", rows ? " (rows)" : "");
    diff_after(x, false);
}

static void diff_matmul(dsp_backend *be, int n, const dsp_bweight *const *w, dsp_buf *const *y, const dsp_buf *in, int n_rows) {
    diff_be *x = diff_of(be);
    const dsp_bweight *wr[3] = {NULL}, *wd[3] = {NULL};
    dsp_buf *yr[3] = {NULL}, *yd[3] = {NULL};
    for (int i = 0; i < n; i++) wr[i] = rw(w[i]), wd[i] = dwt(w[i]), yr[i] = rb(y[i]), yd[i] = db(y[i]);
    x->r->ops->matmul(x->r, n, wr, yr, rb(in), n_rows);
    x->d->ops->matmul(x->d, n, wd, yd, db(in), n_rows);
    for (int i = 0; i < n; i++) {
        diff_ctx(x, w[i]);
        diff_queue(x, y[i], (size_t)n_rows * (size_t)dw_of(w[i])->rows, "matmul %s #%d rows", x->ctx, n_rows);
    }
    diff_after(x, true);
}

static void diff_add_bias(dsp_backend *be, dsp_buf *y, const dsp_bweight *b, int n_rows, int dim) {
    diff_be *x = diff_of(be);
    x->r->ops->add_bias(x->r, rb(y), rw(b), n_rows, dim);
    x->d->ops->add_bias(x->d, db(y), dwt(b), n_rows, dim);
    diff_ctx(x, b);
    diff_queue(x, y, (size_t)n_rows * dim, "add_bias %s", x->ctx);
    diff_after(x, false);
}

static void diff_norm_rope(dsp_backend *be, dsp_buf *t, const dsp_bweight *norm, float eps, int n_heads, int head_dim, const dsp_rope *rope) {
    diff_be *x = diff_of(be);
    dsp_rope r1 = *rope, r2 = *rope;
    r1.inv_freq = rb(rope->inv_freq), r2.inv_freq = db(rope->inv_freq);
    x->r->ops->norm_rope(x->r, rb(t), rw(norm), eps, n_heads, head_dim, &r1);
    x->d->ops->norm_rope(x->d, db(t), dwt(norm), eps, n_heads, head_dim, &r2);
    diff_queue(x, t, (size_t)x->n_tok * n_heads * head_dim, "norm_rope %d heads after %s", n_heads, x->ctx);
    diff_after(x, false);
}

static void diff_kv_write(dsp_backend *be, dsp_kv_store *kv, int layer, const dsp_buf *k, const dsp_buf *v) {
    diff_be *x = diff_of(be);
    x->r->ops->kv_write(x->r, dkv_of(kv)->r, layer, rb(k), rb(v));
    x->d->ops->kv_write(x->d, dkv_of(kv)->d, layer, db(k), db(v));
    diff_after(x, false);
}

static void diff_attention(dsp_backend *be, dsp_buf *out, const dsp_buf *q, const dsp_kv_store *kv, int layer, int n_head, int n_head_kv,
                           int head_dim, float scale) {
    diff_be *x = diff_of(be);
    x->r->ops->attention(x->r, rb(out), rb(q), dkv_of(kv)->r, layer, n_head, n_head_kv, head_dim, scale);
    x->d->ops->attention(x->d, db(out), db(q), dkv_of(kv)->d, layer, n_head, n_head_kv, head_dim, scale);
    diff_queue(x, out, (size_t)x->n_tok * n_head * head_dim, "attention #layer %d", layer);
    diff_after(x, true);
}

static void diff_add(dsp_backend *be, dsp_buf *a, const dsp_buf *b, size_t n) {
    diff_be *x = diff_of(be);
    x->r->ops->add(x->r, rb(a), rb(b), n);
    x->d->ops->add(x->d, db(a), db(b), n);
    diff_queue(x, a, n, "add (residual) after %s", x->ctx);
    diff_after(x, false);
}

static void diff_swiglu(dsp_backend *be, dsp_buf *g, const dsp_buf *u, size_t n) {
    diff_be *x = diff_of(be);
    x->r->ops->swiglu(x->r, rb(g), rb(u), n);
    x->d->ops->swiglu(x->d, db(g), db(u), n);
    diff_queue(x, g, n, "swiglu after %s", x->ctx);
    diff_after(x, false);
}

static void diff_copy_rows(dsp_backend *be, dsp_buf *dst, size_t dst_ld, size_t dst_col, const dsp_buf *src, size_t src_ld, size_t src_col,
                           int n_rows, size_t width) {
    diff_be *x = diff_of(be);
    x->r->ops->copy_rows(x->r, rb(dst), dst_ld, dst_col, rb(src), src_ld, src_col, n_rows, width);
    x->d->ops->copy_rows(x->d, db(dst), dst_ld, dst_col, db(src), src_ld, src_col, n_rows, width);
    if (n_rows > 0) diff_queue(x, dst, (size_t)(n_rows - 1) * dst_ld + dst_col + width, "copy_rows after %s", x->ctx);
    diff_after(x, false);
}

static const dsp_backend_ops g_diff_ops = {
    .name = "diff",
    .destroy = diff_destroy,
    .reserve = diff_reserve,
    .buf_create = diff_buf_create,
    .buf_destroy = diff_buf_destroy,
    .weight_create = diff_weight_create,
    .weight_destroy = diff_weight_destroy,
    .kv_create = diff_kv_create,
    .kv_destroy = diff_kv_destroy,
    .kv_copy_block = diff_kv_copy_block,
    .buf_write = diff_buf_write,
    .buf_read = diff_buf_read,
    .begin = diff_begin,
    .end = diff_end,
    .embed = diff_embed,
    .rmsnorm = diff_rmsnorm,
    .matmul = diff_matmul,
    .add_bias = diff_add_bias,
    .norm_rope = diff_norm_rope,
    .kv_write = diff_kv_write,
    .attention = diff_attention,
    .add = diff_add,
    .swiglu = diff_swiglu,
    .copy_rows = diff_copy_rows,
};

/* A dual backend over ref and dut (neither owned). */
static diff_be *diff_create(dsp_backend *ref, dsp_backend *dut, diff_sync sync, bool resync, double tol, double tol_attn) {
    diff_be *x = calloc(1, sizeof *x);
    if (!x) abort();
    x->base.ops = &g_diff_ops;
    x->base.kind = dut->kind;
    snprintf(x->base.desc, sizeof x->base.desc, "diff(%s | %s)", ref->ops->name, dut->ops->name);
    x->r = ref, x->d = dut, x->sync = sync, x->resync = resync, x->tol = tol, x->tol_attn = tol_attn;
    return x;
}

#endif
