/* Unit tests for sample/: RNG known answers, every processor and its edge cases, the fast top-k /
 * top-p paths against a slow full-sort reference, history push/pop equivalence, chi-square tests
 * of the samplers (fixed seeds, so deterministic) including the verifier's rejection-sampling
 * helpers, logprobs, and the Hugging Face oracle fixtures (tests/fixtures/sampling/ (JSON) written
 * by tools/gen_sampling_fixtures.py). The own exp against libm's (at most 1 ulp apart), and the
 * processed distribution bit for bit the same with every CPU kernel table this machine runs. */
#include "dsp_stats.h"
#include "dsp_test.h"

#include "backend/cpu/ops.h"
#include "sample/rng.h"
#include "sample/sample.h"
#include "sample/sample_kernels.h"

#include <float.h>
#include <jansson.h>
#include <math.h>

/* ---- helpers -------------------------------------------------------------------------------- */

typedef struct ctx {
    dsp_sample_scratch s;
    dsp_sample_dist d;
    void *smem, *dmem;
} ctx;

static void ctx_init(ctx *c, int32_t V) {
    size_t sb = dsp_sample_scratch_bytes(V), db = dsp_sample_dist_bytes(V);
    c->smem = aligned_alloc(16, sb);
    c->dmem = aligned_alloc(16, db);
    if (!c->smem || !c->dmem) abort();
    if (dsp_sample_scratch_init(&c->s, c->smem, sb, V) || dsp_sample_dist_init(&c->d, c->dmem, db, V))
        abort();
}

static void ctx_free(ctx *c) {
    free(c->smem);
    free(c->dmem);
}

static bool counts_all_zero(const ctx *c) {
    for (int32_t i = 0; i < c->s.n_vocab; i++)
        if (c->s.gen_count[i] || c->s.win_count[i]) return false;
    return true;
}

/* standard normal via Box-Muller on our own RNG */
static float normal(dsp_rng *r) {
    double u1 = dsp_rng_uniform(r), u2 = dsp_rng_uniform(r);
    return (float)(sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2));
}

static void random_logits(float *x, int32_t V, uint64_t seed, float scale) {
    dsp_rng r;
    dsp_rng_seed(&r, seed);
    for (int32_t i = 0; i < V; i++) x[i] = scale * normal(&r);
}

static int32_t count_kept(const dsp_sample_dist *d) {
    int32_t n = 0;
    for (int32_t i = 0; i < d->n_vocab; i++) n += d->p[i] > 0.0f;
    return n;
}


/* chi-square p-value of observed counts against probabilities over n bins */
static double chi2_pvalue_all(const long *obs, const double *prob, int n, long total) {
    double stat = 0.0;
    for (int i = 0; i < n; i++) {
        double e = prob[i] * (double)total;
        stat += ((double)obs[i] - e) * ((double)obs[i] - e) / e;
    }
    return gamma_q(0.5 * (n - 1), 0.5 * stat);
}

/* ---- RNG ------------------------------------------------------------------------------------ */

static void test_rng_known_answers(void) {
    /* values from an independent Python implementation of splitmix64 + xoshiro256** */
    dsp_rng r;
    dsp_rng_seed(&r, 0);
    CHECK(r.s[0] == UINT64_C(0xe220a8397b1dcdaf) && r.s[3] == UINT64_C(0xf88bb8a8724c81ec));
    CHECK(dsp_rng_next_u64(&r) == UINT64_C(0x99ec5f36cb75f2b4));
    CHECK(dsp_rng_next_u64(&r) == UINT64_C(0xbf6e1f784956452a));
    CHECK(dsp_rng_next_u64(&r) == UINT64_C(0x1a5f849d4933e6e0));
    dsp_rng_seed(&r, 42);
    CHECK(dsp_rng_next_u64(&r) == UINT64_C(0x15780b2e0c2ec716));
    CHECK(dsp_rng_next_u64(&r) == UINT64_C(0x6104d9866d113a7e));
    CHECK(dsp_rng_next_u64(&r) == UINT64_C(0xae17533239e499a1));
    dsp_rng_seed(&r, 12345);
    CHECK(dsp_rng_uniform(&r) == 0.7438081631565894);
    CHECK(dsp_rng_uniform(&r) == 0.13004553462783452);
}

static void test_rng_uniform_range_and_independence(void) {
    dsp_rng a, b, a2;
    dsp_rng_seed(&a, 7);
    dsp_rng_seed(&b, 8);
    dsp_rng_seed(&a2, 7);
    double lo = 1.0, hi = 0.0, sum = 0.0;
    int diverged = 0;
    for (int i = 0; i < 100000; i++) {
        double u = dsp_rng_uniform(&a);
        (void)dsp_rng_uniform(&b); /* another request drawing in between changes nothing */
        double v = dsp_rng_uniform(&a2);
        if (u != v) diverged++;
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
        sum += u;
    }
    CHECK_EQ_INT(diverged, 0);
    CHECK(lo >= 0.0 && hi < 1.0);
    CHECK(fabs(sum / 100000 - 0.5) < 0.005);
}

/* ---- params, buffers ------------------------------------------------------------------------ */

static void expect_invalid(dsp_sample_params p, const char *word) {
    dsp_status st = dsp_sample_params_validate(&p, 100);
    CHECK_MSG(st == DSP_ERR_INVALID_ARG, "expected INVALID_ARG for %s", word);
    CHECK_MSG(strstr(dsp_last_error(), word) != NULL, "message '%s' lacks '%s'", dsp_last_error(), word);
}

static void test_params_validate(void) {
    dsp_sample_params p = dsp_sample_params_default();
    CHECK_EQ_INT(dsp_sample_params_validate(&p, 100), DSP_OK);
    dsp_sample_params q;
    q = p; q.temperature = -0.1f; expect_invalid(q, "temperature");
    q = p; q.temperature = NAN; expect_invalid(q, "temperature");
    q = p; q.temperature = INFINITY; expect_invalid(q, "temperature");
    q = p; q.top_k = -1; expect_invalid(q, "top_k");
    q = p; q.top_p = 0.0f; expect_invalid(q, "top_p");
    q = p; q.top_p = 1.01f; expect_invalid(q, "top_p");
    q = p; q.top_p = NAN; expect_invalid(q, "top_p");
    q = p; q.min_p = -0.01f; expect_invalid(q, "min_p");
    q = p; q.min_p = 1.5f; expect_invalid(q, "min_p");
    q = p; q.presence_penalty = 2.5f; expect_invalid(q, "presence_penalty");
    q = p; q.frequency_penalty = -2.01f; expect_invalid(q, "frequency_penalty");
    q = p; q.repetition_penalty = 0.0f; expect_invalid(q, "repetition_penalty");
    q = p; q.repetition_penalty = NAN; expect_invalid(q, "repetition_penalty");
    q = p; q.repetition_last_n = -2; expect_invalid(q, "repetition_last_n");
    dsp_sample_bias b[2] = {{5, 100.0f}, {100, 1.0f}};
    q = p; q.logit_bias = b; q.n_logit_bias = 2; expect_invalid(q, "logit_bias[1]");
    b[1] = (dsp_sample_bias){6, 100.5f};
    expect_invalid(q, "logit_bias[1]");
    b[1] = (dsp_sample_bias){6, -100.0f};
    CHECK_EQ_INT(dsp_sample_params_validate(&q, 100), DSP_OK);
    q.logit_bias = NULL; expect_invalid(q, "logit_bias");
    q = p; q.n_logit_bias = DSP_SAMPLE_MAX_BIAS + 1; q.logit_bias = b; expect_invalid(q, "logit_bias");
    CHECK_EQ_INT(dsp_sample_params_validate(&p, 0), DSP_ERR_INVALID_ARG);

    /* buffers: too small or misaligned are refused */
    char mem[64 * 16] __attribute__((aligned(16)));
    dsp_sample_dist d;
    dsp_sample_scratch s;
    CHECK_EQ_INT(dsp_sample_dist_init(&d, mem, sizeof mem, 1000), DSP_ERR_INVALID_ARG);
    CHECK_EQ_INT(dsp_sample_dist_init(&d, mem + 4, sizeof mem - 4, 10), DSP_ERR_INVALID_ARG);
    CHECK_EQ_INT(dsp_sample_dist_init(&d, mem, sizeof mem, 10), DSP_OK);
    CHECK_EQ_INT(dsp_sample_scratch_init(&s, mem, sizeof mem, 1000), DSP_ERR_INVALID_ARG);
    CHECK_EQ_INT(dsp_sample_scratch_bytes(0), 0);
}

