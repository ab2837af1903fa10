/* template/tmpl_values: errors, output buffers, UTF-8 and Python's text rules, and the values
 * templates compute with (Python semantics: truth, equality, ordering, str(), repr(),
 * json.dumps(), iteration, the str methods filters share). See tmpl_internal.h. */
#include "template/tmpl_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

/* ------------------------------------------------------------------------------------------ */
/* errors */

dsp_status dsp_tmpl_fail(int line, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line > 0) return dsp_error(DSP_ERR_TEMPLATE, "line %d: %s", line, msg);
    return dsp_error(DSP_ERR_TEMPLATE, "%s", msg);
}

dsp_status dsp_tmpl_oom(int line) {
    return dsp_tmpl_fail(line, "template memory limit exceeded (dsp_tmpl_limits.max_memory)");
}

dsp_status dsp_tmpl_int_overflow(rt *r) {
    return dsp_tmpl_fail(r->line, "integer overflow (integers are limited to 64 bits here)");
}

dsp_status dsp_tmpl_undef_err(const tv *v, int line) {
    if (v->u.uname) return dsp_tmpl_fail(line, "%s", v->u.uname);
    return dsp_tmpl_fail(line, "undefined value used");
}

const char *dsp_tmpl_msgf(rt *r, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return dsp_arena_strndup(r->ar, buf, strlen(buf));
}

/* ------------------------------------------------------------------------------------------ */
/* byte buffers */

dsp_status dsp_tmpl_sb_reserve(sb *b, size_t extra, int line) {
    if (extra > b->limit || b->n > b->limit - extra)
        return dsp_tmpl_fail(line, "output larger than %zu bytes (dsp_tmpl_limits.max_output)", b->limit);
    size_t need = b->n + extra + 1;
    if (need <= b->cap) return DSP_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return dsp_error(DSP_ERR_NOMEM, "template output: out of memory");
    b->p = p;
    b->cap = cap;
    return DSP_OK;
}

/* copy a buffer into the arena as a string value, freeing the buffer */
dsp_status dsp_tmpl_sb_to_str(rt *r, sb *b, tv *out) {
    char *p = dsp_arena_strndup(r->ar, b->p ? b->p : "", b->n);
    size_t n = b->n;
    sb_free(b);
    if (!p) return dsp_tmpl_oom(r->line);
    *out = mk_str(p, n);
    return DSP_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Python's text rules (all strings here are valid UTF-8: the source is checked, jansson checks JSON) */

/* Python str.isspace() */
bool dsp_tmpl_py_space_cp(uint32_t c) {
    return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f) || c == 0x85 ||
           c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 ||
           c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}
/* length of the whitespace code point at s (0 if not whitespace) */
size_t dsp_tmpl_py_space_at(const char *s, size_t n) {
    size_t l;
    uint32_t c = dsp_utf8_decode(s, n, &l);
    return dsp_tmpl_py_space_cp(c) ? l : 0;
}
size_t dsp_tmpl_py_rstrip_len(const char *s, size_t n) {
    while (n > 0) {
        size_t i = dsp_utf8_prev(s, n);
        if (!dsp_tmpl_py_space_at(s + i, n - i)) break;
        n = i;
    }
    return n;
}
size_t dsp_tmpl_py_lstrip_off(const char *s, size_t n) {
    size_t i = 0, l;
    while (i < n && (l = dsp_tmpl_py_space_at(s + i, n - i)) > 0) i += l;
    return i;
}
/* Python str.splitlines() boundaries */
size_t dsp_tmpl_py_linebreak_at(const char *s, size_t n) {
    unsigned char c = (unsigned char)s[0];
    if (c == '\r') return (n > 1 && s[1] == '\n') ? 2 : 1;
    if (c == '\n' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e) return 1;
    if (c < 0x80) return 0;
    size_t l;
    uint32_t cp = dsp_utf8_decode(s, n, &l);
    return (cp == 0x85 || cp == 0x2028 || cp == 0x2029) ? l : 0;
}

/* simple case mapping: ASCII, Latin-1, Latin Extended-A pairs, Greek and Cyrillic basics.
 * Characters outside these ranges are left unchanged (Python would map some of them). */
