/* The AVX2 Mamba2 scan (contract in kernels.h; reference in mamba2.c): 16 state columns a pass
 * in two 8-lane sums, folded and summed with hsum256, the tail in scalar code: the reference's
 * operations in its order, so bit for bit equal to it. */
#if defined(__x86_64__) || defined(__i386__)

#pragma GCC target("avx2,fma")

#include <immintrin.h>

#include "../kernels.h"
#include "x86_avx2_math.h"

void mamba2_scan_avx2(float *S, const float *src, float *y, const float *x, const float *B, const float *C, float dA,
                      float dt, int p, int n) {
    const __m256 vdA = _mm256_set1_ps(dA);
    for (int i = 0; i < p; i++) {
        float *row = S + (size_t)i * n;
        const float *in = src + (size_t)i * n;
        const float xdt = x[i] * dt;
        const __m256 vx = _mm256_set1_ps(xdt);
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        int j = 0;
        for (; j + 16 <= n; j += 16) {
            const __m256 s0 = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(in + j), vdA),
                                            _mm256_mul_ps(_mm256_loadu_ps(B + j), vx));
            const __m256 s1 = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(in + j + 8), vdA),
                                            _mm256_mul_ps(_mm256_loadu_ps(B + j + 8), vx));
            _mm256_storeu_ps(row + j, s0);
            _mm256_storeu_ps(row + j + 8, s1);
            acc0 = _mm256_add_ps(acc0, _mm256_mul_ps(s0, _mm256_loadu_ps(C + j)));
            acc1 = _mm256_add_ps(acc1, _mm256_mul_ps(s1, _mm256_loadu_ps(C + j + 8)));
        }
        float sum = hsum256(_mm256_add_ps(acc0, acc1));
        for (; j < n; j++) {
            const float s = in[j] * dA + B[j] * xdt;
            row[j] = s;
            sum = sum + s * C[j];
        }
        y[i] = sum;
    }
}

#endif
