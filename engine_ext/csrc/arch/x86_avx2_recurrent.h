/* The AVX2 recurrence kernels' shared pieces, so the avx512vnni variants (x86_avx512_recurrent.c)
 * run their leftover rows and channels through the very code of the AVX2 ones and stay bit for
 * bit equal to them (and, for the short convolution, to the reference). Include after a target
 * pragma that enables AVX2. */
#ifndef SLOTSERVE_X86_AVX2_RECURRENT_H
#define SLOTSERVE_X86_AVX2_RECURRENT_H

#include <immintrin.h>

/* The sum of 8 lanes: halves, then pairs, then the last two. */
static inline float hsum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

/* gdn_step_avx2 on one row of d: row = the row `in` decayed, then the delta rule with v = v[j]
 * (in == row: in place); writes the row's output *o. */
void gdn_row_avx2(float *row, const float *in, float *o, const float *q, const float *k, float v, float decay, float beta,
                  float scale, int d);

/* ssm_conv_avx2's outputs for channels c0 .. n - 1 (the tail is read, not shifted). */
void ssm_conv_cols_avx2(float *out, const float *tail, const float *x, const float *w, int taps, int c0, int n, int ld);

/* shortconv_avx2 for channels c0 .. n - 1. */
void shortconv_cols_avx2(float *out, const float *gate, const void *const *rows, int rows_f16, const float *w, int taps,
                         int c0, int n);

#endif
