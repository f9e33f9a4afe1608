/* ds41 prefill node (pd.h, docs/pd.md). One thread accepts connections; each connection gets a
 * handler thread (at most `capacity` hold a request, the others are told BUSY), and each request
 * a sender thread, so that a KV source's pages go out while the next layers compute:
 *
 *   decode node                         prefill node
 *   HELLO (compatibility hash)    ->
 *                                 <-    WELCOME (load, capacity, hash) or ERROR (mismatch, busy)
 *   REQ (ids, first block, flags) ->    prefill (CED, no logits); after each KV source's layer
 *                                 <-    LAYER (store, block, one page) ... its pages, in layer order
 *                                 <-    RESUME (the bounded state the prefill left, kvx_resume.h)
 *                                 <-    DONE (blocks, stores)
 *
 * Prompts whose blocks the node's own prefix cache holds are shipped from it, their state
 * rebuilt by the prefix cache's restore (its replay runs here, not on the decode node); what it
 * computes is published there, as on one node. The forward runs under one mutex (the
 * engine's thread pool serves one forward at a time). A decode node that stops answering
 * within the lease (every send and receive is bounded by it) or whose connection fails loses its
 * request: the handler drops the pages and the connection and frees the slot. */
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
#include "restore.h"

#define BT DS41_PAGE_TOKENS

typedef struct pd_srv {
    ds41_engine *e;
    ds41_prefix_cache *pc;
    ds41_session_params sp;
    ds41_pd_prefill_opts o;
    ds41_kvx_net *net;
    pthread_mutex_t compute_mu;
    _Atomic int threads;
    int ended;                /* under mpiexec: the other ranks left (end), no forward any more */
    ds41_pd_prefill_stats own, *st;   /* st: the caller's (o.stats) or own */
} pd_srv;

/* a page to send (one reference held), the resume state (store -1, blob owned) or the end
 * marker (neither) */
typedef struct sitem {
    int store, block;
    uint8_t *page;
    uint8_t *blob;
    size_t len;
    struct sitem *next;
} sitem;

