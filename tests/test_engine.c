/* engine: the non-blocking engine end to end on the default model.
 *  - dsp_generate: greedy output, seeded reproducibility, stop strings, cancellation, bad input;
 *  - the prefix cache: a follow-up turn reuses the KV of the earlier turns (reported as cached)
 *    and gives the same tokens as without the cache;
 *  - continuous batching: requests of every kind (greedy, seeded sampling, penalties, logprobs,
 *    stop strings, lookup on and off), submitted together or arriving while others run, each give
 *    exactly what they give alone (tokens, text, event boundaries, logprobs bits);
 *  - cancellation during prefill and decode, admission under a small KV pool, no block leaks;
 *  - the large-batch path (one prefill chunk of thousands of tokens), for the sanitizers. */
/* ctest-label: e2e */
#include "dsp_test.h"
#include "gguf_build.h"

#include "dspark.h"
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static dsp_model *g_m;
static dsp_engine *g_e;

typedef struct collected {
    int32_t ids[512];
    float lp[512];
    int32_t top0[512];
    size_t text_end[512];
    int n;
    char text[8192];
    size_t n_text;
    int stop_after; /* cancel after this many tokens (0 = never) */
    bool done;
    dsp_status status;
    dsp_gen_result res;
} collected;

static void add_token(collected *c, const dsp_token_event *ev) {
    if (c->n < 512) {
        c->ids[c->n] = ev->token;
        c->lp[c->n] = ev->chosen.logprob;
        c->top0[c->n] = ev->n_top > 0 ? ev->top[0].token : -1;
    }
    if (c->n_text + ev->text_len < sizeof c->text) {
        memcpy(c->text + c->n_text, ev->text, ev->text_len);
        c->n_text += ev->text_len;
        c->text[c->n_text] = '\0';
    }
    if (c->n < 512) c->text_end[c->n] = c->n_text;
    c->n++;
}

static bool collect(const dsp_token_event *ev, void *user) {
    collected *c = user;
    add_token(c, ev);
    return !(c->stop_after && c->n >= c->stop_after);
}

static int tokenize(const char *s, int32_t *ids, size_t cap) {
    size_t n = 0;
    CHECK(dsp_tokenize(dsp_model_tokenizer(g_m), s, strlen(s), DSP_TOKENIZE_PARSE_SPECIAL, ids, cap, &n) == DSP_OK);
    return (int)n;
}

static bool same(const collected *a, const collected *b) {
    return a->n == b->n && a->n_text == b->n_text && !memcmp(a->ids, b->ids, sizeof(int32_t) * (size_t)a->n) &&
           !memcmp(a->lp, b->lp, sizeof(float) * (size_t)a->n) && !memcmp(a->top0, b->top0, sizeof(int32_t) * (size_t)a->n) &&
           !memcmp(a->text_end, b->text_end, sizeof(size_t) * (size_t)a->n) && !memcmp(a->text, b->text, a->n_text) &&
           a->res.finish == b->res.finish;
}

static dsp_kv_type g_kv_type; /* of the engines make_engine creates */

static dsp_engine_params engine_params(int max_batch, int batch_tokens, uint32_t kv_tokens, bool prefix_cache) {
    dsp_engine_params ep = dsp_engine_default_params();
    ep.kv_type = g_kv_type;
    ep.n_ctx = 512;
    ep.kv_tokens = kv_tokens;
    ep.n_threads = 2;
    ep.max_batch = max_batch;
    ep.batch_tokens = batch_tokens;
    ep.no_prefix_cache = !prefix_cache;
    return ep;
}

static dsp_engine *make_engine(int max_batch, int batch_tokens, uint32_t kv_tokens, bool prefix_cache) {
    dsp_engine_params ep = engine_params(max_batch, batch_tokens, kv_tokens, prefix_cache);
    dsp_engine *e = NULL;
    CHECK(dsp_engine_create(g_m, &ep, &e) == DSP_OK);
    return e;
}

#define CHAT(u) "<|im_start|>user\n" u "<|im_end|>\n<|im_start|>assistant\n"

