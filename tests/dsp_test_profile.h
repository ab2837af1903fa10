/* tests/dsp_test_profile.h: a synthetic cost profile for the tests of --max-draft auto
 * (test_spec_e2e.c, test_drafter.c): a forward of n rows costs 1 + slope (n - 1) one-row forwards
 * at 1..64 rows, no context term, the block drafter draft_rel; one_row_ms turns measured round times
 * into those units (1e9 makes the measured host time negligible). */
#ifndef DSP_TEST_PROFILE_H
#define DSP_TEST_PROFILE_H

#include "engine/engine.h"

#include <string.h>

static inline void dsp_test_linear_profile(dsp_engine *e, float slope, double one_row_ms, float draft_rel) {
    static const int grid[] = {1, 2, 4, 8, 16, 32, 64};
    memset(&e->prof, 0, sizeof e->prof);
    e->prof.n = (int32_t)(sizeof grid / sizeof grid[0]);
    for (int i = 0; i < e->prof.n; i++) e->prof.rows[i] = grid[i], e->prof.rel[i] = 1.0f + slope * (float)(grid[i] - 1);
    e->prof.one_row_ms = one_row_ms;
    e->prof.ctx_tokens = 100000;
    e->prof.draft_rel = draft_rel;
    e->have_prof = true;
}

#endif
