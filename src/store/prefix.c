/* ds41 prefix cache (include/ds41.h "Prefix cache"; restore.h for what a block holds and how a
 * hit is replayed; pstore.h for the files on disk).
 *
 * Blocks form a tree: block b of a prompt is a node whose parent is block b - 1 of the same
 * prompt. A node's key is hash128(parent key, the block's 128 ids) with the model fingerprint
 * as the root key; a lookup walks the prompt's blocks, finds each key in a hash table and
 * accepts a node only when its ids equal the prompt's and its parent is the node accepted for
 * the previous block, so a hash collision can never serve another prompt's state (on disk the
 * stored parent key and ids are compared the same way).
 *
 * A node holds one reference to the page of its positions in every KV source's store; a
 * session restored from it holds its own references to the same pages (no copy), and one that
 * publishes its blocks gives the cache references to its pages. Pages with several references
 * are never written (cache.c copies on write). Past mem_bytes, least recently used leaves go.
 *
 * Locking: one mutex over the table, the LRU list and the statistics; the replay forward runs
 * outside it, holding references to the pages it restores. Disk writes are off the caller's
 * path: publish queues new blocks (holding references to their pages) for a writer thread,
 * whose put makes each durable (an fsync'd file: pstore.h); ds41_prefix_flush waits for the
 * queue, close flushes. A full queue (WQ_MAX blocks) makes publish write synchronously. */
#include "ds41.h"

#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist_pipe.h"
#include "forward.h"
#include "pstore.h"
#include "restore.h"
#include "sha256.h"

#define BT DS41_PAGE_TOKENS
#define WQ_MAX 4096

typedef struct wjob {
    uint8_t key[16], parent[16];
    int32_t ids[BT];
    int has_img;
    uint8_t img[32];
    uint8_t **pages;           /* one reference each */
    struct wjob *next;
} wjob;

typedef struct pnode {
    uint8_t key[16];
    struct pnode *parent;      /* NULL for block 0; a node keeps its parent alive (n_children) */
    int32_t ids[BT];
    int has_img;               /* the block holds image positions: img is their digest (block_img) */
    uint8_t img[32];
    int depth;                 /* block index */
    int n_children;
    uint8_t **pages;           /* [n_stores], one reference each */
    struct pnode *hnext;       /* hash chain */
    struct pnode *prev, *next; /* LRU list: head = most recent */
} pnode;

struct ds41_prefix_cache {
    ds41_engine *e;
    ds41_prefix_params p;
    char *dir;
    uint8_t fp[32];
    ds41_pstore *disk;
    int n_stores;
    size_t *page_bytes;        /* per store */
    long long node_bytes;
    long long disk_bytes;      /* a block's payload on disk: the pages of the stores held here (all but
                                * under --split layers, where a stage's store keeps its layers' part) */
    pthread_mutex_t mu;
    pnode **table;
    size_t table_size;
    pnode *head, *tail;
    ds41_prefix_stats st;
    /* the disk writer: a queue of blocks to put, its own mutex */
    pthread_mutex_t wmu;
    pthread_cond_t wcv, widle;
    wjob *wq_head, *wq_tail;
    int wq_len, w_busy, w_stop, w_started;
    pthread_t writer;
};

/* ---------------------------------------------------------------------- hashing */

static uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t fmix64(uint64_t k) {
    k ^= k >> 33; k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33; k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

typedef struct h128 { uint64_t a, b; uint64_t len; } h128;

static void h128_init(h128 *h, uint64_t seed) { h->a = 0x9e3779b97f4a7c15ULL ^ seed; h->b = 0x6a09e667f3bcc909ULL + seed; h->len = 0; }

static void h128_word(h128 *h, uint64_t w) {
    h->a = rotl64(h->a ^ (w * 0x87c37b91114253d5ULL), 31) * 0x4cf5ad432745937fULL + h->b;
    h->b = rotl64(h->b ^ (w * 0x4cf5ad432745937fULL), 33) * 0x87c37b91114253d5ULL + h->a;
}

static void h128_bytes(h128 *h, const void *p, size_t n) {
    const uint8_t *c = p;
    h->len += n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, c, 8);
        h128_word(h, w);
        c += 8;
        n -= 8;
    }
    if (n) {
        uint64_t w = 0;
        memcpy(&w, c, n);
        h128_word(h, w ^ ((uint64_t)n << 56));
    }
}

static void h128_final(h128 *h, uint8_t out[16]) {
    uint64_t a = fmix64(h->a ^ h->len), b = fmix64(h->b + a);
    a = fmix64(a + b);
    memcpy(out, &a, 8);
    memcpy(out + 8, &b, 8);
}

/* key of a block: its parent's key (the fingerprint's first 16 bytes for block 0), its ids and,
 * for a block with image positions, their digest (img; NULL for a text block, whose key is
 * what it always was) */
static void block_key(const uint8_t parent[16], const int32_t *ids, const uint8_t *img, uint8_t out[16]) {
    h128 h;
    h128_init(&h, 0x64733431626c6bULL);
    h128_bytes(&h, parent, 16);
    h128_bytes(&h, ids, BT * sizeof(int32_t));
    if (img) h128_bytes(&h, img, 32);
    h128_final(&h, out);
}

