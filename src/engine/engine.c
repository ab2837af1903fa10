/* engine/engine: contexts, sequences and the generation loop (DESIGN.md §1).
 *
 * A generation is a series of rounds over the ragged-batch forward: prefill chunks first (logits
 * only for the last prompt row), then one round per decided token(s). Per round: logits ->
 * processors -> sampler -> stop/EOS checks -> emit -> KV commit. The speculative path (drafts
 * verified in one round) plugs into the same loop: see decode_round.
 *
 * Memory: everything a generation needs is sized at dsp_ctx_create (logits rows, sampler
 * scratch and distributions) or once per request (history, stop matcher); nothing is allocated
 * inside a round. */
#include "engine/engine.h"

#include "core/log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- context ------------------------------------------------------------------------------ */

dsp_ctx_params dsp_ctx_default_params(void) {
    dsp_ctx_params p;
    memset(&p, 0, sizeof p);
    return p;
}

static void *aligned_alloc16(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64)) return NULL;
    return p;
}

dsp_status dsp_ctx_create(dsp_model *m, const dsp_ctx_params *p, dsp_ctx **out) {
    *out = NULL;
    dsp_ctx_params d = dsp_ctx_default_params();
    if (!p) p = &d;
    if (!m->tok) return dsp_error(DSP_ERR_UNSUPPORTED, "%s: the model has no tokenizer", m->path);
    dsp_ctx *c = calloc(1, sizeof *c);
    if (!c) return dsp_error(DSP_ERR_NOMEM, "no memory");
    c->m = m;
    dsp_fwd_params fp = dsp_fwd_default_params();
    fp.n_threads = p->n_threads;
    fp.n_ctx = p->n_ctx;
    fp.kv_tokens = p->kv_tokens;
    if (p->max_batch_tokens) fp.max_batch_tokens = p->max_batch_tokens;
    fp.max_logits = DSP_ENGINE_MAX_ROWS;
    fp.max_taps = DSP_SPEC_MAX_TAPS;
    dsp_status st = dsp_fwd_create(m, &fp, &c->fwd);
    if (st) {
        free(c);
        return st;
    }
    c->n_vocab = dsp_fwd_n_vocab(c->fwd);
    if ((size_t)c->n_vocab != dsp_tok_n_vocab(m->tok)) {
        st = dsp_error(DSP_ERR_FORMAT, "%s: tokenizer has %zu tokens but the output layer has %d", m->path, dsp_tok_n_vocab(m->tok),
                       c->n_vocab);
        dsp_ctx_destroy(c);
        return st;
    }
    c->max_rows = DSP_ENGINE_MAX_ROWS;
    size_t sbytes = dsp_sample_scratch_bytes(c->n_vocab), dbytes = dsp_sample_dist_bytes(c->n_vocab);
    c->logits = malloc(sizeof(float) * (size_t)c->n_vocab * c->max_rows);
    c->scratch_mem = aligned_alloc16(sbytes);
    c->dist_mem = aligned_alloc16(dbytes);
    if (!c->logits || !c->scratch_mem || !c->dist_mem) {
        st = dsp_error(DSP_ERR_NOMEM, "no memory for the sampler (vocabulary %d)", c->n_vocab);
        dsp_ctx_destroy(c);
        return st;
    }
    dsp_sample_scratch_init(&c->scratch, c->scratch_mem, sbytes, c->n_vocab);
    dsp_sample_dist_init(&c->dist, c->dist_mem, dbytes, c->n_vocab);
    *out = c;
    return DSP_OK;
}

void dsp_ctx_destroy(dsp_ctx *c) {
    if (!c) return;
    dsp_fwd_destroy(c->fwd);
    free(c->logits);
    free(c->scratch_mem);
    free(c->dist_mem);
    free(c);
}

uint32_t dsp_ctx_n_ctx(const dsp_ctx *c) { return dsp_fwd_n_ctx(c->fwd); }

/* ---- sequences ---------------------------------------------------------------------------- */

