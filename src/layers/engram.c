/* ds41 Engram (spec 1.7, 3.2, 3.3): hashing constants, per-token hashing, the module.
 *
 * Constants. Primes follow the recipe of 1.7 (per layer, per order, a walk from
 * engram_vocab_size - 1 to the next unused primes). Multipliers are
 * numpy.random.default_rng(10007 * layer_id).integers(0, bound, size=max_ngram, dtype=int64)
 * * 2 + 1 with bound = max(1, (INT64_MAX // compressed_vocab) // 2), reproduced here from
 * NumPy's algorithms (SeedSequence entropy mixing, PCG64 XSL-RR, Lemire's bounded integers as
 * NumPy 1.24 implements them). NumPy does not promise that stream across versions, so the
 * production values of spec 1.7 are baked in as well and checked against the computation. */
#include "engram.h"
#include "formats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- NumPy SeedSequence */

#define SS_POOL 4
#define SS_INIT_A 0x43b0d7e5u
#define SS_MULT_A 0x931e8875u
#define SS_INIT_B 0x8b51f9ddu
#define SS_MULT_B 0x58f38dedu
#define SS_MIX_L 0xca01f9ddu
#define SS_MIX_R 0x4973f715u

static uint32_t ss_hashmix(uint32_t v, uint32_t *hc) {
    v ^= *hc;
    *hc *= SS_MULT_A;
    v *= *hc;
    v ^= v >> 16;
    return v;
}

static uint32_t ss_mix(uint32_t x, uint32_t y) {
    uint32_t r = SS_MIX_L * x - SS_MIX_R * y;
    r ^= r >> 16;
    return r;
}

/* SeedSequence(seed).generate_state(n64, uint64) for a non-negative integer seed. */
static void seed_sequence_u64(uint64_t seed, uint64_t *out, int n64) {
    uint32_t ent[2];
    int n_ent = 0;
    /* the integer as little-endian 32-bit words; 0 is one zero word */
    do {
        ent[n_ent++] = (uint32_t)(seed & 0xFFFFFFFFu);
        seed >>= 32;
    } while (seed && n_ent < 2);
    uint32_t pool[SS_POOL];
    uint32_t hc = SS_INIT_A;
    for (int i = 0; i < SS_POOL; i++) pool[i] = ss_hashmix(i < n_ent ? ent[i] : 0u, &hc);
    for (int s = 0; s < SS_POOL; s++)
        for (int d = 0; d < SS_POOL; d++)
            if (s != d) pool[d] = ss_mix(pool[d], ss_hashmix(pool[s], &hc));
    for (int s = SS_POOL; s < n_ent; s++)
        for (int d = 0; d < SS_POOL; d++) pool[d] = ss_mix(pool[d], ss_hashmix(ent[s], &hc));
    uint32_t hb = SS_INIT_B;
    for (int i = 0; i < 2 * n64; i++) {
        uint32_t v = pool[i % SS_POOL];
        v ^= hb;
        hb *= SS_MULT_B;
        v *= hb;
        v ^= v >> 16;
        if (i % 2 == 0) out[i / 2] = v;
        else out[i / 2] |= (uint64_t)v << 32;
    }
}

/* ---------------------------------------------------------------- PCG64 (XSL-RR 128/64) */

typedef unsigned __int128 u128;
typedef struct pcg64 { u128 state, inc; int has32; uint32_t buf32; } pcg64;

static const u128 PCG_MULT = ((u128)0x2360ED051FC65DA4ULL << 64) | 0x4385DF649FCCF645ULL;

static uint64_t pcg64_next(pcg64 *g) {
    g->state = g->state * PCG_MULT + g->inc;
    uint64_t hi = (uint64_t)(g->state >> 64), lo = (uint64_t)g->state;
    unsigned rot = (unsigned)(hi >> 58);
    uint64_t x = hi ^ lo;
    return (x >> rot) | (x << ((64 - rot) & 63));
}