typedef struct pd_req {
    pd_srv *S;
    ds41_kvx_conn *c;
    uint64_t id;
    long long first, nb;
    unsigned flags;            /* REQ's DS41_KVX_REQ_* */
    int *sent;                 /* per store: blocks queued so far (from first) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sitem *head, *tail;
    _Atomic int failed;
    char why[256];
    long long bytes;
    uint32_t seq;
    /* timing (docs/pd.md, the share of the transfer hidden behind compute): seconds since the
     * request arrived of the first page sent, the end of the forward and DONE sent */
    double t0, t_first, t_computed, t_resume, t_done;
    /* --pd-decoder decode: the block input of the first decoder layer at the last stream_rows
     * positions (X rows, then pre rows), taken by the hook when that layer's keys are done */
    float *stream;
    int stream_rows, stream_taken;
    long long restored;        /* blocks restored from this node's prefix cache */
} pd_req;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void push_item(pd_req *r, int store, int block, uint8_t *page, uint8_t *blob, size_t len) {
    sitem *it = calloc(1, sizeof *it);
    if (!it) { atomic_store(&r->failed, 1); snprintf(r->why, sizeof r->why, "out of memory"); free(blob); return; }
    it->store = store;
    it->block = block;
    it->page = page;
    it->blob = blob;
    it->len = len;
    if (page) ds41_page_ref(page);
    pthread_mutex_lock(&r->mu);
    if (r->tail) r->tail->next = it; else r->head = it;
    r->tail = it;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void push(pd_req *r, int store, int block, uint8_t *page) { push_item(r, store, block, page, NULL, 0); }

/* queues the pages of store i's blocks that are complete and not yet queued */
static void queue_store(pd_req *r, ds41_cache *c, int i) {
    ds41_kv_store *st = &c->stores[i];
    long long done = st->n_entries * st->ratio / BT;
    if (done > r->nb) done = r->nb;
    for (long long b = r->first + r->sent[i]; b < done; b++) {
        if (b >= st->n_pages || !st->pages[b]) break;
        push(r, i, (int)b, st->pages[b]);
        r->sent[i]++;
    }
}

/* The decoder split: the forward stops at the first decoder layer's keys (ds41_seq.stop_layer),
 * whose input stream (after its Engram, as its attention reads it) is then what the decode
 * node runs the decoder on. Taken from the forward that ends the prompt (a restore that stops
 * short is followed by one that does); its rows reach the stream's (a one-shot prefill has
 * every row, a prefix cache restore the replay's, which cover the decoder's reach too). */
static void take_stream(pd_req *r, ds41_seq *s) {
    const ds41_config *cfg = r->S->e->cfg;
    long long T = (long long)s->stream_n, S = r->stream_rows;
    if (!s->stream || s->cache.pos + T != r->nb * BT) return;
    if (T < S) {
        snprintf(r->why, sizeof r->why, "the decoder split needs the stream of the last %lld positions, the forward "
                 "covers %lld", S, T);
        atomic_store(&r->failed, 1);
        return;
    }
    size_t hc = (size_t)cfg->hc_mult, xw = hc * cfg->dim, t0 = (size_t)(T - S);
    memcpy(r->stream, s->stream->X + t0 * xw, (size_t)S * xw * sizeof(float));
    memcpy(r->stream + (size_t)S * xw, s->stream->pre + t0 * hc, (size_t)S * hc * sizeof(float));
    r->stream_taken = 1;
}

/* forward.h layer_done: the KV source of this layer has its entries for the forward's rows */
static void layer_hook(void *arg, ds41_seq *s, int layer) {
    pd_req *r = arg;
    if (atomic_load(&r->failed)) return;
    for (int i = 0; i < s->cache.n_stores; i++)
        if (s->cache.stores[i].layer == layer) queue_store(r, &s->cache, i);
    if (r->stream && layer == s->stop_layer) take_stream(r, s);
}

/* One LAYER or RESUME frame, with the test-only faults (pd.h): flip, truncate, stall on LAYER
 * frames; rflip, rtruncate, rbad on RESUME frames. */
static int send_frame(pd_req *r, ds41_kvx_hdr *h, const uint8_t *pl, ds41_err *err) {
    pd_srv *S = r->S;
    size_t pb = h->len;
    int resume = h->type == DS41_KVX_RESUME;
    if (!resume && ds41_pd_fault("stall")) {
        fprintf(stderr, "pd-fault: stalled (request %llu)\n", (unsigned long long)r->id);
        sleep(3600);
    }
    int bad = resume && ds41_pd_fault("rbad");
    if (bad || ds41_pd_fault(resume ? "rflip" : "flip") || ds41_pd_fault(resume ? "rtruncate" : "truncate")) {
        const char *f = getenv("DS41_PD_FAULT");
        int trunc = f && strstr(f, "truncate") != NULL;
        uint8_t *cp = malloc(pb);
        if (!cp) return ds41_errf(err, "out of memory");
        memcpy(cp, pl, pb);
        uint8_t hb[DS41_KVX_HEADER];
        if (bad) {
            cp[8] ^= 0x01;   /* the ring count, under a right checksum */
            ds41_kvx_encode(h, cp, hb);
        } else {
            ds41_kvx_encode(h, pl, hb);
            cp[pb / 2] ^= 0x01;
        }
        fprintf(stderr, "pd-fault: %s %s frame (request %llu)\n", trunc ? "truncated a" : bad ? "a bad ring count in a" :
                "flipped a byte of a", ds41_kvx_type_name(h->type), (unsigned long long)r->id);
        int rc = ds41_kvx_send_bytes(r->c, hb, sizeof hb, S->o.lease_ms, err) ||
                 ds41_kvx_send_bytes(r->c, trunc ? pl : cp, trunc ? pb / 2 : pb, S->o.lease_ms, err);
        free(cp);
        if (rc) return -1;
        if (trunc) return ds41_errf(err, "fault injection: truncated a frame");
        r->bytes += (long long)(sizeof hb + pb);
        return 0;
    }
    if (ds41_kvx_send(r->c, h, pl, S->o.lease_ms, err)) return -1;
    r->bytes += (long long)(DS41_KVX_HEADER + pb);
    return 0;
}

static int send_item(pd_req *r, const sitem *it, ds41_err *err) {
    const ds41_config *cfg = r->S->e->cfg;
    if (it->store < 0) {
        ds41_kvx_hdr h = { .type = DS41_KVX_RESUME, .req = r->id, .seq = r->seq++, .layer = -1, .len = (uint32_t)it->len };
        return send_frame(r, &h, it->blob, err);
    }
    ds41_kvx_hdr h = { .type = DS41_KVX_LAYER, .req = r->id, .seq = r->seq++, .layer = cfg->kv_sources[it->store],
                       .arg0 = (uint32_t)it->store, .arg1 = (uint32_t)it->block,
                       .len = (uint32_t)ds41_cache_page_bytes(cfg, it->store) };
    return send_frame(r, &h, it->page, err);
}

static void *sender_main(void *arg) {
    pd_req *r = arg;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        while (!r->head) pthread_cond_wait(&r->cv, &r->mu);
        sitem *it = r->head;
        r->head = it->next;
        if (!r->head) r->tail = NULL;
        pthread_mutex_unlock(&r->mu);
        int end = it->page == NULL && it->blob == NULL;
        if (!atomic_load(&r->failed)) {
            ds41_err err;
            int rc;
            if (end) {
                ds41_kvx_hdr h = { .type = DS41_KVX_DONE, .req = r->id, .seq = r->seq++, .layer = -1,
                                   .arg0 = (uint32_t)(r->nb - r->first), .arg1 = (uint32_t)r->S->e->cfg->n_kv_sources };
                rc = ds41_kvx_send(r->c, &h, NULL, r->S->o.lease_ms, &err);
                r->bytes += DS41_KVX_HEADER;
            } else {
                rc = send_item(r, it, &err);
                if (!r->t_first) r->t_first = now_s() - r->t0;
                if (it->blob) r->t_resume = now_s() - r->t0;
            }
            if (end) r->t_done = now_s() - r->t0;
            if (rc) {
                snprintf(r->why, sizeof r->why, "%.200s", err.msg);
                atomic_store(&r->failed, 1);
            }
        }
        ds41_page_unref(it->page);
        free(it->blob);
        free(it);
        if (end) break;
    }
    return NULL;
}

