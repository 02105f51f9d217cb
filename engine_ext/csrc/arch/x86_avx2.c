/* AVX2/FMA/F16C variants of the kernels (contracts in kernels.h).
 *
 * Design: this file alone is compiled for AVX2 (the pragma below), so the rest of the build
 * stays portable; dispatch.c only hands these functions out when cpuid reports AVX2, FMA and
 * F16C. Each kernel keeps one fixed per-row sequence of operations however many rows it is
 * given (see the NOTE in kernels.h): the row-tiled matmul micro-kernels are one function body
 * instantiated for 1..GEMM_TILE rows, and attention walks keys in blocks aligned to absolute
 * positions.
 */
#if defined(__x86_64__) || defined(__i386__)

#pragma GCC target("avx2,fma,f16c")

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../fp16.h"
#include "../kernels.h"
#include "../kv_q8.h"

#define GEMM_TILE 4        /* activation rows per micro-kernel call */
#define MAX_BLOCKS (MAX_ROW_LEN / QK) /* blocks of the longest row (kernels.h) */
#define ATTN_KEY_BLOCK 32  /* keys per attention block (aligned to absolute positions) */

/* ---- helpers --------------------------------------------------------------------------- */

static inline float hsum256(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

/* dot(a, b) over n floats: 8-lane FMA chunks, lane sum, then the scalar tail in order. */
static inline float dot_f32(const float *a, const float *b, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum256(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
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

static inline float exp1(float x) {
    float buf[8] = {x};
    _mm256_storeu_ps(buf, exp256(_mm256_loadu_ps(buf)));
    return buf[0];
}

/* all-ones lanes i with a <= i < b, zero elsewhere */
static inline __m256 lane_range(int a, int b) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(b), idx);
    __m256i lo = _mm256_cmpgt_epi32(_mm256_set1_epi32(a), idx); /* i < a */
    return _mm256_castsi256_ps(_mm256_andnot_si256(lo, hi));
}

/* ---- conversions, quantization, decoding ------------------------------------------------ */

void f32_to_f16_avx2(uint16_t *y, const float *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = fp32_to_f16(x[i]);
}

void f16_to_f32_avx2(float *y, const uint16_t *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) y[i] = fp16_to_f32(x[i]);
}

void quantize_q8a_avx2(int8_t *qs, float *d, float *s, const float *x, int k) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int b = 0; b < k / QK; b++) {
        const float *xb = x + b * QK;
        __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
        __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
        __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                  _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        float amax = _mm_cvtss_f32(m4);
        float db = amax / 127.0f;
        float id = db != 0.0f ? 1.0f / db : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        const int rnd = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, vid), rnd));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, vid), rnd));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, vid), rnd));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, vid), rnd));
        __m256i sum = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 1));
        /* pack 4x8 int32 -> 32 int8; packs work per 128-bit lane, so restore the order */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(qs + b * QK), p);
        d[b] = db;
        s[b] = db * (float)_mm_cvtsi128_si32(s4);
    }
}

void dequantize_row_f16_avx2(float *y, const void *x, int k) {
    f16_to_f32_avx2(y, (const uint16_t *)x, k);
}

void dequantize_row_q8_0_avx2(float *y, const void *x, int k) {
    const block_q8_0 *blk = (const block_q8_0 *)x;
    for (int b = 0; b < k / QK; b++) {
        __m256 d = _mm256_set1_ps(fp16_to_f32(blk[b].d));
        for (int j = 0; j < QK; j += 8) {
            __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk[b].qs + j)));
            _mm256_storeu_ps(y + b * QK + j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
        }
    }
}

static inline __m256i unpack_nibbles(const uint8_t *qs) {
    __m128i t = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(15));
}

static inline void dequantize_q4(float *y, const uint8_t *qs, float d, float m, int offset) {
    __m256i v = unpack_nibbles(qs);
    __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int j = 0; j < 4; j++) {
        __m256 f = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(parts[j]), _mm256_set1_epi32(offset)));
        _mm256_storeu_ps(y + 8 * j, _mm256_add_ps(_mm256_mul_ps(vd, f), vm));
    }
}

void dequantize_row_q4_0_avx2(float *y, const void *x, int k) {
    const block_q4_0 *blk = (const block_q4_0 *)x;
    for (int b = 0; b < k / QK; b++) dequantize_q4(y + b * QK, blk[b].qs, fp16_to_f32(blk[b].d), 0.0f, 8);
}

