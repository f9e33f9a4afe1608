/* Strict numeric parsing of command-line values (see cli_args.h). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <sys/stat.h>

#include "cli_args.h"
#include "common.h"
#include "ds41.h"

int ds41_cli_int(const char *cmd, const char *flag, const char *v, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    /* strtoll skips leading blanks and accepts an empty tail; neither is a number here */
    if (end == v || *end || isspace((unsigned char)*v) || errno || x < lo || x > hi) {
        fprintf(stderr, "ds41 %s: %s: expected an integer in %lld..%lld, got '%.40s'\n", cmd, flag, lo, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

int ds41_cli_double(const char *cmd, const char *flag, const char *v, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || isspace((unsigned char)*v) || !isfinite(x) || x < lo || x > hi) {
        fprintf(stderr, "ds41 %s: %s: expected a number in %g..%g, got '%.40s'\n", cmd, flag, lo, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

int ds41_cli_u64(const char *cmd, const char *flag, const char *v, unsigned long long *out) {
    char *end;
    errno = 0;
    /* strtoull accepts "-1" as 2^64-1: require a leading digit */
    unsigned long long x = isdigit((unsigned char)*v) ? strtoull(v, &end, 10) : 0;
    if (!isdigit((unsigned char)*v) || *end || errno) {
        fprintf(stderr, "ds41 %s: %s: expected an unsigned integer 0..18446744073709551615, got '%.40s'\n", cmd, flag, v);
        return -1;
    }
    *out = x;
    return 0;
}

/* ---------------------------------------------------------------- shared generation flags */

void ds41_cli_gen_default(ds41_cli_gen *g) {
    memset(g, 0, sizeof *g);
    g->n_predict = 32;
    g->top_p = 1.0f;
    g->threads = 1;
    g->exact = getenv("DS41_EXACT") && !strcmp(getenv("DS41_EXACT"), "1");
    g->prefill = DS41_PREFILL_MODE_CED;
    g->index_k = DS41_INDEX_K_OWN;
}

int ds41_cli_gen_arg(const char *cmd, int argc, char **argv, int *i, unsigned groups, ds41_cli_gen *g) {
    const char *a = argv[*i];
    long long iv;
    double dv;
#define IS(s1, s2) (!strcmp(a, s1) || ((s2) && !strcmp(a, (s2) ? (s2) : "")))
#define VAL() (*i + 1 < argc ? argv[++*i] : NULL)
#define NEED(v) do { if (!(v)) { fprintf(stderr, "ds41 %s: %s needs a value\n", cmd, a); return -1; } } while (0)
    if ((groups & DS41_CLI_NPREDICT) && IS("-n", "--n-predict")) {
        const char *v = VAL(); NEED(v);
        if (ds41_cli_int(cmd, a, v, 0, INT32_MAX, &iv)) return -1;
        g->n_predict = (int)iv;
        return 1;
    }
    if (groups & DS41_CLI_SAMPLING) {
        if (IS("--temp", NULL)) {
            const char *v = VAL(); NEED(v);
            if (ds41_cli_double(cmd, a, v, 0, 1e30, &dv)) return -1;
            g->temp = (float)dv;
            return 1;
        }
        if (IS("--top-k", NULL)) {
            const char *v = VAL(); NEED(v);
            if (ds41_cli_int(cmd, a, v, 0, INT32_MAX, &iv)) return -1;
            g->top_k = (int)iv;
            return 1;
        }
        if (IS("--top-p", NULL)) {
            const char *v = VAL(); NEED(v);
            if (ds41_cli_double(cmd, a, v, 0, 1, &dv)) return -1;
            if (dv <= 0) { fprintf(stderr, "ds41 %s: --top-p must be in (0, 1], got '%s'\n", cmd, v); return -1; }
            g->top_p = (float)dv;
            return 1;
        }
        if (IS("--min-p", NULL)) {
            const char *v = VAL(); NEED(v);
            if (ds41_cli_double(cmd, a, v, 0, 1, &dv)) return -1;
            g->min_p = (float)dv;
            return 1;
        }
        if (IS("--seed", NULL)) {
            const char *v = VAL(); NEED(v);
            return ds41_cli_u64(cmd, a, v, &g->seed) ? -1 : 1;
        }
    }
    if (groups & DS41_CLI_ENGINE) {
        if (IS("--load", NULL)) {
            const char *v = VAL(); NEED(v);
            if (ds41_parse_load(v, &g->load)) {
                fprintf(stderr, "ds41 %s: --load: '%s' is not mmap or copy\n", cmd, v);
                return -1;
            }
            return 1;
        }
        if (IS("--readahead", NULL)) { g->readahead = 1; return 1; }
        int r = ds41_cli_engram_arg(cmd, argc, argv, i, &g->engram_mode, &g->engram_cache);
        if (r) return r;
        if (IS("-t", "--threads")) {
            const char *v = VAL(); NEED(v);
            if (ds41_cli_int(cmd, a, v, 1, 256, &iv)) return -1;
            g->threads = (int)iv;
            return 1;
        }
        if (IS("--chunk", NULL)) {
            const char *v = VAL(); NEED(v);
            /* 0 or off: one forward; auto: the library's default (g->chunk 0) */
            if (!strcmp(v, "off")) { g->chunk = DS41_CHUNK_OFF; return 1; }
            if (!strcmp(v, "auto")) { g->chunk = 0; return 1; }
            if (ds41_cli_int(cmd, a, v, 0, INT32_MAX, &iv)) return -1;
            g->chunk = iv == 0 ? DS41_CHUNK_OFF : (int)iv;
            return 1;
        }
        if (IS("--exact", NULL)) { g->exact = 1; return 1; }
        if (IS("--index-k", NULL)) {
            const char *v = VAL(); NEED(v);
            if (!strcmp(v, "own")) g->index_k = DS41_INDEX_K_OWN;
            else if (!strcmp(v, "official")) g->index_k = DS41_INDEX_K_OFFICIAL;
            else { fprintf(stderr, "ds41 %s: --index-k must be own or official, not '%s'\n", cmd, v); return -1; }
            return 1;
        }
    }
    if ((groups & DS41_CLI_CTX) && IS("-c", "--ctx-size")) {
        const char *v = VAL(); NEED(v);
        if (ds41_cli_int(cmd, a, v, 1, INT32_MAX, &iv)) return -1;
        g->ctx = iv;
        return 1;
    }
    if ((groups & DS41_CLI_PREFILL) && IS("--prefill", NULL)) {
        const char *v = VAL(); NEED(v);
        if (!strcmp(v, "ced")) g->prefill = DS41_PREFILL_MODE_CED;
        else if (!strcmp(v, "full")) g->prefill = DS41_PREFILL_MODE_FULL;
        else if (!strcmp(v, "ced-replay")) g->prefill = DS41_PREFILL_MODE_REPLAY;
        else { fprintf(stderr, "ds41 %s: --prefill must be ced, full or ced-replay, not '%s'\n", cmd, v); return -1; }
        return 1;
    }
#undef IS
#undef VAL
#undef NEED
    return 0;
}

int ds41_cli_engram_arg(const char *cmd, int argc, char **argv, int *i, int *mode, long long *cache) {
    const char *a = argv[*i];
    int is_mode = !strcmp(a, "--engram-mode"), is_cache = !strcmp(a, "--engram-cache");
    if (!is_mode && !is_cache) return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "ds41 %s: %s needs a value\n", cmd, a);
        return -1;
    }
    const char *v = argv[++*i];
    if (is_mode) {
        if (ds41_parse_engram_mode(v, mode)) {
            fprintf(stderr, "ds41 %s: --engram-mode must be auto, ram, mmap or prefetch, not '%.40s'\n", cmd, v);
            return -1;
        }
        return 1;
    }
    if (!strcmp(v, "off") || !strcmp(v, "0")) {
        *cache = -1;
        return 1;
    }
    return ds41_cli_bytes(cmd, a, v, cache) ? -1 : 1;
}

int ds41_cli_file_exists(const char *dir, const char *name) {
    char *p = ds41_path_join(dir, name);
    struct stat sb;
    int ok = p && stat(p, &sb) == 0;
    free(p);
    return ok;
}

/* The K best of a row (values descending, ties lower id) into best[0..nb), their log-sum-exp. */
static int top_k(const float *lg, int V, int K, int32_t *best, double *lse) {
    double mx = -INFINITY;
    for (int i = 0; i < V; i++) if (lg[i] > mx) mx = lg[i];
    double se = 0.0;
    for (int i = 0; i < V; i++) se += exp((double)lg[i] - mx);
    *lse = mx + log(se);
    if (K > V) K = V;
    int nb = 0;
    for (int i = 0; i < V && K > 0; i++) {
        /* insertion into a small sorted list */
        if (nb == K && !(lg[i] > lg[best[K - 1]])) continue;
        int j = nb < K ? nb++ : K - 1;
        while (j > 0 && lg[i] > lg[best[j - 1]]) { best[j] = best[j - 1]; j--; }
        best[j] = i;
    }
    return nb;
}

static json_t *top_array(const int32_t *best, const float *logit, int nb, double lse) {
    json_t *arr = json_array();
    for (int i = 0; i < nb; i++) {
        json_t *o = json_object();
        json_object_set_new(o, "id", json_integer(best[i]));
        json_object_set_new(o, "logit", json_real(logit[i]));
        json_object_set_new(o, "logprob", json_real((double)logit[i] - lse));
        json_array_append_new(arr, o);
    }
    return arr;
}

/* log-softmax of the K best logits (values descending, ties lower id) as a JSON array. */
json_t *ds41_cli_top_json(const float *lg, int V, int K) {
    int32_t *best = malloc((size_t)(K > 0 ? K : 1) * sizeof *best);
    float *logit = malloc((size_t)(K > 0 ? K : 1) * sizeof *logit);
    double lse;
    int nb = best && logit ? top_k(lg, V, K, best, &lse) : 0;
    for (int i = 0; i < nb; i++) logit[i] = lg[best[i]];
    json_t *arr = top_array(best, logit, nb, lse);
    free(best);
    free(logit);
    return arr;
}

/* [int32 nb][double lse][int32 ids[K]][float logits[K]], memcpy'd (no alignment assumed) */
size_t ds41_cli_top_bytes(int K) { return sizeof(int32_t) + sizeof(double) + (size_t)(K > 0 ? K : 0) * 8; }

void ds41_cli_top_reduce(const float *lg, int V, void *arg, void *out) {
    int K = *(const int *)arg;
    unsigned char *o = out;
    int32_t *best = malloc((size_t)(K > 0 ? K : 1) * sizeof *best);
    if (!best) return;   /* nb stays 0: an empty list */
    double lse;
    int32_t nb = top_k(lg, V, K, best, &lse);
    memcpy(o, &nb, sizeof nb);
    memcpy(o + 4, &lse, sizeof lse);
    memcpy(o + 12, best, (size_t)nb * sizeof *best);
    for (int i = 0; i < nb; i++) memcpy(o + 12 + (size_t)K * 4 + (size_t)i * 4, &lg[best[i]], sizeof(float));
    free(best);
}

json_t *ds41_cli_top_json_of(const void *top, int K) {
    const unsigned char *t = top;
    int32_t nb;
    double lse;
    memcpy(&nb, t, sizeof nb);
    memcpy(&lse, t + 4, sizeof lse);
    if (nb < 0 || nb > K) nb = 0;
    int32_t *best = malloc((size_t)(K > 0 ? K : 1) * sizeof *best);
    float *logit = malloc((size_t)(K > 0 ? K : 1) * sizeof *logit);
    if (!best || !logit) nb = 0;
    else {
        memcpy(best, t + 12, (size_t)nb * sizeof *best);
        memcpy(logit, t + 12 + (size_t)K * 4, (size_t)nb * sizeof *logit);
    }
    json_t *arr = top_array(best, logit, nb, lse);
    free(best);
    free(logit);
    return arr;
}

int ds41_cli_bytes(const char *cmd, const char *flag, const char *v, long long *out) {
    char *end;
    double x = strtod(v, &end);
    long long mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1LL << 10, end++;
    else if (*end == 'm' || *end == 'M') mul = 1LL << 20, end++;
    else if (*end == 'g' || *end == 'G') mul = 1LL << 30, end++;
    if (end == v || *end || !(x >= 1) || x * (double)mul > 9.0e18) {
        fprintf(stderr, "ds41 %s: %s: '%s' is not a byte count (e.g. 512M)\n", cmd, flag, v);
        return -1;
    }
    *out = (long long)(x * (double)mul);
    return 0;
}

int ds41_cli_int_list(const char *s, long lo, long hi, int *v, int cap) {
    int n = 0;
    while (*s) {
        if (n == cap) return -1;
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < lo || x > hi || (*end && *end != ',')) return -1;
        v[n++] = (int)x;
        s = *end ? end + 1 : end;
    }
    return n > 0 ? n : -1;
}

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double ds41_cli_now(void) { return clock_s(CLOCK_MONOTONIC); }
double ds41_cli_cpu_process(void) { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }
double ds41_cli_cpu_thread(void) { return clock_s(CLOCK_THREAD_CPUTIME_ID); }

int ds41_cli_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double ds41_cli_median(double *v, int n) {
    if (n <= 0) return 0.0;
    qsort(v, (size_t)n, sizeof *v, ds41_cli_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int ds41_cli_model_dir_ok(const char *cmd, const char *dir) {
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        int e = errno;
        fprintf(stderr, "ds41 %s: %s: cannot open: %s%s\n", cmd, dir, strerror(e),
                e == ENOENT ? " (the bundled demo model is models/demo, from the repository root: ds41 run -m models/demo -p Hello)" : "");
        return 1;
    }
    return 0;
}