static uint32_t pcg64_next32(pcg64 *g) {
    /* NumPy's PCG64 hands out the two halves of one 64-bit output, low half first */
    if (g->has32) { g->has32 = 0; return g->buf32; }
    uint64_t v = pcg64_next(g);
    g->has32 = 1;
    g->buf32 = (uint32_t)(v >> 32);
    return (uint32_t)v;
}

/* numpy.random.default_rng(seed) */
static void pcg64_seed(pcg64 *g, uint64_t seed) {
    uint64_t s[4];
    seed_sequence_u64(seed, s, 4);
    u128 initstate = ((u128)s[0] << 64) | s[1];
    u128 initseq = ((u128)s[2] << 64) | s[3];
    g->state = 0;
    g->inc = (initseq << 1) | 1u;
    pcg64_next(g);
    g->state += initstate;
    pcg64_next(g);
    g->has32 = 0;
}

/* Generator.integers(0, high, dtype=int64) for one value (random_bounded_uint64_fill with
 * use_masked=False, i.e. Lemire's method; the 32-bit variant below 2^32). */
static int64_t pcg64_integer(pcg64 *g, int64_t high) {
    uint64_t rng = (uint64_t)high - 1u;   /* inclusive range */
    if (rng == 0) return 0;
    if (rng <= 0xFFFFFFFFu) {
        if (rng == 0xFFFFFFFFu) return (int64_t)pcg64_next32(g);
        uint32_t r = (uint32_t)rng, excl = r + 1u;
        uint64_t m = (uint64_t)pcg64_next32(g) * excl;
        uint32_t left = (uint32_t)m;
        if (left < excl) {
            uint32_t thr = (uint32_t)(0xFFFFFFFFu - r) % excl;
            while (left < thr) {
                m = (uint64_t)pcg64_next32(g) * excl;
                left = (uint32_t)m;
            }
        }
        return (int64_t)(m >> 32);
    }
    uint64_t excl = rng + 1u;
    u128 m = (u128)pcg64_next(g) * excl;
    uint64_t left = (uint64_t)m;
    if (left < excl) {
        uint64_t thr = (UINT64_MAX - rng) % excl;
        while (left < thr) {
            m = (u128)pcg64_next(g) * excl;
            left = (uint64_t)m;
        }
    }
    return (int64_t)(uint64_t)(m >> 64);
}

void ds41_engram_numpy_integers(uint64_t seed, int64_t high, int n, int64_t *out) {
    pcg64 g;
    pcg64_seed(&g, seed);
    for (int i = 0; i < n; i++) out[i] = high >= 1 ? pcg64_integer(&g, high) : 0;
}

/* ---------------------------------------------------------------- baked production values */

static const int64_t prod_mult[2][4] = {
    { 76632096046245LL, 4839876093313LL, 35959672319349LL, 73987337458391LL },
    { 67716810739261LL, 51510806800915LL, 30921347202721LL, 82619226485591LL },
};
static const int64_t prod_primes[2][3][8] = {
    { { 16000057, 16000079, 16000081, 16000097, 16000121, 16000129, 16000133, 16000183 },
      { 16000189, 16000207, 16000211, 16000253, 16000277, 16000289, 16000307, 16000321 },
      { 16000339, 16000381, 16000393, 16000399, 16000403, 16000409, 16000447, 16000463 } },
    { { 16000477, 16000487, 16000499, 16000507, 16000511, 16000573, 16000609, 16000627 },
      { 16000667, 16000669, 16000693, 16000697, 16000711, 16000729, 16000759, 16000769 },
      { 16000781, 16000799, 16000813, 16000819, 16000841, 16000877, 16000879, 16000889 } },
};

static int is_production(const ds41_config *cfg) {
    return cfg->n_engram_layers == 2 && cfg->engram_layers[0] == 1 && cfg->engram_layers[1] == 14 &&
           cfg->engram_max_ngram == 4 && cfg->engram_n_heads == 8 && cfg->engram_vocab_size == 16000000 &&
           cfg->engram_compressed_vocab == 99092;
}

