/* The integer multiply-accumulate peak of each x86 kernel variant's instruction mix, for
 * `slotserve bench kernels` (the GEMM figures are reported as a fraction of it).
 *
 * Each loop runs PEAK_CHAINS independent accumulators (more than the latency x throughput of
 * any of these instructions on current cores), so it is bound by the instruction's throughput:
 *   vnni512   vpdpbusd zmm: 64 u8 x s8 products into int32 per instruction (the prefill tiles)
 *   vnni256   vpdpbusd ymm: 32 per instruction (the decode tiles of the avx512vnni variant)
 *   avx2      vpmaddubsw ymm + vpaddw: 32 per pair (the avx2 variant's int16 stage; the
 *             widening vpmaddwd that follows every 4-8 of them is not counted)
 *   avx2+fma  the same pairs, each beside one vfmadd231ps ymm on a float chain of its own (the
 *             float step the row contract adds: kernels.h); the FMAs' products are not counted,
 *             so this is avx2's rate when the FMAs cost nothing, and half of it where they issue
 *             on the same pipes as vpmaddubsw (Zen 5 with AVX2: its two multiply pipes)
 * kernel_peak_macs returns the products computed (0 when the CPU lacks the instructions or the
 * mix is unknown), so products / CPU seconds is the peak rate of one thread.
 *
 * kernel_read_sum is the other bound, memory's: it reads n bytes once, in order, as a decode
 * step's matmuls read weights (32-byte loads into four independent sums on AVX2, 8-byte words
 * elsewhere), and returns their wrapping sum so the reads cannot be dropped. Bytes / seconds on
 * the engine's threads is the read rate the host gives at that moment (`bench versus --probe`).
 */
#include <string.h>

#include "../kernels.h"

#define PEAK_CHAINS 12
#define PEAK_AVX2_FMA_PAIRS 8 /* avx2+fma: vpmaddubsw + vpaddw pairs (and FMAs) a loop iteration */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

/* PEAK_CHAINS accumulators as named variables (an array indexed in a loop may live in memory),
 * each kept in a register and every instruction kept (the empty asm) */
