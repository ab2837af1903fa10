/* core/quant: the packed block layouts of the GGML quantized types and their scalar reference
 * dequantization to f32.
 *
 * This is the forever-oracle for the fast kernels: it is written for clarity, one block at a
 * time, and it is bit-exact against the `gguf` Python package's numpy dequantize (tests/py/
 * test_dequant.py checks it on random blocks and on every tensor of the real models). Bit-exactness
 * rests on three things: (1) the f16 scales are widened exactly (dsp_f16_to_f32); (2) each output
 * is computed with the same float32 operations in the same order as numpy, e.g. Q4_1 is
 * `d * q + m` and Q2_K is `(d * sc) * q - (dmin * m)`; (3) nothing is fused: the build uses
 * -ffp-contract=off. Integer parts (nibble/bit unpacking, offsets such as -8) are exact anyway.
 * NaN results agree with numpy as NaN, not necessarily in their payload bits.
 *
 * Layouts assume a little-endian host (x86-64), as GGUF files are little-endian. "f16" below is an
 * IEEE half stored as uint16_t. QK_K = 256 is the super-block size of the K-quants. Source blocks
 * need no alignment: the reference copies each block into a local struct before reading it. */
#ifndef DSP_CORE_QUANT_H
#define DSP_CORE_QUANT_H

#include "core/dtype.h"
#include "core/status.h"

#include <stdint.h>

#define DSP_QK 32   /* block size of the legacy quants Q4_0 .. Q8_0 */
#define DSP_QK_K 256 /* super-block size of the K-quants */
#define DSP_K_SCALE_SIZE 12

/* Q4_0: 32 weights, y = d * (q - 8) with q in 0..15.
 * qs[j] holds weight j in its low nibble and weight j + 16 in its high nibble. */
typedef struct dsp_block_q4_0 {
    uint16_t d;               /* f16 scale */
    uint8_t qs[DSP_QK / 2];   /* nibbles */
} dsp_block_q4_0;

/* Q4_1: 32 weights, y = d * q + m with q in 0..15; nibble order as Q4_0. */
typedef struct dsp_block_q4_1 {
    uint16_t d;               /* f16 scale */
    uint16_t m;               /* f16 minimum (added) */
    uint8_t qs[DSP_QK / 2];
} dsp_block_q4_1;

/* Q5_0: 32 weights, y = d * (q - 16) with q in 0..31. The low 4 bits of q come from qs (nibble
 * order as Q4_0); bit 4 of weight j is bit j of the little-endian u32 in qh. */
typedef struct dsp_block_q5_0 {
    uint16_t d;               /* f16 scale */
    uint8_t qh[4];            /* fifth bits, as bytes so the struct has no padding */
    uint8_t qs[DSP_QK / 2];
} dsp_block_q5_0;

/* Q5_1: 32 weights, y = d * q + m with q in 0..31; bit layout as Q5_0. */
typedef struct dsp_block_q5_1 {
    uint16_t d;               /* f16 scale */
    uint16_t m;               /* f16 minimum */
    uint8_t qh[4];
    uint8_t qs[DSP_QK / 2];
} dsp_block_q5_1;

/* Q8_0: 32 weights, y = q * d with q a signed byte. */
typedef struct dsp_block_q8_0 {
    uint16_t d;               /* f16 scale */
    int8_t qs[DSP_QK];
} dsp_block_q8_0;

/* Q2_K: 256 weights in 16 sub-blocks of 16. Sub-block s has a 4-bit scale (scales[s] & 15) and a
 * 4-bit min (scales[s] >> 4): y = (d * sc) * q - (dmin * m), q in 0..3. Weight i = 128*h + 32*k
 * + l (h < 2, k < 4, l < 32) is bits 2k..2k+1 of qs[32*h + l]; its sub-block is i / 16. */
typedef struct dsp_block_q2_K {
    uint8_t scales[DSP_QK_K / 16]; /* low nibble: scale, high nibble: min */
    uint8_t qs[DSP_QK_K / 4];      /* 2-bit quants */
    uint16_t d;                    /* f16 super-block scale for the scales */
    uint16_t dmin;                 /* f16 super-block scale for the mins */
} dsp_block_q2_K;

/* Q3_K: 256 weights in 16 sub-blocks of 16, y = (d * (sc - 32)) * q with q in -4..3.
 * q = low2 - (hbit ? 0 : 4): low2 of weight i = 128*h + 32*k + l is bits 2k..2k+1 of
 * qs[32*h + l]; hbit of weight i = 32*b + l is bit b of hmask[l].
 * The 16 6-bit scales sc[s] are packed in 12 bytes: the low 4 bits are the low nibble (s < 8) or
 * high nibble (s >= 8) of scales[s % 8]; the high 2 bits are bits 2*(s/4).. of scales[8 + s % 4]. */
