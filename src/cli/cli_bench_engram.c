/* ds41 bench --engram: decode speed with the Engram tables in one placement (P4), on real text.
 *
 * One process measures one --engram-mode (the page cache and the memory cgroup are per process
 * tree, so modes are compared by alternating processes: docs/engram-offram.md). A prompt of
 * --prompt tokens from the text, then -n decode steps teacher-forced on the text's next tokens
 * (every step one token, as greedy decoding costs; the Engram rows are those real text asks
 * for). Prints decode tokens/s, the median and p99 step time, and over the decode steps: the
 * Engram lookups, the row cache's hit rate, rows and bytes read, the stall per step (and the
 * time in the issue and from it to the first Engram layer's wait: the step's timeline), the bytes
 * the process read from storage (/proc/self/io read_bytes) and its major page faults. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli.h"
#include "cli_args.h"
#include "common.h"
#include "ds41.h"
#include "tokenizer.h"

static const char *USAGE =
    "usage: ds41 bench --engram -m DIR [options]\n"
    "  -m, --model DIR        checkpoint directory (tokenizer.json needed with --text)\n"
    "  --text FILE            the text decoded (teacher-forced); default: pseudo-random ids\n"
    "  --prompt N             prompt tokens before the decode (default 64)\n"
    "  -n N                   decode steps timed (default 256)\n"
    "  --skip N               first decode steps not timed (default 8)\n"
    "  -t, --threads N        fast-mode threads (default 1)\n"
    "  --exact                exact kernels\n"
    "  --json                 one JSON object\n"
    DS41_CLI_ENGRAM_USAGE;

/* read_bytes of /proc/self/io (bytes this process caused to be fetched from storage) */
static long long io_read_bytes(void) {
    FILE *f = fopen("/proc/self/io", "r");
    if (!f) return -1;
    char line[128];
    long long v = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "read_bytes: ", 12)) v = strtoll(line + 12, NULL, 10);
    fclose(f);
    return v;
}

static long long majflt(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_majflt;
}

static int text_ids(const char *dir, const char *file, int32_t **ids, size_t *n) {
    ds41_err err;
    ds41_tokenizer *tok = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc = -1;
    if (ds41_tokenizer_load(dir, &tok, &err)) { fprintf(stderr, "ds41 bench: %s\n", err.msg); return -1; }
    if (ds41_read_file(file, (size_t)1 << 30, &text, &len, &err)) fprintf(stderr, "ds41 bench: %s\n", err.msg);
    else if (ds41_tokenize(tok, text, len, 0, 1, ids, n, &err)) fprintf(stderr, "ds41 bench: %s\n", err.msg);
    else rc = 0;
    free(text);
    ds41_tokenizer_free(tok);
    return rc;
}

