/* template/tmpl_filters: jinja2's filters (a table of small functions, one per filter) and
 * tests, with the semantics of jinja2 3.x under transformers' sandboxed environment. See
 * tmpl_internal.h. */
#include "template/tmpl_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>

static const char *const g_tests[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even",
    "false", "filter", "float", "ge", "greaterthan", "gt", "in", "integer", "iterable", "le",
    "lessthan", "lower", "lt", "mapping", "ne", "none", "number", "odd", "sameas", "sequence",
    "string", "test", "true", "undefined", "upper", "==", "!=", "<", "<=", ">", ">=", NULL};

/* attribute getter of map/selectattr/sort/...: "a.b.0" */
static dsp_status attr_path(rt *r, const tv *obj, const tv *path, tv *out) {
    if (path->t == V_INT) return dsp_tmpl_get_item(r, obj, path, out);
    TRY(dsp_tmpl_need_str(r, path, "attribute"));
    tv cur = *obj;
    const char *p = path->u.s.p, *end = p + path->u.s.n;
    for (;;) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        size_t n = dot ? (size_t)(dot - p) : (size_t)(end - p);
        tv key = mk_str(p, n);
        bool digits = n > 0;
        int64_t iv = 0;
        for (size_t i = 0; i < n; i++) {
            if (!is_dig(p[i]) || iv > INT64_MAX / 10 - 10) { digits = false; break; }
            iv = iv * 10 + (p[i] - '0');
        }
        if (digits) key = mk_int(iv);
        TRY(dsp_tmpl_get_item(r, &cur, &key, &cur));
        if (!dot) break;
        p = dot + 1;
    }
    *out = cur;
    return DSP_OK;
}

/* case-folded sort/unique key */
static dsp_status ci_key(rt *r, const tv *v, bool case_sensitive, tv *out) {
    if (!case_sensitive && v->t == V_STR) return dsp_tmpl_str_case(r, v, CASE_LOWER, out);
    *out = *v;
    return DSP_OK;
}

/* stable merge sort of keys[] carrying items[] */
static dsp_status msort(rt *r, tv *keys, tv *items, size_t n, tv *tk, tv *ti, bool rev) {
    if (n < 2) return DSP_OK;
    size_t h = n / 2;
    TRY(msort(r, keys, items, h, tk, ti, rev));
    TRY(msort(r, keys + h, items + h, n - h, tk, ti, rev));
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int c = 0;
        TRY(dsp_tmpl_val_cmp(&keys[j], &keys[i], r->line, "<", &c));
        bool take_right = rev ? c > 0 : c < 0;
        if (take_right) { tk[k] = keys[j]; ti[k++] = items[j++]; }
        else { tk[k] = keys[i]; ti[k++] = items[i++]; }
    }
    while (i < h) { tk[k] = keys[i]; ti[k++] = items[i++]; }
    while (j < n) { tk[k] = keys[j]; ti[k++] = items[j++]; }
    memcpy(keys, tk, n * sizeof(tv));
    memcpy(items, ti, n * sizeof(tv));
    return DSP_OK;
}

static dsp_status filter_length(rt *r, const tv *v, int64_t *n) {
    switch (v->t) {
    case V_UNDEF: *n = 0; return DSP_OK;
    case V_STR: *n = (int64_t)dsp_utf8_count(v->u.s.p, v->u.s.n); return DSP_OK;
    case V_LIST:
        if (v->fl == L_GEN) return dsp_tmpl_fail(r->line, "object of type 'generator' has no len()");
        *n = (int64_t)v->u.l->n;
        return DSP_OK;
    case V_DICT: *n = (int64_t)v->u.d->n; return DSP_OK;
    default: return dsp_tmpl_fail(r->line, "object of type '%s' has no len()", dsp_tmpl_type_name(v));
    }
}

