/* AVX2/F16C variant of LFM2's short convolution (contract in kernels.h; reference in conv.c).
 *
 * Bit-identical to shortconv_generic: 8 channels per vector, the same multiply then add per tap
 * in tap order (no FMA: the reference rounds the product), the same tail in scalar code, and
 * f16 rows widened exactly by F16C. */
#if defined(__x86_64__) || defined(__i386__)

#pragma GCC target("avx2,f16c")

#include <immintrin.h>

#include "../fp16.h"
#include "../kernels.h"
#include "x86_avx2_recurrent.h"

void shortconv_cols_avx2(float *out, const float *gate, const void *const *rows, int rows_f16, const float *w, int taps,
                         int c0, int n) {
    int c = c0;
    for (; c + 8 <= n; c += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < taps; i++) {
            if (!rows[i]) continue;
            const __m256 x = rows_f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)rows[i] + c)))
                                      : _mm256_loadu_ps((const float *)rows[i] + c);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(w + (size_t)i * n + c), x));
        }
        _mm256_storeu_ps(out + c, _mm256_mul_ps(_mm256_loadu_ps(gate + c), acc));
    }
    for (; c < n; c++) {
        float acc = 0.0f;
        for (int i = 0; i < taps; i++) {
            if (!rows[i]) continue;
            const float x = rows_f16 ? fp16_to_f32(((const uint16_t *)rows[i])[c]) : ((const float *)rows[i])[c];
            acc = acc + w[(size_t)i * n + c] * x;
        }
        out[c] = gate[c] * acc;
    }
}

void shortconv_avx2(float *out, const float *gate, const void *const *rows, int rows_f16, const float *w, int taps,
                    int n) {
    shortconv_cols_avx2(out, gate, rows, rows_f16, w, taps, 0, n);
}

#endif
