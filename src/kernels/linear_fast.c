/* ds41 fast linears: SIMD kernels over the packed weights (ds41_ctx.exact == 0).
 *
 * Canonical order. Every output y[t][n] is computed by one fixed sequence of FP32 operations
 * that depends only on weight row n and activation row t: never on T, on the token or row
 * tile the output falls in, on the thread count, or on the ISA (AVX2 here, AVX-512 in
 * linear_avx512.c: the same sequence, bit for bit). Decode (T = 1, weights streamed once) and
 * prefill (T > 1, weights decoded once into an L1 panel and reused over tokens) are
 * implementations of the same sequence, so a token gets the same bits whether it is computed
 * in a prefill batch or alone, and ced / full / chunked prefill stay consistent in fast mode.
 * A third implementation serves the few-row widths T = 2 .. DS41_FEW_MAX (speculative verify
 * blocks): the decode kernels with one A / B pair per token, each weight row streamed from
 * memory and decoded once for all T tokens (AVX2: at most 6 tokens per pass, 4 for FP4, a
 * second pass over the row from L1 beyond; AVX-512: 8 in one pass), where the prefill panel
 * path would re-read the weights through 32-row panels without the decode's prefetch.
 * A fourth serves T = DS41_FEW_MAX + 1 .. DS41_MID_MAX (the server's 16-stream decode step,
 * short prefill chunks): per K block of an item, each weight row is decoded once in registers
 * and applied to many tokens, the activations of the block step-major in L1 (item_mid).
 * AVX-512 holds up to 16 tokens in zmm accumulators (A | B). AVX2 (FP8, FP4) has 16 ymm registers, so it
 * runs each output's A and B chains (independent until the final add) as two parity passes:
 * the even chunks of the block into A for up to 14 tokens (FP4: 10), then the odd chunks into
 * B, one ymm accumulator per token, each chunk decoded once per pass. The panel path decodes
 * into memory and reloads the decoded weights for every 3- or 6-token tile; at T = 16 that
 * traffic and the accumulator spills per tile held it to about half the FMA peak on AVX-512,
 * a third on AVX2. AVX2 FP4 linears take the mid path up to T = 64 (MID_MAX_FP4_AVX2); AVX2
 * BF16 keeps the panels (its decode is two uops per 16 weights, so there is little to save, and
 * a parity-pass BF16 kernel measured 0.85-0.95x the panels at T = 16 and 32).
 *   Two 8-lane FP32 accumulators A and B per output. The K axis is cut into 8-wide chunks
 *   (FP8, FP8-dq, FP32), 16-wide groups (BF16) or 32-wide blocks (FP4); chunk / group / block
 *   number c goes to A when c is even, to B when odd, each added with one FMA, in increasing
 *   c; then y = hsum8(A + B) (lane-wise add, then the fixed pattern of hsum8); odd tails
 *   (BF16 / FP32 only) are added after, in order. An AVX-512 register holds A in lanes 0-7
 *   and B in lanes 8-15, so it consumes two chunks per instruction in the same order.
 *   Neither accumulator is ever -0 (it starts at +0 and a sum that is exactly 0 rounds to +0),
 *   so padding with zero products (fma(0, 0, B) = B) is exact.
 *
 * Weight decoding never produces subnormal FP32 operands (Intel cores take a microcode
 * assist, ~100 cycles, on an FMA with a subnormal input):
 *   E4M3 code c, sign-extended to 16 bits, shifted left by 7 and masked with 0xBFFF is the
 *   FP16 pattern of e4m3(c) * 2^-8 (normals and subnormals alike); F16C converts it to FP32
 *   (a normal number) in hardware. On AMD CPUs, which take FP32 subnormal operands at full
 *   speed, the T = 1 .. 8 kernels (AVX2 and AVX-512) decode by byte shuffles instead (e4m3x16_s:
 *   e4m3 * 2^-120, against activations times 2^120: the same exact products, the same bits). On
 *   an Intel Xeon (Sapphire Rapids class) the AVX-512 shuffle decode measured the same speed as
 *   F16C: the T = 1 kernels there are bound by the memory, not by the decode.
 *   E2M1: a 16-byte shuffle table maps each nibble to 2 * e2m1 (an int8 in -12..12); FP4
 *   linears multiply in integers (below).
 *   BF16: the even elements of a 32-bit pair are v << 16, the odd ones v & 0xFFFF0000; the
 *   activations are permuted once per call to match (per 32: even elements of the first 16,
 *   even of the second 16, odd of the first, odd of the second).
 *
 * FP8 (and the dequantized FP8 of wo_a): products (e4m3 * 2^-8) * (a * s_tile * 2^8) in natural
 *   K order, y = bf16(hsum). Prefill decodes the panel as e4m3 * s_tile (the FP16 value times
 *   s_tile * 2^8) and multiplies it with a: the same exact products inside the same FMAs.
 * FP4: the Q8 activations of a block (E4M3 values v times the power-of-two group scale s) are
 *   written as int16 q = round(v * s / u) with u = 2^(floor(log2 max|v s|) - 14): exact for
 *   every element within 2^-11 of the block's largest (E4M3 has 4 significant bits), the
 *   smaller ones rounded to u (relative error < 2^-15 of the block's largest). Lane l of
 *   block b is the exact integer sum of q * (2 e2m1) over k = 32 b + 4 l .. + 3 (vpmaddwd
 *   pairs); then x = fp32(lane) * s_w (the row-block UE8M0 scale, exact) and
 *   acc = fma(x, u / 2, acc); y = bf16(hsum). The int16 activations are stored per 64
 *   elements (two blocks) as the 32 even elements then the 32 odd ones, matching the nibble
 *   order of the packed bytes.
 * Activations of FP8 / FP4 linears: the model's Q8 (ds41_q8_group) recomputed with SIMD,
 *   bit-identical (tested): x / s for a power-of-two s is x * (1/s) exactly, and the E4M3
 *   round-to-nearest-even is the same integer trick for normals, a rounding to a multiple of
 *   2^-9 for subnormals, saturated at 448.
 *
 * Threads: work items are 32-row tiles (FP8 tiles are aligned to the weight's 32-row scale
 * tiles), split statically; results do not depend on the split. */
#include "linear_fast.h"
#include "formats.h"
#include "hsum.h"

#include <float.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define ITEM 32          /* rows per work item */
#define TT 64            /* tokens per activation tile */
#define KC DS41_KC_AVX2  /* K elements per AVX2 prefill panel (the row stride of its micro-kernels) */
#define PFD 1024         /* prefetch distance per row stream, bytes */
#define PAR_MIN_WORK 65536LL

#define UNROLL _Pragma("GCC unroll 8")

/* 2^k as a float (|k| < 127) */
static inline float p2(int k) { return ds41_bits_f32((uint32_t)(127 + k) << 23); }

static float ue8_lut8[256];    /* ue8m0(e) * 2^8 (FP8 tile scale with the FP16 decode's 2^8) */
static float ue8_lut[256];     /* ue8m0(e) (FP4 row-block scale) */
static float ue8_lut_m8[256];  /* ue8m0(e) * 2^-8 (FP4 row-block scale against e2m1x32_w256's words) */
static float ue8_lut120[256];  /* ue8m0(e) * 2^120 (the shuffle decode's 2^120; inf above e = 134) */
int ds41_fast_e4m3_shuffle = -1;
long long ds41_fast_e4m3s_items, ds41_fast_e4m3s_fallbacks;
static int e4m3s_default;      /* the auto choice of the FP8 decode, set by isa_init */
static int cpu_vbmi;           /* AVX-512 VBMI (vpermb), set by isa_init */
static inline int e4m3s_on(const ds41_fast_ops *ops) {
    int on = ds41_fast_e4m3_shuffle < 0 ? e4m3s_default : ds41_fast_e4m3_shuffle;
    return on && ops->dec_e4m3s != NULL;
}

static void luts_fill(void) {
    for (int e = 0; e < 256; e++) {
        float s = ds41_ue8m0_to_f32((uint8_t)e);
        ue8_lut8[e] = s * p2(8);
        ue8_lut[e] = s;
        ue8_lut_m8[e] = s * p2(-8);   /* >= 2^-135: exact (subnormal at the bottom) */
        ue8_lut120[e] = s * p2(120);
    }
}

/* hsum8(A + B) of n <= 8 accumulator blocks acc + stride i (A: floats 0-7, B: 8-15) at once,
 * lane i: the same additions of the same pairs as hsum8 (A + B; low half + high half; lanes
 * 0, 1 + lanes 2, 3; lane 0 + lane 1), with two or four outputs side by side in a register
 * instead of one (absent blocks read as 0; their lanes are not outputs). */
static __m256 hsumab8v(const float *acc, size_t stride, int n) {
    __m256 v[8], s[4], p[2];
    for (int i = 0; i < 8; i++)
        v[i] = i < n ? _mm256_add_ps(_mm256_loadu_ps(acc + stride * i), _mm256_loadu_ps(acc + stride * i + 8))
                     : _mm256_setzero_ps();
    for (int i = 0; i < 4; i++)   /* [s(2i) | s(2i+1)]: lo + hi of each */
        s[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
    for (int i = 0; i < 2; i++)   /* per 128-bit half h: [p(4i+h)0, p(4i+h)1, p(4i+2+h)0, p(4i+2+h)1] */
        p[i] = _mm256_add_ps(_mm256_shuffle_ps(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 y = _mm256_add_ps(_mm256_shuffle_ps(p[0], p[1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm256_shuffle_ps(p[0], p[1], _MM_SHUFFLE(3, 1, 3, 1)));
    /* lanes: outputs 0, 2, 4, 6, 1, 3, 5, 7 -> 0 .. 7 */
    return _mm256_permutevar8x32_ps(y, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* ds41_bf16_round inline (round to nearest even; NaN kept quiet with its top payload bits) */
static inline float bf16r(float f) {
    uint32_t u = ds41_f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return ds41_bits_f32(((u >> 16) | 0x0040u) << 16);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return ds41_bits_f32(u & 0xFFFF0000u);
}

/* ---------------------------------------------------------------- AVX2 decoders */

/* 8 E4M3 codes -> e4m3 * 2^-8 (normal FP32) */
static inline __m256 e4m3x8_h(const uint8_t *p) {
    __m128i b = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(b, 7), _mm_set1_epi16((short)0xBFFF)));
}

/* 16 E4M3 codes -> two vectors of e4m3 * 2^-8 (as e4m3x8_h on each half, one widening) */
static inline void e4m3x16_h(const uint8_t *p, __m256 *lo, __m256 *hi) {
    __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    __m256i h = _mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16((short)0xBFFF));
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

/* Shuffle decode (T = 1 .. 8 on AMD CPUs, see e4m3s_on and fp8_acts; linear_avx512.c has its zmm
 * form): each code c moved by an in-lane byte shuffle to the top byte of a dword, shifted right
 * arithmetically by 4 and masked with 0x87F00000: the sign stays in bit 31 and eeeemmm lands in
 * bits 26..20, i.e. the FP32 pattern of e4m3(c) * 2^-120 (codes with e = 0 give FP32 subnormals,
 * exactly the E4M3 subnormals times 2^-120, and zeros). No lane-crossing widening and no F16C: on
 * a Zen 3 those share one pipe and bound the F16C decode at about 4 weights per cycle. */
const int8_t ds41_shuf_e4m3[64] __attribute__((aligned(64))) = {
    -1, -1, -1, 0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3,
    -1, -1, -1, 4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7,
    -1, -1, -1, 8, -1, -1, -1, 9, -1, -1, -1, 10, -1, -1, -1, 11,
    -1, -1, -1, 12, -1, -1, -1, 13, -1, -1, -1, 14, -1, -1, -1, 15 };
static inline __m256 e4m3_s(__m256i b, int half) {
    __m256i x = _mm256_shuffle_epi8(b, _mm256_load_si256((const __m256i *)(ds41_shuf_e4m3 + 32 * half)));
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(x, 4), _mm256_set1_epi32((int)0x87F00000)));
}
/* 16 E4M3 codes -> two vectors of e4m3 * 2^-120, e4m3_s's patterns with one byte shuffle: code i
 * goes to byte 1 and code 8 + i to byte 3 of dword i; vpmaddwd by 4096 (the low word, (int8) c *
 * 256, times 2^12; the high word times 0) gives (int8) c * 2^20 for codes 0..7, the arithmetic
 * shift by 4 the same for codes 8..15, the mask keeps sign and eeeemmm. Against e4m3_s twice it
 * issues one shuffle and one shift instead of two of each (on Zen both share two of the four
 * vector pipes; vpmaddwd runs on another): bench_kernels --isa avx2 --best --huge T = 1, one
 * thread, interleaved call by call, 1.07-1.16x on every FP8 shape (docs/performance.md). */
static const int8_t shuf_e4m3m[32] __attribute__((aligned(32))) = {
    -1, 0, -1, 8, -1, 1, -1, 9, -1, 2, -1, 10, -1, 3, -1, 11,
    -1, 4, -1, 12, -1, 5, -1, 13, -1, 6, -1, 14, -1, 7, -1, 15 };
static inline void e4m3x16_s(const uint8_t *p, __m256 *lo, __m256 *hi) {
    __m256i x = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p)),
                                    _mm256_load_si256((const __m256i *)shuf_e4m3m));
    const __m256i m = _mm256_set1_epi32((int)0x87F00000);
    *lo = _mm256_castsi256_ps(_mm256_and_si256(_mm256_madd_epi16(x, _mm256_set1_epi32(4096)), m));
    *hi = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(x, 4), m));
}
/* 8 E4M3 codes -> e4m3 * 2^-120 (reads 8 bytes) */
static inline __m256 e4m3x8_s(const uint8_t *p) {
    return e4m3_s(_mm256_broadcastsi128_si256(_mm_loadl_epi64((const __m128i *)p)), 0);
}


