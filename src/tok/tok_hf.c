/* tok/tok_hf: a dsp_tok from a Hugging Face tokenizer.json (+ tokenizer_config.json).
 *
 * The `tokenizers` pipeline is normalizer -> pre-tokenizer -> model -> post-processor, decoded by a
 * decoder chain. We map the two families LLMs ship onto the two kinds tok.c implements:
 *  - byte-level BPE: pre_tokenizer ByteLevel, alone or after Split / Digits in a Sequence (GPT-2,
 *    Llama 3, Qwen2/3, SmolLM, ...). Each Split becomes one regex of our pre-tokenizer with its
 *    behaviour; ByteLevel(use_regex) adds the GPT-2 regex at its place in the sequence;
 *  - SentencePiece-style BPE: normalizer Replace(" " -> U+2581) [+ Prepend(U+2581)], or the
 *    Metaspace pre-tokenizer (Llama 2, Mistral, Gemma), with byte fallback and the decoder chain
 *    Replace / ByteFallback / Fuse / Strip (or Metaspace).
 * The NFC normalizer (Qwen2/3) may come with either: each stretch of text between added tokens is
 * NFC-normalized first (tok/nfc.c), as `tokenizers` does; it commutes with Replace and Prepend.
 * added_tokens keep their flags (special; lstrip, rstrip, single_word; `normalized` tokens are
 * matched on the raw text, which is the same for these normalizers unless the content has a
 * space or is not NFC). The post-processor's TemplateProcessing says which special tokens encode adds around a
 * text; tokenizer_config.json's add_bos_token / add_eos_token override it, as transformers does.
 * Whatever else a file asks for (WordPiece, Unigram, another normalizer such as NFKC or Lowercase,
 * Whitespace pre-tokenizers, ...) is refused with DSP_ERR_UNSUPPORTED naming the part. */
#include "tok/tok.h"

#include "core/status.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define U2581 "\xE2\x96\x81"
#define MAX_SPLITS 15

typedef struct hf_parts {
    /* byte-level */
    bool byte_level;
    const char *re[MAX_SPLITS + 1];
    dsp_tok_split how[MAX_SPLITS + 1];
    char *re_own[MAX_SPLITS + 1]; /* escaped String patterns */
    int n_re;
    /* SentencePiece-style */
    bool replace_space, prepend, metaspace, meta_first, meta_split, strip_decode;
    bool nfc;
    char desc[128];
} hf_parts;

static const char *type_of(const json_t *v) {
    const char *t = json_string_value(json_object_get(v, "type"));
    return t ? t : "(no type)";
}

static void desc_add(hf_parts *h, const char *s) {
    size_t n = strlen(h->desc);
    snprintf(h->desc + n, sizeof h->desc - n, "%s%s", n ? "+" : "", s);
}

/* A Split/Replace pattern: {"String": s} or {"Regex": r}; *regex tells which. */
static const char *pattern(const json_t *v, bool *regex) {
    const json_t *p = json_object_get(v, "pattern");
    const char *s = json_string_value(json_object_get(p, "String"));
    *regex = false;
    if (s) return s;
    *regex = true;
    return json_string_value(json_object_get(p, "Regex"));
}

/* PCRE2 text matching s literally */
static char *quote(const char *s) {
    size_t n = strlen(s);
    char *q = malloc(2 * n + 1), *o = q;
    if (!q) return NULL;
    for (size_t i = 0; i < n; i++) {
        if (strchr("\\^$.|?*+()[]{}/-", s[i])) *o++ = '\\';
        *o++ = s[i];
    }
    *o = '\0';
    return q;
}