/* ---- processors ----------------------------------------------------------------------------- */

static void test_greedy_and_ties(void) {
    ctx c;
    ctx_init(&c, 8);
    float x[8] = {1, 5, 2, 5, -1, 5, 0, 3};
    dsp_sample_params p = dsp_sample_params_default();
    p.temperature = 0.0f;
    CHECK_EQ_INT(dsp_sample_process(x, NULL, &p, &c.s, &c.d), DSP_OK);
    CHECK(c.d.greedy);
    CHECK_EQ_INT(c.d.argmax, 1); /* ties: lowest id */
    CHECK_EQ_INT(c.d.n_kept, 1);
    CHECK(c.d.p[1] == 1.0f && count_kept(&c.d) == 1);
    CHECK_EQ_INT(dsp_sample_from_dist(&c.d, 0.0), 1);
    CHECK_EQ_INT(dsp_sample_from_dist(&c.d, 0.9999999), 1);
    /* -0 and +0 tie too */
    float z[3] = {-0.0f, 0.0f, -1.0f};
    ctx c3;
    ctx_init(&c3, 3);
    CHECK_EQ_INT(dsp_sample_process(z, NULL, &p, &c3.s, &c3.d), DSP_OK);
    CHECK_EQ_INT(c3.d.argmax, 0);
    /* at T > 0 the three tied maxima share the mass equally */
    p.temperature = 1.0f;
    p.top_k = 1; /* boundary ties are all kept */
    CHECK_EQ_INT(dsp_sample_process(x, NULL, &p, &c.s, &c.d), DSP_OK);
    CHECK_EQ_INT(c.d.n_kept, 3);
    CHECK(c.d.p[1] == c.d.p[3] && c.d.p[3] == c.d.p[5] && fabsf(c.d.p[1] - 1.0f / 3) < 1e-7f);
    CHECK_EQ_INT(dsp_sample_from_dist(&c.d, 0.0), 1);
    CHECK_EQ_INT(dsp_sample_from_dist(&c.d, 0.5), 3);
    CHECK_EQ_INT(dsp_sample_from_dist(&c.d, 0.99), 5);
    ctx_free(&c);
    ctx_free(&c3);
}

static void test_temperature(void) {
    enum { V = 50 };
    float x[V];
    random_logits(x, V, 1, 2.0f);
    ctx c;
    ctx_init(&c, V);
    dsp_sample_params p = dsp_sample_params_default();
    const float temps[] = {0.3f, 1.0f, 2.5f};
    for (int k = 0; k < 3; k++) {
        p.temperature = temps[k];
        CHECK_EQ_INT(dsp_sample_process(x, NULL, &p, &c.s, &c.d), DSP_OK);
        double m = -INFINITY, s = 0.0, err = 0.0;
        for (int i = 0; i < V; i++) m = x[i] > m ? x[i] : m;
        for (int i = 0; i < V; i++) s += exp((x[i] - m) / temps[k]);
        for (int i = 0; i < V; i++) {
            double e = exp((x[i] - m) / temps[k]) / s;
            err = fmax(err, fabs(c.d.p[i] - e) / e);
        }
        CHECK_MSG(err < 1e-6, "T=%g rel err %g", (double)temps[k], err);
        CHECK_EQ_INT(c.d.n_kept, V);
        CHECK(fabs(c.d.p_sum - 1.0) < 1e-6);
    }
    /* a tiny temperature concentrates everything on the argmax */
    p.temperature = 1e-6f;
    CHECK_EQ_INT(dsp_sample_process(x, NULL, &p, &c.s, &c.d), DSP_OK);
    CHECK_EQ_INT(c.d.n_kept, 1);
    CHECK(c.d.p[c.d.argmax] == 1.0f);
    ctx_free(&c);
}

static void test_top_k(void) {
    enum { V = 6 };
    float x[V] = {0.5f, 3.0f, 2.0f, 2.0f, 1.0f, -4.0f};
    ctx c;
    ctx_init(&c, V);
    dsp_sample_params p = dsp_sample_params_default();
    const int32_t ks[] = {0, 1, 2, 3, 4, 6, 7, 1000000};
    const int32_t kept[] = {6, 1, 3, 3, 4, 6, 6, 6}; /* k=2: ids 2 and 3 tie at the boundary */
    for (int i = 0; i < 8; i++) {
        p.top_k = ks[i];
        CHECK_EQ_INT(dsp_sample_process(x, NULL, &p, &c.s, &c.d), DSP_OK);
        CHECK_MSG(c.d.n_kept == kept[i], "top_k %d kept %d", ks[i], c.d.n_kept);
        CHECK_EQ_INT(count_kept(&c.d), c.d.n_kept);
    }
    p.top_k = 2;
    CHECK_EQ_INT(dsp_sample_process(x, NULL, &p, &c.s, &c.d), DSP_OK);
    CHECK(c.d.kept[0] == 1 && c.d.kept[1] == 2 && c.d.kept[2] == 3);
    CHECK(c.d.p[0] == 0.0f && c.d.p[4] == 0.0f);
    ctx_free(&c);
}

static void test_top_p_and_min_p(void) {
    enum { V = 4 };
    /* probabilities 0.5, 0.3, 0.15, 0.05 at T = 1 */
    float x[V] = {logf(0.15f), logf(0.5f), logf(0.05f), logf(0.3f)};
    ctx c;
    ctx_init(&c, V);
    dsp_sample_params p = dsp_sample_params_default();
    const float ps[] = {1.0f, 0.4f, 0.6f, 0.85f, 0.97f, 1e-9f};
    const int32_t kept[] = {4, 1, 2, 3, 4, 1};
    for (int i = 0; i < 6; i++) {
        p.top_p = ps[i];
        CHECK_EQ_INT(dsp_sample_process(x, NULL, &p, &c.s, &c.d), DSP_OK);
        CHECK_MSG(c.d.n_kept == kept[i], "top_p %g kept %d", (double)ps[i], c.d.n_kept);
    }
    p.top_p = 0.6f; /* keeps 0.5 and 0.3, renormalised */
    CHECK_EQ_INT(dsp_sample_process(x, NULL, &p, &c.s, &c.d), DSP_OK);
    CHECK(fabsf(c.d.p[1] - 0.625f) < 1e-6f && fabsf(c.d.p[3] - 0.375f) < 1e-6f);
    p.top_p = 1.0f;
    const float mps[] = {0.0f, 0.05f, 0.2f, 0.5f, 0.61f, 1.0f};
    const int32_t mkept[] = {4, 4, 3, 2, 1, 1}; /* 0.05/0.5 = 0.1 >= 0.05; 0.15/0.5 = 0.3 */
    for (int i = 0; i < 6; i++) {
        p.min_p = mps[i];
        CHECK_EQ_INT(dsp_sample_process(x, NULL, &p, &c.s, &c.d), DSP_OK);
        CHECK_MSG(c.d.n_kept == mkept[i], "min_p %g kept %d", (double)mps[i], c.d.n_kept);
    }
    /* min_p = 1 keeps every token tied with the top */
    float t[V] = {2.0f, 2.0f, 1.0f, 2.0f};
    p.min_p = 1.0f;
    CHECK_EQ_INT(dsp_sample_process(t, NULL, &p, &c.s, &c.d), DSP_OK);
    CHECK_EQ_INT(c.d.n_kept, 3);
    /* top-p: ties with the last kept token are all kept */
    p.min_p = 0.0f;
    p.top_p = 0.1f;
    CHECK_EQ_INT(dsp_sample_process(t, NULL, &p, &c.s, &c.d), DSP_OK);
    CHECK_EQ_INT(c.d.n_kept, 3);
    ctx_free(&c);
}

