/* A persistent pool of worker threads that help the caller with one task at a time.
 *
 * `threadpool_run(tp, fn, ctx)` wakes the workers, runs fn(ctx, 0, nth) on the caller and
 * returns when the caller's call returns; the workers run fn(ctx, ith, nth) whenever they get
 * the CPU. The task must therefore be written so that any subset of threads completes it:
 * work is split into units grabbed from shared counters, and a phase ends when its units are
 * done (threadpool_count_wait), not when every thread has arrived. A worker that was
 * descheduled simply finds the units taken. The next run (and destroy) first waits until
 * every worker has left the previous task; a caller that changes what the task reads, or
 * frees it, before then calls threadpool_wait_idle first (engine_forward does so before it
 * returns).
 *
 * Waits spin briefly and then block (a futex on Linux), so idle workers sleep.
 */
#ifndef SLOTSERVE_THREADPOOL_H
#define SLOTSERVE_THREADPOOL_H

#include <stdatomic.h>

typedef struct threadpool threadpool;
typedef void (*threadpool_fn)(void *ctx, int ith, int nth);

/* NULL if a thread or the memory cannot be had; n_threads >= 1 counts the caller. */
threadpool *threadpool_create(int n_threads);
void threadpool_destroy(threadpool *tp);
int threadpool_size(const threadpool *tp);
/* Not reentrant: one caller at a time (the engine serialises calls). */
void threadpool_run(threadpool *tp, threadpool_fn fn, void *ctx);
/* Wait until no worker is inside a task. */
void threadpool_wait_idle(threadpool *tp);
/* Workers inside a task now (0: idle; a snapshot, for tests). */
int threadpool_busy(threadpool *tp);
/* Add one to a completion counter and wake its waiters. */
void threadpool_count_add(threadpool *tp, atomic_uint *counter);
/* Wait until *counter >= target. */
void threadpool_count_wait(threadpool *tp, atomic_uint *counter, unsigned target);

#endif
