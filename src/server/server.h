/* server/server: `dspark serve`, an OpenAI- and Anthropic-compatible HTTP server (DESIGN.md §7).
 *
 * Files: door.c (accept, limits, request heads), http.c (libmicrohttpd routing, replies, SSE),
 * openai.c (Chat Completions / Completions requests and responses, shared JSON helpers),
 * anthropic.c (Messages), responses.c (Responses), tools.c (tool calls and reasoning, for all
 * three chat APIs), errors.c (status -> HTTP code and error object), metrics.c, page.c (the chat
 * page), sched.c (the engine thread), server.c (lifecycle).
 *
 * Threads:
 *   - The front door (door.c) accepts every connection and waits, in one thread for all of them,
 *     until a connection has sent a whole request head (or its --request-timeout passes); it
 *     answers bad heads, /health and everything while draining itself, and hands the rest to
 *     libmicrohttpd.
 *   - libmicrohttpd runs one thread per connection handed to it. A connection thread reads the body (bounded by
 *     --max-body), parses and validates the request in its API's shape, renders the chat template
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

#include <jansson.h>

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
    int idle_timeout_s;          /* a connection whose reply stalls (client not reading) is closed after this */
    int request_timeout_s;       /* a request's head and body must arrive within this */
    double keepalive_s;          /* an SSE comment when a stream has had nothing to send this long (15) */
    double shutdown_timeout_s;   /* on SIGINT/SIGTERM in-flight requests get this long to finish */
    int max_connections;         /* open at most (waiting for a request + being served) */
    int max_connections_per_client; /* from one address at most */
    bool no_thinking;            /* enable_thinking defaults to false (--no-thinking) */
    dsp_gen_params spec;         /* speculation every request starts from: mode, max_draft, dspark_threshold,
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
    DSP_SRV_ERR_HTTP,            /* 400 malformed HTTP (request line, headers, Content-Length) */
    DSP_SRV_ERR_TIMEOUT,         /* 408 the request did not arrive in time */
    DSP_SRV_ERR_URI_TOO_LONG,    /* 414 */
    DSP_SRV_ERR_TOO_MANY,        /* 429 too many connections from one client */
    DSP_SRV_ERR_HEADERS_TOO_LARGE, /* 431 */
    DSP_SRV_ERR_HTTP_VERSION,    /* 505 */
};

typedef struct dsp_srv_error {
    int kind;                    /* a dsp_status or DSP_SRV_ERR_* */
    char param[64];              /* the offending request field, "" if none */
    size_t ctx_tokens, ctx_limit; /* DSP_SRV_ERR_CONTEXT: the prompt's tokens, the most that fit */
    char message[512];
} dsp_srv_error;

