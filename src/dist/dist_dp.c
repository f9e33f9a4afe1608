/* ds41 serve --dp-attention (dist.h, docs/distributed.md): the expert exchange when each rank
 * runs only its own sequences' forwards.
 *
 * Per MoE sublayer, in two rounds of point-to-point messages (so that a silent rank is named
 * by --mpi-timeout, as in the replicated exchange):
 *   B  to every peer, the rows with at least one of their k choices on that peer's experts
 *      (the sublayer's normed input, FP32, with all k choices and routing weights) behind a
 *      header that counts them; each rank then runs its own experts once over its own rows and
 *      every row it received, stacked (the rows one process would run them on, in another
 *      order: rows are independent);
 *   C  the outputs go back in (row, choice) order; each rank adds its rows' k outputs in
 *      ascending expert id, as one process does, so every row is bit-identical to one process.
 * Lock step: a forward starts with a round in which every rank says whether it runs one, and
 * over how many rows (ds41_dist_dp_forward, from the step hook: a peer's rows message then has
 * room waiting without a round of counts); a rank that runs none, or whose forward skipped
 * a layer (a prompt part that reaches no further), joins the exchange with zero rows. The
 * forward loop sees only the dispatch.
 * DSpark proposals (serve --spec): a stage's MoE sublayer is layer n_layers + s of the
 * placement. A proposal is a forward of its own, started by its first stage's exchange (no
 * step hook runs before it), whose start round says so: a round then walks the stage layers
 * instead of the backbone's, and has no Engram exchange. A round holds backbone forwards or
 * proposals, never both (the serve mirror runs a proposal while the other ranks wait in
 * ds41_dist_dp_done). */
#include "dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int dp_on;

void ds41_dist_set_dp(int on) { dp_on = on != 0; }
int ds41_dist_dp(void) { return dp_on; }
int ds41_dist_engram_shards(void) { return ds41_dist_size(); }

#ifdef DS41_HAVE_MPI

enum { TAG_ROWS = 311, TAG_OUT, TAG_SYNC };
#define DMAGIC 0x50444434u

typedef struct dhdr {
    uint32_t magic, layer, rows, k;
} dhdr;

static struct {
    const ds41_config *cfg;
    const ds41_weights *w;
    const ds41_ctx *ctx;       /* the engine's: its kernels run the rows peers route here */
    uint8_t *own;              /* [layers][n_exp]: this rank's experts */
    int n_exp, N, me, n_layers;   /* n_layers: the placement's (the backbone's, then DSpark's stages) */
    int in_fwd, next;          /* a forward of this rank is under way; the next layer it exchanges */
    int lo, hi;                /* the round's layers: the backbone's [0, n_layers) or the stages' [n_layers, all) */
    /* the round under way */
    int layer, T, k;
    long long sent, recv;
    dhdr *hout;                /* [N]: the rows each peer gets from here */
    int *maxin;                /* [N]: rows of each peer's forward (0: it runs none), from the round that started it */
    size_t *roff;              /* [N]: where peer q's rows message lands in rbuf */
    int *pin;                  /* [N + 1]: peer q's rows are rows pin[q] .. pin[q + 1] of the stack (own rows first) */
    size_t *oin;               /* [N + 1]: where peer q's outputs for this rank's rows start in ibuf */
    float *sbuf, *rbuf, *x, *wts, *slots, *ibuf, *obuf;
    int *sel;
    size_t sbuf_cap, rbuf_cap, x_cap, wts_cap, slots_cap, ibuf_cap, obuf_cap, sel_cap;
    MPI_Request *req;
    int *peer, nreq;
} d;

static void need(void *pp, size_t *cap, size_t n, size_t elem) {
    if (n <= *cap) return;
    void *p = realloc(*(void **)pp, n * elem);
    if (!p) ds41_dist_fatal(1, "out of memory for the expert exchange (%zu values)", n);
    *(void **)pp = p;
    *cap = n;
}

/* The routed experts per token of backbone layer l, as ds41_moe counts them (0: none routed,
 * no exchange). */
static int layer_k(int l) {
    const ds41_layer_plan *lp = &d.cfg->layers[l];
    int E = lp->n_experts, k = lp->n_active;
    if (E > d.w->layers[l].n_experts) E = d.w->layers[l].n_experts;
    if (k > E) k = E;
    return E > 0 && k > 0 ? k : 0;
}

/* The rank that runs choice e of layer l; -1 for an id outside the layer (never routed). */
static int owner(int l, int e) {
    return e >= 0 && e < d.n_exp ? ds41_dist_owner(ds41_dist_placement(), l, e) : -1;
}

