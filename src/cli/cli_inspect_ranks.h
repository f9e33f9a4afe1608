/* ds41 inspect --ranks N: per-rank bytes and per-token exchange bytes of an MPI job
 * (cli_inspect_ranks.c, docs/distributed.md). */
#ifndef DS41_CLI_INSPECT_RANKS_H
#define DS41_CLI_INSPECT_RANKS_H

#include <jansson.h>

#include "config.h"
#include "dist.h"

/* Prints the section (json == NULL) or stores it in *json. map: an --expert-map file or NULL.
 * Returns 0, or 1 after a message on stderr. */
int ds41_cli_inspect_ranks(const ds41_config *c, const ds41_budgets *bud, int n, const char *map, json_t **json);

#endif
