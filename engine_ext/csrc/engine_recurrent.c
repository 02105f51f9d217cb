/* The recurrent layers, Gated DeltaNet (qwen35) and Mamba2 (granitehybrid): their states,
 * kernels and step buffers (delta_create), which state entry a token reads and writes, and
 * their blocks in the attention block's phases (engine.c). Reading, writing and copying a
 * slot's states: engine_kv.c.
 *
 * Gated DeltaNet layers (qwen35) keep no rows at all but a recurrent state per slot, in its own
 * block (engine_state_*: conv tail [taps-1][conv_dim] and head matrices [v_heads][d][d], f32),
 * and walk the attention block's phases as: norm | qkv, z, beta, alpha matmuls | conv (segment x
 * channel block: each channel's tokens in position order through the tail; the first block's
 * unit also turns each row's alpha and beta into the decay and beta, gdn_gates) | delta rule
 * (segment x value head: each token in position order: l2-normed q, k, the gated update of the
 * head's matrix, its output rmsnormed and gated by silu(z); runs of tokens through gdn_steps,
 * which takes each block of the matrix's rows through all of them while it sits in L1: rows are
 * independent, so each still sees its tokens in order) | - | quantize | out matmul | -.
 * Every row's numbers come from the same operations on the same state in the same order, however
 * the tokens were cut into steps or batched, and whichever thread runs a unit. A segment that
 * starts at position 0 starts from a zero state. With a rollback ring of k, a slot's k + 1
 * states rotate (engine.h): a token reads the state of its length and writes the next length's
 * into another entry, so the last k + 1 states stay without a copy (a copy aside of each state
 * the token leaves read and wrote it again: 19.3 MiB a decode token on Qwen3.5-0.8B).
 *
 * Mamba2 layers (granitehybrid) keep their state in the same block and ring (conv tail
 * [taps-1][inner + 2 groups state], head states [heads][inner / heads][state], f32) and walk the
 * attention block's phases as: norm | in_proj matmul (z | x B C | dt) | conv (segment x channel
 * block over x, B, C: each channel's tokens in position order through the tail, + bias, silu;
 * the first block's unit also turns each row's dt into its step and decay, mamba2_gates) | scan
 * (segment x head: each token in position order through the head's state, mamba2_scan, then
 * + D x and * silu(z)) | grouped rmsnorm + quantize (rows) | - | out matmul | -.
 */
#include <math.h>
#include <string.h>

#include "engine_internal.h"

/* The recurrent layers' state blocks, tap-major kernels and step buffers (DeltaNet or Mamba2:
 * one kind a model; see top). */
int delta_create(engine *e, const model_desc *m, int max_tokens, int n_threads, int rollback) {
    int ok = 1;
    const int mamba = m->mamba_heads > 0, taps_n = mamba ? m->mamba_taps : m->ssm_taps;
    const size_t T = (size_t)max_tokens,
                 per_layer = (size_t)(taps_n - 1) * e->conv_dim +
                             (mamba ? (size_t)m->mamba_inner * m->mamba_state : (size_t)m->ssm_v_heads * m->ssm_d * m->ssm_d);
    const int heads = mamba ? m->mamba_heads : m->ssm_v_heads;
    /* the input matmul's row: DeltaNet's qkv (the conv's channels), Mamba2's z | xBC | dt */
    e->in_dim = mamba ? 2 * m->mamba_inner + 2 * m->mamba_groups * m->mamba_state + heads : e->conv_dim;
    e->rs_off = xalloc(sizeof(size_t) * m->n_layers, &ok);
    e->ssm_taps = xalloc(sizeof(float) * m->n_layers * taps_n * e->conv_dim, &ok);
    if (!ok) return 0;
    for (int l = 0; l < m->n_layers; l++) {
        const layer_weights *L = &m->layers[l];
        if (!is_state_layer(L)) continue;
        e->rs_off[l] = e->rs_floats;
        e->rs_floats += per_layer;
        float *taps = e->ssm_taps + (size_t)l * taps_n * e->conv_dim;
        const float *w = mamba ? L->mamba_conv : L->ssm_conv;
        for (int c = 0; c < e->conv_dim; c++)
            for (int j = 0; j < taps_n; j++) taps[(size_t)j * e->conv_dim + c] = w[(size_t)c * taps_n + j];
    }
    e->rollback = rollback;
    /* populated like KV: committed at start-up, and a fresh slot's first forward does not
     * fault in its ring (k x the state, 174 MiB per slot on Qwen3.5-0.8B at k = 9) */
    e->rstate = big_alloc(sizeof(float) * e->rs_floats * e->num_slots * (rollback + 1), 1);
    if (!e->rstate) return 0;
    e->ones = xalloc(sizeof(float) * CONV_BLOCK, &ok);
    for (int i = 0; ok && i < CONV_BLOCK; i++) e->ones[i] = 1.0f;
    e->sqkv = xalloc(sizeof(float) * T * e->in_dim, &ok);
    e->sconv = xalloc(sizeof(float) * T * e->conv_dim, &ok);
    e->sz = xalloc(sizeof(float) * T * (mamba ? 1 : e->value_dim), &ok);
    e->sb = xalloc(sizeof(float) * T * heads, &ok);
    e->sa = xalloc(sizeof(float) * T * heads, &ok);
    e->ssm_scratch = xalloc(sizeof(float) * 2 * GDN_TOKENS * m->ssm_d * n_threads, &ok);
    return ok;
}

