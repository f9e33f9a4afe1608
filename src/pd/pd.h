/* ds41 prefill/decode disaggregation (P7, docs/pd.md).
 *
 * A prefill node (ds41 serve --role prefill) prefills a prompt's whole 128-token blocks (the
 * CED prefill of one node, no logits) and ships each KV source's pages as soon as its layer is
 * done, in the paged layout of the prefix cache (cache.h), then the bounded resume state the
 * forward left (every layer's SWA ring, the compressors' partial state, the Engram history, the
 * published index-K owner and, for a drafting decode node, the DSpark context rows: one RESUME
 * frame, src/store/kvx_resume.h). A decode node (ds41 serve --role decode) is the OpenAI front:
 * it receives the pages, adds them to its prefix cache as blocks (ds41_prefix_insert), installs
 * pages and state into the request's session (ds41_session_install: nothing replayed), prefills
 * the prompt's tail and decodes. The state is the one a local prefill of the same blocks
 * leaves, so a remote prefill decodes to the bits of one node (tests/pd.test.sh). With
 * --pd-decoder decode the prefill node stops at the first decoder layer's keys and ships the
 * residual stream there instead of the decoder's rings; the decode node's install runs the
 * decoder layers on it (restore.h), with the same bits.
 *
 * Fault injection (tests only, tests/pd.test.sh): DS41_PD_FAULT=KIND:N makes this process
 * misbehave once, at its N-th (1-based) LAYER frame sent (prefill node) or at its N-th fetch
 * (decode node):
 *   flip:N       prefill: the frame's payload gets one byte flipped after its checksum
 *   truncate:N   prefill: the frame's header and half its payload, then the connection closes
 *   rflip, rtruncate, rbad:N  prefill: the same on its N-th RESUME frame; rbad ships a
 *                payload whose checksum is right but whose ring count is wrong (a peer's bug)
 *   stall:N      prefill: stops before the frame and prints "pd-fault: stalled" (a hung node;
 *                the test may kill -9 it there: a node dying mid-transfer)
 *   vanish:N     decode: after the handshake, prints "pd-fault: vanished" and stops talking
 *                (the test kills or stops the decode node: the prefill node's lease)
 * Nothing else reads it; without it the code paths are the normal ones. */
#ifndef DS41_PD_H
#define DS41_PD_H

#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "ds41.h"
#include "kvx_resume.h"
#include "restore.h"

/* ---- prefill node ---- */
/* What a prefill node has done (its /health and /metrics, serve_pd.c): written by the node's
 * threads, read by any. */
typedef struct ds41_pd_prefill_stats {
    _Atomic long long served;   /* requests whose DONE went out */
    _Atomic long long failed;   /* requests that ended otherwise (busy ones included) */
    _Atomic long long busy;     /* of those, refused at capacity */
    _Atomic long long blocks;   /* blocks shipped by the served requests */
    _Atomic long long bytes;    /* frame bytes (headers included) sent by the served requests */
    _Atomic int active;         /* requests held now */
    _Atomic int listening;      /* 1 once it accepts connections */
} ds41_pd_prefill_stats;

/* A prefill node that is an MPI job (serve --role prefill under mpiexec, docs/distributed.md):
 * every forward is collective, so rank 0's compute tells the other ranks each engine call it
 * makes on a request's session just before making it, all under the node's compute mutex (the
 * calls of two requests never interleave): open; load (before its own hit query over ids[n]:
 * with --cache-dir, rank 0 alone has the store, so the blocks of the chain it holds on disk
 * only come into memory on every rank, rank 0's read from its store and shipped to the others,
 * and the hit query then finds the same chain everywhere); seq (after its own hit query, the
 * same query on the other ranks, and the session's prefill form: CED rows, forwards stopped at
 * stop_layer, 0: none); restore (records and runs the prefix cache's restore: the tokens the
 * session then holds); forward (before its own forward of ids[k..n) from position k); publish
 * (before its own); close. beat about every few hundred ms while the node is up; end once, when
 * no request can compute any more. serve_pd.c implements it with the serve mirror's records
 * (serve_mpi.h: OPEN, BLOCKS, PD_SEQ, RESTORE, PD_FWD, PUBLISH, CLOSE). */
