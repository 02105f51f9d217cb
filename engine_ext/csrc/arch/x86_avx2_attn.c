/* AVX2 attention chunks (contract in kernels.h): the row kernel, which walks one query row at a
 * time and shares each loaded key vector among up to HEAD_BATCH heads of the row (decode), and
 * the tiled kernel for calls of several rows (prefill; x86_attn_tiles.h), bit-identical to it.
 * Score tiles are 6 (or 3) pairs x 8 keys, value tiles 4 pairs x 24 floats: 12 accumulators of
 * the 16 registers.
 */
#if defined(__x86_64__) || defined(__i386__)

#pragma GCC target("avx2,fma,f16c")

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../fp16.h"
#include "../kernels.h"
#include "../kv_q8.h"
#include "x86_attn_tiles.h"
#include "x86_avx2_math.h"

/* ---- one query row at a time (decode; the reference the tiles repeat) --------------------- */

#define ATTN_KEY_BLOCK KB /* keys per attention block (aligned to absolute positions) */

/* Scores of 8 keys (one f16 or f32 key block) for NH heads: s[h] lane j = q_h . key j. Per (head, key) the
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
 * (keys before t0 + lo lie outside a sliding window: probability exactly 0); q8_0 keys are scored
 * with the heads' quantized queries qr (x86_attn_tiles.h q8_scores8), others with qh:
 * scores, online-softmax update of (m, l), value accumulation. sc: [HEAD_BATCH][ATTN_KEY_BLOCK]. */
