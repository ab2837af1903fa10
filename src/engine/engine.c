/* engine/engine: the request scheduler and the round loop (DESIGN.md §1; see engine.h).
 *
 * A round: cancel what was cancelled, admit waiting requests (FIFO, within --max-batch and the KV
 * promise), lay out one ragged batch — every decoding request's [last token, drafts...] block
 * first, then prefill chunks in admission order within the round's token budget — run the target
 * once, then per request: verify (or sample the first token after its prefill), emit, roll the KV
 * back to what was committed, publish full blocks to the prefix cache, tell the drafter.
 *
 * Everything a round needs is allocated when the engine is created (batch layout, logits rows,
 * sampler scratch) or when a request is submitted (its token list, event buffers, stop matcher,
 * drafter); a round itself allocates only when the event array must grow. */
#include "engine/engine.h"

#include "core/file.h"
#include "core/log.h"
#include "core/threads.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void *alloc64(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64)) return NULL;
    return p;
}

/* ---- parameters --------------------------------------------------------------------------- */

dsp_gen_params dsp_gen_default_params(void) {
    dsp_gen_params p;
    memset(&p, 0, sizeof p);
    p.max_tokens = 256;
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    p.repetition_last_n = 64;
    p.logprobs = -1;
    p.mode = DSP_SPEC_BASELINE;
    p.max_draft = 4;
    p.lookup_min_n = 2;
    p.lookup_max_n = 4;
    p.hybrid_min = 4;
    p.draft_sample = true;
    return p;
}

dsp_engine_params dsp_engine_default_params(void) {
    dsp_engine_params p;
    memset(&p, 0, sizeof p);
    return p;
}

const char *dsp_device_to_string(dsp_device d) {
    switch (d) {
    case DSP_DEVICE_AUTO: return "auto";
    case DSP_DEVICE_CPU: return "cpu";
    case DSP_DEVICE_CUDA: return "cuda";
    }
    return "unknown";
}

const char *dsp_kv_type_to_string(dsp_kv_type t) {
    switch (t) {
    case DSP_KV_DEFAULT: return "default";
    case DSP_KV_F16: return "f16";
    case DSP_KV_BF16: return "bf16";
    case DSP_KV_F32: return "f32";
    }
    return "unknown";
}
static const char *const g_mode_names[] = {"baseline", "lookup", "auto", "dflash", "dspark", "hybrid"};

const char *dsp_precision_to_string(dsp_precision p) { return p == DSP_PRECISION_F32 ? "f32" : "q8"; }

bool dsp_draft_quant_parse(const char *s, dsp_draft_quant *out) {
    if (!strcmp(s, "q4_0")) *out = DSP_DRAFT_QUANT_Q4_0;
    else if (!strcmp(s, "q8_0")) *out = DSP_DRAFT_QUANT_Q8_0;
    else return false;
    return true;
}

const char *dsp_spec_mode_to_string(dsp_spec_mode m) {
    return (unsigned)m < sizeof g_mode_names / sizeof g_mode_names[0] ? g_mode_names[m] : "unknown";
}

bool dsp_spec_mode_from_string(const char *s, dsp_spec_mode *out) {
    for (size_t i = 0; i < sizeof g_mode_names / sizeof g_mode_names[0]; i++)
        if (!strcmp(s, g_mode_names[i])) {
            *out = (dsp_spec_mode)i;
            return true;
        }
    return false;
}

const char *dsp_finish_to_string(dsp_finish f) {
    switch (f) {
    case DSP_FINISH_STOP: return "stop";
    case DSP_FINISH_LENGTH: return "length";
    case DSP_FINISH_CANCELLED: return "cancelled";
    default: return "none";
    }
}

bool dsp_engine_is_eog(const dsp_model *m, int32_t tok) {
    for (int i = 0; i < m->n_eog; i++)
        if (m->eog[i] == tok) return true;
    return false;
}

static dsp_status validate_gen(const dsp_engine *e, const dsp_gen_params *p, dsp_sample_params *sp) {
    if (p->max_tokens <= 0) return dsp_error(DSP_ERR_INVALID_ARG, "max_tokens must be positive (got %d)", p->max_tokens);
    if (p->logprobs < -1 || p->logprobs > DSP_MAX_LOGPROBS)
        return dsp_error(DSP_ERR_INVALID_ARG, "top_logprobs must be between 0 and %d (got %d)", DSP_MAX_LOGPROBS, p->logprobs);
    if ((unsigned)p->mode > DSP_SPEC_HYBRID) return dsp_error(DSP_ERR_INVALID_ARG, "mode: unknown speculation mode %d", (int)p->mode);
    if (p->max_draft != DSP_DRAFT_AUTO && (p->max_draft < 1 || p->max_draft > DSP_MAX_DRAFT))
        return dsp_error(DSP_ERR_INVALID_ARG, "max_draft must be between 1 and %d, or auto (got %d)", DSP_MAX_DRAFT, p->max_draft);
    if (!(p->dspark_threshold >= 0 && p->dspark_threshold <= 1))
        return dsp_error(DSP_ERR_INVALID_ARG, "dspark_threshold must be in [0, 1] (got %g)", (double)p->dspark_threshold);
    if (!(p->dspark_cumulative >= 0 && p->dspark_cumulative <= 1))
        return dsp_error(DSP_ERR_INVALID_ARG, "dspark_cumulative must be in [0, 1] (got %g)", (double)p->dspark_cumulative);
    if (p->hybrid_min < 1 || p->hybrid_min > 32)
        return dsp_error(DSP_ERR_INVALID_ARG, "hybrid_min must be between 1 and 32 (got %d)", p->hybrid_min);
    if (p->lookup_min_n < 1 || p->lookup_max_n < p->lookup_min_n || p->lookup_max_n > 16)
        return dsp_error(DSP_ERR_INVALID_ARG, "lookup n-gram sizes: need 1 <= lookup_min_n (%d) <= lookup_max_n (%d) <= 16", p->lookup_min_n,
                         p->lookup_max_n);
    *sp = dsp_sample_params_default();
    sp->temperature = p->temperature;
    sp->top_k = p->top_k;
    sp->top_p = p->top_p;
    sp->min_p = p->min_p;
    sp->presence_penalty = p->presence_penalty;
    sp->frequency_penalty = p->frequency_penalty;
    sp->repetition_penalty = p->repetition_penalty;
    sp->repetition_last_n = p->repetition_last_n;
    _Static_assert(sizeof(dsp_logit_bias) == sizeof(dsp_sample_bias), "logit bias layouts must match");
    sp->logit_bias = (const dsp_sample_bias *)p->logit_bias;
    sp->n_logit_bias = p->n_logit_bias;
    return dsp_sample_params_validate(sp, e->n_vocab);
}

/* ---- the engine --------------------------------------------------------------------------- */

static uint64_t physical_memory(void) {
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize : 0;
}

void dsp_engine_destroy(dsp_engine *e);

