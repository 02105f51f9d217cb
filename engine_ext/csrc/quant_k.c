/* Portable reference kernels of the types in quant_k.h: row decoding and matmul for Q5_0, Q5_1,
 * Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and BF16 (their row groups: quant_k_x8.c).
 *
 * Design: the matmuls read each weight block through one fetch function per type (quant_k_x8.h)
 * that returns the block in the file layout, from the file rows or gathered back out of the row
 * groups, so the reference computes a row the same way wherever the engine keeps it (and tests of
 * the grouped path check pack_x8 too). Per row and block the float operations are:
 *   Q5_0:        acc += d * ad * dot                  (dot of q - 16: exact, no correction)
 *   Q5_1:        acc += d * ad * dot + m * as
 *   Q4_K, Q5_K:  acc += d * ad * float(sc * dot) - dmin * float(m) * as      (per sub-block of 32)
 *   Q6_K, Q3_K:  acc += d * ad * float(sc0 * dot16 + sc1 * dot16')            (per block of 32)
 *   Q2_K:        acc += d * ad * float(isum) - dmin * ad * float(m0 * sum16(aq) + m1 * sum16(aq)')
 * with dot the integer dot product of the block's quants and the activation block's int8s.
 */
#include <string.h>

#include "fp16.h"
#include "blocks.h"
#include "quant_k.h"
#include "quant_k_x8.h"

static inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline void store(float *y, float v, int accumulate) {
    *y = accumulate ? *y + v : v;
}

/* Quants of a Q2_K (hmask NULL: 0..3) or Q3_K (-4..3) super-block: q[256] in element order. */
static void k2_quants(int *q, const uint8_t *qs, const uint8_t *hmask) {
    for (int n = 0; n < 2; n++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                int v = (qs[32 * n + l] >> (2 * j)) & 3;
                if (hmask) v -= ((hmask[l] >> (4 * n + j)) & 1) ? 0 : 4;
                q[128 * n + 32 * j + l] = v;
            }
}

/* 5-bit value of element j of a Q5_0/Q5_1 block (0..31). */
static inline int q5_value(const uint8_t *qs, const uint8_t *qh4, int j) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    int nib = j < 16 ? qs[j] & 15 : qs[j - 16] >> 4;
    return nib | (int)((qh >> j) & 1) << 4;
}

/* Quants of a Q4_K / Q5_K super-block: q[256] in element order (0..15 or 0..31). */
static void k4_quants(int *q, const uint8_t *qs, const uint8_t *qh) {
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = qs[32 * c + l] & 15;
            q[64 * c + 32 + l] = qs[32 * c + l] >> 4;
            if (qh) {
                q[64 * c + l] |= ((qh[l] >> (2 * c)) & 1) << 4;
                q[64 * c + 32 + l] |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
            }
        }
}

