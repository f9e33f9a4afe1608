/* ds41 MPI runtime (dist.h, docs/distributed.md): start and end of the job, the start-up
 * check, the step plan, and the routed-expert exchange behind the MoE dispatch. MPI-3
 * standard calls only (MPICH and Open MPI build it); every wait is bounded by --mpi-timeout.
 *
 * Exchange (replicated attention: every rank holds every row). Per MoE sublayer, rank q runs
 * the experts it owns on the rows routed to them and sends their outputs, in (row, choice)
 * order, to every other rank with one point-to-point message each (its length follows from
 * the routing, which every rank computes identically); the messages are posted in begin and
 * completed in end, so the shared expert runs while they travel. Each rank then adds, row by
 * row, the k outputs in ascending expert id: the additions of one process, in its order.
 * Point-to-point rather than a collective so that a rank that does not answer is named.
 * The waits inside a forward (these exchanges, the Engram rows) are bounded, without
 * --mpi-timeout, by a few seconds past the slowest forward this rank has run (fwd_limit).
 * Every message starts with a header (layer, rows, a hash of the routing) so that ranks that
 * drifted apart stop with a message instead of adding another layer's numbers. */
#include "dist.h"
#include "dist_pipe.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef DS41_HAVE_MPI
#include <mpi.h>
#endif

static struct {
    int on, rank, size;
    double timeout;             /* seconds a rank waits for a peer (--mpi-timeout, or the default) */
    int timeout_set;            /* --mpi-timeout was given: every wait uses it */
    double fwd_t0, fwd_last;    /* the forward under way began; its last in-forward wait ended */
    double fwd_slowest;         /* the slowest forward so far (0: none measured) */
    const char *map_path;
    int argc;
    char **argv;
    int err_fd;                 /* where this rank's own messages go (stderr, kept on rank > 0) */
    int agreed;                 /* every rank knows the job failed (start-up verdict): finalize, no abort */
    ds41_placement place;
    const ds41_weights *w;
    uint8_t *own;               /* [n_layers][n_experts]: this rank owns the expert */
    ds41_dist_stats st;
    void (*fault_hook)(const char *msg);
    double fault_delay;
    char xres[400];             /* the routed experts' residency line (DS41_MPI_VERBOSE=1), taken at close */
    struct xspan *adv;          /* the other ranks' expert runs advised MADV_NOHUGEPAGE (whole pages) */
    size_t n_adv;
} g = { 0, 0, 1, 30.0, 0, 0.0, 0.0, 0.0, NULL, 0, NULL, 2, 0, { 0, 0, 0, NULL }, NULL, NULL, { 0, 0, 0, 0, 0.0 }, NULL, 0.0, "",
        NULL, 0 };

int ds41_dist_rank(void) { return g.rank; }
const char *ds41_dist_expert_map(void) { return g.map_path; }
int ds41_dist_size(void) { return g.size; }
double ds41_dist_timeout(void) { return g.timeout; }
void ds41_dist_set_fault_hook(void (*fn)(const char *msg)) { g.fault_hook = fn; }
void ds41_dist_set_fault_delay(double s) { g.fault_delay = s; }
void ds41_dist_get_stats(ds41_dist_stats *s) { *s = g.st; }

int ds41_dist_built(void) {
#ifdef DS41_HAVE_MPI
    return 1;
#else
    return 0;
#endif
}

#ifdef DS41_HAVE_MPI
/* One line on this rank's error stream: "ds41: ..." (rank 0) or "ds41 [rank r]: ...". */
static void say(const char *fmt, ...) {
    char buf[2048];
    int n = g.rank ? snprintf(buf, sizeof buf, "ds41 [rank %d]: ", g.rank) : snprintf(buf, sizeof buf, "ds41: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = strlen(buf);
    buf[len++] = '\n';
    ssize_t w = write(g.err_fd, buf, len);
    (void)w;
}
#endif

/* The launcher's world size from the environment, 0 when not launched by one. */
static int launched_size(void) {
    const char *v = getenv("PMI_SIZE");
    if (!v) v = getenv("OMPI_COMM_WORLD_SIZE");
    if (!v && getenv("PMIX_RANK")) v = "2";   /* PMIx gives no size variable: MPI_Init tells */
    if (!v) return 0;
    long n = strtol(v, NULL, 10);
    return n < 1 ? 1 : (int)(n > INT_MAX ? INT_MAX : n);
}

int ds41_dist_start(int *argc, char **argv) {
#ifdef DS41_HAVE_MPI
    ds41_rank_watch(launched_size(), argv);   /* before argv is edited: the rank gets it whole */
#endif
    /* the job's flags, wherever they are on the command line */
    int o = 1;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i];
        char perr[256];
        int pf = ds41_pipe_flag(a, i + 1 < *argc ? argv[i + 1] : NULL, perr, sizeof perr);   /* --split, --layer-map */
        if (pf < 0) {
            fprintf(stderr, "ds41: %s\n", perr);
            return 2;
        }
        if (pf > 0) {
            i++;
            continue;
        }
        if (!strcmp(a, "--mpi-timeout") || !strcmp(a, "--expert-map")) {
            if (i + 1 >= *argc) {
                fprintf(stderr, "ds41: %s needs a value\n", a);
                return 2;
            }
            const char *v = argv[++i];
            if (!strcmp(a, "--expert-map")) {
                g.map_path = v;
            } else {
                char *end;
                errno = 0;
                double t = strtod(v, &end);
                if (errno || end == v || *end || !(t >= 0.1 && t <= 86400.0)) {
                    fprintf(stderr, "ds41: --mpi-timeout: '%s' is not a number of seconds in 0.1..86400\n", v);
                    return 2;
                }
                g.timeout = t;
                g.timeout_set = 1;
            }
            continue;
        }
        argv[o++] = argv[i];
    }
    argv[o] = NULL;
    if (ds41_pipe_on() && g.map_path) {
        fprintf(stderr, "ds41: --expert-map places experts over the ranks of --split experts; with --split layers each "
                        "rank runs all the experts of its layers (use --layer-map to move layers)\n");
        return 2;
    }
    const char *pe = ds41_pipe_flags_error();   /* --layer-map, --pipe-batches without --split layers */
    if (pe) {
        fprintf(stderr, "ds41: %s\n", pe);
        return 2;
    }
    *argc = o;
    g.argc = o;
    g.argv = argv;
    int n = launched_size();
    if (!n) return 0;