static void test_nan_inf(void) {
    enum { V = 5 };
    ctx c;
    ctx_init(&c, V);
    dsp_sample_params p = dsp_sample_params_default();
    float a[V] = {NAN, 1.0f, NAN, 0.0f, -INFINITY};
    CHECK_EQ_INT(dsp_sample_process(a, NULL, &p, &c.s, &c.d), DSP_OK);
    CHECK(c.d.p[0] == 0.0f && c.d.p[2] == 0.0f && c.d.p[4] == 0.0f && c.d.n_kept == 2);
    CHECK(c.d.logits[0] == -INFINITY);
    float b[V] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    CHECK_EQ_INT(dsp_sample_process(b, NULL, &p, &c.s, &c.d), DSP_ERR_INVALID_ARG);
    CHECK(strstr(dsp_last_error(), "finite") != NULL);
    float n[V] = {NAN, NAN, NAN, NAN, NAN};
    CHECK_EQ_INT(dsp_sample_process(n, NULL, &p, &c.s, &c.d), DSP_ERR_INVALID_ARG);
    p.temperature = 0.0f;
    CHECK_EQ_INT(dsp_sample_process(n, NULL, &p, &c.s, &c.d), DSP_ERR_INVALID_ARG);
    /* one finite value among -inf: certain */
    float o[V] = {-INFINITY, -INFINITY, -3.0f, NAN, -INFINITY};
    p.temperature = 0.7f;
    CHECK_EQ_INT(dsp_sample_process(o, NULL, &p, &c.s, &c.d), DSP_OK);
    CHECK(c.d.p[2] == 1.0f && c.d.n_kept == 1);
    /* +inf tokens share the mass */
    float i[V] = {INFINITY, 1e30f, INFINITY, 0.0f, NAN};
    p.temperature = 0.5f;
    CHECK_EQ_INT(dsp_sample_process(i, NULL, &p, &c.s, &c.d), DSP_OK);
    CHECK(c.d.p[0] == 0.5f && c.d.p[2] == 0.5f && c.d.n_kept == 2);
    ctx_free(&c);
}

static void test_logit_bias(void) {
    enum { V = 5 };
    float x[V] = {4.0f, 1.0f, 0.0f, -2.0f, 3.0f};
    ctx c;
    ctx_init(&c, V);
    dsp_sample_params p = dsp_sample_params_default();
    p.temperature = 0.0f;
    dsp_sample_bias b[3] = {{3, 100.0f}, {0, -100.0f}, {1, 1.5f}};
    p.logit_bias = b;
    p.n_logit_bias = 3;
    CHECK_EQ_INT(dsp_sample_process(x, NULL, &p, &c.s, &c.d), DSP_OK);
    CHECK_EQ_INT(c.d.argmax, 3);
    CHECK(c.d.logits[3] == 98.0f && c.d.logits[0] == -96.0f && c.d.logits[1] == 2.5f);
    /* -100 on the top token: at T=1 it is effectively banned */
    p.temperature = 1.0f;
    p.n_logit_bias = 2;
    b[0] = (dsp_sample_bias){0, -100.0f};
    b[1] = (dsp_sample_bias){4, -100.0f};
    CHECK_EQ_INT(dsp_sample_process(x, NULL, &p, &c.s, &c.d), DSP_OK);
    CHECK(c.d.p[0] < 1e-40f && c.d.p[4] < 1e-40f && c.d.argmax == 1);
    /* a repeated token gets the sum */
    b[1] = (dsp_sample_bias){0, -0.5f};
    CHECK_EQ_INT(dsp_sample_process(x, NULL, &p, &c.s, &c.d), DSP_OK);
    CHECK(c.d.logits[0] == -96.5f);
    b[1] = (dsp_sample_bias){5, 1.0f};
    CHECK_EQ_INT(dsp_sample_process(x, NULL, &p, &c.s, &c.d), DSP_ERR_INVALID_ARG);
    ctx_free(&c);
}

static void test_repetition_window(void) {
    enum { V = 6 };
    float x[V] = {2.0f, -2.0f, 1.0f, -1.0f, 0.5f, 3.0f};
    int32_t buf[16] = {0, 1, 2, 2}; /* prompt */
    dsp_sample_history h;
    CHECK_EQ_INT(dsp_sample_history_init(&h, buf, 16, 4), DSP_OK);
    CHECK_EQ_INT(dsp_sample_history_push(&h, 3), DSP_OK);
    CHECK_EQ_INT(dsp_sample_history_push(&h, 2), DSP_OK); /* history 0 1 2 2 | 3 2 */
    ctx c;
    ctx_init(&c, V);
    dsp_sample_params p = dsp_sample_params_default();
    p.repetition_penalty = 2.0f;
    p.repetition_last_n = -1; /* whole history, prompt included */
    CHECK_EQ_INT(dsp_sample_process(x, &h, &p, &c.s, &c.d), DSP_OK);
    const float whole[V] = {1.0f, -4.0f, 0.5f, -2.0f, 0.5f, 3.0f}; /* token 2 three times: once */
    for (int i = 0; i < V; i++) CHECK_MSG(c.d.logits[i] == whole[i], "whole: token %d", i);
    p.repetition_last_n = 2; /* last two: 3 2 */
    CHECK_EQ_INT(dsp_sample_process(x, &h, &p, &c.s, &c.d), DSP_OK);
    const float last2[V] = {2.0f, -2.0f, 0.5f, -2.0f, 0.5f, 3.0f};
    for (int i = 0; i < V; i++) CHECK_MSG(c.d.logits[i] == last2[i], "last 2: token %d", i);
    p.repetition_last_n = 5; /* 1 2 2 3 2: reaches into the prompt */
    CHECK_EQ_INT(dsp_sample_process(x, &h, &p, &c.s, &c.d), DSP_OK);
    CHECK(c.d.logits[0] == 2.0f && c.d.logits[1] == -4.0f);
    p.repetition_last_n = 0; /* off */
    CHECK_EQ_INT(dsp_sample_process(x, &h, &p, &c.s, &c.d), DSP_OK);
    CHECK(memcmp(c.d.logits, x, sizeof x) == 0);
    p.repetition_last_n = 1000; /* longer than the history: everything */
    CHECK_EQ_INT(dsp_sample_process(x, &h, &p, &c.s, &c.d), DSP_OK);
    for (int i = 0; i < V; i++) CHECK(c.d.logits[i] == whole[i]);
    p.repetition_penalty = 0.5f; /* < 1 encourages repeats: same formula */
    CHECK_EQ_INT(dsp_sample_process(x, &h, &p, &c.s, &c.d), DSP_OK);
    CHECK(c.d.logits[0] == 4.0f && c.d.logits[1] == -1.0f);
    CHECK(counts_all_zero(&c));
    /* a penalty below 1 on a logit near FLT_MAX stays finite: sampling keeps that token */
    float big[V] = {FLT_MAX, -2.0f, 1.0f, -1.0f, 0.5f, 3.0f};
    p.temperature = 0.8f;
    CHECK_EQ_INT(dsp_sample_process(big, &h, &p, &c.s, &c.d), DSP_OK);
    CHECK(c.d.logits[0] == FLT_MAX);
    CHECK_EQ_INT(c.d.n_kept, 1);
    CHECK_EQ_INT(dsp_sample_from_dist(&c.d, 0.5), 0);
    CHECK(counts_all_zero(&c));
    ctx_free(&c);
}

