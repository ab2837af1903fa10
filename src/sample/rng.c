/* sample/rng: xoshiro256** seeded by splitmix64. See rng.h. */
#include "sample/rng.h"

static uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* splitmix64 step: advance the 64-bit counter by the golden-ratio increment, then mix. */
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

void dsp_rng_seed(dsp_rng *rng, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&x);
    /* splitmix64 is a bijection of its counter, so four successive outputs cannot all be zero;
     * keep the guard anyway since an all-zero state would emit zeros forever. */
    if ((rng->s[0] | rng->s[1] | rng->s[2] | rng->s[3]) == 0) rng->s[0] = 1;
}

uint64_t dsp_rng_next_u64(dsp_rng *rng) {
    uint64_t *s = rng->s;
    uint64_t result = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

double dsp_rng_uniform(dsp_rng *rng) {
    /* the top 53 bits, scaled by 2^-53: every value is an exact double in [0, 1) */
    return (double)(dsp_rng_next_u64(rng) >> 11) * 0x1.0p-53;
}