typedef struct ds41_pd_mirror {
    void (*open)(void *ctx, ds41_session *s);
    void (*load)(void *ctx, ds41_session *s, const int32_t *ids, size_t n);
    void (*seq)(void *ctx, ds41_session *s, int stop_layer, const int32_t *ids, size_t n);
    long long (*restore)(void *ctx, ds41_session *s, const int32_t *ids, size_t n);
    void (*forward)(void *ctx, ds41_session *s, long long k, const int32_t *ids, size_t n);
    void (*publish)(void *ctx, ds41_session *s, const int32_t *ids, size_t n);
    void (*close)(void *ctx, ds41_session *s);
    void (*beat)(void *ctx);
    void (*end)(void *ctx);
    void *ctx;
} ds41_pd_mirror;

typedef struct ds41_pd_prefill_opts {
    const char *host;         /* address to listen on (NULL: 127.0.0.1) */
    int port;                 /* 0: any free port (printed) */
    int capacity;             /* requests held at once; more get BUSY */
    int lease_ms;             /* a decode node silent this long is gone: its state is freed */
    /* --pd-decoder: where the decoder layers run on the rows their windows reach (docs/pd.md).
     * 0 (prefill): here, and the decoder's rings travel; 1 (decode): on the decode node, from
     * the residual stream at the first decoder layer, which travels instead, and this node
     * reads no decoder weight */
    int decoder_on_decode;
    ds41_pd_prefill_stats *stats;   /* NULL: kept inside; else must outlive the node */
    const ds41_pd_mirror *mirror;   /* under mpiexec (rank 0); NULL: one process */
} ds41_pd_prefill_opts;

/* Serves prefill requests until *stop becomes non-zero; prints "ds41 prefill node: listening
 * on ucx://HOST:PORT" once ready. sp: the session parameters of the prefill (index-K reading
 * must be pc's). Returns 0, or -1 with err when it could not start. */
int ds41_pd_prefill_run(ds41_engine *e, ds41_prefix_cache *pc, const ds41_session_params *sp,
                        const ds41_pd_prefill_opts *o, volatile sig_atomic_t *stop, ds41_err *err);

/* ---- decode node ---- */
typedef struct ds41_pd_client ds41_pd_client;
typedef struct ds41_pd_result {
    long long blocks;         /* blocks received and added to the prefix cache */
    long long bytes;          /* frame bytes received (headers + payloads) */
    double seconds;           /* first LAYER frame to DONE */
    char node[96];            /* the prefill node that served it */
    long long restored;       /* ds41_pd_start: prompt tokens the session holds afterwards */
    int installed;            /* ds41_pd_start: 1 when the shipped state was installed (no replay) */
    double t_last_frame;      /* CLOCK_MONOTONIC seconds when the last LAYER or RESUME frame arrived */
} ds41_pd_result;

/* What a fetch received: the pages of blocks [first, nb) ([nb - first][n_stores], one reference
 * each) and the RESUME payload (checked against this node's cache). */
typedef struct ds41_pd_fetched {
    uint8_t **pages;
    long long first, nb;
    uint8_t *resume;
    size_t resume_len;
} ds41_pd_fetched;
void ds41_pd_fetched_free(ds41_pd_fetched *f, int n_stores);

/* nodes: "HOST:PORT[,HOST:PORT...]"; timeout_ms bounds every wait for a prefill node's next
 * frame (a hung node). */
ds41_pd_client *ds41_pd_client_open(ds41_engine *e, ds41_prefix_cache *pc, const char *nodes, int timeout_ms,
                                    ds41_err *err);
void ds41_pd_client_close(ds41_pd_client *cl);
/* Remote prefill of the whole blocks [first, n / 128) of ids, synchronously: the least loaded
 * node first (fewest requests this client has in flight on it), then the others; the pages
 * received go into the prefix cache. 0, or -1 with err when no node delivered. */
int ds41_pd_fetch(ds41_pd_client *cl, const int32_t *ids, size_t n, long long first, unsigned flags,
                  ds41_pd_result *res, ds41_pd_fetched *out, ds41_err *err);

/* The same on a thread of its own, for the scheduler, followed by the install of session s
 * (at position 0, the job's until poll says done): the local hit's pages from the prefix cache,
 * the fetched ones and the shipped state (ds41_session_install), nothing replayed; the prefix
 * cache's restore over ids[0..n_prompt) only when the local hit's blocks were evicted meanwhile
 * or the install refused the state. The fetch covers ids[0..n_fetch)
 * (whole blocks). After a failed fetch the session is restored from the local hit only, unless
 * no_fallback. start: NULL when no thread could be started; poll: 0 running, 1 done, -1 the
 * fetch failed (msg); res->restored: the tokens the session holds (-1: the restore failed,
 * ds41_session_error); finish joins and frees. */