/* The image digest of block b of a prompt: SHA-256 over the offset in the block and the content
 * key of each of its image positions. 0 (dig untouched) when the block has none. Every image
 * position carries the same token id, so this is what tells two pictures apart; a strong hash,
 * because a collision would serve one image's state to another. */
static int block_img(const ds41_prefix_img *im, long long b, uint8_t dig[32]) {
    static const char tag[] = "ds41 prefix image block v1";
    if (!im || !im->is_image || !im->key) return 0;
    size_t lo = (size_t)b * BT, hi = lo + BT < im->n ? lo + BT : im->n;
    int any = 0;
    ds41_sha256 c;
    for (size_t i = lo; i < hi; i++) {
        if (!im->is_image[i]) continue;
        if (!any) { ds41_sha256_init(&c); ds41_sha256_update(&c, tag, sizeof tag); any = 1; }
        uint8_t off[4] = { (uint8_t)(i - lo), (uint8_t)((i - lo) >> 8), 0, 0 };
        ds41_sha256_update(&c, off, 4);
        ds41_sha256_update(&c, im->key + i * 32, 32);
    }
    if (any) ds41_sha256_final(&c, dig);
    return any;
}

/* Model fingerprint: what changes the KV records a prompt produces. config.json's bytes, the
 * tensor table (names, dtypes, shapes, sizes) and 64 bytes at the start and the end of up to
 * 4096 tensors spread over the sorted table (a different checkpoint of the same shapes differs
 * there; the bytes of a 500 GB checkpoint are not all read), the kernels (exact / fast) and
 * the index-K reading. Guards against accidents, not against a crafted checkpoint. */
static int fingerprint(const ds41_engine *e, int index_k, uint8_t fp[32], ds41_err *err) {
    h128 h[2];
    h128_init(&h[0], 1);
    h128_init(&h[1], 2);
    const char *tag = "ds41 prefix cache v1";
    int exact = e->ctx.exact;
    for (int k = 0; k < 2; k++) {
        h128_bytes(&h[k], tag, strlen(tag));
        h128_bytes(&h[k], &exact, sizeof exact);
        h128_bytes(&h[k], &index_k, sizeof index_k);
    }
    char *path = ds41_path_join(e->model->dir, "config.json");
    if (!path) return ds41_errf(err, "out of memory");
    char *buf = NULL;
    size_t len = 0;
    int rc = ds41_read_file(path, 64u << 20, &buf, &len, err);
    free(path);
    if (rc) return -1;
    for (int k = 0; k < 2; k++) h128_bytes(&h[k], buf, len);
    free(buf);
    const ds41_st *st = e->model->st;
    size_t n = st ? ds41_st_count(st) : 0, step = n > 4096 ? n / 4096 : 1;
    for (size_t i = 0; i < n; i++) {
        const ds41_tensor *t = ds41_st_at(st, i);
        for (int k = 0; k < 2; k++) {
            h128_bytes(&h[k], t->name, strlen(t->name) + 1);
            h128_bytes(&h[k], &t->dtype, sizeof t->dtype);
            h128_bytes(&h[k], t->shape, (size_t)t->ndim * sizeof t->shape[0]);
            h128_bytes(&h[k], &t->nbytes, sizeof t->nbytes);
        }
        if (i % step == 0 && t->nbytes > 0) {
            size_t m = t->nbytes < 64 ? (size_t)t->nbytes : 64;
            for (int k = 0; k < 2; k++) {
                h128_bytes(&h[k], t->data, m);
                h128_bytes(&h[k], (const uint8_t *)t->data + t->nbytes - m, m);
            }
        }
    }
    if (e->pipe) {
        /* --split layers: a stage's blocks hold its layers' pages only, so its layers, the
         * job's stage count and --layer-map key them (every rank's fingerprint changes with
         * the cuts: a store written under other cuts or another -n is never read, its blocks
         * lacking or mislabelling pages) */
        int32_t cut[3] = { ds41_pipe_stages(e->pipe), -1, -1 };
        for (int l = 0; l < e->cfg->n_layers; l++)
            if (ds41_pipe_holds(e->pipe, l)) { if (cut[1] < 0) cut[1] = l; cut[2] = l; }
        const char *stag = "stage", *map = ds41_pipe_layer_map();
        for (int k = 0; k < 2; k++) {
            h128_bytes(&h[k], stag, strlen(stag));
            h128_bytes(&h[k], cut, sizeof cut);
            if (map) h128_bytes(&h[k], map, strlen(map) + 1);
        }
    }
    h128_final(&h[0], fp);
    h128_final(&h[1], fp + 16);
    return 0;
}

static void *writer_main(void *arg);

/* ---------------------------------------------------------------------- table and LRU */

static size_t slot_of(const ds41_prefix_cache *pc, const uint8_t key[16]) {
    uint64_t v;
    memcpy(&v, key, 8);
    return (size_t)(v % pc->table_size);
}

