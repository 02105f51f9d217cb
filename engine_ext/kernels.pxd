# Declarations of the C kernels and engine (engine_ext/csrc); no code.
from libc.stdint cimport int8_t, int32_t, uint8_t, uint16_t, uint64_t


cdef extern from "kernels.h" nogil:
    enum:
        GGML_TYPE_F32
        GGML_TYPE_F16
        GGML_TYPE_Q4_0
        GGML_TYPE_Q4_1
        GGML_TYPE_Q8_0
        GGML_TYPE_Q5_0
        GGML_TYPE_Q5_1
        GGML_TYPE_Q2_K
        GGML_TYPE_Q3_K
        GGML_TYPE_Q4_K
        GGML_TYPE_Q5_K
        GGML_TYPE_Q6_K
        GGML_TYPE_BF16
        GGML_TYPE_COUNT
        QK
        QK_K
        ATTN_MAX_ROWS
        KEY_LANES
        MAX_ROW_LEN

    ctypedef struct act_rows:
        const float *f
        const int8_t *qs
        const float *d
        const float *s
        int k

    enum:
        ROW_GROUP

    ctypedef struct gemm_weight:
        int type
        int n_in
        int n_out
        const void *rows
        const void *x8

    size_t x8_bytes(int type, int n_in, int n_out)
    void pack_x8(void *dst, const void *rows, int type, int n_in, int n_out)

    ctypedef void (*gemm_fn)(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x,
                             int n_rows, int accumulate)
    enum:
        ATTN_CHUNK

    ctypedef void (*attn_chunk_fn)(float *acc, int lda, float *ml, const float *q, int ldq, const void *k,
                                   const void *v, int kv_f16, int pos0, int n_q, int group, int head_dim,
                                   float scale, int window, int chunk, float *scratch)
    ctypedef void (*attn_fold_fn)(float *acc, int lda, float *ml, const float *pacc, int ldp, const float *pml,
                                  int n_q, int group, int head_dim)

    ctypedef struct kernel_table:
        const char *name
        void (*quantize_q8a)(int8_t *qs, float *d, float *s, const float *x, int k)
        void (*dequantize_row[GGML_TYPE_COUNT])(float *y, const void *x, int k)
        gemm_fn gemm[GGML_TYPE_COUNT]
        attn_chunk_fn attention_chunk
        attn_fold_fn attention_fold
        void (*rmsnorm)(float *out, const float *x, const float *w, int n, float eps)
        void (*rope)(float *x, int n_heads, int head_dim, const float *cos_sin)
        void (*rope_neox)(float *x, int n_heads, int head_dim, const float *cos_sin)
        void (*silu_mul)(float *out, const float *g, const float *u, int n)
        void (*gelu_tanh_mul)(float *out, const float *g, const float *u, int n)
        void (*exp)(float *y, const float *x, int n)
        void (*f32_to_f16)(uint16_t *y, const float *x, int n)
        void (*f16_to_f32)(float *y, const uint16_t *x, int n)
        void (*shortconv)(float *out, const float *gate, const void *const *rows, int rows_f16, const float *w,
                          int taps, int n)
        void (*ssm_conv)(float *out, float *tail, const float *src, const float *x, const float *w, int taps, int n,
                         int ld)
        void (*l2norm)(float *x, int n, float eps)
        void (*gdn_step)(float *S, const float *src, float *o, const float *q, const float *k, const float *v,
                         float decay, float beta, float scale, int d)
        void (*gdn_steps)(float *S, float *o, int ldo, const float *q, const float *k, const float *v, int ldv,
                          const float *decay, const float *beta, int ldg, float scale, int d, int n)
        void (*gdn_gates)(float *alpha, float *beta, const float *dt, const float *a, int n)
        void (*mamba2_scan)(float *S, const float *src, float *y, const float *x, const float *B, const float *C,
                            float dA, float dt, int p, int n)

    const kernel_table *kernels_select(const char *name)
    void mamba2_gates(float *dt, float *dA, const float *bias, const float *a, int n)
    int kernels_avx2_supported()
    int kernels_avx512vnni_supported()
    long kernel_peak_macs(const char *mix, long iters)
    uint64_t kernel_read_sum(const uint8_t *p, size_t n)
    long long gemm_tiles_avx2_pairs(int type)
    size_t ggml_row_bytes(int type, int k)
    int ggml_block_elems(int type)
    size_t attn_scratch_floats(int ctx_len, int head_dim)
    void attention_rows(const kernel_table *kt, float *out, int ldo, const float *q, int ldq, const void *k,
                        const void *v, int kv_f16, int pos0, int n_q, int group, int head_dim, float scale,
                        int window, float *scratch)


