/* ds41 job identity (dist.h): the hashes every rank of a job compares at start-up, so that
 * ranks holding another checkpoint, shard set or kernel mode are refused before they compute
 * anything together. */
#include "dist.h"
#include "dist_pipe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "safetensors.h"

int ds41_dist_ident_of(const char *dir, const ds41_st *st, int exact, ds41_dist_ident *id) {
    memset(id, 0, sizeof *id);
    /* config.json, byte for byte */
    char *path = ds41_path_join(dir, "config.json");
    if (!path) return -1;
    FILE *f = fopen(path, "rb");
    free(path);
    uint64_t h = DS41_FNV0;
    if (f) {
        char buf[65536];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) h = ds41_fnv(h, buf, n);
        fclose(f);
    }
    id->config = h;
    /* the shards: their names (not the directory) and sizes, in order */
    h = DS41_FNV0;
    int ns = st ? ds41_st_shard_count(st) : 0;
    for (int i = 0; i < ns; i++) {
        const char *p = ds41_st_shard_path(st, i), *b = strrchr(p, '/');
        b = b ? b + 1 : p;
        uint64_t bytes = ds41_st_shard_bytes(st, i);
        h = ds41_fnv(h, b, strlen(b) + 1);
        h = ds41_fnv(h, &bytes, sizeof bytes);
    }
    id->shards = h;
    id->flags = ds41_pipe_flags_hash(ds41_dist_flags_hash());
    /* exact kernels are one reading on every CPU; the fast ones name their ISA and FP8 path */
    h = ds41_fnv(DS41_FNV0, &exact, sizeof exact);
    if (!exact) {
        const char *isa = ds41_kernels_isa(), *fp8 = ds41_kernels_fp8_decode();
        h = ds41_fnv(h, isa, strlen(isa) + 1);
        h = ds41_fnv(h, fp8, strlen(fp8) + 1);
    }
    id->kernels = h;
    return 0;
}
