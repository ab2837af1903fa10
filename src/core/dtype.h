/* core/dtype: tensor element types and their block layouts.
 *
 * The enum values are the GGML type ids stored in GGUF files, so a file's type field maps to
 * dsp_dtype by value. A quantized type stores `block_elems` consecutive elements of a row in
 * `block_bytes` bytes; a row of n elements must have n % block_elems == 0. The block structs and
 * the scalar reference dequantization live in core/quant.{h,c}. */
#ifndef DSP_CORE_DTYPE_H
#define DSP_CORE_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum dsp_dtype {
    DSP_F32 = 0, DSP_F16 = 1, DSP_Q4_0 = 2, DSP_Q4_1 = 3,
    DSP_Q5_0 = 6, DSP_Q5_1 = 7, DSP_Q8_0 = 8, DSP_Q8_1 = 9,
    DSP_Q2_K = 10, DSP_Q3_K = 11, DSP_Q4_K = 12, DSP_Q5_K = 13, DSP_Q6_K = 14, DSP_Q8_K = 15,
    DSP_IQ2_XXS = 16, DSP_IQ2_XS = 17, DSP_IQ3_XXS = 18, DSP_IQ1_S = 19, DSP_IQ4_NL = 20,
    DSP_IQ3_S = 21, DSP_IQ2_S = 22, DSP_IQ4_XS = 23,
    DSP_I8 = 24, DSP_I16 = 25, DSP_I32 = 26, DSP_I64 = 27, DSP_F64 = 28, DSP_IQ1_M = 29,
    DSP_BF16 = 30, DSP_TQ1_0 = 34, DSP_TQ2_0 = 35, DSP_MXFP4 = 39,
    DSP_DTYPE_COUNT = 40,
} dsp_dtype;

typedef struct dsp_dtype_traits {
    const char *name;      /* "Q4_K"; NULL for ids that GGML has retired or never used */
    uint32_t block_elems;  /* elements per block (1 for plain types) */
    uint32_t block_bytes;  /* bytes per block */
    bool can_dequant;      /* core/quant has a reference dequantization for it */
} dsp_dtype_traits;

/* Traits of a type id read from a file; NULL if the id is unknown or retired. */
const dsp_dtype_traits *dsp_dtype_get(uint32_t type_id);
const char *dsp_dtype_name(uint32_t type_id); /* "type#N" style text is the caller's job on NULL */

/* Bytes of a row of n elements, or 0 if n is not a whole number of blocks or the type is unknown. */
size_t dsp_dtype_row_bytes(uint32_t type_id, uint64_t n);

/* IEEE half / bfloat16 <-> float. Exact (round-to-nearest-even for the narrowing direction). */
static inline float dsp_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t dsp_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) { /* result is subnormal or zero */
        if (ax < 0x33000000u) return (uint16_t)sign;
        uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        /* value = m * 2^(e-150) and the half subnormal unit is 2^-24, so hm = m >> (126 - e) */
        uint32_t hm = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (hm & 1))) hm++;
        return (uint16_t)(sign | hm);
    }
    uint32_t h = ((ax >> 13) - ((127 - 15) << 10));
    uint32_t rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

/* f32 -> bf16, rounded to nearest even; NaN stays a (quiet) NaN */
static inline uint16_t dsp_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

static inline float dsp_bf16_to_f32(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

#endif
