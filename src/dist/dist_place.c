/* ds41 placement of the routed experts over MPI ranks (dist.h, docs/distributed.md).
 *
 * Default: expert e of every layer and DSpark stage on rank e mod N, so that each rank holds
 * an equal share of every layer (a step's work and bytes spread evenly whatever the routing).
 * A map file moves single experts, for example the hot ones that `ds41 bench` counts:
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

int ds41_placement_parse(ds41_placement *p, const char *text, size_t len, const char *name, char *err, size_t errcap) {
    const char *s = text, *end = text + len;
    int line = 0;
    while (s < end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const char *le = nl ? nl : end;
        line++;
        const char *q = s;
        while (q < le && (*q == ' ' || *q == '\t' || *q == '\r')) q++;
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
            while (q < le && (*q == ' ' || *q == '\t' || *q == '\r')) q++;
            if (q < le && *q != '#') {
                snprintf(err, errcap, "%s:%d: unexpected text after \"LAYER EXPERT RANK\"", name, line);
                return -1;
            }
            for (int k = 0; k < p->n_layers; k++)
                if (l < 0 || k == l) p->owner[(size_t)k * p->n_experts + e] = (int16_t)r;
        }
        s = nl ? nl + 1 : end;
    }
    return 0;
}

int ds41_placement_load(ds41_placement *p, const char *path, char *err, size_t errcap) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errcap, "--expert-map %s: %s", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    int rc = -1;
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) break;
        if (cap >= (64u << 20)) { snprintf(err, errcap, "--expert-map %s: larger than 64 MiB", path); goto out; }
        char *nb = realloc(buf, cap * 2);
        if (!nb) { free(buf); buf = NULL; break; }
        buf = nb;
        cap *= 2;
    }
    if (!buf) { snprintf(err, errcap, "--expert-map %s: out of memory", path); goto out; }
    if (ferror(f)) { snprintf(err, errcap, "--expert-map %s: read error", path); goto out; }
    rc = ds41_placement_parse(p, buf, n, path, err, errcap);
out:
    free(buf);
    fclose(f);
    return rc;
}

uint64_t ds41_fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ULL;
    }
    return h;
}
