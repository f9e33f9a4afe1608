/* ds41 PNG decoding with libpng, to RGB as Pillow 9.4 gives it after convert("RGB").
 *
 * libpng unpacks the samples (png_set_packing: 1, 2 and 4-bit samples to one byte each, values
 * unscaled) and undoes interlacing; every other step is done here, following what Pillow's PNG
 * plugin and its mode conversions do to the same file:
 *   grey 1-bit       Pillow mode "1":            0 -> 0, 1 -> 255
 *   grey 2/4-bit     mode "L" (L;2, L;4):        v * 85, v * 17
 *   grey 8-bit       mode "L":                   v
 *   grey 16-bit      mode "I" (I;16B), then I -> RGB clamps to [0, 255]: min(v, 255), not v >> 8
 *   grey+alpha       mode "LA" (16-bit: the high byte), alpha dropped
 *   RGB, RGBA        8-bit as is; 16-bit: the high byte of each sample; alpha dropped
 *   palette          looked up in PLTE (any tRNS ignored, as convert("RGB") ignores it)
 * No gamma, sRGB or ICC handling (Pillow applies none). An index beyond the palette is refused
 * (the PNG specification calls it an error; libpng only warns). */
#include <png.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

#include "image_internal.h"

typedef struct png_src {
    const uint8_t *data;
    size_t len, pos;
    char msg[512];  /* libpng's error, or ours */
    char warn[256]; /* libpng's last warning: its errors often say only "Invalid IHDR data" */
} png_src;

static void on_error(png_structp png, png_const_charp msg) {
    png_src *s = png_get_error_ptr(png);
    if (!s->msg[0]) {
        if (s->warn[0]) snprintf(s->msg, sizeof s->msg, "%s (%s)", msg, s->warn);
        else snprintf(s->msg, sizeof s->msg, "%s", msg);
    }
    png_longjmp(png, 1);
}

/* Warnings (an unknown ancillary chunk, an sRGB profile libpng dislikes, a bad CRC on an
 * ancillary chunk, which libpng then skips) do not change the pixels: kept only to explain a
 * following error. */
static void on_warning(png_structp png, png_const_charp msg) {
    png_src *s = png_get_error_ptr(png);
    snprintf(s->warn, sizeof s->warn, "%s", msg);
}

static void on_read(png_structp png, png_bytep out, size_t n) {
    png_src *s = png_get_io_ptr(png);
    if (n > s->len - s->pos) {
        snprintf(s->msg, sizeof s->msg, "the file is truncated (%zu bytes; %zu more needed at byte %zu)", s->len,
                 n - (s->len - s->pos), s->len);
        png_longjmp(png, 1);
    }
    memcpy(out, s->data + s->pos, n);
    s->pos += n;
}

typedef struct png_layout {
    int color_type, depth, channels;
    png_colorp palette;
    int n_palette;
} png_layout;

/* One unpacked row (libpng's layout) to RGB. Returns -1 with *bad_index set on a palette index
 * beyond the palette. */
static int convert_row(const png_layout *L, const uint8_t *in, uint8_t *out, int width, int *bad_index) {
    static const uint8_t GREY_SCALE[17] = { 0, 255, 85, 0, 17, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1 };
    int ch = L->channels;
    for (int x = 0; x < width; x++, out += 3) {
        if (L->color_type == PNG_COLOR_TYPE_PALETTE) {
            int i = in[x];
            if (i >= L->n_palette) {
                *bad_index = i;
                return -1;
            }
            out[0] = L->palette[i].red;
            out[1] = L->palette[i].green;
            out[2] = L->palette[i].blue;
        } else if (L->depth == 16) {
            const uint8_t *p = in + (size_t)x * ch * 2;
            if (L->color_type == PNG_COLOR_TYPE_GRAY) {
                unsigned v = (unsigned)p[0] << 8 | p[1];
                out[0] = out[1] = out[2] = (uint8_t)(v > 255 ? 255 : v);
            } else if (ch <= 2) { /* grey + alpha */
                out[0] = out[1] = out[2] = p[0];
            } else {
                out[0] = p[0];
                out[1] = p[2];
                out[2] = p[4];
            }
        } else {
            const uint8_t *p = in + (size_t)x * ch;
            if (ch <= 2) {
                uint8_t v = L->depth == 8 ? p[0] : (uint8_t)(p[0] * GREY_SCALE[L->depth]);
                out[0] = out[1] = out[2] = v;
            } else {
                out[0] = p[0];
                out[1] = p[1];
                out[2] = p[2];
            }
        }
    }
    return 0;
}