uint32_t dsp_tmpl_cp_lower(uint32_t c) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    if (c < 0x80) return c;
    if ((c >= 0xc0 && c <= 0xde && c != 0xd7)) return c + 32;
    if (c == 0x178) return 0xff;
    if (c >= 0x100 && c <= 0x17f && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 &&
        c != 0x17f) {
        bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e);
        if (odd_upper ? (c & 1) : !(c & 1)) return c + 1;
        return c;
    }
    if (c >= 0x391 && c <= 0x3ab && c != 0x3a2) return c + 32;
    if (c >= 0x410 && c <= 0x42f) return c + 32;
    if (c >= 0x400 && c <= 0x40f) return c + 80;
    return c;
}
uint32_t dsp_tmpl_cp_upper(uint32_t c) {
    if (c >= 'a' && c <= 'z') return c - 32;
    if (c < 0x80) return c;
    if (c >= 0xe0 && c <= 0xfe && c != 0xf7) return c - 32;
    if (c == 0xff) return 0x178;
    if (c >= 0x100 && c <= 0x17f && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 &&
        c != 0x17f) {
        bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e);
        if (odd_upper ? !(c & 1) : (c & 1)) return c - 1;
        return c;
    }
    if (c >= 0x3b1 && c <= 0x3cb && c != 0x3c2) return c - 32;
    if (c >= 0x430 && c <= 0x44f) return c - 32;
    if (c >= 0x450 && c <= 0x45f) return c - 80;
    return c;
}
bool dsp_tmpl_cp_is_alpha(uint32_t c) {
    if (c < 0x80) return (c | 32) >= 'a' && (c | 32) <= 'z';
    return dsp_tmpl_cp_lower(c) != c || dsp_tmpl_cp_upper(c) != c || c == 0xaa || c == 0xba || c == 0xdf ||
           c == 0x138 || c == 0x149 || c == 0x17f || (c >= 0x3040 && c <= 0x9fff) ||
           (c >= 0xac00 && c <= 0xd7af);
}
/* Characters whose case mapping cp_lower/cp_upper get right (including caseless blocks). Case
 * functions refuse other characters rather than guess what Python would do. */
bool dsp_tmpl_cp_case_known(uint32_t c) {
    if (c == 0xb5 || c == 0xdf || c == 0x130 || c == 0x131 || c == 0x149 || c == 0x17f ||
        c == 0x3a3 || c == 0x3c2)
        return false;
    return c < 0x180 || (c >= 0x391 && c <= 0x3a9) || (c >= 0x3b1 && c <= 0x3c9) ||
           (c >= 0x400 && c <= 0x45f) || (c >= 0x590 && c <= 0x6ff) || (c >= 0x900 && c <= 0xe7f) ||
           (c >= 0x2000 && c <= 0x206f) || (c >= 0x2190 && c <= 0x23ff) ||
           (c >= 0x2500 && c <= 0x27bf) || (c >= 0x2e80 && c <= 0xa4cf) ||
           (c >= 0xac00 && c <= 0xd7af) || (c >= 0xf900 && c <= 0xfaff) ||
           (c >= 0xfe30 && c <= 0xfe4f) || (c >= 0x1f000 && c <= 0x1faff) ||
           (c >= 0x20000 && c <= 0x3134f);
}

/* ------------------------------------------------------------------------------------------ */
/* value helpers */

const char *dsp_tmpl_type_name(const tv *v) {
    switch (v->t) {
    case V_UNDEF: return "Undefined";
    case V_NONE: return "NoneType";
    case V_BOOL: return "bool";
    case V_INT: return "int";
    case V_FLOAT: return "float";
    case V_STR: return v->fl ? "Markup" : "str";
    case V_LIST:
        switch (v->fl) {
        case L_TUPLE: return "tuple";
        case L_GEN: return "generator";
        case L_VIEW: return "dict view";
        case L_RANGE: return "range";
        default: return "list";
        }
    case V_DICT: return "dict";
    case V_NS: return "Namespace";
    case V_MACRO: return "Macro";
    case V_FUNC: return "function";
    case V_METHOD: return "method";
    case V_LOOP: return "LoopContext";
    }
    return "object";
}

bool dsp_tmpl_truthy(const tv *v) {
    switch (v->t) {
    case V_UNDEF: case V_NONE: return false;
    case V_BOOL: return v->u.b;
    case V_INT: return v->u.i != 0;
    case V_FLOAT: return v->u.f != 0.0;
    case V_STR: return v->u.s.n > 0;
    case V_LIST: return v->fl == L_GEN ? true : v->u.l->n > 0;
    case V_DICT: return v->u.d->n > 0;
    default: return true;
    }
}

tlist *dsp_tmpl_list_new(rt *r, size_t cap) {
    tlist *l = ralloc(r, sizeof *l);
    if (!l) return NULL;
    if (cap) {
        l->v = ralloc(r, cap * sizeof(tv));
        if (!l->v) return NULL;
        l->cap = cap;
    }
    return l;
}
dsp_status dsp_tmpl_list_push(rt *r, tlist *l, tv v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        if (cap > SIZE_MAX / sizeof(tv)) return dsp_tmpl_oom(r->line);
        tv *p = ralloc(r, cap * sizeof(tv));
        if (!p) return dsp_tmpl_oom(r->line);
        if (l->n) memcpy(p, l->v, l->n * sizeof(tv));
        l->v = p;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return DSP_OK;
}

tv *dsp_tmpl_dict_find(const tdict *d, const tv *k) {
    for (size_t i = 0; i < d->n; i++)
        if (dsp_tmpl_val_eq(&d->k[i], k)) return &d->v[i];
    return NULL;
}
tv *dsp_tmpl_dict_find_s(const tdict *d, const char *s, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (str_eq(&d->k[i], s, n)) return &d->v[i];
    return NULL;
}
dsp_status dsp_tmpl_dict_set(rt *r, tdict *d, tv k, tv v) {
    tv *slot = dsp_tmpl_dict_find(d, &k);
    if (slot) {
        *slot = v;
        return DSP_OK;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        tv *nk = ralloc(r, cap * sizeof(tv)), *nv = ralloc(r, cap * sizeof(tv));
        if (!nk || !nv) return dsp_tmpl_oom(r->line);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof(tv));
            memcpy(nv, d->v, d->n * sizeof(tv));
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    return DSP_OK;
}
dsp_status dsp_tmpl_dict_set_s(rt *r, tdict *d, const char *s, tv v) {
    return dsp_tmpl_dict_set(r, d, mk_str(s, strlen(s)), v);
}

