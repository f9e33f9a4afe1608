/* ds41 pipeline stages for --split layers (dist_stage.h, docs/distributed.md): where a stage
 * may start, what crosses a cut, the default ranges (balanced weight bytes) and the --layer-map
 * parser. */
#include "dist_stage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "contract.h"

int ds41_stage_cut_ok(const ds41_config *c, int l, char *why, size_t cap) {
    if (l <= 0 || l >= c->n_layers) {
        snprintf(why, cap, "layer %d is not inside 1..%d", l, c->n_layers - 1);
        return 0;
    }
    /* the drafter runs on the last stage, beside every target layer's input stream */
    if (c->n_mtp > 0)
        for (int k = 0; k < c->n_dspark_targets; k++)
            if (c->dspark_targets[k] < l) {
                snprintf(why, cap, "DSpark target layer %d would sit on an earlier stage (the last stage runs the "
                         "drafter and must hold every target layer, so no stage starts after layer %d)",
                         c->dspark_targets[k], ds41_stage_last_cut(c));
                return 0;
            }
    return 1;
}

int ds41_stage_last_cut(const ds41_config *c) {
    int m = c->n_layers - 1;
    for (int k = 0; c->n_mtp > 0 && k < c->n_dspark_targets; k++)
        if (c->dspark_targets[k] < m) m = c->dspark_targets[k];
    return m;
}

int ds41_stage_cut_needs(const ds41_config *c, int l, ds41_cut_need *nd) {
    memset(nd, 0, sizeof *nd);
    nd->layer = l;
    if (l <= 0 || l >= c->n_layers) return 0;
    for (int m = l; m < c->n_layers; m++) {
        const ds41_layer_plan *lp = &c->layers[m];
        if (lp->ratio <= 0) continue;
        for (int i = 0; i < c->n_kv_sources; i++) {
            int s = c->kv_sources[i];
            if (s < l && (lp->kv_source == s || (lp->is_index_source && lp->index_k_source == s))) nd->stores[i] = 1;
        }
        if (lp->topk_source >= 0 && lp->topk_source < l && lp->topk_source < DS41_CUT_MAX_LAYERS)
            nd->sel[lp->topk_source] = 1;
        if (lp->uses_candidates && c->candidate_source >= 0 && c->candidate_source < l) nd->pool = 1;
    }
    for (int i = 0; i < c->n_kv_sources; i++) nd->n += nd->stores[i];
    for (int m = 0; m < l && m < DS41_CUT_MAX_LAYERS; m++) nd->n += nd->sel[m];
    nd->n += nd->pool;
    return nd->n;
}

void ds41_stage_cut_bytes(const ds41_config *c, int l, long long ctx, ds41_cut_bytes *b) {
    ds41_cut_need nd;
    memset(b, 0, sizeof *b);
    b->stream = (double)ds41_stage_row_bytes(c);
    ds41_stage_cut_needs(c, l, &nd);
    long long main_entry = c->head_dim / 2 + c->head_dim / 16, index_entry = c->index_head_dim / 2 + c->index_head_dim / 32;
    for (int i = 0; i < c->n_kv_sources; i++)
        if (nd.stores[i]) {
            int r = c->layers[c->kv_sources[i]].ratio > 0 ? c->layers[c->kv_sources[i]].ratio : 1;
            b->entries += (double)(main_entry + index_entry) / r;
            b->replica_per_token += (double)(main_entry + index_entry) / r;
        }
    for (int m = 0; m < l && m < DS41_CUT_MAX_LAYERS; m++)
        if (nd.sel[m]) {
            int r = c->layers[m].ratio > 0 ? c->layers[m].ratio : 1;
            long long E = ctx / r, k = E < c->index_topk ? E : c->index_topk;
            b->topk += 4.0 * (double)k + 4.0;
        }
    if (nd.pool) {
        int r = c->layers[c->candidate_source].ratio > 0 ? c->layers[c->candidate_source].ratio : 1;
        long long B = c->candidate_block_size > 0 ? c->candidate_block_size : 1, nb = (ctx / r + B - 1) / B;
        b->pool = (double)((nb + 7) / 8) + 4.0;
    }
    b->total = b->stream + b->entries + b->topk + b->pool;
}

