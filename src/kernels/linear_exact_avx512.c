/* ds41 exact linears, AVX-512 passes over the K-major double panel of linear_exact.c: one zmm
 * holds 8 of the 16 rows of a group, and up to 4 tokens run per pass (8 independent FMA
 * chains, enough to cover the FMA latency at 8 doubles per instruction). Every lane sees the
 * same sequence of operations as in the AVX2 passes (dense: fma in K order; quantized: exact
 * block dots, then acc + dot in block order), so the results are the same bits. Compiled for
 * AVX-512F (GCC target pragma, clang attribute) and called only when the fast kernels' ISA
 * is avx512 (CPUID, DS41_ISA=avx2 forces the AVX2 passes). */
#ifndef __clang__
#pragma GCC target("avx512f,avx2,fma,f16c")
#endif
#include "linear_fast.h"

#include <immintrin.h>

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma,f16c"))), apply_to = function)
#endif

#define G 16
#define UNROLL _Pragma("GCC unroll 8")

#define DPASS(C)                                                                                      \
    static void dpass_##C(const double *wt, int kc, const double *x, size_t ldx, double *acc) {      \
        __m512d c[C][2];                                                                          \
        UNROLL for (int t = 0; t < C; t++) {                                                      \
            c[t][0] = _mm512_load_pd(acc + t * G);                                                \
            c[t][1] = _mm512_load_pd(acc + t * G + 8);                                            \
        }                                                                                         \
        for (int k = 0; k < kc; k++) {                                                            \
            __m512d w0 = _mm512_load_pd(wt + (size_t)k * G), w1 = _mm512_load_pd(wt + (size_t)k * G + 8); \
            UNROLL for (int t = 0; t < C; t++) {                                                  \
                __m512d xb = _mm512_set1_pd(x[t * ldx + k]);                                      \
                c[t][0] = _mm512_fmadd_pd(w0, xb, c[t][0]);                                       \
                c[t][1] = _mm512_fmadd_pd(w1, xb, c[t][1]);                                       \
            }                                                                                     \
        }                                                                                         \
        UNROLL for (int t = 0; t < C; t++) {                                                      \
            _mm512_store_pd(acc + t * G, c[t][0]);                                                \
            _mm512_store_pd(acc + t * G + 8, c[t][1]);                                            \
        }                                                                                         \
    }
DPASS(1) DPASS(2) DPASS(3) DPASS(4)

#define QPASS(C)                                                                                      \
    static void qpass_##C(const double *wt, int kc, const double *x, size_t ldx, double *acc) {      \
        for (int b = 0; b < kc; b += 32) {                                                        \
            __m512d d[C][2];                                                                      \
            UNROLL for (int t = 0; t < C; t++) d[t][0] = d[t][1] = _mm512_setzero_pd();           \
            for (int k = b; k < b + 32; k++) {                                                    \
                __m512d w0 = _mm512_load_pd(wt + (size_t)k * G), w1 = _mm512_load_pd(wt + (size_t)k * G + 8); \
                UNROLL for (int t = 0; t < C; t++) {                                              \
                    __m512d xb = _mm512_set1_pd(x[t * ldx + k]);                                  \
                    d[t][0] = _mm512_fmadd_pd(w0, xb, d[t][0]);                                   \
                    d[t][1] = _mm512_fmadd_pd(w1, xb, d[t][1]);                                   \
                }                                                                                 \
            }                                                                                     \
            UNROLL for (int t = 0; t < C; t++) {                                                  \
                _mm512_store_pd(acc + t * G, _mm512_add_pd(_mm512_load_pd(acc + t * G), d[t][0])); \
                _mm512_store_pd(acc + t * G + 8, _mm512_add_pd(_mm512_load_pd(acc + t * G + 8), d[t][1])); \
            }                                                                                     \
        }                                                                                         \
    }
QPASS(1) QPASS(2) QPASS(3) QPASS(4)

