/* ds41 serve: grammar masks computed beside the forward. Before a step's forward the scheduler
 * hands the (matcher, state) of each constrained sequence about to sample to a helper thread,
 * which computes and caches those masks (ds41_gmatch_prefetch) while the forward runs; the
 * sampler then finds them cached. The matchers' locks keep the sampler and the helper apart,
 * and the scheduler waits for the helper before anything can free a matcher. */
#ifndef DS41_SERVE_GPREFETCH_H
#define DS41_SERVE_GPREFETCH_H

#include "grammar.h"

typedef struct ds41_gprefetch ds41_gprefetch;

/* The helper thread; NULL when it cannot start (masks are then computed when sampling). */
ds41_gprefetch *ds41_gprefetch_start(void);
/* Joins the thread (after the job in progress) and frees it. */
void ds41_gprefetch_stop(ds41_gprefetch *p);
/* Queues n masks (gm[i], state[i]), the first 4096 of more; the previous job must have been
 * waited for. Returns how many were queued. */
int ds41_gprefetch_submit(ds41_gprefetch *p, ds41_gmatch *const *gm, const int *state, int n);
/* Returns once the queued masks are done. */
void ds41_gprefetch_wait(ds41_gprefetch *p);
/* Masks the helper computed (those not cached already) since the start. */
long long ds41_gprefetch_count(ds41_gprefetch *p);

#endif
