/* server/openai: OpenAI request parsing/validation and response/SSE chunk building.
 *
 * Requests are untrusted: every field is type- and range-checked before anything it sizes is
 * allocated, and an error names the field (OpenAI's error.param). Omitted sampling fields take
 * the model's generation_config.json (Hugging Face directories), else OpenAI's API defaults
 * (temperature 1, top_p 1, no penalties); note that the dspark CLI defaults to greedy instead. Unknown fields are
 * ignored (clients send extras); fields that would change the meaning of a request and are not
 * supported here (n > 1, tools, response_format other than text, suffix, best_of > 1, echo with
 * logprobs) are rejected with a 400 rather than silently dropped.
 *
 * Logprobs are the engine's raw log-softmax of the model's logits (vLLM's default). Chat:
 * choices[].logprobs.content[] = {token, logprob, bytes, top_logprobs[{token, logprob, bytes}]};
 * completions: {tokens, token_logprobs, top_logprobs[{token: logprob}], text_offset}, where
 * top_logprobs holds the n most likely tokens plus the chosen one (as vLLM). An end-of-generation
 * token ends the request but is not part of the text, so it is left out of the logprobs; it is
 * counted in usage.completion_tokens. */
#include "server/server.h"

#include "core/utf8.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_LOGIT_BIAS 1024   /* entries in logit_bias */
#define MAX_STOP_BYTES 1024   /* bytes per stop string */

/* ---- JSON field helpers --------------------------------------------------------------------- */

static json_t *field(json_t *root, const char *key) {
    json_t *v = json_object_get(root, key);
    return v && !json_is_null(v) ? v : NULL;
}

/* number in [lo, hi] (lo excluded when lo_open); absent or null leaves *out */
static bool get_num(json_t *root, const char *key, double lo, double hi, bool lo_open, float *out, dsp_srv_error *e) {
    json_t *v = field(root, key);
    if (!v) return true;
    if (!json_is_number(v)) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, key, "'%s' must be a number", key);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi) || (lo_open && d == lo))
        return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, key, "'%s' must be %s %g and <= %g (got %g)", key, lo_open ? ">" : ">=", lo, hi, d);
    *out = (float)d;
    return true;
}

static bool get_int(json_t *root, const char *key, long long lo, long long hi, long long *out, bool *present, dsp_srv_error *e) {
    json_t *v = field(root, key);
    if (present) *present = v != NULL;
    if (!v) return true;
    if (!json_is_integer(v)) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, key, "'%s' must be an integer", key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, key, "'%s' must be between %lld and %lld (got %lld)", key, lo, hi, x);
    *out = x;
    return true;
}

static bool get_bool(json_t *root, const char *key, bool *out, dsp_srv_error *e) {
    json_t *v = field(root, key);
    if (!v) return true;
    if (!json_is_boolean(v)) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return true;
}

/* A field this server does not implement: a 400 unless absent, null or the harmless value. */
static bool reject_field(json_t *root, const char *key, const char *why, dsp_srv_error *e) {
    if (!field(root, key)) return true;
    return dsp_srv_fail(e, DSP_ERR_UNSUPPORTED, key, "'%s' is not supported by this server%s", key, why);
}

/* A JSON string of bytes that may not be valid UTF-8 (a token piece can be part of a character):
 * each maximal invalid subsequence becomes U+FFFD, as the tokenizer's decoder does. */
static json_t *jstr_lossy(const char *p, size_t n) {
    json_t *j = json_stringn(p, n);
    if (j) return j;
    size_t tn;
    char *t = dsp_utf8_sanitize(p, n, &tn);
    j = t ? json_stringn(t, tn) : NULL;
    free(t);
    return j ? j : json_string("");
}

/* ---- request parsing ------------------------------------------------------------------------- */

bool dsp_srv_model_known(dsp_srv *s, const char *name) {
    if (!strcmp(name, s->model_id) || !strcmp(name, s->file_id)) return true;
    size_t n = strlen(s->file_id);
    if (!strncmp(name, s->file_id, n) && !strcmp(name + n, ".gguf")) return true;
    for (int i = 0; i < s->cfg.n_aliases; i++)
        if (!strcmp(name, s->cfg.aliases[i])) return true;
    return false;
}

json_t *dsp_srv_text_parts(json_t *content, const char *pname, const char *const *types, dsp_srv_error *e) {
    if (json_is_string(content)) return json_incref(content);
    if (!json_is_array(content)) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "'%s' must be a string or an array of text parts", pname), NULL;
    /* text parts joined with newlines (as vLLM) */
    size_t np = json_array_size(content), total = 0;
    for (size_t k = 0; k < np; k++) {
        json_t *part = json_array_get(content, k);
        json_t *type = json_object_get(part, "type"), *pt = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type))
            return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "'%s[%zu]' must be an object with a 'type'", pname, k), NULL;
        bool known = false;
        for (int t = 0; types[t]; t++) known = known || !strcmp(json_string_value(type), types[t]);
        if (!known)
            return dsp_srv_fail(e, DSP_ERR_UNSUPPORTED, pname, "'%s[%zu]': content parts of type '%.32s' are not supported (only '%s')", pname, k,
                                json_string_value(type), types[0]),
                   NULL;
        if (!json_is_string(pt)) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "'%s[%zu].text' must be a string", pname, k), NULL;
        total += json_string_length(pt) + 1;
    }
    char *buf = malloc(total + 1);
    if (!buf) return dsp_srv_fail(e, DSP_ERR_NOMEM, NULL, "out of memory"), NULL;
    size_t o = 0;
    for (size_t k = 0; k < np; k++) {
        json_t *pt = json_object_get(json_array_get(content, k), "text");
        if (k) buf[o++] = '\n';
        memcpy(buf + o, json_string_value(pt), json_string_length(pt));
        o += json_string_length(pt);
    }
    json_t *text = json_stringn_nocheck(buf, o);
    free(buf);
    return text;
}

/* The function name of the assistant tool call with this id in msgs (the converted history), or NULL. */
const char *dsp_srv_call_name(json_t *msgs, const char *id) {
    size_t i, k;
    json_t *m, *c;
    json_array_foreach(msgs, i, m) {
        json_array_foreach(json_object_get(m, "tool_calls"), k, c) {
            if (!strcmp(json_string_value(json_object_get(c, "id")), id))
                return json_string_value(json_object_get(json_object_get(c, "function"), "name"));
        }
    }
    return NULL;
}

static const char *const k_text_types[] = {"text", NULL};

/* OpenAI messages -> the template's messages: {role, content}, assistant tool_calls (arguments as
 * objects) and tool results {role: "tool", content, tool_call_id, name}. */
