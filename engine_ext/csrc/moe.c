/* Mixture-of-experts routing (softmax, top-k, renormalisation) and the grouping of a step's
 * rows by expert, so the engine streams each chosen expert's weights once per step. Contracts
 * in moe.h. Scalar and deterministic: a row's experts and weights depend on its logits only. */
#include "moe.h"

#include <math.h>

void moe_route(const float *logits, int n, int k, int norm, int *sel, float *w) {
    float mx = logits[0];
    for (int i = 1; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += expf(logits[i] - mx);
    for (int r = 0; r < k; r++) { /* k passes of argmax: strict > keeps the lower index on ties */
        int best = -1;
        float bv = 0.0f;
        for (int i = 0; i < n; i++) {
            int taken = 0;
            for (int j = 0; j < r; j++) taken |= sel[j] == i;
            if (taken) continue;
            if (best < 0 || logits[i] > bv) {
                best = i;
                bv = logits[i];
            }
        }
        sel[r] = best;
        w[r] = expf(bv - mx) / sum;
    }
    if (norm) {
        float s = 0.0f;
        for (int r = 0; r < k; r++) s += w[r];
        if (s < 6.103515625e-5f) s = 6.103515625e-5f;
        for (int r = 0; r < k; r++) w[r] /= s;
    }
}

int moe_group(const int *sel, int n_rows, int k, int n_expert, int *off, int *pair_row, int *pair_of, int *active) {
    for (int x = 0; x <= n_expert; x++) off[x] = 0;
    for (int j = 0; j < n_rows * k; j++) off[sel[j] + 1]++;
    int n_active = 0;
    for (int x = 0; x < n_expert; x++) {
        if (off[x + 1]) active[n_active++] = x;
        off[x + 1] += off[x];
    }
    /* fill in row order: a cursor per expert, reset from off afterwards */
    for (int r = 0; r < n_rows; r++)
        for (int i = 0; i < k; i++) {
            const int x = sel[r * k + i], j = off[x]++;
            pair_row[j] = r;
            pair_of[r * k + i] = j;
        }
    for (int x = n_expert; x > 0; x--) off[x] = off[x - 1];
    off[0] = 0;
    return n_active;
}
