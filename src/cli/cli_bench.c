/* ds41 bench: prefill throughput (ced and full) at several prompt lengths, decode throughput,
 * peak RSS and state bytes; a table, or one JSON object with --json. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cli.h"
#include "cli_args.h"
#include "cli_bench_settle.h"
#include "cli_progress.h"
#include "cli_spec.h"
#include "ds41.h"
#include "spec.h"
#include "kernels.h"

static const char *BENCH_USAGE =
    "usage: ds41 bench -m DIR [options]\n"
    "  -m, --model DIR     checkpoint directory\n"
    "  --lengths LIST      prompt lengths (default 64,256,1024, capped by the context)\n"
    "  --modes LIST        prefill modes to time (default ced,full)\n"
    "  --decode N          decode steps timed after the longest prompt (default 16)\n"
    "  -t, --threads N     fast-mode threads (default 1)\n"
    "  -c, --ctx-size N    context size (default: longest prompt + decode)\n"
    "  --exact             exact kernels\n"
    "  --seed S            seed of the random prompt ids (default 1)\n"
    "  --json              machine-readable output\n"
    "  --load mmap|copy    weights mmap'd (default) or copied into anonymous memory; --readahead\n"
    "  --profile           after the decode, the same decode again with the breakdown timers on:\n"
    "                      where a step's time goes (weight streams per format with bytes, GB/s and\n"
    "                      the share of a read-bandwidth probe; attention, indexer, compressor, mHC,\n"
    "                      norms, router, MoE glue, Engram, head, sampling, the rest), and whether the\n"
    "                      two decodes' states are identical\n"
    "  --settle auto|always|never  before loading, write back, evict and re-read the shards, so that\n"
    "                      a checkpoint written minutes ago is measured in its steady state (auto:\n"
    "                      when a shard is younger than 10 minutes); prints the state measured\n"
    DS41_CLI_ENGRAM_USAGE
    "  --routing-counts FILE  write how many (token, choice) pairs the router sent to each routed\n"
    "                      expert over the run, per MoE layer (\"LAYER EXPERT COUNT\" lines): ds41 inspect\n"
    "                      --ranks N --expert-map-from FILE --write-expert-map MAP builds a balanced\n"
    "                      --expert-map from them (docs/distributed.md)\n"
    "  --spec              speculative-decoding section: plain vs --spec fixed:1..B / auto / auto\n"
    "                      without P5 reuse (greedy), acceptance, scheduler choices, the verify-width\n"
    "                      curve (also cached for ds41 run --spec auto)\n"
    "  --spec-prompt TEXT  its prompt (tokenized with DIR/tokenizer.json; default random ids)\n"
    "  --spec-n N          tokens generated per spec run (default 64)\n"
    "  --spec-rounds R     rounds of every mode, interleaved (plain, fixed:1..B, auto, ... then\n"
    "                      again); medians of tokens/s and of each round's ratio to plain (default 3)\n"
    "  --spec-curve        only measure and cache the verify-width curve, print it and exit\n"
    "  --batch LIST        only the batched-decode section: for each B in LIST, B sessions after a\n"
    "                      prompt of the longest --lengths entry (different ids each) decode --decode\n"
    "                      greedy steps together through ds41_batch_step (one forward per step), in\n"
    "                      3 rounds with the sizes interleaved; median step time, aggregate tokens/s\n"
    "                      and its ratio to the first size (list 1 first)\n"
    "  --synthetic-context LIST, --ablate p1,p2,p3: long-context decode and the performance points\n"
    "                      on/off (ds41 bench --synthetic-context 4096 --help)\n"
    "  --engram            Engram placement: decode on a text with the tables in RAM, mmap'd or\n"
    "                      prefetched (ds41 bench --engram --help; docs/engram-offram.md)\n"
    "  --configs           one request under the four configurations (CED and CSA2 on/off;\n"
    "                      ds41 bench --configs --help)\n\n"
    "Examples:\n"
    "  ds41 bench -m models/demo                                  # prefill ced vs full, decode, RSS, state\n"
    "  ds41 bench -m models/demo --batch 1,4,16 --lengths 32      # batched decode\n"
    "  ds41 bench -m models/demo --spec -t 1                      # speculative decoding costs\n";

static long long peak_rss_bytes(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (long long)ru.ru_maxrss * 1024;
}

/* --batch: for each B of bs, B sessions (a different prompt each) decoding together, one
 * ds41_batch_step per step; BENCH_ROUNDS rounds of `steps` steps, the B values interleaved in
 * each round (so a change of the machine's load hits them alike), the median step time. */