static void test_greedy_and_prefix_reuse(void) {
    int32_t p1[256], p2[512];
    int n1 = tokenize(CHAT("What is the capital of France?"), p1, 256);
    dsp_gen_params gp = dsp_gen_default_params();
    gp.max_tokens = 24;
    collected a = {0};
    dsp_gen_result r;
    CHECK(dsp_generate(g_e, p1, (size_t)n1, &gp, collect, &a, &r) == DSP_OK);
    CHECK(strstr(a.text, "Paris") != NULL);
    CHECK_EQ_INT(r.n_cached, 0);
    CHECK_EQ_INT(r.n_generated, a.n);
    /* second turn: previous prompt + reply + a new user turn; the whole blocks before are cached */
    memcpy(p2, p1, sizeof(int32_t) * (size_t)n1);
    memcpy(p2 + n1, a.ids, sizeof(int32_t) * (size_t)a.n);
    int n2 = n1 + a.n;
    n2 += tokenize("\n" CHAT("And of Italy?"), p2 + n2, (size_t)(512 - n2));
    collected b = {0};
    CHECK(dsp_generate(g_e, p2, (size_t)n2, &gp, collect, &b, &r) == DSP_OK);
    /* the last reply token (EOS) was sampled but never fed, so its KV is not cached; whole blocks only */
    CHECK_EQ_INT(r.n_cached, (n1 + a.n - 1) / 16 * 16);
    CHECK(r.n_cached > 0);
    /* the same turn on an engine without the prefix cache gives the same tokens */
    dsp_engine *nc = make_engine(1, 512, 0, false);
    collected c = {0};
    CHECK(dsp_generate(nc, p2, (size_t)n2, &gp, collect, &c, &r) == DSP_OK);
    CHECK_EQ_INT(r.n_cached, 0);
    c.res = b.res;
    CHECK(same(&b, &c));
    CHECK(strstr(b.text, "Rome") != NULL);
    dsp_engine_destroy(nc);
}

/* A round where every request is plain greedy without logprobs reads only the logits rows' argmax
 * from the backend (dsp_spec_verify_argmax); with logprobs the same request reads whole rows: the
 * tokens must be the same, also with lookup drafts verified from argmax rows. */
static void test_argmax_rounds(void) {
    int32_t p[256];
    int n = tokenize(CHAT("Copy the list: apples, bananas, cherries, dates, elderberries, figs, grapes."), p, 256);
    for (int mode = 0; mode < 2; mode++) {
        collected a = {0}, b = {0};
        dsp_gen_params gp = dsp_gen_default_params();
        gp.max_tokens = 32;
        gp.mode = mode ? DSP_SPEC_LOOKUP : DSP_SPEC_BASELINE;
        CHECK(dsp_generate(g_e, p, (size_t)n, &gp, collect, &a, &a.res) == DSP_OK);
        gp.logprobs = 0;
        CHECK(dsp_generate(g_e, p, (size_t)n, &gp, collect, &b, &b.res) == DSP_OK);
        CHECK(a.n == b.n && !memcmp(a.ids, b.ids, sizeof(int32_t) * (size_t)a.n) && !strcmp(a.text, b.text));
        CHECK(a.n > 8);
    }
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
    CHECK(dsp_generate(g_e, p, (size_t)n, &gp, collect, &x, NULL) == DSP_OK);
    CHECK(dsp_generate(g_e, p, (size_t)n, &gp, collect, &y, NULL) == DSP_OK);
    gp.seed = 99;
    CHECK(dsp_generate(g_e, p, (size_t)n, &gp, collect, &z, NULL) == DSP_OK);
    CHECK_EQ_INT(x.n, 16);
    CHECK(x.n == y.n && memcmp(x.ids, y.ids, sizeof(int32_t) * (size_t)x.n) == 0);
    CHECK(memcmp(x.ids, z.ids, sizeof(int32_t) * 16) != 0); /* another seed, another sample */
}

