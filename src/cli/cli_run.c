/* ds41 run: generate from a prompt (text or token ids) with a checkpoint. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "cli_args.h"
#include "cli_progress.h"
#include "cli_spec.h"
#include "cli_vprompt.h"
#include "chat.h"
#include "dist.h"
#include "dist_pipe.h"
#include "common.h"
#include "ds41.h"
#include "tokenizer.h"

static const char *RUN_USAGE =
    "usage: ds41 run -m DIR (-p TEXT | --prompt-ids 1,2,3) [options]\n"
    "  -m, --model DIR        checkpoint directory\n"
    "  -p, --prompt TEXT      prompt text (needs DIR/tokenizer.json)\n"
    "  --prompt-ids LIST      prompt as comma-separated token ids (no tokenizer needed)\n"
    "  --image FILE           a PNG or JPEG through the model's vision tower (repeatable, in order):\n"
    "                         each replaces one <｜deepseek_image｜> of -p TEXT (or the config's\n"
    "                         image_token_id in --prompt-ids); a -p TEXT without any gets the images\n"
    "                         in front, each followed by a blank line, as a chat user message with\n"
    "                         the image parts first renders (docs/vision.md)\n"
    "  --chat                 -p TEXT is a user message: the prompt is the chat template's rendering\n"
    "                         of it (chat mode, with the assistant header), as ds41 chat sends it\n"
    "  -n, --n-predict N      tokens to generate (default 32)\n"
    "  --temp T               temperature (default 0 = greedy, first maximum)\n"
    "  --top-k K, --top-p P, --min-p P, --seed S   sampling filters and seed\n"
    "  -t, --threads N        fast-mode threads (default 1)\n"
    "  -c, --ctx-size N       context size in tokens (default 4096, at most the model's)\n"
    "  --prefill MODE         ced (default; exact, skips decoder rows), full, ced-replay (spec 4.1 approximation)\n"
    "  --chunk N|auto|off     prefill in chunks of N tokens (exact for N >= window); default auto:\n"
    "                         prompts over 2048 tokens in about equal chunks of at most 2048; 0 = off\n"
    "  --index-k own|official index-K reading of spec 3.9 / 10.1 (default own)\n"
    "  --exact                exact kernels (also DS41_EXACT=1); default fast\n"
    DS41_CLI_ENGRAM_USAGE
    "  --load mmap|copy       weights mmap'd from the page cache (default) or copied into anonymous\n"
    "                         memory with huge pages advised (README, Weights in memory)\n"
    "  --readahead            madvise(MADV_WILLNEED) the next layer's weights before each layer\n"
    "  --force-ids LIST       teacher forcing: feed these ids instead of sampling (logits still reported)\n"
    "  --ignore-eos           do not stop at the end-of-sequence token\n"
    "  --json                 one JSON object per generated token, then a {\"timing\": ...} line\n"
    "  --top-logprobs K       entries of \"top\" in --json output (default 5)\n"
    "  --dump-logits FILE     float32 little-endian logits, one vocabulary row per generated step\n"
    "  --trace DIR            conformance trace (docs/conformance.md; with DSpark stages also dspark.*)\n"
    "  --draft-trace          DSpark proposals and confidence logits after every step (JSON keys\n"
    "                         \"draft\" and \"draft_conf\", else lines on stderr)\n"
    "  --no-draft             do not run the DSpark drafter for --trace\n"
    "  --cache-dir DIR        persistent prefix cache: whole 128-token blocks of the prompt are\n"
    "                         restored from DIR (global KV only, windows rebuilt by replay) and the\n"
    "                         prompt's blocks written there (README \"Prefix cache\")\n"
    "  --cache-bytes N        capacity of DIR in bytes, least recently used blocks evicted (default\n"
    "                         unlimited; suffixes k, M, G)\n"
    "  --replay exact|approx  replay of a restored prefix: exact (default; bit-identical to a fresh\n"
    "                         prefill in exact mode) or approx (the last window only)\n"
    "  --spec off|fixed:K|auto  speculative decoding with the DSpark drafter (default auto when the\n"
    "                         model has DSpark stages; off with --trace/--draft-trace/--force-ids):\n"
    "                         verify K drafts per step, or as many as the confidence scheduler picks\n"
    "                         from the measured verify-width curve (cached, README); --json adds a\n"
    "                         {\"spec_step\"} line per step and a {\"spec\"} statistics line\n\n"
    "Examples:\n"
    "  ds41 run -m models/demo -p \"And God said unto Noah,\" -n 60 --temp 0.7 --top-p 0.9 --seed 1\n"
    "  ds41 run -m models/demo -p \"Telescope, n.\" -n 40 --exact --spec off     # exact mode, plain decoding\n"
    "  ds41 run -m models/demo --prompt-ids 1,2,3 -n 8 --json                  # ids in, one JSON line per token\n"
    "  ds41 run -m models/demo --chat -p \"What does telescope mean?\" -n 40   # a chat question\n"
    "  ds41 run -m models/demo --chat --image models/demo/samples/000.png -p \"What colour is the square?\"\n";

/* --chat: the chat template's rendering (chat mode, assistant header) of one user message, text;
 * a text without an image placeholder gets n_images of them in front, each followed by a blank
 * line, as ds41 chat's /image messages (a user message whose image parts come first). */
