/* ds41 kernels: linears over packed FP8 / FP4 / BF16 / FP32 weights (spec 3.0, 3.13).
 *
 * Weights stay packed; rows are decoded on the fly (at most one decoded row per thread).
 * Every kernel threads over output rows only, with the static split of ds41_parallel_for, so
 * an exact kernel gives the same bits for any thread count.
 *
 * Exact kernels (exact-mode.md):
 *   FP8 / FP4: each 32-wide K-block dot of the Q8 activation codes and the weight codes is a
 *     sum of products that are exact in double, and the sum itself is exact in double (FP8 x
 *     FP8 products are multiples of 2^-18 below 2^18, 32 of them need < 42 bits; FP4 x FP8
 *     fewer), so the block dot is order independent and is computed 4 lanes at a time in
 *     double. It is multiplied by the activation scale, then by the weight scale (powers of
 *     two: exact), and the blocks are added to a double accumulator starting at 0 in
 *     increasing K order; then FP32, then BF16.
 *   BF16 / FP32 / dequantized FP8: products exact in double, summed in double in increasing K
 *     order, rounded once to FP32 (then BF16 where the caller asks).
 *   The scalar code below is the readable statement of these sums and the twin the tests
 *   compare against; ds41_linear_* run the vectorised version of the same sums
 *   (linear_exact.c: output rows in double lanes, each lane in the scalar order, bit for bit)
 *   whenever the shape fits it, and the scalar code when ds41_exact_simd is 0.
 * Fast kernels (ctx->exact == 0): kernels/linear_fast.c (AVX2, one canonical FP32 order per
 *   output for decode and prefill alike). The fast code below only serves shapes those do not
 *   cover (quantized linears with in % 32 != 0, FP8-dequantized with in % 32 != 0): the same
 *   activation quantization, FP32 block dots with 8-wide FMA; E4M3 codes widened to FP16
 *   patterns and converted with F16C (value * 2^-8, the 2^8 folded into the block scale), E2M1
 *   codes through a 16-entry byte shuffle (value * 2, the 1/2 folded likewise). */
#include "kernels.h"
#include "formats.h"
#include "linear_fast.h"
#include "hsum.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- decode tables */

static float e4m3_lut[256];
static float e2m1_pair_lut[256][2];   /* byte -> (low nibble value, high nibble value) */
static pthread_once_t lut_once = PTHREAD_ONCE_INIT;

static void lut_init(void) {
    for (int c = 0; c < 256; c++) {
        e4m3_lut[c] = ds41_e4m3_to_f32((uint8_t)c);
        e2m1_pair_lut[c][0] = ds41_e2m1_to_f32((uint8_t)(c & 15));
        e2m1_pair_lut[c][1] = ds41_e2m1_to_f32((uint8_t)(c >> 4));
    }
}
static inline void luts(void) { pthread_once(&lut_once, lut_init); }

/* Below this many multiply-adds a linear runs on the calling thread only. */
#define PAR_MIN_WORK 65536LL

/* ---------------------------------------------------------------- activation Q8 */

/* Q8 of T rows of length in, per 32 along K (the last group may be shorter): qa holds the
 * decoded E4M3 code values (exact floats), sa the per-group power-of-two scales. */
static void quantize_rows(const float *x, int x_stride, int T, int in, float *qa, float *sa) {
    int nb = (in + 31) / 32;
    uint8_t codes[32], sb;
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * x_stride;
        for (int b = 0; b < nb; b++) {
            int k0 = b * 32, n = in - k0 < 32 ? in - k0 : 32;
            float s = ds41_q8_group(xr + k0, n, codes, &sb);
            sa[(size_t)t * nb + b] = s;
            for (int i = 0; i < n; i++) qa[(size_t)t * in + k0 + i] = e4m3_lut[codes[i]];
        }
    }
}

/* ---------------------------------------------------------------- SIMD helpers */

static inline double hsum4d(__m256d v) {
    __m128d lo = _mm256_castpd256_pd128(v), hi = _mm256_extractf128_pd(v, 1);
    __m128d s = _mm_add_pd(lo, hi);
    s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
    return _mm_cvtsd_f64(s);
}

