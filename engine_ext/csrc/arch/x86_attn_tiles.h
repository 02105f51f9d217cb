/* Attention chunks in query tiles: what the AVX2 and AVX-512 tiled kernels share
 * (x86_avx2_attn.c, x86_avx512_attn.c; contract in kernels.h).
 *
 * Design: a prefill at depth is mostly attention, and a kernel that walks one query row at a
 * time reloads (and converts) every key and value block once per row. Here each block of KB keys
 * is converted once per call into f32 scratch (keys dimension-major kf[d][KB], values row-major
 * vf[j][hd]), and every (query row, head) pair of the call that needs the block runs against it
 * in register tiles of pairs (the variant's `run` function): one key or value vector load
 * serves several pairs' FMAs.
 *
 * NOTE: results are bit-identical to the row-at-a-time AVX2 kernel (attention_chunk_avx2), so
 * each pair repeats its operations lane for lane: a key's score sums over d in U interleaved
 * partial sums (U = 2 for heads in a full batch of HEAD_BATCH heads, else 4), combined in the
 * same order; the block max over the same lanes; exp256's polynomial; the probability sum as an
 * 8-lane vector then hsum256; values as acc * corr plus p_j v_j for j in order. A q8_0 value
 * converts as float(q) * d in both. q8_0 keys are scored in integers (kv_q8.h): each (row, head)
 * query is quantized once per call by the one scalar function, each block's int8 dot product is
 * exact however it is summed, and the float steps per key are kv_q8.h's, so the AVX2 row
 * kernel (q8_scores8), the AVX2 tiles (the same) and the AVX-512 tiles (VNNI, 16 keys a
 * vector) agree bit for bit. Pairs are tiled only with pairs of the same valid key range
 * [lo, nv), so no pair sees a key its row alone would not.
 * Include only from files compiled for AVX2 (their `#pragma GCC target`).
 */
#ifndef SLOTSERVE_X86_ATTN_TILES_H
#define SLOTSERVE_X86_ATTN_TILES_H

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../kernels.h"
#include "../kv_q8.h"

#define KB 32         /* keys per block, aligned to absolute positions (the row kernel's too) */
#define HEAD_BATCH 4  /* the row kernel's heads per key load: a head's batch fixes its U */

/* Whether a chunk call runs in query tiles (else the AVX2 row kernel, which sends head sizes
 * that are not a multiple of 8, or of 32 for q8_0, on to the generic kernel): several query
 * rows, and a head size the converted blocks' 8-lane vectors cover. The AVX2 and AVX-512
 * tables' chunk kernels both ask this. */
static inline int attn_tiles_eligible(int n_q, int kv_type, int head_dim) {
    return n_q >= 2 && head_dim % 8 == 0 && (kv_type != KV_Q8_0 || head_dim % KV_Q8_BLOCK == 0);
}

/* kv_q8_quantize_query in 8-lane vectors, byte for byte the same (the same max, division,
 * product and kv_q8_round's steps): every chunk call quantizes its queries again, which in
 * scalar code (roundf) cost a tenth of a prefill's attention. */
