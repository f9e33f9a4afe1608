/* ds41 inspect --ranks N: per-rank bytes and per-token exchange bytes of an MPI job
 * (cli_inspect_ranks.c, docs/distributed.md). */
#ifndef DS41_CLI_INSPECT_RANKS_H
#define DS41_CLI_INSPECT_RANKS_H

#include <jansson.h>

#include "config.h"
#include "dist.h"

typedef struct ds41_inspect_ranks_opts {
    int n;                  /* --ranks N */
    const char *map;        /* --expert-map FILE, or NULL */
    const char *counts;     /* --expert-map-from COUNTS (ds41 bench --routing-counts), or NULL */
    const char *map_out;    /* --write-expert-map FILE (with counts), or NULL */
    int dp;                 /* --dp-attention: each rank attends its own share of the sequences */
    double node_gbps;       /* --node-bandwidth GB/s: > 0 adds the decode projection */
    double link_gbits;      /* --link Gbit/s (the caller sets the default, 100) */
    double latency_us;      /* --latency us per exchange (the caller sets the default, 20) */
} ds41_inspect_ranks_opts;

/* The projection's rule (--node-bandwidth): the bytes of tensor t that one stream's decode step
 * reads per token under --spec off (the backbone's tensors whole, one embedding row, k/E of a
 * routed expert, nothing of the DSpark stages or of an Engram table); and the bytes of the
 * Engram rows a token reads per Engram layer. */
struct ds41_tensor_spec;
double ds41_inspect_read_bytes(const ds41_config *c, const struct ds41_tensor_spec *t);
double ds41_inspect_engram_row_bytes(const ds41_config *c);

/* Prints the section (json == NULL) or stores it in *json (and then writes o->map_out, so a
 * caller that prints the text after the JSON call writes it once). Returns 0, or 1 after a
 * message on stderr. */
int ds41_cli_inspect_ranks(const ds41_config *c, const ds41_budgets *bud, const ds41_inspect_ranks_opts *o,
                           json_t **json);

#endif
