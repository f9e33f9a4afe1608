/* Kernel micro-benchmark: the fast linears at production shapes, against the machine's limits.
 *
 *   build/bench/bench_kernels [--quick] [--threads 1,2] [--T 1,8,64] [--only NAME] [--exact] [--resident] [--huge]
 *                             [--best] [--isa avx2|avx512|avx512bf16|avx512dot|auto[,ISA...]] [--e4m3 f16c|shuffle|vbmi[,...]]
 *
 * The ISA path of the fast kernels (CPUID, DS41_ISA or --isa) is printed first, with the FP4
 * products (vdpbf16ps, vdpbf16ps-dot: avx512dot, the FP4 dot order, or int16) and the start-up probe's vdpbf16ps / zmm FMA time ratio. A list
 * (--isa avx512,avx512bf16, or --e4m3 shuffle,vbmi: the FP8 decodes of the T = 1 .. 8 kernels,
 * DS41_E4M3's choices) interleaves the paths call by call in one run: each kernel line is
 * printed per path, the medians of the same rounds, and the later paths end with their speed
 * over the first's (time of the first / time of this one); the %fma probe is the first path's
 * register width. The integer dot
 * probes (int8: vpmaddubsw + vpmaddwd on AVX2, vpdpbusd on AVX-512 VNNI; int16, what the FP4
 * kernels multiply: vpmaddwd, vpdpwssd) are the integer road's peaks.
 * Each linear row ends with its ratio to the probe of the same run and thread count: %bw
 * (weight GB/s / read bandwidth) for T = 1, %fma (GMAC/s / FMA peak GMAC/s) for T > 1, and,
 * when the --T list holds 1 before it, cost(T) / cost(1) (T/T=1: time per call over the T = 1
 * time of the same thread count; 1.00x would mean T rows for the price of one, as the few-row
 * path aims at for the speculative verify widths T = 2 .. 8).
 *
 * Prints, first, three probes of the machine: streaming read bandwidth (GB/s, 1 and N threads,
 * a 512 MiB buffer, AVX2 loads), peak FP32 FMA throughput (GFLOP/s with 12 independent 8-wide
 * accumulators per thread, and the clock it implies at 2 FMA x 8 lanes per cycle; where the
 * AVX-512 path runs, the same on zmm as well, the peak its kernels' %fma ratios use), the core
 * clock measured with a chain of dependent integer adds, and the cost of an empty
 * ds41_parallel_for. Then, for each linear: median time per call, weight GB/s (packed weight
 * bytes read per call / time; for decode this is the figure to compare with the read
 * bandwidth) and GMAC/s (out x in x T / time; for prefill compare with the FMA peak / 2). The
 * prefill lines' %fma is against an FMA probe run alongside: after every call, the probe of the
 * same thread count and register width for a third of the call's time (5 ms at least), the ratio taken
 * between the two medians ("peak alongside"), so that a slow or fast phase of a shared machine
 * moves both sides of the ratio.
 * The weights of each kernel are replicated until they occupy >= 160 MiB and the calls cycle
 * through the copies, so every call streams its weights from DRAM as in a real decode step
 * (a 2.6 MB matrix read repeatedly would sit in the 32 MB L3). --resident keeps one copy
 * instead: a kernel whose T = 1 figure does not rise then is compute-bound, not
 * bandwidth-bound. The probes end with the prefill panels' micro-kernel alone (probe_panel). */
#include "kernels.h"
#include "formats.h"
#include "linear_fast.h"

#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
/* --best: the fastest call instead of the median (on a machine shared with other jobs the
 * fastest call is the one that ran alone; compare only runs made the same way) */
static int best;
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    if (best) return v[0];
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t rs = 0x243F6A8885A308D3ULL;
static uint32_t rnd(void) { rs = rs * 6364136223846793005ULL + 1442695040888963407ULL; return (uint32_t)(rs >> 33); }
static float urand(void) { return (float)(rnd() & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f; }

static void *xmalloc(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64) != 0) { fprintf(stderr, "bench_kernels: out of memory (%zu B)\n", n); exit(1); }
    return p;
}

/* --huge: the weights and the bandwidth probe's buffer on 2 MiB pages (MADV_HUGEPAGE on 2 MiB
 * aligned buffers), as ds41 maps a checkpoint (safetensors.c) and as ds41 bench's probe reads;
 * without it they are malloc'd, on 4 KiB pages where transparent huge pages are madvise-only */
