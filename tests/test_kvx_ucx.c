/* Tests of the UCX transport of the KV transfer (src/pd/kvx_ucx.c), over TCP on the loopback:
 * frames round-trip between a listener thread and a client, a receive with nothing coming times
 * out within its bound, a frame with a flipped payload byte or a bad header is refused by the
 * receiver with a reason, a peer that closes shows as an error, and a connection to a port
 * nobody listens on fails (never hangs). Ports: the listener's is chosen by the system. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "kvx_ucx.h"

static ds41_kvx_net *net;
static ds41_kvx_listener *lis;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* the server side of each case, chosen by the first frame's arg0 */
static void *server(void *arg) {
    (void)arg;
    for (int n = 0; n < 4; n++) {
        ds41_err err;
        ds41_kvx_conn *c = NULL;
        for (int i = 0; i < 100 && !c; i++) c = ds41_kvx_accept(lis, 100, &err);
        if (!c) return NULL;
        ds41_kvx_hdr h;
        void *p = NULL;
        if (ds41_kvx_recv(c, &h, &p, 1 << 20, 5000, &err)) { ds41_kvx_conn_close(c); continue; }
        if (h.arg0 == 1) {          /* echo, then the same frame again with a flipped payload byte */
            ds41_kvx_hdr o = h;
            o.type = DS41_KVX_LAYER;
            ds41_kvx_send(c, &o, p, 5000, &err);
            uint8_t hb[DS41_KVX_HEADER];
            ds41_kvx_encode(&o, p, hb);
            ((uint8_t *)p)[3] ^= 0x10;
            ds41_kvx_send_bytes(c, hb, sizeof hb, 5000, &err);
            ds41_kvx_send_bytes(c, p, o.len, 5000, &err);
            ds41_kvx_hdr e;
            void *q = NULL;
            ds41_kvx_recv(c, &e, &q, 1 << 20, 5000, &err);   /* wait until the client is done */
            free(q);
        } else if (h.arg0 == 2) {   /* silent: the client's receive must time out */
            ds41_kvx_hdr e;
            void *q = NULL;
            ds41_kvx_recv(c, &e, &q, 1 << 20, 3000, &err);
            free(q);
        } else if (h.arg0 == 3) {   /* half a frame, then gone */
            uint8_t hb[DS41_KVX_HEADER], pl[1000] = { 1 };
            ds41_kvx_hdr o = { .type = DS41_KVX_LAYER, .req = h.req, .len = 1000 };
            ds41_kvx_encode(&o, pl, hb);
            ds41_kvx_send_bytes(c, hb, sizeof hb, 5000, &err);
            ds41_kvx_send_bytes(c, pl, 300, 5000, &err);
            usleep(100000);
        } else if (h.arg0 == 4) {   /* garbage header */
            uint8_t junk[DS41_KVX_HEADER];
            memset(junk, 'x', sizeof junk);
            ds41_kvx_send_bytes(c, junk, sizeof junk, 5000, &err);
            ds41_kvx_hdr e;
            void *q = NULL;
            ds41_kvx_recv(c, &e, &q, 1 << 20, 2000, &err);
            free(q);
        }
        free(p);
        ds41_kvx_conn_close(c);
    }
    return NULL;
}

static ds41_kvx_conn *hello(uint32_t what) {
    ds41_err err;
    ds41_kvx_conn *c = ds41_kvx_connect(net, "127.0.0.1", ds41_kvx_listener_port(lis), &err);
    CHECK(c != NULL, "connect: %s", err.msg);
    if (!c) return NULL;
    uint8_t pl[4096];
    for (int i = 0; i < 4096; i++) pl[i] = (uint8_t)(i * 7);
    ds41_kvx_hdr h = { .type = DS41_KVX_HELLO, .req = 77, .arg0 = what, .layer = -1, .len = 4096 };
    CHECK(ds41_kvx_send(c, &h, pl, 5000, &err) == 0, "send: %s", err.msg);
    return c;
}

