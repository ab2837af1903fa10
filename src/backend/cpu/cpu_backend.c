/* backend/cpu/cpu_backend: the reference backend (backend.h) on the kernel table of ops.h.
 *
 * Buffers are 64-byte aligned host arrays; a matrix weight is the mmapped tensor itself (never
 * copied), except that a panel type's matrix (Q4_0, Q4_1: ops.h "panel order") is repacked once
 * into panels for the 8-bit-activation matmuls (the tensor stays for row reads); a vector weight
 * that is not f32 (a bf16 norm of a Hugging Face checkpoint) is widened to f32 once, at creation.
 * The KV store is (n_layers, n_blocks, block_tokens, kv_dim) for K and for V, of F32 (the
 * default), F16 or BF16 (backend params kv_type; --kv-type): rows are rounded to the type when
 * written and widened exactly when attention reads them (ops.h dots16/axpys16), so a row's bits
 * still depend on nothing but its own inputs.
 *
 * Matmuls with quantized weights of the types dsp_cpu_q8_type() lists take 8-bit activations
 * (ops.h, "q8 block order") unless the backend was made with f32_activations: a matmul call
 * quantizes its input rows once (q/k/v and gate/up share one call, hence one quantization), then
 * every matrix of the call reads the q8 rows. Other types (F32/F16/BF16, Q5_0, ...) keep f32
 * activations. The choice depends only on the weight type, never on the batch.
 *
 * Work is split over the persistent pool only by output element (matmul: runs of weight rows per
 * task, guided_split; attention: one (row, KV head) per task), so no value depends on the thread count
 * or the batch (backend.h, batch invariance). Row-local ops (norms, RoPE, adds) run on the calling
 * thread; SwiGLU, a matmul's input quantization and the argmax of logits rows, which were worth a
 * hand-off, run on the pool. All scratch is sized by reserve(); a forward allocates nothing. */
#include "backend/backend.h"

#include "backend/cpu/ops.h"
#include "core/file.h"
#include "core/quant.h"
#include "core/threads.h"

#include <inttypes.h>
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dsp_buf {
    float *data;
    size_t n;
};

struct dsp_bweight {
    const dsp_tensor *t;
    const void *data;   /* t->data, or `own` */
    uint32_t type;
    size_t row_bytes;   /* bytes per row of ne[0] elements */
    float *own;         /* f32 copy of a non-f32 vector */
    void *panel;        /* a panel type's matrix repacked (ops.h "panel order"), with 8-bit activations */
};

struct dsp_kv_store {
    int n_layers, kv_dim, block_tokens;
    uint32_t n_blocks;
    int kind;   /* element type: 0 f32, 1 f16, 2 bf16 (kv_load's kinds in simd_impl.h) */
    size_t esz;   /* bytes per element */
    size_t bytes; /* of k and of v */
    uint8_t *k, *v;
};

typedef struct cpu_backend {
    dsp_backend base;
    const dsp_cpu_ops *ops;
    dsp_pool *pool;
    int n_threads;
    dsp_be_limits lim;
    float *wrow;             /* (n_threads, DSP_CPU_MM_ROWS, mm_stride(max_width)) */
    size_t wrow_per_thread;
    bool q8;                 /* 8-bit activations for the q8 weight types */
    int kv_kind;             /* K/V element type of the stores it creates (dsp_kv_store.kind) */
    bool reserve;            /* dsp_backend_params.reserve */
    uint8_t *xq;             /* (max_tokens, q8 row of max_width): the current matmul input, quantized */
    size_t xq_row;           /* dsp_cpu_q8_row_bytes(max_width) */
    float *scores;           /* (n_threads, ATT_TOKENS * max_group, max_keys) */
    size_t scores_per_thread;
    int *att_blk;            /* (max_tokens + 1): first row of each attention block of the current call */
    float *rope_cs;          /* (max_tokens, max_rot_dim): (cos, sin) pairs of the current forward */
    const dsp_buf *cs_freq;  /* the rope the table was built for (NULL: none yet this forward) */
    float cs_scale, cs_factor;
    const dsp_be_batch *b;   /* the current forward's batch */
    size_t att_reread;       /* ATT_REREAD_BYTES, or DSP_CPU_ATT_REREAD_BYTES (tests: 0 takes the group path always) */
} cpu_backend;

/* rows of one sequence that an attention task serves together (at most; cpu_attention halves it
 * down to ATT_TOKENS_MIN while there are fewer than two tasks per thread), and keys per chunk of its
 * pass. Every block streams its head's keys and values from L2/L3 once, so a block of 4 rows made
 * long prefills bandwidth-bound (1,800-token prefill, Qwen3-0.6B Q4_K_M, 2-core Xeon: 11.6 s with
 * blocks of 4 rows, 9.8 s with 32). A chunk must stay in L1 while the block's rows use it: a head's
 * rows of consecutive positions lie kv_dim floats apart, 4 KiB for Qwen3 (1024), so all of a
 * chunk's rows fall in the same L1 sets; 32 keys overflowed the 12 ways (1,229 tokens: 11.3 s at
 * 32 keys, 8.5-9.3 s at 8; 4 to 12 alike). The blocking never changes a row's bits. */
#define ATT_TOKENS 32
#define ATT_TOKENS_MIN 4
#define ATT_KEYS 8
/* keys per chunk for blocks of at most ATT_FEW_ROWS rows (decode, short verify blocks): the L1 sets
 * are no concern with so few rows, and a longer chunk spreads each call's fixed costs (the output
 * row's loads and stores in axpys, the call itself) over more keys. Chunking never changes a bit. */
#define ATT_FEW_ROWS 4
#define ATT_KEYS_FEW 32
/* a head's K bytes from which decode tasks serve a whole query group (cpu_attention) */
#define ATT_REREAD_BYTES (192u << 10)

static cpu_backend *cpu(dsp_backend *be) { return (cpu_backend *)be; }

static void *alloc64(size_t bytes) {
    bytes = (bytes ? bytes : 1);
    bytes = (bytes + 63) / 64 * 64;
    return aligned_alloc(64, bytes);
}

/* ---- memory ----------------------------------------------------------------------------------- */

