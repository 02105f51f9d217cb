/* The avx2 variant's prefill tiles (x86_avx2_tiles.c): calls of T8_ROWS activation rows or
 * more of the block types Q5_0, Q5_1, Q4_K, Q5_K and Q6_K. */
#ifndef SLOTSERVE_X86_AVX2_TILES_H
#define SLOTSERVE_X86_AVX2_TILES_H

#include "../kernels.h"

#define T8_ROWS 16 /* activation rows per tile: calls of fewer (decode steps) stay on the row-group kernels */

/* The gemm_fn contract (kernels.h) over the whole row groups of [o0, o1) only, for n_rows a
 * multiple of T8_ROWS (the caller runs the rows past the last whole tile); returns where the
 * groups end (o0 when it runs nothing: a type without tiles, a weight without row groups): the
 * caller runs the outputs from there to o1. */
int gemm_tiles_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows,
                    int accumulate);

#endif
