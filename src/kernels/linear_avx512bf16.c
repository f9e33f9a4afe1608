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

/* R rows x C tokens over ngrp groups: PW the BF16 panel (row stride ldp words), AB the BF16
 * activation words (token stride ldab), SAV the pair scale vectors u / 2 (stride ldsa). */
#define MK_B(R, C)                                                                                    \
    static void mk_b_##R##_##C(const int16_t *PW, size_t ldp, const int16_t *AB, size_t ldab, const float *SAV, \
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
                __m512bh we = (__m512bh)_mm512_load_si512(PW + r * ldp + 64 * g);                 \
                __m512bh wo = (__m512bh)_mm512_load_si512(PW + r * ldp + 64 * g + 32);            \
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
typedef void (*mk_b_fn)(const int16_t *, size_t, const int16_t *, size_t, const float *, size_t, int, float *, int, int);
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
            mk_b[R - 1][C - 1](PW + (size_t)r0 * KC, KC, AB + (size_t)t0 * ldab, ldab, SAV + (size_t)t0 * ldsa, ldsa, ngrp,
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
 * nothing is repacked at load); T > 8 copies a PITEM-row x KCB-word panel (16 x 1,024) into L1 (the halves
 * swapped) and runs every token of the 64-token tile through it (mk_q, 4 rows x 6 tokens),
 * the accumulators in memory between panels as the FMA road keeps them. */

#define BITEM 32          /* rows per work item, T <= 8 */
#ifndef PITEM
#define PITEM 16          /* rows per work item, T > 8 (the panel: KCB below) */
#endif
#define ITEM_ROWS(T) ((T) > 8 ? PITEM : BITEM)
#define BTT 64            /* tokens per activation tile */
#ifndef KCB
#define KCB 1024          /* words per panel row: 16 rows x 2 KiB, 32 KiB of the 48 KiB L1 (32 steps
                           * per micro-kernel call: its 24 accumulators loaded and stored half as
                           * often as with 32 rows x 512; performance.md) */
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
static int acts_b(const float *x, size_t xs, int T, int kv, uint32_t *ab, size_t ldab, int *emin, int *emax, int fp8) {
    const __m512i lo16 = _mm512_set1_epi32(0xFFFF), mag = _mm512_set1_epi32(0x7FFFFFFF), one = _mm512_set1_epi32(1);
    /* BF16 (fp8 = 0): word 2i of the result is the high word of x[2i + 1] (word 4i + 3 of the
     * pair of registers), word 2i + 1 that of x[2i] (word 4i + 1). FP8 (fp8 = 1; "FP8 on
     * vdpbf16ps" below): word 2i that of x[16 + i] (word 32 + 2i + 1), word 2i + 1 that of x[i]
     * (word 2i + 1). */
    int16_t ix[32];
    for (int i = 0; i < 16; i++) {
        ix[2 * i] = (int16_t)(fp8 ? 32 + 2 * i + 1 : 4 * i + 3);
        ix[2 * i + 1] = (int16_t)(fp8 ? 2 * i + 1 : 4 * i + 1);
    }
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

/* the smallest lg with 2^lg >= n (the bound on a dot product's growth) */
static int lg_ceil(int n) {
    int lg = 0;
    while (lg < 31 && (1LL << lg) < n) lg++;
    return lg;
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
    return wmin >= 1 && wmax <= 254 && wmin + xmin >= 142 && wmax + xmax + lg_ceil(in) <= 378;
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

/* R panel rows (row stride ldp dwords) x C tokens (token stride lda dwords), ns steps of 32
 * words, into the accumulator blocks of acc (16 floats per row and token, row r token t at
 * (r T + t) 16), starting from +0 when z */
#define MK_Q(R, C)                                                                                    \
    static void mk_q_##R##_##C(const uint32_t *PB, size_t ldp, const uint32_t *AB, size_t ldab, int ns, float *acc, \
                               int T, int z) {                                                    \
        __m512 c[R][C];                                                                           \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++)                     \
            c[r][t] = z ? _mm512_setzero_ps() : _mm512_load_ps(acc + ((size_t)r * T + t) * 16);   \
        for (int s = 0; s < ns; s++) {                                                            \
            __m512bh a[C];                                                                        \
            UNROLL for (int t = 0; t < C; t++) a[t] = (__m512bh)_mm512_load_si512(AB + t * ldab + 16 * s); \
            UNROLL for (int r = 0; r < R; r++) {                                                  \
                __m512bh wv = (__m512bh)_mm512_load_si512(PB + r * ldp + 16 * s);                 \
                UNROLL for (int t = 0; t < C; t++) c[r][t] = _mm512_dpbf16_ps(c[r][t], wv, a[t]); \
            }                                                                                     \
        }                                                                                         \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++)                     \
            _mm512_store_ps(acc + ((size_t)r * T + t) * 16, c[r][t]);                             \
    }
