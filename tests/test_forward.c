/* Forward pass over a ragged batch: batch invariance (DESIGN.md §2) and input validation.
 * The logits of every position must be bit-identical whether computed one token at a time, in one
 * prefill chunk, in chunks of other sizes (1+k verify blocks), or interleaved with another sequence
 * in the same batch; for a prompt that crosses KV block boundaries (in chunks that straddle them);
 * and with other numbers of threads (CPU). Uses the default model; skips if it has not been fetched.
 * DSP_TEST_BACKEND=cuda runs it on the GPU (CTest: test_forward_cuda, label gpu; skip code 77
 * without one) and DSP_TEST_MODEL=FILE on another model (e.g. a random-weight one of the default
 * model's shape, where the default model cannot be copied). */
/* ctest-label: e2e */
#include "dsp_test.h"

#include "model/forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_PROMPT 11
static int32_t g_prompt[N_PROMPT] = {504, 3575, 282, 4649, 314, 7042, 30, 198, 504, 2988, 314};
static int32_t g_other[7] = {19556, 905, 30, 1073, 357, 253, 1345};

static dsp_model *g_m;
static dsp_fwd *g_f;
static int g_V;
static bool g_default_model; /* the trained default model: it knows facts */

/* The logits (n, V) of every position of prompt[0..n) run on f, fed in chunks of `chunk` tokens;
 * each batch also carries the next tokens of other[0..n_other) as a second sequence (placed first,
 * so the prompt's rows shift). Every argument is explicit: a case is one call. */
static float *logits_of(dsp_fwd *f, const int32_t *prompt, int n, int chunk, const int32_t *other, int n_other) {
    const int V = dsp_fwd_n_vocab(f);
    float *all = malloc(sizeof(float) * (size_t)V * (size_t)n);
    float *lg = malloc(sizeof(float) * (size_t)V * (size_t)chunk);
    int32_t *tok = malloc(sizeof(int32_t) * 2 * (size_t)chunk), *seq = malloc(sizeof(int32_t) * 2 * (size_t)chunk);
    int32_t *pos = malloc(sizeof(int32_t) * 2 * (size_t)chunk), *rows = malloc(sizeof(int32_t) * (size_t)chunk);
    dsp_kv_seq a, o;
    dsp_fwd_seq_init(f, &a);
    dsp_fwd_seq_init(f, &o);
    dsp_kv_seq *seqs[2] = {&a, &o};
    int done = 0, other_done = 0;
    while (done < n) {
        int m = 0, nl = 0;
        int ko = chunk < n_other - other_done ? chunk : n_other - other_done;
        for (int i = 0; i < ko; i++, m++) tok[m] = other[other_done + i], seq[m] = 1, pos[m] = other_done + i;
        other_done += ko;
        int k = chunk < n - done ? chunk : n - done;
        for (int i = 0; i < k; i++, m++) {
            tok[m] = prompt[done + i], seq[m] = 0, pos[m] = done + i;
            rows[nl++] = m;
        }
        dsp_batch b = {m, tok, seq, pos, nl, rows, 0, NULL};
        dsp_status st = dsp_fwd_run(f, seqs, 2, &b, lg, NULL);
        CHECK_MSG(st == DSP_OK, "%s", dsp_last_error());
        if (st) memset(lg, 0, sizeof(float) * (size_t)V * (size_t)k);
        memcpy(all + (size_t)done * V, lg, sizeof(float) * (size_t)V * (size_t)k);
        done += k;
    }
    dsp_kv_seq_free(dsp_fwd_kv(f), &a);
    dsp_kv_seq_free(dsp_fwd_kv(f), &o);
    free(lg), free(tok), free(seq), free(pos), free(rows);
    return all;
}

/* g_prompt on g_f, optionally next to g_other */
static float *run_chunked(int chunk, bool interleave) { return logits_of(g_f, g_prompt, N_PROMPT, chunk, g_other, interleave ? 7 : 0); }

