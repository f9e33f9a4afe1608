/* ds41 persistent prefix store (pstore.h has the layout, the file format and the rules). */
#define _GNU_SOURCE
#include "pstore.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"

static const char MAGIC[8] = { 'D', 'S', '4', '1', 'P', 'B', 'L', 'K' };
#define HDR DS41_PSTORE_HEADER
#define TRAILER 4
#define TMP_PREFIX ".tmp."
#define BLK_SUFFIX ".blk"

struct ds41_pstore {
    char *dir;             /* DIR */
    char *fpdir;           /* DIR/<fingerprint hex> */
    uint8_t fp[32];
    long long cap;
    int lockfd;            /* DIR/lock */
    int dirfd;             /* fpdir, for the fsync after a rename */
    pthread_mutex_t mu;    /* puts of this store, and used */
    long long used;        /* running total of DIR's block bytes (pstore.h, capacity) */
    unsigned long seq;     /* temporary file names */
};

/* ---- small helpers ---------------------------------------------------------------------- */

static void put_le32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put_le64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint32_t get_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_le64(const uint8_t *p) { return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32; }

void ds41_pstore_hex(const uint8_t *v, size_t n, char *out) {
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[v[i] >> 4];
        out[2 * i + 1] = d[v[i] & 15];
    }
    out[2 * n] = 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int ds41_pstore_unhex(const char *s, uint8_t *v, size_t n) {
    if (strlen(s) != 2 * n) return -1;
    for (size_t i = 0; i < n; i++) {
        int a = hexval(s[2 * i]), b = hexval(s[2 * i + 1]);
        if (a < 0 || b < 0) return -1;
        v[i] = (uint8_t)(a << 4 | b);
    }
    return 0;
}

/* lowercase hex only: the names this store writes */
static int is_lower_hex(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

static int is_fp_name(const char *s) { return strlen(s) == 64 && is_lower_hex(s, 64); }
static int is_blk_name(const char *s) {
    return strlen(s) == 32 + strlen(BLK_SUFFIX) && is_lower_hex(s, 32) && !strcmp(s + 32, BLK_SUFFIX);
}
static int is_tmp_name(const char *s) { return !strncmp(s, TMP_PREFIX, strlen(TMP_PREFIX)); }

/* The LRU age of a block is its file's mtime (atime is set to the same value). A block whose
 * parent is present is stamped 1 us before the parent's stamp (never later than now), so that a
 * chain of blocks, put or looked up head first, has its descendants older than its ancestors:
 * eviction then takes a prompt's tail blocks before its head (a block without its ancestors is
 * unreachable), and the chain's recency is that of its head. Blocks without a parent (all-zero
 * key) or whose parent is gone are stamped now. Nanoseconds, set explicitly: the kernel's own
 * timestamps are coarser and ties would blur the order. */
static const uint8_t ZERO_KEY[16];
static void block_name(const uint8_t key[16], char out[32 + sizeof ".blk"]);

static void stamp_fd(const char *fpdir, int fd, const uint8_t parent[16]) {
    struct timespec now, t[2];
    clock_gettime(CLOCK_REALTIME, &now);
    t[0] = now;
    if (memcmp(parent, ZERO_KEY, 16) != 0) {
        char name[32 + sizeof ".blk"], path[4200];
        block_name(parent, name);
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", fpdir, name);
        if (stat(path, &st) == 0) {
            long long p = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec - 1000;
            long long n = (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
            if (p < n && p > 0) {
                t[0].tv_sec = (time_t)(p / 1000000000LL);
                t[0].tv_nsec = (long)(p % 1000000000LL);
            }
        }
    }
    t[1] = t[0];
    (void)futimens(fd, t);
}

static int flock_retry(int fd, int op) {
    int r;
    while ((r = flock(fd, op)) != 0 && errno == EINTR) {}
    return r;
}

static int write_all(int fd, const void *p, size_t n) {
    const uint8_t *s = p;
    while (n) {
        ssize_t k = write(fd, s, n);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (k == 0) { errno = EIO; return -1; }
        s += k;
        n -= (size_t)k;
    }
    return 0;
}

static int read_all(int fd, void *p, size_t n, size_t *got) {
    uint8_t *s = p;
    size_t done = 0;
    while (done < n) {
        ssize_t k = read(fd, s + done, n - done);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (k == 0) break;
        done += (size_t)k;
    }
    *got = done;
    return 0;
}

static int mkdir_p(const char *path, ds41_err *err) {
    char *p = strdup(path);
    if (!p) return ds41_errf(err, "%s: out of memory", path);
    for (char *q = p + 1;; q++) {
        if (*q == '/' || *q == 0) {
            char c = *q;
            *q = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST) {
                int e = errno;
                ds41_errf(err, "%s: cannot create directory: %s", p, strerror(e));
                free(p);
                return -1;
            }
            *q = c;
            if (!c) break;
        }
    }
    free(p);
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return ds41_errf(err, "%s: not a directory", path);
    return 0;
}

static int fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int r = fsync(fd);
    close(fd);
    return r;
}