/* 8 E4M3 codes -> 8 floats equal to value * 2^-8: the code's low 7 bits shifted left by 7
 * are the FP16 pattern of value * 2^-8 (normals and subnormals alike), sign moved to bit 15. */
static inline __m256 e4m3x8_scaled(const uint8_t *c) {
    __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)c));
    __m128i mag = _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7F)), 7);
    __m128i sgn = _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8);
    return _mm256_cvtph_ps(_mm_or_si128(mag, sgn));
}

/* 16 packed E2M1 bytes -> 32 int8 values equal to 2 * value, in element order. */
static inline void e2m1x32_doubled(const uint8_t *p, __m128i *e0, __m128i *e1) {
    const __m128i tab = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_and_si128(v, _mm_set1_epi8(0x0F));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F));
    __m128i tl = _mm_shuffle_epi8(tab, lo), th = _mm_shuffle_epi8(tab, hi);
    *e0 = _mm_unpacklo_epi8(tl, th);   /* elements 0..15: even k from the low nibble */
    *e1 = _mm_unpackhi_epi8(tl, th);   /* elements 16..31 */
}
static inline __m256 i8x8_to_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

/* Exact double dot of n floats (n a multiple of 4): 4 lanes, no FMA. Only used where every
 * partial sum is exact (block dots of quantized values), so the lane order is irrelevant. */
static inline double dot_exact_blk(const float *a, const float *w, int n) {
    __m256d acc = _mm256_setzero_pd();
    int k = 0;
    for (; k + 4 <= n; k += 4) {
        __m256d va = _mm256_cvtps_pd(_mm_loadu_ps(a + k));
        __m256d vw = _mm256_cvtps_pd(_mm_loadu_ps(w + k));
        acc = _mm256_add_pd(acc, _mm256_mul_pd(va, vw));
    }
    double s = hsum4d(acc);
    for (; k < n; k++) s += (double)a[k] * (double)w[k];
    return s;
}

/* ---------------------------------------------------------------- FP8 / FP4 job */

typedef struct qlin_job {
    const ds41_ctx *ctx;
    const uint8_t *w, *s;   /* codes and scales */
    int fp4;                /* 0: FP8 32x32 tiles; 1: FP4 per-row per-32 scales */
    int out, in, T;
    const float *qa, *sa;   /* quantized activations */
    float *y;
} qlin_job;

static inline float wscale(const qlin_job *j, int n, int b, int nb) {
    if (j->fp4) return ds41_ue8m0_to_f32(j->s[(size_t)n * (j->in / 32) + b]);
    return ds41_ue8m0_to_f32(j->s[(size_t)(n / 32) * nb + b]);
}

/* Decodes weight row n into wrow[in] (exact values, without the scales). */
static void decode_row(const qlin_job *j, int n, float *wrow) {
    if (j->fp4) {
        const uint8_t *p = j->w + (size_t)n * (j->in / 2);
        for (int i = 0; i < j->in / 2; i++) {
            wrow[2 * i] = e2m1_pair_lut[p[i]][0];
            wrow[2 * i + 1] = e2m1_pair_lut[p[i]][1];
        }
    } else {
        const uint8_t *p = j->w + (size_t)n * j->in;
        for (int i = 0; i < j->in; i++) wrow[i] = e4m3_lut[p[i]];
    }
}

static void qlin_exact_rows(void *arg, int n0, int n1) {
    const qlin_job *j = arg;
    int in = j->in, nb = (in + 31) / 32;
    float *wrow = malloc((size_t)in * sizeof(float));
    if (!wrow) return;
    for (int n = n0; n < n1; n++) {
        decode_row(j, n, wrow);
        for (int t = 0; t < j->T; t++) {
            const float *qa = j->qa + (size_t)t * in, *sa = j->sa + (size_t)t * nb;
            double acc = 0.0;
            for (int b = 0; b < nb; b++) {
                int k0 = b * 32, len = in - k0 < 32 ? in - k0 : 32;
                double dot = dot_exact_blk(qa + k0, wrow + k0, len);
                acc += dot * (double)sa[b] * (double)wscale(j, n, b, nb);
            }
            j->y[(size_t)t * j->out + n] = ds41_bf16_round((float)acc);
        }
    }
    free(wrow);
}