/* Fill e and return false (so that validators can `return dsp_srv_fail(...)`). */
bool dsp_srv_fail(dsp_srv_error *e, int kind, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int dsp_srv_error_http(int kind);
/* {"error": {"message", "type", "param", "code"}} as a malloc'd JSON string. */
char *dsp_srv_error_json(const dsp_srv_error *e);

/* ---- requests -------------------------------------------------------------------------------- */

/* The API a request came in through: its request shape, response shape and error shape. */
typedef enum { DSP_SRV_CHAT = 0, DSP_SRV_COMPLETION, DSP_SRV_MESSAGES, DSP_SRV_RESPONSES } dsp_srv_kind;

/* ---- tools and reasoning (tools.c) ------------------------------------------------------------ */

/* How a chat template's model writes tool calls (detected from the template's source). */
typedef enum {
    DSP_SRV_TOOLS_NONE = 0,      /* the template never reads `tools` */
    DSP_SRV_TOOLS_HERMES,        /* <tool_call>{json}</tool_call> */
    DSP_SRV_TOOLS_LLAMA3,        /* {"name", "parameters"} (optionally after <|python_tag|>) */
    DSP_SRV_TOOLS_MISTRAL,       /* [TOOL_CALLS][{...}] */
    DSP_SRV_TOOLS_GENERIC,       /* reads `tools`, syntax unknown: hermes tags or bare JSON */
} dsp_srv_tool_family;

typedef struct dsp_srv_tools {
    json_t *list;                /* [{"type": "function", "function": {...}}] for the template; NULL = none */
    bool active;                 /* the model sees tools and its output is parsed for calls */
    bool required;               /* tool_choice required or named: the reply starts with a call opener */
    bool single;                 /* parallel_tool_calls false: the first call only */
    char named[72];              /* tool_choice names this function ("" = any) */
} dsp_srv_tools;

typedef struct dsp_srv_call {
    char id[48];                 /* the model's (mistral) or "" until assigned */
    char *name;
    char *args;                  /* JSON text */
} dsp_srv_call;

typedef struct dsp_srv_calls {
    dsp_srv_call *v;
    int n;
} dsp_srv_calls;

/* Byte ranges of a reply (opener + generated text): reasoning [r0, r1), content [c0, c1), the tool
 * call region from `calls` (== length when none). While streaming, ranges stop short of anything
 * still undecided. */
typedef struct dsp_srv_parts {
    size_t r0, r1, c0, c1, calls;
    bool in_reasoning;
} dsp_srv_parts;

dsp_srv_tool_family dsp_srv_tool_family_of(const char *tmpl, size_t n);
const char *dsp_srv_tool_family_name(dsp_srv_tool_family f);
void dsp_srv_tool_call_id(dsp_srv_tool_family f, uint64_t seed, int index, char *out, size_t cap);
struct dsp_srv;
/* The request shapes of tools and tool_choice. */
enum { DSP_SRV_DIALECT_CHAT = 0, DSP_SRV_DIALECT_RESPONSES, DSP_SRV_DIALECT_ANTHROPIC };
struct dsp_srv_req;
/* tools, tool_choice (and parallel_tool_calls) of a request in that dialect into r->tools. */
bool dsp_srv_tools_parse(struct dsp_srv *s, json_t *root, int dialect, struct dsp_srv_req *r, dsp_srv_error *e);
/* Add one function definition ({name, description, parameters}) to t, checked. */
bool dsp_srv_tools_add(dsp_srv_tools *t, json_t *fn_def, const char *pname, dsp_srv_error *e);
struct dsp_srv;
/* After all tools are added: apply tool_choice ("auto", "none", "required" or NULL) / named. */
bool dsp_srv_tools_finish(struct dsp_srv *s, dsp_srv_tools *t, const char *choice, const char *named, dsp_srv_error *e);
void dsp_srv_tools_prefix(const struct dsp_srv *s, const dsp_srv_tools *t, char *out, size_t cap);
/* An assistant tool call for the template: {id, type, function: {name, arguments (object)}}. */
json_t *dsp_srv_tool_call_msg(const char *id, const char *name, json_t *args);
bool dsp_srv_parse_calls(dsp_srv_tool_family f, const char *p, size_t n, dsp_srv_calls *cs);
void dsp_srv_calls_free(dsp_srv_calls *cs);

/* One decided token as the HTTP side reads it. */
typedef struct dsp_srv_tok {
    int32_t id;
    float logprob;               /* valid when logprobs were asked */
    uint32_t text_end;           /* bytes of text emitted up to and including this token */
    uint32_t top_off;            /* first alternative in req->top */
    int32_t n_top;
} dsp_srv_tok;

/* What a request produced: written by the engine thread under the request's mutex; read by the
 * connection thread from a copy (a stream's mirror, the stream's out_sync in http.c) so that no JSON is built
 * while the engine waits for the mutex. toks and top are allocated once (max_events) and their
 * entries below n_toks never change again, so a copy shares them. */
typedef struct dsp_srv_out {
    char *text;                  /* generated text so far (n_text bytes) */
    size_t n_text, cap_text;
    dsp_srv_tok *toks;           /* (max_events) */
    size_t n_toks;
    dsp_token_logprob *top;      /* (max_events * top_n) when logprobs were asked */
    size_t n_top_used;
    bool done;                   /* the fields below are final */
    dsp_status status;           /* of the generation, when done */
    char error[512];
    dsp_gen_result res;
    double ttft_ms;              /* enqueued -> first token, when done */
} dsp_srv_out;

typedef struct dsp_srv_req {
    /* set by the connection thread before enqueueing, read-only afterwards */
    char id[48];
    dsp_srv_kind kind;
    int64_t created;
    char model[256];             /* the model name the client asked for (echoed by Anthropic/Responses) */
    dsp_srv_tools tools;
    bool think;                  /* split <think>...</think> into reasoning */
    bool think_start;            /* the prompt opened <think> already: the reply starts inside it */
    char prefix[160];            /* the reply's forced start (a tool call opener), part of the text parsed */
    bool count_only;             /* count_tokens: tokenize, never generate */
    char *scripted;              /* dspark_scripted (tests) only: the reply to emit instead of generating */
    size_t prefix_len;
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
    dsp_srv_out out;             /* what the engine produced so far */
    double t_enqueued, t_started, t_first, t_done; /* ms, monotonic */
    int refs;
    atomic_bool cancel;          /* set by the connection (client gone) */
    struct dsp_srv_req *next;    /* queue link (guarded by the scheduler's mutex) */
    bool in_queue;               /* linked in the queue (guarded by the scheduler's mutex) */
} dsp_srv_req;

dsp_srv_req *dsp_srv_req_create(void);
/* Split a chat reply p[0..n) (the request's prefix + generated text) into its parts. */
void dsp_srv_split(const dsp_srv_req *r, const struct dsp_srv *s, const char *p, size_t n, bool done, dsp_srv_parts *sp);
/* Drop a reference; frees on the last. */
void dsp_srv_req_release(dsp_srv_req *r);

/* ---- metrics (metrics.c) --------------------------------------------------------------------- */

#define DSP_SRV_N_ENDPOINTS 9    /* http.c's routes: other, chat, completions, messages, count_tokens, responses, models, metrics, page */

typedef struct dsp_srv_metrics {
    atomic_uint_fast64_t requests[DSP_SRV_N_ENDPOINTS][500]; /* [endpoint][status - 100] */
    atomic_uint_fast64_t prompt_tokens, completion_tokens, cached_tokens;
    atomic_uint_fast64_t ttft[13], ttft_sum_us, ttft_count;  /* buckets + Inf */
    atomic_uint_fast64_t itl[11], itl_sum_us, itl_count;
    atomic_uint_fast64_t spec_rounds, spec_drafted, spec_accepted;
    atomic_uint_fast64_t accept_hist[DSP_MAX_DRAFT + 2];
} dsp_srv_metrics;

/* What only the engine knows, filled by the scheduler under q_mu (kv_valid once it is wired). */
typedef struct dsp_srv_engine_stats {
    bool kv_valid;
    uint32_t waiting, running;   /* requests in the engine */
    uint64_t kv_blocks_used, kv_blocks_cached, kv_blocks_total;
    uint64_t prefix_hit_tokens;
    uint32_t block_tokens, peak_running; /* KV block size; most requests that shared one round */
    uint64_t rounds, forward_rows;       /* rounds run, rows of their target forwards */
    double forward_ms, host_ms;          /* time in the forwards, and in the rounds outside them */
    double cost_scale[3];                /* --max-draft auto's calibration (dsp_engine_stats) */
} dsp_srv_engine_stats;

struct dsp_srv;
dsp_status dsp_srv_metrics_create(struct dsp_srv *s);
void dsp_srv_metrics_destroy(struct dsp_srv *s);
void dsp_srv_metrics_request(struct dsp_srv *s, int endpoint, int status);
void dsp_srv_metrics_finished(struct dsp_srv *s, const dsp_gen_result *g, double ttft_ms);
char *dsp_srv_metrics_text(struct dsp_srv *s);

/* The chat page (page.c): one self-contained HTML document, embedded. */
const char *dsp_srv_page(size_t *len);

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
    dsp_srv_tool_family tool_family; /* of the chat template in use */
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


    dsp_srv_metrics *metrics;
    dsp_srv_engine_stats engine_stats; /* guarded by q_mu */
    struct MHD_Daemon *daemon;
    struct dsp_srv_door *door;   /* accepts connections and screens request heads (door.c) */
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

/* Every API's request: id, model name, OpenAI's sampling defaults (then the API's own fields),
 * and, once the prompt is tokenized, the event queue sized for it (ready). */
void dsp_srv_req_begin(dsp_srv *s, dsp_srv_req *r, dsp_srv_kind kind);
bool dsp_srv_req_ready(dsp_srv *s, dsp_srv_req *r, dsp_srv_error *e);
/* JSON field checks shared by the APIs (absent or null fields leave *out) */
json_t *dsp_srv_field(json_t *root, const char *key);
bool dsp_srv_get_num(json_t *root, const char *key, double lo, double hi, bool lo_open, float *out, dsp_srv_error *e);
bool dsp_srv_get_int(json_t *root, const char *key, long long lo, long long hi, long long *out, bool *present, dsp_srv_error *e);
bool dsp_srv_get_bool(json_t *root, const char *key, bool *out, dsp_srv_error *e);
bool dsp_srv_check_model(dsp_srv *s, json_t *root, dsp_srv_req *r, dsp_srv_error *e);
/* Anthropic /v1/messages and /v1/messages/count_tokens (count_only); Responses /v1/responses */
bool dsp_srv_parse_messages(dsp_srv *s, const char *body, size_t len, bool count_only, dsp_srv_req *r, dsp_srv_error *e);
bool dsp_srv_parse_responses(dsp_srv *s, const char *body, size_t len, dsp_srv_req *r, dsp_srv_error *e);
char *dsp_srv_anthropic_response(dsp_srv *s, dsp_srv_req *r);
char *dsp_srv_responses_response(dsp_srv *s, dsp_srv_req *r);
/* {"type": "error", "error": {"type", "message"}} (Anthropic's shape) */
char *dsp_srv_anthropic_error_json(const dsp_srv_error *e);

/* Parse and validate a request body for kind into r (prompt tokenized, params set). */
bool dsp_srv_parse_request(dsp_srv *s, dsp_srv_kind kind, const char *body, size_t len, dsp_srv_req *r, dsp_srv_error *e);
/* The non-streaming response body (malloc'd), from a DONE request. */
char *dsp_srv_response_json(dsp_srv *s, dsp_srv_req *r);
/* Where a stream is: what has been sent so far. */
typedef struct dsp_srv_cursor {
    bool started;
    size_t tok_from, text_from;  /* raw tokens / text bytes sent (completions, logprobs) */
    size_t r_sent, c_sent;       /* reply offsets (dsp_srv_reply.p) of reasoning / content sent */
    int block;                   /* Anthropic: index of the next content block; Responses: output item */
    int open;                    /* the open block or item: 0 none, 1 reasoning, 2 text */
    int seq;                     /* Responses: sequence_number */
} dsp_srv_cursor;

/* A chat reply as the APIs format it: opener + generated text, split; calls parsed when done. */
typedef struct dsp_srv_reply {
    const char *p;
    size_t n;
    char *own;                   /* p when it had to be assembled */
    dsp_srv_parts parts;
    dsp_srv_calls calls;         /* done and the call region parsed: the calls (ids assigned) */
} dsp_srv_reply;
void dsp_srv_reply_make(dsp_srv *s, const dsp_srv_req *r, const dsp_srv_out *o, dsp_srv_reply *rep);
void dsp_srv_reply_free(dsp_srv_reply *rep);

/* A growing byte buffer for SSE events (oom sticks: the whole result is dropped). */
typedef struct dsp_srv_sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} dsp_srv_sbuf;
void dsp_srv_sb_add(dsp_srv_sbuf *b, const char *s, size_t n);
/* "event: NAME\n" (when name) + "data: JSON\n\n"; takes obj */
void dsp_srv_sb_event(dsp_srv_sbuf *b, const char *name, json_t *obj);
/* JSON string of bytes that may be invalid UTF-8 (U+FFFD for bad bytes) */
json_t *dsp_srv_jstr(const char *p, size_t n);
/* the per-response "dspark" block: mode (resolved: auto is hybrid with a block drafter, else lookup),
 * drafter, accepted length, tok/s, TTFT, cached tokens */
