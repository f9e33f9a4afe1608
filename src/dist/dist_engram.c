/* ds41 Engram tables sharded by rows across MPI ranks (dist.h, docs/distributed.md).
 *
 * Each rank holds a contiguous row range of every Engram table (ds41_dist_engram_range: the
 * rows split into N equal runs, the first rows % N ranks one row more) and maps and touches
 * only those rows: in mmap mode it reads them from the shard's mapping, in ram mode it copies
 * only them into anonymous memory (pread, so the rest of the file is never faulted in), in
 * prefetch mode it reads only them with the engine's own I/O (engram_io.h).
 *
 * The rows a step needs follow from its token ids alone (spec 3.2), and every rank computes
 * the same ids (rank 0's step plan is checked by every rank), so every rank knows without
 * asking which rows each rank must send. Attention is replicated, so every rank runs both
 * Engram layers on every row and needs every row: the exchange is an all-gather of each
 * rank's own rows. At the step's start (issue) the step's distinct (slot, id) pairs are
 * sorted, grouped by owner, the own rows copied into the owner's section of the step buffer,
 * and one non-blocking message per peer posted each way (MPI_Isend / MPI_Irecv: point to
 * point, as the expert exchange, so that a rank that does not answer is named). The forward
 * waits for them in front of the first Engram layer (wait), so the transfer overlaps the
 * embedding and the layers before it; rows are then looked up in the step buffer (row). The
 * bytes are the table's bytes, so results are bit-identical to one process in every mode.
 * In prefetch mode the own rows must be read before they can be sent: their reads start at
 * issue and the sends go out at the first wait.
 *
 * Each message starts with a header (step number, distinct rows, a hash of the step's keys):
 * ranks whose steps differ stop with a message instead of using another step's rows.
 *
 * Under serve --dp-attention each rank's forward runs its own sequences, so the rows are asked
 * for instead of pushed (dp_exchange below: the keys, then the rows). */
#include "dist.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "engram.h"
#include "engram_io.h"
#include "safetensors.h"

#ifdef DS41_HAVE_MPI
#include <mpi.h>
#endif

void ds41_dist_engram_range(int64_t rows, int r, int n, int64_t *lo, int64_t *hi) {
    if (n < 1 || r < 0 || r >= n || rows <= 0) {
        *lo = *hi = 0;
        return;
    }
    int64_t q = rows / n, m = rows % n;
    *lo = (int64_t)r * q + (r < m ? r : m);
    *hi = *lo + q + (r < m ? 1 : 0);
}

#define SLOT_SHIFT 56
#define EGMAGIC 0x4d474534u   /* "4EGM" */
#define EGTAG 50              /* MPI tag of the Engram exchange (the expert exchange uses 100..) */
#define HDR 32                /* bytes before each owner's rows in the step buffer */

typedef struct eg_hdr {
    uint32_t magic, rank;
    uint64_t step, n, keys;   /* step number, distinct rows, hash of the sorted keys */
} eg_hdr;

typedef struct eg_tab {
    int64_t rows;
    int64_t *lo;              /* [N + 1]: rank q holds rows [lo[q], lo[q + 1]) */
    const uint8_t *e, *s;     /* E4M3 bytes and scales of this rank's first row (mapping or RAM copy) */
    const uint8_t *map_e, *map_s;   /* the whole table in the mapping (resident-byte count) */
} eg_tab;

static struct {
    int on, me, size, n_slots, hd, nsc, rb, cols;
    eg_tab t[DS41_ENGRAM_MAX_LAYERS];
    uint8_t *ram;             /* ram mode: this rank's rows of every table */
    size_t ram_len;
    ds41_engram_io *io;       /* prefetch mode: this rank's rows read from the files */
    ds41_engram_step *local;
    ds41_engram_step *serve;  /* prefetch under --dp-attention: the rows other ranks ask for, read for them */
    int64_t *sids;            /* its ids */
    size_t sids_cap;
    long long served_read;    /* rows read with it (distinct per request round) */
    double served_stall_s;    /* time this rank's own forwards stood still for those reads */
    int answer_due;           /* --dp-attention: the peers' keys of this round are not answered yet */
    size_t serve_n;           /* rows the peers asked of this rank in this round */
    long long ans_now, ans_later, ans_waited;   /* a forward's rounds answered with the reads in at the keys, in later, or
                                                 * after waiting for them */
    int first_layer;          /* the first Engram layer: answers must be out before its MoE round */
    long long io_read;        /* prefetch: rows this rank read from the files (at close, for the report) */
    int io_uring;
    int64_t *fids;            /* the step's ids with other ranks' rows masked out (-1) */
    size_t fids_cap;
    /* the step */
    uint64_t *key;            /* distinct (slot << 56 | id), ascending */
    size_t *off;              /* [n]: byte offset of key u's row in buf */
    size_t n, kcap, ocap;
    uint8_t *buf;             /* per owner q: HDR bytes, then its rows in key order */
    size_t buf_cap;
    size_t *sec;              /* [N + 1]: byte offset of owner q's section */
    uint64_t step, khash;
    int send_pending, done;
    int asked;                /* --dp-attention: this forward's rows were asked for (no push, no headers) */
    uint64_t *kout, *kin;     /* --dp-attention: the keys asked of each peer, and asked by each */
    size_t kout_cap, kin_cap;
    uint8_t *rep;             /* --dp-attention: the rows this rank answers with */
    size_t rep_cap;
    size_t *koff, *kioff, *roff;   /* [N]: each peer's place in kout, kin, rep */
#ifdef DS41_HAVE_MPI
    MPI_Request *req;
    int *peer, nreq;
#endif
    ds41_dist_engram_stats st;
    const char *mode;         /* "ram", "prefetch" or "mmap" */
    long long own_bytes, res_in, res_out;   /* measure() */
} g;