static void test_presence_frequency(void) {
    enum { V = 6 };
    float x[V] = {2.0f, -2.0f, 1.0f, -1.0f, 0.5f, 3.0f};
    int32_t buf[16] = {0, 0, 0, 1};
    dsp_sample_history h;
    CHECK_EQ_INT(dsp_sample_history_init(&h, buf, 16, 4), DSP_OK);
    ctx c;
    ctx_init(&c, V);
    dsp_sample_params p = dsp_sample_params_default();
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    /* nothing generated yet: the prompt never counts */
    CHECK_EQ_INT(dsp_sample_process(x, &h, &p, &c.s, &c.d), DSP_OK);
    CHECK(memcmp(c.d.logits, x, sizeof x) == 0);
    int32_t gen[] = {2, 5, 2, 2, 0};
    for (int i = 0; i < 5; i++) CHECK_EQ_INT(dsp_sample_history_push(&h, gen[i]), DSP_OK);
    CHECK_EQ_INT(dsp_sample_process(x, &h, &p, &c.s, &c.d), DSP_OK);
    CHECK(c.d.logits[2] == 1.0f - 0.75f - 0.5f); /* 3 times */
    CHECK(c.d.logits[5] == 3.0f - 0.25f - 0.5f);
    CHECK(c.d.logits[0] == 2.0f - 0.25f - 0.5f); /* once generated; the prompt's 3 don't count */
    CHECK(c.d.logits[1] == -2.0f && c.d.logits[3] == -1.0f && c.d.logits[4] == 0.5f);
    /* negative penalties encourage */
    p.presence_penalty = -1.0f;
    p.frequency_penalty = -2.0f;
    CHECK_EQ_INT(dsp_sample_process(x, &h, &p, &c.s, &c.d), DSP_OK);
    CHECK(c.d.logits[2] == 1.0f + 6.0f + 1.0f);
    /* combined with repetition: bias -> repetition -> frequency -> presence */
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.repetition_penalty = 2.0f;
    p.repetition_last_n = 3; /* 2 2 0 */
    dsp_sample_bias b = {2, 1.0f};
    p.logit_bias = &b;
    p.n_logit_bias = 1;
    CHECK_EQ_INT(dsp_sample_process(x, &h, &p, &c.s, &c.d), DSP_OK);
    CHECK(c.d.logits[2] == (1.0f + 1.0f) / 2.0f - 0.75f - 0.5f);
    CHECK(c.d.logits[5] == 3.0f - 0.25f - 0.5f); /* generated but outside the repetition window */
    CHECK(counts_all_zero(&c));
    ctx_free(&c);
}

static void test_history_push_pop(void) {
    enum { V = 300, CAP = 200 };
    float x[V];
    random_logits(x, V, 3, 3.0f);
    int32_t buf[CAP], buf2[CAP];
    dsp_rng r;
    dsp_rng_seed(&r, 11);
    for (int i = 0; i < 60; i++) buf[i] = (int32_t)(dsp_rng_next_u64(&r) % 40);
    dsp_sample_history h, h2;
    CHECK_EQ_INT(dsp_sample_history_init(&h, buf, CAP, 40), DSP_OK);
    h.len = 60; /* 40 prompt + 20 generated */
    dsp_sample_params p = dsp_sample_params_default();
    p.temperature = 0.8f;
    p.top_k = 50;
    p.top_p = 0.9f;
    p.presence_penalty = 0.6f;
    p.frequency_penalty = 0.3f;
    p.repetition_penalty = 1.3f;
    p.repetition_last_n = 16;
    ctx a, b;
    ctx_init(&a, V);
    ctx_init(&b, V);
    CHECK_EQ_INT(dsp_sample_process(x, &h, &p, &a.s, &a.d), DSP_OK);
    /* the verifier: push hypothetical tokens, process at each, pop them all */
    int32_t drafts[8] = {3, 3, 7, 250, 3, 12, 0, 7};
    for (int i = 0; i < 8; i++) {
        CHECK_EQ_INT(dsp_sample_history_push(&h, drafts[i]), DSP_OK);
        CHECK_EQ_INT(dsp_sample_process(x, &h, &p, &b.s, &b.d), DSP_OK);
        /* the same history built directly gives the same bits */
        memcpy(buf2, buf, sizeof buf);
        CHECK_EQ_INT(dsp_sample_history_init(&h2, buf2, CAP, 40), DSP_OK);
        h2.len = h.len;
        ctx e;
        ctx_init(&e, V);
        CHECK_EQ_INT(dsp_sample_process(x, &h2, &p, &e.s, &e.d), DSP_OK);
        CHECK(e.d.n_kept == b.d.n_kept && memcmp(e.d.logits, b.d.logits, V * sizeof(float)) == 0 &&
              memcmp(e.d.p, b.d.p, V * sizeof(float)) == 0 &&
              memcmp(e.d.kept, b.d.kept, (size_t)b.d.n_kept * sizeof(int32_t)) == 0);
        ctx_free(&e);
    }
    CHECK(memcmp(a.d.logits, b.d.logits, V * sizeof(float)) != 0); /* the drafts did matter */
    CHECK_EQ_INT(dsp_sample_history_pop(&h, 8), DSP_OK);
    CHECK_EQ_INT(dsp_sample_process(x, &h, &p, &b.s, &b.d), DSP_OK);
    CHECK(memcmp(a.d.logits, b.d.logits, V * sizeof(float)) == 0);
    CHECK(memcmp(a.d.p, b.d.p, V * sizeof(float)) == 0);
    CHECK(a.d.n_kept == b.d.n_kept && a.d.p_sum == b.d.p_sum && a.d.log_mass == b.d.log_mass);
    CHECK(counts_all_zero(&b));
    /* limits */
    CHECK_EQ_INT(dsp_sample_history_pop(&h, 21), DSP_ERR_RANGE); /* only 20 generated */
    CHECK_EQ_INT(dsp_sample_history_pop(&h, 20), DSP_OK);
    CHECK_EQ_INT(h.len, 40);
    dsp_sample_history f;
    int32_t one[2] = {0, 0};
    CHECK_EQ_INT(dsp_sample_history_init(&f, one, 2, 3), DSP_ERR_RANGE);
    CHECK_EQ_INT(dsp_sample_history_init(&f, one, 2, 1), DSP_OK);
    CHECK_EQ_INT(dsp_sample_history_push(&f, 1), DSP_OK);
    CHECK_EQ_INT(dsp_sample_history_push(&f, 1), DSP_ERR_RANGE);
    /* a token outside the vocabulary is an error and leaves the scratch clean */
    CHECK_EQ_INT(dsp_sample_history_push(&h, 5), DSP_OK);
    CHECK_EQ_INT(dsp_sample_history_push(&h, V), DSP_OK);
    CHECK_EQ_INT(dsp_sample_process(x, &h, &p, &b.s, &b.d), DSP_ERR_INVALID_ARG);
    CHECK(strstr(dsp_last_error(), "outside the vocabulary") != NULL);
    CHECK(counts_all_zero(&b));
    ctx_free(&a);
    ctx_free(&b);
}

/* ---- fast paths vs a slow full-sort reference ----------------------------------------------- */

typedef struct ref_ent {
    float z;
    int32_t id;
} ref_ent;

