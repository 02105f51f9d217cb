/* The avx2 variant's prefill tiles: Q5_0, Q5_1, Q4_K, Q5_K and Q6_K matmuls of whole tiles of
 * T8_ROWS activation rows (a prefill chunk) on AVX2's vpmaddubsw, over the row groups (blocks.h
 * x8 layouts: lane i of a vector is weight row 8g + i). x86_avx2_k.c hands its calls' whole
 * groups here and runs the rest on x86_gemm_k.h's row-group tiles.
 *
 * Design (x86_gemm_z16.h's, on 16 ymm registers): the loop order is tile-major. For a block of
 * T_OB groups, tiles of T_ROWS activation rows; each tile's activations are repacked once per
 * slice of T_KS elements (t_pack) into a buffer that stays in L1 while every group of the block
 * streams past it: per activation block of 32, the 16 rows' quantized bytes side by side, their
 * scales and sums. A weight unit (8 vectors: a Q5_0/Q5_1 block of 32, a Q4_K/Q5_K sub-block, a
 * Q6_K quarter) is unpacked once into 8 registers and multiplied by all 16 rows of the tile, each
 * row's 4 activation bytes broadcast from a fixed offset (the row loop unrolled: no address
 * arithmetic per row). 16 ymm registers hold the unit, not the rows' sums: the rows' float
 * accumulators live in a stash in L1 (16 rows x T_OB groups), read and written once per unit;
 * the second pass (the corrections) runs T_CR rows at a time in registers.
 * Zen 5 with AVX2 issues vpmaddubsw, vpmaddwd, FMAs and float multiplies on the same two pipes,
 * and two vector loads a cycle (one a vpbroadcastd): per unit and row, Q5_0 here is 11 of the
 * former (8 vpmaddubsw, one vpmaddwd, the multiply and the FMA: no correction pass) and 11
 * loads, so about 0.7 of the avx2 peak is its ceiling (docs/benchmarks.md, issue 26).
 * NOTE: on the Zen 5 this was written on (AVX2 forced), the 5-bit and 6-bit types gain (their
 * unpacking, 3-4 instructions a vector, is now spread over 16 rows instead of 4: Q5_0 +10-20%,
 * Q5_K +40%, Q6_K 2x) and Q4_K a little; Q4_0, Q4_1 and Q8_0 (x86_gemm_x8.h: cheap to unpack,
 * accumulators in registers) measured 5-30% slower here, so they stay on the row groups.
 *
 * The integer dot products are exact either way, only their grouping differs from
 * x86_gemm_k.h's: 4-bit quants sum 8 runs in int16 (<= 8 * 2 * 15 * 127), Q5_1 and Q5_K 4 runs
 * (<= 4 * 2 * 31 * 127) before vpmaddwd widens them (applying a K sub-block's scale). Q5_0 sums
 * its 8 runs in int16 modulo 2^16, less 16 x the activations each int16 lane multiplied (t_pack):
 * the dot product of q - 16 over the lane's 16 bytes, exact (tg_q5), as x86_gemm_k.h's. Q6_K runs its
 * quants unsigned (0..63, as stored; x86_gemm_k.h moves signs onto the activations, one more
 * instruction a product) and sums a sub-block's 4 runs in int16 modulo 2^16, less 32 x the
 * activations each int16 lane multiplied (t_pack): the dot product of q - 32, exact (tg_q6_K),
 * so one vpmaddwd a sub-block applies its scale: sc * dot(q - 32, a), the integer of the other
 * kernels. Per (weight row, activation row) the float operations are then those of the other
 * AVX2 tiles, in the same order:
 *   acc = fma(float(isum_b), d * ad_b, acc)  for each activation block b,
 *   cor = fma(c_b, as_b, cor) (Q5_1: c = m; Q4_K/Q5_K: cor -= dmin m_j as_j; Q5_0, Q6_K: none)
 *   in a second pass,
 *   y = acc + cor (+ y),
 * so a row's numbers are bit-identical to the avx2 row-group kernels', to the avx512vnni
 * variant's and to themselves in any tile, call or thread (tests/engine/test_kernels.py and
 * test_kernels_kquants.py hold them to ==). */
