/* spec/verify: the verifier is lossless, checked statistically, and the check has teeth.
 *
 * Design: the expensive part of a sampling test is the target. Here the target is synthetic: a
 * fixed table of logits over a small vocabulary (V = 6) indexed by the last two tokens of the
 * history, processed by the real sampler (temperature, top-k/p, min-p, logit bias, penalties on the
 * real history). The real dsp_spec_verify runs whole generations of M = 3 tokens, round after
 * round, exactly as the engine drives it: drafts proposed after the committed tokens, logits rows
 * for [committed, committed + d1, ...], verify, commit. Because the target is a known function,
 * the exact law of the first M tokens under plain sequential decoding is computed by enumeration
 * (V^M = 216 sequences), and the spec samples are compared with it by a chi-square
 * goodness-of-fit test (bins with expected count < 5 pooled). N = 20,000 samples per
 * configuration; a configuration passes at p > 1e-3.
 *
 * Drafters: a deterministic one (argmax of a perturbed table: right most of the time, wrong
 * sometimes; one-hot q, sample-and-match) and a sampling one (q = softmax of another table, drafts
 * drawn from q with their own RNG: rejection sampling with the residual). Configurations cover
 * temperature, top-k + top-p, min-p + logit bias + presence/frequency/repetition penalties.
 *
 * Power: the same harness runs the verifier with deliberately wrong rules (dsp_spec_fault):
 * correcting from p instead of the residual, accepting with p(d) ignoring q, and evaluating the
 * penalties on the committed history instead of the hypothetical one. Each must FAIL (p < 1e-3).
 *
 * Also: greedy rounds give exactly the argmax chain, and the one-hot rule consumes the RNG exactly
 * like plain decoding (one uniform per token), so its samples equal baseline's for the same seed. */
#include "dsp_test.h"
#include "dsp_stats.h"

#include "sample/sample.h"
#include "spec/spec.h"
#include "spec/verify_impl.h" /* the faulty rules live only here and in the tests */

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define V 6
#define M 3
#define N_SAMPLES 20000
#define N_PROMPT 5
#define MAX_K 4

static float g_target[V][V][V];  /* [prev][last][token] */
static float g_drafter[V][V][V]; /* perturbed copy used by both drafters */
static dsp_sample_scratch g_s;
static dsp_sample_dist g_d;
static const int32_t g_prompt[N_PROMPT] = {0, 1, 2, 0, 1};

static long g_drafted, g_accepted; /* over a configuration: drafts must be likely */

static uint64_t lcg(uint64_t *x) {
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 33;
}

static void make_tables(void) {
    uint64_t x = 42;
    for (int a = 0; a < V; a++)
        for (int b = 0; b < V; b++)
            for (int t = 0; t < V; t++) {
                g_target[a][b][t] = (float)((double)(lcg(&x) % 7001) / 1000.0 - 3.5);
                /* the drafter's table: the target's plus noise (so drafts are often but not always right) */
                g_drafter[a][b][t] = g_target[a][b][t] + (float)((double)(lcg(&x) % 1001) / 1000.0 - 0.5);
            }
}

static const float *row_of(float (*tab)[V][V], const int32_t *h, uint32_t len) { return tab[h[len - 2]][h[len - 1]]; }

/* ---- exact law of the first M tokens under sequential decoding --------------------------- */

static void exact_law(const dsp_sample_params *sp, double *law) {
    int32_t buf[N_PROMPT + M];
    memcpy(buf, g_prompt, sizeof g_prompt);
    for (int idx = 0; idx < (int)pow(V, M); idx++) {
        int x[M], r = idx;
        for (int j = M - 1; j >= 0; j--) x[j] = r % V, r /= V;
        dsp_sample_history h;
        dsp_sample_history_init(&h, buf, N_PROMPT + M, N_PROMPT);
        double pr = 1.0;
        for (int j = 0; j < M; j++) {
            CHECK(dsp_sample_process(row_of(g_target, buf, h.len), &h, sp, &g_s, &g_d) == DSP_OK);
            pr *= (double)g_d.p[x[j]] / g_d.p_sum;
            dsp_sample_history_push(&h, x[j]);
        }
        law[idx] = pr;
    }
}

/* ---- the harness: whole generations through dsp_spec_verify ------------------------------ */

typedef enum { DRAFT_ONEHOT, DRAFT_Q } draft_kind;

