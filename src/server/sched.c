/* server/sched: the request queue and the engine thread (DESIGN.md §7).
 *
 * The engine thread is the only user of the dsp_ctx and of the sequences. It pops requests FIFO
 * and runs each with dsp_generate on one of a few cached sequences: the one whose previous
 * tokens share the longest prefix with the new prompt (a follow-up turn of the same
 * conversation), else the least recently used. dsp_generate then recomputes only what differs.
 * The token callback appends to the request's event queue under the request's mutex and wakes
 * the connection thread; it returns false once the request is cancelled, which ends the
 * generation within one token.
 *
 * Invariants: a request is in the queue iff in_queue (under q_mu); the queue holds one
 * reference; the KV pool holds n_ctx tokens per cached sequence, so no sequence ever finds the
 * pool exhausted. */
#include "server/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct dsp_srv_slot {
    dsp_seq *seq;
    int32_t *tokens;    /* (n_ctx) what the sequence holds: last prompt + generated tokens */
    size_t n_tokens;
    uint64_t used;      /* slot_clock at last use (LRU) */
} dsp_srv_slot;

double dsp_srv_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- requests ---------------------------------------------------------------------------------- */

dsp_srv_req *dsp_srv_req_create(void) {
    dsp_srv_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->refs = 1;
    r->gp = dsp_gen_default_params();
    atomic_init(&r->cancel, false);
    return r;
}

void dsp_srv_req_release(dsp_srv_req *r) {
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left > 0) return;
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->prompt);
    free(r->echo_text);
    for (int i = 0; i < DSP_MAX_STOP; i++) free(r->stops[i]);
    free(r->bias);
    free(r->scripted);
    json_decref(r->tools.list);
    free(r->out.text);
    free(r->out.toks);
    free(r->out.top);
    free(r);
}

/* ---- the engine thread ------------------------------------------------------------------------- */

typedef struct run_state {
    dsp_srv *s;
    dsp_srv_req *r;
    dsp_srv_slot *slot;
    uint32_t n_ctx;
} run_state;

static bool on_token(const dsp_token_event *ev, void *user) {
    run_state *rs = user;
    dsp_srv_req *r = rs->r;
    if (rs->slot->n_tokens < rs->n_ctx) rs->slot->tokens[rs->slot->n_tokens++] = ev->token;
    bool ok = true;
    pthread_mutex_lock(&r->mu);
    if (ev->text_len) {
        if (r->out.n_text + ev->text_len > r->out.cap_text) {
            size_t nc = (r->out.n_text + ev->text_len) * 2 + 256;
            char *nt = realloc(r->out.text, nc);
            if (nt) r->out.text = nt, r->out.cap_text = nc;
            else ok = false; /* out of memory: end this request, not the server */
        }
        if (ok) {
            memcpy(r->out.text + r->out.n_text, ev->text, ev->text_len);
            r->out.n_text += ev->text_len;
        }
    }
    if (ok && r->out.n_toks < r->max_events) {
        dsp_srv_tok *t = &r->out.toks[r->out.n_toks++];
        t->id = ev->token;
        t->text_end = (uint32_t)r->out.n_text;
        t->logprob = ev->chosen.logprob;
        t->top_off = (uint32_t)r->out.n_top_used;
        t->n_top = 0;
        if (r->out.top && r->gp.logprobs > 0) {
            int32_t n = ev->n_top < r->gp.logprobs ? ev->n_top : r->gp.logprobs;
            memcpy(r->out.top + r->out.n_top_used, ev->top, (size_t)n * sizeof *ev->top);
            r->out.n_top_used += (size_t)n;
            t->n_top = n;
        }
    }
    if (r->t_first == 0) r->t_first = dsp_srv_now_ms();
    if (atomic_load(&r->cancel) || atomic_load(&rs->s->hard_stop)) ok = false;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return ok;
}

