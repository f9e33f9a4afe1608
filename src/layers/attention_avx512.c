/* Fast-mode sparse attention kernels, AVX-512 forms of attention.c's dot_v4 and value pass.
 *
 * Both keep attention.c's arithmetic exactly: one zmm accumulator over 16 consecutive columns
 * holds, in lanes 0-7 and 8-15, the two 8-lane accumulators of the AVX2 code (dot_v's s0 and
 * s1; the value pass's two vectors per 16 columns), each lane the same chain of fused
 * multiply-adds in the same order; the reductions, remainders and tails are the AVX2 code's.
 * So the results are the same bits (tests/test_attention.c: test_sparse_attn_fast_order runs
 * on whichever path the machine takes, and DS41_ISA=avx2 forces the other).
 *
 * Compiled for the target below like src/kernels/linear_avx512.c, so the binary still runs
 * on AVX2-only machines: attention.c calls in only when ds41_kernels_isa() is "avx512". */
#ifndef __clang__
#pragma GCC target("avx512f,avx512vl,avx2,fma")
#endif
#include "attention.h"

#include <immintrin.h>
#include <stddef.h>

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx512f,avx512vl,avx2,fma"))), apply_to = function)
#endif

void ds41_sa_dot4_avx512(const float *q, size_t qstride, const float *b, int n, float *out);
void ds41_sa_vals4_avx512(const float *const *vr, int nv, int D, const float *const *pb, float *facc);

static inline float hsum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/* s0 + s1 of dot_v: the low and high halves of the 16-lane accumulator */
static inline float hsum16(__m512 v) {
    return hsum8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

/* Four heads' q.k (q rows at stride qstride) against one row b of n floats: dot_v4. */
void ds41_sa_dot4_avx512(const float *q, size_t qstride, const float *b, int n, float *out) {
    const float *q0 = q, *q1 = q + qstride, *q2 = q + 2 * qstride, *q3 = q + 3 * qstride;
    __m512 a = _mm512_setzero_ps(), c = a, d = a, e = a;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 r = _mm512_loadu_ps(b + i);
        a = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + i), r, a);
        c = _mm512_fmadd_ps(_mm512_loadu_ps(q1 + i), r, c);
        d = _mm512_fmadd_ps(_mm512_loadu_ps(q2 + i), r, d);
        e = _mm512_fmadd_ps(_mm512_loadu_ps(q3 + i), r, e);
    }
    out[0] = hsum16(a);
    out[1] = hsum16(c);
    out[2] = hsum16(d);
    out[3] = hsum16(e);
    for (; i < n; i++) {
        out[0] += q0[i] * b[i];
        out[1] += q1[i] * b[i];
        out[2] += q2[i] * b[i];
        out[3] += q3[i] * b[i];
    }
}

/* The value pass of four heads (pb[h]: the block's BF16 probabilities of the nv rows vr[]):
 * facc[h * D + d] = the fused chain over the rows from +0 for the D & ~7 columns, mul + add
 * for the tail; 32 columns x 4 heads in registers per pass over the rows. */
void ds41_sa_vals4_avx512(const float *const *vr, int nv, int D, const float *const *pb, float *facc) {
    int D8 = D & ~7, d = 0;
    for (; d + 32 <= D8; d += 32) {
        __m512 a[4][2];
        for (int h = 0; h < 4; h++) a[h][0] = a[h][1] = _mm512_setzero_ps();
        for (int i = 0; i < nv; i++) {
            __m512 k0 = _mm512_loadu_ps(vr[i] + d), k1 = _mm512_loadu_ps(vr[i] + d + 16);
            for (int h = 0; h < 4; h++) {
                __m512 pv = _mm512_set1_ps(pb[h][i]);
                a[h][0] = _mm512_fmadd_ps(pv, k0, a[h][0]);
                a[h][1] = _mm512_fmadd_ps(pv, k1, a[h][1]);
            }
        }
        for (int h = 0; h < 4; h++) {
            _mm512_storeu_ps(facc + (size_t)h * D + d, a[h][0]);
            _mm512_storeu_ps(facc + (size_t)h * D + d + 16, a[h][1]);
        }
    }
    for (int w; d < D8; d += w) {   /* 16 columns, or the last 8 (lanes 8-15 masked off) */
        w = D8 - d >= 16 ? 16 : 8;
        __mmask16 m = w == 16 ? 0xFFFF : 0x00FF;
        __m512 a[4];
        for (int h = 0; h < 4; h++) a[h] = _mm512_setzero_ps();
        for (int i = 0; i < nv; i++) {
            __m512 k0 = _mm512_maskz_loadu_ps(m, vr[i] + d);
            for (int h = 0; h < 4; h++) a[h] = _mm512_fmadd_ps(_mm512_set1_ps(pb[h][i]), k0, a[h]);
        }
        for (int h = 0; h < 4; h++) _mm512_mask_storeu_ps(facc + (size_t)h * D + d, m, a[h]);
    }
    for (; d < D; d++)
        for (int h = 0; h < 4; h++) {
            float v = 0.0f;
            for (int i = 0; i < nv; i++) v += pb[h][i] * vr[i][d];
            facc[(size_t)h * D + d] = v;
        }
}

#ifdef __clang__
#pragma clang attribute pop
#endif
