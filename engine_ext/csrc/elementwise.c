/* Element-wise ops, portable reference: SiLU and GELU (tanh) gates and the exponential. */
#include <math.h>

#include "kernels.h"

void silu_mul_generic(float *out, const float *g, const float *u, int n) {
    for (int i = 0; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* ggml's constants for GELU's tanh approximation. */
#define GELU_COEF_A 0.044715f
#define SQRT_2_OVER_PI 0.79788456080286535587989211986876f

void gelu_tanh_mul_generic(float *out, const float *g, const float *u, int n) {
    for (int i = 0; i < n; i++) {
        const float x = g[i];
        float y;
        if (x <= -10.0f) y = 0.0f;
        else if (x >= 10.0f) y = x;
        else y = 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * x * (1.0f + GELU_COEF_A * x * x)));
        out[i] = y * u[i];
    }
}

void exp_generic(float *y, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] = expf(x[i]);
}