static size_t lcp(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    size_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

static dsp_srv_slot *pick_slot(dsp_srv *s, const dsp_srv_req *r) {
    dsp_srv_slot *best = NULL, *lru = &s->slots[0];
    size_t best_n = 0;
    for (int i = 0; i < s->cfg.cache_seqs; i++) {
        dsp_srv_slot *sl = &s->slots[i];
        size_t n = lcp(sl->tokens, sl->n_tokens, r->prompt, r->n_prompt);
        if (n > best_n) best = sl, best_n = n;
        if (sl->used < lru->used) lru = sl;
    }
    return best ? best : lru;
}

static void finish(dsp_srv_req *r, dsp_status st, const char *msg, const dsp_gen_result *res) {
    pthread_mutex_lock(&r->mu);
    r->out.status = st;
    if (msg) snprintf(r->out.error, sizeof r->out.error, "%s", msg);
    if (res) r->out.res = *res;
    r->out.ttft_ms = r->t_first > 0 ? r->t_first - r->t_enqueued : 0;
    r->out.done = true;
    r->t_done = dsp_srv_now_ms();
    r->state = DSP_SRV_DONE;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

#ifdef DSP_SRV_SCRIPTED
/* Test-only (dspark_scripted): emit r->scripted as if the model had generated it: its tokens one
 * by one through the real incremental detokenizer and the same callback, then an end-of-turn. */
static void run_scripted(dsp_srv *s, dsp_srv_req *r, run_state *rs, dsp_gen_result *res) {
    size_t n = 0, len = strlen(r->scripted);
    dsp_tokenize(s->tok, r->scripted, len, DSP_TOKENIZE_PARSE_SPECIAL, NULL, 0, &n);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    dsp_detok_stream *ds = NULL;
    res->n_prompt = r->n_prompt;
    res->finish = DSP_FINISH_STOP;
    if (!ids || dsp_tokenize(s->tok, r->scripted, len, DSP_TOKENIZE_PARSE_SPECIAL, ids, n, &n) || dsp_detok_stream_create(s->tok, 0, &ds)) n = 0;
    for (size_t i = 0; i < n; i++) {
        if ((int32_t)res->n_generated >= r->gp.max_tokens) {
            res->finish = DSP_FINISH_LENGTH;
            break;
        }
        dsp_token_event ev = {.token = ids[i]};
        dsp_detok_stream_feed(ds, ids[i], &ev.text, &ev.text_len);
        res->n_generated++, res->n_rounds++;
        if (!on_token(&ev, rs)) {
            res->finish = DSP_FINISH_CANCELLED;
            break;
        }
    }
    if (res->finish == DSP_FINISH_STOP && ds) {
        dsp_token_event ev = {.token = dsp_tokenizer_eos(s->tok)};
        dsp_detok_stream_flush(ds, &ev.text, &ev.text_len);
        res->n_generated++;
        on_token(&ev, rs);
    }
    dsp_detok_stream_destroy(ds);
    free(ids);
}
#endif

static void run_one(dsp_srv *s, dsp_srv_req *r) {
    pthread_mutex_lock(&r->mu);
    r->state = DSP_SRV_RUNNING;
    r->t_started = dsp_srv_now_ms();
    pthread_mutex_unlock(&r->mu);
    if (atomic_load(&r->cancel)) {
        finish(r, DSP_ERR_CANCELLED, "the client went away", NULL);
        return;
    }
    dsp_srv_slot *slot = pick_slot(s, r);
    slot->used = ++s->slot_clock;
    memcpy(slot->tokens, r->prompt, r->n_prompt * sizeof *r->prompt);
    slot->n_tokens = r->n_prompt;
    run_state rs = {s, r, slot, s->n_ctx};
    dsp_gen_result res;
    memset(&res, 0, sizeof res);
#ifdef DSP_SRV_SCRIPTED
    if (r->scripted) {
        run_scripted(s, r, &rs, &res);
        slot->n_tokens = 0; /* the sequence holds nothing of this */
        finish(r, DSP_OK, NULL, &res);
        return;
    }
#endif
    dsp_status st = dsp_generate(s->ctx, slot->seq, r->prompt, r->n_prompt, &r->gp, on_token, &rs, &res);
    if (st) slot->n_tokens = 0; /* the sequence was reset */
    finish(r, st, st ? dsp_last_error() : NULL, &res);
    dsp_srv_metrics_finished(s, &res, r->out.ttft_ms); /* ttft_ms: written above by this thread */

    double tps = res.decode_ms > 0 ? (double)res.n_generated / (res.decode_ms / 1e3) : 0;
    char spec[96] = "";
    if (res.n_rounds)
        snprintf(spec, sizeof spec, " accepted %zu/%zu drafted, %.2f tok/round", res.n_accepted, res.n_drafted,
                 (double)res.n_generated / (double)res.n_rounds);
    if (st)
        fprintf(stderr, "dspark serve: %s failed: %s: %s\n", r->id, dsp_status_to_string(st), r->out.error);
    else
        fprintf(stderr,
                "dspark serve: %s %s%s: %zu prompt (%zu cached) + %zu completion tokens, %s, queued %.0f ms, "
                "prefill %.0f ms, decode %.0f ms (%.1f tok/s)%s\n",
                r->id, r->kind == DSP_SRV_CHAT ? "chat" : "completion", r->stream ? " stream" : "", res.n_prompt, res.n_cached,
                res.n_generated, dsp_finish_to_string(res.finish), r->t_started - r->t_enqueued, res.prefill_ms, res.decode_ms,
                tps, spec);
}

static void *engine_main(void *arg) {
    dsp_srv *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->q_mu);
        while (!s->q_head && !s->q_stop) pthread_cond_wait(&s->q_cv, &s->q_mu);
        dsp_srv_req *r = s->q_head;
        if (!r) {
            pthread_mutex_unlock(&s->q_mu);
            break;
        }
        s->q_head = r->next;
        if (!s->q_head) s->q_tail = NULL;
        r->next = NULL;
        r->in_queue = false;
        s->q_len--;
        s->running = r;
        pthread_mutex_unlock(&s->q_mu);

        if (atomic_load(&s->hard_stop)) finish(r, DSP_ERR_BUSY, "the server is shutting down", NULL);
        else run_one(s, r);
        dsp_srv_req_release(r);

        pthread_mutex_lock(&s->q_mu);
        s->running = NULL;
        s->n_served++;
        pthread_cond_broadcast(&s->idle_cv);
        pthread_mutex_unlock(&s->q_mu);
    }
    return NULL;
}

