/* backend/cuda/cuda_backend: the CUDA implementation of backend.h on one NVIDIA GPU.
 *
 * Memory: activations (dsp_buf) and the KV store are device allocations made outside forwards;
 * weights are uploaded once and repacked for the tensor cores (pack.h), 1-D weights (norms,
 * biases) are kept as f32. Per-forward scratch (packed activations, attention partials) and the
 * batch description are sized by reserve() and grown, outside any graph, when a forward needs
 * more.
 *
 * A forward: begin() copies the batch (tokens, positions, sequences, key counts, block tables)
 * into pinned host memory; each op appends a record (op code + arguments, no host pointers) and
 * copies any host data it gets (buf_write sources, row lists) into a pinned staging area. Records
 * run at a flush point (end(), or buf_read inside a forward): the batch and staging bytes are
 * uploaded, then the records run as a CUDA graph. The record list is a function of the batch
 * shape (backend.h's contract), so it is the graph's key: the first forward of a shape captures
 * its launches into a graph, later ones replay it (DSP_CUDA_GRAPHS=0 runs the launches directly).
 * Kernels read the batch from fixed device arrays, never from launch arguments, so one graph
 * serves every batch of its shape.
 *
 * Fusion happens while recording, on adjacent records only, and never changes a bit: [add ->]
 * rmsnorm -> matmul and swiglu -> matmul become one record whose input preparation does the
 * producing ops (dsp_cu_prep); norm_rope(q), norm_rope(k), kv_write become one launch
 * (dsp_cu_rope). Each fused kernel repeats the separate kernels' float operations in their order.
 * DSP_CUDA_PROFILE=1 runs records one by one between events and prints the GPU time per op.
 *
 * Errors: an op that cannot be recorded (staging growth failed, say) stores the first error and
 * later ops do nothing; end() returns it. Asynchronous kernel faults surface at the next
 * synchronisation (buf_read, end's check of the stream). */
#include "backend/cuda/cuda_internal.h"

extern "C" {
#include "core/quant.h"
#include "core/status.h"
}

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dsp_buf {
    float *d;
    size_t n;
};

struct dsp_bweight {
    bool matrix;
    dsp_cu_mat m; /* matrix: packed */
    float *vec;   /* vector: f32 */
    int64_t n;    /* vector length */
    char name[96];
};

struct dsp_kv_store {
    dsp_cu_kv kv;
};

namespace {

enum op_kind {
    OP_EMBED = 1, OP_RMSNORM, OP_MATMUL, OP_ADD_BIAS, OP_NORM_ROPE, OP_KV_WRITE, OP_ATTN, OP_ADD, OP_SWIGLU, OP_COPY_ROWS, OP_UPLOAD,
    OP_ROPE_KV, /* norm_rope(q), norm_rope(k), kv_write fused (cu_kv_write) */
};

/* One recorded op: plain data, zero-filled, compared bytewise (the graph key). */
struct op_rec {
    int32_t kind, i[9];
    float f[4];
    const void *p[12];
    uint64_t u[6];
};

struct gentry {
    uint64_t hash, last_use;
    int n;
    op_rec *recs;
    cudaGraphExec_t exec;
};

constexpr int GCACHE = 96;
constexpr int PROF_MAX = 96; /* distinct op labels the profile keeps */

struct prof_entry {
    char label[96];
    double ms;
    long calls;
};
constexpr size_t MARGIN = 256ull << 20; /* device memory left free for the runtime and scratch */

struct cu_backend {
    dsp_backend base; /* first: the ops table sees a dsp_backend */
    int dev, n_sm;
    cudaStream_t st;
    cudaEvent_t upload_done;
    bool graphs, progress, kv_bf16;
    size_t uploaded; /* weight bytes uploaded, for progress */
    dsp_be_limits lim;

    /* scratch */
    uint8_t *raw; size_t raw_cap;          /* raw weight chunk for repacking */
    uint4 *xp; size_t xp_cap;              /* packed activation units */
    float *xsum; size_t xsum_cap;          /* floats */
    float *part; size_t part_cap;          /* attention partials, floats */
    unsigned *am_count; size_t am_cap;     /* the argmax kernels' tickets (zero between launches), rows */
    int2 *am_part; size_t am_part_cap;     /* and their parts, DSP_CU_AM_MAX_SPLIT per row */
    int32_t *h_meta, *d_meta; size_t meta_cap; int meta_T; size_t meta_used; bool meta_dirty;
    dsp_cu_meta meta;
    uint8_t *h_stage, *d_stage; size_t stage_cap, stage_used, stage_flushed;
    uint64_t gen; /* bumps when a scratch address changes: recorded graphs are stale */

    /* the forward */
    bool in_fwd;
    int n_tokens, max_keys, seq_runs;
    const dsp_be_batch *batch;
    const dsp_kv_store *checked_kv; /* KV store whose block ids this forward has validated */
    op_rec *recs; int n_recs, cap_recs;
    dsp_status err; char errmsg[512];

    gentry cache[GCACHE];
    uint64_t tick;

    /* DSP_CUDA_PROFILE=1: records run one by one between events; time per op label, printed at
     * destroy (graphs are off then, so the figures include each launch's gap) */
    bool profile;
    cudaEvent_t *ev; int n_ev;
    prof_entry prof[PROF_MAX]; int n_prof;
};

cu_backend *B(dsp_backend *be) { return (cu_backend *)be; }

void set_err(cu_backend *b, dsp_status st, const char *fmt, ...) {
    if (b->err) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->errmsg, sizeof b->errmsg, fmt, ap);
    va_end(ap);
    b->err = st;
}

dsp_status cu_fail(cudaError_t e, const char *what) {
    return dsp_error(e == cudaErrorMemoryAllocation ? DSP_ERR_NOMEM : DSP_ERR_INTERNAL, "cuda: %s: %s", what, cudaGetErrorString(e));
}

double mib(size_t b) { return (double)b / (1024.0 * 1024.0); }

/* device allocation with a clear out-of-memory message */
dsp_status dev_alloc(cu_backend *b, void **p, size_t bytes, const char *what) {
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        *p = nullptr;
        return dsp_error(DSP_ERR_NOMEM, "cuda: %s needs %.1f MiB of GPU %d memory, %.1f MiB free of %.1f MiB", what, mib(bytes), b->dev,
                         mib(fr), mib(tot));
    }
    return DSP_OK;
}

void graph_cache_clear(cu_backend *b) {
    for (int i = 0; i < GCACHE; i++) {
        if (b->cache[i].exec) cudaGraphExecDestroy(b->cache[i].exec);
        free(b->cache[i].recs);
        b->cache[i] = gentry{};
    }
}

/* before freeing device memory: nothing may use it, and no graph may keep its address (a later
 * allocation at the same address would otherwise match a stale graph's key) */
void quiesce(cu_backend *b) {
    cudaSetDevice(b->dev);
    cudaStreamSynchronize(b->st);
    graph_cache_clear(b);
}

/* grow a device scratch array (contents are not kept) */
dsp_status grow(cu_backend *b, void **p, size_t *cap, size_t need, size_t elem, const char *what) {
    if (need <= *cap) return DSP_OK;
    cudaStreamSynchronize(b->st);
    cudaFree(*p);
    *p = nullptr;
    *cap = 0;
    size_t n = need + need / 4;
    dsp_status st = dev_alloc(b, p, n * elem, what);
    if (st) return st;
    *cap = n;
    b->gen++;
    graph_cache_clear(b);
    return DSP_OK;
}

/* ---- the batch description ------------------------------------------------------------------- */

/* layout of h_meta / d_meta: tokens, pos, seq, n_keys [T each], tab_off [T + 1], tab [rest] */
dsp_status meta_ensure(cu_backend *b, int T, size_t tab) {
    if (T < b->meta_T) T = b->meta_T;
    const size_t need = 5 * (size_t)T + 1 + tab;
    if (T == b->meta_T && need <= b->meta_cap) return DSP_OK;
    cudaStreamSynchronize(b->st);
    cudaFreeHost(b->h_meta);
    cudaFree(b->d_meta);
    b->h_meta = nullptr, b->d_meta = nullptr, b->meta_cap = 0, b->meta_T = 0;
    const size_t cap = need + need / 4 + 1024;
    if (cudaMallocHost((void **)&b->h_meta, cap * 4) != cudaSuccess) {
        cudaGetLastError();
        return dsp_error(DSP_ERR_NOMEM, "cuda: no pinned host memory for the batch description (%zu bytes)", cap * 4);
    }
    dsp_status st = dev_alloc(b, (void **)&b->d_meta, cap * 4, "the batch description");
    if (st) return st;
    b->meta_cap = cap, b->meta_T = T;
    int32_t *d = b->d_meta;
    b->meta.tokens = d, b->meta.pos = d + T, b->meta.seq = d + 2 * T, b->meta.n_keys = d + 3 * T;
    b->meta.tab_off = d + 4 * T, b->meta.tab = d + 5 * T + 1;
    b->gen++;
    graph_cache_clear(b);
    return DSP_OK;
}

