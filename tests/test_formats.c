/* Number formats (spec section 7) against the independent NumPy vectors in
 * tests/data/formats/ (written by tools/format_vectors.py; layouts are
 * documented there), plus exhaustive sweeps checked against a second, slow
 * formulation written here (nearest representable value found in double
 * precision, which is exact for every FP32 input). Every check is exact
 * (bit-for-bit): the formats are defined bit-exactly. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "formats.h"

/* ------------------------------------------------------------ vector files */

typedef struct {
    uint8_t *data;
    uint32_t count, rec;
} vecfile;

static vecfile load(const char *name, uint32_t rec_bytes) {
    vecfile v = {0};
    const char *root = getenv("DS41_ROOT");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/formats/%s", root ? root : ".", name);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "cannot open %s", path);
    if (!f) return v;
    uint8_t hdr[16];
    if (fread(hdr, 1, 16, f) != 16 || memcmp(hdr, "DS41FV01", 8) != 0) {
        CHECK(0, "%s: bad header", path);
        fclose(f);
        return v;
    }
    memcpy(&v.count, hdr + 8, 4);
    memcpy(&v.rec, hdr + 12, 4);
    CHECK(v.rec == rec_bytes, "%s: record size %u, expected %u", path, v.rec, rec_bytes);
    CHECK(v.count > 0 && v.count < 10000000u, "%s: record count %u", path, v.count);
    if (v.rec != rec_bytes || v.count == 0 || v.count >= 10000000u) {
        fclose(f);
        v.count = 0;
        return v;
    }
    size_t n = (size_t)v.count * v.rec;
    v.data = malloc(n);
    if (!v.data || fread(v.data, 1, n, f) != n) {
        CHECK(0, "%s: short file", path);
        free(v.data);
        v.data = NULL;
        v.count = 0;
    }
    fclose(f);
    return v;
}

static uint32_t rd32(const uint8_t *p) { uint32_t x; memcpy(&x, p, 4); return x; }
static uint16_t rd16(const uint8_t *p) { uint16_t x; memcpy(&x, p, 2); return x; }
static int is_nan_bits(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }

/* ------------------------------------------------------------ second formulation */

/* BF16 by explicit nearest-of-two in double; ties to the even pattern. */
static uint16_t slow_bf16(uint32_t u) {
    if (is_nan_bits(u)) return (uint16_t)((u >> 16) | 0x40u);
    uint32_t sign = u & 0x80000000u, mag = u & 0x7FFFFFFFu;
    if (mag == 0x7F800000u) return (uint16_t)((sign | mag) >> 16);
    uint32_t lo = mag & 0xFFFF0000u, hi = lo + 0x10000u;
    double v = ds41_bits_f32(mag), vlo = ds41_bits_f32(lo);
    double vhi = hi == 0x7F800000u ? ldexp(1.0, 128) : (double)ds41_bits_f32(hi);
    uint32_t pick = (v - vlo < vhi - v) ? lo : (v - vlo > vhi - v) ? hi : (((lo >> 16) & 1u) ? hi : lo);
    return (uint16_t)((sign | pick) >> 16);
}

static double e4m3_value(int c) {   /* magnitude of codes 0..126 from the definition */
    int e = (c >> 3) & 15, m = c & 7;
    return e == 0 ? m / 8.0 * ldexp(1.0, -6) : (1.0 + m / 8.0) * ldexp(1.0, e - 7);
}

