/* The decoder forward pass (llama, qwen2, qwen3, gemma3, lfm2, qwen35, granitehybrid, the MoEs) over a pool of KV slots (see
 * engine.c for the design; engine_internal.h lists the files behind it). */
#ifndef SLOTSERVE_ENGINE_H
#define SLOTSERVE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

/* Status codes (C never exits; Cython turns these into exceptions). */
enum {
    ENGINE_OK = 0,
    ENGINE_ENOMEM = -1,     /* an allocation failed */
    ENGINE_EINVAL = -2,     /* a bad argument (the Python layer validates first) */
    ENGINE_EFAULT = -3,     /* the injected test fault fired */
    ENGINE_EINTERNAL = -4,  /* a step ran another number of phases than it allocated (a bug) */
};

/* How RoPE pairs the dimensions of a head (llama.cpp's rope modes). */
enum {
    ROPE_NORMAL = 0,        /* adjacent pairs (x[2i], x[2i+1]): llama */
    ROPE_NEOX = 1,          /* halves (x[i], x[i + head_dim/2]): qwen2, qwen3, gemma3 */
};

/* The gate activation of the feed-forward block: act(gate) * up. */
enum {
    ACT_SILU = 0,           /* llama, qwen2, qwen3 */
    ACT_GELU_TANH = 1,      /* gemma3 (GELU, tanh approximation) */
};

/* Weights are kernels.h `gemm_weight`s: the caller fills type, n_in, n_out and rows (borrowed
 * from the model file) and leaves x8 NULL; the engine packs its own row groups. */
typedef gemm_weight weight_t;

/* One layer. Optional parts are NULL when the architecture has none:
 *   q = Wq h (+ bq), k = Wk h (+ bk), v = Wv h (+ bv)        biases: qwen2
 *   q, k = rmsnorm per head * q_norm, k_norm, before RoPE     qwen3, gemma3
 *   x += rmsnorm(Wo attn) * post_attn_norm (else x += Wo attn) gemma3, likewise post_ffn_norm */
typedef struct {
    const float *attn_norm; /* [dim] */
    weight_t attn_q;        /* dim -> n_heads * head_dim */
    weight_t attn_k;        /* dim -> n_kv_heads * head_dim */
    weight_t attn_v;        /* dim -> n_kv_heads * head_dim */
    const float *bq;        /* [n_heads * head_dim] or NULL */
    const float *bk;        /* [n_kv_heads * head_dim] or NULL */
    const float *bv;        /* [n_kv_heads * head_dim] or NULL */
    const float *q_norm;    /* [head_dim] or NULL (model_desc.qk_norm_full: [n_heads * head_dim]) */
    const float *k_norm;    /* [head_dim] or NULL (model_desc.qk_norm_full: [n_kv_heads * head_dim]) */
    weight_t attn_output;   /* n_heads * head_dim -> dim */
    const float *post_attn_norm; /* [dim] or NULL */
    const float *ffn_norm;  /* [dim] */
    weight_t ffn_gate;      /* dim -> ffn_dim */
    weight_t ffn_up;        /* dim -> ffn_dim */
    weight_t ffn_down;      /* ffn_dim -> dim */
    const float *post_ffn_norm; /* [dim] or NULL */
    double rope_base;       /* this layer's RoPE base (gemma3: 10000 on sliding-window layers) */
    int window;             /* sliding window: a row at pos sees keys pos-window+1..pos; 0 = all */
    /* lfm2: a short-convolution block in place of attention when conv_in.rows is set (the
     * attention weights are then empty): b, c, x = thirds of conv_in h;
     * out = conv_out (c * conv(b * x)), conv depthwise and causal over model_desc.conv_len
     * positions; the b * x rows are the layer's per-position state (engine_kv.c) */
    weight_t conv_in;       /* dim -> 3 * dim */
    weight_t conv_out;      /* dim -> dim */
    const float *conv_w;    /* [dim][conv_len], the file's layout */
    /* qwen35: a Gated DeltaNet block in place of attention when ssm_qkv.rows is set (the
     * attention weights are then empty; dimensions in model_desc.ssm_*; engine_recurrent.c) */
    weight_t ssm_qkv;       /* dim -> conv_dim = 2 * k_heads * d + v_heads * d (attn_qkv) */
    weight_t ssm_z;         /* dim -> v_heads * d: the output gate (attn_gate) */
    weight_t ssm_beta;      /* dim -> v_heads */
    weight_t ssm_alpha;     /* dim -> v_heads */
    weight_t ssm_out;       /* v_heads * d -> dim */
    const float *ssm_conv;  /* [conv_dim][ssm_taps], the file's layout */
    const float *ssm_dt;    /* [v_heads] added to alpha before the softplus */
    const float *ssm_a;     /* [v_heads] -exp(A_log): g = softplus(alpha + dt) * a */
    const float *ssm_norm;  /* [d] */
    /* granitehybrid: a Mamba2 block in place of attention when mamba_in.rows is set (the
     * attention weights are then empty; dimensions in model_desc.mamba_*; engine_recurrent.c): in_proj
     * yields z [inner] | x [inner] B [groups][state] C [groups][state] (the conv's channels) |
     * dt [heads]; head h (width inner / heads) reads group h / (heads / groups) */
    weight_t mamba_in;      /* dim -> 2 * inner + 2 * groups * state + heads (ssm_in) */
    weight_t mamba_out;     /* inner -> dim (ssm_out) */
    const float *mamba_conv;   /* [inner + 2 * groups * state][taps], the file's layout */
    const float *mamba_conv_b; /* [inner + 2 * groups * state] conv bias */
    const float *mamba_dt;  /* [heads] dt bias */
    const float *mamba_a;   /* [heads] -exp(A_log) */
    const float *mamba_d;   /* [heads] skip: y += D * x */
    const float *mamba_norm; /* [inner]: groups of inner / groups, each rmsnormed on its own */
    /* MoE (qwen3moe, qwen2moe): a mixture-of-experts FFN when moe_router.rows is set (moe.c,
     * engine_ffn.c): the 3-D expert tensors as one weight each, expert e's slice the rows
     * [e * per, (e + 1) * per) (per = model_desc.expert_ffn for gate/up, dim for down); the
     * shared expert (qwen2moe) is ffn_gate/up/down of ffn_dim, scaled by sigmoid(shexp_gate . h) */
    weight_t moe_router;    /* dim -> n_expert (ffn_gate_inp) */
    weight_t moe_gate;      /* dim -> n_expert * expert_ffn (ffn_gate_exps) */
    weight_t moe_up;        /* dim -> n_expert * expert_ffn (ffn_up_exps) */
    weight_t moe_down;      /* expert_ffn -> n_expert * dim (ffn_down_exps) */
    const float *shexp_gate; /* [dim] (ffn_gate_inp_shexp) or NULL: no shared expert */
} layer_weights;