static json_t *parse_messages(json_t *root, dsp_srv_error *e) {
    json_t *msgs = field(root, "messages");
    if (!msgs) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "messages", "'messages' is required"), NULL;
    if (!json_is_array(msgs)) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "messages", "'messages' must be an array"), NULL;
    size_t n = json_array_size(msgs);
    if (n == 0) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "messages", "'messages' must contain at least one message"), NULL;
    json_t *out = json_array();
    char pname[64];
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(msgs, i);
        if (!json_is_object(m)) {
            snprintf(pname, sizeof pname, "messages[%zu]", i);
            dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "'%s' must be an object with 'role' and 'content'", pname);
            goto bad;
        }
        json_t *role = json_object_get(m, "role");
        snprintf(pname, sizeof pname, "messages[%zu].role", i);
        if (!json_is_string(role)) {
            dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "'%s' must be a string", pname);
            goto bad;
        }
        const char *rs = json_string_value(role);
        if (!strcmp(rs, "developer")) rs = "system"; /* OpenAI's newer name for system */
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") && strcmp(rs, "tool")) {
            dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "'%s' must be one of system, developer, user, assistant, tool (got '%.64s')", pname, rs);
            goto bad;
        }
        if (field(m, "function_call")) {
            snprintf(pname, sizeof pname, "messages[%zu].function_call", i);
            dsp_srv_fail(e, DSP_ERR_UNSUPPORTED, pname, "'function_call' (deprecated) is not supported: use 'tool_calls'");
            goto bad;
        }
        json_t *calls = field(m, "tool_calls");
        json_t *content = json_object_get(m, "content");
        snprintf(pname, sizeof pname, "messages[%zu].content", i);
        json_t *text = (!content || json_is_null(content)) && calls && !strcmp(rs, "assistant") ? json_string("")
                                                                                               : dsp_srv_text_parts(content, pname, k_text_types, e);
        if (!text) goto bad;
        json_t *msg = json_pack("{s:s, s:o}", "role", rs, "content", text);
        json_array_append_new(out, msg);
        if (calls) {
            snprintf(pname, sizeof pname, "messages[%zu].tool_calls", i);
            if (strcmp(rs, "assistant") || !json_is_array(calls)) {
                dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "'%s' must be an array, on an assistant message", pname);
                goto bad;
            }
            json_t *tc = json_array();
            json_object_set_new(msg, "tool_calls", tc);
            size_t k;
            json_t *c;
            json_array_foreach(calls, k, c) {
                json_t *fn = json_object_get(c, "function"), *id = json_object_get(c, "id");
                json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
                if (!json_is_string(id) || !json_is_string(name) || !(json_is_string(args) || json_is_object(args))) {
                    dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname,
                                 "'%s[%zu]' must be {\"id\": string, \"type\": \"function\", \"function\": {\"name\": string, \"arguments\": string}}",
                                 pname, k);
                    goto bad;
                }
                json_array_append_new(tc, dsp_srv_tool_call_msg(json_string_value(id), json_string_value(name), args));
            }
        }
        if (!strcmp(rs, "tool")) {
            json_t *id = json_object_get(m, "tool_call_id");
            snprintf(pname, sizeof pname, "messages[%zu].tool_call_id", i);
            if (!json_is_string(id)) {
                dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "'%s' must be the id of the tool call this answers", pname);
                goto bad;
            }
            json_object_set(msg, "tool_call_id", id);
            json_t *nm = json_object_get(m, "name");
            const char *fname = json_is_string(nm) ? json_string_value(nm) : dsp_srv_call_name(out, json_string_value(id));
            if (fname) json_object_set_new(msg, "name", json_string(fname));
        }
    }
    return out;
bad:
    json_decref(out);
    return NULL;
}

/* Tokenize text into r->prompt; the prompt must leave room for one generated token. */
static bool tokenize_prompt(dsp_srv *s, const char *text, size_t len, int flags, const char *param, dsp_srv_req *r, dsp_srv_error *e) {
    size_t cap = len + 4 < s->n_ctx || r->count_only ? len + 4 : s->n_ctx; /* a token covers at least one byte, plus specials */
    r->prompt = malloc(cap * sizeof *r->prompt);
    if (!r->prompt) return dsp_srv_fail(e, DSP_ERR_NOMEM, NULL, "out of memory");
    size_t n = 0;
    dsp_status st = dsp_tokenize(s->tok, text, len, flags, r->prompt, cap, &n);
    if (r->count_only && st == DSP_OK) { /* count_tokens: any length */
        r->n_prompt = n;
        return true;
    }
    if (st == DSP_ERR_RANGE || n >= s->n_ctx) {
        e->ctx_tokens = n, e->ctx_limit = s->n_ctx - 1;
        return dsp_srv_fail(e, DSP_SRV_ERR_CONTEXT, param,
                            "This model's maximum context length is %u tokens, but the prompt has %zu tokens (room is needed for at "
                            "least one generated token); shorten the %s",
                            s->n_ctx, n, param);
    }
    if (st) return dsp_srv_fail(e, st, param, "tokenizing the %s: %s", param, dsp_last_error());
    if (n == 0) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, param, "the %s is empty", param);
    r->n_prompt = n;
    return true;
}

bool dsp_srv_chat_prompt(dsp_srv *s, dsp_srv_req *r, json_t *msgs, json_t *kwargs, dsp_srv_error *e) {
    json_t *ctx = json_pack("{s:o, s:b}", "messages", msgs, "add_generation_prompt", 1);
    if (!ctx) return dsp_srv_fail(e, DSP_ERR_NOMEM, NULL, "out of memory");
    if (kwargs) json_object_update_missing(ctx, kwargs); /* chat_template_kwargs: more template variables */
    if (!json_object_get(ctx, "enable_thinking")) json_object_set_new(ctx, "enable_thinking", json_boolean(!s->cfg.no_thinking));
    bool thinking = json_is_true(json_object_get(ctx, "enable_thinking"));
    if (r->tools.active) json_object_set(ctx, "tools", r->tools.list);
    char *js = json_dumps(ctx, JSON_COMPACT);
    json_decref(ctx);
    if (!js) return dsp_srv_fail(e, DSP_ERR_NOMEM, NULL, "out of memory");
    char *rendered = NULL;
    size_t rlen = 0;
    dsp_status st = dsp_chat_render(s->model, s->template_src, js, strlen(js), &rendered, &rlen);
    free(js);
    if (st) {
        if (st == DSP_ERR_TEMPLATE) return dsp_srv_fail(e, st, "messages", "the chat template rejected the messages: %s", dsp_last_error());
        return dsp_srv_fail(e, st == DSP_ERR_NOT_FOUND ? DSP_ERR_UNSUPPORTED : st, "messages", "%s", dsp_last_error());
    }
    /* reasoning: split <think>...</think> when the template or the reply uses it and thinking is on */
    size_t t = rlen;
    while (t && (rendered[t - 1] == '\n' || rendered[t - 1] == ' ')) t--;
    r->think_start = thinking && t >= 7 && !memcmp(rendered + t - 7, "<think>", 7);
    r->think = thinking;
    /* a required tool call: the reply starts with the call opener */
    dsp_srv_tools_prefix(s, &r->tools, r->prefix, sizeof r->prefix);
    r->prefix_len = strlen(r->prefix);
    if (r->prefix_len) {
        char *nr = realloc(rendered, rlen + r->prefix_len + 1);
        if (!nr) {
            free(rendered);
            return dsp_srv_fail(e, DSP_ERR_NOMEM, NULL, "out of memory");
        }
        rendered = nr;
        memcpy(rendered + rlen, r->prefix, r->prefix_len + 1);
        rlen += r->prefix_len;
    }
    /* the template placed BOS and the turn markers itself */
    bool ok = tokenize_prompt(s, rendered, rlen, DSP_TOKENIZE_PARSE_SPECIAL, "messages", r, e);
    free(rendered);
    return ok;
}

