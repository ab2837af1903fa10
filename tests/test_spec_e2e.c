/* Speculative decoding end to end on the default model (DESIGN.md §2 "Losslessness").
 *
 *  - greedy lossless: for 44 prompts (22 copy-heavy, 22 general chat) x max_draft in
 *    {1, 2, 3, 4, 8, 16, auto} x {no penalties, presence + frequency + repetition penalties}, lookup
 *    emits exactly what baseline emits: the same token ids, the same text in the same event
 *    boundaries, bit-identical logprobs (chosen + top alternatives), the same finish reason;
 *  - stops inside an accepted block: stop strings (also ones split across tokens), EOS and
 *    max_tokens cut lookup exactly where they cut baseline, and the KV cache left behind is the
 *    same (a follow-up turn reuses the same number of tokens);
 *  - sampling: with the same seed, lookup's tokens equal baseline's at T > 0 with top-k/top-p/
 *    min-p/penalties (the one-hot verifier consumes the RNG exactly as plain decoding does; see
 *    spec.h), seeded runs are reproducible;
 *  - the drafter interface: a drafter that supplies q (rejection sampling) is reproducible and
 *    greedy-lossless; a drafter that asks for hidden-state taps receives one row per committed
 *    position, each exactly once, in order, bit-identical to a direct forward's hidden state.
 * Every run starts from an empty sequence (the engine here has no prefix cache), so each mode does
 * its own prefill; a second engine with the prefix cache checks what is left behind for a follow-up.
 * The statistical proof that the verifier samples the exact target is tests/test_spec_verify.c.
 *
 * Cost: the default model decodes at ~10-20 tok/s on the 2-core CI machine with the reference
 * kernels, and the complete greedy matrix (44 x 6 x 2 lookup runs + 88 baseline runs) takes
 * ~30 minutes there. So the level is chosen by DSP_SPEC_TEST_LEVEL:
 *   quick (default, both CI builds): every prompt, with the penalty setting alternating and max_draft
 *         rotating through {1, 2, 3, 4, 8, 16, auto} (each value on 6-7 prompts, each (penalties,
 *         max_draft) pair on 3-4), 16 tokens;
 *         the stop cases at max_draft 2 and 16; each sampling configuration on 1-2 prompts;
 *         sanitized builds (DSP_SANITIZED, ~10x slower) take every 3rd prompt of the greedy matrix
 *         and one max_draft per stop case (2 and 16 alternating);
 *   full: the complete cross products, 24 tokens (run before merging a change to spec/ or engine/).
 * DSP_SPEC_TEST_TOKENS overrides the generation length. DSP_TEST_BACKEND=cuda runs the engine on the
 * GPU (CTest: test_spec_e2e_cuda, label gpu, skipped without one); DSP_TEST_MODEL=FILE another
 * model (a random-weight model of the default model's shape on a lent GPU machine). */
/* ctest-label: e2e */
#include "dsp_test.h"
#include "dsp_test_events.h"
#include "dsp_test_profile.h"

#include "backend/backend.h"
#include "dspark.h"
#include "engine/engine.h"
#include "model/forward.h"
#include "model/model.h"
#include "spec/spec.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static dsp_model *g_m;
static dsp_engine *g_e;  /* no prefix cache: every run prefills */
static dsp_engine *g_pc; /* with the prefix cache: what a run leaves behind */
static int g_tokens = 16;
static bool g_full = false;
static int g_prompt_stride = 1; /* quick level: 3 in sanitized builds (DSP_SANITIZED) */
static bool g_sanitized = false;
static bool g_cuda = false; /* DSP_TEST_BACKEND=cuda: the engine (and the reference forward) on the GPU */

#define CHAT(u) "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n" u "<|im_end|>\n<|im_start|>assistant\n"

static const char *g_prompts[] = {
    /* copy-heavy */
    CHAT("Repeat this sentence exactly: The committee will meet on Tuesday at noon in room 4B to review the budget."),
    CHAT("Quote the first line of this poem: 'Shall I compare thee to a summer's day? Thou art more lovely and more temperate.'"),
    CHAT("Fix the typo and return the code:\ndef add(a, b):\n    retrun a + b\n"),
    CHAT("Rename the variable x to count in this code:\nx = 0\nfor item in items:\n    x += 1\nprint(x)\n"),
    CHAT("Context: The Eiffel Tower is 330 metres tall and was completed in 1889 for the World's Fair.\nQuestion: How tall is the Eiffel Tower? Quote the context."),
    CHAT("Copy the list: apples, bananas, cherries, dates, elderberries, figs, grapes."),
    CHAT("Translate nothing, just echo: Hello world, hello world, hello world."),
    CHAT("Write the JSON back with the name changed to Bob: {\"name\": \"Alice\", \"age\": 30, \"city\": \"Paris\"}"),
    CHAT("Summarize with a quote: 'We choose to go to the Moon in this decade and do the other things, not because they are easy, but because they are hard.'"),
    CHAT("Add a docstring to this function and return it:\ndef square(n):\n    return n * n\n"),
    CHAT("Repeat the numbers: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12."),
    CHAT("Make this sentence formal, keeping most words: hey guys, the meeting is moved to friday afternoon, see you there."),
    CHAT("Source [1]: Water boils at 100 degrees Celsius at sea level. Source [2]: At high altitude water boils at a lower temperature.\nAnswer with citations: at what temperature does water boil?"),
    CHAT("Convert to uppercase: the quick brown fox jumps over the lazy dog."),
    CHAT("Return this HTML unchanged: <ul><li>One</li><li>Two</li><li>Three</li></ul>"),
    CHAT("Change the port to 8080 and return the config:\nserver:\n  host: localhost\n  port: 3000\n  debug: true\n"),
    CHAT("Repeat after me: To be, or not to be, that is the question."),
    CHAT("Here is my previous answer: 'Paris is the capital of France and its largest city.' Please repeat it and add one fact."),
    CHAT("Correct the grammar: She go to the store every days and buy three apple."),
    CHAT("Echo the SQL query: SELECT name, age FROM users WHERE age > 21 ORDER BY name;"),
    CHAT("List the items again: red, green, blue; red, green, blue; red, green, blue."),
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick brown",
    /* general chat */
    CHAT("What is the capital of France?"),
    CHAT("Give me three tips for sleeping better."),
    CHAT("Explain photosynthesis in simple terms."),
    CHAT("Write a haiku about autumn."),
    CHAT("What are the benefits of regular exercise?"),
    CHAT("How do I boil an egg?"),
    CHAT("Tell me a short story about a robot."),
    CHAT("What is machine learning?"),
    CHAT("Suggest a name for a pet cat."),
    CHAT("Why is the sky blue?"),
    CHAT("How many days are in a leap year?"),
    CHAT("What should I pack for a beach holiday?"),
    CHAT("Describe the taste of chocolate."),
    CHAT("What is the difference between weather and climate?"),
    CHAT("Give me a recipe idea for dinner."),
    CHAT("Who wrote Romeo and Juliet?"),
    CHAT("How can I improve my handwriting?"),
    CHAT("What is a black hole?"),
    CHAT("Recommend a good habit to start this year."),
    CHAT("Explain what a computer virus is."),
    "Once upon a time",
    "def fibonacci(n):",
};
#define N_PROMPTS ((int)(sizeof g_prompts / sizeof g_prompts[0]))

