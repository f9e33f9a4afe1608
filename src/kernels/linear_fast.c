/* ds41 fast linears: AVX2 + FMA kernels over the packed weights (ds41_ctx.exact == 0).
 *
 * Canonical order. Every output y[t][n] is computed by one fixed sequence of FP32 operations
 * that depends only on weight row n and activation row t: never on T, on the token or row
 * tile the output falls in, or on the thread count. Decode (T = 1, weights streamed once)
 * and prefill (T > 1, weights decoded once into an L1 panel and reused over tokens) are two
 * implementations of the same sequence, so a token gets the same bits whether it is computed
 * in a prefill batch or alone, and ced / full / chunked prefill stay consistent in fast mode.
 *   Accumulation: one 8-lane FP32 accumulator per output; the K axis is consumed in 8-wide
 *   chunks in a fixed order, each chunk added with one FMA; then the 8 lanes are summed
 *   in the fixed pattern of hsum8; odd tails (BF16 / FP32 only) are added after, in order.
 *   Every product entering an FMA is exact or fused, so the implementations only have to
 *   agree on which exact product goes to which lane in which order.
 *
 * Weight decoding without lookups or conversions:
 *   E4M3 code c, sign-extended to 32 bits, shifted left by 20 and masked with 0x87FFFFFF is
 *   the FP32 pattern sign | c[6:0] << 20, whose value is exactly e4m3(c) * 2^-120 (normals
 *   and subnormals alike: E4M3 subnormals become FP32 subnormals). E2M1 nibbles likewise:
 *   sign | n[2:0] << 22 is e2m1(n) * 2^-126. The 2^-120 / 2^-126 are folded into the
 *   activations (x 2^100) and the scales, so that no FP32 value anywhere overflows or leaves
 *   the normal range for realistic scales (|activation * tile scale| < 2^28). Subnormal
 *   weight patterns only ever enter FMAs: on the AMD cores this was tuned on, a multiply
 *   with a subnormal input takes a slow path but an FMA does not (measured: 2.6x).
 *   BF16: the even elements of a 32-bit pair are v << 16, the odd ones v & 0xFFFF0000; the
 *   activations are permuted once per call to match (even 8, then odd 8, per 16).
 *
 * FP8 (and the dequantized FP8 of wo_a): products w * 2^-120 * (a * s_tile * 2^100) in
 *   natural K order; y = bf16(hsum * 2^20). Prefill decodes the panel as w * s_tile * 2^-20
 *   (an FMA of the pattern with s_tile * 2^100) and multiplies it with a: the same products.
 * FP4: per 32-block, d = four chained FMAs of (w * 2^-126) * (a * 2^100) in the nibble order
 *   (even elements of bytes 0-7, odd of 0-7, even of 8-15, odd of 8-15), then
 *   acc = fma(d, s_row * 2^26, acc); y = bf16(hsum). The block-wise scale costs one FMA per
 *   32 weights instead of a multiply per weight.
 * Activations of FP8 / FP4 linears: the model's Q8 (ds41_q8_group) recomputed with SIMD,
 *   bit-identical (tested): x / s for a power-of-two s is x * (1/s) exactly, and the E4M3
 *   round-to-nearest-even is the same integer trick for normals, a rounding to a multiple of
 *   2^-9 for subnormals, saturated at 448.
 *
 * Threads: work items are 32-row tiles (FP8 tiles are aligned to the weight's 32-row scale
 * tiles), split statically; results do not depend on the split. */
#include "linear_fast.h"
#include "formats.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define ITEM 32          /* rows per work item */
#define TT 64            /* tokens per activation tile */
#define KC 256           /* K elements per prefill panel (32 rows x 1 KiB of floats: L1) */
#define PFD 1024         /* prefetch distance per row stream, bytes (measured best of 1-4 KiB) */
#define PAR_MIN_WORK 65536LL

#define UNROLL _Pragma("GCC unroll 8")

/* 2^k as a float (|k| < 127) */
static inline float p2(int k) { return ds41_bits_f32((uint32_t)(127 + k) << 23); }

static float ue8_lut100[256];   /* ue8m0(e) * 2^100 (FP8 tile scale as used at T = 1) */
static float ue8_lut26[256];    /* ue8m0(e) * 2^26 (FP4 row-block scale) */
static pthread_once_t luts_once = PTHREAD_ONCE_INIT;