static dsp_status normalizer(hf_parts *h, const json_t *n) {
    if (!n || json_is_null(n)) return DSP_OK;
    const char *t = type_of(n);
    if (!strcmp(t, "Sequence")) {
        size_t i;
        json_t *x;
        json_array_foreach(json_object_get(n, "normalizers"), i, x) {
            dsp_status st = normalizer(h, x);
            if (st) return st;
        }
        return DSP_OK;
    }
    if (!strcmp(t, "NFC")) {
        h->nfc = true;
        return DSP_OK;
    }
    bool rx;
    if (!strcmp(t, "Replace")) {
        const char *p = pattern(n, &rx), *c = json_string_value(json_object_get(n, "content"));
        if (p && !rx && c && !strcmp(p, " ") && !strcmp(c, U2581)) {
            h->replace_space = true;
            return DSP_OK;
        }
        return dsp_error(DSP_ERR_UNSUPPORTED, "normalizer Replace other than \" \" -> \"\\u2581\" is not supported");
    }
    if (!strcmp(t, "Prepend")) {
        const char *c = json_string_value(json_object_get(n, "prepend"));
        if (c && !strcmp(c, U2581)) {
            h->prepend = true;
            return DSP_OK;
        }
        return dsp_error(DSP_ERR_UNSUPPORTED, "normalizer Prepend other than \"\\u2581\" is not supported");
    }
    return dsp_error(DSP_ERR_UNSUPPORTED, "normalizer %s is not supported (NFC, Replace, Prepend and Sequence are)", t);
}

static dsp_status add_re(hf_parts *h, const char *re, dsp_tok_split how, char *own) {
    if (h->n_re >= MAX_SPLITS) {
        free(own);
        return dsp_error(DSP_ERR_UNSUPPORTED, "pre_tokenizer: more than %d splits", MAX_SPLITS);
    }
    h->re[h->n_re] = re;
    h->how[h->n_re] = how;
    h->re_own[h->n_re++] = own;
    return DSP_OK;
}

static dsp_status pre_tokenizer(hf_parts *h, const json_t *p) {
    if (!p || json_is_null(p)) return DSP_OK;
    const char *t = type_of(p);
    dsp_status st;
    if (!strcmp(t, "Sequence")) {
        size_t i;
        json_t *x;
        json_array_foreach(json_object_get(p, "pretokenizers"), i, x) if ((st = pre_tokenizer(h, x))) return st;
        return DSP_OK;
    }
    if (!strcmp(t, "ByteLevel")) {
        if (json_is_true(json_object_get(p, "add_prefix_space")))
            return dsp_error(DSP_ERR_UNSUPPORTED, "pre_tokenizer ByteLevel with add_prefix_space = true is not supported");
        h->byte_level = true;
        desc_add(h, "ByteLevel");
        const json_t *ur = json_object_get(p, "use_regex");
        if (!ur || json_is_true(ur)) return add_re(h, dsp_tok_pre_gpt2_regex(), DSP_SPLIT_ISOLATED, NULL);
        return DSP_OK;
    }
    if (!strcmp(t, "Digits")) {
        desc_add(h, "Digits");
        return add_re(h, json_is_true(json_object_get(p, "individual_digits")) ? "\\p{N}" : "\\p{N}+", DSP_SPLIT_ISOLATED, NULL);
    }
    if (!strcmp(t, "Metaspace")) {
        const char *r = json_string_value(json_object_get(p, "replacement"));
        if (!r || strcmp(r, U2581)) return dsp_error(DSP_ERR_UNSUPPORTED, "pre_tokenizer Metaspace with a replacement other than \"\\u2581\"");
        const char *scheme = json_string_value(json_object_get(p, "prepend_scheme"));
        const json_t *aps = json_object_get(p, "add_prefix_space"); /* the older form */
        h->metaspace = true;
        h->prepend = scheme ? strcmp(scheme, "never") != 0 : !aps || json_is_true(aps);
        h->meta_first = scheme && !strcmp(scheme, "first");
        const json_t *sp = json_object_get(p, "split");
        h->meta_split = !sp || json_is_true(sp);
        desc_add(h, "Metaspace");
        return DSP_OK;
    }
    if (!strcmp(t, "Split")) {
        bool rx;
        const char *pat = pattern(p, &rx), *beh = json_string_value(json_object_get(p, "behavior"));
        if (!pat) return dsp_error(DSP_ERR_UNSUPPORTED, "pre_tokenizer Split without a String or Regex pattern");
        if (json_is_true(json_object_get(p, "invert"))) return dsp_error(DSP_ERR_UNSUPPORTED, "pre_tokenizer Split with invert = true is not supported");
        dsp_tok_split how;
        if (!beh || !strcmp(beh, "Isolated")) how = DSP_SPLIT_ISOLATED;
        else if (!strcmp(beh, "Removed")) how = DSP_SPLIT_REMOVED;
        else if (!strcmp(beh, "MergedWithPrevious")) how = DSP_SPLIT_MERGED_PREV;
        else if (!strcmp(beh, "MergedWithNext")) how = DSP_SPLIT_MERGED_NEXT;
        else return dsp_error(DSP_ERR_UNSUPPORTED, "pre_tokenizer Split behavior '%.40s' is not supported", beh);
        desc_add(h, "Split");
        char *own = rx ? NULL : quote(pat);
        if (!rx && !own) return dsp_error(DSP_ERR_NOMEM, "no memory");
        return add_re(h, rx ? pat : own, how, own);
    }
    return dsp_error(DSP_ERR_UNSUPPORTED, "pre_tokenizer %s is not supported (ByteLevel, Split, Digits, Metaspace, Sequence are)", t);
}

