/* backend/cuda/cuda_kernels: every op but the matmul (see cuda_internal.h).
 *
 * Reductions (RMSNorm, attention scores and sums, log-sum-exp) have one fixed shape per reduction
 * length: a thread sums a fixed stride of elements in index order, then a fixed butterfly or tree
 * combines the threads. Each row is handled by its own CTA (or warp) and never looks at other rows,
 * so a row's result cannot depend on the batch.
 *
 * Paged attention splits a row's keys into chunks whose length depends on the row's key count
 * alone (dsp_cu_attn_chunk); a CTA per (row, KV head, chunk) computes the chunk's softmax partials
 * for the query heads sharing that KV head (GQA), and a second kernel merges the chunks in order.
 * Prefill batches (long runs of rows of one sequence) take attn_rows_kernel instead, which computes
 * the same partials for 16 rows per CTA from keys staged once (bit-identical; test_cuda_ops). */
#include "backend/cuda/cuda_internal.h"

#include <cooperative_groups.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

namespace cg = cooperative_groups;

namespace {

constexpr int MAX_GROUP = 16; /* query heads per KV head */
constexpr size_t ATT_SMEM_MAX = 200 * 1024;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024) in a fixed order: lanes by butterfly,
 * then warps 0, 1, ... in order. `sh` holds 32 floats. Every thread gets the result. */
__device__ float block_sum(float v, float *sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* sh may be in use by a previous call */
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float s = sh[0];
    for (int w = 1; w < nw; w++) s += sh[w];
    return s;
}

__device__ __forceinline__ float kv_val(uint16_t bits, bool bf16) { return bf16 ? dsp_cu_bf16(bits) : dsp_cu_f16(bits); }
__device__ __forceinline__ uint16_t kv_store(float v, bool bf16) {
    return bf16 ? dsp_cu_to_bf16(v) : __half_as_ushort(__float2half_rn(v));
}

__device__ __forceinline__ int64_t kv_slot(const dsp_cu_meta &m, int bt, int row, int pos) {
    const int s = m.seq[row];
    return (int64_t)m.tab[m.tab_off[s] + pos / bt] * bt + pos % bt;
}

/* ---- embed ---------------------------------------------------------------------------------- */

__global__ void embed_kernel(float *x, dsp_cu_layout L, const uint8_t *w, int64_t n_groups, int dim, int n, dsp_cu_meta m) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n * dim) return;
    const int r = (int)(i / dim), k = (int)(i % dim);
    x[i] = dsp_cu_packed_elem(&L, w, n_groups, m.tokens[r], k);
}

/* A thread takes PB of its elements at a time: their loads are issued together (a loop of one load
 * per iteration waits a whole L2 round trip per element: ncu put a 2,560 to 9,728-wide decode row's
 * preparation at 8-24 us on an H100 so). Sums keep their element order. */
constexpr int PB = 8;

/* ---- RMSNorm and the matmul's input preparation ---------------------------------------------- */

/* A row is taken in chunks of COL_ELEMS columns (whole 32-blocks and 4-element units), a CTA of
 * COL_THREADS threads per chunk, each thread on COL_PER columns (loads issued together, as PB). */
constexpr int COL_THREADS = 256, COL_PER = 4, COL_ELEMS = COL_THREADS * COL_PER;
static_assert(COL_ELEMS % 256 == 0, "a chunk covers whole 32-blocks and whole 4-element units");

/* The one order of a row's sum of squares, in every kernel that normalises a row (rmsnorm_kernel,
 * prep_norm_kernel): in chunk c, thread t sums its columns c * COL_ELEMS + t + j * COL_THREADS
 * (j = 0, 1, ...) with fmaf, block_sum gives the chunk's sum, and the chunks' sums are added in
 * chunk order from 0.0f. So the fused preparation equals rmsnorm_kernel bit for bit, and the order
 * depends on the row's length alone. */
__device__ __forceinline__ float chunk_ss(const float (&v)[COL_PER], float *sh) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < COL_PER; j++) ss = fmaf(v[j], v[j], ss); /* zeros past the row add nothing */
    return block_sum(ss, sh);
}
__device__ __forceinline__ float rms_scale(float ss, int64_t dim, float eps) { return 1.0f / sqrtf(ss / (float)dim + eps); }
__device__ __forceinline__ void load_chunk(const float *x, int64_t c0, int64_t dim, float (&v)[COL_PER]) {
#pragma unroll
    for (int j = 0; j < COL_PER; j++) {
        const int64_t i = c0 + threadIdx.x + j * COL_THREADS;
        v[j] = i < dim ? x[i] : 0.0f;
    }
}

__global__ void __launch_bounds__(COL_THREADS) rmsnorm_kernel(float *out, const float *x, const float *w, int dim, float eps,
                                                              const int32_t *rows) {
    __shared__ float sh[32];
    const int r = blockIdx.x;
    const float *xr = x + (int64_t)(rows ? rows[r] : r) * dim;
    float tot = 0.0f;
    for (int64_t c0 = 0; c0 < dim; c0 += COL_ELEMS) {
        float v[COL_PER];
        load_chunk(xr, c0, dim, v);
        tot += chunk_ss(v, sh);
    }
    const float rs = rms_scale(tot, dim, eps);
    float *o = out + (int64_t)r * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = w ? w[i] * (xr[i] * rs) : xr[i] * rs;
}

/* SwiGLU's element: every kernel that applies it (swiglu_kernel and the preparation) calls this,
 * so fusing it cannot change a bit */
__device__ __forceinline__ float silu_mul(float x, float u) { return x / (1.0f + expf(-x)) * u; }

/* The packing of a staged chunk S (COL_ELEMS floats, zeros past the row) into the matmul's B
 * operand: the chunk's units from unit u0 of row r (at most COL_ELEMS / 4, fewer at the row's end),
 * and their 32-blocks' sums (dsp_cu_xpack), a unit per thread and a block per warp */
__device__ __forceinline__ void pack_chunk(const float *S, const dsp_cu_prep &a, int64_t r, int64_t u0) {
    const int64_t nu = a.units - u0 < COL_ELEMS / 4 ? a.units - u0 : COL_ELEMS / 4;
    for (int64_t t = threadIdx.x; t < nu; t += blockDim.x) {
        uint32_t v[4];
        dsp_cu_x_unit(S, COL_ELEMS, t, v);
        a.xp[r * a.units + u0 + t] = make_uint4(v[0], v[1], v[2], v[3]);
    }
    const int lane = threadIdx.x & 31;
    for (int64_t b = threadIdx.x >> 5; b < nu / 8; b += blockDim.x >> 5) {
        const float s = warp_sum(S[32 * b + lane]);
        if (lane == 0) a.xsum[(u0 / 8 + b) * a.xs_stride + r] = s;
    }
}

/* The matmul's input preparation (dsp_cu_prep), fused with the ops that produce its input
 * (DSP_CU_PREP_*): src += y; X = RMSNorm(src) * w; or X = silu(X) * u; then X packed. Each step
 * uses the same float operations in the same order as its own kernel (add_kernel, rmsnorm_kernel,
 * swiglu_kernel): bit-identical to running them apart. A decode row is latency, not bandwidth:
 * one CTA walking a 2,560 to 9,728-wide row spent 5-24 us on an H100 between two matmuls, so a
 * row is spread over CTAs of one chunk each. */

/* Without a norm nothing spans the row: a CTA per (row, chunk). */
__global__ void __launch_bounds__(COL_THREADS) prep_cols_kernel(dsp_cu_prep a) {
    __shared__ float S[COL_ELEMS];
    dsp_cu_pdl_launch_dependents(); /* the matmul's CTAs may start loading weights (they wait for us) */
    dsp_cu_pdl_wait();
    const int64_t r = blockIdx.x, K = a.K, c0 = (int64_t)blockIdx.y * COL_ELEMS;
    float *X = a.X + r * K;
    const bool swiglu = a.flags & DSP_CU_PREP_SWIGLU;
    float v[COL_PER], g[COL_PER];
    load_chunk(X, c0, K, v);
    if (swiglu) load_chunk(a.u + r * K, c0, K, g);
#pragma unroll
    for (int j = 0; j < COL_PER; j++) {
        const int64_t l = threadIdx.x + j * COL_THREADS, i = c0 + l;
        float x = v[j];
        if (swiglu && i < K) {
            x = silu_mul(x, g[j]);
            X[i] = x;
        }
        S[l] = i < K ? x : 0.0f;
    }
    __syncthreads();
    pack_chunk(S, a, r, c0 / 4);
}