static void test_stop_and_cancel(void) {
    int32_t p[64];
    int n = tokenize("The capital of France is", p, 64);
    dsp_gen_params gp = dsp_gen_default_params();
    gp.max_tokens = 30;
    gp.stop[0] = "ari"; /* inside " Paris" */
    collected a = {0};
    dsp_gen_result r;
    CHECK(dsp_generate(g_e, p, (size_t)n, &gp, collect, &a, &r) == DSP_OK);
    CHECK_EQ_INT(r.finish, DSP_FINISH_STOP);
    CHECK_EQ_STR(a.text, " P");
    gp.stop[0] = NULL;
    collected b = {0};
    b.stop_after = 3;
    CHECK(dsp_generate(g_e, p, (size_t)n, &gp, collect, &b, &r) == DSP_OK);
    CHECK_EQ_INT(r.finish, DSP_FINISH_CANCELLED);
    CHECK_EQ_INT(b.n, 3);
}

static void test_bad_input(void) {
    uint32_t n_ctx = dsp_engine_n_ctx(g_e);
    int32_t *big = calloc(n_ctx + 10, sizeof *big);
    for (uint32_t i = 0; i < n_ctx + 10; i++) big[i] = 100 + (int32_t)(i % 50);
    dsp_gen_params gp = dsp_gen_default_params();
    CHECK_EQ_INT(dsp_generate(g_e, big, n_ctx + 10, &gp, NULL, NULL, NULL), DSP_ERR_RANGE);
    CHECK(strstr(dsp_last_error(), "does not fit the context") != NULL);
    CHECK_EQ_INT(dsp_generate(g_e, big, 0, &gp, NULL, NULL, NULL), DSP_ERR_INVALID_ARG);
    big[0] = -5;
    CHECK_EQ_INT(dsp_generate(g_e, big, 4, &gp, NULL, NULL, NULL), DSP_ERR_INVALID_ARG);
    big[0] = 100;
    gp.top_p = 1.5f;
    CHECK_EQ_INT(dsp_generate(g_e, big, 4, &gp, NULL, NULL, NULL), DSP_ERR_INVALID_ARG);
    CHECK(strstr(dsp_last_error(), "top_p") != NULL);
    gp = dsp_gen_default_params();
    gp.max_tokens = 0;
    CHECK_EQ_INT(dsp_generate(g_e, big, 4, &gp, NULL, NULL, NULL), DSP_ERR_INVALID_ARG);
    gp = dsp_gen_default_params();
    gp.max_draft = DSP_MAX_DRAFT + 1;
    CHECK_EQ_INT(dsp_generate(g_e, big, 4, &gp, NULL, NULL, NULL), DSP_ERR_INVALID_ARG);
    /* engine parameters */
    dsp_engine_params ep = dsp_engine_default_params();
    dsp_engine *e = NULL;
    ep.max_batch = 64, ep.batch_tokens = 32;
    CHECK_EQ_INT(dsp_engine_create(g_m, &ep, &e), DSP_ERR_INVALID_ARG);
    ep = dsp_engine_default_params();
    ep.kv_tokens = 8;
    CHECK_EQ_INT(dsp_engine_create(g_m, &ep, &e), DSP_ERR_INVALID_ARG);
    CHECK(e == NULL);
    /* the CPU keeps K/V in F16 (default), F32 or BF16, and says which (CTest sets DSPARK_DEVICE=cpu:
     * auto is the CPU here even on a GPU machine); an unknown type is refused */
    const dsp_kv_type kvt[] = {DSP_KV_DEFAULT, DSP_KV_F32, DSP_KV_F16, DSP_KV_BF16};
    const char *kvn[] = {"K/V f16", "K/V f32", "K/V f16", "K/V bf16"};
    for (int i = 0; i < 4; i++) {
        ep = dsp_engine_default_params();
        ep.device = DSP_DEVICE_CPU, ep.kv_type = kvt[i], ep.n_ctx = 256;
        CHECK_EQ_INT(dsp_engine_create(g_m, &ep, &e), DSP_OK);
        CHECK_MSG(e && strstr(dsp_engine_backend(e), kvn[i]), "kv type %d: backend \"%s\"", i, e ? dsp_engine_backend(e) : "");
        dsp_engine_destroy(e);
        e = NULL;
    }
    ep = dsp_engine_default_params();
    ep.kv_type = (dsp_kv_type)7;
    CHECK_EQ_INT(dsp_engine_create(g_m, &ep, &e), DSP_ERR_INVALID_ARG);
    CHECK(e == NULL);
    ep = dsp_engine_default_params();
    ep.draft_quant = (dsp_draft_quant)3;
    CHECK_EQ_INT(dsp_engine_create(g_m, &ep, &e), DSP_ERR_INVALID_ARG);
    CHECK(e == NULL && strstr(dsp_last_error(), "drafter quantization"));
    ep = dsp_engine_default_params();
    const float bad_itl[] = {0.5f, -1.0f, 101.0f, NAN};
    for (int i = 0; i < 4; i++) {
        ep.prefill_itl = bad_itl[i];
        CHECK_EQ_INT(dsp_engine_create(g_m, &ep, &e), DSP_ERR_INVALID_ARG);
        CHECK(e == NULL && strstr(dsp_last_error(), "prefill_itl"));
    }
    /* after all that the engine still works */
    gp = dsp_gen_default_params();
    gp.max_tokens = 2;
    collected a = {0};
    CHECK(dsp_generate(g_e, big, 4, &gp, collect, &a, NULL) == DSP_OK);
    CHECK_EQ_INT(a.n, 2);
    free(big);
}

