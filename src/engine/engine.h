/* engine/engine: internals of dsp_engine (public API in dspark.h; DESIGN.md §1).
 *
 * Requests go through three states: WAITING (queued, FIFO), PREFILL (admitted: it has a KV
 * sequence, attached to the longest cached prefix, and feeds its prompt a chunk per round) and
 * DECODE (one token, or one token + k drafts, per round). Each round is ONE target forward over
 * every running request's rows; then each request verifies/samples, emits, rolls its KV back to
 * what it committed and publishes its full committed blocks to the prefix cache. A finished or
 * cancelled request leaves in the same round and its slot is refilled at the next round.
 *
 * Chunked prefill next to decodes: while requests are decoding, a round's prefill rows are capped
 * so that the round costs at most itl_factor (--prefill-itl, default DSP_ENGINE_ITL_FACTOR) times a
 * round of one row per decoding request, from the measured cost profile when the engine has one
 * (the server measures it at start), else from the engine's online fit of round time against
 * rows; so that prefill always progresses, a chunk has at least one row (with the profile) or
 * DSP_ENGINE_MIN_CHUNK rows (with the fit). Alone, a prefill takes the whole --batch-tokens budget.
 * Drafts share that budget (draft.c): while a prompt is pending, --max-draft auto counts the chunk
 * the budget leaves next to the decoding rows (not the whole prompt) and verifies at most all but
 * one of its rows in drafts, so a round stays within the budget whenever its decoding rows alone do
 * (drafts come back once the prefill is done); a fixed --max-draft N is not limited.
 *
 * KV admission control: a request is admitted only when the blocks it may still need (prompt +
 * max_tokens, capped by the context) fit in what is free or evictable after the promises made to
 * the requests already running. So a running request never finds the pool exhausted and is
 * never preempted; waiting requests wait. A request that could not fit even in an empty pool is
 * refused at submit. */
#ifndef DSP_ENGINE_ENGINE_H
#define DSP_ENGINE_ENGINE_H

#include "dspark.h"
#include "engine/stop.h"
#include "model/forward.h"
#include "sample/rng.h"
#include "sample/sample.h"
#include "spec/block.h"
#include "spec/cost.h"
#include "spec/spec.h"
#include "tok/tok.h"

#define DSP_ENGINE_ITL_FACTOR 1.5
#define DSP_ENGINE_MIN_CHUNK 8

typedef enum { DSP_REQ_WAITING = 0, DSP_REQ_PREFILL, DSP_REQ_DECODE } dsp_req_state;

/* Kinds of decode-only rounds, calibrated apart by --max-draft auto (draft.c): no drafts, drafts
 * from a host drafter (prompt lookup) only, the block drafter ran. */
typedef enum { DSP_ROUND_PLAIN = 0, DSP_ROUND_LOOKUP, DSP_ROUND_BLOCK, DSP_ROUND_KINDS } dsp_round_kind;

/* who drafted a request's block this round */
typedef enum { DSP_SRC_NONE = 0, DSP_SRC_DRAFTER, DSP_SRC_BLOCK } dsp_draft_src;

