/* The avx512vnni table's recurrence kernels (contracts in kernels.h): the delta-rule update of
 * one Gated DeltaNet head (gdn_step), the causal conv step of its inputs (ssm_conv) and LFM2's
 * short convolution (shortconv), on 512-bit vectors.
 *
 * NOTE: each is bit-identical to its AVX2 variant (arch/x86_avx2_recurrent.c, x86_avx2_conv.c),
 * so the avx2 and avx512vnni tables keep one pool fingerprint and a snapshot of one restores into
 * the other (tests/engine/test_kernels_recurrent.py, test_kernels_conv.py):
 *   - gdn_step holds two state rows in one vector (lanes 0-7 columns i..i+7 of row j, lanes 8-15
 *     those of row j + 1), so each lane runs the AVX2 kernel's own operations in its order, the
 *     8-lane sums end with its horizontal sum and its scalar tail. What it gains is 8 rows in
 *     flight (4 vectors): the AVX2 kernel's one row at a time waits on one chain of dependent
 *     FMAs per pass.
 *   - gdn_steps (prefill: a run of tokens) takes 16 rows at a time through every token of the
 *     run, in a copy where each vector is one 64-byte load (8 columns of two rows side by side),
 *     and sums the 16 rows together with hsum8's adds in hsum8's tree (hsum8_x16); d not a
 *     multiple of 8, or over HOT_D, runs gdn_step's pairs instead. The state's 64 KiB is then
 *     neither streamed from L2 once a token nor split into 256-bit halves.
 *   - ssm_conv and shortconv are lane-wise (the same FMA or multiply-then-add per tap, in tap
 *     order), 16 channels a vector, the rest through the AVX2 variant's own code
 *     (x86_avx2_recurrent.h).
 */
#if defined(__x86_64__) || defined(__i386__)

#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl")

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../kernels.h"
#include "x86_avx2_recurrent.h"

static inline __m512 ld_rows2(const float *a, const float *b) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(a))),
                                               _mm256_castps_pd(_mm256_loadu_ps(b)), 1));
}

static inline void st_rows2(float *a, float *b, __m512 v) {
    _mm256_storeu_ps(a, _mm512_castps512_ps256(v));
    _mm256_storeu_ps(b, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

/* 8 floats at p in both halves */
static inline __m512 bcast8(const float *p) { return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(p)))); }

static inline float lo_sum(__m512 v) { return hsum8(_mm512_castps512_ps256(v)); }
static inline float hi_sum(__m512 v) { return hsum8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))); }

#define PAIRS 4     /* vectors of two rows in flight (gdn_step) */
#define HOT_PAIRS 8 /* the same in gdn_steps, whose block of 2 x HOT_PAIRS rows stays in L1 over its tokens */

/* Rows j .. j + 2 np - 1 of one token of the delta rule, read from src and written to S (np a
 * constant where inlined: the accumulators stay in registers). */
