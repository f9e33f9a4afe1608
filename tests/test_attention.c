/* Unit tests of src/layers/attention.c and the CED row plan of src/engine/forward.c: top-k tie rule, index
 * list layouts, candidate blocks, sparse attention (structure, exact vs a double-precision
 * softmax, fast vs exact), indexer scores, and the row plan on the production layer plan.
 * The bit-exact end-to-end check against the Python reference is tests/conformance.test.sh. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "check.h"
#include "config.h"
#include "formats.h"
#include "forward.h"

static uint64_t rng = 88172645463325252ULL;
static uint32_t rnd(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float frand(void) { return (float)((rnd() % 2000001) / 1000000.0 - 1.0); }

static ds41_config tiny_cfg(void) {
    ds41_config c;
    memset(&c, 0, sizeof c);
    c.window = 16;
    c.candidate_block_size = 4;
    c.candidate_topk_blocks = 3;
    c.index_n_heads = 4;
    c.index_head_dim = 64;
    c.head_dim = 64;
    return c;
}

/* ---------------------------------------------------------------- top-k */

/* brute force: repeatedly take the largest remaining value, lowest index on ties */
static void topk_ref(const float *v, int n, int k, int *out) {
    unsigned char *used = calloc((size_t)n, 1);
    for (int c = 0; c < k; c++) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (!used[i] && (best < 0 || v[i] > v[best])) best = i;
        used[best] = 1;
    }
    int m = 0;
    for (int i = 0; i < n; i++) if (used[i]) out[m++] = i;
    free(used);
}

static void test_topk_ties_lower_index(void) {
    /* values from a small set so ties at the k-th value are the rule, with -inf and +inf */
    const float vals[6] = { -INFINITY, 0.0f, 0.0f, 0.5f, 1.0f, INFINITY };
    int out[300], ref[300], scratch[300];
    float v[300];
    for (int trial = 0; trial < 400; trial++) {
        int n = 1 + (int)(rnd() % 300), k = 1 + (int)(rnd() % n);
        for (int i = 0; i < n; i++) v[i] = vals[rnd() % 6];
        ds41_topk(v, n, k, out, scratch);
        topk_ref(v, n, k, ref);
        int same = 1;
        for (int i = 0; i < k; i++) same &= out[i] == ref[i];
        CHECK(same, "trial %d (n %d k %d): selection differs from the brute-force tie rule", trial, n, k);
    }
    /* a hand example: three zeros tie for the last two places; the lower two win */
    float w[6] = { 0.0f, 3.0f, 0.0f, -1.0f, 0.0f, 2.0f };
    ds41_topk(w, 6, 4, out, scratch);
    CHECK(out[0] == 0 && out[1] == 1 && out[2] == 2 && out[3] == 5, "got %d %d %d %d", out[0], out[1], out[2], out[3]);
    /* all -inf: the first k */
    float m[5] = { -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY };
    ds41_topk(m, 5, 2, out, scratch);
    CHECK(out[0] == 0 && out[1] == 1, "all -inf: got %d %d", out[0], out[1]);
}

/* ---------------------------------------------------------------- index lists */

static void test_swa_lists(void) {
    ds41_config c = tiny_cfg();
    int32_t l[16];
    /* one-shot prefill of T = 5: width 5, query 2 lists 0 1 2 -1 -1 */
    int W = ds41_swa_width(&c, 0, 5);
    CHECK(W == 5, "width %d", W);
    ds41_swa_list_positions(&c, 2, 0, W, l);
    CHECK(l[0] == 0 && l[1] == 1 && l[2] == 2 && l[3] == -1 && l[4] == -1, "p=2: %d %d %d %d %d", l[0], l[1], l[2], l[3], l[4]);
    /* T = 40: width 16, query 30 lists 15..30, query 3 lists 0..3 then -1 */
    W = ds41_swa_width(&c, 0, 40);
    CHECK(W == 16, "width %d", W);
    ds41_swa_list_positions(&c, 30, 0, W, l);
    CHECK(l[0] == 15 && l[15] == 30, "p=30: %d..%d", l[0], l[15]);
    ds41_swa_list_positions(&c, 3, 0, W, l);
    CHECK(l[3] == 3 && l[4] == -1 && l[15] == -1, "p=3: %d %d %d", l[3], l[4], l[15]);
    /* truncated (replay) window from position 25: query 30 lists 25..30 then -1 */
    ds41_swa_list_positions(&c, 30, 25, W, l);
    CHECK(l[0] == 25 && l[5] == 30 && l[6] == -1, "truncated: %d %d %d", l[0], l[5], l[6]);
    /* decode at P = 5: slots 6..15 (-1: not yet written), then 0..5 */
    ds41_swa_list_decode(&c, 5, l);
    CHECK(l[0] == -1 && l[9] == -1 && l[10] == 0 && l[15] == 5, "decode P=5: %d %d %d %d", l[0], l[9], l[10], l[15]);
    /* decode at P = 20: oldest slot first: 5, 6, ..., 15, 0, ..., 4 */
    ds41_swa_list_decode(&c, 20, l);
    CHECK(l[0] == 5 && l[10] == 15 && l[11] == 0 && l[15] == 4, "decode P=20: %d %d %d %d", l[0], l[10], l[11], l[15]);
    /* decode at P = 31 (slot 15 newest): 0..15 */
    ds41_swa_list_decode(&c, 31, l);
    CHECK(l[0] == 0 && l[15] == 15, "decode P=31: %d %d", l[0], l[15]);
}

