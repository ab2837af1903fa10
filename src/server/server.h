/* server/server: `dspark serve`, an OpenAI-compatible HTTP server (DESIGN.md §7).
 *
 * Threads:
 *   - libmicrohttpd runs one thread per connection. A connection thread reads the body (bounded by
 *     --max-body), parses and validates the OpenAI request (openai.c), renders the chat template
 *     and tokenizes the prompt, then enqueues a dsp_srv_req and waits on that request's own event
 *     queue (streaming: in the response's content-reader callback; non-streaming: in the access
 *     handler). While it waits it polls its socket, so a client that goes away cancels its request.
 *   - One engine thread (sched.c) owns the dsp_engine: it submits inbox requests to it, runs its
 *     rounds (continuous batching: up to --max-batch requests share each forward; a prefix cache
 *     reuses the KV of earlier requests), and appends each token event to its request's queue.
 *     A cancelled request (client gone, shutdown) stops at the next round, prefill included.
 *   - The main thread (cmd_serve.c) waits for SIGINT/SIGTERM and drives the shutdown.
 *
 * Ownership: a request is reference counted: the connection that made it and the scheduler (while
 * queued or running) each hold one reference; whichever drops the last frees it. All shared fields
 * are guarded by the request's mutex. */
#ifndef DSP_SERVER_SERVER_H
#define DSP_SERVER_SERVER_H

#include "dspark.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DSP_SRV_MAX_ALIASES 8

typedef struct dsp_srv_config {
    const char *model_path;
    const char *host;            /* "127.0.0.1" */
    int port;                    /* 8000; 0 = any free port */
    const char *api_key;         /* NULL = no authentication */
    const char *aliases[DSP_SRV_MAX_ALIASES];
    int n_aliases;
    const char *chat_template;   /* Jinja source overriding the model's (NULL = the model's) */
    const char *quantize;        /* NULL, "q8_0" or "q4_0": quantize the weights at load */
    int32_t default_max_tokens;  /* when a request gives none (2048) */
    int32_t max_tokens_cap;      /* a request asking for more gets a 400 (32768) */
    int max_queue;               /* requests waiting (not running) at most; more get a 503 */
    size_t max_body;             /* request body bytes at most; more get a 413 */
    int idle_timeout_s;          /* an idle or stalled connection is closed after this */
    double shutdown_timeout_s;   /* on SIGINT/SIGTERM in-flight requests get this long to finish */
    int max_connections;
    dsp_gen_params spec;         /* speculation for every request: mode, max_draft, dspark_threshold,
                                  * hybrid_min, draft_sample, lookup sizes (other fields unused) */
    dsp_engine_params cp;        /* max_batch, batch_tokens, kv_memory, prefix cache, device ... */
} dsp_srv_config;

void dsp_srv_config_default(dsp_srv_config *c);

/* ---- errors (errors.c): the one table from status to HTTP code and OpenAI error type ---------- */

/* Error kinds: the dsp_status values, plus those that only HTTP has. */
enum {
    DSP_SRV_ERR_AUTH = 100,      /* 401 */
    DSP_SRV_ERR_ROUTE,           /* 404 unknown route */
    DSP_SRV_ERR_MODEL,           /* 404 unknown model */
    DSP_SRV_ERR_METHOD,          /* 405 */
    DSP_SRV_ERR_TOO_LARGE,       /* 413 */
    DSP_SRV_ERR_CONTEXT,         /* 400 the prompt does not fit the context */
    DSP_SRV_ERR_JSON,            /* 400 the body is not JSON */
};

typedef struct dsp_srv_error {
    int kind;                    /* a dsp_status or DSP_SRV_ERR_* */
    char param[64];              /* the offending request field, "" if none */
    char message[512];
} dsp_srv_error;

