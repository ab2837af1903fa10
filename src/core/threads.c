/* core/threads: see threads.h. */
#include "core/threads.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct worker {
    dsp_pool *pool;
    pthread_t th;
    int idx;
} worker;

/* Hand-off: a run publishes its job and bumps `gen`; idle workers spin on `gen` for a while (a
 * forward issues hundreds of runs a few microseconds apart, and a condition-variable wake-up costs
 * tens of microseconds on a VM), then sleep on the condition variable. The caller spins until
 * `active` reaches 0: workers are running by then, so that wait is short. */
#define SPIN_ITERS_DEFAULT 200 /* a few microseconds of pause instructions before a worker sleeps: longer spins win on an idle machine and lose badly on a busy one */

struct dsp_pool {
    int n;                 /* threads including the caller */
    int spin;              /* SPIN_ITERS_DEFAULT, or DSP_POOL_SPIN from the environment (0 = sleep at once) */
    worker *w;             /* n - 1 workers */
    pthread_mutex_t mu;
    pthread_cond_t cv_start;
    atomic_ulong gen;      /* bumped per run */
    atomic_bool stop;
    atomic_int sleepers;   /* workers blocked (or about to block) on cv_start */
    /* current job (written before gen is bumped, read after it is seen) */
    dsp_task_fn fn;
    void *ctx;
    int n_tasks;
    atomic_int next;
    atomic_int active;     /* workers still inside the current job */
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void work(dsp_pool *p, int thread) {
    for (;;) {
        int t = atomic_fetch_add(&p->next, 1);
        if (t >= p->n_tasks) break;
        p->fn(p->ctx, t, thread);
    }
}

static void *worker_main(void *arg) {
    worker *w = arg;
    dsp_pool *p = w->pool;
    unsigned long seen = 0;
    for (;;) {
        for (int i = 0; i < p->spin && atomic_load(&p->gen) == seen && !atomic_load(&p->stop); i++) cpu_relax();
        if (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv_start, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) break;
        seen = atomic_load(&p->gen);
        work(p, w->idx);
        atomic_fetch_sub(&p->active, 1);
    }
    return NULL;
}

dsp_status dsp_pool_create(int n_threads, dsp_pool **out) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024) return dsp_error(DSP_ERR_INVALID_ARG, "threads: %d (must be 1..1024)", n_threads);
    dsp_pool *p = calloc(1, sizeof *p);
    if (!p) return dsp_error(DSP_ERR_NOMEM, "no memory for the thread pool");
    p->n = n_threads;
    const char *sp = getenv("DSP_POOL_SPIN");
    p->spin = sp && *sp ? atoi(sp) : SPIN_ITERS_DEFAULT;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->stop, false);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->next, 0);
    atomic_init(&p->active, 0);
    if (n_threads > 1) {
        p->w = calloc((size_t)n_threads - 1, sizeof *p->w);
        if (!p->w) {
            dsp_pool_destroy(p);
            return dsp_error(DSP_ERR_NOMEM, "no memory for the thread pool");
        }
        for (int i = 0; i < n_threads - 1; i++) {
            p->w[i].pool = p;
            p->w[i].idx = i + 1;
            if (pthread_create(&p->w[i].th, NULL, worker_main, &p->w[i]) != 0) {
                p->n = i + 1; /* destroy joins only the started ones */
                dsp_pool_destroy(p);
                return dsp_error(DSP_ERR_INTERNAL, "cannot start worker thread %d", i + 1);
            }
        }
    }
    *out = p;
    return DSP_OK;
}

void dsp_pool_destroy(dsp_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n - 1; i++) pthread_join(p->w[i].th, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_start);
    free(p->w);
    free(p);
}

int dsp_pool_size(const dsp_pool *p) { return p->n; }

void dsp_pool_run(dsp_pool *p, int n_tasks, dsp_task_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (p->n == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store(&p->next, 0);
    atomic_store(&p->active, p->n - 1);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: a worker either sees it or is counted in sleepers */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv_start);
        pthread_mutex_unlock(&p->mu);
    }
    work(p, 0);
    for (unsigned i = 0; atomic_load(&p->active) > 0; i++) {
        cpu_relax();
        if (i > (unsigned)p->spin / 16) sched_yield(); /* a worker may be descheduled (busy machine): let it run */
    }
}

int dsp_physical_cores(void) {
    /* count distinct (physical id, core id) pairs in /proc/cpuinfo */
    FILE *f = fopen("/proc/cpuinfo", "r");
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online < 1) online = 1;
    if (!f) return (int)online;
    char line[256];
    int phys = -1, cores = 0;
    int seen[1024][2];
    int n_seen = 0;
    while (fgets(line, sizeof line, f)) {
        int v;
        if (sscanf(line, "physical id : %d", &v) == 1) phys = v;
        else if (sscanf(line, "core id : %d", &v) == 1) {
            bool dup = false;
            for (int i = 0; i < n_seen; i++)
                if (seen[i][0] == phys && seen[i][1] == v) dup = true;
            if (!dup && n_seen < 1024) {
                seen[n_seen][0] = phys;
                seen[n_seen][1] = v;
                n_seen++;
                cores++;
            }
        }
    }
    fclose(f);
    return cores > 0 && cores <= online ? cores : (int)online;
}
