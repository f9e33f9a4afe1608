/* ds41 speculative decoding (spec 5.3-5.4, docs/speculative.md): verification of a DSpark block
 * in one forward with the verify layout (every row sees exactly a decode's KV list), greedy
 * acceptance or speculative rejection sampling, rollback of everything the rejected rows
 * wrote, and the confidence scheduler of spec 5.4 (Algorithm 1) over a measured curve. */
#ifndef DS41_SPEC_H
#define DS41_SPEC_H

#include "ds41.h"
#include "forward.h"
#include "sampler.h"

typedef struct ds41_spec_state {
    int cap;                 /* verify rows: block size + 1 */
    ds41_cache_snap snap;
    float *rows;             /* [cap][vocab] logits of the verify rows */
    int32_t pending;         /* the next token, already emitted, not yet fed (-1: none) */
    /* --spec auto's drafting gate (ds41_spec_gate): decayed counts of this session's verified
     * drafts, acc_num[i] / acc_den[i] ~ P(the first i + 1 drafts accepted), plain steps since
     * the last proposal and the probe interval; dormant: the gate's last answer was no (the
     * session then defers its DSpark ring writes until the next proposal, session.c) */
    double acc_num[DS41_SPEC_MAX_DRAFTS], acc_den[DS41_SPEC_MAX_DRAFTS];
    int plain_run, probe_every, dormant;
    int opened;              /* the gate has said yes before: the session's proposal buffers exist */
} ds41_spec_state;

#define DS41_SPEC_DECAY 0.95       /* per verified step: the counts' memory is ~20 drafting steps */
#define DS41_SPEC_PROBE_MIN 8
#define DS41_SPEC_PROBE_MAX 1024
/* the share of decode time the probes of a dormant gate may cost: a probe (the flush of the
 * ring writes its dormant spell deferred, a proposal and one draft, by the curve: flush_s +
 * propose_s + draft_s) comes after at least its cost / this many plain steps */
#define DS41_SPEC_PROBE_BUDGET 0.01

/* Seconds of a step of `width` verify rows for R sequences of which `drafting` proposed
 * (the curve's propose_s each, draft_s per verified draft); Theta = tau / that time (tau
 * itself without a curve). */
double ds41_spec_step_time(const ds41_spec_curve *c, int R, int width, int drafting);
double ds41_spec_theta(const ds41_spec_curve *c, int R, int width, int drafting, double tau);
/* The gate of ds41_spec_want_draft (1 = propose); ds41_spec_observe records a verify of k
 * drafts with `accepted` accepted; ds41_spec_survival = the estimate for position j. */
int ds41_spec_gate(ds41_spec_state *st, const ds41_spec_curve *c, int kmax);
void ds41_spec_observe(ds41_spec_state *st, int k, int accepted);
double ds41_spec_survival(const ds41_spec_state *st, int j);
/* The fewest plain steps before a probe of a dormant gate (DS41_SPEC_PROBE_BUDGET): first = 1,
 * the session's first (the curve's cold_s when it is dearer than a warm probe), else between
 * two (propose_s + draft_s + flush_s). */
int ds41_spec_probe_floor(const ds41_spec_curve *c, int first);
/* max over K = 1..kmax of Theta with survivals surv[0..K) (NULL: all 1), one sequence, drafting */
double ds41_spec_best_theta(const ds41_spec_curve *c, int kmax, const double *surv, int *best_k);

int ds41_spec_state_init(ds41_spec_state *st, const ds41_engine *e, ds41_err *err);
void ds41_spec_state_free(ds41_spec_state *st);

/* Verifies block = [t_next, drafts[0..k)] at positions P .. P+k (P = the cache position): one
 * forward (verify layout, all-row logits), the DSpark rings seeded when `draft`, acceptance
 * (greedy when the sampler's temperature is 0, else rejection sampling with the sampler's
 * filters and stream), rollback to P + 1 + A. Writes the A accepted drafts and then the next
 * token (greedy: argmax of the row after the last accepted; sampling: the residual sample on a
 * rejection, a fresh sample after a full acceptance) to out[0..A]; out_logits (or NULL) gets
 * the row each came from. On return seq->logits is that row and the next token is st->pending.
 * Returns A + 1, or -1 (err; the sequence may be partly written). */