/* ---- the file format ---------------------------------------------------------------------- */

static void encode_header(uint8_t h[HDR], const uint8_t fp[32], const uint8_t key[16], const uint8_t parent[16],
                          uint32_t n_ids, uint64_t n_payload) {
    memset(h, 0, HDR);
    memcpy(h, MAGIC, 8);
    put_le32(h + 8, DS41_PSTORE_VERSION);
    put_le32(h + 12, HDR);
    memcpy(h + 16, fp, 32);
    memcpy(h + 48, key, 16);
    memcpy(h + 64, parent, 16);
    put_le32(h + 80, n_ids);
    put_le64(h + 88, n_payload);
    put_le32(h + 100, ds41_crc32c(0, h, 100));
}

static int bad(ds41_pstore_block *b, int kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(ds41_pstore_block *b, int kind, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->why, sizeof b->why, fmt, ap);
    va_end(ap);
    return kind;
}

int ds41_pstore_parse(const uint8_t *data, size_t avail, uint64_t file_bytes, ds41_pstore_block *b) {
    memset(b, 0, sizeof *b);
    b->file_bytes = file_bytes;
    if (avail > file_bytes) return bad(b, DS41_PSTORE_DAMAGED, "more bytes than the file size");
    if (file_bytes < HDR + TRAILER || avail < HDR)
        return bad(b, DS41_PSTORE_DAMAGED, "truncated: %llu bytes, shorter than the %d-byte header and checksum",
                   (unsigned long long)file_bytes, HDR + TRAILER);
    if (memcmp(data, MAGIC, 8) != 0) return bad(b, DS41_PSTORE_DAMAGED, "bad magic");
    b->version = get_le32(data + 8);
    if (b->version != DS41_PSTORE_VERSION)
        return bad(b, DS41_PSTORE_FOREIGN, "format version %u (this ds41 reads %d)", b->version, DS41_PSTORE_VERSION);
    if (get_le32(data + 100) != ds41_crc32c(0, data, 100)) return bad(b, DS41_PSTORE_DAMAGED, "header checksum mismatch");
    if (get_le32(data + 12) != HDR) return bad(b, DS41_PSTORE_DAMAGED, "header size %u, expected %d", get_le32(data + 12), HDR);
    if (get_le32(data + 84) != 0 || get_le32(data + 96) != 0) return bad(b, DS41_PSTORE_DAMAGED, "reserved header field not zero");
    memcpy(b->fingerprint, data + 16, 32);
    memcpy(b->key, data + 48, 16);
    memcpy(b->parent, data + 64, 16);
    b->n_ids = get_le32(data + 80);
    b->n_payload = get_le64(data + 88);
    if (b->n_ids > DS41_PSTORE_MAX_IDS) return bad(b, DS41_PSTORE_DAMAGED, "%u token ids, more than the limit", b->n_ids);
    if (b->n_payload > (uint64_t)DS41_PSTORE_MAX_FILE)
        return bad(b, DS41_PSTORE_DAMAGED, "payload of %llu bytes, more than the limit", (unsigned long long)b->n_payload);
    uint64_t want = HDR + 4 * (uint64_t)b->n_ids + b->n_payload + TRAILER;
    if (file_bytes != want)
        return bad(b, DS41_PSTORE_DAMAGED, "%s: %llu bytes, the header says %llu", file_bytes < want ? "truncated" : "size mismatch",
                   (unsigned long long)file_bytes, (unsigned long long)want);
    if (avail < file_bytes) return DS41_PSTORE_OK;
    if (get_le32(data + file_bytes - TRAILER) != ds41_crc32c(0, data, file_bytes - TRAILER))
        return bad(b, DS41_PSTORE_DAMAGED, "checksum mismatch");
    b->ids = data + HDR;
    b->payload = data + HDR + 4 * (size_t)b->n_ids;
    return DS41_PSTORE_OK;
}

/* ---- open / close ----------------------------------------------------------------------- */

/* One file found by walk_dir. */
typedef struct walk_item {
    const char *fpdir, *fpname, *name, *path;
    struct stat st;
} walk_item;
typedef int (*walk_fn)(const walk_item *it, void *ctx);

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sorted names of a directory (only . entries skipped); *names NULL when empty. */
static int list_dir(const char *path, char ***names, size_t *count, ds41_err *err) {
    *names = NULL;
    *count = 0;
    DIR *d = opendir(path);
    if (!d) return ds41_errf(err, "%s: cannot read directory: %s", path, strerror(errno));
    size_t n = 0, cap = 0;
    char **v = NULL;
    struct dirent *e;
    errno = 0;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 64;
            char **nv = realloc(v, nc * sizeof *nv);
            if (!nv) goto oom;
            v = nv;
            cap = nc;
        }
        if (!(v[n] = strdup(e->d_name))) goto oom;
        n++;
        errno = 0;
    }
    if (errno) {
        int e2 = errno;
        for (size_t i = 0; i < n; i++) free(v[i]);
        free(v);
        closedir(d);
        return ds41_errf(err, "%s: cannot read directory: %s", path, strerror(e2));
    }
    closedir(d);
    if (n) qsort(v, n, sizeof *v, cmp_str);
    *names = v;
    *count = n;
    return 0;