/* Rank q runs one of the k choices sel[0..k) (a row goes once to each rank it needs). */
static int row_to(const int *sel, int k, int l, int q) {
    for (int i = 0; i < k; i++)
        if (owner(l, sel[i]) == q) return 1;
    return 0;
}

static void post(void *buf, size_t bytes, int q, int tag, int send) {
    if (bytes > (size_t)INT32_MAX)
        ds41_dist_fatal(1, "expert exchange message of %zu bytes is too large for one message; feed shorter chunks", bytes);
    d.peer[d.nreq] = q;
    if (send) MPI_Isend(buf, (int)bytes, MPI_BYTE, q, tag, MPI_COMM_WORLD, &d.req[d.nreq++]);
    else MPI_Irecv(buf, (int)bytes, MPI_BYTE, q, tag, MPI_COMM_WORLD, &d.req[d.nreq++]);
    if (send) d.sent += (long long)bytes;
    else d.recv += (long long)bytes;
}

static void wait_posted(const char *phase) {
    char what[96];
    if (d.layer >= 0) snprintf(what, sizeof what, "expert exchange of layer %d (%s)", d.layer, phase);
    else snprintf(what, sizeof what, "%s", phase);
    ds41_dist_wait(d.req, d.nreq, d.peer, what);
    d.nreq = 0;
}

/* Round B, this rank's experts over the stacked rows, round C posted. Each rows message
 * starts with a header (4 words) saying how many rows follow; a peer's message is received
 * into room for every row of its forward (announced in the round that started it), so that no
 * round of counts goes first. r = NULL: this rank brings no rows (it runs no forward, or its
 * forward skipped the layer). */