dsp_status stage_ensure(cu_backend *b, size_t need) {
    if (need <= b->stage_cap) return DSP_OK;
    cudaStreamSynchronize(b->st);
    cudaFreeHost(b->h_stage);
    cudaFree(b->d_stage);
    b->h_stage = nullptr, b->d_stage = nullptr, b->stage_cap = 0;
    size_t cap = need + need / 2 + (1u << 20);
    if (cudaMallocHost((void **)&b->h_stage, cap) != cudaSuccess) {
        cudaGetLastError();
        return dsp_error(DSP_ERR_NOMEM, "cuda: no pinned host memory for staging (%zu bytes)", cap);
    }
    dsp_status st = dev_alloc(b, (void **)&b->d_stage, cap, "the staging area");
    if (st) return st;
    b->stage_cap = cap;
    b->gen++;
    graph_cache_clear(b);
    return DSP_OK;
}

/* ---- running records ----------------------------------------------------------------------- */

const dsp_cu_mat *matof(const void *w) { return &((const dsp_bweight *)w)->m; }
const float *vecof(const void *w) { return w ? ((const dsp_bweight *)w)->vec : nullptr; }

cudaError_t run_op(cu_backend *b, const op_rec &r) {
    cudaStream_t st = b->st;
    switch (r.kind) {
    case OP_EMBED: return dsp_cu_embed((float *)r.p[0], matof(r.p[1]), r.i[0], r.i[1], &b->meta, st);
    case OP_RMSNORM:
        return dsp_cu_rmsnorm((float *)r.p[0], (const float *)r.p[1], vecof(r.p[2]), r.i[0], r.i[1], r.f[0],
                              r.i[2] ? (const int32_t *)(b->d_stage + r.u[0]) : nullptr, st);
    case OP_MATMUL: {
        const dsp_cu_mat *w[3];
        float *y[3];
        for (int i = 0; i < r.i[0]; i++) w[i] = matof(r.p[i]), y[i] = (float *)r.p[3 + i];
        dsp_cu_xpack xb = {b->xp, b->xsum, (int64_t)r.u[0]};
        dsp_cu_prep pr = {r.i[2], w[0]->K, dsp_cu_x_units(w[0]->K), xb.xs_stride, (float *)r.p[6], (float *)r.p[7],
                          (const float *)r.p[8], vecof(r.p[9]), (const float *)r.p[10], r.f[0], b->xp, b->xsum};
        cudaError_t e = r.i[2] & DSP_CU_PREP_PACKED ? cudaSuccess : dsp_cu_prep_launch(&pr, r.i[1], st);
        return e != cudaSuccess ? e : dsp_cu_matmul(r.i[0], w, y, r.i[1], &xb, st);
    }
    case OP_ADD_BIAS: return dsp_cu_add_bias((float *)r.p[0], vecof(r.p[1]), r.i[0], r.i[1], st);
    case OP_NORM_ROPE: case OP_ROPE_KV: {
        /* NORM_ROPE: one tensor (p[0], norm p[1], i[1] heads); ROPE_KV adds k (p[3], norm p[4],
         * i[7] heads), v (p[5]) and the store (p[6], layer i[5]) */
        dsp_cu_rope_args a = {};
        a.q = (float *)r.p[0], a.qnorm = vecof(r.p[1]), a.hq = r.i[1], a.inv_freq = (const float *)r.p[2];
        a.n = r.i[0], a.hd = r.i[2], a.rot = r.i[3], a.neox = r.i[4] != 0;
        a.eps = r.f[0], a.pos_scale = r.f[1], a.attn_factor = r.f[2];
        if (r.kind == OP_ROPE_KV) {
            a.k = (float *)r.p[3], a.knorm = vecof(r.p[4]), a.hk = r.i[7], a.v = (const float *)r.p[5];
            a.kv = ((const dsp_kv_store *)r.p[6])->kv, a.layer = r.i[5];
        }
        return dsp_cu_rope(&a, &b->meta, st);
    }
    case OP_KV_WRITE:
        return dsp_cu_kv_write(&((const dsp_kv_store *)r.p[0])->kv, r.i[0], (const float *)r.p[1], (const float *)r.p[2], r.i[1],
                               &b->meta, st);
    case OP_ATTN: { /* i[7]: pack the output for the matmul after it (xsum stride u[0]) */
        const dsp_cu_xpack pk = {b->xp, b->xsum, (int64_t)r.u[0]};
        return dsp_cu_attention((float *)r.p[0], (const float *)r.p[1], &((const dsp_kv_store *)r.p[2])->kv, r.i[0], r.i[1], r.i[2],
                                r.i[3], r.i[4], r.f[0], r.i[5], r.i[6], r.i[8] != 0, b->part, &b->meta, r.i[7] ? &pk : nullptr, st);
    }
    case OP_ADD: return dsp_cu_add((float *)r.p[0], (const float *)r.p[1], r.u[0], st);
    case OP_SWIGLU: return dsp_cu_swiglu((float *)r.p[0], (const float *)r.p[1], r.u[0], st);
    case OP_COPY_ROWS:
        return dsp_cu_copy_rows((float *)r.p[0], r.u[0], r.u[1], (const float *)r.p[1], r.u[2], r.u[3], r.i[0], r.u[4], st);
    case OP_UPLOAD: return cudaMemcpyAsync((void *)r.p[0], b->d_stage + r.u[0], r.u[1], cudaMemcpyDeviceToDevice, st);
    default: return cudaErrorInvalidValue;
    }
}

const char *rows_bucket(int n) { return n == 1 ? "1" : n <= 8 ? "2-8" : n <= 16 ? "9-16" : n <= 32 ? "17-32" : n <= 64 ? "33-64" : ">64"; }

void op_label(const op_rec &r, char *out, size_t cap) {
    static const char *names[] = {"", "embed", "rmsnorm", "matmul", "add_bias", "norm_rope", "kv_write", "attention", "add", "swiglu",
                                  "copy_rows", "upload", "norm_rope q+k, kv_write"};
    if (r.kind == OP_MATMUL) {
        int64_t M = 0;
        for (int i = 0; i < r.i[0]; i++) M += matof(r.p[i])->M;
        const dsp_cu_mat *w = matof(r.p[0]);
        snprintf(out, cap, "matmul %s %lldx%lld rows %s%s%s%s", dsp_dtype_name(w->L.type), (long long)M, (long long)w->K,
                 rows_bucket(r.i[1]), r.i[2] & DSP_CU_PREP_ADD ? " +add" : "", r.i[2] & DSP_CU_PREP_NORM ? " +rmsnorm" : "",
                 r.i[2] & DSP_CU_PREP_SWIGLU ? " +swiglu" : r.i[2] & DSP_CU_PREP_PACKED ? " (packed by attention)" : "");
    } else if (r.kind == OP_ATTN) {
        snprintf(out, cap, "attention rows %s, %d chunks%s", rows_bucket(r.i[1]), r.i[5], r.i[8] ? " (rows kernel)" : "");
    } else {
        snprintf(out, cap, "%s", r.kind > 0 && r.kind <= OP_ROPE_KV ? names[r.kind] : "?");
    }
}

cudaError_t run_profiled(cu_backend *b) {
    if (b->n_ev < 2 * b->n_recs) {
        cudaEvent_t *ev = (cudaEvent_t *)realloc(b->ev, sizeof *ev * 2 * (size_t)b->n_recs);
        if (!ev) return cudaErrorMemoryAllocation;
        b->ev = ev;
        for (; b->n_ev < 2 * b->n_recs; b->n_ev++)
            if (cudaEventCreate(&b->ev[b->n_ev]) != cudaSuccess) return cudaErrorMemoryAllocation;
    }
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < b->n_recs && e == cudaSuccess; i++) {
        cudaEventRecord(b->ev[2 * i], b->st);
        e = run_op(b, b->recs[i]);
        cudaEventRecord(b->ev[2 * i + 1], b->st);
    }
    if (e == cudaSuccess) e = cudaEventSynchronize(b->ev[2 * b->n_recs - 1]);
    for (int i = 0; i < b->n_recs && e == cudaSuccess; i++) {
        float ms = 0;
        cudaEventElapsedTime(&ms, b->ev[2 * i], b->ev[2 * i + 1]);
        char label[96];
        op_label(b->recs[i], label, sizeof label);
        int k = 0;
        while (k < b->n_prof && strcmp(b->prof[k].label, label)) k++;
        if (k == b->n_prof) {
            if (k == PROF_MAX) continue;
            snprintf(b->prof[b->n_prof++].label, sizeof b->prof[0].label, "%s", label);
        }
        b->prof[k].ms += ms, b->prof[k].calls++;
    }
    return e;
}

