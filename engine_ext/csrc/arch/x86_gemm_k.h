/* The row-group micro-kernels of the quant_k.h block types (Q5_0, Q5_1, Q2_K .. Q6_K) and their
 * matmul driver, for two instruction sets: included by x86_avx2_k.c (X8_VNNI 0: maddubs/madd,
 * int16 stages) and x86_vnni.c (X8_VNNI 1: AVX512-VNNI vpdpbusd on 256-bit vectors; Q5_0, Q5_1,
 * Q4_K, Q5_K, Q6_K only). The includer sets its target pragma, includes <immintrin.h> (and, for
 * VNNI, x86_gemm_x8.h: x8_dpbusd_bcast), and defines X8_VNNI and K_TILE (most activation rows
 * per micro-kernel call).
 * What the two share: the block tables and scale helpers, the Q4_K/Q5_K mins correction
 * (k4_min_correction), the tile dispatch (run_tile), the tail-row packing and stores
 * (group_tile, store_lanes) and the driver (gemm_k_rows, gemm_k). What is written once per
 * instruction set: the three tiles tile_q5 (Q5_0, Q5_1), tile_k4 (Q4_K, Q5_K) and tile_q6_K;
 * tile_k2 (Q2_K, Q3_K) exists for AVX2 only (the avx512vnni variant runs those types on it).
 *
 * Design: the block types run on row groups only (quant_k.h x8 layouts): lane i of every vector
 * is weight row 8g+i, so integer dot products land row by row in the lanes with no horizontal
 * sums. Rows outside whole groups (a matrix's last n_out % 8 rows, or every row of a weight
 * without groups) are packed into a zero-padded group CHUNK blocks at a time and run through
 * the same code: a row's operations depend only on its lane, never on which rows are in the
 * call (kernels.h NOTE). Per (weight row, activation row) the float operations are, block by
 * block in order, whatever the instruction set and tile width:
 *   acc = fma(float(isum_b), d * ad_b, acc)        isum_b: integer dot product of activation
 *                                                  block b, sub-block scales applied in int32
 *   cor = fma(c_b, as_b, cor)                      (Q5_1: c = m; Q4_K/Q5_K per sub-block:
 *                                                  cor -= dmin * m_j * as_b; Q2_K:
 *                                                  cor -= dmin * ad_b * msum_b; Q5_0, Q6_K,
 *                                                  Q3_K: none)
 *   y = acc + cor
 * isum_b is exact either way; Q5_0's is dot(q - 16, a), its signed quants' (so no correction).
 * AVX2: integer sums stay within int16 between widenings: maddubs products of a 4-element run
 * pair are at most 2 * 15 * 127 (4-bit), 2 * 31 * 127 (5-bit) or 2 * 32 * 127 (Q6_K, signed by
 * sign_epi8), so 8, 4 and 4 runs are summed before madd_epi16 widens them (and applies the
 * scales); Q5_0 sums its 8 runs modulo 2^16 and takes 16 x the activation sums off (tile_q5,
 * k_asum). VNNI: int32 from
 * the first product (see its tiles).
 * NOTE: so the variants give bit-identical results (tests/engine/test_kernels_kquants.py holds
 * them to ==). */
#ifndef SLOTSERVE_X86_GEMM_K_H
#define SLOTSERVE_X86_GEMM_K_H

#include "x86_avx2_bits.h"

#define CHUNK 8  /* blocks per packing of rows outside whole groups */

enum { KIND_Q5_0, KIND_Q5_1, KIND_Q4_K, KIND_Q5_K, KIND_Q6_K, KIND_Q2_K, KIND_Q3_K };

static inline int kind_type(int kind) {
    static const int types[] = {GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
                                GGML_TYPE_Q6_K, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K};
    return types[kind];
}

static inline size_t kind_x8_bytes(int kind) {
    static const size_t bytes[] = {sizeof(block_q5_0x8), sizeof(block_q5_1x8), sizeof(block_q4_Kx8),
                                   sizeof(block_q5_Kx8), sizeof(block_q6_Kx8), sizeof(block_q2_Kx8),
                                   sizeof(block_q3_Kx8)};
    return bytes[kind];
}

/* Elements per activation sum of the VNNI tiles' tables (k_asum): Q6_K's sub-blocks of 16, Q5_0's
 * blocks of 32. */
static inline int k_asum_span(int kind) { return kind == KIND_Q6_K ? 16 : QK; }

/* Q4_K / Q5_K: super-block s's correction for the mins, the same in both variants: cor[r] takes off
 * dmin * m[j] * (row r's activation sum over sub-block j) per lane. blk0 points at x8 super-block s0. */
