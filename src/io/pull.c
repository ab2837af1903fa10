/* io/pull: see pull.h. One libcurl easy handle per request (connections are few: one listing, a
 * HEAD and a GET per file); the response headers of the last response of a request are captured
 * (a status line resets them, so after redirects they are the final response's). */
#include "io/pull.h"

#include "core/file.h"
#include "core/sha.h"
#include "io/hub.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_ENDPOINT "https://huggingface.co"
#define MAX_LISTING_BYTES (64u << 20)
#define MAX_PATH_LEN 1024
#define MAX_HEADER_VALUE 2048
#define DEFAULT_RETRIES 5
#define STALL_SECONDS 60

/* ---- small helpers --------------------------------------------------------------------------- */

static bool env_true(const char *name) {
    const char *v = getenv(name);
    return v && (!strcasecmp(v, "1") || !strcasecmp(v, "on") || !strcasecmp(v, "yes") || !strcasecmp(v, "true"));
}

static bool is_hex(const char *s, size_t n) {
    if (strlen(s) != n) return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

/* a file name from the server: a plain relative path (no "", ".", ".." component, no control
 * characters or backslashes), so that it can only land inside the snapshot */
static bool safe_rel_path(const char *p) {
    size_t n = strlen(p);
    if (n == 0 || n >= MAX_PATH_LEN || p[0] == '/') return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] < 0x20 || p[i] == '\\' || p[i] == 0x7F) return false;
    for (const char *c = p; *c;) {
        const char *e = strchr(c, '/');
        size_t l = e ? (size_t)(e - c) : strlen(c);
        if (l == 0 || (l == 1 && c[0] == '.') || (l == 2 && c[0] == '.' && c[1] == '.')) return false;
        c += l + (e ? 1 : 0);
        if (e && !*c) return false; /* trailing '/' */
    }
    return true;
}

/* percent-encode s; keep '/' when keep_slash (a path), as Python's quote() */
static char *url_quote(const char *s, bool keep_slash) {
    size_t n = strlen(s);
    char *o = malloc(3 * n + 1), *w = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || strchr("-_.~", c) || (keep_slash && c == '/'))
            *w++ = (char)c;
        else
            w += sprintf(w, "%%%02X", c);
    }
    *w = '\0';
    return o;
}

static char *str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *str_printf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!s) return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

/* mkdir -p of path's directories; with last, path itself too */
static dsp_status make_dirs(const char *path, bool last) {
    char *p = strdup(path);
    if (!p) return dsp_error(DSP_ERR_NOMEM, "no memory");
    dsp_status st = DSP_OK;
    for (char *c = p + 1;; c++) {
        bool end = *c == '\0';
        if (*c != '/' && !end) continue;
        if (end && !last) break;
        *c = '\0';
        if (mkdir(p, 0777) && errno != EEXIST) {
            st = dsp_error(DSP_ERR_IO, "cannot create directory %s: %s", p, strerror(errno));
            break;
        }
        if (end) break;
        *c = '/';
    }
    free(p);
    return st;
}

