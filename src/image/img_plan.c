/* ds41 image plan: the pixel size an image is resized to and the token grid it becomes, as the
 * reference's plan_image_grid / safe_resize / solve_resize_ratio compute them (S1
 * image_processor.py). The arithmetic follows Python's: `/` of two ints is a correctly rounded
 * double division (the ints here are exact in double), `**0.5` is libm pow, int() truncates,
 * math.floor / math.ceil of a double. */
#include <math.h>
#include <string.h>

#include "image.h"

void ds41_vision_params_default(ds41_vision_params *vp) {
    /* the reference ModelArgs defaults, equal to the release config */
    vp->patch_size = 14;
    vp->downsample_ratio = 3;
    vp->max_n_token = 1024;
    vp->min_pixels = 295936;
    vp->max_wh_ratio = -1;
    vp->image_token_id = 129264;
}

static int64_t n_tokens(int64_t n_llm_h, int64_t n_llm_w) {
    return n_llm_h * (n_llm_w + 1) + 2;
}

/* llm_grid: the aligner's grid for a pixel size (the patch grid divided by r, rounded up) */
static void llm_grid(int64_t h, int64_t w, const ds41_vision_params *vp, int64_t *nh, int64_t *nw) {
    *nh = (int64_t)ceil((double)(h / vp->patch_size) / (double)vp->downsample_ratio);
    *nw = (int64_t)ceil((double)(w / vp->patch_size) / (double)vp->downsample_ratio);
}

/* solve_resize_ratio: the largest aspect-keeping size whose grid fits max_n_token */
static void solve_ratio(int64_t height, int64_t width, const ds41_vision_params *vp, int64_t *bh, int64_t *bw) {
    int64_t p = vp->patch_size, cell = (int64_t)vp->patch_size * vp->downsample_ratio, mx = vp->max_n_token;
    double r = (double)height / (double)width;
    double max_w = sqrt((double)(mx - 2) / r + 0.25) - 0.5;
    double max_h = max_w * r;
    if (max_w < 1.0) { /* very tall: one column */
        *bh = (mx - 2) / 2 * cell;
        *bw = cell;
        return;
    }
    if (max_h < 1.0) { /* very wide: one row */
        *bh = cell;
        *bw = (mx - 3) * cell;
        return;
    }
    double bx = (double)((int64_t)floor(max_w) * cell) / (double)width;
    double by = (double)((int64_t)floor(max_h) * cell) / (double)height;
    double beta = by < bx ? by : bx; /* Python's min keeps the first of equals */
    *bh = (int64_t)floor((double)height * beta / (double)p) * p;
    *bw = (int64_t)floor((double)width * beta / (double)p) * p;
}

/* ImageOps.contain's size for a w x h image inside W x H, with Python's round (half to even) */
static void contain(int w, int h, int W, int H, int *cw, int *ch) {
    double im = (double)w / h, dest = (double)W / H;
    *cw = W;
    *ch = H;
    if (im > dest) {
        *ch = (int)nearbyint((double)h / w * W);
    } else if (im < dest) {
        *cw = (int)nearbyint((double)w / h * H);
    }
}

int ds41_image_plan_make(int orig_w, int orig_h, const ds41_vision_params *vp, ds41_image_plan *plan,
                         ds41_err *err) {
    memset(plan, 0, sizeof *plan);
    if (vp->patch_size < 1 || vp->downsample_ratio < 1 || vp->max_n_token < 3 || vp->min_pixels < 0)
        return ds41_errf(err, "vision parameters: patch_size %d, downsample_ratio %d, max_n_token %d, min_pixels "
                         "%lld are not usable (need >= 1, >= 1, >= 3, >= 0)", vp->patch_size, vp->downsample_ratio,
                         vp->max_n_token, (long long)vp->min_pixels);
    if (orig_w < 1 || orig_h < 1) return ds41_errf(err, "image size %dx%d is empty", orig_w, orig_h);
    int64_t w = orig_w, h = orig_h, p = vp->patch_size;
    if (vp->max_wh_ratio > 0 && w > h * vp->max_wh_ratio) w = h * vp->max_wh_ratio;
    if (w * h > 0 && w * h < vp->min_pixels) {
        double ratio = pow((double)vp->min_pixels / (double)(w * h), 0.5);
        w = (int64_t)((double)w * ratio);
        h = (int64_t)((double)h * ratio);
    }
    int64_t bw = (int64_t)ceil((double)w / (double)p) * p;
    int64_t bh = (int64_t)ceil((double)h / (double)p) * p;
    int64_t nh, nw;
    llm_grid(bh, bw, vp, &nh, &nw);
    if (n_tokens(nh, nw) > vp->max_n_token) {
        solve_ratio(h, w, vp, &bh, &bw);
        llm_grid(bh, bw, vp, &nh, &nw);
    }
    if (n_tokens(nh, nw) > vp->max_n_token || bh < p || bw < p)
        return ds41_errf(err, "image %dx%d: no resize plan fits (planned %lldx%lld, %lld tokens, limit %d)", orig_w,
                         orig_h, (long long)bw, (long long)bh, (long long)n_tokens(nh, nw), vp->max_n_token);
    plan->orig_w = orig_w;
    plan->orig_h = orig_h;
    plan->width = (int)bw;
    plan->height = (int)bh;
    plan->n_vit_w = (int)(bw / p);
    plan->n_vit_h = (int)(bh / p);
    plan->n_llm_w = (int)nw;
    plan->n_llm_h = (int)nh;
    plan->n_tokens = (int)n_tokens(nh, nw);
    /* the reference tests the original size here, with >= where the plan used > */
    plan->stretch = vp->max_wh_ratio > 0 && (int64_t)orig_w >= (int64_t)vp->max_wh_ratio * orig_h;
    if (plan->stretch) {
        plan->content_w = plan->width;
        plan->content_h = plan->height;
    } else {
        contain(orig_w, orig_h, plan->width, plan->height, &plan->content_w, &plan->content_h);
        /* ImageOps.pad: centred, round((W - w) * 0.5) with Python's round */
        if (plan->content_w != plan->width) plan->off_x = (int)nearbyint((plan->width - plan->content_w) * 0.5);
        else plan->off_y = (int)nearbyint((plan->height - plan->content_h) * 0.5);
    }
    if (plan->content_w < 1 || plan->content_h < 1)
        return ds41_errf(err, "image %dx%d: its aspect ratio is too extreme: it would be resized to %dx%d inside "
                         "%dx%d", orig_w, orig_h, plan->content_w, plan->content_h, plan->width, plan->height);
    return 0;
}