#define BENCH_ROUNDS 3
/* dt[0] wall seconds, dt[1] CPU seconds of the process (all threads) */
static int one_step(ds41_session **ss, ds41_batch_item *it, int32_t *tok, int B, double *dt) {
    for (int i = 0; i < B; i++) {
        tok[i] = (int32_t)ds41_session_sample(ss[i]);
        memset(&it[i], 0, sizeof it[i]);
        it[i].s = ss[i];
        it[i].ids = &tok[i];
        it[i].n = 1;
    }
    double t0 = ds41_cli_now(), c0 = ds41_cli_cpu_process();
    int f = ds41_batch_step(it, B);
    if (dt) { dt[0] = ds41_cli_now() - t0; dt[1] = ds41_cli_cpu_process() - c0; }
    if (f) fprintf(stderr, "ds41 bench: %s\n", ds41_session_error(ss[0]));
    return f ? 1 : 0;
}

static int bench_batch(ds41_engine *e, const int32_t *ids, int n_ids, int plen, int steps, const int *bs, int nb,
                       json_t *out) {
    char ebuf[1024];
    int rc = 0, total = 0, bmax = 0;
    for (int bi = 0; bi < nb; bi++) { total += bs[bi]; if (bs[bi] > bmax) bmax = bs[bi]; }
    ds41_session **ss = calloc((size_t)total, sizeof *ss);
    ds41_batch_item *it = calloc((size_t)bmax, sizeof *it);
    int32_t *tok = calloc((size_t)bmax, sizeof *tok), *p = malloc((size_t)plen * sizeof *p);
    size_t nt = (size_t)BENCH_ROUNDS * steps;
    double *dt = calloc((size_t)nb * nt * 2, sizeof *dt), *dw = calloc(nt, sizeof *dw), *dc = calloc(nt, sizeof *dc);
    if (!ss || !it || !tok || !p || !dt || !dw || !dc) rc = 1;
    for (int i = 0; i < total && !rc; i++) {
        if (!(ss[i] = ds41_session_open(e, NULL, ebuf, sizeof ebuf))) { fprintf(stderr, "ds41 bench: %s\n", ebuf); rc = 1; break; }
        for (int j = 0; j < plen; j++) p[j] = ids[(j + 7 * i) % n_ids];   /* a different prompt per session */
        if (ds41_feed(ss[i], p, (size_t)plen)) { fprintf(stderr, "ds41 bench: %s\n", ds41_session_error(ss[i])); rc = 1; }
    }
    for (int bi = 0, o = 0; bi < nb && !rc; o += bs[bi], bi++) rc = one_step(ss + o, it, tok, bs[bi], NULL);   /* warm-up */
    for (int r = 0; r < BENCH_ROUNDS && !rc; r++)
        for (int bi = 0, o = 0; bi < nb && !rc; o += bs[bi], bi++)
            for (int st = 0; st < steps && !rc; st++)
                rc = one_step(ss + o, it, tok, bs[bi], &dt[(((size_t)bi * BENCH_ROUNDS + r) * steps + st) * 2]);
    if (!rc && !out)
        printf("batched decode after %d-token prompts, %d rounds x %d steps per batch size (ds41_batch_step, kernels %s)\n"
               "(wall: the machine's clock; cpu: CPU time of the process, all threads, which a loaded machine does\n"
               "not inflate)\n%8s %12s %12s %8s %12s %12s %8s\n", plen, BENCH_ROUNDS, steps, ds41_kernels_isa(), "sessions",
               "wall ms/step", "wall tok/s", "x first", "cpu ms/step", "cpu tok/s", "x first");
    double w1 = 0, c1 = 0;
    for (int bi = 0; bi < nb && !rc; bi++) {
        int B = bs[bi];
        for (size_t i = 0; i < nt; i++) { dw[i] = dt[((size_t)bi * nt + i) * 2]; dc[i] = dt[((size_t)bi * nt + i) * 2 + 1]; }
        qsort(dw, nt, sizeof *dw, ds41_cli_cmp_double);
        qsort(dc, nt, sizeof *dc, ds41_cli_cmp_double);
        double mw = nt % 2 ? dw[nt / 2] : 0.5 * (dw[nt / 2 - 1] + dw[nt / 2]);
        double mc = nt % 2 ? dc[nt / 2] : 0.5 * (dc[nt / 2 - 1] + dc[nt / 2]);
        double tw = B / mw, tc = B / mc;
        if (bi == 0) { w1 = tw; c1 = tc; }   /* the first entry (B = 1 when listed first) */
        if (out)
            json_array_append_new(out, json_pack("{s:i,s:i,s:i,s:f,s:f,s:f,s:f,s:f,s:f}", "sessions", B, "prompt", plen,
                                                 "steps", (int)nt, "step_s_median", mw, "tokens_per_s", tw, "ratio_to_first",
                                                 tw / w1, "cpu_step_s_median", mc, "cpu_tokens_per_s", tc,
                                                 "cpu_ratio_to_first", tc / c1));
        else
            printf("%8d %12.2f %12.2f %8.2f %12.2f %12.2f %8.2f\n", B, mw * 1e3, tw, tw / w1, mc * 1e3, tc, tc / c1);
    }
    for (int i = 0; i < total && ss; i++) ds41_session_close(ss[i]);
    free(ss); free(it); free(tok); free(p); free(dt); free(dw); free(dc);
    return rc;
}