#define MK_Q_R(R) MK_Q(R, 1) MK_Q(R, 2) MK_Q(R, 3) MK_Q(R, 4) MK_Q(R, 5) MK_Q(R, 6)
MK_Q_R(1) MK_Q_R(2) MK_Q_R(3) MK_Q_R(4)
typedef void (*mk_q_fn)(const uint32_t *, size_t, const uint32_t *, size_t, int, float *, int, int);
#define MK_Q_ROW(R) { mk_q_##R##_1, mk_q_##R##_2, mk_q_##R##_3, mk_q_##R##_4, mk_q_##R##_5, mk_q_##R##_6 }
static const mk_q_fn mk_q[4][6] = { MK_Q_ROW(1), MK_Q_ROW(2), MK_Q_ROW(3), MK_Q_ROW(4) };
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
                    mk_q[R - 1][C - 1](s->PB + (size_t)q * (KCB / 2), KCB / 2, j->ab + (size_t)t0 * j->ldab + k0 / 2, j->ldab,
                                       ns, acc + ((size_t)q * T + t0) * 16, T, k0 == 0);
                }
            }
            continue;
        }
        /* the FMA road for this panel, in DS41_KC-wide parts */
        __atomic_fetch_add(&ds41_fast_bf16_dfall_w, 1, __ATOMIC_RELAXED);
        if (!s->P) s->P = amalloc((size_t)PITEM * DS41_KC * sizeof(float));
        if (!s->P || !fma_acts(j, s)) return;
        const ds41_fast_ops *o = ds41_fast_ops_avx512();
        for (int k1 = k0; k1 < k0 + kc; k1 += DS41_KC) {
            int kc1 = k0 + kc - k1 < DS41_KC ? k0 + kc - k1 : DS41_KC;
            int nch = pan_f(j, r0, r1, k1, kc1, s->P);
            o->pf_float(s->P, nr, s->xp + k1, s->ldp, T, nch, acc, k1 == 0);
        }
    }
    if (j->kv == j->in) {   /* no tail */
        ds41_fast_store_outs(acc, T, nr, j->y + r0, j->ys, j->out_bf16);
        return;
    }
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < T; t++)
            j->y[(size_t)t * j->ys + r0 + r] = fin(j, hsum16(_mm512_loadu_ps(acc + ((size_t)r * T + t) * 16)), t, r0 + r);
}

static void bjob_items(void *arg, int i0, int i1) {
    const bjob *j = arg;
    bscratch s = { NULL, NULL, NULL, NULL, 0 };
    if (j->T > 8) {
        s.PB = amalloc((size_t)PITEM * KCB * 2);
        s.acc = amalloc((size_t)PITEM * j->T * 16 * sizeof(float));
        if (!s.PB || !s.acc) { free(s.PB); free(s.acc); return; }
    }
    for (int it = i0; it < i1; it++) {
        int ir = ITEM_ROWS(j->T), r0 = it * ir, r1 = r0 + ir < j->out ? r0 + ir : j->out;
        if (j->T <= 8) {
            item_d(j, r0, r1, &s);
        } else {
            int n0 = it + 1 < i1 ? r1 : 0, n1 = it + 1 < i1 ? (r1 + ir < j->out ? r1 + ir : j->out) : 0;
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
        if (!ab || !acts_b(xt, (size_t)x_stride, nt, kv, ab, ldab, &j.xmin, &j.xmax, 0)) {
            if (ab) __atomic_fetch_add(&ds41_fast_bf16_dfall_x, 1, __ATOMIC_RELAXED);
            ds41_fast_dense(ctx, 0, wb, NULL, NULL, 0, out, in, xt, x_stride, nt, yt, y_stride, out_bf16);
            continue;
        }
        __atomic_fetch_add(&ds41_fast_bf16_dtiles, 1, __ATOMIC_RELAXED);
        int n_items = (out + ITEM_ROWS(nt) - 1) / ITEM_ROWS(nt);
        if ((long long)out * in * nt >= PAR_MIN_WORK) ds41_parallel_for(ctx, n_items, bjob_items, &j);
        else bjob_items(&j, 0, n_items);
    }
    free(ab);
}

/* ================================================================ FP4 in the dot order
 *
 * DS41_ISA=avx512dot: the FP4 prefill panels (T > DS41_FEW_MAX where the mid kernels do not
 * serve, i.e. T = 33 .. 64 per 64-token tile) with one vdpbf16ps per 32 products, the
 * canonical order given up for this order (performance.md, "FP4 in the dot order"):
 *   - the weight words are bf16(2 e2m1 * s_w) (s_w = 2^(e - 127) of the row's 32-block), the
 *     activation words bf16(q * u / 2) (fp4_act_row's integers and the block's power-of-two
 *     scale), both in K order, so that every product is e2m1 * s_w * q * u exactly, as on
 *     the int16 road;
 *   - output (row n, token t) has 16 lane sums, each from +0; for the 32-element blocks b in K
 *     order, lane i adds (rounded to nearest even, one rounding each) the product of element
 *     32 b + 2 i + 1, then that of element 32 b + 2 i (vdpbf16ps's odd-first order); the lanes
 *     are then summed as hsum16 does (x_i = l_i + l_(i+8); s_j = x_j + x_(j+4); (s_0 + s_2) +
 *     (s_1 + s_3)) and rounded to BF16, as the int16 road ends;
 *   - vdpbf16ps flushes subnormal inputs and results: with ea the biased exponent of u / 2,
 *     every product is an integer times 2^(e + ea - 254), so e + ea >= 128 makes every nonzero
 *     product and partial sum at least 2^-126; |2 e2m1 q| < 2^19, so e + ea + log2(in) <= 361
 *     keeps every partial sum below 2^127 (and the words are normal and finite for e in
 *     [1, 251], ea >= 1). The call checks its scale bytes' range against its activations'
 *     (dot_fp4 returns 0, and the caller takes the int16 road, when a byte is outside).
 * A work item is DITEM rows: per panel of KCD elements its rows are decoded once (a 32-word
 * table per block, scaled by adding (e - 127) << 7 to the nonzero entries' exponents, indexed
 * by the codes with vpermw), then every token runs through it (mk_q, PR rows x PC tokens of
 * accumulators), the lane sums in memory between panels. */
#ifndef DITEM
#define DITEM 16          /* rows per work item */
#endif
#ifndef KCD
#define KCD 1024          /* elements per panel row: 16 rows x 2 KiB of BF16 words in L1, as KCB */
#endif

/* 2 e2m1 of the 16 codes as BF16 words (code 8, -0, as +0: the int16 road's integer 0), twice */
static const uint16_t e2m1_bf16x2[32] = {
    0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40C0, 0x4100, 0x4140, 0x0000, 0xBF80, 0xC000, 0xC040, 0xC080, 0xC0C0, 0xC100, 0xC140,
    0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40C0, 0x4100, 0x4140, 0x0000, 0xBF80, 0xC000, 0xC040, 0xC080, 0xC0C0, 0xC100, 0xC140 };

/* nblk blocks of one FP4 row (codes c, scale bytes st in [1, 251]) as BF16 words 2 e2m1 s_w in
 * K order (element k at pw[k]: byte i of a block holds elements 2 i, low nibble, and 2 i + 1) */
static void pan_d_row(const uint8_t *c, const uint8_t *st, int nblk, uint16_t *pw) {
    const __m512i base = _mm512_loadu_si512(e2m1_bf16x2), m4 = _mm512_set1_epi32(0x000F000F);
    const __mmask32 nz = ~(__mmask32)0x01010101u;   /* the zero codes 0 and 8 keep +0 */
    for (int b = 0; b < nblk; b++) {
        __m512i tab = _mm512_mask_add_epi16(base, nz, base, _mm512_set1_epi16((short)((st[b] - 127) * 128)));
        __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(c + 16 * b)));
        /* word 2 i: byte i's low nibble; word 2 i + 1: its high nibble */
        __m512i ix = _mm512_ternarylogic_epi32(d, _mm512_slli_epi32(d, 12), m4, 0xA8);
        _mm512_store_si512(pw + 32 * b, _mm512_permutexvar_epi16(ix, tab));
    }
}

