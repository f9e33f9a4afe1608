/* ds41 config: reads config.json in either spelling, validates it, and derives the layer
 * plan of spec section 2 from the fields alone (no production constants).
 *
 * Spellings (spec section 1):
 *   hf    root { architectures, model_type, text_config {...}, quantization_config {...},
 *         vision_config {...} }, transformers-style names inside text_config.
 *   flat  the reference's inference/config.json: one object, short names (dim, n_layers, ...).
 * Both are read through one field table; every message names the field as the file spells it
 * ("text_config.hidden_size" or "dim"). */
#include "config.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "contract.h"

const char *ds41_mode_name(ds41_mode m) {
    switch (m) {
    case DS41_MODE_SWA: return "swa";
    case DS41_MODE_FULL: return "full";
    case DS41_MODE_REINDEX: return "reindex";
    case DS41_MODE_REUSE: return "reuse";
    case DS41_MODE_DRAFT: return "draft";
    }
    return "?";
}

const char *ds41_part_name(ds41_part p) {
    switch (p) {
    case DS41_PART_ENCODER: return "encoder";
    case DS41_PART_DECODER: return "decoder";
    case DS41_PART_DRAFT: return "draft";
    }
    return "?";
}

/* ------------------------------------------------------------------------------------------
 * Field table
 * ---------------------------------------------------------------------------------------- */

typedef enum fkind { K_INT, K_I64, K_F32, K_BOOL, K_STR, K_INTS, K_I64S } fkind;

/* When a field must be present. Conditions are evaluated after every field has been read,
 * so they can depend on other fields. */
typedef enum freq {
    R_ALWAYS,     /* required */
    R_OPT,        /* optional; `def` is the spec's default (the comment on the entry says where) */
    R_COMPRESS,   /* required when some compress ratio is > 0 */
    R_INDEX,      /* required when there is an index source */
    R_CAND,       /* required when there is a candidate source */
    R_ENGRAM,     /* required when there is an Engram layer */
    R_MTP,        /* required when there are DSpark stages */
    R_YARN,       /* required when YaRN is on */
    R_NONE        /* this spelling has no such key */
} freq;

typedef struct fdesc {
    const char *hf;      /* path below text_config; a leading '/' means below the root */
    const char *flat;    /* key of the flat spelling */
    fkind kind;
    size_t off;          /* field in ds41_config */
    size_t count_off;    /* lists: the int holding the count (0: not stored) */
    int max_len;         /* lists: capacity */
    double lo, hi;       /* inclusive range of a number or of each list element */
    freq req_hf, req_flat;
    double def;          /* R_OPT default */
    int null_is;         /* K_INT: nonzero if JSON null is accepted, meaning -1 */
} fdesc;

#define OFF(f) offsetof(ds41_config, f)
#define CNT(f) offsetof(ds41_config, f)
#define I64_CAP 1099511627776.0 /* 2^40: keeps every product of capped dims inside int64 */

/* Caps: every dimension is bounded so that any product the contract and the budgets form
 * (vocab x dim, rows x head_dim, experts x inter x dim x layers, ...) stays far inside
 * int64 and every per-tensor dimension fits an int. */