/* With a norm, the chunks' sums of squares cross CTAs: a thread-block cluster per row (up to
 * NORM_CLUSTER CTAs; a CTA takes chunks q, q + nc, ...), each CTA's chunk sums read by all through
 * distributed shared memory and added in chunk order (chunk_ss). Each CTA adds y into src only on
 * its own chunks, so nothing reads a column another CTA writes. */
constexpr int NORM_CLUSTER = 8, NORM_MAX_PER = 5, NORM_MAX_CHUNKS = NORM_CLUSTER * NORM_MAX_PER; /* K <= 40,960 */

__device__ __forceinline__ void cluster_arrive(void) { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait(void) { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

__global__ void __launch_bounds__(COL_THREADS) prep_norm_kernel(dsp_cu_prep a) {
    extern __shared__ float S[]; /* this CTA's chunks, COL_ELEMS each */
    __shared__ float sh[32], part[NORM_MAX_PER], all[NORM_MAX_CHUNKS];
    dsp_cu_pdl_launch_dependents();
    cg::cluster_group cl = cg::this_cluster();
    const unsigned q = cl.block_rank(), nc = cl.num_blocks();
    const int64_t r = blockIdx.x / nc, K = a.K, nch = (K + COL_ELEMS - 1) / COL_ELEMS;
    float w0[COL_PER]; /* the norm weight of the first chunk (q < nch), which no kernel writes: before the wait */
    if (a.w) load_chunk(a.w, q * COL_ELEMS, K, w0);
    dsp_cu_pdl_wait();
    float *src = a.src + r * K, *X = a.X + r * K;
    const bool add = a.flags & DSP_CU_PREP_ADD;
    int n = 0;
    for (int64_t c = q; c < nch; c += nc, n++) {
        float v[COL_PER], d[COL_PER];
        load_chunk(src, c * COL_ELEMS, K, v);
        if (add) load_chunk(a.y + r * K, c * COL_ELEMS, K, d);
#pragma unroll
        for (int j = 0; j < COL_PER; j++) {
            const int64_t l = threadIdx.x + j * COL_THREADS, i = c * COL_ELEMS + l;
            if (add && i < K) src[i] = v[j] = v[j] + d[j];
            S[n * COL_ELEMS + l] = v[j];
        }
        const float s = chunk_ss(v, sh);
        if (threadIdx.x == 0) part[n] = s;
    }
    cl.sync(); /* every chunk's sum is written */
    if (threadIdx.x < nch) all[threadIdx.x] = *cl.map_shared_rank(part + threadIdx.x / nc, threadIdx.x % nc);
    cluster_arrive(); /* done with the other CTAs' shared memory (they wait for this before exiting) */
    __syncthreads();
    float tot = 0.0f;
    for (int c = 0; c < nch; c++) tot += all[c];
    const float rs = rms_scale(tot, K, a.eps);
    n = 0;
    for (int64_t c = q; c < nch; c += nc, n++)
#pragma unroll
        for (int j = 0; j < COL_PER; j++) {
            const int64_t l = threadIdx.x + j * COL_THREADS, i = c * COL_ELEMS + l;
            if (i >= K) break;
            const float x = S[n * COL_ELEMS + l];
            S[n * COL_ELEMS + l] = X[i] = a.w ? (n ? a.w[i] : w0[j]) * (x * rs) : x * rs;
        }
    __syncthreads();
    n = 0;
    for (int64_t c = q; c < nch; c += nc, n++) pack_chunk(S + n * COL_ELEMS, a, r, c * COL_ELEMS / 4);
    cluster_wait();
}

__global__ void add_bias_kernel(float *y, const float *b, int n_rows, int dim) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (int64_t)n_rows * dim) y[i] += b[i % dim];
}

/* ---- per-head RMSNorm + RoPE: one warp per (row, head) -------------------------------------- */

/* one warp per (row, head) of q (heads [0, hq)) and of k (heads [hq, hq + hk)): RMSNorm with the
 * tensor's norm weight (if any), then RoPE at the row's position; with v, k's heads also go to the
 * KV cache with the row's v heads (norm_rope q, norm_rope k and kv_write fused: the same values).
 * A lane holds elements lane, lane + 32, ... (hd <= DSP_CU_ROPE_MAX_HD). Every load is issued before the
 * first use (the norm weight and the frequencies, which no kernel writes, even before waiting for
 * the previous kernel), so the warp waits about one memory round trip, not four. */
static_assert(DSP_CU_ROPE_MAX_HD == 32 * PB, "a lane holds PB elements of a head");

__global__ void rope_kernel(dsp_cu_rope_args a, dsp_cu_meta m) {
    extern __shared__ float hbuf[]; /* [warps][hd] */
    dsp_cu_pdl_launch_dependents();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, H = a.hq + a.hk, hd = a.hd, half = a.rot / 2;
    const int64_t item = (int64_t)blockIdx.x * (blockDim.x >> 5) + warp;
    if (item >= (int64_t)a.n * H) return;
    const int row = (int)(item / H), h = (int)(item % H);
    const bool is_k = h >= a.hq, kv = is_k && a.v;
    const int hh = is_k ? h - a.hq : h;
    float *xh = is_k ? a.k + ((int64_t)row * a.hk + hh) * hd : a.q + ((int64_t)row * a.hq + hh) * hd, *b = hbuf + warp * hd;
    const float *norm = is_k ? a.knorm : a.qnorm, *vh = kv ? a.v + (int64_t)row * a.kv.kv_dim + (int64_t)hh * hd : nullptr;
    float w[PB], f[PB / 2], x[PB], v[PB];
#pragma unroll
    for (int j = 0; j < PB; j++) w[j] = norm && lane + 32 * j < hd ? norm[lane + 32 * j] : 0.0f;
#pragma unroll
    for (int j = 0; j < PB / 2; j++) f[j] = lane + 32 * j < half ? a.inv_freq[lane + 32 * j] : 0.0f;
    dsp_cu_pdl_wait();
#pragma unroll
    for (int j = 0; j < PB; j++) {
        x[j] = lane + 32 * j < hd ? xh[lane + 32 * j] : 0.0f;
        v[j] = kv && lane + 32 * j < hd ? vh[lane + 32 * j] : 0.0f;
    }
    const int pos = m.pos[row];
    /* the squares summed in the order i = lane, lane + 32, ..., then the butterfly */
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < PB; j++) {
        if (lane + 32 * j >= hd) break;
        b[lane + 32 * j] = x[j];
        ss = fmaf(x[j], x[j], ss);
    }
    if (norm) {
        const float rs = 1.0f / sqrtf(warp_sum(ss) / (float)hd + a.eps);
#pragma unroll
        for (int j = 0; j < PB; j++)
            if (lane + 32 * j < hd) b[lane + 32 * j] = w[j] * (b[lane + 32 * j] * rs);
    }
    __syncwarp();
    const float p = (float)pos / a.pos_scale;
#pragma unroll
    for (int j = 0; j < PB / 2; j++) {
        const int i = lane + 32 * j;
        if (i >= half) break;
        const int i0 = a.neox ? i : 2 * i, i1 = a.neox ? i + half : 2 * i + 1;
        float s, c;
        sincosf(p * f[j], &s, &c);
        c *= a.attn_factor, s *= a.attn_factor;
        const float x0 = b[i0], x1 = b[i1];
        b[i0] = x0 * c - x1 * s;
        b[i1] = x1 * c + x0 * s;
    }
    __syncwarp();
    for (int i = lane; i < hd; i += 32) xh[i] = b[i];
    if (kv) {
        const dsp_cu_kv &c = a.kv;
        const int64_t at = ((int64_t)a.layer * c.n_blocks * c.block_tokens + kv_slot(m, c.block_tokens, row, pos)) * c.kv_dim +
                           (int64_t)hh * hd;
#pragma unroll
        for (int j = 0; j < PB; j++)
            if (lane + 32 * j < hd) {
                c.k[at + lane + 32 * j] = kv_store(b[lane + 32 * j], c.bf16);
                c.v[at + lane + 32 * j] = kv_store(v[j], c.bf16);
            }
    }
}