#if defined(__x86_64__) || defined(__i386__)

#pragma GCC target("avx2,fma,f16c")

#include <immintrin.h>
#include <string.h>

#include "../kernels.h"
#include "../quant_k.h"
#include "x86_avx2_bits.h"
#include "x86_avx2_tiles.h"

#define T_ROWS T8_ROWS /* activation rows per tile */
#define T_KS 1024   /* activation elements per slice of a tile (the buffer's row length) */
#define T_NB (T_KS / QK)
#define T_OB 16     /* groups per block of outputs (the accumulator stash) */
/* rows per pass of the corrections: each row's sum is one chain of FMAs, so 4 at a time waited
 * on the FMA's latency (4 cycles: 1 FMA a cycle, half the rate); 8 fill both FMA pipes */
#define T_CR 8

#define T_AI static inline __attribute__((always_inline))
#define T_UNROLL _Pragma("GCC unroll 16")

enum { T_Q5_0, T_Q5_1, T_Q4_K, T_Q5_K, T_Q6_K };

/* A tile's activations, slice [e0, e0 + T_KS) of rows r .. r + T_ROWS - 1 (t_pack). */
typedef struct {
    _Alignas(32) int8_t qs[T_NB][T_ROWS][QK]; /* block b, row i: its 32 quantized values */
    _Alignas(32) float d[T_NB][T_ROWS];       /* scales */
    _Alignas(32) float s[T_NB][T_ROWS];       /* sums d * sum(qs) */
    _Alignas(32) int32_t o[T_NB][T_ROWS][2];  /* offsets (t_pack): Q6_K's two sub-blocks', Q5_0's in [0] */
} t_act;

T_AI __m256 t_ph(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* ---- integer dot products of a unit (q[j] against bytes 4j.. of a row's 32 at a) ------------ */

/* int16 sum of runs j0 .. j0 + n - 1 (two chains) */
T_AI __m256i t_runs(const __m256i *q, const int8_t *a, int j0, int n) {
    __m256i p0 = _mm256_maddubs_epi16(q[j0], bcast4(a + 4 * j0));
    if (n == 1) return p0;
    __m256i p1 = _mm256_maddubs_epi16(q[j0 + 1], bcast4(a + 4 * j0 + 4));
    for (int j = j0 + 2; j < j0 + n; j += 2) {
        p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(q[j], bcast4(a + 4 * j)));
        p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(q[j + 1], bcast4(a + 4 * j + 4)));
    }
    return _mm256_add_epi16(p0, p1);
}

/* 5-bit quants: two halves of 4 runs */
T_AI __m256i t_dot5(const __m256i *q, const int8_t *a, __m256i sc) {
    return _mm256_add_epi32(_mm256_madd_epi16(t_runs(q, a, 0, 4), sc), _mm256_madd_epi16(t_runs(q, a, 4, 4), sc));
}

/* acc[i] = fma(float(isum_i), d8 * ad_i, acc[i]) */
#define T_FMA(isum, i) acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d8, _mm256_set1_ps(t->d[b][i])), acc[i])

/* ---- the activation tile --------------------------------------------------------------------- */

/* Which offsets t_pack computes. */
enum { T_SUMS_NONE, T_SUMS_Q6_K, T_SUMS_Q5_0 };

/* Rows r .. r + T_ROWS - 1 of x, elements [e0, e0 + ne), into t; sums: the offsets t->o, per
 * int16 lane of vpmaddubsw's products (bytes 0-1 and bytes 2-3 of each run: an int16 pair,
 * modulo 2^16). T_SUMS_Q6_K (tg_q6_K): for sub-block h of 16 bytes (runs 4h .. 4h + 3), 32 x
 * the lanes' sums; T_SUMS_Q5_0 (tg_q5): 16 x the lanes' sums over all 8 runs, in o[b][i][0]. */