dsp_status dsp_engine_create(dsp_model *m, const dsp_engine_params *pp, dsp_engine **out) {
    *out = NULL;
    dsp_engine_params p = pp ? *pp : dsp_engine_default_params();
    if (!m->tok) return dsp_error(DSP_ERR_UNSUPPORTED, "%s: the model has no tokenizer", m->path);
    if (!m->has_weights) return dsp_error(DSP_ERR_INVALID_ARG, "%s: the model was loaded vocab-only", m->path);
    if (p.max_batch < 0 || p.max_batch > 1024) return dsp_error(DSP_ERR_INVALID_ARG, "max_batch must be between 1 and 1024 (got %d)", p.max_batch);
    if (p.batch_tokens < 0 || p.batch_tokens > 65536)
        return dsp_error(DSP_ERR_INVALID_ARG, "batch_tokens must be between 1 and 65536 (got %d)", p.batch_tokens);
    if (p.device != DSP_DEVICE_AUTO && p.device != DSP_DEVICE_CPU && p.device != DSP_DEVICE_CUDA)
        return dsp_error(DSP_ERR_INVALID_ARG, "unknown device %d", (int)p.device);
    if (p.kv_type != DSP_KV_DEFAULT && p.kv_type != DSP_KV_F16 && p.kv_type != DSP_KV_BF16 && p.kv_type != DSP_KV_F32)
        return dsp_error(DSP_ERR_INVALID_ARG, "unknown KV cache type %d", (int)p.kv_type);
    if (p.draft_quant != DSP_DRAFT_QUANT_DEFAULT && p.draft_quant != DSP_DRAFT_QUANT_Q8_0 && p.draft_quant != DSP_DRAFT_QUANT_Q4_0)
        return dsp_error(DSP_ERR_INVALID_ARG, "unknown drafter quantization %d", (int)p.draft_quant);
    if (p.device == DSP_DEVICE_AUTO) { /* the GPU when there is one and the model fits, else the CPU */
        if (dsp_backend_auto_kind() == DSP_BACKEND_CUDA) {
            dsp_engine_params q = p;
            q.device = DSP_DEVICE_CUDA;
            dsp_status st = dsp_engine_create(m, &q, out);
            if (st == DSP_OK || getenv("DSPARK_DEVICE")) return st; /* DSPARK_DEVICE=cuda: the GPU or an error */
            DSP_LOGW("the GPU cannot run %s (%s): running on the CPU", m->path, dsp_last_error());
        }
        p.device = DSP_DEVICE_CPU;
    }
    if (p.prefill_itl != 0 && !(p.prefill_itl >= 1 && p.prefill_itl <= 100))
        return dsp_error(DSP_ERR_INVALID_ARG, "prefill_itl must be between 1 and 100 (got %g)", (double)p.prefill_itl);
    if (p.max_batch == 0) p.max_batch = 8;
    if (p.batch_tokens == 0) p.batch_tokens = 512;
    if (p.max_batch > p.batch_tokens)
        return dsp_error(DSP_ERR_INVALID_ARG, "max_batch (%d) cannot exceed batch_tokens (%d): every running request needs a row per round",
                         p.max_batch, p.batch_tokens);
    dsp_engine *e = calloc(1, sizeof *e);
    if (!e) return dsp_error(DSP_ERR_NOMEM, "no memory");
    e->m = m;
    e->verify = dsp_spec_verify;
    e->max_batch = p.max_batch;
    e->itl_factor = p.prefill_itl > 0 ? p.prefill_itl : DSP_ENGINE_ITL_FACTOR;
    e->next_id = 1;
    _Static_assert((int)DSP_DEVICE_CPU == (int)DSP_BACKEND_CPU && (int)DSP_DEVICE_CUDA == (int)DSP_BACKEND_CUDA, "device = backend kind");
    dsp_backend_params bp = {.kind = (dsp_backend_kind)p.device, .n_threads = p.n_threads, .gpu = p.gpu, .progress = p.progress,
                             .kv_type = p.kv_type == DSP_KV_F16    ? DSP_F16
                                        : p.kv_type == DSP_KV_BF16 ? DSP_BF16
                                        : p.kv_type == DSP_KV_F32  ? DSP_F32
                                                                   : DSP_F16, /* the default, on either backend */
                             .f32_activations = p.precision == DSP_PRECISION_F32,
                             .reserve = p.reserve_memory};
    dsp_status st = dsp_backend_create(&bp, &e->be);
    if (st) {
        free(e);
        return st;
    }
    /* the block drafter's host side first: its K/V share the pool */
    if (p.draft_model && (st = dsp_block_load(p.draft_model, m, &e->bd))) {
        dsp_backend_destroy(e->be);
        free(e);
        return st;
    }
    /* A float drafter next to a quantized target, on the CPU with 8-bit activations: its layer
     * matrices become Q4_0 (or Q8_0) and run on the same integer kernels as the target's (README
     * "Block drafters on the CPU": the draft step is bound by the stream of its weights) */
    const dsp_tensor *tdown = m->w.layers[0].ffn_down;
    if (e->bd && e->be->kind == DSP_BACKEND_CPU && p.precision != DSP_PRECISION_F32 && tdown && dsp_dtype_get(tdown->type)->block_elems > 1) {
        const uint32_t qt = p.draft_quant == DSP_DRAFT_QUANT_Q8_0 ? DSP_Q8_0 : DSP_Q4_0;
        if ((st = dsp_block_quantize(e->bd, qt, p.n_threads))) {
            dsp_block_destroy(e->bd);
            dsp_backend_destroy(e->be);
            free(e);
            return st;
        }
        DSP_LOGI("block drafter: its float matrices quantized to %s for the CPU's 8-bit kernels (--draft-quant q8_0|q4_0; --precision f32 keeps them)",
                 dsp_dtype_name(qt));
    }
    if (e->bd) e->bdi = dsp_block_get_info(e->bd);
    /* context and KV pool (the GPU stores K/V in 16 bits) */
    const dsp_hparams *hp = &m->hp;
    uint32_t n_ctx = p.n_ctx ? p.n_ctx : (uint32_t)(hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096);
    const bool kv16 = p.kv_type != DSP_KV_F32;
    const uint64_t kv_elem = e->be->kind == DSP_BACKEND_CPU && !kv16 ? sizeof(float) : 2;
    uint64_t per_token = 2ull * (uint64_t)hp->n_layer * (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim * kv_elem;
    per_token += dsp_engine_draft_kv_bytes(e->bd, kv_elem);
    uint64_t kv_tokens = p.kv_tokens;
    if (!kv_tokens && p.kv_memory) kv_tokens = p.kv_memory / per_token;
    if (!kv_tokens) {
        kv_tokens = (uint64_t)p.max_batch * n_ctx;
        uint64_t quarter = physical_memory() / 4 / per_token;
        if (quarter && kv_tokens > quarter) kv_tokens = quarter;
        if (kv_tokens < n_ctx) kv_tokens = n_ctx;
    }
    if (kv_tokens < 16)
        st = dsp_error(DSP_ERR_INVALID_ARG, "the KV cache must hold at least 16 tokens (kv_memory %llu bytes is %llu tokens of %llu bytes)",
                       (unsigned long long)p.kv_memory, (unsigned long long)kv_tokens, (unsigned long long)per_token);
    else if (kv_tokens > (1ull << 31))
        st = dsp_error(DSP_ERR_INVALID_ARG, "KV cache of %llu tokens is too large", (unsigned long long)kv_tokens);
    e->batch_tokens = p.batch_tokens;
    /* logits rows: every running request's verify block, or a prefill's last row */
    e->max_rows = p.max_batch * (1 + 8);
    if (e->max_rows < 1 + DSP_MAX_DRAFT) e->max_rows = 1 + DSP_MAX_DRAFT;
    if (e->max_rows > p.batch_tokens) e->max_rows = p.batch_tokens;
    if (!st) {
        dsp_fwd_params fp = dsp_fwd_default_params();
        fp.backend = e->be;
        fp.max_batch_tokens = p.batch_tokens;
        fp.max_logits = e->max_rows;
        fp.max_taps = e->bd ? e->bdi->n_taps : 8; /* 8: tests' drafters that want host taps */
        fp.n_ctx = n_ctx;
        fp.kv_tokens = (uint32_t)kv_tokens;
        fp.prefix_cache = !p.no_prefix_cache;
        st = dsp_fwd_create(m, &fp, &e->fwd);
    }
    if (st) {
        dsp_engine_destroy(e);
        return st;
    }
    e->kv = dsp_fwd_kv(e->fwd);
    e->n_ctx = dsp_fwd_n_ctx(e->fwd);
    e->n_vocab = dsp_fwd_n_vocab(e->fwd);
    e->n_embd = dsp_fwd_n_embd(e->fwd);
    if ((size_t)e->n_vocab != dsp_tok_n_vocab(m->tok)) {
        st = dsp_error(DSP_ERR_FORMAT, "%s: tokenizer has %zu tokens but the output layer has %d", m->path, dsp_tok_n_vocab(m->tok), e->n_vocab);
        dsp_engine_destroy(e);
        return st;
    }
    size_t sbytes = dsp_sample_scratch_bytes(e->n_vocab), dbytes = dsp_sample_dist_bytes(e->n_vocab), T = (size_t)e->batch_tokens;
    e->logits = alloc64(sizeof(float) * (size_t)e->n_vocab * (size_t)e->max_rows);
    e->argmax = dsp_fwd_has_argmax(e->fwd) ? alloc64(sizeof(int32_t) * (size_t)e->max_rows) : NULL;
    e->scratch_mem = alloc64(sbytes);
    e->dist_mem = alloc64(dbytes);
    e->running = calloc((size_t)e->max_batch, sizeof *e->running);
    e->bseqs = calloc((size_t)e->max_batch, sizeof *e->bseqs);
    e->btok = malloc(T * sizeof(int32_t));
    e->bpos = malloc(T * sizeof(int32_t));
    e->bseq = malloc(T * sizeof(int32_t));
    e->brow = malloc(T * sizeof(int32_t));
    e->creqs = malloc((size_t)e->max_batch * sizeof *e->creqs);
    e->ev_cap = (size_t)e->max_batch * (DSP_MAX_DRAFT + 2) + 16;
    e->ev = malloc(e->ev_cap * sizeof *e->ev);
    e->done_cap = (size_t)e->max_batch + 16;
    e->done = malloc(e->done_cap * sizeof *e->done);
    if (!e->logits || (dsp_fwd_has_argmax(e->fwd) && !e->argmax) || !e->scratch_mem || !e->dist_mem || !e->running || !e->bseqs || !e->btok || !e->bpos || !e->bseq || !e->brow || !e->ev ||
        !e->done || !e->creqs ||
        (p.reserve_memory && (!dsp_mem_populate(e->logits, sizeof(float) * (size_t)e->n_vocab * (size_t)e->max_rows) ||
                              !dsp_mem_populate(e->scratch_mem, sbytes) || !dsp_mem_populate(e->dist_mem, dbytes)))) {
        dsp_engine_destroy(e);
        return dsp_error(DSP_ERR_NOMEM, "no memory for the engine (vocabulary %d, %d logits rows)", e->n_vocab, e->max_rows);
    }
    if (e->bd && (st = dsp_engine_draft_init(e, p.draft_model, p.draft_vocab))) {
        dsp_engine_destroy(e);
        return st;
    }
    dsp_sample_scratch_init(&e->scratch, e->scratch_mem, sbytes, e->n_vocab);
    dsp_sample_dist_init(&e->dist, e->dist_mem, dbytes, e->n_vocab);
    /* verification on the host threads (verify_all): the CPU backend's pool, else the engine's own */
    e->host_pool = e->be->host_pool;
    if (!e->host_pool) {
        if (dsp_pool_create(p.n_threads > 0 ? p.n_threads : dsp_physical_cores(), &e->own_pool)) dsp_error_clear(); /* serial then */
        e->host_pool = e->own_pool;
    }
    const int nvt = e->host_pool ? dsp_pool_size(e->host_pool) : 0;
    if (nvt > 1 && e->max_batch > 1) {
        e->vmem = calloc(2 * (size_t)nvt, sizeof *e->vmem);
        e->vs = calloc((size_t)nvt, sizeof *e->vs);
        e->vd = calloc((size_t)nvt, sizeof *e->vd);
        e->vreqs = calloc((size_t)e->max_batch, sizeof *e->vreqs);
        bool ok = e->vmem && e->vs && e->vd && e->vreqs;
        for (int t = 0; t < nvt && ok; t++) {
            ok = (e->vmem[2 * t] = alloc64(sbytes)) && (e->vmem[2 * t + 1] = alloc64(dbytes));
            ok = ok && (!p.reserve_memory || (dsp_mem_populate(e->vmem[2 * t], sbytes) && dsp_mem_populate(e->vmem[2 * t + 1], dbytes)));
            if (ok) dsp_sample_scratch_init(&e->vs[t], e->vmem[2 * t], sbytes, e->n_vocab), dsp_sample_dist_init(&e->vd[t], e->vmem[2 * t + 1], dbytes, e->n_vocab);
        }
        e->n_vt = nvt; /* (freed with the engine either way) */
        if (!ok) {
            dsp_engine_destroy(e);
            return dsp_error(DSP_ERR_NOMEM, "no memory for the engine's %d sampler scratches (vocabulary %d)", nvt, e->n_vocab);
        }
    }
    e->st.kv_blocks = e->kv->n_blocks;
    e->st.block_tokens = (uint32_t)e->kv->block_tokens;
    e->st.kv_bytes = (uint64_t)e->st.kv_blocks * e->st.block_tokens * per_token;
    *out = e;
    return DSP_OK;
}

uint32_t dsp_engine_n_ctx(const dsp_engine *e) { return e->n_ctx; }
const char *dsp_engine_backend(const dsp_engine *e) { return e->be->desc; }

/* ---- requests ----------------------------------------------------------------------------- */

/* r's whole committed blocks into the prefix cache (not after it gave up the block drafter: see
 * give_up_block in draft.c) */
static void publish(dsp_engine *e, dsp_req *r, uint32_t committed) {
    if (!r->ctx_dropped) dsp_kv_seq_publish(e->kv, &r->kv, r->tokens, dsp_engine_ctx_len(r, committed));
}

static void req_free(dsp_engine *e, dsp_req *r) {
    if (!r) return;
    dsp_kv_seq_free(e->kv, &r->kv);
    free(r->tokens);
    for (int i = 0; i < DSP_MAX_STOP; i++) free(r->stop_copy[i]);
    free(r->bias_copy);
    dsp_stop_free(&r->stop);
    dsp_detok_stream_destroy(r->detok);
    if (r->own_drafter) dsp_drafter_destroy(r->drafter);
    if (r->ctx_taps) e->be->ops->buf_destroy(e->be, r->ctx_taps);
    free(r->q);
    free(r->evtext);
    free(r->evtop);
    free(r);
}

void dsp_engine_destroy(dsp_engine *e) {
    if (!e) return;
    for (size_t i = 0; i < e->n_done; i++) req_free(e, e->done[i]);
    for (int i = 0; i < e->n_running; i++) req_free(e, e->running[i]);
    for (dsp_req *r = e->wait_head, *n; r; r = n) {
        n = r->next;
        req_free(e, r);
    }
    dsp_block_destroy(e->bd); /* before the pool it registered its store with */
    if (e->ctx_stage) e->be->ops->buf_destroy(e->be, e->ctx_stage);
    free(e->ctx_tok), free(e->ctx_seqs), free(e->ctx_reqs);
    free(e->breqs);
    free(e->creqs);
    dsp_fwd_destroy(e->fwd);
    dsp_backend_destroy(e->be);
    free(e->logits), free(e->argmax), free(e->taps), free(e->scratch_mem), free(e->dist_mem);
    for (int t = 0; e->vmem && t < 2 * e->n_vt; t++) free(e->vmem[t]);
    free(e->vmem), free(e->vs), free(e->vd), free(e->vreqs);
    if (e->own_pool) dsp_pool_destroy(e->own_pool);
    free(e->running), free(e->bseqs), free(e->btok), free(e->bpos), free(e->bseq), free(e->brow);
    free(e->ev), free(e->done);
    free(e);
}

static uint32_t blocks_for(const dsp_engine *e, uint64_t tokens) {
    uint64_t bt = (uint64_t)e->kv->block_tokens;
    return (uint32_t)((tokens + bt - 1) / bt);
}

dsp_status dsp_engine_submit_drafter(dsp_engine *e, const int32_t *prompt, size_t n_prompt, const dsp_gen_params *pp, dsp_drafter *drafter,
                                     void *user, dsp_req_id *id) {
    if (id) *id = 0;
    dsp_gen_params defaults = dsp_gen_default_params();
    const dsp_gen_params *p = pp ? pp : &defaults;
    dsp_sample_params sp;
    dsp_status st = validate_gen(e, p, &sp);
    if (st) return st;
    if (n_prompt == 0) return dsp_error(DSP_ERR_INVALID_ARG, "the prompt is empty");
    if (n_prompt >= e->n_ctx)
        return dsp_error(DSP_ERR_RANGE, "the prompt is %zu tokens, which does not fit the context of %u tokens (room is needed for at least one new token)",
                         n_prompt, e->n_ctx);
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= e->n_vocab)
            return dsp_error(DSP_ERR_INVALID_ARG, "prompt token %zu: id %d out of range (vocabulary %d)", i, prompt[i], e->n_vocab);
    /* a block drafter writes its block's K/V up to B positions past the committed length */
    dsp_spec_mode mode = dsp_engine_resolve_mode(e, p->mode);
    bool block = e->bd && !drafter && (mode == DSP_SPEC_DFLASH || mode == DSP_SPEC_DSPARK || mode == DSP_SPEC_HYBRID);
    uint64_t need_tokens = (uint64_t)n_prompt + (uint64_t)p->max_tokens + (block ? (uint64_t)e->bdi->block : 0);
    if (need_tokens > e->n_ctx) need_tokens = e->n_ctx;
    uint32_t need = blocks_for(e, need_tokens);
    if (need > e->kv->n_blocks)
        return dsp_error(DSP_ERR_RANGE, "the request needs KV cache for %llu tokens (prompt %zu + max_tokens %d), but the whole cache holds %u tokens",
                         (unsigned long long)need_tokens, n_prompt, p->max_tokens, e->kv->n_blocks * (uint32_t)e->kv->block_tokens);
    dsp_req *r = calloc(1, sizeof *r);
    if (!r) return dsp_error(DSP_ERR_NOMEM, "no memory");
    r->p = *p;
    r->sp = sp;
    r->user = user;
    r->need_blocks = need;
    r->n_prompt = (uint32_t)n_prompt;
    r->n_tokens = (uint32_t)n_prompt;
    /* own copies of what p points to */
    for (int i = 0; i < DSP_MAX_STOP && p->stop[i]; i++) {
        r->stop_copy[i] = strdup(p->stop[i]);
        if (!r->stop_copy[i]) st = dsp_error(DSP_ERR_NOMEM, "no memory");
        r->p.stop[i] = r->stop_copy[i];
    }
    if (p->n_logit_bias) {
        r->bias_copy = malloc(p->n_logit_bias * sizeof *r->bias_copy);
        if (!r->bias_copy) st = dsp_error(DSP_ERR_NOMEM, "no memory");
        else memcpy(r->bias_copy, p->logit_bias, p->n_logit_bias * sizeof *r->bias_copy);
        r->p.logit_bias = r->bias_copy;
        r->sp.logit_bias = (const dsp_sample_bias *)r->bias_copy;
    }
    int n_stop = 0;
    while (n_stop < DSP_MAX_STOP && r->p.stop[n_stop]) n_stop++;
    r->tokens = malloc(sizeof(int32_t) * e->n_ctx);
    if (!st && !r->tokens) st = dsp_error(DSP_ERR_NOMEM, "no memory");
    if (!st) st = dsp_stop_init(&r->stop, r->p.stop, n_stop);
    /* speculation */
    if (!st) st = dsp_engine_draft_setup(e, r, drafter);
    /* only requests that may draft with the block drafter have its context computed (the engine
     * skips it in rounds without one), so their cached prefix blocks, which hold the drafter's K/V
     * too, are keyed apart from the others' */
    if (!st) st = dsp_kv_seq_init(&r->kv, e->n_ctx, e->kv->block_tokens, dsp_engine_block_ctx(r) ? DSP_KV_SALT_BLOCK_CTX : 0);
    if (!st) st = dsp_detok_stream_create(e->m->tok, DSP_DETOKENIZE_SKIP_SPECIAL, &r->detok);
    if (!st) {
        r->out_cap = 2 * (3 * dsp_tok_max_piece_len(e->m->tok) + 8) + r->stop.cap;
        r->evtext_cap = (size_t)(DSP_MAX_DRAFT + 1) * r->out_cap;
        r->evtext = malloc(r->evtext_cap);
        r->evtop = p->logprobs > 0 ? malloc(sizeof *r->evtop * (DSP_MAX_DRAFT + 1) * (size_t)p->logprobs) : NULL;
        if (!r->evtext || (p->logprobs > 0 && !r->evtop)) st = dsp_error(DSP_ERR_NOMEM, "no memory");
    }
    if (st) {
        req_free(e, r);
        return st;
    }
    memcpy(r->tokens, prompt, n_prompt * sizeof *prompt);
    dsp_rng_seed(&r->rng, p->seed);
    r->id = e->next_id++;
    r->t_submit = now_ms();
    r->state = DSP_REQ_WAITING;
    if (e->wait_tail) e->wait_tail->next = r;
    else e->wait_head = r;
    e->wait_tail = r;
    e->n_waiting++;
    e->st.requests++;
    if (id) *id = r->id;
    return DSP_OK;
}

