/* ds41 bench --settle auto|always|never: the checkpoint's page-cache state before measuring
 * (cli_bench_settle.c). */
#ifndef DS41_CLI_BENCH_SETTLE_H
#define DS41_CLI_BENCH_SETTLE_H

#include <stdio.h>

enum { DS41_SETTLE_AUTO, DS41_SETTLE_ALWAYS, DS41_SETTLE_NEVER };

/* 0 and *mode set, or -1 for an unknown word */
int ds41_cli_parse_settle(const char *s, int *mode);
/* Settles DIR's *.safetensors (write back, evict, re-read) when mode says so (auto: a shard
 * modified in the last 10 minutes), then prints one line to out naming the state measured and
 * the share of the shards in the page cache. 0, or -1 with a message on stderr. */
int ds41_cli_bench_settle(const char *dir, int mode, FILE *out);

#endif
