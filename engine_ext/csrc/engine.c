/* The decoder forward pass over a pool of KV slots: llama, qwen2, qwen3, gemma3, lfm2, qwen35,
 * granitehybrid and the MoEs, one phase sequence whose optional parts (biases, q/k norms,
 * post-norms, sliding windows, short convolutions, gated attention, Gated DeltaNet and Mamba2
 * layers, the granite scales) are switched by the model description (engine.h).
 *
 * Design: a forward call is cut into steps of at most max_tokens rows; a step holds segments
 * (consecutive tokens of one slot) from any number of slots, so one step streams every weight
 * matrix once for all of its rows. The threads of the pool walk the step's phases together;
 * a phase is a list of units that any thread grabs, and it ends when all its units are done
 * (a late or descheduled thread finds them taken; threadpool.h):
 *
 *   embed (* scale) + rope angles of each rope table (rows)
 *   per layer: norm+quantize (rows) | q,k,v matmuls (output rows, dynamic)
 *              | biases, q/k norms, rope, KV store (rows) | attention (segment x kv head x query
 *              tile, or per key chunk + merge when there are few) | quantize (rows)
 *              | output matmul (+= residual) | [post-norm += residual] | norm+quantize
 *              | gate,up matmuls | act(gate)*up + quantize (rows) | down matmul (+= residual)
 *              | [post-norm += residual]
 *   logits: final norm+quantize of the requested rows only | output matmul (vocab, dynamic)
 *
 * A mixture-of-experts layer (qwen3moe, qwen2moe) walks its own FFN phases (moe_block: router,
 * top-k, rows grouped by expert, each chosen expert's matmuls once for all its rows); a dense
 * layer walks MOE_EXTRA_PHASES empty ones in their place.
 *
 * Every layer walks the same PHASES_PER_LAYER phases (a phase an architecture lacks is an empty
 * slot in the sequence), and a step checks that it walked exactly the phases it counted.
 *
 * Which thread computes a row or an output never changes the arithmetic (kernels.h NOTE), so
 * results do not depend on the thread count or on dynamic scheduling.
 *
 * KV memory, one block per slot, head-major so attention streams contiguous memory:
 *
 *   kv = [slot][layer][0 = k, 1 = v][kv head][plane of ctx_pad x head_dim]  (f16 or f32)
 *   v plane: row p = position p
 *   k plane: blocks of KEY_LANES positions, dimension-major inside (kernels.h key_index)
 *
 *   k plane   | block 0: d0[p0..p7] d1[p0..p7] ... | block 1: d0[p8..p15] ... |
 *
 * q8_0 (kv_type KV_Q8_0, kv_q8.h): a head row is head_dim / 32 blocks of an f16 scale and 32
 * int8 values (34 bytes, kv_row); v rows are those blocks in order; a k block keeps, per group of
 * 32 dimensions, the 8 positions' scales and then the group's values in quads of 4 dimensions,
 * key by key, so keys still stream front to back, 8 lanes of 4 dimensions per load (int8 dot
 * products), and a block is KEY_LANES * kv_row bytes:
 *
 *   v row p   | d q[0..31] | d q[32..63] | ...
 *   k block   | group 0: d[p0..p7] | p0 q[0..3] ... p7 q[0..3] | p0 q[4..7] ... | group 1: ...
 *
 * Rows are quantized as they are stored (store_kv), never re-quantized after.
 *
 * ctx_pad = ctx_len rounded up to KEY_LANES. A slot's first n tokens are the first
 * ceil(n / KEY_LANES) blocks of every k plane and the first n rows of every v plane (what
 * truncate, copy and snapshot rely on).
 *
 * Rings (swa_ring): a sliding-window layer needs only the keys of its window, so its planes
 * hold ring_len rows instead of ctx_pad, and position p lives at row p % ring_len. ring_len is
 * the widest window + max_tokens - 1 (a step writes up to max_tokens rows before its first row
 * attends back a window), rounded up to ATTN_CHUNK. Planes therefore differ in size per layer:
 *
 *   kv = [slot][layer: ctx_pad or ring_len rows per plane][0 = k, 1 = v][kv head][plane]
 *
 *   positions  0 ....... R-1 | R ....... 2R-1 | 2R ...       (R = ring_len, a multiple of
 *   ring row   0 ....... R-1 | 0 ....... R-1  | 0 ...         ATTN_CHUNK and of KEY_LANES)
 *
 * Short-convolution layers (lfm2) keep no keys or values but the input of their convolution,
 * b * x ([dim] per position, in the KV dtype; f16 when the KV is q8_0), as one row per position, so a slot's first n
 * tokens are the first n rows there too and truncate, copy and snapshot work as on full KV:
 *
 *   kv = [slot][layer: ... | conv layer: [ctx_pad][dim] rows, row p = position p | ...]
 *
 * Such a layer walks the attention block's phases: norm | in_proj matmul | b * x stored
 * (rows) | conv of rows pos-conv_len+1..pos from the store (rows) | - | - | out_proj | -.
 * The conv reads the current row from the store too, so a row's result is the same whether
 * its predecessors were computed in this step or an earlier one.
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
 * + D x and * silu(z)) | grouped rmsnorm + quantize (rows) | - | out matmul | -. With a
 * residual_scale (granite), an attention, Mamba2 or dense FFN block's output matmul writes proj,
 * and the next norm phase (the next block's, or the logits') first adds proj * scale to the
 * residual stream row by row: no phase of its own (MoE blocks add into x in their last phase);
 * the logits of a step are multiplied by 1 / logit_scale.
 *
 * NOTE: attention stays bit-identical to full planes: a chunk of ATTN_CHUNK keys never wraps,
 * so the chunk kernels run on the same keys in the same order with positions shifted by a
 * multiple of R (pos0 - S, chunk - S / ATTN_CHUNK); only where the keys are read from changes.
 * Rows a ring has overwritten are only read inside masked lanes (probability exactly 0).
 * The scheduler-side contract (how far back a slot can be cut) lives in engine_ext/pool.py.
 */
#define _GNU_SOURCE /* mmap flags, madvise */
#include "engine.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "kv_q8.h"
#include "moe.h"
#include "threadpool.h"

#define MIN_GEMM_CHUNK 16       /* fewest output rows in one dynamic matmul chunk */
#define STREAM_PCT 75           /* streamed matmuls: the share of the rows in one run a thread (stream_phase) */
#define STREAM_TAIL_CHUNKS 4    /* streamed matmuls: units a thread for the rest */
#define CHUNKS_PER_THREAD 8     /* dynamic matmul chunks per thread (load balance) */
#define PAIRED_CHUNKS_PER_THREAD 4 /* the same for calls of PAIRED_ROWS rows or more: each call
                                      repacks its activation tiles (arch/x86_gemm_z16.h), so
                                      fewer, wider chunks */
#define PAIRED_ROWS 9           /* from this many activation rows, matmul chunks hold whole pairs of
                                   row groups: the avx512vnni prefill tiles take two at once
                                   (arch/x86_gemm_z16.h Z_MIN_ROWS); matmul_phase streams the
                                   calls of fewer (decode steps of 1-8 slots: stream_phase) */
/* norm, qkv, rope, attention, merge, quantize, output, post-norm, norm, gate/up, act, down, post-norm,
 * and MOE_EXTRA_PHASES the MoE FFN block walks beyond the dense one (moe_block) */
#define MOE_EXTRA_PHASES 4
#define PHASES_PER_LAYER (13 + MOE_EXTRA_PHASES)
#define PHASES_EXTRA 3          /* embed; logits norm, logits matmul */
#define SPLIT_BELOW_UNITS 4     /* split attention into chunks when it has < this many units per thread */
#define PART_FLOATS (1 << 18)   /* capacity of the split attention partial states (1 MiB) */
#define ROWS_PER_UNIT 4         /* rows per unit of the row-wise phases (1 for small steps) */
#define CONV_BLOCK 256          /* channels per unit of the DeltaNet conv phase */
#define MAX_SSM_TAPS 16         /* longest DeltaNet conv (gguf_file.MAX_SSM_CONV) */
#define MAMBA_HEADS 4           /* Mamba2 heads per unit of the scan phase */
#define GDN_TOKENS 64           /* tokens of a DeltaNet head's segment per gdn_steps call (their
                                   normalised q and k in the thread's scratch, in L2) */

typedef struct {
    int slot;
    int pos0;      /* absolute position of the segment's first row */
    int n;         /* rows */
    int row0;      /* first row in the step buffers */
} step_seg;

/* Attention of rows q0 .. q0+n_q-1 of segment seg against kv head kv_head: all chunks into the
 * output (chunk < 0), or one chunk's partial state into the part buffer at `part`; a merge unit
 * (chunk < 0 too, n_parts > 0) folds n_parts consecutive partials into the output. */
typedef struct {
    int seg, kv_head, q0, n_q;
    int chunk;
    size_t part;   /* offset (floats) of the first partial state in `parts` */
    int n_parts;
} attn_unit;

typedef struct {
    atomic_uint next;         /* next unit to hand out */
    atomic_uint done;         /* units finished */
    char pad[56];             /* one cache line per phase */
} phase_sync;

typedef struct {
    const weight_t *w;
    float *y;      /* [n_rows][ldy] */
    int ldy;
    int accumulate;
} mm_job;

struct engine {
    model_desc m;             /* m.layers points at `layers` */
    layer_weights *layers;    /* [n_layers] (owned copy) */
    char *packed;             /* [packed_bytes] row-group copies of the block weights (owned) */
    size_t packed_bytes;
    const kernel_table *kt;
    threadpool *tp;
    int num_slots, ctx_len, kv_f16, kv_type, max_tokens; /* kv_f16: conv rows in f16 (any 16- or 8-bit KV) */
    int ctx_pad;              /* ctx_len rounded up to KEY_LANES */
    int q_dim, kv_dim, max_k, group;
    size_t kv_elt;            /* bytes per conv-row element: 2 (f16 or q8_0 KV) or 4 (f32) */
    size_t kv_row;            /* bytes of one position's head row in a k or v plane (kv_q8.h for q8_0) */
    int ring_len;             /* rows of a sliding-window layer's planes; 0: no rings (see top) */
    int ring_reach;           /* widest window - 1: rows before a position a ring must still hold */
    int *plane_rows;          /* [n_layers] rows per plane: ctx_pad, or ring_len for ring layers */
    size_t *layer_off;        /* [n_layers] byte offset of each layer in a slot's block */
    size_t slot_bytes;        /* bytes of one slot's KV block */
    void *kv;                 /* [num_slots][slot_bytes] per layer [2][n_kv_heads][plane_rows * head_dim] */
    size_t kv_bytes;
    int n_rope;               /* distinct rope tables (one per distinct layer rope_base) */
    int *layer_rope;          /* [n_layers] rope table of each layer */
    double *inv_freq;         /* [n_rope][head_dim/2]: rope_base^(-2i/rope_dim) / rope_freqs[i] (0 past rope_dim/2) */

