/* spec/cost: --max-draft auto's choice of draft lengths for a round, on synthetic cost curves and
 * acceptance estimates (no model, no timing): the cap depends on the round's row count, a round
 * whose drafts do not pay drafts nothing, the best prefix of the ranking is taken on a curve that is
 * not concave, a drafter that has not run yet must pay for itself, and the pooled prior. */
#include "dsp_test.h"

#include "spec/cost.h"

#include <math.h>
#include <string.h>

/* the curve measured on the 2-core development machine for the default model (bench/results) */
/* a cost curve of n points (rows, relative time) */
static dsp_spec_profile curve(int n, const int32_t *rows, const float *rel, double one_row_ms) {
    dsp_spec_profile p;
    memset(&p, 0, sizeof p);
    p.n = n;
    memcpy(p.rows, rows, sizeof *rows * (size_t)n);
    memcpy(p.rel, rel, sizeof *rel * (size_t)n);
    p.one_row_ms = one_row_ms;
    return p;
}

static dsp_spec_profile measured_curve(void) {
    static const int32_t rows[] = {1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 33, 48, 64, 96, 128};
    static const float rel[] = {1.0f, 1.06f, 1.18f, 1.30f, 1.36f, 1.43f, 1.69f, 2.04f, 2.22f, 2.75f, 3.31f, 3.95f, 5.34f, 7.77f, 10.09f, 15.21f, 21.12f};
    dsp_spec_profile p = curve((int)(sizeof rows / sizeof rows[0]), rows, rel, 9.0);
    p.ctx_tokens = 256;
    return p;
}

/* B requests decoding, each with kmax drafts of acceptance p: total drafts chosen */
static int drafts_at(const dsp_spec_profile *prof, int B, float p, int kmax) {
    dsp_cost_req r[32];
    for (int j = 0; j < B; j++) r[j] = (dsp_cost_req){p, NULL, kmax, 100, 0};
    dsp_cost_choose(prof, B, 0, B, 0, 0, r, B);
    int sum = 0;
    for (int j = 0; j < B; j++) sum += r[j].k;
    return sum;
}

/* Expected tokens per unit time of a round with the given choice (what the rule maximises). */
static double rate_of(const dsp_spec_profile *prof, const dsp_cost_req *r, int B) {
    double tok = B;
    int rows = B;
    for (int j = 0; j < B; j++)
        for (int i = 1; i <= r[j].k; i++) tok += pow(r[j].p, i), rows++;
    return tok / dsp_cost_time(prof, rows, 0);
}

static void test_cap_shrinks_with_rows(void) {
    dsp_spec_profile prof = measured_curve();
    /* a request alone drafts with a middling estimate; at 8 and 16 requests the same estimate does
     * not pay for its rows and the round is baseline's */
    int k1 = drafts_at(&prof, 1, 0.6f, 8), k4 = drafts_at(&prof, 4, 0.6f, 8), k8 = drafts_at(&prof, 8, 0.6f, 8),
        k16 = drafts_at(&prof, 16, 0.6f, 8);
    fprintf(stderr, "  p 0.6: drafts per request %d alone, %.2f at 4, %.2f at 8, %.2f at 16\n", k1, k4 / 4.0, k8 / 8.0, k16 / 16.0);
    CHECK(k1 >= 1);
    CHECK(k4 / 4.0 <= k1);
    CHECK_EQ_INT(k8, 0);
    CHECK_EQ_INT(k16, 0);
    /* an estimate near 1 (a long copy) still drafts in a full round */
    CHECK(drafts_at(&prof, 8, 0.97f, 8) > 0);
    /* nothing to gain: nothing drafted at any batch size */
    for (int B = 1; B <= 16; B++) CHECK_EQ_INT(drafts_at(&prof, B, 0.02f, 8), 0);
    /* rows that decide no token (a 64-row prefill chunk) make the round slow anyway: a draft's
     * row is then a small part of it, so drafts ride along (at least as many as alone) */
    dsp_cost_req r = {0.6f, NULL, 8, 100, 0};
    dsp_cost_choose(&prof, 1, 0, 1, 0, 0, &r, 1);
    int alone = r.k;
    dsp_cost_choose(&prof, 1 + 64, 0, 1, 0, 0, &r, 1);
    CHECK(r.k >= alone);
}

