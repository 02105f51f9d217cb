/* Portable reference kernels of the types in quant_k.h: row decoding and matmul for Q5_0, Q5_1,
 * Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and BF16, and their row groups (x8 layout, kernels.h).
 *
 * Design: the matmuls read each weight block through one fetch function per type that returns
 * the block in the file layout, from the file rows or gathered back out of the row groups, so
 * the reference computes a row the same way wherever the engine keeps it (and tests of the
 * grouped path check pack_x8 too). Per row and block the float operations are:
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

static inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline void store(float *y, float v, int accumulate) {
    *y = accumulate ? *y + v : v;
}

/* (sc, m) of sub-block j from the 12 packed bytes of Q4_K / Q5_K:
 *   j < 4:  sc = s[j] & 63,                          m = s[j+4] & 63
 *   j >= 4: sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4,   m = (s[j+4] >> 4) | (s[j] >> 6) << 4 */
static inline void k4_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* The inverse of k4_scale_min over all 8 sub-blocks (the 96 bits are a bijection). */
static void k4_pack_scales(uint8_t *s, const uint8_t *sc, const uint8_t *m) {
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
}

/* Scale i (of 16) of Q3_K, 6 bits, from the 12 packed bytes: low 4 bits in scales[i % 8]
 * (i < 8: low nibble, else high), high 2 bits at 2 * (i / 4) of scales[8 + i % 4]. 0..63. */
static inline int k3_scale(const uint8_t *s, int i) {
    int lo = i < 8 ? s[i] & 15 : s[i - 8] >> 4;
    return lo | ((s[8 + i % 4] >> (2 * (i / 4))) & 3) << 4;
}

static void k3_pack_scales(uint8_t *s, const uint8_t *u) {
    for (int i = 0; i < 8; i++) s[i] = (uint8_t)((u[i] & 15) | ((u[i + 8] & 15) << 4));
    for (int c = 0; c < 4; c++) {
        s[8 + c] = 0;
        for (int g = 0; g < 4; g++) s[8 + c] |= (uint8_t)(((u[4 * g + c] >> 4) & 3) << (2 * g));
    }
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

/* ---- row groups (quant_k.h x8 layouts) -------------------------------------------------------- */

/* Row i's n-byte array `src` into the interleaved array `dst` of its group, and back. */
static void put_runs(uint8_t *dst, const uint8_t *src, int n, int i) {
    for (int j = 0; j < n / 4; j++) memcpy(dst + 4 * (ROW_GROUP * j + i), src + 4 * j, 4);
}

static void get_runs(uint8_t *dst, const uint8_t *src, int n, int i) {
    for (int j = 0; j < n / 4; j++) memcpy(dst + 4 * j, src + 4 * (ROW_GROUP * j + i), 4);
}

/* Q5 high bits: file order (bit e = element e) <-> x8 order (bit k of byte c = element 4k + c). */
static void q5_qh_to_x8(uint8_t *dst, const uint8_t *qh4) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    for (int c = 0; c < 4; c++) {
        dst[c] = 0;
        for (int k = 0; k < 8; k++) dst[c] |= (uint8_t)(((qh >> (4 * k + c)) & 1) << k);
    }
}

static void q5_qh_from_x8(uint8_t *qh4, const uint8_t *src) {
    uint32_t qh = 0;
    for (int c = 0; c < 4; c++)
        for (int k = 0; k < 8; k++) qh |= (uint32_t)((src[c] >> k) & 1) << (4 * k + c);
    memcpy(qh4, &qh, 4);
}

size_t x8_bytes_k(int type, int n_in, int n_out) {
    size_t groups = (size_t)(n_out / ROW_GROUP);
    switch (type) {
    case GGML_TYPE_Q5_0: return groups * (size_t)(n_in / QK) * sizeof(block_q5_0x8);
    case GGML_TYPE_Q5_1: return groups * (size_t)(n_in / QK) * sizeof(block_q5_1x8);
    case GGML_TYPE_Q2_K: return groups * (size_t)(n_in / QK_K) * sizeof(block_q2_Kx8);
    case GGML_TYPE_Q3_K: return groups * (size_t)(n_in / QK_K) * sizeof(block_q3_Kx8);
    case GGML_TYPE_Q4_K: return groups * (size_t)(n_in / QK_K) * sizeof(block_q4_Kx8);
    case GGML_TYPE_Q5_K: return groups * (size_t)(n_in / QK_K) * sizeof(block_q5_Kx8);
    case GGML_TYPE_Q6_K: return groups * (size_t)(n_in / QK_K) * sizeof(block_q6_Kx8);
    default: return 0;
    }
}