static int huge;
static void *xmalloc_w(size_t n) {
    const size_t H = (size_t)2 << 20;
    if (!huge || n < H) return xmalloc(n);
    void *p = NULL;
    size_t len = (n + H - 1) / H * H;
    if (posix_memalign(&p, H, len) != 0) { fprintf(stderr, "bench_kernels: out of memory (%zu B)\n", n); exit(1); }
#ifdef MADV_HUGEPAGE
    madvise(p, len, MADV_HUGEPAGE);
#endif
    return p;
}

/* ---------------------------------------------------------------- machine probes */

typedef struct bw_job { const float *buf; size_t n; double sums[256]; } bw_job;

static void bw_fn(void *arg, int i0, int i1) {
    bw_job *j = arg;
    for (int part = i0; part < i1; part++) {
        size_t per = j->n / 64, k0 = per * (size_t)part, k1 = k0 + per;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (size_t k = k0; k < k1; k += 32) {
            a0 = _mm256_add_ps(a0, _mm256_load_ps(j->buf + k));
            a1 = _mm256_add_ps(a1, _mm256_load_ps(j->buf + k + 8));
            a2 = _mm256_add_ps(a2, _mm256_load_ps(j->buf + k + 16));
            a3 = _mm256_add_ps(a3, _mm256_load_ps(j->buf + k + 24));
        }
        float t[8];
        _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        j->sums[part] = t[0] + t[7];
    }
}

/* Streaming read bandwidth: 64 equal parts of the buffer split statically over the threads. */
static double probe_bw(const ds41_ctx *ctx, const float *buf, size_t n, int reps) {
    bw_job j = { buf, n, { 0 } };
    double t[16];
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        ds41_parallel_for(ctx, 64, bw_fn, &j);
        t[r] = now() - t0;
    }
    return (double)n * 4.0 / median(t, reps) / 1e9;
}

typedef struct fma_job { long iters; int zmm; float out[256]; } fma_job;

/* the same 12 chains on zmm (16 lanes): the FMA peak of the AVX-512 kernels, which on a core
 * with two 512-bit FMA units is twice the ymm one */
__attribute__((target("avx512f"))) static float fma_zmm(long iters) {
    __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    __m512 a[12];
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], m, c);
    }
    __m512 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s);
}

static void fma_fn(void *arg, int i0, int i1) {
    fma_job *j = arg;
    for (int part = i0; part < i1; part++) {
        if (j->zmm) {
            j->out[part] = fma_zmm(j->iters);
            continue;
        }
        __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
        __m256 a[12];
        for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps((float)i);
        for (long it = 0; it < j->iters; it++) {
            /* 12 independent chains: enough to cover latency 4 x 2 ports (and 5-6 on older cores) */
            a[0] = _mm256_fmadd_ps(a[0], m, c); a[1] = _mm256_fmadd_ps(a[1], m, c);
            a[2] = _mm256_fmadd_ps(a[2], m, c); a[3] = _mm256_fmadd_ps(a[3], m, c);
            a[4] = _mm256_fmadd_ps(a[4], m, c); a[5] = _mm256_fmadd_ps(a[5], m, c);
            a[6] = _mm256_fmadd_ps(a[6], m, c); a[7] = _mm256_fmadd_ps(a[7], m, c);
            a[8] = _mm256_fmadd_ps(a[8], m, c); a[9] = _mm256_fmadd_ps(a[9], m, c);
            a[10] = _mm256_fmadd_ps(a[10], m, c); a[11] = _mm256_fmadd_ps(a[11], m, c);
        }
        __m256 s = a[0];
        for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, a[i]);
        float t[8];
        _mm256_storeu_ps(t, s);
        j->out[part] = t[0];
    }
}

/* Seconds for iters FMA probe iterations on nt threads (zmm or ymm), one part per thread: the
 * probe run alongside each prefill kernel's calls, one after each call. */
static double fma_time(const ds41_ctx *ctx, int nt, int zmm, long iters) {
    fma_job j;
    memset(&j, 0, sizeof j);
    j.iters = iters;
    j.zmm = zmm;
    double t0 = now();
    ds41_parallel_for(ctx, nt, fma_fn, &j);
    return now() - t0;
}

/* Peak FMA rate: one part per thread, GFLOP/s (2 flops per lane per FMA); zmm: 16 lanes. */
static double probe_fma(const ds41_ctx *ctx, int nt, int zmm) {
    const long iters = 20000000;
    double t[5];
    for (int r = 0; r < 5; r++) t[r] = fma_time(ctx, nt, zmm, iters);
    return (double)nt * (double)iters * 12.0 * (zmm ? 16.0 : 8.0) * 2.0 / median(t, 5) / 1e9;
}

