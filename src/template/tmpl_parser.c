/* template/tmpl_parser: tokens -> tree, by recursive descent following jinja2's grammar and
 * operator precedence. Unknown tags, filters and tests are rejected here, as jinja2 rejects them
 * at compile time. See tmpl_internal.h. */
#include "template/tmpl_internal.h"

#include <stdio.h>

typedef struct nvec {
    node **v;
    size_t n, cap;
} nvec;

typedef struct ps {
    token *tk;
    size_t i, n;
    dsp_arena *ar;
    int depth, max_depth;
    int loops; /* enclosing for-loops (reset inside macros) for break/continue */
} ps;

static dsp_status pnomem(void) { return dsp_error(DSP_ERR_NOMEM, "template: out of memory"); }

static node *nn(ps *P, int k, int line) {
    node *x = dsp_arena_alloc(P->ar, sizeof *x);
    if (x) {
        x->k = (uint8_t)k;
        x->line = line;
    }
    return x;
}
static dsp_status nv_push(ps *P, nvec *v, node *x) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        node **p = dsp_arena_alloc(P->ar, cap * sizeof *p);
        if (!p) return pnomem();
        if (v->n) memcpy(p, v->v, v->n * sizeof *p);
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return DSP_OK;
}
static dsp_status kw_push(ps *P, const char ***kw, size_t *n, size_t *cap, const char *s) {
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 4;
        const char **p = dsp_arena_alloc(P->ar, c * sizeof *p);
        if (!p) return pnomem();
        if (*n) memcpy(p, *kw, *n * sizeof *p);
        *kw = p;
        *cap = c;
    }
    (*kw)[(*n)++] = s;
    return DSP_OK;
}

static token *cur(ps *P) { return &P->tk[P->i]; }
static token *look(ps *P) { return &P->tk[P->i + 1 < P->n ? P->i + 1 : P->i]; }
static void adv(ps *P) { if (P->i + 1 < P->n) P->i++; }
static bool t_op(const token *t, int op) { return t->type == T_OP && t->op == op; }
static bool t_name(const token *t, const char *s) {
    return t->type == T_NAME && t->n == strlen(s) && !memcmp(t->p, s, t->n);
}