/* tools, tool_choice, parallel_tool_calls (OpenAI chat) into r->tools */
static bool parse_chat_prompt(dsp_srv *s, json_t *root, dsp_srv_req *r, dsp_srv_error *e) {
    json_t *kw = field(root, "chat_template_kwargs");
    if (kw && !json_is_object(kw)) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    if (!dsp_srv_tools_parse(s, root, DSP_SRV_DIALECT_CHAT, r, e)) return false;
    json_t *msgs = parse_messages(root, e);
    if (!msgs) return false;
    return dsp_srv_chat_prompt(s, r, msgs, kw, e);
}

static bool parse_completion_prompt(dsp_srv *s, json_t *root, dsp_srv_req *r, dsp_srv_error *e) {
    json_t *p = field(root, "prompt");
    if (!p) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "prompt", "'prompt' is required");
    if (json_is_array(p)) {
        size_t n = json_array_size(p);
        if (n == 0) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "prompt", "'prompt' must not be an empty array");
        if (json_is_string(json_array_get(p, 0))) {
            if (n > 1)
                return dsp_srv_fail(e, DSP_ERR_UNSUPPORTED, "prompt", "one prompt per request is supported (got an array of %zu)", n);
            p = json_array_get(p, 0);
        } else {
            /* token ids */
            if (n >= s->n_ctx)
                return dsp_srv_fail(e, DSP_SRV_ERR_CONTEXT, "prompt",
                                    "this model's context is %u tokens, but the prompt has %zu tokens (room is needed for at least "
                                    "one generated token); shorten the prompt",
                                    s->n_ctx, n);
            r->prompt = malloc(n * sizeof *r->prompt);
            if (!r->prompt) return dsp_srv_fail(e, DSP_ERR_NOMEM, NULL, "out of memory");
            int32_t nv = dsp_tokenizer_n_vocab(s->tok);
            for (size_t i = 0; i < n; i++) {
                json_t *v = json_array_get(p, i);
                if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= nv)
                    return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "prompt",
                                        "'prompt' must be a string, an array of one string, or an array of token ids in [0, %d) "
                                        "(element %zu is not)",
                                        nv, i);
                r->prompt[i] = (int32_t)json_integer_value(v);
            }
            r->n_prompt = n;
            if (r->echo) {
                size_t len = 0;
                dsp_detokenize(s->tok, r->prompt, n, 0, NULL, 0, &len);
                r->echo_text = malloc(len + 1);
                if (!r->echo_text) return dsp_srv_fail(e, DSP_ERR_NOMEM, NULL, "out of memory");
                dsp_detokenize(s->tok, r->prompt, n, 0, r->echo_text, len + 1, &len);
                r->echo_len = len;
            }
            return true;
        }
    }
    if (!json_is_string(p))
        return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "prompt", "'prompt' must be a string, an array of one string, or an array of token ids");
    const char *text = json_string_value(p);
    size_t len = json_string_length(p);
    if (r->echo) {
        r->echo_text = malloc(len + 1);
        if (!r->echo_text) return dsp_srv_fail(e, DSP_ERR_NOMEM, NULL, "out of memory");
        memcpy(r->echo_text, text, len + 1);
        r->echo_len = len;
    }
    /* as `dspark generate -p`: BOS/EOS as the model's metadata asks, special-token text is text */
    return tokenize_prompt(s, text, len, DSP_TOKENIZE_ADD_SPECIAL, "prompt", r, e);
}

static bool parse_stop(json_t *root, dsp_srv_req *r, dsp_srv_error *e) {
    json_t *st = field(root, "stop");
    if (!st) return true;
    json_t *one[1] = {st};
    size_t n = 1;
    if (json_is_array(st)) {
        n = json_array_size(st);
        if (n > DSP_MAX_STOP) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "stop", "'stop' may hold at most %d strings (got %zu)", DSP_MAX_STOP, n);
    } else if (!json_is_string(st)) {
        return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "stop", "'stop' must be a string or an array of strings");
    }
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_is_array(st) ? json_array_get(st, i) : one[0];
        if (!json_is_string(v)) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "stop", "'stop' must be a string or an array of strings");
        size_t len = json_string_length(v);
        if (len == 0) continue; /* an empty stop string never matches anything useful */
        if (len > MAX_STOP_BYTES)
            return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "stop", "stop strings may be at most %d bytes (got %zu)", MAX_STOP_BYTES, len);
        if (!(r->stops[k] = strdup(json_string_value(v)))) return dsp_srv_fail(e, DSP_ERR_NOMEM, NULL, "out of memory");
        r->gp.stop[k] = r->stops[k];
        k++;
    }
    return true;
}

static bool parse_logit_bias(dsp_srv *s, json_t *root, dsp_srv_req *r, dsp_srv_error *e) {
    json_t *lb = field(root, "logit_bias");
    if (!lb) return true;
    if (!json_is_object(lb)) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "logit_bias", "'logit_bias' must be an object of token id -> bias");
    size_t n = json_object_size(lb);
    if (n == 0) return true;
    if (n > MAX_LOGIT_BIAS)
        return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "logit_bias", "'logit_bias' may hold at most %d entries (got %zu)", MAX_LOGIT_BIAS, n);
    r->bias = malloc(n * sizeof *r->bias);
    if (!r->bias) return dsp_srv_fail(e, DSP_ERR_NOMEM, NULL, "out of memory");
    int32_t nv = dsp_tokenizer_n_vocab(s->tok);
    size_t k = 0;
    const char *key;
    json_t *v;
    json_object_foreach(lb, key, v) {
        char *end;
        long long id = strtoll(key, &end, 10);
        if (!*key || *end || id < 0 || id >= nv)
            return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "logit_bias", "'logit_bias' keys must be token ids in [0, %d) (got '%.32s')", nv, key);
        if (!json_is_number(v) || !(json_number_value(v) >= -100 && json_number_value(v) <= 100))
            return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "logit_bias", "'logit_bias' values must be numbers in [-100, 100] (token %lld)", id);
        r->bias[k].token = (int32_t)id;
        r->bias[k].bias = (float)json_number_value(v);
        k++;
    }
    r->gp.logit_bias = r->bias;
    r->gp.n_logit_bias = (uint32_t)k;
    return true;
}

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