static void t_pack(t_act *t, const act_rows *x, int r, int e0, int ne, int sums) {
    const int nb = ne / QK, xnb = x->k / QK, b0 = e0 / QK;
    const __m256i ones8 = _mm256_set1_epi8(1);
    for (int i = 0; i < T_ROWS; i++) {
        const int8_t *a = x->qs + (size_t)(r + i) * x->k + e0;
        const float *d = x->d + (size_t)(r + i) * xnb + b0, *s = x->s + (size_t)(r + i) * xnb + b0;
        for (int b = 0; b < nb; b++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(a + QK * b));
            _mm256_store_si256((__m256i *)t->qs[b][i], v);
            t->d[b][i] = d[b];
            t->s[b][i] = s[b];
            if (sums) {
                /* int16 pairs of bytes, the 4 runs of each 128-bit half summed lane-wise */
                __m256i p = _mm256_maddubs_epi16(ones8, v);
                p = _mm256_add_epi16(p, _mm256_shuffle_epi32(p, 0x4E));
                p = _mm256_add_epi16(p, _mm256_shuffle_epi32(p, 0xB1));
                if (sums == T_SUMS_Q6_K) {
                    p = _mm256_slli_epi16(p, 5);
                    t->o[b][i][0] = _mm256_cvtsi256_si32(p);
                    t->o[b][i][1] = _mm256_extract_epi32(p, 4);
                } else {
                    p = _mm256_slli_epi16(_mm256_add_epi16(p, _mm256_permute2x128_si256(p, p, 1)), 4);
                    t->o[b][i][0] = _mm256_cvtsi256_si32(p);
                }
            }
        }
    }
}

/* ---- one group against the tile over a slice of nbs activation blocks -------------------------
 * g: the group's first x8 block of the slice; acc/cor: its stash (T_ROWS each), read and written. */

/* Q5_0, Q5_1: blocks of 32. q[j] for j < 4: low nibbles of run j (elements 4j..) with their
 * fifth bits, q[4 + j] high nibbles (16 + 4j..).
 * Q5_0 sums all 8 runs of a row in int16 modulo 2^16 (vpaddw wraps) and takes its offset t->o
 * off with one vpsubw: each int16 lane is then the dot product of q - 16 over its 16 bytes,
 * within 16 * 16 * 127 < 2^15 (activations within +-127: quantize_q8a), exact; one vpmaddwd adds
 * a row's two lanes: isum = dot(q - 16, a), the integer of every other kernel, and no correction
 * pass. The chains are kept as two (asm barriers): left to itself GCC summed them as a tree whose
 * temporaries spilled (-15% in a harness). */
T_AI __m256i t_dot5_0(const __m256i *q, const int8_t *a, int32_t o, __m256i ones) {
    __m256i p0 = _mm256_maddubs_epi16(q[0], bcast4(a)), p1 = _mm256_maddubs_epi16(q[1], bcast4(a + 4));
    for (int j = 2; j < 8; j += 2) {
        p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(q[j], bcast4(a + 4 * j)));
        p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(q[j + 1], bcast4(a + 4 * j + 4)));
        __asm__("" : "+x"(p0), "+x"(p1));
    }
    return _mm256_madd_epi16(_mm256_sub_epi16(_mm256_add_epi16(p0, p1), _mm256_set1_epi32(o)), ones);
}

