/* ds41 KV transfer over UCX: see kvx_ucx.h. */
#define _GNU_SOURCE
#include "kvx_ucx.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

struct ds41_kvx_net {
    ucp_context_h ctx;
    ucp_worker_h worker;
};

struct ds41_kvx_conn {
    ds41_kvx_net *net;
    ucp_ep_h ep;
    _Atomic int failed;         /* the endpoint's error handler ran */
    ucs_status_t status;
    int closed;                 /* closed by force after a timeout or error */
    char peer[80];
};

#define CONNQ 64
struct ds41_kvx_listener {
    ds41_kvx_net *net;
    ucp_listener_h l;
    int port;
    pthread_mutex_t mu;
    ucp_conn_request_h q[CONNQ];   /* connection requests the handler queued */
    int qn;
};

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* Progress without burning a core: spin a little, then sleep 100 us between rounds (the
 * machine this runs on is shared; a frame's latency gains nothing from a tighter loop). */
static void progress_round(ds41_kvx_net *n, int *spins) {
    if (ucp_worker_progress(n->worker)) { *spins = 0; return; }
    if (++*spins > 64) usleep(100);
}

ds41_kvx_net *ds41_kvx_net_open(ds41_err *err) {
    /* TCP unless the operator chose: the default transport list would also probe devices a
     * container does not have and print warnings about them */
    setenv("UCX_TLS", "tcp", 0);
    ds41_kvx_net *n = calloc(1, sizeof *n);
    if (!n) { ds41_errf(err, "out of memory"); return NULL; }
    ucp_config_t *cfg;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) { ds41_errf(err, "UCX: reading the configuration: %s", ucs_status_string(st)); free(n); return NULL; }
    ucp_params_t p;
    memset(&p, 0, sizeof p);
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    p.features = UCP_FEATURE_STREAM;
    p.mt_workers_shared = 1;
    st = ucp_init(&p, cfg, &n->ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) { ds41_errf(err, "UCX: ucp_init: %s", ucs_status_string(st)); free(n); return NULL; }
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof wp);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_MULTI;
    st = ucp_worker_create(n->ctx, &wp, &n->worker);
    if (st != UCS_OK) {
        ds41_errf(err, "UCX: ucp_worker_create: %s", ucs_status_string(st));
        ucp_cleanup(n->ctx);
        free(n);
        return NULL;
    }
    return n;
}

void ds41_kvx_net_close(ds41_kvx_net *n) {
    if (!n) return;
    ucp_worker_destroy(n->worker);
    ucp_cleanup(n->ctx);
    free(n);
}

static int resolve(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len, ds41_err *err) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = host ? 0 : AI_PASSIVE;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc || !res) return ds41_errf(err, "cannot resolve '%s': %s", host ? host : "*", gai_strerror(rc));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

static void ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
    (void)ep;
    ds41_kvx_conn *c = arg;
    c->status = status;
    atomic_store(&c->failed, 1);
}

static void conn_handler(ucp_conn_request_h req, void *arg) {
    ds41_kvx_listener *l = arg;
    pthread_mutex_lock(&l->mu);
    if (l->qn < CONNQ) l->q[l->qn++] = req;
    else ucp_listener_reject(l->l, req);
    pthread_mutex_unlock(&l->mu);
}

ds41_kvx_listener *ds41_kvx_listen(ds41_kvx_net *n, const char *host, int port, ds41_err *err) {
    ds41_kvx_listener *l = calloc(1, sizeof *l);
    if (!l) { ds41_errf(err, "out of memory"); return NULL; }
    l->net = n;
    pthread_mutex_init(&l->mu, NULL);
    struct sockaddr_storage ss;
    socklen_t sl;
    if (resolve(host, port, &ss, &sl, err)) { free(l); return NULL; }
    ucp_listener_params_t lp;
    memset(&lp, 0, sizeof lp);
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = (const struct sockaddr *)&ss;
    lp.sockaddr.addrlen = sl;
    lp.conn_handler.cb = conn_handler;
    lp.conn_handler.arg = l;
    ucs_status_t st = ucp_listener_create(n->worker, &lp, &l->l);
    if (st != UCS_OK) {
        ds41_errf(err, "UCX: listening on %s:%d: %s", host ? host : "*", port, ucs_status_string(st));
        free(l);
        return NULL;
    }
    ucp_listener_attr_t la;
    memset(&la, 0, sizeof la);
    la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    if (ucp_listener_query(l->l, &la) == UCS_OK) l->port = ntohs(((struct sockaddr_in *)&la.sockaddr)->sin_port);
    else l->port = port;
    return l;
}

int ds41_kvx_listener_port(const ds41_kvx_listener *l) { return l->port; }

static ds41_kvx_conn *conn_new(ds41_kvx_net *n) {
    ds41_kvx_conn *c = calloc(1, sizeof *c);
    if (c) { c->net = n; atomic_init(&c->failed, 0); }
    return c;
}