static dsp_status cpu_reserve(dsp_backend *be, const dsp_be_limits *l) {
    cpu_backend *c = cpu(be);
    dsp_be_limits n = c->lim;
    if (l->max_tokens > n.max_tokens) n.max_tokens = l->max_tokens;
    if (l->max_width > n.max_width) n.max_width = l->max_width;
    if (l->max_group > n.max_group) n.max_group = l->max_group;
    if (l->max_keys > n.max_keys) n.max_keys = l->max_keys;
    if (l->max_rot_dim > n.max_rot_dim) n.max_rot_dim = l->max_rot_dim;
    if (!memcmp(&n, &c->lim, sizeof n) && c->wrow) return DSP_OK;
    size_t wpt = (size_t)DSP_CPU_MM_ROWS * (size_t)dsp_cpu_mm_stride(n.max_width);
    size_t spt = (size_t)ATT_TOKENS * n.max_group * n.max_keys;
    float *wrow = alloc64((size_t)c->n_threads * wpt * sizeof(float));
    float *scores = alloc64((size_t)c->n_threads * spt * sizeof(float));
    int *att_blk = alloc64((size_t)(n.max_tokens + 1) * sizeof(int));
    float *cs = alloc64((size_t)n.max_tokens * (size_t)n.max_rot_dim * sizeof(float));
    const size_t xq_row = dsp_cpu_q8_row_bytes(n.max_width);
    uint8_t *xq = c->q8 ? alloc64((size_t)n.max_tokens * xq_row) : NULL;
    if (!wrow || !scores || !att_blk || !cs || (c->q8 && !xq)) {
        free(wrow), free(scores), free(att_blk), free(cs), free(xq);
        return dsp_error(DSP_ERR_NOMEM, "cpu backend: no memory for scratch (%d tokens, width %d, %u keys)", n.max_tokens, n.max_width,
                         n.max_keys);
    }
    free(c->wrow), free(c->scores), free(c->att_blk), free(c->rope_cs), free(c->xq);
    c->wrow = wrow, c->scores = scores, c->att_blk = att_blk, c->rope_cs = cs, c->xq = xq, c->xq_row = xq_row;
    c->wrow_per_thread = wpt, c->scores_per_thread = spt;
    c->lim = n;
    return DSP_OK;
}

static dsp_status cpu_buf_create(dsp_backend *be, size_t n, dsp_buf **out) {
    (void)be;
    *out = NULL;
    dsp_buf *b = calloc(1, sizeof *b);
    if (n > SIZE_MAX / sizeof(float) / 2 || !b) {
        free(b);
        return dsp_error(DSP_ERR_NOMEM, "cpu backend: no memory for a buffer of %zu floats", n);
    }
    b->data = alloc64(n * sizeof(float));
    if (!b->data) {
        free(b);
        return dsp_error(DSP_ERR_NOMEM, "cpu backend: no memory for a buffer of %zu floats", n);
    }
    memset(b->data, 0, n * sizeof(float));
    b->n = n;
    *out = b;
    return DSP_OK;
}

static void cpu_buf_destroy(dsp_backend *be, dsp_buf *b) {
    (void)be;
    if (!b) return;
    free(b->data);
    free(b);
}

static dsp_status cpu_weight_create(dsp_backend *be, const dsp_tensor *t, dsp_bweight **out) {
    *out = NULL;
    const dsp_dtype_traits *tr = dsp_dtype_get(t->type);
    if (!tr || !tr->can_dequant)
        return dsp_error(DSP_ERR_UNSUPPORTED, "tensor %.*s: type %s cannot run on the CPU backend", (int)t->name.len, t->name.ptr,
                         dsp_dtype_name(t->type) ? dsp_dtype_name(t->type) : "?");
    dsp_bweight *w = calloc(1, sizeof *w);
    if (!w) return dsp_error(DSP_ERR_NOMEM, "no memory");
    w->t = t;
    w->data = t->data;
    w->type = t->type;
    w->row_bytes = dsp_dtype_row_bytes(t->type, t->ne[0]);
    bool vector = t->n_elems == t->ne[0];
    if (vector && t->type != DSP_F32) {
        w->own = alloc64(t->ne[0] * sizeof(float));
        if (!w->own) {
            free(w);
            return dsp_error(DSP_ERR_NOMEM, "no memory");
        }
        dsp_status st = dsp_dequantize_row(t->type, t->data, w->own, t->ne[0]);
        if (st) {
            free(w->own), free(w);
            return st;
        }
        w->data = w->own;
        w->type = DSP_F32;
        w->row_bytes = t->ne[0] * sizeof(float);
    } else if (!vector && cpu(be)->q8 && dsp_cpu_panel_type(t->type) && t->ne[0] % 32 == 0) {
        /* repacked once; the tensor itself stays for anything that reads its rows (an embedding) */
        const int64_t in = (int64_t)t->ne[0], n_out = (int64_t)(t->n_elems / t->ne[0]);
        w->panel = alloc64(dsp_cpu_panel_bytes(t->type, in, n_out));
        if (!w->panel) {
            free(w);
            return dsp_error(DSP_ERR_NOMEM, "tensor %.*s: no memory for its panels", (int)t->name.len, t->name.ptr);
        }
        dsp_cpu_make_panels(t->type, t->data, w->row_bytes, in, n_out, w->panel);
        /* the file's copy is read again only for embedding rows: its pages need not stay resident */
        dsp_file_drop_pages(t->data, (size_t)t->nbytes);
    }
    *out = w;
    return DSP_OK;
}

static void cpu_weight_destroy(dsp_backend *be, dsp_bweight *w) {
    (void)be;
    if (!w) return;
    free(w->own);
    free(w->panel);
    free(w);
}