/* The state entries token j of segment sg reads and writes (engine.h): the one of its length and
 * the one of the next, except that a length before the segment's last rollback + 1 is held in
 * the entry the segment started from (updated in place: a long prefill writes only the entries
 * of the lengths it keeps). */
static inline void state_entries(const engine *e, const step_seg *sg, int j, int *from, int *to) {
    const int k1 = e->rollback + 1, pos = sg->pos0 + j, keep = sg->pos0 + sg->n - e->rollback;
    *from = pos < keep ? sg->pos0 % k1 : pos % k1;
    *to = pos + 1 < keep ? sg->pos0 % k1 : (pos + 1) % k1;
}

/* Row r's gates, by the first channel block's unit of the conv phase: DeltaNet's alpha -> the
 * decay exp(g) and beta -> sigmoid(beta) (gdn_gates), Mamba2's dt (after z | x B C in the input
 * row) -> its step and decay (mamba2_gates). */
static inline void row_gates(engine *e, const layer_weights *L, int r, const float *row) {
    const model_desc *m = &e->m;
    if (m->mamba_heads > 0) {
        const int H = m->mamba_heads;
        memcpy(e->sa + (size_t)r * H, row + m->mamba_inner + e->conv_dim, sizeof(float) * H);
        mamba2_gates(e->sa + (size_t)r * H, e->sb + (size_t)r * H, L->mamba_dt, L->mamba_a, H);
    } else {
        const int vh = m->ssm_v_heads;
        e->kt->gdn_gates(e->sa + (size_t)r * vh, e->sb + (size_t)r * vh, L->ssm_dt, L->ssm_a, vh);
    }
}

/* The conv phase p of recurrent layer l (DeltaNet or Mamba2, see top): segment x channel block,
 * each channel's tokens in position order through the slot's conv tail (taps), + bias (NULL:
 * none), silu, into e->sconv; row r's conv input starts at e->sqkv + r * ld + in_off, and the
 * first block's unit also takes the row's gates (row_gates). */
static void conv_phase(engine *e, const layer_weights *L, int l, int p, int taps, int ld, int in_off, const float *bias) {
    const kernel_table *kt = e->kt;
    const int cd = e->conv_dim, n_cb = (cd + CONV_BLOCK - 1) / CONV_BLOCK;
    const float *w = e->ssm_taps + (size_t)l * taps * cd;
    FOR_EACH_UNIT(e, p, e->n_segs * n_cb, u) {
        const step_seg *sg = &e->segs[u / n_cb];
        const int c0 = (u % n_cb) * CONV_BLOCK, n = cd - c0 < CONV_BLOCK ? cd - c0 : CONV_BLOCK;
        for (int j = 0; j < sg->n; j++) {
            const int r = sg->row0 + j;
            int from, to;
            state_entries(e, sg, j, &from, &to);
            const float *row = e->sqkv + (size_t)r * ld;
            if (c0 == 0) row_gates(e, L, r, row);
            const size_t off = e->rs_off[l] + c0;
            float *out = e->sconv + (size_t)r * cd + c0;
            kt->ssm_conv(out, state_of(e, sg->slot, to) + off, state_of(e, sg->slot, from) + off, row + in_off + c0, w + c0,
                         taps, n, cd);
            if (bias)
                for (int c = 0; c < n; c++) out[c] += bias[c0 + c];
            kt->silu_mul(out, out, e->ones, n);
        }
    }
    phase_end(e, p, e->n_segs * n_cb);
}

/* A Gated DeltaNet block (qwen35) in the attention block's phases from p on (see top). Returns the
 * next phase, or -1 when the test hook fired (before any state changed). */
