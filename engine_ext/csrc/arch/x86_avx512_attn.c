/* Attention chunks in query tiles on AVX-512 (the avx512vnni table's attention_chunk; contract
 * in kernels.h).
 *
 * Design: a prefill at depth is mostly attention, and x86_avx2.c's chunk kernel reloads (and
 * converts) every key and value block once per query row. Here each block of ATTN_KEY_BLOCK keys
 * is converted once per call into f32 scratch (keys dimension-major, values row-major), and then
 * every (query row, head) pair of the call that needs the whole block runs against it in tiles of
 * pairs: one 16-lane key (or value) load serves up to TILE pairs' FMAs.
 *
 * NOTE: results are bit-identical to attention_chunk_avx2 (pool.py's NUMERICS maps avx512vnni
 * onto avx2, and tests/engine/test_kernels.py holds them equal), so each pair repeats that
 * kernel's operations lane for lane: a key's score sums over d in U interleaved partial sums
 * (U = 2 for heads in a full batch of HEAD_BATCH, else 4), combined in the same order; the
 * block max over the same lanes; the same exp polynomial; the probability sum as its 8-lane
 * vector then hsum256; values as acc * corr plus p_j v_j for j in order. A q8_0 element
 * converts as float(q) * d there and here. Pairs are tiled only with pairs of the same valid
 * key range [lo, nv), so no pair ever sees a key its row alone would not. Calls of one query row
 * (decode) go to the AVX2 kernel: they have nothing to share a block with.
 */
#if defined(__x86_64__) || defined(__i386__)

#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw")

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../fp16.h"
#include "../kernels.h"
#include "../kv_q8.h"

#define KB 32         /* keys per block (x86_avx2.c's ATTN_KEY_BLOCK: aligned to absolute positions) */
#define HEAD_BATCH 4  /* x86_avx2.c's: a head's batch size fixes its number of partial sums */
#define TILE_U2 6     /* pairs per score tile with 2 partial sums: 6 x 2 x 2 accumulators */
#define TILE_U4 3     /* with 4 partial sums: 3 x 4 x 2 */
#define TILE_V 6      /* pairs per value tile: 6 x VCHUNKS accumulators */
#define VCHUNKS 4     /* 16-float chunks of the head per value tile */

/* exp(x) as x86_avx2.c's exp256, lane for lane (same operations in the same order). */
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

static inline float exp1(float x) {
    float buf[16] = {x};
    _mm512_storeu_ps(buf, exp512(_mm512_loadu_ps(buf)));
    return buf[0];
}

/* x86_avx2.c's hsum256: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)). */
static inline float hsum256(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

static inline __m256 hi256(__m512 x) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)); }

/* Keys t0 .. t0 + 8 * n_sub - 1 of a k plane as f32 kf[d][KB]; later sub-blocks zero. */
static void convert_keys(float *kf, const void *k, int kv_type, int t0, int n_sub, int hd) {
    for (int b = 0; b < KB / KEY_LANES; b++) {
        float *dst = kf + b * KEY_LANES;
        if (b >= n_sub) {
            for (int d = 0; d < hd; d++) _mm256_storeu_ps(dst + (size_t)d * KB, _mm256_setzero_ps());
            continue;
        }
        const int t = t0 + b * KEY_LANES;
        if (kv_type == KV_Q8_0) {
            const uint8_t *kq = (const uint8_t *)k + (size_t)t / KEY_LANES * KEY_LANES * kv_q8_row_bytes(hd);
            for (int g = 0; g < hd / KV_Q8_BLOCK; g++) {
                const __m256 dsc = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)kq));
                kq += 2 * KEY_LANES;
                for (int j = 0; j < KV_Q8_BLOCK; j++, kq += KEY_LANES) {
                    const __m256i k8 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)kq));
                    _mm256_storeu_ps(dst + (size_t)(g * KV_Q8_BLOCK + j) * KB, _mm256_mul_ps(_mm256_cvtepi32_ps(k8), dsc));
                }
            }
        } else if (kv_type == KV_F16) {
            const uint16_t *kh = (const uint16_t *)k + key_index(t, 0, hd);
            for (int d = 0; d < hd; d++)
                _mm256_storeu_ps(dst + (size_t)d * KB, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kh + d * KEY_LANES))));
        } else {
            const float *kfl = (const float *)k + key_index(t, 0, hd);
            for (int d = 0; d < hd; d++) _mm256_storeu_ps(dst + (size_t)d * KB, _mm256_loadu_ps(kfl + d * KEY_LANES));
        }
    }
}

