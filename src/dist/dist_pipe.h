/* ds41 pipeline parallelism under MPI: `mpiexec -n N ds41 ... --split layers`
 * (docs/distributed.md). Rank r runs the stage of layers first[r] .. first[r + 1] - 1
 * (dist_stage.h: the default balances weight bytes, --layer-map overrides); the first stage
 * also embeds the tokens, the last runs the final norm and the head. Per forward each stage
 * receives from the stage before it the rows of the residual stream its first layer reads
 * (the row plan's key rows: all of them in a full prefill, fewer decoder rows in a CED
 * prefill), runs its layers with the local MoE, and sends the rows the next stage's first
 * layer reads; the last stage samples and sends every rank the token (the logits row only to
 * a rank that reads it; in serve to rank 0, which samples), so that every rank feeds the
 * tokens one process would. The bytes are the stream's FP32 values, so tokens and logits
 * are bit-identical to one process in every kernel mode.
 *
 * Layer: dist (the engine calls it from the forward loop's layer-range hook). */
#ifndef DS41_DIST_PIPE_H
#define DS41_DIST_PIPE_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "dist_stage.h"

/* main() (ds41_dist_start): takes --split experts|layers|layers:RANGES, --layer-map RANGES and
 * --pipe-batches N out of argv.
 * Returns 1 when a is one of them (v its value), 0 when not, -1 with err (a bad value). */
int ds41_pipe_flag(const char *a, const char *v, char *err, size_t cap);
/* 1 when the job splits the layers (--split layers). */
int ds41_pipe_on(void);
/* serve: the most micro-batches a step is cut into (--pipe-batches N, default 2 x ranks; 1:
 * one batch at a time through the stages), at most DS41_PIPE_MAX_BATCHES. */
#define DS41_PIPE_MAX_BATCHES 128
int ds41_pipe_batches(int ranks);
/* Why the flags above cannot go together (a job flag that needs --split layers), or NULL. */
const char *ds41_pipe_flags_error(void);
/* --layer-map's text, or NULL. */
const char *ds41_pipe_layer_map(void);
/* The flags above folded into a hash (the start-up check compares them across ranks). */
uint64_t ds41_pipe_flags_hash(uint64_t h);

typedef struct ds41_pipe ds41_pipe;
/* Every rank, after the start-up check: this rank's stage of the model (the same on every
 * rank: the default or --layer-map over the config). 0, or -1 with err (the same on every
 * rank: the layers cannot be split so). */
int ds41_pipe_open(const ds41_config *c, ds41_pipe **out, char *err, size_t cap);
void ds41_pipe_close(ds41_pipe *p);
int ds41_pipe_first(const ds41_pipe *p);    /* this rank runs the embedding */
/* 1 when this rank's stage runs layer l (its KV pages, rings and compressor state are written
 * here; a prefix-cache block keeps this stage's part only, the other stores' pages NULL). */
int ds41_pipe_holds(const ds41_pipe *p, int l);
int ds41_pipe_last(const ds41_pipe *p);     /* this rank runs the head */
/* The forward loop, in front of layer l, over the N stacked rows of the stream X (hc x dim
 * per row) and pre (hc per row); k0: the first row layer l reads. At this stage's first layer
 * the rows [k0, N) arrive from the stage before (and side_n bytes into side); at the next
 * stage's first layer they go to it (with side_n bytes of side). Returns 1 when this rank runs layer l, 0 when not, -1 with err. */
int ds41_pipe_layer(ds41_pipe *p, float *X, float *pre, int l, size_t k0, size_t N, void *side, size_t side_n, char *err,
                    size_t cap);
/* What crosses the cut in front of layer l besides the stream (dist_stage.h), when l is this
 * stage's first layer (received: the side bytes of ds41_pipe_layer arrive with the stream) or
 * the next stage's (sent); NULL when l is neither or p is NULL. The side bytes are the forward
 * loop's (src/engine/fwd_attn.c ds41_fwd_cut_*): their length follows from the forward's plan,
 * the same on both stages. */
const ds41_cut_need *ds41_pipe_cut(const ds41_pipe *p, int l);
/* 1 when this rank holds the store of KV source i (at layer): its stage runs the layer, or it
 * keeps a replica (a stage that starts after the source, before a layer that reads it). */
int ds41_pipe_holds_store(const ds41_pipe *p, int i, int layer);
/* After the layers: the last stage's n logits floats at rows (V a row). dst[j] / at[j], j < m:
 * the m rows of V floats the forward wants (row at[j] of rows into dst[j]); m < 0: every row
 * (rows itself: they go to every rank; refused when deferred). Returns -1 with err, or flags:
 *   0                   rows hold them on return (they went to every rank);
 *   DS41_PIPE_NOT_HERE  rows do not hold them: they arrive later (deferred, rank 0) or never
 *                       (a middle stage of a deferred step, or an unshared row, below);
 *   DS41_PIPE_UNSHARED  a command's forward (not serve): ids after the last stage. The rows
 *                       stay on the last stage; ds41_session_sample there samples and sends the
 *                       token to every rank (ds41_pipe_token), and only a rank that reads the
 *                       row (ds41_logits: --dump-logits, run --json) has it sent
 *                       (ds41_pipe_fetch). SPMD: every rank asks at the same points. */
