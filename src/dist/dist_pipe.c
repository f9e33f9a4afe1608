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
} f;

int ds41_pipe_flag(const char *a, const char *v, char *err, size_t cap) {
    if (!strcmp(a, "--split")) {
        if (!v || (strcmp(v, "experts") && strcmp(v, "layers"))) {
            snprintf(err, cap, "--split: '%s' is neither experts (the default) nor layers", v ? v : "");
            return -1;
        }
        f.set = 1;
        f.layers = !strcmp(v, "layers");
        return 1;
    }
    if (!strcmp(a, "--layer-map")) {
        if (!v || !*v) {
            snprintf(err, cap, "--layer-map needs ranges, one LO-HI per rank (e.g. 0-3,4-7)");
            return -1;
        }
        f.map = v;
        return 1;
    }
    return 0;
}

int ds41_pipe_on(void) { return f.layers; }
const char *ds41_pipe_layer_map(void) { return f.map; }

uint64_t ds41_pipe_flags_hash(uint64_t h) {
    h = ds41_fnv(h, &f.layers, sizeof f.layers);
    return f.map ? ds41_fnv(h, f.map, strlen(f.map) + 1) : h;
}

typedef struct hop_hdr {
    uint32_t magic, layer;
    uint64_t step, rows;
} hop_hdr;
#define PMAGIC 0x50495045u

struct ds41_pipe {
    int rank, size, lo, hi, L;
    int *first;
    size_t hc, dim;
    unsigned char *buf;
    size_t cap;
    uint64_t step;              /* forwards so far (the header's step) */
    long long hops_sent, rows_sent, bytes_sent, hops_recv, rows_recv, bytes_recv, shared_bytes;
    double wait_s;
#ifdef DS41_HAVE_MPI
    MPI_Comm comm;
#endif
};
static ds41_pipe *open_pipe;    /* for the report at the end */

int ds41_pipe_first(const ds41_pipe *p) { return p->rank == 0; }
int ds41_pipe_last(const ds41_pipe *p) { return p->rank == p->size - 1; }

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
        open_pipe = &last;
    }
#ifdef DS41_HAVE_MPI
    MPI_Comm_free(&p->comm);
#endif
    free(p->first);
    free(p->buf);
    free(p);
}

static int reserve(ds41_pipe *p, size_t n, char *err, size_t cap) {
    if (n <= p->cap) return 0;
    unsigned char *b = realloc(p->buf, n);
    if (!b) { snprintf(err, cap, "out of memory for a %zu-byte stage message", n); return -1; }
    p->buf = b;
    p->cap = n;
    return 0;
}

#ifdef DS41_HAVE_MPI
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

static int check_hdr(const ds41_pipe *p, int q, uint32_t layer, uint64_t rows, char *err, size_t cap) {
    hop_hdr h;
    memcpy(&h, p->buf, sizeof h);
    if (h.magic != PMAGIC || h.step != p->step || h.layer != layer || h.rows != rows) {
        snprintf(err, cap, "--split layers: rank %d sent step %llu layer %u with %llu rows, this rank expected step %llu "
                 "layer %u with %llu rows (the ranks' steps differ)", q, (unsigned long long)h.step, h.layer,
                 (unsigned long long)h.rows, (unsigned long long)p->step, layer, (unsigned long long)rows);
        return -1;
    }
    return 0;
}
#endif