static void round_begin(const ds41_ctx *ctx, int l, const ds41_moe_rows *r) {
    int N = d.N, me = d.me, k = layer_k(l), dim = d.cfg->dim, T = r ? r->T : 0;
    if (r && r->k != k) ds41_dist_fatal(1, "expert exchange: layer %d routes %d experts per token, its plan %d", l, r->k, k);
    ds41_dist_engram_dp_progress(l);   /* Engram rows read for the peers go out once they are in */
    d.layer = l;
    d.T = T;
    d.k = k;
    d.sent = d.recv = 0;
    size_t rec = (size_t)dim + 2 * (size_t)k, hw = sizeof(dhdr) / sizeof(float);   /* a row: x, k ids, k weights */
    /* B: to each peer its rows behind their header; from each, room for its forward's rows */
    size_t nsend = 0, nroom = 0;
    for (int q = 0; q < N; q++) {
        d.hout[q] = (dhdr){ DMAGIC, (uint32_t)l, 0, (uint32_t)k };
        for (int t = 0; t < T && q != me; t++) d.hout[q].rows += (uint32_t)row_to(r->sel + (size_t)t * k, k, l, q);
        if (q == me) continue;
        nsend += hw + d.hout[q].rows * rec;
        d.roff[q] = nroom;
        nroom += hw + (size_t)d.maxin[q] * rec;
    }
    need(&d.sbuf, &d.sbuf_cap, nsend + 1, sizeof(float));
    need(&d.rbuf, &d.rbuf_cap, nroom + 1, sizeof(float));
    for (int q = 0; q < N; q++)
        if (q != me) post(d.rbuf + d.roff[q], (hw + (size_t)d.maxin[q] * rec) * sizeof(float), q, TAG_ROWS, 0);
    float *p = d.sbuf;
    for (int q = 0; q < N; q++) {
        if (q == me) continue;
        float *p0 = p;
        memcpy(p, &d.hout[q], sizeof(dhdr));
        p += hw;
        for (int t = 0; t < T; t++) {
            const int *st = r->sel + (size_t)t * k;
            if (!row_to(st, k, l, q)) continue;
            memcpy(p, r->x + (size_t)t * dim, (size_t)dim * sizeof(float));
            memcpy(p + dim, st, (size_t)k * sizeof(int));
            memcpy(p + dim + k, r->wts + (size_t)t * k, (size_t)k * sizeof(float));
            p += rec;
        }
        post(p0, (size_t)(p - p0) * sizeof(float), q, TAG_ROWS, 1);
    }
    wait_posted("rows");
    /* the stack: this rank's rows first, then each peer's in rank order */
    size_t Tall = (size_t)T;
    for (int q = 0; q < N; q++) {
        d.pin[q] = (int)Tall;
        if (q == me) continue;
        dhdr h;
        memcpy(&h, d.rbuf + d.roff[q], sizeof h);
        if (h.magic != DMAGIC || h.layer != (uint32_t)l || h.k != (uint32_t)k || h.rows > (uint32_t)d.maxin[q])
            ds41_dist_fatal(4, "rank %d answered another expert exchange (layer %u, %u experts per token, %u rows of at most "
                               "%d) than this rank's (layer %d): the ranks' steps differ; ending the job",
                            q, h.layer, h.k, h.rows, d.maxin[q], l);
        Tall += h.rows;
    }
    d.pin[N] = (int)Tall;
    need(&d.x, &d.x_cap, Tall * dim + 1, sizeof(float));
    need(&d.sel, &d.sel_cap, Tall * k + 1, sizeof(int));
    need(&d.wts, &d.wts_cap, Tall * k + 1, sizeof(float));
    need(&d.slots, &d.slots_cap, Tall * k * dim + 1, sizeof(float));
    if (T > 0) {
        memcpy(d.x, r->x, (size_t)T * dim * sizeof(float));
        memcpy(d.sel, r->sel, (size_t)T * k * sizeof(int));
        memcpy(d.wts, r->wts, (size_t)T * k * sizeof(float));
    }
    for (int q = 0; q < N; q++) {
        if (q == me) continue;
        const float *src = d.rbuf + d.roff[q] + hw;
        for (size_t t = (size_t)d.pin[q]; t < (size_t)d.pin[q + 1]; t++, src += rec) {
            memcpy(d.x + t * dim, src, (size_t)dim * sizeof(float));
            memcpy(d.sel + t * k, src + dim, (size_t)k * sizeof(int));
            memcpy(d.wts + t * k, src + dim + k, (size_t)k * sizeof(float));
        }
    }
    /* this rank's experts, once over every row routed to them */
    const ds41_layer_weights *lw = &d.w->layers[l];
    ds41_moe_rows all = { d.cfg, lw, d.x, (int)Tall, k, d.sel, d.wts };
    if (Tall > 0 && ds41_moe_experts(ctx, &all, d.own + (size_t)l * d.n_exp, NULL, d.slots))
        ds41_dist_fatal(1, "out of memory in the experts of layer %d", l);
    /* C: each peer's outputs back, in (row, choice) order; this rank's rows' outputs from
     * their owners into ibuf */
    size_t no = 0, ni = 0;
    for (int q = 0; q < N; q++) {
        if (q == me) continue;
        for (size_t i = (size_t)d.pin[q] * k; i < (size_t)d.pin[q + 1] * k; i++) no += owner(l, d.sel[i]) == me;
        for (size_t i = 0; i < (size_t)T * k; i++) ni += owner(l, d.sel[i]) == q;
    }
    need(&d.obuf, &d.obuf_cap, no * dim + 1, sizeof(float));
    need(&d.ibuf, &d.ibuf_cap, ni * dim + 1, sizeof(float));
    float *o = d.obuf;
    size_t io = 0;
    for (int q = 0; q < N; q++) {
        if (q == me) continue;
        float *o0 = o;
        for (size_t i = (size_t)d.pin[q] * k; i < (size_t)d.pin[q + 1] * k; i++) {
            if (owner(l, d.sel[i]) != me) continue;
            memcpy(o, d.slots + i * dim, (size_t)dim * sizeof(float));
            o += dim;
        }
        post(o0, (size_t)(o - o0) * sizeof(float), q, TAG_OUT, 1);
        size_t c = 0;
        for (size_t i = 0; i < (size_t)T * k; i++) c += owner(l, d.sel[i]) == q;
        d.oin[q] = io;
        post(d.ibuf + io, c * dim * sizeof(float), q, TAG_OUT, 0);
        io += c * dim;
    }
}

/* Round C completed: the peers' outputs into this rank's slots, then acc[t] += the k outputs
 * of row t in ascending expert id (the additions of one process, in its order). */
static void round_end(const ds41_moe_rows *r, float *acc) {
    int l = d.layer, T = d.T, k = d.k, dim = d.cfg->dim;
    wait_posted("outputs");
    for (int q = 0; q < d.N; q++) {
        if (q == d.me) continue;
        const float *p = d.ibuf + d.oin[q];
        for (size_t i = 0; i < (size_t)T * k; i++) {
            if (owner(l, d.sel[i]) != q) continue;
            memcpy(d.slots + i * dim, p, (size_t)dim * sizeof(float));
            p += dim;
        }
    }
    ds41_dist_count(T, d.sent, d.recv);
    if (r) ds41_dist_combine(r, d.slots, acc);
}