/* ---- KV write -------------------------------------------------------------------------------- */

__global__ void kv_write_kernel(dsp_cu_kv kv, int layer, const float *k, const float *v, int n, dsp_cu_meta m) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n * kv.kv_dim) return;
    const int row = (int)(i / kv.kv_dim), e = (int)(i % kv.kv_dim);
    const int64_t slot = kv_slot(m, kv.block_tokens, row, m.pos[row]);
    const int64_t at = ((int64_t)layer * kv.n_blocks * kv.block_tokens + slot) * kv.kv_dim + e;
    kv.k[at] = kv_store(k[i], kv.bf16);
    kv.v[at] = kv_store(v[i], kv.bf16);
}

__global__ void kv_copy_kernel(dsp_cu_kv kv, uint32_t dst, uint32_t src) {
    const int64_t per = (int64_t)kv.block_tokens * kv.kv_dim;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= per * kv.n_layers) return;
    const int64_t layer = i / per, e = i % per;
    const int64_t lb = layer * kv.n_blocks * per;
    kv.k[lb + dst * per + e] = kv.k[lb + src * per + e];
    kv.v[lb + dst * per + e] = kv.v[lb + src * per + e];
}

/* ---- attention ------------------------------------------------------------------------------- */

struct attn_args {
    const float *q;
    dsp_cu_kv kv;
    int layer, n_head, n_head_kv, hd, max_chunks, cmin, vearly, rows_mode;
    float scale;
    float *part; /* [row][head][chunk] of (hd + 2): o[hd], m, l */
    dsp_cu_meta m;
};

/* One CTA of ATT_WARPS warps per (row, KV head) x chunk, for the GM >= G query heads that share the
 * KV head. Warp w owns the chunk's keys w, w + ATT_WARPS, ...; lane l owns the dimensions
 * 4l .. 4l + 3 of each 128-wide slice of the head (one 8-byte load of a K or V row per slice).
 *   scores  per key and head: the lane's products in dimension order, then a butterfly;
 *   softmax a warp per head: max, exp, sum (butterfly) over the chunk;
 *   output  each warp sums p * v over its own keys in order, then the ATT_WARPS partials are
 *           added in warp order.
 * Every order is fixed by the chunk's length, which depends on the row's key count alone. The
 * loads of ATT_KB keys are issued before their first use. Dynamic shared memory: q [G][hd],
 * scores [G][chunk], output partials [ATT_WARPS][G][hd], slots [chunk]. */
constexpr int ATT_WARPS = 4, ATT_KB = 4;
constexpr int ATT_MAX_CHUNKS = 32; /* chunks of a row at most (dsp_cu_attn_max_chunks) */

__device__ __forceinline__ void kv_load4(const uint16_t *p, float f[4], bool bf16) {
    const uint2 r = *(const uint2 *)p;
    f[0] = kv_val((uint16_t)r.x, bf16), f[1] = kv_val((uint16_t)(r.x >> 16), bf16);
    f[2] = kv_val((uint16_t)r.y, bf16), f[3] = kv_val((uint16_t)(r.y >> 16), bf16);
}

/* A chunk's softmax for one head, by one warp (both attention kernels: the same chain): the max of
 * the n scores, then p = expf(s - max) in place and their sum, lane l adding keys l, l + 32, ... in
 * order before warp_sum; lane 0 writes (max, sum) to ml[0], ml[1]. */
__device__ __forceinline__ void chunk_softmax(float *sp, int n, int lane, float *ml) {
    float mx = -INFINITY;
    for (int j = lane; j < n; j += 32) mx = fmaxf(mx, sp[j]);
    mx = warp_max(mx);
    float l = 0.0f;
    for (int j = lane; j < n; j += 32) {
        const float p = expf(sp[j] - mx);
        sp[j] = p;
        l += p;
    }
    l = warp_sum(l);
    if (lane == 0) ml[0] = mx, ml[1] = l;
}