typedef struct {
    int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, n_vocab;
    int rope_mode;          /* ROPE_NORMAL or ROPE_NEOX */
    int activation;         /* ACT_SILU or ACT_GELU_TANH */
    float rms_eps;
    float embed_scale;      /* embeddings are multiplied by this (gemma3: sqrt(dim); else 1) */
    float attn_scale;       /* attention scores are scale * q.k (1/sqrt(head_dim)) */
    const float *rope_freqs; /* [head_dim/2] RoPE frequency divisors (llama 3.1) or NULL */
    weight_t token_embd;    /* dim x n_vocab: row t is token t's embedding */
    weight_t output;        /* dim -> n_vocab (token_embd when the output is tied) */
    const float *output_norm; /* [dim] */
    layer_weights *layers;  /* [n_layers], borrowed for the duration of engine_create */
    int conv_len;           /* lfm2: taps of the short convolutions (shortconv.l_cache); 0 = none */
    int rope_dim;           /* dims of a head RoPE turns (the first; NEOX pairs i, i + rope_dim/2); 0 = head_dim */
    int q_gate;             /* qwen35: attn_q yields per head head_dim queries then head_dim gate values;
                             * the attention output is multiplied by sigmoid(gate) */
    int ssm_taps, ssm_d, ssm_k_heads, ssm_v_heads; /* qwen35 DeltaNet: conv taps, head width, heads; 0 = none */
    int n_expert, n_expert_used, expert_ffn; /* MoE: experts, chosen per row (top-k), width; 0 = none */
    int expert_norm;        /* MoE: the chosen weights are renormalised to sum 1 (qwen3moe) */
    int qk_norm_full;       /* olmoe: q_norm, k_norm span the whole q (k) row, not one head */
    int mamba_taps, mamba_state, mamba_groups, mamba_heads, mamba_inner; /* granitehybrid Mamba2: conv
                             * taps, state per channel, B/C groups, heads, channels; 0 = none */
    float residual_scale;   /* granite: every block's output is multiplied by this before the
                             * residual add (must be > 0; 1 = none) */
    float logit_scale;      /* granite: logits are multiplied by 1 / logit_scale (0 or 1 = none) */
    int no_rope;            /* granite 4.0 H: the attention layers rotate nothing (rope.scaling.finetuned false) */
    int shexp_ungated;      /* granitehybrid MoE: the shared expert (ffn_*) added as is, no sigmoid gate */
    int release_rows;       /* the weights' rows lie in a read-only file mapping: once a matrix is
                             * packed, engine_create gives its pages back (re-read from the file if
                             * touched again), so a load never holds the file and the packed copy */
} model_desc;

