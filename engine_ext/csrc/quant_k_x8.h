/* Row groups of the quant_k.h types, as the portable kernels see them (quant_k_x8.c): the block
 * of one weight row in the file layout, from the file rows or gathered back out of the row groups
 * (x8 layouts in blocks.h, which also declares x8_bytes_k / pack_x8_k / pack_x8_k_part, defined in
 * quant_k_x8.c), and the decoding of the packed K-quant scales, which both the packing and the
 * reference kernels (quant_k.c) read.
 */
#ifndef SLOTSERVE_QUANT_K_X8_H
#define SLOTSERVE_QUANT_K_X8_H

#include "kernels.h" /* gemm_weight; blocks.h's layouts */

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

/* Scale i (of 16) of Q3_K, 6 bits, from the 12 packed bytes: low 4 bits in scales[i % 8]
 * (i < 8: low nibble, else high), high 2 bits at 2 * (i / 4) of scales[8 + i % 4]. 0..63. */
static inline int k3_scale(const uint8_t *s, int i) {
    int lo = i < 8 ? s[i] & 15 : s[i - 8] >> 4;
    return lo | ((s[8 + i % 4] >> (2 * (i / 4))) & 3) << 4;
}

/* Block b of weight row o in the file layout: from w->x8 (gathered into *tmp) when the row is in
 * a whole group and the groups exist, else straight from w->rows. */
const block_q5_0 *fetch_q5_0(const gemm_weight *w, int o, int b, block_q5_0 *tmp);
const block_q5_1 *fetch_q5_1(const gemm_weight *w, int o, int b, block_q5_1 *tmp);
const block_q4_K *fetch_q4_K(const gemm_weight *w, int o, int b, block_q4_K *tmp);
const block_q5_K *fetch_q5_K(const gemm_weight *w, int o, int b, block_q5_K *tmp);
const block_q6_K *fetch_q6_K(const gemm_weight *w, int o, int b, block_q6_K *tmp);
const block_q2_K *fetch_q2_K(const gemm_weight *w, int o, int b, block_q2_K *tmp);
const block_q3_K *fetch_q3_K(const gemm_weight *w, int o, int b, block_q3_K *tmp);

#endif