int delta_block(engine *e, const layer_weights *L, int l, int p, int ith, int nth) {
    const model_desc *m = &e->m;
    const kernel_table *kt = e->kt;
    const int T = e->n_rows, dim = m->dim, nu = n_row_units(T), d = m->ssm_d, vh = m->ssm_v_heads, cd = e->conv_dim;
    const int taps = m->ssm_taps;
    norm_phase(e, p++, L->attn_norm,
               is_block_type(L->ssm_qkv.type) || is_block_type(L->ssm_z.type) || is_block_type(L->ssm_beta.type) ||
                   is_block_type(L->ssm_alpha.type),
               proj_before_layer(e, l));
    {
        mm_job jobs[4] = {{&L->ssm_qkv, e->sqkv, cd, 0},
                          {&L->ssm_z, e->sz, e->value_dim, 0},
                          {&L->ssm_beta, e->sb, vh, 0},
                          {&L->ssm_alpha, e->sa, vh, 0}};
        act_rows in = input_view(e, e->xb, dim);
        matmul_phase(e, p++, jobs, 4, &in, T, nth);
    }
    if (l == e->fault_layer) return -1; /* test hook: no state has changed yet */
    conv_phase(e, L, l, p++, taps, cd, 0, NULL); /* the qkv row is the conv's input */
    /* delta rule: segment x value head, tokens in position order through the head's matrix: the
     * tokens that update one state entry in place in runs of up to GDN_TOKENS (gdn_steps: the
     * numbers of token-by-token gdn_step calls), the rollback ring's last ones one at a time */
    float *qn = e->ssm_scratch + (size_t)ith * 2 * GDN_TOKENS * d, *kn = qn + (size_t)GDN_TOKENS * d;
    const float scale = 1.0f / sqrtf((float)d);
    FOR_EACH_UNIT(e, p, e->n_segs * vh, u) {
        const step_seg *sg = &e->segs[u / vh];
        const int h = u % vh, kh = h % m->ssm_k_heads; /* llama.cpp tiles the key heads */
        const size_t s_off = e->rs_off[l] + (size_t)(taps - 1) * cd + (size_t)h * d * d;
        for (int j0 = 0, j1; j0 < sg->n; j0 = j1) {
            int from, to;
            state_entries(e, sg, j0, &from, &to);
            j1 = j0 + 1; /* a run: the tokens after j0 updating the same entry in place */
            for (int f, t; from == to && j1 < sg->n && j1 - j0 < GDN_TOKENS; j1++) {
                state_entries(e, sg, j1, &f, &t);
                if (f != from || t != from) break;
            }
            const int r0 = sg->row0 + j0, n = j1 - j0;
            for (int j = 0; j < n; j++) {
                const float *c = e->sconv + (size_t)(r0 + j) * cd;
                memcpy(qn + (size_t)j * d, c + (size_t)kh * d, sizeof(float) * d);
                memcpy(kn + (size_t)j * d, c + e->key_dim + (size_t)kh * d, sizeof(float) * d);
                kt->l2norm(qn + (size_t)j * d, d, m->rms_eps);
                kt->l2norm(kn + (size_t)j * d, d, m->rms_eps);
            }
            float *o = e->xb + (size_t)r0 * e->value_dim + (size_t)h * d;
            const float *v = e->sconv + (size_t)r0 * cd + 2 * e->key_dim + (size_t)h * d;
            const size_t g = (size_t)r0 * vh + h;
            if (n == 1) /* decode, or a token of the rollback ring's last k + 1 */
                kt->gdn_step(state_of(e, sg->slot, to) + s_off, state_of(e, sg->slot, from) + s_off, o, qn, kn, v,
                             e->sa[g], e->sb[g], scale, d);
            else
                kt->gdn_steps(state_of(e, sg->slot, from) + s_off, o, e->value_dim, qn, kn, v, cd, e->sa + g, e->sb + g,
                              vh, scale, d, n);
            for (int j = 0; j < n; j++) {
                float *oj = o + (size_t)j * e->value_dim;
                kt->rmsnorm(oj, oj, L->ssm_norm, d, m->rms_eps);
                kt->silu_mul(oj, e->sz + (size_t)(r0 + j) * e->value_dim + (size_t)h * d, oj, d);
            }
        }
    }
    phase_end(e, p++, e->n_segs * vh);
    p++; /* attention's merge phase: nothing here */
    if (is_block_type(L->ssm_out.type)) {
        FOR_EACH_UNIT(e, p, nu, u) {
            int r0, r1;
            unit_rows(u, T, &r0, &r1);
            for (int r = r0; r < r1; r++) quantize_row(e, e->xb, e->value_dim, r);
        }
        phase_end(e, p, nu);
    }
    p++;
    {
        mm_job job = {&L->ssm_out, e->x, dim, 1};
        act_rows in = input_view(e, e->xb, e->value_dim);
        matmul_phase(e, p++, &job, 1, &in, T, nth);
    }
    return p + 1; /* no post-norm */
}