static void luts_fill(void) {
    for (int e = 0; e < 256; e++) {
        float s = ds41_ue8m0_to_f32((uint8_t)e);
        ue8_lut100[e] = s * p2(100);
        ue8_lut26[e] = s * p2(26);
    }
}

/* sessions on different threads may make the first call at the same time */
static void luts_init(void) { pthread_once(&luts_once, luts_fill); }

static void *amalloc(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64) != 0) return NULL;
    return p;
}

static inline float hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    __m128 s = _mm_add_ps(lo, hi);
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* ---------------------------------------------------------------- decoders */

/* 8 E4M3 codes -> e4m3 * 2^-120 */
static inline __m256 e4m3x8_raw(const uint8_t *p) {
    __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v, 20), _mm256_set1_epi32((int)0x87FFFFFF)));
}

/* 16 bytes of E2M1 pairs (one 32-block) -> 4 vectors of e2m1 * 2^-126 in nibble order:
 * f[0] = even elements of bytes 0-7 (k = 0, 2, .., 14), f[1] = odd (1, 3, .., 15),
 * f[2] = even of bytes 8-15 (16, .., 30), f[3] = odd (17, .., 31). Each byte is moved to the
 * top of a 32-bit lane (pshufb of the block broadcast to both halves); the high nibble is
 * then bits 31-28, the low one (after << 4) too; >> 6 arithmetic and the mask keep the sign
 * and put the 3 magnitude bits at 24-22. */
static inline void e2m1x32_raw(const uint8_t *p, __m256 *f) {
    const __m256i c0 = _mm256_setr_epi8(-1, -1, -1, 0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3,
                                        -1, -1, -1, 4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7);
    const __m256i c1 = _mm256_setr_epi8(-1, -1, -1, 8, -1, -1, -1, 9, -1, -1, -1, 10, -1, -1, -1, 11,
                                        -1, -1, -1, 12, -1, -1, -1, 13, -1, -1, -1, 14, -1, -1, -1, 15);
    const __m256i m = _mm256_set1_epi32((int)0x81C00000);
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    __m256i t0 = _mm256_shuffle_epi8(v, c0), t1 = _mm256_shuffle_epi8(v, c1);
    f[0] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(_mm256_slli_epi32(t0, 4), 6), m));
    f[1] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(t0, 6), m));
    f[2] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(_mm256_slli_epi32(t1, 4), 6), m));
    f[3] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(t1, 6), m));
}

/* ---------------------------------------------------------------- activations */

void ds41_fast_q8_row(const float *x, int in, float mult, float *a) {
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256 sgnm = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000));
    const __m256 lim_n = _mm256_set1_ps(0.015625f);   /* 2^-6: E4M3 normal range */
    const __m256 c512 = _mm256_set1_ps(512.0f), r512 = _mm256_set1_ps(1.0f / 512.0f);
    const __m256 c448 = _mm256_set1_ps(448.0f);
    const __m256i half = _mm256_set1_epi32(0x7FFFF), one = _mm256_set1_epi32(1);
    const __m256i keep = _mm256_set1_epi32((int)0xFFF00000);
    const float inv448 = ds41_bits_f32(DS41_INV448_BITS);
    for (int k0 = 0; k0 < in; k0 += 32) {
        __m256 v[4], mx = _mm256_setzero_ps();
        for (int q = 0; q < 4; q++) {
            v[q] = _mm256_loadu_ps(x + k0 + 8 * q);
            mx = _mm256_max_ps(mx, _mm256_and_ps(v[q], absm));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        float amax = _mm_cvtss_f32(m4);
        if (amax < 1e-4f) amax = 1e-4f;
        float s = ds41_pow2ceil(amax, inv448);
        __m256 inv = _mm256_set1_ps(1.0f / s), sm = _mm256_set1_ps(s * mult);
        for (int q = 0; q < 4; q++) {
            __m256 y = _mm256_mul_ps(v[q], inv);
            __m256 sg = _mm256_and_ps(y, sgnm), ay = _mm256_and_ps(y, absm);
            __m256i u = _mm256_castps_si256(ay);
            __m256i rn = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(u, half),
                                                           _mm256_and_si256(_mm256_srli_epi32(u, 20), one)), keep);
            __m256 rs = _mm256_mul_ps(_mm256_round_ps(_mm256_mul_ps(ay, c512), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), r512);
            __m256 r = _mm256_blendv_ps(_mm256_castsi256_ps(rn), rs, _mm256_cmp_ps(ay, lim_n, _CMP_LT_OQ));
            r = _mm256_min_ps(r, c448);
            _mm256_storeu_ps(a + k0 + 8 * q, _mm256_mul_ps(_mm256_or_ps(r, sg), sm));
        }
    }
}

