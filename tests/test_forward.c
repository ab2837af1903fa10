/* Forward pass over a ragged batch: batch invariance (DESIGN.md §2) and input validation.
 * The logits of every position must be bit-identical whether computed one token at a time, in one
 * prefill chunk, in chunks of other sizes (1+k verify blocks), or interleaved with another sequence
 * in the same batch. Uses the default model; skips if it has not been fetched. */
/* ctest-label: e2e */
#include "dsp_test.h"

#include "model/forward.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_PROMPT 11
static const int32_t g_prompt[N_PROMPT] = {504, 3575, 282, 4649, 314, 7042, 30, 198, 504, 2988, 314};
static const int32_t g_other[7] = {19556, 905, 30, 1073, 357, 253, 1345};

static dsp_model *g_m;
static dsp_fwd *g_f;
static int g_V;

/* logits for every position of g_prompt, feeding it in chunks of `chunk` tokens; if `interleave`,
 * each batch also carries tokens of a second sequence */
static float *run_chunked(int chunk, bool interleave) {
    float *all = malloc(sizeof(float) * (size_t)g_V * N_PROMPT);
    float *lg = malloc(sizeof(float) * (size_t)g_V * 2 * N_PROMPT);
    dsp_kv_seq a, o;
    dsp_fwd_seq_init(g_f, &a);
    dsp_fwd_seq_init(g_f, &o);
    dsp_kv_seq *seqs[2] = {&a, &o};
    int done = 0, other_done = 0;
    while (done < N_PROMPT) {
        int32_t tok[64], seq[64], pos[64], rows[64];
        int n = 0, nl = 0;
        if (interleave && other_done < 7) { /* other sequence's tokens first, so rows shift */
            int k = chunk < 7 - other_done ? chunk : 7 - other_done;
            for (int i = 0; i < k; i++, n++) tok[n] = g_other[other_done + i], seq[n] = 1, pos[n] = other_done + i;
            other_done += k;
        }
        int k = chunk < N_PROMPT - done ? chunk : N_PROMPT - done;
        for (int i = 0; i < k; i++, n++) {
            tok[n] = g_prompt[done + i], seq[n] = 0, pos[n] = done + i;
            rows[nl++] = n;
        }
        dsp_batch b = {n, tok, seq, pos, nl, rows, 0, NULL};
        dsp_status st = dsp_fwd_run(g_f, seqs, 2, &b, lg, NULL);
        CHECK_MSG(st == DSP_OK, "%s", dsp_last_error());
        memcpy(all + (size_t)done * g_V, lg, sizeof(float) * (size_t)g_V * k);
        done += k;
    }
    dsp_kv_seq_free(dsp_fwd_kv(g_f), &a);
    dsp_kv_seq_free(dsp_fwd_kv(g_f), &o);
    free(lg);
    return all;
}

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
    CHECK_EQ_INT(best, 7042);
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
    int32_t layers[2] = {1, 5};
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
    if (!(g_m = dsp_test_load_default_model())) return 0;
    dsp_fwd_params fp = dsp_fwd_default_params();
    fp.n_ctx = 256;
    fp.max_batch_tokens = 64;
    fp.n_threads = 2;
    fp.max_taps = 2;
    CHECK(dsp_fwd_create(g_m, &fp, &g_f) == DSP_OK);
    g_V = dsp_fwd_n_vocab(g_f);
    DSP_RUN(test_batch_invariance);
    DSP_RUN(test_rollback);
    DSP_RUN(test_taps);
    DSP_RUN(test_bad_input);
    dsp_fwd_destroy(g_f);
    dsp_model_destroy(g_m);
    return dsp_test_summary();
}