    /* Gated DeltaNet (qwen35; see top) */
    int conv_dim, value_dim, key_dim;
    size_t *rs_off;           /* [n_layers] offset (floats) of a DeltaNet layer in a slot's state */
    size_t rs_floats;         /* floats of one slot's state */
    int rollback;             /* earlier states kept per slot for rollback (0 = none) */
    float *rstate;            /* [num_slots][rollback + 1][rs_floats]: length m's state in entry m % (rollback + 1) */
    float *ssm_taps;          /* [n_layers][taps][conv_dim] tap-major conv kernels (DeltaNet layers) */
    float *ones;              /* [CONV_BLOCK] 1.0f (silu(x) = silu_mul(x, 1)) */
    int in_dim;               /* DeltaNet: conv_dim; Mamba2: the in_proj row (z | xBC | dt) */
    float *sqkv, *sconv;      /* [T][in_dim] the qkv (in_proj) matmul result, [T][conv_dim] its conv + silu */
    float *sz;                /* [T][value_dim] output gate */
    float *sb, *sa;           /* [T][v_heads] beta and alpha before their activations
                               * (Mamba2: [T][heads] dA, and dt before then after its softplus) */
    float *ssm_scratch;       /* [n_threads][2][GDN_TOKENS][d] normalised q, then k, of a run of tokens */
    float *qg;                /* [T][2 * q_dim] gated attention's q matmul (q_gate) */
    float *qgate;             /* [T][q_dim] its gate values */

    /* MoE FFN (moe_block); P = max_tokens * n_expert_used (row, rank) pairs */
    weight_t *experts;        /* [n_layers][3: gate, up, down][n_expert] each expert's slice */
    float *mlogits;           /* [T][n_expert] router logits */
    int *msel, *mpair_of;     /* [T][k] chosen experts by rank; the pair of (row, rank) */
    float *mw;                /* [T][k] their weights */
    float *mshg;              /* [T] sigmoid(shared expert gate) */
    int *moff, *mactive, *mpair_row; /* [n_expert + 1] pairs of each expert; active experts; [P] */
    int *mn_active;           /* [n_layers] experts with pairs, per layer of the current step
                               * (NOTE: per layer: a late thread computes a phase's unit count
                               * after faster ones may have planned the next layer) */
    float *mx;                /* [P][dim] gathered float input rows */
    int8_t *mqs;              /* [P][max(dim, expert_ffn)] gathered quantized input, then act output */
    float *md, *ms;           /* [P][max/QK] its block scales and sums */
    float *mgate, *mup;       /* [P][expert_ffn] */
    float *mout;              /* [P][dim] each pair's expert output */

    float *conv_taps;         /* [n_layers][conv_len][dim] tap-major copies of the conv kernels (conv layers only) */
    size_t conv_row_bytes;    /* dim * kv_elt: one position's conv input */

    /* step buffers; T = max_tokens */
    float *x;                 /* [T][dim] residual stream */
    float *xb;                /* [T][max_k] float matmul input, row stride = current k */
    float *q, *k, *v;         /* [T][q_dim], [T][kv_dim], [T][kv_dim] */
    float *gate, *up;         /* [T][ffn_dim] */
    float *proj;              /* [T][dim] output / down matmul result before its post-norm */
    float *bcx;               /* [T][3 * dim] in_proj result of a short-convolution layer (lfm2) */
    int8_t *aqs;              /* [T][max_k] quantized matmul input */
    float *ad, *as;           /* [T][max_k/QK] block scales and sums */
    float *rope_cs;           /* [n_rope][T][head_dim/2][2] cos, sin */
    int32_t *tokens;          /* [T] */
    int *row_pos;             /* [T] absolute position of each row */
    int *row_slot;            /* [T] slot of each row */
    step_seg *segs;           /* [T] */
    attn_unit *units;         /* [max_units] attention units of the step */
    attn_unit *merges;        /* [max_units] merge units (split attention) */
    int max_units;
    float *parts;             /* [PART_FLOATS] partial states of split attention */
    int *logit_src;           /* [T] step row whose logits each logits row gets */
    float *attn_scratch;      /* [n_threads][attn_floats] */
    size_t attn_floats;
    phase_sync *sync;         /* [n_phases + PHASES_PER_LAYER] work counters, one per phase of a
                               * step (the spare layer's worth absorbs a miscount until it is caught) */
    int n_phases;             /* PHASES_PER_LAYER * n_layers + PHASES_EXTRA */
    int phases_run;           /* phases the last step walked (thread 0 writes it) */

    /* the current step */
    int n_rows, n_segs, n_units, n_merges, n_logits;
    float *logits_out;        /* [n_logits][n_vocab] */
    int fault_layer;
};

/* Block types multiply 8-bit quantized activations (float types: F32, F16, BF16 read floats). */
static int is_block_type(int type) { return ggml_block_elems(type) > 0; }

static void *xalloc(size_t n, int *ok) {
    void *p = calloc(n ? n : 1, 1);
    if (!p) *ok = 0;
    return p;
}

static int weight_ok(const weight_t *w, int n_in, int n_out) {
    if (!w->rows || w->n_in != n_in || w->n_out != n_out) return 0;
    if (ggml_row_bytes(w->type, n_in) == 0) return 0;
    if (n_in > MAX_ROW_LEN) return 0;
    /* block types: whole blocks (K-quants: super-blocks of 256) */
    if (is_block_type(w->type) && n_in % ggml_block_elems(w->type) != 0) return 0;
    return 1;
}

#define MAX_CONV_LEN 16          /* longest short convolution (lfm2 uses 3) */

static inline int is_conv_layer(const layer_weights *L) { return L->conv_in.rows != NULL; }
static inline int is_delta_layer(const layer_weights *L) { return L->ssm_qkv.rows != NULL; }
static inline int is_mamba_layer(const layer_weights *L) { return L->mamba_in.rows != NULL; }
/* A layer with a recurrent state and no rows per position (DeltaNet, Mamba2). */
static inline int is_state_layer(const layer_weights *L) { return is_delta_layer(L) || is_mamba_layer(L); }

static inline int is_moe_layer(const layer_weights *L) { return L->moe_router.rows != NULL; }

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

static int model_ok(const model_desc *m) {
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

/* Every block-type matmul weight gets its row groups (kernels.h x8 layout), owned by the
 * engine. token_embd keeps its rows for the embedding lookup; as a tied output it is packed. */
/* Large, long-lived buffers (KV, packed weights) come zeroed from the OS, asking for
 * transparent huge pages: both are streamed every step, and 2 MiB pages spare the TLB.
 * populate: fault every page in now (KV: the memory is really committed at start-up, and the
 * first steps on a fresh slot do not pay for zeroing pages). */
static void *big_alloc(size_t n, int populate) {
#ifdef __linux__
    if (n >= (1u << 21)) {
        void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return NULL;
        madvise(p, n, MADV_HUGEPAGE); /* a hint; failure is harmless */
        if (populate) {
#ifdef MADV_POPULATE_WRITE
            if (madvise(p, n, MADV_POPULATE_WRITE) != 0) {
                if (errno != EINVAL) { /* out of memory: fail here rather than later */
                    munmap(p, n);
                    return NULL;
                }
#else
            {
#endif
                for (size_t i = 0; i < n; i += 4096) ((volatile char *)p)[i] = 0; /* kernels < 5.14 */
            }
        }
        return p;
    }
#endif
    (void)populate;
    return calloc(n ? n : 1, 1);
}

static void big_free(void *p, size_t n) {
    if (!p) return;
#ifdef __linux__
    if (n >= (1u << 21)) {
        munmap(p, n);
        return;
    }
#endif
    free(p);
}

static const int N_LAYER_MATRICES = 16;

static int n_matrices(const engine *e) {
    return 1 + N_LAYER_MATRICES * e->m.n_layers + (e->experts ? e->m.n_layers * (1 + 3 * e->m.n_expert) : 0);
}

static weight_t *matrix(engine *e, int i) {
    if (i == 0) return &e->m.output;
    const int dense = 1 + N_LAYER_MATRICES * e->m.n_layers;
    if (i >= dense) { /* MoE: the routers, then every expert slice (empty on dense layers) */
        i -= dense;
        if (i < e->m.n_layers) return &e->layers[i].moe_router;
        return &e->experts[i - e->m.n_layers];
    }
    layer_weights *L = &e->layers[(i - 1) / N_LAYER_MATRICES];
    weight_t *ws[] = {&L->attn_q,   &L->attn_k,  &L->attn_v,    &L->attn_output, &L->ffn_gate,
                      &L->ffn_up,   &L->ffn_down, &L->conv_in, &L->conv_out,   &L->ssm_qkv,
                      &L->ssm_z,    &L->ssm_beta, &L->ssm_alpha, &L->ssm_out,   &L->mamba_in,
                      &L->mamba_out};
    return ws[(i - 1) % N_LAYER_MATRICES];
}

/* Gives back the pages of [p, p + n) that lie wholly inside it: a read-only file mapping's
 * pages are reclaimed now (MADV_PAGEOUT, kernel 5.4+: out of the page cache too, where the
 * kernel allows it; not when `cached`) and unmapped (MADV_DONTNEED: resident memory drops even
 * where it does not); a later read faults them in again, from the file or, `cached`, from the
 * page cache while the kernel keeps them there. Never on anonymous memory (DONTNEED zeroes it):
 * only for model_desc.release_rows. Failures are harmless (the pages stay). */
static void release_pages(const void *p, size_t n, int cached) {
#ifdef __linux__
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + page - 1) & ~(page - 1), b = ((uintptr_t)p + n) & ~(page - 1);
    if (b <= a) return;
#ifdef MADV_PAGEOUT
    if (!cached) madvise((void *)a, b - a, MADV_PAGEOUT);
#endif
    madvise((void *)a, b - a, MADV_DONTNEED);
#else
    (void)p, (void)n, (void)cached;
#endif
}

/* One load's packing, shared by the pool's threads (pack_task): matrix i goes to packed + at[i]
 * (at[i] == at[i + 1]: nothing to pack); next is the next matrix to grab, ahead the next whose
 * file pages were not asked for yet (MADV_WILLNEED), done counts the matrices finished. */
typedef struct {
    engine *e;
    int n;
    const size_t *at;
    atomic_int next, ahead;
    atomic_uint done;
} pack_job;

/* How far ahead of the matrices being packed their file pages are asked for: the disk reads
 * the next ones while the threads repack the current ones. */
#define PACK_READ_AHEAD (64u << 20)

static size_t file_bytes(const weight_t *w) { return w->rows ? ggml_row_bytes(w->type, w->n_in) * (size_t)w->n_out : 0; }

/* Asks for a read-only file mapping's pages of [p, p + n) to be read now (asynchronously). */
static void will_need(const void *p, size_t n) {
#ifdef __linux__
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p & ~(page - 1), b = (uintptr_t)p + n;
    if (n) madvise((void *)a, b - a, MADV_WILLNEED);
#else
    (void)p, (void)n;
#endif
}

/* Threads grab matrices in order; each packs one, then gives its file pages back, so the file
 * pages held at once are those of the matrices in flight (one per thread) and what was read
 * ahead (page cache the kernel can reclaim), never the whole file beside its repacked copy. */
static void pack_task(void *ctx, int ith, int nth) {
    pack_job *j = ctx;
    engine *e = j->e;
    (void)ith, (void)nth;
    for (;;) {
        const int i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n) return;
        if (e->m.release_rows) /* ask for the file pages of the matrices up to PACK_READ_AHEAD on */
            for (int a = atomic_load(&j->ahead); a < j->n && j->at[a] < j->at[i] + PACK_READ_AHEAD; a = atomic_load(&j->ahead))
                if (atomic_compare_exchange_weak(&j->ahead, &a, a + 1) && j->at[a + 1] > j->at[a])
                    will_need(matrix(e, a)->rows, file_bytes(matrix(e, a)));
        weight_t *w = matrix(e, i);
        if (j->at[i + 1] > j->at[i]) {
            pack_x8(e->packed + j->at[i], w->rows, w->type, w->n_in, w->n_out);
            /* a tied output's rows stay in the page cache: the embedding reads a row of them a
             * token, and a paged-out row is a disk read in the step (qwen3.5-0.8b: 0.38 ms of
             * a 13 ms decode step with fresh tokens) */
            if (e->m.release_rows) release_pages(w->rows, file_bytes(w), w->rows == e->m.token_embd.rows);
        }
        threadpool_count_add(e->tp, &j->done);
    }
}