static inline __attribute__((always_inline)) void k4_min_correction(int five, const int R, const void *blk0, int s0,
                                                                    int s, const act_rows *x, int r0, __m256 *cor) {
    const int nb = x->k / QK;
    const block_q5_Kx8 *b5 = (const block_q5_Kx8 *)blk0 + (s - s0);
    const block_q4_Kx8 *b4 = (const block_q4_Kx8 *)blk0 + (s - s0);
    const uint16_t *dminp = five ? b5->dmin : b4->dmin;
    const uint8_t(*mn)[ROW_GROUP] = five ? b5->m : b4->m;
    const __m256 dmin8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dminp));
    for (int j = 0; j < 8; j++) {
        const __m256 mf = _mm256_mul_ps(dmin8, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)mn[j]))));
        for (int r = 0; r < R; r++)
            cor[r] = _mm256_fnmadd_ps(mf, _mm256_set1_ps(x->s[(size_t)(r0 + r) * nb + (size_t)s * 8 + j]), cor[r]);
    }
}

/* ---- micro-kernels: one group of 8 weight rows, blocks [b0, b1), R activation rows -------------- */

#if !X8_VNNI
/* Q5_0 / Q5_1: blocks of 32. blk points at x8 block b0; asum: Q5_0's activation offsets of rows
 * r0.. (k_asum). */
static inline __attribute__((always_inline)) void tile_q5(int kind, const int R, const void *blk0, int b0, int b1,
                                                          const act_rows *x, int r0, __m256 *acc, __m256 *cor,
                                                          const int32_t *asum) {
    const int k = x->k, nb = k / QK;
    const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(15);
    for (int b = b0; b < b1; b++) {
        const uint8_t *qs, *qh;
        const uint16_t *dp, *mp = NULL;
        if (kind == KIND_Q5_0) {
            const block_q5_0x8 *blk = (const block_q5_0x8 *)blk0 + (b - b0);
            qs = blk->qs, qh = blk->qh, dp = blk->d;
        } else {
            const block_q5_1x8 *blk = (const block_q5_1x8 *)blk0 + (b - b0);
            qs = blk->qs, qh = blk->qh, dp = blk->d, mp = blk->m;
        }
        const __m256i vh = _mm256_loadu_si256((const __m256i *)qh);
        __m256i isum[K_TILE];
        if (kind == KIND_Q5_0) {
            /* the 8 runs of unsigned quants summed in int16 modulo 2^16 (vpaddw wraps), less
             * 16 x the activation bytes each int16 lane multiplied (asum, k_asum): per lane
             * the dot product of q - 16 over its 16 bytes, within 16 x 16 x 127 < 2^15, so
             * exact; one madd_epi16 adds a row's two lanes: dot(q - 16, a) */
            for (int j = 0; j < 4; j++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
                const __m256i lo = _mm256_or_si256(_mm256_and_si256(w, low4), bit_to_4(vh, j));
                const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w, 4), low4), bit_to_4(vh, 4 + j));
                for (int r = 0; r < R; r++) {
                    const int8_t *a = x->qs + (size_t)(r0 + r) * k + b * QK;
                    __m256i p = _mm256_maddubs_epi16(lo, bcast4(a + 4 * j));
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(hi, bcast4(a + 16 + 4 * j)));
                    isum[r] = j ? _mm256_add_epi16(isum[r], p) : p;
                    __asm__("" : "+x"(isum[r])); /* keep the sum a chain (see x86_avx2.c) */
                }
            }
            const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dp));
            for (int r = 0; r < R; r++) {
                const __m256i off = _mm256_set1_epi32(asum[(size_t)r * nb + b]);
                const __m256i i32 = _mm256_madd_epi16(_mm256_sub_epi16(isum[r], off), ones);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32), _mm256_mul_ps(d8, _mm256_set1_ps(x->d[(size_t)(r0 + r) * nb + b])), acc[r]);
            }
            continue;
        }
        for (int r = 0; r < R; r++) isum[r] = _mm256_setzero_si256();
        for (int half = 0; half < 2; half++) {
            __m256i p16[K_TILE];
            for (int r = 0; r < R; r++) p16[r] = _mm256_setzero_si256();
            for (int jj = 0; jj < 2; jj++) {
                const int j = 2 * half + jj;
                const __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
                const __m256i lo = _mm256_or_si256(_mm256_and_si256(w, low4), bit_to_4(vh, j));
                const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w, 4), low4), bit_to_4(vh, 4 + j));
                for (int r = 0; r < R; r++) {
                    const int8_t *a = x->qs + (size_t)(r0 + r) * k + b * QK;
                    __m256i p = _mm256_maddubs_epi16(lo, bcast4(a + 4 * j));
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(hi, bcast4(a + 16 + 4 * j)));
                    p16[r] = _mm256_add_epi16(p16[r], p);
                    __asm__("" : "+x"(p16[r])); /* keep the sum a chain (see x86_avx2.c) */
                }
            }
            for (int r = 0; r < R; r++) isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p16[r], ones));
        }
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dp));
        const __m256 c8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)mp));
        for (int r = 0; r < R; r++) {
            const size_t rb = (size_t)(r0 + r) * nb + b;
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(d8, _mm256_set1_ps(x->d[rb])), acc[r]);
            cor[r] = _mm256_fmadd_ps(c8, _mm256_set1_ps(x->s[rb]), cor[r]);
        }
    }
}