static int chat_prompt(const char *text, int n_images, char **out, ds41_err *err) {
    const char *ph = DS41_CHAT_IMAGE_PLACEHOLDER;
    size_t phl = strlen(ph), tl = strlen(text);
    int lead = strstr(text, ph) ? 0 : n_images;
    char *user = malloc((size_t)lead * (phl + 2) + tl + 1), *q = user;
    if (!user) return ds41_errf(err, "out of memory");
    for (int k = 0; k < lead; k++, q += phl + 2) { memcpy(q, ph, phl); memcpy(q + phl, "\n\n", 2); }
    memcpy(q, text, tl + 1);
    ds41_chat c;
    ds41_chat_options o;
    ds41_chat_init(&c);
    ds41_chat_options_init(&o);
    size_t len;
    int rc = ds41_chat_push(&c, DS41_ROLE_USER, user, NULL, err) ? ds41_chat_render(&c, &o, out, &len, err) : -1;
    ds41_chat_free(&c);
    free(user);
    return rc;
}

/* "1,2,3" -> ids; rejects anything that is not a comma-separated list of integers. */
static int parse_ids(const char *s, int32_t **out, size_t *n, const char *what) {
    size_t cap = 16, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return -1;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < INT32_MIN || x > INT32_MAX) {
            fprintf(stderr, "ds41 run: %s: '%s' is not a comma-separated list of integers\n", what, s);
            free(v);
            return -1;
        }
        if (k == cap) {
            cap *= 2;
            int32_t *nv = realloc(v, cap * sizeof *v);
            if (!nv) { free(v); return -1; }
            v = nv;
        }
        v[k++] = (int32_t)x;
        p = end;
        while (*p == ' ') p++;
        if (*p == ',') p++;
        else if (*p) {
            fprintf(stderr, "ds41 run: %s: unexpected '%c' in '%s'\n", what, *p, s);
            free(v);
            return -1;
        }
    }
    *out = v;
    *n = k;
    return 0;
}