/* The dot order's activation words of one row from its Q8 values a (ds41_fast_q8_row): fp4_act_row's
 * (linear_fast.c) integers q and block scales u, as ad[k] = bf16(q_k u / 2) in K order: per
 * 32-block m = max |a| (NaNs ignored), ue = m's biased exponent - 14 (127 when m = 0), at
 * least 2, q = (int16) cvt(a 2^(127 - ue)) (round to nearest even; NaN -> 0). Returns 0 when a
 * word is not exact in BF16 (never: q has at most 4 significant bits; checked all the same);
 * widens [*emin, *emax] to the biased exponents of the blocks' u / 2 (ue - 1). */
static int dot_acts(const float *a, int in, uint16_t *ad, int *emin, int *emax) {
    const __m512 absm = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
    __m512i lost = _mm512_setzero_si512();
    int lo = *emin, hi = *emax;
    for (int b = 0; b < in / 32; b++) {
        __m512 v0 = _mm512_loadu_ps(a + 32 * b), v1 = _mm512_loadu_ps(a + 32 * b + 16);
        /* max_ps returns its second operand when the first is NaN: NaNs drop out */
        __m512 m = _mm512_max_ps(_mm512_and_ps(v1, absm), _mm512_max_ps(_mm512_and_ps(v0, absm), _mm512_setzero_ps()));
        float mf = _mm512_reduce_max_ps(m);
        int ue = mf > 0.0f ? (int)(ds41_f32_bits(mf) >> 23) - 14 : 127;
        if (ue < 2) ue = 2;
        __m512 inv = _mm512_set1_ps(ds41_bits_f32((uint32_t)(254 - ue) << 23));
        __m512 hu = _mm512_set1_ps(ds41_bits_f32((uint32_t)(ue - 1) << 23));
        lo = ue - 1 < lo ? ue - 1 : lo;
        hi = ue - 1 > hi ? ue - 1 : hi;
        __m256i q0 = _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(v0, inv)));   /* truncated to int16 */
        __m256i q1 = _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(v1, inv)));
        __m512i w0 = _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(q0)), hu));
        __m512i w1 = _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(q1)), hu));
        lost = _mm512_or_si512(lost, _mm512_and_si512(_mm512_or_si512(w0, w1), _mm512_set1_epi32(0xFFFF)));
        _mm256_storeu_si256((__m256i *)(ad + 32 * b), _mm512_cvtepi32_epi16(_mm512_srli_epi32(w0, 16)));
        _mm256_storeu_si256((__m256i *)(ad + 32 * b + 16), _mm512_cvtepi32_epi16(_mm512_srli_epi32(w1, 16)));
    }
    *emin = lo;
    *emax = hi;
    return _mm512_test_epi32_mask(lost, lost) == 0;
}

/* An FP4 call in 16-row x 1,024-wide panels: the dot order (ad), or the canonical BF16 road
 * (ab, sav: "FP4 in the canonical order, wide panels" below) */
