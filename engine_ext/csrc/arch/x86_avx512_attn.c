/* Attention chunks in query tiles on AVX-512: the avx512vnni table's attention_chunk (contract
 * in kernels.h; the tiling and why it is bit-identical to the AVX2 row kernel: x86_attn_tiles.h).
 * Score tiles are 6 pairs x 32 keys (3 with 4 partial sums), value tiles 6 pairs x 64 floats;
 * q8_0 keys are scored with VNNI in tiles of 6 pairs x 32 keys.
 * Calls of one query row (decode) go to the AVX2 row kernel: nothing shares their blocks.
 */
#if defined(__x86_64__) || defined(__i386__)

#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../kernels.h"
#include "x86_attn_tiles.h"
#include "x86_avx2_math.h"
#include "x86_avx512_math.h"

#define TILE_U2 6     /* pairs per score tile with 2 partial sums: 6 x 2 halves x 2 accumulators */
#define TILE_U4 3     /* with 4 partial sums: 3 x 2 x 4 */
#define TILE_V 6      /* pairs per value tile: 6 x VCHUNKS accumulators */
#define VCHUNKS 4     /* 16-float chunks of the head per value tile */

static inline __m256 hi256(__m512 x) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)); }

/* Scores of the block's 32 keys for NP pairs with U partial sums, scaled, into s[p][0 | 1]
 * (keys 0-15 | 16-31). Both halves at once: each query broadcast serves two key vectors, so a
 * dimension costs 2 key loads and NP broadcasts for 2 NP FMAs (NP x 2 x U <= 24 accumulators of
 * the 32 registers). */
static inline __attribute__((always_inline)) void tile_scores(const int NP, const int U, __m512 (*s)[2],
                                                              const float *const *qp, const float *kf, int hd,
                                                              float scale) {
    __m512 part[TILE_U2][2][4];
    for (int p = 0; p < NP; p++)
        for (int u = 0; u < U; u++) part[p][0][u] = part[p][1][u] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d += U)
        for (int u = 0; u < U; u++) {
            const __m512 k0 = _mm512_loadu_ps(kf + (size_t)(d + u) * KB);
            const __m512 k1 = _mm512_loadu_ps(kf + (size_t)(d + u) * KB + 16);
            for (int p = 0; p < NP; p++) {
                const __m512 qv = _mm512_set1_ps(qp[p][d + u]);
                part[p][0][u] = _mm512_fmadd_ps(qv, k0, part[p][0][u]);
                part[p][1][u] = _mm512_fmadd_ps(qv, k1, part[p][1][u]);
            }
        }
    const __m512 vs = _mm512_set1_ps(scale);
    for (int p = 0; p < NP; p++)
        for (int h = 0; h < 2; h++) {
            const __m512 sum = U == 2 ? _mm512_add_ps(part[p][h][0], part[p][h][1])
                                      : _mm512_add_ps(_mm512_add_ps(part[p][h][0], part[p][h][1]),
                                                      _mm512_add_ps(part[p][h][2], part[p][h][3]));
            s[p][h] = _mm512_mul_ps(sum, vs);
        }
}

/* Each tile shape as its own small function: inlined into run_pairs, GCC spilled accumulators of
 * the 6-pair tiles (register pressure of the whole function); alone they stay in registers. */
#define SCORE_FN(NP, U)                                                                                  \
    static __attribute__((noinline)) void tile_scores_##NP##_##U(__m512 (*s)[2], const float *const *qp, \
                                                                 const float *kf, int hd, float scale) { \
        tile_scores(NP, U, s, qp, kf, hd, scale);                                                        \
    }
SCORE_FN(1, 2)
SCORE_FN(2, 2)
SCORE_FN(3, 2)
SCORE_FN(4, 2)
SCORE_FN(5, 2)
SCORE_FN(6, 2)
SCORE_FN(1, 4)
SCORE_FN(2, 4)
SCORE_FN(3, 4)
#undef SCORE_FN