/* ---- batching --------------------------------------------------------------------------------- */

#define N_MIX 8
static const char *g_mix_prompts[N_MIX] = {
    CHAT("What is the capital of France?"),
    CHAT("Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat."),
    CHAT("Write a haiku about autumn."),
    "Once upon a time",
    CHAT("Copy the list: apples, bananas, cherries, dates, elderberries, figs, grapes."),
    "def fibonacci(n):",
    CHAT("Give me three tips for sleeping better."),
    CHAT("Why is the sky blue? Explain in detail, with the physics of Rayleigh scattering and the role of the atmosphere, sunsets, and why the sky is not violet."),
};

static dsp_gen_params mix_params(int i) {
    dsp_gen_params gp = dsp_gen_default_params();
    gp.max_tokens = 20 + 3 * i;
    switch (i) {
    case 0: break;                                                            /* greedy */
    case 1: gp.mode = DSP_SPEC_LOOKUP, gp.max_draft = 8; break;               /* lookup */
    case 2: gp.temperature = 0.9f, gp.top_p = 0.9f, gp.seed = 7; break;       /* seeded sampling */
    case 3: gp.presence_penalty = 0.5f, gp.frequency_penalty = 0.7f, gp.logprobs = 3; break;
    case 4: gp.mode = DSP_SPEC_LOOKUP, gp.temperature = 0.7f, gp.seed = 3, gp.top_k = 40; break;
    case 5: gp.stop[0] = "return", gp.logprobs = 2; break;                    /* a stop string */
    case 6: gp.repetition_penalty = 1.3f, gp.mode = DSP_SPEC_AUTO; break;
    default: gp.max_tokens = 40, gp.logprobs = 0; break;
    }
    return gp;
}

static void run_solo(int i, collected *out) {
    dsp_engine *e = make_engine(1, 512, 0, false);
    int32_t p[256];
    int n = tokenize(g_mix_prompts[i], p, 256);
    dsp_gen_params gp = mix_params(i);
    memset(out, 0, sizeof *out);
    CHECK(dsp_generate(e, p, (size_t)n, &gp, collect, out, &out->res) == DSP_OK);
    dsp_engine_destroy(e);
}

