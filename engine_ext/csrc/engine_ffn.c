/* The feed-forward blocks: dense (ffn_block: gate and up, act(gate) * up, down) and
 * mixture-of-experts (moe_block; routing and grouping in moe.c), and the MoE layers' expert
 * slices and step buffers. Every layer walks the dense block's 5 phases and MOE_EXTRA_PHASES
 * more (empty on a dense layer).
 */
#include <math.h>
#include <string.h>

#include "engine_internal.h"
#include "moe.h"

/* The dense feed-forward block of layer l: its 5 phases from p on, then MOE_EXTRA_PHASES empty
 * ones (engine.c). */
int ffn_block(engine *e, const layer_weights *L, int p, int nth) {
    const model_desc *m = &e->m;
    const kernel_table *kt = e->kt;
    const int T = e->n_rows, dim = m->dim, nu = n_row_units(T);
    norm_phase(e, p++, L->ffn_norm, is_block_type(L->ffn_gate.type) || is_block_type(L->ffn_up.type),
               mixer_leaves_proj(e, L));
    {
        mm_job jobs[2] = {{&L->ffn_gate, e->gate, m->ffn_dim, 0}, {&L->ffn_up, e->up, m->ffn_dim, 0}};
        act_rows in = input_view(e, e->xb, dim);
        matmul_phase(e, p++, jobs, 2, &in, T, nth);
    }
    FOR_EACH_UNIT(e, p, nu, u) {
        int r0, r1;
        unit_rows(u, T, &r0, &r1);
        for (int r = r0; r < r1; r++) {
            float *g = e->gate + (size_t)r * m->ffn_dim;
            if (m->activation == ACT_GELU_TANH) kt->gelu_tanh_mul(g, g, e->up + (size_t)r * m->ffn_dim, m->ffn_dim);
            else kt->silu_mul(g, g, e->up + (size_t)r * m->ffn_dim, m->ffn_dim);
            if (is_block_type(L->ffn_down.type)) quantize_row(e, e->gate, m->ffn_dim, r);
        }
    }
    phase_end(e, p++, nu);
    {
        const int via = output_via_proj(e, L->post_ffn_norm);
        mm_job job = {&L->ffn_down, via ? e->proj : e->x, dim, !via};
        act_rows in = input_view(e, e->gate, m->ffn_dim);
        matmul_phase(e, p++, &job, 1, &in, T, nth);
    }
    block_residual_phase(e, p, L->post_ffn_norm);
    p++;
    return p + MOE_EXTRA_PHASES; /* the MoE block's extra phases: nothing here */
}

/* Each MoE layer's expert slices (views into its 3-D weights; see engine.h), before packing. */
int moe_slices(engine *e) {
    const model_desc *m = &e->m;
    const int E = m->n_expert;
    int ok = 1;
    e->experts = xalloc(sizeof(weight_t) * m->n_layers * 3 * E, &ok);
    if (!ok) return 0;
    for (int l = 0; l < m->n_layers; l++) {
        const layer_weights *L = &e->layers[l];
        if (!is_moe_layer(L)) continue;
        const weight_t *whole[3] = {&L->moe_gate, &L->moe_up, &L->moe_down};
        for (int j = 0; j < 3; j++) {
            const int per = whole[j]->n_out / E;
            const size_t bytes = ggml_row_bytes(whole[j]->type, whole[j]->n_in) * per;
            for (int x = 0; x < E; x++) {
                weight_t *w = &e->experts[((size_t)l * 3 + j) * E + x];
                *w = *whole[j];
                w->n_out = per;
                w->rows = (const char *)whole[j]->rows + bytes * x;
                w->x8 = NULL;
            }
        }
    }
    return 1;
}

/* The MoE FFN's step buffers (see struct engine). */
int moe_create(engine *e, int max_tokens) {
    const model_desc *m = &e->m;
    const size_t T = (size_t)max_tokens, k = m->n_expert_used, P = T * k;
    const int wide = m->dim > m->expert_ffn ? m->dim : m->expert_ffn;
    int ok = 1;
    e->mlogits = xalloc(sizeof(float) * T * m->n_expert, &ok);
    e->mn_active = xalloc(sizeof(int) * m->n_layers, &ok);
    e->msel = xalloc(sizeof(int) * P, &ok);
    e->mpair_of = xalloc(sizeof(int) * P, &ok);
    e->mw = xalloc(sizeof(float) * P, &ok);
    e->mshg = xalloc(sizeof(float) * T, &ok);
    e->moff = xalloc(sizeof(int) * (m->n_expert + 1), &ok);
    e->mactive = xalloc(sizeof(int) * m->n_expert, &ok);
    e->mpair_row = xalloc(sizeof(int) * P, &ok);
    e->mx = xalloc(sizeof(float) * P * m->dim, &ok);
    e->mqs = xalloc(P * wide, &ok);
    e->md = xalloc(sizeof(float) * P * (wide / QK + 1), &ok);
    e->ms = xalloc(sizeof(float) * P * (wide / QK + 1), &ok);
    e->mgate = xalloc(sizeof(float) * P * m->expert_ffn, &ok);
    e->mup = xalloc(sizeof(float) * P * m->expert_ffn, &ok);
    e->mout = xalloc(sizeof(float) * P * m->dim, &ok);
    return ok;
}

