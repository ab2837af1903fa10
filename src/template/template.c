/* template: the public API (template.h) over the lexer, parser and evaluator. */
#include "template/tmpl_internal.h"

dsp_tmpl_limits dsp_tmpl_default_limits(void) {
    dsp_tmpl_limits l = {.max_depth = 64,
                         .max_steps = 20000000,
                         .max_output = (size_t)64 << 20,
                         .max_memory = (size_t)512 << 20,
                         .max_source = (size_t)1 << 20};
    return l;
}

dsp_status dsp_tmpl_create(dsp_tmpl **out, const char *src, size_t len, const dsp_tmpl_limits *limits) {
    *out = NULL;
    dsp_tmpl_limits lim = limits ? *limits : dsp_tmpl_default_limits();
    if (lim.max_depth <= 0 || !lim.max_steps || !lim.max_output || !lim.max_memory || !lim.max_source)
        return dsp_error(DSP_ERR_INVALID_ARG, "template: limits must be positive");
    if (!src && len) return dsp_error(DSP_ERR_INVALID_ARG, "template: NULL source");
    if (len > lim.max_source)
        return dsp_tmpl_fail(0, "template source is %zu bytes, more than the limit of %zu", len, lim.max_source);
    if (!dsp_utf8_valid(src ? src : "", len)) return dsp_tmpl_fail(0, "template source is not valid UTF-8");
    dsp_tmpl *t = calloc(1, sizeof *t);
    if (!t) return dsp_error(DSP_ERR_NOMEM, "template: out of memory");
    t->lim = lim;
    dsp_arena_init(&t->ar, 64 * 1024, lim.max_memory);
    /* newlines: \r\n and \r read as \n; one trailing newline dropped (keep_trailing_newline=False) */
    char *s = dsp_arena_alloc(&t->ar, len + 1);
    if (!s) {
        dsp_tmpl_destroy(t);
        return dsp_error(DSP_ERR_NOMEM, "template: out of memory");
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = '\0';
    t->src = s;

    token *tk = NULL;
    size_t ntk = 0;
    dsp_status st = dsp_tmpl_lex(s, n, &t->ar, &tk, &ntk);
    if (!st) st = dsp_tmpl_parse(tk, ntk, &t->ar, lim.max_depth, &t->root);
    free(tk);
    if (st) {
        dsp_tmpl_destroy(t);
        return st;
    }
    *out = t;
    return DSP_OK;
}

void dsp_tmpl_destroy(dsp_tmpl *t) {
    if (!t) return;
    dsp_arena_destroy(&t->ar);
    free(t);
}

dsp_status dsp_tmpl_render(const dsp_tmpl *t, const json_t *ctx, const dsp_tmpl_render_opts *opts,
                           char **out, size_t *out_len) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!t) return dsp_error(DSP_ERR_INVALID_ARG, "template: NULL template");
    if (ctx && !json_is_object(ctx)) return dsp_tmpl_fail(0, "template context must be a JSON object");
    dsp_arena ar;
    dsp_arena_init(&ar, 256 * 1024, t->lim.max_memory);
    rt r = {.ar = &ar, .t = t, .opts = opts};
    sb b = sb_new(&r);
    dsp_status st = DSP_OK;
    scope *g = dsp_tmpl_scope_new(&r, NULL);
    scope *top = g ? dsp_tmpl_scope_new(&r, g) : NULL;
    if (!top) st = dsp_tmpl_oom(0);
    static const struct { const char *name; int fn; } builtins[] = {
        {"range", F_RANGE}, {"namespace", F_NAMESPACE}, {"dict", F_DICT},
        {"raise_exception", F_RAISE}, {"strftime_now", F_STRFTIME}};
    for (size_t i = 0; !st && i < sizeof builtins / sizeof builtins[0]; i++) {
        tv f = {.t = V_FUNC, .fn = (uint16_t)builtins[i].fn};
        st = dsp_tmpl_scope_set(&r, g, builtins[i].name, f);
    }
    if (!st && ctx) {
        tv c = {0};
        st = dsp_tmpl_from_json(&r, ctx, &c, 0);
        for (size_t i = 0; !st && i < c.u.d->n; i++) st = dsp_tmpl_dict_set(&r, &g->vars, c.u.d->k[i], c.u.d->v[i]);
    }
    r.globals = g;
    if (!st) st = dsp_tmpl_exec_body(&r, top, t->root->v, t->root->nv, &b);
    dsp_arena_destroy(&ar);
    if (st) {
        sb_free(&b);
        return st;
    }
    if (!b.p) {
        b.p = malloc(1);
        if (!b.p) return dsp_error(DSP_ERR_NOMEM, "template: out of memory");
        b.p[0] = '\0';
    }
    *out = b.p;
    if (out_len) *out_len = b.n;
    return DSP_OK;
}
