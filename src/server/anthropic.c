/* server/anthropic: Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) on
 * the same engine, templates and tool machinery as the OpenAI routes.
 *
 * Request: system (string or text blocks), messages with string or block content (text,
 * tool_use on assistant turns, tool_result on user turns, thinking blocks, which are dropped from
 * the history as the reasoning models' templates drop them), max_tokens (required),
 * stop_sequences, temperature, top_p, top_k, tools ({name, description, input_schema}),
 * tool_choice ({type: auto|any|tool|none}), thinking ({type: enabled|disabled}), stream. They
 * become the template's messages exactly as the OpenAI ones do (tools.c), so a tool_use id comes
 * back as the tool_call_id of the tool result.
 *
 * Response: content blocks thinking / text / tool_use, stop_reason end_turn | max_tokens |
 * stop_sequence | tool_use; streaming with message_start, content_block_start/_delta/_stop
 * (text_delta, thinking_delta, signature_delta, input_json_delta), message_delta, message_stop.
 * Errors: {"type": "error", "error": {"type", "message"}}; a prompt over the context says
 * "prompt is too long: N tokens > M maximum", the wording agent clients look for. */
#define _GNU_SOURCE /* asprintf */
#include "server/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_text[] = {"text", NULL};

char *dsp_srv_anthropic_error_json(const dsp_srv_error *e) {
    int code = dsp_srv_error_http(e->kind);
    const char *type = code == 400 || code == 405 || code == 408 || code == 414 || code == 431 || code == 505 ? "invalid_request_error"
                       : code == 401                                                                       ? "authentication_error"
                       : code == 404                                                                       ? "not_found_error"
                       : code == 413                                                                       ? "request_too_large"
                       : code == 429                                                                       ? "rate_limit_error"
                       : code == 503                                                                       ? "overloaded_error"
                                                                                                           : "api_error";
    char msg[600];
    if (e->kind == DSP_SRV_ERR_CONTEXT) snprintf(msg, sizeof msg, "prompt is too long: %zu tokens > %zu maximum", e->ctx_tokens, e->ctx_limit);
    else snprintf(msg, sizeof msg, "%s", e->message);
    json_t *root = json_pack("{s:s, s:{s:s, s:o}}", "type", "error", "error", "type", type, "message", dsp_srv_jstr(msg, strlen(msg)));
    char *out = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return out;
}

/* ---- request -------------------------------------------------------------------------------------- */