static void send_error(pd_srv *S, ds41_kvx_conn *c, uint64_t id, uint32_t seq, int code, const char *msg) {
    ds41_kvx_hdr h = { .type = DS41_KVX_ERROR, .req = id, .seq = seq, .layer = -1, .arg0 = (uint32_t)code,
                       .len = (uint32_t)strlen(msg) };
    ds41_err err;
    ds41_kvx_send(c, &h, msg, S->o.lease_ms, &err);
}

/* queues the RESUME frame of session s's state */
static int queue_resume(pd_req *r, ds41_session *s, ds41_err *err) {
    size_t n = 0;
    if (r->stream && !r->stream_taken) return ds41_errf(err, "the decoder split's stream was not taken");
    uint8_t *blob = ds41_pd_resume_pack(ds41_session_seq(s), (r->flags & DS41_KVX_REQ_CONTEXT) != 0, r->stream, &n, err);
    if (!blob) return -1;
    push_item(r, -1, 0, NULL, blob, n);
    return 0;
}

/* Runs the prefill of request r over ids[0..M): from the prefix cache when it holds every
 * block (its restore rebuilds the state), else the prefill forward, whose pages the hook queues
 * layer by layer; then the resume state. */
static int compute(pd_req *r, const int32_t *ids, ds41_err *err) {
    pd_srv *S = r->S;
    int ns = S->e->cfg->n_kv_sources;
    long long M = r->nb * BT;
    uint8_t **pg = NULL;
    char eb[512];
    const ds41_pd_mirror *mi = S->o.mirror;
    ds41_session *s = ds41_session_open(S->e, &S->sp, eb, sizeof eb);
    if (!s) return ds41_errf(err, "%s", eb);
    int rc = 0;
    pthread_mutex_lock(&S->compute_mu);
    if (S->ended) {
        pthread_mutex_unlock(&S->compute_mu);
        ds41_session_close(s);
        return ds41_errf(err, "the node is shutting down");
    }
    /* under mpiexec the other ranks see each engine call first (ds41_pd_mirror), the hit query
     * included: it moves the blocks it finds to the front of the cache's LRU */
    if (mi) mi->open(mi->ctx, s);
    /* --cache-dir under mpiexec: the chain's blocks on rank 0's disk into every rank's memory */
    if (mi && S->pc) mi->load(mi->ctx, s, ids, (size_t)M);
    long long hit = S->pc ? ds41_prefix_pages(S->pc, ids, (size_t)M, &pg) : 0;
    if (mi) mi->seq(mi->ctx, s, r->stream ? S->e->cfg->first_decoder_layer : 0, ids, (size_t)M);
    ds41_seq *q = ds41_session_seq(s);
    /* the exact CED row reach: every row a ring keeps, as a one-node prefill computes it (the
     * decode node's --prefill mode does not travel; an approximate replay would not be exact) */
    q->prefill = DS41_PREFILL_CED;
    /* the decoder split: every forward here ends at the first decoder layer's keys */
    if (r->stream) q->stop_layer = S->e->cfg->first_decoder_layer;
    q->layer_done = layer_hook;
    q->layer_done_arg = r;
    /* a partial hit restores its blocks and computes the rest; with the decoder split the
     * computed part must still cover the stream's rows (else fewer blocks are restored) */
    long long use = hit;
    if (r->stream && use < r->nb) {
        long long cap = (M - r->stream_rows) / BT;
        if (use > cap) use = cap > 0 ? cap : 0;
    }
    if (use > 0) {
        for (int i = 0; i < ns; i++) {
            for (long long b = r->first; b < use; b++) push(r, i, (int)b, pg[(size_t)b * ns + i]);
            /* the hook queues none of them again */
            r->sent[i] = use > r->first ? (int)(use - r->first) : 0;
        }
        /* the state from the cache's restore; blocks evicted since ds41_prefix_pages, and the
         * blocks past the hit, are computed (and published) */
        long long k = mi ? mi->restore(mi->ctx, s, ids, (size_t)(use * BT)) : ds41_prefix_restore(S->pc, s, ids, (size_t)(use * BT));
        if (k < 0) rc = ds41_errf(err, "restore from the prefix cache: %s", ds41_session_error(s));
        else {
            r->restored = k / BT;
            if (k < M) {
                if (mi) mi->forward(mi->ctx, s, k, ids, (size_t)M);
                rc = ds41_forward(q, ids + k, (int)(M - k), 0, err);
            }
            if (!rc && k < M && !atomic_load(&r->failed)) {
                for (int i = 0; i < ns; i++) queue_store(r, &q->cache, i);
                if (mi) mi->publish(mi->ctx, s, ids, (size_t)M);
                ds41_prefix_publish(S->pc, s, ids, (size_t)M);
            }
        }
    } else {
        if (!atomic_load(&r->failed)) {
            if (mi) mi->forward(mi->ctx, s, 0, ids, (size_t)M);
            rc = ds41_forward(q, ids, (int)M, 0, err);
        }
        if (!rc && !atomic_load(&r->failed)) {
            for (int i = 0; i < ns; i++) queue_store(r, &q->cache, i);
            if (S->pc) {
                if (mi) mi->publish(mi->ctx, s, ids, (size_t)M);
                ds41_prefix_publish(S->pc, s, ids, (size_t)M);
            }
        }
    }
    q->layer_done = NULL;
    q->stop_layer = 0;
    if (mi) mi->close(mi->ctx, s);
    pthread_mutex_unlock(&S->compute_mu);
    ds41_prefix_pages_free(S->pc, pg, hit);
    if (!rc && !atomic_load(&r->failed)) rc = queue_resume(r, s, err);
    ds41_session_close(s);
    return rc;
}

