/* ds41 serve --role prefill|decode (docs/pd.md): the glue between the server and src/pd/.
 * Built with UCX (DS41_HAVE_UCX, Makefile); without it the roles say so and exit. */
#define _GNU_SOURCE
#include "serve.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve_metrics.h"
#include "serve_mpi.h"
#include "serve_sched.h"

#ifdef DS41_HAVE_UCX
#include "cache.h"
#include "dist.h"
#include "forward.h"
#include "pd.h"

/* ---- a prefill node that is an MPI job: rank 0's compute tells the other ranks each engine
 * call first (pd.h ds41_pd_mirror, serve_mpi.h OPEN, BLOCKS, PD_SEQ, RESTORE, PD_FWD, PUBLISH, CLOSE) */
typedef struct mpi_prefill {
    ds41_smirror *m;
    ds41_engine *e;
    ds41_prefix_cache *pc;
} mpi_prefill;

static void mp_open(void *c, ds41_session *s) { ds41_smirror_open(((mpi_prefill *)c)->m, s, 0); }
static void mp_load(void *c, ds41_session *s, const int32_t *ids, size_t n) {
    mpi_prefill *p = c;
    ds41_smirror_pd_load(p->m, p->pc, s, ids, n);
}
static void mp_seq(void *c, ds41_session *s, int stop, const int32_t *ids, size_t n) {
    ds41_smirror_pd_seq(((mpi_prefill *)c)->m, s, stop, ids, n);
}
static long long mp_restore(void *c, ds41_session *s, const int32_t *ids, size_t n) {
    mpi_prefill *p = c;
    return ds41_smirror_restore(p->m, p->e, p->pc, s, ids, n, NULL);
}
static void mp_forward(void *c, ds41_session *s, long long k, const int32_t *ids, size_t n) {
    ds41_smirror_pd_forward(((mpi_prefill *)c)->m, s, k, ids, n);
}
static void mp_publish(void *c, ds41_session *s, const int32_t *ids, size_t n) { ds41_smirror_publish(((mpi_prefill *)c)->m, s, ids, n); }
static void mp_close(void *c, ds41_session *s) { ds41_smirror_close(((mpi_prefill *)c)->m, s); }
static void mp_beat(void *c) { ds41_smirror_beat(((mpi_prefill *)c)->m); }
static void mp_end(void *c) { ds41_smirror_end(((mpi_prefill *)c)->m); }

typedef struct prefill_run {
    ds41_engine *e;
    ds41_prefix_cache *pc;
    const ds41_serve_opts *o;
    const ds41_pd_mirror *mirror;
    volatile sig_atomic_t stop;
    int rc;
    ds41_err err;
} prefill_run;

/* the node's counters: static, since a request's handler may outlive the node's shutdown wait */
static ds41_pd_prefill_stats g_stats;

static void *prefill_main(void *arg) {
    prefill_run *r = arg;
    ds41_pd_prefill_opts po = { .host = r->o->host, .port = r->o->port, .capacity = r->o->parallel,
                                .lease_ms = r->o->lease_ms, .decoder_on_decode = r->o->pd_decoder_decode,
                                .stats = &g_stats, .mirror = r->mirror };
    r->rc = ds41_pd_prefill_run(r->e, r->pc, &r->o->sp, &po, &r->stop, &r->err);
    if (r->rc) {
        fprintf(stderr, "ds41 serve --role prefill: %s\n", r->err.msg);
        kill(getpid(), SIGTERM);   /* wakes the sigwait of the main thread */
    }
    return NULL;
}

/* ---- the prefill node's HTTP (--http-port): GET /health and /metrics, nothing else */
typedef struct prefill_http {
    int capacity;
    char lbl[300];
} prefill_http;

static enum MHD_Result http_send(struct MHD_Connection *c, unsigned status, const char *type, char *body) {
    if (!body) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) { free(body); return MHD_NO; }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