/* Online-softmax update of one pair from its scores: (m, l) in st, probabilities into pr[KB]
 * (zero outside [lo, nv)); returns the correction of the old accumulator. */
static inline float pair_softmax(const __m512 *s, __mmask16 m0, __mmask16 m1, float *st, float *pr) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const __m512 mx = _mm512_max_ps(_mm512_mask_blend_ps(m0, ninf, s[0]), _mm512_mask_blend_ps(m1, ninf, s[1]));
    const float bm = _mm512_reduce_max_ps(mx);
    const float m_new = st[0] > bm ? st[0] : bm;
    const float corr = st[0] == -INFINITY ? 0.0f : exp1(st[0] - m_new);
    const __m512 vm = _mm512_set1_ps(m_new);
    const __m512 e0 = _mm512_maskz_mov_ps(m0, exp512(_mm512_sub_ps(s[0], vm)));
    const __m512 e1 = _mm512_maskz_mov_ps(m1, exp512(_mm512_sub_ps(s[1], vm)));
    _mm512_storeu_ps(pr, e0);
    _mm512_storeu_ps(pr + 16, e1);
    /* x86_avx2.c's 8-lane sum over the key block's 8-key groups in order (zero groups add 0) */
    __m256 l = _mm256_add_ps(_mm512_castps512_ps256(e0), hi256(e0));
    l = _mm256_add_ps(l, _mm512_castps512_ps256(e1));
    l = _mm256_add_ps(l, hi256(e1));
    st[1] = st[1] * corr + hsum256(l);
    st[0] = m_new;
    return corr;
}

/* acc_p[chunks c0 .. c0 + NC) = acc_p * corr_p + sum_{j < nv} pr_p[j] v[j] for NP pairs.
 * NOTE: the accumulators are named variables, not an array: with an array GCC kept every one of
 * them in registers and still stored each to the stack after every FMA (the array is read after
 * the loop), a store per FMA. */
#define TV_ALL(X) X(0, 0) X(0, 1) X(0, 2) X(0, 3) X(1, 0) X(1, 1) X(1, 2) X(1, 3) X(2, 0) X(2, 1) X(2, 2) X(2, 3) \
    X(3, 0) X(3, 1) X(3, 2) X(3, 3) X(4, 0) X(4, 1) X(4, 2) X(4, 3) X(5, 0) X(5, 1) X(5, 2) X(5, 3)
static inline __attribute__((always_inline)) void tile_values(const int NP, const int NC, float *const *ap,
                                                              const float *corr, const float *const *pr,
                                                              const float *vf, int nv, int hd, int c0) {
    const int tail = hd - 16 * (c0 + NC - 1); /* floats in the last chunk: 16, or 8 */
    const __mmask16 last = tail >= 16 ? 0xFFFF : (__mmask16)((1u << tail) - 1);
#define TV_MASK(c) ((c) == NC - 1 ? last : (__mmask16)0xFFFF)
#define TV_DECL(p, c) __m512 a##p##c = _mm512_setzero_ps();
#define TV_INIT(p, c)                                                                                  \
    if (NP > p && NC > c)                                                                              \
        a##p##c = _mm512_mul_ps(_mm512_maskz_loadu_ps(TV_MASK(c), ap[p] + 16 * (c0 + c)), _mm512_set1_ps(corr[p]));
#define TV_FMA(p, c) \
    if (NP > p && NC > c) a##p##c = _mm512_fmadd_ps(_mm512_set1_ps(pr[p][j]), v##c, a##p##c);
#define TV_STORE(p, c) \
    if (NP > p && NC > c) _mm512_mask_storeu_ps(ap[p] + 16 * (c0 + c), TV_MASK(c), a##p##c);
    TV_ALL(TV_DECL)
    TV_ALL(TV_INIT)
    for (int j = 0; j < nv; j++) {
        const float *vj = vf + (size_t)j * hd + 16 * c0;
        const __m512 v0 = _mm512_maskz_loadu_ps(TV_MASK(0), vj);
        const __m512 v1 = NC > 1 ? _mm512_maskz_loadu_ps(TV_MASK(1), vj + 16) : v0;
        const __m512 v2 = NC > 2 ? _mm512_maskz_loadu_ps(TV_MASK(2), vj + 32) : v0;
        const __m512 v3 = NC > 3 ? _mm512_maskz_loadu_ps(TV_MASK(3), vj + 48) : v0;
        TV_ALL(TV_FMA)
    }
    TV_ALL(TV_STORE)
#undef TV_MASK
#undef TV_DECL
#undef TV_INIT
#undef TV_FMA
#undef TV_STORE
}
#undef TV_ALL

/* The value tiles as small functions too (the same reason as the score tiles'). */
#define VALUE_FN(NP, NC)                                                                                      \
    static __attribute__((noinline)) void tile_values_##NP##_##NC(float *const *ap, const float *corr,         \
                                                                  const float *const *pr, const float *vf,    \
                                                                  int nv, int hd, int c0) {                   \
        tile_values(NP, NC, ap, corr, pr, vf, nv, hd, c0);                                                    \
    }
