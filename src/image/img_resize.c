/* ds41 image resize: Pillow's BICUBIC resampling (libImaging Resample.c, the 8-bit path), bit
 * for bit.
 *
 * The filter is the Keys cubic with a = -0.5, support 2, stretched by the scale when shrinking
 * (so that every source pixel contributes). For each output column (then row) the taps are
 * computed in double: the window [center - support, center + support] rounded to whole pixels
 * and clipped to the image, the weights normalised by their sum, then turned into 22-bit fixed
 * point with round-half-away-from-zero. A pass sums sample * weight in integers from a start of
 * half a unit, shifts right by 22 (floor) and clamps to [0, 255]. The horizontal pass runs
 * first (only on the source rows the vertical pass will read) and rounds to 8 bits; the vertical
 * pass reads that. A pass whose size does not change is skipped, as Pillow skips it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "image.h"

#define PRECISION_BITS 22 /* Pillow: 32 - 8 bits of result - 2 bits of headroom */

typedef struct taps {
    int ksize;     /* taps per output sample (the widest window) */
    int *bounds;   /* per output sample: first source index, number of taps */
    int32_t *k;    /* per output sample: ksize fixed-point weights */
} taps;

static void taps_free(taps *t) {
    free(t->bounds);
    free(t->k);
}

static double keys_cubic(double x) {
    const double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

static int taps_make(int in_size, int out_size, taps *t, ds41_err *err) {
    memset(t, 0, sizeof *t);
    /* Pillow passes the source box as floats (0, in_size); the width is their float difference */
    double scale = (double)((float)in_size - 0.0f) / out_size;
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = 2.0 * filterscale;
    int ksize = (int)ceil(support) * 2 + 1;
    t->ksize = ksize;
    t->bounds = malloc((size_t)out_size * 2 * sizeof *t->bounds);
    t->k = malloc((size_t)out_size * ksize * sizeof *t->k);
    double *w = malloc((size_t)ksize * sizeof *w);
    if (!t->bounds || !t->k || !w) {
        free(w);
        taps_free(t);
        return ds41_errf(err, "resize: out of memory for %d x %d filter taps", out_size, ksize);
    }
    for (int xx = 0; xx < out_size; xx++) {
        double center = 0.0 + (xx + 0.5) * scale;
        double ss = 1.0 / filterscale;
        int xmin = (int)(center - support + 0.5); /* truncation, as Pillow's cast */
        if (xmin < 0) xmin = 0;
        int xmax = (int)(center + support + 0.5);
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        double sum = 0.0;
        for (int x = 0; x < xmax; x++) {
            w[x] = keys_cubic(((double)(x + xmin) - center + 0.5) * ss);
            sum += w[x];
        }
        int32_t *k = t->k + (size_t)xx * ksize;
        for (int x = 0; x < ksize; x++) {
            double v = x < xmax ? (sum != 0.0 ? w[x] / sum : w[x]) : 0.0;
            k[x] = v < 0 ? (int32_t)(-0.5 + v * (1 << PRECISION_BITS)) : (int32_t)(0.5 + v * (1 << PRECISION_BITS));
        }
        t->bounds[2 * xx] = xmin;
        t->bounds[2 * xx + 1] = xmax;
    }
    free(w);
    return 0;
}

static inline uint8_t clip8(int64_t acc) {
    int64_t v = acc >> PRECISION_BITS; /* arithmetic shift: floor */
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* rows [y0, y0 + n) of in (width in_w), resampled horizontally into out (width t's out_size) */
static void pass_h(const uint8_t *in, int in_w, int y0, int n, const taps *t, int out_w, uint8_t *out) {
    for (int y = 0; y < n; y++) {
        const uint8_t *src = in + (size_t)(y0 + y) * in_w * 3;
        uint8_t *dst = out + (size_t)y * out_w * 3;
        for (int xx = 0; xx < out_w; xx++) {
            int xmin = t->bounds[2 * xx], xmax = t->bounds[2 * xx + 1];
            const int32_t *k = t->k + (size_t)xx * t->ksize;
            int64_t s0 = 1 << (PRECISION_BITS - 1), s1 = s0, s2 = s0;
            const uint8_t *p = src + (size_t)xmin * 3;
            for (int x = 0; x < xmax; x++, p += 3) {
                s0 += (int64_t)p[0] * k[x];
                s1 += (int64_t)p[1] * k[x];
                s2 += (int64_t)p[2] * k[x];
            }
            dst[3 * xx] = clip8(s0);
            dst[3 * xx + 1] = clip8(s1);
            dst[3 * xx + 2] = clip8(s2);
        }
    }
}

/* in has rows starting at source row `first`; out gets out_h rows of width w */
static void pass_v(const uint8_t *in, int w, int first, const taps *t, int out_h, uint8_t *out) {
    size_t stride = (size_t)w * 3;
    for (int yy = 0; yy < out_h; yy++) {
        int ymin = t->bounds[2 * yy] - first, ymax = t->bounds[2 * yy + 1];
        const int32_t *k = t->k + (size_t)yy * t->ksize;
        uint8_t *dst = out + (size_t)yy * stride;
        for (size_t i = 0; i < stride; i++) {
            int64_t s = 1 << (PRECISION_BITS - 1);
            const uint8_t *p = in + (size_t)ymin * stride + i;
            for (int y = 0; y < ymax; y++, p += stride) s += (int64_t)*p * k[y];
            dst[i] = clip8(s);
        }
    }
}

int ds41_image_resize_bicubic(const ds41_rgb_image *in, int width, int height, ds41_rgb_image *out,
                              ds41_err *err) {
    memset(out, 0, sizeof *out);
    if (width < 1 || height < 1)
        return ds41_errf(err, "resize %dx%d -> %dx%d: the target size must be at least 1x1", in->width,
                         in->height, width, height);
    if (ds41_rgb_image_alloc(out, width, height, 0, err)) return -1;
    int need_h = width != in->width, need_v = height != in->height;
    taps tv = { 0 }, th = { 0 };
    ds41_rgb_image tmp = { 0 };
    int rc = 0;
    if (!need_h && !need_v) {
        memcpy(out->rgb, in->rgb, (size_t)width * height * 3);
    } else if (!need_v) {
        rc = taps_make(in->width, width, &th, err);
        if (!rc) pass_h(in->rgb, in->width, 0, height, &th, width, out->rgb);
    } else if (!need_h) {
        rc = taps_make(in->height, height, &tv, err);
        if (!rc) pass_v(in->rgb, width, 0, &tv, height, out->rgb);
    } else {
        /* both: the horizontal pass only on the source rows the vertical taps reach */
        rc = taps_make(in->height, height, &tv, err);
        int first = rc ? 0 : tv.bounds[0];
        int last = rc ? 0 : tv.bounds[2 * height - 2] + tv.bounds[2 * height - 1];
        if (!rc) rc = taps_make(in->width, width, &th, err);
        if (!rc) rc = ds41_rgb_image_alloc(&tmp, width, last - first, 0, err);
        if (!rc) {
            pass_h(in->rgb, in->width, first, last - first, &th, width, tmp.rgb);
            pass_v(tmp.rgb, width, first, &tv, height, out->rgb);
        }
    }
    ds41_rgb_image_free(&tmp);
    taps_free(&th);
    taps_free(&tv);
    if (rc) ds41_rgb_image_free(out);
    return rc;
}