void dequantize_row_q4_1_avx2(float *y, const void *x, int k) {
    const block_q4_1 *blk = (const block_q4_1 *)x;
    for (int b = 0; b < k / QK; b++)
        dequantize_q4(y + b * QK, blk[b].qs, fp16_to_f32(blk[b].d), fp16_to_f32(blk[b].m), 0);
}

/* ---- matmul ------------------------------------------------------------------------------ */

/* the row-group kernel (x86_gemm_x8.h) in its maddubs/madd form, GEMM_TILE rows per call */
#define X8_VNNI 0
#define X8_TILE GEMM_TILE
#include "x86_gemm_x8.h"

/* Block weights: one weight row against R activation rows. Per row the float operations are:
 *   acc[b & 1] = fma(wd_b * ad_b, float(int dot of block b), acc[b & 1])   for b = 0 .. nb-1
 *   y = hsum(acc[0] + acc[1]) + dot_f32(wc, as, nb)
 * where wc is the per-block correction weight (Q4_1: m; Q4_0: -8 d; Q8_0: none). */
static inline __m256i block_weights(int kind, const void *w, int b, float *wd, float *wc) {
    if (kind == KIND_Q8_0) {
        const block_q8_0 *blk = (const block_q8_0 *)w + b;
        *wd = _cvtsh_ss(blk->d);
        return _mm256_loadu_si256((const __m256i *)blk->qs);
    } else if (kind == KIND_Q4_0) {
        const block_q4_0 *blk = (const block_q4_0 *)w + b;
        *wd = _cvtsh_ss(blk->d);
        *wc = -8.0f * *wd;
        return unpack_nibbles(blk->qs);
    } else {
        const block_q4_1 *blk = (const block_q4_1 *)w + b;
        *wd = _cvtsh_ss(blk->d);
        *wc = _cvtsh_ss(blk->m);
        return unpack_nibbles(blk->qs);
    }
}

static inline __m256 block_dot(int kind, __m256i wq, const int8_t *aq) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i a = _mm256_loadu_si256((const __m256i *)aq);
    __m256i p16;
    if (kind == KIND_Q8_0) /* signed x signed: |w| (unsigned) times a with w's sign */
        p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(a, wq));
    else /* nibbles are unsigned 0..15 */
        p16 = _mm256_maddubs_epi16(wq, a);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
}