void print_profile(const cu_backend *b) {
    if (!b->n_prof) return;
    int order[PROF_MAX];
    double total = 0;
    for (int i = 0; i < b->n_prof; i++) order[i] = i, total += b->prof[i].ms;
    for (int i = 0; i < b->n_prof; i++)
        for (int j = i + 1; j < b->n_prof; j++)
            if (b->prof[order[j]].ms > b->prof[order[i]].ms) {
                int t = order[i];
                order[i] = order[j], order[j] = t;
            }
    fprintf(stderr, "cuda profile (DSP_CUDA_PROFILE): %.1f ms of GPU time in ops\n%10s %8s %9s %5s  op\n", total, "ms", "calls", "us/call",
            "%");
    for (int i = 0; i < b->n_prof; i++) {
        const prof_entry *p = &b->prof[order[i]];
        fprintf(stderr, "%10.2f %8ld %9.2f %5.1f  %s\n", p->ms, p->calls, 1e3 * p->ms / (double)p->calls, 100 * p->ms / total, p->label);
    }
}

static_assert(sizeof(op_rec) % 8 == 0, "records hash as 64-bit words");

/* the graph key's hash (a memcmp confirms a hit): 64-bit words, multiply-xorshift */
uint64_t trace_hash(const op_rec *r, int n, uint64_t gen) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ gen;
    const uint64_t *p = (const uint64_t *)r;
    for (size_t i = 0; i < (size_t)n * sizeof *r / 8; i++) {
        h = (h ^ p[i]) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    return h;
}

/* scratch the pending records need (outside any capture) */
dsp_status ensure_scratch(cu_backend *b) {
    size_t xp = 0, xs = 0, part = 0;
    for (int i = 0; i < b->n_recs; i++) {
        const op_rec &r = b->recs[i];
        if (r.kind == OP_MATMUL) {
            const int64_t units = dsp_cu_x_units(matof(r.p[0])->K);
            if ((size_t)(r.i[1] * units) > xp) xp = (size_t)r.i[1] * units;
            if ((size_t)(units / 8) * r.u[0] > xs) xs = (size_t)(units / 8) * r.u[0];
        } else if (r.kind == OP_ATTN) {
            size_t need = (size_t)r.i[1] * r.i[2] * r.i[5] * (r.i[4] + 2);
            if (need > part) part = need;
        }
    }
    dsp_status st = grow(b, (void **)&b->xp, &b->xp_cap, xp, 16, "packed activations");
    if (!st) st = grow(b, (void **)&b->xsum, &b->xsum_cap, xs, 4, "activation block sums");
    if (!st) st = grow(b, (void **)&b->part, &b->part_cap, part, 4, "attention partials");
    return st;
}

/* run the pending records: upload the batch and staging bytes, then replay (or capture) */
void flush(cu_backend *b) {
    if (b->err) {
        b->n_recs = 0;
        return;
    }
    dsp_status st = ensure_scratch(b);
    if (st) {
        set_err(b, st, "%s", dsp_last_error());
        b->n_recs = 0;
        return;
    }
    cudaError_t e = cudaSuccess;
    if (b->meta_dirty) {
        e = cudaMemcpyAsync(b->d_meta, b->h_meta, b->meta_used * 4, cudaMemcpyHostToDevice, b->st);
        b->meta_dirty = false;
    }
    if (e == cudaSuccess && b->stage_used > b->stage_flushed) {
        e = cudaMemcpyAsync(b->d_stage + b->stage_flushed, b->h_stage + b->stage_flushed, b->stage_used - b->stage_flushed,
                            cudaMemcpyHostToDevice, b->st);
        b->stage_flushed = b->stage_used;
    }
    if (e == cudaSuccess) e = cudaEventRecord(b->upload_done, b->st);
    if (e == cudaSuccess && b->n_recs > 0) {
        if (b->profile) {
            e = run_profiled(b);
        } else if (!b->graphs) {
            for (int i = 0; i < b->n_recs && e == cudaSuccess; i++) e = run_op(b, b->recs[i]);
        } else {
            const uint64_t h = trace_hash(b->recs, b->n_recs, b->gen);
            gentry *hit = nullptr, *victim = &b->cache[0];
            for (int i = 0; i < GCACHE; i++) {
                gentry *g = &b->cache[i];
                if (g->exec && g->hash == h && g->n == b->n_recs && !memcmp(g->recs, b->recs, sizeof(op_rec) * (size_t)g->n)) {
                    hit = g;
                    break;
                }
                if (!g->exec || (victim->exec && g->last_use < victim->last_use)) victim = g;
            }
            if (!hit) {
                if (victim->exec) cudaGraphExecDestroy(victim->exec);
                free(victim->recs);
                *victim = gentry{};
                cudaGraph_t graph = nullptr;
                b->base.n_setup++; /* this forward's time includes the capture (backend.h) */
                e = cudaStreamBeginCapture(b->st, cudaStreamCaptureModeThreadLocal);
                for (int i = 0; i < b->n_recs && e == cudaSuccess; i++) e = run_op(b, b->recs[i]);
                cudaError_t e2 = cudaStreamEndCapture(b->st, &graph);
                if (e == cudaSuccess) e = e2;
                if (e == cudaSuccess) e = cudaGraphInstantiate(&victim->exec, graph, 0);
                if (graph) cudaGraphDestroy(graph);
                if (e == cudaSuccess) {
                    victim->recs = (op_rec *)malloc(sizeof(op_rec) * (size_t)b->n_recs);
                    if (!victim->recs) {
                        cudaGraphExecDestroy(victim->exec);
                        *victim = gentry{};
                        set_err(b, DSP_ERR_NOMEM, "cuda: no host memory for a graph key");
                        b->n_recs = 0;
                        return;
                    }
                    memcpy(victim->recs, b->recs, sizeof(op_rec) * (size_t)b->n_recs);
                    victim->n = b->n_recs, victim->hash = h;
                    hit = victim;
                } else {
                    victim->exec = nullptr;
                }
            }
            if (hit) {
                hit->last_use = ++b->tick;
                e = cudaGraphLaunch(hit->exec, b->st);
            }
        }
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        set_err(b, DSP_ERR_INTERNAL, "cuda: running the forward: %s", cudaGetErrorString(e));
    }
    b->n_recs = 0;
}

op_rec *rec(cu_backend *b, int kind) {
    DSP_ASSERT(b->in_fwd);
    if (b->err) return nullptr;
    if (b->n_recs == b->cap_recs) {
        int cap = b->cap_recs ? 2 * b->cap_recs : 1024;
        op_rec *n = (op_rec *)realloc(b->recs, sizeof(op_rec) * (size_t)cap);
        if (!n) {
            set_err(b, DSP_ERR_NOMEM, "cuda: no host memory for the op list");
            return nullptr;
        }
        b->recs = n, b->cap_recs = cap;
    }
    op_rec *r = &b->recs[b->n_recs++];
    memset(r, 0, sizeof *r);
    r->kind = kind;
    return r;
}

/* copy host bytes into the staging area; returns the offset (or SIZE_MAX on error) */
size_t stage(cu_backend *b, const void *src, size_t bytes) {
    size_t off = (b->stage_used + 15) & ~(size_t)15;
    if (off + bytes > b->stage_cap) {
        flush(b); /* what is staged so far goes out with the records that use it */
        if (!b->err) cudaStreamSynchronize(b->st);
        dsp_status st = stage_ensure(b, bytes + 16);
        if (st) {
            set_err(b, st, "%s", dsp_last_error());
            return SIZE_MAX;
        }
        b->stage_used = b->stage_flushed = 0;
        off = 0;
    }
    memcpy(b->h_stage + off, src, bytes);
    b->stage_used = off + bytes;
    return off;
}

/* ---- the ops table --------------------------------------------------------------------------- */

void cu_destroy(dsp_backend *be) {
    cu_backend *b = B(be);
    quiesce(b);
    print_profile(b);
    for (int i = 0; i < b->n_ev; i++) cudaEventDestroy(b->ev[i]);
    free(b->ev);
    cudaFree(b->raw), cudaFree(b->xp), cudaFree(b->xsum), cudaFree(b->part), cudaFree(b->am_count), cudaFree(b->am_part), cudaFree(b->d_meta), cudaFree(b->d_stage);
    cudaFreeHost(b->h_meta), cudaFreeHost(b->h_stage);
    cudaEventDestroy(b->upload_done);
    cudaStreamDestroy(b->st);
    free(b->recs);
    free(b);
}