void ds41_dist_engram_get_stats(ds41_dist_engram_stats *s) { *s = g.st; }

#ifdef DS41_HAVE_MPI
static int owner_of(const eg_tab *t, int64_t id) {
    int a = 0, b = g.size;   /* lo[a] <= id < lo[b] */
    while (b - a > 1) {
        int m = (a + b) / 2;
        if (t->lo[m] <= id) a = m;
        else b = m;
    }
    return a;
}

long long ds41_dist_resident(const void *p, size_t n) {
    if (!p || !n) return 0;
    long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0) return -1;
    int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    uintptr_t a = (uintptr_t)p / (uintptr_t)pg, z = ((uintptr_t)p + n + (uintptr_t)pg - 1) / (uintptr_t)pg;
    long long pages = 0;
    uint64_t ent[512];
    for (uintptr_t v = a; v < z;) {
        size_t k = z - v > 512 ? 512 : (size_t)(z - v);
        ssize_t got = pread(fd, ent, k * sizeof *ent, (off_t)(v * sizeof *ent));
        if (got <= 0) { close(fd); return -1; }
        k = (size_t)got / sizeof *ent;
        for (size_t i = 0; i < k; i++) pages += (long long)(ent[i] >> 63);
        v += k;
    }
    close(fd);
    return pages * pg;
}

/* What this process touched: its own rows where it reads them from (the mapping, or the RAM
 * copy), and the tables' bytes in the mapping outside them (touched rows of other ranks would
 * show there). Measured when the source closes, while the tables are still mapped. */
static void measure(void) {
    long long own = 0, in = 0, out = 0;
    for (int s = 0; s < g.n_slots; s++) {
        const eg_tab *t = &g.t[s];
        size_t n = (size_t)(t->lo[g.me + 1] - t->lo[g.me]);
        own += (long long)n * g.rb;
        long long a = ds41_dist_resident(t->e, n * g.hd), b = ds41_dist_resident(t->s, n * g.nsc);
        long long c = ds41_dist_resident(t->map_e, (size_t)t->rows * g.hd), d = ds41_dist_resident(t->map_s, (size_t)t->rows * g.nsc);
        if (a < 0 || b < 0 || c < 0 || d < 0 || in < 0) {
            in = out = -1;
            continue;
        }
        in += a + b;
        out += g.ram ? c + d : c + d - (a + b);   /* a RAM copy leaves the whole mapping outside */
    }
    g.own_bytes = own;
    g.res_in = in;
    g.res_out = out;
}

#endif

int ds41_dist_engram_report(char *line, size_t cap) {
    if (!g.on) return 0;
    size_t L = (size_t)snprintf(line, cap, "engram: rows");
    for (int s = 0; s < g.n_slots && L < cap; s++)
        L += (size_t)snprintf(line + L, cap - L, "%s %lld..%lld of %lld", s ? "," : "", (long long)g.t[s].lo[g.me],
                              (long long)g.t[s].lo[g.me + 1], (long long)g.t[s].rows);
    if (L >= cap) return 1;
    snprintf(line + L, cap - L,
             " (%lld bytes, %s); resident %lld bytes in its rows, %lld bytes of the tables outside them; exchange: %lld "
             "steps, %lld rows, %lld bytes sent, %lld received, %.3f s waiting",
             g.own_bytes, g.mode, g.res_in, g.res_out, g.st.steps, g.st.rows, g.st.bytes_sent, g.st.bytes_recv, g.st.wait_s);
    L = strlen(line);
    if (g.io_read || g.served_read)
        snprintf(line + L, cap > L ? cap - L : 0,
                 "; prefetch: %lld rows read from the files (%s), %lld rows looked up for other ranks (its forwards' rounds "
                 "answered: %lld at the keys, %lld later with the reads in, %lld after waiting for them, %.3f s in all)",
                 g.io_read, g.io_uring ? "io_uring" : "pread", g.served_read, g.ans_now, g.ans_later, g.ans_waited,
                 g.served_stall_s);
    return 1;
}

#ifdef DS41_HAVE_MPI

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static int grow(void **p, size_t *cap, size_t n, size_t size) {
    if (n <= *cap) return 0;
    void *q = realloc(*p, n * size);
    if (!q) return -1;
    *p = q;
    *cap = n;
    return 0;
}

