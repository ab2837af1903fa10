/* spec/block: block drafters, DFlash and DSpark (DRAFTERS.md §1-2).
 *
 * A block drafter is a small stack of Qwen3-style layers that drafts a whole block in ONE
 * non-causal forward: its queries are [anchor, MASK, ..., MASK] at positions start..start+B-1,
 * its keys and values are the block's own plus the "context" K/V of every committed position,
 * computed from the target's hidden states at chosen layers (taps): C = hidden_norm(fc(taps)),
 * then k_norm(k_proj(C)) with RoPE and v_proj(C) per layer ("KV injection"). Logits come from the
 * LM head (the target's, or the drafter's own bit-identical copy) after the drafter's final norm.
 * DSpark adds a Markov head (a bias W2 W1[previous draft] on each slot's logits, so slot k depends
 * on the token drafted at k-1) and a confidence head (a logit per slot; DeepSpec truncates the
 * block at the first slot whose sigmoid falls below a threshold).
 *
 * Layouts (block_load.c): z-lab DFlashDraftModel (dflash_config, no embedding/head of its own,
 * slots 1..B-1 draft: slot i predicts position start+i); DeepSpec Qwen3DSparkModel (top-level keys,
 * embed_tokens/lm_head copies, markov_head.*, confidence_head.*; every slot drafts: slot k predicts
 * position start+k+1); NVIDIA ModelOpt's export of DSpark (DFlashDraftModel with
 * dflash_config.projector_type "dspark" / shift_label, un-prefixed markov_w1/markov_w2/
 * confidence_proj, shifted slots).
 *
 * KV: the drafter's K/V live in a backend KV store indexed by the TARGET's block ids and block
 * tables (registered with the target's pool for copy-on-write), so prefix caching, rollback by
 * length and copy-on-write need nothing of their own. Two steps write it:
 *   context  after every target forward, for EVERY row of that forward (prefill chunks and whole
 *            verify blocks, rejected rows too): the context K/V at the row's position. Rows past
 *            what the verifier commits are garbage past the sequence's length, exactly like the
 *            target's own K/V, and are cut by the same truncation. Since every forward of an
 *            engine with a block drafter runs it, every committed position of every sequence has
 *            its drafter K/V: a published prefix block is always complete in both stores.
 *   draft    per round, per drafting request: the block's own K/V at positions start..start+B-1
 *            (past the committed length; overwritten by the next context step), attention of the
 *            block rows over keys [0, start + B).
 * Everything runs through the backend ops (backend.h), so the drafter runs wherever the target
 * does; the host reads back only the block's logits (and normed hidden rows for the confidence
 * head), and runs the per-slot Markov step's argmax/sampling. */
#ifndef DSP_SPEC_BLOCK_H
#define DSP_SPEC_BLOCK_H

#include "backend/backend.h"
#include "kv/kv.h"
#include "model/model.h"
#include "sample/rng.h"

#define DSP_BLOCK_MAX 32      /* query slots per block at most */
#define DSP_BLOCK_MAX_TAPS 16 /* tapped target layers at most */
#define DSP_BLOCK_TOPK 3      /* top logits kept per slot for traces */

typedef enum dsp_block_layout { DSP_BLOCK_ZLAB = 0, DSP_BLOCK_DEEPSPEC, DSP_BLOCK_MODELOPT } dsp_block_layout;

/* The Markov head's variants (DeepSpec's markov_head_type): the W2 input u for slot k from
 * e = W1[previous token] and the slot's normed hidden h_k:
 *   VANILLA  u = e
 *   GATED    u = sigmoid(gate_proj [h_k ; e]) * e
 *   RNN      z = [s ; e ; h_k], (g, c, o) = joint_proj z, s' = sigmoid(g) s + (1 - sigmoid(g)) tanh(c),
 *            u = tanh(o); s starts at zero in each block */
enum { DSP_MARKOV_VANILLA = 0, DSP_MARKOV_GATED, DSP_MARKOV_RNN };
static inline const char *dsp_markov_type_name(int t) { return t == DSP_MARKOV_GATED ? "gated" : t == DSP_MARKOV_RNN ? "rnn" : "vanilla"; }

typedef struct dsp_block_info {
    const char *path;          /* the directory */
    dsp_block_layout layout;
    const char *layout_name;   /* "z-lab DFlash", "DeepSpec", "ModelOpt" */
    bool dspark;               /* has a Markov or confidence head (a DSpark drafter) */
    int block;                 /* B: query slots [anchor, mask x B-1] */
    int n_draft;               /* drafts per block: B - 1 (z-lab) or B (shifted) */
    int slot0;                 /* first slot that drafts: 1 (z-lab) or 0 (shifted) */
    int n_layers, n_embd, n_head, n_head_kv, head_dim, n_ff;
    int n_taps;
    int tap_layers[DSP_BLOCK_MAX_TAPS]; /* target layer whose output is tapped, in fc's order; -1: the embedding output */
    int32_t mask_token;
    int markov_rank;           /* 0: no Markov head */
    int markov_type;           /* DSP_MARKOV_*: how the bias W2 . u is made (DRAFTERS.md §2.6) */
    bool confidence;           /* confidence head present */
    bool conf_with_markov;     /* its features are [h ; W1[prev]] (else h) */
    bool shares_embd, shares_head; /* the target's tensors are used (none of its own, or an equal copy) */
    uint64_t n_params;         /* elements of the drafter's own tensors */
    uint32_t layer_type;       /* its layers' matrix type (after dsp_block_quantize) */
    /* after dsp_block_attach: the draft vocabulary (dsp_block_limits.n_vocab_draft) */
    int32_t draft_vocab;       /* tokens drafts are taken from: the target's n_vocab, or a subset's size */
    const char *draft_vocab_source; /* "full", "draft_vocab.json" (+ token id order), "token id order" */
} dsp_block_info;

