/* ds41 tensor contract (spec section 8). Everything about which tensor a config implies,
 * its released name, dtype and shape lives here, once. */
#include "contract.h"

#include <stdio.h>
#include <string.h>

static int elem_bytes(ds41_dtype dt) {
    switch (dt) {
    case DS41_DT_BF16: case DS41_DT_F16: case DS41_DT_I16: case DS41_DT_U16: return 2;
    case DS41_DT_F32: case DS41_DT_I32: case DS41_DT_U32: return 4;
    case DS41_DT_F64: case DS41_DT_I64: case DS41_DT_U64: return 8;
    default: return 1;
    }
}

static const char *dt_name(ds41_dtype dt) {
    switch (dt) {
    case DS41_DT_BF16: return "BF16";
    case DS41_DT_F32: return "F32";
    case DS41_DT_F8_E4M3: return "F8_E4M3";
    case DS41_DT_F8_E8M0: return "F8_E8M0";
    case DS41_DT_I8: return "I8";
    default: return ds41_dtype_name(dt);
    }
}

uint64_t ds41_spec_nbytes(const ds41_tensor_spec *t) {
    uint64_t n = (uint64_t)elem_bytes(t->dtype);
    for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
    return n;
}

uint64_t ds41_spec_params(const ds41_tensor_spec *t) {
    if (t->is_scale) return 0;
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
    /* routed-expert weights are I8 bytes holding two E2M1 values each */
    if (t->role == DS41_ROLE_ROUTED_EXPERT) n *= 2;
    return n;
}

void ds41_spec_format(ds41_dtype dt, int ndim, const int64_t *shape, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "%s [", dt_name(dt));
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

int ds41_is_vision_tensor(const char *name) {
    return !strncmp(name, "vision.", 7) || !strncmp(name, "aligner.", 8) || !strcmp(name, "image_start") ||
           !strcmp(name, "image_end") || !strcmp(name, "image_newline");
}

/* ------------------------------------------------------------------------------------------ */

typedef struct emitter {
    const ds41_config *cfg;
    int (*fn)(const ds41_tensor_spec *t, void *ctx);
    void *ctx;
    const char *prefix;     /* "layers.3." / "mtp.0." / "" */
    int layer;
    int expert;
    ds41_role role;         /* role of the tensors emitted now */
    int optional;
} emitter;

static int put(emitter *e, const char *suffix, ds41_dtype dt, int ndim, int64_t d0, int64_t d1, int is_scale,
               void *slot, int slot_type) {
    ds41_tensor_spec t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s%s", e->prefix, suffix);
    t.dtype = dt;
    t.ndim = ndim;
    t.shape[0] = d0;
    t.shape[1] = ndim > 1 ? d1 : 0;
    t.role = e->role;
    t.layer = e->layer;
    t.expert = e->expert;
    t.is_scale = is_scale;
    t.optional = e->optional;
    t.slot = slot;
    t.slot_type = slot_type;
    return e->fn(&t, e->ctx);
}

#define CEIL32(x) (((int64_t)(x) + 31) / 32)

/* FP8 linear: weight E4M3 [out, in], scale UE8M0 per 32x32 tile. */
static int fp8(emitter *e, const char *name, int out, int in, ds41_fp8w *w) {
    char s[96];
    if (w) {
        w->out = out;
        w->in = in;
    }
    snprintf(s, sizeof s, "%s.weight", name);
    if (put(e, s, DS41_DT_F8_E4M3, 2, out, in, 0, w ? (void *)&w->w : NULL, DS41_SLOT_U8)) return -1;
    snprintf(s, sizeof s, "%s.scale", name);
    return put(e, s, DS41_DT_F8_E8M0, 2, CEIL32(out), CEIL32(in), 1, w ? (void *)&w->s : NULL, DS41_SLOT_U8);
}

/* FP4 linear (routed experts): weight I8 [out, in/2] (two E2M1 per byte), scale UE8M0
 * [out, in/32]. */
static int fp4(emitter *e, const char *name, int out, int in, ds41_fp4w *w) {
    char s[96];
    if (w) {
        w->out = out;
        w->in = in;
    }
    snprintf(s, sizeof s, "%s.weight", name);
    if (put(e, s, DS41_DT_I8, 2, out, in / 2, 0, w ? (void *)&w->w : NULL, DS41_SLOT_U8)) return -1;
    snprintf(s, sizeof s, "%s.scale", name);
    return put(e, s, DS41_DT_F8_E8M0, 2, out, in / 32, 1, w ? (void *)&w->s : NULL, DS41_SLOT_U8);
}

static int bf16v(emitter *e, const char *name, int n, const uint16_t **slot) {
    return put(e, name, DS41_DT_BF16, 1, n, 0, 0, (void *)slot, DS41_SLOT_U16);
}

