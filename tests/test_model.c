/* Unit tests for model/ loading from untrusted files: hyper-parameters against the tensors the
 * file really holds. Tiny models are written in memory (tests/gguf_build.h); each malicious one
 * must be refused at load with a message naming the bad key, never bound and run. */
/* ctest-label: unit */
#include "dsp_test.h"
#include "gguf_build.h"

#include "model/forward.h"
#include "model/model.h"

#include <math.h>

/* load m from memory; the status, with the model in *out (NULL on error) */
static dsp_status load(const gb_model *m, buf *file, dsp_model **out) {
    *file = gb_model_write(m, (size_t)64 << 20);
    *out = NULL;
    if (!file->n) return dsp_error(DSP_ERR_INTERNAL, "gb_model_write refused the model");
    return dsp_model_load_memory(file->p, file->n, "tiny.gguf", NULL, out);
}

/* a forward over a few tokens must run */
static void check_runs(const dsp_model *model) {
    dsp_fwd_params fp = dsp_fwd_default_params();
    fp.n_threads = 1, fp.max_batch_tokens = 4, fp.n_ctx = 8;
    dsp_fwd *f = NULL;
    CHECK_MSG(dsp_fwd_create(model, &fp, &f) == DSP_OK, "%s", dsp_last_error());
    if (!f) return;
    dsp_kv_seq s;
    CHECK(dsp_fwd_seq_init(f, &s) == DSP_OK);
    dsp_kv_seq *seqs[1] = {&s};
    int32_t tok[3] = {1, 5, 2}, seq[3] = {0, 0, 0}, pos[3] = {0, 1, 2}, row = 2;
    dsp_batch b = {3, tok, seq, pos, 1, &row, 0, NULL};
    float *lg = malloc(sizeof(float) * (size_t)dsp_fwd_n_vocab(f));
    CHECK_MSG(dsp_fwd_run(f, seqs, 1, &b, lg, NULL) == DSP_OK, "%s", dsp_last_error());
    CHECK(isfinite(lg[0]));
    free(lg);
    dsp_kv_seq_free(dsp_fwd_kv(f), &s);
    dsp_fwd_destroy(f);
}

/* the builder's models are valid: so the refusals below are for the reason each test names */
static void test_valid_tiny_models(void) {
    static const char *const archs[] = {"llama", "qwen2", "qwen3"};
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
        gb_model m;
        gb_model_init(&m, archs[i]);
        buf file;
        dsp_model *model = NULL;
        CHECK_MSG(load(&m, &file, &model) == DSP_OK, "%s: %s", archs[i], dsp_last_error());
        if (model) check_runs(model);
        dsp_model_destroy(model);
        free(file.p);
    }
}

/* must be refused with DSP_ERR_FORMAT and a message containing `part` */
static void check_refused(const gb_model *m, const char *part) {
    buf file;
    dsp_model *model = NULL;
    dsp_status st = load(m, &file, &model);
    CHECK_MSG(st == DSP_ERR_FORMAT, "status %d (%s), wanted a format error naming '%s'", st, st ? dsp_last_error() : "loaded", part);
    if (st) CHECK_MSG(strstr(dsp_last_error(), part) != NULL, "message '%s' lacks '%s'", dsp_last_error(), part);
    dsp_model_destroy(model);
    free(file.p);
}

/* n_head * head_dim = 4096 * (2^20 + 1) wraps to 4096 in 32 bits; tensors shaped for the wrapped
 * product used to bind, and the attention then walked 2^32 floats per row. */
static void test_wrapped_head_product(void) {
    gb_model m;
    gb_model_init(&m, "llama");
    m.hp[GB_LAYERS] = 1, m.hp[GB_HEADS] = 4096, m.hp[GB_HEADS_KV] = 4096;
    m.hp[GB_KEY_LEN] = (1u << 20) + 1, m.hp[GB_ROPE_DIM] = 2;
    gb_model_tensors(&m);
    CHECK_EQ_INT(m.t[3].ne[1], 4096); /* blk.0.attn_q.weight: the wrapped product */
    check_refused(&m, "head_count");
    /* the same with grouped-query attention: q wraps to 8192, k/v to 4096 */
    gb_model_init(&m, "qwen2");
    m.hp[GB_LAYERS] = 1, m.hp[GB_HEADS] = 8192, m.hp[GB_HEADS_KV] = 4096;
    m.hp[GB_KEY_LEN] = (1u << 20) + 1, m.hp[GB_ROPE_DIM] = 2;
    gb_model_tensors(&m);
    check_refused(&m, "head_count");
}

