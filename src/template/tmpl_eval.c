/* template/tmpl_eval: rendering a tree: expressions, statements, attribute and item access,
 * operators, calls (macros, builtins, methods). See tmpl_internal.h. */
#include "template/tmpl_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <time.h>

static dsp_status eval(rt *r, scope *sc, node *e, tv *out);

dsp_status dsp_tmpl_step(rt *r) {
    if (++r->steps > r->t->lim.max_steps)
        return dsp_tmpl_fail(r->line, "template ran more than %" PRIu64 " steps (dsp_tmpl_limits.max_steps)",
                    r->t->lim.max_steps);
    return DSP_OK;
}

static tv *scope_lookup(scope *s, const char *name) {
    size_t n = strlen(name);
    for (; s; s = s->parent) {
        tv *v = dsp_tmpl_dict_find_s(&s->vars, name, n);
        if (v) return v;
    }
    return NULL;
}
dsp_status dsp_tmpl_scope_set(rt *r, scope *s, const char *name, tv v) {
    return dsp_tmpl_dict_set(r, &s->vars, mk_str(name, strlen(name)), v);
}
scope *dsp_tmpl_scope_new(rt *r, scope *parent) {
    scope *s = ralloc(r, sizeof *s);
    if (s) s->parent = parent;
    return s;
}

static dsp_status eval_args(rt *r, scope *sc, node *call, args *a) {
    memset(a, 0, sizeof *a);
    if (call->nv) {
        a->pos = ralloc(r, call->nv * sizeof(tv));
        if (!a->pos) return dsp_tmpl_oom(call->line);
        for (size_t i = 0; i < call->nv; i++) TRY(eval(r, sc, call->v[i], &a->pos[i]));
        a->npos = call->nv;
    }
    if (call->nv2) {
        a->kwv = ralloc(r, call->nv2 * sizeof(tv));
        a->used = ralloc(r, call->nv2 * sizeof(bool));
        if (!a->kwv || !a->used) return dsp_tmpl_oom(call->line);
        for (size_t i = 0; i < call->nv2; i++) TRY(eval(r, sc, call->v2[i], &a->kwv[i]));
        a->kwn = call->kw;
        a->nkw = call->nv2;
    }
    return DSP_OK;
}

/* argument `pos`-th positional or keyword `kw`; NULL if absent */
tv *dsp_tmpl_arg(args *a, size_t pos, const char *kw) {
    if (pos < a->npos) return &a->pos[pos];
    for (size_t i = 0; i < a->nkw; i++)
        if (kw && !strcmp(a->kwn[i], kw)) {
            a->used[i] = true;
            return &a->kwv[i];
        }
    return NULL;
}
dsp_status dsp_tmpl_check_args(rt *r, args *a, size_t max_pos, const char *what) {
    if (a->npos > max_pos)
        return dsp_tmpl_fail(r->line, "%s takes at most %zu positional argument(s), %zu given", what,
                    max_pos, a->npos);
    for (size_t i = 0; i < a->nkw; i++)
        if (!a->used[i]) return dsp_tmpl_fail(r->line, "%s got an unexpected keyword argument '%s'", what, a->kwn[i]);
    return DSP_OK;
}

static const char *const STR_METHODS[] = {
    "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find",
    "format", "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit",
    "isidentifier", "islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper",
    "join", "ljust", "lower", "lstrip", "maketrans", "partition", "removeprefix",
    "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit", "rstrip",
    "split", "splitlines", "startswith", "strip", "swapcase", "title", "translate", "upper",
    "zfill", NULL};
static const char *const DICT_METHODS[] = {"copy", "fromkeys", "get", "items", "keys", "values", NULL};
static const char *const DICT_MUTATORS[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};
static const char *const LIST_METHODS[] = {"copy", "count", "index", NULL};
static const char *const LIST_MUTATORS[] = {"append", "clear", "extend", "insert", "pop", "remove",
                                            "reverse", "sort", NULL};

static dsp_status mk_method(rt *r, tv self, const char *name, tv *out) {
    tmeth *m = ralloc(r, sizeof *m);
    if (!m) return dsp_tmpl_oom(r->line);
    m->self = self;
    m->name = name;
    out->t = V_METHOD;
    out->fl = 0;
    out->u.me = m;
    return DSP_OK;
}

static dsp_status loop_attr(rt *r, tloop *lp, const char *name, tv *out) {
    int64_t n = (int64_t)lp->items->n, i = (int64_t)lp->index0;
    if (!strcmp(name, "index")) *out = mk_int(i + 1);
    else if (!strcmp(name, "index0")) *out = mk_int(i);
    else if (!strcmp(name, "revindex")) *out = mk_int(n - i);
    else if (!strcmp(name, "revindex0")) *out = mk_int(n - i - 1);
    else if (!strcmp(name, "first")) *out = mk_bool(i == 0);
    else if (!strcmp(name, "last")) *out = mk_bool(i == n - 1);
    else if (!strcmp(name, "length")) *out = mk_int(n);
    else if (!strcmp(name, "depth")) *out = mk_int(1);
    else if (!strcmp(name, "depth0")) *out = mk_int(0);
    else if (!strcmp(name, "previtem"))
        *out = i > 0 ? lp->items->v[i - 1] : mk_undef("there is no previous item");
    else if (!strcmp(name, "nextitem"))
        *out = i + 1 < n ? lp->items->v[i + 1] : mk_undef("there is no next item");
    else if (!strcmp(name, "cycle") || !strcmp(name, "changed")) {
        tv self = {.t = V_LOOP};
        self.u.lp = lp;
        return mk_method(r, self, name, out);
    } else
        *out = mk_undef(dsp_tmpl_msgf(r, "'LoopContext object' has no attribute '%s'", name));
    return DSP_OK;
}

/* jinja2's sandboxed getattr(obj, name) */
dsp_status dsp_tmpl_get_attr(rt *r, const tv *obj, const char *name, tv *out) {
    if (obj->t == V_UNDEF) return dsp_tmpl_undef_err(obj, r->line);
    if (name[0] == '_') {
        *out = mk_undef(dsp_tmpl_msgf(r, "access to attribute '%s' of '%s' object is unsafe", name, dsp_tmpl_type_name(obj)));
        return DSP_OK;
    }
    switch (obj->t) {
    case V_DICT:
        if (in_list(DICT_METHODS, name)) return mk_method(r, *obj, name, out);
        if (in_list(DICT_MUTATORS, name)) break;
        {
            tv *v = dsp_tmpl_dict_find_s(obj->u.d, name, strlen(name));
            if (v) {
                *out = *v;
                return DSP_OK;
            }
        }
        *out = mk_undef(dsp_tmpl_msgf(r, "'dict object' has no attribute '%s'", name));
        return DSP_OK;
    case V_NS: {
        tv *v = dsp_tmpl_dict_find_s(obj->u.d, name, strlen(name));
        *out = v ? *v : mk_undef(dsp_tmpl_msgf(r, "'Namespace object' has no attribute '%s'", name));
        return DSP_OK;
    }
    case V_STR:
        if (in_list(STR_METHODS, name)) return mk_method(r, *obj, name, out);
        break;
    case V_LIST:
        if (obj->fl == L_LIST || obj->fl == L_TUPLE) {
            if (in_list(LIST_METHODS, name)) return mk_method(r, *obj, name, out);
            if (obj->fl == L_LIST && in_list(LIST_MUTATORS, name)) break;
        }
        break;
    case V_LOOP: return loop_attr(r, obj->u.lp, name, out);
    case V_INT: case V_FLOAT: case V_BOOL: {
        static const char *const num_attrs[] = {"real", "imag", "numerator", "denominator",
                                                "conjugate", "bit_length", "bit_count",
                                                "is_integer", "hex", "as_integer_ratio",
                                                "to_bytes", NULL};
        if (in_list(num_attrs, name))
            return dsp_tmpl_fail(r->line, "unsupported: attribute '%s' of a number", name);
        break;
    }
    default: break;
    }
    if ((obj->t == V_DICT && in_list(DICT_MUTATORS, name)) ||
        (obj->t == V_LIST && obj->fl == L_LIST && in_list(LIST_MUTATORS, name))) {
        *out = mk_undef(dsp_tmpl_msgf(r, "access to attribute '%s' of '%s' object is unsafe.", name, dsp_tmpl_type_name(obj)));
        return DSP_OK;
    }
    *out = mk_undef(dsp_tmpl_msgf(r, "'%s object' has no attribute '%s'", dsp_tmpl_type_name(obj), name));
    return DSP_OK;
}

