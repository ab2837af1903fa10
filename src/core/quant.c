/* core/quant: scalar reference dequantization (see quant.h for the layouts and the bit-exactness
 * contract). Each function handles whole blocks; the float expressions mirror gguf-py's numpy
 * code operation by operation, so do not "simplify" them (e.g. (d * sc) * q is not d * (sc * q)). */
#include "core/quant.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
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

/* numpy's float32 -> int8 / uint8 cast on x86-64: a conversion to int32 (NaN and out-of-range
 * values give INT32_MIN, as cvttss2si does), then the low byte. Only blocks with an infinite or
 * NaN scale get here (a subnormal or non-finite maximum); C's own cast would be undefined. */
static uint8_t np_cast_u8(float v) {
    int32_t i = v == v && fabsf(v) < 2147483648.0f ? (int32_t)v : INT32_MIN;
    return (uint8_t)((uint32_t)i & 0xFF);
}

static void quantize_q8_0(const float *x, dsp_block_q8_0 *y) {
    float amax = 0.0f;
    bool nan = false; /* numpy's max propagates NaN */
    for (int j = 0; j < DSP_QK; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax, nan |= x[j] != x[j];
    if (nan) amax = NAN;
    float d = amax / 127.0f, id = d == 0.0f ? 0.0f : 1.0f / d;
    y->d = dsp_f32_to_f16(d);
    if (!(amax <= FLT_MAX && id <= FLT_MAX)) { /* numpy's expressions as they are */
        for (int j = 0; j < DSP_QK; j++) y->qs[j] = (int8_t)np_cast_u8(np_roundf(x[j] * id));
        return;
    }
    /* |x * id| <= 127 (+ an ulp): floor is the truncation to an integer and floor(2 (a - floor a))
     * is (a - floor a >= 0.5), the same values as np_roundf without libm calls, in a loop the
     * compiler vectorizes (this is the load-time quantizer's hot path) */
    for (int j = 0; j < DSP_QK; j++) {
        float v = x[j] * id, a = fabsf(v), fl = (float)(int32_t)a, b = fl + (a - fl >= 0.5f ? 1.0f : 0.0f);
        y->qs[j] = (int8_t)(int32_t)(v < 0 ? -b : b);
    }
}

static void quantize_q4_0(const float *x, dsp_block_q4_0 *y) {
    int imax = 0; /* numpy's argmax |x|: the first of equal maxima, or the first NaN */
    for (int j = 1; j < DSP_QK && x[imax] == x[imax]; j++)
        if (fabsf(x[j]) > fabsf(x[imax]) || x[j] != x[j]) imax = j;
    float d = x[imax] / -8.0f, id = d == 0.0f ? 0.0f : 1.0f / d;
    y->d = dsp_f32_to_f16(d);
    uint8_t q[DSP_QK];
    if (fabsf(x[imax]) <= FLT_MAX && fabsf(id) <= FLT_MAX) { /* x * id + 8.5 in (0, 16.5]: trunc is the int conversion */
        for (int j = 0; j < DSP_QK; j++) {
            int32_t v = (int32_t)(x[j] * id + 8.5f);
            q[j] = (uint8_t)(v > 15 ? 15 : v);
        }
    } else { /* numpy: trunc, astype(uint8), clip(0, 15) */
        for (int j = 0; j < DSP_QK; j++) {
            uint8_t v = np_cast_u8(truncf(x[j] * id + 8.5f));
            q[j] = v > 15 ? 15 : v;
        }
    }
    for (int j = 0; j < DSP_QK / 2; j++) y->qs[j] = (uint8_t)(q[j] | (q[j + DSP_QK / 2] << 4));
}

/* ---- Q4_K (llama.cpp's reference quantizer, quantize_row_q4_K_ref) ----------------------------
 * The gguf package has no Q4_K quantizer, so there is no oracle here: this follows llama.cpp's
 * reference semantics operation by operation in float32 (unfused), and is tested by its round-trip
 * error and through the bit-exact dequantizer (tests/test_quant.c). Per 32-weight sub-block, a
 * weighted least-squares search over 21 candidate scales picks (scale, min) with
 * y = scale * q - min, q in 0..15; the 8 scales and mins become 6-bit multiples of two f16
 * super-block scales, and the weights are then re-quantized against the rounded scales. */

/* round to nearest, ties to even, through the float mantissa (llama.cpp's nearest_int; exact for
 * |x| < 2^22, the range the quantizer produces) */
static int nearest_int(float x) {
    float v = x + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007FFFFF) - 0x00400000;
}

