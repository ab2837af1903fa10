/* backend/cuda/cuda_matmul: y = x W^T on the tensor cores, one kernel for every row count.
 *
 * Decode and verify rows (1..64) are memory-bound: the kernel must stream each weight byte once
 * at close to bandwidth. Prefill rows are compute-bound. One kernel serves both so that a row's
 * result is bit-identical however many rows share the launch:
 *
 *   grid.y  one CTA per MT 16-row tiles of each weight (up to 3 weights of the same input width);
 *           MT = 1 up to 64 rows, MT = 2 above for BF16 and Q8_0 (prefill: each activation load
 *           serves two tiles, which halves the activations' L2 traffic; the other types' MT = 2
 *           kernels spill registers, so they keep MT = 1);
 *   grid.x  token groups of 8 * NT rows (NT = 1, 2, 4, 8 n-tiles: 8..64 tokens per CTA);
 *   CTA     S warps, warp w reducing groups [w G / S, (w + 1) G / S) of the k range; S is a
 *           property of the weight (dsp_cu_mm_slices), never of the batch;
 *   warp    per 16-wide k step: decode A (16 rows, pack.h/frag.h) in registers, then for each
 *           n-tile two mma.m16n8k16 (activations hi and lo; at 1-8 rows, 1-16 for float
 *           weights, a load batch's activations are fetched ahead, AR below); quantized blocks
 *           accumulate in a fresh f32 partial that is scaled into the warp's total at the block's end;
 *   then    the S partial totals are added in warp order through shared memory.
 *
 * Each output element is thus one fixed chain of mma and fma operations determined by the weight's
 * shape, the type and K: the tensor core computes every (row, token) element of an mma from that
 * row and token alone, so neither NT, MT, the token group nor the other tokens can change it. No
 * atomics, no split whose count depends on the batch.
 *
 * The kernel is launched as a programmatic dependent of the input preparation before it
 * (cuda_internal.h): its CTAs start while that kernel runs and issue their first weight loads,
 * then wait for it (griddepcontrol.wait) before they read the activations.
 *
 * Weights are read with 16-byte streaming loads (L1::no_allocate: the activations, read by every
 * warp, stay in L1), each warp-wide load 512 consecutive bytes (pack.h interleaves the lanes'
 * chunks), U groups at a time so that several loads are in flight per lane. */
#include "backend/cuda/cuda_internal.h"

#include <stdio.h>
#include <stdlib.h>