static inline __attribute__((always_inline)) void attend_block(
    const int NH, const int F16, const float *const *qh, const uint8_t *const *qr, float *const *ah,
    float *const *st, const void *k, const void *v, int t0, int lo, int nv, int hd, float scale, float *sc) {
    const __m256 vscale = _mm256_set1_ps(scale);
    __m256 vmax[HEAD_BATCH];
    for (int h = 0; h < NH; h++) vmax[h] = _mm256_set1_ps(-INFINITY);
    for (int j = 0; j < nv; j += KEY_LANES) {
        __m256 s[HEAD_BATCH];
        const size_t kb_off = F16 == KV_Q8_0 ? (size_t)(t0 + j) / KEY_LANES * KEY_LANES * kv_q8_row_bytes(hd)
                                             : key_index(t0 + j, 0, hd) * (F16 ? 2 : 4);
        if (F16 == KV_Q8_0) q8_scores8(NH, s, qr, (const uint8_t *)k + kb_off, hd); /* quantized queries */
        else block_scores(NH, F16, s, qh, (const char *)k + kb_off, hd);
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
    const int hd = head_dim;
    float *sc = scratch; /* [HEAD_BATCH][KB] scores, then probabilities */
    uint8_t *qbuf = (uint8_t *)(sc + HEAD_BATCH * KB); /* q8_0: every (row, head) query quantized */
    const size_t qbytes = kv_q8_query_bytes(hd);
    if (kv_f16 == KV_Q8_0) attn_q8_queries(qbuf, q, ldq, n_q, group, hd);
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
                const uint8_t *qr[HEAD_BATCH];
                float *ah[HEAD_BATCH], *st[HEAD_BATCH];
                for (int h = 0; h < nh; h++) {
                    qh[h] = q + (size_t)i * ldq + (size_t)(h0 + h) * hd;
                    qr[h] = qbuf + (size_t)(i * group + h0 + h) * qbytes;
                    ah[h] = acc + (size_t)i * lda + (size_t)(h0 + h) * hd;
                    st[h] = ml + 2 * (i * group + h0 + h);
                }
                if (kv_f16 == KV_Q8_0) {
                    if (nh == 4) attend_block(4, KV_Q8_0, qh, qr, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                    else if (nh == 3) attend_block(3, KV_Q8_0, qh, qr, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                    else if (nh == 2) attend_block(2, KV_Q8_0, qh, qr, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                    else attend_block(1, KV_Q8_0, qh, qr, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                } else if (kv_f16) {
                    if (nh == 4) attend_block(4, 1, qh, qr, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                    else if (nh == 3) attend_block(3, 1, qh, qr, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                    else if (nh == 2) attend_block(2, 1, qh, qr, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                    else attend_block(1, 1, qh, qr, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                } else {
                    if (nh == 4) attend_block(4, 0, qh, qr, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                    else if (nh == 3) attend_block(3, 0, qh, qr, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                    else if (nh == 2) attend_block(2, 0, qh, qr, ah, st, k, v, t0, lo, nv, hd, scale, sc);
                    else attend_block(1, 0, qh, qr, ah, st, k, v, t0, lo, nv, hd, scale, sc);
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


/* ---- query tiles (x86_attn_tiles.h) --------------------------------------------------------- */

#define T8_U2 6  /* pairs per score tile with 2 partial sums */
#define T8_U4 3  /* with 4 */
#define T8_V 4   /* pairs per value tile */
#define T8_VC 3  /* 8-float chunks per value tile */

/* Scores of keys 8b .. 8b + 7 of the converted block for NP pairs, U partial sums, scaled, into
 * sc[p * KB + 8b]. */
static inline __attribute__((always_inline)) void tile8_scores(const int NP, const int U, float *sc,
                                                               const float *const *qp, const float *kf, int b, int hd,
                                                               float scale) {
    __m256 part[T8_U2][4];
    for (int p = 0; p < NP; p++)
        for (int u = 0; u < U; u++) part[p][u] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d += U)
        for (int u = 0; u < U; u++) {
            const __m256 kt = _mm256_loadu_ps(kf + (size_t)(d + u) * KB + 8 * b);
            for (int p = 0; p < NP; p++) part[p][u] = _mm256_fmadd_ps(_mm256_set1_ps(qp[p][d + u]), kt, part[p][u]);
        }
    const __m256 vs = _mm256_set1_ps(scale);
    for (int p = 0; p < NP; p++) {
        const __m256 s = U == 2 ? _mm256_add_ps(part[p][0], part[p][1])
                                : _mm256_add_ps(_mm256_add_ps(part[p][0], part[p][1]), _mm256_add_ps(part[p][2], part[p][3]));
        _mm256_storeu_ps(sc + (size_t)p * KB + 8 * b, _mm256_mul_ps(s, vs));
    }
}

/* attend_block's softmax on one pair's stored scores p[0 .. nv): returns the correction. */
static inline float pair_softmax8(float *p, float *st, int lo, int nv) {
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    for (int j = 0; j < nv; j += KEY_LANES)
        vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_loadu_ps(p + j), lane_range(lo - j, nv - j)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float bm = _mm_cvtss_f32(m4);
    const float m_new = st[0] > bm ? st[0] : bm;
    const float corr = st[0] == -INFINITY ? 0.0f : exp1(st[0] - m_new);
    const __m256 vm = _mm256_set1_ps(m_new);
    __m256 lsum = _mm256_setzero_ps();
    for (int j = 0; j < nv; j += 8) {
        __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_loadu_ps(p + j), vm)), lane_range(lo - j, nv - j));
        _mm256_storeu_ps(p + j, e);
        lsum = _mm256_add_ps(lsum, e);
    }
    st[1] = st[1] * corr + hsum256(lsum);
    st[0] = m_new;
    return corr;
}

/* acc_p[chunks c0 .. c0 + NC) = acc_p * corr_p + sum_{j < nv} pr_p[j] v[j] for NP pairs.
 * NOTE: named accumulators (as x86_avx512_attn.c's value tiles): an array of them GCC also
 * stored to the stack after every FMA. */
#define T8_ALL(X) X(0, 0) X(0, 1) X(0, 2) X(1, 0) X(1, 1) X(1, 2) X(2, 0) X(2, 1) X(2, 2) X(3, 0) X(3, 1) X(3, 2)
static inline __attribute__((always_inline)) void tile8_values(const int NP, const int NC, float *const *ap,
                                                               const float *corr, const float *sc, const float *vf,
                                                               int nv, int hd, int c0) {
#define T8_DECL(p, c) __m256 a##p##c = _mm256_setzero_ps();
#define T8_INIT(p, c) \
    if (NP > p && NC > c) a##p##c = _mm256_mul_ps(_mm256_loadu_ps(ap[p] + 8 * (c0 + c)), _mm256_set1_ps(corr[p]));
#define T8_FMA(p, c) \
    if (NP > p && NC > c) a##p##c = _mm256_fmadd_ps(_mm256_set1_ps(sc[(size_t)p * KB + j]), v##c, a##p##c);
#define T8_STORE(p, c) \
    if (NP > p && NC > c) _mm256_storeu_ps(ap[p] + 8 * (c0 + c), a##p##c);
    T8_ALL(T8_DECL)
    T8_ALL(T8_INIT)
    for (int j = 0; j < nv; j++) {
        const float *vj = vf + (size_t)j * hd + 8 * c0;
        const __m256 v0 = _mm256_loadu_ps(vj);
        const __m256 v1 = NC > 1 ? _mm256_loadu_ps(vj + 8) : v0;
        const __m256 v2 = NC > 2 ? _mm256_loadu_ps(vj + 16) : v0;
        T8_ALL(T8_FMA)
    }
    T8_ALL(T8_STORE)
#undef T8_DECL
#undef T8_INIT
#undef T8_FMA
#undef T8_STORE
}
#undef T8_ALL

static void run_pairs8(int U, int n, const float *const *qp, float *const *ap, float *const *sp, float *sc,
                       const float *kf, const float *vf, int lo, int nv, int hd, float scale) {
    const int tile = U == 2 ? T8_U2 : T8_U4, n_sub = (nv + KEY_LANES - 1) / KEY_LANES;
    for (int p0 = 0; qp && p0 < n; p0 += tile) { /* q8_0 (qp NULL): scores already in sc */
        const int np = n - p0 < tile ? n - p0 : tile;
        float *s = sc + (size_t)p0 * KB;
        for (int b = 0; b < n_sub; b++) {
#define SCORES(NP) (U == 2 ? tile8_scores(NP, 2, s, qp + p0, kf, b, hd, scale) : tile8_scores(NP, 4, s, qp + p0, kf, b, hd, scale))
            switch (np) {
            case 1: SCORES(1); break;
            case 2: SCORES(2); break;
            case 3: SCORES(3); break;
            case 4: tile8_scores(4, 2, s, qp + p0, kf, b, hd, scale); break;
            case 5: tile8_scores(5, 2, s, qp + p0, kf, b, hd, scale); break;
            default: tile8_scores(6, 2, s, qp + p0, kf, b, hd, scale); break;
            }
#undef SCORES
        }
    }
    float corr[ATTN_MAX_ROWS];
    for (int p = 0; p < n; p++) corr[p] = pair_softmax8(sc + (size_t)p * KB, sp[p], lo, nv);
    const int n_chunks = hd / 8;
    for (int p0 = 0; p0 < n; p0 += T8_V) {
        const int np = n - p0 < T8_V ? n - p0 : T8_V;
        const float *s = sc + (size_t)p0 * KB;
        for (int c = 0; c < n_chunks; c += T8_VC) {
            const int nc = n_chunks - c < T8_VC ? n_chunks - c : T8_VC;
#define VALUES(NP)                                                                      \
    switch (nc) {                                                                       \
    case 1: tile8_values(NP, 1, ap + p0, corr + p0, s, vf, nv, hd, c); break;           \
    case 2: tile8_values(NP, 2, ap + p0, corr + p0, s, vf, nv, hd, c); break;           \
    default: tile8_values(NP, 3, ap + p0, corr + p0, s, vf, nv, hd, c); break;          \
    }
            switch (np) {
            case 1: VALUES(1); break;
            case 2: VALUES(2); break;
            case 3: VALUES(3); break;
            default: VALUES(4); break;
            }
#undef VALUES
        }
    }
}

/* q8_0 scores of pairs [0, n) against the block at kb: the row kernel's q8_scores8, 4 pairs at
 * a time, times the scale (attend_block's order). */
static void q8_scores_tiles8(int n, const uint8_t *const *qr, float *sc, const uint8_t *kb, const float *kscr,
                             int n_sub, int hd, float scale) {
    (void)kscr;
    const __m256 vs = _mm256_set1_ps(scale);
    const size_t block = KEY_LANES * kv_q8_row_bytes(hd);
    for (int p0 = 0; p0 < n; p0 += HEAD_BATCH) {
        const int np = n - p0 < HEAD_BATCH ? n - p0 : HEAD_BATCH;
        for (int b = 0; b < n_sub; b++) {
            __m256 s[HEAD_BATCH];
            switch (np) {
            case 1: q8_scores8(1, s, qr + p0, kb + b * block, hd); break;
            case 2: q8_scores8(2, s, qr + p0, kb + b * block, hd); break;
            case 3: q8_scores8(3, s, qr + p0, kb + b * block, hd); break;
            default: q8_scores8(4, s, qr + p0, kb + b * block, hd); break;
            }
            for (int p = 0; p < np; p++) _mm256_storeu_ps(sc + (size_t)(p0 + p) * KB + 8 * b, _mm256_mul_ps(s[p], vs));
        }
    }
}

static const attn_tiles_variant TILES8 = {run_pairs8, NULL, q8_scores_tiles8};

/* The avx2 table's chunk kernel: query tiles for calls of several rows, the row kernel else. */
void attention_chunk_avx2_tiles(float *acc, int lda, float *ml, const float *q, int ldq, const void *k,
                                const void *v, int kv_f16, int pos0, int n_q, int group, int head_dim,
                                float scale, int window, int chunk, float *scratch) {
    if (!attn_tiles_eligible(n_q, kv_f16, head_dim))
        attention_chunk_avx2(acc, lda, ml, q, ldq, k, v, kv_f16, pos0, n_q, group, head_dim, scale, window, chunk,
                             scratch);
    else
        attn_tiles_chunk(&TILES8, acc, lda, ml, q, ldq, k, v, kv_f16, pos0, n_q, group, head_dim, scale, window,
                         chunk, scratch);
}

#endif