static pnode *find(ds41_prefix_cache *pc, const uint8_t key[16], const pnode *parent, const int32_t *ids,
                   const uint8_t *img) {
    for (pnode *n = pc->table[slot_of(pc, key)]; n; n = n->hnext)
        if (!memcmp(n->key, key, 16) && n->parent == parent && !memcmp(n->ids, ids, BT * sizeof(int32_t)) &&
            n->has_img == (img != NULL) && (!img || !memcmp(n->img, img, 32)))
            return n;
    return NULL;
}

static void lru_unlink(ds41_prefix_cache *pc, pnode *n) {
    if (n->prev) n->prev->next = n->next; else pc->head = n->next;
    if (n->next) n->next->prev = n->prev; else pc->tail = n->prev;
    n->prev = n->next = NULL;
}

static void lru_front(ds41_prefix_cache *pc, pnode *n) {
    if (pc->head == n) return;
    if (n->prev || n->next || pc->tail == n) lru_unlink(pc, n);
    n->next = pc->head;
    if (pc->head) pc->head->prev = n;
    pc->head = n;
    if (!pc->tail) pc->tail = n;
}

static void node_free(ds41_prefix_cache *pc, pnode *n) {
    if (n->pages)
        for (int i = 0; i < pc->n_stores; i++) ds41_page_unref(n->pages[i]);
    free(n->pages);
    free(n);
}

static void drop(ds41_prefix_cache *pc, pnode *n) {
    pnode **pp = &pc->table[slot_of(pc, n->key)];
    while (*pp != n) pp = &(*pp)->hnext;
    *pp = n->hnext;
    lru_unlink(pc, n);
    if (n->parent) n->parent->n_children--;
    pc->st.blocks--;
    pc->st.bytes -= pc->node_bytes;
    node_free(pc, n);
}

/* least recently used leaves first, until `need` more bytes fit under cap */
static void evict_to(ds41_prefix_cache *pc, long long need, long long cap) {
    while (pc->st.bytes + need > cap) {
        pnode *v = pc->tail;
        while (v && v->n_children) v = v->prev;
        if (!v) return;
        drop(pc, v);
    }
}

static pnode *insert(ds41_prefix_cache *pc, const uint8_t key[16], pnode *parent, const int32_t *ids,
                     const uint8_t *img, int depth, uint8_t **pages) {
    if (pc->node_bytes > pc->p.mem_bytes) return NULL;
    if (parent) parent->n_children++;   /* not a leaf while room is made */
    evict_to(pc, pc->node_bytes, pc->p.mem_bytes);
    pnode *n = calloc(1, sizeof *n);
    if (!n) { if (parent) parent->n_children--; return NULL; }
    n->pages = pages;
    memcpy(n->key, key, 16);
    memcpy(n->ids, ids, sizeof n->ids);
    if (img) { n->has_img = 1; memcpy(n->img, img, 32); }
    n->parent = parent;
    n->depth = depth;
    size_t s = slot_of(pc, key);
    n->hnext = pc->table[s];
    pc->table[s] = n;
    lru_front(pc, n);
    pc->st.blocks++;
    pc->st.bytes += pc->node_bytes;
    return n;
}

/* ---------------------------------------------------------------------- open / close */

/* --split layers: says so when the stage's store holds blocks of other fingerprints (another
 * checkpoint, kernel mode or index-K reading, or, what a restarted job meets, other cuts or
 * another rank count), which are never read */
static void note_foreign(const ds41_prefix_cache *pc) {
    char mine[65];
    ds41_prefix_fingerprint_hex(pc, mine);
    DIR *d = opendir(pc->dir);
    if (!d) return;
    int n = 0;
    for (struct dirent *de; (de = readdir(d));) {
        uint8_t fp[32];
        if (strlen(de->d_name) == 64 && !ds41_pstore_unhex(de->d_name, fp, 32) && strcmp(de->d_name, mine)) n++;
    }
    closedir(d);
    if (n)
        fprintf(stderr, "ds41: prefix cache: %s holds the blocks of %d other fingerprint%s (another checkpoint, kernel mode "
                "or index-K reading, or, under --split layers, other stage cuts or another number of ranks): not read\n",
                pc->dir, n, n > 1 ? "s" : "");
}