/* Fast: one output of an FP8 row straight from the codes (K a multiple of 32). */
static inline float fp8_row_dot_fast(const uint8_t *wc, const float *qa, const float *sa,
                                     const float *sw, int nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *c = wc + b * 32;
        const float *a = qa + b * 32;
        __m256 d = _mm256_mul_ps(e4m3x8_scaled(c), _mm256_loadu_ps(a));
        d = _mm256_fmadd_ps(e4m3x8_scaled(c + 8), _mm256_loadu_ps(a + 8), d);
        d = _mm256_fmadd_ps(e4m3x8_scaled(c + 16), _mm256_loadu_ps(a + 16), d);
        d = _mm256_fmadd_ps(e4m3x8_scaled(c + 24), _mm256_loadu_ps(a + 24), d);
        acc = _mm256_fmadd_ps(d, _mm256_set1_ps(sa[b] * sw[b]), acc);
    }
    return hsum8(acc);
}

static inline float fp4_row_dot_fast(const uint8_t *wp, const float *qa, const float *sa,
                                     const float *sw, int nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m128i e0, e1;
        e2m1x32_doubled(wp + b * 16, &e0, &e1);
        const float *a = qa + b * 32;
        __m256 d = _mm256_mul_ps(i8x8_to_ps(e0), _mm256_loadu_ps(a));
        d = _mm256_fmadd_ps(i8x8_to_ps(_mm_srli_si128(e0, 8)), _mm256_loadu_ps(a + 8), d);
        d = _mm256_fmadd_ps(i8x8_to_ps(e1), _mm256_loadu_ps(a + 16), d);
        d = _mm256_fmadd_ps(i8x8_to_ps(_mm_srli_si128(e1, 8)), _mm256_loadu_ps(a + 24), d);
        acc = _mm256_fmadd_ps(d, _mm256_set1_ps(sa[b] * sw[b]), acc);
    }
    return hsum8(acc);
}