#define DS41_PIPE_NOT_HERE 1
#define DS41_PIPE_UNSHARED 2
int ds41_pipe_share(ds41_pipe *p, float *rows, size_t n, size_t V, float *const *dst, const size_t *at, int m, char *err,
                    size_t cap);
/* serve's pipelined step (src/serve/serve_mpi_pipe.c), every rank, on = 1 around a step's
 * forwards: rank 0 runs the first stage of one forward after another without waiting for their
 * logits (it posts their receives; ds41_pipe_collect completes them into dst), the last stage
 * sends the logits to rank 0 only (serve samples there), a middle stage gets none, and the
 * forwards skip the plan's broadcast (the plan's hash travels with the stream instead). */
void ds41_pipe_defer(ds41_pipe *p, int on);
/* Rank 0, after a deferred step's forwards: waits for the logits of the n oldest forwards
 * still pending (n < 0: all; they come from the last stage in the order the forwards went
 * out, so a later step's may stay pending: serve's overlapped steps) and copies each
 * forward's rows to its dst. 0, or -1 with err (a last stage whose step differs). Other
 * ranks: 0 at once. */
int ds41_pipe_collect(ds41_pipe *p, int n, char *err, size_t cap);
/* Rank 0: deferred forwards whose logits have not been collected (other ranks: 0). */
int ds41_pipe_pending(const ds41_pipe *p);
/* serve (every rank, before the load): every forward's logits go to rank 0, which samples (no
 * DS41_PIPE_UNSHARED). */
void ds41_pipe_set_eager(int on);
/* 1 when the last stage samples and sends the tokens (a command under --split layers). */
int ds41_pipe_ids(const ds41_pipe *p);
/* An unshared row: the last stage's V floats at row sent to every rank, received into row
 * elsewhere. The sampled token: *id from the last stage to every rank (4 bytes and a header).
 * A silent or drifted last stage ends the job (--mpi-timeout). */
void ds41_pipe_fetch(ds41_pipe *p, float *row, size_t V);
/* An unshared row reduced on the last stage (ds41_logits_reduce): its n bytes at data to rank 0
 * alone, behind the 32-byte header (counted with the logits sent); the middle stages take no
 * part. A silent or drifted last stage ends the job. */
void ds41_pipe_reduced(ds41_pipe *p, void *data, size_t n);
void ds41_pipe_token(ds41_pipe *p, int *id);
/* --spec under --split layers (a command, ids after the last stage): the DSpark stages run on
 * the last stage only (no stage starts after the first target layer, dist_stage.h: ds41_pipe_holds_last).
 * The last stage's n bytes at data go to every rank behind a 32-byte header (step, kind, plan
 * hash): the step's drafts (kind 2), a verify's outcome (kind 3), the calibration's proposal
 * timing (kind 4). A silent or drifted last stage ends the job (--mpi-timeout). */
void ds41_pipe_spec(ds41_pipe *p, void *data, size_t n, uint32_t kind, const char *what);
/* 1 when layer l is on the last stage. */
int ds41_pipe_holds_last(const ds41_pipe *p, int l);
/* serve --spec under --split layers: the last stage's n bytes at data to rank 0 alone (the
 * proposal of a sequence: kind 5; src/serve/serve_mpi.c), behind the 32-byte header; rank 0
 * receives them into data, the middle stages take no part. A silent or drifted last stage ends
 * the job. Counted with the spec bytes of the DS41_MPI_VERBOSE line. */
void ds41_pipe_answer(ds41_pipe *p, void *data, size_t n, uint32_t kind, const char *what);
/* 1 inside a deferred (pipelined serve) step: a forward's logits reach rank 0 only when
 * ds41_pipe_collect takes them, so a verify block's acceptance waits for the step's end
 * (ds41_batch_end, src/engine/spec.h). p may be NULL (0). */
int ds41_pipe_deferred(const ds41_pipe *p);
/* The stages of the job (1 when p is NULL). */
int ds41_pipe_stages(const ds41_pipe *p);

/* The engine's per-forward hook under --split layers (ds41_engine.step): the plan's hash goes
 * into every stream message of the forward (the next stage compares it with its own), then
 * rank 0's plan is broadcast and checked (ds41_dist_step) unless the step is deferred. */
int ds41_pipe_step(int count, const long long *pos, const int *T, const int32_t *const *tokens, char *err, size_t cap);
/* One line for DS41_MPI_VERBOSE (this rank's layers, rows and bytes sent and received per
 * hop, wait), 0 when the layers are not split. */
int ds41_pipe_report(char *line, size_t cap);

#endif