/* Value rows t0 .. t0 + n - 1 as f32 rows of hd (f32 planes are read in place). */
static const float *convert_values(float *vf, const void *v, int kv_type, int t0, int n, int hd) {
    if (kv_type == KV_F32) return (const float *)v + (size_t)t0 * hd;
    for (int j = 0; j < n; j++) {
        float *dst = vf + (size_t)j * hd;
        if (kv_type == KV_Q8_0) {
            const uint8_t *row = (const uint8_t *)v + (size_t)(t0 + j) * kv_q8_row_bytes(hd);
            for (int g = 0; g < hd / KV_Q8_BLOCK; g++, row += KV_Q8_BLOCK_BYTES) {
                uint16_t dh;
                memcpy(&dh, row, 2);
                const __m256 d = _mm256_set1_ps(_cvtsh_ss(dh));
                for (int c = 0; c < KV_Q8_BLOCK / 8; c++) {
                    const __m256i v8 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + 2 + 8 * c)));
                    _mm256_storeu_ps(dst + g * KV_Q8_BLOCK + 8 * c, _mm256_mul_ps(_mm256_cvtepi32_ps(v8), d));
                }
            }
        } else {
            const uint16_t *vh = (const uint16_t *)v + (size_t)(t0 + j) * hd;
            for (int c = 0; c < hd; c += 8)
                _mm256_storeu_ps(dst + c, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vh + c))));
        }
    }
    return vf;
}

