/* ds41 library: image spans through the vision tower (include/ds41.h ds41_image_span). The
 * tower's views are bound per call (a few hundred name lookups, nothing copied), so the
 * engine stays as ds41_load made it. */
#include <stdio.h>
#include <stdlib.h>

#include "ds41.h"
#include "formats.h"
#include "forward.h"
#include "image.h"
#include "sha256.h"
#include "vision.h"

int ds41_model_dim(const ds41_engine *e) { return e->cfg->dim; }
int ds41_image_token_id(const ds41_engine *e) { return e->cfg->image_token_id; }
int ds41_has_vision(const ds41_engine *e) {
    ds41_vision v;
    ds41_err err = { 0 };
    int b = e->cfg->vision_n_layers > 0 ? ds41_vision_bind(e->cfg, e->model->st, &v, &err) : 0;
    if (b == 1) ds41_vision_free(&v);
    return b == 1;
}

static int span_on(ds41_engine *e, const ds41_ctx *ctx, const float *pixels, int H, int W, float **out, int *rows,
                   char *errbuf, size_t errcap) {
    ds41_vision v;
    ds41_err err = { 0 };
    int n_h, n_w, gh, gw, rc = -1;
    *out = NULL;
    *rows = 0;
    int b = ds41_vision_bind(e->cfg, e->model->st, &v, &err);
    if (b == 0) ds41_errf(&err, "the checkpoint has no vision tower");
    if (b == 1 && !ds41_vision_grid(&v, H, W, &n_h, &n_w, &gh, &gw, &err)) {
        int r = ds41_vision_span_rows(gh, gw);
        float *o = malloc((size_t)r * e->cfg->dim * sizeof(float));
        if (!o) {
            ds41_errf(&err, "out of memory for an image span of %d positions", r);
        } else if (ds41_vision_span(ctx, &v, pixels, H, W, o, &err)) {
            free(o);
        } else {
            *out = o;
            *rows = r;
            rc = 0;
        }
    }
    if (rc && errbuf && errcap) snprintf(errbuf, errcap, "%s", err.msg);
    ds41_vision_free(&v);
    return rc;
}

int ds41_image_span_positions(const ds41_engine *e, int width, int height, char *errbuf, size_t errcap) {
    ds41_vision_params vp;
    ds41_image_plan plan;
    ds41_err err = { 0 };
    if (e->cfg->vision_n_layers == 0) {
        if (errbuf && errcap) snprintf(errbuf, errcap, "the checkpoint has no vision tower");
        return -1;
    }
    ds41_vision_params_of(e->cfg, &vp);
    if (ds41_image_plan_make(width, height, &vp, &plan, &err)) {
        if (errbuf && errcap) snprintf(errbuf, errcap, "%s", err.msg);
        return -1;
    }
    return plan.n_tokens;
}

int ds41_image_span(ds41_engine *e, const float *pixels, int H, int W, float **out, int *rows, char *errbuf,
                    size_t errcap) {
    return span_on(e, &e->ctx, pixels, H, W, out, rows, errbuf, errcap);
}

int ds41_image_span_apart(ds41_engine *e, const float *pixels, int H, int W, float **out, int *rows, char *errbuf,
                          size_t errcap) {
    ds41_ctx c = e->ctx;
    c.prof = NULL;   /* the engine's profile accumulators belong to its forwards */
    if (c.n_threads > 1 && c.pool) {
        c.pool = ds41_pool_create(c.n_threads);
        if (!c.pool) c = e->ctx;   /* the shared pool: slower beside a forward, the same bits */
    }
    int rc = span_on(e, &c, pixels, H, W, out, rows, errbuf, errcap);
    if (c.pool != e->ctx.pool) ds41_pool_destroy(c.pool);
    return rc;
}

/* The image's content key: SHA-256 of a tag, the preprocessed size and the BF16 pixel bits
 * (little-endian), i.e. of exactly what the tower reads; the tower's weights and the
 * preprocessing parameters are in the prefix cache's model fingerprint. */
static void image_key(const uint16_t *bits, int H, int W, uint8_t key[32]) {
    static const char tag[] = "ds41 image key v1";
    ds41_sha256 c;
    ds41_sha256_init(&c);
    ds41_sha256_update(&c, tag, sizeof tag);
    uint8_t hw[8];
    for (int i = 0; i < 4; i++) { hw[i] = (uint8_t)((uint32_t)H >> (8 * i)); hw[4 + i] = (uint8_t)((uint32_t)W >> (8 * i)); }
    ds41_sha256_update(&c, hw, sizeof hw);
    size_t np = (size_t)3 * H * W;
    uint8_t le[512];
    for (size_t i = 0; i < np; i += 256) {
        size_t m = np - i < 256 ? np - i : 256;
        for (size_t j = 0; j < m; j++) { le[2 * j] = (uint8_t)bits[i + j]; le[2 * j + 1] = (uint8_t)(bits[i + j] >> 8); }
        ds41_sha256_update(&c, le, 2 * m);
    }
    ds41_sha256_final(&c, key);
}

int ds41_image_prepare(ds41_engine *e, const uint8_t *data, size_t len, float **pixels, int *H, int *W,
                       uint8_t key[32], char *errbuf, size_t errcap) {
    ds41_image_limits lim;
    ds41_vision_params vp;
    ds41_image_plan plan;
    ds41_rgb_image im;
    ds41_err err = { 0 };
    uint16_t *bits = NULL;
    *pixels = NULL;
    *H = *W = 0;
    if (e->cfg->vision_n_layers == 0) {
        if (errbuf && errcap) snprintf(errbuf, errcap, "the checkpoint has no vision tower");
        return -1;
    }
    ds41_image_limits_default(&lim);
    ds41_vision_params_of(e->cfg, &vp);
    if (ds41_image_decode(data, len, &lim, &im, &err)) {
        if (errbuf && errcap) snprintf(errbuf, errcap, "%s", err.msg);
        return -1;
    }
    int rc = ds41_image_preprocess(&im, &vp, &plan, &bits, &err);
    ds41_rgb_image_free(&im);
    if (rc) {
        if (errbuf && errcap) snprintf(errbuf, errcap, "%s", err.msg);
        return -1;
    }
    size_t np = (size_t)3 * plan.width * plan.height;
    float *px = malloc(np * sizeof *px);
    if (!px) {
        free(bits);
        if (errbuf && errcap) snprintf(errbuf, errcap, "out of memory for %zu pixels", np);
        return -1;
    }
    for (size_t i = 0; i < np; i++) px[i] = ds41_bf16_to_f32(bits[i]);
    if (key) image_key(bits, plan.height, plan.width, key);
    free(bits);
    *pixels = px;
    *H = plan.height;
    *W = plan.width;
    return 0;
}

int ds41_image_span_encoded(ds41_engine *e, const uint8_t *data, size_t len, float **out, int *rows, char *errbuf,
                            size_t errcap) {
    float *px = NULL;
    int H, W;
    *out = NULL;
    *rows = 0;
    if (ds41_image_prepare(e, data, len, &px, &H, &W, NULL, errbuf, errcap)) return -1;
    int rc = ds41_image_span(e, px, H, W, out, rows, errbuf, errcap);
    free(px);
    return rc;
}
