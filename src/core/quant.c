/* core/quant: scalar reference dequantization (see quant.h for the layouts and the bit-exactness
 * contract). Each function handles whole blocks; the float expressions mirror gguf-py's numpy
 * code operation by operation, so do not "simplify" them (e.g. (d * sc) * q is not d * (sc * q)). */
#include "core/quant.h"

#include <math.h>
#include <string.h>

/* Every layout must match the block sizes of the dtype table (and so the GGUF files). */
_Static_assert(sizeof(dsp_block_q4_0) == 18, "q4_0 block size");
_Static_assert(sizeof(dsp_block_q4_1) == 20, "q4_1 block size");
_Static_assert(sizeof(dsp_block_q5_0) == 22, "q5_0 block size");
_Static_assert(sizeof(dsp_block_q5_1) == 24, "q5_1 block size");
_Static_assert(sizeof(dsp_block_q8_0) == 34, "q8_0 block size");
_Static_assert(sizeof(dsp_block_q2_K) == 84, "q2_K block size");
_Static_assert(sizeof(dsp_block_q3_K) == 110, "q3_K block size");
_Static_assert(sizeof(dsp_block_q4_K) == 144, "q4_K block size");
_Static_assert(sizeof(dsp_block_q5_K) == 176, "q5_K block size");
_Static_assert(sizeof(dsp_block_q6_K) == 210, "q6_K block size");
_Static_assert(sizeof(dsp_block_q8_K) == 292, "q8_K block size");

static float f16(uint16_t h) { return dsp_f16_to_f32(h); }

static void deq_f32(const uint8_t *src, float *y, uint64_t n) { memcpy(y, src, n * sizeof(float)); }

static void deq_f16(const uint8_t *src, float *y, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        y[i] = dsp_f16_to_f32(h);
    }
}

static void deq_bf16(const uint8_t *src, float *y, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        y[i] = dsp_bf16_to_f32(h);
    }
}

static void deq_q4_0(const uint8_t *src, float *y, uint64_t nb) {
    for (uint64_t b = 0; b < nb; b++, y += DSP_QK) {
        dsp_block_q4_0 x;
        memcpy(&x, src + b * sizeof x, sizeof x);
        const float d = f16(x.d);
        for (int j = 0; j < DSP_QK / 2; j++) {
            y[j] = d * (float)((x.qs[j] & 0xF) - 8);
            y[j + DSP_QK / 2] = d * (float)((x.qs[j] >> 4) - 8);
        }
    }
}

static void deq_q4_1(const uint8_t *src, float *y, uint64_t nb) {
    for (uint64_t b = 0; b < nb; b++, y += DSP_QK) {
        dsp_block_q4_1 x;
        memcpy(&x, src + b * sizeof x, sizeof x);
        const float d = f16(x.d), m = f16(x.m);
        for (int j = 0; j < DSP_QK / 2; j++) {
            y[j] = d * (float)(x.qs[j] & 0xF) + m;
            y[j + DSP_QK / 2] = d * (float)(x.qs[j] >> 4) + m;
        }
    }
}