/* select/reject/selectattr/rejectattr */
static dsp_status filter_select(rt *r, const tv *in, args *a, bool attr, bool want, tv *out) {
    tlist *src = NULL;
    if (!dsp_tmpl_truthy(in)) { /* jinja2: `if value:` before iterating */
        src = dsp_tmpl_list_new(r, 0);
        if (!src) return dsp_tmpl_oom(r->line);
        *out = mk_list(src, L_GEN);
        return DSP_OK;
    }
    TRY(dsp_tmpl_iter_list(r, in, &src));
    size_t base = attr ? 1 : 0;
    tv *attrname = attr ? dsp_tmpl_arg(a, 0, NULL) : NULL;
    if (attr && !attrname) return dsp_tmpl_fail(r->line, "selectattr/rejectattr: missing attribute name");
    tv *testname = dsp_tmpl_arg(a, base, NULL);
    char tname[64] = "";
    if (testname) {
        TRY(dsp_tmpl_need_str(r, testname, "select test"));
        snprintf(tname, sizeof tname, "%.*s", (int)testname->u.s.n, testname->u.s.p);
        if (!dsp_tmpl_test_known(tname)) return dsp_tmpl_fail(r->line, "unknown or unsupported test '%s'", tname);
    }
    args ta = {0};
    if (a->npos > base + 1) {
        ta.pos = a->pos + base + 1;
        ta.npos = a->npos - base - 1;
    }
    if (a->nkw) return dsp_tmpl_fail(r->line, "select filters: keyword arguments are not supported");
    tlist *l = dsp_tmpl_list_new(r, 0);
    if (!l) return dsp_tmpl_oom(r->line);
    for (size_t i = 0; i < src->n; i++) {
        TRY(dsp_tmpl_step(r));
        tv x = src->v[i];
        if (attr) TRY(attr_path(r, &src->v[i], attrname, &x));
        bool ok = false;
        if (testname) TRY(dsp_tmpl_apply_test(r, tname, x, &ta, &ok));
        else ok = dsp_tmpl_truthy(&x);
        if (ok == want) TRY(dsp_tmpl_list_push(r, l, src->v[i]));
    }
    *out = mk_list(l, L_GEN);
    return DSP_OK;
}

static dsp_status do_indent(rt *r, const tv *s, const tv *width, bool first, bool blank, tv *out) {
    tv ind = mk_str("    ", 4);
    if (width) {
        if (width->t == V_STR) ind = *width;
        else {
            int64_t w = {0};
            TRY(dsp_tmpl_need_int(r, width, "indent", &w));
            if (w < 0) w = 0;
            if ((uint64_t)w > 4096) return dsp_tmpl_fail(r->line, "indent: width too large");
            char *p = ralloc(r, (size_t)w + 1);
            if (!p) return dsp_tmpl_oom(r->line);
            memset(p, ' ', (size_t)w);
            ind = mk_str(p, (size_t)w);
        }
    }
    /* lines = (s + "\n").splitlines() */
    sb b = sb_new(r);
    dsp_status st = DSP_OK;
    if (first) st = sb_put(&b, ind.u.s.p, ind.u.s.n, r->line);
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, i = 0;
    bool first_line = true;
    /* s + "\n" always ends with a line break, so splitlines gives every line of s, plus a last
     * empty line when s ends with a break */
    while (!st) {
        size_t j = i, lb = 0;
        while (j < n && !(lb = dsp_tmpl_py_linebreak_at(p + j, n - j))) j += dsp_utf8_len((unsigned char)p[j]);
        /* line = p[i:j] ; ends at j (break of length lb) or at the end (the added "\n") */
        if (!first_line) {
            st = sb_putc(&b, '\n', r->line);
            if (!st && (blank || j > i)) st = sb_put(&b, ind.u.s.p, ind.u.s.n, r->line);
        }
        if (!st) st = sb_put(&b, p + i, j - i, r->line);
        first_line = false;
        if (j >= n) break;
        i = j + lb; /* a final break leaves one more (empty) line */
    }
    if (st) {
        sb_free(&b);
        return st;
    }
    return dsp_tmpl_sb_to_str(r, &b, out);
}

/* A filter: `f` is the name it was called by (several names share one function). */
typedef dsp_status (*filter_fn)(rt *r, const char *f, tv in, args *a, tv *out);

static dsp_status f_default(rt *r, const char *f, tv in, args *a, tv *out) {
    tv *def = dsp_tmpl_arg(a, 0, "default_value"), *boolean = dsp_tmpl_arg(a, 1, "boolean");
    TRY(dsp_tmpl_check_args(r, a, 2, f));
    bool use = in.t == V_UNDEF || (boolean && dsp_tmpl_truthy(boolean) && !dsp_tmpl_truthy(&in));
    *out = use ? (def ? *def : mk_str("", 0)) : in;
    return DSP_OK;
}

static dsp_status f_length(rt *r, const char *f, tv in, args *a, tv *out) {
    TRY(dsp_tmpl_check_args(r, a, 0, f));
    int64_t n = {0};
    TRY(filter_length(r, &in, &n));
    *out = mk_int(n);
    return DSP_OK;
}

