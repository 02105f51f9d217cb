/* Block layouts of every weight type: ggml type ids, block sizes, the file's byte-exact blocks,
 * their row groups (x8), and the functions that size and pack them.
 *
 * Design: the one header both quant.c (Q8_0, Q4_0, Q4_1, row sizes) and quant_k.c / quant_k_x8.c
 * (Q5_0, Q5_1, K-quants, BF16) take their layouts from; kernels.h (the kernel contracts) and
 * quant_k.h (the kernels of quant_k.c's types) build on it. Nothing here computes.
 */
#ifndef SLOTSERVE_BLOCKS_H
#define SLOTSERVE_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

/* ggml tensor type ids (the subset the engine implements; table entries of other ids are NULL). */
enum {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q2_K = 10,
    GGML_TYPE_Q3_K = 11,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_BF16 = 30,
    GGML_TYPE_COUNT = 31,
};

#define QK 32 /* elements per quantization block (every block format here) */
#define QK_K 256      /* elements per K-quant super-block */
#define K_SCALE_SIZE 12 /* packed 6-bit scales and mins of Q4_K / Q5_K */

/* ggml block layouts, byte-exact with the GGUF file. Values: Q8_0 d*q; Q4_0 d*(nib-8);
 * Q4_1 d*nib + m. Nibbles: qs[j] & 15 is element j, qs[j] >> 4 is element j + 16. */
typedef struct { uint16_t d; int8_t qs[QK]; } block_q8_0;                 /* 34 bytes */
typedef struct { uint16_t d; uint8_t qs[QK / 2]; } block_q4_0;            /* 18 bytes */
typedef struct { uint16_t d; uint16_t m; uint8_t qs[QK / 2]; } block_q4_1; /* 20 bytes */
_Static_assert(sizeof(block_q8_0) == 34 && sizeof(block_q4_0) == 18 && sizeof(block_q4_1) == 20, "ggml sizes");

/* The same for the types of quant_k.c.
 * Q5_0/Q5_1: element j < 16 is (qs[j] & 15) | bit j of qh << 4; element j + 16 is
 *   (qs[j] >> 4) | bit j+16 of qh << 4 (qh read as a little-endian uint32). Q5_0 value
 *   d * (q - 16); Q5_1 value d * q + m.
 * Q4_K: 4 chunks of 64 elements; chunk c reads qs[32c .. 32c+32): low nibbles are sub-block 2c,
 *   high nibbles sub-block 2c+1. Value d * sc_j * q - dmin * m_j with the 6-bit (sc_j, m_j) packed
 *   in scales[12] (see k4_scale_min in quant_k_x8.h).
 * Q5_K: as Q4_K, plus the fifth bit: bit j of qh[l] for element l of sub-block j.
 * Q2_K: 2 halves of 128; in half n, element 128n + 32j + l (j < 4, l < 32) is
 *   (qs[32n + l] >> 2j) & 3; sub-block of 16 e/16 has scales[e/16] & 15 as scale, >> 4 as min:
 *   value d * sc * q - dmin * m.
 * Q3_K: as Q2_K for the low 2 bits; bit 4n+j of hmask[l] set adds 0, clear subtracts 4
 *   (q in -4..3); 16 signed 6-bit scales (sc - 32) packed in scales[12] (k3_scale in
 *   quant_k_x8.h): value d * sc * q.
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

/* Row groups: block weights are repacked at load into groups of ROW_GROUP rows whose blocks
 * interleave 4-byte runs, so one 32-byte load holds 4 elements of each of the 8 rows and an
 * integer dot product lands row by row in the 8 lanes (no horizontal sums):
 *
 *   x8 block b of group g = { d[8] (, m[8]) ; qs[j][row][4] }   row = 8g + lane
 *   Q4: qs[j][i][c] = byte 4j+c of row i's block (its low nibble is element 4j+c, its high
 *       nibble element 16+4j+c), j = 0..3.   Q8_0: qs[j][i][c] = element 4j+c, j = 0..7.
 *
 * Rows past the last whole group stay in the file's row layout. */
