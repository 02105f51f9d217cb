/* AVX2 bit and byte helpers of the block-type kernels: scale pairs for madd_epi16, a 4-byte
 * broadcast, a bit moved within bytes, Q6_K's high bits. Shared by x86_gemm_k.h's row-group tiles
 * and x86_avx2_tiles.c's prefill tiles, so both unpack a weight with the same operations.
 * Include only from files compiled for AVX2 (their `#pragma GCC target`). */
#ifndef SLOTSERVE_X86_AVX2_BITS_H
#define SLOTSERVE_X86_AVX2_BITS_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

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

#endif