/* Copies own row key into dst (E4M3 bytes, then the scales). */
static void own_row(uint64_t key, uint8_t *dst) {
    const eg_tab *t = &g.t[key >> SLOT_SHIFT];
    int64_t r = (int64_t)(key & ((1ULL << SLOT_SHIFT) - 1)) - t->lo[g.me];
    memcpy(dst, t->e + (size_t)r * g.hd, (size_t)g.hd);
    memcpy(dst + g.hd, t->s + (size_t)r * g.nsc, (size_t)g.nsc);
}

static void post_sends(void) {
    size_t len = g.sec[g.me + 1] - g.sec[g.me];
    for (int q = 0; q < g.size; q++) {
        if (q == g.me) continue;
        g.peer[g.nreq] = q;
        MPI_Isend(g.buf + g.sec[g.me], (int)len, MPI_BYTE, q, EGTAG, MPI_COMM_WORLD, &g.req[g.nreq++]);
        g.st.bytes_sent += (long long)len;
    }
}

static int eg_wait(void *self, int slot, ds41_err *err);

/* ---- serve --dp-attention: each rank's forward asks for its own rows ----
 * A rank's forward needs the rows of its own sequences' n-grams, which no other rank can
 * compute (they follow from histories and a row plan the others do not hold). So in every
 * forward round (the start round of dist_dp.c, in which every rank says whether it runs a
 * forward and over how many rows) every rank sends every peer the keys of the rows of that
 * peer's share its forward needs (a count, then the keys; a count of 0 from a rank that runs
 * no forward), then answers each peer's keys with the rows in their order. A forward sends its
 * keys at issue, posts the receives of its rows and completes them at the first wait, as the
 * push of replicated attention does; a rank outside a forward answers from the lock-step loop
 * (ds41_dist_engram_dp_serve). Receives have room for the keys a peer's forward can ask (its
 * rows x lookups per row), so no round of counts goes first. In prefetch mode the asked rows
 * are read while the asked rank's own forward runs, and answered when they are in (dp_answer). */
enum { KTAG = 51, RTAG = 52 };

static size_t dp_bound(int q) { return (size_t)ds41_dist_dp_rows(q) * (size_t)g.cols * (size_t)g.n_slots; }

/* Prefetch mode: the reads of the n rows the peers asked for (their keys in kin) issued on the
 * serve step, ids laid out [slot][n] (one column), the other slots' places -1. They complete
 * while this rank's forward computes; dp_answer sends the rows once they are in. */
static void serve_reads(size_t n) {
    g.serve_n = n;
    if (!n) return;
    size_t total = n * (size_t)g.n_slots;
    if (grow((void **)&g.sids, &g.sids_cap, total, sizeof *g.sids)) ds41_dist_fatal(1, "out of memory for the Engram rows asked");
    for (size_t i = 0; i < total; i++) g.sids[i] = -1;
    size_t j = 0;
    for (int q = 0; q < g.size; q++) {
        if (q == g.me) continue;
        uint64_t c = g.kin[g.kioff[q]];
        for (uint64_t u = 0; u < c; u++, j++) {
            uint64_t key = g.kin[g.kioff[q] + 1 + u];
            g.sids[(size_t)(key >> SLOT_SHIFT) * n + j] = (int64_t)(key & ((1ULL << SLOT_SHIFT) - 1));
        }
    }
    ds41_err err;
    if (ds41_engram_step_issue(g.serve, g.sids, n, 1, &err)) ds41_dist_fatal(1, "engram rows asked by other ranks: %s", err.msg);
    g.served_read += (long long)n;
}

/* The peers' keys of this round answered with their rows (sends posted in g.req). Prefetch
 * mode: only once the serve step's reads are in; block = 0 returns without answering while
 * they are in flight, block = 1 waits for them (fwd: this rank's forward stands still, the
 * time is counted). A peer's forward needs its rows at its first Engram layer and reaches it
 * only through the MoE rounds before it, so an answer is given at the latest when this rank's
 * forward reaches that layer (eg_wait) or a MoE round from it on (ds41_dist_engram_dp_progress),
 * and before anything else that waits for a peer (a new round, the lock-step loop). */