/* Zero-row rounds for the routed layers [d.next, upto) of this rank's forward. */
static void skip_to(const ds41_ctx *ctx, int upto) {
    for (int l = d.next; l < upto; l++)
        if (layer_k(l)) {
            round_begin(ctx, l, NULL);
            round_end(NULL, NULL);
        }
    if (upto > d.next) d.next = upto;
}

/* the kinds of forward a start round announces */
enum { FWD_NONE = 0, FWD_BACKBONE = 1, FWD_DRAFT = 2 };

/* Every rank says whether it runs a forward now, of which kind, and over how many rows (0:
 * none; the most any layer of it can send a peer); the round's layers follow from the kinds.
 * Returns the kind of the round's forwards (FWD_NONE when no rank runs one). */
static int sync_round(int rows, int kind) {
    int32_t out[3] = { (int32_t)DMAGIC, rows, rows > 0 ? kind : FWD_NONE }, in[3 * 64];
    int32_t *inb = d.N <= 64 ? in : malloc(3 * (size_t)d.N * sizeof *inb);
    if (!inb) ds41_dist_fatal(1, "out of memory for the forward round");
    ds41_dist_engram_dp_progress(-1);   /* every peer's Engram rows are out before a new round */
    d.layer = -1;
    for (int q = 0; q < d.N; q++)
        if (q != d.me) post(inb + 3 * q, sizeof out, q, TAG_SYNC, 0);
    for (int q = 0; q < d.N; q++)
        if (q != d.me) post(out, sizeof out, q, TAG_SYNC, 1);
    wait_posted("start of a forward");
    int kinds = out[2];
    for (int q = 0; q < d.N; q++) {
        d.maxin[q] = 0;
        if (q == d.me) continue;
        const int32_t *v = inb + 3 * q;
        if (v[0] != (int32_t)DMAGIC || v[1] < 0 || v[1] > (1 << 24) || v[2] < FWD_NONE || v[2] > FWD_DRAFT ||
            (v[1] > 0) != (v[2] != FWD_NONE))
            ds41_dist_fatal(4, "rank %d answered another exchange than the start of a forward: the ranks' steps differ; "
                               "ending the job", q);
        d.maxin[q] = v[1];
        kinds |= v[2];
    }
    if (inb != in) free(inb);
    if (kinds == (FWD_BACKBONE | FWD_DRAFT))
        ds41_dist_fatal(4, "a forward and a DSpark proposal started in the same round: the ranks' steps differ; ending the job");
    d.lo = kinds == FWD_DRAFT ? d.cfg->n_layers : 0;
    d.hi = kinds == FWD_DRAFT ? d.n_layers : d.cfg->n_layers;
    return kinds;
}

static void finish_forward(void);

static void dp_begin(void *self, const ds41_ctx *ctx, const ds41_moe_rows *r) {
    (void)self;
    long li = r->lw - d.w->layers;
    if (li < 0 || li >= d.n_layers) ds41_dist_fatal(1, "expert exchange: layer weights outside the model's layers");
    d.ctx = ctx;
    if (li >= d.cfg->n_layers && !(d.in_fwd && d.lo == d.cfg->n_layers && li >= d.next)) {
        /* a DSpark proposal's first stage: its own forward (no step hook ran before it) */
        finish_forward();
        if (r->T < 1 || r->T > (1 << 24)) ds41_dist_fatal(1, "expert exchange: a proposal of %d rows (1..%d)", r->T, 1 << 24);
        sync_round(r->T, FWD_DRAFT);
        d.in_fwd = 1;
        d.next = d.lo;
    }
    if (!d.in_fwd || li < d.next || li >= d.hi) ds41_dist_fatal(1, "expert exchange of layer %ld outside this rank's forward", li);
    skip_to(ctx, (int)li);
    round_begin(ctx, (int)li, r);
    d.next = (int)li + 1;
}

static void dp_end(void *self, const ds41_ctx *ctx, const ds41_moe_rows *r, float *acc) {
    (void)self;
    (void)ctx;
    round_end(r, acc);
}

/* The rest of this rank's forward: the layers it did not reach. */
static void finish_forward(void) {
    if (!d.in_fwd) return;
    if (!d.ctx) ds41_dist_fatal(1, "expert exchange: a forward ended before its first MoE sublayer and no kernels are known");
    skip_to(d.ctx, d.hi);
    d.in_fwd = 0;
}

int ds41_dist_dp_rows(int q) { return q >= 0 && q < d.N && d.maxin ? d.maxin[q] : 0; }