/* FP4 activation order within each 32-block: k = 0,2,..,14 | 1,3,..,15 | 16,..,30 | 17,..,31 */
static void perm_fp4_row(float *a, int in) {
    const __m256i idx = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    for (int k0 = 0; k0 < in; k0 += 16) {
        __m256 v0 = _mm256_permutevar8x32_ps(_mm256_loadu_ps(a + k0), idx);       /* e0 e2 e4 e6 o1 o3 o5 o7 */
        __m256 v1 = _mm256_permutevar8x32_ps(_mm256_loadu_ps(a + k0 + 8), idx);   /* e8 .. e14 o9 .. o15 */
        _mm256_storeu_ps(a + k0, _mm256_permute2f128_ps(v0, v1, 0x20));
        _mm256_storeu_ps(a + k0 + 8, _mm256_permute2f128_ps(v0, v1, 0x31));
    }
}

/* BF16 activation order within each 16: k = 0,2,..,14 | 1,3,..,15 (the tail keeps its order) */
static void perm_bf16_row(const float *x, int in, float *a) {
    const __m256i idx = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    int k0 = 0;
    for (; k0 + 16 <= in; k0 += 16) {
        __m256 v0 = _mm256_permutevar8x32_ps(_mm256_loadu_ps(x + k0), idx);
        __m256 v1 = _mm256_permutevar8x32_ps(_mm256_loadu_ps(x + k0 + 8), idx);
        _mm256_storeu_ps(a + k0, _mm256_permute2f128_ps(v0, v1, 0x20));
        _mm256_storeu_ps(a + k0 + 8, _mm256_permute2f128_ps(v0, v1, 0x31));
    }
    for (; k0 < in; k0++) a[k0] = x[k0];
}

/* ---------------------------------------------------------------- prefill micro-kernels */

/* Elementwise: acc[r][t] += P[r][k] * A[t][k] over n8 chunks of 8 (the accumulators live in
 * accb[r * ldc + t] between K panels, so the chain per output continues unchanged). */
#define MK_EW(R, C)                                                                                   \
    static void mk_ew_##R##_##C(const float *P, int ldp, const float *A, size_t lda, int n8,        \
                                __m256 *accb, int ldc) {                                          \
        __m256 c[R][C];                                                                           \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++) c[r][t] = accb[r * ldc + t]; \
        for (int k = 0; k < n8; k++) {                                                            \
            __m256 a[C];                                                                          \
            UNROLL for (int t = 0; t < C; t++) a[t] = _mm256_loadu_ps(A + t * lda + 8 * k);      \
            UNROLL for (int r = 0; r < R; r++) {                                                  \
                __m256 w = _mm256_load_ps(P + r * ldp + 8 * k);                                  \
                UNROLL for (int t = 0; t < C; t++) c[r][t] = _mm256_fmadd_ps(w, a[t], c[r][t]);   \
            }                                                                                     \
        }                                                                                         \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++) accb[r * ldc + t] = c[r][t]; \
    }
MK_EW(1, 1) MK_EW(1, 2) MK_EW(1, 3) MK_EW(2, 1) MK_EW(2, 2) MK_EW(2, 3)
MK_EW(3, 1) MK_EW(3, 2) MK_EW(3, 3) MK_EW(4, 1) MK_EW(4, 2) MK_EW(4, 3)
typedef void (*mk_ew_fn)(const float *, int, const float *, size_t, int, __m256 *, int);
static const mk_ew_fn mk_ew[4][3] = {
    { mk_ew_1_1, mk_ew_1_2, mk_ew_1_3 }, { mk_ew_2_1, mk_ew_2_2, mk_ew_2_3 },
    { mk_ew_3_1, mk_ew_3_2, mk_ew_3_3 }, { mk_ew_4_1, mk_ew_4_2, mk_ew_4_3 } };