typedef struct dsp_req {
    dsp_req_id id;
    void *user;
    dsp_req_state state;
    bool cancel;                 /* dsp_engine_cancel asked; acted on at the next round */
    dsp_gen_params p;            /* stop / logit_bias point into this request's own copies */
    char *stop_copy[DSP_MAX_STOP];
    dsp_logit_bias *bias_copy;
    int32_t *tokens;             /* (n_ctx) prompt + generated */
    uint32_t n_tokens, n_prompt;
    uint32_t need_blocks;        /* KV blocks this request may hold at most (admission promise) */
    dsp_kv_seq kv;
    /* sampling */
    dsp_sample_params sp;
    dsp_sample_history hist;
    dsp_rng rng;
    dsp_stop stop;
    dsp_detok_stream *detok;
    /* speculation */
    dsp_spec_mode mode;          /* resolved (never auto) */
    dsp_drafter *drafter;        /* per-request drafter: lookup (lookup, hybrid) or a test's; NULL: none */
    bool own_drafter;
    bool block;                  /* drafts with the engine's block drafter (dflash, dspark, hybrid) */
    bool pick;                   /* mode auto with a block drafter: lookup, block or nothing, chosen each round */
    uint32_t no_block_rounds;    /* (pick) decode rounds since the block drafter was last chosen */
    bool ctx_dropped;            /* (auto) the block drafter was given up: no context step, no more published blocks */
    /* (lazy context step, draft.c) the taps of committed decode rows whose context step waits for the
     * request's next block draft: ctx_pend rows at positions ctx_pos0.. (consecutive) */
    dsp_buf *ctx_taps;
    int32_t ctx_pend;
    uint32_t ctx_pos0;
    float *q;                    /* (DSP_MAX_DRAFT, n_vocab) when the drafts come with their distribution */
    uint32_t observed;           /* tokens the drafter has seen */
    int32_t draft[DSP_MAX_DRAFT];
    int32_t k;                   /* drafts in this round's block */
    int32_t n_prop;              /* drafts proposed this round before the caps (traces) */
    dsp_draft_src src;           /* who drafted this round */
    bool sampled;                /* this round's drafts were sampled from q (rejection sampling) */
    int bslot;                   /* this round's index in the engine's block requests, -1: none */
    dsp_accept acc[DSP_ACCEPT_BUCKETS]; /* acceptance estimates (--max-draft auto): [0] the block drafter or a
                                  * test's drafter, [1..] prompt lookup by match length (dsp_accept_bucket) */
    int acc_b;                   /* this round's bucket */
    dsp_rng drng;                /* the block drafter's sampling stream (draft_sample) */
    uint32_t prev_block_pos;     /* the anchor position of the last traced block draft (ctx_rows) */
    int row0, n_rows, logit0;    /* this round's rows in the batch and in the logits */
    /* this round's verification when it ran on the host pool (verify_all in engine.c) */
    bool verified;
    dsp_status vst;
    int32_t vn, vout[DSP_MAX_DRAFT + 1];
    /* this round's events: texts and top logprobs, (DSP_MAX_DRAFT + 1) slots each */
    char *evtext;
    size_t evtext_cap, evtext_used, out_cap;
    dsp_token_logprob *evtop;
    dsp_gen_result res;
    double t_submit, t_admit, t_first;
    char error[256];
    struct dsp_req *next;        /* waiting queue link */
} dsp_req;

/* the verifier's signature (dsp_spec_verify) */
typedef dsp_status (*dsp_engine_verify_fn)(const float *logits, int32_t n_vocab, int32_t k, const int32_t *draft, const float *q,
                                           dsp_sample_history *h, const dsp_sample_params *sp, dsp_rng *rng, dsp_sample_scratch *s,
                                           dsp_sample_dist *d, int32_t *out, int32_t *n_out);

