/* A persistent pool of worker threads running one SPMD task at a time.
 *
 * `threadpool_run(tp, fn, ctx)` runs fn(ctx, ith, nth) on every thread (the caller is ith 0)
 * and returns when all have finished. Inside fn, `threadpool_barrier` separates phases.
 * Idle workers spin briefly for the next task, then sleep on a condition variable, so an idle
 * engine does not burn a core the Python event loop needs.
 */
#ifndef SLOTSERVE_THREADPOOL_H
#define SLOTSERVE_THREADPOOL_H

typedef struct threadpool threadpool;
typedef void (*threadpool_fn)(void *ctx, int ith, int nth);

/* NULL if a thread or the memory cannot be had; n_threads >= 1 counts the caller. */
threadpool *threadpool_create(int n_threads);
void threadpool_destroy(threadpool *tp);
int threadpool_size(const threadpool *tp);
/* Not reentrant: one run at a time (the engine serialises calls). */
void threadpool_run(threadpool *tp, threadpool_fn fn, void *ctx);
/* Every thread of the running task must call it the same number of times. */
void threadpool_barrier(threadpool *tp);

#endif