/* Q4_K / Q5_K: super-blocks of 256; chunk c of 64 = sub-blocks 2c (low nibbles), 2c+1 (high). */
static inline __attribute__((always_inline)) void tile_k4(int kind, const int R, const void *blk0, int s0, int s1,
                                                          const act_rows *x, int r0, __m256 *acc, __m256 *cor) {
    const int k = x->k, nb = k / QK;
    const int five = kind == KIND_Q5_K, runs = five ? 4 : 8; /* runs summed in int16 */
    const __m256i low4 = _mm256_set1_epi8(15);
    for (int s = s0; s < s1; s++) {
        const uint16_t *dp;
        const uint8_t(*sc)[ROW_GROUP];
        const uint8_t *qs, *qh = NULL;
        if (five) {
            const block_q5_Kx8 *blk = (const block_q5_Kx8 *)blk0 + (s - s0);
            dp = blk->d, sc = blk->sc, qs = blk->qs, qh = blk->qh;
        } else {
            const block_q4_Kx8 *blk = (const block_q4_Kx8 *)blk0 + (s - s0);
            dp = blk->d, sc = blk->sc, qs = blk->qs;
        }
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dp));
        for (int c = 0; c < 4; c++) {
            const __m256i sc_lo = scale_pairs_u8(sc[2 * c]), sc_hi = scale_pairs_u8(sc[2 * c + 1]);
            __m256i i_lo[K_TILE], i_hi[K_TILE];
            for (int r = 0; r < R; r++) i_lo[r] = i_hi[r] = _mm256_setzero_si256();
            for (int h = 0; h < 8; h += runs) {
                __m256i p_lo[K_TILE], p_hi[K_TILE];
                for (int r = 0; r < R; r++) p_lo[r] = p_hi[r] = _mm256_setzero_si256();
                for (int rr = h; rr < h + runs; rr++) {
                    const __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 32 * (8 * c + rr)));
                    __m256i lo = _mm256_and_si256(w, low4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
                    if (five) {
                        const __m256i vh = _mm256_loadu_si256((const __m256i *)(qh + 32 * rr));
                        lo = _mm256_or_si256(lo, bit_to_4(vh, 2 * c));
                        hi = _mm256_or_si256(hi, bit_to_4(vh, 2 * c + 1));
                    }
                    for (int r = 0; r < R; r++) {
                        const int8_t *a = x->qs + (size_t)(r0 + r) * k + (size_t)s * QK_K + 64 * c;
                        p_lo[r] = _mm256_add_epi16(p_lo[r], _mm256_maddubs_epi16(lo, bcast4(a + 4 * rr)));
                        p_hi[r] = _mm256_add_epi16(p_hi[r], _mm256_maddubs_epi16(hi, bcast4(a + 32 + 4 * rr)));
                        __asm__("" : "+x"(p_lo[r]), "+x"(p_hi[r]));
                    }
                }
                for (int r = 0; r < R; r++) {
                    i_lo[r] = _mm256_add_epi32(i_lo[r], _mm256_madd_epi16(p_lo[r], sc_lo));
                    i_hi[r] = _mm256_add_epi32(i_hi[r], _mm256_madd_epi16(p_hi[r], sc_hi));
                }
            }
            for (int r = 0; r < R; r++) {
                const size_t rb = (size_t)(r0 + r) * nb + (size_t)s * 8 + 2 * c;
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i_lo[r]), _mm256_mul_ps(d8, _mm256_set1_ps(x->d[rb])), acc[r]);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i_hi[r]), _mm256_mul_ps(d8, _mm256_set1_ps(x->d[rb + 1])), acc[r]);
            }
        }
        k4_min_correction(five, R, blk0, s0, s, x, r0, cor);
    }
}

