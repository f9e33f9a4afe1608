/* ds41 image: decodes an image and runs the official preprocessing (src/image/) with the
 * model's vision parameters; prints the sizes, the patch grid and the token count, and can write
 * the normalised BF16 pixel tensor (--dump-pixels) or time the preprocessing (--bench). When the
 * checkpoint has a vision tower, the pixels then go through it (cli_vision.c): --dump writes the
 * image span's embeddings, --bench times the encode too. --pixels starts from a tensor. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_args.h"
#include "config.h"
#include "formats.h"
#include "cli_vision.h"
#include "image.h"
#include "vision_weights.h"

static void usage(FILE *f) {
    fputs("usage: ds41 image [-m DIR] [options] FILE\n"
          "       ds41 image -m DIR --pixels RAW --width W --height H [options]\n"
          "\n"
          "Decodes FILE (PNG or JPEG) and preprocesses it as the official image processor does:\n"
          "convert to RGB, resize with Pillow's bicubic filter to the planned size (keeping the\n"
          "aspect ratio, padded with grey 127), normalise to (x/255 - 0.5)/0.5 and round to BF16.\n"
          "Prints the original size, the resized and padded size, the patch grid, the token grid\n"
          "after the aligner's unshuffle and the number of LLM tokens the image takes (one row of\n"
          "image tokens per grid row, each closed by a newline token, between a start and an end\n"
          "token). The parameters come from DIR/config.json (vision_config; the flat config's\n"
          "vision_* keys); without -m, or without them there, the reference defaults (patch 14,\n"
          "unshuffle 3, at most 1024 tokens, min_pixels 295936, no width/height clamp).\n"
          "\n"
          "When DIR holds a checkpoint with a vision tower, the pixels then run through the tower\n"
          "and the aligner, and one more line gives the patch grid, token grid and span length of\n"
          "the encode. With --pixels RAW (raw little-endian BF16 [3, H, W], normalised, W and H\n"
          "multiples of the patch size) the tower runs on that tensor instead of a decoded file.\n"
          "\n"
          "options:\n"
          "  -m, --model DIR       checkpoint directory (or its config.json)\n"
          "  --json                print the plan as one JSON object instead of the text (the\n"
          "                        tower's lines then go to stderr)\n"
          "  --dump-pixels OUT     write the pixel tensor: BF16 little-endian, [3][height][width]\n"
          "                        (channels R, G, B; the reference's x before it is cut into patches)\n"
          "  --dump OUT            (tower) write the span's embeddings, F32 little-endian [span rows, dim]\n"
          "  --tokens-only         (tower) with --dump: only the aligned tokens [gh * gw, dim]\n"
          "  --exact               (tower) exact mode, bit-identical to tools/reference/vision.py;\n"
          "                        also DS41_EXACT=1\n"
          "  -t, --threads N       (tower) threads (default 1)\n"
          "  --bench N             decode and preprocess N times and print the median time (ms); with\n"
          "                        a tower also encode N times: median ms, GFLOP and GFLOP/s\n"
          "  --max-pixels N        refuse images of more than N pixels (default 50000000)\n"
          "  --max-side N          refuse images wider or taller than N (default 16384)\n"
          "  --pixels RAW --width W --height H   start from a preprocessed tensor (needs the tower)\n"
          "  -h, --help            this text\n"
          "\n"
          "examples:\n"
          "  ds41 image -m tests/configs/tiny photo.jpg\n"
          "  ds41 image --json --dump-pixels x.bf16 photo.png\n"
          "  ds41 image -m DIR --exact --dump span.f32 photo.png     # DIR with a vision tower\n",
          f);
}

/* *tower: 1 when the config has a vision tower and DIR holds weights to run it. */
static int params_from_config(const char *model, ds41_vision_params *vp, int *tower) {
    ds41_vision_params_default(vp);
    *tower = 0;
    if (!model) return 0;
    ds41_config cfg;
    ds41_err err;
    if (ds41_config_load(model, &cfg, &err)) {
        fprintf(stderr, "ds41 image: %s\n", err.msg);
        return -1;
    }
    *tower = cfg.vision_n_layers > 0 && (ds41_cli_file_exists(model, "model.safetensors") ||
                                         ds41_cli_file_exists(model, "model.safetensors.index.json"));
    if (cfg.vision_n_layers == 0)
        fprintf(stderr, "ds41 image: note: %s has no vision tower (vision layers 0); the plan below is what its "
                        "parameters give\n", model);
    ds41_vision_params_of(&cfg, vp);
    ds41_config_free(&cfg);
    return 0;
}

