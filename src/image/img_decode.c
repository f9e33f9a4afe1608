/* ds41 image decoding: the format is found by its signature (never by the file name), the size
 * limits are checked on the header, then the PNG or JPEG decoder runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image_internal.h"

void ds41_rgb_image_free(ds41_rgb_image *im) {
    if (!im) return;
    free(im->rgb);
    memset(im, 0, sizeof *im);
}

int ds41_rgb_image_alloc(ds41_rgb_image *im, int width, int height, uint8_t fill, ds41_err *err) {
    memset(im, 0, sizeof *im);
    if (width < 1 || height < 1) return ds41_errf(err, "image size %dx%d: both sides must be at least 1", width, height);
    uint64_t n;
    if (ds41_mul_u64((uint64_t)width, (uint64_t)height, &n) || ds41_mul_u64(n, 3, &n) || n > SIZE_MAX)
        return ds41_errf(err, "image size %dx%d: too large to allocate", width, height);
    im->rgb = malloc((size_t)n);
    if (!im->rgb) return ds41_errf(err, "image size %dx%d: out of memory (%llu bytes)", width, height,
                                   (unsigned long long)n);
    memset(im->rgb, fill, (size_t)n);
    im->width = width;
    im->height = height;
    return 0;
}

void ds41_image_limits_default(ds41_image_limits *lim) {
    lim->max_bytes = DS41_IMAGE_MAX_BYTES;
    lim->max_side = DS41_IMAGE_MAX_SIDE;
    lim->max_pixels = DS41_IMAGE_MAX_PIXELS;
}

int ds41_image_check_size(uint64_t width, uint64_t height, const ds41_image_limits *lim, const char *fmt,
                          ds41_err *err) {
    if (width == 0 || height == 0)
        return ds41_errf(err, "%s: image size %llux%llu is empty", fmt, (unsigned long long)width,
                         (unsigned long long)height);
    if (width > (uint64_t)lim->max_side || height > (uint64_t)lim->max_side)
        return ds41_errf(err, "%s: image size %llux%llu is beyond the limit of %d pixels a side", fmt,
                         (unsigned long long)width, (unsigned long long)height, lim->max_side);
    if (width * height > lim->max_pixels) /* both sides <= max_side (an int): no overflow */
        return ds41_errf(err, "%s: image size %llux%llu is %llu pixels, beyond the limit of %llu "
                         "(a decompression bomb or a needlessly large image)", fmt, (unsigned long long)width,
                         (unsigned long long)height, (unsigned long long)(width * height),
                         (unsigned long long)lim->max_pixels);
    return 0;
}

/* Names the formats people send by mistake, so the message says what the file is. */
static const char *other_format(const uint8_t *d, size_t n) {
    if (n >= 6 && (!memcmp(d, "GIF87a", 6) || !memcmp(d, "GIF89a", 6))) return "GIF";
    if (n >= 12 && !memcmp(d, "RIFF", 4) && !memcmp(d + 8, "WEBP", 4)) return "WebP";
    if (n >= 2 && !memcmp(d, "BM", 2)) return "BMP";
    if (n >= 4 && (!memcmp(d, "II*\0", 4) || !memcmp(d, "MM\0*", 4))) return "TIFF";
    if (n >= 12 && !memcmp(d + 4, "ftyp", 4)) return "HEIF/AVIF (ISO media)";
    if (n >= 4 && !memcmp(d, "\0\0\1\0", 4)) return "ICO";
    if (n >= 12 && !memcmp(d, "\0\0\0\x0cjP  ", 8)) return "JPEG 2000";
    if (n >= 2 && d[0] == 0xFF && d[1] == 0x0A) return "JPEG XL";
    if (n >= 5 && (!memcmp(d, "<?xml", 5) || !memcmp(d, "<svg", 4))) return "SVG/XML";
    return NULL;
}

int ds41_image_decode(const uint8_t *data, size_t len, const ds41_image_limits *lim, ds41_rgb_image *out,
                      ds41_err *err) {
    ds41_image_limits def;
    if (!lim) {
        ds41_image_limits_default(&def);
        lim = &def;
    }
    memset(out, 0, sizeof *out);
    if (len > lim->max_bytes)
        return ds41_errf(err, "image of %zu bytes is beyond the limit of %zu bytes", len, lim->max_bytes);
    if (len >= 8 && !memcmp(data, "\x89PNG\r\n\x1a\n", 8)) return ds41_png_decode(data, len, lim, out, err);
    if (len >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF)
        return ds41_jpeg_decode(data, len, lim, out, err);
    const char *o = other_format(data, len);
    if (o) return ds41_errf(err, "unsupported image format %s: ds41 reads PNG and JPEG", o);
    if (len == 0) return ds41_errf(err, "empty image data: ds41 reads PNG and JPEG");
    return ds41_errf(err, "unknown image format (first bytes %02x %02x %02x %02x): ds41 reads PNG and JPEG",
                     data[0], len > 1 ? data[1] : 0, len > 2 ? data[2] : 0, len > 3 ? data[3] : 0);
}

int ds41_image_load(const char *path, const ds41_image_limits *lim, ds41_rgb_image *out, ds41_err *err) {
    ds41_image_limits def;
    if (!lim) {
        ds41_image_limits_default(&def);
        lim = &def;
    }
    char *buf = NULL;
    size_t len = 0;
    if (ds41_read_file(path, lim->max_bytes, &buf, &len, err)) return -1;
    ds41_err e;
    int rc = ds41_image_decode((const uint8_t *)buf, len, lim, out, &e);
    free(buf);
    if (rc) return ds41_errf(err, "%s: %s", path, e.msg);
    return 0;
}
