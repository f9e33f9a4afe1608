/* ds41 long-context measurement support: the synthetic context (longctx.h) and the public
 * switches of the performance points and the per-sublayer timers (ds41.h). */
#include "longctx.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attention.h"
#include "dist.h"
#include "ds41.h"
#include "formats.h"
#include "safetensors.h"

/* xorshift64* */
static uint64_t rnd_next(uint64_t *x) {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * 0x2545F4914F6CDD1DULL;
}

/* n BF16 values: a sum of two uniforms in [-a, a) (a triangular bell), rounded to BF16 */
static void rnd_bf16(uint64_t *x, float *v, int n, float a) {
    for (int i = 0; i < n; i++) {
        double u = (double)(rnd_next(x) >> 11) * (1.0 / 9007199254740992.0);
        double w = (double)(rnd_next(x) >> 11) * (1.0 / 9007199254740992.0);
        v[i] = ds41_bf16_round((float)((u + w - 1.0) * a));
    }
}

int ds41_seq_synthetic(ds41_seq *s, long long n, uint64_t seed, ds41_err *err) {
    const ds41_config *cfg = s->e->cfg;
    ds41_cache *c = &s->cache;
    if (c->pos != 0) return ds41_errf(err, "synthetic context: the session already holds %lld tokens", c->pos);
    if (n < 1 || n >= c->max_pos)
        return ds41_errf(err, "synthetic context: %lld tokens do not fit the context size %lld (one more is decoded)", n,
                         c->max_pos);
    int D = cfg->head_dim, ID = cfg->index_head_dim;
    float *v = malloc((size_t)(D > ID ? D : ID) * sizeof(float));
    if (!v) return ds41_errf(err, "out of memory");
    uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL;
    if (!x) x = 1;
    /* global KV: every KV source's entries */
    for (int i = 0; i < c->n_stores; i++) {
        ds41_kv_store *st = &c->stores[i];
        long long E = n / st->ratio;
        for (long long j = 0; j < E; j++) {
            uint8_t *kr = ds41_store_kv_rec(st, j, 1, err), *ir = ds41_store_ik_rec(st, j, 1, err);
            if (!kr || !ir) { free(v); return -1; }
            rnd_bf16(&x, v, D, 2.0f);
            ds41_pack_q4nv(v, D, kr, kr + D / 2);
            rnd_bf16(&x, v, ID, 2.0f);
            ds41_pack_q4mx(v, ID, ir, ir + ID / 2);
        }
        st->n_entries = E;
    }
    /* SWA and DSpark rings: the last window's positions */
    for (int r = 0; r < c->n_rings; r++) {
        ds41_ring *rg = &c->rings[r];
        int rd = D;   /* every ring holds head_dim-wide Q8 records */
        if (rg->rec_bytes != ds41_swa_rec_bytes(cfg)) { free(v); return ds41_errf(err, "synthetic context: ring %d has %d-byte records", r, rg->rec_bytes); }
        long long p0 = n - rg->slots > 0 ? n - rg->slots : 0;
        for (long long p = p0; p < n; p++) {
            uint8_t *rec = ds41_ring_slot(rg, p);
            rnd_bf16(&x, v, rd, 2.0f);
            ds41_pack_q8(v, rd, rec, rec + rd);
        }
    }
    /* ratio-r compressor rows (FP32 projections; all rows, whichever the next forward reads) */
    for (int i = 0; i < c->n_comp; i++) {
        ds41_comp_state *cs = &c->comp[i];
        for (int r = 0; r < cs->ratio; r++) {
            rnd_bf16(&x, cs->kv + (size_t)r * cs->dim, cs->dim, 2.0f);
            rnd_bf16(&x, cs->sc + (size_t)r * cs->dim, cs->dim, 2.0f);
        }
    }
    if (s->e->has_engram && s->e->n_compressed > 0)
        for (int k = 0; k < 16; k++) c->hist[k] = (int32_t)(rnd_next(&x) % (uint64_t)s->e->n_compressed);
    c->ik_owner = ds41_ik_owner_after(cfg, -1, 0, n - 1, cfg->n_layers - 1);
    c->pos = n;
    free(v);
    return 0;
}

/* ---- public switches (ds41.h) ---- */