static int write_pixels(const char *path, const uint16_t *px, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        return -1;
    }
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        uint8_t b[2] = { (uint8_t)(px[i] & 0xFF), (uint8_t)(px[i] >> 8) };
        ok = fwrite(b, 1, 2, f) == 2;
    }
    if (fclose(f) != 0) ok = 0;
    if (!ok) fprintf(stderr, "ds41 image: %s: write failed\n", path);
    return ok ? 0 : -1;
}

static void print_plan(const char *file, const ds41_image_plan *p, const ds41_vision_params *vp, int json) {
    int n_img = p->n_llm_h * p->n_llm_w;
    if (json) {
        json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:i, s:i, s:i, s:i, s:i, s:i, "
                              "s:i, s:i, s:i, s:i}",
                              "file", file, "width", p->orig_w, "height", p->orig_h, "resized_width", p->content_w,
                              "resized_height", p->content_h, "offset_x", p->off_x, "offset_y", p->off_y,
                              "padded_width", p->width, "padded_height", p->height, "stretch", p->stretch,
                              "patch_size", vp->patch_size, "n_vit_h", p->n_vit_h, "n_vit_w", p->n_vit_w,
                              "downsample_ratio", vp->downsample_ratio, "n_llm_h", p->n_llm_h, "n_llm_w",
                              p->n_llm_w, "image_tokens", n_img, "newline_tokens", p->n_llm_h, "tokens",
                              p->n_tokens, "image_token_id", vp->image_token_id);
        char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
        printf("%s\n", s);
        free(s);
        json_decref(o);
        return;
    }
    printf("image          %s\n", file);
    printf("original size  %d x %d\n", p->orig_w, p->orig_h);
    if (p->stretch) printf("resized        %d x %d (stretched: wider than max_wh_ratio)\n", p->content_w, p->content_h);
    else printf("resized        %d x %d, padded to %d x %d with grey 127 (offset %d, %d)\n", p->content_w,
                p->content_h, p->width, p->height, p->off_x, p->off_y);
    printf("patch grid     %d x %d patches of %d x %d pixels (%d patches)\n", p->n_vit_h, p->n_vit_w,
           vp->patch_size, vp->patch_size, p->n_vit_h * p->n_vit_w);
    printf("token grid     %d x %d after the %dx%d unshuffle (patch grid padded up to a multiple of %d)\n",
           p->n_llm_h, p->n_llm_w, vp->downsample_ratio, vp->downsample_ratio, vp->downsample_ratio);
    printf("tokens         %d = %d image + %d newline + start + end (limit %d), each carrying id %d\n",
           p->n_tokens, n_img, p->n_llm_h, vp->max_n_token, vp->image_token_id);
}

/* --pixels RAW: the tower on a preprocessed tensor. */
static int pixels_tower(ds41_cli_tower_args *ta, const char *raw) {
    if (!ta->dir || !ta->width || !ta->height) {
        fprintf(stderr, "ds41 image: -m DIR, --pixels FILE, --width W and --height H are required (ds41 image --help)\n");
        return 2;
    }
    if (ds41_cli_model_dir_ok("image", ta->dir)) return 1;
    ta->raw = raw;
    return ds41_cli_image_tower(ta, NULL);
}

