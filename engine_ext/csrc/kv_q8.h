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
 * group of 32 dimensions, the KEY_LANES positions' scales and then the group's values in quads of
 * 4 dimensions, each quad key by key, so one 32-byte load holds 4 dimensions of 8 keys with each
 * key's 4 bytes in one 32-bit lane (what an int8 dot product instruction sums), and the 8 scales
 * sit just before their 256 values (the kernels read the block front to back):
 *
 *   key block b | group 0: d[p0..p7] (8 x f16) | dims 0-3: p0 q[0..3] p1 q[0..3] ... p7 q[0..3] |
 *               |          dims 4-7: p0 q[4..7] ... | ... dims 28-31 | group 1: d[p0..p7] | ...
 *                                                                          (272 bytes a group)
 *
 * Scores against q8_0 keys are integer dot products (as llama.cpp's for a q8_0 K cache): the query
 * head row is quantized per block of 32 as well (kv_q8_quantize_query: an f32 scale qd = max|x| /
 * 127 and int8 values), each block's dot product of int8 values is exact in 32 bits, and
 *
 *   score(t) = scale * sum over blocks g in order of  float(isum_g) * (kd_g(t) * qd_g)
 *
 * (every SIMD kernel: s = fma(float(isum_g), kd_g * qd_g, s) from s = 0, then s * scale; the
 * portable kernel the same products added without fma).
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

/* roundf(y) (half away from zero) for |y| < 2^31, without the library call: y - trunc(y) is
 * exact in float. The SIMD query quantizer (arch/x86_attn_tiles.h) repeats these steps. */
static inline int32_t kv_q8_round(float y) {
    int32_t i = (int32_t)y;
    const float f = y - (float)i;
    return i + (f >= 0.5f) - (f <= -0.5f);
}

/* Quantize one row of n (a multiple of 32) values into n / 32 blocks [d f16][q int8 x 32]. */
static inline void kv_q8_quantize_row(uint8_t *out, const float *x, int n) {
    for (int b = 0; b < n / KV_Q8_BLOCK; b++, x += KV_Q8_BLOCK, out += KV_Q8_BLOCK_BYTES) {
        float amax = 0.0f;
        for (int j = 0; j < KV_Q8_BLOCK; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t dh = fp32_to_f16(d);
        memcpy(out, &dh, 2);
        for (int j = 0; j < KV_Q8_BLOCK; j++) out[2 + j] = (uint8_t)(int8_t)kv_q8_round(x[j] * id);
    }
}

/* Byte offset of group g (dims 32g .. 32g+31) of key t's block in a k plane. */
static inline size_t kv_q8_key_group(int t, int g, int head_dim) {
    return (size_t)(t / KEY_LANES) * KEY_LANES * kv_q8_row_bytes(head_dim) + (size_t)g * KV_Q8_GROUP_BYTES;
}

/* Byte offset of dimension j (0..31) of lane `lane` inside a group: past the scales, quad j / 4,
 * the lane's 4 bytes. */
static inline size_t kv_q8_key_byte(int lane, int j) {
    return 2 * KEY_LANES + (size_t)(j / 4) * 4 * KEY_LANES + (size_t)lane * 4 + j % 4;
}

/* Scatter a row in the v layout (blocks [d][q x 32]) into key position t of a k plane, or
 * gather it back (to_plane = 0). */
static inline void kv_q8_key_row(uint8_t *kplane, uint8_t *row, int t, int head_dim, int to_plane) {
    const int lane = t % KEY_LANES;
    for (int g = 0; g < head_dim / KV_Q8_BLOCK; g++, row += KV_Q8_BLOCK_BYTES) {
        uint8_t *grp = kplane + kv_q8_key_group(t, g, head_dim);
        if (to_plane) memcpy(grp + 2 * lane, row, 2);
        else memcpy(row, grp + 2 * lane, 2);
        for (int j = 0; j < KV_Q8_BLOCK; j += 4) {
            uint8_t *at = grp + kv_q8_key_byte(lane, j);
            if (to_plane) memcpy(at, row + 2 + j, 4);
            else memcpy(row + 2 + j, at, 4);
        }
    }
}

/* A quantized query head row (kv_q8_quantize_query): int8 values [head_dim], then the blocks' f32
 * scales [head_dim / 32], then their sums of values as int32 [head_dim / 32] (for kernels that
 * offset keys to unsigned bytes: sum (k + 128) q = sum k q + 128 sum q). */
static inline size_t kv_q8_query_bytes(int head_dim) { return (size_t)head_dim + (size_t)head_dim / KV_Q8_BLOCK * 8; }
static inline const int8_t *kv_q8_query_values(const uint8_t *qrow) { return (const int8_t *)qrow; }
static inline const float *kv_q8_query_scales(const uint8_t *qrow, int head_dim) {
    return (const float *)(const void *)(qrow + head_dim);
}
static inline const int32_t *kv_q8_query_sums(const uint8_t *qrow, int head_dim) {
    return (const int32_t *)(const void *)(qrow + head_dim + (size_t)head_dim / KV_Q8_BLOCK * 4);
}

/* Quantize one query head row of head_dim (a multiple of 32) values into dst
 * (kv_q8_query_bytes): per block qd = max|x| / 127 kept in f32, q = round(x / qd) (x * (1 / qd),
 * as kv_q8_quantize_row). Every variant calls this one function, so they score the same bytes. */
static inline void kv_q8_quantize_query(uint8_t *dst, const float *x, int head_dim) {
    int8_t *q = (int8_t *)dst;
    float *qd = (float *)(void *)(dst + head_dim);
    int32_t *qs = (int32_t *)(void *)(dst + head_dim + (size_t)head_dim / KV_Q8_BLOCK * 4);
    for (int b = 0; b < head_dim / KV_Q8_BLOCK; b++, x += KV_Q8_BLOCK, q += KV_Q8_BLOCK) {
        float amax = 0.0f;
        for (int j = 0; j < KV_Q8_BLOCK; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int32_t sum = 0;
        for (int j = 0; j < KV_Q8_BLOCK; j++) {
            q[j] = (int8_t)kv_q8_round(x[j] * id);
            sum += q[j];
        }
        qd[b] = d;
        qs[b] = sum;
    }
}

/* Key t's score against a quantized query row (the portable kernel's: see the top), unscaled. */
static inline float kv_q8_key_score(const void *kplane, int t, const uint8_t *qrow, int head_dim) {
    const int lane = t % KEY_LANES;
    const int8_t *q = kv_q8_query_values(qrow);
    const float *qd = kv_q8_query_scales(qrow, head_dim);
    float s = 0.0f;
    for (int g = 0; g < head_dim / KV_Q8_BLOCK; g++) {
        const uint8_t *grp = (const uint8_t *)kplane + kv_q8_key_group(t, g, head_dim);
        uint16_t dh;
        memcpy(&dh, grp + 2 * lane, 2);
        int32_t isum = 0;
        for (int j = 0; j < KV_Q8_BLOCK; j++) isum += (int32_t)(int8_t)grp[kv_q8_key_byte(lane, j)] * q[g * KV_Q8_BLOCK + j];
        s += (float)isum * (fp16_to_f32(dh) * qd[g]);
    }
    return s;
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
