/* ds41 fast linears, AVX-512 BF16 (vdpbf16ps) implementation of the FP4 prefill panels: the
 * canonical order of linear_fast.c, bit for bit, with fewer instructions per product.
 *
 * The int16 road (linear_avx512.c, mk_q) forms, per 64-element group of one weight row and one
 * token, the exact integer lane sums I (four products q * 2 e2m1 per lane) with vpmaddwd +
 * vpdpwssd, then x = fp32(I) * s_w (cvtdq2ps, vmulps) and acc = fma(x, u / 2, acc): five
 * instructions per 64 MACs. Here the same lane sums come from two vdpbf16ps into a register
 * that starts at +0, with the row-block scale folded into the weights at panel decode
 * (bf16(2 e2m1 * s_w)), so that the dot yields x itself and only the FMA remains: three
 * instructions per 64 MACs. Why the bits are the same:
 *   - every operand is exact in BF16: 2 e2m1 is an integer of at most 4 bits (0 .. 12), s_w a
 *     power of two; the activation words q (fp4_act_row) are integers |q| < 2^15 with at most 4
 *     significant bits (elements within 2^-11 of the block's largest are E4M3 values, 4
 *     significant bits, scaled by a power of two; the smaller ones are rounded to integers
 *     below 16), so bf16(q) = q (linear_fast.c checks it per row and falls back otherwise);
 *   - every product and every partial sum is an integer multiple of s_w below 2^21 s_w in
 *     magnitude (four products of |q| < 2^15 and |2 e2m1| <= 12), so each rounding vdpbf16ps
 *     performs (per its definition, the odd pair's product added first, then the even one's)
 *     is exact whatever its order, and the register ends at I * s_w exactly, which is also
 *     fp32(I) * s_w of the int16 road (no rounding there either);
 *   - vdpbf16ps flushes BF16 subnormal inputs and FP32 subnormal outputs to zero (DAZ / FTZ
 *     regardless of MXCSR). The fold keeps every operand and result normal or zero when the
 *     scale byte e (s_w = 2^(e - 127)) is in [1, 233]: s_w >= 2^-126 makes the smallest
 *     nonzero product normal, and 2^21 * 2^(233 - 127) = 2^127 keeps the largest sum finite.
 *     pan_fp4b refuses a panel row with a scale byte outside (0: subnormal s_w; above 233:
 *     possible overflow; 255: NaN), and linear_fast.c then decodes that panel for the int16
 *     road: the two roads give the same bits, so they can be mixed panel by panel;
 *   - a lane sum of exactly zero is +0 on both roads (integer 0 converts to +0; +0 plus signed
 *     zero products and exact cancellations round to +0 to nearest even).
 * The accumulator chain (acc = fma(x, u / 2, acc) per group, A and B halves) is the same FMA
 * on the same values, so fast mode gives the same bits with or without this file; the choice
 * is speed only (the start-up probe below, DS41_ISA=avx512bf16 | avx512 to force it).
 *
 * Compiled for its own target (GCC pragma / clang attribute, as linear_avx512.c): linear_fast.c
 * calls in only when CPUID reports AVX512_BF16. */
#ifndef __clang__
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
#endif
#include "linear_fast.h"
#include "formats.h"

#include <immintrin.h>
#include <string.h>
#include <time.h>

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c"))), apply_to = function)
#endif

#define KC DS41_KC
#define UNROLL _Pragma("GCC unroll 8")


/* 16 int16 words times s (a power of two), as BF16 (exact: at most 4 significant bits) */
static inline __m256i w16_bf16(__m256i w, __m512 s) {
    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(w)), s);
    return (__m256i)_mm512_cvtneps_pbh(f);
}

/* One FP4 row of a prefill panel, nblk blocks of codes c and scale bytes st, as BF16 words
 * 2 e2m1 * s_w in the int16 panel's layout (per 64 elements: the 32 even ones, then the 32
 * odd; a lone last block's partner zero). Returns 0, having written nothing useful, when a
 * scale byte is outside [1, 233] (see the head of the file). */