dsp_status cu_reserve(dsp_backend *be, const dsp_be_limits *lim) {
    cu_backend *b = B(be);
    DSP_ASSERT(!b->in_fwd);
    cudaSetDevice(b->dev);
    if (lim->max_group > 16)
        return dsp_error(DSP_ERR_UNSUPPORTED, "cuda: %d query heads per KV head (the attention kernel handles up to 16)", lim->max_group);
    if (lim->max_tokens > b->lim.max_tokens) b->lim.max_tokens = lim->max_tokens;
    if (lim->max_width > b->lim.max_width) b->lim.max_width = lim->max_width;
    if (lim->max_group > b->lim.max_group) b->lim.max_group = lim->max_group;
    if (lim->max_keys > b->lim.max_keys) b->lim.max_keys = lim->max_keys;
    if (lim->max_rot_dim > b->lim.max_rot_dim) b->lim.max_rot_dim = lim->max_rot_dim;
    /* the weights are in: the repacking buffer goes */
    cudaFree(b->raw);
    b->raw = nullptr, b->raw_cap = 0;
    const int T = b->lim.max_tokens;
    const int64_t units = dsp_cu_x_units(b->lim.max_width), xs = (T + 63) / 64 * 64;
    dsp_status st = meta_ensure(b, T, 0);
    if (!st) st = grow(b, (void **)&b->xp, &b->xp_cap, (size_t)T * units, 16, "packed activations");
    if (!st) st = grow(b, (void **)&b->xsum, &b->xsum_cap, (size_t)(units / 8) * xs, 4, "activation block sums");
    if (!st) st = stage_ensure(b, (size_t)T * b->lim.max_width * 4);
    return st;
}

dsp_status cu_buf_create(dsp_backend *be, size_t n, dsp_buf **out) {
    cu_backend *b = B(be);
    DSP_ASSERT(!b->in_fwd);
    *out = nullptr;
    cudaSetDevice(b->dev);
    dsp_buf *buf = (dsp_buf *)calloc(1, sizeof *buf);
    if (!buf) return dsp_error(DSP_ERR_NOMEM, "no memory");
    dsp_status st = dev_alloc(b, (void **)&buf->d, n * sizeof(float), "an activation buffer");
    if (st) {
        free(buf);
        return st;
    }
    cudaMemsetAsync(buf->d, 0, n * sizeof(float), b->st); /* ordered before any forward on the stream */
    buf->n = n;
    *out = buf;
    return DSP_OK;
}

void cu_buf_destroy(dsp_backend *be, dsp_buf *buf) {
    if (!buf) return;
    cu_backend *b = B(be);
    quiesce(b);
    cudaFree(buf->d);
    free(buf);
}

void tensor_name(const dsp_tensor *t, char *out, size_t cap) {
    snprintf(out, cap, "%.*s", (int)(t->name.len < 200 ? t->name.len : 200), t->name.ptr ? t->name.ptr : "");
}

bool is_matrix(const dsp_tensor *t) { return t->n_elems != t->ne[0]; } /* as the CPU backend: 1-D = vector */