static int tokenize(const char *s, int32_t *ids, size_t cap) {
    size_t n = 0;
    CHECK(dsp_tokenize(dsp_model_tokenizer(g_m), s, strlen(s), DSP_TOKENIZE_PARSE_SPECIAL, ids, cap, &n) == DSP_OK);
    return (int)n;
}

static void run(const int32_t *p, int n, const dsp_gen_params *gp, run_out *o) { run_on(g_e, p, n, gp, o); }

/* With an explicit drafter (the test-only submit). */
static void run_drafter_on(dsp_engine *e, dsp_drafter *d, const int32_t *p, int n, const dsp_gen_params *gp, run_out *o) {
    memset(&o->ev, 0, sizeof o->ev);
    dsp_req_id id;
    dsp_status st = dsp_engine_submit_drafter(e, p, (size_t)n, gp, d, NULL, &id);
    CHECK_MSG(st == DSP_OK, "%s", dsp_last_error());
    for (bool done = st != DSP_OK; !done;) {
        const dsp_event *ev;
        size_t n_ev;
        CHECK(dsp_engine_step(e, &ev, &n_ev) == DSP_OK);
        for (size_t i = 0; i < n_ev; i++) {
            if (ev[i].id != id) continue;
            if (ev[i].type == DSP_EVENT_TOKEN) collect(&ev[i].tok, &o->ev);
            else {
                o->r = *ev[i].res, done = true;
                CHECK(ev[i].status == DSP_OK);
            }
        }
    }
}
static void run_drafter(dsp_drafter *d, const int32_t *p, int n, const dsp_gen_params *gp, run_out *o) { run_drafter_on(g_e, d, p, n, gp, o); }

/* Tokens a follow-up request reuses after `gp` ran on p (a fresh cache each time). */
static size_t cached_after(const int32_t *p, int n, const dsp_gen_params *gp) {
    static run_out o, probe;
    dsp_engine_clear_cache(g_pc);
    run_on(g_pc, p, n, gp, &o);
    static int32_t p2[1024];
    memcpy(p2, p, sizeof(int32_t) * (size_t)n);
    memcpy(p2 + n, o.ev.ids, sizeof(int32_t) * (size_t)o.ev.n);
    int n2 = n + o.ev.n;
    n2 += tokenize("\n<|im_start|>user\nAgain, please.<|im_end|>\n<|im_start|>assistant\n", p2 + n2, (size_t)(1024 - n2));
    dsp_gen_params g1 = dsp_gen_default_params();
    g1.max_tokens = 1;
    run_on(g_pc, p2, n2, &g1, &probe);
    return probe.r.n_cached;
}

static const int g_drafts[] = {1, 2, 3, 4, 8, 16, DSP_DRAFT_AUTO};
#define N_DRAFTS ((int)(sizeof g_drafts / sizeof g_drafts[0]))

static void test_greedy_lossless(void) {
    size_t drafted = 0, accepted = 0, rounds = 0, gen = 0;
    int runs = 0;
    /* quick: one penalty setting per prompt (alternating) and one max_draft (rotating); 2 and 7 are
     * coprime, so every 14 consecutive prompts cover every (penalties, max_draft) pair once.
     * Sanitized builds (~10x slower) take every 3rd prompt: 8 copy-heavy and 7 chat ones. */
    const int stride = g_full ? 1 : g_prompt_stride;
    for (int pi = 0, k = 0; pi < N_PROMPTS; pi += stride, k++) {
        int32_t ids[512];
        int n = tokenize(g_prompts[pi], ids, 512);
        for (int pen = 0; pen < 2; pen++) {
            if (!g_full && pen != k % 2) continue;
            dsp_gen_params gp = dsp_gen_default_params();
            gp.max_tokens = g_tokens;
            gp.logprobs = 2;
            if (pen) gp.presence_penalty = 0.6f, gp.frequency_penalty = 0.4f, gp.repetition_penalty = 1.15f;
            static run_out base, spec;
            run(ids, n, &gp, &base);
            for (size_t di = 0; di < sizeof g_drafts / sizeof g_drafts[0]; di++) {
                if (!g_full && di != (size_t)(k % N_DRAFTS)) continue;
                gp.mode = DSP_SPEC_LOOKUP;
                gp.max_draft = g_drafts[di];
                run(ids, n, &gp, &spec);
                char what[96];
                snprintf(what, sizeof what, "prompt %d, penalties %d, max_draft %d", pi, pen, g_drafts[di]);
                same(&base, &spec, what);
                drafted += spec.r.n_drafted, accepted += spec.r.n_accepted, rounds += spec.r.n_rounds, gen += spec.r.n_generated;
                runs++;
            }
            gp.mode = DSP_SPEC_BASELINE;
        }
    }
    fprintf(stderr, "  level %s, %d tokens: %d lookup runs over %d prompts: %zu tokens in %zu rounds, %zu/%zu drafts accepted\n", g_full ? "full" : "quick", g_tokens, runs,
            (N_PROMPTS + stride - 1) / stride, gen, rounds, accepted,
            drafted);
    CHECK(accepted > 0 && accepted < drafted); /* both full and partial acceptance happened */
}

/* A copy-heavy prompt; the stop string is taken from baseline's own output so that it falls
 * inside a block lookup accepts, including across a token boundary. */
