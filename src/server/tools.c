/* server/tools: tool calling and reasoning, shared by every chat-like API (OpenAI chat, Anthropic
 * messages, OpenAI responses).
 *
 * In: the request's tools become the chat template's `tools` variable (Hugging Face's format,
 * {"type": "function", "function": {name, description, parameters}}), assistant tool calls and tool
 * results become messages the template knows (tool_calls with arguments as an object, role "tool"
 * with tool_call_id and name), and the template decides how the model sees them: that is the model
 * family's own syntax, because it is the model's own template.
 *
 * Out: the generated text is split into reasoning (<think>...</think>), content and tool calls, in
 * the syntax of the template's family:
 *   hermes   <tool_call>{"name": N, "arguments": {...}}</tool_call> (Qwen2.5, Hermes 2/3, Qwen3)
 *   llama3   {"name": N, "parameters": {...}} as the whole reply, optionally after <|python_tag|>
 *   mistral  [TOOL_CALLS][{"name": N, "arguments": {...}, "id": "abcdef123"}, ...]
 *   generic  any template that reads `tools`: the hermes tags, or a bare JSON object/array
 * A call region that does not parse is returned as content (the model's text, never an error).
 *
 * tool_choice "required" and a named function cannot be left to the model's goodwill without
 * constrained decoding; they are enforced by starting the assistant's reply with the family's
 * call opener (for a named function, up to its arguments), which the generation continues. The
 * parser sees opener + generated text.
 *
 * Streaming uses the same split, recomputed over the whole text so far: text that might still
 * turn into a marker (a partial "<tool_call>" at the end) is held back until it is decided.
 * Reasoning and content stream as they are decided; tool calls are parsed once the generation
 * has ended (so that a call that turns out malformed can still become content, exactly as in the
 * non-streaming reply) and then sent in OpenAI's incremental shape. */
#include "server/server.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOOLS 128           /* tools in one request */
#define MAX_TOOL_BYTES (256 * 1024) /* their JSON, dumped */

static bool has(const char *src, size_t n, const char *needle) {
    size_t k = strlen(needle);
    if (k > n) return false;
    for (size_t i = 0; i + k <= n; i++)
        if (src[i] == needle[0] && !memcmp(src + i, needle, k)) return true;
    return false;
}

dsp_srv_tool_family dsp_srv_tool_family_of(const char *tmpl, size_t n) {
    if (!tmpl) return DSP_SRV_TOOLS_NONE;
    if (!has(tmpl, n, "tools")) return DSP_SRV_TOOLS_NONE;
    if (has(tmpl, n, "<tool_call>")) return DSP_SRV_TOOLS_HERMES;
    if (has(tmpl, n, "[TOOL_CALLS]")) return DSP_SRV_TOOLS_MISTRAL;
    if (has(tmpl, n, "<|python_tag|>") || has(tmpl, n, "<|eom_id|>") || has(tmpl, n, "ipython")) return DSP_SRV_TOOLS_LLAMA3;
    return DSP_SRV_TOOLS_GENERIC;
}

const char *dsp_srv_tool_family_name(dsp_srv_tool_family f) {
    switch (f) {
    case DSP_SRV_TOOLS_HERMES: return "hermes";
    case DSP_SRV_TOOLS_LLAMA3: return "llama3";
    case DSP_SRV_TOOLS_MISTRAL: return "mistral";
    case DSP_SRV_TOOLS_GENERIC: return "generic";
    default: return "none";
    }
}

/* ---- ids -------------------------------------------------------------------------------------- */