template <int GM>
__global__ void __launch_bounds__(ATT_WARPS * 32) attn_chunk_kernel(attn_args a) {
    extern __shared__ float smem[];
    dsp_cu_pdl_launch_dependents();
    /* the batch description (key counts, block tables) is uploaded before the forward's first
     * kernel and no kernel writes it: the chunk and its key slots are found before the wait */
    const int row = blockIdx.x / a.n_head_kv, kvh = blockIdx.x % a.n_head_kv, c = blockIdx.y;
    const int nk = a.m.n_keys[row], CH = dsp_cu_attn_chunk(nk, a.cmin), nch = (nk + CH - 1) / CH;
    if (c >= nch) return;
    const int G = a.n_head / a.n_head_kv, hd = a.hd, k0 = c * CH, n = min(nk - k0, CH);
    const int kv_dim = a.kv.kv_dim, bt = a.kv.block_tokens, ns = (hd + 127) / 128;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *qs = smem, *sc = qs + G * hd, *po = sc + G * CH;
    int64_t *slot = (int64_t *)(po + ATT_WARPS * G * hd + (G * hd + G * CH + ATT_WARPS * G * hd) % 2); /* 8-byte aligned */
    const int64_t lbase = (int64_t)a.layer * a.kv.n_blocks * bt;
    for (int j = threadIdx.x; j < n; j += blockDim.x) slot[j] = (lbase + kv_slot(a.m, bt, row, k0 + j)) * kv_dim + (int64_t)kvh * hd;
    dsp_cu_pdl_wait();
    const float *qr = a.q + (int64_t)row * a.n_head * hd + (int64_t)kvh * G * hd;
    for (int i0 = threadIdx.x; i0 < G * hd; i0 += PB * blockDim.x) { /* PB loads at once */
        float v[PB];
#pragma unroll
        for (int j = 0; j < PB; j++) v[j] = i0 + j * (int)blockDim.x < G * hd ? qr[i0 + j * blockDim.x] : 0.0f;
#pragma unroll
        for (int j = 0; j < PB; j++)
            if (i0 + j * (int)blockDim.x < G * hd) qs[i0 + j * blockDim.x] = v[j];
    }
    __syncthreads();

    /* A chunk of at most ATT_WARPS * ATT_KB keys and one slice (decode and verify rows up to 512
     * keys): each warp's V rows are loaded with its K rows, so the output needs no load after the
     * softmax (the same values, the same operations; a.vearly = 0 loads them there instead) */
    const bool early = a.vearly && n <= ATT_WARPS * ATT_KB && ns == 1;
    float vpre[ATT_KB][4];
    for (int j0 = warp; j0 < n; j0 += ATT_WARPS * ATT_KB) {
        float acc[ATT_KB][GM];
#pragma unroll
        for (int kb = 0; kb < ATT_KB; kb++)
#pragma unroll
            for (int g = 0; g < GM; g++) acc[kb][g] = 0.0f;
        for (int sl = 0; sl < ns; sl++) {
            const int d = 128 * sl + 4 * lane;
            if (d >= hd) break;
            float kf[ATT_KB][4];
#pragma unroll
            for (int kb = 0; kb < ATT_KB; kb++) {
                const int j = j0 + ATT_WARPS * kb;
                if (j < n) kv_load4(a.kv.k + slot[j] + d, kf[kb], a.kv.bf16);
                else kf[kb][0] = kf[kb][1] = kf[kb][2] = kf[kb][3] = 0.0f;
            }
            if (early) {
#pragma unroll
                for (int kb = 0; kb < ATT_KB; kb++) {
                    const int j = j0 + ATT_WARPS * kb;
                    if (j < n) kv_load4(a.kv.v + slot[j] + d, vpre[kb], a.kv.bf16);
                }
            }
#pragma unroll
            for (int g = 0; g < GM; g++) {
                if (g >= G) break;
                const float4 q4 = *(const float4 *)(qs + g * hd + d);
#pragma unroll
                for (int kb = 0; kb < ATT_KB; kb++) {
                    acc[kb][g] = fmaf(q4.x, kf[kb][0], acc[kb][g]);
                    acc[kb][g] = fmaf(q4.y, kf[kb][1], acc[kb][g]);
                    acc[kb][g] = fmaf(q4.z, kf[kb][2], acc[kb][g]);
                    acc[kb][g] = fmaf(q4.w, kf[kb][3], acc[kb][g]);
                }
            }
        }
#pragma unroll
        for (int kb = 0; kb < ATT_KB; kb++) {
            const int j = j0 + ATT_WARPS * kb;
#pragma unroll
            for (int g = 0; g < GM; g++) {
                if (g >= G) break;
                const float v = warp_sum(acc[kb][g]);
                if (lane == 0 && j < n) sc[g * CH + j] = v * a.scale;
            }
        }
    }
    __syncthreads();
    /* per head: max, exp, sum (warp per head) */
    for (int g = warp; g < G; g += ATT_WARPS)
        chunk_softmax(sc + g * CH, n, lane, a.part + (((int64_t)row * a.n_head + kvh * G + g) * a.max_chunks + c) * (hd + 2) + hd);
    __syncthreads();
    /* each warp: o[g][d] = sum over its keys (in order) of p[g][j] v[j][d] */
    for (int sl = 0; sl < ns; sl++) {
        const int d = 128 * sl + 4 * lane;
        if (d >= hd) break;
        float o[GM][4];
#pragma unroll
        for (int g = 0; g < GM; g++) o[g][0] = o[g][1] = o[g][2] = o[g][3] = 0.0f;
        for (int j0 = warp; j0 < n; j0 += ATT_WARPS * ATT_KB) {
            float vf[ATT_KB][4];
#pragma unroll
            for (int kb = 0; kb < ATT_KB; kb++) {
                const int j = j0 + ATT_WARPS * kb;
                if (early) {
#pragma unroll
                    for (int e = 0; e < 4; e++) vf[kb][e] = vpre[kb][e];
                } else if (j < n) {
                    kv_load4(a.kv.v + slot[j] + d, vf[kb], a.kv.bf16);
                }
            }
#pragma unroll
            for (int kb = 0; kb < ATT_KB; kb++) {
                const int j = j0 + ATT_WARPS * kb;
                if (j >= n) break;
#pragma unroll
                for (int g = 0; g < GM; g++) {
                    if (g >= G) break;
                    const float p = sc[g * CH + j];
#pragma unroll
                    for (int e = 0; e < 4; e++) o[g][e] = fmaf(p, vf[kb][e], o[g][e]);
                }
            }
        }
#pragma unroll
        for (int g = 0; g < GM; g++) {
            if (g >= G) break;
            *(float4 *)(po + (warp * G + g) * hd + d) = make_float4(o[g][0], o[g][1], o[g][2], o[g][3]);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * hd; i += blockDim.x) {
        float v = po[i];
        for (int w = 1; w < ATT_WARPS; w++) v += po[w * G * hd + i];
        const int g = i / hd, d = i % hd;
        a.part[(((int64_t)row * a.n_head + kvh * G + g) * a.max_chunks + c) * (hd + 2) + d] = v;
    }
}

/* Many rows of a few sequences (prefill): AR_ROWS consecutive rows per CTA, for one KV head and one
 * chunk index. attn_chunk_kernel gives each (row, KV head, chunk) a CTA of its own that fetches the
 * chunk's K and V rows; a 512-token prefill thus launched ~68k CTAs per layer of a Qwen3-4B shape,
 * each reading its 16 keys from L2 (~600 us a layer on an H100, about half the layer's matmuls).
 * Here the rows of a CTA that share a sequence and a chunk length (a run) share the chunk's keys,
 * staged once in shared memory (as floats, exact), and every partial is the same chain as attn_chunk_kernel's:
 *   score   per (row, head, key): lane l's products over dimensions 4l .. 4l + 3 of each 128-wide
 *           slice, in dimension order from 0, then warp_sum's butterfly, times the scale;
 *   softmax max, then expf(s - max) and their sum: lane l's keys l, l + 32, ... in order, butterfly;
 *   output  for each of attn_chunk_kernel's ATT_WARPS warps w, the fmaf chain over keys w,
 *           w + ATT_WARPS, ... from 0, and the ATT_WARPS sums added in warp order.
 * The merge is attn_merge_kernel's. Chunks of up to AR_MAX_CHUNK keys (rows of up to 2048 keys) and
 * head sizes up to 256; the host picks this kernel (bit-identical, so the choice is free) for
 * batches of long runs: test_cuda_ops compares every row of a 380-row batch with the row alone. */
constexpr int AR_ROWS = 16, AR_WARPS = 8, AR_MAX_CHUNK = 64, AR_MAX_NS = 2;

/* lane's share of one score: its products over dimensions 4 lane .. 4 lane + 3 of each 128-wide
 * slice, in dimension order from 0 (attn_chunk_kernel's acc) */
__device__ __forceinline__ float ar_partial(const float4 (&q4)[AR_MAX_NS], const float *krow, int lane, int ns, int hd) {
    float acc = 0.0f;
#pragma unroll
    for (int sl = 0; sl < AR_MAX_NS; sl++) {
        const int d = 128 * sl + 4 * lane;
        if (sl >= ns || d >= hd) break;
        const float4 kf = *(const float4 *)(krow + d);
        acc = fmaf(q4[sl].x, kf.x, acc);
        acc = fmaf(q4[sl].y, kf.y, acc);
        acc = fmaf(q4[sl].z, kf.z, acc);
        acc = fmaf(q4[sl].w, kf.w, acc);
    }
    return acc;
}

/* the query of `row` for the CTA's KV head: its G heads of hd */
__device__ __forceinline__ const float *q_row_base(const attn_args &a, int row) {
    const int G = a.n_head / a.n_head_kv;
    return a.q + (int64_t)row * a.n_head * a.hd + (int64_t)(blockIdx.x % a.n_head_kv) * G * a.hd;
}

/* The scores of a run, 32 at a time per warp: each lane computes its partial of 32 (head, key)
 * items (32 keys of a head, or 16 of two heads when the chunk is 16 long), then a reduce-scatter
 * leaves item L's sum in lane L: at offset 16 a lane keeps the half of the items its bit 4 names
 * and adds its partner's partials of that half, then offsets 8, 4, 2, 1 likewise. Every sum pairs
 * the same lanes at each level as warp_sum's butterfly (a + b == b + a exactly), so each score is
 * bit-identical to warp_sum's, for 31 shuffles per 32 scores instead of 160. */
template <int PER> /* items per head: 16 (chunks of 16 keys, two heads a pass) or 32 */
__device__ void ar_scores_rs(const attn_args &a, const float *ks, float *sc, const float *q0, const int *r_nk, int s0, int s1, int k0,
                             int CH, int chmax) {
    const int G = a.n_head / a.n_head_kv, hd = a.hd, ns = (hd + 127) / 128;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    constexpr int per = PER, hp = 32 / PER; /* heads per pass */
    const int hpass = (G + hp - 1) / hp, kpass = (CH + per - 1) / per;
    const int64_t rstride = (int64_t)a.n_head * hd;
    for (int pi = warp; pi < (s1 - s0) * hpass * kpass; pi += AR_WARPS) {
        const int rr = s0 + pi / (hpass * kpass), g0 = pi / kpass % hpass * hp, kb = pi % kpass * per;
        const int n = min(r_nk[rr] - k0, CH);
        if (n <= kb) continue;
        float4 q4[2][AR_MAX_NS]; /* [head of the pass][slice] */
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int sl = 0; sl < AR_MAX_NS; sl++) {
                const int d = 128 * sl + 4 * lane;
                q4[h][sl] = h < hp && g0 + h < G && sl < ns && d < hd ? *(const float4 *)(q0 + rr * rstride + (int64_t)(g0 + h) * hd + d)
                                                                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        float v[32];
#pragma unroll
        for (int it = 0; it < 32; it++) {
            const int hh = it >= per; /* the pass's second head (a constant once unrolled) */
            const int j = kb + (it & (per - 1));
            v[it] = j < n && g0 + hh < G ? ar_partial(q4[hh], ks + j * hd, lane, ns, hd) : 0.0f;
        }
#pragma unroll
        for (int o = 16, w = 16; o >= 1; o >>= 1, w >>= 1) {
            const bool hi = lane & o;
#pragma unroll
            for (int k = 0; k < 16; k++) {
                if (k >= w) break;
                const float send = hi ? v[k] : v[k + w], keep = hi ? v[k + w] : v[k];
                v[k] = keep + __shfl_xor_sync(0xffffffffu, send, o);
            }
        }
        const int h = lane >= per, j = kb + (lane & (per - 1));
        if (j < n && g0 + h < G) sc[(rr * G + g0 + h) * chmax + j] = v[0] * a.scale;
    }
}

__global__ void __launch_bounds__(AR_WARPS * 32, 4) attn_rows_kernel(attn_args a, int n_rows, int chmax) {
    extern __shared__ float smem[];
    __shared__ int r_nk[AR_ROWS], r_seq[AR_ROWS], r_ch[AR_ROWS];
    dsp_cu_pdl_launch_dependents();
    const int kvh = blockIdx.x % a.n_head_kv, r0 = blockIdx.x / a.n_head_kv * AR_ROWS, c = blockIdx.y;
    const int G = a.n_head / a.n_head_kv, hd = a.hd, kv_dim = a.kv.kv_dim, bt = a.kv.block_tokens, ns = (hd + 127) / 128;
    const int rn = min(AR_ROWS, n_rows - r0), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x < rn) { /* the batch description is final before the forward's first kernel */
        const int nk = a.m.n_keys[r0 + threadIdx.x];
        r_nk[threadIdx.x] = nk, r_seq[threadIdx.x] = a.m.seq[r0 + threadIdx.x], r_ch[threadIdx.x] = dsp_cu_attn_chunk(nk, a.cmin);
    }
    __syncthreads();
    bool any = false; /* does any row have a chunk c */
    for (int i = 0; i < rn; i++) any |= c * r_ch[i] < r_nk[i];
    if (!any) return;
    float *ks = smem, *vs = ks + chmax * hd, *sc = vs + chmax * hd; /* sc: [AR_ROWS][G][chmax] */
    int64_t *slot = (int64_t *)(sc + AR_ROWS * G * chmax + (AR_ROWS * G * chmax) % 2);
    const int64_t lbase = (int64_t)a.layer * a.kv.n_blocks * bt;
    dsp_cu_pdl_wait();
    for (int s0 = 0, s1; s0 < rn; s0 = s1) { /* one run of rows at a time */
        for (s1 = s0 + 1; s1 < rn && r_seq[s1] == r_seq[s0] && r_ch[s1] == r_ch[s0];) s1++;
        const int CH = r_ch[s0], k0 = c * CH;
        int nmax = 0;
        for (int i = s0; i < s1; i++) nmax = max(nmax, min(r_nk[i] - k0, CH));
        if (nmax <= 0) continue;
        for (int j = threadIdx.x; j < nmax; j += blockDim.x) slot[j] = (lbase + kv_slot(a.m, bt, r0 + s0, k0 + j)) * kv_dim + (int64_t)kvh * hd;
        __syncthreads();
        /* K and V rows as floats (exact), 4 values a thread at a time */
        const int u4 = hd / 4;
        for (int i = threadIdx.x; i < nmax * u4; i += blockDim.x) {
            const int j = i / u4, u = i % u4;
            float f[4];
            kv_load4(a.kv.k + slot[j] + 4 * u, f, a.kv.bf16);
            ((float4 *)ks)[i] = make_float4(f[0], f[1], f[2], f[3]);
            kv_load4(a.kv.v + slot[j] + 4 * u, f, a.kv.bf16);
            ((float4 *)vs)[i] = make_float4(f[0], f[1], f[2], f[3]);
        }
        __syncthreads();
        if (a.rows_mode == 2) {
            if (CH < 32) ar_scores_rs<16>(a, ks, sc, q_row_base(a, r0), r_nk, s0, s1, k0, CH, chmax);
            else ar_scores_rs<32>(a, ks, sc, q_row_base(a, r0), r_nk, s0, s1, k0, CH, chmax);
        } else { /* a warp per (row, head) and key: warp_sum itself */
            for (int pi = warp; pi < (s1 - s0) * G; pi += AR_WARPS) {
                const int rr = s0 + pi / G, g = pi % G, n = min(r_nk[rr] - k0, CH);
                if (n <= 0) continue;
                const float *qr = q_row_base(a, r0 + rr) + (int64_t)g * hd;
                float4 q4[AR_MAX_NS];
#pragma unroll
                for (int sl = 0; sl < AR_MAX_NS; sl++) {
                    const int d = 128 * sl + 4 * lane;
                    q4[sl] = sl < ns && d < hd ? *(const float4 *)(qr + d) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
                float *sp = sc + (rr * G + g) * chmax;
#pragma unroll 4
                for (int j = 0; j < n; j++) {
                    const float v = warp_sum(ar_partial(q4, ks + j * hd, lane, ns, hd));
                    if (lane == 0) sp[j] = v * a.scale;
                }
            }
        }
        __syncthreads();
        /* softmax: a warp per (row, head) */
        for (int pi = warp; pi < (s1 - s0) * G; pi += AR_WARPS) {
            const int rr = s0 + pi / G, g = pi % G, row = r0 + rr, n = min(r_nk[rr] - k0, CH);
            if (n <= 0) continue;
            chunk_softmax(sc + (rr * G + g) * chmax, n, lane, a.part + (((int64_t)row * a.n_head + kvh * G + g) * a.max_chunks + c) * (hd + 2) + hd);
        }
        __syncthreads();
        /* p v: a thread per (row, head, 4 dimensions), attn_chunk_kernel's ATT_WARPS chains in turn */
        const int h4 = hd / 4;
        for (int e = threadIdx.x; e < (s1 - s0) * G * h4; e += blockDim.x) {
            const int rr = s0 + e / (G * h4), g = e / h4 % G, d = 4 * (e % h4), n = min(r_nk[rr] - k0, CH);
            if (n <= 0) continue;
            const float *pp = sc + (rr * G + g) * chmax;
            float res[4];
#pragma unroll
            for (int w = 0; w < ATT_WARPS; w++) {
                float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                for (int j = w; j < n; j += ATT_WARPS) {
                    const float4 vf = *(const float4 *)(vs + j * hd + d);
                    const float p = pp[j];
                    o[0] = fmaf(p, vf.x, o[0]), o[1] = fmaf(p, vf.y, o[1]), o[2] = fmaf(p, vf.z, o[2]), o[3] = fmaf(p, vf.w, o[3]);
                }
#pragma unroll
                for (int i = 0; i < 4; i++) res[i] = w == 0 ? o[i] : res[i] + o[i];
            }
            float *po = a.part + (((int64_t)(r0 + rr) * a.n_head + kvh * G + g) * a.max_chunks + c) * (hd + 2) + d;
#pragma unroll
            for (int i = 0; i < 4; i++) po[i] = res[i];
        }
        __syncthreads(); /* the next run reuses ks, vs, sc and slot */
    }
}

/* one CTA per (row, head): merge the row's chunks in order. With pk.xp, the head's columns of the
 * row are also packed as the o projection's input (pack_chunk's units and 32-block sums, the same
 * dsp_cu_x_unit and warp_sum over the same values: bit-identical to prep_cols_kernel on out), and
 * the last head's CTA writes the zero units and sums past the row (up to pk.units). */
struct attn_pack {
    uint4 *xp;
    float *xsum;
    int64_t xs_stride, units;
};

__global__ void attn_merge_kernel(float *out, const float *part, int n_head, int hd, int max_chunks, int cmin, dsp_cu_meta m,
                                  attn_pack pk) {
    dsp_cu_pdl_launch_dependents();
    const int row = blockIdx.x / n_head, h = blockIdx.x % n_head;
    const int nk = m.n_keys[row], nch = dsp_cu_attn_chunks(nk, cmin); /* (before the wait: attn_chunk_kernel) */
    const float *p = part + ((int64_t)row * n_head + h) * max_chunks * (hd + 2);
    dsp_cu_pdl_wait();
    /* the chunks' max and sum, one thread each, then their weights exp(m_c - max): every thread
     * then reads them from shared memory instead of 3 x nch dependent global loads. The thread's
     * first dimension's partials of the first PB chunks are loaded with them (one round trip). */
    __shared__ float cm[ATT_MAX_CHUNKS], cl[ATT_MAX_CHUNKS], ce[ATT_MAX_CHUNKS], S[DSP_CU_ATTN_PACK_MAX_HD];
    const int d0 = threadIdx.x;
    float v0[PB];
#pragma unroll
    for (int j = 0; j < PB; j++) v0[j] = d0 < hd && j < nch ? p[j * (hd + 2) + d0] : 0.0f;
    if (threadIdx.x < nch) cm[threadIdx.x] = p[threadIdx.x * (hd + 2) + hd], cl[threadIdx.x] = p[threadIdx.x * (hd + 2) + hd + 1];
    __syncthreads();
    float mx = -INFINITY;
    for (int c = 0; c < nch; c++) mx = fmaxf(mx, cm[c]);
    if (threadIdx.x < nch) ce[threadIdx.x] = expf(cm[threadIdx.x] - mx);
    __syncthreads();
    float l = 0.0f;
    for (int c = 0; c < nch; c++) l += cl[c] * ce[c];
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int c0 = 0; c0 < nch; c0 += PB) { /* PB chunks' loads at once, added in chunk order */
            float v[PB];
#pragma unroll
            for (int j = 0; j < PB; j++) v[j] = d == d0 && c0 == 0 ? v0[j] : c0 + j < nch ? p[(c0 + j) * (hd + 2) + d] : 0.0f;
#pragma unroll
            for (int j = 0; j < PB; j++)
                if (c0 + j < nch) o = fmaf(v[j], ce[c0 + j], o);
        }
        const float res = l > 0.0f ? o / l : 0.0f;
        out[((int64_t)row * n_head + h) * hd + d] = res;
        if (pk.xp) S[d] = res;
    }
    if (!pk.xp) return;
    __syncthreads();
    const int64_t u0 = (int64_t)h * hd / 4;
    uint4 *xr = pk.xp + (int64_t)row * pk.units;
    for (int t = threadIdx.x; t < hd / 4; t += blockDim.x) {
        uint32_t v[4];
        dsp_cu_x_unit(S, hd, t, v);
        xr[u0 + t] = make_uint4(v[0], v[1], v[2], v[3]);
    }
    const int lane = threadIdx.x & 31;
    for (int b = threadIdx.x >> 5; b < hd / 32; b += blockDim.x >> 5) {
        const float s = warp_sum(S[32 * b + lane]);
        if (lane == 0) pk.xsum[(u0 / 8 + b) * pk.xs_stride + row] = s;
    }
    if (h == n_head - 1) { /* past the row: what pack_chunk writes from its zeros */
        const int64_t end = (int64_t)n_head * hd / 4;
        for (int64_t t = end + threadIdx.x; t < pk.units; t += blockDim.x) xr[t] = make_uint4(0u, 0u, 0u, 0u);
        for (int64_t b = end / 8 + threadIdx.x; b < pk.units / 8; b += blockDim.x) pk.xsum[b * pk.xs_stride + row] = 0.0f;
    }
}