dsp_status dsp_srv_sched_start(dsp_srv *s) {
    s->slots = calloc((size_t)s->cfg.cache_seqs, sizeof *s->slots);
    if (!s->slots) return DSP_ERR_NOMEM;
    for (int i = 0; i < s->cfg.cache_seqs; i++) {
        dsp_status st = dsp_seq_create(s->ctx, &s->slots[i].seq);
        if (st) return st;
        s->slots[i].tokens = malloc(sizeof(int32_t) * s->n_ctx);
        if (!s->slots[i].tokens) return DSP_ERR_NOMEM;
    }
    if (pthread_create(&s->engine_thread, NULL, engine_main, s)) return DSP_ERR_INTERNAL;
    s->engine_started = true;
    return DSP_OK;
}

dsp_status dsp_srv_sched_submit(dsp_srv *s, dsp_srv_req *r, dsp_srv_error *e) {
    pthread_mutex_lock(&s->q_mu);
    if (atomic_load(&s->draining) || s->q_stop) {
        pthread_mutex_unlock(&s->q_mu);
        dsp_srv_fail(e, DSP_ERR_BUSY, NULL, "the server is shutting down");
        return DSP_ERR_BUSY;
    }
    if (s->q_len >= s->cfg.max_queue) {
        int n = s->q_len;
        pthread_mutex_unlock(&s->q_mu);
        dsp_srv_fail(e, DSP_ERR_BUSY, NULL, "the server is busy: %d requests are already waiting (--max-queue); retry later", n);
        return DSP_ERR_BUSY;
    }
    pthread_mutex_lock(&r->mu);
    r->refs++;
    r->state = DSP_SRV_QUEUED;
    r->t_enqueued = dsp_srv_now_ms();
    pthread_mutex_unlock(&r->mu);
    r->next = NULL;
    r->in_queue = true;
    if (s->q_tail) s->q_tail->next = r;
    else s->q_head = r;
    s->q_tail = r;
    s->q_len++;
    pthread_cond_signal(&s->q_cv);
    pthread_mutex_unlock(&s->q_mu);
    return DSP_OK;
}

void dsp_srv_sched_abandon(dsp_srv *s, dsp_srv_req *r) {
    atomic_store(&r->cancel, true);
    bool unlinked = false;
    pthread_mutex_lock(&s->q_mu);
    if (r->in_queue) {
        dsp_srv_req **pp = &s->q_head, *prev = NULL;
        while (*pp && *pp != r) prev = *pp, pp = &(*pp)->next;
        if (*pp) {
            *pp = r->next;
            if (s->q_tail == r) s->q_tail = prev;
            r->next = NULL;
            r->in_queue = false;
            s->q_len--;
            unlinked = true;
            pthread_cond_broadcast(&s->idle_cv);
        }
    }
    pthread_mutex_unlock(&s->q_mu);
    if (unlinked) {
        finish(r, DSP_ERR_CANCELLED, "the client went away", NULL);
        dsp_srv_req_release(r);
    }
}

bool dsp_srv_sched_wait_idle(dsp_srv *s, double timeout_s) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    long long ns = (long long)(timeout_s * 1e9) + dl.tv_nsec;
    dl.tv_sec += (time_t)(ns / 1000000000LL);
    dl.tv_nsec = (long)(ns % 1000000000LL);
    pthread_mutex_lock(&s->q_mu);
    bool idle;
    while (!(idle = !s->q_head && !s->running))
        if (pthread_cond_timedwait(&s->idle_cv, &s->q_mu, &dl)) break;
    idle = !s->q_head && !s->running;
    pthread_mutex_unlock(&s->q_mu);
    return idle;
}

void dsp_srv_sched_stop(dsp_srv *s) {
    atomic_store(&s->draining, true);
    atomic_store(&s->hard_stop, true);
    pthread_mutex_lock(&s->q_mu);
    s->q_stop = true;
    pthread_cond_broadcast(&s->q_cv);
    pthread_mutex_unlock(&s->q_mu);
    if (s->engine_started) pthread_join(s->engine_thread, NULL);
    s->engine_started = false;
    if (s->slots) {
        for (int i = 0; i < s->cfg.cache_seqs; i++) {
            dsp_seq_destroy(s->slots[i].seq);
            free(s->slots[i].tokens);
        }
        free(s->slots);
        s->slots = NULL;
    }
}