static void test_never_worse_than_no_drafts(void) {
    /* whatever it picks has an expected rate at least that of drafting nothing, and at least that of
     * every fixed length for every request, up to the margin it demands before drafting at all */
    dsp_spec_profile prof = measured_curve();
    const float ps[] = {0.05f, 0.3f, 0.5f, 0.7f, 0.9f, 0.99f};
    for (int B = 1; B <= 16; B *= 2)
        for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++) {
            dsp_cost_req r[16];
            for (int j = 0; j < B; j++) r[j] = (dsp_cost_req){ps[(pi + (size_t)j) % 6], NULL, 8, 100, 0};
            dsp_cost_choose(&prof, B, 0, B, 0, 0, r, B);
            double got = rate_of(&prof, r, B);
            for (int k = 0; k <= 8; k++) {
                dsp_cost_req f[16];
                memcpy(f, r, sizeof f);
                for (int j = 0; j < B; j++) f[j].k = k;
                CHECK_MSG(got * (1 + DSP_COST_MARGIN) >= rate_of(&prof, f, B) - 1e-9, "B %d p %g: chosen rate %g < fixed k %d's %g", B, (double)ps[pi], got, k,
                          rate_of(&prof, f, B));
            }
        }
}

static void test_best_prefix_not_first_stop(void) {
    /* a step then a flat stretch: the first draft alone does not pay (1.9 / 2 < 1), eight do
     * (6.1 / 2): stopping at the first candidate that does not improve would draft nothing */
    dsp_spec_profile prof = curve(3, (const int32_t[]){1, 2, 9}, (const float[]){1.0f, 2.0f, 2.0f}, 1);
    dsp_cost_req r = {0.9f, NULL, 8, 10, 0};
    dsp_cost_choose(&prof, 1, 0, 1, 0, 0, &r, 1);
    CHECK_EQ_INT(r.k, 8);
}

/* The best expected rate over every number m of extra rows, by brute force, for B requests with
 * the same p (the top m survivals of the ranking: drafts 1 of every request, then drafts 2, ...),
 * relative to drafting nothing. */
static double best_gain(const dsp_spec_profile *prof, int B, float p, int kmax) {
    double none = B / dsp_cost_time(prof, B, 0), best = none, tok = B;
    for (int m = 1; m <= B * kmax; m++) {
        tok += pow(p, (m - 1) / B + 1);
        double r = tok / dsp_cost_time(prof, B + m, 0);
        if (r > best) best = r;
    }
    return best / none;
}

static void test_margin(void) {
    /* for every p the rule either drafts nothing, when no choice promises the margin over drafting
     * nothing, or reaches the brute-force optimum; and some p fall between (gain > 1, < margin) */
    dsp_spec_profile prof = measured_curve();
    int n_between = 0;
    for (int B = 1; B <= 16; B *= 2)
        for (int pi = 30; pi <= 99; pi++) {
            float p = (float)pi / 100;
            double g = best_gain(&prof, B, p, 8);
            dsp_cost_req r[16];
            for (int j = 0; j < B; j++) r[j] = (dsp_cost_req){p, NULL, 8, 100, 0};
            dsp_cost_choose(&prof, B, 0, B, 0, 0, r, B);
            int sum = 0;
            for (int j = 0; j < B; j++) sum += r[j].k;
            double got = rate_of(&prof, r, B) / (B / dsp_cost_time(&prof, B, 0));
            if (g < 1 + DSP_COST_MARGIN - 1e-6) {
                CHECK_MSG(sum == 0, "B %d p %.2f: best gain %.4f is under the margin, yet %d drafts", B, (double)p, g, sum);
                n_between += g > 1 + 1e-6;
            } else if (g > 1 + DSP_COST_MARGIN + 1e-6) {
                CHECK_MSG(sum > 0 && fabs(got - g) < 1e-4, "B %d p %.2f: best gain %.4f, got %.4f with %d drafts", B, (double)p, g, got, sum);
            }
        }
    CHECK(n_between > 0);
}

