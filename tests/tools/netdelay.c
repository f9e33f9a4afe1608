/* netdelay: a delay line between two network namespaces, for kernels without the netem qdisc
 * (bench/mpi_netem.sh, tests/netdelay.test.sh; docs/distributed.md "Link latency").
 *   netdelay DELAY_US NETNS_A:TAP_A NETNS_B:TAP_B
 * Attaches to the persistent TAP device TAP_A inside the named namespace NETNS_A (made with
 * `ip -n NETNS_A tuntap add dev TAP_A mode tap`) and to TAP_B inside NETNS_B, then forwards
 * every Ethernet frame one side sends to the other side, DELAY_US microseconds after it read
 * it (CLOCK_MONOTONIC; the frames of one direction keep their order). The two TAPs then act as
 * the two ends of one link with that one-way delay: a ping between them takes 2 x DELAY_US
 * plus the forwarding. A direction holds at most QUEUE frames in flight (more are dropped and
 * counted, as a full queue would). Runs until SIGTERM or SIGINT, then prints on stderr the
 * frames it forwarded and dropped and how late it wrote them past their due time (mean, max):
 * the delay line's own error. Exit 0, or 1 with a message naming what failed (namespace,
 * device, argument). Needs root (setns, /dev/net/tun). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define QUEUE 1024            /* frames in flight per direction */
#define FRAME_MAX 65536       /* the largest frame a TAP can hand over (MTU up to 65518) */

typedef struct frame {
    int64_t due;              /* ns, CLOCK_MONOTONIC */
    int len;
    unsigned char *buf;
} frame;

/* one direction: frames read from fd in, written to fd out */
typedef struct line {
    int in, out;
    frame q[QUEUE];
    int head, n;
    long long fwd, drop, late_sum_ns, late_max_ns;
} line;

static volatile sig_atomic_t stop;
static void on_stop(int sig) { (void)sig; stop = 1; }

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* the TAP dev inside the namespace ns (its name under /run/netns), non-blocking; -1 with a
 * message */
static int tap_open(const char *spec, int self_ns) {
    const char *colon = strchr(spec, ':');
    if (!colon || colon == spec || !colon[1] || strlen(colon + 1) >= IFNAMSIZ) {
        fprintf(stderr, "netdelay: '%s': expected NETNS:TAP (a device name of 1..%d characters)\n", spec, IFNAMSIZ - 1);
        return -1;
    }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "/run/netns/%.*s", (int)(colon - spec), spec);
    int nfd = open(path, O_RDONLY | O_CLOEXEC);
    if (nfd < 0) { fprintf(stderr, "netdelay: namespace %s: %s\n", path, strerror(errno)); return -1; }
    if (setns(nfd, CLONE_NEWNET)) {
        fprintf(stderr, "netdelay: entering namespace %s: %s\n", path, strerror(errno));
        close(nfd);
        return -1;
    }
    close(nfd);
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "netdelay: /dev/net/tun: %s\n", strerror(errno));
    } else {
        struct ifreq ifr;
        memset(&ifr, 0, sizeof ifr);
        ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
        snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", colon + 1);
        if (ioctl(fd, TUNSETIFF, &ifr)) {
            fprintf(stderr, "netdelay: attaching to TAP device %s in %s: %s\n", colon + 1, path, strerror(errno));
            close(fd);
            fd = -1;
        }
    }
    /* back to the namespace the process started in (the next device's lookup is by path) */
    if (setns(self_ns, CLONE_NEWNET)) { fprintf(stderr, "netdelay: returning to the first namespace: %s\n", strerror(errno)); return -1; }
    return fd;
}

/* reads every frame waiting on l->in into the queue, due delay_ns from now */
static int take(line *l, int64_t delay_ns) {
    while (l->n < QUEUE) {
        frame *f = &l->q[(l->head + l->n) % QUEUE];
        ssize_t r = read(l->in, f->buf, FRAME_MAX);
        if (r < 0) {
            if (errno == EAGAIN || errno == EINTR) return 0;
            fprintf(stderr, "netdelay: reading a frame: %s\n", strerror(errno));
            return -1;
        }
        f->len = (int)r;
        f->due = now_ns() + delay_ns;
        l->n++;
    }
    /* the queue is full: what the device still holds is dropped, as a full queue drops */
    unsigned char scratch[FRAME_MAX];
    while (read(l->in, scratch, sizeof scratch) > 0) l->drop++;
    return 0;
}

