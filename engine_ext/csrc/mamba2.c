/* Mamba2 (granitehybrid) kernels, portable reference: one token of one head's selective scan
 * (mamba2_scan) and the per-head step size and decay of a token (mamba2_gates). Contracts in
 * kernels.h; engine_recurrent.c walks the scan token by token in position order.
 *
 * NOTE: the scan's sum runs in the order the SIMD variants' vectors give it (16 partial sums,
 * folded pairwise, then hsum256's tree, then the tail one by one; products and sums never
 * fused), so scalar, AVX2 and AVX-512 agree bit for bit and a pool's numbers do not depend on
 * which of them ran.
 */
#include <math.h>

#include "kernels.h"

void mamba2_scan_generic(float *S, const float *src, float *y, const float *x, const float *B, const float *C,
                         float dA, float dt, int p, int n) {
    for (int i = 0; i < p; i++) {
        float *row = S + (size_t)i * n;
        const float *in = src + (size_t)i * n;
        const float xdt = x[i] * dt;
        float acc[16] = {0};
        int j = 0;
        for (; j + 16 <= n; j += 16)
            for (int l = 0; l < 16; l++) {
                const float s = in[j + l] * dA + B[j + l] * xdt;
                row[j + l] = s;
                acc[l] = acc[l] + s * C[j + l];
            }
        float t[8];
        for (int l = 0; l < 8; l++) t[l] = acc[l] + acc[l + 8];
        float sum = ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
        for (; j < n; j++) {
            const float s = in[j] * dA + B[j] * xdt;
            row[j] = s;
            sum = sum + s * C[j];
        }
        y[i] = sum;
    }
}

void mamba2_gates(float *dt, float *dA, const float *bias, const float *a, int n) {
    for (int h = 0; h < n; h++) {
        const float v = dt[h] + bias[h];
        const float sp = v > 20.0f ? v : log1pf(expf(v)); /* ggml's softplus */
        dt[h] = sp;
        dA[h] = expf(sp * a[h]);
    }
}
