/* AVX2/FMA/F16C variants of the kernels (contracts in kernels.h).
 *
 * Design: this file alone is compiled for AVX2 (the pragma below), so the rest of the build
 * stays portable; dispatch.c only hands these functions out when cpuid reports AVX2, FMA and
 * F16C. Each kernel keeps one fixed per-row sequence of operations however many rows it is
 * given (see the NOTE in kernels.h): the row-tiled matmul micro-kernels are one function body
 * instantiated for 1..GEMM_TILE rows. Attention's AVX2 kernels live in x86_avx2_attn.c, the
 * math they share with this file in x86_avx2_math.h.
 */
#if defined(__x86_64__) || defined(__i386__)

#pragma GCC target("avx2,fma,f16c")

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../fp16.h"
#include "../kernels.h"
#include "x86_avx2_math.h"

#define GEMM_TILE 4        /* activation rows per micro-kernel call */
#define MAX_BLOCKS (MAX_ROW_LEN / QK) /* blocks of the longest row (kernels.h) */

/* ---- helpers (and x86_avx2_math.h) ---------------------------------------------------- */

/* dot(a, b) over n floats: 8-lane FMA chunks, lane sum, then the scalar tail in order. */
static inline float dot_f32(const float *a, const float *b, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum256(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
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