static dsp_status cpu_kv_create(dsp_backend *be, int n_layers, int kv_dim, int block_tokens, uint32_t n_blocks, dsp_kv_store **out) {
    const int kind = cpu(be)->kv_kind;
    const size_t esz = kind ? 2 : sizeof(float);
    *out = NULL;
    if (n_layers <= 0 || kv_dim <= 0 || block_tokens <= 0 || n_blocks == 0)
        return dsp_error(DSP_ERR_INVALID_ARG, "kv store: bad shape (layers %d, kv_dim %d, block %d, blocks %u)", n_layers, kv_dim,
                         block_tokens, n_blocks);
    uint64_t elems;
    if (__builtin_mul_overflow((uint64_t)n_layers * (uint64_t)n_blocks, (uint64_t)block_tokens * (uint64_t)kv_dim, &elems) ||
        elems > SIZE_MAX / sizeof(float) / 4)
        return dsp_error(DSP_ERR_NOMEM, "kv store: %d layers x %u blocks x %d tokens x %d is too large", n_layers, n_blocks, block_tokens,
                         kv_dim);
    dsp_kv_store *kv = calloc(1, sizeof *kv);
    if (!kv) return dsp_error(DSP_ERR_NOMEM, "no memory");
    kv->n_layers = n_layers, kv->kv_dim = kv_dim, kv->block_tokens = block_tokens, kv->n_blocks = n_blocks;
    kv->kind = kind, kv->esz = esz;
    kv->bytes = (size_t)elems * esz; /* (elems * 4 fits size_t: checked above) */
    kv->k = dsp_mem_map(kv->bytes); /* own mappings: the pool's pages go back when it is destroyed */
    kv->v = dsp_mem_map(kv->bytes);
    if (!kv->k || !kv->v || (cpu(be)->reserve && (!dsp_mem_populate(kv->k, kv->bytes) || !dsp_mem_populate(kv->v, kv->bytes)))) {
        dsp_mem_unmap(kv->k, kv->bytes), dsp_mem_unmap(kv->v, kv->bytes), free(kv);
        return dsp_error(DSP_ERR_NOMEM, "kv store: cannot allocate %" PRIu64 " MiB", (uint64_t)(2 * elems * esz) >> 20);
    }
    *out = kv;
    return DSP_OK;
}

static void cpu_kv_destroy(dsp_backend *be, dsp_kv_store *kv) {
    (void)be;
    if (!kv) return;
    dsp_mem_unmap(kv->k, kv->bytes), dsp_mem_unmap(kv->v, kv->bytes), free(kv);
}

/* byte offset of row t of a block of a layer */
static inline size_t kv_off(const dsp_kv_store *kv, int layer, uint32_t block, uint32_t t) {
    return (((size_t)layer * kv->n_blocks + block) * (size_t)kv->block_tokens + t) * (size_t)kv->kv_dim * kv->esz;
}

static inline size_t kv_pos_off(const dsp_kv_store *kv, const dsp_kv_seq *s, int layer, uint32_t pos) {
    uint32_t bt = (uint32_t)kv->block_tokens;
    return kv_off(kv, layer, s->blocks[pos / bt], pos % bt);
}

static dsp_status cpu_kv_copy_block(dsp_backend *be, dsp_kv_store *kv, uint32_t dst, uint32_t src) {
    (void)be;
    size_t blk = (size_t)kv->block_tokens * (size_t)kv->kv_dim * kv->esz;
    for (int l = 0; l < kv->n_layers; l++) {
        memcpy(kv->k + kv_off(kv, l, dst, 0), kv->k + kv_off(kv, l, src, 0), blk);
        memcpy(kv->v + kv_off(kv, l, dst, 0), kv->v + kv_off(kv, l, src, 0), blk);
    }
    return DSP_OK;
}

/* ---- transfers -------------------------------------------------------------------------------- */

static void cpu_buf_write(dsp_backend *be, dsp_buf *b, size_t off, const float *src, size_t n) {
    (void)be;
    DSP_ASSERT(off <= b->n && n <= b->n - off);
    memcpy(b->data + off, src, n * sizeof(float));
}

static dsp_status cpu_buf_read(dsp_backend *be, const dsp_buf *b, size_t off, float *dst, size_t n) {
    (void)be;
    DSP_ASSERT(off <= b->n && n <= b->n - off);
    memcpy(dst, b->data + off, n * sizeof(float));
    return DSP_OK;
}

/* the logits are host memory already: no copy. The kernel table's argmax is the sampler's own rule
 * (dsp_sample_argmax, ops.h), vectorized; rows are spread over the pool (a 16-row round's argmax
 * on one thread was ~8% of the round while the other threads waited). */
typedef struct argmax_job {
    const dsp_cpu_ops *ops;
    const float *x;
    int n_vocab;
    int32_t *out;
} argmax_job;

static void argmax_task(void *ctx, int task, int thread) {
    (void)thread;
    const argmax_job *j = ctx;
    j->out[task] = (int32_t)j->ops->argmax(j->x + (size_t)task * (size_t)j->n_vocab, j->n_vocab);
}

static dsp_status cpu_argmax(dsp_backend *be, const dsp_buf *logits, int n_rows, int n_vocab, int32_t *out) {
    cpu_backend *c = cpu(be);
    DSP_ASSERT(n_rows >= 1 && (size_t)n_rows * (size_t)n_vocab <= logits->n);
    argmax_job j = {c->ops, logits->data, n_vocab, out};
    dsp_pool_run(c->pool, n_rows, argmax_task, &j);
    return DSP_OK;
}

/* ---- a forward -------------------------------------------------------------------------------- */

static dsp_status cpu_begin(dsp_backend *be, const dsp_be_batch *b) {
    cpu_backend *c = cpu(be);
    DSP_ASSERT(b->n_tokens >= 1 && b->n_tokens <= c->lim.max_tokens);
    c->b = b;
    c->cs_freq = NULL;
    return DSP_OK;
}

static dsp_status cpu_end(dsp_backend *be) {
    cpu(be)->b = NULL;
    return DSP_OK;
}

static void cpu_embed(dsp_backend *be, dsp_buf *x, const dsp_bweight *table, int dim) {
    cpu_backend *c = cpu(be);
    const dsp_be_batch *b = c->b;
    DSP_ASSERT((size_t)b->n_tokens * (size_t)dim <= x->n);
    for (int i = 0; i < b->n_tokens; i++)
        c->ops->dequant_row(table->type, (const uint8_t *)table->data + (size_t)b->tokens[i] * table->row_bytes, x->data + (size_t)i * dim,
                            (int64_t)dim);
}

static void cpu_rmsnorm(dsp_backend *be, dsp_buf *out, const dsp_buf *x, const dsp_bweight *w, int n_rows, int dim, float eps,
                        const int32_t *rows) {
    cpu_backend *c = cpu(be);
    const float *wd = w ? w->data : NULL;
    for (int r = 0; r < n_rows; r++) {
        size_t src = (size_t)(rows ? rows[r] : r) * (size_t)dim;
        c->ops->rmsnorm(out->data + (size_t)r * dim, x->data + src, wd, dim, eps);
    }
}

