/* pstore_tool: drives the persistent prefix store (src/store/pstore.h) for
 * tests/store_faults.test.sh. Block i has deterministic content (key, parent = key of i - 1,
 * 128 token ids, payload), so a separate process can check what another one wrote.
 *   pstore_tool put DIR I [SIZE]           put block I; "ok" (exit 0) or the error (exit 1)
 *   pstore_tool check DIR I [SIZE]         get block I: "hit" (0), "miss" (1), "WRONG ..." (3)
 *   pstore_tool writer DIR START [SIZE]    put START, START+1, ... forever; prints each I on
 *                                          stdout only after its put returned 0
 *   pstore_tool verify-log DIR LOG FROM TO [SIZE]
 *                                          every I listed in LOG must hit with its payload; no I
 *                                          in FROM..TO may hit with another payload
 *   pstore_tool open DIR                   open and close (cleans orphaned temporary files)
 *   pstore_tool key I                      the key of block I in hex (its file name)
 * SIZE: payload bytes (default 4096 + (I * 257) % 8192). DS41_TOOL_FP=N picks another model
 * fingerprint, DS41_TOOL_CAP=BYTES a capacity. Exit 4 on usage or open errors. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pstore.h"

#define N_IDS 128

static uint64_t splitmix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static void block_key(long long i, uint8_t key[16]) {
    uint64_t a = splitmix(2 * (uint64_t)i + 11), b = splitmix(2 * (uint64_t)i + 12);
    memcpy(key, &a, 8);
    memcpy(key + 8, &b, 8);
}

static void block_parent(long long i, uint8_t parent[16]) {
    if (i == 0) memset(parent, 0, 16);
    else block_key(i - 1, parent);
}

static void block_ids(long long i, int32_t *ids) {
    for (int j = 0; j < N_IDS; j++) ids[j] = (int32_t)(splitmix((uint64_t)i * 1000003u + (uint64_t)j) % 129280u);
}

static size_t block_size(long long i, long long size_arg) {
    return size_arg >= 0 ? (size_t)size_arg : 4096 + (size_t)((i * 257) % 8192);
}

static void block_payload(long long i, uint8_t *p, size_t n) {
    uint64_t s = splitmix((uint64_t)i ^ 0x5eedull);
    for (size_t k = 0; k < n; k++) {
        if (k % 8 == 0) s = splitmix(s);
        p[k] = (uint8_t)(s >> (8 * (k % 8)));
    }
}

static ds41_pstore *open_store(const char *dir) {
    uint8_t fp[32];
    const char *e = getenv("DS41_TOOL_FP");
    unsigned seed = e ? (unsigned)atoi(e) : 0;
    for (int k = 0; k < 32; k++) fp[k] = (uint8_t)(k * 7 + 1 + seed * 31);
    const char *c = getenv("DS41_TOOL_CAP");
    ds41_err err;
    ds41_pstore *s = ds41_pstore_open(dir, fp, c ? atoll(c) : 0, &err);
    if (!s) fprintf(stderr, "pstore_tool: %s\n", err.msg);
    return s;
}

static int put_block(ds41_pstore *s, long long i, long long size_arg) {
    uint8_t key[16], parent[16];
    int32_t ids[N_IDS];
    size_t n = block_size(i, size_arg);
    uint8_t *p = malloc(n ? n : 1);
    if (!p) return -1;
    block_key(i, key);
    block_parent(i, parent);
    block_ids(i, ids);
    block_payload(i, p, n);
    ds41_err err;
    int rc = ds41_pstore_put(s, key, parent, ids, N_IDS, p, n, &err);
    if (rc != 0) fprintf(stderr, "put %lld: %s\n", i, err.msg);
    free(p);
    return rc;
}

/* 0 hit with the right payload, 1 miss, 3 wrong payload, 4 error */
static int check_block(ds41_pstore *s, long long i, long long size_arg) {
    uint8_t key[16], parent[16];
    int32_t ids[N_IDS];
    block_key(i, key);
    block_parent(i, parent);
    block_ids(i, ids);
    void *got = NULL;
    size_t n = 0;
    ds41_err err;
    int r = ds41_pstore_get(s, key, parent, ids, N_IDS, &got, &n, &err);
    if (r < 0) { fprintf(stderr, "get %lld: %s\n", i, err.msg); return 4; }
    if (r == 0) return got == NULL && n == 0 ? 1 : 3;
    size_t want = block_size(i, size_arg);
    uint8_t *p = malloc(want ? want : 1);
    int ok = p && n == want;
    if (ok) {
        block_payload(i, p, want);
        ok = memcmp(p, got, want) == 0;
    }
    free(p);
    free(got);
    return ok ? 0 : 3;
}