/* Block of row i (of 8) in one x8 block, both directions (to_x8 != 0: file -> x8). */
static void convert_q5_0(block_q5_0x8 *g, block_q5_0 *b, int i, int to_x8) {
    if (to_x8) {
        g->d[i] = b->d;
        q5_qh_to_x8(g->qh + 4 * i, b->qh);
        put_runs(g->qs, b->qs, 16, i);
    } else {
        b->d = g->d[i];
        q5_qh_from_x8(b->qh, g->qh + 4 * i);
        get_runs(b->qs, g->qs, 16, i);
    }
}

static void convert_q5_1(block_q5_1x8 *g, block_q5_1 *b, int i, int to_x8) {
    if (to_x8) {
        g->d[i] = b->d, g->m[i] = b->m;
        q5_qh_to_x8(g->qh + 4 * i, b->qh);
        put_runs(g->qs, b->qs, 16, i);
    } else {
        b->d = g->d[i], b->m = g->m[i];
        q5_qh_from_x8(b->qh, g->qh + 4 * i);
        get_runs(b->qs, g->qs, 16, i);
    }
}

/* Q4_K and Q5_K share everything but qh (NULL for Q4_K). */
static void convert_k4(uint16_t *gd, uint16_t *gdmin, uint8_t (*gsc)[ROW_GROUP], uint8_t (*gm)[ROW_GROUP],
                       uint8_t *gqh, uint8_t *gqs, uint16_t *d, uint16_t *dmin, uint8_t *scales, uint8_t *qh,
                       uint8_t *qs, int i, int to_x8) {
    if (to_x8) {
        gd[i] = *d, gdmin[i] = *dmin;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            k4_scale_min(scales, j, &sc, &m);
            gsc[j][i] = (uint8_t)sc, gm[j][i] = (uint8_t)m;
        }
        if (qh) put_runs(gqh, qh, QK_K / 8, i);
        put_runs(gqs, qs, QK_K / 2, i);
    } else {
        *d = gd[i], *dmin = gdmin[i];
        uint8_t sc[8], m[8];
        for (int j = 0; j < 8; j++) sc[j] = gsc[j][i], m[j] = gm[j][i];
        k4_pack_scales(scales, sc, m);
        if (qh) get_runs(qh, gqh, QK_K / 8, i);
        get_runs(qs, gqs, QK_K / 2, i);
    }
}

static void convert_q4_K(block_q4_Kx8 *g, block_q4_K *b, int i, int to_x8) {
    convert_k4(g->d, g->dmin, g->sc, g->m, NULL, g->qs, &b->d, &b->dmin, b->scales, NULL, b->qs, i, to_x8);
}

static void convert_q5_K(block_q5_Kx8 *g, block_q5_K *b, int i, int to_x8) {
    convert_k4(g->d, g->dmin, g->sc, g->m, g->qh, g->qs, &b->d, &b->dmin, b->scales, b->qh, b->qs, i, to_x8);
}

static void convert_q6_K(block_q6_Kx8 *g, block_q6_K *b, int i, int to_x8) {
    if (to_x8) {
        g->d[i] = b->d;
        for (int j = 0; j < QK_K / 16; j++) g->sc[j][i] = b->scales[j];
        for (int j = 0; j < QK_K / 8; j++) memcpy(g->q + q6x8_ql(j) + 4 * i, b->ql + 4 * j, 4);
        for (int j = 0; j < QK_K / 16; j++) memcpy(g->q + q6x8_qh(j) + 4 * i, b->qh + 4 * j, 4);
    } else {
        b->d = g->d[i];
        for (int j = 0; j < QK_K / 16; j++) b->scales[j] = g->sc[j][i];
        for (int j = 0; j < QK_K / 8; j++) memcpy(b->ql + 4 * j, g->q + q6x8_ql(j) + 4 * i, 4);
        for (int j = 0; j < QK_K / 16; j++) memcpy(b->qh + 4 * j, g->q + q6x8_qh(j) + 4 * i, 4);
    }
}

static void convert_q2_K(block_q2_Kx8 *g, block_q2_K *b, int i, int to_x8) {
    if (to_x8) {
        g->d[i] = b->d, g->dmin[i] = b->dmin;
        for (int j = 0; j < QK_K / 16; j++) g->scales[j][i] = b->scales[j];
        put_runs(g->qs, b->qs, QK_K / 4, i);
    } else {
        b->d = g->d[i], b->dmin = g->dmin[i];
        for (int j = 0; j < QK_K / 16; j++) b->scales[j] = g->scales[j][i];
        get_runs(b->qs, g->qs, QK_K / 4, i);
    }
}

