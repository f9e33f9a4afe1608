/* ds41 vision weights (docs/vision.md): the tower, the aligner and the image span vectors,
 * bound by the official module names, every tensor BF16 with its exact shape checked. Views
 * point into the mmap'd safetensors, as the text weights do. */
#ifndef DS41_VISION_WEIGHTS_H
#define DS41_VISION_WEIGHTS_H

#include "image.h"
#include "model.h"

typedef struct ds41_vision_block {
    const uint16_t *norm1, *norm2;          /* [D] */
    ds41_bf16w wqkv, wo, w1, w2;            /* [3D, D], [D, D], [2I, D], [D, I] */
    const uint16_t *bqkv, *bo;              /* [3D], [D] */
} ds41_vision_block;

typedef struct ds41_vision {
    int n_layers, dim, n_heads, head_dim, inter, patch, ratio, lm_dim;
    float theta;
    ds41_bf16w patch_w;                     /* [D, 3 p p] */
    const uint16_t *patch_b;                /* [D] */
    ds41_vision_block *blocks;              /* owned array of views, n_layers */
    const uint16_t *norm;                   /* [D] */
    ds41_bf16w al_w1, al_w2;                /* [dim, D r r], [dim, dim] */
    const uint16_t *al_b1, *al_b2;          /* [dim] */
    const uint16_t *image_start, *image_end, *image_newline;   /* [dim] */
} ds41_vision;

/* Binds the tower the config describes. Returns 1 when bound, 0 when the config has no tower
 * or the checkpoint holds no vision tensor (v zeroed), -1 on an error naming the tensor that
 * is missing or misshaped, or the config field that is inconsistent. */
/* The preprocessing parameters (src/image/) of the config: patch, unshuffle, token limit,
 * min_pixels, max_wh_ratio and image_token_id. */
void ds41_vision_params_of(const ds41_config *cfg, ds41_vision_params *vp);

int ds41_vision_bind(const ds41_config *cfg, const ds41_st *st, ds41_vision *v, ds41_err *err);
void ds41_vision_free(ds41_vision *v);

#endif
