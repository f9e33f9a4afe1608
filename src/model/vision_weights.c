/* ds41 vision weights: binding of the tower and aligner (vision_weights.h). */
#include "vision_weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "contract.h"

/* name -> BF16 view of the given shape (n1 = 0: a vector of n0) */
static const uint16_t *bf16_view(const ds41_st *st, const char *name, int64_t n0, int64_t n1, ds41_err *err) {
    const ds41_tensor *t = ds41_st_find(st, name);
    int64_t want[2] = { n0, n1 };
    int nd = n1 ? 2 : 1;
    char ws[64], gs[64];
    ds41_spec_format(DS41_DT_BF16, nd, want, ws, sizeof ws);
    if (!t) {
        ds41_errf(err, "tensor %s: missing from the checkpoint (expected %s)", name, ws);
        return NULL;
    }
    if (t->dtype != DS41_DT_BF16 || t->ndim != nd || t->shape[0] != n0 || (nd == 2 && t->shape[1] != n1)) {
        ds41_spec_format(t->dtype, t->ndim, t->shape, gs, sizeof gs);
        ds41_errf(err, "tensor %s: expected %s, found %s", name, ws, gs);
        return NULL;
    }
    return t->data;
}

static int mat(const ds41_st *st, const char *name, int out, int in, ds41_bf16w *w, ds41_err *err) {
    w->w = bf16_view(st, name, out, in, err);
    w->out = out;
    w->in = in;
    return w->w ? 0 : -1;
}

static int vec(const ds41_st *st, const char *name, int n, const uint16_t **p, ds41_err *err) {
    *p = bf16_view(st, name, n, 0, err);
    return *p ? 0 : -1;
}

static int has_vision_tensor(const ds41_st *st) {
    size_t n = ds41_st_count(st);
    for (size_t i = 0; i < n; i++)
        if (ds41_is_vision_tensor(ds41_st_at(st, i)->name)) return 1;
    return 0;
}

int ds41_vision_bind(const ds41_config *cfg, const ds41_st *st, ds41_vision *v, ds41_err *err) {
    memset(v, 0, sizeof *v);
    if (cfg->vision_n_layers <= 0 || !st || !has_vision_tensor(st)) return 0;
    int D = cfg->vision_dim, H = cfg->vision_n_heads, I = cfg->vision_inter_dim;
    int p = cfg->vision_patch_size, r = cfg->vision_downsample_ratio, d = cfg->dim;
    if (D % H || (D / H) % 4)
        return ds41_errf(err, "vision_config: hidden_size %d / num_attention_heads %d is not a multiple of 4 "
                              "(the 2D rotary halves)", D, H);
    if ((long long)D * r * r > (1 << 30) || (long long)3 * p * p > (1 << 30))
        return ds41_errf(err, "vision_config: hidden_size %d x downsample_ratio %d^2 too large", D, r);
    v->n_layers = cfg->vision_n_layers;
    v->dim = D;
    v->n_heads = H;
    v->head_dim = D / H;
    v->inter = I;
    v->patch = p;
    v->ratio = r;
    v->lm_dim = d;
    v->theta = cfg->vision_rope_theta;
    v->blocks = calloc((size_t)v->n_layers, sizeof *v->blocks);
    if (!v->blocks) return ds41_errf(err, "out of memory for %d vision blocks", v->n_layers);
    if (mat(st, "vision.patch_embed.proj.weight", D, 3 * p * p, &v->patch_w, err) ||
        vec(st, "vision.patch_embed.proj.bias", D, &v->patch_b, err))
        goto fail;
    char n[128];
    for (int b = 0; b < v->n_layers; b++) {
        ds41_vision_block *B = &v->blocks[b];
#define NAME(s) (snprintf(n, sizeof n, "vision.blocks.%d." s, b), n)
        if (vec(st, NAME("norm1.weight"), D, &B->norm1, err) ||
            mat(st, NAME("attn.wqkv.weight"), 3 * D, D, &B->wqkv, err) ||
            vec(st, NAME("attn.wqkv.bias"), 3 * D, &B->bqkv, err) ||
            mat(st, NAME("attn.wo.weight"), D, D, &B->wo, err) || vec(st, NAME("attn.wo.bias"), D, &B->bo, err) ||
            vec(st, NAME("norm2.weight"), D, &B->norm2, err) || mat(st, NAME("mlp.w1.weight"), 2 * I, D, &B->w1, err) ||
            mat(st, NAME("mlp.w2.weight"), D, I, &B->w2, err))
            goto fail;
#undef NAME
    }
    if (vec(st, "vision.norm.weight", D, &v->norm, err) || mat(st, "aligner.w1.weight", d, D * r * r, &v->al_w1, err) ||
        vec(st, "aligner.w1.bias", d, &v->al_b1, err) || mat(st, "aligner.w2.weight", d, d, &v->al_w2, err) ||
        vec(st, "aligner.w2.bias", d, &v->al_b2, err) || vec(st, "image_start", d, &v->image_start, err) ||
        vec(st, "image_end", d, &v->image_end, err) || vec(st, "image_newline", d, &v->image_newline, err))
        goto fail;
    return 1;
fail:
    ds41_vision_free(v);
    return -1;
}

void ds41_vision_free(ds41_vision *v) {
    if (!v) return;
    free(v->blocks);
    memset(v, 0, sizeof *v);
}

void ds41_vision_params_of(const ds41_config *cfg, ds41_vision_params *vp) {
    ds41_vision_params_default(vp);
    vp->patch_size = cfg->vision_patch_size;
    vp->downsample_ratio = cfg->vision_downsample_ratio;
    vp->max_n_token = cfg->vision_max_n_token;
    vp->min_pixels = cfg->vision_min_pixels;
    vp->max_wh_ratio = cfg->vision_max_wh_ratio;
    vp->image_token_id = cfg->image_token_id;
}
