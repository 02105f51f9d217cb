/* The prefill tiles of the avx512vnni variant: two row groups (16 weight rows) per 512-bit
 * vector, for calls of Z_MIN_ROWS activation rows or more (a prefill chunk). Included by
 * x86_vnni.c after x86_gemm_x8.h and x86_gemm_k.h, whose kinds, layouts and helpers it uses.
 *
 * Design: the row-group layouts stay as they are (quant_k.h, blocks.h: one x8 block holds run j
 * of 8 rows in 32 bytes); a tile loads the same run of groups g and g+1 into the two halves of
 * one zmm, so lane i is weight row 8g + i for i < 8 and 8(g+1) + i - 8 above. Each weight run is
 * unpacked once per tile into registers and then multiplied by Z_TILE activation rows (vpdpbusd
 * with the four activation bytes broadcast from memory, {1to16}): 64 int8 products per
 * instruction, twice the 256-bit tiles' 32, and the unpacking spread over 16 rows.
 *
 * Per lane the operations are the 256-bit VNNI tiles' (x86_gemm_k.h, x86_gemm_x8.h), in the same
 * order: exact int32 block sums (sub-block scales by vpmulld), then per block
 *   acc = fma(float(isum_b), d * ad_b, acc),  cor = fma(c_b, as_b, cor) in a second pass,
 *   y = acc + cor (+ y),
 * so a row's numbers are bit-identical to the avx2 variant's whatever tile, pair or call it lands
 * in (tests/engine/test_kernels_kquants.py and test_kernels.py hold them to ==). Q8_0 runs biased
 * (w + 128 into vpdpbusd, 128 x the activation block sum taken off: AVX-512 has no vpsignb). */
#ifndef SLOTSERVE_X86_GEMM_Z16_H
#define SLOTSERVE_X86_GEMM_Z16_H

#define Z_TILE 16     /* activation rows per tile */
#define Z_MIN_ROWS 9  /* fewer rows (decode steps) stay on the 256-bit tiles */
#define Z_LANES 16    /* weight rows per tile: two row groups */

#define Z_AI static inline __attribute__((always_inline))

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

Z_AI const int8_t *z_arow(const act_rows *x, int r) { return x->qs + (size_t)r * x->k; }

/* ---- K-quant kinds (x86_gemm_k.h) ---------------------------------------------------------- */

/* Every tile unpacks one unit of weights (8 vectors: a block of 32, or half a Q4_K/Q5_K chunk)
 * into registers, then runs each activation row over it: a row's integer sum is a few short
 * chains, and 8 weight vectors + Z_TILE accumulators fit the 32 registers without spilling. */

/* Q5_0 / Q5_1: ga, gb point at the two groups' first x8 blocks. */
Z_AI void ztile_q5(int kind, const int R, const void *ga, const void *gb, const act_rows *x, int r0, __m512 *acc,
                   __m512 *cor) {
    const int nb = x->k / QK;
    const __m512i low4 = _mm512_set1_epi8(15);
    for (int b = 0; b < nb; b++) {
        const uint8_t *qa, *qb, *ha, *hb;
        const uint16_t *da, *db;
        if (kind == KIND_Q5_0) {
            const block_q5_0x8 *A = (const block_q5_0x8 *)ga + b, *B = (const block_q5_0x8 *)gb + b;
            qa = A->qs, qb = B->qs, ha = A->qh, hb = B->qh, da = A->d, db = B->d;
        } else {
            const block_q5_1x8 *A = (const block_q5_1x8 *)ga + b, *B = (const block_q5_1x8 *)gb + b;
            qa = A->qs, qb = B->qs, ha = A->qh, hb = B->qh, da = A->d, db = B->d;
        }
        const __m512i vh = z_ld(ha, hb);
        __m512i lo[4], hi[4];
        for (int j = 0; j < 4; j++) {
            const __m512i w = z_ld(qa + 32 * j, qb + 32 * j);
            lo[j] = _mm512_or_si512(_mm512_and_si512(w, low4), z_bit_to_4(vh, j));
            hi[j] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(w, 4), low4), z_bit_to_4(vh, 4 + j));
        }
        const __m512 d16 = z_ph(da, db);
        for (int r = 0; r < R; r++) {
            const int8_t *a = z_arow(x, r0 + r) + b * QK;
            __m512i s_lo = z_dp(_mm512_setzero_si512(), lo[0], a), s_hi = z_dp(_mm512_setzero_si512(), hi[0], a + 16);
            for (int j = 1; j < 4; j++) {
                s_lo = z_dp(s_lo, lo[j], a + 4 * j);
                s_hi = z_dp(s_hi, hi[j], a + 16 + 4 * j);
            }
            const __m512i isum = _mm512_add_epi32(s_lo, s_hi);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d16, _mm512_set1_ps(x->d[(size_t)(r0 + r) * nb + b])), acc[r]);
        }
    }
    for (int b = 0; b < nb; b++) {
        __m512 c16;
        if (kind == KIND_Q5_0)
            c16 = _mm512_mul_ps(_mm512_set1_ps(-16.0f), z_ph(((const block_q5_0x8 *)ga + b)->d, ((const block_q5_0x8 *)gb + b)->d));
        else
            c16 = z_ph(((const block_q5_1x8 *)ga + b)->m, ((const block_q5_1x8 *)gb + b)->m);
        for (int r = 0; r < R; r++) cor[r] = _mm512_fmadd_ps(c16, _mm512_set1_ps(x->s[(size_t)(r0 + r) * nb + b]), cor[r]);
    }
}

