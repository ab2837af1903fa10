/* tests/dsp_test.h: a minimal unit-test harness. Each test file defines test functions, lists them
 * in main via DSP_RUN, and returns dsp_test_summary(). A failed CHECK prints file:line and the
 * values, counts a failure and carries on within the test.
 *
 * Skips. A test that needs something absent (a fetched model, ../shared/testdata) calls
 * dsp_test_skip(why) and returns; dsp_test_summary() then exits with DSP_TEST_SKIP_CODE, which CTest
 * reports as "Skipped" (SKIP_RETURN_CODE), not "Passed". Where everything is supposed to be
 * present (scripts/test, i.e. CI, sets DSP_TEST_REQUIRE=1) a skip is a failure instead. */
#ifndef DSP_TEST_H
#define DSP_TEST_H

#include "dspark.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int dsp_test_failures = 0, dsp_test_checks = 0, dsp_test_ran = 0, dsp_test_failed_tests = 0, dsp_test_skips = 0;

#define DSP_TEST_SKIP_CODE 77 /* tests/CMakeLists.txt: SKIP_RETURN_CODE */

/* Something this test needs is absent: say what, and mark the run skipped (see the top). */
static void dsp_test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void dsp_test_skip(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "SKIP: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    dsp_test_skips++;
}

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        dsp_test_checks++;                                                                   \
        if (!(cond)) {                                                                       \
            dsp_test_failures++;                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);         \
        }                                                                                    \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                 \
    do {                                                                                     \
        dsp_test_checks++;                                                                   \
        if (!(cond)) {                                                                       \
            dsp_test_failures++;                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);         \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fputc('\n', stderr);                                                             \
        }                                                                                    \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                   \
    do {                                                                                     \
        long long _a = (long long)(a), _b = (long long)(b);                                  \
        dsp_test_checks++;                                                                   \
        if (_a != _b) {                                                                      \
            dsp_test_failures++;                                                             \
            fprintf(stderr, "%s:%d: CHECK_EQ_INT failed: %s = %lld, %s = %lld\n", __FILE__,  \
                    __LINE__, #a, _a, #b, _b);                                               \
        }                                                                                    \
    } while (0)

#define CHECK_EQ_STR(a, b)                                                                   \
    do {                                                                                     \
        const char *_a = (a), *_b = (b);                                                     \
        dsp_test_checks++;                                                                   \
        if (!_a || !_b || strcmp(_a, _b) != 0) {                                             \
            dsp_test_failures++;                                                             \
            fprintf(stderr, "%s:%d: CHECK_EQ_STR failed: %s = \"%s\", %s = \"%s\"\n",        \
                    __FILE__, __LINE__, #a, _a ? _a : "(null)", #b, _b ? _b : "(null)");     \
        }                                                                                    \
    } while (0)

#define DSP_RUN(fn)                                                                          \
    do {                                                                                     \
        int _before = dsp_test_failures;                                                     \
        fn();                                                                                \
        dsp_test_ran++;                                                                      \
        if (dsp_test_failures != _before) dsp_test_failed_tests++;                           \
        fprintf(stderr, "%s %s\n", dsp_test_failures == _before ? "ok  " : "FAIL", #fn);     \
    } while (0)

static inline int dsp_test_summary(void) {
    fprintf(stderr, "%d tests, %d checks, %d failed checks, %d skipped parts\n", dsp_test_ran, dsp_test_checks,
            dsp_test_failures, dsp_test_skips);
    if (dsp_test_failures) return 1;
    if (dsp_test_skips) {
        const char *req = getenv("DSP_TEST_REQUIRE");
        if (req && !strcmp(req, "1")) {
            fprintf(stderr, "FAIL: %d part(s) skipped, but DSP_TEST_REQUIRE=1 says everything they need is present\n",
                    dsp_test_skips);
            return 1;
        }
        return DSP_TEST_SKIP_CODE;
    }
    return 0;
}

/* Path of shared test data (../shared/testdata) or NULL if absent; tests then skip. */
static inline const char *dsp_test_shared_dir(void) {
    const char *d = getenv("DSP_TESTDATA");
    return (d && *d) ? d : NULL;
}
/* Path of the fetched models directory, or NULL. */
static inline const char *dsp_test_models_dir(void) {
    const char *d = getenv("DSP_MODELS");
    return (d && *d) ? d : NULL;
}

/* Load the default model (SmolLM2-135M-Instruct Q4_1) from $DSP_MODELS or ./models; NULL (after
 * printing a SKIP line) when it has not been fetched. */
static inline dsp_model *dsp_test_load_default_model(void) {
    const char *dir = dsp_test_models_dir();
    char path[1024];
    snprintf(path, sizeof path, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir ? dir : "models");
    dsp_model_params mp = dsp_model_default_params();
    dsp_model *m = NULL;
    if (dsp_model_load(path, &mp, &m) != DSP_OK) {
        dsp_test_skip("default model not available (%s); run scripts/fetch-models", dsp_last_error());
        return NULL;
    }
    return m;
}

/* The model a test runs on: $DSP_TEST_MODEL if set (e.g. a random-weight model of the default
 * model's shape on a machine the default model cannot be copied to), else the default model (NULL
 * after a SKIP line when it has not been fetched). *is_default says which. */
static inline dsp_model *dsp_test_load_model(bool *is_default) {
    const char *path = getenv("DSP_TEST_MODEL");
    *is_default = !(path && *path);
    if (*is_default) return dsp_test_load_default_model();
    dsp_model_params mp = dsp_model_default_params();
    dsp_model *m = NULL;
    if (dsp_model_load(path, &mp, &m) != DSP_OK) {
        fprintf(stderr, "DSP_TEST_MODEL %s: %s\n", path, dsp_last_error());
        return NULL;
    }
    return m;
}

/* DSP_TEST_BACKEND=cuda: run the test's forwards on the GPU (it then skips, exit 77, without one) */
static inline bool dsp_test_wants_cuda(void) {
    const char *b = getenv("DSP_TEST_BACKEND");
    return b && !strcmp(b, "cuda");
}

#endif