/* FP4 block form: per 32-block d = 4 chained FMAs (the first onto +0), acc = fma(d, S[r][b]). */
#define MK_BK(R, C)                                                                                   \
    static void mk_bk_##R##_##C(const float *P, int ldp, const float *A, size_t lda, int nb,        \
                                const float *S, int lds, __m256 *accb, int ldc) {                 \
        __m256 c[R][C];                                                                           \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++) c[r][t] = accb[r * ldc + t]; \
        for (int b = 0; b < nb; b++) {                                                            \
            __m256 d[R][C];                                                                       \
            UNROLL for (int q = 0; q < 4; q++) {                                                  \
                __m256 a[C];                                                                      \
                UNROLL for (int t = 0; t < C; t++) a[t] = _mm256_loadu_ps(A + t * lda + 32 * b + 8 * q); \
                UNROLL for (int r = 0; r < R; r++) {                                              \
                    __m256 w = _mm256_load_ps(P + r * ldp + 32 * b + 8 * q);                     \
                    UNROLL for (int t = 0; t < C; t++)                                            \
                        d[r][t] = _mm256_fmadd_ps(w, a[t], q ? d[r][t] : _mm256_setzero_ps());    \
                }                                                                                 \
            }                                                                                     \
            UNROLL for (int r = 0; r < R; r++) {                                                  \
                __m256 s = _mm256_broadcast_ss(S + r * lds + b);                                  \
                UNROLL for (int t = 0; t < C; t++) c[r][t] = _mm256_fmadd_ps(d[r][t], s, c[r][t]); \
            }                                                                                     \
        }                                                                                         \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++) accb[r * ldc + t] = c[r][t]; \
    }
MK_BK(1, 1) MK_BK(1, 2) MK_BK(1, 3) MK_BK(2, 1) MK_BK(2, 2) MK_BK(2, 3)
typedef void (*mk_bk_fn)(const float *, int, const float *, size_t, int, const float *, int, __m256 *, int);
static const mk_bk_fn mk_bk[2][3] = { { mk_bk_1_1, mk_bk_1_2, mk_bk_1_3 }, { mk_bk_2_1, mk_bk_2_2, mk_bk_2_3 } };

/* ---------------------------------------------------------------- decode (T = 1) kernels */

/* FP8: R rows at stride ld, nb blocks, a2 = activation * tile scale * 2^100 */
#define DOT8(R)                                                                                       \
    static void dot8_##R(const uint8_t *w, size_t ld, int nb, const float *a2, float *out) {         \
        __m256 acc[R];                                                                            \
        UNROLL for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                          \
        for (int b = 0; b < nb; b++) {                                                            \
            if (!(b & 1)) UNROLL for (int r = 0; r < R; r++) _mm_prefetch((const char *)(w + r * ld + 32 * b + PFD), _MM_HINT_T0); \
            UNROLL for (int r = 0; r < R; r++) {                                                  \
                const uint8_t *p = w + r * ld + 32 * b;                                           \
                UNROLL for (int q = 0; q < 4; q++)                                                \
                    acc[r] = _mm256_fmadd_ps(e4m3x8_raw(p + 8 * q), _mm256_loadu_ps(a2 + 32 * b + 8 * q), acc[r]); \
            }                                                                                     \
        }                                                                                         \
        UNROLL for (int r = 0; r < R; r++) out[r] = hsum8(acc[r]);                                \
    }
DOT8(8) DOT8(1)

