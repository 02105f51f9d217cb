/* The `avx512vnni` variant's own kernels: the block-type matmuls (all but Q2_K and Q3_K) with
 * their integer dot products on AVX512-VNNI (vpdpbusd, 256-bit vectors); every other kernel of
 * that table is the AVX2 one (dispatch.c).
 *
 * Design: the row groups run the AVX2 variant's bodies with X8_VNNI 1 (x86_gemm_x8.h: Q8_0,
 * Q4_0, Q4_1; x86_gemm_k.h: Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), so results are bit-identical to the
 * avx2 variant (same exact integer sums, same float operations per row); rows outside whole
 * groups go to the AVX2 kernel itself (x86_gemm_x8.h types) or the same tiles on a group packed
 * on the fly (x86_gemm_k.h). AVX-512VL gives 32 vector registers, so a call takes up to 8
 * activation rows (a decode step of 8 slots) in one pass over each weight block; Q8_0 calls of
 * that size run on biased weights (x86_gemm_x8.h KIND_Q8_0_BIASED), one vpdpbusd per run and
 * row, after summing each activation block once per call.
 * Calls of Z_MIN_ROWS rows or more (prefill) run their pairs of whole groups on 512-bit vectors
 * (x86_gemm_z16.h: 16 weight rows per vector, the same per-lane operations) and only a group
 * left over, or rows past the groups, on the 256-bit tiles. Calls of a decode step's few rows
 * (1-8 of Q4_K, Q5_K, Q6_K; 2-8 of Q8_0, Q5_0, Q5_1) run their whole groups on x86_vnni_rows.c's
 * 512-bit pairs.
 * Compiled for these extensions by pragma, as x86_avx2.c is for AVX2; dispatch.c hands these
 * functions out only when cpuid reports AVX512F, AVX512VL, AVX512BW and AVX512-VNNI too.
 */
#if defined(__x86_64__) || defined(__i386__)

#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")

#include <immintrin.h>
#include <string.h>

#include "../kernels.h"
#include "../quant_k.h"
#include "x86_vnni_rows.h"

#define X8_VNNI 1
#define X8_TILE 8
#include "x86_gemm_x8.h"
#define K_TILE 8
#include "x86_gemm_k.h"
#include "x86_gemm_z16.h"

static inline __attribute__((always_inline)) void gemm_vnni(int kind, gemm_fn avx2, float *y, int ldy,
                                                            const gemm_weight *w, int o0, int o1, const act_rows *x,
                                                            int n_rows, int accumulate) {
    if (n_rows >= Z_MIN_ROWS) {
        /* a prefill chunk: pairs of groups on the 512-bit tiles, the rest below */
        const int zend = z_pairs_end(w, o0, o1);
        if (zend > o0) gemm_z_rows(1, kind, y, ldy, w, o0, zend, x, n_rows, accumulate);
        o0 = zend;
        if (o0 >= o1) return;
    }
    int grouped_end = w->x8 ? w->n_out / ROW_GROUP * ROW_GROUP : 0;
    if (grouped_end > o1) grouped_end = o1;
    if (kind == KIND_Q8_0 && n_rows <= X8_TILE && grouped_end > o0) {
        /* a decode step's few rows: 128 * each activation block's integer sum, once per call */
        const int nb = w->n_in / QK;
        int32_t abias[X8_TILE * MAX_ROW_LEN / QK];
        for (int r = 0; r < n_rows; r++)
            for (int b = 0; b < nb; b++) {
                const int8_t *a = x->qs + (size_t)r * w->n_in + (size_t)b * QK;
                int sum = 0;
                for (int i = 0; i < QK; i++) sum += a[i];
                abias[r * nb + b] = 128 * sum;
            }
        gemm_x8_groups(KIND_Q8_0_BIASED, y, ldy, w, o0, grouped_end, x, n_rows, accumulate, abias);
    } else {
        gemm_x8_groups(kind, y, ldy, w, o0, grouped_end, x, n_rows, accumulate, NULL);
    }
    const int first = o0 > grouped_end ? o0 : grouped_end;
    if (first < o1) avx2(y, ldy, w, first, o1, x, n_rows, accumulate); /* no whole group left there */
}

void gemm_q8_0_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    /* NOTE: 2-8 rows only (see gemm_k_or_rows) */
    if (n_rows >= 2 && n_rows <= ROWS_SPLIT_MAX) o0 = gemm_rows_vnni(ROWS_Q8_0, y, ldy, w, o0, o1, x, n_rows, accumulate);
    if (o0 < o1) gemm_vnni(KIND_Q8_0, gemm_q8_0_avx2, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q4_0_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_vnni(KIND_Q4_0, gemm_q4_0_avx2, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q4_1_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_vnni(KIND_Q4_1, gemm_q4_1_avx2, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

/* The quant_k.h kinds: a prefill chunk's pairs of groups on the 512-bit tiles, everything else
 * (and a group left over) on x86_gemm_k.h's tiles. */
static inline __attribute__((always_inline)) void gemm_k_vnni(int kind, float *y, int ldy, const gemm_weight *w, int o0,
                                                              int o1, const act_rows *x, int n_rows, int accumulate) {
    const int zend = n_rows >= Z_MIN_ROWS ? z_pairs_end(w, o0, o1) : o0;
    if (zend == o0) {
        gemm_k(kind, y, ldy, w, o0, o1, x, n_rows, accumulate);
        return;
    }
    gemm_z_rows(0, kind, y, ldy, w, o0, zend, x, n_rows, accumulate);
    if (zend < o1) gemm_k(kind, y, ldy, w, zend, o1, x, n_rows, accumulate);
}

/* The quant_k.h block types (x86_gemm_k.h's VNNI tiles); Q2_K and Q3_K stay on AVX2. A decode
 * step's few rows (min_rows .. ROWS_SPLIT_MAX) run their whole row groups on x86_vnni_rows.c's
 * kernels, the rest here.
 * NOTE: Q8_0, Q5_0 and Q5_1 go there from 2 rows on: at 2-4 rows the 256-bit tiles are bound by
 * their vpdpbusd count (one thread in cache, 4 rows: Q5_0 16.6 GB/s on the tile against 34.5 on
 * the pairs, Q8_0 36.4 against 48.8), which the pairs halve; a single row stays on the tiles,
 * where one-slot decode was measured (docs/benchmarks.md, "Batched decode on Zen 5"). */
static inline __attribute__((always_inline)) void gemm_k_or_rows(int kind, int rows_kind, int min_rows, float *y,
                                                                 int ldy, const gemm_weight *w, int o0, int o1,
                                                                 const act_rows *x, int n_rows, int accumulate) {
    if (n_rows >= min_rows && n_rows <= ROWS_SPLIT_MAX) o0 = gemm_rows_vnni(rows_kind, y, ldy, w, o0, o1, x, n_rows, accumulate);
    if (o0 < o1) gemm_k_vnni(kind, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q5_0_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k_or_rows(KIND_Q5_0, ROWS_Q5_0, 2, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q5_1_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k_or_rows(KIND_Q5_1, ROWS_Q5_1, 2, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q4_K_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k_or_rows(KIND_Q4_K, ROWS_Q4_K, 1, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q5_K_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k_or_rows(KIND_Q5_K, ROWS_Q5_K, 1, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q6_K_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k_or_rows(KIND_Q6_K, ROWS_Q6_K, 1, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

#endif /* x86 */
