/* Kernel contracts: block formats, activation rows, and the table of kernel variants.
 *
 * Design: every kernel has a portable `*_generic` reference (quant.c, matmul.c, attention.c,
 * norm.c, rope.c, elementwise.c) and, where it pays, a SIMD variant (arch/x86_avx2.c).
 * dispatch.c fills one `kernel_table` per variant; the engine calls kernels only through a table,
 * so one build serves CPUs with and without AVX2.
 *
 * NOTE: row independence. Every kernel computes each output row with the same sequence of
 * floating-point operations whatever else is in the call (other rows, the tile a row lands in,
 * the thread that runs it). Batching, chunking and thread count therefore never change a row's
 * numbers, which is what makes a warm (reused) slot bit-identical to a cold one.
 */
#ifndef SLOTSERVE_KERNELS_H
#define SLOTSERVE_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "blocks.h" /* type ids, block layouts, row groups */

/* Longest row (elements) any kernel takes: the SIMD kernels keep per-row scratch of this size
 * on the stack, the engine rejects models with longer weight rows, and KernelTable (the
 * Python test surface) refuses longer operands. */
#define MAX_ROW_LEN (QK * 1024)

/* Activation rows as the matmuls read them. `f` is used by float weights (F32/F16); the
 * quantized form (8-bit blocks of 32, one float scale and one float block sum per block) by
 * block weights. Either part may be NULL when no weight of the call needs it. */
typedef struct {
    const float *f;     /* [n_rows, k] float rows */
    const int8_t *qs;   /* [n_rows, k] quantized values: x ~= d[b] * qs, within +-127 (the Q5_0
                         * kernels' int16 sums rely on it: arch/x86_avx2_tiles.c tg_q5) */
    const float *d;     /* [n_rows, k/QK] block scales */
    const float *s;     /* [n_rows, k/QK] block sums: d[b] * sum(qs of block b) */
    int k;              /* row length */
} act_rows;

/* A weight matrix as the matmuls read it. */
typedef struct {
    int type;           /* ggml type */
    int n_in;           /* row length (elements) */
    int n_out;          /* rows */
    const void *rows;   /* [n_out][ggml_row_bytes(type, n_in)] file layout */
    const void *x8;     /* block types: [n_out / ROW_GROUP][n_in / block elements] x8 blocks (else NULL) */
} gemm_weight;

/* Y[r, o] (+)= dot(W row o, X row r) for r in [0, n_rows), o in [o0, o1); o0 is a multiple of
 * ROW_GROUP and so is o1 unless o1 == n_out. Rows inside whole groups are read from w->x8 when
 * it is set, the rest from w->rows. y: [n_rows, ldy]; accumulate != 0 adds to y. */
typedef void (*gemm_fn)(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x,
                        int n_rows, int accumulate);

/* Attention, in chunks. Query rows i = 0..n_q-1 of one slot sit at positions pos0+i and attend
 * keys lo(i)..pos0+i of ONE kv head, shared by `group` query heads (GQA), where lo(i) = 0, or
 * with a sliding window w > 0, lo(i) = max(0, pos0+i-w+1) (a key w positions back is masked). Keys are cut into chunks
 * of ATTN_CHUNK at absolute positions; a chunk yields a partial softmax state per (row, head):
 * (m = max score, l = sum exp(s - m), acc = sum exp(s - m) v), and the states are folded
 * chunk by chunk in increasing order. The order is fixed by positions alone, so a row's result
 * is the same whether its chunks ran on one thread in sequence or on several (split for load
 * balance) and then folded.
 *
 * Layouts: q, acc, out: [n_q][ld] with head g of row i at i*ld + g*head_dim;
 * ml: [n_q * group][2] (m, l); v: [>= pos0+n_q][head_dim] rows; k: blocks of KEY_LANES keys,
 * dimension-major inside a block, so one vector load holds dimension d of 8 keys:
 *
 *   k[(t / KEY_LANES) * head_dim * KEY_LANES + d * KEY_LANES + t % KEY_LANES] = key t, dim d
 *
 * Elements are f32, f16 (uint16) or q8_0 (kv_f16 = 0, 1, 2: KV_F32, KV_F16, KV_Q8_0; q8_0's
 * blocked layout is drawn in kv_q8.h). A k buffer spans whole blocks (lanes past the
 * keys in use are never read into a result). */
#define ATTN_CHUNK 256
#define KEY_LANES 8

