/* ds41 serve: the OpenAI-compatible HTTP server (src/serve/). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_args.h"
#include "cli_spec.h"
#include "ds41.h"
#include "serve.h"

static const char *SERVE_USAGE =
    "usage: ds41 serve -m DIR [options]\n"
    "  -m, --model DIR          checkpoint directory (tokenizer.json for text prompts)\n"
    "  --host ADDR              address to bind (default 127.0.0.1)\n"
    "  --port N                 port (default 8000; 0 = any free port, printed at start)\n"
    "  --api-key KEY            require 'Authorization: Bearer KEY' on /v1/*, /tokenize, /detokenize\n"
    "                           (also DS41_API_KEY)\n"
    "  --served-model-name NAME model id in requests and replies (default: DIR's base name)\n"
    "  --parallel N             sequences running at most (default 16)\n"
    "  --batch-tokens N         tokens per engine step: decode rows + prefill chunks (default 512)\n"
    "  --max-queue N            waiting sequences at most; more get 429 (default 256)\n"
    "  --kv-budget BYTES        sequence-state budget for admission, K/M/G suffixes (default: half the\n"
    "                           available RAM)\n"
    "  --max-body BYTES         request body limit, larger get 413 (default 8M)\n"
    "  --timeout S              idle connection timeout (default 60)\n"
    "  --body-timeout S         the whole request body within S seconds, else the connection is dropped (default 30)\n"
    "  --max-connections N      concurrent connections (default 256)\n"
    "  -t, --threads N          fast-mode threads (default 1)\n"
    "  -c, --ctx-size N         context size per sequence (default 4096, at most the model's)\n"
    "  --prefill MODE           ced (default), full, ced-replay\n"
    "  --index-k own|official   index-K reading (default own)\n"
    "  --exact                  exact kernels (also DS41_EXACT=1)\n"
    "  --spec off|fixed:K|auto  speculative decoding with the DSpark drafter (default auto when the\n"
    "                           model has DSpark stages): each sequence verifies its own block in the\n"
    "                           step; auto: the confidence scheduler over the batch and the verify-width\n"
    "                           curve (cached as ds41 run's; else measured once before the first step)\n"
    "  -v, --verbose            log microhttpd messages\n";

/* 123, 64K, 8M, 2G (powers of 1024) */
static int parse_bytes(const char *flag, const char *v, long long *out) {
    char *end;
    double x = strtod(v, &end);
    long long mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1LL << 10, end++;
    else if (*end == 'm' || *end == 'M') mul = 1LL << 20, end++;
    else if (*end == 'g' || *end == 'G') mul = 1LL << 30, end++;
    if (end == v || *end || !(x >= 1) || x * (double)mul > 9.0e18) {
        fprintf(stderr, "ds41 serve: %s: '%s' is not a byte count (e.g. 512M)\n", flag, v);
        return -1;
    }
    *out = (long long)(x * (double)mul);
    return 0;
}

int ds41_cli_serve(int argc, char **argv) {
    ds41_serve_opts o;
    ds41_serve_opts_default(&o);
    o.lp.exact = getenv("DS41_EXACT") && !strcmp(getenv("DS41_EXACT"), "1");
    o.api_key = getenv("DS41_API_KEY") && *getenv("DS41_API_KEY") ? getenv("DS41_API_KEY") : NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        long long iv;
#define IS(s) (!strcmp(a, s))
#define NEED() do { if (!has) { fprintf(stderr, "ds41 serve: %s needs a value\n", a); return 2; } } while (0)
#define INT(lo, hi) do { NEED(); if (ds41_cli_int("serve", a, argv[++i], (lo), (hi), &iv)) return 2; } while (0)
        if (IS("--help") || IS("-h")) { fputs(SERVE_USAGE, stdout); return 0; }
        else if (IS("-m") || IS("--model")) { NEED(); o.model_dir = argv[++i]; }
        else if (IS("--host")) { NEED(); o.host = argv[++i]; }
        else if (IS("--port")) { INT(0, 65535); o.port = (int)iv; }
        else if (IS("--api-key")) { NEED(); o.api_key = argv[++i]; }
        else if (IS("--served-model-name")) { NEED(); o.model_name = argv[++i]; }
        else if (IS("--parallel")) { INT(1, 4096); o.parallel = (int)iv; }
        else if (IS("--batch-tokens")) { INT(1, 1 << 24); o.batch_tokens = (int)iv; }
        else if (IS("--max-queue")) { INT(1, 1 << 20); o.max_queue = (int)iv; }
        else if (IS("--kv-budget")) { NEED(); if (parse_bytes(a, argv[++i], &o.kv_budget)) return 2; }
        else if (IS("--max-body")) {
            NEED();
            long long b;
            if (parse_bytes(a, argv[++i], &b)) return 2;
            o.max_body = (size_t)b;
        }
        else if (IS("--timeout")) { INT(1, 86400); o.timeout_s = (int)iv; }
        else if (IS("--body-timeout")) { INT(1, 86400); o.body_timeout_s = (int)iv; }
        else if (IS("--max-connections")) { INT(1, 65536); o.max_connections = (int)iv; }
        else if (IS("-t") || IS("--threads")) { INT(1, 256); o.lp.n_threads = (int)iv; }
        else if (IS("-c") || IS("--ctx-size")) { INT(1, INT32_MAX); o.lp.ctx_size = iv; }
        else if (IS("--exact")) o.lp.exact = 1;
        else if (IS("--spec")) {
            NEED();
            ds41_cli_spec sc;   /* the block size is known once loaded: checked by ds41_serve */
            if (ds41_cli_spec_parse("serve", argv[++i], 1, 0, &sc)) return 2;
            o.spec_mode = sc.mode;
            o.spec_k = sc.k;
            o.spec_default = 0;
        }
        else if (IS("-v") || IS("--verbose")) o.verbose = 1;
        else if (IS("--prefill")) {
            NEED();
            const char *v = argv[++i];
            if (!strcmp(v, "ced")) o.sp.prefill = DS41_PREFILL_MODE_CED;
            else if (!strcmp(v, "full")) o.sp.prefill = DS41_PREFILL_MODE_FULL;
            else if (!strcmp(v, "ced-replay")) o.sp.prefill = DS41_PREFILL_MODE_REPLAY;
            else { fprintf(stderr, "ds41 serve: --prefill must be ced, full or ced-replay, not '%s'\n", v); return 2; }
        } else if (IS("--index-k")) {
            NEED();
            const char *v = argv[++i];
            if (!strcmp(v, "own")) o.sp.index_k = DS41_INDEX_K_OWN;
            else if (!strcmp(v, "official")) o.sp.index_k = DS41_INDEX_K_OFFICIAL;
            else { fprintf(stderr, "ds41 serve: --index-k must be own or official, not '%s'\n", v); return 2; }
        } else { fprintf(stderr, "ds41 serve: unknown option '%s'\n%s", a, SERVE_USAGE); return 2; }
#undef IS
#undef NEED
#undef INT
    }
    if (!o.model_dir) { fprintf(stderr, "ds41 serve: -m DIR is required\n%s", SERVE_USAGE); return 2; }
    return ds41_serve(&o);
}