T_AI void tg_q5(int tk, const char *g, int nbs, const t_act *t, __m256 *acc, __m256 *cor) {
    const __m256i low4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    for (int b = 0; b < nbs; b++) {
        __m256i q[8];
        const uint8_t *qs, *qh;
        const uint16_t *dp;
        if (tk == T_Q5_0) {
            const block_q5_0x8 *B = (const block_q5_0x8 *)g + b;
            dp = B->d, qs = B->qs, qh = B->qh;
        } else {
            const block_q5_1x8 *B = (const block_q5_1x8 *)g + b;
            dp = B->d, qs = B->qs, qh = B->qh;
        }
        const __m256i vh = _mm256_loadu_si256((const __m256i *)qh);
        for (int j = 0; j < 4; j++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            q[j] = _mm256_or_si256(_mm256_and_si256(w, low4), bit_to_4(vh, j));
            q[4 + j] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w, 4), low4), bit_to_4(vh, 4 + j));
        }
        const __m256 d8 = t_ph(dp);
        if (tk == T_Q5_0) {
            T_UNROLL for (int i = 0; i < T_ROWS; i++) T_FMA(t_dot5_0(q, t->qs[b][i], t->o[b][i][0], ones), i);
        } else {
            T_UNROLL for (int i = 0; i < T_ROWS; i++) T_FMA(t_dot5(q, t->qs[b][i], ones), i);
        }
    }
    if (tk == T_Q5_0) return;
    /* Q5_1's correction, T_CR rows at a time in registers */
    for (int i0 = 0; i0 < T_ROWS; i0 += T_CR) {
        __m256 c[T_CR];
        T_UNROLL for (int i = 0; i < T_CR; i++) c[i] = cor[i0 + i];
        for (int b = 0; b < nbs; b++) {
            const __m256 c8 = t_ph(((const block_q5_1x8 *)g + b)->m);
            T_UNROLL for (int i = 0; i < T_CR; i++) c[i] = _mm256_fmadd_ps(c8, _mm256_set1_ps(t->s[b][i0 + i]), c[i]);
        }
        T_UNROLL for (int i = 0; i < T_CR; i++) cor[i0 + i] = c[i];
    }
}

/* Q4_K / Q5_K: super-blocks of 256; chunk c of 64 = sub-blocks 2c (low nibbles) and 2c+1 (high),
 * 8 runs each: the unit is one sub-block (activation block 8s + 2c + half). nss: super-blocks. */
