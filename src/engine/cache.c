/* ds41 per-sequence state: see cache.h. */
#include "cache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"

int ds41_cache_init(ds41_cache *c, const ds41_config *cfg, long long max_pos, ds41_err *err) {
    memset(c, 0, sizeof *c);
    c->cfg = cfg;
    c->max_pos = max_pos;
    c->ik_owner = -1;
    if (cfg->head_dim % 32 || cfg->index_head_dim % 32 || cfg->window < 1)
        return ds41_errf(err, "config: head_dim %d and index_head_dim %d must be multiples of 32 and the window (%d) positive",
                         cfg->head_dim, cfg->index_head_dim, cfg->window);
    c->n_stores = cfg->n_kv_sources;
    c->stores = calloc((size_t)(c->n_stores ? c->n_stores : 1), sizeof *c->stores);
    int n_comp = 0;
    for (int i = 0; i < cfg->n_kv_sources; i++)
        if (cfg->compress_ratios[cfg->kv_sources[i]] > 1) n_comp++;
    c->comp = calloc((size_t)(n_comp ? n_comp : 1), sizeof *c->comp);
    c->n_rings = cfg->n_layers + cfg->n_mtp;
    c->rings = calloc((size_t)c->n_rings, sizeof *c->rings);
    if (!c->stores || !c->comp || !c->rings) goto oom;
    for (int i = 0; i < cfg->n_kv_sources; i++) {
        ds41_kv_store *s = &c->stores[i];
        s->layer = cfg->kv_sources[i];
        s->ratio = cfg->compress_ratios[s->layer];
        if (s->ratio < 1 || s->ratio > DS41_MAX_RATIO) {
            ds41_errf(err, "config: KV source layer %d has compress ratio %d (1..%d supported)", s->layer, s->ratio,
                      DS41_MAX_RATIO);
            ds41_cache_free(c);
            return -1;
        }
        s->per_page = DS41_PAGE_TOKENS / s->ratio;
        if (s->per_page < 1) s->per_page = 1;
        s->kv_bytes = ds41_kv_rec_bytes(cfg);
        s->ik_bytes = ds41_ik_rec_bytes(cfg);
        s->page_bytes = (size_t)s->per_page * (size_t)(s->kv_bytes + s->ik_bytes);
        if (s->ratio > 1) {
            ds41_comp_state *cs = &c->comp[c->n_comp++];
            cs->layer = s->layer;
            cs->ratio = s->ratio;
            cs->dim = cfg->head_dim;
            cs->kv = calloc((size_t)s->ratio * cfg->head_dim, sizeof(float));
            cs->sc = malloc((size_t)s->ratio * cfg->head_dim * sizeof(float));
            if (!cs->kv || !cs->sc) goto oom;
        }
    }
    for (int l = 0; l < c->n_rings; l++) {
        ds41_ring *r = &c->rings[l];
        r->slots = cfg->window;
        r->rec_bytes = ds41_swa_rec_bytes(cfg);
        r->rec = calloc((size_t)r->slots, (size_t)r->rec_bytes);
        if (!r->rec) goto oom;
    }
    ds41_cache_reset(c);
    return 0;
oom:
    ds41_cache_free(c);
    return ds41_errf(err, "out of memory allocating the sequence state");
}

void ds41_cache_reset(ds41_cache *c) {
    c->pos = 0;
    c->ik_owner = -1;
    for (int i = 0; i < c->n_stores; i++) c->stores[i].n_entries = 0;
    for (int i = 0; i < c->n_comp; i++) {
        ds41_comp_state *cs = &c->comp[i];
        size_t n = (size_t)cs->ratio * cs->dim;
        memset(cs->kv, 0, n * sizeof(float));
        for (size_t k = 0; k < n; k++) cs->sc[k] = -INFINITY;
    }
    for (int l = 0; l < c->n_rings; l++) memset(c->rings[l].rec, 0, (size_t)c->rings[l].slots * c->rings[l].rec_bytes);
    for (int i = 0; i < 16; i++) c->hist[i] = 0;
}

void ds41_cache_free(ds41_cache *c) {
    if (c->stores)
        for (int i = 0; i < c->n_stores; i++) {
            for (int p = 0; p < c->stores[i].n_pages; p++) free(c->stores[i].pages[p]);
            free(c->stores[i].pages);
        }
    if (c->comp)
        for (int i = 0; i < c->n_comp; i++) { free(c->comp[i].kv); free(c->comp[i].sc); }
    if (c->rings)
        for (int l = 0; l < c->n_rings; l++) free(c->rings[l].rec);
    free(c->stores);
    free(c->comp);
    free(c->rings);
    memset(c, 0, sizeof *c);
}