static void convert_q3_K(block_q3_Kx8 *g, block_q3_K *b, int i, int to_x8) {
    if (to_x8) {
        g->d[i] = b->d;
        for (int j = 0; j < QK_K / 16; j++) g->sc[j][i] = (int8_t)(k3_scale(b->scales, j) - 32);
        put_runs(g->hmask, b->hmask, QK_K / 8, i);
        put_runs(g->qs, b->qs, QK_K / 4, i);
    } else {
        b->d = g->d[i];
        uint8_t u[QK_K / 16];
        for (int j = 0; j < QK_K / 16; j++) u[j] = (uint8_t)(g->sc[j][i] + 32);
        k3_pack_scales(b->scales, u);
        get_runs(b->hmask, g->hmask, QK_K / 8, i);
        get_runs(b->qs, g->qs, QK_K / 4, i);
    }
}

void pack_x8_k(void *dst, const void *rows, int type, int n_in, int n_out) {
    const int nb = n_in / ggml_block_elems(type);
    const size_t row_bytes = ggml_row_bytes(type, n_in), group_bytes = x8_bytes_k(type, n_in, ROW_GROUP);
    for (int g = 0; g < n_out / ROW_GROUP; g++)
        pack_x8_k_part((char *)dst + (size_t)g * group_bytes, (const char *)rows + (size_t)g * ROW_GROUP * row_bytes,
                       type, n_in, ROW_GROUP, 0, nb);
}

/* One switch case of pack_x8_k_part: block b of file row i (src) into row slot i of x8 block `at`
 * (copied first: convert_* takes a mutable block for the other direction). */
#define PACK_ONE_BLOCK(TYPE, T)                                                                     \
    case TYPE: {                                                                                    \
        block_##T t = ((const block_##T *)src)[b];                                                  \
        convert_##T((block_##T##x8 *)dst + at, &t, i, 1);                                           \
        break;                                                                                      \
    }

void pack_x8_k_part(void *dst, const void *rows, int type, int n_in, int n_rows, int b0, int b1) {
    const size_t row_bytes = ggml_row_bytes(type, n_in);
    memset(dst, 0, x8_bytes_k(type, n_in, ROW_GROUP) / (size_t)(n_in / ggml_block_elems(type)) * (size_t)(b1 - b0));
    for (int b = b0; b < b1; b++)
        for (int i = 0; i < n_rows; i++) {
            const char *src = (const char *)rows + (size_t)i * row_bytes;
            const int at = b - b0;
            switch (type) {
            PACK_ONE_BLOCK(GGML_TYPE_Q5_0, q5_0)
            PACK_ONE_BLOCK(GGML_TYPE_Q5_1, q5_1)
            PACK_ONE_BLOCK(GGML_TYPE_Q2_K, q2_K)
            PACK_ONE_BLOCK(GGML_TYPE_Q3_K, q3_K)
            PACK_ONE_BLOCK(GGML_TYPE_Q4_K, q4_K)
            PACK_ONE_BLOCK(GGML_TYPE_Q5_K, q5_K)
            PACK_ONE_BLOCK(GGML_TYPE_Q6_K, q6_K)
            default: return;
            }
        }
}

/* ---- block fetch: file rows or row groups --------------------------------------------------- */

/* Block b of weight row o in the file layout: from w->x8 (gathered into *tmp) when the row is in
 * a whole group and the groups exist, else straight from w->rows. */
#define DEFINE_FETCH(T, ELEMS)                                                                      \
    static const block_##T *fetch_##T(const gemm_weight *w, int o, int b, block_##T *tmp) {          \
        if (w->x8 == NULL || o >= w->n_out / ROW_GROUP * ROW_GROUP) {                               \
            const char *row = (const char *)w->rows + (size_t)o * ggml_row_bytes(w->type, w->n_in);  \
            return (const block_##T *)row + b;                                                      \
        }                                                                                           \
        const size_t at = (size_t)(o / ROW_GROUP) * (size_t)(w->n_in / (ELEMS)) + (size_t)b;        \
        convert_##T((block_##T##x8 *)w->x8 + at, tmp, o % ROW_GROUP, 0);                            \
        return tmp;                                                                                 \
    }

DEFINE_FETCH(q5_0, QK)
DEFINE_FETCH(q5_1, QK)
DEFINE_FETCH(q4_K, QK_K)
DEFINE_FETCH(q5_K, QK_K)
DEFINE_FETCH(q6_K, QK_K)
DEFINE_FETCH(q2_K, QK_K)
DEFINE_FETCH(q3_K, QK_K)

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