oom:
    for (size_t i = 0; i < n; i++) free(v[i]);
    free(v);
    closedir(d);
    return ds41_errf(err, "%s: out of memory listing the directory", path);
}

static void free_names(char **v, size_t n) {
    for (size_t i = 0; i < n; i++) free(v[i]);
    free(v);
}

/* Calls fn for every block and temporary file under dir's fingerprint subdirectories (only
 * fp_only's when not NULL), in sorted order. Files that vanish meanwhile are skipped. */
static int walk_dir(const char *dir, const char *fp_only, walk_fn fn, void *ctx, ds41_err *err) {
    char **fps;
    size_t nfp;
    if (list_dir(dir, &fps, &nfp, err) != 0) return -1;
    int rc = 0;
    for (size_t i = 0; i < nfp && !rc; i++) {
        if (!is_fp_name(fps[i]) || (fp_only && strcmp(fps[i], fp_only))) continue;
        char *fpdir = ds41_path_join(dir, fps[i]);
        if (!fpdir) { rc = ds41_errf(err, "%s: out of memory", dir); break; }
        struct stat st;
        if (lstat(fpdir, &st) != 0 || !S_ISDIR(st.st_mode)) { free(fpdir); continue; }
        char **names;
        size_t n;
        if (list_dir(fpdir, &names, &n, err) != 0) { free(fpdir); rc = -1; break; }
        for (size_t k = 0; k < n && !rc; k++) {
            if (!is_blk_name(names[k]) && !is_tmp_name(names[k])) continue;
            char *path = ds41_path_join(fpdir, names[k]);
            if (!path) { rc = ds41_errf(err, "%s: out of memory", fpdir); break; }
            walk_item it = { fpdir, fps[i], names[k], path, { 0 } };
            if (lstat(path, &it.st) == 0 && S_ISREG(it.st.st_mode)) rc = fn(&it, ctx);
            free(path);
        }
        free_names(names, n);
        free(fpdir);
    }
    free_names(fps, nfp);
    return rc;
}

/* Used at open: removes orphaned temporary files (only called under the exclusive lock) and
 * sums the block bytes. */
typedef struct usage_ctx { long long bytes; int clean; } usage_ctx;
static int usage_visit(const walk_item *it, void *ctx) {
    usage_ctx *u = ctx;
    if (is_tmp_name(it->name)) {
        if (u->clean) unlink(it->path);
    } else {
        u->bytes += (long long)it->st.st_size;
    }
    return 0;
}

