/* The prefill tiles of the avx512vnni variant: two row groups (16 weight rows) per 512-bit
 * vector, for calls of Z_MIN_ROWS activation rows or more (a prefill chunk). Included by
 * x86_vnni.c after x86_gemm_x8.h and x86_gemm_k.h, whose kinds, layouts and helpers it uses.
 *
 * Design: the row-group layouts stay as they are (quant_k.h, blocks.h: one x8 block holds run j
 * of 8 rows in 32 bytes); a tile loads the same run of groups g and g+1 into the two halves of
 * one zmm, so lane i is weight row 8g + i for i < 8 and 8(g+1) + i - 8 above. Each weight unit
 * (8 vectors: a block of 32, or half a Q4_K/Q5_K chunk) is unpacked once into registers and then
 * multiplied by Z_TILE activation rows (vpdpbusd with the four activation bytes broadcast from
 * memory, {1to16}): 64 int8 products per instruction, the unpacking spread over 16 rows.
 *
 * Loop order (gemm_z_rows): tiles of Z_TILE activation rows outer, the pairs of groups of the
 * call inner, so a tile's activations are repacked once (z_pack) into a buffer that stays in L1
 * while every pair's weights stream past it: per block, the tile's 16 rows' 32 quantized bytes
 * side by side, then their 16 scales and sums (and the per-row integer sums Q8_0 and Q6_K take
 * off). Every broadcast is then at a fixed offset from one pointer, the row loop is unrolled
 * with each row's float accumulator in a register, and no address arithmetic runs per row. Rows
 * longer than Z_KS elements run in slices of Z_KS (the buffer's size), the pairs' accumulators
 * kept in a stash between slices (stored floats: exact).
 *
 * Per lane the operations are the 256-bit VNNI tiles' (x86_gemm_k.h, x86_gemm_x8.h), in the same
 * order: exact int32 block sums (sub-block scales by vpmulld; Q5_0's dot(q - 16, a)), then per
 * block
 *   acc = fma(float(isum_b), d * ad_b, acc),  cor = fma(c_b, as_b, cor) in a second pass
 *   (types with a min or offset: Q4_0, Q4_1, Q5_1, Q4_K, Q5_K),
 *   y = acc + cor (+ y),
 * so a row's numbers are bit-identical to the avx2 variant's whatever tile, pair or call it lands
 * in (tests/engine/test_kernels_kquants.py and test_kernels.py hold them to ==). Q8_0 runs biased
 * (w + 128 into vpdpbusd, 128 x the activation block sum taken off: AVX-512 has no vpsignb). */
#ifndef SLOTSERVE_X86_GEMM_Z16_H
#define SLOTSERVE_X86_GEMM_Z16_H

#define Z_TILE 16     /* activation rows per tile */
#define Z_MIN_ROWS 9  /* fewer rows (decode steps) stay on the 256-bit tiles */
#define Z_LANES 16    /* weight rows per tile: two row groups */
#define Z_KS 1024     /* activation elements per slice of a tile (the buffer's row length) */
#define Z_NB (Z_KS / QK)
#define Z_OB 16       /* pairs per block of outputs (the accumulator stash) */

#define Z_AI static inline __attribute__((always_inline))
#define Z_UNROLL _Pragma("GCC unroll 16")

/* The kinds of the tiles: x86_gemm_x8.h's and x86_gemm_k.h's enums overlap, so z_kind maps
 * (x8, kind) onto one. */
enum { Z_Q8_0, Z_Q4_0, Z_Q4_1, Z_Q5_0, Z_Q5_1, Z_Q4_K, Z_Q5_K, Z_Q6_K };

static inline int z_kind(int x8, int kind) {
    if (x8) return kind == KIND_Q8_0 ? Z_Q8_0 : kind == KIND_Q4_0 ? Z_Q4_0 : Z_Q4_1;
    static const int k[] = {[KIND_Q5_0] = Z_Q5_0, [KIND_Q5_1] = Z_Q5_1, [KIND_Q4_K] = Z_Q4_K,
                            [KIND_Q5_K] = Z_Q5_K, [KIND_Q6_K] = Z_Q6_K};
    return k[kind];
}

