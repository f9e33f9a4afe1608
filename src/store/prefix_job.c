/* ds41 prefix cache in an MPI job (include/ds41.h ds41_prefix_restore_job, ds41_prefix_job_dir;
 * docs/prefix-cache.md and docs/distributed.md).
 *
 * Attention replicated (the expert split): every rank holds the sequence's whole KV, so every
 * rank's memory cache must hold the blocks a restore attaches. One store, on rank 0: rank 0
 * reads the blocks of the chain that are on disk only (ds41_prefix_load), broadcasts them, and
 * every other rank adds them to its memory cache (ds41_prefix_insert_bytes); then every rank
 * restores the same chain from memory. serve does the same with the BLOCKS record of its mirror
 * (src/serve/serve_mpi.c), which orders the blocks with its other records.
 *
 * --split layers: a stage holds its layers' KV only, so it keeps a store of its own layers'
 * part, DIR/rank-R. Stores can differ (one written under a failed disk, one emptied by hand);
 * a stage must never restore a block another stage lacks, so before a restore each rank counts
 * the blocks it holds (memory, then its store: ds41_prefix_held, changing nothing), rank 0
 * takes the least count and broadcasts it (ds41_dist_min), and every stage restores exactly
 * that many (ds41_prefix_restore_cap): the same blocks inserted into every rank's memory cache,
 * which so stay alike (serve's stages replay rank 0's cache decisions on them). */
#include "ds41.h"

#include <dirent.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "dist_pipe.h"

int ds41_prefix_job_dir(const char *dir, int per_rank, char *out, size_t cap, const char **res) {
    *res = dir;
    if (!dir || ds41_dist_size() < 2) return 0;
    if (!per_rank) {
        if (ds41_dist_rank() > 0) *res = NULL;
        return 0;
    }
    int n = snprintf(out, cap, "%s/rank-%d", dir, ds41_dist_rank());
    if (n < 0 || (size_t)n >= cap) return -1;
    *res = out;
    return 0;
}

/* X of a directory name "rank-X" (X decimal, no sign, no leading zero), else -1 */
static int rank_of_name(const char *name) {
    if (strncmp(name, "rank-", 5)) return -1;
    const char *d = name + 5;
    if (!*d || (d[0] == '0' && d[1])) return -1;
    long long x = 0;
    for (; *d; d++) {
        if (*d < '0' || *d > '9') return -1;
        x = 10 * x + (*d - '0');
        if (x > INT_MAX) return -1;
    }
    return (int)x;
}

/* the block files (*.blk) in dir/rank-X/<fp> */
static long long blocks_in(const char *dir, int x, const char *fp) {
    char path[4200];
    snprintf(path, sizeof path, "%s/rank-%d/%s", dir, x, fp);
    DIR *d = opendir(path);
    if (!d) return 0;
    long long n = 0;
    for (struct dirent *de; (de = readdir(d));) {
        size_t l = strlen(de->d_name);
        if (l == 36 && !strcmp(de->d_name + 32, ".blk")) n++;
    }
    closedir(d);
    return n;
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* the X >= n of dir's rank-X directories, ascending (malloc'd; *count) */
static int *ranks_past(const char *dir, int n, int *count) {
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    int *v = NULL, cap = 0;
    for (struct dirent *de; (de = readdir(d));) {
        int x = rank_of_name(de->d_name);
        if (x < n) continue;
        if (*count == cap) {
            int *nv = realloc(v, (size_t)(cap = cap ? 2 * cap : 8) * sizeof *v);
            if (!nv) break;
            v = nv;
        }
        v[(*count)++] = x;
    }
    closedir(d);
    if (*count) qsort(v, (size_t)*count, sizeof *v, cmp_int);
    return v;
}