static int bf16m(emitter *e, const char *name, int out, int in, ds41_bf16w *w) {
    if (w) {
        w->out = out;
        w->in = in;
    }
    return put(e, name, DS41_DT_BF16, 2, out, in, 0, w ? (void *)&w->w : NULL, DS41_SLOT_U16);
}

static int f32v(emitter *e, const char *name, int n, const float **slot) {
    return put(e, name, DS41_DT_F32, 1, n, 0, 0, (void *)slot, DS41_SLOT_F32);
}

static int f32m(emitter *e, const char *name, int out, int in, const float **slot) {
    return put(e, name, DS41_DT_F32, 2, out, in, 0, (void *)slot, DS41_SLOT_F32);
}

#define W(field) (lw ? &lw->field : NULL)

static int emit_layer(emitter *e, const ds41_config *c, int id, ds41_layer_weights *lw) {
    const ds41_layer_plan *p = &c->layers[id];
    int D = c->dim, HD = c->head_dim, H = c->n_heads, QL = c->q_lora_rank;
    int HC = c->hc_mult, MIX = (2 + HC) * HC;
    int E = p->n_experts, I = c->moe_inter_dim;
    int OG = c->o_groups, OL = c->o_lora_rank;
    e->role = DS41_ROLE_LAYER;
    e->expert = -1;
    e->optional = 0;
    if (lw) lw->n_experts = E;

    /* attention: every layer and stage */
    if (f32v(e, "attn.attn_sink", H, W(attn_sink))) return -1;
    if (bf16v(e, "attn.q_norm.weight", QL, W(q_norm))) return -1;
    if (bf16v(e, "attn.kv_norm.weight", HD, W(kv_norm))) return -1;
    if (fp8(e, "attn.wq_a", QL, D, W(wq_a))) return -1;
    if (fp8(e, "attn.wq_b", H * HD, QL, W(wq_b))) return -1;
    if (fp8(e, "attn.wkv", HD, D, W(wkv))) return -1;
    if (fp8(e, "attn.wo_a", OG * OL, H * HD / OG, W(wo_a))) return -1;
    if (fp8(e, "attn.wo_b", D, OG * OL, W(wo_b))) return -1;
    if (bf16v(e, "attn_norm.weight", D, W(attn_norm))) return -1;
    if (bf16v(e, "ffn_norm.weight", D, W(ffn_norm))) return -1;
    /* mHC */
    if (f32m(e, "hc_attn_fn", MIX, HC * D, W(hc_attn_fn))) return -1;
    if (f32m(e, "hc_ffn_fn", MIX, HC * D, W(hc_ffn_fn))) return -1;
    if (f32v(e, "hc_attn_base", MIX, W(hc_attn_base))) return -1;
    if (f32v(e, "hc_ffn_base", MIX, W(hc_ffn_base))) return -1;
    if (f32v(e, "hc_attn_scale", 3, W(hc_attn_scale))) return -1;
    if (f32v(e, "hc_ffn_scale", 3, W(hc_ffn_scale))) return -1;
    /* MoE router; bias_vl exists only with a vision tower (reference Gate) */
    if (bf16m(e, "ffn.gate.weight", E, D, W(gate))) return -1;
    if (f32v(e, "ffn.gate.bias", E, W(gate_bias))) return -1;
    e->optional = c->vision_n_layers == 0;
    if (f32v(e, "ffn.gate.bias_vl", E, W(gate_bias_vl))) return -1;
    e->optional = 0;
    e->role = DS41_ROLE_ROUTED_EXPERT;
    for (int x = 0; x < E; x++) {
        char n[64];
        ds41_expert *ex = lw ? &lw->experts[x] : NULL;
        e->expert = x;
        snprintf(n, sizeof n, "ffn.experts.%d.w1", x);
        if (fp4(e, n, I, D, ex ? &ex->w1 : NULL)) return -1;
        snprintf(n, sizeof n, "ffn.experts.%d.w2", x);
        if (fp4(e, n, D, I, ex ? &ex->w2 : NULL)) return -1;
        snprintf(n, sizeof n, "ffn.experts.%d.w3", x);
        if (fp4(e, n, I, D, ex ? &ex->w3 : NULL)) return -1;
    }
    e->expert = -1;
    e->role = DS41_ROLE_LAYER;
    if (fp8(e, "ffn.shared_experts.w1", I, D, W(sh_w1))) return -1;
    if (fp8(e, "ffn.shared_experts.w2", D, I, W(sh_w2))) return -1;
    if (fp8(e, "ffn.shared_experts.w3", I, D, W(sh_w3))) return -1;

    /* KV sources: compressor and the index-K projection */
    if (p->is_kv_source) {
        if (bf16v(e, "attn.compressor.norm.weight", HD, W(comp_norm))) return -1;
        if (bf16m(e, "attn.compressor.wkv.weight", HD, D, W(comp_wkv))) return -1;
        if (p->ratio > 1 && bf16m(e, "attn.compressor.wgate.weight", HD, D, W(comp_wgate))) return -1;
        if (bf16v(e, "attn.indexer.k_norm.weight", c->index_head_dim, W(idx_k_norm))) return -1;
        if (bf16m(e, "attn.indexer.wk.weight", c->index_head_dim, HD, W(idx_wk))) return -1;
    }
    /* index sources: their own indexer query */
    if (p->is_index_source) {
        if (bf16m(e, "attn.indexer.weights_proj.weight", c->index_n_heads, D, W(idx_weights_proj))) return -1;
        if (fp8(e, "attn.indexer.wq_b", c->index_n_heads * c->index_head_dim, QL, W(idx_wq_b))) return -1;
    }
    /* Engram before this block */
    if (p->engram_slot >= 0) {
        long long rows = c->engram_num_embeddings[p->engram_slot];
        int EH = c->engram_head_dim;
        if (lw) lw->eg_rows = rows;
        e->role = DS41_ROLE_ENGRAM_TABLE;
        if (put(e, "engram.embed.weight", DS41_DT_F8_E4M3, 2, rows, EH, 0, W(eg_embed), DS41_SLOT_U8)) return -1;
        if (put(e, "engram.embed.scale", DS41_DT_F8_E8M0, 2, rows, EH / 32, 1, W(eg_scale), DS41_SLOT_U8)) return -1;
        e->role = DS41_ROLE_LAYER;
        if (put(e, "engram.q_weight", DS41_DT_BF16, 2, HC, D, 0, W(eg_q), DS41_SLOT_U16)) return -1;
        if (put(e, "engram.k_weight", DS41_DT_BF16, 2, HC, D, 0, W(eg_k), DS41_SLOT_U16)) return -1;
        if (fp8(e, "engram.wkv", (HC + 1) * D, (c->engram_max_ngram - 1) * c->engram_n_heads * EH, W(eg_wkv)))
            return -1;
    }
    /* DSpark stage extras */
    if (p->part == DS41_PART_DRAFT) {
        int s = id - c->n_layers;
        if (s == 0) {
            if (fp8(e, "main_proj", D, c->n_dspark_targets * D, W(main_proj))) return -1;
            if (bf16v(e, "main_norm.weight", D, W(main_norm))) return -1;
        }
        if (s == c->n_mtp - 1) {
            if (bf16v(e, "norm.weight", D, W(final_norm))) return -1;
            e->role = DS41_ROLE_DSPARK_HEAD;
            if (bf16m(e, "markov_head.embed.weight", c->vocab_size, c->dspark_markov_rank, W(markov_embed))) return -1;
            if (bf16m(e, "markov_head.head.weight", c->vocab_size, c->dspark_markov_rank, W(markov_head))) return -1;
            if (bf16m(e, "confidence_head.proj.weight", 1, D + c->dspark_markov_rank, W(conf_proj))) return -1;
            e->role = DS41_ROLE_LAYER;
        }
    }
    return 0;
}