static void test_drafter_cost_not_sunk(void) {
    /* a free forward row but a drafter costing half a forward: a weak estimate is not worth running
     * the drafter for; once it has run (sunk), its drafts ride along for free */
    dsp_spec_profile prof = curve(2, (const int32_t[]){1, 33}, (const float[]){1.0f, 1.0f}, 1);
    dsp_cost_req r = {0.3f, NULL, 8, 10, 0};
    dsp_cost_choose(&prof, 1, 0, 1, 0, 0.5f, &r, 1);
    CHECK_EQ_INT(r.k, 0);
    dsp_cost_choose(&prof, 1, 0, 1, 0.5f, 0, &r, 1);
    CHECK(r.k > 0);
    /* a strong estimate pays for the drafter */
    r.p = 0.9f;
    dsp_cost_choose(&prof, 1, 0, 1, 0, 0.5f, &r, 1);
    CHECK(r.k > 0);
}

static void test_ranking_across_requests(void) {
    /* two requests in one round: the one more likely to be accepted gets the rows */
    dsp_spec_profile prof = measured_curve();
    dsp_cost_req r[2] = {{0.3f, NULL, 8, 100, 0}, {0.95f, NULL, 8, 100, 0}};
    dsp_cost_choose(&prof, 2, 0, 2, 0, 0, r, 2);
    CHECK(r[1].k > r[0].k);
    /* explicit survivals (DSpark's confidence) instead of p^i, and kmax bounds it */
    float a[3] = {0.99f, 0.98f, 0.97f};
    dsp_cost_req c = {0, a, 3, 100, 0};
    dsp_cost_choose(&prof, 1, 0, 1, 0, 0, &c, 1);
    CHECK_EQ_INT(c.k, 3);
}

static void test_host_time_counts(void) {
    /* host time paid every round makes a round's rows relatively cheaper: a borderline draft that
     * does not pay on the bare forward pays when each round also costs host work */
    dsp_spec_profile prof = measured_curve();
    int bare = drafts_at(&prof, 8, 0.8f, 4);
    dsp_cost_req r[8];
    for (int j = 0; j < 8; j++) r[j] = (dsp_cost_req){0.8f, NULL, 4, 100, 0};
    dsp_cost_choose(&prof, 8, 0, 8, 2.0f, 0, r, 8);
    int with_host = 0;
    for (int j = 0; j < 8; j++) with_host += r[j].k;
    CHECK(with_host > bare);
}

static void test_pooled_prior(void) {
    dsp_accept pool, a;
    dsp_accept_init(&pool);
    dsp_accept_init_prior(&a, &pool);
    CHECK(fabsf(dsp_accept_p(&a) - 0.5f) < 1e-6f); /* nothing known: 1/2 */
    for (int i = 0; i < 200; i++) dsp_accept_pool(&pool, 4, 0); /* every draft rejected */
    dsp_accept_pool(&pool, 0, 0);                                /* rounds without drafts change nothing */
    dsp_accept_init_prior(&a, &pool);
    float p = dsp_accept_p(&a);
    CHECK(p < 0.25f && p > 0.0f);
    /* the request's own rounds still move it: all accepted for a while */
    for (int i = 0; i < 20; i++) dsp_accept_round(&a, 4, 4);
    CHECK(dsp_accept_p(&a) > 0.9f);
}

/* draft_scale (the engine's calibration): rounds with drafts measured slower than the profile
 * predicts relative to rounds without make the same drafts not pay; faster, more of them pay */
