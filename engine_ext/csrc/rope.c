/* Rotary position embedding on adjacent pairs (llama.cpp rope mode NORMAL), portable reference.
 *
 * Pair i of every head, (x[2i], x[2i+1]), turns by theta_i = pos * base^(-2i/head_dim); the
 * caller supplies cos/sin of theta_i for the token's position (see engine.c rope tables).
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
