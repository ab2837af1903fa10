/* bench/bench_util.h: what the micro-benchmarks share: a monotonic clock and the median. */
#ifndef DSP_BENCH_UTIL_H
#define DSP_BENCH_UTIL_H

#include <stdlib.h>
#include <time.h>

static inline double bench_clock(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static inline double bench_now(void) { return bench_clock(CLOCK_MONOTONIC); }

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* the median of v[0..n) (sorts v) */
static inline double bench_median(double *v, int n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