static uint32_t load_u32le(const uint8_t b[4]) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static void deq_q5_0(const uint8_t *src, float *y, uint64_t nb) {
    for (uint64_t b = 0; b < nb; b++, y += DSP_QK) {
        dsp_block_q5_0 x;
        memcpy(&x, src + b * sizeof x, sizeof x);
        const float d = f16(x.d);
        const uint32_t qh = load_u32le(x.qh);
        for (int j = 0; j < DSP_QK / 2; j++) {
            int lo = (x.qs[j] & 0xF) | (int)((qh >> j) & 1) << 4;
            int hi = (x.qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = d * (float)(lo - 16);
            y[j + DSP_QK / 2] = d * (float)(hi - 16);
        }
    }
}

static void deq_q5_1(const uint8_t *src, float *y, uint64_t nb) {
    for (uint64_t b = 0; b < nb; b++, y += DSP_QK) {
        dsp_block_q5_1 x;
        memcpy(&x, src + b * sizeof x, sizeof x);
        const float d = f16(x.d), m = f16(x.m);
        const uint32_t qh = load_u32le(x.qh);
        for (int j = 0; j < DSP_QK / 2; j++) {
            int lo = (x.qs[j] & 0xF) | (int)((qh >> j) & 1) << 4;
            int hi = (x.qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = d * (float)lo + m;
            y[j + DSP_QK / 2] = d * (float)hi + m;
        }
    }
}

static void deq_q8_0(const uint8_t *src, float *y, uint64_t nb) {
    for (uint64_t b = 0; b < nb; b++, y += DSP_QK) {
        dsp_block_q8_0 x;
        memcpy(&x, src + b * sizeof x, sizeof x);
        const float d = f16(x.d);
        for (int j = 0; j < DSP_QK; j++) y[j] = (float)x.qs[j] * d;
    }
}

static void deq_q2_K(const uint8_t *src, float *y, uint64_t nb) {
    for (uint64_t b = 0; b < nb; b++, y += DSP_QK_K) {
        dsp_block_q2_K x;
        memcpy(&x, src + b * sizeof x, sizeof x);
        const float d = f16(x.d), dmin = f16(x.dmin);
        for (int i = 0; i < DSP_QK_K; i++) {
            int h = i / 128, k = (i / 32) % 4, l = i % 32;
            int q = (x.qs[32 * h + l] >> (2 * k)) & 3;
            uint8_t s = x.scales[i / 16];
            float dl = d * (float)(s & 0xF), ml = dmin * (float)(s >> 4);
            y[i] = dl * (float)q - ml;
        }
    }
}

static void deq_q3_K(const uint8_t *src, float *y, uint64_t nb) {
    for (uint64_t b = 0; b < nb; b++, y += DSP_QK_K) {
        dsp_block_q3_K x;
        memcpy(&x, src + b * sizeof x, sizeof x);
        const float d = f16(x.d);
        float dl[16];
        for (int s = 0; s < 16; s++) {
            int lo = s < 8 ? (x.scales[s] & 0xF) : (x.scales[s - 8] >> 4);
            int hi = (x.scales[8 + s % 4] >> (2 * (s / 4))) & 3;
            dl[s] = d * (float)((lo | hi << 4) - 32);
        }
        for (int i = 0; i < DSP_QK_K; i++) {
            int h = i / 128, k = (i / 32) % 4, l = i % 32;
            int low2 = (x.qs[32 * h + l] >> (2 * k)) & 3;
            int hbit = (x.hmask[l] >> (i / 32)) & 1;
            int q = low2 - (hbit ? 0 : 4);
            y[i] = dl[i / 16] * (float)q;
        }
    }
}

static void deq_q4_K(const uint8_t *src, float *y, uint64_t nb) {
    for (uint64_t b = 0; b < nb; b++, y += DSP_QK_K) {
        dsp_block_q4_K x;
        memcpy(&x, src + b * sizeof x, sizeof x);
        const float d = f16(x.d), dmin = f16(x.dmin);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            dsp_quant_scale_min_k4(x.scales, j, &sc, &m);
            const float dj = d * (float)sc, mj = dmin * (float)m;
            const uint8_t *qs = x.qs + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            for (int l = 0; l < 32; l++) y[32 * j + l] = dj * (float)((qs[l] >> shift) & 0xF) - mj;
        }
    }
}

static void deq_q5_K(const uint8_t *src, float *y, uint64_t nb) {
    for (uint64_t b = 0; b < nb; b++, y += DSP_QK_K) {
        dsp_block_q5_K x;
        memcpy(&x, src + b * sizeof x, sizeof x);
        const float d = f16(x.d), dmin = f16(x.dmin);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            dsp_quant_scale_min_k4(x.scales, j, &sc, &m);
            const float dj = d * (float)sc, mj = dmin * (float)m;
            const uint8_t *qs = x.qs + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            for (int l = 0; l < 32; l++) {
                int q = ((qs[l] >> shift) & 0xF) | ((x.qh[l] >> j) & 1) << 4;
                y[32 * j + l] = dj * (float)q - mj;
            }
        }
    }
}