/* Quants of a Q6_K super-block minus 32: q[256] in element order (-32..31). */
static void k6_quants(int *q, const block_q6_K *b) {
    for (int n = 0; n < 2; n++) {
        const uint8_t *ql = b->ql + 64 * n, *qh = b->qh + 32 * n;
        int *o = q + 128 * n;
        for (int l = 0; l < 32; l++) {
            o[l] = ((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32;
            o[l + 32] = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
            o[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            o[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        }
    }
}

/* ---- row decoding ---------------------------------------------------------------------------- */

void dequantize_row_bf16_generic(float *y, const void *x, int k) {
    const uint16_t *h = (const uint16_t *)x;
    for (int i = 0; i < k; i++) y[i] = bf16_to_f32(h[i]);
}

void dequantize_row_q5_0_generic(float *y, const void *x, int k) {
    const block_q5_0 *blk = (const block_q5_0 *)x;
    for (int b = 0; b < k / QK; b++) {
        float d = fp16_to_f32(blk[b].d);
        for (int j = 0; j < QK; j++) y[b * QK + j] = d * (float)(q5_value(blk[b].qs, blk[b].qh, j) - 16);
    }
}

void dequantize_row_q5_1_generic(float *y, const void *x, int k) {
    const block_q5_1 *blk = (const block_q5_1 *)x;
    for (int b = 0; b < k / QK; b++) {
        float d = fp16_to_f32(blk[b].d), m = fp16_to_f32(blk[b].m);
        for (int j = 0; j < QK; j++) y[b * QK + j] = d * (float)q5_value(blk[b].qs, blk[b].qh, j) + m;
    }
}

static void dequantize_k4(float *y, uint16_t d16, uint16_t dmin16, const uint8_t *scales, const uint8_t *qs,
                          const uint8_t *qh) {
    int q[QK_K];
    k4_quants(q, qs, qh);
    const float d = fp16_to_f32(d16), dmin = fp16_to_f32(dmin16);
    for (int j = 0; j < QK_K / 32; j++) {
        int sc, m;
        k4_scale_min(scales, j, &sc, &m);
        const float ds = d * (float)sc, dm = dmin * (float)m;
        for (int l = 0; l < 32; l++) y[32 * j + l] = ds * (float)q[32 * j + l] - dm;
    }
}

void dequantize_row_q4_K_generic(float *y, const void *x, int k) {
    const block_q4_K *blk = (const block_q4_K *)x;
    for (int b = 0; b < k / QK_K; b++) dequantize_k4(y + b * QK_K, blk[b].d, blk[b].dmin, blk[b].scales, blk[b].qs, NULL);
}

void dequantize_row_q5_K_generic(float *y, const void *x, int k) {
    const block_q5_K *blk = (const block_q5_K *)x;
    for (int b = 0; b < k / QK_K; b++)
        dequantize_k4(y + b * QK_K, blk[b].d, blk[b].dmin, blk[b].scales, blk[b].qs, blk[b].qh);
}

void dequantize_row_q2_K_generic(float *y, const void *x, int k) {
    const block_q2_K *blk = (const block_q2_K *)x;
    int q[QK_K];
    for (int b = 0; b < k / QK_K; b++) {
        k2_quants(q, blk[b].qs, NULL);
        const float d = fp16_to_f32(blk[b].d), dmin = fp16_to_f32(blk[b].dmin);
        for (int i = 0; i < QK_K; i++) {
            const int sm = blk[b].scales[i / 16];
            y[b * QK_K + i] = d * (float)(sm & 15) * (float)q[i] - dmin * (float)(sm >> 4);
        }
    }
}

void dequantize_row_q3_K_generic(float *y, const void *x, int k) {
    const block_q3_K *blk = (const block_q3_K *)x;
    int q[QK_K];
    for (int b = 0; b < k / QK_K; b++) {
        k2_quants(q, blk[b].qs, blk[b].hmask);
        const float d = fp16_to_f32(blk[b].d);
        for (int i = 0; i < QK_K; i++) y[b * QK_K + i] = d * (float)(k3_scale(blk[b].scales, i / 16) - 32) * (float)q[i];
    }
}

void dequantize_row_q6_K_generic(float *y, const void *x, int k) {
    const block_q6_K *blk = (const block_q6_K *)x;
    int q[QK_K];
    for (int b = 0; b < k / QK_K; b++) {
        k6_quants(q, &blk[b]);
        const float d = fp16_to_f32(blk[b].d);
        for (int i = 0; i < QK_K; i++) y[b * QK_K + i] = d * (float)blk[b].scales[i / 16] * (float)q[i];
    }
}

/* ---- matmul ---------------------------------------------------------------------------------- */

void gemm_bf16_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x,
                       int n_rows, int accumulate) {
    const uint16_t *wh = (const uint16_t *)w->rows;
    int k = x->k;
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x->f + (size_t)r * k;
        for (int o = o0; o < o1; o++) {
            const uint16_t *wr = wh + (size_t)o * k;
            float acc = 0.0f;
            for (int i = 0; i < k; i++) acc += bf16_to_f32(wr[i]) * xr[i];
            store(&y[(size_t)r * ldy + o], acc, accumulate);
        }
    }
}

static void gemm_q5_generic(int has_min, float *y, int ldy, const gemm_weight *w, int o0, int o1,
                            const act_rows *x, int n_rows, int accumulate) {
    const int k = x->k, nb = k / QK;
    for (int r = 0; r < n_rows; r++) {
        const int8_t *aq = x->qs + (size_t)r * k;
        const float *ad = x->d + (size_t)r * nb, *as = x->s + (size_t)r * nb;
        for (int o = o0; o < o1; o++) {
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                const uint8_t *qs, *qh;
                float d, m = 0.0f;
                block_q5_0 t0;
                block_q5_1 t1;
                if (has_min) {
                    const block_q5_1 *blk = fetch_q5_1(w, o, b, &t1);
                    qs = blk->qs, qh = blk->qh, d = fp16_to_f32(blk->d), m = fp16_to_f32(blk->m);
                } else {
                    const block_q5_0 *blk = fetch_q5_0(w, o, b, &t0);
                    qs = blk->qs, qh = blk->qh, d = fp16_to_f32(blk->d);
                }
                int dot = 0;
                if (has_min) {
                    for (int j = 0; j < QK; j++) dot += q5_value(qs, qh, j) * aq[b * QK + j];
                    acc += d * ad[b] * (float)dot + m * as[b];
                } else {
                    for (int j = 0; j < QK; j++) dot += (q5_value(qs, qh, j) - 16) * aq[b * QK + j];
                    acc += d * ad[b] * (float)dot;
                }
            }
            store(&y[(size_t)r * ldy + o], acc, accumulate);
        }
    }
}

void gemm_q5_0_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x,
                       int n_rows, int accumulate) {
    gemm_q5_generic(0, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q5_1_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x,
                       int n_rows, int accumulate) {
    gemm_q5_generic(1, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

static void gemm_k4_generic(int five, float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x,
                            int n_rows, int accumulate) {
    const int k = x->k, nb = k / QK, nsb = k / QK_K;
    int q[QK_K];
    for (int r = 0; r < n_rows; r++) {
        const int8_t *aq = x->qs + (size_t)r * k;
        const float *ad = x->d + (size_t)r * nb, *as = x->s + (size_t)r * nb;
        for (int o = o0; o < o1; o++) {
            float acc = 0.0f;
            for (int s = 0; s < nsb; s++) {
                uint16_t d16, dmin16;
                const uint8_t *scales;
                block_q4_K t4;
                block_q5_K t5;
                if (five) {
                    const block_q5_K *blk = fetch_q5_K(w, o, s, &t5);
                    k4_quants(q, blk->qs, blk->qh);
                    d16 = blk->d, dmin16 = blk->dmin, scales = blk->scales;
                } else {
                    const block_q4_K *blk = fetch_q4_K(w, o, s, &t4);
                    k4_quants(q, blk->qs, NULL);
                    d16 = blk->d, dmin16 = blk->dmin, scales = blk->scales;
                }
                const float d = fp16_to_f32(d16), dmin = fp16_to_f32(dmin16);
                for (int j = 0; j < QK_K / QK; j++) {
                    const int b = s * (QK_K / QK) + j;
                    int sc, m, dot = 0;
                    k4_scale_min(scales, j, &sc, &m);
                    for (int l = 0; l < QK; l++) dot += q[QK * j + l] * aq[b * QK + l];
                    acc += d * ad[b] * (float)(sc * dot) - dmin * (float)m * as[b];
                }
            }
            store(&y[(size_t)r * ldy + o], acc, accumulate);
        }
    }
}

void gemm_q4_K_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x,
                       int n_rows, int accumulate) {
    gemm_k4_generic(0, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q5_K_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x,
                       int n_rows, int accumulate) {
    gemm_k4_generic(1, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q6_K_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x,
                       int n_rows, int accumulate) {
    const int k = x->k, nb = k / QK, nsb = k / QK_K;
    int q[QK_K];
    for (int r = 0; r < n_rows; r++) {
        const int8_t *aq = x->qs + (size_t)r * k;
        const float *ad = x->d + (size_t)r * nb;
        for (int o = o0; o < o1; o++) {
            float acc = 0.0f;
            for (int s = 0; s < nsb; s++) {
                block_q6_K t;
                const block_q6_K *blk = fetch_q6_K(w, o, s, &t);
                k6_quants(q, blk);
                const float d = fp16_to_f32(blk->d);
                for (int j = 0; j < QK_K / QK; j++) {
                    const int b = s * (QK_K / QK) + j;
                    int dot0 = 0, dot1 = 0;
                    for (int l = 0; l < 16; l++) {
                        dot0 += q[QK * j + l] * aq[b * QK + l];
                        dot1 += q[QK * j + 16 + l] * aq[b * QK + 16 + l];
                    }
                    acc += d * ad[b] * (float)(blk->scales[2 * j] * dot0 + blk->scales[2 * j + 1] * dot1);
                }
            }
            store(&y[(size_t)r * ldy + o], acc, accumulate);
        }
    }
}

/* Q2_K and Q3_K: per activation block b (sub-blocks 2j, 2j+1 of 16), in int:
 *   isum = sc0 * dot16 + sc1 * dot16'      msum = m0 * sum16(aq) + m1 * sum16(aq)'   (Q2_K)
 *   acc += d * ad * float(isum) - dmin * ad * float(msum) */
static void gemm_k2_generic(int three, float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x,
                            int n_rows, int accumulate) {
    const int k = x->k, nb = k / QK, nsb = k / QK_K;
    int q[QK_K];
    for (int r = 0; r < n_rows; r++) {
        const int8_t *aq = x->qs + (size_t)r * k;
        const float *ad = x->d + (size_t)r * nb;
        for (int o = o0; o < o1; o++) {
            float acc = 0.0f;
            for (int s = 0; s < nsb; s++) {
                block_q2_K t2;
                block_q3_K t3;
                int sc[16], mn[16];
                float d, dmin = 0.0f;
                if (three) {
                    const block_q3_K *blk = fetch_q3_K(w, o, s, &t3);
                    k2_quants(q, blk->qs, blk->hmask);
                    for (int i = 0; i < 16; i++) sc[i] = k3_scale(blk->scales, i) - 32, mn[i] = 0;
                    d = fp16_to_f32(blk->d);
                } else {
                    const block_q2_K *blk = fetch_q2_K(w, o, s, &t2);
                    k2_quants(q, blk->qs, NULL);
                    for (int i = 0; i < 16; i++) sc[i] = blk->scales[i] & 15, mn[i] = blk->scales[i] >> 4;
                    d = fp16_to_f32(blk->d), dmin = fp16_to_f32(blk->dmin);
                }
                for (int j = 0; j < QK_K / QK; j++) {
                    const int b = s * (QK_K / QK) + j;
                    int isum = 0, msum = 0;
                    for (int h = 0; h < 2; h++) {
                        int dot = 0, asum = 0;
                        for (int l = 0; l < 16; l++) {
                            dot += q[QK * j + 16 * h + l] * aq[b * QK + 16 * h + l];
                            asum += aq[b * QK + 16 * h + l];
                        }
                        isum += sc[2 * j + h] * dot;
                        msum += mn[2 * j + h] * asum;
                    }
                    acc += d * ad[b] * (float)isum - dmin * ad[b] * (float)msum;
                }
            }
            store(&y[(size_t)r * ldy + o], acc, accumulate);
        }
    }
}

void gemm_q2_K_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x,
                       int n_rows, int accumulate) {
    gemm_k2_generic(0, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q3_K_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x,
                       int n_rows, int accumulate) {
    gemm_k2_generic(1, y, ldy, w, o0, o1, x, n_rows, accumulate);
}
