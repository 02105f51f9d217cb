/* What the engine's C files share (not a public boundary: engine.h is): the tunables, struct
 * engine and the step's types, the layer predicates, the addresses of a slot's memory, the
 * phase helpers every block uses, and the functions one file defines for another.
 *
 * Design: engine.c drives a forward call (steps, one thread's walk of a step's phases); each
 * kind of block walks its phases in its own file, and the engine's memory has its own files:
 *
 *   engine.c            engine_forward: steps, the phase walk (step_worker), logits
 *   engine_attention.c  attention blocks: q/k/v, rope, the KV store, attention units and plan
 *   engine_conv.c       lfm2's short-convolution blocks
 *   engine_recurrent.c  Gated DeltaNet (qwen35) and Mamba2 (granitehybrid) blocks, their buffers
 *   engine_ffn.c        dense and mixture-of-experts FFN blocks, the experts' slices and buffers
 *   engine_phases.c     the matmul, norm and post-norm phases the blocks share
 *   engine_model.c      which model descriptions the engine accepts
 *   engine_create.c     engine_create / engine_destroy: every buffer, allocated once
 *   engine_pack.c       block-type weights repacked into row groups at load
 *   engine_kv.c         a slot's memory (KV planes, rings, conv rows, recurrent states) and its
 *                       snapshot, restore and copy
 *
 * NOTE: the helpers a step calls per row or unit are static inline here, so each file inlines
 * them as the single engine.c did; every file is compiled with the same flags (setup.py).
 */
#ifndef SLOTSERVE_ENGINE_INTERNAL_H
#define SLOTSERVE_ENGINE_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "threadpool.h"

/* NOTE: what this header declares is hidden: the extension's own calls between its files, not
 * exported from it (and called directly, not through the PLT). */
#if defined(__GNUC__)
#pragma GCC visibility push(hidden)
#endif

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
#define MAX_CONV_LEN 16          /* longest short convolution (lfm2 uses 3) */

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
    int ring_len;             /* rows of a sliding-window layer's planes; 0: no rings (engine_kv.c) */
    int ring_reach;           /* widest window - 1: rows before a position a ring must still hold */
    int *plane_rows;          /* [n_layers] rows per plane: ctx_pad, or ring_len for ring layers */
    size_t *layer_off;        /* [n_layers] byte offset of each layer in a slot's block */
    size_t slot_bytes;        /* bytes of one slot's KV block */
    void *kv;                 /* [num_slots][slot_bytes] per layer [2][n_kv_heads][plane_rows * head_dim] */
    size_t kv_bytes;
    int n_rope;               /* distinct rope tables (one per distinct layer rope_base) */
    int *layer_rope;          /* [n_layers] rope table of each layer */
    double *inv_freq;         /* [n_rope][head_dim/2]: rope_base^(-2i/rope_dim) / rope_freqs[i] (0 past rope_dim/2) */

    /* Gated DeltaNet (qwen35; engine_recurrent.c) */
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

/* ---- layers -------------------------------------------------------------------------------- */

/* Block types multiply 8-bit quantized activations (float types: F32, F16, BF16 read floats). */
static inline int is_block_type(int type) { return ggml_block_elems(type) > 0; }

static inline int is_conv_layer(const layer_weights *L) { return L->conv_in.rows != NULL; }
static inline int is_delta_layer(const layer_weights *L) { return L->ssm_qkv.rows != NULL; }
static inline int is_mamba_layer(const layer_weights *L) { return L->mamba_in.rows != NULL; }
/* A layer with a recurrent state and no rows per position (DeltaNet, Mamba2). */
static inline int is_state_layer(const layer_weights *L) { return is_delta_layer(L) || is_mamba_layer(L); }

static inline int is_moe_layer(const layer_weights *L) { return L->moe_router.rows != NULL; }

/* ---- a slot's memory (engine_kv.c) --------------------------------------------------------- */

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

static inline int is_delta(const engine *e, int layer) { return is_state_layer(&e->m.layers[layer]); }

static inline float *state_of(const engine *e, int slot, int which) {
    return e->rstate + ((size_t)slot * (e->rollback + 1) + which) * e->rs_floats;
}

/* ---- phases -------------------------------------------------------------------------------- */

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

static inline act_rows input_view(const engine *e, const float *f, int k) {
    act_rows a = {f, e->aqs, e->ad, e->as, k};
    return a;
}

/* x += proj * residual_scale of one row: granite's scaled residual add of the block before, done
 * by the phase that reads x next (a norm) instead of a phase of its own (engine.c) */
static inline void add_scaled_proj(engine *e, int r) {
    const int dim = e->m.dim;
    const float rs = e->m.residual_scale, *pr = e->proj + (size_t)r * dim;
    float *xr = e->x + (size_t)r * dim;
    for (int i = 0; i < dim; i++) xr[i] += pr[i] * rs;
}

/* rows: x += rmsnorm(proj) * w (engine_phases.c) */
void post_norm_phase(engine *e, int p, const float *w);

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

/* ---- defined in one file, used in another -------------------------------------------------- */

/* engine_create.c: zeroed allocations; xalloc clears *ok on failure; big_alloc: huge pages,
 * populate faults every page in now */
void *xalloc(size_t n, int *ok);
void *big_alloc(size_t n, int populate);
void big_free(void *p, size_t n);

/* engine_model.c: 1 when engine_create can run m */
int model_ok(const model_desc *m);

/* engine_pack.c: every block-type matrix packed into e->packed (0: out of memory) */
int pack_weights(engine *e);

/* engine_phases.c */
int gemm_chunk(const mm_job *jobs, int n_jobs, int nth, int n_rows);
void matmul_phase(engine *e, int p, const mm_job *jobs, int n_jobs, const act_rows *x, int n_rows, int nth);
void mm_unit(engine *e, const mm_job *jobs, int n_jobs, int chunk, int u, const act_rows *x, int n_rows);
int mm_units(const mm_job *jobs, int n_jobs, int chunk);
void norm_phase(engine *e, int p, const float *w, int quantize, int add_proj);

/* The blocks: each walks its phases of layer l from phase p and returns the next phase (-1: the
 * test hook fired). */
int attention_block(engine *e, const layer_weights *L, int l, int p, int ith, int nth);
int conv_block(engine *e, const layer_weights *L, int l, int p, int nth);
int delta_block(engine *e, const layer_weights *L, int l, int p, int ith, int nth);
int mamba_block(engine *e, const layer_weights *L, int l, int p, int nth);
int ffn_block(engine *e, const layer_weights *L, int p, int nth);
int moe_block(engine *e, const layer_weights *L, int l, int p, int nth);

/* engine_attention.c: the step's attention units (and merges) from its segments */
void plan_attention(engine *e);

/* engine_ffn.c, engine_recurrent.c: the MoE and recurrent layers' buffers (0: out of memory) */
int moe_slices(engine *e);
int moe_create(engine *e, int max_tokens);
int delta_create(engine *e, const model_desc *m, int max_tokens, int n_threads, int rollback);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#endif