static void test_batch_invariance(void) {
    float *ref = run_chunked(1, false);
    /* one prefill chunk; 1+k blocks of a few sizes; and next to another sequence */
    static const struct { int chunk, interleave; } modes[] = {{N_PROMPT, 0}, {3, 1}, {5, 0}, {2, 1}, {N_PROMPT, 1}};
    for (size_t c = 0; c < sizeof modes / sizeof modes[0]; c++) {
        float *got = run_chunked(modes[c].chunk, modes[c].interleave);
        CHECK_MSG(memcmp(ref, got, sizeof(float) * (size_t)g_V * N_PROMPT) == 0, "chunk %d interleave %d differs", modes[c].chunk,
                  modes[c].interleave);
        free(got);
    }
    /* the model knows the answer: argmax after "The capital of France is" is " Paris" (7042) */
    const float *l4 = ref + (size_t)4 * g_V;
    int best = 0;
    for (int v = 1; v < g_V; v++)
        if (l4[v] > l4[best]) best = v;
    if (g_default_model) CHECK_EQ_INT(best, 7042);
    free(ref);
}

/* A 40-token prompt crosses the 16-token KV blocks twice; chunks of 7 and 13 straddle the
 * boundaries (a row's keys span two blocks), 16 ends exactly on them, and the second sequence
 * crosses them too. All bit-identical to one token at a time. */
#define N_LONG 40
static void long_prompt(int32_t *p) {
    for (int i = 0; i < N_LONG; i++) p[i] = i < N_PROMPT ? g_prompt[i] : (g_other[i % 7] + i) % g_V;
}

static void test_block_boundaries(void) {
    int32_t p[N_LONG], other[N_LONG];
    long_prompt(p);
    for (int i = 0; i < N_LONG; i++) other[i] = p[N_LONG - 1 - i];
    const size_t bytes = sizeof(float) * (size_t)g_V * N_LONG;
    float *ref = logits_of(g_f, p, N_LONG, 1, NULL, 0);
    static const struct { int chunk, other; } modes[] = {{N_LONG, 0}, {7, 0}, {13, 1}, {16, 0}, {17, 1}};
    for (size_t c = 0; c < sizeof modes / sizeof modes[0]; c++) {
        float *got = logits_of(g_f, p, N_LONG, modes[c].chunk, other, modes[c].other ? N_LONG : 0);
        CHECK_MSG(memcmp(ref, got, bytes) == 0, "40-token prompt, chunk %d, other sequence %d: logits differ", modes[c].chunk,
                  modes[c].other);
        free(got);
    }
    free(ref);
}

/* The CPU backend splits work over threads by output element, never inside a sum: forwards with 1
 * and 3 threads give the 2-thread logits bit for bit (11- and 40-token prompts, one chunk and
 * chunks of 13). CPU forwards of their own, whatever backend g_f runs on. */
static dsp_fwd *cpu_fwd(int threads) {
    dsp_fwd_params fp = dsp_fwd_default_params();
    fp.n_ctx = 256;
    fp.max_batch_tokens = 64;
    fp.n_threads = threads;
    dsp_fwd *f = NULL;
    CHECK_MSG(dsp_fwd_create(g_m, &fp, &f) == DSP_OK, "%d threads: %s", threads, dsp_last_error());
    return f;
}

static void test_thread_counts(void) {
    int32_t p[N_LONG];
    long_prompt(p);
    dsp_fwd *f2 = cpu_fwd(2);
    if (!f2) return;
    float *ref = logits_of(f2, p, N_LONG, N_LONG, NULL, 0), *ref11 = logits_of(f2, g_prompt, N_PROMPT, N_PROMPT, NULL, 0);
    dsp_fwd_destroy(f2);
    static const int threads[] = {1, 3};
    for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
        dsp_fwd *f = cpu_fwd(threads[t]);
        if (!f) continue;
        float *a = logits_of(f, p, N_LONG, N_LONG, NULL, 0), *b = logits_of(f, p, N_LONG, 13, NULL, 0);
        float *c = logits_of(f, g_prompt, N_PROMPT, N_PROMPT, NULL, 0);
        CHECK_MSG(memcmp(ref, a, sizeof(float) * (size_t)g_V * N_LONG) == 0, "%d threads: 40-token prompt differs", threads[t]);
        CHECK_MSG(memcmp(ref, b, sizeof(float) * (size_t)g_V * N_LONG) == 0, "%d threads, chunks of 13: differs", threads[t]);
        CHECK_MSG(memcmp(ref11, c, sizeof(float) * (size_t)g_V * N_PROMPT) == 0, "%d threads: 11-token prompt differs", threads[t]);
        free(a), free(b), free(c);
        dsp_fwd_destroy(f);
    }
    free(ref), free(ref11);
}

