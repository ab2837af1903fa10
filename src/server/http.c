/* server/http: libmicrohttpd glue: routing, authentication, body limits, replies and SSE.
 *
 * libmicrohttpd runs a thread per connection, so a connection thread may block: a non-streaming
 * request waits for its result in the access handler, a streaming one in the content-reader
 * callback of its response (chunked transfer encoding, one `data: {...}` event per ready piece of
 * text). Both waits wake every 50 ms to poll the socket: a peer that hung up cancels its request
 * (dsp_srv_sched_abandon), which the engine notices at the next token.
 *
 * Limits are checked before anything is allocated for a client: the route, method and API key on
 * the headers alone; Content-Length against --max-body before reading a byte of the body; a body
 * without a length is buffered up to --max-body and the rest discarded (then 413). While a
 * generation runs the connection's idle timeout is off (the wait is ours, not the client's) and it
 * is restored afterwards, so a stalled or idle client is closed after --timeout seconds. */
#define _GNU_SOURCE /* POLLRDHUP */
#include "server/server.h"

#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { ROUTE_NONE = 0, ROUTE_CHAT, ROUTE_COMPLETIONS };

typedef struct conn {
    dsp_srv *s;
    int route;
    char *body;
    size_t n_body, cap_body;
    bool too_large;
    bool replied;          /* a reply was queued before the body was read */
    bool active;           /* counted in s->n_active until the connection's request completes */
    dsp_srv_req *req;      /* non-streaming: the request being waited for */
} conn;

typedef struct sse {
    dsp_srv *s;
    dsp_srv_req *r;
    struct MHD_Connection *mc;
    int fd;
    char *pending;         /* bytes produced but not yet handed to MHD */
    size_t n_pending, off;
    size_t tok_from, text_from;
    bool started, finished;
} sse;

/* ---- replies ----------------------------------------------------------------------------------- */

static enum MHD_Result reply(struct MHD_Connection *mc, unsigned code, const char *body, const char *hdr, const char *hdr_val) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "application/json");
    if (hdr) MHD_add_response_header(resp, hdr, hdr_val);
    enum MHD_Result ret = MHD_queue_response(mc, code, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result reply_json(struct MHD_Connection *mc, unsigned code, char *json) {
    enum MHD_Result ret = json ? reply(mc, code, json, NULL, NULL) : MHD_NO;
    free(json);
    return ret;
}

static enum MHD_Result reply_error(struct MHD_Connection *mc, const char *method, const char *url, const dsp_srv_error *e) {
    int code = dsp_srv_error_http(e->kind);
    fprintf(stderr, "dspark serve: %s %.200s -> %d: %s\n", method, url, code, e->message);
    char *js = dsp_srv_error_json(e);
    if (!js) return MHD_NO;
    const char *hdr = NULL, *val = NULL;
    if (code == 401) hdr = "WWW-Authenticate", val = "Bearer";
    if (code == 405) hdr = "Allow", val = strcmp(url, "/v1/models") && strcmp(url, "/health") && strncmp(url, "/v1/models/", 11) ? "POST" : "GET";
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
    pthread_mutex_lock(&r->mu);
    for (;;) {
        bool done = r->state == DSP_SRV_DONE;
        size_t len = 0;
        char *ev = dsp_srv_stream_events(st->s, r, &st->tok_from, &st->text_from, &st->started, done, &len);
        if (ev) {
            pthread_mutex_unlock(&r->mu);
            st->finished = done;
            st->pending = ev, st->n_pending = len;
            size_t n = len < max ? len : max;
            memcpy(buf, ev, n);
            st->off = n;
            return (ssize_t)n;
        }
        if (done) break; /* out of memory building the last events */
        wait_tick(r);
        if (r->state != DSP_SRV_DONE && peer_gone(st->fd)) break;
    }
    pthread_mutex_unlock(&r->mu);
    dsp_srv_sched_abandon(st->s, r);
    return MHD_CONTENT_READER_END_WITH_ERROR;
}

static void sse_free(void *cls) {
    sse *st = cls;
    dsp_srv_sched_abandon(st->s, st->r); /* no-op unless the stream ended early */
    dsp_srv_req_release(st->r);
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
        return reply_error(mc, method, url, &e);
    }
    bool ok = dsp_srv_parse_request(s, c->route == ROUTE_CHAT ? DSP_SRV_CHAT : DSP_SRV_COMPLETION, c->body ? c->body : "", c->n_body, r, &e);
    free(c->body);
    c->body = NULL, c->n_body = c->cap_body = 0;
    if (!ok || dsp_srv_sched_submit(s, r, &e)) {
        dsp_srv_req_release(r);
        return reply_error(mc, method, url, &e);
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
        st->s = s, st->r = r, st->mc = mc, st->fd = conn_fd(mc);
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
        set_timeout(mc, 0);
        enum MHD_Result ret = MHD_queue_response(mc, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp); /* sse_free runs when MHD is done with it */
        return ret;
    }
    /* non-streaming: wait here, watching the socket */
    c->req = r;
    c->active = true;
    atomic_fetch_add(&s->n_active, 1); /* until on_completed */
    set_timeout(mc, 0);
    int fd = conn_fd(mc);
    pthread_mutex_lock(&r->mu);
    while (r->state != DSP_SRV_DONE) {
        wait_tick(r);
        if (r->state != DSP_SRV_DONE && peer_gone(fd)) {
            pthread_mutex_unlock(&r->mu);
            return MHD_NO; /* on_completed abandons and releases */
        }
    }
    pthread_mutex_unlock(&r->mu);
    set_timeout(mc, (unsigned)s->cfg.idle_timeout_s);
    if (r->status != DSP_OK || r->res.finish == DSP_FINISH_CANCELLED) {
        if (r->status == DSP_OK || r->status == DSP_ERR_CANCELLED) dsp_srv_fail(&e, DSP_ERR_BUSY, NULL, "the server is shutting down");
        else dsp_srv_fail(&e, r->status, r->status == DSP_ERR_RANGE ? (r->kind == DSP_SRV_CHAT ? "messages" : "prompt") : NULL, "%s", r->error);
        return reply_error(mc, method, url, &e);
    }
    return reply_json(mc, MHD_HTTP_OK, dsp_srv_response_json(s, r));
}

