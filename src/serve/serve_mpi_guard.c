/* ds41 serve under mpiexec: the 503 guard of rank 0 (serve_mpi.h, docs/distributed.md "Faults").
 *
 * When a rank is killed, MPICH's launcher (hydra) kills every rank's process group at once
 * (kill(-pgid, SIGKILL); each rank is a session leader), rank 0 included, so rank 0 cannot
 * answer its clients. The guard is a small process of rank 0's own, started in a session of its
 * own (so outside the group hydra kills) by exec'ing this binary (`ds41 --serve-guard FD`; no
 * MPI, no model, no threads). Rank 0 hands it a duplicate of each generation request's client
 * socket (SCM_RIGHTS over a unix SOCK_SEQPACKET pair) with the two answers rank 0 prepared for
 * it: a whole HTTP 503 reply in the route's error shape, for when nothing was sent yet, and the
 * stream's tail (an SSE error event, chunk-framed when the reply is chunked), for when a stream
 * had begun; and the socket's count of bytes written so far. When the request completes rank 0
 * sends DONE and the guard closes its duplicate.
 *
 * When the pair reads end-of-file without BYE, rank 0 is gone: for each open request the guard
 * compares the bytes written on the socket now (TCP_INFO's bytes acked + SIOCOUTQ, the bytes
 * not yet acked) with the count at registration: equal, nothing of the reply went out and the
 * client gets the 503; more, a stream gets the tail and a plain reply nothing (it was sent, or
 * cut). Each answer is one non-blocking send of a few hundred bytes; then the guard closes the
 * sockets and exits, so it never waits on a client. BYE (rank 0 ends cleanly, or answered its
 * requests itself before ending the job on a fault) closes everything without a word. Rank 0
 * pays per request one getsockopt, one ioctl and one sendmsg at registration and one sendmsg
 * at the end, on the request's HTTP thread, never in the scheduler's step.
 *
 * Messages (host byte order, the same binary at both ends): a 32-byte header {u32 magic, u32
 * op, u32 id, u32 flags, i64 written, u32 n_full, u32 n_tail}, then for OPEN the n_full bytes of
 * the 503 reply and the n_tail bytes of the stream's tail, with one descriptor attached. */
#define _GNU_SOURCE
#include "serve_mpi.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/tcp.h>

extern char **environ;

enum { HDR = DS41_SGUARD_HDR };

/* The bytes written on TCP socket fd since it opened (acked + still queued), or -1. Read until
 * the acked count holds still across the queue's read, so an ack landing between the two
 * reads is not counted twice. */
int64_t ds41_sguard_written(int fd) {
    for (int k = 0; k < 8; k++) {
        struct tcp_info a, b;
        socklen_t la = sizeof a, lb = sizeof b;
        int q = 0;
        if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &a, &la) || la < offsetof(struct tcp_info, tcpi_bytes_acked) + 8) return -1;
        if (ioctl(fd, SIOCOUTQ, &q)) return -1;
        if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &b, &lb)) return -1;
        if (a.tcpi_bytes_acked == b.tcpi_bytes_acked) return (int64_t)a.tcpi_bytes_acked + q;
    }
    return -1;
}

/* ---------------------------------------------------------------- rank 0's side */

static struct {
    pthread_mutex_t mu;
    int fd;               /* rank 0's end; -1: no guard */
    pid_t pid;
    uint32_t next;
    long long opened, dropped;
    double cost_s;        /* CPU seconds of the request threads' guard work (ds41_sguard_note) */
} G = { PTHREAD_MUTEX_INITIALIZER, -1, 0, 0, 0, 0, 0 };

