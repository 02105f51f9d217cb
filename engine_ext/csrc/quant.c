/* Block formats: row sizes, decoding of weight rows, and 8-bit activation quantization. */
#include <math.h>

#include "fp16.h"
#include "blocks.h"
#include "kernels.h"

size_t ggml_row_bytes(int type, int k) {
    switch (type) {
    case GGML_TYPE_F32: return (size_t)k * 4;
    case GGML_TYPE_F16: return (size_t)k * 2;
    case GGML_TYPE_Q8_0: return (size_t)(k / QK) * sizeof(block_q8_0);
    case GGML_TYPE_Q4_0: return (size_t)(k / QK) * sizeof(block_q4_0);
    case GGML_TYPE_Q4_1: return (size_t)(k / QK) * sizeof(block_q4_1);
    case GGML_TYPE_Q5_0: return (size_t)(k / QK) * sizeof(block_q5_0);
    case GGML_TYPE_Q5_1: return (size_t)(k / QK) * sizeof(block_q5_1);
    case GGML_TYPE_Q2_K: return (size_t)(k / QK_K) * sizeof(block_q2_K);
    case GGML_TYPE_Q3_K: return (size_t)(k / QK_K) * sizeof(block_q3_K);
    case GGML_TYPE_Q4_K: return (size_t)(k / QK_K) * sizeof(block_q4_K);
    case GGML_TYPE_Q5_K: return (size_t)(k / QK_K) * sizeof(block_q5_K);
    case GGML_TYPE_Q6_K: return (size_t)(k / QK_K) * sizeof(block_q6_K);
    case GGML_TYPE_BF16: return (size_t)k * 2;
    default: return 0;
    }
}

int ggml_block_elems(int type) {
    switch (type) {
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q5_1:
    case GGML_TYPE_Q8_0: return QK;
    case GGML_TYPE_Q2_K:
    case GGML_TYPE_Q3_K:
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K:
    case GGML_TYPE_Q6_K: return QK_K;
    default: return 0;
    }
}

/* Per block of 32: d = max|x| / 127, qs = round_nearest_even(x / d), s = d * sum(qs).
 * NOTE: the SIMD variants reproduce these exact float operations (x * (1/d), then rounding to
 * nearest even), so every variant quantizes a row to identical bytes. */
void quantize_q8a_generic(int8_t *qs, float *d, float *s, const float *x, int k) {
    for (int b = 0; b < k / QK; b++) {
        const float *xb = x + b * QK;
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) {
            float a = fabsf(xb[j]);
            amax = a > amax ? a : amax;
        }
        float db = amax / 127.0f;
        float id = db != 0.0f ? 1.0f / db : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            int q = (int)nearbyintf(xb[j] * id);
            qs[b * QK + j] = (int8_t)q;
            sum += q;
        }
        d[b] = db;
        s[b] = db * (float)sum;
    }
}

void dequantize_row_f32_generic(float *y, const void *x, int k) {
    memcpy(y, x, (size_t)k * sizeof(float));
}

void dequantize_row_f16_generic(float *y, const void *x, int k) {
    const uint16_t *h = (const uint16_t *)x;
    for (int i = 0; i < k; i++) y[i] = fp16_to_f32(h[i]);
}

void dequantize_row_q8_0_generic(float *y, const void *x, int k) {
    const block_q8_0 *blk = (const block_q8_0 *)x;
    for (int b = 0; b < k / QK; b++) {
        float d = fp16_to_f32(blk[b].d);
        for (int j = 0; j < QK; j++) y[b * QK + j] = d * (float)blk[b].qs[j];
    }
}

void dequantize_row_q4_0_generic(float *y, const void *x, int k) {
    const block_q4_0 *blk = (const block_q4_0 *)x;
    for (int b = 0; b < k / QK; b++) {
        float d = fp16_to_f32(blk[b].d);
        for (int j = 0; j < QK / 2; j++) {
            y[b * QK + j] = d * (float)((blk[b].qs[j] & 15) - 8);
            y[b * QK + j + QK / 2] = d * (float)((blk[b].qs[j] >> 4) - 8);
        }
    }
}

void dequantize_row_q4_1_generic(float *y, const void *x, int k) {
    const block_q4_1 *blk = (const block_q4_1 *)x;
    for (int b = 0; b < k / QK; b++) {
        float d = fp16_to_f32(blk[b].d), m = fp16_to_f32(blk[b].m);
        for (int j = 0; j < QK / 2; j++) {
            y[b * QK + j] = d * (float)(blk[b].qs[j] & 15) + m;
            y[b * QK + j + QK / 2] = d * (float)(blk[b].qs[j] >> 4) + m;
        }
    }
}

void f32_to_f16_generic(uint16_t *y, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] = fp32_to_f16(x[i]);
}

void f16_to_f32_generic(float *y, const uint16_t *x, int n) {
    for (int i = 0; i < n; i++) y[i] = fp16_to_f32(x[i]);
}

/* ---- row groups (kernels.h: x8 layout) ---------------------------------------------------- */

size_t x8_bytes(int type, int n_in, int n_out) {
    size_t groups = (size_t)(n_out / ROW_GROUP) * (size_t)(n_in / QK);
    switch (type) {
    case GGML_TYPE_Q8_0: return groups * sizeof(block_q8_0x8);
    case GGML_TYPE_Q4_0: return groups * sizeof(block_q4_0x8);
    case GGML_TYPE_Q4_1: return groups * sizeof(block_q4_1x8);
    default: return x8_bytes_k(type, n_in, n_out);
    }
}

void pack_x8(void *dst, const void *rows, int type, int n_in, int n_out) {
    if (x8_bytes_k(type, n_in, ROW_GROUP) > 0) {
        pack_x8_k(dst, rows, type, n_in, n_out);
        return;
    }
    const int nb = n_in / QK;
    const size_t row_bytes = ggml_row_bytes(type, n_in);
    for (int g = 0; g < n_out / ROW_GROUP; g++)
        for (int b = 0; b < nb; b++)
            for (int i = 0; i < ROW_GROUP; i++) {
                const char *src = (const char *)rows + (size_t)(g * ROW_GROUP + i) * row_bytes;
                size_t at = (size_t)g * nb + b;
                if (type == GGML_TYPE_Q8_0) {
                    const block_q8_0 *s = (const block_q8_0 *)src + b;
                    block_q8_0x8 *d = (block_q8_0x8 *)dst + at;
                    d->d[i] = s->d;
                    for (int j = 0; j < QK / 4; j++) memcpy(d->qs + 32 * j + 4 * i, s->qs + 4 * j, 4);
                } else if (type == GGML_TYPE_Q4_0) {
                    const block_q4_0 *s = (const block_q4_0 *)src + b;
                    block_q4_0x8 *d = (block_q4_0x8 *)dst + at;
                    d->d[i] = s->d;
                    for (int j = 0; j < QK / 8; j++) memcpy(d->qs + 32 * j + 4 * i, s->qs + 4 * j, 4);
                } else if (type == GGML_TYPE_Q4_1) {
                    const block_q4_1 *s = (const block_q4_1 *)src + b;
                    block_q4_1x8 *d = (block_q4_1x8 *)dst + at;
                    d->d[i] = s->d;
                    d->m[i] = s->m;
                    for (int j = 0; j < QK / 8; j++) memcpy(d->qs + 32 * j + 4 * i, s->qs + 4 * j, 4);
                }
            }
}
