/* More weight types: 5-bit blocks (Q5_0, Q5_1), K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), BF16.
 * Included by kernels.h (which defines the type ids, act_rows and gemm_weight); the kernels live
 * in quant_k.c (portable), arch/x86_avx2_k.c (AVX2) and arch/x86_vnni.c (AVX512-VNNI), the
 * latter two on arch/x86_gemm_k.h's one body.
 *
 * Design: every block weight type multiplies the 8-bit activation blocks of 32 (act_rows) with
 * an integer dot product per block of 32. The K-quants' super-blocks of 256 hold sub-blocks of
 * 32 (Q4_K, Q5_K: one 6-bit scale and one 6-bit min each) or 16 (Q6_K: one int8 scale each), so
 * every activation block meets whole sub-blocks of one super-block:
 *
 *   Q4_K, Q5_K  block b = sub-block j = b % 8:   d*sc_j * ad_b * sum(q*aq) - dmin*m_j * as_b
 *   Q6_K, Q3_K  block b = sub-blocks 2j, 2j+1:   d * ad_b * (sc_2j * sum16(q*aq) + sc_2j+1 * sum16(q*aq))
 *   Q2_K        as Q3_K, minus dmin * ad_b * (m_2j * sum16(aq) + m_2j+1 * sum16(aq))  (per-16 sums
 *               of the activation's int8s: the block sum as covers 32)
 *   Q5_0        d * (ad * sum(q*aq) - 16 * as)   (q = 5-bit 0..31)
 *   Q5_1        d * ad * sum(q*aq) + m * as
 *
 * BF16 weights multiply the float activation rows (act_rows.f), as F16 does.
 */
#ifndef SLOTSERVE_QUANT_K_H
#define SLOTSERVE_QUANT_K_H

#include <stddef.h>
#include <stdint.h>

#define QK_K 256      /* elements per K-quant super-block */
#define K_SCALE_SIZE 12 /* packed 6-bit scales and mins of Q4_K / Q5_K */

/* ggml block layouts, byte-exact with the GGUF file.
 * Q5_0/Q5_1: element j < 16 is (qs[j] & 15) | bit j of qh << 4; element j + 16 is
 *   (qs[j] >> 4) | bit j+16 of qh << 4 (qh read as a little-endian uint32). Q5_0 value
 *   d * (q - 16); Q5_1 value d * q + m.
 * Q4_K: 4 chunks of 64 elements; chunk c reads qs[32c .. 32c+32): low nibbles are sub-block 2c,
 *   high nibbles sub-block 2c+1. Value d * sc_j * q - dmin * m_j with the 6-bit (sc_j, m_j) packed
 *   in scales[12] (see k4_scale_min in quant_k.c).
 * Q5_K: as Q4_K, plus the fifth bit: bit j of qh[l] for element l of sub-block j.
 * Q2_K: 2 halves of 128; in half n, element 128n + 32j + l (j < 4, l < 32) is
 *   (qs[32n + l] >> 2j) & 3; sub-block of 16 e/16 has scales[e/16] & 15 as scale, >> 4 as min:
 *   value d * sc * q - dmin * m.
 * Q3_K: as Q2_K for the low 2 bits; bit 4n+j of hmask[l] set adds 0, clear subtracts 4
 *   (q in -4..3); 16 signed 6-bit scales (sc - 32) packed in scales[12] (k3_scale in
 *   quant_k.c): value d * sc * q.
 * Q6_K: 2 halves of 128; in half n, for l < 32: ql[64n + l] low nibble -> element 128n + l,
 *   ql[64n + 32 + l] low -> +32, ql[64n + l] high -> +64, ql[64n + 32 + l] high -> +96; the two
 *   high bits come from qh[32n + l] bits 0-1, 2-3, 4-5, 6-7 in that order. Value
 *   d * scales[e / 16] * (q - 32). */
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d; uint16_t dmin; } block_q2_K; /* 84 */
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[K_SCALE_SIZE]; uint16_t d; } block_q3_K; /* 110 */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } block_q5_0;               /* 22 bytes */
typedef struct { uint16_t d; uint16_t m; uint8_t qh[4]; uint8_t qs[16]; } block_q5_1;   /* 24 bytes */
typedef struct { uint16_t d; uint16_t dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; } block_q4_K; /* 144 */
typedef struct {
    uint16_t d; uint16_t dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2];
} block_q5_K; /* 176 bytes */
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; } block_q6_K; /* 210 */

_Static_assert(sizeof(block_q2_K) == 84, "block_q2_K must match ggml");
_Static_assert(sizeof(block_q3_K) == 110, "block_q3_K must match ggml");
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0 must match ggml");
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1 must match ggml");
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K must match ggml");
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K must match ggml");
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K must match ggml");

/* Row groups (kernels.h): 8 rows per group, every byte array interleaved in 4-byte runs,
 *   x[4 * (8 * j + i) + c] = byte 4j + c of row i's array x,
 * so one 32-byte load holds run j of all 8 rows (lane i = row i). Scales are unpacked to one byte
 * per (sub-block, row): sc[j][i]. Q5_0/Q5_1 rearrange each row's 32 high bits so that bit k of
 * byte c is the high bit of element 4k + c: a shift and a mask put the high bits of run j's low
 * nibbles (k = j) or high nibbles (k = 4 + j) at bit 4 of each byte. */