static inline size_t key_index(int t, int d, int head_dim) {
    return (size_t)(t / KEY_LANES) * head_dim * KEY_LANES + (size_t)d * KEY_LANES + t % KEY_LANES;
}

/* Largest n_q * group an attention call may take (callers tile queries to fit). The engine's
 * prefill tiles are this many (row, head) pairs: each key block a call converts serves them all,
 * so a larger tile reads a slot's KV fewer times (128: 32 rows of Gemma 3's 4 heads a pass). */
#define ATTN_MAX_ROWS 128

/* The partial state of chunk `chunk` for every (row, head); a row none of whose keys is in the
 * chunk gets the empty state (m = -inf, l = 0, acc = 0). window: 0 or the sliding window.
 * scratch: attn_scratch_floats. */
typedef void (*attn_chunk_fn)(float *acc, int lda, float *ml, const float *q, int ldq, const void *k,
                              const void *v, int kv_f16, int pos0, int n_q, int group, int head_dim,
                              float scale, int window, int chunk, float *scratch);
/* (acc, ml) = fold((acc, ml), (pacc, pml)): rescale both to the larger max and add. */
typedef void (*attn_fold_fn)(float *acc, int lda, float *ml, const float *pacc, int ldp, const float *pml,
                             int n_q, int group, int head_dim);

typedef struct kernel_table kernel_table;
/* The whole attention of the rows with one table's kernels: every chunk folded in order, then
 * out = acc / l. scratch: attn_scratch_floats(ctx_len, head_dim) floats. */
void attention_rows(const kernel_table *kt, float *out, int ldo, const float *q, int ldq, const void *k,
                    const void *v, int kv_f16, int pos0, int n_q, int group, int head_dim, float scale,
                    int window, float *scratch);
/* The same over a ring of `ring` rows (a multiple of ATTN_CHUNK; 0: none): key position t is
 * stored at row t % ring of k and v. Identical results: each chunk's kernel sees its keys at
 * positions shifted by a multiple of the ring (kernels never depend on absolute positions
 * beyond the mask). The ring must still hold every key a row attends to. */
void attention_rows_ring(const kernel_table *kt, float *out, int ldo, const float *q, int ldq, const void *k,
                         const void *v, int kv_f16, int pos0, int n_q, int group, int head_dim, float scale,
                         int window, int ring, float *scratch);
/* The first chunk holding a key that rows pos0.. need (0 without a window). */
static inline int attn_first_chunk(int pos0, int window) {
    return window > 0 && pos0 - window + 1 > 0 ? (pos0 - window + 1) / ATTN_CHUNK : 0;
}
/* out = acc / l for every (row, head). */
void attention_finish(float *out, int ldo, const float *acc, int lda, const float *ml, int n_q, int group,
                      int head_dim);

size_t attn_scratch_floats(int ctx_len, int head_dim);