dsp_status dsp_seq_create(dsp_ctx *c, dsp_seq **out) {
    *out = NULL;
    dsp_seq *s = calloc(1, sizeof *s);
    if (!s) return dsp_error(DSP_ERR_NOMEM, "no memory");
    s->c = c;
    s->cap = dsp_fwd_n_ctx(c->fwd);
    s->tokens = malloc(sizeof(int32_t) * s->cap);
    dsp_status st = s->tokens ? dsp_fwd_seq_init(c->fwd, &s->kv) : dsp_error(DSP_ERR_NOMEM, "no memory");
    if (st) {
        free(s->tokens);
        free(s);
        return st;
    }
    *out = s;
    return DSP_OK;
}

void dsp_seq_destroy(dsp_seq *s) {
    if (!s) return;
    dsp_kv_seq_free(dsp_fwd_kv(s->c->fwd), &s->kv);
    free(s->tokens);
    free(s);
}

size_t dsp_seq_n_cached(const dsp_seq *s) { return s->kv.n_tokens; }

/* ---- parameters --------------------------------------------------------------------------- */

dsp_gen_params dsp_gen_default_params(void) {
    dsp_gen_params p;
    memset(&p, 0, sizeof p);
    p.max_tokens = 256;
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    p.repetition_last_n = 64;
    p.logprobs = -1;
    p.mode = DSP_SPEC_BASELINE;
    p.max_draft = 4;
    p.lookup_min_n = 2;
    p.lookup_max_n = 4;
    return p;
}

const char *dsp_spec_mode_to_string(dsp_spec_mode m) {
    switch (m) {
    case DSP_SPEC_BASELINE: return "baseline";
    case DSP_SPEC_LOOKUP: return "lookup";
    case DSP_SPEC_AUTO: return "auto";
    }
    return "unknown";
}

const char *dsp_finish_to_string(dsp_finish f) {
    switch (f) {
    case DSP_FINISH_STOP: return "stop";
    case DSP_FINISH_LENGTH: return "length";
    case DSP_FINISH_CANCELLED: return "cancelled";
    default: return "none";
    }
}

dsp_status dsp_engine_sample_params(const dsp_ctx *c, const dsp_gen_params *p, dsp_sample_params *sp) {
    if (p->max_tokens <= 0) return dsp_error(DSP_ERR_INVALID_ARG, "max_tokens must be positive (got %d)", p->max_tokens);
    if (p->logprobs < -1 || p->logprobs > DSP_MAX_LOGPROBS)
        return dsp_error(DSP_ERR_INVALID_ARG, "top_logprobs must be between 0 and %d (got %d)", DSP_MAX_LOGPROBS, p->logprobs);
    *sp = dsp_sample_params_default();
    sp->temperature = p->temperature;
    sp->top_k = p->top_k;
    sp->top_p = p->top_p;
    sp->min_p = p->min_p;
    sp->presence_penalty = p->presence_penalty;
    sp->frequency_penalty = p->frequency_penalty;
    sp->repetition_penalty = p->repetition_penalty;
    sp->repetition_last_n = p->repetition_last_n;
    _Static_assert(sizeof(dsp_logit_bias) == sizeof(dsp_sample_bias), "logit bias layouts must match");
    sp->logit_bias = (const dsp_sample_bias *)p->logit_bias;
    sp->n_logit_bias = p->n_logit_bias;
    return dsp_sample_params_validate(sp, c->n_vocab);
}

/* ---- generation --------------------------------------------------------------------------- */

/* Prefill prompt[from, n) into s's KV in chunks; the logits of the last row land in c->logits.
 * The drafter (if any) observes the prompt chunk by chunk, with the chunk's hidden-state taps when
 * it asked for them (taps: (max_batch_tokens, n_taps, n_embd) then). */