static void qlin_fast_rows(void *arg, int n0, int n1) {
    const qlin_job *j = arg;
    int in = j->in, nb = (in + 31) / 32;
    float *sw = malloc((size_t)nb * sizeof(float));
    if (!sw) return;
    if (in % 32) {
        /* generic scalar FP32 path for odd widths (never met by the released shapes) */
        float *wrow = malloc((size_t)in * sizeof(float));
        for (int n = n0; n < n1 && wrow; n++) {
            decode_row(j, n, wrow);
            for (int t = 0; t < j->T; t++) {
                const float *qa = j->qa + (size_t)t * in, *sa = j->sa + (size_t)t * nb;
                float acc = 0.0f;
                for (int b = 0; b < nb; b++) {
                    int k0 = b * 32, len = in - k0 < 32 ? in - k0 : 32;
                    float d = 0.0f;
                    for (int k = 0; k < len; k++) d += qa[k0 + k] * wrow[k0 + k];
                    acc += d * sa[b] * wscale(j, n, b, nb);
                }
                j->y[(size_t)t * j->out + n] = ds41_bf16_round(acc);
            }
        }
        free(wrow);
        free(sw);
        return;
    }
    /* folded constant: 2^8 for the FP16-widened E4M3 codes, 1/2 for the doubled E2M1 codes */
    float fold = j->fp4 ? 0.5f : 256.0f;
    /* Several rows: widen each weight row once into floats and reuse it for every row of x. */
    float *wrow = j->T >= 4 ? malloc((size_t)in * sizeof(float)) : NULL;
    for (int n = n0; n < n1; n++) {
        for (int b = 0; b < nb; b++) sw[b] = wscale(j, n, b, nb) * fold;
        if (wrow) {
            for (int b = 0; b < nb; b++) {
                float *o = wrow + 32 * b;
                if (j->fp4) {
                    __m128i e0, e1;
                    e2m1x32_doubled(j->w + (size_t)n * (in / 2) + 16 * b, &e0, &e1);
                    _mm256_storeu_ps(o, i8x8_to_ps(e0));
                    _mm256_storeu_ps(o + 8, i8x8_to_ps(_mm_srli_si128(e0, 8)));
                    _mm256_storeu_ps(o + 16, i8x8_to_ps(e1));
                    _mm256_storeu_ps(o + 24, i8x8_to_ps(_mm_srli_si128(e1, 8)));
                } else {
                    const uint8_t *c = j->w + (size_t)n * in + 32 * b;
                    for (int q = 0; q < 4; q++) _mm256_storeu_ps(o + 8 * q, e4m3x8_scaled(c + 8 * q));
                }
            }
            for (int t = 0; t < j->T; t++) {
                const float *qa = j->qa + (size_t)t * in, *sa = j->sa + (size_t)t * nb;
                __m256 acc = _mm256_setzero_ps();
                for (int b = 0; b < nb; b++) {
                    const float *a = qa + 32 * b, *w = wrow + 32 * b;
                    __m256 d = _mm256_mul_ps(_mm256_loadu_ps(w), _mm256_loadu_ps(a));
                    d = _mm256_fmadd_ps(_mm256_loadu_ps(w + 8), _mm256_loadu_ps(a + 8), d);
                    d = _mm256_fmadd_ps(_mm256_loadu_ps(w + 16), _mm256_loadu_ps(a + 16), d);
                    d = _mm256_fmadd_ps(_mm256_loadu_ps(w + 24), _mm256_loadu_ps(a + 24), d);
                    acc = _mm256_fmadd_ps(d, _mm256_set1_ps(sa[b] * sw[b]), acc);
                }
                j->y[(size_t)t * j->out + n] = ds41_bf16_round(hsum8(acc));
            }
            continue;
        }
        for (int t = 0; t < j->T; t++) {
            const float *qa = j->qa + (size_t)t * in, *sa = j->sa + (size_t)t * nb;
            float v = j->fp4 ? fp4_row_dot_fast(j->w + (size_t)n * (in / 2), qa, sa, sw, nb)
                             : fp8_row_dot_fast(j->w + (size_t)n * in, qa, sa, sw, nb);
            j->y[(size_t)t * j->out + n] = ds41_bf16_round(v);
        }
    }
    free(wrow);
    free(sw);
}

/* Rows of T processed per activation-quantization tile (bounds the scratch). */
#define T_TILE 64

static void qlin_run(const ds41_ctx *ctx, const uint8_t *w, const uint8_t *s, int fp4, int out, int in,
                     const float *x, int T, float *y) {
    luts();
    if (T <= 0 || out <= 0) return;
    if (in <= 0) { for (size_t i = 0; i < (size_t)T * out; i++) y[i] = 0.0f; return; }
    if (!ctx->exact && in % 32 == 0) {   /* the AVX2 kernels of linear_fast.c */
        ds41_fast_qlin(ctx, w, s, fp4, out, in, x, T, y);
        return;
    }
    /* the same sums, vectorised (linear_exact.c: panels over tokens, and a single row decoded
     * straight into double lanes) */
    if (ctx->exact && ds41_exact_simd && in % 32 == 0) {
        ds41_exact_qlin(ctx, w, s, fp4, out, in, x, T, y);
        return;
    }
    int nb = (in + 31) / 32;
    int tt = T < T_TILE ? T : T_TILE;
    float *qa = malloc((size_t)tt * in * sizeof(float));
    float *sa = malloc((size_t)tt * nb * sizeof(float));
    if (!qa || !sa) { free(qa); free(sa); return; }
    for (int t0 = 0; t0 < T; t0 += tt) {
        int nt = T - t0 < tt ? T - t0 : tt;
        quantize_rows(x + (size_t)t0 * in, in, nt, in, qa, sa);
        qlin_job j = { ctx, w, s, fp4, out, in, nt, qa, sa, y + (size_t)t0 * out };
        void (*fn)(void *, int, int) = ctx->exact ? qlin_exact_rows : qlin_fast_rows;
        if ((long long)out * in * nt >= PAR_MIN_WORK) ds41_parallel_for(ctx, out, fn, &j);
        else fn(&j, 0, out);
    }
    free(qa);
    free(sa);
}