typedef struct {
    uint16_t d[ROW_GROUP]; uint16_t dmin[ROW_GROUP];
    uint8_t scales[QK_K / 16][ROW_GROUP]; /* the file's byte: scale | min << 4 */
    uint8_t qs[QK_K / 4 * ROW_GROUP];
} block_q2_Kx8; /* 672 bytes */
typedef struct {
    uint16_t d[ROW_GROUP]; int8_t sc[QK_K / 16][ROW_GROUP]; /* unpacked: sc - 32 */
    uint8_t hmask[QK_K / 8 * ROW_GROUP]; uint8_t qs[QK_K / 4 * ROW_GROUP];
} block_q3_Kx8; /* 912 bytes (8 rows: 880) */
typedef struct { uint16_t d[ROW_GROUP]; uint8_t qh[4 * ROW_GROUP]; uint8_t qs[16 * ROW_GROUP]; } block_q5_0x8; /* 176 */
typedef struct {
    uint16_t d[ROW_GROUP]; uint16_t m[ROW_GROUP]; uint8_t qh[4 * ROW_GROUP]; uint8_t qs[16 * ROW_GROUP];
} block_q5_1x8; /* 192 bytes */
typedef struct {
    uint16_t d[ROW_GROUP]; uint16_t dmin[ROW_GROUP];
    uint8_t sc[8][ROW_GROUP]; uint8_t m[8][ROW_GROUP]; /* 6-bit scale and min of sub-block j, row i */
    uint8_t qs[QK_K / 2 * ROW_GROUP];
} block_q4_Kx8; /* 1184 bytes (8 rows: 1152) */
typedef struct {
    uint16_t d[ROW_GROUP]; uint16_t dmin[ROW_GROUP];
    uint8_t sc[8][ROW_GROUP]; uint8_t m[8][ROW_GROUP];
    uint8_t qh[QK_K / 8 * ROW_GROUP]; uint8_t qs[QK_K / 2 * ROW_GROUP];
} block_q5_Kx8; /* 1440 bytes (8 rows: 1408) */
typedef struct {
    uint16_t d[ROW_GROUP]; int8_t sc[QK_K / 16][ROW_GROUP];
    uint8_t ql[QK_K / 2 * ROW_GROUP]; uint8_t qh[QK_K / 4 * ROW_GROUP];
} block_q6_Kx8; /* 1680 bytes */

_Static_assert(sizeof(block_q5_0x8) == 176 && sizeof(block_q5_1x8) == 192, "x8 sizes");
_Static_assert(sizeof(block_q2_Kx8) == 672 && sizeof(block_q3_Kx8) == 912, "x8 sizes");
_Static_assert(sizeof(block_q4_Kx8) == 1184 && sizeof(block_q5_Kx8) == 1440 && sizeof(block_q6_Kx8) == 1680, "x8 sizes");

/* x8_bytes / pack_x8 (kernels.h) for the types of this header; 0 / nothing for others. */
size_t x8_bytes_k(int type, int n_in, int n_out);
void pack_x8_k(void *dst, const void *rows, int type, int n_in, int n_out);

/* Blocks [b0, b1) of rows row0 .. row0+n_rows-1 (n_rows <= ROW_GROUP; `rows` points at row0 in
 * the file layout) as (b1 - b0) x8 blocks; lanes of missing rows are zero. For kernels that run
 * the row-group code on rows outside whole groups. */
void pack_x8_k_part(void *dst, const void *rows, int type, int n_in, int n_rows, int b0, int b1);

/* Elements per block of a block type (QK or QK_K); 0 for float types. */
int ggml_block_elems(int type);

void dequantize_row_bf16_generic(float *y, const void *x, int k);
void dequantize_row_q5_0_generic(float *y, const void *x, int k);
void dequantize_row_q5_1_generic(float *y, const void *x, int k);
void dequantize_row_q4_K_generic(float *y, const void *x, int k);
void dequantize_row_q5_K_generic(float *y, const void *x, int k);
void dequantize_row_q6_K_generic(float *y, const void *x, int k);
void dequantize_row_q2_K_generic(float *y, const void *x, int k);
void dequantize_row_q3_K_generic(float *y, const void *x, int k);
void dequantize_row_bf16_avx2(float *y, const void *x, int k);
void dequantize_row_q5_0_avx2(float *y, const void *x, int k);
void dequantize_row_q5_1_avx2(float *y, const void *x, int k);
void dequantize_row_q4_K_avx2(float *y, const void *x, int k);
void dequantize_row_q5_K_avx2(float *y, const void *x, int k);
void dequantize_row_q6_K_avx2(float *y, const void *x, int k);
void gemm_bf16_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q5_0_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q5_1_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q4_K_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q5_K_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q6_K_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q2_K_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q3_K_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
/* AVX512-VNNI matmuls (arch/x86_vnni.c); only called when the CPU has AVX512F/VL/BW/VNNI. */
void gemm_q5_0_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q5_1_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q4_K_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q5_K_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q6_K_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_bf16_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q5_0_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q5_1_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q4_K_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q5_K_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q6_K_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q2_K_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q3_K_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);

#endif
