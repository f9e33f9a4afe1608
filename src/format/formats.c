/* ds41 number formats (spec section 7). Everything here is integer bit
 * manipulation or a single IEEE FP32 operation (compiled with
 * -ffp-contract=off, so no fused multiply-add), which makes every result
 * bit-exact and platform independent. The independent check of these
 * functions is tools/format_vectors.py (NumPy, written from the spec without
 * looking at this file) and tests/test_formats.c.
 *
 * Non-finite inputs: the spec's quantizers only ever see finite BF16 values.
 * For NaN/inf inputs the functions below still follow the reference's formulas
 * literally (NaN-propagating max, the floor compare, the pow2ceil bit formula
 * modulo 2^32), so nothing is undefined behaviour, but the results are not
 * meaningful and tests only assert the element conversions on such inputs. */
#include "formats.h"

#include <math.h>

/* ---------------------------------------------------------------- BF16 */

uint16_t ds41_bf16_from_f32(float f) {
    uint32_t u = ds41_f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
        /* NaN: keep sign and the top payload bits, force the quiet bit so a
         * payload living only in the discarded half cannot turn into inf. */
        return (uint16_t)((u >> 16) | 0x0040u);
    }
    /* Round to nearest, ties to even: add just under half an output ulp,
     * plus one if the kept lsb is odd. Carries into the exponent are the
     * correct rounding (up to inf for values beyond the largest BF16). */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* ---------------------------------------------------------------- E4M3 */

uint8_t ds41_e4m3_from_f32(float f) {
    uint32_t u = ds41_f32_bits(f);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint8_t)(sign | 0x7Fu);   /* NaN */
    /* Saturating clamp first (spec 7.2): anything at or above 448,
     * infinity included, becomes 448 = S.1111.110. */
    if (a >= 0x43E00000u) return (uint8_t)(sign | 0x7Eu);
    int e = (int)(a >> 23) - 127;                           /* unbiased exponent */
    if (e >= -6) {
        /* E4M3 normal range: keep 3 of 23 mantissa bits, RNE; a carry out of
         * the mantissa correctly bumps the exponent. Then rebias 127 -> 7. */
        uint32_t r = (a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;
        return (uint8_t)(sign | (r - ((127u - 7u) << 3)));
    }
    /* Below 2^-6: subnormal multiples of 2^-9 (code = multiple; 8 means the
     * smallest normal 2^-6, which is also code 8). The significand with its
     * implicit bit is mant * 2^(e-23); in units of 2^-9 that is
     * mant >> (14 - e), rounded to nearest even. */
    uint32_t mant = (a & 0x7FFFFFu) | (e > -127 ? 0x800000u : 0u);
    int shift = 14 - e;
    if (shift > 25) return sign;        /* < 2^-11: below half of 2^-9 */
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint8_t)(sign | q);
}

float ds41_e4m3_to_f32(uint8_t c) {
    uint32_t sign = (uint32_t)(c & 0x80u) << 24;
    uint32_t exp = (c >> 3) & 15u, m = c & 7u;
    if (exp == 15u && m == 7u) return ds41_bits_f32(sign | 0x7FC00000u);
    if (exp == 0u) {
        /* m * 2^-9, exact in FP32 */
        float v = (float)m * 0.001953125f;
        return ds41_bits_f32(sign | ds41_f32_bits(v));
    }
    return ds41_bits_f32(sign | ((exp + 120u) << 23) | (m << 20));
}

/* ---------------------------------------------------------------- UE8M0 */

float ds41_ue8m0_to_f32(uint8_t e) {
    if (e == 255u) return ds41_bits_f32(0x7FC00000u);
    if (e == 0u) return ds41_bits_f32(0x00400000u);         /* 2^-127, FP32 subnormal */
    return ds41_bits_f32((uint32_t)e << 23);
}

/* ---------------------------------------------------------------- E2M1 */