/* Q4_K / Q5_K: chunk c of 64 = sub-blocks 2c (low nibbles) and 2c+1 (high), 8 runs each; the
 * low half's 8 vectors for every row, then the high half's (each row's acc takes the low
 * sub-block, then the high one, as in x86_gemm_k.h). */
Z_AI void ztile_k4(int kind, const int R, const void *ga, const void *gb, const act_rows *x, int r0, __m512 *acc,
                   __m512 *cor) {
    const int nb = x->k / QK, ns = x->k / QK_K, five = kind == KIND_Q5_K;
    const __m512i low4 = _mm512_set1_epi8(15);
    for (int s = 0; s < ns; s++) {
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
                for (int r = 0; r < R; r++) {
                    const int8_t *a = z_arow(x, r0 + r) + (size_t)s * QK_K + 64 * c + 32 * half;
                    __m512i s0 = z_dp(_mm512_setzero_si512(), q[0], a), s1 = z_dp(_mm512_setzero_si512(), q[1], a + 4);
                    for (int rr = 2; rr < 8; rr += 2) {
                        s0 = z_dp(s0, q[rr], a + 4 * rr);
                        s1 = z_dp(s1, q[rr + 1], a + 4 * rr + 4);
                    }
                    const __m512i isum = _mm512_mullo_epi32(_mm512_add_epi32(s0, s1), scv);
                    const size_t rb = (size_t)(r0 + r) * nb + (size_t)s * 8 + 2 * c + half;
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d16, _mm512_set1_ps(x->d[rb])), acc[r]);
                }
            }
    }
    /* the mins (k4_min_correction's operations, per super-block in order) */
    for (int s = 0; s < ns; s++) {
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
            for (int r = 0; r < R; r++)
                cor[r] = _mm512_fnmadd_ps(mf, _mm512_set1_ps(x->s[(size_t)(r0 + r) * nb + (size_t)s * 8 + j]), cor[r]);
        }
    }
}

/* Q6_K: unsigned quants (q + 32) into vpdpbusd, 32 x the per-16 activation sums (asum, rows
 * from r0) taken off before the sub-block scale: x86_gemm_k.h's VNNI tile_q6_K. */
