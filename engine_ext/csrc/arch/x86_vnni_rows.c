/* The avx512vnni variant's decode-size matmuls: one to ROWS_SPLIT_MAX activation rows against the
 * row groups of Q6_K, Q4_K and Q5_K weights, and two to ROWS_SPLIT_MAX rows against those of
 * Q8_0, Q5_0 and Q5_1 (x86_vnni.c's gemm_*_vnni hand a call of that size here, and its rows
 * outside whole groups to the tiles of x86_gemm_x8.h / x86_gemm_k.h). One pass over a pair of
 * groups takes up to ROWS_MAX rows (its sums fill the 32 vector registers); 5-8 rows (a decode
 * step of 5-8 slots) take a second pass over the same pair while it is in L1/L2, so the weights
 * still stream from memory once (they went to the 256-bit tiles, one vpdpbusd per 8 weight rows
 * where these do 16).
 *
 * Design: a decode step reads each weight once for a few rows, so what bounds it is the work of
 * unpacking a block, not the dot products. Here that work is done on 512-bit vectors holding
 * two row groups side by side (lanes 0-7 one group, lanes 8-15 another: one 32-byte load of
 * each), so every unpacking instruction serves 16 weight rows, and each unpacked 6-bit run
 * of Q6_K serves two quarters of its half (the low nibbles one, the high nibbles the other; one
 * load of the high bits both). The two groups of a vector are i and i + half of the call's
 * range, so that each half streams in order; an odd last group runs in both halves and keeps
 * the low one.
 *
 * Each (super-)block asks the prefetcher for both groups' block PF_AHEAD bytes on.
 *
 * From 2 rows, outputs of STREAM_MIN_OUT rows or more (the logits) are written by non-temporal
 * stores (rows_groups' NOTE).
 *
 * Calls of 2+ rows read their activation rows interleaved, copied once per call: row r's
 * 4-byte run i at 4 * (R * i + r), block b's scale and sum at R * b + r (act_view). Streaming
 * from memory, the weight stream evicts the rows from L1 between two pairs of groups (4 rows of
 * 4864 bytes beside 2 x 32 KB of Q6_K groups), and R separate rows (each with its scales and
 * sums) are 3R streams to fetch back beside the two weight streams; interleaved they are three.
 * A C harness, 4 rows, 2 threads, 14336 x 4864 from memory (benchmark window 2026-12-02 06:24
 * UTC): Q6_K 26.8 -> 36.9 GB/s of weights, Q4_K 29.6 -> 37.3 (one row: 53-57). Rows of 1024 or
 * less (Gemma 3's 640, Qwen2.5-Coder's 896) were read as given until a window at 08:24 UTC
 * (bench engine --batch-ratio, streamed matmuls): Gemma 3's 4 slots 3.57-3.60x one slot
 * interleaved against 3.43-3.48x as given (its Q8_0 output head has rows of 640), Qwen2.5-Coder
 * within the noise (3.45-3.48x against 3.47-3.57x).
 *
 * Q8_0, Q5_0 and Q5_1 take these kernels from 2 rows on only: at 2-4 rows the 256-bit tiles
 * are bound by their vpdpbusd count, which the pairs halve; one row (one-slot decode, whose
 * step a trial of the pairs at every row count did not show faster) stays on the tiles.
 *
 * NOTE: bit-identical to x86_gemm_k.h's VNNI tiles (and so to the avx2 variant): lane i is
 * weight row 8g + i exactly as there, every integer sum is exact (the order of integer adds is
 * free), and per lane the float operations are the same ones in the same order: per
 * activation block b, acc = fma(float(isum_b), d * ad_b, acc) (Q5_0: isum_b = dot(q - 16, a));
 * Q4_K/Q5_K's mins cor = fnmadd(dmin * m_j, as_b, cor) in block order, Q5_1's cor = fma(m, as_b,
 * cor); y = acc + cor (+ y).
 * tests/engine/test_kernels_kquants.py holds the avx512vnni variant to the avx2 one with ==.
 */
#if defined(__x86_64__) || defined(__i386__)

#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "../kernels.h"
#include "../quant_k.h"
#include "x86_vnni_rows.h"