dsp_status dsp_engine_submit(dsp_engine *e, const int32_t *prompt, size_t n_prompt, const dsp_gen_params *p, void *user, dsp_req_id *id) {
    return dsp_engine_submit_drafter(e, prompt, n_prompt, p, NULL, user, id);
}

void dsp_engine_cancel(dsp_engine *e, dsp_req_id id) {
    for (dsp_req *r = e->wait_head; r; r = r->next)
        if (r->id == id) r->cancel = true;
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i]->id == id) e->running[i]->cancel = true;
}

bool dsp_engine_idle(const dsp_engine *e) { return e->n_running == 0 && e->n_waiting == 0; }

void dsp_engine_get_stats(const dsp_engine *e, dsp_engine_stats *st) {
    *st = e->st;
    st->waiting = e->n_waiting;
    st->running = (uint32_t)e->n_running;
    st->kv_blocks_used = dsp_kv_pool_used(e->kv);
    st->kv_blocks_cached = e->kv->n_cached;
    st->evicted_blocks = e->kv->n_evicted;
    _Static_assert(sizeof st->cost_scale / sizeof st->cost_scale[0] == DSP_ROUND_KINDS, "one cost_scale per dsp_round_kind");
    for (int k = 0; k < DSP_ROUND_KINDS; k++) st->cost_scale[k] = dsp_engine_cost_scale(e, (dsp_round_kind)k);
}

