/* ds41 bench --synthetic-context / --ablate: decode at long context on a synthetic state
 * (ds41_session_synthetic_context) with the per-sublayer timers, and the deployment performance
 * points switched on and off in one process (interleaved rounds, medians). README "Long context
 * and the performance points". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "cli_args.h"
#include "ds41.h"
#include "kernels.h"

static const char *LONG_USAGE =
    "usage: ds41 bench -m DIR --synthetic-context LIST [options]\n"
    "       ds41 bench -m DIR --ablate LIST [options]\n"
    "  --synthetic-context LIST  contexts (tokens) built synthetically: every KV store, ring and the\n"
    "                      compressor state filled with valid packed records of random values, then\n"
    "                      --decode steps timed at each (default 4096)\n"
    "  --ablate LIST       performance points measured on and off: p1,p2,p3,p6 (all: p1,p2,p3,p6); each\n"
    "                      round runs every setting: all on, each listed point off, all listed off\n"
    "  --decode N          decode steps per setting and round (default 4)\n"
    "  --rounds R          interleaved rounds (default 3; medians reported)\n"
    "  --prefill N         also time a real prefill of N random tokens per setting and round (P1)\n"
    "  -t, --threads N     threads (default 1)\n"
    "  --exact             exact kernels\n"
    "  --load mmap|copy    how the weights are held (ds41 run --load)\n"
    "  --readahead         madvise(MADV_WILLNEED) the next layer's weights before each layer\n"
    "  --seed S            seed of the synthetic values and token ids (default 1)\n";

/* "4096,16k,64k" */
/* "all on", or the points a setting turns off ("p2p3 off") */
static void setting_name(unsigned set, char *name, size_t cap) {
    if (!set) snprintf(name, cap, "all on");
    else snprintf(name, cap, "%s%s%s%s off", set & 1 ? "p1" : "", set & 2 ? "p2" : "", set & 4 ? "p3" : "", set & 8 ? "p6" : "");
}

static int parse_ctx_list(const char *s, long long *v, int cap) {
    int n = 0;
    while (*s) {
        char *end;
        long long x = strtoll(s, &end, 10);
        if (end == s || x <= 0) return -1;
        if (*end == 'k' || *end == 'K') { x *= 1024; end++; }
        if (x > (1LL << 30) || n == cap) return -1;
        v[n++] = x;
        if (*end && *end != ',') return -1;
        s = *end ? end + 1 : end;
    }
    return n;
}

#define MAX_SET 8
#define MAX_ROUNDS 64