#ifdef DS41_HAVE_MPI
    int provided = 0;
    /* serve's scheduler thread makes the calls (serialized: never two threads at once); the
     * other commands make them on the main thread */
    int level = o > 1 && !strcmp(argv[1], "serve") ? MPI_THREAD_SERIALIZED : MPI_THREAD_FUNNELED;
    if (MPI_Init_thread(NULL, NULL, level, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "ds41: MPI_Init failed\n");
        return 1;
    }
    g.on = 1;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &g.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g.size);
    if (g.rank > 0) {
        /* output only from rank 0; this rank's own messages (a fault it sees) still go out */
        int nul = open("/dev/null", O_WRONLY);
        if (nul >= 0) {
            fflush(stdout);
            dup2(nul, 1);
            const char *v = getenv("DS41_MPI_VERBOSE");
            if (!(v && !strcmp(v, "1"))) {
                int keep = dup(2);
                if (keep >= 0) g.err_fd = keep;
                fflush(stderr);
                dup2(nul, 2);
            }
            close(nul);
        }
    }
    return 0;
#else
    if (n > 1) {
        fprintf(stderr, "ds41: launched as one of %d ranks, but this ds41 was built without MPI (mpicc was not on PATH "
                        "at build time): rebuild with MPICH's or Open MPI's mpicc available\n", n);
        return 2;
    }
    return 0;
#endif
}

#ifdef DS41_HAVE_MPI
static int wait_soft(MPI_Request *r, double limit);

/* Ends the process with the agreed status if MPI_Finalize has not returned in 10 s. */
static void *finalize_watchdog(void *arg) {
    struct timespec ts = { 10, 0 };
    nanosleep(&ts, NULL);
    say("MPI_Finalize did not return within 10 s; exiting with the agreed status");
    _exit(*(int *)arg);
    return NULL;
}
#endif

#ifdef DS41_HAVE_MPI
/* The routed experts of other ranks: this rank never reads them, but the kernel maps more than
 * a fault's page: the page-cache pages around it (fault-around, 64 KiB) and, where the mapping is
 * advised MADV_HUGEPAGE (safetensors.c), a whole large folio (up to 2 MiB, seen on Linux 6.18
 * after a cold read: half the bytes of the other rank's experts of a test checkpoint were in a
 * rank's page tables). Both stop at the end of a mapping (VMA). So the other ranks' experts, in
 * runs of adjacent tensors, are advised MADV_NOHUGEPAGE, which gives each run a VMA of its own:
 * a fault in this rank's tensors maps nothing of them, and with -bind-to numa their pages are
 * not first touched here. (The page cache's readahead may still read a neighbour's bytes with
 * this rank's, at most a folio at each end of a run.) */
typedef struct xspan { uintptr_t a, z; } xspan;

static int xspan_cmp(const void *x, const void *y) {
    uintptr_t a = ((const xspan *)x)->a, b = ((const xspan *)y)->a;
    return a < b ? -1 : a > b;
}

/* calls f(p, n, own, arg) for each routed expert tensor (weights and scales) */
static void each_expert_tensor(void (*f)(const uint8_t *p, size_t n, int own, void *arg), void *arg) {
    for (int l = 0; l < g.w->n_layers && l < g.place.n_layers; l++) {
        const ds41_layer_weights *lw = &g.w->layers[l];
        for (int e = 0; e < lw->n_experts && e < g.place.n_experts; e++) {
            const ds41_fp4w *m[3] = { &lw->experts[e].w1, &lw->experts[e].w2, &lw->experts[e].w3 };
            int own = g.own[(size_t)l * g.place.n_experts + e];
            for (int k = 0; k < 6; k++) {
                const ds41_fp4w *x = m[k / 2];
                const uint8_t *p = k & 1 ? x->s : x->w;
                size_t n = k & 1 ? (size_t)x->out * (size_t)((x->in + 31) / 32) : (size_t)x->out * (size_t)(x->in / 2);
                if (p && n) f(p, n, own, arg);
            }
        }
    }
}

typedef struct { xspan *v; size_t n; } xspans;

static void add_other(const uint8_t *p, size_t n, int own, void *arg) {
    xspans *s = arg;
    if (own) return;
    s->v[s->n].a = (uintptr_t)p;
    s->v[s->n].z = (uintptr_t)p + n;
    s->n++;
}

