/* ds41 serve: the grammar table cache (serve_gcache.h). */
#include "serve_gcache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct ds41_gentry {
    ds41_gcache *c;
    char *text;
    size_t len;
    ds41_grammar *g;
    ds41_gtables *t;
    size_t bytes;
    int refs, ready;
    unsigned long long used;     /* the lookup clock at its last use */
};

struct ds41_gcache {
    const ds41_gvocab *v;
    size_t max_bytes;
    pthread_mutex_t mu;
    pthread_cond_t built;
    ds41_gentry *e[DS41_GCACHE_ENTRIES];
    int n;
    unsigned long long clock;
    ds41_gcache_stats st;
};

ds41_gcache *ds41_gcache_new(const ds41_gvocab *v, size_t max_bytes) {
    ds41_gcache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->v = v;
    c->max_bytes = max_bytes;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->built, NULL);
    return c;
}

static void entry_free(ds41_gentry *e) {
    ds41_gtables_free(e->t);
    ds41_grammar_free(e->g);
    free(e->text);
    free(e);
}

void ds41_gcache_free(ds41_gcache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) entry_free(c->e[i]);
    pthread_cond_destroy(&c->built);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* Drops unheld entries, least recently used first, while the cache holds more than max_bytes
 * or has no free slot (need_slot). Under mu. */
static void evict(ds41_gcache *c, int need_slot) {
    for (;;) {
        size_t bytes = 0;
        for (int i = 0; i < c->n; i++) bytes += c->e[i]->bytes;
        if (bytes <= c->max_bytes && !(need_slot && c->n == DS41_GCACHE_ENTRIES)) return;
        int victim = -1;
        for (int i = 0; i < c->n; i++)
            if (c->e[i]->refs == 0 && (victim < 0 || c->e[i]->used < c->e[victim]->used)) victim = i;
        if (victim < 0) return;
        c->st.bytes -= (long long)c->e[victim]->bytes;
        c->st.entries--;
        entry_free(c->e[victim]);
        c->e[victim] = c->e[--c->n];
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

ds41_gentry *ds41_gcache_get(ds41_gcache *c, const char *text, size_t len, ds41_grammar **g) {
    pthread_mutex_lock(&c->mu);
    c->clock++;
    for (int i = 0; i < c->n; i++) {
        ds41_gentry *e = c->e[i];
        if (e->len != len || memcmp(e->text, text, len)) continue;
        e->refs++;
        e->used = c->clock;
        c->st.hits++;
        while (!e->ready) pthread_cond_wait(&c->built, &c->mu);
        pthread_mutex_unlock(&c->mu);
        ds41_grammar_free(*g);
        *g = NULL;
        return e;
    }
    ds41_gentry *e = calloc(1, sizeof *e);
    if (e) e->text = malloc(len + 1);
    if (!e || !e->text) {
        pthread_mutex_unlock(&c->mu);
        free(e);
        return NULL;
    }
    memcpy(e->text, text, len);
    e->text[len] = 0;
    e->len = len;
    e->c = c;
    e->g = *g;
    *g = NULL;
    e->refs = 1;
    e->used = c->clock;
    evict(c, 1);
    int listed = c->n < DS41_GCACHE_ENTRIES;   /* every slot held by a request: built, not kept */
    if (listed) c->e[c->n++] = e;
    pthread_mutex_unlock(&c->mu);
    /* the build, outside the lock: other grammars' lookups go on; this one's wait for it */
    double t0 = now_s();
    char err[160];
    e->t = ds41_gtables_new(e->g, c->v, err, sizeof err);
    double dt = now_s() - t0;
    if (e->t) ds41_gtables_stats(e->t, &e->bytes, NULL, NULL, NULL);
    pthread_mutex_lock(&c->mu);
    e->ready = 1;
    c->st.builds++;
    c->st.build_s += dt;
    if (listed) {
        c->st.entries++;
        c->st.bytes += (long long)e->bytes;
        evict(c, 0);
    } else {
        e->c = NULL;   /* freed at its release */
    }
    pthread_cond_broadcast(&c->built);
    pthread_mutex_unlock(&c->mu);
    return e;
}

const ds41_grammar *ds41_gentry_grammar(const ds41_gentry *e) { return e->g; }
const ds41_gtables *ds41_gentry_tables(const ds41_gentry *e) { return e->t; }

void ds41_gentry_release(ds41_gentry *e) {
    if (!e) return;
    ds41_gcache *c = e->c;
    if (!c) {
        entry_free(e);
        return;
    }
    pthread_mutex_lock(&c->mu);
    e->refs--;
    /* the tables' memo grew with the request's masks (grammar_memo.c): count it too */
    if (e->t && e->ready) {
        size_t tb, mb;
        ds41_gtables_stats(e->t, &tb, NULL, NULL, NULL);
        ds41_gtables_memo_stats(e->t, &mb, NULL, NULL, NULL);
        c->st.bytes += (long long)(tb + mb) - (long long)e->bytes;
        e->bytes = tb + mb;
    }
    evict(c, 0);
    pthread_mutex_unlock(&c->mu);
}

void ds41_gcache_get_stats(ds41_gcache *c, ds41_gcache_stats *s) {
    pthread_mutex_lock(&c->mu);
    *s = c->st;
    pthread_mutex_unlock(&c->mu);
}