bool dsp_tmpl_val_eq(const tv *a, const tv *b) {
    if (is_num(a) && is_num(b)) {
        if (a->t == V_FLOAT || b->t == V_FLOAT) return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a->t != b->t) return false;
    switch (a->t) {
    case V_UNDEF: case V_NONE: return true;
    case V_STR: return a->u.s.n == b->u.s.n && !memcmp(a->u.s.p, b->u.s.p, a->u.s.n);
    case V_LIST: {
        bool la = a->fl == L_LIST || a->fl == L_TUPLE, lb = b->fl == L_LIST || b->fl == L_TUPLE;
        if (!la || !lb) return a->u.l == b->u.l;
        if (a->fl != b->fl || a->u.l->n != b->u.l->n) return false;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!dsp_tmpl_val_eq(&a->u.l->v[i], &b->u.l->v[i])) return false;
        return true;
    }
    case V_DICT: {
        if (a->u.d->n != b->u.d->n) return false;
        for (size_t i = 0; i < a->u.d->n; i++) {
            tv *o = dsp_tmpl_dict_find(b->u.d, &a->u.d->k[i]);
            if (!o || !dsp_tmpl_val_eq(&a->u.d->v[i], o)) return false;
        }
        return true;
    }
    case V_NS: return a->u.d == b->u.d;
    case V_MACRO: return a->u.m == b->u.m;
    case V_FUNC: return a->fn == b->fn;
    default: return a == b;
    }
}

/* Python's <, for numbers, strings and sequences; *res = -1/0/1 */
dsp_status dsp_tmpl_val_cmp(const tv *a, const tv *b, int line, const char *op, int *res) {
    if (a->t == V_UNDEF) return dsp_tmpl_undef_err(a, line);
    if (b->t == V_UNDEF) return dsp_tmpl_undef_err(b, line);
    if (is_num(a) && is_num(b)) {
        if (a->t == V_FLOAT || b->t == V_FLOAT) {
            double x = num_f(a), y = num_f(b);
            *res = x < y ? -1 : x > y ? 1 : 0; /* NaN compares as equal-ish: rare */
        } else {
            int64_t x = num_i(a), y = num_i(b);
            *res = x < y ? -1 : x > y ? 1 : 0;
        }
        return DSP_OK;
    }
    if (a->t == V_STR && b->t == V_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int c = memcmp(a->u.s.p, b->u.s.p, n);
        *res = c ? (c < 0 ? -1 : 1) : a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n ? 1 : 0;
        return DSP_OK;
    }
    if (a->t == V_LIST && b->t == V_LIST && a->fl == b->fl && (a->fl == L_LIST || a->fl == L_TUPLE)) {
        size_t n = a->u.l->n < b->u.l->n ? a->u.l->n : b->u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (dsp_tmpl_val_eq(&a->u.l->v[i], &b->u.l->v[i])) continue;
            return dsp_tmpl_val_cmp(&a->u.l->v[i], &b->u.l->v[i], line, op, res);
        }
        *res = a->u.l->n < b->u.l->n ? -1 : a->u.l->n > b->u.l->n ? 1 : 0;
        return DSP_OK;
    }
    return dsp_tmpl_fail(line, "'%s' not supported between instances of '%s' and '%s'", op, dsp_tmpl_type_name(a),
                dsp_tmpl_type_name(b));
}

/* iterate a value into a list (materialized); Python iteration semantics */
dsp_status dsp_tmpl_iter_list(rt *r, const tv *v, tlist **out) {
    int line = r->line;
    switch (v->t) {
    case V_UNDEF: *out = dsp_tmpl_list_new(r, 0); return *out ? DSP_OK : dsp_tmpl_oom(line);
    case V_LIST: *out = v->u.l; return DSP_OK;
    case V_DICT: {
        tlist *l = dsp_tmpl_list_new(r, v->u.d->n);
        if (!l) return dsp_tmpl_oom(line);
        for (size_t i = 0; i < v->u.d->n; i++) l->v[l->n++] = v->u.d->k[i];
        *out = l;
        return DSP_OK;
    }
    case V_STR: {
        size_t n = dsp_utf8_count(v->u.s.p, v->u.s.n);
        tlist *l = dsp_tmpl_list_new(r, n);
        if (!l) return dsp_tmpl_oom(line);
        for (size_t i = 0; i < v->u.s.n;) {
            size_t cl;
            dsp_utf8_decode(v->u.s.p + i, v->u.s.n - i, &cl);
            l->v[l->n++] = mk_str(v->u.s.p + i, cl);
            i += cl;
        }
        *out = l;
        return DSP_OK;
    }
    default: return dsp_tmpl_fail(line, "'%s' object is not iterable", dsp_tmpl_type_name(v));
    }
}