typedef struct ds41_pd_job ds41_pd_job;
ds41_pd_job *ds41_pd_start(ds41_pd_client *cl, ds41_session *s, const int32_t *ids, size_t n_prompt, size_t n_fetch,
                           long long first, int no_fallback);
int ds41_pd_poll(ds41_pd_job *j, ds41_pd_result *res, char *msg, size_t cap);
void ds41_pd_finish(ds41_pd_job *j);

/* The decode node's install of what a fetch received (f, for prompt ids[0..n_prompt); a
 * deferred fetch's pages must first go into the prefix cache, ds41_prefix_insert): session s
 * (at position 0) gets the local hit's pages (prefix cache), the fetched ones and the RESUME state checked
 * against g (ds41_session_install: with the decoder stream, a forward of the decoder layers).
 * The tokens s holds (the fetch's M), or 0 when the hit's blocks were evicted meanwhile or the
 * state was refused (s reset: the caller restores from the prefix cache). Deterministic in its
 * arguments and the cache's state: under mpiexec every rank calls it with the same ones
 * (serve_mpi.h, INSTALL) and so holds the same state. */
long long ds41_pd_install(ds41_prefix_cache *pc, const ds41_kvx_geom *g, ds41_session *s, const int32_t *ids,
                          size_t n_prompt, const ds41_pd_fetched *f);
/* The geometry ds41_pd_install checks a RESUME payload against, for engine e's cache. */
int ds41_pd_geom_of(ds41_engine *e, ds41_kvx_geom *g, ds41_err *err);
const ds41_kvx_geom *ds41_pd_client_geom(const ds41_pd_client *cl);

/* Under mpiexec (serve --role decode as a job): the install and the fallback restore run
 * forwards, which are collective, so they must run on rank 0's scheduler thread between its
 * records, not on the job's thread. After ds41_pd_client_defer, a job only fetches (nothing
 * enters the prefix cache on its thread); once ds41_pd_poll says it ended, the scheduler's
 * thread calls ds41_pd_complete with hooks that record and run the install (h->install, as
 * ds41_prefix_insert of the pages then ds41_pd_install) and the restore (h->restore, as ds41_prefix_restore), with the same logic
 * as the job's thread otherwise; ds41_pd_poll then gives res->restored. */
typedef struct ds41_pd_hooks {
    long long (*install)(void *ctx, ds41_session *s, const int32_t *ids, size_t n_prompt, const ds41_pd_fetched *f);
    long long (*restore)(void *ctx, ds41_session *s, const int32_t *ids, size_t n);
    void *ctx;
} ds41_pd_hooks;
void ds41_pd_client_defer(ds41_pd_client *cl);
void ds41_pd_complete(ds41_pd_job *j, const ds41_pd_hooks *h);

/* ---- resume state (pd_resume.c) ---- */
/* The geometry of cache c of engine e as a RESUME payload describes it. */
int ds41_pd_geom(const ds41_engine *e, const ds41_cache *c, ds41_kvx_geom *g, ds41_err *err);
/* Prefill node: the RESUME payload of q's state (malloc'd, *n bytes); with_context: the DSpark
 * context rows too. stream != NULL: the decoder split's form, q's rings before the first
 * decoder layer D and stream (the block input of layer D at the last ds41_kvx_stream_rows
 * positions: X rows then pre rows, FP32) instead of the decoder's rings and the context rows.
 * NULL with err. */
uint8_t *ds41_pd_resume_pack(const ds41_seq *q, int with_context, const float *stream, size_t *n, ds41_err *err);
/* Decode node: payload p[n] checked against geometry g for position M, as the install view
 * (pointing into p). 0 or -1 with err naming what was wrong. */
int ds41_pd_resume_view(const ds41_kvx_geom *g, const uint8_t *p, size_t n, long long M, ds41_resume_state *st,
                        ds41_err *err);

/* Fault injection (see above): 1 when DS41_PD_FAULT names `kind` and this is its n-th call. */
int ds41_pd_fault(const char *kind);

#endif