/* write text to path atomically (a temporary beside it, then rename) */
static dsp_status write_atomic(const char *path, const char *text) {
    char *tmp = str_printf("%s.tmp.%ld", path, (long)getpid());
    if (!tmp) return dsp_error(DSP_ERR_NOMEM, "no memory");
    FILE *f = fopen(tmp, "w");
    dsp_status st = DSP_OK;
    if (!f || fputs(text, f) < 0 || fclose(f)) {
        st = dsp_error(DSP_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
        if (f) unlink(tmp);
    } else if (rename(tmp, path)) {
        st = dsp_error(DSP_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        unlink(tmp);
    }
    free(tmp);
    return st;
}

/* ---- HTTP ------------------------------------------------------------------------------------ */

typedef struct http_resp {
    long status;
    char commit[MAX_HEADER_VALUE], etag[MAX_HEADER_VALUE], linked_etag[MAX_HEADER_VALUE], location[MAX_HEADER_VALUE];
    char content_range[128];
    int64_t content_length, linked_size;
    /* body into memory (listing), or into a file (download) */
    char *body;
    size_t body_len, body_max;
    bool body_too_big;
} http_resp;

typedef struct pull_ctx {
    const char *endpoint;
    char *auth;          /* "Authorization: Bearer ..." or NULL */
    const dsp_pull_params *p;
    char *repo_dir;
    const char *repo_id;
} pull_ctx;

static void header_value(const char *line, size_t n, const char *name, char *dst, size_t cap) {
    size_t k = strlen(name);
    if (n <= k || strncasecmp(line, name, k) || line[k] != ':') return;
    const char *v = line + k + 1;
    size_t l = n - k - 1;
    while (l && (*v == ' ' || *v == '\t')) v++, l--;
    while (l && (v[l - 1] == '\r' || v[l - 1] == '\n' || v[l - 1] == ' ')) l--;
    if (l >= cap) l = cap - 1; /* an oversized value is cut, and then fails validation */
    memcpy(dst, v, l);
    dst[l] = '\0';
}

static size_t on_header(char *line, size_t size, size_t nitems, void *ud) {
    http_resp *r = ud;
    size_t n = size * nitems;
    if (n >= 5 && !strncmp(line, "HTTP/", 5)) { /* a new response (after a redirect or 100): start over */
        r->commit[0] = r->etag[0] = r->linked_etag[0] = r->location[0] = r->content_range[0] = '\0';
        r->content_length = r->linked_size = -1;
        return n;
    }
    char num[32] = "";
    header_value(line, n, "X-Repo-Commit", r->commit, sizeof r->commit);
    header_value(line, n, "ETag", r->etag, sizeof r->etag);
    header_value(line, n, "X-Linked-Etag", r->linked_etag, sizeof r->linked_etag);
    header_value(line, n, "Location", r->location, sizeof r->location);
    header_value(line, n, "Content-Range", r->content_range, sizeof r->content_range);
    header_value(line, n, "Content-Length", num, sizeof num);
    if (num[0]) r->content_length = strtoll(num, NULL, 10);
    num[0] = '\0';
    header_value(line, n, "X-Linked-Size", num, sizeof num);
    if (num[0]) r->linked_size = strtoll(num, NULL, 10);
    return n;
}

static size_t on_body_mem(char *data, size_t size, size_t nmemb, void *ud) {
    http_resp *r = ud;
    size_t n = size * nmemb;
    if (r->body_len + n > r->body_max) {
        r->body_too_big = true;
        return 0;
    }
    char *b = realloc(r->body, r->body_len + n + 1);
    if (!b) return 0;
    r->body = b;
    memcpy(b + r->body_len, data, n);
    r->body_len += n;
    b[r->body_len] = '\0';
    return n;
}

static CURL *new_handle(const pull_ctx *c, const char *url, struct curl_slist **hdrs, http_resp *r) {
    *hdrs = NULL;
    CURL *h = curl_easy_init();
    if (!h) return NULL;
    /* the token goes to the endpoint only, never to a CDN (libcurl also drops it on redirects to
     * another host) */
    size_t el = strlen(c->endpoint);
    if (c->auth && !strncmp(url, c->endpoint, el) && (url[el] == '/' || url[el] == '\0')) *hdrs = curl_slist_append(*hdrs, c->auth);
    *hdrs = curl_slist_append(*hdrs, "Accept-Encoding: identity");
    memset(r, 0, sizeof *r);
    r->content_length = r->linked_size = -1;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, *hdrs);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "dspark-pull");
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L); /* a server that stops sending is a dropped transfer */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)STALL_SECONDS);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
    return h;
}

/* the message for a refused request */
static dsp_status http_error(const pull_ctx *c, long status, const char *what) {
    switch (status) {
    case 401:
        return dsp_error(DSP_ERR_IO, "%s: 401 Unauthorized: %s is private or gated (or does not exist); %s", what, c->repo_id,
                         c->auth ? "the token in HF_TOKEN was not accepted" : "set HF_TOKEN to a token that can read it");
    case 403: return dsp_error(DSP_ERR_IO, "%s: 403 Forbidden: this token may not read %s (a gated repo: accept its conditions on the hub)", what, c->repo_id);
    case 404: return dsp_error(DSP_ERR_NOT_FOUND, "%s: 404 Not Found", what);
    default: return dsp_error(DSP_ERR_IO, "%s: HTTP status %ld", what, status);
    }
}

/* ---- the listing ----------------------------------------------------------------------------- */

typedef struct pull_file {
    const char *name;      /* rfilename (owned by the listing JSON) */
    int64_t size;          /* -1 if the listing does not say */
    const char *lfs_sha;   /* lfs.sha256, or NULL */
    const char *blob_id;   /* git blob id, or NULL */
} pull_file;