/* ---------------------------------------------------------------- constants */

static int is_prime_ll(long long n) {
    if (n < 2) return 0;
    if (n % 2 == 0) return n == 2;
    if (n % 3 == 0) return n == 3;
    for (long long d = 5; d * d <= n; d += 6)
        if (n % d == 0 || n % (d + 2) == 0) return 0;
    return 1;
}

int ds41_engram_consts_init(ds41_engram_consts *c, const ds41_config *cfg, ds41_err *err) {
    memset(c, 0, sizeof *c);
    int L = cfg->n_engram_layers, N = cfg->engram_max_ngram, H = cfg->engram_n_heads;
    if (L == 0) return 0;
    if (L < 0 || L > DS41_ENGRAM_MAX_LAYERS)
        return ds41_errf(err, "engram: %d Engram layers, at most %d supported", L, DS41_ENGRAM_MAX_LAYERS);
    if (N < 2 || N > DS41_ENGRAM_MAX_ORDER)
        return ds41_errf(err, "engram: engram_max_ngram_size %d must be in 2..%d", N, DS41_ENGRAM_MAX_ORDER);
    if (H < 1 || H > DS41_ENGRAM_MAX_HEADS)
        return ds41_errf(err, "engram: engram_n_heads %d must be in 1..%d", H, DS41_ENGRAM_MAX_HEADS);
    if (cfg->engram_compressed_vocab < 1)
        return ds41_errf(err, "engram: engram_compressed_vocab_size %d must be positive", cfg->engram_compressed_vocab);
    if (cfg->engram_vocab_size < 1 || cfg->engram_vocab_size > ((long long)1 << 40))
        return ds41_errf(err, "engram: engram_vocab_size %lld out of range", cfg->engram_vocab_size);
    c->n_layers = L;
    c->max_ngram = N;
    c->n_heads = H;

    /* primes: a global "already used" list makes every prime distinct */
    int n_used = 0;
    int64_t *used = malloc(sizeof(int64_t) * (size_t)L * (size_t)(N - 1) * (size_t)H);
    if (!used) return ds41_errf(err, "engram: out of memory");
    for (int l = 0; l < L; l++) {
        for (int o = 0; o < N - 1; o++) {
            long long cur = cfg->engram_vocab_size - 1;
            for (int h = 0; h < H; h++) {
                long long cand = cur + 1;
                for (;;) {
                    if (is_prime_ll(cand)) {
                        int seen = 0;
                        for (int u = 0; u < n_used && !seen; u++) seen = used[u] == cand;
                        if (!seen) break;
                    }
                    cand++;
                }
                used[n_used++] = cand;
                c->prime[l][o][h] = cand;
                cur = cand;
            }
        }
        int64_t off = 0;
        for (int o = 0; o < N - 1; o++)
            for (int h = 0; h < H; h++) {
                c->offset[l][o * H + h] = off;
                off += c->prime[l][o][h];
            }
        c->rows[l] = off;
        if (off != cfg->engram_num_embeddings[l]) {
            free(used);
            return ds41_errf(err, "engram: layer %d (slot %d): the primes sum to %lld rows but "
                             "engram_num_embeddings[%d] is %lld", cfg->engram_layers[l], l, (long long)off, l,
                             cfg->engram_num_embeddings[l]);
        }
    }
    free(used);

    /* multipliers */
    int64_t bound = (INT64_MAX / cfg->engram_compressed_vocab) / 2;
    if (bound < 1) bound = 1;
    for (int l = 0; l < L; l++) {
        long long lid = cfg->engram_layers[l];
        if (lid < 0) return ds41_errf(err, "engram: layer id %lld is negative", lid);
        pcg64 g;
        pcg64_seed(&g, (uint64_t)(10007LL * lid));
        for (int s = 0; s < N; s++) c->mult[l][s] = pcg64_integer(&g, bound) * 2 + 1;
    }

    if (is_production(cfg)) {
        for (int l = 0; l < 2; l++)
            for (int s = 0; s < 4; s++)
                if (c->mult[l][s] != prod_mult[l][s])
                    return ds41_errf(err, "engram: computed multiplier [%d][%d] = %lld differs from the baked "
                                     "production value %lld", l, s, (long long)c->mult[l][s],
                                     (long long)prod_mult[l][s]);
        for (int l = 0; l < 2; l++)
            for (int o = 0; o < 3; o++)
                for (int h = 0; h < 8; h++)
                    if (c->prime[l][o][h] != prod_primes[l][o][h])
                        return ds41_errf(err, "engram: computed prime [%d][%d][%d] = %lld differs from the baked "
                                         "production value %lld", l, o, h, (long long)c->prime[l][o][h],
                                         (long long)prod_primes[l][o][h]);
    }
    return 0;
}