static inline __attribute__((always_inline)) void gemm_block_tile(
    int kind, const int R, float *y, int ldy, const void *wrow, int o, const act_rows *x, int r0,
    int accumulate, float *wc) {
    const int k = x->k, nb = k / QK;
    __m256 acc0[GEMM_TILE], acc1[GEMM_TILE];
    for (int r = 0; r < R; r++) acc0[r] = acc1[r] = _mm256_setzero_ps();
    const int8_t *aq[GEMM_TILE];
    const float *ad[GEMM_TILE];
    for (int r = 0; r < R; r++) {
        aq[r] = x->qs + (size_t)(r0 + r) * k;
        ad[r] = x->d + (size_t)(r0 + r) * nb;
    }
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        float wd0, wd1;
        __m256i w0 = block_weights(kind, wrow, b, &wd0, &wc[b]);
        __m256i w1 = block_weights(kind, wrow, b + 1, &wd1, &wc[b + 1]);
        for (int r = 0; r < R; r++) {
            __m256 p0 = block_dot(kind, w0, aq[r] + b * QK);
            __m256 p1 = block_dot(kind, w1, aq[r] + (b + 1) * QK);
            acc0[r] = _mm256_fmadd_ps(_mm256_set1_ps(wd0 * ad[r][b]), p0, acc0[r]);
            acc1[r] = _mm256_fmadd_ps(_mm256_set1_ps(wd1 * ad[r][b + 1]), p1, acc1[r]);
        }
    }
    if (b < nb) {
        float wd0;
        __m256i w0 = block_weights(kind, wrow, b, &wd0, &wc[b]);
        for (int r = 0; r < R; r++) {
            __m256 p0 = block_dot(kind, w0, aq[r] + b * QK);
            acc0[r] = _mm256_fmadd_ps(_mm256_set1_ps(wd0 * ad[r][b]), p0, acc0[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        float v = hsum256(_mm256_add_ps(acc0[r], acc1[r]));
        if (kind != KIND_Q8_0) v += dot_f32(wc, x->s + (size_t)(r0 + r) * nb, nb);
        float *dst = &y[(size_t)(r0 + r) * ldy + o];
        *dst = accumulate ? *dst + v : v;
    }
}

static inline __attribute__((always_inline)) void gemm_block(
    int kind, float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows,
    int accumulate) {
    float wc[MAX_BLOCKS];
    const size_t row_bytes = ggml_row_bytes(w->type, w->n_in);
    int grouped_end = w->x8 ? w->n_out / ROW_GROUP * ROW_GROUP : 0;
    if (grouped_end > o1) grouped_end = o1;
    /* whole row groups */
    gemm_x8_groups(kind, y, ldy, w, o0, grouped_end, x, n_rows, accumulate, NULL);
    /* remaining rows in the file layout */
    int first = o0 > grouped_end ? o0 : grouped_end;
    int r0 = 0;
    for (; r0 + GEMM_TILE <= n_rows; r0 += GEMM_TILE)
        for (int o = first; o < o1; o++)
            gemm_block_tile(kind, GEMM_TILE, y, ldy, (const char *)w->rows + o * row_bytes, o, x, r0, accumulate, wc);
    int rest = n_rows - r0;
    for (int o = first; o < o1 && rest > 0; o++) {
        const void *wrow = (const char *)w->rows + o * row_bytes;
        if (rest == 1) gemm_block_tile(kind, 1, y, ldy, wrow, o, x, r0, accumulate, wc);
        else if (rest == 2) gemm_block_tile(kind, 2, y, ldy, wrow, o, x, r0, accumulate, wc);
        else gemm_block_tile(kind, 3, y, ldy, wrow, o, x, r0, accumulate, wc);
    }
}

void gemm_q8_0_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_block(KIND_Q8_0, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q4_0_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_block(KIND_Q4_0, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q4_1_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_block(KIND_Q4_1, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

/* Float weights: one weight row against R activation rows; per row: 8-lane FMA chunks over k,
 * lane sum, scalar tail in order. */
static inline __attribute__((always_inline)) void gemm_float_tile(
    int is_f16, const int R, float *y, int ldy, const void *w, int o, const act_rows *x, int r0,
    int accumulate) {
    const int k = x->k;
    __m256 acc[GEMM_TILE];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    const float *xr[GEMM_TILE];
    for (int r = 0; r < R; r++) xr[r] = x->f + (size_t)(r0 + r) * k;
    const float *wf = (const float *)w + (size_t)o * k;
    const uint16_t *wh = (const uint16_t *)w + (size_t)o * k;
    int i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256 wv = is_f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wh + i))) : _mm256_loadu_ps(wf + i);
        for (int r = 0; r < R; r++) acc[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xr[r] + i), acc[r]);
    }
    for (int r = 0; r < R; r++) {
        float v = hsum256(acc[r]);
        for (int j = i; j < k; j++) v += (is_f16 ? fp16_to_f32(wh[j]) : wf[j]) * xr[r][j];
        float *dst = &y[(size_t)(r0 + r) * ldy + o];
        *dst = accumulate ? *dst + v : v;
    }
}

static inline __attribute__((always_inline)) void gemm_float(
    int is_f16, float *y, int ldy, const gemm_weight *gw, int o0, int o1, const act_rows *x, int n_rows,
    int accumulate) {
    const void *w = gw->rows;
    int r0 = 0;
    for (; r0 + GEMM_TILE <= n_rows; r0 += GEMM_TILE)
        for (int o = o0; o < o1; o++) gemm_float_tile(is_f16, GEMM_TILE, y, ldy, w, o, x, r0, accumulate);
    int rest = n_rows - r0;
    for (int o = o0; o < o1 && rest > 0; o++) {
        if (rest == 1) gemm_float_tile(is_f16, 1, y, ldy, w, o, x, r0, accumulate);
        else if (rest == 2) gemm_float_tile(is_f16, 2, y, ldy, w, o, x, r0, accumulate);
        else gemm_float_tile(is_f16, 3, y, ldy, w, o, x, r0, accumulate);
    }
}

