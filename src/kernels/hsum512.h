/* hsum16: hsum8(A + B) of a zmm accumulator register holding A (lanes 0-7) and B (lanes
 * 8-15), the AVX2 kernels' two registers (linear_avx512.c, linear_avx512bf16.c). Needs
 * AVX-512 F + DQ: include it only in a file compiled for them, after its target pragma (under
 * clang: after `#pragma clang attribute push`, see hsum.h); never in the AVX2 files. */
#ifndef DS41_HSUM512_H
#define DS41_HSUM512_H

#include "hsum.h"

static inline float hsum16(__m512 v) {
    return hsum8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

#endif
