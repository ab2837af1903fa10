/* backend/cpu/ops: CPU kernels behind one ops table chosen at run time.
 *
 * Three implementations, each in its own translation unit:
 *   ref.c     scalar reference, kept forever as the oracle (portable C, no intrinsics);
 *   avx2.c    AVX2 + FMA + F16C (compiled with those flags only);
 *   avx512.c  AVX-512 F/BW/VL/DQ (compiled with those flags only).
 * cpu.c detects the CPU (cpuid + xgetbv: the OS must have enabled the register state) and picks
 * the best table once; -march=native is never needed. DSP_CPU_ISA=scalar|avx2|avx512 in the
 * environment caps the choice (for tests and for comparisons).
 *
 * Batch invariance (DESIGN.md §2): every kernel computes each output element with a reduction
 * order that depends only on the reduction length, never on how many rows are in the batch, how
 * they are tiled or which thread runs them. Within one table that makes a token's logits
 * bit-identical alone or in any batch. Different tables may round differently.
 *
 * The SIMD tables share one reduction order for dot products ("32-lane FMA order"): lane j
 * (0..31) accumulates a[32s+j]*b[32s+j] for s = 0, 1, ... with fused multiply-adds from +0 (a
 * missing tail element contributes nothing), then lanes are summed by a fixed tree
 * t16[j] = L[j] + L[j+16], t8[j] = t16[j] + t16[j+8], ... So AVX2 and AVX-512 give bit-identical
 * dot products and matmuls (tests check this where both run); only exp-based kernels differ.
 * Weights are dequantized bit-exactly (the same float operations as core/quant.c), so a
 * matmul differs from the reference only by the summation order of its dot products. */
#ifndef DSP_BACKEND_CPU_OPS_H
#define DSP_BACKEND_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

/* Weight rows a matmul call dequantizes at a time; the scratch it needs is
 * DSP_CPU_MM_ROWS * dsp_cpu_mm_stride(in) floats, 64-byte aligned. */
#define DSP_CPU_MM_ROWS 16
static inline int64_t dsp_cpu_mm_stride(int64_t in) { return (in + 15) / 16 * 16; }

/* y[i*ldy + r] = sum_k x[i*ldx + k] * W[r, k] for r in [r0, r1), i in [0, n_x).
 * W is a row-major weight matrix of `type` (a dsp_dtype id) with `in` columns, each row row_bytes
 * long, starting at w. `type` must have a reference dequantization and `in` must be a whole
 * number of its blocks (checked where the weights are bound, not here). */
typedef void (*dsp_cpu_matmul_fn)(uint32_t type, const void *w, size_t row_bytes, int64_t in, int64_t r0, int64_t r1,
                                  const float *x, int64_t ldx, int n_x, float *y, int64_t ldy, float *scratch);

typedef struct dsp_cpu_ops {
    const char *name; /* "scalar", "avx2", "avx512" */
    dsp_cpu_matmul_fn matmul;
    /* dst[0..n) = row of `type` at src, bit-identical to dsp_dequantize_row; n whole blocks */
    void (*dequant_row)(uint32_t type, const void *src, float *dst, int64_t n);
    float (*dot)(const float *a, const float *b, int64_t n);
    /* out = w * (x / sqrt(mean(x^2) + eps)); out may alias x; w may be NULL */
    void (*rmsnorm)(float *out, const float *x, const float *w, int64_t n, float eps);
    void (*softmax)(float *x, int64_t n);                       /* in place */
    void (*swiglu)(float *a, const float *b, int64_t n);        /* a = silu(a) * b */
    void (*rope)(float *x, const float *cs, int rot_dim, int neox);
    void (*axpy)(float *y, float a, const float *x, int64_t n); /* y += a * x, element-wise (exact order) */
    int64_t (*argmax)(const float *x, int64_t n);               /* first index of the maximum (no NaN) */
} dsp_cpu_ops;

/* The table for this CPU (chosen on the first call, thread-safe). */
const dsp_cpu_ops *dsp_cpu_ops_best(void);
/* A table by name, or NULL if it was not compiled in or this CPU/OS cannot run it. */
const dsp_cpu_ops *dsp_cpu_ops_get(const char *name);
/* "avx512", "avx2" or "scalar": what this CPU can run, ignoring DSP_CPU_ISA */
const char *dsp_cpu_isa_supported(void);

/* ---- the scalar reference (ref.c) ------------------------------------------------------------ */

/* sum_i a[i]*b[i] in a fixed order: 16 interleaved partial sums, then a fixed pairwise tree */
float dsp_cpu_dot_f32(const float *a, const float *b, int64_t n);
/* sum of squares, same order as dot */
float dsp_cpu_sumsq_f32(const float *a, int64_t n);
/* out = w * (x / sqrt(mean(x^2) + eps)); out may alias x; w may be NULL (no weight) */
void dsp_cpu_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);
/* in-place softmax over n values */
void dsp_cpu_softmax(float *x, int64_t n);
/* a = silu(a) * b */
void dsp_cpu_swiglu(float *a, const float *b, int64_t n);
/* Rotate one head in place. cs holds (cos, sin) pairs for i in 0..rot_dim/2. neox: pairs (i, i+rot/2),
 * else adjacent pairs (2i, 2i+1). Dimensions past rot_dim are left alone. */
void dsp_cpu_rope(float *x, const float *cs, int rot_dim, int neox);
void dsp_cpu_axpy(float *y, float a, const float *x, int64_t n);
int64_t dsp_cpu_argmax(const float *x, int64_t n);
/* reference matmul: dsp_dequantize_row of each weight row, then dsp_cpu_dot_f32 with each x row */
void dsp_cpu_ref_matmul(uint32_t type, const void *w, size_t row_bytes, int64_t in, int64_t r0, int64_t r1, const float *x,
                        int64_t ldx, int n_x, float *y, int64_t ldy, float *scratch);
/* the 32-lane FMA dot order of the SIMD tables, in portable C (fmaf): their bitwise oracle */
float dsp_cpu_dot32_fma_ref(const float *a, const float *b, int64_t n);

extern const dsp_cpu_ops dsp_cpu_ops_scalar;
/* defined by the ISA translation units (avx2.c, avx512.c) */
extern const dsp_cpu_ops dsp_cpu_ops_avx2;
extern const dsp_cpu_ops dsp_cpu_ops_avx512;

#endif
