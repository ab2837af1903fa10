/* backend/cpu/simd_impl.h: the SIMD kernels, written once and compiled twice: avx2.c includes it
 * with 256-bit vectors, avx512.c with 512-bit vectors (each TU with its own -m flags; nothing
 * here is ever compiled without them). Only the vector abstraction below differs.
 *
 * Invariants (see ops.h):
 *  - dot products and matmuls use the 32-lane FMA order; a vector holds VW lanes, NG = 32 / VW
 *    vectors make up the 32 lanes. Each lane's accumulation runs over s = 0, 1, ... in order; the
 *    register tiling (how many weight rows x activation rows are in flight, which lane group goes
 *    first) changes only the interleaving of independent accumulators, never an output's
 *    sequence of operations. That is what keeps 1 row == n rows bitwise.
 *  - dequantization performs the same float operations as core/quant.c (bit-exact);
 *  - exp is a polynomial (about 2 ulp), so softmax/SwiGLU differ from the libm reference by
 *    rounding, and AVX2 vs AVX-512 may differ there too.
 *
 * Matmul, two paths with bit-identical results (same dequantized values, same lane order):
 *  - up to FUSED_MAX_X activation rows (decode, 1+k verify blocks): each 32-weight step of a
 *    weight row is decoded in registers (decode()) and used for every activation row of the
 *    tile: 4 weight rows x 1-2 activation rows, or 1 weight row x up to MAXX rows, so a weight
 *    byte comes from memory once per call and is decoded once per tile;
 *  - more rows (prefill): DSP_CPU_MM_ROWS weight rows are dequantized once into the caller's
 *    scratch (L1/L2-resident) and run as F32 in square-ish tiles, activation rows in blocks of XB.
 * Software prefetch runs PF_ROWS weight rows ahead of the decode path. */
#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "core/quant.h"
#include "sample/sample_kernels.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#if defined(DSP_SIMD_AVX512)
typedef __m512 vf;
#define VW 16
#define MAXW 4
#define MAXX 12
#if defined(DSP_Q8_VNNI)
#define ISA_NAME "avx512vnni"
#define OPS_NAME dsp_cpu_ops_avx512vnni
#else
#define ISA_NAME "avx512"
#define OPS_NAME dsp_cpu_ops_avx512
#endif
static inline vf vzero(void) { return _mm512_setzero_ps(); }
static inline vf vset1(float a) { return _mm512_set1_ps(a); }
static inline vf vload(const float *p) { return _mm512_loadu_ps(p); }
static inline void vstore(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline __mmask16 vmask(int n) { return (__mmask16)((1u << n) - 1u); }
static inline vf vloadn(const float *p, int n) { return _mm512_maskz_loadu_ps(vmask(n), p); }
static inline void vstoren(float *p, vf v, int n) { _mm512_mask_storeu_ps(p, vmask(n), v); }
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vmin(vf a, vf b) { return _mm512_min_ps(a, b); }
static inline float vhmax(vf a) { return _mm512_reduce_max_ps(a); }
static inline vf vround(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* 2^n for integral n in [-127, 127] given as floats */
static inline vf vpow2i(vf n) {
    __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
}
/* the 32 lanes (p[0]: 0..15, p[1]: 16..31) down to 8 in the fixed tree order */
static inline __m256 to8(const vf *p) {
    __m512 t16 = _mm512_add_ps(p[0], p[1]);
    return _mm256_add_ps(_mm512_castps512_ps256(t16), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(t16), 1)));
}
#else
typedef __m256 vf;
#define VW 8
#define MAXW 2
#define MAXX 2
#define FUSED_MAX_X 2 /* 16 registers: 2 activation rows at most per decoded weight step */
#define MM_TW 2
#define MM_TX 1
#if defined(DSP_Q8_VNNI)
#define ISA_NAME "avx2vnni"
#define OPS_NAME dsp_cpu_ops_avx2vnni
#else
#define ISA_NAME "avx2"
#define OPS_NAME dsp_cpu_ops_avx2
#endif
static inline vf vzero(void) { return _mm256_setzero_ps(); }
static inline vf vset1(float a) { return _mm256_set1_ps(a); }
static inline vf vload(const float *p) { return _mm256_loadu_ps(p); }
static inline void vstore(float *p, vf v) { _mm256_storeu_ps(p, v); }
static inline __m256i vmask(int n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
static inline vf vloadn(const float *p, int n) { return _mm256_maskload_ps(p, vmask(n)); }
static inline void vstoren(float *p, vf v, int n) { _mm256_maskstore_ps(p, vmask(n), v); }
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf vmin(vf a, vf b) { return _mm256_min_ps(a, b); }
static inline float vhmax(vf a) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}
static inline vf vround(vf a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vf vpow2i(vf n) {
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
}
/* lanes p[0]: 0..7, p[1]: 8..15, p[2]: 16..23, p[3]: 24..31: t16 = (p0+p2, p1+p3), t8 = sum */
static inline __m256 to8(const vf *p) { return _mm256_add_ps(_mm256_add_ps(p[0], p[2]), _mm256_add_ps(p[1], p[3])); }
#endif

#define NG (32 / VW)
#define AI static inline __attribute__((always_inline))

/* 8 lanes to 1: t4[j] = t8[j] + t8[j+4], t2[j] = t4[j] + t4[j+2], t1 = t2[0] + t2[1] */
static inline float hsum8(__m256 t8) {
    __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
    __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
}

/* sum in the 32-lane order (adds instead of FMAs) */
static float sum32(const float *a, int64_t n) {
    vf p[NG];
    const int64_t S = n / 32;
    const int rem = (int)(n % 32);
    for (int g = 0; g < NG; g++) {
        vf acc = vzero();
        for (int64_t s = 0; s < S; s++) acc = vadd(acc, vload(a + 32 * s + VW * g));
        int c = rem - VW * g;
        if (c > 0) acc = vadd(acc, vloadn(a + 32 * S + VW * g, c > VW ? VW : c));
        p[g] = acc;
    }
    return hsum8(to8(p));
}

/* ---- dequantization (256-bit, bit-exact with core/quant.c) ------------------------------------ */

static inline float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h); /* exact, like dsp_f16_to_f32 */
}
/* 8 bytes of v starting at byte 8*k (k < 4) widened to i32 lanes; s: signed */
AI __m256i widen8(__m256i v, int k, int s) {
    __m128i h = k < 2 ? _mm256_castsi256_si128(v) : _mm256_extracti128_si256(v, 1);
    if (k & 1) h = _mm_srli_si128(h, 8);
    return s ? _mm256_cvtepi8_epi32(h) : _mm256_cvtepu8_epi32(h);
}
/* y[0..32) from 32 unsigned byte quants q: mode 0: a * (q - off); 1: a * q + b; 2: a * q - b */
AI void emit32(float *y, __m256i q, int mode, int off, __m256 a, __m256 b) {
    for (int k = 0; k < 4; k++) {
        __m256i qi = widen8(q, k, 0);
        if (mode == 0) qi = _mm256_sub_epi32(qi, _mm256_set1_epi32(off));
        __m256 f = _mm256_mul_ps(a, _mm256_cvtepi32_ps(qi));
        if (mode == 1) f = _mm256_add_ps(f, b);
        if (mode == 2) f = _mm256_sub_ps(f, b);
        _mm256_storeu_ps(y + 8 * k, f);
    }
}
/* 16 bytes of nibbles: low nibbles are weights 0..15, high nibbles 16..31 */
static inline __m256i nibbles16(const uint8_t *qs) {
    __m128i q = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
}