/* The same words times 256, without lane-crossing widening (one in-lane byte shuffle puts byte
 * i of the block in the high byte of word i of the lane that holds it, then the table lookup of
 * each nibble): *we = 256 * 2 e2m1 of the even elements, *wo of the odd. The T = 1 .. 64 AVX2
 * FP4 kernels use these against the same int16 activations: each int32 lane is 256 times the
 * exact block-lane sum (|.| < 2^29), fp32 of it 256 times fp32 of the sum (a power of two
 * commutes with rounding), and the row-block scale taken from ue8_lut_m8 (s * 2^-8, exact)
 * makes x = fp32(256 I) * s 2^-8 the correctly rounded I * s, the int16 road's x, bit for bit.
 * On a Zen 3 (T = 1, one thread) 1.3x the two vpmovsxbw of ds41_e2m1x32_i16. */
static inline void e2m1x32_w256(const uint8_t *p, __m256i *we, __m256i *wo) {
    const __m256i tab = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
                                         0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m256i ctl = _mm256_setr_epi8(-128, 0, -128, 1, -128, 2, -128, 3, -128, 4, -128, 5, -128, 6, -128, 7,
                                         -128, 8, -128, 9, -128, 10, -128, 11, -128, 12, -128, 13, -128, 14, -128, 15);
    const __m256i m = _mm256_set1_epi16(0x0F00);
    __m256i x = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p)), ctl);
    *we = _mm256_shuffle_epi8(tab, _mm256_and_si256(x, m));
    *wo = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(x, 4), m));
}

/* ---------------------------------------------------------------- AVX2 decode kernels */

#define DOT8(R, X, D16, D8)                                                                           \
    static void dot8##X##_##R(const uint8_t *w, size_t ld, int in, const float *a2, float *out) {    \
        __m256 A[R], B[R];                                                                        \
        UNROLL for (int r = 0; r < R; r++) A[r] = B[r] = _mm256_setzero_ps();                     \
        const int nxt = (size_t)R * ld <= DS41_PF_NEXT_MAX;                                       \
        int k = 0;                                                                                \
        for (; k + 16 <= in; k += 16) {                                                           \
            if (!(k & 63)) {                                                                      \
                if (nxt) ds41_pf_next(w, ld, (size_t)k, R);                                       \
                else ds41_pf_rows(w, ld, (size_t)k + PFD, R);                                     \
            }                                                                                     \
            __m256 a0 = _mm256_loadu_ps(a2 + k), a1 = _mm256_loadu_ps(a2 + k + 8);              \
            UNROLL for (int r = 0; r < R; r++) {                                                  \
                __m256 w0, w1;                                                                    \
                D16(w + r * ld + k, &w0, &w1);                                                    \
                A[r] = _mm256_fmadd_ps(w0, a0, A[r]);                                             \
                B[r] = _mm256_fmadd_ps(w1, a1, B[r]);                                             \
            }                                                                                     \
        }                                                                                         \
        if (k < in) UNROLL for (int r = 0; r < R; r++)                                            \
            A[r] = _mm256_fmadd_ps(D8(w + r * ld + k), _mm256_loadu_ps(a2 + k), A[r]);            \
        UNROLL for (int r = 0; r < R; r++) out[r] = hsum8(_mm256_add_ps(A[r], B[r]));             \
    }
DOT8(4, , e4m3x16_h, e4m3x8_h) DOT8(1, , e4m3x16_h, e4m3x8_h)
DOT8(4, s, e4m3x16_s, e4m3x8_s) DOT8(1, s, e4m3x16_s, e4m3x8_s)

static void dec_e4m3_avx2(const uint8_t *w, size_t ld, int nr, int in, const float *a2, float *out) {
    int r = 0;
    for (; r + 4 <= nr; r += 4) dot8_4(w + (size_t)r * ld, ld, in, a2, out + r);
    for (; r < nr; r++) dot8_1(w + (size_t)r * ld, ld, in, a2, out + r);
}
/* the same with the shuffle decode: a2 = a * s_tile * 2^120 */
static void dec_e4m3s_avx2(const uint8_t *w, size_t ld, int nr, int in, const float *a2, float *out) {
    int r = 0;
    for (; r + 4 <= nr; r += 4) dot8s_4(w + (size_t)r * ld, ld, in, a2, out + r);
    for (; r < nr; r++) dot8s_1(w + (size_t)r * ld, ld, in, a2, out + r);
}

/* one FP4 block of R rows into acc X */
#define FP4BLK(R, X, b)                                                                               \
    do {                                                                                          \
        __m256i ae = _mm256_load_si256((const __m256i *)(aw + 64 * ((b) >> 1) + 16 * ((b) & 1)));   \
        __m256i ao = _mm256_load_si256((const __m256i *)(aw + 64 * ((b) >> 1) + 32 + 16 * ((b) & 1))); \
        __m256 sa = _mm256_load_ps(sav + 16 * ((b) >> 1) + 8 * ((b) & 1));                        \
        UNROLL for (int r = 0; r < R; r++) {                                                      \
            __m256i we, wo;                                                                       \
            e2m1x32_w256(w + r * ld + 16 * (b), &we, &wo);                                        \
            __m256i d = _mm256_add_epi32(_mm256_madd_epi16(we, ae), _mm256_madd_epi16(wo, ao));   \
            __m256 x = _mm256_mul_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(ue8_lut_m8[s[r * lds + (b)]])); \
            X[r] = _mm256_fmadd_ps(x, sa, X[r]);                                                  \
        }                                                                                         \
    } while (0)

#define DOT4(R)                                                                                       \
    static void dot4_##R(const uint8_t *w, size_t ld, const uint8_t *s, size_t lds, int nb,          \
                         const int16_t *aw, const float *sav, float *out) {                       \
        __m256 A[R], B[R];                                                                        \
        UNROLL for (int r = 0; r < R; r++) A[r] = B[r] = _mm256_setzero_ps();                     \
        int b = 0;                                                                                \
        for (; b + 2 <= nb; b += 2) {                                                             \
            if (!(b & 3)) ds41_pf_rows(w, ld, (size_t)16 * b + PFD, R);                           \
            FP4BLK(R, A, b);                                                                      \
            FP4BLK(R, B, b + 1);                                                                  \
        }                                                                                         \
        if (b < nb) FP4BLK(R, A, b);                                                              \
        UNROLL for (int r = 0; r < R; r++) out[r] = hsum8(_mm256_add_ps(A[r], B[r]));             \
    }
DOT4(4) DOT4(1)

static void dec_fp4_avx2(const uint8_t *w, size_t ld, const uint8_t *s, size_t lds, int nr, int nb,
                         const int16_t *aw, const float *sav, float *out) {
    int r = 0;
    for (; r + 4 <= nr; r += 4) dot4_4(w + (size_t)r * ld, ld, s + (size_t)r * lds, lds, nb, aw, sav, out + r);
    for (; r < nr; r++) dot4_1(w + (size_t)r * ld, ld, s + (size_t)r * lds, lds, nb, aw, sav, out + r);
}

/* BF16 group g of R rows into acc X: even elements, then odd */
#define BFGRP(R, X, g)                                                                                \
    do {                                                                                          \
        __m256 ae = _mm256_loadu_ps(a + 32 * ((g) >> 1) + 8 * ((g) & 1));                          \
        __m256 ao = _mm256_loadu_ps(a + 32 * ((g) >> 1) + 16 + 8 * ((g) & 1));                     \
        UNROLL for (int r = 0; r < R; r++) {                                                      \
            __m256i v = _mm256_loadu_si256((const __m256i *)(w + r * ld + 16 * (g)));             \
            X[r] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), ae, X[r]);      \
            X[r] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v, hm)), ao, X[r]);       \
        }                                                                                         \
    } while (0)

#define DOTB(R)                                                                                       \
    static void dotb_##R(const uint16_t *w, size_t ld, int n16, const float *a, float *out) {        \
        const __m256i hm = _mm256_set1_epi32((int)0xFFFF0000);                                    \
        __m256 A[R], B[R];                                                                        \
        UNROLL for (int r = 0; r < R; r++) A[r] = B[r] = _mm256_setzero_ps();                     \
        int g = 0;                                                                                \
        for (; g + 2 <= n16; g += 2) {                                                            \
            ds41_pf_rows(w, 2 * ld, (size_t)32 * g + PFD, R);                                     \
            BFGRP(R, A, g);                                                                       \
            BFGRP(R, B, g + 1);                                                                   \
        }                                                                                         \
        if (g < n16) BFGRP(R, A, g);                                                              \
        UNROLL for (int r = 0; r < R; r++) out[r] = hsum8(_mm256_add_ps(A[r], B[r]));             \
    }
DOTB(4) DOTB(1)

static void dec_bf16_avx2(const uint16_t *w, size_t ld, int nr, int n16, const float *a, float *out) {
    int r = 0;
    for (; r + 4 <= nr; r += 4) dotb_4(w + (size_t)r * ld, ld, n16, a, out + r);
    for (; r < nr; r++) dotb_1(w + (size_t)r * ld, ld, n16, a, out + r);
}

#define DOTF(R)                                                                                       \
    static void dotf_##R(const float *w, size_t ld, int n8, const float *a, float *out) {            \
        __m256 A[R], B[R];                                                                        \
        UNROLL for (int r = 0; r < R; r++) A[r] = B[r] = _mm256_setzero_ps();                     \
        int g = 0;                                                                                \
        for (; g + 2 <= n8; g += 2) {                                                             \
            ds41_pf_rows(w, 4 * ld, (size_t)32 * g + PFD, R);                                     \
            __m256 a0 = _mm256_loadu_ps(a + 8 * g), a1 = _mm256_loadu_ps(a + 8 * g + 8);        \
            UNROLL for (int r = 0; r < R; r++) {                                                  \
                A[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w + r * ld + 8 * g), a0, A[r]);            \
                B[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w + r * ld + 8 * g + 8), a1, B[r]);        \
            }                                                                                     \
        }                                                                                         \
        if (g < n8) UNROLL for (int r = 0; r < R; r++)                                            \
            A[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w + r * ld + 8 * g), _mm256_loadu_ps(a + 8 * g), A[r]); \
        UNROLL for (int r = 0; r < R; r++) out[r] = hsum8(_mm256_add_ps(A[r], B[r]));             \
    }
DOTF(4) DOTF(1)

static void dec_f32_avx2(const float *w, size_t ld, int nr, int n8, const float *a, float *out) {
    int r = 0;
    for (; r + 4 <= nr; r += 4) dotf_4(w + (size_t)r * ld, ld, n8, a, out + r);
    for (; r < nr; r++) dotf_1(w + (size_t)r * ld, ld, n8, a, out + r);
}

/* ---------------------------------------------------------------- AVX2 few-row kernels */

/* T = 2 .. DS41_FEW_MAX: one weight row streamed (and decoded) once for C activation rows, each
 * (row, token) with its own A / B pair fed exactly as the decode kernels feed theirs. At most
 * FEWC tokens per pass (the register file: 2 C accumulators + the decoded chunk); T above that
 * takes two passes over the row, the second from L1. */
#define FEWC 6
#define FEWC4 4   /* FP4: the row-block scale and two word vectors stay live as well */

#define FEW8(C, X, D16, D8)                                                                           \
    static void few8##X##_##C(const uint8_t *w, int in, const float *a2, size_t lda, float *out) {   \
        __m256 A[C], B[C];                                                                        \
        UNROLL for (int t = 0; t < C; t++) A[t] = B[t] = _mm256_setzero_ps();                     \
        int k = 0;                                                                                \
        for (; k + 16 <= in; k += 16) {                                                           \
            if (!(k & 63)) _mm_prefetch((const char *)(w + k + PFD), _MM_HINT_T0);                \
            __m256 w0, w1;                                                                        \
            D16(w + k, &w0, &w1);                                                                 \
            UNROLL for (int t = 0; t < C; t++) {                                                  \
                A[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(a2 + t * lda + k), A[t]);              \
                B[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(a2 + t * lda + k + 8), B[t]);          \
            }                                                                                     \
        }                                                                                         \
        if (k < in) {                                                                             \
            __m256 w0 = D8(w + k);                                                                \
            UNROLL for (int t = 0; t < C; t++) A[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(a2 + t * lda + k), A[t]); \
        }                                                                                         \
        UNROLL for (int t = 0; t < C; t++) out[t] = hsum8(_mm256_add_ps(A[t], B[t]));             \
    }
#define FEW8H(C) FEW8(C, , e4m3x16_h, e4m3x8_h)
#define FEW8S(C) FEW8(C, s, e4m3x16_s, e4m3x8_s)
FEW8H(1) FEW8H(2) FEW8H(3) FEW8H(4) FEW8H(5) FEW8H(6)
FEW8S(1) FEW8S(2) FEW8S(3) FEW8S(4) FEW8S(5) FEW8S(6)
typedef void (*few8_fn)(const uint8_t *, int, const float *, size_t, float *);
static const few8_fn few8_k[FEWC] = { few8_1, few8_2, few8_3, few8_4, few8_5, few8_6 };
static const few8_fn few8s_k[FEWC] = { few8s_1, few8s_2, few8s_3, few8s_4, few8s_5, few8s_6 };

