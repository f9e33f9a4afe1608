/* ds41 Engram rows off RAM (P4): row cache, deduplicated asynchronous reads, RAM copies.
 * See engram_io.h for the contract.
 *
 * Why reads and not the mapping: a page fault for an Engram row happens inside the layer loop,
 * one at a time, and pulls a 4 KiB page (plus the kernel's fault-around and read-ahead) for a
 * 264-byte row. The rows a step needs follow from its token ids, so they can all be requested
 * at the step's start, as many in flight as the device takes, and only the first Engram layer
 * waits for them. Our own descriptors are opened with POSIX_FADV_RANDOM so that the kernel does
 * not read ahead around each row.
 *
 * Row cache: one shared table of `cap` rows (key = slot << 56 | id), an open-addressing index
 * (linear probing, backward-shift deletion) and CLOCK eviction (a reference bit per row, set on
 * every hit and insert, cleared by the hand). A step copies the cached rows it needs into its
 * own buffer under the lock, so no row of the cache is pinned while layers run and concurrent
 * sequences never wait for one another's eviction. Rows read from disk enter the cache when the
 * step waits for them. */
#define _GNU_SOURCE
#include "engram_io.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef DS41_HAVE_LIBURING
#include <liburing.h>
#endif

#define RING_DEPTH 256
#define READ_TRIES 4          /* one read and three retries */
#define SLOT_SHIFT 56

enum { FAULT_NONE, FAULT_EIO_ONE, FAULT_SHORT_ONE, FAULT_EIO_ALL, FAULT_EOF_ALL };

typedef struct eg_table {
    int fd_e, fd_s;           /* descriptors of the shards holding the rows and the scales */
    int dfd_e, dfd_s;         /* the same files opened O_DIRECT (direct reads), else -1 */
    uint64_t off_e, off_s;    /* file offsets of the two tensors */
    int64_t rows;
    const char *path_e, *path_s;
    uint8_t *scales;          /* the scale tensor read into RAM (NULL: read per row) */
} eg_table;

struct ds41_engram_io {
    int n_slots, hd, nsc, rb;      /* rb = hd + nsc: a row record */
    eg_table t[DS41_ENGRAM_MAX_LAYERS];
    int *fds, *dfds, n_fds;        /* one per shard (-1: not opened); dfds: O_DIRECT */
    int direct;                    /* rows read O_DIRECT through bounce blocks of dio_align */
    uint32_t dio_align, span;      /* alignment of offsets, lengths and buffers; bounce bytes per read */
    int fault;
    long long fault_at, n_reads;   /* n_reads: reads completed so far (fault injection counter) */
    int fault_fired;
    pthread_mutex_t mu;
    /* row cache */
    size_t cap, used, hand, hmask;
    uint64_t *ckey;                /* key of each row */
    uint8_t *cref, *cdata;
    uint32_t *hidx;                /* index: row + 1, 0 = empty */
    ds41_engram_io_stats st;
    int uring_failed_logged;
    int split_submit;              /* issue submits the first slot's reads only (DS41_ENGRAM_SPLIT=0: all) */
    double spin_s;                 /* a wait polls the ring this long before it sleeps (DS41_ENGRAM_SPIN_US) */
};

typedef struct eg_read {
    uint32_t u;                    /* distinct row */
    uint8_t part;                  /* 0 = E4M3 row, 1 = scales */
    uint8_t tries;
    uint32_t done;                 /* bytes already in place */
} eg_read;

