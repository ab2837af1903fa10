/* tests/dsp_stats.h: the chi-square goodness-of-fit test of the statistical sampling tests
 * (test_spec_verify.c, test_drafter.c). */
#ifndef DSP_TEST_STATS_H
#define DSP_TEST_STATS_H

#include <math.h>

/* regularized upper incomplete gamma Q(a, x): series below a + 1, Lentz continued fraction above */
static inline double gamma_q(double a, double x) {
    if (x <= 0) return 1.0;
    double lg = lgamma(a);
    if (x < a + 1) {
        double sum = 1.0 / a, term = sum;
        for (int n = 1; n < 10000; n++) {
            term *= x / (a + n);
            sum += term;
            if (fabs(term) < fabs(sum) * 1e-15) break;
        }
        return 1.0 - sum * exp(-x + a * log(x) - lg);
    }
    double b = x + 1 - a, c = 1e300, d = 1 / b, h = d;
    for (int i = 1; i < 10000; i++) {
        double an = -i * (i - a);
        b += 2;
        d = an * d + b;
        if (fabs(d) < 1e-300) d = 1e-300;
        c = b + an / c;
        if (fabs(c) < 1e-300) c = 1e-300;
        d = 1 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1) < 1e-15) break;
    }
    return exp(-x + a * log(x) - lg) * h;
}

/* p-value of observed counts (n samples) against the law (n_bins probabilities); bins with an
 * expected count below 5 are pooled */
static inline double chi2_pvalue(const double *law, const long *count, int n_bins, long n) {
    double stat = 0, pool_e = 0;
    long pool_o = 0;
    int bins = 0;
    for (int i = 0; i < n_bins; i++) {
        double e = law[i] * (double)n;
        if (e < 5) {
            pool_e += e, pool_o += count[i];
            continue;
        }
        stat += ((double)count[i] - e) * ((double)count[i] - e) / e;
        bins++;
    }
    if (pool_e > 0) {
        stat += ((double)pool_o - pool_e) * ((double)pool_o - pool_e) / (pool_e > 1e-12 ? pool_e : 1e-12);
        bins++;
    }
    return gamma_q((bins - 1) / 2.0, stat / 2.0);
}

#endif
