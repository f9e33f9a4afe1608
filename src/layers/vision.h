/* ds41 vision tower and aligner (docs/vision.md): BF16 pixels [3, H, W] -> the aligned image
 * tokens [gh * gw, dim], and the image span the language model reads (start, rows of tokens
 * each closed by the newline vector, end). Honours ctx->exact like every kernel: exact mode
 * is bit-identical to tools/reference/vision.py. The attention streams 64-query x 64-key
 * tiles and never holds the full score matrix. */
#ifndef DS41_VISION_H
#define DS41_VISION_H

#include "kernels.h"
#include "vision_weights.h"

/* Largest image side accepted, in pixels (the released processor stays far below). */
#define DS41_VISION_MAX_SIDE 8192

/* Patch grid n_h x n_w and token grid gh x gw of an H x W image; -1 with a message when H or
 * W is not a positive multiple of the patch size or beyond DS41_VISION_MAX_SIDE. */
int ds41_vision_grid(const ds41_vision *v, int H, int W, int *n_h, int *n_w, int *gh, int *gw, ds41_err *err);

/* Rows of the span of a gh x gw token grid: gh * (gw + 1) + 2. */
static inline int ds41_vision_span_rows(int gh, int gw) { return gh * (gw + 1) + 2; }

/* The tower: pixels [3, H, W] (BF16 values) -> features [n_h * n_w, vision_dim] BF16 after
 * the final norm. */
int ds41_vision_tower(const ds41_ctx *ctx, const ds41_vision *v, const float *pixels, int H, int W, float *feat,
                      ds41_err *err);
/* Tower + aligner: out [gh * gw, dim] BF16 values, tokens in reading order. */
int ds41_vision_encode(const ds41_ctx *ctx, const ds41_vision *v, const float *pixels, int H, int W, float *out,
                       ds41_err *err);
/* The whole span: out [span_rows, dim]. */
int ds41_vision_span(const ds41_ctx *ctx, const ds41_vision *v, const float *pixels, int H, int W, float *out,
                     ds41_err *err);

#endif