/* Q6_K: super-blocks of 256 = 2 halves x 4 quarters (activation blocks) x 2 sub-blocks of 16. */
static inline __attribute__((always_inline)) void tile_q6_K(const int R, const void *blk0, int s0, int s1,
                                                            const act_rows *x, int r0, __m256 *acc) {
    const int k = x->k, nb = k / QK;
    const __m256i low4 = _mm256_set1_epi8(15), off = _mm256_set1_epi8(32);
    for (int s = s0; s < s1; s++) {
        const block_q6_Kx8 *blk = (const block_q6_Kx8 *)blk0 + (s - s0);
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk->d));
        for (int n = 0; n < 2; n++)
            for (int g = 0; g < 4; g++) {
                const int b = 4 * n + g; /* activation block within the super-block */
                __m256i isum[K_TILE];
                for (int r = 0; r < R; r++) isum[r] = _mm256_setzero_si256();
                for (int h = 0; h < 2; h++) {
                    const __m256i scv = scale_pairs_i8(blk->sc[2 * b + h]);
                    __m256i p[K_TILE];
                    for (int r = 0; r < R; r++) p[r] = _mm256_setzero_si256();
                    for (int rr = 4 * h; rr < 4 * h + 4; rr++) {
                        const __m256i vl = _mm256_loadu_si256((const __m256i *)(blk->q + q6x8_ql(16 * n + 8 * (g & 1) + rr)));
                        const __m256i vh = _mm256_loadu_si256((const __m256i *)(blk->q + q6x8_qh(8 * n + rr)));
                        const __m256i nib = g < 2 ? _mm256_and_si256(vl, low4) : _mm256_and_si256(_mm256_srli_epi16(vl, 4), low4);
                        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(nib, q6_high(vh, g)), off);
                        const __m256i qa = _mm256_sign_epi8(q, q);
                        for (int r = 0; r < R; r++) {
                            const int8_t *a = x->qs + (size_t)(r0 + r) * k + (size_t)s * QK_K + QK * b + 4 * rr;
                            p[r] = _mm256_add_epi16(p[r], _mm256_maddubs_epi16(qa, _mm256_sign_epi8(bcast4(a), q)));
                            __asm__("" : "+x"(p[r]));
                        }
                    }
                    for (int r = 0; r < R; r++) isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p[r], scv));
                }
                for (int r = 0; r < R; r++) {
                    const size_t rb = (size_t)(r0 + r) * nb + (size_t)s * 8 + b;
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(d8, _mm256_set1_ps(x->d[rb])), acc[r]);
                }
            }
    }
}

/* Q2_K / Q3_K: super-blocks of 256 = 2 halves x 4 activation blocks x 2 sub-blocks of 16. The
 * 2-bit quants of block b = 4n + j are bits 2j of the qs runs of half n; Q3_K's third bit is bit
 * 4n + j of the hmask runs (clear: subtract 4), and its signed quants multiply by sign_epi8 as
 * Q6_K's; Q2_K's mins need the activation's per-16 sums (as covers 32), summed here per row. */
static inline __attribute__((always_inline)) void tile_k2(int kind, const int R, const void *blk0, int s0, int s1,
                                                          const act_rows *x, int r0, __m256 *acc, __m256 *cor) {
    const int k = x->k, nb = k / QK, three = kind == KIND_Q3_K;
    const __m256i three8 = _mm256_set1_epi8(3), four8 = _mm256_set1_epi8(4);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int s = s0; s < s1; s++) {
        const block_q2_Kx8 *b2 = (const block_q2_Kx8 *)blk0 + (s - s0);
        const block_q3_Kx8 *b3 = (const block_q3_Kx8 *)blk0 + (s - s0);
        const uint8_t *qs = three ? b3->qs : b2->qs;
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(three ? b3->d : b2->d)));
        const __m256 dmin8 = three ? d8 : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b2->dmin));
        for (int n = 0; n < 2; n++)
            for (int j = 0; j < 4; j++) {
                const int b = 4 * n + j;
                const __m128i shift = _mm_cvtsi32_si128(2 * j);
                __m256i isum[K_TILE];
                for (int r = 0; r < R; r++) isum[r] = _mm256_setzero_si256();
                for (int h = 0; h < 2; h++) {
                    __m256i scv;
                    if (three) {
                        scv = scale_pairs_i8(b3->sc[2 * b + h]);
                    } else {
                        __m256i v = _mm256_and_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)b2->scales[2 * b + h])),
                                                     _mm256_set1_epi32(15));
                        scv = _mm256_or_si256(v, _mm256_slli_epi32(v, 16));
                    }
                    __m256i p[K_TILE];
                    for (int r = 0; r < R; r++) p[r] = _mm256_setzero_si256();
                    for (int rr = 4 * h; rr < 4 * h + 4; rr++) {
                        const __m256i vq = _mm256_loadu_si256((const __m256i *)(qs + 32 * (8 * n + rr)));
                        __m256i q = _mm256_and_si256(_mm256_srl_epi16(vq, shift), three8);
                        if (three) {
                            const __m256i vh = _mm256_loadu_si256((const __m256i *)(b3->hmask + 32 * rr));
                            q = _mm256_sub_epi8(_mm256_or_si256(q, bit_to(vh, 4 * n + j, 2)), four8);
                            const __m256i qa = _mm256_sign_epi8(q, q);
                            for (int r = 0; r < R; r++) {
                                const int8_t *a = x->qs + (size_t)(r0 + r) * k + (size_t)s * QK_K + QK * b + 4 * rr;
                                p[r] = _mm256_add_epi16(p[r], _mm256_maddubs_epi16(qa, _mm256_sign_epi8(bcast4(a), q)));
                                __asm__("" : "+x"(p[r]));
                            }
                        } else {
                            for (int r = 0; r < R; r++) {
                                const int8_t *a = x->qs + (size_t)(r0 + r) * k + (size_t)s * QK_K + QK * b + 4 * rr;
                                p[r] = _mm256_add_epi16(p[r], _mm256_maddubs_epi16(q, bcast4(a)));
                                __asm__("" : "+x"(p[r]));
                            }
                        }
                    }
                    for (int r = 0; r < R; r++) isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p[r], scv));
                }
                for (int r = 0; r < R; r++) {
                    const size_t rb = (size_t)(r0 + r) * nb + (size_t)s * 8 + b;
                    const __m256 da = _mm256_set1_ps(x->d[rb]);
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(d8, da), acc[r]);
                    if (!three) {
                        /* per-16 sums of the activation block: lanes 0-3 first half, 4-7 second */
                        const __m256i a32 = _mm256_loadu_si256((const __m256i *)(x->qs + (size_t)(r0 + r) * k + (size_t)s * QK_K + QK * b));
                        __m256i t = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, a32), ones16);
                        t = _mm256_hadd_epi32(t, t);
                        t = _mm256_hadd_epi32(t, t);
                        const __m256i sa = _mm256_permutevar8x32_epi32(t, _mm256_setzero_si256());
                        const __m256i sb = _mm256_permutevar8x32_epi32(t, _mm256_set1_epi32(4));
                        const __m256i m0 = _mm256_srli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)b2->scales[2 * b])), 4);
                        const __m256i m1 = _mm256_srli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)b2->scales[2 * b + 1])), 4);
                        /* m fills the low int16 of each lane (high 0), |sum16| <= 2032 its partner */
                        const __m256i msum = _mm256_add_epi32(_mm256_madd_epi16(m0, sa), _mm256_madd_epi16(m1, sb));
                        cor[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmin8, da), cor[r]);
                    }
                }
            }
    }
}

