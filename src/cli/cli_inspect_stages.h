/* ds41 inspect --ranks N --split layers: per-stage bytes and per-token hop bytes of a
 * pipeline-parallel MPI job (cli_inspect_stages.c, docs/distributed.md). */
#ifndef DS41_CLI_INSPECT_STAGES_H
#define DS41_CLI_INSPECT_STAGES_H

#include <jansson.h>

#include "config.h"

/* Prints the section (json == NULL) or stores it in *json. map: --layer-map's ranges or NULL
 * (the default stages). Returns 0, or 1 after a message on stderr. */
int ds41_cli_inspect_stages(const ds41_config *c, int n, const char *map, json_t **json);
/* The same with the decode projection of --node-bandwidth GB/s (> 0), --link Gbit/s and --latency
 * us: one stream's step runs the stages one after the other (each reads its layers' bytes, the
 * rule of ds41_inspect_read_bytes), each hop's bytes and the sampled token's cross a link; with a
 * stream per stage in flight (serve) the busiest stage bounds the tokens per second. */
int ds41_cli_inspect_stages_proj(const ds41_config *c, int n, const char *map, double node_gbps, double link_gbits,
                                 double latency_us, json_t **json);

#endif