ds41_kv_store *ds41_cache_store(ds41_cache *c, int layer) {
    for (int i = 0; i < c->n_stores; i++) if (c->stores[i].layer == layer) return &c->stores[i];
    return NULL;
}

ds41_comp_state *ds41_cache_comp(ds41_cache *c, int layer) {
    for (int i = 0; i < c->n_comp; i++) if (c->comp[i].layer == layer) return &c->comp[i];
    return NULL;
}

static uint8_t *store_page(ds41_kv_store *s, long long j, int alloc, ds41_err *err) {
    if (j < 0) return NULL;
    long long p = j / s->per_page;
    if (p >= s->n_pages) {
        if (!alloc) return NULL;
        if (p >= 1 << 30) { ds41_errf(err, "KV store of layer %d: entry %lld too far", s->layer, j); return NULL; }
        if (p >= s->cap_pages) {
            int nc = s->cap_pages ? s->cap_pages : 4;
            while (nc <= p) nc *= 2;
            uint8_t **np = realloc(s->pages, (size_t)nc * sizeof *np);
            if (!np) { ds41_errf(err, "out of memory growing the page table of layer %d", s->layer); return NULL; }
            s->pages = np;
            s->cap_pages = nc;
        }
        while (s->n_pages <= p) {
            uint8_t *pg = calloc(1, s->page_bytes);
            if (!pg) { ds41_errf(err, "out of memory allocating a KV page of layer %d", s->layer); return NULL; }
            s->pages[s->n_pages++] = pg;
        }
    }
    return s->pages[p];
}

uint8_t *ds41_store_kv_rec(ds41_kv_store *s, long long j, int alloc, ds41_err *err) {
    uint8_t *pg = store_page(s, j, alloc, err);
    return pg ? pg + (size_t)(j % s->per_page) * s->kv_bytes : NULL;
}

uint8_t *ds41_store_ik_rec(ds41_kv_store *s, long long j, int alloc, ds41_err *err) {
    uint8_t *pg = store_page(s, j, alloc, err);
    return pg ? pg + (size_t)s->per_page * s->kv_bytes + (size_t)(j % s->per_page) * s->ik_bytes : NULL;
}

void ds41_store_unpack_kv(const ds41_config *cfg, ds41_kv_store *s, long long n, float *out) {
    for (long long j = 0; j < n; j += s->per_page) {
        long long m = n - j < s->per_page ? n - j : s->per_page;
        ds41_kv_rec_unpack(cfg, ds41_store_kv_rec(s, j, 0, NULL), (int)m, out + (size_t)j * cfg->head_dim);
    }
}

void ds41_store_unpack_ik(const ds41_config *cfg, ds41_kv_store *s, long long n, float *out) {
    for (long long j = 0; j < n; j += s->per_page) {
        long long m = n - j < s->per_page ? n - j : s->per_page;
        ds41_ik_rec_unpack(cfg, ds41_store_ik_rec(s, j, 0, NULL), (int)m, out + (size_t)j * cfg->index_head_dim);
    }
}

void ds41_cache_bytes(const ds41_cache *c, ds41_state_bytes *b) {
    memset(b, 0, sizeof *b);
    for (int i = 0; i < c->n_stores; i++) {
        const ds41_kv_store *s = &c->stores[i];
        b->global_kv_main += s->n_entries * s->kv_bytes;
        b->global_kv_index += s->n_entries * s->ik_bytes;
        b->global_kv_pages += (long long)s->n_pages * (long long)s->page_bytes;
    }
    b->global_kv_written = b->global_kv_main + b->global_kv_index;
    for (int l = 0; l < c->n_rings; l++) {
        long long rb = (long long)c->rings[l].slots * c->rings[l].rec_bytes;
        if (l < c->cfg->n_layers) b->swa_rings += rb;
        else b->dspark_rings += rb;
    }
    for (int i = 0; i < c->n_comp; i++) b->compressor += 2LL * c->comp[i].ratio * c->comp[i].dim * (long long)sizeof(float);
    b->engram_history = c->cfg->engram_max_ngram > 1 ? (long long)(c->cfg->engram_max_ngram - 1) * 4 : 0;
    b->total_held = b->global_kv_pages + b->swa_rings + b->dspark_rings + b->compressor + b->engram_history;
    b->global_kv_per_token = c->pos > 0 ? (double)b->global_kv_written / (double)c->pos : 0.0;
}
