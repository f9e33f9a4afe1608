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

#include "dist.h"
#include "dist_pipe.h"
#include "forward.h"

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

void ds41_smirror_pipe_end(ds41_engine *e, int forwards) {
    if (!e->pipe) return;
    char err[512];
    int rc = ds41_pipe_collect(e->pipe, forwards, err, sizeof err);
    /* rank 0's sessions would sample from logits that never came: the job ends (serve's
     * fault hook answers the requests first) */
#ifdef DS41_HAVE_MPI
    if (rc) ds41_dist_fatal(1, "%s", err);
#else
    (void)rc;   /* no stages without MPI */
#endif
}

int ds41_smirror_pipe_step(ds41_engine *e, ds41_batch_item *it, int count) {
    int forwards, failed = ds41_smirror_pipe_begin(e, it, count, &forwards);
    ds41_smirror_pipe_end(e, forwards);
    return failed;
}
