/* engine: dsp_generate end to end on the default model: greedy output, prefix reuse across
 * turns (earlier turns are not recomputed and the output is unchanged), seeded reproducibility,
 * stop strings, and bad input (prompt longer than the context, bad parameters). */
/* ctest-label: e2e */
#include "dsp_test.h"

#include "dspark.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dsp_model *g_m;
static dsp_ctx *g_c;

typedef struct collected {
    int32_t ids[512];
    int n;
    char text[8192];
    size_t n_text;
    int stop_after; /* cancel after this many tokens (0 = never) */
} collected;

static bool collect(const dsp_token_event *ev, void *user) {
    collected *c = user;
    if (c->n < 512) c->ids[c->n++] = ev->token;
    if (c->n_text + ev->text_len < sizeof c->text) {
        memcpy(c->text + c->n_text, ev->text, ev->text_len);
        c->n_text += ev->text_len;
        c->text[c->n_text] = '\0';
    }
    return !(c->stop_after && c->n >= c->stop_after);
}

static int tokenize(const char *s, int32_t *ids, size_t cap) {
    size_t n = 0;
    CHECK(dsp_tokenize(dsp_model_tokenizer(g_m), s, strlen(s), DSP_TOKENIZE_PARSE_SPECIAL, ids, cap, &n) == DSP_OK);
    return (int)n;
}

static void test_greedy_and_prefix_reuse(void) {
    dsp_seq *s;
    CHECK(dsp_seq_create(g_c, &s) == DSP_OK);
    int32_t p1[256], p2[512];
    int n1 = tokenize("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n", p1, 256);
    dsp_gen_params gp = dsp_gen_default_params();
    gp.max_tokens = 24;
    collected a = {0};
    dsp_gen_result r;
    CHECK(dsp_generate(g_c, s, p1, (size_t)n1, &gp, collect, &a, &r) == DSP_OK);
    CHECK(strstr(a.text, "Paris") != NULL);
    CHECK_EQ_INT(r.n_cached, 0);
    CHECK_EQ_INT(r.n_generated, a.n);
    /* second turn: previous prompt + reply + a new user turn; everything before is cached */
    memcpy(p2, p1, sizeof(int32_t) * (size_t)n1);
    memcpy(p2 + n1, a.ids, sizeof(int32_t) * (size_t)a.n);
    int n2 = n1 + a.n;
    n2 += tokenize("\n<|im_start|>user\nAnd of Italy?<|im_end|>\n<|im_start|>assistant\n", p2 + n2, (size_t)(512 - n2));
    collected b = {0};
    CHECK(dsp_generate(g_c, s, p2, (size_t)n2, &gp, collect, &b, &r) == DSP_OK);
    /* the last reply token (EOS) was sampled but never fed, so its KV is not cached */
    CHECK_EQ_INT(r.n_cached, n1 + a.n - 1);
    /* the same turn on a fresh sequence (nothing cached) gives the same tokens */
    dsp_seq *s2;
    CHECK(dsp_seq_create(g_c, &s2) == DSP_OK);
    collected c = {0};
    CHECK(dsp_generate(g_c, s2, p2, (size_t)n2, &gp, collect, &c, &r) == DSP_OK);
    CHECK_EQ_INT(r.n_cached, 0);
    CHECK_EQ_INT(b.n, c.n);
    CHECK(memcmp(b.ids, c.ids, sizeof(int32_t) * (size_t)b.n) == 0);
    CHECK(strstr(b.text, "Rome") != NULL);
    dsp_seq_destroy(s2);
    dsp_seq_destroy(s);
}

static void test_seeded_sampling(void) {
    int32_t p[64];
    int n = tokenize("Once upon a time", p, 64);
    dsp_gen_params gp = dsp_gen_default_params();
    gp.max_tokens = 16;
    gp.temperature = 1.0f;
    gp.top_p = 0.95f;
    gp.seed = 1234;
    gp.ignore_eos = true;
    collected x = {0}, y = {0}, z = {0};
    dsp_seq *s;
    CHECK(dsp_seq_create(g_c, &s) == DSP_OK);
    CHECK(dsp_generate(g_c, s, p, (size_t)n, &gp, collect, &x, NULL) == DSP_OK);
    CHECK(dsp_generate(g_c, s, p, (size_t)n, &gp, collect, &y, NULL) == DSP_OK);
    gp.seed = 99;
    CHECK(dsp_generate(g_c, s, p, (size_t)n, &gp, collect, &z, NULL) == DSP_OK);
    CHECK_EQ_INT(x.n, 16);
    CHECK(x.n == y.n && memcmp(x.ids, y.ids, sizeof(int32_t) * (size_t)x.n) == 0);
    CHECK(memcmp(x.ids, z.ids, sizeof(int32_t) * 16) != 0); /* another seed, another sample */
    dsp_seq_destroy(s);
}

