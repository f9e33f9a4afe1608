/* ds41 JPEG decoding with libjpeg-turbo (the library Debian's Pillow links), to RGB as Pillow
 * gives it after convert("RGB").
 *
 * Pillow leaves libjpeg's defaults alone outside draft mode (which the reference does not use):
 * the accurate integer IDCT (JDCT_ISLOW), fancy upsampling, libjpeg's YCbCr -> RGB conversion,
 * no scaling. So does this file; the pixels are then the library's, bit for bit. Greyscale JPEGs
 * are Pillow's mode "L", replicated to R = G = B. EXIF orientation is ignored (the reference
 * never calls exif_transpose). CMYK and YCCK JPEGs are decoded by libjpeg to CMYK; Pillow reads
 * the samples inverted (its rawmode "CMYK;I", Adobe's convention) and converts CMYK to RGB as
 * cmyk_to_rgb below does.
 *
 * Any libjpeg warning is an error here: a truncated file (libjpeg would pad it with grey),
 * corrupt entropy data, a bad marker. Progressive files may carry at most MAX_SCANS scans (a
 * file of thousands of tiny scans costs a full pass over the coefficients per scan). */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "image_internal.h"

#define MAX_SCANS 1000
#define MAX_MEMORY (1l << 30) /* libjpeg's working memory (the progressive coefficient buffer) */

typedef struct jpeg_fail {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX + 64];
} jpeg_fail;

static void on_error_exit(j_common_ptr c) {
    jpeg_fail *f = (jpeg_fail *)c->err;
    char m[JMSG_LENGTH_MAX];
    c->err->format_message(c, m);
    snprintf(f->msg, sizeof f->msg, "%s", m);
    longjmp(f->jb, 1);
}

/* level < 0: a warning, which means corrupt or truncated data; > 0: trace messages (ignored) */
static void on_message(j_common_ptr c, int level) {
    if (level >= 0) return;
    jpeg_fail *f = (jpeg_fail *)c->err;
    char m[JMSG_LENGTH_MAX];
    c->err->format_message(c, m);
    snprintf(f->msg, sizeof f->msg, "corrupt or truncated data: %s", m);
    longjmp(f->jb, 1);
}

static void on_progress(j_common_ptr c) {
    j_decompress_ptr d = (j_decompress_ptr)c;
    if (d->input_scan_number > MAX_SCANS) {
        jpeg_fail *f = (jpeg_fail *)c->err;
        snprintf(f->msg, sizeof f->msg, "more than %d scans (a scan bomb)", MAX_SCANS);
        longjmp(f->jb, 1);
    }
}

/* Pillow's CMYK -> RGB on the inverted samples: with nk = 255 - k, each channel is
 * nk - round(c * nk / 255), the division done as Pillow's MULDIV255 ((t + (t >> 8)) >> 8 with
 * t = c * nk + 128, exact for these ranges). */
static void cmyk_to_rgb(const uint8_t *in, uint8_t *out, int w) {
    for (int x = 0; x < w; x++, in += 4, out += 3) {
        int k = 255 - in[3], nk = 255 - k;
        for (int c = 0; c < 3; c++) {
            int t = (255 - in[c]) * nk + 128;
            int v = nk - ((t + (t >> 8)) >> 8);
            out[c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    }
}

typedef struct jpeg_job {
    struct jpeg_decompress_struct d;
    jpeg_fail fail;
    struct jpeg_progress_mgr progress;
    uint8_t *row; /* greyscale and CMYK: one row */
} jpeg_job;

static int decode(jpeg_job *J, const uint8_t *data, size_t len, const ds41_image_limits *lim, ds41_rgb_image *out,
                  ds41_err *err) {
    j_decompress_ptr d = &J->d;
    if (setjmp(J->fail.jb)) return ds41_errf(err, "JPEG: %s", J->fail.msg);
    jpeg_create_decompress(d);
    d->mem->max_memory_to_use = MAX_MEMORY;
    J->progress.progress_monitor = on_progress;
    d->progress = &J->progress;
    jpeg_mem_src(d, data, (unsigned long)len);
    jpeg_read_header(d, TRUE);
    if (ds41_image_check_size(d->image_width, d->image_height, lim, "JPEG", err)) return -1;
    int comps = 3; /* what libjpeg writes per pixel: 1 grey, 3 RGB, 4 CMYK */
    switch (d->jpeg_color_space) {
    case JCS_GRAYSCALE: comps = 1; break;
    case JCS_YCbCr: case JCS_RGB: break;
    case JCS_CMYK: case JCS_YCCK: comps = 4; break;
    default:
        return ds41_errf(err, "JPEG: unsupported colour space (code %d, %d components)", (int)d->jpeg_color_space,
                         d->num_components);
    }
    d->out_color_space = comps == 1 ? JCS_GRAYSCALE : comps == 4 ? JCS_CMYK : JCS_RGB;
    jpeg_start_decompress(d);
    int w = (int)d->output_width, h = (int)d->output_height;
    if (w != (int)d->image_width || h != (int)d->image_height || d->output_components != comps)
        return ds41_errf(err, "JPEG: internal: output %dx%dx%d for a %ux%u image", w, h, d->output_components,
                         d->image_width, d->image_height);
    if (ds41_rgb_image_alloc(out, w, h, 0, err)) return -1;
    if (comps != 3 && !(J->row = malloc((size_t)w * comps))) return ds41_errf(err, "JPEG: out of memory for a row");
    while (d->output_scanline < d->output_height) {
        uint8_t *dst = out->rgb + (size_t)d->output_scanline * w * 3;
        JSAMPROW r = comps == 3 ? dst : J->row;
        if (jpeg_read_scanlines(d, &r, 1) != 1) return ds41_errf(err, "JPEG: the decoder returned no row");
        if (comps == 1)
            for (int x = 0; x < w; x++) dst[3 * x] = dst[3 * x + 1] = dst[3 * x + 2] = J->row[x];
        else if (comps == 4)
            cmyk_to_rgb(J->row, dst, w);
    }
    jpeg_finish_decompress(d);
    return 0;
}

int ds41_jpeg_decode(const uint8_t *data, size_t len, const ds41_image_limits *lim, ds41_rgb_image *out,
                     ds41_err *err) {
    jpeg_job *J = calloc(1, sizeof *J); /* on the heap: setjmp/longjmp leave it intact */
    if (!J) return ds41_errf(err, "JPEG: out of memory");
    memset(out, 0, sizeof *out);
    J->d.err = jpeg_std_error(&J->fail.pub);
    J->fail.pub.error_exit = on_error_exit;
    J->fail.pub.emit_message = on_message;
    int rc = decode(J, data, len, lim, out, err);
    jpeg_destroy_decompress(&J->d);
    free(J->row);
    free(J);
    if (rc) ds41_rgb_image_free(out);
    return rc;
}