namespace {

template <uint32_t T> struct mmt;
/* KG: k per group, LB: lane bytes per group, SB: scale bytes, U: groups per load batch */
#define MMT(type, kg, lb, sb, u)                                                                                         \
    template <> struct mmt<type> {                                                                                       \
        static constexpr int KG = kg, LB = lb, SB = sb, U = u;                                                           \
    };
MMT(DSP_BF16, 32, 32, 0, 4)
MMT(DSP_F16, 32, 32, 0, 4)
MMT(DSP_F32, 32, 64, 0, 2)
MMT(DSP_Q8_0, 32, 16, 32, 8)
MMT(DSP_Q4_0, 64, 16, 64, 8)
MMT(DSP_Q4_1, 64, 16, 128, 8)
MMT(DSP_Q4_K, 256, 64, 320, 2)
MMT(DSP_Q5_K, 256, 80, 320, 2)
MMT(DSP_Q6_K, 256, 96, 320, 2)
#undef MMT

constexpr int MAX_S = 16;    /* warps per CTA (float weights; quantized ones: 8, see max_slices) */
constexpr int RED_LD = 17;   /* shared-memory row stride of the partial sums (bank spread) */

struct mm_mat_arg {
    const uint8_t *w;
    float *y;
    int M, tile0, S; /* tile0: the weight's first CTA (of MT tiles each) in grid.y */
};

struct mm_args {
    mm_mat_arg m[3];
    int n_mats;
    int64_t n_groups, x_units, xs_stride;
    const uint4 *xp;
    const float *xsum;
    int n_rows;
};

__device__ __forceinline__ uint4 ld_stream(const uint8_t *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* Activations: a plain load, volatile so that it stays after dsp_cu_pdl_wait (__ldg's
 * ld.global.nc reads memory the compiler takes for constant and may be hoisted above it, to
 * before the kernel that writes the activations has finished). */
__device__ __forceinline__ uint4 ld_act(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The same mma kept in program order with the loads (volatile): the activation-in-registers
 * kernels (AR) issue every load of a batch before its first mma; a plain asm may be scheduled
 * between them, and register reuse then waits for each load in turn. */
__device__ __forceinline__ void mma_ordered(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t byte_of(const uint4 &v, int j) {
    const uint32_t w = j < 4 ? v.x : j < 8 ? v.y : j < 12 ? v.z : v.w;
    return (w >> (8 * (j & 3))) & 0xffu;
}
__device__ __forceinline__ float f16lo(uint32_t v) { return dsp_cu_f16((uint16_t)v); }
__device__ __forceinline__ float f16hi(uint32_t v) { return dsp_cu_f16((uint16_t)(v >> 16)); }

/* The scales a lane needs from one group, loaded once per group. */
struct lane_scales {
    uint2 a[2];   /* per 32-block (Q8_0, Q4_0, Q4_1) or the d/dmin header (K-quants) */
    uint4 r0, r1; /* K-quants: the byte scales of rows g and g + 8 */
};

template <uint32_t T>
__device__ __forceinline__ void load_scales(const uint8_t *sc, int g, lane_scales &s) {
    if constexpr (T == DSP_Q8_0) {
        s.a[0].x = *(const uint32_t *)(sc + 4 * g);
    } else if constexpr (T == DSP_Q4_0) {
        s.a[0].x = *(const uint32_t *)(sc + 4 * g);
        s.a[1].x = *(const uint32_t *)(sc + 32 + 4 * g);
    } else if constexpr (T == DSP_Q4_1) {
        s.a[0] = *(const uint2 *)(sc + 8 * g);
        s.a[1] = *(const uint2 *)(sc + 64 + 8 * g);
    } else if constexpr (T == DSP_Q4_K || T == DSP_Q5_K || T == DSP_Q6_K) {
        s.a[0] = *(const uint2 *)(sc + 8 * g);
        s.r0 = *(const uint4 *)(sc + 64 + 16 * g);
        s.r1 = *(const uint4 *)(sc + 64 + 16 * (g + 8));
    }
}

/* The factors of block `b` of the group (the device twin of dsp_cu_block_scale, from registers). */
template <uint32_t T>
__device__ __forceinline__ void block_scale(const lane_scales &s, int b, float mul[2], float add[2]) {
    add[0] = add[1] = 0.0f;
    if constexpr (T == DSP_Q8_0 || T == DSP_Q4_0) {
        mul[0] = f16lo(s.a[b].x), mul[1] = f16hi(s.a[b].x);
    } else if constexpr (T == DSP_Q4_1) {
        mul[0] = f16lo(s.a[b].x), mul[1] = f16hi(s.a[b].x);
        add[0] = f16lo(s.a[b].y), add[1] = f16hi(s.a[b].y);
    } else if constexpr (T == DSP_Q4_K || T == DSP_Q5_K) {
        mul[0] = f16lo(s.a[0].x) * (float)byte_of(s.r0, b);
        mul[1] = f16lo(s.a[0].y) * (float)byte_of(s.r1, b);
        add[0] = -(f16hi(s.a[0].x) * (float)byte_of(s.r0, 8 + b));
        add[1] = -(f16hi(s.a[0].y) * (float)byte_of(s.r1, 8 + b));
    } else if constexpr (T == DSP_Q6_K) {
        mul[0] = f16lo(s.a[0].x) * (float)(int8_t)byte_of(s.r0, b);
        mul[1] = f16lo(s.a[0].y) * (float)(int8_t)byte_of(s.r1, b);
    }
}

template <uint32_t T> constexpr bool has_min() { return T == DSP_Q4_1 || T == DSP_Q4_K || T == DSP_Q5_K; }
template <uint32_t T> constexpr bool is_float() { return T == DSP_BF16 || T == DSP_F16 || T == DSP_F32; }
template <uint32_t T> constexpr int block_steps() { return is_float<T>() ? 0 : T == DSP_Q6_K ? 1 : 2; }
/* Warps per CTA at most: 16 for float weights, 8 for quantized ones, whose scales take registers
 * (8 warps leave a thread up to 255). */
template <uint32_t T> constexpr int max_slices() { return is_float<T>() ? MAX_S : MAX_S / 2; }

/* AR (decode and short verify blocks, mm_actreg): a batch's activation fragments are loaded into
 * registers together, right after its weight loads were issued, so that their L2 round trips
 * overlap the weights' and each other's instead of coming one per k step after the weights have
 * arrived (ncu, H100, BF16 at one row: 83% of the warps' cycles were waits on these loads). The
 * batch is half (float weights) or a quarter (Q8_0, Q4_0, Q4_1) as many groups, which keeps the
 * registers at or below the per-step kernel's; a K-quant group's 16 k steps load 4 at a time. The
 * arithmetic is the same chain: only the loads move. */
template <uint32_t T, int NT, int MT, bool AR = false>
__global__ void __launch_bounds__(max_slices<T>() * 32) mm_kernel(const mm_args a) {
    using C = mmt<T>;
    constexpr int STEPS = C::KG / 16, BST = block_steps<T>(), NV = C::LB / 16;
    constexpr int64_t GB = 32 * C::LB + C::SB;
    /* fewer groups in flight when many n-tiles hold registers (and compute hides the latency) */
    constexpr bool KQ = C::KG == 256;
    /* AR: k steps per activation load (a K-quant group's 16 steps in 4 loads of 4), and the groups
     * of a batch whose activations are loaded at once (all, or one at a time for the K-quants) */
    constexpr int CH = KQ ? 4 : STEPS;
    constexpr int U = MT > 1                   ? 1
                      : AR                     ? (is_float<T>() ? C::U / 2 : KQ ? C::U : C::U / 4)
                      : NT >= 8                ? (C::U >= 4 ? C::U / 4 : 1)
                      : NT >= 4                ? (C::U >= 2 ? C::U / 2 : 1)
                                               : C::U;
    constexpr int XU = KQ ? 1 : U;
    const int bx = blockIdx.y; /* the tile; blockIdx.x, the token group, varies fastest: the CTAs that
                                * read the same weight tile run together and share it through L2 */
    const int mi = (a.n_mats > 2 && bx >= a.m[2].tile0) ? 2 : (a.n_mats > 1 && bx >= a.m[1].tile0) ? 1 : 0;
    const uint8_t *W = mi == 0 ? a.m[0].w : mi == 1 ? a.m[1].w : a.m[2].w;
    float *Y = mi == 0 ? a.m[0].y : mi == 1 ? a.m[1].y : a.m[2].y;
    const int M = mi == 0 ? a.m[0].M : mi == 1 ? a.m[1].M : a.m[2].M;
    const int S = mi == 0 ? a.m[0].S : mi == 1 ? a.m[1].S : a.m[2].S;
    const int tile = MT * (bx - (mi == 0 ? a.m[0].tile0 : mi == 1 ? a.m[1].tile0 : a.m[2].tile0)); /* the first */
    const int n_tiles = (M + 15) / 16;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int tok0 = blockIdx.x * NT * 8;
    extern __shared__ float red[]; /* [S][NT * 8 tokens][RED_LD] */

    dsp_cu_pdl_launch_dependents(); /* a second matmul on the same input may start its loads */
    float tot[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) tot[mt][nt][0] = tot[mt][nt][1] = tot[mt][nt][2] = tot[mt][nt][3] = 0.0f;

    if (warp < S) {
        const int64_t G = a.n_groups;
        const int64_t c0 = warp * G / S, c1 = (warp + 1) * G / S;
        const uint8_t *tp[MT]; /* the weight's last CTA may hold fewer than MT tiles: those reread its first (not stored) */
#pragma unroll
        for (int mt = 0; mt < MT; mt++) tp[mt] = W + (int64_t)(tile + mt < n_tiles ? tile + mt : tile) * G * GB;
        const uint4 *xrow[NT];
        bool tok_ok[NT];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int tok = tok0 + 8 * nt + g;
            tok_ok[nt] = tok < a.n_rows;
            xrow[nt] = a.xp + (int64_t)(tok_ok[nt] ? tok : 0) * a.x_units;
        }
        auto load = [&](int64_t c, uint4 (&wv)[MT][U][NV], lane_scales (&sc)[MT][U]) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int u = 0; u < U; u++) {
                    if (c + u < c1) {
                        const uint8_t *gp = tp[mt] + (c + u) * GB;
#pragma unroll
                        for (int i = 0; i < NV; i++) wv[mt][u][i] = ld_stream(gp + 16 * (32 * i + lane));
                        if constexpr (C::SB > 0) load_scales<T>(gp + 32 * C::LB, g, sc[mt][u]);
                    }
                }
        };
        /* every (row, token) element sees the same chain whatever MT and NT: per 16-wide k step the
         * mma with the activations' hi, then lo (then the weights' lo), and at a block's end its scale */
        auto multiply = [&](int64_t c, const uint4 (&wv)[MT][U][NV], const lane_scales (&sc)[MT][U]) {
            /* AR: the activation fragments of XU groups x CH k steps, loaded together */
            uint4 xa[AR ? XU : 1][AR ? CH : 1][NT];
            auto fetch = [&](int u0, int s0) {
#pragma unroll
                for (int u = 0; u < XU; u++)
#pragma unroll
                    for (int i = 0; i < CH; i++)
#pragma unroll
                        for (int nt = 0; nt < NT; nt++)
                            xa[u][i][nt] = c + u0 + u < c1 && tok_ok[nt] ? ld_act(xrow[nt] + (c + u0 + u) * (C::KG / 4) + 4 * (s0 + i) + t)
                                                                       : make_uint4(0, 0, 0, 0);
                /* ptxas interleaves loads and mma to save registers, which puts a load's round trip
                 * between mma again: make the first mma's input depend on every load (through a zero
                 * the compiler cannot see: n_rows < 2^31), so that all of them are issued first */
                uint32_t dep = 0;
#pragma unroll
                for (int u = 0; u < XU; u++)
#pragma unroll
                    for (int i = 0; i < CH; i++)
#pragma unroll
                        for (int nt = 0; nt < NT; nt++) dep |= xa[u][i][nt].x;
                xa[0][0][0].x |= dep & ((uint32_t)a.n_rows >> 31);
            };
            if constexpr (AR && XU == U) fetch(0, 0);
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (c + u >= c1) break;
                float blk[MT][NT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) blk[mt][nt][0] = blk[mt][nt][1] = blk[mt][nt][2] = blk[mt][nt][3] = 0.0f;
#pragma unroll
                for (int s = 0; s < STEPS; s++) {
                    if constexpr (AR && XU == 1)
                        if (s % CH == 0) fetch(u, s);
                    uint32_t A[MT][4], Al[MT][4];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        const uint32_t *w = (const uint32_t *)wv[mt][u];
                        if constexpr (is_float<T>()) dsp_cu_frag_f(T, w, s, A[mt], Al[mt]);
                        else dsp_cu_frag_q(T, w, s, A[mt]);
                    }
                    const int64_t ku = (c + u) * (C::KG / 4) + 4 * s + t;
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        uint4 xb;
                        if constexpr (AR) xb = xa[XU == 1 ? 0 : u][s % CH][nt];
                        else xb = tok_ok[nt] ? ld_act(xrow[nt] + ku) : make_uint4(0, 0, 0, 0);
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            if constexpr (is_float<T>() && AR) {
                                mma_ordered(tot[mt][nt], A[mt], xb.x, xb.y);
                                mma_ordered(tot[mt][nt], A[mt], xb.z, xb.w);
                                if constexpr (T != DSP_BF16) mma_ordered(tot[mt][nt], Al[mt], xb.x, xb.y);
                            } else if constexpr (is_float<T>()) {
                                mma(tot[mt][nt], A[mt], xb.x, xb.y);
                                mma(tot[mt][nt], A[mt], xb.z, xb.w);
                                if constexpr (T != DSP_BF16) mma(tot[mt][nt], Al[mt], xb.x, xb.y);
                            } else {
                                mma(blk[mt][nt], A[mt], xb.x, xb.y);
                                mma(blk[mt][nt], A[mt], xb.z, xb.w);
                            }
                        }
                    }
                    if constexpr (BST > 0) {
                        if ((s + 1) % BST == 0) {
                            const int64_t b32 = ((c + u) * C::KG + 16 * s) / 32;
                            float2 xs[NT];
#pragma unroll
                            for (int nt = 0; nt < NT; nt++) {
                                xs[nt] = make_float2(0.0f, 0.0f);
                                if constexpr (has_min<T>()) xs[nt] = *(const float2 *)(a.xsum + b32 * a.xs_stride + tok0 + 8 * nt + 2 * t);
                            }
#pragma unroll
                            for (int mt = 0; mt < MT; mt++) {
                                float mul[2], add[2];
                                block_scale<T>(sc[mt][u], s / BST, mul, add);
#pragma unroll
                                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                                    for (int i = 0; i < 4; i++) {
                                        tot[mt][nt][i] = fmaf(mul[i >> 1], blk[mt][nt][i], tot[mt][nt][i]);
                                        if constexpr (has_min<T>())
                                            tot[mt][nt][i] = fmaf(add[i >> 1], (i & 1) ? xs[nt].y : xs[nt].x, tot[mt][nt][i]);
                                        blk[mt][nt][i] = 0.0f;
                                    }
                            }
                        }
                    }
                }
            }
        };
        uint4 wv[MT][U][NV];
        lane_scales sc[MT][U];
        int64_t c = c0;
        if constexpr (is_float<T>()) {
            /* the first batch's weights are in flight before the wait for the input (PDL);
             * quantized types wait first: the peeled batch costs them registers (occupancy) */
            if (c < c1) load(c, wv, sc);
            dsp_cu_pdl_wait();
            if (c < c1) multiply(c, wv, sc);
            c += U;
        } else {
            dsp_cu_pdl_wait();
        }
        for (; c < c1; c += U) {
            load(c, wv, sc);
            multiply(c, wv, sc);
        }
    }
    if (warp >= S) dsp_cu_pdl_wait(); /* nothing is written before the inputs are final */
    /* the S partial totals of each tile, added in warp order (one tile at a time through red) */
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        if (mt > 0) __syncthreads(); /* the previous tile's sums are read */
        /* c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1) */
        if (warp < S) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    red[(warp * NT * 8 + 8 * nt + 2 * t + (i & 1)) * RED_LD + g + 8 * (i >> 1)] = tot[mt][nt][i];
        }
        __syncthreads();
        for (int idx = threadIdx.x; idx < NT * 8 * 16; idx += blockDim.x) {
            const int tk = idx >> 4, row = idx & 15;
            float v = red[tk * RED_LD + row];
            for (int w2 = 1; w2 < S; w2++) v += red[(w2 * NT * 8 + tk) * RED_LD + row];
            const int tok = tok0 + tk;
            const int64_t orow = (int64_t)(tile + mt) * 16 + row;
            if (tok < a.n_rows && orow < M) Y[(int64_t)tok * M + orow] = v;
        }
    }
}

