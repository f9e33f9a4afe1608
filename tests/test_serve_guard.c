/* serve's 503 guard under mpiexec (src/serve/serve_mpi_guard.c, docs/distributed.md "Faults"):
 * its messages decode to exactly their fields, every malformed one in
 * tests/malformed/serve-guard/ (hex bytes, the descriptors it came with, the expected message)
 * is refused with that message, the fuzz seeds decode; a TCP socket's written count follows
 * what was sent; and the guard process itself (ds41_sguard_main, in a child of this test) gives
 * each open request the answer its state calls for when its pair ends without BYE: the whole
 * 503 where nothing was sent, the stream's tail after what a stream sent, nothing after a
 * plain reply, nothing for a request that was DONE; and nothing at all after BYE. */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "common.h"
#include "malformed.h"
#include "serve_mpi.h"

static const char FULL[] = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\n{}";
static const char TAIL[] = "data: {\"error\":{}}\n\n";

static size_t build(uint8_t *b, uint32_t op, uint32_t id, uint32_t flags, int64_t written, const char *full, const char *tail) {
    size_t nf = full ? strlen(full) : 0, nt = tail ? strlen(tail) : 0;
    ds41_sguard_header(b, op, id, flags, written, (uint32_t)nf, (uint32_t)nt);
    if (nf) memcpy(b + DS41_SGUARD_HDR, full, nf);
    if (nt) memcpy(b + DS41_SGUARD_HDR + nf, tail, nt);
    return DS41_SGUARD_HDR + nf + nt;
}

static void valid_messages(void) {
    uint8_t b[512];
    ds41_sguard_msg m;
    char err[256] = "";
    size_t n = build(b, DS41_SGUARD_OPEN, 9, DS41_SGUARD_STREAM, 123456789012LL, FULL, TAIL);
    CHECK(ds41_sguard_decode(b, n, 1, &m, err, sizeof err) == 0 && m.op == DS41_SGUARD_OPEN && m.id == 9 &&
          m.flags == DS41_SGUARD_STREAM && m.written == 123456789012LL && m.full == b + 32 && m.n_full == strlen(FULL) &&
          !memcmp(m.full, FULL, m.n_full) && m.tail == m.full + m.n_full && m.n_tail == strlen(TAIL), "OPEN stream: %s", err);
    n = build(b, DS41_SGUARD_OPEN, 1, 0, 0, FULL, NULL);
    CHECK(ds41_sguard_decode(b, n, 1, &m, err, sizeof err) == 0 && m.n_tail == 0 && m.flags == 0, "OPEN plain: %s", err);
    n = build(b, DS41_SGUARD_DONE, 77, 0, 0, NULL, NULL);
    CHECK(ds41_sguard_decode(b, n, 0, &m, err, sizeof err) == 0 && m.op == DS41_SGUARD_DONE && m.id == 77 && !m.full, "DONE: %s", err);
    n = build(b, DS41_SGUARD_BYE, 0, 0, 0, NULL, NULL);
    CHECK(ds41_sguard_decode(b, n, 0, &m, err, sizeof err) == 0 && m.op == DS41_SGUARD_BYE, "BYE: %s", err);
}

static char *read_or_null(const char *path, size_t *len) {
    char *b = NULL;
    ds41_err err;
    size_t n = 0;
    if (ds41_read_file(path, 1 << 16, &b, &n, &err)) return NULL;
    if (len) *len = n;
    return b;
}

/* a malformed case: NAME/message (hex), NAME/fds (the descriptors it came with) */
static int load_case(const char *path, const char *name, ds41_err *e) {
    (void)name;
    char p[1500];
    snprintf(p, sizeof p, "%s/message", path);
    char *hex = read_or_null(p, NULL);
    snprintf(p, sizeof p, "%s/fds", path);
    char *fds = read_or_null(p, NULL);
    int rc = -1;
    if (!hex || !fds) {
        snprintf(e->msg, sizeof e->msg, "message or fds missing");
    } else {
        uint8_t b[1024];
        size_t n = 0;
        for (const char *s = hex; n < sizeof b && s[0] && s[1] && s[0] != '\n'; s += 2) {
            unsigned v;
            if (sscanf(s, "%2x", &v) != 1) break;
            b[n++] = (uint8_t)v;
        }
        ds41_sguard_msg m;
        rc = ds41_sguard_decode(b, n, atoi(fds), &m, e->msg, sizeof e->msg);
    }
    free(hex);
    free(fds);
    return rc;
}

static void malformed_cases(void) {
    int cases = malformed_corpus("tests/malformed/serve-guard", "/expected", load_case);
    CHECK(cases >= 16, "%d malformed cases", cases);
}

/* the fuzz seeds (a byte with the descriptor count, then the message) decode */
static void fuzz_seeds(void) {
    static const char *const seeds[] = { "open_plain", "open_stream", "done", "bye" };
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        char p[256];
        snprintf(p, sizeof p, "fuzz/corpus/fuzz_serve_guard/%s", seeds[i]);
        size_t len = 0;
        char *b = read_or_null(p, &len);
        ds41_sguard_msg m;
        char err[256] = "";
        CHECK(b && len > 1 && ds41_sguard_decode((const uint8_t *)b + 1, len - 1, b[0] & 3, &m, err, sizeof err) == 0, "%s: %s",
              seeds[i], err);
        free(b);
    }
}