json_t *dsp_srv_stats_json(dsp_srv *s, const dsp_srv_req *r, const dsp_srv_out *o);

/* Streaming: the SSE events of o (a mirror made by the stream's out_sync in http.c; no lock is held) that are
 * ready, in r's API, advancing cur. When o->done, adds the closing events. Returns malloc'd bytes
 * or NULL if nothing is ready. */
char *dsp_srv_stream_events(dsp_srv *s, const dsp_srv_req *r, const dsp_srv_out *o, dsp_srv_cursor *cur, size_t *len);
/* Anthropic (anthropic.c) and Responses (responses.c): the same for their APIs. */
char *dsp_srv_anthropic_events(dsp_srv *s, const dsp_srv_req *r, const dsp_srv_out *o, dsp_srv_cursor *cur, size_t *len);
char *dsp_srv_responses_events(dsp_srv *s, const dsp_srv_req *r, const dsp_srv_out *o, dsp_srv_cursor *cur, size_t *len);
char *dsp_srv_models_json(dsp_srv *s, const char *only);
/* s->spec_json from the configuration and the engine (after the engine exists) */
void dsp_srv_spec_json(dsp_srv *s);
/* Text of a message content: a string, or an array of parts whose type is one of types (NULL-ended). */
json_t *dsp_srv_text_parts(json_t *content, const char *pname, const char *const *types, dsp_srv_error *e);
/* The function name of the tool call with this id in converted messages, or NULL. */
const char *dsp_srv_call_name(json_t *msgs, const char *id);
/* Render msgs (stolen) with the chat template (+ tools, kwargs) and tokenize into r->prompt. */
bool dsp_srv_chat_prompt(dsp_srv *s, dsp_srv_req *r, json_t *msgs, json_t *kwargs, dsp_srv_error *e);
bool dsp_srv_model_known(dsp_srv *s, const char *name);

