/* Every block-type matmul weight gets its row groups (kernels.h x8 layout), owned by the
 * engine. token_embd keeps its rows for the embedding lookup; as a tied output it is packed.
 * Packing runs at load on the engine's own thread pool, matrix by matrix (pack_task), and gives
 * each matrix's file pages back once it is packed (model_desc.release_rows).
 */
#define _GNU_SOURCE /* madvise flags */
#include <stdlib.h>
#ifdef __linux__
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "engine_internal.h"

static const int N_LAYER_MATRICES = 16;

static int n_matrices(const engine *e) {
    return 1 + N_LAYER_MATRICES * e->m.n_layers + (e->experts ? e->m.n_layers * (1 + 3 * e->m.n_expert) : 0);
}

static weight_t *matrix(engine *e, int i) {
    if (i == 0) return &e->m.output;
    const int dense = 1 + N_LAYER_MATRICES * e->m.n_layers;
    if (i >= dense) { /* MoE: the routers, then every expert slice (empty on dense layers) */
        i -= dense;
        if (i < e->m.n_layers) return &e->layers[i].moe_router;
        return &e->experts[i - e->m.n_layers];
    }
    layer_weights *L = &e->layers[(i - 1) / N_LAYER_MATRICES];
    weight_t *ws[] = {&L->attn_q,   &L->attn_k,  &L->attn_v,    &L->attn_output, &L->ffn_gate,
                      &L->ffn_up,   &L->ffn_down, &L->conv_in, &L->conv_out,   &L->ssm_qkv,
                      &L->ssm_z,    &L->ssm_beta, &L->ssm_alpha, &L->ssm_out,   &L->mamba_in,
                      &L->mamba_out};
    return ws[(i - 1) % N_LAYER_MATRICES];
}

/* Gives back the pages of [p, p + n) that lie wholly inside it: a read-only file mapping's
 * pages are reclaimed now (MADV_PAGEOUT, kernel 5.4+: out of the page cache too, where the
 * kernel allows it; not when `cached`) and unmapped (MADV_DONTNEED: resident memory drops even
 * where it does not); a later read faults them in again, from the file or, `cached`, from the
 * page cache while the kernel keeps them there. Never on anonymous memory (DONTNEED zeroes it):
 * only for model_desc.release_rows. Failures are harmless (the pages stay). */
static void release_pages(const void *p, size_t n, int cached) {
#ifdef __linux__
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + page - 1) & ~(page - 1), b = ((uintptr_t)p + n) & ~(page - 1);
    if (b <= a) return;
#ifdef MADV_PAGEOUT
    if (!cached) madvise((void *)a, b - a, MADV_PAGEOUT);
#endif
    madvise((void *)a, b - a, MADV_DONTNEED);
#else
    (void)p, (void)n, (void)cached;
#endif
}

/* One load's packing, shared by the pool's threads (pack_task): matrix i goes to packed + at[i]
 * (at[i] == at[i + 1]: nothing to pack); next is the next matrix to grab, ahead the next whose
 * file pages were not asked for yet (MADV_WILLNEED), done counts the matrices finished. */
typedef struct {
    engine *e;
    int n;
    const size_t *at;
    atomic_int next, ahead;
    atomic_uint done;
} pack_job;

/* How far ahead of the matrices being packed their file pages are asked for: the disk reads
 * the next ones while the threads repack the current ones. */
#define PACK_READ_AHEAD (64u << 20)

static size_t file_bytes(const weight_t *w) { return w->rows ? ggml_row_bytes(w->type, w->n_in) * (size_t)w->n_out : 0; }

/* Asks for a read-only file mapping's pages of [p, p + n) to be read now (asynchronously). */
static void will_need(const void *p, size_t n) {
#ifdef __linux__
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p & ~(page - 1), b = (uintptr_t)p + n;
    if (n) madvise((void *)a, b - a, MADV_WILLNEED);
#else
    (void)p, (void)n;
#endif
}

/* Threads grab matrices in order; each packs one, then gives its file pages back, so the file
 * pages held at once are those of the matrices in flight (one per thread) and what was read
 * ahead (page cache the kernel can reclaim), never the whole file beside its repacked copy. */
static void pack_task(void *ctx, int ith, int nth) {
    pack_job *j = ctx;
    engine *e = j->e;
    (void)ith, (void)nth;
    for (;;) {
        const int i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n) return;
        if (e->m.release_rows) /* ask for the file pages of the matrices up to PACK_READ_AHEAD on */
            for (int a = atomic_load(&j->ahead); a < j->n && j->at[a] < j->at[i] + PACK_READ_AHEAD; a = atomic_load(&j->ahead))
                if (atomic_compare_exchange_weak(&j->ahead, &a, a + 1) && j->at[a + 1] > j->at[a])
                    will_need(matrix(e, a)->rows, file_bytes(matrix(e, a)));
        weight_t *w = matrix(e, i);
        if (j->at[i + 1] > j->at[i]) {
            pack_x8(e->packed + j->at[i], w->rows, w->type, w->n_in, w->n_out);
            /* a tied output's rows stay in the page cache: the embedding reads a row of them a
             * token, and a paged-out row is a disk read in the step (qwen3.5-0.8b: 0.38 ms of
             * a 13 ms decode step with fresh tokens) */
            if (e->m.release_rows) release_pages(w->rows, file_bytes(w), w->rows == e->m.token_embd.rows);
        }
        threadpool_count_add(e->tp, &j->done);
    }
}

/* Packs every block-type matrix into one buffer, split by matrix among the pool's threads. */
int pack_weights(engine *e) {
    const int n = n_matrices(e);
    size_t *at = malloc(sizeof(size_t) * ((size_t)n + 1));
    if (!at) return 0;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        weight_t *w = matrix(e, i);
        at[i] = total;
        const size_t bytes = w->rows ? x8_bytes(w->type, w->n_in, w->n_out) : 0; /* a layer kind's absent matrices */
        total += (bytes + 63) & ~(size_t)63;
    }
    at[n] = total;
    e->packed_bytes = total;
    if (total == 0) {
        free(at);
        return 1;
    }
    e->packed = big_alloc(total, 0);
    if (!e->packed) {
        free(at);
        return 0;
    }
    for (int i = 0; i < n; i++) {
        weight_t *w = matrix(e, i);
        if (at[i + 1] > at[i]) w->x8 = e->packed + at[i];
    }
    pack_job job = {.e = e, .n = n, .at = at};
    atomic_init(&job.next, 0);
    atomic_init(&job.ahead, 0);
    atomic_init(&job.done, 0);
    threadpool_run(e->tp, pack_task, &job);
    threadpool_count_wait(e->tp, &job.done, (unsigned)n);
    threadpool_wait_idle(e->tp); /* no worker may touch job (this frame) after return */
    free(at);
    return 1;
}