Z_AI void ztile_q6_K(const int R, const void *ga, const void *gb, const act_rows *x, int r0, __m512 *acc,
                     const int32_t *asum) {
    const int k = x->k, nb = k / QK, n16 = k / 16, ns = k / QK_K;
    const __m512i low4 = _mm512_set1_epi8(15);
    for (int s = 0; s < ns; s++) {
        const block_q6_Kx8 *A = (const block_q6_Kx8 *)ga + s, *B = (const block_q6_Kx8 *)gb + s;
        const __m512 d16 = z_ph(A->d, B->d);
        for (int n = 0; n < 2; n++)
            for (int g = 0; g < 4; g++) {
                const int b = 4 * n + g;
                __m512i q[8];
                for (int rr = 0; rr < 8; rr++) {
                    const size_t lo_at = q6x8_ql(16 * n + 8 * (g & 1) + rr), hi_at = q6x8_qh(8 * n + rr);
                    const __m512i vl = z_ld(A->q + lo_at, B->q + lo_at);
                    const __m512i nib = g < 2 ? _mm512_and_si512(vl, low4) : _mm512_and_si512(_mm512_srli_epi16(vl, 4), low4);
                    q[rr] = _mm512_or_si512(nib, z_q6_high(z_ld(A->q + hi_at, B->q + hi_at), g));
                }
                const __m512i sc0 = z_i8(A->sc[2 * b], B->sc[2 * b]), sc1 = z_i8(A->sc[2 * b + 1], B->sc[2 * b + 1]);
                const size_t e16 = ((size_t)s * QK_K + QK * b) / 16;
                for (int r = 0; r < R; r++) {
                    const int8_t *a = z_arow(x, r0 + r) + (size_t)s * QK_K + QK * b;
                    __m512i d0 = z_dp(_mm512_setzero_si512(), q[0], a), d1 = z_dp(_mm512_setzero_si512(), q[4], a + 16);
                    for (int rr = 1; rr < 4; rr++) {
                        d0 = z_dp(d0, q[rr], a + 4 * rr);
                        d1 = z_dp(d1, q[4 + rr], a + 16 + 4 * rr);
                    }
                    const int32_t *as = asum + (size_t)r * n16 + e16;
                    const __m512i t0 = _mm512_mullo_epi32(_mm512_sub_epi32(d0, _mm512_set1_epi32(as[0])), sc0);
                    const __m512i t1 = _mm512_mullo_epi32(_mm512_sub_epi32(d1, _mm512_set1_epi32(as[1])), sc1);
                    const size_t rb = (size_t)(r0 + r) * nb + (size_t)s * 8 + b;
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(t0, t1)), _mm512_mul_ps(d16, _mm512_set1_ps(x->d[rb])), acc[r]);
                }
            }
    }
}

/* ---- x8 kinds (x86_gemm_x8.h): Q8_0 (biased), Q4_0, Q4_1 ---------------------------------- */

/* abias: 128 x each activation block's integer sum, [rows from r0][nb] (Q8_0 only). */
Z_AI void ztile_x8(int kind, const int R, const void *ga, const void *gb, const act_rows *x, int r0, __m512 *acc,
                   __m512 *cor, const int32_t *abias) {
    const int nb = x->k / QK;
    const __m512i low4 = _mm512_set1_epi8(15);
    for (int b = 0; b < nb; b++) {
        /* Q8_0: q[j] = run j (+128); Q4: q[2j] low nibbles of run j (elements 4j..), q[2j+1] high
         * (16 + 4j..) */
        __m512i q[8];
        const uint16_t *da, *db;
        if (kind == KIND_Q8_0) {
            const block_q8_0x8 *A = (const block_q8_0x8 *)ga + b, *B = (const block_q8_0x8 *)gb + b;
            da = A->d, db = B->d;
            const __m512i bias = _mm512_set1_epi8((char)0x80);
            for (int j = 0; j < 8; j++) q[j] = _mm512_xor_si512(z_ld(A->qs + 32 * j, B->qs + 32 * j), bias);
        } else {
            const uint8_t *qa, *qb;
            if (kind == KIND_Q4_0) {
                const block_q4_0x8 *A = (const block_q4_0x8 *)ga + b, *B = (const block_q4_0x8 *)gb + b;
                da = A->d, db = B->d, qa = A->qs, qb = B->qs;
            } else {
                const block_q4_1x8 *A = (const block_q4_1x8 *)ga + b, *B = (const block_q4_1x8 *)gb + b;
                da = A->d, db = B->d, qa = A->qs, qb = B->qs;
            }
            for (int j = 0; j < 4; j++) {
                const __m512i w = z_ld(qa + 32 * j, qb + 32 * j);
                q[2 * j] = _mm512_and_si512(w, low4);
                q[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(w, 4), low4);
            }
        }
        const __m512 d16 = z_ph(da, db);
        for (int r = 0; r < R; r++) {
            const int8_t *a = z_arow(x, r0 + r) + b * QK;
            __m512i s0, s1;
            if (kind == KIND_Q8_0) {
                s0 = z_dp(_mm512_setzero_si512(), q[0], a), s1 = z_dp(_mm512_setzero_si512(), q[1], a + 4);
                for (int j = 2; j < 8; j += 2) {
                    s0 = z_dp(s0, q[j], a + 4 * j);
                    s1 = z_dp(s1, q[j + 1], a + 4 * j + 4);
                }
            } else {
                s0 = z_dp(_mm512_setzero_si512(), q[0], a), s1 = z_dp(_mm512_setzero_si512(), q[1], a + 16);
                for (int j = 1; j < 4; j++) {
                    s0 = z_dp(s0, q[2 * j], a + 4 * j);
                    s1 = z_dp(s1, q[2 * j + 1], a + 16 + 4 * j);
                }
            }
            __m512i isum = _mm512_add_epi32(s0, s1);
            if (kind == KIND_Q8_0) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(abias[(size_t)r * nb + b]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d16, _mm512_set1_ps(x->d[(size_t)(r0 + r) * nb + b])), acc[r]);
        }
    }
    if (kind == KIND_Q8_0) return;
    for (int b = 0; b < nb; b++) {
        __m512 c16;
        if (kind == KIND_Q4_0)
            c16 = _mm512_mul_ps(_mm512_set1_ps(-8.0f), z_ph(((const block_q4_0x8 *)ga + b)->d, ((const block_q4_0x8 *)gb + b)->d));
        else
            c16 = z_ph(((const block_q4_1x8 *)ga + b)->m, ((const block_q4_1x8 *)gb + b)->m);
        for (int r = 0; r < R; r++) cor[r] = _mm512_fmadd_ps(c16, _mm512_set1_ps(x->s[(size_t)(r0 + r) * nb + b]), cor[r]);
    }
}

