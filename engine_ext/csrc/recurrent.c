/* Gated DeltaNet (qwen35) kernels, portable reference: the causal conv step, the L2
 * normalisation of queries and keys, and the delta-rule update of one head's state
 * (contracts in kernels.h; engine_recurrent.c walks them token by token in position order).
 */
#include <math.h>
#include <string.h>

#include "kernels.h"

void ssm_conv_generic(float *out, float *tail, const float *src, const float *x, const float *w, int taps, int n,
                      int ld) {
    for (int c = 0; c < n; c++) {
        float sum = 0.0f;
        for (int j = 0; j < taps - 1; j++) sum += w[(size_t)j * ld + c] * src[(size_t)j * ld + c];
        sum += w[(size_t)(taps - 1) * ld + c] * x[c];
        out[c] = sum;
    }
    ssm_tail_shift(tail, src, x, taps, n, ld);
}

void l2norm_generic(float *x, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(ss + eps);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void gdn_gates_generic(float *alpha, float *beta, const float *dt, const float *a, int n) {
    for (int h = 0; h < n; h++) {
        const float x = alpha[h] + dt[h];
        alpha[h] = expf((x > 20.0f ? x : logf(1.0f + expf(x))) * a[h]);
        beta[h] = 1.0f / (1.0f + expf(-beta[h]));
    }
}

void gdn_step_generic(float *S, const float *src, float *o, const float *q, const float *k, const float *v,
                      float decay, float beta, float scale, int d) {
    for (int j = 0; j < d; j++) {
        float *row = S + (size_t)j * d;
        const float *in = src + (size_t)j * d;
        float sk = 0.0f;
        for (int i = 0; i < d; i++) {
            row[i] = in[i] * decay;
            sk += row[i] * k[i];
        }
        const float delta = (v[j] - sk) * beta;
        float sq = 0.0f;
        for (int i = 0; i < d; i++) {
            row[i] += delta * k[i];
            sq += row[i] * q[i];
        }
        o[j] = sq * scale;
    }
}

void gdn_steps_generic(float *S, float *o, int ldo, const float *q, const float *k, const float *v, int ldv,
                       const float *decay, const float *beta, int ldg, float scale, int d, int n) {
    for (int t = 0; t < n; t++)
        gdn_step_generic(S, S, o + (size_t)t * ldo, q + (size_t)t * d, k + (size_t)t * d, v + (size_t)t * ldv,
                         decay[(size_t)t * ldg], beta[(size_t)t * ldg], scale, d);
}
