/* ds41 kernels: linears over packed FP8 / FP4 / BF16 / FP32 weights, RMSNorm, RoPE,
 * elementary functions. Activations are float arrays; where the spec says BF16 they hold
 * BF16-representable values (every output marked "bf16" below is rounded to BF16).
 * Two kernel sets chosen by ds41_ctx.exact:
 *   exact: the order-independent contract of exact-mode.md (double accumulation rounded
 *          once to FP32, transcendentals in double rounded once, no FMA);
 *   fast:  FP32 accumulation, reordered/threaded/SIMD as the kernel likes.
 * Every fast kernel has an exact twin and is tested against it with a stated tolerance. */
#ifndef DS41_KERNELS_H
#define DS41_KERNELS_H

#include <pthread.h>

#include "config.h"
#include "model.h"

typedef struct ds41_pool ds41_pool;   /* thread pool (kernels/pool.c) */

/* Deployment performance points (../shared/spec/deployment-points.md) that can be switched off
 * for measurement (ds41 bench --ablate): a set bit turns the point OFF. Every setting gives
 * bit-identical results in exact mode and in fast mode (same arithmetic, other data paths). */
enum {
    DS41_ABLATE_P1 = 1,   /* fused compressor: ratio 1 projection + RMSNorm + records per row tile; ratio > 1 pooling + records per entry tile */
    DS41_ABLATE_P2 = 2,   /* sparse attention reads the packed FP4 main-KV records (no float copy) */
    DS41_ABLATE_P3 = 4,   /* single-KV-head attention: each entry decoded once for all query heads */
    DS41_ABLATE_P6 = 8    /* overlap: an index layer's indexer (query, scores, top-k) on a side thread
                           * while the caller computes the query projection wq_b */
};

/* Per-sublayer timers (seconds, accumulated) when ds41_ctx.prof is set; zero cost otherwise.
 * The same indices as DS41_TIMER_* in ds41.h. */
enum {
    DS41_PROF_ATTN = 0,   /* the whole attention sublayer (projections, compressor, indexer, attention) */
    DS41_PROF_INDEXER,    /* indexer: query projection, scores, candidate pool, top-k */
    DS41_PROF_IKEYS,      /* dequantizing the index-K stores (none now: the indexer reads the
                           * packed records; kept so the indices match DS41_TIMER_*) */
    DS41_PROF_SPARSE,     /* KV set, lists and sparse attention (gather / dequant included) */
    DS41_PROF_COMPRESS,   /* compressor (projection, pooling, records) */
    DS41_PROF_KVBYTES,    /* not a time: bytes of KV rows the sparse attention fetched, plus the
                           * float copy gather_kv made of the compressed entries (P2 off) */
    DS41_PROF_N
};

/* Where a decode step's time goes (ds41 bench --profile; ds41_engine_breakdown_start in ds41.h,
 * the same indices as DS41_BD_* there). Exclusive sections of the calling thread's wall time:
 * entering a section charges the time since the last switch to the section that was running and
 * makes the new one current; leaving charges it and returns to the enclosing one. So every
 * second between start and stop lands in exactly one section (the linears nested in the
 * attention sublayer count as their weight stream, not as attention), and the sections add up
 * to the elapsed time. The weight-stream sections also add the bytes of weights each call
 * reads. Only the thread that started the breakdown is timed (a linear a pool worker runs
 * inside a job is part of its caller's section). No arithmetic depends on it. */
