/* spec/lookup: the hash-indexed prompt-lookup drafter proposes exactly what a brute-force scan
 * proposes (longest n from max_n down to min_n, most recent earlier occurrence, continuation
 * extended through the drafted tokens when it runs into the suffix), on random sequences fed
 * incrementally as the engine feeds them; plus the documented examples and parameter checks. */
#include "dsp_test.h"

#include "dspark.h"
#include "spec/spec.h"

#include <stdlib.h>
#include <string.h>

/* brute force: scan every earlier end position, most recent first */
static int32_t ref_propose(const int32_t *t, uint32_t n, int32_t min_n, int32_t max_n, int32_t k, int32_t *draft) {
    for (int32_t g = max_n; g >= min_n; g--) {
        if ((uint32_t)g >= n) continue;
        for (int64_t e = (int64_t)n - 2; e >= g - 1; e--) { /* n-gram t[e-g+1 .. e], continuation e+1 <= n-1 */
            if (memcmp(t + e - g + 1, t + n - (uint32_t)g, sizeof(int32_t) * (size_t)g)) continue;
            uint32_t pos = (uint32_t)e + 1;
            for (int32_t i = 0; i < k; i++) draft[i] = pos + (uint32_t)i < n ? t[pos + (uint32_t)i] : draft[pos + (uint32_t)i - n];
            return k;
        }
    }
    return 0;
}

static void test_matches_brute_force(void) {
    uint64_t x = 7;
    int agree = 0, total = 0, with_draft = 0;
    for (int trial = 0; trial < 60; trial++) {
        int32_t min_n = 1 + trial % 3, max_n = min_n + trial % 4, vocab = 2 + trial % 9, kmax = 1 + trial % 12;
        dsp_lookup_params lp = {min_n, max_n, kmax, 400, false};
        dsp_drafter *d;
        CHECK(dsp_lookup_create(&lp, &d) == DSP_OK);
        dsp_drafter_reset(d);
        int32_t t[400];
        uint32_t n = 0, n_prompt = 1 + (uint32_t)(trial % 40);
        for (; n < n_prompt; n++) x = x * 6364136223846793005ull + 1442695040888963407ull, t[n] = (int32_t)((x >> 33) % (uint64_t)vocab);
        dsp_spec_commit c = {t, n, n, 0, 0, NULL, 0, 0};
        dsp_drafter_observe(d, &c);
        while (n < 399) {
            int32_t a[32], b[32];
            int32_t ka = dsp_drafter_propose(d, t, n, kmax, a, NULL), kb = ref_propose(t, n, min_n, max_n, kmax, b);
            total++;
            if (ka == kb && !memcmp(a, b, sizeof(int32_t) * (size_t)ka)) agree++;
            else fprintf(stderr, "trial %d n %u: got %d drafts, want %d\n", trial, n, ka, kb);
            with_draft += kb > 0;
            /* commit 1..3 tokens: some follow the draft (as accepted drafts would), some not */
            uint32_t add = 1 + (uint32_t)(x >> 40) % 3;
            for (uint32_t i = 0; i < add && n < 399; i++, n++) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                t[n] = (ka > (int32_t)i && (x >> 60) < 12) ? a[i] : (int32_t)((x >> 33) % (uint64_t)vocab);
            }
            dsp_spec_commit cm = {t, n, add, 0, 0, NULL, 0, 0};
            dsp_drafter_observe(d, &cm);
        }
        dsp_drafter_destroy(d);
    }
    CHECK_EQ_INT(agree, total);
    CHECK(with_draft > total / 3);
}

