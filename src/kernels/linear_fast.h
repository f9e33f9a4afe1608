/* ds41 fast linears (ds41_ctx.exact == 0): AVX2 kernels behind the ds41_linear_* entry
 * points of linear.c. Internal to src/kernels and its tests. */
#ifndef DS41_LINEAR_FAST_H
#define DS41_LINEAR_FAST_H

#include "kernels.h"

#include <stdint.h>

/* FP8 (fp4 = 0: 32x32 tiles) or FP4 (fp4 = 1: per-row per-32 scales) linear, in % 32 == 0. */
void ds41_fast_qlin(const ds41_ctx *ctx, const uint8_t *w, const uint8_t *s, int fp4, int out, int in,
                    const float *x, int T, float *y);

/* kind 0: BF16 weights wb; 1: FP32 weights wf; 2: FP8 w8 dequantized on the fly, rows
 * [row0, row0 + out). x[t * x_stride + k], y[t * y_stride + r]. */
void ds41_fast_dense(const ds41_ctx *ctx, int kind, const uint16_t *wb, const float *wf, const ds41_fp8w *w8,
                     int row0, int out, int in, const float *x, int x_stride, int T, float *y, int y_stride,
                     int out_bf16);

/* Q8 of one row (in % 32 == 0) per 32 along K, bit-identical to ds41_q8_group followed by the
 * E4M3 decode and the multiplication by the group scale, times mult (a power of two): a[k] =
 * e4m3(x[k] / s) * s * mult. Exposed for tests/test_kernels.c. */
void ds41_fast_q8_row(const float *x, int in, float mult, float *a);

#endif
