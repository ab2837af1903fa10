/* test_tok: tokenizer unit tests on small hand-built vocabularies (no model files needed):
 * UTF-8 sanitizing, BPE merge order, added/special tokens and flags, SPM normalization and byte
 * fallback, the streaming decoder, the public API's buffer rules, bad input. */
#include "dsp_test.h"

#include "dspark.h"
#include "tok/tok.h"

/* ---- helpers ---- */

static size_t spell_byte(int b, char *out) { /* GPT-2 byte -> unicode spelling, as UTF-8 */
    int k = 0, cp = -1;
    for (int x = 0; x < 256; x++) {
        bool self = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
        int c = self ? x : 256 + k++;
        if (x == b) cp = c;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* Byte-level vocabulary: 256 byte tokens, then extra tokens/merges (spelled), then specials. */
static dsp_tok *make_bpe(const char *pre, const char **extra, size_t n_extra, const char **merges, size_t n_merges,
                         const char **ctrl, size_t n_ctrl, int add_bos) {
    size_t n = 256 + n_extra + n_ctrl;
    const char **toks = calloc(n, sizeof *toks);
    char (*bytes)[3] = calloc(256, 3);
    int32_t *types = calloc(n, sizeof *types);
    for (int b = 0; b < 256; b++) {
        size_t l = spell_byte(b, bytes[b]);
        bytes[b][l] = 0;
        toks[b] = bytes[b];
        types[b] = DSP_TOK_TYPE_NORMAL;
    }
    for (size_t i = 0; i < n_extra; i++) toks[256 + i] = extra[i], types[256 + i] = DSP_TOK_TYPE_NORMAL;
    for (size_t i = 0; i < n_ctrl; i++) toks[256 + n_extra + i] = ctrl[i], types[256 + n_extra + i] = DSP_TOK_TYPE_CONTROL;
    dsp_tok_params p = {0};
    p.kind = DSP_TOK_BPE;
    p.pre = pre;
    p.n_tokens = n;
    p.tokens = toks;
    p.types = types;
    p.merges = merges;
    p.n_merges = n_merges;
    p.bos = n_ctrl ? (int32_t)(256 + n_extra) : -1;
    p.eos = n_ctrl > 1 ? (int32_t)(256 + n_extra + 1) : -1;
    p.unk = p.pad = -1;
    p.add_bos = add_bos;
    p.add_eos = -1;
    p.add_space_prefix = -1;
    dsp_tok *t = NULL;
    dsp_status st = dsp_tok_create(&p, &t);
    CHECK_MSG(st == DSP_OK, "%s", dsp_last_error());
    free(toks);
    free(bytes);
    free(types);
    return t;
}

static bool encode_is(const dsp_tok *t, const char *s, int flags, const int32_t *want, size_t n_want) {
    dsp_tok_ids ids = {0};
    bool ok = dsp_tok_encode(t, s, strlen(s), flags, &ids) == DSP_OK && ids.n == n_want &&
              (n_want == 0 || !memcmp(ids.v, want, n_want * sizeof *want));
    if (!ok) {
        fprintf(stderr, "  encode \"%s\" flags %d: got", s, flags);
        for (size_t i = 0; i < ids.n; i++) fprintf(stderr, " %d", ids.v[i]);
        fprintf(stderr, ", want");
        for (size_t i = 0; i < n_want; i++) fprintf(stderr, " %d", want[i]);
        fputc('\n', stderr);
    }
    dsp_tok_ids_free(&ids);
    return ok;
}
#define ENC(t, s, flags, ...)                                                                  \
    do {                                                                                       \
        const int32_t _w[] = {__VA_ARGS__};                                                    \
        CHECK(encode_is(t, s, flags, _w, sizeof _w / sizeof _w[0]));                           \
    } while (0)

static char *decode(const dsp_tok *t, const int32_t *ids, size_t n, int flags) {
    char *s = NULL;
    size_t l;
    CHECK(dsp_tok_decode(t, ids, n, flags, &s, &l) == DSP_OK);
    return s;
}

/* ---- tests ---- */

static void test_bpe_merges(void) {
    /* ids: bytes 0..255; 256 "ab", 257 "abc", 258 "Ġa", 259 "bc" */
    const char *extra[] = {"ab", "abc", "\xC4\xA0" "a", "bc"};
    const char *merges[] = {"b c", "a b", "ab c", "\xC4\xA0 a"}; /* "b c" outranks "a b" */
    dsp_tok *t = make_bpe("gpt2", extra, 4, merges, 4, NULL, 0, -1);
    if (!t) return;
    ENC(t, "abc", 0, 'a', 259);        /* bc first, then no merge "a bc" */
    ENC(t, "ab", 0, 256);
    ENC(t, " ab", 0, ' ', 256);        /* "a b" outranks "Ġ a"; there is no "Ġ ab" */
    ENC(t, " a", 0, 258);
    ENC(t, "x", 0, 'x');
    ENC(t, "", 0);
    /* decode is lossless for byte-level, including invalid UTF-8 bytes from single-byte tokens */
    const int32_t ids[] = {'a', 259, 258};
    char *s = decode(t, ids, 3, 0);
    CHECK_EQ_STR(s, "abc a");
    free(s);
    dsp_tok_destroy(t);
}

static void test_pretokenizers(void) {
    const char *names[] = {"default", "gpt2", "llama3", "llama-bpe", "qwen2", "smollm", "starcoder", "falcon",
                           "deepseek-llm", "deepseek-coder", "deepseek-r1-qwen", "command-r", "gpt-4o", "tekken",
                           "chameleon", "viking", "bloom", "deepseek-v3", "seed-coder", "refact", "mpt"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        dsp_tok_pre *p = NULL;
        CHECK_MSG(dsp_tok_pre_create(names[i], &p) == DSP_OK, "%s: %s", names[i], dsp_last_error());
        dsp_tok_spans out = {0}, tmp = {0};
        const char *text = "Hello, world!  It's 12345 \xE6\x97\xA5\xE6\x9C\xAC  \n\n x";
        CHECK(p && dsp_tok_pre_split(p, text, strlen(text), &out, &tmp) == DSP_OK);
        /* pieces tile the text exactly */
        uint32_t pos = 0;
        for (size_t k = 0; k < out.n; k++) {
            CHECK(out.v[k].off == pos && out.v[k].len > 0);
            pos += out.v[k].len;
        }
        CHECK_EQ_INT(pos, strlen(text));
        dsp_tok_spans_free(&out);
        dsp_tok_spans_free(&tmp);
        dsp_tok_pre_destroy(p);
    }
    dsp_tok_pre *p = NULL;
    CHECK(dsp_tok_pre_create("no-such-pre", &p) == DSP_ERR_UNSUPPORTED && !p);
    CHECK(strstr(dsp_last_error(), "no-such-pre") != NULL);
    /* gpt2 splitting, checked piece by piece */
    CHECK(dsp_tok_pre_create("gpt2", &p) == DSP_OK);
    const char *text = "I'm  fine 123";
    const char *want[] = {"I", "'m", " ", " fine", " 123"};
    dsp_tok_spans out = {0}, tmp = {0};
    CHECK(dsp_tok_pre_split(p, text, strlen(text), &out, &tmp) == DSP_OK);
    CHECK_EQ_INT(out.n, 5);
    for (size_t k = 0; k < out.n && k < 5; k++)
        CHECK(out.v[k].len == strlen(want[k]) && !memcmp(text + out.v[k].off, want[k], out.v[k].len));
    dsp_tok_spans_free(&out);
    dsp_tok_spans_free(&tmp);
    dsp_tok_pre_destroy(p);
}

static void test_special_tokens(void) {
    const char *ctrl[] = {"<|s|>", "<|e|>"};
    dsp_tok *t = make_bpe("gpt2", NULL, 0, NULL, 0, ctrl, 2, 1); /* bos 256, eos 257; add_bos */
    if (!t) return;
    const int P = DSP_TOKENIZE_PARSE_SPECIAL, A = DSP_TOKENIZE_ADD_SPECIAL;
    ENC(t, "a<|e|>b", P, 'a', 257, 'b');
    ENC(t, "a<|e|>b", 0, 'a', '<', '|', 'e', '|', '>', 'b');
    ENC(t, "a<|e|>b", A | P, 256, 'a', 257, 'b');
    ENC(t, "<|e|", P, '<', '|', 'e', '|');
    ENC(t, "", A, 256);
    CHECK(dsp_tok_is_special(t, 257) && !dsp_tok_is_special(t, 'a'));
    const int32_t ids[] = {256, 'h', 'i', 257};
    char *s = decode(t, ids, 4, 0);
    CHECK_EQ_STR(s, "<|s|>hi<|e|>");
    free(s);
    s = decode(t, ids, 4, DSP_DETOKENIZE_SKIP_SPECIAL);
    CHECK_EQ_STR(s, "hi");
    free(s);
    dsp_tok_destroy(t);
}

static dsp_tok *make_spm(const char *arch, int add_space_prefix) {
    /* 0 <unk> 1 <s> 2 </s> 3..258 <0x00>..<0xFF> then pieces with scores */
    static char bytes[256][8];
    const char *pieces[] = {"\xE2\x96\x81", "a", "b", "\xE2\x96\x81" "a", "ab", "\xE2\x96\x81" "ab", "c"};
    const float pscores[] = {-1, -2, -3, -4, -5, -6, -7};
    size_t np = sizeof pieces / sizeof pieces[0], n = 3 + 256 + np;
    const char **toks = calloc(n, sizeof *toks);
    float *scores = calloc(n, sizeof *scores);
    int32_t *types = calloc(n, sizeof *types);
    toks[0] = "<unk>", toks[1] = "<s>", toks[2] = "</s>";
    types[0] = DSP_TOK_TYPE_UNKNOWN, types[1] = types[2] = DSP_TOK_TYPE_CONTROL;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[3 + b] = bytes[b];
        types[3 + b] = DSP_TOK_TYPE_BYTE;
    }
    for (size_t i = 0; i < np; i++) toks[259 + i] = pieces[i], scores[259 + i] = pscores[i], types[259 + i] = 1;
    dsp_tok_params p = {0};
    p.kind = DSP_TOK_SPM;
    p.arch = arch;
    p.n_tokens = n;
    p.tokens = toks;
    p.scores = scores;
    p.types = types;
    p.bos = 1, p.eos = 2, p.unk = 0, p.pad = -1;
    p.add_bos = p.add_eos = -1;
    p.add_space_prefix = add_space_prefix;
    dsp_tok *t = NULL;
    CHECK_MSG(dsp_tok_create(&p, &t) == DSP_OK, "%s", dsp_last_error());
    free(toks);
    free(scores);
    free(types);
    return t;
}

static void test_spm(void) {
    dsp_tok *t = make_spm("llama", -1); /* space prefix on, BOS added by default */
    if (!t) return;
    /* ids: ▁ 259, a 260, b 261, ▁a 262, ab 263, ▁ab 264, c 265 */
    ENC(t, "ab", 0, 264);
    ENC(t, "ab", DSP_TOKENIZE_ADD_SPECIAL, 1, 264);
    ENC(t, " ab", 0, 259, 264);
    ENC(t, "abc", 0, 264, 265);
    ENC(t, "\xC3\xA9", 0, 259, 3 + 0xC3, 3 + 0xA9); /* é: byte fallback */
    ENC(t, "", 0);
    const int32_t ids[] = {264, 259, 3 + 0xC3, 3 + 0xA9};
    char *s = decode(t, ids, 4, 0);
    CHECK_EQ_STR(s, "ab \xC3\xA9"); /* leading space stripped once */
    free(s);
    const int32_t bad[] = {3 + 0xC3, 265};
    s = decode(t, bad, 2, 0);
    CHECK_EQ_STR(s, "\xEF\xBF\xBD" "c");
    free(s);
    dsp_tok_destroy(t);
    t = make_spm("gemma3", -1); /* Gemma: no prefix, no strip */
    if (!t) return;
    ENC(t, "ab", 0, 263);
    ENC(t, " ab", 0, 264);
    const int32_t g[] = {264};
    s = decode(t, g, 1, 0);
    CHECK_EQ_STR(s, " ab");
    free(s);
    dsp_tok_destroy(t);
}

static void test_stream(void) {
    dsp_tok *t = make_spm("llama", -1);
    if (!t) return;
    /* "▁ab" then the 4 bytes of 🦙 one token each: nothing until the character is complete */
    const int32_t ids[] = {264, 3 + 0xF0, 3 + 0x9F, 3 + 0xA6, 3 + 0x99, 265};
    dsp_detok_stream *s = NULL;
    CHECK(dsp_detok_stream_create(t, 0, &s) == DSP_OK);
    const char *p;
    size_t l;
    size_t lens[6];
    char cat[64];
    size_t cl = 0;
    for (int i = 0; i < 6; i++) {
        CHECK(dsp_detok_stream_feed(s, ids[i], &p, &l) == DSP_OK);
        lens[i] = l;
        memcpy(cat + cl, p, l);
        cl += l;
    }
    CHECK(dsp_detok_stream_flush(s, &p, &l) == DSP_OK && l == 0);
    cat[cl] = 0;
    CHECK_EQ_STR(cat, "ab\xF0\x9F\xA6\x99" "c");
    CHECK(lens[0] == 2 && lens[1] == 0 && lens[2] == 0 && lens[3] == 0 && lens[4] == 4 && lens[5] == 1);
    /* an incomplete character at the end becomes U+FFFD at flush, as in the whole decode */
    CHECK(dsp_detok_stream_feed(s, 3 + 0xF0, &p, &l) == DSP_OK && l == 0);
    CHECK(dsp_detok_stream_flush(s, &p, &l) == DSP_OK && l == 3 && !memcmp(p, "\xEF\xBF\xBD", 3));
    CHECK(dsp_detok_stream_feed(s, 99999, &p, &l) == DSP_ERR_RANGE);
    dsp_detok_stream_destroy(s);
    dsp_tok_destroy(t);
}

static void test_public_api(void) {
    dsp_tok *t = make_spm("llama", -1);
    if (!t) return;
    const dsp_tokenizer *pt = t;
    int32_t ids[8];
    size_t n = 0;
    CHECK(dsp_tokenize(pt, "ab ab ab", 8, DSP_TOKENIZE_ADD_SPECIAL, ids, 8, &n) == DSP_OK && n == 4);
    CHECK(dsp_tokenize(pt, "ab ab ab", 8, DSP_TOKENIZE_ADD_SPECIAL, ids, 2, &n) == DSP_ERR_RANGE && n == 4);
    CHECK(dsp_tokenize(pt, "ab ab ab", 8, 0, NULL, 0, &n) == DSP_ERR_RANGE && n == 3);
    CHECK(dsp_tokenize(pt, NULL, 3, 0, ids, 8, &n) == DSP_ERR_INVALID_ARG);
    char buf[16];
    size_t len;
    const int32_t x[] = {264, 264, 264};
    CHECK(dsp_detokenize(pt, x, 3, 0, buf, sizeof buf, &len) == DSP_OK && len == 8);
    CHECK_EQ_STR(buf, "ab ab ab");
    CHECK(dsp_detokenize(pt, x, 3, 0, buf, 8, &len) == DSP_ERR_RANGE && len == 8); /* no room for the NUL */
    char small[4];
    CHECK(dsp_detokenize(pt, x, 3, 0, small, sizeof small, &len) == DSP_ERR_RANGE && len == 8 && !strcmp(small, "ab "));
    const int32_t oob[] = {1 << 20};
    CHECK(dsp_detokenize(pt, oob, 1, 0, buf, sizeof buf, &len) == DSP_ERR_RANGE);
    CHECK(dsp_token_to_piece(pt, 3 + 0x41, buf, sizeof buf, &len) == DSP_OK && len == 1 && buf[0] == 'A');
    CHECK(dsp_token_to_piece(pt, -1, buf, sizeof buf, &len) == DSP_ERR_RANGE);
    CHECK_EQ_INT(dsp_tokenizer_n_vocab(pt), 266);
    CHECK_EQ_INT(dsp_tokenizer_bos(pt), 1);
    CHECK_EQ_INT(dsp_tokenizer_eos(pt), 2);
    CHECK(dsp_tokenizer_is_special(pt, 1) && !dsp_tokenizer_is_special(pt, 264));
    dsp_tok_destroy(t);
}

static void test_bad_params(void) {
    dsp_tok *t = NULL;
    const char *toks[] = {"a", "b"};
    dsp_tok_params p = {0};
    p.kind = DSP_TOK_BPE;
    p.n_tokens = 2;
    p.tokens = toks;
    p.bos = 7, p.eos = p.unk = p.pad = -1;
    CHECK(dsp_tok_create(&p, &t) == DSP_ERR_FORMAT && !t);
    p.bos = -1;
    CHECK(dsp_tok_create(&p, &t) == DSP_OK && t); /* byte-level without merges: bytes only */
    dsp_tok_destroy(t);
    t = NULL;
    const char *merges[] = {"a b", "nonsense", "a zz", "a b c"};
    p.merges = merges;
    p.n_merges = 4;
    p.pre = "nope";
    CHECK(dsp_tok_create(&p, &t) == DSP_ERR_UNSUPPORTED && !t);
    p.pre = NULL;
    CHECK(dsp_tok_create(&p, &t) == DSP_OK && t); /* bad merges are skipped */
    dsp_tok_destroy(t);
    p.n_tokens = 0;
    CHECK(dsp_tok_create(&p, &t) == DSP_ERR_FORMAT);
}

/* Gemma spells its all-space tokens with U+2581 (3 bytes per space) for lookup: a vocabulary made of
 * them needs 5 bytes of strings per byte of token text (text, key, piece), not the 3 that were
 * reserved (a heap overflow under ASan). */
static void test_gemma_space_tokens(void) {
    const char *toks[] = {"        ", " ", "  ", "<pad>"};
    dsp_tok_params p = {0};
    p.kind = DSP_TOK_SPM;
    p.arch = "gemma3";
    p.n_tokens = 4;
    p.tokens = toks;
    const float scores[] = {-1, -2, -3, 0};
    p.scores = scores;
    p.bos = p.eos = p.unk = -1;
    p.pad = 3;
    p.add_bos = p.add_eos = p.add_space_prefix = -1;
    dsp_tok *t = NULL;
    CHECK_MSG(dsp_tok_create(&p, &t) == DSP_OK, "%s", dsp_last_error());
    if (!t) return;
    ENC(t, "  ", 0, 2);
    char *d = decode(t, (const int32_t[]){0, 1}, 2, 0);
    CHECK_EQ_STR(d, "         ");
    free(d);
    dsp_tok_destroy(t);
}

/* The encoder keeps offsets in 32 bits and SPM triples spaces: texts over 1 GiB are refused before
 * anything is read (the length is checked first: the buffer here is short on purpose). */
static void test_text_limit(void) {
    dsp_tok *t = make_spm("llama", -1);
    if (!t) return;
    static const char text[16] = "               ";
    dsp_tok_ids ids = {0};
    CHECK_EQ_INT(dsp_tok_encode(t, text, DSP_TOK_MAX_TEXT + 1, 0, &ids), DSP_ERR_RANGE);
    CHECK(strstr(dsp_last_error(), "too long") != NULL && ids.n == 0);
    CHECK_EQ_INT(dsp_tok_encode(t, text, 15, 0, &ids), DSP_OK);
    dsp_tok_ids_free(&ids);
    dsp_tok_destroy(t);
}

/* Random bytes never crash; valid text round-trips exactly through a full byte vocabulary. */
static void test_fuzz_roundtrip(void) {
    const char *extra[] = {"ab", "\xC4\xA0" "t", "he", "\xC4\xA0" "the"};
    const char *merges[] = {"a b", "\xC4\xA0 t", "h e", "\xC4\xA0t he"};
    const char *ctrl[] = {"<|s|>"};
    dsp_tok *t = make_bpe("llama3", extra, 4, merges, 4, ctrl, 1, 0);
    dsp_tok *s = make_spm("llama", -1);
    if (!t || !s) return;
    uint64_t x = 0x9E3779B97F4A7C15ULL;
    char buf[300];
    for (int it = 0; it < 3000; it++) {
        size_t n = 0, want = (size_t)(x % 64);
        while (n < want) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            buf[n++] = (char)(x & 0xFF);
        }
        for (int k = 0; k < 2; k++) {
            const dsp_tok *tk = k ? s : t;
            dsp_tok_ids ids = {0};
            CHECK(dsp_tok_encode(tk, buf, n, DSP_TOKENIZE_PARSE_SPECIAL | DSP_TOKENIZE_ADD_SPECIAL, &ids) == DSP_OK);
            char *d = NULL;
            size_t dl;
            CHECK(dsp_tok_decode(tk, ids.v, ids.n, 0, &d, &dl) == DSP_OK);
            if (k == 0 && dsp_utf8_valid((const uint8_t *)buf, n)) CHECK(dl == n && !memcmp(d, buf, n));
            CHECK(dsp_utf8_valid((const uint8_t *)d, dl));
            free(d);
            dsp_tok_ids_free(&ids);
        }
    }
    dsp_tok_destroy(t);
    dsp_tok_destroy(s);
}