/* A tile's activations, slice [e0, e0 + Z_KS) of rows r .. r + Z_TILE - 1 (z_pack). */
typedef struct {
    _Alignas(64) int8_t qs[Z_NB][Z_TILE][QK]; /* block b, row i: its 32 quantized values */
    _Alignas(64) float d[Z_NB][Z_TILE];       /* scales */
    _Alignas(64) float s[Z_NB][Z_TILE];       /* sums d * sum(qs) */
    _Alignas(64) int32_t t[Z_KS / 16][Z_TILE]; /* Q6_K: 32 x the sum of each 16; Q8_0: 128 x each 32's; Q5_0: 16 x */
} z_act;

/* 32 bytes at a (low half) and at b (high half) */
Z_AI __m512i z_ld(const void *a, const void *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

/* 8 f16 at a and 8 at b as 16 floats */
Z_AI __m512 z_ph(const uint16_t *a, const uint16_t *b) {
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                                   _mm_loadu_si128((const __m128i *)b), 1));
}

/* 8 bytes at a and 8 at b, zero-extended (u8) or sign-extended (i8) to 16 int32 lanes */
Z_AI __m512i z_u8(const uint8_t *a, const uint8_t *b) {
    return _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a), _mm_loadl_epi64((const __m128i *)b)));
}

Z_AI __m512i z_i8(const int8_t *a, const int8_t *b) {
    return _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a), _mm_loadl_epi64((const __m128i *)b)));
}

/* acc + vpdpbusd(w, 4 activation bytes broadcast to every lane), the broadcast in the memory
 * operand ({1to16}; GCC does not form it from the intrinsics) */
Z_AI __m512i z_dp(__m512i acc, __m512i w, const int8_t *a) {
    __asm__("vpdpbusd %[a]%{1to16%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [a] "m"(*(const int32_t *)a));
    return acc;
}

/* The integer dot product of 8 weight vectors q[j] with a row's 32 bytes at a: q[j] against
 * bytes 4j.. (order: the runs of the unit as the caller lists them). One chain: exact int32. */
Z_AI __m512i z_dot8(const __m512i *q, const int8_t *a) {
#ifdef Z_CHAINS1
    __m512i s = z_dp(_mm512_setzero_si512(), q[0], a);
    for (int j = 1; j < 8; j++) s = z_dp(s, q[j], a + 4 * j);
    return s;
#else
    __m512i s0 = z_dp(_mm512_setzero_si512(), q[0], a), s1 = z_dp(_mm512_setzero_si512(), q[1], a + 4);
    for (int j = 2; j < 8; j += 2) {
        s0 = z_dp(s0, q[j], a + 4 * j);
        s1 = z_dp(s1, q[j + 1], a + 4 * j + 4);
    }
    return _mm512_add_epi32(s0, s1);
#endif
}

/* bit `bit` of every byte moved to bit 4 (x86_gemm_k.h bit_to_4) */
Z_AI __m512i z_bit_to_4(__m512i v, int bit) {
    __m512i s = bit <= 4 ? _mm512_sll_epi16(v, _mm_cvtsi32_si128(4 - bit)) : _mm512_srl_epi16(v, _mm_cvtsi32_si128(bit - 4));
    return _mm512_and_si512(s, _mm512_set1_epi8(16));
}

/* Q6_K quarter g's fifth and sixth bits at bits 4-5 (x86_gemm_k.h q6_high) */
Z_AI __m512i z_q6_high(__m512i vh, int g) {
    const __m512i m = _mm512_set1_epi8(0x30);
    switch (g) {
    case 0: return _mm512_and_si512(_mm512_slli_epi16(vh, 4), m);
    case 1: return _mm512_and_si512(_mm512_slli_epi16(vh, 2), m);
    case 2: return _mm512_and_si512(vh, m);
    default: return _mm512_and_si512(_mm512_srli_epi16(vh, 2), m);
    }
}

/* ---- the activation tile ------------------------------------------------------------------- */

/* Rows r .. r + R - 1 of x, elements [e0, e0 + ne), into t (rows R .. Z_TILE - 1 zeroed, so a
 * tile always runs Z_TILE rows of finite numbers); `sums` 16: t->t = Q6_K's 32 x sums of 16,
 * 32: sums of 32 times mul32 (Q8_0 128, Q5_0 16), 0: none. */
static void z_pack(z_act *t, const act_rows *x, int r, int R, int e0, int ne, int sums, int mul32) {
    const int nb = ne / QK, xnb = x->k / QK, b0 = e0 / QK;
    const __m256i ones = _mm256_set1_epi8(1);
    for (int i = 0; i < Z_TILE; i++) {
        if (i >= R) {
            for (int b = 0; b < nb; b++) {
                _mm256_store_si256((__m256i *)t->qs[b][i], _mm256_setzero_si256());
                t->d[b][i] = t->s[b][i] = 0.0f;
            }
            for (int g = 0; g < ne / 16; g++) t->t[g][i] = 0;
            continue;
        }
        const int8_t *a = x->qs + (size_t)(r + i) * x->k + e0;
        const float *d = x->d + (size_t)(r + i) * xnb + b0, *s = x->s + (size_t)(r + i) * xnb + b0;
        for (int b = 0; b < nb; b++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(a + QK * b));
            _mm256_store_si256((__m256i *)t->qs[b][i], v);
            t->d[b][i] = d[b];
            t->s[b][i] = s[b];
            if (sums) {
                /* 8 sums of 4 bytes, then of 16 (lanes 0-1 of each half) */
                __m256i q4 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, v);
                q4 = _mm256_add_epi32(q4, _mm256_shuffle_epi32(q4, 0xB1));
                q4 = _mm256_add_epi32(q4, _mm256_shuffle_epi32(q4, 0x4E));
                const int lo = _mm256_cvtsi256_si32(q4), hi = _mm256_extract_epi32(q4, 4);
                if (sums == 16) {
                    t->t[2 * b][i] = 32 * lo;
                    t->t[2 * b + 1][i] = 32 * hi;
                } else {
                    t->t[b][i] = mul32 * (lo + hi);
                }
            }
        }
    }
}

