/* ds41 pipeline parallelism under MPI (dist_pipe.h, docs/distributed.md): the stage of each
 * rank and the residual stream's hop between stages. Point to point (MPI_Isend / MPI_Irecv
 * on a duplicate of the world communicator, so that no tag meets the other exchanges), every
 * wait bounded by --mpi-timeout (a stage that does not answer is named). Each message starts
 * with a header (step, layer, rows) so that stages whose steps drifted apart stop instead of
 * adding another step's numbers. */
#include "dist_pipe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist.h"
#include "dist_stage.h"

static struct {
    int set, layers;            /* --split given; 1: layers */
    const char *map;
    int map_split, map_flag;    /* the stages came from --split layers:RANGES / --layer-map */
    int eager;                  /* ds41_pipe_set_eager: serve */
    int batches;                /* --pipe-batches, 0: the default */
} f;

int ds41_pipe_flag(const char *a, const char *v, char *err, size_t cap) {
    if (!strcmp(a, "--split")) {
        if (v && !strncmp(v, "layers:", 7)) {   /* --split layers:0-3,4-5,6-7: the stages given */
            if (!v[7]) {
                snprintf(err, cap, "--split layers: needs ranges after the colon, one LO-HI per rank (e.g. layers:0-3,4-7)");
                return -1;
            }
            f.set = f.layers = f.map_split = 1;
            f.map = v + 7;
            return 1;
        }
        if (!v || (strcmp(v, "experts") && strcmp(v, "layers"))) {
            snprintf(err, cap, "--split: '%s' is neither experts (the default), layers nor layers:RANGES", v ? v : "");
            return -1;
        }
        f.set = 1;
        f.layers = !strcmp(v, "layers");
        return 1;
    }
    if (!strcmp(a, "--pipe-batches")) {
        char *end = NULL;
        long n = v ? strtol(v, &end, 10) : 0;
        if (!v || end == v || *end || n < 1 || n > DS41_PIPE_MAX_BATCHES) {
            snprintf(err, cap, "--pipe-batches: '%s' is not a number of micro-batches in 1..%d", v ? v : "",
                     DS41_PIPE_MAX_BATCHES);
            return -1;
        }
        f.batches = (int)n;
        return 1;
    }
    if (!strcmp(a, "--layer-map")) {
        if (!v || !*v) {
            snprintf(err, cap, "--layer-map needs ranges, one LO-HI per rank (e.g. 0-3,4-7)");
            return -1;
        }
        f.map = v;
        f.map_flag = 1;
        return 1;
    }
    return 0;
}

int ds41_pipe_on(void) { return f.layers; }
int ds41_pipe_batches(int ranks) {
    int n = f.batches ? f.batches : 2 * ranks;
    return n > DS41_PIPE_MAX_BATCHES ? DS41_PIPE_MAX_BATCHES : n;
}
const char *ds41_pipe_flags_error(void) {
    if (f.map_split && f.map_flag) return "--split layers:RANGES and --layer-map both give the stages (give one)";
    if (f.layers) return NULL;
    if (f.map) return "--layer-map needs --split layers";
    if (f.batches) return "--pipe-batches needs --split layers (it cuts serve's steps for the stages)";
    return NULL;
}
void ds41_pipe_set_eager(int on) { f.eager = on; }
const char *ds41_pipe_layer_map(void) { return f.map; }

uint64_t ds41_pipe_flags_hash(uint64_t h) {
    h = ds41_fnv(h, &f.layers, sizeof f.layers);
    h = ds41_fnv(h, &f.batches, sizeof f.batches);
    h = ds41_fnv(h, &f.map_split, sizeof f.map_split);
    return f.map ? ds41_fnv(h, f.map, strlen(f.map) + 1) : h;
}

typedef struct hop_hdr {
    uint32_t magic, layer;
    uint64_t step, rows, plan;  /* plan: the hash of the forward's plan (ds41_pipe_step) */
} hop_hdr;
#define PMAGIC 0x50495045u

/* serve's pipelined step: the logits of a forward whose stage 0 rank 0 ran, on their way from
 * the last stage (posted receive), and where their rows go */
