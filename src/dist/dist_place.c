/* ds41 placement of the routed experts over MPI ranks (dist.h, docs/distributed.md).
 *
 * Default: expert e of every layer and DSpark stage on rank e mod N, so that each rank holds
 * an equal share of every layer (a step's work and bytes spread evenly whatever the routing).
 * A map file moves single experts, for example the hot ones that `ds41 bench --routing-counts`
 * counts (ds41_placement_balance builds a whole map from those counts; `ds41 inspect --ranks N
 * --expert-map-from COUNTS --write-expert-map FILE` writes it):
 *
 *   # LAYER EXPERT RANK     (LAYER: 0.. backbone layers, then the DSpark stages; * = all)
 *   * 0 1
 *   3 17 0
 */
#include "dist.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ds41_placement_default(ds41_placement *p, int n_ranks, int n_layers, int n_experts) {
    memset(p, 0, sizeof *p);
    if (n_ranks < 1 || n_layers < 0 || n_experts < 0) return -1;
    p->n_ranks = n_ranks;
    p->n_layers = n_layers;
    p->n_experts = n_experts;
    p->owner = calloc((size_t)(n_layers ? n_layers : 1) * (n_experts ? n_experts : 1), sizeof(int16_t));
    if (!p->owner) return -1;
    for (int l = 0; l < n_layers; l++)
        for (int e = 0; e < n_experts; e++) p->owner[(size_t)l * n_experts + e] = (int16_t)(e % n_ranks);
    return 0;
}

void ds41_placement_free(ds41_placement *p) {
    free(p->owner);
    memset(p, 0, sizeof *p);
}

/* One field of a line: a decimal integer in [lo, hi], or '*' when star is allowed (-1). */
static int field(const char **s, const char *end, long lo, long hi, int star, long *out) {
    const char *q = *s;
    while (q < end && (*q == ' ' || *q == '\t')) q++;
    if (q < end && *q == '*' && star) {
        *out = -1;
        *s = q + 1;
        return 0;
    }
    long v = 0;
    int nd = 0;
    while (q < end && *q >= '0' && *q <= '9') {
        if (v > (hi - (*q - '0')) / 10) return -1;   /* past hi: no overflow on the way */
        v = v * 10 + (*q - '0');
        q++;
        nd++;
    }
    if (!nd || v < lo || v > hi) return -1;
    if (q < end && *q != ' ' && *q != '\t' && *q != '#' && *q != '\r') return -1;
    *out = v;
    *s = q;
    return 0;
}

static const char *skip_blank(const char *q, const char *le) {
    while (q < le && (*q == ' ' || *q == '\t' || *q == '\r')) q++;
    return q;
}

/* The next line of the text [*s, end) (the map and count files): *le its end, before the
 * newline; *s moves past it. Returns its first character that is not a blank (*le if none). */
static const char *next_line(const char **s, const char *end, const char **le) {
    const char *nl = memchr(*s, '\n', (size_t)(end - *s));
    *le = nl ? nl : end;
    const char *q = skip_blank(*s, *le);
    *s = nl ? nl + 1 : end;
    return q;
}

int ds41_placement_parse(ds41_placement *p, const char *text, size_t len, const char *name, char *err, size_t errcap) {
    const char *s = text, *end = text + len;
    int line = 0;
    while (s < end) {
        const char *le, *q = next_line(&s, end, &le);
        line++;
        if (q < le && *q != '#') {
            long l, e, r;
            const char *what = NULL;
            if (field(&q, le, 0, p->n_layers - 1L, 1, &l)) what = "a layer (0..%d) or '*'";
            else if (field(&q, le, 0, p->n_experts - 1L, 0, &e)) what = "an expert id (0..%d)";
            else if (field(&q, le, 0, p->n_ranks - 1L, 0, &r)) what = "a rank (0..%d)";
            if (what) {
                int top = strstr(what, "layer") ? p->n_layers - 1 : strstr(what, "expert") ? p->n_experts - 1 : p->n_ranks - 1;
                char w[64];
                snprintf(w, sizeof w, what, top);
                snprintf(err, errcap, "%s:%d: expected %s in \"LAYER EXPERT RANK\"", name, line, w);
                return -1;
            }
            q = skip_blank(q, le);
            if (q < le && *q != '#') {
                snprintf(err, errcap, "%s:%d: unexpected text after \"LAYER EXPERT RANK\"", name, line);
                return -1;
            }
            for (int k = 0; k < p->n_layers; k++)
                if (l < 0 || k == l) p->owner[(size_t)k * p->n_experts + e] = (int16_t)r;
        }
    }
    return 0;
}

/* The whole file at path into *buf (its length *n), at most 64 MiB; what: the flag that named
 * it, for messages. 0, or -1 with err. */
static int read_all(const char *path, const char *what, char **buf, size_t *n, char *err, size_t errcap) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errcap, "%s %s: %s", what, path, strerror(errno));
        return -1;
    }
    size_t cap = 4096;
    char *b = malloc(cap);
    *n = 0;
    while (b) {
        size_t got = fread(b + *n, 1, cap - *n, f);
        *n += got;
        if (*n < cap) break;
        if (cap >= (64u << 20)) {
            snprintf(err, errcap, "%s %s: larger than 64 MiB", what, path);
            free(b);
            fclose(f);
            return -1;
        }
        char *nb = realloc(b, cap * 2);
        if (!nb) { free(b); b = NULL; break; }
        b = nb;
        cap *= 2;
    }
    int bad = !b || ferror(f);
    if (bad) snprintf(err, errcap, "%s %s: %s", what, path, b ? "read error" : "out of memory");
    fclose(f);
    if (bad) {
        free(b);
        return -1;
    }
    *buf = b;
    return 0;
}

