/* Attention chunks in query tiles on AVX-512: the avx512vnni table's attention_chunk (contract
 * in kernels.h; the tiling and why it is bit-identical to the AVX2 row kernel: x86_attn_tiles.h).
 * Score tiles are 8 pairs x 16 keys (each half of a block in turn), value tiles 6 pairs x 64
 * floats.
 * Calls of one query row (decode) go to the AVX2 row kernel: nothing shares their blocks.
 */
#if defined(__x86_64__) || defined(__i386__)

#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw")

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../kernels.h"
#include "x86_attn_tiles.h"
#include "x86_avx2_math.h"

#define TILE_U2 8     /* pairs per score tile with 2 partial sums: 8 x 2 accumulators */
#define TILE_U4 4     /* with 4 partial sums: 4 x 4 */
#define TILE_V 6      /* pairs per value tile: 6 x VCHUNKS accumulators */
#define VCHUNKS 4     /* 16-float chunks of the head per value tile */

/* exp(x) as x86_avx2_math.h's exp256, lane for lane (same operations in the same order). */
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

static inline __m256 hi256(__m512 x) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)); }

/* Scores of keys 16h .. 16h + 15 of the block for NP pairs with U partial sums, scaled, into
 * s[p][h]. NOTE: one 16-lane half at a time keeps NP x U <= 16 accumulators in registers (the
 * two halves at once spilled at 6 pairs). */
static inline __attribute__((always_inline)) void tile_scores(const int NP, const int U, __m512 (*s)[2],
                                                              const float *const *qp, const float *kf, int h,
                                                              int hd, float scale) {
    __m512 part[TILE_U2][4];
    for (int p = 0; p < NP; p++)
        for (int u = 0; u < U; u++) part[p][u] = _mm512_setzero_ps();
    const float *kh = kf + 16 * h;
    for (int d = 0; d < hd; d += U)
        for (int u = 0; u < U; u++) {
            const __m512 kv = _mm512_loadu_ps(kh + (size_t)(d + u) * KB);
            for (int p = 0; p < NP; p++) part[p][u] = _mm512_fmadd_ps(_mm512_set1_ps(qp[p][d + u]), kv, part[p][u]);
        }
    const __m512 vs = _mm512_set1_ps(scale);
    for (int p = 0; p < NP; p++) {
        const __m512 sum = U == 2 ? _mm512_add_ps(part[p][0], part[p][1])
                                  : _mm512_add_ps(_mm512_add_ps(part[p][0], part[p][1]),
                                                  _mm512_add_ps(part[p][2], part[p][3]));
        s[p][h] = _mm512_mul_ps(sum, vs);
    }
}

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

/* acc_p[chunks c0 .. c0 + NC) = acc_p * corr_p + sum_{j < nv} pr_p[j] v[j] for NP pairs. */
static inline __attribute__((always_inline)) void tile_values(const int NP, const int NC, float *const *ap,
                                                              const float *corr, const float *const *pr,
                                                              const float *vf, int nv, int hd, int c0) {
    __m512 a[TILE_V][VCHUNKS];
    const int tail = hd - 16 * (c0 + NC - 1); /* floats in the last chunk: 16, or 8 */
    const __mmask16 last = tail >= 16 ? 0xFFFF : (__mmask16)((1u << tail) - 1);
    for (int p = 0; p < NP; p++)
        for (int c = 0; c < NC; c++)
            a[p][c] = _mm512_mul_ps(_mm512_maskz_loadu_ps(c == NC - 1 ? last : 0xFFFF, ap[p] + 16 * (c0 + c)),
                                    _mm512_set1_ps(corr[p]));
    for (int j = 0; j < nv; j++) {
        const float *vj = vf + (size_t)j * hd + 16 * c0;
        for (int c = 0; c < NC; c++) {
            const __m512 vc = _mm512_maskz_loadu_ps(c == NC - 1 ? last : 0xFFFF, vj + 16 * c);
            for (int p = 0; p < NP; p++) a[p][c] = _mm512_fmadd_ps(_mm512_set1_ps(pr[p][j]), vc, a[p][c]);
        }
    }
    for (int p = 0; p < NP; p++)
        for (int c = 0; c < NC; c++) _mm512_mask_storeu_ps(ap[p] + 16 * (c0 + c), c == NC - 1 ? last : 0xFFFF, a[p][c]);
}

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
        for (int h = 0; h < 2; h++) {
#define SCORES(NP)                                                                                  \
    (U == 2 ? tile_scores(NP, 2, s, qp + p0, kf, h, hd, scale) : tile_scores(NP, 4, s, qp + p0, kf, h, hd, scale))
            switch (np) {
            case 1: SCORES(1); break;
            case 2: SCORES(2); break;
            case 3: SCORES(3); break;
            case 4: SCORES(4); break;
            case 5: tile_scores(5, 2, s, qp + p0, kf, h, hd, scale); break;
            case 6: tile_scores(6, 2, s, qp + p0, kf, h, hd, scale); break;
            case 7: tile_scores(7, 2, s, qp + p0, kf, h, hd, scale); break;
            default: tile_scores(8, 2, s, qp + p0, kf, h, hd, scale); break;
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
    case 1: tile_values(NP, 1, ap + p0, corr + p0, pr + p0, vf, nv, hd, c); break;                 \
    case 2: tile_values(NP, 2, ap + p0, corr + p0, pr + p0, vf, nv, hd, c); break;                 \
    case 3: tile_values(NP, 3, ap + p0, corr + p0, pr + p0, vf, nv, hd, c); break;                 \
    default: tile_values(NP, 4, ap + p0, corr + p0, pr + p0, vf, nv, hd, c); break;                \
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

void attention_chunk_avx512(float *acc, int lda, float *ml, const float *q, int ldq, const void *k,
                            const void *v, int kv_f16, int pos0, int n_q, int group, int head_dim,
                            float scale, int window, int chunk, float *scratch) {
    if (n_q < 2 || head_dim % 8 != 0 || (kv_f16 == KV_Q8_0 && head_dim % KV_Q8_BLOCK != 0))
        attention_chunk_avx2(acc, lda, ml, q, ldq, k, v, kv_f16, pos0, n_q, group, head_dim, scale, window, chunk,
                             scratch);
    else
        attn_tiles_chunk(run_pairs, acc, lda, ml, q, ldq, k, v, kv_f16, pos0, n_q, group, head_dim, scale, window,
                         chunk, scratch);
}

#endif