dsp_status dsp_tmpl_need_str(rt *r, const tv *v, const char *what) {
    if (!v || v->t != V_STR)
        return dsp_tmpl_fail(r->line, "%s: expected a string argument, got %s", what, v ? dsp_tmpl_type_name(v) : "nothing");
    return DSP_OK;
}
dsp_status dsp_tmpl_need_int(rt *r, const tv *v, const char *what, int64_t *out) {
    if (!v || !is_intlike(v))
        return dsp_tmpl_fail(r->line, "%s: expected an integer argument, got %s", what, v ? dsp_tmpl_type_name(v) : "nothing");
    *out = num_i(v);
    return DSP_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* text conversions: Python str(), repr(), json.dumps() */

/* Python float repr: shortest round-trip digits; fixed notation for 1e-4 <= |x| < 1e16 */
static void float_repr(double x, char *out, size_t on) {
    if (isnan(x)) { snprintf(out, on, "nan"); return; }
    if (isinf(x)) { snprintf(out, on, x < 0 ? "-inf" : "inf"); return; }
    if (x == 0) { snprintf(out, on, signbit(x) ? "-0.0" : "0.0"); return; }
    char buf[64];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, x);
        if (strtod(buf, NULL) == x) break;
    }
    /* buf = [-]d.ddde[+-]XX */
    char digits[32];
    int nd = 0;
    const char *p = buf;
    bool neg = false;
    if (*p == '-') { neg = true; p++; }
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    char *o = out;
    size_t left = on;
#define EMIT(...)                                                                               \
    do {                                                                                        \
        int _w = snprintf(o, left, __VA_ARGS__);                                                \
        if (_w < 0 || (size_t)_w >= left) return;                                               \
        o += _w;                                                                                \
        left -= (size_t)_w;                                                                     \
    } while (0)
    if (neg) EMIT("-");
    if (exp < -4 || exp >= 16) {
        EMIT("%c", digits[0]);
        if (nd > 1) EMIT(".%s", digits + 1);
        EMIT("e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (exp < 0) {
        EMIT("0.");
        for (int i = 0; i < -exp - 1; i++) EMIT("0");
        EMIT("%s", digits);
    } else {
        for (int i = 0; i <= exp; i++) EMIT("%c", i < nd ? digits[i] : '0');
        EMIT(".");
        if (nd > exp + 1) EMIT("%s", digits + exp + 1);
        else EMIT("0");
    }
#undef EMIT
}

static dsp_status put_repr(rt *r, sb *b, const tv *v, int depth);

dsp_status dsp_tmpl_put_str(rt *r, sb *b, const tv *v, int depth) {
    int line = r->line;
    char num[64];
    switch (v->t) {
    case V_UNDEF: return DSP_OK;
    case V_NONE: return sb_puts(b, "None", line);
    case V_BOOL: return sb_puts(b, v->u.b ? "True" : "False", line);
    case V_INT: snprintf(num, sizeof num, "%" PRId64, v->u.i); return sb_puts(b, num, line);
    case V_FLOAT: float_repr(v->u.f, num, sizeof num); return sb_puts(b, num, line);
    case V_STR: return sb_put(b, v->u.s.p, v->u.s.n, line);
    default: return put_repr(r, b, v, depth);
    }
}

static dsp_status put_str_repr(sb *b, const char *s, size_t n, int line) {
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    TRY(sb_putc(b, q, line));
    for (size_t i = 0; i < n;) {
        size_t l;
        uint32_t c = dsp_utf8_decode(s + i, n - i, &l);
        char e[16];
        if (c == (uint32_t)q || c == '\\') {
            e[0] = '\\';
            e[1] = (char)c;
            TRY(sb_put(b, e, 2, line));
        } else if (c == '\n') TRY(sb_puts(b, "\\n", line));
        else if (c == '\r') TRY(sb_puts(b, "\\r", line));
        else if (c == '\t') TRY(sb_puts(b, "\\t", line));
        else if (c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0xa0) || c == 0xad) {
            snprintf(e, sizeof e, "\\x%02x", c);
            TRY(sb_puts(b, e, line));
        } else if (c == 0x1680 || (c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) ||
                   (c >= 0x205f && c <= 0x206f) || c == 0x3000 || c == 0xfeff ||
                   (c >= 0xfff9 && c <= 0xfffb) || (c >= 0xe000 && c <= 0xf8ff)) {
            snprintf(e, sizeof e, "\\u%04x", c);
            TRY(sb_puts(b, e, line));
        } else {
            TRY(sb_put(b, s + i, l, line));
        }
        i += l;
    }
    return sb_putc(b, q, line);
}