static int pan_fp4b(const uint8_t *c, const uint8_t *st, int nblk, int16_t *pw) {
    for (int b = 0; b < nblk; b++)
        if (st[b] < 1 || st[b] > 233) return 0;
    int ngrp = (nblk + 1) / 2;
    if (nblk & 1) memset(pw + 64 * (ngrp - 1), 0, 64 * sizeof(int16_t));
    for (int b = 0; b < nblk; b++) {
        __m256i we, wo;
        ds41_e2m1x32_i16(c + 16 * b, &we, &wo);
        __m512 s = _mm512_set1_ps(ds41_bits_f32((uint32_t)st[b] << 23));   /* 2^(e - 127), e in [1, 233] */
        int16_t *o = pw + 64 * (b >> 1) + 16 * (b & 1);
        _mm256_store_si256((__m256i *)o, w16_bf16(we, s));
        _mm256_store_si256((__m256i *)(o + 32), w16_bf16(wo, s));
    }
    return 1;
}

/* R rows x C tokens over ngrp groups: PW the BF16 panel (row stride KC words), AB the BF16
 * activation words (token stride ldab), SAV the pair scale vectors u / 2 (stride ldsa). */
#define MK_B(R, C)                                                                                    \
    static void mk_b_##R##_##C(const int16_t *PW, const int16_t *AB, size_t ldab, const float *SAV,  \
                               size_t ldsa, int ngrp, float *acc, int T, int z) {                 \
        __m512 c[R][C];                                                                           \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++)                     \
            c[r][t] = z ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + ((size_t)r * T + t) * 16); \
        for (int g = 0; g < ngrp; g++) {                                                          \
            __m512bh ae[C], ao[C];                                                                \
            UNROLL for (int t = 0; t < C; t++) {                                                  \
                ae[t] = (__m512bh)_mm512_load_si512(AB + t * ldab + 64 * g);                      \
                ao[t] = (__m512bh)_mm512_load_si512(AB + t * ldab + 64 * g + 32);                 \
            }                                                                                     \
            UNROLL for (int r = 0; r < R; r++) {                                                  \
                __m512bh we = (__m512bh)_mm512_load_si512(PW + r * KC + 64 * g);                  \
                __m512bh wo = (__m512bh)_mm512_load_si512(PW + r * KC + 64 * g + 32);             \
                UNROLL for (int t = 0; t < C; t++) {                                              \
                    __m512 x = _mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), we, ae[t]), wo, ao[t]); \
                    c[r][t] = _mm512_fmadd_ps(x, _mm512_load_ps(SAV + t * ldsa + 16 * g), c[r][t]); \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++)                     \
            _mm512_storeu_ps(acc + ((size_t)r * T + t) * 16, c[r][t]);                            \
    }
#define MK_B_R(R) MK_B(R, 1) MK_B(R, 2) MK_B(R, 3) MK_B(R, 4)
MK_B_R(1) MK_B_R(2) MK_B_R(3) MK_B_R(4)
typedef void (*mk_b_fn)(const int16_t *, const int16_t *, size_t, const float *, size_t, int, float *, int, int);
#define MK_B_ROW(R) { mk_b_##R##_1, mk_b_##R##_2, mk_b_##R##_3, mk_b_##R##_4 }
static const mk_b_fn mk_b[4][4] = { MK_B_ROW(1), MK_B_ROW(2), MK_B_ROW(3), MK_B_ROW(4) };

/* pf_fp4 of linear_fast.h on the BF16 panel (no scale vectors: folded) and BF16 activations */
static void pf_fp4b(const int16_t *PW, int nr, const int16_t *AB, size_t ldab, const float *SAV, size_t ldsa, int T,
                    int nblk, float *acc, int z) {
    int ngrp = (nblk + 1) / 2;
    for (int t0 = 0; t0 < T; t0 += 4) {
        int C = T - t0 < 4 ? T - t0 : 4;
        for (int r0 = 0; r0 < nr; r0 += 4) {
            int R = nr - r0 < 4 ? nr - r0 : 4;
            mk_b[R - 1][C - 1](PW + (size_t)r0 * KC, AB + (size_t)t0 * ldab, ldab, SAV + (size_t)t0 * ldsa, ldsa, ngrp,
                               acc + ((size_t)r0 * T + t0) * 16, T, z);
        }
    }
}