void dsp_engine_clear_cache(dsp_engine *e) { dsp_kv_pool_clear_cache(e->kv); }

/* ---- events ------------------------------------------------------------------------------- */

static dsp_event *push_event(dsp_engine *e) {
    if (e->n_ev == e->ev_cap) {
        size_t cap = e->ev_cap * 2;
        dsp_event *ev = realloc(e->ev, cap * sizeof *ev);
        if (!ev) return NULL;
        e->ev = ev, e->ev_cap = cap;
    }
    dsp_event *ev = &e->ev[e->n_ev++];
    memset(ev, 0, sizeof *ev);
    return ev;
}

/* End a request: its DONE event, and it joins the list freed at the start of the next step. */
static void finish(dsp_engine *e, dsp_req *r, dsp_finish fin, dsp_status status) {
    if (r->state != DSP_REQ_WAITING) {
        /* publish what is committed (the KV of the last emitted token is never written) */
        uint32_t committed = r->kv.n_tokens < r->n_tokens ? r->kv.n_tokens : r->n_tokens;
        if (status == DSP_OK) publish(e, r, committed);
        r->res.decode_ms = r->t_first > 0 ? now_ms() - r->t_first : 0;
    }
    r->res.finish = fin;
    dsp_kv_seq_free(e->kv, &r->kv); /* blocks go to the prefix cache */
    if (e->n_done == e->done_cap) {
        size_t cap = e->done_cap * 2;
        dsp_req **d = realloc(e->done, cap * sizeof *d);
        if (d) e->done = d, e->done_cap = cap;
    }
    if (e->n_done < e->done_cap) e->done[e->n_done++] = r;
    dsp_event *ev = push_event(e);
    if (!ev) return; /* no memory for the event: the request still ends */
    ev->type = DSP_EVENT_DONE;
    ev->id = r->id;
    ev->user = r->user;
    ev->status = status;
    ev->error = status ? r->error : NULL;
    ev->res = &r->res;
}