/* E4M3 by linear scan over the 127 magnitudes; ties to the even code. */
static uint8_t slow_e4m3(float f) {
    uint32_t u = ds41_f32_bits(f);
    uint8_t sign = (u >> 31) ? 0x80 : 0;
    if (is_nan_bits(u)) return sign | 0x7F;
    double m = fabs((double)f);
    if (m > 448.0) m = 448.0;
    int best = 0;
    for (int c = 1; c <= 126; c++) {
        double d = fabs(e4m3_value(c) - m), db = fabs(e4m3_value(best) - m);
        if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    return sign | (uint8_t)best;
}

/* ------------------------------------------------------------ element formats */

static void e4m3_decode_all_codes(void) {
    vecfile v = load("e4m3_decode.bin", 4);
    for (uint32_t c = 0; c < v.count && c < 256; c++) {
        uint32_t want = rd32(v.data + 4 * c), got = ds41_f32_bits(ds41_e4m3_to_f32((uint8_t)c));
        if (is_nan_bits(want))
            CHECK(is_nan_bits(got) && (got >> 31) == (want >> 31), "code %02x: got %08x want NaN", c, got);
        else
            CHECK(got == want, "code %02x: got %08x want %08x", c, got, want);
    }
    CHECK(v.count == 256, "count %u", v.count);
    free(v.data);
}

static void e2m1_decode_all_codes(void) {
    vecfile v = load("e2m1_decode.bin", 4);
    for (uint32_t c = 0; c < v.count && c < 16; c++) {
        uint32_t want = rd32(v.data + 4 * c), got = ds41_f32_bits(ds41_e2m1_to_f32((uint8_t)c));
        CHECK(got == want, "code %x: got %08x want %08x", c, got, want);
        /* only the low 4 bits matter */
        CHECK(ds41_f32_bits(ds41_e2m1_to_f32((uint8_t)(c | 0xA0))) == want, "code %x with high bits", c);
    }
    CHECK(v.count == 16, "count %u", v.count);
    free(v.data);
}

static void ue8m0_decode_all_codes(void) {
    vecfile v = load("ue8m0_decode.bin", 4);
    for (uint32_t e = 0; e < v.count && e < 256; e++) {
        uint32_t want = rd32(v.data + 4 * e), got = ds41_f32_bits(ds41_ue8m0_to_f32((uint8_t)e));
        if (is_nan_bits(want)) CHECK(is_nan_bits(got), "e %u: got %08x want NaN", e, got);
        else CHECK(got == want, "e %u: got %08x want %08x", e, got, want);
    }
    CHECK(v.count == 256, "count %u", v.count);
    free(v.data);
}

static void e4m3_encode_vectors(void) {
    /* every midpoint between adjacent E4M3 values and its FP32 neighbours, every
     * value and its neighbours, saturation, NaN, signed zero, FP32 subnormals, random */
    vecfile v = load("e4m3_encode.bin", 8);
    for (uint32_t i = 0; i < v.count; i++) {
        uint32_t in = rd32(v.data + 8 * i);
        uint8_t want = v.data[8 * i + 4], got = ds41_e4m3_from_f32(ds41_bits_f32(in));
        CHECK(got == want, "in %08x (%g): got %02x want %02x", in, ds41_bits_f32(in), got, want);
    }
    CHECK(v.count > 2000, "only %u vectors", v.count);
    free(v.data);
}

static void e4m3_spec_examples(void) {
    CHECK(ds41_e4m3_from_f32(448.0f) == 0x7E, "448");
    CHECK(ds41_e4m3_from_f32(1e9f) == 0x7E, "saturate");
    CHECK(ds41_e4m3_from_f32(-INFINITY) == 0xFE, "-inf saturates");
    CHECK(ds41_e4m3_from_f32(-0.0f) == 0x80, "-0");
    CHECK(ds41_e4m3_from_f32(0x1p-9f) == 0x01, "smallest subnormal");
    CHECK(ds41_e4m3_from_f32(0x1p-10f) == 0x00, "half of smallest subnormal ties to 0");
    CHECK(ds41_e4m3_from_f32(0x1.8p-9f) == 0x02, "1.5 * 2^-9 ties to even 2");
    CHECK(ds41_e4m3_from_f32(0x1.ep-7f) == 0x08, "7.5 * 2^-9 ties up to 2^-6 (even code 8)");
    CHECK(ds41_e4m3_from_f32(-NAN) == 0xFF && ds41_e4m3_from_f32(NAN) == 0x7F, "NaN");
    CHECK(ds41_e4m3_from_f32(400.0f) == 0x7C, "400 = tie 384|416 -> even 0x7C");
    CHECK(ds41_e4m3_from_f32(432.0f) == 0x7E, "432 = tie 416|448 -> even 0x7E");
    CHECK(ds41_e4m3_from_f32(0x1.dp8f) == 0x7E, "464 (beyond the top) clamps to 448");
}

static void e4m3_dense_sweep(void) {
    /* every 1021st FP32 pattern of the range that reaches E4M3 (|x| < 2^10), against
     * the linear-scan encoder; and encode(decode(c)) == c for every non-NaN code */
    int bad = 0;
    for (uint32_t u = 0; u < 0x44800000u && bad < 5; u += 1021u) {
        for (int s = 0; s < 2; s++) {
            float f = ds41_bits_f32(u | (s ? 0x80000000u : 0u));
            uint8_t a = ds41_e4m3_from_f32(f), b = slow_e4m3(f);
            if (a != b) { bad++; CHECK(0, "%08x: got %02x want %02x", ds41_f32_bits(f), a, b); }
        }
    }
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7F) == 0x7F) continue;
        CHECK(ds41_e4m3_from_f32(ds41_e4m3_to_f32((uint8_t)c)) == c, "round trip %02x", c);
    }
}

