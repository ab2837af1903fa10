/* backend/cuda/cuda_internal: what the CUDA backend's translation units share (C++ only).
 *
 * cuda_backend.cu  the ops table: memory, weights, the KV store, op recording, CUDA graphs
 * cuda_matmul.cu   weight repacking (pack.h) and the tensor-core matmul for any row count
 * cuda_kernels.cu  the other ops: embed, norms, RoPE, KV writes, paged attention, elementwise,
 *                  logits (argmax, top-k log-softmax)
 *
 * Every kernel computes each output element with a reduction order fixed by the reduction length
 * and the weight's shape alone: never by the number of rows, their grouping or the grid (DESIGN.md
 * §2). Nothing uses atomics. */
#ifndef DSP_BACKEND_CUDA_INTERNAL_H
#define DSP_BACKEND_CUDA_INTERNAL_H

#include <cuda_runtime.h>

extern "C" {
#include "backend/backend.h"
}
#include "backend/cuda/frag.h"

#include <stdint.h>

/* ---- programmatic dependent launch ------------------------------------------------------------- */

/* A kernel launched with dsp_cu_launch_pdl may start while the kernel before it on the stream
 * still runs (once that one has called dsp_cu_pdl_launch_dependents, or exited): it must call
 * dsp_cu_pdl_wait, which returns when the kernel before it has finished and its writes are
 * visible, before it reads that kernel's outputs or writes anything. Both are no-ops for kernels
 * launched plainly. The matmul uses it to have its first weight loads in flight while its input
 * is prepared. The decode path's other kernels (input preparation, RoPE, attention and its merge,
 * the argmax, the drafter's Markov gather) are launched the same way through dsp_cu_launch_dep and
 * wait at their first instruction: only their launch overlaps the kernel before. DSP_CUDA_PDL=0 launches everything plainly,
 * DSP_CUDA_PDL=1 only the matmul with PDL (the launches before 2026-12-05). */