void dsp_srv_req_begin(dsp_srv *s, dsp_srv_req *r, dsp_srv_kind kind) {
    static const char *const prefix[] = {"chatcmpl", "cmpl", "msg", "resp"};
    r->kind = kind;
    uint64_t n = atomic_fetch_add(&s->next_id, 1);
    uint64_t salt = s->id_salt ^ n;
    snprintf(r->id, sizeof r->id, "%s-%016llx", prefix[kind], (unsigned long long)splitmix(&salt));
    if (kind == DSP_SRV_MESSAGES) r->id[3] = '_'; /* Anthropic's msg_... */
    if (kind == DSP_SRV_RESPONSES) r->id[4] = '_'; /* resp_... */
    r->created = (int64_t)time(NULL);
    snprintf(r->model, sizeof r->model, "%s", s->model_id);
    dsp_gen_params *gp = &r->gp;
    gp->temperature = 1.0f;
    gp->top_p = 1.0f;
    const dsp_gen_params *spec = &s->cfg.spec;
    gp->mode = spec->mode, gp->max_draft = spec->max_draft, gp->lookup_min_n = spec->lookup_min_n, gp->lookup_max_n = spec->lookup_max_n;
    gp->dspark_threshold = spec->dspark_threshold, gp->dspark_cumulative = spec->dspark_cumulative, gp->hybrid_min = spec->hybrid_min;
    gp->draft_sample = spec->draft_sample;
    uint64_t x = s->id_salt ^ (n * 0x9E3779B97F4A7C15ULL) ^ (uint64_t)dsp_srv_now_ms();
    gp->seed = splitmix(&x);
    gp->logprobs = -1;
}

bool dsp_srv_req_ready(dsp_srv *s, dsp_srv_req *r, dsp_srv_error *e) {
    /* what the event queue needs at most: every decided token of this request */
    dsp_gen_params *gp = &r->gp;
    size_t room = s->n_ctx > r->n_prompt ? s->n_ctx - r->n_prompt : 1;
    r->max_events = ((size_t)gp->max_tokens < room ? (size_t)gp->max_tokens : room) + DSP_MAX_DRAFT + 2;
    r->out.toks = malloc(r->max_events * sizeof *r->out.toks);
    if (gp->logprobs > 0) r->out.top = malloc(r->max_events * (size_t)gp->logprobs * sizeof *r->out.top);
    if (!r->out.toks || (gp->logprobs > 0 && !r->out.top)) return dsp_srv_fail(e, DSP_ERR_NOMEM, NULL, "out of memory");
    return true;
}

json_t *dsp_srv_field(json_t *root, const char *key) { return field(root, key); }
bool dsp_srv_get_num(json_t *root, const char *key, double lo, double hi, bool lo_open, float *out, dsp_srv_error *e) {
    return get_num(root, key, lo, hi, lo_open, out, e);
}
bool dsp_srv_get_int(json_t *root, const char *key, long long lo, long long hi, long long *out, bool *present, dsp_srv_error *e) {
    return get_int(root, key, lo, hi, out, present, e);
}
bool dsp_srv_get_bool(json_t *root, const char *key, bool *out, dsp_srv_error *e) { return get_bool(root, key, out, e); }

bool dsp_srv_check_model(dsp_srv *s, json_t *root, dsp_srv_req *r, dsp_srv_error *e) {
    json_t *model = field(root, "model");
    if (model && !json_is_string(model)) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "model", "'model' must be a string");
    if (model && !dsp_srv_model_known(s, json_string_value(model)))
        return dsp_srv_fail(e, DSP_SRV_ERR_MODEL, "model", "the model '%.128s' does not exist; this server has '%s' (see /v1/models)",
                            json_string_value(model), s->model_id);
    if (model) snprintf(r->model, sizeof r->model, "%s", json_string_value(model));
    return true;
}