void gemm_f32_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_float(0, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_f16_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_float(1, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

/* ---- attention --------------------------------------------------------------------------- */

#define HEAD_BATCH 4 /* query heads of one kv head whose scores share each loaded key vector */

/* Scores of 8 keys (one key block) for NH heads: s[h] lane j = q_h . key j. Per (head, key) the
 * sum runs over d in U interleaved partial sums (U = 4, or 2 for a batch of 4 heads so the
 * partials fit the 16 registers), combined as (p0 + p1) + (p2 + p3), or p0 + p1.
 * NOTE: pointer-stepped loops (no index arithmetic per load): this loop is the kernel's hot path. */
static inline __attribute__((always_inline)) void block_scores(
    const int NH, const int F16, __m256 *s, const float *const *qh, const void *kblock, int hd) {
    const int U = NH > 3 ? 2 : 4;
    __m256 part[HEAD_BATCH][4];
    for (int h = 0; h < NH; h++)
        for (int u = 0; u < U; u++) part[h][u] = _mm256_setzero_ps();
    const uint16_t *kh = (const uint16_t *)kblock;
    const float *kf = (const float *)kblock;
    const float *q0 = qh[0], *q1 = NH > 1 ? qh[1] : qh[0], *q2 = NH > 2 ? qh[2] : qh[0], *q3 = NH > 3 ? qh[3] : qh[0];
    if (F16 == KV_Q8_0) { /* per group of 32 dims: 8 lanes' scales, then int8 lanes dim by dim (kv_q8.h) */
        const uint8_t *kq = (const uint8_t *)kblock;
        for (int g = 0; g < hd / KV_Q8_BLOCK; g++) {
            const __m256 dsc = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)kq));
            kq += 2 * KEY_LANES;
            for (int d = 0; d < KV_Q8_BLOCK; d += U, kq += U * KEY_LANES, q0 += U, q1 += U, q2 += U, q3 += U)
                for (int u = 0; u < U; u++) {
                    const __m256i k8 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(kq + u * KEY_LANES)));
                    const __m256 kt = _mm256_mul_ps(_mm256_cvtepi32_ps(k8), dsc);
                    part[0][u] = _mm256_fmadd_ps(_mm256_broadcast_ss(q0 + u), kt, part[0][u]);
                    if (NH > 1) part[1][u] = _mm256_fmadd_ps(_mm256_broadcast_ss(q1 + u), kt, part[1][u]);
                    if (NH > 2) part[2][u] = _mm256_fmadd_ps(_mm256_broadcast_ss(q2 + u), kt, part[2][u]);
                    if (NH > 3) part[3][u] = _mm256_fmadd_ps(_mm256_broadcast_ss(q3 + u), kt, part[3][u]);
                }
        }
    } else
    for (int d = 0; d < hd; d += U, kh += U * KEY_LANES, kf += U * KEY_LANES, q0 += U, q1 += U, q2 += U, q3 += U)
        for (int u = 0; u < U; u++) {
            const __m256 kt = F16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kh + u * KEY_LANES)))
                                  : _mm256_loadu_ps(kf + u * KEY_LANES);
            part[0][u] = _mm256_fmadd_ps(_mm256_broadcast_ss(q0 + u), kt, part[0][u]);
            if (NH > 1) part[1][u] = _mm256_fmadd_ps(_mm256_broadcast_ss(q1 + u), kt, part[1][u]);
            if (NH > 2) part[2][u] = _mm256_fmadd_ps(_mm256_broadcast_ss(q2 + u), kt, part[2][u]);
            if (NH > 3) part[3][u] = _mm256_fmadd_ps(_mm256_broadcast_ss(q3 + u), kt, part[3][u]);
        }
    for (int h = 0; h < NH; h++)
        s[h] = U == 2 ? _mm256_add_ps(part[h][0], part[h][1])
                      : _mm256_add_ps(_mm256_add_ps(part[h][0], part[h][1]), _mm256_add_ps(part[h][2], part[h][3]));
}