static int ref_cmp(const void *a, const void *b) {
    const ref_ent *x = a, *y = b;
    if (x->z != y->z) return x->z > y->z ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* sample.h step 6 written the obvious way: full sort, then top-k, top-p, min-p. Same exp and
 * summation orders (totals ascending id, top-p running sum in sorted order), so the bits must
 * agree. */
static void ref_process(const float *x, int32_t V, const dsp_sample_params *p, float *prob, ref_ent *e,
                        double *w, bool *keep) {
    for (int32_t i = 0; i < V; i++) e[i] = (ref_ent){x[i], i};
    qsort(e, (size_t)V, sizeof *e, ref_cmp);
    double zmax = e[0].z, T = p->temperature;
    for (int32_t i = 0; i < V; i++) {
        keep[i] = true;
        w[i] = dsp_sample_exp(((double)x[i] - zmax) / T);
    }
    if (p->top_k > 0 && p->top_k < V)
        for (int32_t i = 0; i < V; i++) keep[i] = x[i] >= e[p->top_k - 1].z;
    if (p->top_p < 1.0f) {
        double total = 0.0, cum = 0.0, target;
        for (int32_t i = 0; i < V; i++) total += keep[i] ? w[i] : 0.0;
        target = (double)p->top_p * total;
        float zcut = e[0].z;
        for (int32_t j = 0; j < V; j++) {
            if (!keep[e[j].id]) break;
            cum += w[e[j].id];
            zcut = e[j].z;
            if (cum >= target) break;
        }
        for (int32_t i = 0; i < V; i++) keep[i] = keep[i] && x[i] >= zcut;
    }
    double mass = 0.0;
    for (int32_t i = 0; i < V; i++) {
        keep[i] = keep[i] && w[i] > 0.0 && w[i] >= (double)p->min_p;
        mass += keep[i] ? w[i] : 0.0;
    }
    for (int32_t i = 0; i < V; i++) prob[i] = keep[i] ? (float)(w[i] / mass) : 0.0f;
}

static void test_large_vocab_vs_reference(void) {
    enum { V = 262144 };
    float *x = malloc(V * sizeof *x), *prob = malloc(V * sizeof *prob);
    ref_ent *e = malloc(V * sizeof *e);
    double *w = malloc(V * sizeof *w);
    bool *keep = malloc(V * sizeof *keep);
    ctx c;
    ctx_init(&c, V);
    struct { float scale, T; int32_t k; float p, min_p; } cases[] = {
        {1.0f, 1.0f, 0, 0.9f, 0.0f},     /* flat: top-p must widen its prefix several times */
        {6.0f, 0.8f, 0, 0.95f, 0.0f},    /* peaked */
        {3.0f, 1.0f, 50, 1.0f, 0.0f},
        {3.0f, 1.2f, 1000, 0.8f, 0.01f},
        {2.0f, 0.7f, 40, 0.9f, 0.05f},
        /* no top-k: whole-row kernels */
        {3.0f, 1.0f, 0, 1.0f, 0.0f},
        {3.0f, 1.0f, 0, 1.0f, 0.05f},
        {2.0f, 0.9f, 0, 0.9f, 0.02f},
        {1.0f, 1.0f, 0, 0.5f, 0.0f},     /* -inf tokens (below) */
        {300.0f, 1.0f, 0, 1.0f, 0.0f},   /* weights down to 0 through the subnormals */
        {300.0f, 1.0f, 0, 0.999f, 0.0f}, /* (and the top token alone is 0.999 of the mass) */
        {300.0f, 1.0f, 5000, 0.999f, 0.0f},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        random_logits(x, V, 100 + k, cases[k].scale);
        if (k == 2) /* many exact ties, some at the top-k boundary */
            for (int32_t i = 0; i < V; i++) x[i] = roundf(x[i] * 4.0f) / 4.0f;
        if (k == 8)
            for (int32_t i = 0; i < V; i += 3) x[i] = -INFINITY;
        dsp_sample_params p = dsp_sample_params_default();
        p.temperature = cases[k].T;
        p.top_k = cases[k].k;
        p.top_p = cases[k].p;
        p.min_p = cases[k].min_p;
        CHECK_EQ_INT(dsp_sample_process(x, NULL, &p, &c.s, &c.d), DSP_OK);
        ref_process(x, V, &p, prob, e, w, keep);
        int32_t nk = 0, bad = 0;
        for (int32_t i = 0; i < V; i++) {
            nk += prob[i] > 0.0f;
            bad += prob[i] != c.d.p[i];
        }
        CHECK_MSG(bad == 0 && nk == c.d.n_kept, "case %zu: %d differ, kept %d vs %d", k, bad, nk,
                  c.d.n_kept);
        CHECK_MSG(c.d.n_kept > 1 || cases[k].scale > 100.0f, "case %zu: one token kept", k);
    }
    ctx_free(&c);
    free(x);
    free(prob);
    free(e);
    free(w);
    free(keep);
}

/* ---- the own exp, and every kernel table --------------------------------------------------- */

static int64_t ulp_distance(double a, double b) {
    int64_t x, y;
    memcpy(&x, &a, sizeof x);
    memcpy(&y, &b, sizeof y);
    return x > y ? x - y : y - x; /* both >= 0: the bit patterns order like the values */
}

/* dsp_sample_exp against libm's exp on the sampler's domain: uniform over [-746, 0], [-40, 0] and
 * [-1, 0], tiny arguments, the subnormal results (below -708), and both sides of every rounding
 * boundary of k (x near (j + 1/2) ln2). At most 1 ulp apart; the worst and the share that differs
 * are printed. */
static void test_own_exp(void) {
    CHECK(dsp_sample_exp(0.0) == 1.0 && dsp_sample_exp(-0.0) == 1.0);
    CHECK(dsp_sample_exp(-INFINITY) == 0.0 && dsp_sample_exp(-746.0) == 0.0 && dsp_sample_exp(-1e300) == 0.0);
    CHECK(dsp_sample_exp(-745.2) == 0.0 && dsp_sample_exp(-745.0) > 0.0); /* the smallest subnormal */
    dsp_rng r;
    dsp_rng_seed(&r, 77);
    const long n = 3000000;
    long differ = 0;
    int64_t worst = 0;
    double worst_at = 0.0;
    for (long i = 0; i < n + 2 * 1076; i++) {
        const double u = dsp_rng_uniform(&r);
        double x;
        if (i >= n) { /* k's rounding boundaries, from both sides */
            const long j = (i - n) / 2;
            x = -((double)j + 0.5) * 0.6931471805599453 + ((i - n) % 2 ? 1e-13 : -1e-13);
            if (x > 0.0) x = 0.0;
        } else {
            switch (i % 6) {
            case 0: x = -746.0 * u; break;
            case 1: x = -40.0 * u; break;
            case 2: x = -u; break;
            case 3: x = -1e-6 * u; break;
            case 4: x = -708.0 - 38.0 * u; break;
            default: x = -ldexp(1.0, -(int)(1074.0 * u)); break; /* magnitudes down to 2^-1074 */
            }
        }
        const int64_t d = ulp_distance(dsp_sample_exp(x), exp(x));
        differ += d != 0;
        if (d > worst) worst = d, worst_at = x;
    }
    fprintf(stderr, "  own exp vs libm: max %lld ulp (at %a), %.2f%% of %ld points differ\n", (long long)worst, worst_at,
            100.0 * (double)differ / (double)(n + 2 * 1076), n + 2 * 1076);
    CHECK_MSG(worst <= 1, "own exp %lld ulp from libm at %a", (long long)worst, worst_at);
}

/* dsp_sample_process with each CPU kernel table this machine runs (scratch.ops) against the
 * scalar reference table: p, kept, n_kept, argmax, p_sum and log_mass bit for bit, over odd
 * vocabulary sizes (vector tails), -inf/NaN/+inf logits, weights that underflow through the
 * subnormals, and every path of step 6. */
static void test_tables_bitwise(void) {
    static const char *const names[] = {"avx2", "avx2vnni", "avx512", "avx512vnni"};
    static const int32_t sizes[] = {1, 3, 7, 8, 9, 33, 65, 1000, 4099, 49157};
    struct { float T; int32_t k; float p, min_p; } prm[] = {
        {1.0f, 0, 1.0f, 0.0f}, {0.7f, 0, 1.0f, 0.05f}, {1.3f, 0, 0.9f, 0.0f}, {1.0f, 0, 0.95f, 0.02f},
        {2.0f, 0, 0.3f, 0.0f}, {1.0f, 40, 1.0f, 0.0f}, {0.8f, 40, 0.9f, 0.01f}, {0.0f, 0, 1.0f, 0.0f},
        {0.01f, 0, 1.0f, 0.0f}, {1e-30f, 0, 0.99f, 0.0f},
    };
    int n_tables = 0;
    for (size_t t = 0; t < sizeof names / sizeof *names; t++) {
        const dsp_cpu_ops *o = dsp_cpu_ops_get(names[t]);
        if (!o) continue;
        n_tables++;
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
            const int32_t V = sizes[si];
            float *x = malloc((size_t)V * sizeof *x);
            ctx a, b;
            ctx_init(&a, V);
            ctx_init(&b, V);
            a.s.ops = &dsp_cpu_ops_scalar;
            b.s.ops = o;
            for (int rows = 0; rows < 3; rows++) {
                dsp_rng r;
                dsp_rng_seed(&r, 1000 + (uint64_t)(si * 7 + (size_t)rows));
                for (int32_t i = 0; i < V; i++) {
                    x[i] = 3.0f * normal(&r);
                    if (rows == 1) x[i] *= 100.0f; /* (z - zmax) / T through -746: subnormal weights, zeros */
                    if (rows == 2 && i % 5 == 1) x[i] = i % 3 ? -INFINITY : NAN;
                }
                if (rows == 2 && V > 4) x[V / 2] = INFINITY, x[V - 1] = INFINITY;
                for (size_t q = 0; q < sizeof prm / sizeof *prm; q++) {
                    dsp_sample_params p = dsp_sample_params_default();
                    p.temperature = prm[q].T;
                    p.top_k = prm[q].k;
                    p.top_p = prm[q].p;
                    p.min_p = prm[q].min_p;
                    CHECK_EQ_INT(dsp_sample_process(x, NULL, &p, &a.s, &a.d), DSP_OK);
                    CHECK_EQ_INT(dsp_sample_process(x, NULL, &p, &b.s, &b.d), DSP_OK);
                    const bool same = a.d.n_kept == b.d.n_kept && a.d.argmax == b.d.argmax &&
                                      !memcmp(a.d.p, b.d.p, (size_t)V * sizeof *a.d.p) &&
                                      !memcmp(a.d.kept, b.d.kept, (size_t)a.d.n_kept * sizeof *a.d.kept) &&
                                      !memcmp(&a.d.p_sum, &b.d.p_sum, sizeof a.d.p_sum) &&
                                      !memcmp(&a.d.log_mass, &b.d.log_mass, sizeof a.d.log_mass);
                    CHECK_MSG(same, "%s vs scalar: V %d row %d params %zu: kept %d vs %d, p_sum %a vs %a", o->name, V, rows, q,
                              b.d.n_kept, a.d.n_kept, b.d.p_sum, a.d.p_sum);
                }
            }
            free(x);
            ctx_free(&a);
            ctx_free(&b);
        }
    }
    if (!n_tables) dsp_test_skip("no vector kernel table runs on this CPU");
    fprintf(stderr, "  %d vector table(s) compared with the scalar one\n", n_tables);
}