/* The prefill panels' float micro-kernels alone (ops->pf_float, one thread, one K panel of the
 * ISA's depth per call, the same call repeated): nr rows of a decoded panel against T tokens.
 * nr = 4, T = 3 is one micro-tile with its operands resident in L1 (4 + 3 rows of K floats);
 * nr = 32, T = 64 is a whole work item as the prefill runs it (the 32-row panel, 64 activation
 * rows and the accumulators from L2). GMAC/s, the median of 5. The repeated 4 x 3 call adds
 * into the same accumulators, so each call waits on the previous one's sums through memory:
 * a latency-bound rate (on an Intel Xeon below the item's), not a ceiling. The item is what
 * the micro-kernel keeps with its data streamed through the caches, before the panel decode
 * and the Q8 of the activations. */
static double probe_panel(int nr, int T) {
    const ds41_fast_ops *ops = ds41_fast_ops_get();
    int K = ops->kc;
    float *P = xmalloc((size_t)nr * K * 4), *A = xmalloc((size_t)T * K * 4), *acc = xmalloc((size_t)nr * T * 16 * 4);
    for (int i = 0; i < nr * K; i++) P[i] = (float)(i % 7) * 0.001f;
    for (int i = 0; i < T * K; i++) A[i] = (float)(i % 5) * 0.001f;
    memset(acc, 0, (size_t)nr * T * 16 * 4);
    long reps = 200000000L / ((long)nr * T * K) + 1;
    double t[5];
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        for (long i = 0; i < reps; i++) ops->pf_float(P, nr, A, (size_t)K, T, K / 8, acc, 0);
        t[r] = now() - t0;
    }
    double g = (double)reps * nr * T * K / median(t, 5) / 1e9 + acc[0] * 0.0;
    free(P); free(A); free(acc);
    return g;
}

typedef struct i8_job { long iters; int kind; int out[256]; } i8_job;

/* The integer probes keep their 10 accumulators in named registers, one statement each (as the
 * FMA probe does): written as a loop over an array, gcc kept the array in memory and every
 * step became a load, the dot and a store, so the probe timed store forwarding (1.1x the zmm
 * FMA peak on an Intel Xeon where the instruction runs at 2.1-3.3x). */
#define I10(OP) OP(c0) OP(c1) OP(c2) OP(c3) OP(c4) OP(c5) OP(c6) OP(c7) OP(c8) OP(c9)
#define I10_DECL(T, INIT) T c0 = INIT(0), c1 = INIT(1), c2 = INIT(2), c3 = INIT(3), c4 = INIT(4), \
    c5 = INIT(5), c6 = INIT(6), c7 = INIT(7), c8 = INIT(8), c9 = INIT(9)

/* kind 1: vpdpbusd (int8, 64 MACs per zmm instruction); 2: vpdpwssd (int16, 32) */
__attribute__((target("avx512f,avx512bw,avx512vnni")))
static int i_vnni(long iters, int kind) {
    __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
    I10_DECL(__m512i, _mm512_set1_epi32);
    if (kind == 1) {
#define DPB(c) c = _mm512_dpbusd_epi32(c, a, b);
        for (long it = 0; it < iters; it++) { I10(DPB) }
    } else {
#define DPW(c) c = _mm512_dpwssd_epi32(c, a, b);
        for (long it = 0; it < iters; it++) { I10(DPW) }
    }
    __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)),
                                 _mm512_add_epi32(_mm512_add_epi32(c4, c5), _mm512_add_epi32(c6, c7)));
    s = _mm512_add_epi32(s, _mm512_add_epi32(c8, c9));
    return _mm512_reduce_add_epi32(s);
}

/* kind 0: AVX2 vpmaddubsw + vpmaddwd + vpaddd (int8, 32 MACs per ymm step); 3: vpmaddwd +
 * vpaddd (int16, 16) */
static int i_avx2(long iters, int kind) {
    __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2), one = _mm256_set1_epi16(1);
    I10_DECL(__m256i, _mm256_set1_epi32);
    if (kind == 0) {
#define MUB(c) c = _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), one));
        for (long it = 0; it < iters; it++) { I10(MUB) }
    } else {
#define MWD(c) c = _mm256_add_epi32(c, _mm256_madd_epi16(a, b));
        for (long it = 0; it < iters; it++) { I10(MWD) }
    }
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)),
                                 _mm256_add_epi32(_mm256_add_epi32(c4, c5), _mm256_add_epi32(c6, c7)));
    s = _mm256_add_epi32(s, _mm256_add_epi32(c8, c9));
    return _mm256_extract_epi32(s, 0);
}

