/* ds41 perplexity: perplexity of a checkpoint on a text file, in llama.cpp's llama-perplexity
 * convention (README, ds41 perplexity).
 *
 * The whole file is tokenized once (the tokenizer's post-processor adds the BOS; special-token
 * text in the file is plain text, as llama.cpp's parse_special = false). Windows of --ctx
 * tokens each start with the BOS (the window's first token is replaced by it, as llama.cpp
 * does) and run in a fresh session with ds41_feed_logits (every row's logits):
 *   default       non-overlapping windows at 0, C, 2C, ...; the rows first = C/2 .. C-2 score
 *                 the tokens first+1 .. C-1 (C-1-first tokens per window: the second half);
 *   --stride S    windows at 0, S, 2S, ... while they fit; the rows C-S-1 .. C-2 score the last
 *                 S tokens of each window (llama.cpp's --ppl-stride), so every token from C-S
 *                 on is scored once, each with at least C-S-1 tokens of context.
 * NLL of a token: log-sum-exp of its logits row minus its logit, in double. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cli_args.h"
#include "cli_progress.h"
#include "common.h"
#include "ds41.h"
#include "tokenizer.h"

static const char *PPL_USAGE =
    "usage: ds41 perplexity -m DIR -f FILE [--ctx N] [--stride S] [--json] [-t N] [--exact] [--chunk N]\n"
    "  -m, --model DIR        checkpoint directory (with tokenizer.json)\n"
    "  -f, --file FILE        UTF-8 text to score (- for standard input)\n"
    "  -c, --ctx N            window size in tokens (default min(context size, 512); each window\n"
    "                         starts with the BOS token)\n"
    "  --stride S             sliding windows advancing by S tokens, scoring the last S tokens of each\n"
    "                         (1 <= S < ctx); default: non-overlapping windows scoring their second half\n"
    "  --json                 one JSON object instead of the text report\n"
    "  -t, --threads N        fast-mode threads (default 1)\n"
    "  --exact                exact kernels (also DS41_EXACT=1); default fast\n"
    DS41_CLI_ENGRAM_USAGE
    "  --chunk N|auto|off     evaluate each window in chunks of N tokens (default auto: over 2048)\n"
    "  --index-k own|official index-K reading of spec 3.9 / 10.1 (default own)\n\n"
    "Examples:\n"
    "  ds41 perplexity -m models/demo -f README.md\n"
    "  ds41 perplexity -m models/demo -f book.txt --ctx 512 --json\n";

/* The whole of FILE (or standard input for "-"), NUL-terminated. */
static int read_text(const char *path, char **out, size_t *len, ds41_err *err) {
    if (strcmp(path, "-")) return ds41_read_file(path, (size_t)1 << 32, out, len, err);
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    if (!b) return ds41_errf(err, "out of memory");
    size_t r;
    while ((r = fread(b + n, 1, cap - n, stdin)) > 0) {
        n += r;
        if (n == cap) {
            char *nb = realloc(b, cap * 2 + 1);
            if (!nb) { free(b); return ds41_errf(err, "out of memory reading standard input"); }
            b = nb;
            cap *= 2;
        }
    }
    if (ferror(stdin)) { free(b); return ds41_errf(err, "standard input: read error: %s", strerror(errno)); }
    b[n] = 0;
    *out = b;
    *len = n;
    return 0;
}

/* -log softmax(row)[target] in double. */
static double token_nll(const float *row, int V, int target) {
    double mx = -INFINITY;
    for (int i = 0; i < V; i++) if (row[i] > mx) mx = row[i];
    double se = 0.0;
    for (int i = 0; i < V; i++) se += exp((double)row[i] - mx);
    return mx + log(se) - (double)row[target];
}