static void fail(dsp_engine *e, dsp_req *r, dsp_status st) {
    snprintf(r->error, sizeof r->error, "%s", dsp_last_error());
    finish(e, r, DSP_FINISH_NONE, st);
}

static void out_append(dsp_req *r, char *out, size_t *n_out, const char *p, size_t n) {
    if (n > r->out_cap - *n_out) n = r->out_cap - *n_out; /* cannot happen: out is sized for the worst case */
    memcpy(out + *n_out, p, n);
    *n_out += n;
}

/* Pass text through the stop matcher; true if a stop string was hit. */
static bool out_text(dsp_req *r, char *out, size_t *n_out, const char *text, size_t n) {
    const char *em;
    size_t ne;
    bool hit = dsp_stop_feed(&r->stop, text, n, &em, &ne);
    out_append(r, out, n_out, em, ne);
    return hit;
}

/* Decide what one sampled token emits and whether generation ends there. */
static dsp_finish emit_token(dsp_engine *e, dsp_req *r, int32_t tok, const float *raw_logits) {
    dsp_event *ev = push_event(e);
    char *out = r->evtext + r->evtext_used;
    size_t n_out = 0;
    dsp_token_event te;
    memset(&te, 0, sizeof te);
    te.token = tok;
    if (r->p.logprobs >= 0) {
        dsp_sample_logprob ch, tp[DSP_MAX_LOGPROBS];
        int32_t n_top = 0;
        if (dsp_sample_logprobs(raw_logits, e->n_vocab, NULL, DSP_SAMPLE_LOGPROBS_RAW, tok, r->p.logprobs, &ch, tp, &n_top) == DSP_OK) {
            te.chosen.token = ch.token;
            te.chosen.logprob = ch.logprob;
            size_t slot = r->evtext_used / r->out_cap; /* this token's index within the round */
            dsp_token_logprob *dst = r->evtop ? r->evtop + slot * (size_t)r->p.logprobs : NULL;
            for (int i = 0; i < n_top && dst; i++) dst[i].token = tp[i].token, dst[i].logprob = tp[i].logprob;
            te.n_top = dst ? n_top : 0;
            te.top = dst;
        }
    }
    bool eog = !r->p.ignore_eos && dsp_engine_is_eog(e->m, tok);
    dsp_finish fin = DSP_FINISH_NONE;
    if (eog) fin = DSP_FINISH_STOP;
    else if (r->res.n_generated >= (size_t)r->p.max_tokens) fin = DSP_FINISH_LENGTH;
    else if (r->n_tokens >= e->n_ctx) fin = DSP_FINISH_LENGTH; /* the last token is never fed */
    const char *text;
    size_t n_text;
    bool hit = false;
    if (!eog && dsp_detok_stream_feed(r->detok, tok, &text, &n_text) == DSP_OK) hit = out_text(r, out, &n_out, text, n_text);
    if (!hit && fin != DSP_FINISH_NONE) { /* the end: a trailing incomplete character becomes U+FFFD */
        if (dsp_detok_stream_flush(r->detok, &text, &n_text) == DSP_OK) hit = out_text(r, out, &n_out, text, n_text);
        if (!hit) {
            dsp_stop_flush(&r->stop, &text, &n_text);
            out_append(r, out, &n_out, text, n_text);
        }
    }
    if (hit) fin = DSP_FINISH_STOP;
    te.text = out;
    te.text_len = n_out;
    r->evtext_used += r->out_cap;
    if (ev) {
        ev->type = DSP_EVENT_TOKEN;
        ev->id = r->id;
        ev->user = r->user;
        ev->tok = te;
    }
    e->st.generated_tokens++;
    return fin;
}

/* ---- the round ---------------------------------------------------------------------------- */

