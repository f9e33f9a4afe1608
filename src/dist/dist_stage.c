/* ds41 pipeline stages for --split layers (dist_stage.h, docs/distributed.md): where a stage
 * may start, the default ranges (balanced weight bytes) and the --layer-map parser. */
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
    if (!c->layers[l].is_kv_source) {
        snprintf(why, cap, "layer %d is not a KV source (a stage starts only at one: its later layers read its KV; "
                 "KV sources of this model:", l);
        for (int i = 0; i < c->n_kv_sources; i++) {
            size_t n = strlen(why);
            snprintf(why + n, cap - n, " %d", c->kv_sources[i]);
        }
        size_t n = strlen(why);
        snprintf(why + n, cap - n, ")");
        return 0;
    }
    if (c->candidate_source >= 0 && c->candidate_source < l)
        for (int k = l; k < c->n_layers; k++)
            if (c->layers[k].uses_candidates) {
                snprintf(why, cap, "layer %d reads the candidate pool of layer %d, which a stage at %d would leave behind",
                         k, c->candidate_source, l);
                return 0;
            }
    return 1;
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

int ds41_stage_default(const ds41_config *c, int n, int *first, char *err, size_t cap) {
    int L = c->n_layers;
    char why[256];
    /* positions a stage may start at: 0, the allowed cuts, and L (the end) */
    int *pos = malloc(((size_t)L + 2) * sizeof *pos), m = 0;
    unsigned long long *lb = calloc((size_t)L + 1, sizeof *lb), *pre = calloc((size_t)L + 2, sizeof *pre), fe, le;
    unsigned long long *dp = NULL;
    int *from = NULL, rc = -1;
    if (!pos || !lb || !pre) { snprintf(err, cap, "out of memory"); goto out; }
    pos[m++] = 0;
    for (int l = 1; l < L; l++)
        if (ds41_stage_cut_ok(c, l, why, sizeof why)) pos[m++] = l;
    pos[m++] = L;
    if (n > m - 1) {
        snprintf(err, cap, "--split layers: %d layers cannot make %d stages: a stage starts only at a KV source (%d "
                 "place%s to cut), so at most %d ranks", L, n, m - 2, m - 2 == 1 ? "" : "s", m - 1);
        goto out;
    }
    ds41_stage_layer_bytes(c, lb, &fe, &le);
    for (int l = 0; l < L; l++) pre[l + 1] = pre[l] + lb[l];
    /* dp[j * m + i]: the smallest largest stage of j + 1 stages covering layers [0, pos[i]) */
    dp = malloc((size_t)n * m * sizeof *dp);
    from = malloc((size_t)n * m * sizeof *from);
    if (!dp || !from) { snprintf(err, cap, "out of memory"); goto out; }
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
        }
    first[n] = L;
    for (int j = n - 1, i = m - 1; j >= 0; j--) {
        int k = j ? from[j * m + i] : 0;
        first[j] = pos[k];
        i = k;
    }
    rc = 0;
out:
    free(pos); free(lb); free(pre); free(dp); free(from);
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