/* Step e until n_req requests are done, collecting events by their user pointer. */
static void drive(dsp_engine *e, int n_req) {
    int done = 0;
    for (int guard = 0; done < n_req && guard < 100000; guard++) {
        const dsp_event *ev;
        size_t n_ev;
        CHECK(dsp_engine_step(e, &ev, &n_ev) == DSP_OK);
        for (size_t k = 0; k < n_ev; k++) {
            collected *c = ev[k].user;
            if (ev[k].type == DSP_EVENT_TOKEN) {
                add_token(c, &ev[k].tok);
            } else {
                c->done = true;
                c->status = ev[k].status;
                c->res = *ev[k].res;
                done++;
            }
        }
    }
}

static void test_batch_invariance(void) {
    collected solo[N_MIX], batch[N_MIX];
    for (int i = 0; i < N_MIX; i++) run_solo(i, &solo[i]);
    /* all at once, 4 at a time (the rest wait and take free slots), with the prefix cache and small
     * prefill chunks so that prefill chunks, decodes and verify blocks share rounds */
    dsp_engine *e = make_engine(4, 48, 0, true);
    memset(batch, 0, sizeof batch);
    for (int i = 0; i < N_MIX; i++) {
        int32_t p[256];
        int n = tokenize(g_mix_prompts[i], p, 256);
        dsp_gen_params gp = mix_params(i);
        CHECK(dsp_engine_submit(e, p, (size_t)n, &gp, &batch[i], NULL) == DSP_OK);
    }
    drive(e, N_MIX);
    for (int i = 0; i < N_MIX; i++) {
        CHECK_MSG(batch[i].done && batch[i].status == DSP_OK, "request %d did not finish", i);
        CHECK_MSG(same(&solo[i], &batch[i]), "request %d differs in a batch: %d tokens \"%s\" vs alone %d \"%s\"", i, batch[i].n, batch[i].text,
                  solo[i].n, solo[i].text);
    }
    /* staggered arrivals: each request arrives a few rounds after the previous one, and the same
     * prompts again hit the prefix cache */
    memset(batch, 0, sizeof batch);
    int submitted = 0, done = 0;
    for (int step = 0; done < N_MIX && step < 100000; step++) {
        if (submitted < N_MIX && step % 3 == 0) {
            int32_t p[256];
            int n = tokenize(g_mix_prompts[submitted], p, 256);
            dsp_gen_params gp = mix_params(submitted);
            CHECK(dsp_engine_submit(e, p, (size_t)n, &gp, &batch[submitted], NULL) == DSP_OK);
            submitted++;
        }
        const dsp_event *ev;
        size_t n_ev;
        CHECK(dsp_engine_step(e, &ev, &n_ev) == DSP_OK);
        for (size_t k = 0; k < n_ev; k++) {
            collected *c = ev[k].user;
            if (ev[k].type == DSP_EVENT_TOKEN) add_token(c, &ev[k].tok);
            else c->done = true, c->status = ev[k].status, c->res = *ev[k].res, done++;
        }
    }
    int cached = 0;
    for (int i = 0; i < N_MIX; i++) {
        CHECK_MSG(same(&solo[i], &batch[i]), "request %d differs when arriving late: \"%s\" vs \"%s\"", i, batch[i].text, solo[i].text);
        cached += batch[i].res.n_cached > 0;
    }
    CHECK(cached >= N_MIX / 2); /* repeated prompts reuse their cached blocks */
    dsp_engine_stats st;
    dsp_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.kv_blocks_used, 0);
    CHECK(dsp_engine_idle(e));
    dsp_engine_destroy(e);
}

/* the same with K/V in F32 (the default is F16): the rounding when written changes the values, never
 * their independence from the batch */
static void test_batch_invariance_f32(void) {
    g_kv_type = DSP_KV_F32;
    test_batch_invariance();
    g_kv_type = DSP_KV_DEFAULT;
}

