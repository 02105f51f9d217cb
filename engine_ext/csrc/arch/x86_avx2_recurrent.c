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
#include "x86_avx2_recurrent.h"

void ssm_conv_cols_avx2(float *out, const float *tail, const float *x, const float *w, int taps, int c0, int n, int ld) {
    const float *wl = w + (size_t)(taps - 1) * ld;
    int c = c0;
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
}

void ssm_conv_avx2(float *out, float *tail, const float *src, const float *x, const float *w, int taps, int n, int ld) {
    ssm_conv_cols_avx2(out, src, x, w, taps, 0, n, ld);
    ssm_tail_shift(tail, src, x, taps, n, ld);
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

void gdn_row_avx2(float *row, const float *in, float *o, const float *q, const float *k, float v, float decay, float beta,
                  float scale, int d) {
    const __m256 vdecay = _mm256_set1_ps(decay);
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= d; i += 8) {
        __m256 r = _mm256_mul_ps(_mm256_loadu_ps(in + i), vdecay);
        _mm256_storeu_ps(row + i, r);
        acc = _mm256_fmadd_ps(r, _mm256_loadu_ps(k + i), acc);
    }
    float sk = hsum8(acc);
    for (; i < d; i++) {
        row[i] = in[i] * decay;
        sk = fmaf(row[i], k[i], sk);
    }
    const float delta = (v - sk) * beta;
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
    *o = sq * scale;
}

void gdn_step_avx2(float *S, const float *src, float *o, const float *q, const float *k, const float *v, float decay,
                   float beta, float scale, int d) {
    for (int j = 0; j < d; j++)
        gdn_row_avx2(S + (size_t)j * d, src + (size_t)j * d, o + j, q, k, v[j], decay, beta, scale, d);
}

/* Rows a block of gdn_steps_avx2 takes through all its tokens (8 KiB of state at d = 128, in L1
 * beside a token's q and k). */
#define GDN_HOT_ROWS 16

void gdn_steps_avx2(float *S, float *o, int ldo, const float *q, const float *k, const float *v, int ldv,
                    const float *decay, const float *beta, int ldg, float scale, int d, int n) {
    for (int j0 = 0; j0 < d; j0 += GDN_HOT_ROWS) {
        const int j1 = j0 + GDN_HOT_ROWS < d ? j0 + GDN_HOT_ROWS : d;
        for (int t = 0; t < n; t++) {
            const float *qt = q + (size_t)t * d, *kt = k + (size_t)t * d, *vt = v + (size_t)t * ldv;
            const float dc = decay[(size_t)t * ldg], bt = beta[(size_t)t * ldg];
            float *ot = o + (size_t)t * ldo;
            for (int j = j0; j < j1; j++) gdn_row_avx2(S + (size_t)j * d, S + (size_t)j * d, ot + j, qt, kt, vt[j], dc, bt, scale, d);
        }
    }
}

/* exp and log for the gates, Cephes' polynomials (as in the public "sse_mathfun" family): exp
 * by 2^n * exp(r), |r| <= ln2/2; log by the mantissa in [sqrt(1/2), sqrt(2)). About 1-2 ulp. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

static inline __m256 log8(__m256 x) { /* x > 0 (here 1 + exp(.) >= 1) */
    const __m256i bits = _mm256_castps_si256(x);
    __m256 e = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(127)));
    __m256 m = _mm256_castsi256_ps(
        _mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi32(0x007FFFFF)), _mm256_set1_epi32(0x3F800000)));
    const __m256 big = _mm256_cmp_ps(m, _mm256_set1_ps(1.41421356237f), _CMP_GT_OQ); /* m in [1, 2) */
    m = _mm256_blendv_ps(m, _mm256_mul_ps(m, _mm256_set1_ps(0.5f)), big);
    e = _mm256_add_ps(e, _mm256_and_ps(big, _mm256_set1_ps(1.0f)));
    const __m256 f = _mm256_sub_ps(m, _mm256_set1_ps(1.0f));
    __m256 y = _mm256_set1_ps(7.0376836292e-2f);
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(-1.1514610310e-1f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.1676998740e-1f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(-1.2420140846e-1f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.4249322787e-1f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(-1.6668057665e-1f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(2.0000714765e-1f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(-2.4999993993e-1f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(3.3333331174e-1f));
    const __m256 f2 = _mm256_mul_ps(f, f);
    y = _mm256_mul_ps(_mm256_mul_ps(y, f), f2);
    y = _mm256_fmadd_ps(e, _mm256_set1_ps(-2.12194440e-4f), y);
    y = _mm256_fnmadd_ps(f2, _mm256_set1_ps(0.5f), y);
    return _mm256_fmadd_ps(e, _mm256_set1_ps(0.693359375f), _mm256_add_ps(f, y));
}

void gdn_gates_avx2(float *alpha, float *beta, const float *dt, const float *a, int n) {
    const __m256 one = _mm256_set1_ps(1.0f), twenty = _mm256_set1_ps(20.0f);
    int h = 0;
    for (; h + 8 <= n; h += 8) {
        const __m256 x = _mm256_add_ps(_mm256_loadu_ps(alpha + h), _mm256_loadu_ps(dt + h));
        const __m256 sp = _mm256_blendv_ps(log8(_mm256_add_ps(one, exp8(x))), x, _mm256_cmp_ps(x, twenty, _CMP_GT_OQ));
        _mm256_storeu_ps(alpha + h, exp8(_mm256_mul_ps(sp, _mm256_loadu_ps(a + h))));
        const __m256 nb = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_loadu_ps(beta + h));
        _mm256_storeu_ps(beta + h, _mm256_div_ps(one, _mm256_add_ps(one, exp8(nb))));
    }
    for (; h < n; h++) {
        const float x = alpha[h] + dt[h];
        alpha[h] = expf((x > 20.0f ? x : logf(1.0f + expf(x))) * a[h]);
        beta[h] = 1.0f / (1.0f + expf(-beta[h]));
    }
}

#endif