/* token passes of at most cmax: T <= cmax in one, else two of ceil(T / 2) and the rest */
static inline int few_pass(int T, int t0, int cmax) {
    if (T <= cmax) return T;
    int h = (T + 1) / 2;
    return t0 == 0 ? h : T - h;
}

static void few_e4m3_k(const few8_fn *k, const uint8_t *w, size_t ld, int nr, int in, const float *a2, size_t lda,
                       int T, float *out) {
    for (int r = 0; r < nr; r++)
        for (int t0 = 0, C; t0 < T; t0 += C) {
            C = few_pass(T, t0, FEWC);
            k[C - 1](w + (size_t)r * ld, in, a2 + (size_t)t0 * lda, lda, out + (size_t)r * T + t0);
        }
}
static void few_e4m3_avx2(const uint8_t *w, size_t ld, int nr, int in, const float *a2, size_t lda, int T, float *out) {
    few_e4m3_k(few8_k, w, ld, nr, in, a2, lda, T, out);
}
static void few_e4m3s_avx2(const uint8_t *w, size_t ld, int nr, int in, const float *a2, size_t lda, int T, float *out) {
    few_e4m3_k(few8s_k, w, ld, nr, in, a2, lda, T, out);
}

/* one FP4 block of one row into X[t], t < C (the FP4BLK operations, per token) */
#define FEW4BLK(C, X, b)                                                                              \
    do {                                                                                          \
        __m256i we, wo;                                                                           \
        e2m1x32_w256(w + 16 * (b), &we, &wo);                                                     \
        __m256 sw = _mm256_set1_ps(ue8_lut_m8[s[(b)]]);                                           \
        size_t oe = 64 * (size_t)((b) >> 1) + 16 * ((b) & 1), os = 16 * (size_t)((b) >> 1) + 8 * ((b) & 1); \
        UNROLL for (int t = 0; t < C; t++) {                                                      \
            __m256i ae = _mm256_load_si256((const __m256i *)(aw + t * ldaw + oe));                \
            __m256i ao = _mm256_load_si256((const __m256i *)(aw + t * ldaw + oe + 32));           \
            __m256i d = _mm256_add_epi32(_mm256_madd_epi16(we, ae), _mm256_madd_epi16(wo, ao));   \
            __m256 x = _mm256_mul_ps(_mm256_cvtepi32_ps(d), sw);                                  \
            X[t] = _mm256_fmadd_ps(x, _mm256_load_ps(sav + t * ldsa + os), X[t]);                 \
        }                                                                                         \
    } while (0)

#define FEW4(C)                                                                                       \
    static void few4_##C(const uint8_t *w, const uint8_t *s, int nb, const int16_t *aw, size_t ldaw, \
                         const float *sav, size_t ldsa, float *out) {                             \
        __m256 A[C], B[C];                                                                        \
        UNROLL for (int t = 0; t < C; t++) A[t] = B[t] = _mm256_setzero_ps();                     \
        int b = 0;                                                                                \
        for (; b + 2 <= nb; b += 2) {                                                             \
            if (!(b & 3)) _mm_prefetch((const char *)(w + 16 * b + PFD), _MM_HINT_T0);            \
            FEW4BLK(C, A, b);                                                                     \
            FEW4BLK(C, B, b + 1);                                                                 \
        }                                                                                         \
        if (b < nb) FEW4BLK(C, A, b);                                                             \
        UNROLL for (int t = 0; t < C; t++) out[t] = hsum8(_mm256_add_ps(A[t], B[t]));             \
    }
FEW4(1) FEW4(2) FEW4(3) FEW4(4)
static void (*const few4_k[FEWC4])(const uint8_t *, const uint8_t *, int, const int16_t *, size_t, const float *,
                                   size_t, float *) = { few4_1, few4_2, few4_3, few4_4 };

static void few_fp4_avx2(const uint8_t *w, size_t ld, const uint8_t *s, size_t lds, int nr, int nb,
                         const int16_t *aw, size_t ldaw, const float *sav, size_t ldsa, int T, float *out) {
    for (int r = 0; r < nr; r++)
        for (int t0 = 0, C; t0 < T; t0 += C) {
            C = few_pass(T, t0, FEWC4);
            few4_k[C - 1](w + (size_t)r * ld, s + (size_t)r * lds, nb, aw + (size_t)t0 * ldaw, ldaw,
                          sav + (size_t)t0 * ldsa, ldsa, out + (size_t)r * T + t0);
        }
}

/* BF16 group g of one row into X[t]: even elements, then odd (BFGRP per token) */
#define FEWBGRP(C, X, g)                                                                              \
    do {                                                                                          \
        __m256i v = _mm256_loadu_si256((const __m256i *)(w + 16 * (g)));                          \
        __m256 ev = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), od = _mm256_castsi256_ps(_mm256_and_si256(v, hm)); \
        size_t oa = 32 * (size_t)((g) >> 1) + 8 * ((g) & 1);                                      \
        UNROLL for (int t = 0; t < C; t++) {                                                      \
            X[t] = _mm256_fmadd_ps(ev, _mm256_loadu_ps(a + t * lda + oa), X[t]);                  \
            X[t] = _mm256_fmadd_ps(od, _mm256_loadu_ps(a + t * lda + oa + 16), X[t]);             \
        }                                                                                         \
    } while (0)

#define FEWB(C)                                                                                       \
    static void fewb_##C(const uint16_t *w, int n16, const float *a, size_t lda, float *out) {       \
        const __m256i hm = _mm256_set1_epi32((int)0xFFFF0000);                                    \
        __m256 A[C], B[C];                                                                        \
        UNROLL for (int t = 0; t < C; t++) A[t] = B[t] = _mm256_setzero_ps();                     \
        int g = 0;                                                                                \
        for (; g + 2 <= n16; g += 2) {                                                            \
            _mm_prefetch((const char *)(w + 16 * g) + PFD, _MM_HINT_T0);                          \
            FEWBGRP(C, A, g);                                                                     \
            FEWBGRP(C, B, g + 1);                                                                 \
        }                                                                                         \
        if (g < n16) FEWBGRP(C, A, g);                                                            \
        UNROLL for (int t = 0; t < C; t++) out[t] = hsum8(_mm256_add_ps(A[t], B[t]));             \
    }
FEWB(1) FEWB(2) FEWB(3) FEWB(4) FEWB(5) FEWB(6)
static void (*const fewb_k[FEWC])(const uint16_t *, int, const float *, size_t, float *) = {
    fewb_1, fewb_2, fewb_3, fewb_4, fewb_5, fewb_6 };

static void few_bf16_avx2(const uint16_t *w, size_t ld, int nr, int n16, const float *a, size_t lda, int T, float *out) {
    for (int r = 0; r < nr; r++)
        for (int t0 = 0, C; t0 < T; t0 += C) {
            C = few_pass(T, t0, FEWC);
            fewb_k[C - 1](w + (size_t)r * ld, n16, a + (size_t)t0 * lda, lda, out + (size_t)r * T + t0);
        }
}

#define FEWF(C)                                                                                       \
    static void fewf_##C(const float *w, int n8, const float *a, size_t lda, float *out) {           \
        __m256 A[C], B[C];                                                                        \
        UNROLL for (int t = 0; t < C; t++) A[t] = B[t] = _mm256_setzero_ps();                     \
        int g = 0;                                                                                \
        for (; g + 2 <= n8; g += 2) {                                                             \
            _mm_prefetch((const char *)(w + 8 * g) + PFD, _MM_HINT_T0);                           \
            __m256 w0 = _mm256_loadu_ps(w + 8 * g), w1 = _mm256_loadu_ps(w + 8 * g + 8);          \
            UNROLL for (int t = 0; t < C; t++) {                                                  \
                A[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(a + t * lda + 8 * g), A[t]);           \
                B[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(a + t * lda + 8 * g + 8), B[t]);       \
            }                                                                                     \
        }                                                                                         \
        if (g < n8) {                                                                             \
            __m256 w0 = _mm256_loadu_ps(w + 8 * g);                                               \
            UNROLL for (int t = 0; t < C; t++) A[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(a + t * lda + 8 * g), A[t]); \
        }                                                                                         \
        UNROLL for (int t = 0; t < C; t++) out[t] = hsum8(_mm256_add_ps(A[t], B[t]));             \
    }
FEWF(1) FEWF(2) FEWF(3) FEWF(4) FEWF(5) FEWF(6)
static void (*const fewf_k[FEWC])(const float *, int, const float *, size_t, float *) = {
    fewf_1, fewf_2, fewf_3, fewf_4, fewf_5, fewf_6 };

static void few_f32_avx2(const float *w, size_t ld, int nr, int n8, const float *a, size_t lda, int T, float *out) {
    for (int r = 0; r < nr; r++)
        for (int t0 = 0, C; t0 < T; t0 += C) {
            C = few_pass(T, t0, FEWC);
            fewf_k[C - 1](w + (size_t)r * ld, n8, a + (size_t)t0 * lda, lda, out + (size_t)r * T + t0);
        }
}

/* ---------------------------------------------------------------- AVX2 mid-row kernels */

/* T = DS41_FEW_MAX + 1 .. DS41_MID_MAX: one K block of one weight row, decoded in registers and
 * applied to C tokens, in the activations' step-major layout (mid_acts). The A and B chains of
 * an output are independent until the final add, so each runs as its own parity pass: the even
 * chunks / blocks of the block into A (acc + 16 t) for all C tokens, then the odd
 * ones into B (acc + 16 t + 8), each in increasing order, each weight chunk decoded once per
 * pass. One ymm accumulator per token (not an A / B pair) leaves room for up to MIDC2 tokens
 * in the 16 registers, so a chunk decoded once serves up to 14 FMAs. */
#define MIDC2 14      /* FP8: tokens per pass (C accumulators + the decoded chunk + a temporary) */
#define MIDC2Q 10     /* FP4: the words we, wo, the block scale and the int32 products stay live too */
#define MIDPF2 4      /* rows of prefetch ahead (measured at T = 16, rows-outer order: 4 with the wrap
                       * to the next block a few % ahead of 2 without it, within a noisy machine's
                       * spread) */
#define UNROLL16 _Pragma("GCC unroll 16")

/* FP8: step 16 K (chunks 2i, 2i + 1); a: 16 floats per token per step, sstep floats per step,
 * already times the tile scale * 2^8 (mid_e4m3_avx2), so the weight is the bare FP16 decode
 * e4m3 * 2^-8: the decode's operands (item_decode), the decode's FMAs. */
#define MID8(C)                                                                                       \
    static void mid8_##C(const uint8_t *w, int ns, const float *a, size_t sstep, float *acc) {      \
        for (int p = 0; p < 2; p++) {                                                             \
            __m256 c[C];                                                                          \
            UNROLL16 for (int t = 0; t < C; t++) c[t] = _mm256_loadu_ps(acc + 16 * t + 8 * p);    \
            const float *ap = a + 8 * p;                                                          \
            const uint8_t *wp = w + 8 * p;                                                        \
            for (int i = 0; i < ns; i++, ap += sstep) {                                           \
                __m256 wv = e4m3x8_h(wp + 16 * i);                                                \
                UNROLL16 for (int t = 0; t < C; t++) c[t] = _mm256_fmadd_ps(wv, _mm256_load_ps(ap + 16 * t), c[t]); \
            }                                                                                     \
            UNROLL16 for (int t = 0; t < C; t++) _mm256_storeu_ps(acc + 16 * t + 8 * p, c[t]);    \
        }                                                                                         \
    }
MID8(1) MID8(2) MID8(3) MID8(4) MID8(5) MID8(6) MID8(7)
MID8(8) MID8(9) MID8(10) MID8(11) MID8(12) MID8(13) MID8(14)
static void (*const mid8_k[MIDC2])(const uint8_t *, int, const float *, size_t, float *) = {
    mid8_1, mid8_2, mid8_3, mid8_4, mid8_5, mid8_6, mid8_7,
    mid8_8, mid8_9, mid8_10, mid8_11, mid8_12, mid8_13, mid8_14 };

/* token passes of at most cmax, of near-equal sizes (T = 16: 8 + 8, not 14 + 2) */
static inline int mid_pass2(int T, int t0, int cmax) {
    int np = (T + cmax - 1) / cmax, done = 0;
    for (int p = 0; p < np; p++) {
        int c = (T - done) / (np - p);
        if (done == t0) return c;
        done += c;
    }
    return T - t0;
}

/* The block of row r + MIDPF2 (n bytes from w + (r + MIDPF2) * ldb) to L1 during row r; near
 * the end of the block, the first rows of the next K block of the item (w + n on). Prefetches
 * past the matrix do not fault. */
static inline void mid_prefetch(const void *w, size_t ldb, int r, int nr, size_t n) {
    int rr = r + MIDPF2;
    const char *p = rr < nr ? (const char *)w + (size_t)rr * ldb : (const char *)w + (size_t)(rr - nr) * ldb + n;
    for (size_t k = 0; k < n; k += 64) _mm_prefetch(p + k, _MM_HINT_T0);
}

#define MIDAS 4096   /* floats of scaled FP8 activations per sub-block (16 KiB, half the L1 of Zen 3) */

/* the largest token pass of T (mid_pass2) */
static inline int mid_cmax(int T, int cmax) {
    int np = (T + cmax - 1) / cmax;
    return (T + np - 1) / np;
}