typedef struct pending {
    unsigned char *buf;
    size_t n, V;
    uint64_t step, plan;
    float **dst;
    size_t *at;
    int m;
#ifdef DS41_HAVE_MPI
    MPI_Request r;
#endif
} pending;

struct ds41_pipe {
    int rank, size, lo, hi, L;
    int defer;                  /* ds41_pipe_defer */
    int max_pend;               /* the most forwards whose logits rank 0 awaited at once */
    long long deferred_steps;
    long long overlapped;       /* collects that left a later step's forwards pending */
    uint64_t plan;              /* the running forward's plan hash */
    pending *pend;
    int n_pend, cap_pend;
    int *first;
    ds41_cut_need need_lo, need_hi;   /* what crosses the cut in front of this stage / the next */
    long long side_sent, side_recv;   /* of the bytes sent / received: what crossed besides the stream */
    size_t hc, dim;
    unsigned char *buf;
    size_t cap;
    uint64_t step;              /* forwards so far (the header's step) */
    long long hops_sent, rows_sent, bytes_sent, hops_recv, rows_recv, bytes_recv, shared_bytes, token_bytes, spec_bytes;
    double wait_s;
#ifdef DS41_HAVE_MPI
    MPI_Comm comm;
#endif
};
static ds41_pipe *open_pipe;    /* for the report at the end */

int ds41_pipe_first(const ds41_pipe *p) { return p->rank == 0; }
int ds41_pipe_last(const ds41_pipe *p) { return p->rank == p->size - 1; }
int ds41_pipe_holds(const ds41_pipe *p, int l) { return l >= p->lo && l < p->hi; }

int ds41_pipe_holds_store(const ds41_pipe *p, int i, int layer) {
    return ds41_pipe_holds(p, layer) || (layer < p->lo && i >= 0 && i < DS41_MAX_LIST && p->need_lo.stores[i]);
}

const ds41_cut_need *ds41_pipe_cut(const ds41_pipe *p, int l) {
    if (!p) return NULL;
    if (l == p->lo && l > 0) return &p->need_lo;
    if (l == p->hi && l < p->L) return &p->need_hi;
    return NULL;
}

int ds41_pipe_open(const ds41_config *c, ds41_pipe **out, char *err, size_t cap) {
    *out = NULL;
#ifndef DS41_HAVE_MPI
    (void)c;
    snprintf(err, cap, "--split layers needs a ds41 built with MPI");
    return -1;
#else
    int n = ds41_dist_size();
    ds41_pipe *p = calloc(1, sizeof *p);
    int *first = calloc((size_t)n + 1, sizeof *first);
    if (!p || !first) {
        free(p); free(first);
        snprintf(err, cap, "out of memory");
        return -1;
    }
    int rc = f.map ? ds41_stage_parse(c, n, f.map, strlen(f.map), first, err, cap)
                   : ds41_stage_default(c, n, first, err, cap);
    if (rc) { free(p); free(first); return -1; }
    p->rank = ds41_dist_rank();
    p->size = n;
    p->first = first;
    p->lo = first[p->rank];
    p->hi = first[p->rank + 1];
    p->L = c->n_layers;
    p->hc = (size_t)c->hc_mult;
    p->dim = (size_t)c->dim;
    ds41_stage_cut_needs(c, p->lo, &p->need_lo);
    ds41_stage_cut_needs(c, p->hi, &p->need_hi);
    if (MPI_Comm_dup(MPI_COMM_WORLD, &p->comm) != MPI_SUCCESS) {
        free(p); free(first);
        snprintf(err, cap, "--split layers: MPI_Comm_dup failed");
        return -1;
    }
    *out = open_pipe = p;
    return 0;
#endif
}

void ds41_pipe_close(ds41_pipe *p) {
    if (!p) return;
    if (open_pipe == p) {   /* the report at the end keeps the counters */
        static ds41_pipe last;
        last = *p;
        last.first = NULL;
        last.buf = NULL;
        last.pend = NULL;
        last.n_pend = 0;
        open_pipe = &last;
    }
#ifdef DS41_HAVE_MPI
    MPI_Comm_free(&p->comm);
#endif
    for (int i = 0; i < p->n_pend; i++) free(p->pend[i].buf), free(p->pend[i].dst), free(p->pend[i].at);
    free(p->pend);
    free(p->first);
    free(p->buf);
    free(p);
}

