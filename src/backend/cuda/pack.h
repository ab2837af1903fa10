/* backend/cuda/pack: the GPU layouts ("packed" formats) of weight matrices for the CUDA matmul
 * kernels, shared by host C (tests, sizes) and device code (the repack kernel, the matmul kernels).
 *
 * The kernels multiply on the tensor cores with mma.m16n8k16 (bf16 in, f32 accumulate): a 16-row
 * tile of the weight matrix is operand A, 8 activation rows (tokens) are operand B. In that
 * instruction lane l = 4g + t (g = l / 4, t = l % 4) holds, for one 16-wide k step, the A elements
 * (row g and row g+8) x (logical k 2t, 2t+1, 2t+8, 2t+9). Any permutation of k that A and B share
 * leaves the dot product unchanged, so we map logical k (2t, 2t+1, 2t+8, 2t+9) to physical k
 * (4t, 4t+1, 4t+2, 4t+3) of the step: then each lane needs 4 *consecutive* weights of rows g and
 * g+8, and 4 consecutive activations of its token. Its four A registers are
 *     a0 = (W[g][k0], W[g][k1])   a1 = (W[g+8][k0], W[g+8][k1])
 *     a2 = (W[g][k2], W[g][k3])   a3 = (W[g+8][k2], W[g+8][k3])     kj = 16*step + 4t + j
 * (first element in the low half). The packed layout stores exactly what each lane loads, so each
 * of a warp's 16-byte loads reads 512 consecutive bytes:
 *
 *   matrix = n_tiles (ceil(M/16)) x n_groups (ceil(K/kg)) groups of group_bytes, tile-major;
 *   group  = 32 lane chunks of lane_bytes, interleaved by 16-byte vector: vector v of lane l at
 *            16 (32 v + l) (dsp_cu_lane_at), then scale_bytes of per-row scales of the tile.
 *   Rows past M and columns past K are zero (they contribute nothing).
 *
 * Quantized types feed their integer codes to the tensor cores (exact in bf16: |q| < 128) and apply
 * each block's scale (and min) to the block's f32 partial sum afterwards, so nothing is rounded
 * that the reference does not round. Per lane, per 16-wide step (u32 "code words"):
 *   BF16, F16  words 4s+r = a_r as above (raw 16-bit values)                 kg 32, 32 B/lane
 *   F32        words 8s+2r+e = element e of a_r (raw f32)                      kg 32, 64 B/lane
 *   Q8_0       bytes of words 2s, 2s+1: (g,k0) (g,k1) (g+8,k0) (g+8,k1) | (g,k2) (g,k3) (g+8,k2) (g+8,k3)
 *   4-bit      word s: element e of a_r is the nibble at bit 4r + 16e (so a_r = (w >> 4r) & 0x000F000F)
 *              Q4_0, Q4_1 (kg 64), Q4_K (kg 256); Q5_K and Q6_K keep their low 4 bits so too
 *   Q5_K       + words 16 + s/4: the fifth bit of element e of a_r at bit 4r + s%4 + 16e
 *   Q6_K       + words 16 + s/2: the top 2 bits of element e of a_r at bits 4r + 2(s%2) + 16e
 * Scales, per group (rows g, g+8 next to each other, f16 as uint16):
 *   Q8_0, Q4_0 per 32-block b: 32 B at 32b: for g < 8: d[g], d[g+8]
 *   Q4_1       per 32-block b: 64 B at 64b: for g < 8: d[g], d[g+8], m[g], m[g+8]
 *   Q4_K, Q5_K 64 B: for g < 8: d[g], dmin[g], d[g+8], dmin[g+8]; then 16 B per row: sc[8], m[8]
 *              (the 6-bit scales and mins unpacked to bytes)
 *   Q6_K       64 B: for g < 8: d[g], 0, d[g+8], 0; then 16 B per row: the 16 int8 sub-block scales
 *
 * dsp_cu_packed_elem decodes one element with the same float operations as core/quant.c, so a
 * packed matrix dequantizes bit-exactly (embedding lookups use it; tests compare it with
 * dsp_dequantize_row). */
#ifndef DSP_BACKEND_CUDA_PACK_H
#define DSP_BACKEND_CUDA_PACK_H

#ifdef __cplusplus
extern "C" {
#include "core/dtype.h"
}
#else
#include "core/dtype.h"
#endif

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define DSP_HD static inline __host__ __device__
#else
#define DSP_HD static inline
#endif