static const float e2m1_values[16] = {
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

uint8_t ds41_e2m1_from_f32(float f) {
    uint32_t u = ds41_f32_bits(f);
    uint8_t sign = (uint8_t)((u >> 28) & 8u);
    float m = ds41_bits_f32(u & 0x7FFFFFFFu);
    /* Midpoints between consecutive magnitudes; at an exact midpoint the
     * even code wins, i.e. round up at 0.75, 1.75, 3.5 (upper code even) and
     * down at 0.25, 1.25, 2.5, 5.0. Magnitudes above 6 (the clamp) land on
     * code 7. A NaN fails every comparison and gives code 0 with its sign,
     * as the reference's comparison count does. */
    uint8_t c;
    if (m < 0.25f || m != m) c = 0;
    else if (m < 0.75f) c = (m == 0.25f) ? 0 : 1;
    else if (m < 1.25f) c = 2;                 /* 0.75 -> code 2 (1.0) */
    else if (m < 1.75f) c = (m == 1.25f) ? 2 : 3;
    else if (m < 2.5f) c = 4;                  /* 1.75 -> code 4 (2.0) */
    else if (m < 3.5f) c = (m == 2.5f) ? 4 : 5;
    else if (m < 5.0f) c = 6;                  /* 3.5 -> code 6 (4.0) */
    else c = (m == 5.0f) ? 6 : 7;
    return (uint8_t)(sign | c);
}

float ds41_e2m1_to_f32(uint8_t code) { return e2m1_values[code & 15u]; }

/* ---------------------------------------------------------------- pow2ceil */

float ds41_pow2ceil(float a, float inv) {
    uint32_t t = ds41_f32_bits(a * inv);
    uint32_t e = (t >> 23) & 0xFFu, m = t & 0x7FFFFFu;
    /* 2^(E - 127 + (M != 0)) has biased exponent E + (M != 0); built as bits
     * (mod 2^32 like the reference's int32 shift, for the never-occurring
     * non-finite t). */
    return ds41_bits_f32(((e + (m != 0u)) << 23) & 0xFFFFFFFFu);
}

/* ---------------------------------------------------------------- quantizers */

/* Exact max |x|, NaN-propagating like torch.amax. */
static float group_amax(const float *x, int n) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > amax || a != a) amax = a;
        if (amax != amax) break;
    }
    return amax;
}

/* max(a, floor) where a NaN stays NaN (torch clamp_min semantics). */
static float floor_at(float a, float floor) { return a < floor ? floor : a; }

float ds41_q8_group(const float *x, int n, uint8_t *codes, uint8_t *scale_byte) {
    float a = floor_at(group_amax(x, n), 1e-4f);
    float s = ds41_pow2ceil(a, ds41_bits_f32(DS41_INV448_BITS));
    for (int i = 0; i < n; i++) codes[i] = ds41_e4m3_from_f32(x[i] / s);  /* clamp inside */
    *scale_byte = (uint8_t)((ds41_f32_bits(s) >> 23) & 0xFFu);
    return s;
}

static float clamp6(float v) { return v > 6.0f ? 6.0f : (v < -6.0f ? -6.0f : v); }

float ds41_q4mx_group(const float *x, int n, uint8_t *codes, uint8_t *scale_byte) {
    /* floor 6 * 2^-126 = 1.5 * 2^-124 */
    float a = floor_at(group_amax(x, n), ds41_bits_f32(0x01C00000u));
    float s = ds41_pow2ceil(a, ds41_bits_f32(DS41_INV6_BITS));
    for (int i = 0; i < n; i++) codes[i] = ds41_e2m1_from_f32(clamp6(x[i] / s));
    *scale_byte = (uint8_t)((ds41_f32_bits(s) >> 23) & 0xFFu);
    return s;
}

float ds41_q4nv_group(const float *x, int n, uint8_t *codes, uint8_t *scale_e4m3) {
    /* floor 6 * 2^-9; then a true division by 6 (not a multiply by fp32(1/6)),
     * saturating E4M3 encode of the quotient. */
    float a = floor_at(group_amax(x, n), 0.01171875f);
    uint8_t sc = ds41_e4m3_from_f32(a / 6.0f);
    float s = ds41_e4m3_to_f32(sc);
    for (int i = 0; i < n; i++) codes[i] = ds41_e2m1_from_f32(clamp6(x[i] / s));
    *scale_e4m3 = sc;
    return s;
}

