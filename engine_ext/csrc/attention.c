/* Causal attention of a slot's query rows against its cached keys/values, portable reference.
 *
 * For query position p and head h: s_t = scale * q.k_t for t <= p, softmax over t, out = sum_t
 * p_t v_t. Keys/values are the rows of one kv head (GQA: `group` query heads share it).
 */
#include <math.h>

#include "fp16.h"
#include "kernels.h"

#define ATTN_KEY_BLOCK 32 /* keys per block in the SIMD variants (scratch sizing) */

size_t attn_scratch_floats(int ctx_len, int head_dim) {
    /* generic: a converted row [head_dim] + scores [ctx_len];
     * SIMD: key and value blocks [2][ATTN_KEY_BLOCK][head_dim] + scores [ATTN_KEY_BLOCK] +
     * softmax state [ATTN_MAX_ROWS][2]. */
    size_t generic = (size_t)head_dim + (size_t)ctx_len;
    size_t simd = 2 * (size_t)ATTN_KEY_BLOCK * head_dim + ATTN_KEY_BLOCK + 2 * ATTN_MAX_ROWS;
    return (generic > simd ? generic : simd) + 16;
}

static inline void load_row(float *dst, const void *src, int kv_f16, size_t row, int head_dim) {
    if (kv_f16) {
        const uint16_t *h = (const uint16_t *)src + row * head_dim;
        for (int i = 0; i < head_dim; i++) dst[i] = fp16_to_f32(h[i]);
    } else {
        const float *f = (const float *)src + row * head_dim;
        for (int i = 0; i < head_dim; i++) dst[i] = f[i];
    }
}

void attention_generic(float *out, int ldo, const float *q, int ldq, const void *k, const void *v,
                       int kv_f16, int pos0, int n_q, int group, int head_dim, float scale,
                       float *scratch) {
    float *row = scratch;                 /* [head_dim] */
    float *scores = scratch + head_dim;   /* [pos0 + n_q] */
    for (int i = 0; i < n_q; i++) {
        int n_keys = pos0 + i + 1;
        for (int g = 0; g < group; g++) {
            const float *qh = q + (size_t)i * ldq + (size_t)g * head_dim;
            float *oh = out + (size_t)i * ldo + (size_t)g * head_dim;
            float mx = -INFINITY;
            for (int t = 0; t < n_keys; t++) {
                load_row(row, k, kv_f16, (size_t)t, head_dim);
                float dot = 0.0f;
                for (int j = 0; j < head_dim; j++) dot += qh[j] * row[j];
                scores[t] = dot * scale;
                mx = scores[t] > mx ? scores[t] : mx;
            }
            float sum = 0.0f;
            for (int t = 0; t < n_keys; t++) {
                scores[t] = expf(scores[t] - mx);
                sum += scores[t];
            }
            for (int j = 0; j < head_dim; j++) oh[j] = 0.0f;
            for (int t = 0; t < n_keys; t++) {
                load_row(row, v, kv_f16, (size_t)t, head_dim);
                for (int j = 0; j < head_dim; j++) oh[j] += scores[t] * row[j];
            }
            float inv = 1.0f / sum;
            for (int j = 0; j < head_dim; j++) oh[j] *= inv;
        }
    }
}
