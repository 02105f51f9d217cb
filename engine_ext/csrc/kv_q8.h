/* KV elements in 8 bits (q8_0, as llama.cpp's -ctk/-ctv q8_0): each head row of head_dim values
 * is cut into blocks of 32, each block stored as an f16 scale d and 32 int8 q, value = d * q,
 * d = max|x| / 127, q = round(x / d) (the reference quantizer's arithmetic). A row takes
 * kv_q8_row_bytes(head_dim) = head_dim / 32 * 34 bytes: 8.5 bits a value, 53% of f16.
 *
 * v plane, row p = position p: the blocks in order, scale first (llama.cpp's block_q8_0):
 *
 *   row p | d0 q0[0..31] | d1 q1[0..31] | ...                        (34 bytes a block)
 *
 * k plane: blocks of KEY_LANES positions as for f16/f32 (kernels.h key_index), each holding, per
 * group of 32 dimensions, the KEY_LANES positions' scales and then the group's values
 * dimension-major, so one 8-byte load holds dimension d of 8 keys and the 8 scales sit just
 * before their 256 values (the kernel reads the block front to back, as it does f16 keys):
 *
 *   key block b | group 0: d[p0..p7] (8 x f16) | dim0 q[p0..p7] | dim1 q[p0..p7] | ... dim31 |
 *               | group 1: d[p0..p7] | dim32 q[p0..p7] | ...                       (272 bytes a group)
 *
 * A key block is KEY_LANES * kv_q8_row_bytes bytes, so a slot's first n tokens are still the
 * first ceil(n / KEY_LANES) blocks of every k plane and the first n rows of every v plane.
 * head_dim must be a multiple of 32 (engine_create refuses q8_0 otherwise). */
#ifndef SLOTSERVE_KV_Q8_H
#define SLOTSERVE_KV_Q8_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fp16.h"
#include "kernels.h"

#define KV_F32 0
#define KV_F16 1
#define KV_Q8_0 2
#define KV_Q8_BLOCK 32
#define KV_Q8_BLOCK_BYTES 34                     /* f16 scale + 32 int8 */
#define KV_Q8_GROUP_BYTES (KEY_LANES * KV_Q8_BLOCK_BYTES) /* one group of a key block */

static inline size_t kv_q8_row_bytes(int head_dim) { return (size_t)head_dim / KV_Q8_BLOCK * KV_Q8_BLOCK_BYTES; }

/* Quantize one row of n (a multiple of 32) values into n / 32 blocks [d f16][q int8 x 32]. */
static inline void kv_q8_quantize_row(uint8_t *out, const float *x, int n) {
    for (int b = 0; b < n / KV_Q8_BLOCK; b++, x += KV_Q8_BLOCK, out += KV_Q8_BLOCK_BYTES) {
        float amax = 0.0f;
        for (int j = 0; j < KV_Q8_BLOCK; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t dh = fp32_to_f16(d);
        memcpy(out, &dh, 2);
        for (int j = 0; j < KV_Q8_BLOCK; j++) out[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
    }
}

/* Byte offset of group g (dims 32g .. 32g+31) of key t's block in a k plane. */
static inline size_t kv_q8_key_group(int t, int g, int head_dim) {
    return (size_t)(t / KEY_LANES) * KEY_LANES * kv_q8_row_bytes(head_dim) + (size_t)g * KV_Q8_GROUP_BYTES;
}

/* Scatter a row in the v layout (blocks [d][q x 32]) into key position t of a k plane, or
 * gather it back (to_plane = 0). */
static inline void kv_q8_key_row(uint8_t *kplane, uint8_t *row, int t, int head_dim, int to_plane) {
    const int lane = t % KEY_LANES;
    for (int g = 0; g < head_dim / KV_Q8_BLOCK; g++, row += KV_Q8_BLOCK_BYTES) {
        uint8_t *grp = kplane + kv_q8_key_group(t, g, head_dim);
        if (to_plane) memcpy(grp + 2 * lane, row, 2);
        else memcpy(row, grp + 2 * lane, 2);
        for (int j = 0; j < KV_Q8_BLOCK; j++) {
            uint8_t *at = grp + 2 * KEY_LANES + j * KEY_LANES + lane;
            if (to_plane) *at = row[2 + j];
            else row[2 + j] = *at;
        }
    }
}

/* Key t of a k plane, dequantized: dst[d] = scale * q. */
static inline void kv_q8_load_key(float *dst, const void *kplane, int t, int head_dim) {
    const int lane = t % KEY_LANES;
    for (int g = 0; g < head_dim / KV_Q8_BLOCK; g++) {
        const uint8_t *grp = (const uint8_t *)kplane + kv_q8_key_group(t, g, head_dim);
        uint16_t dh;
        memcpy(&dh, grp + 2 * lane, 2);
        const float d = fp16_to_f32(dh);
        for (int j = 0; j < KV_Q8_BLOCK; j++)
            dst[g * KV_Q8_BLOCK + j] = d * (float)(int8_t)grp[2 * KEY_LANES + j * KEY_LANES + lane];
    }
}

/* Row p of a v plane, dequantized. */
static inline void kv_q8_load_row(float *dst, const void *vplane, size_t p, int head_dim) {
    const uint8_t *row = (const uint8_t *)vplane + p * kv_q8_row_bytes(head_dim);
    for (int g = 0; g < head_dim / KV_Q8_BLOCK; g++, row += KV_Q8_BLOCK_BYTES) {
        uint16_t dh;
        memcpy(&dh, row, 2);
        const float d = fp16_to_f32(dh);
        for (int j = 0; j < KV_Q8_BLOCK; j++) dst[g * KV_Q8_BLOCK + j] = d * (float)(int8_t)row[2 + j];
    }
}

#endif