#define VALUE_FNS(NP) VALUE_FN(NP, 1) VALUE_FN(NP, 2) VALUE_FN(NP, 3) VALUE_FN(NP, 4)
VALUE_FNS(1)
VALUE_FNS(2)
VALUE_FNS(3)
VALUE_FNS(4)
VALUE_FNS(5)
VALUE_FNS(6)
#undef VALUE_FNS
#undef VALUE_FN

/* Pairs [0, n) of one key range: scores and softmax in score tiles of U's size, then values. */
static void run_pairs(int U, int n, const float *const *qp, float *const *ap, float *const *sp, float *sc,
                      const float *kf, const float *vf, int lo, int nv, int hd, float scale) {
    const __mmask32 valid = (nv >= 32 ? 0xFFFFFFFFu : (1u << nv) - 1) & ~((1u << lo) - 1);
    const __mmask16 m0 = (__mmask16)valid, m1 = (__mmask16)(valid >> 16);
    float corr[ATTN_MAX_ROWS];
    const float *pr[ATTN_MAX_ROWS];
    const int tile = U == 2 ? TILE_U2 : TILE_U4;
    for (int p0 = 0; p0 < n; p0 += tile) {
        const int np = n - p0 < tile ? n - p0 : tile;
        __m512 s[TILE_U2][2];
        if (!qp) /* q8_0: the scaled scores are in sc already */
            for (int p = 0; p < np; p++) {
                s[p][0] = _mm512_loadu_ps(sc + (size_t)(p0 + p) * KB);
                s[p][1] = _mm512_loadu_ps(sc + (size_t)(p0 + p) * KB + 16);
            }
        if (qp) {
#define SCORES(NP) (U == 2 ? tile_scores_##NP##_2(s, qp + p0, kf, hd, scale) : tile_scores_##NP##_4(s, qp + p0, kf, hd, scale))
            switch (np) {
            case 1: SCORES(1); break;
            case 2: SCORES(2); break;
            case 3: SCORES(3); break;
            case 4: tile_scores_4_2(s, qp + p0, kf, hd, scale); break;
            case 5: tile_scores_5_2(s, qp + p0, kf, hd, scale); break;
            default: tile_scores_6_2(s, qp + p0, kf, hd, scale); break;
            }
#undef SCORES
        }
        for (int p = 0; p < np; p++) {
            pr[p0 + p] = sc + (size_t)(p0 + p) * KB;
            corr[p0 + p] = pair_softmax(s[p], m0, m1, sp[p0 + p], sc + (size_t)(p0 + p) * KB);
        }
    }
    const int n_chunks = (hd + 15) / 16;
    for (int p0 = 0; p0 < n; p0 += TILE_V) {
        const int np = n - p0 < TILE_V ? n - p0 : TILE_V;
        for (int c = 0; c < n_chunks; c += VCHUNKS) {
            const int nc = n_chunks - c < VCHUNKS ? n_chunks - c : VCHUNKS;
#define VALUES(NP)                                                                                 \
    switch (nc) {                                                                                  \
    case 1: tile_values_##NP##_1(ap + p0, corr + p0, pr + p0, vf, nv, hd, c); break;               \
    case 2: tile_values_##NP##_2(ap + p0, corr + p0, pr + p0, vf, nv, hd, c); break;               \
    case 3: tile_values_##NP##_3(ap + p0, corr + p0, pr + p0, vf, nv, hd, c); break;               \
    default: tile_values_##NP##_4(ap + p0, corr + p0, pr + p0, vf, nv, hd, c); break;              \
    }
            switch (np) {
            case 1: VALUES(1); break;
            case 2: VALUES(2); break;
            case 3: VALUES(3); break;
            case 4: VALUES(4); break;
            case 5: VALUES(5); break;
            default: VALUES(6); break;
            }
#undef VALUES
        }
    }
}

