/* Element-wise ops, portable reference: SiLU gate and the exponential. */
#include <math.h>

#include "kernels.h"

void silu_mul_generic(float *out, const float *g, const float *u, int n) {
    for (int i = 0; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void exp_generic(float *y, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] = expf(x[i]);
}
