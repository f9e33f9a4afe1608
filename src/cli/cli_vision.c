/* ds41 image with a vision tower (cli_image.c parses the command): runs the checkpoint's tower
 * and aligner on a preprocessed pixel tensor (from a decoded file, or --pixels), prints the
 * patch grid, the token grid and the span length; --dump writes the span's embeddings
 * (docs/vision.md); --bench times the encode and counts its floating-point work. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_args.h"
#include "cli_vision.h"
#include "formats.h"
#include "model.h"
#include "vision.h"

float *ds41_cli_read_pixels(const char *path, int H, int W) {
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

/* Floating-point operations of one encode (a multiply-add counts 2): the patch embedding, per
 * block the qkv, output, gate/up and down linears and the attention's q.k and p.v products,
 * then the aligner's two linears. Norms, rotary, softmax and activations are left out (under
 * 1 % at the released shape). */
static double encode_flops(const ds41_vision *v, int n, int tokens) {
    double D = v->dim, I = v->inter, p2 = (double)v->patch * v->patch, r2 = (double)v->ratio * v->ratio;
    double block = 2.0 * n * (3 * D * D + D * D + 2 * I * D + I * D) + 2.0 * 2.0 * n * (double)n * D;
    return 2.0 * n * D * 3 * p2 + v->n_layers * block +
           2.0 * tokens * (D * r2 * v->lm_dim + (double)v->lm_dim * v->lm_dim);
}

int ds41_cli_image_tower(const ds41_cli_tower_args *a, const float *pixels) {
    ds41_model m;
    ds41_vision v;
    ds41_err err = { 0 };
    if (ds41_model_open(a->dir, &m, &err)) {
        fprintf(stderr, "ds41 image: %s\n", err.msg);
        return 1;
    }
    int rc = 1, bound = ds41_vision_bind(&m.cfg, m.st, &v, &err);
    float *out = NULL, *own = NULL;
    const float *px = pixels;
    double *ms = NULL, *cpu = NULL;
    ds41_ctx ctx = { .exact = a->exact, .n_threads = a->threads };
    if (bound < 0) {
        fprintf(stderr, "ds41 image: %s: %s\n", a->dir, err.msg);
        goto done;
    }
    if (bound == 0) {
        fprintf(stderr, "ds41 image: %s: the checkpoint has no vision tower (%s)\n", a->dir,
                m.cfg.vision_n_layers ? "no vision.* tensors" : "no vision_config in config.json");
        goto done;
    }
    int n_h, n_w, gh, gw, H = a->height, W = a->width;
    if (ds41_vision_grid(&v, H, W, &n_h, &n_w, &gh, &gw, &err)) {
        fprintf(stderr, "ds41 image: %s\n", err.msg);
        goto done;
    }
    if (!px && !(px = own = ds41_cli_read_pixels(a->raw, H, W))) goto done;
    int rows = a->tokens_only ? gh * gw : ds41_vision_span_rows(gh, gw), reps = a->bench > 0 ? a->bench : 1;
    out = malloc((size_t)rows * v.lm_dim * sizeof(float));
    ms = calloc((size_t)reps, sizeof *ms);
    cpu = calloc((size_t)reps, sizeof *cpu);
    if (!out || !ms || !cpu) {
        fprintf(stderr, "ds41 image: out of memory for %d x %d embeddings\n", rows, v.lm_dim);
        goto done;
    }
    if (a->threads > 1) ctx.pool = ds41_pool_create(a->threads);
    for (int r = 0; r < reps; r++) {
        double t0 = ds41_cli_now(), c0 = ds41_cli_cpu_process();
        int e = a->tokens_only ? ds41_vision_encode(&ctx, &v, px, H, W, out, &err)
                               : ds41_vision_span(&ctx, &v, px, H, W, out, &err);
        ms[r] = (ds41_cli_now() - t0) * 1e3;
        cpu[r] = (ds41_cli_cpu_process() - c0) * 1e3;
        if (e) {
            fprintf(stderr, "ds41 image: %s\n", err.msg);
            goto done;
        }
    }
    FILE *say = a->to_stderr ? stderr : stdout;
    fprintf(say, "image %d x %d pixels, patch grid %d x %d, token grid %d x %d, span %d positions\n", W, H, n_w, n_h, gw,
           gh, ds41_vision_span_rows(gh, gw));
    if (a->bench > 0) {
        /* CPU time beside the wall time: on a loaded machine the CPU seconds of the process
         * (all its threads) are the work, the wall time is the work plus the waiting */
        double t = ds41_cli_median(ms, reps), c = ds41_cli_median(cpu, reps), gf = encode_flops(&v, n_h * n_w, gh * gw) / 1e9;
        fprintf(say, "encode         tower + aligner %.1f ms wall, %.1f ms CPU (medians of %d, %s, %d thread%s): %d patches, "
               "%d image tokens, %.1f GFLOP, %.2f GFLOP/s of wall, %.2f GFLOP/s per CPU second\n", t, c, reps,
               a->exact ? "exact" : "fast", a->threads, a->threads == 1 ? "" : "s", n_h * n_w, gh * gw, gf,
               gf / (t / 1e3), gf / (c / 1e3));
    }
    if (a->dump) {
        FILE *f = fopen(a->dump, "wb");
        size_t n = (size_t)rows * v.lm_dim;
        if (!f || fwrite(out, sizeof(float), n, f) != n || fclose(f)) {
            fprintf(stderr, "ds41 image: --dump %s: cannot write: %s\n", a->dump, strerror(errno));
            goto done;
        }
    }
    rc = 0;
done:
    if (ctx.pool) ds41_pool_destroy(ctx.pool);
    free(out);
    free(own);
    free(ms);
    free(cpu);
    ds41_vision_free(&v);
    ds41_model_close(&m);
    return rc;
}