static dsp_status prefill(dsp_ctx *c, dsp_seq *s, const int32_t *prompt, size_t from, size_t n, dsp_drafter *dr, float *taps) {
    int maxb = dsp_fwd_max_batch(c->fwd);
    dsp_kv_seq *seqs[1] = {&s->kv};
    size_t observed = 0;
    while (from < n) {
        int k = (int)(n - from < (size_t)maxb ? n - from : (size_t)maxb);
        int32_t *pos = c->bpos, *seq = c->bseq;
        for (int i = 0; i < k; i++) pos[i] = (int32_t)(from + (size_t)i), seq[i] = 0;
        int32_t row = k - 1;
        bool last = from + (size_t)k == n;
        int n_taps = dr && taps ? dr->n_taps : 0;
        dsp_batch b = {k, prompt + from, seq, pos, last ? 1 : 0, &row, n_taps, n_taps ? dr->tap_layers : NULL};
        dsp_status st = dsp_fwd_run(c->fwd, seqs, 1, &b, c->logits, n_taps ? taps : NULL);
        if (st) return st;
        from += (size_t)k;
        if (dr) {
            dsp_spec_commit cm = {prompt, (uint32_t)from, (uint32_t)(from - observed), 0, 0, n_taps ? taps : NULL,
                                  (uint32_t)(from - (size_t)k), n_taps ? k : 0};
            dsp_drafter_observe(dr, &cm);
            observed = from;
        }
    }
    return DSP_OK;
}

bool dsp_engine_is_eog(const dsp_model *m, int32_t tok) {
    for (int i = 0; i < m->n_eog; i++)
        if (m->eog[i] == tok) return true;
    return false;
}

typedef struct gen {
    dsp_ctx *c;
    dsp_seq *s;
    const dsp_gen_params *p;
    dsp_token_cb cb;
    void *user;
    dsp_sample_params sp;
    dsp_sample_history hist;
    dsp_rng rng;
    dsp_stop stop;
    dsp_detok_stream *detok;  /* special tokens skipped, as the whole-sequence decode does */
    char *out;                /* the current event's text: at most two decoder outputs plus held-back stop text */
    size_t n_out, out_cap;
    dsp_gen_result *res;
} gen;

static void out_append(gen *g, const char *p, size_t n) {
    if (n > g->out_cap - g->n_out) n = g->out_cap - g->n_out; /* cannot happen: out is sized for the worst case */
    memcpy(g->out + g->n_out, p, n);
    g->n_out += n;
}

/* Pass text through the stop matcher into g->out; true if a stop string was hit. */
static bool out_text(gen *g, const char *text, size_t n) {
    const char *e;
    size_t ne;
    bool hit = dsp_stop_feed(&g->stop, text, n, &e, &ne);
    out_append(g, e, ne);
    return hit;
}

/* Decide what one sampled token emits and whether generation ends there. */
static dsp_finish emit_token(gen *g, int32_t tok, const float *raw_logits) {
    const dsp_model *m = g->c->m;
    dsp_token_event ev;
    dsp_token_logprob top[DSP_MAX_LOGPROBS];
    memset(&ev, 0, sizeof ev);
    ev.token = tok;
    if (g->p->logprobs >= 0) {
        dsp_sample_logprob ch, tp[DSP_MAX_LOGPROBS];
        int32_t n_top = 0;
        if (dsp_sample_logprobs(raw_logits, g->c->n_vocab, NULL, DSP_SAMPLE_LOGPROBS_RAW, tok, g->p->logprobs, &ch, tp, &n_top) == DSP_OK) {
            ev.chosen.token = ch.token;
            ev.chosen.logprob = ch.logprob;
            for (int i = 0; i < n_top; i++) top[i].token = tp[i].token, top[i].logprob = tp[i].logprob;
            ev.n_top = n_top;
            ev.top = top;
        }
    }
    bool eog = !g->p->ignore_eos && dsp_engine_is_eog(m, tok);
    dsp_finish fin = DSP_FINISH_NONE;
    if (eog) fin = DSP_FINISH_STOP;
    else if (g->res->n_generated >= (size_t)g->p->max_tokens) fin = DSP_FINISH_LENGTH;
    else if (g->s->n_tokens >= dsp_fwd_n_ctx(g->c->fwd)) fin = DSP_FINISH_LENGTH; /* the last token is never fed */
    g->n_out = 0;
    const char *text;
    size_t n_text;
    bool hit = false;
    if (!eog && dsp_detok_stream_feed(g->detok, tok, &text, &n_text) == DSP_OK) hit = out_text(g, text, n_text);
    if (!hit && fin != DSP_FINISH_NONE) { /* the end: a trailing incomplete character becomes U+FFFD */
        if (dsp_detok_stream_flush(g->detok, &text, &n_text) == DSP_OK) hit = out_text(g, text, n_text);
        if (!hit) {
            dsp_stop_flush(&g->stop, &text, &n_text);
            out_append(g, text, n_text);
        }
    }
    if (hit) fin = DSP_FINISH_STOP;
    ev.text = g->out;
    ev.text_len = g->n_out;
    if (g->cb && !g->cb(&ev, g->user) && fin == DSP_FINISH_NONE) fin = DSP_FINISH_CANCELLED;
    return fin;
}