/* The decoder chain must be the one of the kind we decode as; anything else would decode wrong. */
static dsp_status decoder(hf_parts *h, const json_t *d) {
    if (!d || json_is_null(d)) return DSP_OK;
    const char *t = type_of(d);
    dsp_status st;
    if (!strcmp(t, "Sequence")) {
        size_t i;
        json_t *x;
        json_array_foreach(json_object_get(d, "decoders"), i, x) if ((st = decoder(h, x))) return st;
        return DSP_OK;
    }
    if (!strcmp(t, "ByteLevel")) return h->byte_level ? DSP_OK : dsp_error(DSP_ERR_UNSUPPORTED, "decoder ByteLevel without a ByteLevel pre_tokenizer");
    if (h->byte_level) return dsp_error(DSP_ERR_UNSUPPORTED, "decoder %s after a ByteLevel pre_tokenizer is not supported", t);
    if (!strcmp(t, "ByteFallback") || !strcmp(t, "Fuse")) return DSP_OK;
    bool rx;
    if (!strcmp(t, "Replace")) {
        const char *p = pattern(d, &rx), *c = json_string_value(json_object_get(d, "content"));
        if (p && !rx && c && !strcmp(p, U2581) && !strcmp(c, " ")) return DSP_OK;
        return dsp_error(DSP_ERR_UNSUPPORTED, "decoder Replace other than \"\\u2581\" -> \" \" is not supported");
    }
    if (!strcmp(t, "Strip")) {
        const char *c = json_string_value(json_object_get(d, "content"));
        json_int_t start = json_integer_value(json_object_get(d, "start")), stop = json_integer_value(json_object_get(d, "stop"));
        if (c && !strcmp(c, " ") && start == 1 && stop == 0) {
            h->strip_decode = true;
            return DSP_OK;
        }
        return dsp_error(DSP_ERR_UNSUPPORTED, "decoder Strip other than one leading space is not supported");
    }
    if (!strcmp(t, "Metaspace")) {
        const char *scheme = json_string_value(json_object_get(d, "prepend_scheme"));
        const json_t *aps = json_object_get(d, "add_prefix_space");
        h->strip_decode = scheme ? strcmp(scheme, "never") != 0 : !aps || json_is_true(aps);
        return DSP_OK;
    }
    return dsp_error(DSP_ERR_UNSUPPORTED, "decoder %s is not supported", t);
}

/* bos/eos from tokenizer_config.json: a string or {"content": ...}; -1 if absent or unknown */
static int32_t config_token(const json_t *cfg, const char *key, const json_t *vocab) {
    const json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    const char *s = json_string_value(v);
    const json_t *id = s ? json_object_get(vocab, s) : NULL;
    return json_is_integer(id) ? (int32_t)json_integer_value(id) : -1;
}

