/* ds41 exact linears at speed: AVX2 kernels with double accumulation, bit-identical to the
 * scalar exact kernels of linear.c (exact-mode.md) for every finite input.
 *
 * Two implementations of the same sums: the panel passes below (T > 1, weights decoded once
 * into an L1 panel and reused over the tokens), and the T = 1 kernels further down (decode:
 * each weight read once, so no panel; their own comments give their arithmetic):
 *   FP4 on integers (512 * E4M3 code split hi / lo into int16, vpmaddwd against 2 e2m1:
 *     exact int32 block sums), FP8 straight to doubles by bit patterns (blocks without E4M3
 *     subnormals) or by the FP16 trick, four rows per pass with a lane-transposing reduction
 *     of the block dots; BF16 / FP32 / dequantized FP8 with rows in lanes, 8 or 16 rows per
 *     pass, weights transposed in registers (BF16 as 16-bit words), the dequantized FP8 of
 *     tiles whose scales keep bf16(e4m3 * s) exact as plain E4M3 against x * s.
 *
 * The contract sums, per output, products that are exact in double in increasing K order
 * (BF16 / FP32 / dequantized FP8), or adds per-block dot products that are themselves exact in
 * double in increasing block order (FP8 / FP4). Both are kept lane by lane: the four lanes of
 * a __m256d are four different output rows, each lane sees the scalar kernel's sequence of
 * additions. A double FMA is the scalar multiply-then-add here, because the product is exact
 * in double (BF16 x BF16: 16 significant bits, FP32 x FP32: 48, E4M3 / E2M1 x Q8: < 9), so
 * the FMA and the add of the exactly rounded product round the same sum once.
 *
 *   Weights: 16 output rows (a group: four row vectors of 4 lanes) x 128 K elements (a panel)
 *     are decoded to exact doubles once into an L1 panel laid out K-major (wt[k * 16 + r]: one
 *     aligned load gives rows r..r+3 at k), by decoding 4 rows x 8 K to floats, transposing
 *     4 x 4 per 128-bit half and widening. FP8 / FP4 panels carry the weight scale (a power of
 *     two, exact in double: FP8 e4m3 * 2^-8 from the FP16 trick times ue8m0 * 2^8, FP4 2 e2m1
 *     from the byte shuffle times ue8m0 / 2).
 *   Activations: doubles, one row per token; for FP8 / FP4 the Q8 values of ds41_q8_group
 *     times their group scale (e4m3 * s, exact in double), so that a block's products are
 *     q * w * s_a * s_w exactly and the block dot in any order is the scalar kernel's
 *     dot * s_a * s_w (the partial sums are exact: < 32 * 2^18 times the scale product, on a
 *     2^-18 grid of it, < 42 bits).
 *   Dense: acc_r = fma(w[r][k], x[k], acc_r) for k ascending, then FP32 (then BF16).
 *   Quantized: per block d_r = sum of its 32 products (in K order, exact anyway), then
 *     acc_r = acc_r + d_r for blocks ascending; then FP32, then BF16.
 *   Every accumulator starts at +0 as the scalar ones do, so signed zeros agree as well.
 *
 * T > 1 on an AVX-512 machine (the fast kernels' ISA, DS41_ISA=avx2 forces AVX2): the token
 * passes of linear_exact_avx512.c, 8 rows per zmm and 4 tokens per pass, the same operations
 * lane by lane.
 *
 * Few tokens (few_max: on AVX2 T <= 16 FP4, <= 4 FP8, <= 3 FP32, <= 2 BF16 / DQ; on AVX-512
 * T <= 8 FP4, <= 3 FP8, <= 4 DQ, <= 2 BF16): the T = 1 kernels below once per token (the same
 * sums, so the same bits), which stream each weight once per token but skip the panel's
 * decode-and-transpose; measured faster than the panel passes up to these T on a 2-core AMD
 * EPYC (FP4 x 16 tokens: 30 ms against 40 ms) and on an Intel Xeon (bench_kernels --exact
 * --T 1,2,3,4,8, 1 and 2 threads, ms per call: FP4 w1 T = 1 0.96 / 0.50, T = 2 on the panels
 * 8.1 / 4.0, T = 8 10.7 / 5.5; FP8 wo_b T = 1 5.2 / 3.4, T = 2 23.6 / 11.7, T = 4 24.0 / 13.4;
 * DQ wo_a T = 1 1.0 / 0.54, T = 4 4.8 / 3.0, T = 8 4.6 / 3.6; BF16 head T = 1 34.8 / 20.3,
 * T = 2 81 / 42; FP32 T = 2 already faster on the panels).
 *
 * Threads: work items are 16-row groups (32-row tiles for the T = 1 quantized kernels) split
 * statically (FP8 groups lie inside one 32-row scale tile); the result does not depend on the
 * split. Tokens: tiles of up to TT (tile_tokens), two tokens per pass over the panel (two independent sets of
 * chains). */
#include "linear_fast.h"
#include "formats.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define G 16              /* rows per group */
#define KE 128            /* K per panel */
#define TT 128           /* tokens per activation tile (each panel is decoded once per tile) */
#define TT_BYTES (8 << 20) /* ... within 8 MiB of doubles, at least 32 tokens */
#define PAR_MIN_WORK 65536LL

int ds41_exact_simd = 1;
long long ds41_exact_chain_rows;   /* rows that missed the certificate (tests check both paths run) */

enum { E_FP8, E_FP4, E_BF16, E_F32, E_DQ, E_DQF };

typedef struct ejob {
    int kind;
    const uint8_t *w, *s;      /* FP8 / FP4 / DQ codes and scales */
    const uint16_t *wb;
    const float *wf;
    int row0;                  /* DQ: absolute row of output 0 */
    int out, in, T;
    const double *ad;          /* T rows of in doubles */
    float *y;
    size_t y_stride;
    int out_bf16;
    int avx512;                /* token passes on AVX-512 (linear_exact_avx512.c) */
} ejob;

/* tokens per activation tile: up to TT, the tile's doubles within TT_BYTES (at least 32) */
static int tile_tokens(int T, int in) {
    long long fit = TT_BYTES / (8LL * (in > 0 ? in : 1));
    int tt = fit > TT ? TT : fit < 32 ? 32 : (int)fit;
    return T < tt ? T : tt;
}

/* the largest T that runs as T = 1 calls per token (see "Few tokens" above) */
static int few_max(int kind) {
    if (strcmp(ds41_kernels_isa(), "avx512"))
        return kind == E_FP4 ? 16 : kind == E_FP8 ? 4 : kind == E_F32 ? 3 : 2;
    return kind == E_FP4 ? 8 : kind == E_FP8 ? 3 : kind == E_DQ ? 4 : kind == E_BF16 ? 2 : 1;
}

static double ue8_tab[256];      /* ds41_ue8m0_to_f32 in double (val_init, before any kernel runs) */

/* 8 E4M3 codes -> e4m3 * 2^-8 (normal FP32) */
static inline __m256 e4m3x8_h(const uint8_t *p) {
    __m128i b = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(b, 7), _mm_set1_epi16((short)0xBFFF)));
}

/* float RNE to BF16 (finite values), as float */
static inline __m256 bf16_rne(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    u = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb);
    return _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32((int)0xFFFF0000)));
}

/* 4 rows x 8 K of floats -> wt[(k + j) * G + 4q .. + 3] for j < 8, as doubles times sc */
static inline void put4x8(double *wt, __m256 r0, __m256 r1, __m256 r2, __m256 r3, __m256d sc) {
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    __m256 u[4];
    u[0] = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
    u[1] = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    u[2] = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
    u[3] = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    for (int j = 0; j < 4; j++) {
        _mm256_store_pd(wt + j * G, _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(u[j])), sc));
        _mm256_store_pd(wt + (j + 4) * G, _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(u[j], 1)), sc));
    }
}

/* one row's 8 K elements at k as floats (without scales); valid rows only. kind is j->kind, a
 * compile-time constant in each instance of decode_panel */
static inline __attribute__((always_inline)) __m256 row8(const ejob *j, int kind, int r, int k) {
    size_t in = (size_t)j->in;
    switch (kind) {
    case E_FP8: return e4m3x8_h(j->w + (size_t)r * in + k);
    case E_DQ: {
        int ar = j->row0 + r, nbk = (j->in + 31) / 32;
        float sc = ds41_ue8m0_to_f32(j->s[(size_t)(ar / 32) * nbk + k / 32]);
        __m256 v = _mm256_mul_ps(e4m3x8_h(j->w + (size_t)ar * in + k), _mm256_set1_ps(256.0f));   /* exact */
        return bf16_rne(_mm256_mul_ps(v, _mm256_set1_ps(sc)));
    }
    case E_FP4: {
        const __m128i tab = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
        int32_t b4;
        memcpy(&b4, j->w + (size_t)r * (in / 2) + k / 2, 4);
        __m128i b = _mm_cvtsi32_si128(b4);
        __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F)), hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
        __m128i e = _mm_unpacklo_epi8(_mm_shuffle_epi8(tab, lo), _mm_shuffle_epi8(tab, hi));
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e));   /* 2 * e2m1 */
    }
    case E_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(j->wb + (size_t)r * in + k))), 16));
    default:
        return _mm256_loadu_ps(j->wf + (size_t)r * in + k);
    }
}

static inline double scalar_w(const ejob *j, int r, int k) {
    size_t in = (size_t)j->in;
    if (j->kind == E_BF16) return (double)ds41_bf16_to_f32(j->wb[(size_t)r * in + k]);
    return (double)j->wf[(size_t)r * in + k];
}