/* ---- tiles: one pair of groups against the tile's Z_TILE rows over the slice's blocks --------
 * ga, gb: the two groups' first blocks of the slice; acc/cor: the pair's stash (Z_TILE each),
 * read and written back. */

/* Q8_0 (biased), Q4_0, Q4_1: blocks of 32 */
Z_AI void zt_x8(int zk, const char *ga, const char *gb, int nbs, const z_act *t, __m512 *acc_st, __m512 *cor_st) {
    const __m512i low4 = _mm512_set1_epi8(15);
    __m512 acc[Z_TILE];
    Z_UNROLL for (int i = 0; i < Z_TILE; i++) acc[i] = acc_st[i];
    for (int b = 0; b < nbs; b++) {
        /* Q8_0: q[j] = run j (+128); Q4: q[j] low nibbles of run j (elements 4j..), q[4 + j] high (16 + 4j..) */
        __m512i q[8];
        const uint16_t *da, *db;
        if (zk == Z_Q8_0) {
            const block_q8_0x8 *A = (const block_q8_0x8 *)ga + b, *B = (const block_q8_0x8 *)gb + b;
            da = A->d, db = B->d;
            const __m512i bias = _mm512_set1_epi8((char)0x80);
            for (int j = 0; j < 8; j++) q[j] = _mm512_xor_si512(z_ld(A->qs + 32 * j, B->qs + 32 * j), bias);
        } else {
            const uint8_t *qa, *qb;
            if (zk == Z_Q4_0) {
                const block_q4_0x8 *A = (const block_q4_0x8 *)ga + b, *B = (const block_q4_0x8 *)gb + b;
                da = A->d, db = B->d, qa = A->qs, qb = B->qs;
            } else {
                const block_q4_1x8 *A = (const block_q4_1x8 *)ga + b, *B = (const block_q4_1x8 *)gb + b;
                da = A->d, db = B->d, qa = A->qs, qb = B->qs;
            }
            for (int j = 0; j < 4; j++) {
                const __m512i w = z_ld(qa + 32 * j, qb + 32 * j);
                q[j] = _mm512_and_si512(w, low4);
                q[4 + j] = _mm512_and_si512(_mm512_srli_epi16(w, 4), low4);
            }
        }
        const __m512 d16 = z_ph(da, db);
        Z_UNROLL for (int i = 0; i < Z_TILE; i++) {
            __m512i isum = z_dot8(q, t->qs[b][i]);
            if (zk == Z_Q8_0) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(t->t[b][i]));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d16, _mm512_set1_ps(t->d[b][i])), acc[i]);
        }
    }
    Z_UNROLL for (int i = 0; i < Z_TILE; i++) acc_st[i] = acc[i];
    if (zk == Z_Q8_0) return;
    __m512 cor[Z_TILE];
    Z_UNROLL for (int i = 0; i < Z_TILE; i++) cor[i] = cor_st[i];
    for (int b = 0; b < nbs; b++) {
        __m512 c16;
        if (zk == Z_Q4_0)
            c16 = _mm512_mul_ps(_mm512_set1_ps(-8.0f), z_ph(((const block_q4_0x8 *)ga + b)->d, ((const block_q4_0x8 *)gb + b)->d));
        else
            c16 = z_ph(((const block_q4_1x8 *)ga + b)->m, ((const block_q4_1x8 *)gb + b)->m);
        Z_UNROLL for (int i = 0; i < Z_TILE; i++) cor[i] = _mm512_fmadd_ps(c16, _mm512_set1_ps(t->s[b][i]), cor[i]);
    }
    Z_UNROLL for (int i = 0; i < Z_TILE; i++) cor_st[i] = cor[i];
}

