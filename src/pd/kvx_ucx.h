/* ds41 KV transfer over UCX (docs/pd.md): connections that carry the frames of
 * src/store/kvx_frame.h between a decode node and prefill nodes.
 *
 * UCX's ucp stream API over client-server endpoints (a listener on HOST:PORT, clients connect
 * to it by socket address): TCP here (UCX_TLS=tcp, or tcp,self,sm), RDMA where a cluster has
 * it, the same calls. One UCP context and one worker per process, in UCS_THREAD_MODE_MULTI, so
 * that any thread may block on its own connection: a blocking call progresses the worker until
 * its request completes, the deadline passes (the endpoint is then closed by force: a timed-out
 * connection is never reused) or the endpoint reports an error (peer gone, refused). Every call
 * is bounded by its timeout. */
#ifndef DS41_KVX_UCX_H
#define DS41_KVX_UCX_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "kvx_frame.h"

typedef struct ds41_kvx_net ds41_kvx_net;
typedef struct ds41_kvx_conn ds41_kvx_conn;
typedef struct ds41_kvx_listener ds41_kvx_listener;

/* The process's UCX context and worker (UCX_TLS defaults to tcp when unset). */
ds41_kvx_net *ds41_kvx_net_open(ds41_err *err);
void ds41_kvx_net_close(ds41_kvx_net *n);

/* A listener on host:port (port 0: any free port; ds41_kvx_listener_port gives it). */
ds41_kvx_listener *ds41_kvx_listen(ds41_kvx_net *n, const char *host, int port, ds41_err *err);
int ds41_kvx_listener_port(const ds41_kvx_listener *l);
/* The next connection, waiting at most timeout_ms: NULL on timeout (err->msg empty) or error. */
ds41_kvx_conn *ds41_kvx_accept(ds41_kvx_listener *l, int timeout_ms, ds41_err *err);
void ds41_kvx_listener_close(ds41_kvx_listener *l);

/* A connection to host:port. UCX connects lazily: an unreachable node shows as an error of the
 * first send or receive. */
ds41_kvx_conn *ds41_kvx_connect(ds41_kvx_net *n, const char *host, int port, ds41_err *err);
/* Closes (flushing pending sends for at most 1 s) and frees. */
void ds41_kvx_conn_close(ds41_kvx_conn *c);

/* Raw bytes: the whole buffer within timeout_ms, else -1 with a message (timeout, peer error). */
int ds41_kvx_send_bytes(ds41_kvx_conn *c, const void *buf, size_t n, int timeout_ms, ds41_err *err);
int ds41_kvx_recv_bytes(ds41_kvx_conn *c, void *buf, size_t n, int timeout_ms, ds41_err *err);

/* One frame: h (h->len payload bytes) encoded and sent with its payload. */
int ds41_kvx_send(ds41_kvx_conn *c, const ds41_kvx_hdr *h, const void *payload, int timeout_ms, ds41_err *err);
/* One frame: the header checked, then the payload (malloc'd into *payload, NULL when empty;
 * the caller frees) checked against its checksum. -1 with a message naming what was wrong. */
int ds41_kvx_recv(ds41_kvx_conn *c, ds41_kvx_hdr *h, void **payload, uint32_t max_payload, int timeout_ms,
                  ds41_err *err);

/* The peer's address as text (for logs). */
const char *ds41_kvx_peer(const ds41_kvx_conn *c);

#endif