/* Decodes rows [g0, g0 + nr) x K [k0, k0 + kc) into wt (rows >= nr zero). */
static inline __attribute__((always_inline)) void decode_panel_k(const ejob *j, int kind, int g0, int nr, int k0, int kc,
                                                                double *wt) {
    int kv = kc & ~7;
    for (int q = 0; q < 4; q++) {
        int rb = g0 + 4 * q;
        int n = nr - 4 * q;
        if (n <= 0) {
            for (int k = 0; k < kc; k++) _mm256_store_pd(wt + (size_t)k * G + 4 * q, _mm256_setzero_pd());
            continue;
        }
        for (int k = 0; k < kv; k += 8) {
            int ka = k0 + k;
            __m256d sc = _mm256_set1_pd(1.0);
            if (kind == E_FP8) {
                int nbk = j->in / 32;
                sc = _mm256_set1_pd(ue8_tab[j->s[(size_t)(rb / 32) * nbk + ka / 32]] * 256.0);
            } else if (kind == E_FP4) {   /* in registers (the four scalar stores and vector load
                                            * of an earlier form stalled on store forwarding) */
                int nb = j->in / 32;
                const uint8_t *sp = j->s + (size_t)rb * nb + ka / 32;
                sc = _mm256_setr_pd(ue8_tab[sp[0]] * 0.5, n > 1 ? ue8_tab[sp[nb]] * 0.5 : 0.0,
                                    n > 2 ? ue8_tab[sp[2 * nb]] * 0.5 : 0.0, n > 3 ? ue8_tab[sp[3 * nb]] * 0.5 : 0.0);
            }
            __m256 z = _mm256_setzero_ps();
            __m256 r0 = row8(j, kind, rb, ka);
            __m256 r1 = n > 1 ? row8(j, kind, rb + 1, ka) : z;
            __m256 r2 = n > 2 ? row8(j, kind, rb + 2, ka) : z;
            __m256 r3 = n > 3 ? row8(j, kind, rb + 3, ka) : z;
            put4x8(wt + (size_t)k * G + 4 * q, r0, r1, r2, r3, sc);
        }
        for (int k = kv; k < kc; k++)   /* dense tails (BF16 / FP32 with in % 8 != 0) */
            for (int i = 0; i < 4; i++) wt[(size_t)k * G + 4 * q + i] = i < n ? scalar_w(j, rb + i, k0 + k) : 0.0;
    }
}

static void decode_panel_fp8(const ejob *j, int g0, int nr, int k0, int kc, double *wt) { decode_panel_k(j, E_FP8, g0, nr, k0, kc, wt); }
static void decode_panel_fp4(const ejob *j, int g0, int nr, int k0, int kc, double *wt) { decode_panel_k(j, E_FP4, g0, nr, k0, kc, wt); }
static void decode_panel_bf16(const ejob *j, int g0, int nr, int k0, int kc, double *wt) { decode_panel_k(j, E_BF16, g0, nr, k0, kc, wt); }
static void decode_panel_f32(const ejob *j, int g0, int nr, int k0, int kc, double *wt) { decode_panel_k(j, E_F32, g0, nr, k0, kc, wt); }
static void decode_panel_dq(const ejob *j, int g0, int nr, int k0, int kc, double *wt) { decode_panel_k(j, E_DQ, g0, nr, k0, kc, wt); }

static void decode_panel(const ejob *j, int g0, int nr, int k0, int kc, double *wt) {
    switch (j->kind) {
    case E_FP8: decode_panel_fp8(j, g0, nr, k0, kc, wt); break;
    case E_FP4: decode_panel_fp4(j, g0, nr, k0, kc, wt); break;
    case E_BF16: decode_panel_bf16(j, g0, nr, k0, kc, wt); break;
    case E_F32: decode_panel_f32(j, g0, nr, k0, kc, wt); break;
    default: decode_panel_dq(j, g0, nr, k0, kc, wt); break;
    }
}

/* dense: C tokens (1 or 2) over the panel; acc[t * G ..] */
static inline void dense_pass(const double *wt, int kc, const double *x0, const double *x1, double *a0, double *a1) {
    __m256d c0 = _mm256_load_pd(a0), c1 = _mm256_load_pd(a0 + 4), c2 = _mm256_load_pd(a0 + 8), c3 = _mm256_load_pd(a0 + 12);
    if (x1) {
        __m256d d0 = _mm256_load_pd(a1), d1 = _mm256_load_pd(a1 + 4), d2 = _mm256_load_pd(a1 + 8), d3 = _mm256_load_pd(a1 + 12);
        for (int k = 0; k < kc; k++) {
            const double *w = wt + (size_t)k * G;
            __m256d w0 = _mm256_load_pd(w), w1 = _mm256_load_pd(w + 4), w2 = _mm256_load_pd(w + 8), w3 = _mm256_load_pd(w + 12);
            __m256d xa = _mm256_broadcast_sd(x0 + k), xb = _mm256_broadcast_sd(x1 + k);
            c0 = _mm256_fmadd_pd(w0, xa, c0); c1 = _mm256_fmadd_pd(w1, xa, c1);
            c2 = _mm256_fmadd_pd(w2, xa, c2); c3 = _mm256_fmadd_pd(w3, xa, c3);
            d0 = _mm256_fmadd_pd(w0, xb, d0); d1 = _mm256_fmadd_pd(w1, xb, d1);
            d2 = _mm256_fmadd_pd(w2, xb, d2); d3 = _mm256_fmadd_pd(w3, xb, d3);
        }
        _mm256_store_pd(a1, d0); _mm256_store_pd(a1 + 4, d1); _mm256_store_pd(a1 + 8, d2); _mm256_store_pd(a1 + 12, d3);
    } else {
        for (int k = 0; k < kc; k++) {
            const double *w = wt + (size_t)k * G;
            __m256d xa = _mm256_broadcast_sd(x0 + k);
            c0 = _mm256_fmadd_pd(_mm256_load_pd(w), xa, c0); c1 = _mm256_fmadd_pd(_mm256_load_pd(w + 4), xa, c1);
            c2 = _mm256_fmadd_pd(_mm256_load_pd(w + 8), xa, c2); c3 = _mm256_fmadd_pd(_mm256_load_pd(w + 12), xa, c3);
        }
    }
    _mm256_store_pd(a0, c0); _mm256_store_pd(a0 + 4, c1); _mm256_store_pd(a0 + 8, c2); _mm256_store_pd(a0 + 12, c3);
}

/* quantized: per 32-block exact dots d (fresh +0 chains), then acc += d, blocks ascending */
static inline void quant_pass(const double *wt, int kc, const double *x0, const double *x1, double *a0, double *a1) {
    for (int b = 0; b < kc; b += 32) {
        __m256d c0 = _mm256_setzero_pd(), c1 = c0, c2 = c0, c3 = c0;
        if (x1) {
            __m256d d0 = _mm256_setzero_pd(), d1 = d0, d2 = d0, d3 = d0;
            for (int k = b; k < b + 32; k++) {
                const double *w = wt + (size_t)k * G;
                __m256d w0 = _mm256_load_pd(w), w1 = _mm256_load_pd(w + 4), w2 = _mm256_load_pd(w + 8), w3 = _mm256_load_pd(w + 12);
                __m256d xa = _mm256_broadcast_sd(x0 + k), xb = _mm256_broadcast_sd(x1 + k);
                c0 = _mm256_fmadd_pd(w0, xa, c0); c1 = _mm256_fmadd_pd(w1, xa, c1);
                c2 = _mm256_fmadd_pd(w2, xa, c2); c3 = _mm256_fmadd_pd(w3, xa, c3);
                d0 = _mm256_fmadd_pd(w0, xb, d0); d1 = _mm256_fmadd_pd(w1, xb, d1);
                d2 = _mm256_fmadd_pd(w2, xb, d2); d3 = _mm256_fmadd_pd(w3, xb, d3);
            }
            _mm256_store_pd(a1, _mm256_add_pd(_mm256_load_pd(a1), d0));
            _mm256_store_pd(a1 + 4, _mm256_add_pd(_mm256_load_pd(a1 + 4), d1));
            _mm256_store_pd(a1 + 8, _mm256_add_pd(_mm256_load_pd(a1 + 8), d2));
            _mm256_store_pd(a1 + 12, _mm256_add_pd(_mm256_load_pd(a1 + 12), d3));
        } else {
            /* one token: two chains per row vector (even / odd K; exact sums, any order) */
            __m256d e0 = _mm256_setzero_pd(), e1 = e0, e2 = e0, e3 = e0;
            for (int k = b; k < b + 32; k += 2) {
                const double *w = wt + (size_t)k * G;
                __m256d xa = _mm256_broadcast_sd(x0 + k), xb = _mm256_broadcast_sd(x0 + k + 1);
                c0 = _mm256_fmadd_pd(_mm256_load_pd(w), xa, c0); c1 = _mm256_fmadd_pd(_mm256_load_pd(w + 4), xa, c1);
                c2 = _mm256_fmadd_pd(_mm256_load_pd(w + 8), xa, c2); c3 = _mm256_fmadd_pd(_mm256_load_pd(w + 12), xa, c3);
                e0 = _mm256_fmadd_pd(_mm256_load_pd(w + G), xb, e0); e1 = _mm256_fmadd_pd(_mm256_load_pd(w + G + 4), xb, e1);
                e2 = _mm256_fmadd_pd(_mm256_load_pd(w + G + 8), xb, e2); e3 = _mm256_fmadd_pd(_mm256_load_pd(w + G + 12), xb, e3);
            }
            c0 = _mm256_add_pd(c0, e0); c1 = _mm256_add_pd(c1, e1); c2 = _mm256_add_pd(c2, e2); c3 = _mm256_add_pd(c3, e3);
        }
        _mm256_store_pd(a0, _mm256_add_pd(_mm256_load_pd(a0), c0));
        _mm256_store_pd(a0 + 4, _mm256_add_pd(_mm256_load_pd(a0 + 4), c1));
        _mm256_store_pd(a0 + 8, _mm256_add_pd(_mm256_load_pd(a0 + 8), c2));
        _mm256_store_pd(a0 + 12, _mm256_add_pd(_mm256_load_pd(a0 + 12), c3));
    }
}