/* Q5_0 / Q5_1: blocks of 32; Q5_0 takes 16 x the activation block's sum (t->t) off its dot
 * product of unsigned quants: dot(q - 16, a), exact, and no correction (x86_gemm_k.h tile_q5) */
Z_AI void zt_q5(int zk, const char *ga, const char *gb, int nbs, const z_act *t, __m512 *acc_st, __m512 *cor_st) {
    const __m512i low4 = _mm512_set1_epi8(15);
    __m512 acc[Z_TILE];
    Z_UNROLL for (int i = 0; i < Z_TILE; i++) acc[i] = acc_st[i];
    for (int b = 0; b < nbs; b++) {
        const uint8_t *qa, *qb, *ha, *hb;
        const uint16_t *da, *db;
        if (zk == Z_Q5_0) {
            const block_q5_0x8 *A = (const block_q5_0x8 *)ga + b, *B = (const block_q5_0x8 *)gb + b;
            qa = A->qs, qb = B->qs, ha = A->qh, hb = B->qh, da = A->d, db = B->d;
        } else {
            const block_q5_1x8 *A = (const block_q5_1x8 *)ga + b, *B = (const block_q5_1x8 *)gb + b;
            qa = A->qs, qb = B->qs, ha = A->qh, hb = B->qh, da = A->d, db = B->d;
        }
        const __m512i vh = z_ld(ha, hb);
        __m512i q[8]; /* q[j] low nibbles of run j (elements 4j..), q[4 + j] high (16 + 4j..) */
        for (int j = 0; j < 4; j++) {
            const __m512i w = z_ld(qa + 32 * j, qb + 32 * j);
            q[j] = _mm512_or_si512(_mm512_and_si512(w, low4), z_bit_to_4(vh, j));
            q[4 + j] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(w, 4), low4), z_bit_to_4(vh, 4 + j));
        }
        const __m512 d16 = z_ph(da, db);
        Z_UNROLL for (int i = 0; i < Z_TILE; i++) {
            __m512i isum = z_dot8(q, t->qs[b][i]);
            if (zk == Z_Q5_0) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(t->t[b][i]));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d16, _mm512_set1_ps(t->d[b][i])), acc[i]);
        }
    }
    Z_UNROLL for (int i = 0; i < Z_TILE; i++) acc_st[i] = acc[i];
    if (zk == Z_Q5_0) return;
    __m512 cor[Z_TILE];
    Z_UNROLL for (int i = 0; i < Z_TILE; i++) cor[i] = cor_st[i];
    for (int b = 0; b < nbs; b++) {
        const __m512 c16 = z_ph(((const block_q5_1x8 *)ga + b)->m, ((const block_q5_1x8 *)gb + b)->m);
        Z_UNROLL for (int i = 0; i < Z_TILE; i++) cor[i] = _mm512_fmadd_ps(c16, _mm512_set1_ps(t->s[b][i]), cor[i]);
    }
    Z_UNROLL for (int i = 0; i < Z_TILE; i++) cor_st[i] = cor[i];
}

