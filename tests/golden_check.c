/* golden_check FIXTURE.json MODEL.gguf [--tol T] [--threads N] [--backend cpu|cuda] [--kv-type f16|bf16]
 *              [--precision q8|f32] [--relative 0|1]
 * golden_check --probe-cuda      exit 0 if the CUDA backend can run here, 77 (and a SKIP line) if not
 *
 * Compares dspark's forward pass with a Hugging Face transformers golden fixture
 * (tests/fixtures/golden/README.md), for every prompt of the fixture:
 *   1. teacher-forced: prompt + HF's 64 greedy tokens in one prefill; at every step row, each of
 *      HF's top-20 logits must match ours within T (absolute), and our argmax must equal HF's
 *      token wherever HF's top-1/top-2 margin exceeds 2T (below that, a near-tie may flip);
 *   2. free-running greedy decoding (one token per forward, the KV-cached path): our tokens must
 *      equal HF's up to the first step whose margin is <= 2T (after a legitimate near-tie flip the
 *      continuations differ and are not compared).
 * --relative 1 compares logits relative to the row's top-1 (x[t] - x[top1], HF's and ours), the
 * metric of 8-bit activations (a shift common to a row changes no probability); then the margin
 * criterion is T instead of 2T. --precision: the CPU activations (default q8, the engine's default).
 * A forward that fails (either step) fails the prompt. Prints one line per prompt and a summary
 * with the largest deviation; exit 1 on any failure, 77 when --backend cuda finds no GPU.
 * --fault-at S feeds an out-of-vocabulary token at free-running step S, so that the test can check
 * a forward error is a failure.
 * Driven by tests/py/test_golden.py (which makes the tiny models first). */