typedef struct bytes_acc {
    int L;
    unsigned long long *lb, first, last;
} bytes_acc;

static int bytes_cb(const ds41_tensor_spec *t, void *ctx) {
    bytes_acc *a = ctx;
    if (t->optional) return 0;
    unsigned long long b = ds41_spec_nbytes(t);
    if (t->layer >= 0 && t->layer < a->L) a->lb[t->layer] += b;
    else if (t->role == DS41_ROLE_EMBED) a->first += b;
    else a->last += b;   /* head, final norm, DSpark stages */
    return 0;
}

void ds41_stage_layer_bytes(const ds41_config *c, unsigned long long *lb, unsigned long long *first_extra,
                            unsigned long long *last_extra) {
    memset(lb, 0, (size_t)c->n_layers * sizeof *lb);
    bytes_acc a = { c->n_layers, lb, 0, 0 };
    ds41_contract_each(c, NULL, bytes_cb, &a);
    *first_extra = a.first;
    *last_extra = a.last;
}

void ds41_stage_bytes(const ds41_config *c, int n, const int *first, unsigned long long *bytes) {
    unsigned long long *lb = calloc((size_t)c->n_layers + 1, sizeof *lb), fe = 0, le = 0;
    memset(bytes, 0, (size_t)n * sizeof *bytes);
    if (!lb) return;
    ds41_stage_layer_bytes(c, lb, &fe, &le);
    for (int r = 0; r < n; r++)
        for (int l = first[r]; l < first[r + 1]; l++) bytes[r] += lb[l];
    bytes[0] += fe;
    bytes[n - 1] += le;
    free(lb);
}

/* The stages among the cuts allowed (only_kv: only in front of KV sources) that make the largest
 * stage's weight bytes smallest (ties: the earliest cuts) into first, the largest into *max.
 * 0, 1 when the cuts cannot make n stages, -1 out of memory. */
static int best_cuts(const ds41_config *c, int n, int only_kv, const unsigned long long *lb, unsigned long long fe,
                     unsigned long long le, int *first, unsigned long long *max, int *places) {
    int L = c->n_layers;
    char why[256];
    int *pos = malloc(((size_t)L + 2) * sizeof *pos), m = 0;
    unsigned long long *pre = calloc((size_t)L + 2, sizeof *pre), *dp = NULL;
    int *from = NULL, rc = -1;
    if (!pos || !pre) goto out;
    pos[m++] = 0;
    for (int l = 1; l < L; l++)
        if (ds41_stage_cut_ok(c, l, why, sizeof why) && (!only_kv || c->layers[l].is_kv_source)) pos[m++] = l;
    pos[m++] = L;
    *places = m - 2;
    if (n > m - 1) { rc = 1; goto out; }
    for (int l = 0; l < L; l++) pre[l + 1] = pre[l] + lb[l];
    /* dp[j * m + i]: the smallest largest stage of j + 1 stages covering layers [0, pos[i]) */
    dp = malloc((size_t)n * m * sizeof *dp);
    from = malloc((size_t)n * m * sizeof *from);
    if (!dp || !from) goto out;
    const unsigned long long INF = ~0ULL;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            unsigned long long best = INF;
            int arg = -1;
            unsigned long long tail = i == m - 1 ? le : 0;
            if (j == 0) {
                if (i > 0) best = pre[pos[i]] + fe + tail;
            } else {
                for (int k = j; k < i; k++) {
                    if (dp[(j - 1) * m + k] == INF) continue;
                    unsigned long long s = pre[pos[i]] - pre[pos[k]] + tail, v = dp[(j - 1) * m + k];
                    if (s > v) v = s;
                    if (v < best) { best = v; arg = k; }
                }
            }
            dp[j * m + i] = best;
            from[j * m + i] = arg;
            if (j == n - 1 && i == m - 1) *max = best;
        }
    first[n] = L;
    for (int j = n - 1, i = m - 1; j >= 0; j--) {
        int k = j ? from[j * m + i] : 0;
        first[j] = pos[k];
        i = k;
    }
    rc = 0;
out:
    free(pos); free(pre); free(dp); free(from);
    return rc;
}