/* ---- prefill: the same chains over large tiles staged in shared memory --------------------------
 *
 * mm_kernel gives each (16-row tile, token group) CTA all S k-slices of the weight, one warp each,
 * so every warp fetches its activations from L2 for its own 16 rows: at 512 prefill rows the
 * activations cross L2 once per 16 (32 with MT = 2) weight rows. This kernel computes exactly the
 * same chain per output element over a CTA tile of TB_T tiles (128 weight rows) x TB_N tokens: a
 * warp walks the whole k range through shared memory (cp.async, TB_STAGES stages of TB_KC groups)
 * and keeps, per element, the running partial of the current slice (from 0.0f, in group and step
 * order, the mma with the activations' hi, then lo, then the weights' lo) and the total of the
 * finished slices (the first slice's partial, then + each next one: the warp-order sum of
 * mm_kernel's epilogue). Float weights only (no scale blocks). Bit-identical to mm_kernel, hence to
 * a single decode row (test_matmul compares them bitwise). */
constexpr int TB_T = 8, TB_N = 64, TB_KC = 2, TB_STAGES = 3, TB_WARPS = 8;
/* warps: 4 along the rows (2 tiles each) x 2 along the tokens (4 n-tiles each) */

__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_wait1(void) { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

/* an activation unit's place in its (token, group) row of 8: the halves swapped on odd tokens, so
 * that the two tokens a quarter-warp reads (4 units each) fall in different banks */
__device__ __forceinline__ int tb_xpos(int tok, int u) { return u ^ ((tok & 1) << 2); }

template <uint32_t T> constexpr size_t tb_wbytes() { return (size_t)TB_T * TB_KC * 32 * mmt<T>::LB; }
template <uint32_t T> constexpr size_t tb_stage() { return tb_wbytes<T>() + (size_t)TB_N * TB_KC * 8 * 16; }
template <uint32_t T> constexpr size_t tb_smem() { return TB_STAGES * tb_stage<T>(); }

template <uint32_t T>
__global__ void __launch_bounds__(TB_WARPS * 32) mm_tiled_kernel(const mm_args a) {
    using C = mmt<T>;
    static_assert(is_float<T>(), "float weights: one chain, no scale blocks");
    constexpr int STEPS = C::KG / 16, NV = C::LB / 16, GB = 32 * C::LB;
    extern __shared__ __align__(16) uint8_t tsm[];
    const int bx = blockIdx.y;
    const int mi = (a.n_mats > 2 && bx >= a.m[2].tile0) ? 2 : (a.n_mats > 1 && bx >= a.m[1].tile0) ? 1 : 0;
    const uint8_t *W = a.m[mi].w;
    float *Y = a.m[mi].y;
    const int M = a.m[mi].M, S = a.m[mi].S, n_tiles = (M + 15) / 16;
    const int tile0 = TB_T * (bx - a.m[mi].tile0); /* the CTA's first tile */
    const int64_t G = a.n_groups;
    const int tok0 = blockIdx.x * TB_N;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wm = warp & 3, wn = warp >> 2;

    /* stage st (groups st * TB_KC ...) into buffer st % TB_STAGES: weights then activations */
    auto issue_w = [&](int64_t st) {
        uint8_t *dw = tsm + (st % TB_STAGES) * tb_stage<T>();
        for (int i = threadIdx.x; i < TB_T * TB_KC * (GB / 16); i += blockDim.x) {
            const int tl = i / (TB_KC * (GB / 16)), kc = i / (GB / 16) % TB_KC, v = i % (GB / 16);
            const int64_t c = st * TB_KC + kc;
            const bool ok = tile0 + tl < n_tiles && c < G;
            const uint8_t *src = W + ((int64_t)(ok ? tile0 + tl : 0) * G + (ok ? c : 0)) * GB + 16 * v;
            cp_async16(dw + ((size_t)tl * TB_KC + kc) * GB + 16 * v, src, ok);
        }
    };
    auto issue_x = [&](int64_t st) {
        uint8_t *dx = tsm + (st % TB_STAGES) * tb_stage<T>() + tb_wbytes<T>();
        for (int i = threadIdx.x; i < TB_N * TB_KC * 8; i += blockDim.x) {
            const int tk = i / (TB_KC * 8), kc = i / 8 % TB_KC, u = i % 8;
            const int64_t c = st * TB_KC + kc;
            const bool ok = tok0 + tk < a.n_rows && c < G;
            const uint4 *src = a.xp + (int64_t)(ok ? tok0 + tk : 0) * a.x_units + (ok ? c : 0) * (C::KG / 4) + u;
            cp_async16(dx + (((size_t)tk * TB_KC + kc) * 8 + tb_xpos(tk, u)) * 16, src, ok);
        }
    };

    dsp_cu_pdl_launch_dependents();
    const int64_t n_st = (G + TB_KC - 1) / TB_KC;
    issue_w(0);
    if (n_st > 1) issue_w(1);
    dsp_cu_pdl_wait(); /* the activations are final */
    issue_x(0);
    cp_commit();
    if (n_st > 1) issue_x(1);
    cp_commit();

    float p[2][4][4], tot[2][4][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) p[mt][nt][i] = tot[mt][nt][i] = 0.0f;
    int si = 0;                   /* the current slice */
    int64_t send = G / S;         /* its end (mm_kernel's c1 of warp si) */
    for (int64_t st = 0; st < n_st; st++) {
        cp_wait1(); /* this thread's copies of stage st have landed */
        __syncthreads(); /* everyone's have, and stage st - 1's buffer is free */
        if (st + 2 < n_st) {
            issue_w(st + 2);
            issue_x(st + 2);
        }
        cp_commit();
        const uint8_t *sw = tsm + (st % TB_STAGES) * tb_stage<T>();
        const uint4 *sx = (const uint4 *)(sw + tb_wbytes<T>());
#pragma unroll
        for (int kc = 0; kc < TB_KC; kc++) {
            const int64_t c = st * TB_KC + kc;
            if (c >= G) break;
            uint4 wv[2][NV];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int i = 0; i < NV; i++)
                    wv[mt][i] = *(const uint4 *)(sw + ((size_t)(2 * wm + mt) * TB_KC + kc) * GB + 16 * (32 * i + lane));
#pragma unroll
            for (int s = 0; s < STEPS; s++) {
                uint32_t A[2][4], Al[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) dsp_cu_frag_f(T, (const uint32_t *)wv[mt], s, A[mt], Al[mt]);
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    const int tk = 32 * wn + 8 * nt + g;
                    const uint4 xb = sx[((size_t)tk * TB_KC + kc) * 8 + tb_xpos(tk, 4 * s + t)];
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        mma(p[mt][nt], A[mt], xb.x, xb.y);
                        mma(p[mt][nt], A[mt], xb.z, xb.w);
                        if constexpr (T != DSP_BF16) mma(p[mt][nt], Al[mt], xb.x, xb.y);
                    }
                }
            }
            /* the slice(s) ending after group c fold into the total (an empty slice adds its 0) */
            while (si < S && c + 1 == send) {
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int nt = 0; nt < 4; nt++)
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            tot[mt][nt][i] = si == 0 ? p[mt][nt][i] : tot[mt][nt][i] + p[mt][nt][i];
                            p[mt][nt][i] = 0.0f;
                        }
                si++;
                send = (int64_t)(si + 1) * G / S;
            }
        }
    }
    /* c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1): rows of the tile, tokens of the n-tile */
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int tok = tok0 + 32 * wn + 8 * nt + 2 * t + (i & 1);
                const int64_t orow = (int64_t)(tile0 + 2 * wm + mt) * 16 + g + 8 * (i >> 1);
                if (tok < a.n_rows && orow < M) Y[(int64_t)tok * M + orow] = tot[mt][nt][i];
            }
}