/* Bytes of weights a call reads (the decode-step breakdown, kernels.h): codes and scales, once
 * per call whatever T. */
static double fp8_bytes(int rows, int in) {
    return (double)rows * in + (double)((rows + 31) / 32) * ((in + 31) / 32);
}

void ds41_linear_fp8(const ds41_ctx *ctx, const ds41_fp8w *w, const float *x, int T, float *y) {
    if (ctx->bd) ds41_bd_enter(ctx, DS41_BD_FP8, fp8_bytes(w->out, w->in));
    qlin_run(ctx, w->w, w->s, 0, w->out, w->in, x, T, y);
    if (ctx->bd) ds41_bd_leave(ctx);
}

void ds41_linear_fp4(const ds41_ctx *ctx, const ds41_fp4w *w, const float *x, int T, float *y) {
    if (ctx->bd) ds41_bd_enter(ctx, DS41_BD_FP4, (double)w->out * (w->in / 2) + (double)w->out * ((w->in + 31) / 32));
    qlin_run(ctx, w->w, w->s, 1, w->out, w->in, x, T, y);
    if (ctx->bd) ds41_bd_leave(ctx);
}

/* ---------------------------------------------------------------- BF16 / FP32 / FP8-dq job */

typedef struct dlin_job {
    const ds41_ctx *ctx;
    int kind;               /* 0 bf16, 1 f32, 2 fp8 dequantized */
    const uint16_t *wb;
    const float *wf;
    const ds41_fp8w *w8;
    int row0;
    int out, in, T;
    const float *x;
    int x_stride;
    float *y;
    int y_stride;
    int out_bf16;
} dlin_job;

static inline float dot_fast_f32(const float *a, const float *w, int n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int k = 0;
    for (; k + 16 <= n; k += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(w + k), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(w + k + 8), acc1);
    }
    for (; k + 8 <= n; k += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(w + k), acc0);
    float s = hsum8(_mm256_add_ps(acc0, acc1));
    for (; k < n; k++) s += a[k] * w[k];
    return s;
}

/* Decodes row r of an FP8 matrix to its exact BF16 values (the reference converter's BF16
 * copy of wo_a: bf16(e4m3 * 2^(tile - 127)), exact for the checkpoint's scales). */
static void dq_row(const ds41_fp8w *w, int r, float *wrow) {
    int nbk = (w->in + 31) / 32;
    const uint8_t *c = w->w + (size_t)r * w->in;
    const uint8_t *s = w->s + (size_t)(r / 32) * nbk;
    for (int k = 0; k < w->in; k++) wrow[k] = ds41_bf16_round(e4m3_lut[c[k]] * ds41_ue8m0_to_f32(s[k / 32]));
}

static void dlin_rows(void *arg, int n0, int n1) {
    const dlin_job *j = arg;
    int in = j->in;
    float *wrow = NULL;
    if (j->kind != 1) {
        wrow = malloc((size_t)(in > 0 ? in : 1) * sizeof(float));
        if (!wrow) return;
    }
    for (int n = n0; n < n1; n++) {
        const float *wr;
        if (j->kind == 0) {   /* exact only: fast BF16 always goes to linear_fast.c */
            const uint16_t *wbr = j->wb + (size_t)n * in;
            for (int k = 0; k < in; k++) wrow[k] = ds41_bf16_to_f32(wbr[k]);
            wr = wrow;
        } else if (j->kind == 1) {
            wr = j->wf + (size_t)n * in;
        } else {
            dq_row(j->w8, j->row0 + n, wrow);
            wr = wrow;
        }
        for (int t = 0; t < j->T; t++) {
            const float *x = j->x + (size_t)t * j->x_stride;
            float v;
            if (j->ctx->exact) {
                double s = 0.0;
                for (int k = 0; k < in; k++) s += (double)x[k] * (double)wr[k];
                v = (float)s;
            } else {
                v = dot_fast_f32(x, wr, in);
            }
            j->y[(size_t)t * j->y_stride + n] = j->out_bf16 ? ds41_bf16_round(v) : v;
        }
    }
    free(wrow);
}