/* The gathered pairs of expert x from the MoE buffers, rows of k elements (gate/up input:
 * k = dim, float rows mx; down input: k = expert_ffn, float rows mgate). */
static act_rows pair_rows(const engine *e, const float *f, int x, int k) {
    const size_t j = (size_t)e->moff[x];
    act_rows a = {f + j * k, e->mqs + j * k, e->md + j * (k / QK), e->ms + j * (k / QK), k};
    return a;
}

/* Output rows per expert matmul unit: a multiple of ROW_GROUP, about CHUNKS_PER_THREAD units
 * per thread over the active experts' matrices. */
static int expert_chunk(int n_active, int n_out, int per_expert, int nth) {
    int chunk = (n_out * per_expert * n_active / (nth * CHUNKS_PER_THREAD) + ROW_GROUP - 1) / ROW_GROUP * ROW_GROUP;
    return chunk < MIN_GEMM_CHUNK ? MIN_GEMM_CHUNK : chunk;
}

/* The MoE FFN block of layer l (qwen3moe, qwen2moe): 9 phases from p on, in the dense FFN's
 * 5 and MOE_EXTRA_PHASES more:
 *
 *   norm+quantize (rows) | router matmul (n_expert outputs) | route: softmax, top-k, weights,
 *   shared-expert gate (rows) | group the (row, rank) pairs by expert (one unit) | gather each
 *   pair's input row (pairs) | gate, up: active expert x output chunk over its pairs, and the
 *   shared expert's over all rows | silu(gate) * up + quantize (pairs, rows) | down (as gate/up)
 *   | x += sum over ranks in rank order of w * expert out (+ sigmoid gate * shared out) (rows)
 *
 * An expert nobody chose is never read; each chosen one streams once per step for all its rows.
 * A row's numbers depend on its own routing only: the matmul kernels are row-independent
 * (kernels.h NOTE) wherever a pair lands, and the sum runs in rank order. */
