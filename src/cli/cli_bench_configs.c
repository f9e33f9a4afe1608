/* ds41 bench --configs: one request (a prompt of -p tokens, then -n greedy decode steps) under
 * the four configurations of shared/spec/deployment-points.md: neither CED nor CSA2, CED only,
 * CSA2 only, both. CED off is the full prefill; CSA2 off is the cost-faithful twin of
 * src/engine/twin.c (every compressed layer computes and holds its own KV; its costs are the
 * model's, its numbers are not). Per configuration: prefill seconds and tokens/s, decode
 * tokens/s, the global KV held at the end, the bytes a persistent prefix cache keeps (a
 * full-state cache, all layers' KV and windows, without CSA2 or CED; ds41's prefix store, the
 * global KV pages of whole 128-token blocks, with both), the peak RSS of the configuration
 * (VmHWM, reset before each), and the ratios to the first row. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli.h"
#include "cli_args.h"
#include "dist_pipe.h"
#include "ds41.h"
#include "kernels.h"

static const char *USAGE =
    "usage: ds41 bench --configs -m DIR [options]\n"
    "  -m, --model DIR     checkpoint directory\n"
    "  -p, --prompt N      prompt tokens (pseudo-random ids; default 30000)\n"
    "  -n N                greedy decode steps after the prompt (default 1000)\n"
    "  -t, --threads N     fast-mode threads (default 1)\n"
    "  --exact             exact kernels\n"
    "  --seed S            seed of the prompt ids (default 1)\n"
    "  --json              one JSON object (with the prompt ids and each configuration's tokens)\n\n"
    "The four rows: neither CED nor CSA2, CED only, CSA2 only, both. Without CED the prefill runs\n"
    "every layer on every row; without CSA2 a cost-faithful twin runs in which every layer that\n"
    "reuses or reindexes another layer's KV computes and holds its own (with the source layer's\n"
    "weights): its costs are a model's without the sharing, its numbers are not a model's.\n"
    "Example:\n"
    "  ds41 bench --configs -m DIR -p 30000 -n 1000 -t 2\n";

enum { N_CONF = 4 };
static const char *CONF_NAME[N_CONF] = { "neither", "CED only", "CSA2 only", "CED + CSA2" };
static const int CONF_CED[N_CONF] = { 0, 1, 0, 1 }, CONF_CSA2[N_CONF] = { 0, 0, 1, 1 };

typedef struct conf_result {
    double prefill_s, decode_s;
    long long kv_bytes, state_bytes, prefix_bytes, rss;
    double kv_per_token;
    int rss_own;              /* rss is this configuration's peak (VmHWM reset), not the process's */
    int32_t *tokens;          /* the decoded ids */
} conf_result;

