/* Which model descriptions the engine accepts (model_ok): the dimensions, modes and scales, and
 * every layer's weights against them per layer kind (attention, short convolution, DeltaNet,
 * Mamba2; a dense or mixture-of-experts FFN). engine_create refuses the rest (ENGINE_EINVAL);
 * the Python layer validates first, with messages (engine_ext/model_config.py).
 */
#include "engine_internal.h"

static int weight_ok(const weight_t *w, int n_in, int n_out) {
    if (!w->rows || w->n_in != n_in || w->n_out != n_out) return 0;
    if (ggml_row_bytes(w->type, n_in) == 0) return 0;
    if (n_in > MAX_ROW_LEN) return 0;
    /* block types: whole blocks (K-quants: super-blocks of 256) */
    if (is_block_type(w->type) && n_in % ggml_block_elems(w->type) != 0) return 0;
    return 1;
}

/* The FFN of a layer: dense (ffn_*), or experts (+ the shared expert in ffn_* when shexp_gate, or
 * ungated with model_desc.shexp_ungated). */
static int ffn_ok(const model_desc *m, const layer_weights *L) {
    const int dense = weight_ok(&L->ffn_gate, m->dim, m->ffn_dim) && weight_ok(&L->ffn_up, m->dim, m->ffn_dim) &&
                      weight_ok(&L->ffn_down, m->ffn_dim, m->dim);
    if (!is_moe_layer(L)) return dense;
    const int E = m->n_expert, F = m->expert_ffn;
    if (E < 1 || m->n_expert_used < 1 || m->n_expert_used > E || F < 1 || F > MAX_ROW_LEN) return 0;
    if (!weight_ok(&L->moe_router, m->dim, E) || !weight_ok(&L->moe_gate, m->dim, E * F) ||
        !weight_ok(&L->moe_up, m->dim, E * F) || !weight_ok(&L->moe_down, F, E * m->dim))
        return 0;
    return L->shexp_gate || m->shexp_ungated ? dense : !L->ffn_gate.rows && !L->ffn_up.rows && !L->ffn_down.rows;
}

/* A DeltaNet layer's weights against the model's dimensions. */
static int delta_layer_ok(const model_desc *m, const layer_weights *L) {
    const int d = m->ssm_d, vd = m->ssm_v_heads * d, cd = 2 * m->ssm_k_heads * d + vd;
    return m->ssm_taps >= 2 && m->ssm_taps <= MAX_SSM_TAPS && d >= 1 && m->ssm_k_heads >= 1 &&
           m->ssm_v_heads % m->ssm_k_heads == 0 && L->attn_norm && L->ffn_norm && !L->attn_q.rows &&
           !L->attn_output.rows && L->ssm_conv && L->ssm_dt && L->ssm_a && L->ssm_norm && cd <= MAX_ROW_LEN &&
           weight_ok(&L->ssm_qkv, m->dim, cd) && weight_ok(&L->ssm_z, m->dim, vd) &&
           weight_ok(&L->ssm_beta, m->dim, m->ssm_v_heads) && weight_ok(&L->ssm_alpha, m->dim, m->ssm_v_heads) &&
           weight_ok(&L->ssm_out, vd, m->dim) && ffn_ok(m, L);
}

/* A Mamba2 layer's weights against the model's dimensions. */
static int mamba_layer_ok(const model_desc *m, const layer_weights *L) {
    const int inner = m->mamba_inner, H = m->mamba_heads, G = m->mamba_groups, N = m->mamba_state;
    if (m->mamba_taps < 2 || m->mamba_taps > MAX_SSM_TAPS || H < 1 || G < 1 || N < 1 || inner % H || H % G ||
        inner > MAX_ROW_LEN || inner + 2 * G * N > MAX_ROW_LEN)
        return 0;
    return L->attn_norm && L->ffn_norm && !L->attn_q.rows && !L->attn_output.rows && !L->ssm_qkv.rows && L->mamba_conv &&
           L->mamba_conv_b && L->mamba_dt && L->mamba_a && L->mamba_d && L->mamba_norm &&
           weight_ok(&L->mamba_in, m->dim, 2 * inner + 2 * G * N + H) && weight_ok(&L->mamba_out, inner, m->dim) &&
           ffn_ok(m, L);
}

int model_ok(const model_desc *m) {
    if (m->n_layers < 1 || m->dim < 1 || m->n_heads < 1 || m->n_kv_heads < 1 || m->head_dim < 2 ||
        m->head_dim % 2 || m->n_heads % m->n_kv_heads || m->ffn_dim < 1 || m->n_vocab < 1 ||
        !m->layers || !m->output_norm || m->head_dim > MAX_ROW_LEN || m->dim > MAX_ROW_LEN)
        return 0;
    if ((m->rope_mode != ROPE_NORMAL && m->rope_mode != ROPE_NEOX) ||
        (m->activation != ACT_SILU && m->activation != ACT_GELU_TANH) || !(m->embed_scale > 0.0f) ||
        !(m->attn_scale > 0.0f) || !(m->rms_eps >= 0.0f) || !(m->residual_scale > 0.0f) || !(m->logit_scale >= 0.0f))
        return 0;
    if (m->mamba_heads && m->ssm_v_heads) return 0; /* one kind of recurrent layer a model */
    if (m->n_heads / m->n_kv_heads > ATTN_MAX_ROWS) return 0;
    if (m->rope_dim < 0 || m->rope_dim > m->head_dim || m->rope_dim % 2 || (m->rope_dim && m->rope_dim < m->head_dim && m->rope_mode != ROPE_NEOX))
        return 0;
    int q_dim = m->n_heads * m->head_dim, kv_dim = m->n_kv_heads * m->head_dim;
    if (!m->token_embd.rows || m->token_embd.n_in != m->dim || m->token_embd.n_out != m->n_vocab ||
        ggml_row_bytes(m->token_embd.type, m->dim) == 0 ||
        (is_block_type(m->token_embd.type) && m->dim % ggml_block_elems(m->token_embd.type) != 0) ||
        !weight_ok(&m->output, m->dim, m->n_vocab))
        return 0;
    if (m->conv_len < 0 || m->conv_len == 1 || m->conv_len > MAX_CONV_LEN) return 0;
    for (int l = 0; l < m->n_layers; l++) {
        const layer_weights *L = &m->layers[l];
        if (is_conv_layer(L)) {
            if (!m->conv_len || !L->conv_w || !L->attn_norm || !L->ffn_norm || L->attn_q.rows || L->attn_output.rows ||
                !weight_ok(&L->conv_in, m->dim, 3 * m->dim) || !weight_ok(&L->conv_out, m->dim, m->dim) ||
                !ffn_ok(m, L))
                return 0;
            continue;
        }
        if (is_delta_layer(L)) {
            if (!delta_layer_ok(m, L)) return 0;
            continue;
        }
        if (is_mamba_layer(L)) {
            if (!m->mamba_heads || !mamba_layer_ok(m, L)) return 0;
            continue;
        }
        if (!L->attn_norm || !L->ffn_norm || !weight_ok(&L->attn_q, m->dim, m->q_gate ? 2 * q_dim : q_dim) ||
            !weight_ok(&L->attn_k, m->dim, kv_dim) || !weight_ok(&L->attn_v, m->dim, kv_dim) ||
            !weight_ok(&L->attn_output, q_dim, m->dim) || !ffn_ok(m, L) ||
            !(L->rope_base > 0.0) || L->window < 0 || (!L->q_norm != !L->k_norm))
            return 0;
    }
    return 1;
}
