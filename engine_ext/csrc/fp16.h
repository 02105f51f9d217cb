/* Portable IEEE half <-> float conversion (round to nearest even), bit-exact with F16C. */
#ifndef SLOTSERVE_FP16_H
#define SLOTSERVE_FP16_H

#include <stdint.h>
#include <string.h>

static inline float fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal half: normalise */
            int e = -1;
            do { mant <<= 1; e++; } while (!(mant & 0x400));
            mant &= 0x3ff;
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13); /* inf / nan */
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t fp32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) { /* inf or nan (keep a quiet nan) */
        return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 | ((absx >> 13) & 0x3ff) : 0));
    }
    if (absx >= 0x477ff000u) { /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00);
    }
    if (absx < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (absx < 0x33000000u) return (uint16_t)sign; /* < half of the smallest subnormal */
        uint32_t e = absx >> 23;
        uint32_t mant = (absx & 0x7fffff) | 0x800000;
        /* value = mant * 2^(e-150); the half subnormal unit is 2^-24, so q = mant >> (126-e) */
        uint32_t shift = 126 - e; /* 14 .. 24 */
        uint32_t q = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t q = ((absx - 0x38000000u) >> 13); /* rebias exponent 127 -> 15 */
    uint32_t rem = absx & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (q & 1))) q++;
    return (uint16_t)(sign | q);
}

#endif