/* rows from which float weights take mm_tiled_kernel: 256, or DSP_CUDA_MM_TILED=N (0: never) */
static int tiled_rows(void) {
    static const int v = [] {
        const char *e = getenv("DSP_CUDA_MM_TILED");
        const int n = e ? atoi(e) : 256;
        return n <= 0 ? 1 << 30 : n;
    }();
    return v;
}

template <uint32_t T> cudaError_t launch_tiled(mm_args a, cudaStream_t st) {
    int ctas = 0;
    for (int i = 0; i < a.n_mats; i++) {
        a.m[i].tile0 = ctas;
        ctas += ((a.m[i].M + 15) / 16 + TB_T - 1) / TB_T;
    }
    const dim3 grid((unsigned)((a.n_rows + TB_N - 1) / TB_N), (unsigned)ctas);
    return dsp_cu_launch_pdl(mm_tiled_kernel<T>, grid, dim3(TB_WARPS * 32), tb_smem<T>(), st, a);
}

template <uint32_t T, int NT> size_t mm_smem(int S) { return (size_t)S * NT * 8 * RED_LD * sizeof(float); }

/* Tiles per CTA above 64 rows: 2, or DSP_CUDA_MM_MT=1 (the decode kernel's 1, to compare). The
 * n-tiles of a two-tile CTA: 8 for BF16 and Q8_0 (no or 24 bytes of spills), 4 for the types whose
 * weight fragments take more registers (none spill at 4); Q5_K spills even at 4 and keeps one tile.
 * A CTA of 2 x 16 rows and 4 x 8 tokens still loads each activation fragment for two tiles. */
