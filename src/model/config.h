/* ds41 config: config.json (Hugging Face spelling with text_config / quantization_config,
 * or the reference's flat inference/config.json spelling) and the layer plan of spec
 * section 2, derived from the fields alone. */
#ifndef DS41_CONFIG_H
#define DS41_CONFIG_H

#include "common.h"

typedef enum ds41_part { DS41_PART_ENCODER, DS41_PART_DECODER, DS41_PART_DRAFT } ds41_part;

typedef enum ds41_mode {
    DS41_MODE_SWA,      /* ratio 0: SWA only */
    DS41_MODE_FULL,     /* own compressor (KV source) + own index K + own indexer */
    DS41_MODE_REINDEX,  /* own indexer Q scored against another layer's index K */
    DS41_MODE_REUSE,    /* no indexer; reuses another layer's top-k */
    DS41_MODE_DRAFT     /* DSpark stage (SWA only, non-causal inside the block) */
} ds41_mode;

const char *ds41_mode_name(ds41_mode m);   /* "swa", "full", "reindex", "reuse", "draft" */
const char *ds41_part_name(ds41_part p);   /* "encoder", "decoder", "draft" */

typedef struct ds41_layer_plan {
    int id;                  /* 0..n_layers-1, then n_layers..n_layers+n_mtp-1 for draft stages */
    ds41_part part;
    ds41_mode mode;
    int ratio;               /* compress ratio (0, 1, 2, ...) */
    int kv_source;           /* layer whose compressed main KV this layer attends; -1 if none */
    int topk_source;         /* layer whose top-k this layer uses; -1 if none */
    int index_k_source;      /* layer whose index K this layer's indexer scores (own reading); -1 */
    int is_kv_source;        /* has a compressor */
    int is_index_source;     /* runs an indexer */
    int is_candidate_source; /* builds the candidate pool */
    int uses_candidates;     /* its indexer filters by the candidate pool */
    int engram_slot;         /* Engram module before this block: slot index, else -1 */
    int twin_kv_at;          /* -1; in the bench's CSA2-less twin (engine/twin.c) a decoder layer
                              * whose compressor runs on the attention input of this layer */
    int is_dspark_target;    /* its input stream feeds the DSpark drafter */
    float rope_theta;
    int yarn;                /* YaRN applied */
    int n_experts;           /* routed experts of this layer's MoE */
    int n_active;            /* experts per token */
} ds41_layer_plan;

#define DS41_MAX_LIST 64

typedef struct ds41_config {
    /* backbone */
    int vocab_size, dim, n_layers, n_mtp;
    long long max_position_embeddings;
    float norm_eps;
    int tie_word_embeddings;
    int bos_token_id, eos_token_id;       /* -1 if absent */
    /* attention */
    int n_heads, n_kv_heads, head_dim, rope_dim, q_lora_rank, o_groups, o_lora_rank, window;
    /* rope */
    float rope_theta, compress_rope_theta;
    int yarn;                              /* rope_scaling.rope_type == yarn */
    float rope_factor;
    long long original_seq_len;
    float beta_fast, beta_slow;
    /* CSA2 */
    int n_ratios;                          /* = n_layers + n_mtp */
    int compress_ratios[DS41_MAX_LIST * 2];
    int n_kv_sources, kv_sources[DS41_MAX_LIST];
    int n_index_sources, index_sources[DS41_MAX_LIST];
    int candidate_source;                  /* -1 if none */
    int candidate_topk_blocks, candidate_block_size;
    int index_n_heads, index_head_dim, index_topk;
    /* MoE */
    int n_routed_experts, n_shared_experts, n_active_experts, moe_inter_dim;
    char score_func[32];                   /* "sqrtsoftplus" (also accepted: "sigmoid", "softmax") */
    int norm_topk_prob;
    float route_scale, swiglu_limit, gate_temp;
    /* mHC */
    int hc_mult, hc_sinkhorn_iters;
    float hc_eps;
    /* Engram */
    int n_engram_layers, engram_layers[DS41_MAX_LIST];
    int engram_max_ngram, engram_n_heads, engram_head_dim;
    long long engram_vocab_size;
    long long engram_num_embeddings[DS41_MAX_LIST];   /* one per Engram layer */
    int engram_compressed_vocab, engram_pad_id;
    /* DSpark */
    int dspark_block_size, dspark_noise_token_id, dspark_markov_rank;
    int dspark_n_experts, dspark_n_active;
    int n_dspark_targets, dspark_targets[DS41_MAX_LIST];
    /* quantization */
    int quant_fp8;                         /* quant_method fp8 */
    int weight_block[2];                   /* 32, 32 */
    int expert_fp4;                        /* expert_dtype fp4 */
    /* vision tower (docs/vision.md); also decides whether gate.bias_vl is expected */
    int vision_n_layers;                   /* 0: no vision tower */
    /* image preprocessing (src/image/): patch 14, unshuffle 3, at most 1024 tokens an image,
     * min_pixels 295936, max_wh_ratio -1 (null: none), image_token_id 129264 */
    int vision_patch_size, vision_downsample_ratio, vision_max_n_token, vision_min_pixels;
    int vision_max_wh_ratio, image_token_id;
    /* the tower's shape (docs/vision.md) */
    int vision_dim, vision_n_heads, vision_inter_dim;
    float vision_rope_theta;
    /* derived */
    int first_decoder_layer;               /* the last KV source */
    ds41_layer_plan *layers;               /* n_layers + n_mtp entries */
    char source_spelling[8];               /* "hf" or "flat" */
} ds41_config;

/* path: a checkpoint directory (reads DIR/config.json) or a config.json file. */
int ds41_config_load(const char *path, ds41_config *cfg, ds41_err *err);
/* Parses JSON text (used by the loader and the fuzz harness). */
int ds41_config_parse(const char *json, size_t len, ds41_config *cfg, ds41_err *err);
void ds41_config_free(ds41_config *cfg);

/* Budgets (spec 6). */
typedef struct ds41_budgets {
    long long global_kv_main_bytes_per_token_x2;   /* x2 so ratio-2 halves stay integral */
    long long global_kv_index_bytes_per_token_x2;
    double global_kv_bytes_per_token;              /* main + index (890 at production) */
    double global_kv_main_bytes_per_token;         /* 720 */
    double global_kv_index_bytes_per_token;        /* 170 */
    long long swa_bytes_per_token_per_layer;       /* 528 */
    long long swa_ring_bytes;                      /* all SWA rings, one sequence */
    long long dspark_ring_bytes;
    long long compressor_state_bytes;
    long long bounded_state_bytes;                 /* sum of the bounded per-sequence state */
    long long weight_bytes;                        /* from the tensor contract of spec 8 */
    double active_params_decode, active_params_prefill;
    double total_params;
} ds41_budgets;

void ds41_config_budgets(const ds41_config *cfg, ds41_budgets *b);

#endif
