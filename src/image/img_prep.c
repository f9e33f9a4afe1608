/* ds41 image preprocessing: the reference's load_image after decoding. The image is resized
 * (stretched when the plan says so, else fitted with ImageOps.pad onto a grey 127 canvas), then
 * each sample v becomes bf16(((float)v / 255 - 0.5) / 0.5): FP32 division by 255, FP32
 * subtraction, FP32 division by 0.5 (exact), one rounding to BF16 (to nearest, ties to even), as
 * torch computes x / 255, (x - 0.5) / 0.5 and .to(torch.bfloat16) on the float32 array. With 256
 * possible inputs the result is a table. */
#include <stdlib.h>
#include <string.h>

#include "formats.h"
#include "image.h"

uint16_t ds41_image_norm_bf16(uint8_t v) {
    volatile float x = (float)v / 255.0f; /* volatile: no contraction or reassociation across steps */
    float y = (x - 0.5f) / 0.5f;
    return ds41_bf16_from_f32(y);
}

int ds41_image_preprocess(const ds41_rgb_image *im, const ds41_vision_params *vp, ds41_image_plan *plan,
                          uint16_t **pixels, ds41_err *err) {
    *pixels = NULL;
    if (ds41_image_plan_make(im->width, im->height, vp, plan, err)) return -1;
    ds41_rgb_image canvas, fitted;
    if (ds41_rgb_image_alloc(&canvas, plan->width, plan->height, 127, err)) return -1;
    if (ds41_image_resize_bicubic(im, plan->content_w, plan->content_h, &fitted, err)) {
        ds41_rgb_image_free(&canvas);
        return -1;
    }
    for (int y = 0; y < fitted.height; y++)
        memcpy(canvas.rgb + ((size_t)(y + plan->off_y) * canvas.width + plan->off_x) * 3,
               fitted.rgb + (size_t)y * fitted.width * 3, (size_t)fitted.width * 3);
    ds41_rgb_image_free(&fitted);
    uint16_t table[256];
    for (int v = 0; v < 256; v++) table[v] = ds41_image_norm_bf16((uint8_t)v);
    size_t plane = (size_t)plan->width * plan->height;
    uint16_t *out = malloc(plane * 3 * sizeof *out);
    if (!out) {
        ds41_rgb_image_free(&canvas);
        return ds41_errf(err, "preprocess: out of memory for %dx%d pixels", plan->width, plan->height);
    }
    for (size_t i = 0; i < plane; i++)
        for (int c = 0; c < 3; c++) out[c * plane + i] = table[canvas.rgb[i * 3 + c]];
    ds41_rgb_image_free(&canvas);
    *pixels = out;
    return 0;
}
