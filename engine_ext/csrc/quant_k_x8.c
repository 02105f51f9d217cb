/* Row groups (x8 layouts, blocks.h) of the quant_k.h types: their sizes (x8_bytes_k), packing of
 * file rows into groups (pack_x8_k, and pack_x8_k_part for rows outside whole groups), and the
 * way back, one block of one row in the file layout (fetch_*, quant_k_x8.h), which the portable
 * reference kernels read every block through (quant_k.c).
 *
 * Design: one convert_* per type moves the block of row i (of 8) between the file layout and its
 * x8 block, in either direction, so packing and fetching are each other's inverse by
 * construction (the kernel tests of the grouped path check pack_x8 through it).
 */
#include <string.h>

#include "blocks.h"
#include "quant_k_x8.h"

/* The inverse of k4_scale_min over all 8 sub-blocks (the 96 bits are a bijection). */
static void k4_pack_scales(uint8_t *s, const uint8_t *sc, const uint8_t *m) {
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
}

static void k3_pack_scales(uint8_t *s, const uint8_t *u) {
    for (int i = 0; i < 8; i++) s[i] = (uint8_t)((u[i] & 15) | ((u[i + 8] & 15) << 4));
    for (int c = 0; c < 4; c++) {
        s[8 + c] = 0;
        for (int g = 0; g < 4; g++) s[8 + c] |= (uint8_t)(((u[4 * g + c] >> 4) & 3) << (2 * g));
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
    const block_##T *fetch_##T(const gemm_weight *w, int o, int b, block_##T *tmp) {                 \
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
