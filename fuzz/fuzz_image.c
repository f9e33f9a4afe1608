/* libFuzzer harness for the image decoders and preprocessing (src/image/): any byte string must
 * either decode into an image inside the limits or fail with a one-line message; never crash,
 * leak or overflow. A decoded image then goes through the plan, the bicubic resize, the pad and
 * the normalisation (with a small token budget, to keep each run fast).
 * Build and run with `make fuzz` (clang, -fsanitize=fuzzer,address,undefined). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ds41_image_limits lim;
    ds41_image_limits_default(&lim);
    lim.max_side = 2048; /* the harness's memory: 2048 x 2048 x 3 at most */
    lim.max_pixels = 1u << 20;
    ds41_rgb_image im;
    ds41_err e;
    memset(&e, 0, sizeof e);
    if (ds41_image_decode(data, size, &lim, &im, &e) != 0) {
        if (!memchr(e.msg, 0, sizeof e.msg) || strchr(e.msg, '\n') || !e.msg[0] || im.rgb) abort();
        return 0;
    }
    if (im.width < 1 || im.height < 1 || im.width > lim.max_side || im.height > lim.max_side || !im.rgb) abort();
    ds41_vision_params vp;
    ds41_vision_params_default(&vp);
    vp.max_n_token = 40;
    vp.min_pixels = 0;
    vp.max_wh_ratio = (int)(size % 3) * 4; /* 0 (none), 4 or 8: both the pad and the stretch */
    if (!vp.max_wh_ratio) vp.max_wh_ratio = -1;
    ds41_image_plan plan;
    uint16_t *px = NULL;
    if (ds41_image_preprocess(&im, &vp, &plan, &px, &e) == 0) {
        if (!px || plan.n_tokens > vp.max_n_token || plan.width % vp.patch_size || plan.height % vp.patch_size) abort();
        free(px);
    } else if (px || !e.msg[0] || strchr(e.msg, '\n')) {
        abort();
    }
    ds41_rgb_image_free(&im);
    return 0;
}