/* FP4: R rows of packed pairs at stride ld bytes, their scale rows at stride lds bytes */
#define DOT4(R)                                                                                       \
    static void dot4_##R(const uint8_t *w, size_t ld, const uint8_t *s, size_t lds, int nb,          \
                         const float *a, float *out) {                                            \
        __m256 acc[R];                                                                            \
        UNROLL for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                          \
        for (int b = 0; b < nb; b++) {                                                            \
            if (!(b & 3)) UNROLL for (int r = 0; r < R; r++) _mm_prefetch((const char *)(w + r * ld + 16 * b + PFD), _MM_HINT_T0); \
            __m256 a0 = _mm256_loadu_ps(a + 32 * b), a1 = _mm256_loadu_ps(a + 32 * b + 8);      \
            __m256 a2 = _mm256_loadu_ps(a + 32 * b + 16), a3 = _mm256_loadu_ps(a + 32 * b + 24); \
            UNROLL for (int r = 0; r < R; r++) {                                                  \
                __m256 f[4];                                                                      \
                e2m1x32_raw(w + r * ld + 16 * b, f);                                              \
                __m256 d = _mm256_fmadd_ps(f[0], a0, _mm256_setzero_ps());                        \
                d = _mm256_fmadd_ps(f[1], a1, d);                                                 \
                d = _mm256_fmadd_ps(f[2], a2, d);                                                 \
                d = _mm256_fmadd_ps(f[3], a3, d);                                                 \
                acc[r] = _mm256_fmadd_ps(d, _mm256_set1_ps(ue8_lut26[s[r * lds + b]]), acc[r]);   \
            }                                                                                     \
        }                                                                                         \
        UNROLL for (int r = 0; r < R; r++) out[r] = hsum8(acc[r]);                                \
    }
DOT4(4) DOT4(1)

/* BF16 (n16 groups of 16, activation permuted) and FP32 (n8 chunks of 8), R rows */
#define DOTB(R)                                                                                       \
    static void dotb_##R(const uint16_t *w, size_t ld, int n16, const float *a, float *out) {        \
        const __m256i hm = _mm256_set1_epi32((int)0xFFFF0000);                                    \
        __m256 acc[R];                                                                            \
        UNROLL for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                          \
        for (int g = 0; g < n16; g++) {                                                           \
            if (!(g & 1)) UNROLL for (int r = 0; r < R; r++) _mm_prefetch((const char *)(w + r * ld + 16 * g) + PFD, _MM_HINT_T0); \
            __m256 ae = _mm256_loadu_ps(a + 16 * g), ao = _mm256_loadu_ps(a + 16 * g + 8);       \
            UNROLL for (int r = 0; r < R; r++) {                                                  \
                __m256i v = _mm256_loadu_si256((const __m256i *)(w + r * ld + 16 * g));           \
                acc[r] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), ae, acc[r]); \
                acc[r] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v, hm)), ao, acc[r]); \
            }                                                                                     \
        }                                                                                         \
        UNROLL for (int r = 0; r < R; r++) out[r] = hsum8(acc[r]);                                \
    }
DOTB(4) DOTB(1)

#define DOTF(R)                                                                                       \
    static void dotf_##R(const float *w, size_t ld, int n8, const float *a, float *out) {            \
        __m256 acc[R];                                                                            \
        UNROLL for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                          \
        for (int g = 0; g < n8; g++) {                                                            \
            if (!(g & 1)) UNROLL for (int r = 0; r < R; r++) _mm_prefetch((const char *)(w + r * ld + 8 * g) + PFD, _MM_HINT_T0); \
            __m256 av = _mm256_loadu_ps(a + 8 * g);                                               \
            UNROLL for (int r = 0; r < R; r++)                                                    \
                acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w + r * ld + 8 * g), av, acc[r]);        \
        }                                                                                         \
        UNROLL for (int r = 0; r < R; r++) out[r] = hsum8(acc[r]);                                \
    }
DOTF(4) DOTF(1)

/* ---------------------------------------------------------------- jobs */

enum { J_FP8, J_FP4, J_DQ, J_BF16, J_F32 };

typedef struct fjob {
    int kind;
    const uint8_t *w, *s;      /* FP8 / FP4 / DQ codes and scales (full matrix) */
    const uint16_t *wb;
    const float *wf;
    int row0;                  /* absolute row of output 0 (DQ; 0 otherwise) */
    int out, in, T;
    int kv;                    /* K covered by the vector code (in, or in rounded down to 16 / 8) */
    const float *a;            /* prepared activations, T rows at stride lda */
    size_t lda;
    const float *x;            /* raw activations (tails of BF16 / FP32), stride x_stride */
    size_t x_stride;
    float *y;
    size_t y_stride;
    int out_bf16;
    int tile0;                 /* absolute 32-row tile of item 0 */
} fjob;