static void test_cancel_prefill_and_decode(void) {
    dsp_engine *e = make_engine(2, 16, 0, true); /* 16-token chunks: a long prompt takes many rounds */
    int32_t p[512];
    char prompt[4096] = "";
    for (int i = 0; i < 40; i++) strcat(prompt, "The quick brown fox jumps over the lazy dog. ");
    int n = tokenize(prompt, p, 512);
    CHECK(n > 200);
    dsp_gen_params gp = dsp_gen_default_params();
    gp.max_tokens = 50;
    collected a = {0}, b = {0};
    dsp_req_id ia, ib;
    CHECK(dsp_engine_submit(e, p, (size_t)n, &gp, &a, &ia) == DSP_OK);
    CHECK(dsp_engine_submit(e, p, 20, &gp, &b, &ib) == DSP_OK);
    const dsp_event *ev;
    size_t n_ev;
    for (int i = 0; i < 3; i++) CHECK(dsp_engine_step(e, &ev, &n_ev) == DSP_OK); /* a is mid-prefill */
    dsp_engine_cancel(e, ia);
    CHECK(dsp_engine_step(e, &ev, &n_ev) == DSP_OK);
    bool a_done = false;
    for (size_t k = 0; k < n_ev; k++)
        if (ev[k].id == ia && ev[k].type == DSP_EVENT_DONE) a_done = ev[k].res->finish == DSP_FINISH_CANCELLED && ev[k].res->n_generated == 0;
    CHECK(a_done); /* stopped within one round, before any token */
    /* b keeps going; cancel it mid-decode */
    for (int i = 0; i < 4; i++) CHECK(dsp_engine_step(e, &ev, &n_ev) == DSP_OK);
    dsp_engine_cancel(e, ib);
    dsp_engine_cancel(e, 12345); /* unknown ids are ignored */
    CHECK(dsp_engine_step(e, &ev, &n_ev) == DSP_OK);
    CHECK(dsp_engine_idle(e));
    dsp_engine_stats st;
    dsp_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.kv_blocks_used, 0); /* every block released (full ones stay cached) */
    dsp_engine_destroy(e);
}

static void test_kv_pressure(void) {
    /* 256 tokens of KV: each request may need ~150 (prompt + max_tokens), so only one runs at a time */
    dsp_engine *e = make_engine(4, 64, 256, true);
    int32_t p[256];
    int n = tokenize(CHAT("Tell me a short story about a robot who learns to paint."), p, 256);
    dsp_gen_params gp = dsp_gen_default_params();
    gp.max_tokens = 256 - n - 16 - 1; /* fits alone, not twice */
    collected c[3];
    memset(c, 0, sizeof c);
    for (int i = 0; i < 3; i++) CHECK(dsp_engine_submit(e, p, (size_t)n, &gp, &c[i], NULL) == DSP_OK);
    const dsp_event *ev;
    size_t n_ev;
    CHECK(dsp_engine_step(e, &ev, &n_ev) == DSP_OK);
    for (size_t k = 0; k < n_ev; k++)
        if (ev[k].type == DSP_EVENT_TOKEN) add_token(ev[k].user, &ev[k].tok);
    dsp_engine_stats st;
    dsp_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.running, 1);
    CHECK_EQ_INT(st.waiting, 2);
    drive(e, 3);
    for (int i = 0; i < 3; i++)
        CHECK_MSG(c[i].done && c[i].status == DSP_OK && same(&c[0], &c[i]), "request %d: done %d status %d, %d tokens \"%s\" vs %d \"%s\" (cached %zu)", i,
                  c[i].done, c[i].status, c[i].n, c[i].text, c[0].n, c[0].text, c[i].res.n_cached);
    /* a request larger than the whole pool is refused with the limit named */
    gp.max_tokens = 300;
    CHECK_EQ_INT(dsp_engine_submit(e, p, (size_t)n, &gp, NULL, NULL), DSP_ERR_RANGE);
    CHECK(strstr(dsp_last_error(), "the whole cache holds 256 tokens") != NULL);
    dsp_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.kv_blocks_used, 0);
    dsp_engine_destroy(e);
}