typedef struct djob {
    const uint8_t *w, *s;
    int out, in, T;
    const uint16_t *ad;   /* dot order: activation words, token stride ldad words */
    size_t ldad;
    float *y;
    size_t ys;
    const int16_t *ab;    /* canonical road (ad NULL): the activation words as BF16 (the int16
                           * layout), token stride ldab; the pair scale vectors u / 2, stride ldsa */
    size_t ldab;
    const float *sav;
    size_t ldsa;
} djob;

static void djob_items(void *arg, int i0, int i1) {
    const djob *j = arg;
    int T = j->T, nb = j->in / 32;
    size_t lw = (size_t)j->in / 2;
    uint16_t *PW = ds41_scratch(DS41_SCR_ITEM_PW, (size_t)DITEM * KCD * sizeof(uint16_t));
    float *acc = ds41_scratch(DS41_SCR_ITEM_ACC, (size_t)DITEM * T * 16 * sizeof(float));
    if (!PW || !acc) return;
    for (int it = i0; it < i1; it++) {
        int r0 = it * DITEM, r1 = r0 + DITEM < j->out ? r0 + DITEM : j->out, nr = r1 - r0;
        for (int k0 = 0; k0 < j->in; k0 += KCD) {
            int kc = j->in - k0 < KCD ? j->in - k0 : KCD, nblk = kc / 32, ngrp = (nblk + 1) / 2;
            /* the next panel's codes into L2 as this one is decoded: this item's next K, or
             * the next item's first */
            int nk0 = k0 + KCD < j->in ? k0 + KCD : 0, nr0 = nk0 ? r0 : r1;
            int nr1 = nk0 ? r1 : (it + 1 < i1 ? (r1 + DITEM < j->out ? r1 + DITEM : j->out) : r1);
            int nkc = j->in - nk0 < KCD ? j->in - nk0 : KCD;
            for (int r = r0; r < r1; r++) {
                if (nr0 + (r - r0) < nr1) {   /* its codes and its scale bytes (a miss each otherwise) */
                    const char *b = (const char *)(j->w + (size_t)(nr0 + (r - r0)) * lw + nk0 / 2);
                    for (int o = 0; o < nkc / 2; o += 64) _mm_prefetch(b + o, _MM_HINT_T1);
                    _mm_prefetch((const char *)(j->s + (size_t)(nr0 + (r - r0)) * nb + nk0 / 32), _MM_HINT_T1);
                }
                const uint8_t *c = j->w + (size_t)r * lw + k0 / 2, *st = j->s + (size_t)r * nb + k0 / 32;
                if (j->ad) pan_d_row(c, st, nblk, PW + (size_t)(r - r0) * KCD);
                else pan_fp4b(c, st, nblk, (int16_t *)PW + (size_t)(r - r0) * KCD);
            }
            if (!j->ad) {   /* the canonical road: 4 rows x 4 tokens, 2 vdpbf16ps + 1 FMA per 64 */
                for (int t0 = 0; t0 < T; t0 += 4) {
                    int C = T - t0 < 4 ? T - t0 : 4;
                    for (int q = 0; q < nr; q += 4) {
                        int R = nr - q < 4 ? nr - q : 4;
                        mk_b[R - 1][C - 1]((const int16_t *)PW + (size_t)q * KCD, KCD, j->ab + (size_t)t0 * j->ldab + k0,
                                           j->ldab, j->sav + (size_t)t0 * j->ldsa + k0 / 4, j->ldsa, ngrp,
                                           acc + ((size_t)q * T + t0) * 16, T, k0 == 0);
                    }
                }
                continue;
            }
            for (int t0 = 0; t0 < T; t0 += PC) {
                int C = T - t0 < PC ? T - t0 : PC;
                for (int q = 0; q < nr; q += PR) {
                    int R = nr - q < PR ? nr - q : PR;
                    mk_q[R - 1][C - 1]((const uint32_t *)(PW + (size_t)q * KCD), KCD / 2,
                                       (const uint32_t *)(j->ad + (size_t)t0 * j->ldad + k0), j->ldad / 2, nblk,
                                       acc + ((size_t)q * T + t0) * 16, T, k0 == 0);
                }
            }
        }
        ds41_fast_store_outs(acc, T, nr, j->y + r0, j->ys, 1);
    }
}

/* the smallest and largest of n bytes */
static void u8_range(const uint8_t *p, size_t n, int *mn, int *mx) {
    __m512i a = _mm512_set1_epi8(-1), b = _mm512_setzero_si512();
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i v = _mm512_loadu_si512(p + i);
        a = _mm512_min_epu8(a, v);
        b = _mm512_max_epu8(b, v);
    }
    uint8_t la[64], lb[64];
    _mm512_storeu_si512(la, a);
    _mm512_storeu_si512(lb, b);
    int lo = 255, hi = 0;
    for (int k = 0; k < 64; k++) {
        lo = la[k] < lo ? la[k] : lo;
        hi = lb[k] > hi ? lb[k] : hi;
    }
    for (; i < n; i++) {
        lo = p[i] < lo ? p[i] : lo;
        hi = p[i] > hi ? p[i] : hi;
    }
    *mn = lo;
    *mx = hi;
}

/* The smallest and largest scale bytes of a call's weights (n bytes at s) into rng[0] and
 * rng[1], read once per call: the caller keeps rng across its token tiles, and rng[0] < 0 asks
 * for them */
static void call_range(const uint8_t *s, size_t n, int *rng) {
    if (rng[0] < 0) u8_range(s, n, &rng[0], &rng[1]);
}