template <uint32_t T> constexpr int two_tile_nt() { return T == DSP_BF16 || T == DSP_Q8_0 ? 8 : T == DSP_Q5_K ? 0 : 4; }
template <uint32_t T> constexpr bool two_tiles() { return two_tile_nt<T>() > 0; }
static int mm_mt(void) {
    static const int mt = [] {
        const char *e = getenv("DSP_CUDA_MM_MT");
        return e && atoi(e) == 1 ? 1 : 2;
    }();
    return mt;
}

/* Which kernels load a batch's activations ahead (AR; one n-tile for every type, two for float
 * weights): DSP_CUDA_MM_ACTREG bit 0 float weights, bit 1 the quantized ones (default 3; 0: the
 * per-step loads everywhere, to compare). */
static int mm_actreg(void) {
    static const int v = [] {
        const char *e = getenv("DSP_CUDA_MM_ACTREG");
        return e ? atoi(e) : 3;
    }();
    return v;
}

template <uint32_t T>
cudaError_t launch_type(mm_args a, int S_max, cudaStream_t st) {
    if constexpr (is_float<T>())
        if (a.n_rows >= tiled_rows()) return launch_tiled<T>(a, st);
    const int MT = two_tiles<T>() && a.n_rows > 64 ? mm_mt() : 1;
    const int nt = MT == 2 ? two_tile_nt<T>() : a.n_rows <= 8 ? 1 : a.n_rows <= 16 ? 2 : a.n_rows <= 32 ? 4 : 8;
    int ctas = 0; /* tile0 becomes each weight's first CTA of MT tiles */
    for (int i = 0; i < a.n_mats; i++) {
        a.m[i].tile0 = ctas;
        ctas += ((a.m[i].M + 15) / 16 + MT - 1) / MT;
    }
    const dim3 grid((unsigned)((a.n_rows + 8 * nt - 1) / (8 * nt)), (unsigned)ctas);
    const dim3 block((unsigned)(32 * S_max));
    if constexpr (two_tiles<T>())
        if (MT == 2) return dsp_cu_launch_pdl(mm_kernel<T, two_tile_nt<T>(), 2>, grid, block, mm_smem<T, two_tile_nt<T>()>(S_max), st, a);
    if (mm_actreg() & (is_float<T>() ? 1 : 2)) {
        if (nt == 1) return dsp_cu_launch_pdl(mm_kernel<T, 1, 1, true>, grid, block, mm_smem<T, 1>(S_max), st, a);
        if constexpr (is_float<T>()) /* quantized: Q8_0 measured 8% slower at 9 rows (H100) */
            if (nt == 2) return dsp_cu_launch_pdl(mm_kernel<T, 2, 1, true>, grid, block, mm_smem<T, 2>(S_max), st, a);
    }
    switch (nt) {
    case 1: return dsp_cu_launch_pdl(mm_kernel<T, 1, 1>, grid, block, mm_smem<T, 1>(S_max), st, a);
    case 2: return dsp_cu_launch_pdl(mm_kernel<T, 2, 1>, grid, block, mm_smem<T, 2>(S_max), st, a);
    case 4: return dsp_cu_launch_pdl(mm_kernel<T, 4, 1>, grid, block, mm_smem<T, 4>(S_max), st, a);
    default: return dsp_cu_launch_pdl(mm_kernel<T, 8, 1>, grid, block, mm_smem<T, 8>(S_max), st, a);
    }
}