static void dlin_run(dlin_job *j) {
    luts();
    if (j->T <= 0 || j->out <= 0) return;
    if (!j->ctx->exact && j->kind == 0 && ds41_fast_ops_get() != ds41_fast_ops_avx2() &&
        __atomic_load_n(&ds41_fast_bf16_on, __ATOMIC_RELAXED)) {   /* vdpbf16ps: linear_avx512bf16.c */
        ds41_fast_bf16_avx512()->dense(j->ctx, j->wb, j->out, j->in, j->x, j->x_stride, j->T, j->y, j->y_stride,
                                       j->out_bf16);
        return;
    }
    if (!j->ctx->exact && (j->kind != 2 || j->in % 32 == 0)) {   /* linear_fast.c */
        ds41_fast_dense(j->ctx, j->kind, j->wb, j->wf, j->w8, j->row0, j->out, j->in, j->x, j->x_stride, j->T,
                        j->y, j->y_stride, j->out_bf16);
        return;
    }
    if (j->ctx->exact && ds41_exact_simd && (j->kind != 2 || j->in % 8 == 0)) {   /* linear_exact.c */
        ds41_exact_dense(j->ctx, j->kind, j->wb, j->wf, j->w8, j->row0, j->out, j->in, j->x, j->x_stride, j->T,
                         j->y, j->y_stride, j->out_bf16);
        return;
    }
    if ((long long)j->out * j->in * j->T >= PAR_MIN_WORK) ds41_parallel_for(j->ctx, j->out, dlin_rows, j);
    else dlin_rows(j, 0, j->out);
}

void ds41_linear_bf16(const ds41_ctx *ctx, const ds41_bf16w *w, const float *x, int T, float *y, int out_bf16) {
    dlin_job j = { ctx, 0, w->w, NULL, NULL, 0, w->out, w->in, T, x, w->in, y, w->out, out_bf16 };
    if (ctx->bd)   /* the head's stream when the head section calls it */
        ds41_bd_enter(ctx, ds41_bd_current(ctx) == DS41_BD_HEAD ? DS41_BD_HEADW : DS41_BD_BF16, 2.0 * w->out * w->in);
    dlin_run(&j);
    if (ctx->bd) ds41_bd_leave(ctx);
}

void ds41_kernels_bf16_road(long long n[5]) {
    n[0] = __atomic_load_n(&ds41_fast_bf16_dtiles, __ATOMIC_RELAXED);
    n[1] = __atomic_load_n(&ds41_fast_bf16_dfall_x, __ATOMIC_RELAXED);
    n[2] = __atomic_load_n(&ds41_fast_bf16_dfall_w, __ATOMIC_RELAXED);
    n[3] = __atomic_load_n(&ds41_fast_fp8_bf16_tiles, __ATOMIC_RELAXED);
    n[4] = __atomic_load_n(&ds41_fast_fp8_bf16_refused, __ATOMIC_RELAXED);
}

void ds41_linear_f32(const ds41_ctx *ctx, const float *w, int out, int in, const float *x, int T, float *y) {
    dlin_job j = { ctx, 1, NULL, w, NULL, 0, out, in, T, x, in, y, out, 0 };
    if (ctx->bd) ds41_bd_enter(ctx, DS41_BD_F32, 4.0 * out * in);
    dlin_run(&j);
    if (ctx->bd) ds41_bd_leave(ctx);
}

void ds41_linear_fp8_dq(const ds41_ctx *ctx, const ds41_fp8w *w, int row0, int nrows,
                        const float *x, int x_stride, int T, float *y, int y_stride) {
    if (row0 < 0 || nrows <= 0 || row0 > w->out - nrows) return;
    dlin_job j = { ctx, 2, NULL, NULL, w, row0, nrows, w->in, T, x, x_stride, y, y_stride, 1 };
    if (ctx->bd) ds41_bd_enter(ctx, DS41_BD_FP8DQ, fp8_bytes(nrows, w->in));
    dlin_run(&j);
    if (ctx->bd) ds41_bd_leave(ctx);
}