struct dsp_engine {
    dsp_model *m;
    dsp_engine_verify_fn verify; /* dsp_spec_verify; tests/test_drafter.c swaps in a wrong rule to show its test can fail */
    dsp_backend *be;
    dsp_fwd *fwd;
    dsp_kv_pool *kv;
    int n_vocab, n_embd;
    uint32_t n_ctx;
    int max_batch, batch_tokens, max_rows;
    float *logits;               /* (max_rows, n_vocab) */
    int32_t *argmax;             /* (max_rows): the rows' greedy tokens, in rounds where every request
                                  * is plain greedy without logprobs (then no logits are read) */
    bool argmax_round;           /* this round used argmax instead of logits */
    float *taps;                 /* (batch_tokens, DSP_SPEC_MAX_TAPS, n_embd) once a request wants host taps */
    void *scratch_mem, *dist_mem;
    dsp_sample_scratch scratch;
    dsp_sample_dist dist;
    /* the decoding requests' verification spread over host threads: the backend's CPU pool or
     * the engine's own (GPU), a sampler scratch per thread, the round's requests */
    struct dsp_pool *host_pool, *own_pool;
    int n_vt;                    /* threads with a scratch (0: verification stays serial) */
    void **vmem;
    dsp_sample_scratch *vs;
    dsp_sample_dist *vd;
    dsp_req **vreqs;
    dsp_req *wait_head, *wait_tail;
    uint32_t n_waiting;
    dsp_req **running;           /* (max_batch), in admission order */
    int n_running;
    dsp_req_id next_id;
    /* the round's batch */
    int32_t *btok, *bpos, *bseq, *brow;   /* (batch_tokens) */
    dsp_kv_seq **bseqs;                   /* (max_batch) */
    int32_t tap_layers[DSP_SPEC_MAX_TAPS];
    int n_taps;
    /* the block drafter (draft.c) */
    dsp_block_drafter *bd;       /* NULL: none */
    const dsp_block_info *bdi;
    dsp_block_req *breqs;        /* (max_batch) this round's block drafts */
    int max_breqs;               /* requests per dsp_block_draft call */
    /* the lazy context step (draft.c dsp_engine_ctx_keep): decode rows' context step runs just before
     * the request's next block draft, over its committed rows only (the CPU backend) */
    bool lazy_ctx;
    dsp_buf *ctx_stage;          /* (batch_tokens rows of taps) the rows of one context step */
    int32_t *ctx_tok, *ctx_pos, *ctx_seq; /* (batch_tokens) */
    dsp_kv_seq **ctx_seqs;       /* (max_batch) */
    dsp_req **ctx_reqs;          /* (max_batch) the requests of a flush */
    dsp_cost_req *creqs;         /* (max_batch) --max-draft auto's choice */
    dsp_spec_profile prof;
    bool have_prof;
    double round_draft_ms;       /* this round's drafter time, per drafted request */
    dsp_accept acc_pool[DSP_ACCEPT_BUCKETS]; /* every request's acceptance, pooled: new requests' prior */
    double host_ms;              /* a decoding round's host time outside the forward and the block
                                  * drafter (lookup, verification, emission), exponentially averaged
                                  * with a bounded step (dsp_engine_host_step);
                                  * --max-draft auto counts it in every round's time */
    double round_block_ms;       /* this round's block drafter time (0: it did not run) */
    double profile_ms;           /* time spent measuring the cost profile (dsp_engine_profile): a
                                  * round that measured it leaves that time out of its host time */
    int round_nb;                /* requests it drafted for */
    /* --max-draft auto's calibration (draft.c dsp_engine_calibrate): per kind of decode-only round,
     * the measured round time and what the profile predicted for it, exponentially averaged */
    double cal_act[DSP_ROUND_KINDS], cal_pred[DSP_ROUND_KINDS];
    double cal_act_all, cal_pred_all; /* the same over every decode-only round */
    bool no_calibration;         /* (tests with a synthetic profile) the profile as is */
    bool admit_block;            /* (tests) mode auto keeps the block drafter at admission, whatever it costs */
    /* the round's events */
    dsp_event *ev;
    size_t n_ev, ev_cap;
    dsp_req **done;              /* (max_batch + waiting cancelled) requests to free after the events are read */
    size_t n_done, done_cap;
    dsp_engine_stats st;
    /* round cost model: ms ~ a + b * rows, fitted online (exponentially weighted least squares) to
     * keep prefill chunks next to running decodes small enough that their streams do not stall */
    double fit_w, fit_x, fit_y, fit_xx, fit_xy;
    double itl_factor; /* the prefill budget next to decodes (prefill_budget) */
};

/* Submit with an explicit drafter (tests: drafters that supply q or want taps). The caller keeps
 * ownership of the drafter, which is reset first and must outlive the request. NULL: the drafter
 * p->mode asks for. */
dsp_status dsp_engine_submit_drafter(dsp_engine *e, const int32_t *prompt, size_t n_prompt, const dsp_gen_params *p, dsp_drafter *drafter,
                                     void *user, dsp_req_id *id);
/* end-of-generation token (eos, eot, <|im_end|>, ...) */
bool dsp_engine_is_eog(const dsp_model *m, int32_t tok);