int ds41_sguard_start(char *err, size_t errcap) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv)) {
        snprintf(err, errcap, "socketpair: %s", strerror(errno));
        return -1;
    }
    char exe[4096];
    ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (l <= 0) {
        snprintf(err, errcap, "/proc/self/exe: %s", strerror(errno));
        close(sv[0]); close(sv[1]);
        return -1;
    }
    exe[l] = 0;
    /* the guard's environment without the process manager's variables: it is no rank */
    size_t ne = 0;
    while (environ[ne]) ne++;
    char **env = calloc(ne + 1, sizeof *env);
    if (!env) { snprintf(err, errcap, "out of memory"); close(sv[0]); close(sv[1]); return -1; }
    size_t k = 0;
    static const char *drop[] = { "PMI_", "PMIX_", "MPIR_", "MPICH_", "HYDRA_", "HYDI_", "OMPI_", "UCX_" };
    for (size_t i = 0; i < ne; i++) {
        int skip = 0;
        for (size_t d = 0; d < sizeof drop / sizeof drop[0]; d++) skip |= !strncmp(environ[i], drop[d], strlen(drop[d]));
        if (!skip) env[k++] = environ[i];
    }
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&at);
    /* descriptor 3 is the guard's end; 0-2 /dev/null (holding rank 0's stderr pipe would keep
     * the launcher's proxy waiting); nothing else crosses (the PMI socket, the listener) */
    posix_spawn_file_actions_adddup2(&fa, sv[1], 3);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addclosefrom_np(&fa, 4);
    /* its own session: hydra kills each rank's process group, not the guard's */
    sigset_t none, dfl;
    sigemptyset(&none);
    sigfillset(&dfl);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &dfl);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    char *argv[] = { exe, "--serve-guard", "3", NULL };
    pid_t pid;
    int rc = posix_spawn(&pid, exe, &fa, &at, argv, env);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    free(env);
    close(sv[1]);
    if (rc) {
        snprintf(err, errcap, "cannot start %s --serve-guard: %s", exe, strerror(rc));
        close(sv[0]);
        return -1;
    }
    pthread_mutex_lock(&G.mu);
    G.fd = sv[0];
    G.pid = pid;
    pthread_mutex_unlock(&G.mu);
    return 0;
}

/* G.mu held. A send that fails (the guard is gone) turns the guard off. */
static int send_locked(const struct msghdr *mh, int flags) {
    for (;;) {
        ssize_t r = sendmsg(G.fd, mh, flags | MSG_NOSIGNAL);
        if (r >= 0) return 0;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return -1;
        fprintf(stderr, "ds41 serve: the 503 guard went away (%s); requests in flight will not be answered if the job "
                        "is killed\n", strerror(errno));
        close(G.fd);
        G.fd = -1;
        return -1;
    }
}

void ds41_sguard_note(double s) {
    pthread_mutex_lock(&G.mu);
    G.cost_s += s;
    pthread_mutex_unlock(&G.mu);
}

uint32_t ds41_sguard_open(int fd, int stream, const char *full, size_t n_full, const char *tail, size_t n_tail) {
    if (fd < 0 || !n_full || n_full + n_tail > (1u << 16)) return 0;
    int64_t w = ds41_sguard_written(fd);
    if (w < 0) return 0;
    uint8_t h[HDR];
    pthread_mutex_lock(&G.mu);
    if (G.fd < 0) { pthread_mutex_unlock(&G.mu); return 0; }
    uint32_t id = ++G.next;
    if (!id) id = ++G.next;
    ds41_sguard_header(h, DS41_SGUARD_OPEN, id, stream ? DS41_SGUARD_STREAM : 0, w, (uint32_t)n_full, (uint32_t)n_tail);
    struct iovec iov[3] = { { h, HDR }, { (void *)full, n_full }, { (void *)tail, n_tail } };
    union { struct cmsghdr c; char b[CMSG_SPACE(sizeof(int))]; } cm;
    memset(&cm, 0, sizeof cm);
    struct msghdr mh = { .msg_iov = iov, .msg_iovlen = n_tail ? 3 : 2, .msg_control = cm.b, .msg_controllen = sizeof cm.b };
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    /* never wait on the guard here: a full queue leaves this request uncovered */
    if (send_locked(&mh, MSG_DONTWAIT)) { G.dropped++; id = 0; }
    else G.opened++;
    pthread_mutex_unlock(&G.mu);
    return id;
}

static void send_plain(uint32_t op, uint32_t id) {
    uint8_t h[HDR];
    ds41_sguard_header(h, op, id, 0, 0, 0, 0);
    struct iovec iov = { h, HDR };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
    /* waits if the guard's queue is full: a DONE it missed would hold the client's socket open */
    if (G.fd >= 0) send_locked(&mh, 0);
}

void ds41_sguard_done(uint32_t id) {
    if (!id) return;
    pthread_mutex_lock(&G.mu);
    send_plain(DS41_SGUARD_DONE, id);
    pthread_mutex_unlock(&G.mu);
}

void ds41_sguard_release(void) {
    pthread_mutex_lock(&G.mu);
    if (G.fd >= 0) {
        send_plain(DS41_SGUARD_BYE, 0);
        if (G.fd >= 0) close(G.fd);
        G.fd = -1;
    }
    pid_t pid = G.pid;
    G.pid = 0;
    pthread_mutex_unlock(&G.mu);
    /* it exits on BYE (or on the pair's end) at once */
    if (pid > 0) waitpid(pid, NULL, 0);
}