bool dsp_srv_parse_request(dsp_srv *s, dsp_srv_kind kind, const char *body, size_t len, dsp_srv_req *r, dsp_srv_error *e) {
    json_error_t jerr;
    /* strict: invalid UTF-8, NUL in strings, numbers out of range and trailing garbage are errors */
    json_t *root = json_loadb(body, len, 0, &jerr);
    if (!root) return dsp_srv_fail(e, DSP_SRV_ERR_JSON, NULL, "the body is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line, jerr.column);
    bool ok = false;
    if (!json_is_object(root)) {
        dsp_srv_fail(e, DSP_ERR_INVALID_ARG, NULL, "the body must be a JSON object");
        goto out;
    }
    dsp_srv_req_begin(s, r, kind);

    if (!dsp_srv_check_model(s, root, r, e)) goto out;
    json_t *user = field(root, "user");
    if (user && !json_is_string(user)) {
        dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "user", "'user' must be a string");
        goto out;
    }

    /* features this server does not have */
    long long nn = 1, best_of = 1;
    if (!get_int(root, "n", INT64_MIN, INT64_MAX, &nn, NULL, e)) goto out;
    if (nn != 1) {
        dsp_srv_fail(e, DSP_ERR_UNSUPPORTED, "n", "'n' must be 1: this server generates one choice per request (got %lld)", nn);
        goto out;
    }
    if (!reject_field(root, "functions", " (deprecated: use 'tools')", e) || !reject_field(root, "audio", "", e) ||
        !reject_field(root, "prediction", "", e))
        goto out;
    if (kind != DSP_SRV_CHAT && (field(root, "tools") || field(root, "tool_choice"))) {
        dsp_srv_fail(e, DSP_ERR_UNSUPPORTED, "tools", "'tools' are for /v1/chat/completions, not /v1/completions");
        goto out;
    }
    json_t *rf = field(root, "response_format");
    if (rf && !(json_is_object(rf) && json_is_string(json_object_get(rf, "type")) &&
                !strcmp(json_string_value(json_object_get(rf, "type")), "text"))) {
        dsp_srv_fail(e, DSP_ERR_UNSUPPORTED, "response_format", "'response_format' other than {\"type\": \"text\"} is not supported by this server");
        goto out;
    }

    /* streaming */
    if (!get_bool(root, "stream", &r->stream, e)) goto out;
    json_t *so = field(root, "stream_options");
    if (so) {
        if (!json_is_object(so)) {
            dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "stream_options", "'stream_options' must be an object");
            goto out;
        }
        json_t *iu = field(so, "include_usage");
        if (iu && !json_is_boolean(iu)) {
            dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "stream_options", "'stream_options.include_usage' must be a boolean");
            goto out;
        }
        r->include_usage = iu && json_is_true(iu);
    }

    /* sampling: the model's generation_config.json for fields the request omits, else OpenAI's defaults */
    dsp_gen_params *gp = &r->gp;
    {
        dsp_gen_defaults gd;
        dsp_model_gen_defaults(s->model, &gd);
        unsigned given = (field(root, "temperature") ? DSP_GEN_HAS_TEMPERATURE : 0) | (field(root, "top_p") ? DSP_GEN_HAS_TOP_P : 0) |
                         (field(root, "top_k") ? DSP_GEN_HAS_TOP_K : 0) | (field(root, "min_p") ? DSP_GEN_HAS_MIN_P : 0) |
                         (field(root, "repetition_penalty") ? DSP_GEN_HAS_REPETITION_PENALTY : 0);
        dsp_gen_apply_defaults(&gd, given, gp);
    }
    long long v = 0;
    bool have = false, have2 = false;
    if (!get_num(root, "temperature", 0, 2, false, &gp->temperature, e) || !get_num(root, "top_p", 0, 1, true, &gp->top_p, e) ||
        !get_num(root, "min_p", 0, 1, false, &gp->min_p, e) ||
        !get_num(root, "presence_penalty", -2, 2, false, &gp->presence_penalty, e) ||
        !get_num(root, "frequency_penalty", -2, 2, false, &gp->frequency_penalty, e) ||
        !get_num(root, "repetition_penalty", 0, 10, true, &gp->repetition_penalty, e))
        goto out;
    if (!get_int(root, "top_k", -1, 1LL << 30, &v, &have, e)) goto out;
    if (have) gp->top_k = v < 0 ? 0 : (int32_t)v; /* -1 = off, as vLLM */
    if (!get_int(root, "seed", INT64_MIN, INT64_MAX, &v, &have, e)) goto out;
    if (have) gp->seed = (uint64_t)v;
    if (!get_bool(root, "ignore_eos", &gp->ignore_eos, e)) goto out;
    json_t *dm = field(root, "dspark_mode"); /* extension: this request's speculation mode */
    if (dm) {
        const char *m = json_string_value(dm);
        if (!m || !dsp_spec_mode_from_string(m, &gp->mode)) {
            dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "dspark_mode", "'dspark_mode' must be 'auto', 'dspark', 'dflash', 'hybrid', 'lookup' or 'baseline'");
            goto out;
        }
    }
    json_t *dmd = field(root, "dspark_max_draft"); /* extension: a number, or "auto" */
    if (dmd && json_is_string(dmd) && !strcmp(json_string_value(dmd), "auto")) gp->max_draft = DSP_DRAFT_AUTO;
    else if (!get_int(root, "dspark_max_draft", 1, DSP_MAX_DRAFT, &v, &have, e)) goto out;
    else if (have) gp->max_draft = (int32_t)v;

    /* length */
    long long mt = s->cfg.default_max_tokens, mct = 0;
    if (!get_int(root, "max_tokens", 1, s->cfg.max_tokens_cap, &mt, &have, e) ||
        !get_int(root, "max_completion_tokens", 1, s->cfg.max_tokens_cap, &mct, &have2, e)) {
        if (strstr(e->message, "between")) /* a range error: say where the upper bound comes from */
            snprintf(e->message + strlen(e->message), sizeof e->message - strlen(e->message), "; the upper bound is this server's --max-tokens-cap");
        goto out;
    }
    if (have2) mt = mct;
    gp->max_tokens = (int32_t)mt;

    if (!parse_stop(root, r, e) || !parse_logit_bias(s, root, r, e)) goto out;

    /* logprobs */
    if (kind == DSP_SRV_CHAT) {
        bool lp = false;
        if (!get_bool(root, "logprobs", &lp, e)) goto out;
        long long tl = 0;
        if (!get_int(root, "top_logprobs", 0, DSP_MAX_LOGPROBS, &tl, &have, e)) goto out;
        if (have && !lp) {
            dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
            goto out;
        }
        if (lp) gp->logprobs = (int32_t)tl, r->want_logprobs = true;
        if (!parse_chat_prompt(s, root, r, e)) goto out;
    } else {
        json_t *lpv = field(root, "logprobs");
        if (lpv && json_is_boolean(lpv)) {
            dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "logprobs", "'logprobs' must be an integer for completions (0..%d)", DSP_MAX_LOGPROBS);
            goto out;
        }
        long long lp = 0;
        if (!get_int(root, "logprobs", 0, DSP_MAX_LOGPROBS, &lp, &have, e)) goto out;
        if (have) gp->logprobs = (int32_t)lp, r->want_logprobs = true;
        if (!get_bool(root, "echo", &r->echo, e)) goto out;
        if (r->echo && have) {
            dsp_srv_fail(e, DSP_ERR_UNSUPPORTED, "echo", "'echo' together with 'logprobs' is not supported (prompt logprobs are not computed)");
            goto out;
        }
        if (!get_int(root, "best_of", INT64_MIN, INT64_MAX, &best_of, NULL, e)) goto out;
        if (best_of != 1) {
            dsp_srv_fail(e, DSP_ERR_UNSUPPORTED, "best_of", "'best_of' must be 1 on this server (got %lld)", best_of);
            goto out;
        }
        json_t *suf = field(root, "suffix");
        if (suf && !(json_is_string(suf) && json_string_length(suf) == 0)) {
            dsp_srv_fail(e, DSP_ERR_UNSUPPORTED, "suffix", "'suffix' is not supported by this server");
            goto out;
        }
        if (!parse_completion_prompt(s, root, r, e)) goto out;
    }

    ok = dsp_srv_req_ready(s, r, e);
out:
    json_decref(root);
    return ok;
}

/* ---- responses --------------------------------------------------------------------------------- */

/* The raw bytes of token id (may be part of a UTF-8 character); *len; malloc'd. */
static char *piece(dsp_srv *s, int32_t id, size_t *len) {
    size_t n = 0;
    dsp_token_to_piece(s->tok, id, NULL, 0, &n);
    char *b = malloc(n + 1);
    if (!b || dsp_token_to_piece(s->tok, id, b, n + 1, &n) != DSP_OK) n = 0;
    if (b) b[n] = '\0';
    *len = n;
    return b;
}

static json_t *jlogprob(float lp) { return json_real(isfinite(lp) ? lp : -9999.0); }

static json_t *chat_lp_entry(dsp_srv *s, int32_t id, float lp, bool with_top, const dsp_token_logprob *top, int32_t n_top) {
    size_t n;
    char *p = piece(s, id, &n);
    json_t *bytes = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(bytes, json_integer((unsigned char)p[i]));
    json_t *o = json_object();
    json_object_set_new(o, "token", jstr_lossy(p ? p : "", n));
    json_object_set_new(o, "logprob", jlogprob(lp));
    json_object_set_new(o, "bytes", bytes);
    free(p);
    if (with_top) {
        json_t *arr = json_array();
        for (int32_t i = 0; i < n_top; i++) json_array_append_new(arr, chat_lp_entry(s, top[i].token, top[i].logprob, false, NULL, 0));
        json_object_set_new(o, "top_logprobs", arr);
    }
    return o;
}

/* tokens [from, to) whose text is visible: a final end-of-generation token is not */
static size_t visible_end(dsp_srv *s, const dsp_srv_req *r, const dsp_srv_out *o) {
    size_t n = o->n_toks;
    if (o->done && n > 0 && o->res.finish == DSP_FINISH_STOP) {
        const dsp_srv_tok *t = &o->toks[n - 1];
        uint32_t prev = n > 1 ? o->toks[n - 2].text_end : 0;
        if (t->text_end == prev && dsp_tokenizer_is_special(s->tok, t->id) && !r->gp.ignore_eos) n--;
    }
    return n;
}

