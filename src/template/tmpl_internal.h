/* template/tmpl_internal: what the template module's files share (never included outside
 * src/template/).
 *
 * Three stages:
 *   lexer   (tmpl_lexer.c) source -> tokens, applying jinja2's whitespace rules exactly
 *           (trim_blocks, lstrip_blocks, "-"/"+" markers, one trailing newline dropped, \r\n and \r
 *           read as \n);
 *   parser  (tmpl_parser.c) tokens -> tree (struct node), recursive descent following jinja2's
 *           grammar and operator precedence; unknown tags, filters and tests are rejected here, as
 *           jinja2 rejects them at compile time;
 *   render  (tmpl_eval.c, tmpl_filters.c) walks the tree with Python semantics for the values
 *           templates use (None, bool, int, float, str, list, tuple, dict, jinja2's Undefined and
 *           Namespace, macros), implemented in tmpl_values.c.
 * Values (tv) are small structs passed by value; strings, lists and dicts live in the per-render
 * arena and are never mutated once built, except Namespace attributes and scope variables.
 * Strings are UTF-8 with explicit lengths; lengths, indexes and slices count code points as
 * Python does. Python prints some objects (generators, methods, dict views) in ways no chat
 * template wants; those are errors here rather than imitations.
 *
 * Every failure is a DSP_ERR_TEMPLATE status made by dsp_tmpl_fail ("line N: ..."). */
#ifndef DSP_TEMPLATE_TMPL_INTERNAL_H
#define DSP_TEMPLATE_TMPL_INTERNAL_H

#include "template/template.h"

#include "core/arena.h"
#include "core/utf8.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* values */

enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_MACRO, V_FUNC,
       V_METHOD, V_LOOP };
/* kinds of V_LIST (Python objects that iterate like a list) */
enum { L_LIST, L_TUPLE, L_GEN /* generator from map/select/items filters */,
       L_VIEW /* dict.items()/keys()/values() */, L_RANGE };
/* builtin functions */
enum { F_RANGE = 1, F_NAMESPACE, F_DICT, F_RAISE, F_STRFTIME };

typedef struct tlist tlist;
typedef struct tdict tdict;
typedef struct tmacro tmacro;
typedef struct tmeth tmeth;
typedef struct tloop tloop;

typedef struct tv {
    uint8_t t;  /* V_* */
    uint8_t fl; /* V_STR: 1 = markup (|safe); V_LIST: L_* */
    uint16_t fn;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        tlist *l;
        tdict *d; /* V_DICT and V_NS */
        tmacro *m;
        tmeth *me;
        tloop *lp;
        const char *uname; /* V_UNDEF: what was undefined, for messages (may be NULL) */
    } u;
} tv;

struct tlist {
    size_t n, cap;
    tv *v;
};
struct tdict {
    size_t n, cap;
    tv *k, *v;
};
struct tmeth {
    tv self;
    const char *name;
};

typedef struct node node;
typedef struct scope scope;
struct scope {
    scope *parent;
    tdict vars;
};
struct tmacro {
    node *def;
    scope *closure;
};
struct tloop {
    tlist *items;
    size_t index0;
    tv last_changed;
    bool has_changed;
};

static inline tv mk_undef(const char *why) { tv v = {.t = V_UNDEF}; v.u.uname = why; return v; }
static inline tv mk_none(void) { tv v = {.t = V_NONE}; return v; }
static inline tv mk_bool(bool b) { tv v = {.t = V_BOOL}; v.u.b = b; return v; }
static inline tv mk_int(int64_t i) { tv v = {.t = V_INT}; v.u.i = i; return v; }
static inline tv mk_float(double f) { tv v = {.t = V_FLOAT}; v.u.f = f; return v; }
static inline tv mk_str(const char *p, size_t n) { tv v = {.t = V_STR}; v.u.s.p = p; v.u.s.n = n; return v; }
static inline tv mk_list(tlist *l, int kind) { tv v = {.t = V_LIST, .fl = (uint8_t)kind}; v.u.l = l; return v; }

