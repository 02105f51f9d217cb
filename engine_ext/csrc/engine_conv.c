/* lfm2's short-convolution block. Such a layer keeps no keys or values but its conv input,
 * b * x, one row per position in the slot's KV block (engine_kv.c).
 *
 * Such a layer walks the attention block's phases: norm | in_proj matmul | b * x stored
 * (rows) | conv of rows pos-conv_len+1..pos from the store (rows) | - | - | out_proj | -.
 * The conv reads the current row from the store too, so a row's result is the same whether
 * its predecessors were computed in this step or an earlier one.
 */
#include <string.h>

#include "engine_internal.h"

/* A short-convolution block (lfm2) in the attention block's phases (see top). */
int conv_block(engine *e, const layer_weights *L, int l, int p, int nth) {
    const kernel_table *kt = e->kt;
    const int T = e->n_rows, dim = e->m.dim, nu = n_row_units(T), taps = e->m.conv_len;
    const int quantize_out = is_block_type(L->conv_out.type);
    norm_phase(e, p++, L->attn_norm, is_block_type(L->conv_in.type), proj_before_layer(e, l));
    {
        mm_job job = {&L->conv_in, e->bcx, 3 * dim, 0};
        act_rows in = input_view(e, e->xb, dim);
        matmul_phase(e, p++, &job, 1, &in, T, nth);
    }
    /* rows: the conv input b * x of each row's position, into the slot's store */
    FOR_EACH_UNIT(e, p, nu, u) {
        int r0, r1;
        unit_rows(u, T, &r0, &r1);
        for (int r = r0; r < r1; r++) {
            float *b = e->bcx + (size_t)r * 3 * dim;
            const float *x = b + 2 * dim;
            for (int i = 0; i < dim; i++) b[i] *= x[i];
            char *row = conv_row(e, e->row_slot[r], l, e->row_pos[r]);
            if (e->kv_f16) kt->f32_to_f16((uint16_t *)row, b, dim);
            else memcpy(row, b, sizeof(float) * dim);
        }
    }
    phase_end(e, p++, nu);
    if (l == e->fault_layer) return -1; /* test hook */
    /* rows: y = c * conv(stored inputs of positions pos-taps+1 .. pos), quantized for out_proj */
    const float *w = e->conv_taps + (size_t)l * taps * dim;
    FOR_EACH_UNIT(e, p, nu, u) {
        int r0, r1;
        unit_rows(u, T, &r0, &r1);
        for (int r = r0; r < r1; r++) {
            const void *rows[MAX_CONV_LEN];
            for (int i = 0; i < taps; i++) {
                const int pos = e->row_pos[r] - (taps - 1) + i;
                rows[i] = pos >= 0 ? conv_row(e, e->row_slot[r], l, pos) : NULL;
            }
            kt->shortconv(e->xb + (size_t)r * dim, e->bcx + (size_t)r * 3 * dim + dim, rows, e->kv_f16, w, taps, dim);
            if (quantize_out) quantize_row(e, e->xb, dim, r);
        }
    }
    phase_end(e, p++, nu);
    p += 2; /* attention's merge and quantize phases: nothing here */
    {
        mm_job job = {&L->conv_out, e->x, dim, 1};
        act_rows in = input_view(e, e->xb, dim);
        matmul_phase(e, p++, &job, 1, &in, T, nth);
    }
    return p + 1; /* no post-norm */
}