static void ejob_items(void *arg, int i0, int i1) {
    const ejob *j = arg;
    int quant = j->kind == E_FP8 || j->kind == E_FP4;
    /* this thread's scratch (kernels.h), kept from call to call */
    double *wt = ds41_scratch(DS41_SCR_ITEM_P, (size_t)KE * G * sizeof(double));
    double *acc = ds41_scratch(DS41_SCR_ITEM_ACC, (size_t)j->T * G * sizeof(double));
    if (!wt || !acc) return;
    for (int it = i0; it < i1; it++) {
        int g0 = it * G, nr = j->out - g0 < G ? j->out - g0 : G;
        memset(acc, 0, (size_t)j->T * G * sizeof(double));
        for (int k0 = 0; k0 < j->in; k0 += KE) {
            int kc = j->in - k0 < KE ? j->in - k0 : KE;
            decode_panel(j, g0, nr, k0, kc, wt);
            if (j->avx512 && j->T > 1) {
                ds41_exact_panel_avx512(quant, wt, kc, j->ad + k0, (size_t)j->in, j->T, acc);
                continue;
            }
            for (int t = 0; t < j->T; t += 2) {
                const double *x0 = j->ad + (size_t)t * j->in + k0;
                const double *x1 = t + 1 < j->T ? x0 + j->in : NULL;
                double *a0 = acc + (size_t)t * G, *a1 = a0 + G;
                if (quant) quant_pass(wt, kc, x0, x1, a0, a1);
                else dense_pass(wt, kc, x0, x1, a0, a1);
            }
        }
        for (int t = 0; t < j->T; t++)
            for (int r = 0; r < nr; r++) {
                float v = (float)acc[(size_t)t * G + r];
                j->y[(size_t)t * j->y_stride + g0 + r] = (quant || j->out_bf16) ? ds41_bf16_round(v) : v;
            }
    }
}

static void ejob_run(const ds41_ctx *ctx, ejob *j) {
    j->avx512 = !strcmp(ds41_kernels_isa(), "avx512");
    int n_items = (j->out + G - 1) / G;
    if ((long long)j->out * j->in * j->T >= PAR_MIN_WORK) ds41_parallel_for(ctx, n_items, ejob_items, j);
    else ejob_items(j, 0, n_items);
}

static float e4m3_val[256];
static int32_t e4m3_i512[256];   /* e4m3 value * 512: an integer, |.| <= 229376 */
static float ue8_f[256];         /* ds41_ue8m0_to_f32 */
static pthread_once_t val_once = PTHREAD_ONCE_INIT;
static void val_init(void) {
    for (int c = 0; c < 256; c++) {
        e4m3_val[c] = ds41_e4m3_to_f32((uint8_t)c);
        float v = e4m3_val[c] * 512.0f;   /* exact: E4M3 values are multiples of 2^-9 */
        e4m3_i512[c] = v == v ? (int32_t)v : 0;   /* the NaN codes never come out of the quantizer */
        ue8_f[c] = ds41_ue8m0_to_f32((uint8_t)c);
        ue8_tab[c] = (double)ue8_f[c];
    }
}

#define PFD 1024          /* prefetch distance per weight row stream, bytes */
#define UNROLL4 _Pragma("GCC unroll 4")
#define UNROLL8 _Pragma("GCC unroll 8")

/* The certificate (see the certified dense rows below for the argument): 1 and the row's FP32
 * result in *f when [s - E, s + E] rounds to one FP32 value, E = K 2^-51 (B + K 2^-148) +
 * |s| 2^-50, B an upper bound of sum |w_k x_k| within a factor 1.07 */
static inline int cert_ok(int in, double s, double b, float *f) {
    double e = (double)in * 0x1p-51 * (b + (double)in * 0x1p-148) + fabs(s) * 0x1p-50;
    if (s != s || e != e || in >= (1 << 20)) return 0;
    float lo = (float)(s - e), hi = (float)(s + e);
    *f = lo;
    return ds41_f32_bits(lo) == ds41_f32_bits(hi);
}

/* ---- T = 1, FP8 / FP4: no panel. A decode step reads each weight once, so the panel's decode
 * and transpose (made for reuse over tokens) would cost more than the products; instead four
 * rows at a time stream their blocks, each block's four dots are formed in registers, reduced
 * to one vector (lane i = row i) and added to a __m256d accumulator (lane i = row i), blocks
 * ascending. The scale lookups are tables (ue8m0 as doubles), the activation's group scale is
 * folded into a per-block double.
 *
 * Activations: the Q8 of ds41_q8_group (through the SIMD ds41_fast_q8_row, q8_codes_row), as
 *   E4M3 code values v without the group scale s_a, which goes into a per-block double.
 * FP8: per row and block a chain (or two) of exact products (module comment: the partial sums
 *   are exact, so any order gives the same dot), the 4 rows' dots reduced across lanes with
 *   hadd (exact); the block's 4 dots d (each dot * 2^-8) times c_b = s_a * s_w * 2^8 (s_w of
 *   the row tile: one per 4 rows, the group lies in one 32-row tile), and
 *   acc = fma(d, c_b, acc) = acc + d * c_b rounded once, since d * c_b is exact (a power-of-two
 *   scaling in double range): the scalar kernel's acc += (dot * s_a) * s_w. Weights: blocks
 *   without zero-exponent codes as doubles e4m3 * 2^-1016 straight from the code bits against
 *   v * 2^1008 (fp8_blk4_d), the others (E4M3 subnormals would be double subnormals: slow) as
 *   e4m3 * 2^-8 floats by the FP16 trick, widened, against v (fp8_blk4_h).
 * FP4: integers. I = 512 v is an integer (E4M3 values are multiples of 2^-9), |I| <= 229376;
 *   I = 512 hi + lo with hi = I >> 9 (arithmetic), lo = I & 511, both int16. The weights
 *   2 e2m1 are int16 in -12..12 (byte shuffle, sign extension). vpmaddwd gives exact pair sums
 *   and the block integer B = 512 sum(w hi) + sum(w lo) = sum(2 e2m1 * 512 v) stays below
 *   32 * 12 * 229376 < 2^27 in every partial sum, so int32 holds it exactly, in any order:
 *   within a block the elements may be permuted freely, so the activation halves are stored per
 *   block as [even hi | even lo | odd hi | odd lo] (16 int16 each) to match the nibble order
 *   of the packed bytes. The block's exact dot is B * 2^-10; B (exact in double) times
 *   c = s_w * (s_a * 2^-10) (powers of two, exact) is the scalar kernel's dot * s_a * s_w;
 *   acc = fma(B, c, acc) as for FP8.
 * Then y = bf16(fp32(acc_r)) as the scalar kernel. Rows past the end (out % 4) repeat the last
 * row and are dropped. Work items are 32-row tiles. */
typedef struct e1job {
    const uint8_t *w, *s;
    int fp4, out, in;
    const double *ad, *ab;     /* FP8: code values a, and a * 2^1008 */
    const int16_t *aq;         /* FP4: 64 int16 per block */
    const double *sab;         /* per block: FP8 s_a * 2^8, FP4 s_a * 2^-10 */
    float *y;
    int cert8;                 /* FP8 on certified lanes (AVX-512 VBMI, e1_cert_tile) */
    int fp4z;                  /* FP4 8 rows per pass on zmm (ds41_exact_fp4_t1_avx512) */
} e1job;

/* lane i of the result = sum of the lanes of v_i (exact sums only) */
static inline __m256d hsum4x4(__m256d v0, __m256d v1, __m256d v2, __m256d v3) {
    __m256d h01 = _mm256_hadd_pd(v0, v1), h23 = _mm256_hadd_pd(v2, v3);
    return _mm256_add_pd(_mm256_permute2f128_pd(h01, h23, 0x20), _mm256_permute2f128_pd(h01, h23, 0x31));
}

static inline __m128i hsum4x8i(__m256i d0, __m256i d1, __m256i d2, __m256i d3) {
    __m256i t0 = _mm256_add_epi32(_mm256_unpacklo_epi32(d0, d1), _mm256_unpackhi_epi32(d0, d1));
    __m256i t1 = _mm256_add_epi32(_mm256_unpacklo_epi32(d2, d3), _mm256_unpackhi_epi32(d2, d3));
    __m256i u = _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1));
    return _mm_add_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
}

static inline void put4(const e1job *j, int r0, __m256d acc) {
    double a[4];
    _mm256_storeu_pd(a, acc);
    for (int i = 0; i < 4 && r0 + i < j->out; i++) j->y[r0 + i] = ds41_bf16_round((float)a[i]);
}

/* FP8 block of 4 rows, weights through the FP16 trick (e4m3 * 2^-8 floats, widened), the
 * activation code values a: lane i = row i's dot * 2^-8 */
static inline __m256d fp8_blk4_h(const uint8_t *const *p, size_t o, const double *a) {
    __m256d c0[4], c1[4];
    UNROLL4 for (int q = 0; q < 4; q++) {
        __m256d a0 = _mm256_load_pd(a + 8 * q), a1 = _mm256_load_pd(a + 8 * q + 4);
        UNROLL4 for (int r = 0; r < 4; r++) {
            __m256 f = e4m3x8_h(p[r] + o + 8 * q);
            __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(f)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));
            if (q == 0) { c0[r] = _mm256_mul_pd(lo, a0); c1[r] = _mm256_mul_pd(hi, a1); }
            else { c0[r] = _mm256_fmadd_pd(lo, a0, c0[r]); c1[r] = _mm256_fmadd_pd(hi, a1, c1[r]); }
        }
    }
    return hsum4x4(_mm256_add_pd(c0[0], c1[0]), _mm256_add_pd(c0[1], c1[1]),
                   _mm256_add_pd(c0[2], c1[2]), _mm256_add_pd(c0[3], c1[3]));
}