static void i8_fn(void *arg, int i0, int i1) {
    i8_job *j = arg;
    for (int part = i0; part < i1; part++)
        j->out[part] = j->kind == 1 || j->kind == 2 ? i_vnni(j->iters, j->kind) : i_avx2(j->iters, j->kind);
}

/* Peak integer dot rate, GMAC/s (one MAC per pair of elements multiplied): kind 0 AVX2 int8
 * maddubs (32 MACs per step), 1 VNNI dpbusd (64), 2 VNNI dpwssd (32), 3 AVX2 int16 maddwd (16). */
static double probe_i8(const ds41_ctx *ctx, int nt, int kind) {
    static const double macs[4] = { 32.0, 64.0, 32.0, 16.0 };
    i8_job j;
    memset(&j, 0, sizeof j);
    j.iters = 10000000;
    j.kind = kind;
    double t[5];
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        ds41_parallel_for(ctx, nt, i8_fn, &j);
        t[r] = now() - t0;
    }
    return (double)nt * (double)j.iters * 10.0 * macs[kind] / median(t, 5) / 1e9;
}

/* Clock: a chain of dependent integer adds retires one per cycle on every x86 core. */
static double probe_clock(void) {
    double t[5];
    const long n = 400000000;
    for (int r = 0; r < 5; r++) {
        long x = 0, i = n;
        double t0 = now();
        __asm__ volatile(
            "1:\n\t"
            "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
            "sub $4, %1\n\tjnz 1b\n"
            : "+r"(x), "+r"(i) : : "cc");
        t[r] = now() - t0;
    }
    return (double)n / median(t, 5) / 1e9;
}

static void empty_fn(void *arg, int i0, int i1) { (void)arg; (void)i0; (void)i1; }

static double probe_dispatch(const ds41_ctx *ctx) {
    double t[7];
    const int calls = 20000;
    for (int r = 0; r < 7; r++) {
        double t0 = now();
        for (int i = 0; i < calls; i++) ds41_parallel_for(ctx, ctx->n_threads, empty_fn, NULL);
        t[r] = (now() - t0) / calls;
    }
    return median(t, 7) * 1e6;
}

/* ---------------------------------------------------------------- linears */

enum { K_FP8, K_FP4, K_BF16, K_DQ, K_F32 };

typedef struct shape { const char *name; int kind, out, in; } shape;

/* Production width (hidden 5120): the matrices of one layer, the BF16 head at a quarter of
 * the 129280-row vocabulary (the same streaming behaviour, a quarter of the bytes), one
 * 1024-row group of the grouped wo_a, and the mHC mixing projection (FP32, 24 x 4*5120). */
static const shape shapes[] = {
    { "fp8 wq_a", K_FP8, 1280, 5120 },
    { "fp8 wq_b", K_FP8, 32768, 1280 },
    { "fp8 wkv", K_FP8, 512, 5120 },
    { "fp8 wo_b", K_FP8, 5120, 8192 },
    { "fp8 sh_w1", K_FP8, 2304, 5120 },
    { "fp8 sh_w2", K_FP8, 5120, 2304 },
    { "fp4 w1", K_FP4, 2304, 5120 },
    { "fp4 w2", K_FP4, 5120, 2304 },
    { "bf16 head/4", K_BF16, 32320, 5120 },
    { "bf16 comp", K_BF16, 512, 5120 },
    { "fp8dq wo_a", K_DQ, 1024, 4096 },
    { "f32 mhc", K_F32, 24, 20480 },
};

typedef struct wset {
    int n;                  /* copies */
    size_t bytes;           /* packed bytes of one copy */
    uint8_t **w, **s;       /* fp8/fp4 codes and scales */
    uint16_t **wb;
    float **wf;
} wset;

/* FP8 codes like a checkpoint's: E4M3 of bell-shaped values (a sum of four uniforms) scaled
 * so that the tails reach 448, drawn from a table of 65536 of them. Zeros and subnormals (a
 * zero exponent field) are then about 1 in 10^4 codes, as in a quantized checkpoint, where
 * uniformly random codes have one in 8 to 16 (and take the kernels' rare-case paths). */
static uint8_t fp8_tab[65536];
static int fp8_tab_ready;
static void fp8_tab_fill(void) {
    if (fp8_tab_ready) return;
    fp8_tab_ready = 1;
    for (int i = 0; i < 65536; i++) fp8_tab[i] = ds41_e4m3_from_f32((urand() + urand() + urand() + urand()) * 112.0f);
}

