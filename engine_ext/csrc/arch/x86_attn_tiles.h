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
 * 8-lane vector then hsum256; values as acc * corr plus p_j v_j for j in order. A q8_0 element
 * converts as float(q) * d in both. Pairs are tiled only with pairs of the same valid key range
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

/* Keys t0 .. t0 + 8 * n_sub - 1 of a k plane as f32 kf[d][KB]; later sub-blocks zero. */
static void attn_convert_keys(float *kf, const void *k, int kv_type, int t0, int n_sub, int hd) {
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
 * converted block; (m, l) states in sp, accumulators in ap; sc: [n][KB] probabilities. */
typedef void (*attn_run_fn)(int U, int n, const float *const *qp, float *const *ap, float *const *sp, float *sc,
                            const float *kf, const float *vf, int lo, int nv, int hd, float scale);

/* One chunk (kernels.h attn_chunk_fn) in query tiles; scratch: kf [KB * hd], vf [KB * hd],
 * sc [ATTN_MAX_ROWS * KB] (attn_scratch_floats). */
static void attn_tiles_chunk(attn_run_fn run, float *acc, int lda, float *ml, const float *q, int ldq,
                             const void *k, const void *v, int kv_type, int pos0, int n_q, int group, int hd,
                             float scale, int window, int chunk, float *scratch) {
    float *kf = scratch, *vf = kf + (size_t)KB * hd, *sc = vf + (size_t)KB * hd;
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
        attn_convert_keys(kf, k, kv_type, t0, (nv_max + KEY_LANES - 1) / KEY_LANES, hd);
        const float *vrows = attn_convert_values(vf, v, kv_type, t0, nv_max, hd);
        for (int i = 0; i < n_q;) {
            int j = i + 1;
            while (j < n_q && lo[j] == lo[i] && nv[j] == nv[i]) j++;
            if (nv[i] > 0)
                for (int cls = 0; cls < 2; cls++) {
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
                    if (n) run(cls ? 4 : 2, n, qp, ap, sp, sc, kf, vrows, lo[i], nv[i], hd, scale);
                }
            i = j;
        }
    }
}

#endif
