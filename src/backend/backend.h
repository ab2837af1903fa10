/* backend/backend: the op interface every compute backend implements (DESIGN.md §3).
 *
 * An architecture's forward pass (model/forward.c, and the block drafters in spec/) is written
 * once, as a sequence of the ops below on backend-owned buffers. The CPU backend (backend/cpu/)
 * is the reference; the CUDA backend (backend/cuda/) implements the same ops on the GPU. Model
 * code never touches activation or K/V memory directly: it moves data in and out only with
 * buf_write / buf_read.
 *
 * Buffers hold f32 activations (rows of a fixed width). Weights are uploaded once (a CPU weight
 * is the mmapped tensor itself). K/V live in a backend "KV store": per layer, n_blocks blocks of
 * block_tokens rows of kv_dim values (the store's element type is the backend's choice: f32 on
 * the CPU, bf16/f16 on the GPU). Which block holds which positions of a sequence is decided on
 * the host by kv/ (block tables, reference counts, the prefix cache); the store only holds data.
 *
 * A forward is bracketed by begin(batch) ... end(). The batch (host memory, valid until end)
 * says, per row: the token, its position (RoPE), its sequence (whose block table maps positions
 * to KV slots), and how many keys it attends to. Ops record errors (e.g. an allocation on the
 * device) and end() returns the first one; an op's preconditions (shapes, row counts) are the
 * caller's duty (DSP_ASSERT). Between begin and end a backend may queue work asynchronously and
 * may capture and replay the op sequence (CUDA graphs): so the ops a forward issues must be a
 * function of the batch shape only, and host memory handed to an op must stay valid until end.
 * buf_read is the one op that returns data to the host; it completes before it returns.
 *
 * Batch invariance (DESIGN.md §2): every op computes each output element with a reduction order
 * that depends only on the reduction length, never on the number of rows, their grouping into
 * sequences, or threads. That makes a token's logits bit-identical alone, in a prefill chunk,
 * in a verify block or next to other sequences, within one backend. */
#ifndef DSP_BACKEND_BACKEND_H
#define DSP_BACKEND_BACKEND_H

#include "core/status.h"
#include "core/tensor.h"
#include "kv/kv.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct dsp_backend dsp_backend;
typedef struct dsp_buf dsp_buf;         /* f32 activations, backend memory */
typedef struct dsp_bweight dsp_bweight; /* a weight (matrix or vector) as the backend holds it */
typedef struct dsp_kv_store dsp_kv_store;

typedef enum dsp_backend_kind { DSP_BACKEND_AUTO = 0, DSP_BACKEND_CPU, DSP_BACKEND_CUDA } dsp_backend_kind;

typedef struct dsp_backend_params {
    dsp_backend_kind kind;  /* AUTO: CUDA when a GPU is present and the build has it, else CPU */
    int n_threads;          /* CPU worker threads including the caller; 0 = physical cores */
    int gpu;                /* CUDA device index */
    bool progress;          /* weight upload progress on stderr */
    int kv_type;            /* K/V element type in the store (dsp_dtype): 0 = the backend's default (CPU F32,
                             * CUDA F16); the CPU takes DSP_F32, DSP_F16 or DSP_BF16, CUDA DSP_F16 or
                             * DSP_BF16 (--kv-type) */
    bool f32_activations;   /* CPU: f32 activations for every matmul (dsp_precision F32); default: 8-bit
                             * activations for the quantized types ops.h lists */
    bool reserve;           /* CPU: make the KV stores resident at creation (dsp_mem_populate) instead of
                             * as their blocks are first written (the GPU's are device memory anyway) */
} dsp_backend_params;

/* One forward's rows (host memory, valid from begin to end). */
typedef struct dsp_be_batch {
    int n_tokens;
    const int32_t *tokens;   /* (n_tokens) ids for embed; NULL when the forward starts from buf_write */
    const int32_t *pos;      /* (n_tokens) absolute positions: RoPE angle and KV slot of the row */
    const int32_t *seq;      /* (n_tokens) index into seqs */
    const int32_t *n_keys;   /* (n_tokens) the row attends to KV positions [0, n_keys) of its sequence
                              * (causal rows: pos + 1; a non-causal drafter block: start + block) */
    int n_seqs;
    const dsp_kv_seq *const *seqs; /* (n_seqs) block tables covering every position written or read */
} dsp_be_batch;

/* RoPE for one forward: angle(row, i) = pos(row) / pos_scale * inv_freq[i], i < rot_dim / 2;
 * the rotation uses (cos, sin) * attn_factor. neox: pairs (i, i + rot_dim/2), else (2i, 2i+1). */
typedef struct dsp_rope {
    int rot_dim;
    bool neox;
    float pos_scale;         /* linear position scaling; 1 = none */
    float attn_factor;       /* 1 = none (YaRN's mscale) */
    const dsp_buf *inv_freq; /* (rot_dim / 2), built by the caller once */
} dsp_rope;