/* TemplateProcessing's "single": [SpecialToken]? Sequence [SpecialToken]? -> ids added around */
static dsp_status post_processor(const json_t *pp, int32_t *pre_id, int32_t *post_id) {
    *pre_id = *post_id = -1;
    if (!pp || json_is_null(pp)) return DSP_OK;
    const char *t = type_of(pp);
    if (!strcmp(t, "ByteLevel")) return DSP_OK; /* offsets only */
    if (!strcmp(t, "Sequence")) {
        size_t i;
        json_t *x;
        json_array_foreach(json_object_get(pp, "processors"), i, x) {
            int32_t a, b;
            dsp_status st = post_processor(x, &a, &b);
            if (st) return st;
            if (a >= 0) *pre_id = a;
            if (b >= 0) *post_id = b;
        }
        return DSP_OK;
    }
    if (strcmp(t, "TemplateProcessing")) return dsp_error(DSP_ERR_UNSUPPORTED, "post_processor %s is not supported", t);
    const json_t *single = json_object_get(pp, "single"), *specials = json_object_get(pp, "special_tokens");
    size_t i;
    json_t *x;
    bool seen_seq = false;
    json_array_foreach(single, i, x) {
        if (json_object_get(x, "Sequence")) {
            seen_seq = true;
            continue;
        }
        const char *name = json_string_value(json_object_get(json_object_get(x, "SpecialToken"), "id"));
        const json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids");
        if (!name || json_array_size(ids) != 1 || !json_is_integer(json_array_get(ids, 0)))
            return dsp_error(DSP_ERR_UNSUPPORTED, "post_processor TemplateProcessing: item %zu of \"single\" is not a one-id special token", i);
        int32_t *dst = seen_seq ? post_id : pre_id;
        if (*dst >= 0) return dsp_error(DSP_ERR_UNSUPPORTED, "post_processor TemplateProcessing: more than one special token on a side");
        *dst = (int32_t)json_integer_value(json_array_get(ids, 0));
    }
    return DSP_OK;
}

