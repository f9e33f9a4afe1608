/* ds41 image input: decoding (PNG, JPEG), the official preprocessing (plan, Pillow's bicubic
 * resize, pad, normalise to BF16) and the image token count. The vision tower is elsewhere.
 *
 * The reference (S1 image_processor.py) opens the file with Pillow, converts it to RGB, resizes
 * and pads it with Pillow, then normalises in torch. ds41 reproduces each step bit for bit against
 * Debian's Pillow 9.4 and libjpeg-turbo (docs/vision-preprocessing.md has the rules). */
#ifndef DS41_IMAGE_H
#define DS41_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

/* An 8-bit RGB image, rows top to bottom, pixels interleaved R, G, B. */
typedef struct ds41_rgb_image {
    int width, height;
    uint8_t *rgb; /* width * height * 3 bytes */
} ds41_rgb_image;

void ds41_rgb_image_free(ds41_rgb_image *im);
/* Allocates width x height (each >= 1), every byte set to fill. */
int ds41_rgb_image_alloc(ds41_rgb_image *im, int width, int height, uint8_t fill, ds41_err *err);

/* What a decoder accepts. Checked on the header, before any pixel is decoded: a small file that
 * declares a huge image (a decompression bomb) is refused without allocating for it. */
typedef struct ds41_image_limits {
    size_t max_bytes;    /* encoded size */
    int max_side;        /* width and height */
    uint64_t max_pixels; /* width * height */
} ds41_image_limits;

#define DS41_IMAGE_MAX_BYTES (64u << 20)
#define DS41_IMAGE_MAX_SIDE 16384
#define DS41_IMAGE_MAX_PIXELS 50000000ull
void ds41_image_limits_default(ds41_image_limits *lim);

/* Decodes a PNG or JPEG (found by its signature) into RGB as Pillow's open + convert("RGB")
 * does: alpha dropped (not composited), greys replicated, palettes looked up, 16-bit samples
 * reduced as Pillow reduces them, no EXIF orientation, no colour management. Anything else,
 * and any truncated or corrupt file, is an error naming what was wrong. */
int ds41_image_decode(const uint8_t *data, size_t len, const ds41_image_limits *lim, ds41_rgb_image *out,
                      ds41_err *err);
/* Reads the file (at most lim->max_bytes) and decodes it; messages start with the path. */
int ds41_image_load(const char *path, const ds41_image_limits *lim, ds41_rgb_image *out, ds41_err *err);

/* Pillow's Image.resize(size, BICUBIC) on an RGB image: the separable two-pass filter
 * (horizontal, then vertical) with 22-bit fixed-point coefficients, 8-bit rounding between the
 * passes. Same size: a copy. */
int ds41_image_resize_bicubic(const ds41_rgb_image *in, int width, int height, ds41_rgb_image *out,
                              ds41_err *err);

/* The preprocessing parameters from the model's config (vision_config in the HF spelling, the
 * vision_* keys in the flat one). */
typedef struct ds41_vision_params {
    int patch_size;       /* 14 */
    int downsample_ratio; /* 3: the aligner's r x r unshuffle */
    int max_n_token;      /* 1024: LLM tokens per image, with the newline and start/end tokens */
    int64_t min_pixels;   /* 295936: smaller images are planned larger */
    int max_wh_ratio;     /* -1: none (the release); else wider images are clamped / stretched */
    int image_token_id;   /* 129264 */
} ds41_vision_params;

void ds41_vision_params_default(ds41_vision_params *vp);

/* The resize plan of the reference's plan_image_grid / safe_resize for an original size. */
typedef struct ds41_image_plan {
    int orig_w, orig_h;
    int width, height;      /* the resized and padded size, multiples of patch_size */
    int n_vit_h, n_vit_w;   /* patch grid */
    int n_llm_h, n_llm_w;   /* token grid after the r x r unshuffle (the patch grid padded up) */
    int n_tokens;           /* n_llm_h * (n_llm_w + 1) + 2 */
    int stretch;            /* 1: resized to width x height without keeping the aspect ratio */
    int content_w, content_h, off_x, off_y; /* where the resized image sits on the grey canvas */
} ds41_image_plan;

int ds41_image_plan_make(int orig_w, int orig_h, const ds41_vision_params *vp, ds41_image_plan *plan,
                         ds41_err *err);

/* The whole preprocessing of one decoded image: plan, resize, pad with grey 127, normalise
 * ((x/255 - 0.5) / 0.5 in FP32) and round to BF16 once. *pixels: BF16 bits, [3][height][width]
 * (the reference's x before it is cut into patches); free() it. */
int ds41_image_preprocess(const ds41_rgb_image *im, const ds41_vision_params *vp, ds41_image_plan *plan,
                          uint16_t **pixels, ds41_err *err);

/* The BF16 value of one 8-bit sample after normalisation (the table the preprocessing uses). */
uint16_t ds41_image_norm_bf16(uint8_t v);

#endif
