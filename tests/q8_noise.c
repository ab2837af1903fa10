/* q8_noise MODEL.gguf [--seqs N] [--len L] [--seed S] [--threads T]
 *
 * How far 8-bit activations move a model's logits: N random-token sequences of L tokens (an LCG,
 * deterministic) run through the forward pass twice, with f32 activations (which agree with
 * Hugging Face transformers to ~1e-5, tests/py/test_golden.py) and with 8-bit activations; over
 * the 20 largest f32 logits of every row it prints the rms and the largest |q8 - f32|, the
 * 99.9th percentile, the same for logits relative to the row's f32 top-1 token (x[t] - x[top1]:
 * a shift common to the whole row changes no probability and no argmax, and it is most of the
 * absolute difference), and how many rows change their argmax (with the largest f32 top-1/top-2
 * margin among those). This is the measurement behind the golden tests' 8-bit tolerance
 * (tests/fixtures/golden/README.md); it uses inputs independent of the fixtures' prompts. */
#include "model/forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static dsp_status run(const dsp_model *m, int f32, int threads, int len, const int32_t *ids, float *logits) {
    dsp_fwd_params fp = dsp_fwd_default_params();
    fp.n_threads = threads, fp.f32_activations = f32, fp.n_ctx = (uint32_t)len + 16, fp.max_batch_tokens = len, fp.max_logits = len;
    dsp_fwd *f;
    dsp_status st = dsp_fwd_create(m, &fp, &f);
    if (st) return st;
    int32_t *seq = calloc((size_t)len, sizeof *seq), *pos = malloc((size_t)len * sizeof *pos);
    if (!seq || !pos) {
        free(seq), free(pos), dsp_fwd_destroy(f);
        return DSP_ERR_NOMEM;
    }
    for (int i = 0; i < len; i++) pos[i] = i;
    dsp_kv_seq kv;
    dsp_fwd_seq_init(f, &kv);
    dsp_kv_seq *seqs[1] = {&kv};
    dsp_batch b = {len, ids, seq, pos, len, pos, 0, NULL}; /* logits of every row */
    st = dsp_fwd_run(f, seqs, 1, &b, logits, NULL);
    dsp_kv_seq_free(dsp_fwd_kv(f), &kv);
    free(seq), free(pos);
    dsp_fwd_destroy(f);
    return st;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: q8_noise MODEL.gguf [--seqs N] [--len L] [--seed S] [--threads T]\n");
        return 2;
    }
    int n_seqs = 20, len = 64, threads = 2;
    unsigned long long seed = 1;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--seqs")) n_seqs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--len")) len = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    }
    if (n_seqs < 1 || n_seqs > 10000 || len < 1 || len > 4096 || threads < 1) {
        fprintf(stderr, "q8_noise: --seqs 1..10000, --len 1..4096, --threads >= 1\n");
        return 2;
    }
    dsp_model *m;
    dsp_model_params mp = dsp_model_default_params();
    if (dsp_model_load(argv[1], &mp, &m)) {
        fprintf(stderr, "q8_noise: %s\n", dsp_last_error());
        return 2;
    }
    const int V = m->hp.n_vocab, K = 20;
    float *a = malloc((size_t)V * len * sizeof(float)), *b = malloc((size_t)V * len * sizeof(float));
    int32_t *ids = malloc((size_t)len * sizeof *ids);
    double *devs = malloc((size_t)n_seqs * len * K * sizeof(double)), *rdevs = malloc((size_t)n_seqs * len * K * sizeof(double));
    if (!a || !b || !ids || !devs || !rdevs) return 1;
    size_t nd = 0;
    int flips = 0;
    double sq = 0, worst = 0, flip_margin = 0, rsq = 0, rworst = 0;
    unsigned long long s = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int q = 0; q < n_seqs; q++) {
        for (int i = 0; i < len; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            ids[i] = (int32_t)((s >> 33) % (unsigned long long)V);
        }
        if (run(m, 1, threads, len, ids, a) || run(m, 0, threads, len, ids, b)) {
            fprintf(stderr, "q8_noise: %s\n", dsp_last_error());
            return 1;
        }
        for (int r = 0; r < len; r++) {
            const float *x = a + (size_t)r * V, *y = b + (size_t)r * V;
            int top[20], ax = 0, ay = 0;
            for (int k = 0; k < K; k++) top[k] = -1;
            for (int v = 0; v < V; v++) { /* the K largest of x, insertion */
                if (y[v] > y[ay]) ay = v;
                int k = K;
                while (k > 0 && (top[k - 1] < 0 || x[v] > x[top[k - 1]])) k--;
                if (k >= K) continue;
                memmove(top + k + 1, top + k, (size_t)(K - 1 - k) * sizeof *top);
                top[k] = v;
            }
            ax = top[0];
            for (int k = 0; k < K; k++) {
                const double d = fabs((double)y[top[k]] - (double)x[top[k]]);
                const double rd = fabs(((double)y[top[k]] - y[top[0]]) - ((double)x[top[k]] - x[top[0]]));
                rdevs[nd] = rd, rsq += rd * rd;
                devs[nd++] = d, sq += d * d;
                if (d > worst) worst = d;
                if (rd > rworst) rworst = rd;
            }
            if (ax != ay) {
                flips++;
                const double mg = (double)x[top[0]] - (double)x[top[1]];
                if (mg > flip_margin) flip_margin = mg;
            }
        }
    }
    qsort(devs, nd, sizeof *devs, cmp_d);
    qsort(rdevs, nd, sizeof *rdevs, cmp_d);
    printf("%s: %d sequences x %d tokens, top-%d logits of every row:\n  |q8 - f32|          rms %.3e, p99.9 %.3e, max %.3e\n"
           "  relative to top-1   rms %.3e, p99.9 %.3e, max %.3e\n  argmax changed in %d of %d rows (largest f32 top-1/top-2 margin among them %.3e)\n",
           argv[1], n_seqs, len, K, sqrt(sq / (double)nd), devs[(size_t)(0.999 * (double)(nd - 1))], worst, sqrt(rsq / (double)nd),
           rdevs[(size_t)(0.999 * (double)(nd - 1))], rworst, flips, n_seqs * len, flip_margin);
    free(a), free(b), free(ids), free(devs), free(rdevs);
    dsp_model_destroy(m);
    return 0;
}