static uint64_t mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Mistral's template insists on 9 alphanumeric characters; the others take OpenAI's call_ form. */
void dsp_srv_tool_call_id(dsp_srv_tool_family f, uint64_t seed, int index, char *out, size_t cap) {
    static const char k[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint64_t x = mix(seed ^ mix((uint64_t)index + 1));
    char buf[32];
    int n = f == DSP_SRV_TOOLS_MISTRAL ? 9 : 24;
    for (int i = 0; i < n; i++) {
        buf[i] = k[x % 62];
        x /= 62;
        if (x < 62) x = mix(x ^ (uint64_t)i);
    }
    buf[n] = '\0';
    snprintf(out, cap, "%s%s", f == DSP_SRV_TOOLS_MISTRAL ? "" : "call_", buf);
}

/* ---- request side ------------------------------------------------------------------------------ */

/* A function definition {name, description?, parameters?} checked and copied. */
static json_t *check_function(json_t *fn, const char *pname, dsp_srv_error *e) {
    json_t *name = json_object_get(fn, "name");
    if (!json_is_string(name) || json_string_length(name) == 0 || json_string_length(name) > 64)
        return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "'%s.name' must be a string of 1 to 64 characters", pname), NULL;
    for (const char *c = json_string_value(name); *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_' || *c == '-' || *c == '.'))
            return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "'%s.name' may hold only letters, digits, '_', '-' and '.' (got '%.64s')", pname,
                                json_string_value(name)),
                   NULL;
    json_t *desc = json_object_get(fn, "description");
    if (desc && !json_is_null(desc) && !json_is_string(desc))
        return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "'%s.description' must be a string", pname), NULL;
    json_t *params = json_object_get(fn, "parameters");
    if (params && !json_is_null(params) && !json_is_object(params))
        return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "'%s.parameters' must be a JSON Schema object", pname), NULL;
    json_t *out = json_pack("{s:O}", "name", name);
    if (desc && json_is_string(desc)) json_object_set(out, "description", desc);
    json_object_set_new(out, "parameters", params && json_is_object(params) ? json_incref(params) : json_pack("{s:s, s:{}}", "type", "object", "properties"));
    return out;
}

bool dsp_srv_tools_add(dsp_srv_tools *t, json_t *fn_def, const char *pname, dsp_srv_error *e) {
    if (!t->list) t->list = json_array();
    if (json_array_size(t->list) >= MAX_TOOLS)
        return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "tools", "at most %d tools per request", MAX_TOOLS);
    json_t *fn = check_function(fn_def, pname, e);
    if (!fn) return false;
    json_array_append_new(t->list, json_pack("{s:s, s:o}", "type", "function", "function", fn));
    return true;
}

bool dsp_srv_tools_finish(dsp_srv *s, dsp_srv_tools *t, const char *choice, const char *named, dsp_srv_error *e) {
    size_t n = t->list ? json_array_size(t->list) : 0;
    if (n == 0) {
        if (named || (choice && !strcmp(choice, "required")))
            return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "tool_choice", "'tool_choice' asks for a tool call but no tools are given");
        return true;
    }
    char *dump = json_dumps(t->list, JSON_COMPACT);
    size_t dl = dump ? strlen(dump) : 0;
    free(dump);
    if (dl > MAX_TOOL_BYTES) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "tools", "the tools' definitions are %zu bytes; at most %d", dl, MAX_TOOL_BYTES);
    if (choice && !strcmp(choice, "none")) { /* the model is not to call tools: it does not see them */
        json_decref(t->list);
        t->list = NULL;
        return true;
    }
    if (s->tool_family == DSP_SRV_TOOLS_NONE)
        return dsp_srv_fail(e, DSP_ERR_UNSUPPORTED, "tools",
                            "this model's chat template has no tool support (it never reads 'tools'); start dspark serve with "
                            "--chat-template FILE that has");
    if (named) {
        json_t *keep = NULL;
        for (size_t i = 0; i < n; i++) {
            json_t *fn = json_object_get(json_array_get(t->list, i), "function");
            if (!strcmp(json_string_value(json_object_get(fn, "name")), named)) keep = json_array_get(t->list, i);
        }
        if (!keep) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "tool_choice", "'tool_choice' names the function '%.64s', which is not in 'tools'", named);
        json_t *one = json_pack("[O]", keep);
        json_decref(t->list);
        t->list = one;
        snprintf(t->named, sizeof t->named, "%s", named);
    }
    t->required = named || (choice && !strcmp(choice, "required"));
    t->active = true;
    return true;
}

/* One element of 'tools' -> a function definition (new reference) and its parameter name. */
static json_t *tool_def(int dialect, json_t *t, size_t i, char *pname, size_t cap, dsp_srv_error *e) {
    const char *type = json_string_value(json_object_get(t, "type"));
    switch (dialect) {
    case DSP_SRV_DIALECT_CHAT: {
        snprintf(pname, cap, "tools[%zu]", i);
        json_t *fn = json_object_get(t, "function");
        if (!json_is_object(t) || !type || strcmp(type, "function") || !json_is_object(fn))
            return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "'%s' must be {\"type\": \"function\", \"function\": {\"name\", \"parameters\", ...}}", pname), NULL;
        snprintf(pname, cap, "tools[%zu].function", i);
        return json_incref(fn);
    }
    case DSP_SRV_DIALECT_RESPONSES:
        snprintf(pname, cap, "tools[%zu]", i);
        if (!json_is_object(t) || !type || strcmp(type, "function"))
            return dsp_srv_fail(e, DSP_ERR_UNSUPPORTED, pname, "'%s' must be {\"type\": \"function\", \"name\", \"parameters\"} (no built-in tools here)", pname), NULL;
        return json_incref(t);
    default: { /* Anthropic: {name, description, input_schema} */
        snprintf(pname, cap, "tools.%zu", i);
        if (!json_is_object(t)) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "%s: must be {name, description, input_schema}", pname), NULL;
        if (type && strcmp(type, "custom"))
            return dsp_srv_fail(e, DSP_ERR_UNSUPPORTED, pname, "%s: server tools of type '%.40s' are not supported (only client tools)", pname, type), NULL;
        json_t *schema = json_object_get(t, "input_schema");
        if (!json_is_object(schema)) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, pname, "%s.input_schema: must be a JSON Schema object", pname), NULL;
        return json_pack("{s:O?, s:O?, s:O}", "name", json_object_get(t, "name"), "description", json_object_get(t, "description"), "parameters", schema);
    }
    }
}