static void e2m1_encode_vectors(void) {
    vecfile v = load("e2m1_encode.bin", 8);
    for (uint32_t i = 0; i < v.count; i++) {
        uint32_t in = rd32(v.data + 8 * i);
        uint8_t want = v.data[8 * i + 4], got = ds41_e2m1_from_f32(ds41_bits_f32(in));
        CHECK(got == want, "in %08x (%g): got %x want %x", in, ds41_bits_f32(in), got, want);
    }
    CHECK(v.count > 1000, "only %u vectors", v.count);
    free(v.data);
}

static void e2m1_spec_examples(void) {
    /* the examples of spec 7.3, verbatim */
    static const float in[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    static const float want[] = {0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f};
    for (int i = 0; i < 7; i++) {
        CHECK(ds41_e2m1_to_f32(ds41_e2m1_from_f32(in[i])) == want[i], "%g", in[i]);
        CHECK(ds41_e2m1_to_f32(ds41_e2m1_from_f32(-in[i])) == -want[i], "-%g", in[i]);
    }
    CHECK(ds41_e2m1_from_f32(-0.0f) == 8, "-0 gets code 8");
    CHECK(ds41_e2m1_from_f32(0.0f) == 0, "+0");
    CHECK(ds41_e2m1_from_f32(100.0f) == 7 && ds41_e2m1_from_f32(-INFINITY) == 15, "clamp to 6");
    CHECK(ds41_e2m1_pack(3, 12) == 0xC3 && ds41_e2m1_pack(0x1F, 0x2E) == 0xEF, "pack");
    for (int c = 0; c < 16; c++) CHECK(ds41_e2m1_from_f32(ds41_e2m1_to_f32((uint8_t)c)) == c, "rt %d", c);
}

static void bf16_every_tie(void) {
    /* for every finite BF16 pattern p: the tie p<<16|0x8000 and one FP32 ulp either side */
    vecfile v = load("bf16_ties.bin", 8);
    for (uint32_t i = 0; i < v.count; i++) {
        const uint8_t *r = v.data + 8 * i;
        uint32_t base = (uint32_t)rd16(r) << 16;
        static const uint32_t low[3] = {0x7FFFu, 0x8000u, 0x8001u};
        for (int k = 0; k < 3; k++) {
            uint16_t want = rd16(r + 2 + 2 * k), got = ds41_bf16_from_f32(ds41_bits_f32(base | low[k]));
            CHECK(got == want, "in %08x: got %04x want %04x", base | low[k], got, want);
        }
    }
    CHECK(v.count == 65280, "count %u", v.count);
    free(v.data);
}

static void bf16_misc_vectors(void) {
    vecfile v = load("bf16_misc.bin", 8);
    for (uint32_t i = 0; i < v.count; i++) {
        uint32_t in = rd32(v.data + 8 * i);
        uint16_t want = rd16(v.data + 8 * i + 4), got = ds41_bf16_from_f32(ds41_bits_f32(in));
        CHECK(got == want, "in %08x: got %04x want %04x", in, got, want);
    }
    CHECK(v.count > 4000, "count %u", v.count);
    free(v.data);
}

static void bf16_dense_sweep(void) {
    /* every 97th FP32 bit pattern (44 M values, both signs, NaNs and infinities
     * included) against the nearest-of-two formulation; every BF16 round-trips */
    int bad = 0;
    uint32_t u = 0;
    do {
        uint16_t a = ds41_bf16_from_f32(ds41_bits_f32(u)), b = slow_bf16(u);
        if (a != b && bad++ < 5) CHECK(0, "%08x: got %04x want %04x", u, a, b);
        if (is_nan_bits(u)) CHECK(is_nan_bits((uint32_t)a << 16), "NaN %08x stays NaN", u);
        u += 97u;
    } while (u >= 97u);
    for (uint32_t p = 0; p < 0x10000u; p++) {
        if (is_nan_bits(p << 16)) continue;
        CHECK(ds41_bf16_from_f32(ds41_bf16_to_f32((uint16_t)p)) == p, "round trip %04x", p);
    }
    CHECK(ds41_bf16_round(1.00390625f) == 1.0f, "tie 1 + 2^-8 -> 1 (even)");
    CHECK(ds41_bf16_round(1.01171875f) == 1.015625f, "tie 1 + 3*2^-8 -> 1 + 2^-6 (even)");
    CHECK(ds41_f32_bits(ds41_bf16_round(-0.0f)) == 0x80000000u, "-0 stays -0");
}

static void pow2ceil_vectors(void) {
    vecfile v = load("pow2ceil.bin", 12);
    for (uint32_t i = 0; i < v.count; i++) {
        const uint8_t *r = v.data + 12 * i;
        uint32_t got = ds41_f32_bits(ds41_pow2ceil(ds41_bits_f32(rd32(r)), ds41_bits_f32(rd32(r + 4))));
        CHECK(got == rd32(r + 8), "a %08x inv %08x: got %08x want %08x", rd32(r), rd32(r + 4), got, rd32(r + 8));
    }
    CHECK(v.count > 500, "count %u", v.count);
    free(v.data);
    /* exact powers of two and the next FP32 value */
    CHECK(ds41_pow2ceil(0.25f, 1.0f) == 0.25f, "exact power");
    CHECK(ds41_pow2ceil(nextafterf(0.25f, 1.0f), 1.0f) == 0.5f, "just above");
    CHECK(ds41_pow2ceil(nextafterf(0.25f, 0.0f), 1.0f) == 0.25f, "just below");
}

/* ------------------------------------------------------------ quantizers */

static float bf16v(uint16_t h) { return ds41_bf16_to_f32(h); }

static void q8_group_vectors(void) {
    vecfile v = load("q8_groups.bin", 100);
    for (uint32_t i = 0; i < v.count; i++) {
        const uint8_t *r = v.data + 100 * i;
        float x[32], dq[32];
        uint8_t codes[32], sb = 0, packed[32], pscale = 0;
        for (int k = 0; k < 32; k++) x[k] = bf16v(rd16(r + 2 * k));
        float s = ds41_q8_group(x, 32, codes, &sb);
        CHECK(memcmp(codes, r + 64, 32) == 0 && sb == r[96], "group %u: codes/scale differ (scale %u want %u)", i, sb, r[96]);
        CHECK(ds41_f32_bits(s) == (uint32_t)r[96] << 23, "group %u: returned scale %g", i, s);
        /* QDQ and the packed record give the dequantized codes, rounded to BF16 */
        memcpy(dq, x, sizeof dq);
        ds41_q8_qdq(dq, 32);
        ds41_pack_q8(x, 32, packed, &pscale);
        CHECK(memcmp(packed, r + 64, 32) == 0 && pscale == r[96], "group %u: pack_q8", i);
        float un[32];
        ds41_unpack_q8(packed, &pscale, 32, un);
        for (int k = 0; k < 32; k++) {
            float want = ds41_bf16_round(ds41_e4m3_to_f32(r[64 + k]) * ds41_ue8m0_to_f32(r[96]));
            CHECK(ds41_f32_bits(dq[k]) == ds41_f32_bits(want), "group %u elem %d: qdq %g want %g", i, k, dq[k], want);
            CHECK(ds41_f32_bits(un[k]) == ds41_f32_bits(want), "group %u elem %d: unpack", i, k);
        }
    }
    CHECK(v.count >= 1000, "count %u", v.count);
    free(v.data);
}

static void q4mx_group_vectors(void) {
    vecfile v = load("q4mx_groups.bin", 84);
    for (uint32_t i = 0; i < v.count; i++) {
        const uint8_t *r = v.data + 84 * i;
        float x[32], dq[32], un[32];
        uint8_t codes[32], sb = 0, packed[16], ps = 0;
        for (int k = 0; k < 32; k++) x[k] = bf16v(rd16(r + 2 * k));
        float s = ds41_q4mx_group(x, 32, codes, &sb);
        int ok = sb == r[80];
        for (int k = 0; k < 32; k += 2) ok &= ds41_e2m1_pack(codes[k], codes[k + 1]) == r[64 + k / 2];
        CHECK(ok, "group %u: codes/scale differ (scale %u want %u)", i, sb, r[80]);
        CHECK(ds41_f32_bits(s) == (uint32_t)r[80] << 23, "group %u: returned scale", i);
        ds41_pack_q4mx(x, 32, packed, &ps);
        CHECK(memcmp(packed, r + 64, 16) == 0 && ps == r[80], "group %u: pack_q4mx", i);
        ds41_unpack_q4mx(packed, &ps, 32, un);
        memcpy(dq, x, sizeof dq);
        ds41_q4mx_qdq(dq, 32);
        for (int k = 0; k < 32; k++) {
            uint8_t c = (r[64 + k / 2] >> (4 * (k & 1))) & 15;
            float want = ds41_bf16_round(ds41_e2m1_to_f32(c) * ds41_ue8m0_to_f32(r[80]));
            CHECK(ds41_f32_bits(dq[k]) == ds41_f32_bits(want) && ds41_f32_bits(un[k]) == ds41_f32_bits(want),
                  "group %u elem %d: qdq %g unpack %g want %g", i, k, dq[k], un[k], want);
        }
    }
    CHECK(v.count >= 1000, "count %u", v.count);
    free(v.data);
}

static void q4nv_group_vectors(void) {
    vecfile v = load("q4nv_groups.bin", 44);
    for (uint32_t i = 0; i < v.count; i++) {
        const uint8_t *r = v.data + 44 * i;
        float x[16], dq[16], un[16];
        uint8_t codes[16], sc = 0, packed[8], ps = 0;
        for (int k = 0; k < 16; k++) x[k] = bf16v(rd16(r + 2 * k));
        float s = ds41_q4nv_group(x, 16, codes, &sc);
        int ok = sc == r[40];
        for (int k = 0; k < 16; k += 2) ok &= ds41_e2m1_pack(codes[k], codes[k + 1]) == r[32 + k / 2];
        CHECK(ok, "group %u: codes/scale differ (scale %02x want %02x)", i, sc, r[40]);
        CHECK(ds41_f32_bits(s) == ds41_f32_bits(ds41_e4m3_to_f32(r[40])), "group %u: returned scale", i);
        ds41_pack_q4nv(x, 16, packed, &ps);
        CHECK(memcmp(packed, r + 32, 8) == 0 && ps == r[40], "group %u: pack_q4nv", i);
        ds41_unpack_q4nv(packed, &ps, 16, un);
        memcpy(dq, x, sizeof dq);
        ds41_q4nv_qdq(dq, 16);
        for (int k = 0; k < 16; k++) {
            uint8_t c = (r[32 + k / 2] >> (4 * (k & 1))) & 15;
            float exact = ds41_e2m1_to_f32(c) * ds41_e4m3_to_f32(r[40]);
            float want = ds41_bf16_round(exact);
            CHECK(want == exact, "group %u elem %d: dequant not exact in BF16 (spec 7.4 says it is)", i, k);
            CHECK(ds41_f32_bits(dq[k]) == ds41_f32_bits(want) && ds41_f32_bits(un[k]) == ds41_f32_bits(want),
                  "group %u elem %d: qdq %g unpack %g want %g", i, k, dq[k], un[k], want);
        }
    }
    CHECK(v.count >= 1000, "count %u", v.count);
    free(v.data);
}

static void q4nv_division_not_multiply(void) {
    /* FP32 amax values where e4m3(a / 6) and e4m3(fp32(a * fp32(1/6))) differ: the
     * quantizer must give the division's scale. (For BF16 amax values the two never
     * differ; tools/format_vectors.py checks that exhaustively.) */
    vecfile v = load("q4nv_divmul.bin", 8);
    for (uint32_t i = 0; i < v.count; i++) {
        const uint8_t *r = v.data + 8 * i;
        float x[16] = {0};
        x[3] = ds41_bits_f32(rd32(r));
        x[9] = -x[3] * 0.5f;
        uint8_t codes[16], sc;
        ds41_q4nv_group(x, 16, codes, &sc);
        CHECK(r[4] != r[5], "vector %u: division and multiply agree", i);
        CHECK(sc == r[4], "a %08x: scale %02x, division gives %02x (multiply %02x)", rd32(r), sc, r[4], r[5]);
    }
    CHECK(v.count >= 5, "count %u", v.count);
    free(v.data);
}

static void zero_groups(void) {
    /* all-zero groups (both signs of zero): scales come from the floors */
    float z[32];
    for (int i = 0; i < 32; i++) z[i] = (i % 3) ? 0.0f : -0.0f;
    uint8_t c[32], sb;
    /* Q8: floor fp32(1e-4); t = fp32(1e-4 * fp32(1/448)) = 2.23e-7, 2^-23 < t < 2^-22 -> s = 2^-22 */
    float s = ds41_q8_group(z, 32, c, &sb);
    CHECK(s == 0x1p-22f && sb == 127 - 22, "q8 zero scale %g byte %u", s, sb);
    for (int i = 0; i < 32; i++) CHECK(c[i] == ((i % 3) ? 0x00 : 0x80), "q8 zero code %d = %02x", i, c[i]);
    /* Q4mx: floor 6 * 2^-126; t = fp32(6*2^-126 * fp32(1/6)) rounds to exactly 2^-126 -> s = 2^-126 */
    s = ds41_q4mx_group(z, 32, c, &sb);
    CHECK(s == 0x1p-126f && sb == 1, "q4mx zero scale %g byte %u", s, sb);
    for (int i = 0; i < 32; i++) CHECK(c[i] == ((i % 3) ? 0 : 8), "q4mx zero code %d = %x", i, c[i]);
    /* Q4nv: floor 6 * 2^-9 -> a / 6 = 2^-9 exactly = E4M3 code 0x01 */
    s = ds41_q4nv_group(z, 16, c, &sb);
    CHECK(s == 0x1p-9f && sb == 0x01, "q4nv zero scale %g code %02x", s, sb);
    for (int i = 0; i < 16; i++) CHECK(c[i] == ((i % 3) ? 0 : 8), "q4nv zero code %d = %x", i, c[i]);
    /* tiny non-zero values under the floor quantize against the floor's scale */
    z[7] = 0x1p-30f;
    ds41_q8_group(z, 32, c, &sb);
    CHECK(sb == 105 && c[7] == ds41_e4m3_from_f32(0x1p-8f), "q8 tiny: %u %02x", sb, c[7]);
}

static void saturation_in_quantizers(void) {
    /* Q4nv: amax above 448 * 6 saturates the scale at 448 and the codes at 6 */
    float x[16] = {0};
    x[0] = 1e30f; x[1] = -3000.0f; x[2] = 448.0f * 3.0f;
    uint8_t c[32], sc;
    float s = ds41_q4nv_group(x, 16, c, &sc);
    CHECK(sc == 0x7E && s == 448.0f, "scale %02x", sc);
    CHECK(c[0] == 7 && c[1] == 15 && c[2] == 5, "codes %x %x %x", c[0], c[1], c[2]);
    /* Q8 and Q4mx can never exceed the clamp for finite input beyond rounding of t: the
     * vectors cover that; here the largest BF16 value */
    float y[32] = {0};
    y[0] = ds41_bf16_to_f32(0x7F7F);
    s = ds41_q8_group(y, 32, c, &sc);
    CHECK(c[0] == ds41_e4m3_from_f32(y[0] / s) && s == 0x1p120f, "q8 max bf16: s %g code %02x", s, c[0]);
}

static void nonfinite_inputs_follow_formulas(void) {
    /* Not produced by the model; what the reference formulas give, so the C never
     * does anything undefined: an infinite amax makes the Q8 scale +inf (E = 255, M = 0). */
    float x[32] = {0};
    x[1] = INFINITY; x[2] = 1.0f;
    uint8_t c[32], sb;
    float s = ds41_q8_group(x, 32, c, &sb);
    /* inf / inf is the platform's default NaN, whose sign varies: check the NaN code only */
    CHECK(isinf(s) && sb == 255 && (c[1] & 0x7F) == 0x7F && c[2] == 0x00, "q8 inf: %g %u %02x %02x", s, sb, c[1], c[2]);
    s = ds41_q4nv_group(x, 16, c, &sb);
    CHECK(s == 448.0f && c[1] == 7 && c[2] == ds41_e2m1_from_f32(1.0f / 448.0f), "q4nv inf");
}

static void record_sizes(void) {
    /* spec 6.1: main KV 512 dims -> 256 + 32 B; index K 128 -> 64 + 4 B; SWA 512 -> 512 + 16 B.
     * The pack functions must write exactly those bytes and nothing past them. */
    float x[512];
    for (int i = 0; i < 512; i++) x[i] = ds41_bf16_round(sinf((float)i) * (float)(i % 37));
    uint8_t buf[1024];
    memset(buf, 0xA5, sizeof buf);
    ds41_pack_q4nv(x, 512, buf, buf + 256);
    int untouched = 1;
    for (int i = 288; i < 1024; i++) untouched &= buf[i] == 0xA5;
    CHECK(untouched, "pack_q4nv wrote past 288 bytes");
    float out[512];
    ds41_unpack_q4nv(buf, buf + 256, 512, out);
    float ref[512];
    memcpy(ref, x, sizeof ref);
    ds41_q4nv_qdq(ref, 512);
    CHECK(memcmp(out, ref, sizeof out) == 0, "q4nv unpack != qdq over 512 dims");

    memset(buf, 0xA5, sizeof buf);
    ds41_pack_q4mx(x, 128, buf, buf + 64);
    untouched = 1;
    for (int i = 68; i < 1024; i++) untouched &= buf[i] == 0xA5;
    CHECK(untouched, "pack_q4mx wrote past 68 bytes");
    ds41_unpack_q4mx(buf, buf + 64, 128, out);
    memcpy(ref, x, sizeof ref);
    ds41_q4mx_qdq(ref, 128);
    CHECK(memcmp(out, ref, 128 * sizeof(float)) == 0, "q4mx unpack != qdq over 128 dims");

    memset(buf, 0xA5, sizeof buf);
    ds41_pack_q8(x, 512, buf, buf + 512);
    untouched = 1;
    for (int i = 528; i < 1024; i++) untouched &= buf[i] == 0xA5;
    CHECK(untouched, "pack_q8 wrote past 528 bytes");
    ds41_unpack_q8(buf, buf + 512, 512, out);
    memcpy(ref, x, sizeof ref);
    ds41_q8_qdq(ref, 512);
    CHECK(memcmp(out, ref, sizeof out) == 0, "q8 unpack != qdq over 512 dims");
}

int main(void) {
    RUN_CASE(e4m3_decode_all_codes);
    RUN_CASE(e2m1_decode_all_codes);
    RUN_CASE(ue8m0_decode_all_codes);
    RUN_CASE(e4m3_encode_vectors);
    RUN_CASE(e4m3_spec_examples);
    RUN_CASE(e4m3_dense_sweep);
    RUN_CASE(e2m1_encode_vectors);
    RUN_CASE(e2m1_spec_examples);
    RUN_CASE(bf16_every_tie);
    RUN_CASE(bf16_misc_vectors);
    RUN_CASE(bf16_dense_sweep);
    RUN_CASE(pow2ceil_vectors);
    RUN_CASE(q8_group_vectors);
    RUN_CASE(q4mx_group_vectors);
    RUN_CASE(q4nv_group_vectors);
    RUN_CASE(q4nv_division_not_multiply);
    RUN_CASE(zero_groups);
    RUN_CASE(saturation_in_quantizers);
    RUN_CASE(nonfinite_inputs_follow_formulas);
    RUN_CASE(record_sizes);
    return check_exit();
}
