/* Rotary position embedding, portable reference: adjacent pairs (llama.cpp rope mode NORMAL)
 * and split halves (mode NEOX).
 *
 * Pair i of every head, (x[2i], x[2i+1]) or (x[i], x[i + head_dim/2]), turns by theta_i = pos * base^(-2i/head_dim); the
 * caller supplies cos/sin of theta_i for the token's position (see engine_create.c and engine.c: rope tables).
 */
#include "kernels.h"

void rope_generic(float *x, int n_heads, int head_dim, const float *cos_sin) {
    for (int h = 0; h < n_heads; h++) {
        float *xh = x + (size_t)h * head_dim;
        for (int i = 0; i < head_dim / 2; i++) {
            float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
            float x0 = xh[2 * i], x1 = xh[2 * i + 1];
            xh[2 * i] = x0 * c - x1 * s;
            xh[2 * i + 1] = x0 * s + x1 * c;
        }
    }
}

void rope_neox_generic(float *x, int n_heads, int head_dim, const float *cos_sin) {
    const int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *xh = x + (size_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
            float x0 = xh[i], x1 = xh[i + half];
            xh[i] = x0 * c - x1 * s;
            xh[i + half] = x0 * s + x1 * c;
        }
    }
}
