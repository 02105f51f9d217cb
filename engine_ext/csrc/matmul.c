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

/* Block b of row o in the file layout, read from wherever the weight keeps it (row groups or
 * rows): the reference computes every row the same way whatever its storage. */
typedef union { block_q8_0 q8_0; block_q4_0 q4_0; block_q4_1 q4_1; } any_block;

static void fetch_block(const gemm_weight *w, int o, int b, any_block *out) {
    const int nb = w->n_in / QK;
    const int g = o / ROW_GROUP, i = o % ROW_GROUP;
    const int grouped = w->x8 != NULL && o < w->n_out / ROW_GROUP * ROW_GROUP;
    const char *row = (const char *)w->rows + (size_t)o * ggml_row_bytes(w->type, w->n_in);
    if (w->type == GGML_TYPE_Q8_0) {
        block_q8_0 *dst = &out->q8_0;
        if (!grouped) { *dst = ((const block_q8_0 *)row)[b]; return; }
        const block_q8_0x8 *src = (const block_q8_0x8 *)w->x8 + (size_t)g * nb + b;
        dst->d = src->d[i];
        for (int j = 0; j < QK / 4; j++) memcpy(dst->qs + 4 * j, src->qs + 32 * j + 4 * i, 4);
    } else if (w->type == GGML_TYPE_Q4_0) {
        block_q4_0 *dst = &out->q4_0;
        if (!grouped) { *dst = ((const block_q4_0 *)row)[b]; return; }
        const block_q4_0x8 *src = (const block_q4_0x8 *)w->x8 + (size_t)g * nb + b;
        dst->d = src->d[i];
        for (int j = 0; j < QK / 8; j++) memcpy(dst->qs + 4 * j, src->qs + 32 * j + 4 * i, 4);
    } else {
        block_q4_1 *dst = &out->q4_1;
        if (!grouped) { *dst = ((const block_q4_1 *)row)[b]; return; }
        const block_q4_1x8 *src = (const block_q4_1x8 *)w->x8 + (size_t)g * nb + b;
        dst->d = src->d[i];
        dst->m = src->m[i];
        for (int j = 0; j < QK / 8; j++) memcpy(dst->qs + 4 * j, src->qs + 32 * j + 4 * i, 4);
    }
}

void gemm_f32_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x,
                      int n_rows, int accumulate) {
    const float *wf = (const float *)w->rows;
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

void gemm_f16_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x,
                      int n_rows, int accumulate) {
    const uint16_t *wh = (const uint16_t *)w->rows;
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

void gemm_q8_0_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x,
                       int n_rows, int accumulate) {
    int k = x->k, nb = k / QK;
    any_block any;
    const block_q8_0 *bp = &any.q8_0;
    for (int r = 0; r < n_rows; r++) {
        const int8_t *aq = x->qs + (size_t)r * k;
        const float *ad = x->d + (size_t)r * nb;
        for (int o = o0; o < o1; o++) {
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                fetch_block(w, o, b, &any);
                int dot = 0;
                for (int j = 0; j < QK; j++) dot += bp->qs[j] * aq[b * QK + j];
                acc += fp16_to_f32(bp->d) * ad[b] * (float)dot;
            }
            store(&y[(size_t)r * ldy + o], acc, accumulate);
        }
    }
}

void gemm_q4_0_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x,
                       int n_rows, int accumulate) {
    int k = x->k, nb = k / QK;
    any_block any;
    const block_q4_0 *bp = &any.q4_0;
    for (int r = 0; r < n_rows; r++) {
        const int8_t *aq = x->qs + (size_t)r * k;
        const float *ad = x->d + (size_t)r * nb;
        const float *as = x->s + (size_t)r * nb;
        for (int o = o0; o < o1; o++) {
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                fetch_block(w, o, b, &any);
                int dot = 0;
                for (int j = 0; j < QK / 2; j++) {
                    dot += (bp->qs[j] & 15) * aq[b * QK + j];
                    dot += (bp->qs[j] >> 4) * aq[b * QK + j + QK / 2];
                }
                acc += fp16_to_f32(bp->d) * (ad[b] * (float)dot - 8.0f * as[b]);
            }
            store(&y[(size_t)r * ldy + o], acc, accumulate);
        }
    }
}

void gemm_q4_1_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x,
                       int n_rows, int accumulate) {
    int k = x->k, nb = k / QK;
    any_block any;
    const block_q4_1 *bp = &any.q4_1;
    for (int r = 0; r < n_rows; r++) {
        const int8_t *aq = x->qs + (size_t)r * k;
        const float *ad = x->d + (size_t)r * nb;
        const float *as = x->s + (size_t)r * nb;
        for (int o = o0; o < o1; o++) {
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                fetch_block(w, o, b, &any);
                int dot = 0;
                for (int j = 0; j < QK / 2; j++) {
                    dot += (bp->qs[j] & 15) * aq[b * QK + j];
                    dot += (bp->qs[j] >> 4) * aq[b * QK + j + QK / 2];
                }
                acc += fp16_to_f32(bp->d) * ad[b] * (float)dot + fp16_to_f32(bp->m) * as[b];
            }
            store(&y[(size_t)r * ldy + o], acc, accumulate);
        }
    }
}