/* ---- elementwise --------------------------------------------------------------------------- */

__global__ void add_kernel(float *x, const float *y, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

__global__ void swiglu_kernel(float *g, const float *u, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = silu_mul(g[i], u[i]);
}

__global__ void copy_rows_kernel(float *dst, size_t dst_ld, size_t dst_col, const float *src, size_t src_ld, size_t src_col,
                                 int n_rows, size_t width) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n_rows * width) return;
    const size_t r = i / width, c = i % width;
    dst[r * dst_ld + dst_col + c] = src[r * src_ld + src_col + c];
}

/* ---- logits ---------------------------------------------------------------------------------- */

/* a logit as the sampler reads it (sample.h step 0): NaN is -inf, +inf is FLT_MAX */
__device__ __forceinline__ float read_logit(float x) { return x != x ? -INFINITY : x > FLT_MAX ? FLT_MAX : x; }

/* (value, index) max of read_logit values with ties to the lower index */
__device__ __forceinline__ void arg_better(float &v, int &i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i)) v = v2, i = i2;
}

/* block-wide argmax over x[0, n) skipping `skip` (k excluded ids); fixed reduction shape */
/* the CTA's best of each thread's (v, idx): a butterfly per warp, then the warps in order; every
 * thread gets it (shv, shi: one slot per warp) */