/* Rows [r0, r1) (relative to row0) of item it. */
static void item_rows(const fjob *j, int it, int *r0, int *r1) {
    int a0 = (j->tile0 + it) * ITEM - j->row0, a1 = a0 + ITEM;
    *r0 = a0 < 0 ? 0 : a0;
    *r1 = a1 > j->out ? j->out : a1;
}

static float finish(const fjob *j, float acc, int t, int n) {
    if (j->kind == J_FP8 || j->kind == J_DQ) return ds41_bf16_round(acc * p2(20));
    if (j->kind == J_FP4) return ds41_bf16_round(acc);
    /* BF16 / FP32 tails, in K order after the vector part */
    const float *x = j->x + (size_t)t * j->x_stride;
    size_t rowoff = (size_t)n * j->in;
    for (int k = j->kv; k < j->in; k++) {
        float w = j->kind == J_BF16 ? ds41_bf16_to_f32(j->wb[rowoff + k]) : j->wf[rowoff + k];
        acc += x[k] * w;
    }
    return j->out_bf16 ? ds41_bf16_round(acc) : acc;
}

/* T = 1: stream the item's rows once. a2 scratch: in floats. */
static void item_decode(const fjob *j, int r0, int r1, float *a2) {
    int in = j->in, nr = r1 - r0;
    float v[8];
    const float *a = j->a;
    switch (j->kind) {
    case J_FP8: case J_DQ: {
        int nb = in / 32, nbk = (in + 31) / 32, tile = (j->row0 + r0) / 32;
        const uint8_t *st = j->s + (size_t)tile * nbk;
        for (int b = 0; b < nb; b++) {
            __m256 sc = _mm256_set1_ps(ue8_lut100[st[b]]);
            for (int q = 0; q < 4; q++)
                _mm256_storeu_ps(a2 + 32 * b + 8 * q, _mm256_mul_ps(_mm256_loadu_ps(a + 32 * b + 8 * q), sc));
        }
        const uint8_t *w = j->w + (size_t)(j->row0 + r0) * in;
        int r = 0;
        for (; r + 8 <= nr; r += 8) {
            dot8_8(w + (size_t)r * in, (size_t)in, nb, a2, v);
            for (int i = 0; i < 8; i++) j->y[r0 + r + i] = finish(j, v[i], 0, r0 + r + i);
        }
        for (; r < nr; r++) {
            dot8_1(w + (size_t)r * in, (size_t)in, nb, a2, v);
            j->y[r0 + r] = finish(j, v[0], 0, r0 + r);
        }
        break;
    }
    case J_FP4: {
        int nb = in / 32;
        const uint8_t *w = j->w + (size_t)r0 * (in / 2), *s = j->s + (size_t)r0 * nb;
        int r = 0;
        for (; r + 4 <= nr; r += 4) {
            dot4_4(w + (size_t)r * (in / 2), (size_t)in / 2, s + (size_t)r * nb, (size_t)nb, nb, a, v);
            for (int i = 0; i < 4; i++) j->y[r0 + r + i] = finish(j, v[i], 0, r0 + r + i);
        }
        for (; r < nr; r++) {
            dot4_1(w + (size_t)r * (in / 2), (size_t)in / 2, s + (size_t)r * nb, (size_t)nb, nb, a, v);
            j->y[r0 + r] = finish(j, v[0], 0, r0 + r);
        }
        break;
    }
    case J_BF16: {
        const uint16_t *w = j->wb + (size_t)r0 * in;
        int r = 0, n16 = j->kv / 16;
        for (; r + 4 <= nr; r += 4) {
            dotb_4(w + (size_t)r * in, (size_t)in, n16, a, v);
            for (int i = 0; i < 4; i++) j->y[r0 + r + i] = finish(j, v[i], 0, r0 + r + i);
        }
        for (; r < nr; r++) {
            dotb_1(w + (size_t)r * in, (size_t)in, n16, a, v);
            j->y[r0 + r] = finish(j, v[0], 0, r0 + r);
        }
        break;
    }
    case J_F32: {
        const float *w = j->wf + (size_t)r0 * in;
        int r = 0, n8 = j->kv / 8;
        for (; r + 4 <= nr; r += 4) {
            dotf_4(w + (size_t)r * in, (size_t)in, n8, a, v);
            for (int i = 0; i < 4; i++) j->y[r0 + r + i] = finish(j, v[i], 0, r0 + r + i);
        }
        for (; r < nr; r++) {
            dotf_1(w + (size_t)r * in, (size_t)in, n8, a, v);
            j->y[r0 + r] = finish(j, v[0], 0, r0 + r);
        }
        break;
    }
    }
}

