/* hf_check A B [--quantize Q] [--threads N] [--quantize-a Q] [--threads-a N] [--close TOL]
 *
 * Loads two models (GGUF files or Hugging Face directories; --quantize / --threads apply to B, and
 * to A unless --quantize-a / --threads-a say otherwise) and runs the same teacher-forced token
 * sequence (300 tokens, every row's logits) through both; exits 0 only if every logit is
 * bit-identical, or with --close, if every logit is within TOL and the argmax of at least 90% of
 * the rows agrees. Used by tests/py/test_hf_models.py to prove that a directory and the GGUF made
 * from the same weights (same dtype, or quantized the same way) compute the same thing, that the
 * load-time quantizer is deterministic, and that a Q4_K model (no oracle) stays close. */
#include "model/forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *run(const char *path, const char *quant, int threads, int n, int *V) {
    dsp_model *m;
    dsp_model_params mp = dsp_model_default_params();
    mp.quantize = quant;
    mp.n_threads = threads;
    if (dsp_model_load(path, &mp, &m)) {
        fprintf(stderr, "hf_check: %s\n", dsp_last_error());
        exit(2);
    }
    dsp_fwd_params fp = dsp_fwd_default_params();
    fp.n_threads = threads;
    fp.n_ctx = (uint32_t)n;
    fp.max_batch_tokens = n;
    fp.max_logits = n;
    dsp_fwd *f;
    if (dsp_fwd_create(m, &fp, &f)) {
        fprintf(stderr, "hf_check: %s\n", dsp_last_error());
        exit(2);
    }
    *V = dsp_fwd_n_vocab(f);
    int32_t *ids = malloc((size_t)n * sizeof *ids), *seq = calloc((size_t)n, sizeof *seq), *pos = malloc((size_t)n * sizeof *pos);
    float *logits = malloc((size_t)n * (size_t)*V * sizeof *logits);
    uint32_t x = 12345;
    for (int i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        ids[i] = (int32_t)((x >> 8) % (uint32_t)*V);
        pos[i] = i;
    }
    dsp_kv_seq kv;
    dsp_fwd_seq_init(f, &kv);
    dsp_kv_seq *seqs[1] = {&kv};
    dsp_batch b = {n, ids, seq, pos, n, pos, 0, NULL};
    if (dsp_fwd_run(f, seqs, 1, &b, logits, NULL)) {
        fprintf(stderr, "hf_check: %s\n", dsp_last_error());
        exit(2);
    }
    dsp_kv_seq_free(dsp_fwd_kv(f), &kv);
    dsp_fwd_destroy(f);
    dsp_model_destroy(m);
    free(ids), free(seq), free(pos);
    return logits;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: hf_check A B [--quantize Q] [--threads N]\n");
        return 2;
    }
    const char *quant = NULL, *quant_a = NULL;
    int threads = 2, threads_a = 0, n = 300;
    double close = -1;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--quantize")) quant = argv[i + 1];
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--quantize-a")) quant_a = argv[i + 1];
        else if (!strcmp(argv[i], "--threads-a")) threads_a = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--close")) close = atof(argv[i + 1]);
    }
    int va, vb;
    float *a = run(argv[1], quant_a, threads_a ? threads_a : threads, n, &va), *b = run(argv[2], quant, threads, n, &vb);
    if (va != vb) {
        printf("FAIL: vocabularies differ (%d, %d)\n", va, vb);
        return 1;
    }
    size_t diff = 0, total = (size_t)n * (size_t)va;
    double worst = 0, se = 0, sa = 0;
    for (size_t i = 0; i < total; i++) {
        sa += (double)a[i] * a[i];
        if (memcmp(&a[i], &b[i], sizeof(float))) {
            diff++;
            double d = a[i] > b[i] ? a[i] - b[i] : b[i] - a[i];
            if (d > worst) worst = d;
            se += d * d;
        }
    }
    int agree = 0;
    for (int r = 0; r < n; r++) {
        int ia = 0, ib = 0;
        for (int v = 1; v < va; v++) {
            if (a[(size_t)r * va + v] > a[(size_t)r * va + ia]) ia = v;
            if (b[(size_t)r * va + v] > b[(size_t)r * va + ib]) ib = v;
        }
        agree += ia == ib;
    }
    bool ok = close < 0 ? diff == 0 : worst <= close && agree * 10 >= n * 9;
    printf("%s: %s vs %s%s%s: %zu of %zu logits differ (max |d| %.3g, rms %.4g of rms logit %.4g), argmax agrees on %d of %d rows\n",
           ok ? "ok" : "FAIL", argv[1], argv[2], quant ? " --quantize " : "", quant ? quant : "", diff, total, worst, sqrt(se / (double)total),
           sqrt(sa / (double)total), agree, n);
    free(a), free(b);
    return ok ? 0 : 1;
}