/* tool_choice in the dialect's shape -> choice ("auto", "none", "required") or named */
static bool tool_choice(int dialect, json_t *tc, const char **choice, const char **named, bool *single, dsp_srv_error *e) {
    if (!tc) return true;
    if (dialect == DSP_SRV_DIALECT_ANTHROPIC) {
        const char *type = json_string_value(json_object_get(tc, "type"));
        if (type && !strcmp(type, "auto")) *choice = "auto";
        else if (type && !strcmp(type, "any")) *choice = "required";
        else if (type && !strcmp(type, "none")) *choice = "none";
        else if (type && !strcmp(type, "tool") && json_is_string(json_object_get(tc, "name"))) *named = json_string_value(json_object_get(tc, "name"));
        else return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "tool_choice", "tool_choice: must be {type: auto|any|none} or {type: tool, name}");
        *single = json_is_true(json_object_get(tc, "disable_parallel_tool_use"));
        return true;
    }
    if (json_is_string(tc)) *choice = json_string_value(tc);
    else if (dialect == DSP_SRV_DIALECT_CHAT) *named = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
    else *named = json_string_value(json_object_get(tc, "name"));
    if (!*named && (!*choice || (strcmp(*choice, "auto") && strcmp(*choice, "none") && strcmp(*choice, "required"))))
        return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "tool_choice", "'tool_choice' must be 'auto', 'none', 'required' or a named function (%s)",
                            dialect == DSP_SRV_DIALECT_CHAT ? "{\"type\": \"function\", \"function\": {\"name\": ...}}" : "{\"type\": \"function\", \"name\": ...}");
    return true;
}

bool dsp_srv_tools_parse(dsp_srv *s, json_t *root, int dialect, dsp_srv_req *r, dsp_srv_error *e) {
    json_t *tools = dsp_srv_field(root, "tools");
    if (tools && !json_is_array(tools)) return dsp_srv_fail(e, DSP_ERR_INVALID_ARG, "tools", "'tools' must be an array");
    size_t i;
    json_t *t;
    char pname[64];
    json_array_foreach(tools, i, t) {
        json_t *fn = tool_def(dialect, t, i, pname, sizeof pname, e);
        bool ok = fn && dsp_srv_tools_add(&r->tools, fn, pname, e);
        json_decref(fn);
        if (!ok) return false;
    }
    const char *choice = NULL, *named = NULL;
    bool parallel = true;
    if (!tool_choice(dialect, dsp_srv_field(root, "tool_choice"), &choice, &named, &r->tools.single, e)) return false;
    if (dialect != DSP_SRV_DIALECT_ANTHROPIC) {
        if (!dsp_srv_get_bool(root, "parallel_tool_calls", &parallel, e)) return false;
        r->tools.single = !parallel;
    }
    return dsp_srv_tools_finish(s, &r->tools, choice, named, e);
}

/* The opener that starts the reply when a call is required (a named one: up to its arguments). */
static void opener(dsp_srv_tool_family f, const char *named, char *out, size_t cap) {
    switch (f) {
    case DSP_SRV_TOOLS_MISTRAL:
        if (*named) snprintf(out, cap, "[TOOL_CALLS][{\"name\": \"%s\", \"arguments\": ", named);
        else snprintf(out, cap, "[TOOL_CALLS][");
        break;
    case DSP_SRV_TOOLS_LLAMA3:
        if (*named) snprintf(out, cap, "{\"name\": \"%s\", \"parameters\": ", named);
        else snprintf(out, cap, "{\"name\": \"");
        break;
    default: /* hermes, generic */
        if (*named) snprintf(out, cap, "<tool_call>\n{\"name\": \"%s\", \"arguments\": ", named);
        else snprintf(out, cap, "<tool_call>\n{\"name\": \"");
        break;
    }
}