/* acc_h[chunks c0..c0+NC) = acc_h * corr_h + sum_j p_h[j] v[j] for NH heads: keys in order. */
static inline __attribute__((always_inline)) void block_values(
    const int NH, const int NC, const int F16, float *const *ah, const float *corr, const float *p,
    int p_stride, const void *v, int t0, int nv, int hd, int c0) {
    __m256 a[HEAD_BATCH][4];
    for (int h = 0; h < NH; h++)
        for (int c = 0; c < NC; c++)
            a[h][c] = _mm256_mul_ps(_mm256_loadu_ps(ah[h] + 8 * (c0 + c)), _mm256_set1_ps(corr[h]));
    const uint16_t *vh = (const uint16_t *)v + (size_t)t0 * hd + 8 * c0;
    const float *vf = (const float *)v + (size_t)t0 * hd + 8 * c0;
    const float *p0 = p, *p1 = p + p_stride, *p2 = p + 2 * p_stride, *p3 = p + 3 * p_stride;
    if (F16 == KV_Q8_0) { /* rows of blocks [d][q x 32]: chunk c is 8 values of block c / 4 */
        const size_t rb = kv_q8_row_bytes(hd);
        const uint8_t *vq = (const uint8_t *)v + (size_t)t0 * rb;
        for (int j = 0; j < nv; j++, vq += rb) {
            const __m256 pj0 = _mm256_broadcast_ss(p0 + j);
            const __m256 pj1 = NH > 1 ? _mm256_broadcast_ss(p1 + j) : pj0;
            const __m256 pj2 = NH > 2 ? _mm256_broadcast_ss(p2 + j) : pj0;
            const __m256 pj3 = NH > 3 ? _mm256_broadcast_ss(p3 + j) : pj0;
            for (int c = 0; c < NC; c++) {
                const uint8_t *blk = vq + (size_t)((c0 + c) / 4) * KV_Q8_BLOCK_BYTES;
                uint16_t dh;
                memcpy(&dh, blk, 2);
                const __m256i v8 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * ((c0 + c) % 4))));
                const __m256 vc = _mm256_mul_ps(_mm256_cvtepi32_ps(v8), _mm256_set1_ps(_cvtsh_ss(dh)));
                a[0][c] = _mm256_fmadd_ps(pj0, vc, a[0][c]);
                if (NH > 1) a[1][c] = _mm256_fmadd_ps(pj1, vc, a[1][c]);
                if (NH > 2) a[2][c] = _mm256_fmadd_ps(pj2, vc, a[2][c]);
                if (NH > 3) a[3][c] = _mm256_fmadd_ps(pj3, vc, a[3][c]);
            }
        }
    } else
    for (int j = 0; j < nv; j++, vh += hd, vf += hd) {
        const __m256 pj0 = _mm256_broadcast_ss(p0 + j);
        const __m256 pj1 = NH > 1 ? _mm256_broadcast_ss(p1 + j) : pj0;
        const __m256 pj2 = NH > 2 ? _mm256_broadcast_ss(p2 + j) : pj0;
        const __m256 pj3 = NH > 3 ? _mm256_broadcast_ss(p3 + j) : pj0;
        for (int c = 0; c < NC; c++) {
            const __m256 vc = F16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vh + 8 * c))) : _mm256_loadu_ps(vf + 8 * c);
            a[0][c] = _mm256_fmadd_ps(pj0, vc, a[0][c]);
            if (NH > 1) a[1][c] = _mm256_fmadd_ps(pj1, vc, a[1][c]);
            if (NH > 2) a[2][c] = _mm256_fmadd_ps(pj2, vc, a[2][c]);
            if (NH > 3) a[3][c] = _mm256_fmadd_ps(pj3, vc, a[3][c]);
        }
    }
    for (int h = 0; h < NH; h++)
        for (int c = 0; c < NC; c++) _mm256_storeu_ps(ah[h] + 8 * (c0 + c), a[h][c]);
}

/* One (query row, batch of NH heads) against keys [t0 + lo, t0 + nv) of a block of ATTN_KEY_BLOCK
 * (keys before t0 + lo lie outside a sliding window: probability exactly 0):
 * scores, online-softmax update of (m, l), value accumulation. sc: [HEAD_BATCH][ATTN_KEY_BLOCK]. */
