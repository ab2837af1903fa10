/* server/door: the front door: accepts every connection, reads (peeks) its request head with a
 * deadline, and only then hands the socket to libmicrohttpd (MHD_add_connection).
 *
 * Why: libmicrohttpd gives a thread to every connection from accept on, answers oversized URIs and
 * headers, malformed request lines and bad Content-Length with its own HTML pages (or not at all),
 * and resets its idle timer on every byte, so a few hundred idle or trickling sockets lock every
 * other client out. Here one thread polls all connections that have not yet sent a whole request
 * head, so an idle socket costs a file descriptor and nothing else, and:
 *   - a head must be complete within --request-timeout seconds of the connection (408 otherwise);
 *   - at most --max-connections connections are open (waiting + handed over); when a new one
 *     would exceed that, the oldest connection still waiting for its head is closed to make room
 *     (the reserve: a client that sends a request promptly is always served);
 *   - at most --max-connections-per-client from one address, by the same rule within that address
 *     (a client whose connections are all busy generating gets a 429);
 *   - a head that is malformed, too long (414, 431), has a bad Content-Length or an unsupported
 *     HTTP version is answered here with the OpenAI error object (errors.c), as is everything
 *     while the server drains after SIGTERM (503 + Retry-After), and GET /health (so that it
 *     answers even when every generation slot is busy).
 * The head is only peeked (MSG_PEEK), so libmicrohttpd reads the request from its first byte. Every
 * response carries "Connection: close", so every request passes through here.
 *
 * Replies written here are small and go out with one send(); the socket is then half-closed and
 * drained for a moment ("lingering close") so that unread input does not turn into a reset that
 * destroys the reply before the client reads it.
 *
 * Accounting: pending (waiting for a head) and lingering sockets belong to this thread alone;
 * connections handed over are counted per address in `ips` under door->mu and uncounted by
 * libmicrohttpd's connection-closed notification (dsp_srv_door_closed). */
#define _GNU_SOURCE /* accept4 */
#include "server/server.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

typedef struct dsp_srv_door dsp_srv_door;

#define HEAD_MAX (32 * 1024)    /* request line + headers, bytes */
#define URI_MAX (8 * 1024)      /* request target, bytes */
#define HEADERS_MAX 100         /* header lines */
#define LINGER_MS 2000          /* drain a closed connection's input this long at most */
#define LINGER_MAX 64           /* connections lingering at once; more are closed at once */

typedef struct ipkey {
    unsigned char b[16];
    int family;
} ipkey;

typedef struct pend {
    int fd;
    ipkey ip;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    double t0;                  /* accepted (ms) */
    size_t seen;                /* bytes seen at the last peek */
} pend;

typedef struct lingerer {
    int fd;
    double until;
} lingerer;

typedef struct ipcount {
    ipkey ip;
    int n;                      /* pending + handed over */
} ipcount;

typedef struct handed {
    int fd;
    ipkey ip;
} handed;

struct dsp_srv_door {
    dsp_srv *s;
    int lfd;                    /* listening socket */
    int wake[2];                /* pipe: stop */
    pthread_t thread;
    bool started;
    int max_conn, per_client;
    pend *pending;              /* (max_conn) waiting for a head, oldest first */
    int n_pending;
    atomic_int n_pending_pub;   /* n_pending, for other threads (metrics) */
    lingerer lingering[LINGER_MAX];
    int n_linger;
    char *peek;                 /* (HEAD_MAX + 1) */

    pthread_mutex_t mu;         /* guards what follows (libmicrohttpd threads uncount) */
    ipcount *ips;               /* (2 * max_conn) */
    int n_ips;
    handed *active;             /* (max_conn) connections handed to libmicrohttpd */
    int n_active;
};

static void ipkey_of(const struct sockaddr_storage *a, ipkey *k) {
    memset(k, 0, sizeof *k);
    k->family = a->ss_family;
    if (a->ss_family == AF_INET) memcpy(k->b, &((const struct sockaddr_in *)a)->sin_addr, 4);
    else if (a->ss_family == AF_INET6) memcpy(k->b, &((const struct sockaddr_in6 *)a)->sin6_addr, 16);
}