ds41_prefix_cache *ds41_prefix_open(ds41_engine *e, const ds41_prefix_params *p, char *errbuf, size_t errcap) {
    ds41_err err;
    ds41_prefix_cache *pc = calloc(1, sizeof *pc);
    if (!pc) { if (errbuf && errcap) snprintf(errbuf, errcap, "out of memory"); return NULL; }
    pc->e = e;
    if (p) pc->p = *p;
    if (pc->p.mem_bytes <= 0) pc->p.mem_bytes = 1LL << 30;
    pc->p.dir = NULL;
    pthread_mutex_init(&pc->mu, NULL);
    pthread_mutex_init(&pc->wmu, NULL);
    pthread_cond_init(&pc->wcv, NULL);
    pthread_cond_init(&pc->widle, NULL);
    const ds41_config *cfg = e->cfg;
    if (!ds41_restore_supported(cfg)) {
        ds41_errf(&err, "prefix cache: a KV source's compress ratio does not divide the %d-token block", BT);
        goto fail;
    }
    if (pc->p.replay != DS41_REPLAY_EXACT && pc->p.replay != DS41_REPLAY_APPROX) {
        ds41_errf(&err, "prefix cache: replay mode %d", pc->p.replay);
        goto fail;
    }
    pc->n_stores = cfg->n_kv_sources;
    pc->page_bytes = calloc((size_t)pc->n_stores + 1, sizeof(size_t));
    pc->table_size = 4099;
    pc->table = calloc(pc->table_size, sizeof *pc->table);
    if (!pc->page_bytes || !pc->table) { ds41_errf(&err, "out of memory"); goto fail; }
    for (int i = 0; i < pc->n_stores; i++) {
        pc->page_bytes[i] = ds41_cache_page_bytes(cfg, i);
        if (!pc->page_bytes[i]) { ds41_errf(&err, "config: KV source %d has no page layout", i); goto fail; }
        pc->node_bytes += (long long)pc->page_bytes[i];
        if (ds41_store_here(e, i)) pc->disk_bytes += (long long)pc->page_bytes[i];
    }
    if (fingerprint(e, pc->p.index_k, pc->fp, &err)) goto fail;
    if (p && p->dir) {
        pc->dir = strdup(p->dir);
        if (!pc->dir) { ds41_errf(&err, "out of memory"); goto fail; }
        pc->p.dir = pc->dir;
        pc->disk = ds41_pstore_open(pc->dir, pc->fp, pc->p.disk_bytes, &err);
        if (!pc->disk) goto fail;
        if (e->pipe) note_foreign(pc);
        pc->w_started = pthread_create(&pc->writer, NULL, writer_main, pc) == 0;   /* else synchronous */
    }
    return pc;
fail:
    if (errbuf && errcap) snprintf(errbuf, errcap, "%s", err.msg);
    ds41_prefix_close(pc);
    return NULL;
}

void ds41_prefix_close(ds41_prefix_cache *pc) {
    if (!pc) return;
    if (pc->w_started) {
        ds41_prefix_flush(pc);
        pthread_mutex_lock(&pc->wmu);
        pc->w_stop = 1;
        pthread_cond_broadcast(&pc->wcv);
        pthread_mutex_unlock(&pc->wmu);
        pthread_join(pc->writer, NULL);
    }
    if (pc->table)
        for (size_t s = 0; s < pc->table_size; s++)
            for (pnode *n = pc->table[s], *nx; n; n = nx) { nx = n->hnext; node_free(pc, n); }
    free(pc->table);
    if (pc->disk) ds41_pstore_close(pc->disk);
    free(pc->dir);
    free(pc->page_bytes);
    pthread_mutex_destroy(&pc->mu);
    pthread_mutex_destroy(&pc->wmu);
    pthread_cond_destroy(&pc->wcv);
    pthread_cond_destroy(&pc->widle);
    free(pc);
}

void ds41_prefix_get_stats(ds41_prefix_cache *pc, ds41_prefix_stats *out) {
    pthread_mutex_lock(&pc->mu);
    *out = pc->st;
    pthread_mutex_unlock(&pc->mu);
}

long long ds41_prefix_trim(ds41_prefix_cache *pc, long long max_bytes) {
    pthread_mutex_lock(&pc->mu);
    evict_to(pc, 0, max_bytes < 0 ? 0 : max_bytes);
    long long b = pc->st.bytes;
    pthread_mutex_unlock(&pc->mu);
    return b;
}

int ds41_prefix_adopt(ds41_prefix_cache *pc, const char *src_dir, long long *blocks, long long *bytes, long long *dups,
                      char *errbuf, size_t errcap) {
    ds41_err err;
    if (!pc->disk) {
        if (errbuf && errcap) snprintf(errbuf, errcap, "%s: the cache keeps no store to move its blocks into", src_dir);
        return -1;
    }
    if (ds41_pstore_adopt(pc->disk, src_dir, blocks, bytes, dups, &err) != 0) {
        if (errbuf && errcap) snprintf(errbuf, errcap, "%s", err.msg);
        return -1;
    }
    return 0;
}

void ds41_prefix_fingerprint_hex(const ds41_prefix_cache *pc, char out[65]) {
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) { out[2 * i] = hx[pc->fp[i] >> 4]; out[2 * i + 1] = hx[pc->fp[i] & 15]; }
    out[64] = 0;
}

double ds41_prefix_bytes_per_token(const ds41_engine *e) {
    long long b = 0;
    for (int i = 0; i < e->cfg->n_kv_sources; i++) b += (long long)ds41_cache_page_bytes(e->cfg, i);
    return (double)b / BT;
}

/* ---------------------------------------------------------------------- disk payload */

/* payload = the pages of every store in kv_sources order, then, for a block with image
 * positions, their 32-byte digest (compared here: the file's ids alone cannot tell two images
 * apart) */