/* Q4_K / Q5_K: super-blocks of 256; chunk c of 64 = sub-blocks 2c (low nibbles) and 2c+1
 * (high), 8 runs each: the low half's 8 vectors for every row, then the high half's (each row's
 * acc takes the low sub-block, then the high one, as in x86_gemm_k.h). nss: super-blocks. */
Z_AI void zt_k4(int zk, const char *ga, const char *gb, int nss, const z_act *t, __m512 *acc_st, __m512 *cor_st) {
    const int five = zk == Z_Q5_K;
    const __m512i low4 = _mm512_set1_epi8(15);
    __m512 acc[Z_TILE];
    Z_UNROLL for (int i = 0; i < Z_TILE; i++) acc[i] = acc_st[i];
    for (int s = 0; s < nss; s++) {
        const uint16_t *da, *db;
        const uint8_t(*sa)[ROW_GROUP], (*sb)[ROW_GROUP];
        const uint8_t *qa, *qb, *ha = NULL, *hb = NULL;
        if (five) {
            const block_q5_Kx8 *A = (const block_q5_Kx8 *)ga + s, *B = (const block_q5_Kx8 *)gb + s;
            da = A->d, db = B->d, sa = A->sc, sb = B->sc, qa = A->qs, qb = B->qs, ha = A->qh, hb = B->qh;
        } else {
            const block_q4_Kx8 *A = (const block_q4_Kx8 *)ga + s, *B = (const block_q4_Kx8 *)gb + s;
            da = A->d, db = B->d, sa = A->sc, sb = B->sc, qa = A->qs, qb = B->qs;
        }
        const __m512 d16 = z_ph(da, db);
        for (int c = 0; c < 4; c++)
            for (int half = 0; half < 2; half++) {
                __m512i q[8];
                for (int rr = 0; rr < 8; rr++) {
                    const __m512i w = z_ld(qa + 32 * (8 * c + rr), qb + 32 * (8 * c + rr));
                    q[rr] = half ? _mm512_and_si512(_mm512_srli_epi16(w, 4), low4) : _mm512_and_si512(w, low4);
                    if (five) q[rr] = _mm512_or_si512(q[rr], z_bit_to_4(z_ld(ha + 32 * rr, hb + 32 * rr), 2 * c + half));
                }
                const __m512i scv = z_u8(sa[2 * c + half], sb[2 * c + half]);
                const int b = 8 * s + 2 * c + half; /* the activation block in the slice */
                Z_UNROLL for (int i = 0; i < Z_TILE; i++) {
                    const __m512i isum = _mm512_mullo_epi32(z_dot8(q, t->qs[b][i]), scv);
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d16, _mm512_set1_ps(t->d[b][i])), acc[i]);
                }
            }
    }
    Z_UNROLL for (int i = 0; i < Z_TILE; i++) acc_st[i] = acc[i];
    /* the mins (k4_min_correction's operations, per super-block in order) */
    __m512 cor[Z_TILE];
    Z_UNROLL for (int i = 0; i < Z_TILE; i++) cor[i] = cor_st[i];
    for (int s = 0; s < nss; s++) {
        const uint16_t *dma, *dmb;
        const uint8_t(*ma)[ROW_GROUP], (*mb)[ROW_GROUP];
        if (five) {
            const block_q5_Kx8 *A = (const block_q5_Kx8 *)ga + s, *B = (const block_q5_Kx8 *)gb + s;
            dma = A->dmin, dmb = B->dmin, ma = A->m, mb = B->m;
        } else {
            const block_q4_Kx8 *A = (const block_q4_Kx8 *)ga + s, *B = (const block_q4_Kx8 *)gb + s;
            dma = A->dmin, dmb = B->dmin, ma = A->m, mb = B->m;
        }
        const __m512 dmin16 = z_ph(dma, dmb);
        for (int j = 0; j < 8; j++) {
            const __m512 mf = _mm512_mul_ps(dmin16, _mm512_cvtepi32_ps(z_u8(ma[j], mb[j])));
            Z_UNROLL for (int i = 0; i < Z_TILE; i++) cor[i] = _mm512_fnmadd_ps(mf, _mm512_set1_ps(t->s[8 * s + j][i]), cor[i]);
        }
    }
    Z_UNROLL for (int i = 0; i < Z_TILE; i++) cor_st[i] = cor[i];
}