__device__ void block_arg_reduce(float v, int idx, float *shv, int *shi, float &bv, int &bi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
        arg_better(v, idx, v2, i2);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) shv[warp] = v, shi[warp] = idx;
    __syncthreads();
    bv = shv[0], bi = shi[0];
    for (int w = 1; w < nw; w++) arg_better(bv, bi, shv[w], shi[w]);
}

__device__ void block_argmax(const float *x, int n, const int32_t *skip, int n_skip, float *shv, int *shi, float &bv, int &bi) {
    float v = -INFINITY;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        bool skipped = false;
        for (int s = 0; s < n_skip; s++) skipped |= skip[s] == i;
        if (!skipped) arg_better(v, idx, read_logit(x[i]), i);
    }
    block_arg_reduce(v, idx, shv, shi, bv, bi);
}

/* Argmax of rows split into column ranges: CTA (s, r) takes range s of row r (logits row lrow[r], or
 * r; with y, logits row += y row r first, written back), leaves its (value, index) in part, and the
 * range's last CTA to finish (a ticket per row) reduces the row's parts and writes out[dst[r]] (or
 * out[r]), -1 when no logit is finite, then re-arms the ticket. arg_better is a total order on
 * (value, -index), so the result is the whole row's argmax with ties to the lower index whatever the
 * split and the finishing order: the same token as one CTA per row (DSP_CUDA_ARGMAX_SPLIT=0). */
constexpr int AM_THREADS = 256;
struct am_args {
    float *logits;
    const float *y;
    const int32_t *lrow, *dst;
    int32_t *out;
    int n_vocab, chunk;
    dsp_cu_am am;
};

__global__ void __launch_bounds__(AM_THREADS) argmax_split_kernel(am_args a) {
    dsp_cu_pdl_launch_dependents();
    dsp_cu_pdl_wait();
    __shared__ float shv[AM_THREADS / 32];
    __shared__ int shi[AM_THREADS / 32];
    __shared__ bool last;
    const int r = blockIdx.y, s = blockIdx.x, ns = gridDim.x;
    float *x = a.logits + (int64_t)(a.lrow ? a.lrow[r] : r) * a.n_vocab;
    const float *b = a.y ? a.y + (int64_t)r * a.n_vocab : nullptr;
    const int c0 = s * a.chunk, c1 = min(a.n_vocab, c0 + a.chunk);
    float v = -INFINITY;
    int idx = 0x7fffffff;
    if (b) {
        for (int c = c0 + threadIdx.x; c < c1; c += AM_THREADS) {
            const float z = x[c] + b[c];
            x[c] = z;
            arg_better(v, idx, read_logit(z), c);
        }
    } else {
        for (int c = c0 + threadIdx.x; c < c1; c += AM_THREADS) arg_better(v, idx, read_logit(x[c]), c);
    }
    block_arg_reduce(v, idx, shv, shi, v, idx);
    if (threadIdx.x == 0) {
        a.am.part[(int64_t)r * ns + s] = make_int2(__float_as_int(v), idx);
        __threadfence();
        last = atomicAdd(&a.am.count[r], 1u) == (unsigned)ns - 1;
    }
    __syncthreads();
    if (!last || threadIdx.x != 0) return;
    __threadfence();
    v = -INFINITY, idx = 0x7fffffff;
    for (int i = 0; i < ns; i++) {
        const int2 p = __ldcg(&a.am.part[(int64_t)r * ns + i]);
        arg_better(v, idx, __int_as_float(p.x), p.y);
    }
    a.out[a.dst ? a.dst[r] : r] = v == -INFINITY ? -1 : idx;
    a.am.count[r] = 0;
}