/* Many short requests with cancellations: every block comes back. */
static void test_no_leaks(void) {
    dsp_engine *e = make_engine(4, 64, 1024, true);
    int32_t p[256];
    collected c[8];
    for (int round = 0; round < 6; round++) {
        memset(c, 0, sizeof c);
        dsp_req_id ids[8];
        for (int i = 0; i < 8; i++) {
            int n = tokenize(g_mix_prompts[i], p, 256);
            dsp_gen_params gp = mix_params(i);
            gp.max_tokens = 6;
            CHECK(dsp_engine_submit(e, p, (size_t)n, &gp, &c[i], &ids[i]) == DSP_OK);
        }
        const dsp_event *ev;
        size_t n_ev;
        CHECK(dsp_engine_step(e, &ev, &n_ev) == DSP_OK);
        dsp_engine_cancel(e, ids[round % 8]);     /* running or waiting */
        dsp_engine_cancel(e, ids[(round + 5) % 8]);
        int done = 0;
        for (size_t k = 0; k < n_ev; k++) done += ev[k].type == DSP_EVENT_DONE;
        while (!dsp_engine_idle(e)) CHECK(dsp_engine_step(e, &ev, &n_ev) == DSP_OK);
    }
    dsp_engine_stats st;
    dsp_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.kv_blocks_used, 0);
    CHECK(st.kv_blocks_cached <= st.kv_blocks);
    dsp_engine_clear_cache(e);
    dsp_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.kv_blocks_cached, 0);
    dsp_engine_destroy(e);
}

/* Resident bytes of the anonymous mappings whose size is within [lo, hi] (/proc/self/smaps): the
 * pool's K and V arrays (each its own mapping, dsp_mem_map), found by their size. Counted this way, not as the process's RSS growth: creating an engine also frees and
 * reuses heap memory, and the net change moved by tens of MB with the heap left by earlier tests
 * (a reserved 189 MB pool once "grew" RSS by 167 MB: half of it was a calloc'd chunk of free,
 * resident heap). */
static uint64_t rss_of_maps(uint64_t lo, uint64_t hi, int *n_maps) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return 0;
    char line[512];
    uint64_t total = 0;
    bool in = false;
    if (n_maps) *n_maps = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long a, b, kb;
        char path[256] = "";
        if (sscanf(line, "%llx-%llx %*s %*s %*s %*s %255s", &a, &b, path) >= 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = b - a >= lo && b - a <= hi && path[0] == '\0';
            if (in && n_maps) ++*n_maps;
        } else if (in && sscanf(line, "Rss: %llu kB", &kb) == 1) {
            total += kb * 1024;
        }
    }
    fclose(f);
    return total;
}

/* The resident bytes of an engine's K/V pool: its K and V arrays, each a mapping of exactly half the
 * pool between two inaccessible pages (dsp_mem_map), so never merged with a neighbour. (Found by a
 * size window before, from half the pool to the pool + 16 MiB: under ASan that once missed part of
 * a reserved f16 pool, 74 of 90 MB, the mappings beside it merged differently.) */
static uint64_t kv_resident(uint64_t kv_bytes, int *n_maps) { return rss_of_maps(kv_bytes / 2, kv_bytes / 2, n_maps); }

/* reserve_memory (the server's): the KV pool is resident right after creation, so memory does not
 * grow as the prefix cache fills it. Without it the pool's pages come as blocks are first written
 * (printed, not asserted), so the check below fails if the reservation does nothing. */