ds41_pstore *ds41_pstore_open(const char *dir, const uint8_t fingerprint[32], long long cap_bytes, ds41_err *err) {
    if (!dir || !*dir) { ds41_errf(err, "pstore: empty cache directory name"); return NULL; }
    if (cap_bytes < 0) { ds41_errf(err, "%s: negative capacity %lld", dir, cap_bytes); return NULL; }
    if (mkdir_p(dir, err) != 0) return NULL;
    ds41_pstore *s = calloc(1, sizeof *s);
    if (!s) { ds41_errf(err, "%s: out of memory", dir); return NULL; }
    s->lockfd = s->dirfd = -1;
    pthread_mutex_init(&s->mu, NULL);
    memcpy(s->fp, fingerprint, 32);
    s->cap = cap_bytes;
    char fphex[65];
    ds41_pstore_hex(fingerprint, 32, fphex);
    s->dir = strdup(dir);
    s->fpdir = ds41_path_join(dir, fphex);
    char *lockpath = ds41_path_join(dir, "lock");
    if (!s->dir || !s->fpdir || !lockpath) {
        ds41_errf(err, "%s: out of memory", dir);
        goto fail;
    }
    s->lockfd = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (s->lockfd < 0) {
        ds41_errf(err, "%s: cannot open the lock file: %s", lockpath, strerror(errno));
        goto fail;
    }
    if (mkdir(s->fpdir, 0755) == 0) {
        if (fsync_path(dir) != 0) {
            ds41_errf(err, "%s: fsync of the directory failed: %s", dir, strerror(errno));
            goto fail;
        }
    } else if (errno != EEXIST) {
        ds41_errf(err, "%s: cannot create directory: %s", s->fpdir, strerror(errno));
        goto fail;
    }
    s->dirfd = open(s->fpdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (s->dirfd < 0) {
        ds41_errf(err, "%s: cannot open directory: %s", s->fpdir, strerror(errno));
        goto fail;
    }
    /* Orphaned temporary files (a writer killed between create and rename) are removed when no
     * writer holds the lock; with writers at work they wait for a later open, eviction or
     * verify --fix. */
    usage_ctx u = { 0, 0 };
    if (flock_retry(s->lockfd, LOCK_EX | LOCK_NB) == 0) u.clean = 1;
    /* without a capacity the total is not needed: only this fingerprint's directory is walked */
    int rc = cap_bytes || u.clean ? walk_dir(dir, cap_bytes ? NULL : fphex, usage_visit, &u, err) : 0;
    if (u.clean) flock_retry(s->lockfd, LOCK_UN);
    if (rc != 0) goto fail;
    s->used = u.bytes;
    free(lockpath);
    return s;
fail:
    free(lockpath);
    ds41_pstore_close(s);
    return NULL;
}

void ds41_pstore_close(ds41_pstore *s) {
    if (!s) return;
    if (s->lockfd >= 0) close(s->lockfd);
    if (s->dirfd >= 0) close(s->dirfd);
    pthread_mutex_destroy(&s->mu);
    free(s->dir);
    free(s->fpdir);
    free(s);
}

const char *ds41_pstore_path(const ds41_pstore *s) { return s->fpdir; }

long long ds41_pstore_used(const ds41_pstore *s) {
    ds41_pstore *m = (ds41_pstore *)s;
    pthread_mutex_lock(&m->mu);
    long long u = m->used;
    pthread_mutex_unlock(&m->mu);
    return u;
}

/* Under s->mu: recreates DIR and the fingerprint directory and reopens the lock file and the
 * directory descriptor (after they were removed). */
static int reattach(ds41_pstore *s, ds41_err *err) {
    if (mkdir_p(s->fpdir, err) != 0) return -1;
    char *lockpath = ds41_path_join(s->dir, "lock");
    if (!lockpath) return ds41_errf(err, "%s: out of memory", s->dir);
    int lf = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lf < 0) {
        ds41_errf(err, "%s: cannot open the lock file: %s", lockpath, strerror(errno));
        free(lockpath);
        return -1;
    }
    free(lockpath);
    int df = open(s->fpdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (df < 0) {
        close(lf);
        return ds41_errf(err, "%s: cannot open directory: %s", s->fpdir, strerror(errno));
    }
    if (fsync_path(s->dir) != 0) {
        close(lf);
        close(df);
        return ds41_errf(err, "%s: fsync of the directory failed: %s", s->dir, strerror(errno));
    }
    close(s->lockfd);
    close(s->dirfd);
    s->lockfd = lf;
    s->dirfd = df;
    s->used = 0;
    return 0;
}

/* ---- eviction ----------------------------------------------------------------------------- */

typedef struct lru_entry { long long mtime; long long bytes; char *path; } lru_entry;
typedef struct lru_ctx { lru_entry *v; size_t n, cap; long long total; int oom; } lru_ctx;

static int lru_visit(const walk_item *it, void *ctx) {
    lru_ctx *l = ctx;
    if (is_tmp_name(it->name)) {   /* under the exclusive lock: an orphan */
        unlink(it->path);
        return 0;
    }
    if (l->n == l->cap) {
        size_t nc = l->cap ? 2 * l->cap : 256;
        lru_entry *nv = realloc(l->v, nc * sizeof *nv);
        if (!nv) { l->oom = 1; return 1; }
        l->v = nv;
        l->cap = nc;
    }
    lru_entry *e = &l->v[l->n];
    e->mtime = (long long)it->st.st_mtim.tv_sec * 1000000000LL + it->st.st_mtim.tv_nsec;
    e->bytes = (long long)it->st.st_size;
    if (!(e->path = strdup(it->path))) { l->oom = 1; return 1; }
    l->n++;
    l->total += e->bytes;
    return 0;
}

static int cmp_lru(const void *a, const void *b) {
    const lru_entry *x = a, *y = b;
    if (x->mtime != y->mtime) return x->mtime < y->mtime ? -1 : 1;
    return strcmp(x->path, y->path);
}

/* Under s->mu. Takes the exclusive lock, rescans DIR and removes the least recently used blocks
 * until `need` more bytes fit with cap/16 to spare; s->used becomes the rescanned total. */
static int evict(ds41_pstore *s, long long need, ds41_err *err) {
    if (flock_retry(s->lockfd, LOCK_EX) != 0)
        return ds41_errf(err, "%s/lock: cannot lock: %s", s->dir, strerror(errno));
    lru_ctx l = { 0 };
    int rc = walk_dir(s->dir, NULL, lru_visit, &l, err);
    if (l.oom) rc = ds41_errf(err, "%s: out of memory scanning for eviction", s->dir);
    if (rc == 0) {
        qsort(l.v, l.n, sizeof *l.v, cmp_lru);
        long long target = s->cap - s->cap / 16;
        for (size_t i = 0; i < l.n && l.total + need > target; i++)
            if (unlink(l.v[i].path) == 0 || errno == ENOENT) l.total -= l.v[i].bytes;
        s->used = l.total;
    }
    for (size_t i = 0; i < l.n; i++) free(l.v[i].path);
    free(l.v);
    flock_retry(s->lockfd, LOCK_UN);
    return rc ? -1 : 0;
}

/* ---- put / get -------------------------------------------------------------------------- */

static void block_name(const uint8_t key[16], char out[32 + sizeof BLK_SUFFIX]) {
    ds41_pstore_hex(key, 16, out);
    memcpy(out + 32, BLK_SUFFIX, sizeof BLK_SUFFIX);
}

int ds41_pstore_put(ds41_pstore *s, const uint8_t key[16], const uint8_t parent[16], const int32_t *ids, int n_ids,
                    const void *payload, size_t n, ds41_err *err) {
    if (n_ids < 0 || n_ids > DS41_PSTORE_MAX_IDS || (n_ids && !ids) || (n && !payload))
        return ds41_errf(err, "%s: put: bad arguments (%d token ids)", s->fpdir, n_ids);
    uint64_t file_bytes = HDR + 4 * (uint64_t)n_ids + (uint64_t)n + TRAILER;
    if (file_bytes > (uint64_t)DS41_PSTORE_MAX_FILE)
        return ds41_errf(err, "%s: put: block of %llu bytes is over the limit", s->fpdir, (unsigned long long)file_bytes);
    if (s->cap && (long long)file_bytes > s->cap)
        return ds41_errf(err, "%s: put: block of %llu bytes is larger than the capacity %lld", s->dir,
                         (unsigned long long)file_bytes, s->cap);
    char name[32 + sizeof BLK_SUFFIX];
    block_name(key, name);
    size_t dl = strlen(s->fpdir);
    char *path = malloc(dl + 96), *tmp = malloc(dl + 96);
    uint8_t *head = malloc(HDR + 4 * (size_t)n_ids);
    if (!path || !tmp || !head) {
        free(path); free(tmp); free(head);
        return ds41_errf(err, "%s: put: out of memory", s->fpdir);
    }
    snprintf(path, dl + 96, "%s/%s", s->fpdir, name);
    encode_header(head, s->fp, key, parent, (uint32_t)n_ids, n);
    for (int i = 0; i < n_ids; i++) put_le32(head + HDR + 4 * (size_t)i, (uint32_t)ids[i]);
    uint32_t crc = ds41_crc32c(0, head, HDR + 4 * (size_t)n_ids);
    crc = ds41_crc32c(crc, payload, n);
    uint8_t trailer[4];
    put_le32(trailer, crc);

    int rc = -1, fd = -1, locked = 0, created = 0;
    pthread_mutex_lock(&s->mu);
    struct stat st;
    if (stat(path, &st) == 0) {   /* already stored: left alone */
        rc = 0;
        goto out;
    }
    if (s->cap && s->used + (long long)file_bytes > s->cap && evict(s, (long long)file_bytes, err) != 0) goto out;
    /* Shared lock from creating the temporary file to its rename (or removal): eviction and
     * cleanup, which take the exclusive lock, then know every temporary file is an orphan. */
    if (flock_retry(s->lockfd, LOCK_SH) != 0) {
        ds41_errf(err, "%s/lock: cannot lock: %s", s->dir, strerror(errno));
        goto out;
    }
    locked = 1;
    snprintf(tmp, dl + 96, "%s/" TMP_PREFIX "%.32s.%ld.%lu", s->fpdir, name, (long)getpid(), s->seq++);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno == ENOENT) {
        /* the directory was removed under us (an operator's rm -rf of DIR): recreate it, with a
         * new lock file, so that a long-running server recovers */
        flock_retry(s->lockfd, LOCK_UN);
        locked = 0;
        if (reattach(s, err) != 0) goto out;
        if (flock_retry(s->lockfd, LOCK_SH) != 0) {
            ds41_errf(err, "%s/lock: cannot lock: %s", s->dir, strerror(errno));
            goto out;
        }
        locked = 1;
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    }
    if (fd < 0) {
        ds41_errf(err, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    created = 1;
    if (write_all(fd, head, HDR + 4 * (size_t)n_ids) != 0 || write_all(fd, payload, n) != 0 ||
        write_all(fd, trailer, 4) != 0) {
        ds41_errf(err, "%s: write failed: %s", tmp, strerror(errno));
        goto out;
    }
    stamp_fd(s->fpdir, fd, parent);   /* the LRU age (see stamp_fd) */
    /* 1. the file's bytes reach the disk before its name can point at it */
    if (fsync(fd) != 0) {
        ds41_errf(err, "%s: fsync failed: %s", tmp, strerror(errno));
        goto out;
    }
    int cfd = fd;
    fd = -1;
    if (close(cfd) != 0) {
        ds41_errf(err, "%s: close failed: %s", tmp, strerror(errno));
        goto out;
    }
    /* 2. publication: the name appears atomically, complete */
    if (rename(tmp, path) != 0) {
        ds41_errf(err, "%s: rename to %s failed: %s", tmp, name, strerror(errno));
        goto out;
    }
    created = 0;
    s->used += (long long)file_bytes;
    /* 3. the directory entry itself is durable: only now is the block reported stored */
    if (fsync(s->dirfd) != 0) {
        ds41_errf(err, "%s: fsync of the directory failed: %s", s->fpdir, strerror(errno));
        goto out;
    }
    rc = 0;
out:
    if (fd >= 0) close(fd);
    if (created) unlink(tmp);
    if (locked) flock_retry(s->lockfd, LOCK_UN);
    pthread_mutex_unlock(&s->mu);
    free(path);
    free(tmp);
    free(head);
    return rc;
}

/* Removes a damaged file, unless the name was meanwhile republished (another inode). */
static void remove_if_same(const char *path, int fd) {
    struct stat a, b;
    if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev) unlink(path);
}

int ds41_pstore_get(ds41_pstore *s, const uint8_t key[16], const uint8_t parent[16], const int32_t *ids, int n_ids,
                    void **payload, size_t *n, ds41_err *err) {
    *payload = NULL;
    *n = 0;
    if (n_ids < 0 || (n_ids && !ids)) return ds41_errf(err, "%s: get: bad arguments (%d token ids)", s->fpdir, n_ids);
    char name[32 + sizeof BLK_SUFFIX], path[4096];
    block_name(key, name);
    if (snprintf(path, sizeof path, "%s/%s", s->fpdir, name) >= (int)sizeof path)
        return ds41_errf(err, "%s: path too long", s->fpdir);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOMEM ? ds41_errf(err, "%s: out of memory", path) : 0;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) { close(fd); return 0; }
    uint64_t size = (uint64_t)st.st_size;
    uint64_t want = HDR + 4 * (uint64_t)n_ids + TRAILER;
    if (size < want || size > (uint64_t)DS41_PSTORE_MAX_FILE) {
        /* cannot be this block: damaged when it cannot be any block either */
        uint8_t h[HDR];
        size_t got = 0;
        ds41_pstore_block b;
        if (read_all(fd, h, sizeof h, &got) == 0 &&
            ds41_pstore_parse(h, got < size ? got : (size_t)size, size, &b) == DS41_PSTORE_DAMAGED)
            remove_if_same(path, fd);
        close(fd);
        return 0;
    }
    uint8_t *buf = malloc((size_t)size);
    if (!buf) {
        close(fd);
        return ds41_errf(err, "%s: out of memory reading %llu bytes", path, (unsigned long long)size);
    }
    size_t got = 0;
    if (read_all(fd, buf, (size_t)size, &got) != 0) {   /* an I/O error: a miss, the file left alone */
        free(buf);
        close(fd);
        return 0;
    }
    ds41_pstore_block b;
    int kind = ds41_pstore_parse(buf, got, size, &b);
    if (kind == DS41_PSTORE_OK && got < size) kind = DS41_PSTORE_DAMAGED;   /* shrank while reading */
    if (kind == DS41_PSTORE_OK && (memcmp(b.fingerprint, s->fp, 32) != 0 || memcmp(b.key, key, 16) != 0))
        kind = DS41_PSTORE_DAMAGED;   /* a file under a name that is not its own */
    if (kind != DS41_PSTORE_OK) {
        if (kind == DS41_PSTORE_DAMAGED) remove_if_same(path, fd);
        free(buf);
        close(fd);
        return 0;
    }
    int same = memcmp(b.parent, parent, 16) == 0 && b.n_ids == (uint32_t)n_ids;
    for (int i = 0; same && i < n_ids; i++) same = get_le32(b.ids + 4 * (size_t)i) == (uint32_t)ids[i];
    if (!same) {   /* a valid block of another prefix under this key: not ours, left in place */
        free(buf);
        close(fd);
        return 0;
    }
    stamp_fd(s->fpdir, fd, parent);
    close(fd);
    size_t np = (size_t)b.n_payload;
    memmove(buf, b.payload, np);
    uint8_t *shrunk = realloc(buf, np ? np : 1);
    *payload = shrunk ? shrunk : buf;
    *n = np;
    return 1;
}