typedef void (*pass_fn)(const double *, int, const double *, size_t, double *);
static const pass_fn dpass[4] = { dpass_1, dpass_2, dpass_3, dpass_4 };
static const pass_fn qpass[4] = { qpass_1, qpass_2, qpass_3, qpass_4 };

/* T tokens (rows of x at stride ldx, already offset to the panel) over one panel */
void ds41_exact_panel_avx512(int quant, const double *wt, int kc, const double *x, size_t ldx, int T, double *acc) {
    for (int t0 = 0; t0 < T; t0 += 4) {
        int C = T - t0 < 4 ? T - t0 : 4;
        pass_fn f = quant ? qpass[C - 1] : dpass[C - 1];
        f(wt, kc, x + (size_t)t0 * ldx, ldx, acc + (size_t)t0 * G);
    }
}

/* The certified lanes of linear_exact.c's T = 1 dense kernels on zmm: for 8 rows (p[q],
 * K [0, kv), kv % 16 == 0) the double lane sum of w x into s[q] and the FP32 lane sum of
 * |w| |x| into b[q]. wkind 0: BF16 weights, 1: E4M3 codes as e4m3 * 2^-8 (the FP16 trick). Any order is the contract's here (see cert_ok there), so zmm lanes may take it. */
static inline __attribute__((always_inline)) __m512 cert_w16(int wkind, const char *row, int k) {
    if (wkind == 0)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + 2 * (size_t)k))), 16));
    __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(row + k)));
    return _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16((short)0xBFFF)));
}

static inline __attribute__((always_inline)) void cert_k(int wkind, const char *const *p, int kv, const double *x,
                                                         const float *xa, double *s, float *b) {
    const size_t esz = wkind == 0 ? 2 : 1;
    __m512d sd[8];
    __m512 bd[8];
    UNROLL for (int q = 0; q < 8; q++) { sd[q] = _mm512_setzero_pd(); bd[q] = _mm512_setzero_ps(); }
    for (int k = 0; k < kv; k += 16) {
        if (!(k & (int)(63 / esz)))
            /* kv * esz is the row stride when in % 16 == 0 (every production shape); otherwise the
             * next group's prefetch lands a few bytes early, which only costs a miss */
            UNROLL for (int q = 0; q < 8; q++) ds41_pf_row(p[q], (size_t)kv * esz, (size_t)k * esz + 2048, 8);
        __m512d x0 = _mm512_loadu_pd(x + k), x1 = _mm512_loadu_pd(x + k + 8);
        __m512 a = _mm512_loadu_ps(xa + k);
        UNROLL for (int q = 0; q < 8; q++) {
            __m512 w = cert_w16(wkind, p[q], k);
            __m512d t = _mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(w)), x0);
            t = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(w), 1))), x1, t);
            sd[q] = _mm512_add_pd(sd[q], t);
            bd[q] = _mm512_fmadd_ps(_mm512_abs_ps(w), a, bd[q]);
        }
    }
    UNROLL for (int q = 0; q < 8; q++) {
        s[q] = _mm512_reduce_add_pd(sd[q]);
        b[q] = _mm512_reduce_add_ps(bd[q]);
    }
}

void ds41_exact_cert_avx512(int wkind, const char *const *p, int kv, const double *x, const float *xa, double *s, float *b) {
    if (wkind == 0) cert_k(0, p, kv, x, xa, s, b);
    else cert_k(1, p, kv, x, xa, s, b);
}

/* FP8 certified lanes (linear_exact.c, e1_cert_tile), AVX-512 VBMI: for 4 rows p[q] of E4M3
 * codes (K [0, kv), kv % 64 == 0), s[q] = the double lane sum of dbl(c_k) * xs[k], where
 * dbl(c) has the bits sign << 63 | (c & 0x7F) << 49, i.e. e4m3(c) * 2^-1016 (the bit pattern
 * of linear_exact.c's T = 1 FP8 path), and mx[q] = twice the largest code magnitude. Per 64
 * codes, t1 = c + c and t2 = c & 0x80; per 32 codes one vshufi64x2 packs their t1 and t2 into
 * one vector (t1 in bytes 0 .. 31, t2 in 32 .. 63), and one single-source vpermb per 8 codes puts
 * t1 at byte 6 and t2 at byte 7 of each qword (the others zeroed), which is dbl(c) in element
 * order. (The two-source vpermt2b per 8 codes did the same in one instruction, but at 0.6x the
 * speed on an Intel Xeon: a scratch loop on L1-resident rows, 6.4 against 10.5 GB/s of codes.) */