/* Anthropic messages -> the template's messages (appended to out). */
static bool convert_message(json_t *m, size_t i, json_t *out, dsp_srv_error *e) {
    char pname[64];
    snprintf(pname, sizeof pname, "messages.%zu", i);
    if (!json_is_object(m)) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "%s: must be an object with 'role' and 'content'", pname);
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!role || (strcmp(role, "user") && strcmp(role, "assistant")))
        return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "%s.role: must be 'user' or 'assistant'", pname);
    json_t *content = json_object_get(m, "content");
    if (json_is_string(content)) {
        json_array_append_new(out, json_pack("{s:s, s:O}", "role", role, "content", content));
        return true;
    }
    if (!json_is_array(content)) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "%s.content: must be a string or an array of content blocks", pname);
    /* text blocks joined; tool_use -> tool_calls; tool_result -> tool messages (before the text) */
    json_t *texts = json_array(), *calls = json_array(), *results = json_array();
    size_t k;
    json_t *b;
    bool ok = true;
    json_array_foreach(content, k, b) {
        char bn[96];
        snprintf(bn, sizeof bn, "%s.content.%zu", pname, k);
        const char *type = json_string_value(json_object_get(b, "type"));
        if (!json_is_object(b) || !type) {
            ok = dsp_srv_fail(e, DSP_ERR_INVALID_ARG, bn, "%s: must be a content block with a 'type'", bn);
            break;
        }
        if (!strcmp(type, "text")) {
            if (!json_is_string(json_object_get(b, "text"))) {
                ok = dsp_srv_fail(e, DSP_ERR_INVALID_ARG, bn, "%s.text: must be a string", bn);
                break;
            }
            json_array_append(texts, b);
        } else if (!strcmp(type, "thinking") || !strcmp(type, "redacted_thinking")) {
            if (strcmp(role, "assistant")) {
                ok = dsp_srv_fail(e, DSP_ERR_INVALID_ARG, bn, "%s: thinking blocks belong to assistant turns", bn);
                break;
            }
            /* earlier turns' reasoning is not shown to the model again (as the templates do) */
        } else if (!strcmp(type, "tool_use")) {
            json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"), *input = json_object_get(b, "input");
            if (strcmp(role, "assistant") || !json_is_string(id) || !json_is_string(name) || !json_is_object(input)) {
                ok = dsp_srv_fail(e, DSP_ERR_INVALID_ARG, bn, "%s: a tool_use block is {id, name, input: object}, on an assistant turn", bn);
                break;
            }
            json_array_append_new(calls, dsp_srv_tool_call_msg(json_string_value(id), json_string_value(name), input));
        } else if (!strcmp(type, "tool_result")) {
            json_t *id = json_object_get(b, "tool_use_id"), *rc = json_object_get(b, "content");
            if (strcmp(role, "user") || !json_is_string(id)) {
                ok = dsp_srv_fail(e, DSP_ERR_INVALID_ARG, bn, "%s: a tool_result block is {tool_use_id, content}, on a user turn", bn);
                break;
            }
            json_t *txt = !rc || json_is_null(rc) ? json_string("") : dsp_srv_text_parts(rc, bn, k_text, e);
            if (!txt) {
                ok = false;
                break;
            }
            if (json_is_true(json_object_get(b, "is_error"))) {
                char *t = NULL;
                if (asprintf(&t, "Error: %s", json_string_value(txt)) >= 0) json_decref(txt), txt = json_string(t);
                free(t);
            }
            json_t *tm = json_pack("{s:s, s:o, s:O}", "role", "tool", "content", txt, "tool_call_id", id);
            const char *fname = dsp_srv_call_name(out, json_string_value(id));
            if (fname) json_object_set_new(tm, "name", json_string(fname));
            json_array_append_new(results, tm);
        } else {
            ok = dsp_srv_fail(e, DSP_ERR_UNSUPPORTED, bn, "%s: content blocks of type '%.32s' are not supported (text, tool_use, tool_result, thinking)",
                              bn, type);
            break;
        }
    }
    if (ok) {
        size_t j;
        json_t *x;
        json_array_foreach(results, j, x) json_array_append(out, x);
        json_t *txt = json_array_size(texts) || !json_array_size(results) ? dsp_srv_text_parts(texts, pname, k_text, e) : NULL;
        if (txt || json_array_size(calls)) {
            json_t *msg = json_pack("{s:s, s:o}", "role", role, "content", txt ? txt : json_string(""));
            if (json_array_size(calls)) json_object_set(msg, "tool_calls", calls);
            json_array_append_new(out, msg);
        }
    }
    json_decref(texts), json_decref(calls), json_decref(results);
    return ok;
}