static dsp_status fetch_listing(const pull_ctx *c, const dsp_hub_repo *r, json_t **out) {
    *out = NULL;
    char *rev = url_quote(r->rev, false);
    char *url = rev ? str_printf("%s/api/models/%s/%s/revision/%s?blobs=true", c->endpoint, r->org, r->name, rev) : NULL;
    free(rev);
    if (!url) return dsp_error(DSP_ERR_NOMEM, "no memory");
    http_resp resp;
    struct curl_slist *hdrs;
    CURL *h = new_handle(c, url, &hdrs, &resp);
    dsp_status st = DSP_OK;
    resp.body_max = MAX_LISTING_BYTES;
    if (!h) {
        st = dsp_error(DSP_ERR_NOMEM, "no memory for an HTTP request");
        goto done;
    }
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body_mem);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &resp);
    CURLcode cc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &resp.status);
    if (resp.body_too_big) st = dsp_error(DSP_ERR_FORMAT, "%s: the file listing is larger than %u bytes", url, MAX_LISTING_BYTES);
    else if (cc != CURLE_OK) st = dsp_error(DSP_ERR_IO, "%s: %s", url, curl_easy_strerror(cc));
    else if (resp.status == 404)
        st = dsp_error(DSP_ERR_NOT_FOUND, "%s@%s: no such repo or revision on %s (404 Not Found)", c->repo_id, r->rev, c->endpoint);
    else if (resp.status != 200) st = http_error(c, resp.status, url);
    else {
        json_error_t je;
        json_t *j = json_loadb(resp.body ? resp.body : "", resp.body_len, 0, &je);
        if (!j || !json_is_object(j))
            st = dsp_error(DSP_ERR_FORMAT, "%s: the file listing is not a JSON object (line %d: %s)", url, je.line, j ? "not an object" : je.text);
        else *out = j, j = NULL;
        json_decref(j);
    }
done:
    if (h) curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    free(resp.body);
    free(url);
    return st;
}

/* the files of the listing that the include globs select */
static dsp_status select_files(const pull_ctx *c, const json_t *listing, pull_file **out, int *n_out) {
    *out = NULL, *n_out = 0;
    const json_t *sib = json_object_get(listing, "siblings");
    if (!json_is_array(sib)) return dsp_error(DSP_ERR_FORMAT, "%s: the file listing has no \"siblings\" list", c->repo_id);
    pull_file *f = calloc(json_array_size(sib) + 1, sizeof *f);
    if (!f) return dsp_error(DSP_ERR_NOMEM, "no memory");
    int n = 0;
    size_t i;
    json_t *s;
    json_array_foreach(sib, i, s) {
        const char *name = json_string_value(json_object_get(s, "rfilename"));
        if (!name || !safe_rel_path(name)) {
            free(f);
            return dsp_error(DSP_ERR_FORMAT, "%s: the listing names a file '%.200s' that is not a plain relative path", c->repo_id, name ? name : "(none)");
        }
        bool take = c->p->n_include == 0;
        for (int k = 0; k < c->p->n_include && !take; k++) take = fnmatch(c->p->include[k], name, 0) == 0;
        if (!take) continue;
        const json_t *sz = json_object_get(s, "size"), *lfs = json_object_get(s, "lfs");
        f[n].name = name;
        f[n].size = json_is_integer(sz) && json_integer_value(sz) >= 0 ? (int64_t)json_integer_value(sz) : -1;
        f[n].blob_id = json_string_value(json_object_get(s, "blobId"));
        if (json_is_object(lfs)) {
            f[n].lfs_sha = json_string_value(json_object_get(lfs, "sha256"));
            const json_t *ls = json_object_get(lfs, "size");
            if (json_is_integer(ls) && json_integer_value(ls) >= 0) f[n].size = (int64_t)json_integer_value(ls);
        }
        n++;
    }
    *out = f, *n_out = n;
    return DSP_OK;
}

/* ---- one file -------------------------------------------------------------------------------- */

typedef struct file_meta {
    char etag[80];
    int64_t size;
    char *url; /* where the bytes are: the CDN Location of an LFS file, else the resolve URL */
} file_meta;

