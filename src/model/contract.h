/* ds41 tensor contract (spec section 8): the list of tensors a config implies, each with its
 * released name, storage dtype and exact shape. One enumerator serves the weight binding
 * (src/model/model.c), the weight-byte and parameter budgets (src/model/config.c) and `ds41 inspect`. */
#ifndef DS41_CONTRACT_H
#define DS41_CONTRACT_H

#include "config.h"
#include "model.h"
#include "safetensors.h"

/* What a tensor is for; used to classify parameters (total / active per token). */
typedef enum ds41_role {
    DS41_ROLE_EMBED,          /* embed.weight */
    DS41_ROLE_HEAD,           /* head.weight */
    DS41_ROLE_FINAL_NORM,     /* norm.weight */
    DS41_ROLE_LAYER,          /* every per-layer tensor not listed below (attention, norms, mHC,
                                 router, shared expert, compressor, indexer, Engram projections) */
    DS41_ROLE_ROUTED_EXPERT,  /* ffn.experts.{e}.* */
    DS41_ROLE_ENGRAM_TABLE,   /* engram.embed.weight / .scale */
    DS41_ROLE_DSPARK_HEAD     /* last stage's markov head and confidence head, stage 0's main_proj */
} ds41_role;

enum { DS41_SLOT_U8, DS41_SLOT_U16, DS41_SLOT_F32 };

typedef struct ds41_tensor_spec {
    char name[96];
    ds41_dtype dtype;
    int ndim;
    int64_t shape[2];
    ds41_role role;
    int layer;                /* plan index (0..n_layers+n_mtp-1), -1 for global tensors */
    int expert;               /* routed expert id, else -1 */
    int is_scale;             /* a UE8M0 scale plane (bytes, not parameters) */
    int optional;             /* may be absent (gate.bias_vl when the config has no vision tower) */
    void *slot;               /* where binding stores the data pointer (NULL without weights): */
    int slot_type;            /* a const uint8_t*, const uint16_t* or const float* object */
} ds41_tensor_spec;

/* Calls fn once per expected tensor, in a fixed order (globals, then layers 0.., then stages).
 * When w is non-NULL its layers array must already be allocated (n_layers + n_mtp entries,
 * experts arrays sized by each plan entry's n_experts) and each spec carries the slot its
 * data pointer belongs in. Stops at the first non-zero return of fn and returns -1. */
int ds41_contract_each(const ds41_config *cfg, ds41_weights *w,
                       int (*fn)(const ds41_tensor_spec *t, void *ctx), void *ctx);

/* Bytes of one expected tensor (overflow cannot happen: config.c caps every dimension). */
uint64_t ds41_spec_nbytes(const ds41_tensor_spec *t);
/* Parameters of one expected tensor (elements; packed E2M1 counts 2 per byte; scales 0). */
uint64_t ds41_spec_params(const ds41_tensor_spec *t);

/* "F8_E4M3 [1280, 5120]" */
void ds41_spec_format(ds41_dtype dt, int ndim, const int64_t *shape, char *buf, size_t cap);

/* Checkpoint statistics for `ds41 inspect`: compares a checkpoint against the contract
 * without stopping at the first problem. */
typedef struct ds41_check_stats {
    size_t expected, present, missing, misshaped, vision, unexpected;
    char first_problem[512];          /* the first missing/misshaped tensor, "" if none */
    char **unexpected_names;          /* up to DS41_CHECK_MAX_LIST names (owned) */
    size_t n_unexpected_names;
    char **missing_names;             /* up to DS41_CHECK_MAX_LIST (owned) */
    size_t n_missing_names;
} ds41_check_stats;
#define DS41_CHECK_MAX_LIST 20

int ds41_weights_check(const ds41_config *cfg, const ds41_st *st, ds41_check_stats *s, ds41_err *err);
void ds41_check_stats_free(ds41_check_stats *s);

/* Vision tower tensors (bound apart, src/model/vision_weights.c): vision.*, aligner.*, image_start/end/newline. */
int ds41_is_vision_tensor(const char *name);

#endif