int ds41_stage_default(const ds41_config *c, int n, int *first, char *err, size_t cap) {
    int L = c->n_layers, rc = -1, kv_places = 0, places = 0;
    unsigned long long *lb = calloc((size_t)L + 1, sizeof *lb), fe, le, kv_max = 0, any_max = 0;
    int *kv_first = calloc((size_t)n + 1, sizeof *kv_first);
    if (!lb || !kv_first) { snprintf(err, cap, "out of memory"); goto out; }
    ds41_stage_layer_bytes(c, lb, &fe, &le);
    int kv_rc = best_cuts(c, n, 1, lb, fe, le, kv_first, &kv_max, &kv_places);
    int any_rc = best_cuts(c, n, 0, lb, fe, le, first, &any_max, &places);
    if (kv_rc < 0 || any_rc < 0) { snprintf(err, cap, "out of memory"); goto out; }
    if (any_rc) {
        snprintf(err, cap, "--split layers: %d layers cannot make %d stages (%d place%s to cut: a stage starts at a "
                 "layer 1..%d), so at most %d ranks", L, n, places, places == 1 ? "" : "s", ds41_stage_last_cut(c),
                 places + 1);
        goto out;
    }
    /* a cut in front of a layer that is not a KV source costs a replica of a source's KV and
     * more bytes per hop: the default takes one only where it makes the largest stage at least
     * DS41_STAGE_FINER_PCT % smaller than the cuts at KV sources do (or where those cannot
     * make n stages) */
    if (!kv_rc && any_max * 100 > kv_max * (100 - DS41_STAGE_FINER_PCT))
        memcpy(first, kv_first, ((size_t)n + 1) * sizeof *first);
    rc = 0;
out:
    free(lb); free(kv_first);
    return rc;
}

/* A decimal layer number at s[*i] (no sign, at most 9 digits). */
static int number(const char *s, size_t len, size_t *i, int *out) {
    size_t k = *i;
    long v = 0;
    while (k < len && s[k] >= '0' && s[k] <= '9' && k - *i < 9) v = v * 10 + (s[k++] - '0');
    if (k == *i || (k < len && s[k] >= '0' && s[k] <= '9')) return -1;
    *i = k;
    *out = (int)v;
    return 0;
}

int ds41_stage_parse(const ds41_config *c, int n, const char *text, size_t len, int *first, char *err, size_t cap) {
    int L = c->n_layers, next = 0;
    size_t i = 0;
    char why[256];
    for (int r = 0; r < n; r++) {
        int lo, hi;
        if (r > 0) {
            if (i >= len || text[i] != ',') {
                snprintf(err, cap, "--layer-map: %d range%s given, the job has %d ranks (one LO-HI range per rank, "
                         "separated by commas)", r, r == 1 ? "" : "s", n);
                return -1;
            }
            i++;
        }
        if (number(text, len, &i, &lo)) {
            snprintf(err, cap, "--layer-map: range %d (rank %d): expected a layer number at byte %zu", r + 1, r, i);
            return -1;
        }
        hi = lo;
        if (i < len && text[i] == '-') {
            i++;
            if (number(text, len, &i, &hi)) {
                snprintf(err, cap, "--layer-map: range %d (rank %d): expected the last layer after '-' at byte %zu",
                         r + 1, r, i);
                return -1;
            }
        }
        if (lo != next) {
            snprintf(err, cap, "--layer-map: rank %d starts at layer %d, expected %d (the ranges must cover the layers "
                     "in order)", r, lo, next);
            return -1;
        }
        if (hi < lo || hi >= L) {
            snprintf(err, cap, "--layer-map: rank %d: range %d-%d is not a range inside 0..%d", r, lo, hi, L - 1);
            return -1;
        }
        if (r > 0 && !ds41_stage_cut_ok(c, lo, why, sizeof why)) {
            snprintf(err, cap, "--layer-map: rank %d cannot start at layer %d: %s", r, lo, why);
            return -1;
        }
        first[r] = lo;
        next = hi + 1;
    }
    if (i < len) {
        snprintf(err, cap, "--layer-map: unexpected text at byte %zu after the %d range%s of the %d ranks", i, n,
                 n == 1 ? "" : "s", n);
        return -1;
    }
    if (next != L) {
        snprintf(err, cap, "--layer-map: the ranges end at layer %d, the model has layers 0..%d", next - 1, L - 1);
        return -1;
    }
    first[n] = L;
    return 0;
}