int ds41_cli_image(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *dump = NULL, *raw = NULL;
    int json = 0;
    ds41_cli_tower_args ta = { .threads = 1, .exact = getenv("DS41_EXACT") && !strcmp(getenv("DS41_EXACT"), "1") };
    long long bench = 0, v;
    ds41_image_limits lim;
    ds41_image_limits_default(&lim);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has) {
            model = argv[++i];
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--dump-pixels") && has) {
            dump = argv[++i];
        } else if (!strcmp(a, "--dump") && has) {
            ta.dump = argv[++i];
        } else if (!strcmp(a, "--pixels") && has) {
            raw = argv[++i];
        } else if ((!strcmp(a, "--width") || !strcmp(a, "--height")) && has) {
            if (ds41_cli_int("image", a, argv[++i], 1, DS41_IMAGE_MAX_SIDE, &v)) return 2;
            *(a[2] == 'w' ? &ta.width : &ta.height) = (int)v;
        } else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && has) {
            if (ds41_cli_int("image", a, argv[++i], 1, 1024, &v)) return 2;
            ta.threads = (int)v;
        } else if (!strcmp(a, "--exact")) {
            ta.exact = 1;
        } else if (!strcmp(a, "--tokens-only")) {
            ta.tokens_only = 1;
        } else if (!strcmp(a, "--bench") && has) {
            if (ds41_cli_int("image", a, argv[++i], 1, 100000, &bench)) return 2;
        } else if (!strcmp(a, "--max-pixels") && has) {
            if (ds41_cli_int("image", a, argv[++i], 1, 1ll << 40, &v)) return 2;
            lim.max_pixels = (uint64_t)v;
        } else if (!strcmp(a, "--max-side") && has) {
            if (ds41_cli_int("image", a, argv[++i], 1, 1 << 30, &v)) return 2;
            lim.max_side = (int)v;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "ds41 image: unknown option or missing value: %s (ds41 image --help)\n", a);
            return 2;
        } else if (!file) {
            file = a;
        } else {
            fprintf(stderr, "ds41 image: one FILE only (got %s and %s)\n", file, a);
            return 2;
        }
    }
    ta.dir = model;
    ta.bench = (int)bench;
    ta.to_stderr = json;
    if (raw) {
        if (file) {
            fprintf(stderr, "ds41 image: give FILE or --pixels RAW, not both\n");
            return 2;
        }
        return pixels_tower(&ta, raw);
    }
    if (!file) {
        usage(stderr);
        return 2;
    }
    if ((ta.dump || ta.tokens_only) && !model) {
        fprintf(stderr, "ds41 image: --dump and --tokens-only need -m DIR with a vision tower\n");
        return 2;
    }
    ds41_vision_params vp;
    int tower;
    if (params_from_config(model, &vp, &tower)) return 1;
    if ((ta.dump || ta.tokens_only) && !tower) {
        fprintf(stderr, "ds41 image: --dump: %s has no vision tower to run (vision layers 0, or no weights)\n", model);
        return 2;
    }
    int reps = bench > 0 ? (int)bench : 1;
    double *ms = calloc((size_t)reps, sizeof *ms);
    if (!ms) return 1;
    ds41_image_plan plan;
    uint16_t *px = NULL;
    ds41_err err;
    int rc = 0;
    for (int r = 0; r < reps && !rc; r++) {
        double t0 = ds41_cli_now();
        ds41_rgb_image im;
        free(px);
        px = NULL;
        if (ds41_image_load(file, &lim, &im, &err)) {
            fprintf(stderr, "ds41 image: %s\n", err.msg);
            rc = 1;
            break;
        }
        if (ds41_image_preprocess(&im, &vp, &plan, &px, &err)) {
            fprintf(stderr, "ds41 image: %s: %s\n", file, err.msg);
            rc = 1;
        }
        ds41_rgb_image_free(&im);
        ms[r] = (ds41_cli_now() - t0) * 1e3;
    }
    if (!rc) {
        print_plan(file, &plan, &vp, json);
        if (bench > 0)
            fprintf(json ? stderr : stdout, "bench          decode + preprocess %.3f ms (median of %d)\n",
                    ds41_cli_median(ms, reps), reps);
        if (dump && write_pixels(dump, px, (size_t)3 * plan.width * plan.height)) rc = 1;
    }
    if (!rc && tower) {
        size_t n = (size_t)3 * plan.width * plan.height;
        float *f = malloc(n * sizeof *f);
        if (!f) {
            fprintf(stderr, "ds41 image: out of memory for %zu pixels\n", n);
            rc = 1;
        } else {
            for (size_t i = 0; i < n; i++) f[i] = ds41_bf16_to_f32(px[i]);
            ta.width = plan.width;
            ta.height = plan.height;
            fflush(stdout);
            rc = ds41_cli_image_tower(&ta, f);
            free(f);
        }
    }
    free(px);
    free(ms);
    return rc;
}