static void deq_q4_0(const uint8_t *s, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, s += 18, y += 32) emit32(y, nibbles16(s + 2), 0, 8, _mm256_set1_ps(h2f(s)), _mm256_setzero_ps());
}
static void deq_q4_1(const uint8_t *s, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, s += 20, y += 32) emit32(y, nibbles16(s + 4), 1, 0, _mm256_set1_ps(h2f(s)), _mm256_set1_ps(h2f(s + 2)));
}
static void deq_q8_0(const uint8_t *s, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, s += 34, y += 32) {
        __m256 d = _mm256_set1_ps(h2f(s));
        __m256i q = _mm256_loadu_si256((const __m256i *)(s + 2));
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(widen8(q, k, 1)), d));
    }
}
static void deq_q4_K(const uint8_t *s, float *y, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; b++, s += 144, y += 256) {
        const float d = h2f(s), dmin = h2f(s + 2);
        for (int h = 0; h < 4; h++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(s + 16 + 32 * h));
            for (int t = 0; t < 2; t++) {
                int j = 2 * h + t;
                uint8_t sc, m;
                dsp_quant_scale_min_k4(s + 4, j, &sc, &m);
                const float dj = d * (float)sc, mj = dmin * (float)m;
                __m256i v = t ? _mm256_and_si256(_mm256_srli_epi16(q, 4), m4) : _mm256_and_si256(q, m4);
                emit32(y + 32 * j, v, 2, 0, _mm256_set1_ps(dj), _mm256_set1_ps(mj));
            }
        }
    }
}
static void deq_q5_K(const uint8_t *s, float *y, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < nb; b++, s += 176, y += 256) {
        const float d = h2f(s), dmin = h2f(s + 2);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(s + 16));
        for (int h = 0; h < 4; h++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(s + 48 + 32 * h));
            for (int t = 0; t < 2; t++) {
                int j = 2 * h + t;
                uint8_t sc, m;
                dsp_quant_scale_min_k4(s + 4, j, &sc, &m);
                const float dj = d * (float)sc, mj = dmin * (float)m;
                __m256i v = t ? _mm256_and_si256(_mm256_srli_epi16(q, 4), m4) : _mm256_and_si256(q, m4);
                __m256i hb = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j)), one);
                v = _mm256_or_si256(v, _mm256_slli_epi16(hb, 4));
                emit32(y + 32 * j, v, 2, 0, _mm256_set1_ps(dj), _mm256_set1_ps(mj));
            }
        }
    }
}
static void deq_q6_K(const uint8_t *s, float *y, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    for (int64_t b = 0; b < nb; b++, s += 210, y += 256) {
        const float d = h2f(s + 208);
        const int8_t *scales = (const int8_t *)(s + 192);
        for (int h = 0; h < 2; h++) {
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(s + 128 + 32 * h));
            for (int c = 0; c < 4; c++) {
                __m256i ql = _mm256_loadu_si256((const __m256i *)(s + 64 * h + 32 * (c % 2)));
                __m256i lo = _mm256_and_si256(c / 2 ? _mm256_srli_epi16(ql, 4) : ql, m4);
                __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c)), m2);
                __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
                float *yy = y + 128 * h + 32 * c;
                for (int k = 0; k < 4; k++) {
                    const float ds = d * (float)scales[8 * h + 2 * c + k / 2];
                    __m256i qi = _mm256_sub_epi32(widen8(q, k, 0), _mm256_set1_epi32(32));
                    _mm256_storeu_ps(yy + 8 * k, _mm256_mul_ps(_mm256_set1_ps(ds), _mm256_cvtepi32_ps(qi)));
                }
            }
        }
    }
}
static void deq_f16(const uint8_t *s, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 2 * i))));
    for (; i < n; i++) y[i] = h2f(s + 2 * i);
}
static void deq_bf16(const uint8_t *s, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + 2 * i)));
        _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        y[i] = dsp_bf16_to_f32(h);
    }
}

static void k_dequant_row(uint32_t type, const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    switch (type) {
    case DSP_F32: memcpy(dst, s, (size_t)n * sizeof(float)); break;
    case DSP_F16: deq_f16(s, dst, n); break;
    case DSP_BF16: deq_bf16(s, dst, n); break;
    case DSP_Q4_0: deq_q4_0(s, dst, n / 32); break;
    case DSP_Q4_1: deq_q4_1(s, dst, n / 32); break;
    case DSP_Q8_0: deq_q8_0(s, dst, n / 32); break;
    case DSP_Q4_K: deq_q4_K(s, dst, n / 256); break;
    case DSP_Q5_K: deq_q5_K(s, dst, n / 256); break;
    case DSP_Q6_K: deq_q6_K(s, dst, n / 256); break;
    default: dsp_dequantize_row(type, src, dst, (uint64_t)n); break; /* the reference for the rarer types */
    }
}

/* ---- fused decode + dot tiles ------------------------------------------------------------------ */

/* The 32 weights of step s (elements 32s..32s+31) of a weight row, as NG vectors holding exactly
 * the values dsp_dequantize_row produces. F32 rows are also the path for pre-dequantized rows. */
AI void u8_to_vf(__m256i q, vf *out) { /* 32 unsigned bytes -> 32 floats */
#if VW == 16
    out[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(q)));
    out[1] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(q, 1)));
#else
    for (int k = 0; k < 4; k++) out[k] = _mm256_cvtepi32_ps(widen8(q, k, 0));
#endif
}
AI void s8_to_vf(__m256i q, vf *out) { /* 32 signed bytes -> 32 floats */
#if VW == 16
    out[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)));
    out[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)));
#else
    for (int k = 0; k < 4; k++) out[k] = _mm256_cvtepi32_ps(widen8(q, k, 1));
#endif
}
/* scale of lane group g when the 32 weights have one scale per 16 (Q6_K) */
#define G16(g) ((g) * VW / 16)

AI void decode(const uint32_t type, const uint8_t *row, int64_t s, vf *w) {
    if (type == DSP_F32) {
        for (int g = 0; g < NG; g++) w[g] = vload((const float *)row + 32 * s + VW * g);
    } else if (type == DSP_F16) {
        const uint8_t *p = row + 64 * s;
#if VW == 16
        for (int g = 0; g < NG; g++) w[g] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32 * g)));
#else
        for (int g = 0; g < NG; g++) w[g] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * g)));
#endif
    } else if (type == DSP_BF16) {
        const uint8_t *p = row + 64 * s;
#if VW == 16
        for (int g = 0; g < NG; g++)
            w[g] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p + 32 * g))), 16));
#else
        for (int g = 0; g < NG; g++)
            w[g] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 16 * g))), 16));
#endif
    }
#if VW == 16
    /* AVX-512: 4- and 5-bit quants through a table of their 16 (32) possible values, built per
     * block with the reference's own operations (so still bit-exact), then one vpermps per 16
     * weights instead of convert + multiply + add */
    else if (type == DSP_Q4_0 || type == DSP_Q4_1) {
        const int q41 = type == DSP_Q4_1;
        const uint8_t *b = row + (q41 ? 20 : 18) * s;
        uint32_t dm;
        memcpy(&dm, b, q41 ? 4 : 2);
        if (!q41) dm &= 0xFFFF;
        const __m512 h = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128((int)dm)));
        const __m512 d = _mm512_permutexvar_ps(_mm512_setzero_si512(), h);
        const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        __m512 tab;
        if (q41) tab = _mm512_add_ps(_mm512_mul_ps(d, iota), _mm512_permutexvar_ps(_mm512_set1_epi32(1), h)); /* d * q + m */
        else tab = _mm512_mul_ps(d, _mm512_sub_ps(iota, _mm512_set1_ps(8.0f)));                             /* d * (q - 8) */
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + (q41 ? 4 : 2))));
        w[0] = _mm512_permutexvar_ps(q, tab); /* vpermps reads the low 4 bits of each index */
        w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), tab);
    } else if (type == DSP_Q4_K || type == DSP_Q5_K) {
        const int q5 = type == DSP_Q5_K;
        const uint8_t *b = row + (q5 ? 176 : 144) * (s / 8);
        const int j = (int)(s % 8);
        uint8_t sc, mn;
        dsp_quant_scale_min_k4(b + 4, j, &sc, &mn);
        const __m512 dj = _mm512_set1_ps(h2f(b) * (float)sc), mj = _mm512_set1_ps(h2f(b + 2) * (float)mn);
        const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512 tab = _mm512_sub_ps(_mm512_mul_ps(dj, iota), mj); /* dj * q - mj */
        const uint8_t *qs = b + (q5 ? 48 : 16) + 32 * (j / 2);
        for (int g = 0; g < 2; g++) {
            __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qs + 16 * g)));
            q = j % 2 ? _mm512_srli_epi32(q, 4) : _mm512_and_si512(q, _mm512_set1_epi32(0x0F));
            if (q5) {
                const __m512 tab_hi = _mm512_sub_ps(_mm512_mul_ps(dj, _mm512_add_ps(iota, _mm512_set1_ps(16.0f))), mj);
                __m512i qh = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 16 + 16 * g)));
                qh = _mm512_and_si512(_mm512_srli_epi32(qh, (unsigned)j), _mm512_set1_epi32(1));
                w[g] = _mm512_permutex2var_ps(tab, _mm512_or_si512(q, _mm512_slli_epi32(qh, 4)), tab_hi);
            } else {
                w[g] = _mm512_permutexvar_ps(q, tab);
            }
        }
    }
