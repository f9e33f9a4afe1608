/* Sampler (spec 3.15): greedy = first maximum; reproducible for a seed; filters (top-k,
 * top-p, min-p) restrict the support as documented in src/engine/sampler.c; the exponential race
 * samples the softmax distribution (frequency check with a 6-sigma tolerance). */
#include "check.h"
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define N 1000

static float sc[N];
static int isc[N];

static void test_greedy(void) {
    float l[6] = { 1.0f, 3.0f, -2.0f, 3.0f, 0.5f, 3.0f };
    CHECK(ds41_argmax(l, 6) == 1, "first maximum");
    ds41_sampler s;
    ds41_sampler_init(&s, 0.0f, 0, 1.0f, 0.0f, 42);
    CHECK(ds41_sample(&s, l, 6, sc, isc) == 1, "temperature 0 is greedy");
    float m[3] = { -INFINITY, -INFINITY, -INFINITY };
    CHECK(ds41_argmax(m, 3) == 0, "all -inf: index 0");
    float nanl[3] = { NAN, 2.0f, 1.0f };
    CHECK(ds41_argmax(nanl, 3) == 1, "a NaN is not a maximum");
}

static void fill_logits(float *l, unsigned seed) {
    for (int i = 0; i < N; i++) {
        seed = seed * 1103515245u + 12345u;
        l[i] = (float)((seed >> 8) & 0xFFFF) / 65536.0f * 6.0f - 3.0f;
    }
}

static void test_reproducible(void) {
    static float l[N];
    fill_logits(l, 7);
    ds41_sampler a, b, c;
    ds41_sampler_init(&a, 0.8f, 50, 0.95f, 0.01f, 1234);
    ds41_sampler_init(&b, 0.8f, 50, 0.95f, 0.01f, 1234);
    ds41_sampler_init(&c, 0.8f, 50, 0.95f, 0.01f, 1235);
    int same_ab = 0, same_ac = 0;
    for (int i = 0; i < 200; i++) {
        int x = ds41_sample(&a, l, N, sc, isc), y = ds41_sample(&b, l, N, sc, isc), z = ds41_sample(&c, l, N, sc, isc);
        same_ab += x == y;
        same_ac += x == z;
    }
    CHECK(same_ab == 200, "same seed: %d of 200 equal", same_ab);
    CHECK(same_ac < 200, "a different seed gave the identical 200-token sequence");
}

static void test_filters(void) {
    static float l[N];
    fill_logits(l, 99);
    /* the 5 best ids by logit (ties impossible for this data: checked) */
    int best[5];
    for (int k = 0; k < 5; k++) {
        int bi = -1;
        for (int i = 0; i < N; i++) {
            int taken = 0;
            for (int j = 0; j < k; j++) taken |= best[j] == i;
            if (!taken && (bi < 0 || l[i] > l[bi])) bi = i;
        }
        best[k] = bi;
    }
    ds41_sampler s;
    /* top-k 5 at a high temperature: only the 5 best ever come out, and all of them do */
    ds41_sampler_init(&s, 5.0f, 5, 1.0f, 0.0f, 1);
    int seen[5] = { 0 }, outside = 0;
    for (int i = 0; i < 2000; i++) {
        int t = ds41_sample(&s, l, N, sc, isc), in = 0;
        for (int k = 0; k < 5; k++) if (t == best[k]) { seen[k]++; in = 1; }
        outside += !in;
    }
    CHECK(outside == 0, "top-k: %d samples outside the top 5", outside);
    for (int k = 0; k < 5; k++) CHECK(seen[k] > 0, "top-k: best[%d] never sampled", k);
    /* top-k 1 is greedy */
    ds41_sampler_init(&s, 1.0f, 1, 1.0f, 0.0f, 2);
    for (int i = 0; i < 50; i++) CHECK(ds41_sample(&s, l, N, sc, isc) == best[0], "top-k 1");
    /* a tiny top-p keeps only the most probable token */
    ds41_sampler_init(&s, 1.0f, 0, 1e-6f, 0.0f, 3);
    for (int i = 0; i < 50; i++) CHECK(ds41_sample(&s, l, N, sc, isc) == best[0], "top-p tiny");
    /* min-p 1 keeps only the tokens at the maximum probability */
    ds41_sampler_init(&s, 1.0f, 0, 1.0f, 1.0f, 4);
    for (int i = 0; i < 50; i++) CHECK(ds41_sample(&s, l, N, sc, isc) == best[0], "min-p 1");
    /* top-p 0.6 over p = 0.5, 0.3, 0.2: the shortest prefix reaching 0.6 is {0, 1}, so
     * token 2 never comes out */
    float q[3] = { logf(0.5f), logf(0.3f), logf(0.2f) };
    ds41_sampler_init(&s, 1.0f, 0, 0.6f, 0.0f, 5);
    int cnt[3] = { 0 };
    for (int i = 0; i < 3000; i++) cnt[ds41_sample(&s, q, 3, sc, isc)]++;
    CHECK(cnt[2] == 0 && cnt[0] > 0 && cnt[1] > 0, "top-p 0.6: counts %d %d %d", cnt[0], cnt[1], cnt[2]);
    /* min-p 0.5: threshold 0.25 drops token 2 (0.2) only */
    ds41_sampler_init(&s, 1.0f, 0, 1.0f, 0.5f, 6);
    memset(cnt, 0, sizeof cnt);
    for (int i = 0; i < 3000; i++) cnt[ds41_sample(&s, q, 3, sc, isc)]++;
    CHECK(cnt[2] == 0 && cnt[1] > 0, "min-p 0.5: counts %d %d %d", cnt[0], cnt[1], cnt[2]);
}

static void test_distribution(void) {
    /* p = 0.5 0.3 0.2; 40000 draws: the standard deviation of a frequency is at most
     * sqrt(0.25/40000) = 0.0025, so 0.015 is 6 sigma */
    float q[3] = { logf(0.5f), logf(0.3f), logf(0.2f) };
    ds41_sampler s;
    ds41_sampler_init(&s, 1.0f, 0, 1.0f, 0.0f, 77);
    int cnt[3] = { 0 };
    const int n = 40000;
    for (int i = 0; i < n; i++) cnt[ds41_sample(&s, q, 3, sc, isc)]++;
    double want[3] = { 0.5, 0.3, 0.2 };
    for (int i = 0; i < 3; i++)
        CHECK(fabs((double)cnt[i] / n - want[i]) < 0.015, "token %d frequency %.4f, want %.1f", i, (double)cnt[i] / n, want[i]);
    /* temperature 2 flattens: p ~ sqrt of the above, renormalised: 0.41 0.32 0.26 */
    ds41_sampler_init(&s, 2.0f, 0, 1.0f, 0.0f, 78);
    memset(cnt, 0, sizeof cnt);
    for (int i = 0; i < n; i++) cnt[ds41_sample(&s, q, 3, sc, isc)]++;
    double z = sqrt(0.5) + sqrt(0.3) + sqrt(0.2);
    for (int i = 0; i < 3; i++)
        CHECK(fabs((double)cnt[i] / n - sqrt(want[i]) / z) < 0.015, "T=2 token %d frequency %.4f", i, (double)cnt[i] / n);
}

int main(void) {
    RUN_CASE(test_greedy);
    RUN_CASE(test_reproducible);
    RUN_CASE(test_filters);
    RUN_CASE(test_distribution);
    return check_exit();
}
