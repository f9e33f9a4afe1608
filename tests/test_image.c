/* Image input (src/image/): every case of the malformed-image corpus is refused with a one-line
 * message naming the fault; the size limits refuse before decoding; the resize plan gives the
 * sizes and token counts the reference gives (values checked against Pillow + the reference's
 * plan by tests/image_test.py); the normalisation table's exact end points; a constant image
 * stays constant through the bicubic resize (the 22-bit weights of a tap set sum to 2^22 within
 * a few units, far from moving a sample by one step). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "image.h"
#include "malformed.h"

static const char *root(void) {
    const char *r = getenv("DS41_ROOT");
    return r && *r ? r : ".";
}

static int load_image(const char *path, const char *name, ds41_err *err) {
    ds41_rgb_image im;
    int rc = ds41_image_load(path, NULL, &im, err);
    if (rc == 0) ds41_rgb_image_free(&im);
    else CHECK(im.rgb == NULL, "%s: pixels left allocated", name);
    return rc;
}

static void test_malformed_corpus(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/malformed/image", root());
    int n = malformed_corpus(dir, ".expected", load_image);
    CHECK(n >= 20, "only %d cases", n);
}

/* a valid 16x12 PNG and JPEG (the fuzz seeds) against tight limits */
static void test_limits(void) {
    const char *files[] = { "rgb.png", "baseline.jpg" };
    for (int i = 0; i < 2; i++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/fuzz/corpus/fuzz_image/%s", root(), files[i]);
        ds41_rgb_image im;
        ds41_err err;
        int rc = ds41_image_load(path, NULL, &im, &err);
        CHECK(rc == 0 && im.width == 16 && im.height == 12, "%s: %s", files[i], rc ? err.msg : "wrong size");
        if (!rc) ds41_rgb_image_free(&im);
        ds41_image_limits lim;
        ds41_image_limits_default(&lim);
        lim.max_pixels = 191;
        rc = ds41_image_load(path, &lim, &im, &err);
        CHECK(rc == -1 && strstr(err.msg, "192 pixels, beyond the limit of 191"), "%s pixels: %s", files[i], err.msg);
        ds41_image_limits_default(&lim);
        lim.max_side = 15;
        rc = ds41_image_load(path, &lim, &im, &err);
        CHECK(rc == -1 && strstr(err.msg, "beyond the limit of 15 pixels a side"), "%s side: %s", files[i], err.msg);
        ds41_image_limits_default(&lim);
        lim.max_bytes = 100;
        rc = ds41_image_load(path, &lim, &im, &err);
        CHECK(rc == -1 && strstr(err.msg, "more than the limit of 100"), "%s bytes: %s", files[i], err.msg);
    }
}