#endif
    else if (type == DSP_Q4_0) {
        const uint8_t *b = row + 18 * s;
        const vf d = vset1(h2f(b));
        u8_to_vf(nibbles16(b + 2), w);
        for (int g = 0; g < NG; g++) w[g] = vmul(d, vsub(w[g], vset1(8.0f))); /* q - 8 is exact in float */
    } else if (type == DSP_Q4_1) {
        const uint8_t *b = row + 20 * s;
        const vf d = vset1(h2f(b)), m = vset1(h2f(b + 2));
        u8_to_vf(nibbles16(b + 4), w);
        for (int g = 0; g < NG; g++) w[g] = vadd(vmul(d, w[g]), m);
    } else if (type == DSP_Q8_0) {
        const uint8_t *b = row + 34 * s;
        const vf d = vset1(h2f(b));
        s8_to_vf(_mm256_loadu_si256((const __m256i *)(b + 2)), w);
        for (int g = 0; g < NG; g++) w[g] = vmul(w[g], d);
    } else if (type == DSP_Q4_K || type == DSP_Q5_K) {
        const int q5 = type == DSP_Q5_K;
        const uint8_t *b = row + (q5 ? 176 : 144) * (s / 8);
        const int j = (int)(s % 8);
        uint8_t sc, mn;
        dsp_quant_scale_min_k4(b + 4, j, &sc, &mn);
        const float dj = h2f(b) * (float)sc, mj = h2f(b + 2) * (float)mn;
        __m256i q = _mm256_loadu_si256((const __m256i *)(b + (q5 ? 48 : 16) + 32 * (j / 2)));
        q = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(q, 4) : q, _mm256_set1_epi8(0x0F));
        if (q5) {
            __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
            __m256i hb = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j)), _mm256_set1_epi8(1));
            q = _mm256_or_si256(q, _mm256_slli_epi16(hb, 4));
        }
        u8_to_vf(q, w);
        for (int g = 0; g < NG; g++) w[g] = vsub(vmul(vset1(dj), w[g]), vset1(mj));
    } else if (type == DSP_Q6_K) {
        const uint8_t *b = row + 210 * (s / 8);
        const int h = (int)(s % 8) / 4, c = (int)(s % 4);
        const float d = h2f(b + 208);
        const int8_t *scales = (const int8_t *)(b + 192) + 8 * h + 2 * c;
        __m256i ql = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32 * (c % 2)));
        __m256i lo = _mm256_and_si256(c / 2 ? _mm256_srli_epi16(ql, 4) : ql, _mm256_set1_epi8(0x0F));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c)), _mm256_set1_epi8(3));
        u8_to_vf(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), w);
        const float ds0 = d * (float)scales[0], ds1 = d * (float)scales[1];
        for (int g = 0; g < NG; g++) w[g] = vmul(vset1(G16(g) ? ds1 : ds0), vsub(w[g], vset1(32.0f)));
    }
}

/* bytes of 32 weights of a type (per step of 32 lanes); K-quants average over their 256 */
static inline int64_t row_bytes_of(uint32_t type, int64_t n) {
    switch (type) {
    case DSP_F16: case DSP_BF16: return 2 * n;
    case DSP_Q4_0: return n / 32 * 18;
    case DSP_Q4_1: return n / 32 * 20;
    case DSP_Q8_0: return n / 32 * 34;
    case DSP_Q4_K: return n * 144 / 256;
    case DSP_Q5_K: return n * 176 / 256;
    case DSP_Q6_K: return n * 210 / 256;
    default: return 4 * n;
    }
}

/* y[i*ldy + k] = dot(W row k, x row i) for k < WR, i < XR, all in the 32-lane FMA order.
 * WR, XR and type are compile-time constants after inlining. Only float types can have a tail
 * (n % 32 != 0): quantized rows are whole blocks of 32 or 256. */
AI void ftile(const uint32_t type, const int WR, const int XR, const uint8_t *const *w, const float *x, int64_t ldx, int64_t n, float *y,
              int64_t ldy, int64_t pf) {
    if (WR > MAXW || XR > MAXX) return; /* not instantiated for this ISA's tile size */
    vf acc[MAXW][MAXX][NG];
    for (int k = 0; k < WR; k++)
        for (int i = 0; i < XR; i++)
            for (int g = 0; g < NG; g++) acc[k][i][g] = vzero();
    const int64_t S = n / 32;
    const int rem = (int)(n % 32);
    if (type == DSP_F32 && WR > 1) {
        /* scratch (pre-dequantized) rows: hold the activations in registers across the weight rows,
         * so a step costs (WR + XR) * NG loads for WR * XR * NG FMAs */
        for (int64_t s = 0; s < S; s++) {
            vf xv[MAXX][NG];
            for (int i = 0; i < XR; i++)
                for (int g = 0; g < NG; g++) xv[i][g] = vload(x + i * ldx + 32 * s + VW * g);
            for (int k = 0; k < WR; k++)
                for (int g = 0; g < NG; g++) {
                    vf wv = vload((const float *)w[k] + 32 * s + VW * g);
                    for (int i = 0; i < XR; i++) acc[k][i][g] = vfma(wv, xv[i][g], acc[k][i][g]);
                }
        }
    } else
    for (int64_t s = 0; s < S; s++) {
        for (int k = 0; k < WR; k++) {
            vf wv[NG];
            /* PF_ROWS weight rows ahead: short rows defeat the hardware prefetcher */
            if (pf) _mm_prefetch((const char *)w[k] + s * (type == DSP_F32 ? 128 : (int64_t)row_bytes_of(type, 32)) + pf, _MM_HINT_T0);
            decode(type, w[k], s, wv);
            for (int i = 0; i < XR; i++)
                for (int g = 0; g < NG; g++) acc[k][i][g] = vfma(wv[g], vload(x + i * ldx + 32 * s + VW * g), acc[k][i][g]);
        }
    }
    if (rem) { /* float rows only */
        const int64_t o = 32 * S;
        for (int g = 0; g < NG; g++) {
            int c = rem - VW * g;
            if (c <= 0) break;
            if (c > VW) c = VW;
            for (int k = 0; k < WR; k++) {
                vf wv;
                if (type == DSP_F32) wv = vloadn((const float *)w[k] + o + VW * g, c);
                else { /* F16/BF16 tail: widen the few elements through a small buffer */
                    float t[VW] = {0};
                    for (int e = 0; e < c; e++) {
                        uint16_t hh;
                        memcpy(&hh, w[k] + 2 * (o + VW * g + e), 2);
                        t[e] = type == DSP_F16 ? _cvtsh_ss(hh) : dsp_bf16_to_f32(hh);
                    }
                    wv = vload(t);
                }
                for (int i = 0; i < XR; i++) acc[k][i][g] = vfma(wv, vloadn(x + i * ldx + o + VW * g, c), acc[k][i][g]);
            }
        }
    }
    for (int k = 0; k < WR; k++)
        for (int i = 0; i < XR; i++) y[i * ldy + k] = hsum8(to8(acc[k][i]));
}

/* the register tiles instantiated: WR x XR = 1..4 x 1..2, and 1 x 3..MAXX (one weight row decoded
 * once for up to MAXX activation rows) */