static uint8_t **pages_from_payload(ds41_prefix_cache *pc, const uint8_t *payload, size_t n, const uint8_t *img) {
    if ((long long)n != pc->disk_bytes + (img ? 32 : 0)) return NULL;
    if (img && memcmp(payload + pc->disk_bytes, img, 32)) return NULL;
    uint8_t **pages = calloc((size_t)pc->n_stores + 1, sizeof *pages);
    if (!pages) return NULL;
    size_t off = 0;
    for (int i = 0; i < pc->n_stores; i++) {
        if (!ds41_store_here(pc->e, i)) continue;   /* --split layers: another stage's part (NULL) */
        pages[i] = ds41_page_new(pc->page_bytes[i]);
        if (!pages[i]) {
            for (int k = 0; k < i; k++) ds41_page_unref(pages[k]);
            free(pages);
            return NULL;
        }
        memcpy(pages[i], payload + off, pc->page_bytes[i]);
        off += pc->page_bytes[i];
    }
    return pages;
}

static int put_disk(ds41_prefix_cache *pc, const uint8_t key[16], const uint8_t parent[16], const int32_t *ids,
                    const uint8_t *img, uint8_t *const *pages);
static long long insert_chain(ds41_prefix_cache *pc, const int32_t *ids, size_t n, const ds41_prefix_img *im,
                              long long first, long long nb, uint8_t *const *pages);

static void *writer_main(void *arg) {
    ds41_prefix_cache *pc = arg;
    pthread_mutex_lock(&pc->wmu);
    for (;;) {
        while (!pc->wq_head && !pc->w_stop) pthread_cond_wait(&pc->wcv, &pc->wmu);
        if (!pc->wq_head) break;
        wjob *j = pc->wq_head;
        pc->wq_head = j->next;
        if (!pc->wq_head) pc->wq_tail = NULL;
        pc->wq_len--;
        pc->w_busy = 1;
        pthread_mutex_unlock(&pc->wmu);
        put_disk(pc, j->key, j->parent, j->ids, j->has_img ? j->img : NULL, j->pages);
        for (int i = 0; i < pc->n_stores; i++) ds41_page_unref(j->pages[i]);
        free(j->pages);
        free(j);
        pthread_mutex_lock(&pc->wmu);
        pc->w_busy = 0;
        if (!pc->wq_head) pthread_cond_broadcast(&pc->widle);
    }
    pthread_mutex_unlock(&pc->wmu);
    return NULL;
}

/* queues a block for the writer (references taken); 0, or -1 when it must be written now */
static int enqueue(ds41_prefix_cache *pc, const uint8_t key[16], const uint8_t parent[16], const int32_t *ids,
                   const uint8_t *img, uint8_t *const *pages) {
    if (!pc->w_started) return -1;
    wjob *j = calloc(1, sizeof *j);
    uint8_t **pg = calloc((size_t)pc->n_stores + 1, sizeof *pg);
    if (!j || !pg) { free(j); free(pg); return -1; }
    memcpy(j->key, key, 16);
    memcpy(j->parent, parent, 16);
    memcpy(j->ids, ids, sizeof j->ids);
    if (img) { j->has_img = 1; memcpy(j->img, img, 32); }
    for (int i = 0; i < pc->n_stores; i++) { pg[i] = pages[i]; ds41_page_ref(pg[i]); }
    j->pages = pg;
    pthread_mutex_lock(&pc->wmu);
    if (pc->wq_len >= WQ_MAX) {
        pthread_mutex_unlock(&pc->wmu);
        for (int i = 0; i < pc->n_stores; i++) ds41_page_unref(pg[i]);
        free(pg);
        free(j);
        return -1;
    }
    if (pc->wq_tail) pc->wq_tail->next = j; else pc->wq_head = j;
    pc->wq_tail = j;
    pc->wq_len++;
    pthread_cond_signal(&pc->wcv);
    pthread_mutex_unlock(&pc->wmu);
    return 0;
}

void ds41_prefix_flush(ds41_prefix_cache *pc) {
    if (!pc || !pc->w_started) return;
    pthread_mutex_lock(&pc->wmu);
    while (pc->wq_head || pc->w_busy) pthread_cond_wait(&pc->widle, &pc->wmu);
    pthread_mutex_unlock(&pc->wmu);
}

static int put_disk(ds41_prefix_cache *pc, const uint8_t key[16], const uint8_t parent[16], const int32_t *ids,
                    const uint8_t *img, uint8_t *const *pages) {
    uint8_t *payload = malloc((size_t)pc->disk_bytes + 32);
    if (!payload) return -1;
    size_t off = 0;
    for (int i = 0; i < pc->n_stores; i++) {
        if (!ds41_store_here(pc->e, i)) continue;   /* --split layers: this stage's part only */
        memcpy(payload + off, pages[i], pc->page_bytes[i]);
        off += pc->page_bytes[i];
    }
    if (img) { memcpy(payload + off, img, 32); off += 32; }
    ds41_err err;
    int rc = ds41_pstore_put(pc->disk, key, parent, ids, BT, payload, off, &err);
    free(payload);
    if (rc) fprintf(stderr, "ds41: prefix cache: %s (block not stored; serving continues)\n", err.msg);
    pthread_mutex_lock(&pc->mu);
    if (rc) pc->st.disk_errors++;
    else pc->st.disk_writes++;
    pthread_mutex_unlock(&pc->mu);
    return rc;
}