/* bytes a tensor takes on the device; 0 (with the error set) if it cannot run here */
uint64_t weight_bytes(const dsp_tensor *t, dsp_status *st) {
    char name[128];
    tensor_name(t, name, sizeof name);
    const char *tn = dsp_dtype_name(t->type);
    *st = DSP_OK;
    if (!is_matrix(t)) {
        const dsp_dtype_traits *tr = dsp_dtype_get(t->type);
        if (!tr || !tr->can_dequant) {
            *st = dsp_error(DSP_ERR_UNSUPPORTED, "tensor %s: type %s cannot be used by the CUDA backend", name, tn ? tn : "unknown");
            return 0;
        }
        return t->n_elems * 4;
    }
    dsp_cu_layout L;
    if (!dsp_cu_layout_of(t->type, &L)) {
        *st = dsp_error(DSP_ERR_UNSUPPORTED,
                        "tensor %s: type %s is not supported by the CUDA backend (it multiplies BF16, F16, F32, Q8_0, Q4_0, "
                        "Q4_1, Q4_K, Q5_K and Q6_K)",
                        name, tn ? tn : "unknown");
        return 0;
    }
    if (t->ne[2] != 1 || t->ne[3] != 1 || t->ne[1] > INT32_MAX || t->ne[0] > INT32_MAX) {
        *st = dsp_error(DSP_ERR_UNSUPPORTED, "tensor %s: shape %llux%llux%llux%llu is not a matrix the CUDA backend handles", name,
                        (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                        (unsigned long long)t->ne[3]);
        return 0;
    }
    return dsp_cu_packed_bytes(&L, (int64_t)t->ne[1], (int64_t)t->ne[0]);
}

dsp_status cu_check_weights(dsp_backend *be, const dsp_tensor *const *t, int n, uint64_t extra) {
    cu_backend *b = B(be);
    cudaSetDevice(b->dev);
    uint64_t total = extra;
    for (int i = 0; i < n; i++) {
        dsp_status st;
        total += weight_bytes(t[i], &st);
        if (st) return st;
    }
    size_t fr = 0, tot = 0;
    cudaError_t e = cudaMemGetInfo(&fr, &tot);
    if (e != cudaSuccess) return cu_fail(e, "cudaMemGetInfo");
    if (total + MARGIN > fr)
        return dsp_error(DSP_ERR_NOMEM,
                         "the model needs %.2f GiB of GPU memory (weights, KV cache and scratch) but GPU %d has %.2f GiB free of "
                         "%.2f GiB; use a smaller model or context, or --backend cpu",
                         (double)(total + MARGIN) / (1 << 30), b->dev, (double)fr / (1 << 30), (double)tot / (1 << 30));
    return DSP_OK;
}

dsp_status cu_weight_create(dsp_backend *be, const dsp_tensor *t, dsp_bweight **out) {
    cu_backend *b = B(be);
    DSP_ASSERT(!b->in_fwd);
    *out = nullptr;
    cudaSetDevice(b->dev);
    dsp_status st;
    const uint64_t bytes = weight_bytes(t, &st);
    if (st) return st;
    dsp_bweight *w = (dsp_bweight *)calloc(1, sizeof *w);
    if (!w) return dsp_error(DSP_ERR_NOMEM, "no memory");
    tensor_name(t, w->name, sizeof w->name);
    char what[160];
    snprintf(what, sizeof what, "tensor %s", w->name);
    if (!is_matrix(t)) {
        w->n = (int64_t)t->n_elems;
        float *h = (float *)malloc(bytes ? bytes : 4);
        st = h ? dsp_dequantize_row(t->type, t->data, h, t->n_elems) : dsp_error(DSP_ERR_NOMEM, "no memory");
        if (!st) st = dev_alloc(b, (void **)&w->vec, bytes, what);
        if (!st) {
            cudaError_t e = cudaMemcpyAsync(w->vec, h, bytes, cudaMemcpyHostToDevice, b->st);
            if (e == cudaSuccess) e = cudaStreamSynchronize(b->st);
            if (e != cudaSuccess) st = cu_fail(e, what);
        }
        free(h);
    } else {
        dsp_cu_mat *m = &w->m;
        w->matrix = true;
        dsp_cu_layout_of(t->type, &m->L);
        m->M = (int64_t)t->ne[1], m->K = (int64_t)t->ne[0];
        m->n_tiles = dsp_cu_n_tiles(m->M), m->n_groups = dsp_cu_n_groups(&m->L, m->K);
        m->S = dsp_cu_mm_slices(&m->L, m->M, m->K);
        st = dev_alloc(b, (void **)&m->d, bytes, what);
        /* upload and repack in chunks of whole tiles, at most ~64 MiB of raw rows each */
        const size_t row_bytes = dsp_dtype_row_bytes(t->type, t->ne[0]);
        int64_t tiles_per = (int64_t)((64ull << 20) / (row_bytes * DSP_CU_TILE));
        if (tiles_per < 1) tiles_per = 1;
        if (!st) st = grow(b, (void **)&b->raw, &b->raw_cap, (size_t)(tiles_per < m->n_tiles ? tiles_per : m->n_tiles) * DSP_CU_TILE * row_bytes,
                           1, "the weight upload buffer");
        const int64_t gb = dsp_cu_group_bytes(&m->L);
        for (int64_t t0 = 0; !st && t0 < m->n_tiles; t0 += tiles_per) {
            const int64_t nt = m->n_tiles - t0 < tiles_per ? m->n_tiles - t0 : tiles_per;
            const int64_t r0 = t0 * DSP_CU_TILE, rows = m->M - r0 < nt * DSP_CU_TILE ? m->M - r0 : nt * DSP_CU_TILE;
            /* on b->st, like the repack that reads it: a plain cudaMemcpy from pageable memory may
             * return before its DMA lands, and b->st does not wait for the legacy stream */
            cudaError_t e = cudaMemcpyAsync(b->raw, (const uint8_t *)t->data + (size_t)r0 * row_bytes, (size_t)rows * row_bytes,
                                            cudaMemcpyHostToDevice, b->st);
            dsp_cu_mat part = *m;
            part.M = rows, part.n_tiles = nt, part.d = m->d + t0 * m->n_groups * gb;
            if (e == cudaSuccess) e = dsp_cu_repack(&part, b->raw, row_bytes, b->st);
            if (e == cudaSuccess) e = cudaStreamSynchronize(b->st);
            if (e != cudaSuccess) st = cu_fail(e, what);
        }
    }
    if (st) {
        cudaFree(w->vec), cudaFree(w->m.d);
        free(w);
        return st;
    }
    b->uploaded += bytes;
    if (b->progress && (b->uploaded >> 30) != ((b->uploaded - bytes) >> 30))
        fprintf(stderr, "\rcuda: %.1f GiB of weights uploaded", (double)b->uploaded / (1 << 30));
    *out = w;
    return DSP_OK;
}

void cu_weight_destroy(dsp_backend *be, dsp_bweight *w) {
    if (!w) return;
    cu_backend *b = B(be);
    quiesce(b);
    cudaFree(w->vec), cudaFree(w->m.d);
    free(w);
}

dsp_status cu_kv_create(dsp_backend *be, int n_layers, int kv_dim, int block_tokens, uint32_t n_blocks, dsp_kv_store **out) {
    cu_backend *b = B(be);
    DSP_ASSERT(!b->in_fwd);
    *out = nullptr;
    cudaSetDevice(b->dev);
    if (n_layers < 1 || kv_dim < 8 || kv_dim % 8 || block_tokens < 1 || n_blocks < 1)
        return dsp_error(DSP_ERR_INVALID_ARG, "cuda: KV store of %d layers x %u blocks x %d tokens x %d values", n_layers, n_blocks,
                         block_tokens, kv_dim);
    dsp_kv_store *s = (dsp_kv_store *)calloc(1, sizeof *s);
    if (!s) return dsp_error(DSP_ERR_NOMEM, "no memory");
    dsp_cu_kv *kv = &s->kv;
    kv->n_layers = n_layers, kv->kv_dim = kv_dim, kv->block_tokens = block_tokens, kv->n_blocks = n_blocks, kv->bf16 = b->kv_bf16;
    const size_t bytes = (size_t)n_layers * n_blocks * (size_t)block_tokens * (size_t)kv_dim * 2;
    dsp_status st = dev_alloc(b, (void **)&kv->k, bytes, "the KV cache (keys)");
    if (!st) st = dev_alloc(b, (void **)&kv->v, bytes, "the KV cache (values)");
    if (!st && (cudaMemsetAsync(kv->k, 0, bytes, b->st) != cudaSuccess || cudaMemsetAsync(kv->v, 0, bytes, b->st) != cudaSuccess))
        st = cu_fail(cudaGetLastError(), "clearing the KV cache");
    if (st) {
        cudaFree(kv->k), cudaFree(kv->v);
        free(s);
        return st;
    }
    *out = s;
    return DSP_OK;
}

void cu_kv_destroy(dsp_backend *be, dsp_kv_store *s) {
    if (!s) return;
    cu_backend *b = B(be);
    quiesce(b);
    if (b->checked_kv == s) b->checked_kv = nullptr;
    cudaFree(s->kv.k), cudaFree(s->kv.v);
    free(s);
}

dsp_status cu_kv_copy_block(dsp_backend *be, dsp_kv_store *s, uint32_t dst, uint32_t src) {
    cu_backend *b = B(be);
    DSP_ASSERT(!b->in_fwd && dst < s->kv.n_blocks && src < s->kv.n_blocks);
    cudaSetDevice(b->dev);
    cudaError_t e = dsp_cu_kv_copy_block(&s->kv, dst, src, b->st);
    return e == cudaSuccess ? DSP_OK : cu_fail(e, "copying a KV block");
}

void cu_buf_write(dsp_backend *be, dsp_buf *buf, size_t off, const float *src, size_t n) {
    cu_backend *b = B(be);
    DSP_ASSERT(off + n <= buf->n);
    if (!b->in_fwd) {
        cudaSetDevice(b->dev);
        cudaError_t e = cudaMemcpyAsync(buf->d + off, src, n * 4, cudaMemcpyHostToDevice, b->st);
        if (e == cudaSuccess) e = cudaStreamSynchronize(b->st);
        if (e != cudaSuccess) fprintf(stderr, "cuda: buf_write: %s\n", cudaGetErrorString(e)); /* surfaces at the next forward too */
        return;
    }
    const size_t so = stage(b, src, n * 4);
    op_rec *r = so == SIZE_MAX ? nullptr : rec(b, OP_UPLOAD);
    if (!r) return;
    r->p[0] = buf->d + off, r->u[0] = so, r->u[1] = n * 4;
}

dsp_status cu_buf_read(dsp_backend *be, const dsp_buf *buf, size_t off, float *dst, size_t n) {
    cu_backend *b = B(be);
    DSP_ASSERT(off + n <= buf->n);
    cudaSetDevice(b->dev);
    if (b->in_fwd) {
        flush(b);
        if (b->err) return dsp_error(b->err, "%s", b->errmsg);
    }
    cudaError_t e = cudaMemcpyAsync(dst, buf->d + off, n * 4, cudaMemcpyDeviceToHost, b->st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(b->st);
    return e == cudaSuccess ? DSP_OK : cu_fail(e, "reading a buffer");
}

dsp_status cu_begin(dsp_backend *be, const dsp_be_batch *bt) {
    cu_backend *b = B(be);
    DSP_ASSERT(!b->in_fwd);
    cudaSetDevice(b->dev);
    if (bt->n_tokens < 1 || bt->n_seqs < 1)
        return dsp_error(DSP_ERR_INVALID_ARG, "cuda: a forward of %d rows over %d sequences", bt->n_tokens, bt->n_seqs);
    cudaEventSynchronize(b->upload_done); /* the pinned batch and staging areas are free again */
    if (b->raw) { /* weights are in */
        cudaFree(b->raw);
        b->raw = nullptr, b->raw_cap = 0;
    }
    size_t tab = 0;
    for (int s = 0; s < bt->n_seqs; s++) tab += bt->seqs[s]->n_blocks;
    dsp_status st = meta_ensure(b, bt->n_tokens, tab);
    if (st) return st;
    const int T = b->meta_T, n = bt->n_tokens;
    int32_t *h = b->h_meta;
    int max_keys = 0, runs = 0; /* runs: maximal spans of consecutive rows of one sequence */
    for (int i = 0; i < n; i++) {
        runs += i == 0 || bt->seq[i] != bt->seq[i - 1];
        if (bt->seq[i] < 0 || bt->seq[i] >= bt->n_seqs || bt->pos[i] < 0 || bt->n_keys[i] < 0)
            return dsp_error(DSP_ERR_INVALID_ARG, "cuda: row %d: sequence %d, position %d, %d keys", i, bt->seq[i], bt->pos[i], bt->n_keys[i]);
        h[i] = bt->tokens ? bt->tokens[i] : 0;
        h[T + i] = bt->pos[i], h[2 * T + i] = bt->seq[i], h[3 * T + i] = bt->n_keys[i];
        if (bt->n_keys[i] > max_keys) max_keys = bt->n_keys[i];
    }
    int32_t *off = h + 4 * T, *tb = h + 5 * T + 1;
    size_t o = 0;
    for (int s = 0; s < bt->n_seqs; s++) {
        off[s] = (int32_t)o;
        for (uint32_t j = 0; j < bt->seqs[s]->n_blocks; j++) tb[o++] = (int32_t)bt->seqs[s]->blocks[j];
    }
    off[bt->n_seqs] = (int32_t)o;
    b->meta_used = 5 * (size_t)T + 1 + o;
    b->meta_dirty = true;
    b->batch = bt, b->n_tokens = n, b->max_keys = max_keys, b->seq_runs = runs, b->checked_kv = nullptr;
    b->stage_used = b->stage_flushed = 0;
    b->n_recs = 0, b->err = DSP_OK, b->errmsg[0] = 0;
    b->in_fwd = true;
    return DSP_OK;
}

dsp_status cu_end(dsp_backend *be) {
    cu_backend *b = B(be);
    DSP_ASSERT(b->in_fwd);
    flush(b);
    b->in_fwd = false;
    b->batch = nullptr;
    if (b->err) return dsp_error(b->err, "%s", b->errmsg);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) {
        e = cudaStreamQuery(b->st);
        if (e == cudaErrorNotReady) e = cudaSuccess;
    }
    return e == cudaSuccess ? DSP_OK : cu_fail(e, "the forward");
}

/* every row's positions and keys must lie in blocks of its table that exist in the store */
bool check_kv(cu_backend *b, const dsp_kv_store *s) {
    if (b->checked_kv == s) return true;
    const dsp_be_batch *bt = b->batch;
    const uint32_t btk = (uint32_t)s->kv.block_tokens;
    for (int sq = 0; sq < bt->n_seqs; sq++)
        for (uint32_t j = 0; j < bt->seqs[sq]->n_blocks; j++)
            if (bt->seqs[sq]->blocks[j] >= s->kv.n_blocks) {
                set_err(b, DSP_ERR_INVALID_ARG, "cuda: sequence %d: block %u past the KV store's %u blocks", sq, bt->seqs[sq]->blocks[j],
                        s->kv.n_blocks);
                return false;
            }
    for (int i = 0; i < bt->n_tokens; i++) {
        const uint32_t nb = bt->seqs[bt->seq[i]]->n_blocks;
        const uint64_t need = (uint64_t)(bt->pos[i] > bt->n_keys[i] - 1 ? bt->pos[i] + 1 : bt->n_keys[i]);
        if (need > (uint64_t)nb * btk) {
            set_err(b, DSP_ERR_INVALID_ARG, "cuda: row %d (position %d, %d keys) is past its sequence's %u blocks", i, bt->pos[i],
                    bt->n_keys[i], nb);
            return false;
        }
    }
    b->checked_kv = s;
    return true;
}

void cu_embed(dsp_backend *be, dsp_buf *x, const dsp_bweight *table, int dim) {
    cu_backend *b = B(be);
    DSP_ASSERT(table->matrix && table->m.K == dim && (size_t)b->n_tokens * dim <= x->n && b->batch->tokens);
    for (int i = 0; i < b->n_tokens; i++)
        if (b->batch->tokens[i] < 0 || b->batch->tokens[i] >= table->m.M) {
            set_err(b, DSP_ERR_INVALID_ARG, "cuda: token id %d out of range (embedding table %s has %lld rows)", b->batch->tokens[i],
                    table->name, (long long)table->m.M);
            return;
        }
    op_rec *r = rec(b, OP_EMBED);
    if (r) r->p[0] = x->d, r->p[1] = table, r->i[0] = dim, r->i[1] = b->n_tokens;
}

void cu_rmsnorm(dsp_backend *be, dsp_buf *out, const dsp_buf *x, const dsp_bweight *w, int n_rows, int dim, float eps,
                const int32_t *rows) {
    cu_backend *b = B(be);
    DSP_ASSERT((size_t)n_rows * dim <= out->n && (!w || (!w->matrix && w->n == dim)));
    size_t so = 0;
    if (rows) {
        for (int i = 0; i < n_rows; i++) DSP_ASSERT(rows[i] >= 0 && (size_t)(rows[i] + 1) * dim <= x->n);
        so = stage(b, rows, (size_t)n_rows * 4);
        if (so == SIZE_MAX) return;
    } else {
        DSP_ASSERT((size_t)n_rows * dim <= x->n);
    }
    op_rec *r = rec(b, OP_RMSNORM);
    if (!r) return;
    r->p[0] = out->d, r->p[1] = x->d, r->p[2] = w, r->i[0] = n_rows, r->i[1] = dim, r->f[0] = eps;
    r->i[2] = rows != nullptr, r->u[0] = so;
}

void cu_matmul(dsp_backend *be, int n, const dsp_bweight *const *w, dsp_buf *const *y, const dsp_buf *x, int n_rows) {
    cu_backend *b = B(be);
    DSP_ASSERT(n >= 1 && n <= 3 && n_rows >= 1);
    for (int i = 0; i < n; i++)
        DSP_ASSERT(w[i]->matrix && w[i]->m.K == w[0]->m.K && (size_t)n_rows * w[i]->m.M <= y[i]->n);
    DSP_ASSERT((size_t)n_rows * w[0]->m.K <= x->n);
    /* fuse the op(s) that produced x into the input preparation: swiglu -> matmul, or
     * [add ->] rmsnorm -> matmul (bit-identical to running them apart, dsp_cu_prep) */
    const uint64_t nK = (uint64_t)n_rows * (uint64_t)w[0]->m.K;
    op_rec fused = {};
    const op_rec *last = b->n_recs > 0 && !b->err ? &b->recs[b->n_recs - 1] : nullptr;
    if (last && last->kind == OP_SWIGLU && last->p[0] == x->d && last->u[0] == nK) {
        fused.i[2] = DSP_CU_PREP_SWIGLU, fused.p[10] = last->p[1];
        b->n_recs--;
    } else if (last && last->kind == OP_RMSNORM && last->p[0] == x->d && !last->i[2] && last->i[0] == n_rows &&
               last->i[1] == w[0]->m.K && last->p[1] != x->d) {
        fused.i[2] = DSP_CU_PREP_NORM, fused.p[7] = last->p[1], fused.p[9] = last->p[2], fused.f[0] = last->f[0];
        b->n_recs--;
        const op_rec *add = b->n_recs > 0 ? &b->recs[b->n_recs - 1] : nullptr;
        if (add && add->kind == OP_ADD && add->p[0] == fused.p[7] && add->u[0] == nK) {
            fused.i[2] |= DSP_CU_PREP_ADD, fused.p[8] = add->p[1];
            b->n_recs--;
        }
    }
    const uint64_t xs_stride = (uint64_t)((b->meta_T > n_rows ? b->meta_T : n_rows) + 63) / 64 * 64;
    /* attention -> matmul (the o projection): the merge packs its rows (one kernel fewer a layer) */
    if (last && last->kind == OP_ATTN && last->p[0] == x->d && last->i[1] == n_rows && (int64_t)last->i[2] * last->i[4] == w[0]->m.K &&
        dsp_cu_attn_pack_ok(last->i[4]) && dsp_cu_attn_pack_enabled()) {
        op_rec *a = &b->recs[b->n_recs - 1];
        a->i[7] = 1, a->u[0] = xs_stride;
        fused.i[2] = DSP_CU_PREP_PACKED;
    }
    op_rec *r = rec(b, OP_MATMUL);
    if (!r) return;
    *r = fused;
    r->kind = OP_MATMUL;
    r->i[0] = n, r->i[1] = n_rows;
    for (int i = 0; i < n; i++) r->p[i] = w[i], r->p[3 + i] = y[i]->d;
    r->p[6] = x->d;
    r->u[0] = xs_stride;
}

void cu_add_bias(dsp_backend *be, dsp_buf *y, const dsp_bweight *bias, int n_rows, int dim) {
    cu_backend *b = B(be);
    DSP_ASSERT(!bias->matrix && bias->n == dim && (size_t)n_rows * dim <= y->n);
    op_rec *r = rec(b, OP_ADD_BIAS);
    if (r) r->p[0] = y->d, r->p[1] = bias, r->i[0] = n_rows, r->i[1] = dim;
}

void cu_norm_rope(dsp_backend *be, dsp_buf *x, const dsp_bweight *norm, float eps, int n_heads, int head_dim, const dsp_rope *rope) {
    cu_backend *b = B(be);
    DSP_ASSERT((size_t)b->n_tokens * n_heads * head_dim <= x->n && (!norm || (!norm->matrix && norm->n == head_dim)));
    DSP_ASSERT(rope->rot_dim <= head_dim && rope->rot_dim % 2 == 0 && (size_t)rope->rot_dim / 2 <= rope->inv_freq->n);
    if (head_dim > DSP_CU_ROPE_MAX_HD) {
        set_err(b, DSP_ERR_UNSUPPORTED, "cuda: head size %d (RoPE up to %d)", head_dim, DSP_CU_ROPE_MAX_HD);
        return;
    }
    op_rec *r = rec(b, OP_NORM_ROPE);
    if (!r) return;
    r->p[0] = x->d, r->p[1] = norm, r->f[0] = eps, r->i[0] = b->n_tokens, r->i[1] = n_heads, r->i[2] = head_dim;
    r->i[3] = rope->rot_dim, r->i[4] = rope->neox, r->f[1] = rope->pos_scale, r->f[2] = rope->attn_factor, r->p[2] = rope->inv_freq->d;
}

void cu_kv_write(dsp_backend *be, dsp_kv_store *kv, int layer, const dsp_buf *k, const dsp_buf *v) {
    cu_backend *b = B(be);
    DSP_ASSERT(layer >= 0 && layer < kv->kv.n_layers && (size_t)b->n_tokens * kv->kv.kv_dim <= k->n &&
               (size_t)b->n_tokens * kv->kv.kv_dim <= v->n);
    if (!check_kv(b, kv)) return;
    /* norm_rope(k) just before (and norm_rope(q) before it, same RoPE): one launch for the three */
    const op_rec *kr = b->n_recs > 0 && !b->err ? &b->recs[b->n_recs - 1] : nullptr;
    if (kr && kr->kind == OP_NORM_ROPE && kr->p[0] == k->d && kr->i[0] == b->n_tokens && kr->i[1] * kr->i[2] == kv->kv.kv_dim) {
        op_rec f = *kr;
        f.kind = OP_ROPE_KV;
        f.p[3] = kr->p[0], f.p[4] = kr->p[1], f.i[7] = kr->i[1], f.p[5] = v->d, f.p[6] = kv, f.i[5] = layer;
        f.p[0] = nullptr, f.p[1] = nullptr, f.i[1] = 0;
        b->n_recs--;
        const op_rec *qr = b->n_recs > 0 ? &b->recs[b->n_recs - 1] : nullptr;
        if (qr && qr->kind == OP_NORM_ROPE && qr->p[0] != k->d && qr->i[0] == f.i[0] && qr->i[2] == f.i[2] && qr->i[3] == f.i[3] &&
            qr->i[4] == f.i[4] && qr->f[0] == f.f[0] && qr->f[1] == f.f[1] && qr->f[2] == f.f[2] && qr->p[2] == f.p[2]) {
            f.p[0] = qr->p[0], f.p[1] = qr->p[1], f.i[1] = qr->i[1];
            b->n_recs--;
        }
        op_rec *r = rec(b, OP_ROPE_KV);
        if (r) *r = f;
        return;
    }
    op_rec *r = rec(b, OP_KV_WRITE);
    if (r) r->p[0] = kv, r->i[0] = layer, r->p[1] = k->d, r->p[2] = v->d, r->i[1] = b->n_tokens;
}

void cu_attention(dsp_backend *be, dsp_buf *out, const dsp_buf *q, const dsp_kv_store *kv, int layer, int n_head, int n_head_kv,
                  int head_dim, float scale) {
    cu_backend *b = B(be);
    DSP_ASSERT(layer >= 0 && layer < kv->kv.n_layers && n_head_kv * head_dim == kv->kv.kv_dim && n_head % n_head_kv == 0);
    DSP_ASSERT((size_t)b->n_tokens * n_head * head_dim <= q->n && (size_t)b->n_tokens * n_head * head_dim <= out->n);
    if (n_head / n_head_kv > 16 || head_dim % 8) {
        set_err(b, DSP_ERR_UNSUPPORTED, "cuda: attention with %d heads per KV head and head size %d (up to 16, multiples of 8)",
                n_head / n_head_kv, head_dim);
        return;
    }
    if (!check_kv(b, kv)) return;
    int chunks = 1;
    const int cmin = dsp_cu_attn_cmin();
    while (chunks < dsp_cu_attn_max_chunks(b->max_keys, cmin)) chunks *= 2; /* few distinct graphs as contexts grow */
    op_rec *r = rec(b, OP_ATTN);
    if (!r) return;
    r->p[0] = out->d, r->p[1] = q->d, r->p[2] = kv, r->i[0] = layer, r->i[1] = b->n_tokens, r->i[2] = n_head, r->i[3] = n_head_kv;
    r->i[4] = head_dim, r->f[0] = scale, r->i[5] = chunks, r->i[6] = dsp_cu_attn_chunk(b->max_keys, cmin);
    /* i[8]: many rows per sequence (a prefill chunk): the kernel that shares each chunk's keys
     * between the rows of a sequence (the same partials bit for bit, cuda_kernels.cu) */
    r->i[8] = b->n_tokens > 64 && b->n_tokens >= 8 * b->seq_runs && dsp_cu_attn_rows_ok(n_head, n_head_kv, head_dim, r->i[6]);
}

void cu_add(dsp_backend *be, dsp_buf *x, const dsp_buf *y, size_t n) {
    cu_backend *b = B(be);
    DSP_ASSERT(n <= x->n && n <= y->n);
    op_rec *r = rec(b, OP_ADD);
    if (r) r->p[0] = x->d, r->p[1] = y->d, r->u[0] = n;
}

void cu_swiglu(dsp_backend *be, dsp_buf *gate, const dsp_buf *up, size_t n) {
    cu_backend *b = B(be);
    DSP_ASSERT(n <= gate->n && n <= up->n);
    op_rec *r = rec(b, OP_SWIGLU);
    if (r) r->p[0] = gate->d, r->p[1] = up->d, r->u[0] = n;
}

void cu_copy_rows(dsp_backend *be, dsp_buf *dst, size_t dst_ld, size_t dst_col, const dsp_buf *src, size_t src_ld, size_t src_col,
                  int n_rows, size_t width) {
    cu_backend *b = B(be);
    if (n_rows <= 0 || width == 0) return;
    DSP_ASSERT((size_t)(n_rows - 1) * dst_ld + dst_col + width <= dst->n && (size_t)(n_rows - 1) * src_ld + src_col + width <= src->n);
    op_rec *r = rec(b, OP_COPY_ROWS);
    if (!r) return;
    r->p[0] = dst->d, r->u[0] = dst_ld, r->u[1] = dst_col, r->p[1] = src->d, r->u[2] = src_ld, r->u[3] = src_col, r->i[0] = n_rows;
    r->u[4] = width;
}

/* logits: outside or inside a forward (then what is recorded runs first); results on the host */
dsp_status logits_prep(cu_backend *b) {
    cudaSetDevice(b->dev);
    if (b->in_fwd) {
        flush(b);
        if (b->err) return dsp_error(b->err, "%s", b->errmsg);
    }
    return DSP_OK;
}

/* the argmax kernels' scratch for n_rows rows (new tickets start at zero) */
dsp_status am_ensure(cu_backend *b, int n_rows, dsp_cu_am *am) {
    const size_t cap = b->am_cap;
    dsp_status st = grow(b, (void **)&b->am_count, &b->am_cap, (size_t)n_rows, sizeof(unsigned), "argmax tickets");
    if (!st) st = grow(b, (void **)&b->am_part, &b->am_part_cap, (size_t)n_rows * DSP_CU_AM_MAX_SPLIT, sizeof(int2), "argmax parts");
    if (st) return st;
    if (b->am_cap != cap) {
        cudaError_t e = cudaMemsetAsync(b->am_count, 0, b->am_cap * sizeof(unsigned), b->st);
        if (e != cudaSuccess) return cu_fail(e, "argmax tickets");
    }
    am->count = b->am_count, am->part = b->am_part;
    return DSP_OK;
}

dsp_status cu_argmax(dsp_backend *be, const dsp_buf *logits, int n_rows, int n_vocab, int32_t *out) {
    cu_backend *b = B(be);
    DSP_ASSERT(n_rows >= 1 && (size_t)n_rows * n_vocab <= logits->n);
    dsp_status st = logits_prep(b);
    if (st) return st;
    st = stage_ensure(b, (size_t)n_rows * 4);
    if (st) return st;
    dsp_cu_am am;
    if ((st = am_ensure(b, n_rows, &am))) return st;
    int32_t *d = (int32_t *)b->d_stage; /* after a flush nothing pending reads the staging area */
    cudaError_t e = dsp_cu_argmax(logits->d, n_rows, n_vocab, d, &am, b->st);
    if (e == cudaSuccess) e = cudaMemcpyAsync(out, d, (size_t)n_rows * 4, cudaMemcpyDeviceToHost, b->st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(b->st);
    b->stage_used = b->stage_flushed = 0;
    return e == cudaSuccess ? DSP_OK : cu_fail(e, "argmax");
}

dsp_status cu_top_logprobs(dsp_backend *be, const dsp_buf *logits, int n_rows, int n_vocab, int k, int32_t *ids, float *lp, float *lse) {
    cu_backend *b = B(be);
    DSP_ASSERT(n_rows >= 1 && (size_t)n_rows * n_vocab <= logits->n);
    if (k < 0 || k > 64 || k > n_vocab) return dsp_error(DSP_ERR_INVALID_ARG, "cuda: top %d of %d logits (at most 64)", k, n_vocab);
    dsp_status st = logits_prep(b);
    if (st) return st;
    const size_t nk = (size_t)n_rows * (size_t)(k ? k : 1);
    st = stage_ensure(b, nk * 8 + (size_t)n_rows * 4 + 64);
    if (st) return st;
    int32_t *di = (int32_t *)b->d_stage;
    float *dl = (float *)(b->d_stage + nk * 4), *ds = (float *)(b->d_stage + nk * 8);
    cudaError_t e = dsp_cu_top_logprobs(logits->d, n_rows, n_vocab, k, di, dl, ds, b->st);
    if (e == cudaSuccess && k) e = cudaMemcpyAsync(ids, di, (size_t)n_rows * k * 4, cudaMemcpyDeviceToHost, b->st);
    if (e == cudaSuccess && k) e = cudaMemcpyAsync(lp, dl, (size_t)n_rows * k * 4, cudaMemcpyDeviceToHost, b->st);
    if (e == cudaSuccess && lse) e = cudaMemcpyAsync(lse, ds, (size_t)n_rows * 4, cudaMemcpyDeviceToHost, b->st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(b->st);
    b->stage_used = b->stage_flushed = 0;
    return e == cudaSuccess ? DSP_OK : cu_fail(e, "top logprobs");
}

dsp_status cu_markov_greedy(dsp_backend *be, dsp_buf *logits, int n_vocab, const dsp_buf *w1, int rank, const dsp_bweight *w2, dsp_buf *e,
                            dsp_buf *y, int n_reqs, const int *row0, const int *n, const int32_t *anchor, int32_t *out) {
    cu_backend *b = B(be);
    DSP_ASSERT(n_reqs >= 1 && rank >= 1 && w2->matrix && w2->m.K == rank && w2->m.M == n_vocab);
    DSP_ASSERT((size_t)n_vocab * rank <= w1->n && (size_t)n_reqs * rank <= e->n && (size_t)n_reqs * n_vocab <= y->n);
    int total = 0, max_n = 0;
    for (int j = 0; j < n_reqs; j++) {
        DSP_ASSERT(n[j] >= 0 && (size_t)(row0[j] + n[j]) * n_vocab <= logits->n);
        total += n[j];
        if (n[j] > max_n) max_n = n[j];
    }
    if (!total) return DSP_OK;
    dsp_status st = logits_prep(b);
    if (st) return st;
    /* int32 staging: the tokens (anchors, then the outputs of request j from n_reqs + o_j), then
     * for each slot k with m rows: their sources, destinations (token indices) and logit rows */
    const size_t n_int = (size_t)n_reqs + 4 * (size_t)total;
    if ((st = stage_ensure(b, n_int * 4))) return st;
    /* the forward's own staged bytes (row lists, uploads) may still be on their way from the
     * pinned area: wait before writing there */
    cudaEventSynchronize(b->upload_done);
    dsp_cu_am am;
    if ((st = am_ensure(b, n_reqs, &am))) return st;
    const int64_t units = dsp_cu_x_units(rank), stride = ((int64_t)n_reqs + 63) / 64 * 64;
    if ((st = grow(b, (void **)&b->xp, &b->xp_cap, (size_t)n_reqs * (size_t)units, 16, "packed activations")) ||
        (st = grow(b, (void **)&b->xsum, &b->xsum_cap, (size_t)(units / 8) * (size_t)stride, 4, "activation block sums")))
        return st;
    int32_t *h = (int32_t *)b->h_stage, *tab = h + n_reqs + total;
    for (int j = 0; j < n_reqs; j++) h[j] = anchor[j];
    size_t at = 0;
    for (int k = 0; k < max_n; k++) {
        int m = 0;
        for (int j = 0, o = n_reqs; j < n_reqs; o += n[j], j++)
            if (k < n[j]) m++;
        int32_t *src = tab + at, *dst = src + m, *lrow = dst + m;
        int i = 0;
        for (int j = 0, o = n_reqs; j < n_reqs; o += n[j], j++) {
            if (k >= n[j]) continue;
            src[i] = k ? o + k - 1 : j, dst[i] = o + k, lrow[i] = row0[j] + k;
            i++;
        }
        at += 3 * (size_t)m;
    }
    int32_t *dtok = (int32_t *)b->d_stage, *dtab = dtok + n_reqs + total;
    cudaError_t err = cudaMemcpyAsync(b->d_stage, b->h_stage, n_int * 4, cudaMemcpyHostToDevice, b->st);
    const dsp_cu_mat *wm = &w2->m;
    float *yd = y->d;
    dsp_cu_xpack xb = {b->xp, b->xsum, stride};
    at = 0;
    for (int k = 0; k < max_n && err == cudaSuccess; k++) {
        int m = 0;
        for (int j = 0; j < n_reqs; j++)
            if (k < n[j]) m++;
        const int32_t *src = dtab + at, *dst = src + m, *lrow = dst + m;
        at += 3 * (size_t)m;
        /* y = matmul(w2, e) for m rows, exactly as run_op's OP_MATMUL without a fused preparation */
        dsp_cu_prep pr = {0, rank, units, xb.xs_stride, e->d, nullptr, nullptr, nullptr, nullptr, 0.0f, b->xp, b->xsum};
        err = dsp_cu_markov_gather(w1->d, rank, dtok, src, e->d, m, b->st);
        if (err == cudaSuccess) err = dsp_cu_prep_launch(&pr, m, b->st);
        if (err == cudaSuccess) err = dsp_cu_matmul(1, &wm, &yd, m, &xb, b->st);
        if (err == cudaSuccess) err = dsp_cu_markov_add_argmax(logits->d, n_vocab, yd, lrow, dst, dtok, m, &am, b->st);
    }
    if (err == cudaSuccess) err = cudaMemcpyAsync(out, dtok + n_reqs, (size_t)total * 4, cudaMemcpyDeviceToHost, b->st);
    if (err == cudaSuccess) err = cudaStreamSynchronize(b->st);
    b->stage_used = b->stage_flushed = 0;
    return err == cudaSuccess ? DSP_OK : cu_fail(err, "the drafter's Markov chain");
}

double cu_read_bandwidth(dsp_backend *be, size_t bytes) {
    cu_backend *b = B(be);
    DSP_ASSERT(!b->in_fwd);
    cudaSetDevice(b->dev);
    return dsp_cu_read_bandwidth(bytes, b->n_sm, b->st);
}

const dsp_backend_ops g_ops = {
    "cuda",
    cu_destroy,
    cu_reserve,
    cu_buf_create,
    cu_buf_destroy,
    cu_weight_create,
    cu_weight_destroy,
    cu_kv_create,
    cu_kv_destroy,
    cu_kv_copy_block,
    cu_buf_write,
    cu_buf_read,
    cu_begin,
    cu_end,
    cu_embed,
    cu_rmsnorm,
    cu_matmul,
    cu_add_bias,
    cu_norm_rope,
    cu_kv_write,
    cu_attention,
    cu_add,
    cu_swiglu,
    cu_copy_rows,
    cu_check_weights,
    cu_argmax,
    cu_top_logprobs,
    cu_markov_greedy,
    cu_read_bandwidth,
};

/* the device can run this build's kernels (sm_90 machine code or its PTX) */
cudaError_t probe(int dev) {
    cudaError_t e = cudaSetDevice(dev);
    if (e == cudaSuccess) e = dsp_cu_kernels_init();
    if (e == cudaSuccess) e = dsp_cu_mm_init();
    return e;
}

} // namespace

extern "C" bool dsp_backend_cuda_available(void) {
    static int avail = -1; /* probed once */
    if (avail < 0) {
        int n = 0;
        avail = cudaGetDeviceCount(&n) == cudaSuccess && n > 0 && probe(0) == cudaSuccess;
        cudaGetLastError();
    }
    return avail == 1;
}

extern "C" dsp_status dsp_backend_cuda_create(const dsp_backend_params *p, dsp_backend **out) {
    *out = nullptr;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        return dsp_error(DSP_ERR_UNSUPPORTED, "no CUDA device: %s", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    }
    const int dev = p ? p->gpu : 0;
    if (dev < 0 || dev >= n) return dsp_error(DSP_ERR_INVALID_ARG, "GPU %d does not exist (this machine has %d CUDA device%s)", dev, n, n == 1 ? "" : "s");
    if (p && p->kv_type != 0 && p->kv_type != DSP_F16 && p->kv_type != DSP_BF16)
        return dsp_error(DSP_ERR_UNSUPPORTED, "cuda: KV cache type %s (the CUDA backend stores F16 or BF16)",
                         dsp_dtype_name((uint32_t)p->kv_type) ? dsp_dtype_name((uint32_t)p->kv_type) : "unknown");
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, dev);
    if (e != cudaSuccess) return cu_fail(e, "cudaGetDeviceProperties");
    e = probe(dev);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return dsp_error(DSP_ERR_UNSUPPORTED, "GPU %d (%s, sm_%d%d) cannot run this build's kernels (built for sm_90): %s", dev, prop.name,
                         prop.major, prop.minor, cudaGetErrorString(e));
    }
    cu_backend *b = (cu_backend *)calloc(1, sizeof *b);
    if (!b) return dsp_error(DSP_ERR_NOMEM, "no memory");
    b->base.ops = &g_ops;
    b->base.kind = DSP_BACKEND_CUDA;
    snprintf(b->base.desc, sizeof b->base.desc, "cuda %.60s (sm_%d%d, %.0f GiB), GPU %d", prop.name, prop.major, prop.minor,
             (double)prop.totalGlobalMem / (1 << 30), dev);
    b->dev = dev;
    b->n_sm = prop.multiProcessorCount;
    b->progress = p && p->progress;
    b->kv_bf16 = p && p->kv_type == DSP_BF16;
    const char *g = getenv("DSP_CUDA_GRAPHS"), *prof = getenv("DSP_CUDA_PROFILE");
    b->graphs = !(g && !strcmp(g, "0"));
    b->profile = prof && !strcmp(prof, "1");
    e = cudaStreamCreateWithFlags(&b->st, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&b->upload_done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        free(b);
        return cu_fail(e, "creating a stream");
    }
    *out = &b->base;
    return DSP_OK;
}