bool dsp_srv_parse_messages(dsp_srv *s, const char *body, size_t len, bool count_only, dsp_srv_req *r, dsp_srv_error *e) {
    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
    if (!root) return dsp_srv_fail(e, DSP_SRV_ERR_JSON, NULL, "the body is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line, jerr.column);
    bool ok = false;
    json_t *msgs = NULL;
    dsp_srv_req_begin(s, r, DSP_SRV_MESSAGES);
    r->count_only = count_only;
    dsp_gen_params *gp = &r->gp;
    long long mt = 0, tk = 0;
    bool have = false;
    if (!json_is_object(root)) {
        dsp_srv_fail(e, DSP_ERR_INVALID_ARG, NULL, "the body must be a JSON object");
        goto out;
    }
    if (!dsp_srv_check_model(s, root, r, e)) goto out;
    if (!count_only) {
        if (!dsp_srv_get_int(root, "max_tokens", 1, s->cfg.max_tokens_cap, &mt, &have, e)) goto out;
        if (!have) {
            dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "max_tokens", "max_tokens: Field required");
            goto out;
        }
        gp->max_tokens = (int32_t)mt;
        if (!dsp_srv_get_num(root, "temperature", 0, 1, false, &gp->temperature, e) || !dsp_srv_get_num(root, "top_p", 0, 1, true, &gp->top_p, e) ||
            !dsp_srv_get_int(root, "top_k", 0, 1LL << 30, &tk, &have, e) || !dsp_srv_get_bool(root, "stream", &r->stream, e))
            goto out;
        if (have) gp->top_k = (int32_t)tk;
        json_t *ss = dsp_srv_field(root, "stop_sequences");
        if (ss) {
            if (!json_is_array(ss) || json_array_size(ss) > DSP_MAX_STOP) {
                dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "stop_sequences", "stop_sequences: must be an array of at most %d strings", DSP_MAX_STOP);
                goto out;
            }
            size_t i;
            json_t *v;
            int k = 0;
            json_array_foreach(ss, i, v) {
                if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) > 1024) {
                    dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "stop_sequences", "stop_sequences.%zu: must be a non-empty string of at most 1024 bytes", i);
                    goto out;
                }
                if (!(r->stops[k] = strdup(json_string_value(v)))) goto oom;
                gp->stop[k] = r->stops[k];
                k++;
            }
        }
    }
    /* thinking: {type: enabled|disabled} -> enable_thinking */
    json_t *kw = json_object();
    json_t *th = dsp_srv_field(root, "thinking");
    if (th) {
        const char *type = json_string_value(json_object_get(th, "type"));
        if (!type || (strcmp(type, "enabled") && strcmp(type, "disabled"))) {
            json_decref(kw);
            dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "thinking", "thinking: must be {type: enabled|disabled}");
            goto out;
        }
        json_object_set_new(kw, "enable_thinking", json_boolean(!strcmp(type, "enabled")));
    }
    if (!dsp_srv_tools_parse(s, root, DSP_SRV_DIALECT_ANTHROPIC, r, e)) {
        json_decref(kw);
        goto out;
    }
    /* system + messages */
    msgs = json_array();
    json_t *sys = dsp_srv_field(root, "system");
    if (sys) {
        json_t *t = dsp_srv_text_parts(sys, "system", k_text, e);
        if (!t) {
            json_decref(kw);
            goto out;
        }
        json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", "system", "content", t));
    }
    json_t *m = dsp_srv_field(root, "messages");
    if (!json_is_array(m) || json_array_size(m) == 0) {
        json_decref(kw);
        dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "messages", "messages: must be a non-empty array");
        goto out;
    }
    size_t i;
    json_t *x;
    json_array_foreach(m, i, x) {
        if (!convert_message(x, i, msgs, e)) {
            json_decref(kw);
            goto out;
        }
    }
    ok = dsp_srv_chat_prompt(s, r, msgs, kw, e);
    msgs = NULL; /* stolen */
    json_decref(kw);
    if (ok && !count_only) ok = dsp_srv_req_ready(s, r, e);
    goto out;
oom:
    dsp_srv_fail(e, DSP_ERR_NOMEM, NULL, "out of memory");
out:
    json_decref(msgs);
    json_decref(root);
    return ok;
}

/* ---- response ------------------------------------------------------------------------------------- */

/* Which stop sequence ended the reply, or NULL (the engine cuts it from the text, not the tokens). */
static const char *matched_stop(dsp_srv *s, const dsp_srv_req *r, const dsp_srv_out *o) {
    if (o->res.finish != DSP_FINISH_STOP || !r->gp.stop[0] || !o->n_toks) return NULL;
    int32_t *ids = malloc(o->n_toks * sizeof *ids);
    if (!ids) return NULL;
    for (size_t i = 0; i < o->n_toks; i++) ids[i] = o->toks[i].id;
    size_t n = 0;
    dsp_detokenize(s->tok, ids, o->n_toks, 0, NULL, 0, &n);
    char *full = malloc(n + 1);
    const char *hit = NULL;
    if (full && dsp_detokenize(s->tok, ids, o->n_toks, 0, full, n + 1, &n) == DSP_OK && n >= o->n_text) {
        for (int k = 0; k < DSP_MAX_STOP && r->gp.stop[k] && !hit; k++) {
            const char *st = r->gp.stop[k];
            size_t sl = strlen(st);
            if (n - o->n_text >= sl && !memcmp(full + o->n_text, st, sl)) hit = st;
        }
    }
    free(full);
    free(ids);
    return hit;
}