static void dp_answer(int block, int fwd, int at_keys) {
    if (!g.answer_due) return;
    if (g.io) {
        int in = ds41_engram_step_poll(g.serve);
        if (!in && !block) return;
        if (fwd && g.serve_n) *(!in ? &g.ans_waited : at_keys ? &g.ans_now : &g.ans_later) += 1;
        double t0 = now_s();
        ds41_err err;
        for (int s = 0; s < g.n_slots; s++)
            if (ds41_engram_step_wait(g.serve, s, &err)) ds41_dist_fatal(1, "engram rows asked by other ranks: %s", err.msg);
        if (fwd) g.served_stall_s += now_s() - t0;
    }
    g.answer_due = 0;
    for (int q = 0; q < g.size; q++) {
        if (q == g.me) continue;
        uint64_t c = g.kin[g.kioff[q]];
        for (uint64_t j = 0; j < c; j++) {
            uint64_t key = g.kin[g.kioff[q] + 1 + j];
            uint8_t *dst = g.rep + g.roff[q] + j * (size_t)g.rb;
            if (!g.io) {
                own_row(key, dst);
                continue;
            }
            const uint8_t *r = ds41_engram_step_row(g.serve, (int)(key >> SLOT_SHIFT), (int64_t)(key & ((1ULL << SLOT_SHIFT) - 1)));
            if (!r) ds41_dist_fatal(1, "engram exchange: row %llu of table %d asked by rank %d was not read",
                                    (unsigned long long)(key & ((1ULL << SLOT_SHIFT) - 1)), (int)(key >> SLOT_SHIFT), q);
            memcpy(dst, r, (size_t)g.rb);
        }
        if (!c) continue;
        size_t b = (size_t)c * (size_t)g.rb;
        if (b > INT_MAX) ds41_dist_fatal(1, "Engram rows for rank %d: %zu bytes, too large for one message", q, b);
        g.peer[g.nreq] = q;
        MPI_Isend(g.rep + g.roff[q], (int)b, MPI_BYTE, q, RTAG, MPI_COMM_WORLD, &g.req[g.nreq++]);
        g.st.bytes_sent += (long long)b;
    }
}

void ds41_dist_engram_dp_progress(int layer) {
    if (g.on && ds41_dist_dp()) dp_answer(layer < 0 || layer >= g.first_layer, 1, 0);
}

/* Round K (the keys in kout, peer q's at koff[q]: a count, then the keys), then the reads of
 * the rows the peers asked for issued (prefetch) and answered: from a forward (fwd) if they
 * are in already, else later; outside one at once */
static void dp_exchange(int fwd) {
    int N = g.size, me = g.me, nk = 0;
    size_t tin = 0;
    for (int q = 0; q < N; q++) {
        g.kioff[q] = tin;
        if (q != me) tin += 1 + dp_bound(q);
    }
    if (grow((void **)&g.kin, &g.kin_cap, tin + 1, sizeof *g.kin)) ds41_dist_fatal(1, "out of memory for the Engram row requests");
    MPI_Request kr[2 * 64];
    int kp[2 * 64] = { 0 };
    MPI_Request *krq = N <= 64 ? kr : malloc(2 * (size_t)N * sizeof *krq);
    int *kpe = N <= 64 ? kp : malloc(2 * (size_t)N * sizeof *kpe);
    if (!krq || !kpe) ds41_dist_fatal(1, "out of memory for the Engram row requests");
    for (int q = 0; q < N; q++) {
        if (q == me) continue;
        size_t b = (1 + dp_bound(q)) * sizeof *g.kin;
        if (b > INT_MAX) ds41_dist_fatal(1, "Engram row requests of rank %d: %zu bytes, too large for one message", q, b);
        kpe[nk] = q;
        MPI_Irecv(g.kin + g.kioff[q], (int)b, MPI_BYTE, q, KTAG, MPI_COMM_WORLD, &krq[nk++]);
    }
    for (int q = 0; q < N; q++) {
        if (q == me) continue;
        kpe[nk] = q;
        MPI_Isend(g.kout + g.koff[q], (int)((1 + g.kout[g.koff[q]]) * sizeof *g.kout), MPI_BYTE, q, KTAG, MPI_COMM_WORLD,
                  &krq[nk++]);
    }
    ds41_dist_wait(krq, nk, kpe, "Engram row requests");
    size_t trep = 0;
    for (int q = 0; q < N; q++) {
        g.roff[q] = trep;
        if (q == me) continue;
        uint64_t c = g.kin[g.kioff[q]];
        if (c > dp_bound(q))
            ds41_dist_fatal(4, "rank %d asked for %llu Engram rows, more than its forward of %d rows can look up: the ranks' "
                               "steps differ; ending the job", q, (unsigned long long)c, ds41_dist_dp_rows(q));
        trep += (size_t)c * (size_t)g.rb;
    }
    if (grow((void **)&g.rep, &g.rep_cap, trep + 1, 1)) ds41_dist_fatal(1, "out of memory for the Engram rows of the other ranks");
    for (int q = 0; q < N; q++) {
        if (q == me) continue;
        uint64_t c = g.kin[g.kioff[q]];
        for (uint64_t j = 0; j < c; j++) {
            uint64_t key = g.kin[g.kioff[q] + 1 + j];
            int s = (int)(key >> SLOT_SHIFT);
            int64_t id = (int64_t)(key & ((1ULL << SLOT_SHIFT) - 1));
            if (s < 0 || s >= g.n_slots || id < g.t[s].lo[me] || id >= g.t[s].lo[me + 1])
                ds41_dist_fatal(4, "rank %d asked this rank for row %lld of Engram table %d, which it does not hold: the "
                                   "ranks' row splits differ; ending the job", q, (long long)id, s);
        }
    }
    g.answer_due = 1;
    if (g.io) serve_reads(trep / (size_t)g.rb);   /* no mapping to copy from: read, answered when in */
    dp_answer(!fwd, fwd, 1);
    if (krq != kr) free(krq);
    if (kpe != kp) free(kpe);
}