static const fdesc FIELDS[] = {
    /* backbone */
    { "vocab_size", "vocab_size", K_INT, OFF(vocab_size), 0, 0, 1, 1 << 24, R_ALWAYS, R_ALWAYS, 0, 0 },
    { "hidden_size", "dim", K_INT, OFF(dim), 0, 0, 1, 65536, R_ALWAYS, R_ALWAYS, 0, 0 },
    { "num_hidden_layers", "n_layers", K_INT, OFF(n_layers), 0, 0, 1, 120, R_ALWAYS, R_ALWAYS, 0, 0 },
    { "num_nextn_predict_layers", "n_mtp_layers", K_INT, OFF(n_mtp), 0, 0, 0, 8, R_ALWAYS, R_ALWAYS, 0, 0 },
    /* the flat file has only the runtime max_seq_len; derived below from YaRN */
    { "max_position_embeddings", NULL, K_I64, OFF(max_position_embeddings), 0, 0, 1, I64_CAP, R_ALWAYS, R_NONE, 0, 0 },
    { "rms_norm_eps", "norm_eps", K_F32, OFF(norm_eps), 0, 0, 1e-38, 1.0, R_ALWAYS, R_ALWAYS, 0, 0 },
    /* spec 1.1: false (separate embed/head); the flat spelling has no key */
    { "tie_word_embeddings", NULL, K_BOOL, OFF(tie_word_embeddings), 0, 0, 0, 1, R_OPT, R_NONE, 0, 0 },
    /* attention */
    { "num_attention_heads", "n_heads", K_INT, OFF(n_heads), 0, 0, 1, 1024, R_ALWAYS, R_ALWAYS, 0, 0 },
    /* spec 1.2: one shared latent (MQA); the flat spelling has no key */
    { "num_key_value_heads", NULL, K_INT, OFF(n_kv_heads), 0, 0, 1, 1, R_OPT, R_NONE, 1, 0 },
    { "head_dim", "head_dim", K_INT, OFF(head_dim), 0, 0, 1, 4096, R_ALWAYS, R_ALWAYS, 0, 0 },
    { "qk_rope_head_dim", "rope_head_dim", K_INT, OFF(rope_dim), 0, 0, 1, 4096, R_ALWAYS, R_ALWAYS, 0, 0 },
    { "q_lora_rank", "q_lora_rank", K_INT, OFF(q_lora_rank), 0, 0, 1, 65536, R_ALWAYS, R_ALWAYS, 0, 0 },
    { "o_groups", "o_groups", K_INT, OFF(o_groups), 0, 0, 1, 1024, R_ALWAYS, R_ALWAYS, 0, 0 },
    { "o_lora_rank", "o_lora_rank", K_INT, OFF(o_lora_rank), 0, 0, 1, 65536, R_ALWAYS, R_ALWAYS, 0, 0 },
    { "sliding_window", "window_size", K_INT, OFF(window), 0, 0, 1, 1 << 20, R_ALWAYS, R_ALWAYS, 0, 0 },
    /* rope */
    { "rope_theta", "rope_theta", K_F32, OFF(rope_theta), 0, 0, 1.0, 1e12, R_ALWAYS, R_ALWAYS, 0, 0 },
    { "compress_rope_theta", "compress_rope_theta", K_F32, OFF(compress_rope_theta), 0, 0, 1.0, 1e12,
      R_COMPRESS, R_COMPRESS, 0, 0 },
    { "rope_scaling.factor", "rope_factor", K_F32, OFF(rope_factor), 0, 0, 1e-6, 1e6, R_YARN, R_YARN, 0, 0 },
    /* flat: original_seq_len 0 switches YaRN off (reference precompute_freqs_cis) */
    { "rope_scaling.original_max_position_embeddings", "original_seq_len", K_I64, OFF(original_seq_len), 0, 0,
      0, I64_CAP, R_YARN, R_ALWAYS, 0, 0 },
    /* HF: spec 1.3 values 32 / 1, which are also the reference ModelArgs defaults */
    { "rope_scaling.beta_fast", "beta_fast", K_F32, OFF(beta_fast), 0, 0, 1e-6, 1e6, R_OPT, R_YARN, 32, 0 },
    { "rope_scaling.beta_slow", "beta_slow", K_F32, OFF(beta_slow), 0, 0, 1e-6, 1e6, R_OPT, R_YARN, 1, 0 },
    /* CSA2 */
    { "compress_ratios", "compress_ratios", K_INTS, OFF(compress_ratios), CNT(n_ratios), DS41_MAX_LIST * 2, 0,
      1024, R_ALWAYS, R_ALWAYS, 0, 0 },
    { "kv_source_layer_ids", "kv_source_layers", K_INTS, OFF(kv_sources), CNT(n_kv_sources), DS41_MAX_LIST, 0,
      1e9, R_ALWAYS, R_ALWAYS, 0, 0 },
    { "index_source_layer_ids", "index_source_layers", K_INTS, OFF(index_sources), CNT(n_index_sources),
      DS41_MAX_LIST, 0, 1e9, R_ALWAYS, R_ALWAYS, 0, 0 },
    /* -1 or null: no candidate source (reference: candidate_source_layer < 0 turns it off) */
    { "candidate_source_layer_id", "candidate_source_layer", K_INT, OFF(candidate_source), 0, 0, -1, 1e9,
      R_ALWAYS, R_ALWAYS, 0, 1 },
    { "candidate_topk_blocks", "candidate_topk_blocks", K_INT, OFF(candidate_topk_blocks), 0, 0, 1, 1 << 24,
      R_CAND, R_CAND, 0, 0 },
    { "candidate_block_size", "candidate_block_size", K_INT, OFF(candidate_block_size), 0, 0, 1, 1 << 16,
      R_CAND, R_CAND, 0, 0 },
    { "index_n_heads", "index_n_heads", K_INT, OFF(index_n_heads), 0, 0, 1, 1024, R_INDEX, R_INDEX, 0, 0 },
    { "index_head_dim", "index_head_dim", K_INT, OFF(index_head_dim), 0, 0, 1, 4096, R_INDEX, R_INDEX, 0, 0 },
    { "index_topk", "index_topk", K_INT, OFF(index_topk), 0, 0, 1, 1 << 24, R_INDEX, R_INDEX, 0, 0 },
    /* MoE */
    { "n_routed_experts", "n_routed_experts", K_INT, OFF(n_routed_experts), 0, 0, 1, 4096, R_ALWAYS, R_ALWAYS, 0, 0 },
    /* the reference asserts exactly one shared expert */
    { "n_shared_experts", "n_shared_experts", K_INT, OFF(n_shared_experts), 0, 0, 1, 1, R_ALWAYS, R_ALWAYS, 0, 0 },
    { "num_experts_per_tok", "n_activated_experts", K_INT, OFF(n_active_experts), 0, 0, 1, 64, R_ALWAYS,
      R_ALWAYS, 0, 0 },
    { "moe_intermediate_size", "moe_inter_dim", K_INT, OFF(moe_inter_dim), 0, 0, 1, 1 << 20, R_ALWAYS, R_ALWAYS, 0, 0 },
    { "scoring_func", "score_func", K_STR, OFF(score_func), 0, 0, 0, 0, R_ALWAYS, R_ALWAYS, 0, 0 },
    /* spec 1.5: true ("(default)" in the inference column) */
    { "norm_topk_prob", "norm_topk_prob", K_BOOL, OFF(norm_topk_prob), 0, 0, 0, 1, R_OPT, R_OPT, 1, 0 },
    { "routed_scaling_factor", "route_scale", K_F32, OFF(route_scale), 0, 0, 1e-6, 1e6, R_ALWAYS, R_ALWAYS, 0, 0 },
    { "swiglu_limit", "swiglu_limit", K_F32, OFF(swiglu_limit), 0, 0, 0, 1e6, R_ALWAYS, R_ALWAYS, 0, 0 },
    /* spec 1.5: gate_temp 1.0, in neither file */
    { "gate_temp", "gate_temp", K_F32, OFF(gate_temp), 0, 0, 1e-6, 1e6, R_OPT, R_OPT, 1, 0 },
    /* mHC */
    { "hc_mult", "hc_mult", K_INT, OFF(hc_mult), 0, 0, 1, 16, R_ALWAYS, R_ALWAYS, 0, 0 },
    { "hc_sinkhorn_iters", "hc_sinkhorn_iters", K_INT, OFF(hc_sinkhorn_iters), 0, 0, 1, 1000, R_ALWAYS, R_ALWAYS, 0, 0 },
    { "hc_eps", "hc_eps", K_F32, OFF(hc_eps), 0, 0, 1e-38, 1.0, R_ALWAYS, R_ALWAYS, 0, 0 },
    /* Engram (caps match src/layers/engram.h: 8 layers, n-gram size 8, 32 heads) */
    { "engram_layer_ids", "engram_layer_ids", K_INTS, OFF(engram_layers), CNT(n_engram_layers), 8, 0, 1e9,
      R_ALWAYS, R_ALWAYS, 0, 0 },
    { "engram_max_ngram_size", "engram_max_ngram_size", K_INT, OFF(engram_max_ngram), 0, 0, 2, 8, R_ENGRAM,
      R_ENGRAM, 0, 0 },
    { "engram_n_heads", "engram_n_heads", K_INT, OFF(engram_n_heads), 0, 0, 1, 32, R_ENGRAM, R_ENGRAM, 0, 0 },
    { "engram_head_dim", "engram_head_dim", K_INT, OFF(engram_head_dim), 0, 0, 1, 4096, R_ENGRAM, R_ENGRAM, 0, 0 },
    { "engram_vocab_size", "engram_vocab_size", K_I64, OFF(engram_vocab_size), 0, 0, 1, I64_CAP, R_ENGRAM,
      R_ENGRAM, 0, 0 },
    { "engram_num_embeddings", "engram_num_embeddings", K_I64S, OFF(engram_num_embeddings), 0, 8, 1, I64_CAP,
      R_ENGRAM, R_ENGRAM, 0, 0 },
    { "engram_compressed_vocab_size", "engram_compressed_vocab_size", K_INT, OFF(engram_compressed_vocab), 0, 0,
      1, 1 << 24, R_ENGRAM, R_ENGRAM, 0, 0 },
    /* spec 1.7: 2; the vendored flat file has no key (the reference default is 2, "matches training") */
    { "engram_pad_token_id", "engram_pad_id", K_INT, OFF(engram_pad_id), 0, 0, 0, 1 << 24, R_OPT, R_OPT, 2, 0 },
    /* DSpark */
    { "dspark_block_size", "dspark_block_size", K_INT, OFF(dspark_block_size), 0, 0, 1, 64, R_MTP, R_MTP, 0, 0 },
    { "dspark_noise_token_id", "dspark_noise_token_id", K_INT, OFF(dspark_noise_token_id), 0, 0, 0, 1 << 24,
      R_MTP, R_MTP, 0, 0 },
    { "dspark_target_layer_ids", "dspark_target_layer_ids", K_INTS, OFF(dspark_targets), CNT(n_dspark_targets),
      DS41_MAX_LIST, 0, 1e9, R_MTP, R_MTP, 0, 0 },
    { "dspark_markov_rank", "dspark_markov_rank", K_INT, OFF(dspark_markov_rank), 0, 0, 1, 65536, R_MTP, R_MTP, 0, 0 },
    /* absent or 0: the backbone's counts (reference get_moe_config) */
    { "dspark_n_routed_experts", "dspark_n_routed_experts", K_INT, OFF(dspark_n_experts), 0, 0, 0, 4096, R_OPT,
      R_OPT, 0, 0 },
    { "dspark_num_experts_per_tok", "dspark_n_activated_experts", K_INT, OFF(dspark_n_active), 0, 0, 0, 64, R_OPT,
      R_OPT, 0, 0 },
    /* vision tower size (only decides whether gate.bias_vl is expected); absent: no tower */
    { "/vision_config.num_hidden_layers", "vision_n_layers", K_INT, OFF(vision_n_layers), 0, 0, 0, 1024, R_OPT,
      R_OPT, 0, 0 },
    /* image preprocessing (S1 image_processor.py; defaults: the reference ModelArgs = the release) */
    { "/vision_config.patch_size", "vision_patch_size", K_INT, OFF(vision_patch_size), 0, 0, 1, 1024, R_OPT, R_OPT,
      14, 0 },
    { "/vision_config.downsample_ratio", "vision_downsample_ratio", K_INT, OFF(vision_downsample_ratio), 0, 0, 1, 64,
      R_OPT, R_OPT, 3, 0 },
    { "/vision_config.max_image_tokens", "vision_max_n_token", K_INT, OFF(vision_max_n_token), 0, 0, 3, 1 << 20,
      R_OPT, R_OPT, 1024, 0 },
    { "/vision_config.min_pixels", "vision_min_pixels", K_INT, OFF(vision_min_pixels), 0, 0, 0, 1 << 30, R_OPT,
      R_OPT, 295936, 0 },
    /* null or absent: no clamp (the release); -1 stands for null */
    { "/vision_config.max_wh_ratio", "vision_max_wh_ratio", K_INT, OFF(vision_max_wh_ratio), 0, 0, 1, 1 << 16,
      R_OPT, R_OPT, -1, 1 },
    { "/image_token_id", "image_token_id", K_INT, OFF(image_token_id), 0, 0, 0, 1 << 24, R_OPT, R_OPT, 129264, 0 },
    /* the tower's shape; absent: the official ModelArgs defaults (the released tower) */
    { "/vision_config.hidden_size", "vision_dim", K_INT, OFF(vision_dim), 0, 0, 4, 65536, R_OPT, R_OPT, 1024, 0 },
    { "/vision_config.num_attention_heads", "vision_n_heads", K_INT, OFF(vision_n_heads), 0, 0, 1, 1024, R_OPT,
      R_OPT, 16, 0 },
    { "/vision_config.intermediate_size", "vision_inter_dim", K_INT, OFF(vision_inter_dim), 0, 0, 1, 262144, R_OPT,
      R_OPT, 2816, 0 },
    { "/vision_config.rope_theta", "vision_rope_theta", K_F32, OFF(vision_rope_theta), 0, 0, 1.0, 1e12, R_OPT, R_OPT,
      10000, 0 },
};
#define N_FIELDS (sizeof FIELDS / sizeof FIELDS[0])