/* What one model's forwards need at most (for dsp_backend_ops.reserve). */
typedef struct dsp_be_limits {
    int max_tokens;          /* rows in one forward */
    int max_width;           /* widest matmul input (n_embd, n_ff, n_head * head_dim) */
    int max_group;           /* query heads per KV head */
    uint32_t max_keys;       /* KV positions one row attends to (the context length) */
    int max_rot_dim;         /* RoPE dimensions */
} dsp_be_limits;

typedef struct dsp_backend_ops {
    const char *name;        /* "cpu", "cuda" */
    void (*destroy)(dsp_backend *be);

    /* ---- memory (outside a forward) ---- */
    /* Size per-forward scratch for a model that will run here (each forward that shares the backend
     * calls it once, at creation; the backend keeps the maximum of every field). */
    dsp_status (*reserve)(dsp_backend *be, const dsp_be_limits *lim);
    dsp_status (*buf_create)(dsp_backend *be, size_t n_floats, dsp_buf **out);
    void (*buf_destroy)(dsp_backend *be, dsp_buf *b);
    /* A weight: the backend keeps what it needs (the CPU points into t->data; CUDA uploads, maybe
     * repacked). Vectors (norms, biases) are weights too. DSP_ERR_UNSUPPORTED names the tensor
     * if its type cannot run here. */
    dsp_status (*weight_create)(dsp_backend *be, const dsp_tensor *t, dsp_bweight **out);
    void (*weight_destroy)(dsp_backend *be, dsp_bweight *w);
    dsp_status (*kv_create)(dsp_backend *be, int n_layers, int kv_dim, int block_tokens, uint32_t n_blocks, dsp_kv_store **out);
    void (*kv_destroy)(dsp_backend *be, dsp_kv_store *kv);
    /* copy one block (every layer) for copy-on-write */
    dsp_status (*kv_copy_block)(dsp_backend *be, dsp_kv_store *kv, uint32_t dst, uint32_t src);

    /* ---- transfers (inside or outside a forward) ---- */
    void (*buf_write)(dsp_backend *be, dsp_buf *b, size_t off, const float *src, size_t n);
    /* completes (synchronises) before returning */
    dsp_status (*buf_read)(dsp_backend *be, const dsp_buf *b, size_t off, float *dst, size_t n);

    /* ---- a forward ---- */
    dsp_status (*begin)(dsp_backend *be, const dsp_be_batch *batch);
    dsp_status (*end)(dsp_backend *be);

    /* x[r, :] = embedding row of batch token r (dequantized), r < n_tokens */
    void (*embed)(dsp_backend *be, dsp_buf *x, const dsp_bweight *table, int dim);
    /* out[r] = w * x[rows ? rows[r] : r] / sqrt(mean(x^2) + eps), r < n_rows; w may be NULL; out may
     * be x when rows is NULL */
    void (*rmsnorm)(dsp_backend *be, dsp_buf *out, const dsp_buf *x, const dsp_bweight *w, int n_rows, int dim, float eps,
                    const int32_t *rows);
    /* y_m[r, j] = sum_k x[r, k] * W_m[j, k] for the n (<= 3) matrices, same input width, r < n_rows */
    void (*matmul)(dsp_backend *be, int n, const dsp_bweight *const *w, dsp_buf *const *y, const dsp_buf *x, int n_rows);
    /* y[r, j] += b[j] */
    void (*add_bias)(dsp_backend *be, dsp_buf *y, const dsp_bweight *b, int n_rows, int dim);
    /* x: (n_tokens, n_heads * head_dim): per head, optional RMSNorm with w (head_dim), then RoPE at
     * the batch positions */
    void (*norm_rope)(dsp_backend *be, dsp_buf *x, const dsp_bweight *norm, float eps, int n_heads, int head_dim,
                      const dsp_rope *rope);
    /* K/V rows (n_tokens, kv_dim) -> the store at (seq[r], pos[r]) of layer */
    void (*kv_write)(dsp_backend *be, dsp_kv_store *kv, int layer, const dsp_buf *k, const dsp_buf *v);
    /* out[r] = softmax(q[r] K^T * scale) V over KV positions [0, n_keys[r]) of seq[r], GQA: query
     * head h uses KV head h / (n_head / n_head_kv). q, out: (n_tokens, n_head * head_dim). */
    void (*attention)(dsp_backend *be, dsp_buf *out, const dsp_buf *q, const dsp_kv_store *kv, int layer, int n_head,
                      int n_head_kv, int head_dim, float scale);
    /* x[i] += y[i], i < n */
    void (*add)(dsp_backend *be, dsp_buf *x, const dsp_buf *y, size_t n);
    /* gate[i] = silu(gate[i]) * up[i], i < n */
    void (*swiglu)(dsp_backend *be, dsp_buf *gate, const dsp_buf *up, size_t n);
    /* dst[r * dst_ld + dst_col + c] = src[r * src_ld + src_col + c], r < n_rows, c < width */
    void (*copy_rows)(dsp_backend *be, dsp_buf *dst, size_t dst_ld, size_t dst_col, const dsp_buf *src, size_t src_ld,
                      size_t src_col, int n_rows, size_t width);

    /* ---- optional (NULL where a backend lacks them) ---- */
    /* Before uploading a model: can these n tensors (plus extra_bytes of KV cache and scratch) run
     * here and fit? DSP_ERR_UNSUPPORTED names the first tensor whose type cannot run here,
     * DSP_ERR_NOMEM says what the model needs and what the device has free. Allocates nothing. */
    dsp_status (*check_weights)(dsp_backend *be, const dsp_tensor *const *t, int n, uint64_t extra_bytes);
    /* Logits processing on the device, so greedy decoding need not download vocabulary rows. Both
     * read rows [0, n_rows) of n_vocab logits, may be called inside a forward (after the matmul that
     * writes them: what is recorded runs first) or after end(), and complete before returning.
     * argmax: out[r] = the sampler's greedy token of row r (dsp_sample_argmax: NaN read as -inf,
     * +inf as FLT_MAX, the first index of the maximum; -1 if no value is finite). top_logprobs: the k (<= 64) largest
     * logits of each row, descending (ties: lower id first), as ids[r * k + j] and their
     * log-softmax values lp[r * k + j]; lse[r] (may be NULL) = the row's log-sum-exp. */
    dsp_status (*argmax)(dsp_backend *be, const dsp_buf *logits, int n_rows, int n_vocab, int32_t *out);
    dsp_status (*top_logprobs)(dsp_backend *be, const dsp_buf *logits, int n_rows, int n_vocab, int k, int32_t *ids,
                               float *lp, float *lse);
    /* The greedy chain of a block drafter's Markov head on the device, so that a drafter round
     * downloads its tokens, not n_draft vocabulary rows (spec/block.c does the same on the host
     * without it). After end(), over requests j < n_reqs and slots k < n[j] in order of k, with
     * o_j = n[0] + ... + n[j-1] and t = k ? out[o_j + k - 1] : anchor[j]:
     *     row row0[j] + k of logits += matmul(w2, row t of w1)   (the product as matmul computes it)
     *     out[o_j + k] = argmax of that row                       (as the argmax op)
     * w1: n_vocab rows of `rank` floats; e (>= n_reqs x rank) and y (>= n_reqs x n_vocab) are
     * scratch. Completes before returning; the logits keep the biased rows. */
    dsp_status (*markov_greedy)(dsp_backend *be, dsp_buf *logits, int n_vocab, const dsp_buf *w1, int rank, const dsp_bweight *w2,
                                dsp_buf *e, dsp_buf *y, int n_reqs, const int *row0, const int *n, const int32_t *anchor, int32_t *out);
    /* Measured read bandwidth of the device's memory in GB/s: a streaming read of `bytes` (median of
     * 5 runs), for benchmarks' roofline figures; 0 if it could not be measured. */
    double (*read_bandwidth)(dsp_backend *be, size_t bytes);
} dsp_backend_ops;