int ds41_spec_verify_block(ds41_engine *e, ds41_seq *q, ds41_sampler *smp, int draft, ds41_spec_state *st,
                           int32_t t_next, const int32_t *drafts, int k, int32_t *out, float *out_logits, int *n_acc,
                           ds41_err *err);

/* ds41_spec_verify_block in three parts, for a batched step (ds41_batch_step) that runs the
 * verify forwards of many sequences in one ds41_forward_batch:
 *   begin: the checks (errors start with "verify:"; nothing changed), the block into
 *          block[0..k] (room for DS41_SPEC_MAX_DRAFTS + 1), the snapshot, q->verify = 1;
 *          returns the forward's width k + 1 or -1;
 *   the forward over block with all-row logits into st->rows;
 *   end:   q->verify = 0, DSpark seeding, acceptance, rollback (as ds41_spec_verify_block). */
int ds41_spec_verify_begin(ds41_engine *e, ds41_seq *q, ds41_spec_state *st, int32_t t_next, const int32_t *drafts,
                           int k, int32_t *block, ds41_err *err);
int ds41_spec_verify_end(ds41_engine *e, ds41_seq *q, ds41_sampler *smp, int draft, ds41_spec_state *st,
                         const int32_t *block, int k, int32_t *out, float *out_logits, int *n_acc, ds41_err *err);

/* ds41_spec_verify_end with the outcome {accepted, next token} decided elsewhere or for
 * elsewhere: given != NULL skips the acceptance (this rank may not hold the rows' logits) and
 * keeps given's rows (checked: 0 <= A <= k, next in the vocabulary); else decided != NULL gets
 * this rank's outcome. Either way the outcome hook and the --split layers command path are
 * left out: the caller carries the outcome (serve --split layers, ds41_batch_end). Both NULL:
 * ds41_spec_verify_end. */
int ds41_spec_verify_end_as(ds41_engine *e, ds41_seq *q, ds41_sampler *smp, int draft, ds41_spec_state *st,
                            const int32_t *block, int k, int32_t *out, float *out_logits, int *n_acc, ds41_err *err,
                            const int32_t *given, int32_t *decided);
/* serve --split layers (src/serve/serve_mpi_pipe.c): in a pipelined step (ds41_pipe_deferred)
 * ds41_batch_step leaves each batched verify block's acceptance and rollback for later (its
 * logits reach rank 0 only when the step's logits are collected; a verify the batched forward
 * cannot take fails there). ds41_batch_end, once they are in, ends them in item order:
 * outcome[2v], outcome[2v + 1] belong to the v-th item with verify set. take = 0 (rank 0):
 * decides each (its sampler stream, its logits processor) and writes the outcome ({-1, -1}
 * for a block with no end pending or whose end failed); take = 1 (the other stages): keeps
 * those rows (an item rank 0 has no outcome for fails). Every rank then rolls back its own
 * layers' state; the drafting gate's counts are recorded. Returns the items that failed
 * (their sessions say why, and break). */
int ds41_batch_end(ds41_batch_item *it, int count, int32_t *outcome, int take);

/* One decider for a job of several processes (ds41 serve under mpiexec, src/serve/serve_mpi.c):
 * when set, ds41_spec_verify_end calls it after the acceptance and before the rollback with
 * v = {A, next} and the block's k drafts. Rank 0's hook publishes them; a follower's replaces
 * them with rank 0's (it holds neither rank 0's sampler stream nor its logits processor), so
 * every rank keeps and rolls back the same rows. 0, or -1 with a message in err (the verify
 * fails). NULL (the default): each process decides alone (every other command, whose ranks
 * sample alike). The outcome is checked (0 <= A <= k, next in the vocabulary). */
typedef int (*ds41_spec_outcome_fn)(int32_t v[2], int k, char *err, size_t errcap);
void ds41_spec_set_outcome_hook(ds41_spec_outcome_fn fn);

/* The verify forward alone, then everything rolled back (keep = 0): what a step of width T
 * costs, for the calibration. */
int ds41_spec_time_forward(ds41_engine *e, ds41_seq *q, ds41_spec_state *st, const int32_t *tokens, int T,
                           ds41_err *err);

#endif
