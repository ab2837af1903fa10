/* server/http: libmicrohttpd glue: routing, authentication, body limits, replies and SSE.
 *
 * libmicrohttpd runs a thread per connection, so a connection thread may block: a non-streaming
 * request waits for its result in the access handler, a streaming one in the content-reader
 * callback of its response (chunked transfer encoding, one `data: {...}` event per ready piece of
 * text). Both waits wake every 50 ms to poll the socket: a peer that hung up cancels its request
 * (dsp_srv_sched_abandon), which the engine notices at the next token.
 *
 * Connections come from the front door (door.c), which has already checked the request head
 * (syntax, sizes, Content-Length against --max-body) and answers /health and everything while
 * draining. Here: the route, method and API key on the headers alone, before anything is
 * allocated for a client; a body without a length is buffered up to --max-body and the rest
 * discarded (then 413); the body must arrive within --request-timeout (408). While a generation
 * runs the connection's idle timeout is off (the wait is ours, not the client's) and it is
 * restored afterwards, so a client that stops reading its reply is closed after --timeout seconds.
 *
 * A stream's JSON is built from a mirror of the request's output (out_sync): the request's
 * mutex, which the engine thread's token callback needs, is held only to copy what is new, never
 * while JSON is built or a slow client is written to. Every response carries "Connection: close",
 * so that every request passes the front door. */
#define _GNU_SOURCE /* POLLRDHUP */
#include "server/server.h"

#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Routes. POST routes read a body; the Anthropic ones answer errors in Anthropic's shape. */
enum { ROUTE_NONE = 0, ROUTE_CHAT, ROUTE_COMPLETIONS, ROUTE_MESSAGES, ROUTE_COUNT_TOKENS, ROUTE_RESPONSES, ROUTE_MODELS, ROUTE_METRICS, ROUTE_PAGE };

typedef struct route_def {
    const char *path;
    int route;
    bool post;
    bool prefix;           /* path/... too */
} route_def;

static const route_def k_routes[] = {
    {"/v1/chat/completions", ROUTE_CHAT, true, false},
    {"/v1/completions", ROUTE_COMPLETIONS, true, false},
    {"/v1/messages", ROUTE_MESSAGES, true, false},
    {"/v1/messages/count_tokens", ROUTE_COUNT_TOKENS, true, false},
    {"/v1/responses", ROUTE_RESPONSES, true, false},
    {"/v1/models", ROUTE_MODELS, false, true},
    {"/metrics", ROUTE_METRICS, false, false},
    {"/", ROUTE_PAGE, false, false},
};

static const route_def *find_route(const char *url) {
    size_t n = strlen(url);
    while (n > 1 && url[n - 1] == '/') n--; /* a trailing slash is the same route */
    for (size_t i = 0; i < sizeof k_routes / sizeof k_routes[0]; i++) {
        size_t k = strlen(k_routes[i].path);
        if (n == k && !strncmp(url, k_routes[i].path, k)) return &k_routes[i];
        if (k_routes[i].prefix && n > k + 1 && !strncmp(url, k_routes[i].path, k) && url[k] == '/') return &k_routes[i];
    }
    return NULL;
}

static bool anthropic_route(int route) { return route == ROUTE_MESSAGES || route == ROUTE_COUNT_TOKENS; }

typedef struct conn {
    dsp_srv *s;
    int route;
    char *body;
    size_t n_body, cap_body;
    bool too_large;
    bool replied;          /* a reply was queued before the body was read */
    bool active;           /* counted in s->n_active until the connection's request completes */
    double deadline;       /* ms: the body must be in by then */
    dsp_srv_req *req;      /* non-streaming: the request being waited for */
} conn;

typedef struct sse {
    dsp_srv *s;
    dsp_srv_req *r;
    struct MHD_Connection *mc;
    int fd;
    char *pending;         /* bytes produced but not yet handed to MHD */
    size_t n_pending, off;
    dsp_srv_out m;         /* mirror of r->out, read without the lock */
    dsp_srv_cursor cur;
    bool finished;
    double t_sent;         /* ms: when bytes were last produced (keep-alive comments) */
} sse;