/* Q6_K: unsigned quants (q + 32) into vpdpbusd, 32 x the per-16 activation sums (t->t) taken
 * off before the sub-block scale: x86_gemm_k.h's VNNI tile_q6_K. nss: super-blocks. */
Z_AI void zt_q6_K(const char *ga, const char *gb, int nss, const z_act *t, __m512 *acc_st) {
    const __m512i low4 = _mm512_set1_epi8(15);
    __m512 acc[Z_TILE];
    Z_UNROLL for (int i = 0; i < Z_TILE; i++) acc[i] = acc_st[i];
    for (int s = 0; s < nss; s++) {
        const block_q6_Kx8 *A = (const block_q6_Kx8 *)ga + s, *B = (const block_q6_Kx8 *)gb + s;
        const __m512 d16 = z_ph(A->d, B->d);
        for (int n = 0; n < 2; n++)
            for (int g = 0; g < 4; g++) {
                const int bs = 4 * n + g, b = 8 * s + bs; /* block in the super-block, in the slice */
                __m512i q[8];
                for (int rr = 0; rr < 8; rr++) {
                    const size_t lo_at = q6x8_ql(16 * n + 8 * (g & 1) + rr), hi_at = q6x8_qh(8 * n + rr);
                    const __m512i vl = z_ld(A->q + lo_at, B->q + lo_at);
                    const __m512i nib = g < 2 ? _mm512_and_si512(vl, low4) : _mm512_and_si512(_mm512_srli_epi16(vl, 4), low4);
                    q[rr] = _mm512_or_si512(nib, z_q6_high(z_ld(A->q + hi_at, B->q + hi_at), g));
                }
                const __m512i sc0 = z_i8(A->sc[2 * bs], B->sc[2 * bs]), sc1 = z_i8(A->sc[2 * bs + 1], B->sc[2 * bs + 1]);
                Z_UNROLL for (int i = 0; i < Z_TILE; i++) {
                    const int8_t *a = t->qs[b][i];
                    __m512i d0 = z_dp(_mm512_setzero_si512(), q[0], a), d1 = z_dp(_mm512_setzero_si512(), q[4], a + 16);
                    for (int rr = 1; rr < 4; rr++) {
                        d0 = z_dp(d0, q[rr], a + 4 * rr);
                        d1 = z_dp(d1, q[4 + rr], a + 16 + 4 * rr);
                    }
                    const __m512i t0 = _mm512_mullo_epi32(_mm512_sub_epi32(d0, _mm512_set1_epi32(t->t[2 * b][i])), sc0);
                    const __m512i t1 = _mm512_mullo_epi32(_mm512_sub_epi32(d1, _mm512_set1_epi32(t->t[2 * b + 1][i])), sc1);
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(t0, t1)), _mm512_mul_ps(d16, _mm512_set1_ps(t->d[b][i])), acc[i]);
                }
            }
    }
    Z_UNROLL for (int i = 0; i < Z_TILE; i++) acc_st[i] = acc[i];
}

/* ---- driver -------------------------------------------------------------------------------- */