static inline __attribute__((always_inline)) void attend_block(
    const int NH, const int F16, const float *const *qh, float *const *ah, float *const *st, const void *k,
    const void *v, int t0, int lo, int nv, int hd, float scale, float *sc) {
    const __m256 vscale = _mm256_set1_ps(scale);
    __m256 vmax[HEAD_BATCH];
    for (int h = 0; h < NH; h++) vmax[h] = _mm256_set1_ps(-INFINITY);
    for (int j = 0; j < nv; j += KEY_LANES) {
        __m256 s[HEAD_BATCH];
        const size_t kb_off = F16 == KV_Q8_0 ? (size_t)(t0 + j) / KEY_LANES * KEY_LANES * kv_q8_row_bytes(hd)
                                             : key_index(t0 + j, 0, hd) * (F16 ? 2 : 4);
        block_scores(NH, F16, s, qh, (const char *)k + kb_off, hd);
        const __m256 valid = lane_range(lo - j, nv - j);
        for (int h = 0; h < NH; h++) {
            s[h] = _mm256_mul_ps(s[h], vscale);
            _mm256_storeu_ps(sc + h * ATTN_KEY_BLOCK + j, s[h]);
            vmax[h] = _mm256_max_ps(vmax[h], _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), s[h], valid));
        }
    }
    float corr[HEAD_BATCH];
    for (int h = 0; h < NH; h++) {
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax[h]), _mm256_extractf128_ps(vmax[h], 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        const float bm = _mm_cvtss_f32(m4);
        const float m_new = st[h][0] > bm ? st[h][0] : bm;
        corr[h] = st[h][0] == -INFINITY ? 0.0f : exp1(st[h][0] - m_new);
        const __m256 vm = _mm256_set1_ps(m_new);
        __m256 lsum = _mm256_setzero_ps();
        float *p = sc + h * ATTN_KEY_BLOCK;
        for (int j = 0; j < nv; j += 8) {
            __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_loadu_ps(p + j), vm)), lane_range(lo - j, nv - j));
            _mm256_storeu_ps(p + j, e);
            lsum = _mm256_add_ps(lsum, e);
        }
        st[h][1] = st[h][1] * corr[h] + hsum256(lsum);
        st[h][0] = m_new;
    }
    int c = 0;
    const int n_chunks = hd / 8;
    /* NOTE: 3 or 4 heads x 2 chunks of accumulators fit the 16 registers with the broadcasts;
     * 3 x 4 would not: GCC spills one accumulator, and every key then waits on a store and a
     * reload (it was a third of a decode step's attention time). Per element the operations
     * are the same however the chunks are grouped. */
    if (NH > 2)
        for (; c + 2 <= n_chunks; c += 2) block_values(NH, 2, F16, ah, corr, sc, ATTN_KEY_BLOCK, v, t0, nv, hd, c);
    for (; c + 4 <= n_chunks; c += 4) block_values(NH, 4, F16, ah, corr, sc, ATTN_KEY_BLOCK, v, t0, nv, hd, c);
    switch (n_chunks - c) {
    case 1: block_values(NH, 1, F16, ah, corr, sc, ATTN_KEY_BLOCK, v, t0, nv, hd, c); break;
    case 2: block_values(NH, 2, F16, ah, corr, sc, ATTN_KEY_BLOCK, v, t0, nv, hd, c); break;
    case 3: block_values(NH, 3, F16, ah, corr, sc, ATTN_KEY_BLOCK, v, t0, nv, hd, c); break;
    default: break;
    }
}

/* One chunk (kernels.h): online softmax over key blocks [t0, t0 + ATTN_KEY_BLOCK) aligned to
 * absolute positions; state (m, l) in ml, the unnormalised output in acc. Keys are read in
 * their blocked layout (no conversion pass: f16 lanes convert in registers), and each loaded
 * key vector serves up to HEAD_BATCH query heads. */