/* ---- q8_0 keys: VNNI scores (kv_q8.h) -------------------------------------------------------- */

#define TILE_Q8 6 /* pairs per q8_0 score tile: 6 x 2 int32 and 6 x 2 f32 accumulators */

/* The block's 32 keys for 512-bit dot products, into kscr: per group, per half of 16 keys, per
 * quad of 4 dimensions, 64 bytes (keys 16h .. 16h + 15, 4 bytes each, offset to unsigned by
 * + 128), then the f32 key scales [group][32]. Sub-blocks from n_sub on: zero keys and scales. */
static void q8_prepare16(float *kscr, const uint8_t *kb, int n_sub, int hd) {
    const int ng = hd / KV_Q8_BLOCK;
    uint8_t *kr = (uint8_t *)kscr;
    float *kd = kscr + (size_t)ng * 2 * 8 * 64 / 4;
    const size_t block = KEY_LANES * kv_q8_row_bytes(hd);
    const __m256i off = _mm256_set1_epi8((char)0x80);
    for (int b = 0; b < KB / KEY_LANES; b++) {
        const uint8_t *src = kb + b * block;
        for (int g = 0; g < ng; g++, src += KV_Q8_GROUP_BYTES) {
            uint8_t *dst = kr + ((size_t)(g * 2 + b / 2) * 8) * 64 + (b % 2) * 32;
            if (b >= n_sub) {
                for (int c = 0; c < 8; c++) _mm256_storeu_si256((__m256i *)(dst + 64 * c), off);
                _mm256_storeu_ps(kd + g * KB + 8 * b, _mm256_setzero_ps());
                continue;
            }
            _mm256_storeu_ps(kd + g * KB + 8 * b, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)src)));
            for (int c = 0; c < 8; c++)
                _mm256_storeu_si256((__m256i *)(dst + 64 * c),
                                    _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(src + 2 * KEY_LANES + 32 * c)), off));
        }
    }
}

/* Scaled scores of NP pairs against the prepared block: per group, vpdpbusd of the unsigned keys
 * and the signed query from -128 * sum(q) (so the int32 is exactly sum k q), then kv_q8.h's
 * float steps, lane for lane those of q8_scores8. */
