/* AVX2/FMA/F16C variants of the quant_k.h kernels: Q5_0, Q5_1, Q2_K .. Q6_K, BF16.
 *
 * Design: the block-type matmuls are x86_gemm_k.h's row-group body on maddubs/madd (its header
 * states the per-row float operations every variant shares); row decoding (the embedding
 * lookup) and BF16's float matmul live here.
 */
#if defined(__x86_64__) || defined(__i386__)

#pragma GCC target("avx2,fma,f16c")

#include <immintrin.h>
#include <string.h>

#include "../fp16.h"
#include "../kernels.h"
#include "../quant_k.h"
#include "x86_avx2_tiles.h"

#define X8_VNNI 0
#define K_TILE 4 /* activation rows per micro-kernel call */
#include "x86_gemm_k.h"

/* A prefill chunk on x86_avx2_tiles.c's tiles: its whole groups against whole tiles of rows
 * there; the rows past the tiles and the outputs past the groups on x86_gemm_k.h's tiles (the
 * same numbers, so where a row lands does not matter). */
static inline __attribute__((always_inline)) void gemm_k_tiled(int kind, float *y, int ldy, const gemm_weight *w,
                                                               int o0, int o1, const act_rows *x, int n_rows,
                                                               int accumulate) {
    const int tiled = n_rows / T8_ROWS * T8_ROWS;
    const int end = tiled ? gemm_tiles_avx2(y, ldy, w, o0, o1, x, tiled, accumulate) : o0;
    if (end > o0 && tiled < n_rows) {
        const int k = x->k;
        const act_rows rest = {x->f ? x->f + (size_t)tiled * k : NULL, x->qs + (size_t)tiled * k,
                               x->d + (size_t)tiled * (k / QK), x->s + (size_t)tiled * (k / QK), k};
        gemm_k(kind, y + (size_t)tiled * ldy, ldy, w, o0, end, &rest, n_rows - tiled, accumulate);
    }
    if (end < o1) gemm_k(kind, y, ldy, w, end, o1, x, n_rows, accumulate);
}