#ifdef DS41_HAVE_MPI
static int reserve(ds41_pipe *p, size_t n, char *err, size_t cap) {
    if (n <= p->cap) return 0;
    unsigned char *b = realloc(p->buf, n);
    if (!b) { snprintf(err, cap, "out of memory for a %zu-byte stage message", n); return -1; }
    p->buf = b;
    p->cap = n;
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One message of len bytes at p->buf to or from rank q, waited for at most --mpi-timeout. */
static void move(ds41_pipe *p, int send, int q, size_t len, const char *what) {
    MPI_Request r;
    double t0 = now_s();
    if (send) MPI_Isend(p->buf, (int)len, MPI_BYTE, q, 7, p->comm, &r);
    else MPI_Irecv(p->buf, (int)len, MPI_BYTE, q, 7, p->comm, &r);
    ds41_dist_wait(&r, 1, &q, what);
    p->wait_s += now_s() - t0;
}

static int check_hdr(const unsigned char *buf, uint64_t step, uint64_t plan, int q, uint32_t layer, uint64_t rows,
                     char *err, size_t cap) {
    hop_hdr h;
    memcpy(&h, buf, sizeof h);
    if (h.magic != PMAGIC || h.step != step || h.layer != layer || h.rows != rows || h.plan != plan) {
        snprintf(err, cap, "--split layers: rank %d sent step %llu layer %u with %llu rows%s, this rank expected step %llu "
                 "layer %u with %llu rows (the ranks' steps differ)", q, (unsigned long long)h.step, h.layer,
                 (unsigned long long)h.rows, h.plan != plan ? " of another plan" : "", (unsigned long long)step, layer,
                 (unsigned long long)rows);
        return -1;
    }
    return 0;
}
#endif

int ds41_pipe_layer(ds41_pipe *p, float *X, float *pre, int l, size_t k0, size_t N, void *side, size_t side_n, char *err,
                    size_t cap) {
    if (l == 0) p->step++;
#ifdef DS41_HAVE_MPI
    int recv = l == p->lo && l > 0, send = l == p->hi && l < p->L;
    if (recv || send) {
        size_t rows = N - k0, xs = rows * p->hc * p->dim * sizeof(float), ps = rows * p->hc * sizeof(float);
        size_t len = sizeof(hop_hdr) + xs + ps + side_n;
        if (len > (size_t)0x7fffffff) {
            snprintf(err, cap, "--split layers: %zu rows of the stream and %zu bytes beside them do not fit one MPI message",
                     rows, side_n);
            return -1;
        }
        if (reserve(p, len, err, cap)) return -1;
        char what[96];
        if (send) {
            hop_hdr h = { PMAGIC, (uint32_t)l, p->step, rows, p->plan };
            memcpy(p->buf, &h, sizeof h);
            memcpy(p->buf + sizeof h, X + k0 * p->hc * p->dim, xs);
            memcpy(p->buf + sizeof h + xs, pre + k0 * p->hc, ps);
            if (side_n) memcpy(p->buf + sizeof h + xs + ps, side, side_n);
            snprintf(what, sizeof what, "the stream into layer %d, to the next stage", l);
            move(p, 1, p->rank + 1, len, what);
            p->hops_sent++, p->rows_sent += (long long)rows, p->bytes_sent += (long long)len;
            p->side_sent += (long long)side_n;
        } else {
            snprintf(what, sizeof what, "the stream into layer %d, from the stage before", l);
            move(p, 0, p->rank - 1, len, what);
            if (check_hdr(p->buf, p->step, p->plan, p->rank - 1, (uint32_t)l, rows, err, cap)) return -1;
            memcpy(X + k0 * p->hc * p->dim, p->buf + sizeof(hop_hdr), xs);
            memcpy(pre + k0 * p->hc, p->buf + sizeof(hop_hdr) + xs, ps);
            if (side_n) memcpy(side, p->buf + sizeof(hop_hdr) + xs + ps, side_n);
            p->hops_recv++, p->rows_recv += (long long)rows, p->bytes_recv += (long long)len;
            p->side_recv += (long long)side_n;
        }
    }
#else
    (void)X, (void)pre, (void)k0, (void)N, (void)side, (void)side_n, (void)err, (void)cap;
#endif
    return l >= p->lo && l < p->hi;
}

#ifdef DS41_HAVE_MPI
/* The last stage's n bytes at data (behind a header: layer, rows) to ranks 0 .. to - 1, or
 * this rank's receive of them (when it is one of those). 0, or -1 with err (a last stage
 * whose step differs). */
static int from_last(ds41_pipe *p, void *data, size_t n, uint32_t layer, uint64_t rows, int to, int tag, const char *what,
                     char *err, size_t cap) {
    int last = p->size - 1;
    size_t len = sizeof(hop_hdr) + n;
    if (p->rank != last && p->rank >= to) return 0;
    if (reserve(p, len, err, cap)) return -1;
    double t0 = now_s();
    if (p->rank == last) {
        hop_hdr h = { PMAGIC, layer, p->step, rows, p->plan };
        memcpy(p->buf, &h, sizeof h);
        memcpy(p->buf + sizeof h, data, n);
        MPI_Request *r = malloc((size_t)to * sizeof *r);
        int *peer = malloc((size_t)to * sizeof *peer);
        if (!r || !peer) { free(r); free(peer); return snprintf(err, cap, "out of memory"), -1; }
        for (int q = 0; q < to; q++) {
            peer[q] = q;
            MPI_Isend(p->buf, (int)len, MPI_BYTE, q, tag, p->comm, &r[q]);
        }
        ds41_dist_wait(r, to, peer, what);
        p->shared_bytes += (long long)len * to;
        free(r);
        free(peer);
    } else {
        MPI_Request r;
        MPI_Irecv(p->buf, (int)len, MPI_BYTE, last, tag, p->comm, &r);
        ds41_dist_wait(&r, 1, &last, what);
        if (check_hdr(p->buf, p->step, p->plan, last, layer, rows, err, cap)) return -1;
        memcpy(data, p->buf + sizeof(hop_hdr), n);
    }
    p->wait_s += now_s() - t0;
    return 0;
}

/* Deferred (serve's pipelined step) on rank 0: the receive of this forward's logits is posted
 * now, into a buffer of its own, with the m rows' destinations; ds41_pipe_collect completes
 * it. Posted before the next forward's stream goes out, so the last stage's send never waits
 * for rank 0 while rank 0 waits for the stage after it. */
static int post_later(ds41_pipe *p, size_t len, size_t n, size_t V, float *const *dst, const size_t *at, int m,
                      char *err, size_t cap) {
    if (p->n_pend == p->cap_pend) {
        int nc = p->cap_pend ? p->cap_pend * 2 : 8;
        pending *np = realloc(p->pend, (size_t)nc * sizeof *np);
        if (!np) return snprintf(err, cap, "out of memory"), -1;
        p->pend = np;
        p->cap_pend = nc;
    }
    pending *q = &p->pend[p->n_pend];
    memset(q, 0, sizeof *q);
    q->buf = malloc(len);
    q->dst = malloc(((size_t)m + 1) * sizeof *q->dst);
    q->at = malloc(((size_t)m + 1) * sizeof *q->at);
    if (!q->buf || !q->dst || !q->at) {
        free(q->buf); free(q->dst); free(q->at);
        return snprintf(err, cap, "out of memory for a %zu-byte logits message", len), -1;
    }
    memcpy(q->dst, dst, (size_t)m * sizeof *dst);
    memcpy(q->at, at, (size_t)m * sizeof *at);
    q->m = m, q->n = n, q->V = V, q->step = p->step, q->plan = p->plan;
    MPI_Irecv(q->buf, (int)len, MPI_BYTE, p->size - 1, 8, p->comm, &q->r);
    p->n_pend++;
    return DS41_PIPE_NOT_HERE;
}
#endif

int ds41_pipe_share(ds41_pipe *p, float *rows, size_t n, size_t V, float *const *dst, const size_t *at, int m, char *err,
                    size_t cap) {
#ifdef DS41_HAVE_MPI
    size_t len = sizeof(hop_hdr) + n * sizeof(float);
    if (len > (size_t)0x7fffffff) {
        snprintf(err, cap, "--split layers: %zu logits do not fit one MPI message", n);
        return -1;
    }
    int last = p->size - 1;
    if (p->defer && m < 0) {
        snprintf(err, cap, "--split layers: logits of every row in a pipelined serve step (not supported)");
        return -1;
    }
    if (p->defer && p->rank == 0) return post_later(p, len, n, V, dst, at, m, err, cap);
    if (p->defer && p->rank != last) return DS41_PIPE_NOT_HERE;   /* a middle stage: serve samples on rank 0 */
    /* a command (ids after the last stage): they stay there until a rank asks (ds41_pipe_fetch) */
    if (!p->defer && !f.eager && m >= 0) return p->rank == last ? DS41_PIPE_UNSHARED : DS41_PIPE_UNSHARED | DS41_PIPE_NOT_HERE;
    /* to every rank, or (deferred) from the last stage to rank 0 alone */
    if (from_last(p, rows, n * sizeof(float), (uint32_t)p->L, n, p->defer ? 1 : last, 8,
                  p->defer ? "the logits, from the last stage to rank 0" : "the logits, from the last stage", err, cap))
        return -1;
#else
    (void)p, (void)rows, (void)n, (void)V, (void)dst, (void)at, (void)m, (void)err, (void)cap;
#endif
    return 0;
}

void ds41_pipe_defer(ds41_pipe *p, int on) {
    p->deferred_steps += on && !p->defer;
    p->defer = on;
}

int ds41_pipe_deferred(const ds41_pipe *p) { return p && p->defer; }
int ds41_pipe_stages(const ds41_pipe *p) { return p ? p->size : 1; }

int ds41_pipe_pending(const ds41_pipe *p) { return p->n_pend; }

int ds41_pipe_collect(ds41_pipe *p, int n, char *err, size_t cap) {
    int rc = 0;
    if (n < 0 || n > p->n_pend) n = p->n_pend;
    p->overlapped += n < p->n_pend;
#ifdef DS41_HAVE_MPI
    int last = p->size - 1;
    if (p->n_pend > p->max_pend) p->max_pend = p->n_pend;
    for (int i = 0; i < n; i++) {
        pending *q = &p->pend[i];
        double t0 = now_s();
        ds41_dist_wait(&q->r, 1, &last, "the logits, from the last stage");
        p->wait_s += now_s() - t0;
        if (!rc && check_hdr(q->buf, q->step, q->plan, last, (uint32_t)p->L, q->n, err, cap)) rc = -1;
        for (int j = 0; j < q->m && !rc; j++)
            memcpy(q->dst[j], q->buf + sizeof(hop_hdr) + q->at[j] * q->V * sizeof(float), q->V * sizeof(float));
        free(q->buf); free(q->dst); free(q->at);
    }
    if (n) memmove(p->pend, p->pend + n, (size_t)(p->n_pend - n) * sizeof *p->pend);
#else
    (void)err, (void)cap;
#endif
    p->n_pend -= n;
    return rc;
}

int ds41_pipe_ids(const ds41_pipe *p) { return p->size > 1 && !f.eager; }

void ds41_pipe_fetch(ds41_pipe *p, float *row, size_t V) {
#ifdef DS41_HAVE_MPI
    char err[512];
    if (from_last(p, row, V * sizeof(float), (uint32_t)p->L, 1, p->size - 1, 8, "the logits, from the last stage", err,
                  sizeof err))
        ds41_dist_fatal(1, "%s", err);
#else
    (void)p, (void)row, (void)V;
#endif
}

void ds41_pipe_reduced(ds41_pipe *p, void *data, size_t n) {
#ifdef DS41_HAVE_MPI
    char err[512];
    if (from_last(p, data, n, (uint32_t)p->L + 7, 1, 1, 8, "the logits' reduction, from the last stage", err, sizeof err))
        ds41_dist_fatal(1, "%s", err);
#else
    (void)p, (void)data, (void)n;
#endif
}

void ds41_pipe_token(ds41_pipe *p, int *id) {
#ifdef DS41_HAVE_MPI
    char err[512];
    int32_t v = *id;
    long long before = p->shared_bytes;
    if (from_last(p, &v, sizeof v, (uint32_t)p->L + 1, 1, p->size - 1, 9, "the sampled token, from the last stage", err,
                  sizeof err))
        ds41_dist_fatal(1, "%s", err);
    p->token_bytes += p->shared_bytes - before;
    p->shared_bytes = before;
    *id = v;
#else
    (void)p, (void)id;
#endif
}

int ds41_pipe_holds_last(const ds41_pipe *p, int l) { return l >= p->first[p->size - 1] && l < p->L; }

void ds41_pipe_spec(ds41_pipe *p, void *data, size_t n, uint32_t kind, const char *what) {
#ifdef DS41_HAVE_MPI
    char err[512];
    long long before = p->shared_bytes;
    if (from_last(p, data, n, (uint32_t)p->L + kind, 1, p->size - 1, 9, what, err, sizeof err)) ds41_dist_fatal(1, "%s", err);
    p->spec_bytes += p->shared_bytes - before;
    p->shared_bytes = before;
#else
    (void)p, (void)data, (void)n, (void)kind, (void)what;
#endif
}

void ds41_pipe_answer(ds41_pipe *p, void *data, size_t n, uint32_t kind, const char *what) {
#ifdef DS41_HAVE_MPI
    char err[512];
    long long before = p->shared_bytes;
    if (from_last(p, data, n, (uint32_t)p->L + kind, 1, 1, 9, what, err, sizeof err)) ds41_dist_fatal(1, "%s", err);
    p->spec_bytes += p->shared_bytes - before;
    p->shared_bytes = before;
#else
    (void)p, (void)data, (void)n, (void)kind, (void)what;
#endif
}

int ds41_pipe_step(int count, const long long *pos, const int *T, const int32_t *const *tokens, char *err, size_t cap) {
    ds41_pipe *p = open_pipe;
    uint64_t h = ds41_fnv(DS41_FNV0, &count, sizeof count);
    for (int i = 0; i < count; i++) {
        h = ds41_fnv(h, &pos[i], sizeof pos[i]);
        h = ds41_fnv(h, &T[i], sizeof T[i]);
        h = ds41_fnv(h, tokens[i], (size_t)T[i] * sizeof *tokens[i]);
    }
    if (p) p->plan = h;
    /* serve's pipelined step: no broadcast (rank 0 runs ahead of the other stages); the plan's
     * hash travels with the stream, stage to stage */
    if (p && p->defer) return 0;
    return ds41_dist_step(count, pos, T, tokens, err, cap);
}

int ds41_pipe_report(char *line, size_t cap) {
    const ds41_pipe *p = open_pipe;
    if (!p) return 0;
    const char *role = p->size == 1 ? " + embedding, head" : p->rank == 0 ? " + embedding" : p->rank == p->size - 1 ? " + head" : "";
    snprintf(line, cap, "pipe: layers %d..%d of %d%s; %llu forwards; stream received %lld hops %lld rows %lld "
             "bytes (%lld beside the stream), sent %lld hops %lld rows %lld bytes (%lld beside the stream; %lld B per row); logits sent %lld bytes, tokens %lld bytes, spec %lld bytes; %.3f s waiting; "
             "pipelined serve steps %lld, at most %d forwards in flight, %lld steps overlapped",
             p->lo, p->hi - 1, p->L, role, (unsigned long long)p->step, p->hops_recv, p->rows_recv, p->bytes_recv, p->side_recv,
             p->hops_sent, p->rows_sent, p->bytes_sent, p->side_sent, (long long)(p->hc * (p->dim + 1) * sizeof(float)), p->shared_bytes, p->token_bytes, p->spec_bytes, p->wait_s, p->deferred_steps,
             p->max_pend, p->overlapped);
    return 1;
}