/* Packs every block-type matrix into one buffer, split by matrix among the pool's threads. */
static int pack_weights(engine *e) {
    const int n = n_matrices(e);
    size_t *at = malloc(sizeof(size_t) * ((size_t)n + 1));
    if (!at) return 0;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        weight_t *w = matrix(e, i);
        at[i] = total;
        const size_t bytes = w->rows ? x8_bytes(w->type, w->n_in, w->n_out) : 0; /* a layer kind's absent matrices */
        total += (bytes + 63) & ~(size_t)63;
    }
    at[n] = total;
    e->packed_bytes = total;
    if (total == 0) {
        free(at);
        return 1;
    }
    e->packed = big_alloc(total, 0);
    if (!e->packed) {
        free(at);
        return 0;
    }
    for (int i = 0; i < n; i++) {
        weight_t *w = matrix(e, i);
        if (at[i + 1] > at[i]) w->x8 = e->packed + at[i];
    }
    pack_job job = {.e = e, .n = n, .at = at};
    atomic_init(&job.next, 0);
    atomic_init(&job.ahead, 0);
    atomic_init(&job.done, 0);
    threadpool_run(e->tp, pack_task, &job);
    threadpool_count_wait(e->tp, &job.done, (unsigned)n);
    threadpool_wait_idle(e->tp); /* no worker may touch job (this frame) after return */
    free(at);
    return 1;
}

