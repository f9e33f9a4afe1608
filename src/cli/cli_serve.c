/* ds41 serve: the OpenAI-compatible HTTP server (src/serve/). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_args.h"
#include "cli_spec.h"
#include "dist.h"
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
    "  --load mmap|copy         weights mmap'd (default) or copied into anonymous memory\n"
    "  --readahead              madvise(MADV_WILLNEED) the next layer's weights before each layer\n"
    "  --spec off|fixed:K|auto  speculative decoding with the DSpark drafter (default auto when the\n"
    "                           model has DSpark stages): each sequence verifies its own block in the\n"
    "                           step; auto: the confidence scheduler over the batch and the verify-width\n"
    "                           curve (cached as ds41 run's; else measured once before the first step)\n"
    "  --no-prefix-cache        no prefix cache (default: on, in memory; README \"Prefix cache\")\n"
    "  --cache-mem BYTES        prefix cache memory, K/M/G suffixes (default 1G)\n"
    "  --cache-dir DIR          also keep the prefix cache on disk in DIR (reused across restarts)\n"
    "  --cache-bytes BYTES      capacity of DIR (default unlimited; least recently used blocks go)\n"
    "  --replay exact|approx    replay of a restored prefix (default exact: bit-identical to a fresh\n"
    "                           prefill in exact mode; approx: the last window only)\n"
    "  -v, --verbose            log microhttpd messages\n";

int ds41_cli_serve(int argc, char **argv) {
    /* the HTTP front and the scheduler would run on every rank, each waiting for the others
     * inside its first forward: refuse instead (docs/distributed.md, not done) */
    if (ds41_dist_size() > 1) {
        fprintf(stderr, "ds41 serve: not supported under mpiexec yet (docs/distributed.md); run serve as one process\n");
        return 2;
    }
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
        else if (IS("--kv-budget")) { NEED(); if (ds41_cli_bytes("serve", a, argv[++i], &o.kv_budget)) return 2; }
        else if (IS("--max-body")) {
            NEED();
            long long b;
            if (ds41_cli_bytes("serve", a, argv[++i], &b)) return 2;
            o.max_body = (size_t)b;
        }
        else if (IS("--timeout")) { INT(1, 86400); o.timeout_s = (int)iv; }
        else if (IS("--body-timeout")) { INT(1, 86400); o.body_timeout_s = (int)iv; }
        else if (IS("--max-connections")) { INT(1, 65536); o.max_connections = (int)iv; }
        else if (IS("-t") || IS("--threads")) { INT(1, 256); o.lp.n_threads = (int)iv; }
        else if (IS("-c") || IS("--ctx-size")) { INT(1, INT32_MAX); o.lp.ctx_size = iv; }
        else if (IS("--exact")) o.lp.exact = 1;
        else if (IS("--load")) {
            NEED();
            if (ds41_parse_load(argv[++i], &o.lp.load)) { fprintf(stderr, "ds41 serve: --load: '%s' is not mmap or copy\n", argv[i]); return 2; }
        }
        else if (IS("--readahead")) o.lp.readahead = 1;
        else if (IS("--spec")) {
            NEED();
            ds41_cli_spec sc;   /* the block size is known once loaded: checked by ds41_serve */
            if (ds41_cli_spec_parse("serve", argv[++i], 1, 0, &sc)) return 2;
            o.spec_mode = sc.mode;
            o.spec_k = sc.k;
            o.spec_default = 0;
        }
        else if (IS("-v") || IS("--verbose")) o.verbose = 1;
        else if (IS("--no-prefix-cache")) o.no_prefix_cache = 1;
        else if (IS("--cache-dir")) { NEED(); o.cache_dir = argv[++i]; }
        else if (IS("--cache-bytes")) { NEED(); if (ds41_cli_bytes("serve", a, argv[++i], &o.cache_bytes)) return 2; }
        else if (IS("--cache-mem")) { NEED(); if (ds41_cli_bytes("serve", a, argv[++i], &o.cache_mem)) return 2; }
        else if (IS("--replay")) {
            NEED();
            const char *v = argv[++i];
            if (!strcmp(v, "exact")) o.replay = DS41_REPLAY_EXACT;
            else if (!strcmp(v, "approx")) o.replay = DS41_REPLAY_APPROX;
            else { fprintf(stderr, "ds41 serve: --replay must be exact or approx, not '%s'\n", v); return 2; }
        }
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