/* kc % 32 == 0. Per token pass, the pass's activations of a sub-block (at most MIDAS floats)
 * are scaled by the tile's scales once for all rows (the decode's a * s_tile * 2^8, exact as
 * there) into a compact step-major copy; then every row of the item runs over them. */
static void mid_e4m3_avx2(const uint8_t *w, size_t ld, const uint8_t *st, int nr, int kc, const float *a2, int T,
                          float *acc) {
    float as[MIDAS] __attribute__((aligned(64)));
    int sb = (MIDAS / mid_cmax(T, MIDC2)) & ~31;   /* K per sub-block: >= 288 */
    for (int t0 = 0, C; t0 < T; t0 += C) {
        C = mid_pass2(T, t0, MIDC2);
        for (int k0 = 0; k0 < kc; k0 += sb) {
            int kn = kc - k0 < sb ? kc - k0 : sb, ns = kn / 16;
            for (int i = 0; i < ns; i++) {
                __m256 sc = _mm256_set1_ps(ue8_lut8[st[(k0 >> 5) + (i >> 1)]]);
                const float *src = a2 + ((size_t)(k0 / 16 + i) * T + t0) * 16;
                for (int q = 0; q < 2 * C; q++)
                    _mm256_store_ps(as + (size_t)i * C * 16 + 8 * q, _mm256_mul_ps(_mm256_load_ps(src + 8 * q), sc));
            }
            for (int r = 0; r < nr; r++) {
                mid_prefetch(w + k0, ld, r, nr, (size_t)kn);
                mid8_k[C - 1](w + (size_t)r * ld + k0, ns, as, 16 * (size_t)C, acc + ((size_t)r * T + t0) * 16);
            }
        }
    }
}

/* FP4: step 64 K (blocks 2i, 2i + 1); a: 96 int16 units per token per step (32 even words:
 * 16 of block 2i, 16 of 2i + 1; 32 odd words alike; 16 pair-scale floats, 8 per block), so
 * block parity p reads its words at + 16 p and its scales at + 64 + 16 p int16 units. A lone
 * last block (nb odd) is even: A only. */
#define MID4(C)                                                                                       \
    static void mid4_##C(const uint8_t *w, const uint8_t *s, int nb, const int16_t *a, size_t sstep, float *acc) { \
        for (int p = 0; p < 2 && p < nb; p++) {                                                   \
            __m256 c[C];                                                                          \
            UNROLL16 for (int t = 0; t < C; t++) c[t] = _mm256_loadu_ps(acc + 16 * t + 8 * p);    \
            const int16_t *ap = a + 16 * p;                                                       \
            for (int b = p; b < nb; b += 2, ap += sstep) {                                        \
                __m256i we, wo;                                                                   \
                e2m1x32_w256(w + 16 * b, &we, &wo);                                               \
                __m256 sw = _mm256_set1_ps(ue8_lut_m8[s[b]]);                                     \
                UNROLL16 for (int t = 0; t < C; t++) {                                            \
                    __m256i ae = _mm256_load_si256((const __m256i *)(ap + 96 * t));               \
                    __m256i ao = _mm256_load_si256((const __m256i *)(ap + 96 * t + 32));          \
                    __m256i d = _mm256_add_epi32(_mm256_madd_epi16(we, ae), _mm256_madd_epi16(wo, ao)); \
                    __m256 x = _mm256_mul_ps(_mm256_cvtepi32_ps(d), sw);                          \
                    c[t] = _mm256_fmadd_ps(x, _mm256_load_ps((const float *)(ap + 96 * t + 64)), c[t]); \
                }                                                                                 \
            }                                                                                     \
            UNROLL16 for (int t = 0; t < C; t++) _mm256_storeu_ps(acc + 16 * t + 8 * p, c[t]);    \
        }                                                                                         \
    }
MID4(1) MID4(2) MID4(3) MID4(4) MID4(5) MID4(6) MID4(7) MID4(8) MID4(9) MID4(10)
static void (*const mid4_k[MIDC2Q])(const uint8_t *, const uint8_t *, int, const int16_t *, size_t, float *) = {
    mid4_1, mid4_2, mid4_3, mid4_4, mid4_5, mid4_6, mid4_7, mid4_8, mid4_9, mid4_10 };

static void mid_fp4_avx2(const uint8_t *w, size_t ld, const uint8_t *s, size_t lds, int nr, int nb, const int16_t *a2,
                         int T, float *acc) {
    for (int t0 = 0, C; t0 < T; t0 += C) {
        C = mid_pass2(T, t0, MIDC2Q);
        for (int r = 0; r < nr; r++) {
            mid_prefetch(w, ld, r, nr, 16 * (size_t)nb);
            mid4_k[C - 1](w + (size_t)r * ld, s + (size_t)r * lds, nb, a2 + 96 * (size_t)t0, 96 * (size_t)T,
                          acc + ((size_t)r * T + t0) * 16);
        }
    }
}

/* ---------------------------------------------------------------- AVX2 prefill micro-kernels */

/* Float panel: acc[(r * T + t) * 16 + 8 * par] += P[r][8c..] * A[t][8c..] for chunks c of parity
 * par (the A and B chains are independent, so each runs as its own pass). */
#define MK_EW(R, C)                                                                                   \
    static void mk_ew_##R##_##C(const float *P, const float *A, size_t lda, int nch, float *acc, int T, int z) { \
        for (int par = 0; par < 2; par++) {                                                       \
            __m256 c[R][C];                                                                       \
            UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++)                 \
                c[r][t] = z ? _mm256_setzero_ps()                                                 \
                            : _mm256_loadu_ps(acc + ((size_t)r * T + t) * 16 + 8 * par);          \
            for (int k = par; k < nch; k += 2) {                                                  \
                __m256 a[C];                                                                      \
                UNROLL for (int t = 0; t < C; t++) a[t] = _mm256_loadu_ps(A + t * lda + 8 * k);  \
                UNROLL for (int r = 0; r < R; r++) {                                              \
                    __m256 w = _mm256_load_ps(P + r * KC + 8 * k);                               \
                    UNROLL for (int t = 0; t < C; t++) c[r][t] = _mm256_fmadd_ps(w, a[t], c[r][t]); \
                }                                                                                 \
            }                                                                                     \
            UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++)                 \
                _mm256_storeu_ps(acc + ((size_t)r * T + t) * 16 + 8 * par, c[r][t]);              \
        }                                                                                         \
    }
MK_EW(1, 1) MK_EW(1, 2) MK_EW(1, 3) MK_EW(2, 1) MK_EW(2, 2) MK_EW(2, 3)
MK_EW(3, 1) MK_EW(3, 2) MK_EW(3, 3) MK_EW(4, 1) MK_EW(4, 2) MK_EW(4, 3)
typedef void (*mk_ew_fn)(const float *, const float *, size_t, int, float *, int, int);
static const mk_ew_fn mk_ew[4][3] = {
    { mk_ew_1_1, mk_ew_1_2, mk_ew_1_3 }, { mk_ew_2_1, mk_ew_2_2, mk_ew_2_3 },
    { mk_ew_3_1, mk_ew_3_2, mk_ew_3_3 }, { mk_ew_4_1, mk_ew_4_2, mk_ew_4_3 } };

/* token tiles of 3; a remainder of 4 as 2 + 2 (a 4 x 1 tile has 4 FMA chains, half the 8 that
 * keep both FMA pipes busy) */
static inline int pf_tile3(int rem) { return rem == 4 ? 2 : rem < 3 ? rem : 3; }

static void pf_float_avx2(const float *P, int nr, const float *A, size_t lda, int T, int nch, float *acc, int z) {
    for (int t0 = 0, C; t0 < T; t0 += C) {
        C = pf_tile3(T - t0);
        for (int r0 = 0; r0 < nr; r0 += 4) {
            int R = nr - r0 < 4 ? nr - r0 : 4;
            mk_ew[R - 1][C - 1](P + (size_t)r0 * KC, A + (size_t)t0 * lda, lda, nch, acc + ((size_t)r0 * T + t0) * 16, T, z);
        }
    }
}

/* FP4 panel: int16 weight words PW[r] (row stride KC, the activation layout), row-block
 * scale pair vectors SW[r] (row stride KC / 4 floats), activations AW / SAV. */
#define MK_Q(R, C)                                                                                    \
    static void mk_q_##R##_##C(const int16_t *PW, const float *SW, const int16_t *AW, size_t ldaw,   \
                               const float *SAV, size_t ldsa, int nblk, float *acc, int T, int z) { \
        for (int par = 0; par < 2; par++) {                                                       \
            __m256 c[R][C];                                                                       \
            UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++)                 \
                c[r][t] = z ? _mm256_setzero_ps()                                                 \
                            : _mm256_loadu_ps(acc + ((size_t)r * T + t) * 16 + 8 * par);          \
            for (int b = par; b < nblk; b += 2) {                                                 \
                size_t oe = 64 * (size_t)(b >> 1) + 16 * (b & 1), os = 16 * (size_t)(b >> 1) + 8 * (b & 1); \
                __m256i ae[C], ao[C];                                                             \
                UNROLL for (int t = 0; t < C; t++) {                                              \
                    ae[t] = _mm256_load_si256((const __m256i *)(AW + t * ldaw + oe));             \
                    ao[t] = _mm256_load_si256((const __m256i *)(AW + t * ldaw + oe + 32));        \
                }                                                                                 \
                UNROLL for (int r = 0; r < R; r++) {                                              \
                    __m256i we = _mm256_load_si256((const __m256i *)(PW + r * KC + oe));          \
                    __m256i wo = _mm256_load_si256((const __m256i *)(PW + r * KC + oe + 32));     \
                    __m256 sw = _mm256_load_ps(SW + r * (KC / 4) + os);                           \
                    UNROLL for (int t = 0; t < C; t++) {                                          \
                        __m256i d = _mm256_add_epi32(_mm256_madd_epi16(we, ae[t]), _mm256_madd_epi16(wo, ao[t])); \
                        __m256 x = _mm256_mul_ps(_mm256_cvtepi32_ps(d), sw);                      \
                        c[r][t] = _mm256_fmadd_ps(x, _mm256_load_ps(SAV + t * ldsa + os), c[r][t]); \
                    }                                                                             \
                }                                                                                 \
            }                                                                                     \
            UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++)                 \
                _mm256_storeu_ps(acc + ((size_t)r * T + t) * 16 + 8 * par, c[r][t]);              \
        }                                                                                         \
    }
MK_Q(1, 1) MK_Q(1, 2) MK_Q(1, 3) MK_Q(2, 1) MK_Q(2, 2) MK_Q(2, 3)
typedef void (*mk_q_fn)(const int16_t *, const float *, const int16_t *, size_t, const float *, size_t, int, float *, int, int);
static const mk_q_fn mk_q[2][3] = { { mk_q_1_1, mk_q_1_2, mk_q_1_3 }, { mk_q_2_1, mk_q_2_2, mk_q_2_3 } };

static void pf_fp4_avx2(const int16_t *PW, const float *SW, int nr, const int16_t *AW, size_t ldaw,
                        const float *SAV, size_t ldsa, int T, int nblk, float *acc, int z) {
    for (int t0 = 0, C; t0 < T; t0 += C) {
        C = pf_tile3(T - t0);
        for (int r0 = 0; r0 < nr; r0 += 2) {
            int R = nr - r0 < 2 ? nr - r0 : 2;
            mk_q[R - 1][C - 1](PW + (size_t)r0 * KC, SW + (size_t)r0 * (KC / 4), AW + (size_t)t0 * ldaw, ldaw,
                               SAV + (size_t)t0 * ldsa, ldsa, nblk, acc + ((size_t)r0 * T + t0) * 16, T, z);
        }
    }
}

static void pan_e4m3_avx2(const uint8_t *c, const uint8_t *st, int kc, float *p) {
    for (int b = 0; b < kc / 32; b++) {
        __m256 sc = _mm256_set1_ps(ue8_lut8[st[b]]);
        for (int q = 0; q < 4; q++) _mm256_store_ps(p + 32 * b + 8 * q, _mm256_mul_ps(e4m3x8_h(c + 32 * b + 8 * q), sc));
    }
}

static const ds41_fast_ops ops_avx2 = { "avx2", KC, dec_e4m3_avx2, dec_fp4_avx2, dec_bf16_avx2, dec_f32_avx2,
                                        few_e4m3_avx2, few_fp4_avx2, few_bf16_avx2, few_f32_avx2,
                                        mid_e4m3_avx2, mid_fp4_avx2, NULL, pf_float_avx2, pf_fp4_avx2,
                                        dec_e4m3s_avx2, few_e4m3s_avx2, pan_e4m3_avx2 };
const ds41_fast_ops *ds41_fast_ops_avx2(void) { return &ops_avx2; }

/* ---------------------------------------------------------------- ISA selection */

static const ds41_fast_ops *g_ops;
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

int ds41_fast_bf16_on;
double ds41_fast_bf16_ratio;
int ds41_fast_fp8_few = 1;
long long ds41_fast_bf16_panels, ds41_fast_bf16_fallbacks, ds41_fast_fp4_dot_tiles, ds41_fast_fp4_dot_refused;