/* The same for blocks without zero-exponent E4M3 codes, weights decoded straight into doubles:
 * the double with bits sign << 63 | (c & 0x7F) << 49 is e4m3(c) * 2^-1016 for every code (the
 * E4M3 subnormals m 2^-9 land on double subnormals, which cost a microcode-speed FMA on this
 * core, hence the test); times a * 2^1008 (the activation array ab) the products are again
 * e4m3 * a * 2^-8, exact, normal. The patterns come from byte vectors t1 = c + c (the 7
 * magnitude bits, shifted left once) and t2 = c & 0x80, interleaved (t1 at byte 6, t2 at byte 7
 * of each qword) by three unpack levels with zero; that puts elements 2v, 2v + 1, 16 + 2v,
 * 17 + 2v in vector v, and ab is stored in that order per block. The block test shares t1:
 * a code has a zero exponent field iff t1 < 16 (zeros too: rare, and merely slower). */
#define AINL static inline __attribute__((always_inline))

/* nonzero when the block of the 4 rows holds a code with a zero exponent field */
AINL int fp8_zero_exp(const uint8_t *const *p, size_t o) {
    __m256i t[4];
    UNROLL4 for (int r = 0; r < 4; r++) {
        __m256i c = _mm256_loadu_si256((const __m256i *)(p[r] + o));
        t[r] = _mm256_add_epi8(c, c);
    }
    __m256i mn = _mm256_min_epu8(_mm256_min_epu8(t[0], t[1]), _mm256_min_epu8(t[2], t[3]));
    __m256i lt = _mm256_subs_epu8(_mm256_set1_epi8(16), mn);
    return !_mm256_testz_si256(lt, lt);
}

/* one row's block: the 4 lanes of its exact dot (times 2^-8) */
AINL __m256d fp8_row_d(const uint8_t *pr, const double *ab) {
    const __m256i z = _mm256_setzero_si256();
    __m256i c = _mm256_loadu_si256((const __m256i *)pr);
    __m256i t1 = _mm256_add_epi8(c, c), t2 = _mm256_and_si256(c, _mm256_set1_epi8((char)0x80));
    __m256i wl = _mm256_unpacklo_epi8(t1, t2), wh = _mm256_unpackhi_epi8(t1, t2);
    __m256i dw[4] = { _mm256_unpacklo_epi16(z, wl), _mm256_unpackhi_epi16(z, wl),
                      _mm256_unpacklo_epi16(z, wh), _mm256_unpackhi_epi16(z, wh) };
    /* two chains of four (the block's sum is exact in any order: 8-bit products within 2^39
     * of each other, 32 of them) */
    __m256d acc = _mm256_mul_pd(_mm256_castsi256_pd(_mm256_unpacklo_epi32(z, dw[0])), _mm256_load_pd(ab));
    __m256d acc2 = _mm256_mul_pd(_mm256_castsi256_pd(_mm256_unpackhi_epi32(z, dw[0])), _mm256_load_pd(ab + 4));
    UNROLL4 for (int i = 1; i < 4; i++) {
        acc = _mm256_fmadd_pd(_mm256_castsi256_pd(_mm256_unpacklo_epi32(z, dw[i])), _mm256_load_pd(ab + 8 * i), acc);
        acc2 = _mm256_fmadd_pd(_mm256_castsi256_pd(_mm256_unpackhi_epi32(z, dw[i])), _mm256_load_pd(ab + 8 * i + 4), acc2);
    }
    return _mm256_add_pd(acc, acc2);
}

AINL __m256d fp8_blk4_d(const uint8_t *const *p, size_t o, const double *ab) {
    __m256d h01 = _mm256_hadd_pd(fp8_row_d(p[0] + o, ab), fp8_row_d(p[1] + o, ab));
    __m256d h23 = _mm256_hadd_pd(fp8_row_d(p[2] + o, ab), fp8_row_d(p[3] + o, ab));
    return _mm256_add_pd(_mm256_permute2f128_pd(h01, h23, 0x20), _mm256_permute2f128_pd(h01, h23, 0x31));
}

static __attribute__((noinline)) __m256d fp8_blk4_h_ool(const uint8_t *const *p, size_t o, const double *a) {
    return fp8_blk4_h(p, o, a);
}

/* rows[0 .. n) (n <= 4) of one 32-row tile, blocks ascending (the contract's order) */
static void e1_fp8_group(const e1job *j, const int *rows, int n, const double *scl) {
    int nb = j->in / 32;
    const uint8_t *p[4];
    for (int i = 0; i < 4; i++) p[i] = j->w + (size_t)rows[i < n ? i : n - 1] * j->in;
    __m256d acc = _mm256_setzero_pd();
    for (int b = 0; b < nb; b++) {
        const size_t o = (size_t)b * 32;
        if (!(b & 1)) UNROLL4 for (int r = 0; r < 4; r++) ds41_pf_row(p[r], (size_t)j->in, o + PFD, 4);
        __m256d d = __builtin_expect(fp8_zero_exp(p, o), 0) ? fp8_blk4_h_ool(p, o, j->ad + o) : fp8_blk4_d(p, o, j->ab + o);
        acc = _mm256_fmadd_pd(d, _mm256_broadcast_sd(scl + b), acc);
    }
    double a[4];
    _mm256_storeu_pd(a, acc);
    for (int i = 0; i < n; i++) j->y[rows[i]] = ds41_bf16_round((float)a[i]);
}

/* FP4 rows r0 .. r0 + n - 1 (past the end: the last row): packed codes p[i], scales sr[i] */
static void fp4_rows(const e1job *j, int r0, int n, const uint8_t **p, const uint8_t **sr) {
    for (int i = 0; i < n; i++) {
        size_t r = (size_t)(r0 + i < j->out ? r0 + i : j->out - 1);
        p[i] = j->w + r * (size_t)(j->in / 2);
        sr[i] = j->s + r * (size_t)(j->in / 32);
    }
}

static void e1_fp4_group(const e1job *j, int r0) {
    int nb = j->in / 32;
    const __m128i tab = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i m = _mm_set1_epi8(0x0F);
    const uint8_t *p[4], *sr[4];
    fp4_rows(j, r0, 4, p, sr);
    __m256d acc = _mm256_setzero_pd();
    for (int b = 0; b < nb; b++) {
        const int16_t *q = j->aq + (size_t)b * 64;
        const size_t o = (size_t)b * 16;
        if (!(b & 3)) UNROLL4 for (int r = 0; r < 4; r++) ds41_pf_row(p[r], (size_t)j->in / 2, o + PFD, 4);
        __m256i aeh = _mm256_load_si256((const __m256i *)q), ael = _mm256_load_si256((const __m256i *)(q + 16));
        __m256i aoh = _mm256_load_si256((const __m256i *)(q + 32)), aol = _mm256_load_si256((const __m256i *)(q + 48));
        __m256i d[4];
        UNROLL4 for (int r = 0; r < 4; r++) {
            __m128i v = _mm_loadu_si128((const __m128i *)(p[r] + o));
            __m256i we = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(tab, _mm_and_si128(v, m)));
            __m256i wo = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(tab, _mm_and_si128(_mm_srli_epi16(v, 4), m)));
            __m256i h = _mm256_add_epi32(_mm256_madd_epi16(we, aeh), _mm256_madd_epi16(wo, aoh));
            __m256i l = _mm256_add_epi32(_mm256_madd_epi16(we, ael), _mm256_madd_epi16(wo, aol));
            d[r] = _mm256_add_epi32(_mm256_slli_epi32(h, 9), l);
        }
        __m256d bi = _mm256_cvtepi32_pd(hsum4x8i(d[0], d[1], d[2], d[3]));
        __m256d sw = _mm256_setr_pd(ue8_tab[sr[0][b]], ue8_tab[sr[1][b]], ue8_tab[sr[2][b]], ue8_tab[sr[3][b]]);
        acc = _mm256_fmadd_pd(bi, _mm256_mul_pd(sw, _mm256_broadcast_sd(j->sab + b)), acc);
    }
    put4(j, r0, acc);
}

/* the same on zmm (AVX-512): rows r0 .. r0 + 7, past the end repeating the last row; c8: nb x 8
 * doubles of scratch for the blocks' scale products s_w * sab[b] (the AVX2 kernel's product) */
static void e1_fp4_group8(const e1job *j, int r0, double *c8) {
    int nb = j->in / 32;
    const uint8_t *p[8], *sr[8];
    fp4_rows(j, r0, 8, p, sr);
    ds41_exact_fp4_scales_avx512(sr, nb, j->sab, ue8_tab, c8);
    double a[8];
    ds41_exact_fp4_t1_avx512(p, nb, (size_t)j->in / 2, j->aq, c8, a);
    for (int i = 0; i < 8 && r0 + i < j->out; i++) j->y[r0 + i] = ds41_bf16_round((float)a[i]);
}

/* FP8 tiles on certified lanes (AVX-512 VBMI; the argument of the certified dense rows below,
 * for the contract's FP8 order: |s_seq - S| <= gamma_{nb} B and |s - S| <= gamma_K B, within
 * E): per 32-row tile xs[k] = a_k * s_a * s_w * 2^1016 (the code value times the block's scales,
 * exact), so that the lane sum of e4m3 * 2^-1016 * xs[k] is the row's value; B = the row's
 * largest |e4m3| times sum |a_k s_a s_w| (a looser bound than the dense rows' FP32 sum, but
 * nearly free: one byte max per 64 codes; the sum from per-block sums of |a_k s_a| times the
 * tile's s_w, e1_cert_prep). Rows that miss the certificate, or hold a NaN code
 * (0x7F), run the blocks in order (e1_fp8_group). Returns 0, leaving the tile to e1_fp8_group,
 * when an xs is not finite or its 2^1016 scaling is out of double range. */