cdef extern from "engine.h" nogil:
    enum:
        ENGINE_OK
        ENGINE_ENOMEM
        ENGINE_EINVAL
        ENGINE_EFAULT
        ENGINE_EINTERNAL
        ROPE_NORMAL
        ROPE_NEOX
        ACT_SILU
        ACT_GELU_TANH

    ctypedef gemm_weight weight_t

    ctypedef struct layer_weights:
        const float *attn_norm
        weight_t attn_q
        weight_t attn_k
        weight_t attn_v
        const float *bq
        const float *bk
        const float *bv
        const float *q_norm
        const float *k_norm
        weight_t attn_output
        const float *post_attn_norm
        const float *ffn_norm
        weight_t ffn_gate
        weight_t ffn_up
        weight_t ffn_down
        const float *post_ffn_norm
        double rope_base
        int window
        weight_t conv_in
        weight_t conv_out
        const float *conv_w
        weight_t ssm_qkv
        weight_t ssm_z
        weight_t ssm_beta
        weight_t ssm_alpha
        weight_t ssm_out
        const float *ssm_conv
        const float *ssm_dt
        const float *ssm_a
        const float *ssm_norm
        weight_t mamba_in
        weight_t mamba_out
        const float *mamba_conv
        const float *mamba_conv_b
        const float *mamba_dt
        const float *mamba_a
        const float *mamba_d
        const float *mamba_norm
        weight_t moe_router
        weight_t moe_gate
        weight_t moe_up
        weight_t moe_down
        const float *shexp_gate

    ctypedef struct model_desc:
        int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, n_vocab
        int rope_mode
        int activation
        float rms_eps
        float embed_scale
        float attn_scale
        const float *rope_freqs
        weight_t token_embd
        weight_t output
        const float *output_norm
        layer_weights *layers
        int conv_len
        int rope_dim
        int q_gate
        int n_expert, n_expert_used, expert_ffn
        int expert_norm
        int qk_norm_full
        int release_rows
        int ssm_taps, ssm_d, ssm_k_heads, ssm_v_heads
        int mamba_taps, mamba_state, mamba_groups, mamba_heads, mamba_inner
        float residual_scale
        float logit_scale
        int no_rope
        int shexp_ungated

    ctypedef struct engine_item:
        int slot
        int start_pos
        int n_tokens
        int want_logits
        const int32_t *tokens

    ctypedef struct engine:
        pass

    engine *engine_create(const model_desc *m, const kernel_table *kt, int num_slots, int ctx_len,
                          int kv_f16, int max_tokens, int n_threads, int swa_ring, int rollback, int *status)
    int engine_ring_len(const engine *e)
    void engine_destroy(engine *e)
    size_t engine_kv_bytes(const engine *e)
    int engine_n_threads(const engine *e)
    int engine_workers_busy(engine *e)
    int engine_moe_active(const engine *e, int layer)
    int engine_forward(engine *e, const engine_item *items, int n_items, float *logits, int fault_layer)
    size_t engine_kv_snapshot_bytes(const engine *e, int n)
    void engine_kv_read(const engine *e, int slot, int n, void *dst)
    void engine_kv_write(engine *e, int slot, int n, const void *src)
    void engine_kv_copy(engine *e, int src, int dst, int n)
    size_t engine_state_bytes(const engine *e)
    void engine_state_read(const engine *e, int slot, int which, void *dst)
    void engine_state_write(engine *e, int slot, int which, const void *src)
    void engine_state_copy(engine *e, int src, int which, int dst)