#define FTC(T, a, b) \
    case a * 16 + b: ftile(T, a, b, w, x, ldx, n, y, ldy, pf); break;
#define FT(T)                                                                                                                  \
    static void ftile_##T(int wr, int xr, const uint8_t *const *w, const float *x, int64_t ldx, int64_t n, float *y, int64_t ldy, int64_t pf) { \
        switch (wr * 16 + xr) {                                                                                                \
            FTC(T, 1, 1) FTC(T, 2, 1) FTC(T, 3, 1) FTC(T, 4, 1) FTC(T, 1, 2) FTC(T, 2, 2) FTC(T, 3, 2) FTC(T, 4, 2)             \
            FTC(T, 1, 3) FTC(T, 1, 4) FTC(T, 1, 5) FTC(T, 1, 6) FTC(T, 1, 7) FTC(T, 1, 8) FTC(T, 1, 9) FTC(T, 1, 10)            \
            FTC(T, 1, 11) FTC(T, 1, 12) FTC(T, 2, 3) FTC(T, 3, 3) FTC(T, 2, 4)                                                   \
        default: break;                                                                                                        \
        }                                                                                                                      \
    }
FT(DSP_F32)
FT(DSP_F16)
FT(DSP_BF16)
FT(DSP_Q4_0)
FT(DSP_Q4_1)
FT(DSP_Q8_0)
FT(DSP_Q4_K)
FT(DSP_Q5_K)
FT(DSP_Q6_K)

typedef void (*ftile_fn)(int, int, const uint8_t *const *, const float *, int64_t, int64_t, float *, int64_t, int64_t);
static ftile_fn fused_for(uint32_t type) {
    switch (type) {
    case DSP_F32: return ftile_DSP_F32;
    case DSP_F16: return ftile_DSP_F16;
    case DSP_BF16: return ftile_DSP_BF16;
    case DSP_Q4_0: return ftile_DSP_Q4_0;
    case DSP_Q4_1: return ftile_DSP_Q4_1;
    case DSP_Q8_0: return ftile_DSP_Q8_0;
    case DSP_Q4_K: return ftile_DSP_Q4_K;
    case DSP_Q5_K: return ftile_DSP_Q5_K;
    case DSP_Q6_K: return ftile_DSP_Q6_K;
    default: return NULL;
    }
}

/* dequantize a row into scratch with the register decoder (same values as k_dequant_row) */
AI void deq_by_decode(const uint32_t type, const uint8_t *row, float *dst, int64_t n) {
    for (int64_t s = 0; s < n / 32; s++) {
        vf w[NG];
        decode(type, row, s, w);
        for (int g = 0; g < NG; g++) vstore(dst + 32 * s + VW * g, w[g]);
    }
}
static void scratch_dequant(uint32_t type, const uint8_t *row, float *dst, int64_t n) {
    switch (type) {
#if VW == 16
    case DSP_Q4_0: deq_by_decode(DSP_Q4_0, row, dst, n); break;
    case DSP_Q4_1: deq_by_decode(DSP_Q4_1, row, dst, n); break;
    case DSP_Q8_0: deq_by_decode(DSP_Q8_0, row, dst, n); break;
    case DSP_Q4_K: deq_by_decode(DSP_Q4_K, row, dst, n); break;
    case DSP_Q5_K: deq_by_decode(DSP_Q5_K, row, dst, n); break;
    case DSP_Q6_K: deq_by_decode(DSP_Q6_K, row, dst, n); break;
#endif
    default: k_dequant_row(type, row, dst, n); break;
    }
}

static float k_dot(const float *a, const float *b, int64_t n) {
    float y;
    const uint8_t *w = (const uint8_t *)a;
    ftile(DSP_F32, 1, 1, &w, b, 0, n, &y, 0, 0);
    return y;
}

/* ---- matmul ----------------------------------------------------------------------------------- */

#define PF_ROWS 8 /* software prefetch distance in weight rows (a decode tile is 1-4 rows: short rows defeat the hardware prefetcher) */
#define XB 64          /* activation rows per block: a block stays in L2 while a chunk of weight rows runs over it */
#ifndef FUSED_MAX_X
#define FUSED_MAX_X 16
#endif
#ifndef MM_TW
#define MM_TW 4 /* scratch-path tile: weight rows x activation rows */
#define MM_TX 2
#endif /* up to this many activation rows, decode weights in registers (no scratch round trip) */

/* Two paths with identical results (the same dequantized values in the same 32-lane order):
 * few activation rows (decode, verify blocks): weights are decoded in registers per tile, each
 * weight byte is read once from memory and re-decoded from L1 for every MAXX rows; many rows
 * (prefill): DSP_CPU_MM_ROWS weight rows are dequantized once into scratch and run as F32. */
static void k_matmul(uint32_t type, const void *w, size_t row_bytes, int64_t in, int64_t r0, int64_t r1, const float *x, int64_t ldx,
                     int n_x, float *y, int64_t ldy, float *scratch) {
    const int64_t stride = dsp_cpu_mm_stride(in);
    ftile_fn ft = fused_for(type);
    const int fused = ft && n_x <= FUSED_MAX_X;
    if (!fused) ft = ftile_DSP_F32;
    const uint8_t *rows[DSP_CPU_MM_ROWS];
    /* register tile. Decode path: up to MAXW weight rows x 1-2 activation rows (AVX2: 1 x 2, its 16
     * registers hold no more), or 1 weight row x up to MAXX activation rows, balanced (9 rows:
     * one tile of 9; 17: 9 + 8). Scratch path: MM_TW x MM_TX. */
    int tx, tw;
    if (!fused) {
        tw = MM_TW, tx = MM_TX;
    } else if (n_x <= 2) {
        tx = n_x, tw = NG == 4 && n_x == 2 ? 1 : MAXW;
    } else {
        const int nt = (n_x + MAXX - 1) / MAXX;
        tx = (n_x + nt - 1) / nt, tw = 1;
    }
    for (int64_t c0 = r0; c0 < r1; c0 += DSP_CPU_MM_ROWS) {
        const int64_t c1 = c0 + DSP_CPU_MM_ROWS < r1 ? c0 + DSP_CPU_MM_ROWS : r1;
        for (int64_t r = c0; r < c1; r++) {
            const uint8_t *src = (const uint8_t *)w + (size_t)r * row_bytes;
            if (fused || type == DSP_F32) {
                rows[r - c0] = src;
            } else {
                float *d = scratch + (r - c0) * stride;
                scratch_dequant(type, src, d, in);
                rows[r - c0] = (const uint8_t *)d;
            }
        }
        for (int i0 = 0; i0 < n_x; i0 += XB) {
            const int i1 = i0 + XB < n_x ? i0 + XB : n_x;
            for (int64_t r = c0; r < c1; r += tw) {
                const int wr = (int)(c1 - r < tw ? c1 - r : tw);
                for (int i = i0; i < i1; i += tx) {
                    const int xr = i1 - i < tx ? i1 - i : tx;
                    /* fused and the first activation tile: prefetch the next weight tile */
                    const int64_t pf = fused && i == i0 ? (int64_t)row_bytes * PF_ROWS : 0;
                    ft(wr, xr, rows + (r - c0), x + (size_t)i * ldx, ldx, in, y + (size_t)i * ldy + r, ldy, pf);
                }
            }
        }
    }
}

/* ---- 8-bit activations ------------------------------------------------------------------------- */

#include "backend/cpu/q8_impl.h"
#include "backend/cpu/panel_impl.h"

/* ---- element-wise and small kernels ---------------------------------------------------------- */

/* exp(x): Cephes-style range reduction + degree-5 polynomial; about 2 ulp on [-87, 88];
 * underflows to 0 below about -87.3, and x = -inf gives 0 */