cudaError_t launch(uint32_t type, const mm_args &a, int S_max, cudaStream_t st) {
    switch (type) {
    case DSP_BF16: return launch_type<DSP_BF16>(a, S_max, st);
    case DSP_F16: return launch_type<DSP_F16>(a, S_max, st);
    case DSP_F32: return launch_type<DSP_F32>(a, S_max, st);
    case DSP_Q8_0: return launch_type<DSP_Q8_0>(a, S_max, st);
    case DSP_Q4_0: return launch_type<DSP_Q4_0>(a, S_max, st);
    case DSP_Q4_1: return launch_type<DSP_Q4_1>(a, S_max, st);
    case DSP_Q4_K: return launch_type<DSP_Q4_K>(a, S_max, st);
    case DSP_Q5_K: return launch_type<DSP_Q5_K>(a, S_max, st);
    case DSP_Q6_K: return launch_type<DSP_Q6_K>(a, S_max, st);
    default: return cudaErrorInvalidValue;
    }
}

/* ---- repacking and activations ----------------------------------------------------------------- */

__global__ void repack_kernel(dsp_cu_layout L, const uint8_t *raw, size_t row_bytes, int64_t M, int64_t K, int64_t n_groups,
                              int64_t n_units, uint8_t *out) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_units * 32) return;
    const int64_t unit = i / 32, tile = unit / n_groups, group = unit % n_groups;
    const int lane = (int)(i % 32);
    uint8_t *base = out + unit * dsp_cu_group_bytes(&L);
    uint8_t chunk[DSP_CU_MAX_LANE_BYTES];
    dsp_cu_pack_lane(&L, raw, row_bytes, M, K, tile, group, lane, chunk);
    dsp_cu_put_lane(&L, base, lane, chunk);
    if (lane == 0) dsp_cu_pack_scales(&L, raw, row_bytes, M, K, tile, group, base + 32 * L.lane_bytes);
}

} // namespace