/* ---------------------------------------------------------------- candidate blocks */

static void test_candidate_blocks(void) {
    ds41_config c = tiny_cfg();   /* blocks of 4, keep 3 */
    float s[20];
    for (int j = 0; j < 20; j++) s[j] = 0.0f;
    s[1] = 5.0f;    /* block 0 max 5 */
    s[6] = 1.0f;    /* block 1 max 1 */
    s[9] = 3.0f;    /* block 2 max 3 */
    s[13] = 2.0f;   /* block 3 max 2 */
    /* visible 17 entries -> newest block 4 pinned; blocks 0 and 2 fill the other places */
    for (int j = 17; j < 20; j++) s[j] = -INFINITY;
    uint8_t keep[5];
    int scratch[16];
    ds41_candidate_blocks(&c, s, 20, 17, keep, scratch);
    CHECK(keep[0] && !keep[1] && keep[2] && !keep[3] && keep[4], "keep %d%d%d%d%d", keep[0], keep[1], keep[2], keep[3], keep[4]);
    /* E = 8 with 2 blocks: fewer than 3, both kept unless unreachable (-inf) */
    float t[8] = { 1, 1, 1, 1, -INFINITY, -INFINITY, -INFINITY, -INFINITY };
    ds41_candidate_blocks(&c, t, 8, 3, keep, scratch);
    CHECK(keep[0] && !keep[1], "unreachable block must be dropped: %d %d", keep[0], keep[1]);
    /* ties between equal block maxima go to the lower block */
    float u[16] = { 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0 };
    ds41_candidate_blocks(&c, u, 16, 1, keep, scratch);   /* newest = block 0 pinned */
    CHECK(keep[0] && keep[1] && keep[2] && !keep[3], "ties: %d%d%d%d", keep[0], keep[1], keep[2], keep[3]);
}

/* ---------------------------------------------------------------- sparse attention */

/* BF16 values in [-1, 1] */
static void fill_bf16(float *x, size_t n, float amp) {
    for (size_t i = 0; i < n; i++) x[i] = ds41_bf16_round(frand() * amp);
}

static void test_sparse_attn_structure(void) {
    ds41_ctx ex = { .exact = 1, .n_threads = 1, .pool = NULL };
    enum { H = 2, D = 64, NKV = 100, L = 160 };
    float *q = malloc(sizeof(float) * H * D), *kv = malloc(sizeof(float) * NKV * D);
    float o1[H * D], o2[H * D], o3[H * D], sink[H] = { 0.25f, -1.0f };
    int32_t idx[L], idx2[L];
    fill_bf16(q, H * D, 1.0f);
    fill_bf16(kv, (size_t)NKV * D, 1.0f);
    float scale = 0.125f;
    /* 1. all -1: exactly 0 */
    for (int i = 0; i < L; i++) idx[i] = -1;
    ds41_kvset set = { { kv, NULL, NULL }, { NKV, 0, 0 }, { NULL, NULL, NULL } };
    ds41_sparse_attn(&ex, H, D, q, 1, &set, idx, L, sink, scale, o1);
    int zero = 1;
    for (int i = 0; i < H * D; i++) zero &= o1[i] == 0.0f;
    CHECK(zero, "an all -1 list must give exactly 0");
    /* 2. a leading block of 64 -1s (decode with a young ring) changes nothing */
    for (int i = 0; i < 96; i++) idx2[i] = (int32_t)(rnd() % NKV);
    for (int i = 0; i < 64; i++) idx[i] = -1;
    for (int i = 0; i < 96; i++) idx[64 + i] = idx2[i];
    ds41_sparse_attn(&ex, H, D, q, 1, &set, idx, L, sink, scale, o1);
    ds41_sparse_attn(&ex, H, D, q, 1, &set, idx2, 96, sink, scale, o2);
    CHECK(!memcmp(o1, o2, sizeof o1), "leading empty block changed the result");
    /* 3. the same rows split over three kvset parts give identical results */
    ds41_kvset split = { { kv, kv + 30 * D, kv + 70 * D }, { 30, 40, 30 }, { NULL, NULL, NULL } };
    ds41_sparse_attn(&ex, H, D, q, 1, &split, idx2, 96, sink, scale, o3);
    CHECK(!memcmp(o2, o3, sizeof o2), "kvset parts addressing differs");
    /* 4. the 64-grouping is part of the numerics: moving the block boundary may change bits
     * but stays within the BF16 rounding of p (tolerance below) */
    free(q);
    free(kv);
}