/* One slot's share of a forward call (validated by the caller). */
typedef struct {
    int slot;
    int start_pos;          /* absolute position of tokens[0] */
    int n_tokens;           /* >= 1 */
    int want_logits;        /* logits of the last want_logits tokens (0..n_tokens) */
    const int32_t *tokens;  /* [n_tokens] */
} engine_item;

typedef struct engine engine;

/* Allocates KV for num_slots x ctx_len tokens and all step buffers for max_tokens rows.
 * swa_ring != 0: sliding-window layers keep a ring of their window + max_tokens - 1 rows
 * (rounded up to ATTN_CHUNK) instead of ctx_len (engine_kv.c; none if that saves nothing).
 * rollback: recurrent states kept per slot for rewinds (engine_state_bytes; 0 = none).
 * kv_type: KV_F32, KV_F16 or KV_Q8_0 (kv_q8.h; head_dim a multiple of 32, else ENGINE_EINVAL).
 * *status gets ENGINE_OK or the failure; the model's weights must outlive the engine. */
engine *engine_create(const model_desc *m, const kernel_table *kt, int num_slots, int ctx_len,
                      int kv_type, int max_tokens, int n_threads, int swa_ring, int rollback, int *status);
void engine_destroy(engine *e);
size_t engine_kv_bytes(const engine *e);
/* Rows of a ring layer's planes; 0 when the engine keeps full planes on every layer. */
int engine_ring_len(const engine *e);
int engine_n_threads(const engine *e);
/* Pool workers inside a task right now (a snapshot for tests: 0 whenever no call is running,
 * since engine_forward returns only once its workers have left the step). */
int engine_workers_busy(engine *e);
/* Mixture of experts: the experts layer l ran in the last step, each once for all the step's
 * rows that chose it (so no other expert's weights were read); 0 on a dense layer or model. */
int engine_moe_active(const engine *e, int layer);

/* Runs every item (split into steps of at most max_tokens rows) and writes one logits row for
 * each of every item's last want_logits tokens, in item and row order, into logits [k][n_vocab]. fault_layer >= 0 makes the
 * first step fail after that layer wrote its KV rows (test hook). Returns a status. */
int engine_forward(engine *e, const engine_item *items, int n_items, float *logits, int fault_layer);

/* The first n tokens' KV of a slot, serialised per layer as its n_kv_heads k planes (the
 * ceil(n / KEY_LANES) blocks, lanes past n zeroed) then its n_kv_heads v planes (n rows); a
 * ring layer as, per kv head, the keys then the values of positions max(0, n - window + 1)
 * .. n-1 ([rows][head_dim] each); a short-convolution layer as its n conv-input rows
 * ([n][dim]): engine_kv_snapshot_bytes(e, n) bytes. The caller keeps
 * those positions in the ring (engine_ext/pool.py). engine_kv_copy copies rings whole. */
size_t engine_kv_snapshot_bytes(const engine *e, int n);
/* (DeltaNet and Mamba2 layers hold no KV rows: the KV functions skip them.) */
void engine_kv_read(const engine *e, int slot, int n, void *dst);
void engine_kv_write(engine *e, int slot, int n, const void *src);
void engine_kv_copy(engine *e, int src, int dst, int n);

/* Recurrent state (qwen35, granitehybrid): per slot, per DeltaNet layer, the conv tail
 * [taps-1][conv_dim] then the head matrices [v_heads][d][d]; per Mamba2 layer, the conv tail
 * [taps-1][inner + 2 groups state] then the head states [heads][inner / heads][state]; all f32:
 * engine_state_bytes(e) bytes (0 without recurrent layers). A forward updates it token by token; a segment starting at position 0 starts from
 * zeros. A slot keeps k + 1 states (rollback k, engine_create): the state at length m lives in
 * entry m % (k + 1), so a token reads the entry of its position and writes the next one (in
 * place with k = 0), and the states of the last k + 1 lengths a slot went through stay where
 * they were written: a rollback moves no bytes (the pool knows which lengths are held).
 * Within one segment, a token whose state falls before the last k + 1 lengths is updated in
 * place. `which` names an entry: the one of the length in question, m % (k + 1). */
size_t engine_state_bytes(const engine *e);
void engine_state_read(const engine *e, int slot, int which, void *dst);
void engine_state_write(engine *e, int slot, int which, const void *src);
/* dst's entry `which` = src's (a copy of the state at one length into another slot). */
void engine_state_copy(engine *e, int src, int which, int dst);

#endif