/* The keys this forward asks each owner for (cnt[q] of them, own[u]: key u's owner), the
 * answers to the peers' keys, and the receives of this forward's rows posted. */
static int dp_issue(const size_t *cnt, const int *own, ds41_err *err) {
    int N = g.size, me = g.me;
    size_t tot = 0;
    for (int q = 0; q < N; q++) {
        g.koff[q] = tot;
        tot += 1 + (q == me ? 0 : cnt[q]);
    }
    if (grow((void **)&g.kout, &g.kout_cap, tot, sizeof *g.kout)) return ds41_errf(err, "out of memory");
    for (int q = 0; q < N; q++) g.kout[g.koff[q]] = 0;
    for (size_t u = 0; u < g.n; u++) {
        int q = own[u];
        if (q == me) {
            if (!g.io) own_row(g.key[u], g.buf + g.off[u]);   /* prefetch: read at issue, copied at the wait */
            continue;
        }
        uint64_t *c = &g.kout[g.koff[q]];   /* the count, then the keys */
        c[1 + *c] = g.key[u];
        (*c)++;
    }
    g.asked = 1;
    dp_exchange(1);
    for (int q = 0; q < N; q++) {
        if (q == me || !cnt[q]) continue;
        size_t len = cnt[q] * (size_t)g.rb;
        g.peer[g.nreq] = q;
        MPI_Irecv(g.buf + g.sec[q] + HDR, (int)len, MPI_BYTE, q, RTAG, MPI_COMM_WORLD, &g.req[g.nreq++]);
        g.st.bytes_recv += (long long)len;
    }
    g.st.steps++;
    g.st.rows += (long long)g.n;
    return 0;
}

void ds41_dist_engram_dp_serve(void) {
    if (!g.on || !ds41_dist_dp()) return;
    ds41_err err;
    if ((g.nreq || g.answer_due) && !g.done && eg_wait(NULL, 0, &err)) ds41_dist_fatal(1, "%s", err.msg);
    g.nreq = 0;
    if (grow((void **)&g.kout, &g.kout_cap, (size_t)g.size, sizeof *g.kout)) ds41_dist_fatal(1, "out of memory");
    for (int q = 0; q < g.size; q++) {
        g.koff[q] = (size_t)q;
        g.kout[q] = 0;
    }
    dp_exchange(0);   /* no forward here to overlap the reads with: answered at once */
    ds41_dist_wait(g.req, g.nreq, g.peer, "Engram rows to the other ranks");
    g.nreq = 0;
}

/* prefetch: this rank's rows of the step's ids [n_slots][N][cols] read with the local step (the
 * other ranks' rows masked out); the first wait copies them into this rank's section */
static int own_reads(const int64_t *ids, size_t N, int cols, ds41_err *err) {
    size_t per = N * (size_t)cols, total = per * (size_t)g.n_slots;
    if (grow((void **)&g.fids, &g.fids_cap, total ? total : 1, sizeof *g.fids)) return ds41_errf(err, "out of memory");
    for (size_t i = 0; i < total; i++) {
        int s = (int)(i / per);
        int64_t id = ids[i];
        int in = id >= 0 && id < g.t[s].rows && id >= g.t[s].lo[g.me] && id < g.t[s].lo[g.me + 1];
        g.fids[i] = in ? id : -1;
    }
    g.send_pending = 1;
    return ds41_engram_step_issue(g.local, g.fids, N, cols, err);
}

