/* backend/cuda/frag: decoding a lane's packed words (pack.h) into mma.m16n8k16 A registers.
 *
 * Shared by the matmul kernels and the host test that emulates a warp (tests/test_cuda_pack.c),
 * so the fragment indexing is checked on machines without a GPU too.
 *
 * Integer codes become bf16 values without a conversion instruction: a code c < 128 placed in the
 * mantissa of bf16(128) (0x4300 | c) is the bf16 number 128 + c; subtracting 128 + offset (exact)
 * gives c - offset. Two codes sit in one register (low half first), so per register that is one
 * shift, one LOP3 and one bf16x2 subtraction. Float weights enter as bf16 (BF16 exactly) or as two
 * bf16 terms hi + lo (F16 exactly; F32 to 16 significant bits). */
#ifndef DSP_BACKEND_CUDA_FRAG_H
#define DSP_BACKEND_CUDA_FRAG_H

#include "backend/cuda/pack.h"

/* bf16x2 a - b; on the host exact only when the difference is (as here, integers < 256) */
DSP_HD uint32_t dsp_cu_bf2_sub(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
    __nv_bfloat162 x = *(const __nv_bfloat162 *)&a, y = *(const __nv_bfloat162 *)&b;
    __nv_bfloat162 r = __hsub2(x, y);
    return *(const uint32_t *)&r;
#else
    uint16_t lo = dsp_cu_to_bf16(dsp_cu_bf16((uint16_t)a) - dsp_cu_bf16((uint16_t)b));
    uint16_t hi = dsp_cu_to_bf16(dsp_cu_bf16((uint16_t)(a >> 16)) - dsp_cu_bf16((uint16_t)(b >> 16)));
    return lo | (uint32_t)hi << 16;
#endif
}

/* two floats -> bf16x2 (round to nearest even), first in the low half */
DSP_HD uint32_t dsp_cu_bf2_pack(float a, float b) {
#if defined(__CUDA_ARCH__)
    __nv_bfloat162 r = __floats2bfloat162_rn(a, b);
    return *(const uint32_t *)&r;
#else
    return dsp_cu_to_bf16(a) | (uint32_t)dsp_cu_to_bf16(b) << 16;
#endif
}

/* the bf16x2 value (128 + off, 128 + off) subtracted from (0x4300 | code) pairs */
DSP_HD uint32_t dsp_cu_magic(uint32_t type) {
    switch (type) {
    case DSP_Q4_0: return 0x43084308u; /* 136: q - 8 */
    case DSP_Q6_K: return 0x43204320u; /* 160: q - 32 */
    default: return 0x43004300u;       /* 128: q */
    }
}

/* A registers of 16-wide step s (within the group) of a quantized type, from the lane's words w */
DSP_HD void dsp_cu_frag_q(uint32_t type, const uint32_t *w, int s, uint32_t a[4]) {
    if (type == DSP_Q8_0) {
        for (int r = 0; r < 4; r++) {
            const uint32_t v = w[2 * s + (r >> 1)] >> (16 * (r & 1));
            a[r] = dsp_cu_bf2_pack((float)(int8_t)(v & 0xff), (float)(int8_t)((v >> 8) & 0xff));
        }
        return;
    }
    const uint32_t magic = dsp_cu_magic(type);
    for (int r = 0; r < 4; r++) {
        uint32_t v = (w[s] >> (4 * r)) & 0x000F000Fu;
        if (type == DSP_Q5_K) v |= ((w[16 + s / 4] >> (4 * r + s % 4)) & 0x00010001u) << 4;
        if (type == DSP_Q6_K) v |= ((w[16 + s / 2] >> (4 * r + 2 * (s % 2))) & 0x00030003u) << 4;
        a[r] = dsp_cu_bf2_sub(v | 0x43004300u, magic);
    }
}

/* hi = bf16(x), lo = bf16(x - hi) for two values, as bf16x2 registers */
DSP_HD void dsp_cu_split2(float x0, float x1, uint32_t *hi, uint32_t *lo) {
    *hi = dsp_cu_bf2_pack(x0, x1);
    *lo = dsp_cu_bf2_pack(x0 - dsp_cu_bf16((uint16_t)*hi), x1 - dsp_cu_bf16((uint16_t)(*hi >> 16)));
}

/* A registers of step s of a float type: hi (and lo for F16/F32; BF16 leaves lo untouched) */
DSP_HD void dsp_cu_frag_f(uint32_t type, const uint32_t *w, int s, uint32_t hi[4], uint32_t lo[4]) {
    for (int r = 0; r < 4; r++) {
        if (type == DSP_BF16) {
            hi[r] = w[4 * s + r];
        } else if (type == DSP_F16) {
            const uint32_t v = w[4 * s + r];
            dsp_cu_split2(dsp_cu_f16((uint16_t)v), dsp_cu_f16((uint16_t)(v >> 16)), &hi[r], &lo[r]);
        } else { /* F32 */
            dsp_cu_split2(dsp_cu_bits_f32(w[8 * s + 2 * r]), dsp_cu_bits_f32(w[8 * s + 2 * r + 1]), &hi[r], &lo[r]);
        }
    }
}

/* Per-row factors of the partial sum of block `blk` of a group (rows g and g+8 = index h):
 * result += mul[h] * partial + add[h] * (sum of the block's activations). blk counts the scale
 * blocks of the group: 32-wide for Q8_0/Q4_0/Q4_1/Q4_K/Q5_K, 16-wide for Q6_K. */
DSP_HD void dsp_cu_block_scale(uint32_t type, const uint8_t *sc, int g, int blk, float mul[2], float add[2]) {
    for (int h = 0; h < 2; h++) {
        const int rr = g + 8 * h;
        add[h] = 0.0f;
        switch (type) {
        case DSP_Q8_0: case DSP_Q4_0: mul[h] = dsp_cu_f16(dsp_cu_ld16(sc + 32 * blk + 4 * g + 2 * h)); break;
        case DSP_Q4_1:
            mul[h] = dsp_cu_f16(dsp_cu_ld16(sc + 64 * blk + 8 * g + 2 * h));
            add[h] = dsp_cu_f16(dsp_cu_ld16(sc + 64 * blk + 8 * g + 4 + 2 * h));
            break;
        case DSP_Q4_K: case DSP_Q5_K: {
            const float d = dsp_cu_f16(dsp_cu_ld16(sc + 8 * g + 4 * h)), dmin = dsp_cu_f16(dsp_cu_ld16(sc + 8 * g + 4 * h + 2));
            mul[h] = d * (float)sc[64 + 16 * rr + blk];
            add[h] = -(dmin * (float)sc[64 + 16 * rr + 8 + blk]);
            break;
        }
        case DSP_Q6_K: mul[h] = dsp_cu_f16(dsp_cu_ld16(sc + 8 * g + 4 * h)) * (float)(int8_t)sc[64 + 16 * rr + blk]; break;
        default: mul[h] = 1.0f; break;
        }
    }
}

/* 16-wide steps per scale block (0: float types, one chain over the whole k range) */
DSP_HD int dsp_cu_block_steps(uint32_t type) {
    switch (type) {
    case DSP_BF16: case DSP_F16: case DSP_F32: return 0;
    case DSP_Q6_K: return 1;
    default: return 2;
    }
}

#endif
