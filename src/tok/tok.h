/* tok/tok: tokenizers built from GGUF metadata, identical in ids to the Hugging Face tokenizer of
 * the same file.
 *
 * Two families:
 *  - byte-level BPE (tokenizer.ggml.model = "gpt2": GPT-2, Llama 3, Qwen2, SmolLM, StarCoder,
 *    DeepSeek, Falcon, MPT, ...). Text is split by the pre-tokenizer regexes chosen by
 *    tokenizer.ggml.pre (tok_pre.c), each piece is BPE-merged over its raw bytes by merge rank.
 *    Token strings are stored in the GPT-2 byte-to-unicode spelling and decoded to bytes at load.
 *  - SentencePiece-style BPE (model = "llama": Llama 1/2, Mistral, Phi-3, Gemma). Spaces become
 *    U+2581, a U+2581 is prepended per add_space_prefix (never for Gemma), the whole segment is one
 *    BPE word, merges come from the file or (as Hugging Face derives them) from the token scores
 *    (Gemma: from token order), unknown characters fall back to <0xXX> byte tokens.
 * Added tokens (CONTROL, USER_DEFINED, and the bos/eos/unk/pad tokens) are matched in the raw text
 * first, leftmost-longest; special ones only with DSP_TOKENIZE_PARSE_SPECIAL.
 *
 * Input text that is not valid UTF-8 is tokenized as if each maximal invalid subsequence were
 * U+FFFD (what Python's bytes.decode("utf-8", "replace") gives the HF oracle). Decoding produces
 * UTF-8 with invalid byte sequences replaced the same way; the streaming decoder holds back an
 * incomplete character, so the concatenation of its output equals the whole decode.
 *
 * Which Hugging Face? The model's own tokenizer.json, as llama.cpp's per-pre-type tables also
 * describe it and as the public test vectors (tests/test_tok_vectors.c) check. transformers'
 * GGUF loader (the oracle of tests/fixtures/tok) rebuilds that tokenizer from the metadata and
 * agrees except in three places, where we follow tokenizer.json:
 *  - pre = smollm/starcoder/refact/command-r/...: digits are split one by one before the GPT-2
 *    regex; the loader knows no such pre-type and uses the GPT-2 regex alone (SmolLM2: 92 of 2420
 *    corpus strings differ, e.g. "  7" and " ½"; the fixtures record both, see gen_tok_fixtures.py);
 *  - byte-level USER_DEFINED/CONTROL tokens not written in the byte alphabet (GPT-NeoX's runs of
 *    spaces) are added tokens; the loader drops them;
 *  - SPM with a space prefix (non-Gemma): U+2581 is prepended to every text segment, also one that
 *    starts with a space (Llama 2 / Phi-3 tokenizer.json: Prepend normalizer); the loader's
 *    Metaspace(prepend_scheme=first) would not prepend before a leading space.
 * Decoding differs from HF only on invalid UTF-8 made of byte-fallback tokens: HF's ByteFallback
 * gives one U+FFFD per byte of the bad run, we give one per maximal invalid subsequence.
 *
 * A dsp_tok is immutable after creation: encode/decode may run on many threads at once. */
#ifndef DSP_TOK_TOK_H
#define DSP_TOK_TOK_H

#include "dspark.h"
#include "core/utf8.h"
#include "io/gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct dsp_tokenizer dsp_tok;
typedef struct dsp_tok_pre dsp_tok_pre;

typedef enum dsp_tok_kind {
    DSP_TOK_BPE = 0, /* byte-level BPE ("gpt2") */
    DSP_TOK_SPM = 1, /* SentencePiece-style BPE with byte fallback ("llama") */
} dsp_tok_kind;

/* tokenizer.ggml.token_type values */
enum {
    DSP_TOK_TYPE_UNDEFINED = 0, DSP_TOK_TYPE_NORMAL = 1, DSP_TOK_TYPE_UNKNOWN = 2, DSP_TOK_TYPE_CONTROL = 3,
    DSP_TOK_TYPE_USER_DEFINED = 4, DSP_TOK_TYPE_UNUSED = 5, DSP_TOK_TYPE_BYTE = 6,
};