/* ---- start-up probe: does vdpbf16ps run at the zmm FMA's instruction rate? ---- */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* 24 independent chains in named registers (an array would be kept in memory: see the integer
 * probes of bench/bench_kernels.c), iters steps each; kind 0 vfmadd231ps, 1 vdpbf16ps. 24, not
 * 12: on an AMD EPYC (AVX512_BF16, Zen 5 class) vdpbf16ps has a longer latency than the FMA
 * (about 6 cycles against 4); a stand-alone probe there read 1.48 with 8 chains, 1.09 with 12,
 * 1.00 with 16 and 24 (the FMA the same with each). The earlier probe read 1.50 there and
 * auto kept the int16 road although the instruction runs at the FMA's rate. */
#define C24(OP) OP(c0) OP(c1) OP(c2) OP(c3) OP(c4) OP(c5) OP(c6) OP(c7) OP(c8) OP(c9) OP(c10) OP(c11) \
    OP(c12) OP(c13) OP(c14) OP(c15) OP(c16) OP(c17) OP(c18) OP(c19) OP(c20) OP(c21) OP(c22) OP(c23)
static float chains(long iters, int kind) {
    __m512 m = _mm512_set1_ps(0.999999f), k = _mm512_set1_ps(1e-7f);
    __m512bh a = (__m512bh)_mm512_set1_epi16(0x3F80), b = (__m512bh)_mm512_set1_epi16(0x3380);   /* 1, 2^-24 */
    /* distinct starting values: chains that start equal and apply the same operation are one
     * chain to the compiler (gcc merged the earlier probe's 12 into one, so it timed the two
     * instructions' latencies, 6 / 4 = 1.50 on that EPYC) */
#define CI(i) _mm512_set1_ps((float)(i))
    __m512 c0 = CI(0), c1 = CI(1), c2 = CI(2), c3 = CI(3), c4 = CI(4), c5 = CI(5), c6 = CI(6), c7 = CI(7), c8 = CI(8),
           c9 = CI(9), c10 = CI(10), c11 = CI(11), c12 = CI(12), c13 = CI(13), c14 = CI(14), c15 = CI(15), c16 = CI(16),
           c17 = CI(17), c18 = CI(18), c19 = CI(19), c20 = CI(20), c21 = CI(21), c22 = CI(22), c23 = CI(23);
    if (kind == 0) {
#define FM(c) c = _mm512_fmadd_ps(c, m, k);
        for (long i = 0; i < iters; i++) { C24(FM) }
    } else {
#define DP(c) c = _mm512_dpbf16_ps(c, a, b);
        for (long i = 0; i < iters; i++) { C24(DP) }
    }
#define ADD4(x, y, z, w) _mm512_add_ps(_mm512_add_ps(x, y), _mm512_add_ps(z, w))
    __m512 s = _mm512_add_ps(_mm512_add_ps(ADD4(c0, c1, c2, c3), ADD4(c4, c5, c6, c7)),
                             _mm512_add_ps(ADD4(c8, c9, c10, c11), ADD4(c12, c13, c14, c15)));
    s = _mm512_add_ps(s, _mm512_add_ps(ADD4(c16, c17, c18, c19), ADD4(c20, c21, c22, c23)));
    return _mm512_reduce_add_ps(s);
}

/* Time per vdpbf16ps over time per zmm FMA, each the fastest of 7 interleaved rounds of 24 x
 * 10,000 instructions (about 0.1 ms each on a 3 GHz core: the whole probe about 2 ms). */
static double probe_ratio(void) {
    double best[2] = { 1e30, 1e30 };
    volatile float sink = 0;
    for (int r = 0; r < 7; r++)
        for (int kind = 0; kind < 2; kind++) {
            double t0 = now();
            sink += chains(10000, kind);
            double t = now() - t0;
            if (t < best[kind]) best[kind] = t;
        }
    (void)sink;
    return best[1] / best[0];
}

static const ds41_fast_bf16 bf16_ops = { pan_fp4b, pf_fp4b, probe_ratio };
const ds41_fast_bf16 *ds41_fast_bf16_avx512(void) { return &bf16_ops; }

#ifdef __clang__
#pragma clang attribute pop
#endif