/* per call (thread): base[k] = a_k s_a 2^1016, and per block the sum and the largest of |a_k s_a| */
typedef struct e1cert { double *base, *abs_sum, *abs_max, *xs; } e1cert;

static void e1_cert_prep(const e1job *j, e1cert *c) {
    for (int b = 0; b < j->in / 32; b++) {
        double sa = j->sab[b] * 0x1p-8, sum = 0.0, mx = 0.0;
        for (int i = 0; i < 32; i++) {
            double v = fabs(j->ad[32 * b + i] * sa);
            sum += v;
            mx = v > mx ? v : mx;
            c->base[32 * b + i] = j->ad[32 * b + i] * j->sab[b] * 0x1p1008;
        }
        c->abs_sum[b] = sum;
        c->abs_max[b] = mx;
    }
}

/* Rows r .. r + nr - 1 (nr <= 4) of w (row stride in) on the FP8 certified lanes against xs =
 * the activations times their scales times 2^1016, sx = sum |x s| (the bound's factor): a
 * certified row's value goes to y[row] (BF16-rounded), the others to fail[(*nf)++] */
static void cert_fp8_pass4(const uint8_t *w, int in, int r, int nr, const double *xs, double sx, float *y, int *fail,
                           int *nf) {
    const int kv = in & ~63;
    const uint8_t *p[4];
    for (int q = 0; q < 4; q++) p[q] = w + (size_t)(r + (q < nr ? q : nr - 1)) * in;
    double s4[4];
    int mx[4];
    ds41_exact_cert_fp8_avx512(p, kv, xs, s4, mx);
    for (int q = 0; q < nr; q++) {
        double s = s4[q];
        int m = mx[q] >> 1;
        for (int k = kv; k < in; k++) {   /* K tail: any order */
            uint8_t c = p[q][k];
            s += (double)e4m3_val[c] * (xs[k] * 0x1p-1016);
            m = (c & 0x7F) > m ? (c & 0x7F) : m;
        }
        float f;
        if (m != 0x7F && cert_ok(in, s, (double)e4m3_val[m] * sx, &f)) y[r + q] = ds41_bf16_round(f);
        else fail[(*nf)++] = r + q;
    }
}

static int e1_cert_tile(const e1job *j, int r0, int r1, const uint8_t *st, const double *scl, const e1cert *c) {
    const int in = j->in;
    double sx = 0.0, mxs = 0.0, *xs = c->xs;
    for (int b = 0; b < in / 32; b++) {
        double sw = ue8_tab[st[b]];
        sx += c->abs_sum[b] * sw;
        mxs = c->abs_max[b] * sw > mxs ? c->abs_max[b] * sw : mxs;
        for (int i = 0; i < 32; i++) xs[32 * b + i] = c->base[32 * b + i] * sw;   /* a s_a s_w 2^1016, exact */
    }
    if (!(sx <= 0x1p1000) || !(mxs < 0x1p6)) return 0;
    int fail[32], nf = 0;
    for (int r = r0; r < r1; r += 4) cert_fp8_pass4(j->w, in, r, r1 - r < 4 ? r1 - r : 4, xs, sx, j->y, fail, &nf);
    if (nf) __atomic_fetch_add(&ds41_exact_chain_rows, nf, __ATOMIC_RELAXED);
    for (int i = 0; i < nf; i += 4) e1_fp8_group(j, fail + i, nf - i < 4 ? nf - i : 4, scl);
    return 1;
}

static void e1_rows(void *arg, int i0, int i1) {
    const e1job *j = arg;
    int nb = j->in / 32;
    /* FP8: the blocks' scale products; FP4 on zmm: e1_fp4_group8's c8; FP4 on AVX2: none */
    int need = !j->fp4 || j->fp4z;
    double *scl = need ? ds41_scratch(DS41_SCR_ITEM_SW, (size_t)nb * (j->fp4z ? 8 : 1) * sizeof(double)) : NULL;
    e1cert ce = { NULL, NULL, NULL, NULL };
    double *cbuf = j->fp4 || !j->cert8 ? NULL : ds41_scratch(DS41_SCR_ITEM_A2, (size_t)(2 * j->in + 2 * nb) * sizeof(double));
    if ((need && !scl) || (j->cert8 && !cbuf)) return;
    if (cbuf) {
        ce = (e1cert){ cbuf, cbuf + j->in, cbuf + j->in + nb, cbuf + j->in + 2 * nb };
        e1_cert_prep(j, &ce);
    }
    for (int t = i0; t < i1; t++) {
        int r1 = (t + 1) * 32 < j->out ? (t + 1) * 32 : j->out;
        if (!j->fp4) {
            const uint8_t *st = j->s + (size_t)t * nb;
            for (int b = 0; b < nb; b++) scl[b] = j->sab[b] * ue8_tab[st[b]];
        }
        if (cbuf && e1_cert_tile(j, t * 32, r1, j->s + (size_t)t * nb, scl, &ce)) continue;
        if (j->fp4z) {
            for (int r0 = t * 32; r0 < r1; r0 += 8) e1_fp4_group8(j, r0, scl);
            continue;
        }
        for (int r0 = t * 32; r0 < r1; r0 += 4) {
            if (j->fp4) e1_fp4_group(j, r0);
            else {
                int rows[4] = { r0, r0 + 1, r0 + 2, r0 + 3 };
                e1_fp8_group(j, rows, r1 - r0 < 4 ? r1 - r0 : 4, scl);
            }
        }
    }
}

/* The Q8 of one activation row (ds41_q8_group per 32) as E4M3 code values cv and scales sa:
 * ds41_fast_q8_row gives code * s (tested bit-identical to ds41_q8_group), s comes from the
 * group's amax as ds41_q8_group takes it, and code = (code * s) * (1 / s) exactly (s a power of
 * two in 2^-22 .. 2^118 here). Groups with amax above 2^126 (where code * s can overflow FP32)
 * or a NaN take ds41_q8_group itself. */
static void q8_codes_row(const float *x, int in, float *cv, float *sa) {
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    ds41_fast_q8_row(x, in, 1.0f, cv);
    for (int b = 0; b < in / 32; b++) {
        const float *xb = x + 32 * b;
        __m256 mx = _mm256_setzero_ps();
        for (int q = 0; q < 4; q++) mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(xb + 8 * q), absm));
        float m8[8], amax = 0.0f;
        _mm256_storeu_ps(m8, mx);
        for (int i = 0; i < 8; i++) amax = m8[i] > amax ? m8[i] : amax;
        int nan = 0;
        for (int i = 0; i < 32; i++) nan |= xb[i] != xb[i];
        if (nan || amax > 0x1p126f) {
            uint8_t codes[32], sb;
            sa[b] = ds41_q8_group(xb, 32, codes, &sb);
            for (int i = 0; i < 32; i++) cv[32 * b + i] = e4m3_val[codes[i]];
            continue;
        }
        float sc = ds41_pow2ceil(amax < 1e-4f ? 1e-4f : amax, ds41_bits_f32(DS41_INV448_BITS));
        __m256 inv = _mm256_set1_ps(1.0f / sc);
        for (int q = 0; q < 4; q++) _mm256_storeu_ps(cv + 32 * b + 8 * q, _mm256_mul_ps(_mm256_loadu_ps(cv + 32 * b + 8 * q), inv));
        sa[b] = sc;
    }
}

void ds41_exact_qlin(const ds41_ctx *ctx, const uint8_t *w, const uint8_t *s, int fp4, int out, int in,
                     const float *x, int T, float *y) {
    pthread_once(&val_once, val_init);
    if (T > 1 && T <= few_max(fp4 ? E_FP4 : E_FP8)) {   /* few tokens */
        for (int t = 0; t < T; t++) ds41_exact_qlin(ctx, w, s, fp4, out, in, x + (size_t)t * in, 1, y + (size_t)t * out);
        return;
    }
    if (T == 1) {
        int nb = in / 32;
        double *ad = ds41_scratch(DS41_SCR_LIN_A, (size_t)(2 * in + 2 * nb) * sizeof(double));
        int16_t *aq = fp4 ? ds41_scratch(DS41_SCR_LIN_AW, (size_t)in * 2 * sizeof(int16_t)) : NULL;
        if (!ad || (fp4 && !aq)) return;
        double *ab = ad + in, *sab = ad + 2 * in;
        float *cv = (float *)ab, *saf = (float *)(sab + nb);   /* cv: read below before ab is written */
        q8_codes_row(x, in, cv, saf);
        for (int b = 0; b < nb; b++) {
            double sa = (double)saf[b];
            if (fp4) {
                int16_t *q = aq + (size_t)b * 64;
                for (int i = 0; i < 32; i++) {
                    int32_t v = (int32_t)(cv[32 * b + i] * 512.0f);   /* exact */
                    int h = i & 1, e = i >> 1;
                    q[32 * h + e] = (int16_t)(v >> 9);
                    q[32 * h + 16 + e] = (int16_t)(v & 511);
                }
                sab[b] = sa * 0x1p-10;
            } else {
                for (int i = 0; i < 32; i++) ad[32 * b + i] = (double)cv[32 * b + i];
                sab[b] = sa * 256.0;
            }
        }
        if (!fp4)
            for (int k = 0; k < in; k++) {   /* element i of a block sits in vector v, lane (i & 1) + 2 (i >> 4) */
                int i = k & 31, v = (i & 15) >> 1;
                ab[(k & ~31) + 4 * v + (i & 1) + 2 * (i >> 4)] = ad[k] * 0x1p1008;
            }
        int z = !strcmp(ds41_kernels_isa(), "avx512");
        e1job j = { w, s, fp4, out, in, ad, ab, aq, sab, y, !fp4 && z && __builtin_cpu_supports("avx512vbmi"), fp4 && z };
        int n_items = (out + 31) / 32;
        if ((long long)out * in >= PAR_MIN_WORK) ds41_parallel_for(ctx, n_items, e1_rows, &j);
        else e1_rows(&j, 0, n_items);
        return;
    }
    int tt = tile_tokens(T, in);
    double *ad = ds41_scratch(DS41_SCR_LIN_A, (size_t)tt * in * sizeof(double));
    if (!ad) return;
    for (int t0 = 0; t0 < T; t0 += tt) {
        int nt = T - t0 < tt ? T - t0 : tt;
        for (int t = 0; t < nt; t++) {
            const float *xr = x + (size_t)(t0 + t) * in;
            double *o = ad + (size_t)t * in;
            uint8_t codes[32], sb;
            for (int k0 = 0; k0 < in; k0 += 32) {
                double sa = (double)ds41_q8_group(xr + k0, 32, codes, &sb);
                for (int i = 0; i < 32; i++) o[k0 + i] = (double)e4m3_val[codes[i]] * sa;
            }
        }
        ejob j = { fp4 ? E_FP4 : E_FP8, w, s, NULL, NULL, 0, out, in, nt, ad, y + (size_t)t0 * out, (size_t)out, 1, 0 };
        ejob_run(ctx, &j);
    }
}