static inline __attribute__((always_inline)) void q8_tile16(const int NP, float *sc, const uint8_t *const *qr,
                                                            const float *kscr, int hd, float scale) {
    const int ng = hd / KV_Q8_BLOCK;
    const uint8_t *kr = (const uint8_t *)kscr;
    const float *kd = kscr + (size_t)ng * 2 * 8 * 64 / 4;
    __m512 f[TILE_Q8][2];
    for (int p = 0; p < NP; p++) f[p][0] = f[p][1] = _mm512_setzero_ps();
    for (int g = 0; g < ng; g++) {
        __m512i a[TILE_Q8][2];
        for (int p = 0; p < NP; p++)
            a[p][0] = a[p][1] = _mm512_set1_epi32(-128 * kv_q8_query_sums(qr[p], hd)[g]);
        const uint8_t *k0 = kr + (size_t)g * 2 * 8 * 64, *k1 = k0 + 8 * 64;
        for (int c = 0; c < 8; c++) {
            const __m512i kv0 = _mm512_loadu_si512((const void *)(k0 + 64 * c));
            const __m512i kv1 = _mm512_loadu_si512((const void *)(k1 + 64 * c));
            for (int p = 0; p < NP; p++) {
                int32_t q4;
                memcpy(&q4, kv_q8_query_values(qr[p]) + g * KV_Q8_BLOCK + 4 * c, 4);
                const __m512i qv = _mm512_set1_epi32(q4);
                a[p][0] = _mm512_dpbusd_epi32(a[p][0], kv0, qv);
                a[p][1] = _mm512_dpbusd_epi32(a[p][1], kv1, qv);
            }
        }
        const __m512 kd0 = _mm512_loadu_ps(kd + g * KB), kd1 = _mm512_loadu_ps(kd + g * KB + 16);
        for (int p = 0; p < NP; p++) {
            const __m512 qd = _mm512_set1_ps(kv_q8_query_scales(qr[p], hd)[g]);
            f[p][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[p][0]), _mm512_mul_ps(kd0, qd), f[p][0]);
            f[p][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[p][1]), _mm512_mul_ps(kd1, qd), f[p][1]);
        }
    }
    const __m512 vs = _mm512_set1_ps(scale);
    for (int p = 0; p < NP; p++) {
        _mm512_storeu_ps(sc + (size_t)p * KB, _mm512_mul_ps(f[p][0], vs));
        _mm512_storeu_ps(sc + (size_t)p * KB + 16, _mm512_mul_ps(f[p][1], vs));
    }
}

static void q8_scores16(int n, const uint8_t *const *qr, float *sc, const uint8_t *kb, const float *kscr, int n_sub,
                        int hd, float scale) {
    (void)kb;
    (void)n_sub;
    for (int p0 = 0; p0 < n; p0 += TILE_Q8) {
        float *s = sc + (size_t)p0 * KB;
        switch (n - p0 < TILE_Q8 ? n - p0 : TILE_Q8) {
        case 1: q8_tile16(1, s, qr + p0, kscr, hd, scale); break;
        case 2: q8_tile16(2, s, qr + p0, kscr, hd, scale); break;
        case 3: q8_tile16(3, s, qr + p0, kscr, hd, scale); break;
        case 4: q8_tile16(4, s, qr + p0, kscr, hd, scale); break;
        case 5: q8_tile16(5, s, qr + p0, kscr, hd, scale); break;
        default: q8_tile16(6, s, qr + p0, kscr, hd, scale); break;
        }
    }
}

static const attn_tiles_variant TILES16 = {run_pairs, q8_prepare16, q8_scores16};

void attention_chunk_avx512(float *acc, int lda, float *ml, const float *q, int ldq, const void *k,
                            const void *v, int kv_f16, int pos0, int n_q, int group, int head_dim,
                            float scale, int window, int chunk, float *scratch) {
    if (!attn_tiles_eligible(n_q, kv_f16, head_dim))
        attention_chunk_avx2(acc, lda, ml, q, ldq, k, v, kv_f16, pos0, n_q, group, head_dim, scale, window, chunk,
                             scratch);
    else
        attn_tiles_chunk(&TILES16, acc, lda, ml, q, ldq, k, v, kv_f16, pos0, n_q, group, head_dim, scale, window,
                         chunk, scratch);
}

#endif
