/* ds41 sampling (spec 3.15).
 *
 * temperature <= 0: greedy, the first maximum (lowest id among equal logits).
 * Otherwise, in this order:
 *   1. scale: l[i] / fp32(max(temperature, 1e-5))            (FP32)
 *   2. top-k (top_k > 0): keep the k largest scaled logits, equal values to the lower id
 *   3. softmax over the kept tokens (plain FP32: max, expf, sum in ascending id, divide)
 *   4. top-p (top_p < 1): sort the kept tokens by probability (descending, ties lower id) and
 *      keep the shortest prefix whose cumulative probability reaches top_p (at least one)
 *   5. min-p (min_p > 0): drop tokens whose probability is below min_p * (largest probability)
 *   6. exponential race: pick argmax(p[i] / E[i]) over the kept tokens, E[i] ~ Exp(1) drawn
 *      from the sampler's xoroshiro128+ stream in ascending token id, one draw per kept token
 *      (first maximum on ties). This is the Gumbel-max trick in exponential form, so no
 *      renormalisation is needed after the filters (it would scale every p[i] alike).
 * The stream is seeded with splitmix64(seed), so a seed reproduces a run. */
#define _GNU_SOURCE
#include "sampler.h"

#include <math.h>
#include <stdlib.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint64_t xoro_next(uint64_t *s) {
    uint64_t s0 = s[0], s1 = s[1], r = s0 + s1;
    s1 ^= s0;
    s[0] = ((s0 << 24) | (s0 >> 40)) ^ s1 ^ (s1 << 16);
    s[1] = (s1 << 37) | (s1 >> 27);
    return r;
}

/* Exp(1) variate: -log(u) with u uniform in (0, 1] from the top 53 bits. */
static double exp1(uint64_t *s) {
    double u = (double)((xoro_next(s) >> 11) + 1) * (1.0 / 9007199254740992.0);
    return -log(u);
}

void ds41_sampler_init(ds41_sampler *s, float temperature, int top_k, float top_p, float min_p, uint64_t seed) {
    s->temperature = temperature;
    s->top_k = top_k;
    s->top_p = top_p;
    s->min_p = min_p;
    s->lp = NULL;
    uint64_t x = seed;
    s->rng[0] = splitmix64(&x);
    s->rng[1] = splitmix64(&x);
    if (!s->rng[0] && !s->rng[1]) s->rng[1] = 1;   /* xoroshiro must not be all zero */
}

int ds41_argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best] || (x[best] != x[best] && x[i] == x[i])) best = i;
    return best;
}

/* rank order: larger value first, equal values to the lower id (qsort_r keeps it reentrant) */
static int cmp_rank(const void *a, const void *b, void *vals) {
    int i = *(const int *)a, j = *(const int *)b;
    const float *v = vals;
    float vi = v[i], vj = v[j];
    if (vi > vj) return -1;
    if (vi < vj) return 1;
    return (i > j) - (i < j);
}
static int cmp_id(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    return (i > j) - (i < j);
}

/* min-heap on rank (root = the worst kept) for top-k selection */
static int worse(const float *v, int a, int b) { return v[a] < v[b] || (v[a] == v[b] && a > b); }
static void sift_down(const float *v, int *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && worse(v, h[l], h[m])) m = l;
        if (r < n && worse(v, h[r], h[m])) m = r;
        if (m == i) return;
        int t = h[i]; h[i] = h[m]; h[m] = t;
        i = m;
    }
}

int ds41_sample_filter(const ds41_sampler *s, const float *logits, int n, float *scratch, int *iscratch) {
    if (n <= 0) return 0;
    float tdiv = s->temperature > 1e-5f ? s->temperature : 1e-5f;
    float *v = scratch;
    int *ids = iscratch;
    for (int i = 0; i < n; i++) {
        v[i] = logits[i] / tdiv;
        if (v[i] != v[i]) v[i] = -INFINITY;   /* a NaN logit is never sampled */
    }
    int m = n;
    if (s->top_k > 0 && s->top_k < n) {
        int k = s->top_k;
        for (int i = 0; i < k; i++) ids[i] = i;
        for (int i = k / 2 - 1; i >= 0; i--) sift_down(v, ids, k, i);
        for (int i = k; i < n; i++)
            if (worse(v, ids[0], i)) { ids[0] = i; sift_down(v, ids, k, 0); }
        m = k;
        qsort(ids, (size_t)m, sizeof(int), cmp_id);
    } else {
        for (int i = 0; i < n; i++) ids[i] = i;
    }
    /* softmax over the kept tokens (v becomes the probabilities for those ids) */
    float mx = -INFINITY;
    for (int i = 0; i < m; i++) mx = v[ids[i]] > mx ? v[ids[i]] : mx;
    if (mx == -INFINITY) return -ids[0] - 1;
    float sum = 0.0f;
    for (int i = 0; i < m; i++) {
        float e = expf(v[ids[i]] - mx);
        v[ids[i]] = e;
        sum += e;
    }
    for (int i = 0; i < m; i++) v[ids[i]] = v[ids[i]] / sum;
    if (s->top_p < 1.0f) {
        qsort_r(ids, (size_t)m, sizeof(int), cmp_rank, v);
        float cum = 0.0f;
        int keep = 0;
        while (keep < m) {
            cum += v[ids[keep]];
            keep++;
            if (cum >= s->top_p) break;
        }
        m = keep;
        qsort(ids, (size_t)m, sizeof(int), cmp_id);
    }
    if (s->min_p > 0.0f) {
        float pmax = 0.0f;
        for (int i = 0; i < m; i++) pmax = v[ids[i]] > pmax ? v[ids[i]] : pmax;
        float thr = s->min_p * pmax;
        int w = 0;
        for (int i = 0; i < m; i++)
            if (v[ids[i]] >= thr) ids[w++] = ids[i];
        m = w;
    }
    return m;
}

int ds41_sample_race(ds41_sampler *s, const float *probs, const int *ids, int m, int exclude) {
    int best = -1;
    double best_score = -1.0;
    for (int i = 0; i < m; i++) {
        if (ids[i] == exclude) continue;
        double sc = (double)probs[ids[i]] / exp1(s->rng);
        if (sc > best_score) { best_score = sc; best = ids[i]; }
    }
    return best;
}

int ds41_sample(ds41_sampler *s, const float *logits, int n, float *scratch, int *iscratch) {
    if (n <= 0) return 0;
    if (!(s->temperature > 0.0f)) return ds41_argmax(logits, n);
    int m = ds41_sample_filter(s, logits, n, scratch, iscratch);
    if (m < 0) return -m - 1;
    int best = ds41_sample_race(s, scratch, iscratch, m, -1);
    return best < 0 ? iscratch[0] : best;
}

double ds41_sampler_uniform(ds41_sampler *s) {
    return (double)(xoro_next(s->rng) >> 11) * (1.0 / 9007199254740992.0);
}