static inline void attn_q8_quantize_query(uint8_t *dst, const float *x, int hd) {
    int8_t *q = (int8_t *)dst;
    float *qd = (float *)(void *)(dst + hd);
    int32_t *qs = (int32_t *)(void *)(dst + hd + (size_t)hd / KV_Q8_BLOCK * 4);
    const __m256 sign = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f), nhalf = _mm256_set1_ps(-0.5f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int b = 0; b < hd / KV_Q8_BLOCK; b++, x += KV_Q8_BLOCK) {
        __m256 v[4];
        __m256 m = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + 8 * i);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        const float d = _mm_cvtss_f32(m4) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        __m256i t[4], sum = _mm256_setzero_si256();
        for (int i = 0; i < 4; i++) {
            const __m256 y = _mm256_mul_ps(v[i], _mm256_set1_ps(id));
            const __m256i ti = _mm256_cvttps_epi32(y);
            const __m256 f = _mm256_sub_ps(y, _mm256_cvtepi32_ps(ti));
            t[i] = _mm256_add_epi32(_mm256_sub_epi32(ti, _mm256_castps_si256(_mm256_cmp_ps(f, half, _CMP_GE_OQ))),
                                    _mm256_castps_si256(_mm256_cmp_ps(f, nhalf, _CMP_LE_OQ)));
            sum = _mm256_add_epi32(sum, t[i]);
        }
        const __m256i b8 = _mm256_packs_epi16(_mm256_packs_epi32(t[0], t[1]), _mm256_packs_epi32(t[2], t[3]));
        _mm256_storeu_si256((__m256i *)(q + b * KV_Q8_BLOCK), _mm256_permutevar8x32_epi32(b8, order));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        qd[b] = d;
        qs[b] = _mm_cvtsi128_si32(s4);
    }
}

/* Every (row, head) query of a call quantized (kv_q8.h), pair i * group + h at
 * qbuf + pair * kv_q8_query_bytes(hd). */
static inline void attn_q8_queries(uint8_t *qbuf, const float *q, int ldq, int n_q, int group, int hd) {
    for (int i = 0; i < n_q; i++)
        for (int h = 0; h < group; h++)
            attn_q8_quantize_query(qbuf + (size_t)(i * group + h) * kv_q8_query_bytes(hd), q + (size_t)i * ldq + (size_t)h * hd, hd);
}

/* Unscaled scores of the 8 keys of one q8_0 key block (kv_q8.h) for NH <= HEAD_BATCH quantized
 * queries: per group, each key's exact int8 dot product (|k| times q with k's sign, vpmaddubsw's
 * pairs at most 2 * 127 * 127: no saturation), then s = fma(float(isum), kd * qd, s). */
static inline __attribute__((always_inline)) void q8_scores8(const int NH, __m256 *s, const uint8_t *const *qr,
                                                             const uint8_t *kb, int hd) {
    const __m256i ones = _mm256_set1_epi16(1);
    const int8_t *q0 = kv_q8_query_values(qr[0]), *q1 = kv_q8_query_values(qr[NH > 1 ? 1 : 0]);
    const int8_t *q2 = kv_q8_query_values(qr[NH > 2 ? 2 : 0]), *q3 = kv_q8_query_values(qr[NH > 3 ? 3 : 0]);
    const float *d0 = kv_q8_query_scales(qr[0], hd), *d1 = kv_q8_query_scales(qr[NH > 1 ? 1 : 0], hd);
    const float *d2 = kv_q8_query_scales(qr[NH > 2 ? 2 : 0], hd), *d3 = kv_q8_query_scales(qr[NH > 3 ? 3 : 0], hd);
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int g = 0; g < hd / KV_Q8_BLOCK; g++, kb += KV_Q8_GROUP_BYTES) {
        __m256i i0 = _mm256_setzero_si256(), i1 = i0, i2 = i0, i3 = i0;
        /* not unrolled: unrolled, GCC reassociated the integer sums into trees of 32 products
         * and spilled them */
#pragma GCC unroll 1
        for (int c = 0; c < KV_Q8_BLOCK / 4; c++) {
            const __m256i k8 = _mm256_loadu_si256((const __m256i *)(kb + 2 * KEY_LANES + 32 * c));
            const __m256i ak = _mm256_abs_epi8(k8);
            const int at = g * KV_Q8_BLOCK + 4 * c;
            int32_t w;
#define Q8_DOT(H)                                                                                       \
    if (NH > H) {                                                                                       \
        memcpy(&w, q##H + at, 4);                                                                       \
        i##H = _mm256_add_epi32(i##H, _mm256_madd_epi16(_mm256_maddubs_epi16(ak, _mm256_sign_epi8(_mm256_set1_epi32(w), k8)), ones)); \
    }
            Q8_DOT(0)
            Q8_DOT(1)
            Q8_DOT(2)
            Q8_DOT(3)
#undef Q8_DOT
        }
        const __m256 kd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)kb));
        s0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_mul_ps(kd, _mm256_set1_ps(d0[g])), s0);
        if (NH > 1) s1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_mul_ps(kd, _mm256_set1_ps(d1[g])), s1);
        if (NH > 2) s2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i2), _mm256_mul_ps(kd, _mm256_set1_ps(d2[g])), s2);
        if (NH > 3) s3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i3), _mm256_mul_ps(kd, _mm256_set1_ps(d3[g])), s3);
    }
    s[0] = s0;
    if (NH > 1) s[1] = s1;
    if (NH > 2) s[2] = s2;
    if (NH > 3) s[3] = s3;
}