/* Construction from plain arrays (the GGUF constructor fills one of these). Strings need not be
 * NUL-terminated when their lengths are given; everything is copied. */
typedef struct dsp_tok_params {
    dsp_tok_kind kind;
    const char *arch;              /* general.architecture; selects the SPM variant (gemma*, phi3); may be NULL */
    const char *pre;               /* tokenizer.ggml.pre (BPE only); NULL or "" = "default" */
    size_t n_tokens;
    const char *const *tokens;     /* n_tokens strings */
    const size_t *token_lens;      /* NULL: strlen */
    const float *scores;           /* NULL: none (SPM then needs merges) */
    const int32_t *types;          /* NULL: all NORMAL */
    size_t n_merges;
    const char *const *merges;     /* "left right" in rank order; NULL if none */
    const size_t *merge_lens;      /* NULL: strlen */
    const char *const *merge_right; /* pair form: merges[i] is the left part, merge_right[i] the right; NULL: "left right" */
    const size_t *merge_right_lens; /* NULL: strlen */
    int32_t bos, eos, unk, pad;    /* -1: none */
    int add_bos, add_eos;          /* -1: the family's default (SPM: add BOS; BPE: nothing) */
    int add_space_prefix;          /* -1: default (SPM: true except Gemma; BPE: false) */
    /* from tokenizer.json (tok_hf.c); zero/NULL for GGUF */
    const uint8_t *added_flags;    /* (n_tokens) DSP_TOK_AF_* for added tokens; NULL: none */
    bool ignore_merges;            /* BPE: a piece that is itself a token is not merged (Llama 3) */
    const dsp_tok_pre *pre_custom; /* BPE: this pre-tokenizer instead of `pre` (ownership passes to the tokenizer) */
    bool space_prefix_first_only;  /* SPM: the U+2581 prefix only before the text's first segment (Metaspace "first") */
    bool space_prefix_unless_space; /* SPM: no prefix before a segment that starts with a space (Metaspace) */
    bool spm_split;                /* SPM: every U+2581 starts a new word (Metaspace split = true) */
    bool decode_keep_space;        /* SPM: do not drop the leading space the prefix added when decoding */
    bool nfc;                      /* Unicode NFC before pre-tokenization (tokenizer.json's NFC normalizer) */
} dsp_tok_params;

/* added-token flags (tokenizer.json added_tokens) */
enum { DSP_TOK_AF_LSTRIP = 1, DSP_TOK_AF_RSTRIP = 2, DSP_TOK_AF_SINGLE_WORD = 4 };

dsp_status dsp_tok_create(const dsp_tok_params *p, dsp_tok **out);
#define DSP_TOK_MAX_TEXT ((size_t)1 << 30) /* longest text dsp_tok_encode accepts (bytes) */
/* Reads tokenizer.ggml.* and general.architecture. The tokenizer copies what it needs and does not
 * keep a reference to g. */
dsp_status dsp_tok_create_from_gguf(const dsp_gguf *g, dsp_tok **out);
void dsp_tok_destroy(dsp_tok *t);
/* From a parsed tokenizer.json (Hugging Face `tokenizers` format: a BPE model with byte-level or
 * Metaspace/SentencePiece-style pre-tokenization) and, when not NULL, tokenizer_config.json
 * (bos/eos/unk/pad tokens, add_bos_token, add_eos_token). Parts we do not implement (WordPiece,
 * Unigram, an unknown normalizer, pre-tokenizer or decoder) are DSP_ERR_UNSUPPORTED naming the
 * part; nothing is silently approximated. model/pre receive short descriptions for `dspark info`. */
