/* tok/tok_pre: byte-level BPE pre-tokenizers, chosen by tokenizer.ggml.pre.
 *
 * Each pre-tokenizer is an ordered list of regexes. Like Hugging Face's Split(behavior=Isolated)
 * in a pre-tokenizer Sequence, every regex is applied to every piece the previous one produced:
 * each match becomes a piece and so does each stretch of text between matches. A regex never sees
 * past the piece it runs on (so $ and (?!\S) stop at the piece's end). The patterns are those of
 * the models' tokenizer.json files (as llama.cpp also lists them per pre-type); PCRE2 runs them in
 * UTF + UCP mode (\s, \p{L}, \p{N} are Unicode-aware), JIT-compiled. */
#include "tok/tok.h"

#include "core/status.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdlib.h>
#include <string.h>

#define MAX_RE 6

/* GPT-2's ByteLevel regex (also what HF uses for a byte-level GGUF with no known pre-type). */
#define R_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define R_LLAMA3                                                                                    \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define R_QWEN2                                                                                     \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"     \
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define R_TEKKEN                                                                                    \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"                 \
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"                \
    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define R_GPT4O                                                                                     \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"                 \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"                                                                \
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"                \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"                                                                \
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define R_DEEPSEEK_LETTERS /* cased letters, as in DeepSeek LLM's tokenizer.json (escaped: no normalization) */ \
    "\\s?[" \
    "\\x{41}-\\x{5a}\\x{61}-\\x{7a}\\x{b5}\\x{c0}-\\x{d6}\\x{d8}-\\x{f6}\\x{f8}-\\x{1ba}" \
    "\\x{1bc}-\\x{1bf}\\x{1c4}-\\x{293}\\x{295}-\\x{2af}\\x{370}-\\x{373}\\x{376}-\\x{377}" \
    "\\x{37b}-\\x{37d}\\x{37f}\\x{386}\\x{388}-\\x{38a}\\x{38c}\\x{38e}-\\x{3a1}\\x{3a3}-\\x{3f5}" \
    "\\x{3f7}-\\x{481}\\x{48a}-\\x{52f}\\x{531}-\\x{556}\\x{10a0}-\\x{10c5}\\x{13a0}-\\x{13f5}" \
    "\\x{13f8}-\\x{13fd}\\x{1c90}-\\x{1cba}\\x{1cbd}-\\x{1cbf}\\x{1d00}-\\x{1d2b}" \
    "\\x{1d6b}-\\x{1d77}\\x{1d79}-\\x{1d9a}\\x{1e00}-\\x{1f15}\\x{1f18}-\\x{1f1d}" \
    "\\x{1f20}-\\x{1f45}\\x{1f48}-\\x{1f4d}\\x{1f50}-\\x{1f57}\\x{1f59}\\x{1f5b}\\x{1f5d}" \
    "\\x{1f5f}-\\x{1f7d}\\x{1f80}-\\x{1fb4}\\x{1fb6}-\\x{1fbc}\\x{1fbe}\\x{1fc2}-\\x{1fc4}" \
    "\\x{1fc6}-\\x{1fcc}\\x{1fd0}-\\x{1fd3}\\x{1fd6}-\\x{1fdb}\\x{1fe0}-\\x{1fec}" \
    "\\x{1ff2}-\\x{1ff4}\\x{1ff6}-\\x{1ffc}\\x{2102}\\x{2107}\\x{210a}-\\x{2113}\\x{2115}" \
    "\\x{2119}-\\x{211d}\\x{2124}\\x{2126}\\x{2128}\\x{212a}-\\x{212d}\\x{212f}-\\x{2134}" \
    "\\x{2139}\\x{213c}-\\x{213f}\\x{2145}-\\x{2149}\\x{214e}\\x{2183}-\\x{2184}" \
    "\\x{2c00}-\\x{2c7b}\\x{2c7e}-\\x{2ce4}\\x{2ceb}-\\x{2cee}\\x{2cf2}-\\x{2cf3}" \
    "\\x{a640}-\\x{a66d}\\x{a680}-\\x{a69b}\\x{a722}-\\x{a76f}\\x{a771}-\\x{a787}" \
    "\\x{a78b}-\\x{a78e}\\x{ab70}-\\x{abbf}\\x{fb00}-\\x{fb06}\\x{fb13}-\\x{fb17}" \
    "\\x{ff21}-\\x{ff3a}\\x{ff41}-\\x{ff5a}\\x{10400}-\\x{1044f}\\x{104b0}-\\x{104d3}" \
    "\\x{104d8}-\\x{104fb}\\x{10c80}-\\x{10cb2}\\x{10cc0}-\\x{10cf2}\\x{118a0}-\\x{118df}" \
    "\\x{1e900}-\\x{1e943}" \
    "]+"