/* ---- statistics ----------------------------------------------------------------------------- */

static void test_chi_square_sampling(void) {
    enum { V = 1000, N = 200000 };
    float x[V];
    random_logits(x, V, 21, 1.0f);
    ctx c;
    ctx_init(&c, V);
    dsp_sample_params p = dsp_sample_params_default();
    p.temperature = 1.2f;
    p.top_k = 25;
    CHECK_EQ_INT(dsp_sample_process(x, NULL, &p, &c.s, &c.d), DSP_OK);
    CHECK_EQ_INT(c.d.n_kept, 25);
    long obs[25] = {0};
    double prob[25], wrong[25];
    dsp_rng r;
    dsp_rng_seed(&r, 2024);
    long strays = 0;
    for (int i = 0; i < N; i++) {
        int32_t t = dsp_sample_from_dist(&c.d, dsp_rng_uniform(&r));
        int j = 0;
        while (j < 25 && c.d.kept[j] != t) j++;
        if (j < 25) obs[j]++; else strays++;
    }
    CHECK_EQ_INT(strays, 0);
    for (int j = 0; j < 25; j++) {
        prob[j] = c.d.p[c.d.kept[j]];
        wrong[j] = prob[j] * (j % 2 ? 1.05 : 0.95); /* every bin 5% off */
    }
    double s = 0.0;
    for (int j = 0; j < 25; j++) s += wrong[j];
    for (int j = 0; j < 25; j++) wrong[j] /= s;
    double pv = chi2_pvalue_all(obs, prob, 25, N), pw = chi2_pvalue_all(obs, wrong, 25, N);
    CHECK_MSG(pv > 1e-3, "p-value %g", pv);
    CHECK_MSG(pw < 1e-6, "the test cannot tell a 5%% error: p-value %g", pw); /* it can fail */
    /* gamma_q sanity: chi-square with 2 dof has Q = exp(-x/2) */
    CHECK(fabs(gamma_q(1.0, 3.0) - exp(-3.0)) < 1e-12);
    CHECK(fabs(gamma_q(1.0, 0.5) - exp(-0.5)) < 1e-12);
    ctx_free(&c);
}

/* draw from an arbitrary q (V) by inverse CDF */
static int32_t draw_q(const float *q, int32_t V, double u) {
    double s = 0.0, cum = 0.0;
    for (int32_t i = 0; i < V; i++) s += q[i];
    for (int32_t i = 0; i < V; i++) {
        cum += q[i];
        if (cum > u * s) return i;
    }
    return V - 1;
}

static void test_rejection_sampling_is_lossless(void) {
    enum { V = 40, N = 100000 };
    float x[V], q[V], y[V];
    random_logits(x, V, 31, 1.0f);
    random_logits(y, V, 32, 1.0f); /* a different drafter distribution, mass outside p's support */
    double qs = 0.0;
    for (int i = 0; i < V; i++) qs += exp(y[i]);
    for (int i = 0; i < V; i++) q[i] = (float)(exp(y[i]) / qs);
    ctx c;
    ctx_init(&c, V);
    dsp_sample_params p = dsp_sample_params_default();
    p.top_k = 12;
    CHECK_EQ_INT(dsp_sample_process(x, NULL, &p, &c.s, &c.d), DSP_OK);
    long obs[V] = {0}, obs1[V] = {0};
    dsp_rng r;
    dsp_rng_seed(&r, 77);
    long accepted = 0;
    const int32_t draft1 = c.d.kept[3];
    for (int i = 0; i < N; i++) {
        /* general q (DRAFTERS.md 3.2) */
        int32_t d = draw_q(q, V, dsp_rng_uniform(&r));
        int32_t t;
        if (dsp_sample_accept(&c.d, d, q[d], dsp_rng_uniform(&r))) {
            t = d;
            accepted++;
        } else {
            t = dsp_sample_from_residual(&c.d, q, dsp_rng_uniform(&r));
        }
        obs[t]++;
        /* one-hot drafter always proposing draft1 (3.3) */
        if (dsp_sample_accept(&c.d, draft1, 1.0f, dsp_rng_uniform(&r)))
            t = draft1;
        else
            t = dsp_sample_from_residual_onehot(&c.d, draft1, dsp_rng_uniform(&r));
        obs1[t]++;
    }
    long kobs[V], kobs1[V], outside = 0;
    double prob[V];
    for (int j = 0; j < c.d.n_kept; j++) {
        kobs[j] = obs[c.d.kept[j]];
        kobs1[j] = obs1[c.d.kept[j]];
        prob[j] = c.d.p[c.d.kept[j]];
    }
    for (int i = 0; i < V; i++)
        if (c.d.p[i] == 0.0f) outside += obs[i] + obs1[i];
    CHECK_EQ_INT(outside, 0);
    double pv = chi2_pvalue_all(kobs, prob, c.d.n_kept, N), pv1 = chi2_pvalue_all(kobs1, prob, c.d.n_kept, N);
    CHECK_MSG(pv > 1e-3, "general q: p-value %g", pv);
    CHECK_MSG(pv1 > 1e-3, "one-hot q: p-value %g", pv1);
    /* the acceptance rate is sum_x min(p, q) */
    double expect = 0.0;
    for (int i = 0; i < V; i++) expect += fmin(c.d.p[i], q[i]);
    CHECK_MSG(fabs((double)accepted / N - expect) < 0.01, "accept rate %g vs %g",
              (double)accepted / N, expect);
    /* p == q: every draft is accepted; the residual falls back to p */
    CHECK(dsp_sample_accept(&c.d, c.d.argmax, c.d.p[c.d.argmax], 0.999999));
    int32_t t = dsp_sample_from_residual(&c.d, c.d.p, 0.5);
    CHECK(c.d.p[t] > 0.0f && t == dsp_sample_from_dist(&c.d, 0.5));
    /* q = 0 at the draft: clamped, certainly accepted when p > 0, never when p = 0 */
    CHECK(dsp_sample_accept(&c.d, c.d.argmax, 0.0f, 0.999));
    int32_t out = 0;
    while (c.d.p[out] > 0.0f) out++;
    CHECK(!dsp_sample_accept(&c.d, out, 0.5f, 0.0));
    CHECK(!dsp_sample_accept(&c.d, -1, 0.5f, 0.0));
    ctx_free(&c);
}

