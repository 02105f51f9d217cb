/* The phases every block shares: matmul phases (a decode step's streamed runs, a prefill
 * step's dynamic chunks; mm_unit and mm_units for blocks that cut their own units), the norm
 * phase (with granite's scaled residual add first) and gemma3's post-norm.
 */
#include "engine_internal.h"

/* Output rows per dynamic matmul unit: a multiple of two ROW_GROUPs, about CHUNKS_PER_THREAD units
 * per thread (PAIRED_CHUNKS_PER_THREAD from PAIRED_ROWS rows), and at least MIN_GEMM_CHUNK.
 * NOTE: whole pairs of groups at every row count: the 512-bit kernels of a decode step
 * (arch/x86_vnni_rows.c) and of prefill (x86_gemm_z16.h) run two groups a vector, and a unit's
 * odd last group costs them as much as a pair (a chunk of 7 groups did the work of 8). */
int gemm_chunk(const mm_job *jobs, int n_jobs, int nth, int n_rows) {
    const int align = 2 * ROW_GROUP;
    int total = 0;
    for (int j = 0; j < n_jobs; j++) total += jobs[j].w->n_out;
    const int per_thread = n_rows >= PAIRED_ROWS ? PAIRED_CHUNKS_PER_THREAD : CHUNKS_PER_THREAD;
    int chunk = (total / (nth * per_thread) + align - 1) / align * align;
    return chunk < MIN_GEMM_CHUNK ? MIN_GEMM_CHUNK : chunk;
}

static inline int group_pad(int n) { return (n + ROW_GROUP - 1) / ROW_GROUP * ROW_GROUP; }

/* Rows [a, b) (multiples of ROW_GROUP) of the jobs' outputs laid end to end, each job's padded to
 * whole groups (so every call starts on a group, kernels.h), as one call per job they cover. */
static void mm_span(engine *e, const mm_job *jobs, int n_jobs, int a, int b, const act_rows *x, int n_rows) {
    int base = 0;
    for (int j = 0; j < n_jobs && base < b; j++) {
        const weight_t *w = jobs[j].w;
        const int o0 = a > base ? a - base : 0, o1 = b - base < w->n_out ? b - base : w->n_out;
        if (o0 < o1) e->kt->gemm[w->type](jobs[j].y, jobs[j].ldy, w, o0, o1, x, n_rows, jobs[j].accumulate);
        base += group_pad(w->n_out);
    }
}

/* A decode step's matmul phase (fewer than PAIRED_ROWS rows) streams: each thread's first unit
 * is one contiguous STREAM_PCT% / nth of the phase's output rows (the jobs' outputs laid end to
 * end), so most of the weights stream front to back as one run a thread; the rest goes in
 * STREAM_TAIL_CHUNKS small units a thread, taken by whichever thread is free (balance). Eight
 * units a thread of the general cut restarted the prefetchers eight times a matrix (measured:
 * lfm2-350m decode +12% tokens/s, docs/benchmarks.md); from 2 rows the cut is in whole pairs of
 * row groups (the 512-bit decode kernels run two groups a vector: gemm_chunk's NOTE). */
static void stream_phase(engine *e, int p, const mm_job *jobs, int n_jobs, const act_rows *x, int n_rows, int nth) {
    const int align = n_rows == 1 ? ROW_GROUP : 2 * ROW_GROUP;
    int total = 0;
    for (int j = 0; j < n_jobs; j++) total += group_pad(jobs[j].w->n_out);
    const int big = total * STREAM_PCT / 100 / (nth * align) * align, rest = total - nth * big;
    int small = (rest / (nth * STREAM_TAIL_CHUNKS) + align - 1) / align * align;
    if (small < MIN_GEMM_CHUNK) small = MIN_GEMM_CHUNK;
    const int n = nth + (rest + small - 1) / small;
    FOR_EACH_UNIT(e, p, n, u) {
        const int a = u < nth ? u * big : nth * big + (u - nth) * small, len = u < nth ? big : small;
        mm_span(e, jobs, n_jobs, a, a + len < total ? a + len : total, x, n_rows);
    }
    phase_end(e, p, n);
}

