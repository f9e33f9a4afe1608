/* ds41 serve: the OpenAI-compatible HTTP server (src/serve/). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_args.h"
#include "cli_spec.h"
#include "dist.h"
#include "dist_pipe.h"
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
    "  --max-connections N      concurrent connections (default 256); more are closed at once\n"
    "  --max-connections-per-ip N  concurrent connections from one client address (default 32;\n"
    "                           0 = no limit); more are closed at once\n"
    "  -t, --threads N          fast-mode threads (default 1)\n"
    "  -c, --ctx-size N         context size per sequence (default 4096, at most the model's)\n"
    "  --prefill MODE           ced (default), full, ced-replay (a value with ':' is --role decode's\n"
    "                           prefill nodes, below)\n"
    "  --index-k own|official   index-K reading (default own)\n"
    "  --exact                  exact kernels (also DS41_EXACT=1)\n"
    "  --load mmap|copy         weights mmap'd (default) or copied into anonymous memory\n"
    "  --readahead              madvise(MADV_WILLNEED) the next layer's weights before each layer\n"
    DS41_CLI_ENGRAM_USAGE
    "  --spec off|fixed:K|auto  speculative decoding with the DSpark drafter (default auto when the\n"
    "                           model has DSpark stages): each sequence verifies its own block in the\n"
    "                           step; auto: the confidence scheduler over the batch and the verify-width\n"
    "                           curve (cached as ds41 run's; else measured once before the first step)\n"
    "  --no-prefix-cache        no prefix cache (default: on, in memory; README \"Prefix cache\")\n"
    "  --dp-attention           under mpiexec: each rank holds and attends its own share of the\n"
    "                           sequences and their prefix-cache blocks; the owner samples them\n"
    "                           (docs/distributed.md)\n"
    "  --cache-mem BYTES        prefix cache memory, K/M/G suffixes (default 1G)\n"
    "  --image-cache BYTES      embeddings of recently seen images, reused without the vision tower\n"
    "                           (default 256M; docs/vision.md)\n"
    "  --no-image-cache         run the tower for every image\n"
    "  --cache-dir DIR          also keep the prefix cache on disk in DIR (reused across restarts)\n"
    "  --cache-bytes BYTES      capacity of DIR (default unlimited; least recently used blocks go)\n"
    "  --replay exact|approx    replay of a restored prefix (default exact: bit-identical to a fresh\n"
    "                           prefill in exact mode; approx: the last window only)\n"
    "  -v, --verbose            log microhttpd messages\n"
    "prefill/decode disaggregation (docs/pd.md; needs a build with UCX):\n"
    "  --role both|prefill|decode  both (default): one node; prefill: serve prefill requests of decode\n"
    "                           nodes on --host:--port (UCX, no HTTP), at most --parallel at once;\n"
    "                           decode: the OpenAI front, prompts prefilled by --prefill nodes\n"
    "  --prefill HOST:PORT[,...]  (decode) the prefill nodes; the least loaded first\n"
    "  --remote-prefill-min N   (decode) prefill remotely when at least N prompt tokens are left after\n"
    "                           the prefix-cache hit and a whole 128-token block can be fetched (default 128)\n"
    "  --on-prefill-failure local|fail  (decode) a failed remote prefill: prefill locally, the same answer\n"
    "                           (default), or fail the request\n"
    "  --prefill-timeout MS     (decode) wait at most MS for a prefill node's next frame (default 30000)\n"
    "  --lease MS               (prefill) a decode node silent for MS loses its request (default 10000)\n"
    "  --http-port N            (prefill) serve GET /health and /metrics over HTTP on --host:N (0: a\n"
    "                           free port, printed); default: no HTTP\n"
    "  --pd-decoder prefill|decode  (prefill) where the decoder layers run on the rows their windows\n"
    "                           reach: prefill (default): here, the decoder's rings travel; decode: on\n"
    "                           the decode node from the stream at the first decoder layer, which\n"
    "                           travels instead, and this node reads no decoder weight (docs/pd.md)\n"
    "under mpiexec (docs/distributed.md): rank 0 serves HTTP, the other ranks mirror its batches (routed\n"
    "experts split over the ranks, the same answers); speculation off unless --spec is given (with\n"
    "--dp-attention each rank proposes and verifies for its own sequences, with --split layers the last\n"
    "stage proposes), --role prefill|decode (expert split; decode also with --dp-attention), --cache-dir on\n"
    "rank 0 only (its disk reads shipped to the other ranks; with --dp-attention and --split layers a store\n"
    "per rank, DIR/rank-R);\n"
    "--mpi-timeout S: a lost rank answers the requests in flight with 503 and ends the job\n\n"
    "Examples:\n"
    "  ds41 serve -m models/demo --port 8000 &\n"
    "  curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\\n"
    "       -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":40}'\n"
    "  ds41 bench-serve --port 8000 --concurrency 1,4,16                       # load test\n"
    "  mpiexec -n 2 ds41 serve -m models/demo --port 8000                      # experts over 2 ranks\n";

int ds41_cli_serve(int argc, char **argv) {
    ds41_serve_opts o;
    ds41_serve_opts_default(&o);
    int dp_attention = 0;
    o.lp.exact = getenv("DS41_EXACT") && !strcmp(getenv("DS41_EXACT"), "1");
    o.api_key = getenv("DS41_API_KEY") && *getenv("DS41_API_KEY") ? getenv("DS41_API_KEY") : NULL;
    int pd_decoder_set = 0;   /* --pd-decoder given (prefill nodes only) */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        long long iv;
        int r;
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
        else if (IS("--max-connections-per-ip")) { INT(0, 65536); o.max_connections_per_ip = (int)iv; }
        else if (IS("-t") || IS("--threads")) { INT(1, 256); o.lp.n_threads = (int)iv; }
        else if (IS("-c") || IS("--ctx-size")) { INT(1, INT32_MAX); o.lp.ctx_size = iv; }
        else if (IS("--exact")) o.lp.exact = 1;
        else if (IS("--load")) {
            NEED();
            if (ds41_parse_load(argv[++i], &o.lp.load)) { fprintf(stderr, "ds41 serve: --load: '%s' is not mmap or copy\n", argv[i]); return 2; }
        }
        else if (IS("--readahead")) o.lp.readahead = 1;
        else if ((r = ds41_cli_engram_arg("serve", argc, argv, &i, &o.lp.engram_mode, &o.lp.engram_cache)) != 0) {
            if (r < 0) return 2;
        }
        else if (IS("--spec")) {
            NEED();
            ds41_cli_spec sc;   /* the block size is known once loaded: checked by ds41_serve */
            if (ds41_cli_spec_parse("serve", argv[++i], 1, 0, &sc)) return 2;
            o.spec_mode = sc.mode;
            o.spec_k = sc.k;
            o.spec_default = 0;
        }
        else if (IS("-v") || IS("--verbose")) o.verbose = 1;
        else if (IS("--role")) {
            NEED();
            const char *v = argv[++i];
            if (!strcmp(v, "both")) o.role = DS41_SERVE_ROLE_BOTH;
            else if (!strcmp(v, "prefill")) o.role = DS41_SERVE_ROLE_PREFILL;
            else if (!strcmp(v, "decode")) o.role = DS41_SERVE_ROLE_DECODE;
            else { fprintf(stderr, "ds41 serve: --role must be both, prefill or decode, not '%s'\n", v); return 2; }
        }
        else if (IS("--prefill-timeout")) { INT(1, 3600000); o.prefill_timeout_ms = (int)iv; }
        else if (IS("--lease")) { INT(1, 3600000); o.lease_ms = (int)iv; }
        else if (IS("--http-port")) { INT(0, 65535); o.pd_http_port = (int)iv; }
        else if (IS("--pd-decoder")) {
            NEED();
            const char *v = argv[++i];
            if (!strcmp(v, "prefill")) o.pd_decoder_decode = 0;
            else if (!strcmp(v, "decode")) o.pd_decoder_decode = 1;
            else { fprintf(stderr, "ds41 serve: --pd-decoder must be prefill or decode, not '%s'\n", v); return 2; }
            pd_decoder_set = 1;
        }
        else if (IS("--remote-prefill-min")) { INT(1, INT32_MAX); o.remote_min = iv; }
        else if (IS("--on-prefill-failure")) {
            NEED();
            const char *v = argv[++i];
            if (!strcmp(v, "local")) o.on_failure_fail = 0;
            else if (!strcmp(v, "fail")) o.on_failure_fail = 1;
            else { fprintf(stderr, "ds41 serve: --on-prefill-failure must be local or fail, not '%s'\n", v); return 2; }
        }
        else if (IS("--no-prefix-cache")) o.no_prefix_cache = 1;
        else if (IS("--dp-attention")) dp_attention = 1;
        else if (IS("--cache-dir")) { NEED(); o.cache_dir = argv[++i]; }
        else if (IS("--cache-bytes")) { NEED(); if (ds41_cli_bytes("serve", a, argv[++i], &o.cache_bytes)) return 2; }
        else if (IS("--cache-mem")) { NEED(); if (ds41_cli_bytes("serve", a, argv[++i], &o.cache_mem)) return 2; }
        else if (IS("--image-cache")) { NEED(); if (ds41_cli_bytes("serve", a, argv[++i], &o.image_cache)) return 2; }
        else if (IS("--no-image-cache")) o.no_image_cache = 1;
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
            if (strchr(v, ':')) o.prefill_nodes = v;   /* HOST:PORT[,...]: the prefill nodes (--role decode) */
            else if (!strcmp(v, "ced")) o.sp.prefill = DS41_PREFILL_MODE_CED;
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
    if (!o.model_dir) { fprintf(stderr, "ds41 serve: -m DIR is required (a checkpoint directory, e.g. -m models/demo)\n%s", SERVE_USAGE); return 2; }
    if (ds41_cli_model_dir_ok("serve", o.model_dir)) return 1;
    o.lp.engram_verbose = o.verbose;
    if (pd_decoder_set && o.role != DS41_SERVE_ROLE_PREFILL) {
        fprintf(stderr, "ds41 serve: --pd-decoder is for --role prefill (a decode node takes both forms)\n");
        return 2;
    }
    if (o.pd_http_port >= 0 && o.role != DS41_SERVE_ROLE_PREFILL) {
        fprintf(stderr, "ds41 serve: --http-port is for --role prefill (the other roles serve HTTP on --port)\n");
        return 2;
    }
    if (o.prefill_nodes && o.role != DS41_SERVE_ROLE_DECODE) {
        fprintf(stderr, "ds41 serve: --prefill HOST:PORT is for --role decode\n");
        return 2;
    }
    if (o.role != DS41_SERVE_ROLE_BOTH && o.no_prefix_cache) {
        fprintf(stderr, "ds41 serve: --role %s needs the prefix cache (remote prefills travel as its blocks)\n",
                o.role == DS41_SERVE_ROLE_PREFILL ? "prefill" : "decode");
        return 2;
    }
    if (ds41_dist_size() > 1) {
        /* rank 0 serves, the other ranks mirror its engine calls (docs/distributed.md) */
        if (ds41_pipe_on() && dp_attention) {   /* a stage holds every sequence's KV of its layers */
            fprintf(stderr, "ds41 serve: --dp-attention and --split layers are two different splits; choose one\n");
            return 2;
        }
        /* --role decode: rank 0 fetches, every rank installs (INSTALL, serve_mpi.h) under the
         * replicated attention of the expert split; under --dp-attention the owner of the
         * sequence installs it and answers rank 0. Not under --split layers: each stage would
         * install its own layers' part of the pages and of the resume state, and the decoder
         * stream's form would run its forward through the stages (docs/distributed.md) */
        /* --role prefill: rank 0's node computes, every rank runs each prefill with it (PD_SEQ,
         * PD_FWD); with --cache-dir rank 0 alone reads and writes the store, and the blocks its
         * hit query would read from disk go to every rank first (BLOCKS, ds41_smirror_pd_load) */
        if (o.role == DS41_SERVE_ROLE_DECODE && ds41_pipe_on()) {
            fprintf(stderr, "ds41 serve: --role decode under mpiexec takes the expert split (attention replicated or "
                            "--dp-attention), not --split layers (docs/distributed.md)\n");
            return 2;
        }
        /* --role prefill: one request computes at a time (the node's compute mutex), so
         * --dp-attention would hold one sequence on one rank and leave the others idle, and
         * under --split layers the pages of each stage's layers would have to come to rank 0 */
        if (o.role == DS41_SERVE_ROLE_PREFILL && (dp_attention || ds41_pipe_on())) {
            fprintf(stderr, "ds41 serve: --role prefill under mpiexec takes the expert split with replicated attention only, "
                            "not %s (docs/distributed.md)\n", dp_attention ? "--dp-attention" : "--split layers");
            return 2;
        }
        /* --cache-dir: rank 0 alone reads and writes the store and ships the blocks it reads to
         * the other ranks (serve_mpi.h); under --dp-attention each rank caches its own sequences
         * in a store of its own, DIR/rank-R (serve_http.c); under --split layers each stage
         * keeps its layers' part of every block in DIR/rank-R and the stages agree on each
         * restore (ds41_prefix_restore_job) */
        /* --spec: the followers propose and verify with rank 0, which decides each verify's
         * outcome; under --dp-attention each owner proposes, verifies and decides for its own
         * sequences; under --split layers the last stage proposes and every stage verifies
         * (serve_mpi.h); off unless asked for under mpiexec */
        if (o.spec_default) o.spec_mode = DS41_SPEC_OFF;
        ds41_dist_set_dp(dp_attention);   /* each rank holds its own sequences and their prefix-cache blocks */
        /* --split layers: rank 0 samples, so the logits come to it (dist_pipe.h); each stage's
         * prefix cache keeps its layers' part of every block (restore.h ds41_store_here) */
        if (ds41_pipe_on()) ds41_pipe_set_eager(1);
    } else if (dp_attention) {
        fprintf(stderr, "ds41 serve: --dp-attention is for a job of several ranks (mpiexec -n N ds41 serve ...); one "
                        "process holds every sequence\n");
        return 2;
    }
    return ds41_serve(&o);
}