static void advise_others(void) {
    free(g.adv);
    g.adv = NULL;
    g.n_adv = 0;
    size_t cap = 0;
    for (int l = 0; l < g.w->n_layers; l++) cap += (size_t)g.w->layers[l].n_experts * 6;
    xspans s = { malloc((cap ? cap : 1) * sizeof(xspan)), 0 };
    if (!s.v) return;   /* advice only: without it the pages are still read only when run */
    each_expert_tensor(add_other, &s);
    qsort(s.v, s.n, sizeof *s.v, xspan_cmp);
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t pm = (uintptr_t)(pg > 0 ? pg : 4096) - 1;
    size_t m = 0;
    for (size_t i = 0; i < s.n; i++) {   /* runs: tensors less than a page apart (the file's padding) */
        if (m && s.v[i].a <= s.v[m - 1].z + pm) {
            if (s.v[i].z > s.v[m - 1].z) s.v[m - 1].z = s.v[i].z;
        } else {
            s.v[m++] = s.v[i];
        }
    }
    size_t k = 0;
    for (size_t i = 0; i < m; i++) {   /* whole pages only: a page shared with this rank's bytes stays */
        uintptr_t a = (s.v[i].a + pm) & ~pm, z = s.v[i].z & ~pm;
        if (z <= a) continue;
#ifdef MADV_NOHUGEPAGE
        if (madvise((void *)a, z - a, MADV_NOHUGEPAGE)) continue;
#else
        continue;
#endif
        s.v[k].a = a;
        s.v[k].z = z;
        k++;
    }
    g.adv = s.v;
    g.n_adv = k;
}

/* Under DS41_MPI_VERBOSE=1: the routed experts' bytes in this rank's page tables, its own and the
 * other ranks' (those in the runs advised above: none unless this rank read them). */
typedef struct { long long all[2], res[2]; int bad; } xres_t;

static void count_res(const uint8_t *p, size_t n, int own, void *arg) {
    xres_t *r = arg;
    long long b = ds41_dist_resident(p, n);   /* whole pages: at most the tensor's bytes counted */
    if (b < 0) r->bad = 1;
    if (b > (long long)n) b = (long long)n;
    r->all[!own] += (long long)n;
    r->res[!own] += b;
}

static int expert_residency(char *line, size_t cap) {
    if (!g.w || !g.own) return 0;
    xres_t r;
    memset(&r, 0, sizeof r);
    each_expert_tensor(count_res, &r);
    long long adv = 0, adv_res = 0;
    for (size_t i = 0; i < g.n_adv && !r.bad; i++) {
        long long b = ds41_dist_resident((const void *)g.adv[i].a, g.adv[i].z - g.adv[i].a);
        if (b < 0) r.bad = 1;
        adv += (long long)(g.adv[i].z - g.adv[i].a);
        adv_res += b;
    }
    if (r.bad) return 0;
    snprintf(line, cap,
             "routed experts in this rank's page tables: its own %lld of %lld bytes; the other ranks' %lld of %lld bytes, "
             "%lld of the %lld in their %zu runs advised apart",
             r.res[0], r.all[0], r.res[1], r.all[1], adv_res, adv, g.n_adv);
    return 1;
}
#endif

int ds41_dist_not_mine(const ds41_config *c, const char *name) {
#ifdef DS41_HAVE_MPI
    static int early;   /* 1: g.place built for the copy, -1: it could not be (every tensor copied) */
    if (!g.on || g.size < 2 || ds41_pipe_on() || !c || !name) return 0;
    int l, e, n = 0;
    if (sscanf(name, "layers.%d.ffn.experts.%d.%n", &l, &e, &n) == 2 && n > 0) {
    } else if (n = 0, sscanf(name, "mtp.%d.ffn.experts.%d.%n", &l, &e, &n) == 2 && n > 0) {
        l += c->n_layers;
    } else {
        return 0;
    }
    if (!early) {
        /* the placement ds41_dist_join builds again (and checks across the ranks) */
        char why[256];
        int ne = c->n_routed_experts > c->dspark_n_experts ? c->n_routed_experts : c->dspark_n_experts;
        ds41_placement_free(&g.place);
        early = ds41_placement_default(&g.place, g.size, c->n_layers + c->n_mtp, ne) ||
                        (g.map_path && ds41_placement_load(&g.place, g.map_path, why, sizeof why))
                    ? -1
                    : 1;
    }
    return early > 0 && l >= 0 && e >= 0 && l < g.place.n_layers && e < g.place.n_experts &&
           ds41_dist_owner(&g.place, l, e) != g.rank;
#else
    (void)c;
    (void)name;
    return 0;
#endif
}

void ds41_dist_weights_closing(const ds41_weights *w) {
#ifdef DS41_HAVE_MPI
    if (!g.on || !w || g.w != w) return;
    const char *v = getenv("DS41_MPI_VERBOSE");
    if (v && !strcmp(v, "1") && g.size > 1 && !ds41_pipe_on() && !expert_residency(g.xres, sizeof g.xres)) g.xres[0] = 0;
    g.w = NULL;
    free(g.adv);
    g.adv = NULL;
    g.n_adv = 0;
#else
    (void)w;
#endif
}