/* ---------------------------------------------------------------------- restore / publish */

/* Adds block b (key, parent key pkey, ids bid) with its pages pg (one reference each, taken
 * over) under prev: queued for the disk writer (or written now when the queue is full), then
 * inserted. NULL when it could not be inserted (the references are dropped). pc->mu held. */
static pnode *add_block(ds41_prefix_cache *pc, const uint8_t key[16], const uint8_t pkey[16], pnode *prev,
                        const int32_t *bid, const uint8_t *img, long long b, uint8_t **pg) {
    static const uint8_t zero[16];
    if (pc->disk && enqueue(pc, key, b ? pkey : zero, bid, img, pg)) {
        pthread_mutex_unlock(&pc->mu);   /* put_disk counts under the mutex */
        put_disk(pc, key, b ? pkey : zero, bid, img, pg);
        pthread_mutex_lock(&pc->mu);
    }
    pnode *node = insert(pc, key, prev, bid, img, (int)b, pg);
    if (!node) { for (int i = 0; i < pc->n_stores; i++) ds41_page_unref(pg[i]); free(pg); }
    return node;
}

/* The longest chain of cached blocks of ids (memory, then disk): pages [nb][n_stores] with one
 * reference each (the caller releases them), or NULL when none or out of memory. */
static uint8_t **collect(ds41_prefix_cache *pc, const int32_t *ids, size_t n, const ds41_prefix_img *im,
                         long long max_pos, long long *nb_out, int query, long long *disk_first, long long cap) {
    long long maxb = (long long)n / BT;
    if (maxb * BT > max_pos) maxb = max_pos / BT;
    if (cap >= 0 && maxb > cap) maxb = cap;
    for (size_t i = 0; i < (size_t)maxb * BT; i++)
        if (ids[i] < 0 || ids[i] >= pc->e->cfg->vocab_size) { maxb = (long long)i / BT; break; }
    pthread_mutex_lock(&pc->mu);
    if (query) pc->st.queries += (long long)n;
    long long first_disk = -1;
    uint8_t **pages = maxb > 0 ? calloc((size_t)maxb * pc->n_stores, sizeof *pages) : NULL;
    long long nb = 0;
    pnode *prev = NULL;
    uint8_t pkey[16];
    memcpy(pkey, pc->fp, 16);
    while (pages && nb < maxb) {
        const int32_t *bid = ids + nb * BT;
        uint8_t key[16], dig[32];
        const uint8_t *img = block_img(im, nb, dig) ? dig : NULL;
        block_key(pkey, bid, img, key);
        pnode *node = find(pc, key, prev, bid, img);
        if (!node && pc->disk) {
            void *payload = NULL;
            size_t len = 0;
            ds41_err err;
            uint8_t zero[16] = { 0 };
            int g = ds41_pstore_get(pc->disk, key, nb ? pkey : zero, bid, BT, &payload, &len, &err);
            uint8_t **pg = g == 1 ? pages_from_payload(pc, payload, len, img) : NULL;
            free(payload);
            if (pg) {
                node = insert(pc, key, prev, bid, img, (int)nb, pg);
                if (!node) { for (int i = 0; i < pc->n_stores; i++) ds41_page_unref(pg[i]); free(pg); }
                else {
                    pc->st.disk_hits++;
                    if (first_disk < 0) first_disk = nb;
                }
            }
        }
        if (!node) break;
        lru_front(pc, node);
        for (int i = 0; i < pc->n_stores; i++) {
            ds41_page_ref(node->pages[i]);
            pages[(size_t)nb * pc->n_stores + i] = node->pages[i];
        }
        memcpy(pkey, key, 16);
        prev = node;
        nb++;
    }
    pthread_mutex_unlock(&pc->mu);
    *nb_out = nb;
    if (disk_first) *disk_first = first_disk < 0 ? nb : first_disk;
    if (!nb) { free(pages); return NULL; }
    return pages;
}