/* acc += 4-byte activation run a (broadcast to 16 lanes) . w, per int32 lane (vpdpbusd). */
static inline __m512i dp16(__m512i acc, __m512i w, const int8_t *a) {
    __asm__("vpdpbusd %[a]%{1to16%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [a] "m"(*(const int32_t *)a));
    return acc;
}

/* 32 bytes at p (group g) and at p + gap (group g + 1) as one vector. */
static inline __m512i ld2(const uint8_t *p, size_t gap) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p)),
                              _mm256_loadu_si256((const __m256i *)(p + gap)), 1);
}

/* 8 bytes at p and at p + gap, widened to 16 int32 lanes (signed or unsigned). */
static inline __m512i sc2_i8(const int8_t *p, size_t gap) {
    const __m128i v = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)p), _mm_loadl_epi64((const __m128i *)(p + gap)));
    return _mm512_cvtepi8_epi32(v);
}

static inline __m512i sc2_u8(const uint8_t *p, size_t gap) {
    const __m128i v = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)p), _mm_loadl_epi64((const __m128i *)(p + gap)));
    return _mm512_cvtepu8_epi32(v);
}

/* 8 f16 at p and at p + gap as 16 floats. */
static inline __m512 f16x2(const uint16_t *p, size_t gap) {
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p)),
                                              _mm_loadu_si128((const __m128i *)((const char *)p + gap)), 1);
    return _mm512_cvtph_ps(v);
}

/* (a & b) | c, bitwise */
#define AND_OR 0xEA

/* Prefetch distance of the two streams (bytes ahead of the block being read). NOTE: two
 * streams a thread reads in lockstep are not followed by the hardware prefetcher as well as
 * one; this asks for each ahead, and past the end of a pair's groups it reaches the next pair's
 * (the groups of the low half are contiguous, and so are those of the high half). */
#define PF_AHEAD 2048


static inline void prefetch2(const uint8_t *p, size_t gap, size_t bytes) {
    for (size_t i = 0; i < bytes; i += 64) {
        _mm_prefetch((const char *)p + PF_AHEAD + i, _MM_HINT_T0);
        _mm_prefetch((const char *)p + gap + PF_AHEAD + i, _MM_HINT_T0);
    }
}

/* How store16 writes: y = v, y += v, or y = v by non-temporal stores (STORE_STREAM: rows_groups'
 * NOTE). */
enum { STORE_SET, STORE_ADD, STORE_STREAM };
#define STREAM_MIN_OUT 65536 /* outputs of at least this many rows are streamed from 2 rows */

/* 8 floats at p (16-byte aligned) by non-temporal stores */
static inline void stream8(float *p, __m256 v) {
    _mm_stream_ps(p, _mm256_castps256_ps128(v));
    _mm_stream_ps(p + 4, _mm256_extractf128_ps(v, 1));
}

/* y rows 0..R-1: lanes 0-7 to columns o .. o+8, lanes 8-15 (when o_hi >= 0) to o_hi .. o_hi+8;
 * each = acc + cor (+ y). mode: STORE_*. */
static inline __attribute__((always_inline)) void store16(float *y, int ldy, int o, int o_hi, const int R,
                                                          const __m512 *acc, const __m512 *cor, int mode) {
    for (int r = 0; r < R; r++) {
        float *row = y + (size_t)r * ldy;
        const __m512 v = _mm512_add_ps(acc[r], cor[r]);
        __m256 lo = _mm512_castps512_ps256(v);
        if (mode == STORE_ADD) lo = _mm256_add_ps(_mm256_loadu_ps(row + o), lo);
        if (mode == STORE_STREAM) stream8(row + o, lo);
        else _mm256_storeu_ps(row + o, lo);
        if (o_hi >= 0) {
            __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
            if (mode == STORE_ADD) hi = _mm256_add_ps(_mm256_loadu_ps(row + o_hi), hi);
            if (mode == STORE_STREAM) stream8(row + o_hi, hi);
            else _mm256_storeu_ps(row + o_hi, hi);
        }
    }
}

/* The activation rows as the kernels read them: bytes e .. e + 3 (e a multiple of 4) of row r
 * at qs + r * q_row + e * q_el, block b's scale and sum at d, s [r * d_row + b * d_el]: either
 * the rows as the caller gives them (q_row = k, q_el = 1, d_row = k / QK, d_el = 1) or
 * interleaved (q_row = 4, q_el = R, d_row = 1, d_el = R: see gemm_rows_vnni). */