void matmul_phase(engine *e, int p, const mm_job *jobs, int n_jobs, const act_rows *x, int n_rows, int nth) {
    if (n_rows < PAIRED_ROWS) {
        stream_phase(e, p, jobs, n_jobs, x, n_rows, nth);
        return;
    }
    const int chunk = gemm_chunk(jobs, n_jobs, nth, n_rows);
    int n = 0;
    for (int j = 0; j < n_jobs; j++) n += (jobs[j].w->n_out + chunk - 1) / chunk;
    FOR_EACH_UNIT(e, p, n, u) {
        int j = 0, rest = u;
        for (; j < n_jobs; j++) {
            int units = (jobs[j].w->n_out + chunk - 1) / chunk;
            if (rest < units) break;
            rest -= units;
        }
        const weight_t *w = jobs[j].w;
        int o0 = rest * chunk, o1 = o0 + chunk < w->n_out ? o0 + chunk : w->n_out;
        e->kt->gemm[w->type](jobs[j].y, jobs[j].ldy, w, o0, o1, x, n_rows, jobs[j].accumulate);
    }
    phase_end(e, p, n);
}

/* One job's output chunk of a matmul unit list (as matmul_phase cuts it). */
void mm_unit(engine *e, const mm_job *jobs, int n_jobs, int chunk, int u, const act_rows *x, int n_rows) {
    int j = 0;
    for (; j < n_jobs; j++) {
        const int units = (jobs[j].w->n_out + chunk - 1) / chunk;
        if (u < units) break;
        u -= units;
    }
    const weight_t *w = jobs[j].w;
    const int o0 = u * chunk, o1 = o0 + chunk < w->n_out ? o0 + chunk : w->n_out;
    e->kt->gemm[w->type](jobs[j].y, jobs[j].ldy, w, o0, o1, x, n_rows, jobs[j].accumulate);
}

int mm_units(const mm_job *jobs, int n_jobs, int chunk) {
    int n = 0;
    for (int j = 0; j < n_jobs; j++) n += (jobs[j].w->n_out + chunk - 1) / chunk;
    return n;
}

/* rows: out = rmsnorm(x) * w, quantized when the next matmuls need it; add_proj: first the
 * scaled residual add the block before left in proj (add_scaled_proj) */
void norm_phase(engine *e, int p, const float *w, int quantize, int add_proj) {
    const int dim = e->m.dim, nu = n_row_units(e->n_rows);
    FOR_EACH_UNIT(e, p, nu, u) {
        int r0, r1;
        unit_rows(u, e->n_rows, &r0, &r1);
        for (int r = r0; r < r1; r++) {
            if (add_proj) add_scaled_proj(e, r);
            e->kt->rmsnorm(e->xb + (size_t)r * dim, e->x + (size_t)r * dim, w, dim, e->m.rms_eps);
            if (quantize) quantize_row(e, e->xb, dim, r);
        }
    }
    phase_end(e, p, nu);
}

/* rows: x += rmsnorm(proj) * w (a post-norm before the residual add; gemma3) */
void post_norm_phase(engine *e, int p, const float *w) {
    const int dim = e->m.dim, nu = n_row_units(e->n_rows);
    FOR_EACH_UNIT(e, p, nu, u) {
        int r0, r1;
        unit_rows(u, e->n_rows, &r0, &r1);
        for (int r = r0; r < r1; r++) {
            float *pr = e->proj + (size_t)r * dim, *xr = e->x + (size_t)r * dim;
            e->kt->rmsnorm(pr, pr, w, dim, e->m.rms_eps);
            for (int i = 0; i < dim; i++) xr[i] += pr[i];
        }
    }
    phase_end(e, p, nu);
}