void ds41_engine_set_ablate(ds41_engine *e, unsigned mask) {
    e->ctx.ablate = mask & 15u;
    /* P6 on: its side worker, when the model has indexers and the pool leaves a CPU free (with
     * every CPU in the pool an overlap would take one from its linears, which split the
     * indexer's scores over the pool anyway); without one the indexers run serially */
    if (!(mask & DS41_ABLATE_P6) && !e->side && sysconf(_SC_NPROCESSORS_ONLN) > e->ctx.n_threads) {
        int n_index = 0;
        for (int l = 0; l < e->cfg->n_layers; l++) n_index += e->cfg->layers[l].is_index_source;
        if (n_index > 0) e->side = ds41_side_create();
    }
}
unsigned ds41_engine_ablate(const ds41_engine *e) { return e->ctx.ablate; }
void ds41_engine_set_profile(ds41_engine *e, double *acc) { e->ctx.prof = acc; }

int ds41_parse_ablate(const char *s, unsigned *mask) {
    unsigned m = 0;
    if (!s) return -1;
    if (!strcmp(s, "none") || !*s) { *mask = 0; return 0; }
    const char *p = s;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 2 && (p[0] == 'p' || p[0] == 'P') && p[1] >= '1' && p[1] <= '3') m |= 1u << (p[1] - '1');
        else if (len == 2 && (p[0] == 'p' || p[0] == 'P') && p[1] == '6') m |= DS41_ABLATE_P6;
        else if (len == 3 && !strncmp(p, "all", 3)) m |= 15u;
        else return -1;
        p += len;
        if (*p == ',') p++;
    }
    *mask = m;
    return 0;
}

/* ---- weight read-ahead ---- */

struct ds41_readahead {
    int n_groups;          /* n_layers + 1 */
    int *off;              /* [n_groups + 1] into p / len */
    const void **p;
    uint64_t *len;
};

void ds41_readahead_free(struct ds41_readahead *ra) {
    if (!ra) return;
    free(ra->off);
    free(ra->p);
    free(ra->len);
    free(ra);
}

/* group of a tensor name: layer L for "layers.L.", n_layers for everything else read per token
 * (head, norms, DSpark stages); the embedding and the Engram tables (a few rows per token) are not
 * read ahead */
static int ra_group(const char *name, int n_layers) {
    /* an Engram table is read a few rows per token (engram_place.c), never as a whole */
    if (strstr(name, "engram.embed.")) return -1;
    if (!strncmp(name, "layers.", 7)) {
        int l = atoi(name + 7);
        return l >= 0 && l < n_layers ? l : n_layers;
    }
    if (strstr(name, "embed")) return -1;
    return n_layers;
}

int ds41_engine_readahead_init(ds41_engine *e, ds41_err *err) {
    const ds41_st *st = e->model->st;
    int G = e->cfg->n_layers + 1;
    size_t nt = ds41_st_count(st);
    struct ds41_readahead *ra = calloc(1, sizeof *ra);
    if (!ra) return ds41_errf(err, "out of memory");
    ra->n_groups = G;
    ra->off = calloc((size_t)G + 1, sizeof(int));
    ra->p = calloc(nt + 1, sizeof(void *));
    ra->len = calloc(nt + 1, sizeof(uint64_t));
    if (!ra->off || !ra->p || !ra->len) { ds41_readahead_free(ra); return ds41_errf(err, "out of memory"); }
    for (size_t i = 0; i < nt; i++) {   /* counts, then offsets, then fill */
        const char *name = ds41_st_at(st, i)->name;
        int g = ds41_dist_not_mine(e->cfg, name) ? -1 : ra_group(name, e->cfg->n_layers);   /* another rank's expert */
        if (g >= 0) ra->off[g + 1]++;
    }
    for (int g = 0; g < G; g++) ra->off[g + 1] += ra->off[g];
    int *fill = calloc((size_t)G, sizeof(int));
    if (!fill) { ds41_readahead_free(ra); return ds41_errf(err, "out of memory"); }
    for (size_t i = 0; i < nt; i++) {
        const ds41_tensor *t = ds41_st_at(st, i);
        int g = ds41_dist_not_mine(e->cfg, t->name) ? -1 : ra_group(t->name, e->cfg->n_layers);
        if (g < 0) continue;
        int k = ra->off[g] + fill[g]++;
        ra->p[k] = t->data;
        ra->len[k] = t->nbytes;
    }
    free(fill);
    e->ra = ra;
    return 0;
}

void ds41_engine_readahead(const ds41_engine *e, int l) {
    const struct ds41_readahead *ra = e->ra;
    if (!ra || l < 0 || l >= ra->n_groups) return;
    for (int k = ra->off[l]; k < ra->off[l + 1]; k++) ds41_st_willneed(ra->p[k], ra->len[k]);
}

int ds41_parse_load(const char *s, int *load) {
    if (!strcmp(s, "mmap")) *load = DS41_LOAD_MMAP;
    else if (!strcmp(s, "copy")) *load = DS41_LOAD_COPY;
    else return -1;
    return 0;
}
