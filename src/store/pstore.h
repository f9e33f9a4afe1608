/* ds41 persistent prefix store: blocks of a prefix cache kept on disk across restarts, one file
 * per block, for ds41 run / ds41 serve --cache-dir. The payload is opaque bytes here.
 *
 * Layout of a cache directory DIR:
 *   DIR/lock                      flock'd: shared by a writer from temp file to rename,
 *                                 exclusive for eviction, cleanup, verify --fix and clear
 *   DIR/<fingerprint, 64 hex>/    one subdirectory per model fingerprint
 *     <key, 32 hex>.blk           a published block (format below, version 1)
 *     .tmp.<key>.<pid>.<seq>      a block being written (an orphan once no writer holds the lock)
 *
 * Block file, version 1 (little-endian):
 *   0    8  magic "DS41PBLK"
 *   8    4  format version (1)
 *   12   4  header bytes (104)
 *   16  32  model fingerprint
 *   48  16  key (the caller's chained hash)
 *   64  16  parent key (all zero for the first block of a prompt)
 *   80   4  number of token ids N
 *   84   4  reserved (0)
 *   88   8  payload bytes P
 *   96   4  reserved (0)
 *   100  4  CRC32C of bytes 0..99 (the header alone, so listing reads 104 bytes per file)
 *   104 4N  token ids (int32)
 *   ...  P  payload
 *   end  4  CRC32C of every byte before it
 * A file is served only when its size is exactly 108 + 4N + P, both checksums match, the magic,
 * version, fingerprint and key are this store's and the parent key and ids equal the caller's.
 *
 * Durability (put): the temporary file is written, fsync'd and closed, renamed over the final
 * name, then the fingerprint directory is fsync'd; put returns 0 only after that last fsync.
 * open fsyncs DIR after creating a fingerprint subdirectory. Readers never see a partial file:
 * a published name only ever points at a complete, fsync'd file.
 *
 * Several processes (and threads) may share a directory: publication is an atomic rename, a
 * reader needs no lock (an evicted file stays readable through its open descriptor), and the
 * lock file orders writers against eviction and cleanup (see above). LRU age is the file's
 * mtime, set on put and on every hit: to the current time for a first block (all-zero parent),
 * and to 1 us before its parent's for a block whose parent is present, so that descendants are
 * always older than their ancestors and eviction (oldest first) takes a prompt's tail before
 * its head: a chain's recency is its head's, and no block is kept without its ancestors
 * because of the order of puts and lookups. */
#ifndef DS41_PSTORE_H
#define DS41_PSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

typedef struct ds41_pstore ds41_pstore;
#define DS41_PSTORE_KEY 16
#define DS41_PSTORE_VERSION 1
#define DS41_PSTORE_HEADER 104
/* limits a put accepts (and a reader believes) */
#define DS41_PSTORE_MAX_IDS (1 << 20)
#define DS41_PSTORE_MAX_FILE (1LL << 32)

/* dir is created if missing. fingerprint: 32 bytes identifying the model (the lead computes
 * it); blocks of other fingerprints in the same dir are never served to this one (keep them
 * apart, e.g. a subdirectory per fingerprint). cap_bytes: capacity for this dir (0 = unlimited);
 * when a put would exceed it, least-recently-used blocks are evicted first.
 * Capacity counts file bytes of every fingerprint in DIR. Each process keeps a running total
 * (a scan at open plus its own puts); when a put would pass the cap it takes the exclusive
 * lock, rescans DIR and evicts the least recently used blocks (any fingerprint) until the new
 * block fits with cap/16 to spare, so a full store rescans once per cap/16 bytes written.
 * With several writers DIR can exceed the cap by what the others wrote since the last scan.
 * open also removes orphaned temporary files when no writer holds the lock. */
ds41_pstore *ds41_pstore_open(const char *dir, const uint8_t fingerprint[32], long long cap_bytes, ds41_err *err);
void ds41_pstore_close(ds41_pstore *s);
/* Stores block `key` (a 128-bit chained hash computed by the caller) with its parent key (all
 * zero for the first block), its token ids and the payload. Atomic: temp file, write, fsync,
 * rename, fsync of the directory; returns 0 only once the block is durable. An existing block
 * with the same key is left alone (return 0). -1 with a message naming the path and errno text on
 * any failure (disk full, I/O error): then nothing partial is visible and the store stays usable.
 * (When only the final directory fsync fails, the complete block may stay visible: it is valid.)
 * A block larger than the capacity is refused (-1). If DIR or the fingerprint directory was
 * removed meanwhile, put recreates them (and the lock file). Thread-safe (puts serialize). */
int ds41_pstore_put(ds41_pstore *s, const uint8_t key[16], const uint8_t parent[16], const int32_t *ids, int n_ids,
                    const void *payload, size_t n, ds41_err *err);
/* 1: hit, *payload = malloc'd copy (caller frees), *n its size; the stored parent key and ids
 * were compared with the given ones and are equal, the checksum verified. 0: miss, including a
 * damaged, truncated, foreign-version or mismatching file (which is then removed or ignored,
 * never served). -1: an error that is not a miss (out of memory). A hit refreshes the block's
 * LRU age. Damaged and truncated files are removed; foreign-version files and valid blocks whose
 * parent or ids differ (a hash collision) are left in place. Thread-safe. */
