/* ds41 serve: connection limits (serve_conn.h). The per-address counts live in an open
 * addressing table; a slot whose count drops to 0 keeps its key (so probe chains stay intact)
 * and is reused by the next new address that probes past it. */
#include "serve_conn.h"

#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { SLOTS = 8192 };

typedef struct slot { uint8_t key[17]; int used, count; } slot;

struct ds41_conn_limit {
    pthread_mutex_t mu;
    int max_total, max_per_addr, total;
    slot *t;
};

ds41_conn_limit *ds41_conn_limit_new(int max_total, int max_per_addr) {
    ds41_conn_limit *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    l->t = calloc(SLOTS, sizeof *l->t);
    if (!l->t) { free(l); return NULL; }
    l->max_total = max_total;
    l->max_per_addr = max_per_addr;
    pthread_mutex_init(&l->mu, NULL);
    return l;
}

void ds41_conn_limit_free(ds41_conn_limit *l) {
    if (!l) return;
    pthread_mutex_destroy(&l->mu);
    free(l->t);
    free(l);
}

/* The address without its port: family byte + 16 address bytes (IPv4 zero-padded). */
static int addr_key(const struct sockaddr *a, uint8_t k[17]) {
    memset(k, 0, 17);
    if (!a) return -1;
    if (a->sa_family == AF_INET) {
        k[0] = 4;
        memcpy(k + 1, &((const struct sockaddr_in *)a)->sin_addr, 4);
        return 0;
    }
    if (a->sa_family == AF_INET6) {
        k[0] = 6;
        memcpy(k + 1, &((const struct sockaddr_in6 *)a)->sin6_addr, 16);
        return 0;
    }
    return -1;
}

static unsigned hash(const uint8_t k[17]) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < 17; i++) h = (h ^ k[i]) * 16777619u;
    return h % SLOTS;
}

/* The slot of k (create: the first free or zero-count slot on its chain when absent). */
static slot *find(ds41_conn_limit *l, const uint8_t k[17], int create) {
    slot *reuse = NULL;
    unsigned i = hash(k);
    for (int n = 0; n < SLOTS; n++, i = (i + 1) % SLOTS) {
        slot *s = &l->t[i];
        if (!s->used) { if (!reuse) reuse = s; break; }
        if (!memcmp(s->key, k, 17)) return s;
        if (!reuse && s->count == 0) reuse = s;
    }
    if (!create || !reuse) return NULL;
    memcpy(reuse->key, k, 17);
    reuse->used = 1;
    reuse->count = 0;
    return reuse;
}

int ds41_conn_limit_allow(ds41_conn_limit *l, const struct sockaddr *a, socklen_t len) {
    (void)len;
    uint8_t k[17];
    int ok;
    pthread_mutex_lock(&l->mu);
    ok = l->total < l->max_total;
    if (ok && l->max_per_addr > 0 && addr_key(a, k) == 0) {
        slot *s = find(l, k, 0);
        ok = !s || s->count < l->max_per_addr;
    }
    pthread_mutex_unlock(&l->mu);
    return ok;
}

void ds41_conn_limit_count(ds41_conn_limit *l, const struct sockaddr *a, int delta) {
    uint8_t k[17];
    pthread_mutex_lock(&l->mu);
    l->total += delta;
    if (l->max_per_addr > 0 && addr_key(a, k) == 0) {
        slot *s = find(l, k, delta > 0);
        /* a full table (8192 addresses with open connections) leaves the newcomer uncounted */
        if (s) { s->count += delta; if (s->count < 0) s->count = 0; }
    }
    pthread_mutex_unlock(&l->mu);
}