void dsp_srv_tools_prefix(const dsp_srv *s, const dsp_srv_tools *t, char *out, size_t cap) {
    out[0] = '\0';
    if (t->active && t->required) opener(s->tool_family, t->named, out, cap);
}

/* arguments given as a JSON string (OpenAI) -> the object the templates render with tojson */
static json_t *args_object(json_t *args) {
    if (json_is_string(args)) {
        json_t *o = json_loads(json_string_value(args), JSON_DECODE_ANY, NULL);
        if (o && json_is_object(o)) return o;
        json_decref(o);
        return json_object(); /* not an object: the templates cannot render it; an empty call */
    }
    return json_is_object(args) ? json_incref(args) : json_object();
}

json_t *dsp_srv_tool_call_msg(const char *id, const char *name, json_t *args) {
    return json_pack("{s:s, s:s, s:{s:s, s:o}}", "id", id, "type", "function", "function", "name", name, "arguments", args_object(args));
}

/* ---- output side: the split -------------------------------------------------------------------- */

static size_t find(const char *p, size_t n, size_t from, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = from; i + k <= n; i++)
        if (p[i] == needle[0] && !memcmp(p + i, needle, k)) return i;
    return n;
}

/* bytes at the end of p[from..n) that are a proper prefix of needle (held back while streaming) */
static size_t partial(const char *p, size_t n, size_t from, const char *needle) {
    size_t k = strlen(needle);
    for (size_t l = k - 1; l > 0; l--)
        if (n >= from + l && !memcmp(p + n - l, needle, l)) return l;
    return 0;
}

static size_t skip_ws(const char *p, size_t n, size_t i) {
    while (i < n && (p[i] == ' ' || p[i] == '\n' || p[i] == '\r' || p[i] == '\t')) i++;
    return i;
}

void dsp_srv_split(const dsp_srv_req *r, const dsp_srv *s, const char *p, size_t n, bool done, dsp_srv_parts *sp) {
    memset(sp, 0, sizeof sp[0]);
    size_t i = 0;
    sp->calls = n;
    /* reasoning */
    if (r->think) {
        size_t r0 = 0;
        bool in = r->think_start;
        if (!in) {
            size_t j = skip_ws(p, n, 0);
            if (n - j >= 7 && !memcmp(p + j, "<think>", 7)) in = true, r0 = j + 7;
            else if (!done && j == n) { /* only whitespace so far: undecided */
                sp->c0 = sp->c1 = 0;
                return;
            } else if (!done && n - j < 7 && !memcmp(p + j, "<think>", n - j)) { /* a partial "<think>" */
                sp->c0 = sp->c1 = 0;
                return;
            }
        }
        if (in) {
            size_t e = find(p, n, r0, "</think>");
            sp->r0 = r0;
            if (e == n) {
                sp->r1 = done ? n : n - partial(p, n, r0, "</think>");
                sp->c0 = sp->c1 = sp->calls = n;
                sp->in_reasoning = !done;
                return;
            }
            sp->r1 = e;
            i = skip_ws(p, n, e + 8);
            if (!done && i == n) { /* whitespace after </think> might be followed by anything */
                sp->c0 = sp->c1 = n;
                return;
            }
        }
    }
    sp->c0 = i;
    if (!r->tools.active) {
        sp->c1 = n;
        return;
    }
    /* tool calls: where the call region starts */
    dsp_srv_tool_family f = s->tool_family;
    size_t t = n, hold = 0;
    size_t j = skip_ws(p, n, i);
    if (f == DSP_SRV_TOOLS_MISTRAL) {
        t = find(p, n, i, "[TOOL_CALLS]");
        if (t == n) hold = partial(p, n, i, "[TOOL_CALLS]");
    } else {
        t = find(p, n, i, "<tool_call>");
        if (t == n) hold = partial(p, n, i, "<tool_call>");
        if (f == DSP_SRV_TOOLS_LLAMA3) {
            size_t py = find(p, n, i, "<|python_tag|>");
            if (py < t) t = py;
            if (t == n && partial(p, n, i, "<|python_tag|>") > hold) hold = partial(p, n, i, "<|python_tag|>");
        }
        if ((f == DSP_SRV_TOOLS_LLAMA3 || f == DSP_SRV_TOOLS_GENERIC) && j < n && (p[j] == '{' || (f == DSP_SRV_TOOLS_GENERIC && p[j] == '[')))
            t = j; /* a reply that is JSON: a call, if it parses */
        if (!done && j == n) hold = n - i; /* nothing but whitespace yet: could still open with '{' */
    }
    sp->calls = t;
    sp->c1 = t < n ? t : (done ? n : n - hold);
}