int ds41_pstore_get(ds41_pstore *s, const uint8_t key[16], const uint8_t parent[16], const int32_t *ids, int n_ids,
                    void **payload, size_t *n, ds41_err *err);
/* Moves the blocks of this store's fingerprint out of another store directory src_dir into this
 * one (serve --dp-attention restarted with fewer ranks: the store of a rank past the new count
 * goes to a rank that is still there). Both directories' locks are held exclusively throughout,
 * so call it before any put of this process. Each file's header is checked (a valid block of
 * this fingerprint whose key is its name, the size the header gives): such a block is renamed
 * into this store (mtime, the LRU age, kept); a key already here keeps this store's file, with
 * the later of the two ages, and the source's copy is removed (*dups); damaged, foreign or
 * temporary files and other fingerprints stay in src_dir. The running total grows by the bytes
 * moved, and past the capacity the least recently used blocks are evicted. *blocks, *bytes:
 * what moved. -1 with a message (src_dir missing or this store itself, a lock, a rename that
 * failed, e.g. across file systems: what moved before it stays moved, the rest stays). */
int ds41_pstore_adopt(ds41_pstore *s, const char *src_dir, long long *blocks, long long *bytes, long long *dups,
                      ds41_err *err);
/* The fingerprint subdirectory of this store (DIR/<64 hex>). */
const char *ds41_pstore_path(const ds41_pstore *s);
/* This process's running total of DIR's block bytes (see capacity above; without a capacity,
 * open counts only this fingerprint's blocks, and not at all while a writer holds the lock). */
long long ds41_pstore_used(const ds41_pstore *s);

/* ---- Parsing a block file image (the reader's checks; also what fuzz/fuzz_pstore.c drives) ---- */
enum {
    DS41_PSTORE_OK = 0,
    DS41_PSTORE_DAMAGED = 1,   /* bad magic, checksum, size, header field, misplaced file */
    DS41_PSTORE_FOREIGN = 2,   /* a well-formed magic with another format version */
    DS41_PSTORE_TEMP = 3,      /* a temporary file (a write in flight, or an orphan) */
};
typedef struct ds41_pstore_block {
    uint32_t version;
    uint8_t fingerprint[32], key[16], parent[16];
    uint32_t n_ids;
    const uint8_t *ids;        /* n_ids little-endian int32, inside the image (NULL when header only) */
    const uint8_t *payload;    /* inside the image (NULL when header only) */
    uint64_t n_payload;
    uint64_t file_bytes;
    char why[96];              /* what was wrong, when not DS41_PSTORE_OK */
} ds41_pstore_block;
/* data: the first avail bytes of a file of file_bytes bytes. With avail == file_bytes the whole
 * file is checked (both checksums, ids and payload set); with avail < file_bytes only the header
 * (at least DS41_PSTORE_HEADER bytes needed) and the size. Returns DS41_PSTORE_OK, _DAMAGED or
 * _FOREIGN (b->why set). */
int ds41_pstore_parse(const uint8_t *data, size_t avail, uint64_t file_bytes, ds41_pstore_block *b);

/* ---- Looking inside a directory (ds41 cache) ---- */
typedef struct ds41_pstore_info {
    const char *path;          /* the file */
    const char *name;          /* its name inside the fingerprint directory */
    int kind;                  /* DS41_PSTORE_OK / _DAMAGED / _FOREIGN / _TEMP */
    const char *why;           /* what was wrong (kind _DAMAGED / _FOREIGN) */
    int removed;               /* DS41_PSTORE_SCAN_FIX removed it */
    uint8_t fingerprint[32];   /* from the directory name */
    uint8_t key[16], parent[16];   /* kind _OK */
    uint32_t n_ids;            /* kind _OK */
    uint64_t n_payload;        /* kind _OK */
    uint64_t file_bytes;
    long long mtime_ns;        /* last put or hit */
} ds41_pstore_info;
typedef int (*ds41_pstore_visit_fn)(const ds41_pstore_info *info, void *ctx);
enum {
    DS41_PSTORE_SCAN_FULL = 1, /* read whole files: both checksums (else the header and the size) */
    DS41_PSTORE_SCAN_LOCK = 2, /* hold the exclusive lock: temporary files seen are orphans */
    DS41_PSTORE_SCAN_FIX = 4,  /* remove damaged, foreign and temporary files (implies _LOCK) */
};
/* Visits every file of every fingerprint subdirectory of dir (sorted by fingerprint, then
 * name); fingerprint != NULL limits it to that one. fn returning non-zero stops the scan and
 * is returned. -1 with a message when dir cannot be read. */
int ds41_pstore_scan(const char *dir, const uint8_t *fingerprint, unsigned flags, ds41_pstore_visit_fn fn, void *ctx,
                     ds41_err *err);
/* Removes every block and temporary file (of one fingerprint when fingerprint != NULL) under
 * the exclusive lock; counts what it removed. */
int ds41_pstore_clear(const char *dir, const uint8_t *fingerprint, long long *blocks, long long *bytes, ds41_err *err);

/* hex helpers: out gets 2n lowercase digits and a NUL; parse returns 0 when s is exactly 2n digits */
void ds41_pstore_hex(const uint8_t *v, size_t n, char *out);
int ds41_pstore_unhex(const char *s, uint8_t *v, size_t n);

#endif
