/* ds41 bench-prefix: the prefix cache measured (README "Prefix cache"). Per prompt length:
 * time to first logits of a fresh prefill, of a hit restored from memory with exact and with
 * approx replay, and of an exact hit read from a persistent store (a fresh cache object over
 * the directory, as after a restart); bytes per cached token against what a full-state cache
 * would hold; and the effect of approx replay (max logit difference, greedy agreement over a
 * teacher-forced continuation of the fresh session's greedy tokens). */
#define _GNU_SOURCE
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ftw.h>
#include <unistd.h>

#include "cli.h"
#include "cli_args.h"
#include "ds41.h"

static const char *USAGE =
    "usage: ds41 bench-prefix -m DIR [options]\n"
    "  -m, --model DIR     checkpoint directory\n"
    "  --lengths LIST      prompt lengths (default 2048,8192; whole 128-token blocks are cached)\n"
    "  --continue N        teacher-forced continuation scored for approx replay (default 64)\n"
    "  -t, --threads N     fast-mode threads (default 1)\n"
    "  --exact             exact kernels (then exact hits are also checked bit for bit)\n"
    "  --cache-dir DIR     where the on-disk part writes (default a temporary directory, removed)\n"
    "  --seed S            seed of the random prompt ids (default 1)\n"
    "  --json              one JSON object\n"
    DS41_CLI_ENGRAM_USAGE;

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    remove(path);
    return 0;
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (v[i] > v[b]) b = i;
    return b;
}

static ds41_session *open_s(ds41_engine *e) {
    char eb[512];
    ds41_session *s = ds41_session_open(e, NULL, eb, sizeof eb);
    if (!s) fprintf(stderr, "ds41 bench-prefix: %s\n", eb);
    return s;
}

static ds41_prefix_cache *open_pc(ds41_engine *e, const char *dir, int replay) {
    ds41_prefix_params pp;
    memset(&pp, 0, sizeof pp);
    pp.mem_bytes = 64LL << 30;
    pp.dir = dir;
    pp.replay = replay;
    char eb[512];
    ds41_prefix_cache *pc = ds41_prefix_open(e, &pp, eb, sizeof eb);
    if (!pc) fprintf(stderr, "ds41 bench-prefix: %s\n", eb);
    return pc;
}

/* restore ids into a fresh session of e from pc; the seconds to the first logits */
static double timed_restore(ds41_prefix_cache *pc, ds41_session *s, const int32_t *ids, size_t n, long long *hit) {
    double t0 = ds41_cli_now();
    *hit = ds41_prefix_restore(pc, s, ids, n);
    if (*hit >= 0 && *hit < (long long)n && ds41_feed(s, ids + *hit, n - (size_t)*hit)) *hit = -1;
    return ds41_cli_now() - t0;
}