static bool authorized(dsp_srv *s, struct MHD_Connection *mc) {
    if (!s->cfg.api_key) return true;
    const char *h = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    h += 7;
    while (*h == ' ') h++;
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
        bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
        bool is_models = !strcmp(url, "/v1/models") || !strncmp(url, "/v1/models/", 11);
        int route = !strcmp(url, "/v1/chat/completions") ? ROUTE_CHAT : !strcmp(url, "/v1/completions") ? ROUTE_COMPLETIONS : ROUTE_NONE;
        c->replied = true; /* unless we go on to read a body */
        if (!strcmp(url, "/health")) {
            if (!get) return dsp_srv_fail(&e, DSP_SRV_ERR_METHOD, NULL, "%s is not allowed on %s (use GET)", method, url), reply_error(mc, method, url, &e);
            bool draining = atomic_load(&s->draining);
            char body[1100];
            snprintf(body, sizeof body, "{\"status\":\"%s\",\"speculation\":%s}", draining ? "shutting down" : "ok", s->spec_json);
            return reply(mc, draining ? 503 : 200, body, NULL, NULL);
        }
        if (!is_models && route == ROUTE_NONE) {
            dsp_srv_fail(&e, DSP_SRV_ERR_ROUTE, NULL, "no route %s %.200s (this server has POST /v1/chat/completions, POST /v1/completions, "
                         "GET /v1/models, GET /health)", method, url);
            return reply_error(mc, method, url, &e);
        }
        if ((is_models && !get) || (route != ROUTE_NONE && !post)) {
            dsp_srv_fail(&e, DSP_SRV_ERR_METHOD, NULL, "%s is not allowed on %s (use %s)", method, url, is_models ? "GET" : "POST");
            return reply_error(mc, method, url, &e);
        }
        if (!authorized(s, mc)) {
            dsp_srv_fail(&e, DSP_SRV_ERR_AUTH, NULL, "missing or incorrect API key: send the header 'Authorization: Bearer KEY'");
            return reply_error(mc, method, url, &e);
        }
        if (is_models) {
            const char *only = url[10] == '/' ? url + 11 : NULL;
            if (only && !dsp_srv_model_known(s, only)) {
                dsp_srv_fail(&e, DSP_SRV_ERR_MODEL, "model", "the model '%.128s' does not exist", only);
                return reply_error(mc, method, url, &e);
            }
            return reply_json(mc, MHD_HTTP_OK, dsp_srv_models_json(s, only));
        }
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end;
            unsigned long long n = strtoull(cl, &end, 10);
            if (*end || n > s->cfg.max_body) {
                dsp_srv_fail(&e, DSP_SRV_ERR_TOO_LARGE, NULL, "the request body (%s bytes) is larger than this server accepts (%zu bytes, --max-body)",
                             cl, s->cfg.max_body);
                return reply_error(mc, method, url, &e);
            }
            /* the buffer grows with what actually arrives, not with what the header promises */
        }
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
    if (c->too_large) {
        dsp_srv_fail(&e, DSP_SRV_ERR_TOO_LARGE, NULL, "the request body is larger than this server accepts (%zu bytes, --max-body)", s->cfg.max_body);
        return reply_error(mc, method, url, &e);
    }
    return run_generation(c, mc, method, url);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)mc, (void)toe;
    dsp_srv *s = cls;
    conn *c = *con_cls;
    if (!c) return;
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
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG | MHD_USE_AUTO;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->daemon = MHD_start_daemon(flags, (uint16_t)s->cfg.port, NULL, NULL, on_access, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->cfg.idle_timeout_s, MHD_OPTION_CONNECTION_LIMIT,
                                 (unsigned)s->cfg.max_connections, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->daemon) {
        fprintf(stderr, "dspark serve: cannot listen on %s:%d (in use? permission?)\n", s->cfg.host, s->cfg.port);
        return DSP_ERR_IO;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->cfg.port;
    return DSP_OK;
}

void dsp_srv_http_quiesce(dsp_srv *s) {
    if (!s->daemon) return;
    MHD_socket fd = MHD_quiesce_daemon(s->daemon);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void dsp_srv_http_flush(dsp_srv *s, double timeout_s) {
    double t0 = dsp_srv_now_ms();
    struct timespec ts = {0, 10 * 1000000L};
    while (atomic_load(&s->n_active) > 0 && dsp_srv_now_ms() - t0 < timeout_s * 1e3) nanosleep(&ts, NULL);
}

void dsp_srv_http_stop(dsp_srv *s) {
    if (s->daemon) MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
}