#define R_DEEPSEEK_PUNCT "\\s?[!-/:-~\\x{ff01}-\\x{ff0f}\\x{ff1a}-\\x{ff5e}\\x{2018}-\\x{201f}\\x{3000}-\\x{3002}]+"
#define R_CJK "[\\x{4e00}-\\x{9fa5}\\x{0800}-\\x{4e00}\\x{ac00}-\\x{d7ff}]+"
#define R_FINNISH " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{ff0c}\\x{3001}\\x{0964}\\x{06d4}\\x{060c})]+"

typedef struct pre_def {
    const char *names; /* '|'-separated aliases */
    const char *re[MAX_RE];
} pre_def;

static const pre_def g_pre[] = {
    {"default|gpt2|gpt-2|mpt|olmo|jais|trillion|granite-docling|roberta-bpe|gpt-neox", {R_GPT2}},
    {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|dbrx|smaug-bpe|chatglm-bpe", {R_LLAMA3}},
    {"qwen2|deepseek-r1-qwen|stablelm2|hunyuan|megrez|kormo|grok-2", {R_QWEN2}},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva", {"\\p{N}", R_GPT2}},
    {"falcon", {"[\\p{P}\\$\\+<=>\\^~\\|`]+", R_GPT2, "[0-9][0-9][0-9]"}},
    {"deepseek-llm", {"[\\r\\n]", R_DEEPSEEK_LETTERS, R_DEEPSEEK_PUNCT, "\\s+$", R_CJK, "\\p{N}+"}},
    {"deepseek-coder", {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", R_CJK, "\\p{N}"}},
    {"deepseek-v3|hunyuan-dense",
     {"\\p{N}{1,3}", "[\\x{4e00}-\\x{9fa5}\\x{3040}-\\x{309f}\\x{30a0}-\\x{30ff}]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
      "| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"poro-chat|bloom|gpt3-finnish", {R_FINNISH}},
    {"viking", {R_FINNISH, "\\p{N}"}},
    {"tekken", {R_TEKKEN}},
    {"gpt-4o|llama4|minimax-m2|kanana2", {R_GPT4O}},
    {"seed-coder",
     {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+"
      "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"chameleon",
     {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
      "[\\p{P}!-/:-@\\[-`{-~]", R_GPT2}},
};
#define N_PRE (sizeof g_pre / sizeof g_pre[0])

#define MAX_RE_CUSTOM 16

struct dsp_tok_pre {
    int n;
    pcre2_code *re[MAX_RE_CUSTOM];
    bool jit[MAX_RE_CUSTOM];
    dsp_tok_split how[MAX_RE_CUSTOM];
};

const char *dsp_tok_pre_gpt2_regex(void) { return R_GPT2; }

const char *dsp_tok_pre_known(void) {
    return "default, gpt2, gpt-2, mpt, olmo, jais, trillion, granite-docling, roberta-bpe, gpt-neox, llama3, "
           "llama-v3, llama-bpe, falcon3, falcon-h1, pixtral, midm-2.0, lfm2, dbrx, smaug-bpe, chatglm-bpe, qwen2, "
           "deepseek-r1-qwen, stablelm2, hunyuan, megrez, kormo, grok-2, starcoder, refact, command-r, smollm, "
           "codeshell, exaone, minerva, falcon, deepseek-llm, deepseek-coder, deepseek-v3, hunyuan-dense, "
           "poro-chat, bloom, gpt3-finnish, viking, tekken, gpt-4o, llama4, minimax-m2, kanana2, seed-coder, "
           "chameleon";
}

static bool name_in(const char *names, const char *name) {
    size_t n = strlen(name);
    for (const char *p = names; *p;) {
        const char *e = strchr(p, '|');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && !memcmp(p, name, n)) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

static dsp_status compile(dsp_tok_pre *p, const char *re, const char *what) {
    int err;
    PCRE2_SIZE eoff;
    int i = p->n;
    p->re[i] = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &eoff, NULL);
    if (!p->re[i]) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return dsp_error(DSP_ERR_UNSUPPORTED, "pre-tokenizer %s: regex %d (%.80s) does not compile at offset %zu: %s", what, i, re, (size_t)eoff,
                         (const char *)msg);
    }
    p->jit[i] = pcre2_jit_compile(p->re[i], PCRE2_JIT_COMPLETE) == 0;
    p->n = i + 1;
    return DSP_OK;
}

dsp_status dsp_tok_pre_create(const char *name, dsp_tok_pre **out) {
    *out = NULL;
    if (!name || !*name) name = "default";
    const pre_def *d = NULL;
    for (size_t i = 0; i < N_PRE && !d; i++)
        if (name_in(g_pre[i].names, name)) d = &g_pre[i];
    if (!d)
        return dsp_error(DSP_ERR_UNSUPPORTED, "tokenizer.ggml.pre '%s' is not a known pre-tokenizer (known: %s)", name,
                         dsp_tok_pre_known());
    dsp_tok_pre *p = calloc(1, sizeof *p);
    if (!p) return dsp_error(DSP_ERR_NOMEM, "pre-tokenizer: out of memory");
    for (int i = 0; i < MAX_RE && d->re[i]; i++) {
        dsp_status st = compile(p, d->re[i], name);
        if (st) {
            dsp_tok_pre_destroy(p);
            return st == DSP_ERR_UNSUPPORTED ? DSP_ERR_INTERNAL : st; /* our own tables must compile */
        }
    }
    *out = p;
    return DSP_OK;
}

dsp_status dsp_tok_pre_create_regexes(const char *const *re, const dsp_tok_split *behavior, int n, dsp_tok_pre **out) {
    *out = NULL;
    if (n < 0 || n > MAX_RE_CUSTOM) return dsp_error(DSP_ERR_UNSUPPORTED, "pre-tokenizer: %d regexes (at most %d)", n, MAX_RE_CUSTOM);
    dsp_tok_pre *p = calloc(1, sizeof *p);
    if (!p) return dsp_error(DSP_ERR_NOMEM, "pre-tokenizer: out of memory");
    for (int i = 0; i < n; i++) {
        dsp_status st = compile(p, re[i], "Split");
        if (st) {
            dsp_tok_pre_destroy(p);
            return st;
        }
        p->how[i] = behavior ? behavior[i] : DSP_SPLIT_ISOLATED;
    }
    *out = p;
    return DSP_OK;
}

void dsp_tok_pre_destroy(dsp_tok_pre *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++) pcre2_code_free(p->re[i]);
    free(p);
}

void dsp_tok_spans_free(dsp_tok_spans *s) {
    free(s->v);
    s->v = NULL;
    s->n = s->cap = 0;
}

static dsp_status spans_push(dsp_tok_spans *s, uint32_t off, uint32_t len) {
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 64;
        dsp_tok_span *v = realloc(s->v, nc * sizeof *v);
        if (!v) return dsp_error(DSP_ERR_NOMEM, "pre-tokenizer: out of memory");
        s->v = v;
        s->cap = nc;
    }
    s->v[s->n].off = off;
    s->v[s->n].len = len;
    s->n++;
    return DSP_OK;
}

/* One regex over one piece: matches and the gaps between them become pieces of out, a match on
 * its own (isolated), dropped (removed), or joined to the gap before or after it (merged). */
static dsp_status split_one(const pcre2_code *re, bool jit, dsp_tok_split how, pcre2_match_data *md, const char *text, dsp_tok_span piece,
                            dsp_tok_spans *out) {
    const PCRE2_SPTR subj = (PCRE2_SPTR)(text + piece.off);
    const PCRE2_SIZE n = piece.len;
    PCRE2_SIZE pos = 0, gap = 0;
    dsp_status st;
    while (pos < n) {
        int rc;
        if (jit) {
            rc = pcre2_jit_match(re, subj, n, pos, 0, md, NULL);
            if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* very long runs: the interpreter uses the heap */
                rc = pcre2_match(re, subj, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
        } else {
            rc = pcre2_match(re, subj, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        }
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return dsp_error(DSP_ERR_INTERNAL, "pre-tokenizer: regex match failed at byte %zu: %s",
                             (size_t)(piece.off + pos), (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        PCRE2_SIZE ms = ov[0], me = ov[1];
        if (me <= ms) { /* empty match: step over one character */
            pos = ms + dsp_utf8_len(subj[ms]);
            continue;
        }
        switch (how) {
        case DSP_SPLIT_ISOLATED:
            if (ms > gap && (st = spans_push(out, piece.off + (uint32_t)gap, (uint32_t)(ms - gap)))) return st;
            if ((st = spans_push(out, piece.off + (uint32_t)ms, (uint32_t)(me - ms)))) return st;
            gap = me;
            break;
        case DSP_SPLIT_REMOVED:
            if (ms > gap && (st = spans_push(out, piece.off + (uint32_t)gap, (uint32_t)(ms - gap)))) return st;
            gap = me;
            break;
        case DSP_SPLIT_MERGED_PREV: /* the gap and the match are one piece */
            if ((st = spans_push(out, piece.off + (uint32_t)gap, (uint32_t)(me - gap)))) return st;
            gap = me;
            break;
        case DSP_SPLIT_MERGED_NEXT: /* the match opens the next piece */
            if (ms > gap && (st = spans_push(out, piece.off + (uint32_t)gap, (uint32_t)(ms - gap)))) return st;
            gap = ms;
            break;
        }
        pos = me;
    }
    if (gap < n && (st = spans_push(out, piece.off + (uint32_t)gap, (uint32_t)(n - gap)))) return st;
    return DSP_OK;
}

dsp_status dsp_tok_pre_split(const dsp_tok_pre *p, const char *text, size_t len, dsp_tok_spans *out,
                             dsp_tok_spans *tmp) {
    out->n = 0;
    if (len == 0) return DSP_OK;
    if (len > UINT32_MAX) return dsp_error(DSP_ERR_RANGE, "pre-tokenizer: text segment of %zu bytes is too long", len);
    dsp_status st = spans_push(out, 0, (uint32_t)len);
    if (st) return st;
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md) return dsp_error(DSP_ERR_NOMEM, "pre-tokenizer: out of memory");
    for (int r = 0; r < p->n && st == DSP_OK; r++) {
        tmp->n = 0;
        for (size_t i = 0; i < out->n && st == DSP_OK; i++) st = split_one(p->re[r], p->jit[r], p->how[r], md, text, out->v[i], tmp);
        dsp_tok_spans sw = *out;
        *out = *tmp;
        *tmp = sw;
    }
    pcre2_match_data_free(md);
    return st;
}
