/* tok/template: see template.h.
 *
 * Three stages, one file:
 *   lexer   source -> tokens, applying jinja2's whitespace rules exactly (trim_blocks, lstrip_blocks,
 *           "-"/"+" markers, one trailing newline dropped, \r\n and \r read as \n);
 *   parser  tokens -> tree (struct node), recursive descent following jinja2's grammar and operator
 *           precedence; unknown tags, filters and tests are rejected here, as jinja2 rejects them
 *           at compile time;
 *   render  walks the tree with Python semantics for the values templates use (None, bool, int,
 *           float, str, list, tuple, dict, jinja2's Undefined and Namespace, macros).
 * Values (tv) are small structs passed by value; strings, lists and dicts live in the per-render
 * arena and are never mutated once built, except Namespace attributes and scope variables.
 * Strings are UTF-8 with explicit lengths; lengths, indexes and slices count code points as
 * Python does. Python prints some objects (generators, methods, dict views) in ways no chat
 * template wants; those are errors here rather than imitations. */
#include "tok/template.h"

#include "core/arena.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static tv mk_undef(const char *why) { tv v = {.t = V_UNDEF}; v.u.uname = why; return v; }
static tv mk_none(void) { tv v = {.t = V_NONE}; return v; }
static tv mk_bool(bool b) { tv v = {.t = V_BOOL}; v.u.b = b; return v; }
static tv mk_int(int64_t i) { tv v = {.t = V_INT}; v.u.i = i; return v; }
static tv mk_float(double f) { tv v = {.t = V_FLOAT}; v.u.f = f; return v; }
static tv mk_str(const char *p, size_t n) { tv v = {.t = V_STR}; v.u.s.p = p; v.u.s.n = n; return v; }
static tv mk_list(tlist *l, int kind) { tv v = {.t = V_LIST, .fl = (uint8_t)kind}; v.u.l = l; return v; }

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

#define TERR DSP_ERR_TEMPLATE
static dsp_status fail(int line, const char *fmt, ...) DSP_PRINTF(2, 3);
static dsp_status fail(int line, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line > 0) return dsp_error(TERR, "line %d: %s", line, msg);
    return dsp_error(TERR, "%s", msg);
}
#define TRY(x)                                                                                  \
    do {                                                                                        \
        dsp_status _st = (x);                                                                   \
        if (_st != DSP_OK) return _st;                                                          \
    } while (0)

static dsp_status oom(int line) {
    return fail(line, "template memory limit exceeded (dsp_tmpl_limits.max_memory)");
}

static void *ralloc(rt *r, size_t n) { return dsp_arena_alloc(r->ar, n ? n : 1); }

/* ------------------------------------------------------------------------------------------ */
/* byte buffers */

static dsp_status sb_reserve(sb *b, size_t extra, int line) {
    if (extra > b->limit || b->n > b->limit - extra)
        return fail(line, "output larger than %zu bytes (dsp_tmpl_limits.max_output)", b->limit);
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
static dsp_status sb_put(sb *b, const char *s, size_t n, int line) {
    if (!n) return DSP_OK;
    TRY(sb_reserve(b, n, line));
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return DSP_OK;
}
static dsp_status sb_puts(sb *b, const char *s, int line) { return sb_put(b, s, strlen(s), line); }
static dsp_status sb_putc(sb *b, char c, int line) { return sb_put(b, &c, 1, line); }
static void sb_free(sb *b) { free(b->p); b->p = NULL; b->n = b->cap = 0; }
static sb sb_new(const rt *r) { sb b = {0}; b.limit = r->t->lim.max_output; return b; }

/* copy a buffer into the arena as a string value, freeing the buffer */
static dsp_status sb_to_str(rt *r, sb *b, tv *out) {
    char *p = dsp_arena_strndup(r->ar, b->p ? b->p : "", b->n);
    size_t n = b->n;
    sb_free(b);
    if (!p) return oom(r->line);
    *out = mk_str(p, n);
    return DSP_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* UTF-8 (all strings here are valid UTF-8: the source is checked, jansson checks JSON) */

static size_t u8_len1(unsigned char c) {
    return c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
}
static uint32_t u8_dec(const char *s, size_t n, size_t *len) {
    const unsigned char *p = (const unsigned char *)s;
    size_t l = u8_len1(p[0]);
    if (l > n) l = n;
    *len = l;
    switch (l) {
    case 1: return p[0];
    case 2: return ((uint32_t)(p[0] & 0x1f) << 6) | (p[1] & 0x3f);
    case 3: return ((uint32_t)(p[0] & 0x0f) << 12) | ((uint32_t)(p[1] & 0x3f) << 6) | (p[2] & 0x3f);
    default:
        return ((uint32_t)(p[0] & 0x07) << 18) | ((uint32_t)(p[1] & 0x3f) << 12) |
               ((uint32_t)(p[2] & 0x3f) << 6) | (p[3] & 0x3f);
    }
}
static size_t u8_enc(uint32_t cp, char *o) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xc0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3f)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}
/* strict validation: no overlongs, no surrogates, <= U+10FFFF */
static bool u8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (c < 0x80) { i++; continue; }
        size_t l;
        uint32_t min;
        if (c >= 0xc2 && c <= 0xdf) { l = 2; min = 0x80; }
        else if (c >= 0xe0 && c <= 0xef) { l = 3; min = 0x800; }
        else if (c >= 0xf0 && c <= 0xf4) { l = 4; min = 0x10000; }
        else return false;
        if (i + l > n) return false;
        for (size_t k = 1; k < l; k++)
            if ((p[i + k] & 0xc0) != 0x80) return false;
        size_t dl;
        uint32_t cp = u8_dec(s + i, l, &dl);
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
        i += l;
    }
    return true;
}
static size_t u8_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xc0) != 0x80) c++;
    return c;
}
/* Python str.isspace() */
static bool py_space_cp(uint32_t c) {
    return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f) || c == 0x85 ||
           c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 ||
           c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}
/* length of the whitespace code point at s (0 if not whitespace) */
static size_t py_space_at(const char *s, size_t n) {
    size_t l;
    uint32_t c = u8_dec(s, n, &l);
    return py_space_cp(c) ? l : 0;
}
/* start of the code point that ends at s+n */
static size_t u8_prev(const char *s, size_t n) {
    size_t i = n;
    while (i > 0) {
        i--;
        if (((unsigned char)s[i] & 0xc0) != 0x80) break;
    }
    return i;
}
static size_t py_rstrip_len(const char *s, size_t n) {
    while (n > 0) {
        size_t i = u8_prev(s, n);
        if (!py_space_at(s + i, n - i)) break;
        n = i;
    }
    return n;
}
static size_t py_lstrip_off(const char *s, size_t n) {
    size_t i = 0, l;
    while (i < n && (l = py_space_at(s + i, n - i)) > 0) i += l;
    return i;
}
/* Python str.splitlines() boundaries */
static size_t py_linebreak_at(const char *s, size_t n) {
    unsigned char c = (unsigned char)s[0];
    if (c == '\r') return (n > 1 && s[1] == '\n') ? 2 : 1;
    if (c == '\n' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e) return 1;
    if (c < 0x80) return 0;
    size_t l;
    uint32_t cp = u8_dec(s, n, &l);
    return (cp == 0x85 || cp == 0x2028 || cp == 0x2029) ? l : 0;
}

/* simple case mapping: ASCII, Latin-1, Latin Extended-A pairs, Greek and Cyrillic basics.
 * Characters outside these ranges are left unchanged (Python would map some of them). */