static uint32_t promised_blocks(const dsp_engine *e) {
    uint32_t sum = 0;
    for (int i = 0; i < e->n_running; i++) {
        const dsp_req *r = e->running[i];
        if (r->need_blocks > r->kv.n_blocks) sum += r->need_blocks - r->kv.n_blocks;
    }
    return sum;
}

/* Admit waiting requests in order while there is a slot and their KV promise can be kept. */
static void admit(dsp_engine *e) {
    while (e->wait_head && e->n_running < e->max_batch) {
        dsp_req *r = e->wait_head;
        uint32_t others = promised_blocks(e);
        uint32_t attached = dsp_kv_seq_attach_prefix(e->kv, &r->kv, r->tokens, r->n_prompt - 1);
        uint32_t avail = dsp_kv_pool_available(e->kv), want = r->need_blocks - r->kv.n_blocks;
        if (avail < others || avail - others < want) {
            dsp_kv_seq_truncate(e->kv, &r->kv, 0); /* detach; try again when something finishes */
            break;
        }
        e->wait_head = r->next;
        if (!e->wait_head) e->wait_tail = NULL;
        r->next = NULL;
        e->n_waiting--;
        r->state = DSP_REQ_PREFILL;
        r->t_admit = now_ms();
        r->res.n_prompt = r->n_prompt;
        r->res.n_cached = attached;
        e->st.prompt_tokens += r->n_prompt;
        e->st.cached_tokens += attached;
        e->running[e->n_running++] = r;
    }
}

/* ---- the round cost model ------------------------------------------------------------------- */

static void fit_round(dsp_engine *e, int rows, double ms) {
    const double keep = 0.98; /* about the last 50 rounds */
    e->fit_w = keep * e->fit_w + 1;
    e->fit_x = keep * e->fit_x + rows;
    e->fit_y = keep * e->fit_y + ms;
    e->fit_xx = keep * e->fit_xx + (double)rows * rows;
    e->fit_xy = keep * e->fit_xy + (double)rows * ms;
}

/* Rows a round with `decode_rows` decoding rows may take in total, prefill included; the first
 * prefill waiting is at position `pos`. With the measured cost profile (spec/cost.h; the server
 * measures it at start): the most rows whose forward, its keys beyond the profile's context
 * included, costs at most itl_factor (--prefill-itl) times a round of one row per decoding
 * request (drafts not counted), and at least one prefill row. Without one: the online linear fit
 * of round time against rows, and at least DSP_ENGINE_MIN_CHUNK prefill rows (a coarse fit must
 * not starve the prefill). */
int dsp_engine_prefill_budget(const dsp_engine *e, int decode_rows, int n_decoding, uint32_t pos) {
    int budget = e->batch_tokens;
    const double w = e->fit_w, var = w * e->fit_xx - e->fit_x * e->fit_x;
    if (e->have_prof && e->prof.n > 0) {
        /* relative to a round of one row per decoding request: a round whose drafts already make it
         * long must not be made itl_factor times longer still (measured: p99 gaps of 10x the idle
         * median when the limit scaled with the draft rows) */
        const double lim = e->itl_factor * dsp_cost_time(&e->prof, n_decoding, 0);
        const double per_row = pos > e->prof.ctx_tokens ? (double)(pos - e->prof.ctx_tokens) : 0;
        int lo = decode_rows, hi = e->batch_tokens; /* the cost grows with rows: bisect for the last that fits */
        while (lo < hi) {
            int mid = lo + (hi - lo + 1) / 2;
            if (dsp_cost_time(&e->prof, mid, per_row * (mid - decode_rows)) <= lim) lo = mid;
            else hi = mid - 1;
        }
        budget = lo > decode_rows ? lo : decode_rows + 1; /* the measured curve is trusted down to one row */
        return budget < e->batch_tokens ? budget : e->batch_tokens;
    } else if (w >= 4 && var > 1e-9 * w * w) {
        double b = (w * e->fit_xy - e->fit_x * e->fit_y) / var, a = (e->fit_y - b * e->fit_x) / w;
        if (b > 0) {
            double base = a + b * n_decoding, rows = (e->itl_factor * (base > 0 ? base : 0) - a) / b;
            budget = rows < (double)e->batch_tokens ? (int)rows : e->batch_tokens;
        }
    } else {
        budget = decode_rows + 4 * DSP_ENGINE_MIN_CHUNK; /* no fit yet: small chunks */
    }
    if (budget < decode_rows + DSP_ENGINE_MIN_CHUNK) budget = decode_rows + DSP_ENGINE_MIN_CHUNK;
    return budget < e->batch_tokens ? budget : e->batch_tokens;
}

static void remove_running(dsp_engine *e, int i) {
    memmove(&e->running[i], &e->running[i + 1], sizeof *e->running * (size_t)(e->n_running - i - 1));
    e->n_running--;
}

static void observe(dsp_engine *e, dsp_req *r, uint32_t n_new, int32_t drafted, int32_t accepted, uint32_t tap_pos, int32_t tap_rows) {
    if (!r->drafter) return;
    const float *taps = r->drafter->n_taps > 0 && tap_rows > 0 ? e->taps + (size_t)r->row0 * (size_t)e->n_taps * (size_t)e->n_embd : NULL;
    dsp_spec_commit cm = {r->tokens, r->n_tokens, n_new, drafted, accepted, taps, tap_pos, taps ? tap_rows : 0};
    dsp_drafter_observe(r->drafter, &cm);
    r->observed = r->n_tokens;
}

/* The round's decoding requests' verification (with the sampler's work: top-p over a 49k
 * vocabulary ~0.5 ms a token, bench_sample) spread over the host threads, each request on the
 * scratch of the thread that runs it; decode_done then takes each result in batch order. A
 * verification reads and writes only its request's state (history, RNG) and reads its logits rows,
 * so the results are the serial loop's, bit for bit. */
/* r's verification of k drafts from its logits rows, on the scratch s and d */
static dsp_status verify_req(dsp_engine *e, dsp_req *r, int32_t k, dsp_sample_scratch *s, dsp_sample_dist *d, int32_t *out, int32_t *n_out) {
    const int V = e->n_vocab;
    return e->verify(e->logits + (size_t)r->logit0 * (size_t)V, V, k, r->draft, k > 0 && r->sampled ? r->q : NULL, &r->hist, &r->sp, &r->rng, s, d,
                     out, n_out);
}

static void verify_task(void *ctx, int task, int thread) {
    dsp_engine *e = ctx;
    dsp_req *r = e->vreqs[task];
    r->vst = verify_req(e, r, r->k, &e->vs[thread], &e->vd[thread], r->vout, &r->vn);
    if (r->vst) snprintf(r->error, sizeof r->error, "%s", dsp_last_error()); /* the message is this thread's */
    r->verified = true;
}

static void verify_all(dsp_engine *e) {
    if (e->n_vt < 2 || e->argmax_round) return; /* an argmax round's verification reads no logits row */
    int n = 0;
    for (int i = 0; i < e->n_running; i++) {
        dsp_req *r = e->running[i];
        if (r->n_rows > 0 && r->state == DSP_REQ_DECODE) e->vreqs[n++] = r;
    }
    if (n > 1) dsp_pool_run(e->host_pool, n, verify_task, e);
}