#define ROW_GROUP 8
typedef struct { uint16_t d[ROW_GROUP]; int8_t qs[QK * ROW_GROUP]; } block_q8_0x8;                   /* 272 B */
typedef struct { uint16_t d[ROW_GROUP]; uint8_t qs[QK / 2 * ROW_GROUP]; } block_q4_0x8;              /* 144 B */
typedef struct { uint16_t d[ROW_GROUP]; uint16_t m[ROW_GROUP]; uint8_t qs[QK / 2 * ROW_GROUP]; } block_q4_1x8; /* 160 B */

/* Row groups of quant_k.c's types (as above): 8 rows per group, every byte array interleaved in
 * 4-byte runs,
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
/* Q6_K's x8 runs (32 bytes: run j of the 8 rows' ql or qh arrays, as above) are stored in the
 * order the kernels read them, so that a decode step streams each block front to back: half n
 * (q[768n ..]) holds ql run 16n + i beside qh run 8n + i for i = 0..7 (64 bytes each: the pass
 * of quarters 0 and 2, which take those qh runs' bits 0-1 and 4-5), then ql runs 16n + 8 .. 16n + 15
 * (the pass of quarters 1 and 3, which read the same qh runs again, from cache). With ql and qh
 * in two separate arrays, the same one-row kernel streamed 2x slower from memory (the reads
 * went back and forth between two regions of the block). q6x8_ql / q6x8_qh give a run's
 * place; quant_k_x8.c packs with them and every x8 kernel reads with them. */
typedef struct {
    uint16_t d[ROW_GROUP]; int8_t sc[QK_K / 16][ROW_GROUP];
    uint8_t q[(QK_K / 2 + QK_K / 4) * ROW_GROUP]; /* runs as above */
} block_q6_Kx8; /* 1680 bytes */

/* Byte offset in block_q6_Kx8.q of ql run j (0..31) and of qh run j (0..15). */
static inline int q6x8_ql(int j) { return 768 * (j >> 4) + ((j & 8) ? 512 + 32 * (j & 7) : 64 * (j & 7)); }
static inline int q6x8_qh(int j) { return 768 * (j >> 3) + 64 * (j & 7) + 32; }

_Static_assert(sizeof(block_q5_0x8) == 176 && sizeof(block_q5_1x8) == 192, "x8 sizes");
_Static_assert(sizeof(block_q2_Kx8) == 672 && sizeof(block_q3_Kx8) == 912, "x8 sizes");
_Static_assert(sizeof(block_q4_Kx8) == 1184 && sizeof(block_q5_Kx8) == 1440 && sizeof(block_q6_Kx8) == 1680, "x8 sizes");

/* Bytes of one row of k elements in a weight type; 0 for an unsupported type (quant.c). */
size_t ggml_row_bytes(int type, int k);

/* Elements per block of a block type (QK or QK_K); 0 for float types (quant.c). */
int ggml_block_elems(int type);

/* Bytes of the x8 form of a block-type weight (0 for float types); pack_x8 writes it (quant.c,
 * which hands the types of quant_k.c to x8_bytes_k / pack_x8_k, quant_k_x8.c). */
size_t x8_bytes(int type, int n_in, int n_out);
void pack_x8(void *dst, const void *rows, int type, int n_in, int n_out);

/* x8_bytes / pack_x8 for the types of quant_k.c (quant_k_x8.c defines these); 0 / nothing for others. */
size_t x8_bytes_k(int type, int n_in, int n_out);
void pack_x8_k(void *dst, const void *rows, int type, int n_in, int n_out);

/* Blocks [b0, b1) of rows row0 .. row0+n_rows-1 (n_rows <= ROW_GROUP; `rows` points at row0 in
 * the file layout) as (b1 - b0) x8 blocks; lanes of missing rows are zero. For kernels that run
 * the row-group code on rows outside whole groups. */
void pack_x8_k_part(void *dst, const void *rows, int type, int n_in, int n_rows, int b0, int b1);

#endif