long long ds41_prefix_restore_cap(ds41_prefix_cache *pc, ds41_session *s, const int32_t *ids, size_t n,
                                  const ds41_prefix_img *im, long long max_blocks) {
    ds41_seq *q = ds41_session_seq(s);
    if (q->e != pc->e || q->cache.pos != 0 || ds41_session_index_k(s) != pc->p.index_k) return 0;
    if (im && im->is_image && (!im->key || !im->emb)) return 0;   /* cannot key or replay image rows */
    long long nb = 0;
    uint8_t **pages = collect(pc, ids, n, im, q->cache.max_pos, &nb, 1, NULL, max_blocks);
    long long M = nb * BT, rc = M;
    if (M > 0) {
        int mode = pc->p.replay == DS41_REPLAY_APPROX ? DS41_RESTORE_APPROX : DS41_RESTORE_EXACT;
        ds41_restore_img ri = { im ? im->is_image : NULL, im ? im->emb : NULL, im ? im->n : 0 };
        if (ds41_session_restore(s, ids, M, pages, mode, M == (long long)n, ri.img ? &ri : NULL)) rc = -1;
        pthread_mutex_lock(&pc->mu);
        if (rc > 0) {
            pc->st.hits += M;
            pc->st.replay_rows += ds41_seq_replay_rows(pc->e->cfg, mode, M);
        }
        pthread_mutex_unlock(&pc->mu);
    }
    ds41_prefix_pages_free(pc, pages, nb);
    return rc;
}

long long ds41_prefix_restore_img(ds41_prefix_cache *pc, ds41_session *s, const int32_t *ids, size_t n,
                                  const ds41_prefix_img *im) {
    return ds41_prefix_restore_cap(pc, s, ids, n, im, -1);
}

long long ds41_prefix_held(ds41_prefix_cache *pc, const int32_t *ids, size_t n, const ds41_prefix_img *im) {
    if (im && im->is_image && !im->key) return 0;
    long long maxb = (long long)n / BT;
    if (maxb * BT > pc->e->max_pos) maxb = pc->e->max_pos / BT;
    for (size_t i = 0; i < (size_t)maxb * BT; i++)
        if (ids[i] < 0 || ids[i] >= pc->e->cfg->vocab_size) { maxb = (long long)i / BT; break; }
    long long nb = 0;
    int mem = 1;   /* past the first block missing in memory, none of its descendants is there */
    pnode *prev = NULL;
    uint8_t pkey[16];
    memcpy(pkey, pc->fp, 16);
    pthread_mutex_lock(&pc->mu);
    while (nb < maxb) {
        const int32_t *bid = ids + nb * BT;
        uint8_t key[16], dig[32];
        const uint8_t *img = block_img(im, nb, dig) ? dig : NULL;
        block_key(pkey, bid, img, key);
        pnode *node = mem ? find(pc, key, prev, bid, img) : NULL;
        if (!node) {
            mem = 0;
            if (!pc->disk) break;
            void *payload = NULL;
            size_t len = 0;
            ds41_err err;
            uint8_t zero[16] = { 0 };
            int g = ds41_pstore_get(pc->disk, key, nb ? pkey : zero, bid, BT, &payload, &len, &err);
            /* what collect would accept: the size of this cache's blocks, the image digest */
            int ok = g == 1 && (long long)len == pc->disk_bytes + (img ? 32 : 0) &&
                     (!img || !memcmp((uint8_t *)payload + pc->disk_bytes, img, 32));
            free(payload);
            if (!ok) break;
        }
        prev = node;
        memcpy(pkey, key, 16);
        nb++;
    }
    pthread_mutex_unlock(&pc->mu);
    return nb;
}

long long ds41_prefix_restore(ds41_prefix_cache *pc, ds41_session *s, const int32_t *ids, size_t n) {
    return ds41_prefix_restore_img(pc, s, ids, n, NULL);
}

long long ds41_prefix_pages_img(ds41_prefix_cache *pc, const int32_t *ids, size_t n, const ds41_prefix_img *im,
                                uint8_t ***pages) {
    long long nb = 0;
    *pages = collect(pc, ids, n, im, pc->e->max_pos, &nb, 1, NULL, -1);
    return nb;
}

long long ds41_prefix_pages(ds41_prefix_cache *pc, const int32_t *ids, size_t n, uint8_t ***pages) {
    return ds41_prefix_pages_img(pc, ids, n, NULL, pages);
}

long long ds41_prefix_load(ds41_prefix_cache *pc, const int32_t *ids, size_t n, const ds41_prefix_img *im, long long *first,
                           uint8_t **bytes, size_t *len) {
    long long nb = 0, fd = 0;
    *bytes = NULL;
    *len = 0;
    *first = 0;
    uint8_t **pages = collect(pc, ids, n, im, pc->e->max_pos, &nb, 0, &fd, -1);
    long long k = nb - fd;
    if (k > 0) {
        uint8_t *b = malloc((size_t)k * (size_t)pc->disk_bytes);
        if (!b) { ds41_prefix_pages_free(pc, pages, nb); return -1; }
        size_t off = 0;
        for (long long i = fd; i < nb; i++)
            for (int j = 0; j < pc->n_stores; j++) {
                if (!ds41_store_here(pc->e, j)) continue;
                memcpy(b + off, pages[(size_t)i * pc->n_stores + j], pc->page_bytes[j]);
                off += pc->page_bytes[j];
            }
        *bytes = b;
        *len = off;
        *first = fd;
    }
    ds41_prefix_pages_free(pc, pages, nb);
    return k > 0 ? k : 0;
}

