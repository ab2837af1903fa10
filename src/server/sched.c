/* server/sched: the request queue and the engine thread (DESIGN.md §7).
 *
 * Connection threads put requests into an inbox (FIFO). The engine thread is the only user of the
 * dsp_engine: it moves inbox requests into the engine (dsp_engine_submit), turns a connection's
 * cancel flag (client gone) or a hard stop into dsp_engine_cancel, runs rounds (dsp_engine_step)
 * while anything is in flight, and hands each event to its request: a token is appended to the
 * request's event queue under the request's mutex and wakes the connection thread; DONE ends it.
 * Batching, the prefix cache and admission under KV pressure are the engine's (engine/engine.h).
 *
 * Invariants: a request is in the inbox iff in_queue (under q_mu); inbox and engine together hold
 * one reference, dropped at DONE; `inflight` (engine thread only) links the submitted requests. */
#include "server/server.h"

#include "core/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    json_decref(r->tools.list);
    free(r->scripted);
    free(r->out.text);
    free(r->out.toks);
    free(r->out.top);
    free(r);
}

/* ---- the engine thread ------------------------------------------------------------------------- */

/* Append one decided token to r's event queue (under r->mu) and wake its connection. */
static void append_token(dsp_srv_req *r, const dsp_token_event *ev) {
    pthread_mutex_lock(&r->mu);
    bool ok = true;
    if (ev->text_len) {
        if (r->out.n_text + ev->text_len > r->out.cap_text) {
            size_t nc = (r->out.n_text + ev->text_len) * 2 + 256;
            char *nt = realloc(r->out.text, nc);
            if (nt) r->out.text = nt, r->out.cap_text = nc;
            else ok = false; /* out of memory: the text is cut, the server goes on */
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
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void finish(dsp_srv_req *r, dsp_status st, const char *msg, const dsp_gen_result *res) {
    pthread_mutex_lock(&r->mu);
    r->out.status = st;
    if (msg) snprintf(r->out.error, sizeof r->out.error, "%s", msg);
    if (res) r->out.res = *res;
    r->t_done = dsp_srv_now_ms();
    r->out.ttft_ms = r->t_first > 0 ? r->t_first - r->t_enqueued : 0;
    r->out.done = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static const char *const k_kind[] = {"chat", "completion", "messages", "responses"};

static void log_done(const dsp_srv_req *r, dsp_status st, const dsp_gen_result *res) {
    if (st) {
        fprintf(stderr, "dspark serve: %s failed: %s: %s\n", r->id, dsp_status_to_string(st), r->out.error);
        return;
    }
    double tps = res->decode_ms > 0 ? (double)res->n_generated / (res->decode_ms / 1e3) : 0;
    char spec[96] = "";
    if (res->n_draft_rounds)
        snprintf(spec, sizeof spec, " accepted %zu/%zu drafted, %.2f tok/round", res->n_accepted, res->n_drafted,
                 (double)res->n_generated / (double)res->n_rounds);
    fprintf(stderr,
            "dspark serve: %s %s%s: %zu prompt (%zu cached) + %zu completion tokens, %s, queued %.0f ms, "
            "prefill %.0f ms, decode %.0f ms (%.1f tok/s)%s\n",
            r->id, k_kind[r->kind], r->stream ? " stream" : "", res->n_prompt, res->n_cached, res->n_generated,
            dsp_finish_to_string(res->finish), r->t_started - r->t_enqueued, res->prefill_ms, res->decode_ms, tps, spec);
}

#ifdef DSP_SRV_SCRIPTED
/* Test-only (dspark_scripted): instead of submitting r, emit r->scripted as if the model had
 * generated it: its tokens one by one through the real incremental detokenizer and the same
 * append_token, then an end-of-turn token, then DONE. */
static void run_scripted(dsp_srv *s, dsp_srv_req *r) {
    dsp_gen_result res;
    memset(&res, 0, sizeof res);
    size_t n = 0, len = strlen(r->scripted);
    dsp_tokenize(s->tok, r->scripted, len, DSP_TOKENIZE_PARSE_SPECIAL, NULL, 0, &n);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    dsp_detok_stream *ds = NULL;
    res.n_prompt = r->n_prompt;
    res.finish = DSP_FINISH_STOP;
    if (!ids || dsp_tokenize(s->tok, r->scripted, len, DSP_TOKENIZE_PARSE_SPECIAL, ids, n, &n) || dsp_detok_stream_create(s->tok, 0, &ds)) n = 0;
    for (size_t i = 0; i < n; i++) {
        if ((int32_t)res.n_generated >= r->gp.max_tokens) {
            res.finish = DSP_FINISH_LENGTH;
            break;
        }
        dsp_token_event ev = {.token = ids[i]};
        dsp_detok_stream_feed(ds, ids[i], &ev.text, &ev.text_len);
        res.n_generated++, res.n_rounds++;
        append_token(r, &ev);
    }
    if (res.finish == DSP_FINISH_STOP && ds) {
        dsp_token_event ev = {.token = dsp_tokenizer_eos(s->tok)};
        dsp_detok_stream_flush(ds, &ev.text, &ev.text_len);
        res.n_generated++;
        append_token(r, &ev);
    }
    dsp_detok_stream_destroy(ds);
    free(ids);
    finish(r, DSP_OK, NULL, &res);
    log_done(r, DSP_OK, &res);
}
#endif

/* Move the inbox into the engine (under q_mu). */
static void take_inbox(dsp_srv *s, dsp_srv_req **inflight) {
    while (s->q_head) {
        dsp_srv_req *r = s->q_head;
        s->q_head = r->next;
        if (!s->q_head) s->q_tail = NULL;
        r->next = NULL;
        r->in_queue = false;
        s->q_len--;
        pthread_mutex_lock(&r->mu);
        r->t_started = dsp_srv_now_ms();
        pthread_mutex_unlock(&r->mu);
        dsp_status st = atomic_load(&s->hard_stop) ? DSP_ERR_BUSY : DSP_OK;
#ifdef DSP_SRV_SCRIPTED
        if (!st && r->scripted) {
            run_scripted(s, r);
            s->n_served++;
            dsp_srv_req_release(r);
            continue;
        }
#endif
        if (!st) st = dsp_engine_submit(s->engine, r->prompt, r->n_prompt, &r->gp, r, &r->engine_id);
        if (st) {
            finish(r, st, st == DSP_ERR_BUSY ? "the server is shutting down" : dsp_last_error(), NULL);
            log_done(r, st, NULL);
            dsp_srv_req_release(r);
            continue;
        }
        r->next = *inflight;
        *inflight = r;
        s->n_inflight++;
    }
}

/* The engine's own numbers for /metrics (metrics.c reads them under q_mu). */
static void publish_stats(dsp_srv *s) {
    dsp_engine_stats es;
    dsp_engine_get_stats(s->engine, &es);
    pthread_mutex_lock(&s->q_mu);
    s->engine_stats.kv_valid = true;
    s->engine_stats.waiting = es.waiting;
    s->engine_stats.running = es.running;
    s->engine_stats.kv_blocks_used = es.kv_blocks_used;
    s->engine_stats.kv_blocks_cached = es.kv_blocks_cached;
    s->engine_stats.kv_blocks_total = es.kv_blocks;
    s->engine_stats.prefix_hit_tokens = es.cached_tokens;
    s->engine_stats.block_tokens = es.block_tokens;
    s->engine_stats.peak_running = es.peak_running;
    s->engine_stats.rounds = es.rounds;
    s->engine_stats.forward_rows = es.forward_rows;
    s->engine_stats.forward_ms = es.forward_ms;
    s->engine_stats.host_ms = es.host_ms;
    memcpy(s->engine_stats.cost_scale, es.cost_scale, sizeof es.cost_scale);
    pthread_mutex_unlock(&s->q_mu);
}

static void *engine_main(void *arg) {
    dsp_srv *s = arg;
    dsp_srv_req *inflight = NULL; /* submitted to the engine, linked by next (this thread only) */
    publish_stats(s); /* /health and /metrics show the KV pool before the first round */
    for (;;) {
        pthread_mutex_lock(&s->q_mu);
        while (!s->q_head && !inflight && !s->q_stop) pthread_cond_wait(&s->q_cv, &s->q_mu);
        if (!s->q_head && !inflight) { /* q_stop and nothing left */
            pthread_mutex_unlock(&s->q_mu);
            break;
        }
        take_inbox(s, &inflight);
        pthread_mutex_unlock(&s->q_mu);

        bool hard = atomic_load(&s->hard_stop);
        for (dsp_srv_req *r = inflight; r; r = r->next)
            if (hard || atomic_load(&r->cancel)) dsp_engine_cancel(s->engine, r->engine_id);
        const dsp_event *ev;
        size_t n_ev = 0;
        dsp_status st = dsp_engine_step(s->engine, &ev, &n_ev);
        if (st) fprintf(stderr, "dspark serve: engine: %s\n", dsp_last_error());
        publish_stats(s);
        for (size_t i = 0; i < n_ev; i++) {
            dsp_srv_req *r = ev[i].user;
            if (ev[i].type == DSP_EVENT_TOKEN) {
                append_token(r, &ev[i].tok);
                continue;
            }
            dsp_status rst = ev[i].status;
            const char *msg = rst ? ev[i].error : NULL;
            finish(r, rst, msg, ev[i].res);
            log_done(r, rst, ev[i].res);
            if (ev[i].res) dsp_srv_metrics_finished(s, ev[i].res, r->out.ttft_ms); /* ttft_ms: written by finish, on this thread */
            for (dsp_srv_req **pp = &inflight; *pp; pp = &(*pp)->next)
                if (*pp == r) {
                    *pp = r->next;
                    break;
                }
            r->next = NULL;
            dsp_srv_req_release(r);
            pthread_mutex_lock(&s->q_mu);
            s->n_inflight--;
            s->n_served++;
            pthread_cond_broadcast(&s->idle_cv);
            pthread_mutex_unlock(&s->q_mu);
        }
        if (st) { /* the engine itself failed: end everything in flight */
            while (inflight) {
                dsp_srv_req *r = inflight;
                inflight = r->next;
                r->next = NULL;
                finish(r, st, dsp_last_error(), NULL);
                dsp_srv_req_release(r);
                pthread_mutex_lock(&s->q_mu);
                s->n_inflight--;
                pthread_cond_broadcast(&s->idle_cv);
                pthread_mutex_unlock(&s->q_mu);
            }
        }
    }
    return NULL;
}

dsp_status dsp_srv_sched_start(dsp_srv *s) {
    if (pthread_create(&s->engine_thread, NULL, engine_main, s)) return dsp_error(DSP_ERR_INTERNAL, "cannot start the engine thread");
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
    int waiting = s->q_len + (s->n_inflight > s->cfg.cp.max_batch ? s->n_inflight - s->cfg.cp.max_batch : 0);
    if (waiting >= s->cfg.max_queue) {
        int n = waiting;
        pthread_mutex_unlock(&s->q_mu);
        dsp_srv_fail(e, DSP_ERR_BUSY, NULL, "the server is busy: %d requests are already waiting (--max-queue); retry later", n);
        return DSP_ERR_BUSY;
    }
    pthread_mutex_lock(&r->mu);
    r->refs++;
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
    while (!(idle = !s->q_head && s->n_inflight == 0))
        if (pthread_cond_timedwait(&s->idle_cv, &s->q_mu, &dl)) break;
    idle = !s->q_head && s->n_inflight == 0;
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
}