void ds41_dist_dp_forward(int rows) {
    finish_forward();
    if (rows < 1 || rows > (1 << 24)) ds41_dist_fatal(1, "expert exchange: a forward of %d rows (1..%d)", rows, 1 << 24);
    sync_round(rows, FWD_BACKBONE);
    d.in_fwd = 1;
    d.next = d.lo;
}

void ds41_dist_dp_done(const ds41_ctx *ctx) {
    if (ds41_dist_size() < 2 || !dp_on) return;
    d.ctx = ctx;
    finish_forward();
    int kind;
    while ((kind = sync_round(0, FWD_NONE)) != FWD_NONE) {
        if (kind == FWD_BACKBONE) ds41_dist_engram_dp_serve();   /* the forwards' Engram row requests come first */
        d.next = d.lo;
        skip_to(ctx, d.hi);
    }
}

enum { TAG_ANSWER = 320 };

void ds41_dist_dp_send0(const void *buf, size_t n) {
    if (!n || ds41_dist_rank() == 0) return;
    MPI_Request rq;
    int p0 = 0;
    if (n > (size_t)INT32_MAX) ds41_dist_fatal(1, "a step's answer of %zu bytes is too large for one message", n);
    MPI_Isend(buf, (int)n, MPI_BYTE, 0, TAG_ANSWER, MPI_COMM_WORLD, &rq);
    ds41_dist_wait(&rq, 1, &p0, "step answer to rank 0");
}

void ds41_dist_dp_recv0(void *const *buf, const size_t *n) {
    int N = ds41_dist_size(), m = 0;
    MPI_Request *rq = calloc((size_t)N, sizeof *rq);
    int *peer = calloc((size_t)N, sizeof *peer);
    if (!rq || !peer) ds41_dist_fatal(1, "out of memory for the step's answers");
    for (int q = 1; q < N; q++) {
        if (!n[q]) continue;
        if (n[q] > (size_t)INT32_MAX) ds41_dist_fatal(1, "a step's answer of %zu bytes is too large for one message", n[q]);
        peer[m] = q;
        MPI_Irecv(buf[q], (int)n[q], MPI_BYTE, q, TAG_ANSWER, MPI_COMM_WORLD, &rq[m++]);
    }
    ds41_dist_wait(rq, m, peer, "the step's answers");
    free(rq);
    free(peer);
}

const ds41_moe_dispatch *ds41_dist_dp_dispatch(const ds41_config *cfg, const ds41_weights *w) {
    static ds41_moe_dispatch disp = { NULL, dp_begin, dp_end };
    const ds41_placement *pl = ds41_dist_placement();
    d.cfg = cfg;
    d.w = w;
    d.N = ds41_dist_size();
    d.me = ds41_dist_rank();
    d.n_exp = pl->n_experts;
    d.n_layers = pl->n_layers;
    free(d.own); free(d.hout); free(d.maxin); free(d.roff); free(d.pin); free(d.oin); free(d.req); free(d.peer);
    d.own = calloc((size_t)pl->n_layers * (pl->n_experts ? pl->n_experts : 1), 1);
    d.maxin = calloc((size_t)d.N, sizeof *d.maxin);
    d.roff = calloc((size_t)d.N, sizeof *d.roff);
    d.hout = calloc((size_t)d.N, sizeof *d.hout);
    d.pin = calloc((size_t)d.N + 1, sizeof *d.pin);
    d.oin = calloc((size_t)d.N + 1, sizeof *d.oin);
    d.req = calloc(2 * (size_t)d.N, sizeof *d.req);
    d.peer = calloc(2 * (size_t)d.N, sizeof *d.peer);
    if (!d.own || !d.maxin || !d.roff || !d.hout || !d.pin || !d.oin || !d.req || !d.peer)
        ds41_dist_fatal(1, "out of memory for the expert exchange");
    for (int l = 0; l < pl->n_layers; l++)
        for (int e = 0; e < pl->n_experts; e++) d.own[(size_t)l * pl->n_experts + e] = ds41_dist_owner(pl, l, e) == d.me;
    d.in_fwd = d.next = 0;
    return &disp;
}

#else /* one process: every sequence is this process's */

void ds41_dist_dp_done(const ds41_ctx *ctx) { (void)ctx; }
void ds41_dist_dp_send0(const void *buf, size_t n) { (void)buf; (void)n; }
void ds41_dist_dp_recv0(void *const *buf, const size_t *n) { (void)buf; (void)n; }

#endif