/* The FP4 linear of T tokens in the dot order (the head of this part): y[t ys + n] for the
 * activation words ad (token stride ldad words, in of them per token, 64-byte aligned rows)
 * whose u / 2 exponents span [eamin, eamax]. Returns 0, having written nothing, where a scale
 * byte of w is outside the range the argument above allows; 1 when done. */
static int dot_fp4(const ds41_ctx *ctx, const uint8_t *w, const uint8_t *s, int out, int in, const uint16_t *ad,
                   size_t ldad, int T, int eamin, int eamax, float *y, size_t ys, int *srng) {
    int lg = lg_ceil(in);
    call_range(s, (size_t)out * (in / 32), srng);
    int lo = 128 - eamin > 1 ? 128 - eamin : 1, hi = 361 - lg - eamax < 251 ? 361 - lg - eamax : 251;
    if (srng[0] < lo || srng[1] > hi) return 0;
    djob j = { w, s, out, in, T, ad, ldad, y, ys, NULL, 0, NULL, 0 };
    int n_items = (out + DITEM - 1) / DITEM;
    if ((long long)out * in * T >= PAR_MIN_WORK) ds41_parallel_for(ctx, n_items, djob_items, &j);
    else djob_items(&j, 0, n_items);
    return 1;
}

/* ================================================================ FP8 on vdpbf16ps
 *
 * The FP8 linears' tiles of 9 .. 64 tokens, and those of the dequantized FP8 linear (the
 * grouped wo_a: BF16 activations, no Q8; the same order), in place of the mid kernels and the
 * prefill panels,
 * with one vdpbf16ps per 32 products where the FMA road (pan_e4m3 + pf_float, mid_e4m3) issues
 * two FMAs, with the FMA road's bits, by the argument of the BF16 linears above:
 *   - the canonical order of an FP8 output (linear_fast.c) is, per lane l of the zmm holding A
 *     and B: acc = fma(w[32 m + l], a[32 m + l], acc), then acc = fma(w[32 m + 16 + l],
 *     a[32 m + 16 + l], acc), over the 32-element steps m in K order (the weights e4m3 * s_tile
 *     as pan_e4m3 decodes them, the activations the Q8 values a), then hsum8(A + B) and the
 *     rounding to BF16;
 *   - so dword l of step m holds element 32 m + l in its high (odd) word and 32 m + 16 + l in
 *     its low one, weights (pan8_row) and activations (acts_b with fp8) alike: vdpbf16ps adds
 *     the odd word's product first, each add rounded to nearest even, as the two FMAs do;
 *   - both operands are exact in BF16: e4m3 * s_tile has at most 4 significant bits, and so
 *     has a Q8 value (an E4M3 value times a power of two; acts_b checks that each is a BF16
 *     value all the same); their products are exact in FP32;
 *   - flushing and overflow: the weights' biased exponents lie in [st - 9, st + 8] for a tile
 *     scale byte st (|e4m3| in [2^-9, 480], the NaN codes decoding to 480 on both roads), so
 *     the call is taken only where, over its scale bytes [smin, smax] and its activations'
 *     exponents [xmin, xmax], smin >= 10 (every weight an FP32 normal: its BF16 word is the
 *     value, not a truncation), smax <= 246, (smin - 9) + xmin >= 142 and (smax + 8) + xmax +
 *     log2(in) <= 378 (fits() above). Elsewhere dense_fp8 returns 0 and the caller runs the
 *     tile on the FMA road, with the same bits.
 * A work item is PITEM rows (one 32-row scale tile): per panel of KCB elements its rows are
 * decoded once into BF16 dwords, then every token of the tile runs through it (mk_q), the
 * accumulators in memory between panels, the next panel's codes prefetched into L2. */

/* nstep 32-element steps of one FP8 row: codes c, the tile scale bytes st (one per step) ->
 * dwords p in the order above; lut: ue8m0(st) * 2^8 */
static void pan8_row(const uint8_t *c, const uint8_t *st, int nstep, uint32_t *p, const float *lut) {
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000), m = _mm512_set1_epi16((short)0xBFFF);
    for (int b = 0; b < nstep; b++) {
        /* the FP16 pattern of e4m3 * 2^-8 (the code sign-extended, shifted left by 7, bit 14
         * cleared; normals and subnormals alike), converted exactly, times s_tile * 2^8 */
        __m512i h = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(c + 32 * b))), 7), m);
        __m512 sc = _mm512_set1_ps(lut[st[b]]);
        __m512i f0 = _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), sc));
        __m512i f1 = _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), sc));
        /* (f0 & hi) | (f1 >> 16) */
        _mm512_store_si512(p + 16 * b, _mm512_ternarylogic_epi32(f0, hi, _mm512_srli_epi32(f1, 16), 0xEA));
    }
}

typedef struct ejob {
    const uint8_t *w, *s;   /* the whole matrix: rows row0 .. row0 + out - 1 are this call's */
    int row0, out, in, T;
    const uint32_t *ab;   /* activation dwords, token stride ldab */
    size_t ldab;
    float *y;
    size_t ys;
    const float *lut;
} ejob;