void ds41_sguard_stats(long long *opened, long long *dropped, double *cost_s) {
    pthread_mutex_lock(&G.mu);
    *opened = G.opened;
    *dropped = G.dropped;
    *cost_s = G.cost_s;
    pthread_mutex_unlock(&G.mu);
}

/* ---------------------------------------------------------------- the guard process */

typedef struct entry {
    uint32_t id, flags;
    int fd;
    int64_t written;
    char *full, *tail;
    size_t n_full, n_tail;
} entry;

static void entry_close(entry *e) {
    close(e->fd);
    free(e->full);
    free(e->tail);
}

/* rank 0 is gone: each open request its answer, one non-blocking send each */
static void answer(entry *t, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int64_t w = ds41_sguard_written(t[i].fd);
        const char *b = NULL;
        size_t bn = 0;
        if (w == t[i].written) b = t[i].full, bn = t[i].n_full;
        else if (w > t[i].written && (t[i].flags & DS41_SGUARD_STREAM)) b = t[i].tail, bn = t[i].n_tail;
        if (b) (void)!send(t[i].fd, b, bn, MSG_DONTWAIT | MSG_NOSIGNAL);
        shutdown(t[i].fd, SHUT_RDWR);
        entry_close(&t[i]);
    }
}

int ds41_sguard_main(int argc, char **argv) {
    char *end = NULL;
    long fdl = argc == 2 ? strtol(argv[1], &end, 10) : -1;
    int type = 0, dom = 0;
    socklen_t l1 = sizeof type, l2 = sizeof dom;
    if (argc != 2 || !end || *end || fdl < 0 || fdl > 65535 || getsockopt((int)fdl, SOL_SOCKET, SO_TYPE, &type, &l1) ||
        getsockopt((int)fdl, SOL_SOCKET, SO_DOMAIN, &dom, &l2) || type != SOCK_SEQPACKET || dom != AF_UNIX) {
        fprintf(stderr, "ds41 --serve-guard: internal: started by ds41 serve under mpiexec with the descriptor of its unix "
                        "SOCK_SEQPACKET pair (got '%s')\n", argc > 1 ? argv[1] : "");
        return 2;
    }
    int fd = (int)fdl;
    prctl(PR_SET_NAME, "ds41-guard", 0, 0, 0);
    signal(SIGPIPE, SIG_IGN);
    size_t cap = HDR + (1u << 16);
    uint8_t *buf = malloc(cap);
    entry *t = NULL;
    size_t n = 0, tcap = 0;
    if (!buf) return 1;
    for (;;) {
        union { struct cmsghdr c; char b[CMSG_SPACE(4 * sizeof(int))]; } cm;
        struct iovec iov = { buf, cap };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b, .msg_controllen = sizeof cm.b };
        ssize_t r = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) { answer(t, n); break; }   /* rank 0 is gone */
        int fds[4], nfd = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
                for (size_t k = 0; k < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); k++) {
                    int d;
                    memcpy(&d, CMSG_DATA(c) + k * sizeof(int), sizeof d);
                    if (nfd < 4) fds[nfd++] = d;
                    else close(d);
                }
        ds41_sguard_msg m;
        char err[200];
        int bad = (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || ds41_sguard_decode(buf, (size_t)r, nfd, &m, err, sizeof err);
        if (bad) {   /* cannot come from rank 0: drop it */
            for (int k = 0; k < nfd; k++) close(fds[k]);
            continue;
        }
        if (m.op == DS41_SGUARD_BYE) {
            for (size_t i = 0; i < n; i++) entry_close(&t[i]);
            n = 0;
            break;
        }
        if (m.op == DS41_SGUARD_DONE) {
            for (size_t i = 0; i < n; i++)
                if (t[i].id == m.id) { entry_close(&t[i]); t[i] = t[--n]; break; }
            continue;
        }
        if (n == tcap) {
            size_t nc = tcap ? 2 * tcap : 64;
            entry *nt = realloc(t, nc * sizeof *nt);
            if (!nt) { close(fds[0]); continue; }
            t = nt, tcap = nc;
        }
        entry *e = &t[n];
        e->full = malloc(m.n_full);
        e->tail = malloc(m.n_tail ? m.n_tail : 1);
        if (!e->full || !e->tail) { free(e->full); free(e->tail); close(fds[0]); continue; }
        memcpy(e->full, m.full, m.n_full);
        if (m.n_tail) memcpy(e->tail, m.tail, m.n_tail);
        e->n_full = m.n_full, e->n_tail = m.n_tail;
        e->id = m.id, e->flags = m.flags, e->written = m.written, e->fd = fds[0];
        n++;
    }
    free(t);
    free(buf);
    return 0;
}