/* logprobs object for tokens [from, to); text_base: characters before text offset of token from */
static json_t *logprobs_json(dsp_srv *s, const dsp_srv_req *r, const dsp_srv_out *o, size_t from, size_t to) {
    if (r->kind == DSP_SRV_CHAT) {
        json_t *content = json_array();
        for (size_t i = from; i < to; i++) {
            const dsp_srv_tok *t = &o->toks[i];
            json_array_append_new(content, chat_lp_entry(s, t->id, t->logprob, true, o->top ? o->top + t->top_off : NULL, t->n_top));
        }
        return json_pack("{s:o, s:n}", "content", content, "refusal");
    }
    json_t *tokens = json_array(), *tlp = json_array(), *tops = json_array(), *offs = json_array();
    size_t base = r->echo_text ? dsp_utf8_count(r->echo_text, r->echo_len) : 0;
    uint32_t prev_end = from > 0 ? o->toks[from - 1].text_end : 0;
    size_t chars = base + dsp_utf8_count(o->text ? o->text : "", prev_end);
    for (size_t i = from; i < to; i++) {
        const dsp_srv_tok *t = &o->toks[i];
        size_t n;
        char *p = piece(s, t->id, &n);
        json_array_append_new(tokens, jstr_lossy(p ? p : "", n));
        free(p);
        json_array_append_new(tlp, jlogprob(t->logprob));
        json_t *d = json_object();
        for (int32_t k = 0; k < t->n_top; k++) {
            const dsp_token_logprob *tl = &o->top[t->top_off + (uint32_t)k];
            char *q = piece(s, tl->token, &n);
            json_t *key = jstr_lossy(q ? q : "", n);
            json_object_setn_new(d, json_string_value(key), json_string_length(key), jlogprob(tl->logprob));
            json_decref(key);
            free(q);
        }
        p = piece(s, t->id, &n);
        json_t *key = jstr_lossy(p ? p : "", n);
        json_object_setn_new(d, json_string_value(key), json_string_length(key), jlogprob(t->logprob));
        json_decref(key);
        free(p);
        json_array_append_new(tops, d);
        json_array_append_new(offs, json_integer((json_int_t)chars));
        chars += dsp_utf8_count(o->text + prev_end, t->text_end - prev_end);
        prev_end = t->text_end;
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", tlp, "top_logprobs", tops, "text_offset", offs);
}

static json_t *usage_json(const dsp_srv_out *o) {
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)o->res.n_prompt, "completion_tokens",
                     (json_int_t)o->res.n_generated, "total_tokens", (json_int_t)(o->res.n_prompt + o->res.n_generated),
                     "prompt_tokens_details", "cached_tokens", (json_int_t)o->res.n_cached);
}

static const char *finish_reason(const dsp_srv_out *o) { return o->res.finish == DSP_FINISH_LENGTH ? "length" : "stop"; }

static json_t *envelope(dsp_srv *s, const dsp_srv_req *r, const char *object) {
    return json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", r->id, "object", object, "created", (json_int_t)r->created, "model", s->model_id,
                     "system_fingerprint", s->fingerprint);
}

json_t *dsp_srv_jstr(const char *p, size_t n) { return jstr_lossy(p, n); }

/* what drafted for a request in mode m (resolved): "none", "lookup", the block drafter's kind
 * ("dspark", "dflash"), or both for hybrid */
static const char *stats_drafter(dsp_srv *s, dsp_spec_mode m) {
    dsp_drafter_info di;
    const bool bd = dsp_engine_drafter_info(s->engine, &di);
    switch (m) {
    case DSP_SPEC_BASELINE: return "none";
    case DSP_SPEC_LOOKUP: return "lookup";
    case DSP_SPEC_DFLASH: return "dflash";
    case DSP_SPEC_DSPARK: return "dspark";
    case DSP_SPEC_HYBRID: return !bd ? "lookup" : strcmp(di.kind, "dspark") ? "lookup+dflash" : "lookup+dspark";
    default: return "lookup";
    }
}

json_t *dsp_srv_stats_json(dsp_srv *s, const dsp_srv_req *r, const dsp_srv_out *o) {
    const dsp_gen_result *g = &o->res;
    double tps = g->decode_ms > 0 ? (double)g->n_generated / (g->decode_ms / 1e3) : 0;
    double mal = g->n_rounds ? (double)g->n_generated / (double)g->n_rounds : 0;
    const dsp_spec_mode m = dsp_engine_resolve_mode(s->engine, r->gp.mode);
    return json_pack("{s:s, s:s, s:f, s:I, s:I, s:I, s:f, s:f, s:I}", "mode", dsp_spec_mode_to_string(m), "drafter", stats_drafter(s, m),
                     "mean_accepted_len", mal, "rounds", (json_int_t)g->n_rounds, "drafted", (json_int_t)g->n_drafted, "accepted",
                     (json_int_t)g->n_accepted, "decode_tok_per_s", tps, "ttft_ms", o->ttft_ms, "cached_prompt_tokens", (json_int_t)g->n_cached);
}

/* ---- the reply: opener + text, split into reasoning, content and calls ------------------------------ */

void dsp_srv_reply_make(dsp_srv *s, const dsp_srv_req *r, const dsp_srv_out *o, dsp_srv_reply *rep) {
    memset(rep, 0, sizeof *rep);
    rep->p = o->text ? o->text : "";
    rep->n = o->n_text;
    if (r->prefix_len && (rep->own = malloc(r->prefix_len + o->n_text + 1))) {
        memcpy(rep->own, r->prefix, r->prefix_len);
        if (o->n_text) memcpy(rep->own + r->prefix_len, o->text, o->n_text);
        rep->p = rep->own, rep->n = r->prefix_len + o->n_text;
    }
    dsp_srv_split(r, s, rep->p, rep->n, o->done, &rep->parts);
    if (!o->done || rep->parts.calls >= rep->n) return;
    if (!dsp_srv_parse_calls(s->tool_family, rep->p + rep->parts.calls, rep->n - rep->parts.calls, &rep->calls)) {
        rep->parts.c1 = rep->n; /* not calls after all: the model's text, as content */
        rep->parts.calls = rep->n;
        return;
    }
    if (r->tools.single && rep->calls.n > 1) {
        for (int i = 1; i < rep->calls.n; i++) free(rep->calls.v[i].name), free(rep->calls.v[i].args);
        rep->calls.n = 1;
    }
    uint64_t seed = 1469598103934665603ULL;
    for (const char *c = r->id; *c; c++) seed = (seed ^ (unsigned char)*c) * 1099511628211ULL;
    for (int i = 0; i < rep->calls.n; i++) {
        dsp_srv_call *c = &rep->calls.v[i];
        bool ok = c->id[0] && (s->tool_family != DSP_SRV_TOOLS_MISTRAL || strlen(c->id) == 9);
        if (!ok) dsp_srv_tool_call_id(s->tool_family, seed, i, c->id, sizeof c->id);
    }
}

void dsp_srv_reply_free(dsp_srv_reply *rep) {
    free(rep->own);
    dsp_srv_calls_free(&rep->calls);
}

static json_t *tool_calls_json(const dsp_srv_calls *cs) {
    json_t *arr = json_array();
    for (int i = 0; i < cs->n; i++)
        json_array_append_new(arr, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", cs->v[i].id, "type", "function", "function", "name", cs->v[i].name,
                                             "arguments", cs->v[i].args));
    return arr;
}