static long long num(const char *s) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < 0) {
        fprintf(stderr, "pstore_tool: '%s' is not a non-negative integer\n", s);
        exit(4);
    }
    return v;
}

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "key")) {
        uint8_t key[16];
        char h[33];
        block_key(num(argv[2]), key);
        ds41_pstore_hex(key, 16, h);
        printf("%s\n", h);
        return 0;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: pstore_tool put|check|writer|verify-log|open|key ...\n");
        return 4;
    }
    const char *cmd = argv[1], *dir = argv[2];
    ds41_pstore *s = open_store(dir);
    if (!s) return 4;
    int rc = 4;
    if (!strcmp(cmd, "open")) {
        rc = 0;
    } else if (!strcmp(cmd, "put") && argc >= 4) {
        rc = put_block(s, num(argv[3]), argc > 4 ? num(argv[4]) : -1) == 0 ? 0 : 1;
        if (rc == 0) printf("ok\n");
    } else if (!strcmp(cmd, "check") && argc >= 4) {
        rc = check_block(s, num(argv[3]), argc > 4 ? num(argv[4]) : -1);
        printf("%s\n", rc == 0 ? "hit" : rc == 1 ? "miss" : rc == 3 ? "WRONG payload served" : "error");
    } else if (!strcmp(cmd, "writer") && argc >= 4) {
        long long size_arg = argc > 4 ? num(argv[4]) : -1;
        for (long long i = num(argv[3]);; i++) {
            if (put_block(s, i, size_arg) != 0) { rc = 1; break; }
            char line[32];
            int len = snprintf(line, sizeof line, "%lld\n", i);
            if (write(1, line, (size_t)len) != len) { rc = 1; break; }
        }
    } else if (!strcmp(cmd, "verify-log") && argc >= 6) {
        long long from = num(argv[4]), to = num(argv[5]), size_arg = argc > 6 ? num(argv[6]) : -1;
        if (to < from) to = from;
        char *reported = calloc((size_t)(to - from + 1), 1);
        FILE *f = fopen(argv[3], "r");
        if (!reported || !f) {
            fprintf(stderr, "pstore_tool: %s: %s\n", argv[3], strerror(errno));
            free(reported);
            if (f) fclose(f);
            ds41_pstore_close(s);
            return 4;
        }
        long long v;
        char line[64];
        while (fgets(line, sizeof line, f)) {
            /* a line cut by the kill (no newline) was not reported */
            if (!strchr(line, '\n') || sscanf(line, "%lld", &v) != 1) continue;
            if (v >= from && v <= to) reported[v - from] = 1;
        }
        fclose(f);
        long long n_rep = 0, served = 0, extra = 0, lost = 0, wrong = 0;
        for (long long i = from; i <= to; i++) {
            int r = check_block(s, i, size_arg);
            if (reported[i - from]) n_rep++;
            if (r == 3 || r == 4) { wrong++; printf("block %lld: %s\n", i, r == 3 ? "WRONG payload served" : "get error"); }
            else if (r == 0) { if (reported[i - from]) served++; else extra++; }
            else if (reported[i - from]) { lost++; printf("block %lld: reported written, now a miss\n", i); }
        }
        printf("reported %lld served %lld lost %lld wrong %lld unreported-hits %lld\n", n_rep, served, lost, wrong, extra);
        free(reported);
        rc = lost || wrong ? 1 : 0;
    } else {
        fprintf(stderr, "pstore_tool: bad command or arguments\n");
    }
    ds41_pstore_close(s);
    return rc;
}
