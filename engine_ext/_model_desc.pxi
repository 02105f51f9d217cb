# Included by _engine.pyx: a ModelFile -> the C model description (engine.h model_desc,
# layer_weights). Weights are borrowed from the file's memory map, never copied here.


cdef weight_t _weight(object ref) except *:
    cdef const uint8_t[::1] raw = ref.data
    cdef weight_t w
    w.type = ref.ggml_type
    w.n_in = ref.shape[0]
    w.n_out = ref.shape[1] if len(ref.shape) > 1 else 1
    w.rows = &raw[0]
    w.x8 = NULL
    if len(ref.shape) < 3 and <size_t>raw.shape[0] != ggml_row_bytes(w.type, w.n_in) * <size_t>w.n_out:
        raise ValueError(f"tensor {ref.name!r}: {raw.shape[0]} bytes do not match its shape {ref.shape}")
    return w


cdef weight_t _experts(object ref) except *:
    """A 3-D expert tensor (n_in, per expert, n_expert) as one weight of per * n_expert rows."""
    cdef weight_t w = _weight(ref)
    w.n_out = ref.shape[1] * ref.shape[2]
    cdef const uint8_t[::1] raw = ref.data
    if <size_t>raw.shape[0] != ggml_row_bytes(w.type, w.n_in) * <size_t>w.n_out:
        raise ValueError(f"tensor {ref.name!r}: {raw.shape[0]} bytes do not match its shape {ref.shape}")
    return w


cdef const float *_f32(object ref, int n) except NULL:
    cdef const uint8_t[::1] raw = ref.data
    if ref.ggml_type != GGML_TYPE_F32 or raw.shape[0] != 4 * n:
        raise ValueError(f"tensor {ref.name!r}: expected {n} F32 values")
    return <const float *>&raw[0]


cdef const float *_f32_opt(dict tensors, str name, int n) except? NULL:
    """An optional F32 vector: NULL when the model has no such tensor."""
    if name not in tensors:
        return NULL
    return _f32(tensors[name], n)