T_AI void tg_k4(int tk, const char *g, int nss, const t_act *t, __m256 *acc, __m256 *cor) {
    const int five = tk == T_Q5_K;
    const __m256i low4 = _mm256_set1_epi8(15);
    for (int s = 0; s < nss; s++) {
        const uint16_t *dp;
        const uint8_t(*sc)[ROW_GROUP];
        const uint8_t *qs, *qh = NULL;
        if (five) {
            const block_q5_Kx8 *B = (const block_q5_Kx8 *)g + s;
            dp = B->d, sc = B->sc, qs = B->qs, qh = B->qh;
        } else {
            const block_q4_Kx8 *B = (const block_q4_Kx8 *)g + s;
            dp = B->d, sc = B->sc, qs = B->qs;
        }
        const __m256 d8 = t_ph(dp);
        for (int c = 0; c < 4; c++)
            for (int half = 0; half < 2; half++) {
                const __m256i scv = scale_pairs_u8(sc[2 * c + half]);
                const int b = 8 * s + 2 * c + half; /* the activation block in the slice */
                if (!five) {
                    /* Q4_K: runs 0-3 of every row (their int16 sums in part), then runs 4-7 and
                     * the float step: 4 quant registers live, not 8 (as tg_q6_K; Q5_K measured
                     * no faster so) */
                    __m256i part[T_ROWS];
                    for (int r4 = 0; r4 < 8; r4 += 4) {
                        __m256i q[4];
                        for (int rr = 0; rr < 4; rr++) {
                            const __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 32 * (8 * c + r4 + rr)));
                            q[rr] = half ? _mm256_and_si256(_mm256_srli_epi16(w, 4), low4) : _mm256_and_si256(w, low4);
                        }
                        if (r4 == 0) {
                            T_UNROLL for (int i = 0; i < T_ROWS; i++) part[i] = t_runs(q, t->qs[b][i], 0, 4);
                        } else {
                            T_UNROLL for (int i = 0; i < T_ROWS; i++) {
                                const __m256i p = _mm256_add_epi16(part[i], t_runs(q, t->qs[b][i] + 16, 0, 4));
                                T_FMA(_mm256_madd_epi16(p, scv), i);
                            }
                        }
                    }
                    continue;
                }
                __m256i q[8];
                for (int rr = 0; rr < 8; rr++) {
                    const __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 32 * (8 * c + rr)));
                    q[rr] = half ? _mm256_and_si256(_mm256_srli_epi16(w, 4), low4) : _mm256_and_si256(w, low4);
                    q[rr] = _mm256_or_si256(q[rr], bit_to_4(_mm256_loadu_si256((const __m256i *)(qh + 32 * rr)), 2 * c + half));
                }
                T_UNROLL for (int i = 0; i < T_ROWS; i++) T_FMA(t_dot5(q, t->qs[b][i], scv), i);
            }
    }
    /* the mins (x86_gemm_k.h k4_min_correction's operations, per super-block in order) */
    for (int s = 0; s < nss; s++) {
        const uint16_t *dminp;
        const uint8_t(*mn)[ROW_GROUP];
        if (five) {
            const block_q5_Kx8 *B = (const block_q5_Kx8 *)g + s;
            dminp = B->dmin, mn = B->m;
        } else {
            const block_q4_Kx8 *B = (const block_q4_Kx8 *)g + s;
            dminp = B->dmin, mn = B->m;
        }
        const __m256 dmin8 = t_ph(dminp);
        __m256 mf[8];
        for (int j = 0; j < 8; j++)
            mf[j] = _mm256_mul_ps(dmin8, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)mn[j]))));
        for (int i0 = 0; i0 < T_ROWS; i0 += T_CR) {
            __m256 c[T_CR];
            T_UNROLL for (int i = 0; i < T_CR; i++) c[i] = cor[i0 + i];
            for (int j = 0; j < 8; j++)
                T_UNROLL for (int i = 0; i < T_CR; i++) c[i] = _mm256_fnmadd_ps(mf[j], _mm256_set1_ps(t->s[8 * s + j][i0 + i]), c[i]);
            T_UNROLL for (int i = 0; i < T_CR; i++) cor[i0 + i] = c[i];
        }
    }
}

/* Q6_K: super-blocks of 256 = 2 halves x 4 quarters (activation blocks b = 4n + g) x 2
 * sub-blocks of 16 (runs 0-3, 4-7 of the unit). nss: super-blocks. The quants run unsigned
 * (0..63, as stored; x86_gemm_k.h moves signs onto the activations, one more instruction a
 * product). A sub-block's 4 runs are summed in int16 modulo 2^16 (vpaddw wraps) and its offset
 * t->o taken off: each int16 lane is then the dot product of q - 32 over its 8 bytes, within 8 *
 * 32 * 127 < 2^15, exact; one vpmaddwd a sub-block applies the scale: sc * dot(q - 32, a), the
 * integer x86_gemm_k.h computes. Sub-block 0 runs for every row first (4 quant registers, its
 * int32 sums in isum0), then sub-block 1 and the float step: 8 registers of quants and 16 rows
 * of temporaries did not fit 16 ymm registers. */
T_AI __m256i t_sub6(const __m256i *q, const int8_t *a, int32_t o, __m256i sc) {
    __m256i p0 = _mm256_maddubs_epi16(q[0], bcast4(a)), p1 = _mm256_maddubs_epi16(q[1], bcast4(a + 4));
    p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(q[2], bcast4(a + 8)));
    p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(q[3], bcast4(a + 12)));
    return _mm256_madd_epi16(_mm256_sub_epi16(_mm256_add_epi16(p0, p1), _mm256_set1_epi32(o)), sc);
}