int dsp_cu_mm_slices(const dsp_cu_layout *L, int64_t M, int64_t K) {
    /* enough warps in flight to stream a small matrix without splitting k into slivers of less
     * than two groups: each warp's chain of dependent load batches must stay short */
    const int64_t tiles = dsp_cu_n_tiles(M), groups = dsp_cu_n_groups(L, K);
    int64_t s = (4096 + tiles - 1) / tiles;
    const int max_s = dsp_cu_block_steps(L->type) ? MAX_S / 2 : MAX_S; /* as max_slices */
    if (s > max_s) s = max_s;
    if (s > groups / 2) s = groups / 2;
    return s < 1 ? 1 : (int)s;
}

template <uint32_t T> cudaError_t mm_init_type() {
    cudaError_t e = cudaSuccess;
    e = e ? e : cudaFuncSetAttribute(mm_kernel<T, 1, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)mm_smem<T, 1>(max_slices<T>()));
    e = e ? e : cudaFuncSetAttribute(mm_kernel<T, 2, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)mm_smem<T, 2>(max_slices<T>()));
    e = e ? e : cudaFuncSetAttribute(mm_kernel<T, 4, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)mm_smem<T, 4>(max_slices<T>()));
    e = e ? e : cudaFuncSetAttribute(mm_kernel<T, 8, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)mm_smem<T, 8>(max_slices<T>()));
    if constexpr (is_float<T>())
        e = e ? e : cudaFuncSetAttribute(mm_tiled_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tb_smem<T>());
    if constexpr (two_tiles<T>())
        e = e ? e : cudaFuncSetAttribute(mm_kernel<T, two_tile_nt<T>(), 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)mm_smem<T, two_tile_nt<T>()>(max_slices<T>()));
    return e;
}

