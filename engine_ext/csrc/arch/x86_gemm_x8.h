/* The row-group micro-kernel of the Q8_0, Q4_0 and Q4_1 matmuls (kernels.h x8 layout), one body
 * for two instruction sets: included by x86_avx2.c (X8_VNNI 0: maddubs/madd) and x86_vnni.c
 * (X8_VNNI 1: AVX512-VNNI vpdpbusd on 256-bit vectors). The includer sets its target pragma,
 * defines X8_VNNI and X8_TILE (most activation rows per call) and includes <immintrin.h>.
 *
 * Design: lane i of every vector is weight row 8g+i, so per (weight row, activation row) the
 * float operations are, whatever the instruction set and tile size:
 *   acc = fma(float(isum_b), d_b * ad_b, acc)     for b = 0 .. nb-1
 *   cor = fma(c_b, as_b, cor)                     for b = 0 .. nb-1
 *   y = acc + cor          (c: Q4_1 m; Q4_0 -8 d; Q8_0 none)
 * isum_b is the exact integer dot product of block b (32 weight x activation products), summed
 * without overflow either way:
 *   maddubs/madd  Q4: the products of a 4-element run pair fit int16 (<= 2 * 15 * 127), and 8 of
 *                 them (<= 30480) are summed in int16 before one widening; Q8_0 widens each run
 *                 (2 * 128 * 127 nearly fills int16).
 *   vpdpbusd      adds the four u8 x s8 products of each 32-bit lane into int32 directly.
 * Q8_0 weights are signed: both forms multiply |w| (unsigned) by a carrying w's sign, or on VNNI
 * with at most X8_TILE rows, w + 128 by a (KIND_Q8_0_BIASED below).
 * NOTE: so the two variants give bit-identical results; tests/engine/test_kernels.py holds
 * them to ==. What VNNI changes is the cost: per 4-element run and activation row, one
 * instruction instead of maddubs + add (Q4) or maddubs + madd + add (Q8_0). */
#ifndef SLOTSERVE_X86_GEMM_X8_H
#define SLOTSERVE_X86_GEMM_X8_H

/* KIND_Q8_0_BIASED (VNNI only): Q8_0 with the weights biased to unsigned instead of the signs
 * moved onto the activations: vpdpbusd(w + 128, a) = sum(w a) + 128 sum(a), and the caller's
 * abias table (128 * the integer sum of each activation block) takes the excess off again,
 * still in int32: the same exact isum_b, one instruction per run and row instead of two. */
enum { KIND_Q8_0, KIND_Q4_0, KIND_Q4_1, KIND_Q8_0_BIASED };

/* 4 activation bytes broadcast to every 32-bit lane */
static inline __m256i x8_bcast4(const int8_t *a) {
    int32_t v;
    memcpy(&v, a, 4);
    return _mm256_set1_epi32(v);
}

#if X8_VNNI
/* acc + vpdpbusd(w, 4 activation bytes broadcast to every lane), the broadcast embedded in the
 * instruction's memory operand ({1to8}: no separate broadcast; GCC does not form it from the
 * intrinsics). Also the K-quant tiles' (x86_gemm_k.h). */
static inline __m256i x8_dpbusd_bcast(__m256i acc, __m256i w, const int8_t *a) {
    __asm__("vpdpbusd %[a]%{1to8%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [a] "m"(*(const int32_t *)a));
    return acc;
}
#endif

/* One group of 8 weight rows (x8 blocks from `group`) against activation rows r0 .. r0+R-1,
 * written to y[r][o .. o+8). */
static inline __attribute__((always_inline)) void gemm_x8_tile(
    int kind, const int R, float *y, int ldy, const void *group, int o, const act_rows *x, int r0,
    int accumulate, const int32_t *abias) {
    const int k = x->k, nb = k / QK;
    const __m256i low4 = _mm256_set1_epi8(15);
#if !X8_VNNI
    const __m256i ones = _mm256_set1_epi16(1);
#endif
    __m256 acc[X8_TILE], cor[X8_TILE];
    const int8_t *aq[X8_TILE];
    const float *ad[X8_TILE], *as[X8_TILE];
    for (int r = 0; r < R; r++) {
        acc[r] = cor[r] = _mm256_setzero_ps();
        aq[r] = x->qs + (size_t)(r0 + r) * k;
        ad[r] = x->d + (size_t)(r0 + r) * nb;
        as[r] = x->s + (size_t)(r0 + r) * nb;
    }
    for (int b = 0; b < nb; b++) {
        /* VNNI: two chains of dpbusd per row (a chain's latency, not the port, would bound it) */
        __m256i isum[X8_TILE], isum2[X8_TILE];
        for (int r = 0; r < R; r++) isum[r] = isum2[r] = _mm256_setzero_si256();
        const uint16_t *dp;
#if X8_VNNI
        if (kind == KIND_Q8_0_BIASED) {
            const block_q8_0x8 *blk = (const block_q8_0x8 *)group + b;
            dp = blk->d;
            const __m256i bias = _mm256_set1_epi8((char)0x80);
            for (int j = 0; j < QK / 4; j++) {
                __m256i wu = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk->qs + 32 * j)), bias);
                for (int r = 0; r < R; r++) {
                    const int8_t *a = aq[r] + b * QK + 4 * j;
                    if (j & 1) isum2[r] = x8_dpbusd_bcast(isum2[r], wu, a);
                    else isum[r] = x8_dpbusd_bcast(isum[r], wu, a);
                }
            }
            for (int r = 0; r < R; r++)
                isum[r] = _mm256_sub_epi32(_mm256_add_epi32(isum[r], isum2[r]), _mm256_set1_epi32(abias[(size_t)r * nb + b]));
        } else