static dsp_status put_repr(rt *r, sb *b, const tv *v, int depth) {
    int line = r->line;
    if (depth > 200) return dsp_tmpl_fail(line, "value nested too deeply to print");
    switch (v->t) {
    case V_UNDEF: return dsp_tmpl_fail(line, "cannot print an Undefined value inside a container");
    case V_STR: return put_str_repr(b, v->u.s.p, v->u.s.n, line);
    case V_LIST: {
        if (v->fl != L_LIST && v->fl != L_TUPLE)
            return dsp_tmpl_fail(line, "cannot print a %s object (Python would print its repr)", dsp_tmpl_type_name(v));
        bool tup = v->fl == L_TUPLE;
        TRY(sb_putc(b, tup ? '(' : '[', line));
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i) TRY(sb_puts(b, ", ", line));
            TRY(put_repr(r, b, &v->u.l->v[i], depth + 1));
        }
        if (tup && v->u.l->n == 1) TRY(sb_putc(b, ',', line));
        return sb_putc(b, tup ? ')' : ']', line);
    }
    case V_DICT: case V_NS: {
        if (v->t == V_NS) TRY(sb_puts(b, "<Namespace ", line));
        TRY(sb_putc(b, '{', line));
        for (size_t i = 0; i < v->u.d->n; i++) {
            if (i) TRY(sb_puts(b, ", ", line));
            TRY(put_repr(r, b, &v->u.d->k[i], depth + 1));
            TRY(sb_puts(b, ": ", line));
            TRY(put_repr(r, b, &v->u.d->v[i], depth + 1));
        }
        TRY(sb_putc(b, '}', line));
        if (v->t == V_NS) TRY(sb_putc(b, '>', line));
        return DSP_OK;
    }
    case V_MACRO: case V_FUNC: case V_METHOD: case V_LOOP:
        return dsp_tmpl_fail(line, "cannot print a %s object (Python would print its repr)", dsp_tmpl_type_name(v));
    default: return dsp_tmpl_put_str(r, b, v, depth);
    }
}

static dsp_status put_json_str(sb *b, const char *s, size_t n, bool ascii, int line) {
    TRY(sb_putc(b, '"', line));
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && (unsigned char)s[j] >= 0x20 && s[j] != '"' && s[j] != '\\' &&
               !(ascii && (unsigned char)s[j] >= 0x80))
            j++;
        TRY(sb_put(b, s + i, j - i, line));
        if (j >= n) break;
        unsigned char c = (unsigned char)s[j];
        char e[16];
        if (c == '"') TRY(sb_puts(b, "\\\"", line));
        else if (c == '\\') TRY(sb_puts(b, "\\\\", line));
        else if (c == '\n') TRY(sb_puts(b, "\\n", line));
        else if (c == '\r') TRY(sb_puts(b, "\\r", line));
        else if (c == '\t') TRY(sb_puts(b, "\\t", line));
        else if (c == '\b') TRY(sb_puts(b, "\\b", line));
        else if (c == '\f') TRY(sb_puts(b, "\\f", line));
        else if (c < 0x20) {
            snprintf(e, sizeof e, "\\u%04x", c);
            TRY(sb_puts(b, e, line));
        } else { /* non-ASCII with ensure_ascii */
            size_t l;
            uint32_t cp = dsp_utf8_decode(s + j, n - j, &l);
            if (cp >= 0x10000) {
                uint32_t v = cp - 0x10000;
                snprintf(e, sizeof e, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
            } else {
                snprintf(e, sizeof e, "\\u%04x", cp);
            }
            TRY(sb_puts(b, e, line));
            j += l - 1;
        }
        i = j + 1;
    }
    return sb_putc(b, '"', line);
}

dsp_status dsp_tmpl_put_json(rt *r, sb *b, const tv *v, const jopts *o, int level);

static dsp_status json_newline(sb *b, const jopts *o, int level, int line) {
    TRY(sb_putc(b, '\n', line));
    for (int i = 0; i < level; i++) TRY(sb_put(b, o->indent, o->indent_n, line));
    return DSP_OK;
}

static dsp_status put_json_key(rt *r, sb *b, const tv *k, const jopts *o) {
    int line = r->line;
    char num[64];
    switch (k->t) {
    case V_STR: return put_json_str(b, k->u.s.p, k->u.s.n, o->ensure_ascii, line);
    case V_BOOL: return put_json_str(b, k->u.b ? "true" : "false", k->u.b ? 4 : 5, false, line);
    case V_NONE: return put_json_str(b, "null", 4, false, line);
    case V_INT:
        snprintf(num, sizeof num, "%" PRId64, k->u.i);
        return put_json_str(b, num, strlen(num), false, line);
    case V_FLOAT:
        float_repr(k->u.f, num, sizeof num);
        return put_json_str(b, num, strlen(num), false, line);
    default:
        return dsp_tmpl_fail(line, "tojson: keys must be str, int, float, bool or None, not %s", dsp_tmpl_type_name(k));
    }
}

static int key_cmp_for_sort(const tv *a, const tv *b) {
    if (a->t == V_STR && b->t == V_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int c = memcmp(a->u.s.p, b->u.s.p, n);
        return c ? c : (a->u.s.n > b->u.s.n) - (a->u.s.n < b->u.s.n);
    }
    return 0;
}