int ds41_placement_load(ds41_placement *p, const char *path, char *err, size_t errcap) {
    char *buf;
    size_t n;
    if (read_all(path, "--expert-map", &buf, &n, err, errcap)) return -1;
    int rc = ds41_placement_parse(p, buf, n, path, err, errcap);
    free(buf);
    return rc;
}

/* ---- routing counts and the balanced placement built from them ---- */

int ds41_route_counts_load(const ds41_placement *p, const char *path, unsigned long long *counts, char *err,
                           size_t errcap) {
    char *buf;
    size_t len;
    if (read_all(path, "--expert-map-from", &buf, &len, err, errcap)) return -1;
    const char *s = buf, *end = buf + len;
    int line = 0, rc = 0;
    while (s < end && !rc) {
        const char *le, *q = next_line(&s, end, &le);
        line++;
        if (q < le && *q != '#') {
            long l, e, c;
            char w[64] = "";
            if (field(&q, le, 0, p->n_layers - 1L, 0, &l)) snprintf(w, sizeof w, "a layer (0..%d)", p->n_layers - 1);
            else if (field(&q, le, 0, p->n_experts - 1L, 0, &e)) snprintf(w, sizeof w, "an expert id (0..%d)", p->n_experts - 1);
            else if (field(&q, le, 0, (1L << 62), 0, &c)) snprintf(w, sizeof w, "a count (0..2^62)");
            if (!w[0]) q = skip_blank(q, le);
            if (w[0]) {
                snprintf(err, errcap, "%s:%d: expected %s in \"LAYER EXPERT COUNT\" (a file of ds41 bench --routing-counts "
                         "for this model)", path, line, w);
                rc = -1;
            } else if (q < le && *q != '#') {
                snprintf(err, errcap, "%s:%d: unexpected text after \"LAYER EXPERT COUNT\"", path, line);
                rc = -1;
            } else {
                counts[(size_t)l * p->n_experts + e] += (unsigned long long)c;
            }
        }
    }
    free(buf);
    return rc;
}

static unsigned long long layer_sum(const ds41_placement *p, const unsigned long long *counts, int l) {
    unsigned long long t = 0;
    for (int e = 0; e < p->n_experts; e++) t += counts[(size_t)l * p->n_experts + e];
    return t;
}

void ds41_placement_balance(ds41_placement *p, const unsigned long long *counts, const int *experts) {
    int N = p->n_ranks, E = p->n_experts;
    int *ord = malloc((size_t)(E ? E : 1) * sizeof *ord), *held = malloc((size_t)N * sizeof *held);
    unsigned long long *load = malloc((size_t)N * sizeof *load);
    if (!ord || !held || !load) goto out;   /* out of memory: the default stays */
    for (int l = 0; l < p->n_layers; l++) {
        const unsigned long long *c = counts + (size_t)l * E;
        int El = experts[l] < E ? experts[l] : E;
        if (El <= 0 || !layer_sum(p, counts, l)) continue;
        /* the layer's experts, hottest first (an insertion sort: at most a few hundred) */
        for (int i = 0; i < El; i++) {
            int j = i;
            while (j > 0 && c[ord[j - 1]] < c[i]) { ord[j] = ord[j - 1]; j--; }
            ord[j] = i;
        }
        int cap = (El + N - 1) / N;
        memset(held, 0, (size_t)N * sizeof *held);
        memset(load, 0, (size_t)N * sizeof *load);
        for (int i = 0; i < El; i++) {
            int best = -1;
            for (int r = 0; r < N; r++) {
                if (held[r] >= cap) continue;
                if (best < 0 || load[r] < load[best] || (load[r] == load[best] && held[r] < held[best])) best = r;
            }
            p->owner[(size_t)l * E + ord[i]] = (int16_t)best;
            held[best]++;
            load[best] += c[ord[i]];
        }
    }
out:
    free(ord);
    free(held);
    free(load);
}

int ds41_placement_write(const ds41_placement *p, const unsigned long long *counts, const int *experts,
                         const char *header, FILE *f) {
    fprintf(f, "# ds41 --expert-map for %d ranks (LAYER EXPERT RANK), balanced on %s\n"
               "# layers without counts keep the default (expert e on rank e mod %d) and have no line\n",
            p->n_ranks, header, p->n_ranks);
    for (int l = 0; l < p->n_layers; l++) {
        if (!layer_sum(p, counts, l)) continue;
        int El = experts[l] < p->n_experts ? experts[l] : p->n_experts;
        for (int e = 0; e < El; e++) fprintf(f, "%d %d %d\n", l, e, ds41_dist_owner(p, l, e));
    }
    return fflush(f) || ferror(f) ? -1 : 0;
}

uint64_t ds41_fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ULL;
    }
    return h;
}