static dsp_status f_tojson(rt *r, const char *f, tv in, args *a, tv *out) {
    int line = r->line;
    /* HF: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
    tv *ea = dsp_tmpl_arg(a, 0, "ensure_ascii"), *ind = dsp_tmpl_arg(a, 1, "indent");
    tv *seps = dsp_tmpl_arg(a, 2, "separators"), *sk = dsp_tmpl_arg(a, 3, "sort_keys");
    TRY(dsp_tmpl_check_args(r, a, 4, f));
    jopts o = {0};
    o.ensure_ascii = ea && dsp_tmpl_truthy(ea);
    o.sort_keys = sk && dsp_tmpl_truthy(sk);
    if (ind && ind->t != V_NONE) {
        if (ind->t == V_STR) {
            o.indent = ind->u.s.p;
            o.indent_n = ind->u.s.n;
        } else {
            int64_t w = {0};
            TRY(dsp_tmpl_need_int(r, ind, "tojson indent", &w));
            if (w < 0) w = 0;
            if (w > 4096) return dsp_tmpl_fail(line, "tojson: indent too large");
            char *p = ralloc(r, (size_t)w + 1);
            if (!p) return dsp_tmpl_oom(line);
            memset(p, ' ', (size_t)w);
            o.indent = p;
            o.indent_n = (size_t)w;
        }
    }
    o.item_sep = o.indent ? "," : ", ";
    o.item_sep_n = o.indent ? 1 : 2;
    o.key_sep = ": ";
    o.key_sep_n = 2;
    if (seps && seps->t != V_NONE) {
        if (seps->t != V_LIST || seps->u.l->n != 2 || seps->u.l->v[0].t != V_STR ||
            seps->u.l->v[1].t != V_STR)
            return dsp_tmpl_fail(line, "tojson: separators must be a pair of strings");
        o.item_sep = seps->u.l->v[0].u.s.p;
        o.item_sep_n = seps->u.l->v[0].u.s.n;
        o.key_sep = seps->u.l->v[1].u.s.p;
        o.key_sep_n = seps->u.l->v[1].u.s.n;
    }
    sb b = sb_new(r);
    dsp_status st = dsp_tmpl_put_json(r, &b, &in, &o, 0);
    if (st) {
        sb_free(&b);
        return st;
    }
    return dsp_tmpl_sb_to_str(r, &b, out);
}

static dsp_status f_string(rt *r, const char *f, tv in, args *a, tv *out) {
    TRY(dsp_tmpl_check_args(r, a, 0, f));
    return dsp_tmpl_to_str(r, &in, out);
}

static dsp_status f_safe(rt *r, const char *f, tv in, args *a, tv *out) {
    TRY(dsp_tmpl_check_args(r, a, 0, f));
    TRY(dsp_tmpl_to_str(r, &in, out));
    out->fl = 1;
    return DSP_OK;
}

static dsp_status f_escape(rt *r, const char *f, tv in, args *a, tv *out) {
    TRY(dsp_tmpl_check_args(r, a, 0, f));
    if (in.t == V_STR && in.fl) { *out = in; return DSP_OK; }
    tv s = {0};
    TRY(dsp_tmpl_to_str(r, &in, &s));
    return dsp_tmpl_html_escape(r, &s, out);
}

/* The string filters convert their input with str() first, as jinja2's do. */
static dsp_status f_trim(rt *r, const char *f, tv in, args *a, tv *out) {
    tv s = {0};
    TRY(dsp_tmpl_to_str(r, &in, &s));
    tv *chars = dsp_tmpl_arg(a, 0, "chars");
    TRY(dsp_tmpl_check_args(r, a, 1, f));
    return dsp_tmpl_str_strip(r, &s, chars, 3, out);
}

static dsp_status f_replace(rt *r, const char *f, tv in, args *a, tv *out) {
    int line = r->line;
    tv s = {0};
    TRY(dsp_tmpl_to_str(r, &in, &s));
    tv *o = dsp_tmpl_arg(a, 0, "old"), *nw = dsp_tmpl_arg(a, 1, "new"), *c = dsp_tmpl_arg(a, 2, "count");
    TRY(dsp_tmpl_check_args(r, a, 3, f));
    if (!o || !nw) return dsp_tmpl_fail(line, "replace: needs old and new");
    tv os, ns;
    TRY(dsp_tmpl_to_str(r, o, &os));
    TRY(dsp_tmpl_to_str(r, nw, &ns));
    int64_t count = -1;
    if (c && c->t != V_NONE) TRY(dsp_tmpl_need_int(r, c, "replace", &count));
    if (s.fl) return dsp_tmpl_fail(line, "unsupported: replace on a |safe string");
    return dsp_tmpl_str_replace(r, &s, &os, &ns, count, out);
}

static dsp_status f_indent(rt *r, const char *f, tv in, args *a, tv *out) {
    tv s = {0};
    TRY(dsp_tmpl_to_str(r, &in, &s));
    tv *w = dsp_tmpl_arg(a, 0, "width"), *fi = dsp_tmpl_arg(a, 1, "first"), *bl = dsp_tmpl_arg(a, 2, "blank");
    TRY(dsp_tmpl_check_args(r, a, 3, f));
    return do_indent(r, &s, w, fi && dsp_tmpl_truthy(fi), bl && dsp_tmpl_truthy(bl), out);
}

static dsp_status f_wordcount(rt *r, const char *f, tv in, args *a, tv *out) {
    (void)f, (void)a, (void)out;
    tv s = {0};
    TRY(dsp_tmpl_to_str(r, &in, &s));
    return dsp_tmpl_fail(r->line, "unsupported filter 'wordcount'");
}

/* lower, upper, title, capitalize */
static dsp_status f_case(rt *r, const char *f, tv in, args *a, tv *out) {
    tv s = {0};
    TRY(dsp_tmpl_to_str(r, &in, &s));
    TRY(dsp_tmpl_check_args(r, a, 0, f));
    case_mode mode = f[0] == 'l' ? CASE_LOWER : f[0] == 'u' ? CASE_UPPER : f[0] == 't' ? CASE_TITLE_JINJA : CASE_CAPITALIZE;
    return dsp_tmpl_str_case(r, &s, mode, out);
}

static dsp_status f_first_last(rt *r, const char *f, tv in, args *a, tv *out) {
    int line = r->line;
    TRY(dsp_tmpl_check_args(r, a, 0, f));
    if (f[0] == 'l' && in.t == V_LIST && in.fl == L_GEN)
        return dsp_tmpl_fail(line, "'generator' object is not reversible");
    tlist *l = NULL;
    TRY(dsp_tmpl_iter_list(r, &in, &l));
    *out = l->n ? l->v[f[0] == 'f' ? 0 : l->n - 1] : mk_undef(dsp_tmpl_msgf(r, "No %s item, sequence was empty.", f));
    return DSP_OK;
}

static dsp_status f_list(rt *r, const char *f, tv in, args *a, tv *out) {
    TRY(dsp_tmpl_check_args(r, a, 0, f));
    tlist *l = NULL;
    TRY(dsp_tmpl_iter_list(r, &in, &l));
    *out = mk_list(l, L_LIST);
    return DSP_OK;
}

static dsp_status f_join(rt *r, const char *f, tv in, args *a, tv *out) {
    int line = r->line;
    tv *sep = dsp_tmpl_arg(a, 0, "d"), *at = dsp_tmpl_arg(a, 1, "attribute");
    TRY(dsp_tmpl_check_args(r, a, 2, f));
    tlist *l = NULL;
    TRY(dsp_tmpl_iter_list(r, &in, &l));
    tv seps = mk_str("", 0);
    if (sep) TRY(dsp_tmpl_to_str(r, sep, &seps));
    sb b = sb_new(r);
    for (size_t i = 0; i < l->n; i++) {
        tv x = l->v[i];
        dsp_status st = DSP_OK;
        if (at && at->t != V_NONE) st = attr_path(r, &l->v[i], at, &x);
        if (!st && i) st = sb_put(&b, seps.u.s.p, seps.u.s.n, line);
        if (!st) st = dsp_tmpl_put_str(r, &b, &x, 0);
        if (st) {
            sb_free(&b);
            return st;
        }
    }
    return dsp_tmpl_sb_to_str(r, &b, out);
}

static dsp_status f_map(rt *r, const char *f, tv in, args *a, tv *out) {
    (void)f;
    int line = r->line;
    tlist *src = NULL;
    if (dsp_tmpl_truthy(&in)) TRY(dsp_tmpl_iter_list(r, &in, &src)); /* jinja2: `if value:` */
    else if (!(src = dsp_tmpl_list_new(r, 0))) return dsp_tmpl_oom(line);
    tlist *l = dsp_tmpl_list_new(r, src->n);
    if (!l) return dsp_tmpl_oom(line);
    tv *at = NULL, *def = NULL;
    for (size_t i = 0; i < a->nkw; i++) {
        if (!strcmp(a->kwn[i], "attribute")) at = &a->kwv[i];
        else if (!strcmp(a->kwn[i], "default")) def = &a->kwv[i];
    }
    if (at) {
        if (a->npos) return dsp_tmpl_fail(line, "map: attribute= takes no positional arguments");
        for (size_t i = 0; i < src->n; i++) {
            TRY(dsp_tmpl_step(r));
            tv x = {0};
            TRY(attr_path(r, &src->v[i], at, &x));
            if (x.t == V_UNDEF && def) x = *def;
            l->v[l->n++] = x;
        }
    } else {
        if (!a->npos || a->pos[0].t != V_STR) return dsp_tmpl_fail(line, "map: expected a filter name or attribute=");
        char fname[64];
        snprintf(fname, sizeof fname, "%.*s", (int)a->pos[0].u.s.n, a->pos[0].u.s.p);
        if (!dsp_tmpl_filter_known(fname)) return dsp_tmpl_fail(line, "unknown or unsupported filter '%s'", fname);
        args fa = *a;
        fa.pos++;
        fa.npos--;
        for (size_t i = 0; i < src->n; i++) {
            TRY(dsp_tmpl_step(r));
            if (fa.used) memset(fa.used, 0, fa.nkw * sizeof(bool));
            TRY(dsp_tmpl_apply_filter(r, fname, src->v[i], &fa, &l->v[l->n]));
            l->n++;
        }
    }
    *out = mk_list(l, L_GEN);
    return DSP_OK;
}

/* select, reject, selectattr, rejectattr */
static dsp_status f_select(rt *r, const char *f, tv in, args *a, tv *out) {
    bool attr = !strcmp(f, "selectattr") || !strcmp(f, "rejectattr");
    return filter_select(r, &in, a, attr, f[0] == 's', out);
}

static dsp_status f_items(rt *r, const char *f, tv in, args *a, tv *out) {
    int line = r->line;
    TRY(dsp_tmpl_check_args(r, a, 0, f));
    if (in.t == V_UNDEF) {
        tlist *l = dsp_tmpl_list_new(r, 0);
        if (!l) return dsp_tmpl_oom(line);
        *out = mk_list(l, L_GEN);
        return DSP_OK;
    }
    if (in.t != V_DICT) return dsp_tmpl_fail(line, "Can only get item pairs from a mapping.");
    tmeth me = {.self = in, .name = "items"};
    args none = {0};
    TRY(dsp_tmpl_call_method(r, &me, &none, out));
    out->fl = L_GEN;
    return DSP_OK;
}

/* The items of a sort/dictsort/unique/min/max input with their keys (attribute or dict pair
 * member, case-folded unless case_sensitive); unique drops items whose key was seen. */
typedef struct keyed {
    tv *keys, *items; /* (m) */
    size_t m, n;      /* kept, input items */
} keyed;

static dsp_status keyed_items(rt *r, const char *f, tv in, const tv *cs, const tv *at, const tv *by,
                              keyed *o) {
    int line = r->line;
    bool is_dsort = !strcmp(f, "dictsort"), unique = !strcmp(f, "unique");
    bool case_s = cs && dsp_tmpl_truthy(cs);
    tlist *src = NULL;
    if (is_dsort) {
        if (in.t != V_DICT) return dsp_tmpl_fail(line, "dictsort: expected a mapping");
        tmeth me = {.self = in, .name = "items"};
        args none = {0};
        tv items = {0};
        TRY(dsp_tmpl_call_method(r, &me, &none, &items));
        src = items.u.l;
    } else {
        TRY(dsp_tmpl_iter_list(r, &in, &src));
    }
    size_t n = src->n;
    tv *keys = ralloc(r, (n + 1) * sizeof(tv)), *items = ralloc(r, (n + 1) * sizeof(tv));
    if (!keys || !items) return dsp_tmpl_oom(line);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        TRY(dsp_tmpl_step(r));
        tv k = src->v[i];
        if (is_dsort) {
            bool by_value = by && by->t == V_STR && str_eq(by, "value", 5);
            k = k.u.l->v[by_value ? 1 : 0];
        } else if (at && at->t != V_NONE) {
            TRY(attr_path(r, &src->v[i], at, &k));
        }
        TRY(ci_key(r, &k, case_s, &k));
        if (unique) {
            bool seen = false;
            for (size_t j = 0; j < m && !seen; j++) seen = dsp_tmpl_val_eq(&keys[j], &k);
            if (seen) continue;
        }
        keys[m] = k;
        items[m++] = src->v[i];
    }
    o->keys = keys;
    o->items = items;
    o->m = m;
    o->n = n;
    return DSP_OK;
}