int ds41_cli_bench_engram(int argc, char **argv) {
    const char *dir = NULL, *text = NULL;
    long long n_prompt = 64, n_dec = 256, n_skip = 8, iv;
    int threads = 1, exact = 0, json = 0, mode = DS41_ENGRAM_AUTO, r;
    long long cache = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(USAGE, stdout); return 0; }
        else if (!strcmp(a, "--engram")) continue;
        else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has) dir = argv[++i];
        else if (!strcmp(a, "--text") && has) text = argv[++i];
        else if (!strcmp(a, "--prompt") && has) { if (ds41_cli_int("bench", a, argv[++i], 1, 1 << 20, &n_prompt)) return 2; }
        else if (!strcmp(a, "-n") && has) { if (ds41_cli_int("bench", a, argv[++i], 1, 1 << 20, &n_dec)) return 2; }
        else if (!strcmp(a, "--skip") && has) { if (ds41_cli_int("bench", a, argv[++i], 0, 1 << 20, &n_skip)) return 2; }
        else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && has) {
            if (ds41_cli_int("bench", a, argv[++i], 1, 256, &iv)) return 2;
            threads = (int)iv;
        }
        else if (!strcmp(a, "--exact")) exact = 1;
        else if (!strcmp(a, "--json")) json = 1;
        else if ((r = ds41_cli_engram_arg("bench", argc, argv, &i, &mode, &cache)) != 0) { if (r < 0) return 2; }
        else { fprintf(stderr, "ds41 bench: unknown or incomplete option '%s'\n%s", a, USAGE); return 2; }
    }
    if (!dir) { fprintf(stderr, "ds41 bench: -m DIR is required\n%s", USAGE); return 2; }
    long long need = n_prompt + n_skip + n_dec;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (text) {
        if (text_ids(dir, text, &ids, &n_ids)) return 1;
        if ((long long)n_ids < need) {
            fprintf(stderr, "ds41 bench: %s has %zu tokens; --prompt + --skip + -n need %lld\n", text, n_ids, need);
            free(ids);
            return 1;
        }
    }
    ds41_load_params lp;
    ds41_load_params_default(&lp);
    lp.exact = exact;
    lp.n_threads = threads;
    lp.ctx_size = need + 1;
    lp.engram_mode = mode;
    lp.engram_cache = cache;
    lp.engram_verbose = 1;
    char ebuf[1024];
    double tl = ds41_cli_now();
    ds41_engine *e = ds41_load(dir, &lp, ebuf, sizeof ebuf);
    tl = ds41_cli_now() - tl;
    if (!e) { fprintf(stderr, "ds41 bench: %s\n", ebuf); free(ids); return 1; }
    int V = ds41_vocab_size(e);
    if (!ids) {
        ids = malloc((size_t)need * sizeof *ids);
        unsigned x = 12345;
        for (long long i = 0; ids && i < need; i++) { x = x * 1103515245u + 12345u; ids[i] = (int32_t)((x >> 8) % (unsigned)V); }
    }
    for (long long i = 0; ids && i < need; i++)
        if (ids[i] < 0 || ids[i] >= V) { fprintf(stderr, "ds41 bench: token %d outside the vocabulary\n", ids[i]); free(ids); ds41_unload(e); return 1; }
    ds41_session *s = ids ? ds41_session_open(e, NULL, ebuf, sizeof ebuf) : NULL;
    double *step = malloc((size_t)n_dec * sizeof *step);
    int rc = 1;
    if (!s || !step) { fprintf(stderr, "ds41 bench: %s\n", s ? "out of memory" : ebuf); goto out; }
    double tp = ds41_cli_now();
    if (ds41_feed(s, ids, (size_t)n_prompt)) { fprintf(stderr, "ds41 bench: %s\n", ds41_session_error(s)); goto out; }
    tp = ds41_cli_now() - tp;
    for (long long i = 0; i < n_skip; i++)
        if (ds41_feed(s, ids + n_prompt + i, 1)) { fprintf(stderr, "ds41 bench: %s\n", ds41_session_error(s)); goto out; }
    ds41_engram_stats a, b;
    ds41_engram_get_stats(e, &a);
    long long rb0 = io_read_bytes(), mf0 = majflt();
    double total = 0;
    for (long long i = 0; i < n_dec; i++) {
        double t0 = ds41_cli_now();
        if (ds41_feed(s, ids + n_prompt + n_skip + i, 1)) { fprintf(stderr, "ds41 bench: %s\n", ds41_session_error(s)); goto out; }
        step[i] = ds41_cli_now() - t0;
        total += step[i];
    }
    long long rb1 = io_read_bytes(), mf1 = majflt();
    ds41_engram_get_stats(e, &b);
    qsort(step, (size_t)n_dec, sizeof *step, ds41_cli_cmp_double);
    double med = n_dec % 2 ? step[n_dec / 2] : 0.5 * (step[n_dec / 2 - 1] + step[n_dec / 2]);
    long long i99 = (long long)((double)n_dec * 0.99 + 0.999999) - 1;   /* nearest rank */
    if (i99 < 0) i99 = 0;
    double p99 = step[i99];
    long long lookups = b.lookups - a.lookups, hits = b.hits - a.hits;
    double hit = lookups ? (double)hits / (double)lookups : 0.0;
    double disk_pt = rb0 >= 0 && rb1 >= 0 ? (double)(rb1 - rb0) / (double)n_dec : -1;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    if (json) {
        printf("{\"mode\":\"%s\",\"io\":\"%s\",\"load_s\":%.3f,\"prompt\":%lld,\"prefill_s\":%.4f,\"decode_steps\":%lld,"
               "\"decode_tok_s\":%.3f,\"step_median_ms\":%.3f,\"step_p99_ms\":%.3f,\"step_max_ms\":%.3f,"
               "\"lookups_per_token\":%.2f,\"hit_rate\":%.4f,\"rows_read_per_token\":%.2f,\"bytes_read_per_token\":%.1f,"
               "\"stall_ms_per_token\":%.4f,\"issue_ms_per_token\":%.4f,\"lead_ms_per_token\":%.4f,\"disk_bytes_per_token\":%.1f,\"major_faults_per_token\":%.3f,"
               "\"cache_bytes\":%lld,\"retries\":%lld,\"peak_rss_kb\":%ld}\n",
               ds41_engram_mode_name(b.mode), b.mode == DS41_ENGRAM_PREFETCH ? (b.uring ? "io_uring" : "pread") : "-", tl,
               n_prompt, tp, n_dec, (double)n_dec / total, med * 1e3, p99 * 1e3, step[n_dec - 1] * 1e3,
               (double)lookups / (double)n_dec, hit, (double)(b.rows_read - a.rows_read) / (double)n_dec,
               (double)(b.bytes_read - a.bytes_read) / (double)n_dec, (b.stall_s - a.stall_s) * 1e3 / (double)n_dec,
               (b.issue_s - a.issue_s) * 1e3 / (double)n_dec, (b.lead_s - a.lead_s) * 1e3 / (double)n_dec, disk_pt, (double)(mf1 - mf0) / (double)n_dec, b.cache_bytes, b.retries - a.retries, ru.ru_maxrss);
    } else {
        printf("engram mode %s%s: load %.2f s, prefill %lld tokens %.3f s\n", ds41_engram_mode_name(b.mode),
               b.mode == DS41_ENGRAM_PREFETCH ? (b.uring ? " (io_uring)" : " (pread)") : "", tl, n_prompt, tp);
        printf("decode %lld steps: %.2f tok/s, step median %.3f ms, p99 %.3f ms, max %.3f ms\n", n_dec,
               (double)n_dec / total, med * 1e3, p99 * 1e3, step[n_dec - 1] * 1e3);
        if (b.mode == DS41_ENGRAM_PREFETCH)
            printf("engram rows: %.1f distinct per token, row cache %lld bytes hit %.1f %%, read %.1f rows = %.0f bytes per "
                   "token, stall %.3f ms per token, %lld retries\n", (double)lookups / (double)n_dec, b.cache_bytes,
                   100.0 * hit, (double)(b.rows_read - a.rows_read) / (double)n_dec,
                   (double)(b.bytes_read - a.bytes_read) / (double)n_dec, (b.stall_s - a.stall_s) * 1e3 / (double)n_dec,
                   b.retries - a.retries);
        if (b.mode == DS41_ENGRAM_PREFETCH)
            printf("engram step timeline, ms per token: issue %.3f (dedup, cached rows, submission), layers until the "
                   "first Engram layer's wait %.3f, waits %.3f\n", (b.issue_s - a.issue_s) * 1e3 / (double)n_dec,
                   (b.lead_s - a.lead_s) * 1e3 / (double)n_dec, (b.stall_s - a.stall_s) * 1e3 / (double)n_dec);
        printf("storage: %.0f bytes read per token (/proc/self/io), %.3f major faults per token, peak RSS %ld KiB\n",
               disk_pt, (double)(mf1 - mf0) / (double)n_dec, ru.ru_maxrss);
    }
    rc = 0;
out:
    free(step);
    ds41_session_close(s);
    ds41_unload(e);
    free(ids);
    return rc;
}