/* ---------------------------------------------------------------- hashing (spec 3.2) */

void ds41_engram_hash(const ds41_engram_consts *c, const int32_t *hist, long long p, int32_t pad,
                      int64_t *ids) {
    const int N = c->max_ngram, H = c->n_heads, cols = (N - 1) * H;
    int64_t tok[DS41_ENGRAM_MAX_ORDER];
    int blocked = 0;
    for (int s = 0; s < N; s++) {
        blocked = blocked || p < s || hist[s] == DS41_ENGRAM_DEAD;
        tok[s] = blocked ? pad : hist[s];
    }
    for (int l = 0; l < c->n_layers; l++) {
        /* int64 arithmetic as torch does it (wrapping; it never wraps for ids below the
         * compressed vocabulary, which the bound on the multipliers guarantees) */
        uint64_t r = (uint64_t)tok[0] * (uint64_t)c->mult[l][0];
        for (int n = 2; n <= N; n++) {
            r ^= (uint64_t)tok[n - 1] * (uint64_t)c->mult[l][n - 1];
            int64_t rs = (int64_t)r;
            for (int h = 0; h < H; h++) {
                int64_t pr = c->prime[l][n - 2][h];
                int64_t m = rs % pr;
                if (m < 0) m += pr;               /* floor modulo, like torch's % */
                int col = (n - 2) * H + h;
                ids[(size_t)l * cols + col] = m + c->offset[l][col];
            }
        }
    }
}

/* ---------------------------------------------------------------- the module (spec 3.3) */

static float mean_sq(const ds41_ctx *ctx, const float *v, int n) {
    if (ctx->exact) {
        double s = 0.0;
        for (int i = 0; i < n; i++) s += (double)(v[i] * v[i]);
        return (float)(s / (double)n);
    }
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += v[i] * v[i];
    return s / (float)n;
}

typedef struct eg_job {
    const ds41_ctx *ctx;
    const ds41_config *cfg;
    const float *kv, *w;
    const uint8_t *is_image;
    float *X;
} eg_job;