typedef struct png_job {
    png_structp png;
    png_infop info;
    uint8_t *rows;   /* one row, or the whole image when interlaced */
    png_bytep *ptrs; /* interlaced: the row pointers */
} png_job;

static int decode(png_job *J, png_src *src, const ds41_image_limits *lim, ds41_rgb_image *out, ds41_err *err) {
    png_structp png = J->png;
    png_infop info = J->info;
    if (setjmp(png_jmpbuf(png))) return ds41_errf(err, "PNG: %s", src->msg[0] ? src->msg : "corrupt file");
    /* The size limits are checked below, on the header, before libpng allocates its rows (its
     * own default cap of 1,000,000 a side stays as a backstop). No ancillary chunk (compressed
     * text, ICC profile) may inflate beyond 8 MiB. */
    png_set_chunk_malloc_max(png, 8u << 20);
    png_set_read_fn(png, src, on_read);
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    if (ds41_image_check_size(w, h, lim, "PNG", err)) return -1;
    png_layout L = { .color_type = png_get_color_type(png, info), .depth = png_get_bit_depth(png, info) };
    L.channels = png_get_channels(png, info);
    if (L.color_type == PNG_COLOR_TYPE_PALETTE && !png_get_PLTE(png, info, &L.palette, &L.n_palette))
        return ds41_errf(err, "PNG: a palette image without a PLTE chunk");
    png_set_packing(png);
    int passes = png_set_interlace_handling(png);
    png_read_update_info(png, info);
    size_t rowbytes = png_get_rowbytes(png, info);
    if (rowbytes < (size_t)w * L.channels * (L.depth == 16 ? 2 : 1))
        return ds41_errf(err, "PNG: internal: row of %zu bytes for %u pixels", rowbytes, (unsigned)w);
    size_t nrows = passes > 1 ? h : 1;
    J->rows = calloc(nrows, rowbytes);
    if (!J->rows) return ds41_errf(err, "PNG: out of memory for %zu rows of %zu bytes", nrows, rowbytes);
    if (ds41_rgb_image_alloc(out, (int)w, (int)h, 0, err)) return -1;
    int bad = -1;
    if (passes > 1) {
        J->ptrs = malloc(h * sizeof *J->ptrs);
        if (!J->ptrs) return ds41_errf(err, "PNG: out of memory for %u row pointers", (unsigned)h);
        for (png_uint_32 y = 0; y < h; y++) J->ptrs[y] = J->rows + (size_t)y * rowbytes;
        png_read_image(png, J->ptrs);
        for (png_uint_32 y = 0; y < h && bad < 0; y++)
            convert_row(&L, J->rows + (size_t)y * rowbytes, out->rgb + (size_t)y * w * 3, (int)w, &bad);
    } else {
        for (png_uint_32 y = 0; y < h && bad < 0; y++) {
            png_read_row(png, J->rows, NULL);
            convert_row(&L, J->rows, out->rgb + (size_t)y * w * 3, (int)w, &bad);
        }
    }
    if (bad >= 0)
        return ds41_errf(err, "PNG: palette index %d beyond the %d entries of the PLTE chunk", bad, L.n_palette);
    /* the chunks after the image data up to IEND: a file cut after its pixels is refused too */
    png_read_end(png, NULL);
    return 0;
}

int ds41_png_decode(const uint8_t *data, size_t len, const ds41_image_limits *lim, ds41_rgb_image *out,
                    ds41_err *err) {
    png_src src = { .data = data, .len = len };
    png_job J = { 0 };
    memset(out, 0, sizeof *out);
    J.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, on_error, on_warning);
    if (!J.png) return ds41_errf(err, "PNG: cannot create the libpng reader");
    J.info = png_create_info_struct(J.png);
    int rc = J.info ? decode(&J, &src, lim, out, err) : ds41_errf(err, "PNG: cannot create the libpng info");
    png_destroy_read_struct(&J.png, &J.info, NULL);
    free(J.rows);
    free(J.ptrs);
    if (rc) ds41_rgb_image_free(out);
    return rc;
}
