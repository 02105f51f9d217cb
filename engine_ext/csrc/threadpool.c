/* Persistent thread pool (contract in threadpool.h).
 *
 * Every wait (an idle worker waiting for a task, a thread waiting for a phase's units, the
 * caller waiting for the workers to leave) spins for a short while and then blocks: on Linux
 * on a futex, elsewhere by yielding. Spinning keeps the ~300 phase ends of a decode step cheap
 * on a quiet machine; blocking and the any-subset task rule keep a descheduled partner (a busy
 * 2-core box, the Python event loop) from stalling the caller.
 */
#define _GNU_SOURCE
#include "threadpool.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define IDLE_SPIN_NS 50000L    /* an idle worker polls this long for the next task */
#define PHASE_SPIN_NS 20000L  /* a thread waiting for a phase polls this long before blocking */

struct threadpool {
    int n_threads;             /* including the caller */
    pthread_t *workers;        /* [n_threads - 1] */
    atomic_uint job_seq;       /* bumped once per task (futex word) */
    atomic_uint n_done;        /* workers finished with the current task (futex word) */
    atomic_int stop;
    atomic_int n_sleepers;     /* threads blocked (or about to block) on any futex word */
    threadpool_fn fn;
    void *ctx;
};

typedef struct { threadpool *tp; int ith; } worker_arg;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Block while *word == val (may return spuriously; callers loop). */
static void block_on(atomic_uint *word, unsigned val) {
#ifdef __linux__
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
#else
    (void)word;
    (void)val;
    sched_yield();
#endif
}

static void wake_all(atomic_uint *word) {
#ifdef __linux__
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
    (void)word;
#endif
}

/* Wait until *word != val (or stop): spin spin_ns, then block. */
static void wait_change(threadpool *tp, atomic_uint *word, unsigned val, long spin_ns) {
    long deadline = 0;
    for (unsigned i = 0;; i++) {
        if (atomic_load(word) != val || atomic_load(&tp->stop)) return;
        cpu_relax();
        if ((i & 63) == 63) {
            long t = now_ns();
            if (deadline == 0) deadline = t + spin_ns;
            else if (t > deadline) break;
        }
    }
    atomic_fetch_add(&tp->n_sleepers, 1);
    while (atomic_load(word) == val && !atomic_load(&tp->stop)) block_on(word, val);
    atomic_fetch_sub(&tp->n_sleepers, 1);
}

/* After changing *word: wake whoever blocks on it. NOTE: seq_cst ordering of (change word,
 * read n_sleepers) here against (add n_sleepers, read word) in wait_change means a waiter
 * either sees the change or is counted and woken. */
static void publish(threadpool *tp, atomic_uint *word) {
    if (atomic_load(&tp->n_sleepers) > 0) wake_all(word);
}

void threadpool_count_add(threadpool *tp, atomic_uint *counter);

static void *worker_main(void *p) {
    worker_arg arg = *(worker_arg *)p;
    free(p);
    threadpool *tp = arg.tp;
    unsigned seen = 0;
    for (;;) {
        wait_change(tp, &tp->job_seq, seen, IDLE_SPIN_NS);
        if (atomic_load(&tp->stop)) break;
        seen = atomic_load(&tp->job_seq);
        tp->fn(tp->ctx, arg.ith, tp->n_threads);
        threadpool_count_add(tp, &tp->n_done);
    }
    return NULL;
}

threadpool *threadpool_create(int n_threads) {
    if (n_threads < 1) return NULL;
    threadpool *tp = calloc(1, sizeof(*tp));
    if (!tp) return NULL;
    tp->n_threads = n_threads;
    atomic_store(&tp->n_done, (unsigned)n_threads - 1); /* idle */
    tp->workers = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!tp->workers) {
        free(tp);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *arg = malloc(sizeof(*arg));
        if (arg) {
            arg->tp = tp;
            arg->ith = i;
        }
        if (!arg || pthread_create(&tp->workers[i - 1], NULL, worker_main, arg) != 0) {
            free(arg);
            tp->n_threads = i; /* join the ones started */
            threadpool_destroy(tp);
            return NULL;
        }
    }
    return tp;
}

void threadpool_destroy(threadpool *tp) {
    if (!tp) return;
    threadpool_wait_idle(tp);
    atomic_store(&tp->stop, 1);
    atomic_fetch_add(&tp->job_seq, 1);
    wake_all(&tp->job_seq);
    for (int i = 1; i < tp->n_threads; i++) pthread_join(tp->workers[i - 1], NULL);
    free(tp->workers);
    free(tp);
}

int threadpool_size(const threadpool *tp) { return tp->n_threads; }

void threadpool_wait_idle(threadpool *tp) {
    threadpool_count_wait(tp, &tp->n_done, (unsigned)tp->n_threads - 1);
}

int threadpool_busy(threadpool *tp) { return tp->n_threads - 1 - (int)atomic_load(&tp->n_done); }

void threadpool_run(threadpool *tp, threadpool_fn fn, void *ctx) {
    if (tp->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    threadpool_wait_idle(tp);
    tp->fn = fn;
    tp->ctx = ctx;
    atomic_store(&tp->n_done, 0);
    atomic_fetch_add(&tp->job_seq, 1); /* seq_cst: publishes fn, ctx and n_done */
    publish(tp, &tp->job_seq);
    fn(ctx, 0, tp->n_threads);
}

void threadpool_count_add(threadpool *tp, atomic_uint *counter) {
    atomic_fetch_add(counter, 1);
    publish(tp, counter);
}

void threadpool_count_wait(threadpool *tp, atomic_uint *counter, unsigned target) {
    for (;;) {
        unsigned v = atomic_load(counter);
        if (v >= target) return;
        wait_change(tp, counter, v, PHASE_SPIN_NS);
    }
}