/* HEAD the resolve URL, following only relative redirects (a renamed repo), as huggingface_hub */
static dsp_status head_file(const pull_ctx *c, const char *commit, const pull_file *pf, file_meta *m) {
    memset(m, 0, sizeof *m);
    char *path = url_quote(pf->name, true);
    char *url = path ? str_printf("%s/%s/resolve/%s/%s", c->endpoint, c->repo_id, commit, path) : NULL;
    free(path);
    if (!url) return dsp_error(DSP_ERR_NOMEM, "no memory");
    dsp_status st = DSP_OK;
    http_resp r;
    for (int hop = 0;; hop++) {
        struct curl_slist *hdrs;
        CURL *h = new_handle(c, url, &hdrs, &r);
        if (!h) {
            curl_slist_free_all(hdrs);
            st = dsp_error(DSP_ERR_NOMEM, "no memory for an HTTP request");
            break;
        }
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
        CURLcode cc = curl_easy_perform(h);
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
        curl_easy_cleanup(h);
        curl_slist_free_all(hdrs);
        if (cc != CURLE_OK) {
            st = dsp_error(DSP_ERR_IO, "%s: %s", url, curl_easy_strerror(cc));
            break;
        }
        if (r.status >= 300 && r.status < 400 && r.location[0] == '/' && hop < 5) { /* relative: same host */
            const char *host_end = strstr(url, "://");
            host_end = host_end ? strchr(host_end + 3, '/') : NULL;
            char *next = str_printf("%.*s%s", host_end ? (int)(host_end - url) : (int)strlen(url), url, r.location);
            if (!next) {
                st = dsp_error(DSP_ERR_NOMEM, "no memory");
                break;
            }
            free(url);
            url = next;
            continue;
        }
        break;
    }
    if (!st && r.status >= 300 && r.status < 400 && r.location[0] == '/') st = dsp_error(DSP_ERR_IO, "%s: %s: too many redirects", c->repo_id, pf->name);
    if (!st && r.status == 404) st = dsp_error(DSP_ERR_NOT_FOUND, "%s: %s is not in commit %s (404 Not Found)", c->repo_id, pf->name, commit);
    else if (!st && !(r.status == 200 || (r.status >= 300 && r.status < 400))) st = http_error(c, r.status, url);
    if (st) {
        free(url);
        return st;
    }
    /* the etag names the blob: "abc", W/"abc" or abc -> abc; it must be a hex digest */
    const char *e = r.linked_etag[0] ? r.linked_etag : r.etag;
    if (!strncmp(e, "W/", 2)) e += 2;
    size_t el = strlen(e);
    if (el >= 2 && e[0] == '"' && e[el - 1] == '"') e++, el -= 2;
    if (el < sizeof m->etag) memcpy(m->etag, e, el), m->etag[el] = '\0';
    if (!r.commit[0])
        st = dsp_error(DSP_ERR_FORMAT, "%s: %s: no X-Repo-Commit header: %s does not answer as the Hugging Face hub does", c->repo_id, pf->name, c->endpoint);
    else if (strcmp(r.commit, commit))
        st = dsp_error(DSP_ERR_FORMAT, "%s: %s: the server says commit %.64s, the listing %s", c->repo_id, pf->name, r.commit, commit);
    else if (!is_hex(m->etag, 64) && !is_hex(m->etag, 40))
        st = dsp_error(DSP_ERR_FORMAT, "%s: %s: etag '%.80s' is neither a SHA-256 nor a git blob id", c->repo_id, pf->name, e);
    else if (pf->lfs_sha && strcmp(pf->lfs_sha, m->etag))
        st = dsp_error(DSP_ERR_FORMAT, "%s: %s: etag %s differs from the listing's LFS SHA-256 %.64s", c->repo_id, pf->name, m->etag, pf->lfs_sha);
    else if (!pf->lfs_sha && pf->blob_id && strcmp(pf->blob_id, m->etag))
        st = dsp_error(DSP_ERR_FORMAT, "%s: %s: etag %s differs from the listing's git blob id %.40s", c->repo_id, pf->name, m->etag, pf->blob_id);
    if (st) {
        free(url);
        return st;
    }
    m->size = r.linked_size >= 0 ? r.linked_size : r.status == 200 ? r.content_length : -1;
    if (m->size < 0) m->size = pf->size;
    if (m->size < 0 || (pf->size >= 0 && pf->size != m->size)) {
        free(url);
        return dsp_error(DSP_ERR_FORMAT, "%s: %s: size %" PRId64 " from the server, %" PRId64 " from the listing", c->repo_id, pf->name, m->size, pf->size);
    }
    if (r.status >= 300 && r.location[0]) { /* absolute: the CDN */
        free(url);
        url = strdup(r.location);
        if (!url) return dsp_error(DSP_ERR_NOMEM, "no memory");
    }
    m->url = url;
    return DSP_OK;
}

/* the download of one blob: the file, the hash of what it holds so far, progress */
typedef struct dl {
    int fd;
    int64_t have, size;   /* bytes in the file; expected total */
    bool sha256;          /* else the git blob SHA-1 */
    dsp_sha256 s256;
    dsp_sha1 s1;
    CURL *h;
    http_resp *r;
    bool started, restart, io_error, too_long;
    const char *name;
    int report;
    double t0, last_draw;
    int64_t t0_have;
} dl;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void hash_reset(dl *d) {
    if (d->sha256) {
        dsp_sha256_init(&d->s256);
    } else {
        char hdr[40];
        int n = snprintf(hdr, sizeof hdr, "blob %" PRId64, d->size);
        dsp_sha1_init(&d->s1);
        dsp_sha1_update(&d->s1, hdr, (size_t)n + 1); /* with its NUL */
    }
}

static void hash_add(dl *d, const void *p, size_t n) {
    if (d->sha256) dsp_sha256_update(&d->s256, p, n);
    else dsp_sha1_update(&d->s1, p, n);
}