struct ds41_engram_step {
    ds41_engram_io *io;
    size_t n, ncap;                /* distinct rows */
    uint64_t *key;
    uint8_t *data;                 /* ncap * rb */
    uint8_t *miss;                 /* 1: read from disk this step */
    uint32_t *hidx;                /* key -> distinct row + 1 */
    size_t hmask;
    eg_read *rd;
    size_t nrd, rdcap;
    uint32_t *queue;               /* reads to submit (first ones, then retries) */
    uint8_t *bounce;               /* direct reads: span bytes per read, dio-aligned */
    size_t bounce_cap;             /* reads it has room for */
    size_t qhead, qtail, qcap;
    size_t pending[DS41_ENGRAM_MAX_LAYERS];
    int inserted[DS41_ENGRAM_MAX_LAYERS];
    int inflight;
    int failed;
    ds41_err fail_err;
    double stall;
    double issued;                 /* when the issue returned; 0 once the first wait has begun */
#ifdef DS41_HAVE_LIBURING
    struct io_uring ring;
#endif
    int have_ring;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

static size_t pow2_at_least(size_t n) {
    size_t p = 16;
    while (p < n) p *= 2;
    return p;
}

/* ---------------------------------------------------------------- shared row cache */

static size_t cache_find(const ds41_engram_io *io, uint64_t key) {
    if (!io->cap) return SIZE_MAX;
    for (size_t i = mix64(key) & io->hmask;; i = (i + 1) & io->hmask) {
        uint32_t v = io->hidx[i];
        if (!v) return SIZE_MAX;
        if (io->ckey[v - 1] == key) return v - 1;
    }
}

static void cache_index_del(ds41_engram_io *io, uint64_t key) {
    size_t i = mix64(key) & io->hmask;
    while (io->hidx[i] && io->ckey[io->hidx[i] - 1] != key) i = (i + 1) & io->hmask;
    if (!io->hidx[i]) return;
    /* backward-shift deletion keeps every probe chain unbroken */
    for (size_t j = i;;) {
        j = (j + 1) & io->hmask;
        if (!io->hidx[j]) break;
        size_t home = mix64(io->ckey[io->hidx[j] - 1]) & io->hmask;
        int between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (between) continue;
        io->hidx[i] = io->hidx[j];
        i = j;
    }
    io->hidx[i] = 0;
}

/* Caller holds mu. */
static void cache_put(ds41_engram_io *io, uint64_t key, const uint8_t *row) {
    if (!io->cap || cache_find(io, key) != SIZE_MAX) return;
    size_t e;
    if (io->used < io->cap) {
        e = io->used++;
    } else {
        for (;;) {   /* CLOCK: a referenced row gets a second chance */
            e = io->hand;
            io->hand = (io->hand + 1) % io->cap;
            if (!io->cref[e]) break;
            io->cref[e] = 0;
        }
        cache_index_del(io, io->ckey[e]);
    }
    io->ckey[e] = key;
    io->cref[e] = 1;
    memcpy(io->cdata + e * (size_t)io->rb, row, (size_t)io->rb);
    size_t i = mix64(key) & io->hmask;
    while (io->hidx[i]) i = (i + 1) & io->hmask;
    io->hidx[i] = (uint32_t)(e + 1);
}

/* ---------------------------------------------------------------- open / close */

static int parse_fault(ds41_engram_io *io, ds41_err *err) {
    const char *f = getenv("DS41_ENGRAM_FAULT");
    if (!f || !*f) return 0;
    if (!strcmp(f, "eio-all")) { io->fault = FAULT_EIO_ALL; return 0; }
    if (!strcmp(f, "eof-all")) { io->fault = FAULT_EOF_ALL; return 0; }
    int kind = !strncmp(f, "eio:", 4) ? FAULT_EIO_ONE : !strncmp(f, "short:", 6) ? FAULT_SHORT_ONE : FAULT_NONE;
    if (kind != FAULT_NONE) {
        char *end;
        long long k = strtoll(strchr(f, ':') + 1, &end, 10);
        if (!*end && k >= 1) {
            io->fault = kind;
            io->fault_at = k;
            return 0;
        }
    }
    return ds41_errf(err, "DS41_ENGRAM_FAULT='%.40s': expected eio:K, short:K (K >= 1), eio-all or eof-all", f);
}

static int shard_fd(ds41_engram_io *io, const ds41_st *st, int shard, ds41_err *err) {
    if (io->fds[shard] >= 0) return io->fds[shard];
    const char *path = ds41_st_shard_path(st, shard);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ds41_errf(err, "engram: cannot open %s: %s", path, strerror(errno)), -1;
    /* rows are scattered: read-ahead around one would only read rows nobody asked for */
    posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    io->fds[shard] = fd;
    /* O_DIRECT where the file system allows it: a row then costs one aligned block (512 B on
     * most devices) instead of a page-cache page, and nothing is charged to the page cache,
     * whose reclaim under a memory limit otherwise runs inside the submitting thread. The
     * alignment comes from statx (Linux 6.1+); without it, no direct reads. */
    const char *d = getenv("DS41_ENGRAM_DIRECT");
    if (io->direct && !(d && !strcmp(d, "0"))) {
        struct statx sx;
        int dfd = -1;
        if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) &&
            sx.stx_dio_offset_align > 0 && sx.stx_dio_mem_align > 0 && sx.stx_dio_offset_align <= 65536 &&
            sx.stx_dio_mem_align <= 65536)
            dfd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
        if (dfd >= 0) {
            uint32_t a = sx.stx_dio_offset_align > sx.stx_dio_mem_align ? sx.stx_dio_offset_align : sx.stx_dio_mem_align;
            if (a > io->dio_align) io->dio_align = a;
            io->dfds[shard] = dfd;
        } else {
            io->direct = 0;
        }
    } else {
        io->direct = 0;
    }
    return fd;
}

