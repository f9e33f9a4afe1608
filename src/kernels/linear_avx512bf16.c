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
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c"))), apply_to = function)
#endif
/* after the push: clang gives these this file's target (hsum.h) */
#include "hsum512.h"

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

/* ================================================================ BF16 linears on vdpbf16ps
 *
 * ds41_linear_bf16 (the head, the router gate, the compressor's wkv / wgate, the indexer's wk
 * and weights_proj, the DSpark heads, the vision linears) with BF16 weights and, where the
 * activations are BF16 values, one vdpbf16ps per 32 products where the FMA road (linear_fast.c,
 * linear_avx512.c) issues two FMAs and the two instructions that split the weight words. The
 * same bits, by this argument:
 *   - the canonical order of a BF16 output (linear_fast.c) is, per lane l of the zmm holding A
 *     (lanes 0-7, groups 2j) and B (lanes 8-15, groups 2j + 1): acc = fma(w[2l], x[2l], acc),
 *     then acc = fma(w[2l + 1], x[2l + 1], acc), over the 32-element steps in K order, then
 *     hsum8(A + B), the tail in K order, and the rounding the caller asks for;
 *   - lane l of vdpbf16ps over the same 32 words pairs the same elements, and performs (Intel
 *     SDM; checked on this EPYC on 3.2 million random lanes, performance.md "BF16 products")
 *     acc = rn(acc + w[2l + 1] x[2l + 1]), then acc = rn(acc + w[2l] x[2l]): odd first. So the
 *     weights and activations go in with the halves of every 32-bit pair swapped (vprold 16 per
 *     weight vector; the activations once per call), and the instruction adds the even
 *     element's product first, as the FMA road does;
 *   - a product of two BF16 values (8 significant bits each) is exact in FP32, so each add of
 *     the instruction is the FMA road's FMA: one rounding of the same exact value, to nearest
 *     even;
 *   - vdpbf16ps flushes BF16 subnormal inputs and FP32 subnormal results to zero (DAZ / FTZ,
 *     whatever MXCSR says), which the FMA road does not. The road is therefore taken only where
 *     neither can occur: no weight or activation is subnormal, infinite or NaN, and with Ew, Ex
 *     the smallest biased exponents of the nonzero weights (of the rows in question) and
 *     activations, Ew + Ex >= 142, i.e. every product is an integer multiple of 2^-126: then
 *     every partial sum (a rounding of a multiple of 2^-126 stays one) is 0 or at least 2^-126
 *     in magnitude, a normal number; and with the largest exponents, Ew' + Ex' + log2(in) <= 378,
 *     no partial sum can reach 2^128 (the products are below 2^(Ew' + Ex' - 252), in of them,
 *     the roundings' growth below 2^0.1), so both roads see the same finite numbers and neither
 *     overflows.
 * The activations are checked per call (every value must be a BF16 value: low 16 bits zero),
 * per 64-token tile; a tile that fails goes to the FMA road whole (ds41_fast_dense). The
 * weights are checked as they are read: per 32-row item at T <= 8 (recomputed on the FMA road
 * when the check fails), per panel at T > 8 (that panel decoded for pf_float instead). Both
 * roads give the same bits, so they mix by tile, item and panel.
 *
 * A call with T = 1 (decode) keeps the FMA road: it streams the weights at the memory's rate on
 * either road, and on this one the weights' check adds four instructions per 32 weights (on an
 * AMD EPYC, Zen 5 class, 2 threads: 0.72-1.06x the FMA road, performance.md). Two kernels:
 * T = 2 .. 8 (and the last token tile of a longer call, 1 .. 8 tokens) streams each weight row
 * once for all tokens (mk_d, R rows x C tokens in zmm accumulators, the rows read in place:
 * vdpbf16ps wants the pairs of K side by side, which is the checkpoint's row-major layout, so
 * nothing is repacked at load); T > 8 copies a 32-row x KCB-word panel into L1 (the halves
 * swapped) and runs every token of the 64-token tile through it (mk_p, 4 rows x 6 tokens),
 * the accumulators in memory between panels as the FMA road keeps them. */