/* byte offset of code point index ci in s (ci in [0, count]) */
static size_t u8_offset(const char *s, size_t n, size_t ci) {
    size_t i = 0;
    while (ci > 0 && i < n) {
        i += dsp_utf8_len((unsigned char)s[i]);
        ci--;
    }
    return i > n ? n : i;
}

/* jinja2's getitem(obj, key) */
dsp_status dsp_tmpl_get_item(rt *r, const tv *obj, const tv *key, tv *out) {
    if (obj->t == V_UNDEF) return dsp_tmpl_undef_err(obj, r->line);
    if (obj->t == V_DICT) {
        tv *v = dsp_tmpl_dict_find(obj->u.d, key);
        if (v) {
            *out = *v;
            return DSP_OK;
        }
    } else if (obj->t == V_LIST && obj->fl != L_GEN && obj->fl != L_VIEW && is_intlike(key)) {
        int64_t i = num_i(key), n = (int64_t)obj->u.l->n;
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
            *out = obj->u.l->v[i];
            return DSP_OK;
        }
        *out = mk_undef(dsp_tmpl_msgf(r, "%s object has no element %" PRId64, dsp_tmpl_type_name(obj), num_i(key)));
        return DSP_OK;
    } else if (obj->t == V_STR && is_intlike(key)) {
        int64_t i = num_i(key), n = (int64_t)dsp_utf8_count(obj->u.s.p, obj->u.s.n);
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
            size_t off = u8_offset(obj->u.s.p, obj->u.s.n, (size_t)i);
            *out = mk_str(obj->u.s.p + off, dsp_utf8_len((unsigned char)obj->u.s.p[off]));
            return DSP_OK;
        }
        *out = mk_undef("string index out of range");
        return DSP_OK;
    }
    if (key->t == V_STR) {
        char *name = dsp_arena_strndup(r->ar, key->u.s.p, key->u.s.n);
        if (!name) return dsp_tmpl_oom(r->line);
        if (obj->t == V_DICT) {
            if (in_list(DICT_METHODS, name)) return mk_method(r, *obj, name, out);
            *out = mk_undef(dsp_tmpl_msgf(r, "'dict object' has no attribute '%s'", name));
            return DSP_OK;
        }
        return dsp_tmpl_get_attr(r, obj, name, out);
    }
    *out = mk_undef(dsp_tmpl_msgf(r, "'%s object' has no element", dsp_tmpl_type_name(obj)));
    return DSP_OK;
}

typedef struct slice_ix {
    int64_t start, step, count;
} slice_ix;

static dsp_status slice_indices(rt *r, int64_t len, const tv *a, const tv *b, const tv *c,
                                slice_ix *o, bool *ok) {
    *ok = true;
    int64_t step = 1;
    const tv *parts[3] = {a, b, c};
    for (int i = 0; i < 3; i++)
        if (parts[i] && parts[i]->t != V_NONE && !is_intlike(parts[i])) {
            *ok = false;
            return DSP_OK;
        }
    if (c && c->t != V_NONE) step = num_i(c);
    if (step == 0) return dsp_tmpl_fail(r->line, "slice step cannot be zero");
    if (step == INT64_MIN) step = -INT64_MAX;
    int64_t start, stop;
    if (!a || a->t == V_NONE) start = step < 0 ? len - 1 : 0;
    else {
        start = num_i(a);
        if (start < 0) {
            start += len;
            if (start < 0) start = step < 0 ? -1 : 0;
        } else if (start >= len) start = step < 0 ? len - 1 : len;
    }
    if (!b || b->t == V_NONE) stop = step < 0 ? -1 : len;
    else {
        stop = num_i(b);
        if (stop < 0) {
            stop += len;
            if (stop < 0) stop = step < 0 ? -1 : 0;
        } else if (stop >= len) stop = step < 0 ? len - 1 : len;
    }
    int64_t count = 0;
    if (step > 0 && stop > start) count = (stop - start - 1) / step + 1;
    if (step < 0 && start > stop) count = (start - stop - 1) / (-step) + 1;
    o->start = start;
    o->step = step;
    o->count = count;
    return DSP_OK;
}

dsp_status dsp_tmpl_get_slice(rt *r, const tv *obj, const tv *a, const tv *b, const tv *c, tv *out) {
    if (obj->t == V_UNDEF) return dsp_tmpl_undef_err(obj, r->line);
    slice_ix ix;
    bool ok = false;
    if (obj->t == V_LIST && obj->fl != L_GEN && obj->fl != L_VIEW) {
        TRY(slice_indices(r, (int64_t)obj->u.l->n, a, b, c, &ix, &ok));
        if (ok) {
            tlist *l = dsp_tmpl_list_new(r, (size_t)ix.count);
            if (!l) return dsp_tmpl_oom(r->line);
            for (int64_t i = 0; i < ix.count; i++) l->v[l->n++] = obj->u.l->v[ix.start + i * ix.step];
            *out = mk_list(l, obj->fl == L_TUPLE ? L_TUPLE : L_LIST);
            return DSP_OK;
        }
    } else if (obj->t == V_STR) {
        size_t n = dsp_utf8_count(obj->u.s.p, obj->u.s.n);
        TRY(slice_indices(r, (int64_t)n, a, b, c, &ix, &ok));
        if (ok) {
            if (n == obj->u.s.n) { /* ASCII fast path */
                if (ix.step == 1) {
                    *out = mk_str(obj->u.s.p + ix.start, (size_t)ix.count);
                    return DSP_OK;
                }
                char *p = ralloc(r, (size_t)ix.count + 1);
                if (!p) return dsp_tmpl_oom(r->line);
                for (int64_t i = 0; i < ix.count; i++) p[i] = obj->u.s.p[ix.start + i * ix.step];
                *out = mk_str(p, (size_t)ix.count);
                return DSP_OK;
            }
            size_t *offs = ralloc(r, (n + 1) * sizeof *offs);
            char *p = ralloc(r, obj->u.s.n + 1);
            if (!offs || !p) return dsp_tmpl_oom(r->line);
            for (size_t i = 0, k = 0; i <= obj->u.s.n && k <= n; k++) {
                offs[k] = i;
                if (i < obj->u.s.n) i += dsp_utf8_len((unsigned char)obj->u.s.p[i]);
                else break;
            }
            offs[n] = obj->u.s.n;
            size_t len = 0;
            for (int64_t i = 0; i < ix.count; i++) {
                int64_t ci = ix.start + i * ix.step;
                size_t o0 = offs[ci], o1 = offs[ci + 1];
                memcpy(p + len, obj->u.s.p + o0, o1 - o0);
                len += o1 - o0;
            }
            *out = mk_str(p, len);
            return DSP_OK;
        }
    }
    *out = mk_undef("object is not sliceable");
    return DSP_OK;
}