/* The peak RSS starts again from the current RSS (Linux: clear_refs 5); 0 when it could. */
static int rss_peak_reset(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return -1;
    int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* VmHWM of /proc/self/status in bytes (the process's ru_maxrss when unreadable) */
static long long rss_peak(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = strtoll(line + 6, NULL, 10);
    if (f) fclose(f);
    if (kb < 0) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        kb = ru.ru_maxrss;
    }
    return kb * 1024;
}

/* One configuration: the prompt, n_dec greedy steps, the state and what a prefix cache keeps. */
static int run_conf(ds41_engine *e, int c, const int32_t *prompt, int n, int n_dec, conf_result *r) {
    char ebuf[1024];
    if (ds41_engine_set_csa2_twin(e, !CONF_CSA2[c], ebuf, sizeof ebuf)) { fprintf(stderr, "ds41 bench: %s\n", ebuf); return 1; }
    r->rss_own = rss_peak_reset() == 0;
    ds41_session_params sp;
    ds41_session_params_default(&sp);
    sp.prefill = CONF_CED[c] ? DS41_PREFILL_MODE_CED : DS41_PREFILL_MODE_FULL;
    ds41_session *s = ds41_session_open(e, &sp, ebuf, sizeof ebuf);
    if (!s) { fprintf(stderr, "ds41 bench: %s\n", ebuf); return 1; }
    int32_t *all = malloc(((size_t)n + n_dec + 1) * sizeof *all);
    r->tokens = malloc(((size_t)n_dec + 1) * sizeof *r->tokens);
    int rc = !all || !r->tokens;
    if (!rc) memcpy(all, prompt, (size_t)n * sizeof *all);
    double t0 = ds41_cli_now();
    if (!rc && ds41_feed(s, prompt, (size_t)n)) rc = 1;
    r->prefill_s = ds41_cli_now() - t0;
    t0 = ds41_cli_now();
    for (int i = 0; i < n_dec && !rc; i++) {
        int32_t t = ds41_session_sample(s);
        r->tokens[i] = all[n + i] = t;
        if (ds41_feed(s, &t, 1)) rc = 1;
    }
    r->decode_s = ds41_cli_now() - t0;
    if (rc) fprintf(stderr, "ds41 bench: %s: %s\n", CONF_NAME[c], all && r->tokens ? ds41_session_error(s) : "out of memory");
    ds41_state_info si;
    ds41_session_state(s, &si);
    r->kv_bytes = si.global_kv_bytes;
    r->kv_per_token = si.global_kv_bytes_per_token;
    /* a full-state cache: every layer's KV, the windows, the compressor state, the history */
    r->state_bytes = si.global_kv_bytes + si.swa_bytes + si.dspark_ring_bytes + si.compressor_bytes + si.engram_bytes;
    r->prefix_bytes = r->state_bytes;
    if (!rc && CONF_CED[c] && CONF_CSA2[c]) {
        /* ds41's prefix store: what publishing the request's tokens leaves in it */
        ds41_prefix_params pp;
        memset(&pp, 0, sizeof pp);
        pp.mem_bytes = 1LL << 40;
        ds41_prefix_cache *pc = ds41_prefix_open(e, &pp, ebuf, sizeof ebuf);
        ds41_prefix_stats st;
        if (!pc || ds41_prefix_publish(pc, s, all, (size_t)n + n_dec) < 0) {
            fprintf(stderr, "ds41 bench: prefix cache: %s\n", pc ? ds41_session_error(s) : ebuf);
            rc = 1;
        } else {
            ds41_prefix_get_stats(pc, &st);
            r->prefix_bytes = st.bytes;
        }
        ds41_prefix_close(pc);
    }
    r->rss = rss_peak();
    ds41_session_close(s);
    free(all);
    return rc;
}

static void print_table(const conf_result *r, int n, int n_dec, int threads, int exact) {
    printf("four configurations: %d prompt tokens, %d decoded (greedy), kernels %s (%s), %d thread%s\n", n, n_dec,
           exact ? "exact" : "fast", ds41_kernels_isa(), threads, threads == 1 ? "" : "s");
    printf("%-11s %10s %13s %12s %14s %10s %16s %12s\n", "config", "prefill s", "prefill tok/s", "decode tok/s",
           "KV held B", "KV B/tok", "prefix cache B", "peak RSS MiB");
    for (int c = 0; c < N_CONF; c++)
        printf("%-11s %10.3f %13.1f %12.2f %14lld %10.1f %16lld %12.1f\n", CONF_NAME[c], r[c].prefill_s, n / r[c].prefill_s,
               n_dec / r[c].decode_s, r[c].kv_bytes, r[c].kv_per_token, r[c].prefix_bytes, r[c].rss / 1048576.0);
    printf("ratio to the first row\n%-11s %10s %13s %12s %14s %10s %16s %12s\n", "config", "prefill s", "prefill tok/s",
           "decode tok/s", "KV held", "KV B/tok", "prefix cache", "peak RSS");
    for (int c = 0; c < N_CONF; c++)
        printf("%-11s %10.3f %13.3f %12.3f %14.3f %10.3f %16.3f %12.3f\n", CONF_NAME[c], r[c].prefill_s / r[0].prefill_s,
               r[0].prefill_s / r[c].prefill_s, r[0].decode_s / r[c].decode_s, (double)r[c].kv_bytes / (double)r[0].kv_bytes,
               r[c].kv_per_token / r[0].kv_per_token, (double)r[c].prefix_bytes / (double)r[0].prefix_bytes,
               (double)r[c].rss / (double)r[0].rss);
    printf("without CSA2: a cost-faithful twin, every layer that reuses or reindexes another layer's KV computes and\n"
           "  holds its own with the source layer's weights (decoder layers from the encoder output, as CED needs):\n"
           "  its costs are a model's without the sharing, its numbers (tokens) are not a model's\n"
           "prefix cache: without CSA2 or CED a full-state cache (all layers' KV, windows, compressor state);\n"
           "  CED + CSA2 ds41's prefix store after publishing the request (global KV pages of whole 128-token blocks)\n");
    if (!r[0].rss_own) printf("peak RSS: the process's (VmHWM could not be reset per configuration)\n");
}

static json_t *ids_json(const int32_t *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

static void print_json(const conf_result *r, const int32_t *prompt, int n, int n_dec, int threads, int exact) {
    json_t *root = json_pack("{s:i,s:i,s:i,s:b,s:s}", "prompt", n, "decode", n_dec, "threads", threads, "exact", exact,
                             "isa", ds41_kernels_isa());
    json_t *rows = json_array();
    for (int c = 0; c < N_CONF; c++) {
        json_t *o = json_pack("{s:s,s:b,s:b,s:b,s:f,s:f,s:f,s:I,s:f,s:I,s:I,s:s,s:I,s:b}", "config", CONF_NAME[c], "ced",
                              CONF_CED[c], "csa2", CONF_CSA2[c], "twin", !CONF_CSA2[c], "prefill_s", r[c].prefill_s,
                              "prefill_tokens_per_s", n / r[c].prefill_s, "decode_tokens_per_s", n_dec / r[c].decode_s,
                              "kv_bytes", (json_int_t)r[c].kv_bytes, "kv_bytes_per_token", r[c].kv_per_token,
                              "state_bytes", (json_int_t)r[c].state_bytes, "prefix_bytes", (json_int_t)r[c].prefix_bytes,
                              "prefix_kind", CONF_CED[c] && CONF_CSA2[c] ? "store" : "full-state",
                              "peak_rss_bytes", (json_int_t)r[c].rss, "peak_rss_own", r[c].rss_own);
        json_object_set_new(o, "ratio", json_pack("{s:f,s:f,s:f,s:f,s:f}", "prefill_s", r[c].prefill_s / r[0].prefill_s,
                                                  "decode_tokens_per_s", r[0].decode_s / r[c].decode_s, "kv_bytes",
                                                  (double)r[c].kv_bytes / (double)r[0].kv_bytes, "prefix_bytes",
                                                  (double)r[c].prefix_bytes / (double)r[0].prefix_bytes, "peak_rss",
                                                  (double)r[c].rss / (double)r[0].rss));
        json_object_set_new(o, "tokens", ids_json(r[c].tokens, n_dec));
        json_array_append_new(rows, o);
    }
    json_object_set_new(root, "configs", rows);
    json_object_set_new(root, "prompt_ids", ids_json(prompt, n));
    char *line = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(6));
    if (line) { puts(line); free(line); }
    json_decref(root);
}

int ds41_cli_bench_configs(int argc, char **argv) {
    const char *dir = NULL;
    long long n = 30000, n_dec = 1000, iv;
    int threads = 1, exact = 0, json = 0;
    unsigned long long seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(USAGE, stdout); return 0; }
        else if (!strcmp(a, "--configs")) continue;
        else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has) dir = argv[++i];
        else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && has) { if (ds41_cli_int("bench", a, argv[++i], 2, 1 << 24, &n)) return 2; }
        else if (!strcmp(a, "-n") && has) { if (ds41_cli_int("bench", a, argv[++i], 1, 1 << 24, &n_dec)) return 2; }
        else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && has) {
            if (ds41_cli_int("bench", a, argv[++i], 1, 256, &iv)) return 2;
            threads = (int)iv;
        } else if (!strcmp(a, "--seed") && has) { if (ds41_cli_u64("bench", a, argv[++i], &seed)) return 2; }
        else if (!strcmp(a, "--exact")) exact = 1;
        else if (!strcmp(a, "--json")) json = 1;
        else { fprintf(stderr, "ds41 bench --configs: unknown or incomplete option '%s'\n%s", a, USAGE); return 2; }
    }
    if (!dir) { fprintf(stderr, "ds41 bench --configs: -m DIR is required (a checkpoint directory)\n"); return 2; }
    if (ds41_pipe_on()) {   /* the stages follow the checkpoint's KV sources, which the twin's plan changes */
        fprintf(stderr, "ds41 bench --configs: not with --split layers (the CSA2-less twin has other KV sources than "
                        "the stages were cut at)\n");
        return 2;
    }
    if (ds41_cli_model_dir_ok("bench", dir)) return 1;
    ds41_load_params lp;
    ds41_load_params_default(&lp);
    lp.exact = exact;
    lp.n_threads = threads;
    lp.ctx_size = n + n_dec + 1;
    char ebuf[1024];
    ds41_engine *e = ds41_load(dir, &lp, ebuf, sizeof ebuf);
    if (!e) { fprintf(stderr, "ds41 bench: %s\n", ebuf); return 1; }
    int V = ds41_vocab_size(e);
    int32_t *prompt = malloc((size_t)n * sizeof *prompt);
    conf_result r[N_CONF];
    memset(r, 0, sizeof r);
    int rc = !prompt;
    uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;   /* the ids of ds41 bench's prefill section */
    for (long long i = 0; i < n && !rc; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        prompt[i] = (int32_t)(x % (uint64_t)V);
    }
    /* warm-up: touch the mapped weights once so the first row does not pay the page faults */
    ds41_session *w = rc ? NULL : ds41_session_open(e, NULL, ebuf, sizeof ebuf);
    if (w) (void)ds41_feed(w, prompt, n < 8 ? (size_t)n : 8);
    ds41_session_close(w);
    for (int c = 0; c < N_CONF && !rc; c++) {
        rc = run_conf(e, c, prompt, (int)n, (int)n_dec, &r[c]);
        /* each row on stderr as it ends: a run of an hour or more keeps what it measured if stopped */
        if (!rc)
            fprintf(stderr, "ds41 bench --configs: %s: prefill %.3f s (%.1f tok/s), decode %.2f tok/s, KV %lld B, "
                            "prefix cache %lld B, peak RSS %.1f MiB\n", CONF_NAME[c], r[c].prefill_s,
                    n / r[c].prefill_s, n_dec / r[c].decode_s, r[c].kv_bytes, r[c].prefix_bytes, r[c].rss / 1048576.0);
    }
    if (!rc && json) print_json(r, prompt, (int)n, (int)n_dec, threads, exact);
    else if (!rc) print_table(r, (int)n, (int)n_dec, threads, exact);
    for (int c = 0; c < N_CONF; c++) free(r[c].tokens);
    free(prompt);
    ds41_unload(e);
    return rc;
}