/* the shared memory of the widest CTA (MAX_S warps, 64 tokens) exceeds the default 48 KB */
cudaError_t dsp_cu_mm_init(void) {
    cudaError_t e = mm_init_type<DSP_BF16>();
    e = e ? e : mm_init_type<DSP_F16>();
    e = e ? e : mm_init_type<DSP_F32>();
    e = e ? e : mm_init_type<DSP_Q8_0>();
    e = e ? e : mm_init_type<DSP_Q4_0>();
    e = e ? e : mm_init_type<DSP_Q4_1>();
    e = e ? e : mm_init_type<DSP_Q4_K>();
    e = e ? e : mm_init_type<DSP_Q5_K>();
    return e ? e : mm_init_type<DSP_Q6_K>();
}

cudaError_t dsp_cu_repack(const dsp_cu_mat *m, const uint8_t *raw, size_t row_bytes, cudaStream_t st) {
    const int64_t units = m->n_tiles * m->n_groups, threads = units * 32;
    repack_kernel<<<(unsigned)((threads + 255) / 256), 256, 0, st>>>(m->L, raw, row_bytes, m->M, m->K, m->n_groups, units, m->d);
    return cudaGetLastError();
}

cudaError_t dsp_cu_matmul(int n, const dsp_cu_mat *const *w, float *const *y, int n_rows, const dsp_cu_xpack *xb,
                          cudaStream_t st) {
    /* one launch per run of consecutive weights of the same type */
    for (int i = 0; i < n;) {
        mm_args a = {};
        int S_max = 1;
        a.n_groups = w[i]->n_groups;
        a.x_units = dsp_cu_x_units(w[i]->K);
        a.xs_stride = xb->xs_stride;
        a.xp = xb->xp;
        a.xsum = xb->xsum;
        a.n_rows = n_rows;
        int j = i;
        for (; j < n && w[j]->L.type == w[i]->L.type; j++) {
            mm_mat_arg &m = a.m[a.n_mats++];
            m.w = w[j]->d, m.y = y[j], m.M = (int)w[j]->M, m.S = w[j]->S; /* tile0: launch_type */
            if (m.S > S_max) S_max = m.S;
        }
        cudaError_t e = launch(w[i]->L.type, a, S_max, st);
        if (e != cudaSuccess) return e;
        i = j;
    }
    return cudaSuccess;
}