long long ds41_prefix_insert_bytes(ds41_prefix_cache *pc, const int32_t *ids, size_t n, const ds41_prefix_img *im, long long first,
                                   long long nb, const uint8_t *bytes, size_t len) {
    if (nb <= 0 || len != (size_t)nb * (size_t)pc->disk_bytes) return -1;
    uint8_t **pages = calloc((size_t)nb * pc->n_stores, sizeof *pages);
    if (!pages) return -1;
    long long rc = 0;
    for (long long i = 0; i < nb && rc == 0; i++) {
        uint8_t **pg = pages_from_payload(pc, bytes + (size_t)i * (size_t)pc->disk_bytes, (size_t)pc->disk_bytes, NULL);
        if (!pg) { rc = -1; break; }
        memcpy(pages + (size_t)i * pc->n_stores, pg, (size_t)pc->n_stores * sizeof *pg);
        free(pg);
    }
    if (rc == 0) rc = insert_chain(pc, ids, n, im, first, nb, pages);
    for (long long i = 0; i < nb * pc->n_stores; i++)
        if (pages[i]) ds41_page_unref(pages[i]);
    free(pages);
    return rc;
}

void ds41_prefix_pages_free(ds41_prefix_cache *pc, uint8_t **pages, long long nb) {
    if (!pages) return;
    for (long long i = 0; i < nb * pc->n_stores; i++) ds41_page_unref(pages[i]);
    free(pages);
}

const uint8_t *ds41_prefix_fingerprint(const ds41_prefix_cache *pc) { return pc->fp; }

int ds41_prefix_has_store(const ds41_prefix_cache *pc) { return pc && pc->disk != NULL; }

/* ds41_prefix_insert with the prompt's image positions keyed (im NULL: text). */
static long long insert_chain(ds41_prefix_cache *pc, const int32_t *ids, size_t n, const ds41_prefix_img *im,
                              long long first, long long nb, uint8_t *const *pages) {
    if (first < 0 || nb < 0 || (first + nb) * BT > (long long)n) return 0;
    for (size_t i = 0; i < (size_t)(first + nb) * BT; i++)
        if (ids[i] < 0 || ids[i] >= pc->e->cfg->vocab_size) return 0;
    long long added = 0;
    uint8_t pkey[16];
    memcpy(pkey, pc->fp, 16);
    pthread_mutex_lock(&pc->mu);
    pnode *prev = NULL;
    for (long long b = 0; b < first + nb; b++) {
        const int32_t *bid = ids + b * BT;
        uint8_t key[16], dig[32];
        const uint8_t *img = block_img(im, b, dig) ? dig : NULL;
        block_key(pkey, bid, img, key);
        pnode *node = find(pc, key, prev, bid, img);
        if (!node && b < first) break;   /* a parent evicted meanwhile: the chain stops here */
        if (!node) {
            uint8_t **pg = calloc((size_t)pc->n_stores + 1, sizeof *pg);
            if (!pg) break;
            for (int i = 0; i < pc->n_stores; i++) {
                pg[i] = pages[(size_t)(b - first) * pc->n_stores + i];
                ds41_page_ref(pg[i]);
            }
            node = add_block(pc, key, pkey, prev, bid, img, b, pg);
            if (!node) break;
            added++;
        }
        lru_front(pc, node);
        memcpy(pkey, key, 16);
        prev = node;
    }
    pthread_mutex_unlock(&pc->mu);
    return added;
}

long long ds41_prefix_insert(ds41_prefix_cache *pc, const int32_t *ids, size_t n, long long first, long long nb,
                             uint8_t *const *pages) {
    return insert_chain(pc, ids, n, NULL, first, nb, pages);
}

long long ds41_prefix_publish_img(ds41_prefix_cache *pc, ds41_session *s, const int32_t *ids, size_t n,
                                  const ds41_prefix_img *im) {
    ds41_seq *q = ds41_session_seq(s);
    if (q->e != pc->e || ds41_session_index_k(s) != pc->p.index_k) return 0;
    if (im && im->is_image && !im->key) return 0;
    if ((long long)n > q->cache.pos) n = (size_t)q->cache.pos;
    long long nb = (long long)n / BT, ok = 0;
    /* the session's pages of each whole block, as far as every store held here has them */
    uint8_t **pages = nb > 0 ? calloc((size_t)nb * pc->n_stores, sizeof *pages) : NULL;
    if (!pages) return 0;
    for (; ok < nb; ok++) {
        int have = 1;
        for (int i = 0; have && i < pc->n_stores; i++) {
            ds41_kv_store *st = &q->cache.stores[i];
            if (!ds41_store_here(pc->e, i)) continue;   /* --split layers: NULL, its stage keeps it */
            if (ok >= st->n_pages || !st->pages[ok]) have = 0;
            else pages[(size_t)ok * pc->n_stores + i] = st->pages[ok];
        }
        if (!have) break;
    }
    long long added = insert_chain(pc, ids, (size_t)(ok * BT), im, 0, ok, pages);
    free(pages);
    return added;
}

long long ds41_prefix_publish(ds41_prefix_cache *pc, ds41_session *s, const int32_t *ids, size_t n) {
    return ds41_prefix_publish_img(pc, s, ids, n, NULL);
}