/* ---- replies ----------------------------------------------------------------------------------- */

static enum MHD_Result reply(struct MHD_Connection *mc, unsigned code, const char *body, const char *hdr, const char *hdr_val) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "application/json");
    MHD_add_response_header(resp, "Connection", "close");
    if (hdr) MHD_add_response_header(resp, hdr, hdr_val);
    enum MHD_Result ret = MHD_queue_response(mc, code, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result reply_text(struct MHD_Connection *mc, char *txt, const char *type) {
    if (!txt) return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(txt), txt, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(txt);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", type);
    MHD_add_response_header(resp, "Connection", "close");
    enum MHD_Result ret = MHD_queue_response(mc, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result reply_page(struct MHD_Connection *mc) {
    size_t n = 0;
    const char *page = dsp_srv_page(&n);
    struct MHD_Response *resp = MHD_create_response_from_buffer(n, (void *)page, MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "text/html; charset=utf-8");
    MHD_add_response_header(resp, "Connection", "close");
    MHD_add_response_header(resp, "Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'");
    enum MHD_Result ret = MHD_queue_response(mc, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result reply_json(struct MHD_Connection *mc, unsigned code, char *json) {
    enum MHD_Result ret = json ? reply(mc, code, json, NULL, NULL) : MHD_NO;
    free(json);
    return ret;
}

static enum MHD_Result reply_error(dsp_srv *s, struct MHD_Connection *mc, const char *method, const char *url, const dsp_srv_error *e) {
    int code = dsp_srv_error_http(e->kind);
    fprintf(stderr, "dspark serve: %s %.200s -> %d: %s\n", method, url, code, e->message);
    const route_def *rd = find_route(url);
    dsp_srv_metrics_request(s, rd ? rd->route : ROUTE_NONE, code);
    char *js = rd && anthropic_route(rd->route) ? dsp_srv_anthropic_error_json(e) : dsp_srv_error_json(e);
    if (!js) return MHD_NO;
    const char *hdr = NULL, *val = NULL;
    if (code == 401) hdr = "WWW-Authenticate", val = "Bearer";
    if (code == 503) hdr = "Retry-After", val = "5";
    if (code == 405) hdr = "Allow", val = rd && rd->post ? "POST" : "GET";
    enum MHD_Result ret = reply(mc, (unsigned)code, js, hdr, val);
    free(js);
    return ret;
}

/* ---- waiting ------------------------------------------------------------------------------------ */

static int conn_fd(struct MHD_Connection *mc) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* true if the peer closed or reset the connection */
static bool peer_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static void wait_tick(dsp_srv_req *r) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_nsec += 50 * 1000000L;
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&r->cv, &r->mu, &dl);
}

static void set_timeout(struct MHD_Connection *mc, unsigned secs) { MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, secs); }

/* ---- streaming ------------------------------------------------------------------------------------ */

/* Bring mirror m up to date with r->out: the caller holds r->mu; new text is copied into m's own
 * buffer (a memcpy of what is new: the lock is held that long only), toks/top are shared. false
 * when out of memory. */
static bool out_sync(dsp_srv_out *m, const dsp_srv_out *o) {
    if (o->n_text > m->n_text) {
        if (o->n_text > m->cap_text) {
            size_t nc = o->n_text * 2 + 256;
            char *nt = realloc(m->text, nc);
            if (!nt) return false;
            m->text = nt, m->cap_text = nc;
        }
        memcpy(m->text + m->n_text, o->text + m->n_text, o->n_text - m->n_text);
        m->n_text = o->n_text;
    }
    m->toks = o->toks, m->n_toks = o->n_toks;
    m->top = o->top, m->n_top_used = o->n_top_used;
    if (o->done && !m->done) {
        m->status = o->status;
        memcpy(m->error, o->error, sizeof m->error);
        m->res = o->res;
        m->ttft_ms = o->ttft_ms;
        m->done = true;
    }
    return true;
}

static void out_mirror_free(dsp_srv_out *m) {
    free(m->text);
    m->text = NULL;
}


/* Hand the first max bytes of ev (len) to MHD, keeping the rest for the next call. */
static ssize_t sse_emit(sse *st, char *ev, size_t len, char *buf, size_t max) {
    st->pending = ev, st->n_pending = len;
    size_t n = len < max ? len : max;
    memcpy(buf, ev, n);
    st->off = n;
    st->t_sent = dsp_srv_now_ms();
    return (ssize_t)n;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    sse *st = cls;
    if (st->off < st->n_pending) {
        size_t n = st->n_pending - st->off < max ? st->n_pending - st->off : max;
        memcpy(buf, st->pending + st->off, n);
        st->off += n;
        return (ssize_t)n;
    }
    free(st->pending);
    st->pending = NULL, st->n_pending = st->off = 0;
    if (st->finished) {
        set_timeout(st->mc, (unsigned)st->s->cfg.idle_timeout_s);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    dsp_srv_req *r = st->r;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        bool ok = out_sync(&st->m, &r->out);
        pthread_mutex_unlock(&r->mu);
        if (!ok) break; /* out of memory */
        size_t len = 0;
        char *ev = dsp_srv_stream_events(st->s, r, &st->m, &st->cur, &len);
        if (ev) {
            st->finished = st->m.done;
            return sse_emit(st, ev, len, buf, max);
        }
        if (st->m.done) break; /* out of memory building the last events */
        if (dsp_srv_now_ms() - st->t_sent >= st->s->cfg.keepalive_s * 1e3) { /* a long prefill or queue: keep proxies and clients from timing out */
            char *ka = strdup(": keep-alive\n\n");
            if (ka) return sse_emit(st, ka, strlen(ka), buf, max);
        }
        pthread_mutex_lock(&r->mu);
        if (r->out.n_toks == st->m.n_toks && !r->out.done) wait_tick(r);
        pthread_mutex_unlock(&r->mu);
        if (peer_gone(st->fd)) break;
    }
    dsp_srv_sched_abandon(st->s, r);
    return MHD_CONTENT_READER_END_WITH_ERROR;
}

static void sse_free(void *cls) {
    sse *st = cls;
    dsp_srv_sched_abandon(st->s, st->r); /* no-op unless the stream ended early */
    dsp_srv_req_release(st->r);
    out_mirror_free(&st->m);
    free(st->pending);
    atomic_fetch_sub(&st->s->n_active, 1);
    free(st);
}

/* ---- requests --------------------------------------------------------------------------------------- */

static enum MHD_Result run_generation(conn *c, struct MHD_Connection *mc, const char *method, const char *url) {
    dsp_srv *s = c->s;
    dsp_srv_error e;
    memset(&e, 0, sizeof e);
    dsp_srv_req *r = dsp_srv_req_create();
    if (!r) {
        dsp_srv_fail(&e, DSP_ERR_NOMEM, NULL, "out of memory");
        return reply_error(s, mc, method, url, &e);
    }
    const char *body = c->body ? c->body : "";
    bool ok;
    switch (c->route) {
    case ROUTE_MESSAGES: ok = dsp_srv_parse_messages(s, body, c->n_body, false, r, &e); break;
    case ROUTE_COUNT_TOKENS: ok = dsp_srv_parse_messages(s, body, c->n_body, true, r, &e); break;
    case ROUTE_RESPONSES: ok = dsp_srv_parse_responses(s, body, c->n_body, r, &e); break;
    default: ok = dsp_srv_parse_request(s, c->route == ROUTE_CHAT ? DSP_SRV_CHAT : DSP_SRV_COMPLETION, body, c->n_body, r, &e); break;
    }
#ifdef DSP_SRV_SCRIPTED
    json_t *root = ok ? json_loadb(body, c->n_body, 0, NULL) : NULL;
    const char *scripted = json_string_value(json_object_get(root, "dspark_test_output"));
    if (scripted) r->scripted = strdup(scripted);
    json_decref(root);
#endif
    free(c->body);
    c->body = NULL, c->n_body = c->cap_body = 0;
    if (ok && r->count_only) { /* count_tokens: nothing to generate */
        enum MHD_Result ret = reply_json(mc, MHD_HTTP_OK, dsp_srv_anthropic_response(s, r));
        dsp_srv_metrics_request(s, c->route, 200);
        dsp_srv_req_release(r);
        return ret;
    }
    if (!ok || dsp_srv_sched_submit(s, r, &e)) {
        dsp_srv_req_release(r);
        return reply_error(s, mc, method, url, &e);
    }
    if (r->stream) {
        sse *st = calloc(1, sizeof *st);
        if (st) atomic_fetch_add(&s->n_active, 1); /* until sse_free */
        struct MHD_Response *resp = st ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_read, st, sse_free) : NULL;
        if (!resp) {
            free(st);
            dsp_srv_sched_abandon(s, r);
            dsp_srv_req_release(r);
            return MHD_NO;
        }
        st->s = s, st->r = r, st->mc = mc, st->fd = conn_fd(mc), st->t_sent = dsp_srv_now_ms();
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Connection", "close");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
        set_timeout(mc, 0);
        enum MHD_Result ret = MHD_queue_response(mc, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp); /* sse_free runs when MHD is done with it */
        dsp_srv_metrics_request(s, c->route, 200);
        return ret;
    }
    /* non-streaming: wait here, watching the socket */
    c->req = r;
    c->active = true;
    atomic_fetch_add(&s->n_active, 1); /* until on_completed */
    set_timeout(mc, 0);
    int fd = conn_fd(mc);
    pthread_mutex_lock(&r->mu);
    while (!r->out.done) {
        wait_tick(r);
        if (!r->out.done && peer_gone(fd)) {
            pthread_mutex_unlock(&r->mu);
            return MHD_NO; /* on_completed abandons and releases */
        }
    }
    pthread_mutex_unlock(&r->mu);
    set_timeout(mc, (unsigned)s->cfg.idle_timeout_s);
    const dsp_srv_out *o = &r->out; /* done: the engine writes no more */
    if (o->status != DSP_OK || o->res.finish == DSP_FINISH_CANCELLED) {
        if (o->status == DSP_OK || o->status == DSP_ERR_CANCELLED) dsp_srv_fail(&e, DSP_ERR_BUSY, NULL, "the server is shutting down");
        else dsp_srv_fail(&e, o->status, o->status == DSP_ERR_RANGE ? (r->kind == DSP_SRV_COMPLETION ? "prompt" : "messages") : NULL, "%s", o->error);
        return reply_error(s, mc, method, url, &e);
    }
    char *js = r->kind == DSP_SRV_MESSAGES ? dsp_srv_anthropic_response(s, r) : r->kind == DSP_SRV_RESPONSES ? dsp_srv_responses_response(s, r)
                                                                                                              : dsp_srv_response_json(s, r);
    dsp_srv_metrics_request(s, c->route, 200);
    return reply_json(mc, MHD_HTTP_OK, js);
}

/* Authorization: Bearer KEY (OpenAI) or x-api-key: KEY (Anthropic) */
static bool authorized(dsp_srv *s, struct MHD_Connection *mc) {
    if (!s->cfg.api_key) return true;
    const char *h = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Authorization");
    const char *x = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "x-api-key");
    if (h && !strncasecmp(h, "Bearer ", 7)) {
        h += 7;
        while (*h == ' ') h++;
    } else if (x) h = x;
    else return false;
    /* constant time in the key's length */
    const char *k = s->cfg.api_key;
    size_t nk = strlen(k), nh = strlen(h);
    unsigned diff = nk != nh;
    for (size_t i = 0; i < nk; i++) diff |= (unsigned char)k[i] ^ (unsigned char)(i < nh ? h[i] : 0);
    return diff == 0;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *mc, const char *url, const char *method, const char *version,
                                 const char *upload_data, size_t *upload_data_size, void **con_cls) {
    (void)version;
    dsp_srv *s = cls;
    conn *c = *con_cls;
    dsp_srv_error e;
    memset(&e, 0, sizeof e);
    if (!c) {
        /* first call: headers only */
        if (!(c = calloc(1, sizeof *c))) return MHD_NO;
        c->s = s;
        *con_cls = c;
        const route_def *rd = find_route(url);
        c->replied = true; /* unless we go on to read a body */
        if (!strcmp(url, "/health")) { /* the front door answers GET and HEAD */
            dsp_srv_fail(&e, DSP_SRV_ERR_METHOD, NULL, "%s is not allowed on %s (use GET)", method, url);
            return reply_error(s, mc, method, url, &e);
        }
        if (!rd) {
            dsp_srv_fail(&e, DSP_SRV_ERR_ROUTE, NULL, "no route %s %.200s (this server has POST /v1/chat/completions, /v1/completions, "
                         "/v1/messages, /v1/messages/count_tokens, /v1/responses; GET /v1/models, /metrics, /health, /)", method, url);
            return reply_error(s, mc, method, url, &e);
        }
        if (strcmp(method, rd->post ? "POST" : "GET")) {
            dsp_srv_fail(&e, DSP_SRV_ERR_METHOD, NULL, "%s is not allowed on %s (use %s)", method, url, rd->post ? "POST" : "GET");
            return reply_error(s, mc, method, url, &e);
        }
        if (rd->route == ROUTE_PAGE) { /* the page asks for the key itself when the API needs one */
            dsp_srv_metrics_request(s, rd->route, 200);
            return reply_page(mc);
        }
        if (!authorized(s, mc)) {
            dsp_srv_fail(&e, DSP_SRV_ERR_AUTH, NULL, "missing or incorrect API key: send the header 'Authorization: Bearer KEY' or 'x-api-key: KEY'");
            return reply_error(s, mc, method, url, &e);
        }
        if (rd->route == ROUTE_METRICS) {
            char *txt = dsp_srv_metrics_text(s);
            dsp_srv_metrics_request(s, rd->route, txt ? 200 : 500);
            return reply_text(mc, txt, "text/plain; version=0.0.4; charset=utf-8");
        }
        if (rd->route == ROUTE_MODELS) {
            const char *only = url[10] == '/' ? url + 11 : NULL;
            if (only && !dsp_srv_model_known(s, only)) {
                dsp_srv_fail(&e, DSP_SRV_ERR_MODEL, "model", "the model '%.128s' does not exist", only);
                return reply_error(s, mc, method, url, &e);
            }
            dsp_srv_metrics_request(s, rd->route, 200);
            return reply_json(mc, MHD_HTTP_OK, dsp_srv_models_json(s, only));
        }
        int route = rd->route;
        /* the front door checked Content-Length against --max-body; the buffer grows with what
         * actually arrives, not with what the header promises */
        c->deadline = dsp_srv_now_ms() + s->cfg.request_timeout_s * 1e3;
        set_timeout(mc, (unsigned)s->cfg.request_timeout_s); /* a stalled body */
        c->route = route;
        c->replied = false;
        return MHD_YES;
    }
    if (c->replied) { /* a reply is out already: drop whatever else comes */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (dsp_srv_now_ms() > c->deadline) { /* a trickling body */
            c->replied = true;
            dsp_srv_fail(&e, DSP_SRV_ERR_TIMEOUT, NULL, "the request body did not arrive within %d s (--request-timeout)", s->cfg.request_timeout_s);
            return reply_error(s, mc, method, url, &e);
        }
        if (c->too_large) return MHD_YES;
        if (n > s->cfg.max_body - c->n_body) {
            c->too_large = true; /* keep reading (and dropping) so that the 413 reaches the client */
            free(c->body);
            c->body = NULL, c->n_body = c->cap_body = 0;
            return MHD_YES;
        }
        if (c->n_body + n + 1 > c->cap_body) {
            size_t nc = c->cap_body * 2 > c->n_body + n + 1 ? c->cap_body * 2 : c->n_body + n + 1 + 4096;
            if (nc > s->cfg.max_body + 1) nc = s->cfg.max_body + 1;
            char *nb = realloc(c->body, nc);
            if (!nb) return MHD_NO;
            c->body = nb, c->cap_body = nc;
        }
        memcpy(c->body + c->n_body, upload_data, n);
        c->n_body += n;
        return MHD_YES;
    }
    /* the whole body is in */
    c->replied = true;
    set_timeout(mc, (unsigned)s->cfg.idle_timeout_s);
    if (c->too_large) {
        dsp_srv_fail(&e, DSP_SRV_ERR_TOO_LARGE, NULL, "the request body is larger than this server accepts (%zu bytes, --max-body)", s->cfg.max_body);
        return reply_error(s, mc, method, url, &e);
    }
    return run_generation(c, mc, method, url);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe) {
    dsp_srv *s = cls;
    conn *c = *con_cls;
    if (!c) return;
    if (toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED && !c->replied) {
        /* the body stalled: libmicrohttpd closes without a word, so say why before it does */
        dsp_srv_error e;
        dsp_srv_fail(&e, DSP_SRV_ERR_TIMEOUT, NULL, "the request body did not arrive within %d s (--request-timeout)", s->cfg.request_timeout_s);
        dsp_srv_send_error_fd(conn_fd(mc), &e, "request body");
    }
    if (c->req) {
        dsp_srv_sched_abandon(s, c->req);
        dsp_srv_req_release(c->req);
    }
    if (c->active) atomic_fetch_sub(&s->n_active, 1);
    free(c->body);
    free(c);
    *con_cls = NULL;
}