cdef int _describe(object model_file, model_desc *m, layer_weights *layers) except -1:
    """Fill `m` and `layers` (n_layers of them, zeroed: the weights a layer's kind lacks stay
    empty, NULL rows) from a ModelFile, weights borrowed from its memory map (which must outlive
    the engine). Raises ValueError on a tensor of the wrong size or type."""
    cfg = model_file.config
    m.n_layers = cfg.n_layers
    m.dim = cfg.dim
    m.n_heads = cfg.n_heads
    m.n_kv_heads = cfg.n_kv_heads
    m.head_dim = cfg.head_dim
    m.ffn_dim = cfg.ffn_dim
    m.n_vocab = cfg.n_vocab
    m.rope_mode = int(cfg.rope_mode)
    m.activation = int(cfg.activation)
    m.rms_eps = cfg.rms_eps
    m.embed_scale = cfg.embed_scale
    m.attn_scale = cfg.attn_scale
    t = model_file.tensors
    m.rope_freqs = _f32_opt(t, "rope_freqs.weight", cfg.head_dim // 2)
    m.token_embd = _weight(t["token_embd.weight"])
    m.output = _weight(t["token_embd.weight" if cfg.tied_output else "output.weight"])
    m.output_norm = _f32(t[cfg.output_norm_name], cfg.dim)
    m.conv_len = cfg.conv_len
    m.rope_dim = cfg.rope_dim
    m.q_gate = cfg.q_gate
    ssm = cfg.ssm
    m.ssm_taps = ssm.conv if ssm is not None else 0
    m.ssm_d = ssm.d_state if ssm is not None else 0
    m.ssm_k_heads = ssm.k_heads if ssm is not None else 0
    m.ssm_v_heads = ssm.v_heads if ssm is not None else 0
    moe = cfg.moe
    m.n_expert = moe.n_expert if moe is not None else 0
    m.n_expert_used = moe.n_expert_used if moe is not None else 0
    m.expert_ffn = moe.expert_ffn if moe is not None else 0
    m.expert_norm = moe.norm_weights if moe is not None else 0
    m.qk_norm_full = cfg.qk_norm_full
    mb = cfg.mamba
    m.mamba_taps = mb.conv if mb is not None else 0
    m.mamba_state = mb.d_state if mb is not None else 0
    m.mamba_groups = mb.n_group if mb is not None else 0
    m.mamba_heads = mb.n_heads if mb is not None else 0
    m.mamba_inner = mb.inner if mb is not None else 0
    m.residual_scale = cfg.residual_scale
    m.logit_scale = cfg.logit_scale
    m.no_rope = not cfg.rope
    m.shexp_ungated = moe is not None and moe.shared_ffn > 0 and not moe.shared_gate
    m.release_rows = bool(getattr(model_file, "read_only_map", False))
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        layers[i].attn_norm = _f32(t[p + "attn_norm.weight"], cfg.dim)
        layers[i].ffn_norm = _f32(t[p + cfg.ffn_norm_name + ".weight"], cfg.dim)
        if moe is None:
            layers[i].ffn_gate = _weight(t[p + "ffn_gate.weight"])
            layers[i].ffn_up = _weight(t[p + "ffn_up.weight"])
            layers[i].ffn_down = _weight(t[p + "ffn_down.weight"])
        else:  # experts (moe.c), and qwen2moe's shared expert in the dense FFN's place
            layers[i].moe_router = _weight(t[p + "ffn_gate_inp.weight"])
            layers[i].moe_gate = _experts(t[p + "ffn_gate_exps.weight"])
            layers[i].moe_up = _experts(t[p + "ffn_up_exps.weight"])
            layers[i].moe_down = _experts(t[p + "ffn_down_exps.weight"])
            if moe.shared_ffn:
                if moe.shared_gate:
                    layers[i].shexp_gate = _f32(t[p + "ffn_gate_inp_shexp.weight"], cfg.dim)
                layers[i].ffn_gate = _weight(t[p + "ffn_gate_shexp.weight"])
                layers[i].ffn_up = _weight(t[p + "ffn_up_shexp.weight"])
                layers[i].ffn_down = _weight(t[p + "ffn_down_shexp.weight"])
        layers[i].rope_base = cfg.layer_rope_bases[i]
        layers[i].window = cfg.layer_windows[i]
        if cfg.conv_layers[i]:  # lfm2: a short-convolution block instead of attention
            layers[i].conv_in = _weight(t[p + "shortconv.in_proj.weight"])
            layers[i].conv_out = _weight(t[p + "shortconv.out_proj.weight"])
            layers[i].conv_w = _f32(t[p + "shortconv.conv.weight"], cfg.dim * cfg.conv_len)
            continue
        if cfg.recurrent_layers[i] and mb is not None:  # granitehybrid: a Mamba2 block
            layers[i].mamba_in = _weight(t[p + "ssm_in.weight"])
            layers[i].mamba_out = _weight(t[p + "ssm_out.weight"])
            layers[i].mamba_conv = _f32(t[p + "ssm_conv1d.weight"], mb.conv_dim * mb.conv)
            layers[i].mamba_conv_b = _f32(t[p + "ssm_conv1d.bias"], mb.conv_dim)
            layers[i].mamba_dt = _f32(t[p + "ssm_dt.bias"], mb.n_heads)
            layers[i].mamba_a = _f32(t[p + "ssm_a"], mb.n_heads)
            layers[i].mamba_d = _f32(t[p + "ssm_d"], mb.n_heads)
            layers[i].mamba_norm = _f32(t[p + "ssm_norm.weight"], mb.inner)
            continue
        if cfg.recurrent_layers[i]:  # qwen35: a Gated DeltaNet block instead of attention
            layers[i].ssm_qkv = _weight(t[p + "attn_qkv.weight"])
            layers[i].ssm_z = _weight(t[p + "attn_gate.weight"])
            layers[i].ssm_beta = _weight(t[p + "ssm_beta.weight"])
            layers[i].ssm_alpha = _weight(t[p + "ssm_alpha.weight"])
            layers[i].ssm_out = _weight(t[p + "ssm_out.weight"])
            layers[i].ssm_conv = _f32(t[p + "ssm_conv1d.weight"], ssm.conv_dim * ssm.conv)
            layers[i].ssm_dt = _f32(t[p + "ssm_dt.bias"], ssm.v_heads)
            layers[i].ssm_a = _f32(t[p + "ssm_a"], ssm.v_heads)
            layers[i].ssm_norm = _f32(t[p + "ssm_norm.weight"], ssm.d_state)
            continue
        layers[i].attn_q = _weight(t[p + "attn_q.weight"])
        layers[i].attn_k = _weight(t[p + "attn_k.weight"])
        layers[i].attn_v = _weight(t[p + "attn_v.weight"])
        layers[i].bq = _f32_opt(t, p + "attn_q.bias", cfg.n_heads * cfg.head_dim)
        layers[i].bk = _f32_opt(t, p + "attn_k.bias", cfg.n_kv_heads * cfg.head_dim)
        layers[i].bv = _f32_opt(t, p + "attn_v.bias", cfg.n_kv_heads * cfg.head_dim)
        qn, kn = (cfg.n_heads, cfg.n_kv_heads) if cfg.qk_norm_full else (1, 1)
        layers[i].q_norm = _f32_opt(t, p + "attn_q_norm.weight", qn * cfg.head_dim)
        layers[i].k_norm = _f32_opt(t, p + "attn_k_norm.weight", kn * cfg.head_dim)
        layers[i].attn_output = _weight(t[p + "attn_output.weight"])
        if cfg.post_norms:
            layers[i].post_attn_norm = _f32(t[p + "post_attention_norm.weight"], cfg.dim)
        layers[i].post_ffn_norm = _f32_opt(t, p + "post_ffw_norm.weight", cfg.dim)
    m.layers = layers
    return 0