typedef struct {
    const int8_t *qs;
    const float *d, *s;
    size_t q_row, q_el, d_row, d_el;
} act_view;

static inline const int8_t *act_at(const act_view *v, int r, size_t e) { return v->qs + r * v->q_row + e * v->q_el; }
static inline float act_d(const act_view *v, int r, size_t b) { return v->d[r * v->d_row + b * v->d_el]; }
static inline float act_s(const act_view *v, int r, size_t b) { return v->s[r * v->d_row + b * v->d_el]; }

/* acc[r] = fma(float(isum[r]), d * ad of row r's block b, acc[r]) */
static inline __attribute__((always_inline)) void fold_block(const int R, __m512 *acc, const __m512i *isum, __m512 d,
                                                             const act_view *x, size_t b) {
    for (int r = 0; r < R; r++)
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(d, _mm512_set1_ps(act_d(x, r, b))), acc[r]);
}

/* ---- Q6_K -------------------------------------------------------------------------------------
 * Half n of a super-block holds four blocks of 32 (quarters g = 0..3, block 4n + g). Quarters 0
 * and 2 are the low and high nibbles of the same ql runs, 1 and 3 those of the next 8 runs; the
 * high two bits of all four come from the same qh runs (bits 0-1, 2-3, 4-5, 6-7). One pass over
 * runs rr = 0..7 yields quarters p and p + 2 (p = 0, 1); quarter 2's sum waits for quarter 1's
 * (blocks are added in order). The 6-bit values go into vpdpbusd unsigned (q + 32) and each
 * sub-block of 16 takes off 32 x its activation sum (asum) before its scale, as the tiles do. */
static inline __attribute__((always_inline)) void q6_pair(const int R, float *y, int ldy, const uint8_t *g0, size_t gap,
                                                          int nsb, const act_view *x, const int32_t *asum, int o,
                                                          int o_hi, int mode) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    __m512 acc[ROWS_MAX], cor[ROWS_MAX];
    for (int r = 0; r < R; r++) acc[r] = cor[r] = _mm512_setzero_ps();
    for (int s = 0; s < nsb; s++) {
        const block_q6_Kx8 *blk = (const block_q6_Kx8 *)g0 + s;
        prefetch2((const uint8_t *)blk, gap, sizeof *blk);
        const __m512 d = f16x2(blk->d, gap);
#pragma GCC unroll 2
        for (int n = 0; n < 2; n++) {
            __m512i wait[ROWS_MAX]; /* quarter 2's sum, added after quarter 1's */
            for (int r = 0; r < R; r++) wait[r] = _mm512_setzero_si512();
#pragma GCC unroll 2
            for (int p = 0; p < 2; p++) {
                const int blo = 4 * n + p, bhi = blo + 2; /* blocks of this pass's two quarters */
                __m512i ilo[ROWS_MAX], ihi[ROWS_MAX];
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    __m512i dlo[ROWS_MAX], dhi[ROWS_MAX];
                    for (int r = 0; r < R; r++) dlo[r] = dhi[r] = _mm512_setzero_si512();
                    for (int rr = 4 * h; rr < 4 * h + 4; rr++) {
                        const __m512i ql = ld2(blk->q + q6x8_ql(16 * n + 8 * p + rr), gap);
                        const __m512i qh = ld2(blk->q + q6x8_qh(8 * n + rr), gap);
                        /* p = 0: quarter 0 takes qh bits 0-1, quarter 2 bits 4-5; p = 1: 2-3 and 6-7 */
                        const __m512i hlo = _mm512_and_si512(p ? _mm512_slli_epi16(qh, 2) : _mm512_slli_epi16(qh, 4), m30);
                        const __m512i hhi = _mm512_and_si512(p ? _mm512_srli_epi16(qh, 2) : qh, m30);
                        const __m512i qlo = _mm512_ternarylogic_epi32(ql, m4, hlo, AND_OR);
                        const __m512i qhi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), m4, hhi, AND_OR);
                        const size_t e = (size_t)s * QK_K + 4 * rr;
                        for (int r = 0; r < R; r++) {
                            dlo[r] = dp16(dlo[r], qlo, act_at(x, r, e + QK * blo));
                            dhi[r] = dp16(dhi[r], qhi, act_at(x, r, e + QK * bhi));
                        }
                    }
                    const __m512i slo = sc2_i8(blk->sc[2 * blo + h], gap), shi = sc2_i8(blk->sc[2 * bhi + h], gap);
                    const size_t e16 = (size_t)s * 16 + h; /* sub-block of 16 of block 0 */
                    for (int r = 0; r < R; r++) { /* asum: [sub-block][row] */
                        const int32_t alo = asum[(e16 + 2 * blo) * R + r], ahi = asum[(e16 + 2 * bhi) * R + r];
                        const __m512i tlo = _mm512_mullo_epi32(_mm512_sub_epi32(dlo[r], _mm512_set1_epi32(alo)), slo);
                        const __m512i thi = _mm512_mullo_epi32(_mm512_sub_epi32(dhi[r], _mm512_set1_epi32(ahi)), shi);
                        ilo[r] = h ? _mm512_add_epi32(ilo[r], tlo) : tlo;
                        ihi[r] = h ? _mm512_add_epi32(ihi[r], thi) : thi;
                    }
                }
                fold_block(R, acc, ilo, d, x, (size_t)s * 8 + blo);
                if (p == 0) {
                    for (int r = 0; r < R; r++) wait[r] = ihi[r];
                } else {
                    fold_block(R, acc, wait, d, x, (size_t)s * 8 + blo + 1);
                    fold_block(R, acc, ihi, d, x, (size_t)s * 8 + bhi);
                }
            }
        }
    }
    store16(y, ldy, o, o_hi, R, acc, cor, mode);
}

