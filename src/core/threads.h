/* core/threads: a persistent worker pool. Threads are created once; dsp_pool_run hands out task
 * indices 0..n_tasks-1 through an atomic counter (the calling thread works too) and returns when
 * all are done. No allocation or thread creation per call.
 *
 * Determinism: which thread runs a task is not fixed, so a task must compute the same result
 * whichever thread runs it (its own output elements, reductions in a fixed order). Every kernel
 * in dspark follows that rule; it is what keeps logits batch-invariant. */
#ifndef DSP_CORE_THREADS_H
#define DSP_CORE_THREADS_H

#include "core/status.h"

typedef struct dsp_pool dsp_pool;
/* fn(ctx, task, thread): thread in 0..n_threads-1 indexes per-thread scratch */
typedef void (*dsp_task_fn)(void *ctx, int task, int thread);

dsp_status dsp_pool_create(int n_threads, dsp_pool **out);
void dsp_pool_destroy(dsp_pool *p);
int dsp_pool_size(const dsp_pool *p);
void dsp_pool_run(dsp_pool *p, int n_tasks, dsp_task_fn fn, void *ctx);

/* number of physical cores (not hyperthreads) if it can be told, else online CPUs */
int dsp_physical_cores(void);

#endif