/* After the forward: the decoding request r verifies its block (unless verify_all did) and emits. */
static void decode_done(dsp_engine *e, dsp_req *r, bool first) {
    const int V = e->n_vocab;
    const float *logits = e->argmax_round ? NULL : e->logits + (size_t)r->logit0 * (size_t)V;
    const uint32_t len = r->n_tokens;
    int32_t k = first ? 0 : r->k, out[DSP_MAX_DRAFT + 1], n_out = 0;
    dsp_status st;
    if (r->verified) { /* verify_all did it */
        r->verified = false;
        if ((st = r->vst)) {
            finish(e, r, DSP_FINISH_NONE, st); /* r->error has the message */
            return;
        }
        n_out = r->vn;
        memcpy(out, r->vout, sizeof(int32_t) * (size_t)n_out);
    } else {
        st = e->argmax_round ? dsp_spec_verify_argmax(e->argmax + r->logit0, V, k, r->draft, &r->hist, &r->sp, &r->rng, out, &n_out)
                             : verify_req(e, r, k, &e->scratch, &e->dist, out, &n_out);
        if (st) {
            fail(e, r, st);
            return;
        }
    }
    const int32_t a = n_out - 1;
    r->res.n_rounds++;
    r->res.accept_hist[n_out]++;
    e->st.accept_hist[n_out]++;
    if (k > 0) {
        r->res.n_draft_rounds++;
        r->res.n_drafted += (size_t)k;
        r->res.n_accepted += (size_t)a;
        e->st.spec_rounds++;
        e->st.drafted += (uint64_t)k;
        e->st.accepted += (uint64_t)a;
    }
    /* rollback: keep the KV of the tokens fed and accepted (positions < len + a) */
    if (r->kv.n_tokens > len + (uint32_t)a) dsp_kv_seq_truncate(e->kv, &r->kv, len + (uint32_t)a);
    /* the lazy context step keeps the committed rows' taps: the anchor's and the accepted drafts' */
    if (!first && (st = dsp_engine_ctx_keep(e, r, len - 1, a + 1))) {
        fail(e, r, st);
        return;
    }
    if (r->t_first == 0) {
        r->t_first = now_ms();
        r->res.prefill_ms = r->t_first - r->t_admit;
    }
    /* emit one token at a time: EOS, stop strings, max_tokens and cancellation cut exactly */
    dsp_finish fin = DSP_FINISH_NONE;
    int32_t emitted = 0;
    for (int32_t j = 0; j < n_out && fin == DSP_FINISH_NONE; j++) {
        r->tokens[len + (uint32_t)j] = out[j];
        r->n_tokens = len + (uint32_t)j + 1;
        r->res.n_generated++;
        emitted++;
        fin = emit_token(e, r, out[j], logits ? logits + (size_t)j * (size_t)V : NULL); /* logits: unless an argmax round */
    }
    if (!first) dsp_engine_draft_done(e, r, k, out, n_out, emitted);
    if (fin != DSP_FINISH_NONE) {
        /* tokens decided after the cut were never emitted: drop them and their KV */
        r->hist.len = r->n_tokens;
        if (r->kv.n_tokens > r->n_tokens - 1) dsp_kv_seq_truncate(e->kv, &r->kv, r->n_tokens - 1);
        finish(e, r, fin, DSP_OK);
        return;
    }
    publish(e, r, r->kv.n_tokens);
    /* the request's own drafter learns only from its own proposals */
    bool own = r->src == DSP_SRC_DRAFTER;
    observe(e, r, (uint32_t)n_out, own ? k : 0, own ? a : 0, len - 1, first || !e->taps ? 0 : a + 1);
}

