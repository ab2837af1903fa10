/* template/tmpl_lexer: template source -> tokens, applying jinja2's whitespace rules exactly
 * (trim_blocks, lstrip_blocks, "-"/"+" markers; the caller has already read \r\n and \r as \n
 * and dropped one trailing newline). See tmpl_internal.h. */
#include "template/tmpl_internal.h"

#include <errno.h>
#include <stdio.h>

static const struct { const char *s; uint8_t op; } g_ops[] = {
    {"//", OP_FLOORDIV}, {"**", OP_POW}, {"==", OP_EQ}, {"!=", OP_NE}, {">=", OP_GTEQ},
    {"<=", OP_LTEQ}, {"+", OP_ADD}, {"-", OP_SUB}, {"/", OP_DIV}, {"*", OP_MUL}, {"%", OP_MOD},
    {"~", OP_TILDE}, {"[", OP_LBRACKET}, {"]", OP_RBRACKET}, {"(", OP_LPAREN}, {")", OP_RPAREN},
    {"{", OP_LBRACE}, {"}", OP_RBRACE}, {">", OP_GT}, {"<", OP_LT}, {"=", OP_ASSIGN},
    {".", OP_DOT}, {":", OP_COLON}, {"|", OP_PIPE}, {",", OP_COMMA}, {";", OP_SEMICOLON},
};

const char *dsp_tmpl_op_text(int op) {
    for (size_t i = 0; i < sizeof g_ops / sizeof g_ops[0]; i++)
        if (g_ops[i].op == op) return g_ops[i].s;
    return op == OP_IN ? "in" : op == OP_NOTIN ? "not in" : "?";
}

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
        n = dsp_tmpl_py_rstrip_len(text, n);
    } else if (sign != '+' && !is_var) {
        size_t lpos = n;
        while (lpos > 0 && text[lpos - 1] != '\n') lpos--;
        if ((lpos > 0 || L->line_starting) && lpos < n) {
            size_t i = lpos, l;
            while (i < n && (l = dsp_tmpl_py_space_at(text + i, n - i)) > 0) i += l;
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
    while (pos < L->n && (l = dsp_tmpl_py_space_at(L->s + pos, L->n - pos)) > 0) pos += l;
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
                if (h < 0) return dsp_tmpl_fail(line, "string literal: truncated \\%c escape", c);
                cp = cp * 16 + (uint32_t)h;
            }
            i += (size_t)nd;
            if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
                return dsp_tmpl_fail(line, "string literal: escape \\%c gives an invalid code point", c);
            k += dsp_utf8_encode(cp, o + k);
            break;
        }
        case 'N': return dsp_tmpl_fail(line, "string literal: \\N{...} escapes are not supported");
        default:
            if (c >= '0' && c <= '7') {
                uint32_t cp = (uint32_t)(c - '0');
                for (int d = 0; d < 2 && i < n && s[i] >= '0' && s[i] <= '7'; d++)
                    cp = cp * 8 + (uint32_t)(s[i++] - '0');
                k += dsp_utf8_encode(cp, o + k);
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
    if (end - i >= sizeof buf - 1) return dsp_tmpl_fail(L->line, "number literal too long");
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
            if (!bl) return dsp_tmpl_fail(L->line, "bad number literal");
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
        if (errno || v > INT64_MAX) return dsp_tmpl_fail(L->line, "integer literal out of 64-bit range");
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
            return dsp_tmpl_fail(start_line, "unexpected end of template inside a %s tag",
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
            if (q >= n) return dsp_tmpl_fail(L->line, "unterminated string literal");
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
                dsp_utf8_decode(s + p, n - p, &l);
                return dsp_tmpl_fail(L->line, "unexpected character '%.*s'", (int)l, s + p);
            }
            t.type = T_OP;
            t.op = g_ops[k].op;
            L->pos = p + strlen(g_ops[k].s);
            if (t.op == OP_LPAREN || t.op == OP_LBRACKET || t.op == OP_LBRACE) {
                if (nbal == (int)sizeof bal) return dsp_tmpl_fail(L->line, "brackets nested too deeply");
                bal[nbal++] = t.op == OP_LPAREN ? ')' : t.op == OP_LBRACKET ? ']' : '}';
            } else if (t.op == OP_RPAREN || t.op == OP_RBRACKET || t.op == OP_RBRACE) {
                char want = t.op == OP_RPAREN ? ')' : t.op == OP_RBRACKET ? ']' : '}';
                if (!nbal) return dsp_tmpl_fail(L->line, "unexpected '%c'", want);
                if (bal[nbal - 1] != want)
                    return dsp_tmpl_fail(L->line, "unexpected '%c', expected '%c'", want, bal[nbal - 1]);
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

static dsp_status lex_all(lexer *L) {
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
            if (!found) return dsp_tmpl_fail(raw_line, "missing {%% endraw %%}");
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
            if (e + 1 >= n) return dsp_tmpl_fail(cl, "missing end of comment tag");
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

dsp_status dsp_tmpl_lex(const char *s, size_t n, dsp_arena *ar, token **tk, size_t *ntk) {
    lexer L = {.s = s, .n = n, .ar = ar};
    dsp_status st = lex_all(&L);
    if (st) {
        free(L.tk);
        L.tk = NULL;
        L.ntk = 0;
    }
    *tk = L.tk;
    *ntk = L.ntk;
    return st;
}