/* ---- T = 1, BF16 / FP32 / dequantized FP8: no panel either. Q row quads per pass (Q = 2: 8 rows,
 * Q = 4: 16 rows for the DQ tiles that decode and round, fewer for a short last group), lane i
 * of chain q = row 4 q + i; each 8-K chunk of 4
 * rows is loaded (BF16 widened by a shift, DQ decoded and rounded to BF16 as the scalar
 * converter does), transposed in registers and widened, then acc = fma(w, x[k], acc) for k
 * ascending: the scalar kernel's sequence per row (the products are exact in double, so the
 * FMA rounds as its add); K tails after, in order. The kind and the quad count are
 * compile-time constants of each instance. Rows past the end repeat the last row and are
 * dropped. */
typedef struct d1job {
    int kind;
    const uint16_t *wb;
    const float *wf;
    const uint8_t *w8, *s8;
    int row0, out, in;
    const double *x;
    const float *xa;           /* |x| as FP32 (the certified rows' bound) */
    float *y;
    int out_bf16;
    int avx512;                /* the certified lanes on zmm */
    int vbmi;                  /* DQ tiles on the FP8 certified lanes (AVX-512 VBMI) */
    const double *xp;          /* BF16 on AVX2: x * 2^896 in bf16_d4's order (cert_pass_avx2), and */
    const float *xap;          /* |x| in the bound's pair order (per 16: the 8 even elements, then
                                * the 8 odd ones), or NULL */
} d1job;

static inline __attribute__((always_inline)) __m256 d1_ld(int kind, const void *p, const uint8_t *srow, int k) {
    if (kind == E_F32) return _mm256_loadu_ps((const float *)p + k);
    __m256 v = _mm256_mul_ps(e4m3x8_h((const uint8_t *)p + k), _mm256_set1_ps(256.0f));   /* exact */
    return bf16_rne(_mm256_mul_ps(v, _mm256_set1_ps(ue8_f[srow[k >> 5]])));
}

static inline double d1_scalar(const d1job *d, int r, int k) {
    if (d->kind == E_F32) return (double)d->wf[(size_t)r * d->in + k];
    int ar = d->row0 + r;
    return (double)ds41_bf16_round(e4m3_val[d->w8[(size_t)ar * d->in + k]] * ue8_f[d->s8[(size_t)(ar / 32) * ((d->in + 31) / 32) + k / 32]]);
}

static inline __attribute__((always_inline)) void d1_group(const d1job *d, int g0, int kind, int nq, const double *x) {
    const int in = d->in, kv = in & ~7, esz = kind == E_F32 ? 4 : 1;
    const int pfm = kind == E_F32 ? 15 : 63;   /* one prefetch per 64 bytes */
    const char *p[16];
    const uint8_t *sr[16];
    for (int i = 0; i < 4 * nq; i++) {
        int r = g0 + i < d->out ? g0 + i : d->out - 1;
        int ar = kind == E_DQ ? d->row0 + r : r;
        p[i] = (kind == E_F32 ? (const char *)d->wf : (const char *)d->w8) + (size_t)ar * in * esz;
        sr[i] = kind == E_DQ ? d->s8 + (size_t)(ar / 32) * ((in + 31) / 32) : NULL;
    }
    __m256d acc[4];
    UNROLL4 for (int q = 0; q < nq; q++) acc[q] = _mm256_setzero_pd();
    for (int k = 0; k < kv; k += 8) {
        if (!(k & pfm))
            UNROLL8 for (int i = 0; i < 4 * nq; i++) _mm_prefetch(p[i] + (size_t)k * esz + PFD, _MM_HINT_T0);
        __m256d xb[8];
        UNROLL8 for (int m = 0; m < 8; m++) xb[m] = _mm256_broadcast_sd(x + k + m);
        UNROLL4 for (int q = 0; q < nq; q++) {
            __m256 r0 = d1_ld(kind, p[4 * q], sr[4 * q], k), r1 = d1_ld(kind, p[4 * q + 1], sr[4 * q + 1], k);
            __m256 r2 = d1_ld(kind, p[4 * q + 2], sr[4 * q + 2], k), r3 = d1_ld(kind, p[4 * q + 3], sr[4 * q + 3], k);
            __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
            __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
            __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)), u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
            __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)), u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
            /* u_m: K offset m (low half), m + 4 (high half) */
            __m256d c = acc[q];
            c = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(u0)), xb[0], c);
            c = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(u1)), xb[1], c);
            c = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(u2)), xb[2], c);
            c = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(u3)), xb[3], c);
            c = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(u0, 1)), xb[4], c);
            c = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(u1, 1)), xb[5], c);
            c = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(u2, 1)), xb[6], c);
            c = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(u3, 1)), xb[7], c);
            acc[q] = c;
        }
    }
    double a[16];
    for (int q = 0; q < nq; q++) _mm256_storeu_pd(a + 4 * q, acc[q]);
    for (int r = 0; r < 4 * nq && g0 + r < d->out; r++) {
        double v = a[r];
        for (int k = kv; k < in; k++) v += d1_scalar(d, g0 + r, k) * d->x[k];
        float f = (float)v;
        d->y[g0 + r] = d->out_bf16 ? ds41_bf16_round(f) : f;
    }
}

#define D1_INST(K, NAME)                                                                              \
    static void NAME##_1(const d1job *d, int g0, const double *x) { d1_group(d, g0, K, 1, x); }      \
    static void NAME##_2(const d1job *d, int g0, const double *x) { d1_group(d, g0, K, 2, x); }
D1_INST(E_F32, d1f)
D1_INST(E_DQ, d1q)
static void d1q_4(const d1job *d, int g0, const double *x) { d1_group(d, g0, E_DQ, 4, x); }

/* ---- T = 1, dense kinds (BF16, FP32, the exact-product DQ tiles): certified lanes. The
 * contract's sum of one row is the chain acc = acc + w_k x_k, k ascending, one rounding per
 * step (s_seq). Summed with the lanes along K instead (any order: s), the exact products give
 * two sums within 2 gamma_{K-1} B of each other, B = sum |w_k x_k| (each order is within
 * gamma_{K-1} B of the exact sum; gamma_n = n u / (1 - n u), u = 2^-53). B is bounded from
 * above by its FP32 sum Bf of |w| |x| (FMA chains in lanes): for K < 2^20 the FP32 sum is
 * within a factor 1.07 of B, plus K 2^-149 for products that land below the FP32 normals.
 * So with E = K 2^-49 (Bf + K 2^-148) + |s| 2^-50 (four times the bound, plus the rounding of
 * s +- E in double), s_seq lies in [s - E, s + E]; when both ends round to the same FP32 bits
 * (round-to-nearest is monotonic), every value between does, so fl32(s_seq) is those bits
 * and the row is done without its chain. Otherwise (cancellation near a rounding boundary,
 * a zero result, an inf or NaN anywhere: about 0.1 - 1 % of rows on random data) the row runs
 * the chain itself, scalar, in K order: the scalar kernel's bits either way. This trades the
 * rows-in-lanes transposes and the FMA latency chain (one FMA per element per row, in order)
 * for independent accumulators. */

#define CERT_RMAX 16

typedef struct cjob {
    int kind;                  /* E_BF16, E_DQF */
    const uint16_t *wb;
    const uint8_t *w8;         /* E_DQF: the row block's codes (absolute rows) */
    int out, in;
    const double *x;           /* E_DQF: x * s * 2^8 of the tile */
    const float *xa;           /* |x| as FP32 */
    float *y;
    int out_bf16;
    int avx512;                /* the lanes on zmm (ds41_exact_cert_avx512) */
    const double *xp;          /* BF16 on AVX2: x * 2^896 in bf16_d4's order, |x| in the pair order (d1job) */
    const float *xap;
} cjob;

/* 16 weights of one row at k as two FP32 vectors (BF16 widened; E_DQF: e4m3 * 2^-8, the FP16 trick) */
AINL void cert_ld16(int kind, const void *row, int k, __m256 *w0, __m256 *w1) {
    if (kind == E_BF16) {
        __m256i raw = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + k));
        *w0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(raw)), 16));
        *w1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(raw, 1)), 16));
    } else {
        __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)((const uint8_t *)row + k)));
        __m256i h = _mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16((short)0xBFFF));
        *w0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
        *w1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    }
}