int ds41_cli_perplexity(int argc, char **argv) {
    const char *dir = NULL, *file = NULL;
    long long ctx = 0, stride = 0;
    int json = 0;
    ds41_cli_gen g;
    ds41_cli_gen_default(&g);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int ga = ds41_cli_gen_arg("perplexity", argc, argv, &i, DS41_CLI_ENGINE, &g);
        if (ga < 0) return 2;
        if (ga > 0) continue;
        int has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { fputs(PPL_USAGE, stdout); return 0; }
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "-f") || !strcmp(a, "--file") ||
                 !strcmp(a, "-c") || !strcmp(a, "--ctx") || !strcmp(a, "--stride")) {
            if (!has) { fprintf(stderr, "ds41 perplexity: %s needs a value\n", a); return 2; }
            const char *v = argv[++i];
            if (a[1] == 'm' || !strcmp(a, "--model")) dir = v;
            else if (a[1] == 'f' || !strcmp(a, "--file")) file = v;
            else if (!strcmp(a, "--stride")) { if (ds41_cli_int("perplexity", a, v, 1, INT32_MAX, &stride)) return 2; }
            else if (ds41_cli_int("perplexity", a, v, 2, INT32_MAX, &ctx)) return 2;
        } else { fprintf(stderr, "ds41 perplexity: unknown option '%s'\n%s", a, PPL_USAGE); return 2; }
    }
    if (!dir) { fprintf(stderr, "ds41 perplexity: -m DIR is required (a checkpoint directory, e.g. -m models/demo)\n%s", PPL_USAGE); return 2; }
    if (ds41_cli_model_dir_ok("perplexity", dir)) return 1;
    if (!file) { fprintf(stderr, "ds41 perplexity: -f FILE is required\n%s", PPL_USAGE); return 2; }
    if (stride && ctx && stride >= ctx) {
        fprintf(stderr, "ds41 perplexity: --stride %lld must be less than --ctx %lld (the window's first token is the "
                "BOS, which has no prediction)\n", stride, ctx);
        return 2;
    }

    int rc = 1;
    ds41_err err;
    char ebuf[1024];
    ds41_tokenizer *tok = NULL;
    ds41_engine *e = NULL;
    ds41_session *s = NULL;
    char *text = NULL;
    size_t text_len = 0, n_ids = 0;
    int32_t *ids = NULL, *win = NULL;
    float *rows = NULL;
    const char *fname = strcmp(file, "-") ? file : "standard input";

    struct stat dsb;
    if (stat(dir, &dsb) != 0) { fprintf(stderr, "ds41 perplexity: %s: cannot open: %s\n", dir, strerror(errno)); goto out; }
    if (!ds41_cli_file_exists(dir, "tokenizer.json")) {
        fprintf(stderr, "ds41 perplexity: %s has no tokenizer.json: perplexity needs the text tokenized\n", dir);
        goto out;
    }
    if (ds41_tokenizer_load(dir, &tok, &err)) { fprintf(stderr, "ds41 perplexity: %s\n", err.msg); goto out; }
    if (read_text(file, &text, &text_len, &err)) { fprintf(stderr, "ds41 perplexity: %s\n", err.msg); goto out; }
    if (text_len == 0) { fprintf(stderr, "ds41 perplexity: %s is empty\n", fname); goto out; }
    if (ds41_tokenize(tok, text, text_len, 0, 1, &ids, &n_ids, &err)) {
        fprintf(stderr, "ds41 perplexity: %s\n", err.msg);
        goto out;
    }

    ds41_load_params lp;
    ds41_load_params_default(&lp);
    lp.exact = g.exact;
    lp.load = g.load;
    lp.readahead = g.readahead;
    lp.engram_mode = g.engram_mode;
    lp.engram_cache = g.engram_cache;
    lp.n_threads = g.threads;
    lp.ctx_size = ctx;   /* a session holds one window */
    char plabel[128];
    snprintf(plabel, sizeof plabel, "loading %s", dir);
    ds41_progress *pg = ds41_progress_start(plabel);
    e = ds41_load(dir, &lp, ebuf, sizeof ebuf);
    ds41_progress_end(pg);
    if (!e) { fprintf(stderr, "ds41 perplexity: %s\n", ebuf); goto out; }
    int V = ds41_vocab_size(e);
    if (ds41_tokenizer_vocab_size(tok) > V) {
        fprintf(stderr, "ds41 perplexity: %s/tokenizer.json has ids up to %d but the model's vocabulary is 0..%d: "
                "the tokenizer does not belong to this checkpoint\n", dir, ds41_tokenizer_vocab_size(tok) - 1, V - 1);
        goto out;
    }
    if (!ctx) ctx = ds41_ctx_size(e) < 512 ? ds41_ctx_size(e) : 512;
    if (stride && stride >= ctx) {
        fprintf(stderr, "ds41 perplexity: --stride %lld must be less than the window of %lld tokens (--ctx)\n", stride, ctx);
        rc = 2;
        goto out;
    }
    long long C = ctx, first = stride ? C - stride - 1 : C / 2;
    long long per_window = C - 1 - first;   /* scored tokens per window */
    if (per_window < 1) {
        fprintf(stderr, "ds41 perplexity: a window of %lld tokens scores no token (give --ctx >= 3)\n", C);
        rc = 2;
        goto out;
    }
    if ((long long)n_ids < C) {
        fprintf(stderr, "ds41 perplexity: %s has %zu tokens, fewer than one window of %lld (--ctx)\n", fname, n_ids, C);
        goto out;
    }
    long long n_win = stride ? ((long long)n_ids - C) / stride + 1 : (long long)n_ids / C;
    int bos = ds41_tokenizer_bos(tok);
    int add_bos = bos >= 0 && ids[0] == bos;

    ds41_session_params sp;
    ds41_session_params_default(&sp);
    sp.chunk = g.chunk;
    sp.index_k = g.index_k;
    s = ds41_session_open(e, &sp, ebuf, sizeof ebuf);
    if (!s) { fprintf(stderr, "ds41 perplexity: %s\n", ebuf); goto out; }
    win = malloc((size_t)C * sizeof *win);
    rows = malloc((size_t)C * V * sizeof(float));
    if (!win || !rows) { fprintf(stderr, "ds41 perplexity: out of memory for a window of %lld x %d logits\n", C, V); goto out; }

    double nll = 0.0, nll2 = 0.0, t_fwd = 0.0;
    long long scored = 0, bytes = 0;
    int tty = isatty(2);
    for (long long w = 0; w < n_win; w++) {
        long long start = stride ? w * stride : w * C;
        memcpy(win, ids + start, (size_t)C * sizeof *win);
        if (add_bos) win[0] = bos;
        ds41_session_reset(s);
        double t0 = ds41_cli_now();
        if (ds41_feed_logits(s, win, (size_t)C, rows)) {
            fprintf(stderr, "ds41 perplexity: window %lld: %s\n", w, ds41_session_error(s));
            goto out;
        }
        t_fwd += ds41_cli_now() - t0;
        for (long long j = first; j < C - 1; j++) {
            double x = token_nll(rows + (size_t)j * V, V, win[j + 1]);
            nll += x;
            nll2 += x * x;
            scored++;
        }
        char *piece = NULL;
        size_t plen = 0;
        if (ds41_detokenize(tok, win + first + 1, (size_t)per_window, 0, &piece, &plen, &err)) {
            fprintf(stderr, "ds41 perplexity: %s\n", err.msg);
            goto out;
        }
        free(piece);
        bytes += (long long)plen;
        if (tty && !json)
            fprintf(stderr, "\r[%lld/%lld] perplexity %.4f", w + 1, n_win, exp(nll / (double)scored));
    }
    if (tty && !json) fputc('\n', stderr);

    double mean = nll / (double)scored, ppl = exp(mean);
    double var = scored > 1 ? (nll2 / (double)scored - mean * mean) * (double)scored / (double)(scored - 1) : 0.0;
    double se = scored > 1 && var > 0 ? sqrt(var / (double)scored) : 0.0;
    double bpb = bytes > 0 ? nll / log(2.0) / (double)bytes : 0.0;
    long long evaluated = n_win * C;
    double tps = t_fwd > 0 ? (double)evaluated / t_fwd : 0.0;
    if (json) {
        json_t *o = json_object();
        json_object_set_new(o, "file", json_string(fname));
        json_object_set_new(o, "perplexity", json_real(ppl));
        json_object_set_new(o, "perplexity_stderr", json_real(ppl * se));
        json_object_set_new(o, "nll_per_token", json_real(mean));
        json_object_set_new(o, "nll_total", json_real(nll));
        json_object_set_new(o, "bits_per_byte", json_real(bpb));
        json_object_set_new(o, "tokens_scored", json_integer(scored));
        json_object_set_new(o, "bytes_scored", json_integer(bytes));
        json_object_set_new(o, "windows", json_integer(n_win));
        json_object_set_new(o, "ctx", json_integer(C));
        json_object_set_new(o, "stride", stride ? json_integer(stride) : json_null());
        json_object_set_new(o, "first_scored_row", json_integer(first));
        json_object_set_new(o, "tokens_in_file", json_integer((json_int_t)n_ids));
        json_object_set_new(o, "bytes_in_file", json_integer((json_int_t)text_len));
        json_object_set_new(o, "tokens_evaluated", json_integer(evaluated));
        json_object_set_new(o, "seconds", json_real(t_fwd));
        json_object_set_new(o, "tokens_per_s", json_real(tps));
        json_object_set_new(o, "exact", json_boolean(g.exact));
        json_object_set_new(o, "threads", json_integer(g.threads));
        char *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
        json_decref(o);
        if (!line) { fprintf(stderr, "ds41 perplexity: cannot write the JSON output\n"); goto out; }
        puts(line);
        free(line);
    } else {
        printf("perplexity     %.4f +/- %.4f\n", ppl, ppl * se);
        printf("nll per token  %.6f nats (total %.4f)\n", mean, nll);
        printf("bits per byte  %.6f (%lld bytes scored)\n", bpb, bytes);
        printf("tokens scored  %lld of %zu in %s (%lld windows of %lld tokens, %lld scored in each: ", scored, n_ids,
               fname, n_win, C, per_window);
        if (stride) printf("stride %lld)\n", stride);
        else printf("the second half)\n");
        printf("speed          %lld tokens in %.3f s, %.1f tokens/s (%s, %d thread%s)\n", evaluated, t_fwd, tps,
               g.exact ? "exact" : "fast", g.threads, g.threads == 1 ? "" : "s");
    }
    rc = 0;
out:
    ds41_session_close(s);
    ds41_unload(e);
    if (tok) ds41_tokenizer_free(tok);
    free(text);
    free(ids);
    free(win);
    free(rows);
    return rc;
}