__device__ __forceinline__ void dsp_cu_pdl_wait(void) { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void dsp_cu_pdl_launch_dependents(void) { asm volatile("griddepcontrol.launch_dependents;" :::); }
bool dsp_cu_pdl_enabled(void);
bool dsp_cu_pdl_all(void); /* dsp_cu_launch_dep launches with PDL */
template <typename... P, typename... A>
cudaError_t dsp_cu_launch_pdl(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, A... args) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = st;
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr, cfg.numAttrs = dsp_cu_pdl_enabled() ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

/* A kernel that calls dsp_cu_pdl_wait before any global memory access: with PDL when
 * dsp_cu_pdl_all(), else plainly. */
template <typename... P, typename... A>
cudaError_t dsp_cu_launch_dep(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, A... args) {
    if (dsp_cu_pdl_all()) return dsp_cu_launch_pdl(kernel, grid, block, smem, st, args...);
    kernel<<<grid, block, smem, st>>>(args...);
    return cudaGetLastError();
}

/* ---- matmul (cuda_matmul.cu) ------------------------------------------------------------------ */

/* A weight matrix in its packed layout (M rows of K, pack.h). */
typedef struct dsp_cu_mat {
    dsp_cu_layout L;
    int64_t M, K, n_tiles, n_groups;
    int S;             /* warps (k slices) per 16-row tile: chosen from the shape, fixed per weight */
    uint8_t *d;        /* device, dsp_cu_packed_bytes */
} dsp_cu_mat;

/* warps per tile for an M x K matrix of layout L (a function of the weight alone: batch invariance) */
int dsp_cu_mm_slices(const dsp_cu_layout *L, int64_t M, int64_t K);
/* once per process: the matmul kernels' shared-memory limits */
cudaError_t dsp_cu_mm_init(void);
/* Repack a raw GGUF matrix already on the device (raw, row_bytes per row) into m->d. */
cudaError_t dsp_cu_repack(const dsp_cu_mat *m, const uint8_t *raw, size_t row_bytes, cudaStream_t st);

/* Activations of one matmul call: n_rows x K f32 rows -> the B operand units and per-32-block sums.
 * xp holds n_rows * dsp_cu_x_units(K) 16-byte units; xsum (x_units / 8) blocks of xs_stride floats. */
typedef struct dsp_cu_xpack {
    uint4 *xp;
    float *xsum;
    int64_t xs_stride;  /* >= rows rounded up to 64 */
} dsp_cu_xpack;
/* The preparation of a matmul's input X (n_rows x K), fused with the op(s) that produced it:
 *   PREP_ADD     src += y                      (a residual add before the norm; only with PREP_NORM)
 *   PREP_NORM    X = w * (src * rsqrt(mean(src^2) + eps))   (w may be NULL)
 *   PREP_SWIGLU  X = silu(X) * u
 * then X -> xp / xsum (dsp_cu_xpack). Bit-identical to the separate kernels. PREP_NORM and
 * PREP_SWIGLU do not combine; with PREP_NORM, K <= 40,960 (cudaErrorInvalidValue past it). */
enum { DSP_CU_PREP_ADD = 1, DSP_CU_PREP_NORM = 2, DSP_CU_PREP_SWIGLU = 4 };
/* a matmul record whose input the op before it has packed already (the attention merge): no
 * preparation runs (cuda_backend.cu; never passed to dsp_cu_prep_launch) */
enum { DSP_CU_PREP_PACKED = 8 };
typedef struct dsp_cu_prep {
    int flags;
    int64_t K, units, xs_stride;
    float *X, *src;
    const float *y, *w, *u;
    float eps;
    uint4 *xp;
    float *xsum;
} dsp_cu_prep;
cudaError_t dsp_cu_prep_launch(const dsp_cu_prep *a, int n_rows, cudaStream_t st);
/* y_i = x W_i^T for n (<= 3) matrices of the same K (any types) */
cudaError_t dsp_cu_matmul(int n, const dsp_cu_mat *const *w, float *const *y, int n_rows, const dsp_cu_xpack *xb,
                          cudaStream_t st);

/* ---- other ops (cuda_kernels.cu) -------------------------------------------------------------- */

/* The batch as the kernels read it (device arrays, fixed addresses for graph replay). */
typedef struct dsp_cu_meta {
    const int32_t *tokens, *pos, *seq, *n_keys;
    const int32_t *tab_off; /* (n_seqs + 1): block table of seq s is tab[tab_off[s] .. tab_off[s + 1]) */
    const int32_t *tab;
} dsp_cu_meta;

/* The KV store: per layer n_blocks x block_tokens x kv_dim 16-bit values (f16 or bf16). */
typedef struct dsp_cu_kv {
    int n_layers, kv_dim, block_tokens;
    uint32_t n_blocks;
    bool bf16;
    uint16_t *k, *v;
} dsp_cu_kv;

/* Attention splits a row's keys into chunks whose length is a function of the row's key count
 * alone: `cmin` keys up to 32 cmin keys, 64 up to 2048 keys (many CTAs for a decode row), beyond
 * that at most 32 chunks (multiples of 64). cmin is a process constant (dsp_cu_attn_cmin): 16 made
 * Qwen3-4B's decode 12% faster than 64 on the H200 (bench/results/h200-attn-chunk.json). */
static inline __host__ __device__ int dsp_cu_attn_chunk(int n_keys, int cmin) {
    return n_keys <= 32 * cmin ? cmin : n_keys <= 2048 ? 64 : ((n_keys + 31) / 32 + 63) / 64 * 64;
}
static inline __host__ __device__ int dsp_cu_attn_chunks(int n_keys, int cmin) {
    return n_keys <= 0 ? 0 : (n_keys + dsp_cu_attn_chunk(n_keys, cmin) - 1) / dsp_cu_attn_chunk(n_keys, cmin);
}
/* The most chunks any row of up to max_keys keys has. The count is not monotonic in the key count
 * (512 keys in chunks of 16: 32 chunks; 513 in chunks of 64: 9), so not chunks(max_keys). */
static inline int dsp_cu_attn_max_chunks(int max_keys, int cmin) {
    return max_keys <= 32 * cmin ? dsp_cu_attn_chunks(max_keys, cmin) : 32;
}
/* 16, or $DSP_CUDA_ATTN_CHUNK (16, 32 or 64; read once) */
int dsp_cu_attn_cmin(void);
cudaError_t dsp_cu_kernels_init(void);

cudaError_t dsp_cu_embed(float *x, const dsp_cu_mat *table, int dim, int n, const dsp_cu_meta *m, cudaStream_t st);
cudaError_t dsp_cu_rmsnorm(float *out, const float *x, const float *w, int n_rows, int dim, float eps, const int32_t *rows,
                           cudaStream_t st);
cudaError_t dsp_cu_add_bias(float *y, const float *b, int n_rows, int dim, cudaStream_t st);
/* Per head: RMSNorm (norm may be NULL) then RoPE at the batch positions, for hq heads of q and hk
 * heads of k (either count may be 0); with v, k's heads and v's go to layer `layer` of kv. */
typedef struct dsp_cu_rope_args {
    float *q, *k;
    const float *qnorm, *knorm, *v, *inv_freq;
    int hq, hk, n, hd, rot, layer;
    bool neox;
    float eps, pos_scale, attn_factor;
    dsp_cu_kv kv;
} dsp_cu_rope_args;
#define DSP_CU_ROPE_MAX_HD 256 /* head size rope_kernel takes (cudaErrorInvalidValue past it) */
cudaError_t dsp_cu_rope(const dsp_cu_rope_args *a, const dsp_cu_meta *m, cudaStream_t st);
cudaError_t dsp_cu_kv_write(const dsp_cu_kv *kv, int layer, const float *k, const float *v, int n, const dsp_cu_meta *m,
                            cudaStream_t st);
/* part: n * n_head * max_chunks * (head_dim + 2) floats of scratch. pack (may be NULL): the
 * output rows are also packed there as the next matmul's input (n_head * head_dim columns; its
 * preparation is then skipped), bit-identical to dsp_cu_prep_launch without flags on out; needs
 * head_dim % 32 == 0 and head_dim <= DSP_CU_ATTN_PACK_MAX_HD (dsp_cu_attn_pack_ok) */
#define DSP_CU_ATTN_PACK_MAX_HD 256
static inline bool dsp_cu_attn_pack_ok(int head_dim) { return head_dim % 32 == 0 && head_dim <= DSP_CU_ATTN_PACK_MAX_HD; }
/* the attention merge packs its output for the o projection: on unless $DSP_CUDA_ATTN_PACK=0 (read once) */
bool dsp_cu_attn_pack_enabled(void);
/* rows: attn_rows_kernel (rows of one sequence share each chunk's keys; bit-identical), where
 * dsp_cu_attn_rows_ok allows it (chunks of up to 64 keys, head_dim <= 256; $DSP_CUDA_ATTN_ROWS=0: never) */
bool dsp_cu_attn_rows_ok(int n_head, int n_head_kv, int head_dim, int max_chunk_len);
cudaError_t dsp_cu_attention(float *out, const float *q, const dsp_cu_kv *kv, int layer, int n, int n_head, int n_head_kv,
                             int head_dim, float scale, int max_chunks, int max_chunk_len, bool rows, float *part, const dsp_cu_meta *m,
                             const dsp_cu_xpack *pack, cudaStream_t st);
cudaError_t dsp_cu_add(float *x, const float *y, size_t n, cudaStream_t st);
cudaError_t dsp_cu_swiglu(float *g, const float *u, size_t n, cudaStream_t st);
cudaError_t dsp_cu_copy_rows(float *dst, size_t dst_ld, size_t dst_col, const float *src, size_t src_ld, size_t src_col,
                             int n_rows, size_t width, cudaStream_t st);
cudaError_t dsp_cu_kv_copy_block(const dsp_cu_kv *kv, uint32_t dst, uint32_t src, cudaStream_t st);
/* the argmax kernels' scratch: a ticket per row (zero between launches) and DSP_CU_AM_MAX_SPLIT
 * (value bits, index) parts per row */
#define DSP_CU_AM_MAX_SPLIT 64
typedef struct dsp_cu_am {
    unsigned *count;
    int2 *part;
} dsp_cu_am;
cudaError_t dsp_cu_argmax(const float *logits, int n_rows, int n_vocab, int32_t *out, const dsp_cu_am *am, cudaStream_t st);
/* a block drafter's Markov chain, one slot of n_rows requests (cu_markov_greedy): e row i = w1 row
 * tok[src[i]]; then, after y = matmul(w2, e), logits row lrow[i] += y row i and tok[dst[i]] = its argmax */
cudaError_t dsp_cu_markov_gather(const float *w1, int rank, const int32_t *tok, const int32_t *src, float *e, int n_rows, cudaStream_t st);
cudaError_t dsp_cu_markov_add_argmax(float *logits, int n_vocab, const float *y, const int32_t *lrow, const int32_t *dst, int32_t *tok,
                                     int n_rows, const dsp_cu_am *am, cudaStream_t st);
/* per row: ids/logprobs (k each, descending), lse */
/* GB/s of a streaming read of `bytes` (median of 5), 0 on failure */
double dsp_cu_read_bandwidth(size_t bytes, int n_sm, cudaStream_t st);
cudaError_t dsp_cu_top_logprobs(const float *logits, int n_rows, int n_vocab, int k, int32_t *ids, float *lp, float *lse,
                                cudaStream_t st);

#endif