enum {
    DS41_BD_REST = 0,     /* everything outside the sections below */
    DS41_BD_FP8,          /* weight streams: FP8 linears (attention projections, shared expert, Engram) */
    DS41_BD_FP8DQ,        /*   FP8 weights dequantized to BF16 (the grouped wo_a) */
    DS41_BD_FP4,          /*   FP4 routed experts */
    DS41_BD_HEADW,        /*   the BF16 head */
    DS41_BD_BF16,         /*   other BF16 linears (router gate, compressor, indexer) */
    DS41_BD_F32,          /*   FP32 linears (the mHC mixes' projection) */
    DS41_BD_ATTN,         /* attention sublayer outside the sections below (RoPE, norms' callers, KV rows) */
    DS41_BD_SPARSE,       /* KV set, lists and sparse attention */
    DS41_BD_INDEXER,      /* indexer: scores, candidate pool, top-k (its linears: their streams) */
    DS41_BD_COMPRESS,     /* compressor: pooling, records (its linear: BF16) */
    DS41_BD_MHC,          /* mHC: mixes (Sinkhorn), collapse and expansion of the 4 streams */
    DS41_BD_NORM,         /* RMSNorm, wherever called */
    DS41_BD_ROUTER,       /* router: scores, top-k, weights (the gate linear: BF16) */
    DS41_BD_MOE,          /* MoE glue: SwiGLU, gathering rows, adding outputs */
    DS41_BD_ENGRAM,       /* Engram: hash ids, row reads, its sublayer (its linear: FP8) */
    DS41_BD_HEAD,         /* head: collapse and final norm (its linear: the BF16 head) */
    DS41_BD_SAMPLE,       /* sampling the next token */
    DS41_BD_N
};
#define DS41_BD_DEPTH 16
typedef struct ds41_bd {
    double sec[DS41_BD_N];     /* exclusive seconds */
    double bytes[DS41_BD_N];   /* weight bytes read (the stream sections) */
    long long calls[DS41_BD_N];
    double t;                  /* the clock at the last switch */
    double t0;                 /* the clock at start */
    int cur, depth;
    int stack[DS41_BD_DEPTH];
    long long switches;        /* enters + leaves (the timer reads the breakdown costs) */
    pthread_t owner;           /* the only thread timed */
} ds41_bd;

typedef struct ds41_moe_dispatch ds41_moe_dispatch;
typedef struct ds41_ctx {
    int exact;          /* 1: exact kernels; 0: fast kernels */
    int n_threads;      /* >= 1 */
    ds41_pool *pool;    /* NULL: single-threaded */
    unsigned ablate;    /* DS41_ABLATE_* bits: performance points switched off (0: all on) */
    double *prof;       /* NULL, or DS41_PROF_N accumulators (seconds) */
    const struct ds41_moe_dispatch *moe;   /* routed-expert dispatch (layers/moe.h); NULL: local */
    ds41_bd *bd;        /* NULL, or the decode-step breakdown (DS41_BD_*) */
} ds41_ctx;

/* Monotonic clock in seconds (the timers above). */
double ds41_prof_now(void);

/* Enter section sec (DS41_BD_*), reading bytes of weights; leave returns to the enclosing one.
 * No-ops without a breakdown or on another thread than the one that started it. */
static inline void ds41_bd_enter(const ds41_ctx *ctx, int sec, double bytes) {
    ds41_bd *b = ctx->bd;
    if (!b || !pthread_equal(pthread_self(), b->owner)) return;
    double now = ds41_prof_now();
    b->sec[b->cur] += now - b->t;
    b->t = now;
    if (b->depth < DS41_BD_DEPTH) b->stack[b->depth] = b->cur;
    b->depth++;
    b->cur = sec;
    b->calls[sec]++;
    b->bytes[sec] += bytes;
    b->switches++;
}
static inline void ds41_bd_leave(const ds41_ctx *ctx) {
    ds41_bd *b = ctx->bd;
    if (!b || b->depth <= 0 || !pthread_equal(pthread_self(), b->owner)) return;
    double now = ds41_prof_now();
    b->sec[b->cur] += now - b->t;
    b->t = now;
    b->depth--;
    if (b->depth < DS41_BD_DEPTH) b->cur = b->stack[b->depth];
    b->switches++;
}
/* the section running now (DS41_BD_REST without a breakdown) */
static inline int ds41_bd_current(const ds41_ctx *ctx) { return ctx->bd ? ctx->bd->cur : DS41_BD_REST; }

/* Thread pool: run fn(arg, i) for i in [0, n) over the pool's threads (static split). */
ds41_pool *ds41_pool_create(int n_threads);
void ds41_pool_destroy(ds41_pool *p);
void ds41_parallel_for(const ds41_ctx *ctx, int n, void (*fn)(void *arg, int i0, int i1), void *arg);