/* A job of up to 3 matmuls over the same activations (q/k/v, gate/up): one pool run, tasks are
 * runs of weight rows of each weight in turn (guided_split). A q8 matmul of many rows (prefill) is split
 * in two dimensions instead: Q8_TASK_W weight rows x Q8_TASK_X activation rows per task, so that a
 * task's q8 rows (~150 KiB) stay in L2 while its weight rows pass over them (a split by weight
 * rows alone would stream all the activations from L3 for every 16 weight rows). Each output is
 * still computed whole by one task, in the kernel's fixed order. */
#define Q8_TASK_W 64
#define Q8_TASK_X 64

/* The split of a matrix's `out` weight rows over n threads by weight rows only (decode, verify
 * blocks): phases of n tasks, each task 1 / (2n) of the rows left (multiples of DSP_CPU_MM_ROWS),
 * until a task would be DSP_CPU_MM_ROWS rows; the rest in tasks of that size. Long contiguous runs
 * per task are what a streaming decode needs: with 16-row tasks taken alternately by two threads,
 * the first PF_ROWS rows of each task had been prefetched into the other core's L2 or not at all,
 * and decode of the Qwen3-0.6B Q8_0 file ran at 25 tok/s instead of 31-38 (2 threads, Zen 3);
 * the small tasks at the end keep the threads finishing together. Returns the number of tasks;
 * for 0 <= t < that number, [*r0, *r1) are task t's rows. */
static int guided_split(int64_t out, int n, int t, int64_t *r0, int64_t *r1) {
    int64_t start = 0;
    int k = 0;
    for (;;) {
        const int64_t left = out - start, size = left / (2 * n) / DSP_CPU_MM_ROWS * DSP_CPU_MM_ROWS;
        if (size <= DSP_CPU_MM_ROWS) {
            const int nt = (int)((left + DSP_CPU_MM_ROWS - 1) / DSP_CPU_MM_ROWS);
            if (t >= k && t < k + nt) {
                *r0 = start + (int64_t)(t - k) * DSP_CPU_MM_ROWS;
                *r1 = *r0 + DSP_CPU_MM_ROWS < out ? *r0 + DSP_CPU_MM_ROWS : out;
            }
            return k + nt;
        }
        if (t >= k && t < k + n) *r0 = start + (int64_t)(t - k) * size, *r1 = *r0 + size;
        start += n * size, k += n; /* at most half of what was left: O(log out) phases */
    }
}
typedef struct mm_job {
    cpu_backend *c;
    int n_mats;
    const dsp_bweight *w[3];
    float *y[3];
    int first_task[4]; /* task index where matrix m starts, after the quantization tasks; first_task[n_mats] = n_tasks */
    int x_blocks[3];   /* activation-row blocks of matrix m's tasks (1: a split by weight rows only) */
    const float *x;
    const uint8_t *xq; /* x quantized (q8 rows of c->xq_row bytes), or NULL */
    int n_rows;
    int n_q, q_rows;   /* quantization tasks (the first n_q of the run), rows per task */
    atomic_int q_done; /* quantization tasks finished */
} mm_job;

/* Tasks [0, n_q) of a matmul run quantize x (q_rows rows each); the matmul tasks come after them
 * and wait until all are done. The pool hands out tasks in index order, so every quantization task
 * is taken before any matmul task and none of them waits: the quantization costs no run (and no
 * hand-off) of its own and is spread over the threads (on one thread a 16-row decode round's
 * quantizations were ~7% of the round while the other threads waited). */
static void quant_rows(mm_job *j, int task) {
    const int64_t in = (int64_t)j->w[0]->t->ne[0];
    for (int r = j->q_rows * task; r < j->n_rows && r < j->q_rows * (task + 1); r++)
        j->c->ops->quantize_q8(j->x + (size_t)r * in, in, j->c->xq + (size_t)r * j->c->xq_row);
    atomic_fetch_add_explicit(&j->q_done, 1, memory_order_release);
}

static void wait_quantized(mm_job *j) {
    for (unsigned i = 1; atomic_load_explicit(&j->q_done, memory_order_acquire) < j->n_q; i++) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
        if (i % 4096 == 0) sched_yield(); /* the thread quantizing was descheduled (a busy machine) */
    }
}

static void mm_task(void *ctx, int task, int thread) {
    mm_job *j = ctx;
    if (task < j->n_q) {
        quant_rows(j, task);
        return;
    }
    if (j->n_q) wait_quantized(j);
    int m = 0;
    while (task >= j->first_task[m + 1]) m++;
    const dsp_bweight *w = j->w[m];
    int64_t in = (int64_t)w->t->ne[0], out = (int64_t)w->t->ne[1];
    if (j->x_blocks[m] > 1) { /* panels, 2-D split */
        const int t = task - j->first_task[m], xb = t % j->x_blocks[m];
        const int64_t r0 = (int64_t)(t / j->x_blocks[m]) * Q8_TASK_W, r1 = r0 + Q8_TASK_W < out ? r0 + Q8_TASK_W : out;
        const int i0 = xb * Q8_TASK_X, ni = j->n_rows - i0 < Q8_TASK_X ? j->n_rows - i0 : Q8_TASK_X;
        j->c->ops->matmul_panel(w->type, w->panel, in, out, r0, r1, j->xq + (size_t)i0 * j->c->xq_row, j->c->xq_row, ni,
                                j->y[m] + (size_t)i0 * (size_t)out, out);
        return;
    }
    int64_t r0 = 0, r1 = 0;
    guided_split(out, j->c->n_threads, task - j->first_task[m], &r0, &r1);
    if (w->panel)
        j->c->ops->matmul_panel(w->type, w->panel, in, out, r0, r1, j->xq, j->c->xq_row, j->n_rows, j->y[m], out);
    else
        j->c->ops->matmul(w->type, w->data, w->row_bytes, in, r0, r1, j->x, in, j->n_rows, j->y[m], out,
                          j->c->wrow + (size_t)thread * j->c->wrow_per_thread);
}