int ds41_cli_bench_long(int argc, char **argv) {
    const char *dir = NULL, *load = NULL;
    long long ctxs[8] = { 4096 }, iv;
    int n_ctx = 1, n_dec = 4, rounds = 3, threads = 1, exact = 0, prefill = 0, readahead = 0;
    unsigned points = 0;
    int lp_eg_mode = DS41_ENGRAM_AUTO, r;   /* --engram-mode, --engram-cache */
    long long lp_eg_cache = 0;
    unsigned long long seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(LONG_USAGE, stdout); return 0; }
        else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has) dir = argv[++i];
        else if (!strcmp(a, "--synthetic-context") && has) {
            if ((n_ctx = parse_ctx_list(argv[++i], ctxs, 8)) <= 0) {
                fprintf(stderr, "ds41 bench: --synthetic-context: expected 1 to 8 comma-separated token counts, got '%.40s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--ablate") && has) {
            if (ds41_parse_ablate(argv[++i], &points)) {
                fprintf(stderr, "ds41 bench: --ablate: expected a list of p1, p2, p3, p6 (or all), got '%.40s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--decode") && has) {
            if (ds41_cli_int("bench", a, argv[++i], 1, 1 << 20, &iv)) return 2;
            n_dec = (int)iv;
        } else if (!strcmp(a, "--rounds") && has) {
            if (ds41_cli_int("bench", a, argv[++i], 1, MAX_ROUNDS, &iv)) return 2;
            rounds = (int)iv;
        } else if (!strcmp(a, "--prefill") && has) {
            if (ds41_cli_int("bench", a, argv[++i], 1, 1 << 20, &iv)) return 2;
            prefill = (int)iv;
        } else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && has) {
            if (ds41_cli_int("bench", a, argv[++i], 1, 256, &iv)) return 2;
            threads = (int)iv;
        } else if (!strcmp(a, "--seed") && has) {
            if (ds41_cli_u64("bench", a, argv[++i], &seed)) return 2;
        } else if (!strcmp(a, "--load") && has) load = argv[++i];
        else if (!strcmp(a, "--readahead")) readahead = 1;
        else if ((r = ds41_cli_engram_arg("bench", argc, argv, &i, &lp_eg_mode, &lp_eg_cache)) != 0) {
            if (r < 0) return 2;
        }
        else if (!strcmp(a, "--exact")) exact = 1;
        else { fprintf(stderr, "ds41 bench: unknown or incomplete option '%s'\n%s", a, LONG_USAGE); return 2; }
    }
    if (!dir) { fprintf(stderr, "ds41 bench: -m DIR is required\n"); return 2; }

    /* the settings: all on, then each listed point off, then all listed off */
    unsigned set[MAX_SET];
    int n_set = 0;
    set[n_set++] = 0;
    for (int p = 0; p < 4; p++) if (points & (1u << p)) set[n_set++] = 1u << p;
    if (n_set > 2) set[n_set++] = points;

    long long cmax = 0;
    for (int i = 0; i < n_ctx; i++) if (ctxs[i] > cmax) cmax = ctxs[i];
    ds41_load_params lp;
    ds41_load_params_default(&lp);
    lp.exact = exact;
    lp.n_threads = threads;
    lp.ctx_size = cmax + (long long)n_dec * n_set * rounds + prefill + 2;
    lp.readahead = readahead;
    lp.engram_mode = lp_eg_mode;
    lp.engram_cache = lp_eg_cache;
    if (load && ds41_parse_load(load, &lp.load)) {
        fprintf(stderr, "ds41 bench: --load: expected mmap or copy, got '%.40s'\n", load);
        return 2;
    }
    char ebuf[1024];
    double tl = ds41_cli_now();
    ds41_engine *e = ds41_load(dir, &lp, ebuf, sizeof ebuf);
    if (!e) { fprintf(stderr, "ds41 bench: %s\n", ebuf); return 1; }
    tl = ds41_cli_now() - tl;
    int V = ds41_vocab_size(e);
    uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
    int n_ids = prefill > 64 ? prefill : 64;
    int32_t *ids = malloc((size_t)n_ids * sizeof(int32_t));
    if (!ids) { ds41_unload(e); return 1; }
    for (int i = 0; i < n_ids; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        ids[i] = (int32_t)(x % (uint64_t)V);
    }
    printf("kernels: %s, fast ISA path %s (FP8 decode %s), %d thread%s, weights %s (load %.2f s)\n", exact ? "exact" : "fast",
           ds41_kernels_isa(), ds41_kernels_fp8_decode(), threads, threads > 1 ? "s" : "", lp.load == DS41_LOAD_COPY ? "copied" : "mmap'd", tl);
    int rc = 0;
    static double acc[DS41_TIMER_N];
    static double t_dec[MAX_SET][MAX_ROUNDS], t_pre[MAX_SET][MAX_ROUNDS], prof[MAX_SET][DS41_TIMER_N];
    static double c_dec[MAX_SET][MAX_ROUNDS], c_pre[MAX_SET][MAX_ROUNDS];

    /* P1 acts in prefill: time a real prefill of `prefill` tokens per setting, interleaved */
    if (prefill > 0) {
        for (int r = 0; r < rounds && !rc; r++)
            for (int k = 0; k < n_set && !rc; k++) {
                ds41_engine_set_ablate(e, set[k]);
                ds41_session *s = ds41_session_open(e, NULL, ebuf, sizeof ebuf);
                if (!s) { fprintf(stderr, "ds41 bench: %s\n", ebuf); rc = 1; break; }
                memset(acc, 0, sizeof acc);
                ds41_engine_set_profile(e, acc);
                double t0 = ds41_cli_now(), c0 = ds41_cli_cpu_process();
                if (ds41_feed(s, ids, (size_t)prefill)) { fprintf(stderr, "ds41 bench: %s\n", ds41_session_error(s)); rc = 1; }
                t_pre[k][r] = ds41_cli_now() - t0;
                c_pre[k][r] = ds41_cli_cpu_process() - c0;
                ds41_engine_set_profile(e, NULL);
                prof[k][DS41_TIMER_COMPRESS] += acc[DS41_TIMER_COMPRESS];
                ds41_session_close(s);
            }
        if (!rc) {
            printf("prefill %d tokens (%d rounds, medians)\n%-14s %12s %10s %12s %10s %14s\n", prefill, rounds, "setting",
                   "tok/s", "vs on", "CPU s", "CPU vs on", "compressor s");
            double cbase = 0;
            double base = 0;
            for (int k = 0; k < n_set; k++) {
                double m = ds41_cli_median(t_pre[k], rounds), cm = ds41_cli_median(c_pre[k], rounds);
                if (k == 0) { base = m; cbase = cm; }
                char name[32];
                setting_name(set[k], name, sizeof name);
                printf("%-14s %12.2f %10.3f %12.3f %10.3f %14.3f\n", name, prefill / m, m / base, cm, cm / cbase,
                       prof[k][DS41_TIMER_COMPRESS] / rounds);
            }
        }
        memset(prof, 0, sizeof prof);
    }

    for (int c = 0; c < n_ctx && !rc; c++) {
        long long N = ctxs[c];
        ds41_session *s = ds41_session_open(e, NULL, ebuf, sizeof ebuf);
        if (!s) { fprintf(stderr, "ds41 bench: %s\n", ebuf); rc = 1; break; }
        double tb = ds41_cli_now();
        if (ds41_session_synthetic_context(s, N, seed)) {
            fprintf(stderr, "ds41 bench: %s\n", ds41_session_error(s));
            ds41_session_close(s);
            rc = 1;
            break;
        }
        tb = ds41_cli_now() - tb;
        /* one untimed step: first touch of the fresh state and of every layer's weights */
        int di = 0;
        double tf = ds41_cli_now();
        if (ds41_feed(s, &ids[di++ % n_ids], 1)) rc = 1;
        tf = ds41_cli_now() - tf;
        memset(prof, 0, sizeof prof);
        for (int r = 0; r < rounds && !rc; r++)
            for (int k = 0; k < n_set && !rc; k++) {
                ds41_engine_set_ablate(e, set[k]);
                memset(acc, 0, sizeof acc);
                ds41_engine_set_profile(e, acc);
                double t0 = ds41_cli_now(), c0 = ds41_cli_cpu_process();
                for (int i = 0; i < n_dec && !rc; i++)
                    if (ds41_feed(s, &ids[di++ % n_ids], 1)) rc = 1;
                t_dec[k][r] = (ds41_cli_now() - t0) / n_dec;
                c_dec[k][r] = (ds41_cli_cpu_process() - c0) / n_dec;
                ds41_engine_set_profile(e, NULL);
                for (int q = 0; q < DS41_TIMER_N; q++) prof[k][q] += acc[q] / n_dec;
            }
        if (rc) { fprintf(stderr, "ds41 bench: %s\n", ds41_session_error(s)); ds41_session_close(s); break; }
        ds41_state_info si;
        ds41_session_state(s, &si);
        printf("\ncontext %lld (synthetic, built in %.2f s; global KV %.1f MB, %.1f B/token), first (untimed) step %.2f s, "
               "%d steps x %d rounds per setting\n",
               N, tb, si.global_kv_bytes / 1e6, si.global_kv_bytes_per_token, tf, n_dec, rounds);
        printf("%-14s %8s %7s %9s %8s %7s %7s %8s %8s %9s %9s %10s\n", "setting", "tok/s", "vs on", "ms/step", "CPU ms",
               "CPU/on", "attn %", "index %", "sparse %", "sparse ms", "sparse/on", "KV MB/step");
        double base = 0, cbase = 0, sbase = 0;
        for (int k = 0; k < n_set; k++) {
            double m = ds41_cli_median(t_dec[k], rounds), cm = ds41_cli_median(c_dec[k], rounds);
            if (k == 0) { base = m; cbase = cm; }
            char name[32];
            setting_name(set[k], name, sizeof name);
            double step = 0;   /* the mean step the timers saw */
            for (int r = 0; r < rounds; r++) step += t_dec[k][r];
            step /= rounds;
            const double *pf = prof[k];
            double sp = pf[DS41_TIMER_SPARSE] / rounds;
            if (k == 0) sbase = sp;
            printf("%-14s %8.3f %7.3f %9.1f %8.1f %7.3f %7.1f %8.1f %8.1f %9.2f %9.3f %10.2f\n", name, 1.0 / m, m / base,
                   m * 1e3, cm * 1e3, cm / cbase, 100 * pf[DS41_TIMER_ATTN] / rounds / step,
                   100 * pf[DS41_TIMER_INDEXER] / rounds / step, 100 * sp / step, sp * 1e3,
                   sp / sbase, pf[DS41_TIMER_KVBYTES] / rounds / 1e6);
        }
        fflush(stdout);
        ds41_session_close(s);
    }
    ds41_engine_set_ablate(e, 0);
    free(ids);
    ds41_unload(e);
    return rc;
}