int ds41_dist_finish(int rc) {
#ifdef DS41_HAVE_MPI
    if (!g.on) return rc;
    fflush(stdout);
    fflush(stderr);
    if (g.size > 1 && !g.agreed) {
        /* every rank ends here with its status: when all arrive they agree on the worst and
         * finalize (a failure every rank saw, such as a bad flag, ends cleanly); a rank that
         * does not arrive in time is still computing or waiting for a peer, so the job ends
         * with MPI_Abort rather than leave it waiting */
        int worst = rc;
        MPI_Request rq;
        double limit = g.timeout < 5.0 ? g.timeout : 5.0;
        if (MPI_Iallreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &rq) != MPI_SUCCESS || wait_soft(&rq, limit))
            MPI_Abort(MPI_COMM_WORLD, rc ? rc : 1);
        rc = worst;
    }
    const char *v = getenv("DS41_MPI_VERBOSE");
    if (v && !strcmp(v, "1") && g.size > 1) {
        /* this rank's peak resident set: its own experts' pages plus the replicated ones */
        long long hwm = -1;
        FILE *f = fopen("/proc/self/status", "r");
        char line[256];
        while (f && fgets(line, sizeof line, f))
            if (!strncmp(line, "VmHWM:", 6)) hwm = strtoll(line + 6, NULL, 10);
        if (f) fclose(f);
        say("%lld expert exchanges over %lld rows: %lld bytes sent, %lld received, %.3f s waiting for peers; peak RSS "
            "%lld KiB", g.st.exchanges, g.st.rows, g.st.bytes_sent, g.st.bytes_recv, g.st.wait_s, hwm);
        if (g.xres[0]) say("%s", g.xres);
        char eg[1024];
        if (ds41_dist_engram_report(eg, sizeof eg)) say("%s", eg);
        if (ds41_pipe_report(eg, sizeof eg)) say("%s", eg);
    }
    ds41_placement_free(&g.place);
    free(g.own);
    /* every rank has agreed on the status: a transport that then stalls in its teardown (seen
     * with UCX over TCP on a loaded host) must not keep the job alive */
    static int final_rc;
    final_rc = rc;
    pthread_t wd;
    if (pthread_create(&wd, NULL, finalize_watchdog, &final_rc) == 0) pthread_detach(wd);
    MPI_Finalize();
#endif
    return rc;
}

uint64_t ds41_dist_flags_hash(void) {
    uint64_t h = DS41_FNV0;
    for (int i = 1; i < g.argc; i++) {
        const char *a = g.argv[i];
        if (i > 1 && (!strcmp(a, "-m") || !strcmp(a, "--model"))) {
            i++;   /* the path may differ between hosts; its content is hashed apart */
            continue;
        }
        h = ds41_fnv(h, a, strlen(a) + 1);
    }
    return h;
}