static void cpu_matmul(dsp_backend *be, int n, const dsp_bweight *const *w, dsp_buf *const *y, const dsp_buf *x, int n_rows) {
    cpu_backend *c = cpu(be);
    DSP_ASSERT(n >= 1 && n <= 3 && n_rows >= 1);
    mm_job j = {.c = c, .n_mats = n, .x = x->data, .n_rows = n_rows};
    for (int m = 0; m < n; m++)
        if (w[m]->panel) j.xq = c->xq; /* every q8 type is repacked into panels under --precision q8 */
    if (j.xq) { /* once for every matrix of the call: a few tasks per thread, of at most 16 rows */
        const int per = (n_rows + 2 * c->n_threads - 1) / (2 * c->n_threads);
        j.q_rows = per < 1 ? 1 : per > 16 ? 16 : per;
        j.n_q = (n_rows + j.q_rows - 1) / j.q_rows;
    }
    atomic_init(&j.q_done, 0);
    j.first_task[0] = j.n_q;
    for (int m = 0; m < n; m++) {
        DSP_ASSERT(w[m]->t->ne[0] == w[0]->t->ne[0] && (int64_t)w[m]->t->ne[0] <= c->lim.max_width);
        DSP_ASSERT((size_t)n_rows * w[m]->t->ne[1] <= y[m]->n && (size_t)n_rows * w[m]->t->ne[0] <= x->n);
        j.w[m] = w[m];
        j.y[m] = y[m]->data;
        const bool q8 = w[m]->panel != NULL;
        j.x_blocks[m] = q8 && n_rows > Q8_TASK_X ? (n_rows + Q8_TASK_X - 1) / Q8_TASK_X : 1;
        int64_t r0, r1;
        const int64_t out = (int64_t)w[m]->t->ne[1];
        j.first_task[m + 1] = j.first_task[m] + (j.x_blocks[m] > 1 ? (int)((out + Q8_TASK_W - 1) / Q8_TASK_W) * j.x_blocks[m]
                                                                   : guided_split(out, c->n_threads, -1, &r0, &r1));
    }
    dsp_pool_run(c->pool, j.first_task[n], mm_task, &j);
}

static void cpu_add_bias(dsp_backend *be, dsp_buf *y, const dsp_bweight *bias, int n_rows, int dim) {
    (void)be;
    const float *b = bias->data;
    for (int i = 0; i < n_rows; i++)
        for (int r = 0; r < dim; r++) y->data[(size_t)i * dim + r] += b[r];
}

/* (cos, sin) per row of the current batch, built once per forward and rope */
static const float *rope_table(cpu_backend *c, const dsp_rope *rope) {
    if (c->cs_freq == rope->inv_freq && c->cs_scale == rope->pos_scale && c->cs_factor == rope->attn_factor) return c->rope_cs;
    const dsp_be_batch *b = c->b;
    const float *inv = rope->inv_freq->data;
    int half = rope->rot_dim / 2;
    DSP_ASSERT(rope->rot_dim <= c->lim.max_rot_dim);
    for (int i = 0; i < b->n_tokens; i++) {
        float p = (float)b->pos[i] / rope->pos_scale, *cs = c->rope_cs + (size_t)i * rope->rot_dim;
        for (int k = 0; k < half; k++) {
            float a = p * inv[k];
            cs[2 * k] = cosf(a);
            cs[2 * k + 1] = sinf(a);
            if (rope->attn_factor != 1.0f) cs[2 * k] *= rope->attn_factor, cs[2 * k + 1] *= rope->attn_factor;
        }
    }
    c->cs_freq = rope->inv_freq, c->cs_scale = rope->pos_scale, c->cs_factor = rope->attn_factor;
    return c->rope_cs;
}

static void cpu_norm_rope(dsp_backend *be, dsp_buf *x, const dsp_bweight *norm, float eps, int n_heads, int head_dim, const dsp_rope *rope) {
    cpu_backend *c = cpu(be);
    const float *cs_all = rope_table(c, rope);
    const float *nw = norm ? norm->data : NULL;
    size_t width = (size_t)n_heads * head_dim;
    for (int i = 0; i < c->b->n_tokens; i++) {
        const float *cs = cs_all + (size_t)i * rope->rot_dim;
        for (int h = 0; h < n_heads; h++) {
            float *xh = x->data + (size_t)i * width + (size_t)h * head_dim;
            if (nw) c->ops->rmsnorm(xh, xh, nw, head_dim, eps);
            c->ops->rope(xh, cs, rope->rot_dim, rope->neox);
        }
    }
}

/* one row into the store's type: f32 copied, f16/bf16 rounded to nearest even */
static void kv_put(const dsp_kv_store *kv, uint8_t *dst, const float *src) {
    if (!kv->kind) {
        memcpy(dst, src, (size_t)kv->kv_dim * sizeof(float));
        return;
    }
    uint16_t *h = (uint16_t *)dst;
    for (int e = 0; e < kv->kv_dim; e++) h[e] = kv->kind == 1 ? dsp_f32_to_f16(src[e]) : dsp_f32_to_bf16(src[e]);
}

static void cpu_kv_write(dsp_backend *be, dsp_kv_store *kv, int layer, const dsp_buf *k, const dsp_buf *v) {
    const dsp_be_batch *b = cpu(be)->b;
    for (int i = 0; i < b->n_tokens; i++) {
        const dsp_kv_seq *s = b->seqs[b->seq[i]];
        size_t o = kv_pos_off(kv, s, layer, (uint32_t)b->pos[i]);
        kv_put(kv, kv->k + o, k->data + (size_t)i * kv->kv_dim);
        kv_put(kv, kv->v + o, v->data + (size_t)i * kv->kv_dim);
    }
}

typedef struct att_job {
    cpu_backend *c;
    float *out;
    const float *q;
    const dsp_kv_store *kv;
    int layer, n_head, n_head_kv, head_dim;
    float scale;
    int heads; /* query heads per task: a KV group (n_head / n_head_kv), or 1 when blocks are few */
} att_job;

/* the rows of keys (or values: base) t0 .. t0 + n - 1 of s from element col, n = min(ck, what is
 * left): consecutive positions are consecutive rows of a block, so one block lookup per block */