static const char *stop_reason(const dsp_srv_reply *rep, const dsp_srv_out *o, const char *stop) {
    if (rep->calls.n) return "tool_use";
    if (o->res.finish == DSP_FINISH_LENGTH) return "max_tokens";
    return stop ? "stop_sequence" : "end_turn";
}

static json_t *usage(const dsp_srv_out *o, size_t out_tokens) {
    return json_pack("{s:I, s:I, s:I, s:I}", "input_tokens", (json_int_t)(o->res.n_prompt - o->res.n_cached), "cache_read_input_tokens",
                     (json_int_t)o->res.n_cached, "cache_creation_input_tokens", (json_int_t)0, "output_tokens", (json_int_t)out_tokens);
}

/* Anthropic's ids read toolu_... */
static void toolu_id(dsp_srv_call *c) {
    char t[sizeof c->id];
    if (strncmp(c->id, "call_", 5)) return;
    snprintf(t, sizeof t, "toolu_%s", c->id + 5);
    memcpy(c->id, t, sizeof t);
}

static json_t *tool_use_block(const dsp_srv_call *c, bool with_input) {
    json_t *in = with_input ? json_loads(c->args, 0, NULL) : NULL;
    if (!json_is_object(in)) json_decref(in), in = json_object();
    return json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", c->id, "name", c->name, "input", in);
}

char *dsp_srv_anthropic_response(dsp_srv *s, dsp_srv_req *r) {
    const dsp_srv_out *o = &r->out;
    if (r->count_only) {
        json_t *root = json_pack("{s:I}", "input_tokens", (json_int_t)r->n_prompt);
        char *out = json_dumps(root, JSON_COMPACT);
        json_decref(root);
        return out;
    }
    dsp_srv_reply rep;
    dsp_srv_reply_make(s, r, o, &rep);
    const dsp_srv_parts *pt = &rep.parts;
    json_t *content = json_array();
    if (pt->r1 > pt->r0)
        json_array_append_new(content, json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking", dsp_srv_jstr(rep.p + pt->r0, pt->r1 - pt->r0),
                                                 "signature", ""));
    if (pt->c1 > pt->c0 || (!rep.calls.n && pt->r1 == pt->r0))
        json_array_append_new(content, json_pack("{s:s, s:o}", "type", "text", "text", dsp_srv_jstr(rep.p + pt->c0, pt->c1 - pt->c0)));
    for (int i = 0; i < rep.calls.n; i++) {
        toolu_id(&rep.calls.v[i]);
        json_array_append_new(content, tool_use_block(&rep.calls.v[i], true));
    }
    const char *stop = matched_stop(s, r, o);
    json_t *root = json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:o, s:o, s:o}", "id", r->id, "type", "message", "role", "assistant", "model", r->model,
                             "content", content, "stop_reason", stop_reason(&rep, o, stop), "stop_sequence", stop ? json_string(stop) : json_null(),
                             "usage", usage(o, o->res.n_generated), "dspark", dsp_srv_stats_json(s, r, o));
    dsp_srv_reply_free(&rep);
    char *out = root ? json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(root);
    return out;
}

/* ---- streaming -------------------------------------------------------------------------------------- */

static void block_stop(dsp_srv_sbuf *b, dsp_srv_cursor *cur) {
    if (cur->open == 1) /* a thinking block closes with its (empty: no signing here) signature */
        dsp_srv_sb_event(b, "content_block_delta", json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index", cur->block, "delta",
                                                             "type", "signature_delta", "signature", ""));
    dsp_srv_sb_event(b, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", cur->block));
    cur->block++;
    cur->open = 0;
}