/* Scores of the block's KB keys for NP pairs with U partial sums, scaled: s[p][0..1]. */
static inline __attribute__((always_inline)) void tile_scores(const int NP, const int U, __m512 (*s)[2],
                                                              const float *const *qp, const float *kf, int hd,
                                                              float scale) {
    __m512 part[TILE_U2][4][2];
    for (int p = 0; p < NP; p++)
        for (int u = 0; u < U; u++) part[p][u][0] = part[p][u][1] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d += U)
        for (int u = 0; u < U; u++) {
            const __m512 k0 = _mm512_loadu_ps(kf + (size_t)(d + u) * KB), k1 = _mm512_loadu_ps(kf + (size_t)(d + u) * KB + 16);
            for (int p = 0; p < NP; p++) {
                const __m512 b = _mm512_set1_ps(qp[p][d + u]);
                part[p][u][0] = _mm512_fmadd_ps(b, k0, part[p][u][0]);
                part[p][u][1] = _mm512_fmadd_ps(b, k1, part[p][u][1]);
            }
        }
    const __m512 vs = _mm512_set1_ps(scale);
    for (int p = 0; p < NP; p++)
        for (int h = 0; h < 2; h++) {
            const __m512 sum = U == 2 ? _mm512_add_ps(part[p][0][h], part[p][1][h])
                                      : _mm512_add_ps(_mm512_add_ps(part[p][0][h], part[p][1][h]),
                                                      _mm512_add_ps(part[p][2][h], part[p][3][h]));
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
#define SCORES(NP)                                                          \
    (U == 2 ? tile_scores(NP, 2, s, qp + p0, kf, hd, scale) : tile_scores(NP, 4, s, qp + p0, kf, hd, scale))
        switch (np) {
        case 1: SCORES(1); break;
        case 2: SCORES(2); break;
        case 3: SCORES(3); break;
        case 4: tile_scores(4, 2, s, qp + p0, kf, hd, scale); break;
        case 5: tile_scores(5, 2, s, qp + p0, kf, hd, scale); break;
        default: tile_scores(6, 2, s, qp + p0, kf, hd, scale); break;
        }
#undef SCORES
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
    if (n_q < 2 || head_dim % 8 != 0 || (kv_f16 == KV_Q8_0 && head_dim % KV_Q8_BLOCK != 0)) {
        attention_chunk_avx2(acc, lda, ml, q, ldq, k, v, kv_f16, pos0, n_q, group, head_dim, scale, window, chunk,
                             scratch);
        return;
    }
    const int hd = head_dim;
    float *kf = scratch, *vf = kf + (size_t)KB * hd, *sc = vf + (size_t)KB * hd; /* sc: [pairs][KB] */
    const int c0 = chunk * ATTN_CHUNK;
    const int c1 = pos0 + n_q < c0 + ATTN_CHUNK ? pos0 + n_q : c0 + ATTN_CHUNK; /* keys any row needs */
    for (int i = 0; i < n_q; i++)
        for (int g = 0; g < group; g++) {
            memset(acc + (size_t)i * lda + (size_t)g * hd, 0, sizeof(float) * hd);
            ml[2 * (i * group + g)] = -INFINITY;
            ml[2 * (i * group + g) + 1] = 0.0f;
        }
    /* heads in a full batch of HEAD_BATCH sum scores in 2 partials, the rest in 4 (x86_avx2.c) */
    const int full = group / HEAD_BATCH * HEAD_BATCH;
    const int first = window > 0 && pos0 - window + 1 > c0 ? c0 + (pos0 - window + 1 - c0) / KB * KB : c0;
    for (int t0 = first; t0 < c1; t0 += KB) {
        const int nk = c1 - t0 < KB ? c1 - t0 : KB;
        int lo[ATTN_MAX_ROWS], nv[ATTN_MAX_ROWS], nv_max = 0;
        for (int i = 0; i < n_q; i++) {
            const int pos = pos0 + i;
            lo[i] = window > 0 && pos - window + 1 > t0 ? pos - window + 1 - t0 : 0; /* first key in window */
            nv[i] = pos < t0 || lo[i] >= KB ? 0 : (pos + 1 - t0 < nk ? pos + 1 - t0 : nk);
            nv_max = nv[i] > nv_max ? nv[i] : nv_max;
        }
        if (nv_max == 0) continue;
        convert_keys(kf, k, kv_f16, t0, (nv_max + KEY_LANES - 1) / KEY_LANES, hd);
        const float *vrows = convert_values(vf, v, kv_f16, t0, nv_max, hd);
        for (int i = 0; i < n_q;) {
            int j = i + 1;
            while (j < n_q && lo[j] == lo[i] && nv[j] == nv[i]) j++;
            if (nv[i] > 0)
                for (int cls = 0; cls < 2; cls++) { /* U = 2 heads, then U = 4 heads */
                    const int h0 = cls ? full : 0, h1 = cls ? group : full;
                    const float *qp[ATTN_MAX_ROWS];
                    float *ap[ATTN_MAX_ROWS], *sp[ATTN_MAX_ROWS];
                    int n = 0;
                    for (int r = i; r < j; r++)
                        for (int h = h0; h < h1; h++, n++) {
                            qp[n] = q + (size_t)r * ldq + (size_t)h * hd;
                            ap[n] = acc + (size_t)r * lda + (size_t)h * hd;
                            sp[n] = ml + 2 * (r * group + h);
                        }
                    if (n) run_pairs(cls ? 4 : 2, n, qp, ap, sp, sc, kf, vrows, lo[i], nv[i], hd, scale);
                }
            i = j;
        }
    }
}

#endif