static uint32_t att_chunk(const uint8_t *base, const dsp_kv_store *kv, const dsp_kv_seq *s, int layer, uint32_t t0, uint32_t max_keys,
                          uint32_t ck, size_t col, const void **row) {
    const uint32_t n = max_keys - t0 < ck ? max_keys - t0 : ck, bt = (uint32_t)kv->block_tokens;
    const size_t rs = (size_t)kv->kv_dim * kv->esz, c = col * kv->esz;
    uint32_t blk = t0 / bt, r = t0 % bt;
    const uint8_t *p = base + kv_off(kv, layer, s->blocks[blk], r) + c;
    for (uint32_t t = 0; t < n; t++) {
        row[t] = p;
        if (++r < bt) {
            p += rs;
        } else if (t + 1 < n) {
            r = 0;
            p = base + kv_off(kv, layer, s->blocks[++blk], 0) + c;
        }
    }
    return n;
}

/* how many of the chunk's keys t0 .. t0 + nt - 1 row i of the batch attends to (causal: its n_keys) */
static int att_span(const dsp_be_batch *b, int i, uint32_t t0, uint32_t nt) {
    const uint32_t te = (uint32_t)b->n_keys[i] < t0 + nt ? (uint32_t)b->n_keys[i] : t0 + nt;
    return te > t0 ? (int)(te - t0) : 0;
}

/* One task = one KV head x a block of up to ATT_TOKENS consecutive rows of one sequence (a
 * prefill chunk or verify block; rows of different sequences are blocks of one): the group of query
 * heads that share the KV head (GQA) and the block's rows are served by a single pass over the keys
 * and values, each key and value row read once for all of them. Per row and head the order is
 * fixed, whatever the block: scores in key order, softmax, then o = sum_t p_t * v_t accumulated in
 * key order, so a row's bits do not depend on its neighbours. */
static void att_task(void *ctx, int task, int thread) {
    att_job *j = ctx;
    cpu_backend *c = j->c;
    const dsp_cpu_ops *ops = c->ops;
    const dsp_be_batch *b = c->b;
    const dsp_kv_store *kv = j->kv;
    const int grp = j->n_head / j->n_head_kv, hd = j->head_dim, q_dim = j->n_head * hd;
    const int tpb = j->n_head / j->heads, h0 = (task % tpb) * j->heads; /* tasks per block; the task's first query head */
    const int blk = task / tpb, kvh = h0 / grp, g0 = h0 % grp, g1 = g0 + j->heads; /* the group's heads this task serves */
    const int i0 = c->att_blk[blk], i1 = c->att_blk[blk + 1];
    const dsp_kv_seq *s = b->seqs[b->seq[i0]];
    const uint32_t stride = c->lim.max_keys;
    uint32_t max_keys = 0;
    for (int i = i0; i < i1; i++)
        if ((uint32_t)b->n_keys[i] > max_keys) max_keys = (uint32_t)b->n_keys[i];
    float *sc = c->scores + (size_t)thread * c->scores_per_thread; /* row (i - i0) * grp + g */
    const void *row[ATT_KEYS_FEW]; /* the chunk's key (then value) rows, L1-resident while the block's rows use them */
    const int kind = kv->kind;
    const uint32_t ck = i1 - i0 <= ATT_FEW_ROWS ? ATT_KEYS_FEW : ATT_KEYS;
    for (uint32_t t0 = 0; t0 < max_keys; t0 += ck) {
        const uint32_t nt = att_chunk(kv->k, kv, s, j->layer, t0, max_keys, ck, (size_t)kvh * hd, row);
        for (int i = i0; i < i1; i++) {
            const int n = att_span(b, i, t0, nt);
            const float *q = j->q + (size_t)i * q_dim + (size_t)kvh * grp * hd;
            float *si = sc + (size_t)(i - i0) * grp * stride + t0;
            for (int g = g0; g < g1 && n > 0; g++) {
                if (kind) ops->dots16(q + (size_t)g * hd, (const uint16_t *const *)row, n, hd, j->scale, si + (size_t)g * stride, kind == 2);
                else ops->dots(q + (size_t)g * hd, (const float *const *)row, n, hd, j->scale, si + (size_t)g * stride);
            }
        }
    }
    for (int i = i0; i < i1; i++) {
        float *si = sc + (size_t)(i - i0) * grp * stride;
        for (int g = g0; g < g1; g++) ops->softmax(si + (size_t)g * stride, (uint32_t)b->n_keys[i]);
        memset(j->out + (size_t)i * q_dim + (size_t)(kvh * grp + g0) * hd, 0, (size_t)(g1 - g0) * hd * sizeof(float));
    }
    for (uint32_t t0 = 0; t0 < max_keys; t0 += ck) {
        const uint32_t nt = att_chunk(kv->v, kv, s, j->layer, t0, max_keys, ck, (size_t)kvh * hd, row);
        for (int i = i0; i < i1; i++) {
            const int n = att_span(b, i, t0, nt);
            float *o = j->out + (size_t)i * q_dim + (size_t)kvh * grp * hd;
            const float *si = sc + (size_t)(i - i0) * grp * stride + t0;
            for (int g = g0; g < g1 && n > 0; g++) {
                if (kind) ops->axpys16(o + (size_t)g * hd, si + (size_t)g * stride, (const uint16_t *const *)row, n, hd, kind == 2);
                else ops->axpys(o + (size_t)g * hd, si + (size_t)g * stride, (const float *const *)row, n, hd);
            }
        }
    }
}

/* Decode rows (one row per sequence) of long contexts when the KV heads make fewer tasks than two
 * per thread (one sequence of the default model: 3 KV heads on 2 threads, one thread idle a
 * quarter of the attention): three passes, each split finer than a task per head group. The scores
 * over slices of the keys (a group's heads together), the softmax per row and head, the values
 * over slices of the head's elements (a group's heads together). Each score, softmax and output
 * element comes from the same calls on the same data in the same order as in att_task, so the
 * bits are the same. The scores live in the threads' shared scratch, row by head by key. */
typedef struct att_split {
    att_job *j;
    int n_ks, n_ds; /* key slices, element slices (of ATT_SPLIT_COLS) */
} att_split;
#define ATT_SPLIT_COLS 32

/* what a task of a split pass works on: row i, KV head kvh (its group's heads from query head
 * kvh * grp), slice `slice` of n_slices */