/* Propose k drafts after buf[0, len) (the buffer is scratch past len). */
static void propose(draft_kind kind, const dsp_sample_params *sp, int32_t *buf, uint32_t len, int k, dsp_rng *drng, int32_t *draft,
                    float *q) {
    for (int i = 0; i < k; i++) {
        const float *z = row_of(g_drafter, buf, len + (uint32_t)i);
        int32_t t = 0;
        if (kind == DRAFT_ONEHOT) {
            for (int v = 1; v < V; v++)
                if (z[v] > z[t]) t = v;
        } else {
            double w[V], sum = 0, T = sp->temperature > 0 ? sp->temperature : 1.0;
            for (int v = 0; v < V; v++) sum += w[v] = exp((double)z[v] / T);
            double u = dsp_rng_uniform(drng) * sum, cum = 0;
            t = V - 1;
            for (int v = 0; v < V; v++) {
                cum += w[v];
                if (u < cum) {
                    t = v;
                    break;
                }
            }
            for (int v = 0; v < V; v++) q[(size_t)i * V + v] = (float)(w[v] / sum);
        }
        draft[i] = t;
        buf[len + (uint32_t)i] = t; /* the next draft conditions on it */
    }
}

/* One generation of M tokens; returns its index in V^M. */
static int generate(draft_kind kind, int k_draft, const dsp_sample_params *sp, dsp_spec_fault fault, dsp_rng *rng, dsp_rng *drng) {
    int32_t buf[N_PROMPT + M + MAX_K + 2], draft[MAX_K], out[MAX_K + 1];
    float q[MAX_K * V], logits[(MAX_K + 1) * V];
    memcpy(buf, g_prompt, sizeof g_prompt);
    dsp_sample_history h;
    dsp_sample_history_init(&h, buf, N_PROMPT + M + MAX_K + 2, N_PROMPT);
    int n_gen = 0;
    while (n_gen < M) {
        int k = k_draft;
        propose(kind, sp, buf, h.len, k, drng, draft, q);
        for (int i = 0; i <= k; i++) memcpy(logits + (size_t)i * V, row_of(g_target, buf, h.len + (uint32_t)i), sizeof(float) * V);
        int32_t n_out;
        dsp_status st = dsp_spec_verify_impl(logits, NULL, V, k, draft, kind == DRAFT_Q ? q : NULL, &h, sp, rng, &g_s, &g_d, fault, out, &n_out);
        CHECK(st == DSP_OK);
        CHECK(n_out >= 1 && n_out <= k + 1);
        for (int i = 0; i < n_out - 1; i++) CHECK(out[i] == draft[i]);
        g_drafted += k, g_accepted += n_out - 1;
        n_gen += n_out;
    }
    int idx = 0;
    for (int j = 0; j < M; j++) idx = idx * V + buf[N_PROMPT + j];
    return idx;
}

static double run_config(const char *name, draft_kind kind, int k, const dsp_sample_params *sp, dsp_spec_fault fault, uint64_t seed) {
    static double law[216];
    static long count[216];
    exact_law(sp, law);
    memset(count, 0, sizeof count);
    g_drafted = g_accepted = 0;
    dsp_rng rng, drng;
    dsp_rng_seed(&rng, seed);
    dsp_rng_seed(&drng, seed ^ 0x5bd1e995ull);
    for (int n = 0; n < N_SAMPLES; n++) count[generate(kind, k, sp, fault, &rng, &drng)]++;
    double pv = chi2_pvalue(law, count, 216, N_SAMPLES);
    double acc = (double)g_accepted / (double)g_drafted;
    fprintf(stderr, "  %-40s %-7s k=%d fault=%d: draft acceptance %.2f, p = %.3g\n", name, kind == DRAFT_Q ? "q" : "one-hot", k, (int)fault,
            acc, pv);
    if (fault == DSP_SPEC_FAULT_NONE) CHECK_MSG(acc > 0.12, "%s: drafts are rarely accepted (%.2f): the test would be weak", name, acc);
    return pv;
}

static dsp_sample_params cfg(int i) {
    dsp_sample_params sp = dsp_sample_params_default();
    static const dsp_sample_bias bias[1] = {{2, 1.5f}};
    switch (i) {
    case 0: sp.temperature = 1.0f; break;
    case 1: sp.temperature = 0.7f, sp.top_k = 4, sp.top_p = 0.9f; break;
    case 2:
        sp.temperature = 1.0f, sp.min_p = 0.1f, sp.presence_penalty = 1.0f, sp.frequency_penalty = 1.0f;
        sp.repetition_penalty = 1.4f, sp.repetition_last_n = 64, sp.logit_bias = bias, sp.n_logit_bias = 1;
        break;
    default: sp.temperature = 1.3f, sp.top_p = 0.8f, sp.presence_penalty = -0.5f, sp.frequency_penalty = 0.8f; break;
    }
    return sp;
}
static const char *cfg_name[] = {"T=1", "T=0.7 top-k 4 top-p 0.9", "T=1 min-p 0.1 bias + 3 penalties", "T=1.3 top-p 0.8 pres/freq"};