static void test_plan(void) {
    ds41_vision_params vp;
    ds41_vision_params_default(&vp);
    /* w, h -> padded w, h, content w, h, offsets, token grid, tokens */
    static const int cases[][11] = {
        { 400, 300, 630, 476, 630, 472, 0, 2, 12, 15, 194 },  /* min_pixels upscale, vertical pad */
        { 1, 1, 546, 546, 546, 546, 0, 0, 13, 13, 184 },       /* 544 x 544 -> 39 patches a side */
        { 1024, 1024, 1036, 1036, 1036, 1036, 0, 0, 25, 25, 652 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int *c = cases[i];
        ds41_image_plan p;
        ds41_err err;
        int rc = ds41_image_plan_make(c[0], c[1], &vp, &p, &err);
        CHECK(rc == 0, "%dx%d: %s", c[0], c[1], err.msg);
        CHECK(p.width == c[2] && p.height == c[3] && p.content_w == c[4] && p.content_h == c[5] && p.off_x == c[6] &&
                  p.off_y == c[7] && p.n_llm_h == c[8] && p.n_llm_w == c[9] && p.n_tokens == c[10],
              "%dx%d: %dx%d content %dx%d at %d,%d grid %dx%d tokens %d", c[0], c[1], p.width, p.height, p.content_w,
              p.content_h, p.off_x, p.off_y, p.n_llm_h, p.n_llm_w, p.n_tokens);
        CHECK(p.n_vit_w == p.width / 14 && p.n_vit_h == p.height / 14, "patch grid");
        CHECK(p.n_tokens <= vp.max_n_token, "tokens %d", p.n_tokens);
    }
    /* the token limit: every plan fits max_n_token, whatever the aspect ratio */
    for (int w = 1; w <= 20000; w = w * 3 + 1)
        for (int h = 1; h <= 20000; h = h * 5 + 2) {
            ds41_image_plan p;
            ds41_err err;
            if (ds41_image_plan_make(w, h, &vp, &p, &err) == 0)
                CHECK(p.n_tokens <= vp.max_n_token && p.n_tokens == p.n_llm_h * (p.n_llm_w + 1) + 2 &&
                          p.n_llm_h == (p.n_vit_h + 2) / 3 && p.n_llm_w == (p.n_vit_w + 2) / 3,
                      "%dx%d: %d tokens, grid %dx%d, patches %dx%d", w, h, p.n_tokens, p.n_llm_h, p.n_llm_w, p.n_vit_h,
                      p.n_vit_w);
            else CHECK(strstr(err.msg, "aspect ratio is too extreme") != NULL, "%dx%d: %s", w, h, err.msg);
        }
    ds41_image_plan p;
    ds41_err err;
    CHECK(ds41_image_plan_make(1000000, 1, &vp, &p, &err) == -1 && strstr(err.msg, "too extreme"), "%s", err.msg);
    vp.patch_size = 0;
    CHECK(ds41_image_plan_make(10, 10, &vp, &p, &err) == -1 && strstr(err.msg, "patch_size 0"), "%s", err.msg);
}

static void test_norm(void) {
    CHECK(ds41_image_norm_bf16(0) == 0xBF80, "0 -> %#x", ds41_image_norm_bf16(0));     /* -1.0 */
    CHECK(ds41_image_norm_bf16(255) == 0x3F80, "255 -> %#x", ds41_image_norm_bf16(255)); /* 1.0 */
    /* 127 (the padding grey): fp32(127/255) = 0.49803922, minus 0.5 = -0.0019607842, / 0.5 =
     * -0.0039215684 = -2^-8 * 1.0039216; 7 mantissa bits: 128.502 / 128 rounds up -> 0xBB81 */
    CHECK(ds41_image_norm_bf16(127) == 0xBB81, "127 -> %#x", ds41_image_norm_bf16(127));
    for (int v = 1; v < 256; v++) { /* monotone: negative values descend in bits, positive ascend */
        uint16_t x = ds41_image_norm_bf16((uint8_t)(v - 1)), y = ds41_image_norm_bf16((uint8_t)v);
        int sx = x >> 15, sy = y >> 15;
        CHECK(sx > sy || (sx == sy && (sx ? y <= x : y >= x)), "not monotone at %d", v);
    }
}

static void test_resize_constant(void) {
    static const int sizes[][4] = { { 37, 23, 546, 546 }, { 1000, 700, 91, 300 }, { 5, 400, 5, 17 }, { 9, 9, 9, 9 } };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (int v = 0; v < 256; v += 85) {
            ds41_rgb_image in, out;
            ds41_err err;
            if (ds41_rgb_image_alloc(&in, sizes[i][0], sizes[i][1], (uint8_t)v, &err)) {
                CHECK(0, "%s", err.msg);
                continue;
            }
            int rc = ds41_image_resize_bicubic(&in, sizes[i][2], sizes[i][3], &out, &err);
            CHECK(rc == 0, "%s", err.msg);
            size_t n = (size_t)sizes[i][2] * sizes[i][3] * 3, bad = 0;
            for (size_t k = 0; rc == 0 && k < n; k++) bad += out.rgb[k] != v;
            CHECK(bad == 0, "%dx%d -> %dx%d of %d: %zu samples moved", sizes[i][0], sizes[i][1], sizes[i][2],
                  sizes[i][3], v, bad);
            ds41_rgb_image_free(&in);
            if (!rc) ds41_rgb_image_free(&out);
        }
    }
}

int main(void) {
    RUN_CASE(test_malformed_corpus);
    RUN_CASE(test_limits);
    RUN_CASE(test_plan);
    RUN_CASE(test_norm);
    RUN_CASE(test_resize_constant);
    return check_exit();
}
