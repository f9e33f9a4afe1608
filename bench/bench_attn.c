/* Sparse-attention micro-benchmark of the P2 / P3 performance points (issue 11 item 6) at the
 * production decode shape: one query row, 64 heads x 512, a list of 128 SWA rows (float, the
 * dequantized ring) + index_topk = 512 compressed entries chosen at random from a store of E
 * entries (288-byte Q4nv records spread over E x 288 bytes, as the 128-token pages hold them).
 *
 *   build/bench/bench_attn [--entries E] [--reps R] [--exact] [--threads N]
 *
 * Settings, interleaved rep by rep, medians of the per-call time (thread CPU time with one
 * thread, wall time with more):
 *   P2 on : the kernel reads the packed records (decoded per block in the kernel);
 *   P2 off: the selected entries are first dequantized into a float copy (forward.c's gather_kv,
 *           ds41_kv_rec_unpack), which the kernel then reads; the copy is timed with it;
 *   P3 on : each block's rows fetched once for all the heads (of a thread);
 *   P3 off: fetched once per head.
 * Also prints the bytes of KV each setting touches and a read-bandwidth probe of the same run
 * (build/bench/bench_kernels has the full probes: bandwidth, FMA peak), and then the indexer's
 * scores of one decode row against the E index keys (32 heads x 128): the SIMD kernel against
 * its scalar definition (ds41_indexer_scores_ref) and the integer kernel on the packed records
 * (ds41_indexer_scores_packed, what the forward runs), medians, and whether all three are
 * bit-identical. */