int ds41_kernels_isa_supported(const char *name) {
    if (!strcmp(name, "avx2"))
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0;
    if (!strcmp(name, "avx512"))
        return ds41_fast_ops_avx512() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vnni");
    if (!strcmp(name, "avx512bf16"))
        return ds41_kernels_isa_supported("avx512") && ds41_fast_bf16_avx512() && __builtin_cpu_supports("avx512bf16");
    if (!strcmp(name, "avx512dot")) return ds41_kernels_isa_supported("avx512bf16");
    return 0;
}

/* auto: the BF16 FP4 panels where vdpbf16ps runs at no less than 1 / DS41_BF16_RATIO_MAX of
 * the zmm FMA's instruction rate (their 2 vdpbf16ps + 1 FMA per 64 MACs then cost at most 4
 * FMA slots against the int16 road's 5 instructions; a core that runs vdpbf16ps at half rate,
 * ratio 2, gains nothing) */
static int bf16_auto(void) {
    if (!ds41_kernels_isa_supported("avx512bf16")) return 0;
    if (ds41_fast_bf16_ratio == 0) ds41_fast_bf16_ratio = ds41_fast_bf16_avx512()->probe();
    return ds41_fast_bf16_ratio <= DS41_BF16_RATIO_MAX;
}

static void isa_init(void) {
    luts_fill();
    const char *d = getenv("DS41_E4M3");
    cpu_vbmi = __builtin_cpu_supports("avx512vbmi");
    e4m3s_default = d && !strcmp(d, "f16c") ? 0 : d && !strcmp(d, "shuffle") ? 1 : d && !strcmp(d, "vbmi") ? 2
                  : __builtin_cpu_is("amd") ? 2 : 0;
    const char *f = getenv("DS41_FP8_FEW");
    if (f && !strcmp(f, "0")) ds41_fast_fp8_few = 0;
    const char *e = getenv("DS41_ISA");
    int dflt = !e || !*e || !strcmp(e, "auto");
    g_ops = &ops_avx2;
    if ((dflt || !strcmp(e, "avx512") || !strcmp(e, "avx512bf16") || !strcmp(e, "avx512dot")) &&
        ds41_kernels_isa_supported("avx512"))
        g_ops = ds41_fast_ops_avx512();
    if (g_ops != &ops_avx2)
        ds41_fast_bf16_on = dflt ? bf16_auto()
                          : !ds41_kernels_isa_supported("avx512bf16") ? 0
                          : !strcmp(e, "avx512dot") ? 2 : !strcmp(e, "avx512bf16");
}

const ds41_fast_ops *ds41_fast_ops_get(void) {
    pthread_once(&isa_once, isa_init);
    return __atomic_load_n(&g_ops, __ATOMIC_ACQUIRE);
}

const char *ds41_kernels_isa(void) { return ds41_fast_ops_get()->name; }
int ds41_fast_e4m3_shuffle_auto(void) {
    ds41_fast_ops_get();
    return e4m3s_default;
}
int ds41_fast_e4m3_vbmi(void) {
    const ds41_fast_ops *ops = ds41_fast_ops_get();
    int on = ds41_fast_e4m3_shuffle < 0 ? e4m3s_default : ds41_fast_e4m3_shuffle;
    return on == 2 && cpu_vbmi && ops != &ops_avx2;
}
const char *ds41_kernels_fp8_decode(void) {
    return ds41_fast_e4m3_vbmi() ? "vbmi" : e4m3s_on(ds41_fast_ops_get()) ? "shuffle" : "f16c";
}
/* the BF16 road of the ops: non-NULL for the AVX-512 ops with ds41_fast_bf16_on */
static const ds41_fast_bf16 *bf16_of(const ds41_fast_ops *ops) {
    return ops != &ops_avx2 && __atomic_load_n(&ds41_fast_bf16_on, __ATOMIC_RELAXED) ? ds41_fast_bf16_avx512() : NULL;
}
const char *ds41_kernels_fp4_products(void) {
    return !bf16_of(ds41_fast_ops_get()) ? "int16"
           : __atomic_load_n(&ds41_fast_bf16_on, __ATOMIC_RELAXED) == 2 ? "vdpbf16ps-dot" : "vdpbf16ps";
}
double ds41_kernels_bf16_ratio(void) {
    ds41_fast_ops_get();
    if (ds41_fast_bf16_ratio == 0 && ds41_kernels_isa_supported("avx512bf16"))
        ds41_fast_bf16_ratio = ds41_fast_bf16_avx512()->probe();
    return ds41_fast_bf16_ratio;
}

int ds41_kernels_set_isa(const char *name) {
    ds41_fast_ops_get();
    const ds41_fast_ops *o = NULL;
    int bf = 0;
    if (!strcmp(name, "auto")) {
        o = ds41_kernels_isa_supported("avx512") ? ds41_fast_ops_avx512() : &ops_avx2;
        bf = o != &ops_avx2 && bf16_auto();
    } else if (!ds41_kernels_isa_supported(name)) {
        return -1;
    } else {
        o = !strcmp(name, "avx2") ? &ops_avx2 : ds41_fast_ops_avx512();
        bf = !strcmp(name, "avx512dot") ? 2 : !strcmp(name, "avx512bf16");
    }
    __atomic_store_n(&ds41_fast_bf16_on, bf, __ATOMIC_RELAXED);
    __atomic_store_n(&g_ops, o, __ATOMIC_RELEASE);
    return 0;
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

/* FP4 activations of one row: Q8 values a[in] (v * s) -> int16 words aw (per 64: 32 even
 * elements, 32 odd; ngrp groups, zero padded) and pair scale vectors sav (per 64: u/2 of the
 * first block x 8, of the second x 8). */
/* Per 32-block: m = max |a| (NaNs ignored: max_ps returns its second operand when the first is
 * NaN), ue = m's biased exponent - 14 (127 when m = 0), at least 2; q = (int16) cvt(a 2^(127 -
 * ue)), rounded as MXCSR says (to nearest even), truncated to 16 bits (NaN and out-of-range
 * values convert to 0x80000000, whose low half is 0); u / 2 = 2^(ue - 128). The 16 low halves
 * of each parity go out with two unsigned packs (exact: masked to 16 bits first) and a lane
 * permute. Bit for bit the scalar definition (tests: test_fp4_act_row). */
static void fp4_act_row(const float *a, int in, int16_t *aw, float *sav) {
    int nb = in / 32;
    if (nb & 1) {   /* the lone last block's partner: zeros */
        memset(aw + 64 * (nb >> 1), 0, 64 * sizeof(int16_t));
        memset(sav + 16 * (nb >> 1), 0, 16 * sizeof(float));
    }
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256i lo16 = _mm256_set1_epi32(0xFFFF);
    for (int b = 0; b < nb; b++) {
        const float *ab = a + 32 * b;
        __m256 v[4], mx = _mm256_setzero_ps();
        for (int q = 0; q < 4; q++) {
            v[q] = _mm256_loadu_ps(ab + 8 * q);
            mx = _mm256_max_ps(_mm256_and_ps(v[q], absm), mx);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        float m = _mm_cvtss_f32(m4);
        int ue = m > 0.0f ? (int)(ds41_f32_bits(m) >> 23) - 14 : 127;
        if (ue < 2) ue = 2;
        __m256 inv = _mm256_set1_ps(ds41_bits_f32((uint32_t)(254 - ue) << 23));
        __m256i p[2];   /* the 32 words in K order, 16 per register */
        for (int h = 0; h < 2; h++) {
            __m256i q0 = _mm256_and_si256(_mm256_cvtps_epi32(_mm256_mul_ps(v[2 * h], inv)), lo16);
            __m256i q1 = _mm256_and_si256(_mm256_cvtps_epi32(_mm256_mul_ps(v[2 * h + 1], inv)), lo16);
            p[h] = _mm256_permute4x64_epi64(_mm256_packus_epi32(q0, q1), 0xD8);
        }
        /* a dword of p holds elements 2i (low half) and 2i + 1 (high half) */
        __m256i we = _mm256_packus_epi32(_mm256_and_si256(p[0], lo16), _mm256_and_si256(p[1], lo16));
        __m256i wo = _mm256_packus_epi32(_mm256_srli_epi32(p[0], 16), _mm256_srli_epi32(p[1], 16));
        int16_t *o = aw + 64 * (b >> 1) + 16 * (b & 1);
        _mm256_storeu_si256((__m256i *)o, _mm256_permute4x64_epi64(we, 0xD8));
        _mm256_storeu_si256((__m256i *)(o + 32), _mm256_permute4x64_epi64(wo, 0xD8));
        _mm256_storeu_ps(sav + 16 * (b >> 1) + 8 * (b & 1), _mm256_set1_ps(ds41_bits_f32((uint32_t)(ue - 1) << 23)));
    }
}
void ds41_fast_fp4_act_row(const float *a, int in, int16_t *aw, float *sav) { fp4_act_row(a, in, aw, sav); }

/* The int16 activation words of the FP4 linears as BF16 words (n of them): 1, or 0 when one is
 * not exact in BF16 (never for fp4_act_row's words, whose magnitudes have at most 4
 * significant bits: checked all the same, since the BF16 road's exactness rests on it). */
static int fp4_words_bf16(const int16_t *aw, size_t n, int16_t *ab) {
    __m256i lost = _mm256_setzero_si256();
    const __m256i lo16 = _mm256_set1_epi32(0xFFFF);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i u0 = _mm256_castps_si256(_mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)(aw + i)))));
        __m256i u1 = _mm256_castps_si256(_mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)(aw + i + 8)))));
        lost = _mm256_or_si256(lost, _mm256_and_si256(_mm256_or_si256(u0, u1), lo16));
        __m256i w = _mm256_packus_epi32(_mm256_srli_epi32(u0, 16), _mm256_srli_epi32(u1, 16));
        _mm256_storeu_si256((__m256i *)(ab + i), _mm256_permute4x64_epi64(w, 0xD8));
    }
    uint32_t l = (uint32_t)!_mm256_testz_si256(lost, lost);
    for (; i < n; i++) {
        uint32_t u = ds41_f32_bits((float)aw[i]);
        l |= u & 0xFFFFu;
        ab[i] = (int16_t)(u >> 16);
    }
    return l == 0;
}

/* BF16 activation order per 32: even elements of k0..k0+15, even of k0+16..+31, odd of the
 * first 16, odd of the second (a lone last 16 as if the second were zeros); zero padded to a
 * multiple of 32. */
static void perm_bf16_row(const float *x, int in, float *a) {
    int kv = in & ~15, kp = (kv + 31) & ~31;
    memset(a, 0, (size_t)kp * sizeof(float));
    for (int k = 0; k < kv; k++) {
        int j = k >> 5, g = (k >> 4) & 1, e = k & 15;
        a[32 * j + 8 * g + (e & 1) * 16 + (e >> 1)] = x[k];
    }
}

/* ---------------------------------------------------------------- jobs */

enum { J_FP8, J_FP4, J_DQ, J_BF16, J_F32 };

typedef struct fjob {
    const ds41_fast_ops *ops;
    int kind;
    const uint8_t *w, *s;      /* FP8 / FP4 / DQ codes and scales (full matrix) */
    const uint16_t *wb;
    const float *wf;
    int row0;                  /* absolute row of output 0 (DQ; 0 otherwise) */
    int out, in, T;
    int kv;                    /* K covered by the vector code (in, or in rounded down to 16 / 8) */
    const float *a;            /* prepared activations (FP8 / BF16 / F32 / DQ), T rows at stride lda */
    size_t lda;
    const int16_t *aw;         /* FP4: int16 activations, stride ldaw; pair scales sav, stride ldsa */
    size_t ldaw;
    const float *sav;
    size_t ldsa;
    const float *x;            /* raw activations (tails of BF16 / FP32), stride x_stride */
    size_t x_stride;
    float *y;
    size_t y_stride;
    int out_bf16;
    int tile0;                 /* absolute 32-row tile of item 0 */
    const void *am;            /* mid path (T = DS41_FEW_MAX + 1 .. DS41_MID_MAX): step-major
                                * activations (mid_acts); NULL: the other paths */
    const int16_t *ab;         /* FP4 prefill panels on the BF16 road: aw as BF16 words (stride
                                * ldaw); NULL: the int16 road */
    const uint8_t *rng;        /* FP8 / DQ, T <= DS41_FEW_MAX with the shuffle decode asked for: per
                                * token, the tile scale bytes each 32-block admits (fp8_ranges:
                                * nb low bounds, then nb high bounds); NULL: fp8_acts checks the
                                * operands per item */
} fjob;

/* Rows [r0, r1) (relative to row0) of item it. */
static void item_rows(const fjob *j, int it, int *r0, int *r1) {
    int a0 = (j->tile0 + it) * ITEM - j->row0, a1 = a0 + ITEM;
    *r0 = a0 < 0 ? 0 : a0;
    *r1 = a1 > j->out ? j->out : a1;
}

/* FP8, FP8-dequantized and FP4 linears: no scalar tail (K % 32 == 0), outputs rounded to BF16 */
static inline int quantized(const fjob *j) { return j->kind == J_FP8 || j->kind == J_DQ || j->kind == J_FP4; }

static inline float finish(const fjob *j, float acc, int t, int n) {
    if (quantized(j)) return bf16r(acc);
    if (j->kv == j->in) return j->out_bf16 ? bf16r(acc) : acc;
    /* BF16 / FP32 tails, in K order after the vector part */
    const float *x = j->x + (size_t)t * j->x_stride;
    size_t rowoff = (size_t)n * j->in;
    for (int k = j->kv; k < j->in; k++) {
        float w = j->kind == J_BF16 ? ds41_bf16_to_f32(j->wb[rowoff + k]) : j->wf[rowoff + k];
        acc += x[k] * w;
    }
    return j->out_bf16 ? bf16r(acc) : acc;
}

