/* Routing counts (ds41.h: ds41_engine_route_count_start; ds41 bench --routing-counts): a MoE
 * dispatch wrapped around the engine's own (the local one, or the MPI exchange) that counts,
 * per layer and expert, the (token, choice) pairs the router sends there and then hands the
 * rows on unchanged, so results do not change. The counts are the load a balanced
 * --expert-map is built from (src/dist/dist_place.c, ds41_placement_balance). */
#include <stdlib.h>
#include <string.h>

#include "ds41.h"
#include "forward.h"
#include "moe.h"

typedef struct ds41_route_count {
    ds41_moe_dispatch d;
    const ds41_moe_dispatch *inner;   /* the engine's dispatch before counting (never NULL) */
    const ds41_weights *w;
    int n_layers, n_experts;
    unsigned long long *n;            /* [n_layers][n_experts] */
} ds41_route_count;

static void rc_begin(void *self, const ds41_ctx *ctx, const ds41_moe_rows *r) {
    ds41_route_count *rc = self;
    long l = r->lw - rc->w->layers;
    if (l >= 0 && l < rc->n_layers) {
        unsigned long long *row = rc->n + (size_t)l * rc->n_experts;
        /* relaxed atomics: a forward on another thread of the same engine (none today) would
         * still add up */
        for (size_t i = 0; i < (size_t)r->T * r->k; i++)
            if (r->sel[i] >= 0 && r->sel[i] < rc->n_experts) __atomic_fetch_add(&row[r->sel[i]], 1, __ATOMIC_RELAXED);
    }
    rc->inner->begin(rc->inner->self, ctx, r);
}

static void rc_end(void *self, const ds41_ctx *ctx, const ds41_moe_rows *r, float *acc) {
    ds41_route_count *rc = self;
    rc->inner->end(rc->inner->self, ctx, r, acc);
}

int ds41_engine_route_count_start(ds41_engine *e) {
    ds41_route_count *rc = e->routes;
    if (rc) {   /* restart: the wrapper stays installed */
        memset(rc->n, 0, (size_t)rc->n_layers * rc->n_experts * sizeof *rc->n);
        return 0;
    }
    int ne = 0;
    for (int l = 0; l < e->w->n_layers; l++)
        if (e->w->layers[l].n_experts > ne) ne = e->w->layers[l].n_experts;
    rc = calloc(1, sizeof *rc);
    if (!rc) return -1;
    rc->n = calloc((size_t)(e->w->n_layers ? e->w->n_layers : 1) * (ne ? ne : 1), sizeof *rc->n);
    if (!rc->n) {
        free(rc);
        return -1;
    }
    rc->w = e->w;
    rc->n_layers = e->w->n_layers;
    rc->n_experts = ne;
    rc->inner = e->ctx.moe ? e->ctx.moe : &ds41_moe_local;
    rc->d.self = rc;
    rc->d.begin = rc_begin;
    rc->d.end = rc_end;
    e->ctx.moe = &rc->d;
    e->routes = rc;
    return 0;
}

const unsigned long long *ds41_engine_route_counts(const ds41_engine *e, int *layers, int *experts) {
    if (!e->routes) return NULL;
    *layers = e->routes->n_layers;
    *experts = e->routes->n_experts;
    return e->routes->n;
}

void ds41_route_count_free(struct ds41_route_count *rc) {
    if (!rc) return;
    free(rc->n);
    free(rc);
}