/* Decode attention serves a query group's heads together once a head's keys are many
 * (cpu_backend.c ATT_REREAD_BYTES): lone decode rows in three passes split over keys and elements
 * (att_split), others a task per group; one task per head below. DSP_CPU_ATT_REREAD_BYTES=0 takes
 * those paths at every length: one token at a time (decode rows: att_split on a model of under 4 KV
 * heads, on 2 threads), and next to another sequence, the logits are bit for bit the default's. */
static void test_att_group(void) {
    int32_t p[N_LONG];
    long_prompt(p);
    dsp_fwd *f2 = cpu_fwd(2);
    if (!f2) return;
    float *ref = logits_of(f2, p, N_LONG, 1, NULL, 0);
    dsp_fwd_destroy(f2);
    setenv("DSP_CPU_ATT_REREAD_BYTES", "0", 1);
    dsp_fwd *f = cpu_fwd(2);
    unsetenv("DSP_CPU_ATT_REREAD_BYTES");
    if (f) {
        float *a = logits_of(f, p, N_LONG, 1, NULL, 0), *b = logits_of(f, p, N_LONG, 1, g_other, 7);
        CHECK_MSG(memcmp(ref, a, sizeof(float) * (size_t)g_V * N_LONG) == 0, "decode rows, att_split: logits differ");
        CHECK_MSG(memcmp(ref, b, sizeof(float) * (size_t)g_V * N_LONG) == 0, "decode rows next to another sequence, the group path: logits differ");
        free(a), free(b);
        dsp_fwd_destroy(f);
    }
    free(ref);
}

static void test_rollback(void) {
    /* write 11 tokens, truncate to 5, rewrite the rest: logits equal the straight run */
    float *ref = run_chunked(N_PROMPT, false);
    dsp_kv_seq a;
    dsp_fwd_seq_init(g_f, &a);
    dsp_kv_seq *seqs[1] = {&a};
    float *lg = malloc(sizeof(float) * (size_t)g_V * N_PROMPT);
    int32_t seq[N_PROMPT] = {0}, pos[N_PROMPT], rows[N_PROMPT], junk[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) pos[i] = i, rows[i] = i, junk[i] = (g_prompt[i] * 7 + 3) % g_V;
    memcpy(junk, g_prompt, 5 * sizeof(int32_t));
    dsp_batch b = {N_PROMPT, junk, seq, pos, 0, rows, 0, NULL};
    CHECK(dsp_fwd_run(g_f, seqs, 1, &b, lg, NULL) == DSP_OK);
    dsp_kv_seq_truncate(dsp_fwd_kv(g_f), &a, 5);
    CHECK_EQ_INT(a.n_tokens, 5);
    dsp_batch b2 = {N_PROMPT - 5, g_prompt + 5, seq, pos + 5, N_PROMPT - 5, rows, 0, NULL};
    CHECK(dsp_fwd_run(g_f, seqs, 1, &b2, lg, NULL) == DSP_OK);
    CHECK(memcmp(lg, ref + (size_t)5 * g_V, sizeof(float) * (size_t)g_V * (N_PROMPT - 5)) == 0);
    dsp_kv_seq_free(dsp_fwd_kv(g_f), &a);
    free(lg);
    free(ref);
}