static void test_stops_inside_blocks(void) {
    int32_t ids[512];
    int n = tokenize(g_prompts[0], ids, 512);
    dsp_gen_params gp = dsp_gen_default_params();
    gp.max_tokens = 40;
    gp.logprobs = 1;
    static run_out full, a, b;
    run(ids, n, &gp, &full);
    CHECK(full.ev.n >= 12);
    /* stops: across the boundary of tokens 6|7, inside token 9, and max_tokens = 5, 11 */
    for (int cse = 0; cse < 4; cse++) {
        char stop[32] = "";
        dsp_gen_params g2 = gp;
        if (cse == 0) {
            size_t at = full.ev.text_off[7];
            snprintf(stop, sizeof stop, "%.*s", 3, full.ev.text + at - 1); /* last byte of token 6 + 2 of 7 */
            g2.stop[0] = stop;
        } else if (cse == 1) {
            size_t at = full.ev.text_off[9];
            snprintf(stop, sizeof stop, "%.*s", 2, full.ev.text + at + 1);
            g2.stop[0] = stop;
        } else {
            g2.max_tokens = cse == 2 ? 5 : 11;
        }
        run(ids, n, &g2, &a);
        size_t cached_base = cached_after(ids, n, &g2);
        for (int di = 0; di < N_DRAFTS; di++) {
            if (!g_full && di != 1 && di != 5) continue; /* quick: max_draft 2 and 16 */
            if (!g_full && g_sanitized && di != (cse % 2 ? 5 : 1)) continue; /* sanitized: one of them */
            g2.mode = DSP_SPEC_LOOKUP;
            g2.max_draft = g_drafts[di];
            run(ids, n, &g2, &b);
            char what[64];
            snprintf(what, sizeof what, "stop case %d max_draft %d", cse, g_drafts[di]);
            same(&a, &b, what);
            CHECK_EQ_INT(cached_after(ids, n, &g2), cached_base);
            if (cse < 2) {
                CHECK_EQ_INT(b.r.finish, DSP_FINISH_STOP);
                CHECK(strstr(b.ev.text, stop) == NULL);
            }
            g2.mode = DSP_SPEC_BASELINE;
        }
    }
    /* EOS inside a block: the default model's reply ends with the end-of-turn token. Another model
     * (DSP_TEST_MODEL: a random-weight one on the GPU machine) may never emit it: then there is no
     * EOS to find inside a block, and the part is skipped, saying so. */
    if (full.r.finish != DSP_FINISH_STOP && getenv("DSP_TEST_MODEL")) {
        printf("  skipped EOS inside a block: the reply of %s did not end within %d tokens\n", getenv("DSP_TEST_MODEL"), gp.max_tokens);
        return;
    }
    CHECK_EQ_INT(full.r.finish, DSP_FINISH_STOP);
    gp.mode = DSP_SPEC_LOOKUP;
    gp.max_draft = 16;
    run(ids, n, &gp, &b);
    same(&full, &b, "EOS");
    /* a follow-up turn after a lookup reply reuses exactly what it reuses after a baseline reply */
    int32_t p2[1024];
    memcpy(p2, ids, sizeof(int32_t) * (size_t)n);
    memcpy(p2 + n, b.ev.ids, sizeof(int32_t) * (size_t)b.ev.n);
    int n2 = n + b.ev.n;
    n2 += tokenize("\n<|im_start|>user\nAgain, please.<|im_end|>\n<|im_start|>assistant\n", p2 + n2, (size_t)(1024 - n2));
    dsp_engine_clear_cache(g_pc);
    run_on(g_pc, ids, n, &gp, &b);
    run_on(g_pc, p2, n2, &gp, &b);
    CHECK_EQ_INT(b.r.n_cached, (n + full.ev.n - 1) / 16 * 16); /* whole blocks of what was fed */
    gp.mode = DSP_SPEC_BASELINE;
    run(p2, n2, &gp, &a);
    same(&a, &b, "second turn");
}

static void test_sampling_equals_baseline(void) {
    static const struct { float t, top_p, min_p, pres, freq, rep; int top_k; } cfgs[] = {
        {0.8f, 0.9f, 0.0f, 0.0f, 0.0f, 1.0f, 0},
        {1.0f, 1.0f, 0.05f, 0.0f, 0.0f, 1.0f, 40},
        {0.7f, 0.95f, 0.0f, 0.5f, 0.5f, 1.1f, 20},
    };
    static const int prompts[] = {0, 6, 10, 20, 24};
    for (size_t ci = 0; ci < 3; ci++)
        for (size_t pi = 0; pi < sizeof prompts / sizeof prompts[0]; pi++) {
            if (!g_full && pi % 3 != ci % 3) continue; /* quick: 1-2 prompts per configuration */
            int32_t ids[512];
            int n = tokenize(g_prompts[prompts[pi]], ids, 512);
            dsp_gen_params gp = dsp_gen_default_params();
            gp.max_tokens = g_tokens;
            gp.temperature = cfgs[ci].t, gp.top_p = cfgs[ci].top_p, gp.min_p = cfgs[ci].min_p, gp.top_k = cfgs[ci].top_k;
            gp.presence_penalty = cfgs[ci].pres, gp.frequency_penalty = cfgs[ci].freq, gp.repetition_penalty = cfgs[ci].rep;
            gp.seed = 1000 + ci * 10 + pi;
            gp.logprobs = 1;
            static run_out base, x, y;
            run(ids, n, &gp, &base);
            gp.mode = DSP_SPEC_LOOKUP;
            gp.max_draft = 8;
            run(ids, n, &gp, &x);
            run(ids, n, &gp, &y);
            char what[64];
            snprintf(what, sizeof what, "sampling config %zu prompt %d", ci, prompts[pi]);
            same(&base, &x, what);
            same(&x, &y, "seeded lookup twice");
            gp.max_draft = 3;
            run(ids, n, &gp, &y);
            same(&x, &y, "seeded lookup, another max_draft");
        }
}

/* ---- drafters through the interface ------------------------------------------------------ */

/* Supplies q: wraps lookup; each draft is the lookup token with probability 0.75, else a uniformly
 * chosen token of a small set; q is that mixture (so rejection sampling with the residual runs). */
typedef struct qdrafter {
    dsp_drafter base;
    dsp_drafter *lk;
    dsp_rng rng;
    int V;
} qdrafter;