void ds41_q8_qdq(float *x, int len) {
    uint8_t codes[32], sb;
    for (int g = 0; g + 32 <= len; g += 32) {
        float s = ds41_q8_group(x + g, 32, codes, &sb);
        for (int i = 0; i < 32; i++) x[g + i] = ds41_bf16_round(ds41_e4m3_to_f32(codes[i]) * s);
    }
}

void ds41_q4mx_qdq(float *x, int len) {
    uint8_t codes[32], sb;
    for (int g = 0; g + 32 <= len; g += 32) {
        float s = ds41_q4mx_group(x + g, 32, codes, &sb);
        for (int i = 0; i < 32; i++) x[g + i] = ds41_bf16_round(ds41_e2m1_to_f32(codes[i]) * s);
    }
}

void ds41_q4nv_qdq(float *x, int len) {
    uint8_t codes[16], sc;
    for (int g = 0; g + 16 <= len; g += 16) {
        float s = ds41_q4nv_group(x + g, 16, codes, &sc);
        for (int i = 0; i < 16; i++) x[g + i] = ds41_bf16_round(ds41_e2m1_to_f32(codes[i]) * s);
    }
}

/* ---------------------------------------------------------------- packed records */

void ds41_pack_q4nv(const float *x, int d, uint8_t *codes_packed, uint8_t *scales) {
    uint8_t c[16];
    for (int g = 0; g + 16 <= d; g += 16) {
        ds41_q4nv_group(x + g, 16, c, &scales[g / 16]);
        for (int i = 0; i < 16; i += 2) codes_packed[(g + i) / 2] = ds41_e2m1_pack(c[i], c[i + 1]);
    }
}

void ds41_unpack_q4nv(const uint8_t *codes_packed, const uint8_t *scales, int d, float *out) {
    for (int g = 0; g + 16 <= d; g += 16) {
        float s = ds41_e4m3_to_f32(scales[g / 16]);
        for (int i = 0; i < 16; i += 2) {
            uint8_t b = codes_packed[(g + i) / 2];
            out[g + i] = ds41_bf16_round(ds41_e2m1_to_f32(b & 15u) * s);
            out[g + i + 1] = ds41_bf16_round(ds41_e2m1_to_f32(b >> 4) * s);
        }
    }
}

void ds41_pack_q4mx(const float *x, int d, uint8_t *codes_packed, uint8_t *scales) {
    uint8_t c[32];
    for (int g = 0; g + 32 <= d; g += 32) {
        ds41_q4mx_group(x + g, 32, c, &scales[g / 32]);
        for (int i = 0; i < 32; i += 2) codes_packed[(g + i) / 2] = ds41_e2m1_pack(c[i], c[i + 1]);
    }
}

void ds41_unpack_q4mx(const uint8_t *codes_packed, const uint8_t *scales, int d, float *out) {
    for (int g = 0; g + 32 <= d; g += 32) {
        float s = ds41_ue8m0_to_f32(scales[g / 32]);
        for (int i = 0; i < 32; i += 2) {
            uint8_t b = codes_packed[(g + i) / 2];
            out[g + i] = ds41_bf16_round(ds41_e2m1_to_f32(b & 15u) * s);
            out[g + i + 1] = ds41_bf16_round(ds41_e2m1_to_f32(b >> 4) * s);
        }
    }
}

void ds41_pack_q8(const float *x, int d, uint8_t *codes, uint8_t *scales) {
    for (int g = 0; g + 32 <= d; g += 32) ds41_q8_group(x + g, 32, codes + g, &scales[g / 32]);
}

void ds41_unpack_q8(const uint8_t *codes, const uint8_t *scales, int d, float *out) {
    for (int g = 0; g + 32 <= d; g += 32) {
        float s = ds41_ue8m0_to_f32(scales[g / 32]);
        for (int i = 0; i < 32; i++) out[g + i] = ds41_bf16_round(ds41_e4m3_to_f32(codes[g + i]) * s);
    }
}