typedef struct dsp_block_drafter dsp_block_drafter;

/* Load a drafter directory (config.json + safetensors; a repo id is looked up in the hub cache)
 * for `target` and check that they fit: hidden size, vocabulary, tap layers (inside the target
 * and not its last layer), mask token inside the vocabulary, num_target_layers, embedding/LM
 * head copies equal to the target's when both have the same type. A mismatch is an error that
 * says what differs. Host only: nothing runs until dsp_block_attach. */
dsp_status dsp_block_load(const char *path, const dsp_model *target, dsp_block_drafter **out);
/* Quantize the drafter's layer matrices to `type` (model/quantize.c's rules) before
 * dsp_block_attach; n_threads for the conversion. */
dsp_status dsp_block_quantize(dsp_block_drafter *d, uint32_t type, int n_threads);
void dsp_block_destroy(dsp_block_drafter *d);
const dsp_block_info *dsp_block_get_info(const dsp_block_drafter *d);

/* Backend resources: weights (the target's embedding / LM head bweights when shared: pass the
 * target forward's own, or NULL to create them again), buffers for max_ctx_rows context rows and
 * max_reqs requests per draft call, and a KV store of the pool's shape, registered with the pool for
 * copy-on-write. */
typedef struct dsp_block_limits {
    int max_ctx_rows;          /* rows of one target forward */
    int max_reqs;              /* requests drafted by one dsp_block_draft call */
    uint32_t n_ctx;            /* positions of one sequence */
    int32_t n_vocab_draft;     /* draft vocabulary: 0 or n_vocab = every token; 1..n_vocab-1 = a subset of
                                * that many tokens (below); negative or > n_vocab is an error */
} dsp_block_limits;
/* A reduced draft vocabulary (FR-Spec, EAGLE-3's draft vocab): the LM head (and the Markov head's
 * W2) run over the rows of N tokens only, gathered into copies at attach, and drafts are taken
 * from those N tokens; q (sampled drafts) is zero outside them, so verification stays exact. The N
 * tokens: the first N of `draft_vocab.json` in the drafter directory when present (a JSON list of
 * token ids, most frequent first, or {"token_ids": [...]}), the rest by ascending token id (for
 * byte-level BPE and SentencePiece vocabularies, id order is merge / score order, which roughly
 * follows frequency). The subset is kept in ascending id order, so argmax ties still go to the
 * lower id, and a draft equals the full-vocabulary draft whenever that one is inside the subset
 * (greedy; the Markov bias is per token, the same in both). The embedding, W1 and the confidence
 * head (fed [h ; W1[prev]], never logits) stay whole: any previous token can condition a slot. */
dsp_status dsp_block_attach(dsp_block_drafter *d, dsp_backend *be, dsp_kv_pool *pool, const dsp_bweight *target_embd,
                            const dsp_bweight *target_head, const dsp_block_limits *lim);

/* The context step, after a target forward of n rows (its batch: tokens, positions, sequence
 * indices into seqs) whose taps are in `taps`, (n, n_taps * n_embd) in tap_layers order: writes
 * the drafter's context K/V of every row. The rows' KV blocks must be reserved (the target's
 * forward did). */
dsp_status dsp_block_context(dsp_block_drafter *d, const dsp_buf *taps, int n, const int32_t *tokens, const int32_t *pos, const int32_t *seq,
                             int n_seqs, dsp_kv_seq *const *seqs);

/* One request's block. */
typedef struct dsp_block_req {
    /* in */
    dsp_kv_seq *kv;            /* the request's block table (the target's) */
    int32_t anchor;            /* the last committed token (its position is start) */
    uint32_t start;            /* = the sequence's committed KV length */
    int32_t n_slots;           /* block length, 1..B (B unless the context ends sooner) */
    int32_t n_want;            /* drafts to decode, 1..n_draft(n_slots): later slots are not computed */
    bool markov;               /* apply the Markov head (DSpark) */
    bool confidence;           /* compute the confidence logits */
    float stop_below;          /* confidence logit: stop at the first slot whose logit is below it (DeepSpec's
                                * per-slot rule with logit(tau)); -INFINITY = never */
    float temperature;         /* 0: argmax drafts; > 0: drafts sampled from softmax(z / T) */
    dsp_rng *rng;              /* sampling (temperature > 0) */
    float *q;                  /* (n_want, n_vocab): the distributions sampled from (temperature > 0) */
    bool top;                  /* record top-3 logits per slot (traces) */
    /* out */
    int32_t n_draft;           /* drafts produced: n_want, or fewer when stop_below truncated */
    int32_t draft[DSP_BLOCK_MAX];
    float conf[DSP_BLOCK_MAX];        /* confidence logits, slot order (when confidence) */
    int32_t top_ids[DSP_BLOCK_MAX][DSP_BLOCK_TOPK]; /* top-3 of each draft's logits (when top) */
    float top_vals[DSP_BLOCK_MAX][DSP_BLOCK_TOPK];
} dsp_block_req;

/* Drafts for n requests (n <= max_reqs): one block forward over all of them, then the per-slot
 * Markov steps (one small forward per slot for all requests). Reserves and makes writable the
 * KV blocks of positions [start, start + n_slots) in each request's table. */
dsp_status dsp_block_draft(dsp_block_drafter *d, dsp_block_req *reqs, int n);

/* drafts a block of n_slots query slots yields */
static inline int dsp_block_n_draft(const dsp_block_info *in, int n_slots) { return n_slots - in->slot0; }

#endif