AI vf vexp(vf x) {
    x = vmin(vmax(x, vset1(-88.3762626647949f)), vset1(88.3762626647949f));
    vf n = vround(vmul(x, vset1(1.44269504088896341f)));
    n = vmin(vmax(n, vset1(-127.0f)), vset1(127.0f));
    vf r = vsub(x, vmul(n, vset1(0.693359375f)));
    r = vsub(r, vmul(n, vset1(-2.12194440e-4f)));
    vf p = vset1(1.9875691500E-4f);
    p = vfma(p, r, vset1(1.3981999507E-3f));
    p = vfma(p, r, vset1(8.3334519073E-3f));
    p = vfma(p, r, vset1(4.1665795894E-2f));
    p = vfma(p, r, vset1(1.6666665459E-1f));
    p = vfma(p, r, vset1(5.0000001201E-1f));
    p = vfma(p, vmul(r, r), vadd(r, vset1(1.0f)));
    return vmul(p, vpow2i(n));
}

static void k_softmax(float *x, int64_t n) {
    if (n <= 0) return;
    float mx = x[0];
    int64_t i = 0;
    vf m = vset1(x[0]);
    for (; i + VW <= n; i += VW) m = vmax(m, vload(x + i));
    mx = vhmax(m);
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    const vf vm = vset1(mx);
    for (i = 0; i + VW <= n; i += VW) vstore(x + i, vexp(vsub(vload(x + i), vm)));
    if (i < n) vstoren(x + i, vexp(vsub(vloadn(x + i, (int)(n - i)), vm)), (int)(n - i));
    const vf inv = vset1(1.0f / sum32(x, n));
    for (i = 0; i + VW <= n; i += VW) vstore(x + i, vmul(vload(x + i), inv));
    if (i < n) vstoren(x + i, vmul(vloadn(x + i, (int)(n - i)), inv), (int)(n - i));
}

AI vf silu_mul(vf a, vf b) { return vmul(vdiv(a, vadd(vset1(1.0f), vexp(vsub(vzero(), a)))), b); }

static void k_swiglu(float *a, const float *b, int64_t n) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW) vstore(a + i, silu_mul(vload(a + i), vload(b + i)));
    if (i < n) vstoren(a + i, silu_mul(vloadn(a + i, (int)(n - i)), vloadn(b + i, (int)(n - i))), (int)(n - i));
}

/* scale step is element-wise w * (x * r) as in the reference; only the sum of squares differs */
static void k_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    const float mean = k_dot(x, x, n) / (float)n;
    const float r = 1.0f / sqrtf(mean + eps);
    const vf vr = vset1(r);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) {
        vf v = vmul(vload(x + i), vr);
        vstore(out + i, w ? vmul(vload(w + i), v) : v);
    }
    for (; i < n; i++) out[i] = w ? w[i] * (x[i] * r) : x[i] * r;
}

/* y = fma(a, x, y) per element, like the reference: bit-identical to it */
static void k_axpy(float *y, float a, const float *x, int64_t n) {
    const vf va = vset1(a);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) vstore(y + i, vfma(va, vload(x + i), vload(y + i)));
    for (; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

/* ---- attention over a chunk of keys (the ops.h contract: k_dot and k_axpy's bits) --------------
 * dots: DOTS_KEYS keys at a time share each load of q and keep 2 * DOTS_KEYS independent FMA
 * chains in flight (one k_dot is a chain of n / 16 dependent FMAs); per key the lanes, the FMA
 * order and the tree are k_dot's (ftile of one F32 row: fma(q, k, acc) per 32-float step). axpys:
 * the output row stays in registers for the whole chunk (axpy loads and stores it once per key),
 * each element still fma(p[t], v, o) in key order. */
#define DOTS_KEYS (VW == 16 ? 4 : 2)
/* K/V rows as stored, kind 0: f32, 1: f16, 2: bf16; the VW values at element i widened (exactly) */
AI vf kv_load(const void *row, int64_t i, const int kind) {
    if (kind == 0) return vload((const float *)row + i);
    const uint16_t *h = (const uint16_t *)row + i;
#if VW == 16
    const __m256i r = _mm256_loadu_si256((const __m256i *)h);
    return kind == 1 ? _mm512_cvtph_ps(r) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(r), 16));
#else
    const __m128i r = _mm_loadu_si128((const __m128i *)h);
    return kind == 1 ? _mm256_cvtph_ps(r) : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(r), 16));
#endif
}
AI float kv_elem(const void *row, int64_t i, const int kind) {
    return kind == 0 ? ((const float *)row)[i] : dsp_cpu_kv16(((const uint16_t *)row)[i], kind == 2);
}
#if VW == 16
/* 16 keys' lane trees at once (AVX-512): hsum8(to8(acc)) pairs lanes j and j + 8, then j and j + 4
 * of those, j and j + 2, 0 and 1; the same adds done across keys with shuffles between them, two
 * keys per vector at the first level (lanes 0-7 and 8-15), four at the second (a 128-bit chunk
 * each), so the bits are hsum8's and the shuffles per key are fewer than half (horizontal sums were
 * most of the instructions of a 64-wide dot: 4 FMAs, 9 shuffles and adds) */