static void deq_q6_K(const uint8_t *src, float *y, uint64_t nb) {
    for (uint64_t b = 0; b < nb; b++, y += DSP_QK_K) {
        dsp_block_q6_K x;
        memcpy(&x, src + b * sizeof x, sizeof x);
        const float d = f16(x.d);
        for (int i = 0; i < DSP_QK_K; i++) {
            int h = i / 128, r = i % 128;
            int lo = (x.ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xF;
            int hi = (x.qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
            float ds = d * (float)x.scales[i / 16];
            y[i] = ds * (float)((lo | hi << 4) - 32);
        }
    }
}

static void deq_q8_K(const uint8_t *src, float *y, uint64_t nb) {
    for (uint64_t b = 0; b < nb; b++, y += DSP_QK_K) {
        dsp_block_q8_K x;
        memcpy(&x, src + b * sizeof x, sizeof x);
        for (int i = 0; i < DSP_QK_K; i++) y[i] = x.d * (float)x.qs[i];
    }
}

dsp_status dsp_dequantize_row(uint32_t type, const void *src, float *dst, uint64_t n) {
    const dsp_dtype_traits *t = dsp_dtype_get(type);
    if (!t) return dsp_error(DSP_ERR_UNSUPPORTED, "dequantize: unknown tensor type id %u", type);
    if (!t->can_dequant)
        return dsp_error(DSP_ERR_UNSUPPORTED, "dequantize: no reference dequantization for %s",
                         t->name);
    if (n % t->block_elems)
        return dsp_error(DSP_ERR_INVALID_ARG,
                         "dequantize %s: %llu elements is not a multiple of the block size %u",
                         t->name, (unsigned long long)n, t->block_elems);
    const uint8_t *s = src;
    const uint64_t nb = n / t->block_elems;
    switch ((dsp_dtype)type) {
    case DSP_F32: deq_f32(s, dst, n); break;
    case DSP_F16: deq_f16(s, dst, n); break;
    case DSP_BF16: deq_bf16(s, dst, n); break;
    case DSP_Q4_0: deq_q4_0(s, dst, nb); break;
    case DSP_Q4_1: deq_q4_1(s, dst, nb); break;
    case DSP_Q5_0: deq_q5_0(s, dst, nb); break;
    case DSP_Q5_1: deq_q5_1(s, dst, nb); break;
    case DSP_Q8_0: deq_q8_0(s, dst, nb); break;
    case DSP_Q2_K: deq_q2_K(s, dst, nb); break;
    case DSP_Q3_K: deq_q3_K(s, dst, nb); break;
    case DSP_Q4_K: deq_q4_K(s, dst, nb); break;
    case DSP_Q5_K: deq_q5_K(s, dst, nb); break;
    case DSP_Q6_K: deq_q6_K(s, dst, nb); break;
    case DSP_Q8_K: deq_q8_K(s, dst, nb); break;
    default:
        /* can_dequant is set in the dtype table for exactly the cases above */
        return dsp_error(DSP_ERR_INTERNAL, "dequantize: %s marked can_dequant but not handled",
                         t->name);
    }
    return DSP_OK;
}

/* ---- quantization (the gguf package's rules) ------------------------------------------------- */

/* numpy's np_roundf in gguf/quants.py: round half away from zero, in float32 */
static float np_roundf(float x) {
    float a = fabsf(x), fl = floorf(a), b = fl + floorf(2.0f * (a - fl));
    return x < 0 ? -b : x > 0 ? b : 0.0f * b;
}

static void quantize_q8_0(const float *x, dsp_block_q8_0 *y) {
    float amax = 0.0f;
    for (int j = 0; j < DSP_QK; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    float d = amax / 127.0f, id = d == 0.0f ? 0.0f : 1.0f / d;
    y->d = dsp_f32_to_f16(d);
    for (int j = 0; j < DSP_QK; j++) y->qs[j] = (int8_t)np_roundf(x[j] * id);
}

static void quantize_q4_0(const float *x, dsp_block_q4_0 *y) {
    int imax = 0; /* argmax |x|: the first of equal maxima */
    for (int j = 1; j < DSP_QK; j++)
        if (fabsf(x[j]) > fabsf(x[imax])) imax = j;
    float d = x[imax] / -8.0f, id = d == 0.0f ? 0.0f : 1.0f / d;
    y->d = dsp_f32_to_f16(d);
    uint8_t q[DSP_QK];
    for (int j = 0; j < DSP_QK; j++) {
        float v = truncf(x[j] * id + 8.5f);
        q[j] = v >= 15.0f ? 15 : v <= 0.0f ? 0 : (uint8_t)v;
    }
    for (int j = 0; j < DSP_QK / 2; j++) y->qs[j] = (uint8_t)(q[j] | (q[j + DSP_QK / 2] << 4));
}

dsp_status dsp_quantize_row(uint32_t type, const float *src, void *dst, uint64_t n) {
    if (n % DSP_QK) return dsp_error(DSP_ERR_INVALID_ARG, "quantize: %llu elements is not a multiple of %d", (unsigned long long)n, DSP_QK);
    uint64_t nb = n / DSP_QK;
    if (type == DSP_Q8_0) {
        for (uint64_t b = 0; b < nb; b++) {
            dsp_block_q8_0 blk;
            quantize_q8_0(src + b * DSP_QK, &blk);
            memcpy((uint8_t *)dst + b * sizeof blk, &blk, sizeof blk);
        }
        return DSP_OK;
    }
    if (type == DSP_Q4_0) {
        for (uint64_t b = 0; b < nb; b++) {
            dsp_block_q4_0 blk;
            quantize_q4_0(src + b * DSP_QK, &blk);
            memcpy((uint8_t *)dst + b * sizeof blk, &blk, sizeof blk);
        }
        return DSP_OK;
    }
    return dsp_error(DSP_ERR_UNSUPPORTED, "quantize: type %s is not supported (Q8_0, Q4_0 are)", dsp_dtype_name(type) ? dsp_dtype_name(type) : "?");
}
