/* tests/rand_weights: random activations and weight rows of every type for kernel tests
 * (deterministic xorshift, finite scales of sane size), and the NMSE the tests compare with. */
#ifndef DSP_TEST_RAND_WEIGHTS_H
#define DSP_TEST_RAND_WEIGHTS_H

#include "core/dtype.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static inline uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}
static inline float frnd(void) { return (float)((double)rnd() / 4294967296.0 * 2.0 - 1.0); }

static inline void *xalloc(size_t bytes) {
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) abort();
    return p;
}

static inline double nmse(const float *a, const float *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

static inline void put_f16(uint8_t *p, float v) {
    uint16_t h = dsp_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* a random weight row of `type` with n elements: random quants, finite scales of sane size */
static inline void random_row(uint32_t type, uint8_t *row, int64_t n) {
    size_t bytes = dsp_dtype_row_bytes(type, (uint64_t)n);
    for (size_t i = 0; i < bytes; i++) row[i] = (uint8_t)rnd();
    switch (type) {
    case DSP_F32:
        for (int64_t i = 0; i < n; i++) ((float *)row)[i] = frnd();
        break;
    case DSP_F16:
        for (int64_t i = 0; i < n; i++) put_f16(row + 2 * i, frnd());
        break;
    case DSP_BF16:
        for (int64_t i = 0; i < n; i++) {
            float f = frnd();
            uint32_t u;
            memcpy(&u, &f, 4);
            uint16_t h = (uint16_t)(u >> 16);
            memcpy(row + 2 * i, &h, 2);
        }
        break;
    case DSP_Q4_0: for (size_t b = 0; b < bytes; b += 18) put_f16(row + b, 0.02f * frnd()); break;
    case DSP_Q5_0: for (size_t b = 0; b < bytes; b += 22) put_f16(row + b, 0.02f * frnd()); break;
    case DSP_Q8_0: for (size_t b = 0; b < bytes; b += 34) put_f16(row + b, 0.002f * frnd()); break;
    case DSP_Q4_1:
        for (size_t b = 0; b < bytes; b += 20) put_f16(row + b, 0.02f * frnd()), put_f16(row + b + 2, 0.1f * frnd());
        break;
    case DSP_Q4_K:
        for (size_t b = 0; b < bytes; b += 144) put_f16(row + b, 0.001f * frnd()), put_f16(row + b + 2, 0.001f * frnd());
        break;
    case DSP_Q5_K:
        for (size_t b = 0; b < bytes; b += 176) put_f16(row + b, 0.001f * frnd()), put_f16(row + b + 2, 0.001f * frnd());
        break;
    case DSP_Q6_K: for (size_t b = 0; b < bytes; b += 210) put_f16(row + b + 208, 0.001f * frnd()); break;
    default: break;
    }
}

#endif
