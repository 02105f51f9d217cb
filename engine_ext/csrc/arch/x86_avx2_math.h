/* AVX2 math the x86 variants share, operation for operation: a horizontal sum, exp, the lane
 * mask of a key range. One definition, so every kernel that must repeat another's results (the
 * attention kernels of x86_avx2_attn.c and x86_avx512_attn.c) uses the same operations.
 * Include only from files compiled for AVX2 (their `#pragma GCC target`). */
#ifndef SLOTSERVE_X86_AVX2_MATH_H
#define SLOTSERVE_X86_AVX2_MATH_H

#include <immintrin.h>

/* ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) */
static inline float hsum256(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

/* exp(x), Cephes-style: x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial, scale by 2^n.
 * Inputs are clamped to [-87.3, 88.0] (outputs ~1e-38 .. 1.6e38); about 2 ulp. */
static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500E-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* exp256's lane 0 (its lanes are independent). NOTE: from a register, not through a stack buffer:
 * eight float stores then one 256-bit load could not be forwarded, and the stall sat on the
 * online softmax's critical path (about half of the attention tiles' softmax time). */
static inline float exp1(float x) { return _mm256_cvtss_f32(exp256(_mm256_set1_ps(x))); }

/* all-ones lanes i with a <= i < b, zero elsewhere */
static inline __m256 lane_range(int a, int b) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(b), idx);
    __m256i lo = _mm256_cmpgt_epi32(_mm256_set1_epi32(a), idx); /* i < a */
    return _mm256_castsi256_ps(_mm256_andnot_si256(lo, hi));
}

#endif