#define BITEM 32          /* rows per work item */
#define BTT 64            /* tokens per activation tile */
#ifndef KCB
#define KCB 512           /* words per panel row: 32 rows x 1 KiB, 32 KiB of the 48 KiB L1 */
#endif
#define BPFD 1024         /* prefetch distance per weight row stream at T <= 8, bytes */
#define PAR_MIN_WORK 65536LL

long long ds41_fast_bf16_dtiles, ds41_fast_bf16_dfall_x, ds41_fast_bf16_dfall_w;
int ds41_fast_bf16_dguard = 1;

static void *amalloc(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64) != 0) return NULL;
    return p;
}

/* Activations of one token tile, rows t < T of x (stride xs), K [0, kv) (kv % 16 == 0): BF16
 * words with the halves of each pair swapped (dword i = bf16(x[2i]) << 16 | bf16(x[2i + 1])),
 * zero padded to a multiple of 32 words, row stride ldab dwords. Returns 0 when a value is not
 * a BF16 value or is subnormal, infinite or NaN; else *emin / *emax: the smallest and largest
 * biased exponents of the nonzero values (256 / 0 when all are zero). */
static int acts_b(const float *x, size_t xs, int T, int kv, uint32_t *ab, size_t ldab, int *emin, int *emax) {
    const __m512i lo16 = _mm512_set1_epi32(0xFFFF), mag = _mm512_set1_epi32(0x7FFFFFFF), one = _mm512_set1_epi32(1);
    /* word 2i of the result: the high word of x[2i + 1] (word 4i + 3 of the pair of
     * registers), word 2i + 1: that of x[2i] (word 4i + 1) */
    int16_t ix[32];
    for (int i = 0; i < 16; i++) { ix[2 * i] = (int16_t)(4 * i + 3); ix[2 * i + 1] = (int16_t)(4 * i + 1); }
    const __m512i idx = _mm512_loadu_si512(ix);
    __m512i lost = _mm512_setzero_si512(), mn = _mm512_set1_epi32(-1), mx = _mm512_setzero_si512();
#define TRACK(u) do {                                                                       \
        __m512i m_ = _mm512_srli_epi32(_mm512_and_si512(u, mag), 16);                       \
        lost = _mm512_or_si512(lost, _mm512_and_si512(u, lo16));                            \
        mn = _mm512_min_epu32(mn, _mm512_sub_epi32(m_, one));                               \
        mx = _mm512_max_epu32(mx, m_);                                                      \
    } while (0)
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * xs;
        uint32_t *o = ab + (size_t)t * ldab;
        int k = 0;
        for (; k + 32 <= kv; k += 32) {
            __m512i u0 = _mm512_loadu_si512(xr + k), u1 = _mm512_loadu_si512(xr + k + 16);
            TRACK(u0);
            TRACK(u1);
            _mm512_store_si512(o + k / 2, _mm512_permutex2var_epi16(u0, idx, u1));
        }
        if (k < kv) {   /* 16 left: the pair's second half zeros */
            __m512i u0 = _mm512_loadu_si512(xr + k);
            TRACK(u0);
            _mm512_store_si512(o + k / 2, _mm512_permutex2var_epi16(u0, idx, _mm512_setzero_si512()));
        }
    }
#undef TRACK
    if (_mm512_reduce_or_epi32(lost)) return 0;
    uint64_t a = (uint64_t)_mm512_reduce_min_epu32(mn) + 1;   /* 2^32 when all are zero */
    unsigned b = _mm512_reduce_max_epu32(mx);
    *emin = a >> 7 > 256 ? 256 : (int)(a >> 7);
    *emax = (int)(b >> 7);
    return !ds41_fast_bf16_dguard || (*emin >= 1 && *emax <= 254);
}

/* Weight words w seen by a kernel: mn the smallest 2w - 1 (16 bits: 0xFFFF for +-0), mx the
 * largest 2w (the sign shifted out: the biased exponent is the top byte). */
