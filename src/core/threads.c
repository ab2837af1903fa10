/* core/threads: see threads.h. */
#include "core/threads.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct worker {
    dsp_pool *pool;
    pthread_t th;
    int idx;
} worker;

/* Hand-off: a run publishes its job and bumps `gen`; idle workers spin on `gen`, then sleep on
 * the condition variable once they have spun `spin_ns` without a job. A forward issues a few
 * pool runs per layer a few microseconds apart, and a condition-variable wake-up of 15 workers
 * costs tens of microseconds, so workers must still be spinning when the next run comes: the
 * budget (DSP_POOL_SPIN_US, default 1000 us) covers the gaps of a forward and the host work
 * between two tokens. Spinning only pays while each worker has a core of its own: on an
 * oversubscribed machine a spinning worker is descheduled as often as a sleeping one and takes
 * CPU time from the threads it waits for. So the budget adapts: a worker that ends a spin on a new
 * job measures how long ago the job was published; more than 50 us means it was not running while
 * it spun, and the pool's budget halves (to 0: sleep at once); a prompt start doubles it back, up
 * to the configured one (with a budget of 0 workers still spin 20 us first, which probes whether
 * the machine is free again). Spinning workers yield every ~20 us, and the caller yields once it
 * has waited ~20 us for the workers (a run takes a few microseconds on an idle machine; longer
 * means a worker was descheduled and needs the core).
 *
 * Layout: the job (written once per run, then only read) and each counter that many threads
 * write (`next`, `active`) or poll (`gen`) sit on their own cache lines, so polling workers do
 * not steal the line that claims tasks. */
#define SPIN_US_DEFAULT 1000
#define LINE 64

struct dsp_pool {
    _Alignas(LINE) dsp_task_fn fn; /* current job (written before gen is bumped, read after) */
    void *ctx;
    int n_tasks;
    int n;                  /* threads including the caller */
    int64_t spin_max_ns;    /* configured worker spin budget before sleeping (0 = sleep at once) */
    worker *w;              /* n - 1 workers */
    _Alignas(LINE) atomic_ulong gen; /* bumped per run */
    atomic_bool stop;
    _Atomic int64_t t_pub;  /* now_ns() when the current job was published */
    _Atomic int64_t spin_ns; /* current adaptive budget, 0..spin_max_ns */
    _Alignas(LINE) atomic_int next;   /* next task index to claim */
    _Alignas(LINE) atomic_int active; /* workers still inside the current job */
    _Alignas(LINE) atomic_int sleepers; /* workers blocked (or about to block) on cv_start */
    pthread_mutex_t mu;
    pthread_cond_t cv_start;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void work(dsp_pool *p, int thread) {
    const int n = p->n_tasks;
    for (;;) {
        int t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= n) break;
        p->fn(p->ctx, t, thread);
    }
}

#define PROBE_NS 20000 /* spin this long even at budget 0 */
#define LATE_NS 50000  /* a job seen this late by a spinning worker: the worker was not running */

/* spin until gen != seen or stop; false once the budget is spent */
static bool spin_wait(dsp_pool *p, unsigned long seen) {
    if (p->spin_max_ns <= 0) return false;
    int64_t budget = atomic_load_explicit(&p->spin_ns, memory_order_relaxed);
    if (budget < PROBE_NS) budget = PROBE_NS;
    const int64_t t0 = now_ns();
    int64_t last_yield = t0;
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(&p->gen, memory_order_acquire) != seen || atomic_load_explicit(&p->stop, memory_order_relaxed)) {
            /* adapt the budget: was this worker running while it spun? */
            const int64_t lag = now_ns() - atomic_load_explicit(&p->t_pub, memory_order_relaxed);
            const int64_t cur = atomic_load_explicit(&p->spin_ns, memory_order_relaxed);
            int64_t next = lag > LATE_NS ? cur / 2 : cur * 2 + PROBE_NS;
            if (next < PROBE_NS) next = 0;
            if (next > p->spin_max_ns) next = p->spin_max_ns;
            if (next != cur) atomic_store_explicit(&p->spin_ns, next, memory_order_relaxed);
            return true;
        }
        cpu_relax();
        if (i % 256 == 0) { /* a clock read per few microseconds of pauses */
            const int64_t t = now_ns();
            if (t - t0 > budget) return false;
            if (t - last_yield > 20000) sched_yield(), last_yield = t;
        }
    }
}

static void *worker_main(void *arg) {
    worker *w = arg;
    dsp_pool *p = w->pool;
    unsigned long seen = 0;
    for (;;) {
        if (!spin_wait(p, seen)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv_start, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) break;
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        work(p, w->idx);
        atomic_fetch_sub_explicit(&p->active, 1, memory_order_release);
    }
    return NULL;
}

dsp_status dsp_pool_create(int n_threads, dsp_pool **out) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024) return dsp_error(DSP_ERR_INVALID_ARG, "threads: %d (must be 1..1024)", n_threads);
    dsp_pool *p = aligned_alloc(LINE, (sizeof *p + LINE - 1) / LINE * LINE);
    if (!p) return dsp_error(DSP_ERR_NOMEM, "no memory for the thread pool");
    memset(p, 0, sizeof *p);
    p->n = n_threads;
    const char *sp = getenv("DSP_POOL_SPIN_US");
    long us = sp && *sp ? atol(sp) : SPIN_US_DEFAULT;
    p->spin_max_ns = (us < 0 ? 0 : us > 10000000 ? 10000000 : us) * 1000;
    atomic_init(&p->spin_ns, p->spin_max_ns);
    atomic_init(&p->t_pub, 0);
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
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->active, p->n - 1, memory_order_relaxed);
    atomic_store_explicit(&p->t_pub, now_ns(), memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: publishes the job; a worker either sees it or is counted in sleepers */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv_start);
        pthread_mutex_unlock(&p->mu);
    }
    work(p, 0);
    int64_t t0 = 0;
    for (unsigned i = 1; atomic_load_explicit(&p->active, memory_order_acquire) > 0; i++) {
        cpu_relax();
        if (i % 64 == 0) { /* a worker may be descheduled (busy machine): after ~20 us, let it run */
            const int64_t t = now_ns();
            if (!t0) t0 = t;
            else if (t - t0 > 20000) sched_yield();
        }
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