#else
/* VNNI: vpdpbusd adds the four u8 x s8 products of each 32-bit lane into int32 directly, so
 * a block's dot product needs no int16 stage; sub-block scales multiply the int32 sums
 * (vpmulld). The float operations are the AVX2 tiles', in the same order per chain; the
 * corrections (cor) run as a second pass over the blocks, which keeps their chain's order and
 * frees registers for 8 rows. */

/* Q5_0 / Q5_1; Q5_0's quants unsigned (q, as stored) into vpdpbusd, then 16 x the activation
 * block's sum taken off (asum, k_asum): dot(q - 16, a) exactly, the AVX2 tiles' integer. */
static inline __attribute__((always_inline)) void tile_q5(int kind, const int R, const void *blk0, int b0, int b1,
                                                          const act_rows *x, int r0, __m256 *acc, __m256 *cor,
                                                          const int32_t *asum) {
    const int k = x->k, nb = k / QK;
    const __m256i low4 = _mm256_set1_epi8(15);
    for (int b = b0; b < b1; b++) {
        const uint8_t *qs, *qh;
        const uint16_t *dp;
        if (kind == KIND_Q5_0) {
            const block_q5_0x8 *blk = (const block_q5_0x8 *)blk0 + (b - b0);
            qs = blk->qs, qh = blk->qh, dp = blk->d;
        } else {
            const block_q5_1x8 *blk = (const block_q5_1x8 *)blk0 + (b - b0);
            qs = blk->qs, qh = blk->qh, dp = blk->d;
        }
        const __m256i vh = _mm256_loadu_si256((const __m256i *)qh);
        __m256i s_lo[K_TILE], s_hi[K_TILE];
        for (int r = 0; r < R; r++) s_lo[r] = s_hi[r] = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(w, low4), bit_to_4(vh, j));
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w, 4), low4), bit_to_4(vh, 4 + j));
            for (int r = 0; r < R; r++) {
                const int8_t *a = x->qs + (size_t)(r0 + r) * k + b * QK;
                s_lo[r] = x8_dpbusd_bcast(s_lo[r], lo, a + 4 * j);
                s_hi[r] = x8_dpbusd_bcast(s_hi[r], hi, a + 16 + 4 * j);
            }
        }
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dp));
        for (int r = 0; r < R; r++) {
            __m256i isum = _mm256_add_epi32(s_lo[r], s_hi[r]);
            if (kind == KIND_Q5_0) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(asum[(size_t)r * nb + b]));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d8, _mm256_set1_ps(x->d[(size_t)(r0 + r) * nb + b])), acc[r]);
        }
    }
    if (kind == KIND_Q5_0) return;
    for (int b = b0; b < b1; b++) {
        const __m256 c8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const block_q5_1x8 *)blk0 + (b - b0))->m));
        for (int r = 0; r < R; r++) cor[r] = _mm256_fmadd_ps(c8, _mm256_set1_ps(x->s[(size_t)(r0 + r) * nb + b]), cor[r]);
    }
}