/* Fill e and return false (so that validators can `return dsp_srv_fail(...)`). */
bool dsp_srv_fail(dsp_srv_error *e, int kind, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int dsp_srv_error_http(int kind);
/* {"error": {"message", "type", "param", "code"}} as a malloc'd JSON string. */
char *dsp_srv_error_json(const dsp_srv_error *e);

/* ---- requests -------------------------------------------------------------------------------- */

typedef enum { DSP_SRV_CHAT = 0, DSP_SRV_COMPLETION } dsp_srv_kind;
typedef enum { DSP_SRV_QUEUED = 0, DSP_SRV_RUNNING, DSP_SRV_DONE } dsp_srv_state;

/* One decided token as the HTTP side reads it. */
typedef struct dsp_srv_tok {
    int32_t id;
    float logprob;               /* valid when logprobs were asked */
    uint32_t text_end;           /* bytes of text emitted up to and including this token */
    uint32_t top_off;            /* first alternative in req->top */
    int32_t n_top;
} dsp_srv_tok;

typedef struct dsp_srv_req {
    /* set by the connection thread before enqueueing, read-only afterwards */
    char id[48];
    dsp_srv_kind kind;
    int64_t created;
    bool stream, include_usage, echo;
    bool want_logprobs;          /* chat: logprobs=true; completions: logprobs given */
    int32_t *prompt;             /* (n_prompt) token ids */
    size_t n_prompt;
    char *echo_text;             /* completions with echo: the prompt text */
    size_t echo_len;
    dsp_gen_params gp;
    dsp_req_id engine_id;        /* set by the engine thread at submit */
    char *stops[DSP_MAX_STOP];   /* owned copies that gp.stop points to */
    dsp_logit_bias *bias;        /* owned array that gp.logit_bias points to */
    size_t max_events;           /* capacity of toks: no more tokens than this can be decided */

    /* shared: guarded by mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dsp_srv_state state;
    char *text;                  /* generated text so far (n_text bytes) */
    size_t n_text, cap_text;
    dsp_srv_tok *toks;           /* (max_events) */
    size_t n_toks;
    dsp_token_logprob *top;      /* (max_events * top_n) when logprobs were asked */
    size_t n_top_used;
    dsp_status status;           /* of dsp_generate, when DONE */
    char error[512];
    dsp_gen_result res;
    double t_enqueued, t_started, t_first, t_done; /* ms, monotonic */
    int refs;
    atomic_bool cancel;          /* set by the connection (client gone) */
    struct dsp_srv_req *next;    /* queue link (guarded by the scheduler's mutex) */
    bool in_queue;               /* linked in the queue (guarded by the scheduler's mutex) */
} dsp_srv_req;

dsp_srv_req *dsp_srv_req_create(void);
/* Drop a reference; frees on the last. */
void dsp_srv_req_release(dsp_srv_req *r);

/* ---- the scheduler and engine thread (sched.c) ----------------------------------------------- */

typedef struct dsp_srv dsp_srv;

/* The server: model, engine thread, HTTP daemon. */
struct dsp_srv {
    dsp_srv_config cfg;
    dsp_model *model;
    const dsp_tokenizer *tok;
    dsp_engine *engine;          /* used by the engine thread only (after start) */
    uint32_t n_ctx;
    char model_id[256];          /* the name clients use: first alias, else the file's base name */
    char file_id[256];           /* the file's base name without .gguf (also accepted) */
    char fingerprint[64];
    char spec_json[1024];        /* {"mode": ..., "max_draft": ..., "drafter": {...} | null}: /health, /v1/models */
    char *template_src;          /* --chat-template contents */
    int64_t created;

    /* scheduler: guarded by q_mu */
    pthread_mutex_t q_mu;
    pthread_cond_t q_cv;         /* the engine thread waits for work */
    pthread_cond_t idle_cv;      /* shutdown waits for the queue to drain */
    dsp_srv_req *q_head, *q_tail; /* the inbox */
    int q_len;
    int n_inflight;              /* submitted to the engine, not yet done */
    bool q_stop;                 /* the engine thread exits when the queue is empty */
    atomic_bool draining;        /* refuse new requests (503) */
    atomic_bool hard_stop;       /* cancel whatever runs; fail whatever waits */
    pthread_t engine_thread;
    bool engine_started;
    uint64_t n_served;
    atomic_uint_fast64_t next_id;
    uint64_t id_salt;


    struct MHD_Daemon *daemon;
    atomic_int n_active;         /* generation requests whose reply is not yet sent */
    int port;                    /* the bound port */
};

dsp_status dsp_srv_sched_start(dsp_srv *s);
/* Enqueue (takes a reference). DSP_ERR_BUSY when the queue is full or the server is draining. */
dsp_status dsp_srv_sched_submit(dsp_srv *s, dsp_srv_req *r, dsp_srv_error *e);
/* The connection gave up on r: unlink it if it is still queued (dropping the queue's reference). */
void dsp_srv_sched_abandon(dsp_srv *s, dsp_srv_req *r);
/* Wait until nothing is queued or running, at most timeout_s; true if idle. */
bool dsp_srv_sched_wait_idle(dsp_srv *s, double timeout_s);
/* Fail what waits and cancel what runs, then join the engine thread. */
void dsp_srv_sched_stop(dsp_srv *s);

/* ---- OpenAI requests and responses (openai.c) ------------------------------------------------ */

/* Parse and validate a request body for kind into r (prompt tokenized, params set). */
bool dsp_srv_parse_request(dsp_srv *s, dsp_srv_kind kind, const char *body, size_t len, dsp_srv_req *r, dsp_srv_error *e);
/* The non-streaming response body (malloc'd), from a DONE request. */
char *dsp_srv_response_json(dsp_srv *s, dsp_srv_req *r);
/* Streaming: the SSE events for tokens [*tok_from, ...) and text [*text_from, ...) that are ready
 * (under r->mu), advancing the cursors. final: the request is DONE; adds the finish chunk, the
 * usage chunk when asked, and "data: [DONE]". Returns malloc'd bytes or NULL if nothing is ready. */
char *dsp_srv_stream_events(dsp_srv *s, dsp_srv_req *r, size_t *tok_from, size_t *text_from, bool *started, bool final,
                            size_t *len);
char *dsp_srv_models_json(dsp_srv *s, const char *only);
/* s->spec_json from the configuration and the engine (after the engine exists) */
void dsp_srv_spec_json(dsp_srv *s);
bool dsp_srv_model_known(dsp_srv *s, const char *name);

/* ---- HTTP (http.c) and lifecycle (server.c) ---------------------------------------------------- */

dsp_status dsp_srv_http_start(dsp_srv *s);
void dsp_srv_http_quiesce(dsp_srv *s);  /* stop accepting connections */
/* Wait (at most timeout_s) until every generation reply has been sent. */
void dsp_srv_http_flush(dsp_srv *s, double timeout_s);
void dsp_srv_http_stop(dsp_srv *s);     /* close everything; connection threads joined */

dsp_status dsp_srv_create(const dsp_srv_config *cfg, dsp_srv **out);
void dsp_srv_destroy(dsp_srv *s);
double dsp_srv_now_ms(void);

#endif