/* ---- driver -------------------------------------------------------------------------------- */

/* Which tile: the x8 kinds are told apart from the K-quant kinds (their enums overlap) by `x8`. */
Z_AI void z_tile(int x8, int kind, const int R, float *y, int ldy, const void *ga, const void *gb, int o,
                 const act_rows *x, int r0, int accumulate, const int32_t *tab) {
    __m512 acc[Z_TILE], cor[Z_TILE];
    for (int r = 0; r < R; r++) acc[r] = cor[r] = _mm512_setzero_ps();
    if (x8) ztile_x8(kind, R, ga, gb, x, r0, acc, cor, tab);
    else if (kind == KIND_Q5_0 || kind == KIND_Q5_1) ztile_q5(kind, R, ga, gb, x, r0, acc, cor);
    else if (kind == KIND_Q6_K) ztile_q6_K(R, ga, gb, x, r0, acc, tab);
    else ztile_k4(kind, R, ga, gb, x, r0, acc, cor);
    for (int r = 0; r < R; r++) {
        float *dst = y + (size_t)(r0 + r) * ldy + o;
        __m512 v = _mm512_add_ps(acc[r], cor[r]);
        if (accumulate) v = _mm512_add_ps(_mm512_loadu_ps(dst), v);
        _mm512_storeu_ps(dst, v);
    }
}

/* Weight rows [o0, o1) (pairs of whole groups: o1 - o0 a multiple of 16, o0 of 8) against
 * activation rows [r0, r1): pairs outer (their blocks stay in cache while every tile of rows
 * passes over them), tiles of Z_TILE rows inner, the last as wide as the rows left. tab: the
 * per-row table of the kind (Q8_0 abias, Q6_K asum) for rows from r0, tab_row ints a row. */
Z_AI void gemm_z_rows(int x8, int kind, float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x,
                      int r0, int r1, int accumulate, const int32_t *tab, size_t tab_row) {
    const size_t group_bytes = x8 ? x8_bytes(w->type, w->n_in, ROW_GROUP)
                                  : kind_x8_bytes(kind) * (size_t)(w->n_in / ggml_block_elems(kind_type(kind)));
    for (int o = o0; o + Z_LANES <= o1; o += Z_LANES) {
        const char *ga = (const char *)w->x8 + (size_t)(o / ROW_GROUP) * group_bytes, *gb = ga + group_bytes;
        int r = r0;
        for (; r + Z_TILE <= r1; r += Z_TILE)
            z_tile(x8, kind, Z_TILE, y, ldy, ga, gb, o, x, r, accumulate, tab ? tab + (size_t)(r - r0) * tab_row : NULL);
        switch (r1 - r) {
#define Z_REST(n)                                                                                                      \
    case n: z_tile(x8, kind, n, y, ldy, ga, gb, o, x, r, accumulate, tab ? tab + (size_t)(r - r0) * tab_row : NULL); break;
        Z_REST(1) Z_REST(2) Z_REST(3) Z_REST(4) Z_REST(5) Z_REST(6) Z_REST(7)
        Z_REST(8) Z_REST(9) Z_REST(10) Z_REST(11) Z_REST(12) Z_REST(13) Z_REST(14) Z_REST(15)
#undef Z_REST
        default: break;
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