/* BF16 weights straight into doubles for the certified lanes (AVX2): qword m of 128-bit lane l
 * of vector j (0 .. 3) gets element 8 l + 2 j + m of the 16 at its top 16 bits by one in-lane
 * byte shuffle; an arithmetic shift of the dwords by 3 and the mask 0x8FFFE000 00000000 leave the
 * sign in bit 63 and the BF16 exponent and mantissa in bits 59..45: the double w * 2^-896 (BF16
 * subnormals land on double subnormals, exactly; inf / NaN on finite doubles, but their FP32
 * bound is not finite, so such rows never certify). Against x * 2^896 (finite: |x| < 2^128) the
 * products are the exact w x of the widened floats, without the lane-crossing vcvtps2pd /
 * vextractf128 (a Zen 3's exact head 10.7 -> 11.3 GB/s, 12.5 with cert_pass_bf16_avx2's two
 * chains). BF16 subnormal weights, which no checkpoint holds, would cost Intel cores a microcode
 * assist per FMA here: speed only. */
static const int8_t bf16_d4_ctl[4][32] __attribute__((aligned(32))) = {
    { -1, -1, -1, -1, -1, -1, 0, 1, -1, -1, -1, -1, -1, -1, 2, 3, -1, -1, -1, -1, -1, -1, 0, 1, -1, -1, -1, -1, -1, -1, 2, 3 },
    { -1, -1, -1, -1, -1, -1, 4, 5, -1, -1, -1, -1, -1, -1, 6, 7, -1, -1, -1, -1, -1, -1, 4, 5, -1, -1, -1, -1, -1, -1, 6, 7 },
    { -1, -1, -1, -1, -1, -1, 8, 9, -1, -1, -1, -1, -1, -1, 10, 11, -1, -1, -1, -1, -1, -1, 8, 9, -1, -1, -1, -1, -1, -1, 10, 11 },
    { -1, -1, -1, -1, -1, -1, 12, 13, -1, -1, -1, -1, -1, -1, 14, 15, -1, -1, -1, -1, -1, -1, 12, 13, -1, -1, -1, -1, -1, -1, 14, 15 } };
AINL __m256d bf16_d4(__m256i raw, int j) {
    __m256i v = _mm256_shuffle_epi8(raw, _mm256_load_si256((const __m256i *)bf16_d4_ctl[j]));
    return _mm256_castsi256_pd(_mm256_and_si256(_mm256_srai_epi32(v, 3), _mm256_set1_epi64x((long long)0x8FFFE00000000000ULL)));
}
/* the position of element e (0 .. 15 of a 16-group) in bf16_d4's order */
static inline int bf16_d4_pos(int e) { return 4 * ((e & 7) >> 1) + 2 * (e >> 3) + (e & 1); }

AINL double cert_w(int kind, const void *row, int k) {
    if (kind == E_BF16) return (double)ds41_bf16_to_f32(((const uint16_t *)row)[k]);
    return (double)e4m3_val[((const uint8_t *)row)[k]] * 0x1p-8;
}

static inline double hsum_pd(__m256d v) {
    __m128d a = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(a, _mm_unpackhi_pd(a, a)));
}

static inline float hsum_ps(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}

/* the contract's chain, K ascending, for n rows (four chains interleaved: independent sums) */
static void cert_chain(const cjob *c, int kind, const char *base, size_t esz, const int *rows, int n) {
    __atomic_fetch_add(&ds41_exact_chain_rows, n, __ATOMIC_RELAXED);
    for (int i = 0; i < n; i += 4) {
        int m = n - i < 4 ? n - i : 4;
        const char *p[4];
        for (int q = 0; q < 4; q++) p[q] = base + (size_t)rows[i + (q < m ? q : 0)] * c->in * esz;
        double v0 = 0.0, v1 = 0.0, v2 = 0.0, v3 = 0.0;
        for (int k = 0; k < c->in; k++) {
            double xk = c->x[k];
            v0 += cert_w(kind, p[0], k) * xk;
            v1 += cert_w(kind, p[1], k) * xk;
            v2 += cert_w(kind, p[2], k) * xk;
            v3 += cert_w(kind, p[3], k) * xk;
        }
        double v[4] = { v0, v1, v2, v3 };
        for (int q = 0; q < m; q++) {
            float f = (float)v[q];
            c->y[rows[i + q]] = c->out_bf16 ? ds41_bf16_round(f) : f;
        }
    }
}

/* CERT_R rows over K [0, kv) on AVX2 (the activation loads shared): one double chain and one
 * FP32 bound chain per row, reduced into s[q], b[q] */
#define CERT_R 4
#define CERT_R512 8    /* rows per pass on AVX-512 (ds41_exact_cert_avx512) */
#define CERT_PFD 2048
/* BF16 rows on AVX2 (activations in bf16_d4's order, xp, and the pair order, xap): the
 * doubles by bf16_d4 against x * 2^896; for the bound |w| of the even elements (v << 17 >> 1)
 * and of the odd ones (v & 0x7FFF0000) */
static void cert_pass_bf16_avx2(const cjob *c, const char *const *p, int kv, double *s, float *b) {
    __m256d sd[CERT_R], se[CERT_R];   /* two chains per row (any order is the certificate's) */
    __m256 bd[CERT_R];
    UNROLL4 for (int q = 0; q < CERT_R; q++) {
        sd[q] = se[q] = _mm256_setzero_pd();
        bd[q] = _mm256_setzero_ps();
    }
    for (int k = 0; k < kv; k += 16) {
        if (!(k & 31)) UNROLL4 for (int q = 0; q < CERT_R; q++) ds41_pf_row(p[q], (size_t)c->in * 2, (size_t)k * 2 + CERT_PFD, CERT_R);
        const double *xk = c->xp + k;
        UNROLL4 for (int q = 0; q < CERT_R; q++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p[q] + k));
            __m256 w0 = _mm256_castsi256_ps(_mm256_srli_epi32(_mm256_slli_epi32(raw, 17), 1));
            __m256 w1 = _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32(0x7FFF0000)));
            bd[q] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(c->xap + k), bd[q]);
            bd[q] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(c->xap + k + 8), bd[q]);
            sd[q] = _mm256_fmadd_pd(bf16_d4(raw, 0), _mm256_loadu_pd(xk), sd[q]);
            se[q] = _mm256_fmadd_pd(bf16_d4(raw, 1), _mm256_loadu_pd(xk + 4), se[q]);
            sd[q] = _mm256_fmadd_pd(bf16_d4(raw, 2), _mm256_loadu_pd(xk + 8), sd[q]);
            se[q] = _mm256_fmadd_pd(bf16_d4(raw, 3), _mm256_loadu_pd(xk + 12), se[q]);
        }
    }
    UNROLL4 for (int q = 0; q < CERT_R; q++) {
        s[q] = hsum_pd(_mm256_add_pd(sd[q], se[q]));
        b[q] = hsum_ps(bd[q]);
    }
}

AINL void cert_pass_avx2(const cjob *c, int kind, const char *const *p, int kv, double *s, float *b) {
    if (kind == E_BF16 && c->xp) {
        cert_pass_bf16_avx2(c, p, kv, s, b);
        return;
    }
    const size_t esz = kind == E_BF16 ? 2 : 1;
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256d sd[CERT_R];
    __m256 bd[CERT_R];
    UNROLL4 for (int q = 0; q < CERT_R; q++) {
        sd[q] = _mm256_setzero_pd();
        bd[q] = _mm256_setzero_ps();
    }
    for (int k = 0; k < kv; k += 16) {
        if (!(k & (int)(63 / esz)))
            UNROLL4 for (int q = 0; q < CERT_R; q++) ds41_pf_row(p[q], (size_t)c->in * esz, (size_t)k * esz + CERT_PFD, CERT_R);
        const double *xk = c->x + k;
        UNROLL4 for (int q = 0; q < CERT_R; q++) {
            __m256 w0, w1;
            cert_ld16(kind, p[q], k, &w0, &w1);
            __m256d t = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(w0)), _mm256_loadu_pd(xk));
            t = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(w0, 1)), _mm256_loadu_pd(xk + 4), t);
            t = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(w1)), _mm256_loadu_pd(xk + 8), t);
            t = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(w1, 1)), _mm256_loadu_pd(xk + 12), t);
            sd[q] = _mm256_add_pd(sd[q], t);
            bd[q] = _mm256_fmadd_ps(_mm256_and_ps(w0, absm), _mm256_loadu_ps(c->xa + k), bd[q]);
            bd[q] = _mm256_fmadd_ps(_mm256_and_ps(w1, absm), _mm256_loadu_ps(c->xa + k + 8), bd[q]);
        }
    }
    UNROLL4 for (int q = 0; q < CERT_R; q++) {
        s[q] = hsum_pd(sd[q]);
        b[q] = hsum_ps(bd[q]);
    }
}

/* rows [r0, r1): passes of CERT_R (AVX2) or CERT_R512 (AVX-512) rows, rows past r1 repeating
 * the last one (dropped); the K tail in any order, the certificate, and the chain for the rows
 * that miss it, gathered up to CERT_RMAX */