#ifdef DS41_HAVE_MPI

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void fatal(int code, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void fatal(int code, const char *fmt, ...) {
    char buf[1500];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    say("%s", buf);
    if (g.rank == 0 && g.fault_hook) g.fault_hook(buf);
    if (g.rank != 0 && g.fault_delay > 0) {
        struct timespec ts = { (time_t)g.fault_delay, (long)((g.fault_delay - (double)(time_t)g.fault_delay) * 1e9) };
        nanosleep(&ts, NULL);
    }
    if (g.rank == 0) {
        /* the launcher forwards rank 0's stderr through its proxy; MPI_Abort at once can end
         * the job before the line got out (seen with hydra while stdout was busy) */
        struct timespec ts = { 0, 200000000 };
        nanosleep(&ts, NULL);
    }
    MPI_Abort(MPI_COMM_WORLD, code);
    _exit(code);
}

/* The default bound of a wait inside a forward (an expert or Engram exchange): a peer there
 * lags this rank by at most the work of one forward (the ranks run the same rows, layer by
 * layer), so FWD_MARGIN_S seconds past FWD_TIMES times the slowest forward this rank has run
 * (from its step hook to its last exchange; a longer prefill chunk or context than any before
 * stays inside the factor). Before the first forward is measured, and when --mpi-timeout was
 * given, g.timeout. The waits for rank 0's own decisions (the step plan, broadcasts, serve's
 * records) keep g.timeout: rank 0 may work between forwards (tokenize, compile a grammar). */
#define FWD_MARGIN_S 5.0
#define FWD_TIMES 4.0
static double fwd_limit(void) {
    if (g.timeout_set || g.fwd_slowest <= 0) return g.timeout;
    return FWD_MARGIN_S + FWD_TIMES * g.fwd_slowest;
}

/* A wait inside a forward ended: the forward under way lasted at least until now. */
static void fwd_mark(void) {
    if (g.fwd_t0 > 0) g.fwd_last = now_s();
}

/* a request of rank 0 that every other rank completes (its broadcasts) */
#define PEER_OTHERS (-2)

/* Waits for r[0..n) for at most limit seconds; peer[i]: the rank request i talks to (or
 * PEER_OTHERS: every rank but 0). Past
 * the limit the job ends with one message naming the ranks that did not answer. A rank other
 * than 0 waits a grace period longer when rank 0 is not among them, so that rank 0, which
 * sees the same silence, is the one that reports it. */
static void wait_all(MPI_Request *r, int n, const int *peer, double limit, const char *what) {
    double t0 = now_s(), grace = limit / 2 > 2.0 ? limit / 2 : 2.0;
    long spins = 0;
    for (;;) {
        int done = 0;
        MPI_Status sts[n > 0 ? n : 1];   /* n <= 2 x ranks; not MPI_STATUSES_IGNORE, which gcc 12 misreads */
        int rc = MPI_Testall(n, r, &done, sts);
        if (rc != MPI_SUCCESS) {
            char es[MPI_MAX_ERROR_STRING];
            int el = 0;
            MPI_Error_string(rc, es, &el);
            fatal(3, "%s failed: %s (a rank died or a link broke); ending the job", what, es);
        }
        if (done) {
            g.st.wait_s += now_s() - t0;
            return;
        }
        double t = now_s() - t0;
        if (limit > 0 && t > limit) {
            char list[512] = "";
            int have0 = 0, nl = 0;
            for (int i = 0; i < n; i++) {
                int f = 1;
                MPI_Request_get_status(r[i], &f, MPI_STATUS_IGNORE);
                if (f || (peer[i] < 0 && peer[i] != PEER_OTHERS)) continue;
                if (peer[i] == PEER_OTHERS) {   /* rank 0's broadcast: it cannot tell which of them */
                    size_t L = strlen(list);
                    if (g.size > 2) snprintf(list + L, sizeof list - L, "%s1..%d", nl ? ", " : "", g.size - 1);
                    else snprintf(list + L, sizeof list - L, "%s1", nl ? ", " : "");
                    nl += g.size > 2 ? 2 : 1;
                    continue;
                }
                int dup = 0;
                for (int j = 0; j < i; j++) {
                    int fj = 1;
                    MPI_Request_get_status(r[j], &fj, MPI_STATUS_IGNORE);
                    if (!fj && peer[j] == peer[i]) dup = 1;
                }
                if (dup) continue;
                have0 |= peer[i] == 0;
                size_t L = strlen(list);
                snprintf(list + L, sizeof list - L, "%s%d", nl++ ? ", " : "", peer[i]);
            }
            if (g.rank != 0 && !have0 && t < limit + grace) goto sleep;
            fatal(3, "rank%s %s did not answer within %.1f s (%s): it died, hangs or its link is down; ending the job "
                     "(--mpi-timeout)", nl > 1 ? "s" : "", nl ? list : "?", limit, what);
        }
    sleep:
        /* a short spin, then sleep in small steps: ranks may share cores */
        if (++spins > 2000) {
            struct timespec ts = { 0, 50000 };
            nanosleep(&ts, NULL);
        }
    }
}

/* ------------------------------------------------------------------ expert exchange */

typedef struct xhdr {
    uint32_t magic, layer, T, k;
    uint64_t route;             /* FNV of the choices */
} xhdr;
#define XMAGIC 0x31345344u

static struct {
    float *slots;
    size_t slots_cap;
    unsigned char *sbuf, *rbuf;
    size_t sbuf_cap, rbuf_cap;
    size_t *roff;               /* [size]: offset of rank q's message in rbuf */
    int *cnt;                   /* [size]: slots rank q owns in this exchange */
    MPI_Request *req;
    int *peer;
    int nreq, layer, tag;
    uint64_t route;
} x;

static int grow_bytes(unsigned char **b, size_t *cap, size_t n) {
    if (n <= *cap) return 0;
    unsigned char *p = realloc(*b, n);
    if (!p) return -1;
    *b = p;
    *cap = n;
    return 0;
}

static void xbegin(void *self, const ds41_ctx *ctx, const ds41_moe_rows *r) {
    (void)self;
    long li = r->lw - g.w->layers;
    if (li < 0 || li >= g.place.n_layers) fatal(1, "expert exchange: layer weights outside the model's layers");
    int l = (int)li, T = r->T, k = r->k, dim = r->cfg->dim, E = r->lw->n_experts, N = g.size;
    size_t nslot = (size_t)T * k, row = (size_t)dim * sizeof(float);
    if (k > 64) fatal(1, "expert exchange: %d experts per token (at most 64 supported)", k);
    if (!x.cnt) {
        x.cnt = calloc((size_t)N, sizeof *x.cnt);
        x.roff = calloc((size_t)N + 1, sizeof *x.roff);
        x.req = calloc(2 * (size_t)N, sizeof *x.req);
        x.peer = calloc(2 * (size_t)N, sizeof *x.peer);
        if (!x.cnt || !x.roff || !x.req || !x.peer) fatal(1, "out of memory for the expert exchange");
    }
    if (nslot * dim > x.slots_cap) {
        free(x.slots);
        x.slots = malloc(nslot * row);
        if (!x.slots) fatal(1, "out of memory for the expert exchange (%d rows)", T);
        x.slots_cap = nslot * dim;
    }
    memset(x.cnt, 0, (size_t)N * sizeof *x.cnt);
    for (size_t i = 0; i < nslot; i++) {
        int e = r->sel[i];
        if (e >= 0 && e < E) x.cnt[ds41_dist_owner(&g.place, l, e)]++;
    }
    x.route = ds41_fnv(DS41_FNV0, r->sel, nslot * sizeof(int));
    x.layer = l;
    /* this rank's experts, outputs into their slots */
    if (ds41_moe_experts(ctx, r, g.own + (size_t)l * g.place.n_experts, NULL, x.slots))
        fatal(1, "out of memory in the experts of layer %d", l);
    /* pack them in slot order behind the header */
    size_t sn = sizeof(xhdr) + (size_t)x.cnt[g.rank] * row, rn = 0;
    for (int q = 0; q < N; q++) {
        x.roff[q] = rn;
        if (q != g.rank) rn += sizeof(xhdr) + (size_t)x.cnt[q] * row;
    }
    if (sn > INT_MAX || rn > (size_t)INT_MAX * 2)
        fatal(1, "expert exchange of %d rows is too large for one message; feed shorter chunks (--chunk)", T);
    if (grow_bytes(&x.sbuf, &x.sbuf_cap, sn) || grow_bytes(&x.rbuf, &x.rbuf_cap, rn ? rn : 1))
        fatal(1, "out of memory for the expert exchange (%d rows)", T);
    xhdr h = { XMAGIC, (uint32_t)l, (uint32_t)T, (uint32_t)k, x.route };
    memcpy(x.sbuf, &h, sizeof h);
    unsigned char *p = x.sbuf + sizeof h;
    for (size_t i = 0; i < nslot; i++) {
        int e = r->sel[i];
        if (e < 0 || e >= E || ds41_dist_owner(&g.place, l, e) != g.rank) continue;
        memcpy(p, x.slots + i * dim, row);
        p += row;
    }
    x.tag = (x.tag + 1) & 0x7fff;
    x.nreq = 0;
    for (int q = 0; q < N; q++) {
        if (q == g.rank) continue;
        size_t qn = sizeof(xhdr) + (size_t)x.cnt[q] * row;
        x.peer[x.nreq] = q;
        MPI_Irecv(x.rbuf + x.roff[q], (int)qn, MPI_BYTE, q, 100 + x.tag, MPI_COMM_WORLD, &x.req[x.nreq++]);
        g.st.bytes_recv += (long long)qn;
    }
    for (int q = 0; q < N; q++) {
        if (q == g.rank) continue;
        x.peer[x.nreq] = q;
        MPI_Isend(x.sbuf, (int)sn, MPI_BYTE, q, 100 + x.tag, MPI_COMM_WORLD, &x.req[x.nreq++]);
        g.st.bytes_sent += (long long)sn;
    }
    g.st.exchanges++;
    g.st.rows += T;
}

static void xend(void *self, const ds41_ctx *ctx, const ds41_moe_rows *r, float *acc) {
    (void)self;
    (void)ctx;
    int l = x.layer, T = r->T, k = r->k, dim = r->cfg->dim, E = r->lw->n_experts, N = g.size;
    size_t nslot = (size_t)T * k, row = (size_t)dim * sizeof(float);
    char what[64];
    snprintf(what, sizeof what, "expert exchange of layer %d", l);
    wait_all(x.req, x.nreq, x.peer, fwd_limit(), what);
    fwd_mark();
    /* the peers' outputs into their slots, after checking they answer this exchange */
    for (int q = 0; q < N; q++) {
        if (q == g.rank) continue;
        const unsigned char *p = x.rbuf + x.roff[q];
        xhdr h;
        memcpy(&h, p, sizeof h);
        if (h.magic != XMAGIC || h.layer != (uint32_t)l || h.T != (uint32_t)T || h.k != (uint32_t)k || h.route != x.route)
            fatal(4, "rank %d answered another expert exchange (layer %u, %u rows) than this rank's (layer %d, %d rows%s): "
                     "the ranks' states differ; ending the job", q, h.layer, h.T, l, T,
                  h.layer == (uint32_t)l && h.T == (uint32_t)T ? ", another routing" : "");
        p += sizeof h;
        for (size_t i = 0; i < nslot; i++) {
            int e = r->sel[i];
            if (e < 0 || e >= E || ds41_dist_owner(&g.place, l, e) != q) continue;
            memcpy(x.slots + i * dim, p, row);
            p += row;
        }
    }
    ds41_dist_combine(r, x.slots, acc);
}

void ds41_dist_combine(const ds41_moe_rows *r, const float *slots, float *acc) {
    int T = r->T, k = r->k, dim = r->cfg->dim, E = r->lw->n_experts;
    for (int t = 0; t < T; t++) {
        int ord[64], m = 0;
        for (int i = 0; i < k && m < 64; i++) {
            int e = r->sel[(size_t)t * k + i];
            if (e < 0 || e >= E) continue;
            int j = m++;
            while (j > 0 && r->sel[(size_t)t * k + ord[j - 1]] > e) { ord[j] = ord[j - 1]; j--; }
            ord[j] = i;
        }
        float *ar = acc + (size_t)t * dim;
        for (int j = 0; j < m; j++) {
            const float *o = slots + ((size_t)t * k + ord[j]) * dim;
            for (int d = 0; d < dim; d++) ar[d] += o[d];
        }
    }
}

void ds41_dist_wait(MPI_Request *r, int n, const int *peer, const char *what) {
    /* the Engram exchange, and under --dp-attention and --split layers the exchanges and
     * hops: the ranks there run different work, so no forward of this rank bounds a peer's
     * and fwd_limit stays at g.timeout (no forward is measured: ds41_dist_step measures only
     * the replicated forwards) */
    wait_all(r, n, peer, fwd_limit(), what);
    fwd_mark();
}

const ds41_placement *ds41_dist_placement(void) { return &g.place; }

void ds41_dist_fatal(int code, const char *fmt, ...) {
    char buf[1400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fatal(code, "%s", buf);
}

void ds41_dist_count(long long rows, long long sent, long long recv) {
    g.st.exchanges++;
    g.st.rows += rows;
    g.st.bytes_sent += sent;
    g.st.bytes_recv += recv;
}

/* Waits for one request at most limit seconds; -1 past it (nothing reported). */
static int wait_soft(MPI_Request *r, double limit) {
    double t0 = now_s();
    long spins = 0;
    for (;;) {
        int done = 0;
        MPI_Status st;
        if (MPI_Test(r, &done, &st) != MPI_SUCCESS) return -1;
        if (done) return 0;
        if (now_s() - t0 > limit) return -1;
        if (++spins > 2000) {
            struct timespec ts = { 0, 50000 };
            nanosleep(&ts, NULL);
        }
    }
}

/* ------------------------------------------------------------------ start-up check */

typedef struct join_rec {
    int32_t ok, pad;
    uint64_t h[4];
    char msg[480];
} join_rec;

static const char *const hash_what[4] = {
    "the checkpoint's config.json", "the checkpoint's shard list (names and sizes)",
    "the command-line flags (or --expert-map)", "the kernel mode (--exact, the fast kernels' ISA)"
};

int ds41_dist_join(const ds41_config *cfg, const ds41_weights *w, const ds41_dist_ident *id, const char *fail,
                   const ds41_moe_dispatch **moe, char *err, size_t errcap) {
    static ds41_moe_dispatch d;
    *moe = NULL;
    char why[480] = "";
    if (fail) snprintf(why, sizeof why, "%s", fail);
    /* placement before the check, so that a map one rank cannot read is reported like a load
     * failure */
    if (!fail) {
        int ne = 0;
        for (int l = 0; l < w->n_layers; l++)
            if (w->layers[l].n_experts > ne) ne = w->layers[l].n_experts;
        ds41_placement_free(&g.place);
        if (ds41_placement_default(&g.place, g.size, w->n_layers, ne)) snprintf(why, sizeof why, "out of memory");
        else if (g.map_path && ds41_placement_load(&g.place, g.map_path, why, sizeof why)) { /* why says it */ }
    }
    join_rec me;
    memset(&me, 0, sizeof me);
    me.ok = !why[0];
    if (id) { me.h[0] = id->config; me.h[1] = id->shards; me.h[2] = id->flags; me.h[3] = id->kernels; }
    if (me.ok && g.place.owner)   /* the placement is a flag: every rank must use the same */
        me.h[2] = ds41_fnv(me.h[2], g.place.owner, (size_t)g.place.n_layers * g.place.n_experts * sizeof(int16_t));
    snprintf(me.msg, sizeof me.msg, "%s", why);
    /* start-up waits for the slowest load: ten times the step timeout, at least two minutes */
    double limit = g.timeout * 10 > 120 ? g.timeout * 10 : 120;
    char verdict[1024] = "";
    if (g.rank == 0) {
        join_rec *all = calloc((size_t)g.size, sizeof *all);
        MPI_Request *rq = calloc((size_t)g.size, sizeof *rq);
        int *peer = calloc((size_t)g.size, sizeof *peer);
        if (!all || !rq || !peer) fatal(1, "out of memory in the start-up check");
        all[0] = me;
        for (int r = 1; r < g.size; r++) {
            peer[r - 1] = r;
            MPI_Irecv(&all[r], (int)sizeof(join_rec), MPI_BYTE, r, 1, MPI_COMM_WORLD, &rq[r - 1]);
        }
        wait_all(rq, g.size - 1, peer, limit, "start-up check");
        size_t L = 0;
        for (int r = 0; r < g.size && L + 1 < sizeof verdict; r++) {
            all[r].msg[sizeof all[r].msg - 1] = 0;
            if (!all[r].ok) {
                L += (size_t)snprintf(verdict + L, sizeof verdict - L, "%srank %d: %s", L ? "; " : "", r, all[r].msg);
                continue;
            }
            if (r == 0 || !all[0].ok) continue;
            for (int k = 0; k < 4 && L + 1 < sizeof verdict; k++)
                if (all[r].h[k] != all[0].h[k]) {
                    L += (size_t)snprintf(verdict + L, sizeof verdict - L,
                                          "%srank %d differs from rank 0 in %s (hash %016llx, rank 0: %016llx)", L ? "; " : "",
                                          r, hash_what[k], (unsigned long long)all[r].h[k], (unsigned long long)all[0].h[k]);
                    break;
                }
        }
        if (L >= sizeof verdict) L = sizeof verdict - 1;
        free(all); free(rq); free(peer);
    } else {
        MPI_Request rq;
        int p0 = 0;
        MPI_Isend(&me, (int)sizeof me, MPI_BYTE, 0, 1, MPI_COMM_WORLD, &rq);
        wait_all(&rq, 1, &p0, limit, "start-up check");
    }
    MPI_Request rq;
    int p0 = 0;
    MPI_Ibcast(verdict, (int)sizeof verdict, MPI_CHAR, 0, MPI_COMM_WORLD, &rq);
    wait_all(&rq, 1, &p0, limit, "start-up check verdict");
    verdict[sizeof verdict - 1] = 0;
    if (verdict[0]) {
        g.agreed = 1;
        snprintf(err, errcap, "the ranks of this job cannot run together: %s", verdict);
        return -1;
    }
    if (fail) {   /* cannot happen: rank 0 names every failed rank */
        snprintf(err, errcap, "%s", fail);
        return -1;
    }
    g.w = w;
    free(g.own);
    g.own = calloc((size_t)g.place.n_layers * (g.place.n_experts ? g.place.n_experts : 1), 1);
    if (!g.own) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    for (int l = 0; l < g.place.n_layers; l++)
        for (int e = 0; e < g.place.n_experts; e++)
            g.own[(size_t)l * g.place.n_experts + e] = ds41_dist_owner(&g.place, l, e) == g.rank;
    if (!ds41_pipe_on() && w) advise_others();   /* --split layers: a stage runs all its layers' experts */
    d.self = NULL;
    d.begin = xbegin;
    d.end = xend;
    *moe = ds41_dist_dp() ? ds41_dist_dp_dispatch(cfg, w) : &d;
    return 0;
}

/* ------------------------------------------------------------------ rank 0's bytes */

int ds41_dist_bcast_wait(void *buf, size_t n, double limit) {
    if (g.size < 2 || !n) return 0;
    if (n > INT_MAX) return -1;
    MPI_Request rq;
    int p0 = g.rank == 0 ? PEER_OTHERS : 0;   /* rank 0 waits for the others, they for rank 0 */
    MPI_Ibcast(buf, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD, &rq);
    wait_all(&rq, 1, &p0, limit, "broadcast from rank 0");
    return 0;
}

int ds41_dist_bcast(void *buf, size_t n) {
    return ds41_dist_bcast_wait(buf, n, g.timeout);
}

/* every rank's value to rank 0 (point to point, so that a silent rank is named), the least
 * back to every rank */
enum { MIN_TAG = 41 };

/* every rank's v, combined on rank 0 (the least, or the sum) and broadcast */
static long long reduce0(long long v, int sum, const char *what) {
    if (g.size < 2) return v;
    int64_t x = v;
    if (g.rank == 0) {
        int64_t *all = calloc((size_t)g.size, sizeof *all);
        MPI_Request *rq = calloc((size_t)g.size, sizeof *rq);
        int *peer = calloc((size_t)g.size, sizeof *peer);
        if (!all || !rq || !peer) fatal(1, "out of memory for %s", what);
        for (int q = 1; q < g.size; q++) {
            peer[q - 1] = q;
            MPI_Irecv(&all[q], (int)sizeof all[q], MPI_BYTE, q, MIN_TAG, MPI_COMM_WORLD, &rq[q - 1]);
        }
        wait_all(rq, g.size - 1, peer, g.timeout, what);
        for (int q = 1; q < g.size; q++)
            x = sum ? x + all[q] : (all[q] < x ? all[q] : x);
        free(all);
        free(rq);
        free(peer);
    } else {
        MPI_Request rq;
        int p0 = 0;
        MPI_Isend(&x, (int)sizeof x, MPI_BYTE, 0, MIN_TAG, MPI_COMM_WORLD, &rq);
        wait_all(&rq, 1, &p0, g.timeout, what);
    }
    MPI_Request rq;
    int p0 = 0;
    MPI_Ibcast(&x, (int)sizeof x, MPI_BYTE, 0, MPI_COMM_WORLD, &rq);
    wait_all(&rq, 1, &p0, g.timeout, what);
    return (long long)x;
}

long long ds41_dist_min(long long v, const char *what) { return reduce0(v, 0, what); }
long long ds41_dist_sum(long long v, const char *what) { return reduce0(v, 1, what); }

/* ------------------------------------------------------------------ step plan */

int ds41_dist_step(int count, const long long *pos, const int *T, const int32_t *const *tokens, char *err, size_t errcap) {
    if (g.size < 2) return 0;
    if (!ds41_dist_dp()) {
        /* the forward before this one ended at its last exchange (the time after it, sampling
         * or an idle server, is not a forward's) */
        if (g.fwd_t0 > 0 && g.fwd_last > g.fwd_t0 && g.fwd_last - g.fwd_t0 > g.fwd_slowest)
            g.fwd_slowest = g.fwd_last - g.fwd_t0;
        g.fwd_t0 = now_s();
    }
    if (ds41_dist_dp()) {
        /* each rank runs its own sequences: no common plan, only the round that keeps the
         * ranks' exchanges in step */
        long long rows = 0;
        for (int i = 0; i < count; i++) rows += T[i];
        (void)pos; (void)tokens;
        ds41_dist_dp_forward(rows > INT32_MAX ? INT32_MAX : (int)rows);
        return 0;
    }
    /* [count, then per sequence pos (2 words), T, then the tokens] */
    size_t n = 1 + 3 * (size_t)count;
    for (int i = 0; i < count; i++) n += (size_t)T[i];
    if (n > INT_MAX / 4) return snprintf(err, errcap, "step of %zu words is too large to broadcast", n), -1;
    int32_t *mine = malloc(n * sizeof *mine), *plan = malloc(n * sizeof *plan);
    if (!mine || !plan) {
        free(mine); free(plan);
        return snprintf(err, errcap, "out of memory"), -1;
    }
    size_t k = 0;
    mine[k++] = count;
    for (int i = 0; i < count; i++) {
        mine[k++] = (int32_t)(pos[i] & 0x7fffffff);
        mine[k++] = (int32_t)(pos[i] >> 31);
        mine[k++] = T[i];
    }
    for (int i = 0; i < count; i++)
        for (int t = 0; t < T[i]; t++) mine[k++] = tokens[i][t];
    int len = (int)n, p0 = 0;
    MPI_Request rq;
    MPI_Ibcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD, &rq);
    wait_all(&rq, 1, &p0, g.timeout, "step plan from rank 0");
    if (g.rank == 0) memcpy(plan, mine, n * sizeof *plan);
    int32_t *buf = plan;
    if (len != (int)n) {
        free(plan);
        buf = plan = malloc((size_t)(len > 0 ? len : 1) * sizeof *plan);
        if (!plan) fatal(1, "out of memory for rank 0's step plan");
    }
    MPI_Ibcast(buf, len, MPI_INT32_T, 0, MPI_COMM_WORLD, &rq);
    wait_all(&rq, 1, &p0, g.timeout, "step plan from rank 0");
    if (g.rank != 0 && (len != (int)n || memcmp(plan, mine, n * sizeof *plan))) {
        /* this rank would compute another step than rank 0: stop the job rather than mix them */
        fatal(4, "this rank's step (%d sequence(s), %zu words) differs from rank 0's (%d words): the ranks ran "
                 "different inputs or flags; ending the job", count, n, len);
    }
    free(mine);
    free(plan);
    return 0;
}

#else /* one process: no job to join */

void ds41_dist_fatal(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ds41_vmessage(fmt, ap);
    va_end(ap);
    exit(code);
}

int ds41_dist_join(const ds41_config *cfg, const ds41_weights *w, const ds41_dist_ident *id, const char *fail,
                   const ds41_moe_dispatch **moe, char *err, size_t errcap) {
    (void)cfg; (void)w; (void)id;
    *moe = NULL;
    if (fail) return snprintf(err, errcap, "%s", fail), -1;
    return 0;
}

int ds41_dist_bcast(void *buf, size_t n) {
    (void)buf; (void)n;
    return 0;
}

long long ds41_dist_min(long long v, const char *what) {
    (void)what;
    return v;
}
long long ds41_dist_sum(long long v, const char *what) {
    (void)what;
    return v;
}

int ds41_dist_bcast_wait(void *buf, size_t n, double limit) {
    (void)buf; (void)n; (void)limit;
    return 0;
}

int ds41_dist_step(int count, const long long *pos, const int *T, const int32_t *const *tokens, char *err, size_t errcap) {
    (void)count; (void)pos; (void)T; (void)tokens; (void)err; (void)errcap;
    return 0;
}

#endif