ds41_kvx_conn *ds41_kvx_accept(ds41_kvx_listener *l, int timeout_ms, ds41_err *err) {
    err->msg[0] = 0;
    double end = now_ms() + timeout_ms;
    int spins = 0;
    ucp_conn_request_h req = NULL;
    for (;;) {
        pthread_mutex_lock(&l->mu);
        if (l->qn > 0) {
            req = l->q[0];
            memmove(l->q, l->q + 1, (size_t)--l->qn * sizeof l->q[0]);
        }
        pthread_mutex_unlock(&l->mu);
        if (req || now_ms() >= end) break;
        progress_round(l->net, &spins);
    }
    if (!req) return NULL;
    ds41_kvx_conn *c = conn_new(l->net);
    if (!c) { ucp_listener_reject(l->l, req); ds41_errf(err, "out of memory"); return NULL; }
    ucp_conn_request_attr_t ra;
    memset(&ra, 0, sizeof ra);
    ra.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    if (ucp_conn_request_query(req, &ra) == UCS_OK) {
        struct sockaddr_in *sa = (struct sockaddr_in *)&ra.client_address;
        char ip[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &sa->sin_addr, ip, sizeof ip);
        snprintf(c->peer, sizeof c->peer, "%s:%d", ip, ntohs(sa->sin_port));
    }
    ucp_ep_params_t ep;
    memset(&ep, 0, sizeof ep);
    ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.conn_request = req;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = ep_error;
    ep.err_handler.arg = c;
    ucs_status_t st = ucp_ep_create(l->net->worker, &ep, &c->ep);
    if (st != UCS_OK) { ds41_errf(err, "UCX: accepting a connection: %s", ucs_status_string(st)); free(c); return NULL; }
    return c;
}

void ds41_kvx_listener_close(ds41_kvx_listener *l) {
    if (!l) return;
    pthread_mutex_lock(&l->mu);
    for (int i = 0; i < l->qn; i++) ucp_listener_reject(l->l, l->q[i]);
    l->qn = 0;
    pthread_mutex_unlock(&l->mu);
    ucp_listener_destroy(l->l);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

ds41_kvx_conn *ds41_kvx_connect(ds41_kvx_net *n, const char *host, int port, ds41_err *err) {
    struct sockaddr_storage ss;
    socklen_t sl;
    if (resolve(host, port, &ss, &sl, err)) return NULL;
    ds41_kvx_conn *c = conn_new(n);
    if (!c) { ds41_errf(err, "out of memory"); return NULL; }
    snprintf(c->peer, sizeof c->peer, "%s:%d", host, port);
    ucp_ep_params_t ep;
    memset(&ep, 0, sizeof ep);
    ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = (const struct sockaddr *)&ss;
    ep.sockaddr.addrlen = sl;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = ep_error;
    ep.err_handler.arg = c;
    ucs_status_t st = ucp_ep_create(n->worker, &ep, &c->ep);
    if (st != UCS_OK) { ds41_errf(err, "UCX: connecting to %s:%d: %s", host, port, ucs_status_string(st)); free(c); return NULL; }
    return c;
}

/* Closes the endpoint (force: pending requests complete with an error) and waits for it. */
static void ep_close(ds41_kvx_conn *c, int force) {
    if (c->closed || !c->ep) return;
    c->closed = 1;
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof rp);
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = force || atomic_load(&c->failed) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void *r = ucp_ep_close_nbx(c->ep, &rp);
    if (r && !UCS_PTR_IS_ERR(r)) {
        double end = now_ms() + 1000;
        int spins = 0;
        while (ucp_request_check_status(r) == UCS_INPROGRESS && now_ms() < end) progress_round(c->net, &spins);
        /* a close that does not finish within the second is left to UCX (freed on completion) */
        ucp_request_free(r);
    }
}

void ds41_kvx_conn_close(ds41_kvx_conn *c) {
    if (!c) return;
    ep_close(c, 0);
    free(c);
}

const char *ds41_kvx_peer(const ds41_kvx_conn *c) { return c->peer; }

/* Waits for request r (send or receive) until deadline; on timeout or an endpoint error the
 * endpoint is closed by force, which completes r with an error, and r is freed. */