static int eg_issue(void *self, const int64_t *ids, size_t N, int cols, ds41_err *err) {
    /* a step whose Engram layers did not run (a prompt part before their rows, an error): every
     * rank finishes its messages (and sends what prefetch still held back) first */
    if ((g.nreq || g.answer_due) && !g.done && eg_wait(self, 0, err)) return -1;
    g.nreq = 0;
    g.done = 0;
    g.send_pending = 0;
    g.asked = 0;
    size_t per = N * (size_t)cols, total = per * (size_t)g.n_slots;
    if (grow((void **)&g.key, &g.kcap, total ? total : 1, sizeof *g.key))
        return ds41_errf(err, "engram exchange: out of memory for %zu row lookups", total);
    if (grow((void **)&g.off, &g.ocap, total ? total : 1, sizeof *g.off))
        return ds41_errf(err, "engram exchange: out of memory for %zu row lookups", total);
    /* the step's distinct (slot, id) pairs, ascending */
    size_t n = 0;
    for (int s = 0; s < g.n_slots; s++)
        for (size_t i = 0; i < per; i++) {
            int64_t id = ids[(size_t)s * per + i];
            if (id >= 0 && id < g.t[s].rows) g.key[n++] = (uint64_t)s << SLOT_SHIFT | (uint64_t)id;
        }
    qsort(g.key, n, sizeof *g.key, cmp_u64);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (!m || g.key[i] != g.key[m - 1]) g.key[m++] = g.key[i];
    g.n = m;
    /* rows per owner, then each row's place in its owner's section */
    size_t *cnt = calloc((size_t)g.size, sizeof *cnt);
    int *own = malloc((m ? m : 1) * sizeof *own);
    if (!cnt || !own) { free(cnt); free(own); return ds41_errf(err, "out of memory"); }
    for (size_t u = 0; u < m; u++) {
        const eg_tab *t = &g.t[g.key[u] >> SLOT_SHIFT];
        own[u] = owner_of(t, (int64_t)(g.key[u] & ((1ULL << SLOT_SHIFT) - 1)));
        cnt[own[u]]++;
    }
    g.sec[0] = 0;
    for (int q = 0; q < g.size; q++) g.sec[q + 1] = g.sec[q] + HDR + cnt[q] * (size_t)g.rb;
    for (int q = 0; q < g.size; q++) cnt[q] = 0;
    for (size_t u = 0; u < m; u++) g.off[u] = g.sec[own[u]] + HDR + cnt[own[u]]++ * (size_t)g.rb;
    int too_big = 0;
    for (int q = 0; q < g.size; q++)
        if (g.sec[q + 1] - g.sec[q] > INT_MAX) too_big = 1;
    if (too_big || grow((void **)&g.buf, &g.buf_cap, g.sec[g.size], 1)) {
        free(cnt); free(own);
        return ds41_errf(err, "engram exchange: a step of %zu rows is too large (%zu bytes); feed shorter chunks (--chunk)",
                         m, g.sec[g.size]);
    }
    if (ds41_dist_dp()) {
        /* prefetch: this forward's own rows read (the others masked out), copied at the wait */
        int rc = g.io ? own_reads(ids, N, cols, err) : 0;
        if (!rc) rc = dp_issue(cnt, own, err);
        free(cnt);
        free(own);
        return rc;
    }
    /* this step's header in this rank's section */
    g.step++;
    g.khash = ds41_fnv(DS41_FNV0, g.key, m * sizeof *g.key);
    eg_hdr h = { EGMAGIC, (uint32_t)g.me, g.step, m, g.khash };
    memcpy(g.buf + g.sec[g.me], &h, sizeof h);
    /* the peers' rows land in their sections */
    for (int q = 0; q < g.size; q++) {
        if (q == g.me) continue;
        size_t len = g.sec[q + 1] - g.sec[q];
        g.peer[g.nreq] = q;
        MPI_Irecv(g.buf + g.sec[q], (int)len, MPI_BYTE, q, EGTAG, MPI_COMM_WORLD, &g.req[g.nreq++]);
        g.st.bytes_recv += (long long)len;
    }
    g.st.steps++;
    g.st.rows += (long long)m;
    int rc = 0;
    if (g.io) {
        /* prefetch: read this rank's rows (the others masked out), send them at the first wait */
        rc = own_reads(ids, N, cols, err);
    } else {
        for (size_t u = 0; u < m; u++)
            if (own[u] == g.me) own_row(g.key[u], g.buf + g.off[u]);
        post_sends();
    }
    free(cnt);
    free(own);
    return rc;
}