static inline bool is_num(const tv *v) { return v->t == V_BOOL || v->t == V_INT || v->t == V_FLOAT; }
static inline bool is_intlike(const tv *v) { return v->t == V_INT || v->t == V_BOOL; }
static inline double num_f(const tv *v) {
    return v->t == V_FLOAT ? v->u.f : v->t == V_INT ? (double)v->u.i : (double)v->u.b;
}
static inline int64_t num_i(const tv *v) { return v->t == V_INT ? v->u.i : (int64_t)v->u.b; }
static inline bool str_eq(const tv *a, const char *s, size_t n) {
    return a->t == V_STR && a->u.s.n == n && !memcmp(a->u.s.p, s, n);
}

/* ------------------------------------------------------------------------------------------ */
/* tokens and the syntax tree */

enum { T_EOF, T_DATA, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING,
       T_INT, T_FLOAT, T_OP };
enum { OP_ADD = 1, OP_SUB, OP_DIV, OP_FLOORDIV, OP_MUL, OP_MOD, OP_POW, OP_TILDE, OP_LBRACKET,
       OP_RBRACKET, OP_LPAREN, OP_RPAREN, OP_LBRACE, OP_RBRACE, OP_EQ, OP_NE, OP_GT, OP_GTEQ,
       OP_LT, OP_LTEQ, OP_ASSIGN, OP_DOT, OP_COLON, OP_PIPE, OP_COMMA, OP_SEMICOLON,
       /* comparison-only codes used by the parser */
       OP_IN, OP_NOTIN };

typedef struct token {
    uint8_t type, op;
    int line;
    const char *p; /* NAME: identifier; STRING: decoded value; DATA: text */
    size_t n;
    int64_t i;
    double f;
} token;

enum { E_CONST, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_BIN, E_NEG, E_POS,
       E_NOT, E_AND, E_OR, E_CMP, E_COND, E_LIST, E_TUPLE, E_DICT, E_CONCAT, E_HOLE,
       S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_MACRO, S_FILTERBLOCK, S_BREAK,
       S_CONTINUE, S_BODY, S_WITH };

struct node {
    uint8_t k, op;
    bool neg;  /* E_TEST: "is not"; S_FOR/S_SET: target is a tuple */
    int line;
    node *a, *b, *c;
    node **v;  /* items, positional args, body */
    size_t nv;
    node **v2; /* dict values, keyword values, else-body, macro defaults */
    size_t nv2;
    const char **kw; /* keyword names, target names, macro parameters */
    size_t nkw;
    uint8_t *ops; /* E_CMP operators */
    const char *s; /* name, attribute, filter/test name, text */
    size_t sl;
    const char *s2; /* S_SET / S_SETBLOCK: namespace attribute */
    tv cv;
};

static inline bool is_dig(char c) { return c >= '0' && c <= '9'; }
/* s is one of the NULL-terminated list l */
static inline bool in_list(const char *const *l, const char *s) {
    for (; *l; l++)
        if (!strcmp(*l, s)) return true;
    return false;
}

/* ------------------------------------------------------------------------------------------ */
/* the template and the render state */

struct dsp_tmpl {
    dsp_arena ar;
    dsp_tmpl_limits lim;
    node *root;
    char *src; /* normalized source */
};

typedef struct sb { /* growable byte buffer (malloc) with a size limit */
    char *p;
    size_t n, cap, limit;
} sb;

typedef struct rt {
    dsp_arena *ar;
    const dsp_tmpl *t;
    uint64_t steps;
    int depth;
    int ctl; /* 0, CTL_BREAK, CTL_CONTINUE */
    int loop_depth;
    scope *globals;
    tv hole; /* input of a filter chain in {% filter %} and {% set x | f %} */
    const dsp_tmpl_render_opts *opts;
    int line; /* line of the construct being evaluated, for messages */
} rt;

enum { CTL_NONE, CTL_BREAK, CTL_CONTINUE };

/* arguments of a call, a filter or a test, evaluated */
typedef struct args {
    tv *pos;
    size_t npos;
    const char **kwn;
    tv *kwv;
    size_t nkw;
    bool *used; /* kw used flags (for "unexpected keyword" errors) */
} args;

/* json.dumps(v, ensure_ascii, indent, separators, sort_keys) */
typedef struct jopts {
    const char *indent; /* NULL: no indent */
    size_t indent_n;
    const char *item_sep, *key_sep;
    size_t item_sep_n, key_sep_n;
    bool sort_keys, ensure_ascii;
} jopts;

