/* bench_sample: median time of dsp_sample_process for one row of V logits (default 262144, the
 * largest vocabularies in use) under typical parameter sets. Baseline: greedy (copy + argmax),
 * measured in the same run; every other case reports its ratio to it.
 *   bench_sample [--json] [--vocab V] [--reps N] */
#include "sample/sample.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int json = 0, reps = 21;
    int32_t V = 262144;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--vocab") && i + 1 < argc) V = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_sample [--json] [--vocab V] [--reps N]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 10000 || V < 2) return 2;
    size_t sb = dsp_sample_scratch_bytes(V), db = dsp_sample_dist_bytes(V);
    void *smem = aligned_alloc(16, sb), *dmem = aligned_alloc(16, db);
    float *x = malloc((size_t)V * sizeof *x);
    int32_t *hist = malloc(8192 * sizeof *hist);
    double *t = malloc((size_t)reps * sizeof *t);
    dsp_sample_scratch s;
    dsp_sample_dist d;
    if (!smem || !dmem || !x || !hist || !t || dsp_sample_scratch_init(&s, smem, sb, V) ||
        dsp_sample_dist_init(&d, dmem, db, V)) {
        fprintf(stderr, "bench_sample: setup failed: %s\n", dsp_last_error());
        return 1;
    }
    /* LLM-like logits: N(0, 2) plus a few strong favourites */
    dsp_rng r;
    dsp_rng_seed(&r, 1);
    for (int32_t i = 0; i < V; i++) {
        double u1 = dsp_rng_uniform(&r), u2 = dsp_rng_uniform(&r);
        x[i] = (float)(2.0 * sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2));
    }
    for (int i = 0; i < 16; i++) x[dsp_rng_next_u64(&r) % (uint64_t)V] += 8.0f + (float)i * 0.5f;
    for (int i = 0; i < 8192; i++) hist[i] = (int32_t)(dsp_rng_next_u64(&r) % (uint64_t)V);
    dsp_sample_history h;
    dsp_sample_history_init(&h, hist, 8192, 4096);
    h.len = 8192; /* 4096 prompt + 4096 generated */

    struct bcase { const char *name; dsp_sample_params p; int with_history; } cases[7];
    for (int i = 0; i < 7; i++) cases[i].p = dsp_sample_params_default(), cases[i].with_history = 0;
    cases[0].name = "greedy";                cases[0].p.temperature = 0.0f;
    cases[1].name = "temperature_only";
    cases[2].name = "top_k_40";              cases[2].p.top_k = 40;
    cases[3].name = "top_p_0.95";            cases[3].p.top_p = 0.95f;
    cases[4].name = "top_p_0.95_flat_T2";    cases[4].p.top_p = 0.95f; cases[4].p.temperature = 2.0f;
    cases[5].name = "min_p_0.05";            cases[5].p.min_p = 0.05f;
    cases[6].name = "k40_p0.9_penalties_8k"; cases[6].p.top_k = 40; cases[6].p.top_p = 0.9f;
    cases[6].p.presence_penalty = 0.5f; cases[6].p.frequency_penalty = 0.5f;
    cases[6].p.repetition_penalty = 1.1f; cases[6].with_history = 1;

    struct utsname un;
    uname(&un);
    double base = 0.0;
    if (json) printf("{\"bench\":\"sample_process\",\"machine\":\"%s %s\",\"n_vocab\":%d,\"reps\":%d,\"cases\":[",
                     un.machine, un.release, V, reps);
    for (int c = 0; c < 7; c++) {
        for (int k = 0; k < reps; k++) {
            double t0 = now_s();
            if (dsp_sample_process(x, cases[c].with_history ? &h : NULL, &cases[c].p, &s, &d)) {
                fprintf(stderr, "bench_sample: %s\n", dsp_last_error());
                return 1;
            }
            t[k] = now_s() - t0;
        }
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        double med = t[reps / 2];
        if (c == 0) base = med;
        if (json)
            printf("%s{\"name\":\"%s\",\"median_us\":%.1f,\"kept\":%d,\"ratio_to_greedy\":%.2f}",
                   c ? "," : "", cases[c].name, med * 1e6, d.n_kept, med / base);
        else
            printf("%-24s %9.1f us  kept %7d  x%.2f greedy\n", cases[c].name, med * 1e6, d.n_kept,
                   med / base);
    }
    if (json) printf("]}\n");
    free(smem);
    free(dmem);
    free(x);
    free(hist);
    free(t);
    return 0;
}
