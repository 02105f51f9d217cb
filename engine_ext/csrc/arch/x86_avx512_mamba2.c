/* The avx512vnni table's Mamba2 scan (contract in kernels.h): 16 state columns a vector, the
 * AVX2 kernel's two 8-lane sums as the halves of one 16-lane sum, folded and summed with the
 * same hsum256: bit for bit equal to the AVX2 variant and to the reference (mamba2.c). Four rows
 * go through the columns together (each its own operations, in its own order), sharing the
 * loads of B and C and keeping four sums in flight instead of one chain of dependent adds. */
#if defined(__x86_64__) || defined(__i386__)

#pragma GCC target("avx2,fma,avx512f,avx512vl")

#include <immintrin.h>

#include "../kernels.h"
#include "x86_avx2_math.h"

#define ROWS 4 /* rows a pass */

static inline float fold(__m512 acc) {
    return hsum256(_mm256_add_ps(_mm512_castps512_ps256(acc), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1))));
}

void mamba2_scan_avx512(float *S, const float *src, float *y, const float *x, const float *B, const float *C, float dA,
                        float dt, int p, int n) {
    const __m512 vdA = _mm512_set1_ps(dA);
    const int n16 = n & ~15;
    int i = 0;
    for (; i + ROWS <= p; i += ROWS) {
        float xdt[ROWS];
        __m512 vx[ROWS], acc[ROWS];
        for (int r = 0; r < ROWS; r++) {
            xdt[r] = x[i + r] * dt;
            vx[r] = _mm512_set1_ps(xdt[r]);
            acc[r] = _mm512_setzero_ps();
        }
        for (int j = 0; j < n16; j += 16) {
            const __m512 b = _mm512_loadu_ps(B + j), c = _mm512_loadu_ps(C + j);
            for (int r = 0; r < ROWS; r++) {
                const size_t at = (size_t)(i + r) * n + j;
                const __m512 s = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(src + at), vdA), _mm512_mul_ps(b, vx[r]));
                _mm512_storeu_ps(S + at, s);
                acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(s, c));
            }
        }
        for (int r = 0; r < ROWS; r++) {
            float *row = S + (size_t)(i + r) * n;
            const float *in = src + (size_t)(i + r) * n;
            float sum = fold(acc[r]);
            for (int j = n16; j < n; j++) {
                const float s = in[j] * dA + B[j] * xdt[r];
                row[j] = s;
                sum = sum + s * C[j];
            }
            y[i + r] = sum;
        }
    }
    for (; i < p; i++) {
        float *row = S + (size_t)i * n;
        const float *in = src + (size_t)i * n;
        const float xdt = x[i] * dt;
        const __m512 vx = _mm512_set1_ps(xdt);
        __m512 acc = _mm512_setzero_ps();
        for (int j = 0; j < n16; j += 16) {
            const __m512 s = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(in + j), vdA),
                                           _mm512_mul_ps(_mm512_loadu_ps(B + j), vx));
            _mm512_storeu_ps(row + j, s);
            acc = _mm512_add_ps(acc, _mm512_mul_ps(s, _mm512_loadu_ps(C + j)));
        }
        float sum = fold(acc);
        for (int j = n16; j < n; j++) {
            const float s = in[j] * dA + B[j] * xdt;
            row[j] = s;
            sum = sum + s * C[j];
        }
        y[i] = sum;
    }
}

#endif
