/* ds41 grammar: the memo of context-dependent token sets (grammar_internal.h, gdep_*).
 *
 * Why. A mask from the tables (grammar_tables.c) is a few OR-ed sets plus, for each stack
 * whose top can pop, a walk of its pop nodes' subtrees from the state of the stack below. At
 * 129,280 entries those walks were most of a mask's time: inside a JSON string a position has
 * hundreds of pop nodes (one per token byte that may follow the closing quote), each walk a
 * few random reaches into the trie and, in a new matcher, new states to intern. Profiled on
 * bench_grammar's schema: about 70% of the table path's cycles, up to 400 us for one mask.
 * Yet the tokens one pop node's walk allows depend only on that node and on the elements
 * below (the state below is a function of them), and both recur: each character of a bounded
 * string is its own position with its own pop list, but the lists overlap and the stack below
 * is the same. So the answer is kept per (pop node, below elements), in the tables, shared by
 * every matcher of the grammar (so by the requests with the same schema), and a repeat costs a
 * hash probe and a few bit sets.
 *
 * The finished masks are kept here too, keyed by the state's stacks (what a matcher interns),
 * so that a new matcher of the grammar (a new request with the same schema) copies the mask of
 * a state any earlier one computed instead of computing it again.
 *
 * Exact: the keys hold all the walk reads (a mask is a function of the state's stacks), and a
 * walk that hit a limit is not kept. Bounded: past GDEP_BYTES (the sets) and GMASK_BYTES (the
 * masks) the memo keeps what it has and misses compute as before. Thread-safe: one mutex
 * around lookups (the ORs and copies included) and inserts; the walks run outside it. */
#include "grammar_internal.h"

#include <stdlib.h>
#include <string.h>

enum { GDEP_BYTES = 16 << 20, GMASK_BYTES = 32 << 20 };

typedef struct {
    uint64_t h;
    int32_t node, nb;  /* node -1: an empty slot */
    size_t key;        /* the below elements at keys + key */
    size_t at, n;      /* the allowed token ids at ids + at */
} gdep;

struct ds41_gdep {
    pthread_mutex_t mu;
    gdep *slot;        /* open addressing */
    size_t cap, used;
    int32_t *keys, *ids;
    size_t nkeys, ckeys, nids, cids;
    size_t bytes;
    long long hits, misses;
    /* masks per state: open addressing over entries (mask NULL: empty) */
    struct gmask { uint64_t h; int32_t *st; size_t n; uint32_t *mask; } *ms;
    size_t mcap, mused, mbytes;
    long long mhits;
};

ds41_gdep *ds41_gdep_new(void) {
    ds41_gdep *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->cap = 1024;
    d->slot = malloc(d->cap * sizeof *d->slot);
    if (!d->slot) { free(d); return NULL; }
    for (size_t i = 0; i < d->cap; i++) d->slot[i].node = -1;
    d->mcap = 256;
    d->ms = calloc(d->mcap, sizeof *d->ms);
    if (!d->ms) { free(d->slot); free(d); return NULL; }
    pthread_mutex_init(&d->mu, NULL);
    return d;
}

void ds41_gdep_free(ds41_gdep *d) {
    if (!d) return;
    pthread_mutex_destroy(&d->mu);
    for (size_t i = 0; i < d->mcap; i++) { free(d->ms[i].st); free(d->ms[i].mask); }
    free(d->ms);
    free(d->slot); free(d->keys); free(d->ids);
    free(d);
}