/* Q4_K / Q5_K: chunk c of 64 = sub-blocks 2c (low nibbles) and 2c+1 (high), 8 runs each. */
static inline __attribute__((always_inline)) void tile_k4(int kind, const int R, const void *blk0, int s0, int s1,
                                                          const act_rows *x, int r0, __m256 *acc, __m256 *cor) {
    const int k = x->k, nb = k / QK, five = kind == KIND_Q5_K;
    const __m256i low4 = _mm256_set1_epi8(15);
    for (int s = s0; s < s1; s++) {
        const uint16_t *dp;
        const uint8_t(*sc)[ROW_GROUP];
        const uint8_t *qs, *qh = NULL;
        if (five) {
            const block_q5_Kx8 *blk = (const block_q5_Kx8 *)blk0 + (s - s0);
            dp = blk->d, sc = blk->sc, qs = blk->qs, qh = blk->qh;
        } else {
            const block_q4_Kx8 *blk = (const block_q4_Kx8 *)blk0 + (s - s0);
            dp = blk->d, sc = blk->sc, qs = blk->qs;
        }
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dp));
        for (int c = 0; c < 4; c++) {
            /* with few rows, two chains per sum (odd runs apart): a chain's latency would bound it */
            __m256i s_lo[K_TILE], s_hi[K_TILE], s_lo2[K_TILE], s_hi2[K_TILE];
            for (int r = 0; r < R; r++) s_lo[r] = s_hi[r] = s_lo2[r] = s_hi2[r] = _mm256_setzero_si256();
            for (int rr = 0; rr < 8; rr++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 32 * (8 * c + rr)));
                __m256i lo = _mm256_and_si256(w, low4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
                if (five) {
                    const __m256i vh = _mm256_loadu_si256((const __m256i *)(qh + 32 * rr));
                    lo = _mm256_or_si256(lo, bit_to_4(vh, 2 * c));
                    hi = _mm256_or_si256(hi, bit_to_4(vh, 2 * c + 1));
                }
                for (int r = 0; r < R; r++) {
                    const int8_t *a = x->qs + (size_t)(r0 + r) * k + (size_t)s * QK_K + 64 * c;
                    if (R <= 4 && (rr & 1)) {
                        s_lo2[r] = x8_dpbusd_bcast(s_lo2[r], lo, a + 4 * rr);
                        s_hi2[r] = x8_dpbusd_bcast(s_hi2[r], hi, a + 32 + 4 * rr);
                    } else {
                        s_lo[r] = x8_dpbusd_bcast(s_lo[r], lo, a + 4 * rr);
                        s_hi[r] = x8_dpbusd_bcast(s_hi[r], hi, a + 32 + 4 * rr);
                    }
                }
            }
            if (R <= 4)
                for (int r = 0; r < R; r++) {
                    s_lo[r] = _mm256_add_epi32(s_lo[r], s_lo2[r]);
                    s_hi[r] = _mm256_add_epi32(s_hi[r], s_hi2[r]);
                }
            const __m256i sc_lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sc[2 * c]));
            const __m256i sc_hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sc[2 * c + 1]));
            for (int r = 0; r < R; r++) {
                const size_t rb = (size_t)(r0 + r) * nb + (size_t)s * 8 + 2 * c;
                const __m256i i_lo = _mm256_mullo_epi32(s_lo[r], sc_lo), i_hi = _mm256_mullo_epi32(s_hi[r], sc_hi);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i_lo), _mm256_mul_ps(d8, _mm256_set1_ps(x->d[rb])), acc[r]);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i_hi), _mm256_mul_ps(d8, _mm256_set1_ps(x->d[rb + 1])), acc[r]);
            }
        }
    }
    for (int s = s0; s < s1; s++)
        k4_min_correction(five, R, blk0, s0, s, x, r0, cor);
}

/* Q6_K: the 6-bit quants unsigned (q + 32, as stored) into vpdpbusd, then 32 x the activation's
 * sum over each sub-block of 16 taken off: asum[r][e / 16] (k6_asum) = 32 * sum of row r's
 * quantized activations e .. e+15, so sc * (dot16 - asum) is the signed sum exactly. */
static inline __attribute__((always_inline)) void tile_q6_K(const int R, const void *blk0, int s0, int s1,
                                                            const act_rows *x, int r0, __m256 *acc, const int32_t *asum) {
    const int k = x->k, nb = k / QK, n16 = k / 16;
    const __m256i low4 = _mm256_set1_epi8(15);
    for (int s = s0; s < s1; s++) {
        const block_q6_Kx8 *blk = (const block_q6_Kx8 *)blk0 + (s - s0);
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk->d));
        for (int n = 0; n < 2; n++)
            for (int g = 0; g < 4; g++) {
                const int b = 4 * n + g; /* activation block within the super-block */
                __m256i isum[K_TILE];
                for (int h = 0; h < 2; h++) {
                    __m256i dot[K_TILE];
                    for (int r = 0; r < R; r++) dot[r] = _mm256_setzero_si256();
                    for (int rr = 4 * h; rr < 4 * h + 4; rr++) {
                        const __m256i vl = _mm256_loadu_si256((const __m256i *)(blk->q + q6x8_ql(16 * n + 8 * (g & 1) + rr)));
                        const __m256i vh = _mm256_loadu_si256((const __m256i *)(blk->q + q6x8_qh(8 * n + rr)));
                        const __m256i nib = g < 2 ? _mm256_and_si256(vl, low4) : _mm256_and_si256(_mm256_srli_epi16(vl, 4), low4);
                        const __m256i q = _mm256_or_si256(nib, q6_high(vh, g));
                        for (int r = 0; r < R; r++) {
                            const int8_t *a = x->qs + (size_t)(r0 + r) * k + (size_t)s * QK_K + QK * b + 4 * rr;
                            dot[r] = x8_dpbusd_bcast(dot[r], q, a);
                        }
                    }
                    const __m256i scv = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)blk->sc[2 * b + h]));
                    const size_t e16 = ((size_t)s * QK_K + QK * b) / 16 + h;
                    for (int r = 0; r < R; r++) {
                        const __m256i t = _mm256_mullo_epi32(_mm256_sub_epi32(dot[r], _mm256_set1_epi32(asum[(size_t)r * n16 + e16])), scv);
                        isum[r] = h ? _mm256_add_epi32(isum[r], t) : t;
                    }
                }
                for (int r = 0; r < R; r++) {
                    const size_t rb = (size_t)(r0 + r) * nb + (size_t)s * 8 + b;
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(d8, _mm256_set1_ps(x->d[rb])), acc[r]);
                }
            }
    }
}

