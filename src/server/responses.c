/* server/responses: OpenAI's Responses API (POST /v1/responses), stateless.
 *
 * Request: input as a string or a list of items (message with string or input_text/output_text
 * parts; function_call {call_id, name, arguments}; function_call_output {call_id, output};
 * reasoning items are skipped), instructions (the system message), flat tools ({type:
 * "function", name, description, parameters}), tool_choice, parallel_tool_calls,
 * max_output_tokens, temperature, top_p, stream. Nothing is stored on the server, so
 * previous_response_id is a 400 that says so (send the whole conversation as input instead).
 *
 * Response: output items reasoning / message (output_text) / function_call; streaming with
 * response.created, response.output_item.added, response.content_part.added,
 * response.output_text.delta, response.reasoning_text.delta, response.function_call_arguments.*,
 * the matching .done events and response.completed, each with a sequence_number. */
#include "server/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_parts[] = {"input_text", "output_text", "text", NULL};

static bool convert_items(json_t *input, json_t *msgs, dsp_srv_error *e) {
    if (json_is_string(input)) {
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content", input));
        return true;
    }
    if (!json_is_array(input) || json_array_size(input) == 0)
        return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "input", "'input' must be a string or a non-empty array of items");
    size_t i;
    json_t *it;
    char pname[48];
    json_t *pending_calls = NULL; /* consecutive function_call items form one assistant turn */
    json_array_foreach(input, i, it) {
        snprintf(pname, sizeof pname, "input[%zu]", i);
        if (!json_is_object(it)) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "'%s' must be an item object", pname);
        const char *type = json_string_value(json_object_get(it, "type"));
        if (!type && json_object_get(it, "role")) type = "message";
        if (!type) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "'%s' needs a 'type'", pname);
        if (!strcmp(type, "function_call")) {
            json_t *id = json_object_get(it, "call_id"), *name = json_object_get(it, "name"), *args = json_object_get(it, "arguments");
            if (!json_is_string(id) || !json_is_string(name) || !json_is_string(args))
                return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "'%s' (function_call) needs string call_id, name and arguments", pname);
            if (!pending_calls) {
                json_t *msg = json_pack("{s:s, s:s, s:[]}", "role", "assistant", "content", "", "tool_calls");
                json_array_append_new(msgs, msg);
                pending_calls = json_object_get(msg, "tool_calls");
            }
            json_array_append_new(pending_calls, dsp_srv_tool_call_msg(json_string_value(id), json_string_value(name), args));
            continue;
        }
        pending_calls = NULL;
        if (!strcmp(type, "function_call_output")) {
            json_t *id = json_object_get(it, "call_id"), *out = json_object_get(it, "output");
            if (!json_is_string(id) || !json_is_string(out))
                return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "'%s' (function_call_output) needs string call_id and output", pname);
            json_t *tm = json_pack("{s:s, s:O, s:O}", "role", "tool", "content", out, "tool_call_id", id);
            const char *fname = dsp_srv_call_name(msgs, json_string_value(id));
            if (fname) json_object_set_new(tm, "name", json_string(fname));
            json_array_append_new(msgs, tm);
        } else if (!strcmp(type, "message")) {
            const char *role = json_string_value(json_object_get(it, "role"));
            if (role && !strcmp(role, "developer")) role = "system";
            if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system")))
                return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "'%s.role' must be user, assistant, system or developer", pname);
            snprintf(pname, sizeof pname, "input[%zu].content", i);
            json_t *t = dsp_srv_text_parts(json_object_get(it, "content"), pname, k_parts, e);
            if (!t) return false;
            json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", role, "content", t));
        } else if (strcmp(type, "reasoning")) {
            return dsp_srv_fail(e, DSP_ERR_UNSUPPORTED, pname, "'%s': items of type '%.40s' are not supported (message, function_call, function_call_output)",
                                pname, type);
        }
    }
    return true;
}