/* ---- Q4_K / Q5_K ------------------------------------------------------------------------------
 * Chunk c of 64 of a super-block: runs rr = 0..7 of qs, low nibbles sub-block 2c, high nibbles
 * 2c + 1 (Q5_K: the fifth bits are bits 2c and 2c + 1 of qh run rr). The mins correction runs
 * beside, in block order (k4_min_correction's). */
static inline __attribute__((always_inline)) void k4_pair(const int R, const int five, float *y, int ldy,
                                                          const uint8_t *g0, size_t gap, int nsb, const act_view *x,
                                                          int o, int o_hi, int mode) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m10 = _mm512_set1_epi8(0x10);
    __m512 acc[ROWS_MAX], cor[ROWS_MAX];
    for (int r = 0; r < R; r++) acc[r] = cor[r] = _mm512_setzero_ps();
    for (int s = 0; s < nsb; s++) {
        const uint16_t *dp, *dminp;
        const uint8_t(*sc)[ROW_GROUP], (*mn)[ROW_GROUP], *qs, *qh = NULL;
        if (five) {
            const block_q5_Kx8 *blk = (const block_q5_Kx8 *)g0 + s;
            dp = blk->d, dminp = blk->dmin, sc = blk->sc, mn = blk->m, qs = blk->qs, qh = blk->qh;
        } else {
            const block_q4_Kx8 *blk = (const block_q4_Kx8 *)g0 + s;
            dp = blk->d, dminp = blk->dmin, sc = blk->sc, mn = blk->m, qs = blk->qs;
        }
        prefetch2((const uint8_t *)dp, gap, five ? sizeof(block_q5_Kx8) : sizeof(block_q4_Kx8));
        const __m512 d = f16x2(dp, gap);
        for (int c = 0; c < 4; c++) {
            /* two chains per sum with few rows (odd runs apart): one chain's latency would bound it */
            __m512i slo[ROWS_MAX], shi[ROWS_MAX], slo2[ROWS_MAX], shi2[ROWS_MAX];
            for (int r = 0; r < R; r++) slo[r] = shi[r] = slo2[r] = shi2[r] = _mm512_setzero_si512();
            for (int rr = 0; rr < 8; rr++) {
                const __m512i w = ld2(qs + 32 * (8 * c + rr), gap);
                __m512i lo, hi;
                if (five) {
                    const __m512i vh = ld2(qh + 32 * rr, gap);
                    /* bit 2c (2c + 1) of each byte to bit 4 */
                    const __m512i blo = _mm512_and_si512(c < 2 ? _mm512_slli_epi16(vh, 4 - 2 * c) : _mm512_srli_epi16(vh, 2 * c - 4), m10);
                    const __m512i bhi = _mm512_and_si512(c < 2 ? _mm512_slli_epi16(vh, 3 - 2 * c) : _mm512_srli_epi16(vh, 2 * c - 3), m10);
                    lo = _mm512_ternarylogic_epi32(w, m4, blo, AND_OR);
                    hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(w, 4), m4, bhi, AND_OR);
                } else {
                    lo = _mm512_and_si512(w, m4);
                    hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
                }
                const size_t e = (size_t)s * QK_K + 64 * c + 4 * rr;
                for (int r = 0; r < R; r++) {
                    if (R <= 2 && (rr & 1)) {
                        slo2[r] = dp16(slo2[r], lo, act_at(x, r, e));
                        shi2[r] = dp16(shi2[r], hi, act_at(x, r, e + 32));
                    } else {
                        slo[r] = dp16(slo[r], lo, act_at(x, r, e));
                        shi[r] = dp16(shi[r], hi, act_at(x, r, e + 32));
                    }
                }
            }
            const __m512i sclo = sc2_u8(sc[2 * c], gap), schi = sc2_u8(sc[2 * c + 1], gap);
            __m512i ilo[ROWS_MAX], ihi[ROWS_MAX];
            for (int r = 0; r < R; r++) {
                if (R <= 2) {
                    slo[r] = _mm512_add_epi32(slo[r], slo2[r]);
                    shi[r] = _mm512_add_epi32(shi[r], shi2[r]);
                }
                ilo[r] = _mm512_mullo_epi32(slo[r], sclo);
                ihi[r] = _mm512_mullo_epi32(shi[r], schi);
            }
            fold_block(R, acc, ilo, d, x, (size_t)s * 8 + 2 * c);
            fold_block(R, acc, ihi, d, x, (size_t)s * 8 + 2 * c + 1);
        }
        /* cor -= dmin * m_j * as_b over the super-block's 8 blocks, in order */
        const __m512 dmin = f16x2(dminp, gap);
        for (int j = 0; j < 8; j++) {
            const __m512 mf = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(sc2_u8(mn[j], gap)));
            for (int r = 0; r < R; r++)
                cor[r] = _mm512_fnmadd_ps(mf, _mm512_set1_ps(act_s(x, r, (size_t)s * 8 + j)), cor[r]);
        }
    }
    store16(y, ldy, o, o_hi, R, acc, cor, mode);
}

