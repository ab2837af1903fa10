/* tests/dsp_test_events.h: what the end-to-end speculation tests (test_spec_e2e.c, test_drafter.c)
 * record of a generation, event by event, and the comparison "identical output": the same token
 * ids, text in the same event boundaries, bit-identical logprobs (chosen + top 2) and the same
 * finish reason and length. Include after dsp_test.h. */
#ifndef DSP_TEST_EVENTS_H
#define DSP_TEST_EVENTS_H

#include "dspark.h"

#include <string.h>

typedef struct events {
    int32_t ids[1024];
    size_t text_off[1025]; /* event boundaries in text */
    float lp[1024][3];     /* chosen, top-1, top-2 logprob */
    int32_t top[1024][2];
    int n;
    char text[16384];
    size_t n_text;
} events;

static inline bool collect(const dsp_token_event *ev, void *user) {
    events *e = user;
    if (e->n >= 1024 || e->n_text + ev->text_len >= sizeof e->text) return false;
    e->ids[e->n] = ev->token;
    e->lp[e->n][0] = ev->chosen.logprob;
    for (int i = 0; i < 2; i++) {
        e->lp[e->n][1 + i] = i < ev->n_top ? ev->top[i].logprob : 0.0f;
        e->top[e->n][i] = i < ev->n_top ? ev->top[i].token : -1;
    }
    memcpy(e->text + e->n_text, ev->text, ev->text_len);
    e->n_text += ev->text_len;
    e->n++;
    e->text_off[e->n] = e->n_text;
    return true;
}

typedef struct run_out {
    events ev;
    dsp_gen_result r;
} run_out;

static inline void run_on(dsp_engine *e, const int32_t *p, int n, const dsp_gen_params *gp, run_out *o) {
    memset(&o->ev, 0, sizeof o->ev);
    dsp_status st = dsp_generate(e, p, (size_t)n, gp, collect, &o->ev, &o->r);
    CHECK_MSG(st == DSP_OK, "%s", dsp_last_error());
}

/* identical output, event by event; returns true if so */
static inline bool same(const run_out *a, const run_out *b, const char *what) {
    bool ok = a->ev.n == b->ev.n && !memcmp(a->ev.ids, b->ev.ids, sizeof(int32_t) * (size_t)a->ev.n) && a->ev.n_text == b->ev.n_text &&
              !memcmp(a->ev.text, b->ev.text, a->ev.n_text) &&
              !memcmp(a->ev.text_off, b->ev.text_off, sizeof(size_t) * (size_t)(a->ev.n + 1)) &&
              !memcmp(a->ev.lp, b->ev.lp, sizeof(float) * 3 * (size_t)a->ev.n) &&
              !memcmp(a->ev.top, b->ev.top, sizeof(int32_t) * 2 * (size_t)a->ev.n) && a->r.finish == b->r.finish &&
              a->r.n_generated == b->r.n_generated;
    CHECK_MSG(ok, "%s: %d tokens vs %d, text \"%.*s\" vs \"%.*s\"", what, a->ev.n, b->ev.n, (int)a->ev.n_text, a->ev.text, (int)b->ev.n_text,
              b->ev.text);
    return ok;
}

#endif
