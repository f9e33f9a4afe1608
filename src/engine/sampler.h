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
} ds41_sampler;

void ds41_sampler_init(ds41_sampler *s, float temperature, int top_k, float top_p, float min_p, uint64_t seed);
/* Picks a token from logits[n]; scratch must hold n floats and n ints. */
int ds41_sample(ds41_sampler *s, const float *logits, int n, float *scratch, int *iscratch);
int ds41_argmax(const float *x, int n);   /* first maximum */
#endif
