/* ds41 DSpark draft forward (spec 5.1-5.2): the context projection, the per-stage context
 * rings, the draft blocks (1 known token + noise tokens, non-causal inside the block), the
 * Markov head and the confidence head. Verification is a later issue.
 *
 * Use with the target forward of forward.h:
 *   after every target forward (prefill, extend or decode) over positions [p0, p0 + n):
 *       ds41_dspark_seed(e, &seq->cache, seq->main_hidden, seq->mh_rows, seq->mh_pos0, err)
 *     (writes the context key of every kept row into each stage's ring, slot p mod window);
 *   at a target step that processed position P (P >= 1) and sampled t_next = t_{P+1}:
 *       ds41_dspark_propose(e, &seq->cache, <main_hidden row of P>, P, t_next, sampler, ids, conf, err)
 *     which proposes block_size tokens for positions P+2 .. P+1+block_size and returns their
 *     raw confidence logits (sigmoid(conf[k]) = acceptance probability of ids[k] given the
 *     earlier ones). propose rewrites ring slot P mod window itself before each stage's
 *     attention (spec 5.2), with the same bytes seed wrote, so seeding P first is harmless. */
#ifndef DS41_DSPARK_H
#define DS41_DSPARK_H

#include "cache.h"
#include "forward.h"
#include "sampler.h"

#define DS41_DSPARK_MAX_BLOCK 64   /* = the config loader's bound on dspark_block_size */

/* ctx rows = rmsnorm(main_proj(main_hidden), mtp.0.main_norm): [n, dim] from
 * main_hidden [n, n_targets * dim] (BF16 values). */
int ds41_dspark_context(const ds41_engine *e, const float *main_hidden, int n, float *ctx_rows, ds41_err *err);

/* Writes the context keys of positions pos0 .. pos0+n-1 into every stage's ring. n may be 0. */
int ds41_dspark_seed(const ds41_engine *e, ds41_cache *c, const float *main_hidden, int n, long long pos0,
                     ds41_err *err);

/* One proposal (spec 5.2). main_hidden_row: [n_targets * dim] of position P. sampler: the
 * Markov loop's sampling (NULL = greedy, the only bit-exact choice). Writes ids[block_size]
 * (the proposals out[1..block_size]) and conf[block_size] (raw FP32 logits). */
int ds41_dspark_propose(const ds41_engine *e, ds41_cache *c, const float *main_hidden_row, long long P,
                        int32_t t_next, ds41_sampler *sampler, int32_t *ids, float *conf, ds41_err *err);
/* reuse = 1 (P5 metadata reuse): when the last ds41_dspark_seed covered position P, take its
 * context row instead of recomputing main_proj + main_norm, and skip rewriting ring slot P
 * (seed wrote the same bytes). In exact mode the proposal is bit-identical either way. */
int ds41_dspark_propose_ex(const ds41_engine *e, ds41_cache *c, const float *main_hidden_row, long long P,
                           int32_t t_next, ds41_sampler *sampler, int reuse, int32_t *ids, float *conf, ds41_err *err);

/* Staged proposals with scratch allocated once (no allocation per call; the session owns one).
 * ds41_dspark_begin runs the stages over the block at P after t_next (as propose: P5 reuse,
 * ring slot P); then drafts come one at a time: ds41_dspark_conf(k) is the raw confidence of
 * draft k (k <= drafts made: it reads the block's row k and the token before draft k), and
 * ds41_dspark_next makes the next draft (the final norm and vocabulary head of its row, the
 * Markov bias of the previous token, argmax or the sampler). A caller that verifies K drafts
 * pays K head passes instead of block_size. ds41_dspark_propose_w = begin + every draft, with
 * the same values as ds41_dspark_propose_ex (which allocates a work buffer per call). */
typedef struct ds41_dspark_work ds41_dspark_work;
ds41_dspark_work *ds41_dspark_work_new(const ds41_engine *e, ds41_err *err);
void ds41_dspark_work_free(ds41_dspark_work *w);
int ds41_dspark_begin(const ds41_engine *e, ds41_cache *c, ds41_dspark_work *w, const float *main_hidden_row,
                      long long P, int32_t t_next, int reuse, ds41_err *err);
int ds41_dspark_conf(const ds41_engine *e, ds41_dspark_work *w, int k, float *conf);   /* -1: out of order */
int ds41_dspark_next(const ds41_engine *e, ds41_dspark_work *w, ds41_sampler *sampler, int32_t *id);
int ds41_dspark_made(const ds41_dspark_work *w);
const int32_t *ds41_dspark_ids(const ds41_dspark_work *w);
int ds41_dspark_propose_w(const ds41_engine *e, ds41_cache *c, ds41_dspark_work *w, const float *main_hidden_row,
                          long long P, int32_t t_next, ds41_sampler *sampler, int reuse, int32_t *ids, float *conf,
                          ds41_err *err);

/* n proposals at once, one per sequence (its cache c[i], the main_hidden row of its position
 * P[i], its token t_next[i], P5 reuse when reuse[i]; reuse NULL: none): every block's first nd
 * drafts ids[i][0..nd) and raw confidences conf[i][0..nd), greedy (nd outside 1..B: all B; the
 * entries from nd to B are 0, each draft being a head pass over the n rows). The DSpark stages run once over the
 * n blocks' rows (each block attending its own ring and keys) and each draft's confidence,
 * vocabulary head and Markov head run once over n rows; every row computes what it computes
 * alone (norms, linears and MoE rows do not depend on the rows beside them, in exact and in
 * fast mode), so each proposal equals ds41_dspark_propose_w's with sampler NULL, bit for bit.
 * Scratch is allocated per call. */
int ds41_dspark_propose_batch(const ds41_engine *e, int n, ds41_cache *const *c, const float *const *mh_row,
                              const long long *P, const int32_t *t_next, const int *reuse, int nd, int32_t *const *ids,
                              float *const *conf, ds41_err *err);

#endif