/* out = sum_i softmax_i v_i with the sink in the denominator, all in double */
static void attn_double(const float *q, const float *kv, const int32_t *idx, int L, int D, float sink, double scale,
                        double *out) {
    double m = sink, s[256];
    for (int i = 0; i < L; i++) {
        double d = 0;
        for (int k = 0; k < D; k++) d += (double)q[k] * kv[(size_t)idx[i] * D + k];
        s[i] = d * scale;
        if (s[i] > m) m = s[i];
    }
    double den = exp(sink - m);
    for (int k = 0; k < D; k++) out[k] = 0;
    for (int i = 0; i < L; i++) {
        double p = exp(s[i] - m);
        den += p;
        for (int k = 0; k < D; k++) out[k] += p * kv[(size_t)idx[i] * D + k];
    }
    for (int k = 0; k < D; k++) out[k] /= den;
}

static void test_sparse_attn_vs_double(void) {
    ds41_ctx ex = { .exact = 1, .n_threads = 1, .pool = NULL };
    ds41_ctx fast = { .exact = 0, .n_threads = 1, .pool = NULL };
    enum { H = 4, D = 64, NKV = 200, L = 150, T = 3 };
    float *q = malloc(sizeof(float) * T * H * D), *kv = malloc(sizeof(float) * NKV * D);
    float *oe = malloc(sizeof(float) * T * H * D), *of = malloc(sizeof(float) * T * H * D);
    int32_t *idx = malloc(sizeof(int32_t) * T * L);
    float sink[H] = { 0.0f, 1.0f, -2.0f, 3.0f };
    fill_bf16(q, (size_t)T * H * D, 2.0f);
    fill_bf16(kv, (size_t)NKV * D, 1.0f);
    for (int i = 0; i < T * L; i++) idx[i] = (int32_t)(rnd() % NKV);
    ds41_kvset set = { { kv, NULL, NULL }, { NKV, 0, 0 }, { NULL, NULL, NULL } };
    ds41_sparse_attn(&ex, H, D, q, T, &set, idx, L, sink, 0.125f, oe);
    ds41_sparse_attn(&fast, H, D, q, T, &set, idx, L, sink, 0.125f, of);
    double ref[D], worst = 0, worst_fast = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            attn_double(q + ((size_t)t * H + h) * D, kv, idx + (size_t)t * L, L, D, sink[h], 0.125, ref);
            for (int k = 0; k < D; k++) {
                double e = fabs(oe[((size_t)t * H + h) * D + k] - ref[k]);
                double f = fabs(of[((size_t)t * H + h) * D + k] - oe[((size_t)t * H + h) * D + k]);
                if (e > worst) worst = e;
                if (f > worst_fast) worst_fast = f;
            }
        }
    /* Tolerance: p is rounded to BF16 (relative 2^-9) before the PV sum and the output to
     * BF16 (2^-9 of |out| <= 1), so |err| <= 2 * 2^-9 * max|v| (= 1) plus FP32 noise. */
    CHECK(worst <= 2.0 / 512 + 1e-5, "exact kernel vs double softmax: max |err| %g", worst);
    /* Fast vs exact: the same roundings with FP32 sums; a flipped BF16 rounding of one p or
     * of the output moves a value by at most one BF16 ulp at 1 (2^-7). */
    CHECK(worst_fast <= 1.0 / 128, "fast vs exact: max |diff| %g", worst_fast);
    free(q); free(kv); free(oe); free(of); free(idx);
}

/* Fast mode's sparse attention as a scalar model of its order, for the bit-exact test below:
 * per 64-entry block, q.k as dot_v (16 lanes in two groups of 8, fused multiply-adds, the
 * 8-lane tree sum, then a mul + add tail), the running max, p = expf_x, BF16 p of the listed
 * rows summed from +0 per column (fused for the D & ~7 columns, mul + add for the rest),
 * acc = acc * f + sum, den = den * f + sum of p, the sink, BF16 out. */