#define PEAK_LOOP(T, ZERO, STEP, WIDTH)                                                            \
    T a0 = ZERO, a1 = ZERO, a2 = ZERO, a3 = ZERO, a4 = ZERO, a5 = ZERO, a6 = ZERO, a7 = ZERO,     \
      a8 = ZERO, a9 = ZERO, a10 = ZERO, a11 = ZERO;                                                \
    for (long n = 0; n < iters; n++) {                                                             \
        a0 = STEP(a0), a1 = STEP(a1), a2 = STEP(a2), a3 = STEP(a3), a4 = STEP(a4), a5 = STEP(a5);  \
        a6 = STEP(a6), a7 = STEP(a7), a8 = STEP(a8), a9 = STEP(a9), a10 = STEP(a10), a11 = STEP(a11); \
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5));       \
        __asm__ volatile("" : "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));     \
    }                                                                                              \
    return iters * PEAK_CHAINS * (WIDTH)

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static long peak_vnni512(long iters) {
    const __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
#define STEP512(a) _mm512_dpbusd_epi32(a, w, x)
    PEAK_LOOP(__m512i, _mm512_setzero_si512(), STEP512, 64);
}

__attribute__((target("avx2,avx512f,avx512vl,avx512vnni"))) static long peak_vnni256(long iters) {
    const __m256i w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(5);
#define STEP256(a) _mm256_dpbusd_epi32(a, w, x)
    PEAK_LOOP(__m256i, _mm256_setzero_si256(), STEP256, 32);
}

/* acc + vpmaddubsw(w, x), the multiply written in the asm beside the add it feeds.
 * NOTE: with _mm256_add_epi16(a, _mm256_maddubs_epi16(w, x)) GCC computes the loop-invariant
 * product once before the loop and times vpaddw alone: twice the real rate on Zen 5 (4 adds a
 * cycle against 2 multiplies), which made every avx2 "of peak" look half of what it was. */
__attribute__((target("avx2"))) static inline __m256i avx2_mac(__m256i acc, __m256i w, __m256i x) {
    __m256i p;
    __asm__("vpmaddubsw %[x], %[w], %[p]\n\tvpaddw %[p], %[acc], %[acc]" : [acc] "+x"(acc), [p] "=&x"(p) : [w] "x"(w), [x] "x"(x));
    return acc;
}

__attribute__((target("avx2"))) static long peak_avx2(long iters) {
    const __m256i w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(5);
#define STEP_AVX2(a) avx2_mac(a, w, x)
    PEAK_LOOP(__m256i, _mm256_setzero_si256(), STEP_AVX2, 32);
}

/* 4 integer chains of avx2_mac (the adds' latency is one cycle) and 8 float chains of FMAs (4
 * cycles of latency at up to 2 a cycle), one FMA beside each pair: 16 ymm registers in all. */
__attribute__((target("avx2,fma"))) static long peak_avx2_fma(long iters) {
    const __m256i w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(5);
    const __m256 c = _mm256_set1_ps(0.5f); /* f = f * 0.5 + 0.5 stays finite */
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    __m256 f0 = _mm256_setzero_ps(), f1 = f0, f2 = f0, f3 = f0, f4 = f0, f5 = f0, f6 = f0, f7 = f0;
    for (long n = 0; n < iters; n++) {
        a0 = avx2_mac(a0, w, x), f0 = _mm256_fmadd_ps(f0, c, c), a1 = avx2_mac(a1, w, x), f1 = _mm256_fmadd_ps(f1, c, c);
        a2 = avx2_mac(a2, w, x), f2 = _mm256_fmadd_ps(f2, c, c), a3 = avx2_mac(a3, w, x), f3 = _mm256_fmadd_ps(f3, c, c);
        a0 = avx2_mac(a0, w, x), f4 = _mm256_fmadd_ps(f4, c, c), a1 = avx2_mac(a1, w, x), f5 = _mm256_fmadd_ps(f5, c, c);
        a2 = avx2_mac(a2, w, x), f6 = _mm256_fmadd_ps(f6, c, c), a3 = avx2_mac(a3, w, x), f7 = _mm256_fmadd_ps(f7, c, c);
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3));
        __asm__ volatile("" : "+v"(f0), "+v"(f1), "+v"(f2), "+v"(f3), "+v"(f4), "+v"(f5), "+v"(f6), "+v"(f7));
    }
    return iters * PEAK_AVX2_FMA_PAIRS * 32;
}
#endif

#if defined(__x86_64__) || defined(__i386__)
/* the words of p[0, n - n % 128) */
__attribute__((target("avx2"))) static uint64_t read_sum_avx2(const uint8_t *p, size_t n) {
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        s0 = _mm256_add_epi64(s0, _mm256_loadu_si256((const __m256i *)(p + i)));
        s1 = _mm256_add_epi64(s1, _mm256_loadu_si256((const __m256i *)(p + i + 32)));
        s2 = _mm256_add_epi64(s2, _mm256_loadu_si256((const __m256i *)(p + i + 64)));
        s3 = _mm256_add_epi64(s3, _mm256_loadu_si256((const __m256i *)(p + i + 96)));
    }
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3)));
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif

/* The sum of n bytes read as little-endian 64-bit words (a tail shorter than a word byte by byte),
 * wrapping: the same value on every path. */
uint64_t kernel_read_sum(const uint8_t *p, size_t n) {
    uint64_t total = 0;
    size_t i = 0;
#if defined(__x86_64__) || defined(__i386__)
    if (kernels_avx2_supported()) total = read_sum_avx2(p, n), i = n - n % 128;
#endif
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        total += w;
    }
    for (; i < n; i++) total += p[i];
    return total;
}

long kernel_peak_macs(const char *mix, long iters) {
#if defined(__x86_64__) || defined(__i386__)
    if (strcmp(mix, "vnni512") == 0 && kernels_avx512vnni_supported()) return peak_vnni512(iters);
    if (strcmp(mix, "vnni256") == 0 && kernels_avx512vnni_supported()) return peak_vnni256(iters);
    if (strcmp(mix, "avx2") == 0 && kernels_avx2_supported()) return peak_avx2(iters);
    if (strcmp(mix, "avx2+fma") == 0 && kernels_avx2_supported()) return peak_avx2_fma(iters);
#endif
    (void)mix, (void)iters;
    return 0;
}
