/* ds41 image --pixels: runs the vision tower and aligner of a checkpoint on a BF16 pixel tensor and
 * prints the patch grid, the token grid and the span length; --dump writes the span's
 * embeddings (docs/vision.md). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_args.h"
#include "formats.h"
#include "model.h"
#include "vision.h"

static void usage(FILE *f) {
    fputs("usage: ds41 image -m DIR --pixels FILE --width W --height H [options]\n"
          "\n"
          "Runs the checkpoint's vision tower and aligner on FILE, a preprocessed image: raw\n"
          "little-endian BF16 values [3, H, W] (channel, row, column; normalised as the official\n"
          "processor does), W and H multiples of the patch size. Prints the patch grid, the token\n"
          "grid and the number of positions of the image span (start, one row of tokens per\n"
          "token-grid row each closed by a newline, end).\n"
          "\n"
          "options:\n"
          "  --dump FILE     write the span's embeddings, F32 little-endian [span rows, dim]\n"
          "  --tokens-only   with --dump: only the aligned tokens [gh * gw, dim], no delimiters\n"
          "  --exact         exact mode (bit-identical to tools/reference/vision.py); also DS41_EXACT=1\n"
          "  -t, --threads N threads (default 1)\n"
          "  -h, --help      this text\n",
          f);
}

/* FILE -> [3, H, W] floats; a clear message when its size is not 3 * H * W BF16 values. */
static float *read_pixels(const char *path, int H, int W) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "ds41 image: --pixels %s: cannot open: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t n = (size_t)3 * H * W;
    uint16_t *raw = malloc(n * sizeof *raw + 1);
    float *px = malloc(n * sizeof *px);
    size_t got = raw ? fread(raw, 1, n * sizeof *raw + 1, f) : 0;
    fclose(f);
    if (!raw || !px) {
        fprintf(stderr, "ds41 image: out of memory for %zu pixels\n", n);
    } else if (got != n * sizeof *raw) {
        fprintf(stderr, "ds41 image: --pixels %s: %s: expected exactly %zu bytes (BF16 [3, %d, %d])\n", path,
                got < n * sizeof *raw ? "too short" : "too long", n * sizeof *raw, H, W);
    } else {
        for (size_t i = 0; i < n; i++) {
            const uint8_t *b = (const uint8_t *)&raw[i];
            px[i] = ds41_bf16_to_f32((uint16_t)(b[0] | b[1] << 8));
        }
        free(raw);
        return px;
    }
    free(raw);
    free(px);
    return NULL;
}

int ds41_cli_image_tower(int argc, char **argv) {
    const char *dir = NULL, *pixels = NULL, *dump = NULL;
    long long W = 0, H = 0, threads = 1;
    int exact = getenv("DS41_EXACT") && !strcmp(getenv("DS41_EXACT"), "1"), tokens_only = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = !strcmp(a, "-m") || !strcmp(a, "--pixels") || !strcmp(a, "--width") || !strcmp(a, "--height") ||
                    !strcmp(a, "--dump") || !strcmp(a, "-t") || !strcmp(a, "--threads");
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--exact")) { exact = 1; continue; }
        if (!strcmp(a, "--tokens-only")) { tokens_only = 1; continue; }
        if (!takes) {
            fprintf(stderr, "ds41 image: unknown argument %s (ds41 image --help)\n", a);
            return 2;
        }
        if (!val) {
            fprintf(stderr, "ds41 image: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "-m")) dir = val;
        else if (!strcmp(a, "--pixels")) pixels = val;
        else if (!strcmp(a, "--dump")) dump = val;
        else if (!strcmp(a, "--width")) { if (ds41_cli_int("image", a, val, 1, DS41_VISION_MAX_SIDE, &W)) return 2; }
        else if (!strcmp(a, "--height")) { if (ds41_cli_int("image", a, val, 1, DS41_VISION_MAX_SIDE, &H)) return 2; }
        else if (ds41_cli_int("image", a, val, 1, 1024, &threads)) return 2;
    }
    if (!dir || !pixels || !W || !H) {
        fprintf(stderr, "ds41 image: -m DIR, --pixels FILE, --width W and --height H are required (ds41 image --help)\n");
        return 2;
    }
    if (ds41_cli_model_dir_ok("image", dir)) return 1;
    ds41_model m;
    ds41_vision v;
    ds41_err err = { 0 };
    if (ds41_model_open(dir, &m, &err)) {
        fprintf(stderr, "ds41 image: %s\n", err.msg);
        return 1;
    }
    int rc = 1, bound = ds41_vision_bind(&m.cfg, m.st, &v, &err);
    float *px = NULL, *out = NULL;
    ds41_ctx ctx = { .exact = exact, .n_threads = (int)threads };
    if (bound < 0) {
        fprintf(stderr, "ds41 image: %s: %s\n", dir, err.msg);
        goto done;
    }
    if (bound == 0) {
        fprintf(stderr, "ds41 image: %s: the checkpoint has no vision tower (%s)\n", dir,
                m.cfg.vision_n_layers ? "no vision.* tensors" : "no vision_config in config.json");
        goto done;
    }
    int n_h, n_w, gh, gw;
    if (ds41_vision_grid(&v, (int)H, (int)W, &n_h, &n_w, &gh, &gw, &err)) {
        fprintf(stderr, "ds41 image: %s\n", err.msg);
        goto done;
    }
    if (!(px = read_pixels(pixels, (int)H, (int)W))) goto done;
    int rows = tokens_only ? gh * gw : ds41_vision_span_rows(gh, gw);
    out = malloc((size_t)rows * v.lm_dim * sizeof(float));
    if (!out) {
        fprintf(stderr, "ds41 image: out of memory for %d x %d embeddings\n", rows, v.lm_dim);
        goto done;
    }
    if (threads > 1) ctx.pool = ds41_pool_create((int)threads);
    int e = tokens_only ? ds41_vision_encode(&ctx, &v, px, (int)H, (int)W, out, &err)
                        : ds41_vision_span(&ctx, &v, px, (int)H, (int)W, out, &err);
    if (e) {
        fprintf(stderr, "ds41 image: %s\n", err.msg);
        goto done;
    }
    printf("image %lld x %lld pixels, patch grid %d x %d, token grid %d x %d, span %d positions\n", W, H, n_w, n_h,
           gw, gh, ds41_vision_span_rows(gh, gw));
    if (dump) {
        FILE *f = fopen(dump, "wb");
        size_t n = (size_t)rows * v.lm_dim;
        if (!f || fwrite(out, sizeof(float), n, f) != n || fclose(f)) {
            fprintf(stderr, "ds41 image: --dump %s: cannot write: %s\n", dump, strerror(errno));
            goto done;
        }
    }
    rc = 0;
done:
    if (ctx.pool) ds41_pool_destroy(ctx.pool);
    free(px);
    free(out);
    ds41_vision_free(&v);
    ds41_model_close(&m);
    return rc;
}