/* ---- drafting (draft.c) ---- */

/* Load and attach the block drafter of p->draft_model (after the forward exists). */
dsp_status dsp_engine_draft_init(dsp_engine *e, const char *path, int32_t draft_vocab);
/* KV bytes per token the drafter adds (engine sizing), 0 without one. */
uint64_t dsp_engine_draft_kv_bytes(const dsp_block_drafter *bd, uint64_t kv_elem);
/* Submit-time checks and setup of r's speculation (mode, drafter, q, RNG). */
dsp_status dsp_engine_draft_setup(dsp_engine *e, dsp_req *r, dsp_drafter *drafter);
/* Positions past the committed length a request may write (the drafter's block): KV promise. */
uint32_t dsp_engine_draft_slack(const dsp_engine *e, const dsp_req *r);
/* Before the layout: every decoding request's drafts for this round (r->k, r->draft). */
dsp_status dsp_engine_draft_round(dsp_engine *e);
/* Rows a round with decode_rows decoding rows (n_decoding requests) may take in total, prefill
 * chunks included, the first prefill waiting at position pos (engine.c; at least decode_rows + 1) */
int dsp_engine_prefill_budget(const dsp_engine *e, int decode_rows, int n_decoding, uint32_t pos);
/* The round's target forward plus, with block_ctx, the block drafter's context step over the same
 * rows (a request among them may draft with it; the cost profile's forwards pass DSP_CTX_ALL: they
 * time what a drafting round costs); DSP_CTX_LAZY (a round with e->lazy_ctx): the step runs now over
 * the prefill rows only, decode rows keep their taps (dsp_engine_ctx_keep); with argmax, only the
 * rows' argmax comes back (e->argmax), not their logits. */
typedef enum { DSP_CTX_NONE, DSP_CTX_ALL, DSP_CTX_LAZY } dsp_ctx_mode;
dsp_status dsp_engine_forward(dsp_engine *e, int n, int n_seqs, int n_logits, bool host_taps, bool argmax, dsp_ctx_mode block_ctx);
/* Lazy context step: after r's verification, keep the taps of its committed rows (rows 0..n_commit-1
 * of its block, positions pos0..) for the context step of its next block draft; flushes first when
 * they would not fit. */
dsp_status dsp_engine_ctx_keep(dsp_engine *e, dsp_req *r, uint32_t pos0, int32_t n_commit);
/* The length up to which r's KV holds the block drafter's K/V too (publishing stops there). */
uint32_t dsp_engine_ctx_len(const dsp_req *r, uint32_t committed);
/* r may draft with the engine's block drafter (a block mode, or auto with one): its rows go through
 * the drafter's context step (in their round, or lazily before its next block draft), and its prefix
 * blocks are cached under DSP_KV_SALT_BLOCK_CTX */
bool dsp_engine_block_ctx(const dsp_req *r);
#define DSP_KV_SALT_BLOCK_CTX 0x426c6f636bull /* "Block": cached blocks that hold the block drafter's K/V */
/* After a decode-only round with a cost profile: `rows` rows in the forward, `extra_keys` keys
 * beyond the profile's context, `drafted` whether any row was a draft, `ms` the whole round's
 * measured time. Call it before host_ms takes the round in: the prediction uses the host time the
 * round's choice assumed. */
void dsp_engine_calibrate(dsp_engine *e, int rows, double extra_keys, bool drafted, double ms);
/* the host-time average (host_ms) after a decoding round's host time and forward time (draft.c) */
double dsp_engine_host_step(double avg, double host, double fwd_ms);
/* A kind's measured / predicted round time (1 before any was measured). */
double dsp_engine_cost_scale(const dsp_engine *e, dsp_round_kind k);
/* After r's verification: acceptance statistics, the trace, how many were kept. emitted: tokens
 * of out actually committed (a stop can cut the round). */
void dsp_engine_draft_done(dsp_engine *e, dsp_req *r, int32_t k, const int32_t *out, int32_t n_out, int32_t emitted);

#endif