AI vf dots_l1(vf x, vf y) { /* keys x, y (16 lanes) -> [x's 8 | y's 8] */
    return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
}
AI vf dots_l2(vf u, vf v) { /* [x | y], [z | w] (8 lanes each) -> [x4 y4 z4 w4] */
    return _mm512_add_ps(_mm512_shuffle_f32x4(u, v, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(u, v, _MM_SHUFFLE(3, 1, 3, 1)));
}
AI vf dots_l3(vf r, vf s) { /* chunk c: key c of r, key c of s (4 lanes each) -> [r_c 2, s_c 2] */
    return _mm512_add_ps(_mm512_shuffle_ps(r, s, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(r, s, _MM_SHUFFLE(3, 2, 3, 2)));
}
AI vf dots_l4(vf m, vf v) { /* chunk c: [m_c 2 lanes, m'_c 2], [v_c, v'_c] -> [m_c, m'_c, v_c, v'_c] sums */
    return _mm512_add_ps(_mm512_shuffle_ps(m, v, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(m, v, _MM_SHUFFLE(3, 1, 3, 1)));
}
#endif

/* the lanes of DOTS_KEYS keys' dots (rows[0 ..]), n % 32 == 0: per key and lane one FMA chain in
 * 32-float steps, k_dot's */
AI void dots_acc(const float *q, const void *const *rows, int64_t n, const int kind, vf acc[DOTS_KEYS][NG]) {
    for (int k = 0; k < DOTS_KEYS; k++)
        for (int g = 0; g < NG; g++) acc[k][g] = vzero();
    for (int64_t s = 0; s < n / 32; s++)
        for (int g = 0; g < NG; g++) {
            const vf qv = vload(q + 32 * s + VW * g);
            for (int k = 0; k < DOTS_KEYS; k++) acc[k][g] = vfma(qv, kv_load(rows[k], 32 * s + VW * g, kind), acc[k][g]);
        }
}

AI void dots_impl(const float *q, const void *const *rows, int nt, int64_t n, float scale, float *out, const int kind) {
    int t = 0;
    vf acc[DOTS_KEYS][NG];
#if VW == 16
    if (n % 32 == 0)
        for (; t + 16 <= nt; t += 16) {
            vf r[4];
            _Static_assert(DOTS_KEYS == 4, "four groups of DOTS_KEYS keys");
            for (int sg = 0; sg < 4; sg++) { /* keys t + 4 sg .. + 3 */
                dots_acc(q, rows + t + 4 * sg, n, kind, acc);
                /* to8's first add (the two 16-lane halves of the 32-lane step), then two tree levels */
                r[sg] = dots_l2(dots_l1(_mm512_add_ps(acc[0][0], acc[0][1]), _mm512_add_ps(acc[1][0], acc[1][1])),
                                dots_l1(_mm512_add_ps(acc[2][0], acc[2][1]), _mm512_add_ps(acc[3][0], acc[3][1])));
            }
            /* lane 4 c + m holds key c + 4 m: back to key order */
            const __m512i ord = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
            const vf f = _mm512_permutexvar_ps(ord, dots_l4(dots_l3(r[0], r[1]), dots_l3(r[2], r[3])));
            vstore(out + t, _mm512_mul_ps(f, vset1(scale)));
        }
#endif
    if (n % 32 == 0)
        for (; t + DOTS_KEYS <= nt; t += DOTS_KEYS) {
            dots_acc(q, rows + t, n, kind, acc);
            for (int k = 0; k < DOTS_KEYS; k++) out[t + k] = hsum8(to8(acc[k])) * scale;
        }
    for (; t < nt; t++) { /* k_dot's tile with the key row as its weight row: fma(k, q) = fma(q, k), same lanes */
        const uint8_t *k = rows[t];
        float y;
        ftile(kind == 0 ? DSP_F32 : kind == 1 ? DSP_F16 : DSP_BF16, 1, 1, &k, q, 0, n, &y, 0, 0);
        out[t] = y * scale;
    }
}
static void k_dots(const float *q, const float *const *rows, int nt, int64_t n, float scale, float *out) {
    dots_impl(q, (const void *const *)rows, nt, n, scale, out, 0);
}
static void k_dots16(const float *q, const uint16_t *const *rows, int nt, int64_t n, float scale, float *out, int bf16) {
    if (bf16) dots_impl(q, (const void *const *)rows, nt, n, scale, out, 2);
    else dots_impl(q, (const void *const *)rows, nt, n, scale, out, 1);
}

#define AXPYS_VECS 8 /* output vectors held in registers per pass */
AI void axpys_cols(float *o, const float *p, const void *const *rows, int nt, int64_t c0, const int NV, const int kind) {
    vf acc[AXPYS_VECS];
    for (int v = 0; v < NV; v++) acc[v] = vload(o + c0 + VW * v);
    for (int t = 0; t < nt; t++) {
        const vf va = vset1(p[t]);
        for (int v = 0; v < NV; v++) acc[v] = vfma(va, kv_load(rows[t], c0 + VW * v, kind), acc[v]);
    }
    for (int v = 0; v < NV; v++) vstore(o + c0 + VW * v, acc[v]);
}
AI void axpys_impl(float *o, const float *p, const void *const *rows, int nt, int64_t n, const int kind) {
    int64_t c0 = 0;
    for (; c0 + AXPYS_VECS * VW <= n; c0 += AXPYS_VECS * VW) axpys_cols(o, p, rows, nt, c0, AXPYS_VECS, kind);
    /* the vectors left in one pass (a head of 64 on AVX-512: 4), not one pass each: a pass is a
     * chain of dependent FMAs per vector, so one vector per pass ran at the FMA latency */
    switch ((n - c0) / VW) {
    case 7: axpys_cols(o, p, rows, nt, c0, 7, kind); break;
    case 6: axpys_cols(o, p, rows, nt, c0, 6, kind); break;
    case 5: axpys_cols(o, p, rows, nt, c0, 5, kind); break;
    case 4: axpys_cols(o, p, rows, nt, c0, 4, kind); break;
    case 3: axpys_cols(o, p, rows, nt, c0, 3, kind); break;
    case 2: axpys_cols(o, p, rows, nt, c0, 2, kind); break;
    case 1: axpys_cols(o, p, rows, nt, c0, 1, kind); break;
    default: break;
    }
    c0 += (n - c0) / VW * VW;
    for (int t = 0; t < nt && c0 < n; t++) /* the tail, as k_axpy's */
        for (int64_t i = c0; i < n; i++) o[i] = fmaf(p[t], kv_elem(rows[t], i, kind), o[i]);
}
static void k_axpys(float *o, const float *p, const float *const *rows, int nt, int64_t n) {
    axpys_impl(o, p, (const void *const *)rows, nt, n, 0);
}
static void k_axpys16(float *o, const float *p, const uint16_t *const *rows, int nt, int64_t n, int bf16) {
    if (bf16) axpys_impl(o, p, (const void *const *)rows, nt, n, 2);
    else axpys_impl(o, p, (const void *const *)rows, nt, n, 1);
}

/* the sampler's rule (ops.h): a max pass over the values read as the rule reads them (vmax(x, -inf)
 * is -inf for a NaN x: max returns its second operand when one is NaN; vmin(., FLT_MAX) clamps +inf),
 * then the first index whose read value equals it */
AI vf argmax_read(vf x) { return vmin(vmax(x, vset1(-INFINITY)), vset1(FLT_MAX)); }
AI float argmax_read1(float x) { return x != x ? -INFINITY : x > FLT_MAX ? FLT_MAX : x; }
#if VW == 16
AI unsigned argmax_eq(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
#else
AI unsigned argmax_eq(vf a, vf b) { return (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_EQ_OQ)); }
#endif
static int64_t k_argmax(const float *x, int64_t n) {
    if (n <= 0) return -1;
    int64_t i = 0;
    float mx = -INFINITY;
    if (n >= 4 * VW) {
        vf m0 = vset1(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
        for (; i + 4 * VW <= n; i += 4 * VW) {
            m0 = vmax(m0, argmax_read(vload(x + i))), m1 = vmax(m1, argmax_read(vload(x + i + VW)));
            m2 = vmax(m2, argmax_read(vload(x + i + 2 * VW))), m3 = vmax(m3, argmax_read(vload(x + i + 3 * VW)));
        }
        mx = vhmax(vmax(vmax(m0, m1), vmax(m2, m3)));
    }
    for (; i < n; i++) mx = argmax_read1(x[i]) > mx ? argmax_read1(x[i]) : mx;
    if (mx == -INFINITY) return -1;
    const vf vm = vset1(mx);
    for (i = 0; i + VW <= n; i += VW) {
        const unsigned k = argmax_eq(argmax_read(vload(x + i)), vm);
        if (k) return i + __builtin_ctz(k);
    }
    for (; i < n; i++)
        if (argmax_read1(x[i]) == mx) return i;
    return -1;
}

/* ---- sampler (ops.h: sample_weights, sample_mass, sample_probs, sample_keys) -----------------
 * Doubles, VD lanes. Each lane performs dsp_sample_exp's operations in its order (no FMA: the
 * build has -ffp-contract=off, and the exponent bits are integer arithmetic), so a lane gives the
 * scalar function's bits. The sums stay scalar: after a vector of weights is stored, its kept
 * lanes are added one by one in ascending order (a lane mask, lowest bit first), which is the
 * reference's sequence of additions with the zero-weight and dropped tokens skipped. The chain of
 * additions bounds the speed on dense rows; the vector work of the next iterations overlaps it. */
#if VW == 16
typedef __m512d vd;
#define VD 8
AI vd vdset1(double a) { return _mm512_set1_pd(a); }
AI vd vdload(const double *p) { return _mm512_loadu_pd(p); }
AI void vdstore(double *p, vd v) { _mm512_storeu_pd(p, v); }
AI vd vdload_f32(const float *p) { return _mm512_cvtps_pd(_mm256_loadu_ps(p)); }
AI vd vdadd(vd a, vd b) { return _mm512_add_pd(a, b); }
AI vd vdsub(vd a, vd b) { return _mm512_sub_pd(a, b); }
AI vd vdmul(vd a, vd b) { return _mm512_mul_pd(a, b); }
AI vd vddiv(vd a, vd b) { return _mm512_div_pd(a, b); }
AI vd vdmax(vd a, vd b) { return _mm512_max_pd(a, b); }
/* p * 2^k for k = bits(t) - SHIFT_BITS >= KNORMAL: one exact product (sample_kernels.h step 5) */
AI vd vdscale1(vd p, vd t) {
    const __m512i e = _mm512_sub_epi64(_mm512_castpd_si512(t), _mm512_set1_epi64((long long)(DSP_SAMPLE_EXP_SHIFT_BITS - 1023)));
    return vdmul(p, _mm512_castsi512_pd(_mm512_slli_epi64(e, 52)));
}
AI int vdk_normal(vd k) { return _mm512_cmp_pd_mask(k, vdset1(DSP_SAMPLE_EXP_KNORMAL), _CMP_GE_OQ) == 0xff; }
/* any k: p * 2^(u1 - 550) * 2^(u - u1 - 550), u = bits(t) - (SHIFT_BITS - UBIAS) */
AI vd vdscale(vd p, vd t) {
    const __m512i u = _mm512_sub_epi64(_mm512_castpd_si512(t), _mm512_set1_epi64((long long)(DSP_SAMPLE_EXP_SHIFT_BITS - DSP_SAMPLE_EXP_UBIAS)));
    const __m512i u1 = _mm512_srli_epi64(u, 1), eb = _mm512_set1_epi64(DSP_SAMPLE_EXP_EBIAS);
    const vd s1 = _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_add_epi64(u1, eb), 52));
    const vd s2 = _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_add_epi64(_mm512_sub_epi64(u, u1), eb), 52));
    return vdmul(vdmul(p, s1), s2);
}
/* lanes with w > 0 && w >= min_w (&& z >= z_thr) */
AI unsigned vdkeep(vd w, vd min_w) { return _mm512_cmp_pd_mask(w, _mm512_setzero_pd(), _CMP_GT_OQ) & _mm512_cmp_pd_mask(w, min_w, _CMP_GE_OQ); }
AI unsigned vdkeep3(vd w, vd min_w, vd z, vd z_thr) { return vdkeep(w, min_w) & _mm512_cmp_pd_mask(z, z_thr, _CMP_GE_OQ); }
/* p[0..VD) = lanes in `keep` ? (float)(w / mass) : 0; returns the lanes with p > 0 */
AI unsigned vdprobs(float *p, vd w, vd mass, unsigned keep) {
    const __m256 q = _mm512_cvtpd_ps(_mm512_maskz_div_pd((__mmask8)keep, w, mass));
    _mm256_storeu_ps(p, q);
    return _mm256_cmp_ps_mask(q, _mm256_setzero_ps(), _CMP_GT_OQ);
}
AI void vdzero_f32(float *p) { _mm256_storeu_ps(p, _mm256_setzero_ps()); }
#else
typedef __m256d vd;
#define VD 4
AI vd vdset1(double a) { return _mm256_set1_pd(a); }
AI vd vdload(const double *p) { return _mm256_loadu_pd(p); }
AI void vdstore(double *p, vd v) { _mm256_storeu_pd(p, v); }
AI vd vdload_f32(const float *p) { return _mm256_cvtps_pd(_mm_loadu_ps(p)); }
AI vd vdadd(vd a, vd b) { return _mm256_add_pd(a, b); }
AI vd vdsub(vd a, vd b) { return _mm256_sub_pd(a, b); }
AI vd vdmul(vd a, vd b) { return _mm256_mul_pd(a, b); }
AI vd vddiv(vd a, vd b) { return _mm256_div_pd(a, b); }
AI vd vdmax(vd a, vd b) { return _mm256_max_pd(a, b); }
AI vd vdscale1(vd p, vd t) {
    const __m256i e = _mm256_sub_epi64(_mm256_castpd_si256(t), _mm256_set1_epi64x((long long)(DSP_SAMPLE_EXP_SHIFT_BITS - 1023)));
    return vdmul(p, _mm256_castsi256_pd(_mm256_slli_epi64(e, 52)));
}
AI int vdk_normal(vd k) { return _mm256_movemask_pd(_mm256_cmp_pd(k, vdset1(DSP_SAMPLE_EXP_KNORMAL), _CMP_GE_OQ)) == 0xf; }
AI vd vdscale(vd p, vd t) {
    const __m256i u = _mm256_sub_epi64(_mm256_castpd_si256(t), _mm256_set1_epi64x((long long)(DSP_SAMPLE_EXP_SHIFT_BITS - DSP_SAMPLE_EXP_UBIAS)));
    const __m256i u1 = _mm256_srli_epi64(u, 1), eb = _mm256_set1_epi64x(DSP_SAMPLE_EXP_EBIAS);
    const vd s1 = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(u1, eb), 52));
    const vd s2 = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(_mm256_sub_epi64(u, u1), eb), 52));
    return vdmul(vdmul(p, s1), s2);
}
AI vd vdkeepv(vd w, vd min_w) { return _mm256_and_pd(_mm256_cmp_pd(w, _mm256_setzero_pd(), _CMP_GT_OQ), _mm256_cmp_pd(w, min_w, _CMP_GE_OQ)); }
AI unsigned vdkeep(vd w, vd min_w) { return (unsigned)_mm256_movemask_pd(vdkeepv(w, min_w)); }
AI unsigned vdkeep3(vd w, vd min_w, vd z, vd z_thr) {
    return (unsigned)_mm256_movemask_pd(_mm256_and_pd(vdkeepv(w, min_w), _mm256_cmp_pd(z, z_thr, _CMP_GE_OQ)));
}
AI unsigned vdprobs(float *p, vd w, vd mass, unsigned keep) {
    /* the dropped lanes' bits cleared: +0 */
    const __m256i lane = _mm256_setr_epi64x(1, 2, 4, 8);
    const __m256i on = _mm256_cmpeq_epi64(_mm256_and_si256(_mm256_set1_epi64x((long long)keep), lane), lane);
    const __m128 q = _mm256_cvtpd_ps(_mm256_and_pd(_mm256_div_pd(w, mass), _mm256_castsi256_pd(on)));
    _mm_storeu_ps(p, q);
    return (unsigned)_mm_movemask_ps(_mm_cmpgt_ps(q, _mm_setzero_ps()));
}
AI void vdzero_f32(float *p) { _mm_storeu_ps(p, _mm_setzero_ps()); }
#endif