AINL void cert_rows_k(const cjob *c, int kind, int r0, int r1) {
    const int in = c->in, kv = in & ~15, R = c->avx512 ? CERT_R512 : CERT_R;
    const size_t esz = kind == E_BF16 ? 2 : 1;
    const char *base = kind == E_BF16 ? (const char *)c->wb : (const char *)c->w8;
    int fail[CERT_RMAX], nf = 0;
    for (int r = r0; r < r1; r += R) {
        int nr = r1 - r < R ? r1 - r : R;
        const char *p[CERT_R512];
        for (int q = 0; q < R; q++) p[q] = base + (size_t)(r + (q < nr ? q : nr - 1)) * in * esz;
        double sq[CERT_R512];
        float bq[CERT_R512];
        if (c->avx512) ds41_exact_cert_avx512(kind == E_BF16 ? 0 : 1, p, kv, c->x, c->xa, sq, bq);
        else cert_pass_avx2(c, kind, p, kv, sq, bq);
        for (int q = 0; q < nr; q++) {
            double s = sq[q];
            float bf = bq[q], f;
            for (int k = kv; k < in; k++) {   /* K tail: any order */
                double w = cert_w(kind, p[q], k);
                s += w * c->x[k];
                bf += (float)fabs(w) * c->xa[k];
            }
            if (cert_ok(in, s, bf, &f)) c->y[r + q] = c->out_bf16 ? ds41_bf16_round(f) : f;
            else fail[nf++] = r + q;
        }
        if (nf > CERT_RMAX - R || r + R >= r1) {
            cert_chain(c, kind, base, esz, fail, nf);
            nf = 0;
        }
    }
}

static void cert_rows_bf16(const cjob *c, int r0, int r1) { cert_rows_k(c, E_BF16, r0, r1); }
static void cert_rows_dqf(const cjob *c, int r0, int r1) { cert_rows_k(c, E_DQF, r0, r1); }

static void cert_rows(const cjob *c, int r0, int r1) {
    if (c->kind == E_BF16) cert_rows_bf16(c, r0, r1);
    else cert_rows_dqf(c, r0, r1);
}

/* DQ rows whose tile has every scale byte in 10 .. 246: bf16(e4m3 * s) is then e4m3 * s exactly
 * (4 significant bits, a normal FP32 / BF16 result: 2^-9 * 2^-117 >= 2^-126, 448 * 2^119 <
 * 2^128), so the product with x is e4m3 * (s * x), exact in double either way: such groups run
 * the plain E4M3 decode against xs = x * s * 2^8 (the FP16 trick's 2^-8 folded in) for their
 * tile. Groups across two tiles, or tiles with scales outside, decode and round as above. */
static int dq_tile_xs(const d1job *d, int t, double *xs, float *xsa, double *xs8, double *sx) {
    int nbk = (d->in + 31) / 32;
    const uint8_t *st = d->s8 + (size_t)t * nbk;
    for (int b = 0; b < nbk; b++)
        if (st[b] < 10 || st[b] > 246) return 0;
    double sum = 0.0, mx = 0.0;
    for (int k = 0; k < d->in; k++) {
        xs[k] = d->x[k] * ((double)ue8_f[st[k >> 5]] * 256.0);
        xsa[k] = (float)fabs(xs[k]);
        if (xs8) {
            double v = fabs(xs[k]) * 0x1p-8;   /* |x s| */
            sum += v;
            mx = v > mx ? v : mx;
            xs8[k] = xs[k] * 0x1p1008;
        }
    }
    if (xs8) *sx = mx < 0x1p6 && sum <= 0x1p1000 ? sum : -1.0;   /* -1: out of the 2^1016 scaling's range */
    return 1;
}

/* DQ tile rows [r0, r1) on the FP8 certified lanes (AVX-512 VBMI): the codes as e4m3 * 2^-1016
 * against xs8 = x s 2^1016, the bound the row's largest |e4m3| times sx = sum |x s| (as the FP8
 * rows, e1_cert_tile); rows that miss the certificate or hold a NaN code run the K-order chain */
static void cert_rows_dq8(const cjob *c, int r0, int r1, const double *xs8, double sx) {
    int fail[CERT_RMAX], nf = 0;
    for (int r = r0; r < r1; r += 4) {
        cert_fp8_pass4(c->w8, c->in, r, r1 - r < 4 ? r1 - r : 4, xs8, sx, c->y, fail, &nf);
        if (nf > CERT_RMAX - 4 || r + 4 >= r1) {
            cert_chain(c, E_DQF, (const char *)c->w8, 1, fail, nf);
            nf = 0;
        }
    }
}

static void d1_rows(void *arg, int i0, int i1) {
    const d1job *d = arg;
    int r1 = i1 * G < d->out ? i1 * G : d->out;
    if (d->kind == E_BF16) {   /* certified lanes */
        cjob c = { E_BF16, d->wb, NULL, d->out, d->in, d->x, d->xa, d->y, d->out_bf16, d->avx512, d->xp, d->xap };
        cert_rows(&c, i0 * G, r1);
        return;
    }
    if (d->kind == E_F32) {   /* FP32 (the mHC mixes: few rows, K up to 20480, where more rows miss the
                                 certificate): the chains, 8 rows per pass */
        for (int g0 = i0 * G; g0 < r1; g0 += 8) {
            int nr = r1 - g0 < 8 ? r1 - g0 : 8;
            (nr > 4 ? d1f_2 : d1f_1)(d, g0, d->x);
        }
        return;
    }
    double *xs = NULL, *xs8 = NULL, sx = -1.0;
    float *xsa = NULL;
    int xt = -1, xok = 0;
    for (int g0 = i0 * G; g0 < r1; g0 += G) {
        int nr = d->out - g0 < G ? d->out - g0 : G;
        int t = (d->row0 + g0) / 32;
        if (t == (d->row0 + g0 + nr - 1) / 32) {
            if (!xs) {
                xs = ds41_scratch(DS41_SCR_ITEM_P, (size_t)d->in * sizeof(double));
                xsa = ds41_scratch(DS41_SCR_ITEM_PW, (size_t)d->in * sizeof(float));
                if (d->vbmi) xs8 = ds41_scratch(DS41_SCR_ITEM_ACC, (size_t)d->in * sizeof(double));
            }
            if (xs && xsa && (xs8 || !d->vbmi) && t != xt) { xok = dq_tile_xs(d, t, xs, xsa, xs8, &sx); xt = t; }
            if (xs && xsa && (xs8 || !d->vbmi) && xok) {   /* the tile's exact products: certified lanes on its codes */
                cjob c = { E_DQF, NULL, d->w8 + (size_t)d->row0 * d->in, d->out, d->in, xs, xsa, d->y, 1, d->avx512, NULL, NULL };
                if (xs8 && sx >= 0.0) cert_rows_dq8(&c, g0, g0 + nr, xs8, sx);
                else cert_rows(&c, g0, g0 + nr);
                continue;
            }
        }
        int w = nr > 8 ? 2 : nr > 4 ? 1 : 0;
        (w == 2 ? d1q_4 : w == 1 ? d1q_2 : d1q_1)(d, g0, d->x);
    }
}

void ds41_exact_dense(const ds41_ctx *ctx, int kind, const uint16_t *wb, const float *wf, const ds41_fp8w *w8,
                      int row0, int out, int in, const float *x, int x_stride, int T, float *y, int y_stride,
                      int out_bf16) {
    pthread_once(&val_once, val_init);
    int ek = kind == 0 ? E_BF16 : kind == 1 ? E_F32 : E_DQ;
    if (T > 1 && T <= few_max(ek)) {   /* few tokens */
        for (int t = 0; t < T; t++)
            ds41_exact_dense(ctx, kind, wb, wf, w8, row0, out, in, x + (size_t)t * x_stride, x_stride, 1,
                             y + (size_t)t * y_stride, y_stride, out_bf16);
        return;
    }
    if (T == 1) {
        int z = !strcmp(ds41_kernels_isa(), "avx512"), pairs = ek == E_BF16 && !z;
        double *ad = ds41_scratch(DS41_SCR_LIN_A, (size_t)(pairs ? 2 : 1) * in * sizeof(double));
        float *xa = ds41_scratch(DS41_SCR_LIN_AW, (size_t)(pairs ? 2 : 1) * in * sizeof(float));
        if (!ad || !xa) return;
        for (int k = 0; k < in; k++) {
            ad[k] = (double)x[k];
            xa[k] = fabsf(x[k]);
        }
        if (pairs)   /* per 16: |x| in the pair order of the bound (the even elements, then the odd ones),
                      * x * 2^896 in bf16_d4's */
            for (int k = 0; k < (in & ~15); k++) {
                int src = (k & ~15) + (k & 8 ? 2 * (k & 7) + 1 : 2 * (k & 7));
                xa[in + k] = xa[src];
                ad[in + (k & ~15) + bf16_d4_pos(k & 15)] = ad[k] * 0x1p896;
            }
        d1job d = { ek, wb, wf, w8 ? w8->w : NULL, w8 ? w8->s : NULL, row0, out, in, ad, xa, y, out_bf16, z,
                    z && __builtin_cpu_supports("avx512vbmi"), pairs ? ad + in : NULL, pairs ? xa + in : NULL };
        int n_items = (out + G - 1) / G;
        if ((long long)out * in >= PAR_MIN_WORK) ds41_parallel_for(ctx, n_items, d1_rows, &d);
        else d1_rows(&d, 0, n_items);
        return;
    }
    int tt = tile_tokens(T, in);
    double *ad = ds41_scratch(DS41_SCR_LIN_A, (size_t)tt * in * sizeof(double));
    if (!ad) return;
    for (int t0 = 0; t0 < T; t0 += tt) {
        int nt = T - t0 < tt ? T - t0 : tt;
        for (int t = 0; t < nt; t++) {
            const float *xr = x + (size_t)(t0 + t) * x_stride;
            double *o = ad + (size_t)t * in;
            for (int k = 0; k < in; k++) o[k] = (double)xr[k];
        }
        ejob j = { ek, w8 ? w8->w : NULL, w8 ? w8->s : NULL, wb, wf, row0, out, in, nt, ad,
                   y + (size_t)t0 * y_stride, (size_t)y_stride, out_bf16, 0 };
        ejob_run(ctx, &j);
    }
}