int ds41_contract_each(const ds41_config *cfg, ds41_weights *w,
                       int (*fn)(const ds41_tensor_spec *t, void *ctx), void *ctx) {
    emitter e = { .cfg = cfg, .fn = fn, .ctx = ctx, .prefix = "", .layer = -1, .expert = -1 };
    e.role = DS41_ROLE_EMBED;
    if (put(&e, "embed.weight", DS41_DT_BF16, 2, cfg->vocab_size, cfg->dim, 0, w ? (void *)&w->embed : NULL,
            DS41_SLOT_U16))
        return -1;
    e.role = DS41_ROLE_HEAD;
    if (put(&e, "head.weight", DS41_DT_BF16, 2, cfg->vocab_size, cfg->dim, 0, w ? (void *)&w->head : NULL,
            DS41_SLOT_U16))
        return -1;
    e.role = DS41_ROLE_FINAL_NORM;
    if (put(&e, "norm.weight", DS41_DT_BF16, 1, cfg->dim, 0, 0, w ? (void *)&w->norm : NULL, DS41_SLOT_U16))
        return -1;
    int total = cfg->n_layers + cfg->n_mtp;
    for (int id = 0; id < total; id++) {
        char prefix[32];
        if (id < cfg->n_layers) snprintf(prefix, sizeof prefix, "layers.%d.", id);
        else snprintf(prefix, sizeof prefix, "mtp.%d.", id - cfg->n_layers);
        e.prefix = prefix;
        e.layer = id;
        int rc = emit_layer(&e, cfg, id, w ? &w->layers[id] : NULL);
        if (rc) return rc;
    }
    return 0;
}
