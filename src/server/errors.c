/* server/errors: the one table that maps an error kind (a dsp_status, or an HTTP-only kind) to
 * the HTTP status and the OpenAI error object's type and code. Every error reply goes through
 * here, so a status means the same thing on every route. */
#include "server/server.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct err_row {
    int kind;
    int http;
    const char *type;   /* OpenAI error.type */
    const char *code;   /* OpenAI error.code (NULL = null) */
} err_row;

static const err_row k_errors[] = {
    {DSP_ERR_INVALID_ARG, 400, "invalid_request_error", "invalid_value"},
    {DSP_ERR_FORMAT, 400, "invalid_request_error", "invalid_value"},
    {DSP_SRV_ERR_JSON, 400, "invalid_request_error", "invalid_json"},
    {DSP_ERR_UNSUPPORTED, 400, "invalid_request_error", "unsupported_parameter"},
    {DSP_ERR_RANGE, 400, "invalid_request_error", "context_length_exceeded"},
    {DSP_SRV_ERR_CONTEXT, 400, "invalid_request_error", "context_length_exceeded"},
    {DSP_ERR_TEMPLATE, 400, "invalid_request_error", "invalid_prompt"},
    {DSP_SRV_ERR_AUTH, 401, "invalid_request_error", "invalid_api_key"},
    {DSP_ERR_NOT_FOUND, 404, "invalid_request_error", "not_found"},
    {DSP_SRV_ERR_ROUTE, 404, "invalid_request_error", "not_found"},
    {DSP_SRV_ERR_MODEL, 404, "invalid_request_error", "model_not_found"},
    {DSP_SRV_ERR_METHOD, 405, "invalid_request_error", "method_not_allowed"},
    {DSP_SRV_ERR_TOO_LARGE, 413, "invalid_request_error", "request_too_large"},
    {DSP_SRV_ERR_HTTP, 400, "invalid_request_error", "invalid_http_request"},
    {DSP_SRV_ERR_TIMEOUT, 408, "invalid_request_error", "request_timeout"},
    {DSP_SRV_ERR_URI_TOO_LONG, 414, "invalid_request_error", "uri_too_long"},
    {DSP_SRV_ERR_TOO_MANY, 429, "rate_limit_error", "rate_limit_exceeded"},
    {DSP_SRV_ERR_HEADERS_TOO_LARGE, 431, "invalid_request_error", "headers_too_large"},
    {DSP_SRV_ERR_HTTP_VERSION, 505, "invalid_request_error", "http_version_not_supported"},
    {DSP_ERR_BUSY, 503, "server_error", "overloaded"},
    {DSP_ERR_CANCELLED, 503, "server_error", "cancelled"},
    {DSP_ERR_NOMEM, 503, "server_error", "out_of_memory"},
    {DSP_ERR_IO, 500, "server_error", NULL},
    {DSP_ERR_INTERNAL, 500, "server_error", NULL},
};
#define N_ERRORS (sizeof k_errors / sizeof k_errors[0])

static const err_row *find(int kind) {
    for (size_t i = 0; i < N_ERRORS; i++)
        if (k_errors[i].kind == kind) return &k_errors[i];
    return &k_errors[N_ERRORS - 1]; /* unknown: internal */
}

bool dsp_srv_fail(dsp_srv_error *e, int kind, const char *param, const char *fmt, ...) {
    e->kind = kind;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

int dsp_srv_error_http(int kind) { return find(kind)->http; }

/* Messages may quote client input cut at a byte limit: make them valid UTF-8 for JSON. */
static json_t *lossy_string(const char *s) {
    json_t *j = json_string(s);
    if (j) return j;
    size_t n = strlen(s);
    char *t = malloc(n + 1);
    if (!t) return json_string("");
    for (size_t i = 0; i < n; i++) t[i] = (unsigned char)s[i] < 0x80 ? s[i] : '?';
    t[n] = '\0';
    j = json_string(t);
    free(t);
    return j;
}

char *dsp_srv_error_json(const dsp_srv_error *e) {
    const err_row *row = find(e->kind);
    json_t *err = json_object();
    json_object_set_new(err, "message", lossy_string(e->message));
    json_object_set_new(err, "type", json_string(row->type));
    json_object_set_new(err, "param", e->param[0] ? lossy_string(e->param) : json_null());
    json_object_set_new(err, "code", row->code ? json_string(row->code) : json_null());
    json_t *root = json_pack("{s:o}", "error", err);
    char *out = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return out;
}
