/* ds41 image: what the decoders share (not part of the public image API). */
#ifndef DS41_IMAGE_INTERNAL_H
#define DS41_IMAGE_INTERNAL_H

#include "image.h"

/* Refuses a declared size outside the limits (fmt names the format in the message). */
int ds41_image_check_size(uint64_t width, uint64_t height, const ds41_image_limits *lim, const char *fmt,
                          ds41_err *err);

int ds41_png_decode(const uint8_t *data, size_t len, const ds41_image_limits *lim, ds41_rgb_image *out,
                    ds41_err *err);
int ds41_jpeg_decode(const uint8_t *data, size_t len, const ds41_image_limits *lim, ds41_rgb_image *out,
                     ds41_err *err);

#endif
