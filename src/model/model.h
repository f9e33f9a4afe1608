/* ds41 model: weight binding. Every tensor of spec section 8 is bound by its released
 * name, with dtype and exact shape checked against the config. Views point into the
 * mmap'd safetensors; nothing is dequantized or copied. */
#ifndef DS41_MODEL_H
#define DS41_MODEL_H

#include "config.h"
#include "safetensors.h"

/* FP8 linear: w E4M3 [out, in], s UE8M0 [ceil(out/32), ceil(in/32)] (32x32 tiles). */
typedef struct ds41_fp8w { const uint8_t *w; const uint8_t *s; int out, in; } ds41_fp8w;
/* FP4 linear (routed experts): w I8 [out, in/2] packed E2M1 (low nibble = even k),
 * s UE8M0 [out, in/32]. */
typedef struct ds41_fp4w { const uint8_t *w; const uint8_t *s; int out, in; } ds41_fp4w;
/* BF16 matrix [out, in] (raw bf16 bits). */
typedef struct ds41_bf16w { const uint16_t *w; int out, in; } ds41_bf16w;

typedef struct ds41_expert { ds41_fp4w w1, w2, w3; } ds41_expert;

typedef struct ds41_layer_weights {
    /* attention (every layer and draft stage) */
    const float *attn_sink;                 /* F32 [n_heads] */
    const uint16_t *q_norm, *kv_norm;       /* BF16 [q_lora], [head_dim] */
    ds41_fp8w wq_a, wq_b, wkv, wo_a, wo_b;
    const uint16_t *attn_norm, *ffn_norm;   /* BF16 [dim] */
    /* mHC */
    const float *hc_attn_fn, *hc_ffn_fn;    /* F32 [(2+hc)*hc, hc*dim] */
    const float *hc_attn_base, *hc_ffn_base;/* F32 [(2+hc)*hc] */
    const float *hc_attn_scale, *hc_ffn_scale; /* F32 [3] */
    /* MoE */
    ds41_bf16w gate;                        /* [E, dim] */
    const float *gate_bias, *gate_bias_vl;  /* F32 [E] */
    int n_experts;
    ds41_expert *experts;                   /* owned array of views, n_experts */
    ds41_fp8w sh_w1, sh_w2, sh_w3;          /* shared expert */
    /* KV sources: compressor + index-K projection */
    const uint16_t *comp_norm;              /* BF16 [head_dim] */
    ds41_bf16w comp_wkv, comp_wgate;        /* [head_dim, dim]; wgate only for ratio > 1 */
    const uint16_t *idx_k_norm;             /* BF16 [index_head_dim] */
    ds41_bf16w idx_wk;                      /* [index_head_dim, head_dim] */
    /* index sources */
    ds41_bf16w idx_weights_proj;            /* [index_n_heads, dim] */
    ds41_fp8w idx_wq_b;                     /* [index_n_heads*index_head_dim, q_lora] */
    /* Engram layers */
    const uint8_t *eg_embed, *eg_scale;     /* E4M3 [rows, head_dim], UE8M0 [rows, head_dim/32] */
    int64_t eg_rows;
    const uint16_t *eg_q, *eg_k;            /* BF16 [hc, dim] */
    ds41_fp8w eg_wkv;                       /* [(hc+1)*dim, (n-1)*heads*head_dim] */
    /* DSpark stage extras */
    ds41_fp8w main_proj;                    /* stage 0: [dim, n_targets*dim] */
    const uint16_t *main_norm;              /* stage 0 */
    const uint16_t *final_norm;             /* last stage: mtp.{last}.norm */
    ds41_bf16w markov_embed, markov_head;   /* last stage: [vocab, rank] */
    ds41_bf16w conf_proj;                   /* last stage: [1, dim + rank] */
} ds41_layer_weights;

typedef struct ds41_weights {
    const uint16_t *embed;                  /* BF16 [vocab, dim] */
    const uint16_t *head;                   /* BF16 [vocab, dim] */
    const uint16_t *norm;                   /* BF16 [dim] */
    int n_layers;                           /* n_layers + n_mtp */
    ds41_layer_weights *layers;
    /* binding statistics */
    size_t n_bound, n_vision, n_unexpected;
} ds41_weights;

/* Binds every tensor the plan needs. A missing or misshaped tensor is an error naming it,
 * with the expected and found dtype/shape. Vision tensors are counted (logged once) and
 * left to ds41_vision_bind (vision_weights.h). Tensors that are neither bound nor vision are counted as unexpected and
 * listed (up to a few) through ds41_log; they are not an error. */
int ds41_weights_bind(const ds41_config *cfg, const ds41_st *st, ds41_weights *w, ds41_err *err);
void ds41_weights_free(ds41_weights *w);

/* A loaded model: config + tensors + binding. */
typedef struct ds41_model {
    ds41_config cfg;
    ds41_st *st;            /* NULL when the directory holds only config.json */
    ds41_weights w;
    char *dir;
} ds41_model;

/* Loads DIR: config.json, then safetensors (if any), then binding. */
int ds41_model_open(const char *dir, ds41_model *m, ds41_err *err);
/* copy = 1: the weights are read into anonymous memory (ds41_st_copy_anon) before binding
 * instead of staying mmap'd from the files (--load copy); a tensor t with skip(t, arg) != 0 is
 * not read (ds41_st_copy_anon_skip; skip may be NULL). */
int ds41_model_open_load(const char *dir, ds41_model *m, int copy, int (*skip)(const ds41_tensor *t, void *arg), void *arg,
                         ds41_err *err);
void ds41_model_close(ds41_model *m);

#endif