dsp_status dsp_tmpl_put_json(rt *r, sb *b, const tv *v, const jopts *o, int level) {
    int line = r->line;
    char num[64];
    if (level > 200) return dsp_tmpl_fail(line, "tojson: value nested too deeply");
    switch (v->t) {
    case V_NONE: return sb_puts(b, "null", line);
    case V_BOOL: return sb_puts(b, v->u.b ? "true" : "false", line);
    case V_INT: snprintf(num, sizeof num, "%" PRId64, v->u.i); return sb_puts(b, num, line);
    case V_FLOAT:
        if (isnan(v->u.f)) return sb_puts(b, "NaN", line);
        if (isinf(v->u.f)) return sb_puts(b, v->u.f < 0 ? "-Infinity" : "Infinity", line);
        float_repr(v->u.f, num, sizeof num);
        return sb_puts(b, num, line);
    case V_STR: return put_json_str(b, v->u.s.p, v->u.s.n, o->ensure_ascii, line);
    case V_LIST: {
        if (v->fl != L_LIST && v->fl != L_TUPLE)
            return dsp_tmpl_fail(line, "tojson: Object of type %s is not JSON serializable", dsp_tmpl_type_name(v));
        if (!v->u.l->n) return sb_puts(b, "[]", line);
        TRY(sb_putc(b, '[', line));
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i) TRY(sb_put(b, o->item_sep, o->item_sep_n, line));
            if (o->indent) TRY(json_newline(b, o, level + 1, line));
            TRY(dsp_tmpl_put_json(r, b, &v->u.l->v[i], o, level + 1));
        }
        if (o->indent) TRY(json_newline(b, o, level, line));
        return sb_putc(b, ']', line);
    }
    case V_DICT: {
        tdict *d = v->u.d;
        if (!d->n) return sb_puts(b, "{}", line);
        size_t *idx = ralloc(r, d->n * sizeof *idx);
        if (!idx) return dsp_tmpl_oom(line);
        for (size_t i = 0; i < d->n; i++) idx[i] = i;
        if (o->sort_keys) { /* insertion sort: stable, dicts are small */
            for (size_t i = 0; i < d->n; i++)
                if (d->k[i].t != V_STR)
                    return dsp_tmpl_fail(line, "tojson: sort_keys needs string keys");
            for (size_t i = 1; i < d->n; i++) {
                size_t x = idx[i], j = i;
                while (j > 0 && key_cmp_for_sort(&d->k[idx[j - 1]], &d->k[x]) > 0) {
                    idx[j] = idx[j - 1];
                    j--;
                }
                idx[j] = x;
            }
        }
        TRY(sb_putc(b, '{', line));
        for (size_t i = 0; i < d->n; i++) {
            if (i) TRY(sb_put(b, o->item_sep, o->item_sep_n, line));
            if (o->indent) TRY(json_newline(b, o, level + 1, line));
            TRY(put_json_key(r, b, &d->k[idx[i]], o));
            TRY(sb_put(b, o->key_sep, o->key_sep_n, line));
            TRY(dsp_tmpl_put_json(r, b, &d->v[idx[i]], o, level + 1));
        }
        if (o->indent) TRY(json_newline(b, o, level, line));
        return sb_putc(b, '}', line);
    }
    default:
        return dsp_tmpl_fail(line, "tojson: Object of type %s is not JSON serializable", dsp_tmpl_type_name(v));
    }
}

/* str(v) as a new string value */
dsp_status dsp_tmpl_to_str(rt *r, const tv *v, tv *out) {
    if (v->t == V_STR) {
        *out = *v;
        return DSP_OK;
    }
    sb b = sb_new(r);
    dsp_status st = dsp_tmpl_put_str(r, &b, v, 0);
    if (st) {
        sb_free(&b);
        return st;
    }
    return dsp_tmpl_sb_to_str(r, &b, out);
}

/* ------------------------------------------------------------------------------------------ */
/* JSON context -> values */

dsp_status dsp_tmpl_from_json(rt *r, const json_t *j, tv *out, int depth) {
    if (depth > 256) return dsp_tmpl_fail(0, "context JSON nested too deeply");
    switch (json_typeof(j)) {
    case JSON_NULL: *out = mk_none(); return DSP_OK;
    case JSON_TRUE: *out = mk_bool(true); return DSP_OK;
    case JSON_FALSE: *out = mk_bool(false); return DSP_OK;
    case JSON_INTEGER: *out = mk_int((int64_t)json_integer_value(j)); return DSP_OK;
    case JSON_REAL: *out = mk_float(json_real_value(j)); return DSP_OK;
    case JSON_STRING: {
        size_t n = json_string_length(j);
        const char *s = json_string_value(j);
        if (!dsp_utf8_valid(s, n)) return dsp_tmpl_fail(0, "context JSON: string is not valid UTF-8");
        *out = mk_str(s, n); /* the JSON outlives the render */
        return DSP_OK;
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        tlist *l = dsp_tmpl_list_new(r, n);
        if (!l) return dsp_tmpl_oom(0);
        for (size_t i = 0; i < n; i++) {
            TRY(dsp_tmpl_from_json(r, json_array_get(j, i), &l->v[i], depth + 1));
            l->n++;
        }
        *out = mk_list(l, L_LIST);
        return DSP_OK;
    }
    case JSON_OBJECT: {
        tdict *d = dict_new(r);
        if (!d) return dsp_tmpl_oom(0);
        size_t n = json_object_size(j);
        d->k = ralloc(r, (n ? n : 1) * sizeof(tv));
        d->v = ralloc(r, (n ? n : 1) * sizeof(tv));
        if (!d->k || !d->v) return dsp_tmpl_oom(0);
        d->cap = n;
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)j, key, val) {
            if (d->n >= d->cap) break;
            d->k[d->n] = mk_str(key, strlen(key));
            TRY(dsp_tmpl_from_json(r, val, &d->v[d->n], depth + 1));
            d->n++;
        }
        out->t = V_DICT;
        out->fl = 0;
        out->u.d = d;
        return DSP_OK;
    }
    }
    return dsp_tmpl_fail(0, "context JSON: unexpected value");
}