static int32_t qd_propose(dsp_drafter *d, const int32_t *t, uint32_t n, int32_t k_max, int32_t *draft, float *q) {
    qdrafter *x = (qdrafter *)d;
    int32_t k = dsp_drafter_propose(x->lk, t, n, k_max, draft, NULL);
    static const int32_t alt[4] = {30, 260, 284, 314};
    for (int32_t i = 0; i < k; i++) {
        float *qi = q + (size_t)i * (size_t)x->V;
        memset(qi, 0, sizeof(float) * (size_t)x->V);
        qi[draft[i]] += 0.75f;
        for (int j = 0; j < 4; j++) qi[alt[j]] += 0.0625f;
        if (dsp_rng_uniform(&x->rng) >= 0.75) draft[i] = alt[dsp_rng_next_u64(&x->rng) % 4];
    }
    return k;
}
static void qd_observe(dsp_drafter *d, const dsp_spec_commit *c) { dsp_drafter_observe(((qdrafter *)d)->lk, c); }
static void qd_reset(dsp_drafter *d) {
    qdrafter *x = (qdrafter *)d;
    dsp_drafter_reset(x->lk);
    dsp_rng_seed(&x->rng, 4242);
}
static void qd_destroy(dsp_drafter *d) { (void)d; }
static const dsp_drafter_ops qd_ops = {"test-q", qd_propose, qd_observe, qd_reset, qd_destroy};

static void test_q_drafter(void) {
    qdrafter x;
    memset(&x, 0, sizeof x);
    x.base.ops = &qd_ops;
    x.base.supplies_q = true;
    x.V = dsp_tokenizer_n_vocab(dsp_model_tokenizer(g_m));
    dsp_lookup_params lp = {2, 4, 8, dsp_engine_n_ctx(g_e), false};
    CHECK(dsp_lookup_create(&lp, &x.lk) == DSP_OK);
    int32_t ids[512];
    int n = tokenize(g_prompts[10], ids, 512);
    dsp_gen_params gp = dsp_gen_default_params();
    gp.max_tokens = g_tokens;
    gp.max_draft = 8;
    gp.logprobs = 0;
    static run_out base, a, b;
    run(ids, n, &gp, &base); /* greedy */
    run_drafter(&x.base, ids, n, &gp, &a);
    same(&base, &a, "q drafter, greedy");
    CHECK(a.r.n_drafted > 0);
    gp.temperature = 0.9f;
    gp.seed = 5;
    run_drafter(&x.base, ids, n, &gp, &a);
    run_drafter(&x.base, ids, n, &gp, &b);
    same(&a, &b, "q drafter, seeded twice");
    CHECK(a.r.n_accepted > 0);
    dsp_drafter_destroy(x.lk);
}

/* Wants taps: checks it is shown every committed position's hidden state exactly once, in order. */
typedef struct tapdrafter {
    dsp_drafter base;
    dsp_drafter *lk;
    uint32_t next_pos; /* next position whose tap row is expected */
    int bad, rows;
    int E;
    float *seen;       /* (512, E): the row shown for each position */
} tapdrafter;

static int32_t td_propose(dsp_drafter *d, const int32_t *t, uint32_t n, int32_t k_max, int32_t *draft, float *q) {
    return dsp_drafter_propose(((tapdrafter *)d)->lk, t, n, k_max, draft, q);
}
static void td_observe(dsp_drafter *d, const dsp_spec_commit *c) {
    tapdrafter *x = (tapdrafter *)d;
    dsp_drafter_observe(x->lk, c);
    if (c->n_tap_rows == 0) return;
    if (!c->taps || c->tap_pos != x->next_pos) x->bad++;
    for (int r = 0; c->taps && r < c->n_tap_rows; r++)
        if (c->tap_pos + (uint32_t)r < 512)
            memcpy(x->seen + (size_t)(c->tap_pos + (uint32_t)r) * (size_t)x->E, c->taps + (size_t)r * (size_t)x->E, sizeof(float) * (size_t)x->E);
    x->next_pos = c->tap_pos + (uint32_t)c->n_tap_rows;
    x->rows += c->n_tap_rows;
    if (x->next_pos != c->n_tokens - 1 && c->n_drafted + c->n_accepted > 0) x->bad++; /* all but the newest token seen */
}
static void td_reset(dsp_drafter *d) {
    tapdrafter *x = (tapdrafter *)d;
    dsp_drafter_reset(x->lk);
    x->next_pos = 0, x->bad = 0, x->rows = 0;
}
static const dsp_drafter_ops td_ops = {"test-taps", td_propose, td_observe, td_reset, qd_destroy};

static void test_taps_drafter(void) {
    tapdrafter x;
    memset(&x, 0, sizeof x);
    x.base.ops = &td_ops;
    x.base.n_taps = 1;
    x.base.tap_layers[0] = 3;
    x.E = g_m->hp.n_embd;
    dsp_lookup_params lp = {2, 4, 8, dsp_engine_n_ctx(g_e), false};
    CHECK(dsp_lookup_create(&lp, &x.lk) == DSP_OK);
    x.seen = calloc((size_t)512 * (size_t)x.E, sizeof(float));
    int32_t ids[512];
    int n = tokenize(g_prompts[10], ids, 512);
    dsp_gen_params gp = dsp_gen_default_params();
    gp.max_tokens = g_tokens;
    gp.max_draft = 8;
    static run_out base, a;
    run(ids, n, &gp, &base);
    run_drafter(&x.base, ids, n, &gp, &a);
    same(&base, &a, "taps drafter");
    CHECK_EQ_INT(x.bad, 0);
    CHECK(a.r.n_accepted > 0);
    /* the rows came in order from position 0 (bad == 0), so they are exactly the positions up to next_pos */
    CHECK_EQ_INT(x.rows, (int)x.next_pos);
    /* the values: a direct forward over the committed tokens, layer 3's output at every position */
    int total = n + a.ev.n - 1; /* the last token is never fed */
    /* every position up to the start of the last round was shown (that round ends the request) */
    CHECK(x.next_pos > (uint32_t)n && x.next_pos <= (uint32_t)total && x.next_pos + 8 + 1 >= (uint32_t)total);
    int32_t all[1024], pos[1024], seq[1024];
    memcpy(all, ids, sizeof(int32_t) * (size_t)n);
    memcpy(all + n, a.ev.ids, sizeof(int32_t) * (size_t)a.ev.n);
    for (int i = 0; i < total; i++) pos[i] = i, seq[i] = 0;
    dsp_fwd_params fp = dsp_fwd_default_params();
    fp.n_threads = 1;
    fp.max_batch_tokens = total;
    fp.max_taps = 1;
    fp.n_ctx = 512;
    dsp_backend_params bp = {.kind = g_cuda ? DSP_BACKEND_CUDA : DSP_BACKEND_CPU, .n_threads = 1, .kv_type = DSP_F16};
    CHECK(dsp_backend_create(&bp, &fp.backend) == DSP_OK); /* the engine's kind of backend and K/V type: the same arithmetic */
    dsp_fwd *f = NULL;
    CHECK(dsp_fwd_create(g_m, &fp, &f) == DSP_OK);
    float *ref = malloc(sizeof(float) * (size_t)total * (size_t)x.E);
    dsp_kv_seq kv;
    CHECK(dsp_fwd_seq_init(f, &kv) == DSP_OK);
    dsp_kv_seq *seqs[1] = {&kv};
    int32_t layer = 3;
    dsp_batch b = {total, all, seq, pos, 0, NULL, 1, &layer};
    CHECK(dsp_fwd_run(f, seqs, 1, &b, NULL, ref) == DSP_OK);
    int mismatched = 0;
    for (int i = 0; i < (int)x.next_pos; i++)
        mismatched += memcmp(ref + (size_t)i * (size_t)x.E, x.seen + (size_t)i * (size_t)x.E, sizeof(float) * (size_t)x.E) != 0;
    CHECK_MSG(mismatched == 0, "%d of %u tap rows differ from a direct forward", mismatched, x.next_pos);
    dsp_kv_seq_free(dsp_fwd_kv(f), &kv);
    dsp_fwd_destroy(f);
    dsp_backend_destroy(fp.backend);
    free(ref);
    free(x.seen);
    dsp_drafter_destroy(x.lk);
}