/* One pair against the tile over a slice of nbs blocks of 32 (one instantiation per kind). */
Z_AI void z_tile(int zk, const char *ga, const char *gb, int nbs, const z_act *t, __m512 *acc_st, __m512 *cor_st) {
    switch (zk) {
    case Z_Q8_0: zt_x8(Z_Q8_0, ga, gb, nbs, t, acc_st, cor_st); break;
    case Z_Q4_0: zt_x8(Z_Q4_0, ga, gb, nbs, t, acc_st, cor_st); break;
    case Z_Q4_1: zt_x8(Z_Q4_1, ga, gb, nbs, t, acc_st, cor_st); break;
    case Z_Q5_0: zt_q5(Z_Q5_0, ga, gb, nbs, t, acc_st, cor_st); break;
    case Z_Q5_1: zt_q5(Z_Q5_1, ga, gb, nbs, t, acc_st, cor_st); break;
    case Z_Q4_K: zt_k4(Z_Q4_K, ga, gb, nbs / 8, t, acc_st, cor_st); break;
    case Z_Q5_K: zt_k4(Z_Q5_K, ga, gb, nbs / 8, t, acc_st, cor_st); break;
    default: zt_q6_K(ga, gb, nbs / 8, t, acc_st); break;
    }
}

/* Weight rows [o0, o1) (pairs of whole groups: o1 - o0 a multiple of 16, o0 of 8) against
 * activation rows [0, n_rows): per block of Z_OB pairs, tiles of Z_TILE rows (the last as wide
 * as the rows left, padded with zero rows that are never stored), per slice of Z_KS elements the
 * tile packed once and every pair run over it. */
static inline void gemm_z_rows(int x8, int kind, float *y, int ldy, const gemm_weight *w, int o0, int o1,
                               const act_rows *x, int n_rows, int accumulate) {
    const int zk = z_kind(x8, kind), k = w->n_in;
    const size_t group_bytes = x8 ? x8_bytes(w->type, k, ROW_GROUP)
                                  : kind_x8_bytes(kind) * (size_t)(k / ggml_block_elems(kind_type(kind)));
    const int unit = x8 ? QK : ggml_block_elems(kind_type(kind)); /* elements per x8 block */
    const size_t slice_bytes = group_bytes / (size_t)(k / unit) * (size_t)(Z_KS / unit); /* per Z_KS elements */
    const int sums = zk == Z_Q6_K ? 16 : zk == Z_Q8_0 || zk == Z_Q5_0 ? 32 : 0;
    z_act t;
    __m512 acc[Z_OB][Z_TILE], cor[Z_OB][Z_TILE];
    for (int ob = o0; ob < o1; ob += Z_OB * Z_LANES) {
        const int np = (o1 - ob < Z_OB * Z_LANES ? o1 - ob : Z_OB * Z_LANES) / Z_LANES;
        for (int r = 0; r < n_rows; r += Z_TILE) {
            const int R = n_rows - r < Z_TILE ? n_rows - r : Z_TILE;
            for (int p = 0; p < np; p++)
                for (int i = 0; i < Z_TILE; i++) acc[p][i] = cor[p][i] = _mm512_setzero_ps();
            for (int e0 = 0; e0 < k; e0 += Z_KS) {
                const int ne = k - e0 < Z_KS ? k - e0 : Z_KS;
                z_pack(&t, x, r, R, e0, ne, sums, zk == Z_Q8_0 ? 128 : 16);
                for (int p = 0; p < np; p++) {
                    const char *ga = (const char *)w->x8 + (size_t)((ob + Z_LANES * p) / ROW_GROUP) * group_bytes +
                                     (size_t)(e0 / Z_KS) * slice_bytes;
                    z_tile(zk, ga, ga + group_bytes, ne / QK, &t, acc[p], cor[p]);
                }
            }
            for (int p = 0; p < np; p++)
                for (int i = 0; i < R; i++) {
                    float *dst = y + (size_t)(r + i) * ldy + ob + Z_LANES * p;
                    __m512 v = _mm512_add_ps(acc[p][i], cor[p][i]);
                    if (accumulate) v = _mm512_add_ps(_mm512_loadu_ps(dst), v);
                    _mm512_storeu_ps(dst, v);
                }
        }
    }
}

/* The end of the pairs of whole groups from o0 within [o0, o1) (o0 itself when none). */
static inline int z_pairs_end(const gemm_weight *w, int o0, int o1) {
    int grouped_end = w->x8 ? w->n_out / ROW_GROUP * ROW_GROUP : o0;
    if (grouped_end > o1) grouped_end = o1;
    if (grouped_end < o0) return o0;
    return o0 + (grouped_end - o0) / Z_LANES * Z_LANES;
}

#endif