/* finish_reason in OpenAI's words */
static const char *chat_finish(const dsp_srv_out *o, const dsp_srv_reply *rep) {
    return rep && rep->calls.n ? "tool_calls" : finish_reason(o);
}

char *dsp_srv_response_json(dsp_srv *s, dsp_srv_req *r) {
    const dsp_srv_out *o = &r->out; /* done: the engine writes no more */
    size_t vis = visible_end(s, r, o);
    json_t *root = envelope(s, r, r->kind == DSP_SRV_CHAT ? "chat.completion" : "text_completion");
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(0));
    const char *fin = finish_reason(o);
    if (r->kind == DSP_SRV_CHAT) {
        dsp_srv_reply rep;
        dsp_srv_reply_make(s, r, o, &rep);
        const dsp_srv_parts *pt = &rep.parts;
        json_t *msg = json_pack("{s:s}", "role", "assistant");
        json_object_set_new(msg, "content", pt->c1 > pt->c0 || !rep.calls.n ? jstr_lossy(rep.p + pt->c0, pt->c1 - pt->c0) : json_null());
        json_object_set_new(msg, "refusal", json_null());
        if (pt->r1 > pt->r0) json_object_set_new(msg, "reasoning_content", jstr_lossy(rep.p + pt->r0, pt->r1 - pt->r0));
        if (rep.calls.n) json_object_set_new(msg, "tool_calls", tool_calls_json(&rep.calls));
        json_object_set_new(choice, "message", msg);
        fin = chat_finish(o, &rep);
        dsp_srv_reply_free(&rep);
    } else {
        size_t n = r->echo_len + o->n_text;
        char *t = malloc(n + 1);
        if (t) {
            if (r->echo_len) memcpy(t, r->echo_text, r->echo_len);
            if (o->n_text) memcpy(t + r->echo_len, o->text, o->n_text);
        }
        json_object_set_new(choice, "text", jstr_lossy(t ? t : "", t ? n : 0));
        free(t);
    }
    json_object_set_new(choice, "logprobs", r->want_logprobs ? logprobs_json(s, r, o, 0, vis) : json_null());
    json_object_set_new(choice, "finish_reason", json_string(fin));
    json_object_set_new(root, "choices", json_pack("[o]", choice));
    json_object_set_new(root, "usage", usage_json(o));
    json_object_set_new(root, "dspark", dsp_srv_stats_json(s, r, o));
    char *out = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(root);
    return out;
}

/* ---- streaming --------------------------------------------------------------------------------- */

