/* bench_pstore: put / get latency and throughput of the persistent prefix store (src/store)
 * for 128-token blocks at production width (890 B/token: 113920 B) and of the demo model
 * (79.5 B/token: 10176 B), on the file system of DIR; and CRC32C speed.
 *   bench_pstore [--dir DIR] [--n N]     (default DIR build/bench-pstore, N 200 blocks per size)
 * put: temporary file, write, fsync, rename, directory fsync (durable on return). get: a warm
 * read (the file is in the page cache), checksum, compare ids, LRU touch. Also puts into a
 * full store (capacity of N/4 blocks: every put past it evicts). Medians and 90th percentiles. */
#define _GNU_SOURCE
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "crc32c.h"
#include "pstore.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st; (void)flag; (void)ftw;
    return remove(p);
}

static void make_block(int i, uint8_t key[16], uint8_t parent[16], int32_t ids[128]) {
    for (int k = 0; k < 16; k++) {
        key[k] = (uint8_t)(i * 31 + k * 7 + (i >> 8));
        parent[k] = (uint8_t)((i - 1) * 31 + k * 7 + ((i - 1) >> 8));
    }
    for (int k = 0; k < 128; k++) ids[k] = (i * 128 + k) % 129280;
}

static int run_size(const char *dir, size_t bytes, int n, const char *label) {
    uint8_t fp[32];
    for (int k = 0; k < 32; k++) fp[k] = (uint8_t)(k + bytes);
    ds41_err err;
    ds41_pstore *s = ds41_pstore_open(dir, fp, 0, &err);
    if (!s) { fprintf(stderr, "bench_pstore: %s\n", err.msg); return -1; }
    uint8_t *payload = malloc(bytes);
    double *t_put = malloc(sizeof(double) * (size_t)n), *t_get = malloc(sizeof(double) * (size_t)n);
    for (size_t k = 0; k < bytes; k++) payload[k] = (uint8_t)(k * 2654435761u >> 13);
    uint8_t key[16], parent[16];
    int32_t ids[128];
    for (int i = 0; i < n; i++) {
        make_block(i, key, parent, ids);
        payload[0] = (uint8_t)i;
        double t0 = now_s();
        if (ds41_pstore_put(s, key, parent, ids, 128, payload, bytes, &err) != 0) {
            fprintf(stderr, "bench_pstore: %s\n", err.msg);
            return -1;
        }
        t_put[i] = now_s() - t0;
    }
    for (int i = 0; i < n; i++) {
        make_block(i, key, parent, ids);
        void *p;
        size_t got;
        double t0 = now_s();
        int r = ds41_pstore_get(s, key, parent, ids, 128, &p, &got, &err);
        t_get[i] = now_s() - t0;
        if (r != 1 || got != bytes) { fprintf(stderr, "bench_pstore: get %d returned %d\n", i, r); return -1; }
        free(p);
    }
    ds41_pstore_close(s);
    double mb = (double)bytes / 1e6;
    double pm = pct(t_put, n, 0.5), p90 = pct(t_put, n, 0.9), gm = pct(t_get, n, 0.5), g90 = pct(t_get, n, 0.9);
    printf("%-28s %7zu B  put median %7.3f ms (p90 %7.3f) %8.1f MB/s   get median %7.3f ms (p90 %7.3f) %8.1f MB/s\n",
           label, bytes, 1e3 * pm, 1e3 * p90, mb / pm, 1e3 * gm, 1e3 * g90, mb / gm);

    /* a full store: capacity n/4 blocks, so every put past it rescans and evicts now and then */
    char full[1024];
    snprintf(full, sizeof full, "%s-full", dir);
    long long fb = 108 + 4 * 128 + (long long)bytes;
    s = ds41_pstore_open(full, fp, fb * (n / 4), &err);
    if (!s) { fprintf(stderr, "bench_pstore: %s\n", err.msg); return -1; }
    for (int i = 0; i < n; i++) {
        make_block(100000 + i, key, parent, ids);
        double t0 = now_s();
        if (ds41_pstore_put(s, key, parent, ids, 128, payload, bytes, &err) != 0) {
            fprintf(stderr, "bench_pstore: %s\n", err.msg);
            return -1;
        }
        t_put[i] = now_s() - t0;
    }
    ds41_pstore_close(s);
    nftw(full, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    pm = pct(t_put, n, 0.5);
    p90 = pct(t_put, n, 0.9);
    printf("%-28s %7zu B  put median %7.3f ms (p90 %7.3f) into a store at capacity (%d blocks)\n", label, bytes,
           1e3 * pm, 1e3 * p90, n / 4);
    free(payload);
    free(t_put);
    free(t_get);
    return 0;
}

int main(int argc, char **argv) {
    const char *dir = "build/bench-pstore";
    int n = 200;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--n") && i + 1 < argc) n = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_pstore [--dir DIR] [--n N]\n");
            return 2;
        }
    }
    if (n < 4) n = 4;
    /* CRC32C over 1 MiB, best of 20 */
    size_t cn = 1 << 20;
    uint8_t *buf = malloc(cn);
    for (size_t k = 0; k < cn; k++) buf[k] = (uint8_t)(k * 131);
    double best_hw = 1e9, best_sw = 1e9;
    volatile uint32_t sink = 0;
    for (int r = 0; r < 20; r++) {
        double t0 = now_s();
        sink ^= ds41_crc32c(0, buf, cn);
        double t1 = now_s();
        sink ^= ds41_crc32c_sw(0, buf, cn);
        double t2 = now_s();
        if (t1 - t0 < best_hw) best_hw = t1 - t0;
        if (t2 - t1 < best_sw) best_sw = t2 - t1;
    }
    free(buf);
    printf("crc32c: %s %.2f GB/s, table (slicing-by-8) %.2f GB/s\n", ds41_crc32c_hw() ? "SSE4.2" : "table",
           (double)cn / best_hw / 1e9, (double)cn / best_sw / 1e9);
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    int rc = 0;
    rc |= run_size(dir, 890 * 128, n, "production (890 B/token)");
    rc |= run_size(dir, 795 * 128 / 10, n, "demo (79.5 B/token)");
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    return rc ? 1 : 0;
}
