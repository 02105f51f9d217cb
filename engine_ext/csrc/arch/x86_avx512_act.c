/* The avx512vnni table's SiLU gate (silu_mul; contract in kernels.h) on 512-bit vectors.
 *
 * NOTE: bit-identical to silu_mul_avx2 (arch/x86_avx2.c): exp512 is x86_avx2_math.h's exp256
 * operation for operation in 16 lanes (the same clamps, round to nearest, polynomial and scaling),
 * then the same divide and multiply, and the last n % 16 elements go through silu_mul_avx2 itself;
 * so the avx2 and avx512vnni tables keep one pool fingerprint (tests/engine/test_kernels.py).
 * Prefill runs it over every FFN row, every DeltaNet conv output and every head output.
 */
#if defined(__x86_64__) || defined(__i386__)

#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl")

#include <immintrin.h>

#include "../kernels.h"
#include "x86_avx512_math.h"

void silu_mul_avx512(float *out, const float *g, const float *u, int n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 gv = _mm512_loadu_ps(g + i);
        const __m512 e = exp512(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(gv), sign)));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + i)));
    }
    if (i < n) silu_mul_avx2(out + i, g + i, u + i, n - i);
}

#endif