static void eg_tokens(void *arg, int t0, int t1) {
    const eg_job *j = arg;
    const ds41_ctx *ctx = j->ctx;
    const int hc = j->cfg->hc_mult, dim = j->cfg->dim;
    const float eps = j->cfg->norm_eps;
    const float inv_sqrt_dim = (float)pow((double)dim, -0.5);   /* fp32(dim^-0.5) */
    float *prod = malloc((size_t)dim * sizeof(float));
    if (!prod) return;
    for (int t = t0; t < t1; t++) {
        const float *kvt = j->kv + (size_t)t * (hc + 1) * dim;
        const float *value = kvt + (size_t)hc * dim;
        for (int c = 0; c < hc; c++) {
            float *h = j->X + ((size_t)t * hc + c) * dim;
            const float *key = kvt + (size_t)c * dim;
            const float *w = j->w + (size_t)c * dim;
            float g = 0.0f;
            if (!(j->is_image && j->is_image[t])) {
                float rstd = ds41_rsqrt_x(ctx, mean_sq(ctx, h, dim) + eps) *
                             ds41_rsqrt_x(ctx, mean_sq(ctx, key, dim) + eps);
                for (int d = 0; d < dim; d++) prod[d] = (h[d] * w[d]) * key[d];
                float S;
                if (ctx->exact) {
                    double s = 0.0;
                    for (int d = 0; d < dim; d++) s += (double)prod[d];
                    S = (float)s;
                } else {
                    S = 0.0f;
                    for (int d = 0; d < dim; d++) S += prod[d];
                }
                float dot = (S * rstd) * inv_sqrt_dim;
                float a = fabsf(dot);
                a = a < 1e-6f ? 1e-6f : a;
                g = ds41_sigmoid_x(ctx, copysignf(sqrtf(a), dot));
            }
            for (int d = 0; d < dim; d++) h[d] = ds41_bf16_round(h[d] + g * value[d]);
        }
    }
    free(prod);
}

void ds41_engram_apply(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                       const int64_t *ids, int T, const uint8_t *is_image, float *X) {
    ds41_engram_apply_src(ctx, cfg, lw, ids, T, is_image, X, NULL, NULL);
}

void ds41_engram_apply_src(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                           const int64_t *ids, int T, const uint8_t *is_image, float *X, ds41_engram_row_fn row_fn,
                           const void *row_arg) {
    const int hc = cfg->hc_mult, dim = cfg->dim, hd = cfg->engram_head_dim;
    const int cols = (cfg->engram_max_ngram - 1) * cfg->engram_n_heads;
    if (T <= 0 || cols <= 0 || hd <= 0) return;
    const int in = cols * hd, nsc = (hd + 31) / 32;
    float *rows = malloc((size_t)T * in * sizeof(float));
    float *kv = malloc((size_t)T * (hc + 1) * dim * sizeof(float));
    float *w = malloc((size_t)hc * dim * sizeof(float));
    if (!rows || !kv || !w) goto done;
    /* gathered rows: bf16(e4m3 * 2^(scale-127)) per 32-dim group; an id outside the table
     * reads as a zero row (what the reference's sharded lookup returns off-shard) */
    for (int t = 0; t < T; t++)
        for (int col = 0; col < cols; col++) {
            int64_t id = ids[(size_t)t * cols + col];
            float *r = rows + ((size_t)t * cols + col) * hd;
            if (id < 0 || id >= lw->eg_rows) {
                memset(r, 0, (size_t)hd * sizeof(float));
                continue;
            }
            const uint8_t *e = lw->eg_embed + (size_t)id * hd;
            const uint8_t *s = lw->eg_scale + (size_t)id * nsc;
            /* a row source's copy holds the same bytes; a row it lacks is read from the
             * mapping, never taken as zero */
            const uint8_t *src = row_fn ? row_fn(row_arg, id) : NULL;
            if (src) {
                e = src;
                s = src + hd;
            }
            for (int d = 0; d < hd; d++)
                r[d] = ds41_bf16_round(ds41_e4m3_to_f32(e[d]) * ds41_ue8m0_to_f32(s[d / 32]));
        }
    ds41_linear_fp8(ctx, &lw->eg_wkv, rows, T, kv);
    for (size_t i = 0; i < (size_t)hc * dim; i++)
        w[i] = ds41_bf16_to_f32(lw->eg_q[i]) * ds41_bf16_to_f32(lw->eg_k[i]);
    eg_job j = { ctx, cfg, kv, w, is_image, X };
    if (T > 1) ds41_parallel_for(ctx, T, eg_tokens, &j);
    else eg_tokens(&j, 0, 1);
done:
    free(rows);
    free(kv);
    free(w);
}