static dsp_status keyed_list(rt *r, const keyed *k, int kind, tv *out) {
    tlist *l = dsp_tmpl_list_new(r, 0);
    if (!l) return dsp_tmpl_oom(r->line);
    l->v = k->items;
    l->n = l->cap = k->m;
    *out = mk_list(l, kind);
    return DSP_OK;
}

/* sort and dictsort (their arguments differ in order) */
static dsp_status f_sort(rt *r, const char *f, tv in, args *a, tv *out) {
    tv *rev, *cs, *at = NULL, *by = NULL;
    if (!strcmp(f, "sort")) {
        rev = dsp_tmpl_arg(a, 0, "reverse");
        cs = dsp_tmpl_arg(a, 1, "case_sensitive");
        at = dsp_tmpl_arg(a, 2, "attribute");
    } else {
        cs = dsp_tmpl_arg(a, 0, "case_sensitive");
        by = dsp_tmpl_arg(a, 1, "by");
        rev = dsp_tmpl_arg(a, 2, "reverse");
    }
    TRY(dsp_tmpl_check_args(r, a, 3, f));
    keyed k;
    TRY(keyed_items(r, f, in, cs, at, by, &k));
    tv *tk = ralloc(r, (k.n + 1) * sizeof(tv)), *ti = ralloc(r, (k.n + 1) * sizeof(tv));
    if (!tk || !ti) return dsp_tmpl_oom(r->line);
    TRY(msort(r, k.keys, k.items, k.m, tk, ti, rev && dsp_tmpl_truthy(rev)));
    return keyed_list(r, &k, L_LIST, out);
}