void attention_chunk_avx2(float *acc, int lda, float *ml, const float *q, int ldq, const void *k,
                          const void *v, int kv_f16, int pos0, int n_q, int group, int head_dim,
                          float scale, int window, int chunk, float *scratch) {
    if (head_dim % 8 != 0 || (kv_f16 == KV_Q8_0 && head_dim % KV_Q8_BLOCK != 0)) {
        attention_chunk_generic(acc, lda, ml, q, ldq, k, v, kv_f16, pos0, n_q, group, head_dim, scale, window,
                                chunk, scratch);
        return;
    }
    const int KB = ATTN_KEY_BLOCK, hd = head_dim;
    float *sc = scratch; /* [HEAD_BATCH][KB] scores, then probabilities */
    const int c0 = chunk * ATTN_CHUNK;
    const int c1 = pos0 + n_q < c0 + ATTN_CHUNK ? pos0 + n_q : c0 + ATTN_CHUNK; /* keys any row needs */
    for (int i = 0; i < n_q; i++)
        for (int g = 0; g < group; g++) {
            memset(acc + (size_t)i * lda + (size_t)g * hd, 0, sizeof(float) * hd);
            ml[2 * (i * group + g)] = -INFINITY;
            ml[2 * (i * group + g) + 1] = 0.0f;
        }
    /* with a window, blocks wholly before every row's window are skipped */
    const int first = window > 0 && pos0 - window + 1 > c0 ? c0 + (pos0 - window + 1 - c0) / KB * KB : c0;
    for (int t0 = first; t0 < c1; t0 += KB) {
        const int nk = c1 - t0 < KB ? c1 - t0 : KB;
        for (int i = 0; i < n_q; i++) {
            const int pos = pos0 + i;
            if (pos < t0) continue;
            const int lo = window > 0 && pos - window + 1 > t0 ? pos - window + 1 - t0 : 0; /* first key in window */
            if (lo >= KB) continue;
            const int nv = pos + 1 - t0 < nk ? pos + 1 - t0 : nk; /* valid keys in block */
            for (int h0 = 0; h0 < group; h0 += HEAD_BATCH) {
                const int nh = group - h0 < HEAD_BATCH ? group - h0 : HEAD_BATCH;
                const float *qh[HEAD_BATCH];
                float *ah[HEAD_BATCH], *st[HEAD_BATCH];
                for (int h = 0; h < nh; h++) {
                    qh[h] = q + (size_t)i * ldq + (size_t)(h0 + h) * hd;
                    ah[h] = acc + (size_t)i * lda + (size_t)(h0 + h) * hd;
                    st[h] = ml + 2 * (i * group + h0 + h);
                }
                if (kv_f16 == KV_Q8_0) {
                    if (nh == 4) attend_block(4, KV_Q8_0, qh, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                    else if (nh == 3) attend_block(3, KV_Q8_0, qh, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                    else if (nh == 2) attend_block(2, KV_Q8_0, qh, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                    else attend_block(1, KV_Q8_0, qh, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                } else if (kv_f16) {
                    if (nh == 4) attend_block(4, 1, qh, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                    else if (nh == 3) attend_block(3, 1, qh, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                    else if (nh == 2) attend_block(2, 1, qh, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                    else attend_block(1, 1, qh, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                } else {
                    if (nh == 4) attend_block(4, 0, qh, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                    else if (nh == 3) attend_block(3, 0, qh, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                    else if (nh == 2) attend_block(2, 0, qh, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                    else attend_block(1, 0, qh, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                }
            }
        }
    }
}

void attention_fold_avx2(float *acc, int lda, float *ml, const float *pacc, int ldp, const float *pml,
                         int n_q, int group, int head_dim) {
    for (int i = 0; i < n_q; i++)
        for (int g = 0; g < group; g++) {
            float *st = ml + 2 * (i * group + g);
            const float *pst = pml + 2 * (i * group + g);
            if (pst[0] == -INFINITY) continue; /* empty partial */
            float *ah = acc + (size_t)i * lda + (size_t)g * head_dim;
            const float *ph = pacc + (size_t)i * ldp + (size_t)g * head_dim;
            const float m = st[0] > pst[0] ? st[0] : pst[0];
            const float a = st[0] == -INFINITY ? 0.0f : exp1(st[0] - m), b = exp1(pst[0] - m);
            const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
            int j = 0;
            for (; j + 8 <= head_dim; j += 8)
                _mm256_storeu_ps(ah + j, _mm256_fmadd_ps(_mm256_loadu_ps(ph + j), vb, _mm256_mul_ps(_mm256_loadu_ps(ah + j), va)));
            for (; j < head_dim; j++) ah[j] = ah[j] * a + ph[j] * b;
            st[0] = m;
            st[1] = st[1] * a + pst[1] * b;
        }
}

/* ---- norm, rope, element-wise ------------------------------------------------------------ */

void rmsnorm_avx2(float *out, const float *x, const float *w, int n, float eps) {
    float ss = dot_f32(x, x, n);
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    const __m256 vinv = _mm256_set1_ps(inv);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv), _mm256_loadu_ps(w + i)));
    for (; i < n; i++) out[i] = x[i] * inv * w[i];
}

void rope_avx2(float *x, int n_heads, int head_dim, const float *cos_sin) {
    for (int h = 0; h < n_heads; h++) {
        float *xh = x + (size_t)h * head_dim;
        int i = 0;
        for (; i + 8 <= head_dim; i += 8) {
            __m256 cs = _mm256_loadu_ps(cos_sin + i); /* c0 s0 c1 s1 ... */
            __m256 v = _mm256_loadu_ps(xh + i);       /* x0 x1 x2 x3 ... */
            __m256 swapped = _mm256_permute_ps(v, 0xB1); /* x1 x0 x3 x2 ... */
            __m256 out = _mm256_fmaddsub_ps(v, _mm256_moveldup_ps(cs), _mm256_mul_ps(swapped, _mm256_movehdup_ps(cs)));
            _mm256_storeu_ps(xh + i, out);
        }
        for (; i < head_dim; i += 2) {
            float c = cos_sin[i], s = cos_sin[i + 1], x0 = xh[i], x1 = xh[i + 1];
            xh[i] = x0 * c - x1 * s;
            xh[i + 1] = x0 * s + x1 * c;
        }
    }
}

/* NEOX pairs (x[i], x[i + hd/2]); the (cos, sin) table is de-interleaved 8 pairs at a time. */
void rope_neox_avx2(float *x, int n_heads, int head_dim, const float *cos_sin) {
    const int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *xh = x + (size_t)h * head_dim;
        int i = 0;
        for (; i + 8 <= half; i += 8) {
            const __m256 a = _mm256_loadu_ps(cos_sin + 2 * i), b = _mm256_loadu_ps(cos_sin + 2 * i + 8);
            /* per 128-bit lane: c0 c1 c4 c5 | c2 c3 c6 c7 -> c0..c7 (likewise s) */
            const __m256 c = _mm256_castpd_ps(_mm256_permute4x64_pd(
                _mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))), _MM_SHUFFLE(3, 1, 2, 0)));
            const __m256 s = _mm256_castpd_ps(_mm256_permute4x64_pd(
                _mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))), _MM_SHUFFLE(3, 1, 2, 0)));
            const __m256 x0 = _mm256_loadu_ps(xh + i), x1 = _mm256_loadu_ps(xh + i + half);
            _mm256_storeu_ps(xh + i, _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s)));
            _mm256_storeu_ps(xh + i + half, _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c)));
        }
        for (; i < half; i++) {
            float c = cos_sin[2 * i], s = cos_sin[2 * i + 1], x0 = xh[i], x1 = xh[i + half];
            xh[i] = x0 * c - x1 * s;
            xh[i + half] = x0 * s + x1 * c;
        }
    }
}