int ds41_cli_run(int argc, char **argv) {
    const char *dir = NULL, *prompt = NULL, *prompt_ids = NULL, *force_ids = NULL, *dump = NULL, *trace = NULL;
    int draft_trace = 0, no_draft = 0;
    const char *spec_arg = NULL;   /* --spec (cli_spec.c) */
    int json = 0, top_lp = 5, ignore_eos = 0, replay = DS41_REPLAY_EXACT, chat = 0;
    const char *cache_dir = NULL;
    long long cache_bytes = 0;
    const char *image_paths[16];
    int n_images = 0;
    ds41_cli_gen g;
    ds41_cli_gen_default(&g);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        long long iv;
        int ga = ds41_cli_gen_arg("run", argc, argv, &i, DS41_CLI_SAMPLING | DS41_CLI_NPREDICT | DS41_CLI_ENGINE |
                                  DS41_CLI_CTX | DS41_CLI_PREFILL, &g);
        if (ga < 0) return 2;
        if (ga > 0) continue;
#define ARG(s1, s2) ((!strcmp(a, s1) || ((s2) && !strcmp(a, s2 ? s2 : ""))))
#define NEED() do { if (!has) { fprintf(stderr, "ds41 run: %s needs a value\n", a); return 2; } } while (0)
#define INT(lo, hi) do { if (ds41_cli_int("run", a, argv[++i], (lo), (hi), &iv)) return 2; } while (0)
        if (ARG("--help", "-h")) { fputs(RUN_USAGE, stdout); return 0; }
        else if (ARG("-m", "--model")) { NEED(); dir = argv[++i]; }
        else if (ARG("-p", "--prompt")) { NEED(); prompt = argv[++i]; }
        else if (ARG("--prompt-ids", NULL)) { NEED(); prompt_ids = argv[++i]; }
        else if (ARG("--chat", NULL)) chat = 1;
        else if (ARG("--image", NULL)) {
            NEED();
            if (n_images == 16) { fprintf(stderr, "ds41 run: at most 16 --image\n"); return 2; }
            image_paths[n_images++] = argv[++i];
        }
        else if (ARG("--force-ids", NULL)) { NEED(); force_ids = argv[++i]; }
        else if (ARG("--spec", NULL)) { NEED(); spec_arg = argv[++i]; }
        else if (ARG("--json", NULL)) json = 1;
        else if (ARG("--ignore-eos", NULL)) ignore_eos = 1;
        else if (ARG("--draft-trace", NULL)) draft_trace = 1;
        else if (ARG("--no-draft", NULL)) no_draft = 1;
        else if (ARG("--top-logprobs", NULL)) { NEED(); INT(0, INT32_MAX); top_lp = (int)iv; }
        else if (ARG("--dump-logits", NULL)) { NEED(); dump = argv[++i]; }
        else if (ARG("--trace", NULL)) { NEED(); trace = argv[++i]; }
        else if (ARG("--cache-dir", NULL)) { NEED(); cache_dir = argv[++i]; }
        else if (ARG("--cache-bytes", NULL)) { NEED(); if (ds41_cli_bytes("run", a, argv[++i], &cache_bytes)) return 2; }
        else if (ARG("--replay", NULL)) {
            NEED();
            const char *v = argv[++i];
            if (!strcmp(v, "exact")) replay = DS41_REPLAY_EXACT;
            else if (!strcmp(v, "approx")) replay = DS41_REPLAY_APPROX;
            else { fprintf(stderr, "ds41 run: --replay: '%s' is not exact or approx\n", v); return 2; }
        }
        else { fprintf(stderr, "ds41 run: unknown option '%s'\n%s", a, RUN_USAGE); return 2; }
#undef NEED
#undef INT
#undef ARG
    }
    if (!dir) { fprintf(stderr, "ds41 run: -m DIR is required (a checkpoint directory, e.g. -m models/demo)\n%s", RUN_USAGE); return 2; }
    if (ds41_cli_model_dir_ok("run", dir)) return 1;
    if (!prompt == !prompt_ids) { fprintf(stderr, "ds41 run: give exactly one of -p TEXT and --prompt-ids LIST\n"); return 2; }
    if (chat && !prompt) { fprintf(stderr, "ds41 run: --chat renders -p TEXT as a user message; it takes no --prompt-ids\n"); return 2; }
    /* output only from rank 0: the other ranks write their logits nowhere */
    if (dump && ds41_dist_rank() > 0) dump = "/dev/null";
    if (n_images && g.prefill == DS41_PREFILL_MODE_REPLAY) {
        fprintf(stderr, "ds41 run: --image cannot be combined with --prefill ced-replay\n");
        return 2;
    }
    if (cache_dir && trace) { fprintf(stderr, "ds41 run: --cache-dir and --trace cannot be combined (a restored prefix has no trace)\n"); return 2; }

    int rc = 1;
    ds41_tokenizer *tok = NULL;
    ds41_engine *e = NULL;
    ds41_session *s = NULL;
    ds41_prefix_cache *pc = NULL;
    ds41_cli_vimage images[16];
    ds41_cli_vprompt vp;
    memset(images, 0, sizeof images);
    memset(&vp, 0, sizeof vp);
    char *ptext = NULL, *rendered = NULL;
    int ids_vp = 0, pbos = 1;   /* pbos: the tokenizer adds BOS (not to a chat rendering, which has it) */
    int32_t *ids = NULL, *forced = NULL;
    size_t n_ids = 0, n_forced = 0;
    FILE *fdump = NULL;
    unsigned char *topb = NULL;   /* --json: a row's top entries reduced where it lives */
    ds41_err err;
    char ebuf[1024];

    if (ds41_cli_file_exists(dir, "tokenizer.json")) {
        if (ds41_tokenizer_load(dir, &tok, &err)) { fprintf(stderr, "ds41 run: %s\n", err.msg); goto out; }
    }
    if (prompt) {
        if (!tok) {
            fprintf(stderr, "ds41 run: %s has no tokenizer.json; give the prompt as --prompt-ids\n", dir);
            goto out;
        }
        if (chat && chat_prompt(prompt, n_images, &rendered, &err)) { fprintf(stderr, "ds41 run: --chat: %s\n", err.msg); goto out; }
        if (rendered) { prompt = rendered; pbos = 0; }
        if (ds41_tokenize(tok, prompt, strlen(prompt), 1, pbos, &ids, &n_ids, &err)) {
            fprintf(stderr, "ds41 run: %s\n", err.msg);
            goto out;
        }
    } else if (parse_ids(prompt_ids, &ids, &n_ids, "--prompt-ids")) {
        goto out;
    }
    if (force_ids && parse_ids(force_ids, &forced, &n_forced, "--force-ids")) goto out;
    if (n_ids == 0) { fprintf(stderr, "ds41 run: the prompt is empty\n"); goto out; }

    ds41_load_params lp;
    ds41_load_params_default(&lp);
    lp.exact = g.exact;
    lp.load = g.load;
    lp.readahead = g.readahead;
    lp.engram_mode = g.engram_mode;
    lp.engram_cache = g.engram_cache;
    lp.n_threads = g.threads;
    lp.ctx_size = g.ctx;
    char plabel[128];
    snprintf(plabel, sizeof plabel, "loading %s", dir);
    ds41_progress *pg = ds41_progress_start(plabel);
    e = ds41_load(dir, &lp, ebuf, sizeof ebuf);
    ds41_progress_end(pg);
    if (!e) { fprintf(stderr, "ds41 run: %s\n", ebuf); goto out; }
    int V = ds41_vocab_size(e);
    long long C = ds41_ctx_size(e);
    if (n_images) {
        /* each image through the tower, its span in place of its placeholder */
        for (int k = 0; k < n_images; k++)
            if (ds41_cli_image_load(e, image_paths[k], &images[k], &err)) { fprintf(stderr, "ds41 run: --image %s\n", err.msg); goto out; }
        int r;
        if (prompt) {
            size_t pl = strlen(prompt), phl = strlen(DS41_CHAT_IMAGE_PLACEHOLDER);
            if (!(ptext = malloc((size_t)n_images * (phl + 2) + pl + 1))) { fprintf(stderr, "ds41 run: out of memory\n"); goto out; }
            ptext[0] = 0;
            if (!strstr(prompt, DS41_CHAT_IMAGE_PLACEHOLDER))
                for (int k = 0; k < n_images; k++) strcat(strcat(ptext, DS41_CHAT_IMAGE_PLACEHOLDER), "\n\n");
            strcat(ptext, prompt);
            r = ds41_cli_vprompt_text(&vp, tok, ptext, strlen(ptext), pbos, images, n_images, ds41_model_dim(e),
                                      ds41_image_token_id(e), &err);
        } else {
            r = ds41_cli_vprompt_ids(&vp, ids, n_ids, images, n_images, ds41_model_dim(e), ds41_image_token_id(e), &err);
        }
        if (r) { fprintf(stderr, "ds41 run: %s\n", err.msg); goto out; }
        free(ids);
        ids = vp.ids;   /* the expanded prompt (owned by vp) */
        ids_vp = 1;
        n_ids = vp.n;
    }
    /* a tokenizer with ids past the embedding table belongs to another checkpoint: say so
     * rather than reporting its ids as out of range (or decoding generated ids with it) */
    if (tok && ds41_tokenizer_vocab_size(tok) > V) {
        fprintf(stderr, "ds41 run: %s/tokenizer.json has ids up to %d but the model's vocabulary is 0..%d: "
                "the tokenizer does not belong to this checkpoint\n", dir, ds41_tokenizer_vocab_size(tok) - 1, V - 1);
        goto out;
    }
    for (size_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= V) {
            fprintf(stderr, "ds41 run: prompt token %zu is %d, outside the vocabulary 0..%d\n", i, ids[i], V - 1);
            goto out;
        }
    for (size_t i = 0; i < n_forced; i++)
        if (forced[i] < 0 || forced[i] >= V) {
            fprintf(stderr, "ds41 run: --force-ids entry %zu is %d, outside the vocabulary 0..%d\n", i, forced[i], V - 1);
            goto out;
        }
    if ((long long)n_ids > C) {
        fprintf(stderr, "ds41 run: the prompt has %zu tokens, more than the context size %lld (-c)\n", n_ids, C);
        goto out;
    }
    /* the last generated token is not fed back, so prompt + n - 1 positions are needed */
    if (g.n_predict > 0 && (long long)n_ids + g.n_predict - 1 > C) {
        fprintf(stderr, "ds41 run: prompt (%zu tokens) + -n %d runs past the context size %lld (-c)\n", n_ids, g.n_predict, C);
        goto out;
    }
    if (forced && (long long)n_forced < g.n_predict) {
        fprintf(stderr, "ds41 run: --force-ids has %zu ids, fewer than -n %d\n", n_forced, g.n_predict);
        goto out;
    }

    ds41_session_params sp;
    ds41_session_params_default(&sp);
    sp.prefill = g.prefill;
    sp.chunk = g.chunk;
    sp.index_k = g.index_k;
    int B = ds41_draft_block_size(e);
    if (draft_trace && B == 0) { fprintf(stderr, "ds41 run: --draft-trace: %s has no DSpark stages\n", dir); goto out; }
    sp.draft = B > 0 && (draft_trace || (trace && !no_draft));
    ds41_cli_spec spc;   /* speculative decoding (cli_spec.c): default auto with DSpark stages */
    if (ds41_cli_spec_parse("run", spec_arg, B, trace || draft_trace || forced, &spc)) { rc = 2; goto out; }
    if (spc.mode != DS41_SPEC_OFF) sp.draft = 1;
    s = ds41_session_open(e, &sp, ebuf, sizeof ebuf);
    if (!s) { fprintf(stderr, "ds41 run: %s\n", ebuf); goto out; }
    ds41_session_set_sampling(s, g.temp, g.top_k, g.top_p, g.min_p, g.seed);
    /* --trace under mpiexec (docs/distributed.md): attention replicated, every rank holds the
     * whole trace and rank 0 alone writes it; --split layers, each stage writes the files of its
     * own layers into DIR (the first stage the tokens, the last the logits and proposals) */
    if (trace && (ds41_dist_rank() == 0 || ds41_pipe_on()) && ds41_session_trace(s, trace)) {
        fprintf(stderr, "ds41 run: %s\n", ds41_session_error(s));
        goto out;
    }
    if (dump && !(fdump = fopen(dump, "wb"))) {
        fprintf(stderr, "ds41 run: %s: cannot create: %s\n", dump, strerror(errno));
        goto out;
    }
    ds41_session_trace_tokens(s, ids, n_ids);

    int eos = tok ? ds41_tokenizer_eos(tok) : -1;
    ds41_detok_stream ds;
    if (tok) ds41_detok_stream_init(&ds, tok);

    if (cache_dir) {
        ds41_prefix_params pp;
        memset(&pp, 0, sizeof pp);
        /* under mpiexec (docs/prefix-cache.md): rank 0 alone keeps the store and sends every rank
         * the blocks it reads; under --split layers each stage keeps its layers' part in DIR/rank-R */
        char rank_dir[4096];
        if (ds41_prefix_job_dir(cache_dir, ds41_pipe_on(), rank_dir, sizeof rank_dir, &pp.dir)) {
            fprintf(stderr, "ds41 run: --cache-dir %s: the path is too long for a store per rank\n", cache_dir);
            goto out;
        }
        pp.disk_bytes = cache_bytes;
        pp.replay = replay;
        pp.index_k = g.index_k;
        if (!(pc = ds41_prefix_open(e, &pp, ebuf, sizeof ebuf))) { fprintf(stderr, "ds41 run: %s\n", ebuf); goto out; }
    }
    double t0 = ds41_cli_now();
    long long hit = 0, written = 0;
    /* image positions keyed on their image's content (docs/prefix-cache.md) */
    ds41_prefix_img pim = ds41_cli_vprompt_keys(&vp);
    if (pc && (hit = ds41_prefix_restore_job(pc, s, ids, n_ids, n_images ? &pim : NULL, 1)) < 0) {
        fprintf(stderr, "ds41 run: restoring the cached prefix: %s\n", ds41_session_error(s));
        goto out;
    }
    double t_restore = ds41_cli_now() - t0;
    snprintf(plabel, sizeof plabel, "prefill %lld tokens", (long long)n_ids - hit);
    pg = ds41_progress_start(plabel);
    int prc = n_images ? ds41_cli_vprompt_feed(s, &vp, (size_t)hit) : hit < (long long)n_ids ? ds41_feed(s, ids + hit, n_ids - (size_t)hit) : 0;
    ds41_progress_end(pg);
    if (prc) {
        fprintf(stderr, "ds41 run: %s\n", ds41_session_error(s));
        goto out;
    }
    double t_prefill = ds41_cli_now() - t0, t_decode = 0.0, t_publish = 0.0;
    if (pc) {
        double t1 = ds41_cli_now();
        written = ds41_prefix_publish_img(pc, s, ids, n_ids, n_images ? &pim : NULL);
        ds41_prefix_flush(pc);   /* durable before the answer (a serving process would not wait) */
        t_publish = ds41_cli_now() - t1;
    }
    int n_dec = 0, n_gen = 0;
    void *spec_json = NULL;   /* --json statistics of --spec (cli_spec.c) */
    char spec_line[512] = "";   /* else its stderr line, printed after the text */
    if (spc.mode != DS41_SPEC_OFF) {
        ds41_cli_spec_run sr = { .spec = spc, .e = e, .s = s, .dir = dir, .threads = g.threads, .exact = g.exact,
                                 .tok = tok, .ds = &ds, .json = json, .top_lp = top_lp, .n_predict = g.n_predict,
                                 .eos = eos, .ignore_eos = ignore_eos, .fdump = fdump };
        if (ds41_cli_spec_generate(&sr)) goto out;
        n_gen = sr.n_gen;
        snprintf(spec_line, sizeof spec_line, "%s", sr.stats_line);
        n_dec = sr.n_dec;
        t_decode = sr.t_decode;
        spec_json = sr.stats_json;
    }
    for (int step = 0; spc.mode == DS41_SPEC_OFF && step < g.n_predict; step++) {
        /* only when written: under --split layers the row then comes from the last stage */
        /* fetching the row and sampling are part of the step they end: under --split layers
         * they wait here for the row or the token from the last stage (the first ends the prefill) */
        double ts = ds41_cli_now();
        const float *lg = fdump ? ds41_logits(s) : NULL;
        /* --json alone: the top entries, computed where the row is (under --split layers on
         * the last stage: 12 + 8 K bytes to rank 0 instead of the row) */
        json_t *top = NULL;
        if (json && lg) top = ds41_cli_top_json(lg, V, top_lp);
        else if (json) {
            int kt = top_lp < V ? top_lp : V;
            if (!topb && !(topb = malloc(ds41_cli_top_bytes(kt)))) { fprintf(stderr, "ds41 run: out of memory\n"); goto out; }
            ds41_logits_reduce(s, ds41_cli_top_reduce, &kt, topb, ds41_cli_top_bytes(kt));
            top = ds41_cli_top_json_of(topb, kt);
        }
        double t_end = ds41_cli_now() - ts;
        if (fdump && fwrite(lg, sizeof(float), (size_t)V, fdump) != (size_t)V) {
            fprintf(stderr, "ds41 run: %s: write failed: %s\n", dump, strerror(errno));
            goto out;
        }
        ds41_session_trace_logits(s);
        ts = ds41_cli_now();
        int32_t next = forced ? forced[step] : ds41_session_sample(s);
        t_end += ds41_cli_now() - ts;
        if (step) t_decode += t_end;
        else t_prefill += t_end;
        ds41_session_trace_tokens(s, &next, 1);
        n_gen++;
        char text[256];
        size_t tl = 0;
        if (tok) tl = ds41_detok_stream_push(&ds, next, text, sizeof text - 1);
        text[tl] = 0;
        if (json) {
            json_t *o = json_object();
            json_object_set_new(o, "id", json_integer(next));
            json_object_set_new(o, "text", tok ? json_stringn(text, tl) : json_null());
            json_object_set_new(o, "top", top);
            top = NULL;
            char *line = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));
            if (line) { puts(line); free(line); }
            json_decref(o);
        } else if (tok) {
            /* the end-of-sequence token that stops the run is not part of the text */
            if (ignore_eos || forced || next != eos) fwrite(text, 1, tl, stdout);
        } else {
            printf("%s%d", step ? " " : "", next);
        }
        fflush(stdout);
        int32_t dids[64];
        float dconf[64];
        /* a proposal follows every decode step (docs/conformance.md: per decode step), i.e.
         * every step whose logits came from a single-token forward */
        int drafted = 0;
        if (sp.draft && step >= 1 && B <= 64) {
            if (ds41_session_draft(s, next, dids, dconf)) { fprintf(stderr, "\nds41 run: %s\n", ds41_session_error(s)); goto out; }
            drafted = 1;
        }
        if (json && drafted && draft_trace) {
            /* printed as its own line right after the token's line */
            json_t *o = json_object(), *a = json_array(), *c = json_array();
            for (int k = 0; k < B; k++) { json_array_append_new(a, json_integer(dids[k])); json_array_append_new(c, json_real(dconf[k])); }
            json_object_set_new(o, "draft", a);
            json_object_set_new(o, "draft_conf", c);
            json_object_set_new(o, "after", json_integer(next));
            char *line = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));
            if (line) { puts(line); free(line); }
            json_decref(o);
        } else if (drafted && draft_trace) {
            fprintf(stderr, "draft after %d:", next);
            for (int k = 0; k < B; k++) fprintf(stderr, " %d (%.4f)", dids[k], dconf[k]);
            fputc('\n', stderr);
        }
        if (!ignore_eos && !forced && next == eos && eos >= 0) break;
        if (step + 1 < g.n_predict) {
            double t1 = ds41_cli_now();
            if (ds41_feed(s, &next, 1)) { fprintf(stderr, "\nds41 run: %s\n", ds41_session_error(s)); goto out; }
            t_decode += ds41_cli_now() - t1;
            n_dec++;
        }
    }
    if (tok && !json) {
        char text[64];
        size_t tl = ds41_detok_stream_flush(&ds, text, sizeof text);
        fwrite(text, 1, tl, stdout);
    }
    if (!json && n_gen) putchar('\n');
    fflush(stdout);   /* the text before the statistics on stderr */
    if (spec_line[0]) fprintf(stderr, "%s\n", spec_line);

    ds41_state_info si;
    ds41_session_state(s, &si);
    double pf = t_prefill > 0 ? n_ids / t_prefill : 0, dc = t_decode > 0 ? n_dec / t_decode : 0;
    if (json) {
        json_t *tm = json_pack("{s:I,s:f,s:f,s:I,s:f,s:f}", "prefill_tokens", (json_int_t)n_ids, "prefill_s", t_prefill,
                               "prefill_tokens_per_s", pf, "decode_tokens", (json_int_t)n_dec, "decode_s", t_decode,
                               "decode_tokens_per_s", dc);
        json_t *sb = json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f}", "tokens", (json_int_t)si.tokens,
                               "global_kv", (json_int_t)si.global_kv_bytes, "global_kv_main", (json_int_t)si.global_kv_main_bytes,
                               "global_kv_index", (json_int_t)si.global_kv_index_bytes,
                               "global_kv_pages", (json_int_t)si.global_kv_page_bytes, "swa_rings", (json_int_t)si.swa_bytes,
                               "dspark_rings", (json_int_t)si.dspark_ring_bytes, "compressor", (json_int_t)si.compressor_bytes,
                               "total", (json_int_t)si.total_bytes, "global_kv_per_token", si.global_kv_bytes_per_token);
        json_object_set_new(tm, "state_bytes", sb);
        json_object_set_new(tm, "prefill", json_string(g.prefill == 0 ? "ced" : g.prefill == 1 ? "full" : "ced-replay"));
        json_object_set_new(tm, "exact", json_boolean(g.exact));
        json_object_set_new(tm, "threads", json_integer(g.threads));
        json_object_set_new(tm, "spec", spec_json ? (json_t *)spec_json : json_null());
        if (pc) {
            ds41_prefix_stats ps;
            ds41_prefix_get_stats(pc, &ps);
            json_object_set_new(tm, "prefix_cache",
                                json_pack("{s:I,s:I,s:I,s:f,s:I,s:f,s:s}", "restored_tokens", (json_int_t)hit,
                                          "disk_blocks_read", (json_int_t)ps.disk_hits, "replay_rows",
                                          (json_int_t)ps.replay_rows, "restore_s", t_restore, "blocks_written",
                                          (json_int_t)written, "write_s", t_publish, "replay",
                                          replay == DS41_REPLAY_EXACT ? "exact" : "approx"));
        }
        spec_json = NULL;
        json_t *o = json_pack("{s:o}", "timing", tm);
        char *line = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));
        if (line) { puts(line); free(line); }
        json_decref(o);
    } else {
        fprintf(stderr, "ds41 run: prefill %zu tokens in %.3f s (%.1f tok/s), decode %d tokens in %.3f s (%.2f tok/s)\n",
                n_ids, t_prefill, pf, n_dec, t_decode, dc);
        if (pc) {
            ds41_prefix_stats ps;
            ds41_prefix_get_stats(pc, &ps);
            fprintf(stderr, "ds41 run: prefix cache: %lld of %zu prompt tokens restored (%lld blocks read from disk, "
                    "%s replay of %lld rows) in %.3f s; %lld blocks written in %.3f s\n", hit, n_ids, ps.disk_hits,
                    replay == DS41_REPLAY_EXACT ? "exact" : "approx", ps.replay_rows, t_restore, written, t_publish);
        }
        fprintf(stderr, "ds41 run: state %lld B held (global KV %lld B = %.1f B/token, SWA rings %lld B, compressor %lld B)\n",
                si.total_bytes, si.global_kv_bytes, si.global_kv_bytes_per_token, si.swa_bytes, si.compressor_bytes);
    }
    if (trace && ds41_session_trace_finish(s)) { fprintf(stderr, "ds41 run: writing the trace failed\n"); goto out; }
    rc = 0;
out:
    if (fdump && (ferror(fdump) | fclose(fdump)) != 0 && rc == 0) {
        fprintf(stderr, "ds41 run: %s: write failed: %s\n", dump, strerror(errno));
        rc = 1;
    }
    ds41_session_close(s);
    ds41_prefix_close(pc);
    ds41_unload(e);
    if (tok) ds41_tokenizer_free(tok);
    if (ids_vp) ids = NULL;   /* vp's */
    ds41_cli_vprompt_free(&vp);
    for (int k = 0; k < n_images; k++) ds41_cli_image_free(&images[k]);
    free(topb);
    free(ptext);
    free(rendered);
    free(ids);
    free(forced);
    return rc;
}