/* ---- scan / clear ------------------------------------------------------------------------- */

typedef struct scan_ctx {
    unsigned flags;
    ds41_pstore_visit_fn fn;
    void *ctx;
    ds41_err *err;
} scan_ctx;

static int scan_visit(const walk_item *it, void *ctx) {
    scan_ctx *c = ctx;
    ds41_pstore_info info;
    memset(&info, 0, sizeof info);
    info.path = it->path;
    info.name = it->name;
    info.file_bytes = (uint64_t)it->st.st_size;
    info.mtime_ns = (long long)it->st.st_mtim.tv_sec * 1000000000LL + it->st.st_mtim.tv_nsec;
    ds41_pstore_unhex(it->fpname, info.fingerprint, 32);
    ds41_pstore_block b;
    memset(&b, 0, sizeof b);
    uint8_t *buf = NULL;
    if (is_tmp_name(it->name)) {
        info.kind = DS41_PSTORE_TEMP;
    } else {
        int fd = open(it->path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            if (errno == ENOENT) return 0;   /* evicted meanwhile */
            snprintf(b.why, sizeof b.why, "cannot open: %s", strerror(errno));
            info.kind = DS41_PSTORE_DAMAGED;
        } else {
            size_t want = (c->flags & DS41_PSTORE_SCAN_FULL) ? (size_t)info.file_bytes : HDR;
            if (info.file_bytes > (uint64_t)DS41_PSTORE_MAX_FILE) want = HDR;
            if (want > info.file_bytes) want = (size_t)info.file_bytes;
            buf = malloc(want ? want : 1);
            size_t got = 0;
            if (!buf) {
                close(fd);
                return ds41_errf(c->err, "%s: out of memory", it->path);
            }
            if (read_all(fd, buf, want, &got) != 0) {
                snprintf(b.why, sizeof b.why, "read error: %s", strerror(errno));
                info.kind = DS41_PSTORE_DAMAGED;
            } else {
                info.kind = ds41_pstore_parse(buf, got, info.file_bytes, &b);
                if ((c->flags & DS41_PSTORE_SCAN_FULL) && info.kind == DS41_PSTORE_OK && got < info.file_bytes)
                    info.kind = bad(&b, DS41_PSTORE_DAMAGED, "checksum not checked: the file is over the size limit");
            }
            close(fd);
            char want_name[32 + sizeof BLK_SUFFIX];
            if (info.kind == DS41_PSTORE_OK && memcmp(b.fingerprint, info.fingerprint, 32) != 0)
                info.kind = bad(&b, DS41_PSTORE_DAMAGED, "fingerprint differs from its directory's");
            block_name(b.key, want_name);
            if (info.kind == DS41_PSTORE_OK && strcmp(want_name, it->name) != 0)
                info.kind = bad(&b, DS41_PSTORE_DAMAGED, "key differs from its file name");
        }
        if (info.kind == DS41_PSTORE_OK) {
            memcpy(info.key, b.key, 16);
            memcpy(info.parent, b.parent, 16);
            info.n_ids = b.n_ids;
            info.n_payload = b.n_payload;
        }
    }
    info.why = b.why;
    if ((c->flags & DS41_PSTORE_SCAN_FIX) && info.kind != DS41_PSTORE_OK) info.removed = unlink(it->path) == 0;
    int rc = c->fn ? c->fn(&info, c->ctx) : 0;
    free(buf);
    return rc;
}

