/* The horizontal sum of the fast kernels (linear.c, linear_fast.c, linear_avx512.c,
 * linear_avx512bf16.c): one fixed order of additions, the last step of linear_fast.c's
 * canonical order, so that every ISA reduces an accumulator register to the same bits.
 * hsum8(v) = ((v0..3 + v4..7) lanes 0, 1 + lanes 2, 3) lane 0 + lane 1. AVX only; the AVX-512
 * files add hsum16 (hsum512.h). Static inline: each file compiles these for its own target, so
 * a file with a target pragma includes this after it (under clang: after its
 * `#pragma clang attribute push`, which applies only to functions defined after it). */
#ifndef DS41_HSUM_H
#define DS41_HSUM_H

#include <immintrin.h>

static inline float hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    __m128 s = _mm_add_ps(lo, hi);
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

#endif