struct kernel_table {
    const char *name;
    /* x ~= qs * d per block; k % QK == 0. qs: [k], d, s: [k/QK]. */
    void (*quantize_q8a)(int8_t *qs, float *d, float *s, const float *x, int k);
    /* y[0..k) = decoded row of a weight of the given type. */
    void (*dequantize_row[GGML_TYPE_COUNT])(float *y, const void *x, int k);
    gemm_fn gemm[GGML_TYPE_COUNT];
    attn_chunk_fn attention_chunk;
    attn_fold_fn attention_fold;
    /* out = x / sqrt(mean(x^2) + eps) * w over n elements. */
    void (*rmsnorm)(float *out, const float *x, const float *w, int n, float eps);
    /* Rotate adjacent pairs (x[2i], x[2i+1]) of each of n_heads heads by angle i:
     * cos_sin: [head_dim/2][2] (cos, sin) for this token's position. */
    void (*rope)(float *x, int n_heads, int head_dim, const float *cos_sin);
    /* The same angles on the pairs (x[i], x[i + head_dim/2]) (NEOX layout). */
    void (*rope_neox)(float *x, int n_heads, int head_dim, const float *cos_sin);
    /* out = silu(g) * u over n elements. */
    void (*silu_mul)(float *out, const float *g, const float *u, int n);
    /* out = gelu(g) * u over n elements, GELU's tanh approximation as ggml computes it:
     * 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), 0 for g <= -10, g for g >= 10. */
    void (*gelu_tanh_mul)(float *out, const float *g, const float *u, int n);
    /* y = exp(x) over n elements (the exponential attention and silu use). */
    void (*exp)(float *y, const float *x, int n);
    /* y (f16 bits) = round-to-nearest-even(x); and back. */
    void (*f32_to_f16)(uint16_t *y, const float *x, int n);
    void (*f16_to_f32)(float *y, const uint16_t *x, int n);
    /* LFM2's short convolution of one position over n channels (conv.c):
     *   out[c] = gate[c] * sum_{i = 0..taps-1} w[i * n + c] * rows[i][c]
     * summed from 0 in tap order (a product, then an add); rows[i] is the conv input of the
     * position taps-1-i back, f32 or f16 (rows_f16), and NULL for a position before 0 (the
     * tap is skipped: a zero state). w: the kernel, tap-major [taps][n]. */
    void (*shortconv)(float *out, const float *gate, const void *const *rows, int rows_f16, const float *w,
                      int taps, int n);
    /* Gated DeltaNet (qwen35; recurrent.c). One position of a causal depthwise conv over n
     * channels: out[c] = sum_j w[j][c] * in_j[c], j = 0..taps-1 in that order, where in_j is
     * tail row j (oldest first) of src for j < taps-1 and x for the last tap; then tail = src
     * moved up one row with x as its last (src == tail: in place; else they do not overlap).
     * tail, src and w rows are ld floats apart (tap-major). */
    void (*ssm_conv)(float *out, float *tail, const float *src, const float *x, const float *w, int taps, int n,
                     int ld);
    /* x /= sqrt(sum(x^2) + eps) over n elements (llama.cpp's DeltaNet q/k normalisation). */
    void (*l2norm)(float *x, int n, float eps);
    /* One token of one head's delta rule on S [d][d] (row j: value index j, column i: key
     * index i): S = decay S; delta_j = (v_j - S_j . k) beta; S_j += delta_j k;
     * o_j = (S_j . q) scale, where the S on the right is src, the state before the token (src ==
     * S: in place; else they do not overlap and src is only read). Rows are independent. */
    void (*gdn_step)(float *S, const float *src, float *o, const float *q, const float *k, const float *v,
                     float decay, float beta, float scale, int d);
    /* n tokens of one head's delta rule in position order on S in place, the same numbers bit
     * for bit as n in-place gdn_step calls: token t reads q + t d and k + t d (contiguous
     * [n][d]), v + t ldv, decay[t ldg], beta[t ldg] and writes o + t ldo. Rows being independent, a variant may run each
     * block of rows through all n tokens while it sits in L1 (prefill: the head's 64 KiB
     * matrix is not streamed through the cache once per token). */
    void (*gdn_steps)(float *S, float *o, int ldo, const float *q, const float *k, const float *v, int ldv,
                      const float *decay, const float *beta, int ldg, float scale, int d, int n);
    /* The delta rule's gates of n heads, in place: alpha[h] <- exp(softplus(alpha[h] + dt[h]) *
     * a[h]) (the decay; softplus(x) = x above 20, else log(1 + exp(x)), as ggml), beta[h] <-
     * 1 / (1 + exp(-beta[h])). */
    void (*gdn_gates)(float *alpha, float *beta, const float *dt, const float *a, int n);
    /* Mamba2 (granitehybrid; mamba2.c). One token of one head's selective scan on S [p][n] (row
     * i: channel i of the head, column j: state index j), from src (the state before the token;
     * src == S: in place, else they do not overlap):
     *   S_ij = src_ij * dA + B_j * (x_i * dt);   y_i = sum_j S_ij * C_j
     * every product and sum rounded on its own (never fused), y's sum in mamba2.c's order, so
     * every variant gives the same bits. dt: the softplus'd step, dA = exp(dt * A) (mamba2_gates). */
    void (*mamba2_scan)(float *S, const float *src, float *y, const float *x, const float *B, const float *C,
                        float dA, float dt, int p, int n);
};

/* Mamba2's step size and decay of n heads for one token, in place: dt[h] <- softplus(dt[h] +
 * bias[h]) (x above 20, else log1p(exp(x)), as ggml), dA[h] = exp(dt[h] * a[h]) (a = -exp(A_log),
 * as the file stores it). One portable version (mamba2.c): n exps a token. */
void mamba2_gates(float *dt, float *dA, const float *bias, const float *a, int n);