static void test_reserve_memory(void) {
    for (int reserve = 0; reserve < 2; reserve++) {
        dsp_engine_params ep = engine_params(2, 512, 4096, true);
        ep.reserve_memory = reserve;
        dsp_engine *e = NULL;
        CHECK_MSG(dsp_engine_create(g_m, &ep, &e) == DSP_OK, "%s", dsp_last_error());
        if (!e) return;
        dsp_engine_stats st;
        dsp_engine_get_stats(e, &st);
        const dsp_hparams *hp = &g_m->hp;
        CHECK_EQ_INT((long long)st.kv_bytes, (long long)st.kv_blocks * st.block_tokens * 2 * hp->n_layer * hp->kv_dim * 2ll); /* f16 */
        CHECK(st.kv_blocks * st.block_tokens >= 4096);
        int n_maps = 0;
        const uint64_t resident = kv_resident(st.kv_bytes, &n_maps);
        CHECK_MSG(n_maps >= 2, "%d mappings of %llu bytes (K and V)", n_maps, (unsigned long long)(st.kv_bytes / 2));
        if (reserve)
            CHECK_MSG(resident >= st.kv_bytes, "reserved: %llu bytes of the %llu-byte pool are resident", (unsigned long long)resident,
                      (unsigned long long)st.kv_bytes);
        else
            printf("     lazy engine: %llu bytes of the %llu-byte pool are resident\n", (unsigned long long)resident, (unsigned long long)st.kv_bytes);
        int32_t p[64];
        int n = tokenize(CHAT("Hi"), p, 64);
        dsp_gen_params gp = dsp_gen_default_params();
        gp.max_tokens = 4;
        collected a = {0};
        dsp_gen_result r;
        CHECK_MSG(dsp_generate(e, p, (size_t)n, &gp, collect, &a, &r) == DSP_OK, "%s", dsp_last_error());
        CHECK_EQ_INT(a.n, 4);
        dsp_engine_destroy(e);
    }
}

/* One prefill chunk of thousands of tokens (issue: a fixed 4096-row scratch once overflowed here).
 * On a width-64 model built in memory (tests/gguf_build.h): the rows matter here, not the width, and
 * under ASan a 4,400-token prefill of the default model took minutes. */
static void test_large_batch(void) {
    const int N = 4400;
    gb_model gm;
    gb_model_init(&gm, "llama");
    gm.hp[GB_CTX] = 4608;
    gm.n_tokens = gm.n_vocab;
    buf file = gb_model_write(&gm, (size_t)64 << 20);
    dsp_model *m = NULL;
    CHECK_MSG(file.n && dsp_model_load_memory(file.p, file.n, "large-batch.gguf", NULL, &m) == DSP_OK, "%s", dsp_last_error());
    dsp_engine_params ep = dsp_engine_default_params();
    ep.n_ctx = 4608;
    ep.batch_tokens = 4608;
    ep.max_batch = 1;
    ep.n_threads = 2;
    dsp_engine *e = NULL;
    if (m) CHECK_MSG(dsp_engine_create(m, &ep, &e) == DSP_OK, "%s", dsp_last_error());
    if (e) {
        int32_t *p = malloc(sizeof(int32_t) * (size_t)N);
        for (int i = 0; i < N; i++) p[i] = (i * 7) % (int)gm.n_vocab;
        dsp_gen_params gp = dsp_gen_default_params();
        gp.max_tokens = 2;
        gp.ignore_eos = true;
        collected a = {0};
        dsp_gen_result r;
        CHECK_MSG(dsp_generate(e, p, (size_t)N, &gp, collect, &a, &r) == DSP_OK, "%s", dsp_last_error());
        CHECK_EQ_INT(a.n, 2);
        CHECK_EQ_INT(r.n_prompt, N);
        free(p);
        dsp_engine_destroy(e);
    }
    dsp_model_destroy(m);
    free(file.p);
}

int main(void) {
    if (!(g_m = dsp_test_load_default_model())) return dsp_test_summary();
    g_e = make_engine(1, 512, 2048, true);
    DSP_RUN(test_greedy_and_prefix_reuse);
    DSP_RUN(test_argmax_rounds);
    DSP_RUN(test_seeded_sampling);
    DSP_RUN(test_stop_and_cancel);
    DSP_RUN(test_bad_input);
    DSP_RUN(test_batch_invariance);
    DSP_RUN(test_batch_invariance_f32);
    DSP_RUN(test_cancel_prefill_and_decode);
    DSP_RUN(test_kv_pressure);
    DSP_RUN(test_no_leaks);
    DSP_RUN(test_reserve_memory);
    DSP_RUN(test_large_batch);
    dsp_engine_destroy(g_e);
    dsp_model_destroy(g_m);
    return dsp_test_summary();
}