/* ---- Q8_0, Q5_0, Q5_1: blocks of 32 -----------------------------------------------------------
 * Q8_0 runs biased (w + 128, unsigned) and takes 128 x each activation block's sum off (abias),
 * as x86_gemm_x8.h's KIND_Q8_0_BIASED; Q5_0/Q5_1 as x86_gemm_k.h's tile_q5 (the fifth bits of
 * run j's low nibbles are bit j of each qh byte, of its high nibbles bit 4 + j): Q5_0 takes 16 x
 * each activation block's sum off (abias), so its isum is dot(q - 16, a); Q5_1's correction
 * cor = fma(m, as_b, cor) runs beside. */
static inline __attribute__((always_inline)) void b32_pair(const int R, const int kind, float *y, int ldy,
                                                           const uint8_t *g0, size_t gap, int nb, const act_view *x,
                                                           const int32_t *abias, int o, int o_hi, int mode) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m10 = _mm512_set1_epi8(0x10), bias = _mm512_set1_epi8((char)0x80);
    __m512 acc[ROWS_MAX], cor[ROWS_MAX];
    for (int r = 0; r < R; r++) acc[r] = cor[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m512i s1[ROWS_MAX], s2[ROWS_MAX];
        for (int r = 0; r < R; r++) s1[r] = s2[r] = _mm512_setzero_si512();
        const uint16_t *dp, *mp = NULL;
        prefetch2(g0 + (size_t)b * (kind == ROWS_Q8_0 ? sizeof(block_q8_0x8) : kind == ROWS_Q5_0 ? sizeof(block_q5_0x8) : sizeof(block_q5_1x8)), gap,
                  kind == ROWS_Q8_0 ? sizeof(block_q8_0x8) : kind == ROWS_Q5_0 ? sizeof(block_q5_0x8) : sizeof(block_q5_1x8));
        if (kind == ROWS_Q8_0) {
            const block_q8_0x8 *blk = (const block_q8_0x8 *)g0 + b;
            dp = blk->d;
            for (int j = 0; j < QK / 4; j++) {
                const __m512i wu = _mm512_xor_si512(ld2((const uint8_t *)blk->qs + 32 * j, gap), bias);
                for (int r = 0; r < R; r++) {
                    const int8_t *a = act_at(x, r, (size_t)b * QK + 4 * j);
                    if (j & 1) s2[r] = dp16(s2[r], wu, a);
                    else s1[r] = dp16(s1[r], wu, a);
                }
            }
            for (int r = 0; r < R; r++) /* abias: [block][row] */
                s1[r] = _mm512_sub_epi32(_mm512_add_epi32(s1[r], s2[r]), _mm512_set1_epi32(abias[(size_t)b * R + r]));
        } else {
            const uint8_t *qs, *qh;
            if (kind == ROWS_Q5_0) {
                const block_q5_0x8 *blk = (const block_q5_0x8 *)g0 + b;
                dp = blk->d, qs = blk->qs, qh = blk->qh;
            } else {
                const block_q5_1x8 *blk = (const block_q5_1x8 *)g0 + b;
                dp = blk->d, mp = blk->m, qs = blk->qs, qh = blk->qh;
            }
            const __m512i vh = ld2(qh, gap);
            for (int j = 0; j < 4; j++) {
                const __m512i w = ld2(qs + 32 * j, gap);
                const __m512i hl = _mm512_and_si512(_mm512_slli_epi16(vh, 4 - j), m10);
                const __m512i hh = _mm512_and_si512(j ? _mm512_srli_epi16(vh, j) : vh, m10);
                const __m512i lo = _mm512_ternarylogic_epi32(w, m4, hl, AND_OR);
                const __m512i hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(w, 4), m4, hh, AND_OR);
                const size_t e = (size_t)b * QK + 4 * j;
                for (int r = 0; r < R; r++) {
                    s1[r] = dp16(s1[r], lo, act_at(x, r, e));
                    s2[r] = dp16(s2[r], hi, act_at(x, r, e + 16));
                }
            }
            for (int r = 0; r < R; r++) {
                s1[r] = _mm512_add_epi32(s1[r], s2[r]);
                if (kind == ROWS_Q5_0) s1[r] = _mm512_sub_epi32(s1[r], _mm512_set1_epi32(abias[(size_t)b * R + r]));
            }
        }
        const __m512 d = f16x2(dp, gap);
        fold_block(R, acc, s1, d, x, (size_t)b);
        if (kind == ROWS_Q5_1) {
            const __m512 c = f16x2(mp, gap);
            for (int r = 0; r < R; r++) cor[r] = _mm512_fmadd_ps(c, _mm512_set1_ps(act_s(x, r, b)), cor[r]);
        }
    }
    store16(y, ldy, o, o_hi, R, acc, cor, mode);
}