/* pread of n bytes at off into buf, retried on EINTR / short reads; 0 or -errno */
static int read_all(int fd, uint8_t *buf, uint64_t n, uint64_t off) {
    uint64_t done = 0;
    int tries = 0;
    while (done < n) {
        size_t want = n - done > ((uint64_t)64 << 20) ? ((size_t)64 << 20) : (size_t)(n - done);
        ssize_t got = pread(fd, buf + done, want, (off_t)(off + done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            if (++tries < READ_TRIES) continue;
            return got < 0 ? -errno : -EIO;
        }
        done += (uint64_t)got;
    }
    return 0;
}

int ds41_engram_io_open(ds41_engram_io **out, const ds41_config *cfg, const ds41_weights *w, const ds41_st *st,
                        long long cache_bytes, int scales_in_ram, ds41_err *err) {
    *out = NULL;
    int L = cfg->n_engram_layers, hd = cfg->engram_head_dim;
    if (L < 1 || L > DS41_ENGRAM_MAX_LAYERS || hd < 32 || hd % 32)
        return ds41_errf(err, "engram: no Engram tables to read (%d layers, head_dim %d)", L, hd);
    ds41_engram_io *io = calloc(1, sizeof *io);
    if (!io) return ds41_errf(err, "out of memory");
    pthread_mutex_init(&io->mu, NULL);
    io->n_slots = L;
    io->hd = hd;
    io->nsc = hd / 32;
    io->rb = io->hd + io->nsc;
    io->n_fds = ds41_st_shard_count(st);
    io->fds = malloc((size_t)(io->n_fds > 0 ? io->n_fds : 1) * sizeof(int));
    io->dfds = malloc((size_t)(io->n_fds > 0 ? io->n_fds : 1) * sizeof(int));
    if (!io->fds || !io->dfds) { ds41_engram_io_close(io); return ds41_errf(err, "out of memory"); }
    for (int i = 0; i < io->n_fds; i++) io->fds[i] = io->dfds[i] = -1;
    io->direct = 1;   /* until a shard cannot be opened O_DIRECT */
    if (parse_fault(io, err)) { ds41_engram_io_close(io); return -1; }
    const char *ev = getenv("DS41_ENGRAM_SPLIT");
    io->split_submit = !(ev && !strcmp(ev, "0"));
    ev = getenv("DS41_ENGRAM_SPIN_US");
    io->spin_s = ev ? strtod(ev, NULL) * 1e-6 : 0;
    if (!(io->spin_s >= 0 && io->spin_s <= 1)) io->spin_s = 0;
    int slot = 0;
    for (int l = 0; l < w->n_layers && l < cfg->n_layers; l++) {
        int sl = cfg->layers[l].engram_slot;
        if (sl < 0) continue;
        const ds41_layer_weights *lw = &w->layers[l];
        if (sl >= L || !lw->eg_embed || !lw->eg_scale) continue;
        eg_table *t = &io->t[sl];
        uint64_t ne = (uint64_t)lw->eg_rows * (uint64_t)io->hd, ns = (uint64_t)lw->eg_rows * (uint64_t)io->nsc;
        int she, shs;
        if (ds41_st_locate(st, lw->eg_embed, ne, &she, &t->off_e) || ds41_st_locate(st, lw->eg_scale, ns, &shs, &t->off_s)) {
            ds41_engram_io_close(io);
            return ds41_errf(err, "engram: layer %d's table is not mapped from a file (--load copy holds it in RAM "
                             "already): it cannot be prefetched", l);
        }
        if ((t->fd_e = shard_fd(io, st, she, err)) < 0 || (t->fd_s = shard_fd(io, st, shs, err)) < 0) {
            ds41_engram_io_close(io);
            return -1;
        }
        t->dfd_e = io->dfds[she];
        t->dfd_s = io->dfds[shs];
        t->path_e = ds41_st_shard_path(st, she);
        t->path_s = ds41_st_shard_path(st, shs);
        t->rows = lw->eg_rows;
        if (scales_in_ram) {
            /* 1/33 of the table: kept in RAM, a missing row costs one read instead of two */
            t->scales = malloc(ns ? (size_t)ns : 1);
            int rc = t->scales ? read_all(t->fd_s, t->scales, ns, t->off_s) : -ENOMEM;
            if (rc) {
                ds41_engram_io_close(io);
                return ds41_errf(err, "engram: reading the scales of Engram table %d (%s, byte offset %llu, %llu bytes): %s",
                                 sl, t->path_s, (unsigned long long)t->off_s, (unsigned long long)ns, strerror(-rc));
            }
            io->st.scale_ram_bytes += (long long)ns;
        }
        slot++;
    }
    if (slot != L) {
        ds41_engram_io_close(io);
        return ds41_errf(err, "engram: found %d of the %d Engram tables", slot, L);
    }
    if (io->direct) {
        /* a row (or its scales) spans at most ceil(len / align) + 1 aligned blocks */
        uint32_t a = io->dio_align, big = (uint32_t)(io->hd > io->nsc ? io->hd : io->nsc);
        io->span = ((big + a - 1) / a + 1) * a;
    }
    io->st.direct = io->direct;
    if (cache_bytes > 0) {
        size_t cap = (size_t)(cache_bytes / io->rb);
        if (cap > UINT32_MAX / 4) cap = UINT32_MAX / 4;
        if (cap) {
            io->hmask = pow2_at_least(2 * cap) - 1;
            io->ckey = malloc(cap * sizeof *io->ckey);
            io->cref = calloc(cap, 1);
            io->cdata = malloc(cap * (size_t)io->rb);
            io->hidx = calloc(io->hmask + 1, sizeof *io->hidx);
            if (!io->ckey || !io->cref || !io->cdata || !io->hidx) {
                ds41_engram_io_close(io);
                return ds41_errf(err, "engram: out of memory for a row cache of %lld bytes", cache_bytes);
            }
            io->cap = cap;
        }
    }
#ifdef DS41_HAVE_LIBURING
    io->st.uring = 1;
#endif
    io->st.row_bytes = io->rb;
    io->st.cache_rows = (long long)io->cap;
    *out = io;
    return 0;
}

void ds41_engram_io_close(ds41_engram_io *io) {
    if (!io) return;
    for (int i = 0; io->fds && i < io->n_fds; i++)
        if (io->fds[i] >= 0) close(io->fds[i]);
    for (int i = 0; io->dfds && i < io->n_fds; i++)
        if (io->dfds[i] >= 0) close(io->dfds[i]);
    free(io->dfds);
    for (int i = 0; i < DS41_ENGRAM_MAX_LAYERS; i++) free(io->t[i].scales);
    free(io->fds);
    free(io->ckey);
    free(io->cref);
    free(io->cdata);
    free(io->hidx);
    pthread_mutex_destroy(&io->mu);
    free(io);
}

void ds41_engram_io_get_stats(ds41_engram_io *io, ds41_engram_io_stats *out) {
    pthread_mutex_lock(&io->mu);
    *out = io->st;
    out->cache_used = (long long)io->used;
    pthread_mutex_unlock(&io->mu);
}

/* ---------------------------------------------------------------- step: reads */

static int key_slot(uint64_t key) { return (int)(key >> SLOT_SHIFT); }
static int64_t key_id(uint64_t key) { return (int64_t)(key & ((1ULL << SLOT_SHIFT) - 1)); }

/* Where read r goes: file, offset, buffer, length (the row's bytes, before any alignment). */
static void read_target(const ds41_engram_step *st, const eg_read *r, int *fd, uint64_t *off, uint8_t **buf,
                        uint32_t *len) {
    const ds41_engram_io *io = st->io;
    uint64_t key = st->key[r->u];
    const eg_table *t = &io->t[key_slot(key)];
    uint64_t id = (uint64_t)key_id(key);
    uint8_t *row = st->data + (size_t)r->u * io->rb;
    if (r->part == 0) {
        *fd = t->fd_e;
        *off = t->off_e + id * (uint64_t)io->hd;
        *buf = row;
        *len = (uint32_t)io->hd;
    } else {
        *fd = t->fd_s;
        *off = t->off_s + id * (uint64_t)io->nsc;
        *buf = row + io->hd;
        *len = (uint32_t)io->nsc;
    }
}

/* The I/O read r issues now: buffered, the rest of the row's bytes; direct, the aligned blocks
 * around them into the read's bounce slot (always whole: a short direct read starts over). */
static void read_io(const ds41_engram_step *st, const eg_read *r, int *fd, uint64_t *off, uint8_t **dst, uint32_t *len) {
    const ds41_engram_io *io = st->io;
    int bfd;
    uint64_t boff;
    uint8_t *buf;
    uint32_t blen;
    read_target(st, r, &bfd, &boff, &buf, &blen);
    if (!io->direct) {
        *fd = bfd;
        *off = boff + r->done;
        *dst = buf + r->done;
        *len = blen - r->done;
        return;
    }
    const eg_table *t = &io->t[key_slot(st->key[r->u])];
    uint64_t a = io->dio_align, a0 = boff / a * a, a1 = (boff + blen + a - 1) / a * a;
    *fd = r->part ? t->dfd_s : t->dfd_e;
    *off = a0;
    *dst = st->bounce + (size_t)(r - st->rd) * io->span;
    *len = (uint32_t)(a1 - a0);
}

/* The fault injection hook: what a completed read of `want` bytes reports instead of res. */
static long long inject(ds41_engram_io *io, long long res, uint32_t want) {
    if (io->fault == FAULT_NONE) return res;
    long long k = __atomic_add_fetch(&io->n_reads, 1, __ATOMIC_RELAXED);
    switch (io->fault) {
    case FAULT_EIO_ALL: return -EIO;
    case FAULT_EOF_ALL: return 0;
    case FAULT_EIO_ONE:
    case FAULT_SHORT_ONE: {
        /* once, at the K-th read or the first after it that can be cut short */
        int eligible = io->fault == FAULT_EIO_ONE || (res > 1 && want > 1);
        int expected = 0;
        if (k < io->fault_at || !eligible || !__atomic_compare_exchange_n(&io->fault_fired, &expected, 1, 0,
                                                                         __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            return res;
        return io->fault == FAULT_EIO_ONE ? -EIO : (long long)(want / 2);
    }
    default: return res;
    }
}

static int queue_push(ds41_engram_step *st, uint32_t r) {
    if (st->qtail == st->qcap) {
        /* compact, then grow */
        if (st->qhead) {
            memmove(st->queue, st->queue + st->qhead, (st->qtail - st->qhead) * sizeof *st->queue);
            st->qtail -= st->qhead;
            st->qhead = 0;
        }
        if (st->qtail == st->qcap) {
            size_t nc = st->qcap ? 2 * st->qcap : 64;
            uint32_t *q = realloc(st->queue, nc * sizeof *q);
            if (!q) return -1;
            st->queue = q;
            st->qcap = nc;
        }
    }
    st->queue[st->qtail++] = r;
    return 0;
}

/* A read finished with res bytes (or -errno): done, continued or retried; 1 when the row's
 * part is complete, 0 when queued again, -1 when it failed for good. */
static int read_done(ds41_engram_step *st, eg_read *r, long long res) {
    ds41_engram_io *io = st->io;
    int fd;
    uint64_t off;
    uint8_t *buf;
    uint32_t len;
    read_target(st, r, &fd, &off, &buf, &len);
    if (io->direct) {
        int dfd;
        uint64_t a0;
        uint8_t *bounce;
        uint32_t alen;
        read_io(st, r, &dfd, &a0, &bounce, &alen);
        uint32_t need = (uint32_t)(off - a0) + len;   /* the blocks may run past the file's end */
        res = inject(io, res, need);
        if (res >= (long long)need) {
            memcpy(buf, bounce + (off - a0), len);
            r->done = len;
            return 1;
        }
    } else {
        res = inject(io, res, len - r->done);
        if (res > 0) {
            r->done += (uint32_t)res;
            if (r->done >= len) return 1;
        }
    }
    /* an error, end of file or a short read: again from where it stopped */
    if (res == -EINTR || res == -EAGAIN || ++r->tries < READ_TRIES) {
        __atomic_add_fetch(&io->st.retries, 1, __ATOMIC_RELAXED);
        if (queue_push(st, (uint32_t)(r - st->rd)) == 0) return 0;
        res = -ENOMEM;
    }
    if (!st->failed) {
        uint64_t key = st->key[r->u];
        int sl = key_slot(key);
        const eg_table *t = &io->t[sl];
        ds41_errf(&st->fail_err, "engram: reading row %lld of Engram table %d (%s, %s, byte offset %llu, %u bytes) "
                  "failed after %d tries: %s", (long long)key_id(key), sl, r->part ? t->path_s : t->path_e,
                  r->part ? "scales" : "E4M3 rows", (unsigned long long)(off + r->done), len - r->done, READ_TRIES,
                  res < 0 ? strerror((int)-res) : res == 0 ? "end of file" : "short read");
        st->failed = 1;
    }
    __atomic_add_fetch(&io->st.errors, 1, __ATOMIC_RELAXED);
    return -1;
}

static void read_complete(ds41_engram_step *st, uint32_t ri, long long res) {
    eg_read *r = &st->rd[ri];
    int rc = read_done(st, r, res);
    if (rc != 0) st->pending[key_slot(st->key[r->u])]--;
    if (rc == 1) {
        __atomic_add_fetch(&st->io->st.bytes_read, (long long)(r->part ? st->io->nsc : st->io->hd), __ATOMIC_RELAXED);
    }
}

/* pread path (no io_uring): performs every queued read now. */
static void run_queue_sync(ds41_engram_step *st) {
    while (st->qhead < st->qtail) {
        uint32_t ri = st->queue[st->qhead++];
        eg_read *r = &st->rd[ri];
        int fd;
        uint64_t off;
        uint8_t *buf;
        uint32_t len;
        read_io(st, r, &fd, &off, &buf, &len);
        ssize_t got = pread(fd, buf, len, (off_t)off);
        read_complete(st, ri, got < 0 ? -(long long)errno : (long long)got);
    }
}

#ifdef DS41_HAVE_LIBURING
static int submit_queue(ds41_engram_step *st, size_t max) {
    int added = 0;
    while (st->qhead < st->qtail && st->inflight < RING_DEPTH && (size_t)added < max) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&st->ring);
        if (!sqe) break;
        uint32_t ri = st->queue[st->qhead++];
        eg_read *r = &st->rd[ri];
        int fd;
        uint64_t off;
        uint8_t *buf;
        uint32_t len;
        read_io(st, r, &fd, &off, &buf, &len);
        io_uring_prep_read(sqe, fd, buf, len, off);
        io_uring_sqe_set_data64(sqe, ri);
        st->inflight++;
        added++;
    }
    if (added) {
        int rc;
        do rc = io_uring_submit(&st->ring); while (rc == -EINTR);
        if (rc < 0) return rc;
    }
    return 0;
}

/* Reaps one completion (blocking; polling the ring for up to the spin budget first);
 * -errno on a ring failure. */
static int reap_one(ds41_engram_step *st) {
    struct io_uring_cqe *cqe;
    int rc = -EAGAIN;
    if (st->io->spin_s > 0)
        for (double t0 = now_s(); (rc = io_uring_peek_cqe(&st->ring, &cqe)) == -EAGAIN && now_s() - t0 < st->io->spin_s;) {}
    if (rc == -EAGAIN)
        do rc = io_uring_wait_cqe(&st->ring, &cqe); while (rc == -EINTR);
    if (rc < 0) return rc;
    uint32_t ri = (uint32_t)io_uring_cqe_get_data64(cqe);
    long long res = cqe->res;
    io_uring_cqe_seen(&st->ring, cqe);
    st->inflight--;
    read_complete(st, ri, res);
    return 0;
}
#endif

/* Moves reads forward until slot's rows are all in (slot < 0: every slot's). */
static int pump(ds41_engram_step *st, int slot) {
    for (;;) {
        size_t left = 0;
        for (int s = 0; s < st->io->n_slots; s++)
            if (slot < 0 || s == slot) left += st->pending[s];
        if (!left) return 0;
#ifdef DS41_HAVE_LIBURING
        if (st->have_ring) {
            int rc = submit_queue(st, SIZE_MAX);
            if (rc == 0 && st->inflight > 0) rc = reap_one(st);
            if (rc < 0) {
                /* the ring itself failed: finish what is left with pread */
                if (!st->failed) ds41_log(1, "engram: io_uring failed (%s); reading rows with pread", strerror(-rc));
                while (st->inflight > 0 && reap_one(st) == 0) {}
                io_uring_queue_exit(&st->ring);
                st->have_ring = 0;
                st->inflight = 0;
            }
            continue;
        }
#endif
        run_queue_sync(st);
        if (st->qhead == st->qtail) {
            /* nothing left to run: every pending read either finished or failed */
            for (int s = 0; s < st->io->n_slots; s++)
                if (slot < 0 || s == slot) st->pending[s] = 0;
        }
    }
}

/* The rows slot read from disk go into the shared cache (once per step). */
static void insert_slot(ds41_engram_step *st, int slot) {
    if (st->inserted[slot] || st->failed) return;
    st->inserted[slot] = 1;
    ds41_engram_io *io = st->io;
    if (!io->cap) return;
    pthread_mutex_lock(&io->mu);
    for (size_t u = 0; u < st->n; u++)
        if (st->miss[u] && key_slot(st->key[u]) == slot) cache_put(io, st->key[u], st->data + u * (size_t)io->rb);
    pthread_mutex_unlock(&io->mu);
}

/* Finishes the reads of the current step (buffers must not change under the kernel). */
static void drain(ds41_engram_step *st) {
    pump(st, -1);
    for (int s = 0; s < st->io->n_slots; s++) insert_slot(st, s);
    pthread_mutex_lock(&st->io->mu);
    if (st->stall > st->io->st.stall_max_s) st->io->st.stall_max_s = st->stall;
    pthread_mutex_unlock(&st->io->mu);
    st->stall = 0;
}

ds41_engram_step *ds41_engram_step_new(ds41_engram_io *io) {
    ds41_engram_step *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->io = io;
#ifdef DS41_HAVE_LIBURING
    /* DS41_ENGRAM_PREAD=1: the pread path even where io_uring works (tests, comparisons) */
    const char *force = getenv("DS41_ENGRAM_PREAD");
    int rc = force && !strcmp(force, "1") ? -EPERM : io_uring_queue_init(RING_DEPTH, &st->ring, 0);
    if (rc == 0) {
        st->have_ring = 1;
    } else {
        pthread_mutex_lock(&io->mu);
        io->st.uring = 0;
        int first = !io->uring_failed_logged;
        io->uring_failed_logged = 1;
        pthread_mutex_unlock(&io->mu);
        if (first) ds41_log(1, "engram: io_uring unavailable (%s); reading rows with pread", strerror(-rc));
    }
#endif
    return st;
}

void ds41_engram_step_free(ds41_engram_step *st) {
    if (!st) return;
    drain(st);
#ifdef DS41_HAVE_LIBURING
    if (st->have_ring) io_uring_queue_exit(&st->ring);
#endif
    free(st->key);
    free(st->data);
    free(st->miss);
    free(st->hidx);
    free(st->rd);
    free(st->queue);
    free(st->bounce);
    free(st);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static size_t step_find(const ds41_engram_step *st, uint64_t key) {
    for (size_t i = mix64(key) & st->hmask;; i = (i + 1) & st->hmask) {
        uint32_t v = st->hidx[i];
        if (!v) return SIZE_MAX;
        if (st->key[v - 1] == key) return v - 1;
    }
}

/* Room for n distinct rows and 2n reads. */
static int step_reserve(ds41_engram_step *st, size_t n) {
    size_t hsz = pow2_at_least(2 * n);
    if (hsz - 1 != st->hmask || !st->hidx) {
        free(st->hidx);
        st->hidx = malloc(hsz * sizeof *st->hidx);
        if (!st->hidx) return -1;
        st->hmask = hsz - 1;
    }
    memset(st->hidx, 0, hsz * sizeof *st->hidx);
    if (n > st->ncap) {
        free(st->key);
        free(st->data);
        free(st->miss);
        st->key = malloc(n * sizeof *st->key);
        st->data = malloc(n * (size_t)st->io->rb);
        st->miss = malloc(n);
        st->ncap = st->key && st->data && st->miss ? n : 0;
        if (!st->ncap) return -1;
    }
    if (2 * n > st->rdcap) {
        free(st->rd);
        st->rd = malloc(2 * n * sizeof *st->rd);
        st->rdcap = st->rd ? 2 * n : 0;
        if (!st->rd) return -1;
    }
    if (st->io->direct && st->bounce_cap < st->rdcap) {
        free(st->bounce);
        void *p = NULL;
        if (posix_memalign(&p, st->io->dio_align, st->rdcap * (size_t)st->io->span)) p = NULL;
        st->bounce = p;
        st->bounce_cap = p ? st->rdcap : 0;
        if (!p) return -1;
    }
    return 0;
}

int ds41_engram_step_issue(ds41_engram_step *st, const int64_t *ids, size_t N, int cols, ds41_err *err) {
    ds41_engram_io *io = st->io;
    drain(st);
    double t_issue = now_s();
    st->failed = 0;
    st->n = st->nrd = st->qhead = st->qtail = 0;
    memset(st->pending, 0, sizeof st->pending);
    memset(st->inserted, 0, sizeof st->inserted);
    size_t total = (size_t)io->n_slots * N * (size_t)cols;
    if (step_reserve(st, total ? total : 1))
        return ds41_errf(err, "engram: out of memory for a step of %zu row lookups", total);
    /* distinct (slot, id) pairs */
    for (int sl = 0; sl < io->n_slots; sl++) {
        const int64_t *p = ids + (size_t)sl * N * cols;
        for (size_t i = 0; i < N * (size_t)cols; i++) {
            int64_t id = p[i];
            if (id < 0 || id >= io->t[sl].rows) continue;
            uint64_t key = (uint64_t)sl << SLOT_SHIFT | (uint64_t)id;
            size_t h = mix64(key) & st->hmask;
            for (;; h = (h + 1) & st->hmask) {
                if (!st->hidx[h]) {
                    st->key[st->n++] = key;
                    st->hidx[h] = (uint32_t)st->n;
                    break;
                }
                if (st->key[st->hidx[h] - 1] == key) break;
            }
        }
    }
    /* in (slot, file offset) order: slot 0's reads go out first, and neighbours stay close */
    qsort(st->key, st->n, sizeof *st->key, cmp_u64);
    memset(st->hidx, 0, (st->hmask + 1) * sizeof *st->hidx);
    for (size_t u = 0; u < st->n; u++) {
        size_t h = mix64(st->key[u]) & st->hmask;
        while (st->hidx[h]) h = (h + 1) & st->hmask;
        st->hidx[h] = (uint32_t)(u + 1);
    }
    /* cached rows are copied now; the others are read */
    long long hits = 0;
    pthread_mutex_lock(&io->mu);
    for (size_t u = 0; u < st->n; u++) {
        size_t e = cache_find(io, st->key[u]);
        st->miss[u] = e == SIZE_MAX;
        if (e != SIZE_MAX) {
            memcpy(st->data + u * (size_t)io->rb, io->cdata + e * (size_t)io->rb, (size_t)io->rb);
            io->cref[e] = 1;
            hits++;
        }
    }
    io->st.steps++;
    io->st.refs += (long long)total;
    io->st.lookups += (long long)st->n;
    io->st.hits += hits;
    io->st.rows_read += (long long)st->n - hits;
    pthread_mutex_unlock(&io->mu);
    for (size_t u = 0; u < st->n; u++) {
        if (!st->miss[u]) continue;
        const eg_table *t = &io->t[key_slot(st->key[u])];
        int parts = 2;
        if (t->scales) {   /* the scales are in RAM: only the E4M3 row is read */
            memcpy(st->data + u * (size_t)io->rb + io->hd, t->scales + (size_t)key_id(st->key[u]) * io->nsc, (size_t)io->nsc);
            parts = 1;
        }
        for (uint8_t part = 0; part < parts; part++) {
            st->rd[st->nrd] = (eg_read){ (uint32_t)u, part, 0, 0 };
            if (queue_push(st, (uint32_t)st->nrd)) return ds41_errf(err, "engram: out of memory for the read queue");
            st->nrd++;
        }
        st->pending[key_slot(st->key[u])] += (size_t)parts;
    }
#ifdef DS41_HAVE_LIBURING
    if (st->have_ring) {
        /* only the first Engram layer's reads now: each submitted read costs the caller time in
         * the kernel before the layers in front of that one can start (2-10 us here), and
         * the later slots' reads are not needed before those layers have run. They go out at
         * the first wait (while it waits, when it has to) */
        size_t first = 0;
        for (int sl = 0; sl < io->n_slots && !first; sl++) first = st->pending[sl];
        int rc = submit_queue(st, io->split_submit ? first : SIZE_MAX);
        if (rc < 0) ds41_log(2, "engram: io_uring submit: %s (retried at the wait)", strerror(-rc));
    }
#endif
    st->issued = now_s();
    pthread_mutex_lock(&io->mu);
    io->st.issue_s += st->issued - t_issue;
    pthread_mutex_unlock(&io->mu);
    return 0;
}

int ds41_engram_step_wait(ds41_engram_step *st, int slot, ds41_err *err) {
    if (slot < 0 || slot >= st->io->n_slots) return ds41_errf(err, "engram: slot %d out of range", slot);
    double t0 = now_s();
    pump(st, slot);
    double dt = now_s() - t0;
    st->stall += dt;
    pthread_mutex_lock(&st->io->mu);
    st->io->st.stall_s += dt;
    if (st->issued > 0) st->io->st.lead_s += t0 - st->issued;
    st->issued = 0;
    pthread_mutex_unlock(&st->io->mu);
    if (st->failed) {
        if (err) *err = st->fail_err;
        return -1;
    }
    insert_slot(st, slot);
    return 0;
}

int ds41_engram_step_poll(ds41_engram_step *st) {
#ifdef DS41_HAVE_LIBURING
    if (st->have_ring) {
        /* the reads issue held back (the later slots') and any retries go out now; what has
         * completed is taken, nothing is waited for. A ring that fails is left to the wait,
         * which falls back to pread */
        if (submit_queue(st, SIZE_MAX) < 0) return 0;
        struct io_uring_cqe *cqe;
        while (st->inflight > 0 && io_uring_peek_cqe(&st->ring, &cqe) == 0) {
            uint32_t ri = (uint32_t)io_uring_cqe_get_data64(cqe);
            long long res = cqe->res;
            io_uring_cqe_seen(&st->ring, cqe);
            st->inflight--;
            read_complete(st, ri, res);
        }
        if (st->qhead < st->qtail) submit_queue(st, SIZE_MAX);   /* retries queued by read_complete */
        for (int s = 0; s < st->io->n_slots; s++)
            if (st->pending[s]) return 0;
        return 1;
    }
#endif
    pump(st, -1);   /* pread: the reads can only be done here */
    return 1;
}

const uint8_t *ds41_engram_step_row(const ds41_engram_step *st, int slot, int64_t id) {
    if (!st->n || id < 0) return NULL;
    size_t u = step_find(st, (uint64_t)slot << SLOT_SHIFT | (uint64_t)id);
    return u == SIZE_MAX ? NULL : st->data + u * (size_t)st->io->rb;
}

typedef struct src_arg { const ds41_engram_src *src; int slot; } src_arg;

static const uint8_t *src_row_fn(const void *arg, int64_t id) {
    const src_arg *a = arg;
    return a->src->row(a->src->self, a->slot, id);
}

int ds41_engram_apply_from(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                           const ds41_engram_src *src, int slot, const int64_t *ids, int T, const uint8_t *is_image,
                           float *X, ds41_err *err) {
    if (src->wait(src->self, slot, err)) return -1;
    src_arg a = { src, slot };
    ds41_engram_apply_src(ctx, cfg, lw, ids, T, is_image, X, src_row_fn, &a);
    return 0;
}

/* A step as a row source */
static int step_src_wait(void *self, int slot, ds41_err *err) { return ds41_engram_step_wait(self, slot, err); }
static const uint8_t *step_src_row(const void *self, int slot, int64_t id) { return ds41_engram_step_row(self, slot, id); }

int ds41_engram_apply_step(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                           ds41_engram_step *st, int slot, const int64_t *ids, int T, const uint8_t *is_image,
                           float *X, ds41_err *err) {
    if (!st) {
        ds41_engram_apply(ctx, cfg, lw, ids, T, is_image, X);
        return 0;
    }
    ds41_engram_src src = { st, NULL, step_src_wait, step_src_row };
    return ds41_engram_apply_from(ctx, cfg, lw, &src, slot, ids, T, is_image, X, err);
}

/* ---------------------------------------------------------------- tables in RAM */

long long ds41_engram_table_bytes(const ds41_config *cfg, const ds41_weights *w) {
    long long b = 0;
    int hd = cfg->engram_head_dim;
    for (int l = 0; l < w->n_layers && l < cfg->n_layers; l++)
        if (cfg->layers[l].engram_slot >= 0 && w->layers[l].eg_embed)
            b += (long long)w->layers[l].eg_rows * (hd + hd / 32);
    return b;
}

int ds41_engram_tables_to_ram(const ds41_config *cfg, ds41_weights *w, void **mem, size_t *len, ds41_err *err) {
    *mem = NULL;
    *len = 0;
    long long total = ds41_engram_table_bytes(cfg, w);
    if (total <= 0) return 0;
    size_t n = (size_t)total;
    uint8_t *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return ds41_errf(err, "engram: cannot allocate %lld bytes for the tables in RAM: %s", total, strerror(errno));
#ifdef MADV_HUGEPAGE
    madvise(m, n, MADV_HUGEPAGE);
#endif
    size_t o = 0;
    int hd = cfg->engram_head_dim;
    for (int l = 0; l < w->n_layers && l < cfg->n_layers; l++) {
        ds41_layer_weights *lw = &w->layers[l];
        if (cfg->layers[l].engram_slot < 0 || !lw->eg_embed) continue;
        size_t ne = (size_t)lw->eg_rows * (size_t)hd, ns = (size_t)lw->eg_rows * (size_t)(hd / 32);
        /* copied from the mapping, then the mapping's pages are dropped: the copy is the only
         * resident one (the page cache keeps what the kernel wants, reclaimable) */
        memcpy(m + o, lw->eg_embed, ne);
        memcpy(m + o + ne, lw->eg_scale, ns);
        uintptr_t pg = 4096;
        for (int k = 0; k < 2; k++) {
            uintptr_t a = (uintptr_t)(k ? (const void *)lw->eg_scale : (const void *)lw->eg_embed);
            uintptr_t lo = (a + pg - 1) & ~(pg - 1), hi = (a + (k ? ns : ne)) & ~(pg - 1);
            if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
        }
        lw->eg_embed = m + o;
        lw->eg_scale = m + o + ne;
        o += ne + ns;
    }
    mprotect(m, n, PROT_READ);
    *mem = m;
    *len = n;
    return 0;
}

void ds41_engram_tables_advise_random(const ds41_config *cfg, const ds41_weights *w) {
    int hd = cfg->engram_head_dim;
    uintptr_t pg = 4096;
    for (int l = 0; l < w->n_layers && l < cfg->n_layers; l++) {
        const ds41_layer_weights *lw = &w->layers[l];
        if (cfg->layers[l].engram_slot < 0 || !lw->eg_embed) continue;
        for (int k = 0; k < 2; k++) {
            uintptr_t a = (uintptr_t)(k ? (const void *)lw->eg_scale : (const void *)lw->eg_embed);
            size_t n = (size_t)lw->eg_rows * (size_t)(k ? hd / 32 : hd);
            uintptr_t lo = a & ~(pg - 1), hi = (a + n + pg - 1) & ~(pg - 1);
            /* the neighbours of a row are other n-grams' rows: read-ahead only fetches pages
             * nobody asked for. The shard's mapping is advised MADV_HUGEPAGE (safetensors.c),
             * and on such a range the kernel reads a 2 MiB folio per fault whatever
             * MADV_RANDOM says (measured: 84 MB read per token under a memory limit), so the
             * tables are taken out of it first. */
#ifdef MADV_NOHUGEPAGE
            madvise((void *)lo, hi - lo, MADV_NOHUGEPAGE);
#endif
            madvise((void *)lo, hi - lo, MADV_RANDOM);
        }
    }
}

void ds41_engram_ram_free(void *mem, size_t len) {
    if (mem) munmap(mem, len);
}