/* Decodes rows [r0, r1) x K [k0, k0 + kc) into the panel P[r][k] (ld KC). FP4 panel rows
 * also get their scales S[r][b] (ld KC / 32). */
static void decode_panel(const fjob *j, int r0, int r1, int k0, int kc, float *P, float *S) {
    int in = j->in;
    for (int r = r0; r < r1; r++) {
        float *pr = P + (size_t)(r - r0) * KC;
        switch (j->kind) {
        case J_FP8: case J_DQ: {
            int nbk = (in + 31) / 32, ar = j->row0 + r;
            const uint8_t *c = j->w + (size_t)ar * in + k0, *st = j->s + (size_t)(ar / 32) * nbk + k0 / 32;
            for (int b = 0; b < kc / 32; b++) {
                __m256 sc = _mm256_set1_ps(ue8_lut100[st[b]]);
                for (int q = 0; q < 4; q++)
                    _mm256_store_ps(pr + 32 * b + 8 * q, _mm256_fmadd_ps(e4m3x8_raw(c + 32 * b + 8 * q), sc, _mm256_setzero_ps()));
            }
            break;
        }
        case J_FP4: {
            const uint8_t *c = j->w + (size_t)r * (in / 2) + k0 / 2, *st = j->s + (size_t)r * (in / 32) + k0 / 32;
            float *sr = S + (size_t)(r - r0) * (KC / 32);
            for (int b = 0; b < kc / 32; b++) {
                __m256 f[4];
                e2m1x32_raw(c + 16 * b, f);
                for (int q = 0; q < 4; q++) _mm256_store_ps(pr + 32 * b + 8 * q, f[q]);
                sr[b] = ue8_lut26[st[b]];
            }
            break;
        }
        case J_BF16: {
            const uint16_t *w = j->wb + (size_t)r * in + k0;
            const __m256i hm = _mm256_set1_epi32((int)0xFFFF0000);
            for (int g = 0; g < kc / 16; g++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(w + 16 * g));
                _mm256_store_ps(pr + 16 * g, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
                _mm256_store_ps(pr + 16 * g + 8, _mm256_castsi256_ps(_mm256_and_si256(v, hm)));
            }
            break;
        }
        case J_F32:
            memcpy(pr, j->wf + (size_t)r * in + k0, (size_t)kc * sizeof(float));
            break;
        }
    }
}

/* T > 1: per K panel, decode the item's rows once, then run every token through it. */
static void item_prefill(const fjob *j, int r0, int r1, float *P, float *S, __m256 *accb) {
    int nr = r1 - r0, T = j->T;
    for (int i = 0; i < nr * T; i++) accb[i] = _mm256_setzero_ps();
    int step = j->kind == J_FP4 ? 2 : 4;
    for (int k0 = 0; k0 < j->kv; k0 += KC) {
        int kc = j->kv - k0 < KC ? j->kv - k0 : KC;
        decode_panel(j, r0, r1, k0, kc, P, S);
        for (int t0 = 0; t0 < T; t0 += 3) {
            int C = T - t0 < 3 ? T - t0 : 3;
            const float *A = j->a + (size_t)t0 * j->lda + k0;
            for (int rr = 0; rr < nr; rr += step) {
                int R = nr - rr < step ? nr - rr : step;
                if (j->kind == J_FP4)
                    mk_bk[R - 1][C - 1](P + (size_t)rr * KC, KC, A, j->lda, kc / 32, S + (size_t)rr * (KC / 32), KC / 32,
                                        accb + (size_t)rr * T + t0, T);
                else
                    mk_ew[R - 1][C - 1](P + (size_t)rr * KC, KC, A, j->lda, kc / 8, accb + (size_t)rr * T + t0, T);
            }
        }
    }
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < T; t++) j->y[(size_t)t * j->y_stride + r0 + r] = finish(j, hsum8(accb[(size_t)r * T + t]), t, r0 + r);
}

