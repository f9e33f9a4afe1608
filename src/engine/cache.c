/* ds41 per-sequence state: see cache.h. */
#include "cache.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"

/* entries per page of a KV source of compress ratio r */
static int store_per_page(int ratio) { return DS41_PAGE_TOKENS / ratio > 1 ? DS41_PAGE_TOKENS / ratio : 1; }

size_t ds41_cache_page_bytes(const ds41_config *cfg, int i) {
    if (i < 0 || i >= cfg->n_kv_sources) return 0;
    int r = cfg->compress_ratios[cfg->kv_sources[i]];
    if (r < 1 || r > DS41_MAX_RATIO) return 0;
    return (size_t)store_per_page(r) * (size_t)(ds41_kv_rec_bytes(cfg) + ds41_ik_rec_bytes(cfg));
}

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
        s->per_page = store_per_page(s->ratio);
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
    for (int i = 0; i < c->n_stores; i++) {
        /* keep private pages for reuse; shared ones (a prefix cache holds them) are released */
        ds41_kv_store *st = &c->stores[i];
        st->n_entries = 0;
        for (int p = 0; p < st->n_pages; p++)
            if (st->pages[p] && ds41_page_refs(st->pages[p]) > 1) { ds41_page_unref(st->pages[p]); st->pages[p] = NULL; }
    }
    for (int i = 0; i < c->n_comp; i++) {
        ds41_comp_state *cs = &c->comp[i];
        size_t n = (size_t)cs->ratio * cs->dim;
        memset(cs->kv, 0, n * sizeof(float));
        for (size_t k = 0; k < n; k++) cs->sc[k] = -INFINITY;
    }
    for (int l = 0; l < c->n_rings; l++) memset(c->rings[l].rec, 0, (size_t)c->rings[l].slots * c->rings[l].rec_bytes);
    for (int i = 0; i < 16; i++) c->hist[i] = 0;
    c->spec.n = 0;
    c->dctx.n = 0;
}

