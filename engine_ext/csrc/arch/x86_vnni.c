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
 * Compiled for these extensions by pragma, as x86_avx2.c is for AVX2; dispatch.c hands these
 * functions out only when cpuid reports AVX512F, AVX512VL, AVX512BW and AVX512-VNNI too.
 */
#if defined(__x86_64__) || defined(__i386__)

#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")

#include <immintrin.h>
#include <string.h>

#include "../kernels.h"
#include "../quant_k.h"

#define X8_VNNI 1
#define X8_TILE 8
#include "x86_gemm_x8.h"
#define K_TILE 8
#include "x86_gemm_k.h"

static inline __attribute__((always_inline)) void gemm_vnni(int kind, gemm_fn avx2, float *y, int ldy,
                                                            const gemm_weight *w, int o0, int o1, const act_rows *x,
                                                            int n_rows, int accumulate) {
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
    gemm_vnni(KIND_Q8_0, gemm_q8_0_avx2, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q4_0_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_vnni(KIND_Q4_0, gemm_q4_0_avx2, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q4_1_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_vnni(KIND_Q4_1, gemm_q4_1_avx2, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

/* The quant_k.h block types (x86_gemm_k.h's VNNI tiles); Q2_K and Q3_K stay on AVX2. */
void gemm_q5_0_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k(KIND_Q5_0, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q5_1_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k(KIND_Q5_1, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q4_K_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k(KIND_Q4_K, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q5_K_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k(KIND_Q5_K, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q6_K_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k(KIND_Q6_K, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

#endif /* x86 */