/* a connected loopback TCP pair: *srv the accepted end, *cli the client's */
static int tcp_pair(int *srv, int *cli) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof a;
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 4) || getsockname(l, (struct sockaddr *)&a, &al)) return -1;
    *cli = socket(AF_INET, SOCK_STREAM, 0);
    if (*cli < 0 || connect(*cli, (struct sockaddr *)&a, sizeof a)) return -1;
    *srv = accept(l, NULL, NULL);
    close(l);
    return *srv < 0 ? -1 : 0;
}

static void written_counts(void) {
    int s, c;
    CHECK(tcp_pair(&s, &c) == 0, "loopback pair: %s", strerror(errno));
    int64_t w0 = ds41_sguard_written(s);
    CHECK(w0 == 0, "a fresh socket has written %lld bytes", (long long)w0);
    char buf[3000];
    memset(buf, 'x', sizeof buf);
    CHECK(write(s, buf, 1000) == 1000 && write(s, buf, 2000) == 2000, "write");
    CHECK(ds41_sguard_written(s) == 3000, "written %lld, expected 3000", (long long)ds41_sguard_written(s));
    int u[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, u) == 0 && ds41_sguard_written(u[0]) == -1, "a unix socket has no TCP count");
    close(u[0]); close(u[1]); close(s); close(c);
}

static void send_msg(int fd, const uint8_t *b, size_t n, int pass) {
    struct iovec iov = { (void *)b, n };
    union { struct cmsghdr c; char b[CMSG_SPACE(sizeof(int))]; } cm;
    memset(&cm, 0, sizeof cm);
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
    if (pass >= 0) {
        mh.msg_control = cm.b;
        mh.msg_controllen = sizeof cm.b;
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET, c->cmsg_type = SCM_RIGHTS, c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &pass, sizeof pass);
    }
    CHECK(sendmsg(fd, &mh, 0) == (ssize_t)n, "sendmsg: %s", strerror(errno));
}

/* everything the client end reads until EOF (at most 2 s) */
static size_t read_all(int fd, char *out, size_t cap) {
    size_t n = 0;
    for (;;) {
        struct pollfd p = { fd, POLLIN, 0 };
        if (poll(&p, 1, 2000) <= 0) return (size_t)-1;
        ssize_t r = read(fd, out + n, cap - 1 - n);
        if (r <= 0) break;
        n += (size_t)r;
    }
    out[n] = 0;
    return n;
}

/* four requests: 0 nothing sent, 1 a stream that sent 5 bytes, 2 a plain reply that sent 5
 * bytes, 3 DONE; then the pair ends without BYE (bye = 0) or after BYE */
static void guard_run(int bye) {
    int pr[2], srv[4], cli[4];
    CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, pr) == 0, "socketpair");
    for (int i = 0; i < 4; i++) CHECK(tcp_pair(&srv[i], &cli[i]) == 0, "loopback pair %d", i);
    pid_t pid = fork();
    if (pid == 0) {
        close(pr[0]);
        for (int i = 0; i < 4; i++) close(srv[i]), close(cli[i]);
        char a[16];
        snprintf(a, sizeof a, "%d", pr[1]);
        char *argv[] = { "--serve-guard", a, NULL };
        _exit(ds41_sguard_main(2, argv));
    }
    close(pr[1]);
    uint8_t b[512];
    for (int i = 0; i < 4; i++) {
        size_t n = build(b, DS41_SGUARD_OPEN, (uint32_t)(i + 1), i == 1 ? DS41_SGUARD_STREAM : 0, ds41_sguard_written(srv[i]), FULL,
                         i == 1 ? TAIL : NULL);
        send_msg(pr[0], b, n, srv[i]);
        if (i == 1 || i == 2) CHECK(write(srv[i], "hello", 5) == 5, "write");
        close(srv[i]);   /* the guard's copy keeps each connection open */
    }
    send_msg(pr[0], b, build(b, DS41_SGUARD_DONE, 4, 0, 0, NULL, NULL), -1);
    if (bye) send_msg(pr[0], b, build(b, DS41_SGUARD_BYE, 0, 0, 0, NULL, NULL), -1);
    close(pr[0]);   /* rank 0 is gone */
    int st = -1;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the guard's exit status %d", st);
    char got[1024], want[1024];
    const char *expect[4] = { bye ? "" : FULL, NULL, "hello", "" };
    snprintf(want, sizeof want, "hello%s", bye ? "" : TAIL);
    expect[1] = want;
    for (int i = 0; i < 4; i++) {
        size_t n = read_all(cli[i], got, sizeof got);
        CHECK(n != (size_t)-1 && !strcmp(got, expect[i]), "bye %d, request %d: got '%s', expected '%s'", bye, i, n == (size_t)-1 ? "(no EOF)" : got, expect[i]);
        close(cli[i]);
    }
}

static void guard_answers(void) { guard_run(0); }
static void guard_bye(void) { guard_run(1); }

int main(void) {
    RUN_CASE(valid_messages);
    RUN_CASE(malformed_cases);
    RUN_CASE(fuzz_seeds);
    RUN_CASE(written_counts);
    RUN_CASE(guard_answers);
    RUN_CASE(guard_bye);
    return check_exit();
}