/* hidden-state taps (for block drafters) obey the same invariance: one chunk vs one at a time */
static void taps_run(int chunk, float *taps_out) {
    int E = dsp_fwd_n_embd(g_f);
    int32_t layers[2] = {1, g_m->hp.n_layer - 1}; /* two different layers of any model */
    dsp_kv_seq a;
    dsp_fwd_seq_init(g_f, &a);
    dsp_kv_seq *seqs[1] = {&a};
    float *lg = malloc(sizeof(float) * (size_t)g_V);
    for (int done = 0; done < N_PROMPT; done += chunk) {
        int k = chunk < N_PROMPT - done ? chunk : N_PROMPT - done;
        int32_t seq[N_PROMPT] = {0}, pos[N_PROMPT], row = k - 1;
        for (int i = 0; i < k; i++) pos[i] = done + i;
        dsp_batch b = {k, g_prompt + done, seq, pos, 1, &row, 2, layers};
        CHECK(dsp_fwd_run(g_f, seqs, 1, &b, lg, taps_out + (size_t)done * 2 * E) == DSP_OK);
    }
    dsp_kv_seq_free(dsp_fwd_kv(g_f), &a);
    free(lg);
}

static void test_taps(void) {
    size_t n = (size_t)N_PROMPT * 2 * dsp_fwd_n_embd(g_f);
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    taps_run(N_PROMPT, x);
    taps_run(1, y);
    CHECK(memcmp(x, y, n * sizeof(float)) == 0);
    CHECK(memcmp(x, x + dsp_fwd_n_embd(g_f), (size_t)dsp_fwd_n_embd(g_f) * sizeof(float)) != 0); /* layers differ */
    free(x);
    free(y);
}

/* On another backend (GPU): the same logits as the CPU backend within its precision, and the same
 * greedy token wherever the CPU's top-1/top-2 margin leaves room. The CUDA backend stores K/V in
 * f16: on the CPU path, rounding K/V to f16 alone moves SmolLM2-135M's logits by up to 1.7e-2
 * (measured against the transformers fixtures, tests/py/test_golden.py), i.e. NMSE ~1e-6 for logits
 * of magnitude ~10. Tolerances: NMSE 1e-5; argmax equal where the margin exceeds 0.1 (6x that). */
static void test_vs_cpu(void) {
    if (dsp_fwd_backend(g_f)->kind == DSP_BACKEND_CPU) return;
    float *gpu = run_chunked(N_PROMPT, false);
    dsp_fwd *gf = g_f;
    dsp_fwd_params fp = dsp_fwd_default_params();
    fp.n_ctx = 256, fp.max_batch_tokens = 64, fp.n_threads = 2, fp.max_taps = 2;
    fp.f32_activations = true; /* the GPU's activations are f32: compare with the CPU's exact path */
    CHECK(dsp_fwd_create(g_m, &fp, &g_f) == DSP_OK);
    float *cpu = run_chunked(N_PROMPT, false);
    dsp_fwd_destroy(g_f);
    g_f = gf;
    double num = 0, den = 0;
    int compared = 0, differ = 0;
    for (int p = 0; p < N_PROMPT; p++) {
        const float *c = cpu + (size_t)p * g_V, *g = gpu + (size_t)p * g_V;
        int b1 = 0, b2 = -1, bg = 0;
        for (int v = 0; v < g_V; v++) {
            num += ((double)g[v] - c[v]) * ((double)g[v] - c[v]), den += (double)c[v] * c[v];
            if (g[v] > g[bg]) bg = v;
            if (c[v] > c[b1]) b2 = b1, b1 = v;
            else if (v != b1 && (b2 < 0 || c[v] > c[b2])) b2 = v;
        }
        if (c[b1] - c[b2] > 0.1f) compared++, differ += bg != b1;
    }
    int bad_c = 0, bad_g = 0;
    for (size_t i = 0; i < (size_t)N_PROMPT * g_V; i++) bad_c += !isfinite(cpu[i]), bad_g += !isfinite(gpu[i]);
    fprintf(stderr, "  vs CPU: logits nmse %.3g, argmax differs at %d of %d clear positions; non-finite logits: cpu %d, gpu %d\n",
            num / den, differ, compared, bad_c, bad_g);
    CHECK_EQ_INT(bad_g, 0);
    CHECK(num / den < 1e-5);
    CHECK_EQ_INT(differ, 0);
    free(gpu), free(cpu);
}