static double py_fmod(double a, double b) {
    double m = fmod(a, b);
    if (m != 0 && ((m < 0) != (b < 0))) m += b;
    return m;
}

dsp_status dsp_tmpl_binop(rt *r, int op, tv a, tv b, tv *out) {
    int line = r->line;
    if (a.t == V_UNDEF) return dsp_tmpl_undef_err(&a, line);
    if (b.t == V_UNDEF) return dsp_tmpl_undef_err(&b, line);
    if (is_num(&a) && is_num(&b)) {
        bool fl = a.t == V_FLOAT || b.t == V_FLOAT;
        if (op == OP_DIV) {
            double y = num_f(&b);
            if (y == 0) return dsp_tmpl_fail(line, "division by zero");
            *out = mk_float(num_f(&a) / y);
            return DSP_OK;
        }
        if (fl) {
            double x = num_f(&a), y = num_f(&b), z;
            switch (op) {
            case OP_ADD: z = x + y; break;
            case OP_SUB: z = x - y; break;
            case OP_MUL: z = x * y; break;
            case OP_FLOORDIV:
                if (y == 0) return dsp_tmpl_fail(line, "float floor division by zero");
                z = floor(x / y); /* close to Python's divmod-based result */
                break;
            case OP_MOD:
                if (y == 0) return dsp_tmpl_fail(line, "float modulo");
                z = py_fmod(x, y);
                break;
            case OP_POW: z = pow(x, y); break;
            default: return dsp_tmpl_fail(line, "bad operator");
            }
            *out = mk_float(z);
            return DSP_OK;
        }
        int64_t x = num_i(&a), y = num_i(&b), z;
        switch (op) {
        case OP_ADD: if (__builtin_add_overflow(x, y, &z)) return dsp_tmpl_int_overflow(r); break;
        case OP_SUB: if (__builtin_sub_overflow(x, y, &z)) return dsp_tmpl_int_overflow(r); break;
        case OP_MUL: if (__builtin_mul_overflow(x, y, &z)) return dsp_tmpl_int_overflow(r); break;
        case OP_FLOORDIV:
        case OP_MOD: {
            if (y == 0) return dsp_tmpl_fail(line, op == OP_MOD ? "integer modulo by zero" : "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) return dsp_tmpl_int_overflow(r);
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q--;
                m += y;
            }
            z = op == OP_MOD ? m : q;
            break;
        }
        case OP_POW: {
            if (y < 0) {
                *out = mk_float(pow((double)x, (double)y));
                return DSP_OK;
            }
            z = 1;
            for (int64_t k = 0; k < y; k++) {
                if (__builtin_mul_overflow(z, x, &z)) return dsp_tmpl_int_overflow(r);
                if (z == 0 || z == 1) break;
                if (z == -1) {
                    z = ((y - k - 1) % 2) ? -z : z;
                    break;
                }
            }
            break;
        }
        default: return dsp_tmpl_fail(line, "bad operator");
        }
        *out = mk_int(z);
        return DSP_OK;
    }
    if (op == OP_ADD && a.t == V_STR && b.t == V_STR) {
        if (a.fl && !b.fl) TRY(dsp_tmpl_html_escape(r, &b, &b));
        else if (b.fl && !a.fl) TRY(dsp_tmpl_html_escape(r, &a, &a));
        TRY(dsp_tmpl_new_str(r, a.u.s.p, a.u.s.n, b.u.s.p, b.u.s.n, out));
        out->fl = a.fl || b.fl;
        return DSP_OK;
    }
    if (op == OP_ADD && a.t == V_LIST && b.t == V_LIST && a.fl == b.fl &&
        (a.fl == L_LIST || a.fl == L_TUPLE)) {
        tlist *l = dsp_tmpl_list_new(r, a.u.l->n + b.u.l->n);
        if (!l) return dsp_tmpl_oom(line);
        for (size_t i = 0; i < a.u.l->n; i++) l->v[l->n++] = a.u.l->v[i];
        for (size_t i = 0; i < b.u.l->n; i++) l->v[l->n++] = b.u.l->v[i];
        *out = mk_list(l, a.fl);
        return DSP_OK;
    }
    if (op == OP_MUL && ((a.t == V_STR && is_intlike(&b)) || (b.t == V_STR && is_intlike(&a)))) {
        tv s = a.t == V_STR ? a : b;
        int64_t k = a.t == V_STR ? num_i(&b) : num_i(&a);
        if (k <= 0) {
            *out = mk_str("", 0);
            return DSP_OK;
        }
        if ((uint64_t)k > r->t->lim.max_output / (s.u.s.n ? s.u.s.n : 1))
            return dsp_tmpl_fail(line, "string longer than %zu bytes (dsp_tmpl_limits.max_output)", r->t->lim.max_output);
        size_t n = s.u.s.n * (size_t)k;
        char *p = ralloc(r, n + 1);
        if (!p) return dsp_tmpl_oom(line);
        for (int64_t i = 0; i < k; i++) memcpy(p + (size_t)i * s.u.s.n, s.u.s.p, s.u.s.n);
        *out = mk_str(p, n);
        return DSP_OK;
    }
    if (op == OP_MUL && ((a.t == V_LIST && is_intlike(&b)) || (b.t == V_LIST && is_intlike(&a)))) {
        tv l0 = a.t == V_LIST ? a : b;
        int64_t k = a.t == V_LIST ? num_i(&b) : num_i(&a);
        if (l0.fl != L_LIST && l0.fl != L_TUPLE) goto bad;
        if (k < 0) k = 0;
        if (l0.u.l->n && (uint64_t)k > (r->t->lim.max_memory / sizeof(tv)) / l0.u.l->n) return dsp_tmpl_oom(line);
        tlist *l = dsp_tmpl_list_new(r, l0.u.l->n * (size_t)k);
        if (!l) return dsp_tmpl_oom(line);
        for (int64_t i = 0; i < k; i++)
            for (size_t j = 0; j < l0.u.l->n; j++) l->v[l->n++] = l0.u.l->v[j];
        *out = mk_list(l, l0.fl);
        return DSP_OK;
    }
    if (op == OP_MOD && a.t == V_STR)
        return dsp_tmpl_fail(line, "unsupported: printf-style string formatting ('%%' on a string)");
bad:
    return dsp_tmpl_fail(line, "unsupported operand type(s) for %s: '%s' and '%s'", dsp_tmpl_op_text(op),
                dsp_tmpl_type_name(&a), dsp_tmpl_type_name(&b));
}