/* ---- per-address counts (under mu) --------------------------------------------------------- */

static ipcount *ip_find(dsp_srv_door *d, const ipkey *k) {
    for (int i = 0; i < d->n_ips; i++)
        if (!memcmp(&d->ips[i].ip, k, sizeof *k)) return &d->ips[i];
    return NULL;
}

static int ip_count(dsp_srv_door *d, const ipkey *k) {
    ipcount *c = ip_find(d, k);
    return c ? c->n : 0;
}

static void ip_add(dsp_srv_door *d, const ipkey *k, int delta) {
    ipcount *c = ip_find(d, k);
    if (!c) {
        if (delta <= 0 || d->n_ips >= 2 * d->max_conn) return; /* cannot happen: open connections bound both */
        c = &d->ips[d->n_ips++];
        c->ip = *k, c->n = 0;
    }
    c->n += delta;
    if (c->n <= 0) *c = d->ips[--d->n_ips];
}

/* ---- replies written here ------------------------------------------------------------------- */

static const char *reason(int code) {
    switch (code) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

static void linger_close(dsp_srv_door *d, int fd) {
    shutdown(fd, SHUT_WR);
    if (d->n_linger == LINGER_MAX) {
        close(fd);
        return;
    }
    d->lingering[d->n_linger].fd = fd;
    d->lingering[d->n_linger].until = dsp_srv_now_ms() + LINGER_MS;
    d->n_linger++;
}

static void send_reply(int fd, int code, const char *body, bool head_only, int retry_after) {
    char hdr[512];
    char extra[64] = "";
    if (retry_after > 0) snprintf(extra, sizeof extra, "Retry-After: %d\r\n", retry_after);
    size_t nb = strlen(body);
    int n = snprintf(hdr, sizeof hdr,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n%s\r\n", code,
                     reason(code), nb, extra);
    struct iovec iov[2] = {{hdr, (size_t)n}, {(void *)body, head_only ? 0 : nb}};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};
    (void)!sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
}

void dsp_srv_send_error_fd(int fd, const dsp_srv_error *e, const char *what) {
    int code = dsp_srv_error_http(e->kind);
    fprintf(stderr, "dspark serve: %s -> %d: %s\n", what, code, e->message);
    char *js = dsp_srv_error_json(e);
    send_reply(fd, code, js ? js : "{}", false, code == 503 || code == 429 ? 5 : 0);
    free(js);
}

