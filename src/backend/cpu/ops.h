/* backend/cpu/ops: CPU kernels. This file holds the scalar reference versions, kept forever as
 * the oracle for faster ISA-specific ones.
 *
 * Batch invariance: every kernel computes each output element with a reduction order that depends
 * only on the reduction length, never on how many rows are in the batch or which thread runs it. */
#ifndef DSP_BACKEND_CPU_OPS_H
#define DSP_BACKEND_CPU_OPS_H

#include <stdint.h>

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

#endif