static void ejob_items(void *arg, int i0, int i1) {
    const ejob *j = arg;
    int T = j->T, nbk = j->in / 32;
    uint32_t *PB = ds41_scratch(DS41_SCR_ITEM_PW, (size_t)PITEM * KCB * sizeof(uint16_t));
    float *acc = ds41_scratch(DS41_SCR_ITEM_ACC, (size_t)PITEM * T * 16 * sizeof(float));
    if (!PB || !acc) return;
    for (int it = i0; it < i1; it++) {
        int r0 = it * PITEM, r1 = r0 + PITEM < j->out ? r0 + PITEM : j->out, nr = r1 - r0;
        const uint8_t *st = j->s + (size_t)((j->row0 + r0) / 32) * nbk, *w = j->w + (size_t)j->row0 * j->in;
        for (int k0 = 0; k0 < j->in; k0 += KCB) {
            int kc = j->in - k0 < KCB ? j->in - k0 : KCB, ns = kc / 32;
            /* the next panel: this item's next K, or the next item's first */
            int nk0 = k0 + KCB < j->in ? k0 + KCB : 0, nr0 = nk0 ? r0 : r1;
            int nr1 = nk0 ? r1 : (it + 1 < i1 ? (r1 + PITEM < j->out ? r1 + PITEM : j->out) : r1);
            int nkc = j->in - nk0 < KCB ? j->in - nk0 : KCB;
            for (int r = r0; r < r1; r++) {
                if (nr0 + (r - r0) < nr1) {
                    const char *b = (const char *)(w + (size_t)(nr0 + (r - r0)) * j->in + nk0);
                    for (int o = 0; o < nkc; o += 64) _mm_prefetch(b + o, _MM_HINT_T1);
                }
                pan8_row(w + (size_t)r * j->in + k0, st + k0 / 32, ns, PB + (size_t)(r - r0) * (KCB / 2), j->lut);
            }
            for (int t0 = 0; t0 < T; t0 += PC) {
                int C = T - t0 < PC ? T - t0 : PC;
                for (int q = 0; q < nr; q += PR) {
                    int R = nr - q < PR ? nr - q : PR;
                    mk_q[R - 1][C - 1](PB + (size_t)q * (KCB / 2), KCB / 2, j->ab + (size_t)t0 * j->ldab + k0 / 2, j->ldab,
                                       ns, acc + ((size_t)q * T + t0) * 16, T, k0 == 0);
                }
            }
        }
        ds41_fast_store_outs(acc, T, nr, j->y + r0, j->ys, 1);
    }
}

long long ds41_fast_fp8_bf16_tiles, ds41_fast_fp8_bf16_refused;

/* The FP8 linear of one tile of T tokens (9 <= T <= 64; weights w, 32 x 32 tile scale bytes s, in %
 * 32 == 0; rows [row0, row0 + out), row0 % 16 == 0) on vdpbf16ps: a the activations (Q8 values,
 * or the BF16 values of the dequantized FP8 linear; token stride lda); y[t ys + n] rounded to
 * BF16, the FMA road's bits. Returns 0, having written nothing to y, where the activations or
 * the scale bytes fall outside the conditions above. */
/* The conditions above, for rows [row0, row0 + out) of an FP8 linear (scale bytes s, in % 32 ==
 * 0; their range kept in srng across the call's tiles, call_range) against activations whose
 * exponents span [xmin, xmax]: 1 when the road may run */
static int fp8_fits(const uint8_t *s, int row0, int out, int in, int xmin, int xmax, int *srng) {
    int nbk = in / 32;
    call_range(s + (size_t)(row0 / 32) * nbk, (size_t)((row0 + out - 1) / 32 - row0 / 32 + 1) * nbk, srng);
    int smin = srng[0], smax = srng[1];
    return !ds41_fast_bf16_dguard ||
           (smin >= 10 && smax <= 246 && smin - 9 + xmin >= 142 && smax + 8 + xmax + lg_ceil(in) <= 378);
}

static int dense_fp8(const ds41_ctx *ctx, const uint8_t *w, const uint8_t *s, int row0, int out, int in, const float *a,
                     size_t lda, int T, float *y, size_t ys, const float *lut, int *srng) {
    size_t ldab = (size_t)in / 2;
    uint32_t *ab = ds41_scratch(DS41_SCR_LIN_AB, (size_t)T * ldab * sizeof(uint32_t));
    int xmin, xmax;
    if ((row0 & 15) || !ab || !acts_b(a, lda, T, in, ab, ldab, &xmin, &xmax, 1) ||
        !fp8_fits(s, row0, out, in, xmin, xmax, srng))
        goto refuse;
    ejob j = { w, s, row0, out, in, T, ab, ldab, y, ys, lut };
    int n_items = (out + PITEM - 1) / PITEM;
    if ((long long)out * in * T >= PAR_MIN_WORK) ds41_parallel_for(ctx, n_items, ejob_items, &j);
    else ejob_items(&j, 0, n_items);
    __atomic_fetch_add(&ds41_fast_fp8_bf16_tiles, 1, __ATOMIC_RELAXED);
    return 1;
refuse:
    __atomic_fetch_add(&ds41_fast_fp8_bf16_refused, 1, __ATOMIC_RELAXED);
    return 0;
}

/* ================================================================ FP4 in the canonical order, wide panels
 *
 * The FP4 linears' tiles of 9 .. 64 tokens on the canonical BF16 road (pan_fp4b + mk_b: the
 * int16 road's bits, the argument at the head of this file) in place of the mid kernels and
 * linear_fast.c's 32-row x 256-wide prefill panels: the dot order's DITEM-row x KCD-wide panels
 * and their walk (djob_items; 16 groups of 64 per micro-kernel call against 4, so the
 * accumulators are loaded and stored a quarter as often), every token of the tile through each
 * panel. The call is taken only where every scale
 * byte of the weights is in [1, 233] (pan_fp4b's range; dense_fp4 returns 0 otherwise and the
 * caller takes the int16 road, with the same bits). */