/* Each MoE layer's expert slices (views into its 3-D weights; see engine.h), before packing. */
static int moe_slices(engine *e) {
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
static int moe_create(engine *e, int max_tokens) {
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

/* The recurrent layers' state blocks, tap-major kernels and step buffers (DeltaNet or Mamba2:
 * one kind a model; see top). */
static int delta_create(engine *e, const model_desc *m, int max_tokens, int n_threads, int rollback) {
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

engine *engine_create(const model_desc *m, const kernel_table *kt, int num_slots, int ctx_len,
                      int kv_type, int max_tokens, int n_threads, int swa_ring, int rollback, int *status) {
    *status = ENGINE_EINVAL;
    if (!m || !kt || num_slots < 1 || ctx_len < 1 || max_tokens < 1 || n_threads < 1 || rollback < 0 || !model_ok(m) ||
        kv_type < KV_F32 || kv_type > KV_Q8_0 || (kv_type == KV_Q8_0 && m->head_dim % KV_Q8_BLOCK))
        return NULL;
    *status = ENGINE_ENOMEM;
    engine *e = calloc(1, sizeof(*e));
    if (!e) return NULL;
    int ok = 1;
    e->m = *m;
    e->layers = xalloc(sizeof(layer_weights) * m->n_layers, &ok);
    if (ok) memcpy(e->layers, m->layers, sizeof(layer_weights) * m->n_layers);
    e->m.layers = e->layers;
    if (ok) {
        e->tp = threadpool_create(n_threads); /* packing already runs on it */
        if (!e->tp) ok = 0;
    }
    if (ok && m->n_expert) ok = moe_slices(e);
    if (ok) ok = pack_weights(e);
    if (ok && m->n_expert) ok = moe_create(e, max_tokens);
    e->kt = kt;
    e->num_slots = num_slots;
    e->ctx_len = ctx_len;
    e->ctx_pad = (ctx_len + KEY_LANES - 1) / KEY_LANES * KEY_LANES;
    e->kv_type = kv_type;
    e->kv_f16 = kv_type != KV_F32;
    e->max_tokens = max_tokens;
    e->q_dim = m->n_heads * m->head_dim;
    e->kv_dim = m->n_kv_heads * m->head_dim;
    e->group = m->n_heads / m->n_kv_heads;
    int max_k = m->dim > e->q_dim ? m->dim : e->q_dim;
    e->max_k = max_k > m->ffn_dim ? max_k : m->ffn_dim;
    e->key_dim = m->ssm_k_heads * m->ssm_d;
    e->value_dim = m->ssm_v_heads * m->ssm_d;
    e->conv_dim = 2 * e->key_dim + e->value_dim;
    if (m->mamba_heads) { /* Mamba2: the conv runs over x, B, C; the out matmul reads inner channels */
        e->value_dim = m->mamba_inner;
        e->conv_dim = m->mamba_inner + 2 * m->mamba_groups * m->mamba_state;
    }
    if (e->value_dim > e->max_k) e->max_k = e->value_dim;
    e->kv_elt = e->kv_f16 ? 2 : 4;
    e->kv_row = kv_type == KV_Q8_0 ? kv_q8_row_bytes(m->head_dim) : (size_t)m->head_dim * e->kv_elt;
    int max_window = 0;
    for (int l = 0; l < m->n_layers; l++) max_window = m->layers[l].window > max_window ? m->layers[l].window : max_window;
    if (swa_ring && max_window > 0) {
        long ring = ((long)max_window + max_tokens - 1 + ATTN_CHUNK - 1) / ATTN_CHUNK * ATTN_CHUNK;
        if (ring < e->ctx_pad) { /* else a ring saves nothing: full planes */
            e->ring_len = (int)ring;
            e->ring_reach = max_window - 1;
        }
    }
    e->plane_rows = xalloc(sizeof(int) * m->n_layers, &ok);
    e->layer_off = xalloc(sizeof(size_t) * m->n_layers, &ok);
    e->conv_row_bytes = (size_t)m->dim * e->kv_elt;
    if (ok)
        for (int l = 0; l < m->n_layers; l++) {
            e->plane_rows[l] = e->ring_len && m->layers[l].window > 0 ? e->ring_len : e->ctx_pad;
            e->layer_off[l] = e->slot_bytes;
            if (!is_state_layer(&m->layers[l]))
                e->slot_bytes += is_conv_layer(&m->layers[l]) ? (size_t)e->ctx_pad * e->conv_row_bytes
                                                              : 2 * (size_t)m->n_kv_heads * e->plane_rows[l] * e->kv_row;
        }
    if (m->conv_len) { /* the kernels read the taps of 8 channels at once: [conv_len][dim] */
        e->conv_taps = xalloc(sizeof(float) * m->n_layers * m->conv_len * m->dim, &ok);
        e->bcx = xalloc(sizeof(float) * max_tokens * 3 * m->dim, &ok);
        for (int l = 0; ok && l < m->n_layers; l++) {
            if (!is_conv_layer(&m->layers[l])) continue;
            float *taps = e->conv_taps + (size_t)l * m->conv_len * m->dim;
            for (int c = 0; c < m->dim; c++)
                for (int i = 0; i < m->conv_len; i++) taps[(size_t)i * m->dim + c] = m->layers[l].conv_w[(size_t)c * m->conv_len + i];
        }
    }
    if (ok && e->conv_dim) ok = delta_create(e, m, max_tokens, n_threads, rollback);
    e->kv_bytes = (size_t)num_slots * e->slot_bytes;
    if (ok) e->kv = big_alloc(e->kv_bytes, 1);
    if (!e->kv) ok = 0;
    /* one rope table per distinct layer base (gemma3: local 10000 and global layers) */
    e->layer_rope = xalloc(sizeof(int) * m->n_layers, &ok);
    e->inv_freq = xalloc(sizeof(double) * (m->head_dim / 2) * m->n_layers, &ok);
    if (ok)
        for (int l = 0; l < m->n_layers; l++) {
            int t = 0;
            while (t < l && m->layers[t].rope_base != m->layers[l].rope_base) t++;
            if (t < l) {
                e->layer_rope[l] = e->layer_rope[t];
                continue;
            }
            e->layer_rope[l] = e->n_rope;
            double *f = e->inv_freq + (size_t)e->n_rope++ * (m->head_dim / 2);
            const int rd = m->rope_dim ? m->rope_dim : m->head_dim;
            for (int i = 0; i < m->head_dim / 2; i++) {
                f[i] = i < rd / 2 ? pow(m->layers[l].rope_base, -2.0 * i / rd) : 0.0;
                if (m->rope_freqs) f[i] /= m->rope_freqs[i];
            }
        }

    size_t T = (size_t)max_tokens;
    e->x = xalloc(sizeof(float) * T * m->dim, &ok);
    e->xb = xalloc(sizeof(float) * T * e->max_k, &ok);
    e->q = xalloc(sizeof(float) * T * e->q_dim, &ok);
    e->k = xalloc(sizeof(float) * T * e->kv_dim, &ok);
    e->v = xalloc(sizeof(float) * T * e->kv_dim, &ok);
    e->gate = xalloc(sizeof(float) * T * m->ffn_dim, &ok);
    e->up = xalloc(sizeof(float) * T * m->ffn_dim, &ok);
    e->proj = xalloc(sizeof(float) * T * m->dim, &ok);
    if (m->q_gate) {
        e->qg = xalloc(sizeof(float) * T * 2 * e->q_dim, &ok);
        e->qgate = xalloc(sizeof(float) * T * e->q_dim, &ok);
    }
    e->aqs = xalloc(T * e->max_k, &ok);
    e->ad = xalloc(sizeof(float) * T * (e->max_k / QK + 1), &ok);
    e->as = xalloc(sizeof(float) * T * (e->max_k / QK + 1), &ok);
    e->rope_cs = xalloc(sizeof(float) * T * m->head_dim * (e->n_rope ? e->n_rope : 1), &ok);
    e->tokens = xalloc(sizeof(int32_t) * T, &ok);
    e->row_pos = xalloc(sizeof(int) * T, &ok);
    e->row_slot = xalloc(sizeof(int) * T, &ok);
    e->segs = xalloc(sizeof(step_seg) * T, &ok);
    int q_tile = ATTN_MAX_ROWS / e->group;
    /* each segment of n rows makes n_kv * ceil(n / q_tile) units; sum over segments <= this */
    e->max_units = m->n_kv_heads * (max_tokens / q_tile + max_tokens);
    e->units = xalloc(sizeof(attn_unit) * e->max_units, &ok);
    e->merges = xalloc(sizeof(attn_unit) * e->max_units, &ok);
    e->parts = xalloc(sizeof(float) * PART_FLOATS, &ok);
    e->logit_src = xalloc(sizeof(int) * T, &ok);
    e->attn_floats = (attn_scratch_floats(ctx_len, m->head_dim) + 15) & ~(size_t)15;
    e->attn_scratch = xalloc(sizeof(float) * e->attn_floats * n_threads, &ok);
    e->n_phases = PHASES_PER_LAYER * m->n_layers + PHASES_EXTRA;
    e->sync = xalloc(sizeof(phase_sync) * (e->n_phases + PHASES_PER_LAYER), &ok);
    if (!ok) {
        engine_destroy(e);
        return NULL;
    }
    *status = ENGINE_OK;
    return e;
}

void engine_destroy(engine *e) {
    if (!e) return;
    threadpool_destroy(e->tp);
    big_free(e->packed, e->packed_bytes);
    big_free(e->kv, e->kv_bytes);
    big_free(e->rstate, sizeof(float) * e->rs_floats * e->num_slots * (e->rollback + 1));
    void *moe_bufs[] = {e->experts, e->mlogits, e->mn_active, e->msel, e->mpair_of, e->mw, e->mshg, e->moff, e->mactive,
                        e->mpair_row, e->mx, e->mqs, e->md, e->ms, e->mgate, e->mup, e->mout};
    for (size_t i = 0; i < sizeof(moe_bufs) / sizeof(moe_bufs[0]); i++) free(moe_bufs[i]);
    void *ssm_bufs[] = {e->rs_off, e->ssm_taps, e->ones, e->sqkv, e->sconv, e->sz, e->sb, e->sa, e->ssm_scratch, e->qg, e->qgate};
    for (size_t i = 0; i < sizeof(ssm_bufs) / sizeof(ssm_bufs[0]); i++) free(ssm_bufs[i]);
    void *bufs[] = {e->layers, e->plane_rows, e->layer_off, e->layer_rope, e->inv_freq, e->x, e->xb, e->q, e->k, e->v, e->gate, e->up, e->proj,
                    e->conv_taps, e->bcx,
                    e->aqs, e->ad, e->as, e->rope_cs, e->tokens, e->row_pos, e->row_slot, e->segs,
                    e->units, e->merges, e->parts, e->logit_src, e->attn_scratch, (void *)e->sync};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free(bufs[i]);
    free(e);
}

size_t engine_kv_bytes(const engine *e) { return e->kv_bytes; }
int engine_ring_len(const engine *e) { return e->ring_len; }
int engine_n_threads(const engine *e) { return threadpool_size(e->tp); }

int engine_workers_busy(engine *e) { return threadpool_busy(e->tp); }
int engine_moe_active(const engine *e, int layer) {
    return e->mn_active && layer >= 0 && layer < e->m.n_layers && is_moe_layer(&e->layers[layer]) ? e->mn_active[layer] : 0;
}

/* ---- KV planes --------------------------------------------------------------------------- */

static inline int is_ring(const engine *e, int layer) { return e->plane_rows[layer] != e->ctx_pad; }

static inline int is_conv(const engine *e, int layer) { return is_conv_layer(&e->m.layers[layer]); }

/* A short-convolution layer's stored conv input of position pos. */
static inline char *conv_row(const engine *e, int slot, int layer, int pos) {
    return (char *)e->kv + (size_t)slot * e->slot_bytes + e->layer_off[layer] + (size_t)pos * e->conv_row_bytes;
}

static inline char *kv_plane(const engine *e, int slot, int layer, int which, int head) {
    size_t plane = (size_t)e->plane_rows[layer] * e->kv_row;
    return (char *)e->kv + (size_t)slot * e->slot_bytes + e->layer_off[layer] + ((size_t)which * e->m.n_kv_heads + head) * plane;
}

/* The plane row of position pos in a layer. */
static inline int kv_row(const engine *e, int layer, int pos) { return pos % e->plane_rows[layer]; }

/* Bytes of a slot's first n tokens in one k plane (whole blocks) and one v plane. */
static inline size_t k_plane_bytes(const engine *e, int n) {
    return (size_t)(n + KEY_LANES - 1) / KEY_LANES * KEY_LANES * e->kv_row;
}

static inline size_t v_plane_bytes(const engine *e, int n) { return (size_t)n * e->kv_row; }

/* A ring layer's snapshot of n tokens: the rows of positions ring_lo(n) .. n-1, those a next
 * position attends to (its window before it), as [rows][head_dim] keys then values per head
 * (q8_0: rows of kv_row bytes in the v layout, keys too). */
static inline int ring_lo(const engine *e, int n) { return n - e->ring_reach > 0 ? n - e->ring_reach : 0; }

static inline int is_delta(const engine *e, int layer) { return is_state_layer(&e->m.layers[layer]); }

size_t engine_kv_snapshot_bytes(const engine *e, int n) {
    size_t total = 0;
    for (int l = 0; l < e->m.n_layers; l++)
        total += is_delta(e, l) ? 0
                 : is_conv(e, l) ? (size_t)n * e->conv_row_bytes
                               : (size_t)e->m.n_kv_heads * (is_ring(e, l) ? 2 * v_plane_bytes(e, n - ring_lo(e, n))
                                                                          : k_plane_bytes(e, n) + v_plane_bytes(e, n));
    return total;
}

/* Gather (to_ring = 0) or scatter (1) the rows of positions lo .. n-1 of one ring plane pair
 * and a [n - lo][head_dim] key buffer and value buffer. */
static void ring_rows(const engine *e, int slot, int l, int h, int lo, int n, char *keys, char *values, int to_ring) {
    const int hd = e->m.head_dim;
    const size_t elt = e->kv_elt, row = e->kv_row;
    char *kp = kv_plane(e, slot, l, 0, h), *vp = kv_plane(e, slot, l, 1, h);
    for (int p = lo; p < n; p++) {
        const int r = kv_row(e, l, p);
        char *kr = keys + (size_t)(p - lo) * row, *vr = values + (size_t)(p - lo) * row;
        if (e->kv_type == KV_Q8_0) kv_q8_key_row((uint8_t *)kp, (uint8_t *)kr, r, hd, to_ring);
        else for (int d = 0; d < hd; d++) {
            char *ring_elt = kp + key_index(r, d, hd) * elt;
            if (to_ring) memcpy(ring_elt, kr + d * elt, elt);
            else memcpy(kr + d * elt, ring_elt, elt);
        }
        if (to_ring) memcpy(vp + (size_t)r * row, vr, row);
        else memcpy(vr, vp + (size_t)r * row, row);
    }
}

/* Zero the lanes of key positions n.. in the last (partial) block of a k plane copy. */
static void clear_tail_lanes(const engine *e, char *kplane, int n) {
    if (n % KEY_LANES == 0) return;
    if (e->kv_type == KV_Q8_0) { /* per group: the lanes' scales, then per quad the lanes' 4 bytes */
        for (int g = 0; g < e->m.head_dim / KV_Q8_BLOCK; g++) {
            char *grp = kplane + kv_q8_key_group(n, g, e->m.head_dim);
            memset(grp + 2 * (n % KEY_LANES), 0, 2 * (KEY_LANES - n % KEY_LANES));
            for (int j = 0; j < KV_Q8_BLOCK; j += 4)
                memset(grp + kv_q8_key_byte(n % KEY_LANES, j), 0, 4 * (KEY_LANES - n % KEY_LANES));
        }
        return;
    }
    char *block = kplane + (size_t)(n / KEY_LANES) * KEY_LANES * e->m.head_dim * e->kv_elt;
    for (int d = 0; d < e->m.head_dim; d++)
        memset(block + ((size_t)d * KEY_LANES + n % KEY_LANES) * e->kv_elt, 0, (KEY_LANES - n % KEY_LANES) * e->kv_elt);
}

void engine_kv_read(const engine *e, int slot, int n, void *dst) {
    const size_t kb = k_plane_bytes(e, n), vb = v_plane_bytes(e, n);
    char *out = dst;
    for (int l = 0; l < e->m.n_layers; l++) {
        if (is_conv(e, l)) {
            memcpy(out, conv_row(e, slot, l, 0), (size_t)n * e->conv_row_bytes);
            out += (size_t)n * e->conv_row_bytes;
            continue;
        }
        if (is_delta(e, l)) continue;
        if (is_ring(e, l)) {
            const int lo = ring_lo(e, n);
            const size_t rb = v_plane_bytes(e, n - lo);
            for (int h = 0; h < e->m.n_kv_heads; h++, out += 2 * rb) ring_rows(e, slot, l, h, lo, n, out, out + rb, 0);
            continue;
        }
        for (int h = 0; h < e->m.n_kv_heads; h++, out += kb) {
            memcpy(out, kv_plane(e, slot, l, 0, h), kb);
            clear_tail_lanes(e, out, n); /* stale lanes past n: not part of the snapshot */
        }
        for (int h = 0; h < e->m.n_kv_heads; h++, out += vb) memcpy(out, kv_plane(e, slot, l, 1, h), vb);
    }
}

void engine_kv_write(engine *e, int slot, int n, const void *src) {
    const size_t kb = k_plane_bytes(e, n), vb = v_plane_bytes(e, n);
    const char *in = src;
    for (int l = 0; l < e->m.n_layers; l++) {
        if (is_conv(e, l)) {
            memcpy(conv_row(e, slot, l, 0), in, (size_t)n * e->conv_row_bytes);
            in += (size_t)n * e->conv_row_bytes;
            continue;
        }
        if (is_delta(e, l)) continue;
        if (is_ring(e, l)) {
            const int lo = ring_lo(e, n);
            const size_t rb = v_plane_bytes(e, n - lo);
            for (int h = 0; h < e->m.n_kv_heads; h++, in += 2 * rb)
                ring_rows(e, slot, l, h, lo, n, (char *)in, (char *)in + rb, 1);
            continue;
        }
        for (int h = 0; h < e->m.n_kv_heads; h++, in += kb) memcpy(kv_plane(e, slot, l, 0, h), in, kb);
        for (int h = 0; h < e->m.n_kv_heads; h++, in += vb) memcpy(kv_plane(e, slot, l, 1, h), in, vb);
    }
}

void engine_kv_copy(engine *e, int src, int dst, int n) {
    if (src == dst) return;
    const size_t kb = k_plane_bytes(e, n), vb = v_plane_bytes(e, n);
    for (int l = 0; l < e->m.n_layers; l++) {
        if (is_conv(e, l)) {
            memcpy(conv_row(e, dst, l, 0), conv_row(e, src, l, 0), (size_t)n * e->conv_row_bytes);
            continue;
        }
        if (is_delta(e, l)) continue;
        /* a ring is copied whole: which of its rows are valid is the pool's bookkeeping */
        const size_t ck = is_ring(e, l) ? k_plane_bytes(e, e->ring_len) : kb;
        const size_t cv = is_ring(e, l) ? v_plane_bytes(e, e->ring_len) : vb;
        for (int h = 0; h < e->m.n_kv_heads; h++) {
            memcpy(kv_plane(e, dst, l, 0, h), kv_plane(e, src, l, 0, h), ck);
            memcpy(kv_plane(e, dst, l, 1, h), kv_plane(e, src, l, 1, h), cv);
        }
    }
}

/* ---- recurrent state (DeltaNet layers) ---------------------------------------------------- */

size_t engine_state_bytes(const engine *e) { return sizeof(float) * e->rs_floats; }

static float *state_of(const engine *e, int slot, int which) {
    return e->rstate + ((size_t)slot * (e->rollback + 1) + which) * e->rs_floats;
}

void engine_state_read(const engine *e, int slot, int which, void *dst) {
    memcpy(dst, state_of(e, slot, which), engine_state_bytes(e));
}

void engine_state_write(engine *e, int slot, int which, const void *src) {
    memcpy(state_of(e, slot, which), src, engine_state_bytes(e));
}

void engine_state_copy(engine *e, int src, int which, int dst) {
    if (src == dst) return;
    memcpy(state_of(e, dst, which), state_of(e, src, which), engine_state_bytes(e));
}

/* Store one row's key and value of kv head h at position pos of a slot's planes. */
static void store_kv(engine *e, int slot, int layer, int h, int pos, const float *key, const float *value) {
    const int hd = e->m.head_dim;
    pos = kv_row(e, layer, pos);
    char *kp = kv_plane(e, slot, layer, 0, h), *vd = kv_plane(e, slot, layer, 1, h) + (size_t)pos * e->kv_row;
    if (e->kv_type == KV_Q8_0) { /* quantized as written: the key through a row buffer */
        uint8_t tmp[e->kv_row];
        kv_q8_quantize_row(tmp, key, hd);
        kv_q8_key_row((uint8_t *)kp, tmp, pos, hd, 1);
        kv_q8_quantize_row((uint8_t *)vd, value, hd);
    } else if (e->kv_f16) {
        uint16_t *kh = (uint16_t *)kp;
        uint16_t tmp[hd];
        e->kt->f32_to_f16(tmp, key, hd);
        for (int d = 0; d < hd; d++) kh[key_index(pos, d, hd)] = tmp[d];
        e->kt->f32_to_f16((uint16_t *)vd, value, hd);
    } else {
        float *kf = (float *)kp;
        for (int d = 0; d < hd; d++) kf[key_index(pos, d, hd)] = key[d];
        memcpy(vd, value, sizeof(float) * hd);
    }
}

/* ---- one step ---------------------------------------------------------------------------- */

/* Phase p's work is n units; any thread grabs the next unit, and everyone leaves the phase once
 * all n are done (threadpool.h: any subset of threads completes a task). */
static inline int grab(engine *e, int p, int n) {
    unsigned u = atomic_fetch_add(&e->sync[p].next, 1);
    return u < (unsigned)n ? (int)u : -1;
}

static inline void unit_done(engine *e, int p) { threadpool_count_add(e->tp, &e->sync[p].done); }

static inline void phase_end(engine *e, int p, int n) { threadpool_count_wait(e->tp, &e->sync[p].done, (unsigned)n); }

#define FOR_EACH_UNIT(e, p, n, u) for (int u; ((u) = grab((e), (p), (n))) >= 0; unit_done((e), (p)))

/* Rows per unit of a row-wise phase over n_rows rows: single rows while that leaves a thread
 * idle (a decode step of a few slots), ROWS_PER_UNIT otherwise. */
static inline int rows_per_unit(int n_rows) { return n_rows < 16 * ROWS_PER_UNIT ? 1 : ROWS_PER_UNIT; }

static inline int n_row_units(int n_rows) { return (n_rows + rows_per_unit(n_rows) - 1) / rows_per_unit(n_rows); }

static inline void unit_rows(int u, int n_rows, int *r0, int *r1) {
    const int per = rows_per_unit(n_rows);
    *r0 = u * per;
    *r1 = *r0 + per < n_rows ? *r0 + per : n_rows;
}

/* Row r of the float matmul input `in` [n][k] -> the quantized input. */
static inline void quantize_row(engine *e, const float *in, int k, int r) {
    e->kt->quantize_q8a(e->aqs + (size_t)r * k, e->ad + (size_t)r * (k / QK), e->as + (size_t)r * (k / QK),
                        in + (size_t)r * k, k);
}

static act_rows input_view(const engine *e, const float *f, int k) {
    act_rows a = {f, e->aqs, e->ad, e->as, k};
    return a;
}

/* Output rows per dynamic matmul unit: a multiple of two ROW_GROUPs, about CHUNKS_PER_THREAD units
 * per thread (PAIRED_CHUNKS_PER_THREAD from PAIRED_ROWS rows), and at least MIN_GEMM_CHUNK.
 * NOTE: whole pairs of groups at every row count: the 512-bit kernels of a decode step
 * (arch/x86_vnni_rows.c) and of prefill (x86_gemm_z16.h) run two groups a vector, and a unit's
 * odd last group costs them as much as a pair (a chunk of 7 groups did the work of 8). */
static int gemm_chunk(const mm_job *jobs, int n_jobs, int nth, int n_rows) {
    const int align = 2 * ROW_GROUP;
    int total = 0;
    for (int j = 0; j < n_jobs; j++) total += jobs[j].w->n_out;
    const int per_thread = n_rows >= PAIRED_ROWS ? PAIRED_CHUNKS_PER_THREAD : CHUNKS_PER_THREAD;
    int chunk = (total / (nth * per_thread) + align - 1) / align * align;
    return chunk < MIN_GEMM_CHUNK ? MIN_GEMM_CHUNK : chunk;
}

static inline int group_pad(int n) { return (n + ROW_GROUP - 1) / ROW_GROUP * ROW_GROUP; }

/* Rows [a, b) (multiples of ROW_GROUP) of the jobs' outputs laid end to end, each job's padded to
 * whole groups (so every call starts on a group, kernels.h), as one call per job they cover. */
static void mm_span(engine *e, const mm_job *jobs, int n_jobs, int a, int b, const act_rows *x, int n_rows) {
    int base = 0;
    for (int j = 0; j < n_jobs && base < b; j++) {
        const weight_t *w = jobs[j].w;
        const int o0 = a > base ? a - base : 0, o1 = b - base < w->n_out ? b - base : w->n_out;
        if (o0 < o1) e->kt->gemm[w->type](jobs[j].y, jobs[j].ldy, w, o0, o1, x, n_rows, jobs[j].accumulate);
        base += group_pad(w->n_out);
    }
}

/* A decode step's matmul phase (fewer than PAIRED_ROWS rows) streams: each thread's first unit
 * is one contiguous STREAM_PCT% / nth of the phase's output rows (the jobs' outputs laid end to
 * end), so most of the weights stream front to back as one run a thread; the rest goes in
 * STREAM_TAIL_CHUNKS small units a thread, taken by whichever thread is free (balance). Eight
 * units a thread of the general cut restarted the prefetchers eight times a matrix (measured:
 * lfm2-350m decode +12% tokens/s, docs/benchmarks.md); from 2 rows the cut is in whole pairs of
 * row groups (the 512-bit decode kernels run two groups a vector: gemm_chunk's NOTE). */
static void stream_phase(engine *e, int p, const mm_job *jobs, int n_jobs, const act_rows *x, int n_rows, int nth) {
    const int align = n_rows == 1 ? ROW_GROUP : 2 * ROW_GROUP;
    int total = 0;
    for (int j = 0; j < n_jobs; j++) total += group_pad(jobs[j].w->n_out);
    const int big = total * STREAM_PCT / 100 / (nth * align) * align, rest = total - nth * big;
    int small = (rest / (nth * STREAM_TAIL_CHUNKS) + align - 1) / align * align;
    if (small < MIN_GEMM_CHUNK) small = MIN_GEMM_CHUNK;
    const int n = nth + (rest + small - 1) / small;
    FOR_EACH_UNIT(e, p, n, u) {
        const int a = u < nth ? u * big : nth * big + (u - nth) * small, len = u < nth ? big : small;
        mm_span(e, jobs, n_jobs, a, a + len < total ? a + len : total, x, n_rows);
    }
    phase_end(e, p, n);
}

static void matmul_phase(engine *e, int p, const mm_job *jobs, int n_jobs, const act_rows *x, int n_rows, int nth) {
    if (n_rows < PAIRED_ROWS) {
        stream_phase(e, p, jobs, n_jobs, x, n_rows, nth);
        return;
    }
    const int chunk = gemm_chunk(jobs, n_jobs, nth, n_rows);
    int n = 0;
    for (int j = 0; j < n_jobs; j++) n += (jobs[j].w->n_out + chunk - 1) / chunk;
    FOR_EACH_UNIT(e, p, n, u) {
        int j = 0, rest = u;
        for (; j < n_jobs; j++) {
            int units = (jobs[j].w->n_out + chunk - 1) / chunk;
            if (rest < units) break;
            rest -= units;
        }
        const weight_t *w = jobs[j].w;
        int o0 = rest * chunk, o1 = o0 + chunk < w->n_out ? o0 + chunk : w->n_out;
        e->kt->gemm[w->type](jobs[j].y, jobs[j].ldy, w, o0, o1, x, n_rows, jobs[j].accumulate);
    }
    phase_end(e, p, n);
}

static inline size_t part_floats(const engine *e, int n_q) {
    return (size_t)n_q * e->group * (e->m.head_dim + 2); /* acc [n_q][group*hd], ml [n_q*group][2] */
}

static void attention_phase(engine *e, int p, int layer, int ith) {
    const model_desc *m = &e->m;
    float *scratch = e->attn_scratch + (size_t)ith * e->attn_floats;
    const float scale = m->attn_scale;
    const int window = m->layers[layer].window;
    const int lda = e->group * m->head_dim;
    FOR_EACH_UNIT(e, p, e->n_units, u) {
        const attn_unit *au = &e->units[u];
        const step_seg *sg = &e->segs[au->seg];
        int row = sg->row0 + au->q0;
        int col = au->kv_head * lda;
        const float *q = e->q + (size_t)row * e->q_dim + col;
        const void *k = kv_plane(e, sg->slot, layer, 0, au->kv_head), *v = kv_plane(e, sg->slot, layer, 1, au->kv_head);
        const int ring = is_ring(e, layer) ? e->ring_len : 0;
        if (au->chunk < 0) {
            attention_rows_ring(e->kt, e->xb + (size_t)row * e->q_dim + col, e->q_dim, q, e->q_dim, k, v, e->kv_type,
                                sg->pos0 + au->q0, au->n_q, e->group, m->head_dim, scale, window, ring, scratch);
        } else {
            /* a ring: the chunk's keys sit shift positions lower (see top) */
            const int shift = ring ? au->chunk * ATTN_CHUNK / ring * ring : 0;
            float *acc = e->parts + au->part, *ml = acc + (size_t)au->n_q * lda;
            e->kt->attention_chunk(acc, lda, ml, q, e->q_dim, k, v, e->kv_type, sg->pos0 + au->q0 - shift, au->n_q,
                                   e->group, m->head_dim, scale, window, au->chunk - shift / ATTN_CHUNK, scratch);
        }
    }
    phase_end(e, p, e->n_units);
}

/* Fold split attention's partial states in chunk order (as attention_rows does) and finish. */
static void merge_phase(engine *e, int p) {
    const int lda = e->group * e->m.head_dim;
    FOR_EACH_UNIT(e, p, e->n_merges, u) {
        const attn_unit *mu = &e->merges[u];
        const step_seg *sg = &e->segs[mu->seg];
        const size_t step = part_floats(e, mu->n_q);
        float *acc = e->parts + mu->part, *ml = acc + (size_t)mu->n_q * lda;
        for (int c = 1; c < mu->n_parts; c++) {
            const float *pacc = acc + c * step, *pml = pacc + (size_t)mu->n_q * lda;
            e->kt->attention_fold(acc, lda, ml, pacc, lda, pml, mu->n_q, e->group, e->m.head_dim);
        }
        int row = sg->row0 + mu->q0;
        attention_finish(e->xb + (size_t)row * e->q_dim + mu->kv_head * lda, e->q_dim, acc, lda, ml, mu->n_q,
                         e->group, e->m.head_dim);
    }
    phase_end(e, p, e->n_merges);
}

/* x += proj * residual_scale of one row: granite's scaled residual add of the block before, done
 * by the phase that reads x next (a norm) instead of a phase of its own (see top) */
static inline void add_scaled_proj(engine *e, int r) {
    const int dim = e->m.dim;
    const float rs = e->m.residual_scale, *pr = e->proj + (size_t)r * dim;
    float *xr = e->x + (size_t)r * dim;
    for (int i = 0; i < dim; i++) xr[i] += pr[i] * rs;
}

/* rows: out = rmsnorm(x) * w, quantized when the next matmuls need it; add_proj: first the
 * scaled residual add the block before left in proj (add_scaled_proj) */
static void norm_phase(engine *e, int p, const float *w, int quantize, int add_proj) {
    const int dim = e->m.dim, nu = n_row_units(e->n_rows);
    FOR_EACH_UNIT(e, p, nu, u) {
        int r0, r1;
        unit_rows(u, e->n_rows, &r0, &r1);
        for (int r = r0; r < r1; r++) {
            if (add_proj) add_scaled_proj(e, r);
            e->kt->rmsnorm(e->xb + (size_t)r * dim, e->x + (size_t)r * dim, w, dim, e->m.rms_eps);
            if (quantize) quantize_row(e, e->xb, dim, r);
        }
    }
    phase_end(e, p, nu);
}

/* rows: x += rmsnorm(proj) * w (a post-norm before the residual add; gemma3) */
static void post_norm_phase(engine *e, int p, const float *w) {
    const int dim = e->m.dim, nu = n_row_units(e->n_rows);
    FOR_EACH_UNIT(e, p, nu, u) {
        int r0, r1;
        unit_rows(u, e->n_rows, &r0, &r1);
        for (int r = r0; r < r1; r++) {
            float *pr = e->proj + (size_t)r * dim, *xr = e->x + (size_t)r * dim;
            e->kt->rmsnorm(pr, pr, w, dim, e->m.rms_eps);
            for (int i = 0; i < dim; i++) xr[i] += pr[i];
        }
    }
    phase_end(e, p, nu);
}

/* Where a block's output matmul writes: straight into the residual stream, or into proj for a
 * post-norm (the block's last phase adds it) or a residual scale (the next norm phase adds it). */
static inline int output_via_proj(const engine *e, const float *post_norm) {
    return post_norm != NULL || e->m.residual_scale != 1.0f;
}

/* The last phase of a block whose output went to proj (output_via_proj): the post-norm's; with a
 * residual scale, nothing (the output waits in proj for the next norm phase). */
static inline void block_residual_phase(engine *e, int p, const float *post_norm) {
    if (post_norm) post_norm_phase(e, p, post_norm);
}

/* Whether a norm phase must first add the scaled output the block before it left in proj: the
 * attention and Mamba2 blocks and the dense FFN leave it with a residual scale and no post-norm
 * (the short-convolution, DeltaNet and MoE blocks add into x themselves). A pure function of the
 * model, so every thread takes the same branch. */
static inline int mixer_leaves_proj(const engine *e, const layer_weights *L) {
    return e->m.residual_scale != 1.0f && !L->post_attn_norm && !is_conv_layer(L) && !is_delta_layer(L);
}

static inline int ffn_leaves_proj(const engine *e, const layer_weights *L) {
    return e->m.residual_scale != 1.0f && !L->post_ffn_norm && !is_moe_layer(L);
}

/* before layer l's first norm (l == n_layers: the logits' norm) */
static inline int proj_before_layer(const engine *e, int l) { return l > 0 && ffn_leaves_proj(e, &e->m.layers[l - 1]); }

/* One row's q, k, v after the matmuls: biases, per-head norms, rope, then the KV store. */
static void qkv_row(engine *e, const layer_weights *L, int l, int r) {
    const model_desc *m = &e->m;
    const kernel_table *kt = e->kt;
    const int hd = m->head_dim;
    float *q = e->q + (size_t)r * e->q_dim, *k = e->k + (size_t)r * e->kv_dim, *v = e->v + (size_t)r * e->kv_dim;
    if (m->q_gate) /* per head: hd queries, then hd gate values */
        for (int h = 0; h < m->n_heads; h++) {
            const float *src = e->qg + (size_t)r * 2 * e->q_dim + (size_t)h * 2 * hd;
            memcpy(q + h * hd, src, sizeof(float) * hd);
            memcpy(e->qgate + (size_t)r * e->q_dim + h * hd, src + hd, sizeof(float) * hd);
        }
    if (L->bq)
        for (int i = 0; i < e->q_dim; i++) q[i] += L->bq[i];
    if (L->bk)
        for (int i = 0; i < e->kv_dim; i++) k[i] += L->bk[i];
    if (L->bv)
        for (int i = 0; i < e->kv_dim; i++) v[i] += L->bv[i];
    if (L->q_norm && m->qk_norm_full) {
        kt->rmsnorm(q, q, L->q_norm, m->n_heads * hd, m->rms_eps);
        kt->rmsnorm(k, k, L->k_norm, m->n_kv_heads * hd, m->rms_eps);
    } else if (L->q_norm) {
        for (int h = 0; h < m->n_heads; h++) kt->rmsnorm(q + h * hd, q + h * hd, L->q_norm, hd, m->rms_eps);
        for (int h = 0; h < m->n_kv_heads; h++) kt->rmsnorm(k + h * hd, k + h * hd, L->k_norm, hd, m->rms_eps);
    }
    const float *cs = e->rope_cs + ((size_t)e->layer_rope[l] * e->max_tokens + r) * hd;
    if (m->no_rope) {
        /* granite 4.0 H: no positions in attention (the Mamba2 layers carry the order) */
    } else if (m->rope_dim && m->rope_dim < hd) { /* partial: the first rope_dim dims of each head */
        for (int h = 0; h < m->n_heads; h++) kt->rope_neox(q + h * hd, 1, m->rope_dim, cs);
        for (int h = 0; h < m->n_kv_heads; h++) kt->rope_neox(k + h * hd, 1, m->rope_dim, cs);
    } else if (m->rope_mode == ROPE_NEOX) {
        kt->rope_neox(q, m->n_heads, hd, cs);
        kt->rope_neox(k, m->n_kv_heads, hd, cs);
    } else {
        kt->rope(q, m->n_heads, hd, cs);
        kt->rope(k, m->n_kv_heads, hd, cs);
    }
    for (int h = 0; h < m->n_kv_heads; h++) store_kv(e, e->row_slot[r], l, h, e->row_pos[r], k + h * hd, v + h * hd);
}

/* The attention block of layer l: its 8 phases from p on (see top). Returns the next
 * phase, or -1 when the test hook fired (after the layer stored its KV rows). */
static int attention_block(engine *e, const layer_weights *L, int l, int p, int ith, int nth) {
    const int T = e->n_rows, dim = e->m.dim, nu = n_row_units(T);
    norm_phase(e, p++, L->attn_norm,
               is_block_type(L->attn_q.type) || is_block_type(L->attn_k.type) || is_block_type(L->attn_v.type),
               proj_before_layer(e, l));
    {
        mm_job jobs[3] = {{&L->attn_q, e->m.q_gate ? e->qg : e->q, e->m.q_gate ? 2 * e->q_dim : e->q_dim, 0},
                          {&L->attn_k, e->k, e->kv_dim, 0},
                          {&L->attn_v, e->v, e->kv_dim, 0}};
        act_rows in = input_view(e, e->xb, dim);
        matmul_phase(e, p++, jobs, 3, &in, T, nth);
    }
    FOR_EACH_UNIT(e, p, nu, u) {
        int r0, r1;
        unit_rows(u, T, &r0, &r1);
        for (int r = r0; r < r1; r++) qkv_row(e, L, l, r);
    }
    phase_end(e, p++, nu);
    if (l == e->fault_layer) return -1; /* test hook */
    attention_phase(e, p++, l, ith);
    merge_phase(e, p++);
    if (is_block_type(L->attn_output.type) || e->m.q_gate) {
        FOR_EACH_UNIT(e, p, nu, u) {
            int r0, r1;
            unit_rows(u, T, &r0, &r1);
            for (int r = r0; r < r1; r++) {
                if (e->m.q_gate) { /* attention output * sigmoid(gate) */
                    float *o = e->xb + (size_t)r * e->q_dim;
                    const float *g = e->qgate + (size_t)r * e->q_dim;
                    for (int i = 0; i < e->q_dim; i++) o[i] *= 1.0f / (1.0f + expf(-g[i]));
                }
                if (is_block_type(L->attn_output.type)) quantize_row(e, e->xb, e->q_dim, r);
            }
        }
        phase_end(e, p, nu);
    }
    p++;
    {
        /* without a post-norm the output adds straight into the residual stream */
        const int via = output_via_proj(e, L->post_attn_norm);
        mm_job job = {&L->attn_output, via ? e->proj : e->x, dim, !via};
        act_rows in = input_view(e, e->xb, e->q_dim);
        matmul_phase(e, p++, &job, 1, &in, T, nth);
    }
    block_residual_phase(e, p, L->post_attn_norm);
    p++;
    return p;
}

/* A short-convolution block (lfm2) in the attention block's phases (see top). */
static int conv_block(engine *e, const layer_weights *L, int l, int p, int nth) {
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

/* One job's output chunk of a matmul unit list (as matmul_phase cuts it). */
static void mm_unit(engine *e, const mm_job *jobs, int n_jobs, int chunk, int u, const act_rows *x, int n_rows) {
    int j = 0;
    for (; j < n_jobs; j++) {
        const int units = (jobs[j].w->n_out + chunk - 1) / chunk;
        if (u < units) break;
        u -= units;
    }
    const weight_t *w = jobs[j].w;
    const int o0 = u * chunk, o1 = o0 + chunk < w->n_out ? o0 + chunk : w->n_out;
    e->kt->gemm[w->type](jobs[j].y, jobs[j].ldy, w, o0, o1, x, n_rows, jobs[j].accumulate);
}

static int mm_units(const mm_job *jobs, int n_jobs, int chunk) {
    int n = 0;
    for (int j = 0; j < n_jobs; j++) n += (jobs[j].w->n_out + chunk - 1) / chunk;
    return n;
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
static int moe_block(engine *e, const layer_weights *L, int l, int p, int nth) {
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

/* The state entries token j of segment sg reads and writes (engine.h): the one of its length and
 * the one of the next, except that a length before the segment's last rollback + 1 is held in
 * the entry the segment started from (updated in place: a long prefill writes only the entries
 * of the lengths it keeps). */
static inline void state_entries(const engine *e, const step_seg *sg, int j, int *from, int *to) {
    const int k1 = e->rollback + 1, pos = sg->pos0 + j, keep = sg->pos0 + sg->n - e->rollback;
    *from = pos < keep ? sg->pos0 % k1 : pos % k1;
    *to = pos + 1 < keep ? sg->pos0 % k1 : (pos + 1) % k1;
}

/* A Gated DeltaNet block (qwen35) in the attention block's phases from p on (see top). Returns the
 * next phase, or -1 when the test hook fired (before any state changed). */
static int delta_block(engine *e, const layer_weights *L, int l, int p, int ith, int nth) {
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
    /* conv: segment x channel block, tokens in position order through the slot's tail */
    const int n_cb = (cd + CONV_BLOCK - 1) / CONV_BLOCK;
    const float *w = e->ssm_taps + (size_t)l * taps * cd;
    FOR_EACH_UNIT(e, p, e->n_segs * n_cb, u) {
        const step_seg *sg = &e->segs[u / n_cb];
        const int c0 = (u % n_cb) * CONV_BLOCK, n = cd - c0 < CONV_BLOCK ? cd - c0 : CONV_BLOCK;
        for (int j = 0; j < sg->n; j++) {
            const int r = sg->row0 + j;
            int from, to;
            state_entries(e, sg, j, &from, &to);
            if (c0 == 0) /* the row's gates: alpha -> the decay exp(g), beta -> sigmoid(beta) */
                kt->gdn_gates(e->sa + (size_t)r * vh, e->sb + (size_t)r * vh, L->ssm_dt, L->ssm_a, vh);
            const size_t off = e->rs_off[l] + c0;
            float *out = e->sconv + (size_t)r * cd + c0;
            kt->ssm_conv(out, state_of(e, sg->slot, to) + off, state_of(e, sg->slot, from) + off,
                         e->sqkv + (size_t)r * cd + c0, w + c0, taps, n, cd);
            kt->silu_mul(out, out, e->ones, n);
        }
    }
    phase_end(e, p++, e->n_segs * n_cb);
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
static int mamba_block(engine *e, const layer_weights *L, int l, int p, int nth) {
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
    /* conv: segment x channel block over x, B, C, tokens in position order through the tail,
     * + bias, silu; the first block's unit also takes each row's dt to its step and decay */
    const int n_cb = (cd + CONV_BLOCK - 1) / CONV_BLOCK;
    const float *w = e->ssm_taps + (size_t)l * taps * cd;
    FOR_EACH_UNIT(e, p, e->n_segs * n_cb, u) {
        const step_seg *sg = &e->segs[u / n_cb];
        const int c0 = (u % n_cb) * CONV_BLOCK, n = cd - c0 < CONV_BLOCK ? cd - c0 : CONV_BLOCK;
        for (int j = 0; j < sg->n; j++) {
            const int r = sg->row0 + j;
            int from, to;
            state_entries(e, sg, j, &from, &to);
            const float *row = e->sqkv + (size_t)r * ld;
            if (c0 == 0) {
                memcpy(e->sa + (size_t)r * H, row + inner + cd, sizeof(float) * H);
                mamba2_gates(e->sa + (size_t)r * H, e->sb + (size_t)r * H, L->mamba_dt, L->mamba_a, H);
            }
            const size_t off = e->rs_off[l] + c0;
            float *out = e->sconv + (size_t)r * cd + c0;
            kt->ssm_conv(out, state_of(e, sg->slot, to) + off, state_of(e, sg->slot, from) + off, row + inner + c0, w + c0,
                         taps, n, cd);
            for (int c = 0; c < n; c++) out[c] += L->mamba_conv_b[c0 + c];
            kt->silu_mul(out, out, e->ones, n);
        }
    }
    phase_end(e, p++, e->n_segs * n_cb);
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

/* The dense feed-forward block of layer l: its 5 phases from p on, then MOE_EXTRA_PHASES empty
 * ones (see top). */
static int ffn_block(engine *e, const layer_weights *L, int p, int nth) {
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

static void step_worker(void *ctx, int ith, int nth) {
    engine *e = ctx;
    const model_desc *m = &e->m;
    const kernel_table *kt = e->kt;
    const int T = e->n_rows, dim = m->dim, hd = m->head_dim, nu = n_row_units(T);
    int p = 0; /* phase index: every thread walks the same sequence */

    /* embed rows (scaled); rope angles of each row's position in every rope table */
    const size_t embd_row = ggml_row_bytes(m->token_embd.type, dim);
    FOR_EACH_UNIT(e, p, nu, u) {
        int r0, r1;
        unit_rows(u, T, &r0, &r1);
        for (int r = r0; r < r1; r++) {
            float *xr = e->x + (size_t)r * dim;
            kt->dequantize_row[m->token_embd.type](xr, (const char *)m->token_embd.rows + (size_t)e->tokens[r] * embd_row, dim);
            if (m->embed_scale != 1.0f)
                for (int i = 0; i < dim; i++) xr[i] *= m->embed_scale;
            for (int t = 0; t < e->n_rope; t++) {
                float *cs = e->rope_cs + ((size_t)t * e->max_tokens + r) * hd;
                const double *f = e->inv_freq + (size_t)t * (hd / 2);
                for (int i = 0; i < hd / 2; i++) {
                    double theta = (double)e->row_pos[r] * f[i];
                    cs[2 * i] = (float)cos(theta);
                    cs[2 * i + 1] = (float)sin(theta);
                }
            }
        }
    }
    phase_end(e, p++, nu);

    for (int l = 0; l < m->n_layers; l++) {
        const layer_weights *L = &m->layers[l];
        p = is_conv_layer(L)    ? conv_block(e, L, l, p, nth)
            : is_delta_layer(L) ? delta_block(e, L, l, p, ith, nth)
            : is_mamba_layer(L) ? mamba_block(e, L, l, p, nth)
                                : attention_block(e, L, l, p, ith, nth);
        if (p < 0) return; /* test hook: every thread leaves at the same point */
        p = is_moe_layer(L) ? moe_block(e, L, l, p, nth) : ffn_block(e, L, p, nth);
        /* NOTE: the phase count is checked at every layer's end, while the spare counters past
         * n_phases still absorb a miscount; every thread takes the same branch and leaves. */
        if (p != 1 + (l + 1) * PHASES_PER_LAYER) {
            if (ith == 0) e->phases_run = -1;
            return;
        }
    }

    /* logits of the requested rows only */
    const int nl = e->n_logits, nlu = n_row_units(nl);
    FOR_EACH_UNIT(e, p, nlu, u) {
        int i0, i1;
        unit_rows(u, nl, &i0, &i1);
        for (int i = i0; i < i1; i++) {
            if (proj_before_layer(e, m->n_layers)) add_scaled_proj(e, e->logit_src[i]);
            kt->rmsnorm(e->xb + (size_t)i * dim, e->x + (size_t)e->logit_src[i] * dim, m->output_norm, dim, m->rms_eps);
            if (is_block_type(m->output.type)) quantize_row(e, e->xb, dim, i);
        }
    }
    phase_end(e, p++, nlu);
    if (nl > 0) {
        mm_job job = {&m->output, e->logits_out, m->n_vocab, 0};
        act_rows in = input_view(e, e->xb, dim);
        matmul_phase(e, p, &job, 1, &in, nl, nth);
    }
    p++;
    if (ith == 0) e->phases_run = p;
}

/* Fill the step's attention units: segment x kv head x query tile, latest tiles first (they
 * see the most keys) so dynamic scheduling ends balanced. With few units (decode), each unit
 * is split into one unit per key chunk plus a merge unit, so every thread streams KV. */
static void plan_attention(engine *e) {
    const int q_tile = ATTN_MAX_ROWS / e->group, nth = threadpool_size(e->tp);
    e->n_units = e->n_merges = 0;
    for (int s = 0; s < e->n_segs; s++) {
        int n_tiles = (e->segs[s].n + q_tile - 1) / q_tile;
        for (int t = n_tiles - 1; t >= 0; t--)
            for (int h = 0; h < e->m.n_kv_heads; h++) {
                attn_unit *u = &e->units[e->n_units++];
                u->seg = s;
                u->kv_head = h;
                u->q0 = t * q_tile;
                u->n_q = e->segs[s].n - u->q0 < q_tile ? e->segs[s].n - u->q0 : q_tile;
                u->chunk = -1;
                u->n_parts = 0;
            }
    }
    if (e->n_units >= SPLIT_BELOW_UNITS * nth || nth == 1) return;
    /* split: count the parts first; keep whole units if they do not fit */
    size_t need = 0;
    int n_split = 0;
    for (int i = 0; i < e->n_units; i++) {
        const attn_unit *u = &e->units[i];
        int n_chunks = (e->segs[u->seg].pos0 + u->q0 + u->n_q + ATTN_CHUNK - 1) / ATTN_CHUNK;
        need += (size_t)n_chunks * part_floats(e, u->n_q);
        /* NOTE: one plan serves every layer: on sliding-window layers the units of chunks
         * before the window yield empty states at once (and the fold skips them). */
        n_split += n_chunks;
    }
    if (need > PART_FLOATS || n_split > e->max_units) return;
    int n_whole = e->n_units;
    memcpy(e->merges, e->units, sizeof(attn_unit) * n_whole);
    e->n_units = 0;
    size_t at = 0;
    for (int i = 0; i < n_whole; i++) {
        attn_unit *mu = &e->merges[i];
        int n_chunks = (e->segs[mu->seg].pos0 + mu->q0 + mu->n_q + ATTN_CHUNK - 1) / ATTN_CHUNK;
        mu->part = at;
        mu->n_parts = n_chunks;
        for (int c = 0; c < n_chunks; c++) {
            attn_unit *u = &e->units[e->n_units++];
            *u = *mu;
            u->chunk = c;
            u->part = at;
            at += part_floats(e, mu->n_q);
        }
    }
    e->n_merges = n_whole;
}

int engine_forward(engine *e, const engine_item *items, int n_items, float *logits, int fault_layer) {
    for (int i = 0; i < n_items; i++) {
        const engine_item *it = &items[i];
        /* NOTE: n_tokens > ctx_len - start_pos, not start_pos + n_tokens > ctx_len: the sum can
         * overflow int and wrap into range. */
        if (it->slot < 0 || it->slot >= e->num_slots || it->n_tokens < 1 || it->start_pos < 0 ||
            it->start_pos > e->ctx_len || it->n_tokens > e->ctx_len - it->start_pos ||
            it->want_logits < 0 || it->want_logits > it->n_tokens)
            return ENGINE_EINVAL;
        for (int j = 0; j < it->n_tokens; j++)
            if (it->tokens[j] < 0 || it->tokens[j] >= e->m.n_vocab) return ENGINE_EINVAL;
    }
    int item = 0, offset = 0, logit_base = 0;
    int first_step = 1;
    while (item < n_items) {
        /* gather the next step: up to max_tokens rows, whole segments where they fit */
        e->n_rows = e->n_segs = e->n_logits = 0;
        while (item < n_items && e->n_rows < e->max_tokens) {
            const engine_item *it = &items[item];
            int take = it->n_tokens - offset;
            if (take > e->max_tokens - e->n_rows) take = e->max_tokens - e->n_rows;
            step_seg *sg = &e->segs[e->n_segs++];
            sg->slot = it->slot;
            sg->pos0 = it->start_pos + offset;
            sg->n = take;
            sg->row0 = e->n_rows;
            /* the item's last want_logits rows get logits rows, in order (a verified draft) */
            const int first_logit = it->n_tokens - it->want_logits;
            for (int j = 0; j < take; j++) {
                int r = e->n_rows + j;
                e->tokens[r] = it->tokens[offset + j];
                e->row_pos[r] = sg->pos0 + j;
                e->row_slot[r] = it->slot;
                if (offset + j >= first_logit) e->logit_src[e->n_logits++] = r;
            }
            e->n_rows += take;
            offset += take;
            if (offset == it->n_tokens) {
                item++;
                offset = 0;
            }
        }
        for (int s = 0; s < e->n_segs; s++) /* a slot's first token starts from a zero state */
            if (e->rs_floats && e->segs[s].pos0 == 0) memset(state_of(e, e->segs[s].slot, 0), 0, engine_state_bytes(e));
        plan_attention(e);
        e->logits_out = logits + (size_t)logit_base * e->m.n_vocab;
        e->fault_layer = first_step ? fault_layer : -1;
        for (int c = 0; c < e->n_phases + PHASES_PER_LAYER; c++) {
            atomic_store(&e->sync[c].next, 0);
            atomic_store(&e->sync[c].done, 0);
        }
        e->phases_run = 0;
        threadpool_run(e->tp, step_worker, e);
        /* NOTE: the caller's walk ends when every phase's units are done, but a worker that
         * lost the CPU may still be walking the step: it finds every unit taken, yet it reads
         * the step's fields to count each phase's units and bumps the phase counters. Waiting
         * only before the next step sufficed while engine_forward alone writes what a count
         * reads; a count read from anything changed between calls (a tunable, a slot's state)
         * could exceed the step's, and the worker would run a unit past the end (into the
         * returned logits) and wait forever for the rest. So no worker touches e once
         * engine_forward returns (tests/engine/test_engine_threads.py). */
        threadpool_wait_idle(e->tp);
        if (e->fault_layer >= 0 && e->fault_layer < e->m.n_layers) return ENGINE_EFAULT;
        /* thread 0 is this thread: it wrote phases_run at its walk's end */
        if (e->phases_run != e->n_phases) return ENGINE_EINTERNAL;
        if (e->m.logit_scale != 0.0f && e->m.logit_scale != 1.0f) { /* granite: logits / logit_scale, as 1 / s * logit */
            const float inv = 1.0f / e->m.logit_scale;
            float *lg = e->logits_out;
            for (size_t i = 0; i < (size_t)e->n_logits * e->m.n_vocab; i++) lg[i] *= inv;
        }
        logit_base += e->n_logits;
        first_step = 0;
    }
    return ENGINE_OK;
}
