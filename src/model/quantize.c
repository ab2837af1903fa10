/* model/quantize: load-time quantization of a model's F32/F16/BF16 matrices (`--quantize`).
 *
 * Every 2-D weight the forward pass multiplies by (token embeddings and output head included; a
 * tied head is the embeddings, quantized once) whose rows are whole blocks (32 weights; 256 for
 * Q4_K) becomes a model-owned tensor of the target type; vectors stay F32, and a matrix whose rows
 * are not whole blocks keeps its type. Rows are quantized independently by core/quant's reference
 * (bit-identical to the gguf package; Q4_K to llama.cpp's reference quantizer), so the result does
 * not depend on the thread count or the order the pool runs tasks in. */
#include "model/model.h"

#include "core/quant.h"
#include "core/threads.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROWS_PER_TASK 64

typedef struct q_job {
    const dsp_tensor *src;
    dsp_tensor *dst;
    uint32_t type;
    float *scratch;     /* (n_threads, ne[0]) */
    size_t src_row, dst_row;
    int64_t rows;
} q_job;

static void q_task(void *ctx, int task, int thread) {
    q_job *j = ctx;
    int64_t n = (int64_t)j->src->ne[0], r0 = (int64_t)task * ROWS_PER_TASK, r1 = r0 + ROWS_PER_TASK < j->rows ? r0 + ROWS_PER_TASK : j->rows;
    float *x = j->scratch + (size_t)thread * (size_t)n;
    for (int64_t r = r0; r < r1; r++) {
        dsp_dequantize_row(j->src->type, (const uint8_t *)j->src->data + (size_t)r * j->src_row, x, (uint64_t)n);
        dsp_quantize_row(j->type, x, (uint8_t *)j->dst->data + (size_t)r * j->dst_row, (uint64_t)n);
    }
}

/* a matrix whose rows are whole blocks of the target type */
static bool quantizable(const dsp_tensor *t, uint32_t type) {
    return t && t->ne[1] > 1 && t->ne[0] % dsp_dtype_get(type)->block_elems == 0 &&
           (t->type == DSP_F32 || t->type == DSP_F16 || t->type == DSP_BF16);
}

/* an owned tensor's buffer can go once its quantized copy exists (e.g. permuted llama Q/K) */
static void release_if_owned(dsp_model *m, const dsp_tensor *t) {
    for (int i = 0; i < m->n_own; i++)
        if (&m->own[i].t == t) {
            free((void *)m->own[i].t.data);
            m->own[i].t.data = NULL;
        }
}

dsp_status dsp_model_quantize(dsp_model *m, uint32_t type, int n_threads, bool progress) {
    return dsp_model_quantize_with(m, type, n_threads, progress, NULL, 0);
}

dsp_status dsp_model_quantize_with(dsp_model *m, uint32_t type, int n_threads, bool progress, const dsp_tensor **const *extra, int n_extra) {
    dsp_weights *w = &m->w;
    if (type != DSP_Q8_0 && type != DSP_Q4_0 && type != DSP_Q4_K) /* the types core/quant writes: rows of any other would be garbage */
        return dsp_error(DSP_ERR_UNSUPPORTED, "quantize: type %s is not supported (Q8_0, Q4_0, Q4_K are)",
                         dsp_dtype_get(type) ? dsp_dtype_get(type)->name : "?");
    const dsp_tensor ***slots = malloc((2 + 7 * (size_t)m->hp.n_layer + (size_t)(n_extra > 0 ? n_extra : 0)) * sizeof *slots);
    if (!slots) return dsp_error(DSP_ERR_NOMEM, "quantize: no memory");
    int ns = 0;
    for (int i = 0; i < n_extra; i++)
        if (extra[i] && *extra[i]) slots[ns++] = (const dsp_tensor **)extra[i];
    slots[ns++] = &w->tok_embd;
    if (w->output != w->tok_embd) slots[ns++] = &w->output;
    for (int l = 0; l < m->hp.n_layer; l++) {
        dsp_layer_weights *L = &w->layers[l];
        const dsp_tensor **ls[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->ffn_gate, &L->ffn_up, &L->ffn_down};
        for (size_t k = 0; k < sizeof ls / sizeof ls[0]; k++) slots[ns++] = ls[k];
    }
    dsp_status st = DSP_OK;
    if (m->cap_own == 0) st = dsp_model_own_reserve(m, ns + 8);
    if (!st && m->n_own + ns > m->cap_own) st = dsp_error(DSP_ERR_INTERNAL, "quantize: owned-tensor pool too small");
    if (st) {
        free(slots);
        return st;
    }
    uint64_t total = 0, done = 0;
    int64_t max_in = 0;
    for (int i = 0; i < ns; i++)
        if (quantizable(*slots[i], type)) {
            total += (*slots[i])->n_elems;
            if ((int64_t)(*slots[i])->ne[0] > max_in) max_in = (int64_t)(*slots[i])->ne[0];
        }
    dsp_pool *pool = NULL;
    float *scratch = NULL;
    if (!total || (st = dsp_pool_create(n_threads > 0 ? n_threads : dsp_physical_cores(), &pool))) goto out;
    scratch = malloc((size_t)dsp_pool_size(pool) * (size_t)max_in * sizeof(float));
    if (!scratch) {
        st = dsp_error(DSP_ERR_NOMEM, "quantize: no memory");
        goto out;
    }
    const dsp_tensor *tied = w->output == w->tok_embd ? w->tok_embd : NULL;
    int last = -1;
    for (int i = 0; i < ns && !st; i++) {
        const dsp_tensor *src = *slots[i];
        if (!quantizable(src, type)) continue;
        int64_t rows = (int64_t)(src->n_elems / src->ne[0]);
        size_t dst_row = dsp_dtype_row_bytes(type, src->ne[0]);
        char name[96];
        snprintf(name, sizeof name, "%.*s", (int)(src->name.len < 95 ? src->name.len : 95), src->name.ptr);
        dsp_tensor *dst = dsp_model_own_tensor(m, src, name, type, dst_row * (size_t)rows);
        if (!dst) {
            st = DSP_ERR_NOMEM;
            break;
        }
        q_job j = {src, dst, type, scratch, dsp_dtype_row_bytes(src->type, src->ne[0]), dst_row, rows};
        dsp_pool_run(pool, (int)((rows + ROWS_PER_TASK - 1) / ROWS_PER_TASK), q_task, &j);
        *slots[i] = dst;
        if (src == tied) w->output = dst;
        release_if_owned(m, src);
        done += src->n_elems;
        int pct = (int)(done * 100 / total);
        if (progress && pct / 5 != last / 5) {
            fprintf(stderr, "\rquantizing %s to %s: %3d%%", m->path, dsp_dtype_name(type), pct);
            last = pct;
        }
    }
    if (progress) fprintf(stderr, "\n");
out:
    free(scratch);
    dsp_pool_destroy(pool);
    free(slots);
    return st;
}
