/* Causal attention in chunks (contract in kernels.h): the portable chunk and fold kernels, and
 * the composition every variant shares.
 *
 * For query position p and head h: s_t = scale * q.k_t for lo <= t <= p (lo = 0, or p-w+1 with
 * a sliding window w); over each chunk of
 * ATTN_CHUNK keys a partial state (m, l, acc); the states folded in chunk order; out = acc / l.
 * On q8_0 keys q.k_t is the integer-dot score of kv_q8.h (the query quantized per block of 32).
 */
#include <math.h>
#include <string.h>

#include "fp16.h"
#include "kernels.h"
#include "kv_q8.h"

#define ATTN_KEY_BLOCK 32 /* keys per block in the SIMD variants (scratch sizing) */

size_t attn_scratch_floats(int ctx_len, int head_dim) {
    (void)ctx_len;
    /* running and partial states [2][ATTN_MAX_ROWS][head_dim + 2], then the chunk kernel's own:
     * generic: a converted row [head_dim] + scores [ATTN_CHUNK] + a quantized query head row;
     * SIMD: a block of keys and of values in f32, the scores of up to ATTN_MAX_ROWS (row, head)
     * pairs against it, and (q8_0) their quantized queries (arch/x86_attn_tiles.h; the AVX2 row
     * kernel uses less). */
    size_t states = 2 * (size_t)ATTN_MAX_ROWS * (head_dim + 2);
    size_t generic = (size_t)head_dim + ATTN_CHUNK + (kv_q8_query_bytes(head_dim) + 3) / 4;
    size_t simd = 2 * (size_t)ATTN_KEY_BLOCK * head_dim + (size_t)ATTN_MAX_ROWS * ATTN_KEY_BLOCK +
                  (ATTN_MAX_ROWS * kv_q8_query_bytes(head_dim) + 3) / 4;
    return states + (generic > simd ? generic : simd) + 16;
}

static inline void load_row(float *dst, const void *src, int kv_f16, size_t row, int head_dim) {
    if (kv_f16 == KV_Q8_0) {
        kv_q8_load_row(dst, src, row, head_dim);
    } else if (kv_f16) {
        const uint16_t *h = (const uint16_t *)src + row * head_dim;
        for (int i = 0; i < head_dim; i++) dst[i] = fp16_to_f32(h[i]);
    } else {
        memcpy(dst, (const float *)src + row * head_dim, sizeof(float) * head_dim);
    }
}

static inline void load_key(float *dst, const void *k, int kv_f16, int t, int head_dim) {
    for (int d = 0; d < head_dim; d++) {
        size_t at = key_index(t, d, head_dim);
        dst[d] = kv_f16 ? fp16_to_f32(((const uint16_t *)k)[at]) : ((const float *)k)[at];
    }
}

void attention_chunk_generic(float *acc, int lda, float *ml, const float *q, int ldq, const void *k,
                             const void *v, int kv_f16, int pos0, int n_q, int group, int head_dim,
                             float scale, int window, int chunk, float *scratch) {
    float *row = scratch;                 /* [head_dim] */
    float *scores = scratch + head_dim;   /* [ATTN_CHUNK] */
    uint8_t *qrow = (uint8_t *)(scores + ATTN_CHUNK); /* q8_0: the quantized query head row */
    for (int i = 0; i < n_q; i++) {
        const int lo = window > 0 ? pos0 + i - window + 1 : 0;
        int t0 = chunk * ATTN_CHUNK > lo ? chunk * ATTN_CHUNK : lo;
        int t1 = pos0 + i + 1 < chunk * ATTN_CHUNK + ATTN_CHUNK ? pos0 + i + 1 : chunk * ATTN_CHUNK + ATTN_CHUNK;
        for (int g = 0; g < group; g++) {
            const float *qh = q + (size_t)i * ldq + (size_t)g * head_dim;
            float *ah = acc + (size_t)i * lda + (size_t)g * head_dim;
            float *st = ml + 2 * (i * group + g);
            for (int j = 0; j < head_dim; j++) ah[j] = 0.0f;
            st[0] = -INFINITY;
            st[1] = 0.0f;
            if (t1 <= t0) continue;
            float mx = -INFINITY;
            if (kv_f16 == KV_Q8_0) kv_q8_quantize_query(qrow, qh, head_dim);
            for (int t = t0; t < t1; t++) {
                float dot = 0.0f;
                if (kv_f16 == KV_Q8_0) {
                    dot = kv_q8_key_score(k, t, qrow, head_dim);
                } else {
                    load_key(row, k, kv_f16, t, head_dim);
                    for (int j = 0; j < head_dim; j++) dot += qh[j] * row[j];
                }
                scores[t - t0] = dot * scale;
                mx = scores[t - t0] > mx ? scores[t - t0] : mx;
            }
            float sum = 0.0f;
            for (int t = t0; t < t1; t++) {
                float p = expf(scores[t - t0] - mx);
                sum += p;
                load_row(row, v, kv_f16, (size_t)t, head_dim);
                for (int j = 0; j < head_dim; j++) ah[j] += p * row[j];
            }
            st[0] = mx;
            st[1] = sum;
        }
    }
}