static inline __attribute__((always_inline)) void gdn_pairs(float *S, const float *src, float *o, const float *q, const float *k,
                                                            const float *v, float decay, float beta, float scale,
                                                            int d, int j, const int np) {
    const int d8 = d / 8 * 8;
    const __m512 vdecay = _mm512_set1_ps(decay);
    float *row[2 * HOT_PAIRS];
    const float *in[2 * HOT_PAIRS];
    for (int r = 0; r < 2 * np; r++) {
        row[r] = S + (size_t)(j + r) * d;
        in[r] = src + (size_t)(j + r) * d;
    }
    __m512 acc[HOT_PAIRS];
    for (int p = 0; p < np; p++) acc[p] = _mm512_setzero_ps();
    for (int i = 0; i < d8; i += 8) {
        const __m512 kk = bcast8(k + i);
        for (int p = 0; p < np; p++) {
            const __m512 r = _mm512_mul_ps(ld_rows2(in[2 * p] + i, in[2 * p + 1] + i), vdecay);
            st_rows2(row[2 * p] + i, row[2 * p + 1] + i, r);
            acc[p] = _mm512_fmadd_ps(r, kk, acc[p]);
        }
    }
    float delta[2 * HOT_PAIRS];
    for (int p = 0; p < np; p++) {
        const float sums[2] = {lo_sum(acc[p]), hi_sum(acc[p])};
        for (int h = 0; h < 2; h++) {
            float *rw = row[2 * p + h], sk = sums[h];
            const float *iw = in[2 * p + h];
            for (int i = d8; i < d; i++) {
                rw[i] = iw[i] * decay;
                sk = fmaf(rw[i], k[i], sk);
            }
            delta[2 * p + h] = (v[j + 2 * p + h] - sk) * beta;
        }
    }
    __m512 vdelta[HOT_PAIRS];
    for (int p = 0; p < np; p++) {
        vdelta[p] = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm256_set1_ps(delta[2 * p]))),
                                                        _mm256_castps_pd(_mm256_set1_ps(delta[2 * p + 1])), 1));
        acc[p] = _mm512_setzero_ps();
    }
    for (int i = 0; i < d8; i += 8) {
        const __m512 kk = bcast8(k + i);
        const __m512 qq = bcast8(q + i);
        for (int p = 0; p < np; p++) {
            const __m512 r = _mm512_fmadd_ps(vdelta[p], kk, ld_rows2(row[2 * p] + i, row[2 * p + 1] + i));
            st_rows2(row[2 * p] + i, row[2 * p + 1] + i, r);
            acc[p] = _mm512_fmadd_ps(r, qq, acc[p]);
        }
    }
    for (int p = 0; p < np; p++) {
        const float sums[2] = {lo_sum(acc[p]), hi_sum(acc[p])};
        for (int h = 0; h < 2; h++) {
            float *rw = row[2 * p + h], sq = sums[h];
            const float dl = delta[2 * p + h];
            for (int i = d8; i < d; i++) {
                rw[i] = fmaf(dl, k[i], rw[i]);
                sq = fmaf(rw[i], q[i], sq);
            }
            o[j + 2 * p + h] = sq * scale;
        }
    }
}

void gdn_step_avx512(float *S, const float *src, float *o, const float *q, const float *k, const float *v,
                     float decay, float beta, float scale, int d) {
    int j = 0;
    for (; j + 2 * PAIRS <= d; j += 2 * PAIRS) gdn_pairs(S, src, o, q, k, v, decay, beta, scale, d, j, PAIRS);
    for (; j < d; j++) gdn_row_avx2(S + (size_t)j * d, src + (size_t)j * d, o + j, q, k, v[j], decay, beta, scale, d);
}

#define HOT_D 256 /* widest row the interleaved block of gdn_steps_avx512 holds (16 KiB) */

/* hsum8 of both halves of eight vectors (16 rows: row 2p in the low half of a[p], row 2p + 1 in
 * the high one) at once, by the same adds in the same tree as hsum8 (x = lo4 + hi4; y0 = x0 + x2,
 * y1 = x1 + x3; y0 + y1): lane 4b + m of the result holds row 4m + b (a 4 x 4 transpose). */