/* bytes as "120 B", "812 kB", "3.4 MB", "16.10 GB" */
static const char *human(double b, char buf[16]) {
    if (b < 1e3) snprintf(buf, 16, "%.0f B", b);
    else if (b < 1e6) snprintf(buf, 16, "%.0f kB", b / 1e3);
    else if (b < 1e9) snprintf(buf, 16, "%.1f MB", b / 1e6);
    else snprintf(buf, 16, "%.2f GB", b / 1e9);
    return buf;
}

static void draw(dl *d, bool final) {
    double t = now_s();
    if (d->report < 2 || (!final && t - d->last_draw < 0.1)) return;
    d->last_draw = t;
    double frac = d->size > 0 ? (double)d->have / (double)d->size : 1.0, rate = (double)(d->have - d->t0_have) / 1e6 / (t - d->t0 + 1e-9);
    char bar[31];
    int fill = (int)(frac * 30);
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : ' ';
    bar[30] = '\0';
    char a[16], b[16];
    fprintf(stderr, "\r  %-32.32s %3d%% [%s] %9s / %-9s %7.1f MB/s%s", d->name, (int)(frac * 100), bar, human((double)d->have, a),
            human((double)d->size, b), rate, final ? "\n" : "");
}

static size_t on_body_file(char *data, size_t size, size_t nmemb, void *ud) {
    dl *d = ud;
    size_t n = size * nmemb;
    long status = 0;
    curl_easy_getinfo(d->h, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200 && status != 206) return n; /* an error page: not the file (the status is checked after) */
    if (!d->started) {
        d->started = true;
        if (status == 200 && d->have > 0) { /* the server ignored Range: start over */
            if (ftruncate(d->fd, 0) || lseek(d->fd, 0, SEEK_SET) < 0) {
                d->io_error = true;
                return 0;
            }
            d->have = 0;
            hash_reset(d);
        } else if (status == 206) { /* it must continue exactly where the file ends */
            int64_t from = -1;
            if (sscanf(d->r->content_range, "bytes %" SCNd64 "-", &from) != 1 || from != d->have) {
                d->restart = true;
                return 0;
            }
        }
    }
    if ((int64_t)n > d->size - d->have) { /* more bytes than the file has: never written */
        d->too_long = true;
        return 0;
    }
    for (size_t off = 0; off < n;) {
        ssize_t w = write(d->fd, data + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            d->io_error = true;
            return 0;
        }
        off += (size_t)w;
    }
    hash_add(d, data, n);
    d->have += (int64_t)n;
    draw(d, false);
    return n;
}

/* bring the hash up to date with the bytes already in a partial file */
static dsp_status hash_existing(dl *d, const char *path) {
    hash_reset(d);
    if (lseek(d->fd, 0, SEEK_SET) < 0) return dsp_error(DSP_ERR_IO, "%s: %s", path, strerror(errno));
    enum { BUF = 1 << 20 };
    char *buf = malloc(BUF);
    if (!buf) return dsp_error(DSP_ERR_NOMEM, "no memory");
    dsp_status st = DSP_OK;
    for (int64_t left = d->have; left > 0 && !st;) {
        ssize_t r = read(d->fd, buf, left < BUF ? (size_t)left : BUF);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) st = dsp_error(DSP_ERR_IO, "%s: cannot read back the partial download: %s", path, r ? strerror(errno) : "short file");
        else hash_add(d, buf, (size_t)r), left -= r;
    }
    free(buf);
    if (!st && lseek(d->fd, 0, SEEK_END) < 0) st = dsp_error(DSP_ERR_IO, "%s: %s", path, strerror(errno));
    return st;
}

