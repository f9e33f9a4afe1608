/* ds41 model: binds the tensors of the contract (src/model/contract.c) to views into the mmap'd
 * safetensors, checking dtype and exact shape; opens a checkpoint directory. */
#include "model.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "contract.h"

/* The checkpoint's tensors sorted by name, with a "claimed by the contract" mark each. We keep
 * our own order rather than relying on ds41_st_at's. */
typedef struct tindex {
    const ds41_tensor **t;
    unsigned char *used;
    size_t n;
} tindex;

static int cmp_tensor(const void *a, const void *b) {
    return strcmp((*(const ds41_tensor *const *)a)->name, (*(const ds41_tensor *const *)b)->name);
}

static int tindex_init(tindex *ix, const ds41_st *st, ds41_err *err) {
    ix->n = ds41_st_count(st);
    ix->t = calloc(ix->n ? ix->n : 1, sizeof *ix->t);
    ix->used = calloc(ix->n ? ix->n : 1, 1);
    if (!ix->t || !ix->used) {
        free(ix->t);
        free(ix->used);
        return ds41_errf(err, "out of memory indexing %zu tensors", ix->n);
    }
    for (size_t i = 0; i < ix->n; i++) ix->t[i] = ds41_st_at(st, i);
    qsort(ix->t, ix->n, sizeof *ix->t, cmp_tensor);
    return 0;
}

static void tindex_free(tindex *ix) {
    free(ix->t);
    free(ix->used);
}

static long tindex_find(const tindex *ix, const char *name) {
    size_t lo = 0, hi = ix->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ix->t[mid]->name, name);
        if (c == 0) return (long)mid;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

typedef struct bind_ctx {
    tindex ix;
    int collect;              /* 1: count every problem (inspect); 0: stop at the first */
    ds41_check_stats *stats;  /* collect mode */
    ds41_err *err;
} bind_ctx;

static int shape_matches(const ds41_tensor *t, const ds41_tensor_spec *s) {
    if (t->dtype != s->dtype || t->ndim != s->ndim) return 0;
    for (int i = 0; i < s->ndim; i++)
        if (t->shape[i] != s->shape[i]) return 0;
    return 1;
}

static int add_name(char ***list, size_t *n, const char *name) {
    if (*n >= DS41_CHECK_MAX_LIST) return 0;
    char **grown = realloc(*list, (*n + 1) * sizeof **list);
    if (!grown) return -1;
    *list = grown;
    grown[*n] = strdup(name);
    if (!grown[*n]) return -1;
    (*n)++;
    return 0;
}

static int bind_cb(const ds41_tensor_spec *s, void *vctx) {
    bind_ctx *b = vctx;
    char want[96], got[96], msg[512];
    ds41_spec_format(s->dtype, s->ndim, s->shape, want, sizeof want);
    if (b->collect && !s->optional) b->stats->expected++;
    long i = tindex_find(&b->ix, s->name);
    if (i < 0) {
        if (s->optional) return 0;
        snprintf(msg, sizeof msg, "tensor %s: missing from the checkpoint (expected %s)", s->name, want);
        if (!b->collect) return ds41_errf(b->err, "%s", msg);
        b->stats->missing++;
        if (!b->stats->first_problem[0]) snprintf(b->stats->first_problem, sizeof b->stats->first_problem, "%s", msg);
        if (add_name(&b->stats->missing_names, &b->stats->n_missing_names, s->name))
            return ds41_errf(b->err, "out of memory");
        return 0;
    }
    const ds41_tensor *t = b->ix.t[i];
    b->ix.used[i] = 1;
    if (b->collect && s->optional) b->stats->expected++;
    if (!shape_matches(t, s)) {
        ds41_spec_format(t->dtype, t->ndim, t->shape, got, sizeof got);
        snprintf(msg, sizeof msg, "tensor %s: expected %s, found %s", s->name, want, got);
        if (!b->collect) return ds41_errf(b->err, "%s", msg);
        b->stats->misshaped++;
        if (!b->stats->first_problem[0]) snprintf(b->stats->first_problem, sizeof b->stats->first_problem, "%s", msg);
        return 0;
    }
    /* safetensors.c aligns data to the element size; checked again because the views are
     * dereferenced as uint16_t / float without further care */
    uintptr_t a = (uintptr_t)t->data;
    int align = s->slot_type == DS41_SLOT_F32 ? 4 : s->slot_type == DS41_SLOT_U16 ? 2 : 1;
    if (a % (uintptr_t)align) {
        snprintf(msg, sizeof msg, "tensor %s: data is not aligned to %d bytes", s->name, align);
        if (!b->collect) return ds41_errf(b->err, "%s", msg);
        b->stats->misshaped++;
        if (!b->stats->first_problem[0]) snprintf(b->stats->first_problem, sizeof b->stats->first_problem, "%s", msg);
        return 0;
    }
    if (b->collect) b->stats->present++;
    if (s->slot) {
        switch (s->slot_type) {
        case DS41_SLOT_U8: *(const uint8_t **)s->slot = t->data; break;
        case DS41_SLOT_U16: *(const uint16_t **)s->slot = t->data; break;
        case DS41_SLOT_F32: *(const float **)s->slot = t->data; break;
        }
    }
    return 0;
}