#define DSP_CU_TILE 16 /* weight rows per tile */

typedef struct dsp_cu_layout {
    uint32_t type;   /* dsp_dtype */
    int kg;          /* k elements per group */
    int lane_bytes;  /* bytes per lane per group */
    int scale_bytes; /* bytes of scales per tile per group */
} dsp_cu_layout;

/* The layout of a weight type; false if the CUDA backend cannot multiply with it. */
DSP_HD bool dsp_cu_layout_of(uint32_t type, dsp_cu_layout *L) {
    int kg, lb, sb;
    switch (type) {
    case DSP_BF16: case DSP_F16: kg = 32, lb = 32, sb = 0; break;
    case DSP_F32: kg = 32, lb = 64, sb = 0; break;
    case DSP_Q8_0: kg = 32, lb = 16, sb = 32; break;
    case DSP_Q4_0: kg = 64, lb = 16, sb = 64; break;
    case DSP_Q4_1: kg = 64, lb = 16, sb = 128; break;
    case DSP_Q4_K: kg = 256, lb = 64, sb = 320; break;
    case DSP_Q5_K: kg = 256, lb = 80, sb = 320; break;
    case DSP_Q6_K: kg = 256, lb = 96, sb = 320; break;
    default: return false;
    }
    L->type = type, L->kg = kg, L->lane_bytes = lb, L->scale_bytes = sb;
    return true;
}

DSP_HD int64_t dsp_cu_group_bytes(const dsp_cu_layout *L) { return 32 * (int64_t)L->lane_bytes + L->scale_bytes; }
/* offset in its group of byte `byte` of lane `lane`'s chunk (lane_bytes is a multiple of 16) */
DSP_HD int dsp_cu_lane_at(int lane, int byte) { return 16 * (32 * (byte / 16) + lane) + byte % 16; }
/* lane `lane`'s chunk between a contiguous buffer and its place in a group */
DSP_HD void dsp_cu_put_lane(const dsp_cu_layout *L, uint8_t *group, int lane, const uint8_t *chunk) {
    for (int i = 0; i < L->lane_bytes; i++) group[dsp_cu_lane_at(lane, i)] = chunk[i];
}
DSP_HD void dsp_cu_get_lane(const dsp_cu_layout *L, const uint8_t *group, int lane, uint8_t *chunk) {
    for (int i = 0; i < L->lane_bytes; i++) chunk[i] = group[dsp_cu_lane_at(lane, i)];
}
#define DSP_CU_MAX_LANE_BYTES 96
DSP_HD int64_t dsp_cu_n_tiles(int64_t M) { return (M + DSP_CU_TILE - 1) / DSP_CU_TILE; }
DSP_HD int64_t dsp_cu_n_groups(const dsp_cu_layout *L, int64_t K) { return (K + L->kg - 1) / L->kg; }
/* bytes of a packed M x K matrix (0 on overflow) */
DSP_HD uint64_t dsp_cu_packed_bytes(const dsp_cu_layout *L, int64_t M, int64_t K) {
    uint64_t units = (uint64_t)dsp_cu_n_tiles(M) * (uint64_t)dsp_cu_n_groups(L, K);
    uint64_t gb = (uint64_t)dsp_cu_group_bytes(L);
    return units > UINT64_MAX / gb ? 0 : units * gb;
}

/* ---- small helpers (host and device) ------------------------------------------------------- */

DSP_HD uint16_t dsp_cu_ld16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
DSP_HD uint32_t dsp_cu_ld32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
DSP_HD void dsp_cu_st16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
DSP_HD void dsp_cu_st32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}
DSP_HD float dsp_cu_bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}
DSP_HD uint32_t dsp_cu_f32_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}
DSP_HD float dsp_cu_f16(uint16_t h) {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(h));
#else
    return dsp_f16_to_f32(h);
#endif
}
DSP_HD float dsp_cu_bf16(uint16_t b) { return dsp_cu_bits_f32((uint32_t)b << 16); }
/* f32 -> bf16, round to nearest even (NaN stays NaN) */
DSP_HD uint16_t dsp_cu_to_bf16(float f) {
#if defined(__CUDA_ARCH__)
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
    uint32_t u = dsp_cu_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
#endif
}