static int clamp_int(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* llama.cpp's make_qkx2_quants for n = 32, nmax = 15, rmin = -1, rdelta = 0.1, 20 steps, squared
 * error: L (n) gets the levels, *the_min the (positive) minimum; returns the scale. */
static float q4k_sub_block(const float *x, const float *w, uint8_t *L, float *the_min) {
    enum { N = 32, NMAX = 15, NSTEP = 20 };
    const float rmin = -1.0f, rdelta = 0.1f;
    float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < N; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, N);
        *the_min = -min;
        return 0.0f;
    }
    float iscale = (float)NMAX / (max - min), scale = 1 / iscale, best = 0;
    for (int i = 0; i < N; i++) {
        L[i] = (uint8_t)clamp_int(nearest_int(iscale * (x[i] - min)), 0, NMAX);
        float diff = scale * (float)L[i] + min - x[i];
        best += w[i] * (diff * diff);
    }
    uint8_t aux[N];
    for (int is = 0; is <= NSTEP; is++) {
        iscale = (rmin + rdelta * (float)is + (float)NMAX) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < N; i++) {
            int l = clamp_int(nearest_int(iscale * (x[i] - min)), 0, NMAX);
            aux[i] = (uint8_t)l;
            sum_l += w[i] * (float)l;
            sum_l2 += w[i] * (float)l * (float)l;
            sum_xl += w[i] * (float)l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (!(D > 0)) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D, this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0) {
            this_min = 0;
            this_scale = sum_xl / sum_l2;
        }
        float err = 0;
        for (int i = 0; i < N; i++) {
            float diff = this_scale * (float)aux[i] + this_min - x[i];
            err += w[i] * (diff * diff);
        }
        if (err < best) {
            memcpy(L, aux, N);
            best = err;
            scale = this_scale;
            min = this_min;
        }
    }
    *the_min = -min;
    return scale;
}

static void quantize_q4_K(const float *x, dsp_block_q4_K *y) {
    uint8_t L[DSP_QK_K];
    float w[32], scales[8], mins[8], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xs[l] * xs[l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(xs[l]);
        scales[j] = q4k_sub_block(xs, w, L + 32 * j, &mins[j]);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f, inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    memset(y->scales, 0, sizeof y->scales);
    for (int j = 0; j < 8; j++) {
        uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]), lm = (uint8_t)nearest_int(inv_min * mins[j]);
        ls = ls > 63 ? 63 : ls;
        lm = lm > 63 ? 63 : lm;
        if (j < 4) { /* layout: dsp_quant_scale_min_k4 */
            y->scales[j] |= ls;
            y->scales[j + 4] |= lm;
        } else {
            y->scales[j + 4] = (uint8_t)((ls & 0xF) | (lm & 0xF) << 4);
            y->scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
            y->scales[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    y->d = dsp_f32_to_f16(max_scale / 63.0f);
    y->dmin = dsp_f32_to_f16(max_min / 63.0f);
    for (int j = 0; j < 8; j++) { /* re-quantize against the rounded scales (unless one is 0) */
        uint8_t sc, m;
        dsp_quant_scale_min_k4(y->scales, j, &sc, &m);
        const float d = f16(y->d) * (float)sc;
        if (d == 0.0f) continue;
        const float dm = f16(y->dmin) * (float)m;
        for (int l = 0; l < 32; l++) L[32 * j + l] = (uint8_t)clamp_int(nearest_int((x[32 * j + l] + dm) / d), 0, 15);
    }
    for (int h = 0; h < 4; h++) /* sub-blocks 2h (low nibbles) and 2h+1 (high) share qs[32h..] */
        for (int l = 0; l < 32; l++) y->qs[32 * h + l] = (uint8_t)(L[64 * h + l] | L[64 * h + 32 + l] << 4);
}

dsp_status dsp_quantize_row(uint32_t type, const float *src, void *dst, uint64_t n) {
    const dsp_dtype_traits *t = dsp_dtype_get(type);
    if (!t || (type != DSP_Q8_0 && type != DSP_Q4_0 && type != DSP_Q4_K))
        return dsp_error(DSP_ERR_UNSUPPORTED, "quantize: type %s is not supported (Q8_0, Q4_0, Q4_K are)", t ? t->name : "?");
    if (n % t->block_elems)
        return dsp_error(DSP_ERR_INVALID_ARG, "quantize %s: %llu elements is not a multiple of %u", t->name, (unsigned long long)n, t->block_elems);
    uint64_t nb = n / t->block_elems;
    uint8_t *out = dst;
    for (uint64_t b = 0; b < nb; b++) {
        const float *x = src + b * t->block_elems;
        if (type == DSP_Q8_0) {
            dsp_block_q8_0 blk;
            quantize_q8_0(x, &blk);
            memcpy(out + b * sizeof blk, &blk, sizeof blk);
        } else if (type == DSP_Q4_0) {
            dsp_block_q4_0 blk;
            quantize_q4_0(x, &blk);
            memcpy(out + b * sizeof blk, &blk, sizeof blk);
        } else {
            dsp_block_q4_K blk;
            quantize_q4_K(x, &blk);
            memcpy(out + b * sizeof blk, &blk, sizeof blk);
        }
    }
    return DSP_OK;
}
