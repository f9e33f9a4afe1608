/* Strict parsing of numeric command-line values for the ds41 CLI commands: a value that is
 * not entirely a number in range is refused with one line on stderr naming the command,
 * the flag and the value, never silently read as 0 or wrapped (atoi / strtoull would). */
#ifndef DS41_CLI_ARGS_H
#define DS41_CLI_ARGS_H

#include <jansson.h>

/* Decimal integer in lo..hi. Returns 0, or -1 after printing "ds41 CMD: FLAG: ...". */
int ds41_cli_int(const char *cmd, const char *flag, const char *v, long long lo, long long hi, long long *out);
/* Finite number in lo..hi (no nan / inf). */
int ds41_cli_double(const char *cmd, const char *flag, const char *v, double lo, double hi, double *out);
/* A byte count: 123, 64K, 8M, 2G (powers of 1024), at least 1. */
int ds41_cli_bytes(const char *cmd, const char *flag, const char *v, long long *out);
/* A comma-separated list of 1..cap decimal integers, each in lo..hi, into v. Returns the count,
 * or -1 (nothing printed: the caller names the flag and what it expects). */
int ds41_cli_int_list(const char *s, long lo, long hi, int *v, int cap);
/* Clocks and the median of the commands' timings: the monotonic wall clock, the CPU time of
 * the whole process (every thread) and of the calling thread, in seconds; the median of v[0..n)
 * (sorts v; the mean of the two middle values for even n). */
double ds41_cli_now(void);
double ds41_cli_cpu_process(void);
double ds41_cli_cpu_thread(void);
double ds41_cli_median(double *v, int n);
int ds41_cli_cmp_double(const void *a, const void *b);   /* qsort, ascending */
/* Unsigned 64-bit integer (no sign; a seed). */
int ds41_cli_u64(const char *cmd, const char *flag, const char *v, unsigned long long *out);


/* ---- The sampling and engine flags of ds41 run, shared by run, chat and perplexity so that
 * their spelling, ranges and messages are the same everywhere (README, ds41 run). ---- */
typedef struct ds41_cli_gen {
    int n_predict;              /* -n, --n-predict (the command sets its default) */
    float temp, top_p, min_p;   /* --temp, --top-p, --min-p */
    int top_k;                  /* --top-k */
    unsigned long long seed;    /* --seed */
    int threads;                /* -t, --threads */
    long long ctx;              /* -c, --ctx-size (0: the engine's default) */
    int chunk;                  /* --chunk */
    int exact;                  /* --exact, or DS41_EXACT=1 in the environment */
    int prefill;                /* --prefill ced|full|ced-replay (DS41_PREFILL_MODE_*) */
    int index_k;                /* --index-k own|official (DS41_INDEX_K_*) */
    int load;                   /* --load mmap|copy (DS41_LOAD_*) */
    int readahead;              /* --readahead */
    int engram_mode;            /* --engram-mode auto|ram|mmap|prefetch (DS41_ENGRAM_*) */
    long long engram_cache;     /* --engram-cache BYTES (0: the default; -1: off) */
} ds41_cli_gen;
enum {
    DS41_CLI_SAMPLING = 1,      /* --temp --top-k --top-p --min-p --seed */
    DS41_CLI_NPREDICT = 2,      /* -n */
    DS41_CLI_ENGINE = 4,        /* -t --exact --chunk --index-k --load --readahead --engram-mode --engram-cache */
    DS41_CLI_CTX = 8,           /* -c */
    DS41_CLI_PREFILL = 16,      /* --prefill */
};
void ds41_cli_gen_default(ds41_cli_gen *g);   /* ds41 run's defaults (-n 32, greedy, 1 thread) */
/* If argv[*i] is a flag of one of the groups, consumes it and its value (advancing *i) and
 * returns 1; returns 0 if it is none of them; -1 after printing "ds41 CMD: ..." (exit 2). */
int ds41_cli_gen_arg(const char *cmd, int argc, char **argv, int *i, unsigned groups, ds41_cli_gen *g);

/* --engram-mode MODE / --engram-cache BYTES|0|off at argv[*i] (every command that loads a
 * model): 1 consumed, 0 not one of them, -1 after printing "ds41 CMD: ...". */
int ds41_cli_engram_arg(const char *cmd, int argc, char **argv, int *i, int *mode, long long *cache);
/* The usage lines of those two flags. */
#define DS41_CLI_ENGRAM_USAGE \
    "  --engram-mode M        where the Engram tables live: ram (read in at load), mmap, prefetch (rows read\n" \
    "                         per step with io_uring behind a row cache), auto (default: prefetch when the\n" \
    "                         tables exceed half of the memory available, else mmap); docs/engram-offram.md\n" \
    "  --engram-cache BYTES   prefetch: the Engram row cache (e.g. 256M; off; default min(1G, 1/16 of memory))\n"

/* ---- Helpers shared by the commands ---- */
/* 1 when DIR/NAME exists. */
int ds41_cli_file_exists(const char *dir, const char *name);
/* -m DIR given and a directory: 0; else a message that says what to type next and 1. */
int ds41_cli_model_dir_ok(const char *cmd, const char *dir);
/* log-softmax of the K best logits of a row of V (values descending, ties to the lower id) as a
 * JSON array of {"id", "logit", "logprob"}. */
json_t *ds41_cli_top_json(const float *lg, int V, int K);
/* The same in two parts, for a row reduced where it lives (ds41_logits_reduce): the bytes of the
 * K best (ds41_cli_top_bytes(K) of them: the count, the log-sum-exp as a double, K ids and K
 * logits), then their JSON array, equal to ds41_cli_top_json's of the row. */
size_t ds41_cli_top_bytes(int K);
void ds41_cli_top_reduce(const float *lg, int V, void *arg, void *out);   /* arg: the int K */
json_t *ds41_cli_top_json_of(const void *top, int K);

#endif