static void test_reproducible_with_seed(void) {
    enum { V = 500, STEPS = 60 };
    float x[V];
    random_logits(x, V, 41, 2.0f);
    int32_t buf[STEPS + 8] = {1, 2, 3};
    ctx c;
    ctx_init(&c, V);
    dsp_sample_params p = dsp_sample_params_default();
    p.temperature = 1.1f;
    p.top_p = 0.95f;
    p.frequency_penalty = 0.2f;
    int32_t out[3][STEPS];
    const uint64_t seeds[3] = {5, 5, 6};
    for (int run = 0; run < 3; run++) {
        dsp_sample_history h;
        dsp_sample_history_init(&h, buf, STEPS + 8, 3);
        dsp_rng r;
        dsp_rng_seed(&r, seeds[run]);
        for (int i = 0; i < STEPS; i++) {
            CHECK_EQ_INT(dsp_sample_token(x, &h, &p, &r, &c.s, &c.d, &out[run][i]), DSP_OK);
            dsp_sample_history_push(&h, out[run][i]);
        }
        /* exactly one uniform per sampled token */
        dsp_rng r2;
        dsp_rng_seed(&r2, seeds[run]);
        for (int i = 0; i < STEPS; i++) (void)dsp_rng_uniform(&r2);
        CHECK(memcmp(&r, &r2, sizeof r) == 0);
    }
    CHECK(memcmp(out[0], out[1], sizeof out[0]) == 0);
    CHECK(memcmp(out[0], out[2], sizeof out[0]) != 0);
    /* greedy consumes one uniform too */
    p.temperature = 0.0f;
    dsp_rng r, r2;
    dsp_rng_seed(&r, 9);
    dsp_rng_seed(&r2, 9);
    int32_t t;
    CHECK_EQ_INT(dsp_sample_token(x, NULL, &p, &r, &c.s, &c.d, &t), DSP_OK);
    (void)dsp_rng_uniform(&r2);
    CHECK(memcmp(&r, &r2, sizeof r) == 0 && t == c.d.argmax);
    ctx_free(&c);
}

/* ---- logprobs ------------------------------------------------------------------------------- */

static void test_logprobs(void) {
    enum { V = 30 };
    float x[V];
    random_logits(x, V, 51, 2.0f);
    x[7] = x[8] = 10.0f; /* a tie at the top: 7 before 8 */
    x[3] = NAN;
    ctx c;
    ctx_init(&c, V);
    dsp_sample_logprob chosen, top[DSP_SAMPLE_MAX_LOGPROBS];
    int32_t n = 0;
    CHECK_EQ_INT(dsp_sample_logprobs(x, V, NULL, DSP_SAMPLE_LOGPROBS_RAW, 5, 5, &chosen, top, &n), DSP_OK);
    CHECK_EQ_INT(n, 5);
    double s = 0.0;
    for (int i = 0; i < V; i++) s += i == 3 ? 0.0 : exp((double)x[i] - 10.0);
    double lse = 10.0 + log(s);
    CHECK(fabs(chosen.logprob - (x[5] - lse)) < 1e-6 && chosen.token == 5);
    CHECK(top[0].token == 7 && top[1].token == 8 && top[0].logprob == top[1].logprob);
    for (int i = 1; i < n; i++) CHECK(top[i - 1].logprob >= top[i].logprob);
    CHECK(fabs(top[0].logprob - (10.0 - lse)) < 1e-6);
    CHECK_EQ_INT(dsp_sample_logprobs(x, V, NULL, DSP_SAMPLE_LOGPROBS_RAW, 3, 0, &chosen, NULL, &n), DSP_OK);
    CHECK(chosen.logprob == -INFINITY && n == 0); /* NaN reads as -inf */
    CHECK_EQ_INT(dsp_sample_logprobs(x, V, NULL, DSP_SAMPLE_LOGPROBS_RAW, 0, 21, &chosen, top, &n),
                 DSP_ERR_INVALID_ARG);
    CHECK_EQ_INT(dsp_sample_logprobs(x, V, NULL, DSP_SAMPLE_LOGPROBS_RAW, V, 1, &chosen, top, &n),
                 DSP_ERR_INVALID_ARG);
    CHECK_EQ_INT(dsp_sample_logprobs(x, V, NULL, DSP_SAMPLE_LOGPROBS_PROCESSED, 0, 1, &chosen, top, &n),
                 DSP_ERR_INVALID_ARG);
    /* n_top > V is clamped */
    float small[3] = {0.0f, 1.0f, 2.0f};
    CHECK_EQ_INT(dsp_sample_logprobs(small, 3, NULL, DSP_SAMPLE_LOGPROBS_RAW, 0, 20, &chosen, top, &n), DSP_OK);
    CHECK(n == 3 && top[0].token == 2 && top[2].token == 0);

    /* processed: log p of the sampled distribution; raw ignores penalties and temperature */
    dsp_sample_params p = dsp_sample_params_default();
    p.temperature = 0.5f;
    p.top_k = 6;
    dsp_sample_bias b = {0, 3.0f};
    p.logit_bias = &b;
    p.n_logit_bias = 1;
    CHECK_EQ_INT(dsp_sample_process(x, NULL, &p, &c.s, &c.d), DSP_OK);
    CHECK_EQ_INT(dsp_sample_logprobs(x, V, &c.d, DSP_SAMPLE_LOGPROBS_PROCESSED, 7, 10, &chosen, top, &n), DSP_OK);
    CHECK_EQ_INT(n, 10);
    int finite = 0;
    for (int i = 0; i < n; i++) {
        int32_t t = top[i].token;
        if (c.d.p[t] > 0.0f) {
            finite++;
            CHECK(fabs(exp(top[i].logprob) - c.d.p[t]) < 1e-6);
        } else {
            CHECK(top[i].logprob == -INFINITY);
        }
        if (i) CHECK(top[i - 1].logprob >= top[i].logprob);
    }
    CHECK(finite == 6 && top[0].token == 7 && top[1].token == 8);
    CHECK(fabs(exp(chosen.logprob) - c.d.p[7]) < 1e-6);
    dsp_sample_logprob raw_chosen;
    CHECK_EQ_INT(dsp_sample_logprobs(x, V, &c.d, DSP_SAMPLE_LOGPROBS_RAW, 0, 0, &raw_chosen, NULL, &n), DSP_OK);
    CHECK(fabs(raw_chosen.logprob - (x[0] - lse)) < 1e-6); /* without the bias */
    /* greedy processed: 0 for the argmax, -inf elsewhere */
    p.temperature = 0.0f;
    CHECK_EQ_INT(dsp_sample_process(x, NULL, &p, &c.s, &c.d), DSP_OK);
    CHECK_EQ_INT(dsp_sample_logprobs(x, V, &c.d, DSP_SAMPLE_LOGPROBS_PROCESSED, 7, 3, &chosen, top, &n), DSP_OK);
    CHECK(chosen.logprob == 0.0f && top[0].token == 7 && top[1].logprob == -INFINITY);
    ctx_free(&c);
}

