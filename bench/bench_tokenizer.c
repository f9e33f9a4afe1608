/* Tokenizer encode throughput: ds41_tokenize over a text file cut into documents at line
 * boundaries (the same cut bench/tokenizer_oracle.js makes), one thread, best of N passes.
 *   build/bench/bench_tokenizer -m DIR|tokenizer.json FILE [--chunk BYTES] [--repeat N]
 * Prints one JSON line: {"impl":"ds41","bytes":..,"docs":..,"tokens":..,"seconds":..,"mb_per_s":..} */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    size_t chunk = 4096;
    int repeat = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) chunk = (size_t)strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = atoi(argv[++i]);
        else if (!file && argv[i][0] != '-') file = argv[i];
        else { fprintf(stderr, "usage: bench_tokenizer -m DIR FILE [--chunk BYTES] [--repeat N]\n"); return 2; }
    }
    if (!model || !file || chunk == 0 || repeat < 1) {
        fprintf(stderr, "usage: bench_tokenizer -m DIR FILE [--chunk BYTES] [--repeat N]\n");
        return 2;
    }
    ds41_err err;
    ds41_tokenizer *tok;
    if (ds41_tokenizer_load(model, &tok, &err)) { fprintf(stderr, "bench_tokenizer: %s\n", err.msg); return 1; }
    char *text;
    size_t len;
    if (ds41_read_file(file, (size_t)1 << 32, &text, &len, &err)) { fprintf(stderr, "bench_tokenizer: %s\n", err.msg); return 1; }
    /* documents: whole lines, each document at least `chunk` bytes (the last may be shorter) */
    size_t cap = len / chunk + 2, nd = 0;
    size_t *start = malloc(cap * sizeof *start), *end = malloc(cap * sizeof *end);
    if (!start || !end) return 1;
    for (size_t p = 0; p < len;) {
        size_t q = p + chunk < len ? p + chunk : len;
        const char *nl = q < len ? memchr(text + q, '\n', len - q) : NULL;
        q = nl ? (size_t)(nl - text) + 1 : len;
        start[nd] = p;
        end[nd++] = q;
        p = q;
    }
    double best = 1e30;
    size_t tokens = 0;
    for (int r = 0; r < repeat; r++) {
        tokens = 0;
        double t0 = now();
        for (size_t d = 0; d < nd; d++) {
            int32_t *ids;
            size_t n;
            if (ds41_tokenize(tok, text + start[d], end[d] - start[d], 1, 0, &ids, &n, &err)) {
                fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
                return 1;
            }
            tokens += n;
            free(ids);
        }
        double t = now() - t0;
        if (t < best) best = t;
    }
    printf("{\"impl\":\"ds41\",\"bytes\":%zu,\"docs\":%zu,\"tokens\":%zu,\"seconds\":%.4f,\"mb_per_s\":%.2f}\n", len, nd,
           tokens, best, (double)len / 1e6 / best);
    free(start);
    free(end);
    free(text);
    ds41_tokenizer_free(tok);
    return 0;
}
