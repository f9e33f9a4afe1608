/* ds41 per-sequence state (spec 6): the global KV of every KV source in 128-token pages of
 * packed records (main KV Q4nv 288 B + index K Q4mx 68 B per compressed entry at production
 * width), one SWA ring of packed Q8 records (528 B) per layer and per DSpark stage, the
 * ratio-r compressor partial state (FP32), the Engram token history and the position.
 *
 * Nothing is global: a ds41_cache is one sequence, so any number can live side by side.
 * Pages are reached through a per-sequence page table; a page is reference-counted, so the
 * prefix cache (src/store/prefix.c) holds full pages and hands the same page to every
 * sequence restored from it (a shared page is never written: copy on write). */
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

/* Speculative verification log (spec 5.3, src/engine/spec.c): a verify forward over [P, P+T)
 * copies the ratio-r compressors' projected rows here, so a rollback to P + keep can rebuild
 * the state rows a sequence of single-token decodes would have left. cap = 0: off. */
typedef struct ds41_spec_log {
    int cap;                 /* rows each buffer holds */
    int n;                   /* rows logged by the last verify forward */
    float **kv, **sc;        /* per compressor state (comp order): [cap][dim] */
} ds41_spec_log;

/* DSpark context rows ctx = rmsnorm(main_proj(main_hidden)) of the last seed, so a proposal
 * can reuse the target side's projection (P5 metadata reuse, dspark.c). */
typedef struct ds41_ctx_rows {
    int cap, n;
    long long pos0;          /* positions pos0 .. pos0 + n - 1 */
    float *rows;             /* [cap][dim] */
} ds41_ctx_rows;

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
    ds41_spec_log spec;      /* verify forwards only */
    ds41_ctx_rows dctx;      /* DSpark: context rows of the last seed */
} ds41_cache;

int ds41_cache_init(ds41_cache *c, const ds41_config *cfg, long long max_pos, ds41_err *err);
/* Bytes of one page of KV source i (cfg->kv_sources[i]) as ds41_cache_init lays it out; 0 for
 * an index or ratio out of range (ds41_cache_init reports those). */
size_t ds41_cache_page_bytes(const ds41_config *cfg, int i);
void ds41_cache_free(ds41_cache *c);
/* Forgets the sequence (position 0) and keeps the allocations for reuse. */
void ds41_cache_reset(ds41_cache *c);

/* KV pages (cache.c): zeroed, reference-counted blocks of page_bytes. A page with more than one
 * reference (a prefix cache holds it, or several sequences do) is never written: the write
 * path (ds41_store_*_rec with alloc = 1) replaces it by a private copy first. */
uint8_t *ds41_page_new(size_t bytes);
void ds41_page_ref(uint8_t *pg);
void ds41_page_unref(uint8_t *pg);     /* frees on the last reference; NULL is ignored */
long ds41_page_refs(const uint8_t *pg);
long long ds41_page_live_bytes(void);  /* bytes of all live pages in the process */
/* Puts page pg (one more reference taken) at page index p of the store, releasing what was there. */
int ds41_store_attach_page(ds41_kv_store *s, int p, uint8_t *pg, ds41_err *err);

/* Store of KV-source layer `layer`, or NULL. */
ds41_kv_store *ds41_cache_store(ds41_cache *c, int layer);
ds41_comp_state *ds41_cache_comp(ds41_cache *c, int layer);
/* Records of entry j (allocating pages up to j when `alloc`); NULL if j is not held. */
uint8_t *ds41_store_kv_rec(ds41_kv_store *s, long long j, int alloc, ds41_err *err);
uint8_t *ds41_store_ik_rec(ds41_kv_store *s, long long j, int alloc, ds41_err *err);

static inline uint8_t *ds41_ring_slot(ds41_ring *r, long long pos) {
    return r->rec + (size_t)(pos % r->slots) * r->rec_bytes;
}

/* ---- speculative rollback (spec 5.3; docs/speculative.md) ----
 * Before a verify forward over T <= window positions [P, P+T): ds41_cache_snapshot saves what
 * the forward overwrites (the T ring slots of every SWA and DSpark ring, the compressor state,
 * entry and page counts, Engram history, the published index-K owner) and turns on the
 * compressor log. ds41_cache_rollback(keep) then leaves the cache exactly as `keep` single-
 * token decodes of tokens[0..keep) would have (0 <= keep <= T): ring slots of rejected
 * positions restored, compressor rows rebuilt from the log, entries past (P+keep)/r zeroed and
 * dropped, pages allocated for them freed, history recomputed, ik_owner = ik_owner_after. */
typedef struct ds41_cache_snap {
    long long P;
    int T, cap;
    uint8_t *ring_old;       /* [n_rings][cap][rec_bytes] */
    float *comp_kv, *comp_sc;/* [n_comp][ratio*dim] */
    long long *n_entries;    /* [n_stores] */
    int *n_pages;            /* [n_stores] */
    int32_t hist[16];
    int ik_owner;
} ds41_cache_snap;
int ds41_cache_snap_init(ds41_cache_snap *sn, const ds41_cache *c, int cap, ds41_err *err);
void ds41_cache_snap_free(ds41_cache_snap *sn);
int ds41_cache_snapshot(ds41_cache *c, ds41_cache_snap *sn, int T, ds41_err *err);
/* token_map: the engine's Engram map (NULL without Engram). */
void ds41_cache_rollback(ds41_cache *c, const ds41_cache_snap *sn, int keep, const int32_t *tokens,
                         const int32_t *token_map, int ik_owner_after);
/* 64-bit FNV-1a digest of every live state byte: position, published owner, each store's entry
 * count, page count and live records, every ring, the compressor state and the Engram history. */
uint64_t ds41_cache_digest(const ds41_cache *c);
uint64_t ds41_digest_bytes(uint64_t h, const void *p, size_t n);

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