static void test_bad_input(void) {
    dsp_kv_seq a;
    dsp_fwd_seq_init(g_f, &a);
    dsp_kv_seq *seqs[1] = {&a};
    float *lg = malloc(sizeof(float) * (size_t)g_V);
    int32_t tok = 1, seq = 0, pos = 0, row = 0;
    dsp_batch b = {1, &tok, &seq, &pos, 1, &row, 0, NULL};
    tok = g_V;
    CHECK_EQ_INT(dsp_fwd_run(g_f, seqs, 1, &b, lg, NULL), DSP_ERR_INVALID_ARG);
    CHECK(strstr(dsp_last_error(), "token id") != NULL);
    tok = 1, pos = 3; /* gap in positions */
    CHECK_EQ_INT(dsp_fwd_run(g_f, seqs, 1, &b, lg, NULL), DSP_ERR_INVALID_ARG);
    pos = 0, seq = 1;
    CHECK_EQ_INT(dsp_fwd_run(g_f, seqs, 1, &b, lg, NULL), DSP_ERR_INVALID_ARG);
    seq = 0;
    CHECK_EQ_INT(a.n_tokens, 0); /* nothing changed */
    /* context limit */
    a.n_tokens = dsp_fwd_n_ctx(g_f); /* pretend full (no blocks needed for the check) */
    pos = (int32_t)a.n_tokens;
    CHECK_EQ_INT(dsp_fwd_run(g_f, seqs, 1, &b, lg, NULL), DSP_ERR_RANGE);
    CHECK(strstr(dsp_last_error(), "context length exceeded") != NULL);
    a.n_tokens = 0;
    dsp_kv_seq_free(dsp_fwd_kv(g_f), &a);
    free(lg);
}

int main(void) {
    dsp_backend *be = NULL;
    if (dsp_test_wants_cuda()) {
        const char *kvt = getenv("DSP_TEST_KV_TYPE"); /* "bf16": the CUDA backend's other K/V type */
        dsp_backend_params bp = {.kind = DSP_BACKEND_CUDA, .kv_type = kvt && !strcmp(kvt, "bf16") ? DSP_BF16 : 0};
        if (dsp_backend_cuda_create(&bp, &be)) {
            printf("SKIP: %s\n", dsp_last_error()); /* no GPU: a skip even under DSP_TEST_REQUIRE */
            return DSP_TEST_SKIP_CODE;
        }
    }
    if (!(g_m = dsp_test_load_model(&g_default_model))) {
        dsp_backend_destroy(be);
        return getenv("DSP_TEST_MODEL") ? 1 : dsp_test_summary();
    }
    dsp_fwd_params fp = dsp_fwd_default_params();
    fp.backend = be;
    fp.n_ctx = 256;
    fp.max_batch_tokens = 64;
    fp.n_threads = 2;
    fp.max_taps = 2;
    CHECK(dsp_fwd_create(g_m, &fp, &g_f) == DSP_OK);
    g_V = dsp_fwd_n_vocab(g_f);
    for (int i = 0; i < N_PROMPT; i++) g_prompt[i] %= g_V; /* another model may have a smaller vocabulary */
    for (int i = 0; i < 7; i++) g_other[i] %= g_V;
    DSP_RUN(test_batch_invariance);
    DSP_RUN(test_block_boundaries);
    DSP_RUN(test_thread_counts);
    DSP_RUN(test_att_group);
    DSP_RUN(test_rollback);
    DSP_RUN(test_taps);
    DSP_RUN(test_vs_cpu);
    DSP_RUN(test_bad_input);
    dsp_fwd_destroy(g_f);
    dsp_backend_destroy(be);
    dsp_model_destroy(g_m);
    return dsp_test_summary();
}
