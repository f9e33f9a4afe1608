/* ds41 serve: connection limits decided when a connection is accepted: at most max_total at
 * once and at most max_per_addr from one client address (IPv4 or IPv6, port ignored). A
 * connection over a limit is closed at once (microhttpd's accept policy), so a handful of idle
 * or trickling clients cannot starve the others, and a refused client is not left waiting in
 * the listen backlog (what microhttpd's own limit does). */
#ifndef DS41_SERVE_CONN_H
#define DS41_SERVE_CONN_H

#include <sys/socket.h>

typedef struct ds41_conn_limit ds41_conn_limit;

/* max_per_addr 0: no per-address limit. NULL when out of memory. */
ds41_conn_limit *ds41_conn_limit_new(int max_total, int max_per_addr);
void ds41_conn_limit_free(ds41_conn_limit *l);
/* Whether a new connection from a may be accepted now. */
int ds41_conn_limit_allow(ds41_conn_limit *l, const struct sockaddr *a, socklen_t len);
/* A connection from a started (+1) or closed (-1). */
void ds41_conn_limit_count(ds41_conn_limit *l, const struct sockaddr *a, int delta);

#endif