struct json_t;
dsp_status dsp_tok_create_from_hf(const struct json_t *tokenizer_json, const struct json_t *tokenizer_config, dsp_tok **out,
                                  char *model, size_t model_size, char *pre, size_t pre_size);

/* A growable id vector for the internal encoder. */
typedef struct dsp_tok_ids {
    int32_t *v;
    size_t n, cap;
} dsp_tok_ids;
void dsp_tok_ids_free(dsp_tok_ids *ids);
dsp_status dsp_tok_ids_push(dsp_tok_ids *ids, int32_t id);

/* Append the ids of text[0..len) to out (flags: DSP_TOKENIZE_*). */
dsp_status dsp_tok_encode(const dsp_tok *t, const char *text, size_t len, int flags, dsp_tok_ids *out);

/* Whole-sequence decode into a malloc'ed NUL-terminated buffer (*len_out excludes the NUL).
 * flags: DSP_DETOKENIZE_*. Ids out of range are an error. */
dsp_status dsp_tok_decode(const dsp_tok *t, const int32_t *ids, size_t n, int flags, char **text, size_t *len_out);

size_t dsp_tok_n_vocab(const dsp_tok *t);
dsp_tok_kind dsp_tok_get_kind(const dsp_tok *t);
const char *dsp_tok_pre_name(const dsp_tok *t);
/* The bytes the token stands for in decoded text (byte-level spelling undone, U+2581 -> ' ',
 * <0xXX> -> one byte); NULL if id is out of range. */
const char *dsp_tok_piece(const dsp_tok *t, int32_t id, size_t *len);
/* The token's string as stored in the file. */
const char *dsp_tok_text(const dsp_tok *t, int32_t id, size_t *len);
int32_t dsp_tok_type(const dsp_tok *t, int32_t id);
bool dsp_tok_is_special(const dsp_tok *t, int32_t id);
int32_t dsp_tok_bos(const dsp_tok *t);
int32_t dsp_tok_eos(const dsp_tok *t);
size_t dsp_tok_max_piece_len(const dsp_tok *t);
/* Exact lookup of a token string as stored in the file (spelling included); -1 if absent. */
int32_t dsp_tok_find(const dsp_tok *t, const char *s, size_t len);

/* ---- internals shared between tok.c, tok_pre.c, tok_bpe.c ---- */


/* Pre-tokenizer: an ordered list of PCRE2 regexes applied like HF's Split pre-tokenizers. */
dsp_status dsp_tok_pre_create(const char *name, dsp_tok_pre **out);
/* How a Split keeps what its regex matched (HF SplitDelimiterBehavior). */
typedef enum dsp_tok_split { DSP_SPLIT_ISOLATED = 0, DSP_SPLIT_REMOVED, DSP_SPLIT_MERGED_PREV, DSP_SPLIT_MERGED_NEXT } dsp_tok_split;
/* From explicit regexes (tokenizer.json); errors name the regex that does not compile. */
dsp_status dsp_tok_pre_create_regexes(const char *const *re, const dsp_tok_split *behavior, int n, dsp_tok_pre **out);
void dsp_tok_pre_destroy(dsp_tok_pre *p);
/* A piece [off, off+len) of the input. */
typedef struct dsp_tok_span {
    uint32_t off, len;
} dsp_tok_span;
typedef struct dsp_tok_spans {
    dsp_tok_span *v;
    size_t n, cap;
} dsp_tok_spans;
/* Split text (valid UTF-8) into pieces; out is reset first. tmp is scratch owned by the caller. */
dsp_status dsp_tok_pre_split(const dsp_tok_pre *p, const char *text, size_t len, dsp_tok_spans *out,
                             dsp_tok_spans *tmp);
void dsp_tok_spans_free(dsp_tok_spans *s);
/* GPT-2's ByteLevel regex (HF ByteLevel pre-tokenizer with use_regex) */
const char *dsp_tok_pre_gpt2_regex(void);
/* comma-separated list of the known names, for messages */
const char *dsp_tok_pre_known(void);

#endif