/* ---- drafts while a prompt is prefilled next to decoding requests --------------------------- */

/* An oracle: proposes the known greedy continuation (every draft is accepted). */
typedef struct oracle {
    dsp_drafter base;
    const int32_t *ref;
    int n_ref;
    uint32_t n_prompt;
} oracle;

static int32_t or_propose(dsp_drafter *d, const int32_t *t, uint32_t n, int32_t k_max, int32_t *draft, float *q) {
    (void)t, (void)q;
    oracle *x = (oracle *)d;
    int32_t k = 0;
    for (int i = (int)(n - x->n_prompt); k < k_max && i >= 0 && i < x->n_ref; i++) draft[k++] = x->ref[i];
    return k;
}
static void or_observe(dsp_drafter *d, const dsp_spec_commit *c) { (void)d, (void)c; }
static void or_reset(dsp_drafter *d) { (void)d; }
static const dsp_drafter_ops or_ops = {"test-oracle", or_propose, or_observe, or_reset, qd_destroy};

static int g_round_kept; /* drafts verified this round, over the decoding requests */
static void count_kept(const dsp_round_trace *t, void *user) {
    (void)user;
    g_round_kept += t->kept;
}

/* the engine these tests run: a 512-token context, 2 threads, no prefix cache */
static dsp_engine_params test_params(int max_batch) {
    dsp_engine_params ep = dsp_engine_default_params();
    ep.device = g_cuda ? DSP_DEVICE_CUDA : DSP_DEVICE_CPU;
    ep.n_ctx = 512;
    ep.n_threads = 2;
    ep.max_batch = max_batch;
    ep.no_prefix_cache = true;
    return ep;
}

/* --max-draft auto's calibration (draft.c dsp_engine_calibrate): per kind of round, the measured
 * time over the profile's prediction; a kind not yet measured starts at every round's ratio; a
 * kind's own averages move only with its own rounds; off, nothing moves. Synthetic rounds on a
 * synthetic profile (a forward of n rows costs 1 + 0.1 (n - 1) of a 2 ms one). */
static void test_calibration(void) {
    dsp_engine_params ep = test_params(2);
    dsp_engine *e = NULL;
    CHECK(dsp_engine_create(g_m, &ep, &e) == DSP_OK);
    if (!e) return;
    dsp_test_linear_profile(e, 0.1f, 2.0, 0.5f);
    for (int k = 0; k < DSP_ROUND_KINDS; k++) CHECK(fabs(dsp_engine_cost_scale(e, (dsp_round_kind)k) - 1.0) < 1e-9);
    e->round_nb = 0;
    for (int i = 0; i < 60; i++) dsp_engine_calibrate(e, 1, 0, false, 4.0); /* plain rounds: 4 ms, predicted 2 */
    const double plain = dsp_engine_cost_scale(e, DSP_ROUND_PLAIN), look = dsp_engine_cost_scale(e, DSP_ROUND_LOOKUP);
    CHECK_MSG(plain > 1.9 && plain < 2.0, "plain rounds at twice the prediction: scale %.3f", plain);
    CHECK_MSG(look > 1.8 && look <= plain, "lookup rounds, not measured: %.3f (every round's ratio)", look);
    e->round_nb = 1;
    e->host_ms = 0.2; /* the host time the choices assume: 0.1 of the 2 ms 1-row forward */
    for (int i = 0; i < 60; i++) dsp_engine_calibrate(e, 4, 0, true, 2.0 * (0.1 + 0.5 + 1.3)); /* block rounds as predicted */
    const double blk = dsp_engine_cost_scale(e, DSP_ROUND_BLOCK);
    CHECK_MSG(blk > 0.95 && blk < 1.1, "block rounds as predicted: scale %.3f", blk);
    /* plain keeps its own evidence; only its prior (4 of its ~24 units) follows every round's ratio */
    const double plain2 = dsp_engine_cost_scale(e, DSP_ROUND_PLAIN);
    CHECK_MSG(plain2 > 0.9 * plain && plain2 > 1.6 * blk, "plain after block rounds: %.3f -> %.3f (block %.3f)", plain, plain2, blk);
    /* one stall (a round 40x its prediction: a CUDA graph captured) moves a kind's ratio a bounded
     * step, and a kind left unused returns to the prior in other kinds' rounds */
    e->round_nb = 0;
    for (int i = 0; i < 60; i++) dsp_engine_calibrate(e, 3, 0, true, 2.0 * (0.1 + 1.2)); /* lookup rounds as predicted */
    const double look1 = dsp_engine_cost_scale(e, DSP_ROUND_LOOKUP);
    dsp_engine_calibrate(e, 3, 0, true, 40 * 2.0 * (0.1 + 1.2));
    const double look2 = dsp_engine_cost_scale(e, DSP_ROUND_LOOKUP);
    CHECK_MSG(look1 > 0.95 && look1 < 1.05 && look2 > look1 && look2 < 1.05 * look1, "lookup ratio %.3f, after one stall %.3f", look1, look2);
    for (int i = 0; i < 40; i++) dsp_engine_calibrate(e, 3, 0, true, 40 * 2.0 * (0.1 + 1.2));
    const double look3 = dsp_engine_cost_scale(e, DSP_ROUND_LOOKUP);
    CHECK_MSG(look3 > 2.0, "lookup rounds that stay dear are learnt (in bounded steps): %.3f", look3);
    for (int i = 0; i < 1000; i++) dsp_engine_calibrate(e, 1, 0, false, 2.0 * (0.1 + 1.0)); /* plain rounds as predicted */
    const double look4 = dsp_engine_cost_scale(e, DSP_ROUND_LOOKUP);
    CHECK_MSG(look4 < 1.2, "unused for 1000 rounds, lookup's ratio returns towards the prior: %.3f", look4);
    const double blk2 = dsp_engine_cost_scale(e, DSP_ROUND_BLOCK);
    e->no_calibration = true;
    dsp_engine_calibrate(e, 1, 0, false, 400.0);
    CHECK(dsp_engine_cost_scale(e, DSP_ROUND_BLOCK) == blk2);
    dsp_engine_destroy(e);
}