/* Per-thread scratch of the linears (kernels/scratch.c): buffer `slot` of the calling thread,
 * 64-byte aligned, at least `bytes`, kept and grown (never shrunk) across calls and freed when
 * the thread exits. A linear's activation tile and panels used to be allocated and freed per
 * call: the ones above glibc's mmap threshold (a 64-row tile of 576 inputs is 147 KB) were
 * mapped and unmapped each time, so every call faulted their pages in again (about 12 us a
 * fault on the VMs here; 170 faults per flush of the deferred DSpark rows, docs/speculative.md).
 * Contents are undefined (never zeroed); valid until this thread asks for the same slot again,
 * so a slot has one user at a time per thread: the linear entry points (fast and exact, which
 * never nest) own the DS41_SCR_LIN_* slots, their work items the DS41_SCR_ITEM_* ones. A thread
 * holds what its largest linears asked for: the fast kernels' 64-row activation tile (64 x in
 * floats), the exact kernels' tile of at most 8 MiB, the panels and accumulators of a work
 * item. NULL when out of memory. */
enum {
    DS41_SCR_LIN_A, DS41_SCR_LIN_AW, DS41_SCR_LIN_SAV, DS41_SCR_LIN_AB, DS41_SCR_LIN_AM,
    DS41_SCR_ITEM_A2, DS41_SCR_ITEM_P, DS41_SCR_ITEM_PW, DS41_SCR_ITEM_SW, DS41_SCR_ITEM_ACC,
    DS41_SCR_N
};
void *ds41_scratch(int slot, size_t bytes);
/* Bytes this thread's scratch holds now (tests). */
size_t ds41_scratch_held(void);
/* Frees this thread's scratch (the speculative calibration's cold first probe, spec.c). */
void ds41_scratch_release(void);

/* Side worker (P6): one extra thread running one task at a time beside the caller. start
 * returns 0 when the task runs there (the caller must ds41_side_wait before starting another
 * or reading its results), -1 when the worker is busy with another caller's task or s is NULL
 * (the caller then runs fn itself). */
typedef struct ds41_side ds41_side;
ds41_side *ds41_side_create(void);
void ds41_side_destroy(ds41_side *s);
int ds41_side_start(ds41_side *s, void (*fn)(void *arg), void *arg);
void ds41_side_wait(ds41_side *s);

/* ---- ISA of the fast kernels: "avx2" (AVX2 + FMA + F16C, the baseline) or "avx512" (AVX-512
 * F/BW/VL/DQ + VNNI), chosen at first use from CPUID; DS41_ISA=avx2|avx512|avx512bf16|auto in
 * the environment overrides (an unsupported choice falls back to the best supported one). All
 * give bit-identical results (one canonical order, linear_fast.c). "avx512bf16" is the avx512
 * path with its FP4 prefill panels and its BF16 linears (where their activations are BF16
 * values) multiplied by vdpbf16ps (AVX512_BF16; the same bits); auto
 * takes it where a start-up probe finds vdpbf16ps at the FMA's rate, "avx512" forces it off.
 * ds41_kernels_isa() names the path ("avx512" for both); ds41_kernels_fp4_products() says
 * "vdpbf16ps" or "int16"; ds41_kernels_bf16_ratio() is the probe's time per vdpbf16ps over
 * time per zmm FMA (run at first call if auto has not; 0 without AVX512_BF16). */
const char *ds41_kernels_isa(void);
const char *ds41_kernels_fp4_products(void);
/* The BF16 linears (ds41_linear_bf16) take the same vdpbf16ps road where "avx512bf16" is on and
 * their activations are BF16 values (the same bits as the FMA road: linear_avx512bf16.c).
 * Counts since start: n[0] 64-token tiles that took it, n[1] tiles its activations sent to the
 * FMA road (a value not BF16, or subnormal, infinite, NaN), n[2] 32-row items (T <= 8) or
 * 512-wide panels (T > 8) its weights sent there (subnormal or extreme values). The FP8
 * linears' tiles of 9 .. 64 tokens take it too (the same bits): n[3] tiles that did, n[4]
 * tiles sent to the FMA road (scale bytes or activations out of its range). */