static void *handler_main(void *arg) {
    pd_req *r = arg;
    pd_srv *S = r->S;
    ds41_kvx_conn *c = r->c;
    ds41_err err;
    ds41_kvx_hdr h;
    void *p = NULL;
    int32_t *ids = NULL;
    int slot = 0;
    double t0 = now_s();
    char fp16[17];
    for (int i = 0; i < 8; i++) snprintf(fp16 + 2 * i, 3, "%02x", ds41_prefix_fingerprint(S->pc)[i]);
    /* handshake */
    char why[200];
    if (ds41_kvx_recv(c, &h, &p, 4096, S->o.lease_ms, &err)) { snprintf(r->why, sizeof r->why, "%.200s", err.msg); goto out; }
    r->id = h.req;
    if (ds41_kvx_expect(&h, 1u << DS41_KVX_HELLO, h.req, 0, why, sizeof why) || h.len != DS41_KVX_HASH) {
        snprintf(r->why, sizeof r->why, "handshake: %s", h.len != DS41_KVX_HASH ? "HELLO without a 32-byte hash" : why);
        send_error(S, c, r->id, 0, DS41_KVX_E_BAD, r->why);
        goto out;
    }
    if (memcmp(p, ds41_prefix_fingerprint(S->pc), DS41_KVX_HASH)) {
        char theirs[17];
        for (int i = 0; i < 8; i++) snprintf(theirs + 2 * i, 3, "%02x", ((uint8_t *)p)[i]);
        snprintf(r->why, sizeof r->why,
                 "compatibility hash mismatch: decode node %s..., prefill node %s... (checkpoint, config, kernel mode "
                 "or index-K reading differ)", theirs, fp16);
        send_error(S, c, r->id, 0, DS41_KVX_E_MISMATCH, r->why);
        goto out;
    }
    free(p);
    p = NULL;
    int act = atomic_fetch_add(&S->st->active, 1);
    slot = 1;
    if (act >= S->o.capacity) {
        snprintf(r->why, sizeof r->why, "busy: %d requests held (capacity %d)", act, S->o.capacity);
        atomic_fetch_add(&S->st->busy, 1);
        send_error(S, c, r->id, 0, DS41_KVX_E_BUSY, r->why);
        goto out;
    }
    ds41_kvx_hdr w = { .type = DS41_KVX_WELCOME, .req = r->id, .seq = 0, .layer = -1, .arg0 = (uint32_t)act,
                       .arg1 = (uint32_t)S->o.capacity, .len = DS41_KVX_HASH };
    if (ds41_kvx_send(c, &w, ds41_prefix_fingerprint(S->pc), S->o.lease_ms, &err)) {
        snprintf(r->why, sizeof r->why, "%.200s", err.msg);
        goto out;
    }
    /* the request */
    uint32_t maxp = (uint32_t)(S->e->max_pos * 4 < DS41_KVX_MAX_PAYLOAD ? S->e->max_pos * 4 : DS41_KVX_MAX_PAYLOAD);
    if (ds41_kvx_recv(c, &h, &p, maxp, S->o.lease_ms, &err)) { snprintf(r->why, sizeof r->why, "%.200s", err.msg); goto out; }
    if (ds41_kvx_expect(&h, 1u << DS41_KVX_REQ, r->id, 1, why, sizeof why)) {
        snprintf(r->why, sizeof r->why, "%s", why);
        send_error(S, c, r->id, 1, DS41_KVX_E_BAD, r->why);
        goto out;
    }
    long long n = h.len / 4;
    r->nb = n / BT;
    r->first = h.arg0;
    r->flags = h.arg1;
    ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    if (!ids) { snprintf(r->why, sizeof r->why, "out of memory"); goto out; }
    const uint8_t *b = p;
    int bad = h.len % 4 != 0 || r->nb < 1 || r->first >= r->nb || (r->flags & ~(unsigned)DS41_KVX_REQ_CONTEXT) ||
              !ds41_restore_supported(S->e->cfg);
    for (long long i = 0; i < n && !bad; i++) {
        ids[i] = (int32_t)((uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 | (uint32_t)b[4 * i + 2] << 16 |
                           (uint32_t)b[4 * i + 3] << 24);
        if (ids[i] < 0 || ids[i] >= S->e->cfg->vocab_size) bad = 1;
    }
    if (bad) {
        snprintf(r->why, sizeof r->why, "REQ: %lld ids from block %lld, flags %u: needs a whole block, ids in the "
                 "vocabulary, a first block inside the prompt and known flags", n, r->first, r->flags);
        send_error(S, c, r->id, 1, DS41_KVX_E_BAD, r->why);
        goto out;
    }
    r->sent = calloc((size_t)S->e->cfg->n_kv_sources + 1, sizeof *r->sent);
    if (!r->sent) { snprintf(r->why, sizeof r->why, "out of memory"); goto out; }
    if (S->o.decoder_on_decode) {
        const ds41_config *cfg = S->e->cfg;
        r->stream_rows = (int)ds41_decoder_stream_rows(cfg, r->nb * BT);
        r->stream = malloc((size_t)r->stream_rows * cfg->hc_mult * (cfg->dim + 1) * sizeof(float));
        if (!r->stream) { snprintf(r->why, sizeof r->why, "out of memory for the decoder stream"); goto out; }
    }
    r->seq = 1;
    pthread_t th;
    if (pthread_create(&th, NULL, sender_main, r)) { snprintf(r->why, sizeof r->why, "cannot start a sender"); goto out; }
    r->t0 = now_s();
    int rc = compute(r, ids, &err);
    r->t_computed = now_s() - r->t0;
    if (rc && !atomic_load(&r->failed)) {
        snprintf(r->why, sizeof r->why, "prefill: %.200s", err.msg);
        atomic_store(&r->failed, 1);
    }
    push(r, 0, 0, NULL);   /* DONE after every page (skipped once failed) */
    pthread_join(th, NULL);
    if (!rc && !atomic_load(&r->failed)) {
        /* the decode node hangs up first, once it has read DONE: closing from this side first
         * could reset the connection under frames it has not read yet */
        ds41_kvx_hdr bye;
        void *q = NULL;
        ds41_err e2;
        if (ds41_kvx_recv(c, &bye, &q, 0, S->o.lease_ms, &e2) == 0)
            snprintf(r->why, sizeof r->why, "a %s frame after DONE", ds41_kvx_type_name(bye.type));
        free(q);
    }
    if (rc) send_error(S, c, r->id, r->seq, DS41_KVX_E_FAILED, r->why);
out:
    if (!r->why[0]) {
        atomic_fetch_add(&S->st->served, 1);
        atomic_fetch_add(&S->st->blocks, r->nb - r->first);
        atomic_fetch_add(&S->st->bytes, r->bytes);
        fprintf(stderr, "ds41 prefill node: request %llu from %s: %lld blocks from block %lld (%lld of %lld restored "
                "from the prefix cache), %lld bytes in %.3f s (first page sent at %.4f s, prefill done at %.4f s, RESUME "
                "sent at %.4f s, DONE sent at %.4f s)\n",
                (unsigned long long)r->id, ds41_kvx_peer(c), r->nb - r->first, r->first, r->restored, r->nb, r->bytes,
                now_s() - t0,
                r->t_first, r->t_computed, r->t_resume, r->t_done);
    } else {
        atomic_fetch_add(&S->st->failed, 1);
    }
    ds41_kvx_conn_close(c);
    free(p);
    free(ids);
    /* pages still queued (a failed request) hold references: drop them */
    for (sitem *it = r->head, *nx; it; it = nx) { nx = it->next; ds41_page_unref(it->page); free(it->blob); free(it); }
    int left = slot ? atomic_fetch_sub(&S->st->active, 1) - 1 : atomic_load(&S->st->active);
    if (r->why[0])
        fprintf(stderr, "ds41 prefill node: request %llu: %s; its state is freed after %.3f s (%d requests held)\n",
                (unsigned long long)r->id, r->why, now_s() - t0, left);
    free(r->sent);
    free(r->stream);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
    atomic_fetch_sub(&S->threads, 1);
    return NULL;
}

int ds41_pd_prefill_run(ds41_engine *e, ds41_prefix_cache *pc, const ds41_session_params *sp,
                        const ds41_pd_prefill_opts *o, volatile sig_atomic_t *stop, ds41_err *err) {
    if (!pc) return ds41_errf(err, "--role prefill needs the prefix cache (it keys the compatibility hash)");
    if (!ds41_restore_supported(e->cfg))
        return ds41_errf(err, "--role prefill: a KV source's compress ratio does not divide the %d-token block", BT);
    if (o->decoder_on_decode && ds41_decoder_stream_rows(e->cfg, BT) < 1)
        return ds41_errf(err, "--pd-decoder decode: this checkpoint has no decoder layer after layer %d with every DSpark "
                         "target in the decoder (use --pd-decoder prefill)", e->cfg->first_decoder_layer);
    /* on the heap: a handler that outlives the shutdown wait still finds it (then leaked) */
    pd_srv *S = calloc(1, sizeof *S);
    if (!S) return ds41_errf(err, "out of memory");
    S->e = e;
    S->pc = pc;
    S->sp = *sp;
    S->sp.draft = 0;   /* the prefill node never drafts */
    S->o = *o;
    S->st = o->stats ? o->stats : &S->own;
    if (!S->o.host) S->o.host = "127.0.0.1";
    if (S->o.capacity < 1) S->o.capacity = 1;
    if (S->o.lease_ms < 1) S->o.lease_ms = 10000;
    pthread_mutex_init(&S->compute_mu, NULL);
    S->net = ds41_kvx_net_open(err);
    if (!S->net) { free(S); return -1; }
    ds41_kvx_listener *l = ds41_kvx_listen(S->net, S->o.host, S->o.port, err);
    if (!l) { ds41_kvx_net_close(S->net); free(S); return -1; }
    char fp[65];
    ds41_prefix_fingerprint_hex(pc, fp);
    printf("ds41 prefill node: listening on ucx://%s:%d (compatibility hash %.16s..., capacity %d, lease %d ms, "
           "decoder on the %s node)\n", S->o.host, ds41_kvx_listener_port(l), fp, S->o.capacity, S->o.lease_ms,
           S->o.decoder_on_decode ? "decode" : "prefill");
    fflush(stdout);
    atomic_store(&S->st->listening, 1);
    while (!*stop) {
        ds41_err aerr;
        if (S->o.mirror) {   /* the other ranks wait for rank 0's records: a beat while idle */
            pthread_mutex_lock(&S->compute_mu);
            S->o.mirror->beat(S->o.mirror->ctx);
            pthread_mutex_unlock(&S->compute_mu);
        }
        ds41_kvx_conn *c = ds41_kvx_accept(l, 200, &aerr);
        if (!c) {
            if (aerr.msg[0]) fprintf(stderr, "ds41 prefill node: %s\n", aerr.msg);
            continue;
        }
        pd_req *r = calloc(1, sizeof *r);
        pthread_t th;
        if (r) {
            r->S = S;
            r->c = c;
            pthread_mutex_init(&r->mu, NULL);
            pthread_cond_init(&r->cv, NULL);
            atomic_init(&r->failed, 0);
            atomic_fetch_add(&S->threads, 1);
        }
        if (!r || pthread_create(&th, NULL, handler_main, r)) {
            fprintf(stderr, "ds41 prefill node: cannot take a connection from %s (out of memory or threads)\n", ds41_kvx_peer(c));
            ds41_kvx_conn_close(c);
            if (r) { atomic_fetch_sub(&S->threads, 1); free(r); }
            continue;
        }
        pthread_detach(th);
    }
    atomic_store(&S->st->listening, 0);
    /* handlers end within their lease: wait for them before the engine goes */
    double end = now_s() + S->o.lease_ms / 1000.0 + 2;
    while (atomic_load(&S->threads) > 0 && now_s() < end) {
        usleep(10000);
        if (S->o.mirror) {
            pthread_mutex_lock(&S->compute_mu);
            S->o.mirror->beat(S->o.mirror->ctx);
            pthread_mutex_unlock(&S->compute_mu);
        }
    }
    if (S->o.mirror) {   /* the other ranks leave; a handler still computing after this is refused */
        pthread_mutex_lock(&S->compute_mu);
        S->ended = 1;
        S->o.mirror->end(S->o.mirror->ctx);
        pthread_mutex_unlock(&S->compute_mu);
    }
    fprintf(stderr, "ds41 prefill node: stopped (%lld requests served, %lld failed, %lld bytes sent)\n",
            (long long)atomic_load(&S->st->served), (long long)atomic_load(&S->st->failed),
            (long long)atomic_load(&S->st->bytes));
    ds41_kvx_listener_close(l);
    if (atomic_load(&S->threads) == 0) {   /* else a handler still uses them: left */
        ds41_kvx_net_close(S->net);
        pthread_mutex_destroy(&S->compute_mu);
        free(S);
    }
    return 0;
}