/* A round in which the backend did one-time work (CUDA: a graph captured for a new shape; backend.h
 * dsp_backend.n_setup) is not calibrated. A lookup drafter that bumps the counter in every round
 * (its propose runs inside the round) leaves every kind's ratio at exactly its prior, where the same
 * generation without the bump moves them: the synthetic profile's 1-row forward is 1,000 ms, the
 * measured rounds a few. */
typedef struct setupdrafter {
    dsp_drafter base;
    dsp_drafter *lk;
    dsp_backend *be; /* bumped in every propose, if set */
} setupdrafter;
static int32_t sd_propose(dsp_drafter *d, const int32_t *t, uint32_t n, int32_t k_max, int32_t *draft, float *q) {
    setupdrafter *x = (setupdrafter *)d;
    if (x->be) x->be->n_setup++;
    return dsp_drafter_propose(x->lk, t, n, k_max, draft, q);
}
static void sd_observe(dsp_drafter *d, const dsp_spec_commit *c) { dsp_drafter_observe(((setupdrafter *)d)->lk, c); }
static void sd_reset(dsp_drafter *d) { dsp_drafter_reset(((setupdrafter *)d)->lk); }
static const dsp_drafter_ops sd_ops = {"test-setup", sd_propose, sd_observe, sd_reset, qd_destroy};

static void test_calibration_skips_setup(void) {
    int32_t ids[512];
    const int n = tokenize(g_prompts[10], ids, 512);
    dsp_gen_params gp = dsp_gen_default_params();
    gp.max_tokens = 24;
    gp.max_draft = 4;
    for (int bump = 0; bump < 2; bump++) {
        dsp_engine_params ep = test_params(2);
        dsp_engine *e = NULL;
        CHECK(dsp_engine_create(g_m, &ep, &e) == DSP_OK);
        if (!e) return;
        dsp_test_linear_profile(e, 0.1f, 1000.0, 0.5f);
        setupdrafter x;
        memset(&x, 0, sizeof x);
        x.base.ops = &sd_ops;
        x.be = bump ? e->be : NULL;
        dsp_lookup_params lp = {2, 4, 8, dsp_engine_n_ctx(e), false};
        CHECK(dsp_lookup_create(&lp, &x.lk) == DSP_OK);
        static run_out o;
        run_drafter_on(e, &x.base, ids, n, &gp, &o);
        CHECK(o.ev.n > 4);
        const double plain = dsp_engine_cost_scale(e, DSP_ROUND_PLAIN), look = dsp_engine_cost_scale(e, DSP_ROUND_LOOKUP);
        if (bump)
            CHECK_MSG(plain == 1.0 && look == 1.0, "every round did one-time work: scales %.4f %.4f, expected 1 (not calibrated)", plain, look);
        else
            CHECK_MSG(plain < 0.9 || look < 0.9, "rounds of a few ms against a 1,000 ms profile: scales %.4f %.4f", plain, look);
        dsp_drafter_destroy(x.lk);
        dsp_engine_destroy(e);
    }
}

/* The host-time average's bounded step (draft.c dsp_engine_host_step): one stalled round, first or
 * later, moves it little; host time that really grows still gets there. */
static void test_host_step(void) {
    CHECK(dsp_engine_host_step(0, 13.0, 5.0) == 5.0);   /* the seed: at most the round's forward */
    CHECK(dsp_engine_host_step(0, 0.02, 5.0) == 0.02);  /* a usual first round as it is */
    CHECK(fabs(dsp_engine_host_step(1.0, 1.2, 5.0) - 1.02) < 1e-12); /* a usual round: the plain average */
    double a = 0.02;
    a = dsp_engine_host_step(a, 13.0, 5.0); /* a 13 ms stall next to a 5 ms forward */
    CHECK_MSG(a < 0.1, "one stall took the average to %.3f ms", a);
    for (int i = 0; i < 60; i++) a = dsp_engine_host_step(a, 3.0, 5.0); /* 3 ms of host work every round */
    CHECK_MSG(a > 2.7 && a <= 3.0, "60 rounds of 3 ms: average %.3f ms", a);
}

/* The cost profile is measured inside the first round that needs it (seconds on a CPU). That time
 * is not the round's: counted as its host time it made the next ~60 rounds' host time look like
 * most of a second (an average decaying by 0.9 a round) and skewed --max-draft auto's choices in a
 * fresh process. A profile measured in a fresh cache folder leaves the host-time average at a
 * small fraction of the measurement. (Not under sanitizers: the measurement there takes minutes.) */
static void test_profile_time_not_host(void) {
    if (g_sanitized) {
        printf("  (skipped under sanitizers)\n");
        return;
    }
    char dir[] = "/tmp/dsp-profile-test-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    const char *old = getenv("XDG_CACHE_HOME");
    char *saved = old ? strdup(old) : NULL;
    setenv("XDG_CACHE_HOME", dir, 1);
    dsp_engine_params ep = test_params(1);
    dsp_engine *e = NULL;
    CHECK(dsp_engine_create(g_m, &ep, &e) == DSP_OK);
    if (e) {
        int32_t ids[512];
        const int n = tokenize(g_prompts[0], ids, 512);
        dsp_gen_params gp = dsp_gen_default_params();
        gp.max_tokens = 24;
        gp.ignore_eos = true;
        gp.max_draft = DSP_DRAFT_AUTO;
        gp.mode = DSP_SPEC_LOOKUP;
        static run_out o;
        run_on(e, ids, n, &gp, &o);
        CHECK_MSG(e->profile_ms > 0, "no profile was measured (%.1f ms)", e->profile_ms);
        CHECK_MSG(e->host_ms < e->profile_ms / 20, "host time per round %.2f ms after a %.1f ms profile measurement", e->host_ms,
                  e->profile_ms);
        dsp_engine_destroy(e);
    }
    if (saved) setenv("XDG_CACHE_HOME", saved, 1), free(saved);
    else unsetenv("XDG_CACHE_HOME");
    char path[256]; /* the one profile file, then its folders */
    snprintf(path, sizeof path, "%s/dspark", dir);
    DIR *d = opendir(path);
    for (struct dirent *de; d && (de = readdir(d));) {
        char f[600];
        snprintf(f, sizeof f, "%s/%s", path, de->d_name);
        if (de->d_name[0] != '.') unlink(f);
    }
    if (d) closedir(d);
    rmdir(path);
    rmdir(dir);
}