static uint32_t cp_lower(uint32_t c) {
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
static uint32_t cp_upper(uint32_t c) {
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
static bool cp_is_alpha(uint32_t c) {
    if (c < 0x80) return (c | 32) >= 'a' && (c | 32) <= 'z';
    return cp_lower(c) != c || cp_upper(c) != c || c == 0xaa || c == 0xba || c == 0xdf ||
           c == 0x138 || c == 0x149 || c == 0x17f || (c >= 0x3040 && c <= 0x9fff) ||
           (c >= 0xac00 && c <= 0xd7af);
}
/* Characters whose case mapping cp_lower/cp_upper get right (including caseless blocks). Case
 * functions refuse other characters rather than guess what Python would do. */
static bool cp_case_known(uint32_t c) {
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
/* lexer */

enum { T_EOF, T_DATA, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING,
       T_INT, T_FLOAT, T_OP };
enum { OP_ADD = 1, OP_SUB, OP_DIV, OP_FLOORDIV, OP_MUL, OP_MOD, OP_POW, OP_TILDE, OP_LBRACKET,
       OP_RBRACKET, OP_LPAREN, OP_RPAREN, OP_LBRACE, OP_RBRACE, OP_EQ, OP_NE, OP_GT, OP_GTEQ,
       OP_LT, OP_LTEQ, OP_ASSIGN, OP_DOT, OP_COLON, OP_PIPE, OP_COMMA, OP_SEMICOLON,
       /* comparison-only codes used by the parser */
       OP_IN, OP_NOTIN };

static const struct { const char *s; uint8_t op; } g_ops[] = {
    {"//", OP_FLOORDIV}, {"**", OP_POW}, {"==", OP_EQ}, {"!=", OP_NE}, {">=", OP_GTEQ},
    {"<=", OP_LTEQ}, {"+", OP_ADD}, {"-", OP_SUB}, {"/", OP_DIV}, {"*", OP_MUL}, {"%", OP_MOD},
    {"~", OP_TILDE}, {"[", OP_LBRACKET}, {"]", OP_RBRACKET}, {"(", OP_LPAREN}, {")", OP_RPAREN},
    {"{", OP_LBRACE}, {"}", OP_RBRACE}, {">", OP_GT}, {"<", OP_LT}, {"=", OP_ASSIGN},
    {".", OP_DOT}, {":", OP_COLON}, {"|", OP_PIPE}, {",", OP_COMMA}, {";", OP_SEMICOLON},
};

static const char *op_text(int op) {
    for (size_t i = 0; i < sizeof g_ops / sizeof g_ops[0]; i++)
        if (g_ops[i].op == op) return g_ops[i].s;
    return op == OP_IN ? "in" : op == OP_NOTIN ? "not in" : "?";
}

typedef struct token {
    uint8_t type, op;
    int line;
    const char *p; /* NAME: identifier; STRING: decoded value; DATA: text */
    size_t n;
    int64_t i;
    double f;
} token;

typedef struct lexer {
    const char *s;
    size_t n, pos;
    int line;
    token *tk;
    size_t ntk, captk;
    dsp_arena *ar;
    bool line_starting;
} lexer;

static dsp_status lx_push(lexer *L, token t) {
    if (L->ntk == L->captk) {
        size_t cap = L->captk ? L->captk * 2 : 256;
        token *p = realloc(L->tk, cap * sizeof *p);
        if (!p) return dsp_error(DSP_ERR_NOMEM, "template: out of memory");
        L->tk = p;
        L->captk = cap;
    }
    L->tk[L->ntk++] = t;
    return DSP_OK;
}

static int count_nl(const char *s, size_t n) {
    int c = 0;
    for (size_t i = 0; i < n; i++) c += s[i] == '\n';
    return c;
}

/* Emit the text before a tag, applying "-" (strip all whitespace) or lstrip_blocks. */
static dsp_status lx_data(lexer *L, const char *text, size_t n, char sign, bool is_var) {
    int line = L->line;
    L->line += count_nl(text, n);
    if (sign == '-') {
        n = py_rstrip_len(text, n);
    } else if (sign != '+' && !is_var) {
        size_t lpos = n;
        while (lpos > 0 && text[lpos - 1] != '\n') lpos--;
        if ((lpos > 0 || L->line_starting) && lpos < n) {
            size_t i = lpos, l;
            while (i < n && (l = py_space_at(text + i, n - i)) > 0) i += l;
            if (i == n) n = lpos;
        }
    }
    if (!n) return DSP_OK;
    token t = {.type = T_DATA, .line = line, .p = text, .n = n};
    return lx_push(L, t);
}

/* skip Python-\s whitespace from pos; returns the new position */
static size_t lx_skip_ws(const lexer *L, size_t pos) {
    size_t l;
    while (pos < L->n && (l = py_space_at(L->s + pos, L->n - pos)) > 0) pos += l;
    return pos;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decode a string literal body with Python's unicode-escape rules. */
static dsp_status lx_unescape(lexer *L, const char *s, size_t n, int line, token *t) {
    char *o = dsp_arena_alloc(L->ar, n + 1);
    if (!o) return dsp_error(DSP_ERR_NOMEM, "template: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] != '\\' || i + 1 >= n) { o[k++] = s[i++]; continue; }
        char c = s[i + 1];
        i += 2;
        switch (c) {
        case '\n': break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'n': o[k++] = '\n'; break;
        case 'r': o[k++] = '\r'; break;
        case 't': o[k++] = '\t'; break;
        case 'v': o[k++] = '\v'; break;
        case 'x': case 'u': case 'U': {
            int nd = c == 'x' ? 2 : c == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int d = 0; d < nd; d++) {
                int h = i + (size_t)d < n ? hexval(s[i + d]) : -1;
                if (h < 0) return fail(line, "string literal: truncated \\%c escape", c);
                cp = cp * 16 + (uint32_t)h;
            }
            i += (size_t)nd;
            if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
                return fail(line, "string literal: escape \\%c gives an invalid code point", c);
            k += u8_enc(cp, o + k);
            break;
        }
        case 'N': return fail(line, "string literal: \\N{...} escapes are not supported");
        default:
            if (c >= '0' && c <= '7') {
                uint32_t cp = (uint32_t)(c - '0');
                for (int d = 0; d < 2 && i < n && s[i] >= '0' && s[i] <= '7'; d++)
                    cp = cp * 8 + (uint32_t)(s[i++] - '0');
                k += u8_enc(cp, o + k);
            } else {
                o[k++] = '\\';
                i--; /* keep the character itself (it may start a UTF-8 sequence) */
            }
        }
    }
    o[k] = '\0';
    t->p = o;
    t->n = k;
    return DSP_OK;
}

static bool is_id0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_id(char c) { return is_id0(c) || (c >= '0' && c <= '9'); }
static bool is_dig(char c) { return c >= '0' && c <= '9'; }

/* digits with single '_' separators: returns end, or start if none */
static size_t lx_digits(const char *s, size_t n, size_t i) {
    if (i >= n || !is_dig(s[i])) return i;
    size_t j = i + 1;
    for (;;) {
        if (j < n && is_dig(s[j])) { j++; continue; }
        if (j + 1 < n && s[j] == '_' && is_dig(s[j + 1])) { j += 2; continue; }
        break;
    }
    return j;
}

static dsp_status lx_number(lexer *L, token *t) {
    const char *s = L->s;
    size_t n = L->n, i = L->pos;
    size_t j = lx_digits(s, n, i);
    size_t end = j;
    bool is_float = false;
    /* float: digits ((.digits)? e[+-]digits | .digits) ; not preceded by '.' */
    if (!(i > 0 && s[i - 1] == '.')) {
        size_t k = j;
        if (k < n && s[k] == '.' && k + 1 < n && is_dig(s[k + 1])) k = lx_digits(s, n, k + 1);
        size_t e = k;
        if (e < n && (s[e] == 'e' || s[e] == 'E')) {
            size_t q = e + 1;
            if (q < n && (s[q] == '+' || s[q] == '-')) q++;
            size_t r = lx_digits(s, n, q);
            if (r > q) { end = r; is_float = true; }
        }
        if (!is_float && k > j) { end = k; is_float = true; }
    }
    char buf[128];
    size_t bl = 0;
    for (size_t q = i; q < end && bl < sizeof buf - 1; q++)
        if (s[q] != '_') buf[bl++] = s[q];
    buf[bl] = '\0';
    if (end - i >= sizeof buf - 1) return fail(L->line, "number literal too long");
    t->line = L->line;
    if (is_float) {
        t->type = T_FLOAT;
        t->f = strtod(buf, NULL);
    } else {
        /* 0b / 0o / 0x prefixes */
        int base = 10;
        if (s[i] == '0' && i + 1 < n && (s[i + 1] | 32) >= 'a' && strchr("box", s[i + 1] | 32)) {
            char b = (char)(s[i + 1] | 32);
            base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
            size_t q = i + 2;
            bl = 0;
            while (q < n && (s[q] == '_' || hexval(s[q]) >= 0) && bl < sizeof buf - 1) {
                if (s[q] != '_') {
                    if (hexval(s[q]) >= base) break;
                    buf[bl++] = s[q];
                }
                q++;
            }
            buf[bl] = '\0';
            if (!bl) return fail(L->line, "bad number literal");
            end = q;
        } else if (s[i] == '0') {
            /* decimal zero: 0(_?0)* ; "01" lexes as 0 then 1, as in jinja2 */
            size_t q = i + 1;
            while (q < n && (s[q] == '0' || (s[q] == '_' && q + 1 < n && s[q + 1] == '0'))) q++;
            end = q;
            strcpy(buf, "0");
        }
        errno = 0;
        unsigned long long v = strtoull(buf, NULL, base);
        if (errno || v > INT64_MAX) return fail(L->line, "integer literal out of 64-bit range");
        t->type = T_INT;
        t->i = (int64_t)v;
    }
    L->pos = end;
    return DSP_OK;
}

/* Tokens inside {{ }} or {% %} up to and including the end marker. */
static dsp_status lx_tag(lexer *L, bool is_block) {
    char bal[256];
    int nbal = 0;
    int start_line = L->line;
    for (;;) {
        size_t p = lx_skip_ws(L, L->pos);
        L->line += count_nl(L->s + L->pos, p - L->pos);
        L->pos = p;
        const char *s = L->s;
        size_t n = L->n;
        if (p >= n)
            return fail(start_line, "unexpected end of template inside a %s tag",
                        is_block ? "{% %}" : "{{ }}");
        if (nbal == 0) {
            const char *end = is_block ? "%}" : "}}";
            size_t q = p;
            char sign = 0;
            if ((s[q] == '-' || (is_block && s[q] == '+')) && q + 3 <= n && !memcmp(s + q + 1, end, 2)) {
                sign = s[q];
                q++;
            }
            if (q + 2 <= n && !memcmp(s + q, end, 2)) {
                q += 2;
                if (sign == '-') {
                    size_t r = lx_skip_ws(L, q);
                    L->line += count_nl(s + q, r - q);
                    q = r;
                } else if (sign == 0 && is_block && q < n && s[q] == '\n') {
                    q++;
                    L->line++;
                }
                token t = {.type = is_block ? T_BLOCK_END : T_VAR_END, .line = L->line};
                TRY(lx_push(L, t));
                L->line_starting = q > 0 && s[q - 1] == '\n';
                L->pos = q;
                return DSP_OK;
            }
        }
        token t = {.line = L->line};
        char c = s[p];
        if (is_dig(c)) {
            TRY(lx_number(L, &t));
        } else if (is_id0(c)) {
            size_t q = p;
            while (q < n && is_id(s[q])) q++;
            t.type = T_NAME;
            t.p = s + p;
            t.n = q - p;
            L->pos = q;
        } else if (c == '\'' || c == '"') {
            size_t q = p + 1;
            while (q < n && s[q] != c) q += (s[q] == '\\' && q + 1 < n) ? 2 : 1;
            if (q >= n) return fail(L->line, "unterminated string literal");
            t.type = T_STRING;
            TRY(lx_unescape(L, s + p + 1, q - p - 1, L->line, &t));
            L->line += count_nl(s + p, q - p);
            L->pos = q + 1;
        } else {
            size_t k;
            for (k = 0; k < sizeof g_ops / sizeof g_ops[0]; k++) {
                size_t ol = strlen(g_ops[k].s);
                if (p + ol <= n && !memcmp(s + p, g_ops[k].s, ol)) break;
            }
            if (k == sizeof g_ops / sizeof g_ops[0]) {
                size_t l;
                u8_dec(s + p, n - p, &l);
                return fail(L->line, "unexpected character '%.*s'", (int)l, s + p);
            }
            t.type = T_OP;
            t.op = g_ops[k].op;
            L->pos = p + strlen(g_ops[k].s);
            if (t.op == OP_LPAREN || t.op == OP_LBRACKET || t.op == OP_LBRACE) {
                if (nbal == (int)sizeof bal) return fail(L->line, "brackets nested too deeply");
                bal[nbal++] = t.op == OP_LPAREN ? ')' : t.op == OP_LBRACKET ? ']' : '}';
            } else if (t.op == OP_RPAREN || t.op == OP_RBRACKET || t.op == OP_RBRACE) {
                char want = t.op == OP_RPAREN ? ')' : t.op == OP_RBRACKET ? ']' : '}';
                if (!nbal) return fail(L->line, "unexpected '%c'", want);
                if (bal[nbal - 1] != want)
                    return fail(L->line, "unexpected '%c', expected '%c'", want, bal[nbal - 1]);
                nbal--;
            }
        }
        TRY(lx_push(L, t));
    }
}

/* {% raw %} ... {% endraw %}: pos is at "{%"; returns false if this is not a raw tag */
static bool lx_match_word_tag(const lexer *L, size_t p, const char *word, size_t *after,
                              char *open_sign, char *close_sign) {
    const char *s = L->s;
    size_t n = L->n;
    if (p + 2 > n || s[p] != '{' || s[p + 1] != '%') return false;
    size_t q = p + 2;
    *open_sign = 0;
    if (q < n && (s[q] == '-' || s[q] == '+')) *open_sign = s[q++];
    q = lx_skip_ws(L, q);
    size_t wl = strlen(word);
    if (q + wl > n || memcmp(s + q, word, wl)) return false;
    q += wl;
    q = lx_skip_ws(L, q);
    *close_sign = 0;
    if (q < n && (s[q] == '-' || s[q] == '+')) *close_sign = s[q++];
    if (q + 2 > n || s[q] != '%' || s[q + 1] != '}') return false;
    *after = q + 2;
    return true;
}

static dsp_status lex(lexer *L) {
    const char *s = L->s;
    size_t n = L->n;
    L->line = 1;
    L->line_starting = true;
    while (L->pos < n) {
        size_t p = L->pos, q = p;
        while (q + 1 < n && !(s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#'))) q++;
        if (q + 1 >= n) {
            token t = {.type = T_DATA, .line = L->line, .p = s + p, .n = n - p};
            TRY(lx_push(L, t));
            L->line += count_nl(s + p, n - p);
            break;
        }
        char kind = s[q + 1];
        char sign = (q + 2 < n && (s[q + 2] == '-' || s[q + 2] == '+')) ? s[q + 2] : 0;
        size_t after, after2;
        char os, cs;
        if (kind == '%' && lx_match_word_tag(L, q, "raw", &after, &os, &cs) && cs != '+') {
            TRY(lx_data(L, s + p, q - p, os, false));
            int raw_line = L->line;
            L->line += count_nl(s + q, after - q);
            if (cs == '-') {
                size_t r = lx_skip_ws(L, after);
                L->line += count_nl(s + after, r - after);
                after = r;
            }
            /* find {% endraw %} */
            size_t e = after;
            bool found = false;
            char os2 = 0, cs2 = 0;
            for (; e + 1 < n; e++) {
                if (s[e] == '{' && s[e + 1] == '%' &&
                    lx_match_word_tag(L, e, "endraw", &after2, &os2, &cs2)) {
                    found = true;
                    break;
                }
            }
            if (!found) return fail(raw_line, "missing {%% endraw %%}");
            L->line_starting = false;
            TRY(lx_data(L, s + after, e - after, os2, false));
            L->line += count_nl(s + e, after2 - e);
            if (cs2 == '-') {
                size_t r = lx_skip_ws(L, after2);
                L->line += count_nl(s + after2, r - after2);
                after2 = r;
            } else if (cs2 == 0 && after2 < n && s[after2] == '\n') {
                after2++;
                L->line++;
            }
            L->line_starting = after2 > 0 && s[after2 - 1] == '\n';
            L->pos = after2;
            continue;
        }
        TRY(lx_data(L, s + p, q - p, sign, kind == '{'));
        L->pos = q + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t e = L->pos;
            int cl = L->line;
            for (; e + 1 < n; e++) {
                if ((s[e] == '-' || s[e] == '+') && e + 2 < n && s[e + 1] == '#' && s[e + 2] == '}') break;
                if (s[e] == '#' && s[e + 1] == '}') break;
            }
            if (e + 1 >= n) return fail(cl, "missing end of comment tag");
            L->line += count_nl(s + L->pos, e - L->pos);
            size_t r;
            if (s[e] == '-') {
                r = lx_skip_ws(L, e + 3);
            } else if (s[e] == '+') {
                r = e + 3;
            } else {
                r = e + 2;
                if (r < n && s[r] == '\n') r++;
            }
            L->line += count_nl(s + e, r - e);
            L->line_starting = s[r - 1] == '\n';
            L->pos = r;
            continue;
        }
        token t = {.type = kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, .line = L->line};
        TRY(lx_push(L, t));
        TRY(lx_tag(L, kind == '%'));
    }
    token t = {.type = T_EOF, .line = L->line};
    return lx_push(L, t);
}

/* ------------------------------------------------------------------------------------------ */
/* syntax tree */

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

static const char *const g_filters[] = {
    "abs", "attr", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first",
    "float", "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max",
    "min", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select",
    "selectattr", "sort", "string", "sum", "title", "tojson", "trim", "unique", "upper",
    "wordcount", NULL};
static const char *const g_tests[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even",
    "false", "filter", "float", "ge", "greaterthan", "gt", "in", "integer", "iterable", "le",
    "lessthan", "lower", "lt", "mapping", "ne", "none", "number", "odd", "sameas", "sequence",
    "string", "test", "true", "undefined", "upper", "==", "!=", "<", "<=", ">", ">=", NULL};

static bool in_list(const char *const *l, const char *s) {
    for (; *l; l++)
        if (!strcmp(*l, s)) return true;
    return false;
}

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
    default: snprintf(buf, bn, "'%s'", op_text(t->op)); return buf;
    }
}
static dsp_status unexpected(ps *P, const char *wanted) {
    char b[96];
    return fail(cur(P)->line, "expected %s, got %s", wanted, tok_desc(cur(P), b, sizeof b));
}
static dsp_status expect_op(ps *P, int op) {
    if (!t_op(cur(P), op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op_text(op));
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
        return fail(cur(P)->line, "template nested too deeply (more than %d levels)", P->max_depth);
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
            return fail(cur(P)->line, "unsupported: *args / **kwargs in a call");
        if (cur(P)->type == T_NAME && t_op(look(P), OP_ASSIGN)) {
            const char *k = NULL;
            TRY(take_name(P, &k));
            adv(P);
            node *v = NULL;
            TRY(p_expr(P, true, &v));
            TRY(kw_push(P, &call->kw, &call->nkw, &kwcap, k));
            TRY(nv_push(P, &kwv, v));
        } else {
            if (kwv.n) return fail(cur(P)->line, "positional argument after keyword argument");
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
        if (n + t->n + 2 > sizeof buf) return fail(t->line, "name too long");
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
    if (!in_list(g_filters, f->s)) return fail(line, "unknown or unsupported filter '%s'", f->s);
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
    if (!in_list(g_tests, t->s)) return fail(line, "unknown or unsupported test '%s'", t->s);
    token *c = cur(P);
    if (t_op(c, OP_LPAREN)) {
        TRY(p_call_args(P, t));
    } else if ((c->type == T_NAME || c->type == T_STRING || c->type == T_INT || c->type == T_FLOAT ||
                t_op(c, OP_LBRACKET) || t_op(c, OP_LBRACE)) &&
               !t_name(c, "else") && !t_name(c, "or") && !t_name(c, "and")) {
        if (t_name(c, "is")) return fail(c->line, "you cannot chain multiple tests with is");
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
            nvec args = {0};
            while (!t_op(cur(P), OP_RBRACKET)) {
                if (args.n) TRY(expect_op(P, OP_COMMA));
                node *s = NULL;
                TRY(p_subscribed(P, &s));
                TRY(nv_push(P, &args, s));
            }
            adv(P);
            if (args.n == 0) return fail(t->line, "expected a subscript");
            node *idx = args.v[0];
            if (args.n > 1) {
                idx = nn(P, E_TUPLE, t->line);
                if (!idx) return pnomem();
                idx->v = args.v;
                idx->nv = args.n;
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
            node *c = nn(P, E_CALL, t->line);
            if (!c) return pnomem();
            c->a = *x;
            TRY(p_call_args(P, c));
            *x = c;
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
            node *c = nn(P, E_CALL, t->line);
            if (!c) return pnomem();
            c->a = *x;
            TRY(p_call_args(P, c));
            *x = c;
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
        if (nops == sizeof ops) return fail(t->line, "comparison chain too long");
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
static dsp_status p_and(ps *P, node **out) {
    node *l = NULL;
    TRY(p_not(P, &l));
    while (t_name(cur(P), "and")) {
        int line = cur(P)->line;
        adv(P);
        node *r = NULL;
        TRY(p_not(P, &r));
        node *x = nn(P, E_AND, line);
        if (!x) return pnomem();
        x->a = l;
        x->b = r;
        l = x;
    }
    *out = l;
    return DSP_OK;
}
static dsp_status p_or(ps *P, node **out) {
    node *l = NULL;
    TRY(p_and(P, &l));
    while (t_name(cur(P), "or")) {
        int line = cur(P)->line;
        adv(P);
        node *r = NULL;
        TRY(p_and(P, &r));
        node *x = nn(P, E_OR, line);
        if (!x) return pnomem();
        x->a = l;
        x->b = r;
        l = x;
    }
    *out = l;
    return DSP_OK;
}
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
    nvec args = {0};
    bool is_tuple = false;
    int line = cur(P)->line;
    for (;;) {
        if (args.n) TRY(expect_op(P, OP_COMMA));
        token *t = cur(P);
        if (t->type == T_VAR_END || t->type == T_BLOCK_END || t_op(t, OP_RPAREN) ||
            (extra_end && t_name(t, extra_end)))
            break;
        node *x = NULL;
        TRY(p_expr(P, condexpr, &x));
        TRY(nv_push(P, &args, x));
        if (t_op(cur(P), OP_COMMA)) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (args.n) {
            *out = args.v[0];
            return DSP_OK;
        }
        if (!explicit_parens) return unexpected(P, "an expression");
    }
    node *x = nn(P, E_TUPLE, line);
    if (!x) return pnomem();
    x->v = args.v;
    x->nv = args.n;
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
        if (!in_list(g_filters, f->s)) return fail(line, "unknown or unsupported filter '%s'", f->s);
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
        if (t_name(cur(P), "recursive")) return fail(line, "unsupported: recursive for-loops");
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
            if (st->neg) return fail(line, "a {%% set %%} block needs a single name");
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
                return fail(line, "macro '%s': non-default argument follows default argument", st->s);
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
        if (!P->loops) return fail(line, "'%s' outside of a loop", brk ? "break" : "continue");
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
        if (in_list(known, name)) return fail(line, "unsupported tag '%s'", name);
        return fail(line, "unknown tag '%s'", name);
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
                return fail(t->line, "unexpected end of template: missing {%% %s %%}", want);
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
                    return fail(cur(P)->line, "unexpected {%% %s %%}%s%s", name,
                                ends ? ", expected " : "", ends ? ends[0] : "");
            }
            TRY(p_statement(P, &x));
        } else {
            return unexpected(P, "template data or a tag");
        }
        TRY(nv_push(P, body, x));
    }
}

/* ------------------------------------------------------------------------------------------ */
/* value helpers */

static const char *type_name(const tv *v) {
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

static dsp_status undef_err(const tv *v, int line) {
    if (v->u.uname) return fail(line, "%s", v->u.uname);
    return fail(line, "undefined value used");
}

static bool truthy(const tv *v) {
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

static tlist *list_new(rt *r, size_t cap) {
    tlist *l = ralloc(r, sizeof *l);
    if (!l) return NULL;
    if (cap) {
        l->v = ralloc(r, cap * sizeof(tv));
        if (!l->v) return NULL;
        l->cap = cap;
    }
    return l;
}
static dsp_status list_push(rt *r, tlist *l, tv v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        if (cap > SIZE_MAX / sizeof(tv)) return oom(r->line);
        tv *p = ralloc(r, cap * sizeof(tv));
        if (!p) return oom(r->line);
        if (l->n) memcpy(p, l->v, l->n * sizeof(tv));
        l->v = p;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return DSP_OK;
}
static tdict *dict_new(rt *r) { return ralloc(r, sizeof(tdict)); }

static bool str_eq(const tv *a, const char *s, size_t n) {
    return a->t == V_STR && a->u.s.n == n && !memcmp(a->u.s.p, s, n);
}

static bool val_eq(const tv *a, const tv *b);

static tv *dict_find(const tdict *d, const tv *k) {
    for (size_t i = 0; i < d->n; i++)
        if (val_eq(&d->k[i], k)) return &d->v[i];
    return NULL;
}
static tv *dict_find_s(const tdict *d, const char *s, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (str_eq(&d->k[i], s, n)) return &d->v[i];
    return NULL;
}
static dsp_status dict_set(rt *r, tdict *d, tv k, tv v) {
    tv *slot = dict_find(d, &k);
    if (slot) {
        *slot = v;
        return DSP_OK;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        tv *nk = ralloc(r, cap * sizeof(tv)), *nv = ralloc(r, cap * sizeof(tv));
        if (!nk || !nv) return oom(r->line);
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
static dsp_status dict_set_s(rt *r, tdict *d, const char *s, tv v) {
    return dict_set(r, d, mk_str(s, strlen(s)), v);
}

static bool is_num(const tv *v) { return v->t == V_BOOL || v->t == V_INT || v->t == V_FLOAT; }
static double num_f(const tv *v) {
    return v->t == V_FLOAT ? v->u.f : v->t == V_INT ? (double)v->u.i : (double)v->u.b;
}
static int64_t num_i(const tv *v) { return v->t == V_INT ? v->u.i : (int64_t)v->u.b; }

static bool val_eq(const tv *a, const tv *b) {
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
            if (!val_eq(&a->u.l->v[i], &b->u.l->v[i])) return false;
        return true;
    }
    case V_DICT: {
        if (a->u.d->n != b->u.d->n) return false;
        for (size_t i = 0; i < a->u.d->n; i++) {
            tv *o = dict_find(b->u.d, &a->u.d->k[i]);
            if (!o || !val_eq(&a->u.d->v[i], o)) return false;
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
static dsp_status val_cmp(const tv *a, const tv *b, int line, const char *op, int *res) {
    if (a->t == V_UNDEF) return undef_err(a, line);
    if (b->t == V_UNDEF) return undef_err(b, line);
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
            if (val_eq(&a->u.l->v[i], &b->u.l->v[i])) continue;
            return val_cmp(&a->u.l->v[i], &b->u.l->v[i], line, op, res);
        }
        *res = a->u.l->n < b->u.l->n ? -1 : a->u.l->n > b->u.l->n ? 1 : 0;
        return DSP_OK;
    }
    return fail(line, "'%s' not supported between instances of '%s' and '%s'", op, type_name(a),
                type_name(b));
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

static dsp_status put_str(rt *r, sb *b, const tv *v, int depth) {
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
        uint32_t c = u8_dec(s + i, n - i, &l);
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
    if (depth > 200) return fail(line, "value nested too deeply to print");
    switch (v->t) {
    case V_UNDEF: return fail(line, "cannot print an Undefined value inside a container");
    case V_STR: return put_str_repr(b, v->u.s.p, v->u.s.n, line);
    case V_LIST: {
        if (v->fl != L_LIST && v->fl != L_TUPLE)
            return fail(line, "cannot print a %s object (Python would print its repr)", type_name(v));
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
        return fail(line, "cannot print a %s object (Python would print its repr)", type_name(v));
    default: return put_str(r, b, v, depth);
    }
}

/* json.dumps(v, ensure_ascii, indent, separators, sort_keys) */
typedef struct jopts {
    const char *indent; /* NULL: no indent */
    size_t indent_n;
    const char *item_sep, *key_sep;
    size_t item_sep_n, key_sep_n;
    bool sort_keys, ensure_ascii;
} jopts;

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
            uint32_t cp = u8_dec(s + j, n - j, &l);
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

static dsp_status put_json(rt *r, sb *b, const tv *v, const jopts *o, int level);

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
        return fail(line, "tojson: keys must be str, int, float, bool or None, not %s", type_name(k));
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

static dsp_status put_json(rt *r, sb *b, const tv *v, const jopts *o, int level) {
    int line = r->line;
    char num[64];
    if (level > 200) return fail(line, "tojson: value nested too deeply");
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
            return fail(line, "tojson: Object of type %s is not JSON serializable", type_name(v));
        if (!v->u.l->n) return sb_puts(b, "[]", line);
        TRY(sb_putc(b, '[', line));
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i) TRY(sb_put(b, o->item_sep, o->item_sep_n, line));
            if (o->indent) TRY(json_newline(b, o, level + 1, line));
            TRY(put_json(r, b, &v->u.l->v[i], o, level + 1));
        }
        if (o->indent) TRY(json_newline(b, o, level, line));
        return sb_putc(b, ']', line);
    }
    case V_DICT: {
        tdict *d = v->u.d;
        if (!d->n) return sb_puts(b, "{}", line);
        size_t *idx = ralloc(r, d->n * sizeof *idx);
        if (!idx) return oom(line);
        for (size_t i = 0; i < d->n; i++) idx[i] = i;
        if (o->sort_keys) { /* insertion sort: stable, dicts are small */
            for (size_t i = 0; i < d->n; i++)
                if (d->k[i].t != V_STR)
                    return fail(line, "tojson: sort_keys needs string keys");
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
            TRY(put_json(r, b, &d->v[idx[i]], o, level + 1));
        }
        if (o->indent) TRY(json_newline(b, o, level, line));
        return sb_putc(b, '}', line);
    }
    default:
        return fail(line, "tojson: Object of type %s is not JSON serializable", type_name(v));
    }
}

/* str(v) as a new string value */
static dsp_status to_str(rt *r, const tv *v, tv *out) {
    if (v->t == V_STR) {
        *out = *v;
        return DSP_OK;
    }
    sb b = sb_new(r);
    dsp_status st = put_str(r, &b, v, 0);
    if (st) {
        sb_free(&b);
        return st;
    }
    return sb_to_str(r, &b, out);
}

/* ------------------------------------------------------------------------------------------ */
/* JSON context -> values */

static dsp_status from_json(rt *r, const json_t *j, tv *out, int depth) {
    if (depth > 256) return fail(0, "context JSON nested too deeply");
    switch (json_typeof(j)) {
    case JSON_NULL: *out = mk_none(); return DSP_OK;
    case JSON_TRUE: *out = mk_bool(true); return DSP_OK;
    case JSON_FALSE: *out = mk_bool(false); return DSP_OK;
    case JSON_INTEGER: *out = mk_int((int64_t)json_integer_value(j)); return DSP_OK;
    case JSON_REAL: *out = mk_float(json_real_value(j)); return DSP_OK;
    case JSON_STRING: {
        size_t n = json_string_length(j);
        const char *s = json_string_value(j);
        if (!u8_valid(s, n)) return fail(0, "context JSON: string is not valid UTF-8");
        *out = mk_str(s, n); /* the JSON outlives the render */
        return DSP_OK;
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        tlist *l = list_new(r, n);
        if (!l) return oom(0);
        for (size_t i = 0; i < n; i++) {
            TRY(from_json(r, json_array_get(j, i), &l->v[i], depth + 1));
            l->n++;
        }
        *out = mk_list(l, L_LIST);
        return DSP_OK;
    }
    case JSON_OBJECT: {
        tdict *d = dict_new(r);
        if (!d) return oom(0);
        size_t n = json_object_size(j);
        d->k = ralloc(r, (n ? n : 1) * sizeof(tv));
        d->v = ralloc(r, (n ? n : 1) * sizeof(tv));
        if (!d->k || !d->v) return oom(0);
        d->cap = n;
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)j, key, val) {
            if (d->n >= d->cap) break;
            d->k[d->n] = mk_str(key, strlen(key));
            TRY(from_json(r, val, &d->v[d->n], depth + 1));
            d->n++;
        }
        out->t = V_DICT;
        out->fl = 0;
        out->u.d = d;
        return DSP_OK;
    }
    }
    return fail(0, "context JSON: unexpected value");
}

/* ------------------------------------------------------------------------------------------ */
/* evaluation */

typedef struct args {
    tv *pos;
    size_t npos;
    const char **kwn;
    tv *kwv;
    size_t nkw;
    bool *used; /* kw used flags (for "unexpected keyword" errors) */
} args;

static dsp_status eval(rt *r, scope *sc, node *e, tv *out);
static dsp_status exec_body(rt *r, scope *sc, node **v, size_t n, sb *out);
static dsp_status apply_filter(rt *r, scope *sc, const char *name, tv in, args *a, tv *out);
static dsp_status apply_test(rt *r, const char *name, tv in, args *a, bool *res);

static dsp_status step(rt *r) {
    if (++r->steps > r->t->lim.max_steps)
        return fail(r->line, "template ran more than %" PRIu64 " steps (dsp_tmpl_limits.max_steps)",
                    r->t->lim.max_steps);
    return DSP_OK;
}

static tv *scope_lookup(scope *s, const char *name) {
    size_t n = strlen(name);
    for (; s; s = s->parent) {
        tv *v = dict_find_s(&s->vars, name, n);
        if (v) return v;
    }
    return NULL;
}
static dsp_status scope_set(rt *r, scope *s, const char *name, tv v) {
    return dict_set(r, &s->vars, mk_str(name, strlen(name)), v);
}
static scope *scope_new(rt *r, scope *parent) {
    scope *s = ralloc(r, sizeof *s);
    if (s) s->parent = parent;
    return s;
}

static const char *msgf(rt *r, const char *fmt, ...) DSP_PRINTF(2, 3);
static const char *msgf(rt *r, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return dsp_arena_strndup(r->ar, buf, strlen(buf));
}

static dsp_status eval_args(rt *r, scope *sc, node *call, args *a) {
    memset(a, 0, sizeof *a);
    if (call->nv) {
        a->pos = ralloc(r, call->nv * sizeof(tv));
        if (!a->pos) return oom(call->line);
        for (size_t i = 0; i < call->nv; i++) TRY(eval(r, sc, call->v[i], &a->pos[i]));
        a->npos = call->nv;
    }
    if (call->nv2) {
        a->kwv = ralloc(r, call->nv2 * sizeof(tv));
        a->used = ralloc(r, call->nv2 * sizeof(bool));
        if (!a->kwv || !a->used) return oom(call->line);
        for (size_t i = 0; i < call->nv2; i++) TRY(eval(r, sc, call->v2[i], &a->kwv[i]));
        a->kwn = call->kw;
        a->nkw = call->nv2;
    }
    return DSP_OK;
}

/* argument `pos`-th positional or keyword `kw`; NULL if absent */
static tv *arg(args *a, size_t pos, const char *kw) {
    if (pos < a->npos) return &a->pos[pos];
    for (size_t i = 0; i < a->nkw; i++)
        if (kw && !strcmp(a->kwn[i], kw)) {
            a->used[i] = true;
            return &a->kwv[i];
        }
    return NULL;
}
static dsp_status check_args(rt *r, args *a, size_t max_pos, const char *what) {
    if (a->npos > max_pos)
        return fail(r->line, "%s takes at most %zu positional argument(s), %zu given", what,
                    max_pos, a->npos);
    for (size_t i = 0; i < a->nkw; i++)
        if (!a->used[i]) return fail(r->line, "%s got an unexpected keyword argument '%s'", what, a->kwn[i]);
    return DSP_OK;
}

/* iterate a value into a list (materialized); Python iteration semantics */
static dsp_status iter_list(rt *r, const tv *v, tlist **out) {
    int line = r->line;
    switch (v->t) {
    case V_UNDEF: *out = list_new(r, 0); return *out ? DSP_OK : oom(line);
    case V_LIST: *out = v->u.l; return DSP_OK;
    case V_DICT: {
        tlist *l = list_new(r, v->u.d->n);
        if (!l) return oom(line);
        for (size_t i = 0; i < v->u.d->n; i++) l->v[l->n++] = v->u.d->k[i];
        *out = l;
        return DSP_OK;
    }
    case V_STR: {
        size_t n = u8_count(v->u.s.p, v->u.s.n);
        tlist *l = list_new(r, n);
        if (!l) return oom(line);
        for (size_t i = 0; i < v->u.s.n;) {
            size_t cl;
            u8_dec(v->u.s.p + i, v->u.s.n - i, &cl);
            l->v[l->n++] = mk_str(v->u.s.p + i, cl);
            i += cl;
        }
        *out = l;
        return DSP_OK;
    }
    default: return fail(line, "'%s' object is not iterable", type_name(v));
    }
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
    if (!m) return oom(r->line);
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
        *out = mk_undef(msgf(r, "'LoopContext object' has no attribute '%s'", name));
    return DSP_OK;
}

/* jinja2's sandboxed getattr(obj, name) */
static dsp_status get_attr(rt *r, const tv *obj, const char *name, tv *out) {
    if (obj->t == V_UNDEF) return undef_err(obj, r->line);
    if (name[0] == '_') {
        *out = mk_undef(msgf(r, "access to attribute '%s' of '%s' object is unsafe", name, type_name(obj)));
        return DSP_OK;
    }
    switch (obj->t) {
    case V_DICT:
        if (in_list(DICT_METHODS, name)) return mk_method(r, *obj, name, out);
        if (in_list(DICT_MUTATORS, name)) break;
        {
            tv *v = dict_find_s(obj->u.d, name, strlen(name));
            if (v) {
                *out = *v;
                return DSP_OK;
            }
        }
        *out = mk_undef(msgf(r, "'dict object' has no attribute '%s'", name));
        return DSP_OK;
    case V_NS: {
        tv *v = dict_find_s(obj->u.d, name, strlen(name));
        *out = v ? *v : mk_undef(msgf(r, "'Namespace object' has no attribute '%s'", name));
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
            return fail(r->line, "unsupported: attribute '%s' of a number", name);
        break;
    }
    default: break;
    }
    if ((obj->t == V_DICT && in_list(DICT_MUTATORS, name)) ||
        (obj->t == V_LIST && obj->fl == L_LIST && in_list(LIST_MUTATORS, name))) {
        *out = mk_undef(msgf(r, "access to attribute '%s' of '%s' object is unsafe.", name, type_name(obj)));
        return DSP_OK;
    }
    *out = mk_undef(msgf(r, "'%s object' has no attribute '%s'", type_name(obj), name));
    return DSP_OK;
}

/* byte offset of code point index ci in s (ci in [0, count]) */
static size_t u8_offset(const char *s, size_t n, size_t ci) {
    size_t i = 0;
    while (ci > 0 && i < n) {
        i += u8_len1((unsigned char)s[i]);
        ci--;
    }
    return i > n ? n : i;
}

static bool is_intlike(const tv *v) { return v->t == V_INT || v->t == V_BOOL; }

/* jinja2's getitem(obj, key) */
static dsp_status get_item(rt *r, const tv *obj, const tv *key, tv *out) {
    if (obj->t == V_UNDEF) return undef_err(obj, r->line);
    if (obj->t == V_DICT) {
        tv *v = dict_find(obj->u.d, key);
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
        *out = mk_undef(msgf(r, "%s object has no element %" PRId64, type_name(obj), num_i(key)));
        return DSP_OK;
    } else if (obj->t == V_STR && is_intlike(key)) {
        int64_t i = num_i(key), n = (int64_t)u8_count(obj->u.s.p, obj->u.s.n);
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
            size_t off = u8_offset(obj->u.s.p, obj->u.s.n, (size_t)i);
            *out = mk_str(obj->u.s.p + off, u8_len1((unsigned char)obj->u.s.p[off]));
            return DSP_OK;
        }
        *out = mk_undef("string index out of range");
        return DSP_OK;
    }
    if (key->t == V_STR) {
        char *name = dsp_arena_strndup(r->ar, key->u.s.p, key->u.s.n);
        if (!name) return oom(r->line);
        if (obj->t == V_DICT) {
            if (in_list(DICT_METHODS, name)) return mk_method(r, *obj, name, out);
            *out = mk_undef(msgf(r, "'dict object' has no attribute '%s'", name));
            return DSP_OK;
        }
        return get_attr(r, obj, name, out);
    }
    *out = mk_undef(msgf(r, "'%s object' has no element", type_name(obj)));
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
    if (step == 0) return fail(r->line, "slice step cannot be zero");
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

static dsp_status get_slice(rt *r, const tv *obj, const tv *a, const tv *b, const tv *c, tv *out) {
    if (obj->t == V_UNDEF) return undef_err(obj, r->line);
    slice_ix ix;
    bool ok = false;
    if (obj->t == V_LIST && obj->fl != L_GEN && obj->fl != L_VIEW) {
        TRY(slice_indices(r, (int64_t)obj->u.l->n, a, b, c, &ix, &ok));
        if (ok) {
            tlist *l = list_new(r, (size_t)ix.count);
            if (!l) return oom(r->line);
            for (int64_t i = 0; i < ix.count; i++) l->v[l->n++] = obj->u.l->v[ix.start + i * ix.step];
            *out = mk_list(l, obj->fl == L_TUPLE ? L_TUPLE : L_LIST);
            return DSP_OK;
        }
    } else if (obj->t == V_STR) {
        size_t n = u8_count(obj->u.s.p, obj->u.s.n);
        TRY(slice_indices(r, (int64_t)n, a, b, c, &ix, &ok));
        if (ok) {
            if (n == obj->u.s.n) { /* ASCII fast path */
                if (ix.step == 1) {
                    *out = mk_str(obj->u.s.p + ix.start, (size_t)ix.count);
                    return DSP_OK;
                }
                char *p = ralloc(r, (size_t)ix.count + 1);
                if (!p) return oom(r->line);
                for (int64_t i = 0; i < ix.count; i++) p[i] = obj->u.s.p[ix.start + i * ix.step];
                *out = mk_str(p, (size_t)ix.count);
                return DSP_OK;
            }
            size_t *offs = ralloc(r, (n + 1) * sizeof *offs);
            char *p = ralloc(r, obj->u.s.n + 1);
            if (!offs || !p) return oom(r->line);
            for (size_t i = 0, k = 0; i <= obj->u.s.n && k <= n; k++) {
                offs[k] = i;
                if (i < obj->u.s.n) i += u8_len1((unsigned char)obj->u.s.p[i]);
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

static dsp_status new_str(rt *r, const char *a, size_t an, const char *b, size_t bn, tv *out) {
    if (an + bn > r->t->lim.max_output)
        return fail(r->line, "string longer than %zu bytes (dsp_tmpl_limits.max_output)", r->t->lim.max_output);
    char *p = ralloc(r, an + bn + 1);
    if (!p) return oom(r->line);
    if (an) memcpy(p, a, an);
    if (bn) memcpy(p + an, b, bn);
    *out = mk_str(p, an + bn);
    return DSP_OK;
}

/* markupsafe.escape */
static dsp_status html_escape(rt *r, const tv *s, tv *out) {
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
    TRY(sb_to_str(r, &b, out));
    out->fl = 1;
    return DSP_OK;
}

static dsp_status int_overflow(rt *r) {
    return fail(r->line, "integer overflow (integers are limited to 64 bits here)");
}

static double py_fmod(double a, double b) {
    double m = fmod(a, b);
    if (m != 0 && ((m < 0) != (b < 0))) m += b;
    return m;
}

static dsp_status binop(rt *r, int op, tv a, tv b, tv *out) {
    int line = r->line;
    if (a.t == V_UNDEF) return undef_err(&a, line);
    if (b.t == V_UNDEF) return undef_err(&b, line);
    if (is_num(&a) && is_num(&b)) {
        bool fl = a.t == V_FLOAT || b.t == V_FLOAT;
        if (op == OP_DIV) {
            double y = num_f(&b);
            if (y == 0) return fail(line, "division by zero");
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
                if (y == 0) return fail(line, "float floor division by zero");
                z = floor(x / y); /* close to Python's divmod-based result */
                break;
            case OP_MOD:
                if (y == 0) return fail(line, "float modulo");
                z = py_fmod(x, y);
                break;
            case OP_POW: z = pow(x, y); break;
            default: return fail(line, "bad operator");
            }
            *out = mk_float(z);
            return DSP_OK;
        }
        int64_t x = num_i(&a), y = num_i(&b), z;
        switch (op) {
        case OP_ADD: if (__builtin_add_overflow(x, y, &z)) return int_overflow(r); break;
        case OP_SUB: if (__builtin_sub_overflow(x, y, &z)) return int_overflow(r); break;
        case OP_MUL: if (__builtin_mul_overflow(x, y, &z)) return int_overflow(r); break;
        case OP_FLOORDIV:
        case OP_MOD: {
            if (y == 0) return fail(line, op == OP_MOD ? "integer modulo by zero" : "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) return int_overflow(r);
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
                if (__builtin_mul_overflow(z, x, &z)) return int_overflow(r);
                if (z == 0 || z == 1) break;
                if (z == -1) {
                    z = ((y - k - 1) % 2) ? -z : z;
                    break;
                }
            }
            break;
        }
        default: return fail(line, "bad operator");
        }
        *out = mk_int(z);
        return DSP_OK;
    }
    if (op == OP_ADD && a.t == V_STR && b.t == V_STR) {
        if (a.fl && !b.fl) TRY(html_escape(r, &b, &b));
        else if (b.fl && !a.fl) TRY(html_escape(r, &a, &a));
        TRY(new_str(r, a.u.s.p, a.u.s.n, b.u.s.p, b.u.s.n, out));
        out->fl = a.fl || b.fl;
        return DSP_OK;
    }
    if (op == OP_ADD && a.t == V_LIST && b.t == V_LIST && a.fl == b.fl &&
        (a.fl == L_LIST || a.fl == L_TUPLE)) {
        tlist *l = list_new(r, a.u.l->n + b.u.l->n);
        if (!l) return oom(line);
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
            return fail(line, "string longer than %zu bytes (dsp_tmpl_limits.max_output)", r->t->lim.max_output);
        size_t n = s.u.s.n * (size_t)k;
        char *p = ralloc(r, n + 1);
        if (!p) return oom(line);
        for (int64_t i = 0; i < k; i++) memcpy(p + (size_t)i * s.u.s.n, s.u.s.p, s.u.s.n);
        *out = mk_str(p, n);
        return DSP_OK;
    }
    if (op == OP_MUL && ((a.t == V_LIST && is_intlike(&b)) || (b.t == V_LIST && is_intlike(&a)))) {
        tv l0 = a.t == V_LIST ? a : b;
        int64_t k = a.t == V_LIST ? num_i(&b) : num_i(&a);
        if (l0.fl != L_LIST && l0.fl != L_TUPLE) goto bad;
        if (k < 0) k = 0;
        if (l0.u.l->n && (uint64_t)k > (r->t->lim.max_memory / sizeof(tv)) / l0.u.l->n) return oom(line);
        tlist *l = list_new(r, l0.u.l->n * (size_t)k);
        if (!l) return oom(line);
        for (int64_t i = 0; i < k; i++)
            for (size_t j = 0; j < l0.u.l->n; j++) l->v[l->n++] = l0.u.l->v[j];
        *out = mk_list(l, l0.fl);
        return DSP_OK;
    }
    if (op == OP_MOD && a.t == V_STR)
        return fail(line, "unsupported: printf-style string formatting ('%%' on a string)");
bad:
    return fail(line, "unsupported operand type(s) for %s: '%s' and '%s'", op_text(op),
                type_name(&a), type_name(&b));
}

static dsp_status contains(rt *r, const tv *hay, const tv *needle, bool *res) {
    int line = r->line;
    switch (hay->t) {
    case V_STR:
        if (needle->t != V_STR)
            return fail(line, "'in <string>' requires string as left operand, not %s", type_name(needle));
        if (!needle->u.s.n) { *res = true; return DSP_OK; }
        *res = false;
        if (needle->u.s.n <= hay->u.s.n)
            for (size_t i = 0; i + needle->u.s.n <= hay->u.s.n; i++)
                if (!memcmp(hay->u.s.p + i, needle->u.s.p, needle->u.s.n)) { *res = true; break; }
        return DSP_OK;
    case V_LIST:
        *res = false;
        for (size_t i = 0; i < hay->u.l->n; i++)
            if (val_eq(&hay->u.l->v[i], needle)) { *res = true; break; }
        return DSP_OK;
    case V_DICT: *res = dict_find(hay->u.d, needle) != NULL; return DSP_OK;
    case V_UNDEF: *res = false; return DSP_OK;
    default: return fail(line, "argument of type '%s' is not iterable", type_name(hay));
    }
}

/* ------------------------------------------------------------------------------------------ */
/* strings */

typedef enum { CASE_LOWER, CASE_UPPER, CASE_TITLE_PY, CASE_TITLE_JINJA, CASE_CAPITALIZE } case_mode;

/* lower/upper/title/capitalize; refuses characters whose mapping it does not know */
static dsp_status str_case(rt *r, const tv *s, case_mode mode, tv *out) {
    char *p = ralloc(r, s->u.s.n + 1);
    if (!p) return oom(r->line);
    size_t k = 0;
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < s->u.s.n;) {
        size_t l;
        uint32_t c = u8_dec(s->u.s.p + i, s->u.s.n - i, &l);
        if (!cp_case_known(c))
            return fail(r->line, "case conversion of U+%04X is not supported", c);
        uint32_t o = c;
        switch (mode) {
        case CASE_LOWER: o = cp_lower(c); break;
        case CASE_UPPER: o = cp_upper(c); break;
        case CASE_CAPITALIZE: o = first ? cp_upper(c) : cp_lower(c); break;
        case CASE_TITLE_PY:
            o = prev_cased ? cp_lower(c) : cp_upper(c);
            prev_cased = cp_is_alpha(c);
            break;
        case CASE_TITLE_JINJA: {
            /* words begin after '-', whitespace, '(', '{', '[', '<' */
            o = prev_cased ? cp_lower(c) : cp_upper(c);
            bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_space_cp(c);
            prev_cased = !sep;
            break;
        }
        }
        first = false;
        k += u8_enc(o, p + k);
        i += l;
    }
    *out = mk_str(p, k);
    return DSP_OK;
}

/* set of code points for strip(chars) */
static bool in_chars(const tv *chars, uint32_t c) {
    for (size_t i = 0; i < chars->u.s.n;) {
        size_t l;
        if (u8_dec(chars->u.s.p + i, chars->u.s.n - i, &l) == c) return true;
        i += l;
    }
    return false;
}
/* which: 1 left, 2 right, 3 both; chars NULL/None = whitespace */
static dsp_status str_strip(rt *r, const tv *s, const tv *chars, int which, tv *out) {
    if (chars && chars->t != V_NONE && chars->t != V_STR)
        return fail(r->line, "strip arg must be None or str");
    bool ws = !chars || chars->t == V_NONE;
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, b = 0;
    if (which & 1)
        while (b < n) {
            size_t l;
            uint32_t c = u8_dec(p + b, n - b, &l);
            if (ws ? !py_space_cp(c) : !in_chars(chars, c)) break;
            b += l;
        }
    if (which & 2)
        while (n > b) {
            size_t i = u8_prev(p, n), l;
            uint32_t c = u8_dec(p + i, n - i, &l);
            if (ws ? !py_space_cp(c) : !in_chars(chars, c)) break;
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

static dsp_status str_replace(rt *r, const tv *s, const tv *old, const tv *new_, int64_t count, tv *out) {
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
            size_t l = u8_len1((unsigned char)p[i]);
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
    return sb_to_str(r, &b, out);
}

static dsp_status str_split(rt *r, const tv *s, const tv *sep, int64_t maxsplit, tv *out) {
    tlist *l = list_new(r, 0);
    if (!l) return oom(r->line);
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    if (!sep || sep->t == V_NONE) {
        size_t i = 0;
        int64_t splits = 0;
        for (;;) {
            size_t w;
            while (i < n && (w = py_space_at(p + i, n - i)) > 0) i += w;
            if (i >= n) break;
            if (maxsplit >= 0 && splits >= maxsplit) {
                size_t e = py_rstrip_len(p, n);
                TRY(list_push(r, l, mk_str(p + i, e - i)));
                break;
            }
            size_t j = i;
            while (j < n && !py_space_at(p + j, n - j)) j += u8_len1((unsigned char)p[j]);
            TRY(list_push(r, l, mk_str(p + i, j - i)));
            splits++;
            i = j;
        }
    } else {
        if (sep->t != V_STR) return fail(r->line, "split: separator must be a string");
        if (!sep->u.s.n) return fail(r->line, "split: empty separator");
        const char *q = p, *end = p + n;
        int64_t splits = 0;
        for (;;) {
            const char *f = (maxsplit < 0 || splits < maxsplit) ? memfind(q, (size_t)(end - q), sep->u.s.p, sep->u.s.n) : NULL;
            if (!f) {
                TRY(list_push(r, l, mk_str(q, (size_t)(end - q))));
                break;
            }
            TRY(list_push(r, l, mk_str(q, (size_t)(f - q))));
            splits++;
            q = f + sep->u.s.n;
        }
    }
    *out = mk_list(l, L_LIST);
    return DSP_OK;
}

static dsp_status need_str(rt *r, const tv *v, const char *what) {
    if (!v || v->t != V_STR)
        return fail(r->line, "%s: expected a string argument, got %s", what, v ? type_name(v) : "nothing");
    return DSP_OK;
}
static dsp_status need_int(rt *r, const tv *v, const char *what, int64_t *out) {
    if (!v || !is_intlike(v))
        return fail(r->line, "%s: expected an integer argument, got %s", what, v ? type_name(v) : "nothing");
    *out = num_i(v);
    return DSP_OK;
}

static dsp_status affix_match(rt *r, const tv *s, const tv *a, bool end, bool *res) {
    if (a->t == V_LIST && a->fl == L_TUPLE) {
        *res = false;
        for (size_t i = 0; i < a->u.l->n && !*res; i++) TRY(affix_match(r, s, &a->u.l->v[i], end, res));
        return DSP_OK;
    }
    TRY(need_str(r, a, end ? "endswith" : "startswith"));
    size_t n = a->u.s.n;
    *res = n <= s->u.s.n && !memcmp(s->u.s.p + (end ? s->u.s.n - n : 0), a->u.s.p, n);
    return DSP_OK;
}

static dsp_status str_method(rt *r, const tv *s, const char *m, args *a, tv *out) {
    int line = r->line;
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        tv *x = arg(a, 0, NULL);
        if (!x || a->npos > 1) return fail(line, "%s: only the one-argument form is supported", m);
        bool res = false;
        TRY(affix_match(r, s, x, m[0] == 'e', &res));
        *out = mk_bool(res);
    } else if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        TRY(check_args(r, a, 1, m));
        TRY(str_strip(r, s, arg(a, 0, NULL), m[0] == 'l' ? 1 : m[0] == 'r' ? 2 : 3, out));
        out->fl = 0;
    } else if (!strcmp(m, "split")) {
        tv *sep = arg(a, 0, "sep"), *mx = arg(a, 1, "maxsplit");
        TRY(check_args(r, a, 2, m));
        int64_t maxsplit = -1;
        if (mx) TRY(need_int(r, mx, "split", &maxsplit));
        TRY(str_split(r, s, sep, maxsplit, out));
    } else if (!strcmp(m, "lower") || !strcmp(m, "upper") || !strcmp(m, "title") ||
               !strcmp(m, "capitalize")) {
        TRY(check_args(r, a, 0, m));
        TRY(str_case(r, s, m[0] == 'l' ? CASE_LOWER : m[0] == 'u' ? CASE_UPPER : m[0] == 't' ? CASE_TITLE_PY : CASE_CAPITALIZE, out));
    } else if (!strcmp(m, "replace")) {
        tv *o = arg(a, 0, NULL), *nw = arg(a, 1, NULL), *c = arg(a, 2, "count");
        TRY(check_args(r, a, 3, m));
        TRY(need_str(r, o, "replace"));
        TRY(need_str(r, nw, "replace"));
        int64_t count = -1;
        if (c) TRY(need_int(r, c, "replace", &count));
        TRY(str_replace(r, s, o, nw, count, out));
    } else if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "count") || !strcmp(m, "index")) {
        tv *x = arg(a, 0, NULL);
        if (a->npos != 1 || a->nkw) return fail(line, "%s: only the one-argument form is supported", m);
        TRY(need_str(r, x, m));
        int64_t res = -1, cnt = 0;
        const char *p = s->u.s.p;
        size_t n = s->u.s.n;
        if (!x->u.s.n) {
            cnt = (int64_t)u8_count(p, n) + 1;
            res = !strcmp(m, "rfind") ? (int64_t)u8_count(p, n) : 0;
        } else {
            for (size_t i = 0; i + x->u.s.n <= n;) {
                if (!memcmp(p + i, x->u.s.p, x->u.s.n)) {
                    if (res < 0 || !strcmp(m, "rfind")) res = (int64_t)u8_count(p, i);
                    cnt++;
                    i += x->u.s.n;
                } else {
                    i++;
                }
            }
        }
        if (!strcmp(m, "index") && res < 0) return fail(line, "substring not found");
        *out = mk_int(!strcmp(m, "count") ? cnt : res);
    } else if (!strcmp(m, "join")) {
        tv *x = arg(a, 0, NULL);
        TRY(check_args(r, a, 1, m));
        if (!x) return fail(line, "join: missing argument");
        tlist *l = NULL;
        TRY(iter_list(r, x, &l));
        sb b = sb_new(r);
        for (size_t i = 0; i < l->n; i++) {
            dsp_status st = DSP_OK;
            if (l->v[i].t != V_STR) st = fail(line, "sequence item %zu: expected str instance, %s found", i, type_name(&l->v[i]));
            if (!st && i) st = sb_put(&b, s->u.s.p, s->u.s.n, line);
            if (!st) st = sb_put(&b, l->v[i].u.s.p, l->v[i].u.s.n, line);
            if (st) {
                sb_free(&b);
                return st;
            }
        }
        TRY(sb_to_str(r, &b, out));
    } else if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
        tv *x = arg(a, 0, NULL);
        TRY(check_args(r, a, 1, m));
        TRY(need_str(r, x, m));
        bool suf = m[6] == 's', hit;
        TRY(affix_match(r, s, x, suf, &hit));
        *out = *s;
        out->fl = 0;
        if (hit) {
            out->u.s.n -= x->u.s.n;
            if (!suf) out->u.s.p += x->u.s.n;
        }
    } else if (!strcmp(m, "isdigit") || !strcmp(m, "isalpha") || !strcmp(m, "isspace") ||
               !strcmp(m, "isalnum") || !strcmp(m, "islower") || !strcmp(m, "isupper")) {
        TRY(check_args(r, a, 0, m));
        bool res = s->u.s.n > 0, cased = false;
        for (size_t i = 0; i < s->u.s.n;) {
            size_t l;
            uint32_t c = u8_dec(s->u.s.p + i, s->u.s.n - i, &l);
            i += l;
            if (c >= 0x80 && (!strcmp(m, "islower") || !strcmp(m, "isupper"))) {
                if (!cp_case_known(c)) return fail(line, "str.%s: U+%04X is not supported", m, c);
                bool up = cp_lower(c) != c, lo = cp_upper(c) != c;
                if (m[2] == 'l' ? up : lo) res = false;
                if (up || lo) cased = true;
                continue;
            }
            if (c >= 0x80 && strcmp(m, "isspace"))
                return fail(line, "str.%s on non-ASCII text is not supported", m);
            bool d = c >= '0' && c <= '9', al = c < 0x80 && cp_is_alpha(c);
            if (!strcmp(m, "isdigit")) res = res && d;
            else if (!strcmp(m, "isalpha")) res = res && al;
            else if (!strcmp(m, "isalnum")) res = res && (al || d);
            else if (!strcmp(m, "isspace")) res = res && py_space_cp(c);
            else if (!strcmp(m, "islower")) { if (c >= 'A' && c <= 'Z') res = false; if (c >= 'a' && c <= 'z') cased = true; }
            else { if (c >= 'a' && c <= 'z') res = false; if (c >= 'A' && c <= 'Z') cased = true; }
        }
        if (!strcmp(m, "islower") || !strcmp(m, "isupper")) res = res && cased;
        *out = mk_bool(res);
    } else {
        return fail(line, "unsupported: str.%s()", m);
    }
    return DSP_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* calls */

static dsp_status call_macro(rt *r, tmacro *m, args *a, tv *out) {
    node *d = m->def;
    int line = r->line;
    if (a->npos > d->nkw)
        return fail(line, "macro '%s' takes not more than %zu argument(s)", d->s, d->nkw);
    if (r->depth >= r->t->lim.max_depth)
        return fail(line, "macro calls nested more than %d deep (dsp_tmpl_limits.max_depth)", r->t->lim.max_depth);
    TRY(step(r));
    scope *s = scope_new(r, m->closure);
    if (!s) return oom(line);
    for (size_t k = 0; k < a->nkw; k++) {
        size_t j;
        for (j = 0; j < d->nkw; j++)
            if (!strcmp(d->kw[j], a->kwn[k])) break;
        if (j == d->nkw) return fail(line, "macro '%s' takes no keyword argument '%s'", d->s, a->kwn[k]);
        if (j < a->npos) return fail(line, "macro '%s' got multiple values for argument '%s'", d->s, a->kwn[k]);
    }
    r->depth++;
    for (size_t j = 0; j < d->nkw; j++) {
        tv v = {0};
        tv *given = j < a->npos ? &a->pos[j] : NULL;
        for (size_t k = 0; !given && k < a->nkw; k++)
            if (!strcmp(d->kw[j], a->kwn[k])) given = &a->kwv[k];
        if (given) v = *given;
        else if (d->v2[j]) TRY(eval(r, s, d->v2[j], &v));
        else v = mk_undef(msgf(r, "parameter '%s' was not provided", d->kw[j]));
        TRY(scope_set(r, s, d->kw[j], v));
    }
    sb b = sb_new(r);
    int saved_ctl = r->ctl;
    dsp_status st = exec_body(r, s, d->v, d->nv, &b);
    r->ctl = saved_ctl;
    r->depth--;
    r->line = line;
    if (st) {
        sb_free(&b);
        return st;
    }
    return sb_to_str(r, &b, out);
}

static dsp_status call_builtin(rt *r, int fn, args *a, tv *out) {
    int line = r->line;
    switch (fn) {
    case F_RANGE: {
        if (a->nkw) return fail(line, "range() takes no keyword arguments");
        if (a->npos < 1 || a->npos > 3) return fail(line, "range expected 1 to 3 arguments, got %zu", a->npos);
        int64_t v[3] = {0};
        for (size_t i = 0; i < a->npos; i++) TRY(need_int(r, &a->pos[i], "range", &v[i]));
        int64_t start = 0, stop, stp = 1;
        if (a->npos == 1) stop = v[0];
        else {
            start = v[0];
            stop = v[1];
            if (a->npos == 3) stp = v[2];
        }
        if (stp == 0) return fail(line, "range() arg 3 must not be zero");
        double cnt = stp > 0 ? ceil(((double)stop - (double)start) / (double)stp)
                             : ceil(((double)start - (double)stop) / (double)-stp);
        if (cnt < 0) cnt = 0;
        if (cnt > 100000)
            return fail(line, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        tlist *l = list_new(r, (size_t)cnt);
        if (!l) return oom(line);
        for (int64_t i = 0; i < (int64_t)cnt; i++) l->v[l->n++] = mk_int(start + i * stp);
        *out = mk_list(l, L_RANGE);
        return DSP_OK;
    }
    case F_NAMESPACE: case F_DICT: {
        tdict *d = dict_new(r);
        if (!d) return oom(line);
        for (size_t i = 0; i < a->npos; i++) {
            if (a->pos[i].t != V_DICT)
                return fail(line, "%s(): positional arguments must be mappings",
                            fn == F_DICT ? "dict" : "namespace");
            for (size_t j = 0; j < a->pos[i].u.d->n; j++)
                TRY(dict_set(r, d, a->pos[i].u.d->k[j], a->pos[i].u.d->v[j]));
        }
        if (fn == F_DICT && a->npos > 1) return fail(line, "dict expected at most 1 argument");
        for (size_t i = 0; i < a->nkw; i++) TRY(dict_set_s(r, d, a->kwn[i], a->kwv[i]));
        if (fn == F_NAMESPACE)
            for (size_t i = 0; i < d->n; i++)
                if (d->k[i].t == V_STR && d->k[i].u.s.n && d->k[i].u.s.p[0] == '_')
                    return fail(line, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%.*s'.",
                                (int)d->k[i].u.s.n, d->k[i].u.s.p);
        out->t = fn == F_DICT ? V_DICT : V_NS;
        out->fl = 0;
        out->u.d = d;
        return DSP_OK;
    }
    case F_RAISE: {
        tv *m = arg(a, 0, "message");
        tv s = mk_str("", 0);
        if (m) TRY(to_str(r, m, &s));
        return dsp_error(TERR, "line %d: template raised an exception: %.*s", line,
                         (int)(s.u.s.n > 600 ? 600 : s.u.s.n), s.u.s.p);
    }
    case F_STRFTIME: {
        tv *f = arg(a, 0, "format");
        TRY(check_args(r, a, 1, "strftime_now"));
        TRY(need_str(r, f, "strftime_now"));
        if (memchr(f->u.s.p, '\0', f->u.s.n) || f->u.s.n > 256)
            return fail(line, "strftime_now: bad format");
        /* Python's strftime passes the format to the C library; refuse directives whose output
         * differs between C and Python implementations */
        for (size_t i = 0; i + 1 < f->u.s.n; i++)
            if (f->u.s.p[i] == '%') {
                char c = f->u.s.p[++i];
                if (!strchr("aAbBdHIjmMpSUwWyY%eTDFRn", c))
                    return fail(line, "strftime_now: directive %%%c is not supported", c);
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
        if (!n && fmt[0]) return fail(line, "strftime_now: result too long");
        char *p = dsp_arena_strndup(r->ar, buf, n);
        if (!p) return oom(line);
        *out = mk_str(p, n);
        return DSP_OK;
    }
    }
    return fail(line, "bad builtin");
}

static dsp_status call_method(rt *r, tmeth *me, args *a, tv *out) {
    tv *s = &me->self;
    const char *m = me->name;
    int line = r->line;
    if (s->t == V_STR) return str_method(r, s, m, a, out);
    if (s->t == V_DICT) {
        tdict *d = s->u.d;
        if (!strcmp(m, "get")) {
            tv *k = arg(a, 0, NULL), *def = arg(a, 1, NULL);
            if (!k || a->npos > 2 || a->nkw) return fail(line, "dict.get: expected 1 or 2 arguments");
            tv *v = dict_find(d, k);
            *out = v ? *v : def ? *def : mk_none();
            return DSP_OK;
        }
        if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
            TRY(check_args(r, a, 0, m));
            tlist *l = list_new(r, d->n);
            if (!l) return oom(line);
            for (size_t i = 0; i < d->n; i++) {
                if (m[0] == 'k') l->v[i] = d->k[i];
                else if (m[0] == 'v') l->v[i] = d->v[i];
                else {
                    tlist *pair = list_new(r, 2);
                    if (!pair) return oom(line);
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
            TRY(check_args(r, a, 0, m));
            tdict *c = dict_new(r);
            if (!c) return oom(line);
            for (size_t i = 0; i < d->n; i++) TRY(dict_set(r, c, d->k[i], d->v[i]));
            out->t = V_DICT;
            out->fl = 0;
            out->u.d = c;
            return DSP_OK;
        }
        return fail(line, "unsupported: dict.%s()", m);
    }
    if (s->t == V_LIST) {
        tlist *l = s->u.l;
        if (!strcmp(m, "count") || !strcmp(m, "index")) {
            tv *x = arg(a, 0, NULL);
            if (!x || a->npos != 1 || a->nkw) return fail(line, "%s: expected one argument", m);
            int64_t cnt = 0, first = -1;
            for (size_t i = 0; i < l->n; i++)
                if (val_eq(&l->v[i], x)) {
                    if (first < 0) first = (int64_t)i;
                    cnt++;
                }
            if (m[0] == 'i' && first < 0) return fail(line, "list.index(x): x not in list");
            *out = mk_int(m[0] == 'c' ? cnt : first);
            return DSP_OK;
        }
        if (!strcmp(m, "copy")) {
            TRY(check_args(r, a, 0, m));
            *out = *s;
            return DSP_OK;
        }
        return fail(line, "unsupported: list.%s()", m);
    }
    if (s->t == V_LOOP) {
        tloop *lp = s->u.lp;
        if (!strcmp(m, "cycle")) {
            if (!a->npos) return fail(line, "no items for cycling given");
            *out = a->pos[lp->index0 % a->npos];
            return DSP_OK;
        }
        /* changed(*values) */
        tlist *l = list_new(r, a->npos);
        if (!l) return oom(line);
        for (size_t i = 0; i < a->npos; i++) l->v[l->n++] = a->pos[i];
        tv now = mk_list(l, L_LIST);
        bool changed = !lp->has_changed || !val_eq(&now, &lp->last_changed);
        lp->last_changed = now;
        lp->has_changed = true;
        *out = mk_bool(changed);
        return DSP_OK;
    }
    return fail(line, "unsupported method %s", m);
}

static dsp_status call_value(rt *r, const tv *f, args *a, tv *out) {
    switch (f->t) {
    case V_MACRO: return call_macro(r, f->u.m, a, out);
    case V_FUNC: return call_builtin(r, f->fn, a, out);
    case V_METHOD: return call_method(r, f->u.me, a, out);
    case V_UNDEF: return undef_err(f, r->line);
    default: return fail(r->line, "'%s' object is not callable", type_name(f));
    }
}

/* ------------------------------------------------------------------------------------------ */
/* filters and tests */

/* attribute getter of map/selectattr/sort/...: "a.b.0" */
static dsp_status attr_path(rt *r, const tv *obj, const tv *path, tv *out) {
    if (path->t == V_INT) return get_item(r, obj, path, out);
    TRY(need_str(r, path, "attribute"));
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
        TRY(get_item(r, &cur, &key, &cur));
        if (!dot) break;
        p = dot + 1;
    }
    *out = cur;
    return DSP_OK;
}

/* case-folded sort/unique key */
static dsp_status ci_key(rt *r, const tv *v, bool case_sensitive, tv *out) {
    if (!case_sensitive && v->t == V_STR) return str_case(r, v, CASE_LOWER, out);
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
        TRY(val_cmp(&keys[j], &keys[i], r->line, "<", &c));
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
    case V_STR: *n = (int64_t)u8_count(v->u.s.p, v->u.s.n); return DSP_OK;
    case V_LIST:
        if (v->fl == L_GEN) return fail(r->line, "object of type 'generator' has no len()");
        *n = (int64_t)v->u.l->n;
        return DSP_OK;
    case V_DICT: *n = (int64_t)v->u.d->n; return DSP_OK;
    default: return fail(r->line, "object of type '%s' has no len()", type_name(v));
    }
}

/* select/reject/selectattr/rejectattr */
static dsp_status filter_select(rt *r, const tv *in, args *a, bool attr, bool want, tv *out) {
    tlist *src = NULL;
    if (!truthy(in)) { /* jinja2: `if value:` before iterating */
        src = list_new(r, 0);
        if (!src) return oom(r->line);
        *out = mk_list(src, L_GEN);
        return DSP_OK;
    }
    TRY(iter_list(r, in, &src));
    size_t base = attr ? 1 : 0;
    tv *attrname = attr ? arg(a, 0, NULL) : NULL;
    if (attr && !attrname) return fail(r->line, "selectattr/rejectattr: missing attribute name");
    tv *testname = arg(a, base, NULL);
    char tname[64] = "";
    if (testname) {
        TRY(need_str(r, testname, "select test"));
        snprintf(tname, sizeof tname, "%.*s", (int)testname->u.s.n, testname->u.s.p);
        if (!in_list(g_tests, tname)) return fail(r->line, "unknown or unsupported test '%s'", tname);
    }
    args ta = {0};
    if (a->npos > base + 1) {
        ta.pos = a->pos + base + 1;
        ta.npos = a->npos - base - 1;
    }
    if (a->nkw) return fail(r->line, "select filters: keyword arguments are not supported");
    tlist *l = list_new(r, 0);
    if (!l) return oom(r->line);
    for (size_t i = 0; i < src->n; i++) {
        TRY(step(r));
        tv x = src->v[i];
        if (attr) TRY(attr_path(r, &src->v[i], attrname, &x));
        bool ok = false;
        if (testname) TRY(apply_test(r, tname, x, &ta, &ok));
        else ok = truthy(&x);
        if (ok == want) TRY(list_push(r, l, src->v[i]));
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
            TRY(need_int(r, width, "indent", &w));
            if (w < 0) w = 0;
            if ((uint64_t)w > 4096) return fail(r->line, "indent: width too large");
            char *p = ralloc(r, (size_t)w + 1);
            if (!p) return oom(r->line);
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
        while (j < n && !(lb = py_linebreak_at(p + j, n - j))) j += u8_len1((unsigned char)p[j]);
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
    return sb_to_str(r, &b, out);
}

static dsp_status apply_filter(rt *r, scope *sc, const char *f, tv in, args *a, tv *out) {
    int line = r->line;
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        tv *def = arg(a, 0, "default_value"), *boolean = arg(a, 1, "boolean");
        TRY(check_args(r, a, 2, f));
        bool use = in.t == V_UNDEF || (boolean && truthy(boolean) && !truthy(&in));
        *out = use ? (def ? *def : mk_str("", 0)) : in;
        return DSP_OK;
    }
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        TRY(check_args(r, a, 0, f));
        int64_t n = {0};
        TRY(filter_length(r, &in, &n));
        *out = mk_int(n);
        return DSP_OK;
    }
    if (!strcmp(f, "tojson")) {
        /* HF: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
        tv *ea = arg(a, 0, "ensure_ascii"), *ind = arg(a, 1, "indent"), *seps = arg(a, 2, "separators"),
           *sk = arg(a, 3, "sort_keys");
        TRY(check_args(r, a, 4, f));
        jopts o = {0};
        o.ensure_ascii = ea && truthy(ea);
        o.sort_keys = sk && truthy(sk);
        if (ind && ind->t != V_NONE) {
            if (ind->t == V_STR) {
                o.indent = ind->u.s.p;
                o.indent_n = ind->u.s.n;
            } else {
                int64_t w = {0};
                TRY(need_int(r, ind, "tojson indent", &w));
                if (w < 0) w = 0;
                if (w > 4096) return fail(line, "tojson: indent too large");
                char *p = ralloc(r, (size_t)w + 1);
                if (!p) return oom(line);
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
                return fail(line, "tojson: separators must be a pair of strings");
            o.item_sep = seps->u.l->v[0].u.s.p;
            o.item_sep_n = seps->u.l->v[0].u.s.n;
            o.key_sep = seps->u.l->v[1].u.s.p;
            o.key_sep_n = seps->u.l->v[1].u.s.n;
        }
        sb b = sb_new(r);
        dsp_status st = put_json(r, &b, &in, &o, 0);
        if (st) {
            sb_free(&b);
            return st;
        }
        return sb_to_str(r, &b, out);
    }
    if (!strcmp(f, "string")) {
        TRY(check_args(r, a, 0, f));
        return to_str(r, &in, out);
    }
    if (!strcmp(f, "safe")) {
        TRY(check_args(r, a, 0, f));
        TRY(to_str(r, &in, out));
        out->fl = 1;
        return DSP_OK;
    }
    if (!strcmp(f, "e") || !strcmp(f, "escape")) {
        TRY(check_args(r, a, 0, f));
        if (in.t == V_STR && in.fl) { *out = in; return DSP_OK; }
        tv s = {0};
        TRY(to_str(r, &in, &s));
        return html_escape(r, &s, out);
    }
    if (!strcmp(f, "trim") || !strcmp(f, "lower") || !strcmp(f, "upper") || !strcmp(f, "title") ||
        !strcmp(f, "capitalize") || !strcmp(f, "replace") || !strcmp(f, "indent") ||
        !strcmp(f, "wordcount")) {
        tv s = {0};
        TRY(to_str(r, &in, &s));
        if (!strcmp(f, "trim")) {
            tv *chars = arg(a, 0, "chars");
            TRY(check_args(r, a, 1, f));
            return str_strip(r, &s, chars, 3, out);
        }
        if (!strcmp(f, "replace")) {
            tv *o = arg(a, 0, "old"), *nw = arg(a, 1, "new"), *c = arg(a, 2, "count");
            TRY(check_args(r, a, 3, f));
            if (!o || !nw) return fail(line, "replace: needs old and new");
            tv os, ns;
            TRY(to_str(r, o, &os));
            TRY(to_str(r, nw, &ns));
            int64_t count = -1;
            if (c && c->t != V_NONE) TRY(need_int(r, c, "replace", &count));
            if (s.fl) return fail(line, "unsupported: replace on a |safe string");
            return str_replace(r, &s, &os, &ns, count, out);
        }
        if (!strcmp(f, "indent")) {
            tv *w = arg(a, 0, "width"), *fi = arg(a, 1, "first"), *bl = arg(a, 2, "blank");
            TRY(check_args(r, a, 3, f));
            return do_indent(r, &s, w, fi && truthy(fi), bl && truthy(bl), out);
        }
        if (!strcmp(f, "wordcount")) return fail(line, "unsupported filter 'wordcount'");
        TRY(check_args(r, a, 0, f));
        return str_case(r, &s, f[0] == 'l' ? CASE_LOWER : f[0] == 'u' ? CASE_UPPER : f[0] == 't' ? CASE_TITLE_JINJA : CASE_CAPITALIZE, out);
    }
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        TRY(check_args(r, a, 0, f));
        if (f[0] == 'l' && in.t == V_LIST && in.fl == L_GEN)
            return fail(line, "'generator' object is not reversible");
        tlist *l = NULL;
        TRY(iter_list(r, &in, &l));
        *out = l->n ? l->v[f[0] == 'f' ? 0 : l->n - 1] : mk_undef(msgf(r, "No %s item, sequence was empty.", f));
        return DSP_OK;
    }
    if (!strcmp(f, "list")) {
        TRY(check_args(r, a, 0, f));
        tlist *l = NULL;
        TRY(iter_list(r, &in, &l));
        *out = mk_list(l, L_LIST);
        return DSP_OK;
    }
    if (!strcmp(f, "join")) {
        tv *sep = arg(a, 0, "d"), *at = arg(a, 1, "attribute");
        TRY(check_args(r, a, 2, f));
        tlist *l = NULL;
        TRY(iter_list(r, &in, &l));
        tv seps = mk_str("", 0);
        if (sep) TRY(to_str(r, sep, &seps));
        sb b = sb_new(r);
        for (size_t i = 0; i < l->n; i++) {
            tv x = l->v[i];
            dsp_status st = DSP_OK;
            if (at && at->t != V_NONE) st = attr_path(r, &l->v[i], at, &x);
            if (!st && i) st = sb_put(&b, seps.u.s.p, seps.u.s.n, line);
            if (!st) st = put_str(r, &b, &x, 0);
            if (st) {
                sb_free(&b);
                return st;
            }
        }
        return sb_to_str(r, &b, out);
    }
    if (!strcmp(f, "map")) {
        tlist *src = NULL;
        if (truthy(&in)) TRY(iter_list(r, &in, &src)); /* jinja2: `if value:` */
        else if (!(src = list_new(r, 0))) return oom(line);
        tlist *l = list_new(r, src->n);
        if (!l) return oom(line);
        tv *at = NULL, *def = NULL;
        for (size_t i = 0; i < a->nkw; i++) {
            if (!strcmp(a->kwn[i], "attribute")) at = &a->kwv[i];
            else if (!strcmp(a->kwn[i], "default")) def = &a->kwv[i];
        }
        if (at) {
            if (a->npos) return fail(line, "map: attribute= takes no positional arguments");
            for (size_t i = 0; i < src->n; i++) {
                TRY(step(r));
                tv x = {0};
                TRY(attr_path(r, &src->v[i], at, &x));
                if (x.t == V_UNDEF && def) x = *def;
                l->v[l->n++] = x;
            }
        } else {
            if (!a->npos || a->pos[0].t != V_STR) return fail(line, "map: expected a filter name or attribute=");
            char fname[64];
            snprintf(fname, sizeof fname, "%.*s", (int)a->pos[0].u.s.n, a->pos[0].u.s.p);
            if (!in_list(g_filters, fname)) return fail(line, "unknown or unsupported filter '%s'", fname);
            args fa = *a;
            fa.pos++;
            fa.npos--;
            for (size_t i = 0; i < src->n; i++) {
                TRY(step(r));
                if (fa.used) memset(fa.used, 0, fa.nkw * sizeof(bool));
                TRY(apply_filter(r, sc, fname, src->v[i], &fa, &l->v[l->n]));
                l->n++;
            }
        }
        *out = mk_list(l, L_GEN);
        return DSP_OK;
    }
    if (!strcmp(f, "select")) return filter_select(r, &in, a, false, true, out);
    if (!strcmp(f, "reject")) return filter_select(r, &in, a, false, false, out);
    if (!strcmp(f, "selectattr")) return filter_select(r, &in, a, true, true, out);
    if (!strcmp(f, "rejectattr")) return filter_select(r, &in, a, true, false, out);
    if (!strcmp(f, "items")) {
        TRY(check_args(r, a, 0, f));
        if (in.t == V_UNDEF) {
            tlist *l = list_new(r, 0);
            if (!l) return oom(line);
            *out = mk_list(l, L_GEN);
            return DSP_OK;
        }
        if (in.t != V_DICT) return fail(line, "Can only get item pairs from a mapping.");
        tmeth me = {.self = in, .name = "items"};
        args none = {0};
        TRY(call_method(r, &me, &none, out));
        out->fl = L_GEN;
        return DSP_OK;
    }
    if (!strcmp(f, "unique") || !strcmp(f, "sort") || !strcmp(f, "dictsort") || !strcmp(f, "min") ||
        !strcmp(f, "max")) {
        bool is_sort = !strcmp(f, "sort"), is_dsort = !strcmp(f, "dictsort");
        tv *rev = NULL, *cs = NULL, *at = NULL, *by = NULL;
        if (is_sort) { rev = arg(a, 0, "reverse"); cs = arg(a, 1, "case_sensitive"); at = arg(a, 2, "attribute"); }
        else if (is_dsort) { cs = arg(a, 0, "case_sensitive"); by = arg(a, 1, "by"); rev = arg(a, 2, "reverse"); }
        else { cs = arg(a, 0, "case_sensitive"); at = arg(a, 1, "attribute"); }
        TRY(check_args(r, a, 3, f));
        bool case_s = cs && truthy(cs);
        tlist *src = NULL;
        if (is_dsort) {
            if (in.t != V_DICT) return fail(line, "dictsort: expected a mapping");
            tmeth me = {.self = in, .name = "items"};
            args none = {0};
            tv items = {0};
            TRY(call_method(r, &me, &none, &items));
            src = items.u.l;
        } else {
            TRY(iter_list(r, &in, &src));
        }
        size_t n = src->n;
        tv *keys = ralloc(r, (n + 1) * sizeof(tv)), *items = ralloc(r, (n + 1) * sizeof(tv));
        if (!keys || !items) return oom(line);
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            TRY(step(r));
            tv k = src->v[i];
            if (is_dsort) {
                bool by_value = by && by->t == V_STR && str_eq(by, "value", 5);
                k = k.u.l->v[by_value ? 1 : 0];
            } else if (at && at->t != V_NONE) {
                TRY(attr_path(r, &src->v[i], at, &k));
            }
            TRY(ci_key(r, &k, case_s, &k));
            if (!strcmp(f, "unique")) {
                bool seen = false;
                for (size_t j = 0; j < m && !seen; j++) seen = val_eq(&keys[j], &k);
                if (seen) continue;
            }
            keys[m] = k;
            items[m++] = src->v[i];
        }
        if (!strcmp(f, "unique")) {
            tlist *l = list_new(r, 0);
            if (!l) return oom(line);
            l->v = items;
            l->n = l->cap = m;
            *out = mk_list(l, L_GEN);
            return DSP_OK;
        }
        if (!strcmp(f, "min") || !strcmp(f, "max")) {
            if (!m) {
                *out = mk_undef("No aggregated item, sequence was empty.");
                return DSP_OK;
            }
            size_t best = 0;
            for (size_t i = 1; i < m; i++) {
                int c = 0;
                TRY(val_cmp(&keys[i], &keys[best], line, "<", &c));
                if (f[1] == 'i' ? c < 0 : c > 0) best = i;
            }
            *out = items[best];
            return DSP_OK;
        }
        tv *tk = ralloc(r, (n + 1) * sizeof(tv)), *ti = ralloc(r, (n + 1) * sizeof(tv));
        if (!tk || !ti) return oom(line);
        TRY(msort(r, keys, items, m, tk, ti, rev && truthy(rev)));
        tlist *l = list_new(r, 0);
        if (!l) return oom(line);
        l->v = items;
        l->n = l->cap = m;
        *out = mk_list(l, L_LIST);
        return DSP_OK;
    }
    if (!strcmp(f, "reverse")) {
        TRY(check_args(r, a, 0, f));
        if (in.t == V_STR) {
            tv neg1 = mk_int(-1);
            return get_slice(r, &in, NULL, NULL, &neg1, out);
        }
        /* reversed(value), or for generators list(value) reversed */
        bool gen = in.t == V_LIST && in.fl == L_GEN;
        tlist *src = NULL;
        TRY(iter_list(r, &in, &src));
        tlist *l = list_new(r, src->n);
        if (!l) return oom(line);
        for (size_t i = 0; i < src->n; i++) l->v[l->n++] = src->v[src->n - 1 - i];
        *out = mk_list(l, gen ? L_LIST : L_GEN);
        return DSP_OK;
    }
    if (!strcmp(f, "int") || !strcmp(f, "float")) {
        bool is_int = f[0] == 'i';
        tv *def = arg(a, 0, "default"), *base = is_int ? arg(a, 1, "base") : NULL;
        TRY(check_args(r, a, is_int ? 2 : 1, f));
        if (base && !(is_intlike(base) && num_i(base) == 10)) return fail(line, "int: only base 10 is supported");
        tv d = def ? *def : is_int ? mk_int(0) : mk_float(0.0);
        if (in.t == V_INT || in.t == V_BOOL) *out = is_int ? mk_int(num_i(&in)) : mk_float(num_f(&in));
        else if (in.t == V_FLOAT) {
            if (is_int && (isnan(in.u.f) || fabs(in.u.f) >= 9.2e18)) *out = d;
            else *out = is_int ? mk_int((int64_t)in.u.f) : in;
        } else if (in.t == V_STR) {
            char buf[64];
            size_t b0 = py_lstrip_off(in.u.s.p, in.u.s.n), e0 = py_rstrip_len(in.u.s.p, in.u.s.n);
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
    if (!strcmp(f, "abs")) {
        TRY(check_args(r, a, 0, f));
        if (in.t == V_FLOAT) *out = mk_float(fabs(in.u.f));
        else if (is_intlike(&in)) {
            if (num_i(&in) == INT64_MIN) return int_overflow(r);
            *out = mk_int(llabs(num_i(&in)));
        } else return fail(line, "bad operand type for abs(): '%s'", type_name(&in));
        return DSP_OK;
    }
    if (!strcmp(f, "round")) {
        tv *pr = arg(a, 0, "precision"), *me = arg(a, 1, "method");
        TRY(check_args(r, a, 2, f));
        int64_t p = 0;
        if (pr) TRY(need_int(r, pr, "round", &p));
        if (!is_num(&in)) return fail(line, "round: expected a number");
        if (p < 0 || p > 15) return fail(line, "round: precision out of supported range");
        double x = num_f(&in), sc10 = pow(10, (double)p), y;
        const char *method = "common";
        char mb[16];
        if (me) {
            TRY(need_str(r, me, "round"));
            snprintf(mb, sizeof mb, "%.*s", (int)me->u.s.n, me->u.s.p);
            method = mb;
        }
        if (!strcmp(method, "ceil")) y = ceil(x * sc10) / sc10;
        else if (!strcmp(method, "floor")) y = floor(x * sc10) / sc10;
        else if (!strcmp(method, "common")) {
            if (p != 0) return fail(line, "round: only precision 0 is supported with method 'common'");
            y = nearbyint(x); /* round-half-even, as Python's round() */
        } else return fail(line, "round: method must be common, ceil or floor");
        *out = mk_float(y);
        return DSP_OK;
    }
    if (!strcmp(f, "sum")) {
        tv *at = arg(a, 0, "attribute"), *start = arg(a, 1, "start");
        TRY(check_args(r, a, 2, f));
        tlist *src = NULL;
        TRY(iter_list(r, &in, &src));
        tv acc = start ? *start : mk_int(0);
        for (size_t i = 0; i < src->n; i++) {
            tv x = src->v[i];
            if (at && at->t != V_NONE) TRY(attr_path(r, &src->v[i], at, &x));
            TRY(binop(r, OP_ADD, acc, x, &acc));
        }
        *out = acc;
        return DSP_OK;
    }
    if (!strcmp(f, "attr")) {
        tv *nm = arg(a, 0, "name");
        TRY(check_args(r, a, 1, f));
        TRY(need_str(r, nm, "attr"));
        char *name = dsp_arena_strndup(r->ar, nm->u.s.p, nm->u.s.n);
        if (!name) return oom(line);
        return get_attr(r, &in, name, out);
    }
    (void)sc;
    return fail(line, "unsupported filter '%s'", f);
}

static dsp_status apply_test(rt *r, const char *t, tv v, args *a, bool *res) {
    int line = r->line;
    tv *x = arg(a, 0, NULL);
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
        if (v.t == V_UNDEF) return undef_err(&v, line);
        if (!is_intlike(&v)) return fail(line, "test '%s' needs an integer", t);
        *res = (num_i(&v) & 1) == (t[0] == 'o');
    } else if (!strcmp(t, "divisibleby")) {
        int64_t d = {0};
        TRY(need_int(r, x, "divisibleby", &d));
        if (!is_intlike(&v)) return fail(line, "test 'divisibleby' needs an integer");
        if (d == 0) return fail(line, "integer division or modulo by zero");
        *res = (d == -1) || num_i(&v) % d == 0;
    } else if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        tv s = {0};
        TRY(to_str(r, &v, &s));
        args none = {0};
        tv o = {0};
        TRY(str_method(r, &s, t[0] == 'l' ? "islower" : "isupper", &none, &o));
        *res = o.u.b;
    } else if (!strcmp(t, "filter") || !strcmp(t, "test")) {
        char nm[64] = "";
        if (v.t == V_STR) snprintf(nm, sizeof nm, "%.*s", (int)v.u.s.n, v.u.s.p);
        *res = v.t == V_STR && in_list(t[0] == 'f' ? g_filters : g_tests, nm);
    } else {
        if (!x) return fail(line, "test '%s' needs an argument", t);
        if (!strcmp(t, "eq") || !strcmp(t, "equalto") || !strcmp(t, "==")) *res = val_eq(&v, x);
        else if (!strcmp(t, "ne") || !strcmp(t, "!=")) *res = !val_eq(&v, x);
        else if (!strcmp(t, "sameas")) {
            bool scalar = v.t == V_NONE || v.t == V_BOOL || v.t == V_UNDEF;
            *res = v.t == x->t && (scalar ? val_eq(&v, x) : !memcmp(&v.u, &x->u, sizeof v.u));
        } else if (!strcmp(t, "in")) TRY(contains(r, x, &v, res));
        else {
            int c = 0;
            TRY(val_cmp(&v, x, line, t, &c));
            if (!strcmp(t, "lt") || !strcmp(t, "lessthan") || !strcmp(t, "<")) *res = c < 0;
            else if (!strcmp(t, "le") || !strcmp(t, "<=")) *res = c <= 0;
            else if (!strcmp(t, "gt") || !strcmp(t, "greaterthan") || !strcmp(t, ">")) *res = c > 0;
            else if (!strcmp(t, "ge") || !strcmp(t, ">=")) *res = c >= 0;
            else return fail(line, "unsupported test '%s'", t);
        }
    }
    return DSP_OK;
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
    return apply_filter(r, sc, e->s, in, &a, out);
}

static dsp_status eval(rt *r, scope *sc, node *e, tv *out) {
    if (r->depth > r->t->lim.max_depth * 4)
        return fail(e->line, "expression nested too deeply");
    r->line = e->line;
    switch (e->k) {
    case E_CONST: *out = e->cv; return DSP_OK;
    case E_HOLE: *out = r->hole; return DSP_OK;
    case E_NAME: {
        tv *v = scope_lookup(sc, e->s);
        *out = v ? *v : mk_undef(msgf(r, "'%s' is undefined", e->s));
        return DSP_OK;
    }
    case E_ATTR: {
        tv o = {0};
        TRY(eval(r, sc, e->a, &o));
        r->line = e->line;
        return get_attr(r, &o, e->s, out);
    }
    case E_ITEM: {
        tv o = {0}, k = {0};
        TRY(eval(r, sc, e->a, &o));
        TRY(eval(r, sc, e->b, &k));
        r->line = e->line;
        return get_item(r, &o, &k, out);
    }
    case E_SLICE: {
        if (!e->nv) return fail(e->line, "unsupported: slice inside a tuple subscript");
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
        return get_slice(r, &o, pp[0], pp[1], pp[2], out);
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
        TRY(apply_test(r, e->s, v, &a, &res));
        *out = mk_bool(e->neg ? !res : res);
        return DSP_OK;
    }
    case E_BIN: {
        tv a = {0}, b = {0};
        TRY(eval(r, sc, e->a, &a));
        TRY(eval(r, sc, e->b, &b));
        r->line = e->line;
        return binop(r, e->op, a, b, out);
    }
    case E_NEG: case E_POS: {
        tv a = {0};
        TRY(eval(r, sc, e->a, &a));
        r->line = e->line;
        if (a.t == V_UNDEF) return undef_err(&a, e->line);
        if (a.t == V_FLOAT) *out = mk_float(e->k == E_NEG ? -a.u.f : a.u.f);
        else if (is_intlike(&a)) {
            if (e->k == E_NEG && num_i(&a) == INT64_MIN) return int_overflow(r);
            *out = mk_int(e->k == E_NEG ? -num_i(&a) : num_i(&a));
        } else return fail(e->line, "bad operand type for unary %c: '%s'", e->k == E_NEG ? '-' : '+', type_name(&a));
        return DSP_OK;
    }
    case E_NOT: {
        tv a = {0};
        TRY(eval(r, sc, e->a, &a));
        *out = mk_bool(!truthy(&a));
        return DSP_OK;
    }
    case E_AND: case E_OR: {
        tv a = {0};
        TRY(eval(r, sc, e->a, &a));
        bool t = truthy(&a);
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
            if (op == OP_EQ) ok = val_eq(&l, &rr);
            else if (op == OP_NE) ok = !val_eq(&l, &rr);
            else if (op == OP_IN || op == OP_NOTIN) {
                TRY(contains(r, &rr, &l, &ok));
                if (op == OP_NOTIN) ok = !ok;
            } else {
                int c = 0;
                TRY(val_cmp(&l, &rr, e->line, op_text(op), &c));
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
        if (truthy(&c)) return eval(r, sc, e->b, out);
        if (e->c) return eval(r, sc, e->c, out);
        *out = mk_undef("the inline if-expression evaluated to false and no else section was defined.");
        return DSP_OK;
    }
    case E_LIST: case E_TUPLE: {
        tlist *l = list_new(r, e->nv);
        if (!l) return oom(e->line);
        for (size_t i = 0; i < e->nv; i++) {
            TRY(eval(r, sc, e->v[i], &l->v[i]));
            l->n++;
        }
        *out = mk_list(l, e->k == E_LIST ? L_LIST : L_TUPLE);
        return DSP_OK;
    }
    case E_DICT: {
        tdict *d = dict_new(r);
        if (!d) return oom(e->line);
        for (size_t i = 0; i < e->nv; i++) {
            tv k, v;
            TRY(eval(r, sc, e->v[i], &k));
            TRY(eval(r, sc, e->v2[i], &v));
            if (k.t == V_LIST && k.fl != L_TUPLE) return fail(e->line, "unhashable type: 'list'");
            if (k.t == V_DICT || k.t == V_UNDEF) return fail(e->line, "unhashable dict key");
            TRY(dict_set(r, d, k, v));
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
            if (!st) st = put_str(r, &b, &v, 0);
            if (st) {
                sb_free(&b);
                return st;
            }
        }
        return sb_to_str(r, &b, out);
    }
    default: return fail(e->line, "internal: bad expression node %d", e->k);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* statements */

static dsp_status assign_targets(rt *r, scope *sc, node *st, tv v) {
    if (!st->neg) return scope_set(r, sc, st->kw ? st->kw[0] : st->s, v);
    if (v.t == V_LIST && v.fl == L_GEN) return fail(st->line, "cannot unpack a generator here");
    tlist *l = NULL;
    TRY(iter_list(r, &v, &l));
    if (l->n != st->nkw)
        return fail(st->line, "%s values to unpack (expected %zu, got %zu)",
                    l->n > st->nkw ? "too many" : "not enough", st->nkw, l->n);
    for (size_t i = 0; i < st->nkw; i++) TRY(scope_set(r, sc, st->kw[i], l->v[i]));
    return DSP_OK;
}

static dsp_status exec_for(rt *r, scope *sc, node *st, sb *out) {
    tv it = {0};
    TRY(eval(r, sc, st->a, &it));
    r->line = st->line;
    tlist *items = NULL;
    TRY(iter_list(r, &it, &items));
    if (st->b) { /* for x in xs if cond: filter first, so loop.length counts kept items */
        tlist *kept = list_new(r, 0);
        if (!kept) return oom(st->line);
        for (size_t i = 0; i < items->n; i++) {
            TRY(step(r));
            scope *s = scope_new(r, sc);
            if (!s) return oom(st->line);
            TRY(assign_targets(r, s, st, items->v[i]));
            tv c = {0};
            TRY(eval(r, s, st->b, &c));
            if (truthy(&c)) TRY(list_push(r, kept, items->v[i]));
        }
        items = kept;
    }
    if (!items->n) {
        if (st->nv2) return exec_body(r, sc, st->v2, st->nv2, out);
        return DSP_OK;
    }
    tloop *lp = ralloc(r, sizeof *lp);
    if (!lp) return oom(st->line);
    lp->items = items;
    tv loopv = {.t = V_LOOP};
    loopv.u.lp = lp;
    if (r->loop_depth >= r->t->lim.max_depth) return fail(st->line, "loops nested too deeply");
    r->loop_depth++;
    for (size_t i = 0; i < items->n; i++) {
        r->line = st->line;
        TRY(step(r));
        lp->index0 = i;
        scope *s = scope_new(r, sc);
        if (!s) return oom(st->line);
        TRY(assign_targets(r, s, st, items->v[i]));
        TRY(scope_set(r, s, "loop", loopv));
        TRY(exec_body(r, s, st->v, st->nv, out));
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
    TRY(step(r));
    switch (st->k) {
    case S_TEXT: return sb_put(out, st->s, st->sl, st->line);
    case S_OUT: {
        tv v = {0};
        TRY(eval(r, sc, st->a, &v));
        r->line = st->line;
        return put_str(r, out, &v, 0);
    }
    case S_IF: {
        tv c = {0};
        TRY(eval(r, sc, st->a, &c));
        if (truthy(&c)) return exec_body(r, sc, st->v, st->nv, out);
        return exec_body(r, sc, st->v2, st->nv2, out);
    }
    case S_FOR: return exec_for(r, sc, st, out);
    case S_SET: {
        tv v = {0};
        TRY(eval(r, sc, st->a, &v));
        r->line = st->line;
        if (st->s2) {
            tv *ns = scope_lookup(sc, st->s);
            if (!ns || ns->t != V_NS)
                return fail(st->line, "cannot assign attribute on non-namespace object '%s'", st->s);
            if (st->s2[0] == '_')
                return fail(st->line, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'.", st->s2);
            return dict_set_s(r, ns->u.d, st->s2, v);
        }
        return assign_targets(r, sc, st, v);
    }
    case S_SETBLOCK: case S_FILTERBLOCK: {
        sb b = sb_new(r);
        dsp_status e = exec_body(r, sc, st->v, st->nv, &b);
        if (e) {
            sb_free(&b);
            return e;
        }
        tv v = {0};
        TRY(sb_to_str(r, &b, &v));
        if (st->b) {
            tv saved = r->hole;
            r->hole = v;
            dsp_status fs = eval(r, sc, st->b, &v);
            r->hole = saved;
            TRY(fs);
        }
        r->line = st->line;
        if (st->k == S_FILTERBLOCK) return put_str(r, out, &v, 0);
        if (st->s2) {
            tv *ns = scope_lookup(sc, st->s);
            if (!ns || ns->t != V_NS)
                return fail(st->line, "cannot assign attribute on non-namespace object '%s'", st->s);
            return dict_set_s(r, ns->u.d, st->s2, v);
        }
        return scope_set(r, sc, st->s, v);
    }
    case S_MACRO: {
        tmacro *m = ralloc(r, sizeof *m);
        if (!m) return oom(st->line);
        m->def = st;
        m->closure = sc;
        tv v = {.t = V_MACRO};
        v.u.m = m;
        return scope_set(r, sc, st->s, v);
    }
    case S_BREAK: r->ctl = CTL_BREAK; return DSP_OK;
    case S_CONTINUE: r->ctl = CTL_CONTINUE; return DSP_OK;
    case S_BODY: return exec_body(r, sc, st->v, st->nv, out);
    case S_WITH: {
        scope *s = scope_new(r, sc);
        if (!s) return oom(st->line);
        for (size_t i = 0; i < st->nkw; i++) {
            tv v = {0};
            TRY(eval(r, sc, st->v2[i], &v));
            TRY(scope_set(r, s, st->kw[i], v));
        }
        return exec_body(r, s, st->v, st->nv, out);
    }
    default: return fail(st->line, "internal: bad statement node %d", st->k);
    }
}

static dsp_status exec_body(rt *r, scope *sc, node **v, size_t n, sb *out) {
    if (r->depth > r->t->lim.max_depth * 4) return fail(r->line, "template nested too deeply");
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

/* ------------------------------------------------------------------------------------------ */
/* public API */

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
        return fail(0, "template source is %zu bytes, more than the limit of %zu", len, lim.max_source);
    if (!u8_valid(src ? src : "", len)) return fail(0, "template source is not valid UTF-8");
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

    lexer L = {.s = s, .n = n, .ar = &t->ar};
    dsp_status st = lex(&L);
    if (!st) {
        ps P = {.tk = L.tk, .n = L.ntk, .ar = &t->ar, .max_depth = lim.max_depth};
        nvec body = {0};
        st = p_body(&P, NULL, &body);
        if (!st) {
            node *root = nn(&P, S_BODY, 1);
            if (!root) st = pnomem();
            else {
                root->v = body.v;
                root->nv = body.n;
                t->root = root;
            }
        }
    }
    free(L.tk);
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
    if (ctx && !json_is_object(ctx)) return fail(0, "template context must be a JSON object");
    dsp_arena ar;
    dsp_arena_init(&ar, 256 * 1024, t->lim.max_memory);
    rt r = {.ar = &ar, .t = t, .opts = opts};
    sb b = sb_new(&r);
    dsp_status st = DSP_OK;
    scope *g = scope_new(&r, NULL);
    scope *top = g ? scope_new(&r, g) : NULL;
    if (!top) st = oom(0);
    static const struct { const char *name; int fn; } builtins[] = {
        {"range", F_RANGE}, {"namespace", F_NAMESPACE}, {"dict", F_DICT},
        {"raise_exception", F_RAISE}, {"strftime_now", F_STRFTIME}};
    for (size_t i = 0; !st && i < sizeof builtins / sizeof builtins[0]; i++) {
        tv f = {.t = V_FUNC, .fn = (uint16_t)builtins[i].fn};
        st = scope_set(&r, g, builtins[i].name, f);
    }
    if (!st && ctx) {
        tv c = {0};
        st = from_json(&r, ctx, &c, 0);
        for (size_t i = 0; !st && i < c.u.d->n; i++) st = dict_set(&r, &g->vars, c.u.d->k[i], c.u.d->v[i]);
    }
    r.globals = g;
    if (!st) st = exec_body(&r, top, t->root->v, t->root->nv, &b);
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