/* text [a, z) of the reply as a delta of an open block of kind (1 thinking, 2 text) */
static void block_text(dsp_srv_sbuf *b, dsp_srv_cursor *cur, int kind, const char *p, size_t n) {
    if (cur->open && cur->open != kind) block_stop(b, cur);
    if (!cur->open) {
        json_t *cb = kind == 1 ? json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", "")
                               : json_pack("{s:s, s:s}", "type", "text", "text", "");
        dsp_srv_sb_event(b, "content_block_start", json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", cur->block, "content_block", cb));
        cur->open = kind;
    }
    if (n)
        dsp_srv_sb_event(b, "content_block_delta",
                         json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta", "index", cur->block, "delta", "type",
                                   kind == 1 ? "thinking_delta" : "text_delta", kind == 1 ? "thinking" : "text", dsp_srv_jstr(p, n)));
}

char *dsp_srv_anthropic_events(dsp_srv *s, const dsp_srv_req *r, const dsp_srv_out *o, dsp_srv_cursor *cur, size_t *len) {
    dsp_srv_sbuf b = {0};
    if (!cur->started) {
        cur->started = true;
        json_t *u = json_pack("{s:I, s:I}", "input_tokens", (json_int_t)r->n_prompt, "output_tokens", (json_int_t)0);
        dsp_srv_sb_event(&b, "message_start",
                         json_pack("{s:s, s:{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:o}}", "type", "message_start", "message", "id", r->id, "type",
                                   "message", "role", "assistant", "model", r->model, "content", "stop_reason", "stop_sequence", "usage", u));
        dsp_srv_sb_event(&b, "ping", json_pack("{s:s}", "type", "ping"));
    }
    if (o->done && (o->status != DSP_OK || o->res.finish == DSP_FINISH_CANCELLED)) {
        dsp_srv_error e;
        if (o->status == DSP_OK || o->status == DSP_ERR_CANCELLED) dsp_srv_fail(&e, DSP_ERR_BUSY, NULL, "the server is shutting down");
        else dsp_srv_fail(&e, o->status, NULL, "%s", o->error);
        char *js = dsp_srv_anthropic_error_json(&e);
        json_t *ev = js ? json_loads(js, 0, NULL) : NULL;
        free(js);
        dsp_srv_sb_event(&b, "error", ev);
    } else {
        dsp_srv_reply rep;
        dsp_srv_reply_make(s, r, o, &rep);
        const dsp_srv_parts *pt = &rep.parts;
        size_t ra = cur->r_sent > pt->r0 ? cur->r_sent : pt->r0, ca = cur->c_sent > pt->c0 ? cur->c_sent : pt->c0;
        if (pt->r1 > ra) {
            block_text(&b, cur, 1, rep.p + ra, pt->r1 - ra);
            cur->r_sent = pt->r1;
        }
        if (pt->c1 > ca) {
            block_text(&b, cur, 2, rep.p + ca, pt->c1 - ca);
            cur->c_sent = pt->c1;
        }
        if (o->done) {
            if (cur->open) block_stop(&b, cur);
            if (cur->block == 0 && !rep.calls.n) { /* an empty reply still has a (empty) text block */
                block_text(&b, cur, 2, "", 0);
                block_stop(&b, cur);
            }
            for (int i = 0; i < rep.calls.n; i++) {
                dsp_srv_call *c = &rep.calls.v[i];
                toolu_id(c);
                dsp_srv_sb_event(&b, "content_block_start", json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", cur->block,
                                                                      "content_block", tool_use_block(c, false)));
                dsp_srv_sb_event(&b, "content_block_delta", json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index", cur->block,
                                                                      "delta", "type", "input_json_delta", "partial_json", c->args));
                block_stop(&b, cur);
            }
            const char *stop = matched_stop(s, r, o);
            dsp_srv_sb_event(&b, "message_delta",
                             json_pack("{s:s, s:{s:s, s:o}, s:o, s:o}", "type", "message_delta", "delta", "stop_reason", stop_reason(&rep, o, stop),
                                       "stop_sequence", stop ? json_string(stop) : json_null(), "usage", usage(o, o->res.n_generated), "dspark",
                                       dsp_srv_stats_json(s, r, o)));
            dsp_srv_sb_event(&b, "message_stop", json_pack("{s:s}", "type", "message_stop"));
        }
        dsp_srv_reply_free(&rep);
    }
    if (b.oom) {
        free(b.p);
        b.p = NULL, b.n = 0;
    }
    *len = b.n;
    return b.p;
}