/* Keys t0 .. t0 + 8 * n_sub - 1 of an f16 or f32 k plane as f32 kf[d][KB]; later sub-blocks zero. */
static void attn_convert_keys(float *kf, const void *k, int kv_type, int t0, int n_sub, int hd) {
    for (int b = 0; b < KB / KEY_LANES; b++) {
        float *dst = kf + b * KEY_LANES;
        if (b >= n_sub) {
            for (int d = 0; d < hd; d++) _mm256_storeu_ps(dst + (size_t)d * KB, _mm256_setzero_ps());
            continue;
        }
        const int t = t0 + b * KEY_LANES;
        if (kv_type == KV_F16) {
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
static const float *attn_convert_values(float *vf, const void *v, int kv_type, int t0, int n, int hd) {
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

/* The variant's tile runner: pairs [0, n) with U partial sums and valid keys [lo, nv) of the
 * converted block; (m, l) states in sp, accumulators in ap; sc: [n][KB] probabilities. qp NULL
 * (q8_0 keys): the scaled scores are already in sc, and kf is not used. */
typedef void (*attn_run_fn)(int U, int n, const float *const *qp, float *const *ap, float *const *sp, float *sc,
                            const float *kf, const float *vf, int lo, int nv, int hd, float scale);

/* What a variant brings to attn_tiles_chunk. q8_0 keys: `q8_prepare` (may be NULL) rearranges the
 * n_sub key sub-blocks at kb into kscr (ATTN_Q8_KSCR_FLOATS) once per block; `q8_scores` writes
 * the scaled scores of pairs [0, n) (quantized queries qr) against them into sc[p * KB + j] for
 * j < KEY_LANES * n_sub, reading no sub-block past n_sub. */
typedef struct {
    attn_run_fn run;
    void (*q8_prepare)(float *kscr, const uint8_t *kb, int n_sub, int hd);
    void (*q8_scores)(int n, const uint8_t *const *qr, float *sc, const uint8_t *kb, const float *kscr, int n_sub,
                      int hd, float scale);
} attn_tiles_variant;

#define ATTN_Q8_KSCR_FLOATS(hd) (9 * (size_t)(hd)) /* a block's 32 keys' bytes and f32 scales */

/* One chunk (kernels.h attn_chunk_fn) in query tiles; scratch: kf [KB * hd], vf [KB * hd],
 * sc [ATTN_MAX_ROWS * KB], then (q8_0) the quantized queries [ATTN_MAX_ROWS] of
 * kv_q8_query_bytes (attn_scratch_floats); q8_0 keys use kf's room for the rearranged block
 * (ATTN_Q8_KSCR_FLOATS). */
static void attn_tiles_chunk(const attn_tiles_variant *var, float *acc, int lda, float *ml, const float *q, int ldq,
                             const void *k, const void *v, int kv_type, int pos0, int n_q, int group, int hd,
                             float scale, int window, int chunk, float *scratch) {
    float *kf = scratch, *vf = kf + (size_t)KB * hd, *sc = vf + (size_t)KB * hd;
    const int q8 = kv_type == KV_Q8_0;
    uint8_t *qbuf = (uint8_t *)(sc + (size_t)ATTN_MAX_ROWS * KB);
    const size_t qbytes = kv_q8_query_bytes(hd);
    if (q8) attn_q8_queries(qbuf, q, ldq, n_q, group, hd);
    const int c0 = chunk * ATTN_CHUNK;
    const int c1 = pos0 + n_q < c0 + ATTN_CHUNK ? pos0 + n_q : c0 + ATTN_CHUNK; /* keys any row needs */
    for (int i = 0; i < n_q; i++)
        for (int g = 0; g < group; g++) {
            memset(acc + (size_t)i * lda + (size_t)g * hd, 0, sizeof(float) * hd);
            ml[2 * (i * group + g)] = -INFINITY;
            ml[2 * (i * group + g) + 1] = 0.0f;
        }
    const int full = group / HEAD_BATCH * HEAD_BATCH; /* heads [0, full): U = 2; the rest: U = 4 */
    /* with a window, blocks wholly before every row's window are skipped */
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
        const int n_sub = (nv_max + KEY_LANES - 1) / KEY_LANES;
        const uint8_t *kb = (const uint8_t *)k + (size_t)t0 / KEY_LANES * KEY_LANES * kv_q8_row_bytes(hd);
        if (q8) {
            if (var->q8_prepare) var->q8_prepare(kf, kb, n_sub, hd);
        } else {
            attn_convert_keys(kf, k, kv_type, t0, n_sub, hd);
        }
        const float *vrows = attn_convert_values(vf, v, kv_type, t0, nv_max, hd);
        if (t0 + KB < c1) { /* the next block's keys and values into L2 while this one computes */
            const size_t row = q8 ? kv_q8_row_bytes(hd) : (size_t)hd * (kv_type == KV_F16 ? 2 : 4);
            const int n_next = c1 - t0 - KB < KB ? c1 - t0 - KB : KB;
            const char *kn = (const char *)k + (size_t)(t0 + KB) * row, *vn = (const char *)v + (size_t)(t0 + KB) * row;
            const size_t kbytes = (size_t)(n_next + KEY_LANES - 1) / KEY_LANES * KEY_LANES * row, vbytes = (size_t)n_next * row;
            for (size_t o = 0; o < kbytes; o += 64) _mm_prefetch(kn + o, _MM_HINT_T1);
            for (size_t o = 0; o < vbytes; o += 64) _mm_prefetch(vn + o, _MM_HINT_T1);
        }
        for (int i = 0; i < n_q;) {
            int j = i + 1;
            while (j < n_q && lo[j] == lo[i] && nv[j] == nv[i]) j++;
            if (nv[i] > 0)
                for (int cls = 0; cls < 2; cls++) {
                    const int h0 = cls ? full : 0, h1 = cls ? group : full;
                    const float *qp[ATTN_MAX_ROWS];
                    const uint8_t *qr[ATTN_MAX_ROWS];
                    float *ap[ATTN_MAX_ROWS], *sp[ATTN_MAX_ROWS];
                    int n = 0;
                    for (int r = i; r < j; r++)
                        for (int h = h0; h < h1; h++, n++) {
                            qp[n] = q + (size_t)r * ldq + (size_t)h * hd;
                            qr[n] = qbuf + (size_t)(r * group + h) * qbytes;
                            ap[n] = acc + (size_t)r * lda + (size_t)h * hd;
                            sp[n] = ml + 2 * (r * group + h);
                        }
                    if (!n) continue;
                    if (q8) var->q8_scores(n, qr, sc, kb, kf, n_sub, hd, scale);
                    var->run(cls ? 4 : 2, n, q8 ? NULL : qp, ap, sp, sc, kf, vrows, lo[i], nv[i], hd, scale);
                }
            i = j;
        }
    }
}

#endif
