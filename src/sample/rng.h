/* sample/rng: the per-request random number generator.
 *
 * xoshiro256** (Blackman & Vigna, 2018) with its 256-bit state filled from a 64-bit seed by
 * splitmix64, both written here from the published algorithm descriptions. The state is a plain
 * struct the request owns: no globals, no locks, so two requests in one batch never share or
 * disturb each other's stream, and a request replays exactly from its seed on any platform
 * (integer arithmetic only; the double conversion is exact).
 *
 * Consumption pattern: dsp_sample_token (sample.h) draws exactly one uniform per call, whatever
 * the parameters (greedy included), so after n sampled tokens the stream has advanced by n draws.
 * The speculative verifier documents its own pattern (it draws the uniforms it passes in). */
#ifndef DSP_SAMPLE_RNG_H
#define DSP_SAMPLE_RNG_H

#include <stdint.h>

typedef struct dsp_rng {
    uint64_t s[4]; /* xoshiro256** state; never all zero (splitmix64 seeding guarantees it) */
} dsp_rng;

/* Fill the state from a 64-bit seed: s[i] = successive outputs of splitmix64 started at seed. */
void dsp_rng_seed(dsp_rng *rng, uint64_t seed);
/* Next 64 raw bits. */
uint64_t dsp_rng_next_u64(dsp_rng *rng);
/* A double in [0, 1) with 53 random bits: (next_u64 >> 11) * 2^-53. One draw. */
double dsp_rng_uniform(dsp_rng *rng);

#endif