void dsp_srv_sb_add(dsp_srv_sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = (b->n + n + 1) * 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np, b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

void dsp_srv_sb_event(dsp_srv_sbuf *b, const char *name, json_t *obj) {
    char *js = obj ? json_dumps(obj, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(obj);
    if (!js) {
        b->oom = true;
        return;
    }
    if (name) {
        dsp_srv_sb_add(b, "event: ", 7);
        dsp_srv_sb_add(b, name, strlen(name));
        dsp_srv_sb_add(b, "\n", 1);
    }
    dsp_srv_sb_add(b, "data: ", 6);
    dsp_srv_sb_add(b, js, strlen(js));
    dsp_srv_sb_add(b, "\n\n", 2);
    free(js);
}

/* one chunk of either endpoint: a delta (chat: taken) or text, logprobs for tokens [from, to) when
 * asked, finish reason or null */
static json_t *chunk(dsp_srv *s, const dsp_srv_req *r, const dsp_srv_out *o, json_t *delta, const char *text, size_t n, size_t from, size_t to,
                     const char *fin) {
    bool chat = r->kind == DSP_SRV_CHAT;
    json_t *root = envelope(s, r, chat ? "chat.completion.chunk" : "text_completion");
    json_t *c = json_object();
    json_object_set_new(c, "index", json_integer(0));
    if (chat) json_object_set_new(c, "delta", delta ? delta : json_object());
    else json_object_set_new(c, "text", jstr_lossy(text, n));
    json_object_set_new(c, "logprobs", r->want_logprobs && to > from ? logprobs_json(s, r, o, from, to) : json_null());
    json_object_set_new(c, "finish_reason", fin ? json_string(fin) : json_null());
    json_object_set_new(root, "choices", json_pack("[o]", c));
    if (r->include_usage) json_object_set_new(root, "usage", json_null());
    return root;
}

/* tokens [cur->tok_from, k) whose text lies within the first `upto` bytes of the generated text */
static size_t toks_upto(const dsp_srv_out *o, size_t from, size_t upto) {
    size_t k = from;
    while (k < o->n_toks && o->toks[k].text_end <= upto) k++;
    /* trailing tokens without text wait for their text */
    while (k > from && o->toks[k - 1].text_end == (k > 1 ? o->toks[k - 2].text_end : 0)) k--;
    return k;
}

static void error_event(dsp_srv_sbuf *b, const dsp_srv_out *o) {
    dsp_srv_error e;
    if (o->status == DSP_OK || o->status == DSP_ERR_CANCELLED) dsp_srv_fail(&e, DSP_ERR_BUSY, NULL, "the server is shutting down");
    else dsp_srv_fail(&e, o->status, NULL, "%s", o->error);
    char *js = dsp_srv_error_json(&e);
    if (js) {
        dsp_srv_sb_add(b, "data: ", 6);
        dsp_srv_sb_add(b, js, strlen(js));
        dsp_srv_sb_add(b, "\n\n", 2);
        free(js);
    }
}

static void chat_events(dsp_srv *s, const dsp_srv_req *r, const dsp_srv_out *o, dsp_srv_cursor *cur, dsp_srv_sbuf *b) {
    if (!cur->started) {
        cur->started = true;
        dsp_srv_sb_event(b, NULL, chunk(s, r, o, json_pack("{s:s, s:s}", "role", "assistant", "content", ""), NULL, 0, 0, 0, NULL));
    }
    bool failed = o->done && (o->status != DSP_OK || o->res.finish == DSP_FINISH_CANCELLED);
    if (failed) {
        error_event(b, o);
        return;
    }
    dsp_srv_reply rep;
    dsp_srv_reply_make(s, r, o, &rep);
    const dsp_srv_parts *pt = &rep.parts;
    size_t ra = cur->r_sent > pt->r0 ? cur->r_sent : pt->r0, ca = cur->c_sent > pt->c0 ? cur->c_sent : pt->c0;
    bool new_r = pt->r1 > ra, new_c = pt->c1 > ca;
    /* logprobs go with the tokens whose text has been decided (reasoning or content) */
    size_t decided = pt->c1 > pt->c0 ? pt->c1 : pt->r1;
    size_t raw = decided > r->prefix_len ? decided - r->prefix_len : 0;
    if (o->done && !rep.calls.n) raw = o->n_text;
    size_t k = o->done ? visible_end(s, r, o) : toks_upto(o, cur->tok_from, raw);
    if (k < cur->tok_from) k = cur->tok_from;
    if (new_r || new_c || (r->want_logprobs && k > cur->tok_from)) {
        json_t *delta = json_object();
        if (new_r) json_object_set_new(delta, "reasoning_content", jstr_lossy(rep.p + ra, pt->r1 - ra));
        if (new_c) json_object_set_new(delta, "content", jstr_lossy(rep.p + ca, pt->c1 - ca));
        dsp_srv_sb_event(b, NULL, chunk(s, r, o, delta, NULL, 0, cur->tok_from, k, NULL));
        if (new_r) cur->r_sent = pt->r1;
        if (new_c) cur->c_sent = pt->c1;
        cur->tok_from = k;
    }
    if (o->done) {
        /* tool calls, OpenAI's incremental shape: id, type and name first, then the arguments */
        for (int i = 0; i < rep.calls.n; i++) {
            const dsp_srv_call *c = &rep.calls.v[i];
            json_t *d1 = json_pack("{s:[{s:i, s:s, s:s, s:{s:s, s:s}}]}", "tool_calls", "index", i, "id", c->id, "type", "function", "function",
                                   "name", c->name, "arguments", "");
            dsp_srv_sb_event(b, NULL, chunk(s, r, o, d1, NULL, 0, 0, 0, NULL));
            json_t *d2 = json_pack("{s:[{s:i, s:{s:s}}]}", "tool_calls", "index", i, "function", "arguments", c->args);
            dsp_srv_sb_event(b, NULL, chunk(s, r, o, d2, NULL, 0, 0, 0, NULL));
        }
        json_t *fin = chunk(s, r, o, NULL, NULL, 0, 0, 0, chat_finish(o, &rep));
        json_object_set_new(fin, "dspark", dsp_srv_stats_json(s, r, o));
        dsp_srv_sb_event(b, NULL, fin);
    }
    dsp_srv_reply_free(&rep);
}

static void completion_events(dsp_srv *s, const dsp_srv_req *r, const dsp_srv_out *o, dsp_srv_cursor *cur, dsp_srv_sbuf *b) {
    if (!cur->started) {
        cur->started = true;
        if (r->echo_len) dsp_srv_sb_event(b, NULL, chunk(s, r, o, NULL, r->echo_text, r->echo_len, 0, 0, NULL));
    }
    if (!o->done) {
        if (o->n_text > cur->text_from) {
            /* tokens up to the last one that produced text; later ones wait for their text */
            size_t k = o->n_toks;
            while (k > cur->tok_from && o->toks[k - 1].text_end == (k > 1 ? o->toks[k - 2].text_end : 0)) k--;
            dsp_srv_sb_event(b, NULL, chunk(s, r, o, NULL, o->text + cur->text_from, o->n_text - cur->text_from, cur->tok_from, k, NULL));
            cur->text_from = o->n_text;
            cur->tok_from = k;
        }
        return;
    }
    if (o->status != DSP_OK || o->res.finish == DSP_FINISH_CANCELLED) {
        error_event(b, o);
        return;
    }
    size_t vis = visible_end(s, r, o);
    if (o->n_text > cur->text_from || vis > cur->tok_from)
        dsp_srv_sb_event(b, NULL, chunk(s, r, o, NULL, o->text ? o->text + cur->text_from : "", o->n_text - cur->text_from, cur->tok_from, vis, NULL));
    json_t *fin = chunk(s, r, o, NULL, "", 0, 0, 0, finish_reason(o));
    json_object_set_new(fin, "dspark", dsp_srv_stats_json(s, r, o));
    dsp_srv_sb_event(b, NULL, fin);
}

char *dsp_srv_stream_events(dsp_srv *s, const dsp_srv_req *r, const dsp_srv_out *o, dsp_srv_cursor *cur, size_t *len) {
    if (r->kind == DSP_SRV_MESSAGES) return dsp_srv_anthropic_events(s, r, o, cur, len);
    if (r->kind == DSP_SRV_RESPONSES) return dsp_srv_responses_events(s, r, o, cur, len);
    dsp_srv_sbuf b = {0};
    if (r->kind == DSP_SRV_CHAT) chat_events(s, r, o, cur, &b);
    else completion_events(s, r, o, cur, &b);
    if (o->done) {
        if (r->include_usage && o->status == DSP_OK && o->res.finish != DSP_FINISH_CANCELLED) {
            json_t *u = envelope(s, r, r->kind == DSP_SRV_CHAT ? "chat.completion.chunk" : "text_completion");
            json_object_set_new(u, "choices", json_array());
            json_object_set_new(u, "usage", usage_json(o));
            dsp_srv_sb_event(&b, NULL, u);
        }
        cur->text_from = o->n_text;
        cur->tok_from = o->n_toks;
        dsp_srv_sb_add(&b, "data: [DONE]\n\n", 14);
    }
    if (b.oom) {
        free(b.p);
        b.p = NULL, b.n = 0;
    }
    *len = b.n;
    return b.p;
}

void dsp_srv_spec_json(dsp_srv *s) {
    const dsp_gen_params *sp = &s->cfg.spec;
    dsp_drafter_info di;
    json_t *d = json_null();
    if (dsp_engine_drafter_info(s->engine, &di))
        d = json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:s, s:i, s:s, s:b, s:i}", "path", di.path, "kind", di.kind, "layout", di.layout, "block", di.block,
                      "drafts_per_block", di.n_draft, "layers", di.n_layers, "layer_type", di.layer_type, "markov_rank", di.markov_rank,
                      "markov_head", di.markov_head, "confidence_head", di.confidence_head, "draft_vocab", di.draft_vocab);
    json_t *j = json_pack("{s:s, s:o, s:o}", "mode", dsp_spec_mode_to_string(dsp_engine_resolve_mode(s->engine, sp->mode)), "max_draft",
                          sp->max_draft == DSP_DRAFT_AUTO ? json_string("auto") : json_integer(sp->max_draft), "drafter", d ? d : json_null());
    char *txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
    snprintf(s->spec_json, sizeof s->spec_json, "%s", txt ? txt : "null");
    free(txt);
    json_decref(j);
}

char *dsp_srv_models_json(dsp_srv *s, const char *only) {
    const char *ids[DSP_SRV_MAX_ALIASES + 1];
    int n = 0;
    ids[n++] = s->model_id;
    for (int i = 0; i < s->cfg.n_aliases; i++)
        if (strcmp(s->cfg.aliases[i], s->model_id)) ids[n++] = s->cfg.aliases[i];
    json_t *data = json_array(), *one = NULL;
    for (int i = 0; i < n; i++) {
        json_t *m = json_pack("{s:s, s:s, s:I, s:s}", "id", ids[i], "object", "model", "created", (json_int_t)s->created, "owned_by", "dspark");
        json_t *sj = json_loads(s->spec_json, 0, NULL);
        if (sj) json_object_set_new(m, "speculation", sj);
        if (only && !one && dsp_srv_model_known(s, only)) {
            json_object_set_new(m, "id", json_string(only));
            one = m;
            break;
        }
        json_array_append_new(data, m);
    }
    json_t *root = only ? one : json_pack("{s:s, s:o}", "object", "list", "data", data);
    if (only) json_decref(data);
    char *out = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return out;
}