dsp_status dsp_tok_create_from_hf(const json_t *tj, const json_t *tcfg, dsp_tok **out, char *model_desc, size_t model_size, char *pre_desc,
                                  size_t pre_size) {
    *out = NULL;
    hf_parts h;
    memset(&h, 0, sizeof h);
    dsp_status st = DSP_OK;
    const json_t *model = json_object_get(tj, "model");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    const json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!json_is_object(model)) return dsp_error(DSP_ERR_FORMAT, "\"model\" is missing or not an object");
    if (mtype && strcmp(mtype, "BPE")) return dsp_error(DSP_ERR_UNSUPPORTED, "model type %.40s is not supported (BPE is)", mtype);
    if (!json_is_object(vocab) || !json_is_array(merges))
        return dsp_error(DSP_ERR_UNSUPPORTED, "model is not a BPE model with a \"vocab\" object and a \"merges\" list");
    const char *cp = json_string_value(json_object_get(model, "continuing_subword_prefix"));
    const char *ew = json_string_value(json_object_get(model, "end_of_word_suffix"));
    const json_t *dropout = json_object_get(model, "dropout");
    if ((cp && *cp) || (ew && *ew)) return dsp_error(DSP_ERR_UNSUPPORTED, "BPE continuing_subword_prefix / end_of_word_suffix are not supported");
    if (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0) return dsp_error(DSP_ERR_UNSUPPORTED, "BPE dropout is not supported");
    if ((st = normalizer(&h, json_object_get(tj, "normalizer"))) || (st = pre_tokenizer(&h, json_object_get(tj, "pre_tokenizer"))))
        goto done;
    bool spm = !h.byte_level && (h.replace_space || h.metaspace);
    if (!h.byte_level && !spm) {
        st = dsp_error(DSP_ERR_UNSUPPORTED, "neither a ByteLevel nor a Metaspace / Replace(\" \" -> \"\\u2581\") tokenizer");
        goto done;
    }
    if (h.byte_level && (h.replace_space || h.prepend || h.metaspace)) {
        st = dsp_error(DSP_ERR_UNSUPPORTED, "a ByteLevel tokenizer with SentencePiece-style normalization is not supported");
        goto done;
    }
    if (spm) {
        /* a Split on " " after spaces became U+2581 never matches: nothing to do; other splits would */
        for (int i = 0; i < h.n_re; i++)
            if (!(h.replace_space && h.re_own[i] && !strcmp(h.re_own[i], " "))) {
                st = dsp_error(DSP_ERR_UNSUPPORTED, "pre_tokenizer Split with a SentencePiece-style tokenizer is not supported");
                goto done;
            }
    }
    if ((st = decoder(&h, json_object_get(tj, "decoder")))) goto done;

    /* vocabulary: vocab + added_tokens, ids dense from 0 */
    const json_t *added = json_object_get(tj, "added_tokens");
    if (added && !json_is_array(added)) {
        st = dsp_error(DSP_ERR_FORMAT, "\"added_tokens\" is not a list");
        goto done;
    }
    int64_t n = 0;
    const char *k;
    json_t *v;
    size_t i;
    json_object_foreach((json_t *)vocab, k, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (1 << 24)) {
            st = dsp_error(DSP_ERR_FORMAT, "vocab entry '%.100s' has no valid id", k);
            goto done;
        }
        if (json_integer_value(v) + 1 > n) n = json_integer_value(v) + 1;
    }
    json_array_foreach(added, i, v) {
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        if (!json_is_integer(json_object_get(v, "id")) || id < 0 || id >= (1 << 24) || !json_is_string(json_object_get(v, "content"))) {
            st = dsp_error(DSP_ERR_FORMAT, "added_tokens[%zu] needs an id in [0, 2^24) and a string content", i);
            goto done;
        }
        if (id + 1 > n) n = id + 1;
    }
    if (n == 0) {
        st = dsp_error(DSP_ERR_FORMAT, "the vocabulary is empty");
        goto done;
    }
    const char **tok = calloc((size_t)n, sizeof *tok);
    size_t *tl = calloc((size_t)n, sizeof *tl);
    int32_t *types = malloc((size_t)n * sizeof *types);
    uint8_t *af = calloc((size_t)n, 1);
    size_t nm = json_array_size(merges);
    const char **ml = malloc((nm ? nm : 1) * sizeof *ml), **mr = malloc((nm ? nm : 1) * sizeof *mr);
    size_t *mll = malloc((nm ? nm : 1) * sizeof *mll), *mrl = malloc((nm ? nm : 1) * sizeof *mrl);
    dsp_tok_pre *pre = NULL;
    if (!tok || !tl || !types || !af || !ml || !mr || !mll || !mrl) {
        st = dsp_error(DSP_ERR_NOMEM, "no memory for %lld tokens", (long long)n);
        goto free_arrays;
    }
    json_object_foreach((json_t *)vocab, k, v) {
        json_int_t id = json_integer_value(v);
        if (tok[id]) {
            st = dsp_error(DSP_ERR_FORMAT, "vocab: id %lld is given to both '%.100s' and '%.100s'", (long long)id, tok[id], k);
            goto free_arrays;
        }
        tok[id] = k;
        tl[id] = strlen(k);
    }
    for (int64_t j = 0; j < n; j++) types[j] = DSP_TOK_TYPE_NORMAL;
    json_array_foreach(added, i, v) {
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        const json_t *c = json_object_get(v, "content");
        const char *content = json_string_value(c);
        size_t clen = json_string_length(c);
        if (tok[id] && (tl[id] != clen || memcmp(tok[id], content, clen))) {
            st = dsp_error(DSP_ERR_FORMAT, "added_tokens[%zu]: id %lld is '%.100s' in the vocab", i, (long long)id, tok[id]);
            goto free_arrays;
        }
        tok[id] = content;
        tl[id] = clen;
        types[id] = json_is_true(json_object_get(v, "special")) ? DSP_TOK_TYPE_CONTROL : DSP_TOK_TYPE_USER_DEFINED;
        af[id] = (uint8_t)((json_is_true(json_object_get(v, "lstrip")) ? DSP_TOK_AF_LSTRIP : 0) |
                           (json_is_true(json_object_get(v, "rstrip")) ? DSP_TOK_AF_RSTRIP : 0) |
                           (json_is_true(json_object_get(v, "single_word")) ? DSP_TOK_AF_SINGLE_WORD : 0));
    }
    for (int64_t j = 0; j < n; j++)
        if (!tok[j]) {
            st = dsp_error(DSP_ERR_FORMAT, "no token has id %lld (ids must be dense from 0 to %lld)", (long long)j, (long long)n - 1);
            goto free_arrays;
        }
    json_array_foreach(merges, i, v) {
        if (json_is_string(v)) { /* "left right" */
            ml[i] = json_string_value(v);
            const char *sp = strchr(ml[i], ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                st = dsp_error(DSP_ERR_FORMAT, "merges[%zu] '%.100s' is not two tokens separated by one space", i, ml[i]);
                goto free_arrays;
            }
            mll[i] = (size_t)(sp - ml[i]);
            mr[i] = sp + 1;
            mrl[i] = strlen(sp + 1);
        } else if (json_is_array(v) && json_array_size(v) == 2 && json_is_string(json_array_get(v, 0)) && json_is_string(json_array_get(v, 1))) {
            ml[i] = json_string_value(json_array_get(v, 0));
            mll[i] = json_string_length(json_array_get(v, 0));
            mr[i] = json_string_value(json_array_get(v, 1));
            mrl[i] = json_string_length(json_array_get(v, 1));
        } else {
            st = dsp_error(DSP_ERR_FORMAT, "merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", i);
            goto free_arrays;
        }
    }
    dsp_tok_params p;
    memset(&p, 0, sizeof p);
    p.kind = h.byte_level ? DSP_TOK_BPE : DSP_TOK_SPM;
    p.n_tokens = (size_t)n;
    p.tokens = tok;
    p.token_lens = tl;
    p.types = types;
    p.n_merges = nm;
    p.merges = ml;
    p.merge_lens = mll;
    p.merge_right = mr;
    p.merge_right_lens = mrl;
    p.added_flags = af;
    p.ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    p.unk = -1;
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    if (unk && json_is_integer(json_object_get(vocab, unk))) p.unk = (int32_t)json_integer_value(json_object_get(vocab, unk));
    if (spm && !json_is_true(json_object_get(model, "byte_fallback")))
        for (int b = 0; b < 256 && !st; b++) { /* no byte fallback: the <0xXX> tokens must not be used as such */
            char buf[8];
            snprintf(buf, sizeof buf, "<0x%02X>", b);
            if (json_object_get(vocab, buf)) st = dsp_error(DSP_ERR_UNSUPPORTED, "a vocabulary with <0xXX> tokens but byte_fallback = false is not supported");
        }
    if (st) goto free_arrays;
    p.add_space_prefix = h.prepend;
    p.space_prefix_first_only = h.meta_first;
    p.space_prefix_unless_space = h.metaspace;
    p.spm_split = h.metaspace && h.meta_split;
    p.decode_keep_space = !h.strip_decode;
    p.nfc = h.nfc;
    int32_t pre_id, post_id;
    if ((st = post_processor(json_object_get(tj, "post_processor"), &pre_id, &post_id))) goto free_arrays;
    p.bos = tcfg ? config_token(tcfg, "bos_token", vocab) : -1;
    p.eos = tcfg ? config_token(tcfg, "eos_token", vocab) : -1;
    p.pad = tcfg ? config_token(tcfg, "pad_token", vocab) : -1;
    if (tcfg && p.unk < 0) p.unk = config_token(tcfg, "unk_token", vocab);
    p.add_bos = pre_id >= 0;
    p.add_eos = post_id >= 0;
    if (pre_id >= 0) p.bos = pre_id;
    if (post_id >= 0) p.eos = post_id;
    const json_t *ab = tcfg ? json_object_get(tcfg, "add_bos_token") : NULL, *ae = tcfg ? json_object_get(tcfg, "add_eos_token") : NULL;
    if (json_is_boolean(ab)) p.add_bos = json_is_true(ab);
    if (json_is_boolean(ae)) p.add_eos = json_is_true(ae);
    for (int32_t *id = &p.bos; id <= &p.pad; id++)
        if (*id >= n) *id = -1;
    if (h.byte_level && (st = dsp_tok_pre_create_regexes(h.re, h.how, h.n_re, &pre))) goto free_arrays;
    p.pre_custom = pre;
    st = dsp_tok_create(&p, out);
    pre = NULL; /* owned by the tokenizer now (destroyed with it, or on its failure) */
    if (!st) {
        snprintf(model_desc, model_size, "BPE (tokenizer.json%s%s)", h.byte_level ? ", byte-level" : ", byte fallback", h.nfc ? ", NFC" : "");
        snprintf(pre_desc, pre_size, "%s", h.desc[0] ? h.desc : "none");
    }
free_arrays:
    dsp_tok_pre_destroy(pre);
    free(tok);
    free(tl);
    free(types);
    free(af);
    free(ml);
    free(mr);
    free(mll);
    free(mrl);
done:
    for (int j = 0; j < h.n_re; j++) free(h.re_own[j]);
    return st;
}