static void echo_and_flip(void) {
    ds41_kvx_conn *c = hello(1);
    if (!c) return;
    ds41_err err;
    ds41_kvx_hdr h;
    void *p = NULL;
    CHECK(ds41_kvx_recv(c, &h, &p, 1 << 20, 5000, &err) == 0, "recv: %s", err.msg);
    CHECK(h.type == DS41_KVX_LAYER && h.req == 77 && h.len == 4096, "echo header");
    int same = p != NULL;
    for (int i = 0; same && i < 4096; i++) same = ((uint8_t *)p)[i] == (uint8_t)(i * 7);
    CHECK(same, "echo payload");
    free(p);
    p = NULL;
    CHECK(ds41_kvx_recv(c, &h, &p, 1 << 20, 5000, &err) != 0 && strstr(err.msg, "checksum mismatch") && !p,
          "flipped byte: %s", err.msg);
    ds41_kvx_conn_close(c);
}

static void recv_times_out(void) {
    ds41_kvx_conn *c = hello(2);
    if (!c) return;
    ds41_err err;
    ds41_kvx_hdr h;
    void *p = NULL;
    double t0 = now_s();
    int rc = ds41_kvx_recv(c, &h, &p, 1 << 20, 300, &err);
    double dt = now_s() - t0;
    CHECK(rc != 0 && strstr(err.msg, "timed out"), "timeout: %s", err.msg);
    /* bound: the 300 ms deadline plus at most the 500 ms the forced close may take */
    CHECK(dt >= 0.29 && dt < 1.5, "timed out after %.3f s", dt);
    ds41_kvx_conn_close(c);
}

static void truncated_then_gone(void) {
    ds41_kvx_conn *c = hello(3);
    if (!c) return;
    ds41_err err;
    ds41_kvx_hdr h;
    void *p = NULL;
    double t0 = now_s();
    int rc = ds41_kvx_recv(c, &h, &p, 1 << 20, 4000, &err);
    CHECK(rc != 0 && !p, "a truncated frame was accepted");
    CHECK(now_s() - t0 < 4.9, "took %.2f s", now_s() - t0);
    ds41_kvx_conn_close(c);
}

static void bad_header(void) {
    ds41_kvx_conn *c = hello(4);
    if (!c) return;
    ds41_err err;
    ds41_kvx_hdr h;
    void *p = NULL;
    CHECK(ds41_kvx_recv(c, &h, &p, 1 << 20, 4000, &err) != 0 && strstr(err.msg, "bad magic"), "junk: %s", err.msg);
    ds41_kvx_conn_close(c);
}

static void nobody_listens(void) {
    /* a port that was free a moment ago: bind, read it, close */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t sl = sizeof sa;
    bind(fd, (struct sockaddr *)&sa, sizeof sa);
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    int port = ntohs(sa.sin_port);
    close(fd);
    ds41_err err;
    double t0 = now_s();
    ds41_kvx_conn *c = ds41_kvx_connect(net, "127.0.0.1", port, &err);
    int failed = c == NULL;
    if (c) {
        ds41_kvx_hdr h = { .type = DS41_KVX_HELLO, .layer = -1 };
        void *p = NULL;
        failed = ds41_kvx_send(c, &h, NULL, 2000, &err) != 0 || ds41_kvx_recv(c, &h, &p, 1 << 20, 2000, &err) != 0;
        free(p);
        ds41_kvx_conn_close(c);
    }
    CHECK(failed, "talking to a closed port succeeded");
    CHECK(now_s() - t0 < 5.0, "took %.2f s", now_s() - t0);
}

int main(void) {
    ds41_err err;
    net = ds41_kvx_net_open(&err);
    if (!net) { printf("FAIL kvx_net_open: %s\n", err.msg); return 1; }
    lis = ds41_kvx_listen(net, "127.0.0.1", 0, &err);
    if (!lis) { printf("FAIL kvx_listen: %s\n", err.msg); return 1; }
    pthread_t th;
    pthread_create(&th, NULL, server, NULL);
    RUN_CASE(echo_and_flip);
    RUN_CASE(recv_times_out);
    RUN_CASE(truncated_then_gone);
    RUN_CASE(bad_header);
    pthread_join(th, NULL);
    RUN_CASE(nobody_listens);
    ds41_kvx_listener_close(lis);
    ds41_kvx_net_close(net);
    return check_exit();
}
