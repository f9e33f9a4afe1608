/* ds41 pipeline stages for `--split layers` (docs/distributed.md): which contiguous range of
 * backbone layers each rank of an `mpiexec -n N` job runs, from the config alone (no MPI: the
 * inspect command and the fuzz harness use it too).
 *
 * A stage may start at any layer 1..n_layers - 1 up to the first DSpark target (the drafter runs
 * on the last stage, beside every target's input stream). In front of a KV-source layer only
 * the residual stream crosses (hc x dim FP32 plus the hc pre-mix weights per row). In front of
 * any other layer l the cut also carries what the layers from l on read of the layers before
 * it (spec 2, 3.8-3.11; ds41_stage_cut_needs): the forward's new entries (main KV and index
 * keys) of each KV source s < l they attend to or score, which the receiving stage keeps in a
 * replica of s's store; the top-k lists of each index source < l they reuse; and, past the
 * candidate source, its candidate pool.
 *
 * first[r] .. first[r + 1] - 1 are rank r's layers (first[0] = 0, first[n] = n_layers). The
 * first stage also holds the embedding, the last the final norm, the head and the DSpark
 * stages.
 *
 * Layer: dist (no MPI). */
#ifndef DS41_DIST_STAGE_H
#define DS41_DIST_STAGE_H

#include <stddef.h>
#include <string.h>

#include "config.h"

/* 1 when a stage may start at layer l (0 < l < n_layers), else 0 with why. */
int ds41_stage_cut_ok(const ds41_config *c, int l, char *why, size_t cap);
/* The last layer a stage may start at (the first DSpark target, else n_layers - 1). */
int ds41_stage_last_cut(const ds41_config *c);

/* What a cut in front of layer l carries besides the stream. */
#define DS41_CUT_MAX_LAYERS 256
typedef struct ds41_cut_need {
    int layer;
    int n;                                   /* things that cross (0: the stream alone) */
    unsigned char stores[DS41_MAX_LIST];     /* per KV source (kv_sources order): its new entries */
    unsigned char sel[DS41_CUT_MAX_LAYERS];  /* per layer < l: its top-k lists */
    int pool;                                /* the candidate pool */
} ds41_cut_need;
int ds41_stage_cut_needs(const ds41_config *c, int l, ds41_cut_need *nd);
/* Bytes per token of a decode step at compressed-context ctx positions crossing the cut at l:
 * the stream, the KV entries (per token: the sources' records over their ratios), the top-k
 * lists (a 4-byte width and k ids), the candidate pool (a 4-byte count and one bit per block);
 * replica_per_token: the receiving stage's extra KV bytes per token held. */
typedef struct ds41_cut_bytes {
    double stream, entries, topk, pool, total, replica_per_token;
} ds41_cut_bytes;
void ds41_stage_cut_bytes(const ds41_config *c, int l, long long ctx, ds41_cut_bytes *b);
/* The default takes cuts that are not at KV sources only when they make the largest stage at
 * least this many percent smaller. */
#define DS41_STAGE_FINER_PCT 5
#define DS41_STAGE_FINER_PCT_TEXT "5 %"
/* Weight bytes per backbone layer (the tensor contract; Engram tables at their layer) into
 * lb[n_layers], and the bytes the first stage adds (embedding) and the last (final norm, head,
 * DSpark stages). */
void ds41_stage_layer_bytes(const ds41_config *c, unsigned long long *lb, unsigned long long *first_extra,
                            unsigned long long *last_extra);
/* The default stages: among the allowed cuts, those that make the largest stage's weight
 * bytes smallest (ties: the earliest cuts); the cuts at KV sources alone unless the others
 * make the largest stage DS41_STAGE_FINER_PCT % smaller. 0, or -1 with err when the layers cannot be split
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