/* more heads than model width and no key_length: the default head size n_embd / n_head is 0 */
static void test_zero_head_size(void) {
    gb_model m;
    gb_model_init(&m, "llama");
    m.hp[GB_LAYERS] = 1, m.hp[GB_EMBD] = 2, m.hp[GB_HEADS] = 4, m.hp[GB_HEADS_KV] = 4;
    gb_model_tensors(&m);
    m.t[3].ne[1] = 4, m.t[4].ne[1] = 4, m.t[5].ne[1] = 4, m.t[6].ne[0] = 4; /* q, k, v, o: some shape */
    for (int i = 3; i <= 6; i++) m.t[i].n_dims = 2, m.t[i].type = DSP_F32;
    check_refused(&m, "head size");
}

/* block_count 2^24 with the tensors of 2 layers: refused before sizing anything by it */
static void test_layer_count_bounded(void) {
    gb_model m;
    gb_model_init(&m, "llama");
    m.hp[GB_LAYERS] = 1u << 24;
    check_refused(&m, "block_count");
}

/* every other hyper-parameter is checked against the tensor that holds it */
static void test_shapes_checked(void) {
    gb_model m;
    gb_model_init(&m, "llama");
    m.hp[GB_FF] = 128; /* tensors keep 96 */
    check_refused(&m, "ffn_gate");
    gb_model_init(&m, "qwen3");
    m.t[11].ne[0] = 8; /* blk.0.attn_q_norm.weight must be head_dim (16) */
    check_refused(&m, "attn_q_norm");
}

/* End-of-generation ids from the metadata are kept only when they are tokens of the vocabulary
 * (an id >= 2^31 used to pass the check as a negative int32) */
static void test_eog_ids_in_vocab(void) {
    gb_model m;
    gb_model_init(&m, "llama");
    m.n_tokens = 32;
    m.eos_id = 7, m.eot_id = 0xFFFFFFFFu;
    buf file;
    dsp_model *model = NULL;
    CHECK_MSG(load(&m, &file, &model) == DSP_OK, "%s", dsp_last_error());
    if (model) {
        CHECK(model->n_eog >= 1 && model->eog[0] == 7);
        for (int i = 0; i < model->n_eog; i++) CHECK_MSG(model->eog[i] >= 0 && model->eog[i] < 32, "eog[%d] = %d", i, model->eog[i]);
    }
    dsp_model_destroy(model);
    free(file.p);
}

/* load-time quantization takes the types core/quant writes and refuses others before touching a
 * tensor (a Q4_1 request used to leave the rows unwritten: garbage weights, no error) */
static void test_quantize_types(void) {
    gb_model m;
    gb_model_init(&m, "qwen3");
    buf file;
    dsp_model *model = NULL;
    CHECK_MSG(load(&m, &file, &model) == DSP_OK, "%s", dsp_last_error());
    if (model) {
        const uint32_t before = model->w.layers[0].ffn_down->type;
        dsp_status st = dsp_model_quantize(model, DSP_Q4_1, 1, false);
        CHECK_MSG(st == DSP_ERR_UNSUPPORTED && strstr(dsp_last_error(), "Q4_1"), "status %d: %s", st, st ? dsp_last_error() : "quantized");
        CHECK(model->w.layers[0].ffn_down->type == before);
        CHECK_MSG(dsp_model_quantize(model, DSP_Q8_0, 1, false) == DSP_OK, "%s", dsp_last_error());
        CHECK(model->w.layers[0].ffn_down->type == DSP_Q8_0);
        check_runs(model);
    }
    dsp_model_destroy(model);
    free(file.p);
}

int main(void) {
    DSP_RUN(test_valid_tiny_models);
    DSP_RUN(test_wrapped_head_product);
    DSP_RUN(test_zero_head_size);
    DSP_RUN(test_layer_count_bounded);
    DSP_RUN(test_shapes_checked);
    DSP_RUN(test_eog_ids_in_vocab);
    DSP_RUN(test_quantize_types);
    return dsp_test_summary();
}