int ds41_cli_bench_prefix(int argc, char **argv) {
    const char *dir = NULL, *cache_dir = NULL;
    int lengths[16] = { 2048, 8192 }, n_len = 2, threads = 1, exact = 0, json = 0, n_cont = 64;
    unsigned long long seed = 1;
    int eg_mode = DS41_ENGRAM_AUTO, r;   /* --engram-mode, --engram-cache */
    long long eg_cache = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        long long iv;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(USAGE, stdout); return 0; }
        else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has) dir = argv[++i];
        else if (!strcmp(a, "--lengths") && has) {
            if ((n_len = ds41_cli_int_list(argv[++i], 128, 1 << 24, lengths, 16)) < 0) {
                fprintf(stderr, "ds41 bench-prefix: --lengths: expected up to 16 lengths in 128..16777216, got '%.40s'\n", argv[i]);
                return 2;
            }
        }
        else if (!strcmp(a, "--continue") && has) { if (ds41_cli_int("bench-prefix", a, argv[++i], 0, 4096, &iv)) return 2; n_cont = (int)iv; }
        else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && has) { if (ds41_cli_int("bench-prefix", a, argv[++i], 1, 256, &iv)) return 2; threads = (int)iv; }
        else if (!strcmp(a, "--seed") && has) { if (ds41_cli_u64("bench-prefix", a, argv[++i], &seed)) return 2; }
        else if (!strcmp(a, "--cache-dir") && has) cache_dir = argv[++i];
        else if (!strcmp(a, "--exact")) exact = 1;
        else if ((r = ds41_cli_engram_arg("bench-prefix", argc, argv, &i, &eg_mode, &eg_cache)) != 0) {
            if (r < 0) return 2;
        }
        else if (!strcmp(a, "--json")) json = 1;
        else { fprintf(stderr, "ds41 bench-prefix: unknown or incomplete option '%s'\n%s", a, USAGE); return 2; }
    }
    if (!dir) { fprintf(stderr, "ds41 bench-prefix: -m DIR is required\n%s", USAGE); return 2; }
    int maxlen = 0;
    for (int i = 0; i < n_len; i++) if (lengths[i] > maxlen) maxlen = lengths[i];
    ds41_load_params lp;
    ds41_load_params_default(&lp);
    lp.exact = exact;
    lp.n_threads = threads;
    lp.engram_mode = eg_mode;
    lp.engram_cache = eg_cache;
    lp.ctx_size = maxlen + n_cont + 1;
    char eb[1024], tmpl[] = "/tmp/ds41-bench-prefix.XXXXXX";
    ds41_engine *e = ds41_load(dir, &lp, eb, sizeof eb);
    if (!e) { fprintf(stderr, "ds41 bench-prefix: %s\n", eb); return 1; }
    const char *store = cache_dir;
    if (!store && !(store = mkdtemp(tmpl))) { fprintf(stderr, "ds41 bench-prefix: cannot create a temporary directory\n"); ds41_unload(e); return 1; }
    int V = ds41_vocab_size(e), rc = 0;
    json_t *rows = json_array();
    if (!json)
        printf("%-7s %-10s %-10s %-10s %-10s %-8s %-8s %-9s %-11s %-11s %-10s %-9s\n", "tokens", "fresh s", "exact s",
               "approx s", "disk s", "x exact", "x approx", "B/token", "full/prompt", "full/block", "approx dL", "agree");
    for (int li = 0; li < n_len && !rc; li++) {
        int n = lengths[li];
        int32_t *ids = malloc((size_t)(n + n_cont) * sizeof *ids), *cont = ids + n;
        float *l0 = malloc((size_t)V * sizeof(float));
        unsigned long long r = seed * 0x9e3779b97f4a7c15ULL + (unsigned long long)n;
        for (int i = 0; i < n; i++) {
            r = r * 6364136223846793005ULL + 1442695040888963407ULL;
            ids[i] = (int32_t)(2 + (r >> 33) % (unsigned long long)(V - 2));
        }
        ds41_prefix_cache *pe = open_pc(e, NULL, DS41_REPLAY_EXACT), *pa = open_pc(e, NULL, DS41_REPLAY_APPROX);
        ds41_prefix_cache *pd = open_pc(e, store, DS41_REPLAY_EXACT);
        ds41_session *f = open_s(e), *se = open_s(e), *sa = open_s(e), *sd = open_s(e);
        if (!ids || !l0 || !pe || !pa || !pd || !f || !se || !sa || !sd) { rc = 1; goto next; }
        /* fresh */
        double t0 = ds41_cli_now();
        if (ds41_feed(f, ids, (size_t)n)) { fprintf(stderr, "ds41 bench-prefix: %s\n", ds41_session_error(f)); rc = 1; goto next; }
        double t_fresh = ds41_cli_now() - t0;
        memcpy(l0, ds41_logits(f), (size_t)V * sizeof(float));
        ds41_state_info si;
        ds41_session_state(f, &si);
        ds41_prefix_publish(pe, f, ids, (size_t)n);
        ds41_prefix_publish(pa, f, ids, (size_t)n);
        double t1 = ds41_cli_now();
        ds41_prefix_publish(pd, f, ids, (size_t)n);
        ds41_prefix_flush(pd);
        double t_write = ds41_cli_now() - t1;
        ds41_prefix_close(pd);
        pd = open_pc(e, store, DS41_REPLAY_EXACT);   /* as after a restart: nothing in memory */
        long long he, ha, hd;
        double t_exact = timed_restore(pe, se, ids, (size_t)n, &he);
        double t_approx = timed_restore(pa, sa, ids, (size_t)n, &ha);
        double t_disk = pd ? timed_restore(pd, sd, ids, (size_t)n, &hd) : 0;
        if (he < 0 || ha < 0 || !pd || hd < 0) { fprintf(stderr, "ds41 bench-prefix: a restore failed\n"); rc = 1; goto next; }
        int exact_equal = !memcmp(ds41_logits(se), l0, (size_t)V * sizeof(float)) && ds41_session_digest(se) == ds41_session_digest(f);
        int disk_equal = !memcmp(ds41_logits(sd), l0, (size_t)V * sizeof(float));
        double dmax = 0;
        for (int i = 0; i < V; i++) {
            double d = fabs((double)ds41_logits(sa)[i] - l0[i]);
            if (d > dmax) dmax = d;
        }
        /* approx: agreement of its argmax with the fresh session's greedy continuation */
        int agree = (argmax(ds41_logits(sa), V) == argmax(l0, V));
        for (int k = 0; k < n_cont; k++) {
            cont[k] = argmax(ds41_logits(f), V);
            if (ds41_feed(f, &cont[k], 1) || ds41_feed(sa, &cont[k], 1)) { rc = 1; goto next; }
            agree += argmax(ds41_logits(f), V) == argmax(ds41_logits(sa), V);
        }
        ds41_prefix_stats st;
        ds41_prefix_get_stats(pe, &st);
        double bpt = ds41_prefix_bytes_per_token(e);
        long long blocks = n / 128;
        long long ring = si.swa_bytes + si.dspark_ring_bytes + si.compressor_bytes;
        double full_prompt = (double)(si.global_kv_page_bytes + ring) / n;
        double full_block = (double)(si.global_kv_page_bytes + blocks * ring) / n;
        if (json) {
            json_array_append_new(rows, json_pack("{s:i,s:f,s:f,s:f,s:f,s:f,s:I,s:I,s:f,s:f,s:f,s:f,s:i,s:i,s:b,s:b,s:I}",
                "tokens", n, "fresh_s", t_fresh, "exact_hit_s", t_exact, "approx_hit_s", t_approx, "disk_exact_hit_s",
                t_disk, "disk_write_s", t_write, "restored_tokens", (json_int_t)he, "replay_rows_exact",
                (json_int_t)st.replay_rows, "bytes_per_cached_token", bpt, "full_state_bytes_per_token_prompt",
                full_prompt, "full_state_bytes_per_token_per_block", full_block, "approx_max_logit_diff", dmax,
                "approx_greedy_agree", agree, "approx_positions", n_cont + 1, "exact_bit_identical",
                exact ? exact_equal : 0, "disk_bit_identical", exact ? disk_equal : 0, "blocks", (json_int_t)blocks));
        } else {
            printf("%-7d %-10.3f %-10.3f %-10.3f %-10.3f %-8.1f %-8.1f %-9.1f %-11.1f %-11.1f %-10.4f %d/%d\n", n, t_fresh,
                   t_exact, t_approx, t_disk, t_fresh / t_exact, t_fresh / t_approx, bpt, full_prompt, full_block, dmax,
                   agree, n_cont + 1);
            if (exact)
                printf("        exact hit bit-identical to the fresh prefill: %s (from disk: %s); exact replay %lld rows; "
                       "%lld blocks written in %.3f s\n", exact_equal ? "yes" : "NO", disk_equal ? "yes" : "NO",
                       st.replay_rows, blocks, t_write);
        }
        fflush(stdout);
    next:
        ds41_session_close(f); ds41_session_close(se); ds41_session_close(sa); ds41_session_close(sd);
        ds41_prefix_close(pe); ds41_prefix_close(pa); ds41_prefix_close(pd);
        free(ids);
        free(l0);
    }
    if (json && !rc) {
        json_t *o = json_pack("{s:s,s:i,s:b,s:o}", "model", dir, "threads", threads, "exact", exact, "rows", rows);
        char *s = json_dumps(o, JSON_INDENT(1));
        if (s) { puts(s); free(s); }
        json_decref(o);
    } else {
        json_decref(rows);
    }
    if (!cache_dir) nftw(store, rm_one, 16, FTW_DEPTH | FTW_PHYS);   /* our temporary directory */
    ds41_unload(e);
    return rc;
}