#endif
        if (kind == KIND_Q8_0) {
            const block_q8_0x8 *blk = (const block_q8_0x8 *)group + b;
            dp = blk->d;
            for (int j = 0; j < QK / 4; j++) {
                __m256i w = _mm256_loadu_si256((const __m256i *)(blk->qs + 32 * j));
                __m256i wabs = _mm256_sign_epi8(w, w);
                for (int r = 0; r < R; r++) {
                    __m256i a = _mm256_sign_epi8(x8_bcast4(aq[r] + b * QK + 4 * j), w);
#if X8_VNNI
                    if (j & 1) isum2[r] = _mm256_dpbusd_epi32(isum2[r], wabs, a);
                    else isum[r] = _mm256_dpbusd_epi32(isum[r], wabs, a);
#else
                    __m256i p = _mm256_maddubs_epi16(wabs, a);
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, ones));
                    __asm__("" : "+x"(isum[r])); /* a chain, as below */
#endif
                }
            }
#if X8_VNNI
            for (int r = 0; r < R; r++) isum[r] = _mm256_add_epi32(isum[r], isum2[r]);
#endif
        } else {
            const uint8_t *qs;
            if (kind == KIND_Q4_0) {
                const block_q4_0x8 *blk = (const block_q4_0x8 *)group + b;
                dp = blk->d;
                qs = blk->qs;
            } else {
                const block_q4_1x8 *blk = (const block_q4_1x8 *)group + b;
                dp = blk->d;
                qs = blk->qs;
            }
            for (int j = 0; j < QK / 8; j++) {
                __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
                __m256i lo = _mm256_and_si256(w, low4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
                for (int r = 0; r < R; r++) {
                    const int8_t *a = aq[r] + b * QK;
#if X8_VNNI
                    isum[r] = x8_dpbusd_bcast(isum[r], lo, a + 4 * j);
                    isum2[r] = x8_dpbusd_bcast(isum2[r], hi, a + 16 + 4 * j);
#else
                    __m256i p = _mm256_maddubs_epi16(lo, x8_bcast4(a + 4 * j));
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(hi, x8_bcast4(a + 16 + 4 * j)));
                    isum[r] = _mm256_add_epi16(isum[r], p);
                    /* NOTE: keeps the sum a chain: otherwise GCC re-associates the integer adds
                     * into a tree over all 32 products and spills most of them */
                    __asm__("" : "+x"(isum[r]));
#endif
                }
            }
#if X8_VNNI
            for (int r = 0; r < R; r++) isum[r] = _mm256_add_epi32(isum[r], isum2[r]);
#else
            for (int r = 0; r < R; r++) isum[r] = _mm256_madd_epi16(isum[r], ones);
#endif
        }
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dp));
        for (int r = 0; r < R; r++)
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(d8, _mm256_set1_ps(ad[r][b])), acc[r]);
    }
    if (kind != KIND_Q8_0 && kind != KIND_Q8_0_BIASED) {
        for (int b = 0; b < nb; b++) {
            __m256 c8;
            if (kind == KIND_Q4_0)
                c8 = _mm256_mul_ps(_mm256_set1_ps(-8.0f),
                                   _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const block_q4_0x8 *)group + b)->d)));
            else
                c8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const block_q4_1x8 *)group + b)->m));
            for (int r = 0; r < R; r++) cor[r] = _mm256_fmadd_ps(c8, _mm256_set1_ps(as[r][b]), cor[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        float *dst = y + (size_t)(r0 + r) * ldy + o;
        __m256 v = _mm256_add_ps(acc[r], cor[r]);
        if (accumulate) v = _mm256_add_ps(_mm256_loadu_ps(dst), v);
        _mm256_storeu_ps(dst, v);
    }
}

/* Weight rows [o0, o1) (whole groups of w->x8) against all n_rows activation rows: groups
 * outer (a group's blocks stay in L1 while every tile of rows passes over them), tiles of
 * X8_TILE rows inner, the last tile as wide as the rows left. abias: [n_rows][nb] for
 * KIND_Q8_0_BIASED, else NULL. */
static inline __attribute__((always_inline)) void gemm_x8_groups(
    int kind, float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows,
    int accumulate, const int32_t *abias) {
    const int nb = w->n_in / QK;
    const size_t group_bytes = x8_bytes(w->type, w->n_in, ROW_GROUP);
    for (int o = o0; o < o1; o += ROW_GROUP) {
        const void *group = (const char *)w->x8 + (size_t)(o / ROW_GROUP) * group_bytes;
        int r0 = 0;
        for (; r0 + X8_TILE <= n_rows; r0 += X8_TILE)
            gemm_x8_tile(kind, X8_TILE, y, ldy, group, o, x, r0, accumulate, abias ? abias + (size_t)r0 * nb : NULL);
        switch (n_rows - r0) {
#define X8_REST(n) case n: gemm_x8_tile(kind, n, y, ldy, group, o, x, r0, accumulate, abias ? abias + (size_t)r0 * nb : NULL); break;
        X8_REST(1) X8_REST(2) X8_REST(3)
#if X8_TILE > 4
        X8_REST(4) X8_REST(5) X8_REST(6) X8_REST(7)
#endif
#undef X8_REST
        default: break;
        }
    }
}

#endif