static void fjob_items(void *arg, int i0, int i1) {
    const fjob *j = arg;
    float *a2 = NULL, *P = NULL, *S = NULL;
    __m256 *accb = NULL;
    if (j->T == 1) {
        a2 = amalloc((size_t)j->in * sizeof(float));
        if (!a2) return;
    } else {
        P = amalloc((size_t)ITEM * KC * sizeof(float));
        S = amalloc((size_t)ITEM * (KC / 32) * sizeof(float));
        accb = amalloc((size_t)ITEM * j->T * sizeof(__m256));
        if (!P || !S || !accb) { free(P); free(S); free(accb); return; }
    }
    for (int it = i0; it < i1; it++) {
        int r0, r1;
        item_rows(j, it, &r0, &r1);
        if (r1 <= r0) continue;
        if (j->T == 1) item_decode(j, r0, r1, a2);
        else item_prefill(j, r0, r1, P, S, accb);
    }
    free(a2); free(P); free(S); free(accb);
}

static void fjob_run(const ds41_ctx *ctx, fjob *j) {
    int t_first = (j->row0) / ITEM, t_last = (j->row0 + j->out - 1) / ITEM;
    j->tile0 = t_first;
    int n_items = t_last - t_first + 1;
    if ((long long)j->out * j->in * j->T >= PAR_MIN_WORK) ds41_parallel_for(ctx, n_items, fjob_items, j);
    else fjob_items(j, 0, n_items);
}

/* ---------------------------------------------------------------- entry points */

void ds41_fast_qlin(const ds41_ctx *ctx, const uint8_t *w, const uint8_t *s, int fp4, int out, int in,
                    const float *x, int T, float *y) {
    luts_init();
    int tt = T < TT ? T : TT;
    float *a = amalloc((size_t)tt * in * sizeof(float));
    if (!a) return;
    for (int t0 = 0; t0 < T; t0 += tt) {
        int nt = T - t0 < tt ? T - t0 : tt;
        for (int t = 0; t < nt; t++) {
            float *ar = a + (size_t)t * in;
            ds41_fast_q8_row(x + (size_t)(t0 + t) * in, in, fp4 ? p2(100) : 1.0f, ar);
            if (fp4) perm_fp4_row(ar, in);
        }
        fjob j = { fp4 ? J_FP4 : J_FP8, w, s, NULL, NULL, 0, out, in, nt, in, a, (size_t)in,
                   NULL, 0, y + (size_t)t0 * out, (size_t)out, 1, 0 };
        fjob_run(ctx, &j);
    }
    free(a);
}

void ds41_fast_dense(const ds41_ctx *ctx, int kind, const uint16_t *wb, const float *wf, const ds41_fp8w *w8,
                     int row0, int out, int in, const float *x, int x_stride, int T, float *y, int y_stride,
                     int out_bf16) {
    luts_init();
    int jk = kind == 0 ? J_BF16 : kind == 1 ? J_F32 : J_DQ;
    int kv = jk == J_BF16 ? in & ~15 : jk == J_F32 ? in & ~7 : in;
    int tt = T < TT ? T : TT;
    float *a = NULL;
    if (jk == J_BF16) {
        a = amalloc((size_t)tt * in * sizeof(float));
        if (!a) return;
    }
    for (int t0 = 0; t0 < T; t0 += tt) {
        int nt = T - t0 < tt ? T - t0 : tt;
        const float *xt = x + (size_t)t0 * x_stride;
        const float *ap = xt;
        size_t lda = (size_t)x_stride;
        if (jk == J_BF16) {
            for (int t = 0; t < nt; t++) perm_bf16_row(xt + (size_t)t * x_stride, in, a + (size_t)t * in);
            ap = a;
            lda = (size_t)in;
        }
        fjob j = { jk, w8 ? w8->w : NULL, w8 ? w8->s : NULL, wb, wf, row0, out, in, nt, kv, ap, lda,
                   xt, (size_t)x_stride, y + (size_t)t0 * y_stride, (size_t)y_stride, out_bf16, 0 };
        fjob_run(ctx, &j);
    }
    free(a);
}