/* Prometheus text of the node's counters (ds41:prefill_*) */
static char *prefill_metrics(const prefill_http *h) {
    const ds41_pd_prefill_stats *st = &g_stats;
    struct { const char *name, *type, *help; long long v; } m[] = {
        { "ds41:prefill_requests_total", "counter", "Remote prefills served (DONE sent).", atomic_load(&st->served) },
        { "ds41:prefill_failures_total", "counter",
          "Remote prefills that ended otherwise (busy, mismatch, bad request, a decode node gone, a failed prefill).",
          atomic_load(&st->failed) },
        { "ds41:prefill_busy_total", "counter", "Requests refused at capacity (--parallel).", atomic_load(&st->busy) },
        { "ds41:prefill_blocks_total", "counter", "128-token blocks shipped by the served requests.", atomic_load(&st->blocks) },
        { "ds41:kv_transfer_bytes_sent_total", "counter", "Frame bytes sent to decode nodes by the served requests, headers included.",
          atomic_load(&st->bytes) },
        { "ds41:prefill_requests_running", "gauge", "Requests held now.", atomic_load(&st->active) },
        { "ds41:prefill_capacity", "gauge", "Requests held at once at most (--parallel).", h->capacity },
    };
    size_t cap = 8192, n = 0;
    char *t = malloc(cap);
    for (size_t i = 0; t && i < sizeof m / sizeof m[0]; i++)
        n += (size_t)snprintf(t + n, cap - n, "# HELP %s %s\n# TYPE %s %s\n%s{%s} %lld\n", m[i].name, m[i].help, m[i].name,
                              m[i].type, m[i].name, h->lbl, m[i].v);
    return t;
}

static enum MHD_Result prefill_http_handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                            const char *version, const char *upload, size_t *upload_size, void **ptr) {
    (void)version; (void)upload;
    const prefill_http *h = cls;
    static int first;
    if (*ptr != &first) { *ptr = &first; return MHD_YES; }   /* headers only; the reply on the next call */
    if (*upload_size) { *upload_size = 0; return MHD_YES; }    /* a body is read and ignored */
    if (strcmp(method, "GET") && strcmp(method, "HEAD"))
        return http_send(c, 405, "application/json", strdup("{\"error\":\"a prefill node answers GET /health and /metrics only\"}"));
    if (!strcmp(url, "/metrics")) return http_send(c, 200, "text/plain; version=0.0.4", prefill_metrics(h));
    if (!strcmp(url, "/health")) {
        int up = atomic_load(&g_stats.listening);
        char *b = NULL;
        if (asprintf(&b, "{\"status\":\"%s\",\"role\":\"prefill\",\"requests_running\":%d,\"capacity\":%d}",
                     up ? "ok" : "not listening", atomic_load(&g_stats.active), h->capacity) < 0) b = NULL;
        return http_send(c, up ? 200 : 503, "application/json", b);
    }
    return http_send(c, 404, "application/json", strdup("{\"error\":\"not found: a prefill node answers GET /health and /metrics\"}"));
}

int ds41_serve_pd_prefill(ds41_engine *e, ds41_prefix_cache *pc, const ds41_serve_opts *o, const char *model_name,
                          const void *ss, ds41_smirror *mirror) {
    static mpi_prefill mp;
    static ds41_pd_mirror mh;
    prefill_run r = { .e = e, .pc = pc, .o = o };
    if (mirror) {
        mp = (mpi_prefill){ .m = mirror, .e = e, .pc = pc };
        mh = (ds41_pd_mirror){ .open = mp_open, .load = mp_load, .seq = mp_seq, .restore = mp_restore, .forward = mp_forward,
                               .publish = mp_publish, .close = mp_close, .beat = mp_beat, .end = mp_end, .ctx = &mp };
        r.mirror = &mh;
    }
    prefill_http h = { .capacity = o->parallel < 1 ? 1 : o->parallel };
    ds41_metrics_label(model_name, h.lbl, sizeof h.lbl);
    struct MHD_Daemon *d = NULL;
    if (o->pd_http_port >= 0) {
        struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV | AI_PASSIVE };
        struct addrinfo *ai = NULL;
        char port[16];
        snprintf(port, sizeof port, "%d", o->pd_http_port);
        const char *host = o->host ? o->host : "127.0.0.1";
        int gai = getaddrinfo(host, port, &hints, &ai);
        if (gai) { fprintf(stderr, "ds41 serve: --host %s: %s\n", host, gai_strerror(gai)); return 1; }
        d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0), 0, NULL, NULL,
                             prefill_http_handler, &h, MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_TIMEOUT,
                             10u, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)16384, MHD_OPTION_END);
        freeaddrinfo(ai);
        if (!d) { fprintf(stderr, "ds41 serve: --http-port: cannot listen on %s:%d: %s\n", host, o->pd_http_port, strerror(errno)); return 1; }
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
        fprintf(stderr, "ds41 prefill node: /health and /metrics on http://%s:%u\n", host, di ? di->port : (unsigned)o->pd_http_port);
    }
    pthread_t th;
    if (pthread_create(&th, NULL, prefill_main, &r)) {
        fprintf(stderr, "ds41 serve: cannot start the prefill node\n");
        if (d) MHD_stop_daemon(d);
        return 1;
    }
    int sig = 0;
    sigwait((const sigset_t *)ss, &sig);
    r.stop = 1;
    pthread_join(th, NULL);
    if (d) MHD_stop_daemon(d);
    return r.rc ? 1 : 0;
}