long long ds41_fast_fp4_wide_tiles;

static int dense_fp4(const ds41_ctx *ctx, const uint8_t *w, const uint8_t *s, int out, int in, const int16_t *ab,
                     size_t ldab, const float *sav, size_t ldsa, int T, float *y, size_t ys, int *srng) {
    call_range(s, (size_t)out * (in / 32), srng);
    if (srng[0] < 1 || srng[1] > 233) return 0;
    djob j = { w, s, out, in, T, NULL, 0, y, ys, ab, ldab, sav, ldsa };
    int n_items = (out + DITEM - 1) / DITEM;
    if ((long long)out * in * T >= PAR_MIN_WORK) ds41_parallel_for(ctx, n_items, djob_items, &j);
    else djob_items(&j, 0, n_items);
    __atomic_fetch_add(&ds41_fast_fp4_wide_tiles, 1, __ATOMIC_RELAXED);
    return 1;
}

/* ================================================================ FP8 few rows on vdpbf16ps
 *
 * The FP8 linears of T = 2 .. 8 tokens (the speculative verify blocks, small batches) on
 * vdpbf16ps, with the FMA road's bits by the argument of "FP8 on vdpbf16ps" above (the same
 * pairing of 32 m + l with 32 m + 16 + l, the same conditions on the scale bytes and the
 * activations, checked per call). Each weight row is streamed once for all T tokens, as the
 * few-row kernels do, and decoded in registers to bf16(e4m3 * s_tile): a byte permute puts
 * code l in the high byte of word 2 l + 1 and code 16 + l in that of word 2 l (sign at bit 15,
 * the magnitude code c at bits 8 .. 14); a normal code's BF16 word is (c << 4) + ((st - 7) <<
 * 7) (e4m3 exponent E, mantissa M: bf16 exponent E - 7 + 127 + st - 127, mantissa M << 4), the
 * codes below 8 (zero and the subnormals M * 2^-9) come from an 8-entry table rescaled per
 * 32-element block, and the sign goes back with one ternary op: eight instructions per 32
 * weights of a row, then one vdpbf16ps per token. The FMA road issues its decode, two FMAs
 * per token and, per 32-row item, the activations times the tile scales. A work item is one
 * 32-row scale tile. */
#define FITEM 32

/* bf16(e4m3(c)) for the codes c = 0 .. 7 (0 and the subnormals M * 2^-9), in a 32-word table */
static const uint16_t e4m3_sub[32] __attribute__((aligned(64))) = { 0x0000, 0x3B00, 0x3B80, 0x3BC0, 0x3C00, 0x3C20,
                                                                     0x3C40, 0x3C60 };

/* word 2 l + 1 <- byte l, word 2 l <- byte 16 + l, in the words' high bytes (low bytes zeroed) */
static const uint8_t perm_e4m3b[64] __attribute__((aligned(64))) = {
    0, 16, 0, 0, 0, 17, 0, 1, 0, 18, 0, 2, 0, 19, 0, 3, 0, 20, 0, 4, 0, 21, 0, 5, 0, 22, 0, 6, 0, 23, 0, 7,
    0, 24, 0, 8, 0, 25, 0, 9, 0, 26, 0, 10, 0, 27, 0, 11, 0, 28, 0, 12, 0, 29, 0, 13, 0, 30, 0, 14, 0, 31, 0, 15 };

#define MK_F8(R, C)                                                                                   \
    __attribute__((target("avx512vbmi"))) static void mk_f8_##R##_##C(                              \
        const uint8_t *w, size_t ld, int ns, const uint8_t *st, const uint32_t *ab, size_t ldab, float *out, int ldo) { \
        const __m512i pidx = _mm512_load_si512(perm_e4m3b), sgn = _mm512_set1_epi16((short)0x8000);  \
        const __m512i tsub = _mm512_load_si512(e4m3_sub), mag = _mm512_set1_epi16(0x07F0);          \
        const __m512i ehi = _mm512_set1_epi16(0x7800);                                            \
        __m512 c[R][C];                                                                           \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++) c[r][t] = _mm512_setzero_ps(); \
        for (int s = 0; s < ns; s++) {                                                            \
            if (!(s & 1)) ds41_pf_rows(w, ld, (size_t)32 * s + DPF8, R);                          \
            __m512i ex = _mm512_set1_epi16((short)((st[s] - 7) * 128));                           \
            __m512i sub = _mm512_mask_add_epi16(tsub, (__mmask32)0xFE, tsub,                      \
                                                _mm512_set1_epi16((short)((st[s] - 127) * 128))); \
            __m512bh a[C];                                                                        \
            UNROLL for (int t = 0; t < C; t++) a[t] = (__m512bh)_mm512_loadu_si512(ab + t * ldab + 16 * s); \
            UNROLL for (int r = 0; r < R; r++) {                                                  \
                __m512i x = _mm512_maskz_permutexvar_epi8(0xAAAAAAAAAAAAAAAAull, pidx,            \
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(w + r * ld + 32 * s)))); \
                __m512i v = _mm512_add_epi16(_mm512_and_si512(_mm512_srli_epi16(x, 4), mag), ex); \
                v = _mm512_mask_permutexvar_epi16(v, _mm512_testn_epi16_mask(x, ehi), _mm512_srli_epi16(x, 8), sub); \
                v = _mm512_ternarylogic_epi32(v, x, sgn, 0xF8);                                   \
                UNROLL for (int t = 0; t < C; t++) c[r][t] = _mm512_dpbf16_ps(c[r][t], (__m512bh)v, a[t]); \
            }                                                                                     \
        }                                                                                         \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++)                     \
            out[r * ldo + t] = ds41_bf16_round(hsum16(c[r][t]));                                  \
    }