/* dsp_sample_exp, lane by lane */
AI vd vdexp(vd x) {
    x = vdmax(x, vdset1(DSP_SAMPLE_EXP_MIN));
    const vd t = vdadd(vdmul(x, vdset1(DSP_SAMPLE_EXP_LOG2E)), vdset1(DSP_SAMPLE_EXP_SHIFT));
    const vd k = vdsub(t, vdset1(DSP_SAMPLE_EXP_SHIFT));
    vd r = vdsub(x, vdmul(k, vdset1(DSP_SAMPLE_EXP_LN2_HI)));
    r = vdsub(r, vdmul(k, vdset1(DSP_SAMPLE_EXP_LN2_LO)));
    vd p = vdset1(DSP_SAMPLE_EXP_Q10);
    p = vdadd(vdmul(p, r), vdset1(DSP_SAMPLE_EXP_Q9));
    p = vdadd(vdmul(p, r), vdset1(DSP_SAMPLE_EXP_Q8));
    p = vdadd(vdmul(p, r), vdset1(DSP_SAMPLE_EXP_Q7));
    p = vdadd(vdmul(p, r), vdset1(DSP_SAMPLE_EXP_Q6));
    p = vdadd(vdmul(p, r), vdset1(DSP_SAMPLE_EXP_Q5));
    p = vdadd(vdmul(p, r), vdset1(DSP_SAMPLE_EXP_Q4));
    p = vdadd(vdmul(p, r), vdset1(DSP_SAMPLE_EXP_Q3));
    p = vdadd(vdmul(p, r), vdset1(DSP_SAMPLE_EXP_Q2));
    p = vdadd(vdmul(p, r), vdset1(DSP_SAMPLE_EXP_Q1));
    p = vdadd(vdmul(p, r), vdset1(DSP_SAMPLE_EXP_Q0));
    p = vdadd(vdmul(p, r), vdset1(1.0));
    /* a normal result (nearly always): one exact product, the reference's two give the same */
    return vdk_normal(k) ? vdscale1(p, t) : vdscale(p, t);
}

/* The rows run in chunks of SCH elements, software-pipelined: the vector work of chunk c + 1 is
 * issued before the additions of chunk c, so the out-of-order core overlaps the two (a chunk's
 * vector work is long in latency but independent; the additions are one dependent chain). The
 * additions read back what the vector part stored one chunk earlier. The tails (n % SCH
 * elements) run the reference's loops (sample_ref.c): the same operations, one at a time. */
#define SCH (4 * VD)
#define VD_ALL ((1u << VD) - 1)

/* sum + the lanes of w[0..VD) in m, ascending (all of them: no bit loop) */
AI double vdsum_kept(double sum, const double *w, unsigned m) {
    if (m == VD_ALL)
        for (int l = 0; l < VD; l++) sum += w[l];
    else
        for (; m; m &= m - 1) sum += w[__builtin_ctz(m)];
    return sum;
}

