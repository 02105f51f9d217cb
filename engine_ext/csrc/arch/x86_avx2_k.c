/* AVX2/FMA/F16C variants of the quant_k.h kernels: Q5_0, Q5_1, Q2_K .. Q6_K, BF16.
 *
 * Design: the block types run on row groups only (quant_k.h x8 layouts): lane i of every vector
 * is weight row 8g+i, so integer dot products land row by row in the lanes with no horizontal
 * sums. Rows outside whole groups (a matrix's last n_out % 8 rows, or every row of a weight
 * without groups) are packed into a zero-padded group CHUNK blocks at a time and run through
 * the same code: a row's operations depend only on its lane, never on which rows are in the
 * call (kernels.h NOTE). Per (weight row, activation row) the float operations are, block by
 * block in order:
 *   acc = fma(float(isum_b), d * ad_b, acc)        isum_b: integer dot product of activation
 *                                                  block b, sub-block scales applied in int32
 *   cor = fma(c_b, as_b, cor)                      (Q5_0: c = -16 d; Q5_1: m; Q4_K/Q5_K per
 *                                                  sub-block: cor -= dmin * m_j * as_b; Q2_K:
 *                                                  cor -= dmin * ad_b * msum_b; Q6_K, Q3_K: none)
 *   y = acc + cor
 * Integer sums stay within int16 between widenings: maddubs products of a 4-element run pair are
 * at most 2 * 15 * 127 (4-bit), 2 * 31 * 127 (5-bit) or 2 * 32 * 127 (Q6_K, signed by sign_epi8),
 * so 8, 4 and 4 runs are summed before madd_epi16 widens them (and applies the scales).
 */
#if defined(__x86_64__) || defined(__i386__)

#pragma GCC target("avx2,fma,f16c")

#include <immintrin.h>
#include <string.h>

#include "../fp16.h"
#include "../kernels.h"

#define TILE 4   /* activation rows per micro-kernel call */
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

/* 8 bytes -> 8 int32 lanes holding the int16 pair (v, v): madd_epi16 then scales a pair sum. */
static inline __m256i scale_pairs_u8(const uint8_t *p) {
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_or_si256(v, _mm256_slli_epi32(v, 16));
}

static inline __m256i scale_pairs_i8(const int8_t *p) {
    __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(v, 16));
}

static inline __m256i bcast4(const int8_t *a) {
    int32_t v;
    memcpy(&v, a, 4);
    return _mm256_set1_epi32(v);
}

/* Bit `bit` of every byte moved to bit `to`, other bits cleared (a shift inside 16-bit lanes:
 * bits crossing into the next byte are masked off). */
static inline __m256i bit_to(__m256i v, int bit, int to) {
    __m256i s = bit <= to ? _mm256_sll_epi16(v, _mm_cvtsi32_si128(to - bit)) : _mm256_srl_epi16(v, _mm_cvtsi32_si128(bit - to));
    return _mm256_and_si256(s, _mm256_set1_epi8((char)(1 << to)));
}

/* Bit `bit` at bit 4: the fifth bit of a 5-bit quant. */
static inline __m256i bit_to_4(__m256i v, int bit) { return bit_to(v, bit, 4); }

/* ---- micro-kernels: one group of 8 weight rows, blocks [b0, b1), R activation rows -------------- */

/* Q5_0 / Q5_1: blocks of 32. blk points at x8 block b0. */
static inline __attribute__((always_inline)) void tile_q5(int kind, const int R, const void *blk0, int b0, int b1,
                                                          const act_rows *x, int r0, __m256 *acc, __m256 *cor) {
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
        __m256i isum[TILE];
        for (int r = 0; r < R; r++) isum[r] = _mm256_setzero_si256();
        for (int half = 0; half < 2; half++) {
            __m256i p16[TILE];
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
        const __m256 c8 = kind == KIND_Q5_0 ? _mm256_mul_ps(_mm256_set1_ps(-16.0f), d8)
                                            : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)mp));
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
        const uint16_t *dp, *dminp;
        const uint8_t(*sc)[ROW_GROUP], (*mn)[ROW_GROUP];
        const uint8_t *qs, *qh = NULL;
        if (five) {
            const block_q5_Kx8 *blk = (const block_q5_Kx8 *)blk0 + (s - s0);
            dp = blk->d, dminp = blk->dmin, sc = blk->sc, mn = blk->m, qs = blk->qs, qh = blk->qh;
        } else {
            const block_q4_Kx8 *blk = (const block_q4_Kx8 *)blk0 + (s - s0);
            dp = blk->d, dminp = blk->dmin, sc = blk->sc, mn = blk->m, qs = blk->qs;
        }
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dp));
        for (int c = 0; c < 4; c++) {
            const __m256i sc_lo = scale_pairs_u8(sc[2 * c]), sc_hi = scale_pairs_u8(sc[2 * c + 1]);
            __m256i i_lo[TILE], i_hi[TILE];
            for (int r = 0; r < R; r++) i_lo[r] = i_hi[r] = _mm256_setzero_si256();
            for (int h = 0; h < 8; h += runs) {
                __m256i p_lo[TILE], p_hi[TILE];
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
        const __m256 dmin8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dminp));
        for (int j = 0; j < 8; j++) {
            const __m256 mf = _mm256_mul_ps(dmin8, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)mn[j]))));
            for (int r = 0; r < R; r++)
                cor[r] = _mm256_fnmadd_ps(mf, _mm256_set1_ps(x->s[(size_t)(r0 + r) * nb + (size_t)s * 8 + j]), cor[r]);
        }
    }
}