#include "model/forward.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int load_ids(json_t *arr, int32_t *out, int cap) {
    int n = (int)json_array_size(arr);
    if (n > cap) n = cap;
    for (int i = 0; i < n; i++) out[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
    return n;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--probe-cuda")) { /* exit 0 if the CUDA backend can run here, else 77 */
        dsp_backend_params bp = {.kind = DSP_BACKEND_CUDA};
        dsp_backend *be = NULL;
        if (dsp_backend_create(&bp, &be)) {
            printf("SKIP: %s\n", dsp_last_error());
            return 77;
        }
        dsp_backend_destroy(be);
        return 0;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: golden_check FIXTURE.json MODEL.gguf [--tol T] [--threads N]\n");
        return 2;
    }
    double tol = 5e-4; /* 3x the HF cached-vs-uncached noise of the fixtures (1.6e-4) */
    int threads = 2, max_prompt = 1 << 30, fault_at = -1, f32 = 0, relative = 0;
    dsp_backend_params bp = {.kind = DSP_BACKEND_CPU};
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tol")) tol = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--backend")) bp.kind = !strcmp(argv[i + 1], "cuda") ? DSP_BACKEND_CUDA : DSP_BACKEND_CPU;
        else if (!strcmp(argv[i], "--kv-type")) bp.kv_type = !strcmp(argv[i + 1], "bf16") ? DSP_BF16 : DSP_F16;
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--max-prompt-tokens")) max_prompt = atoi(argv[i + 1]); /* skip longer prompts */
        else if (!strcmp(argv[i], "--fault-at")) fault_at = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--precision")) f32 = !strcmp(argv[i + 1], "f32");
        else if (!strcmp(argv[i], "--relative")) relative = atoi(argv[i + 1]);
    }
    /* absolute: a flip needs the top-1/top-2 margin <= 2 T; relative (logits minus the row's top-1,
     * the 8-bit mode's metric): the margin's own error is one relative deviation, <= T */
    const double margin_tol = relative ? tol : 2 * tol;
    bp.f32_activations = f32;
    json_error_t jerr;
    json_t *fx = json_load_file(argv[1], JSON_ALLOW_NUL, &jerr); /* generated_text may hold NUL */
    if (!fx) {
        fprintf(stderr, "golden_check: %s: %s (line %d)\n", argv[1], jerr.text, jerr.line);
        return 2;
    }
    dsp_model *m;
    dsp_model_params mp = dsp_model_default_params();
    if (dsp_model_load(argv[2], &mp, &m)) {
        fprintf(stderr, "golden_check: %s\n", dsp_last_error());
        return 2;
    }
    json_t *prompts = json_object_get(fx, "prompts");
    int max_len = 0;
    for (size_t p = 0; p < json_array_size(prompts); p++) {
        json_t *pr = json_array_get(prompts, p);
        int n = (int)json_array_size(json_object_get(pr, "prompt_ids")) + (int)json_array_size(json_object_get(pr, "tokens"));
        if (n > max_len) max_len = n;
    }
    dsp_fwd_params fp = dsp_fwd_default_params();
    fp.n_threads = threads;
    fp.f32_activations = f32;
    if (bp.kind == DSP_BACKEND_CUDA) {
        if (dsp_backend_create(&bp, &fp.backend)) {
            printf("SKIP: %s\n", dsp_last_error());
            return 77;
        }
        printf("backend: %s\n", fp.backend->desc);
    }
    fp.n_ctx = (uint32_t)(max_len + 16);
    fp.max_batch_tokens = max_len + 16;
    dsp_fwd *f;
    if (dsp_fwd_create(m, &fp, &f)) {
        fprintf(stderr, "golden_check: %s\n", dsp_last_error());
        return 2;
    }
    int V = dsp_fwd_n_vocab(f), fails = 0;
    size_t cap = (size_t)max_len + 16;
    int32_t *ids = malloc(cap * sizeof *ids), *seq = calloc(cap, sizeof *seq), *pos = malloc(cap * sizeof *pos), *rows = malloc(cap * sizeof *rows);
    float *logits = malloc((size_t)V * 65 * sizeof(float));
    double worst = 0, sq = 0; /* sum of squared deviations over n_cmp compared logits */
    long n_cmp = 0;
    for (size_t p = 0; p < json_array_size(prompts); p++) {
        json_t *pr = json_array_get(prompts, p);
        const char *name = json_string_value(json_object_get(pr, "name"));
        int np = load_ids(json_object_get(pr, "prompt_ids"), ids, (int)cap);
        if (np > max_prompt) {
            printf("skip %-14s prompt %3d tokens (over --max-prompt-tokens %d)\n", name, np, max_prompt);
            continue;
        }
        int32_t hf[64];
        int steps = load_ids(json_object_get(pr, "tokens"), hf, 64);
        json_t *top_ids = json_object_get(pr, "top_ids"), *top_logits = json_object_get(pr, "top_logits"), *margins = json_object_get(pr, "margins");
        /* 1. teacher-forced */
        memcpy(ids + np, hf, (size_t)steps * sizeof *ids);
        int n = np + steps - 1; /* the last HF token's logits are not recorded */
        for (int i = 0; i < n; i++) pos[i] = i, seq[i] = 0;
        for (int s = 0; s < steps; s++) rows[s] = np - 1 + s;
        dsp_kv_seq kv;
        dsp_fwd_seq_init(f, &kv);
        dsp_kv_seq *seqs[1] = {&kv};
        dsp_batch b = {n, ids, seq, pos, steps, rows, 0, NULL};
        if (dsp_fwd_run(f, seqs, 1, &b, logits, NULL)) {
            fprintf(stderr, "golden_check: %s: %s\n", name, dsp_last_error());
            return 2;
        }
        double dev = 0;
        int bad_argmax = 0, bad_logit = 0;
        for (int s = 0; s < steps; s++) {
            const float *row = logits + (size_t)s * V;
            json_t *ti = json_array_get(top_ids, (size_t)s), *tl = json_array_get(top_logits, (size_t)s);
            const int id0 = (int)json_integer_value(json_array_get(ti, 0));
            const double hf0 = json_number_value(json_array_get(tl, 0));
            for (size_t k = (size_t)relative; k < json_array_size(ti); k++) {
                int id = (int)json_integer_value(json_array_get(ti, k));
                double d = fabs((double)row[id] - json_number_value(json_array_get(tl, k)));
                if (relative) d = fabs(((double)row[id] - row[id0]) - (json_number_value(json_array_get(tl, k)) - hf0));
                if (d > dev) dev = d;
                sq += d * d, n_cmp++;
                if (d > tol) bad_logit++;
            }
            double margin = json_number_value(json_array_get(margins, (size_t)s));
            if (margin > margin_tol && argmax(row, V) != hf[s]) bad_argmax++;
        }
        /* 2. free-running greedy on the KV-cached path */
        dsp_kv_seq_truncate(dsp_fwd_kv(f), &kv, 0);
        dsp_batch b2 = {np, ids, seq, pos, 1, &rows[0], 0, NULL};
        int agree = 0, diverged = 0, fwd_failed = 0;
        if (dsp_fwd_run(f, seqs, 1, &b2, logits, NULL) != DSP_OK) {
            fprintf(stderr, "golden_check: %s: free-running prefill: %s\n", name, dsp_last_error());
            fwd_failed = 1;
        }
        for (int s = 0; s < steps && !fwd_failed; s++) {
            int t = argmax(logits, V);
            if (t != hf[s]) {
                if (json_number_value(json_array_get(margins, (size_t)s)) > margin_tol) diverged = 1;
                break;
            }
            agree++;
            int32_t pp = np + s, sq0 = 0, r = 0, tt = s == fault_at ? V : t;
            dsp_batch b3 = {1, &tt, &sq0, &pp, 1, &r, 0, NULL};
            if (s + 1 < steps && dsp_fwd_run(f, seqs, 1, &b3, logits, NULL) != DSP_OK) {
                fprintf(stderr, "golden_check: %s: free-running step %d: %s\n", name, s + 1, dsp_last_error());
                fwd_failed = 1;
            }
        }
        dsp_kv_seq_free(dsp_fwd_kv(f), &kv);
        bool ok = !bad_logit && !bad_argmax && !diverged && !fwd_failed;
        if (!ok) fails++;
        if (dev > worst) worst = dev;
        printf("%-4s %-14s prompt %3d tokens: max |dlogit| %.2e, argmax mismatches %d, logits over tol %d, greedy %d/%d agree%s\n",
               ok ? "ok" : "FAIL", name, np, dev, bad_argmax, bad_logit, agree, steps,
               fwd_failed ? " (FORWARD ERROR)" : agree < steps ? (diverged ? " (DIVERGED at a clear margin)" : " (stopped at a near-tie)") : "");
    }
    printf("%s: %zu prompts, %d failed, worst |dlogit%s| %.3e, rms %.3e over %ld logits (tolerance %.2e, %s activations)\n", argv[1],
           json_array_size(prompts), fails, relative ? " rel. top-1" : "", worst, n_cmp ? sqrt(sq / (double)n_cmp) : 0.0, n_cmp, tol,
           f32 ? "f32" : "8-bit");
    free(ids), free(seq), free(pos), free(rows), free(logits);
    dsp_fwd_destroy(f);
    dsp_backend_destroy(fp.backend);
    dsp_model_destroy(m);
    json_decref(fx);
    return fails ? 1 : 0;
}