static float dot_order(const float *a, const float *b, int n) {
    float l0[8] = { 0 }, l1[8] = { 0 };
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 8; j++) {
            l0[j] = fmaf(a[i + j], b[i + j], l0[j]);
            l1[j] = fmaf(a[i + 8 + j], b[i + 8 + j], l1[j]);
        }
    float v[8], x[4];
    for (int j = 0; j < 8; j++) v[j] = l0[j] + l1[j];
    for (int j = 0; j < 4; j++) x[j] = v[j] + v[j + 4];
    float r = (x[0] + x[2]) + (x[1] + x[3]);
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

static void attn_fast_model(const ds41_ctx *c, const float *q, const float *kv, const int32_t *idx, int L, int D,
                            float sink, float scale, float *out) {
    float m = -1e30f, den = 0.0f, acc[128] = { 0 }, facc[128];   /* D <= 128 */
    for (int b0 = 0; b0 < L; b0 += 64) {
        int n = L - b0 < 64 ? L - b0 : 64;
        float s[64], p[64], bmax = -INFINITY;
        for (int i = 0; i < n; i++) {
            int e = idx[b0 + i];
            s[i] = e < 0 ? -INFINITY : dot_order(q, kv + (size_t)e * D, D) * scale;
            if (s[i] > bmax) bmax = s[i];
        }
        float mn = m > bmax ? m : bmax, f = ds41_expf_x(c, m - mn), bsum = 0.0f;
        for (int i = 0; i < n; i++) p[i] = idx[b0 + i] < 0 ? 0.0f : ds41_expf_x(c, s[i] - mn);
        for (int i = 0; i < n; i++) bsum += p[i];
        for (int d = 0; d < D; d++) facc[d] = 0.0f;
        for (int i = 0; i < n; i++) {
            if (idx[b0 + i] < 0) continue;
            float pb = ds41_bf16_round(p[i]);
            const float *r = kv + (size_t)idx[b0 + i] * D;
            for (int d = 0; d < D; d++) facc[d] = d < (D & ~7) ? fmaf(pb, r[d], facc[d]) : facc[d] + pb * r[d];
        }
        for (int d = 0; d < D; d++) acc[d] = acc[d] * f + facc[d];
        den = den * f + bsum;
        m = mn;
    }
    float dn = den + ds41_expf_x(c, sink - m);
    for (int d = 0; d < D; d++) out[d] = ds41_bf16_round(acc[d] / dn);
}

/* Fast sparse attention bit for bit against attn_fast_model: 5 heads (a group of four
 * sharing each row's loads, P3, and one alone), head widths with a 16-column body only (64),
 * an 8-column remainder (72), a 6-column tail (94) and a 16-column remainder past the
 * AVX-512 value pass's 32 (112), lists with empty (-1) entries and a partial last block, P3
 * on and off, one and two threads, on each ISA path the CPU runs (AVX2, AVX-512). */
static void test_sparse_attn_fast_order(void) {
    enum { H = 5, NKV = 120, L = 150, T = 2 };
    static const int Ds[4] = { 64, 72, 94, 112 };
    static const char *isas[2] = { "avx2", "avx512" };
    const char *prev = ds41_kernels_isa();
    ds41_pool *pool = ds41_pool_create(2);
    for (int k = 0; k < 8; k++) {
        int di = k % 4;
        const char *isa = isas[k / 4];
        if (ds41_kernels_set_isa(isa) != 0) continue;   /* a CPU without AVX-512 */
        int D = Ds[di];
        float *q = malloc(sizeof(float) * T * H * D), *kv = malloc(sizeof(float) * NKV * D);
        float *o = malloc(sizeof(float) * T * H * D), ref[128];
        int32_t *idx = malloc(sizeof(int32_t) * T * L);
        float sink[H] = { 0.0f, 1.0f, -2.0f, 3.0f, 0.5f };
        fill_bf16(q, (size_t)T * H * D, 2.0f);
        fill_bf16(kv, (size_t)NKV * D, 1.0f);
        for (int i = 0; i < T * L; i++) idx[i] = rnd() % 7 == 0 ? -1 : (int32_t)(rnd() % NKV);
        ds41_kvset set = { { kv, NULL, NULL }, { NKV, 0, 0 }, { NULL, NULL, NULL } };
        for (int v = 0; v < 4; v++) {
            ds41_ctx c = { .exact = 0, .n_threads = v & 1 ? 2 : 1, .pool = v & 1 ? pool : NULL,
                           .ablate = v & 2 ? DS41_ABLATE_P3 : 0 };
            ds41_sparse_attn(&c, H, D, q, T, &set, idx, L, sink, 0.125f, o);
            int bad = 0;
            for (int t = 0; t < T; t++)
                for (int h = 0; h < H; h++) {
                    attn_fast_model(&c, q + ((size_t)t * H + h) * D, kv, idx + (size_t)t * L, L, D, sink[h], 0.125f, ref);
                    bad += memcmp(ref, o + ((size_t)t * H + h) * D, sizeof(float) * D) != 0;
                }
            CHECK(bad == 0, "%s, D %d, %d threads, P3 %s: %d of %d head rows differ from the fast order", isa, D,
                  c.n_threads, v & 2 ? "off" : "on", bad, T * H);
        }
        free(q); free(kv); free(o); free(idx);
    }
    ds41_kernels_set_isa(prev);
    ds41_pool_destroy(pool);
}