/* --resident: one copy of each kernel's weights, read over and over (from L2 / L3 when it fits:
 * a kernel that runs as fast as from DRAM is compute-bound, not bandwidth-bound) */
static int resident;

static void wset_make(wset *ws, const shape *sh) {
    size_t out = (size_t)sh->out, in = (size_t)sh->in;
    size_t nbo = (out + 31) / 32, nbi = (in + 31) / 32;
    size_t wbytes = 0, sbytes = 0;
    switch (sh->kind) {
    case K_FP8: case K_DQ: wbytes = out * in; sbytes = nbo * nbi; break;
    case K_FP4: wbytes = out * in / 2; sbytes = out * (in / 32); break;
    case K_BF16: wbytes = out * in * 2; break;
    case K_F32: wbytes = out * in * 4; break;
    }
    ws->bytes = wbytes + sbytes;
    size_t target = resident ? 1 : (size_t)160 << 20;
    ws->n = (int)((target + ws->bytes - 1) / ws->bytes);
    if (ws->n < 1) ws->n = 1;
    if (ws->n > 4096) ws->n = 4096;
    ws->w = calloc((size_t)ws->n, sizeof *ws->w);
    ws->s = calloc((size_t)ws->n, sizeof *ws->s);
    ws->wb = calloc((size_t)ws->n, sizeof *ws->wb);
    ws->wf = calloc((size_t)ws->n, sizeof *ws->wf);
    for (int c = 0; c < ws->n; c++) {
        if (sh->kind == K_FP8 || sh->kind == K_DQ || sh->kind == K_FP4) {
            ws->w[c] = xmalloc_w(wbytes);
            ws->s[c] = xmalloc(sbytes);
            if (sh->kind == K_FP4) {
                uint32_t *p = (uint32_t *)ws->w[c];
                for (size_t i = 0; i < wbytes / 4; i++) p[i] = rnd() ^ (rnd() << 16);
            } else {
                fp8_tab_fill();
                for (size_t i = 0; i < wbytes; i++) ws->w[c][i] = fp8_tab[rnd() & 0xFFFF];
            }
            for (size_t i = 0; i < sbytes; i++) ws->s[c][i] = (uint8_t)(117 + rnd() % 6);
        } else if (sh->kind == K_BF16) {
            ws->wb[c] = xmalloc_w(wbytes);
            for (size_t i = 0; i < out * in; i++) ws->wb[c][i] = ds41_bf16_from_f32(urand() * 0.05f);
        } else {
            ws->wf[c] = xmalloc_w(wbytes);
            for (size_t i = 0; i < out * in; i++) ws->wf[c][i] = urand() * 0.05f;
        }
    }
}

static void wset_free(wset *ws) {
    for (int c = 0; c < ws->n; c++) { free(ws->w[c]); free(ws->s[c]); free(ws->wb[c]); free(ws->wf[c]); }
    free(ws->w); free(ws->s); free(ws->wb); free(ws->wf);
}

static void call(const ds41_ctx *ctx, const shape *sh, const wset *ws, int c, const float *x, int T, float *y) {
    switch (sh->kind) {
    case K_FP8: { ds41_fp8w w = { ws->w[c], ws->s[c], sh->out, sh->in }; ds41_linear_fp8(ctx, &w, x, T, y); break; }
    case K_FP4: { ds41_fp4w w = { ws->w[c], ws->s[c], sh->out, sh->in }; ds41_linear_fp4(ctx, &w, x, T, y); break; }
    case K_BF16: { ds41_bf16w w = { ws->wb[c], sh->out, sh->in }; ds41_linear_bf16(ctx, &w, x, T, y, 0); break; }
    case K_DQ: {
        ds41_fp8w w = { ws->w[c], ws->s[c], sh->out, sh->in };
        ds41_linear_fp8_dq(ctx, &w, 0, sh->out, x, sh->in, T, y, sh->out);
        break;
    }
    case K_F32: ds41_linear_f32(ctx, ws->wf[c], sh->out, sh->in, x, T, y); break;
    }
}

static int parse_list(const char *s, int *v, int max) {
    int n = 0;
    while (*s && n < max) {
        char *e;
        long x = strtol(s, &e, 10);
        if (e == s || x < 1 || x > 4096) return -1;
        v[n++] = (int)x;
        s = *e == ',' ? e + 1 : e;
        if (*e && *e != ',') return -1;
    }
    return n;
}