/* ------------------------------------------------------------------------------------------ */
/* strings */

dsp_status dsp_tmpl_new_str(rt *r, const char *a, size_t an, const char *b, size_t bn, tv *out) {
    if (an + bn > r->t->lim.max_output)
        return dsp_tmpl_fail(r->line, "string longer than %zu bytes (dsp_tmpl_limits.max_output)", r->t->lim.max_output);
    char *p = ralloc(r, an + bn + 1);
    if (!p) return dsp_tmpl_oom(r->line);
    if (an) memcpy(p, a, an);
    if (bn) memcpy(p + an, b, bn);
    *out = mk_str(p, an + bn);
    return DSP_OK;
}

/* markupsafe.escape */
dsp_status dsp_tmpl_html_escape(rt *r, const tv *s, tv *out) {
    sb b = sb_new(r);
    for (size_t i = 0; i < s->u.s.n; i++) {
        char c = s->u.s.p[i];
        dsp_status st;
        switch (c) {
        case '&': st = sb_puts(&b, "&amp;", r->line); break;
        case '<': st = sb_puts(&b, "&lt;", r->line); break;
        case '>': st = sb_puts(&b, "&gt;", r->line); break;
        case '"': st = sb_puts(&b, "&#34;", r->line); break;
        case '\'': st = sb_puts(&b, "&#39;", r->line); break;
        default: st = sb_putc(&b, c, r->line);
        }
        if (st) {
            sb_free(&b);
            return st;
        }
    }
    TRY(dsp_tmpl_sb_to_str(r, &b, out));
    out->fl = 1;
    return DSP_OK;
}

/* lower/upper/title/capitalize; refuses characters whose mapping it does not know */
dsp_status dsp_tmpl_str_case(rt *r, const tv *s, case_mode mode, tv *out) {
    char *p = ralloc(r, s->u.s.n + 1);
    if (!p) return dsp_tmpl_oom(r->line);
    size_t k = 0;
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < s->u.s.n;) {
        size_t l;
        uint32_t c = dsp_utf8_decode(s->u.s.p + i, s->u.s.n - i, &l);
        if (!dsp_tmpl_cp_case_known(c))
            return dsp_tmpl_fail(r->line, "case conversion of U+%04X is not supported", c);
        uint32_t o = c;
        switch (mode) {
        case CASE_LOWER: o = dsp_tmpl_cp_lower(c); break;
        case CASE_UPPER: o = dsp_tmpl_cp_upper(c); break;
        case CASE_CAPITALIZE: o = first ? dsp_tmpl_cp_upper(c) : dsp_tmpl_cp_lower(c); break;
        case CASE_TITLE_PY:
            o = prev_cased ? dsp_tmpl_cp_lower(c) : dsp_tmpl_cp_upper(c);
            prev_cased = dsp_tmpl_cp_is_alpha(c);
            break;
        case CASE_TITLE_JINJA: {
            /* words begin after '-', whitespace, '(', '{', '[', '<' */
            o = prev_cased ? dsp_tmpl_cp_lower(c) : dsp_tmpl_cp_upper(c);
            bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || dsp_tmpl_py_space_cp(c);
            prev_cased = !sep;
            break;
        }
        }
        first = false;
        k += dsp_utf8_encode(o, p + k);
        i += l;
    }
    *out = mk_str(p, k);
    return DSP_OK;
}

/* set of code points for strip(chars) */
static bool in_chars(const tv *chars, uint32_t c) {
    for (size_t i = 0; i < chars->u.s.n;) {
        size_t l;
        if (dsp_utf8_decode(chars->u.s.p + i, chars->u.s.n - i, &l) == c) return true;
        i += l;
    }
    return false;
}
/* which: 1 left, 2 right, 3 both; chars NULL/None = whitespace */
dsp_status dsp_tmpl_str_strip(rt *r, const tv *s, const tv *chars, int which, tv *out) {
    if (chars && chars->t != V_NONE && chars->t != V_STR)
        return dsp_tmpl_fail(r->line, "strip arg must be None or str");
    bool ws = !chars || chars->t == V_NONE;
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, b = 0;
    if (which & 1)
        while (b < n) {
            size_t l;
            uint32_t c = dsp_utf8_decode(p + b, n - b, &l);
            if (ws ? !dsp_tmpl_py_space_cp(c) : !in_chars(chars, c)) break;
            b += l;
        }
    if (which & 2)
        while (n > b) {
            size_t i = dsp_utf8_prev(p, n), l;
            uint32_t c = dsp_utf8_decode(p + i, n - i, &l);
            if (ws ? !dsp_tmpl_py_space_cp(c) : !in_chars(chars, c)) break;
            n = i;
        }
    *out = mk_str(p + b, n - b);
    out->fl = s->fl;
    return DSP_OK;
}

