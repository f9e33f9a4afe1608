/* ds41 sampling (spec 3.15): greedy (first maximum), temperature, top-k, top-p, min-p, seed;
 * the spec's exponential-race sampler. */
#ifndef DS41_SAMPLER_H
#define DS41_SAMPLER_H
#include <stdint.h>

typedef struct ds41_sampler {
    float temperature;   /* 0 = greedy */
    int top_k;           /* 0 = off */
    float top_p;         /* 1 = off */
    float min_p;         /* 0 = off */
    uint64_t rng[2];     /* xoroshiro128+ state from the seed */
    /* logits processing before sampling (lproc.h; NULL: none): applied by the session's
     * sampling and the speculative verify, not by ds41_sample itself */
    struct ds41_lproc *lp;
} ds41_sampler;

void ds41_sampler_init(ds41_sampler *s, float temperature, int top_k, float top_p, float min_p, uint64_t seed);
/* Picks a token from logits[n]; scratch must hold n floats and n ints. */
int ds41_sample(ds41_sampler *s, const float *logits, int n, float *scratch, int *iscratch);
int ds41_argmax(const float *x, int n);   /* first maximum */

/* The pieces of ds41_sample (temperature > 0), for speculative rejection sampling (spec.c):
 * ds41_sample_filter applies steps 1-5 and returns m, the number of kept tokens, with their
 * ids ascending in iscratch[0..m) and their (not renormalised) probabilities at
 * scratch[id]; a negative return -id-1 means every logit was -inf or NaN (id is the answer).
 * ds41_sample_race runs step 6 over the kept ids, skipping `exclude` (-1: none), and returns
 * the pick (-1 if nothing is left). ds41_sample = filter + race. ds41_sampler_uniform: a
 * uniform double in [0, 1) from the same stream. */
int ds41_sample_filter(const ds41_sampler *s, const float *logits, int n, float *scratch, int *iscratch);
int ds41_sample_race(ds41_sampler *s, const float *probs, const int *ids, int m, int exclude);
double ds41_sampler_uniform(ds41_sampler *s);
#endif