/* One decode of n_dec greedy steps after the n-token prompt in a fresh session, with the
 * breakdown timers on when bd != NULL (added into *bd). Its tokens/s and state digest. */
static int decode_once(ds41_engine *e, const int32_t *ids, int n, int n_dec, ds41_breakdown *bd, double *tps,
                       uint64_t *dg) {
    char ebuf[1024];
    ds41_session *s = ds41_session_open(e, NULL, ebuf, sizeof ebuf);
    if (!s || ds41_feed(s, ids, (size_t)n)) {
        fprintf(stderr, "ds41 bench: --profile: decode setup failed\n");
        ds41_session_close(s);
        return 1;
    }
    if (bd && ds41_engine_breakdown_start(e)) { fprintf(stderr, "ds41 bench: --profile: out of memory\n"); ds41_session_close(s); return 1; }
    int rc = 0;
    double t0 = ds41_cli_now();
    for (int i = 0; i < n_dec && !rc; i++) {
        int32_t t = ds41_session_sample(s);
        if (ds41_feed(s, &t, 1)) { fprintf(stderr, "ds41 bench: %s\n", ds41_session_error(s)); rc = 1; }
    }
    double wall = ds41_cli_now() - t0;
    if (bd) {
        ds41_breakdown one;
        ds41_engine_breakdown_stop(e, &one);
        for (int i = 0; i < DS41_BREAKDOWN_N; i++) {
            bd->seconds[i] += one.seconds[i];
            bd->bytes[i] += one.bytes[i];
            bd->calls[i] += one.calls[i];
        }
        bd->elapsed += one.elapsed;
        bd->switches += one.switches;
    }
    *tps = n_dec / wall;
    *dg = ds41_session_digest(s);
    ds41_session_close(s);
    return rc;
}

static double median3(double *v) {
    qsort(v, 3, sizeof *v, ds41_cli_cmp_double);
    return v[1];
}

/* --profile: PROFILE_ROUNDS rounds of a plain decode and one with the breakdown timers on
 * (ds41_engine_breakdown_start), each of n_dec steps after the same n-token prompt in a fresh
 * session; the breakdown summed over the timed rounds, the medians of both tokens/s (the
 * timers' overhead), every timed decode's state against the first plain one's. */