static void reply_error_fd(dsp_srv_door *d, int fd, int kind, const char *what, const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void reply_error_fd(dsp_srv_door *d, int fd, int kind, const char *what, const char *fmt, ...) {
    dsp_srv_error e;
    memset(&e, 0, sizeof e);
    e.kind = kind;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    dsp_srv_send_error_fd(fd, &e, what);
    linger_close(d, fd);
}

/* ---- the request head ----------------------------------------------------------------------- */

static bool is_tchar(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* The head's end (just past the empty line) in p[0..n), or 0 if it is not complete. Lines end
 * with CRLF or LF. Leading empty lines are allowed (RFC 9112 §2.2). */
static size_t head_end(const char *p, size_t n) {
    size_t i = 0;
    while (i < n && (p[i] == '\r' || p[i] == '\n')) i++;
    for (; i < n; i++) {
        if (p[i] != '\n') continue;
        if (i + 1 < n && p[i + 1] == '\n') return i + 2;
        if (i + 2 < n && p[i + 1] == '\r' && p[i + 2] == '\n') return i + 3;
    }
    return 0;
}

typedef struct head {
    char method[24];
    char path[64];              /* up to '?', cut; enough to recognise /health */
    bool http10, have_host, chunked, have_len;
    unsigned long long len;
} head;

/* Validate a complete head; on failure fill kind and msg. */
static bool parse_head(const char *p, size_t n, size_t max_body, head *h, int *kind, char *msg, size_t msz) {
    memset(h, 0, sizeof *h);
    size_t i = 0;
    while (i < n && (p[i] == '\r' || p[i] == '\n')) i++;
    /* request line: METHOD SP TARGET SP HTTP/x.y */
    size_t m0 = i;
    while (i < n && is_tchar((unsigned char)p[i])) i++;
    if (i == m0 || i - m0 >= sizeof h->method || i >= n || p[i] != ' ') {
        *kind = DSP_SRV_ERR_HTTP, snprintf(msg, msz, "malformed HTTP request line (expected 'METHOD /path HTTP/1.1')");
        return false;
    }
    memcpy(h->method, p + m0, i - m0);
    size_t t0 = ++i;
    while (i < n && p[i] != ' ' && p[i] != '\r' && p[i] != '\n') {
        if ((unsigned char)p[i] < 0x21 || (unsigned char)p[i] == 0x7f) {
            *kind = DSP_SRV_ERR_HTTP, snprintf(msg, msz, "malformed HTTP request line (control character in the target)");
            return false;
        }
        i++;
    }
    size_t tlen = i - t0;
    if (tlen > URI_MAX) {
        *kind = DSP_SRV_ERR_URI_TOO_LONG, snprintf(msg, msz, "the request target is %zu bytes; this server accepts at most %d", tlen, URI_MAX);
        return false;
    }
    if (tlen == 0 || !(p[t0] == '/' || (tlen == 1 && p[t0] == '*')) || i >= n || p[i] != ' ') {
        *kind = DSP_SRV_ERR_HTTP, snprintf(msg, msz, "malformed HTTP request line (expected 'METHOD /path HTTP/1.1')");
        return false;
    }
    size_t plen = 0;
    while (plen < tlen && p[t0 + plen] != '?' && plen + 1 < sizeof h->path) plen++;
    memcpy(h->path, p + t0, plen);
    i++;
    size_t v0 = i;
    while (i < n && p[i] != '\r' && p[i] != '\n') i++;
    size_t vlen = i - v0;
    if (vlen == 8 && !memcmp(p + v0, "HTTP/1.1", 8)) h->http10 = false;
    else if (vlen == 8 && !memcmp(p + v0, "HTTP/1.0", 8)) h->http10 = true;
    else if (vlen == 8 && !memcmp(p + v0, "HTTP/", 5) && p[v0 + 5] >= '0' && p[v0 + 5] <= '9' && p[v0 + 6] == '.' && p[v0 + 7] >= '0' &&
             p[v0 + 7] <= '9') {
        *kind = DSP_SRV_ERR_HTTP_VERSION, snprintf(msg, msz, "HTTP version %.8s is not supported (use HTTP/1.1)", p + v0);
        return false;
    } else {
        *kind = DSP_SRV_ERR_HTTP, snprintf(msg, msz, "malformed HTTP request line (expected 'METHOD /path HTTP/1.1')");
        return false;
    }
    if (i < n && p[i] == '\r') i++;
    if (i >= n || p[i] != '\n') {
        *kind = DSP_SRV_ERR_HTTP, snprintf(msg, msz, "malformed HTTP request line (a bare CR)");
        return false;
    }
    i++;
    /* header fields */
    int n_fields = 0;
    bool have_te = false;
    for (;;) {
        size_t l0 = i;
        while (i < n && p[i] != '\n') i++;
        size_t l1 = i > l0 && p[i - 1] == '\r' ? i - 1 : i;
        i++;
        if (l1 == l0) break; /* the empty line */
        if (++n_fields > HEADERS_MAX) {
            *kind = DSP_SRV_ERR_HEADERS_TOO_LARGE, snprintf(msg, msz, "more than %d header fields", HEADERS_MAX);
            return false;
        }
        size_t k = l0;
        while (k < l1 && is_tchar((unsigned char)p[k])) k++;
        if (k == l0 || k >= l1 || p[k] != ':') {
            *kind = DSP_SRV_ERR_HTTP, snprintf(msg, msz, "malformed HTTP header line %d (expected 'Name: value')", n_fields);
            return false;
        }
        size_t nlen = k - l0, v = k + 1;
        while (v < l1 && (p[v] == ' ' || p[v] == '\t')) v++;
        size_t ve = l1;
        while (ve > v && (p[ve - 1] == ' ' || p[ve - 1] == '\t')) ve--;
        for (size_t q = v; q < ve; q++)
            if (((unsigned char)p[q] < 0x20 && p[q] != '\t') || p[q] == 0x7f) {
                *kind = DSP_SRV_ERR_HTTP, snprintf(msg, msz, "control character in header %.*s", (int)(nlen < 64 ? nlen : 64), p + l0);
                return false;
            }
        if (nlen == 4 && !strncasecmp(p + l0, "host", 4)) h->have_host = true;
        else if (nlen == 14 && !strncasecmp(p + l0, "content-length", 14)) {
            unsigned long long x = 0;
            bool ok = ve > v && ve - v <= 19;
            for (size_t q = v; ok && q < ve; q++) ok = p[q] >= '0' && p[q] <= '9', x = x * 10 + (unsigned)(p[q] - '0');
            if (!ok || (h->have_len && x != h->len)) {
                *kind = DSP_SRV_ERR_HTTP, snprintf(msg, msz, "bad Content-Length header '%.*s' (expected one decimal number of bytes)",
                                                   (int)(ve - v < 40 ? ve - v : 40), p + v);
                return false;
            }
            h->have_len = true, h->len = x;
        } else if (nlen == 17 && !strncasecmp(p + l0, "transfer-encoding", 17)) {
            if (have_te || ve - v != 7 || strncasecmp(p + v, "chunked", 7)) {
                *kind = DSP_SRV_ERR_HTTP, snprintf(msg, msz, "unsupported Transfer-Encoding '%.*s' (only 'chunked')", (int)(ve - v < 40 ? ve - v : 40), p + v);
                return false;
            }
            have_te = h->chunked = true;
        }
    }
    if (h->have_len && h->chunked) {
        *kind = DSP_SRV_ERR_HTTP, snprintf(msg, msz, "a request may not have both Content-Length and Transfer-Encoding");
        return false;
    }
    if (!h->http10 && !h->have_host) {
        *kind = DSP_SRV_ERR_HTTP, snprintf(msg, msz, "an HTTP/1.1 request needs a Host header");
        return false;
    }
    if (h->have_len && h->len > max_body) {
        *kind = DSP_SRV_ERR_TOO_LARGE,
        snprintf(msg, msz, "the request body (%llu bytes) is larger than this server accepts (%zu bytes, --max-body)", h->len, max_body);
        return false;
    }
    return true;
}

/* ---- pending connections -------------------------------------------------------------------- */

static void pend_remove(dsp_srv_door *d, int i, bool uncount) {
    if (uncount) {
        pthread_mutex_lock(&d->mu);
        ip_add(d, &d->pending[i].ip, -1);
        pthread_mutex_unlock(&d->mu);
    }
    memmove(&d->pending[i], &d->pending[i + 1], (size_t)(d->n_pending - i - 1) * sizeof *d->pending);
    d->n_pending--;
    atomic_store(&d->n_pending_pub, d->n_pending);
}

/* Close pending connection i: silently if it sent nothing, else saying why: a 408 when its time
 * ran out, a 503 when its slot went to a newer connection (evicted). */
static void pend_drop(dsp_srv_door *d, int i, bool evicted) {
    pend *p = &d->pending[i];
    if (!p->seen) close(p->fd);
    else if (evicted)
        reply_error_fd(d, p->fd, DSP_ERR_BUSY, "connection evicted",
                       "the server needed this connection's slot for a newer one: its request head was still incomplete (--max-connections)");
    else
        reply_error_fd(d, p->fd, DSP_SRV_ERR_TIMEOUT, "request head timed out", "the request head was not complete within %d s (--request-timeout)",
                       d->s->cfg.request_timeout_s);
    pend_remove(d, i, true);
}

/* Hand pending connection i to libmicrohttpd. */
static void hand_over(dsp_srv_door *d, int i) {
    pend p = d->pending[i];
    pend_remove(d, i, false); /* its address stays counted until libmicrohttpd closes it */
    int fl = fcntl(p.fd, F_GETFL);
    if (fl >= 0) fcntl(p.fd, F_SETFL, fl & ~O_NONBLOCK); /* a thread per connection blocks */
    pthread_mutex_lock(&d->mu);
    d->active[d->n_active].fd = p.fd;
    d->active[d->n_active].ip = p.ip;
    d->n_active++;
    pthread_mutex_unlock(&d->mu);
    if (MHD_add_connection(d->s->daemon, p.fd, (const struct sockaddr *)&p.addr, p.addrlen) != MHD_YES) {
        /* libmicrohttpd closed the socket; uncount it unless its close notification did */
        fprintf(stderr, "dspark serve: cannot hand a connection to libmicrohttpd: %s\n", strerror(errno));
        dsp_srv_door_closed(d->s, p.fd);
    }
}

void dsp_srv_door_closed(dsp_srv *s, int fd) {
    dsp_srv_door *d = s->door;
    if (!d || fd < 0) return;
    pthread_mutex_lock(&d->mu);
    for (int i = 0; i < d->n_active; i++)
        if (d->active[i].fd == fd) {
            ip_add(d, &d->active[i].ip, -1);
            d->active[i] = d->active[--d->n_active];
            break;
        }
    pthread_mutex_unlock(&d->mu);
}

int dsp_srv_door_open(dsp_srv *s) {
    dsp_srv_door *d = s->door;
    if (!d) return 0;
    pthread_mutex_lock(&d->mu);
    int n = d->n_active;
    pthread_mutex_unlock(&d->mu);
    return n + atomic_load(&d->n_pending_pub);
}

static void on_readable(dsp_srv_door *d, int i, short revents) {
    pend *p = &d->pending[i];
    ssize_t n = recv(p->fd, d->peek, HEAD_MAX + 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) { /* gone */
        close(p->fd);
        pend_remove(d, i, true);
        return;
    }
    if (n < 0) return;
    p->seen = (size_t)n;
    size_t end = head_end(d->peek, (size_t)n);
    int kind = 0;
    char msg[256];
    head h;
    if (!end) {
        if ((size_t)n <= HEAD_MAX) {
            if (revents & (POLLRDHUP | POLLHUP | POLLERR)) { /* the client stopped sending: it never completes */
                linger_close(d, p->fd);
                pend_remove(d, i, true);
            }
            return; /* wait for more */
        }
        /* too long: a request line without its end is a long URI, else the headers are too large */
        const char *nl = memchr(d->peek, '\n', (size_t)n);
        if (!nl) kind = DSP_SRV_ERR_URI_TOO_LONG, snprintf(msg, sizeof msg, "the request line is longer than %d bytes", HEAD_MAX);
        else kind = DSP_SRV_ERR_HEADERS_TOO_LARGE, snprintf(msg, sizeof msg, "the request head is longer than %d bytes", HEAD_MAX);
    } else if (parse_head(d->peek, end, d->s->cfg.max_body, &h, &kind, msg, sizeof msg)) {
        bool draining = atomic_load(&d->s->draining);
        bool health = !strcmp(h.path, "/health") && (!strcmp(h.method, "GET") || !strcmp(h.method, "HEAD"));
        if (health) { /* with what the engine is doing */
            pthread_mutex_lock(&d->s->q_mu);
            dsp_srv_engine_stats es = d->s->engine_stats;
            int queued = d->s->q_len;
            pthread_mutex_unlock(&d->s->q_mu);
            char body[1600];
            snprintf(body, sizeof body,
                     "{\"status\":\"%s\",\"requests_running\":%u,\"requests_waiting\":%u,\"kv_blocks\":%llu,\"kv_blocks_used\":%llu,"
                     "\"kv_blocks_cached\":%llu,\"block_tokens\":%u,\"peak_batch\":%u,\"speculation\":%s}",
                     draining ? "shutting down" : "ok", es.running, es.waiting + (unsigned)queued, (unsigned long long)es.kv_blocks_total,
                     (unsigned long long)es.kv_blocks_used, (unsigned long long)es.kv_blocks_cached, es.block_tokens, es.peak_running,
                     d->s->spec_json[0] ? d->s->spec_json : "null");
            send_reply(p->fd, draining ? 503 : 200, body, !strcmp(h.method, "HEAD"), draining ? 5 : 0);
            linger_close(d, p->fd);
            pend_remove(d, i, true);
            return;
        }
        if (draining) {
            char what[128];
            snprintf(what, sizeof what, "%s %.64s", h.method, h.path);
            reply_error_fd(d, p->fd, DSP_ERR_BUSY, what, "the server is shutting down; retry on another instance or later");
            pend_remove(d, i, true);
            return;
        }
        hand_over(d, i);
        return;
    }
    reply_error_fd(d, p->fd, kind, "bad request head", "%s", msg);
    pend_remove(d, i, true);
}

static void on_accept(dsp_srv_door *d) {
    for (;;) {
        struct sockaddr_storage a;
        socklen_t al = sizeof a;
        int fd = accept4(d->lfd, (struct sockaddr *)&a, &al, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return; /* EAGAIN, or out of descriptors: retried at the next poll */
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        ipkey k;
        ipkey_of(&a, &k);
        pthread_mutex_lock(&d->mu);
        int mine = ip_count(d, &k), total = d->n_active + d->n_pending;
        pthread_mutex_unlock(&d->mu);
        if (mine >= d->per_client) {
            /* make room within this address: its oldest connection still waiting for a head */
            int victim = -1;
            for (int i = 0; i < d->n_pending && victim < 0; i++)
                if (!memcmp(&d->pending[i].ip, &k, sizeof k)) victim = i;
            if (victim < 0) {
                reply_error_fd(d, fd, DSP_SRV_ERR_TOO_MANY, "new connection",
                               "too many connections from this address (%d, --max-connections-per-client); retry later", d->per_client);
                continue;
            }
            pend_drop(d, victim, true);
            total--;
        }
        if (total >= d->max_conn) {
            if (d->n_pending == 0) {
                reply_error_fd(d, fd, DSP_ERR_BUSY, "new connection", "the server has %d connections open (--max-connections); retry later",
                               d->max_conn);
                continue;
            }
            pend_drop(d, 0, true); /* the oldest waiting */
        }
        pthread_mutex_lock(&d->mu);
        ip_add(d, &k, +1);
        pthread_mutex_unlock(&d->mu);
        pend *p = &d->pending[d->n_pending++];
        atomic_store(&d->n_pending_pub, d->n_pending);
        memset(p, 0, sizeof *p);
        p->fd = fd, p->ip = k, p->addr = a, p->addrlen = al, p->t0 = dsp_srv_now_ms();
    }
}

static void *door_main(void *arg) {
    dsp_srv_door *d = arg;
    int cap = 2 + d->max_conn + LINGER_MAX;
    struct pollfd *pf = malloc((size_t)cap * sizeof *pf);
    if (!pf) {
        fprintf(stderr, "dspark serve: out of memory in the connection thread\n");
        return NULL;
    }
    double timeout_ms = d->s->cfg.request_timeout_s * 1e3;
    for (;;) {
        int n = 0;
        pf[n++] = (struct pollfd){.fd = d->wake[0], .events = POLLIN};
        pf[n++] = (struct pollfd){.fd = d->lfd, .events = POLLIN};
        int np = d->n_pending, nl = d->n_linger;
        for (int i = 0; i < np; i++) pf[n++] = (struct pollfd){.fd = d->pending[i].fd, .events = POLLIN | POLLRDHUP};
        for (int i = 0; i < nl; i++) pf[n++] = (struct pollfd){.fd = d->lingering[i].fd, .events = POLLIN};
        double now = dsp_srv_now_ms(), next = now + 250;
        if (np && d->pending[0].t0 + timeout_ms < next) next = d->pending[0].t0 + timeout_ms;
        int r = poll(pf, (nfds_t)n, next > now ? (int)(next - now) + 1 : 0);
        if (r < 0 && errno != EINTR) break;
        if (pf[0].revents) break;
        /* lingering sockets: drain, close on EOF or deadline (back to front: removal swaps) */
        now = dsp_srv_now_ms();
        for (int i = nl - 1; i >= 0; i--) {
            lingerer *l = &d->lingering[i];
            bool done = now >= l->until;
            if (!done && pf[2 + np + i].revents) {
                ssize_t got = recv(l->fd, d->peek, HEAD_MAX, MSG_DONTWAIT);
                done = got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR);
            }
            if (done) {
                close(l->fd);
                *l = d->lingering[--d->n_linger];
            }
        }
        /* pending sockets, newest first (removal shifts later entries) */
        for (int i = np - 1; i >= 0; i--)
            if (pf[2 + i].revents) on_readable(d, i, pf[2 + i].revents);
        now = dsp_srv_now_ms();
        while (d->n_pending && d->pending[0].t0 + timeout_ms <= now) pend_drop(d, 0, false);
        if (pf[1].revents) on_accept(d);
    }
    free(pf);
    return NULL;
}

/* ---- lifecycle -------------------------------------------------------------------------------- */

dsp_status dsp_srv_door_start(dsp_srv *s, const struct sockaddr *addr, unsigned addrlen) {
    dsp_srv_door *d = calloc(1, sizeof *d);
    if (!d) return DSP_ERR_NOMEM;
    s->door = d;
    d->s = s;
    d->lfd = d->wake[0] = d->wake[1] = -1;
    d->max_conn = s->cfg.max_connections;
    d->per_client = s->cfg.max_connections_per_client;
    pthread_mutex_init(&d->mu, NULL);
    d->pending = calloc((size_t)d->max_conn, sizeof *d->pending);
    d->ips = calloc((size_t)d->max_conn * 2, sizeof *d->ips);
    d->active = calloc((size_t)d->max_conn, sizeof *d->active);
    d->peek = malloc(HEAD_MAX + 1);
    if (!d->pending || !d->ips || !d->active || !d->peek) return DSP_ERR_NOMEM;
    if (pipe2(d->wake, O_CLOEXEC)) return DSP_ERR_IO;
    d->lfd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (d->lfd < 0 || setsockopt(d->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) || bind(d->lfd, addr, addrlen) ||
        listen(d->lfd, 1024)) {
        fprintf(stderr, "dspark serve: cannot listen on %s:%d: %s\n", s->cfg.host, s->cfg.port, strerror(errno));
        return DSP_ERR_IO;
    }
    struct sockaddr_storage b;
    socklen_t bl = sizeof b;
    getsockname(d->lfd, (struct sockaddr *)&b, &bl);
    s->port = ntohs(b.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&b)->sin6_port : ((struct sockaddr_in *)&b)->sin_port);
    if (pthread_create(&d->thread, NULL, door_main, d)) return DSP_ERR_INTERNAL;
    d->started = true;
    return DSP_OK;
}

void dsp_srv_door_stop(dsp_srv *s) {
    dsp_srv_door *d = s->door;
    if (!d) return;
    if (d->started) {
        (void)!write(d->wake[1], "x", 1);
        pthread_join(d->thread, NULL);
        d->started = false;
    }
    for (int i = 0; i < d->n_pending; i++) close(d->pending[i].fd);
    for (int i = 0; i < d->n_linger; i++) close(d->lingering[i].fd);
    d->n_pending = d->n_linger = 0;
    if (d->lfd >= 0) close(d->lfd);
    if (d->wake[0] >= 0) close(d->wake[0]), close(d->wake[1]);
    d->lfd = d->wake[0] = d->wake[1] = -1;
}

void dsp_srv_door_destroy(dsp_srv *s) {
    dsp_srv_door *d = s->door;
    if (!d) return;
    dsp_srv_door_stop(s);
    pthread_mutex_destroy(&d->mu);
    free(d->pending);
    free(d->ips);
    free(d->active);
    free(d->peek);
    free(d);
    s->door = NULL;
}