/* ---------------------------------------------------------------- indexer scores */

static void test_indexer_scores(void) {
    ds41_config c = tiny_cfg();   /* 4 heads x 64 */
    ds41_ctx ex = { .exact = 1, .n_threads = 1, .pool = NULL };
    ds41_ctx fast = { .exact = 0, .n_threads = 1, .pool = NULL };
    enum { NH = 4, ID = 64, E = 40 };
    float iq[NH * ID], ik[E * ID], wt[NH], se[E], sf[E];
    for (int i = 0; i < NH * ID; i++) iq[i] = frand() * 3;
    for (int i = 0; i < E * ID; i++) ik[i] = frand() * 3;
    ds41_q4mx_qdq(iq, NH * ID);
    ds41_q4mx_qdq(ik, E * ID);
    for (int h = 0; h < NH; h++) wt[h] = ds41_bf16_round(frand() / 16);
    ds41_indexer_scores(&ex, &c, iq, wt, ik, E, 30, se);
    ds41_indexer_scores(&fast, &c, iq, wt, ik, E, 30, sf);
    int ok = 1, same = 0;
    for (int j = 0; j < E; j++) {
        double want;
        if (j >= 30) {
            ok &= se[j] == -INFINITY;
            continue;
        }
        /* the three BF16 roundings by hand: per-head dot, times weight, head sum */
        double sum = 0;
        for (int h = 0; h < NH; h++) {
            double d = 0;
            for (int k = 0; k < ID; k++) d += (double)iq[h * ID + k] * ik[j * ID + k];
            float s = ds41_bf16_round((float)d);
            float r = s > 0 ? s : 0;
            sum += ds41_bf16_round(r * wt[h]);
        }
        want = ds41_bf16_round((float)sum);
        ok &= se[j] == (float)want;
        same += sf[j] == se[j];
    }
    CHECK(ok, "exact indexer scores differ from the hand computation");
    /* Q4mx x Q4mx products have few significant bits, so the FP32 dot is exact here and the
     * fast scores must equal the exact ones. */
    CHECK(same == 30, "fast scores equal exact on %d of 30", same);
}

/* the indexer tests' four settings: bit 0 exact, bit 1 two threads on pool */
static ds41_ctx mode_ctx(int mode, ds41_pool *pool) {
    ds41_ctx c = { .exact = mode & 1, .n_threads = mode & 2 ? 2 : 1, .pool = mode & 2 ? pool : NULL };
    return c;
}

/* The SIMD indexer (16 entries per pass, split over a pool) against its scalar definition, bit
 * for bit (memcmp): unquantized operands so that the FP32 dots round and their order shows,
 * head dims with a dot_f tail (36), NaN / inf / -0 keys, entry counts around the 16-wide block
 * and past the pool's threshold, visible counts inside a block and 0. */
