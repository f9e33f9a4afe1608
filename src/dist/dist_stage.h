/* ds41 pipeline stages for `--split layers` (docs/distributed.md): which contiguous range of
 * backbone layers each rank of an `mpiexec -n N` job runs, from the config alone (no MPI: the
 * inspect command and the fuzz harness use it too).
 *
 * A stage boundary may sit only in front of a KV-source layer (spec 4.1): every compressed
 * layer reads the KV, index keys and top-k lists of the latest KV source at or before it, so
 * a cut there keeps each reader on its source's rank, and the boundary carries only the
 * residual stream (hc x dim FP32 plus the hc pre-mix weights per row). A cut is also refused
 * where a layer after it would read the candidate pool of a layer before it.
 *
 * first[r] .. first[r + 1] - 1 are rank r's layers (first[0] = 0, first[n] = n_layers). The
 * first stage also holds the embedding, the last the final norm, the head and the DSpark
 * stages.
 *
 * Layer: dist (no MPI). */
#ifndef DS41_DIST_STAGE_H
#define DS41_DIST_STAGE_H

#include <stddef.h>

#include "config.h"

/* 1 when a stage may start at layer l (0 < l < n_layers), else 0 with why. */
int ds41_stage_cut_ok(const ds41_config *c, int l, char *why, size_t cap);
/* Weight bytes per backbone layer (the tensor contract; Engram tables at their layer) into
 * lb[n_layers], and the bytes the first stage adds (embedding) and the last (final norm, head,
 * DSpark stages). */
void ds41_stage_layer_bytes(const ds41_config *c, unsigned long long *lb, unsigned long long *first_extra,
                            unsigned long long *last_extra);
/* The default stages: among the allowed cuts, those that make the largest stage's weight
 * bytes smallest (ties: the earliest cuts). 0, or -1 with err when the layers cannot be split
 * over n ranks. first has n + 1 entries. */
int ds41_stage_default(const ds41_config *c, int n, int *first, char *err, size_t cap);
/* --layer-map: n ranges "LO-HI" (inclusive; "L" for one layer) separated by commas, rank 0
 * first, covering 0 .. n_layers - 1 in order, each cut allowed. 0, or -1 with err naming the
 * range that is wrong. */
int ds41_stage_parse(const ds41_config *c, int n, const char *text, size_t len, int *first, char *err, size_t cap);
/* Weight bytes of each stage into bytes[n]. */
void ds41_stage_bytes(const ds41_config *c, int n, const int *first, unsigned long long *bytes);
/* Bytes one row of the residual stream takes across a stage boundary. */
static inline size_t ds41_stage_row_bytes(const ds41_config *c) {
    return (size_t)c->hc_mult * ((size_t)c->dim + 1) * sizeof(float);
}

#endif