/* --e4m3: the FP8 decode of the T = 1 .. 8 kernels (DS41_E4M3's choices), one or a list to
 * interleave call by call */
static int set_dec(const char *t);
static void set_path(int isa, const char *p) {
    if (isa) ds41_kernels_set_isa(p);
    else set_dec(p);
}
static int set_dec(const char *t) {
    if (!strcmp(t, "f16c")) ds41_fast_e4m3_shuffle = 0;
    else if (!strcmp(t, "shuffle")) ds41_fast_e4m3_shuffle = 1;
    else if (!strcmp(t, "vbmi")) ds41_fast_e4m3_shuffle = 2;
    else return -1;
    return 0;
}

int main(int argc, char **argv) {
    int threads[8] = { 1, 2 }, n_thr = 2, Ts[8] = { 1, 8, 64 }, n_T = 3, quick = 0, exact = 0, probes = 1;
    const char *only = NULL;
    char isa_buf[256] = "", *isas[4], dec_buf[256] = "", *decs[8];
    int n_isa = 0, n_dec = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            snprintf(isa_buf, sizeof isa_buf, "%s", argv[++i]);
            n_isa = 0;
            for (char *t = strtok(isa_buf, ","); t && n_isa < 4; t = strtok(NULL, ",")) {
                if (ds41_kernels_set_isa(t) != 0) { fprintf(stderr, "bench_kernels: --isa %s: unknown or not supported by this CPU\n", t); return 2; }
                isas[n_isa++] = t;
            }
            if (n_isa == 0) { fprintf(stderr, "bench_kernels: --isa: empty list\n"); return 2; }
            ds41_kernels_set_isa(isas[0]);
            continue;
        }
        if (!strcmp(argv[i], "--e4m3") && i + 1 < argc) {
            snprintf(dec_buf, sizeof dec_buf, "%s", argv[++i]);
            n_dec = 0;
            for (char *t = strtok(dec_buf, ","); t && n_dec < 8; t = strtok(NULL, ",")) {
                if (set_dec(t) != 0) { fprintf(stderr, "bench_kernels: --e4m3 %s: not f16c, shuffle or vbmi\n", t); return 2; }
                decs[n_dec++] = t;
            }
            if (n_dec == 0) { fprintf(stderr, "bench_kernels: --e4m3: empty list\n"); return 2; }
            set_dec(decs[0]);
            continue;
        }
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--exact")) exact = 1;
        else if (!strcmp(argv[i], "--no-probes")) probes = 0;
        else if (!strcmp(argv[i], "--resident")) resident = 1;
        else if (!strcmp(argv[i], "--huge")) huge = 1;
        else if (!strcmp(argv[i], "--best")) best = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) n_thr = parse_list(argv[++i], threads, 8);
        else if (!strcmp(argv[i], "--T") && i + 1 < argc) n_T = parse_list(argv[++i], Ts, 8);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else {
            fprintf(stderr, "usage: bench_kernels [--quick] [--exact] [--no-probes] [--resident] [--huge] [--best] [--threads 1,2] [--T 1,8,64] [--only SUBSTR] [--isa avx2|avx512|avx512bf16|avx512dot|auto[,ISA...]] [--e4m3 f16c|shuffle|vbmi[,...]]\n");
            return 2;
        }
        if (n_thr < 1 || n_T < 1) { fprintf(stderr, "bench_kernels: bad list\n"); return 2; }
    }
    double min_time = quick ? 0.08 : 0.25;
    ds41_pool *pools[8] = { 0 };
    ds41_ctx ctxs[8];
    for (int i = 0; i < n_thr; i++) {
        pools[i] = threads[i] > 1 ? ds41_pool_create(threads[i]) : NULL;
        ctxs[i] = (ds41_ctx){ exact, threads[i], pools[i], 0, NULL, NULL, NULL };
    }

    double bw_of[8] = { 0 }, fma_of[8] = { 0 };
    printf("== fast kernels ISA path: %s (avx512 supported: %s; DS41_ISA=%s), FP8 decode %s (DS41_E4M3=%s)\n",
           ds41_kernels_isa(), ds41_kernels_isa_supported("avx512") ? "yes" : "no",
           getenv("DS41_ISA") ? getenv("DS41_ISA") : "unset", ds41_kernels_fp8_decode(),
           getenv("DS41_E4M3") ? getenv("DS41_E4M3") : "unset");
    printf("== FP4 prefill products: %s (avx512bf16 supported: %s", ds41_kernels_fp4_products(),
           ds41_kernels_isa_supported("avx512bf16") ? "yes" : "no");
    if (ds41_kernels_isa_supported("avx512bf16"))
        printf("; vdpbf16ps / zmm FMA time per instruction %.2f, auto takes vdpbf16ps at <= %.2f", ds41_kernels_bf16_ratio(),
               DS41_BF16_RATIO_MAX);
    printf(")\n");
    if (n_isa > 1 && n_dec > 1) { fprintf(stderr, "bench_kernels: --isa and --e4m3 lists cannot both interleave\n"); return 2; }
    const int nv = n_isa > 1 ? n_isa : n_dec > 1 ? n_dec : 1;   /* paths interleaved per call */
    char **paths = n_isa > 1 ? isas : decs;
    const int zmm_peak = !strcmp(ds41_kernels_isa(), "avx512");
    if (probes) {
        printf("== machine probes\n");
        printf("clock (dependent integer adds): %.2f GHz\n", probe_clock());
        size_t n = (size_t)128 << 20;   /* floats: 512 MiB */
        float *buf = xmalloc_w(n * 4);
        for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 7);
        for (int i = 0; i < n_thr; i++) {
            double bw = probe_bw(&ctxs[i], buf, n, quick ? 3 : 7);
            double fl = probe_fma(&ctxs[i], threads[i], 0);
            bw_of[i] = bw;
            fma_of[i] = fl / 2;
            printf("threads %d: read bandwidth %.1f GB/s; FMA peak %.1f GFLOP/s = %.1f GMAC/s"
                   " (%.2f GHz x 2 FMA x 8 lanes per core)",
                   threads[i], bw, fl, fl / 2, fl / 2 / 16.0 / threads[i]);
            if (zmm_peak) {   /* the %fma ratios of the AVX-512 kernels are against this one */
                double fz = probe_fma(&ctxs[i], threads[i], 1);
                fma_of[i] = fz / 2;
                printf("; zmm FMA peak %.1f GMAC/s (%.2fx ymm)", fz / 2, fz / fl);
            }
            if (threads[i] > 1) printf("; empty parallel_for %.2f us", probe_dispatch(&ctxs[i]));
            printf("\n");
            double i8 = probe_i8(&ctxs[i], threads[i], 0), i16 = probe_i8(&ctxs[i], threads[i], 3);
            printf("threads %d: integer dot peak AVX2 int8 vpmaddubsw %.1f GMAC/s (%.2fx FMA), int16 vpmaddwd %.1f (%.2fx)",
                   threads[i], i8, i8 / fma_of[i], i16, i16 / fma_of[i]);
            if (ds41_kernels_isa_supported("avx512")) {
                double v = probe_i8(&ctxs[i], threads[i], 1), w = probe_i8(&ctxs[i], threads[i], 2);
                printf("; AVX-512 VNNI int8 vpdpbusd %.1f (%.2fx), int16 vpdpwssd %.1f (%.2fx)", v, v / fma_of[i], w,
                       w / fma_of[i]);
            }
            printf("\n");
        }
        if (!exact) {
            double p1 = probe_panel(4, 3), p2 = probe_panel(32, 64), f1 = fma_of[0] > 0 ? fma_of[0] / threads[0] : 0;
            printf("prefill panel micro-kernel (%s, K = %d, 1 thread): 4 rows x 3 tokens in L1 %.1f GMAC/s,"
                   " 32 rows x 64 tokens %.1f GMAC/s", ds41_kernels_isa(), ds41_fast_ops_get()->kc, p1, p2);
            if (f1 > 0) printf(" (%.0f%% / %.0f%% of one core's FMA peak)", 100 * p1 / f1, 100 * p2 / f1);
            printf("\n");
        }
        free(buf);
    }

    printf("== linears (%s kernels%s%s): median per call; GB/s = packed weight bytes / time\n", exact ? "exact" : "fast",
           exact ? "" : ", ISA ", exact ? "" : ds41_kernels_isa());
    printf("%-12s %11s %4s %3s %10s %8s %8s %7s %7s\n", "kernel", "out x in", "T", "thr", "ms/call", "GB/s", "GMAC/s", "ratio",
           "T/T=1");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *sh = &shapes[si];
        if (only && !strstr(sh->name, only)) continue;
        wset ws;
        wset_make(&ws, sh);
        int maxT = 1;
        for (int i = 0; i < n_T; i++) if (Ts[i] > maxT) maxT = Ts[i];
        float *x = xmalloc((size_t)maxT * sh->in * 4), *y = xmalloc((size_t)maxT * sh->out * 4);
        for (size_t i = 0; i < (size_t)maxT * sh->in; i++) x[i] = ds41_bf16_round(urand() * (i % 13 == 0 ? 8.0f : 1.0f));
        double t1_of[8] = { 0 };   /* T = 1 median per thread count, for cost(T) / cost(1) */
        for (int ti = 0; ti < n_T; ti++) {
            int T = Ts[ti];
            for (int hi = 0; hi < n_thr; hi++) {
                const ds41_ctx *ctx = &ctxs[hi];
                int c = 0;
                /* warm-up: one pass over every copy (page faults, pool start), every path */
                for (int v = 0; v < nv; v++) {
                    if (nv > 1) set_path(n_isa > 1, paths[v]);
                    for (int w = 0; w < ws.n && w < 64; w++) call(ctx, sh, &ws, w, x, T, y);
                }
                if (nv > 1) set_path(n_isa > 1, paths[0]);
                static double times[4][4096], ptimes[4096];
                int n = 0;
                /* the FMA probe alongside (prefill lines): a third of one call's time at the
                 * probe's rate, 5 ms at least, so that waking a pool worker that went to sleep
                 * (tens of microseconds) stays a small part of it */
                long piters = 0;
                if (probes && T > 1 && !exact && fma_of[hi] > 0) {
                    double t0 = now();
                    call(ctx, sh, &ws, c, x, T, y);
                    double pt = (now() - t0) / 3;
                    if (pt < 0.005) pt = 0.005;
                    piters = (long)(pt * fma_of[hi] * 1e9 / threads[hi] / (12.0 * (zmm_peak ? 16.0 : 8.0)));
                }
                long long chain0 = ds41_exact_chain_rows;
                double start = now();
                while (n < 4096 && (n < 5 || now() - start < min_time * nv)) {
                    /* one call per path per round, each on the next weights copy (a path
                     * following another on the same copy would find it in cache), the paths'
                     * order rotated round by round (no path always first or last) */
                    for (int i = 0; i < nv; i++) {
                        int v = (n + i) % nv;
                        if (nv > 1) set_path(n_isa > 1, paths[v]);
                        double t0 = now();
                        call(ctx, sh, &ws, c, x, T, y);
                        times[v][n] = now() - t0;
                        c = (c + 1) % ws.n;
                    }
                    if (piters) ptimes[n] = fma_time(ctx, threads[hi], zmm_peak, piters);
                    n++;
                }
                if (nv > 1) set_path(n_isa > 1, paths[0]);
                double pk = piters ? (double)threads[hi] * piters * 12.0 * (zmm_peak ? 16.0 : 8.0) / median(ptimes, n) / 1e9 : 0;
                double med0 = 0;
                for (int v = 0; v < nv; v++) {
                    double med = median(times[v], n);
                    double macs = (double)sh->out * sh->in * T;
                    double gbs = (double)ws.bytes / med / 1e9, gmac = macs / med / 1e9;
                    printf("%-12s %5dx%-5d %4d %3d %10.3f %8.2f %8.2f", sh->name, sh->out, sh->in, T, threads[hi],
                           med * 1e3, gbs, gmac);
                    if (T == 1 && bw_of[hi] > 0) printf(" %5.0f%%bw", 100.0 * gbs / bw_of[hi]);
                    else if (T > 1 && pk > 0) printf(" %4.0f%%fma", 100.0 * gmac / pk);
                    else printf(" %7s", "");
                    if (v == 0 && T == 1) t1_of[hi] = med;
                    else if (v == 0 && t1_of[hi] > 0) printf(" %6.2fx", med / t1_of[hi]);
                    else printf(" %7s", "");
                    if (pk > 0) printf("  peak alongside %.1f GMAC/s", pk);
                    if (nv > 1) printf("  [%s]", paths[v]);
                    if (v == 0) med0 = med;
                    else printf(" %.2fx the %s speed", med0 / med, paths[0]);
                    if (v == 0 && ds41_exact_chain_rows > chain0)   /* exact dense T = 1: rows not certified */
                        printf("  chain %.2f%%", 100.0 * (double)(ds41_exact_chain_rows - chain0) / ((double)n * nv * sh->out * T));
                    printf("\n");
                }
                fflush(stdout);
            }
        }
        free(x);
        free(y);
        wset_free(&ws);
    }
    for (int i = 0; i < n_thr; i++) ds41_pool_destroy(pools[i]);
    return 0;
}