static void test_indexer_scores_simd(void) {
    ds41_pool *pool = ds41_pool_create(2);
    static const int dims[][2] = { { 4, 64 }, { 32, 128 }, { 3, 36 }, { 1, 128 } };
    static const int Es[] = { 1, 15, 16, 17, 100, 1100 };
    int cases = 0;
    for (int di = 0; di < 4; di++) {
        int NH = dims[di][0], ID = dims[di][1];
        ds41_config c = tiny_cfg();
        c.index_n_heads = NH;
        c.index_head_dim = ID;
        float *iq = malloc(sizeof(float) * NH * ID), *wt = malloc(sizeof(float) * NH);
        /* magnitudes over 2^-30 .. 2^30: the FP32 sums cancel and round far above the BF16
         * rounding of the dot, so a different order of the partial sums changes scores */
        for (int i = 0; i < NH * ID; i++) iq[i] = ldexpf(frand(), (int)(frand() * 30));
        for (int i = 0; i < ID; i++) iq[i] = 1.0f;
        for (int h = 0; h < NH; h++) wt[h] = ds41_bf16_round(frand());
        for (int ei = 0; ei < 6; ei++) {
            int E = Es[ei];
            float *ik = malloc(sizeof(float) * E * ID), *a = malloc(sizeof(float) * E), *b = malloc(sizeof(float) * E);
            for (int i = 0; i < E * ID; i++) ik[i] = ldexpf(frand(), (int)(frand() * 30));
            /* every third entry against head 0 (all ones): dot_f's partial sums s0 = 2^24 n/4 and
             * s1 = -s0 cancel, so only the order (s0 + s1) + (s2 + s3) keeps s2 + s3 (seen in
             * the score when head 0 is the only head: 1 x 128) */
            for (int j = 0; j < E; j += 3)
                for (int i = 0; i < ID; i++) ik[(size_t)j * ID + i] = i % 4 == 0 ? 16777216.0f : i % 4 == 1 ? -16777216.0f : frand();
            if (E > 5) { ik[3 * ID + 1] = NAN; ik[4 * ID] = INFINITY; ik[5 * ID + 2] = -0.0f; }
            int vis[3] = { E, E - E / 3, 0 };
            for (int vi = 0; vi < 3; vi++)
                for (int mode = 0; mode < 4; mode++) {
                    ds41_ctx ctx = mode_ctx(mode, pool);
                    memset(a, 0x55, sizeof(float) * E);
                    memset(b, 0x77, sizeof(float) * E);
                    ds41_indexer_scores(&ctx, &c, iq, wt, ik, E, vis[vi], a);
                    ds41_indexer_scores_ref(&ctx, &c, iq, wt, ik, E, vis[vi], b);
                    CHECK(!memcmp(a, b, sizeof(float) * E), "heads %d x %d, E %d, visible %d, %s%s: SIMD scores differ",
                          NH, ID, E, vis[vi], mode & 1 ? "exact" : "fast", mode & 2 ? ", 2 threads" : "");
                    cases++;
                }
            free(ik); free(a); free(b);
        }
        free(iq); free(wt);
    }
    CHECK(cases == 288, "%d cases", cases);
    ds41_pool_destroy(pool);
}

/* The indexer on packed index-K records (integer dots) against the scalar definition on the
 * dequantized records, bit for bit, both modes, 1 and 2 threads: Q4mx-QDQ'd queries whose
 * blocks span up to 2^2 (the integer path), heads spanning 2^4 and more, an all-zero head, a
 * NaN head and an unquantized one (the float dot), a tiny head (2^-40) and one of spread 3 at
 * the largest ints; keys with block spreads 0 .. 3 (integer path, with the
 * realistic heads' at most 2: spreads adding to at most 5), 4 .. 8 (float dot), a NaN
 * scale byte (255) among bytes of spread 2, bytes 253 / 254, whose codes dequantize to inf, and
 * 252, whose do not (seen by the tiny head), scale bytes near 0 (units out of the kernel's range), an entry of spread 3 at the largest ints (with head 5,
 * spreads adding to 6, whose products would saturate vpmaddubsw);
 * records at a stride inside pages of 16 entries as the stores keep them; entry counts around
 * the 8-entry pass and past the pool's threshold; 65 heads (past the kernel's 64: the
 * records dequantized for the float kernel). The realistic set must take the integer
 * path for every pair, the adversarial one must reach the float dot. */
