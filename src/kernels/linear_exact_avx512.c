/* ds41 exact linears, AVX-512 passes over the K-major double panel of linear_exact.c: one zmm
 * holds 8 of the 16 rows of a group, and up to 4 tokens run per pass (8 independent FMA
 * chains, enough to cover the FMA latency at 8 doubles per instruction). Every lane sees the
 * same sequence of operations as in the AVX2 passes (dense: fma in K order; quantized: exact
 * block dots, then acc + dot in block order), so the results are the same bits. Compiled for
 * AVX-512F (GCC target pragma, clang attribute) and called only when the fast kernels' ISA
 * is avx512 (CPUID, DS41_ISA=avx2 forces the AVX2 passes). */
#ifndef __clang__
#pragma GCC target("avx512f,avx2,fma")
#endif
#include "linear_fast.h"

#include <immintrin.h>

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma"))), apply_to = function)
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

#ifdef __clang__
#pragma clang attribute pop
#endif