#endif

/* The activation sums the tiles take off (k_asum_span elements each), rows [r0, r0 + n):
 * Q6_K (VNNI): asum[r][i] = 32 * (sum of row r's quantized activations 16i .. 16i+15); Q5_0:
 * for VNNI 16 * (sum of block i's 32), for AVX2 the int16 pair 16 * (sum of bytes 4j, 4j + 1),
 * 16 * (sum of bytes 4j + 2, 4j + 3) over the block's runs j (the two int16 lanes of
 * maddubs_epi16's products; each within 16 * 16 * 127), as one int32. */
static void k_asum(int kind, int32_t *asum, const act_rows *x, int r0, int n) {
    const int span = k_asum_span(kind), ns = x->k / span;
    for (int r = 0; r < n; r++)
        for (int i = 0; i < ns; i++) {
            const int8_t *a = x->qs + (size_t)(r0 + r) * x->k + (size_t)span * i;
            if (kind == KIND_Q6_K || X8_VNNI) {
                int sum = 0;
                for (int e = 0; e < span; e++) sum += a[e];
                asum[(size_t)r * ns + i] = (kind == KIND_Q6_K ? 32 : 16) * sum;
            } else {
                int even = 0, odd = 0;
                for (int e = 0; e < span; e += 4) even += a[e] + a[e + 1], odd += a[e + 2] + a[e + 3];
                asum[(size_t)r * ns + i] = (int32_t)((uint32_t)(uint16_t)(16 * even) | (uint32_t)(uint16_t)(16 * odd) << 16);
            }
        }
}

/* asum: Q5_0's and (VNNI) Q6_K's activation sums of rows r0.. (k_asum), else NULL. */
static inline __attribute__((always_inline)) void run_tile(int kind, const int R, const void *blk0, int b0, int b1,
                                                           const act_rows *x, int r0, __m256 *acc, __m256 *cor,
                                                           const int32_t *asum) {
#if X8_VNNI
    if (kind == KIND_Q5_0 || kind == KIND_Q5_1) tile_q5(kind, R, blk0, b0, b1, x, r0, acc, cor, asum);
    else if (kind == KIND_Q6_K) tile_q6_K(R, blk0, b0, b1, x, r0, acc, asum);
#else
    if (kind == KIND_Q5_0 || kind == KIND_Q5_1) tile_q5(kind, R, blk0, b0, b1, x, r0, acc, cor, asum);
    else if (kind == KIND_Q6_K) tile_q6_K(R, blk0, b0, b1, x, r0, acc);
    else if (kind == KIND_Q2_K || kind == KIND_Q3_K) tile_k2(kind, R, blk0, b0, b1, x, r0, acc, cor);
#endif
    else tile_k4(kind, R, blk0, b0, b1, x, r0, acc, cor);
}

/* y rows r0.. (lanes 0..n_lanes-1 = outputs o..) = acc + cor (+ y). */
static inline void store_lanes(float *y, int ldy, int o, int r0, int R, const __m256 *acc, const __m256 *cor,
                               int n_lanes, int accumulate) {
    for (int r = 0; r < R; r++) {
        float *dst = y + (size_t)(r0 + r) * ldy + o;
        __m256 v = _mm256_add_ps(acc[r], cor[r]);
        if (n_lanes == ROW_GROUP) {
            if (accumulate) v = _mm256_add_ps(_mm256_loadu_ps(dst), v);
            _mm256_storeu_ps(dst, v);
        } else {
            float t[ROW_GROUP];
            _mm256_storeu_ps(t, v);
            for (int i = 0; i < n_lanes; i++) dst[i] = accumulate ? dst[i] + t[i] : t[i];
        }
    }
}