static int lock_dir(const char *dir, ds41_err *err) {
    char *lockpath = ds41_path_join(dir, "lock");
    if (!lockpath) return ds41_errf(err, "%s: out of memory", dir);
    int fd = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        ds41_errf(err, "%s: cannot open the lock file: %s", lockpath, strerror(errno));
        free(lockpath);
        return -1;
    }
    if (flock_retry(fd, LOCK_EX) != 0) {
        ds41_errf(err, "%s: cannot lock: %s", lockpath, strerror(errno));
        free(lockpath);
        close(fd);
        return -1;
    }
    free(lockpath);
    return fd;
}

static int check_dir(const char *dir, ds41_err *err) {
    struct stat st;
    if (stat(dir, &st) != 0) return ds41_errf(err, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return ds41_errf(err, "%s: not a directory", dir);
    return 0;
}

int ds41_pstore_scan(const char *dir, const uint8_t *fingerprint, unsigned flags, ds41_pstore_visit_fn fn, void *ctx,
                     ds41_err *err) {
    if (check_dir(dir, err) != 0) return -1;
    if (flags & DS41_PSTORE_SCAN_FIX) flags |= DS41_PSTORE_SCAN_LOCK;
    int lockfd = -1;
    if ((flags & DS41_PSTORE_SCAN_LOCK) && (lockfd = lock_dir(dir, err)) < 0) return -1;
    char fphex[65];
    if (fingerprint) ds41_pstore_hex(fingerprint, 32, fphex);
    scan_ctx c = { flags, fn, ctx, err };
    int rc = walk_dir(dir, fingerprint ? fphex : NULL, scan_visit, &c, err);
    if (lockfd >= 0) close(lockfd);   /* closing releases the lock */
    return rc;
}

typedef struct clear_ctx { long long blocks, bytes; } clear_ctx;
static int clear_visit(const walk_item *it, void *ctx) {
    clear_ctx *c = ctx;
    if (unlink(it->path) == 0 && !is_tmp_name(it->name)) {
        c->blocks++;
        c->bytes += (long long)it->st.st_size;
    }
    return 0;
}

int ds41_pstore_clear(const char *dir, const uint8_t *fingerprint, long long *blocks, long long *bytes, ds41_err *err) {
    if (check_dir(dir, err) != 0) return -1;
    int lockfd = lock_dir(dir, err);
    if (lockfd < 0) return -1;
    char fphex[65];
    if (fingerprint) ds41_pstore_hex(fingerprint, 32, fphex);
    clear_ctx c = { 0, 0 };
    int rc = walk_dir(dir, fingerprint ? fphex : NULL, clear_visit, &c, err);
    close(lockfd);
    if (blocks) *blocks = c.blocks;
    if (bytes) *bytes = c.bytes;
    return rc;
}

/* ---- adopting another store's blocks ------------------------------------------------------ */

typedef struct adopt_ctx {
    ds41_pstore *s;
    long long blocks, bytes, dups;
    ds41_err *err;
} adopt_ctx;

static long long mtime_ns(const struct stat *st) { return (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec; }

/* Under both exclusive locks: moves one file of the source's fingerprint directory into s's,
 * after checking its header (a valid block of this fingerprint whose key is its name); any
 * other file is left where it is. */
static int adopt_visit(const walk_item *it, void *ctx) {
    adopt_ctx *a = ctx;
    if (is_tmp_name(it->name)) return 0;   /* an orphan write: the source's next open removes it */
    uint8_t h[HDR];
    size_t got = 0;
    int fd = open(it->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read_all(fd, h, HDR, &got) != 0 || got != HDR) {
        if (fd >= 0) close(fd);
        return 0;   /* unreadable or shorter than a header: left */
    }
    close(fd);
    ds41_pstore_block b;
    char name[32 + sizeof BLK_SUFFIX];
    if (ds41_pstore_parse(h, HDR, (uint64_t)it->st.st_size, &b) != DS41_PSTORE_OK || memcmp(b.fingerprint, a->s->fp, 32) ||
        (block_name(b.key, name), strcmp(name, it->name))) {
        return 0;   /* damaged, foreign or misplaced: never served from here, not moved */
    }
    char *dst = ds41_path_join(a->s->fpdir, it->name);
    if (!dst) return ds41_errf(a->err, "%s: out of memory", a->s->fpdir);
    struct stat ds;
    if (stat(dst, &ds) == 0) {
        /* the same key is already here (the prompt was held on both ranks): keep this store's
         * copy, with the later of the two LRU ages (its chain's descendants, from either store,
         * stay older than it), and drop the source's */
        if (mtime_ns(&it->st) > mtime_ns(&ds)) {
            struct timespec t[2] = { it->st.st_mtim, it->st.st_mtim };
            (void)utimensat(AT_FDCWD, dst, t, 0);
        }
        if (unlink(it->path) == 0) a->dups++;
        free(dst);
        return 0;
    }
    if (rename(it->path, dst) != 0) {
        int e = errno;
        ds41_errf(a->err, "cannot move %s to %s: %s", it->path, dst, strerror(e));
        free(dst);
        return -1;
    }
    free(dst);
    a->blocks++;
    a->bytes += (long long)it->st.st_size;
    return 0;
}

int ds41_pstore_adopt(ds41_pstore *s, const char *src_dir, long long *blocks, long long *bytes, long long *dups,
                      ds41_err *err) {
    if (blocks) *blocks = 0;
    if (bytes) *bytes = 0;
    if (dups) *dups = 0;
    if (check_dir(src_dir, err) != 0) return -1;
    struct stat a, b;
    if (stat(src_dir, &a) != 0 || stat(s->dir, &b) != 0)
        return ds41_errf(err, "%s: %s", src_dir, strerror(errno));
    if (a.st_dev == b.st_dev && a.st_ino == b.st_ino) return ds41_errf(err, "%s: the store itself", src_dir);
    int srclock = lock_dir(src_dir, err);
    if (srclock < 0) return -1;
    pthread_mutex_lock(&s->mu);
    if (flock_retry(s->lockfd, LOCK_EX) != 0) {
        ds41_errf(err, "%s/lock: cannot lock: %s", s->dir, strerror(errno));
        pthread_mutex_unlock(&s->mu);
        close(srclock);
        return -1;
    }
    char fphex[65];
    ds41_pstore_hex(s->fp, 32, fphex);
    adopt_ctx c = { s, 0, 0, 0, err };
    int rc = walk_dir(src_dir, fphex, adopt_visit, &c, err);
    if (c.blocks && fsync(s->dirfd) != 0 && rc == 0)
        rc = ds41_errf(err, "%s: fsync of the directory failed: %s", s->fpdir, strerror(errno));
    if (c.blocks || c.dups) {
        char *srcfp = ds41_path_join(src_dir, fphex);
        if (srcfp) (void)fsync_path(srcfp);
        free(srcfp);
    }
    s->used += c.bytes;
    flock_retry(s->lockfd, LOCK_UN);
    close(srclock);
    /* past the capacity: evict now (oldest first, any store's blocks alike) */
    if (rc == 0 && s->cap && s->used > s->cap) rc = evict(s, 0, err);
    pthread_mutex_unlock(&s->mu);
    if (blocks) *blocks = c.blocks;
    if (bytes) *bytes = c.bytes;
    if (dups) *dups = c.dups;
    return rc ? -1 : 0;
}
