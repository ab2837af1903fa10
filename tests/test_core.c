/* Unit tests for core/: status messages, arena, dtype table and f16/bf16 conversion. */
#include "dsp_test.h"

#include "core/arena.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/threads.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include <math.h>

static void test_status(void) {
    CHECK_EQ_INT(dsp_error(DSP_ERR_FORMAT, "tensor '%s': bad", "x"), DSP_ERR_FORMAT);
    CHECK_EQ_STR(dsp_last_error(), "tensor 'x': bad");
    dsp_error_prefix("file %s", "a.gguf");
    CHECK_EQ_STR(dsp_last_error(), "file a.gguf: tensor 'x': bad");
    CHECK_EQ_STR(dsp_status_to_string(DSP_ERR_NOT_FOUND), "not found");
}

static void test_arena(void) {
    dsp_arena a;
    dsp_arena_init(&a, 64, 1000);
    char *p = dsp_arena_alloc(&a, 10);
    CHECK(p && ((uintptr_t)p & 15) == 0);
    char *q = dsp_arena_alloc(&a, 100); /* larger than a chunk */
    CHECK(q != NULL);
    CHECK(dsp_arena_alloc(&a, 2000) == NULL); /* over the cap */
    CHECK(dsp_arena_alloc(&a, SIZE_MAX) == NULL);
    char *s = dsp_arena_strndup(&a, "hello", 3);
    CHECK_EQ_STR(s, "hel");
    dsp_arena_destroy(&a);
}

static void test_dtype(void) {
    CHECK_EQ_INT(dsp_dtype_get(DSP_Q4_K)->block_bytes, 144);
    CHECK(dsp_dtype_get(4) == NULL); /* retired id */
    CHECK(dsp_dtype_get(1000) == NULL);
    CHECK_EQ_INT(dsp_dtype_row_bytes(DSP_Q8_0, 64), 68);
    CHECK_EQ_INT(dsp_dtype_row_bytes(DSP_Q8_0, 33), 0);
}

static void test_f16(void) {
    /* every half value round-trips exactly through float */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dsp_f16_to_f32((uint16_t)h);
        uint16_t back = dsp_f32_to_f16(f);
        int is_nan = ((h >> 10) & 0x1f) == 31 && (h & 0x3ff);
        if (!is_nan && back != h) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(dsp_f16_to_f32(0x3c00) == 1.0f);
    CHECK(dsp_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    CHECK(dsp_f32_to_f16(65520.0f) == 0x7c00);       /* rounds to inf */
    CHECK(dsp_f32_to_f16(1.0f + ldexpf(1, -11)) == 0x3c00); /* tie to even */
    CHECK(dsp_bf16_to_f32(0x3f80) == 1.0f);
}

/* ---- the worker pool: every task of every run exactly once, whatever the threads, the spin
 * budget (sleeping workers, adaptive spinning) and the gaps between runs ---- */

typedef struct pool_job {
    atomic_int *hits; /* per task */
    atomic_int bad_thread;
    int n_threads;
} pool_job;

static void pool_task(void *ctx, int task, int thread) {
    pool_job *j = ctx;
    atomic_fetch_add(&j->hits[task], 1);
    if (thread < 0 || thread >= j->n_threads) atomic_fetch_add(&j->bad_thread, 1);
}

static void pause_us(long us) {
    struct timespec t = {0, us * 1000};
    nanosleep(&t, NULL);
}

static void test_pool(void) {
    static const char *const spins[] = {"0", "50", NULL}; /* sleep at once; short spin; the default */
    static atomic_int hits[1000];
    for (int si = 0; si < 3; si++) {
        if (spins[si]) setenv("DSP_POOL_SPIN_US", spins[si], 1);
        else unsetenv("DSP_POOL_SPIN_US");
        for (int nt = 1; nt <= 4; nt++) {
            dsp_pool *p = NULL;
            CHECK(dsp_pool_create(nt, &p) == DSP_OK);
            if (!p) continue;
            CHECK_EQ_INT(dsp_pool_size(p), nt);
            int bad = 0;
            for (int run = 0; run < 200; run++) {
                const int n_tasks = run % 7 == 0 ? 1 : 1 + (run * 37) % 1000;
                for (int t = 0; t < n_tasks; t++) atomic_store(&hits[t], 0);
                pool_job j = {hits, 0, nt};
                dsp_pool_run(p, n_tasks, pool_task, &j);
                for (int t = 0; t < n_tasks; t++) bad += atomic_load(&hits[t]) != 1;
                bad += atomic_load(&j.bad_thread);
                if (run % 50 == 49) pause_us(2000); /* let workers exhaust their spin and sleep */
            }
            CHECK_MSG(!bad, "pool of %d threads (spin %s): %d tasks ran other than once", nt, spins[si] ? spins[si] : "default", bad);
            dsp_pool_run(p, 0, pool_task, NULL); /* no tasks: nothing runs */
            dsp_pool_destroy(p);
        }
    }
    unsetenv("DSP_POOL_SPIN_US");
    dsp_pool *p = NULL;
    CHECK(dsp_pool_create(0, &p) != DSP_OK && !p); /* bad sizes are errors */
    CHECK(dsp_pool_create(1025, &p) != DSP_OK && !p);
    CHECK(dsp_physical_cores() >= 1);
}

int main(void) {
    DSP_RUN(test_status);
    DSP_RUN(test_pool);
    DSP_RUN(test_arena);
    DSP_RUN(test_dtype);
    DSP_RUN(test_f16);
    return dsp_test_summary();
}