static inline void wtrack(__m512i w, __m512i *mn, __m512i *mx) {
    __m512i t = _mm512_add_epi16(w, w);
    *mn = _mm512_min_epu16(*mn, _mm512_sub_epi16(t, _mm512_set1_epi16(1)));
    *mx = _mm512_max_epu16(*mx, t);
}
static inline void wtrack_init(__m512i *mn, __m512i *mx) {
    *mn = _mm512_set1_epi32(-1);
    *mx = _mm512_setzero_si512();
}

/* 1 when the weights tracked in mn / mx and activations with exponents [xmin, xmax] meet the
 * conditions at the head of this part (no subnormal, infinite or NaN weight; every product a
 * multiple of 2^-126; no partial sum near 2^128), for dot products of length in */
static int fits(__m512i mn, __m512i mx, int xmin, int xmax, int in) {
    if (!ds41_fast_bf16_dguard) return 1;
    __m512i a = _mm512_min_epu32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(mn)),
                                 _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(mn, 1)));
    __m512i b = _mm512_max_epu32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(mx)),
                                 _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(mx, 1)));
    int wmin = (int)((_mm512_reduce_min_epu32(a) + 1) >> 8), wmax = (int)(_mm512_reduce_max_epu32(b) >> 8);
    int lg = 0;
    while (lg < 31 && (1LL << lg) < in) lg++;
    return wmin >= 1 && wmax <= 254 && wmin + xmin >= 142 && wmax + xmax + lg <= 378;
}

/* R weight rows (row r at w + r * ld words) x C tokens (activation row t at ab + t * ldab
 * dwords), ns steps of 32 words and, with half, a last step of 16 (the pairs' other half
 * zeros); out[r * ldo + t] = hsum16 of the accumulator. The weights are tracked into mn / mx. */
#define MK_D(R, C)                                                                                    \
    static void mk_d_##R##_##C(const uint16_t *w, size_t ld, int ns, int half, const uint32_t *ab,   \
                               size_t ldab, float *out, int ldo, __m512i *mn, __m512i *mx) {      \
        __m512 c[R][C];                                                                           \
        __m512i n = *mn, m = *mx;                                                                 \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++) c[r][t] = _mm512_setzero_ps(); \
        for (int s = 0; s < ns; s++) {                                                            \
            ds41_pf_rows(w, 2 * ld, (size_t)64 * s + BPFD, R);                                    \
            __m512bh a[C];                                                                        \
            UNROLL for (int t = 0; t < C; t++) a[t] = (__m512bh)_mm512_loadu_si512(ab + t * ldab + 16 * s); \
            UNROLL for (int r = 0; r < R; r++) {                                                  \
                __m512i v = _mm512_loadu_si512(w + r * ld + 32 * s);                              \
                wtrack(v, &n, &m);                                                                \
                __m512bh wv = (__m512bh)_mm512_rol_epi32(v, 16);                                  \
                UNROLL for (int t = 0; t < C; t++) c[r][t] = _mm512_dpbf16_ps(c[r][t], wv, a[t]); \
            }                                                                                     \
        }                                                                                         \
        if (half) {                                                                               \
            __m512bh a[C];                                                                        \
            UNROLL for (int t = 0; t < C; t++) a[t] = (__m512bh)_mm512_loadu_si512(ab + t * ldab + 16 * ns); \
            UNROLL for (int r = 0; r < R; r++) {                                                  \
                __m512i v = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(w + r * ld + 32 * ns))); \
                wtrack(v, &n, &m);                                                                \
                __m512bh wv = (__m512bh)_mm512_rol_epi32(v, 16);                                  \
                UNROLL for (int t = 0; t < C; t++) c[r][t] = _mm512_dpbf16_ps(c[r][t], wv, a[t]); \
            }                                                                                     \
        }                                                                                         \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++) out[r * ldo + t] = hsum16(c[r][t]); \
        *mn = n;                                                                                  \
        *mx = m;                                                                                  \
    }