typedef struct dsp_block_q3_K {
    uint8_t hmask[DSP_QK_K / 8];   /* high bits (inverted sense) */
    uint8_t qs[DSP_QK_K / 4];      /* low 2 bits */
    uint8_t scales[12];            /* 6-bit scales, packed */
    uint16_t d;                    /* f16 super-block scale */
} dsp_block_q3_K;

/* Q4_K: 256 weights in 8 sub-blocks of 32, y = (d * sc) * q - (dmin * m), q in 0..15, with 6-bit
 * sc/m per sub-block packed in scales[12] (dsp_quant_scale_min_k4). Sub-block j = 2*h + s (h < 4,
 * s < 2): weight l of it is nibble s of qs[32*h + l]. */
typedef struct dsp_block_q4_K {
    uint16_t d;                    /* f16 super-block scale for the scales */
    uint16_t dmin;                 /* f16 super-block scale for the mins */
    uint8_t scales[DSP_K_SCALE_SIZE];
    uint8_t qs[DSP_QK_K / 2];
} dsp_block_q4_K;

/* Q5_K: as Q4_K with a fifth bit: q in 0..31; bit 4 of weight l of sub-block j is bit j of qh[l]. */
typedef struct dsp_block_q5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[DSP_K_SCALE_SIZE];
    uint8_t qh[DSP_QK_K / 8];
    uint8_t qs[DSP_QK_K / 2];
} dsp_block_q5_K;

/* Q6_K: 256 weights in 16 sub-blocks of 16, y = (d * scales[i / 16]) * (q - 32), q in 0..63.
 * For weight i = 128*h + r (h < 2, r < 128): the low 4 bits are nibble (r / 64) of
 * ql[64*h + r % 64]; the high 2 bits are bits 2*(r / 32).. of qh[32*h + r % 32]. */
typedef struct dsp_block_q6_K {
    uint8_t ql[DSP_QK_K / 2];      /* low 4 bits */
    uint8_t qh[DSP_QK_K / 4];      /* high 2 bits */
    int8_t scales[DSP_QK_K / 16];  /* signed 8-bit sub-block scales */
    uint16_t d;                    /* f16 super-block scale */
} dsp_block_q6_K;

/* Q8_K: 256 weights, y = d * q. The intermediate type of the K-quant dot products; bsums are the
 * sums of each group of 16 quants and play no part in dequantization. */
typedef struct dsp_block_q8_K {
    float d;                       /* f32 scale */
    int8_t qs[DSP_QK_K];
    int16_t bsums[DSP_QK_K / 16];
} dsp_block_q8_K;

/* 6-bit scale and min of sub-block j (< 8) of a Q4_K/Q5_K block: j < 4 store them in the low 6
 * bits of bytes j and j + 4; j >= 4 store the low 4 bits in byte j + 4 (scale: low nibble, min:
 * high nibble) and the high 2 bits in the top bits of bytes j - 4 (scale) and j (min). */
static inline void dsp_quant_scale_min_k4(const uint8_t scales[DSP_K_SCALE_SIZE], int j,
                                          uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = scales[j] & 63;
        *m = scales[j + 4] & 63;
    } else {
        *sc = (uint8_t)((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
        *m = (uint8_t)((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
    }
}

/* Dequantize n consecutive elements of a row of type `type` (a dsp_dtype id) from src into dst.
 * n must be a multiple of the type's block size (DSP_ERR_INVALID_ARG otherwise); types without a
 * reference (see dsp_dtype_traits.can_dequant) give DSP_ERR_UNSUPPORTED. src holds exactly
 * dsp_dtype_row_bytes(type, n) bytes and need not be aligned. */
dsp_status dsp_dequantize_row(uint32_t type, const void *src, float *dst, uint64_t n);

/* Quantize n floats (a multiple of the type's block size) into Q8_0, Q4_0 or Q4_K blocks at dst.
 * Q8_0 and Q4_0 are bit-identical to the gguf package's numpy quantizer (gguf/quants.py, which
 * follows ggml's reference): Q8_0 d = amax / 127, q = round-half-away(x / d); Q4_0 d = (the element
 * of largest magnitude) / -8, q = trunc(x / d + 8.5) clipped to 0..15. Same float32 operations in
 * the same order, nothing fused. Q4_K follows llama.cpp's reference quantizer
 * (quantize_row_q4_K_ref), for which the gguf package has no counterpart: see quant.c. Other
 * types are DSP_ERR_UNSUPPORTED. */
dsp_status dsp_quantize_row(uint32_t type, const float *src, void *dst, uint64_t n);

#endif