/* 8 rows of one token per sum, rounded and stored side by side in y (linear_fast.h) */
void ds41_fast_store_outs(const float *acc, int T, int nr, float *y, size_t ys, int round) {
    float v[8];
    for (int t = 0; t < T; t++) {
        float *yt = y + (size_t)t * ys;
        for (int r = 0; r < nr; r += 8) {
            int n = nr - r < 8 ? nr - r : 8;
            __m256 s = hsumab8v(acc + ((size_t)r * T + t) * 16, (size_t)T * 16, n);
            if (round) s = ds41_bf16_round8(s);
            if (n == 8) {
                _mm256_storeu_ps(yt + r, s);
            } else {
                _mm256_storeu_ps(v, s);
                memcpy(yt + r, v, (size_t)n * sizeof(float));
            }
        }
    }
}

/* The outputs of rows [r0, r0 + nr) x T tokens from their accumulator blocks (mid, prefill). */
static void finish_acc(const fjob *j, int r0, int nr, const float *acc) {
    int T = j->T;
    float v[8];
    if (quantized(j) || j->kv == j->in) {   /* no tails */
        ds41_fast_store_outs(acc, T, nr, j->y + r0, j->y_stride, quantized(j) || j->out_bf16);
        return;
    }
    for (int r = 0; r < nr; r++)
        for (int t0 = 0; t0 < T; t0 += 8) {
            int n = T - t0 < 8 ? T - t0 : 8;
            _mm256_storeu_ps(v, hsumab8v(acc + ((size_t)r * T + t0) * 16, 16, n));
            for (int i = 0; i < n; i++)
                j->y[(size_t)(t0 + i) * j->y_stride + r0 + r] = finish(j, v[i], t0 + i, r0 + r);
        }
}

/* o = a * lut[st[b]] per 32-block b (the FP8 decodes' activation operands, no checks) */
static void fp8_scale(const float *a, const uint8_t *st, int nb, const float *lut, float *o) {
    for (int b = 0; b < nb; b++) {
        __m256 sc = _mm256_set1_ps(lut[st[b]]);
        for (int q = 0; q < 4; q++)
            _mm256_storeu_ps(o + 32 * b + 8 * q, _mm256_mul_ps(_mm256_loadu_ps(a + 32 * b + 8 * q), sc));
    }
}

/* FP8 T = 1 .. DS41_FEW_MAX: o = a * s_tile * 2^8 per 32 (the F16C decode's operand), or, with
 * shuffle set, a * s_tile * 2^120 (the shuffle decode's). Returns 0 when some shuffle operand is
 * not a finite FP32 with |v| >= 2^-14 or 0 (a * s_tile >= 2^8, a scale byte above 134, a NaN, or
 * an operand whose 2^8 twin would be subnormal): the caller then rebuilds with the 2^8 LUT, so
 * both decodes multiply the same exact products, e4m3 * a * s_tile, and give the same bits. */
static int fp8_acts(const float *a, const uint8_t *st, int nb, int shuffle, float *o) {
    const float *lut = shuffle ? ue8_lut120 : ue8_lut8;
    const __m256 am = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)), big = _mm256_set1_ps(FLT_MAX),
                 tiny = _mm256_set1_ps(p2(-14)), z = _mm256_setzero_ps();
    __m256 bad = z;
    for (int b = 0; b < nb; b++) {
        __m256 sc = _mm256_set1_ps(lut[st[b]]);
        for (int q = 0; q < 4; q++) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(a + 32 * b + 8 * q), sc);
            _mm256_storeu_ps(o + 32 * b + 8 * q, v);
            if (shuffle) {
                __m256 x = _mm256_and_ps(v, am);
                bad = _mm256_or_ps(bad, _mm256_cmp_ps(x, big, _CMP_NLE_UQ));
                bad = _mm256_or_ps(bad, _mm256_and_ps(_mm256_cmp_ps(x, tiny, _CMP_LT_OQ), _mm256_cmp_ps(x, z, _CMP_NEQ_OQ)));
            }
        }
    }
    return _mm256_movemask_ps(bad) == 0;
}

/* floor(log2 v) of a finite v > 0, subnormals included */
static inline int ilog2f(float v) {
    uint32_t u = ds41_f32_bits(v) & 0x7FFFFFFFu;
    int f = (int)(u >> 23);
    return f ? f - 127 : (31 - __builtin_clz(u)) - 149;
}

/* fp8_acts' range check moved out of the 32-row items: once per call and token, for each
 * 32-block of the activations a, the tile scale bytes e whose shuffle operands a * 2^(e - 7)
 * (ue8_lut120[e]) are all in range, as the interval [lo[b], hi[b]] (empty: lo 255, hi 0).
 * With Emax, Emin = floor(log2) of the block's largest and smallest nonzero |a|: an operand
 * overflows iff Emax + e - 7 >= 128 (a power-of-two scaling is exact below that), the real
 * product of one is below 2^-14 iff Emin + e - 7 < -14, every operand of e >= 135 is inf or NaN
 * (ue8_lut120 is inf there, NaN at 255) and a non-finite activation is never in range; so e is
 * admitted iff -7 - Emin <= e <= min(134, 134 - Emax) (an all-zero block: e <= 134). The same
 * verdict as fp8_acts but in one case: a nonzero operand that underflows to 0 passes fp8_acts
 * (it sees a zero) and is refused here; the item then takes F16C, whose operand (2^112 times
 * smaller) is 0 as well, so the bits are the same and only the fallback counter differs
 * (test_fp8_range_hoist). An item checks nb bytes instead of 32 floats per block
 * (fp8_range_ok) and only scales its activations. */
static void fp8_ranges(const float *a, int nb, uint8_t *lo, uint8_t *hi) {
    const __m256 am = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)), big = _mm256_set1_ps(FLT_MAX),
                 inf = _mm256_set1_ps(__builtin_inff()), z = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m256 mx = z, mn = inf, bad = z;
        for (int q = 0; q < 4; q++) {
            __m256 x = _mm256_and_ps(_mm256_loadu_ps(a + 32 * b + 8 * q), am);
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(x, big, _CMP_NLE_UQ));
            mx = _mm256_max_ps(mx, x);
            mn = _mm256_min_ps(mn, _mm256_blendv_ps(x, inf, _mm256_cmp_ps(x, z, _CMP_EQ_OQ)));
        }
        if (_mm256_movemask_ps(bad)) { lo[b] = 255; hi[b] = 0; continue; }
        float t[8], u[8], vmx = 0.0f, vmn = __builtin_inff();
        _mm256_storeu_ps(t, mx);
        _mm256_storeu_ps(u, mn);
        for (int i = 0; i < 8; i++) {
            vmx = t[i] > vmx ? t[i] : vmx;
            vmn = u[i] < vmn ? u[i] : vmn;
        }
        if (vmx == 0.0f) { lo[b] = 0; hi[b] = 134; continue; }
        int l = -7 - ilog2f(vmn), h = 134 - ilog2f(vmx);
        lo[b] = (uint8_t)(l < 0 ? 0 : l);          /* l <= 142 */
        hi[b] = (uint8_t)(h > 134 ? 134 : h);      /* h >= 7 */
    }
}

/* 1 when every tile scale byte st[b] lies in [lo[b], hi[b]] (fp8_ranges) */
static int fp8_range_ok(const uint8_t *st, const uint8_t *lo, const uint8_t *hi, int nb) {
    __m256i bad = _mm256_setzero_si256();
    int b = 0;
    for (; b + 32 <= nb; b += 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(st + b));
        __m256i l = _mm256_loadu_si256((const __m256i *)(lo + b)), h = _mm256_loadu_si256((const __m256i *)(hi + b));
        bad = _mm256_or_si256(bad, _mm256_xor_si256(_mm256_max_epu8(v, l), v));
        bad = _mm256_or_si256(bad, _mm256_xor_si256(_mm256_min_epu8(v, h), v));
    }
    if (!_mm256_testz_si256(bad, bad)) return 0;
    for (; b < nb; b++)
        if (st[b] < lo[b] || st[b] > hi[b]) return 0;
    return 1;
}

int ds41_fast_fp8_range_verdicts(const float *a, const uint8_t *st, int nb, int *per_item) {
    ds41_fast_ops_get();   /* the LUTs */
    void *ov = NULL;
    float *o = posix_memalign(&ov, 64, (size_t)nb * 32 * sizeof(float) + 64) == 0 ? ov : NULL;
    uint8_t *r = malloc((size_t)nb * 2);
    if (!o || !r) { free(o); free(r); *per_item = -1; return -1; }
    *per_item = fp8_acts(a, st, nb, 1, o);
    fp8_ranges(a, nb, r, r + nb);
    int v = fp8_range_ok(st, r, r + nb, nb);
    free(o);
    free(r);
    return v;
}

/* The ranges of T activation rows (row t at a + t * lda, K = 32 nb) into rng (2 nb bytes per
 * row), or NULL when the shuffle decode is not asked for or there is no memory (the items then
 * check their operands themselves). */
static uint8_t *fp8_rng_make(const ds41_fast_ops *ops, const float *a, size_t lda, int T, int nb) {
    if (!e4m3s_on(ops) || T > DS41_FEW_MAX) return NULL;
    uint8_t *r = malloc((size_t)T * 2 * nb);
    if (r)
        for (int t = 0; t < T; t++) fp8_ranges(a + (size_t)t * lda, nb, r + (size_t)t * 2 * nb, r + (size_t)t * 2 * nb + nb);
    return r;
}

/* The T activation rows of an FP8 item (row t at j->a + t * lda) into a2 (row stride in) for
 * the shuffle decode where it runs and every operand is in its range, else for F16C (counted
 * as a fallback when the shuffle decode was asked for). Returns 1 for the shuffle decode. */
static int fp8_item_acts(const fjob *j, const uint8_t *st, int T, float *a2) {
    int nb = j->in / 32, on = e4m3s_on(j->ops), sh = on;
    if (j->rng) {   /* the ranges of the call: the check is nb bytes, the activations scaled once */
        for (int t = 0; t < T && sh; t++)
            sh = fp8_range_ok(st, j->rng + (size_t)t * 2 * nb, j->rng + (size_t)t * 2 * nb + nb, nb);
        if (sh) {
            for (int t = 0; t < T; t++) fp8_scale(j->a + (size_t)t * j->lda, st, nb, ue8_lut120, a2 + (size_t)t * j->in);
            __atomic_fetch_add(&ds41_fast_e4m3s_items, 1, __ATOMIC_RELAXED);
            return 1;
        }
    } else {
        for (int t = 0; t < T && sh; t++) sh = fp8_acts(j->a + (size_t)t * j->lda, st, nb, 1, a2 + (size_t)t * j->in);
    }
    if (sh) {
        __atomic_fetch_add(&ds41_fast_e4m3s_items, 1, __ATOMIC_RELAXED);
        return 1;
    }
    if (on) __atomic_fetch_add(&ds41_fast_e4m3s_fallbacks, 1, __ATOMIC_RELAXED);
    for (int t = 0; t < T; t++) fp8_acts(j->a + (size_t)t * j->lda, st, nb, 0, a2 + (size_t)t * j->in);
    return 0;
}

/* T = 1: stream the item's rows once. a2 scratch: in floats. */
static void item_decode(const fjob *j, int r0, int r1, float *a2) {
    int in = j->in, nr = r1 - r0;
    float v[ITEM];
    switch (j->kind) {
    case J_FP8: case J_DQ: {
        int nbk = (in + 31) / 32, tile = (j->row0 + r0) / 32;
        const uint8_t *w = j->w + (size_t)(j->row0 + r0) * in;
        if (fp8_item_acts(j, j->s + (size_t)tile * nbk, 1, a2)) j->ops->dec_e4m3s(w, (size_t)in, nr, in, a2, v);
        else j->ops->dec_e4m3(w, (size_t)in, nr, in, a2, v);
        break;
    }
    case J_FP4: {
        int nb = in / 32;
        j->ops->dec_fp4(j->w + (size_t)r0 * (in / 2), (size_t)in / 2, j->s + (size_t)r0 * nb, (size_t)nb, nr, nb,
                        j->aw, j->sav, v);
        break;
    }
    case J_BF16:
        j->ops->dec_bf16(j->wb + (size_t)r0 * in, (size_t)in, nr, j->kv / 16, j->a, v);
        break;
    case J_F32:
        j->ops->dec_f32(j->wf + (size_t)r0 * in, (size_t)in, nr, j->kv / 8, j->a, v);
        break;
    }
    for (int r = 0; r < nr; r++) j->y[r0 + r] = finish(j, v[r], 0, r0 + r);
}

/* T = 2 .. DS41_FEW_MAX: stream the item's rows once for all T tokens (the decode order per
 * output, so every token gets its T = 1 bits). a2 scratch: T x in floats. */