static int wait_req(ds41_kvx_conn *c, void *r, int is_recv, size_t want, double end, const char *what, ds41_err *err) {
    int spins = 0;
    ucs_status_t st;
    size_t got = 0;
    for (;;) {
        st = is_recv ? ucp_stream_recv_request_test(r, &got) : ucp_request_check_status(r);
        if (st != UCS_INPROGRESS) break;
        if (now_ms() >= end || atomic_load(&c->failed)) {
            int timed_out = !atomic_load(&c->failed);
            ep_close(c, 1);
            /* the forced close completes the request; give it a bounded number of rounds */
            double e2 = now_ms() + 500;
            while ((is_recv ? ucp_stream_recv_request_test(r, &got) : ucp_request_check_status(r)) == UCS_INPROGRESS &&
                   now_ms() < e2)
                progress_round(c->net, &spins);
            if ((is_recv ? ucp_stream_recv_request_test(r, &got) : ucp_request_check_status(r)) != UCS_INPROGRESS)
                ucp_request_free(r);
            if (timed_out) return ds41_errf(err, "%s %s: timed out", what, c->peer);
            return ds41_errf(err, "%s %s: %s", what, c->peer, ucs_status_string(c->status));
        }
        progress_round(c->net, &spins);
    }
    ucp_request_free(r);
    if (st != UCS_OK) return ds41_errf(err, "%s %s: %s", what, c->peer, ucs_status_string(st));
    if (is_recv && got != want) return ds41_errf(err, "%s %s: %zu of %zu bytes", what, c->peer, got, want);
    return 0;
}

static int usable(ds41_kvx_conn *c, const char *what, ds41_err *err) {
    if (c->closed) return ds41_errf(err, "%s %s: the connection was closed after an earlier error", what, c->peer);
    if (atomic_load(&c->failed)) return ds41_errf(err, "%s %s: %s", what, c->peer, ucs_status_string(c->status));
    return 0;
}

int ds41_kvx_send_bytes(ds41_kvx_conn *c, const void *buf, size_t n, int timeout_ms, ds41_err *err) {
    if (usable(c, "sending to", err)) return -1;
    if (n == 0) return 0;
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof rp);
    void *r = ucp_stream_send_nbx(c->ep, buf, n, &rp);
    if (r == NULL) return 0;
    if (UCS_PTR_IS_ERR(r)) return ds41_errf(err, "sending to %s: %s", c->peer, ucs_status_string(UCS_PTR_STATUS(r)));
    return wait_req(c, r, 0, n, now_ms() + timeout_ms, "sending to", err);
}

int ds41_kvx_recv_bytes(ds41_kvx_conn *c, void *buf, size_t n, int timeout_ms, ds41_err *err) {
    /* not refused on an endpoint error alone: bytes that arrived before the peer closed are
     * still delivered (the last frame of a transfer is often read after the peer hung up) */
    if (c->closed) return ds41_errf(err, "receiving from %s: the connection was closed after an earlier error", c->peer);
    if (n == 0) return 0;
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof rp);
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = UCP_STREAM_RECV_FLAG_WAITALL;
    size_t got = 0;
    void *r = ucp_stream_recv_nbx(c->ep, buf, n, &got, &rp);
    if (r == NULL) return got == n ? 0 : ds41_errf(err, "receiving from %s: %zu of %zu bytes", c->peer, got, n);
    if (UCS_PTR_IS_ERR(r)) return ds41_errf(err, "receiving from %s: %s", c->peer, ucs_status_string(UCS_PTR_STATUS(r)));
    return wait_req(c, r, 1, n, now_ms() + timeout_ms, "receiving from", err);
}

int ds41_kvx_send(ds41_kvx_conn *c, const ds41_kvx_hdr *h, const void *payload, int timeout_ms, ds41_err *err) {
    uint8_t hb[DS41_KVX_HEADER];
    ds41_kvx_encode(h, payload, hb);
    double end = now_ms() + timeout_ms;
    if (ds41_kvx_send_bytes(c, hb, sizeof hb, timeout_ms, err)) return -1;
    int left = (int)(end - now_ms());
    return ds41_kvx_send_bytes(c, payload, h->len, left > 1 ? left : 1, err);
}

int ds41_kvx_recv(ds41_kvx_conn *c, ds41_kvx_hdr *h, void **payload, uint32_t max_payload, int timeout_ms,
                  ds41_err *err) {
    *payload = NULL;
    uint8_t hb[DS41_KVX_HEADER];
    double end = now_ms() + timeout_ms;
    if (ds41_kvx_recv_bytes(c, hb, sizeof hb, timeout_ms, err)) return -1;
    char why[200];
    if (ds41_kvx_decode_header(hb, max_payload, h, why, sizeof why)) {
        ep_close(c, 1);   /* the stream is out of step: nothing after this can be trusted */
        return ds41_errf(err, "from %s: %s", c->peer, why);
    }
    if (h->len == 0) return 0;
    uint8_t *p = malloc(h->len);
    if (!p) return ds41_errf(err, "out of memory for a %u-byte frame", h->len);
    int left = (int)(end - now_ms());
    if (ds41_kvx_recv_bytes(c, p, h->len, left > 1 ? left : 1, err)) { free(p); return -1; }
    if (ds41_kvx_check_payload(h, p, why, sizeof why)) {
        free(p);
        ep_close(c, 1);
        return ds41_errf(err, "from %s: %s", c->peer, why);
    }
    *payload = p;
    return 0;
}
