/* AVX2/FMA variants of the Gated DeltaNet kernels (contracts in kernels.h; portable reference
 * in recurrent.c). Eight channels (conv) or state columns (delta rule) per instruction, the
 * tails in scalar code, so any size works; sums run in another order than the reference's,
 * so results agree to float rounding, not bit for bit (the kernel variant is part of a pool's
 * fingerprint). */
#if defined(__x86_64__) || defined(__i386__)

#pragma GCC target("avx2,fma")

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../kernels.h"

static inline float hsum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

void ssm_conv_avx2(float *out, float *tail, const float *x, const float *w, int taps, int n, int ld) {
    const float *wl = w + (size_t)(taps - 1) * ld;
    int c = 0;
    for (; c + 8 <= n; c += 8) {
        __m256 sum = _mm256_setzero_ps();
        for (int j = 0; j < taps - 1; j++)
            sum = _mm256_fmadd_ps(_mm256_loadu_ps(w + (size_t)j * ld + c), _mm256_loadu_ps(tail + (size_t)j * ld + c), sum);
        sum = _mm256_fmadd_ps(_mm256_loadu_ps(wl + c), _mm256_loadu_ps(x + c), sum);
        _mm256_storeu_ps(out + c, sum);
    }
    for (; c < n; c++) {
        float sum = 0.0f;
        for (int j = 0; j < taps - 1; j++) sum = fmaf(w[(size_t)j * ld + c], tail[(size_t)j * ld + c], sum);
        out[c] = fmaf(wl[c], x[c], sum);
    }
    for (int j = 0; j + 1 < taps - 1; j++) memcpy(tail + (size_t)j * ld, tail + (size_t)(j + 1) * ld, sizeof(float) * n);
    memcpy(tail + (size_t)(taps - 2) * ld, x, sizeof(float) * n);
}

static inline float dot8(const float *a, const float *b, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum8(acc);
    for (; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

void l2norm_avx2(float *x, int n, float eps) {
    const float inv = 1.0f / sqrtf(dot8(x, x, n) + eps);
    const __m256 vinv = _mm256_set1_ps(inv);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vinv));
    for (; i < n; i++) x[i] *= inv;
}

void gdn_step_avx2(float *S, float *o, const float *q, const float *k, const float *v, float decay, float beta,
                   float scale, int d) {
    const __m256 vdecay = _mm256_set1_ps(decay);
    for (int j = 0; j < d; j++) {
        float *row = S + (size_t)j * d;
        __m256 acc = _mm256_setzero_ps();
        int i = 0;
        for (; i + 8 <= d; i += 8) {
            __m256 r = _mm256_mul_ps(_mm256_loadu_ps(row + i), vdecay);
            _mm256_storeu_ps(row + i, r);
            acc = _mm256_fmadd_ps(r, _mm256_loadu_ps(k + i), acc);
        }
        float sk = hsum8(acc);
        for (; i < d; i++) {
            row[i] *= decay;
            sk = fmaf(row[i], k[i], sk);
        }
        const float delta = (v[j] - sk) * beta;
        const __m256 vdelta = _mm256_set1_ps(delta);
        acc = _mm256_setzero_ps();
        i = 0;
        for (; i + 8 <= d; i += 8) {
            __m256 r = _mm256_fmadd_ps(vdelta, _mm256_loadu_ps(k + i), _mm256_loadu_ps(row + i));
            _mm256_storeu_ps(row + i, r);
            acc = _mm256_fmadd_ps(r, _mm256_loadu_ps(q + i), acc);
        }
        float sq = hsum8(acc);
        for (; i < d; i++) {
            row[i] = fmaf(delta, k[i], row[i]);
            sq = fmaf(row[i], q[i], sq);
        }
        o[j] = sq * scale;
    }
}

#endif
