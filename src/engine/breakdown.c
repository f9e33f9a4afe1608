/* Where a decode step's time goes (ds41.h: ds41_engine_breakdown_start; ds41 bench --profile):
 * the engine's ds41_bd (kernels.h) switched on and off, the section names, and the read
 * bandwidth probe the streams are compared against. */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "ds41.h"
#include "forward.h"

_Static_assert((int)DS41_BREAKDOWN_N == (int)DS41_BD_N, "ds41.h's DS41_BREAKDOWN_* and kernels.h's DS41_BD_* must match");
_Static_assert((int)DS41_BREAKDOWN_SAMPLE == (int)DS41_BD_SAMPLE && (int)DS41_BREAKDOWN_F32 == (int)DS41_BD_F32 &&
                   (int)DS41_BREAKDOWN_HEADW == (int)DS41_BD_HEADW && (int)DS41_BREAKDOWN_ATTN == (int)DS41_BD_ATTN &&
                   (int)DS41_BREAKDOWN_FP8 == (int)DS41_BD_FP8 && (int)DS41_BREAKDOWN_ENGRAM == (int)DS41_BD_ENGRAM,
               "ds41.h's DS41_BREAKDOWN_* and kernels.h's DS41_BD_* must match");

static const char *const NAMES[DS41_BD_N] = {
    [DS41_BD_REST] = "rest",         [DS41_BD_FP8] = "fp8",           [DS41_BD_FP8DQ] = "fp8-dq",
    [DS41_BD_FP4] = "fp4",           [DS41_BD_HEADW] = "bf16-head",   [DS41_BD_BF16] = "bf16",
    [DS41_BD_F32] = "f32",           [DS41_BD_ATTN] = "attention",    [DS41_BD_SPARSE] = "sparse-attn",
    [DS41_BD_INDEXER] = "indexer",   [DS41_BD_COMPRESS] = "compressor", [DS41_BD_MHC] = "mhc",
    [DS41_BD_NORM] = "norm",         [DS41_BD_ROUTER] = "router",     [DS41_BD_MOE] = "moe",
    [DS41_BD_ENGRAM] = "engram",     [DS41_BD_HEAD] = "head",         [DS41_BD_SAMPLE] = "sampling",
};

const char *ds41_breakdown_name(int section) {
    return section >= 0 && section < DS41_BD_N ? NAMES[section] : NULL;
}

int ds41_breakdown_is_stream(int section) { return section >= DS41_BD_FP8 && section <= DS41_BD_F32; }

int ds41_engine_breakdown_start(ds41_engine *e) {
    ds41_bd *b = e->ctx.bd;
    if (!b && !(b = malloc(sizeof *b))) return -1;
    memset(b, 0, sizeof *b);
    b->owner = pthread_self();
    b->cur = DS41_BD_REST;
    b->t = b->t0 = ds41_prof_now();
    e->ctx.bd = b;
    return 0;
}

void ds41_engine_breakdown_stop(ds41_engine *e, ds41_breakdown *out) {
    ds41_bd *b = e->ctx.bd;
    if (!b) {
        if (out) memset(out, 0, sizeof *out);
        return;
    }
    double now = ds41_prof_now();
    b->sec[b->cur] += now - b->t;
    e->ctx.bd = NULL;
    if (out) {
        memset(out, 0, sizeof *out);
        for (int i = 0; i < DS41_BD_N; i++) {
            out->seconds[i] = b->sec[i];
            out->bytes[i] = b->bytes[i];
            out->calls[i] = b->calls[i];
        }
        out->elapsed = now - b->t0;
        out->switches = b->switches;
    }
    free(b);
}

/* ---------------------------------------------------------------- read bandwidth probe */

typedef struct bw_job {
    const float *buf;
    size_t n;
    float sums[64];
} bw_job;

static void bw_parts(void *arg, int i0, int i1) {
    bw_job *j = arg;
    size_t per = j->n / 64;
    for (int part = i0; part < i1; part++) {
        const float *p = j->buf + per * (size_t)part;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (size_t k = 0; k + 32 <= per; k += 32) {
            a0 = _mm256_add_ps(a0, _mm256_load_ps(p + k));
            a1 = _mm256_add_ps(a1, _mm256_load_ps(p + k + 8));
            a2 = _mm256_add_ps(a2, _mm256_load_ps(p + k + 16));
            a3 = _mm256_add_ps(a3, _mm256_load_ps(p + k + 24));
        }
        float t[8];
        _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        j->sums[part] = t[0] + t[3] + t[7];   /* kept, so the loads are not dropped */
    }
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double ds41_engine_read_bandwidth(ds41_engine *e) {
    const size_t n = (size_t)64 << 20;   /* floats: 256 MiB */
    float *buf = aligned_alloc((size_t)2 << 20, n * sizeof(float));
    if (!buf) return 0.0;
    /* 2 MiB pages where the kernel has them: 128 faults to fill it instead of 65,536 (about a
     * second on a loaded VM), and reads without a TLB walk every 4 KiB, as the weights have
     * (safetensors.c maps them the same way) */
    (void)madvise(buf, n * sizeof(float), MADV_HUGEPAGE);
    memset(buf, 0x3C, n * sizeof(float));   /* every float 0.0115: finite, no subnormal */
    bw_job j;
    j.buf = buf;
    j.n = n;
    ds41_ctx ctx = e->ctx;
    ctx.bd = NULL;
    ctx.prof = NULL;
    double t[5];
    for (int r = 0; r < 5; r++) {
        double t0 = ds41_prof_now();
        ds41_parallel_for(&ctx, 64, bw_parts, &j);
        t[r] = ds41_prof_now() - t0;
    }
    free(buf);
    qsort(t, 5, sizeof t[0], cmp_d);
    return (double)n * sizeof(float) / t[2] / 1e9;
}