static void test_stop_and_cancel(void) {
    int32_t p[64];
    int n = tokenize("The capital of France is", p, 64);
    dsp_gen_params gp = dsp_gen_default_params();
    gp.max_tokens = 30;
    gp.stop[0] = "ari"; /* inside " Paris" */
    collected a = {0};
    dsp_gen_result r;
    dsp_seq *s;
    CHECK(dsp_seq_create(g_c, &s) == DSP_OK);
    CHECK(dsp_generate(g_c, s, p, (size_t)n, &gp, collect, &a, &r) == DSP_OK);
    CHECK_EQ_INT(r.finish, DSP_FINISH_STOP);
    CHECK_EQ_STR(a.text, " P");
    gp.stop[0] = NULL;
    collected b = {0};
    b.stop_after = 3;
    CHECK(dsp_generate(g_c, s, p, (size_t)n, &gp, collect, &b, &r) == DSP_OK);
    CHECK_EQ_INT(r.finish, DSP_FINISH_CANCELLED);
    CHECK_EQ_INT(b.n, 3);
    dsp_seq_destroy(s);
}

static void test_bad_input(void) {
    dsp_seq *s;
    CHECK(dsp_seq_create(g_c, &s) == DSP_OK);
    uint32_t n_ctx = dsp_ctx_n_ctx(g_c);
    int32_t *big = calloc(n_ctx + 10, sizeof *big);
    for (uint32_t i = 0; i < n_ctx + 10; i++) big[i] = 100 + (int32_t)(i % 50);
    dsp_gen_params gp = dsp_gen_default_params();
    CHECK_EQ_INT(dsp_generate(g_c, s, big, n_ctx + 10, &gp, NULL, NULL, NULL), DSP_ERR_RANGE);
    CHECK(strstr(dsp_last_error(), "does not fit the context") != NULL);
    big[0] = -5;
    CHECK_EQ_INT(dsp_generate(g_c, s, big, 4, &gp, NULL, NULL, NULL), DSP_ERR_INVALID_ARG);
    big[0] = 100;
    gp.top_p = 1.5f;
    CHECK_EQ_INT(dsp_generate(g_c, s, big, 4, &gp, NULL, NULL, NULL), DSP_ERR_INVALID_ARG);
    CHECK(strstr(dsp_last_error(), "top_p") != NULL);
    gp = dsp_gen_default_params();
    gp.max_tokens = 0;
    CHECK_EQ_INT(dsp_generate(g_c, s, big, 4, &gp, NULL, NULL, NULL), DSP_ERR_INVALID_ARG);
    /* after all that the sequence still works */
    gp = dsp_gen_default_params();
    gp.max_tokens = 2;
    collected a = {0};
    CHECK(dsp_generate(g_c, s, big, 4, &gp, collect, &a, NULL) == DSP_OK);
    CHECK_EQ_INT(a.n, 2);
    free(big);
    dsp_seq_destroy(s);
}

int main(void) {
    if (!(g_m = dsp_test_load_default_model())) return 0;
    dsp_ctx_params cp = dsp_ctx_default_params();
    cp.n_ctx = 512;
    cp.kv_tokens = 2048;
    cp.n_threads = 2;
    CHECK(dsp_ctx_create(g_m, &cp, &g_c) == DSP_OK);
    DSP_RUN(test_greedy_and_prefix_reuse);
    DSP_RUN(test_seeded_sampling);
    DSP_RUN(test_stop_and_cancel);
    DSP_RUN(test_bad_input);
    dsp_ctx_destroy(g_c);
    dsp_model_destroy(g_m);
    return dsp_test_summary();
}
