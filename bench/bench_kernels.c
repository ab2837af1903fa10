/* bench_kernels: the matmul kernels alone, one thread, on random weights of real widths.
 *
 *   bench_kernels [--type q8_0|q4_0|q4_1|q4_k|q5_k|q6_k] [--in 1024] [--mb 64] [--isa NAME] [--f32 | --panel] [--json]
 *
 * For 1, 2, 4, 9, 17 activation rows: one pass over --mb MiB of weight rows (more than the caches,
 * as in decoding) per measurement; for 64 and 512 rows (prefill) a 4 MiB slice. Figures are
 * the fastest of 7 in thread CPU time (the development machines are shared: wall time measures
 * the neighbours, and even CPU time rises when they thrash the caches and the memory bus, so the
 * least disturbed run is the figure), as weight GB/s (rows 1-17), GMAC/s, and time relative to 1 row. --f32 runs the
 * f32-activation path (today's --precision f32) instead of the 8-bit one; --panel the panel matmul
 * (ops.h "panel order", what the backend runs for the panel types) instead of the row-major one. */
#include "backend/cpu/ops.h"
#include "core/dtype.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}
static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const char *tname = "q8_0", *isa = NULL;
    int64_t in = 1024, mb = 64;
    int json = 0, f32 = 0, panel = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--type") && i + 1 < argc) tname = argv[++i];
        else if (!strcmp(argv[i], "--in") && i + 1 < argc) in = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) isa = argv[++i];
        else if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--f32")) f32 = 1;
        else if (!strcmp(argv[i], "--panel")) panel = 1;
        else {
            fprintf(stderr, "usage: bench_kernels [--type T] [--in N] [--mb MIB] [--isa NAME] [--f32 | --panel] [--json]\n");
            return 2;
        }
    }
    uint32_t type = DSP_Q8_0;
    const struct { const char *n; uint32_t t; } types[] = {{"q8_0", DSP_Q8_0}, {"q4_0", DSP_Q4_0}, {"q4_1", DSP_Q4_1},
                                                          {"q4_k", DSP_Q4_K}, {"q5_k", DSP_Q5_K}, {"q6_k", DSP_Q6_K}};
    int found = 0;
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (!strcmp(tname, types[i].n)) type = types[i].t, found = 1;
    const dsp_cpu_ops *o = isa ? dsp_cpu_ops_get(isa) : dsp_cpu_ops_best();
    if (!found || !o || in < 256 || in % 256 || mb < 4 || mb > 4096 || (panel && (f32 || !dsp_cpu_panel_type(type)))) {
        fprintf(stderr, "bench_kernels: bad --type, --isa (not runnable here?), --in (a multiple of 256), --mb or --panel (panel types, not with --f32)\n");
        return 2;
    }
    const size_t rb = dsp_dtype_row_bytes(type, (uint64_t)in), qb = dsp_cpu_q8_row_bytes(in);
    const int64_t out = (int64_t)((size_t)mb << 20) / (int64_t)rb, out_pf = (int64_t)(4u << 20) / (int64_t)rb;
    uint8_t *w = aligned_alloc(64, (size_t)out * rb);
    const int max_x = 512;
    float *x = aligned_alloc(64, sizeof(float) * (size_t)(in * max_x)), *y = aligned_alloc(64, sizeof(float) * (size_t)(out * 17 > out_pf * max_x ? out * 17 : out_pf * max_x));
    uint8_t *xq = aligned_alloc(64, qb * max_x);
    float *scratch = aligned_alloc(64, sizeof(float) * DSP_CPU_MM_ROWS * (size_t)dsp_cpu_mm_stride(in));
    if (!w || !x || !y || !xq || !scratch) return 1;
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < (size_t)out * rb; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        w[i] = (uint8_t)s;
    }
    /* sane scales: overwrite each block's f16 scale(s) with 0x1000 (~6e-5): random bytes give inf/NaN */
    const int blk = (int)dsp_dtype_get(type)->block_elems, bb = (int)dsp_dtype_get(type)->block_bytes;
    for (int64_t r = 0; r < out; r++)
        for (int64_t b = 0; b < in / blk; b++) {
            uint8_t *p = w + (size_t)r * rb + (size_t)b * (size_t)bb;
            const int off = type == DSP_Q6_K ? 208 : 0, n16 = type == DSP_Q4_1 || type == DSP_Q4_K || type == DSP_Q5_K ? 2 : 1;
            for (int k = 0; k < n16; k++) p[off + 2 * k] = 0, p[off + 2 * k + 1] = 0x10;
        }
    for (int64_t i = 0; i < in * max_x; i++) x[i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f;
    for (int i = 0; i < max_x; i++) o->quantize_q8(x + (size_t)i * in, in, xq + (size_t)i * qb);
    /* panels of the whole matrix, and of the 4 MiB prefill slice (its own panels: a panel matrix has no row stride) */
    void *pw = panel ? aligned_alloc(64, (dsp_cpu_panel_bytes(type, in, out) + 63) / 64 * 64) : NULL;
    void *pw_pf = panel ? aligned_alloc(64, (dsp_cpu_panel_bytes(type, in, out_pf) + 63) / 64 * 64) : NULL;
    if (panel) {
        if (!pw || !pw_pf) return 1;
        dsp_cpu_make_panels(type, w, rb, in, out, pw);
        dsp_cpu_make_panels(type, w, rb, in, out_pf, pw_pf);
    }

    const int rows[] = {1, 2, 3, 5, 8, 9, 12, 16, 17, 64, 512};
    double ms1 = 0;
    if (json)
        printf("{\"schema\": \"dspark.bench_kernels/1\", \"isa\": \"%s\", \"type\": \"%s\", \"in\": %lld, \"path\": \"%s\", \"rows\": [", o->name,
               tname, (long long)in, panel ? "panel" : f32 ? "f32" : "q8");
    else
        printf("%s %s in=%lld (%s), thread CPU time, fastest of 7\n", o->name, tname, (long long)in,
               panel ? "panels, 8-bit activations" : f32 ? "f32 activations" : "8-bit activations");
    for (size_t k = 0; k < sizeof rows / sizeof *rows; k++) {
        const int n_x = rows[k];
        const int64_t nr = n_x > 17 ? out_pf : out;
        double t[7];
        for (int rep = 0; rep < 8; rep++) {
            const double t0 = cpu_ms();
            if (panel) o->matmul_panel(type, n_x > 17 ? pw_pf : pw, in, nr, 0, nr, xq, qb, n_x, y, nr);
            else if (f32) o->matmul(type, w, rb, in, 0, nr, x, in, n_x, y, nr, scratch);
            else o->matmul_q8(type, w, rb, in, 0, nr, xq, qb, n_x, y, nr);
            if (rep) t[rep - 1] = cpu_ms() - t0; /* the first pass warms up */
        }
        qsort(t, 7, sizeof *t, cmp_d);
        const double ms = t[0], bytes = (double)nr * (double)rb, macs = (double)nr * (double)in * n_x;
        if (n_x == 1) ms1 = ms;
        if (json)
            printf("%s{\"n_x\": %d, \"ms\": %.3f, \"weight_gb_s\": %.2f, \"gmac_s\": %.2f, \"rel_1\": %.3f}", k ? ", " : "", n_x, ms, bytes / ms / 1e6,
                   macs / ms / 1e6, n_x > 17 ? 0.0 : ms / ms1);
        else
            printf("  %3d rows: %8.2f ms  %6.2f GB/s of weights  %7.2f GMAC/s%s%.2f\n", n_x, ms, bytes / ms / 1e6, macs / ms / 1e6,
                   n_x > 17 ? "" : "  x1 row: ", n_x > 17 ? 0.0 * ms : ms / ms1);
    }
    if (json) printf("]}\n");
    free(w), free(x), free(y), free(xq), free(scratch), free(pw), free(pw_pf);
    return 0;
}
