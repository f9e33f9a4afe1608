/* ds41 per-sequence state (spec 6): the global KV of every KV source in 128-token pages of
 * packed records (main KV Q4nv 288 B + index K Q4mx 68 B per compressed entry at production
 * width), one SWA ring of packed Q8 records (528 B) per layer and per DSpark stage, the
 * ratio-r compressor partial state (FP32), the Engram token history and the position.
 *
 * Nothing is global: a ds41_cache is one sequence, so any number can live side by side.
 * Pages are owned through a per-sequence page table; a later batching issue can hand them
 * out from a shared pool without changing how records are addressed. */
#ifndef DS41_CACHE_H
#define DS41_CACHE_H

#include "config.h"

#define DS41_PAGE_TOKENS 128

typedef struct ds41_kv_store {
    int layer;               /* the KV source's layer id */
    int ratio;               /* its compress ratio r */
    int per_page;            /* entries per page = DS41_PAGE_TOKENS / r (at least 1) */
    int kv_bytes, ik_bytes;  /* record sizes */
    size_t page_bytes;       /* per_page * (kv_bytes + ik_bytes) */
    int n_pages, cap_pages;
    uint8_t **pages;         /* page: [per_page main-KV records][per_page index-K records] */
    long long n_entries;     /* compressed entries written */
} ds41_kv_store;

typedef struct ds41_ring {
    int slots;               /* = window */
    int rec_bytes;           /* 528 at production */
    uint8_t *rec;            /* slots * rec_bytes; never-written slots are zero */
} ds41_ring;

typedef struct ds41_comp_state {
    int layer, ratio, dim;
    float *kv, *sc;          /* [ratio][dim] each; initially kv 0 and score -inf */
} ds41_comp_state;

typedef struct ds41_cache {
    const ds41_config *cfg;
    long long pos;           /* tokens held (the next token's position) */
    long long max_pos;       /* context size */
    int n_stores;
    ds41_kv_store *stores;   /* one per KV source, in kv_sources order */
    int n_rings;             /* n_layers + n_mtp: ring l for layer l, n_layers + s for stage s */
    ds41_ring *rings;
    int n_comp;
    ds41_comp_state *comp;   /* one per KV source with ratio > 1 */
    int32_t hist[16];        /* Engram history: hist[s] = compressed id at pos-1-s, s < max_ngram-1 */
    int ik_owner;            /* index_k=official: layer whose index-K cache is published (-1) */
} ds41_cache;

int ds41_cache_init(ds41_cache *c, const ds41_config *cfg, long long max_pos, ds41_err *err);
void ds41_cache_free(ds41_cache *c);
/* Forgets the sequence (position 0) and keeps the allocations for reuse. */
void ds41_cache_reset(ds41_cache *c);

/* Store of KV-source layer `layer`, or NULL. */
ds41_kv_store *ds41_cache_store(ds41_cache *c, int layer);
ds41_comp_state *ds41_cache_comp(ds41_cache *c, int layer);
/* Records of entry j (allocating pages up to j when `alloc`); NULL if j is not held. */
uint8_t *ds41_store_kv_rec(ds41_kv_store *s, long long j, int alloc, ds41_err *err);
uint8_t *ds41_store_ik_rec(ds41_kv_store *s, long long j, int alloc, ds41_err *err);
/* Copies entries [0, n) dequantized: main KV into out [n, head_dim] / index K [n, index_head_dim]. */
void ds41_store_unpack_kv(const ds41_config *cfg, ds41_kv_store *s, long long n, float *out);
void ds41_store_unpack_ik(const ds41_config *cfg, ds41_kv_store *s, long long n, float *out);

static inline uint8_t *ds41_ring_slot(ds41_ring *r, long long pos) {
    return r->rec + (size_t)(pos % r->slots) * r->rec_bytes;
}

/* Bytes actually held by the state, by kind. */
typedef struct ds41_state_bytes {
    long long global_kv_written;   /* main + index records written (entries x record bytes) */
    long long global_kv_main, global_kv_index;
    long long global_kv_pages;     /* bytes of allocated pages */
    long long swa_rings, dspark_rings, compressor, engram_history;
    long long total_held;          /* pages + rings + compressor + history */
    double global_kv_per_token;    /* written / pos (890 at production width, pos even) */
} ds41_state_bytes;
void ds41_cache_bytes(const ds41_cache *c, ds41_state_bytes *b);

#endif