bool dsp_srv_parse_responses(dsp_srv *s, const char *body, size_t len, dsp_srv_req *r, dsp_srv_error *e) {
    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
    if (!root) return dsp_srv_fail(e, DSP_SRV_ERR_JSON, NULL, "the body is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line, jerr.column);
    bool ok = false;
    json_t *msgs = json_array();
    dsp_srv_req_begin(s, r, DSP_SRV_RESPONSES);
    dsp_gen_params *gp = &r->gp;
    long long mt = s->cfg.default_max_tokens;
    if (!json_is_object(root)) {
        dsp_srv_fail(e, DSP_ERR_INVALID_ARG, NULL, "the body must be a JSON object");
        goto out;
    }
    if (dsp_srv_field(root, "previous_response_id")) {
        dsp_srv_fail(e, DSP_ERR_UNSUPPORTED, "previous_response_id",
                     "'previous_response_id' is not supported: this server stores no responses; send the whole conversation in 'input'");
        goto out;
    }
    if (!dsp_srv_check_model(s, root, r, e) || !dsp_srv_get_int(root, "max_output_tokens", 1, s->cfg.max_tokens_cap, &mt, NULL, e) ||
        !dsp_srv_get_num(root, "temperature", 0, 2, false, &gp->temperature, e) || !dsp_srv_get_num(root, "top_p", 0, 1, true, &gp->top_p, e) ||
        !dsp_srv_get_bool(root, "stream", &r->stream, e))
        goto out;
    gp->max_tokens = (int32_t)mt;
    if (!dsp_srv_tools_parse(s, root, DSP_SRV_DIALECT_RESPONSES, r, e)) goto out;
    json_t *ins = dsp_srv_field(root, "instructions");
    if (ins) {
        if (!json_is_string(ins)) {
            dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "instructions", "'instructions' must be a string");
            goto out;
        }
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", ins));
    }
    if (!convert_items(dsp_srv_field(root, "input"), msgs, e)) goto out;
    ok = dsp_srv_chat_prompt(s, r, msgs, NULL, e) && dsp_srv_req_ready(s, r, e);
    msgs = NULL;
out:
    json_decref(msgs);
    json_decref(root);
    return ok;
}

/* ---- response ------------------------------------------------------------------------------------ */

static void item_id(const dsp_srv_req *r, const char *pre, int k, char *out, size_t cap) { snprintf(out, cap, "%s_%s_%d", pre, r->id + 5, k); }

static json_t *usage(const dsp_srv_out *o) {
    return json_pack("{s:I, s:{s:I}, s:I, s:{s:I}, s:I}", "input_tokens", (json_int_t)o->res.n_prompt, "input_tokens_details", "cached_tokens",
                     (json_int_t)o->res.n_cached, "output_tokens", (json_int_t)o->res.n_generated, "output_tokens_details", "reasoning_tokens",
                     (json_int_t)0, "total_tokens", (json_int_t)(o->res.n_prompt + o->res.n_generated));
}

static json_t *reasoning_item(const dsp_srv_req *r, const char *p, size_t n, int k) {
    char id[96];
    item_id(r, "rs", k, id, sizeof id);
    return json_pack("{s:s, s:s, s:[], s:[{s:s, s:o}], s:s}", "type", "reasoning", "id", id, "summary", "content", "type", "reasoning_text", "text",
                     dsp_srv_jstr(p, n), "status", "completed");
}

static json_t *text_part(const char *p, size_t n) { return json_pack("{s:s, s:o, s:[]}", "type", "output_text", "text", dsp_srv_jstr(p, n), "annotations"); }

static json_t *message_item(const dsp_srv_req *r, const char *p, size_t n, int k, bool done) {
    char id[96];
    item_id(r, "msg", k, id, sizeof id);
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "type", "message", "id", id, "status", done ? "completed" : "in_progress", "role", "assistant",
                     "content", done ? json_pack("[o]", text_part(p, n)) : json_array());
}

static json_t *call_item(const dsp_srv_req *r, const dsp_srv_call *c, int k, bool done) {
    char id[96];
    item_id(r, "fc", k, id, sizeof id);
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "type", "function_call", "id", id, "call_id", c->id, "name", c->name, "arguments",
                     done ? c->args : "", "status", done ? "completed" : "in_progress");
}