static void test_indexer_scores_packed(void) {
    ds41_pool *pool = ds41_pool_create(2);
    static const int dims[][2] = { { 32, 128 }, { 4, 64 }, { 3, 96 }, { 1, 32 }, { 65, 32 } };   /* 65 heads: past the kernel */
    static const int Es[] = { 1, 7, 8, 9, 100, 2100 };
    int cases = 0;
    for (int di = 0; di < 5; di++) {
        int NH = dims[di][0], ID = dims[di][1], RB = ID / 2 + ID / 32;
        ds41_config c = tiny_cfg();
        c.index_n_heads = NH;
        c.index_head_dim = ID;
        for (int adv = 0; adv < 2; adv++) {
            float *iq = malloc(sizeof(float) * NH * ID), *wt = malloc(sizeof(float) * NH);
            for (int i = 0; i < NH * ID; i += 32) {   /* blocks spanning 2^0 .. 2^1 (realistic), 2^5 */
                int be = (int)(rnd() % (adv ? 6 : 2));
                for (int k = 0; k < 32; k++) iq[i + k] = ldexpf(frand(), be);
            }
            ds41_q4mx_qdq(iq, NH * ID);
            if (adv && NH >= 32) {
                for (int i = 0; i < ID; i++) iq[4 * ID + i] = ldexpf((float)(i % 7 - 3) * 0.5f, -40);   /* head 4: tiny */
                for (int i = 0; i < ID; i++) iq[5 * ID + i] = i < 32 ? 48.0f : 6.0f;       /* head 5: spread 3 */
            }
            if (adv) {
                for (int i = 0; i < ID; i++) iq[i] = 0.0f;                                      /* head 0: zero */
                if (NH > 1) for (int i = 0; i < 32 && i < ID; i++) iq[ID + i] = ldexpf(iq[ID + i], 6); /* head 1: span >= 2^4 */
                if (NH > 2) iq[2 * ID + 5] = NAN;
                if (NH > 3) iq[3 * ID + 7] = 0.3f;                                              /* not Q4mx */
            }
            for (int h = 0; h < NH; h++) wt[h] = ds41_bf16_round(frand() * 2);
            for (int ei = 0; ei < 6; ei++) {
                int E = Es[ei], per = 16, np = (E + per - 1) / per, stride = RB + 12, off = 40;
                uint8_t **pages = malloc(sizeof(uint8_t *) * np);
                float *x = malloc(sizeof(float) * ID), *ik = malloc(sizeof(float) * E * ID);
                float *a = malloc(sizeof(float) * E), *b = malloc(sizeof(float) * E);
                for (int p = 0; p < np; p++) {
                    pages[p] = malloc((size_t)off + (size_t)per * stride);
                    memset(pages[p], 0xEE, (size_t)off + (size_t)per * stride);
                }
                for (int j = 0; j < E; j++) {
                    uint8_t *rec = pages[j / per] + off + (size_t)(j % per) * stride;
                    int spread = adv ? (int)(rnd() % 8) : (int)(rnd() % 3);
                    for (int i = 0; i < ID; i++) x[i] = ldexpf(frand(), i < 32 ? spread : (int)(rnd() % 2));
                    ds41_pack_q4mx(x, ID, rec, rec + ID / 2);
                    if (adv && j % 7 == 3) rec[ID / 2 + ID / 32 - 1] = 255;
                    if (adv && j % 11 == 5) for (int s = 0; s < ID / 32; s++) rec[ID / 2 + s] = (uint8_t)(1 + s % 2);
                    if (adv && j % 13 == 6) for (int s = 0; s < ID / 32; s++) rec[ID / 2 + s] = (uint8_t)(254 - s % 3);
                    if (adv && j % 17 == 8) for (int s = 0; s < ID / 32; s++) rec[ID / 2 + s] = (uint8_t)(255 - s % 3);
                    if (adv && j % 23 == 10) for (int s = 0; s < ID / 32; s++) rec[ID / 2 + s] = (uint8_t)(253 - s % 2);
                    if (adv && j % 23 == 11) for (int s = 0; s < ID / 32; s++) rec[ID / 2 + s] = 252;
                    if (adv && j % 19 == 9) {   /* block 0 at 48, the rest at 6: spread 3, against head 5 the
                                                   widest products (a pair of them would saturate vpmaddubsw) */
                        for (int i = 0; i < ID; i++) x[i] = i < 32 ? 48.0f : 6.0f;
                        ds41_pack_q4mx(x, ID, rec, rec + ID / 2);
                    }
                    ds41_ik_rec_unpack(&c, rec, 1, ik + (size_t)j * ID);
                }
                ds41_ik_keys keys = { (const uint8_t *const *)pages, per, (size_t)off, stride };
                int vis[3] = { E, E - E / 3, 0 };
                for (int vi = 0; vi < 3; vi++)
                    for (int mode = 0; mode < 4; mode++) {
                        ds41_ctx ctx = mode_ctx(mode, pool);
                        memset(a, 0x55, sizeof(float) * E);
                        memset(b, 0x77, sizeof(float) * E);
                        long long f0 = ds41_indexer_dotf_pairs;
                        ds41_indexer_scores_packed(&ctx, &c, iq, wt, &keys, E, vis[vi], a);
                        long long fell = ds41_indexer_dotf_pairs - f0;
                        ds41_indexer_scores_ref(&ctx, &c, iq, wt, ik, E, vis[vi], b);
                        CHECK(!memcmp(a, b, sizeof(float) * E), "packed %s: heads %d x %d, E %d, visible %d, %s%s: scores differ",
                              adv ? "adversarial" : "realistic", NH, ID, E, vis[vi], mode & 1 ? "exact" : "fast",
                              mode & 2 ? ", 2 threads" : "");
                        if (NH <= 64 && vis[vi] > 0) {
                            if (!adv) CHECK(fell == 0, "realistic keys: %lld pairs took the float dot", fell);
                            else if (E >= 100) CHECK(fell > 0, "adversarial keys, E %d: no pair took the float dot", E);
                        }
                        cases++;
                    }
                for (int p = 0; p < np; p++) free(pages[p]);
                free(pages); free(x); free(ik); free(a); free(b);
            }
            free(iq); free(wt);
        }
    }
    CHECK(cases == 720, "%d cases", cases);
    ds41_pool_destroy(pool);
}

/* ---------------------------------------------------------------- row plan */