#define PROFILE_ROUNDS 3
static int bench_profile(ds41_engine *e, const int32_t *ids, int n, int n_dec, int threads, json_t *root) {
    double bw0 = ds41_engine_read_bandwidth(e);
    ds41_breakdown bd;
    memset(&bd, 0, sizeof bd);
    double tp[PROFILE_ROUNDS], tq[PROFILE_ROUNDS], wall = 0;
    uint64_t plain_digest = 0, dg = 0;
    int same = 1;
    for (int r = 0; r < PROFILE_ROUNDS; r++) {
        uint64_t d0, d1;
        if (decode_once(e, ids, n, n_dec, NULL, &tp[r], &d0) || decode_once(e, ids, n, n_dec, &bd, &tq[r], &d1)) return 1;
        if (r == 0) plain_digest = d0;
        same &= d0 == plain_digest && d1 == plain_digest;
        dg = d1;
        wall += n_dec / tq[r];
    }
    /* the probe before and after the rounds, the larger: on a shared machine a neighbour's
     * burst lowers one of them */
    double bw1 = ds41_engine_read_bandwidth(e), bw = bw0 > bw1 ? bw0 : bw1;
    n_dec *= PROFILE_ROUNDS;   /* the steps the breakdown covers */
    double plain_tps = median3(tp), tps = median3(tq);
    int rc = 0;
    double sum = 0, sbytes = 0, ssec = 0;
    for (int i = 0; i < DS41_BREAKDOWN_N; i++) {
        sum += bd.seconds[i];
        if (ds41_breakdown_is_stream(i)) { sbytes += bd.bytes[i]; ssec += bd.seconds[i]; }
    }
    double per = 1.0 / n_dec;
    char hex[2][20];
    snprintf(hex[0], sizeof hex[0], "%016llx", (unsigned long long)plain_digest);
    snprintf(hex[1], sizeof hex[1], "%016llx", (unsigned long long)dg);
    if (root) {
        json_t *secs = json_array();
        for (int i = 0; i < DS41_BREAKDOWN_N; i++)
            json_array_append_new(secs, json_pack("{s:s,s:b,s:f,s:I,s:I}", "name", ds41_breakdown_name(i), "stream",
                                                  ds41_breakdown_is_stream(i), "seconds", bd.seconds[i], "bytes",
                                                  (json_int_t)bd.bytes[i], "calls", (json_int_t)bd.calls[i]));
        json_object_set_new(root, "profile",
                            json_pack("{s:i,s:i,s:f,s:f,s:f,s:f,s:f,s:I,s:I,s:s,s:s,s:b,s:o}", "steps", n_dec, "threads",
                                      threads, "wall_s", wall, "elapsed_s", bd.elapsed, "read_bw_gbs", bw, "tokens_per_s",
                                      tps, "tokens_per_s_plain", plain_tps, "weight_bytes_per_step", (json_int_t)(sbytes * per + 0.5),
                                      "switches", (json_int_t)bd.switches, "digest", hex[1], "digest_plain", hex[0],
                                      "identical", same, "sections", secs));
        return same ? rc : 1;
    }
    printf("decode breakdown (--profile): %d steps (%d rounds), the calling thread's wall time per step (-t %d); read "
           "bandwidth probe %.1f GB/s (before %.1f, after %.1f)\n%-12s %9s %7s %10s %8s %8s %7s\n", n_dec, PROFILE_ROUNDS, threads, bw, bw0, bw1, "section", "ms/step", "share",
           "MB/step", "GB/s", "% probe", "calls");
    for (int i = 0; i < DS41_BREAKDOWN_N; i++) {
        if (bd.calls[i] == 0 && i != DS41_BREAKDOWN_REST) continue;
        double ms = bd.seconds[i] * per * 1e3;
        if (ds41_breakdown_is_stream(i)) {
            double g = bd.seconds[i] > 0 ? bd.bytes[i] / bd.seconds[i] / 1e9 : 0;
            printf("%-12s %9.3f %6.1f%% %10.1f %8.1f %7.0f%% %7.0f\n", ds41_breakdown_name(i), ms, 100 * bd.seconds[i] / sum,
                   bd.bytes[i] * per / 1e6, g, bw > 0 ? 100 * g / bw : 0, bd.calls[i] * per);
        } else {
            printf("%-12s %9.3f %6.1f%% %10s %8s %8s %7.0f\n", ds41_breakdown_name(i), ms, 100 * bd.seconds[i] / sum, "", "", "",
                   bd.calls[i] * per);
        }
    }
    double ag = sbytes / sum / 1e9;
    printf("%-12s %9.3f %6.1f%% %10.1f (sections; the loop measured %.3f ms/step)\n", "total", sum * per * 1e3, 100.0,
           sbytes * per / 1e6, wall * per * 1e3);
    printf("weight streams: %.1f %% of the step at %.1f GB/s; the step as a whole %.1f GB/s over the bytes a token "
           "reads = %.0f %% of the probe\n", 100 * ssec / sum, ssec > 0 ? sbytes / ssec / 1e9 : 0, ag,
           bw > 0 ? 100 * ag / bw : 0);
    printf("decode with the timers %.2f tok/s, without %.2f (medians of %d interleaved rounds; %.0f clock reads a step); "
           "state after it %s the plain decode's (digest %s)\n", tps, plain_tps, PROFILE_ROUNDS, bd.switches * per,
           same ? "identical to" : "DIFFERS from", hex[1]);
    return same ? rc : 1;
}

