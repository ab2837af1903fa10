/* core/threads: see threads.h. */
#include "core/threads.h"

#include <pthread.h>
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

struct dsp_pool {
    int n;                 /* threads including the caller */
    worker *w;             /* n - 1 workers */
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    unsigned long gen;     /* bumped per run */
    bool stop;
    /* current job */
    dsp_task_fn fn;
    void *ctx;
    int n_tasks;
    atomic_int next;
    int active;            /* workers still inside the current job */
};

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
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->gen == seen && !p->stop) pthread_cond_wait(&p->cv_start, &p->mu);
        if (p->stop) break;
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        work(p, w->idx);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0) pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

dsp_status dsp_pool_create(int n_threads, dsp_pool **out) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024) return dsp_error(DSP_ERR_INVALID_ARG, "threads: %d (must be 1..1024)", n_threads);
    dsp_pool *p = calloc(1, sizeof *p);
    if (!p) return dsp_error(DSP_ERR_NOMEM, "no memory for the thread pool");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    atomic_init(&p->next, 0);
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
    p->stop = true;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n - 1; i++) pthread_join(p->w[i].th, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_start);
    pthread_cond_destroy(&p->cv_done);
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
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store(&p->next, 0);
    p->active = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    work(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->active > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
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