/* 6-bit scale and min of sub-block j of a Q4_K/Q5_K block (as dsp_quant_scale_min_k4) */
DSP_HD void dsp_cu_scale_min_k4(const uint8_t *q, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* ---- the raw (GGUF) side: element codes and scales -------------------------------------------- */

/* Code of element k of a raw row: the raw 16/32 bits for float types, the integer q (as stored,
 * before offsets such as -8) for quantized ones. */
DSP_HD uint32_t dsp_cu_raw_code(uint32_t type, const uint8_t *row, int64_t k) {
    switch (type) {
    case DSP_BF16: case DSP_F16: return dsp_cu_ld16(row + 2 * k);
    case DSP_F32: return dsp_cu_ld32(row + 4 * k);
    case DSP_Q8_0: return row[(k / 32) * 34 + 2 + k % 32]; /* int8 bits */
    case DSP_Q4_0: case DSP_Q4_1: {
        const uint8_t *qs = row + (k / 32) * (type == DSP_Q4_0 ? 18 : 20) + (type == DSP_Q4_0 ? 2 : 4);
        int j = (int)(k % 32);
        return j < 16 ? qs[j] & 15u : (uint32_t)qs[j - 16] >> 4;
    }
    case DSP_Q4_K: case DSP_Q5_K: {
        const uint8_t *b = row + (k / 256) * (type == DSP_Q4_K ? 144 : 176);
        int i = (int)(k % 256), j = i / 32, l = i % 32;
        const uint8_t *qs = b + (type == DSP_Q4_K ? 16 : 48);
        uint32_t q = ((uint32_t)qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15u;
        if (type == DSP_Q5_K) q |= (((uint32_t)b[16 + l] >> j) & 1u) << 4;
        return q;
    }
    case DSP_Q6_K: {
        const uint8_t *b = row + (k / 256) * 210;
        int i = (int)(k % 256), h = i / 128, r = i % 128;
        uint32_t lo = ((uint32_t)b[64 * h + r % 64] >> (4 * (r / 64))) & 15u;
        uint32_t hi = ((uint32_t)b[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 3u;
        return lo | hi << 4;
    }
    default: return 0;
    }
}

/* Code of element (r, k) of a raw M x K matrix, 0 past its edges. */
DSP_HD uint32_t dsp_cu_code_at(uint32_t type, const uint8_t *raw, size_t row_bytes, int64_t M, int64_t K, int64_t r,
                               int64_t k) {
    if (r >= M || k >= K) return 0;
    return dsp_cu_raw_code(type, raw + (size_t)r * row_bytes, k);
}

/* ---- packing (one lane chunk, or the scales of one group) ----------------------------------- */

/* The lane_bytes of lane `lane` of group `group` of tile `tile`. */
DSP_HD void dsp_cu_pack_lane(const dsp_cu_layout *L, const uint8_t *raw, size_t row_bytes, int64_t M, int64_t K,
                             int64_t tile, int64_t group, int lane, uint8_t *out) {
    const uint32_t type = L->type;
    const int g = lane >> 2, t = lane & 3, steps = L->kg / 16;
    const int64_t r0 = tile * DSP_CU_TILE + g, k00 = group * L->kg + 4 * t;
    for (int i = 0; i < L->lane_bytes; i++) out[i] = 0;
    for (int s = 0; s < steps; s++) {
        const int64_t kb = k00 + 16 * s;
        for (int r = 0; r < 4; r++) {
            const int64_t row = r0 + 8 * (r & 1);
            for (int e = 0; e < 2; e++) {
                const int64_t k = kb + 2 * (r >> 1) + e;
                uint32_t c = dsp_cu_code_at(type, raw, row_bytes, M, K, row, k);
                switch (type) {
                case DSP_BF16: case DSP_F16: dsp_cu_st16(out + 4 * (4 * s + r) + 2 * e, (uint16_t)c); break;
                case DSP_F32: dsp_cu_st32(out + 4 * (8 * s + 2 * r + e), c); break;
                case DSP_Q8_0: out[4 * (2 * s + (r >> 1)) + 2 * (r & 1) + e] = (uint8_t)c; break;
                default: { /* 4-bit codes plus the high bits of Q5_K / Q6_K */
                    uint8_t *w = out + 4 * s;
                    uint32_t v = dsp_cu_ld32(w) | (c & 15u) << (4 * r + 16 * e);
                    dsp_cu_st32(w, v);
                    if (type == DSP_Q5_K) {
                        uint8_t *hw = out + 64 + 4 * (s / 4);
                        dsp_cu_st32(hw, dsp_cu_ld32(hw) | ((c >> 4) & 1u) << (4 * r + s % 4 + 16 * e));
                    } else if (type == DSP_Q6_K) {
                        uint8_t *hw = out + 64 + 4 * (s / 2);
                        dsp_cu_st32(hw, dsp_cu_ld32(hw) | ((c >> 4) & 3u) << (4 * r + 2 * (s % 2) + 16 * e));
                    }
                }
                }
            }
        }
    }
}

/* The scale_bytes of group `group` of tile `tile` (nothing for float types). */
DSP_HD void dsp_cu_pack_scales(const dsp_cu_layout *L, const uint8_t *raw, size_t row_bytes, int64_t M, int64_t K,
                               int64_t tile, int64_t group, uint8_t *out) {
    const uint32_t type = L->type;
    for (int i = 0; i < L->scale_bytes; i++) out[i] = 0;
    for (int rr = 0; rr < DSP_CU_TILE; rr++) {
        const int64_t row = tile * DSP_CU_TILE + rr;
        const int g = rr & 7, h = rr >> 3;
        if (row >= M) continue;
        const uint8_t *rp = raw + (size_t)row * row_bytes;
        switch (type) {
        case DSP_Q8_0: case DSP_Q4_0: case DSP_Q4_1: {
            const int bs = type == DSP_Q8_0 ? 34 : type == DSP_Q4_0 ? 18 : 20, per = L->kg / 32;
            const int stride = type == DSP_Q4_1 ? 64 : 32, w = type == DSP_Q4_1 ? 8 : 4;
            for (int b = 0; b < per; b++) {
                const int64_t blk = group * per + b;
                if (blk * 32 >= K) break;
                const uint8_t *bp = rp + blk * bs;
                dsp_cu_st16(out + stride * b + w * g + 2 * h, dsp_cu_ld16(bp));
                if (type == DSP_Q4_1) dsp_cu_st16(out + stride * b + w * g + 4 + 2 * h, dsp_cu_ld16(bp + 2));
            }
            break;
        }
        case DSP_Q4_K: case DSP_Q5_K: {
            if (group * 256 >= K) break;
            const uint8_t *bp = rp + group * (type == DSP_Q4_K ? 144 : 176);
            dsp_cu_st16(out + 8 * g + 4 * h, dsp_cu_ld16(bp));
            dsp_cu_st16(out + 8 * g + 4 * h + 2, dsp_cu_ld16(bp + 2));
            for (int j = 0; j < 8; j++) {
                int sc, m;
                dsp_cu_scale_min_k4(bp + 4, j, &sc, &m);
                out[64 + 16 * rr + j] = (uint8_t)sc;
                out[64 + 16 * rr + 8 + j] = (uint8_t)m;
            }
            break;
        }
        case DSP_Q6_K: {
            if (group * 256 >= K) break;
            const uint8_t *bp = rp + group * 210;
            dsp_cu_st16(out + 8 * g + 4 * h, dsp_cu_ld16(bp + 208));
            for (int j = 0; j < 16; j++) out[64 + 16 * rr + j] = bp[192 + j];
            break;
        }
        default: break;
        }
    }
}

/* ---- decoding one element of a packed matrix (bit-exact with core/quant.c) ------------------ */

DSP_HD float dsp_cu_packed_elem(const dsp_cu_layout *L, const uint8_t *packed, int64_t n_groups, int64_t r, int64_t k) {
    const int64_t tile = r / DSP_CU_TILE, group = k / L->kg;
    const int rr = (int)(r % DSP_CU_TILE), g = rr & 7, h = rr >> 3;
    const int kk = (int)(k % L->kg), s = kk / 16, q16 = kk % 16, t = q16 / 4, j = q16 % 4;
    const int reg = h + 2 * (j >> 1), e = j & 1;
    const uint8_t *base = packed + (tile * n_groups + group) * dsp_cu_group_bytes(L);
    const uint8_t *sc = base + 32 * L->lane_bytes;
    uint8_t lp[DSP_CU_MAX_LANE_BYTES]; /* the lane's chunk, gathered (embedding rows only: not hot) */
    dsp_cu_get_lane(L, base, 4 * g + t, lp);
    switch (L->type) {
    case DSP_BF16: return dsp_cu_bf16(dsp_cu_ld16(lp + 4 * (4 * s + reg) + 2 * e));
    case DSP_F16: return dsp_cu_f16(dsp_cu_ld16(lp + 4 * (4 * s + reg) + 2 * e));
    case DSP_F32: return dsp_cu_bits_f32(dsp_cu_ld32(lp + 4 * (8 * s + 2 * reg + e)));
    case DSP_Q8_0: {
        int8_t q = (int8_t)lp[4 * (2 * s + (reg >> 1)) + 2 * (reg & 1) + e];
        return (float)q * dsp_cu_f16(dsp_cu_ld16(sc + 4 * g + 2 * h));
    }
    default: break;
    }
    const int nib = (int)((dsp_cu_ld32(lp + 4 * s) >> (4 * reg + 16 * e)) & 15u);
    switch (L->type) {
    case DSP_Q4_0: {
        const int b = s / 2;
        return dsp_cu_f16(dsp_cu_ld16(sc + 32 * b + 4 * g + 2 * h)) * (float)(nib - 8);
    }
    case DSP_Q4_1: {
        const int b = s / 2;
        const float d = dsp_cu_f16(dsp_cu_ld16(sc + 64 * b + 8 * g + 2 * h));
        const float m = dsp_cu_f16(dsp_cu_ld16(sc + 64 * b + 8 * g + 4 + 2 * h));
        return d * (float)nib + m;
    }
    case DSP_Q4_K: case DSP_Q5_K: {
        int q = nib;
        if (L->type == DSP_Q5_K) q |= (int)((dsp_cu_ld32(lp + 64 + 4 * (s / 4)) >> (4 * reg + s % 4 + 16 * e)) & 1u) << 4;
        const int sub = s / 2;
        const float d = dsp_cu_f16(dsp_cu_ld16(sc + 8 * g + 4 * h)), dmin = dsp_cu_f16(dsp_cu_ld16(sc + 8 * g + 4 * h + 2));
        const float dj = d * (float)sc[64 + 16 * rr + sub], mj = dmin * (float)sc[64 + 16 * rr + 8 + sub];
        return dj * (float)q - mj;
    }
    case DSP_Q6_K: {
        int q = nib | (int)((dsp_cu_ld32(lp + 64 + 4 * (s / 2)) >> (4 * reg + 2 * (s % 2) + 16 * e)) & 3u) << 4;
        const float d = dsp_cu_f16(dsp_cu_ld16(sc + 8 * g + 4 * h));
        const float ds = d * (float)(int8_t)sc[64 + 16 * rr + s];
        return ds * (float)(q - 32);
    }
    default: return 0;
    }
}

/* ---- activations: the B operand ------------------------------------------------------------- */

/* Activations x (f32) enter the tensor cores as two bf16 terms, hi = bf16(x) and lo = bf16(x - hi),
 * which carry 16 significant bits; each product is summed as W*hi then W*lo. Per token, 4
 * consecutive k make one 16-byte unit {hi(k0),hi(k1) | hi(k2),hi(k3) | lo(k0),lo(k1) | lo(k2),lo(k3)},
 * i.e. the B registers b0b1, b2b3 of the hi and of the lo product. The packed row of a token has
 * dsp_cu_x_units(K) units (zero past K). */
DSP_HD int64_t dsp_cu_x_units(int64_t K) { return (K + 255) / 256 * 64; }

DSP_HD void dsp_cu_x_unit(const float *x, int64_t K, int64_t u, uint32_t out[4]) {
    uint16_t hi[4], lo[4];
    for (int j = 0; j < 4; j++) {
        const int64_t k = 4 * u + j;
        const float v = k < K ? x[k] : 0.0f;
        hi[j] = dsp_cu_to_bf16(v);
        lo[j] = dsp_cu_to_bf16(v - dsp_cu_bf16(hi[j]));
    }
    out[0] = hi[0] | (uint32_t)hi[1] << 16, out[1] = hi[2] | (uint32_t)hi[3] << 16;
    out[2] = lo[0] | (uint32_t)lo[1] << 16, out[3] = lo[2] | (uint32_t)lo[3] << 16;
}

#endif