T_AI void tg_q6_K(const char *g, int nss, const t_act *t, __m256 *acc) {
    const __m256i low4 = _mm256_set1_epi8(15), lo16 = _mm256_set1_epi32(0xffff);
    __m256i isum0[T_ROWS];
    for (int s = 0; s < nss; s++) {
        const block_q6_Kx8 *B = (const block_q6_Kx8 *)g + s;
        for (int n = 0; n < 2; n++)
            for (int gq = 0; gq < 4; gq++) {
                const int bs = 4 * n + gq, b = 8 * s + bs;
                for (int h = 0; h < 2; h++) {
                    __m256i q[4];
                    for (int rr = 0; rr < 4; rr++) {
                        const __m256i vl = _mm256_loadu_si256((const __m256i *)(B->q + q6x8_ql(16 * n + 8 * (gq & 1) + 4 * h + rr)));
                        const __m256i vh = _mm256_loadu_si256((const __m256i *)(B->q + q6x8_qh(8 * n + 4 * h + rr)));
                        const __m256i nib = gq < 2 ? _mm256_and_si256(vl, low4) : _mm256_and_si256(_mm256_srli_epi16(vl, 4), low4);
                        q[rr] = _mm256_or_si256(nib, q6_high(vh, gq));
                    }
                    const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)B->sc[2 * bs + h]));
                    const __m256i sc = _mm256_or_si256(_mm256_and_si256(v, lo16), _mm256_slli_epi32(v, 16));
                    if (h == 0) {
                        T_UNROLL for (int i = 0; i < T_ROWS; i++) isum0[i] = t_sub6(q, t->qs[b][i], t->o[b][i][0], sc);
                    } else {
                        const __m256 d8 = t_ph(B->d);
                        T_UNROLL for (int i = 0; i < T_ROWS; i++) {
                            const __m256i isum = _mm256_add_epi32(isum0[i], t_sub6(q, t->qs[b][i] + 16, t->o[b][i][1], sc));
                            T_FMA(isum, i);
                        }
                    }
                }
            }
    }
}

/* ---- driver ---------------------------------------------------------------------------------- */

/* One group against the tile over a slice of nbs blocks of 32 (one instantiation per kind). */
T_AI void t_group(int tk, const char *g, int nbs, const t_act *t, __m256 *acc, __m256 *cor) {
    switch (tk) {
    case T_Q5_0: tg_q5(T_Q5_0, g, nbs, t, acc, cor); break;
    case T_Q5_1: tg_q5(T_Q5_1, g, nbs, t, acc, cor); break;
    case T_Q4_K: tg_k4(T_Q4_K, g, nbs / 8, t, acc, cor); break;
    case T_Q5_K: tg_k4(T_Q5_K, g, nbs / 8, t, acc, cor); break;
    default: tg_q6_K(g, nbs / 8, t, acc); break;
    }
}

/* Weight rows [o0, o1) (whole groups) against activation rows [0, n_rows) (whole tiles): per
 * block of T_OB groups, tiles of T_ROWS rows, per slice of T_KS elements the tile packed once and
 * every group run over it. Compiled once per kind (T_ROWS_OF): one function inlining every kind
 * let one kind's edits move another's register allocation (Q4_K 5-10% slower when only Q6_K
 * changed, docs/benchmarks.md). */