typedef struct pctx {
    int hf;
    json_t *root, *text;
    char present[N_FIELDS];
    int n_engram_rows;       /* entries of engram_num_embeddings read */
    ds41_err *err;
    char names[8][160];      /* rotating buffers for field names inside one message */
    int name_i;
} pctx;

/* The field's name as this file spells it. */
static const char *fname_of(const pctx *P, const fdesc *f, char *buf, size_t cap) {
    const char *n = P->hf ? f->hf : f->flat;
    if (!n) n = P->hf ? f->flat : f->hf;
    if (!P->hf) {
        snprintf(buf, cap, "%s", n);
    } else if (n[0] == '/') {
        snprintf(buf, cap, "%s", n + 1);
    } else {
        snprintf(buf, cap, "text_config.%s", n);
    }
    return buf;
}

/* Name of the field stored at a ds41_config offset (for consistency messages). */
static const char *N(pctx *P, size_t off) {
    char *b = P->names[P->name_i++ & 7];
    for (size_t i = 0; i < N_FIELDS; i++)
        if (FIELDS[i].off == off) return fname_of(P, &FIELDS[i], b, sizeof P->names[0]);
    snprintf(b, sizeof P->names[0], "?");
    return b;
}
#define NM(field) N(P, OFF(field))

static int fail(pctx *P, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(pctx *P, const char *fmt, ...) {
    if (P->err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(P->err->msg, sizeof P->err->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* Walks "a.b.c" below base; NULL if any part is missing. A non-object in the middle is an
 * error reported by the caller as "expected an object". */
static json_t *lookup(json_t *base, const char *path, const char **bad_part) {
    char part[128];
    json_t *cur = base;
    *bad_part = NULL;
    while (cur && *path) {
        const char *dot = strchr(path, '.');
        size_t n = dot ? (size_t)(dot - path) : strlen(path);
        if (n >= sizeof part) return NULL;
        memcpy(part, path, n);
        part[n] = 0;
        if (json_is_null(cur)) return NULL; /* e.g. "rope_scaling": null: nothing below */
        if (!json_is_object(cur)) {
            *bad_part = path;
            return NULL;
        }
        cur = json_object_get(cur, part);
        path = dot ? dot + 1 : path + n;
    }
    return cur;
}

static int read_int(pctx *P, const char *name, json_t *v, double lo, double hi, long long *out) {
    if (!json_is_integer(v))
        return fail(P, "%s: expected an integer in [%.0f, %.0f], got %s", name, lo, hi, json_kind(v));
    long long x = json_integer_value(v);
    if ((double)x < lo || (double)x > hi)
        return fail(P, "%s: %lld is out of range [%.0f, %.0f]", name, x, lo, hi);
    *out = x;
    return 0;
}

static int read_field(pctx *P, const fdesc *f, json_t *v, ds41_config *cfg) {
    char nb[160];
    const char *name = fname_of(P, f, nb, sizeof nb);
    char *base = (char *)cfg;
    long long x;
    switch (f->kind) {
    case K_INT:
        if (json_is_null(v) && f->null_is) {
            *(int *)(base + f->off) = -1;
            return 0;
        }
        if (read_int(P, name, v, f->lo, f->hi, &x)) return -1;
        *(int *)(base + f->off) = (int)x;
        return 0;
    case K_I64:
        if (read_int(P, name, v, f->lo, f->hi, &x)) return -1;
        *(long long *)(base + f->off) = x;
        return 0;
    case K_F32: {
        if (!json_is_number(v)) return fail(P, "%s: expected a number, got %s", name, json_kind(v));
        double d = json_number_value(v);
        if (!isfinite(d) || d < f->lo || d > f->hi)
            return fail(P, "%s: %g is out of range [%g, %g]", name, d, f->lo, f->hi);
        *(float *)(base + f->off) = (float)d;
        return 0;
    }
    case K_BOOL:
        if (!json_is_boolean(v)) return fail(P, "%s: expected true or false, got %s", name, json_kind(v));
        *(int *)(base + f->off) = json_is_true(v);
        return 0;
    case K_STR: {
        if (!json_is_string(v)) return fail(P, "%s: expected a string, got %s", name, json_kind(v));
        const char *s = json_string_value(v);
        if (strlen(s) >= sizeof cfg->score_func) return fail(P, "%s: string too long", name);
        strcpy(base + f->off, s);
        return 0;
    }
    case K_INTS:
    case K_I64S: {
        if (!json_is_array(v)) return fail(P, "%s: expected an array of integers, got %s", name, json_kind(v));
        size_t n = json_array_size(v);
        if (n > (size_t)f->max_len)
            return fail(P, "%s: %zu entries, more than the supported %d", name, n, f->max_len);
        for (size_t i = 0; i < n; i++) {
            char eb[192];
            snprintf(eb, sizeof eb, "%s[%zu]", name, i);
            if (read_int(P, eb, json_array_get(v, i), f->lo, f->hi, &x)) return -1;
            if (f->kind == K_INTS) ((int *)(base + f->off))[i] = (int)x;
            else ((long long *)(base + f->off))[i] = x;
        }
        if (f->count_off) *(int *)(base + f->count_off) = (int)n;
        else P->n_engram_rows = (int)n;
        return 0;
    }
    }
    return fail(P, "%s: internal: unknown field kind", name);
}

/* Optional string at a path; "" if absent. */
static int get_str(pctx *P, json_t *base, const char *path, const char *display, char *out, size_t cap) {
    const char *bad;
    json_t *v = lookup(base, path, &bad);
    out[0] = 0;
    if (bad) return fail(P, "%s: expected an object", display);
    if (!v) return 0;
    if (!json_is_string(v)) return fail(P, "%s: expected a string, got %s", display, json_kind(v));
    snprintf(out, cap, "%s", json_string_value(v));
    return 0;
}

/* bos/eos: an integer or an array of integers (first one used), at the root or in
 * text_config; -1 if absent. */
static int get_token_id(pctx *P, const char *key, int vocab, int *out) {
    json_t *v = NULL;
    char name[96];
    *out = -1;
    if (P->hf) {
        v = json_object_get(P->text, key);
        snprintf(name, sizeof name, "text_config.%s", key);
        if (!v) {
            v = json_object_get(P->root, key);
            snprintf(name, sizeof name, "%s", key);
        }
    } else {
        v = json_object_get(P->root, key);
        snprintf(name, sizeof name, "%s", key);
    }
    if (!v || json_is_null(v)) return 0;
    if (json_is_array(v)) {
        if (json_array_size(v) == 0) return 0;
        v = json_array_get(v, 0);
    }
    long long x;
    if (read_int(P, name, v, 0, vocab - 1, &x)) return -1;
    *out = (int)x;
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Reading both spellings
 * ---------------------------------------------------------------------------------------- */

static int any_ratio(const ds41_config *c) {
    for (int i = 0; i < c->n_ratios; i++)
        if (c->compress_ratios[i] > 0) return 1;
    return 0;
}

static int required(const pctx *P, freq r, const ds41_config *c) {
    switch (r) {
    case R_ALWAYS: return 1;
    case R_COMPRESS: return any_ratio(c);
    case R_INDEX: return c->n_index_sources > 0;
    case R_CAND: return c->candidate_source >= 0;
    case R_ENGRAM: return c->n_engram_layers > 0;
    case R_MTP: return c->n_mtp > 0;
    case R_YARN: return c->yarn;
    case R_OPT: case R_NONE: return 0;
    }
    (void)P;
    return 0;
}

static int read_fields(pctx *P, ds41_config *cfg) {
    json_t *base = P->hf ? P->text : P->root;
    for (size_t i = 0; i < N_FIELDS; i++) {
        const fdesc *f = &FIELDS[i];
        const char *key = P->hf ? f->hf : f->flat;
        if (!key) continue;
        json_t *b = base;
        if (key[0] == '/') {
            b = P->root;
            key++;
        }
        const char *bad;
        json_t *v = lookup(b, key, &bad);
        if (bad) {
            char nb[160];
            return fail(P, "%s: expected an object on the way to this field", fname_of(P, f, nb, sizeof nb));
        }
        /* null reads as absent (HF configs write null for unset options), except where it
         * has a meaning of its own */
        if (!v || (json_is_null(v) && !f->null_is)) continue;
        if (read_field(P, f, v, cfg)) return -1;
        P->present[i] = 1;
    }
    return 0;
}

static int read_rope_and_quant(pctx *P, ds41_config *cfg) {
    char s[64];
    if (P->hf) {
        json_t *rs = json_object_get(P->text, "rope_scaling");
        cfg->yarn = 0;
        if (rs && !json_is_null(rs)) {
            if (!json_is_object(rs))
                return fail(P, "text_config.rope_scaling: expected an object or null, got %s", json_kind(rs));
            /* transformers accepts both "rope_type" and the older "type" */
            if (get_str(P, rs, "rope_type", "text_config.rope_scaling.rope_type", s, sizeof s)) return -1;
            if (!s[0] && get_str(P, rs, "type", "text_config.rope_scaling.type", s, sizeof s)) return -1;
            if (!strcmp(s, "yarn")) cfg->yarn = 1;
            else if (strcmp(s, "default") && strcmp(s, "none") && s[0])
                return fail(P, "text_config.rope_scaling.rope_type: '%s' is not supported (expected yarn)", s);
        }
        json_t *q = json_object_get(P->root, "quantization_config");
        if (!q) q = json_object_get(P->text, "quantization_config");
        if (!q) return fail(P, "quantization_config: missing (expected quant_method fp8)");
        if (!json_is_object(q)) return fail(P, "quantization_config: expected an object, got %s", json_kind(q));
        if (get_str(P, q, "quant_method", "quantization_config.quant_method", s, sizeof s)) return -1;
        if (strcmp(s, "fp8"))
            return fail(P, "quantization_config.quant_method: %s%s%s, expected fp8", s[0] ? "'" : "",
                        s[0] ? s : "missing", s[0] ? "'" : "");
        cfg->quant_fp8 = 1;
        if (get_str(P, q, "scale_fmt", "quantization_config.scale_fmt", s, sizeof s)) return -1;
        if (s[0] && strcmp(s, "ue8m0"))
            return fail(P, "quantization_config.scale_fmt: '%s', expected ue8m0", s);
        if (get_str(P, q, "activation_scheme", "quantization_config.activation_scheme", s, sizeof s)) return -1;
        if (s[0] && strcmp(s, "dynamic"))
            return fail(P, "quantization_config.activation_scheme: '%s', expected dynamic", s);
        if (get_str(P, q, "expert_dtype", "quantization_config.expert_dtype", s, sizeof s)) return -1;
        if (strcmp(s, "fp4"))
            return fail(P, "quantization_config.expert_dtype: %s%s%s, expected fp4", s[0] ? "'" : "",
                        s[0] ? s : "missing", s[0] ? "'" : "");
        cfg->expert_fp4 = 1;
        json_t *wb = json_object_get(q, "weight_block_size");
        if (!wb) return fail(P, "quantization_config.weight_block_size: missing (expected [32, 32])");
        if (!json_is_array(wb) || json_array_size(wb) != 2 || !json_is_integer(json_array_get(wb, 0)) ||
            !json_is_integer(json_array_get(wb, 1)) || json_integer_value(json_array_get(wb, 0)) != 32 ||
            json_integer_value(json_array_get(wb, 1)) != 32)
            return fail(P, "quantization_config.weight_block_size: expected [32, 32] (V4.1 uses 32x32 tiles)");
        cfg->weight_block[0] = cfg->weight_block[1] = 32;
    } else {
        /* flat: the reference turns YaRN on for compressed layers when original_seq_len > 0 */
        if (get_str(P, P->root, "dtype", "dtype", s, sizeof s)) return -1;
        if (strcmp(s, "fp8"))
            return fail(P, "dtype: %s%s%s, expected fp8 (FP8 dense weights)", s[0] ? "'" : "", s[0] ? s : "missing",
                        s[0] ? "'" : "");
        cfg->quant_fp8 = 1;
        if (get_str(P, P->root, "expert_dtype", "expert_dtype", s, sizeof s)) return -1;
        if (strcmp(s, "fp4"))
            return fail(P, "expert_dtype: %s%s%s, expected fp4", s[0] ? "'" : "", s[0] ? s : "missing",
                        s[0] ? "'" : "");
        cfg->expert_fp4 = 1;
        /* the reference's fp8_block_size is a constant 32 */
        cfg->weight_block[0] = cfg->weight_block[1] = 32;
    }
    return 0;
}

static int check_identity(pctx *P) {
    char s[64];
    if (!P->hf) return 0;
    if (get_str(P, P->root, "model_type", "model_type", s, sizeof s)) return -1;
    if (s[0] && strcmp(s, "deepseek_v41"))
        return fail(P, "model_type: '%s', expected deepseek_v41", s);
    if (get_str(P, P->text, "model_type", "text_config.model_type", s, sizeof s)) return -1;
    if (s[0] && strcmp(s, "deepseek_v41_text"))
        return fail(P, "text_config.model_type: '%s', expected deepseek_v41_text", s);
    json_t *a = json_object_get(P->root, "architectures");
    if (a) {
        if (!json_is_array(a)) return fail(P, "architectures: expected an array, got %s", json_kind(a));
        int ok = 0;
        for (size_t i = 0; i < json_array_size(a); i++) {
            json_t *e = json_array_get(a, i);
            if (json_is_string(e) && !strcmp(json_string_value(e), "DeepseekV41ForCausalLM")) ok = 1;
        }
        if (!ok) return fail(P, "architectures: DeepseekV41ForCausalLM not listed");
    }
    if (get_str(P, P->text, "topk_method", "text_config.topk_method", s, sizeof s)) return -1;
    if (s[0] && strcmp(s, "noaux_tc"))
        return fail(P, "text_config.topk_method: '%s' is not supported (expected noaux_tc: no expert groups)", s);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Consistency
 * ---------------------------------------------------------------------------------------- */

static int check_list(pctx *P, const char *name, const int *v, int n, int limit, const char *what) {
    for (int i = 0; i < n; i++) {
        if (v[i] < 0 || v[i] >= limit)
            return fail(P, "%s[%d]: layer %d is outside 0..%d (%s)", name, i, v[i], limit - 1, what);
        if (i > 0 && v[i] <= v[i - 1])
            return fail(P, "%s: not strictly increasing (%d after %d at entry %d)", name, v[i], v[i - 1], i);
    }
    return 0;
}

static int in_list(const int *v, int n, int x) {
    for (int i = 0; i < n; i++)
        if (v[i] == x) return 1;
    return 0;
}

/* latest list entry <= id, or -1 */
static int latest_at_or_before(const int *v, int n, int id) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (v[i] <= id) best = v[i];
    return best;
}

static int multiple(pctx *P, const char *name, long long value, int block, const char *why) {
    if (value % block)
        return fail(P, "%s: %lld is not a multiple of %d (%s)", name, value, block, why);
    return 0;
}

static int check_config(pctx *P, ds41_config *c) {
    char nb[192];
    int L = c->n_layers, total = c->n_layers + c->n_mtp;

    /* required fields, now that the conditions are known */
    for (size_t i = 0; i < N_FIELDS; i++) {
        const fdesc *f = &FIELDS[i];
        freq r = P->hf ? f->req_hf : f->req_flat;
        if (P->present[i]) continue;
        if (required(P, r, c)) {
            const char *cond = "";
            switch (r) {
            case R_COMPRESS: cond = " (required when a compress ratio is > 0)"; break;
            case R_INDEX: cond = " (required when there is an index source)"; break;
            case R_CAND: cond = " (required when there is a candidate source)"; break;
            case R_ENGRAM: cond = " (required when there is an Engram layer)"; break;
            case R_MTP: cond = " (required when there are DSpark stages)"; break;
            case R_YARN: cond = " (required when YaRN is on)"; break;
            default: break;
            }
            return fail(P, "%s: missing required field%s", fname_of(P, f, nb, sizeof nb), cond);
        }
        if (r == R_OPT || r == R_NONE) {
            char *b = (char *)c;
            switch (f->kind) {
            case K_INT: case K_BOOL: *(int *)(b + f->off) = (int)f->def; break;
            case K_I64: *(long long *)(b + f->off) = (long long)f->def; break;
            case K_F32: *(float *)(b + f->off) = (float)f->def; break;
            default: break;
            }
        }
    }
    if (!P->hf) {
        /* no max_position_embeddings in the flat file: the YaRN-extended length
         * (spec 1.1: 1048576 = 65536 x 16), or 0 (unknown) without YaRN */
        c->max_position_embeddings =
            c->yarn ? (long long)((double)c->original_seq_len * c->rope_factor) : 0;
    }

    if (c->tie_word_embeddings)
        return fail(P, "%s: true is not supported (V4.1 has separate embed.weight and head.weight)",
                    NM(tie_word_embeddings));

    /* the ratio list covers the backbone and the DSpark stages */
    if (c->n_ratios != total)
        return fail(P, "%s: %d entries, expected %d (%s %d + %s %d)", NM(compress_ratios), c->n_ratios, total,
                    NM(n_layers), L, NM(n_mtp), c->n_mtp);
    for (int s = L; s < total; s++)
        if (c->compress_ratios[s] != 0)
            return fail(P, "%s[%d]: DSpark stage %d has ratio %d, expected 0 (draft stages are SWA-only)",
                        NM(compress_ratios), s, s, c->compress_ratios[s]);

    if (check_list(P, NM(kv_sources), c->kv_sources, c->n_kv_sources, L, "backbone layers")) return -1;
    if (check_list(P, NM(index_sources), c->index_sources, c->n_index_sources, L, "backbone layers")) return -1;
    if (check_list(P, NM(engram_layers), c->engram_layers, c->n_engram_layers, L, "backbone layers")) return -1;
    if (check_list(P, NM(dspark_targets), c->dspark_targets, c->n_dspark_targets, L, "backbone layers")) return -1;

    for (int i = 0; i < c->n_kv_sources; i++) {
        int k = c->kv_sources[i];
        if (c->compress_ratios[k] == 0)
            return fail(P, "%s: layer %d has compress ratio 0 (a KV source needs a ratio > 0)", NM(kv_sources), k);
        /* the index K is produced by the owner's indexer (reference Indexer.owns_k) */
        if (!in_list(c->index_sources, c->n_index_sources, k))
            return fail(P, "%s: layer %d is not in %s (a KV source runs its own indexer)", NM(kv_sources), k,
                        NM(index_sources));
    }
    for (int i = 0; i < c->n_index_sources; i++) {
        int k = c->index_sources[i];
        if (c->compress_ratios[k] == 0)
            return fail(P, "%s: layer %d has compress ratio 0 (an index source needs a ratio > 0)",
                        NM(index_sources), k);
        if (latest_at_or_before(c->kv_sources, c->n_kv_sources, k) < 0)
            return fail(P, "%s: layer %d has no KV source at or before it (%s)", NM(index_sources), k,
                        NM(kv_sources));
    }
    for (int l = 0; l < L; l++) {
        int r = c->compress_ratios[l];
        if (r == 0) continue;
        int kv = latest_at_or_before(c->kv_sources, c->n_kv_sources, l);
        if (kv < 0)
            return fail(P, "%s[%d]: layer %d has ratio %d but no KV source at or before it (%s)",
                        NM(compress_ratios), l, l, r, NM(kv_sources));
        /* a consumer reads the source's cache with its own ratio: they must agree */
        if (c->compress_ratios[kv] != r)
            return fail(P, "%s[%d]: layer %d has ratio %d but its KV source layer %d has ratio %d",
                        NM(compress_ratios), l, l, r, kv, c->compress_ratios[kv]);
    }
    if (c->candidate_source >= 0) {
        if (c->candidate_source >= L)
            return fail(P, "%s: layer %d is outside 0..%d", NM(candidate_source), c->candidate_source, L - 1);
        if (!in_list(c->index_sources, c->n_index_sources, c->candidate_source))
            return fail(P, "%s: layer %d is not an index source (%s)", NM(candidate_source), c->candidate_source,
                        NM(index_sources));
    } else {
        c->candidate_source = -1;
    }

    /* MoE */
    if (strcmp(c->score_func, "sqrtsoftplus") && strcmp(c->score_func, "sigmoid") &&
        strcmp(c->score_func, "softmax"))
        return fail(P, "%s: unknown scoring function '%s' (expected sqrtsoftplus, sigmoid or softmax)",
                    NM(score_func), c->score_func);
    if (c->n_active_experts > c->n_routed_experts)
        return fail(P, "%s: %d experts per token is more than %s (%d)", NM(n_active_experts), c->n_active_experts,
                    NM(n_routed_experts), c->n_routed_experts);
    if (c->dspark_n_experts == 0) c->dspark_n_experts = c->n_routed_experts;
    if (c->dspark_n_active == 0) c->dspark_n_active = c->n_active_experts;
    if (c->dspark_n_active > c->dspark_n_experts)
        return fail(P, "%s: %d experts per token is more than the draft stages' %d experts", NM(dspark_n_active),
                    c->dspark_n_active, c->dspark_n_experts);

    /* attention geometry */
    if (c->rope_dim > c->head_dim)
        return fail(P, "%s: %d is larger than %s (%d)", NM(rope_dim), c->rope_dim, NM(head_dim), c->head_dim);
    if (c->rope_dim % 2) return fail(P, "%s: %d is odd (RoPE rotates pairs)", NM(rope_dim), c->rope_dim);
    long long hq = (long long)c->n_heads * c->head_dim;
    if (hq % c->o_groups)
        return fail(P, "%s: %s x %s = %lld is not divisible by %d groups", NM(o_groups), NM(n_heads), NM(head_dim),
                    hq, c->o_groups);
    if (multiple(P, NM(dim), c->dim, 32, "FP8 activation blocks of 32")) return -1;
    if (multiple(P, NM(q_lora_rank), c->q_lora_rank, 32, "FP8 activation blocks of 32")) return -1;
    if (multiple(P, NM(head_dim), c->head_dim, 16, "Q4nv groups of 16 for the compressed KV")) return -1;
    if (multiple(P, NM(head_dim), c->head_dim, 32, "Q8 groups of 32 for the SWA KV")) return -1;
    {
        char why[128];
        snprintf(why, sizeof why, "wo_a input per group = %s x %s / %s, FP8 blocks of 32", NM(n_heads),
                 NM(head_dim), NM(o_groups));
        if (multiple(P, NM(o_groups), hq / c->o_groups, 32, why)) return -1;
        snprintf(why, sizeof why, "wo_b input = %s x %s, FP8 activation blocks of 32", NM(o_groups),
                 NM(o_lora_rank));
        if (multiple(P, NM(o_lora_rank), (long long)c->o_groups * c->o_lora_rank, 32, why)) return -1;
    }
    if (multiple(P, NM(moe_inter_dim), c->moe_inter_dim, 32, "FP4 weight and activation blocks of 32")) return -1;
    if (c->n_index_sources > 0) {
        if (multiple(P, NM(index_head_dim), c->index_head_dim, 32, "Q4mx groups of 32")) return -1;
        if (c->rope_dim > c->index_head_dim)
            return fail(P, "%s: %d is larger than %s (%d)", NM(rope_dim), c->rope_dim, NM(index_head_dim),
                        c->index_head_dim);
    }

    /* Engram */
    if (c->n_engram_layers > 0) {
        if (P->n_engram_rows != c->n_engram_layers)
            return fail(P, "%s: %d entries but %s has %d layers", NM(engram_num_embeddings), P->n_engram_rows,
                        NM(engram_layers), c->n_engram_layers);
        if (multiple(P, NM(engram_head_dim), c->engram_head_dim, 32, "table scales per 32 dims")) return -1;
        if (c->engram_compressed_vocab > c->vocab_size)
            return fail(P, "%s: %d is larger than %s (%d)", NM(engram_compressed_vocab), c->engram_compressed_vocab,
                        NM(vocab_size), c->vocab_size);
        if (c->engram_pad_id >= c->vocab_size)
            return fail(P, "%s: %d is not a token id (%s %d)", NM(engram_pad_id), c->engram_pad_id, NM(vocab_size),
                        c->vocab_size);
    } else if (P->n_engram_rows > 0) {
        return fail(P, "%s: %d entries but %s is empty", NM(engram_num_embeddings), P->n_engram_rows,
                    NM(engram_layers));
    }

    /* DSpark */
    if (c->n_mtp > 0) {
        if (c->n_dspark_targets == 0)
            return fail(P, "%s: empty but %s is %d", NM(dspark_targets), NM(n_mtp), c->n_mtp);
        if (c->dspark_noise_token_id >= c->vocab_size)
            return fail(P, "%s: %d is not a token id (%s %d)", NM(dspark_noise_token_id), c->dspark_noise_token_id,
                        NM(vocab_size), c->vocab_size);
    }

    if (get_token_id(P, "bos_token_id", c->vocab_size, &c->bos_token_id)) return -1;
    if (get_token_id(P, "eos_token_id", c->vocab_size, &c->eos_token_id)) return -1;
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * The layer plan (spec section 2)
 * ---------------------------------------------------------------------------------------- */

static int derive_plan(pctx *P, ds41_config *c) {
    int L = c->n_layers, total = L + c->n_mtp;
    c->first_decoder_layer = c->n_kv_sources ? c->kv_sources[c->n_kv_sources - 1] : L;
    c->layers = calloc((size_t)total, sizeof *c->layers);
    if (!c->layers) return fail(P, "out of memory for the layer plan");
    for (int id = 0; id < total; id++) {
        ds41_layer_plan *p = &c->layers[id];
        int r = c->compress_ratios[id];
        p->id = id;
        p->ratio = r;
        p->kv_source = p->topk_source = p->index_k_source = -1;
        p->engram_slot = -1;
        p->twin_kv_at = -1;
        if (id >= L) {
            /* DSpark stage: SWA only, rope theta of the ratio-0 layers, its own expert counts */
            p->part = DS41_PART_DRAFT;
            p->mode = DS41_MODE_DRAFT;
            p->rope_theta = c->rope_theta;
            p->yarn = 0;
            p->n_experts = c->dspark_n_experts;
            p->n_active = c->dspark_n_active;
            continue;
        }
        /* the decoder is everything from the last KV source on (spec 4.1) */
        p->part = id >= c->first_decoder_layer ? DS41_PART_DECODER : DS41_PART_ENCODER;
        p->is_kv_source = in_list(c->kv_sources, c->n_kv_sources, id);
        p->is_index_source = in_list(c->index_sources, c->n_index_sources, id);
        p->is_candidate_source = id == c->candidate_source;
        p->uses_candidates = p->is_index_source && c->candidate_source >= 0 && id > c->candidate_source;
        for (int e = 0; e < c->n_engram_layers; e++)
            if (c->engram_layers[e] == id) p->engram_slot = e;
        p->is_dspark_target = in_list(c->dspark_targets, c->n_dspark_targets, id);
        p->n_experts = c->n_routed_experts;
        p->n_active = c->n_active_experts;
        if (r == 0) {
            p->mode = DS41_MODE_SWA;
            p->rope_theta = c->rope_theta;
            p->yarn = 0;
            continue;
        }
        p->rope_theta = c->compress_rope_theta;
        p->yarn = c->yarn && c->original_seq_len > 0;
        p->kv_source = latest_at_or_before(c->kv_sources, c->n_kv_sources, id);
        p->topk_source = latest_at_or_before(c->index_sources, c->n_index_sources, id);
        if (p->is_kv_source) {
            p->mode = DS41_MODE_FULL;
            p->index_k_source = id;
        } else if (p->is_index_source) {
            p->mode = DS41_MODE_REINDEX;
            p->index_k_source = p->kv_source;
        } else {
            p->mode = DS41_MODE_REUSE;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Entry points
 * ---------------------------------------------------------------------------------------- */

int ds41_config_parse(const char *json, size_t len, ds41_config *cfg, ds41_err *err) {
    memset(cfg, 0, sizeof *cfg);
    pctx P;
    memset(&P, 0, sizeof P);
    P.err = err;
    /* jansson may stop reading at a NUL byte; a config never holds one */
    const char *nul = memchr(json, 0, len);
    if (nul) return fail(&P, "invalid JSON: NUL byte at offset %zu", (size_t)(nul - json));
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        /* jansson's text can contain the offending bytes; keep the message on one line */
        for (char *q = je.text; *q; q++)
            if (*q == '\n' || *q == '\r' || (unsigned char)*q < 0x20) *q = ' ';
        return fail(&P, "invalid JSON at line %d, column %d: %s", je.line, je.column, je.text);
    }
    int rc = -1;
    P.root = root;
    if (!json_is_object(root)) {
        fail(&P, "expected a JSON object at the top level, got %s", json_kind(root));
        goto out;
    }
    json_t *text = json_object_get(root, "text_config");
    if (text) {
        if (!json_is_object(text)) {
            fail(&P, "text_config: expected an object, got %s", json_kind(text));
            goto out;
        }
        P.hf = 1;
        P.text = text;
    } else if (!json_object_get(root, "n_layers")) {
        fail(&P, "neither text_config (Hugging Face spelling) nor n_layers (flat inference/config.json "
                 "spelling) found");
        goto out;
    }
    strcpy(cfg->source_spelling, P.hf ? "hf" : "flat");
    cfg->candidate_source = -1;
    if (check_identity(&P)) goto out;
    if (read_fields(&P, cfg)) goto out;
    if (read_rope_and_quant(&P, cfg)) goto out;
    if (!P.hf) cfg->yarn = cfg->original_seq_len > 0;
    if (check_config(&P, cfg)) goto out;
    if (derive_plan(&P, cfg)) goto out;
    rc = 0;
out:
    json_decref(root);
    if (rc) ds41_config_free(cfg);
    return rc;
}

#define DS41_CONFIG_MAX_BYTES (16u << 20)

int ds41_config_load(const char *path, ds41_config *cfg, ds41_err *err) {
    struct stat st;
    char *file = NULL;
    memset(cfg, 0, sizeof *cfg);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        file = ds41_path_join(path, "config.json");
        if (!file) return ds41_errf(err, "%s: out of memory", path);
    } else {
        file = strdup(path);
        if (!file) return ds41_errf(err, "%s: out of memory", path);
    }
    char *text = NULL;
    size_t len = 0;
    if (ds41_read_file(file, DS41_CONFIG_MAX_BYTES, &text, &len, err)) {
        free(file);
        return -1;
    }
    ds41_err e;
    int rc = ds41_config_parse(text, len, cfg, &e);
    if (rc) ds41_errf(err, "%s: %s", file, e.msg);
    free(text);
    free(file);
    return rc;
}

void ds41_config_free(ds41_config *cfg) {
    if (!cfg) return;
    free(cfg->layers);
    cfg->layers = NULL;
}

/* ------------------------------------------------------------------------------------------
 * Budgets (spec 6 and 8)
 * ---------------------------------------------------------------------------------------- */

typedef struct budget_acc {
    const ds41_config *cfg;
    long long weight_bytes;
    double total_params, decode_params, prefill_params;
} budget_acc;

/* Is this tensor of the first decoder layer needed to project the decoder's global KV during
 * a CED prefill (spec 4.1 step 2)? The attention input norm, the compressor, the index-K
 * projection. */
static int ced_kv_path(const char *name) {
    const char *t = strchr(name, '.');
    t = t ? strchr(t + 1, '.') : NULL;
    if (!t) return 0;
    t++;
    return !strcmp(t, "attn_norm.weight") || !strncmp(t, "attn.compressor.", 16) ||
           !strncmp(t, "attn.indexer.wk.", 16) || !strncmp(t, "attn.indexer.k_norm.", 20);
}

static int budget_cb(const ds41_tensor_spec *t, void *ctx) {
    budget_acc *a = ctx;
    const ds41_config *c = a->cfg;
    if (t->optional) return 0;
    a->weight_bytes += (long long)ds41_spec_nbytes(t);
    double p = (double)ds41_spec_params(t);
    a->total_params += p;
    if (t->layer < 0 || t->layer >= c->n_layers) {
        /* globals: the head is active for decode (one row of logits per token); the
         * embedding contributes the one row it looks up (counted separately below) */
        if (t->role == DS41_ROLE_HEAD || t->role == DS41_ROLE_FINAL_NORM) a->decode_params += p;
        return 0;
    }
    const ds41_layer_plan *pl = &c->layers[t->layer];
    double share = p;
    if (t->role == DS41_ROLE_ROUTED_EXPERT) share = p * pl->n_active / pl->n_experts;
    if (t->role == DS41_ROLE_ENGRAM_TABLE) share = 0; /* only the looked-up rows, counted below */
    a->decode_params += share;
    if (t->layer < c->first_decoder_layer) a->prefill_params += share;
    else if (t->layer == c->first_decoder_layer && ced_kv_path(t->name)) a->prefill_params += p;
    return 0;
}

void ds41_config_budgets(const ds41_config *c, ds41_budgets *b) {
    memset(b, 0, sizeof *b);
    /* packed record sizes (spec 6.1): main KV = E2M1 codes + one E4M3 scale per 16;
     * index K = E2M1 codes + one UE8M0 scale per 32; SWA = E4M3 + one UE8M0 per 32 */
    long long main_entry = c->head_dim / 2 + c->head_dim / 16;
    long long index_entry = c->index_head_dim / 2 + c->index_head_dim / 32;
    long long swa_entry = c->head_dim + c->head_dim / 32;
    double main = 0, index = 0;
    for (int i = 0; i < c->n_kv_sources; i++) {
        int r = c->compress_ratios[c->kv_sources[i]];
        main += (double)main_entry / r;   /* one entry per r tokens */
        index += (double)index_entry / r;
    }
    b->global_kv_main_bytes_per_token = main;
    b->global_kv_index_bytes_per_token = index;
    b->global_kv_bytes_per_token = main + index;
    /* exact for ratios 1 and 2 (the only ones V4.1 uses); rounded for larger ratios */
    b->global_kv_main_bytes_per_token_x2 = llround(main * 2);
    b->global_kv_index_bytes_per_token_x2 = llround(index * 2);
    b->swa_bytes_per_token_per_layer = swa_entry;
    b->swa_ring_bytes = (long long)c->n_layers * c->window * swa_entry;
    b->dspark_ring_bytes = (long long)c->n_mtp * c->window * swa_entry;
    /* ratio > 1 compressor partial state: r rows of (kv, score), FP32, per owner (spec 6.3) */
    for (int i = 0; i < c->n_kv_sources; i++) {
        int r = c->compress_ratios[c->kv_sources[i]];
        if (r > 1) b->compressor_state_bytes += (long long)r * 2 * c->head_dim * 4;
    }
    /* Engram history: the last max_ngram-1 compressed ids, int32 */
    long long engram_hist = c->n_engram_layers ? 4LL * (c->engram_max_ngram - 1) : 0;
    b->bounded_state_bytes = b->swa_ring_bytes + b->dspark_ring_bytes + b->compressor_state_bytes + engram_hist;

    budget_acc a = { .cfg = c };
    if (c->layers) ds41_contract_each(c, NULL, budget_cb, &a);
    /* one embedding row per token; per Engram layer the (max_ngram-1) x heads rows it gathers */
    double embed_row = c->dim;
    double engram_rows_decode = 0, engram_rows_prefill = 0;
    for (int e = 0; e < c->n_engram_layers; e++) {
        double rows = (double)(c->engram_max_ngram - 1) * c->engram_n_heads * c->engram_head_dim;
        engram_rows_decode += rows;
        if (c->engram_layers[e] < c->first_decoder_layer) engram_rows_prefill += rows;
    }
    b->weight_bytes = a.weight_bytes;
    b->total_params = a.total_params;
    b->active_params_decode = a.decode_params + embed_row + engram_rows_decode;
    b->active_params_prefill = a.prefill_params + embed_row + engram_rows_prefill;
}