/* ---- daemon ---------------------------------------------------------------------------------------- */

static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context, enum MHD_ConnectionNotificationCode code) {
    (void)socket_context;
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) dsp_srv_door_closed(cls, conn_fd(mc));
}

/* libmicrohttpd's own messages, prefixed. A stream whose client went away ends with
 * MHD_CONTENT_READER_END_WITH_ERROR, which libmicrohttpd reports as an "application error";
 * that is a normal disconnect (the request log says "cancelled"), so it is not repeated here. */
static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (strstr(msg, "application error generating response")) return;
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = '\0';
    fprintf(stderr, "dspark serve: libmicrohttpd: %s\n", msg);
}

dsp_status dsp_srv_http_start(dsp_srv *s) {
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char port[16];
    snprintf(port, sizeof port, "%d", s->cfg.port);
    int gai = getaddrinfo(s->cfg.host, port, &hints, &ai);
    if (gai || !ai) {
        fprintf(stderr, "dspark serve: --host %s: %s\n", s->cfg.host, gai_strerror(gai));
        return DSP_ERR_INVALID_ARG;
    }
    /* connections come from the front door (MHD_add_connection), never from a socket of MHD's */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG |
                     MHD_USE_NO_LISTEN_SOCKET | MHD_USE_AUTO;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_access, s, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->cfg.idle_timeout_s,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->cfg.max_connections + 8, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                                 (size_t)128 * 1024, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION,
                                 on_connection, s, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s, MHD_OPTION_END);
    if (!s->daemon) {
        freeaddrinfo(ai);
        fprintf(stderr, "dspark serve: cannot start libmicrohttpd\n");
        return DSP_ERR_IO;
    }
    dsp_status st = dsp_srv_door_start(s, ai->ai_addr, (unsigned)ai->ai_addrlen);
    freeaddrinfo(ai);
    return st;
}

void dsp_srv_http_flush(dsp_srv *s, double timeout_s) {
    double t0 = dsp_srv_now_ms();
    struct timespec ts = {0, 10 * 1000000L};
    while (atomic_load(&s->n_active) > 0 && dsp_srv_now_ms() - t0 < timeout_s * 1e3) nanosleep(&ts, NULL);
}

void dsp_srv_http_stop(dsp_srv *s) {
    dsp_srv_door_stop(s);  /* no new connections */
    if (s->daemon) MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
    dsp_srv_door_destroy(s); /* after MHD: its close notifications use the door */
}