void ds41_cache_free(ds41_cache *c) {
    if (c->stores)
        for (int i = 0; i < c->n_stores; i++) {
            for (int p = 0; p < c->stores[i].n_pages; p++) ds41_page_unref(c->stores[i].pages[p]);
            free(c->stores[i].pages);
        }
    if (c->comp)
        for (int i = 0; i < c->n_comp; i++) { free(c->comp[i].kv); free(c->comp[i].sc); }
    if (c->rings)
        for (int l = 0; l < c->n_rings; l++) free(c->rings[l].rec);
    if (c->spec.kv)
        for (int i = 0; i < c->n_comp; i++) { free(c->spec.kv[i]); free(c->spec.sc[i]); }
    free(c->spec.kv);
    free(c->spec.sc);
    free(c->dctx.rows);
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

/* ---- pages: a header with a reference count in front of the records, so that a prefix cache
 * can hold full pages and hand them to several sequences (src/store/prefix.c). A page with more
 * than one reference is read-only: a writer replaces it by a private copy first. */
typedef struct page_hdr {
    _Atomic long ref;
    size_t bytes;
    char pad[64 - sizeof(long) - sizeof(size_t)];   /* records stay 64-byte aligned */
} page_hdr;

static _Atomic long long g_page_bytes;

static page_hdr *hdr_of(const uint8_t *pg) { return (page_hdr *)(void *)(pg - sizeof(page_hdr)); }

uint8_t *ds41_page_new(size_t bytes) {
    page_hdr *h = NULL;
    if (posix_memalign((void **)&h, 64, sizeof(page_hdr) + bytes)) return NULL;
    memset(h, 0, sizeof(page_hdr) + bytes);
    atomic_store(&h->ref, 1);
    h->bytes = bytes;
    atomic_fetch_add(&g_page_bytes, (long long)bytes);
    return (uint8_t *)(h + 1);
}

void ds41_page_ref(uint8_t *pg) {
    if (pg) atomic_fetch_add(&hdr_of(pg)->ref, 1);
}

void ds41_page_unref(uint8_t *pg) {
    if (!pg) return;
    page_hdr *h = hdr_of(pg);
    if (atomic_fetch_sub(&h->ref, 1) == 1) {
        atomic_fetch_sub(&g_page_bytes, (long long)h->bytes);
        free(h);
    }
}

long ds41_page_refs(const uint8_t *pg) { return pg ? atomic_load(&hdr_of(pg)->ref) : 0; }

long long ds41_page_live_bytes(void) { return atomic_load(&g_page_bytes); }

static int grow_table(ds41_kv_store *s, long long p, ds41_err *err) {
    if (p >= 1 << 30) return ds41_errf(err, "KV store of layer %d: page %lld too far", s->layer, p);
    if (p >= s->cap_pages) {
        int nc = s->cap_pages ? s->cap_pages : 4;
        while (nc <= p) nc *= 2;
        uint8_t **np = realloc(s->pages, (size_t)nc * sizeof *np);
        if (!np) return ds41_errf(err, "out of memory growing the page table of layer %d", s->layer);
        s->pages = np;
        s->cap_pages = nc;
    }
    while (s->n_pages <= p) s->pages[s->n_pages++] = NULL;
    return 0;
}

/* alloc = 1 is the write path: missing pages are allocated and a shared page is replaced by a
 * private copy (copy on write); alloc = 0 only reads. */
static uint8_t *store_page(ds41_kv_store *s, long long j, int alloc, ds41_err *err) {
    if (j < 0) return NULL;
    long long p = j / s->per_page;
    if (!alloc) return p < s->n_pages ? s->pages[p] : NULL;
    if (p >= s->n_pages && grow_table(s, p, err)) return NULL;
    if (s->pages[p] && ds41_page_refs(s->pages[p]) == 1) return s->pages[p];
    uint8_t *pg = ds41_page_new(s->page_bytes);
    if (!pg) { ds41_errf(err, "out of memory allocating a KV page of layer %d", s->layer); return NULL; }
    if (s->pages[p]) { memcpy(pg, s->pages[p], s->page_bytes); ds41_page_unref(s->pages[p]); }
    s->pages[p] = pg;
    return pg;
}

int ds41_store_attach_page(ds41_kv_store *s, int p, uint8_t *pg, ds41_err *err) {
    if (p < 0) return ds41_errf(err, "KV store of layer %d: page %d", s->layer, p);
    if (p >= s->n_pages && grow_table(s, p, err)) return -1;
    ds41_page_ref(pg);
    ds41_page_unref(s->pages[p]);
    s->pages[p] = pg;
    return 0;
}

uint8_t *ds41_store_kv_rec(ds41_kv_store *s, long long j, int alloc, ds41_err *err) {
    uint8_t *pg = store_page(s, j, alloc, err);
    return pg ? pg + (size_t)(j % s->per_page) * s->kv_bytes : NULL;
}

uint8_t *ds41_store_ik_rec(ds41_kv_store *s, long long j, int alloc, ds41_err *err) {
    uint8_t *pg = store_page(s, j, alloc, err);
    return pg ? pg + (size_t)s->per_page * s->kv_bytes + (size_t)(j % s->per_page) * s->ik_bytes : NULL;
}

void ds41_cache_bytes(const ds41_cache *c, ds41_state_bytes *b) {
    memset(b, 0, sizeof *b);
    for (int i = 0; i < c->n_stores; i++) {
        const ds41_kv_store *s = &c->stores[i];
        b->global_kv_main += s->n_entries * s->kv_bytes;
        b->global_kv_index += s->n_entries * s->ik_bytes;
        for (int p = 0; p < s->n_pages; p++)
            if (s->pages[p]) b->global_kv_pages += (long long)s->page_bytes;
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

/* ====================================================================== speculative rollback */

int ds41_cache_snap_init(ds41_cache_snap *sn, const ds41_cache *c, int cap, ds41_err *err) {
    memset(sn, 0, sizeof *sn);
    size_t rb = c->n_rings ? (size_t)c->rings[0].rec_bytes : 0, cd = 0;
    for (int i = 0; i < c->n_comp; i++) cd += (size_t)c->comp[i].ratio * c->comp[i].dim;
    sn->cap = cap;
    sn->ring_old = malloc((size_t)c->n_rings * cap * rb + 1);
    sn->comp_kv = malloc((cd + 1) * sizeof(float));
    sn->comp_sc = malloc((cd + 1) * sizeof(float));
    sn->n_entries = calloc((size_t)c->n_stores + 1, sizeof(long long));
    sn->n_pages = calloc((size_t)c->n_stores + 1, sizeof(int));
    if (!sn->ring_old || !sn->comp_kv || !sn->comp_sc || !sn->n_entries || !sn->n_pages) {
        ds41_cache_snap_free(sn);
        return ds41_errf(err, "out of memory for the speculative snapshot");
    }
    return 0;
}

void ds41_cache_snap_free(ds41_cache_snap *sn) {
    free(sn->ring_old); free(sn->comp_kv); free(sn->comp_sc); free(sn->n_entries); free(sn->n_pages);
    memset(sn, 0, sizeof *sn);
}

int ds41_cache_snapshot(ds41_cache *c, ds41_cache_snap *sn, int T, ds41_err *err) {
    const ds41_config *cfg = c->cfg;
    if (T < 1 || T > sn->cap || T > cfg->window)
        return ds41_errf(err, "speculative snapshot: %d positions (at most %d and the window %d)", T, sn->cap, cfg->window);
    /* the compressor log */
    if (c->spec.cap < T) {
        if (!c->spec.kv) {
            c->spec.kv = calloc((size_t)c->n_comp + 1, sizeof(float *));
            c->spec.sc = calloc((size_t)c->n_comp + 1, sizeof(float *));
            if (!c->spec.kv || !c->spec.sc) return ds41_errf(err, "out of memory for the compressor log");
        }
        for (int i = 0; i < c->n_comp; i++) {
            float *a = realloc(c->spec.kv[i], (size_t)T * c->comp[i].dim * sizeof(float));
            if (a) c->spec.kv[i] = a;
            float *b = realloc(c->spec.sc[i], (size_t)T * c->comp[i].dim * sizeof(float));
            if (b) c->spec.sc[i] = b;
            if (!a || !b) return ds41_errf(err, "out of memory for the compressor log");
        }
        c->spec.cap = T;
    }
    c->spec.n = 0;
    sn->P = c->pos;
    sn->T = T;
    for (int l = 0; l < c->n_rings; l++) {
        ds41_ring *r = &c->rings[l];
        for (int t = 0; t < T; t++)
            memcpy(sn->ring_old + ((size_t)l * sn->cap + t) * r->rec_bytes, ds41_ring_slot(r, sn->P + t), (size_t)r->rec_bytes);
    }
    size_t off = 0;
    for (int i = 0; i < c->n_comp; i++) {
        size_t n = (size_t)c->comp[i].ratio * c->comp[i].dim;
        memcpy(sn->comp_kv + off, c->comp[i].kv, n * sizeof(float));
        memcpy(sn->comp_sc + off, c->comp[i].sc, n * sizeof(float));
        off += n;
    }
    for (int i = 0; i < c->n_stores; i++) {
        sn->n_entries[i] = c->stores[i].n_entries;
        sn->n_pages[i] = c->stores[i].n_pages;
    }
    memcpy(sn->hist, c->hist, sizeof sn->hist);
    sn->ik_owner = c->ik_owner;
    return 0;
}

void ds41_cache_rollback(ds41_cache *c, const ds41_cache_snap *sn, int keep, const int32_t *tokens,
                         const int32_t *token_map, int ik_owner_after) {
    long long P = sn->P, a = P + keep;   /* positions < a are kept */
    int T = sn->T;
    if (keep < 0) keep = 0;
    if (keep > T) keep = T;
    /* rings: slots of rejected positions back to what they held */
    for (int l = 0; l < c->n_rings; l++) {
        ds41_ring *r = &c->rings[l];
        for (int t = keep; t < T; t++)
            memcpy(ds41_ring_slot(r, P + t), sn->ring_old + ((size_t)l * sn->cap + t) * r->rec_bytes, (size_t)r->rec_bytes);
    }
    /* compressor state: the snapshot, then row p mod r of every kept position (what decode writes) */
    size_t off = 0;
    for (int i = 0; i < c->n_comp; i++) {
        ds41_comp_state *cs = &c->comp[i];
        size_t n = (size_t)cs->ratio * cs->dim;
        memcpy(cs->kv, sn->comp_kv + off, n * sizeof(float));
        memcpy(cs->sc, sn->comp_sc + off, n * sizeof(float));
        off += n;
        for (int t = 0; t < keep && t < c->spec.n; t++) {
            long long p = P + t;
            memcpy(cs->kv + (size_t)(p % cs->ratio) * cs->dim, c->spec.kv[i] + (size_t)t * cs->dim, (size_t)cs->dim * sizeof(float));
            memcpy(cs->sc + (size_t)(p % cs->ratio) * cs->dim, c->spec.sc[i] + (size_t)t * cs->dim, (size_t)cs->dim * sizeof(float));
        }
    }
    /* global KV / index K: entries of groups not complete at a - 1 are dropped (zeroed, so the
     * bytes equal a fresh session's), and pages allocated only for them are freed */
    for (int i = 0; i < c->n_stores; i++) {
        ds41_kv_store *st = &c->stores[i];
        long long ne = a / st->ratio;
        for (long long j = ne; j < st->n_entries; j++) {
            uint8_t *kr = ds41_store_kv_rec(st, j, 1, NULL), *ir = ds41_store_ik_rec(st, j, 1, NULL);
            if (kr) memset(kr, 0, (size_t)st->kv_bytes);
            if (ir) memset(ir, 0, (size_t)st->ik_bytes);
        }
        st->n_entries = ne;
        int need = (int)((ne + st->per_page - 1) / st->per_page);
        if (need < sn->n_pages[i]) need = sn->n_pages[i];
        while (st->n_pages > need) ds41_page_unref(st->pages[--st->n_pages]);
    }
    /* Engram history: compressed ids of positions a-1, a-2, ... */
    if (token_map) {
        for (int k = 0; k < 16; k++) {
            long long qp = a - 1 - k;
            c->hist[k] = qp < 0 ? 0 : qp >= P ? token_map[tokens[qp - P]] : sn->hist[P - 1 - qp];
        }
    }
    c->ik_owner = ik_owner_after;
    c->pos = a;
    c->spec.n = 0;
    if (c->dctx.n > 0 && c->dctx.pos0 + c->dctx.n > a) {
        long long n = a - c->dctx.pos0;
        c->dctx.n = n > 0 ? (int)n : 0;
    }
}

uint64_t ds41_digest_bytes(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 0x100000001b3ULL; }
    return h;
}

uint64_t ds41_cache_digest(const ds41_cache *c) {
    uint64_t h = 0xcbf29ce484222325ULL;
    h = ds41_digest_bytes(h, &c->pos, sizeof c->pos);
    h = ds41_digest_bytes(h, &c->ik_owner, sizeof c->ik_owner);
    for (int i = 0; i < c->n_stores; i++) {
        ds41_kv_store *st = &c->stores[i];
        h = ds41_digest_bytes(h, &st->n_entries, sizeof st->n_entries);
        h = ds41_digest_bytes(h, &st->n_pages, sizeof st->n_pages);
        for (long long j = 0; j < st->n_entries; j++) {
            h = ds41_digest_bytes(h, ds41_store_kv_rec(st, j, 0, NULL), (size_t)st->kv_bytes);
            h = ds41_digest_bytes(h, ds41_store_ik_rec(st, j, 0, NULL), (size_t)st->ik_bytes);
        }
    }
    for (int l = 0; l < c->n_rings; l++)
        h = ds41_digest_bytes(h, c->rings[l].rec, (size_t)c->rings[l].slots * c->rings[l].rec_bytes);
    for (int i = 0; i < c->n_comp; i++) {
        h = ds41_digest_bytes(h, c->comp[i].kv, (size_t)c->comp[i].ratio * c->comp[i].dim * sizeof(float));
        h = ds41_digest_bytes(h, c->comp[i].sc, (size_t)c->comp[i].ratio * c->comp[i].dim * sizeof(float));
    }
    int nh = c->cfg->engram_max_ngram > 1 ? c->cfg->engram_max_ngram - 1 : 0;
    if (c->cfg->n_engram_layers > 0) h = ds41_digest_bytes(h, c->hist, (size_t)(nh < 16 ? nh : 16) * sizeof(int32_t));
    return h;
}
