/* ds41 serve: the image embedding cache (serve_vcache.h). A doubly linked list in recency
 * order (head: most recent); lookups walk it (a cache holds tens of images, each lookup
 * stands beside a tower run of seconds or an image decode of milliseconds). */
#include "serve_vcache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct ventry {
    uint8_t key[32];
    int dim, rows;
    float *span;
    struct ventry *prev, *next;
} ventry;

struct ds41_vcache {
    pthread_mutex_t mu;
    ventry *head, *tail;
    ds41_vcache_stats st;
};

static long long entry_bytes(int rows, int dim) { return (long long)rows * dim * (long long)sizeof(float); }

ds41_vcache *ds41_vcache_new(long long max_bytes) {
    ds41_vcache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    pthread_mutex_init(&c->mu, NULL);
    c->st.max_bytes = max_bytes < 0 ? 0 : max_bytes;
    return c;
}

static void unlink_entry(ds41_vcache *c, ventry *v) {
    if (v->prev) v->prev->next = v->next;
    else c->head = v->next;
    if (v->next) v->next->prev = v->prev;
    else c->tail = v->prev;
    v->prev = v->next = NULL;
}

static void push_front(ds41_vcache *c, ventry *v) {
    v->prev = NULL;
    v->next = c->head;
    if (c->head) c->head->prev = v;
    c->head = v;
    if (!c->tail) c->tail = v;
}

static void drop(ds41_vcache *c, ventry *v) {
    unlink_entry(c, v);
    c->st.entries--;
    c->st.bytes -= entry_bytes(v->rows, v->dim);
    free(v->span);
    free(v);
}

void ds41_vcache_free(ds41_vcache *c) {
    if (!c) return;
    while (c->head) drop(c, c->head);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static ventry *find(ds41_vcache *c, const uint8_t key[32], int dim) {
    for (ventry *v = c->head; v; v = v->next)
        if (v->dim == dim && !memcmp(v->key, key, 32)) return v;
    return NULL;
}

int ds41_vcache_get(ds41_vcache *c, const uint8_t key[32], int dim, float **span, int *rows) {
    if (!c) return 0;
    pthread_mutex_lock(&c->mu);
    ventry *v = find(c, key, dim);
    float *copy = v ? malloc((size_t)entry_bytes(v->rows, dim)) : NULL;
    if (copy) {
        memcpy(copy, v->span, (size_t)entry_bytes(v->rows, dim));
        *span = copy;
        *rows = v->rows;
        unlink_entry(c, v);
        push_front(c, v);
        c->st.reused++;
    }
    pthread_mutex_unlock(&c->mu);
    return copy != NULL;
}

void ds41_vcache_put(ds41_vcache *c, const uint8_t key[32], int dim, const float *span, int rows) {
    if (!c) return;
    long long b = entry_bytes(rows, dim);
    pthread_mutex_lock(&c->mu);
    c->st.encoded++;
    if (b <= c->st.max_bytes && rows > 0 && !find(c, key, dim)) {
        ventry *v = calloc(1, sizeof *v);
        float *s = v ? malloc((size_t)b) : NULL;
        if (s) {
            while (c->tail && c->st.bytes + b > c->st.max_bytes) {
                drop(c, c->tail);
                c->st.evicted++;
            }
            memcpy(v->key, key, 32);
            memcpy(s, span, (size_t)b);
            v->span = s;
            v->dim = dim;
            v->rows = rows;
            push_front(c, v);
            c->st.entries++;
            c->st.bytes += b;
        } else {
            free(v);   /* out of memory: not kept */
        }
    }
    pthread_mutex_unlock(&c->mu);
}

void ds41_vcache_get_stats(ds41_vcache *c, ds41_vcache_stats *out) {
    memset(out, 0, sizeof *out);
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    *out = c->st;
    pthread_mutex_unlock(&c->mu);
}