static void test_examples(void) {
    dsp_lookup_params lp = {2, 3, 4, 64, false};
    dsp_drafter *d;
    CHECK(dsp_lookup_create(&lp, &d) == DSP_OK);
    dsp_drafter_reset(d);
    /* vLLM's docstring example: [1,2,3,4,2,3] -> [4,2,3] (+ the period continued: 4) */
    int32_t t[] = {1, 2, 3, 4, 2, 3, 9, 9, 9};
    int32_t dr[8];
    dsp_spec_commit c = {t, 6, 6, 0, 0, NULL, 0, 0};
    dsp_drafter_observe(d, &c);
    CHECK_EQ_INT(dsp_drafter_propose(d, t, 6, 3, dr, NULL), 3);
    CHECK(dr[0] == 4 && dr[1] == 2 && dr[2] == 3);
    CHECK_EQ_INT(dsp_drafter_propose(d, t, 6, 4, dr, NULL), 4);
    CHECK_EQ_INT(dr[3], 4);
    CHECK_EQ_INT(dsp_lookup_last_match(d), 2);
    /* no earlier occurrence of the suffix: no draft */
    CHECK_EQ_INT(dsp_drafter_propose(d, t, 7, 4, dr, NULL), 0);
    /* the longest n wins over a more recent shorter match: 5 6 7 | 0 6 7 | 1 5 6 7 -> after "5 6 7" */
    dsp_drafter_reset(d);
    int32_t u[] = {5, 6, 7, 0, 6, 7, 1, 5, 6, 7};
    dsp_spec_commit cu = {u, 10, 10, 0, 0, NULL, 0, 0};
    dsp_drafter_observe(d, &cu);
    CHECK_EQ_INT(dsp_drafter_propose(d, u, 10, 1, dr, NULL), 1);
    CHECK_EQ_INT(dr[0], 0);
    CHECK_EQ_INT(dsp_lookup_last_match(d), 3);
    dsp_drafter_destroy(d);
}

/* adaptive draft length: full acceptance doubles the cap, a rejection cuts it to accepted + 1,
 * and a match reaching back m tokens drafts at most 2m */
static void test_adaptive(void) {
    dsp_lookup_params lp = {1, 2, 16, 64, true};
    dsp_drafter *d;
    CHECK(dsp_lookup_create(&lp, &d) == DSP_OK);
    dsp_drafter_reset(d);
    int32_t t[] = {1, 2, 1, 2, 1, 2, 1, 2};
    int32_t dr[32];
    dsp_spec_commit c = {t, 4, 4, 0, 0, NULL, 0, 0};
    dsp_drafter_observe(d, &c);
    CHECK_EQ_INT(dsp_drafter_propose(d, t, 4, 32, dr, NULL), 4); /* the match "1 2" reaches back 2 tokens */
    dsp_spec_commit r = {t, 6, 2, 16, 1, NULL, 0, 0};
    dsp_drafter_observe(d, &r);
    CHECK_EQ_INT(dsp_drafter_propose(d, t, 6, 32, dr, NULL), 2);
    dsp_spec_commit f = {t, 8, 2, 2, 2, NULL, 0, 0};
    dsp_drafter_observe(d, &f);
    CHECK_EQ_INT(dsp_drafter_propose(d, t, 8, 32, dr, NULL), 4);
    dsp_drafter_destroy(d);
    /* a long copied span drafts the full max_draft at once */
    CHECK(dsp_lookup_create(&lp, &d) == DSP_OK);
    dsp_drafter_reset(d);
    int32_t u[40];
    for (int i = 0; i < 20; i++) u[i] = u[20 + i] = 100 + i;
    dsp_spec_commit cu = {u, 30, 30, 0, 0, NULL, 0, 0};
    dsp_drafter_observe(d, &cu);
    CHECK_EQ_INT(dsp_drafter_propose(d, u, 30, 32, dr, NULL), 16);
    CHECK_EQ_INT(dr[0], 110);
    dsp_drafter_destroy(d);
}

static void test_bad_params(void) {
    dsp_drafter *d = NULL;
    dsp_lookup_params lp = {3, 2, 4, 64, true};
    CHECK_EQ_INT(dsp_lookup_create(&lp, &d), DSP_ERR_INVALID_ARG);
    lp = (dsp_lookup_params){0, 2, 4, 64, true};
    CHECK_EQ_INT(dsp_lookup_create(&lp, &d), DSP_ERR_INVALID_ARG);
    lp = (dsp_lookup_params){2, 4, 33, 64, true};
    CHECK_EQ_INT(dsp_lookup_create(&lp, &d), DSP_ERR_INVALID_ARG);
    CHECK(d == NULL);
}

int main(void) {
    DSP_RUN(test_matches_brute_force);
    DSP_RUN(test_examples);
    DSP_RUN(test_adaptive);
    DSP_RUN(test_bad_params);
    return dsp_test_summary();
}