static const char *memfind(const char *h, size_t hn, const char *n, size_t nn) {
    if (!nn) return h;
    if (nn > hn) return NULL;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == n[0] && !memcmp(h + i, n, nn)) return h + i;
    return NULL;
}

dsp_status dsp_tmpl_str_replace(rt *r, const tv *s, const tv *old, const tv *new_, int64_t count, tv *out) {
    sb b = sb_new(r);
    const char *p = s->u.s.p, *end = p + s->u.s.n;
    int64_t done = 0;
    dsp_status st = DSP_OK;
    if (!old->u.s.n) { /* Python inserts `new` between every character */
        size_t i = 0;
        while ((count < 0 || done < count) && !st) {
            st = sb_put(&b, new_->u.s.p, new_->u.s.n, r->line);
            done++;
            if (i >= s->u.s.n) break;
            size_t l = dsp_utf8_len((unsigned char)p[i]);
            if (!st) st = sb_put(&b, p + i, l, r->line);
            i += l;
        }
        if (!st && i < s->u.s.n) st = sb_put(&b, p + i, s->u.s.n - i, r->line);
    } else {
        while (!st) {
            const char *f = (count < 0 || done < count) ? memfind(p, (size_t)(end - p), old->u.s.p, old->u.s.n) : NULL;
            if (!f) {
                st = sb_put(&b, p, (size_t)(end - p), r->line);
                break;
            }
            st = sb_put(&b, p, (size_t)(f - p), r->line);
            if (!st) st = sb_put(&b, new_->u.s.p, new_->u.s.n, r->line);
            p = f + old->u.s.n;
            done++;
        }
    }
    if (st) {
        sb_free(&b);
        return st;
    }
    return dsp_tmpl_sb_to_str(r, &b, out);
}

dsp_status dsp_tmpl_str_split(rt *r, const tv *s, const tv *sep, int64_t maxsplit, tv *out) {
    tlist *l = dsp_tmpl_list_new(r, 0);
    if (!l) return dsp_tmpl_oom(r->line);
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    if (!sep || sep->t == V_NONE) {
        size_t i = 0;
        int64_t splits = 0;
        for (;;) {
            size_t w;
            while (i < n && (w = dsp_tmpl_py_space_at(p + i, n - i)) > 0) i += w;
            if (i >= n) break;
            if (maxsplit >= 0 && splits >= maxsplit) {
                size_t e = dsp_tmpl_py_rstrip_len(p, n);
                TRY(dsp_tmpl_list_push(r, l, mk_str(p + i, e - i)));
                break;
            }
            size_t j = i;
            while (j < n && !dsp_tmpl_py_space_at(p + j, n - j)) j += dsp_utf8_len((unsigned char)p[j]);
            TRY(dsp_tmpl_list_push(r, l, mk_str(p + i, j - i)));
            splits++;
            i = j;
        }
    } else {
        if (sep->t != V_STR) return dsp_tmpl_fail(r->line, "split: separator must be a string");
        if (!sep->u.s.n) return dsp_tmpl_fail(r->line, "split: empty separator");
        const char *q = p, *end = p + n;
        int64_t splits = 0;
        for (;;) {
            const char *f = (maxsplit < 0 || splits < maxsplit) ? memfind(q, (size_t)(end - q), sep->u.s.p, sep->u.s.n) : NULL;
            if (!f) {
                TRY(dsp_tmpl_list_push(r, l, mk_str(q, (size_t)(end - q))));
                break;
            }
            TRY(dsp_tmpl_list_push(r, l, mk_str(q, (size_t)(f - q))));
            splits++;
            q = f + sep->u.s.n;
        }
    }
    *out = mk_list(l, L_LIST);
    return DSP_OK;
}

dsp_status dsp_tmpl_affix_match(rt *r, const tv *s, const tv *a, bool end, bool *res) {
    if (a->t == V_LIST && a->fl == L_TUPLE) {
        *res = false;
        for (size_t i = 0; i < a->u.l->n && !*res; i++) TRY(dsp_tmpl_affix_match(r, s, &a->u.l->v[i], end, res));
        return DSP_OK;
    }
    TRY(dsp_tmpl_need_str(r, a, end ? "endswith" : "startswith"));
    size_t n = a->u.s.n;
    *res = n <= s->u.s.n && !memcmp(s->u.s.p + (end ? s->u.s.n - n : 0), a->u.s.p, n);
    return DSP_OK;
}
