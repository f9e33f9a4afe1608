/* ds41 serve --split layers under mpiexec (serve_mpi.h, docs/distributed.md "serve --split
 * layers"): a batch step's items run as micro-batches through the stages, overlapped. Rank 0
 * runs the first stage of micro-batch g + 1 while the next stage runs g, so that with G
 * micro-batches and S stages every stage works G of the G + S - 1 turns of a step instead of
 * one in S. The logits go from the last stage to rank 0 only, which collects them after the
 * step's last micro-batch left it and samples as in every serve step. Rank 0's scheduler may
 * begin the next step (other sequences) before it collects one (overlapped steps): begin and
 * end apart. */
#include "serve_mpi.h"

#include <stdio.h>
#include <stdlib.h>

#include "dist.h"
#include "dist_pipe.h"
#include "forward.h"
#include "spec.h"

int ds41_smirror_pipe_groups(const ds41_batch_item *it, int count, int most, int *cut) {
    int G = count < most ? count : most;
    if (G < 1) G = 1;
    long long total = 0, cum = 0;
    for (int i = 0; i < count; i++) total += (long long)it[i].n;
    cut[0] = 0;
    int i = 0;
    for (int g = 1; g < G; g++) {
        /* the shortest run that reaches g / G of the rows, leaving an item for each group after */
        do cum += (long long)it[i++].n;
        while (i < count - (G - g) && cum * G < total * g);
        cut[g] = i;
    }
    cut[G] = count;
    return G;
}

int ds41_smirror_pipe_begin(ds41_engine *e, ds41_batch_item *it, int count, int *forwards) {
    *forwards = 0;
    if (!e->pipe || count < 1) return ds41_batch_step(it, count);
    int cut[DS41_PIPE_MAX_BATCHES + 1];
    int G = ds41_smirror_pipe_groups(it, count, ds41_pipe_batches(ds41_dist_size()), cut), failed = 0;
    int before = ds41_pipe_pending(e->pipe);
    ds41_pipe_defer(e->pipe, 1);
    for (int g = 0; g < G; g++) failed += ds41_batch_step(it + cut[g], cut[g + 1] - cut[g]);
    ds41_pipe_defer(e->pipe, 0);
    *forwards = ds41_pipe_pending(e->pipe) - before;
    return failed;
}

static long long outcome_steps, outcome_bytes;

void ds41_smirror_pipe_outcomes(long long *steps, long long *bytes) {
    *steps = outcome_steps;
    *bytes = outcome_bytes;
}

/* --spec: the step's verify blocks, once rank 0 holds their logits. Rank 0 decides each
 * (ds41_batch_end) and broadcasts the outcomes, {accepted, next token} per verify item of the
 * step (the items are every rank's: rank 0's record); every stage then keeps those rows and
 * rolls back its own layers' state, before the next record. */
static int verify_ends(ds41_batch_item *it, int count) {
    int nv = 0;
    for (int i = 0; i < count; i++) nv += it[i].verify != 0;
    if (nv == 0) return 0;
#ifdef DS41_HAVE_MPI
    size_t nb = (size_t)nv * 2 * sizeof(int32_t);
    int32_t *v = malloc(nb);
    if (!v) ds41_dist_fatal(1, "out of memory for the outcomes of a step's verify blocks");
    int rank0 = ds41_dist_rank() == 0, failed = 0;
    if (rank0) failed = ds41_batch_end(it, count, v, 0);
    if (ds41_dist_bcast(v, nb)) ds41_dist_fatal(1, "serve mirror: the verify outcomes did not reach every rank");
    if (!rank0) failed = ds41_batch_end(it, count, v, 1);
    outcome_steps++;
    outcome_bytes += (long long)nb;
    free(v);
    return failed;
#else
    return 0;   /* no stages without MPI: nothing was deferred */
#endif
}

int ds41_smirror_pipe_end(ds41_engine *e, ds41_batch_item *it, int count, int forwards) {
    if (!e->pipe) return 0;
    char err[512];
    int rc = ds41_pipe_collect(e->pipe, forwards, err, sizeof err);
    /* rank 0's sessions would sample from logits that never came: the job ends (serve's
     * fault hook answers the requests first) */
#ifdef DS41_HAVE_MPI
    if (rc) ds41_dist_fatal(1, "%s", err);
#else
    (void)rc;   /* no stages without MPI */
#endif
    return verify_ends(it, count);
}

int ds41_smirror_pipe_step(ds41_engine *e, ds41_batch_item *it, int count) {
    int forwards, failed = ds41_smirror_pipe_begin(e, it, count, &forwards);
    return failed + ds41_smirror_pipe_end(e, it, count, forwards);
}