static dsp_status spec_params_validate(const dsp_gen_params *p) {
    if (p->mode != DSP_SPEC_BASELINE && p->mode != DSP_SPEC_LOOKUP && p->mode != DSP_SPEC_AUTO)
        return dsp_error(DSP_ERR_INVALID_ARG, "mode: unknown speculation mode %d", (int)p->mode);
    if (p->max_draft < 1 || p->max_draft > DSP_MAX_DRAFT)
        return dsp_error(DSP_ERR_INVALID_ARG, "max_draft must be between 1 and %d (got %d)", DSP_MAX_DRAFT, p->max_draft);
    if (p->lookup_min_n < 1 || p->lookup_max_n < p->lookup_min_n || p->lookup_max_n > 16)
        return dsp_error(DSP_ERR_INVALID_ARG, "lookup n-gram sizes: need 1 <= lookup_min_n (%d) <= lookup_max_n (%d) <= 16", p->lookup_min_n,
                         p->lookup_max_n);
    return DSP_OK;
}

dsp_status dsp_generate(dsp_ctx *c, dsp_seq *s, const int32_t *prompt, size_t n_prompt, const dsp_gen_params *p, dsp_token_cb cb,
                        void *user, dsp_gen_result *res) {
    return dsp_engine_generate(c, s, prompt, n_prompt, p, NULL, DSP_SPEC_FAULT_NONE, cb, user, res);
}