dsp_status dsp_engine_step(dsp_engine *e, const dsp_event **events, size_t *n_events) {
    for (size_t i = 0; i < e->n_done; i++) req_free(e, e->done[i]);
    e->n_done = 0;
    e->n_ev = 0;
    *events = e->ev;
    *n_events = 0;
    /* cancellations */
    for (dsp_req **pp = &e->wait_head; *pp;) {
        dsp_req *r = *pp;
        if (!r->cancel) {
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        if (e->wait_tail == r) e->wait_tail = NULL;
        e->n_waiting--;
        finish(e, r, DSP_FINISH_CANCELLED, DSP_OK);
    }
    if (!e->wait_tail)
        for (dsp_req *r = e->wait_head; r; r = r->next) e->wait_tail = r;
    for (int i = 0; i < e->n_running;) {
        dsp_req *r = e->running[i];
        if (!r->cancel) {
            i++;
            continue;
        }
        remove_running(e, i);
        finish(e, r, DSP_FINISH_CANCELLED, DSP_OK);
    }
    admit(e);
    if (e->n_running == 0) {
        *n_events = e->n_ev;
        return DSP_OK;
    }

    /* drafts, then the batch: decode blocks first, then prefill chunks */
    const double t_round = now_ms();
    const unsigned long setup0 = e->be->n_setup; /* a round with one-time work is not calibrated (backend.h) */
    const double prof0 = e->profile_ms;
    dsp_status st = dsp_engine_draft_round(e);
    if (st) { /* the drafter failed (a backend error): the decoding requests end with it */
        for (int i = e->n_running - 1; i >= 0; i--) {
            dsp_req *r = e->running[i];
            if (r->state != DSP_REQ_DECODE) continue;
            remove_running(e, i);
            fail(e, r, st);
        }
        *n_events = e->n_ev;
        return DSP_OK;
    }
    int n = 0, n_logits = 0, n_seqs = 0;
    double cal_extra = 0; /* the decoding rows' keys beyond the profile's context, and whether any is a draft */
    bool cal_drafted = false;
    for (int i = 0; i < e->n_running; i++) {
        dsp_req *r = e->running[i];
        r->n_rows = 0;
        r->evtext_used = 0;
        if (r->state != DSP_REQ_DECODE) continue;
        /* room for drafts: the token budget and logits rows left after one row per other request */
        int32_t room = e->batch_tokens - n - (e->n_running - i);
        int32_t lroom = e->max_rows - n_logits - (e->n_running - i);
        DSP_ASSERT(room >= 0 && lroom >= 0); /* max_batch <= max_rows <= batch_tokens */
        if (r->k > room) r->k = room;
        if (r->k > lroom) r->k = lroom;
        const uint32_t len = r->n_tokens;
        r->row0 = n;
        r->logit0 = n_logits;
        r->n_rows = r->k + 1;
        cal_drafted |= r->k > 0;
        if (len > e->prof.ctx_tokens) cal_extra += (double)r->n_rows * (double)(len - e->prof.ctx_tokens);
        e->bseqs[n_seqs] = &r->kv;
        for (int32_t j = 0; j <= r->k; j++) {
            e->btok[n] = j ? r->draft[j - 1] : r->tokens[len - 1];
            e->bpos[n] = (int32_t)(len - 1) + j;
            e->bseq[n] = n_seqs;
            e->brow[n_logits++] = n;
            n++;
        }
        n_seqs++;
    }
    uint32_t pf_pos = 0;
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i]->state == DSP_REQ_PREFILL) {
            pf_pos = e->running[i]->kv.n_tokens;
            break;
        }
    const int budget = n > 0 ? dsp_engine_prefill_budget(e, n, n_seqs, pf_pos) : e->batch_tokens;
    for (int i = 0; i < e->n_running && n < budget; i++) {
        dsp_req *r = e->running[i];
        if (r->state != DSP_REQ_PREFILL || n_logits >= e->max_rows) continue;
        uint32_t from = r->kv.n_tokens, left = r->n_prompt - from;
        uint32_t chunk = left < (uint32_t)(budget - n) ? left : (uint32_t)(budget - n);
        r->row0 = n;
        r->n_rows = (int)chunk;
        r->logit0 = -1;
        e->bseqs[n_seqs] = &r->kv;
        for (uint32_t j = 0; j < chunk; j++) {
            e->btok[n] = r->tokens[from + j];
            e->bpos[n] = (int32_t)(from + j);
            e->bseq[n] = n_seqs;
            n++;
        }
        if (from + chunk == r->n_prompt) {
            r->logit0 = n_logits;
            e->brow[n_logits++] = n - 1;
        }
        n_seqs++;
    }
    if ((uint32_t)n_seqs > e->st.peak_running) e->st.peak_running = (uint32_t)n_seqs;
    int n_taps = e->taps ? e->n_taps : 0;
    bool block_ctx = false; /* a request in the round may draft with the block drafter: its context step runs */
    for (int i = 0; i < e->n_running; i++) block_ctx |= e->running[i]->n_rows > 0 && dsp_engine_block_ctx(e->running[i]);
    /* a round where every request with a logits row is plain greedy without logprobs needs only
     * the rows' argmax (the verifier's dsp_spec_verify_argmax), computed by the backend where the
     * logits are: no vocabulary row is read back */
    e->argmax_round = e->argmax != NULL && n_logits > 0;
    for (int i = 0; i < e->n_running && e->argmax_round; i++) {
        const dsp_req *r = e->running[i];
        if (r->n_rows > 0 && (r->state == DSP_REQ_DECODE || r->logit0 >= 0))
            e->argmax_round = r->p.logprobs < 0 && dsp_sample_params_plain_greedy(&r->sp);
    }
    double t_fwd = now_ms();
    st = dsp_engine_forward(e, n, n_seqs, n_logits, n_taps > 0, e->argmax_round,
                            !block_ctx ? DSP_CTX_NONE : e->lazy_ctx ? DSP_CTX_LAZY : DSP_CTX_ALL);
    t_fwd = now_ms() - t_fwd;
    if (!st) fit_round(e, n, t_fwd);
    e->st.rounds++;
    e->st.forward_rows += (uint64_t)n;
    e->st.forward_ms += t_fwd;
    if (st) { /* the forward failed: every request in it ends with the error */
        for (int i = e->n_running - 1; i >= 0; i--) {
            dsp_req *r = e->running[i];
            if (r->n_rows == 0) continue;
            remove_running(e, i);
            fail(e, r, st);
        }
        *n_events = e->n_ev;
        return DSP_OK;
    }

    verify_all(e);
    /* per request, in batch order */
    int n_dec = 0;
    for (int i = 0; i < e->n_running; i++) n_dec += e->running[i]->n_rows > 0 && e->running[i]->state == DSP_REQ_DECODE;
    for (int i = 0; i < e->n_running; i++) {
        dsp_req *r = e->running[i];
        if (r->n_rows == 0) continue;
        if (r->state == DSP_REQ_DECODE) {
            r->res.verify_ms += t_fwd / n_dec;
            decode_done(e, r, false);
        } else {
            uint32_t from = r->kv.n_tokens - (uint32_t)r->n_rows;
            if (r->drafter) { /* the drafter sees the prompt chunk by chunk (the first time, all of it) */
                dsp_spec_commit cm = {r->tokens, r->kv.n_tokens, r->kv.n_tokens - r->observed, 0, 0,
                                      n_taps && r->drafter->n_taps ? e->taps + (size_t)r->row0 * (size_t)n_taps * (size_t)e->n_embd : NULL,
                                      from, n_taps && r->drafter->n_taps ? r->n_rows : 0};
                dsp_drafter_observe(r->drafter, &cm);
                r->observed = r->kv.n_tokens;
            }
            publish(e, r, r->kv.n_tokens);
            if (r->kv.n_tokens == r->n_prompt) { /* prefill complete: the first token */
                dsp_sample_history_init(&r->hist, r->tokens, e->n_ctx, r->n_prompt);
                r->state = DSP_REQ_DECODE;
                decode_done(e, r, true);
            }
        }
    }
    /* the cost profile, measured in this round's draft step (the first that needs it), is not the
     * round's: counted as host time, it made every later round's host time look 1.4 s long (the
     * average decays by 0.9 a round) and the calibration's ratios 0.35, so that --max-draft auto
     * drafted 7 where it would draft 4, for the first ~60 rounds of a fresh process */
    const double aside = e->profile_ms - prof0;
    const double t_all = now_ms() - t_round - aside;
    double host = t_all - t_fwd - e->round_block_ms;
    if (host < 0) host = 0;
    e->st.host_ms += host + e->round_block_ms;
    if (n_dec > 0 && n_dec == n_seqs && e->be->n_setup == setup0 && aside == 0) { /* a decode-only round, for --max-draft auto (draft.c) */
        DSP_LOGD("round of %d rows: forward %.2f ms, block drafter %.2f ms (%d requests), host %.2f ms", n, t_fwd, e->round_block_ms,
                 e->round_nb, host);
        dsp_engine_calibrate(e, n, cal_extra, cal_drafted, t_all); /* before host_ms takes this round in: the host time the choice assumed */
    }
    if (n_dec > 0) /* a decoding round's host time outside the forward and the block drafter */
        e->host_ms = dsp_engine_host_step(e->host_ms, host, t_fwd);
    /* requests that finished this round leave now (their DONE events are out) */
    for (int i = e->n_running - 1; i >= 0; i--) {
        dsp_req *r = e->running[i];
        for (size_t d = 0; d < e->n_done; d++)
            if (e->done[d] == r) {
                remove_running(e, i);
                break;
            }
    }
    *n_events = e->n_ev;
    return DSP_OK;
}

/* ---- the blocking helper ------------------------------------------------------------------ */

dsp_status dsp_generate(dsp_engine *e, const int32_t *prompt, size_t n_prompt, const dsp_gen_params *p, dsp_token_cb cb, void *user,
                        dsp_gen_result *res) {
    if (res) memset(res, 0, sizeof *res);
    dsp_req_id id;
    dsp_status st = dsp_engine_submit(e, prompt, n_prompt, p, NULL, &id);
    if (st) return st;
    bool cancelled = false;
    for (;;) {
        const dsp_event *ev;
        size_t n_ev;
        if ((st = dsp_engine_step(e, &ev, &n_ev))) return st;
        for (size_t i = 0; i < n_ev; i++) {
            if (ev[i].id != id) continue;
            if (ev[i].type == DSP_EVENT_TOKEN) {
                if (!cancelled && cb && !cb(&ev[i].tok, user)) {
                    dsp_engine_cancel(e, id); /* takes effect at the next round; later tokens are not reported */
                    cancelled = true;
                }
                continue;
            }
            if (res) *res = *ev[i].res;
            if (ev[i].status) return dsp_error(ev[i].status, "%s", ev[i].error);
            return DSP_OK;
        }
    }
}