/* download m->url into blob (via blob.incomplete), resuming and retrying, and verify it */
static dsp_status download(const pull_ctx *c, const pull_file *pf, const file_meta *m, const char *blob) {
    char *part = str_printf("%s.incomplete", blob);
    if (!part) return dsp_error(DSP_ERR_NOMEM, "no memory");
    dsp_status st = DSP_OK;
    dl d;
    memset(&d, 0, sizeof d);
    d.fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (d.fd < 0) {
        st = dsp_error(DSP_ERR_IO, "cannot create %s: %s", part, strerror(errno));
        free(part);
        return st;
    }
    if (flock(d.fd, LOCK_EX | LOCK_NB)) {
        st = dsp_error(DSP_ERR_IO, "%s: another download of %s is in progress (%s is locked)", c->repo_id, pf->name, part);
        goto out;
    }
    struct stat sb;
    if (fstat(d.fd, &sb)) {
        st = dsp_error(DSP_ERR_IO, "%s: %s", part, strerror(errno));
        goto out;
    }
    d.size = m->size;
    d.have = sb.st_size <= d.size ? (int64_t)sb.st_size : 0;
    d.sha256 = strlen(m->etag) == 64;
    d.name = pf->name;
    d.report = c->p->report;
    if (sb.st_size > d.size && ftruncate(d.fd, 0)) {
        st = dsp_error(DSP_ERR_IO, "%s: %s", part, strerror(errno));
        goto out;
    }
    struct statvfs vfs;
    if (!fstatvfs(d.fd, &vfs) && (double)vfs.f_bavail * (double)vfs.f_frsize < (double)(d.size - d.have)) {
        st = dsp_error(DSP_ERR_IO, "%s: %s needs %.1f MB more, %s has %.1f MB free", c->repo_id, pf->name, (double)(d.size - d.have) / 1e6, part,
                       (double)vfs.f_bavail * (double)vfs.f_frsize / 1e6);
        goto out;
    }
    if ((st = hash_existing(&d, part))) goto out;
    int retries = c->p->retries > 0 ? c->p->retries : DEFAULT_RETRIES, failures = 0;
    d.t0 = now_s(), d.t0_have = d.have;
    for (bool restarted = false;;) {
        if (d.have == d.size) break;
        http_resp r;
        struct curl_slist *hdrs;
        d.h = new_handle(c, m->url, &hdrs, &r);
        if (!d.h) {
            curl_slist_free_all(hdrs);
            st = dsp_error(DSP_ERR_NOMEM, "no memory for an HTTP request");
            break;
        }
        char range[64];
        if (d.have > 0) {
            snprintf(range, sizeof range, "%" PRId64 "-", d.have);
            curl_easy_setopt(d.h, CURLOPT_RANGE, range);
        }
        d.r = &r;
        d.started = d.restart = d.io_error = d.too_long = false;
        int64_t before = d.have;
        curl_easy_setopt(d.h, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(d.h, CURLOPT_WRITEFUNCTION, on_body_file);
        curl_easy_setopt(d.h, CURLOPT_WRITEDATA, &d);
        CURLcode cc = curl_easy_perform(d.h);
        curl_easy_getinfo(d.h, CURLINFO_RESPONSE_CODE, &r.status);
        curl_easy_cleanup(d.h);
        curl_slist_free_all(hdrs);
        d.h = NULL;
        if (d.io_error) {
            st = dsp_error(DSP_ERR_IO, "cannot write %s: %s", part, strerror(errno));
            break;
        }
        if (d.too_long) { /* the bytes so far cannot be trusted either */
            st = dsp_error(DSP_ERR_FORMAT, "%s: %s: the server sent more than the %" PRId64 " bytes it announced; the bytes were discarded", c->repo_id,
                           pf->name, d.size);
            unlink(part);
            break;
        }
        bool transient = r.status == 429 || r.status >= 500; /* retried like a dropped connection */
        if (r.status == 416 && d.have > 0 && !restarted) { /* the range is past the end: the partial file is stale */
            d.restart = true;
        } else if (cc == CURLE_OK && r.status != 200 && r.status != 206 && !transient) {
            st = r.status == 404 ? dsp_error(DSP_ERR_NOT_FOUND, "%s: %s: 404 Not Found at %s", c->repo_id, pf->name, m->url)
                                 : http_error(c, r.status, m->url);
            break;
        }
        if (d.restart) { /* the server's bytes do not continue the file: once from the beginning */
            if (restarted) {
                st = dsp_error(DSP_ERR_FORMAT, "%s: %s: the server's ranges do not continue the partial download", c->repo_id, pf->name);
                break;
            }
            restarted = true;
            if (ftruncate(d.fd, 0) || lseek(d.fd, 0, SEEK_SET) < 0) {
                st = dsp_error(DSP_ERR_IO, "%s: %s", part, strerror(errno));
                break;
            }
            d.have = 0;
            hash_reset(&d);
            continue;
        }
        if (cc == CURLE_OK && d.have == d.size) break;
        if (cc == CURLE_OK && d.have < d.size) cc = CURLE_PARTIAL_FILE; /* ended early without saying so */
        const char *why = transient ? "the server answered with an error status" : curl_easy_strerror(cc);
        if (d.have > before) failures = 0; /* progress: the retry budget starts again */
        if (++failures > retries) {
            st = dsp_error(DSP_ERR_IO, "%s: %s: %s after %d attempts (%" PRId64 " of %" PRId64 " bytes kept in %s; pull again to resume)", c->repo_id,
                           pf->name, why, failures, d.have, d.size, part);
            break;
        }
        long ms = 200L * failures; /* back off a little more each time */
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (!st) {
        draw(&d, true);
        uint8_t dig[32];
        char hex[65];
        if (d.sha256) dsp_sha256_final(&d.s256, dig), dsp_hex(dig, 32, hex);
        else dsp_sha1_final(&d.s1, dig), dsp_hex(dig, 20, hex);
        if (strcmp(hex, m->etag)) {
            st = dsp_error(DSP_ERR_FORMAT, "%s: %s: corrupted download: its %s is %s, the hub says %s; the bytes were discarded", c->repo_id, pf->name,
                           d.sha256 ? "SHA-256" : "git blob id", hex, m->etag);
            unlink(part);
        } else if (fdatasync(d.fd) || rename(part, blob)) {
            st = dsp_error(DSP_ERR_IO, "cannot move %s to %s: %s", part, blob, strerror(errno));
        }
    } else if (d.report == 2) {
        fputc('\n', stderr);
    }
out:
    close(d.fd);
    free(part);
    return st;
}

/* snapshots/COMMIT/name -> ../../blobs/ETAG (one more ../ per directory in name), replaced atomically */
static dsp_status link_snapshot(const char *snap, const char *name, const char *etag) {
    char *link = dsp_path_join(snap, name);
    if (!link) return dsp_error(DSP_ERR_NOMEM, "no memory");
    dsp_status st = make_dirs(link, false);
    size_t depth = 2;
    for (const char *s = name; *s; s++) depth += *s == '/';
    char *target = malloc(3 * depth + 8 + strlen(etag)), *tmp = str_printf("%s.tmp.%ld", link, (long)getpid());
    if (!st && (!target || !tmp)) st = dsp_error(DSP_ERR_NOMEM, "no memory");
    if (!st) {
        target[0] = '\0';
        for (size_t i = 0; i < depth; i++) strcat(target, "../");
        strcat(target, "blobs/");
        strcat(target, etag);
        unlink(tmp);
        if (symlink(target, tmp) || rename(tmp, link)) {
            st = dsp_error(DSP_ERR_IO, "cannot link %s to %s: %s", link, target, strerror(errno));
            unlink(tmp);
        }
    }
    free(link);
    free(target);
    free(tmp);
    return st;
}

static dsp_status pull_one(const pull_ctx *c, const char *commit, const char *snap, const pull_file *pf, int64_t *bytes, bool *cached) {
    file_meta m;
    dsp_status st = head_file(c, commit, pf, &m);
    if (st) return st;
    char *blobs = dsp_path_join(c->repo_dir, "blobs"), *blob = blobs ? dsp_path_join(blobs, m.etag) : NULL;
    if (!blob) st = dsp_error(DSP_ERR_NOMEM, "no memory");
    struct stat sb;
    *cached = !st && stat(blob, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size == m.size;
    if (!st && !*cached) st = download(c, pf, &m, blob);
    if (!st) st = link_snapshot(snap, pf->name, m.etag);
    if (!st && (c->p->report == 1 || (c->p->report == 2 && *cached)))
        fprintf(stderr, "  %s: %s%s\n", pf->name, human((double)m.size, (char[16]){0}), *cached ? " (in the cache)" : "");
    *bytes = m.size;
    free(blobs);
    free(blob);
    free(m.url);
    return st;
}

/* ---- the token ------------------------------------------------------------------------------- */

/* HF_TOKEN, else the token file huggingface-cli login writes; NULL if none */
static char *read_token(void) {
    const char *e = getenv("HF_TOKEN");
    if (e && *e) return strdup(e);
    char *path = NULL;
    if ((e = getenv("HF_TOKEN_PATH")) && *e) path = strdup(e);
    else if ((e = getenv("HF_HOME")) && *e) path = dsp_path_join(e, "token");
    else if ((e = getenv("HOME")) && *e) path = dsp_path_join(e, ".cache/huggingface/token");
    char *tok = NULL;
    size_t n = 0;
    if (path && dsp_file_exists(path) && dsp_file_read(path, 4096, &tok, &n) == DSP_OK) {
        while (n && (tok[n - 1] == '\n' || tok[n - 1] == '\r' || tok[n - 1] == ' ')) tok[--n] = '\0';
        if (!n) free(tok), tok = NULL;
    }
    dsp_error_clear();
    free(path);
    return tok;
}

/* ---- the repo -------------------------------------------------------------------------------- */

dsp_status dsp_pull_repo(const char *repo_id, const dsp_pull_params *p, char **snapshot) {
    *snapshot = NULL;
    dsp_pull_params defaults = {0};
    if (!p) p = &defaults;
    dsp_hub_repo r;
    dsp_status st = dsp_hub_parse(repo_id, &r);
    if (st) return st;
    if (env_true("HF_HUB_OFFLINE")) { /* no network: what the cache has, or an error */
        st = dsp_hub_resolve_cached(repo_id, snapshot);
        if (st) dsp_error_prefix("HF_HUB_OFFLINE is set, so nothing is downloaded");
        else if (p->report) fprintf(stderr, "HF_HUB_OFFLINE is set: %s is in the cache, nothing downloaded\n", repo_id);
        return st;
    }
    pull_ctx c = {.p = p, .repo_id = NULL};
    char *endpoint = strdup(getenv("HF_ENDPOINT") && *getenv("HF_ENDPOINT") ? getenv("HF_ENDPOINT") : DEFAULT_ENDPOINT);
    char *id = str_printf("%s/%s", r.org, r.name), *token = read_token();
    json_t *listing = NULL;
    pull_file *files = NULL;
    int n_files = 0;
    char *snap = NULL, *snaps = NULL;
    if (!endpoint || !id) {
        st = dsp_error(DSP_ERR_NOMEM, "no memory");
        goto out;
    }
    for (size_t n = strlen(endpoint); n && endpoint[n - 1] == '/';) endpoint[--n] = '\0';
    if (strncmp(endpoint, "http://", 7) && strncmp(endpoint, "https://", 8)) {
        st = dsp_error(DSP_ERR_INVALID_ARG, "HF_ENDPOINT '%.200s' is not an http:// or https:// URL", endpoint);
        goto out;
    }
    if (token) {
        for (const char *t = token; *t; t++)
            if ((unsigned char)*t <= 0x20 || *t == 0x7F) {
                st = dsp_error(DSP_ERR_INVALID_ARG, "the Hugging Face token contains spaces or control characters");
                goto out;
            }
        c.auth = str_printf("Authorization: Bearer %s", token);
    }
    c.endpoint = endpoint;
    c.repo_id = id;
    if (curl_global_init(CURL_GLOBAL_DEFAULT)) {
        st = dsp_error(DSP_ERR_INTERNAL, "libcurl failed to initialize");
        goto out;
    }
    if ((st = dsp_hub_repo_dir(&r, &c.repo_dir)) || (st = fetch_listing(&c, &r, &listing))) goto cleanup;
    const char *commit = json_string_value(json_object_get(listing, "sha"));
    if (!commit || !dsp_hub_is_commit(commit)) {
        st = dsp_error(DSP_ERR_FORMAT, "%s@%s: the listing has no commit id (\"sha\")", id, r.rev);
        goto cleanup;
    }
    if ((st = select_files(&c, listing, &files, &n_files))) goto cleanup;
    if (n_files == 0) {
        st = dsp_error(DSP_ERR_NOT_FOUND, "%s@%s: no file matches --include", id, r.rev);
        goto cleanup;
    }
    snaps = dsp_path_join(c.repo_dir, "snapshots");
    snap = snaps ? dsp_path_join(snaps, commit) : NULL;
    char *blobs = dsp_path_join(c.repo_dir, "blobs");
    if (!snap || !blobs) st = dsp_error(DSP_ERR_NOMEM, "no memory");
    if (!st) st = make_dirs(blobs, true);
    if (!st) st = make_dirs(snap, true);
    free(blobs);
    if (st) goto cleanup;
    if (p->report)
        fprintf(stderr, "pulling %s@%s (commit %.12s): %d file%s from %s into %s\n", id, r.rev, commit, n_files, n_files == 1 ? "" : "s", endpoint,
                c.repo_dir);
    int64_t total = 0;
    int n_cached = 0;
    for (int i = 0; i < n_files && !st; i++) {
        int64_t bytes = 0;
        bool cached = false;
        st = pull_one(&c, commit, snap, &files[i], &bytes, &cached);
        total += bytes, n_cached += cached;
    }
    if (st) goto cleanup;
    if (strcmp(r.rev, commit)) { /* a branch or tag: remember where it points, as huggingface_hub */
        char *refs = dsp_path_join(c.repo_dir, "refs"), *ref = refs ? dsp_path_join(refs, r.rev) : NULL;
        st = ref ? make_dirs(ref, false) : dsp_error(DSP_ERR_NOMEM, "no memory");
        if (!st) st = write_atomic(ref, commit);
        free(refs);
        free(ref);
        if (st) goto cleanup;
    }
    if (p->report) fprintf(stderr, "%s@%s: %d files, %s (%d already in the cache)\n", id, r.rev, n_files, human((double)total, (char[16]){0}), n_cached);
    *snapshot = snap, snap = NULL;
cleanup:
    curl_global_cleanup();
out:
    free(files);
    json_decref(listing);
    free(snap);
    free(snaps);
    free(c.repo_dir);
    free(c.auth);
    free(token);
    free(id);
    free(endpoint);
    return st;
}