dsp_status dsp_engine_generate(dsp_ctx *c, dsp_seq *s, const int32_t *prompt, size_t n_prompt, const dsp_gen_params *p,
                               dsp_drafter *drafter, dsp_spec_fault fault, dsp_token_cb cb, void *user, dsp_gen_result *res) {
    dsp_gen_result dummy;
    if (!res) res = &dummy;
    memset(res, 0, sizeof *res);
    dsp_gen_params defaults = dsp_gen_default_params();
    if (!p) p = &defaults;
    gen g;
    memset(&g, 0, sizeof g);
    g.c = c, g.s = s, g.p = p, g.cb = cb, g.user = user, g.res = res;
    dsp_status st = dsp_engine_sample_params(c, p, &g.sp);
    if (st) return st;
    if ((st = spec_params_validate(p))) return st;
    uint32_t n_ctx = dsp_fwd_n_ctx(c->fwd);
    if (n_prompt == 0) return dsp_error(DSP_ERR_INVALID_ARG, "the prompt is empty");
    if (n_prompt >= n_ctx)
        return dsp_error(DSP_ERR_RANGE, "the prompt is %zu tokens, which does not fit the context of %u tokens (room is needed for at least one new token)",
                         n_prompt, n_ctx);
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= c->n_vocab)
            return dsp_error(DSP_ERR_INVALID_ARG, "prompt token %zu: id %d out of range (vocabulary %d)", i, prompt[i], c->n_vocab);
    int n_stop = 0;
    while (n_stop < DSP_MAX_STOP && p->stop[n_stop]) n_stop++;
    if ((st = dsp_stop_init(&g.stop, p->stop, n_stop))) return st;

    /* per-request memory: the drafter (index sized from the context), its q rows and taps */
    dsp_drafter *own = NULL, *dr = drafter;
    float *q = NULL, *taps = NULL;
    if (!dr && p->mode != DSP_SPEC_BASELINE) {
        dsp_lookup_params lp = {p->lookup_min_n, p->lookup_max_n, p->max_draft, n_ctx, true};
        if ((st = dsp_lookup_create(&lp, &own))) {
            dsp_stop_free(&g.stop);
            return st;
        }
        dr = own;
    }
    if (dr) dsp_drafter_reset(dr);
    int tap_rows = dsp_fwd_max_batch(c->fwd) > DSP_MAX_DRAFT + 1 ? dsp_fwd_max_batch(c->fwd) : DSP_MAX_DRAFT + 1;
    if (dr && dr->supplies_q) q = malloc(sizeof(float) * (size_t)c->n_vocab * DSP_MAX_DRAFT);
    if (dr && dr->n_taps > 0) taps = malloc(sizeof(float) * (size_t)tap_rows * (size_t)dr->n_taps * (size_t)dsp_fwd_n_embd(c->fwd));
    g.out_cap = 2 * (3 * dsp_tok_max_piece_len(c->m->tok) + 8) + g.stop.cap;
    g.out = malloc(g.out_cap);
    if (!g.out || (dr && dr->supplies_q && !q) || (dr && dr->n_taps > 0 && !taps) ||
        (st = dsp_detok_stream_create(c->m->tok, DSP_DETOKENIZE_SKIP_SPECIAL, &g.detok))) {
        if (!st) st = dsp_error(DSP_ERR_NOMEM, "no memory");
        free(g.out), free(q), free(taps);
        dsp_drafter_destroy(own);
        dsp_stop_free(&g.stop);
        return st;
    }

    /* reuse the common prefix of the cached tokens; at least one prompt token is recomputed so
     * that its logits exist */
    size_t cached = s->kv.n_tokens < s->n_tokens ? s->kv.n_tokens : s->n_tokens, lcp = 0;
    while (lcp < cached && lcp < n_prompt && s->tokens[lcp] == prompt[lcp]) lcp++;
    if (lcp == n_prompt) lcp--;
    dsp_kv_seq_truncate(dsp_fwd_kv(c->fwd), &s->kv, (uint32_t)lcp);
    memcpy(s->tokens, prompt, n_prompt * sizeof *prompt);
    s->n_tokens = n_prompt;
    res->n_prompt = n_prompt;
    res->n_cached = lcp;

    double t0 = now_ms();
    st = prefill(c, s, s->tokens, lcp, n_prompt, dr, taps);
    double t1 = now_ms();
    res->prefill_ms = t1 - t0;
    if (st) {
        dsp_kv_seq_truncate(dsp_fwd_kv(c->fwd), &s->kv, 0);
        s->n_tokens = 0;
        goto done;
    }
    dsp_sample_history_init(&g.hist, s->tokens, s->cap, (uint32_t)n_prompt);
    dsp_rng_seed(&g.rng, p->seed);

    /* The rounds. The first decides one token from the prefill logits; every later one runs the
     * target over [last token, drafts] (the last token has no KV yet), verifies, emits, and keeps
     * the KV of the last token + the accepted drafts. */
    dsp_finish fin = DSP_FINISH_NONE;
    dsp_kv_seq *seqs[1] = {&s->kv};
    const int V = c->n_vocab;
    int32_t draft[DSP_MAX_DRAFT], out[DSP_MAX_DRAFT + 1], btok[DSP_MAX_DRAFT + 1], bpos[DSP_MAX_DRAFT + 1], bseq[DSP_MAX_DRAFT + 1],
        brow[DSP_MAX_DRAFT + 1];
    for (bool first = true; fin == DSP_FINISH_NONE; first = false) {
        const uint32_t len = s->n_tokens; /* committed tokens; the KV holds len (first round) or len - 1 */
        int32_t k = 0;
        if (!first) {
            if (dr) {
                /* room: the round pushes k + 1 tokens and feeds positions up to len - 1 + k; a round
                 * emits k + 1 tokens at most, so drafting past max_tokens is wasted */
                int64_t kmax = p->max_draft;
                if ((int64_t)n_ctx - (int64_t)len - 1 < kmax) kmax = (int64_t)n_ctx - (int64_t)len - 1;
                if ((int64_t)p->max_tokens - (int64_t)res->n_generated - 1 < kmax) kmax = (int64_t)p->max_tokens - (int64_t)res->n_generated - 1;
                if (dsp_fwd_max_batch(c->fwd) - 1 < kmax) kmax = dsp_fwd_max_batch(c->fwd) - 1;
                if (kmax > 0) {
                    k = dsp_drafter_propose(dr, s->tokens, len, (int32_t)kmax, draft, q);
                    if (k < 0) k = 0;
                    if (k > kmax) k = (int32_t)kmax;
                    for (int32_t i = 0; i < k; i++)
                        if (draft[i] < 0 || draft[i] >= V) k = i; /* a drafter bug must not reach the forward */
                }
            }
            btok[0] = s->tokens[len - 1];
            for (int32_t i = 0; i <= k; i++) {
                if (i) btok[i] = draft[i - 1];
                bpos[i] = (int32_t)(len - 1) + i, bseq[i] = 0, brow[i] = i;
            }
            int n_taps = taps ? dr->n_taps : 0;
            dsp_batch b = {k + 1, btok, bseq, bpos, k + 1, brow, n_taps, n_taps ? dr->tap_layers : NULL};
            if ((st = dsp_fwd_run(c->fwd, seqs, 1, &b, c->logits, taps))) break;
        }
        int32_t n_out = 0;
        st = dsp_spec_verify(c->logits, V, k, draft, k > 0 && dr->supplies_q ? q : NULL, &g.hist, &g.sp, &g.rng, &c->scratch, &c->dist, fault,
                             out, &n_out);
        if (st) break;
        const int32_t a = n_out - 1;
        res->n_rounds++;
        res->accept_hist[n_out]++;
        if (k > 0) {
            res->n_draft_rounds++;
            res->n_drafted += (size_t)k;
            res->n_accepted += (size_t)a;
        }
        /* rollback: keep the KV of the tokens fed and accepted (positions < len + a) */
        if (s->kv.n_tokens > len + (uint32_t)a) dsp_kv_seq_truncate(dsp_fwd_kv(c->fwd), &s->kv, len + (uint32_t)a);
        /* emit one token at a time: EOS, stop strings, max_tokens and cancellation cut exactly */
        int32_t j = 0;
        for (; j < n_out; j++) {
            s->n_tokens = len + (uint32_t)j + 1;
            res->n_generated++;
            fin = emit_token(&g, out[j], c->logits + (size_t)j * (size_t)V);
            if (fin != DSP_FINISH_NONE) break;
        }
        if (fin != DSP_FINISH_NONE) {
            /* tokens decided after the cut were never emitted: drop them and their KV */
            g.hist.len = s->n_tokens;
            if (s->kv.n_tokens > s->n_tokens - 1) dsp_kv_seq_truncate(dsp_fwd_kv(c->fwd), &s->kv, s->n_tokens - 1);
            break;
        }
        if (dr) {
            dsp_spec_commit cm = {s->tokens, s->n_tokens, (uint32_t)n_out, k, a, first ? NULL : taps, len - 1, first || !taps ? 0 : a + 1};
            dsp_drafter_observe(dr, &cm);
        }
    }
    res->decode_ms = now_ms() - t1;
    res->finish = fin;
done:
    dsp_stop_free(&g.stop);
    dsp_detok_stream_destroy(g.detok);
    free(g.out);
    free(q);
    free(taps);
    dsp_drafter_destroy(own);
    return st;
}