/* A Mamba2 block (granitehybrid) in the attention block's phases from p on (see top). Returns the
 * next phase, or -1 when the test hook fired (before any state changed). */
int mamba_block(engine *e, const layer_weights *L, int l, int p, int nth) {
    const model_desc *m = &e->m;
    const kernel_table *kt = e->kt;
    const int T = e->n_rows, dim = m->dim, nu = n_row_units(T), H = m->mamba_heads, inner = m->mamba_inner;
    const int N = m->mamba_state, G = m->mamba_groups, P = inner / H, cd = e->conv_dim, ld = e->in_dim;
    const int taps = m->mamba_taps, gw = inner / G; /* gw: channels a group norm spans */
    norm_phase(e, p++, L->attn_norm, is_block_type(L->mamba_in.type), proj_before_layer(e, l));
    {
        mm_job job = {&L->mamba_in, e->sqkv, ld, 0};
        act_rows in = input_view(e, e->xb, dim);
        matmul_phase(e, p++, &job, 1, &in, T, nth);
    }
    if (l == e->fault_layer) return -1; /* test hook: no state has changed yet */
    conv_phase(e, L, l, p++, taps, ld, inner, L->mamba_conv_b); /* over x B C, after z */
    /* scan: segment x MAMBA_HEADS heads (their states one contiguous run: a decode step streams
     * 4 x 16 KiB a unit on granite-4.0-h-350m), each head's tokens in position order through its
     * state; y + D x, * silu(z) */
    const int n_hu = (H + MAMBA_HEADS - 1) / MAMBA_HEADS;
    FOR_EACH_UNIT(e, p, e->n_segs * n_hu, u) {
        const step_seg *sg = &e->segs[u / n_hu];
        const int h0 = (u % n_hu) * MAMBA_HEADS, h1 = h0 + MAMBA_HEADS < H ? h0 + MAMBA_HEADS : H;
        for (int h = h0; h < h1; h++) {
            const int g = h / (H / G);
            const size_t s_off = e->rs_off[l] + (size_t)(taps - 1) * cd + (size_t)h * P * N;
            for (int j = 0; j < sg->n; j++) {
                const int r = sg->row0 + j;
                int from, to;
                state_entries(e, sg, j, &from, &to);
                const float *c = e->sconv + (size_t)r * cd, *x = c + (size_t)h * P;
                float *y = e->xb + (size_t)r * inner + (size_t)h * P;
                kt->mamba2_scan(state_of(e, sg->slot, to) + s_off, state_of(e, sg->slot, from) + s_off, y, x,
                                c + inner + (size_t)g * N, c + inner + (size_t)(G + g) * N, e->sb[(size_t)r * H + h],
                                e->sa[(size_t)r * H + h], P, N);
                for (int i = 0; i < P; i++) y[i] += x[i] * L->mamba_d[h];
                kt->silu_mul(y, e->sqkv + (size_t)r * ld + (size_t)h * P, y, P);
            }
        }
    }
    phase_end(e, p++, e->n_segs * n_hu);
    /* rows (attention's merge phase): the grouped rmsnorm, quantized for out_proj */
    FOR_EACH_UNIT(e, p, nu, u) {
        int r0, r1;
        unit_rows(u, T, &r0, &r1);
        for (int r = r0; r < r1; r++) {
            float *y = e->xb + (size_t)r * inner;
            for (int gi = 0; gi < G; gi++) kt->rmsnorm(y + (size_t)gi * gw, y + (size_t)gi * gw, L->mamba_norm + (size_t)gi * gw, gw, m->rms_eps);
            if (is_block_type(L->mamba_out.type)) quantize_row(e, e->xb, inner, r);
        }
    }
    phase_end(e, p++, nu);
    p++; /* attention's quantize phase: nothing here */
    {
        const int via = output_via_proj(e, NULL);
        mm_job job = {&L->mamba_out, via ? e->proj : e->x, dim, !via};
        act_rows in = input_view(e, e->xb, inner);
        matmul_phase(e, p++, &job, 1, &in, T, nth);
    }
    block_residual_phase(e, p, NULL);
    return p + 1;
}