static void test_lossless_sampling(void) {
    for (int c = 0; c < 4; c++) {
        dsp_sample_params sp = cfg(c);
        CHECK_MSG(run_config(cfg_name[c], DRAFT_ONEHOT, 3, &sp, DSP_SPEC_FAULT_NONE, 100 + (uint64_t)c) > 1e-3, "%s one-hot", cfg_name[c]);
        CHECK_MSG(run_config(cfg_name[c], DRAFT_Q, 2, &sp, DSP_SPEC_FAULT_NONE, 200 + (uint64_t)c) > 1e-3, "%s q", cfg_name[c]);
    }
}

static void test_wrong_rules_are_detected(void) {
    dsp_sample_params sp = cfg(0);
    CHECK(run_config("WRONG correction from p", DRAFT_Q, 2, &sp, DSP_SPEC_FAULT_RESAMPLE_P, 300) < 1e-3);
    CHECK(run_config("WRONG accept w.p. p(d), correct from p", DRAFT_ONEHOT, 3, &sp, DSP_SPEC_FAULT_RESAMPLE_P, 301) < 1e-3);
    CHECK(run_config("WRONG accept ignoring q", DRAFT_Q, 2, &sp, DSP_SPEC_FAULT_IGNORE_Q, 302) < 1e-3);
    sp = cfg(2);
    CHECK(run_config("WRONG penalties on committed history", DRAFT_ONEHOT, 3, &sp, DSP_SPEC_FAULT_STALE_HISTORY, 303) < 1e-3);
}

/* Greedy: every round returns the argmax chain, whatever the drafter. */
static void test_greedy(void) {
    dsp_sample_params sp = dsp_sample_params_default();
    sp.temperature = 0.0f;
    sp.frequency_penalty = 0.5f;
    /* the argmax chain by plain decoding */
    int32_t ref[N_PROMPT + M];
    memcpy(ref, g_prompt, sizeof g_prompt);
    dsp_sample_history h;
    dsp_sample_history_init(&h, ref, N_PROMPT + M, N_PROMPT);
    for (int j = 0; j < M; j++) {
        dsp_sample_process(row_of(g_target, ref, h.len), &h, &sp, &g_s, &g_d);
        dsp_sample_history_push(&h, g_d.argmax);
    }
    dsp_rng rng, drng;
    dsp_rng_seed(&rng, 1), dsp_rng_seed(&drng, 2);
    for (int kind = 0; kind < 2; kind++)
        for (int k = 0; k <= MAX_K; k++) {
            int idx = generate((draft_kind)kind, k, &sp, DSP_SPEC_FAULT_NONE, &rng, &drng), want = 0;
            for (int j = 0; j < M; j++) want = want * V + ref[N_PROMPT + j];
            CHECK_EQ_INT(idx, want);
        }
}

/* One-hot rule: one uniform per token, the same inverse CDF as plain decoding, so for the same
 * seed the spec samples ARE baseline's samples, at every draft length. */
static void test_onehot_equals_baseline_path(void) {
    for (int c = 0; c < 4; c++) {
        dsp_sample_params sp = cfg(c);
        for (int k = 1; k <= MAX_K; k++) {
            dsp_rng rb, rs, drng;
            dsp_rng_seed(&rb, 77 + (uint64_t)c), dsp_rng_seed(&rs, 77 + (uint64_t)c), dsp_rng_seed(&drng, 3);
            int same = 0;
            for (int n = 0; n < 500; n++) {
                int32_t buf[N_PROMPT + M];
                memcpy(buf, g_prompt, sizeof g_prompt);
                dsp_sample_history h;
                dsp_sample_history_init(&h, buf, N_PROMPT + M, N_PROMPT);
                int want = 0;
                for (int j = 0; j < M; j++) {
                    int32_t t;
                    dsp_sample_token(row_of(g_target, buf, h.len), &h, &sp, &rb, &g_s, &g_d, &t);
                    dsp_sample_history_push(&h, t);
                    want = want * V + t;
                }
                /* spec consumes exactly M uniforms per generation too (rounds never overshoot M
                 * here because generate() stops after the round that reaches M: re-seed per sample) */
                dsp_rng one;
                one = rs;
                int got = generate(DRAFT_ONEHOT, k, &sp, DSP_SPEC_FAULT_NONE, &one, &drng);
                for (int j = 0; j < M; j++) dsp_rng_uniform(&rs);
                same += got == want;
            }
            CHECK_MSG(same == 500, "config %d k %d: %d of 500 equal", c, k, same);
        }
    }
}

/* Plain greedy from argmax rows (dsp_spec_verify_argmax, what the engine uses when the backend
 * computes the argmax where the logits are) decides exactly what the logits path decides: the same
 * tokens, history and RNG state, on rows with ties, NaN and +inf, and the same error on a row with
 * no finite value; other parameters are refused. */