/* A verification that fails inside a batch (engine.c verify_all runs a round's verifications on the
 * host threads): the request it belongs to ends with that error and its message, whichever thread
 * ran it; the others in the same rounds go on and give their solo output. The failing verifier is
 * dsp_spec_verify, except for the request sampled at T 0.85, from its fourth token on. */
static dsp_status fail_085(const float *logits, int32_t n_vocab, int32_t k, const int32_t *draft, const float *q, dsp_sample_history *h,
                           const dsp_sample_params *sp, dsp_rng *rng, dsp_sample_scratch *s, dsp_sample_dist *d, int32_t *out, int32_t *n_out) {
    if (sp->temperature == 0.85f && h->len >= h->n_prompt + 3) return dsp_error(DSP_ERR_INTERNAL, "test: the T 0.85 request's verification failed");
    return dsp_spec_verify(logits, n_vocab, k, draft, q, h, sp, rng, s, d, out, n_out);
}

static void test_verify_failure_in_batch(void) {
    static const float temps[3] = {0.9f, 0.85f, 0.7f};
    int32_t ids[3][512];
    int n[3];
    static run_out solo[3];
    dsp_gen_params gp[3];
    for (int i = 0; i < 3; i++) {
        n[i] = tokenize(g_prompts[i], ids[i], 512);
        gp[i] = dsp_gen_default_params();
        gp[i].max_tokens = 12;
        gp[i].ignore_eos = true;
        gp[i].temperature = temps[i];
        gp[i].seed = 11 + (uint64_t)i;
        if (i != 1) run(ids[i], n[i], &gp[i], &solo[i]);
    }
    dsp_engine_params ep = test_params(4);
    dsp_engine *e = NULL;
    CHECK(dsp_engine_create(g_m, &ep, &e) == DSP_OK);
    if (!e) return;
    e->verify = fail_085;
    static events got[3];
    memset(got, 0, sizeof got);
    for (int i = 0; i < 3; i++) CHECK(dsp_engine_submit(e, ids[i], (size_t)n[i], &gp[i], &got[i], NULL) == DSP_OK);
    dsp_status status[3] = {DSP_OK, DSP_OK, DSP_OK};
    char msg[256] = "";
    for (int done = 0, guard = 0; done < 3 && guard < 10000; guard++) {
        const dsp_event *ev;
        size_t n_ev;
        CHECK(dsp_engine_step(e, &ev, &n_ev) == DSP_OK);
        for (size_t k = 0; k < n_ev; k++) {
            events *c = ev[k].user;
            const int i = (int)(c - got);
            if (ev[k].type == DSP_EVENT_TOKEN) {
                collect(&ev[k].tok, c);
                continue;
            }
            status[i] = ev[k].status, done++;
            if (ev[k].status && ev[k].error) snprintf(msg, sizeof msg, "%s", ev[k].error);
        }
    }
    CHECK_MSG(status[1] == DSP_ERR_INTERNAL && strstr(msg, "T 0.85 request's verification failed"), "the failing request: status %d, \"%s\"",
              (int)status[1], msg);
    CHECK_EQ_INT(got[1].n, 3); /* its tokens before the failure */
    for (int i = 0; i < 3; i += 2) {
        CHECK_MSG(status[i] == DSP_OK && got[i].n == solo[i].ev.n && !memcmp(got[i].ids, solo[i].ev.ids, sizeof(int32_t) * (size_t)got[i].n),
                  "request %d beside the failing one: status %d, %d tokens (alone %d)", i, (int)status[i], got[i].n, solo[i].ev.n);
    }
    e->verify = dsp_spec_verify;
    dsp_engine_destroy(e);
}

/* --max-draft auto next to a prefill: with a synthetic cost profile (a forward of n rows costs
 * 1 + 0.1 (n - 1) one-row forwards, no context or host term) two decoding requests whose drafts
 * are always right draft as much as the budget allows; while a prompt is prefilled next to them,
 * --prefill-itl 1.5 bounds the round at 1.5 x T(2) = 1.65, i.e. 7 rows (engine.h), of which the
 * decoding requests' rows and drafts may take all but one: at most 4 drafts in all. Before the prompt
 * arrives and after its prefill the limit is not there (more drafts per round). The output equals the
 * requests' solo output. Deterministic: the choice depends on the profile and the acceptance
 * counts only (the host-time term is made negligible, the measured calibration is off). */