/* dispatch.c: the table called `name` ("generic"/"scalar", "avx2", "avx512vnni") or, for
 * NULL/"auto", the best the CPU supports. NULL if unknown or not supported by this CPU.
 * avx512vnni is the avx2 table with the block-type matmuls but Q2_K/Q3_K on VNNI (bit-identical
 * results). */
const kernel_table *kernels_select(const char *name);

/* ssm_conv's tail update, shared by every variant: tail = src's rows 1 .. taps-2, then x
 * (src == tail: in place, rows moved up in order). */
static inline void ssm_tail_shift(float *tail, const float *src, const float *x, int taps, int n, int ld) {
    for (int j = 0; j + 1 < taps - 1; j++) memmove(tail + (size_t)j * ld, src + (size_t)(j + 1) * ld, sizeof(float) * n);
    memcpy(tail + (size_t)(taps - 2) * ld, x, sizeof(float) * n);
}
int kernels_avx2_supported(void);
int kernels_avx512vnni_supported(void);
/* arch/x86_peak.c: int8 products computed by `iters` rounds of a variant's multiply-accumulate
 * instruction mix ("vnni512", "vnni256", "avx2") on independent accumulators, or 0 when this
 * CPU lacks it: the throughput peak `slotserve bench kernels` reports the GEMMs against. */
long kernel_peak_macs(const char *mix, long iters);
/* arch/x86_peak.c: the wrapping sum of p[0, n) read as little-endian 64-bit words (a tail under 8
 * bytes byte by byte), reading every byte once in order: the memory-read probe. Any CPU. */
uint64_t kernel_read_sum(const uint8_t *p, size_t n);
/* arch/x86_avx2_tiles.c: the (activation row, output) pairs the avx2 variant's prefill tiles have
 * computed for weights of `type` since the process started (all threads; 0 off x86): lets a test
 * check that a call of whole tiles ran on them, not on the row-group kernels they replace. */
long long gemm_tiles_avx2_pairs(int type);

/* Generic (portable) kernels. */
void quantize_q8a_generic(int8_t *qs, float *d, float *s, const float *x, int k);
void dequantize_row_f32_generic(float *y, const void *x, int k);
void dequantize_row_f16_generic(float *y, const void *x, int k);
void dequantize_row_q8_0_generic(float *y, const void *x, int k);
void dequantize_row_q4_0_generic(float *y, const void *x, int k);
void dequantize_row_q4_1_generic(float *y, const void *x, int k);
void gemm_f32_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_f16_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q8_0_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q4_0_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q4_1_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void attention_chunk_generic(float *acc, int lda, float *ml, const float *q, int ldq, const void *k,
                             const void *v, int kv_f16, int pos0, int n_q, int group, int head_dim,
                             float scale, int window, int chunk, float *scratch);
void attention_fold_generic(float *acc, int lda, float *ml, const float *pacc, int ldp, const float *pml,
                            int n_q, int group, int head_dim);
void rmsnorm_generic(float *out, const float *x, const float *w, int n, float eps);
void rope_generic(float *x, int n_heads, int head_dim, const float *cos_sin);
void rope_neox_generic(float *x, int n_heads, int head_dim, const float *cos_sin);
void silu_mul_generic(float *out, const float *g, const float *u, int n);
void gelu_tanh_mul_generic(float *out, const float *g, const float *u, int n);
void exp_generic(float *y, const float *x, int n);
void f32_to_f16_generic(uint16_t *y, const float *x, int n);
void f16_to_f32_generic(float *y, const uint16_t *x, int n);
void shortconv_generic(float *out, const float *gate, const void *const *rows, int rows_f16, const float *w,
                       int taps, int n);
void ssm_conv_generic(float *out, float *tail, const float *src, const float *x, const float *w, int taps, int n, int ld);
void l2norm_generic(float *x, int n, float eps);
void gdn_step_generic(float *S, const float *src, float *o, const float *q, const float *k, const float *v, float decay, float beta,
                      float scale, int d);
void gdn_steps_generic(float *S, float *o, int ldo, const float *q, const float *k, const float *v, int ldv,
                       const float *decay, const float *beta, int ldg, float scale, int d, int n);
void gdn_gates_generic(float *alpha, float *beta, const float *dt, const float *a, int n);
void mamba2_scan_generic(float *S, const float *src, float *y, const float *x, const float *B, const float *C, float dA,
                         float dt, int p, int n);