static int alloc_layers(const ds41_config *cfg, ds41_weights *w, ds41_err *err) {
    int total = cfg->n_layers + cfg->n_mtp;
    w->n_layers = total;
    w->layers = calloc((size_t)total, sizeof *w->layers);
    if (!w->layers) return ds41_errf(err, "out of memory for %d layers", total);
    for (int i = 0; i < total; i++) {
        int e = cfg->layers[i].n_experts;
        w->layers[i].experts = calloc((size_t)e, sizeof *w->layers[i].experts);
        if (!w->layers[i].experts) return ds41_errf(err, "out of memory for %d experts", e);
    }
    return 0;
}

int ds41_weights_bind(const ds41_config *cfg, const ds41_st *st, ds41_weights *w, ds41_err *err) {
    memset(w, 0, sizeof *w);
    bind_ctx b;
    memset(&b, 0, sizeof b);
    b.err = err;
    if (alloc_layers(cfg, w, err)) goto fail;
    if (tindex_init(&b.ix, st, err)) goto fail;
    if (ds41_contract_each(cfg, w, bind_cb, &b)) {
        tindex_free(&b.ix);
        goto fail;
    }
    size_t shown = 0;
    for (size_t i = 0; i < b.ix.n; i++) {
        if (b.ix.used[i]) {
            w->n_bound++;
            continue;
        }
        const char *name = b.ix.t[i]->name;
        if (ds41_is_vision_tensor(name)) {
            w->n_vision++;
            continue;
        }
        w->n_unexpected++;
        if (shown++ < 5) ds41_log(1, "unexpected tensor %s (not part of the V4.1 contract; ignored)", name);
    }
    if (w->n_unexpected > shown)
        ds41_log(1, "%zu unexpected tensors in all (ignored)", w->n_unexpected);
    if (w->n_vision)
        ds41_log(2, "%zu vision tensors (bound on use by the vision tower, src/model/vision_weights.c)", w->n_vision);   /* expected: not printed */
    tindex_free(&b.ix);
    return 0;
fail:
    ds41_weights_free(w);
    return -1;
}

void ds41_weights_free(ds41_weights *w) {
    if (!w) return;
    if (w->layers)
        for (int i = 0; i < w->n_layers; i++) free(w->layers[i].experts);
    free(w->layers);
    memset(w, 0, sizeof *w);
}

int ds41_weights_check(const ds41_config *cfg, const ds41_st *st, ds41_check_stats *s, ds41_err *err) {
    memset(s, 0, sizeof *s);
    bind_ctx b;
    memset(&b, 0, sizeof b);
    b.err = err;
    b.collect = 1;
    b.stats = s;
    if (tindex_init(&b.ix, st, err)) return -1;
    int rc = ds41_contract_each(cfg, NULL, bind_cb, &b);
    for (size_t i = 0; rc == 0 && i < b.ix.n; i++) {
        if (b.ix.used[i]) continue;
        const char *name = b.ix.t[i]->name;
        if (ds41_is_vision_tensor(name)) {
            s->vision++;
            continue;
        }
        s->unexpected++;
        if (add_name(&s->unexpected_names, &s->n_unexpected_names, name)) rc = ds41_errf(err, "out of memory");
    }
    tindex_free(&b.ix);
    if (rc) ds41_check_stats_free(s);
    return rc;
}

void ds41_check_stats_free(ds41_check_stats *s) {
    for (size_t i = 0; i < s->n_unexpected_names; i++) free(s->unexpected_names[i]);
    for (size_t i = 0; i < s->n_missing_names; i++) free(s->missing_names[i]);
    free(s->unexpected_names);
    free(s->missing_names);
    s->unexpected_names = s->missing_names = NULL;
    s->n_unexpected_names = s->n_missing_names = 0;
}

/* ------------------------------------------------------------------------------------------ */

int ds41_model_open(const char *dir, ds41_model *m, ds41_err *err) { return ds41_model_open_load(dir, m, 0, NULL, NULL, err); }

int ds41_model_open_load(const char *dir, ds41_model *m, int copy, int (*skip)(const ds41_tensor *t, void *arg), void *arg,
                         ds41_err *err) {
    memset(m, 0, sizeof *m);
    m->dir = strdup(dir);
    if (!m->dir) return ds41_errf(err, "out of memory");
    if (ds41_config_load(dir, &m->cfg, err)) goto fail;
    if (ds41_st_dir_has_tensors(dir)) {
        if (ds41_st_open(dir, &m->st, err)) goto fail;
        if (copy && ds41_st_copy_anon_skip(m->st, skip, arg, err)) goto fail;
        ds41_err e;
        if (ds41_weights_bind(&m->cfg, m->st, &m->w, &e)) {
            ds41_errf(err, "%s: %s", dir, e.msg);
            goto fail;
        }
    }
    return 0;
fail:
    ds41_model_close(m);
    return -1;
}

void ds41_model_close(ds41_model *m) {
    if (!m) return;
    ds41_weights_free(&m->w);
    if (m->st) ds41_st_close(m->st);
    ds41_config_free(&m->cfg);
    free(m->dir);
    memset(m, 0, sizeof *m);
}