static void test_prefill_draft_cap(void) {
    dsp_engine_params ep = test_params(4);
    dsp_engine *e = NULL;
    CHECK(dsp_engine_create(g_m, &ep, &e) == DSP_OK);
    if (!e) return;
    dsp_test_linear_profile(e, 0.1f, 1e9, 0); /* one_row_ms 1e9: the measured host time per round is ~0 */
    e->no_calibration = true; /* the measured round times would weigh in */

    int32_t p[256], lp[256];
    int n = tokenize(g_prompts[0], p, 256);
    /* the arriving prompt: short, since the drafts leave it as little as one row per round */
    int nl = tokenize("The quick brown fox jumps over the lazy dog, and then it runs far away into the woods.", lp, 256);
    dsp_gen_params gp = dsp_gen_default_params();
    /* the decodes must outlast the prefill, which gets at least one row per round while each decode
     * commits at most 1 + 4 tokens a round: 5 per prompt token, and more for the rounds before and
     * after (a random model's tokenizer makes the prompt several times longer than the default's) */
    gp.max_tokens = 128 + 6 * nl < 900 ? 128 + 6 * nl : 900; /* (the event buffers hold 1024) */
    gp.ignore_eos = true;
    gp.max_draft = DSP_DRAFT_AUTO;
    gp.mode = DSP_SPEC_LOOKUP;
    static run_out solo;
    dsp_gen_params bp = gp;
    bp.mode = DSP_SPEC_BASELINE;
    run_on(e, p, n, &bp, &solo);
    /* all of them, or as many as the context holds (a random model's long prompt on the GPU) */
    CHECK_MSG(solo.ev.n >= 128, "baseline gave %d tokens", (int)solo.ev.n);

    oracle o[2];
    static run_out out[2];
    dsp_req_id id[2], lid = 0;
    gp.trace = count_kept;
    for (int j = 0; j < 2; j++) {
        memset(&o[j], 0, sizeof o[j]);
        o[j].base.ops = &or_ops;
        o[j].ref = solo.ev.ids, o[j].n_ref = solo.ev.n, o[j].n_prompt = (uint32_t)n;
        memset(&out[j], 0, sizeof out[j]);
        CHECK(dsp_engine_submit_drafter(e, p, (size_t)n, &gp, &o[j].base, NULL, &id[j]) == DSP_OK);
    }
    int phase = 0; /* 0: before the long prompt, 1: it is being prefilled, 2: after */
    int max_kept[3] = {0, 0, 0}, rounds[3] = {0, 0, 0}, done = 0;
    bool long_first = false;
    for (int guard = 0; done < 2 && guard < 2000; guard++) {
        if (phase == 0 && max_kept[0] > 4 && rounds[0] >= 2) { /* the decodes draft freely: now the prompt arrives */
            dsp_gen_params lg = dsp_gen_default_params();
            lg.max_tokens = 1;
            CHECK(dsp_engine_submit(e, lp, (size_t)nl, &lg, NULL, &lid) == DSP_OK);
            phase = 1;
        }
        const int ph = phase;
        g_round_kept = 0;
        const dsp_event *ev;
        size_t n_ev;
        CHECK(dsp_engine_step(e, &ev, &n_ev) == DSP_OK);
        rounds[ph]++;
        if (g_round_kept > max_kept[ph]) max_kept[ph] = g_round_kept;
        for (size_t i = 0; i < n_ev; i++) {
            if (ev[i].id == lid && ev[i].type == DSP_EVENT_TOKEN) long_first = true;
            for (int j = 0; j < 2; j++)
                if (ev[i].id == id[j]) {
                    if (ev[i].type == DSP_EVENT_TOKEN) collect(&ev[i].tok, &out[j].ev);
                    else out[j].r = *ev[i].res, done++;
                }
        }
        if (phase == 1 && long_first) phase = 2;
    }
    CHECK_MSG(rounds[1] >= 2 && rounds[2] >= 1, "rounds before/during/after the prefill: %d/%d/%d", rounds[0], rounds[1], rounds[2]);
    CHECK_MSG(max_kept[0] > 4 && max_kept[2] > 4, "drafts per round before / after the prefill: %d / %d (want > 4)", max_kept[0], max_kept[2]);
    CHECK_MSG(max_kept[1] <= 4 && max_kept[1] > 0, "drafts per round during the prefill: up to %d (want 1..4)", max_kept[1]);
    printf("  prefill draft cap: rounds before/during/after the prefill %d/%d/%d, at most %d/%d/%d drafts per round\n", rounds[0], rounds[1],
           rounds[2], max_kept[0], max_kept[1], max_kept[2]);
    for (int j = 0; j < 2; j++) CHECK(out[j].ev.n == solo.ev.n && !memcmp(out[j].ev.ids, solo.ev.ids, sizeof(int32_t) * (size_t)solo.ev.n));
    dsp_engine_destroy(e);
}

static void test_bad_params(void) {
    int32_t ids[8] = {1, 2, 3, 4};
    dsp_gen_params gp = dsp_gen_default_params();
    gp.mode = DSP_SPEC_LOOKUP;
    gp.max_draft = -1; /* 0 is DSP_DRAFT_AUTO */
    CHECK_EQ_INT(dsp_generate(g_e, ids, 4, &gp, NULL, NULL, NULL), DSP_ERR_INVALID_ARG);
    CHECK(strstr(dsp_last_error(), "max_draft") != NULL);
    gp.max_draft = DSP_MAX_DRAFT + 1;
    CHECK_EQ_INT(dsp_generate(g_e, ids, 4, &gp, NULL, NULL, NULL), DSP_ERR_INVALID_ARG);
    gp.max_draft = 4, gp.lookup_min_n = 3, gp.lookup_max_n = 2;
    CHECK_EQ_INT(dsp_generate(g_e, ids, 4, &gp, NULL, NULL, NULL), DSP_ERR_INVALID_ARG);
    gp.lookup_min_n = 2, gp.mode = (dsp_spec_mode)7;
    CHECK_EQ_INT(dsp_generate(g_e, ids, 4, &gp, NULL, NULL, NULL), DSP_ERR_INVALID_ARG);
}

int main(void) {
    const char *lv = getenv("DSP_SPEC_TEST_LEVEL");
    if (lv && !strcmp(lv, "full")) g_full = true, g_tokens = 24;
    if (getenv("DSP_SANITIZED")) g_prompt_stride = 3, g_sanitized = true;
    const char *nt = getenv("DSP_SPEC_TEST_TOKENS");
    if (nt && atoi(nt) > 0) g_tokens = atoi(nt);
    g_cuda = dsp_test_wants_cuda();
    if (g_cuda && !dsp_backend_cuda_available()) {
        printf("SKIP: DSP_TEST_BACKEND=cuda but no usable CUDA device\n"); /* a skip even under DSP_TEST_REQUIRE */
        return DSP_TEST_SKIP_CODE;
    }
    bool is_default;
    if (!(g_m = dsp_test_load_model(&is_default))) return getenv("DSP_TEST_MODEL") ? 1 : dsp_test_summary();
    dsp_engine_params ep = test_params(1);
    CHECK(dsp_engine_create(g_m, &ep, &g_e) == DSP_OK);
    ep.no_prefix_cache = false;
    ep.kv_tokens = 2048;
    CHECK(dsp_engine_create(g_m, &ep, &g_pc) == DSP_OK);
    DSP_RUN(test_bad_params);
    DSP_RUN(test_stops_inside_blocks);
    DSP_RUN(test_q_drafter);
    DSP_RUN(test_taps_drafter);
    DSP_RUN(test_prefill_draft_cap);
    DSP_RUN(test_calibration);
    DSP_RUN(test_calibration_skips_setup);
    DSP_RUN(test_host_step);
    DSP_RUN(test_profile_time_not_host);
    DSP_RUN(test_verify_failure_in_batch);
    DSP_RUN(test_sampling_equals_baseline);
    DSP_RUN(test_greedy_lossless);
    dsp_engine_destroy(g_e);
    dsp_engine_destroy(g_pc);
    dsp_model_destroy(g_m);
    return dsp_test_summary();
}