/* ---- output side: parsing calls ---------------------------------------------------------------- */

static void call_free(dsp_srv_call *c) {
    free(c->name);
    free(c->args);
}

void dsp_srv_calls_free(dsp_srv_calls *cs) {
    for (int i = 0; i < cs->n; i++) call_free(&cs->v[i]);
    free(cs->v);
    memset(cs, 0, sizeof *cs);
}

/* One call object: {"name": N, "arguments"|"parameters": {...}|"...", "id"?}. */
static bool add_call(dsp_srv_calls *cs, json_t *o) {
    if (!json_is_object(o)) return false;
    json_t *fn = json_object_get(o, "function"); /* OpenAI-shaped output: {"function": {...}} */
    if (json_is_object(fn) && !json_object_get(o, "name")) o = fn;
    json_t *name = json_object_get(o, "name");
    json_t *args = json_object_get(o, "arguments");
    if (!args) args = json_object_get(o, "parameters");
    if (!json_is_string(name) || json_string_length(name) == 0) return false;
    char *a;
    if (!args || json_is_null(args)) a = strdup("{}");
    else if (json_is_string(args)) { /* arguments already a JSON string: keep it if it is one */
        json_t *chk = json_loads(json_string_value(args), JSON_DECODE_ANY, NULL);
        if (!chk) return false;
        json_decref(chk);
        a = strdup(json_string_value(args));
    } else a = json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!a) return false;
    dsp_srv_call *nv = realloc(cs->v, (size_t)(cs->n + 1) * sizeof *nv);
    if (!nv) {
        free(a);
        return false;
    }
    cs->v = nv;
    dsp_srv_call *c = &cs->v[cs->n++];
    memset(c, 0, sizeof *c);
    c->name = strdup(json_string_value(name));
    c->args = a;
    json_t *id = json_object_get(o, "id");
    if (json_is_string(id) && json_string_length(id) > 0 && json_string_length(id) < sizeof c->id)
        snprintf(c->id, sizeof c->id, "%s", json_string_value(id));
    return c->name != NULL;
}

/* Calls in JSON text p[0..n): one object, an array of objects, or objects separated by ';' or
 * whitespace. false if anything in it is not a call. */
static bool parse_json_calls(const char *p, size_t n, dsp_srv_calls *cs) {
    size_t i = skip_ws(p, n, 0);
    if (i == n) return false;
    while (i < n) {
        json_error_t err;
        json_t *v = json_loadb(p + i, n - i, JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, &err);
        if (!v) return false;
        bool ok = true;
        if (json_is_array(v)) {
            size_t k;
            json_t *x;
            if (json_array_size(v) == 0) ok = false;
            json_array_foreach(v, k, x) ok = ok && add_call(cs, x);
        } else ok = add_call(cs, v);
        json_decref(v);
        if (!ok) return false;
        i += err.position;
        i = skip_ws(p, n, i);
        while (i < n && p[i] == ';') i = skip_ws(p, n, i + 1);
    }
    return true;
}

bool dsp_srv_parse_calls(dsp_srv_tool_family f, const char *p, size_t n, dsp_srv_calls *cs) {
    memset(cs, 0, sizeof *cs);
    size_t i = skip_ws(p, n, 0);
    bool ok = true;
    if (n - i >= 12 && !memcmp(p + i, "[TOOL_CALLS]", 12)) {
        ok = parse_json_calls(p + i + 12, n - i - 12, cs);
    } else if (n - i >= 14 && !memcmp(p + i, "<|python_tag|>", 14)) {
        size_t e = find(p, n, i + 14, "<|eom_id|>");
        ok = parse_json_calls(p + i + 14, e - i - 14, cs);
    } else if (n - i >= 11 && !memcmp(p + i, "<tool_call>", 11)) {
        /* one or more <tool_call>JSON</tool_call>, whitespace between; a last one may lack its end tag */
        while (ok && i < n) {
            if (n - i < 11 || memcmp(p + i, "<tool_call>", 11)) {
                ok = false;
                break;
            }
            size_t b = i + 11, e = find(p, n, b, "</tool_call>");
            ok = parse_json_calls(p + b, e - b, cs);
            i = skip_ws(p, n, e == n ? n : e + 12);
        }
    } else {
        ok = parse_json_calls(p + i, n - i, cs);
    }
    (void)f;
    if (!ok || cs->n == 0) {
        dsp_srv_calls_free(cs);
        return false;
    }
    return true;
}
