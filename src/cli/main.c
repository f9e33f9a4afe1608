/* ds41: command-line entry point. Dispatches to the commands in src/cli/cli_*.c. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "dist.h"
#include "serve_mpi.h"

typedef struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    { "run", ds41_cli_run, "generate from a prompt (text or token ids)" },
    { "bench", ds41_cli_bench, "prefill / decode throughput, peak RSS and state bytes" },
    { "perplexity", ds41_cli_perplexity, "perplexity and bits per byte of a text file (llama.cpp convention)" },
    { "chat", ds41_cli_chat, "interactive chat in the V4.1 template (scriptable over stdin)" },
    { "inspect", ds41_cli_inspect, "config, layer plan, tensor table and byte budgets of a checkpoint" },
    { "tokenize", ds41_cli_tokenize, "text to token ids and back with the checkpoint's tokenizer.json" },
    { "serve", ds41_cli_serve, "OpenAI-compatible HTTP server with continuous batching" },
    { "bench-prefix", ds41_cli_bench_prefix, "prefix cache: time to first logits on a hit vs a fresh prefill, bytes per cached token" },
    { "bench-serve", ds41_cli_bench_serve, "load generator for ds41 serve: TTFT, ITL, output tok/s at several concurrencies" },
    { "chat-template", ds41_cli_chat_template, "render a messages JSON in the V4.1 prompt format, with its token ids" },
    { "image", ds41_cli_image, "decode and preprocess an image; with a vision tower, encode it (token grid, --dump the embeddings)" },
    { "cache", ds41_cli_cache, "look inside a --cache-dir prefix store: ls, stats, verify, clear" },
};

static void usage(FILE *f) {
    fprintf(f, "usage: ds41 COMMAND [options]   (ds41 COMMAND --help for details)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-14s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nexamples (models/demo is the bundled demo model):\n"
               "  ds41 run -m models/demo -p \"And God said unto Noah,\" -n 60 --temp 0.7 --seed 1\n"
               "  ds41 chat -m models/demo\n"
               "  ds41 serve -m models/demo --port 8000      # OpenAI-compatible: /v1/chat/completions\n"
               "  ds41 bench -m models/demo\n"
               "\nREADME.md has a five-minute tour; docs/commands.md every option.\n");
    fprintf(f, "\nunder mpiexec (docs/distributed.md): mpiexec -n N ds41 COMMAND ... [--expert-map FILE] "
               "[--mpi-timeout SECONDS] [--split experts|layers[:RANGES] [--layer-map RANGES] [--pipe-batches N]]%s\n", ds41_dist_built() ? "" : " (this build has no MPI)");
}

/* The command whose name is closest to s (Levenshtein distance at most 2), or NULL: for
 * "did you mean". */
static const char *closest(const char *s) {
    const char *best = NULL;
    size_t bd = 3, n = strlen(s);
    if (n > 30) return NULL;
    for (size_t c = 0; c < sizeof commands / sizeof commands[0]; c++) {
        const char *t = commands[c].name;
        size_t m = strlen(t), row[32];
        for (size_t j = 0; j <= m; j++) row[j] = j;
        for (size_t i = 1; i <= n; i++) {
            size_t diag = row[0];
            row[0] = i;
            for (size_t j = 1; j <= m; j++) {
                size_t up = row[j], v = diag + (s[i - 1] != t[j - 1]);
                if (up + 1 < v) v = up + 1;
                if (row[j - 1] + 1 < v) v = row[j - 1] + 1;
                row[j] = v;
                diag = up;
            }
        }
        if (row[m] < bd) { bd = row[m]; best = t; }
    }
    return best;
}

static int run_command(int argc, char **argv);

/* Under mpiexec every rank runs the command (docs/distributed.md); the job's flags
 * (--mpi-timeout, --expert-map) are taken out of argv first, so every command accepts them. */
int main(int argc, char **argv) {
    /* serve's 503 guard under mpiexec (serve_mpi_guard.c): a process of rank 0's, not a rank */
    if (argc >= 2 && !strcmp(argv[1], "--serve-guard")) return ds41_sguard_main(argc - 1, argv + 1);
    int rc = ds41_dist_start(&argc, argv);
    if (rc) return rc;
    return ds41_dist_finish(run_command(argc, argv));
}

static int run_command(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            int rc = commands[i].fn(argc - 1, argv + 1);
            /* a full disk or a closed pipe must not pass for success */
            if (fflush(stdout) != 0 || ferror(stdout)) {
                fprintf(stderr, "ds41 %s: error writing standard output: %s\n", argv[1], strerror(errno));
                if (rc == 0) rc = 1;
            }
            return rc;
        }
    const char *near = closest(argv[1]);
    if (near) {
        fprintf(stderr, "ds41: unknown command '%s'; did you mean 'ds41 %s'? (ds41 --help lists the commands)\n", argv[1], near);
        return 2;
    }
    fprintf(stderr, "ds41: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