#define MK_D_C(C) MK_D(1, C) MK_D(2, C) MK_D(3, C) MK_D(4, C)
MK_D_C(1) MK_D_C(2) MK_D_C(3) MK_D_C(4) MK_D_C(5) MK_D_C(6) MK_D_C(7) MK_D_C(8)
typedef void (*mk_d_fn)(const uint16_t *, size_t, int, int, const uint32_t *, size_t, float *, int, __m512i *, __m512i *);
#define MK_D_ROW(C) { mk_d_1_##C, mk_d_2_##C, mk_d_3_##C, mk_d_4_##C }
static const mk_d_fn mk_d[8][4] = { MK_D_ROW(1), MK_D_ROW(2), MK_D_ROW(3), MK_D_ROW(4),
                                    MK_D_ROW(5), MK_D_ROW(6), MK_D_ROW(7), MK_D_ROW(8) };
/* rows per call at C tokens: R C accumulators and C activations within the 32 zmm registers */
static const int mk_d_rows[9] = { 0, 4, 4, 4, 4, 4, 4, 3, 3 };

/* R panel rows (row stride KCB / 2 dwords) x C tokens, ns steps of 32 words, into the
 * accumulator blocks of acc (16 floats per row and token, row r token t at (r T + t) 16),
 * starting from +0 when z */
#define MK_P(R, C)                                                                                    \
    static void mk_p_##R##_##C(const uint32_t *PB, const uint32_t *AB, size_t ldab, int ns, float *acc, int T, int z) { \
        __m512 c[R][C];                                                                           \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++)                     \
            c[r][t] = z ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + ((size_t)r * T + t) * 16); \
        for (int s = 0; s < ns; s++) {                                                            \
            __m512bh a[C];                                                                        \
            UNROLL for (int t = 0; t < C; t++) a[t] = (__m512bh)_mm512_load_si512(AB + t * ldab + 16 * s); \
            UNROLL for (int r = 0; r < R; r++) {                                                  \
                __m512bh wv = (__m512bh)_mm512_load_si512(PB + r * (KCB / 2) + 16 * s);           \
                UNROLL for (int t = 0; t < C; t++) c[r][t] = _mm512_dpbf16_ps(c[r][t], wv, a[t]); \
            }                                                                                     \
        }                                                                                         \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++)                     \
            _mm512_storeu_ps(acc + ((size_t)r * T + t) * 16, c[r][t]);                            \
    }
#define MK_P_R(R) MK_P(R, 1) MK_P(R, 2) MK_P(R, 3) MK_P(R, 4) MK_P(R, 5) MK_P(R, 6)
MK_P_R(1) MK_P_R(2) MK_P_R(3) MK_P_R(4)
typedef void (*mk_p_fn)(const uint32_t *, const uint32_t *, size_t, int, float *, int, int);
#define MK_P_ROW(R) { mk_p_##R##_1, mk_p_##R##_2, mk_p_##R##_3, mk_p_##R##_4, mk_p_##R##_5, mk_p_##R##_6 }
static const mk_p_fn mk_p[4][6] = { MK_P_ROW(1), MK_P_ROW(2), MK_P_ROW(3), MK_P_ROW(4) };
#ifndef PR
#define PR 4
#define PC 6
#endif

typedef struct bjob {
    const uint16_t *w;
    int out, in, kv, T;
    const uint32_t *ab;   /* the tile's activations (acts_b), stride ldab dwords */
    size_t ldab;
    int xmin, xmax;       /* their exponent range */
    const float *x;       /* the raw activations (tails, the FMA road's copy), stride xs */
    size_t xs;
    float *y;
    size_t ys;
    int out_bf16;
} bjob;

/* per thread scratch */
typedef struct bscratch {
    uint32_t *PB;   /* panel (T > 8) */
    float *acc;     /* accumulator blocks (T > 8) */
    float *P;       /* the FMA road's float panel, at first need */
    float *xp;      /* the FMA road's permuted activations (linear_fast.c: perm_bf16_row), at first need */
    size_t ldp;
} bscratch;