/* unique, min, max */
static dsp_status f_unique(rt *r, const char *f, tv in, args *a, tv *out) {
    tv *cs = dsp_tmpl_arg(a, 0, "case_sensitive"), *at = dsp_tmpl_arg(a, 1, "attribute");
    TRY(dsp_tmpl_check_args(r, a, 3, f));
    keyed k;
    TRY(keyed_items(r, f, in, cs, at, NULL, &k));
    if (!strcmp(f, "unique")) return keyed_list(r, &k, L_GEN, out);
    if (!k.m) {
        *out = mk_undef("No aggregated item, sequence was empty.");
        return DSP_OK;
    }
    size_t best = 0;
    for (size_t i = 1; i < k.m; i++) {
        int c = 0;
        TRY(dsp_tmpl_val_cmp(&k.keys[i], &k.keys[best], r->line, "<", &c));
        if (f[1] == 'i' ? c < 0 : c > 0) best = i;
    }
    *out = k.items[best];
    return DSP_OK;
}

static dsp_status f_reverse(rt *r, const char *f, tv in, args *a, tv *out) {
    int line = r->line;
    TRY(dsp_tmpl_check_args(r, a, 0, f));
    if (in.t == V_STR) {
        tv neg1 = mk_int(-1);
        return dsp_tmpl_get_slice(r, &in, NULL, NULL, &neg1, out);
    }
    /* reversed(value), or for generators list(value) reversed */
    bool gen = in.t == V_LIST && in.fl == L_GEN;
    tlist *src = NULL;
    TRY(dsp_tmpl_iter_list(r, &in, &src));
    tlist *l = dsp_tmpl_list_new(r, src->n);
    if (!l) return dsp_tmpl_oom(line);
    for (size_t i = 0; i < src->n; i++) l->v[l->n++] = src->v[src->n - 1 - i];
    *out = mk_list(l, gen ? L_LIST : L_GEN);
    return DSP_OK;
}