#define DPF8 1024   /* prefetch distance per row stream, bytes */
#define MK_F8_C(C) MK_F8(1, C) MK_F8(2, C) MK_F8(4, C) MK_F8(8, C)
MK_F8_C(1) MK_F8_C(2) MK_F8_C(3) MK_F8_C(4) MK_F8_C(5) MK_F8_C(6) MK_F8_C(7) MK_F8_C(8)
typedef void (*mk_f8_fn)(const uint8_t *, size_t, int, const uint8_t *, const uint32_t *, size_t, float *, int);
#define MK_F8_ROW(C) { mk_f8_1_##C, mk_f8_2_##C, mk_f8_4_##C, mk_f8_8_##C }
static const mk_f8_fn mk_f8[8][4] = { MK_F8_ROW(1), MK_F8_ROW(2), MK_F8_ROW(3), MK_F8_ROW(4),
                                      MK_F8_ROW(5), MK_F8_ROW(6), MK_F8_ROW(7), MK_F8_ROW(8) };
/* the rows per call at C tokens (index into 1, 2, 4, 8): R C accumulators and C activations
 * within the 32 registers, beside the constants and the temporaries */
static const int mk_f8_ri[9] = { 0, 3, 3, 2, 2, 1, 1, 1, 1 };

typedef struct fjob8 {
    const uint8_t *w, *s;   /* the whole matrix: rows row0 .. row0 + out - 1 are this call's */
    int row0, out, in, T;
    const uint32_t *ab;
    size_t ldab;
    float *y;
    size_t ys;
} fjob8;

static void fjob8_items(void *arg, int i0, int i1) {
    const fjob8 *j = arg;
    int T = j->T, nbk = j->in / 32, ri = mk_f8_ri[T];
    float v[FITEM * 8];
    for (int it = i0; it < i1; it++) {
        int r0 = it * FITEM, r1 = r0 + FITEM < j->out ? r0 + FITEM : j->out;
        const uint8_t *st = j->s + (size_t)((j->row0 + r0) / 32) * nbk;
        for (int r = r0; r < r1;) {
            int q = ri;
            while (q > 0 && r + (1 << q) > r1) q--;
            mk_f8[T - 1][q](j->w + (size_t)(j->row0 + r) * j->in, (size_t)j->in, nbk, st, j->ab, j->ldab, v + (r - r0) * T, T);
            r += 1 << q;
        }
        for (int r = r0; r < r1; r++)
            for (int t = 0; t < T; t++) j->y[(size_t)t * j->ys + r] = v[(r - r0) * T + t];
    }
}

long long ds41_fast_fp8_few_tiles;

/* The FP8 linear of T = 1 .. 8 tokens on vdpbf16ps (the head of this part; linear_fast.c
 * calls it for T >= 2), rows [row0, row0 + out) of w (row0 % 32 == 0, so that an item is one
 * scale tile; else refused): a the Q8 activations, or the dequantized linear's BF16 ones (token
 * stride lda); y[t ys + n] rounded to BF16, the FMA road's bits. Returns 0, having written
 * nothing to y, where the activations or the scale bytes fall outside the conditions of "FP8
 * on vdpbf16ps". */
static int few_fp8(const ds41_ctx *ctx, const uint8_t *w, const uint8_t *s, int row0, int out, int in, const float *a,
                   size_t lda, int T, float *y, size_t ys, int *srng) {
    size_t ldab = (size_t)in / 2;
    uint32_t *ab = ds41_scratch(DS41_SCR_LIN_AB, (size_t)T * ldab * sizeof(uint32_t));
    int xmin, xmax;
    if (T < 1 || T > 8 || (row0 & 31) || !__builtin_cpu_supports("avx512vbmi") || !ab ||
        !acts_b(a, lda, T, in, ab, ldab, &xmin, &xmax, 1) || !fp8_fits(s, row0, out, in, xmin, xmax, srng))
        return 0;
    fjob8 j = { w, s, row0, out, in, T, ab, ldab, y, ys };
    int n_items = (out + FITEM - 1) / FITEM;
    if ((long long)out * in * T >= PAR_MIN_WORK) ds41_parallel_for(ctx, n_items, fjob8_items, &j);
    else fjob8_items(&j, 0, n_items);
    __atomic_fetch_add(&ds41_fast_fp8_few_tiles, 1, __ATOMIC_RELAXED);
    return 1;
}

static const ds41_fast_bf16 bf16_ops = { pan_fp4b, pf_fp4b, probe_ratio, dense_b, dot_fp4, dot_acts, dense_fp8, dense_fp4, few_fp8 };
const ds41_fast_bf16 *ds41_fast_bf16_avx512(void) { return &bf16_ops; }

#ifdef __clang__
#pragma clang attribute pop
#endif