/* (z - zmax) / t; with inv (t a power of two) as (z - zmax) * (1 / t) */
AI void weights_chunk(const float *z, vd vz, vd vt, int inv, double *w) {
    for (int v = 0; v < SCH; v += VD) {
        const vd d = vdsub(vdload_f32(z + v), vz);
        vdstore(w + v, vdexp(inv ? vdmul(d, vt) : vddiv(d, vt)));
    }
}

/* t = 2^e with 1 / t normal too (e in [-1022, 1022]), e.g. the default temperature 1: then 1 / t
 * is exact and x * (1 / t) is the exact quotient rounded once, as x / t is: the same bits for
 * every x, without the division (some 15% of the weights' time on Zen 4) */
static int pow2_with_normal_inverse(double t) {
    uint64_t b;
    memcpy(&b, &t, sizeof b);
    const uint64_t e = b >> 52; /* sign 0 and biased exponent */
    return (b & 0xfffffffffffffull) == 0 && e >= 1 && e <= 2045;
}

static double k_sample_weights(const float *z, int64_t n, double zmax, double t, double min_w, double *w) {
    const int inv = pow2_with_normal_inverse(t);
    const vd vz = vdset1(zmax), vt = vdset1(inv ? 1.0 / t : t), vm = vdset1(min_w);
    const int64_t nc = n / SCH * SCH;
    double sum = 0.0;
    if (nc) weights_chunk(z, vz, vt, inv, w);
    for (int64_t i = 0; i < nc; i += SCH) {
        if (i + SCH < nc) weights_chunk(z + i + SCH, vz, vt, inv, w + i + SCH);
        for (int v = 0; v < SCH; v += VD) sum = vdsum_kept(sum, w + i + v, vdkeep(vdload(w + i + v), vm));
    }
    for (int64_t i = nc; i < n; i++) {
        w[i] = dsp_sample_exp(((double)z[i] - zmax) / t);
        if (w[i] > 0.0 && w[i] >= min_w) sum += w[i];
    }
    return sum;
}

static double k_sample_mass(const float *z, const double *w, int64_t n, float z_thr, double min_w) {
    const vd vm = vdset1(min_w), vthr = vdset1((double)z_thr);
    double sum = 0.0;
    int64_t i = 0;
    for (; i + VD <= n; i += VD) sum = vdsum_kept(sum, w + i, vdkeep3(vdload(w + i), vm, vdload_f32(z + i), vthr));
    for (; i < n; i++)
        if (w[i] > 0.0 && w[i] >= min_w && z[i] >= z_thr) sum += w[i];
    return sum;
}

/* p of one chunk; the lanes with p > 0 into m[] (one mask per vector) */
AI void probs_chunk(const float *z, const double *w, vd vm, vd vthr, vd vmass, float *p, unsigned *m) {
    for (int v = 0; v < SCH / VD; v++) {
        const vd wv = vdload(w + v * VD);
        const unsigned keep = vdkeep3(wv, vm, vdload_f32(z + v * VD), vthr);
        if (keep) {
            m[v] = vdprobs(p + v * VD, wv, vmass, keep);
        } else { /* most of a truncated row: no division */
            vdzero_f32(p + v * VD);
            m[v] = 0;
        }
    }
}

static double k_sample_probs(const float *z, const double *w, int64_t n, float z_thr, double min_w, double mass, float *p,
                             int32_t *kept, int32_t *n_kept) {
    const vd vm = vdset1(min_w), vthr = vdset1((double)z_thr), vmass = vdset1(mass);
    const int64_t nc = n / SCH * SCH;
    unsigned mk[2][SCH / VD];
    double psum = 0.0;
    int32_t nk = 0;
    if (nc) probs_chunk(z, w, vm, vthr, vmass, p, mk[0]);
    for (int64_t i = 0, c = 0; i < nc; i += SCH, c ^= 1) {
        if (i + SCH < nc) probs_chunk(z + i + SCH, w + i + SCH, vm, vthr, vmass, p + i + SCH, mk[c ^ 1]);
        for (int v = 0; v < SCH / VD; v++) {
            const int64_t i0 = i + v * VD;
            unsigned m = mk[c][v];
            if (m == VD_ALL) {
                for (int l = 0; l < VD; l++) kept[nk + l] = (int32_t)(i0 + l), psum += (double)p[i0 + l];
                nk += VD;
            } else {
                for (; m; m &= m - 1) {
                    const int64_t j = i0 + __builtin_ctz(m);
                    kept[nk++] = (int32_t)j;
                    psum += (double)p[j];
                }
            }
        }
    }
    psum = dsp_sample_probs_range(z, w, nc, n, z_thr, min_w, mass, p, kept, &nk, psum);
    *n_kept = nk;
    return psum;
}

/* keys: u = bits of z (-0 as +0), key = u ^ (u >> 31 arithmetic | sign) (dsp_sample_key); block
 * maxima by unsigned max over the block's vectors, then across lanes */
#if VW == 16
typedef __m512i vk;
AI vk vkey(const float *z) {
    __m512i u = _mm512_loadu_si512(z);
    u = _mm512_maskz_mov_epi32(_mm512_cmpneq_epu32_mask(u, _mm512_set1_epi32((int)0x80000000u)), u);
    return _mm512_xor_si512(u, _mm512_or_si512(_mm512_srai_epi32(u, 31), _mm512_set1_epi32((int)0x80000000u)));
}
AI void vkstore(uint32_t *p, vk v) { _mm512_storeu_si512(p, v); }
AI vk vkmax(vk a, vk b) { return _mm512_max_epu32(a, b); }
AI uint32_t vkhmax(vk a) { return _mm512_reduce_max_epu32(a); }
#else
typedef __m256i vk;
AI vk vkey(const float *z) {
    __m256i u = _mm256_loadu_si256((const __m256i *)(const void *)z);
    u = _mm256_andnot_si256(_mm256_cmpeq_epi32(u, _mm256_set1_epi32((int)0x80000000u)), u);
    return _mm256_xor_si256(u, _mm256_or_si256(_mm256_srai_epi32(u, 31), _mm256_set1_epi32((int)0x80000000u)));
}
AI void vkstore(uint32_t *p, vk v) { _mm256_storeu_si256((__m256i *)(void *)p, v); }
AI vk vkmax(vk a, vk b) { return _mm256_max_epu32(a, b); }
AI uint32_t vkhmax(vk a) {
    __m128i m = _mm_max_epu32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4e));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xb1));
    return (uint32_t)_mm_cvtsi128_si32(m);
}
#endif

static void k_sample_keys(const float *z, int64_t n, uint32_t *key, uint32_t *bm) {
    const int64_t nf = n / DSP_SAMPLE_KEY_BLOCK * DSP_SAMPLE_KEY_BLOCK;
    for (int64_t j0 = 0; j0 < nf; j0 += DSP_SAMPLE_KEY_BLOCK) {
        vk m = vkey(z + j0);
        vkstore(key + j0, m);
        for (int v = VW; v < DSP_SAMPLE_KEY_BLOCK; v += VW) {
            const vk k = vkey(z + j0 + v);
            vkstore(key + j0 + v, k);
            m = vkmax(m, k);
        }
        bm[j0 / DSP_SAMPLE_KEY_BLOCK] = vkhmax(m);
    }
    if (nf < n) dsp_cpu_sample_keys(z + nf, n - nf, key + nf, bm + nf / DSP_SAMPLE_KEY_BLOCK);
}

const dsp_cpu_ops OPS_NAME = {
    ISA_NAME, k_matmul, k_matmul_q8, k_matmul_panel, k_quantize_q8, k_dequant_row, k_dot, k_rmsnorm, k_softmax, k_swiglu, dsp_cpu_rope, k_axpy, k_dots, k_axpys,
    k_dots16, k_axpys16, k_argmax, k_sample_weights, k_sample_mass, k_sample_probs,
    k_sample_keys,
};