int ds41_pipe_layer(ds41_pipe *p, float *X, float *pre, int l, size_t k0, size_t N, char *err, size_t cap) {
    if (l == 0) p->step++;
#ifdef DS41_HAVE_MPI
    int recv = l == p->lo && l > 0, send = l == p->hi && l < p->L;
    if (recv || send) {
        size_t rows = N - k0, xs = rows * p->hc * p->dim * sizeof(float), ps = rows * p->hc * sizeof(float);
        size_t len = sizeof(hop_hdr) + xs + ps;
        if (len > (size_t)0x7fffffff) {
            snprintf(err, cap, "--split layers: %zu rows of the stream do not fit one MPI message", rows);
            return -1;
        }
        if (reserve(p, len, err, cap)) return -1;
        char what[96];
        if (send) {
            hop_hdr h = { PMAGIC, (uint32_t)l, p->step, rows };
            memcpy(p->buf, &h, sizeof h);
            memcpy(p->buf + sizeof h, X + k0 * p->hc * p->dim, xs);
            memcpy(p->buf + sizeof h + xs, pre + k0 * p->hc, ps);
            snprintf(what, sizeof what, "the stream into layer %d, to the next stage", l);
            move(p, 1, p->rank + 1, len, what);
            p->hops_sent++, p->rows_sent += (long long)rows, p->bytes_sent += (long long)len;
        } else {
            snprintf(what, sizeof what, "the stream into layer %d, from the stage before", l);
            move(p, 0, p->rank - 1, len, what);
            if (check_hdr(p, p->rank - 1, (uint32_t)l, rows, err, cap)) return -1;
            memcpy(X + k0 * p->hc * p->dim, p->buf + sizeof(hop_hdr), xs);
            memcpy(pre + k0 * p->hc, p->buf + sizeof(hop_hdr) + xs, ps);
            p->hops_recv++, p->rows_recv += (long long)rows, p->bytes_recv += (long long)len;
        }
    }
#else
    (void)X, (void)pre, (void)k0, (void)N, (void)err, (void)cap;
#endif
    return l >= p->lo && l < p->hi;
}

int ds41_pipe_share(ds41_pipe *p, float *rows, size_t n, char *err, size_t cap) {
#ifdef DS41_HAVE_MPI
    size_t len = sizeof(hop_hdr) + n * sizeof(float);
    if (len > (size_t)0x7fffffff) {
        snprintf(err, cap, "--split layers: %zu logits do not fit one MPI message", n);
        return -1;
    }
    if (reserve(p, len, err, cap)) return -1;
    int last = p->size - 1;
    if (p->rank == last) {
        hop_hdr h = { PMAGIC, (uint32_t)p->L, p->step, n };
        memcpy(p->buf, &h, sizeof h);
        memcpy(p->buf + sizeof h, rows, n * sizeof(float));
        MPI_Request *r = malloc((size_t)last * sizeof *r);
        int *peer = malloc((size_t)last * sizeof *peer);
        if (!r || !peer) { free(r); free(peer); snprintf(err, cap, "out of memory"); return -1; }
        double t0 = now_s();
        for (int q = 0; q < last; q++) {
            peer[q] = q;
            MPI_Isend(p->buf, (int)len, MPI_BYTE, q, 8, p->comm, &r[q]);
        }
        ds41_dist_wait(r, last, peer, "the logits, from the last stage to every rank");
        p->wait_s += now_s() - t0;
        p->shared_bytes += (long long)len * last;
        free(r);
        free(peer);
    } else {
        MPI_Request r;
        double t0 = now_s();
        MPI_Irecv(p->buf, (int)len, MPI_BYTE, last, 8, p->comm, &r);
        ds41_dist_wait(&r, 1, &last, "the logits, from the last stage");
        p->wait_s += now_s() - t0;
        if (check_hdr(p, last, (uint32_t)p->L, n, err, cap)) return -1;
        memcpy(rows, p->buf + sizeof(hop_hdr), n * sizeof(float));
    }
#else
    (void)p, (void)rows, (void)n, (void)err, (void)cap;
#endif
    return 0;
}

int ds41_pipe_report(char *line, size_t cap) {
    const ds41_pipe *p = open_pipe;
    if (!p) return 0;
    const char *role = p->size == 1 ? " + embedding, head" : p->rank == 0 ? " + embedding" : p->rank == p->size - 1 ? " + head" : "";
    snprintf(line, cap, "pipe: layers %d..%d of %d%s; %llu forwards; stream received %lld hops %lld rows %lld "
             "bytes, sent %lld hops %lld rows %lld bytes (%lld B per row); logits sent %lld bytes; %.3f s waiting",
             p->lo, p->hi - 1, p->L, role, (unsigned long long)p->step, p->hops_recv, p->rows_recv, p->bytes_recv, p->hops_sent, p->rows_sent,
             p->bytes_sent, (long long)(p->hc * (p->dim + 1) * sizeof(float)), p->shared_bytes, p->wait_s);
    return 1;
}
