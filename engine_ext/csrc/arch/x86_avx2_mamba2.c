/* The AVX2 Mamba2 scan (contract in kernels.h; reference in mamba2.c): 16 state columns a pass
 * in two 8-lane sums, folded and summed with hsum256, the tail in scalar code: the reference's
 * operations in its order, so bit for bit equal to it. Two rows go through the columns together
 * (each its own operations in its own order), sharing the loads of B and C and keeping four sums
 * in flight. */
#if defined(__x86_64__) || defined(__i386__)

#pragma GCC target("avx2,fma")

#include <immintrin.h>

#include "../kernels.h"
#include "x86_avx2_math.h"

/* rows i .. i + rows - 1 (rows 1 or 2) */
static inline void scan_rows(float *S, const float *src, float *y, const float *x, const float *B, const float *C,
                             float dA, float dt, int i, int rows, int n) {
    const __m256 vdA = _mm256_set1_ps(dA);
    float xdt[2];
    __m256 vx[2], acc0[2], acc1[2];
    for (int r = 0; r < rows; r++) {
        xdt[r] = x[i + r] * dt;
        vx[r] = _mm256_set1_ps(xdt[r]);
        acc0[r] = acc1[r] = _mm256_setzero_ps();
    }
    const int n16 = n & ~15;
    for (int j = 0; j < n16; j += 16) {
        const __m256 b0 = _mm256_loadu_ps(B + j), b1 = _mm256_loadu_ps(B + j + 8);
        const __m256 c0 = _mm256_loadu_ps(C + j), c1 = _mm256_loadu_ps(C + j + 8);
        for (int r = 0; r < rows; r++) {
            const size_t at = (size_t)(i + r) * n + j;
            const __m256 s0 = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(src + at), vdA), _mm256_mul_ps(b0, vx[r]));
            const __m256 s1 = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(src + at + 8), vdA), _mm256_mul_ps(b1, vx[r]));
            _mm256_storeu_ps(S + at, s0);
            _mm256_storeu_ps(S + at + 8, s1);
            acc0[r] = _mm256_add_ps(acc0[r], _mm256_mul_ps(s0, c0));
            acc1[r] = _mm256_add_ps(acc1[r], _mm256_mul_ps(s1, c1));
        }
    }
    for (int r = 0; r < rows; r++) {
        float *row = S + (size_t)(i + r) * n;
        const float *in = src + (size_t)(i + r) * n;
        float sum = hsum256(_mm256_add_ps(acc0[r], acc1[r]));
        for (int j = n16; j < n; j++) {
            const float s = in[j] * dA + B[j] * xdt[r];
            row[j] = s;
            sum = sum + s * C[j];
        }
        y[i + r] = sum;
    }
}

void mamba2_scan_avx2(float *S, const float *src, float *y, const float *x, const float *B, const float *C, float dA,
                      float dt, int p, int n) {
    int i = 0;
    for (; i + 2 <= p; i += 2) scan_rows(S, src, y, x, B, C, dA, dt, i, 2, n);
    if (i < p) scan_rows(S, src, y, x, B, C, dA, dt, i, 1, n);
}

#endif