static dsp_status f_int_float(rt *r, const char *f, tv in, args *a, tv *out) {
    int line = r->line;
    bool is_int = f[0] == 'i';
    tv *def = dsp_tmpl_arg(a, 0, "default"), *base = is_int ? dsp_tmpl_arg(a, 1, "base") : NULL;
    TRY(dsp_tmpl_check_args(r, a, is_int ? 2 : 1, f));
    if (base && !(is_intlike(base) && num_i(base) == 10)) return dsp_tmpl_fail(line, "int: only base 10 is supported");
    tv d = def ? *def : is_int ? mk_int(0) : mk_float(0.0);
    if (in.t == V_INT || in.t == V_BOOL) *out = is_int ? mk_int(num_i(&in)) : mk_float(num_f(&in));
    else if (in.t == V_FLOAT) {
        if (is_int && (isnan(in.u.f) || fabs(in.u.f) >= 9.2e18)) *out = d;
        else *out = is_int ? mk_int((int64_t)in.u.f) : in;
    } else if (in.t == V_STR) {
        char buf[64];
        size_t b0 = dsp_tmpl_py_lstrip_off(in.u.s.p, in.u.s.n), e0 = dsp_tmpl_py_rstrip_len(in.u.s.p, in.u.s.n);
        if (e0 <= b0 || e0 - b0 >= sizeof buf) { *out = d; return DSP_OK; }
        size_t k = 0;
        for (size_t i = b0; i < e0; i++)
            if (in.u.s.p[i] != '_') buf[k++] = in.u.s.p[i];
        buf[k] = '\0';
        char *endp;
        errno = 0;
        long long iv = strtoll(buf, &endp, 10);
        if (*endp == '\0' && !errno && k) {
            *out = is_int ? mk_int(iv) : mk_float((double)iv);
            return DSP_OK;
        }
        double fv = strtod(buf, &endp);
        if (*endp == '\0' && k && !strchr(buf, 'x') && !strchr(buf, 'X')) {
            if (is_int && (isnan(fv) || fabs(fv) >= 9.2e18)) *out = d;
            else *out = is_int ? mk_int((int64_t)fv) : mk_float(fv);
        } else {
            *out = d;
        }
    } else {
        *out = d;
    }
    return DSP_OK;
}

static dsp_status f_abs(rt *r, const char *f, tv in, args *a, tv *out) {
    int line = r->line;
    TRY(dsp_tmpl_check_args(r, a, 0, f));
    if (in.t == V_FLOAT) *out = mk_float(fabs(in.u.f));
    else if (is_intlike(&in)) {
        if (num_i(&in) == INT64_MIN) return dsp_tmpl_int_overflow(r);
        *out = mk_int(llabs(num_i(&in)));
    } else return dsp_tmpl_fail(line, "bad operand type for abs(): '%s'", dsp_tmpl_type_name(&in));
    return DSP_OK;
}