/* the ranges of a row: about 4,096 columns each (16 per thread), at most DSP_CU_AM_MAX_SPLIT */
static int am_chunk(int n_vocab) {
    static const int off = [] {
        const char *e = getenv("DSP_CUDA_ARGMAX_SPLIT");
        return e && atoi(e) == 0;
    }();
    if (off) return n_vocab;
    int ns = (n_vocab + 4095) / 4096;
    if (ns > DSP_CU_AM_MAX_SPLIT) ns = DSP_CU_AM_MAX_SPLIT;
    return (n_vocab + ns - 1) / ns;
}

static cudaError_t am_launch(am_args a, int n_rows, cudaStream_t st) {
    a.chunk = am_chunk(a.n_vocab);
    const unsigned ns = (unsigned)((a.n_vocab + a.chunk - 1) / a.chunk);
    return dsp_cu_launch_dep(argmax_split_kernel, dim3(ns, (unsigned)n_rows), dim3(AM_THREADS), 0, st, a);
}

__global__ void top_logprobs_kernel(const float *logits, int n_vocab, int k, int32_t *ids, float *lp, float *lse) {
    __shared__ float shv[32], sh[32];
    __shared__ int shi[32];
    __shared__ int32_t chosen[64];
    const float *x = logits + (int64_t)blockIdx.x * n_vocab;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < n_vocab; i += blockDim.x) mx = fmaxf(mx, x[i]);
    mx = warp_max(mx);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) shv[warp] = mx;
    __syncthreads();
    mx = shv[0];
    for (int w = 1; w < nw; w++) mx = fmaxf(mx, shv[w]);
    float s = 0.0f;
    for (int i = threadIdx.x; i < n_vocab; i += blockDim.x) s += expf(x[i] - mx);
    s = block_sum(s, sh);
    const float l = mx + logf(s);
    for (int j = 0; j < k; j++) {
        float v;
        int i;
        block_argmax(x, n_vocab, chosen, j, shv, shi, v, i);
        if (threadIdx.x == 0) {
            chosen[j] = i;
            ids[(int64_t)blockIdx.x * k + j] = i;
            lp[(int64_t)blockIdx.x * k + j] = v - l;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) lse[blockIdx.x] = l;
}

/* streaming read for the bandwidth figure: every thread XORs 16-byte words, 4 loads in flight */
__global__ void read_kernel(const uint4 *p, size_t n, uint32_t *out) {
    uint32_t acc = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride), d = __ldcs(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) {
        const uint4 a = __ldcs(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == 0x9e3779b9u) out[0] = acc; /* practically never: keeps the loads */
}

unsigned blocks(int64_t n, int per) { return (unsigned)((n + per - 1) / per); }

} // namespace

cudaError_t dsp_cu_embed(float *x, const dsp_cu_mat *t, int dim, int n, const dsp_cu_meta *m, cudaStream_t st) {
    embed_kernel<<<blocks((int64_t)n * dim, 256), 256, 0, st>>>(x, t->L, t->d, t->n_groups, dim, n, *m);
    return cudaGetLastError();
}

cudaError_t dsp_cu_prep_launch(const dsp_cu_prep *a, int n_rows, cudaStream_t st) {
    const int64_t nch = (a->K + COL_ELEMS - 1) / COL_ELEMS;
    if (!(a->flags & DSP_CU_PREP_NORM))
        return dsp_cu_launch_dep(prep_cols_kernel, dim3((unsigned)n_rows, (unsigned)nch), dim3(COL_THREADS), 0, st, *a);
    if (nch > NORM_MAX_CHUNKS || (a->flags & DSP_CU_PREP_SWIGLU)) return cudaErrorInvalidValue;
    const unsigned nc = nch < NORM_CLUSTER ? (unsigned)nch : NORM_CLUSTER;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[2];
    cfg.gridDim = dim3(nc * (unsigned)n_rows), cfg.blockDim = dim3(COL_THREADS), cfg.stream = st;
    cfg.dynamicSmemBytes = (size_t)((nch + nc - 1) / nc) * COL_ELEMS * sizeof(float);
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = nc, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr, cfg.numAttrs = dsp_cu_pdl_all() ? 2 : 1;
    return cudaLaunchKernelEx(&cfg, prep_norm_kernel, *a);
}

cudaError_t dsp_cu_rmsnorm(float *out, const float *x, const float *w, int n_rows, int dim, float eps, const int32_t *rows,
                           cudaStream_t st) {
    rmsnorm_kernel<<<(unsigned)n_rows, COL_THREADS, 0, st>>>(out, x, w, dim, eps, rows);
    return cudaGetLastError();
}

cudaError_t dsp_cu_add_bias(float *y, const float *b, int n_rows, int dim, cudaStream_t st) {
    add_bias_kernel<<<blocks((int64_t)n_rows * dim, 256), 256, 0, st>>>(y, b, n_rows, dim);
    return cudaGetLastError();
}

cudaError_t dsp_cu_rope(const dsp_cu_rope_args *a, const dsp_cu_meta *m, cudaStream_t st) {
    const int warps = 4;
    if (a->hd > DSP_CU_ROPE_MAX_HD || a->rot > a->hd) return cudaErrorInvalidValue;
    return dsp_cu_launch_dep(rope_kernel, dim3(blocks((int64_t)a->n * (a->hq + a->hk), warps)), dim3(warps * 32),
                             warps * a->hd * sizeof(float), st, *a, *m);
}

cudaError_t dsp_cu_kv_write(const dsp_cu_kv *kv, int layer, const float *k, const float *v, int n, const dsp_cu_meta *m,
                            cudaStream_t st) {
    kv_write_kernel<<<blocks((int64_t)n * kv->kv_dim, 256), 256, 0, st>>>(*kv, layer, k, v, n, *m);
    return cudaGetLastError();
}

static size_t attn_smem(int G, int hd, int chunk) {
    return (size_t)(G * hd + G * chunk + ATT_WARPS * G * hd + 1) * sizeof(float) + (size_t)chunk * sizeof(int64_t) + 8;
}

static size_t attn_rows_smem(int G, int hd, int chunk) {
    return (size_t)(2 * chunk * hd + AR_ROWS * G * chunk + 1) * sizeof(float) + (size_t)chunk * sizeof(int64_t);
}

/* $DSP_CUDA_ATTN_ROWS: 0 attn_chunk_kernel for every batch, 1 attn_rows_kernel with one warp_sum
 * per score, 2 (default) with the reduce-scatter (to compare; all three give the same bits) */
static int attn_rows_mode(void) {
    static const int v = [] {
        const char *e = getenv("DSP_CUDA_ATTN_ROWS");
        return e && (!strcmp(e, "0") || !strcmp(e, "1")) ? atoi(e) : 2;
    }();
    return v;
}

bool dsp_cu_attn_rows_ok(int n_head, int n_head_kv, int head_dim, int max_chunk_len) {
    const bool on = attn_rows_mode() > 0;
    return on && max_chunk_len <= AR_MAX_CHUNK && head_dim <= 128 * AR_MAX_NS && n_head / n_head_kv <= MAX_GROUP &&
           attn_rows_smem(n_head / n_head_kv, head_dim, max_chunk_len) <= ATT_SMEM_MAX;
}