void ds41_kernels_bf16_road(long long n[5]);
double ds41_kernels_bf16_ratio(void);
/* the FP8 decode of the fast T = 1 .. 8 kernels: "shuffle" or "f16c" (DS41_E4M3, linear_fast.h) */
const char *ds41_kernels_fp8_decode(void);
int ds41_kernels_isa_supported(const char *name);   /* 1 if the CPU runs it */
int ds41_kernels_set_isa(const char *name);         /* 0 ok, -1 unknown or unsupported */

/* ---- elementary functions (exact: evaluated in double from the FP32 input, rounded once) ---- */
float ds41_expf_x(const ds41_ctx *ctx, float x);
float ds41_sigmoid_x(const ds41_ctx *ctx, float x);      /* 1/(1+exp(-x)) */
float ds41_silu_x(const ds41_ctx *ctx, float x);         /* x/(1+exp(-x)) */
float ds41_softplus_x(const ds41_ctx *ctx, float x);     /* x > 20 ? x : log1p(exp(x)) */
float ds41_rsqrt_x(const ds41_ctx *ctx, float x);        /* 1/sqrt(x) as one operation */

/* ---- linears: x [T, in] row-major, y [T, out] row-major ---- */
/* FP8 linear (spec 3.0): Q8 of each x row per 32 along K, per-block dots, scales, bf16 out. */
void ds41_linear_fp8(const ds41_ctx *ctx, const ds41_fp8w *w, const float *x, int T, float *y);
/* FP4 linear (routed experts): same with E2M1 weights and per-row per-32 UE8M0 scales; bf16 out. */
void ds41_linear_fp4(const ds41_ctx *ctx, const ds41_fp4w *w, const float *x, int T, float *y);
/* BF16 linear: out_bf16 ? bf16 result : fp32 result. x values are used as given (BF16 or FP32). */
void ds41_linear_bf16(const ds41_ctx *ctx, const ds41_bf16w *w, const float *x, int T, float *y, int out_bf16);
/* FP32 linear with FP32 weights [out, in]; fp32 out. */
void ds41_linear_f32(const ds41_ctx *ctx, const float *w, int out, int in, const float *x, int T, float *y);
/* BF16 matmul against FP8 weights dequantized on the fly (exactly), rows [row0, row0+nrows) of w,
 * reading x[t*x_stride + k] for k < w->in; no activation quantization; bf16 out to
 * y[t*y_stride + r] for r = 0..nrows-1 (r relative to row0: y points at the group's first
 * output). Used by the grouped wo_a (spec 3.13). */
void ds41_linear_fp8_dq(const ds41_ctx *ctx, const ds41_fp8w *w, int row0, int nrows,
                        const float *x, int x_stride, int T, float *y, int y_stride);

/* ---- RMSNorm (spec 3.0): y = bf16(fp32(w) * fp32(x * rsqrt(mean(x^2) + eps))) ---- */
void ds41_rmsnorm(const ds41_ctx *ctx, const float *x, const uint16_t *w, int T, int d, float eps, float *y);

/* ---- RoPE (spec 3.6) ---- */
typedef struct ds41_rope {
    int d;              /* rope dims (pairs = d/2) */
    int max_pos;
    float inv[256];     /* inverse frequencies, FP32 */
    float *cos, *sin;   /* [max_pos, d/2] */
} ds41_rope;
/* theta and yarn per layer (ds41_layer_plan); YaRN constants from cfg. */
int ds41_rope_init(ds41_rope *r, const ds41_config *cfg, float theta, int yarn, int max_pos, ds41_err *err);
void ds41_rope_free(ds41_rope *r);
/* Rotates x[0..d) (the rope dims of one vector) at position pos, in place, rounding to bf16.
 * inverse: rotation by -angle. */
void ds41_rope_apply(const ds41_rope *r, float *x, int pos, int inverse);

#endif