typedef struct att_split_at {
    const att_job *j;
    const dsp_kv_store *kv;
    const dsp_kv_seq *s;
    int grp, hd, i, kvh, slice;
    uint32_t nk, stride; /* the row's keys; the scores' row stride */
    float *sc;           /* the group's first head's scores */
} att_split_at;
static att_split_at att_split_task(const att_split *x, int task, int n_slices) {
    const att_job *j = x->j;
    const dsp_be_batch *b = j->c->b;
    att_split_at a = {j, j->kv, NULL, j->n_head / j->n_head_kv, j->head_dim, task / (j->n_head_kv * n_slices),
                      task % (j->n_head_kv * n_slices) / n_slices, task % n_slices, 0, j->c->lim.max_keys, NULL};
    a.s = b->seqs[b->seq[a.i]];
    a.nk = (uint32_t)b->n_keys[a.i];
    a.sc = j->c->scores + ((size_t)a.i * j->n_head + (size_t)a.kvh * a.grp) * a.stride;
    return a;
}

static void att_split_scores(void *ctx, int task, int thread) {
    (void)thread;
    const att_split *x = ctx;
    const att_split_at a = att_split_task(x, task, x->n_ks);
    const dsp_cpu_ops *ops = a.j->c->ops;
    const uint32_t k0 = (uint32_t)((uint64_t)a.nk * a.slice / x->n_ks), k1 = (uint32_t)((uint64_t)a.nk * (a.slice + 1) / x->n_ks);
    const float *q = a.j->q + (size_t)a.i * a.j->n_head * a.hd + (size_t)a.kvh * a.grp * a.hd;
    const void *row[ATT_KEYS_FEW];
    for (uint32_t t0 = k0; t0 < k1; t0 += ATT_KEYS_FEW) {
        const uint32_t nt = att_chunk(a.kv->k, a.kv, a.s, a.j->layer, t0, k1, ATT_KEYS_FEW, (size_t)a.kvh * a.hd, row);
        for (int g = 0; g < a.grp; g++) {
            float *sc = a.sc + (size_t)g * a.stride + t0;
            if (a.kv->kind) ops->dots16(q + (size_t)g * a.hd, (const uint16_t *const *)row, (int)nt, a.hd, a.j->scale, sc, a.kv->kind == 2);
            else ops->dots(q + (size_t)g * a.hd, (const float *const *)row, (int)nt, a.hd, a.j->scale, sc);
        }
    }
}

static void att_split_softmax(void *ctx, int task, int thread) {
    (void)thread;
    const att_split *x = ctx;
    const cpu_backend *c = x->j->c;
    const int i = task / x->j->n_head;
    c->ops->softmax(c->scores + (size_t)task * c->lim.max_keys, (uint32_t)c->b->n_keys[i]);
}

static void att_split_values(void *ctx, int task, int thread) {
    (void)thread;
    const att_split *x = ctx;
    const att_split_at a = att_split_task(x, task, x->n_ds);
    const dsp_cpu_ops *ops = a.j->c->ops;
    const int d0 = a.slice * ATT_SPLIT_COLS, dn = a.hd - d0 < ATT_SPLIT_COLS ? a.hd - d0 : ATT_SPLIT_COLS;
    float *o = a.j->out + (size_t)a.i * a.j->n_head * a.hd + (size_t)a.kvh * a.grp * a.hd + d0;
    for (int g = 0; g < a.grp; g++) memset(o + (size_t)g * a.hd, 0, (size_t)dn * sizeof(float));
    const void *row[ATT_KEYS_FEW];
    for (uint32_t t0 = 0; t0 < a.nk; t0 += ATT_KEYS_FEW) {
        const uint32_t nt = att_chunk(a.kv->v, a.kv, a.s, a.j->layer, t0, a.nk, ATT_KEYS_FEW, (size_t)a.kvh * a.hd + d0, row);
        for (int g = 0; g < a.grp; g++) {
            const float *p = a.sc + (size_t)g * a.stride + t0;
            if (a.kv->kind) ops->axpys16(o + (size_t)g * a.hd, p, (const uint16_t *const *)row, (int)nt, dn, a.kv->kind == 2);
            else ops->axpys(o + (size_t)g * a.hd, p, (const float *const *)row, (int)nt, dn);
        }
    }
}

static void cpu_attention(dsp_backend *be, dsp_buf *out, const dsp_buf *q, const dsp_kv_store *kv, int layer, int n_head, int n_head_kv,
                          int head_dim, float scale) {
    cpu_backend *c = cpu(be);
    const dsp_be_batch *b = c->b;
    DSP_ASSERT(n_head / n_head_kv <= c->lim.max_group && n_head_kv * head_dim == kv->kv_dim);
    uint32_t max_keys = 0;
    for (int i = 0; i < b->n_tokens; i++) {
        DSP_ASSERT(b->n_keys[i] >= 1 && (uint32_t)b->n_keys[i] <= c->lim.max_keys);
        if ((uint32_t)b->n_keys[i] > max_keys) max_keys = (uint32_t)b->n_keys[i];
    }
    int n_blk = 0;
    for (int bt = ATT_TOKENS; bt >= ATT_TOKENS_MIN; bt /= 2) {
        n_blk = 0;
        for (int i = 0; i < b->n_tokens; i++)
            if (i == 0 || b->seq[i] != b->seq[i - 1] || i - c->att_blk[n_blk - 1] == bt) c->att_blk[n_blk++] = i;
        if (n_blk * n_head_kv >= 2 * c->n_threads) break;
    }
    c->att_blk[n_blk] = b->n_tokens;
    /* still under two tasks per thread (decode, a short verify block): one task per query head of a
     * group instead (each re-reads the group's keys, from L1/L2 at these sizes), unless a head's keys
     * are too many to re-read: then the group's heads share one pass, and decode rows take the
     * three finer passes of att_split. Default model (3 KV heads, groups of 3), one sequence
     * decoding, 2 threads on the 2-vCPU Xeon, f32 K/V: one pass per group took 1,800 keys from 90 to
     * 105 tok/s and 1,024 keys from 138 to 148-153, 512 and 128 keys alike (ATT_REREAD_BYTES: 768
     * f32 keys of 64); att_split then 2,329 keys 80-84 -> 91-94 (below the threshold it was no
     * faster). Neither changes a row's bits. */
    const size_t head_bytes = (size_t)max_keys * (size_t)head_dim * kv->esz;
    const bool few = n_blk * n_head_kv < 2 * c->n_threads;
    const int heads = few && head_bytes < c->att_reread ? 1 : n_head / n_head_kv;
    att_job j = {c, out->data, q->data, kv, layer, n_head, n_head_kv, head_dim, scale, heads};
    if (few && heads > 1 && n_blk == b->n_tokens &&
        (size_t)b->n_tokens * (size_t)n_head <= (size_t)c->n_threads * ATT_TOKENS * c->lim.max_group) { /* decode rows: att_split */
        att_split x = {&j, (2 * c->n_threads + b->n_tokens * n_head_kv - 1) / (b->n_tokens * n_head_kv), (head_dim + ATT_SPLIT_COLS - 1) / ATT_SPLIT_COLS};
        dsp_pool_run(c->pool, b->n_tokens * n_head_kv * x.n_ks, att_split_scores, &x);
        dsp_pool_run(c->pool, b->n_tokens * n_head, att_split_softmax, &x);
        dsp_pool_run(c->pool, b->n_tokens * n_head_kv * x.n_ds, att_split_values, &x);
        return;
    }
    dsp_pool_run(c->pool, n_blk * (n_head / heads), att_task, &j);
}

