/* Matrix multiplication, portable reference: Y[r, o] (+)= dot(W row o, X row r).
 *
 * Float weights (F32, F16) multiply the float activation rows; block weights (Q8_0, Q4_0, Q4_1)
 * multiply the 8-bit quantized activation rows with an integer dot product per block of 32:
 *   Q8_0: sum_b wd*ad * sum_j wq*aq
 *   Q4_0: sum_b wd*ad * sum_j (nib-8)*aq = sum_b wd * (ad * sum_j nib*aq - 8 * as)
 *   Q4_1: sum_b wd*ad * sum_j nib*aq + wm * as          (as = ad * sum_j aq)
 */
#include "fp16.h"
#include "kernels.h"

static inline void store(float *y, float v, int accumulate) {
    *y = accumulate ? *y + v : v;
}

void gemm_f32_generic(float *y, int ldy, const void *w, int o0, int o1, const act_rows *x,
                      int n_rows, int accumulate) {
    const float *wf = (const float *)w;
    int k = x->k;
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x->f + (size_t)r * k;
        for (int o = o0; o < o1; o++) {
            const float *wr = wf + (size_t)o * k;
            float acc = 0.0f;
            for (int i = 0; i < k; i++) acc += wr[i] * xr[i];
            store(&y[(size_t)r * ldy + o], acc, accumulate);
        }
    }
}

void gemm_f16_generic(float *y, int ldy, const void *w, int o0, int o1, const act_rows *x,
                      int n_rows, int accumulate) {
    const uint16_t *wh = (const uint16_t *)w;
    int k = x->k;
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x->f + (size_t)r * k;
        for (int o = o0; o < o1; o++) {
            const uint16_t *wr = wh + (size_t)o * k;
            float acc = 0.0f;
            for (int i = 0; i < k; i++) acc += fp16_to_f32(wr[i]) * xr[i];
            store(&y[(size_t)r * ldy + o], acc, accumulate);
        }
    }
}

void gemm_q8_0_generic(float *y, int ldy, const void *w, int o0, int o1, const act_rows *x,
                       int n_rows, int accumulate) {
    int k = x->k, nb = k / QK;
    for (int r = 0; r < n_rows; r++) {
        const int8_t *aq = x->qs + (size_t)r * k;
        const float *ad = x->d + (size_t)r * nb;
        for (int o = o0; o < o1; o++) {
            const block_q8_0 *wb = (const block_q8_0 *)w + (size_t)o * nb;
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                int dot = 0;
                for (int j = 0; j < QK; j++) dot += wb[b].qs[j] * aq[b * QK + j];
                acc += fp16_to_f32(wb[b].d) * ad[b] * (float)dot;
            }
            store(&y[(size_t)r * ldy + o], acc, accumulate);
        }
    }
}

void gemm_q4_0_generic(float *y, int ldy, const void *w, int o0, int o1, const act_rows *x,
                       int n_rows, int accumulate) {
    int k = x->k, nb = k / QK;
    for (int r = 0; r < n_rows; r++) {
        const int8_t *aq = x->qs + (size_t)r * k;
        const float *ad = x->d + (size_t)r * nb;
        const float *as = x->s + (size_t)r * nb;
        for (int o = o0; o < o1; o++) {
            const block_q4_0 *wb = (const block_q4_0 *)w + (size_t)o * nb;
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                int dot = 0;
                for (int j = 0; j < QK / 2; j++) {
                    dot += (wb[b].qs[j] & 15) * aq[b * QK + j];
                    dot += (wb[b].qs[j] >> 4) * aq[b * QK + j + QK / 2];
                }
                acc += fp16_to_f32(wb[b].d) * (ad[b] * (float)dot - 8.0f * as[b]);
            }
            store(&y[(size_t)r * ldy + o], acc, accumulate);
        }
    }
}

void gemm_q4_1_generic(float *y, int ldy, const void *w, int o0, int o1, const act_rows *x,
                       int n_rows, int accumulate) {
    int k = x->k, nb = k / QK;
    for (int r = 0; r < n_rows; r++) {
        const int8_t *aq = x->qs + (size_t)r * k;
        const float *ad = x->d + (size_t)r * nb;
        const float *as = x->s + (size_t)r * nb;
        for (int o = o0; o < o1; o++) {
            const block_q4_1 *wb = (const block_q4_1 *)w + (size_t)o * nb;
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                int dot = 0;
                for (int j = 0; j < QK / 2; j++) {
                    dot += (wb[b].qs[j] & 15) * aq[b * QK + j];
                    dot += (wb[b].qs[j] >> 4) * aq[b * QK + j + QK / 2];
                }
                acc += fp16_to_f32(wb[b].d) * ad[b] * (float)dot + fp16_to_f32(wb[b].m) * as[b];
            }
            store(&y[(size_t)r * ldy + o], acc, accumulate);
        }
    }
}