static void item_few(const fjob *j, int r0, int r1, float *a2) {
    int in = j->in, nr = r1 - r0, T = j->T;
    float v[ITEM * DS41_FEW_MAX];
    switch (j->kind) {
    case J_FP8: case J_DQ: {
        int nbk = (in + 31) / 32, tile = (j->row0 + r0) / 32;
        const uint8_t *w = j->w + (size_t)(j->row0 + r0) * in;
        if (fp8_item_acts(j, j->s + (size_t)tile * nbk, T, a2)) j->ops->few_e4m3s(w, (size_t)in, nr, in, a2, (size_t)in, T, v);
        else j->ops->few_e4m3(w, (size_t)in, nr, in, a2, (size_t)in, T, v);
        break;
    }
    case J_FP4: {
        int nb = in / 32;
        j->ops->few_fp4(j->w + (size_t)r0 * (in / 2), (size_t)in / 2, j->s + (size_t)r0 * nb, (size_t)nb, nr, nb,
                        j->aw, j->ldaw, j->sav, j->ldsa, T, v);
        break;
    }
    case J_BF16:
        j->ops->few_bf16(j->wb + (size_t)r0 * in, (size_t)in, nr, j->kv / 16, j->a, j->lda, T, v);
        break;
    case J_F32:
        j->ops->few_f32(j->wf + (size_t)r0 * in, (size_t)in, nr, j->kv / 8, j->a, j->lda, T, v);
        break;
    }
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < T; t++)
            j->y[(size_t)t * j->y_stride + r0 + r] = finish(j, v[r * T + t], t, r0 + r);
}

/* K block of the mid path, a multiple of 64 (FP8 scale tiles, BF16 group pairs, FP4 block
 * pairs). AVX-512 (rows outer, all tokens per row): the block's activations fill 32 KiB (T x kb
 * floats) or, FP4, 36 KiB (3 bytes per element) of the 48 KiB L1 (measured best at T = 16
 * among 256 .. 1024). AVX2 (token passes outer, the item's rows inner): one pass's activations
 * and the item's 32 weight rows of the block fill the 32 KiB L1 of Zen 3 (FP4: 24 KiB;
 * measured at T = 12, 16, 32 against 16 and 24 KiB, on a noisy machine: T = 16 kb 512 for FP8,
 * 256 for BF16, 576 for FP4). */
static int mid_kb(const ds41_fast_ops *ops, int kind, int T) {
    if (ops == &ops_avx2) {   /* bytes per K of one token pass's activations and the item's 32 weight rows */
        int per = kind == J_FP4 ? 3 * mid_cmax(T, MIDC2Q) + 17 : 4 * mid_cmax(T, MIDC2) + 32;
        int kb = ((kind == J_FP4 ? 24576 : 32768) / per) & ~63;
        return kb < 64 ? 64 : kb > 1024 ? 1024 : kb;
    }
    int kb = ((kind == J_FP4 ? 12288 : 8192) / T) & ~63;
    return kb < 64 ? 64 : kb > 1024 ? 1024 : kb;
}

/* AVX2 FP4 takes the mid path up to the activation tile, T = 64 (measured at T = 40, 64: 1.5x
 * the panels' GMAC/s; FP8 on a par with them, so it stays at DS41_MID_MAX) */
#define MID_MAX_FP4_AVX2 TT

/* 1 if the mid path serves T rows of this kind with these ops */
int ds41_fast_mid_off;

static int mid_on(const ds41_fast_ops *ops, int kind, int T) {
    if (ds41_fast_mid_off) return 0;
    if (T <= DS41_FEW_MAX || T > (ops == &ops_avx2 && kind == J_FP4 ? MID_MAX_FP4_AVX2 : DS41_MID_MAX)) return 0;
    switch (kind) {
    case J_FP8: case J_DQ: return ops->mid_e4m3 != NULL;
    case J_FP4: return ops->mid_fp4 != NULL;
    case J_BF16: return ops->mid_bf16 != NULL;
    default: return 0;
    }
}

/* The mid kernels' activations, step-major over the whole K, built once per call: step i of
 * token t at (i * T + t) * step. Float rows (FP8: the Q8 values; FP8-dq: x; BF16: the
 * permuted rows, zero padded to 32): ns steps of `step` floats from rows at src + t * lds.
 * FP4: per 64 K, the 64 int16 words of aw then the 16 pair scales of sav (96 int16 units). */
static float *mid_acts_f(const float *src, size_t lds, int T, int ns, int step) {
    float *d = ds41_scratch(DS41_SCR_LIN_AM, (size_t)ns * T * step * sizeof(float));
    if (!d) return NULL;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < ns; i++)
            memcpy(d + ((size_t)i * T + t) * step, src + (size_t)t * lds + (size_t)i * step, (size_t)step * sizeof(float));
    return d;
}
static int16_t *mid_acts_q(const int16_t *aw, size_t ldaw, const float *sav, size_t ldsa, int T, int ngrp) {
    int16_t *d = ds41_scratch(DS41_SCR_LIN_AM, (size_t)ngrp * T * 96 * sizeof(int16_t));
    if (!d) return NULL;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < ngrp; i++) {
            int16_t *o = d + ((size_t)i * T + t) * 96;
            memcpy(o, aw + (size_t)t * ldaw + 64 * (size_t)i, 64 * sizeof(int16_t));
            memcpy(o + 64, sav + (size_t)t * ldsa + 16 * (size_t)i, 16 * sizeof(float));
        }
    return d;
}

/* T = DS41_FEW_MAX + 1 .. DS41_MID_MAX (ISAs with mid kernels): per K block of mid_kb(T), every
 * row of the item decoded once in registers for all T tokens (the decode order per output, the
 * accumulator blocks of prefill). */
static void item_mid(const fjob *j, int r0, int r1, float *acc) {
    int in = j->in, nr = r1 - r0, T = j->T, kb = mid_kb(j->ops, j->kind, T);
    memset(acc, 0, (size_t)nr * T * 16 * sizeof(float));
    for (int k0 = 0; k0 < j->kv; k0 += kb) {
        int kc = j->kv - k0 < kb ? j->kv - k0 : kb;
        switch (j->kind) {
        case J_FP8: case J_DQ: {   /* kc % 32 == 0: in % 32 == 0 on the fast road */
            int nbk = (in + 31) / 32, tile = (j->row0 + r0) / 32;
            j->ops->mid_e4m3(j->w + (size_t)(j->row0 + r0) * in + k0, (size_t)in, j->s + (size_t)tile * nbk + k0 / 32,
                             nr, kc, (const float *)j->am + (size_t)k0 * T, T, acc);
            break;
        }
        case J_FP4: {
            int nb = in / 32;
            j->ops->mid_fp4(j->w + (size_t)r0 * (in / 2) + k0 / 2, (size_t)in / 2, j->s + (size_t)r0 * nb + k0 / 32,
                            (size_t)nb, nr, kc / 32, (const int16_t *)j->am + (size_t)k0 / 64 * T * 96, T, acc);
            break;
        }
        case J_BF16:
            j->ops->mid_bf16(j->wb + (size_t)r0 * in + k0, (size_t)in, nr, kc / 16, (const float *)j->am + (size_t)k0 * T,
                             T, acc);
            break;
        }
    }
    finish_acc(j, r0, nr, acc);
}

/* The bytes of row r, K [k0, k0 + kc) of the job's weights: address and length. */
static const uint8_t *row_bytes(const fjob *j, int r, int k0, int kc, size_t *len) {
    switch (j->kind) {
    case J_FP8: case J_DQ: *len = (size_t)kc; return j->w + (size_t)(j->row0 + r) * j->in + k0;
    case J_FP4: *len = (size_t)kc / 2; return j->w + (size_t)r * (j->in / 2) + k0 / 2;
    case J_BF16: *len = (size_t)kc * 2; return (const uint8_t *)(j->wb + (size_t)r * j->in + k0);
    default: *len = (size_t)kc * 4; return (const uint8_t *)(j->wf + (size_t)r * j->in + k0);
    }
}

/* The next panel a thread decodes (rows [r0, r1), K [k0, k0 + kc)), prefetched into L2 one row
 * per row decoded, a whole panel's multiply ahead of its use: the 32 rows' short runs (256 bytes of
 * FP8 each) are too many scattered streams for the hardware prefetcher, and their misses
 * otherwise stall the decode. */
typedef struct { int r0, r1, k0, kc; } fpanel;

/* Decodes rows [r0, r1) x K [k0, k0 + kc) into the panel (row stride j->ops->kc): floats P (FP8 / DQ:
 * e4m3 * s_tile; BF16 in the activation order, zero padded to 32; FP32 as is) or, for FP4,
 * int16 words PW in the activation layout and pair scale vectors SW. Returns the number of
 * 8-chunks (float kinds) or blocks (FP4) of the panel.
 * nx: the panel to prefetch, row by row (NULL: none). bf (FP4): 1 asks for the BF16 road's panel
 * (pan_fp4b, no scale vectors), left at 1 when every row took it, set to 0 when the panel was
 * decoded for the int16 road instead. */