static void cpu_add(dsp_backend *be, dsp_buf *x, const dsp_buf *y, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++) x->data[i] += y->data[i];
}

/* element-wise, so any split gives the same bits; spread over the pool from a few rows of a
 * feed-forward on (one thread's SwiGLU of a 16-row round was ~3.5% of the round while the others waited) */
#define SWIGLU_TASK 4096 /* elements per task at least (a multiple of 16) */
typedef struct swiglu_job {
    const dsp_cpu_ops *ops;
    float *a;
    const float *b;
    size_t n, per;
} swiglu_job;

static void swiglu_task(void *ctx, int task, int thread) {
    (void)thread;
    const swiglu_job *j = ctx;
    const size_t i0 = (size_t)task * j->per, n = j->n - i0 < j->per ? j->n - i0 : j->per;
    j->ops->swiglu(j->a + i0, j->b + i0, (int64_t)n);
}

static void cpu_swiglu(dsp_backend *be, dsp_buf *gate, const dsp_buf *up, size_t n) {
    cpu_backend *c = cpu(be);
    size_t per = (n + (size_t)c->n_threads - 1) / (size_t)c->n_threads;
    per = (per + 15) / 16 * 16;
    if (per < SWIGLU_TASK) per = SWIGLU_TASK;
    swiglu_job j = {c->ops, gate->data, up->data, n, per};
    dsp_pool_run(c->pool, (int)((n + per - 1) / per), swiglu_task, &j);
}

static void cpu_copy_rows(dsp_backend *be, dsp_buf *dst, size_t dst_ld, size_t dst_col, const dsp_buf *src, size_t src_ld, size_t src_col,
                          int n_rows, size_t width) {
    (void)be;
    for (int r = 0; r < n_rows; r++)
        memcpy(dst->data + (size_t)r * dst_ld + dst_col, src->data + (size_t)r * src_ld + src_col, width * sizeof(float));
}

static void cpu_destroy(dsp_backend *be) {
    cpu_backend *c = cpu(be);
    dsp_pool_destroy(c->pool);
    free(c->wrow), free(c->scores), free(c->att_blk), free(c->rope_cs), free(c->xq);
    free(c);
}

static const dsp_backend_ops g_cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .reserve = cpu_reserve,
    .buf_create = cpu_buf_create,
    .buf_destroy = cpu_buf_destroy,
    .weight_create = cpu_weight_create,
    .weight_destroy = cpu_weight_destroy,
    .kv_create = cpu_kv_create,
    .kv_destroy = cpu_kv_destroy,
    .kv_copy_block = cpu_kv_copy_block,
    .buf_write = cpu_buf_write,
    .buf_read = cpu_buf_read,
    .begin = cpu_begin,
    .end = cpu_end,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .add_bias = cpu_add_bias,
    .norm_rope = cpu_norm_rope,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .add = cpu_add,
    .swiglu = cpu_swiglu,
    .copy_rows = cpu_copy_rows,
    .argmax = cpu_argmax,
};

dsp_status dsp_backend_cpu_create(const dsp_backend_params *p, dsp_backend **out) {
    *out = NULL;
    cpu_backend *c = calloc(1, sizeof *c);
    if (!c) return dsp_error(DSP_ERR_NOMEM, "no memory");
    c->base.ops = &g_cpu_ops;
    c->base.kind = DSP_BACKEND_CPU;
    c->ops = dsp_cpu_ops_best();
    c->q8 = !(p && p->f32_activations);
    const int kvt = p && p->kv_type ? p->kv_type : DSP_F32;
    if (kvt != DSP_F32 && kvt != DSP_F16 && kvt != DSP_BF16) {
        free(c);
        return dsp_error(DSP_ERR_UNSUPPORTED, "K/V type %s: the CPU keeps K/V in F32, F16 or BF16", dsp_dtype_name((uint32_t)kvt) ? dsp_dtype_name((uint32_t)kvt) : "unknown");
    }
    c->kv_kind = kvt == DSP_F16 ? 1 : kvt == DSP_BF16 ? 2 : 0;
    c->reserve = p && p->reserve;
    const char *rr = getenv("DSP_CPU_ATT_REREAD_BYTES");
    c->att_reread = rr ? (size_t)strtoull(rr, NULL, 10) : ATT_REREAD_BYTES;
    int nt = p && p->n_threads > 0 ? p->n_threads : dsp_physical_cores();
    dsp_status st = dsp_pool_create(nt, &c->pool);
    if (st) {
        free(c);
        return st;
    }
    c->n_threads = dsp_pool_size(c->pool);
    c->base.host_pool = c->pool;
    snprintf(c->base.desc, sizeof c->base.desc, "cpu %s, %d thread%s, %s activations, K/V %s", c->ops->name, c->n_threads,
             c->n_threads == 1 ? "" : "s", c->q8 ? "8-bit" : "f32", c->kv_kind == 1 ? "f16" : c->kv_kind == 2 ? "bf16" : "f32");
    *out = &c->base;
    return DSP_OK;
}
