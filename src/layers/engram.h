/* ds41 Engram (spec 1.7, 3.2, 3.3): hashing constants, per-token hashing, the module. */
#ifndef DS41_ENGRAM_H
#define DS41_ENGRAM_H
#include "kernels.h"

#define DS41_ENGRAM_MAX_LAYERS 8
#define DS41_ENGRAM_MAX_ORDER 8      /* max n-gram size */
#define DS41_ENGRAM_MAX_HEADS 32

typedef struct ds41_engram_consts {
    int n_layers, max_ngram, n_heads;             /* orders 2..max_ngram */
    int64_t mult[DS41_ENGRAM_MAX_LAYERS][DS41_ENGRAM_MAX_ORDER];               /* per lookback */
    int64_t prime[DS41_ENGRAM_MAX_LAYERS][DS41_ENGRAM_MAX_ORDER][DS41_ENGRAM_MAX_HEADS];
    int64_t offset[DS41_ENGRAM_MAX_LAYERS][DS41_ENGRAM_MAX_ORDER * DS41_ENGRAM_MAX_HEADS];
    int64_t rows[DS41_ENGRAM_MAX_LAYERS];         /* = sum of the layer's primes */
} ds41_engram_consts;

/* Computes the constants from the config: primes by the recipe of 1.7; multipliers from
 * NumPy's default_rng(10007*layer_id) stream (PCG64 + SeedSequence, implemented here),
 * checked against the baked production values. Fails if row sums disagree with
 * engram_num_embeddings (naming the layer). */
int ds41_engram_consts_init(ds41_engram_consts *c, const ds41_config *cfg, ds41_err *err);

/* numpy.random.default_rng(seed).integers(0, high, size=n, dtype=numpy.int64) as NumPy 1.24
 * computes it (SeedSequence, PCG64, Lemire bounded integers); high >= 1. Exposed for tests. */
void ds41_engram_numpy_integers(uint64_t seed, int64_t high, int n, int64_t *out);

/* Hash ids for one position: hist[0] = compressed id at p, hist[s] = at p-s (s < max_ngram),
 * with DS41_ENGRAM_DEAD for image tokens; p is the position (p < s means blocked).
 * ids[slot][col] with col = (n-2)*heads + head, cols = (max_ngram-1)*heads. */
#define DS41_ENGRAM_DEAD (-1)
void ds41_engram_hash(const ds41_engram_consts *c, const int32_t *hist, long long p, int32_t pad,
                      int64_t *ids /* [n_layers][cols] */);

/* The module for Engram layer slot `slot` (spec 3.3), in place on X [T, hc, dim].
 * ids [T, cols] for this slot; is_image may be NULL. */
void ds41_engram_apply(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                       const int64_t *ids, int T, const uint8_t *is_image, float *X);
/* ds41_engram_apply with the rows from row_fn(row_arg, id): head_dim E4M3 bytes then the
 * head_dim / 32 scale bytes of row id, or NULL to read the row from lw's tables. */
typedef const uint8_t *(*ds41_engram_row_fn)(const void *row_arg, int64_t id);
void ds41_engram_apply_src(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                           const int64_t *ids, int T, const uint8_t *is_image, float *X, ds41_engram_row_fn row_fn,
                           const void *row_arg);
#endif
