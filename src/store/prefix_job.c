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

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

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