int ds41_cli_bench(int argc, char **argv) {
    const char *dir = NULL;
    int lengths[16] = { 64, 256, 1024 }, n_len = 3, n_dec = 16, threads = 1, exact = 0, json = 0;
    int modes[3] = { DS41_PREFILL_MODE_CED, DS41_PREFILL_MODE_FULL }, n_modes = 2;
    long long ctx = 0;
    unsigned long long seed = 1;
    int spec = 0, spec_curve = 0, spec_n = 64, spec_rounds = 3;   /* --spec section (cli_spec.c) */
    int load = DS41_LOAD_MMAP, readahead = 0;     /* --load, --readahead */
    int settle = DS41_SETTLE_AUTO;                /* --settle */
    int eg_mode = DS41_ENGRAM_AUTO, r;            /* --engram-mode, --engram-cache */
    long long eg_cache = 0;
    const char *spec_prompt = NULL;
    int batch[16], n_batch = 0;
    int profile = 0;                              /* --profile */
    const char *routes = NULL;                    /* --routing-counts (cli_bench_routes.c) */
    /* long-context decode and the performance points on/off: cli_bench_long.c */
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--synthetic-context") || !strcmp(argv[i], "--ablate")) return ds41_cli_bench_long(argc, argv);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--engram")) return ds41_cli_bench_engram(argc, argv);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--configs")) return ds41_cli_bench_configs(argc, argv);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        long long iv;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(BENCH_USAGE, stdout); return 0; }
        else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has) dir = argv[++i];
        else if (!strcmp(a, "--lengths") && has) {
            if ((n_len = ds41_cli_int_list(argv[++i], 1, 1 << 24, lengths, 16)) <= 0) {
                fprintf(stderr, "ds41 bench: --lengths: expected 1 to 16 comma-separated lengths in 1..16777216, got '%.40s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--modes") && has) {
            char *v = argv[++i];
            n_modes = 0;
            for (char *t = strtok(v, ","); t; t = strtok(NULL, ",")) {
                if (n_modes == 3) { fprintf(stderr, "ds41 bench: --modes: at most 3 modes\n"); return 2; }
                if (!strcmp(t, "ced")) modes[n_modes++] = DS41_PREFILL_MODE_CED;
                else if (!strcmp(t, "full")) modes[n_modes++] = DS41_PREFILL_MODE_FULL;
                else if (!strcmp(t, "ced-replay")) modes[n_modes++] = DS41_PREFILL_MODE_REPLAY;
                else { fprintf(stderr, "ds41 bench: unknown mode '%s'\n", t); return 2; }
            }
            if (n_modes == 0) { fprintf(stderr, "ds41 bench: --modes: expected ced, full and/or ced-replay\n"); return 2; }
        } else if (!strcmp(a, "--decode") && has) {
            if (ds41_cli_int("bench", a, argv[++i], 0, 1 << 24, &iv)) return 2;
            n_dec = (int)iv;
        } else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && has) {
            if (ds41_cli_int("bench", a, argv[++i], 1, 256, &iv)) return 2;
            threads = (int)iv;
        } else if ((!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) && has) {
            if (ds41_cli_int("bench", a, argv[++i], 1, INT32_MAX, &ctx)) return 2;
        } else if (!strcmp(a, "--seed") && has) {
            if (ds41_cli_u64("bench", a, argv[++i], &seed)) return 2;
        }
        else if (!strcmp(a, "--exact")) exact = 1;
        else if (!strcmp(a, "--load") && has) {
            if (ds41_parse_load(argv[++i], &load)) { fprintf(stderr, "ds41 bench: --load: expected mmap or copy\n"); return 2; }
        } else if (!strcmp(a, "--readahead")) readahead = 1;
        else if (!strcmp(a, "--settle") && has) {
            if (ds41_cli_parse_settle(argv[++i], &settle)) {
                fprintf(stderr, "ds41 bench: --settle: expected auto, always or never, got '%.40s'\n", argv[i]);
                return 2;
            }
        }
        else if ((r = ds41_cli_engram_arg("bench", argc, argv, &i, &eg_mode, &eg_cache)) != 0) {
            if (r < 0) return 2;
        }
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--profile")) profile = 1;
        else if (!strcmp(a, "--routing-counts") && has) routes = argv[++i];
        else if (!strcmp(a, "--spec")) spec = 1;
        else if (!strcmp(a, "--spec-curve")) spec_curve = 1;
        else if (!strcmp(a, "--spec-prompt") && has) { spec = 1; spec_prompt = argv[++i]; }
        else if (!strcmp(a, "--batch") && has) {
            if ((n_batch = ds41_cli_int_list(argv[++i], 1, 1 << 24, batch, 16)) <= 0) {
                fprintf(stderr, "ds41 bench: --batch: expected 1 to 16 comma-separated session counts, got '%.40s'\n", argv[i]);
                return 2;
            }
        }
        else if (!strcmp(a, "--spec-n") && has) {
            if (ds41_cli_int("bench", a, argv[++i], 1, 1 << 20, &iv)) return 2;
            spec_n = (int)iv;
        }
        else if (!strcmp(a, "--spec-rounds") && has) {
            if (ds41_cli_int("bench", a, argv[++i], 1, 1000, &iv)) return 2;
            spec_rounds = (int)iv;
        }
        else { fprintf(stderr, "ds41 bench: unknown or incomplete option '%s'\n%s", a, BENCH_USAGE); return 2; }
    }
    if (profile && n_batch > 0) {
        fprintf(stderr, "ds41 bench: --profile times the single-session decode; it does not combine with --batch\n");
        return 2;
    }
    if (profile && n_dec < 1) { fprintf(stderr, "ds41 bench: --profile times decode steps: it needs --decode >= 1\n"); return 2; }
    if ((r = ds41_cli_bench_routes_check(routes, spec_curve)) != 0) return r;
    if (!dir) { fprintf(stderr, "ds41 bench: -m DIR is required (a checkpoint directory, e.g. -m models/demo)\n"); return 2; }
    if (ds41_cli_model_dir_ok("bench", dir)) return 1;
    if (ds41_cli_bench_settle(dir, settle, json ? stderr : stdout)) return 1;
    int maxlen = 0;
    for (int i = 0; i < n_len; i++) if (lengths[i] > maxlen) maxlen = lengths[i];
    ds41_load_params lp;
    ds41_load_params_default(&lp);
    lp.exact = exact;
    lp.n_threads = threads;
    lp.load = load;
    lp.readahead = readahead;
    lp.engram_mode = eg_mode;
    lp.engram_cache = eg_cache;
    lp.ctx_size = ctx > 0 ? ctx : maxlen + (n_batch > 0 ? BENCH_ROUNDS * n_dec + 2 : n_dec + 1);
    if (spec && ctx <= 0 && lp.ctx_size < 32 + spec_n + 80) lp.ctx_size = 32 + spec_n + 80;
    char ebuf[1024];
    char plabel[128];
    snprintf(plabel, sizeof plabel, "loading %s", dir);
    ds41_progress *pg = ds41_progress_start(plabel);
    ds41_engine *e = ds41_load(dir, &lp, ebuf, sizeof ebuf);
    ds41_progress_end(pg);
    if (!e && ctx <= 0) {
        /* the model's context may be shorter than asked for: fall back to its maximum */
        lp.ctx_size = 0;
        e = ds41_load(dir, &lp, ebuf, sizeof ebuf);
    }
    if (!e) { fprintf(stderr, "ds41 bench: %s\n", ebuf); return 1; }
    if (ds41_cli_bench_routes_start(e, routes)) { ds41_unload(e); return 1; }
    long long C = ds41_ctx_size(e);
    int V = ds41_vocab_size(e);
    if (spec_curve) {   /* measure and cache the verify-width curve only */
        ds41_spec_curve cv;
        char path[4096];
        int r2 = ds41_spec_calibrate(e, ds41_draft_block_size(e) + 1, 32, 5, &cv, ebuf, sizeof ebuf);
        if (r2) fprintf(stderr, "ds41 bench: %s\n", ebuf);
        else if (ds41_spec_curve_path(dir, threads, exact, path, sizeof path) || ds41_spec_curve_save(path, &cv)) {
            fprintf(stderr, "ds41 bench: cannot write the curve cache file\n");
            r2 = 1;
        } else {
            for (int w = 1; w <= cv.n; w++) printf("width %d: %.2f steps/s (x%.2f of a decode step)\n", w, cv.sps[w], cv.sps[1] / cv.sps[w]);
            if (cv.propose_s > 0)
                printf("proposal: stages %.3f ms (x%.2f of a decode step), %.3f ms per draft taken\n", cv.propose_s * 1e3,
                       cv.propose_s * cv.sps[1], cv.draft_s * 1e3);
            if (cv.flush_s > 0)
                printf("probe: the deferred ring writes %.3f ms (x%.2f), the first probe cold %.3f ms (x%.2f); probes at "
                       "least %d plain steps apart, the first after %d\n", cv.flush_s * 1e3, cv.flush_s * cv.sps[1],
                       cv.cold_s * 1e3, cv.cold_s * cv.sps[1], ds41_spec_probe_floor(&cv, 0), ds41_spec_probe_floor(&cv, 1));
            printf("cached in %s\n", path);
        }
        ds41_unload(e);
        return r2;
    }
    /* measuring nothing is an error, not an empty table with exit status 0 */
    int minlen = lengths[0];
    for (int i = 1; i < n_len; i++) if (lengths[i] < minlen) minlen = lengths[i];
    if (minlen > C) {
        fprintf(stderr, "ds41 bench: no --lengths entry fits the context size %lld (shortest %d)\n", C, minlen);
        ds41_unload(e);
        return 1;
    }
    if (n_dec > 0 && C < (long long)n_dec + 2) {
        fprintf(stderr, "ds41 bench: --decode %d needs a context of at least %d tokens, the context size is %lld\n", n_dec,
                n_dec + 2, C);
        ds41_unload(e);
        return 1;
    }
    int32_t *ids = malloc((size_t)(maxlen + n_dec + 1) * sizeof(int32_t));
    if (!ids) { ds41_unload(e); return 1; }
    uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (int i = 0; i < maxlen + n_dec + 1; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        ids[i] = (int32_t)(x % (uint64_t)V);
    }
    /* warm-up: touch the mapped weights once so the first timed run does not pay page faults */
    {
        ds41_session *w = ds41_session_open(e, NULL, ebuf, sizeof ebuf);
        int wn = lengths[0] < 8 ? lengths[0] : 8;
        if (w && wn <= C) (void)ds41_feed(w, ids, (size_t)wn);
        ds41_session_close(w);
    }
    if (n_batch > 0) {   /* the batched-decode section only */
        int plen = maxlen > C - BENCH_ROUNDS * n_dec - 2 ? (int)(C - BENCH_ROUNDS * n_dec - 2) : maxlen;
        json_t *bj = json ? json_array() : NULL;
        int rb = plen < 1 || n_dec < 1 ? 1 : bench_batch(e, ids, maxlen + n_dec + 1, plen, n_dec, batch, n_batch, bj);
        if (plen < 1 || n_dec < 1) fprintf(stderr, "ds41 bench: --batch needs --decode >= 1 and a prompt that fits\n");
        if (bj) {
            json_t *r = json_pack("{s:o,s:i,s:b,s:s}", "batch", bj, "threads", threads, "exact", exact, "isa", ds41_kernels_isa());
            char *line = json_dumps(r, JSON_COMPACT | JSON_REAL_PRECISION(6));
            if (line) { puts(line); free(line); }
            json_decref(r);
        }
        free(ids);
        if (!rb) rb = ds41_cli_bench_routes_write(e, routes, dir);
        ds41_unload(e);
        return rb;
    }
    json_t *root = json_object(), *pre = json_array();
    if (!json) printf("kernels: %s, fast ISA path %s, FP8 decode %s, FP4 prefill products %s\n%-10s %8s %12s %10s %14s\n", exact ? "exact" : "fast", ds41_kernels_isa(), ds41_kernels_fp8_decode(), ds41_kernels_fp4_products(), "mode", "tokens", "prefill tok/s", "seconds", "state bytes");
    ds41_state_info last_state;
    memset(&last_state, 0, sizeof last_state);
    double t_mode[3][16];
    int rc = 0;
    for (int li = 0; li < n_len && !rc; li++) {
        int n = lengths[li];
        if (n > C) { fprintf(stderr, "ds41 bench: length %d exceeds the context %lld; skipped\n", n, C); continue; }
        for (int mi = 0; mi < n_modes; mi++) {
            ds41_session_params sp;
            ds41_session_params_default(&sp);
            sp.prefill = modes[mi];
            ds41_session *s = ds41_session_open(e, &sp, ebuf, sizeof ebuf);
            if (!s) { fprintf(stderr, "ds41 bench: %s\n", ebuf); rc = 1; break; }
            double t0 = ds41_cli_now();
            if (ds41_feed(s, ids, (size_t)n)) { fprintf(stderr, "ds41 bench: %s\n", ds41_session_error(s)); rc = 1; }
            double dt = ds41_cli_now() - t0;
            t_mode[mi][li] = dt;
            ds41_state_info si;
            ds41_session_state(s, &si);
            const char *mn = modes[mi] == 0 ? "ced" : modes[mi] == 1 ? "full" : "ced-replay";
            if (json) {
                json_array_append_new(pre, json_pack("{s:s,s:i,s:f,s:f,s:I,s:I}", "mode", mn, "tokens", n, "seconds", dt,
                                                     "tokens_per_s", n / dt, "state_bytes", (json_int_t)si.total_bytes,
                                                     "global_kv_bytes", (json_int_t)si.global_kv_bytes));
            } else {
                printf("%-10s %8d %12.1f %10.3f %14lld\n", mn, n, n / dt, dt, si.total_bytes);
            }
            fflush(stdout);
            ds41_session_close(s);
        }
        if (!rc && !json && n_modes >= 2 && modes[0] == DS41_PREFILL_MODE_CED && modes[1] == DS41_PREFILL_MODE_FULL)
            printf("%-10s %8d %12.3f\n", "ced/full", n, t_mode[0][li] / t_mode[1][li]);
    }
    /* decode after the longest prompt that fits */
    int n = maxlen > C - n_dec - 1 ? (int)(C - n_dec - 1) : maxlen;
    double dtok = 0;
    uint64_t dec_digest = 0;
    if (!rc && n_dec > 0 && n > 0) {
        ds41_session *s = ds41_session_open(e, NULL, ebuf, sizeof ebuf);
        if (!s || ds41_feed(s, ids, (size_t)n)) { fprintf(stderr, "ds41 bench: decode setup failed\n"); rc = 1; }
        else {
            double t0 = ds41_cli_now();
            for (int i = 0; i < n_dec && !rc; i++) {
                int32_t t = ds41_session_sample(s);
                if (ds41_feed(s, &t, 1)) { fprintf(stderr, "ds41 bench: %s\n", ds41_session_error(s)); rc = 1; }
            }
            double dt = ds41_cli_now() - t0;
            dtok = n_dec / dt;
            ds41_session_state(s, &last_state);
            dec_digest = ds41_session_digest(s);
            if (!json) printf("decode after %d tokens: %d steps, %.2f tok/s\n", n, n_dec, dtok);
        }
        ds41_session_close(s);
        if (!rc && profile) rc = bench_profile(e, ids, n, n_dec, threads, json ? root : NULL);
    }
    if (!rc && spec)
        rc = ds41_cli_bench_spec(e, dir, threads, exact, spec_prompt, ids, maxlen < 32 ? maxlen : 32, spec_n,
                                 spec_rounds, json ? (void *)root : NULL);
    long long rss = peak_rss_bytes();
    if (json) {
        json_object_set_new(root, "prefill", pre);
        char dhex[20];
        snprintf(dhex, sizeof dhex, "%016llx", (unsigned long long)dec_digest);
        json_object_set_new(root, "decode", json_pack("{s:i,s:i,s:f,s:s}", "context", n, "steps", n_dec, "tokens_per_s", dtok,
                                                      "digest", dhex));
        json_object_set_new(root, "peak_rss_bytes", json_integer(rss));
        json_object_set_new(root, "state", json_pack("{s:I,s:I,s:f,s:I}", "tokens", (json_int_t)last_state.tokens,
                                                     "global_kv_bytes", (json_int_t)last_state.global_kv_bytes,
                                                     "global_kv_bytes_per_token", last_state.global_kv_bytes_per_token,
                                                     "total_bytes", (json_int_t)last_state.total_bytes));
        json_object_set_new(root, "threads", json_integer(threads));
        json_object_set_new(root, "exact", json_boolean(exact));
        ds41_engram_stats eg;
        ds41_engram_get_stats(e, &eg);
        if (eg.table_bytes > 0)
            json_object_set_new(root, "engram", json_pack("{s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:f}", "mode",
                                                          ds41_engram_mode_name(eg.mode), "table_bytes", (json_int_t)eg.table_bytes,
                                                          "cache_bytes", (json_int_t)eg.cache_bytes, "lookups", (json_int_t)eg.lookups,
                                                          "hits", (json_int_t)eg.hits, "bytes_read", (json_int_t)eg.bytes_read,
                                                          "steps", (json_int_t)eg.steps, "stall_s", eg.stall_s,
                                                          "stall_max_s", eg.stall_max_s));
        char *line = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(6));
        if (line) { puts(line); free(line); }
    } else {
        json_decref(pre);
        printf("peak RSS %.1f MiB; state after decode: %lld B total, global KV %lld B (%.1f B/token)\n", rss / 1048576.0,
               last_state.total_bytes, last_state.global_kv_bytes, last_state.global_kv_bytes_per_token);
        long long br[5];
        ds41_kernels_bf16_road(br);
        if (br[0] + br[1] > 0)
            printf("BF16 linears on vdpbf16ps: %lld token tiles; sent to the FMA road: %lld tiles by their activations, "
                   "%lld items / panels by their weights\n", br[0], br[1], br[2]);
        if (br[3] + br[4] > 0)
            printf("FP8 linears on vdpbf16ps: %lld token tiles; %lld sent to the FMA road by their scales or activations\n",
                   br[3], br[4]);
        ds41_engram_stats eg;
        ds41_engram_get_stats(e, &eg);
        if (eg.mode == DS41_ENGRAM_PREFETCH)
            printf("engram prefetch (%s): %lld steps, %lld distinct rows, row cache hit rate %.1f %% (%lld bytes), "
                   "%lld bytes read from disk, stall %.3f ms per step (worst %.3f ms)\n", eg.uring ? "io_uring" : "pread",
                   eg.steps, eg.lookups, eg.lookups ? 100.0 * (double)eg.hits / (double)eg.lookups : 0.0, eg.cache_bytes,
                   eg.bytes_read, eg.steps ? eg.stall_s * 1e3 / (double)eg.steps : 0.0, eg.stall_max_s * 1e3);
        else if (eg.table_bytes > 0)
            printf("engram tables %lld bytes, %s\n", eg.table_bytes, ds41_engram_mode_name(eg.mode));
    }
    json_decref(root);
    free(ids);
    if (!rc) rc = ds41_cli_bench_routes_write(e, routes, dir);
    ds41_unload(e);
    return rc;
}