static void test_row_plan_production(void) {
    ds41_config cfg;
    ds41_err err;
    const char *root = getenv("DS41_ROOT");
    char path[1024];
    snprintf(path, sizeof path, "%s/models/production", root ? root : ".");
    if (ds41_config_load(path, &cfg, &err)) {
        CHECK(0, "cannot load %s: %s", path, err.msg);
        return;
    }
    int L = cfg.n_layers, T = 10000;
    int *q = malloc(sizeof(int) * L * 3), *k = q + L, *lo = q + 2 * L;
    ds41_row_plan(&cfg, DS41_PREFILL_CED, T, 1, q, k, lo);
    for (int l = 0; l < L; l++) {
        int rows = T - q[l];
        int want = l < cfg.first_decoder_layer ? T : 1 + (39 - l) * 127;   /* the figure */
        CHECK(rows == want, "layer %d computes %d rows, want %d", l, rows, want);
    }
    CHECK(k[20] == 0, "layer 20's compressor needs every row (krow %d)", k[20]);
    CHECK(T - k[39] == 128, "layer 39's keys: %d rows (ring + window of the last query)", T - k[39]);
    /* state only (an intermediate chunk): layer 39 outputs nothing but keeps its ring */
    ds41_row_plan(&cfg, DS41_PREFILL_CED, T, 0, q, k, lo);
    CHECK(q[39] == T && T - k[39] == 128 && T - q[38] == 128, "state-only plan: %d %d %d", q[39], k[39], q[38]);
    /* short prompt: everything */
    ds41_row_plan(&cfg, DS41_PREFILL_CED, 100, 1, q, k, lo);
    CHECK(q[39] == 99 && k[39] == 0 && q[38] == 0, "T=100: %d %d %d", q[39], k[39], q[38]);
    /* replay: decoder layers past 20 on the last window, truncated there */
    ds41_row_plan(&cfg, DS41_PREFILL_REPLAY, T, 1, q, k, lo);
    CHECK(q[21] == T - 128 && k[21] == T - 128 && lo[21] == T - 128 && q[20] == T - 128 && k[20] == 0 && lo[20] == 0,
          "replay: %d %d %d %d %d", q[21], k[21], lo[21], q[20], k[20]);
    ds41_row_plan(&cfg, DS41_PREFILL_FULL, T, 1, q, k, lo);
    int all = 1;
    for (int l = 0; l < L; l++) all &= q[l] == 0 && k[l] == 0;
    CHECK(all, "full plan must compute every row");
    free(q);
    ds41_config_free(&cfg);
}

/* ds41_swa_rec_unpack (8 lanes, a table gather) against ds41_unpack_q8 record by record, bit
 * for bit: every E4M3 code (NaN codes 0x7F / 0xFF included) under UE8M0 scales from the
 * subnormal 2^-127 and 2^-126 through 2^0, 2^7 and 2^127 to the NaN scale 255, so products
 * that are subnormal, overflow to infinity, or are NaN, and BF16 rounding ties. */
static void test_swa_rec_unpack(void) {
    ds41_config c = tiny_cfg();   /* head_dim 64: records of 64 codes + 2 scales */
    const int D = c.head_dim, rb = ds41_swa_rec_bytes(&c), n = 24;
    static const uint8_t scales[] = { 0, 1, 100, 127, 134, 135, 200, 254, 255, 3, 127, 60 };
    uint8_t *rec = malloc((size_t)n * rb);
    float *got = malloc((size_t)n * D * sizeof(float)), want[64];
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < D; k++) rec[(size_t)i * rb + k] = (uint8_t)(i < 8 ? (i * D + k) & 255 : rnd());
        rec[(size_t)i * rb + D] = scales[i % 12];
        rec[(size_t)i * rb + D + 1] = scales[(i * 5 + 7) % 12];
    }
    ds41_swa_rec_unpack(&c, rec, n, got);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        ds41_unpack_q8(rec + (size_t)i * rb, rec + (size_t)i * rb + D, D, want);
        for (int k = 0; k < D; k++) bad += ds41_f32_bits(got[(size_t)i * D + k]) != ds41_f32_bits(want[k]);
    }
    CHECK(bad == 0, "ds41_swa_rec_unpack: %d of %d values differ from ds41_unpack_q8", bad, n * D);
    free(rec);
    free(got);
}

int main(void) {
    RUN_CASE(test_swa_rec_unpack);
    RUN_CASE(test_topk_ties_lower_index);
    RUN_CASE(test_swa_lists);
    RUN_CASE(test_candidate_blocks);
    RUN_CASE(test_sparse_attn_structure);
    RUN_CASE(test_sparse_attn_vs_double);
    RUN_CASE(test_sparse_attn_fast_order);
    RUN_CASE(test_indexer_scores);
    RUN_CASE(test_indexer_scores_simd);
    RUN_CASE(test_indexer_scores_packed);
    RUN_CASE(test_row_plan_production);
    return check_exit();
}