/* writes every frame whose time has come */
static void give(line *l) {
    while (l->n > 0) {
        frame *f = &l->q[l->head];
        int64_t t = now_ns();
        if (t < f->due) return;
        /* a TAP write hands the frame to the namespace's stack; it does not block */
        if (write(l->out, f->buf, (size_t)f->len) == f->len) {
            l->fwd++;
            l->late_sum_ns += t - f->due;
            if (t - f->due > l->late_max_ns) l->late_max_ns = t - f->due;
        } else {
            l->drop++;
        }
        l->head = (l->head + 1) % QUEUE;
        l->n--;
    }
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: netdelay DELAY_US NETNS_A:TAP_A NETNS_B:TAP_B\n");
        return 1;
    }
    char *end;
    errno = 0;
    long long us = strtoll(argv[1], &end, 10);
    if (errno || end == argv[1] || *end || us < 0 || us > 10000000) {
        fprintf(stderr, "netdelay: delay '%s': expected whole microseconds, 0..10000000\n", argv[1]);
        return 1;
    }
    int64_t delay_ns = us * 1000;
    /* the kernel's default timer slack (50 us) would add itself to every short wait */
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    int self_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (self_ns < 0) { fprintf(stderr, "netdelay: /proc/self/ns/net: %s\n", strerror(errno)); return 1; }
    int a = tap_open(argv[2], self_ns);
    int b = a < 0 ? -1 : tap_open(argv[3], self_ns);
    if (a < 0 || b < 0) return 1;
    static line L[2];
    L[0].in = a; L[0].out = b;
    L[1].in = b; L[1].out = a;
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < QUEUE; i++)
            if (!(L[d].q[i].buf = malloc(FRAME_MAX))) { fprintf(stderr, "netdelay: out of memory\n"); return 1; }
    /* the signals arrive only inside ppoll, so a stop is never missed between two waits */
    sigset_t block, wait_mask;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, &wait_mask);
    sigdelset(&wait_mask, SIGTERM);
    sigdelset(&wait_mask, SIGINT);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    fprintf(stderr, "netdelay: %s <-> %s, one-way delay %lld us\n", argv[2], argv[3], us);
    int rc = 0;
    while (!stop) {
        struct pollfd p[2];
        int64_t next = INT64_MAX;
        for (int d = 0; d < 2; d++) {
            p[d].fd = L[d].in;
            p[d].events = L[d].n < QUEUE ? POLLIN : 0;
            p[d].revents = 0;
            if (L[d].n > 0 && L[d].q[L[d].head].due < next) next = L[d].q[L[d].head].due;
        }
        struct timespec ts, *tp = NULL;
        if (next != INT64_MAX) {
            int64_t w = next - now_ns();
            if (w < 0) w = 0;
            ts.tv_sec = (time_t)(w / 1000000000);
            ts.tv_nsec = (long)(w % 1000000000);
            tp = &ts;
        }
        int r = ppoll(p, 2, tp, &wait_mask);
        if (r < 0 && errno != EINTR) { fprintf(stderr, "netdelay: ppoll: %s\n", strerror(errno)); rc = 1; break; }
        for (int d = 0; d < 2 && r > 0; d++) {
            if (p[d].revents & (POLLERR | POLLHUP | POLLNVAL)) { fprintf(stderr, "netdelay: a TAP device went away\n"); rc = 1; stop = 1; }
            if ((p[d].revents & POLLIN) && take(&L[d], delay_ns)) { rc = 1; stop = 1; }
        }
        give(&L[0]);
        give(&L[1]);
    }
    for (int d = 0; d < 2; d++)
        fprintf(stderr, "netdelay: %s -> %s: %lld frames forwarded, %lld dropped, late by %.1f us on average, %.1f us at most\n",
                argv[2 + d], argv[3 - d], L[d].fwd, L[d].drop, L[d].fwd ? L[d].late_sum_ns / 1e3 / (double)L[d].fwd : 0.0,
                L[d].late_max_ns / 1e3);
    return rc;
}