/* One pass of rows_groups: R rows of y from row y, read through x (asum: Q6_K's, Q8_0's and Q5_0's sums
 * of x's rows, rows_call). */
typedef struct {
    float *y;
    act_view x;
    const int32_t *asum;
} rows_pass;

static inline __attribute__((always_inline)) void pair_pass(int kind, const int R, const rows_pass *ps, int ldy,
                                                            const uint8_t *g0, size_t gap, int nsb, int o, int o_hi,
                                                            int mode) {
    if (kind == ROWS_Q6_K) q6_pair(R, ps->y, ldy, g0, gap, nsb, &ps->x, ps->asum, o, o_hi, mode);
    else if (kind == ROWS_Q4_K || kind == ROWS_Q5_K) k4_pair(R, kind == ROWS_Q5_K, ps->y, ldy, g0, gap, nsb, &ps->x, o, o_hi, mode);
    else b32_pair(R, kind, ps->y, ldy, g0, gap, nsb, &ps->x, ps->asum, o, o_hi, mode);
}

/* The whole groups of [o0, o1), two at a time: R rows in one pass over each pair of groups, and
 * R2 more (when R2 > 0) in a second pass over the same pair while it is in cache. */
static inline __attribute__((always_inline)) int rows_groups(int kind, const int R, const int R2, int ldy,
                                                             const gemm_weight *w, int o0, int o1, const rows_pass *p1,
                                                             const rows_pass *p2, int accumulate) {
    int end = w->x8 ? w->n_out / ROW_GROUP * ROW_GROUP : o0;
    if (end > o1) end = o1;
    if (end <= o0) return o0;
    static const size_t blk_bytes[] = {[ROWS_Q6_K] = sizeof(block_q6_Kx8), [ROWS_Q4_K] = sizeof(block_q4_Kx8),
                                       [ROWS_Q5_K] = sizeof(block_q5_Kx8), [ROWS_Q8_0] = sizeof(block_q8_0x8),
                                       [ROWS_Q5_0] = sizeof(block_q5_0x8), [ROWS_Q5_1] = sizeof(block_q5_1x8)};
    const int k_quant = kind == ROWS_Q6_K || kind == ROWS_Q4_K || kind == ROWS_Q5_K;
    const int nsb = w->n_in / (k_quant ? QK_K : QK); /* (super-)blocks per row */
    const size_t gap = blk_bytes[kind] * (size_t)nsb;
    /* group i beside group i + half: each half of the range streams in order (neighbouring
     * pairs, which jump every two groups, measured 2x slower from memory), an odd last group
     * alone */
    const int groups = (end - o0) / ROW_GROUP, half = groups / 2;
    /* NOTE: from 2 rows, a vocabulary-sized output (the logits: 4 MB a step at 4 rows of Gemma
     * 3's 262144) goes out by non-temporal stores. Nothing reads it in the step, and the
     * output matrix streaming past evicts it before the step ends, so ordinary stores first
     * read each of its lines from memory (4 MB more to read at 4 rows of Gemma 3) and write
     * them back later; streamed, they are only written. The same values (y's numbers do not
     * depend on how they are stored). In one process, 1- and 4-slot steps alternating with and
     * without (window 2026-12-02 12:10 UTC, 4 rounds of 40 positions): Gemma 3's 4-slot step
     * 7.64 -> 7.45 ms, 4 slots 3.52x -> 3.58x one slot on average and ahead in every round;
     * Qwen2.5-Coder 3.56x -> 3.61x, ahead in every round. One row keeps ordinary stores (a
     * one-slot step's Q8_0 logits run x86_gemm_x8.h's tiles, not these kernels). */
    const int stream = R >= 2 && w->n_out >= STREAM_MIN_OUT && ((uintptr_t)p1->y | (size_t)ldy * 4) % 16 == 0;
    const int mode = accumulate ? STORE_ADD : stream ? STORE_STREAM : STORE_SET;
    for (int i = 0; i < groups - half; i++) {
        const int two = i < half;
        const int lo_g = two ? i : 2 * half; /* the low half's group (or the odd last one) */
        const uint8_t *g0 = (const uint8_t *)w->x8 + (size_t)(o0 / ROW_GROUP + lo_g) * gap;
        const size_t g = two ? (size_t)half * gap : 0;
        const int o = o0 + ROW_GROUP * lo_g, o_hi = two ? o + ROW_GROUP * half : -1;
        pair_pass(kind, R, p1, ldy, g0, g, nsb, o, o_hi, mode);
        if (R2) pair_pass(kind, R2, p2, ldy, g0, g, nsb, o, o_hi, mode);
    }
    if (mode == STORE_STREAM) _mm_sfence(); /* the streamed lines before the phase's end */
    return end;
}