dsp_status dsp_tmpl_contains(rt *r, const tv *hay, const tv *needle, bool *res) {
    int line = r->line;
    switch (hay->t) {
    case V_STR:
        if (needle->t != V_STR)
            return dsp_tmpl_fail(line, "'in <string>' requires string as left operand, not %s", dsp_tmpl_type_name(needle));
        if (!needle->u.s.n) { *res = true; return DSP_OK; }
        *res = false;
        if (needle->u.s.n <= hay->u.s.n)
            for (size_t i = 0; i + needle->u.s.n <= hay->u.s.n; i++)
                if (!memcmp(hay->u.s.p + i, needle->u.s.p, needle->u.s.n)) { *res = true; break; }
        return DSP_OK;
    case V_LIST:
        *res = false;
        for (size_t i = 0; i < hay->u.l->n; i++)
            if (dsp_tmpl_val_eq(&hay->u.l->v[i], needle)) { *res = true; break; }
        return DSP_OK;
    case V_DICT: *res = dsp_tmpl_dict_find(hay->u.d, needle) != NULL; return DSP_OK;
    case V_UNDEF: *res = false; return DSP_OK;
    default: return dsp_tmpl_fail(line, "argument of type '%s' is not iterable", dsp_tmpl_type_name(hay));
    }
}

dsp_status dsp_tmpl_str_method(rt *r, const tv *s, const char *m, args *a, tv *out) {
    int line = r->line;
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        tv *x = dsp_tmpl_arg(a, 0, NULL);
        if (!x || a->npos > 1) return dsp_tmpl_fail(line, "%s: only the one-argument form is supported", m);
        bool res = false;
        TRY(dsp_tmpl_affix_match(r, s, x, m[0] == 'e', &res));
        *out = mk_bool(res);
    } else if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        TRY(dsp_tmpl_check_args(r, a, 1, m));
        TRY(dsp_tmpl_str_strip(r, s, dsp_tmpl_arg(a, 0, NULL), m[0] == 'l' ? 1 : m[0] == 'r' ? 2 : 3, out));
        out->fl = 0;
    } else if (!strcmp(m, "split")) {
        tv *sep = dsp_tmpl_arg(a, 0, "sep"), *mx = dsp_tmpl_arg(a, 1, "maxsplit");
        TRY(dsp_tmpl_check_args(r, a, 2, m));
        int64_t maxsplit = -1;
        if (mx) TRY(dsp_tmpl_need_int(r, mx, "split", &maxsplit));
        TRY(dsp_tmpl_str_split(r, s, sep, maxsplit, out));
    } else if (!strcmp(m, "lower") || !strcmp(m, "upper") || !strcmp(m, "title") ||
               !strcmp(m, "capitalize")) {
        TRY(dsp_tmpl_check_args(r, a, 0, m));
        TRY(dsp_tmpl_str_case(r, s, m[0] == 'l' ? CASE_LOWER : m[0] == 'u' ? CASE_UPPER : m[0] == 't' ? CASE_TITLE_PY : CASE_CAPITALIZE, out));
    } else if (!strcmp(m, "replace")) {
        tv *o = dsp_tmpl_arg(a, 0, NULL), *nw = dsp_tmpl_arg(a, 1, NULL), *c = dsp_tmpl_arg(a, 2, "count");
        TRY(dsp_tmpl_check_args(r, a, 3, m));
        TRY(dsp_tmpl_need_str(r, o, "replace"));
        TRY(dsp_tmpl_need_str(r, nw, "replace"));
        int64_t count = -1;
        if (c) TRY(dsp_tmpl_need_int(r, c, "replace", &count));
        TRY(dsp_tmpl_str_replace(r, s, o, nw, count, out));
    } else if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "count") || !strcmp(m, "index")) {
        tv *x = dsp_tmpl_arg(a, 0, NULL);
        if (a->npos != 1 || a->nkw) return dsp_tmpl_fail(line, "%s: only the one-argument form is supported", m);
        TRY(dsp_tmpl_need_str(r, x, m));
        int64_t res = -1, cnt = 0;
        const char *p = s->u.s.p;
        size_t n = s->u.s.n;
        if (!x->u.s.n) {
            cnt = (int64_t)dsp_utf8_count(p, n) + 1;
            res = !strcmp(m, "rfind") ? (int64_t)dsp_utf8_count(p, n) : 0;
        } else {
            for (size_t i = 0; i + x->u.s.n <= n;) {
                if (!memcmp(p + i, x->u.s.p, x->u.s.n)) {
                    if (res < 0 || !strcmp(m, "rfind")) res = (int64_t)dsp_utf8_count(p, i);
                    cnt++;
                    i += x->u.s.n;
                } else {
                    i++;
                }
            }
        }
        if (!strcmp(m, "index") && res < 0) return dsp_tmpl_fail(line, "substring not found");
        *out = mk_int(!strcmp(m, "count") ? cnt : res);
    } else if (!strcmp(m, "join")) {
        tv *x = dsp_tmpl_arg(a, 0, NULL);
        TRY(dsp_tmpl_check_args(r, a, 1, m));
        if (!x) return dsp_tmpl_fail(line, "join: missing argument");
        tlist *l = NULL;
        TRY(dsp_tmpl_iter_list(r, x, &l));
        sb b = sb_new(r);
        for (size_t i = 0; i < l->n; i++) {
            dsp_status st = DSP_OK;
            if (l->v[i].t != V_STR) st = dsp_tmpl_fail(line, "sequence item %zu: expected str instance, %s found", i, dsp_tmpl_type_name(&l->v[i]));
            if (!st && i) st = sb_put(&b, s->u.s.p, s->u.s.n, line);
            if (!st) st = sb_put(&b, l->v[i].u.s.p, l->v[i].u.s.n, line);
            if (st) {
                sb_free(&b);
                return st;
            }
        }
        TRY(dsp_tmpl_sb_to_str(r, &b, out));
    } else if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
        tv *x = dsp_tmpl_arg(a, 0, NULL);
        TRY(dsp_tmpl_check_args(r, a, 1, m));
        TRY(dsp_tmpl_need_str(r, x, m));
        bool suf = m[6] == 's', hit;
        TRY(dsp_tmpl_affix_match(r, s, x, suf, &hit));
        *out = *s;
        out->fl = 0;
        if (hit) {
            out->u.s.n -= x->u.s.n;
            if (!suf) out->u.s.p += x->u.s.n;
        }
    } else if (!strcmp(m, "isdigit") || !strcmp(m, "isalpha") || !strcmp(m, "isspace") ||
               !strcmp(m, "isalnum") || !strcmp(m, "islower") || !strcmp(m, "isupper")) {
        TRY(dsp_tmpl_check_args(r, a, 0, m));
        bool res = s->u.s.n > 0, cased = false;
        for (size_t i = 0; i < s->u.s.n;) {
            size_t l;
            uint32_t c = dsp_utf8_decode(s->u.s.p + i, s->u.s.n - i, &l);
            i += l;
            if (c >= 0x80 && (!strcmp(m, "islower") || !strcmp(m, "isupper"))) {
                if (!dsp_tmpl_cp_case_known(c)) return dsp_tmpl_fail(line, "str.%s: U+%04X is not supported", m, c);
                bool up = dsp_tmpl_cp_lower(c) != c, lo = dsp_tmpl_cp_upper(c) != c;
                if (m[2] == 'l' ? up : lo) res = false;
                if (up || lo) cased = true;
                continue;
            }
            if (c >= 0x80 && strcmp(m, "isspace"))
                return dsp_tmpl_fail(line, "str.%s on non-ASCII text is not supported", m);
            bool d = c >= '0' && c <= '9', al = c < 0x80 && dsp_tmpl_cp_is_alpha(c);
            if (!strcmp(m, "isdigit")) res = res && d;
            else if (!strcmp(m, "isalpha")) res = res && al;
            else if (!strcmp(m, "isalnum")) res = res && (al || d);
            else if (!strcmp(m, "isspace")) res = res && dsp_tmpl_py_space_cp(c);
            else if (!strcmp(m, "islower")) { if (c >= 'A' && c <= 'Z') res = false; if (c >= 'a' && c <= 'z') cased = true; }
            else { if (c >= 'a' && c <= 'z') res = false; if (c >= 'A' && c <= 'Z') cased = true; }
        }
        if (!strcmp(m, "islower") || !strcmp(m, "isupper")) res = res && cased;
        *out = mk_bool(res);
    } else {
        return dsp_tmpl_fail(line, "unsupported: str.%s()", m);
    }
    return DSP_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* calls */