struct dsp_backend {
    const dsp_backend_ops *ops;
    dsp_backend_kind kind;
    char desc[128];          /* "cpu avx512, 2 threads", "cuda NVIDIA H200 (sm_90)" */
    /* forwards whose run included one-time work for their shape (CUDA: a graph captured and
     * instantiated), counted by the backend: their time is not what the shape costs, so the
     * engine's cost calibration leaves such rounds out */
    unsigned long n_setup;
    /* the backend's CPU worker pool (the CPU backend's compute threads, idle between forwards), for
     * host work the engine spreads over them (verification and sampling); NULL: none (the engine
     * makes its own) */
    struct dsp_pool *host_pool;
};

/* What AUTO means here: $DSPARK_DEVICE (cpu or cuda) when set, else CUDA when the build has it and a
 * GPU can run its kernels, else the CPU. */
dsp_backend_kind dsp_backend_auto_kind(void);

/* Create the backend params.kind asks for (AUTO: see dsp_backend_auto_kind). */
dsp_status dsp_backend_create(const dsp_backend_params *p, dsp_backend **out);
void dsp_backend_destroy(dsp_backend *be);
const char *dsp_backend_kind_name(dsp_backend_kind k); /* "auto", "cpu", "cuda" */
/* true if this build has the CUDA backend and a usable GPU is present */
bool dsp_backend_cuda_available(void);

/* The backends (backend/cpu/cpu_backend.c, backend/cuda/). */
dsp_status dsp_backend_cpu_create(const dsp_backend_params *p, dsp_backend **out);
dsp_status dsp_backend_cuda_create(const dsp_backend_params *p, dsp_backend **out);

#endif