static dsp_status f_round(rt *r, const char *f, tv in, args *a, tv *out) {
    int line = r->line;
    tv *pr = dsp_tmpl_arg(a, 0, "precision"), *me = dsp_tmpl_arg(a, 1, "method");
    TRY(dsp_tmpl_check_args(r, a, 2, f));
    int64_t p = 0;
    if (pr) TRY(dsp_tmpl_need_int(r, pr, "round", &p));
    if (!is_num(&in)) return dsp_tmpl_fail(line, "round: expected a number");
    if (p < 0 || p > 15) return dsp_tmpl_fail(line, "round: precision out of supported range");
    double x = num_f(&in), sc10 = pow(10, (double)p), y;
    const char *method = "common";
    char mb[16];
    if (me) {
        TRY(dsp_tmpl_need_str(r, me, "round"));
        snprintf(mb, sizeof mb, "%.*s", (int)me->u.s.n, me->u.s.p);
        method = mb;
    }
    if (!strcmp(method, "ceil")) y = ceil(x * sc10) / sc10;
    else if (!strcmp(method, "floor")) y = floor(x * sc10) / sc10;
    else if (!strcmp(method, "common")) {
        if (p != 0) return dsp_tmpl_fail(line, "round: only precision 0 is supported with method 'common'");
        y = nearbyint(x); /* round-half-even, as Python's round() */
    } else return dsp_tmpl_fail(line, "round: method must be common, ceil or floor");
    *out = mk_float(y);
    return DSP_OK;
}

static dsp_status f_sum(rt *r, const char *f, tv in, args *a, tv *out) {
    tv *at = dsp_tmpl_arg(a, 0, "attribute"), *start = dsp_tmpl_arg(a, 1, "start");
    TRY(dsp_tmpl_check_args(r, a, 2, f));
    tlist *src = NULL;
    TRY(dsp_tmpl_iter_list(r, &in, &src));
    tv acc = start ? *start : mk_int(0);
    for (size_t i = 0; i < src->n; i++) {
        tv x = src->v[i];
        if (at && at->t != V_NONE) TRY(attr_path(r, &src->v[i], at, &x));
        TRY(dsp_tmpl_binop(r, OP_ADD, acc, x, &acc));
    }
    *out = acc;
    return DSP_OK;
}

static dsp_status f_attr(rt *r, const char *f, tv in, args *a, tv *out) {
    int line = r->line;
    tv *nm = dsp_tmpl_arg(a, 0, "name");
    TRY(dsp_tmpl_check_args(r, a, 1, f));
    TRY(dsp_tmpl_need_str(r, nm, "attr"));
    char *name = dsp_arena_strndup(r->ar, nm->u.s.p, nm->u.s.n);
    if (!name) return dsp_tmpl_oom(line);
    return dsp_tmpl_get_attr(r, &in, name, out);
}

static const struct {
    const char *name;
    filter_fn fn;
} g_filters[] = {
    {"abs", f_abs},
    {"attr", f_attr},
    {"capitalize", f_case},
    {"count", f_length},
    {"d", f_default},
    {"default", f_default},
    {"dictsort", f_sort},
    {"e", f_escape},
    {"escape", f_escape},
    {"first", f_first_last},
    {"float", f_int_float},
    {"indent", f_indent},
    {"int", f_int_float},
    {"items", f_items},
    {"join", f_join},
    {"last", f_first_last},
    {"length", f_length},
    {"list", f_list},
    {"lower", f_case},
    {"map", f_map},
    {"max", f_unique},
    {"min", f_unique},
    {"reject", f_select},
    {"rejectattr", f_select},
    {"replace", f_replace},
    {"reverse", f_reverse},
    {"round", f_round},
    {"safe", f_safe},
    {"select", f_select},
    {"selectattr", f_select},
    {"sort", f_sort},
    {"string", f_string},
    {"sum", f_sum},
    {"title", f_case},
    {"tojson", f_tojson},
    {"trim", f_trim},
    {"unique", f_unique},
    {"upper", f_case},
    {"wordcount", f_wordcount},
};


static filter_fn find_filter(const char *name) {
    for (size_t i = 0; i < sizeof g_filters / sizeof g_filters[0]; i++)
        if (!strcmp(g_filters[i].name, name)) return g_filters[i].fn;
    return NULL;
}

bool dsp_tmpl_filter_known(const char *name) { return find_filter(name) != NULL; }
bool dsp_tmpl_test_known(const char *name) { return in_list(g_tests, name); }

dsp_status dsp_tmpl_apply_filter(rt *r, const char *name, tv in, args *a, tv *out) {
    filter_fn fn = find_filter(name);
    if (!fn) return dsp_tmpl_fail(r->line, "unsupported filter '%s'", name);
    return fn(r, name, in, a, out);
}