uint64_t ds41_gdep_hash(const int32_t *below, int nb) {
    uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)nb;
    for (int i = 0; i < nb; i++) h = (h ^ (uint32_t)below[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t node_hash(uint64_t hb, int node) {
    uint64_t h = (hb ^ (uint64_t)(uint32_t)node * 0x9e3779b97f4a7c15ull) * 0xff51afd7ed558ccdull;
    return h ^ (h >> 32);
}

/* The slot of the key, or the empty slot where it would go. Under mu. */
static gdep *find(ds41_gdep *d, uint64_t h, int node, const int32_t *below, int nb) {
    for (size_t i = h & (d->cap - 1);; i = (i + 1) & (d->cap - 1)) {
        gdep *e = &d->slot[i];
        if (e->node < 0) return e;
        if (e->h == h && e->node == node && e->nb == nb && (!nb || !memcmp(d->keys + e->key, below, (size_t)nb * sizeof *below)))
            return e;
    }
}

size_t ds41_gdep_or(ds41_gdep *d, const int32_t *nodes, size_t n, const int32_t *below, int nb, uint64_t hb, uint32_t *mk,
                    int32_t *missed) {
    size_t nm = 0;
    pthread_mutex_lock(&d->mu);
    for (size_t k = 0; k < n; k++) {
        const gdep *e = find(d, node_hash(hb, nodes[k]), nodes[k], below, nb);
        if (e->node < 0) { missed[nm++] = nodes[k]; continue; }
        if (!e->n) continue;   /* none allowed (ids may still be NULL) */
        const int32_t *x = d->ids + e->at;
        for (size_t j = 0; j < e->n; j++) mk[x[j] >> 5] |= 1u << (x[j] & 31);
    }
    d->hits += (long long)(n - nm);
    d->misses += (long long)nm;
    pthread_mutex_unlock(&d->mu);
    return nm;
}

/* Doubles the slots. Under mu; -1 out of memory (the memo stays as it was). */
static int rehash(ds41_gdep *d) {
    size_t nc = d->cap * 2;
    gdep *ns = malloc(nc * sizeof *ns);
    if (!ns) return -1;
    for (size_t i = 0; i < nc; i++) ns[i].node = -1;
    for (size_t i = 0; i < d->cap; i++) {
        if (d->slot[i].node < 0) continue;
        size_t j = d->slot[i].h & (nc - 1);
        while (ns[j].node >= 0) j = (j + 1) & (nc - 1);
        ns[j] = d->slot[i];
    }
    free(d->slot);
    d->slot = ns;
    d->cap = nc;
    return 0;
}

void ds41_gdep_put(ds41_gdep *d, int node, const int32_t *below, int nb, uint64_t hb, const int32_t *ids, size_t n) {
    uint64_t h = node_hash(hb, node);
    pthread_mutex_lock(&d->mu);
    /* the slot (counted twice: the table is kept at most half full), the key and the ids */
    size_t add = 2 * sizeof(gdep) + (n + (size_t)nb) * sizeof(int32_t);
    gdep *e = find(d, h, node, below, nb);
    if (e->node >= 0 || d->bytes + add > GDEP_BYTES) goto out;   /* kept by another thread, or full */
    if ((d->used + 1) * 2 > d->cap) {
        if (rehash(d)) goto out;
        e = find(d, h, node, below, nb);
    }
    if (ds41_ggrow32(&d->keys, &d->ckeys, d->nkeys + (size_t)nb) || ds41_ggrow32(&d->ids, &d->cids, d->nids + n)) goto out;
    if (nb) memcpy(d->keys + d->nkeys, below, (size_t)nb * sizeof *below);   /* nothing below: keys may be NULL */
    if (n) memcpy(d->ids + d->nids, ids, n * sizeof *ids);
    *e = (gdep){ .h = h, .node = node, .nb = nb, .key = d->nkeys, .at = d->nids, .n = n };
    d->nkeys += (size_t)nb;
    d->nids += n;
    d->used++;
    d->bytes += add;
out:
    pthread_mutex_unlock(&d->mu);
}

/* The entry of state st[0..n), or the empty one where it would go. Under mu. */
static struct gmask *mfind(ds41_gdep *d, uint64_t h, const int32_t *st, size_t n) {
    for (size_t i = h & (d->mcap - 1);; i = (i + 1) & (d->mcap - 1)) {
        struct gmask *e = &d->ms[i];
        if (!e->mask || (e->h == h && e->n == n && !memcmp(e->st, st, n * sizeof *st))) return e;
    }
}

int ds41_gdep_mask_get(ds41_gdep *d, const int32_t *st, size_t n, uint32_t *mk, int words) {
    uint64_t h = ds41_gdep_hash(st, (int)n);
    pthread_mutex_lock(&d->mu);
    const struct gmask *e = mfind(d, h, st, n);
    if (e->mask) { memcpy(mk, e->mask, (size_t)words * sizeof *mk); d->mhits++; }
    pthread_mutex_unlock(&d->mu);
    return e->mask != NULL;
}

void ds41_gdep_mask_put(ds41_gdep *d, const int32_t *st, size_t n, const uint32_t *mk, int words) {
    uint64_t h = ds41_gdep_hash(st, (int)n);
    size_t add = (size_t)words * sizeof *mk + n * sizeof *st + 2 * sizeof(struct gmask);
    pthread_mutex_lock(&d->mu);
    struct gmask *e = mfind(d, h, st, n);
    if (e->mask || d->mbytes + add > GMASK_BYTES) goto out;
    if ((d->mused + 1) * 2 > d->mcap) {   /* double the entries, then find the place again */
        size_t nc = d->mcap * 2;
        struct gmask *nm = calloc(nc, sizeof *nm);
        if (!nm) goto out;
        for (size_t i = 0; i < d->mcap; i++) {
            if (!d->ms[i].mask) continue;
            size_t j = d->ms[i].h & (nc - 1);
            while (nm[j].mask) j = (j + 1) & (nc - 1);
            nm[j] = d->ms[i];
        }
        free(d->ms);
        d->ms = nm;
        d->mcap = nc;
        e = mfind(d, h, st, n);
    }
    int32_t *k = malloc(n * sizeof *k + 1);
    uint32_t *x = malloc((size_t)words * sizeof *x);
    if (!k || !x) { free(k); free(x); goto out; }
    memcpy(k, st, n * sizeof *st);
    memcpy(x, mk, (size_t)words * sizeof *x);
    *e = (struct gmask){ .h = h, .st = k, .n = n, .mask = x };
    d->mused++;
    d->mbytes += add;
out:
    pthread_mutex_unlock(&d->mu);
}

void ds41_gdep_stats(ds41_gdep *d, size_t *bytes, long long *hits, long long *misses, long long *mask_hits) {
    pthread_mutex_lock(&d->mu);
    if (mask_hits) *mask_hits = d->mhits;
    if (bytes) *bytes = d->bytes + d->mbytes;
    if (hits) *hits = d->hits;
    if (misses) *misses = d->misses;
    pthread_mutex_unlock(&d->mu);
}