static dsp_status call_macro(rt *r, tmacro *m, args *a, tv *out) {
    node *d = m->def;
    int line = r->line;
    if (a->npos > d->nkw)
        return dsp_tmpl_fail(line, "macro '%s' takes not more than %zu argument(s)", d->s, d->nkw);
    if (r->depth >= r->t->lim.max_depth)
        return dsp_tmpl_fail(line, "macro calls nested more than %d deep (dsp_tmpl_limits.max_depth)", r->t->lim.max_depth);
    TRY(dsp_tmpl_step(r));
    scope *s = dsp_tmpl_scope_new(r, m->closure);
    if (!s) return dsp_tmpl_oom(line);
    for (size_t k = 0; k < a->nkw; k++) {
        size_t j;
        for (j = 0; j < d->nkw; j++)
            if (!strcmp(d->kw[j], a->kwn[k])) break;
        if (j == d->nkw) return dsp_tmpl_fail(line, "macro '%s' takes no keyword argument '%s'", d->s, a->kwn[k]);
        if (j < a->npos) return dsp_tmpl_fail(line, "macro '%s' got multiple values for argument '%s'", d->s, a->kwn[k]);
    }
    r->depth++;
    for (size_t j = 0; j < d->nkw; j++) {
        tv v = {0};
        tv *given = j < a->npos ? &a->pos[j] : NULL;
        for (size_t k = 0; !given && k < a->nkw; k++)
            if (!strcmp(d->kw[j], a->kwn[k])) given = &a->kwv[k];
        if (given) v = *given;
        else if (d->v2[j]) TRY(eval(r, s, d->v2[j], &v));
        else v = mk_undef(dsp_tmpl_msgf(r, "parameter '%s' was not provided", d->kw[j]));
        TRY(dsp_tmpl_scope_set(r, s, d->kw[j], v));
    }
    sb b = sb_new(r);
    int saved_ctl = r->ctl;
    dsp_status st = dsp_tmpl_exec_body(r, s, d->v, d->nv, &b);
    r->ctl = saved_ctl;
    r->depth--;
    r->line = line;
    if (st) {
        sb_free(&b);
        return st;
    }
    return dsp_tmpl_sb_to_str(r, &b, out);
}

