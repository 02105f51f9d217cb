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

static inline __m512 exp512(__m512 x) {
    x = _mm512_min_ps(x, _mm512_set1_ps(88.0f));
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500E-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

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