cudaError_t dsp_cu_attention(float *out, const float *q, const dsp_cu_kv *kv, int layer, int n, int n_head, int n_head_kv,
                             int head_dim, float scale, int max_chunks, int max_chunk_len, bool rows, float *part, const dsp_cu_meta *m,
                             const dsp_cu_xpack *pack, cudaStream_t st) {
    const int G = n_head / n_head_kv;
    if (G > MAX_GROUP || head_dim % 8 || max_chunks > ATT_MAX_CHUNKS || (pack && !dsp_cu_attn_pack_ok(head_dim)))
        return cudaErrorInvalidValue;
    const attn_pack pk = {pack ? pack->xp : nullptr, pack ? pack->xsum : nullptr, pack ? pack->xs_stride : 0,
                          dsp_cu_x_units((int64_t)n_head * head_dim)};
    static const int vearly = [] { /* $DSP_CUDA_ATTN_VEARLY=0: V loaded after the softmax (to compare) */
        const char *e = getenv("DSP_CUDA_ATTN_VEARLY");
        return e && !strcmp(e, "0") ? 0 : 1;
    }();
    attn_args a = {q, *kv, layer, n_head, n_head_kv, head_dim, max_chunks, dsp_cu_attn_cmin(), vearly, attn_rows_mode(), scale, part, *m};
    cudaError_t e;
    if (rows) {
        if (!dsp_cu_attn_rows_ok(n_head, n_head_kv, head_dim, max_chunk_len)) return cudaErrorInvalidValue;
        const dim3 grid((unsigned)((n + AR_ROWS - 1) / AR_ROWS * n_head_kv), (unsigned)max_chunks);
        e = dsp_cu_launch_dep(attn_rows_kernel, grid, dim3(AR_WARPS * 32), attn_rows_smem(G, head_dim, max_chunk_len), st, a, n,
                              max_chunk_len);
    } else {
        const dim3 grid((unsigned)(n * n_head_kv), (unsigned)max_chunks);
        const size_t sm = attn_smem(G, head_dim, max_chunk_len);
        if (sm > ATT_SMEM_MAX) return cudaErrorInvalidValue;
        e = dsp_cu_launch_dep(G <= 4 ? attn_chunk_kernel<4> : G <= 8 ? attn_chunk_kernel<8> : attn_chunk_kernel<16>, grid,
                              dim3(ATT_WARPS * 32), sm, st, a);
    }
    return e ? e : dsp_cu_launch_dep(attn_merge_kernel, dim3((unsigned)(n * n_head)), dim3(128), 0, st, out, (const float *)part, n_head,
                                     head_dim, max_chunks, a.cmin, *m, pk);
}

bool dsp_cu_attn_pack_enabled(void) {
    static const bool on = [] {
        const char *e = getenv("DSP_CUDA_ATTN_PACK");
        return !(e && !strcmp(e, "0"));
    }();
    return on;
}

int dsp_cu_attn_cmin(void) {
    static const int c = [] {
        const char *e = getenv("DSP_CUDA_ATTN_CHUNK");
        const int v = e ? atoi(e) : 0;
        return v == 32 || v == 64 ? v : 16;
    }();
    return c;
}

static int pdl_level(void) {
    static const int l = [] {
        const char *e = getenv("DSP_CUDA_PDL");
        return e && !strcmp(e, "0") ? 0 : e && !strcmp(e, "1") ? 1 : 2;
    }();
    return l;
}
bool dsp_cu_pdl_enabled(void) { return pdl_level() > 0; }
bool dsp_cu_pdl_all(void) { return pdl_level() > 1; }

cudaError_t dsp_cu_kernels_init(void) {
    cudaError_t e = cudaFuncSetAttribute(attn_chunk_kernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, ATT_SMEM_MAX);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(attn_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ATT_SMEM_MAX);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(attn_chunk_kernel<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, ATT_SMEM_MAX);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(attn_chunk_kernel<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, ATT_SMEM_MAX);
    return e;
}

cudaError_t dsp_cu_add(float *x, const float *y, size_t n, cudaStream_t st) {
    add_kernel<<<blocks((int64_t)n, 256), 256, 0, st>>>(x, y, n);
    return cudaGetLastError();
}

cudaError_t dsp_cu_swiglu(float *g, const float *u, size_t n, cudaStream_t st) {
    swiglu_kernel<<<blocks((int64_t)n, 256), 256, 0, st>>>(g, u, n);
    return cudaGetLastError();
}

cudaError_t dsp_cu_copy_rows(float *dst, size_t dst_ld, size_t dst_col, const float *src, size_t src_ld, size_t src_col,
                             int n_rows, size_t width, cudaStream_t st) {
    copy_rows_kernel<<<blocks((int64_t)n_rows * (int64_t)width, 256), 256, 0, st>>>(dst, dst_ld, dst_col, src, src_ld, src_col,
                                                                                      n_rows, width);
    return cudaGetLastError();
}

cudaError_t dsp_cu_kv_copy_block(const dsp_cu_kv *kv, uint32_t dst, uint32_t src, cudaStream_t st) {
    const int64_t n = (int64_t)kv->n_layers * kv->block_tokens * kv->kv_dim;
    kv_copy_kernel<<<blocks(n, 256), 256, 0, st>>>(*kv, dst, src);
    return cudaGetLastError();
}

cudaError_t dsp_cu_argmax(const float *logits, int n_rows, int n_vocab, int32_t *out, const dsp_cu_am *am, cudaStream_t st) {
    return am_launch({const_cast<float *>(logits), nullptr, nullptr, nullptr, out, n_vocab, 0, *am}, n_rows, st);
}

/* block i: e row i = w1 row tok[src[i]] (rank floats) */
__global__ void markov_gather_kernel(const float *w1, int rank, const int32_t *tok, const int32_t *src, float *e) {
    dsp_cu_pdl_launch_dependents();
    dsp_cu_pdl_wait();
    const float *w = w1 + (int64_t)tok[src[blockIdx.x]] * rank;
    for (int c = threadIdx.x; c < rank; c += blockDim.x) e[(int64_t)blockIdx.x * rank + c] = w[c];
}

cudaError_t dsp_cu_markov_gather(const float *w1, int rank, const int32_t *tok, const int32_t *src, float *e, int n_rows, cudaStream_t st) {
    return dsp_cu_launch_dep(markov_gather_kernel, dim3((unsigned)n_rows), dim3(256), 0, st, w1, rank, tok, src, e);
}

cudaError_t dsp_cu_markov_add_argmax(float *logits, int n_vocab, const float *y, const int32_t *lrow, const int32_t *dst, int32_t *tok,
                                     int n_rows, const dsp_cu_am *am, cudaStream_t st) {
    return am_launch({logits, y, lrow, dst, tok, n_vocab, 0, *am}, n_rows, st);
}
cudaError_t dsp_cu_top_logprobs(const float *logits, int n_rows, int n_vocab, int k, int32_t *ids, float *lp, float *lse,
                                cudaStream_t st) {
    if (k > 64) return cudaErrorInvalidValue;
    top_logprobs_kernel<<<(unsigned)n_rows, 1024, 0, st>>>(logits, n_vocab, k, ids, lp, lse);
    return cudaGetLastError();
}

double dsp_cu_read_bandwidth(size_t bytes, int n_sm, cudaStream_t st) {
    uint4 *p = nullptr;
    uint32_t *o = nullptr;
    const size_t n = bytes / 16;
    double gbs[5] = {0};
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    bool ok = cudaMalloc(&p, n * 16) == cudaSuccess && cudaMalloc(&o, 4) == cudaSuccess &&
              cudaMemsetAsync(p, 0x5a, n * 16, st) == cudaSuccess && cudaEventCreate(&e0) == cudaSuccess &&
              cudaEventCreate(&e1) == cudaSuccess;
    for (int r = -1; ok && r < 5; r++) { /* one warm-up */
        cudaEventRecord(e0, st);
        read_kernel<<<(unsigned)(n_sm * 8), 512, 0, st>>>(p, n, o);
        cudaEventRecord(e1, st);
        float ms = 0;
        ok = cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess && ms > 0;
        if (ok && r >= 0) gbs[r] = (double)(n * 16) / (ms * 1e6);
    }
    cudaGetLastError();
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(p), cudaFree(o);
    if (!ok) return 0;
    for (int i = 0; i < 5; i++) /* median */
        for (int j = i + 1; j < 5; j++)
            if (gbs[j] < gbs[i]) {
                double t = gbs[i];
                gbs[i] = gbs[j], gbs[j] = t;
            }
    return gbs[2];
}
