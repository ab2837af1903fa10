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
    const char *quantize;   /* NULL, or "q8_0", "q4_0", "q4_k": F32/F16/BF16 matrices are quantized at
                               load, bit-identical to the gguf package's quantizer (q8_0, q4_0) or
                               byte-identical to llama.cpp's reference quantizer (q4_k) */
    int n_threads;          /* threads for load-time work (quantization); 0 = physical cores */
} dsp_model_params;

dsp_model_params dsp_model_default_params(void);
/* path: a GGUF file; a Hugging Face model directory (config.json + *.safetensors + tokenizer.json);
 * or a Hugging Face repo id "org/name[@revision]" found in the local hub cache ($HF_HUB_CACHE,
 * $HF_HOME/hub or ~/.cache/huggingface/hub; `dspark pull` fills it). */
dsp_status dsp_model_load(const char *path, const dsp_model_params *params, dsp_model **out);
void dsp_model_destroy(dsp_model *m);

/* What `dspark info` shows. Strings point into the model and live as long as it. */
typedef struct dsp_model_info {
    const char *path;           /* the file or directory loaded (a repo id resolves to its snapshot) */
    const char *format;         /* "gguf" or "safetensors" */
    uint32_t gguf_version;      /* 0 for safetensors */
    uint32_t n_files;           /* weight files (safetensors shards) */
    uint64_t file_size;         /* bytes of all weight files */
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
    const char *chat_template_origin; /* "tokenizer.chat_template", "chat_template.jinja", ... or "" */
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
 * returned (call with cap 0 to size the buffer). Texts over 1 GiB are refused (DSP_ERR_RANGE).
 * flags: DSP_TOKENIZE_*. */
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

/* ---- chat templates ---------------------------------------------------------------------- */

/* true if the model file carries tokenizer.chat_template */
bool dsp_model_has_chat_template(const dsp_model *m);
/* The template's Jinja source (not NUL-terminated: *len bytes), or NULL if there is none. */
const char *dsp_model_chat_template(const dsp_model *m, size_t *len);
/* Render a conversation with the model's chat template (or, when template_src is not NULL, with
 * that Jinja source instead). context_json is a JSON object: {"messages": [{"role", "content"},
 * ...], "add_generation_prompt": true, ...any other template variables}; bos_token and eos_token
 * are filled in from the tokenizer when absent. *out is malloc'd and NUL-terminated. Errors:
 * DSP_ERR_FORMAT for bad JSON, DSP_ERR_TEMPLATE for template errors (raise_exception included),
 * DSP_ERR_NOT_FOUND when the model has no template and none is given. */
dsp_status dsp_chat_render(const dsp_model *m, const char *template_src, const char *context_json, size_t len, char **out,
                           size_t *out_len);

/* Sampling defaults a model ships (generation_config.json of a Hugging Face directory; GGUF files
 * carry none). Front ends use them for requests that omit a field (as vLLM does). */
enum {
    DSP_GEN_HAS_TEMPERATURE = 1 << 0,
    DSP_GEN_HAS_TOP_P = 1 << 1,
    DSP_GEN_HAS_TOP_K = 1 << 2,
    DSP_GEN_HAS_MIN_P = 1 << 3,
    DSP_GEN_HAS_REPETITION_PENALTY = 1 << 4,
};
typedef struct dsp_gen_defaults {
    unsigned has;               /* DSP_GEN_HAS_* for the fields the model sets */
    float temperature, top_p, min_p, repetition_penalty;
    int32_t top_k;
    const char *source;         /* the file they came from, or "" */
} dsp_gen_defaults;
void dsp_model_gen_defaults(const dsp_model *m, dsp_gen_defaults *out);

/* ---- inference: the engine ---------------------------------------------------------------- *
 *
 * One dsp_engine runs one model for many requests at once (continuous batching, DESIGN.md §1).
 * It is non-blocking: submit requests, call dsp_engine_step to run one round (one forward over
 * every running sequence: prefill chunks, decode tokens and verify blocks together), and read the
 * events that round produced (tokens, logprobs, finish). A request can be cancelled at any round
 * boundary, prefill included. KV blocks of finished requests stay in a prefix cache, so a request
 * that starts like an earlier one (a follow-up turn, a shared system prompt) computes only the
 * rest. dsp_generate is a small blocking helper on top.
 *
 * Threads: an engine is used from one thread at a time (the server has one engine thread). */

typedef struct dsp_engine dsp_engine;

typedef enum dsp_device {
    DSP_DEVICE_AUTO = 0,    /* the GPU when the build has CUDA, a GPU can run it and the model fits, else the CPU
                             * (with a warning when a GPU was there); $DSPARK_DEVICE=cpu|cuda decides instead */
    DSP_DEVICE_CPU,
    DSP_DEVICE_CUDA,
} dsp_device;
const char *dsp_device_to_string(dsp_device d); /* "auto", "cpu", "cuda" */

/* The element type of the KV cache. K/V rows are rounded to it when written and widened exactly
 * when read, so any type keeps batch invariance and lossless speculation. F16 is the default on
 * either backend (llama.cpp's default too): on the CPU it halves the cache's memory against F32 at
 * a logit error of ~1e-3 on the tiny golden models, and with several sequences per forward it is
 * faster (2-core Zen 4, default model, `dspark batch`: 4 sequences +7%, 16 +7%, 1 the same: the
 * K/V of a batch no longer stay in L3 beside the weights streamed each round). F32 is the CPU's
 * reference arithmetic (the golden checks against transformers run the forward with it). */
typedef enum dsp_kv_type {
    DSP_KV_DEFAULT = 0,     /* F16, on either backend */
    DSP_KV_F16,
    DSP_KV_BF16,            /* F16's range is +-65504; BF16 has F32's range with 8 significant bits */
    DSP_KV_F32,             /* the CPU only */
} dsp_kv_type;
const char *dsp_kv_type_to_string(dsp_kv_type t); /* "default", "f16", "bf16", "f32" */

/* Arithmetic of the matmuls on the CPU. Q8 (the default): activations are quantized to 8 bits per
 * block of 32 for weights of types Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K, and the dot products
 * run in integers (several times less compute per token, the same arithmetic for 1 row and n
 * rows); F32: f32 activations for every weight type, as dspark computed before 8-bit activations.
 * Either is batch-invariant and lossless for speculation; they differ from each other by rounding. */
typedef enum dsp_precision {
    DSP_PRECISION_Q8 = 0,
    DSP_PRECISION_F32,
} dsp_precision;
const char *dsp_precision_to_string(dsp_precision p); /* "q8", "f32" */

/* A float block drafter next to a quantized target, on the CPU with 8-bit activations (README "Block
 * drafters on the CPU"): its layer matrices (with the tap projection and the Markov head's W2) are
 * quantized at load to this type. Q4_0 (the default) streams half Q8_0's bytes a draft; its drafts
 * differ by the rounding (acceptance within ~1% on the default model's drafter). Lossless either way;
 * the GPU and --precision f32 keep the drafter's own type. */
typedef enum dsp_draft_quant {
    DSP_DRAFT_QUANT_DEFAULT = 0, /* Q4_0 */
    DSP_DRAFT_QUANT_Q8_0,
    DSP_DRAFT_QUANT_Q4_0,
} dsp_draft_quant;
/* "q4_0" / "q8_0" (the option's spelling) -> *out; false for anything else */
bool dsp_draft_quant_parse(const char *s, dsp_draft_quant *out);

typedef struct dsp_engine_params {
    dsp_device device;
    int gpu;                /* CUDA device index */
    dsp_kv_type kv_type;    /* K/V element type (default: F16) */
    int n_threads;          /* CPU threads; 0 = physical cores */
    dsp_precision precision; /* CPU matmul arithmetic (default Q8) */
    dsp_draft_quant draft_quant; /* the block drafter's matrices on the CPU (above; default Q4_0) */
    uint32_t n_ctx;         /* tokens per sequence; 0 = min(training context, 4096) */
    uint64_t kv_memory;     /* bytes of KV cache over all sequences; 0 = enough for max_batch full contexts,
                             * at most a quarter of physical memory (and at least one context) */
    uint32_t kv_tokens;     /* the same in tokens (wins over kv_memory when set) */
    int max_batch;          /* sequences running at once (0 = 8) */
    int batch_tokens;       /* tokens in one round, also the longest prefill chunk (0 = 512) */
    float prefill_itl;      /* a round that carries a prefill chunk next to decoding requests may cost
                             * this many times a round of one row per decoding request (the chunk is
                             * sized from the measured cost, at least one row; 0 = 1.5; 1..100): lower
                             * keeps their inter-token latency smoother while a long prompt is
                             * prefilled, higher prefills it sooner */
    bool no_prefix_cache;   /* never reuse KV across requests */
    bool progress;          /* weight upload progress on stderr */
    bool reserve_memory;    /* make the KV pool and the engine's buffers resident at creation (the server
                             * does): memory then stays flat under load instead of growing until the
                             * prefix cache fills the pool, and a pool the machine cannot provide fails
                             * now (an error, or the kernel's OOM killer) rather than later under load */
    const char *draft_model; /* a block drafter (DFlash or DSpark): a Hugging Face directory or a repo id in
                              * the hub cache; NULL: none. Checked against the model (hidden size,
                              * vocabulary, tap layers, mask token, embedding/head copies) at creation. */
    int32_t draft_vocab;    /* the block drafter's draft vocabulary (README "Draft vocabulary"): its LM head
                             * runs over this many tokens only and drafts come from them; lossless either
                             * way. DSP_DRAFT_VOCAB_AUTO (0, the default): 16384 tokens when the vocabulary
                             * has more than 32768 and the LM head is at least 1/8 of the model's
                             * parameters, else all; DSP_DRAFT_VOCAB_FULL: every token; 1..n_vocab: that
                             * many (more than n_vocab, or below DSP_DRAFT_VOCAB_FULL, is an error) */
} dsp_engine_params;
#define DSP_DRAFT_VOCAB_AUTO 0
#define DSP_DRAFT_VOCAB_FULL (-1)

dsp_engine_params dsp_engine_default_params(void);
dsp_status dsp_engine_create(dsp_model *m, const dsp_engine_params *p, dsp_engine **out);
void dsp_engine_destroy(dsp_engine *e);
uint32_t dsp_engine_n_ctx(const dsp_engine *e);
const char *dsp_engine_backend(const dsp_engine *e); /* "cpu avx512, 2 threads", ... */

#define DSP_MAX_STOP 4          /* stop strings per request (OpenAI's limit) */
#define DSP_MAX_LOGPROBS 20

typedef struct dsp_logit_bias {
    int32_t token;
    float bias;             /* [-100, 100] */
} dsp_logit_bias;

#define DSP_MAX_DRAFT 32        /* longest draft verified in one round */
#define DSP_DRAFT_AUTO 0        /* dsp_gen_params.max_draft: choose per round (see max_draft) */

/* How tokens are proposed for verification (speculative decoding; always lossless). */
typedef enum dsp_spec_mode {
    DSP_SPEC_BASELINE = 0,  /* no speculation: one token per forward */
    DSP_SPEC_LOOKUP,        /* prompt lookup: n-gram matches in prompt + output, no drafter model */
    DSP_SPEC_AUTO,          /* with a block drafter: per request and round, whichever of prompt lookup,
                             * the block drafter (with its DSpark heads when it has them) or no draft
                             * is expected to give the most tokens per unit of time, from the request's
                             * acceptance so far and the engine's cost profile; without one: lookup */
    DSP_SPEC_DFLASH,        /* the engine's block drafter, backbone only (a DSpark drafter's Markov and
                             * confidence heads are not used) */
    DSP_SPEC_DSPARK,        /* the engine's DSpark drafter with its Markov and confidence heads */
    DSP_SPEC_HYBRID,        /* per round: a prompt-lookup match of at least hybrid_min tokens is verified
                             * instead of running the block drafter (which drafts otherwise) */
} dsp_spec_mode;
/* "baseline", "lookup", "auto", "dflash", "dspark", "hybrid" */
const char *dsp_spec_mode_to_string(dsp_spec_mode m);
/* the mode for a name above; false if unknown */
bool dsp_spec_mode_from_string(const char *s, dsp_spec_mode *out);

/* One speculation round of one request, for --trace-rounds (dsp_gen_params.trace). Pointers are
 * valid during the callback only. */
typedef struct dsp_round_trace {
    uint32_t pos;               /* absolute position of the anchor (the last committed token) */
    const char *source;         /* who drafted: "lookup", "dflash", "dspark"; "" when nobody did */
    int32_t n_draft;            /* the full proposal before truncation (a block drafter's whole block) */
    const int32_t *draft;
    int32_t kept;               /* drafts verified (after confidence truncation and the max-draft cap) */
    int32_t accepted;           /* of which accepted */
    int32_t next;               /* the token committed after them (correction or bonus); -1 if the
                                 * generation ended before it (a stop inside the accepted drafts) */
    int32_t ctx_rows;           /* block drafters: context rows new since the last block draft */
    const float *conf;          /* DSpark: confidence logits of the n_draft slots; NULL otherwise */
    const int32_t *top_ids;     /* block drafters: (n_draft, 3) top-3 ids of each slot's logits (DSpark:
                                 * Markov-corrected); NULL otherwise */
    const float *top_vals;      /* (n_draft, 3) their values */
} dsp_round_trace;
typedef void (*dsp_trace_cb)(const dsp_round_trace *t, void *user);

typedef struct dsp_gen_params {
    int32_t max_tokens;         /* tokens to generate at most (> 0) */
    float temperature;          /* 0 = greedy */
    float top_p;                /* (0, 1]; 1 = off */
    int32_t top_k;              /* 0 = off */
    float min_p;                /* [0, 1]; 0 = off */
    float presence_penalty;     /* [-2, 2] (OpenAI) */
    float frequency_penalty;    /* [-2, 2] (OpenAI) */
    float repetition_penalty;   /* > 0; 1 = off (llama.cpp semantics) */
    int32_t repetition_last_n;  /* window for the repetition penalty; -1 = all; default 64 */
    const dsp_logit_bias *logit_bias;
    uint32_t n_logit_bias;
    uint64_t seed;              /* sampling RNG seed (same seed + inputs = same output) */
    const char *stop[DSP_MAX_STOP]; /* stop strings (NULL-terminated list, at most 4) */
    bool ignore_eos;            /* keep going past end-of-generation tokens */
    int32_t logprobs;           /* -1: none; 0..20: chosen token + that many alternatives */
    dsp_spec_mode mode;         /* speculation (default baseline in the library; the CLI uses auto) */
    int32_t max_draft;          /* drafted tokens verified per round at most, 1..DSP_MAX_DRAFT; or
                                 * DSP_DRAFT_AUTO: each round the number that maximises expected
                                 * committed tokens per second from the engine's measured cost curve and
                                 * this request's acceptance so far (README "--max-draft auto") */
    int32_t lookup_min_n, lookup_max_n; /* n-gram sizes for prompt lookup (defaults 2 and 4) */
    float dspark_threshold;     /* DSpark: keep the drafts before the first slot k with sigmoid(c_k) < tau
                                 * (DeepSpec's per-slot rule); 0 = off. [0, 1] */
    float dspark_cumulative;    /* DSpark: also cut at the first slot whose product of sigmoid(c_j), j <= k,
                                 * is below this (DRAFTERS.md §2.8 cumulative variant); 0 = off. [0, 1] */
    int32_t hybrid_min;         /* hybrid: lookup matches of at least this many tokens are used (default 4) */
    bool draft_sample;          /* T > 0 with a block drafter: drafts are sampled from the drafter's
                                 * distribution q and verified by rejection sampling (default true); false:
                                 * argmax drafts verified by sample-and-match (README says why) */
    dsp_trace_cb trace;         /* called once per decoding round of this request (NULL: none) */
    void *trace_user;
} dsp_gen_params;

dsp_gen_params dsp_gen_default_params(void);
/* Set the fields of p that the model's defaults cover and the caller did not give (`given` has a
 * DSP_GEN_HAS_* bit for each field the request or command line set). */
void dsp_gen_apply_defaults(const dsp_gen_defaults *d, unsigned given, dsp_gen_params *p);

typedef enum dsp_finish {
    DSP_FINISH_NONE = 0,
    DSP_FINISH_STOP,       /* end-of-generation token or stop string */
    DSP_FINISH_LENGTH,     /* max_tokens or the context limit */
    DSP_FINISH_CANCELLED,  /* cancelled (dsp_engine_cancel, or the callback asked to stop) */
} dsp_finish;
const char *dsp_finish_to_string(dsp_finish f); /* "stop", "length", "cancelled" */

typedef struct dsp_token_logprob {
    int32_t token;
    float logprob;
} dsp_token_logprob;

/* One generated token, as it is decided. text holds the newly emitted bytes: whole UTF-8
 * characters only, with any possible start of a stop string held back until it is resolved, so a
 * token may carry no text and a later one the text of several. */
typedef struct dsp_token_event {
    int32_t token;
    const char *text;
    size_t text_len;
    dsp_token_logprob chosen;      /* valid when logprobs >= 0 */
    int32_t n_top;
    const dsp_token_logprob *top;  /* (n_top), most likely first */
} dsp_token_event;

/* return false to cancel the generation (finish = cancelled) */
typedef bool (*dsp_token_cb)(const dsp_token_event *ev, void *user);

typedef struct dsp_gen_result {
    dsp_finish finish;
    size_t n_prompt;        /* prompt tokens */
    size_t n_cached;        /* of which reused from the prefix cache */
    size_t n_generated;     /* sampled tokens (an end-of-generation token counts) */
    double prefill_ms, decode_ms;
    /* Speculation statistics. A round decides at least one token: the first from the prefill
     * logits, every later one from one target forward over [last token, drafts]. */
    size_t n_rounds;        /* rounds (target forwards after prefill + 1) */
    size_t n_draft_rounds;  /* rounds that verified at least one draft */
    size_t n_drafted;       /* draft tokens proposed and verified */
    size_t n_accepted;      /* of which accepted */
    /* rounds whose verification produced k tokens (accepted drafts + the bonus), k = 1..DSP_MAX_DRAFT+1;
     * the last round may emit fewer when a stop, max_tokens or a cancellation cuts it */
    size_t accept_hist[DSP_MAX_DRAFT + 2];
    size_t kept_hist[DSP_MAX_DRAFT + 1]; /* rounds by drafts verified (the caps chosen), k = 0..DSP_MAX_DRAFT */
    size_t n_block_rounds;  /* rounds in which the block drafter ran for this request */
    double draft_ms;        /* time in the block drafter for this request (a batched draft's time is
                             * shared equally by its requests) */
    double verify_ms;       /* time in the target forwards of this request's decoding rounds (shared
                             * equally by the requests of a round) */
} dsp_gen_result;

typedef uint64_t dsp_req_id;

/* Queue a request: generate a continuation of prompt (the whole token list, e.g. a rendered chat).
 * Validated here: an empty prompt, ids out of the vocabulary or bad parameters are
 * DSP_ERR_INVALID_ARG naming the field; a prompt that does not fit the context, or a request
 * whose prompt + max_tokens needs more KV than the whole cache holds, is DSP_ERR_RANGE naming
 * the limit. p is copied (stop strings and logit bias too). user comes back in its events. */
dsp_status dsp_engine_submit(dsp_engine *e, const int32_t *prompt, size_t n_prompt, const dsp_gen_params *p, void *user, dsp_req_id *id);
/* Stop a request at the next round boundary (its DONE event says cancelled). Unknown or finished
 * ids are ignored. */
void dsp_engine_cancel(dsp_engine *e, dsp_req_id id);
/* true when nothing is waiting or running */
bool dsp_engine_idle(const dsp_engine *e);

typedef enum dsp_event_type {
    DSP_EVENT_TOKEN = 0,    /* one decided token (tok) */
    DSP_EVENT_DONE,         /* the request ended: status (DSP_OK or the error), res */
} dsp_event_type;

typedef struct dsp_event {
    dsp_event_type type;
    dsp_req_id id;
    void *user;
    dsp_token_event tok;        /* TOKEN */
    dsp_status status;          /* DONE: DSP_OK, or why the request failed (error has the message) */
    const char *error;          /* DONE with an error */
    const dsp_gen_result *res;  /* DONE: finish reason, counts, timings */
} dsp_event;

/* Run one round. *events receives the round's events in order (every TOKEN of a request before
 * its DONE), valid until the next step. A request's TOKEN events come in generation order. Returns
 * an error only for problems of the engine itself; a failing request gets a DONE event with its
 * status instead. */
dsp_status dsp_engine_step(dsp_engine *e, const dsp_event **events, size_t *n_events);

/* What the engine is doing, for metrics and logs. Counters are totals since creation. */
typedef struct dsp_engine_stats {
    uint32_t waiting, running;
    uint32_t peak_running;  /* most requests that shared one round */
    uint32_t kv_blocks, kv_blocks_used, kv_blocks_cached, block_tokens;
    uint64_t kv_bytes;      /* the pool's K/V memory (target and block drafter) */
    uint64_t requests, prompt_tokens, cached_tokens, generated_tokens;
    uint64_t rounds, spec_rounds, drafted, accepted, evicted_blocks;
    uint64_t accept_hist[DSP_MAX_DRAFT + 2]; /* verify rounds by tokens they decided */
    uint64_t block_drafts;      /* requests drafted by the block drafter (summed over rounds) */
    double draft_ms;            /* time in the block drafter (draft and context steps) */
    uint64_t context_rows;      /* rows of the block drafter's context steps */
    uint64_t auto_lookup_only;  /* mode auto requests started as prompt lookup alone: at admission the
                                 * block drafter was not expected to pay */
    uint64_t auto_gave_up;      /* mode auto requests that gave the block drafter up while decoding */
    uint64_t forward_rows;      /* rows of every round's target forward */
    double forward_ms;          /* time in the rounds' target forwards (with the drafter's context step) */
    double host_ms;             /* the rounds' time outside the forward: drafting, layout, verification,
                                 * sampling, detokenization, stop strings, events */
    double cost_scale[3];       /* --max-draft auto's calibration: measured / profiled time of recent
                                 * decode-only rounds without drafts, with lookup drafts, with the block
                                 * drafter (1: nothing measured) */
} dsp_engine_stats;
void dsp_engine_get_stats(const dsp_engine *e, dsp_engine_stats *st);
/* Drop every cached prefix (blocks of running requests are kept). */
void dsp_engine_clear_cache(dsp_engine *e);

/* The engine's block drafter (dsp_engine_params.draft_model). Strings live as long as the engine. */
typedef struct dsp_drafter_info {
    const char *path;           /* the directory loaded */
    const char *kind;           /* "dspark" (Markov and/or confidence head) or "dflash" */
    const char *layout;         /* "z-lab DFlash", "DeepSpec", "ModelOpt" */
    int32_t block;              /* query slots per block (anchor + masks) */
    int32_t n_draft;            /* drafts per block */
    int32_t n_layers, n_taps;
    int32_t tap_layers[16];     /* target layers whose outputs feed the drafter */
    int32_t mask_token;
    int32_t markov_rank;        /* 0: no Markov head */
    const char *markov_head;    /* "vanilla", "gated", "rnn" (DeepSpec's markov_head_type), or "none" */
    bool confidence_head;
    bool shares_embedding, shares_lm_head; /* uses the target's tensors (no copy, or an equal one) */
    uint64_t n_params;          /* elements of the drafter's own tensors */
    const char *layer_type;     /* its layers' matrix type as they run: "BF16", "Q4_0" (--draft-quant), ... */
    int32_t draft_vocab;        /* tokens drafts are taken from (the vocabulary size: all of them) */
    const char *draft_vocab_source; /* "full", "token id order", "draft_vocab.json" (+ "token id order") */
} dsp_drafter_info;
/* false (and *out zeroed) when the engine has no block drafter */
bool dsp_engine_drafter_info(const dsp_engine *e, dsp_drafter_info *out);
/* What a request's mode means on this engine: auto -> hybrid (chosen per round, see DSP_SPEC_AUTO) with
 * a block drafter, else lookup. */
dsp_spec_mode dsp_engine_resolve_mode(const dsp_engine *e, dsp_spec_mode m);

/* The cost curve --max-draft auto decides with, measured on first use (or read from a profile
 * cached under $XDG_CACHE_HOME/dspark or ~/.cache/dspark, keyed by model, drafter, backend,
 * threads and dspark version). Times are relative to a 1-row forward of the target. */
#define DSP_PROFILE_MAX 24
typedef struct dsp_spec_profile {
    int32_t n;                  /* points of the curve */
    int32_t rows[DSP_PROFILE_MAX]; /* rows of one forward (1 = a plain decode step) */
    float rel[DSP_PROFILE_MAX]; /* c(rows - 1): its time / a 1-row forward's, at the measured context */
    double one_row_ms;          /* a 1-row forward at ctx_tokens of context */
    uint32_t ctx_tokens;        /* the context length the curve was measured at */
    float ctx_rel_per_key;      /* extra relative time per row per key of context beyond ctx_tokens */
    float draft_rel;            /* the block drafter's cost for one request's block (0: no drafter) */
    float draft_ctx_rel;        /* its context step for one row (inside every forward, so inside rel too) */
    float draft_rel_per_req;    /* its added cost per further request in the same draft call */
    bool cached;                /* read from the cache file */
    char cache_path[512];
} dsp_spec_profile;
/* Measure (or read) the profile now; *out receives it. */
dsp_status dsp_engine_profile(dsp_engine *e, dsp_spec_profile *out);

/* Blocking helper: submit, then step until this request is done, reporting its tokens through cb
 * (return false to cancel). Other requests already submitted make progress meanwhile. */
dsp_status dsp_generate(dsp_engine *e, const int32_t *prompt, size_t n_prompt, const dsp_gen_params *p, dsp_token_cb cb, void *user,
                        dsp_gen_result *res);

#ifdef __cplusplus
}
#endif
#endif