static inline __m512 hsum8_x16(const __m512 *a) {
    __m512 l1[4], l2[2];
    for (int i = 0; i < 4; i++) /* blocks [a0 + a1, a2 + a3, b0 + b1, b2 + b3]: rows 4i .. 4i + 3 */
        l1[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int i = 0; i < 2; i++) /* block b: rows 8i + b, 8i + 4 + b, each (x0 + x2, x1 + x3) */
        l2[i] = _mm512_add_ps(_mm512_shuffle_ps(l1[2 * i], l1[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_ps(l1[2 * i], l1[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* block b: rows b, 4 + b, 8 + b, 12 + b, each y0 + y1 */
    return _mm512_add_ps(_mm512_shuffle_ps(l2[0], l2[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(l2[0], l2[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* gdn_steps_avx512's block of 16 rows of d (a multiple of 8, at most HOT_D) through n tokens in an
 * interleaved copy: vector (c, p) = columns 8c .. 8c + 7 of rows 2p (low half) and 2p + 1 (high
 * half), so each is one 512-bit load and store; the 16 rows' sums together (hsum8_x16), their
 * deltas and outputs lane-wise. Per row, the operations of gdn_pairs in the same order. */
static void gdn_block16(float *S, float *o, int ldo, const float *q, const float *k, const float *v, int ldv,
                        const float *decay, const float *beta, int ldg, float scale, int d, int n, int j) {
    _Alignas(64) float B[HOT_D / 8][HOT_PAIRS][16];
    const int nc = d / 8;
    for (int c = 0; c < nc; c++)
        for (int p = 0; p < HOT_PAIRS; p++)
            _mm512_store_ps(B[c][p], ld_rows2(S + (size_t)(j + 2 * p) * d + 8 * c, S + (size_t)(j + 2 * p + 1) * d + 8 * c));
    /* lane L of a sum vector holds row 4 (L % 4) + L / 4, and row r is in lane 4 (r % 4) + r / 4 */
    const __m512i tr = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m512i half[HOT_PAIRS]; /* pair p: row 2p's lane in the low half, row 2p + 1's in the high */
    for (int p = 0; p < HOT_PAIRS; p++) {
        const int r0 = 2 * p, r1 = 2 * p + 1;
        half[p] = _mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(4 * (r0 % 4) + r0 / 4),
                                          _mm512_set1_epi32(4 * (r1 % 4) + r1 / 4));
    }
    for (int t = 0; t < n; t++) {
        const float *kt = k + (size_t)t * d, *qt = q + (size_t)t * d;
        const __m512 vdecay = _mm512_set1_ps(decay[(size_t)t * ldg]);
        __m512 acc[HOT_PAIRS];
        for (int p = 0; p < HOT_PAIRS; p++) acc[p] = _mm512_setzero_ps();
        for (int c = 0; c < nc; c++) {
            const __m512 kk = bcast8(kt + 8 * c);
            for (int p = 0; p < HOT_PAIRS; p++) {
                const __m512 r = _mm512_mul_ps(_mm512_load_ps(B[c][p]), vdecay);
                _mm512_store_ps(B[c][p], r);
                acc[p] = _mm512_fmadd_ps(r, kk, acc[p]);
            }
        }
        /* delta of row r = (v_r - sk_r) beta, in the sums' lane order */
        const __m512 vt = _mm512_permutexvar_ps(tr, _mm512_loadu_ps(v + (size_t)t * ldv + j));
        const __m512 delta =
            _mm512_mul_ps(_mm512_sub_ps(vt, hsum8_x16(acc)), _mm512_set1_ps(beta[(size_t)t * ldg]));
        __m512 vdelta[HOT_PAIRS];
        for (int p = 0; p < HOT_PAIRS; p++) {
            vdelta[p] = _mm512_permutexvar_ps(half[p], delta);
            acc[p] = _mm512_setzero_ps();
        }
        for (int c = 0; c < nc; c++) {
            const __m512 kk = bcast8(kt + 8 * c), qq = bcast8(qt + 8 * c);
            for (int p = 0; p < HOT_PAIRS; p++) {
                const __m512 r = _mm512_fmadd_ps(vdelta[p], kk, _mm512_load_ps(B[c][p]));
                _mm512_store_ps(B[c][p], r);
                acc[p] = _mm512_fmadd_ps(r, qq, acc[p]);
            }
        }
        const __m512 out = _mm512_mul_ps(hsum8_x16(acc), _mm512_set1_ps(scale));
        _mm512_storeu_ps(o + (size_t)t * ldo + j, _mm512_permutexvar_ps(tr, out));
    }
    for (int c = 0; c < nc; c++)
        for (int p = 0; p < HOT_PAIRS; p++)
            st_rows2(S + (size_t)(j + 2 * p) * d + 8 * c, S + (size_t)(j + 2 * p + 1) * d + 8 * c, _mm512_load_ps(B[c][p]));
}

/* Each block of 2 x HOT_PAIRS rows (then single pairs, then a last odd row) through all n tokens:
 * every row runs the operations gdn_step_avx512 runs on it, token after token. */
void gdn_steps_avx512(float *S, float *o, int ldo, const float *q, const float *k, const float *v, int ldv,
                      const float *decay, const float *beta, int ldg, float scale, int d, int n) {
    int j = 0;
    if (d % 8 == 0 && d <= HOT_D)
        for (; j + 2 * HOT_PAIRS <= d; j += 2 * HOT_PAIRS) gdn_block16(S, o, ldo, q, k, v, ldv, decay, beta, ldg, scale, d, n, j);
    for (; j + 2 * HOT_PAIRS <= d; j += 2 * HOT_PAIRS)
        for (int t = 0; t < n; t++)
            gdn_pairs(S, S, o + (size_t)t * ldo, q + (size_t)t * d, k + (size_t)t * d, v + (size_t)t * ldv,
                      decay[(size_t)t * ldg], beta[(size_t)t * ldg], scale, d, j, HOT_PAIRS);
    for (; j + 2 <= d; j += 2)
        for (int t = 0; t < n; t++)
            gdn_pairs(S, S, o + (size_t)t * ldo, q + (size_t)t * d, k + (size_t)t * d, v + (size_t)t * ldv,
                      decay[(size_t)t * ldg], beta[(size_t)t * ldg], scale, d, j, 1);
    if (j < d)
        for (int t = 0; t < n; t++)
            gdn_row_avx2(S + (size_t)j * d, S + (size_t)j * d, o + (size_t)t * ldo + j, q + (size_t)t * d, k + (size_t)t * d,
                         v[(size_t)t * ldv + j], decay[(size_t)t * ldg], beta[(size_t)t * ldg], scale, d);
}

void ssm_conv_avx512(float *out, float *tail, const float *src, const float *x, const float *w, int taps, int n, int ld) {
    const float *wl = w + (size_t)(taps - 1) * ld;
    int c = 0;
    for (; c + 16 <= n; c += 16) {
        __m512 sum = _mm512_setzero_ps();
        for (int j = 0; j < taps - 1; j++)
            sum = _mm512_fmadd_ps(_mm512_loadu_ps(w + (size_t)j * ld + c), _mm512_loadu_ps(src + (size_t)j * ld + c), sum);
        _mm512_storeu_ps(out + c, _mm512_fmadd_ps(_mm512_loadu_ps(wl + c), _mm512_loadu_ps(x + c), sum));
    }
    ssm_conv_cols_avx2(out, src, x, w, taps, c, n, ld); /* the rest as ssm_conv_avx2 */
    ssm_tail_shift(tail, src, x, taps, n, ld);
}

void shortconv_avx512(float *out, const float *gate, const void *const *rows, int rows_f16, const float *w, int taps,
                      int n) {
    int c = 0;
    for (; c + 16 <= n; c += 16) {
        __m512 acc = _mm512_setzero_ps();
        for (int i = 0; i < taps; i++) {
            if (!rows[i]) continue;
            const __m512 x = rows_f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)rows[i] + c)))
                                      : _mm512_loadu_ps((const float *)rows[i] + c);
            acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_loadu_ps(w + (size_t)i * n + c), x));
        }
        _mm512_storeu_ps(out + c, _mm512_mul_ps(_mm512_loadu_ps(gate + c), acc));
    }
    shortconv_cols_avx2(out, gate, rows, rows_f16, w, taps, c, n); /* the rest as shortconv_avx2 */
}

#endif