/* ---- a decode node that is an MPI job (serve_mpi.h, INSTALL): rank 0's fetch thread only
 * receives; the install and the fallback restore run on its scheduler thread (job_poll), each
 * recorded for the other ranks first, which do the same on their own cache and session */
typedef struct mpi_pd {
    ds41_smirror *m;          /* NULL: one process */
    ds41_engine *e;
    ds41_prefix_cache *pc;
    ds41_pd_client *cl;
} mpi_pd;
static mpi_pd g_mpi;

/* page_bytes[n_kv_sources] of e's cache (malloc'd), NULL when out of memory */
static size_t *page_sizes(const ds41_engine *e) {
    int ns = e->cfg->n_kv_sources;
    size_t *pb = malloc((size_t)(ns + 1) * sizeof *pb);
    for (int j = 0; pb && j < ns; j++) pb[j] = ds41_cache_page_bytes(e->cfg, j);
    return pb;
}

static long long mpi_install(void *ctx, ds41_session *s, const int32_t *ids, size_t n_prompt, const ds41_pd_fetched *f) {
    mpi_pd *c = ctx;
    size_t *pb = page_sizes(c->e);
    if (!pb) { fprintf(stderr, "ds41 serve: out of memory installing a remote prefill; ending the job\n"); abort(); }
    int here = ds41_smirror_install(c->m, c->pc, s, ids, n_prompt, (int)f->first, (int)(f->nb - f->first), f->pages, pb,
                                    c->e->cfg->n_kv_sources, f->resume, f->resume_len);
    free(pb);
    long long got = 0;
    if (here) {   /* under --dp-attention only the owner's cache takes the pages */
        ds41_prefix_insert(c->pc, ids, n_prompt, f->first, f->nb - f->first, f->pages);
        got = ds41_pd_install(c->pc, ds41_pd_client_geom(c->cl), s, ids, n_prompt, f);
    }
    return ds41_smirror_install_end(c->m, c->e, s, n_prompt, got);
}

static long long mpi_restore(void *ctx, ds41_session *s, const int32_t *ids, size_t n) {
    mpi_pd *c = ctx;
    return ds41_smirror_restore(c->m, c->e, c->pc, s, ids, n, NULL);
}

int ds41_serve_pd_follow_install(ds41_engine *e, ds41_prefix_cache *pc, ds41_session *s, const ds41_sop *op,
                                 long long *got_out, char *err, size_t errcap) {
    static ds41_kvx_geom g;
    *got_out = 0;
    static int have_g;
    if (!have_g) {
        ds41_err ge;
        if (ds41_pd_geom_of(e, &g, &ge)) return snprintf(err, errcap, "serve mirror: INSTALL: %s", ge.msg), -1;
        have_g = 1;
    }
    int ns = e->cfg->n_kv_sources;
    size_t *pb = page_sizes(e), per = 0;
    if (!pb) return snprintf(err, errcap, "out of memory"), -1;
    for (int j = 0; j < ns; j++) per += pb[j];
    if (op->blk_len != (size_t)op->nb * per) {
        free(pb);
        return snprintf(err, errcap, "serve mirror: INSTALL: %zu bytes of pages for %d blocks (this rank's model: %zu per block)",
                        op->blk_len, op->nb, per), -1;
    }
    uint8_t **pages = calloc((size_t)op->nb * (size_t)ns + 1, sizeof *pages);
    uint8_t *res = malloc(op->res_len);   /* aligned for the state's view */
    int rc = 0;
    size_t off = 0;
    for (size_t i = 0; pages && res && i < (size_t)op->nb * (size_t)ns; i++) {
        size_t len = pb[i % (size_t)ns];
        if (!(pages[i] = ds41_page_new(len))) break;
        memcpy(pages[i], op->blk + off, len);
        off += len;
    }
    if (!pages || !res || off != op->blk_len) {
        snprintf(err, errcap, "out of memory for a remote prefill's pages");
        rc = -1;
    } else {
        memcpy(res, op->res, op->res_len);
        ds41_pd_fetched f = { .pages = pages, .first = op->first, .nb = (long long)op->first + op->nb, .resume = res,
                              .resume_len = op->res_len };
        /* as rank 0: into the prefix cache, then the install (refused alike on every rank) */
        ds41_prefix_insert(pc, op->ids, op->n, f.first, op->nb, pages);
        long long got = ds41_pd_install(pc, &g, s, op->ids, op->n, &f);
        *got_out = got;
        if (getenv("DS41_MPI_VERBOSE"))
            fprintf(stderr, "ds41 serve [rank %d]: remote prefill of blocks %d..%d of session %d: %s\n", ds41_dist_rank(),
                    op->first, op->first + op->nb - 1, (int)op->id, got > 0 ? "state installed" : "refused, rank 0 restores");
    }
    for (size_t i = 0; pages && i < (size_t)op->nb * (size_t)ns; i++)
        if (pages[i]) ds41_page_unref(pages[i]);
    free(pages);
    free(res);
    free(pb);
    return rc;
}