T_AI void t_rows(const int tk, float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows,
                 int accumulate) {
    const int k = w->n_in;
    const size_t group_bytes = x8_bytes(w->type, k, ROW_GROUP);
    const int unit = ggml_block_elems(w->type); /* elements per x8 block */
    const size_t slice_bytes = group_bytes / (size_t)(k / unit) * (size_t)(T_KS / unit);
    t_act t;
    __m256 acc[T_OB][T_ROWS], cor[T_OB][T_ROWS];
    for (int ob = o0; ob < o1; ob += T_OB * ROW_GROUP) {
        const int ng = (o1 - ob < T_OB * ROW_GROUP ? o1 - ob : T_OB * ROW_GROUP) / ROW_GROUP;
        for (int r = 0; r < n_rows; r += T_ROWS) {
            for (int gi = 0; gi < ng; gi++)
                for (int i = 0; i < T_ROWS; i++) acc[gi][i] = cor[gi][i] = _mm256_setzero_ps();
            for (int e0 = 0; e0 < k; e0 += T_KS) {
                const int ne = k - e0 < T_KS ? k - e0 : T_KS;
                t_pack(&t, x, r, e0, ne, tk == T_Q6_K ? T_SUMS_Q6_K : tk == T_Q5_0 ? T_SUMS_Q5_0 : T_SUMS_NONE);
                for (int gi = 0; gi < ng; gi++) {
                    const char *g = (const char *)w->x8 + (size_t)(ob / ROW_GROUP + gi) * group_bytes +
                                    (size_t)(e0 / T_KS) * slice_bytes;
                    t_group(tk, g, ne / QK, &t, acc[gi], cor[gi]);
                }
            }
            for (int gi = 0; gi < ng; gi++)
                for (int i = 0; i < T_ROWS; i++) {
                    float *dst = y + (size_t)(r + i) * ldy + ob + ROW_GROUP * gi;
                    __m256 v = _mm256_add_ps(acc[gi][i], cor[gi][i]);
                    if (accumulate) v = _mm256_add_ps(_mm256_loadu_ps(dst), v);
                    _mm256_storeu_ps(dst, v);
                }
        }
    }
}

#define T_ROWS_OF(name, K)                                                                                           \
    static __attribute__((noinline)) void name(float *y, int ldy, const gemm_weight *w, int o0, int o1,              \
                                               const act_rows *x, int n_rows, int accumulate) {                      \
        t_rows(K, y, ldy, w, o0, o1, x, n_rows, accumulate);                                                         \
    }
T_ROWS_OF(t_rows_q5_0, T_Q5_0)
T_ROWS_OF(t_rows_q5_1, T_Q5_1)
T_ROWS_OF(t_rows_q4_K, T_Q4_K)
T_ROWS_OF(t_rows_q5_K, T_Q5_K)
T_ROWS_OF(t_rows_q6_K, T_Q6_K)
#undef T_ROWS_OF

/* (activation row, output) pairs the tiles computed, per weight type (gemm_tiles_avx2_pairs) */
static unsigned long long tile_pairs[GGML_TYPE_COUNT];

int gemm_tiles_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows,
                    int accumulate) {
    void (*rows)(float *, int, const gemm_weight *, int, int, const act_rows *, int, int);
    switch (w->type) {
    case GGML_TYPE_Q5_0: rows = t_rows_q5_0; break;
    case GGML_TYPE_Q5_1: rows = t_rows_q5_1; break;
    case GGML_TYPE_Q4_K: rows = t_rows_q4_K; break;
    case GGML_TYPE_Q5_K: rows = t_rows_q5_K; break;
    case GGML_TYPE_Q6_K: rows = t_rows_q6_K; break;
    default: return o0;
    }
    if (n_rows % T_ROWS || !w->x8) return o0;
    int end = w->n_out / ROW_GROUP * ROW_GROUP;
    if (end > o1) end = o1;
    if (end <= o0) return o0;
    rows(y, ldy, w, o0, end, x, n_rows, accumulate);
    __atomic_fetch_add(&tile_pairs[w->type], (unsigned long long)n_rows * (unsigned long long)(end - o0), __ATOMIC_RELAXED);
    return end;
}

long long gemm_tiles_avx2_pairs(int type) {
    return type >= 0 && type < GGML_TYPE_COUNT ? (long long)__atomic_load_n(&tile_pairs[type], __ATOMIC_RELAXED) : 0;
}

#else

long long gemm_tiles_avx2_pairs(int type) {
    (void)type;
    return 0;
}

#endif /* x86 */