/* Row r's 4-byte runs and block scales and sums interleaved (act_view): run i at q[4 * (R * i + r)],
 * block b's at d, s[R * b + r]. */
static inline __attribute__((always_inline)) void interleave(const int R, const act_rows *x, int8_t *q, float *d, float *s) {
    const int k = x->k, nb = k / QK;
    for (int i = 0; i < k / 4; i++)
        for (int r = 0; r < R; r++) memcpy(q + 4 * ((size_t)R * i + r), x->qs + (size_t)r * k + 4 * i, 4);
    for (int b = 0; b < nb; b++)
        for (int r = 0; r < R; r++) {
            d[(size_t)R * b + r] = x->d[(size_t)r * nb + b];
            s[(size_t)R * b + r] = x->s[(size_t)r * nb + b];
        }
}

/* Staging of one pass's R rows (x's first R): the kind's sums and, from 2 rows, the rows
 * interleaved. */
typedef struct {
    int32_t asum[ROWS_MAX * (MAX_ROW_LEN / 16)]; /* [sub-block or block][row] */
    int8_t q[ROWS_MAX * MAX_ROW_LEN] __attribute__((aligned(64)));
    float d[ROWS_MAX * (MAX_ROW_LEN / QK)], s[ROWS_MAX * (MAX_ROW_LEN / QK)];
} rows_stage;

