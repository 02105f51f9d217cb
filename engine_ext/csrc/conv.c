/* LFM2's short convolution (a depthwise causal conv1d over the last L positions), portable
 * reference. Contract in kernels.h (shortconv). */
#include "fp16.h"
#include "kernels.h"

void shortconv_generic(float *out, const float *gate, const void *const *rows, int rows_f16, const float *w,
                       int taps, int n) {
    for (int c = 0; c < n; c++) {
        float acc = 0.0f;
        for (int i = 0; i < taps; i++) {
            if (!rows[i]) continue; /* a position before 0: the state starts at zero */
            const float x = rows_f16 ? fp16_to_f32(((const uint16_t *)rows[i])[c]) : ((const float *)rows[i])[c];
            acc = acc + w[(size_t)i * n + c] * x;
        }
        out[c] = gate[c] * acc;
    }
}