/* ---- the front door (door.c): accept, connection limits, request-head deadline and checks ---- */

struct sockaddr;
dsp_status dsp_srv_door_start(dsp_srv *s, const struct sockaddr *addr, unsigned addrlen); /* sets s->port */
void dsp_srv_door_stop(dsp_srv *s);      /* stop accepting; close connections not handed over */
void dsp_srv_door_destroy(dsp_srv *s);
void dsp_srv_door_closed(dsp_srv *s, int fd); /* libmicrohttpd closed a connection handed to it */
int dsp_srv_door_open(dsp_srv *s);       /* connections open now */
/* Write a whole error response (with "Connection: close") straight to a socket, logging it. */
void dsp_srv_send_error_fd(int fd, const dsp_srv_error *e, const char *what);

/* ---- HTTP (http.c) and lifecycle (server.c) ---------------------------------------------------- */

dsp_status dsp_srv_http_start(dsp_srv *s);
/* Wait (at most timeout_s) until every generation reply has been sent. */
void dsp_srv_http_flush(dsp_srv *s, double timeout_s);
void dsp_srv_http_stop(dsp_srv *s);     /* close everything; connection threads joined */

dsp_status dsp_srv_create(const dsp_srv_config *cfg, dsp_srv **out);
void dsp_srv_destroy(dsp_srv *s);
double dsp_srv_now_ms(void);

#endif