static const char *tok_desc(const token *t, char *buf, size_t bn) {
    switch (t->type) {
    case T_EOF: return "end of template";
    case T_DATA: return "template data";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "end of print statement '}}'";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "end of statement block '%}'";
    case T_NAME: snprintf(buf, bn, "'%.*s'", (int)(t->n > 60 ? 60 : t->n), t->p); return buf;
    case T_STRING: return "string literal";
    case T_INT: return "integer";
    case T_FLOAT: return "float";
    default: snprintf(buf, bn, "'%s'", dsp_tmpl_op_text(t->op)); return buf;
    }
}
static dsp_status unexpected(ps *P, const char *wanted) {
    char b[96];
    return dsp_tmpl_fail(cur(P)->line, "expected %s, got %s", wanted, tok_desc(cur(P), b, sizeof b));
}
static dsp_status expect_op(ps *P, int op) {
    if (!t_op(cur(P), op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", dsp_tmpl_op_text(op));
        return unexpected(P, w);
    }
    adv(P);
    return DSP_OK;
}
static dsp_status expect_type(ps *P, int type, const char *what) {
    if (cur(P)->type != type) return unexpected(P, what);
    adv(P);
    return DSP_OK;
}
static dsp_status take_name(ps *P, const char **out) {
    token *t = cur(P);
    if (t->type != T_NAME) return unexpected(P, "a name");
    char *s = dsp_arena_strndup(P->ar, t->p, t->n);
    if (!s) return pnomem();
    *out = s;
    adv(P);
    return DSP_OK;
}
static dsp_status enter(ps *P) {
    if (++P->depth > P->max_depth)
        return dsp_tmpl_fail(cur(P)->line, "template nested too deeply (more than %d levels)", P->max_depth);
    return DSP_OK;
}

static dsp_status p_expr(ps *P, bool condexpr, node **out);
static dsp_status p_or(ps *P, node **out);
static dsp_status p_tuple(ps *P, bool condexpr, bool explicit_parens, const char *extra_end, node **out);
static dsp_status p_unary(ps *P, bool with_filter, node **out);
static dsp_status p_primary(ps *P, node **out);
static dsp_status p_postfix(ps *P, node **x);

static dsp_status p_call_args(ps *P, node *call) {
    TRY(expect_op(P, OP_LPAREN));
    nvec pos = {0}, kwv = {0};
    size_t kwcap = 0;
    bool comma = false;
    while (!t_op(cur(P), OP_RPAREN)) {
        if (comma) {
            TRY(expect_op(P, OP_COMMA));
            if (t_op(cur(P), OP_RPAREN)) break;
        }
        if (t_op(cur(P), OP_MUL) || t_op(cur(P), OP_POW))
            return dsp_tmpl_fail(cur(P)->line, "unsupported: *args / **kwargs in a call");
        if (cur(P)->type == T_NAME && t_op(look(P), OP_ASSIGN)) {
            const char *k = NULL;
            TRY(take_name(P, &k));
            adv(P);
            node *v = NULL;
            TRY(p_expr(P, true, &v));
            TRY(kw_push(P, &call->kw, &call->nkw, &kwcap, k));
            TRY(nv_push(P, &kwv, v));
        } else {
            if (kwv.n) return dsp_tmpl_fail(cur(P)->line, "positional argument after keyword argument");
            node *v = NULL;
            TRY(p_expr(P, true, &v));
            TRY(nv_push(P, &pos, v));
        }
        comma = true;
    }
    adv(P);
    call->v = pos.v;
    call->nv = pos.n;
    call->v2 = kwv.v;
    call->nv2 = kwv.n;
    return DSP_OK;
}

static dsp_status p_dotted_name(ps *P, const char **out) {
    token *t = cur(P);
    if (t->type != T_NAME) return unexpected(P, "a name");
    char buf[128];
    size_t n = 0;
    for (;;) {
        t = cur(P);
        if (n + t->n + 2 > sizeof buf) return dsp_tmpl_fail(t->line, "name too long");
        memcpy(buf + n, t->p, t->n);
        n += t->n;
        adv(P);
        if (t_op(cur(P), OP_DOT) && look(P)->type == T_NAME) {
            buf[n++] = '.';
            adv(P);
            continue;
        }
        break;
    }
    char *s = dsp_arena_strndup(P->ar, buf, n);
    if (!s) return pnomem();
    *out = s;
    return DSP_OK;
}

/* x|f(args) */
static dsp_status p_filter(ps *P, node *operand, node **out) {
    int line = cur(P)->line;
    adv(P); /* | */
    node *f = nn(P, E_FILTER, line);
    if (!f) return pnomem();
    f->a = operand;
    TRY(p_dotted_name(P, &f->s));
    if (!dsp_tmpl_filter_known(f->s)) return dsp_tmpl_fail(line, "unknown or unsupported filter '%s'", f->s);
    if (t_op(cur(P), OP_LPAREN)) TRY(p_call_args(P, f));
    *out = f;
    return DSP_OK;
}

static dsp_status p_test(ps *P, node *operand, node **out) {
    int line = cur(P)->line;
    adv(P); /* is */
    node *t = nn(P, E_TEST, line);
    if (!t) return pnomem();
    t->a = operand;
    if (t_name(cur(P), "not")) {
        t->neg = true;
        adv(P);
    }
    TRY(p_dotted_name(P, &t->s));
    if (!dsp_tmpl_test_known(t->s)) return dsp_tmpl_fail(line, "unknown or unsupported test '%s'", t->s);
    token *c = cur(P);
    if (t_op(c, OP_LPAREN)) {
        TRY(p_call_args(P, t));
    } else if ((c->type == T_NAME || c->type == T_STRING || c->type == T_INT || c->type == T_FLOAT ||
                t_op(c, OP_LBRACKET) || t_op(c, OP_LBRACE)) &&
               !t_name(c, "else") && !t_name(c, "or") && !t_name(c, "and")) {
        if (t_name(c, "is")) return dsp_tmpl_fail(c->line, "you cannot chain multiple tests with is");
        node *arg = NULL;
        TRY(p_primary(P, &arg));
        TRY(p_postfix(P, &arg));
        node **v = dsp_arena_alloc(P->ar, sizeof *v);
        if (!v) return pnomem();
        v[0] = arg;
        t->v = v;
        t->nv = 1;
    }
    *out = t;
    return DSP_OK;
}

static dsp_status p_subscribed(ps *P, node **out) {
    int line = cur(P)->line;
    node *parts[3] = {NULL, NULL, NULL};
    if (t_op(cur(P), OP_COLON)) {
        adv(P);
    } else {
        node *x = NULL;
        TRY(p_expr(P, true, &x));
        if (!t_op(cur(P), OP_COLON)) {
            *out = x;
            return DSP_OK;
        }
        adv(P);
        parts[0] = x;
    }
    if (!t_op(cur(P), OP_COLON) && !t_op(cur(P), OP_RBRACKET) && !t_op(cur(P), OP_COMMA))
        TRY(p_expr(P, true, &parts[1]));
    if (t_op(cur(P), OP_COLON)) {
        adv(P);
        if (!t_op(cur(P), OP_RBRACKET) && !t_op(cur(P), OP_COMMA)) TRY(p_expr(P, true, &parts[2]));
    }
    node *s = nn(P, E_SLICE, line);
    if (!s) return pnomem();
    s->a = parts[0];
    s->b = parts[1];
    s->c = parts[2];
    *out = s;
    return DSP_OK;
}

/* *x(args...): a call of *x, which becomes the call node */
static dsp_status p_call(ps *P, node **x, int line) {
    node *c = nn(P, E_CALL, line);
    if (!c) return pnomem();
    c->a = *x;
    TRY(p_call_args(P, c));
    *x = c;
    return DSP_OK;
}

static dsp_status p_postfix(ps *P, node **x) {
    for (;;) {
        token *t = cur(P);
        if (t_op(t, OP_DOT)) {
            adv(P);
            token *a = cur(P);
            node *g;
            if (a->type == T_NAME) {
                g = nn(P, E_ATTR, t->line);
                if (!g) return pnomem();
                TRY(take_name(P, &g->s));
            } else if (a->type == T_INT) {
                g = nn(P, E_ITEM, t->line);
                node *k = nn(P, E_CONST, t->line);
                if (!g || !k) return pnomem();
                k->cv = mk_int(a->i);
                g->b = k;
                adv(P);
            } else {
                return unexpected(P, "an attribute name");
            }
            g->a = *x;
            *x = g;
        } else if (t_op(t, OP_LBRACKET)) {
            adv(P);
            nvec subs = {0};
            while (!t_op(cur(P), OP_RBRACKET)) {
                if (subs.n) TRY(expect_op(P, OP_COMMA));
                node *s = NULL;
                TRY(p_subscribed(P, &s));
                TRY(nv_push(P, &subs, s));
            }
            adv(P);
            if (subs.n == 0) return dsp_tmpl_fail(t->line, "expected a subscript");
            node *idx = subs.v[0];
            if (subs.n > 1) {
                idx = nn(P, E_TUPLE, t->line);
                if (!idx) return pnomem();
                idx->v = subs.v;
                idx->nv = subs.n;
            }
            node *g = nn(P, idx->k == E_SLICE ? E_SLICE : E_ITEM, t->line);
            if (!g) return pnomem();
            if (idx->k == E_SLICE) *g = *idx;
            else g->b = idx;
            g->k = idx->k == E_SLICE ? E_SLICE : E_ITEM;
            if (g->k == E_SLICE) {
                /* E_SLICE keeps start/stop/step in a/b/c: move them, operand goes in v[0] */
                node **v = dsp_arena_alloc(P->ar, sizeof *v);
                if (!v) return pnomem();
                v[0] = *x;
                g->v = v;
                g->nv = 1;
            } else {
                g->a = *x;
            }
            *x = g;
        } else if (t_op(t, OP_LPAREN)) {
            TRY(p_call(P, x, t->line));
        } else {
            return DSP_OK;
        }
    }
}

static dsp_status p_filter_expr(ps *P, node **x) {
    for (;;) {
        token *t = cur(P);
        if (t_op(t, OP_PIPE)) {
            TRY(p_filter(P, *x, x));
        } else if (t_name(t, "is")) {
            TRY(p_test(P, *x, x));
        } else if (t_op(t, OP_LPAREN)) {
            TRY(p_call(P, x, t->line));
        } else {
            return DSP_OK;
        }
    }
}

static dsp_status p_primary(ps *P, node **out) {
    token *t = cur(P);
    TRY(enter(P));
    node *x = NULL;
    if (t->type == T_NAME) {
        x = nn(P, E_CONST, t->line);
        if (!x) return pnomem();
        if (t_name(t, "true") || t_name(t, "True")) x->cv = mk_bool(true);
        else if (t_name(t, "false") || t_name(t, "False")) x->cv = mk_bool(false);
        else if (t_name(t, "none") || t_name(t, "None")) x->cv = mk_none();
        else {
            x->k = E_NAME;
            TRY(take_name(P, &x->s));
            goto done;
        }
        adv(P);
    } else if (t->type == T_STRING) {
        /* adjacent literals concatenate */
        size_t total = 0, j = P->i;
        while (P->tk[j].type == T_STRING) total += P->tk[j++].n;
        char *s = dsp_arena_alloc(P->ar, total + 1);
        x = nn(P, E_CONST, t->line);
        if (!s || !x) return pnomem();
        size_t k = 0;
        while (cur(P)->type == T_STRING) {
            memcpy(s + k, cur(P)->p, cur(P)->n);
            k += cur(P)->n;
            adv(P);
        }
        s[k] = '\0';
        x->cv = mk_str(s, k);
    } else if (t->type == T_INT || t->type == T_FLOAT) {
        x = nn(P, E_CONST, t->line);
        if (!x) return pnomem();
        x->cv = t->type == T_INT ? mk_int(t->i) : mk_float(t->f);
        adv(P);
    } else if (t_op(t, OP_LPAREN)) {
        adv(P);
        TRY(p_tuple(P, true, true, NULL, &x));
        TRY(expect_op(P, OP_RPAREN));
    } else if (t_op(t, OP_LBRACKET)) {
        adv(P);
        nvec items = {0};
        while (!t_op(cur(P), OP_RBRACKET)) {
            if (items.n) TRY(expect_op(P, OP_COMMA));
            if (t_op(cur(P), OP_RBRACKET)) break;
            node *it = NULL;
            TRY(p_expr(P, true, &it));
            TRY(nv_push(P, &items, it));
        }
        adv(P);
        x = nn(P, E_LIST, t->line);
        if (!x) return pnomem();
        x->v = items.v;
        x->nv = items.n;
    } else if (t_op(t, OP_LBRACE)) {
        adv(P);
        nvec keys = {0}, vals = {0};
        while (!t_op(cur(P), OP_RBRACE)) {
            if (keys.n) TRY(expect_op(P, OP_COMMA));
            if (t_op(cur(P), OP_RBRACE)) break;
            node *k, *v;
            TRY(p_expr(P, true, &k));
            TRY(expect_op(P, OP_COLON));
            TRY(p_expr(P, true, &v));
            TRY(nv_push(P, &keys, k));
            TRY(nv_push(P, &vals, v));
        }
        adv(P);
        x = nn(P, E_DICT, t->line);
        if (!x) return pnomem();
        x->v = keys.v;
        x->nv = keys.n;
        x->v2 = vals.v;
        x->nv2 = vals.n;
    } else {
        return unexpected(P, "an expression");
    }
done:
    P->depth--;
    *out = x;
    return DSP_OK;
}

static dsp_status p_unary(ps *P, bool with_filter, node **out) {
    token *t = cur(P);
    node *x = NULL;
    TRY(enter(P));
    if (t_op(t, OP_SUB) || t_op(t, OP_ADD)) {
        adv(P);
        node *o = NULL;
        TRY(p_unary(P, false, &o));
        x = nn(P, t_op(t, OP_SUB) ? E_NEG : E_POS, t->line);
        if (!x) return pnomem();
        x->a = o;
    } else {
        TRY(p_primary(P, &x));
    }
    TRY(p_postfix(P, &x));
    if (with_filter) TRY(p_filter_expr(P, &x));
    P->depth--;
    *out = x;
    return DSP_OK;
}

static dsp_status mk_bin(ps *P, int op, int line, node *l, node *r, node **out) {
    node *x = nn(P, E_BIN, line);
    if (!x) return pnomem();
    x->op = (uint8_t)op;
    x->a = l;
    x->b = r;
    *out = x;
    return DSP_OK;
}

static dsp_status p_pow(ps *P, node **out) {
    node *l = NULL;
    TRY(p_unary(P, true, &l));
    while (t_op(cur(P), OP_POW)) {
        int line = cur(P)->line;
        adv(P);
        node *r = NULL;
        TRY(p_unary(P, true, &r));
        TRY(mk_bin(P, OP_POW, line, l, r, &l));
    }
    *out = l;
    return DSP_OK;
}
static dsp_status p_math2(ps *P, node **out) {
    node *l = NULL;
    TRY(p_pow(P, &l));
    for (;;) {
        token *t = cur(P);
        if (!(t_op(t, OP_MUL) || t_op(t, OP_DIV) || t_op(t, OP_FLOORDIV) || t_op(t, OP_MOD))) break;
        int op = t->op, line = t->line;
        adv(P);
        node *r = NULL;
        TRY(p_pow(P, &r));
        TRY(mk_bin(P, op, line, l, r, &l));
    }
    *out = l;
    return DSP_OK;
}
static dsp_status p_concat(ps *P, node **out) {
    node *first = NULL;
    TRY(p_math2(P, &first));
    if (!t_op(cur(P), OP_TILDE)) {
        *out = first;
        return DSP_OK;
    }
    nvec items = {0};
    TRY(nv_push(P, &items, first));
    int line = cur(P)->line;
    while (t_op(cur(P), OP_TILDE)) {
        adv(P);
        node *r = NULL;
        TRY(p_math2(P, &r));
        TRY(nv_push(P, &items, r));
    }
    node *x = nn(P, E_CONCAT, line);
    if (!x) return pnomem();
    x->v = items.v;
    x->nv = items.n;
    *out = x;
    return DSP_OK;
}
static dsp_status p_math1(ps *P, node **out) {
    node *l = NULL;
    TRY(p_concat(P, &l));
    while (t_op(cur(P), OP_ADD) || t_op(cur(P), OP_SUB)) {
        int op = cur(P)->op, line = cur(P)->line;
        adv(P);
        node *r = NULL;
        TRY(p_concat(P, &r));
        TRY(mk_bin(P, op, line, l, r, &l));
    }
    *out = l;
    return DSP_OK;
}
static dsp_status p_compare(ps *P, node **out) {
    node *first = NULL;
    int line = cur(P)->line;
    TRY(p_math1(P, &first));
    nvec rhs = {0};
    uint8_t ops[64];
    size_t nops = 0;
    for (;;) {
        token *t = cur(P);
        int op;
        if (t->type == T_OP && (t->op == OP_EQ || t->op == OP_NE || t->op == OP_LT ||
                                t->op == OP_LTEQ || t->op == OP_GT || t->op == OP_GTEQ)) {
            op = t->op;
            adv(P);
        } else if (t_name(t, "in")) {
            op = OP_IN;
            adv(P);
        } else if (t_name(t, "not") && t_name(look(P), "in")) {
            op = OP_NOTIN;
            adv(P);
            adv(P);
        } else {
            break;
        }
        if (nops == sizeof ops) return dsp_tmpl_fail(t->line, "comparison chain too long");
        node *r = NULL;
        TRY(p_math1(P, &r));
        ops[nops++] = (uint8_t)op;
        TRY(nv_push(P, &rhs, r));
    }
    if (!nops) {
        *out = first;
        return DSP_OK;
    }
    node *x = nn(P, E_CMP, line);
    if (!x) return pnomem();
    x->a = first;
    x->v = rhs.v;
    x->nv = rhs.n;
    x->ops = dsp_arena_alloc(P->ar, nops);
    if (!x->ops) return pnomem();
    memcpy(x->ops, ops, nops);
    *out = x;
    return DSP_OK;
}
static dsp_status p_not(ps *P, node **out) {
    if (t_name(cur(P), "not")) {
        int line = cur(P)->line;
        adv(P);
        TRY(enter(P));
        node *o = NULL;
        TRY(p_not(P, &o));
        P->depth--;
        node *x = nn(P, E_NOT, line);
        if (!x) return pnomem();
        x->a = o;
        *out = x;
        return DSP_OK;
    }
    return p_compare(P, out);
}
/* left-associative `a KW b KW c ...` over operands parsed by sub */
static dsp_status p_logic(ps *P, node **out, dsp_status (*sub)(ps *, node **), const char *kw, int kind) {
    node *l = NULL;
    TRY(sub(P, &l));
    while (t_name(cur(P), kw)) {
        int line = cur(P)->line;
        adv(P);
        node *r = NULL;
        TRY(sub(P, &r));
        node *x = nn(P, kind, line);
        if (!x) return pnomem();
        x->a = l;
        x->b = r;
        l = x;
    }
    *out = l;
    return DSP_OK;
}
static dsp_status p_and(ps *P, node **out) { return p_logic(P, out, p_not, "and", E_AND); }
static dsp_status p_or(ps *P, node **out) { return p_logic(P, out, p_and, "or", E_OR); }
static dsp_status p_condexpr(ps *P, node **out) {
    node *x = NULL;
    TRY(p_or(P, &x));
    while (t_name(cur(P), "if")) {
        int line = cur(P)->line;
        adv(P);
        node *cond, *other = NULL;
        TRY(p_or(P, &cond));
        if (t_name(cur(P), "else")) {
            adv(P);
            TRY(enter(P));
            TRY(p_condexpr(P, &other));
            P->depth--;
        }
        node *c = nn(P, E_COND, line);
        if (!c) return pnomem();
        c->a = cond;
        c->b = x;
        c->c = other;
        x = c;
    }
    *out = x;
    return DSP_OK;
}
static dsp_status p_expr(ps *P, bool condexpr, node **out) {
    TRY(enter(P));
    TRY(condexpr ? p_condexpr(P, out) : p_or(P, out));
    P->depth--;
    return DSP_OK;
}
static dsp_status p_tuple(ps *P, bool condexpr, bool explicit_parens, const char *extra_end,
                          node **out) {
    nvec items = {0};
    bool is_tuple = false;
    int line = cur(P)->line;
    for (;;) {
        if (items.n) TRY(expect_op(P, OP_COMMA));
        token *t = cur(P);
        if (t->type == T_VAR_END || t->type == T_BLOCK_END || t_op(t, OP_RPAREN) ||
            (extra_end && t_name(t, extra_end)))
            break;
        node *x = NULL;
        TRY(p_expr(P, condexpr, &x));
        TRY(nv_push(P, &items, x));
        if (t_op(cur(P), OP_COMMA)) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (items.n) {
            *out = items.v[0];
            return DSP_OK;
        }
        if (!explicit_parens) return unexpected(P, "an expression");
    }
    node *x = nn(P, E_TUPLE, line);
    if (!x) return pnomem();
    x->v = items.v;
    x->nv = items.n;
    *out = x;
    return DSP_OK;
}

/* statements */

static dsp_status p_body(ps *P, const char *const *ends, nvec *body);

static dsp_status p_end_block(ps *P) { return expect_type(P, T_BLOCK_END, "end of statement block '%}'"); }

/* parse a body that must end with one of `ends`; on return the current token is that name */
static dsp_status p_block_body(ps *P, const char *const *ends, node ***v, size_t *nv) {
    nvec b = {0};
    TRY(enter(P));
    TRY(p_body(P, ends, &b));
    P->depth--;
    *v = b.v;
    *nv = b.n;
    return DSP_OK;
}

static dsp_status p_assign_target(ps *P, node *st, bool with_ns) {
    /* name | name.attr (namespace) | a, b | (a, b) */
    bool paren = false;
    if (t_op(cur(P), OP_LPAREN)) {
        paren = true;
        adv(P);
    }
    size_t cap = 0;
    const char *first = NULL;
    TRY(take_name(P, &first));
    if (!paren && with_ns && t_op(cur(P), OP_DOT)) {
        adv(P);
        st->s = first;
        return take_name(P, &st->s2);
    }
    TRY(kw_push(P, &st->kw, &st->nkw, &cap, first));
    while (t_op(cur(P), OP_COMMA)) {
        adv(P);
        if (cur(P)->type != T_NAME || t_name(cur(P), "in")) break;
        const char *nm = NULL;
        TRY(take_name(P, &nm));
        TRY(kw_push(P, &st->kw, &st->nkw, &cap, nm));
        st->neg = true;
    }
    if (paren) {
        TRY(expect_op(P, OP_RPAREN));
        st->neg = true;
    }
    if (!st->neg) st->s = first;
    return DSP_OK;
}

/* filter chain of {% filter %} / {% set x | f %}: the innermost operand is the input (E_HOLE) */
static dsp_status p_filter_chain(ps *P, node **out) {
    node *x = nn(P, E_HOLE, cur(P)->line);
    if (!x) return pnomem();
    /* first filter has no leading '|' in {% filter f %} */
    if (!t_op(cur(P), OP_PIPE)) {
        int line = cur(P)->line;
        node *f = nn(P, E_FILTER, line);
        if (!f) return pnomem();
        f->a = x;
        TRY(p_dotted_name(P, &f->s));
        if (!dsp_tmpl_filter_known(f->s)) return dsp_tmpl_fail(line, "unknown or unsupported filter '%s'", f->s);
        if (t_op(cur(P), OP_LPAREN)) TRY(p_call_args(P, f));
        x = f;
    }
    while (t_op(cur(P), OP_PIPE)) TRY(p_filter(P, x, &x));
    *out = x;
    return DSP_OK;
}

static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_ENDIF[] = {"endif", NULL};
static const char *const END_FOR[] = {"endfor", "else", NULL};
static const char *const END_ENDFOR[] = {"endfor", NULL};
static const char *const END_SET[] = {"endset", NULL};
static const char *const END_MACRO[] = {"endmacro", NULL};
static const char *const END_FILTER[] = {"endfilter", NULL};
static const char *const END_GEN[] = {"endgeneration", NULL};
static const char *const END_WITH[] = {"endwith", NULL};

static dsp_status p_statement(ps *P, node **out) {
    token *t = cur(P);
    int line = t->line;
    if (t->type != T_NAME) return unexpected(P, "a tag name");
    node *st = NULL;
    if (t_name(t, "if")) {
        adv(P);
        node *top = nn(P, S_IF, line), *n = top;
        if (!top) return pnomem();
        TRY(p_tuple(P, false, false, NULL, &n->a));
        TRY(p_end_block(P));
        for (;;) {
            TRY(p_block_body(P, END_IF, &n->v, &n->nv));
            if (t_name(cur(P), "elif")) {
                int l2 = cur(P)->line;
                adv(P);
                node *e = nn(P, S_IF, l2);
                node **ev = dsp_arena_alloc(P->ar, sizeof *ev);
                if (!e || !ev) return pnomem();
                ev[0] = e;
                n->v2 = ev;
                n->nv2 = 1;
                n = e;
                TRY(p_tuple(P, false, false, NULL, &n->a));
                TRY(p_end_block(P));
                continue;
            }
            if (t_name(cur(P), "else")) {
                adv(P);
                TRY(p_end_block(P));
                TRY(p_block_body(P, END_ENDIF, &n->v2, &n->nv2));
            }
            break;
        }
        adv(P); /* endif */
        st = top;
    } else if (t_name(t, "for")) {
        adv(P);
        st = nn(P, S_FOR, line);
        if (!st) return pnomem();
        TRY(p_assign_target(P, st, false));
        if (!st->kw) { /* single name: keep it in kw[0] too */
            size_t cap = 0;
            TRY(kw_push(P, &st->kw, &st->nkw, &cap, st->s));
        }
        if (!t_name(cur(P), "in")) return unexpected(P, "'in'");
        adv(P);
        TRY(p_tuple(P, false, false, "recursive", &st->a));
        if (t_name(cur(P), "if")) {
            adv(P);
            TRY(p_expr(P, true, &st->b));
        }
        if (t_name(cur(P), "recursive")) return dsp_tmpl_fail(line, "unsupported: recursive for-loops");
        TRY(p_end_block(P));
        P->loops++;
        TRY(p_block_body(P, END_FOR, &st->v, &st->nv));
        P->loops--;
        if (t_name(cur(P), "else")) {
            adv(P);
            TRY(p_end_block(P));
            TRY(p_block_body(P, END_ENDFOR, &st->v2, &st->nv2));
        }
        adv(P);
    } else if (t_name(t, "set")) {
        adv(P);
        st = nn(P, S_SET, line);
        if (!st) return pnomem();
        TRY(p_assign_target(P, st, true));
        if (t_op(cur(P), OP_ASSIGN)) {
            adv(P);
            TRY(p_tuple(P, true, false, NULL, &st->a));
        } else {
            if (st->neg) return dsp_tmpl_fail(line, "a {%% set %%} block needs a single name");
            st->k = S_SETBLOCK;
            if (t_op(cur(P), OP_PIPE)) TRY(p_filter_chain(P, &st->b));
            TRY(p_end_block(P));
            TRY(p_block_body(P, END_SET, &st->v, &st->nv));
            adv(P);
        }
    } else if (t_name(t, "macro")) {
        adv(P);
        st = nn(P, S_MACRO, line);
        if (!st) return pnomem();
        TRY(take_name(P, &st->s));
        TRY(expect_op(P, OP_LPAREN));
        size_t cap = 0;
        nvec defs = {0};
        while (!t_op(cur(P), OP_RPAREN)) {
            if (st->nkw) TRY(expect_op(P, OP_COMMA));
            const char *pn = NULL;
            TRY(take_name(P, &pn));
            node *d = NULL;
            if (t_op(cur(P), OP_ASSIGN)) {
                adv(P);
                TRY(p_expr(P, true, &d));
            } else if (defs.n && defs.v[defs.n - 1]) {
                return dsp_tmpl_fail(line, "macro '%s': non-default argument follows default argument", st->s);
            }
            TRY(kw_push(P, &st->kw, &st->nkw, &cap, pn));
            TRY(nv_push(P, &defs, d));
        }
        adv(P);
        st->v2 = defs.v;
        st->nv2 = defs.n;
        TRY(p_end_block(P));
        int saved = P->loops;
        P->loops = 0;
        TRY(p_block_body(P, END_MACRO, &st->v, &st->nv));
        P->loops = saved;
        adv(P);
        if (cur(P)->type == T_NAME) adv(P); /* {% endmacro name %} */
    } else if (t_name(t, "filter")) {
        adv(P);
        st = nn(P, S_FILTERBLOCK, line);
        if (!st) return pnomem();
        TRY(p_filter_chain(P, &st->b));
        TRY(p_end_block(P));
        TRY(p_block_body(P, END_FILTER, &st->v, &st->nv));
        adv(P);
    } else if (t_name(t, "break") || t_name(t, "continue")) {
        bool brk = t_name(t, "break");
        if (!P->loops) return dsp_tmpl_fail(line, "'%s' outside of a loop", brk ? "break" : "continue");
        adv(P);
        st = nn(P, brk ? S_BREAK : S_CONTINUE, line);
        if (!st) return pnomem();
    } else if (t_name(t, "generation")) {
        adv(P);
        st = nn(P, S_BODY, line);
        if (!st) return pnomem();
        TRY(p_end_block(P));
        TRY(p_block_body(P, END_GEN, &st->v, &st->nv));
        adv(P);
    } else if (t_name(t, "with")) {
        adv(P);
        st = nn(P, S_WITH, line);
        if (!st) return pnomem();
        size_t cap = 0;
        nvec vals = {0};
        while (cur(P)->type != T_BLOCK_END) {
            if (st->nkw) TRY(expect_op(P, OP_COMMA));
            const char *nm = NULL;
            TRY(take_name(P, &nm));
            TRY(expect_op(P, OP_ASSIGN));
            node *v = NULL;
            TRY(p_expr(P, true, &v));
            TRY(kw_push(P, &st->kw, &st->nkw, &cap, nm));
            TRY(nv_push(P, &vals, v));
        }
        st->v2 = vals.v;
        st->nv2 = vals.n;
        TRY(p_end_block(P));
        TRY(p_block_body(P, END_WITH, &st->v, &st->nv));
        adv(P);
    } else if (t_name(t, "print")) {
        adv(P);
        st = nn(P, S_OUT, line);
        if (!st) return pnomem();
        TRY(p_tuple(P, true, false, NULL, &st->a));
    } else {
        static const char *const known[] = {"call", "include", "import", "from", "extends",
                                            "block", "autoescape", "raw", "do", NULL};
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(t->n > 60 ? 60 : t->n), t->p);
        if (in_list(known, name)) return dsp_tmpl_fail(line, "unsupported tag '%s'", name);
        return dsp_tmpl_fail(line, "unknown tag '%s'", name);
    }
    TRY(p_end_block(P));
    *out = st;
    return DSP_OK;
}