/* Long inputs: runs of whitespace (regex backtracking) and one huge SPM word (heap merge). */
static void test_long_inputs(void) {
    const char *extra[] = {"ab"};
    const char *merges[] = {"a b"};
    dsp_tok *t = make_bpe("llama3", extra, 1, merges, 1, NULL, 0, 0);
    dsp_tok *s = make_spm("gemma3", -1);
    if (!t || !s) return;
    size_t n = 1 << 20;
    char *buf = malloc(n);
    for (size_t i = 0; i < n; i++) buf[i] = (i % 1000 == 999) ? 'x' : ' ';
    dsp_tok_ids ids = {0};
    CHECK(dsp_tok_encode(t, buf, n, 0, &ids) == DSP_OK && ids.n > 0);
    dsp_tok_ids_free(&ids);
    for (size_t i = 0; i < n; i++) buf[i] = "ab"[i & 1];
    CHECK(dsp_tok_encode(s, buf, n, 0, &ids) == DSP_OK && ids.n == n / 2);
    dsp_tok_ids_free(&ids);
    free(buf);
    dsp_tok_destroy(t);
    dsp_tok_destroy(s);
}

int main(void) {
    DSP_RUN(test_bpe_merges);
    DSP_RUN(test_pretokenizers);
    DSP_RUN(test_special_tokens);
    DSP_RUN(test_spm);
    DSP_RUN(test_stream);
    DSP_RUN(test_public_api);
    DSP_RUN(test_bad_params);
    DSP_RUN(test_gemma_space_tokens);
    DSP_RUN(test_text_limit);
    DSP_RUN(test_fuzz_roundtrip);
    DSP_RUN(test_long_inputs);
    return dsp_test_summary();
}
