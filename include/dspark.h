/* dspark.h: the only public API of the dspark library.
 *
 * dspark is a C11 inference engine built around lossless speculative decoding. The command-line
 * tool and the server are clients of this header like any embedding program. Handles are opaque;
 * every function that can fail returns a dsp_status and leaves a human-readable message, naming
 * the bad input, in dsp_last_error() (per thread). */
#ifndef DSPARK_H
#define DSPARK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsp_status {
    DSP_OK = 0,
    DSP_ERR_INVALID_ARG,  /* a parameter is out of its documented range */
    DSP_ERR_IO,           /* a file could not be opened / read / mapped */
    DSP_ERR_FORMAT,       /* a file or request is malformed (corrupt GGUF, bad JSON, ...) */
    DSP_ERR_UNSUPPORTED,  /* well-formed but not supported (architecture, tensor type, ...) */
    DSP_ERR_NOMEM,        /* an allocation failed or a limit would be exceeded */
    DSP_ERR_NOT_FOUND,    /* a named thing (key, tensor, model) does not exist */
    DSP_ERR_RANGE,        /* e.g. a prompt longer than the context */
    DSP_ERR_TEMPLATE,     /* a chat template failed to parse or render */
    DSP_ERR_CANCELLED,    /* the caller cancelled the operation */
    DSP_ERR_BUSY,         /* a queue is full or the engine is shutting down */
    DSP_ERR_INTERNAL,     /* a bug: please report */
} dsp_status;

const char *dsp_status_to_string(dsp_status st);
/* The calling thread's message for the last failed call ("" if none). */
const char *dsp_last_error(void);

/* ---- models ------------------------------------------------------------------------------ */

typedef struct dsp_model dsp_model;           /* weights (mmapped) + metadata + tokenizer */
typedef struct dsp_tokenizer dsp_tokenizer;   /* owned by its model */

typedef struct dsp_model_params {
    bool vocab_only;        /* load metadata + tokenizer only; no weight checks beyond the file layout */
    bool progress;          /* print load progress to stderr (the CLI sets it on a TTY) */
} dsp_model_params;

dsp_model_params dsp_model_default_params(void);
/* path: a local GGUF file. */
dsp_status dsp_model_load(const char *path, const dsp_model_params *params, dsp_model **out);
void dsp_model_destroy(dsp_model *m);

/* What `dspark info` shows. Strings point into the model and live as long as it. */
typedef struct dsp_model_info {
    const char *path;
    uint32_t gguf_version;
    uint64_t file_size;
    const char *arch;           /* general.architecture, e.g. "llama" */
    const char *name;           /* general.name or "" */
    uint64_t n_params;          /* sum of all tensor element counts */
    uint64_t n_tensors;
    uint32_t n_layers, n_embd, n_ff, n_head, n_head_kv; /* 0 where the metadata lacks them */
    uint32_t n_ctx_train;       /* <arch>.context_length, 0 if absent */
    uint32_t n_vocab;           /* from tokenizer.ggml.tokens, 0 if absent */
    const char *tok_model;      /* tokenizer.ggml.model ("gpt2", "llama", ...) or "" */
    const char *tok_pre;        /* tokenizer.ggml.pre or "" */
    bool has_chat_template;
    /* bytes and tensor counts per tensor type id (index = GGML type id, < 40) */
    uint64_t type_bytes[40];
    uint32_t type_count[40];
} dsp_model_info;

void dsp_model_get_info(const dsp_model *m, dsp_model_info *info);
const char *dsp_tensor_type_name(uint32_t type_id); /* "Q4_K"; NULL if unknown */

/* ---- tokenizer --------------------------------------------------------------------------- */

enum {
    DSP_TOKENIZE_ADD_SPECIAL = 1 << 0, /* add BOS/EOS as the model's metadata asks */
    DSP_TOKENIZE_PARSE_SPECIAL = 1 << 1, /* match special-token text (e.g. "<|im_start|>") as tokens */
};

enum {
    DSP_DETOKENIZE_SKIP_SPECIAL = 1 << 0, /* leave out special tokens (BOS, EOS, <|im_start|>, ...) */
};

const dsp_tokenizer *dsp_model_tokenizer(const dsp_model *m);

/* Text -> ids, identical to the Hugging Face tokenizer of the same file. text need not be
 * NUL-terminated; bytes that are not valid UTF-8 are read as U+FFFD (one per maximal invalid
 * subsequence, as Python's bytes.decode(errors="replace")). *n_out receives the number of ids the
 * text has even when it exceeds cap; then only the first cap are stored and DSP_ERR_RANGE is
 * returned (call with cap 0 to size the buffer). flags: DSP_TOKENIZE_*. */
dsp_status dsp_tokenize(const dsp_tokenizer *t, const char *text, size_t len, int flags, int32_t *ids, size_t cap,
                        size_t *n_out);
/* Ids -> UTF-8 text (invalid byte sequences become U+FFFD). Writes at most cap - 1 bytes and a
 * NUL when cap > 0; *len_out receives the full length (excluding the NUL); DSP_ERR_RANGE if it did
 * not fit. flags: DSP_DETOKENIZE_*. An id outside the vocabulary is DSP_ERR_RANGE. */
dsp_status dsp_detokenize(const dsp_tokenizer *t, const int32_t *ids, size_t n, int flags, char *text, size_t cap,
                          size_t *len_out);
/* The raw bytes a token stands for (may be part of a UTF-8 character); same cap/len rules. */
dsp_status dsp_token_to_piece(const dsp_tokenizer *t, int32_t id, char *buf, size_t cap, size_t *len_out);
int32_t dsp_tokenizer_n_vocab(const dsp_tokenizer *t);
int32_t dsp_tokenizer_bos(const dsp_tokenizer *t);  /* -1 if none */
int32_t dsp_tokenizer_eos(const dsp_tokenizer *t);  /* -1 if none */
bool dsp_tokenizer_is_special(const dsp_tokenizer *t, int32_t id); /* control/special token */
/* Longest piece in bytes: a streaming decoder never returns more than 3 * this + 6 bytes per id. */
size_t dsp_tokenizer_max_piece(const dsp_tokenizer *t);

/* Incremental detokenization for streaming: feed ids one at a time and get the text they complete.
 * Never returns part of a UTF-8 character; the concatenation of all feeds and the final flush is
 * exactly dsp_detokenize of the whole sequence. Feeding allocates nothing. The returned text is
 * valid until the next call on the stream. */
typedef struct dsp_detok_stream dsp_detok_stream;
dsp_status dsp_detok_stream_create(const dsp_tokenizer *t, int flags, dsp_detok_stream **out);
dsp_status dsp_detok_stream_feed(dsp_detok_stream *s, int32_t id, const char **text, size_t *len);
/* End of sequence: a trailing incomplete character becomes U+FFFD. The stream can then be reused. */
dsp_status dsp_detok_stream_flush(dsp_detok_stream *s, const char **text, size_t *len);
void dsp_detok_stream_destroy(dsp_detok_stream *s);

#ifdef __cplusplus
}
#endif
#endif