static void test_argmax_rows(void) {
    enum { W = 50, K = 5 };
    static float rows[K + 1][W];
    uint64_t x = 99;
    size_t sb = dsp_sample_scratch_bytes(W), db = dsp_sample_dist_bytes(W);
    void *sm = aligned_alloc(64, (sb + 63) / 64 * 64), *dm = aligned_alloc(64, (db + 63) / 64 * 64);
    dsp_sample_scratch s;
    dsp_sample_dist d;
    dsp_sample_scratch_init(&s, sm, sb, W);
    dsp_sample_dist_init(&d, dm, db, W);
    dsp_sample_params sp = dsp_sample_params_default();
    sp.temperature = 0.0f;
    CHECK(dsp_sample_params_plain_greedy(&sp));
    for (int trial = 0; trial < 400; trial++) {
        for (int i = 0; i <= K; i++)
            for (int j = 0; j < W; j++) rows[i][j] = (float)(lcg(&x) % 7) - 3.0f; /* many ties */
        const int odd = trial % 5;
        if (odd == 1) rows[trial % (K + 1)][(int)(lcg(&x) % W)] = NAN;
        if (odd == 2) rows[trial % (K + 1)][3] = INFINITY, rows[trial % (K + 1)][1] = INFINITY, rows[trial % (K + 1)][0] = FLT_MAX;
        if (odd == 3 && trial % 3 == 0)
            for (int j = 0; j < W; j++) rows[trial % (K + 1)][j] = j % 2 ? NAN : -INFINITY; /* nothing finite */
        int32_t am[K + 1], draft[K];
        for (int i = 0; i <= K; i++) am[i] = dsp_sample_argmax(rows[i], W);
        const int k = trial % (K + 1);
        for (int i = 0; i < k; i++) draft[i] = lcg(&x) % 3 ? am[i] : (int32_t)(lcg(&x) % W); /* mostly right */
        int32_t b1[N_PROMPT + K + 1], b2[N_PROMPT + K + 1], o1[K + 1], o2[K + 1], n1 = -1, n2 = -1;
        memcpy(b1, g_prompt, sizeof g_prompt), memcpy(b2, g_prompt, sizeof g_prompt);
        dsp_sample_history h1, h2;
        dsp_sample_history_init(&h1, b1, N_PROMPT + K + 1, N_PROMPT), dsp_sample_history_init(&h2, b2, N_PROMPT + K + 1, N_PROMPT);
        dsp_rng r1, r2;
        dsp_rng_seed(&r1, (uint64_t)trial), dsp_rng_seed(&r2, (uint64_t)trial);
        dsp_status s1 = dsp_spec_verify(&rows[0][0], W, k, draft, NULL, &h1, &sp, &r1, &s, &d, o1, &n1);
        dsp_status s2 = dsp_spec_verify_argmax(am, W, k, draft, &h2, &sp, &r2, o2, &n2);
        CHECK_EQ_INT(s1, s2);
        CHECK_EQ_INT(n1, n2);
        CHECK(h1.len == h2.len && !memcmp(b1, b2, sizeof(int32_t) * h1.len));
        CHECK(n1 < 0 || !memcmp(o1, o2, sizeof(int32_t) * (size_t)n1));
        CHECK(dsp_rng_uniform(&r1) == dsp_rng_uniform(&r2));
    }
    int32_t am[1] = {0}, o[1], n;
    dsp_sample_history h;
    int32_t buf[N_PROMPT + 1];
    memcpy(buf, g_prompt, sizeof g_prompt);
    dsp_sample_history_init(&h, buf, N_PROMPT + 1, N_PROMPT);
    dsp_rng r;
    dsp_rng_seed(&r, 1);
    sp.repetition_penalty = 1.3f; /* a processor that can move the argmax */
    CHECK(!dsp_sample_params_plain_greedy(&sp));
    CHECK_EQ_INT(dsp_spec_verify_argmax(am, W, 0, NULL, &h, &sp, &r, o, &n), DSP_ERR_INVALID_ARG);
    free(sm), free(dm);
}

int main(void) {
    size_t sb = dsp_sample_scratch_bytes(V), db = dsp_sample_dist_bytes(V);
    void *sm = aligned_alloc(64, (sb + 63) / 64 * 64), *dm = aligned_alloc(64, (db + 63) / 64 * 64);
    dsp_sample_scratch_init(&g_s, sm, sb, V);
    dsp_sample_dist_init(&g_d, dm, db, V);
    make_tables();
    DSP_RUN(test_greedy);
    DSP_RUN(test_argmax_rows);
    DSP_RUN(test_onehot_equals_baseline_path);
    DSP_RUN(test_lossless_sampling);
    DSP_RUN(test_wrong_rules_are_detected);
    free(sm), free(dm);
    return dsp_test_summary();
}