/* ---- Hugging Face oracle fixtures ------------------------------------------------------------ */

/* Tolerances, stated: kept sets must match exactly; probabilities within 1e-5 relative +
 * 1e-9 absolute (HF computes softmax in float32, we compute in double); raw logprobs within
 * 1e-5 absolute. */
#define FIX_P_REL 1e-5
#define FIX_P_ABS 1e-9
#define FIX_LP_ABS 1e-5

static double jnum(const json_t *o, const char *key, double dflt) {
    const json_t *v = json_object_get(o, key);
    return v && json_is_number(v) ? json_number_value(v) : dflt;
}

static int run_fixture_file(const char *path, int *n_cases) {
    json_error_t err;
    json_t *doc = json_load_file(path, 0, &err);
    CHECK_MSG(doc != NULL, "%s: %s (line %d)", path, err.text, err.line);
    if (!doc) return 1;
    int32_t V = (int32_t)json_integer_value(json_object_get(doc, "n_vocab"));
    json_t *rows = json_object_get(doc, "rows"), *cases = json_object_get(doc, "cases");
    CHECK(V > 0 && json_is_array(rows) && json_is_array(cases));
    ctx c;
    ctx_init(&c, V);
    float *x = malloc((size_t)V * sizeof *x);
    int32_t *hist = malloc(4096 * sizeof *hist);
    size_t ci;
    json_t *cs;
    json_array_foreach(cases, ci, cs) {
        const char *name = json_string_value(json_object_get(cs, "name"));
        json_t *row = json_array_get(rows, (size_t)json_integer_value(json_object_get(cs, "row")));
        CHECK((int32_t)json_array_size(row) == V);
        for (int32_t i = 0; i < V; i++) x[i] = (float)json_number_value(json_array_get(row, (size_t)i));
        dsp_sample_params p = dsp_sample_params_default();
        p.temperature = (float)jnum(cs, "temperature", 1.0);
        p.top_k = (int32_t)jnum(cs, "top_k", 0);
        p.top_p = (float)jnum(cs, "top_p", 1.0);
        p.min_p = (float)jnum(cs, "min_p", 0.0);
        p.repetition_penalty = (float)jnum(cs, "repetition_penalty", 1.0);
        p.repetition_last_n = (int32_t)jnum(cs, "repetition_last_n", 64);
        p.presence_penalty = (float)jnum(cs, "presence_penalty", 0.0);
        p.frequency_penalty = (float)jnum(cs, "frequency_penalty", 0.0);
        dsp_sample_bias bias[16];
        json_t *jb = json_object_get(cs, "logit_bias");
        p.n_logit_bias = (uint32_t)json_array_size(jb);
        CHECK(p.n_logit_bias <= 16);
        for (uint32_t i = 0; i < p.n_logit_bias && i < 16; i++) {
            bias[i].token = (int32_t)json_integer_value(json_array_get(json_array_get(jb, i), 0));
            bias[i].bias = (float)json_number_value(json_array_get(json_array_get(jb, i), 1));
        }
        p.logit_bias = bias;
        json_t *jp = json_object_get(cs, "prompt"), *jg = json_object_get(cs, "generated");
        uint32_t np = (uint32_t)json_array_size(jp), ng = (uint32_t)json_array_size(jg);
        CHECK(np + ng <= 4096);
        for (uint32_t i = 0; i < np; i++) hist[i] = (int32_t)json_integer_value(json_array_get(jp, i));
        dsp_sample_history h;
        CHECK_EQ_INT(dsp_sample_history_init(&h, hist, 4096, np), DSP_OK);
        for (uint32_t i = 0; i < ng; i++)
            CHECK_EQ_INT(dsp_sample_history_push(&h, (int32_t)json_integer_value(json_array_get(jg, i))), DSP_OK);

        CHECK_EQ_INT(dsp_sample_process(x, &h, &p, &c.s, &c.d), DSP_OK);
        json_t *kept = json_object_get(cs, "kept"), *pp = json_object_get(cs, "p");
        int32_t nk = (int32_t)json_array_size(kept);
        CHECK_MSG(nk == c.d.n_kept, "%s: kept %d, HF %d", name, c.d.n_kept, nk);
        int set_bad = 0, p_bad = 0;
        double worst = 0.0;
        for (int32_t j = 0; j < nk && j < c.d.n_kept; j++) {
            int32_t t = (int32_t)json_integer_value(json_array_get(kept, (size_t)j));
            if (t != c.d.kept[j]) set_bad++;
            double e = json_number_value(json_array_get(pp, (size_t)j)), g = c.d.p[t];
            double dev = fabs(g - e);
            if (dev > FIX_P_ABS + FIX_P_REL * e) p_bad++;
            worst = fmax(worst, dev / e);
        }
        CHECK_MSG(set_bad == 0, "%s: %d kept ids differ from HF", name, set_bad);
        CHECK_MSG(p_bad == 0, "%s: %d probabilities off (worst rel %g)", name, p_bad, worst);
        if (getenv("DSP_VERBOSE")) fprintf(stderr, "  %-40s kept %5d  worst rel dev %.3g\n", name, nk, worst);
        /* raw logprobs: torch.log_softmax */
        json_t *jl = json_object_get(cs, "raw_logprobs");
        dsp_sample_logprob chosen, top[5];
        int32_t n = 0;
        int32_t first = (int32_t)json_integer_value(json_array_get(json_array_get(jl, 0), 0));
        CHECK_EQ_INT(dsp_sample_logprobs(x, V, NULL, DSP_SAMPLE_LOGPROBS_RAW, first, 5, &chosen, top, &n), DSP_OK);
        for (int32_t j = 0; j < n && j < (int32_t)json_array_size(jl); j++) {
            json_t *e = json_array_get(jl, (size_t)j);
            CHECK_MSG(top[j].token == (int32_t)json_integer_value(json_array_get(e, 0)), "%s: top %d", name, j);
            CHECK_MSG(fabs(top[j].logprob - json_number_value(json_array_get(e, 1))) < FIX_LP_ABS,
                      "%s: logprob %d", name, j);
        }
        (*n_cases)++;
    }
    free(x);
    free(hist);
    ctx_free(&c);
    json_decref(doc);
    return 0;
}

static void test_hf_fixtures(void) {
    const char *dir = getenv("DSP_FIXTURES");
    if (!dir || !*dir) {
        dsp_test_skip("DSP_FIXTURES not set (ctest sets it)");
        return;
    }
    const char *files[] = {"warpers.json", "penalties.json"};
    int n = 0;
    for (int i = 0; i < 2; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/sampling/%s", dir, files[i]);
        run_fixture_file(path, &n);
    }
    CHECK_EQ_INT(n, 21);
}

int main(void) {
    DSP_RUN(test_rng_known_answers);
    DSP_RUN(test_rng_uniform_range_and_independence);
    DSP_RUN(test_params_validate);
    DSP_RUN(test_greedy_and_ties);
    DSP_RUN(test_temperature);
    DSP_RUN(test_top_k);
    DSP_RUN(test_top_p_and_min_p);
    DSP_RUN(test_nan_inf);
    DSP_RUN(test_logit_bias);
    DSP_RUN(test_repetition_window);
    DSP_RUN(test_presence_frequency);
    DSP_RUN(test_history_push_pop);
    DSP_RUN(test_large_vocab_vs_reference);
    DSP_RUN(test_own_exp);
    DSP_RUN(test_tables_bitwise);
    DSP_RUN(test_chi_square_sampling);
    DSP_RUN(test_rejection_sampling_is_lossless);
    DSP_RUN(test_reproducible_with_seed);
    DSP_RUN(test_logprobs);
    DSP_RUN(test_hf_fixtures);
    return dsp_test_summary();
}