static inline __attribute__((always_inline)) void rows_prep(int kind, const int R, float *y, const act_rows *x,
                                                            rows_stage *st, rows_pass *ps) {
    const int k = x->k, nb = k / QK;
    if (kind == ROWS_Q6_K) {
        /* 32 x each row's sum of its quantized activations over every 16 (x86_gemm_k.h k_asum) */
        for (int r = 0; r < R; r++)
            for (int i = 0; i < k / 16; i++) {
                const int8_t *a = x->qs + (size_t)r * k + 16 * (size_t)i;
                int sum = 0;
                for (int e = 0; e < 16; e++) sum += a[e];
                st->asum[(size_t)i * R + r] = 32 * sum;
            }
    } else if (kind == ROWS_Q8_0 || kind == ROWS_Q5_0) {
        /* 128 (Q8_0: x86_vnni.c's abias) or 16 (Q5_0: x86_gemm_k.h k_asum) x each row's sum of
         * its quantized activations over every block */
        const int mul = kind == ROWS_Q8_0 ? 128 : 16;
        for (int r = 0; r < R; r++)
            for (int b = 0; b < nb; b++) {
                const int8_t *a = x->qs + (size_t)r * k + (size_t)b * QK;
                int sum = 0;
                for (int e = 0; e < QK; e++) sum += a[e];
                st->asum[(size_t)b * R + r] = mul * sum;
            }
    }
    ps->y = y;
    ps->asum = st->asum;
    if (R >= 2) {
        interleave(R, x, st->q, st->d, st->s);
        const act_view iv = {st->q, st->d, st->s, 4, (size_t)R, 1, (size_t)R};
        ps->x = iv;
    } else {
        const act_view v = {x->qs, x->d, x->s, (size_t)k, 1, (size_t)nb, 1};
        ps->x = v;
    }
}

/* R rows (1 .. 2 ROWS_MAX): up to ROWS_MAX in a first pass, the rest in a second. */
static inline __attribute__((always_inline)) int rows_call(int kind, const int R, float *y, int ldy, const gemm_weight *w,
                                                           int o0, int o1, const act_rows *x, int accumulate) {
    const int R1 = R > ROWS_MAX ? ROWS_MAX : R, R2 = R - R1;
    rows_stage st1, st2;
    rows_pass p1, p2;
    rows_prep(kind, R1, y, x, &st1, &p1);
    if (R2) {
        const int k = x->k, nb = k / QK;
        const act_rows rest = {x->f ? x->f + (size_t)R1 * k : NULL, x->qs + (size_t)R1 * k, x->d + (size_t)R1 * nb,
                               x->s + (size_t)R1 * nb, k};
        rows_prep(kind, R2, y + (size_t)R1 * ldy, &rest, &st2, &p2);
    }
    return rows_groups(kind, R1, R2, ldy, w, o0, o1, &p1, &p2, accumulate);
}

int gemm_rows_vnni(int kind, float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows,
                   int accumulate) {
    switch (n_rows) {
    case 1: return rows_call(kind, 1, y, ldy, w, o0, o1, x, accumulate);
    case 2: return rows_call(kind, 2, y, ldy, w, o0, o1, x, accumulate);
    case 3: return rows_call(kind, 3, y, ldy, w, o0, o1, x, accumulate);
    case 4: return rows_call(kind, 4, y, ldy, w, o0, o1, x, accumulate);
    case 5: return rows_call(kind, 5, y, ldy, w, o0, o1, x, accumulate);
    case 6: return rows_call(kind, 6, y, ldy, w, o0, o1, x, accumulate);
    case 7: return rows_call(kind, 7, y, ldy, w, o0, o1, x, accumulate);
    case 8: return rows_call(kind, 8, y, ldy, w, o0, o1, x, accumulate);
    default: return o0;
    }
}

#endif /* x86 */