/* One group (lanes o .. o+n_lanes-1) against activation rows [r0, r0+R): from its x8 blocks, or
 * (group == NULL) packed from the file rows CHUNK blocks at a time. asum: run_tile's, for row r0. */
static inline __attribute__((always_inline)) void group_tile(int kind, const int R, float *y, int ldy,
                                                             const gemm_weight *w, const void *group, int o,
                                                             int n_lanes, const act_rows *x, int r0, int accumulate,
                                                             const int32_t *asum) {
    const int nb = w->n_in / ggml_block_elems(kind_type(kind));
    __m256 acc[K_TILE], cor[K_TILE];
    for (int r = 0; r < R; r++) acc[r] = cor[r] = _mm256_setzero_ps();
    if (group) {
        run_tile(kind, R, group, 0, nb, x, r0, acc, cor, asum);
    } else {
        _Alignas(32) char buf[CHUNK * sizeof(block_q6_Kx8) > CHUNK * sizeof(block_q5_Kx8) ? CHUNK * sizeof(block_q6_Kx8)
                                                                                         : CHUNK * sizeof(block_q5_Kx8)];
        const char *rows = (const char *)w->rows + (size_t)o * ggml_row_bytes(w->type, w->n_in);
        for (int b0 = 0; b0 < nb; b0 += CHUNK) {
            const int b1 = b0 + CHUNK < nb ? b0 + CHUNK : nb;
            pack_x8_k_part(buf, rows, w->type, w->n_in, n_lanes, b0, b1);
            run_tile(kind, R, buf, b0, b1, x, r0, acc, cor, asum);
        }
    }
    store_lanes(y, ldy, o, r0, R, acc, cor, n_lanes, accumulate);
}

/* Output rows [o0, o1) against activation rows [r0, r1): groups outer (a group's blocks stay in
 * L1 while every tile of rows passes over them), tiles of K_TILE rows inner, the last as wide
 * as the rows left. asum: for row r0 (or NULL). */
static inline __attribute__((always_inline)) void gemm_k_rows(int kind, float *y, int ldy, const gemm_weight *w,
                                                              int o0, int o1, const act_rows *x, int r0, int r1,
                                                              int accumulate, const int32_t *asum) {
    const size_t group_bytes = kind_x8_bytes(kind) * (size_t)(w->n_in / ggml_block_elems(kind_type(kind)));
    const size_t asum_row = asum ? (size_t)(w->n_in / k_asum_span(kind)) : 0;
    int grouped_end = w->x8 ? w->n_out / ROW_GROUP * ROW_GROUP : o0;
    if (grouped_end > o1) grouped_end = o1;
    if (grouped_end < o0) grouped_end = o0;
    /* whole groups from their x8 blocks, then the rest packed from the rows, 8 at a time */
    for (int o = o0; o < o1; o += ROW_GROUP) {
        const void *group = o < grouped_end ? (const char *)w->x8 + (size_t)(o / ROW_GROUP) * group_bytes : NULL;
        const int n_lanes = o1 - o < ROW_GROUP ? o1 - o : ROW_GROUP;
        int r = r0;
        for (; r + K_TILE <= r1; r += K_TILE)
            group_tile(kind, K_TILE, y, ldy, w, group, o, n_lanes, x, r, accumulate, asum ? asum + (r - r0) * asum_row : NULL);
        switch (r1 - r) {
#define K_REST(n)                                                                                                      \
    case n: group_tile(kind, n, y, ldy, w, group, o, n_lanes, x, r, accumulate, asum ? asum + (r - r0) * asum_row : NULL); break;
        K_REST(1) K_REST(2) K_REST(3)
#if K_TILE > 4
        K_REST(4) K_REST(5) K_REST(6) K_REST(7)
#endif
#undef K_REST
        default: break;
        }
    }
}

#define K_ASUM_INTS 16384 /* stack table of k_asum (64 KiB): the rows of one pass */

static inline __attribute__((always_inline)) void gemm_k(int kind, float *y, int ldy, const gemm_weight *w, int o0,
                                                         int o1, const act_rows *x, int n_rows, int accumulate) {
    if ((X8_VNNI && kind == KIND_Q6_K) || kind == KIND_Q5_0) {
        /* the activation sums once per pass of as many rows as the table holds (a multiple of
         * K_TILE, at least one tile: MAX_ROW_LEN / 16 * K_TILE fits) */
        int32_t asum[K_ASUM_INTS];
        const int per = K_ASUM_INTS / (w->n_in / k_asum_span(kind)) / K_TILE * K_TILE;
        for (int r0 = 0; r0 < n_rows; r0 += per) {
            const int r1 = r0 + per < n_rows ? r0 + per : n_rows;
            k_asum(kind, asum, x, r0, r1 - r0);
            gemm_k_rows(kind, y, ldy, w, o0, o1, x, r0, r1, accumulate, asum);
        }
        return;
    }
    gemm_k_rows(kind, y, ldy, w, o0, o1, x, 0, n_rows, accumulate, NULL);
}

#endif
