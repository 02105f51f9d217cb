/* The avx512vnni variant's decode-size matmuls of Q6_K, Q4_K, Q5_K, Q8_0, Q5_0 and Q5_1
 * (x86_vnni_rows.c). */
#ifndef SLOTSERVE_X86_VNNI_ROWS_H
#define SLOTSERVE_X86_VNNI_ROWS_H

#include "../kernels.h"

#define ROWS_MAX 4 /* most activation rows one pass of these kernels takes */
#define ROWS_SPLIT_MAX (2 * ROWS_MAX) /* most rows a call takes: two passes over each pair of row groups
                                         (more go to x86_gemm_k.h's and x86_gemm_x8.h's tiles) */

enum { ROWS_Q6_K, ROWS_Q4_K, ROWS_Q5_K, ROWS_Q8_0, ROWS_Q5_0, ROWS_Q5_1 };

/* The gemm_fn contract (kernels.h) for n_rows <= ROWS_SPLIT_MAX rows of weight type `kind`, over the
 * whole row groups of [o0, o1) only; returns where they end (o0 if w has no row groups): the
 * caller runs the rows from there to o1. */
int gemm_rows_vnni(int kind, float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows,
                   int accumulate);

#endif