#include "attention.h"
#include "formats.h"
#include "kernels.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double clk(int threads) {
    struct timespec ts;
    clock_gettime(threads > 1 ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rng = 88172645463325252ULL;
static uint64_t rnd(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }
static float rndf(void) { return (float)((double)(rnd() >> 11) / 9007199254740992.0 * 4.0 - 2.0); }

int main(int argc, char **argv) {
    long long E = 65536;
    int reps = 15, exact = 0, threads = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--entries") && i + 1 < argc) E = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--exact")) exact = 1;
        else { fprintf(stderr, "usage: bench_attn [--entries E] [--reps R] [--exact] [--threads N]\n"); return 2; }
    }
    if (E < 512) E = 512;
    if (reps < 1) reps = 1;
    if (reps > 101) reps = 101;
    enum { H = 64, D = 512, W = 128, K = 512 };
    int RB = D / 2 + D / 16, L = W + K;
    ds41_ctx ctx = { exact, threads, threads > 1 ? ds41_pool_create(threads) : NULL, 0, NULL, NULL, NULL };
    float *q = malloc((size_t)H * D * sizeof(float)), *ring = malloc((size_t)W * D * sizeof(float));
    float *gkv = malloc((size_t)K * D * sizeof(float)), *out = malloc((size_t)H * D * sizeof(float));
    float *sink = malloc(H * sizeof(float)), *v = malloc(D * sizeof(float));
    uint8_t *store = malloc((size_t)E * RB);
    const uint8_t **grec = malloc(K * sizeof(uint8_t *));
    int32_t *list = malloc((size_t)L * sizeof(int32_t)), *sel = malloc(K * sizeof(int32_t));
    if (!q || !ring || !gkv || !out || !sink || !v || !store || !grec || !list || !sel) return 1;
    for (int i = 0; i < H * D; i++) q[i] = ds41_bf16_round(rndf() * 0.1f);
    for (int i = 0; i < W * D; i++) ring[i] = ds41_bf16_round(rndf());
    for (int h = 0; h < H; h++) sink[h] = rndf();
    for (long long j = 0; j < E; j++) {
        for (int d = 0; d < D; d++) v[d] = ds41_bf16_round(rndf());
        ds41_pack_q4nv(v, D, store + (size_t)j * RB, store + (size_t)j * RB + D / 2);
    }
    /* K distinct entries, ascending (the indexer's order) */
    for (int i = 0; i < K; i++) sel[i] = (int32_t)((long long)i * (E / K) + (long long)(rnd() % (uint64_t)(E / K)));
    for (int i = 0; i < L; i++) list[i] = i;
    float scale = 1.0f / 22.627417f;

    /* read-bandwidth probe: 256 MiB summed with 8 independent accumulators, best of 3 */
    size_t nb = (size_t)64 << 20;
    float *big = malloc(nb * sizeof(float));
    double bw = 0;
    if (big) {
        for (size_t i = 0; i < nb; i++) big[i] = (float)(i & 7);
        for (int r = 0; r < 3; r++) {
            double a = clk(1);
            float s[8] = { 0 };
            for (size_t i = 0; i < nb; i += 8)
                for (int k = 0; k < 8; k++) s[k] += big[i + k];
            double t = clk(1) - a;
            double g = nb * sizeof(float) / t / 1e9;
            if (g > bw && s[0] + s[7] > -1.0f) bw = g;
        }
        free(big);
    }
    printf("sparse attention, one decode row: %d heads x %d, list %d (ring %d float rows + %d of %lld packed entries), "
           "%s kernels%s%s, %d thread%s; read bandwidth probe %.1f GB/s (1 thread, thread CPU time, scalar sum of 256 MiB)\n",
           H, D, L, W, K, E, exact ? "exact" : "fast", exact ? "" : " on the ISA path ", exact ? "" : ds41_kernels_isa(),
           threads, threads > 1 ? "s" : "", bw);

    static const char *names[4] = { "P2 on,  P3 on ", "P2 off, P3 on ", "P2 on,  P3 off", "P2 off, P3 off" };
    static const unsigned masks[4] = { 0, DS41_ABLATE_P2, DS41_ABLATE_P3, DS41_ABLATE_P2 | DS41_ABLATE_P3 };
    double t[4][101];
    float *ref = malloc((size_t)H * D * sizeof(float));
    int same = 1;
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < 4; k++) {
            ctx.ablate = masks[k];
            ds41_kvset kv;
            memset(&kv, 0, sizeof kv);
            kv.part[0] = ring;
            kv.n[0] = W;
            double t0 = clk(threads);
            if (masks[k] & DS41_ABLATE_P2) {
                /* gather_kv: ds41_kv_rec_unpack of each selected entry into the float copy */
                for (int i = 0; i < K; i++)
                    ds41_unpack_q4nv(store + (size_t)sel[i] * RB, store + (size_t)sel[i] * RB + D / 2, D, gkv + (size_t)i * D);
                kv.part[1] = gkv;
            } else {
                for (int i = 0; i < K; i++) grec[i] = store + (size_t)sel[i] * RB;
                kv.rec[1] = grec;
            }
            kv.n[1] = K;
            ds41_sparse_attn(&ctx, H, D, q, 1, &kv, list, L, sink, scale, out);
            t[k][r] = clk(threads) - t0;
            if (r == 0 && k == 0) memcpy(ref, out, (size_t)H * D * sizeof(float));
            else same &= !memcmp(ref, out, (size_t)H * D * sizeof(float));
        }
    printf("%-16s %10s %8s %16s\n", "setting", "ms/call", "vs on", "KV bytes touched");
    double base = 0;
    for (int k = 0; k < 4; k++) {
        qsort(t[k], (size_t)reps, sizeof(double), cmp_d);
        double m = t[k][reps / 2];
        if (k == 0) base = m;
        int fetch = masks[k] & DS41_ABLATE_P3 ? H : threads;   /* fetches of each row */
        double by = (double)W * D * 4 * fetch + (masks[k] & DS41_ABLATE_P2 ? K * (RB + D * 4.0) + (double)K * D * 4 * fetch
                                                                         : (double)K * RB * fetch);
        printf("%-16s %10.3f %8.3f %13.2f MB\n", names[k], m * 1e3, m / base, by / 1e6);
    }
    printf("all settings bit-identical: %s\n", same ? "yes" : "NO");

    /* The indexer's scores of the same decode row against all E index keys (32 heads x 128,
     * Q4mx values as the store holds them): the SIMD kernel against its scalar definition. */
    {
        enum { NH = 32, ID = 128 };
        ds41_config cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.index_n_heads = NH;
        cfg.index_head_dim = ID;
        float *iq = malloc((size_t)NH * ID * sizeof(float)), *wt = malloc(NH * sizeof(float));
        enum { RBI = ID / 2 + ID / 32 };
        float *ik = malloc((size_t)E * ID * sizeof(float)), *sa = malloc((size_t)E * sizeof(float)),
              *sb = malloc((size_t)E * sizeof(float)), *sc = malloc((size_t)E * sizeof(float));
        uint8_t *rec = malloc((size_t)E * RBI);
        if (!iq || !wt || !ik || !sa || !sb || !sc || !rec) return 1;
        for (int i = 0; i < NH * ID; i++) iq[i] = rndf();
        for (long long i = 0; i < E * ID; i++) ik[i] = rndf();
        ds41_q4mx_qdq(iq, NH * ID);
        for (long long j = 0; j < E; j++) ds41_pack_q4mx(ik + j * ID, ID, rec + j * RBI, rec + j * RBI + ID / 2);
        for (long long j = 0; j < E; j++) ds41_ik_rec_unpack(&cfg, rec + j * RBI, 1, ik + j * ID);
        const uint8_t *pg = rec;
        ds41_ik_keys keys = { &pg, E, 0, RBI };
        long long fell0 = ds41_indexer_dotf_pairs;
        for (int h = 0; h < NH; h++) wt[h] = ds41_bf16_round(rndf() / 16);
        double ti[3][101];
        int isame = 1;
        for (int r = 0; r < reps; r++) {
            double t0 = clk(threads);
            ds41_indexer_scores_packed(&ctx, &cfg, iq, wt, &keys, (int)E, (int)E, sc);
            ti[2][r] = clk(threads) - t0;
            t0 = clk(threads);
            ds41_indexer_scores(&ctx, &cfg, iq, wt, ik, (int)E, (int)E, sa);
            ti[0][r] = clk(threads) - t0;
            t0 = clk(threads);
            ds41_indexer_scores_ref(&ctx, &cfg, iq, wt, ik, (int)E, (int)E, sb);
            ti[1][r] = clk(threads) - t0;
            isame &= !memcmp(sa, sb, (size_t)E * sizeof(float)) && !memcmp(sa, sc, (size_t)E * sizeof(float));
        }
        qsort(ti[0], (size_t)reps, sizeof(double), cmp_d);
        qsort(ti[1], (size_t)reps, sizeof(double), cmp_d);
        qsort(ti[2], (size_t)reps, sizeof(double), cmp_d);
        double a = ti[0][reps / 2], b = ti[1][reps / 2], c = ti[2][reps / 2], mac = (double)E * NH * ID;
        printf("indexer scores, one decode row against %lld index keys (%d heads x %d): SIMD %.3f ms (%.1f GMAC/s), "
               "scalar %.3f ms (%.1f GMAC/s), %.1fx; bit-identical: %s\n", E, NH, ID, a * 1e3, mac / a / 1e9, b * 1e3,
               mac / b / 1e9, b / a, isame ? "yes" : "NO");
        printf("indexer scores on the packed records (integer dots): %.3f ms (%.1f GMAC/s), %.2fx the SIMD float kernel; "
               "keys read %.1f MB against %.1f MB of floats; pairs that took the float dot: %lld of %lld\n", c * 1e3,
               mac / c / 1e9, a / c, (double)E * RBI / 1e6, (double)E * ID * 4 / 1e6, ds41_indexer_dotf_pairs - fell0,
               (long long)reps * E * NH);
        same &= isame;
        free(iq); free(wt); free(ik); free(sa); free(sb); free(sc); free(rec);
    }
    if (ctx.pool) ds41_pool_destroy(ctx.pool);
    return same ? 0 : 1;
}