/* The response object; o NULL: as created (in progress, no output yet). */
static json_t *response_obj(dsp_srv *s, const dsp_srv_req *r, const dsp_srv_out *o, const dsp_srv_reply *rep) {
    json_t *output = json_array();
    const char *status = "in_progress";
    json_t *incomplete = json_null();
    if (o) {
        const dsp_srv_parts *pt = &rep->parts;
        int k = 0;
        if (pt->r1 > pt->r0) json_array_append_new(output, reasoning_item(r, rep->p + pt->r0, pt->r1 - pt->r0, k++));
        if (pt->c1 > pt->c0 || !rep->calls.n) json_array_append_new(output, message_item(r, rep->p + pt->c0, pt->c1 - pt->c0, k++, true));
        for (int i = 0; i < rep->calls.n; i++) json_array_append_new(output, call_item(r, &rep->calls.v[i], k++, true));
        status = o->res.finish == DSP_FINISH_LENGTH ? "incomplete" : "completed";
        if (o->res.finish == DSP_FINISH_LENGTH) json_decref(incomplete), incomplete = json_pack("{s:s}", "reason", "max_output_tokens");
    }
    json_t *tools = r->tools.list ? json_array() : json_array();
    size_t i;
    json_t *t;
    json_array_foreach(r->tools.list, i, t) {
        json_t *fn = json_deep_copy(json_object_get(t, "function"));
        json_object_set_new(fn, "type", json_string("function"));
        json_array_append_new(tools, fn);
    }
    json_t *root = json_pack("{s:s, s:s, s:I, s:s, s:s, s:o, s:o, s:n, s:b, s:s, s:o, s:f, s:f, s:I, s:{}, s:n, s:b}", "id", r->id, "object", "response",
                             "created_at", (json_int_t)r->created, "status", status, "model", r->model, "output", output, "incomplete_details",
                             incomplete, "error", "parallel_tool_calls", !r->tools.single, "tool_choice",
                             r->tools.required ? "required" : "auto", "tools", tools, "temperature", (double)r->gp.temperature, "top_p",
                             (double)r->gp.top_p, "max_output_tokens", (json_int_t)r->gp.max_tokens, "metadata", "previous_response_id", "store", 0);
    if (o) {
        json_object_set_new(root, "usage", usage(o));
        json_object_set_new(root, "dspark", dsp_srv_stats_json(s, r, o));
    }
    (void)s;
    return root;
}

char *dsp_srv_responses_response(dsp_srv *s, dsp_srv_req *r) {
    dsp_srv_reply rep;
    dsp_srv_reply_make(s, r, &r->out, &rep);
    json_t *root = response_obj(s, r, &r->out, &rep);
    dsp_srv_reply_free(&rep);
    char *out = root ? json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(root);
    return out;
}

/* ---- streaming -------------------------------------------------------------------------------------- */

static void ev(dsp_srv_sbuf *b, dsp_srv_cursor *cur, const char *type, json_t *obj) {
    json_object_set_new(obj, "type", json_string(type));
    json_object_set_new(obj, "sequence_number", json_integer(cur->seq++));
    dsp_srv_sb_event(b, type, obj);
}