static dsp_status call_builtin(rt *r, int fn, args *a, tv *out) {
    int line = r->line;
    switch (fn) {
    case F_RANGE: {
        if (a->nkw) return dsp_tmpl_fail(line, "range() takes no keyword arguments");
        if (a->npos < 1 || a->npos > 3) return dsp_tmpl_fail(line, "range expected 1 to 3 arguments, got %zu", a->npos);
        int64_t v[3] = {0};
        for (size_t i = 0; i < a->npos; i++) TRY(dsp_tmpl_need_int(r, &a->pos[i], "range", &v[i]));
        int64_t start = 0, stop, stp = 1;
        if (a->npos == 1) stop = v[0];
        else {
            start = v[0];
            stop = v[1];
            if (a->npos == 3) stp = v[2];
        }
        if (stp == 0) return dsp_tmpl_fail(line, "range() arg 3 must not be zero");
        /* the length, exactly: the distance between two int64 fits in uint64, and the elements are
         * stepped in uint64 (they all lie in int64, their products with the index might not) */
        uint64_t span = 0, mag = stp > 0 ? (uint64_t)stp : -(uint64_t)stp;
        if (stp > 0 && stop > start) span = (uint64_t)stop - (uint64_t)start;
        if (stp < 0 && start > stop) span = (uint64_t)start - (uint64_t)stop;
        uint64_t cnt = span ? (span - 1) / mag + 1 : 0;
        if (cnt > 100000)
            return dsp_tmpl_fail(line, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        tlist *l = dsp_tmpl_list_new(r, (size_t)cnt);
        if (!l) return dsp_tmpl_oom(line);
        uint64_t x = (uint64_t)start;
        for (uint64_t i = 0; i < cnt; i++, x += (uint64_t)stp) l->v[l->n++] = mk_int((int64_t)x);
        *out = mk_list(l, L_RANGE);
        return DSP_OK;
    }
    case F_NAMESPACE: case F_DICT: {
        tdict *d = dict_new(r);
        if (!d) return dsp_tmpl_oom(line);
        for (size_t i = 0; i < a->npos; i++) {
            if (a->pos[i].t != V_DICT)
                return dsp_tmpl_fail(line, "%s(): positional arguments must be mappings",
                            fn == F_DICT ? "dict" : "namespace");
            for (size_t j = 0; j < a->pos[i].u.d->n; j++)
                TRY(dsp_tmpl_dict_set(r, d, a->pos[i].u.d->k[j], a->pos[i].u.d->v[j]));
        }
        if (fn == F_DICT && a->npos > 1) return dsp_tmpl_fail(line, "dict expected at most 1 argument");
        for (size_t i = 0; i < a->nkw; i++) TRY(dsp_tmpl_dict_set_s(r, d, a->kwn[i], a->kwv[i]));
        if (fn == F_NAMESPACE)
            for (size_t i = 0; i < d->n; i++)
                if (d->k[i].t == V_STR && d->k[i].u.s.n && d->k[i].u.s.p[0] == '_')
                    return dsp_tmpl_fail(line, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%.*s'.",
                                (int)d->k[i].u.s.n, d->k[i].u.s.p);
        out->t = fn == F_DICT ? V_DICT : V_NS;
        out->fl = 0;
        out->u.d = d;
        return DSP_OK;
    }
    case F_RAISE: {
        tv *m = dsp_tmpl_arg(a, 0, "message");
        tv s = mk_str("", 0);
        if (m) TRY(dsp_tmpl_to_str(r, m, &s));
        return dsp_error(DSP_ERR_TEMPLATE, "line %d: template raised an exception: %.*s", line,
                         (int)(s.u.s.n > 600 ? 600 : s.u.s.n), s.u.s.p);
    }
    case F_STRFTIME: {
        tv *f = dsp_tmpl_arg(a, 0, "format");
        TRY(dsp_tmpl_check_args(r, a, 1, "strftime_now"));
        TRY(dsp_tmpl_need_str(r, f, "strftime_now"));
        if (memchr(f->u.s.p, '\0', f->u.s.n) || f->u.s.n > 256)
            return dsp_tmpl_fail(line, "strftime_now: bad format");
        /* Python's strftime passes the format to the C library; refuse directives whose output
         * differs between C and Python implementations */
        for (size_t i = 0; i + 1 < f->u.s.n; i++)
            if (f->u.s.p[i] == '%') {
                char c = f->u.s.p[++i];
                if (!strchr("aAbBdHIjmMpSUwWyY%eTDFRn", c))
                    return dsp_tmpl_fail(line, "strftime_now: directive %%%c is not supported", c);
            }
        char fmt[260], buf[1024];
        memcpy(fmt, f->u.s.p, f->u.s.n);
        fmt[f->u.s.n] = '\0';
        time_t t;
        struct tm tmv;
        if (r->opts && r->opts->has_now) {
            t = (time_t)r->opts->now;
            gmtime_r(&t, &tmv);
        } else {
            t = time(NULL);
            localtime_r(&t, &tmv);
        }
        size_t n = strftime(buf, sizeof buf, fmt, &tmv);
        if (!n && fmt[0]) return dsp_tmpl_fail(line, "strftime_now: result too long");
        char *p = dsp_arena_strndup(r->ar, buf, n);
        if (!p) return dsp_tmpl_oom(line);
        *out = mk_str(p, n);
        return DSP_OK;
    }
    }
    return dsp_tmpl_fail(line, "bad builtin");
}

dsp_status dsp_tmpl_call_method(rt *r, tmeth *me, args *a, tv *out) {
    tv *s = &me->self;
    const char *m = me->name;
    int line = r->line;
    if (s->t == V_STR) return dsp_tmpl_str_method(r, s, m, a, out);
    if (s->t == V_DICT) {
        tdict *d = s->u.d;
        if (!strcmp(m, "get")) {
            tv *k = dsp_tmpl_arg(a, 0, NULL), *def = dsp_tmpl_arg(a, 1, NULL);
            if (!k || a->npos > 2 || a->nkw) return dsp_tmpl_fail(line, "dict.get: expected 1 or 2 arguments");
            tv *v = dsp_tmpl_dict_find(d, k);
            *out = v ? *v : def ? *def : mk_none();
            return DSP_OK;
        }
        if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
            TRY(dsp_tmpl_check_args(r, a, 0, m));
            tlist *l = dsp_tmpl_list_new(r, d->n);
            if (!l) return dsp_tmpl_oom(line);
            for (size_t i = 0; i < d->n; i++) {
                if (m[0] == 'k') l->v[i] = d->k[i];
                else if (m[0] == 'v') l->v[i] = d->v[i];
                else {
                    tlist *pair = dsp_tmpl_list_new(r, 2);
                    if (!pair) return dsp_tmpl_oom(line);
                    pair->v[0] = d->k[i];
                    pair->v[1] = d->v[i];
                    pair->n = 2;
                    l->v[i] = mk_list(pair, L_TUPLE);
                }
                l->n++;
            }
            *out = mk_list(l, L_VIEW);
            return DSP_OK;
        }
        if (!strcmp(m, "copy")) {
            TRY(dsp_tmpl_check_args(r, a, 0, m));
            tdict *c = dict_new(r);
            if (!c) return dsp_tmpl_oom(line);
            for (size_t i = 0; i < d->n; i++) TRY(dsp_tmpl_dict_set(r, c, d->k[i], d->v[i]));
            out->t = V_DICT;
            out->fl = 0;
            out->u.d = c;
            return DSP_OK;
        }
        return dsp_tmpl_fail(line, "unsupported: dict.%s()", m);
    }
    if (s->t == V_LIST) {
        tlist *l = s->u.l;
        if (!strcmp(m, "count") || !strcmp(m, "index")) {
            tv *x = dsp_tmpl_arg(a, 0, NULL);
            if (!x || a->npos != 1 || a->nkw) return dsp_tmpl_fail(line, "%s: expected one argument", m);
            int64_t cnt = 0, first = -1;
            for (size_t i = 0; i < l->n; i++)
                if (dsp_tmpl_val_eq(&l->v[i], x)) {
                    if (first < 0) first = (int64_t)i;
                    cnt++;
                }
            if (m[0] == 'i' && first < 0) return dsp_tmpl_fail(line, "list.index(x): x not in list");
            *out = mk_int(m[0] == 'c' ? cnt : first);
            return DSP_OK;
        }
        if (!strcmp(m, "copy")) {
            TRY(dsp_tmpl_check_args(r, a, 0, m));
            *out = *s;
            return DSP_OK;
        }
        return dsp_tmpl_fail(line, "unsupported: list.%s()", m);
    }
    if (s->t == V_LOOP) {
        tloop *lp = s->u.lp;
        if (!strcmp(m, "cycle")) {
            if (!a->npos) return dsp_tmpl_fail(line, "no items for cycling given");
            *out = a->pos[lp->index0 % a->npos];
            return DSP_OK;
        }
        /* changed(*values) */
        tlist *l = dsp_tmpl_list_new(r, a->npos);
        if (!l) return dsp_tmpl_oom(line);
        for (size_t i = 0; i < a->npos; i++) l->v[l->n++] = a->pos[i];
        tv now = mk_list(l, L_LIST);
        bool changed = !lp->has_changed || !dsp_tmpl_val_eq(&now, &lp->last_changed);
        lp->last_changed = now;
        lp->has_changed = true;
        *out = mk_bool(changed);
        return DSP_OK;
    }
    return dsp_tmpl_fail(line, "unsupported method %s", m);
}

static dsp_status call_value(rt *r, const tv *f, args *a, tv *out) {
    switch (f->t) {
    case V_MACRO: return call_macro(r, f->u.m, a, out);
    case V_FUNC: return call_builtin(r, f->fn, a, out);
    case V_METHOD: return dsp_tmpl_call_method(r, f->u.me, a, out);
    case V_UNDEF: return dsp_tmpl_undef_err(f, r->line);
    default: return dsp_tmpl_fail(r->line, "'%s' object is not callable", dsp_tmpl_type_name(f));
    }
}

/* ------------------------------------------------------------------------------------------ */
/* expressions */

static dsp_status eval_filter(rt *r, scope *sc, node *e, tv *out) {
    tv in = {0};
    if (e->a->k == E_HOLE) in = r->hole;
    else TRY(eval(r, sc, e->a, &in));
    args a;
    TRY(eval_args(r, sc, e, &a));
    r->line = e->line;
    return dsp_tmpl_apply_filter(r, e->s, in, &a, out);
}