/* the output from its accumulated value: the tail in K order, then the rounding (linear_fast.c:
 * finish) */
static inline float fin(const bjob *j, float acc, int t, int n) {
    if (j->kv < j->in) {
        const float *x = j->x + (size_t)t * j->xs;
        const uint16_t *wr = j->w + (size_t)n * j->in;
        for (int k = j->kv; k < j->in; k++) acc += x[k] * ds41_bf16_to_f32(wr[k]);
    }
    return j->out_bf16 ? ds41_bf16_round(acc) : acc;
}

/* The FMA road's activations for the fallbacks: per 32, even elements of the first 16, even
 * of the second, odd of the first, odd of the second; zero padded (linear_fast.c) */
static int fma_acts(const bjob *j, bscratch *s) {
    if (s->xp) return 1;
    s->ldp = (size_t)((j->in + 31) & ~31);
    s->xp = amalloc((size_t)j->T * s->ldp * sizeof(float));
    if (!s->xp) return 0;
    for (int t = 0; t < j->T; t++) {
        const float *x = j->x + (size_t)t * j->xs;
        float *a = s->xp + (size_t)t * s->ldp;
        memset(a, 0, s->ldp * sizeof(float));
        for (int k = 0; k < j->kv; k++) a[32 * (k >> 5) + 8 * ((k >> 4) & 1) + (k & 1) * 16 + ((k & 15) >> 1)] = x[k];
    }
    return 1;
}

/* T <= 8: the item's rows streamed once for all tokens */
static void item_d(const bjob *j, int r0, int r1, bscratch *s) {
    int nr = r1 - r0, T = j->T, ns = j->kv / 32, half = (j->kv & 31) != 0, R = mk_d_rows[T];
    float v[BITEM * 8];
    __m512i mn, mx;
    wtrack_init(&mn, &mx);
    for (int r = 0; r < nr; r += R) {
        int n = nr - r < R ? nr - r : R;
        mk_d[T - 1][n - 1](j->w + (size_t)(r0 + r) * j->in, (size_t)j->in, ns, half, j->ab, j->ldab, v + r * T, T, &mn, &mx);
    }
    if (!fits(mn, mx, j->xmin, j->xmax, j->kv)) {   /* the FMA road for these rows */
        __atomic_fetch_add(&ds41_fast_bf16_dfall_w, 1, __ATOMIC_RELAXED);
        if (!fma_acts(j, s)) return;
        const ds41_fast_ops *o = ds41_fast_ops_avx512();
        if (T == 1) o->dec_bf16(j->w + (size_t)r0 * j->in, (size_t)j->in, nr, j->kv / 16, s->xp, v);
        else o->few_bf16(j->w + (size_t)r0 * j->in, (size_t)j->in, nr, j->kv / 16, s->xp, s->ldp, T, v);
    }
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < T; t++) j->y[(size_t)t * j->ys + r0 + r] = fin(j, v[r * T + t], t, r0 + r);
}

/* Rows [r0, r1) x K [k0, k0 + kc) (kc % 16 == 0) into the panel PB, halves swapped, zero
 * padded to 32 words, tracked; the same bytes of the panel nx (rows [nr0, nr1), K [nk0, nk0 +
 * nkc)) prefetched into L2, one row per row copied */
static void pan_b(const bjob *j, int r0, int r1, int k0, int kc, uint32_t *PB, __m512i *mn, __m512i *mx,
                  int nr0, int nr1, int nk0, int nkc) {
    int ns = kc / 32;
    for (int r = r0; r < r1; r++) {
        if (nr0 + (r - r0) < nr1) {
            const char *b = (const char *)(j->w + (size_t)(nr0 + (r - r0)) * j->in + nk0);
            for (int o = 0; o < 2 * nkc; o += 64) _mm_prefetch(b + o, _MM_HINT_T1);
        }
        const uint16_t *w = j->w + (size_t)r * j->in + k0;
        uint32_t *p = PB + (size_t)(r - r0) * (KCB / 2);
        for (int s = 0; s < ns; s++) {
            __m512i v = _mm512_loadu_si512(w + 32 * s);
            wtrack(v, mn, mx);
            _mm512_store_si512(p + 16 * s, _mm512_rol_epi32(v, 16));
        }
        if (kc & 31) {
            __m512i v = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(w + 32 * ns)));
            wtrack(v, mn, mx);
            _mm512_store_si512(p + 16 * ns, _mm512_rol_epi32(v, 16));
        }
    }
}