void silu_mul_avx2(float *out, const float *g, const float *u, int n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = exp256(_mm256_xor_ps(gv, sign));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) out[i] = g[i] / (1.0f + exp1(-g[i])) * u[i];
}

/* gelu(x) = 0.5 x (1 + tanh(z)) = x / (1 + exp(-2z)), z = sqrt(2/pi) (x + 0.044715 x^3); the
 * clamps of the reference (0 below -10, x above 10) are applied by blend. */
static inline __m256 gelu_tanh256(__m256 x) {
    const __m256 x2 = _mm256_mul_ps(x, x);
    const __m256 inner = _mm256_fmadd_ps(x2, _mm256_set1_ps(0.044715f), _mm256_set1_ps(1.0f));
    const __m256 z2 = _mm256_mul_ps(_mm256_mul_ps(x, inner), _mm256_set1_ps(-2.0f * 0.79788456080286535587989211986876f));
    __m256 y = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp256(z2)));
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-10.0f), _CMP_LE_OQ));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, _mm256_set1_ps(10.0f), _CMP_GE_OQ));
}

void gelu_tanh_mul_avx2(float *out, const float *g, const float *u, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(gelu_tanh256(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
    if (i < n) { /* tail through one padded vector */
        float gb[8] = {0}, ob[8];
        memcpy(gb, g + i, sizeof(float) * (n - i));
        _mm256_storeu_ps(ob, gelu_tanh256(_mm256_loadu_ps(gb)));
        for (int j = 0; i + j < n; j++) out[i + j] = ob[j] * u[i + j];
    }
}

void exp_avx2(float *y, const float *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp256(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] = exp1(x[i]);
}

#endif /* x86 */
