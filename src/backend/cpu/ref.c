/* backend/cpu/ref: scalar reference kernels (see ops.h). The 16-lane partial sums let the compiler
 * use SIMD registers without reassociating anything: lane k always sums elements k, k+16, ... */
#include "backend/cpu/ops.h"

#include "core/quant.h"

#include <math.h>

#define LANES 16

static float tree16(float *acc) {
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int k = 0; k < w; k++) acc[k] = acc[k] + acc[k + w];
    return acc[0];
}

float dsp_cpu_dot_f32(const float *a, const float *b, int64_t n) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) acc[k] += a[i + k] * b[i + k];
    for (int k = 0; i < n; i++, k++) acc[k] += a[i] * b[i];
    return tree16(acc);
}

float dsp_cpu_sumsq_f32(const float *a, int64_t n) { return dsp_cpu_dot_f32(a, a, n); }

void dsp_cpu_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    float mean = dsp_cpu_sumsq_f32(x, n) / (float)n;
    float r = 1.0f / sqrtf(mean + eps);
    for (int64_t i = 0; i < n; i++) out[i] = w ? w[i] * (x[i] * r) : x[i] * r;
}

void dsp_cpu_softmax(float *x, int64_t n) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    float sum = 0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void dsp_cpu_swiglu(float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) a[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
}

void dsp_cpu_rope(float *x, const float *cs, int rot_dim, int neox) {
    int half = rot_dim / 2;
    for (int i = 0; i < half; i++) {
        int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        float c = cs[2 * i], s = cs[2 * i + 1], x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * c - x1 * s;
        x[i1] = x1 * c + x0 * s;
    }
}

void dsp_cpu_axpy(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

int64_t dsp_cpu_argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

void dsp_cpu_ref_matmul(uint32_t type, const void *w, size_t row_bytes, int64_t in, int64_t r0, int64_t r1, const float *x,
                        int64_t ldx, int n_x, float *y, int64_t ldy, float *scratch) {
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *src = (const uint8_t *)w + (size_t)r * row_bytes;
        const float *wr = scratch;
        if (type == 0 /* DSP_F32 */) wr = (const float *)src;
        else dsp_dequantize_row(type, src, scratch, (uint64_t)in);
        for (int i = 0; i < n_x; i++) y[(size_t)i * ldy + r] = dsp_cpu_dot_f32(x + (size_t)i * ldx, wr, in);
    }
}

float dsp_cpu_dot32_fma_ref(const float *a, const float *b, int64_t n) {
    float l[32] = {0};
    for (int64_t i = 0; i < n; i++) l[i % 32] = fmaf(a[i], b[i], l[i % 32]);
    for (int w = 16; w > 0; w /= 2)
        for (int k = 0; k < w; k++) l[k] = l[k] + l[k + w];
    return l[0];
}

static void ref_dequant_row(uint32_t type, const void *src, float *dst, int64_t n) { dsp_dequantize_row(type, src, dst, (uint64_t)n); }

const dsp_cpu_ops dsp_cpu_ops_scalar = {
    "scalar", dsp_cpu_ref_matmul, ref_dequant_row, dsp_cpu_dot_f32, dsp_cpu_rmsnorm, dsp_cpu_softmax,
    dsp_cpu_swiglu, dsp_cpu_rope, dsp_cpu_axpy, dsp_cpu_argmax,
};