/* the scheduler's remote interface (serve_sched.h) over ds41_pd_start (src/pd/pd.h) */
static int g_fail;
static void *job_start(void *ctx, ds41_session *s, const int32_t *ids, size_t n_prompt, size_t n_fetch, long long first) {
    return ds41_pd_start(ctx, s, ids, n_prompt, n_fetch, first, g_fail);
}

static int job_poll(void *job, long long *bytes, double *seconds, long long *hit, char *msg, size_t cap) {
    ds41_pd_result res;
    int st = ds41_pd_poll(job, &res, msg, cap);
    if (st != 0 && g_mpi.m) {
        /* under mpiexec: the install or the restore here, between the scheduler's records */
        ds41_pd_hooks h = { .install = mpi_install, .restore = mpi_restore, .ctx = &g_mpi };
        ds41_pd_complete(job, &h);
        ds41_pd_poll(job, &res, NULL, 0);
    }
    if (st != 0) { *bytes = res.bytes; *seconds = res.seconds; *hit = res.restored; }
    return st;
}

static void job_finish(void *job) { ds41_pd_finish(job); }

int ds41_serve_pd_decode(ds41_engine *e, ds41_prefix_cache *pc, const ds41_serve_opts *o, ds41_sched_params *sp,
                         void **client) {
    ds41_err err;
    if (!o->prefill_nodes) { fprintf(stderr, "ds41 serve: --role decode needs --prefill HOST:PORT[,...]\n"); return -1; }
    ds41_pd_client *cl = ds41_pd_client_open(e, pc, o->prefill_nodes, o->prefill_timeout_ms, &err);
    if (!cl) { fprintf(stderr, "ds41 serve: %s\n", err.msg); return -1; }
    if (sp->mirror) {
        ds41_pd_client_defer(cl);
        g_mpi = (mpi_pd){ .m = sp->mirror, .e = e, .pc = pc, .cl = cl };
    }
    sp->remote.ctx = cl;
    sp->remote.start = job_start;
    sp->remote.poll = job_poll;
    sp->remote.finish = job_finish;
    sp->remote.min_tokens = o->remote_min;
    sp->remote.fail = o->on_failure_fail;
    g_fail = o->on_failure_fail;
    *client = cl;
    fprintf(stderr, "ds41 serve: decode node: remote prefill on %s for prompts with at least %lld new tokens, "
            "on failure %s, timeout %d ms\n", o->prefill_nodes, o->remote_min, o->on_failure_fail ? "fail" : "local",
            o->prefill_timeout_ms);
    return 0;
}

void ds41_serve_pd_close(void *client) { ds41_pd_client_close(client); }

#else

static int no_ucx(void) {
    fprintf(stderr, "ds41 serve: --role prefill|decode needs UCX, and this ds41 was built without it "
            "(install libucx-dev, then make)\n");
    return 1;
}
int ds41_serve_pd_prefill(ds41_engine *e, ds41_prefix_cache *pc, const ds41_serve_opts *o, const char *model_name,
                          const void *ss, ds41_smirror *mirror) {
    (void)e; (void)pc; (void)o; (void)model_name; (void)ss; (void)mirror;
    return no_ucx();
}
int ds41_serve_pd_decode(ds41_engine *e, ds41_prefix_cache *pc, const ds41_serve_opts *o, ds41_sched_params *sp,
                         void **client) {
    (void)e; (void)pc; (void)o; (void)sp; (void)client;
    return -no_ucx();
}
void ds41_serve_pd_close(void *client) { (void)client; }
int ds41_serve_pd_follow_install(ds41_engine *e, ds41_prefix_cache *pc, ds41_session *s, const ds41_sop *op,
                                 long long *got, char *err, size_t errcap) {
    (void)e; (void)pc; (void)s; (void)op;
    *got = 0;
    return snprintf(err, errcap, "serve mirror: rank 0 sent INSTALL (serve --role decode) and this ds41 was built without UCX"), -1;
}

#endif
