/* ds41 inspect --ranks N --split layers: per-stage bytes and per-token hop bytes of a
 * pipeline-parallel MPI job (cli_inspect_stages.c, docs/distributed.md). */
#ifndef DS41_CLI_INSPECT_STAGES_H
#define DS41_CLI_INSPECT_STAGES_H

#include <jansson.h>

#include "config.h"

/* Prints the section (json == NULL) or stores it in *json. map: --layer-map's ranges or NULL
 * (the default stages). Returns 0, or 1 after a message on stderr. */
int ds41_cli_inspect_stages(const ds41_config *c, int n, const char *map, json_t **json);

#endif