void ds41_prefix_job_adopt(ds41_prefix_cache *pc, const char *dir) {
    int N = ds41_dist_size(), me = ds41_dist_rank();
    if (!dir || !pc || N < 2) return;
    char fp[65], src[4200];
    ds41_prefix_fingerprint_hex(pc, fp);
    int count, *past = ranks_past(dir, N, &count);
    long long moved = 0, bytes = 0, dups = 0;
    for (int i = 0; i < count; i++) {
        if (past[i] % N != me) continue;
        long long b = 0, by = 0, du = 0;
        char eb[600];
        snprintf(src, sizeof src, "%s/rank-%d", dir, past[i]);
        int rc = ds41_prefix_adopt(pc, src, &b, &by, &du, eb, sizeof eb);
        moved += b;
        bytes += by;
        dups += du;
        if (rc)
            fprintf(stderr, "ds41%s%.0d%s: prefix cache: %s (the store of rank %d, past this job's %d ranks): %s; its "
                    "blocks left there are not read\n", me ? " [rank " : "", me, me ? "]" : "", src, past[i], N, eb);
        else if (b || du)
            fprintf(stderr, "ds41%s%.0d%s: prefix cache: %s (the store of rank %d, past this job's %d ranks): %lld "
                    "blocks (%lld bytes) moved into this rank's store %s/rank-%d, %lld it already held\n",
                    me ? " [rank " : "", me, me ? "]" : "", src, past[i], N, b, by, dir, me, du);
    }
    free(past);
    /* every rank's counts summed (two exchanges, at start only): once rank 0 has them every
     * rank's moves are done, so a store past N that still holds blocks is one no rank could
     * move (on a host none of its takers runs on, or a move failed) */
    long long all_moved = ds41_dist_sum(moved, "the prefix-cache blocks each rank moved");
    long long all_bytes = ds41_dist_sum(bytes, "the prefix-cache bytes each rank moved");
    if (me != 0) return;
    if (all_moved)
        fprintf(stderr, "ds41: prefix cache: %lld blocks (%lld bytes) of the stores of ranks past this job's %d moved into "
                "the stores of ranks X mod %d\n", all_moved, all_bytes, N, N);
    past = ranks_past(dir, N, &count);
    for (int i = 0; i < count; i++) {
        long long left = blocks_in(dir, past[i], fp);
        if (left)
            fprintf(stderr, "ds41: prefix cache: %s/rank-%d (the store of rank %d, past this job's %d ranks) still holds "
                    "%lld block files of this fingerprint that rank %d did not move (damaged, on a disk that rank does "
                    "not see, or a move that failed): not read\n", dir, past[i], past[i], N, left, past[i] % N);
    }
    free(past);
}

long long ds41_prefix_restore_job(ds41_prefix_cache *pc, ds41_session *s, const int32_t *ids, size_t n,
                                  const ds41_prefix_img *im, int store) {
    if (ds41_dist_size() < 2 || !store) return ds41_prefix_restore_img(pc, s, ids, n, im);
    if (ds41_pipe_on()) {
        long long held = ds41_prefix_held(pc, ids, n, im);
        long long agreed = ds41_dist_min(held, "the prefix-cache blocks each stage holds");
        return ds41_prefix_restore_cap(pc, s, ids, n, im, agreed);
    }
    /* rank 0's store: the blocks it reads from disk, then every rank restores from memory */
    int64_t hdr[3] = { 0, 0, 0 };   /* blocks, the first of them, bytes */
    uint8_t *bytes = NULL;
    int rank = ds41_dist_rank();
    if (rank == 0) {
        long long first = 0;
        size_t len = 0;
        long long nb = ds41_prefix_load(pc, ids, n, im, &first, &bytes, &len);
        if (nb < 0) ds41_dist_fatal(1, "rank 0: out of memory reading the prefix cache's stored blocks");
        hdr[0] = nb;
        hdr[1] = first;
        hdr[2] = (int64_t)len;
    }
    ds41_dist_bcast(hdr, sizeof hdr);
    if (hdr[0] > 0) {
        if (hdr[2] <= 0 || (uint64_t)hdr[2] > SIZE_MAX / 2)
            ds41_dist_fatal(1, "rank %d: rank 0's %lld stored blocks come as %lld bytes", rank, (long long)hdr[0],
                            (long long)hdr[2]);
        size_t len = (size_t)hdr[2];
        if (rank > 0 && !(bytes = malloc(len)))
            ds41_dist_fatal(1, "rank %d: out of memory for rank 0's %lld stored blocks (%zu bytes)", rank, (long long)hdr[0], len);
        for (size_t off = 0; off < len;) {   /* a broadcast carries at most INT_MAX bytes */
            size_t k = len - off < ((size_t)1 << 30) ? len - off : (size_t)1 << 30;
            ds41_dist_bcast(bytes + off, k);
            off += k;
        }
        if (rank > 0) {
            long long got = ds41_prefix_insert_bytes(pc, ids, n, im, hdr[1], hdr[0], bytes, len);
            if (got != hdr[0])
                ds41_dist_fatal(1, "rank %d: rank 0's %lld blocks from its store (%zu bytes) %s", rank, (long long)hdr[0], len,
                                got < 0 ? "do not fit this rank's model" : "do not continue this rank's cached chain");
        }
    }
    free(bytes);
    return ds41_prefix_restore_img(pc, s, ids, n, im);
}