static void test_draft_scale(void) {
    dsp_spec_profile prof = measured_curve();
    dsp_cost_req r = {0.5f, NULL, 8, 100, 0}; /* at best 1.48x the tokens per unit time (k = 2) */
    dsp_cost_choose_max(&prof, 1, 0, 1, 0, 0, 1.0f, &r, 1, -1);
    const int32_t k1 = r.k;
    CHECK(k1 > 0);
    dsp_cost_choose_max(&prof, 1, 0, 1, 0, 0, 1.6f, &r, 1, -1); /* drafting rounds 60% dearer than predicted */
    CHECK_EQ_INT(r.k, 0);
    dsp_cost_choose_max(&prof, 1, 0, 1, 0, 0, 1.0f / 1.6f, &r, 1, -1);
    CHECK_MSG(r.k >= k1, "cheaper drafting rounds: %d drafts, %d at scale 1", r.k, k1);
    /* the margin is against the scaled rate: just inside it nothing is drafted, just past it the
     * unscaled choice is */
    dsp_cost_req c = {0.7f, NULL, 8, 100, 0};
    dsp_cost_choose(&prof, 1, 0, 1, 0, 0, &c, 1);
    const double none = 1.0 / dsp_cost_time(&prof, 1, 0);
    double tok = 1, a = 1;
    for (int i = 1; i <= c.k; i++) tok += (a *= 0.7);
    const double gain = tok / dsp_cost_time(&prof, 1 + c.k, 0) / none; /* the unscaled choice's */
    dsp_cost_req q = c;
    dsp_cost_choose_max(&prof, 1, 0, 1, 0, 0, (float)(gain / (1 + DSP_COST_MARGIN) * 1.01), &q, 1, -1);
    CHECK_EQ_INT(q.k, 0);
    dsp_cost_choose_max(&prof, 1, 0, 1, 0, 0, (float)(gain / (1 + DSP_COST_MARGIN) * 0.99), &q, 1, -1);
    CHECK_EQ_INT(q.k, c.k);
}

/* dsp_cost_rate (mode auto's choice of source): the best prefix's rate, against a brute force */
static void test_rate_best_prefix(void) {
    dsp_spec_profile prof = measured_curve();
    for (int B = 1; B <= 16; B *= 2)
        for (float p = 0.1f; p < 1.0f; p += 0.2f)
            for (float cost = 0; cost < 1.0f; cost += 0.45f) {
                double none = B / (cost + dsp_cost_time(&prof, B, 0)), best = 0, tok = B;
                for (int j = 1; j <= 7; j++) {
                    tok += pow(p, j);
                    double r = tok / (cost + dsp_cost_time(&prof, B + j, 0));
                    if (r > best) best = r;
                }
                CHECK(fabs(dsp_cost_rate(&prof, B, cost, 0, 0) - none) < 1e-5 * none);
                CHECK(fabs(dsp_cost_rate(&prof, B, cost, p, 7) - best) < 1e-5 * best);
            }
    /* the same drafts pay alone and not in a full batch (the curve's slope grows with rows) */
    CHECK(dsp_cost_rate(&prof, 1, 0, 0.6f, 4) > dsp_cost_rate(&prof, 1, 0, 0, 0));
    CHECK(dsp_cost_rate(&prof, 16, 0, 0.6f, 4) < dsp_cost_rate(&prof, 16, 0, 0, 0) * (1 + DSP_COST_MARGIN));
}

int main(void) {
    DSP_RUN(test_cap_shrinks_with_rows);
    DSP_RUN(test_never_worse_than_no_drafts);
    DSP_RUN(test_best_prefix_not_first_stop);
    DSP_RUN(test_margin);
    DSP_RUN(test_drafter_cost_not_sunk);
    DSP_RUN(test_ranking_across_requests);
    DSP_RUN(test_host_time_counts);
    DSP_RUN(test_pooled_prior);
    DSP_RUN(test_rate_best_prefix);
    DSP_RUN(test_draft_scale);
    return dsp_test_summary();
}