dsp_status dsp_tmpl_apply_test(rt *r, const char *t, tv v, args *a, bool *res) {
    int line = r->line;
    tv *x = dsp_tmpl_arg(a, 0, NULL);
    if (!strcmp(t, "defined")) *res = v.t != V_UNDEF;
    else if (!strcmp(t, "undefined")) *res = v.t == V_UNDEF;
    else if (!strcmp(t, "none")) *res = v.t == V_NONE;
    else if (!strcmp(t, "boolean")) *res = v.t == V_BOOL;
    else if (!strcmp(t, "true")) *res = v.t == V_BOOL && v.u.b;
    else if (!strcmp(t, "false")) *res = v.t == V_BOOL && !v.u.b;
    else if (!strcmp(t, "integer")) *res = v.t == V_INT;
    else if (!strcmp(t, "float")) *res = v.t == V_FLOAT;
    else if (!strcmp(t, "number")) *res = is_num(&v);
    else if (!strcmp(t, "string")) *res = v.t == V_STR;
    else if (!strcmp(t, "mapping")) *res = v.t == V_DICT;
    else if (!strcmp(t, "iterable")) *res = v.t == V_STR || v.t == V_LIST || v.t == V_DICT || v.t == V_UNDEF;
    else if (!strcmp(t, "sequence"))
        *res = v.t == V_STR || v.t == V_DICT || v.t == V_UNDEF || (v.t == V_LIST && v.fl != L_GEN && v.fl != L_VIEW);
    else if (!strcmp(t, "callable")) *res = v.t == V_MACRO || v.t == V_FUNC || v.t == V_METHOD;
    else if (!strcmp(t, "escaped")) *res = v.t == V_STR && v.fl;
    else if (!strcmp(t, "odd") || !strcmp(t, "even")) {
        if (v.t == V_UNDEF) return dsp_tmpl_undef_err(&v, line);
        if (!is_intlike(&v)) return dsp_tmpl_fail(line, "test '%s' needs an integer", t);
        *res = (num_i(&v) & 1) == (t[0] == 'o');
    } else if (!strcmp(t, "divisibleby")) {
        int64_t d = {0};
        TRY(dsp_tmpl_need_int(r, x, "divisibleby", &d));
        if (!is_intlike(&v)) return dsp_tmpl_fail(line, "test 'divisibleby' needs an integer");
        if (d == 0) return dsp_tmpl_fail(line, "integer division or modulo by zero");
        *res = (d == -1) || num_i(&v) % d == 0;
    } else if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        tv s = {0};
        TRY(dsp_tmpl_to_str(r, &v, &s));
        args none = {0};
        tv o = {0};
        TRY(dsp_tmpl_str_method(r, &s, t[0] == 'l' ? "islower" : "isupper", &none, &o));
        *res = o.u.b;
    } else if (!strcmp(t, "filter") || !strcmp(t, "test")) {
        char nm[64] = "";
        if (v.t == V_STR) snprintf(nm, sizeof nm, "%.*s", (int)v.u.s.n, v.u.s.p);
        *res = v.t == V_STR && (t[0] == 'f' ? dsp_tmpl_filter_known(nm) : dsp_tmpl_test_known(nm));
    } else {
        if (!x) return dsp_tmpl_fail(line, "test '%s' needs an argument", t);
        if (!strcmp(t, "eq") || !strcmp(t, "equalto") || !strcmp(t, "==")) *res = dsp_tmpl_val_eq(&v, x);
        else if (!strcmp(t, "ne") || !strcmp(t, "!=")) *res = !dsp_tmpl_val_eq(&v, x);
        else if (!strcmp(t, "sameas")) {
            bool scalar = v.t == V_NONE || v.t == V_BOOL || v.t == V_UNDEF;
            *res = v.t == x->t && (scalar ? dsp_tmpl_val_eq(&v, x) : !memcmp(&v.u, &x->u, sizeof v.u));
        } else if (!strcmp(t, "in")) TRY(dsp_tmpl_contains(r, x, &v, res));
        else {
            int c = 0;
            TRY(dsp_tmpl_val_cmp(&v, x, line, t, &c));
            if (!strcmp(t, "lt") || !strcmp(t, "lessthan") || !strcmp(t, "<")) *res = c < 0;
            else if (!strcmp(t, "le") || !strcmp(t, "<=")) *res = c <= 0;
            else if (!strcmp(t, "gt") || !strcmp(t, "greaterthan") || !strcmp(t, ">")) *res = c > 0;
            else if (!strcmp(t, "ge") || !strcmp(t, ">=")) *res = c >= 0;
            else return dsp_tmpl_fail(line, "unsupported test '%s'", t);
        }
    }
    return DSP_OK;
}