#define TRY(x)                                                                                  \
    do {                                                                                        \
        dsp_status _st = (x);                                                                   \
        if (_st != DSP_OK) return _st;                                                          \
    } while (0)

/* ------------------------------------------------------------------------------------------ */
/* tmpl_values.c: errors, buffers, text, values */

/* A DSP_ERR_TEMPLATE error "line N: <message>" (no line prefix when line <= 0). */
dsp_status dsp_tmpl_fail(int line, const char *fmt, ...) DSP_PRINTF(2, 3);
dsp_status dsp_tmpl_oom(int line);
dsp_status dsp_tmpl_int_overflow(rt *r);
dsp_status dsp_tmpl_undef_err(const tv *v, int line);
/* a message allocated in the render arena (for Undefined values) */
const char *dsp_tmpl_msgf(rt *r, const char *fmt, ...) DSP_PRINTF(2, 3);

static inline void *ralloc(rt *r, size_t n) { return dsp_arena_alloc(r->ar, n ? n : 1); }

dsp_status dsp_tmpl_sb_reserve(sb *b, size_t extra, int line);
static inline dsp_status sb_put(sb *b, const char *s, size_t n, int line) {
    if (!n) return DSP_OK;
    TRY(dsp_tmpl_sb_reserve(b, n, line));
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return DSP_OK;
}
static inline dsp_status sb_puts(sb *b, const char *s, int line) { return sb_put(b, s, strlen(s), line); }
static inline dsp_status sb_putc(sb *b, char c, int line) { return sb_put(b, &c, 1, line); }
static inline void sb_free(sb *b) { free(b->p); b->p = NULL; b->n = b->cap = 0; }
static inline sb sb_new(const rt *r) { sb b = {0}; b.limit = r->t->lim.max_output; return b; }
/* copy a buffer into the arena as a string value, freeing the buffer */
dsp_status dsp_tmpl_sb_to_str(rt *r, sb *b, tv *out);

/* Python's text rules */
bool dsp_tmpl_py_space_cp(uint32_t c);
size_t dsp_tmpl_py_space_at(const char *s, size_t n);
size_t dsp_tmpl_py_rstrip_len(const char *s, size_t n);
size_t dsp_tmpl_py_lstrip_off(const char *s, size_t n);
size_t dsp_tmpl_py_linebreak_at(const char *s, size_t n);
uint32_t dsp_tmpl_cp_lower(uint32_t c);
uint32_t dsp_tmpl_cp_upper(uint32_t c);
bool dsp_tmpl_cp_is_alpha(uint32_t c);
bool dsp_tmpl_cp_case_known(uint32_t c);

/* values */
const char *dsp_tmpl_type_name(const tv *v);
bool dsp_tmpl_truthy(const tv *v);
tlist *dsp_tmpl_list_new(rt *r, size_t cap);
dsp_status dsp_tmpl_list_push(rt *r, tlist *l, tv v);
static inline tdict *dict_new(rt *r) { return ralloc(r, sizeof(tdict)); }
tv *dsp_tmpl_dict_find(const tdict *d, const tv *k);
tv *dsp_tmpl_dict_find_s(const tdict *d, const char *s, size_t n);
dsp_status dsp_tmpl_dict_set(rt *r, tdict *d, tv k, tv v);
dsp_status dsp_tmpl_dict_set_s(rt *r, tdict *d, const char *s, tv v);
bool dsp_tmpl_val_eq(const tv *a, const tv *b);
/* Python's <, for numbers, strings and sequences; *res = -1/0/1 */
dsp_status dsp_tmpl_val_cmp(const tv *a, const tv *b, int line, const char *op, int *res);
/* iterate a value into a list (materialized); Python iteration semantics */
dsp_status dsp_tmpl_iter_list(rt *r, const tv *v, tlist **out);
dsp_status dsp_tmpl_need_str(rt *r, const tv *v, const char *what);
dsp_status dsp_tmpl_need_int(rt *r, const tv *v, const char *what, int64_t *out);