static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vbmi"))) void
cert_fp8_k(const uint8_t *const *p, int kv, const double *xs, double *s, int *mx) {
    __m512i idx[4];
    UNROLL for (int j = 0; j < 4; j++) {   /* qword i: byte 6 = 8 j + i (t1), byte 7 = 32 + 8 j + i (t2) */
#define IX(i) (long long)(((uint64_t)(32 + 8 * j + (i)) << 56) | ((uint64_t)(8 * j + (i)) << 48))
        idx[j] = _mm512_set_epi64(IX(7), IX(6), IX(5), IX(4), IX(3), IX(2), IX(1), IX(0));
#undef IX
    }
    const __mmask64 hi2 = 0xC0C0C0C0C0C0C0C0ULL;
    const __m512i sgn = _mm512_set1_epi8((char)0x80);
    __m512d acc[4][2];
    __m512i m[4];
    for (int q = 0; q < 4; q++) {
        acc[q][0] = acc[q][1] = _mm512_setzero_pd();
        m[q] = _mm512_setzero_si512();
    }
    for (int k = 0; k < kv; k += 64) {
        UNROLL for (int q = 0; q < 4; q++) ds41_pf_row(p[q], (size_t)kv, (size_t)k + 2048, 4);
        UNROLL for (int q = 0; q < 4; q++) {
            __m512i c = _mm512_loadu_si512(p[q] + k);
            __m512i t1 = _mm512_add_epi8(c, c), t2 = _mm512_and_si512(c, sgn);
            m[q] = _mm512_max_epu8(m[q], t1);
            __m512i z[2] = { _mm512_shuffle_i64x2(t1, t2, 0x44), _mm512_shuffle_i64x2(t1, t2, 0xEE) };
            UNROLL for (int j = 0; j < 8; j++) {
                __m512d w = _mm512_castsi512_pd(_mm512_maskz_permutexvar_epi8(hi2, idx[j & 3], z[j >> 2]));
                acc[q][j & 1] = _mm512_fmadd_pd(w, _mm512_loadu_pd(xs + k + 8 * j), acc[q][j & 1]);
            }
        }
    }
    for (int q = 0; q < 4; q++) {
        s[q] = _mm512_reduce_add_pd(_mm512_add_pd(acc[q][0], acc[q][1]));
        __m256i a = _mm256_max_epu8(_mm512_castsi512_si256(m[q]), _mm512_extracti64x4_epi64(m[q], 1));
        __m128i b = _mm_max_epu8(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
        b = _mm_max_epu8(b, _mm_srli_si128(b, 8));
        b = _mm_max_epu8(b, _mm_srli_si128(b, 4));
        b = _mm_max_epu8(b, _mm_srli_si128(b, 2));
        b = _mm_max_epu8(b, _mm_srli_si128(b, 1));
        mx[q] = _mm_cvtsi128_si32(b) & 0xFF;
    }
}

__attribute__((target("avx512f,avx512bw,avx512vbmi")))
void ds41_exact_cert_fp8_avx512(const uint8_t *const *p, int kv, const double *xs, double *s, int *mx) {
    cert_fp8_k(p, kv, xs, s, mx);
}

/* FP4 at T = 1 on zmm (linear_exact.c's e1_fp4_group, the same integers): 8 rows p[r] (nb
 * blocks, ldb = bytes per row), two blocks per step. Per row, the 32 bytes of
 * blocks b and b + 1 go through the nibble table in-lane (even elements: low nibbles, odd: high)
 * and are sign-extended to one zmm of int16 per parity, block b in the low half; against the
 * activations' hi and lo halves of both blocks (aq: per block [even hi | even lo | odd hi |
 * odd lo], 16 int16 each) vpmaddwd + vpdpwssd give exact int32 partial sums, and D = (H << 9)
 * + L holds, per lane, a part of 512 sum(w hi) + sum(w lo). A transposing add tree turns the
 * 8 rows' D into each row's block integers B (exact: every partial sum of a block stays below
 * 2^27, so any order gives B), then acc = fma(B, c, acc) per block in increasing b, lane r =
 * row r, with c = s_w * sab[b] computed by the caller (c8[8 b + r], the same double product):
 * the AVX2 kernel's operations lane by lane. A last odd block reads 16 bytes (the upper half
 * zero). acc8: the 8 rows' double accumulators. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
void ds41_exact_fp4_t1_avx512(const uint8_t *const *p, int nb, size_t ldb, const int16_t *aq, const double *c8,
                              double *acc8) {
    const __m256i tab = _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12));
    const __m256i m = _mm256_set1_epi8(0x0F);
    __m512d acc = _mm512_setzero_pd();
    for (int b = 0; b < nb; b += 2) {
        int two = b + 1 < nb;
        const int16_t *q0 = aq + (size_t)b * 64, *q1 = q0 + 64;
        __m512i a[4];   /* even hi, even lo, odd hi, odd lo: block b low, b + 1 high */
        UNROLL for (int h = 0; h < 4; h++) {
            __m256i lo = _mm256_load_si256((const __m256i *)(q0 + 16 * h));
            __m256i hi = two ? _mm256_load_si256((const __m256i *)(q1 + 16 * h)) : _mm256_setzero_si256();
            a[h] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        }
        size_t o = (size_t)b * 16;
        if (!(b & 3)) UNROLL for (int r = 0; r < 8; r++) ds41_pf_row(p[r], ldb, o + 1024, 8);
        __m512i d[8];
        UNROLL for (int r = 0; r < 8; r++) {
            __m256i v = two ? _mm256_loadu_si256((const __m256i *)(p[r] + o))
                            : _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(p[r] + o)));
            __m512i we = _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(tab, _mm256_and_si256(v, m)));
            __m512i wo = _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(v, 4), m)));
            __m512i h = _mm512_dpwssd_epi32(_mm512_madd_epi16(we, a[0]), wo, a[2]);
            __m512i l = _mm512_dpwssd_epi32(_mm512_madd_epi16(we, a[1]), wo, a[3]);
            d[r] = _mm512_add_epi32(_mm512_slli_epi32(h, 9), l);
        }
        __m512i t[4];
        UNROLL for (int i = 0; i < 4; i++)
            t[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(d[2 * i], d[2 * i + 1]), _mm512_unpackhi_epi32(d[2 * i], d[2 * i + 1]));
        __m512i u0 = _mm512_add_epi32(_mm512_unpacklo_epi64(t[0], t[1]), _mm512_unpackhi_epi64(t[0], t[1]));
        __m512i u1 = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2], t[3]), _mm512_unpackhi_epi64(t[2], t[3]));
        /* 128-bit lanes: u0 rows 0-3, u1 rows 4-7; lanes 0-1 block b, 2-3 block b + 1 */
        __m512i vv = _mm512_add_epi32(_mm512_shuffle_i32x4(u0, u1, _MM_SHUFFLE(2, 0, 2, 0)),
                                      _mm512_shuffle_i32x4(u0, u1, _MM_SHUFFLE(3, 1, 3, 1)));
        __m512i w = _mm512_shuffle_i32x4(vv, vv, _MM_SHUFFLE(3, 1, 2, 0));   /* [b: rows 0-7 | b + 1: rows 0-7] */
        acc = _mm512_fmadd_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(w)), _mm512_loadu_pd(c8 + (size_t)8 * b), acc);
        if (two) acc = _mm512_fmadd_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(w, 1)), _mm512_loadu_pd(c8 + (size_t)8 * b + 8), acc);
    }
    _mm512_storeu_pd(acc8, acc);
}

