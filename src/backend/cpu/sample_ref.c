/* backend/cpu/sample_ref: the sampler's step-6 kernels in portable C (ops.h, sample_*): the
 * reference the vector tables follow bit for bit, and the scalar table's own.
 *
 * Compiled with -fno-trapping-math (CMakeLists.txt), this file only: it lets the compiler turn
 * the exp's clamp (x > MIN ? x : MIN) into a vector select, so the weights loop runs two lanes
 * wide on a plain x86-64 (SSE2) build; without it GCC keeps a branch and one element at a time.
 * The flag changes no value (IEEE operations still round the same way, nothing is reassociated
 * or contracted: that would take -fassociative-math or FMA); it only lets the compiler ignore
 * floating-point exception flags, which nothing here reads. test_kernels holds every table to
 * these functions bit for bit. */
#include "backend/cpu/ops.h"
#include "sample/sample_kernels.h"

/* In blocks, the weights first and then their sum: the first loop has no dependence between
 * elements, so the compiler may vectorize it (SSE2: the same operations per lane). */
double dsp_cpu_sample_weights(const float *z, int64_t n, double zmax, double t, double min_w, double *w) {
    double sum = 0.0;
    for (int64_t i0 = 0; i0 < n; i0 += 64) {
        const int64_t i1 = n - i0 < 64 ? n : i0 + 64;
        for (int64_t i = i0; i < i1; i++) w[i] = dsp_sample_exp(((double)z[i] - zmax) / t);
        for (int64_t i = i0; i < i1; i++)
            if (w[i] > 0.0 && w[i] >= min_w) sum += w[i];
    }
    return sum;
}

double dsp_cpu_sample_mass(const float *z, const double *w, int64_t n, float z_thr, double min_w) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        if (w[i] > 0.0 && w[i] >= min_w && z[i] >= z_thr) sum += w[i];
    return sum;
}

double dsp_cpu_sample_probs(const float *z, const double *w, int64_t n, float z_thr, double min_w, double mass, float *p,
                            int32_t *kept, int32_t *n_kept) {
    int32_t nk = 0;
    const double psum = dsp_sample_probs_range(z, w, 0, n, z_thr, min_w, mass, p, kept, &nk, 0.0);
    *n_kept = nk;
    return psum;
}

void dsp_cpu_sample_keys(const float *z, int64_t n, uint32_t *key, uint32_t *bm) {
    for (int64_t b = 0; b * DSP_SAMPLE_KEY_BLOCK < n; b++) {
        const int64_t j0 = b * DSP_SAMPLE_KEY_BLOCK, j1 = n - j0 < DSP_SAMPLE_KEY_BLOCK ? n : j0 + DSP_SAMPLE_KEY_BLOCK;
        uint32_t mx = 0;
        for (int64_t j = j0; j < j1; j++) {
            key[j] = dsp_sample_key(z[j]);
            mx = key[j] > mx ? key[j] : mx;
        }
        bm[b] = mx;
    }
}