static int decode_panel(const fjob *j, int r0, int r1, int k0, int kc, float *P, int16_t *PW, float *SW,
                        const fpanel *nx, int *bf) {
    int in = j->in, pk = j->ops->kc;
    for (int r = r0; r < r1; r++) {
        if (nx && nx->r0 + (r - r0) < nx->r1) {
            size_t len;
            const uint8_t *b = row_bytes(j, nx->r0 + (r - r0), nx->k0, nx->kc, &len);
            for (size_t o = 0; o < len; o += 64) _mm_prefetch((const char *)b + o, _MM_HINT_T1);
        }
        float *pr = P + (size_t)(r - r0) * pk;
        size_t len;
        const uint8_t *c = row_bytes(j, r, k0, kc, &len);
        switch (j->kind) {
        case J_FP8: case J_DQ: {
            int nbk = (in + 31) / 32, ar = j->row0 + r;
            j->ops->pan_e4m3(c, j->s + (size_t)(ar / 32) * nbk + k0 / 32, kc, pr);
            break;
        }
        case J_FP4: {
            const uint8_t *st = j->s + (size_t)r * (in / 32) + k0 / 32;
            int16_t *pw = PW + (size_t)(r - r0) * pk;
            float *sw = SW + (size_t)(r - r0) * (pk / 4);
            int nblk = kc / 32, ngrp = (nblk + 1) / 2;
            if (*bf) {   /* the BF16 road; a row it refuses sends the whole panel to the int16 one */
                if (ds41_fast_bf16_avx512()->pan_fp4b(c, st, nblk, pw)) break;
                *bf = 0;
                __atomic_fetch_add(&ds41_fast_bf16_fallbacks, 1, __ATOMIC_RELAXED);
                r = r0 - 1;
                continue;
            }
            memset(pw, 0, (size_t)ngrp * 64 * sizeof(int16_t));
            memset(sw, 0, (size_t)ngrp * 16 * sizeof(float));
            for (int b = 0; b < nblk; b++) {
                __m256i we, wo;
                ds41_e2m1x32_i16(c + 16 * b, &we, &wo);
                int16_t *o = pw + 64 * (b >> 1) + 16 * (b & 1);
                _mm256_store_si256((__m256i *)o, we);
                _mm256_store_si256((__m256i *)(o + 32), wo);
                _mm256_store_ps(sw + 16 * (b >> 1) + 8 * (b & 1), _mm256_set1_ps(ue8_lut[st[b]]));
            }
            break;
        }
        case J_BF16: {
            const uint16_t *w = (const uint16_t *)c;
            const __m256i hm = _mm256_set1_epi32((int)0xFFFF0000);
            for (int g = 0; g < kc / 16; g++) {   /* kc is a multiple of 16 */
                __m256i v = _mm256_loadu_si256((const __m256i *)(w + 16 * g));
                float *o = pr + 32 * (g >> 1) + 8 * (g & 1);
                _mm256_store_ps(o, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
                _mm256_store_ps(o + 16, _mm256_castsi256_ps(_mm256_and_si256(v, hm)));
            }
            if ((kc / 16) & 1) {   /* a lone last group: its partner is zeros */
                float *o = pr + 32 * (kc / 32) + 8;
                _mm256_store_ps(o, _mm256_setzero_ps());
                _mm256_store_ps(o + 16, _mm256_setzero_ps());
            }
            break;
        }
        case J_F32:
            memcpy(pr, c, len);
            break;
        }
    }
    if (j->kind == J_FP4) return kc / 32;
    if (j->kind == J_BF16) return ((kc + 31) & ~31) / 8;
    return kc / 8;
}

/* T > 1: per K panel, decode the item's rows once, then run every token through it. */
static void item_prefill(const fjob *j, int r0, int r1, const fpanel *nxi, float *P, int16_t *PW, float *SW,
                         float *acc) {
    int nr = r1 - r0, T = j->T;
    if (j->kv <= 0) memset(acc, 0, (size_t)nr * T * 16 * sizeof(float));   /* only a scalar tail */
    for (int k0 = 0, pk = j->ops->kc; k0 < j->kv; k0 += pk) {   /* the first panel starts from +0 */
        int kc = j->kv - k0 < pk ? j->kv - k0 : pk;
        fpanel nx = { r0, r1, k0 + pk, j->kv - k0 - pk < pk ? j->kv - k0 - pk : pk };
        int bf = j->ab != NULL;
        int n = decode_panel(j, r0, r1, k0, kc, P, PW, SW, k0 + pk < j->kv ? &nx : nxi, &bf);
        if (j->kind == J_FP4 && bf) {
            __atomic_fetch_add(&ds41_fast_bf16_panels, 1, __ATOMIC_RELAXED);
            ds41_fast_bf16_avx512()->pf_fp4b(PW, nr, j->ab + k0, j->ldaw, j->sav + k0 / 4, j->ldsa, T, n, acc, k0 == 0);
        } else if (j->kind == J_FP4)
            j->ops->pf_fp4(PW, SW, nr, j->aw + k0, j->ldaw, j->sav + k0 / 4, j->ldsa, T, n, acc, k0 == 0);
        else
            j->ops->pf_float(P, nr, j->a + k0, j->lda, T, n, acc, k0 == 0);
    }
    finish_acc(j, r0, nr, acc);
}

/* The work items of a job on this thread; their buffers are the thread's scratch (kernels.h:
 * ds41_scratch), kept from call to call. */
static void fjob_items(void *arg, int i0, int i1) {
    const fjob *j = arg;
    float *a2 = NULL, *P = NULL, *SW = NULL, *acc = NULL;
    int16_t *PW = NULL;
    if (j->am) {
        acc = ds41_scratch(DS41_SCR_ITEM_ACC, (size_t)ITEM * j->T * 16 * sizeof(float));
        if (!acc) return;
    } else if (j->T <= DS41_FEW_MAX) {
        a2 = ds41_scratch(DS41_SCR_ITEM_A2, (size_t)j->T * j->in * sizeof(float));
        if (!a2) return;
    } else {
        int pk = j->ops->kc;
        P = ds41_scratch(DS41_SCR_ITEM_P, (size_t)ITEM * pk * sizeof(float));
        PW = ds41_scratch(DS41_SCR_ITEM_PW, (size_t)ITEM * pk * sizeof(int16_t));
        SW = ds41_scratch(DS41_SCR_ITEM_SW, (size_t)ITEM * (pk / 4) * sizeof(float));
        acc = ds41_scratch(DS41_SCR_ITEM_ACC, (size_t)ITEM * j->T * 16 * sizeof(float));
        if (!P || !PW || !SW || !acc) return;
    }
    for (int it = i0; it < i1; it++) {
        int r0, r1;
        item_rows(j, it, &r0, &r1);
        if (r1 <= r0) continue;
        if (j->T == 1) item_decode(j, r0, r1, a2);
        else if (j->T <= DS41_FEW_MAX) item_few(j, r0, r1, a2);
        else if (j->am) item_mid(j, r0, r1, acc);
        else {
            fpanel nx = { 0, 0, 0, 0 };   /* the next item's first panel */
            if (it + 1 < i1) {
                item_rows(j, it + 1, &nx.r0, &nx.r1);
                nx.kc = j->kv < j->ops->kc ? j->kv : j->ops->kc;
            }
            item_prefill(j, r0, r1, nx.r1 > nx.r0 ? &nx : NULL, P, PW, SW, acc);
        }
    }
}

static void fjob_run(const ds41_ctx *ctx, fjob *j) {
    int t_first = (j->row0) / ITEM, t_last = (j->row0 + j->out - 1) / ITEM;
    j->tile0 = t_first;
    int n_items = t_last - t_first + 1;
    if ((long long)j->out * j->in * j->T >= PAR_MIN_WORK) ds41_parallel_for(ctx, n_items, fjob_items, j);
    else fjob_items(j, 0, n_items);
}

/* ---------------------------------------------------------------- entry points */

/* The dot order's activations of a tile (TT tokens at most): Q8 values into a (token stride in),
 * the words into ad (token stride ldad), per token whether they are exact and their exponents */
typedef struct dacts_job {
    const float *x;
    int in;
    float *a;
    uint16_t *ad;
    size_t ldad;
    int ok[TT], emin[TT], emax[TT];
} dacts_job;

static void dacts_rows(void *arg, int t0, int t1) {
    dacts_job *d = arg;
    for (int t = t0; t < t1; t++) {
        float *ar = d->a + (size_t)t * d->in;
        ds41_fast_q8_row(d->x + (size_t)t * d->in, d->in, 1.0f, ar);
        d->emin[t] = 255;
        d->emax[t] = 0;
        d->ok[t] = ds41_fast_bf16_avx512()->dot_acts(ar, d->in, d->ad + (size_t)t * d->ldad, &d->emin[t], &d->emax[t]);
    }
}

void ds41_fast_qlin(const ds41_ctx *ctx, const uint8_t *w, const uint8_t *s, int fp4, int out, int in,
                    const float *x, int T, float *y) {
    const ds41_fast_ops *ops = ds41_fast_ops_get();
    int tt = T < TT ? T : TT;
    int ngrp = (in / 32 + 1) / 2;
    size_t ldaw = (size_t)ngrp * 64, ldsa = (size_t)ngrp * 16;
    /* the activation tile: this thread's scratch (kernels.h), kept from call to call */
    float *a = ds41_scratch(DS41_SCR_LIN_A, (size_t)tt * in * sizeof(float));
    int16_t *aw = fp4 ? ds41_scratch(DS41_SCR_LIN_AW, (size_t)tt * ldaw * sizeof(int16_t)) : NULL;
    float *sav = fp4 ? ds41_scratch(DS41_SCR_LIN_SAV, (size_t)tt * ldsa * sizeof(float)) : NULL;
    int16_t *ab = NULL;   /* the BF16 road's activation words, taken at first use */
    int srng[2] = { -1, -1 };   /* the range of the scale bytes, read by the first tile that needs it */
    if (!a || (fp4 && (!aw || !sav))) return;
    for (int t0 = 0; t0 < T; t0 += tt) {
        int nt = T - t0 < tt ? T - t0 : tt;
        if (fp4 && nt > DS41_FEW_MAX && bf16_of(ops) && __atomic_load_n(&ds41_fast_bf16_on, __ATOMIC_RELAXED) == 2 &&
            !mid_on(ops, J_FP4, nt)) {
            /* the dot order (linear_avx512bf16.c): its activation words straight from the Q8
             * values, the tokens split between the threads */
            if (!ab) ab = ds41_scratch(DS41_SCR_LIN_AB, (size_t)tt * ldaw * sizeof(int16_t));
            if (ab) {
                dacts_job dj = { x + (size_t)t0 * in, in, a, (uint16_t *)ab, ldaw, { 0 }, { 0 }, { 0 } };
                if ((long long)nt * in >= 16384) ds41_parallel_for(ctx, nt, dacts_rows, &dj);
                else dacts_rows(&dj, 0, nt);
                int ok = 1, emin = 255, emax = 0;
                for (int t = 0; t < nt; t++) {
                    ok &= dj.ok[t];
                    emin = dj.emin[t] < emin ? dj.emin[t] : emin;
                    emax = dj.emax[t] > emax ? dj.emax[t] : emax;
                }
                if (ok && ds41_fast_bf16_avx512()->dot_fp4(ctx, w, s, out, in, (const uint16_t *)ab, ldaw, nt, emin, emax,
                                                           y + (size_t)t0 * out, (size_t)out, srng)) {
                    __atomic_fetch_add(&ds41_fast_fp4_dot_tiles, 1, __ATOMIC_RELAXED);
                    continue;
                }
            }
            __atomic_fetch_add(&ds41_fast_fp4_dot_refused, 1, __ATOMIC_RELAXED);
        }
        for (int t = 0; t < nt; t++) {
            float *ar = a + (size_t)t * in;
            ds41_fast_q8_row(x + (size_t)(t0 + t) * in, in, 1.0f, ar);
            if (fp4) fp4_act_row(ar, in, aw + (size_t)t * ldaw, sav + (size_t)t * ldsa);
        }
        /* FP8 calls of 2 .. 8 tokens on vdpbf16ps, the rows streamed once (the same bits; T = 1
         * keeps the FMA road's VBMI decode, as fast there: performance.md) */
        if (!fp4 && nt >= 2 && nt <= DS41_FEW_MAX && ds41_fast_fp8_few && bf16_of(ops) &&
            ds41_fast_bf16_avx512()->few_fp8(ctx, w, s, 0, out, in, a, (size_t)in, nt, y + (size_t)t0 * out, (size_t)out,
                                             srng))
            continue;
        /* FP8 tiles of 9 .. 64 tokens on vdpbf16ps (the same bits; linear_avx512bf16.c), before
         * the mid kernels (1.2-1.4x them at T = 9, 2-2.8x at T = 32: performance.md), the FMA
         * road where refused */
        if (!fp4 && nt > DS41_FEW_MAX && bf16_of(ops) &&
            ds41_fast_bf16_avx512()->dense_fp8(ctx, w, s, 0, out, in, a, (size_t)in, nt, y + (size_t)t0 * out, (size_t)out,
                                               ue8_lut8, srng))
            continue;
        /* FP4 tiles of 9 .. 64 tokens on the canonical BF16 road in wide panels (the same bits),
         * before the mid kernels and the 256-wide panels; the int16 road where refused */
        int abok = 0;   /* ab holds this tile's words as BF16 (both BF16 FP4 roads read them) */
        if (fp4 && nt > DS41_FEW_MAX && bf16_of(ops)) {
            if (!ab) ab = ds41_scratch(DS41_SCR_LIN_AB, (size_t)tt * ldaw * sizeof(int16_t));
            abok = ab && fp4_words_bf16(aw, (size_t)nt * ldaw, ab);
            if (abok && ds41_fast_bf16_avx512()->dense_fp4(ctx, w, s, out, in, ab, ldaw, sav, ldsa, nt,
                                                           y + (size_t)t0 * out, (size_t)out, srng))
                continue;
        }
        fjob j = { ops, fp4 ? J_FP4 : J_FP8, w, s, NULL, NULL, 0, out, in, nt, in, a, (size_t)in,
                   aw, ldaw, sav, ldsa, NULL, 0, y + (size_t)t0 * out, (size_t)out, 1, 0, NULL, NULL, NULL };
        void *am = NULL;
        if (mid_on(ops, j.kind, nt)) {
            am = fp4 ? (void *)mid_acts_q(aw, ldaw, sav, ldsa, nt, ngrp) : (void *)mid_acts_f(a, (size_t)in, nt, in / 16, 16);
            j.am = am;   /* NULL (out of memory): the prefill panels */
        }
        if (fp4 && !j.am && abok) j.ab = ab;   /* the 256-wide BF16 panels; else the int16 road */
        uint8_t *rng = fp4 ? NULL : fp8_rng_make(ops, a, (size_t)in, nt, in / 32);
        j.rng = rng;
        fjob_run(ctx, &j);
        free(rng);   /* am is this thread's scratch (kept) */
    }
}

void ds41_fast_dense(const ds41_ctx *ctx, int kind, const uint16_t *wb, const float *wf, const ds41_fp8w *w8,
                     int row0, int out, int in, const float *x, int x_stride, int T, float *y, int y_stride,
                     int out_bf16) {
    const ds41_fast_ops *ops = ds41_fast_ops_get();
    int jk = kind == 0 ? J_BF16 : kind == 1 ? J_F32 : J_DQ;
    int kv = jk == J_BF16 ? in & ~15 : jk == J_F32 ? in & ~7 : in;
    int tt = T < TT ? T : TT;
    size_t ldp = (size_t)((in + 31) & ~31);
    float *a = NULL;
    int srng[2] = { -1, -1 };   /* the dequantized FP8's scale range, read by the first tile that needs it */
    if (jk == J_BF16) {
        a = ds41_scratch(DS41_SCR_LIN_A, (size_t)tt * ldp * sizeof(float));
        if (!a) return;
    }
    for (int t0 = 0; t0 < T; t0 += tt) {
        int nt = T - t0 < tt ? T - t0 : tt;
        const float *xt = x + (size_t)t0 * x_stride;
        const float *ap = xt;
        size_t lda = (size_t)x_stride;
        /* the dequantized FP8 linear's tiles of 9 .. 64 tokens on vdpbf16ps (the same bits), as
         * ds41_fast_qlin's FP8 */
        if (jk == J_DQ && nt > DS41_FEW_MAX && bf16_of(ops) &&
            ds41_fast_bf16_avx512()->dense_fp8(ctx, w8->w, w8->s, row0, out, in, xt, lda, nt, y + (size_t)t0 * y_stride,
                                               (size_t)y_stride, ue8_lut8, srng))
            continue;
        if (jk == J_DQ && nt >= 2 && nt <= DS41_FEW_MAX && ds41_fast_fp8_few && bf16_of(ops) &&
            ds41_fast_bf16_avx512()->few_fp8(ctx, w8->w, w8->s, row0, out, in, xt, lda, nt, y + (size_t)t0 * y_stride,
                                             (size_t)y_stride, srng))
            continue;
        if (jk == J_BF16) {
            for (int t = 0; t < nt; t++) perm_bf16_row(xt + (size_t)t * x_stride, in, a + (size_t)t * ldp);
            ap = a;
            lda = ldp;
        }
        fjob j = { ops, jk, w8 ? w8->w : NULL, w8 ? w8->s : NULL, wb, wf, row0, out, in, nt, kv, ap, lda,
                   NULL, 0, NULL, 0, xt, (size_t)x_stride, y + (size_t)t0 * y_stride, (size_t)y_stride, out_bf16, 0,
                   NULL, NULL, NULL };
        float *am = NULL;
        if (mid_on(ops, jk, nt)) {
            am = jk == J_BF16 ? mid_acts_f(ap, lda, nt, (kv + 31) / 32, 32) : mid_acts_f(ap, lda, nt, in / 16, 16);
            j.am = am;   /* NULL (out of memory): the prefill panels */
        }
        uint8_t *rng = jk == J_DQ ? fp8_rng_make(ops, ap, lda, nt, in / 32) : NULL;
        j.rng = rng;
        fjob_run(ctx, &j);
        free(rng);   /* am is this thread's scratch (kept) */
    }
}