/* text forms: Python str(), json.dumps() */
dsp_status dsp_tmpl_put_str(rt *r, sb *b, const tv *v, int depth);
dsp_status dsp_tmpl_put_json(rt *r, sb *b, const tv *v, const jopts *o, int level);
/* str(v) as a new string value */
dsp_status dsp_tmpl_to_str(rt *r, const tv *v, tv *out);
dsp_status dsp_tmpl_from_json(rt *r, const json_t *j, tv *out, int depth);

/* strings */
typedef enum { CASE_LOWER, CASE_UPPER, CASE_TITLE_PY, CASE_TITLE_JINJA, CASE_CAPITALIZE } case_mode;
dsp_status dsp_tmpl_new_str(rt *r, const char *a, size_t an, const char *b, size_t bn, tv *out);
/* markupsafe.escape */
dsp_status dsp_tmpl_html_escape(rt *r, const tv *s, tv *out);
dsp_status dsp_tmpl_str_case(rt *r, const tv *s, case_mode mode, tv *out);
/* which: 1 left, 2 right, 3 both; chars NULL/None = whitespace */
dsp_status dsp_tmpl_str_strip(rt *r, const tv *s, const tv *chars, int which, tv *out);
dsp_status dsp_tmpl_str_replace(rt *r, const tv *s, const tv *old, const tv *new_, int64_t count, tv *out);
dsp_status dsp_tmpl_str_split(rt *r, const tv *s, const tv *sep, int64_t maxsplit, tv *out);
dsp_status dsp_tmpl_affix_match(rt *r, const tv *s, const tv *a, bool end, bool *res);

/* ------------------------------------------------------------------------------------------ */
/* tmpl_lexer.c, tmpl_parser.c */

/* Tokens of a normalized source (s, n); *tk is malloc'd, strings point into s or into ar. */
dsp_status dsp_tmpl_lex(const char *s, size_t n, dsp_arena *ar, token **tk, size_t *ntk);
/* the text of an operator token, for messages */
const char *dsp_tmpl_op_text(int op);
/* The tree of a token list (ending with T_EOF): an S_BODY node allocated in ar. */
dsp_status dsp_tmpl_parse(token *tk, size_t ntk, dsp_arena *ar, int max_depth, node **root);

/* ------------------------------------------------------------------------------------------ */
/* tmpl_eval.c */

dsp_status dsp_tmpl_step(rt *r);
scope *dsp_tmpl_scope_new(rt *r, scope *parent);
dsp_status dsp_tmpl_scope_set(rt *r, scope *s, const char *name, tv v);
dsp_status dsp_tmpl_exec_body(rt *r, scope *sc, node **v, size_t n, sb *out);
/* argument `pos`-th positional or keyword `kw`; NULL if absent */
tv *dsp_tmpl_arg(args *a, size_t pos, const char *kw);
dsp_status dsp_tmpl_check_args(rt *r, args *a, size_t max_pos, const char *what);
/* jinja2's sandboxed getattr(obj, name) and getitem(obj, key), obj[a:b:c] */
dsp_status dsp_tmpl_get_attr(rt *r, const tv *obj, const char *name, tv *out);
dsp_status dsp_tmpl_get_item(rt *r, const tv *obj, const tv *key, tv *out);
dsp_status dsp_tmpl_get_slice(rt *r, const tv *obj, const tv *a, const tv *b, const tv *c, tv *out);
dsp_status dsp_tmpl_binop(rt *r, int op, tv a, tv b, tv *out);
dsp_status dsp_tmpl_contains(rt *r, const tv *hay, const tv *needle, bool *res);
dsp_status dsp_tmpl_str_method(rt *r, const tv *s, const char *m, args *a, tv *out);
dsp_status dsp_tmpl_call_method(rt *r, tmeth *me, args *a, tv *out);

/* ------------------------------------------------------------------------------------------ */
/* tmpl_filters.c */

/* Whether `name` is a filter / a test this interpreter knows (the parser rejects others). */
bool dsp_tmpl_filter_known(const char *name);
bool dsp_tmpl_test_known(const char *name);
dsp_status dsp_tmpl_apply_filter(rt *r, const char *name, tv in, args *a, tv *out);
dsp_status dsp_tmpl_apply_test(rt *r, const char *name, tv in, args *a, bool *res);

#endif