static dsp_status eval(rt *r, scope *sc, node *e, tv *out) {
    if (r->depth > r->t->lim.max_depth * 4)
        return dsp_tmpl_fail(e->line, "expression nested too deeply");
    r->line = e->line;
    switch (e->k) {
    case E_CONST: *out = e->cv; return DSP_OK;
    case E_HOLE: *out = r->hole; return DSP_OK;
    case E_NAME: {
        tv *v = scope_lookup(sc, e->s);
        *out = v ? *v : mk_undef(dsp_tmpl_msgf(r, "'%s' is undefined", e->s));
        return DSP_OK;
    }
    case E_ATTR: {
        tv o = {0};
        TRY(eval(r, sc, e->a, &o));
        r->line = e->line;
        return dsp_tmpl_get_attr(r, &o, e->s, out);
    }
    case E_ITEM: {
        tv o = {0}, k = {0};
        TRY(eval(r, sc, e->a, &o));
        TRY(eval(r, sc, e->b, &k));
        r->line = e->line;
        return dsp_tmpl_get_item(r, &o, &k, out);
    }
    case E_SLICE: {
        if (!e->nv) return dsp_tmpl_fail(e->line, "unsupported: slice inside a tuple subscript");
        tv o = {0}, parts[3];
        tv *pp[3] = {NULL, NULL, NULL};
        TRY(eval(r, sc, e->v[0], &o));
        node *ch[3] = {e->a, e->b, e->c};
        for (int i = 0; i < 3; i++)
            if (ch[i]) {
                TRY(eval(r, sc, ch[i], &parts[i]));
                pp[i] = &parts[i];
            }
        r->line = e->line;
        return dsp_tmpl_get_slice(r, &o, pp[0], pp[1], pp[2], out);
    }
    case E_CALL: {
        tv f = {0};
        TRY(eval(r, sc, e->a, &f));
        args a;
        TRY(eval_args(r, sc, e, &a));
        r->line = e->line;
        r->depth++;
        dsp_status st = call_value(r, &f, &a, out);
        r->depth--;
        return st;
    }
    case E_FILTER: return eval_filter(r, sc, e, out);
    case E_TEST: {
        tv v = {0};
        TRY(eval(r, sc, e->a, &v));
        args a;
        TRY(eval_args(r, sc, e, &a));
        r->line = e->line;
        bool res = false;
        TRY(dsp_tmpl_apply_test(r, e->s, v, &a, &res));
        *out = mk_bool(e->neg ? !res : res);
        return DSP_OK;
    }
    case E_BIN: {
        tv a = {0}, b = {0};
        TRY(eval(r, sc, e->a, &a));
        TRY(eval(r, sc, e->b, &b));
        r->line = e->line;
        return dsp_tmpl_binop(r, e->op, a, b, out);
    }
    case E_NEG: case E_POS: {
        tv a = {0};
        TRY(eval(r, sc, e->a, &a));
        r->line = e->line;
        if (a.t == V_UNDEF) return dsp_tmpl_undef_err(&a, e->line);
        if (a.t == V_FLOAT) *out = mk_float(e->k == E_NEG ? -a.u.f : a.u.f);
        else if (is_intlike(&a)) {
            if (e->k == E_NEG && num_i(&a) == INT64_MIN) return dsp_tmpl_int_overflow(r);
            *out = mk_int(e->k == E_NEG ? -num_i(&a) : num_i(&a));
        } else return dsp_tmpl_fail(e->line, "bad operand type for unary %c: '%s'", e->k == E_NEG ? '-' : '+', dsp_tmpl_type_name(&a));
        return DSP_OK;
    }
    case E_NOT: {
        tv a = {0};
        TRY(eval(r, sc, e->a, &a));
        *out = mk_bool(!dsp_tmpl_truthy(&a));
        return DSP_OK;
    }
    case E_AND: case E_OR: {
        tv a = {0};
        TRY(eval(r, sc, e->a, &a));
        bool t = dsp_tmpl_truthy(&a);
        if (e->k == E_AND ? !t : t) {
            *out = a;
            return DSP_OK;
        }
        return eval(r, sc, e->b, out);
    }
    case E_CMP: {
        tv l = {0};
        TRY(eval(r, sc, e->a, &l));
        for (size_t i = 0; i < e->nv; i++) {
            tv rr = {0};
            TRY(eval(r, sc, e->v[i], &rr));
            r->line = e->line;
            bool ok = false;
            int op = e->ops[i];
            if (op == OP_EQ) ok = dsp_tmpl_val_eq(&l, &rr);
            else if (op == OP_NE) ok = !dsp_tmpl_val_eq(&l, &rr);
            else if (op == OP_IN || op == OP_NOTIN) {
                TRY(dsp_tmpl_contains(r, &rr, &l, &ok));
                if (op == OP_NOTIN) ok = !ok;
            } else {
                int c = 0;
                TRY(dsp_tmpl_val_cmp(&l, &rr, e->line, dsp_tmpl_op_text(op), &c));
                ok = op == OP_LT ? c < 0 : op == OP_LTEQ ? c <= 0 : op == OP_GT ? c > 0 : c >= 0;
            }
            if (!ok) {
                *out = mk_bool(false);
                return DSP_OK;
            }
            l = rr;
        }
        *out = mk_bool(true);
        return DSP_OK;
    }
    case E_COND: {
        tv c = {0};
        TRY(eval(r, sc, e->a, &c));
        if (dsp_tmpl_truthy(&c)) return eval(r, sc, e->b, out);
        if (e->c) return eval(r, sc, e->c, out);
        *out = mk_undef("the inline if-expression evaluated to false and no else section was defined.");
        return DSP_OK;
    }
    case E_LIST: case E_TUPLE: {
        tlist *l = dsp_tmpl_list_new(r, e->nv);
        if (!l) return dsp_tmpl_oom(e->line);
        for (size_t i = 0; i < e->nv; i++) {
            TRY(eval(r, sc, e->v[i], &l->v[i]));
            l->n++;
        }
        *out = mk_list(l, e->k == E_LIST ? L_LIST : L_TUPLE);
        return DSP_OK;
    }
    case E_DICT: {
        tdict *d = dict_new(r);
        if (!d) return dsp_tmpl_oom(e->line);
        for (size_t i = 0; i < e->nv; i++) {
            tv k, v;
            TRY(eval(r, sc, e->v[i], &k));
            TRY(eval(r, sc, e->v2[i], &v));
            if (k.t == V_LIST && k.fl != L_TUPLE) return dsp_tmpl_fail(e->line, "unhashable type: 'list'");
            if (k.t == V_DICT || k.t == V_UNDEF) return dsp_tmpl_fail(e->line, "unhashable dict key");
            TRY(dsp_tmpl_dict_set(r, d, k, v));
        }
        out->t = V_DICT;
        out->fl = 0;
        out->u.d = d;
        return DSP_OK;
    }
    case E_CONCAT: {
        sb b = sb_new(r);
        for (size_t i = 0; i < e->nv; i++) {
            tv v = {0};
            dsp_status st = eval(r, sc, e->v[i], &v);
            if (!st) st = dsp_tmpl_put_str(r, &b, &v, 0);
            if (st) {
                sb_free(&b);
                return st;
            }
        }
        return dsp_tmpl_sb_to_str(r, &b, out);
    }
    default: return dsp_tmpl_fail(e->line, "internal: bad expression node %d", e->k);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* statements */

static dsp_status assign_targets(rt *r, scope *sc, node *st, tv v) {
    if (!st->neg) return dsp_tmpl_scope_set(r, sc, st->kw ? st->kw[0] : st->s, v);
    if (v.t == V_LIST && v.fl == L_GEN) return dsp_tmpl_fail(st->line, "cannot unpack a generator here");
    tlist *l = NULL;
    TRY(dsp_tmpl_iter_list(r, &v, &l));
    if (l->n != st->nkw)
        return dsp_tmpl_fail(st->line, "%s values to unpack (expected %zu, got %zu)",
                    l->n > st->nkw ? "too many" : "not enough", st->nkw, l->n);
    for (size_t i = 0; i < st->nkw; i++) TRY(dsp_tmpl_scope_set(r, sc, st->kw[i], l->v[i]));
    return DSP_OK;
}

static dsp_status exec_for(rt *r, scope *sc, node *st, sb *out) {
    tv it = {0};
    TRY(eval(r, sc, st->a, &it));
    r->line = st->line;
    tlist *items = NULL;
    TRY(dsp_tmpl_iter_list(r, &it, &items));
    if (st->b) { /* for x in xs if cond: filter first, so loop.length counts kept items */
        tlist *kept = dsp_tmpl_list_new(r, 0);
        if (!kept) return dsp_tmpl_oom(st->line);
        for (size_t i = 0; i < items->n; i++) {
            TRY(dsp_tmpl_step(r));
            scope *s = dsp_tmpl_scope_new(r, sc);
            if (!s) return dsp_tmpl_oom(st->line);
            TRY(assign_targets(r, s, st, items->v[i]));
            tv c = {0};
            TRY(eval(r, s, st->b, &c));
            if (dsp_tmpl_truthy(&c)) TRY(dsp_tmpl_list_push(r, kept, items->v[i]));
        }
        items = kept;
    }
    if (!items->n) {
        if (st->nv2) return dsp_tmpl_exec_body(r, sc, st->v2, st->nv2, out);
        return DSP_OK;
    }
    tloop *lp = ralloc(r, sizeof *lp);
    if (!lp) return dsp_tmpl_oom(st->line);
    lp->items = items;
    tv loopv = {.t = V_LOOP};
    loopv.u.lp = lp;
    if (r->loop_depth >= r->t->lim.max_depth) return dsp_tmpl_fail(st->line, "loops nested too deeply");
    r->loop_depth++;
    for (size_t i = 0; i < items->n; i++) {
        r->line = st->line;
        TRY(dsp_tmpl_step(r));
        lp->index0 = i;
        scope *s = dsp_tmpl_scope_new(r, sc);
        if (!s) return dsp_tmpl_oom(st->line);
        TRY(assign_targets(r, s, st, items->v[i]));
        TRY(dsp_tmpl_scope_set(r, s, "loop", loopv));
        TRY(dsp_tmpl_exec_body(r, s, st->v, st->nv, out));
        if (r->ctl == CTL_BREAK) {
            r->ctl = CTL_NONE;
            break;
        }
        r->ctl = CTL_NONE;
    }
    r->loop_depth--;
    return DSP_OK;
}

static dsp_status exec_stmt(rt *r, scope *sc, node *st, sb *out) {
    r->line = st->line;
    TRY(dsp_tmpl_step(r));
    switch (st->k) {
    case S_TEXT: return sb_put(out, st->s, st->sl, st->line);
    case S_OUT: {
        tv v = {0};
        TRY(eval(r, sc, st->a, &v));
        r->line = st->line;
        return dsp_tmpl_put_str(r, out, &v, 0);
    }
    case S_IF: {
        tv c = {0};
        TRY(eval(r, sc, st->a, &c));
        if (dsp_tmpl_truthy(&c)) return dsp_tmpl_exec_body(r, sc, st->v, st->nv, out);
        return dsp_tmpl_exec_body(r, sc, st->v2, st->nv2, out);
    }
    case S_FOR: return exec_for(r, sc, st, out);
    case S_SET: {
        tv v = {0};
        TRY(eval(r, sc, st->a, &v));
        r->line = st->line;
        if (st->s2) {
            tv *ns = scope_lookup(sc, st->s);
            if (!ns || ns->t != V_NS)
                return dsp_tmpl_fail(st->line, "cannot assign attribute on non-namespace object '%s'", st->s);
            if (st->s2[0] == '_')
                return dsp_tmpl_fail(st->line, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'.", st->s2);
            return dsp_tmpl_dict_set_s(r, ns->u.d, st->s2, v);
        }
        return assign_targets(r, sc, st, v);
    }
    case S_SETBLOCK: case S_FILTERBLOCK: {
        sb b = sb_new(r);
        dsp_status e = dsp_tmpl_exec_body(r, sc, st->v, st->nv, &b);
        if (e) {
            sb_free(&b);
            return e;
        }
        tv v = {0};
        TRY(dsp_tmpl_sb_to_str(r, &b, &v));
        if (st->b) {
            tv saved = r->hole;
            r->hole = v;
            dsp_status fs = eval(r, sc, st->b, &v);
            r->hole = saved;
            TRY(fs);
        }
        r->line = st->line;
        if (st->k == S_FILTERBLOCK) return dsp_tmpl_put_str(r, out, &v, 0);
        if (st->s2) {
            tv *ns = scope_lookup(sc, st->s);
            if (!ns || ns->t != V_NS)
                return dsp_tmpl_fail(st->line, "cannot assign attribute on non-namespace object '%s'", st->s);
            return dsp_tmpl_dict_set_s(r, ns->u.d, st->s2, v);
        }
        return dsp_tmpl_scope_set(r, sc, st->s, v);
    }
    case S_MACRO: {
        tmacro *m = ralloc(r, sizeof *m);
        if (!m) return dsp_tmpl_oom(st->line);
        m->def = st;
        m->closure = sc;
        tv v = {.t = V_MACRO};
        v.u.m = m;
        return dsp_tmpl_scope_set(r, sc, st->s, v);
    }
    case S_BREAK: r->ctl = CTL_BREAK; return DSP_OK;
    case S_CONTINUE: r->ctl = CTL_CONTINUE; return DSP_OK;
    case S_BODY: return dsp_tmpl_exec_body(r, sc, st->v, st->nv, out);
    case S_WITH: {
        scope *s = dsp_tmpl_scope_new(r, sc);
        if (!s) return dsp_tmpl_oom(st->line);
        for (size_t i = 0; i < st->nkw; i++) {
            tv v = {0};
            TRY(eval(r, sc, st->v2[i], &v));
            TRY(dsp_tmpl_scope_set(r, s, st->kw[i], v));
        }
        return dsp_tmpl_exec_body(r, s, st->v, st->nv, out);
    }
    default: return dsp_tmpl_fail(st->line, "internal: bad statement node %d", st->k);
    }
}

dsp_status dsp_tmpl_exec_body(rt *r, scope *sc, node **v, size_t n, sb *out) {
    if (r->depth > r->t->lim.max_depth * 4) return dsp_tmpl_fail(r->line, "template nested too deeply");
    r->depth++;
    for (size_t i = 0; i < n; i++) {
        dsp_status st = exec_stmt(r, sc, v[i], out);
        if (st) {
            r->depth--;
            return st;
        }
        if (r->ctl != CTL_NONE) break;
    }
    r->depth--;
    return DSP_OK;
}