/* c8[8 b + r] = ue8[sr[r][b]] * sab[b] for 8 rows (the scale products of
 * ds41_exact_fp4_t1_avx512; ue8 = linear_exact.c's table, (double) ds41_ue8m0_to_f32): per 8
 * blocks, each row's 8 scale bytes e become the table's doubles by their bits, (e + 896) << 52
 * (2^(e - 127), 2^-127 for e = 0) and the quiet NaN 0x7FF8000000000000 for e = 255 (the FP32
 * 0x7FC00000 widened; a gather from the table took twice the time: perf, 18 % against 10 % of
 * bench_kernels --exact --resident --only fp4), an 8 x 8 transpose puts
 * the rows side by side, one multiply per block; the products are the scalar ones (tested
 * against the table for all 256 bytes). The tail blocks (nb % 8) read the table. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
void ds41_exact_fp4_scales_avx512(const uint8_t *const *sr, int nb, const double *sab, const double *ue8, double *c8) {
    const __m512i e896 = _mm512_set1_epi64(896), e255 = _mm512_set1_epi64(255);
    const __m512i qnan = _mm512_set1_epi64(0x7FF8000000000000LL);
    int b0 = 0;
    for (; b0 + 8 <= nb; b0 += 8) {
        __m512d g[8], t[8], u[8];
        UNROLL for (int i = 0; i < 8; i++) {
            __m512i e = _mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)(sr[i] + b0)));
            __m512i v = _mm512_slli_epi64(_mm512_add_epi64(e, e896), 52);
            g[i] = _mm512_castsi512_pd(_mm512_mask_mov_epi64(v, _mm512_cmpeq_epi64_mask(e, e255), qnan));
        }
        UNROLL for (int i = 0; i < 4; i++) {
            t[2 * i] = _mm512_unpacklo_pd(g[2 * i], g[2 * i + 1]);       /* blocks 0 2 4 6 of rows 2i, 2i+1 */
            t[2 * i + 1] = _mm512_unpackhi_pd(g[2 * i], g[2 * i + 1]);   /* blocks 1 3 5 7 */
        }
        UNROLL for (int h = 0; h < 2; h++) {   /* rows 4h .. 4h + 3 */
            u[4 * h + 0] = _mm512_shuffle_f64x2(t[4 * h], t[4 * h + 2], 0x88);       /* blocks 0, 4 */
            u[4 * h + 1] = _mm512_shuffle_f64x2(t[4 * h], t[4 * h + 2], 0xDD);       /* blocks 2, 6 */
            u[4 * h + 2] = _mm512_shuffle_f64x2(t[4 * h + 1], t[4 * h + 3], 0x88);   /* blocks 1, 5 */
            u[4 * h + 3] = _mm512_shuffle_f64x2(t[4 * h + 1], t[4 * h + 3], 0xDD);   /* blocks 3, 7 */
        }
        static const int first[4] = { 0, 2, 1, 3 };   /* u[q]'s blocks: first[q] and first[q] + 4 */
        UNROLL for (int q = 0; q < 4; q++) {
            int b = b0 + first[q];
            _mm512_storeu_pd(c8 + (size_t)8 * b, _mm512_mul_pd(_mm512_shuffle_f64x2(u[q], u[q + 4], 0x88), _mm512_set1_pd(sab[b])));
            _mm512_storeu_pd(c8 + (size_t)8 * (b + 4),
                             _mm512_mul_pd(_mm512_shuffle_f64x2(u[q], u[q + 4], 0xDD), _mm512_set1_pd(sab[b + 4])));
        }
    }
    for (; b0 < nb; b0++)
        for (int i = 0; i < 8; i++) c8[(size_t)8 * b0 + i] = ue8[sr[i][b0]] * sab[b0];
}

#ifdef __clang__
#pragma clang attribute pop
#endif