/* The FMA road's float panel of rows [r0, r1) x K [k0, k0 + kc) (kc <= DS41_KC, kc % 16 == 0;
 * linear_fast.c decode_panel): per 32, even elements of the two groups, then odd; returns the
 * number of 8-chunks */
static int pan_f(const bjob *j, int r0, int r1, int k0, int kc, float *P) {
    const __m256i hm = _mm256_set1_epi32((int)0xFFFF0000);
    for (int r = r0; r < r1; r++) {
        const uint16_t *w = j->w + (size_t)r * j->in + k0;
        float *pr = P + (size_t)(r - r0) * DS41_KC;
        for (int g = 0; g < kc / 16; g++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(w + 16 * g));
            float *o = pr + 32 * (g >> 1) + 8 * (g & 1);
            _mm256_store_ps(o, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
            _mm256_store_ps(o + 16, _mm256_castsi256_ps(_mm256_and_si256(v, hm)));
        }
        if ((kc / 16) & 1) {
            float *o = pr + 32 * (kc / 32) + 8;
            _mm256_store_ps(o, _mm256_setzero_ps());
            _mm256_store_ps(o + 16, _mm256_setzero_ps());
        }
    }
    return ((kc + 31) & ~31) / 8;
}

/* T > 8: per panel of KCB words, the item's rows copied once, then every token through it */
static void item_p(const bjob *j, int r0, int r1, int nxr0, int nxr1, bscratch *s) {
    int nr = r1 - r0, T = j->T;
    float *acc = s->acc;
    for (int k0 = 0; k0 < j->kv; k0 += KCB) {
        int kc = j->kv - k0 < KCB ? j->kv - k0 : KCB;
        /* the next panel: this item's next K, or the next item's first */
        int nk0 = k0 + KCB < j->kv ? k0 + KCB : 0, nkc = j->kv - nk0 < KCB ? j->kv - nk0 : KCB;
        int n0 = nk0 ? r0 : nxr0, n1 = nk0 ? r1 : nxr1;
        __m512i mn, mx;
        wtrack_init(&mn, &mx);
        pan_b(j, r0, r1, k0, kc, s->PB, &mn, &mx, n0, n1, nk0, nkc);
        if (fits(mn, mx, j->xmin, j->xmax, j->kv)) {
            int ns = (kc + 31) / 32;
            for (int t0 = 0; t0 < T; t0 += PC) {
                int C = T - t0 < PC ? T - t0 : PC;
                for (int q = 0; q < nr; q += PR) {
                    int R = nr - q < PR ? nr - q : PR;
                    mk_p[R - 1][C - 1](s->PB + (size_t)q * (KCB / 2), j->ab + (size_t)t0 * j->ldab + k0 / 2, j->ldab, ns,
                                       acc + ((size_t)q * T + t0) * 16, T, k0 == 0);
                }
            }
            continue;
        }
        /* the FMA road for this panel, in DS41_KC-wide parts */
        __atomic_fetch_add(&ds41_fast_bf16_dfall_w, 1, __ATOMIC_RELAXED);
        if (!s->P) s->P = amalloc((size_t)BITEM * DS41_KC * sizeof(float));
        if (!s->P || !fma_acts(j, s)) return;
        const ds41_fast_ops *o = ds41_fast_ops_avx512();
        for (int k1 = k0; k1 < k0 + kc; k1 += DS41_KC) {
            int kc1 = k0 + kc - k1 < DS41_KC ? k0 + kc - k1 : DS41_KC;
            int nch = pan_f(j, r0, r1, k1, kc1, s->P);
            o->pf_float(s->P, nr, s->xp + k1, s->ldp, T, nch, acc, k1 == 0);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < T; t++)
            j->y[(size_t)t * j->ys + r0 + r] = fin(j, hsum16(_mm512_loadu_ps(acc + ((size_t)r * T + t) * 16)), t, r0 + r);
}

static void bjob_items(void *arg, int i0, int i1) {
    const bjob *j = arg;
    bscratch s = { NULL, NULL, NULL, NULL, 0 };
    if (j->T > 8) {
        s.PB = amalloc((size_t)BITEM * KCB * 2);
        s.acc = amalloc((size_t)BITEM * j->T * 16 * sizeof(float));
        if (!s.PB || !s.acc) { free(s.PB); free(s.acc); return; }
    }
    for (int it = i0; it < i1; it++) {
        int r0 = it * BITEM, r1 = r0 + BITEM < j->out ? r0 + BITEM : j->out;
        if (j->T <= 8) {
            item_d(j, r0, r1, &s);
        } else {
            int n0 = it + 1 < i1 ? r1 : 0, n1 = it + 1 < i1 ? (r1 + BITEM < j->out ? r1 + BITEM : j->out) : 0;
            item_p(j, r0, r1, n0, n1, &s);
        }
    }
    free(s.PB); free(s.acc); free(s.P); free(s.xp);
}

/* ds41_fast_dense for BF16 weights (kind 0): the vdpbf16ps road per 64-token tile whose
 * activations allow it, the FMA road for the others */
static void dense_b(const ds41_ctx *ctx, const uint16_t *wb, int out, int in, const float *x, int x_stride, int T,
                    float *y, int y_stride, int out_bf16) {
    if (T == 1) {   /* decode: the FMA road (the stream is bound by memory: see performance.md) */
        ds41_fast_dense(ctx, 0, wb, NULL, NULL, 0, out, in, x, x_stride, T, y, y_stride, out_bf16);
        return;
    }
    int kv = in & ~15;
    int tt = T < BTT ? T : BTT;
    size_t ldab = (size_t)((kv + 31) & ~31) / 2;
    uint32_t *ab = kv > 0 && T > 0 && out > 0 ? amalloc((size_t)tt * ldab * sizeof(uint32_t)) : NULL;
    for (int t0 = 0; t0 < T; t0 += tt) {
        int nt = T - t0 < tt ? T - t0 : tt;
        const float *xt = x + (size_t)t0 * x_stride;
        float *yt = y + (size_t)t0 * y_stride;
        bjob j = { wb, out, in, kv, nt, ab, ldab, 0, 0, xt, (size_t)x_stride, yt, (size_t)y_stride, out_bf16 };
        if (!ab || !acts_b(xt, (size_t)x_stride, nt, kv, ab, ldab, &j.xmin, &j.xmax)) {
            if (ab) __atomic_fetch_add(&ds41_fast_bf16_dfall_x, 1, __ATOMIC_RELAXED);
            ds41_fast_dense(ctx, 0, wb, NULL, NULL, 0, out, in, xt, x_stride, nt, yt, y_stride, out_bf16);
            continue;
        }
        __atomic_fetch_add(&ds41_fast_bf16_dtiles, 1, __ATOMIC_RELAXED);
        int n_items = (out + BITEM - 1) / BITEM;
        if ((long long)out * in * nt >= PAR_MIN_WORK) ds41_parallel_for(ctx, n_items, bjob_items, &j);
        else bjob_items(&j, 0, n_items);
    }
    free(ab);
}

static const ds41_fast_bf16 bf16_ops = { pan_fp4b, pf_fp4b, probe_ratio, dense_b };
const ds41_fast_bf16 *ds41_fast_bf16_avx512(void) { return &bf16_ops; }

#ifdef __clang__
#pragma clang attribute pop
#endif
