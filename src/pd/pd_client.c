/* ds41 decode node's side of a remote prefill (pd.h, docs/pd.md): one connection per request,
 * the handshake (compatibility hash), the request, then every LAYER frame checked (request id,
 * sequence number, store, layer, block range, page size, each page exactly once) and the RESUME
 * frame checked against this node's cache (after every page, exactly once) before DONE lets the
 * pages into the prefix cache and the state into the request's session. Anything else (a refused handshake, a corrupt, truncated
 * or unexpected frame, a node that dies or stays silent past the timeout) fails the fetch and
 * leaves the cache as it was: the caller prefills locally (or fails, --on-prefill-failure). */
#define _GNU_SOURCE
#include "pd.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "forward.h"
#include "kvx_ucx.h"

#define BT DS41_PAGE_TOKENS
#define MAX_NODES 64

typedef struct pd_node {
    char host[256];
    int port;
    _Atomic int inflight;
} pd_node;

struct ds41_pd_client {
    ds41_engine *e;
    ds41_prefix_cache *pc;
    ds41_kvx_net *net;
    int n_nodes;
    pd_node nodes[MAX_NODES];
    int timeout_ms;
    ds41_kvx_geom geom;       /* this node's cache, as a RESUME payload must describe it */
    int defer;                /* under mpiexec: jobs only fetch; the caller completes (ds41_pd_complete) */
    _Atomic unsigned rr;
    _Atomic unsigned long long next_id;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int ds41_pd_fault(const char *kind) {
    static _Atomic int count;
    const char *f = getenv("DS41_PD_FAULT");
    size_t k = strlen(kind);
    if (!f || strncmp(f, kind, k) || f[k] != ':') return 0;
    int n = atoi(f + k + 1);
    return atomic_fetch_add(&count, 1) + 1 == n;
}

ds41_pd_client *ds41_pd_client_open(ds41_engine *e, ds41_prefix_cache *pc, const char *nodes, int timeout_ms,
                                    ds41_err *err) {
    if (!pc) { ds41_errf(err, "--role decode needs the prefix cache (remote prefills arrive as its blocks)"); return NULL; }
    ds41_pd_client *cl = calloc(1, sizeof *cl);
    if (!cl) { ds41_errf(err, "out of memory"); return NULL; }
    cl->e = e;
    cl->pc = pc;
    cl->timeout_ms = timeout_ms > 0 ? timeout_ms : 30000;
    atomic_init(&cl->next_id, ((unsigned long long)getpid() << 32) ^ (unsigned long long)time(NULL));
    const char *p = nodes;
    while (p && *p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        const char *colon = memrchr(p, ':', len);
        char *end = NULL;
        long port = colon ? strtol(colon + 1, &end, 10) : -1;
        if (!colon || colon == p || (size_t)(colon - p) >= sizeof cl->nodes[0].host || end != p + len || port < 1 ||
            port > 65535) {
            ds41_errf(err, "--prefill: '%.*s' is not HOST:PORT (port 1..65535)", (int)len, p);
            free(cl);
            return NULL;
        }
        if (cl->n_nodes == MAX_NODES) { ds41_errf(err, "--prefill: more than %d nodes", MAX_NODES); free(cl); return NULL; }
        pd_node *nd = &cl->nodes[cl->n_nodes++];
        memcpy(nd->host, p, (size_t)(colon - p));
        nd->host[colon - p] = 0;
        nd->port = (int)port;
        atomic_init(&nd->inflight, 0);
        p = comma ? comma + 1 : NULL;
    }
    if (cl->n_nodes == 0) { ds41_errf(err, "--prefill: no HOST:PORT given"); free(cl); return NULL; }
    if (ds41_pd_geom_of(e, &cl->geom, err)) { free(cl); return NULL; }
    cl->net = ds41_kvx_net_open(err);
    if (!cl->net) { free(cl); return NULL; }
    return cl;
}

int ds41_pd_geom_of(ds41_engine *e, ds41_kvx_geom *g, ds41_err *err) {
    ds41_cache c;
    if (ds41_cache_init(&c, e->cfg, BT, err)) return -1;
    int grc = ds41_pd_geom(e, &c, g, err);
    ds41_cache_free(&c);
    return grc;
}

const ds41_kvx_geom *ds41_pd_client_geom(const ds41_pd_client *cl) { return &cl->geom; }

void ds41_pd_client_defer(ds41_pd_client *cl) { cl->defer = 1; }

void ds41_pd_client_close(ds41_pd_client *cl) {
    if (!cl) return;
    ds41_kvx_net_close(cl->net);
    free(cl);
}

/* one attempt on one node; *busy = 1 when it refused for load (the next node may take it) */
static int try_node(ds41_pd_client *cl, pd_node *nd, const int32_t *ids, size_t n, long long first, unsigned flags,
                    ds41_pd_result *res, ds41_pd_fetched *out, int *busy, ds41_err *err) {
    const ds41_config *cfg = cl->e->cfg;
    int ns = cfg->n_kv_sources;
    long long nb = (long long)n / BT, cnt = nb - first;
    uint64_t id = atomic_fetch_add(&cl->next_id, 1);
    const uint8_t *fp = ds41_prefix_fingerprint(cl->pc);
    *busy = 0;
    ds41_kvx_conn *c = ds41_kvx_connect(cl->net, nd->host, nd->port, err);
    if (!c) return -1;
    uint8_t **pages = calloc((size_t)(cnt * ns + 1), sizeof *pages);
    uint8_t *wire = malloc(n * 4 + 1);
    void *p = NULL, *resume = NULL;
    size_t resume_len = 0;
    int rc = -1;
    char why[200];
    ds41_kvx_hdr h;
    if (!pages || !wire) { ds41_errf(err, "out of memory"); goto out; }
    ds41_kvx_hdr hello = { .type = DS41_KVX_HELLO, .req = id, .seq = 0, .layer = -1, .len = DS41_KVX_HASH };
    if (ds41_kvx_send(c, &hello, fp, cl->timeout_ms, err)) goto out;
    if (ds41_kvx_recv(c, &h, &p, 4096, cl->timeout_ms, err)) goto out;
    if (h.type == DS41_KVX_ERROR) {
        *busy = h.arg0 == DS41_KVX_E_BUSY;
        ds41_errf(err, "%s refused: %.*s", ds41_kvx_peer(c), (int)h.len, p ? (const char *)p : "");
        goto out;
    }
    if (ds41_kvx_expect(&h, 1u << DS41_KVX_WELCOME, id, 0, why, sizeof why) || h.len != DS41_KVX_HASH ||
        memcmp(p, fp, DS41_KVX_HASH)) {
        ds41_errf(err, "%s: handshake: %s", ds41_kvx_peer(c), h.len != DS41_KVX_HASH || memcmp(p, fp, DS41_KVX_HASH) ?
                  "compatibility hash mismatch" : why);
        goto out;
    }
    free(p);
    p = NULL;
    if (ds41_pd_fault("vanish")) {
        fprintf(stderr, "pd-fault: vanished (request %llu)\n", (unsigned long long)id);
        sleep(3600);
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ids[i];
        for (int k = 0; k < 4; k++) wire[4 * i + k] = (uint8_t)(v >> (8 * k));
    }
    ds41_kvx_hdr req = { .type = DS41_KVX_REQ, .req = id, .seq = 1, .layer = -1, .arg0 = (uint32_t)first,
                         .arg1 = flags, .len = (uint32_t)(n * 4) };
    if (ds41_kvx_send(c, &req, wire, cl->timeout_ms, err)) goto out;
    size_t maxpb = 0;
    for (int i = 0; i < ns; i++) if (ds41_cache_page_bytes(cfg, i) > maxpb) maxpb = ds41_cache_page_bytes(cfg, i);
    /* the larger of the RESUME frame's two forms */
    size_t maxr = ds41_kvx_resume_bytes(&cl->geom, cl->geom.slots, 0);
    size_t maxs = ds41_kvx_resume_bytes(&cl->geom, 0, ds41_kvx_stream_rows(&cl->geom, nb * BT));
    if (maxr > maxpb) maxpb = maxr;
    if (maxs > maxpb) maxpb = maxs;
    uint32_t maxp = maxpb > 4096 ? (uint32_t)(maxpb < DS41_KVX_MAX_PAYLOAD ? maxpb : DS41_KVX_MAX_PAYLOAD) : 4096;
    long long got = 0, bytes = 0;
    double t_first = 0;
    for (uint32_t seq = 1;; seq++) {
        if (ds41_kvx_recv(c, &h, &p, maxp, cl->timeout_ms, err)) goto out;
        bytes += DS41_KVX_HEADER + h.len;
        unsigned allowed = 1u << DS41_KVX_ERROR;
        if (got < cnt * ns) allowed |= 1u << DS41_KVX_LAYER;
        else allowed |= resume ? 1u << DS41_KVX_DONE : 1u << DS41_KVX_RESUME;
        if (ds41_kvx_expect(&h, allowed, id, seq, why, sizeof why)) {
            ds41_errf(err, "%s: %s", ds41_kvx_peer(c), why);
            goto out;
        }
        if (h.type == DS41_KVX_ERROR) {
            ds41_errf(err, "%s: prefill failed: %.*s", ds41_kvx_peer(c), (int)h.len, p ? (const char *)p : "");
            goto out;
        }
        if (h.type == DS41_KVX_RESUME) {
            ds41_resume_state st;
            ds41_err e2;
            if (ds41_pd_resume_view(&cl->geom, p, h.len, nb * BT, &st, &e2)) {
                ds41_errf(err, "%s: %.300s", ds41_kvx_peer(c), e2.msg);
                goto out;
            }
            res->t_last_frame = now_s();
            resume = p;
            resume_len = h.len;
            p = NULL;
            continue;
        }
        if (h.type == DS41_KVX_DONE) {
            if (h.arg0 != (uint32_t)cnt || h.arg1 != (uint32_t)ns || got != cnt * ns) {
                ds41_errf(err, "%s: DONE after %lld of %lld pages (it says %u blocks of %u stores)", ds41_kvx_peer(c), got,
                          cnt * ns, h.arg0, h.arg1);
                goto out;
            }
            break;
        }
        if (!t_first) t_first = now_s();
        int st = (int)h.arg0;
        long long b = h.arg1;
        if (st < 0 || st >= ns || h.layer != cfg->kv_sources[st] || b < first || b >= nb ||
            h.len != ds41_cache_page_bytes(cfg, st) || pages[(size_t)(b - first) * ns + st]) {
            ds41_errf(err, "%s: LAYER frame of store %d (layer %d), block %lld, %u bytes does not fit the request "
                      "(%lld blocks from %lld, %d stores)", ds41_kvx_peer(c), st, h.layer, b, h.len, nb, first, ns);
            goto out;
        }
        res->t_last_frame = now_s();
        uint8_t *pg = ds41_page_new(h.len);
        if (!pg) { ds41_errf(err, "out of memory for a KV page"); goto out; }
        memcpy(pg, p, h.len);
        pages[(size_t)(b - first) * ns + st] = pg;
        got++;
        free(p);
        p = NULL;
    }
    if (!cl->defer) ds41_prefix_insert(cl->pc, ids, n, first, cnt, pages);   /* deferred: the install's caller */
    out->pages = pages;
    out->first = first;
    out->nb = nb;
    out->resume = resume;
    out->resume_len = resume_len;
    pages = NULL;
    resume = NULL;
    res->blocks = cnt;
    res->bytes = bytes;
    res->seconds = t_first ? now_s() - t_first : 0;
    snprintf(res->node, sizeof res->node, "%s:%d", nd->host, nd->port);
    rc = 0;
out:
    free(p);
    free(resume);
    free(wire);
    if (pages)
        for (long long i = 0; i < cnt * ns; i++) ds41_page_unref(pages[i]);
    free(pages);
    ds41_kvx_conn_close(c);
    return rc;
}

void ds41_pd_fetched_free(ds41_pd_fetched *f, int n_stores) {
    if (f->pages)
        for (long long i = 0; i < (f->nb - f->first) * n_stores; i++) ds41_page_unref(f->pages[i]);
    free(f->pages);
    free(f->resume);
    memset(f, 0, sizeof *f);
}

int ds41_pd_fetch(ds41_pd_client *cl, const int32_t *ids, size_t n, long long first, unsigned flags,
                  ds41_pd_result *res, ds41_pd_fetched *out, ds41_err *err) {
    memset(res, 0, sizeof *res);
    memset(out, 0, sizeof *out);
    long long nb = (long long)n / BT;
    if (first < 0 || first >= nb) return ds41_errf(err, "remote prefill: nothing to fetch (%zu ids from block %lld)", n, first);
    /* least loaded first: fewest requests in flight from here, ties in turn */
    int order[MAX_NODES], N = cl->n_nodes;
    unsigned start = atomic_fetch_add(&cl->rr, 1);
    for (int i = 0; i < N; i++) order[i] = (int)((start + (unsigned)i) % (unsigned)N);
    for (int i = 1; i < N; i++)
        for (int j = i; j > 0 && atomic_load(&cl->nodes[order[j]].inflight) < atomic_load(&cl->nodes[order[j - 1]].inflight); j--) {
            int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
        }
    char msgs[512] = "";
    for (int i = 0; i < N; i++) {
        pd_node *nd = &cl->nodes[order[i]];
        int busy = 0;
        atomic_fetch_add(&nd->inflight, 1);
        ds41_err e1;
        int rc = try_node(cl, nd, ids, n, first, flags, res, out, &busy, &e1);
        atomic_fetch_sub(&nd->inflight, 1);
        if (rc == 0) return 0;
        size_t l = strlen(msgs);
        snprintf(msgs + l, sizeof msgs - l, "%s%s:%d: %.200s", l ? "; " : "", nd->host, nd->port, e1.msg);
    }
    return ds41_errf(err, "remote prefill failed: %s", msgs);
}

/* ---- on a thread of its own (the scheduler's) ---- */
struct ds41_pd_job {
    ds41_pd_client *cl;
    ds41_session *s;
    int32_t *ids;
    size_t n_prompt, n_fetch;
    long long first;
    int no_fallback;
    pthread_t th;
    _Atomic int state;          /* 0 running, 1 done, -1 the fetch failed */
    int joined;                 /* the thread was joined (ds41_pd_complete) */
    int rc;                     /* the fetch's: 0 or -1 */
    int completed;              /* ds41_pd_complete ran (deferred jobs) */
    ds41_pd_fetched f;          /* what the fetch received, until the install */
    ds41_pd_result res;
    ds41_err err;
};

long long ds41_pd_install(ds41_prefix_cache *pc, const ds41_kvx_geom *g, ds41_session *s, const int32_t *ids,
                          size_t n_prompt, const ds41_pd_fetched *f) {
    const ds41_config *cfg = ds41_session_seq(s)->e->cfg;
    int ns = cfg->n_kv_sources;
    long long M = f->nb * BT;
    uint8_t **hit = NULL, **all = calloc((size_t)(f->nb * ns + 1), sizeof *all);
    long long nh = f->first > 0 ? ds41_prefix_pages(pc, ids, (size_t)(f->first * BT), &hit) : 0;
    ds41_resume_state st;
    ds41_err err;
    long long rc = 0;
    /* the session's forward of the tail gives the first token's logits: at least one must remain */
    if (all && nh == f->first && M < (long long)n_prompt && ds41_pd_resume_view(g, f->resume, f->resume_len, M, &st, &err) == 0) {
        memcpy(all, hit, (size_t)(nh * ns) * sizeof *all);
        memcpy(all + nh * ns, f->pages, (size_t)((f->nb - f->first) * ns) * sizeof *all);
        if (ds41_session_install(s, ids, M, all, &st) == 0) rc = M;
        else {
            fprintf(stderr, "ds41 serve: installing a remote prefill's state: %s; restoring from the prefix cache\n",
                    ds41_session_error(s));
            ds41_session_reset(s);
        }
    }
    ds41_prefix_pages_free(pc, hit, nh);
    free(all);
    return rc;
}

static long long local_install(void *ctx, ds41_session *s, const int32_t *ids, size_t n_prompt, const ds41_pd_fetched *f) {
    ds41_pd_client *cl = ctx;
    return ds41_pd_install(cl->pc, &cl->geom, s, ids, n_prompt, f);
}

static long long local_restore(void *ctx, ds41_session *s, const int32_t *ids, size_t n) {
    ds41_pd_client *cl = ctx;
    return ds41_prefix_restore(cl->pc, s, ids, n);
}

/* after the fetch: the install, else (a refused install, or a failed fetch unless no_fallback)
 * the prefix cache's restore */
static void complete(ds41_pd_job *j, const ds41_pd_hooks *h) {
    j->res.restored = 0;
    if (!j->rc) j->res.restored = h->install(h->ctx, j->s, j->ids, j->n_prompt, &j->f);
    j->res.installed = j->res.restored > 0;
    ds41_pd_fetched_free(&j->f, j->cl->e->cfg->n_kv_sources);
    if ((!j->rc && j->res.restored == 0) || (j->rc && !j->no_fallback))
        j->res.restored = h->restore(h->ctx, j->s, j->ids, j->n_prompt);
    /* the decode node's own share of a remote prefill, up to the tail's forward (docs/pd.md) */
    if (!j->rc)
        fprintf(stderr, "ds41 serve: remote prefill from %s: %lld blocks, %lld bytes; %s; session ready %.2f ms after "
                "the last frame (monotonic %.6f)\n", j->res.node, j->res.blocks, j->res.bytes,
                j->res.installed ? "state installed, 0 rows replayed" : "restored from the prefix cache (replayed)",
                (now_s() - j->res.t_last_frame) * 1e3, j->res.t_last_frame);
    j->completed = 1;
}

static void *job_main(void *arg) {
    ds41_pd_job *j = arg;
    unsigned flags = ds41_session_drafts(j->s) ? DS41_KVX_REQ_CONTEXT : 0;
    j->rc = ds41_pd_fetch(j->cl, j->ids, j->n_fetch, j->first, flags, &j->res, &j->f, &j->err);
    if (!j->cl->defer) {
        ds41_pd_hooks h = { .install = local_install, .restore = local_restore, .ctx = j->cl };
        complete(j, &h);
    }
    atomic_store(&j->state, j->rc ? -1 : 1);
    return NULL;
}

void ds41_pd_complete(ds41_pd_job *j, const ds41_pd_hooks *h) {
    if (!j || j->completed || atomic_load(&j->state) == 0) return;
    pthread_join(j->th, NULL);   /* it has ended: its writes are seen here */
    j->joined = 1;
    complete(j, h);
}

ds41_pd_job *ds41_pd_start(ds41_pd_client *cl, ds41_session *s, const int32_t *ids, size_t n_prompt, size_t n_fetch,
                           long long first, int no_fallback) {
    ds41_pd_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->ids = malloc(n_prompt * sizeof *ids + 1);
    if (!j->ids) { free(j); return NULL; }
    memcpy(j->ids, ids, n_prompt * sizeof *ids);
    j->cl = cl;
    j->s = s;
    j->n_prompt = n_prompt;
    j->n_fetch = n_fetch;
    j->first = first;
    j->no_fallback = no_fallback;
    atomic_init(&j->state, 0);
    if (pthread_create(&j->th, NULL, job_main, j)) { free(j->ids); free(j); return NULL; }
    return j;
}

int ds41_pd_poll(ds41_pd_job *j, ds41_pd_result *res, char *msg, size_t cap) {
    int s = atomic_load(&j->state);
    if (s != 0 && res) *res = j->res;
    if (s == -1 && msg) snprintf(msg, cap, "%s", j->err.msg);
    return s;
}

void ds41_pd_finish(ds41_pd_job *j) {
    if (!j) return;
    if (!j->joined) pthread_join(j->th, NULL);
    ds41_pd_fetched_free(&j->f, j->cl->e->cfg->n_kv_sources);   /* a deferred job never completed */
    free(j->ids);
    free(j);
}