void gemm_q5_0_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k_tiled(KIND_Q5_0, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q5_1_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k_tiled(KIND_Q5_1, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q4_K_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k_tiled(KIND_Q4_K, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q5_K_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k_tiled(KIND_Q5_K, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q6_K_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k_tiled(KIND_Q6_K, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q2_K_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k(KIND_Q2_K, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q3_K_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k(KIND_Q3_K, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

/* ---- row decoding (the embedding lookup) ----------------------------------------------------------- */

/* y[0..n) = d * q - m for n (8 .. 32, a multiple of 8) signed bytes of q. */
static inline void store_scaled(float *y, __m256i q, int n, float d, float m) {
    const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    __m128i part[4] = {_mm256_castsi256_si128(q), _mm_srli_si128(_mm256_castsi256_si128(q), 8),
                       _mm256_extracti128_si256(q, 1), _mm_srli_si128(_mm256_extracti128_si256(q, 1), 8)};
    for (int i = 0; i < n / 8; i++)
        _mm256_storeu_ps(y + 8 * i, _mm256_fmsub_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[i])), vm));
}

/* 32 bytes: byte e = bit e of the 32-bit word (0 or 1). */
static inline __m256i bits_to_bytes(uint32_t bits) {
    const __m256i shuf = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(1));
}

static inline void dequantize_q5(float *y, const uint8_t *qs, const uint8_t *qh4, float d, float m, int offset) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    __m128i t = _mm_loadu_si128((const __m128i *)qs);
    __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(15));
    __m256i q = _mm256_or_si256(nib, _mm256_slli_epi16(bits_to_bytes(qh), 4));
    store_scaled(y, _mm256_sub_epi8(q, _mm256_set1_epi8((char)offset)), 32, d, -m);
}

void dequantize_row_q5_0_avx2(float *y, const void *x, int k) {
    const block_q5_0 *blk = (const block_q5_0 *)x;
    for (int b = 0; b < k / QK; b++) dequantize_q5(y + b * QK, blk[b].qs, blk[b].qh, _cvtsh_ss(blk[b].d), 0.0f, 16);
}

void dequantize_row_q5_1_avx2(float *y, const void *x, int k) {
    const block_q5_1 *blk = (const block_q5_1 *)x;
    for (int b = 0; b < k / QK; b++)
        dequantize_q5(y + b * QK, blk[b].qs, blk[b].qh, _cvtsh_ss(blk[b].d), _cvtsh_ss(blk[b].m), 0);
}

static inline void dequantize_k4(float *y, uint16_t d16, uint16_t dmin16, const uint8_t *scales, const uint8_t *qs,
                                 const uint8_t *qh) {
    const float d = _cvtsh_ss(d16), dmin = _cvtsh_ss(dmin16);
    const __m256i low4 = _mm256_set1_epi8(15);
    for (int c = 0; c < 4; c++) {
        const __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        __m256i lo = _mm256_and_si256(w, low4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
        if (qh) {
            const __m256i vh = _mm256_loadu_si256((const __m256i *)qh);
            lo = _mm256_or_si256(lo, bit_to_4(vh, 2 * c));
            hi = _mm256_or_si256(hi, bit_to_4(vh, 2 * c + 1));
        }
        for (int h = 0; h < 2; h++) {
            const int j = 2 * c + h;
            int sc, m;
            if (j < 4) sc = scales[j] & 63, m = scales[j + 4] & 63;
            else sc = (scales[j + 4] & 15) | ((scales[j - 4] >> 6) << 4), m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
            store_scaled(y + 32 * j, h ? hi : lo, 32, d * (float)sc, dmin * (float)m);
        }
    }
}

void dequantize_row_q4_K_avx2(float *y, const void *x, int k) {
    const block_q4_K *blk = (const block_q4_K *)x;
    for (int b = 0; b < k / QK_K; b++) dequantize_k4(y + b * QK_K, blk[b].d, blk[b].dmin, blk[b].scales, blk[b].qs, NULL);
}

void dequantize_row_q5_K_avx2(float *y, const void *x, int k) {
    const block_q5_K *blk = (const block_q5_K *)x;
    for (int b = 0; b < k / QK_K; b++)
        dequantize_k4(y + b * QK_K, blk[b].d, blk[b].dmin, blk[b].scales, blk[b].qs, blk[b].qh);
}

void dequantize_row_q6_K_avx2(float *y, const void *x, int k) {
    const block_q6_K *blk = (const block_q6_K *)x;
    const __m256i low4 = _mm256_set1_epi8(15), off = _mm256_set1_epi8(32);
    for (int b = 0; b < k / QK_K; b++) {
        const float d = _cvtsh_ss(blk[b].d);
        for (int n = 0; n < 2; n++) {
            const __m256i vl0 = _mm256_loadu_si256((const __m256i *)(blk[b].ql + 64 * n));
            const __m256i vl1 = _mm256_loadu_si256((const __m256i *)(blk[b].ql + 64 * n + 32));
            const __m256i vh = _mm256_loadu_si256((const __m256i *)(blk[b].qh + 32 * n));
            for (int g = 0; g < 4; g++) {
                const __m256i vl = g & 1 ? vl1 : vl0;
                const __m256i nib = g < 2 ? _mm256_and_si256(vl, low4) : _mm256_and_si256(_mm256_srli_epi16(vl, 4), low4);
                const __m256i q = _mm256_sub_epi8(_mm256_or_si256(nib, q6_high(vh, g)), off);
                const int e = 128 * n + 32 * g; /* first element; scales per 16 */
                float *out = y + b * QK_K + e;
                store_scaled(out, q, 16, d * (float)blk[b].scales[e / 16], 0.0f);
                store_scaled(out + 16, _mm256_permute2x128_si256(q, q, 1), 16, d * (float)blk[b].scales[e / 16 + 1], 0.0f);
            }
        }
    }
}

/* ---- BF16: float weights ------------------------------------------------------------------------ */

static inline __m256 bf16x8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

static inline float bf16_1(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float hsum256(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

void dequantize_row_bf16_avx2(float *y, const void *x, int k) {
    const uint16_t *h = (const uint16_t *)x;
    int i = 0;
    for (; i + 8 <= k; i += 8) _mm256_storeu_ps(y + i, bf16x8(h + i));
    for (; i < k; i++) y[i] = bf16_1(h[i]);
}

/* One weight row against R activation rows; per row: 8-lane FMA chunks, lane sum, scalar tail. */
static inline __attribute__((always_inline)) void bf16_tile(const int R, float *y, int ldy, const uint16_t *wr, int o,
                                                            const act_rows *x, int r0, int accumulate) {
    const int k = x->k;
    __m256 acc[K_TILE];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= k; i += 8) {
        const __m256 wv = bf16x8(wr + i);
        for (int r = 0; r < R; r++) acc[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x->f + (size_t)(r0 + r) * k + i), acc[r]);
    }
    for (int r = 0; r < R; r++) {
        float v = hsum256(acc[r]);
        for (int j = i; j < k; j++) v += bf16_1(wr[j]) * x->f[(size_t)(r0 + r) * k + j];
        float *dst = &y[(size_t)(r0 + r) * ldy + o];
        *dst = accumulate ? *dst + v : v;
    }
}

void gemm_bf16_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    const uint16_t *wh = (const uint16_t *)w->rows;
    const int k = x->k;
    int r0 = 0;
    for (; r0 + K_TILE <= n_rows; r0 += K_TILE)
        for (int o = o0; o < o1; o++) bf16_tile(K_TILE, y, ldy, wh + (size_t)o * k, o, x, r0, accumulate);
    const int rest = n_rows - r0;
    for (int o = o0; o < o1 && rest > 0; o++) {
        if (rest == 1) bf16_tile(1, y, ldy, wh + (size_t)o * k, o, x, r0, accumulate);
        else if (rest == 2) bf16_tile(2, y, ldy, wh + (size_t)o * k, o, x, r0, accumulate);
        else bf16_tile(3, y, ldy, wh + (size_t)o * k, o, x, r0, accumulate);
    }
}

#endif /* x86 */