static dsp_status p_body(ps *P, const char *const *ends, nvec *body) {
    for (;;) {
        token *t = cur(P);
        node *x = NULL;
        if (t->type == T_EOF) {
            if (ends) {
                const char *want = ends[0];
                for (const char *const *e = ends; *e; e++)
                    if (!strncmp(*e, "end", 3)) want = *e;
                return dsp_tmpl_fail(t->line, "unexpected end of template: missing {%% %s %%}", want);
            }
            return DSP_OK;
        }
        if (t->type == T_DATA) {
            x = nn(P, S_TEXT, t->line);
            if (!x) return pnomem();
            x->s = t->p;
            x->sl = t->n;
            adv(P);
        } else if (t->type == T_VAR_BEGIN) {
            adv(P);
            x = nn(P, S_OUT, t->line);
            if (!x) return pnomem();
            TRY(p_tuple(P, true, false, NULL, &x->a));
            TRY(expect_type(P, T_VAR_END, "end of print statement '}}'"));
        } else if (t->type == T_BLOCK_BEGIN) {
            adv(P);
            if (ends && cur(P)->type == T_NAME) {
                for (const char *const *e = ends; *e; e++)
                    if (t_name(cur(P), *e)) return DSP_OK;
            }
            if (cur(P)->type == T_NAME) {
                static const char *const stray[] = {"endif", "endfor", "else", "elif", "endset",
                                                    "endmacro", "endfilter", "endgeneration",
                                                    "endwith", "endraw", NULL};
                char name[64];
                snprintf(name, sizeof name, "%.*s", (int)(cur(P)->n > 60 ? 60 : cur(P)->n), cur(P)->p);
                if (in_list(stray, name))
                    return dsp_tmpl_fail(cur(P)->line, "unexpected {%% %s %%}%s%s", name,
                                ends ? ", expected " : "", ends ? ends[0] : "");
            }
            TRY(p_statement(P, &x));
        } else {
            return unexpected(P, "template data or a tag");
        }
        TRY(nv_push(P, body, x));
    }
}

dsp_status dsp_tmpl_parse(token *tk, size_t ntk, dsp_arena *ar, int max_depth, node **root) {
    ps P = {.tk = tk, .n = ntk, .ar = ar, .max_depth = max_depth};
    nvec body = {0};
    TRY(p_body(&P, NULL, &body));
    node *x = nn(&P, S_BODY, 1);
    if (!x) return pnomem();
    x->v = body.v;
    x->nv = body.n;
    *root = x;
    return DSP_OK;
}