static int eg_wait(void *self, int slot, ds41_err *err) {
    (void)self;
    (void)slot;   /* both slots' rows travel together */
    if (g.done) return 0;
    dp_answer(1, 1, 0);   /* the peers' rows first: their forwards may be waiting for them too */
    if (g.send_pending) {
        for (int s = 0; s < g.n_slots; s++)
            if (ds41_engram_step_wait(g.local, s, err)) return -1;
        for (size_t u = 0; u < g.n; u++) {
            if (g.off[u] < g.sec[g.me] || g.off[u] >= g.sec[g.me + 1]) continue;
            int s = (int)(g.key[u] >> SLOT_SHIFT);
            const uint8_t *r = ds41_engram_step_row(g.local, s, (int64_t)(g.key[u] & ((1ULL << SLOT_SHIFT) - 1)));
            if (!r) return ds41_errf(err, "engram exchange: row %llu of table %d was not read",
                                     (unsigned long long)(g.key[u] & ((1ULL << SLOT_SHIFT) - 1)), s);
            memcpy(g.buf + g.off[u], r, (size_t)g.rb);
        }
        g.send_pending = 0;
        if (!g.asked) post_sends();   /* --dp-attention: the own rows stay here (the peers ask for theirs) */
    }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    ds41_dist_wait(g.req, g.nreq, g.peer, "Engram row exchange");
    clock_gettime(CLOCK_MONOTONIC, &b);
    g.st.wait_s += (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
    g.nreq = 0;
    for (int q = 0; q < g.size && !g.asked; q++) {
        if (q == g.me) continue;
        eg_hdr h;
        memcpy(&h, g.buf + g.sec[q], sizeof h);
        if (h.magic != EGMAGIC || h.rank != (uint32_t)q || h.step != g.step || h.n != g.n || h.keys != g.khash)
            return ds41_errf(err, "engram exchange: rank %d sent the rows of another step (step %llu, %llu rows) than this "
                             "rank's (step %llu, %zu rows): the ranks' states differ", q, (unsigned long long)h.step,
                             (unsigned long long)h.n, (unsigned long long)g.step, g.n);
    }
    g.done = 1;
    return 0;
}

static const uint8_t *eg_row(const void *self, int slot, int64_t id) {
    (void)self;
    if (!g.done || id < 0) return NULL;
    uint64_t key = (uint64_t)slot << SLOT_SHIFT | (uint64_t)id;
    size_t a = 0, b = g.n;
    while (a < b) {
        size_t m = (a + b) / 2;
        if (g.key[m] < key) a = m + 1;
        else b = m;
    }
    return a < g.n && g.key[a] == key ? g.buf + g.off[a] : NULL;
}

/* ram mode: this rank's rows of table s read into ram + o (pread from the shard's file, so no
 * page of the mapping is faulted in; a --load copy table is copied from memory). */
static int read_rows(const ds41_st *st, const eg_tab *t, const uint8_t *src, size_t n, uint8_t *dst, int slot,
                     char *why, size_t cap) {
    int shard;
    uint64_t off;
    if (!n) return 0;
    if (ds41_st_locate(st, src, n, &shard, &off)) {
        memcpy(dst, src, n);
        return 0;
    }
    const char *path = ds41_st_shard_path(st, shard);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return snprintf(why, cap, "engram: cannot open %s (Engram table %d): %s", path, slot, strerror(errno)), -1;
    size_t done = 0;
    while (done < n) {
        ssize_t got = pread(fd, dst + done, n - done > (64u << 20) ? (64u << 20) : n - done, (off_t)(off + done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            snprintf(why, cap, "engram: reading rows %lld..%lld of Engram table %d from %s (byte offset %llu) failed: %s",
                     (long long)t->lo[g.me], (long long)t->lo[g.me + 1], slot, path, (unsigned long long)(off + done),
                     got < 0 ? strerror(errno) : "unexpected end of file");
            close(fd);
            return -1;
        }
        done += (size_t)got;
    }
    close(fd);
    return 0;
}

/* mmap mode: this rank's first and last row read from the file, so that a shard it cannot read
 * is an error at start-up rather than a SIGBUS in the layer loop. */
static int probe_rows(const ds41_st *st, const eg_tab *t, int slot, char *why, size_t cap) {
    int64_t n = t->lo[g.me + 1] - t->lo[g.me];
    if (n <= 0) return 0;
    uint8_t tmp[1024];
    const uint8_t *ends[4] = { t->e, t->e + (size_t)(n - 1) * g.hd, t->s, t->s + (size_t)(n - 1) * g.nsc };
    size_t lens[4] = { (size_t)g.hd, (size_t)g.hd, (size_t)g.nsc, (size_t)g.nsc };
    for (int k = 0; k < 4; k++) {
        size_t len = lens[k] < sizeof tmp ? lens[k] : sizeof tmp;
        if (read_rows(st, t, ends[k], len, tmp, slot, why, cap)) return -1;
    }
    return 0;
}

int ds41_dist_engram_open(const ds41_config *cfg, const ds41_weights *w, const ds41_st *st, int ram,
                          ds41_engram_io *io, const ds41_engram_src **out, char *why, size_t cap) {
    static ds41_engram_src src;
    *out = NULL;
    int size = ds41_dist_engram_shards(), L = cfg->n_engram_layers;
    if (size < 2 || L < 1) return 0;
    ds41_dist_engram_close();   /* a second model in this process: the first one's rows go */
    for (int s = 0; s < DS41_ENGRAM_MAX_LAYERS; s++) free(g.t[s].lo);
    ds41_dist_engram_stats keep = g.st;
    memset(&g, 0, sizeof g);
    g.st = keep;
    if (L > DS41_ENGRAM_MAX_LAYERS) return snprintf(why, cap, "engram: %d Engram layers (at most %d)", L, DS41_ENGRAM_MAX_LAYERS), -1;
    g.me = ds41_dist_rank();
    g.size = size;
    g.n_slots = L;
    g.hd = cfg->engram_head_dim;
    g.nsc = g.hd / 32;
    g.rb = g.hd + g.nsc;
    g.cols = (cfg->engram_max_ngram - 1) * cfg->engram_n_heads;   /* lookups per row and table (engram_place.c) */
    g.sec = calloc((size_t)size + 1, sizeof *g.sec);
    g.req = calloc(2 * (size_t)size, sizeof *g.req);
    g.peer = calloc(2 * (size_t)size, sizeof *g.peer);
    g.koff = calloc((size_t)size, sizeof *g.koff);
    g.kioff = calloc((size_t)size, sizeof *g.kioff);
    g.roff = calloc((size_t)size, sizeof *g.roff);
    if (!g.sec || !g.req || !g.peer || !g.koff || !g.kioff || !g.roff) return snprintf(why, cap, "out of memory"), -1;
    int found = 0;
    size_t ram_len = 0;
    g.first_layer = cfg->n_layers;
    for (int l = 0; l < w->n_layers && l < cfg->n_layers; l++) {
        int s = cfg->layers[l].engram_slot;
        const ds41_layer_weights *lw = &w->layers[l];
        if (s < 0 || s >= L || !lw->eg_embed || !lw->eg_scale) continue;
        if (l < g.first_layer) g.first_layer = l;
        eg_tab *t = &g.t[s];
        t->rows = lw->eg_rows;
        t->lo = calloc((size_t)size + 1, sizeof *t->lo);
        if (!t->lo) return snprintf(why, cap, "out of memory"), -1;
        for (int q = 0; q < size; q++) ds41_dist_engram_range(t->rows, q, size, &t->lo[q], &t->lo[q + 1]);
        t->map_e = lw->eg_embed;
        t->map_s = lw->eg_scale;
        t->e = lw->eg_embed + (size_t)t->lo[g.me] * g.hd;
        t->s = lw->eg_scale + (size_t)t->lo[g.me] * g.nsc;
        ram_len += (size_t)(t->lo[g.me + 1] - t->lo[g.me]) * g.rb;
        found++;
    }
    if (found != L) return snprintf(why, cap, "engram: found %d of the %d Engram tables", found, L), -1;
    int sh;
    uint64_t fo;
    if (ram && ds41_st_locate(st, g.t[0].map_e, 1, &sh, &fo)) ram = 0;   /* --load copy: in RAM already */
    if (ram && ram_len) {
        g.ram = mmap(NULL, ram_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (g.ram == MAP_FAILED) {
            g.ram = NULL;
            return snprintf(why, cap, "engram: cannot allocate %zu bytes for this rank's rows: %s", ram_len, strerror(errno)), -1;
        }
        g.ram_len = ram_len;
        size_t o = 0;
        for (int s = 0; s < L; s++) {
            eg_tab *t = &g.t[s];
            size_t n = (size_t)(t->lo[g.me + 1] - t->lo[g.me]);
            if (read_rows(st, t, t->e, n * g.hd, g.ram + o, s, why, cap) ||
                read_rows(st, t, t->s, n * g.nsc, g.ram + o + n * g.hd, s, why, cap))
                return -1;
            t->e = g.ram + o;
            t->s = g.ram + o + n * g.hd;
            o += n * g.rb;
        }
        mprotect(g.ram, ram_len, PROT_READ);
    } else if (io) {
        g.io = io;
        if (!(g.local = ds41_engram_step_new(io))) return snprintf(why, cap, "out of memory"), -1;
        /* --dp-attention: the rows the other ranks ask for are read for them too */
        if (ds41_dist_dp() && !(g.serve = ds41_engram_step_new(io))) return snprintf(why, cap, "out of memory"), -1;
    } else {
        for (int s = 0; s < L; s++)
            if (probe_rows(st, &g.t[s], s, why, cap)) return -1;
    }
    g.on = 1;
    g.mode = g.ram ? "ram" : g.io ? "prefetch" : "mmap";
    src.self = NULL;
    src.issue = eg_issue;
    src.wait = eg_wait;
    src.row = eg_row;
    *out = &src;
    return 0;
}

void ds41_dist_engram_close(void) {
    if (!g.on) return;
    ds41_err err;
    if ((g.nreq || g.answer_due) && !g.done && eg_wait(NULL, 0, &err)) ds41_log(1, "%s", err.msg);
    g.nreq = 0;
    measure();
    if (g.io) {
        ds41_engram_io_stats es;
        ds41_engram_io_get_stats(g.io, &es);
        g.io_read = es.rows_read;
        g.io_uring = es.uring;
    }
    ds41_engram_step_free(g.local);
    ds41_engram_step_free(g.serve);
    g.local = g.serve = NULL;
    g.io = NULL;
    if (g.ram) munmap(g.ram, g.ram_len);
    g.ram = NULL;
    for (int s = 0; s < g.n_slots; s++) g.t[s].e = g.t[s].s = g.t[s].map_e = g.t[s].map_s = NULL;
    free(g.fids); free(g.sids); free(g.key); free(g.off); free(g.buf); free(g.sec); free(g.req); free(g.peer);
    free(g.kout); free(g.kin); free(g.rep); free(g.koff); free(g.kioff); free(g.roff);
    g.fids = g.sids = NULL; g.key = NULL; g.off = NULL; g.buf = NULL; g.sec = NULL; g.req = NULL; g.peer = NULL;
    g.kout = g.kin = NULL; g.rep = NULL; g.koff = g.kioff = g.roff = NULL;
    g.fids_cap = g.sids_cap = g.kcap = g.ocap = g.buf_cap = g.kout_cap = g.kin_cap = g.rep_cap = 0;
    /* the row ranges and counters stay for the report */
}

#else /* one process: nothing to shard */

int ds41_dist_engram_open(const ds41_config *cfg, const ds41_weights *w, const ds41_st *st, int ram,
                          ds41_engram_io *io, const ds41_engram_src **out, char *why, size_t cap) {
    (void)cfg; (void)w; (void)st; (void)ram; (void)io; (void)why; (void)cap;
    *out = NULL;
    return 0;
}

void ds41_dist_engram_close(void) {}

void ds41_dist_engram_dp_serve(void) {}

void ds41_dist_engram_dp_progress(int layer) { (void)layer; }

#endif