void attention_fold_generic(float *acc, int lda, float *ml, const float *pacc, int ldp, const float *pml,
                            int n_q, int group, int head_dim) {
    for (int i = 0; i < n_q; i++)
        for (int g = 0; g < group; g++) {
            float *st = ml + 2 * (i * group + g);
            const float *pst = pml + 2 * (i * group + g);
            if (pst[0] == -INFINITY) continue; /* empty partial */
            float *ah = acc + (size_t)i * lda + (size_t)g * head_dim;
            const float *ph = pacc + (size_t)i * ldp + (size_t)g * head_dim;
            float m = st[0] > pst[0] ? st[0] : pst[0];
            float a = st[0] == -INFINITY ? 0.0f : expf(st[0] - m), b = expf(pst[0] - m);
            for (int j = 0; j < head_dim; j++) ah[j] = ah[j] * a + ph[j] * b;
            st[0] = m;
            st[1] = st[1] * a + pst[1] * b;
        }
}

void attention_finish(float *out, int ldo, const float *acc, int lda, const float *ml, int n_q, int group,
                      int head_dim) {
    for (int i = 0; i < n_q; i++)
        for (int g = 0; g < group; g++) {
            const float inv = 1.0f / ml[2 * (i * group + g) + 1];
            const float *ah = acc + (size_t)i * lda + (size_t)g * head_dim;
            float *oh = out + (size_t)i * ldo + (size_t)g * head_dim;
            for (int j = 0; j < head_dim; j++) oh[j] = ah[j] * inv;
        }
}

void attention_rows(const kernel_table *kt, float *out, int ldo, const float *q, int ldq, const void *k,
                    const void *v, int kv_f16, int pos0, int n_q, int group, int head_dim, float scale,
                    int window, float *scratch) {
    attention_rows_ring(kt, out, ldo, q, ldq, k, v, kv_f16, pos0, n_q, group, head_dim, scale, window, 0, scratch);
}

void attention_rows_ring(const kernel_table *kt, float *out, int ldo, const float *q, int ldq, const void *k,
                         const void *v, int kv_f16, int pos0, int n_q, int group, int head_dim, float scale,
                         int window, int ring, float *scratch) {
    const int lda = group * head_dim;
    float *acc = scratch;                                   /* [n_q][lda] running state */
    float *ml = acc + (size_t)ATTN_MAX_ROWS * head_dim;     /* [n_q * group][2] */
    float *pacc = ml + 2 * ATTN_MAX_ROWS;                   /* [n_q][lda] chunk partial */
    float *pml = pacc + (size_t)ATTN_MAX_ROWS * head_dim;   /* [n_q * group][2] */
    float *rest = pml + 2 * ATTN_MAX_ROWS;                  /* the chunk kernel's scratch */
    /* NOTE: chunks before the first that any row needs are skipped; a row whose first chunk
     * comes later starts empty, and folding into an empty state copies exactly (a = 0, b = 1),
     * so the row's result does not depend on its batch mates. */
    const int c0 = attn_first_chunk(pos0, window), n_chunks = (pos0 + n_q + ATTN_CHUNK - 1) / ATTN_CHUNK;
    for (int c = c0; c < n_chunks; c++) {
        /* in a ring, chunk c's keys sit `shift` positions lower: the same keys, in the same order */
        const int shift = ring > 0 ? c * ATTN_CHUNK / ring * ring : 0, cs = c - shift / ATTN_CHUNK;
        float *a = c == c0 ? acc : pacc, *m = c == c0 ? ml : pml;
        kt->attention_chunk(a, lda, m, q, ldq, k, v, kv_f16, pos0 - shift, n_q, group, head_dim, scale, window, cs, rest);
        if (c > c0) kt->attention_fold(acc, lda, ml, pacc, lda, pml, n_q, group, head_dim);
    }
    attention_finish(out, ldo, acc, lda, ml, n_q, group, head_dim);
}