/* close the open item (1 reasoning, 2 message) with its .done events; text is its whole text */
static void item_close(dsp_srv_sbuf *b, dsp_srv_cursor *cur, const dsp_srv_req *r, const char *p, size_t n) {
    int k = cur->block;
    char id[96];
    if (cur->open == 1) {
        item_id(r, "rs", k, id, sizeof id);
        ev(b, cur, "response.reasoning_text.done", json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index", k, "content_index", 0, "text", dsp_srv_jstr(p, n)));
        ev(b, cur, "response.output_item.done", json_pack("{s:i, s:o}", "output_index", k, "item", reasoning_item(r, p, n, k)));
    } else if (cur->open == 2) {
        item_id(r, "msg", k, id, sizeof id);
        ev(b, cur, "response.output_text.done", json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index", k, "content_index", 0, "text", dsp_srv_jstr(p, n)));
        ev(b, cur, "response.content_part.done", json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index", k, "content_index", 0, "part", text_part(p, n)));
        ev(b, cur, "response.output_item.done", json_pack("{s:i, s:o}", "output_index", k, "item", message_item(r, p, n, k, true)));
    }
    if (cur->open) cur->block++;
    cur->open = 0;
}

static void item_text(dsp_srv_sbuf *b, dsp_srv_cursor *cur, const dsp_srv_req *r, const dsp_srv_reply *rep, int kind, size_t a, size_t z) {
    const dsp_srv_parts *pt = &rep->parts;
    if (cur->open && cur->open != kind) item_close(b, cur, r, rep->p + pt->r0, pt->r1 - pt->r0); /* reasoning ends where text begins */
    int k = cur->block;
    char id[96];
    item_id(r, kind == 1 ? "rs" : "msg", k, id, sizeof id);
    if (!cur->open) {
        cur->open = kind;
        if (kind == 1) {
            json_t *it = json_pack("{s:s, s:s, s:[], s:s}", "type", "reasoning", "id", id, "summary", "status", "in_progress");
            ev(b, cur, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", k, "item", it));
        } else {
            ev(b, cur, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", k, "item", message_item(r, "", 0, k, false)));
            ev(b, cur, "response.content_part.added", json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index", k, "content_index", 0, "part", text_part("", 0)));
        }
    }
    if (z > a)
        ev(b, cur, kind == 1 ? "response.reasoning_text.delta" : "response.output_text.delta",
           json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index", k, "content_index", 0, "delta", dsp_srv_jstr(rep->p + a, z - a)));
}

char *dsp_srv_responses_events(dsp_srv *s, const dsp_srv_req *r, const dsp_srv_out *o, dsp_srv_cursor *cur, size_t *len) {
    dsp_srv_sbuf b = {0};
    dsp_srv_reply rep;
    dsp_srv_reply_make(s, r, o, &rep);
    if (!cur->started) {
        cur->started = true;
        ev(&b, cur, "response.created", json_pack("{s:o}", "response", response_obj(s, r, NULL, NULL)));
        ev(&b, cur, "response.in_progress", json_pack("{s:o}", "response", response_obj(s, r, NULL, NULL)));
    }
    if (o->done && (o->status != DSP_OK || o->res.finish == DSP_FINISH_CANCELLED)) {
        const char *msg = o->status == DSP_OK || o->status == DSP_ERR_CANCELLED ? "the server is shutting down" : o->error;
        ev(&b, cur, "error", json_pack("{s:s, s:s, s:n}", "code", "server_error", "message", msg, "param"));
    } else {
        const dsp_srv_parts *pt = &rep.parts;
        size_t ra = cur->r_sent > pt->r0 ? cur->r_sent : pt->r0, ca = cur->c_sent > pt->c0 ? cur->c_sent : pt->c0;
        if (pt->r1 > ra) {
            item_text(&b, cur, r, &rep, 1, ra, pt->r1);
            cur->r_sent = pt->r1;
        }
        if (pt->c1 > ca) {
            item_text(&b, cur, r, &rep, 2, ca, pt->c1);
            cur->c_sent = pt->c1;
        }
        if (o->done) {
            if (cur->open == 1) item_close(&b, cur, r, rep.p + pt->r0, pt->r1 - pt->r0);
            if (!cur->open && !rep.calls.n && pt->c1 == pt->c0) item_text(&b, cur, r, &rep, 2, pt->c0, pt->c0); /* an empty message */
            if (cur->open == 2) item_close(&b, cur, r, rep.p + pt->c0, pt->c1 - pt->c0);
            for (int i = 0; i < rep.calls.n; i++) {
                int k = cur->block++;
                char id[96];
                item_id(r, "fc", k, id, sizeof id);
                ev(&b, cur, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", k, "item", call_item(r, &rep.calls.v[i], k, false)));
                ev(&b, cur, "response.function_call_arguments.delta",
                   json_pack("{s:s, s:i, s:s}", "item_id", id, "output_index", k, "delta", rep.calls.v[i].args));
                ev(&b, cur, "response.function_call_arguments.done",
                   json_pack("{s:s, s:i, s:s}", "item_id", id, "output_index", k, "arguments", rep.calls.v[i].args));
                ev(&b, cur, "response.output_item.done", json_pack("{s:i, s:o}", "output_index", k, "item", call_item(r, &rep.calls.v[i], k, true)));
            }
            ev(&b, cur, o->res.finish == DSP_FINISH_LENGTH ? "response.incomplete" : "response.completed",
               json_pack("{s:o}", "response", response_obj(s, r, o, &rep)));
        }
    }
    dsp_srv_reply_free(&rep);
    if (b.oom) {
        free(b.p);
        b.p = NULL, b.n = 0;
    }
    *len = b.n;
    return b.p;
}