/* AVX2/FMA/F16C kernels (arch/x86_avx2.c); only called when the CPU has them. */
void quantize_q8a_avx2(int8_t *qs, float *d, float *s, const float *x, int k);
void dequantize_row_f16_avx2(float *y, const void *x, int k);
void dequantize_row_q8_0_avx2(float *y, const void *x, int k);
void dequantize_row_q4_0_avx2(float *y, const void *x, int k);
void dequantize_row_q4_1_avx2(float *y, const void *x, int k);
void gemm_f32_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_f16_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q8_0_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q4_0_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q4_1_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void attention_chunk_avx2(float *acc, int lda, float *ml, const float *q, int ldq, const void *k,
                          const void *v, int kv_f16, int pos0, int n_q, int group, int head_dim,
                          float scale, int window, int chunk, float *scratch);
/* The same in query tiles for calls of several rows (arch/x86_avx2_attn.c), bit-identical. */
void attention_chunk_avx2_tiles(float *acc, int lda, float *ml, const float *q, int ldq, const void *k,
                                const void *v, int kv_f16, int pos0, int n_q, int group, int head_dim,
                                float scale, int window, int chunk, float *scratch);
void attention_fold_avx2(float *acc, int lda, float *ml, const float *pacc, int ldp, const float *pml,
                         int n_q, int group, int head_dim);
void rmsnorm_avx2(float *out, const float *x, const float *w, int n, float eps);
void rope_avx2(float *x, int n_heads, int head_dim, const float *cos_sin);
void rope_neox_avx2(float *x, int n_heads, int head_dim, const float *cos_sin);
void silu_mul_avx2(float *out, const float *g, const float *u, int n);
void gelu_tanh_mul_avx2(float *out, const float *g, const float *u, int n);
void exp_avx2(float *y, const float *x, int n);
void f32_to_f16_avx2(uint16_t *y, const float *x, int n);
void f16_to_f32_avx2(float *y, const uint16_t *x, int n);
void shortconv_avx2(float *out, const float *gate, const void *const *rows, int rows_f16, const float *w, int taps,
                    int n);
void ssm_conv_avx2(float *out, float *tail, const float *src, const float *x, const float *w, int taps, int n, int ld);
void l2norm_avx2(float *x, int n, float eps);
void gdn_step_avx2(float *S, const float *src, float *o, const float *q, const float *k, const float *v, float decay, float beta,
                   float scale, int d);
void gdn_steps_avx2(float *S, float *o, int ldo, const float *q, const float *k, const float *v, int ldv,
                    const float *decay, const float *beta, int ldg, float scale, int d, int n);
void gdn_gates_avx2(float *alpha, float *beta, const float *dt, const float *a, int n);
void mamba2_scan_avx2(float *S, const float *src, float *y, const float *x, const float *B, const float *C, float dA,
                      float dt, int p, int n);

/* Attention chunks in query tiles on AVX-512 (arch/x86_avx512_attn.c), bit-identical to
 * attention_chunk_avx2; the avx512vnni table's. */
void attention_chunk_avx512(float *acc, int lda, float *ml, const float *q, int ldq, const void *k,
                            const void *v, int kv_f16, int pos0, int n_q, int group, int head_dim,
                            float scale, int window, int chunk, float *scratch);
/* The recurrence kernels on AVX-512 (arch/x86_avx512_recurrent.c), bit-identical to their AVX2
 * variants; the avx512vnni table's. */
void gdn_step_avx512(float *S, const float *src, float *o, const float *q, const float *k, const float *v, float decay, float beta,
                     float scale, int d);
void gdn_steps_avx512(float *S, float *o, int ldo, const float *q, const float *k, const float *v, int ldv,
                      const float *decay, const float *beta, int ldg, float scale, int d, int n);
void ssm_conv_avx512(float *out, float *tail, const float *src, const float *x, const float *w, int taps, int n, int ld);
void mamba2_scan_avx512(float *S, const float *src, float *y, const float *x, const float *B, const float *C, float dA,
                        float dt, int p, int n);
/* silu_mul on AVX-512 (arch/x86_avx512_act.c), bit-identical to silu_mul_avx2. */
void silu_mul_avx512(float *out, const float *g, const float *u, int n);
void shortconv_avx512(float *out, const float *gate, const void *const *rows, int rows_f16, const float *w, int taps,
                      int n);
/* AVX512-VNNI matmuls (arch/x86_vnni.c); only called when the CPU has AVX512F/VL/BW/VNNI. */
void gemm_q8_0_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q4_0_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q4_1_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);

#endif