int moe_block(engine *e, const layer_weights *L, int l, int p, int nth) {
    const model_desc *m = &e->m;
    const kernel_table *kt = e->kt;
    const int T = e->n_rows, dim = m->dim, E = m->n_expert, k = m->n_expert_used, F = m->expert_ffn;
    const int nu = n_row_units(T), P = T * k, npu = n_row_units(P), shexp = L->shexp_gate != NULL || m->shexp_ungated;
    const float rs = m->residual_scale; /* granite: the block's output scaled (x 1 is exact elsewhere) */
    const weight_t *ex = e->experts + (size_t)l * 3 * E; /* gate [E], up [E], down [E] */
    const int q_in = is_block_type(ex[0].type) || is_block_type(ex[E].type); /* the experts read quantized rows */
    const int q_act = is_block_type(ex[2 * E].type);
    norm_phase(e, p++, L->ffn_norm,
               q_in || is_block_type(L->moe_router.type) ||
                   (shexp && (is_block_type(L->ffn_gate.type) || is_block_type(L->ffn_up.type))),
               mixer_leaves_proj(e, L));
    {
        mm_job job = {&L->moe_router, e->mlogits, E, 0};
        act_rows in = input_view(e, e->xb, dim);
        matmul_phase(e, p++, &job, 1, &in, T, nth);
    }
    FOR_EACH_UNIT(e, p, nu, u) {
        int r0, r1;
        unit_rows(u, T, &r0, &r1);
        for (int r = r0; r < r1; r++) {
            moe_route(e->mlogits + (size_t)r * E, E, k, m->expert_norm, e->msel + (size_t)r * k, e->mw + (size_t)r * k);
            if (L->shexp_gate) {
                const float *h = e->xb + (size_t)r * dim;
                float g = 0.0f;
                for (int i = 0; i < dim; i++) g += L->shexp_gate[i] * h[i];
                e->mshg[r] = 1.0f / (1.0f + expf(-g));
            }
        }
    }
    phase_end(e, p++, nu);
    FOR_EACH_UNIT(e, p, 1, u) e->mn_active[l] = moe_group(e->msel, T, k, E, e->moff, e->mpair_row, e->mpair_of, e->mactive);
    phase_end(e, p++, 1);
    FOR_EACH_UNIT(e, p, npu, u) { /* gather: pair j gets row pair_row[j]'s normed input */
        int j0, j1;
        unit_rows(u, P, &j0, &j1);
        for (int j = j0; j < j1; j++) {
            const size_t r = (size_t)e->mpair_row[j], nb = dim / QK;
            memcpy(e->mx + (size_t)j * dim, e->xb + r * dim, sizeof(float) * dim);
            if (!q_in) continue;
            memcpy(e->mqs + (size_t)j * dim, e->aqs + r * dim, dim);
            memcpy(e->md + (size_t)j * nb, e->ad + r * nb, sizeof(float) * nb);
            memcpy(e->ms + (size_t)j * nb, e->as + r * nb, sizeof(float) * nb);
        }
    }
    phase_end(e, p++, npu);
    /* gate, up: (active expert, gate|up, chunk) units, then the shared expert's */
    mm_job sh_gu[2] = {{&L->ffn_gate, e->gate, m->ffn_dim, 0}, {&L->ffn_up, e->up, m->ffn_dim, 0}};
    const int na = e->mn_active[l], ch_gu = expert_chunk(na, F, 2, nth), nc_gu = (F + ch_gu - 1) / ch_gu;
    const int sh_chunk = shexp ? gemm_chunk(sh_gu, 2, nth, T) : 1, n_sh_gu = shexp ? mm_units(sh_gu, 2, sh_chunk) : 0;
    FOR_EACH_UNIT(e, p, na * 2 * nc_gu + n_sh_gu, u) {
        if (u >= na * 2 * nc_gu) {
            act_rows in = input_view(e, e->xb, dim);
            mm_unit(e, sh_gu, 2, sh_chunk, u - na * 2 * nc_gu, &in, T);
            continue;
        }
        const int x = e->mactive[u / (2 * nc_gu)], up = u / nc_gu % 2, c = u % nc_gu;
        const weight_t *w = &ex[up * E + x];
        float *y = (up ? e->mup : e->mgate) + (size_t)e->moff[x] * F;
        act_rows in = pair_rows(e, e->mx, x, dim);
        const int o0 = c * ch_gu, o1 = o0 + ch_gu < F ? o0 + ch_gu : F;
        kt->gemm[w->type](y, F, w, o0, o1, &in, e->moff[x + 1] - e->moff[x], 0);
    }
    phase_end(e, p++, na * 2 * nc_gu + n_sh_gu);
    /* act: the pairs' silu(gate) * up (quantized over mqs), then the shared expert's rows */
    const int n_act = npu + (shexp ? nu : 0);
    FOR_EACH_UNIT(e, p, n_act, u) {
        int r0, r1;
        if (u < npu) {
            unit_rows(u, P, &r0, &r1);
            for (int j = r0; j < r1; j++) {
                float *g = e->mgate + (size_t)j * F;
                kt->silu_mul(g, g, e->mup + (size_t)j * F, F);
                if (q_act)
                    kt->quantize_q8a(e->mqs + (size_t)j * F, e->md + (size_t)j * (F / QK), e->ms + (size_t)j * (F / QK), g, F);
            }
            continue;
        }
        unit_rows(u - npu, T, &r0, &r1);
        for (int r = r0; r < r1; r++) {
            float *g = e->gate + (size_t)r * m->ffn_dim;
            kt->silu_mul(g, g, e->up + (size_t)r * m->ffn_dim, m->ffn_dim);
            if (is_block_type(L->ffn_down.type)) quantize_row(e, e->gate, m->ffn_dim, r);
        }
    }
    phase_end(e, p++, n_act);
    /* down: (active expert, chunk) units into each pair's output row, then the shared expert's */
    mm_job sh_d = {&L->ffn_down, e->proj, dim, 0};
    const int ch_d = expert_chunk(na, dim, 1, nth), nc_d = (dim + ch_d - 1) / ch_d;
    const int shd_chunk = shexp ? gemm_chunk(&sh_d, 1, nth, T) : 1, n_sh_d = shexp ? mm_units(&sh_d, 1, shd_chunk) : 0;
    FOR_EACH_UNIT(e, p, na * nc_d + n_sh_d, u) {
        if (u >= na * nc_d) {
            act_rows in = input_view(e, e->gate, m->ffn_dim);
            mm_unit(e, &sh_d, 1, shd_chunk, u - na * nc_d, &in, T);
            continue;
        }
        const int x = e->mactive[u / nc_d], c = u % nc_d;
        const weight_t *w = &ex[2 * E + x];
        act_rows in = pair_rows(e, e->mgate, x, F);
        const int o0 = c * ch_d, o1 = o0 + ch_d < dim ? o0 + ch_d : dim;
        kt->gemm[w->type](e->mout + (size_t)e->moff[x] * dim, dim, w, o0, o1, &in, e->moff[x + 1] - e->moff[x], 0);
    }
    phase_end(e, p++, na * nc_d + n_sh_d);
    FOR_EACH_UNIT(e, p, nu, u) { /* the weighted sum in rank order, into the residual stream */
        int r0, r1;
        unit_rows(u, T, &r0, &r1);
        for (int r = r0; r < r1; r++) {
            float *xr = e->x + (size_t)r * dim;
            const float *w = e->mw + (size_t)r * k;
            const int *pj = e->mpair_of + (size_t)r * k;
            for (int i = 0; i < dim; i++) {
                float acc = w[0] * e->mout[(size_t)pj[0] * dim + i];
                for (int j = 1; j < k; j++) acc += w[j] * e->mout[(size_t)pj[j] * dim + i];
                if (L->shexp_gate) acc += e->mshg[r] * e->proj[(size_t)r * dim + i];
                else if (shexp) acc += e->proj[(size_t)r * dim + i];
                xr[i] += acc * rs;
            }
        }
    }
    phase_end(e, p++, nu);
    return p;
}