/* The fifth and sixth bits of Q6_K quarter g (0..3) of a half, at bits 4-5 of each byte. */
static inline __m256i q6_high(__m256i vh, int g) {
    const __m256i m = _mm256_set1_epi8(0x30);
    switch (g) {
    case 0: return _mm256_and_si256(_mm256_slli_epi16(vh, 4), m);
    case 1: return _mm256_and_si256(_mm256_slli_epi16(vh, 2), m);
    case 2: return _mm256_and_si256(vh, m);
    default: return _mm256_and_si256(_mm256_srli_epi16(vh, 2), m);
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
                __m256i isum[TILE];
                for (int r = 0; r < R; r++) isum[r] = _mm256_setzero_si256();
                for (int h = 0; h < 2; h++) {
                    const __m256i scv = scale_pairs_i8(blk->sc[2 * b + h]);
                    __m256i p[TILE];
                    for (int r = 0; r < R; r++) p[r] = _mm256_setzero_si256();
                    for (int rr = 4 * h; rr < 4 * h + 4; rr++) {
                        const __m256i vl = _mm256_loadu_si256((const __m256i *)(blk->ql + 32 * (16 * n + 8 * (g & 1) + rr)));
                        const __m256i vh = _mm256_loadu_si256((const __m256i *)(blk->qh + 32 * (8 * n + rr)));
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
                __m256i isum[TILE];
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
                    __m256i p[TILE];
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

static inline __attribute__((always_inline)) void run_tile(int kind, const int R, const void *blk0, int b0, int b1,
                                                           const act_rows *x, int r0, __m256 *acc, __m256 *cor) {
    if (kind == KIND_Q5_0 || kind == KIND_Q5_1) tile_q5(kind, R, blk0, b0, b1, x, r0, acc, cor);
    else if (kind == KIND_Q6_K) tile_q6_K(R, blk0, b0, b1, x, r0, acc);
    else if (kind == KIND_Q2_K || kind == KIND_Q3_K) tile_k2(kind, R, blk0, b0, b1, x, r0, acc, cor);
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
 * (group == NULL) packed from the file rows CHUNK blocks at a time. */
static inline __attribute__((always_inline)) void group_tile(int kind, const int R, float *y, int ldy,
                                                             const gemm_weight *w, const void *group, int o,
                                                             int n_lanes, const act_rows *x, int r0, int accumulate) {
    const int nb = w->n_in / ggml_block_elems(kind_type(kind));
    __m256 acc[TILE], cor[TILE];
    for (int r = 0; r < R; r++) acc[r] = cor[r] = _mm256_setzero_ps();
    if (group) {
        run_tile(kind, R, group, 0, nb, x, r0, acc, cor);
    } else {
        _Alignas(32) char buf[CHUNK * sizeof(block_q6_Kx8) > CHUNK * sizeof(block_q5_Kx8) ? CHUNK * sizeof(block_q6_Kx8)
                                                                                         : CHUNK * sizeof(block_q5_Kx8)];
        const char *rows = (const char *)w->rows + (size_t)o * ggml_row_bytes(w->type, w->n_in);
        for (int b0 = 0; b0 < nb; b0 += CHUNK) {
            const int b1 = b0 + CHUNK < nb ? b0 + CHUNK : nb;
            pack_x8_k_part(buf, rows, w->type, w->n_in, n_lanes, b0, b1);
            run_tile(kind, R, buf, b0, b1, x, r0, acc, cor);
        }
    }
    store_lanes(y, ldy, o, r0, R, acc, cor, n_lanes, accumulate);
}

static inline __attribute__((always_inline)) void gemm_k(int kind, float *y, int ldy, const gemm_weight *w, int o0,
                                                         int o1, const act_rows *x, int n_rows, int accumulate) {
    const size_t group_bytes = kind_x8_bytes(kind) * (size_t)(w->n_in / ggml_block_elems(kind_type(kind)));
    int grouped_end = w->x8 ? w->n_out / ROW_GROUP * ROW_GROUP : o0;
    if (grouped_end > o1) grouped_end = o1;
    if (grouped_end < o0) grouped_end = o0;
    /* whole groups from their x8 blocks, then the rest packed from the rows, 8 at a time */
    for (int o = o0; o < o1; o += ROW_GROUP) {
        const void *group = o < grouped_end ? (const char *)w->x8 + (size_t)(o / ROW_GROUP) * group_bytes : NULL;
        const int n_lanes = o1 - o < ROW_GROUP ? o1 - o : ROW_GROUP;
        int r0 = 0;
        for (; r0 + TILE <= n_rows; r0 += TILE) group_tile(kind, TILE, y, ldy, w, group, o, n_lanes, x, r0, accumulate);
        const int rest = n_rows - r0;
        if (rest == 1) group_tile(kind, 1, y, ldy, w, group, o, n_lanes, x, r0, accumulate);
        else if (rest == 2) group_tile(kind, 2, y, ldy, w, group, o, n_lanes, x, r0, accumulate);
        else if (rest == 3) group_tile(kind, 3, y, ldy, w, group, o, n_lanes, x, r0, accumulate);
    }
}

void gemm_q5_0_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k(KIND_Q5_0, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q5_1_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k(KIND_Q5_1, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q4_K_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k(KIND_Q4_K, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q5_K_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k(KIND_Q5_K, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q6_K_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k(KIND_Q6_K, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q2_K_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k(KIND_Q2_K, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

void gemm_q3_K_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    gemm_k(KIND_Q3_K, y, ldy, w, o0, o1, x, n_rows, accumulate);
}

/* ---- row decoding (the embedding lookup) ----------------------------------------------------------- */

/* y[0..n) = d * q - m for n (8 .. 32, a multiple of 8) signed bytes of q. */
static inline void store_scaled(float *y, __m256i q, int n, float d, float m) {
    const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    __m128i part[4] = {_mm256_castsi256_si128(q), _mm_srli_si128(_mm256_castsi256_si128(q), 8),
                       _mm256_extracti128_si256(q, 1), _mm_srli_si128(_mm256_extracti128_si256(q, 1), 8)};
    for (int i = 0; i < n / 8; i++)
        _mm256_storeu_ps(y + 8 * i, _mm256_fmsub_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[i])), vm));
}

/* 32 bytes: byte e = bit e of the 32-bit word (0 or 1). */
static inline __m256i bits_to_bytes(uint32_t bits) {
    const __m256i shuf = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(1));
}

static inline void dequantize_q5(float *y, const uint8_t *qs, const uint8_t *qh4, float d, float m, int offset) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    __m128i t = _mm_loadu_si128((const __m128i *)qs);
    __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(15));
    __m256i q = _mm256_or_si256(nib, _mm256_slli_epi16(bits_to_bytes(qh), 4));
    store_scaled(y, _mm256_sub_epi8(q, _mm256_set1_epi8((char)offset)), 32, d, -m);
}

void dequantize_row_q5_0_avx2(float *y, const void *x, int k) {
    const block_q5_0 *blk = (const block_q5_0 *)x;
    for (int b = 0; b < k / QK; b++) dequantize_q5(y + b * QK, blk[b].qs, blk[b].qh, _cvtsh_ss(blk[b].d), 0.0f, 16);
}

void dequantize_row_q5_1_avx2(float *y, const void *x, int k) {
    const block_q5_1 *blk = (const block_q5_1 *)x;
    for (int b = 0; b < k / QK; b++)
        dequantize_q5(y + b * QK, blk[b].qs, blk[b].qh, _cvtsh_ss(blk[b].d), _cvtsh_ss(blk[b].m), 0);
}

static inline void dequantize_k4(float *y, uint16_t d16, uint16_t dmin16, const uint8_t *scales, const uint8_t *qs,
                                 const uint8_t *qh) {
    const float d = _cvtsh_ss(d16), dmin = _cvtsh_ss(dmin16);
    const __m256i low4 = _mm256_set1_epi8(15);
    for (int c = 0; c < 4; c++) {
        const __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        __m256i lo = _mm256_and_si256(w, low4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
        if (qh) {
            const __m256i vh = _mm256_loadu_si256((const __m256i *)qh);
            lo = _mm256_or_si256(lo, bit_to_4(vh, 2 * c));
            hi = _mm256_or_si256(hi, bit_to_4(vh, 2 * c + 1));
        }
        for (int h = 0; h < 2; h++) {
            const int j = 2 * c + h;
            int sc, m;
            if (j < 4) sc = scales[j] & 63, m = scales[j + 4] & 63;
            else sc = (scales[j + 4] & 15) | ((scales[j - 4] >> 6) << 4), m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
            store_scaled(y + 32 * j, h ? hi : lo, 32, d * (float)sc, dmin * (float)m);
        }
    }
}

void dequantize_row_q4_K_avx2(float *y, const void *x, int k) {
    const block_q4_K *blk = (const block_q4_K *)x;
    for (int b = 0; b < k / QK_K; b++) dequantize_k4(y + b * QK_K, blk[b].d, blk[b].dmin, blk[b].scales, blk[b].qs, NULL);
}

void dequantize_row_q5_K_avx2(float *y, const void *x, int k) {
    const block_q5_K *blk = (const block_q5_K *)x;
    for (int b = 0; b < k / QK_K; b++)
        dequantize_k4(y + b * QK_K, blk[b].d, blk[b].dmin, blk[b].scales, blk[b].qs, blk[b].qh);
}

void dequantize_row_q6_K_avx2(float *y, const void *x, int k) {
    const block_q6_K *blk = (const block_q6_K *)x;
    const __m256i low4 = _mm256_set1_epi8(15), off = _mm256_set1_epi8(32);
    for (int b = 0; b < k / QK_K; b++) {
        const float d = _cvtsh_ss(blk[b].d);
        for (int n = 0; n < 2; n++) {
            const __m256i vl0 = _mm256_loadu_si256((const __m256i *)(blk[b].ql + 64 * n));
            const __m256i vl1 = _mm256_loadu_si256((const __m256i *)(blk[b].ql + 64 * n + 32));
            const __m256i vh = _mm256_loadu_si256((const __m256i *)(blk[b].qh + 32 * n));
            for (int g = 0; g < 4; g++) {
                const __m256i vl = g & 1 ? vl1 : vl0;
                const __m256i nib = g < 2 ? _mm256_and_si256(vl, low4) : _mm256_and_si256(_mm256_srli_epi16(vl, 4), low4);
                const __m256i q = _mm256_sub_epi8(_mm256_or_si256(nib, q6_high(vh, g)), off);
                const int e = 128 * n + 32 * g; /* first element; scales per 16 */
                float *out = y + b * QK_K + e;
                store_scaled(out, q, 16, d * (float)blk[b].scales[e / 16], 0.0f);
                store_scaled(out + 16, _mm256_permute2x128_si256(q, q, 1), 16, d * (float)blk[b].scales[e / 16 + 1], 0.0f);
            }
        }
    }
}

/* ---- BF16: float weights ------------------------------------------------------------------------ */

static inline __m256 bf16x8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

static inline float bf16_1(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float hsum256(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

void dequantize_row_bf16_avx2(float *y, const void *x, int k) {
    const uint16_t *h = (const uint16_t *)x;
    int i = 0;
    for (; i + 8 <= k; i += 8) _mm256_storeu_ps(y + i, bf16x8(h + i));
    for (; i < k; i++) y[i] = bf16_1(h[i]);
}

/* One weight row against R activation rows; per row: 8-lane FMA chunks, lane sum, scalar tail. */
static inline __attribute__((always_inline)) void bf16_tile(const int R, float *y, int ldy, const uint16_t *wr, int o,
                                                            const act_rows *x, int r0, int accumulate) {
    const int k = x->k;
    __m256 acc[TILE];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= k; i += 8) {
        const __m256 wv = bf16x8(wr + i);
        for (int r = 0; r < R; r++) acc[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x->f + (size_t)(r0 + r) * k + i), acc[r]);
    }
    for (int r = 0; r < R; r++) {
        float v = hsum256(acc[r]);
        for (int j = i; j < k; j++) v += bf16_1(wr[j]) * x->f[(size_t)(r0 + r) * k + j];
        float *dst = &y[(size_t)(r0 + r) * ldy + o];
        *dst = accumulate ? *dst + v : v;
    }
}

void gemm_bf16_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate) {
    const uint16_t *wh = (const uint16_t *)w->rows;
    const int k = x->k;
    int r0 = 0;
    for (; r0 + TILE <= n_rows; r0 += TILE)
        for (int o = o0; o < o1; o++) bf16_tile(TILE, y, ldy, wh + (size_t)o * k, o, x, r0, accumulate);
    const int rest = n_rows - r0;
    for (int o = o0; o < o1 && rest > 0; o++) {
        if (rest == 1) bf16_tile(1, y, ldy, wh + (size_t)o * k, o, x, r0, accumulate);
        else if (rest == 2) bf16_tile(2, y, ldy, wh + (size_t)o * k, o, x, r0, accumulate);
        else bf16_tile(3, y, ldy, wh + (size_t)o * k, o, x, r0, accumulate);
    }
}

#endif /* x86 */
