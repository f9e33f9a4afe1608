/* ds41 fast linears, AVX-512 (F/BW/VL/DQ + VNNI) implementation of the canonical order of
 * linear_fast.c: one zmm register holds the accumulators A (lanes 0-7) and B (lanes 8-15),
 * so each instruction consumes two consecutive chunks (FP8 / FP32: 2 x 8 elements; BF16:
 * 2 x 16; FP4: 2 blocks of 32) exactly as the AVX2 code does with two registers: the results
 * are bit-identical (tested). Odd tails go to A through zero-extended operands (fma(0, 0, B)
 * = B, B is never -0).
 *
 * The file is compiled for the target below (GCC's target pragma, the same as
 * __attribute__((target(...))) on every function), so the binary still runs on AVX2-only
 * machines: linear_fast.c calls in only when CPUID reports the features. clang ignores the GCC
 * pragma; it gets the same target through `#pragma clang attribute` on every function defined
 * after the includes (the fuzz and ThreadSanitizer builds use clang). */
#ifndef __clang__
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#endif
#include "linear_fast.h"
#include "formats.h"

#include <immintrin.h>
#include <string.h>

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"))), apply_to = function)
#endif
/* after the push: clang gives these this file's target (hsum.h) */
#include "hsum512.h"

#define KC DS41_KC
#define PFD 1024
/* prefetch distance per row stream of the T = 1 decode kernels: 2048 against 1024 on the Zen 5
 * of docs/performance.md (bench_kernels --best --huge, one thread, interleaved call by call):
 * BF16 1.13-1.28x, FP4 w1 1.06-1.14x and w2 0.98-1.02x, FP8 0.97-1.12x */
#define DPFD 2048
#define UNROLL _Pragma("GCC unroll 8")

static inline __m512 zext(__m256 v) { return _mm512_zextps256_ps512(v); }

static float ue8_lut[256];    /* ue8m0(e) */
static float ue8_lut8[256];   /* ue8m0(e) * 2^8 (FP8 tile scale with the FP16 decode's 2^8) */
static int lut_ready;
static void lut_fill(void) {
    if (__atomic_load_n(&lut_ready, __ATOMIC_ACQUIRE)) return;
    for (int e = 0; e < 256; e++) {
        ue8_lut[e] = ds41_ue8m0_to_f32((uint8_t)e);
        ue8_lut8[e] = ue8_lut[e] * 256.0f;
    }
    __atomic_store_n(&lut_ready, 1, __ATOMIC_RELEASE);
}

/* 16 E4M3 codes -> e4m3 * 2^-8 */
static inline __m512 e4m3x16_h(const uint8_t *p) {
    __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16((short)0xBFFF)));
}
static inline __m256 e4m3x8_h(const uint8_t *p) {
    __m128i b = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(b, 7), _mm_set1_epi16((short)0xBFFF)));
}

/* Shuffle decode (the fast linears' DS41_E4M3 choice, linear_fast.h): 16 codes broadcast to the
 * four 128-bit lanes, one in-lane byte shuffle (ds41_shuf_e4m3, AVX2's table read whole) puts
 * code 4 L + i at the top byte of dword i of lane L, an arithmetic shift right by 4 and a mask
 * give the FP32 pattern of e4m3 * 2^-120 (as AVX2's e4m3x16_s; codes with e = 0 are FP32
 * subnormals, exactly the E4M3 subnormals times 2^-120). Three single-uop ops per 16 weights
 * against F16C's four (vcvtph2ps zmm is two). */
static inline __m512 e4m3_s(__m128i codes) {
    __m512i x = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(codes), _mm512_load_si512(ds41_shuf_e4m3));
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_srai_epi32(x, 4), _mm512_set1_epi32((int)0x87F00000)));
}
static inline __m512 e4m3x16_s(const uint8_t *p) { return e4m3_s(_mm_loadu_si128((const __m128i *)p)); }
/* 8 codes (reads 8 bytes): lanes 8..15 are +0, as zext(e4m3x8_h) */
static inline __m512 e4m3x8_s(const uint8_t *p) { return e4m3_s(_mm_loadl_epi64((const __m128i *)p)); }
static inline __m512 e4m3x8_hz(const uint8_t *p) { return zext(e4m3x8_h(p)); }

/* VBMI decode (DS41_E4M3=vbmi, auto on AMD CPUs with AVX-512 VBMI): 32 codes, one byte permute
 * with zeroing (vpermb) puts code i at byte 1 and code 16 + i at byte 3 of dword i; vpmaddwd by
 * 4096 (the low word, (int8) c * 256, times 2^12, the high word times 0) gives (int8) c * 2^20
 * for the first 16, an arithmetic shift by 4 the same for the second 16, and the mask leaves
 * sign (bit 31) and eeeemmm (bits 26..20): e4m3 * 2^-120, e4m3_s's FP32 patterns, bit for bit.
 * Per 32 weights one load, one permute, one multiply-add, one shift, two masks and two FMAs,
 * against two broadcasts, two shuffles, two shifts and two masks; the shift and the shuffles
 * share two of Zen's four vector pipes, vpmaddwd takes another. */
static const uint8_t perm_e4m3v[64] __attribute__((aligned(64))) = {
    0, 0, 0, 16, 0, 1, 0, 17, 0, 2, 0, 18, 0, 3, 0, 19, 0, 4, 0, 20, 0, 5, 0, 21, 0, 6, 0, 22, 0, 7, 0, 23,
    0, 8, 0, 24, 0, 9, 0, 25, 0, 10, 0, 26, 0, 11, 0, 27, 0, 12, 0, 28, 0, 13, 0, 29, 0, 14, 0, 30, 0, 15, 0, 31 };
__attribute__((target("avx512vbmi"))) static inline void e4m3x32_v(const uint8_t *p, __m512i idx, __m512 *v0,
                                                                   __m512 *v1) {
    __m512i x = _mm512_maskz_permutexvar_epi8(0xAAAAAAAAAAAAAAAAull, idx,
                                              _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p)));
    const __m512i m = _mm512_set1_epi32((int)0x87F00000);
    *v0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_madd_epi16(x, _mm512_set1_epi32(4096)), m));
    *v1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_srai_epi32(x, 4), m));
}

/* ---------------------------------------------------------------- decode */

#define DOT8(R, X, D16, D8)                                                                           \
    static void dot8##X##_##R(const uint8_t *w, size_t ld, int in, const float *a2, float *out) {    \
        __m512 c[R];                                                                              \
        UNROLL for (int r = 0; r < R; r++) c[r] = _mm512_setzero_ps();                            \
        const int nxt = (size_t)R * ld <= DS41_PF_NEXT_MAX;                                       \
        int k = 0;                                                                                \
        for (; k + 16 <= in; k += 16) {                                                           \
            if (!(k & 63)) {                                                                      \
                if (nxt) ds41_pf_next(w, ld, (size_t)k, R);                                       \
                else ds41_pf_rows(w, ld, (size_t)k + DPFD, R);                                    \
            }                                                                                     \
            __m512 a = _mm512_loadu_ps(a2 + k);                                                   \
            UNROLL for (int r = 0; r < R; r++) c[r] = _mm512_fmadd_ps(D16(w + r * ld + k), a, c[r]); \
        }                                                                                         \
        if (k < in) UNROLL for (int r = 0; r < R; r++)                                            \
            c[r] = _mm512_fmadd_ps(D8(w + r * ld + k), zext(_mm256_loadu_ps(a2 + k)), c[r]);     \
        UNROLL for (int r = 0; r < R; r++) out[r] = hsum16(c[r]);                                 \
    }
DOT8(8, , e4m3x16_h, e4m3x8_hz) DOT8(1, , e4m3x16_h, e4m3x8_hz)
DOT8(8, s, e4m3x16_s, e4m3x8_s) DOT8(1, s, e4m3x16_s, e4m3x8_s)

/* dot8s_8 with the VBMI decode, 64 codes a row per step (one prefetch per step, no test per 16),
 * the 8 row addresses from two bases and two offsets (ld, 3 ld; 2 ld as a scaled index): the
 * 16-code loop of DOT8 kept 6 of its 8 row offsets in vector registers for want of GPRs and
 * moved them back every step. The FMAs on each row's accumulator in DOT8's order (pairs of
 * chunks in increasing K), so the same bits. The 16- and 8-code tails as dot8s_8. */
#define ROW8(q0, q4, ld, l3, r) ((r) < 4 ? ((r) == 0 ? (q0) : (r) == 1 ? (q0) + (ld) : (r) == 2 ? (q0) + 2 * (ld) : (q0) + (l3)) \
                                         : ((r) == 4 ? (q4) : (r) == 5 ? (q4) + (ld) : (r) == 6 ? (q4) + 2 * (ld) : (q4) + (l3)))
__attribute__((target("avx512vbmi"))) static void dot8v_8(const uint8_t *w, size_t ld, int in, const float *a2, float *out) {
    const __m512i idx = _mm512_load_si512(perm_e4m3v);
    __m512 c[8];
    UNROLL for (int r = 0; r < 8; r++) c[r] = _mm512_setzero_ps();
    const int nxt = (size_t)8 * ld <= DS41_PF_NEXT_MAX;
    const size_t l3 = 3 * ld;
    int k = 0;
    for (; k + 64 <= in; k += 64) {
        if (nxt) ds41_pf_next(w, ld, (size_t)k, 8);
        else ds41_pf_rows(w, ld, (size_t)k + DPFD, 8);
        const uint8_t *q0 = w + k, *q4 = q0 + 4 * ld;
        UNROLL for (int j = 0; j < 2; j++) {
            __m512 a0 = _mm512_loadu_ps(a2 + k + 32 * j), a1 = _mm512_loadu_ps(a2 + k + 32 * j + 16);
            UNROLL for (int r = 0; r < 8; r++) {
                __m512 v0, v1;
                e4m3x32_v(ROW8(q0, q4, ld, l3, r) + 32 * j, idx, &v0, &v1);
                c[r] = _mm512_fmadd_ps(v0, a0, c[r]);
                c[r] = _mm512_fmadd_ps(v1, a1, c[r]);
            }
        }
    }
    for (; k + 16 <= in; k += 16) {
        __m512 a = _mm512_loadu_ps(a2 + k);
        UNROLL for (int r = 0; r < 8; r++) c[r] = _mm512_fmadd_ps(e4m3x16_s(w + r * ld + k), a, c[r]);
    }
    if (k < in) UNROLL for (int r = 0; r < 8; r++)
        c[r] = _mm512_fmadd_ps(e4m3x8_s(w + r * ld + k), zext(_mm256_loadu_ps(a2 + k)), c[r]);
    UNROLL for (int r = 0; r < 8; r++) out[r] = hsum16(c[r]);
}

static void dec_e4m3(const uint8_t *w, size_t ld, int nr, int in, const float *a2, float *out) {
    int r = 0;
    for (; r + 8 <= nr; r += 8) dot8_8(w + (size_t)r * ld, ld, in, a2, out + r);
    for (; r < nr; r++) dot8_1(w + (size_t)r * ld, ld, in, a2, out + r);
}
static void dec_e4m3s(const uint8_t *w, size_t ld, int nr, int in, const float *a2, float *out) {
    int r = 0;
    if (ds41_fast_e4m3_vbmi())
        for (; r + 8 <= nr; r += 8) dot8v_8(w + (size_t)r * ld, ld, in, a2, out + r);
    for (; r + 8 <= nr; r += 8) dot8s_8(w + (size_t)r * ld, ld, in, a2, out + r);
    for (; r < nr; r++) dot8s_1(w + (size_t)r * ld, ld, in, a2, out + r);
}

/* 32 packed bytes (two blocks) -> int16 2*e2m1: *we even elements, *wo odd (64 elements) */
static inline void e2m1x64_i16(const uint8_t *p, __m512i tab, __m512i *we, __m512i *wo) {
    __m512i z = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p));
    *we = _mm512_permutexvar_epi16(z, tab);                        /* index: low 5 bits (table repeats) */
    *wo = _mm512_permutexvar_epi16(_mm512_srli_epi16(z, 4), tab);
}
static const int16_t e2m1_tab32[32] __attribute__((aligned(64))) = {
    0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
    0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };
static inline __m512i e2m1_tab(void) { return _mm512_load_si512(e2m1_tab32); }

#define DOT4(R)                                                                                       \
    static void dot4_##R(const uint8_t *w, size_t ld, const uint8_t *s, size_t lds, int nb,          \
                         const int16_t *aw, const float *sav, float *out) {                       \
        const __m512i tab = e2m1_tab();                                                           \
        __m512 c[R];                                                                              \
        UNROLL for (int r = 0; r < R; r++) c[r] = _mm512_setzero_ps();                            \
        int b = 0;                                                                                \
        for (; b + 2 <= nb; b += 2) {                                                             \
            if (!(b & 3)) ds41_pf_rows(w, ld, (size_t)16 * b + DPFD, R);                          \
            __m512i ae = _mm512_load_si512(aw + 32 * b), ao = _mm512_load_si512(aw + 32 * b + 32);   \
            __m512 sa = _mm512_load_ps(sav + 8 * b);                                              \
            UNROLL for (int r = 0; r < R; r++) {                                                  \
                __m512i we, wo;                                                                   \
                e2m1x64_i16(w + r * ld + 16 * b, tab, &we, &wo);                                  \
                __m512i d = _mm512_dpwssd_epi32(_mm512_madd_epi16(we, ae), wo, ao);               \
                __m512 sw = _mm512_mask_mov_ps(_mm512_set1_ps(ue8_lut[s[r * lds + b]]), 0xFF00,   \
                                               _mm512_set1_ps(ue8_lut[s[r * lds + b + 1]]));      \
                c[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d), sw), sa, c[r]);       \
            }                                                                                     \
        }                                                                                         \
        if (b < nb) {                                                                             \
            __m256i ae = _mm256_load_si256((const __m256i *)(aw + 32 * b));                       \
            __m256i ao = _mm256_load_si256((const __m256i *)(aw + 32 * b + 32));                  \
            __m256 sa = _mm256_load_ps(sav + 8 * b);                                              \
            UNROLL for (int r = 0; r < R; r++) {                                                  \
                __m256i we, wo;                                                                   \
                ds41_e2m1x32_i16(w + r * ld + 16 * b, &we, &wo);                                  \
                __m256i d = _mm256_add_epi32(_mm256_madd_epi16(we, ae), _mm256_madd_epi16(wo, ao)); \
                __m256 x = _mm256_mul_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(ue8_lut[s[r * lds + b]])); \
                c[r] = _mm512_fmadd_ps(zext(x), zext(sa), c[r]);                                  \
            }                                                                                     \
        }                                                                                         \
        UNROLL for (int r = 0; r < R; r++) out[r] = hsum16(c[r]);                                 \
    }
DOT4(4) DOT4(1)

static void dec_fp4(const uint8_t *w, size_t ld, const uint8_t *s, size_t lds, int nr, int nb,
                    const int16_t *aw, const float *sav, float *out) {
    lut_fill();
    int r = 0;
    for (; r + 4 <= nr; r += 4) dot4_4(w + (size_t)r * ld, ld, s + (size_t)r * lds, lds, nb, aw, sav, out + r);
    for (; r < nr; r++) dot4_1(w + (size_t)r * ld, ld, s + (size_t)r * lds, lds, nb, aw, sav, out + r);
}

#define DOTB(R)                                                                                       \
    static void dotb_##R(const uint16_t *w, size_t ld, int n16, const float *a, float *out) {        \
        const __m512i hm = _mm512_set1_epi32((int)0xFFFF0000);                                    \
        __m512 c[R];                                                                              \
        UNROLL for (int r = 0; r < R; r++) c[r] = _mm512_setzero_ps();                            \
        int g = 0;                                                                                \
        for (; g + 2 <= n16; g += 2) {                                                            \
            ds41_pf_rows(w, 2 * ld, (size_t)32 * g + DPFD, R);                                    \
            __m512 ae = _mm512_loadu_ps(a + 16 * g), ao = _mm512_loadu_ps(a + 16 * g + 16);      \
            UNROLL for (int r = 0; r < R; r++) {                                                  \
                __m512i v = _mm512_loadu_si512(w + r * ld + 16 * g);                              \
                c[r] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), ae, c[r]);  \
                c[r] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v, hm)), ao, c[r]);   \
            }                                                                                     \
        }                                                                                         \
        if (g < n16) {                                                                            \
            __m256 ae = _mm256_loadu_ps(a + 16 * g), ao = _mm256_loadu_ps(a + 16 * g + 16);      \
            UNROLL for (int r = 0; r < R; r++) {                                                  \
                __m256i v = _mm256_loadu_si256((const __m256i *)(w + r * ld + 16 * g));           \
                c[r] = _mm512_fmadd_ps(zext(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16))), zext(ae), c[r]); \
                c[r] = _mm512_fmadd_ps(zext(_mm256_castsi256_ps(_mm256_and_si256(v, _mm512_castsi512_si256(hm)))), zext(ao), c[r]); \
            }                                                                                     \
        }                                                                                         \
        UNROLL for (int r = 0; r < R; r++) out[r] = hsum16(c[r]);                                 \
    }
DOTB(4) DOTB(1)

static void dec_bf16(const uint16_t *w, size_t ld, int nr, int n16, const float *a, float *out) {
    int r = 0;
    for (; r + 4 <= nr; r += 4) dotb_4(w + (size_t)r * ld, ld, n16, a, out + r);
    for (; r < nr; r++) dotb_1(w + (size_t)r * ld, ld, n16, a, out + r);
}

#define DOTF(R)                                                                                       \
    static void dotf_##R(const float *w, size_t ld, int n8, const float *a, float *out) {            \
        __m512 c[R];                                                                              \
        UNROLL for (int r = 0; r < R; r++) c[r] = _mm512_setzero_ps();                            \
        int g = 0;                                                                                \
        for (; g + 2 <= n8; g += 2) {                                                             \
            ds41_pf_rows(w, 4 * ld, (size_t)32 * g + PFD, R);                                     \
            __m512 av = _mm512_loadu_ps(a + 8 * g);                                               \
            UNROLL for (int r = 0; r < R; r++) c[r] = _mm512_fmadd_ps(_mm512_loadu_ps(w + r * ld + 8 * g), av, c[r]); \
        }                                                                                         \
        if (g < n8) UNROLL for (int r = 0; r < R; r++)                                            \
            c[r] = _mm512_fmadd_ps(zext(_mm256_loadu_ps(w + r * ld + 8 * g)), zext(_mm256_loadu_ps(a + 8 * g)), c[r]); \
        UNROLL for (int r = 0; r < R; r++) out[r] = hsum16(c[r]);                                 \
    }
DOTF(4) DOTF(1)

static void dec_f32(const float *w, size_t ld, int nr, int n8, const float *a, float *out) {
    int r = 0;
    for (; r + 4 <= nr; r += 4) dotf_4(w + (size_t)r * ld, ld, n8, a, out + r);
    for (; r < nr; r++) dotf_1(w + (size_t)r * ld, ld, n8, a, out + r);
}

/* ---------------------------------------------------------------- few rows (T = 2 .. 8) */

/* One weight row streamed once for C <= 8 tokens, one zmm (A | B) per token fed as the decode
 * kernels feed theirs. */
#define FEW8(C, X, D16, D8)                                                                           \
    static void few8##X##_##C(const uint8_t *w, int in, const float *a2, size_t lda, float *out) {   \
        __m512 c[C];                                                                              \
        UNROLL for (int t = 0; t < C; t++) c[t] = _mm512_setzero_ps();                            \
        int k = 0;                                                                                \
        for (; k + 16 <= in; k += 16) {                                                           \
            if (!(k & 63)) _mm_prefetch((const char *)(w + k + PFD), _MM_HINT_T0);                \
            __m512 wv = D16(w + k);                                                               \
            UNROLL for (int t = 0; t < C; t++) c[t] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(a2 + t * lda + k), c[t]); \
        }                                                                                         \
        if (k < in) {                                                                             \
            __m512 wv = D8(w + k);                                                                \
            UNROLL for (int t = 0; t < C; t++)                                                    \
                c[t] = _mm512_fmadd_ps(wv, zext(_mm256_loadu_ps(a2 + t * lda + k)), c[t]);        \
        }                                                                                         \
        UNROLL for (int t = 0; t < C; t++) out[t] = hsum16(c[t]);                                 \
    }
#define FEW8H(C) FEW8(C, , e4m3x16_h, e4m3x8_hz)
#define FEW8S(C) FEW8(C, s, e4m3x16_s, e4m3x8_s)
FEW8H(1) FEW8H(2) FEW8H(3) FEW8H(4) FEW8H(5) FEW8H(6) FEW8H(7) FEW8H(8)
FEW8S(1) FEW8S(2) FEW8S(3) FEW8S(4) FEW8S(5) FEW8S(6) FEW8S(7) FEW8S(8)
typedef void (*few8_fn)(const uint8_t *, int, const float *, size_t, float *);
static const few8_fn few8_k[8] = { few8_1, few8_2, few8_3, few8_4, few8_5, few8_6, few8_7, few8_8 };
static const few8_fn few8s_k[8] = { few8s_1, few8s_2, few8s_3, few8s_4, few8s_5, few8s_6, few8s_7, few8s_8 };

static void few_e4m3_k(const few8_fn *k, const uint8_t *w, size_t ld, int nr, int in, const float *a2, size_t lda,
                       int T, float *out) {
    for (int r = 0; r < nr; r++)
        for (int t0 = 0; t0 < T; t0 += 8) {
            int C = T - t0 < 8 ? T - t0 : 8;
            k[C - 1](w + (size_t)r * ld, in, a2 + (size_t)t0 * lda, lda, out + (size_t)r * T + t0);
        }
}
static void few_e4m3(const uint8_t *w, size_t ld, int nr, int in, const float *a2, size_t lda, int T, float *out) {
    few_e4m3_k(few8_k, w, ld, nr, in, a2, lda, T, out);
}
static void few_e4m3s(const uint8_t *w, size_t ld, int nr, int in, const float *a2, size_t lda, int T, float *out) {
    few_e4m3_k(few8s_k, w, ld, nr, in, a2, lda, T, out);
}

#define FEW4(C)                                                                                       \
    static void few4_##C(const uint8_t *w, const uint8_t *s, int nb, const int16_t *aw, size_t ldaw, \
                         const float *sav, size_t ldsa, float *out) {                             \
        const __m512i tab = e2m1_tab();                                                           \
        __m512 c[C];                                                                              \
        UNROLL for (int t = 0; t < C; t++) c[t] = _mm512_setzero_ps();                            \
        int b = 0;                                                                                \
        for (; b + 2 <= nb; b += 2) {                                                             \
            if (!(b & 3)) _mm_prefetch((const char *)(w + 16 * b + PFD), _MM_HINT_T0);            \
            __m512i we, wo;                                                                       \
            e2m1x64_i16(w + 16 * b, tab, &we, &wo);                                               \
            __m512 sw = _mm512_mask_mov_ps(_mm512_set1_ps(ue8_lut[s[b]]), 0xFF00, _mm512_set1_ps(ue8_lut[s[b + 1]])); \
            UNROLL for (int t = 0; t < C; t++) {                                                  \
                __m512i ae = _mm512_load_si512(aw + t * ldaw + 32 * b), ao = _mm512_load_si512(aw + t * ldaw + 32 * b + 32); \
                __m512i d = _mm512_dpwssd_epi32(_mm512_madd_epi16(we, ae), wo, ao);               \
                c[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d), sw), _mm512_load_ps(sav + t * ldsa + 8 * b), c[t]); \
            }                                                                                     \
        }                                                                                         \
        if (b < nb) {                                                                             \
            __m256i we, wo;                                                                       \
            ds41_e2m1x32_i16(w + 16 * b, &we, &wo);                                               \
            __m256 sw = _mm256_set1_ps(ue8_lut[s[b]]);                                            \
            UNROLL for (int t = 0; t < C; t++) {                                                  \
                __m256i ae = _mm256_load_si256((const __m256i *)(aw + t * ldaw + 32 * b));        \
                __m256i ao = _mm256_load_si256((const __m256i *)(aw + t * ldaw + 32 * b + 32));   \
                __m256i d = _mm256_add_epi32(_mm256_madd_epi16(we, ae), _mm256_madd_epi16(wo, ao)); \
                __m256 x = _mm256_mul_ps(_mm256_cvtepi32_ps(d), sw);                              \
                c[t] = _mm512_fmadd_ps(zext(x), zext(_mm256_load_ps(sav + t * ldsa + 8 * b)), c[t]); \
            }                                                                                     \
        }                                                                                         \
        UNROLL for (int t = 0; t < C; t++) out[t] = hsum16(c[t]);                                 \
    }
FEW4(1) FEW4(2) FEW4(3) FEW4(4) FEW4(5) FEW4(6) FEW4(7) FEW4(8)
static void (*const few4_k[8])(const uint8_t *, const uint8_t *, int, const int16_t *, size_t, const float *,
                               size_t, float *) = { few4_1, few4_2, few4_3, few4_4, few4_5, few4_6, few4_7, few4_8 };

static void few_fp4(const uint8_t *w, size_t ld, const uint8_t *s, size_t lds, int nr, int nb,
                    const int16_t *aw, size_t ldaw, const float *sav, size_t ldsa, int T, float *out) {
    lut_fill();
    for (int r = 0; r < nr; r++)
        for (int t0 = 0; t0 < T; t0 += 8) {
            int C = T - t0 < 8 ? T - t0 : 8;
            few4_k[C - 1](w + (size_t)r * ld, s + (size_t)r * lds, nb, aw + (size_t)t0 * ldaw, ldaw,
                          sav + (size_t)t0 * ldsa, ldsa, out + (size_t)r * T + t0);
        }
}

#define FEWB(C)                                                                                       \
    static void fewb_##C(const uint16_t *w, int n16, const float *a, size_t lda, float *out) {       \
        const __m512i hm = _mm512_set1_epi32((int)0xFFFF0000);                                    \
        __m512 c[C];                                                                              \
        UNROLL for (int t = 0; t < C; t++) c[t] = _mm512_setzero_ps();                            \
        int g = 0;                                                                                \
        for (; g + 2 <= n16; g += 2) {                                                            \
            _mm_prefetch((const char *)(w + 16 * g) + PFD, _MM_HINT_T0);                          \
            __m512i v = _mm512_loadu_si512(w + 16 * g);                                           \
            __m512 ev = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), od = _mm512_castsi512_ps(_mm512_and_si512(v, hm)); \
            UNROLL for (int t = 0; t < C; t++) {                                                  \
                c[t] = _mm512_fmadd_ps(ev, _mm512_loadu_ps(a + t * lda + 16 * g), c[t]);          \
                c[t] = _mm512_fmadd_ps(od, _mm512_loadu_ps(a + t * lda + 16 * g + 16), c[t]);     \
            }                                                                                     \
        }                                                                                         \
        if (g < n16) {                                                                            \
            __m256i v = _mm256_loadu_si256((const __m256i *)(w + 16 * g));                        \
            __m512 ev = zext(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));                      \
            __m512 od = zext(_mm256_castsi256_ps(_mm256_and_si256(v, _mm512_castsi512_si256(hm)))); \
            UNROLL for (int t = 0; t < C; t++) {                                                  \
                c[t] = _mm512_fmadd_ps(ev, zext(_mm256_loadu_ps(a + t * lda + 16 * g)), c[t]);    \
                c[t] = _mm512_fmadd_ps(od, zext(_mm256_loadu_ps(a + t * lda + 16 * g + 16)), c[t]); \
            }                                                                                     \
        }                                                                                         \
        UNROLL for (int t = 0; t < C; t++) out[t] = hsum16(c[t]);                                 \
    }
FEWB(1) FEWB(2) FEWB(3) FEWB(4) FEWB(5) FEWB(6) FEWB(7) FEWB(8)
static void (*const fewb_k[8])(const uint16_t *, int, const float *, size_t, float *) = {
    fewb_1, fewb_2, fewb_3, fewb_4, fewb_5, fewb_6, fewb_7, fewb_8 };

static void few_bf16(const uint16_t *w, size_t ld, int nr, int n16, const float *a, size_t lda, int T, float *out) {
    for (int r = 0; r < nr; r++)
        for (int t0 = 0; t0 < T; t0 += 8) {
            int C = T - t0 < 8 ? T - t0 : 8;
            fewb_k[C - 1](w + (size_t)r * ld, n16, a + (size_t)t0 * lda, lda, out + (size_t)r * T + t0);
        }
}

#define FEWF(C)                                                                                       \
    static void fewf_##C(const float *w, int n8, const float *a, size_t lda, float *out) {           \
        __m512 c[C];                                                                              \
        UNROLL for (int t = 0; t < C; t++) c[t] = _mm512_setzero_ps();                            \
        int g = 0;                                                                                \
        for (; g + 2 <= n8; g += 2) {                                                             \
            _mm_prefetch((const char *)(w + 8 * g) + PFD, _MM_HINT_T0);                           \
            __m512 wv = _mm512_loadu_ps(w + 8 * g);                                               \
            UNROLL for (int t = 0; t < C; t++) c[t] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(a + t * lda + 8 * g), c[t]); \
        }                                                                                         \
        if (g < n8) {                                                                             \
            __m512 wv = zext(_mm256_loadu_ps(w + 8 * g));                                         \
            UNROLL for (int t = 0; t < C; t++) c[t] = _mm512_fmadd_ps(wv, zext(_mm256_loadu_ps(a + t * lda + 8 * g)), c[t]); \
        }                                                                                         \
        UNROLL for (int t = 0; t < C; t++) out[t] = hsum16(c[t]);                                 \
    }
FEWF(1) FEWF(2) FEWF(3) FEWF(4) FEWF(5) FEWF(6) FEWF(7) FEWF(8)
static void (*const fewf_k[8])(const float *, int, const float *, size_t, float *) = {
    fewf_1, fewf_2, fewf_3, fewf_4, fewf_5, fewf_6, fewf_7, fewf_8 };

static void few_f32(const float *w, size_t ld, int nr, int n8, const float *a, size_t lda, int T, float *out) {
    for (int r = 0; r < nr; r++)
        for (int t0 = 0; t0 < T; t0 += 8) {
            int C = T - t0 < 8 ? T - t0 : 8;
            fewf_k[C - 1](w + (size_t)r * ld, n8, a + (size_t)t0 * lda, lda, out + (size_t)r * T + t0);
        }
}

/* ---------------------------------------------------------------- mid rows (T = 9 .. DS41_MID_MAX) */

/* One K block of one weight row, decoded once in registers and applied to C <= MIDC tokens:
 * one zmm (A | B) per token, loaded from and stored back to the prefill accumulator blocks
 * (acc + 16 t), fed in the decode order (chunks / groups / blocks 2i, 2i + 1 as one step).
 * The prefill panels decode 32 rows x 256 K into memory and reread them for every token tile;
 * here the codes are decoded straight into the FMA operand, which then serves every token of
 * the pass. FP8 weights are decoded as prefill decodes them (e4m3 * 2^-8 times the tile scale
 * * 2^8: the same exact product inside the same FMA as the decode's scaled activations), so
 * the activations are the call's, not rescaled per 32-row tile. They come step-major
 * (linear_fast.c, mid_acts: per step, the T tokens' operands side by side), so every token's
 * operand is one base register plus a constant displacement: with one pointer per token, 16
 * tokens exhaust the general registers and the compiler reloads pointers inside the loop. A
 * block's activations fill at most 32 KiB and stay in L1 for all rows of the item. */
#define MIDC 16
#define MIDPF 2   /* a row's block is a short stream: the block of row r + MIDPF goes to L1 during row
                   * r (measured at T = 16: 2 ahead of 1; without it, 10-15 % slower) */
#define UNROLL16 _Pragma("GCC unroll 16")

/* FP8: one step of 16 K per iteration (a 32-K scale block is two steps; one pointer walks the
 * activations so that the token operands stay displacements); a: 16 floats per token per
 * step, sstep floats per step; st: the tile's scale bytes of the block */
#define MID8(C)                                                                                       \
    static void mid8_##C(const uint8_t *w, const uint8_t *st, int ns, const float *a, size_t sstep, float *acc) { \
        __m512 c[C];                                                                              \
        UNROLL16 for (int t = 0; t < C; t++) c[t] = _mm512_loadu_ps(acc + 16 * t);                \
        for (int i = 0; i < ns; i++, a += sstep) {                                                \
            _mm_prefetch((const char *)(w + 16 * i + 16 * ns), _MM_HINT_T1);                      \
            __m512 wv = _mm512_mul_ps(e4m3x16_h(w + 16 * i), _mm512_set1_ps(ue8_lut8[st[i >> 1]])); \
            UNROLL16 for (int t = 0; t < C; t++) c[t] = _mm512_fmadd_ps(wv, _mm512_load_ps(a + 16 * t), c[t]); \
        }                                                                                         \
        UNROLL16 for (int t = 0; t < C; t++) _mm512_storeu_ps(acc + 16 * t, c[t]);                \
    }
MID8(1) MID8(2) MID8(3) MID8(4) MID8(5) MID8(6) MID8(7) MID8(8)
MID8(9) MID8(10) MID8(11) MID8(12) MID8(13) MID8(14) MID8(15) MID8(16)
static void (*const mid8_k[MIDC])(const uint8_t *, const uint8_t *, int, const float *, size_t, float *) = {
    mid8_1, mid8_2, mid8_3, mid8_4, mid8_5, mid8_6, mid8_7, mid8_8,
    mid8_9, mid8_10, mid8_11, mid8_12, mid8_13, mid8_14, mid8_15, mid8_16 };

/* token passes of at most MIDC, of near-equal sizes (T = 20: 10 + 10, not 16 + 4) */
static inline int mid_pass(int T, int t0) {
    int np = (T + MIDC - 1) / MIDC, done = 0;
    for (int p = 0; p < np; p++) {
        int c = (T - done) / (np - p);
        if (done == t0) return c;
        done += c;
    }
    return T - t0;
}

/* kc % 32 == 0 (FP8 K is a multiple of 32, the blocks multiples of 64) */
static void mid_e4m3(const uint8_t *w, size_t ld, const uint8_t *st, int nr, int kc, const float *a2, int T, float *acc) {
    lut_fill();
    for (int r = 0; r < nr; r++) {
        if (r + MIDPF < nr)
            for (int k = 0; k < kc; k += 64) _mm_prefetch((const char *)(w + (size_t)(r + MIDPF) * ld + k), _MM_HINT_T0);
        for (int t0 = 0, C; t0 < T; t0 += C) {
            C = mid_pass(T, t0);
            mid8_k[C - 1](w + (size_t)r * ld, st, kc / 16, a2 + 16 * (size_t)t0, 16 * (size_t)T, acc + ((size_t)r * T + t0) * 16);
        }
    }
}

/* FP4: step = 64 K (two blocks); a: 96 int16-sized words per token (32 even words, 32 odd
 * words, 16 pair scales), sstep per step. A lone last block (nb odd) takes the low halves. */
#define MID4(C)                                                                                       \
    static void mid4_##C(const uint8_t *w, const uint8_t *s, int nb, const int16_t *a, size_t sstep, float *acc) { \
        const __m512i tab = e2m1_tab();                                                           \
        __m512 c[C];                                                                              \
        UNROLL16 for (int t = 0; t < C; t++) c[t] = _mm512_loadu_ps(acc + 16 * t);                \
        int b = 0;                                                                                \
        for (; b + 2 <= nb; b += 2, a += sstep) {                                                 \
            _mm_prefetch((const char *)(w + 16 * b + 16 * nb), _MM_HINT_T1);                      \
            __m512i we, wo;                                                                       \
            e2m1x64_i16(w + 16 * b, tab, &we, &wo);                                               \
            __m512 sw = _mm512_mask_mov_ps(_mm512_set1_ps(ue8_lut[s[b]]), 0xFF00, _mm512_set1_ps(ue8_lut[s[b + 1]])); \
            UNROLL16 for (int t = 0; t < C; t++) {                                                \
                __m512i ae = _mm512_load_si512(a + 96 * t), ao = _mm512_load_si512(a + 96 * t + 32); \
                __m512i d = _mm512_dpwssd_epi32(_mm512_madd_epi16(we, ae), wo, ao);               \
                c[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d), sw), _mm512_load_ps(a + 96 * t + 64), c[t]); \
            }                                                                                     \
        }                                                                                         \
        if (b < nb) {   /* a lone last block: A only, B gets fma(0, 0, B) = B */                  \
            __m256i we, wo;                                                                       \
            ds41_e2m1x32_i16(w + 16 * b, &we, &wo);                                               \
            __m256 sw = _mm256_set1_ps(ue8_lut[s[b]]);                                            \
            UNROLL16 for (int t = 0; t < C; t++) {                                                \
                __m256i ae = _mm256_load_si256((const __m256i *)(a + 96 * t));                    \
                __m256i ao = _mm256_load_si256((const __m256i *)(a + 96 * t + 32));               \
                __m256i d = _mm256_add_epi32(_mm256_madd_epi16(we, ae), _mm256_madd_epi16(wo, ao)); \
                __m256 x = _mm256_mul_ps(_mm256_cvtepi32_ps(d), sw);                              \
                c[t] = _mm512_fmadd_ps(zext(x), zext(_mm256_load_ps((const float *)(a + 96 * t + 64))), c[t]); \
            }                                                                                     \
        }                                                                                         \
        UNROLL16 for (int t = 0; t < C; t++) _mm512_storeu_ps(acc + 16 * t, c[t]);                \
    }
MID4(1) MID4(2) MID4(3) MID4(4) MID4(5) MID4(6) MID4(7) MID4(8)
MID4(9) MID4(10) MID4(11) MID4(12) MID4(13) MID4(14) MID4(15) MID4(16)
static void (*const mid4_k[MIDC])(const uint8_t *, const uint8_t *, int, const int16_t *, size_t, float *) = {
    mid4_1, mid4_2, mid4_3, mid4_4, mid4_5, mid4_6, mid4_7, mid4_8,
    mid4_9, mid4_10, mid4_11, mid4_12, mid4_13, mid4_14, mid4_15, mid4_16 };

static void mid_fp4(const uint8_t *w, size_t ld, const uint8_t *s, size_t lds, int nr, int nb, const int16_t *a,
                    int T, float *acc) {
    lut_fill();
    for (int r = 0; r < nr; r++) {
        if (r + MIDPF < nr)
            for (int k = 0; k < 16 * nb; k += 64) _mm_prefetch((const char *)(w + (size_t)(r + MIDPF) * ld + k), _MM_HINT_T0);
        for (int t0 = 0, C; t0 < T; t0 += C) {
            C = mid_pass(T, t0);
            mid4_k[C - 1](w + (size_t)r * ld, s + (size_t)r * lds, nb, a + 96 * (size_t)t0, 96 * (size_t)T,
                          acc + ((size_t)r * T + t0) * 16);
        }
    }
}

/* BF16: step = 32 K (two groups); a: 32 permuted floats per token, sstep per step */
#define MIDB(C)                                                                                       \
    static void midb_##C(const uint16_t *w, int n16, const float *a, size_t sstep, float *acc) {     \
        const __m512i hm = _mm512_set1_epi32((int)0xFFFF0000);                                    \
        __m512 c[C];                                                                              \
        UNROLL16 for (int t = 0; t < C; t++) c[t] = _mm512_loadu_ps(acc + 16 * t);                \
        int g = 0;                                                                                \
        for (; g + 2 <= n16; g += 2, a += sstep) {                                                \
            _mm_prefetch((const char *)(w + 16 * g + 16 * n16), _MM_HINT_T1);                     \
            __m512i v = _mm512_loadu_si512(w + 16 * g);                                           \
            __m512 ev = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), od = _mm512_castsi512_ps(_mm512_and_si512(v, hm)); \
            UNROLL16 for (int t = 0; t < C; t++) {                                                \
                c[t] = _mm512_fmadd_ps(ev, _mm512_load_ps(a + 32 * t), c[t]);                     \
                c[t] = _mm512_fmadd_ps(od, _mm512_load_ps(a + 32 * t + 16), c[t]);                \
            }                                                                                     \
        }                                                                                         \
        if (g < n16) {   /* a lone last group: A only */                                          \
            __m256i v = _mm256_loadu_si256((const __m256i *)(w + 16 * g));                        \
            __m512 ev = zext(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));                      \
            __m512 od = zext(_mm256_castsi256_ps(_mm256_and_si256(v, _mm512_castsi512_si256(hm)))); \
            UNROLL16 for (int t = 0; t < C; t++) {                                                \
                c[t] = _mm512_fmadd_ps(ev, zext(_mm256_load_ps(a + 32 * t)), c[t]);               \
                c[t] = _mm512_fmadd_ps(od, zext(_mm256_load_ps(a + 32 * t + 16)), c[t]);          \
            }                                                                                     \
        }                                                                                         \
        UNROLL16 for (int t = 0; t < C; t++) _mm512_storeu_ps(acc + 16 * t, c[t]);                \
    }
MIDB(1) MIDB(2) MIDB(3) MIDB(4) MIDB(5) MIDB(6) MIDB(7) MIDB(8)
MIDB(9) MIDB(10) MIDB(11) MIDB(12) MIDB(13) MIDB(14) MIDB(15) MIDB(16)
static void (*const midb_k[MIDC])(const uint16_t *, int, const float *, size_t, float *) = {
    midb_1, midb_2, midb_3, midb_4, midb_5, midb_6, midb_7, midb_8,
    midb_9, midb_10, midb_11, midb_12, midb_13, midb_14, midb_15, midb_16 };

static void mid_bf16(const uint16_t *w, size_t ld, int nr, int n16, const float *a, int T, float *acc) {
    for (int r = 0; r < nr; r++) {
        if (r + MIDPF < nr)
            for (int k = 0; k < 16 * n16; k += 32) _mm_prefetch((const char *)(w + (size_t)(r + MIDPF) * ld + k), _MM_HINT_T0);
        for (int t0 = 0, C; t0 < T; t0 += C) {
            C = mid_pass(T, t0);
            midb_k[C - 1](w + (size_t)r * ld, n16, a + 32 * (size_t)t0, 32 * (size_t)T, acc + ((size_t)r * T + t0) * 16);
        }
    }
}

/* ---------------------------------------------------------------- prefill */

#define MK_EW(R, C)                                                                                   \
    static void mk_ew_##R##_##C(const float *P, const float *A, size_t lda, int nch, float *acc, int T, int z) { \
        __m512 c[R][C];                                                                           \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++)                     \
            c[r][t] = z ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + ((size_t)r * T + t) * 16); \
        int k = 0;                                                                                \
        for (; k + 2 <= nch; k += 2) {                                                            \
            __m512 a[C];                                                                          \
            UNROLL for (int t = 0; t < C; t++) a[t] = _mm512_loadu_ps(A + t * lda + 8 * k);      \
            UNROLL for (int r = 0; r < R; r++) {                                                  \
                __m512 w = _mm512_load_ps(P + r * KC + 8 * k);                                   \
                UNROLL for (int t = 0; t < C; t++) c[r][t] = _mm512_fmadd_ps(w, a[t], c[r][t]);   \
            }                                                                                     \
        }                                                                                         \
        if (k < nch) {                                                                            \
            __m512 a[C];                                                                          \
            UNROLL for (int t = 0; t < C; t++) a[t] = zext(_mm256_loadu_ps(A + t * lda + 8 * k)); \
            UNROLL for (int r = 0; r < R; r++) {                                                  \
                __m512 w = zext(_mm256_load_ps(P + r * KC + 8 * k));                              \
                UNROLL for (int t = 0; t < C; t++) c[r][t] = _mm512_fmadd_ps(w, a[t], c[r][t]);   \
            }                                                                                     \
        }                                                                                         \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++)                     \
            _mm512_storeu_ps(acc + ((size_t)r * T + t) * 16, c[r][t]);                            \
    }
#define MK_EW_R(R) MK_EW(R, 1) MK_EW(R, 2) MK_EW(R, 3) MK_EW(R, 4) MK_EW(R, 5) MK_EW(R, 6)
MK_EW_R(1) MK_EW_R(2) MK_EW_R(3) MK_EW_R(4)
typedef void (*mk_ew_fn)(const float *, const float *, size_t, int, float *, int, int);
#define MK_EW_ROW(R) { mk_ew_##R##_1, mk_ew_##R##_2, mk_ew_##R##_3, mk_ew_##R##_4, mk_ew_##R##_5, mk_ew_##R##_6 }
static const mk_ew_fn mk_ew[4][6] = { MK_EW_ROW(1), MK_EW_ROW(2), MK_EW_ROW(3), MK_EW_ROW(4) };

static void pf_float(const float *P, int nr, const float *A, size_t lda, int T, int nch, float *acc, int z) {
    for (int t0 = 0; t0 < T; t0 += 6) {
        int C = T - t0 < 6 ? T - t0 : 6;
        for (int r0 = 0; r0 < nr; r0 += 4) {
            int R = nr - r0 < 4 ? nr - r0 : 4;
            mk_ew[R - 1][C - 1](P + (size_t)r0 * KC, A + (size_t)t0 * lda, lda, nch, acc + ((size_t)r0 * T + t0) * 16, T, z);
        }
    }
}

/* FP4: the panel and the activations are zero padded to whole 64-element groups (and zero
 * scales), so the lone last block is a full-width step whose B half adds +0. */
#define MK_Q(R, C)                                                                                    \
    static void mk_q_##R##_##C(const int16_t *PW, const float *SW, const int16_t *AW, size_t ldaw,   \
                               const float *SAV, size_t ldsa, int ngrp, float *acc, int T, int z) { \
        __m512 c[R][C];                                                                           \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++)                     \
            c[r][t] = z ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + ((size_t)r * T + t) * 16); \
        for (int g = 0; g < ngrp; g++) {                                                          \
            __m512i ae[C], ao[C];                                                                 \
            UNROLL for (int t = 0; t < C; t++) {                                                  \
                ae[t] = _mm512_load_si512(AW + t * ldaw + 64 * g);                                \
                ao[t] = _mm512_load_si512(AW + t * ldaw + 64 * g + 32);                           \
            }                                                                                     \
            UNROLL for (int r = 0; r < R; r++) {                                                  \
                __m512i we = _mm512_load_si512(PW + r * KC + 64 * g);                             \
                __m512i wo = _mm512_load_si512(PW + r * KC + 64 * g + 32);                        \
                __m512 sw = _mm512_load_ps(SW + r * (KC / 4) + 16 * g);                           \
                UNROLL for (int t = 0; t < C; t++) {                                              \
                    __m512i d = _mm512_dpwssd_epi32(_mm512_madd_epi16(we, ae[t]), wo, ao[t]);     \
                    __m512 x = _mm512_mul_ps(_mm512_cvtepi32_ps(d), sw);                          \
                    c[r][t] = _mm512_fmadd_ps(x, _mm512_load_ps(SAV + t * ldsa + 16 * g), c[r][t]); \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++)                     \
            _mm512_storeu_ps(acc + ((size_t)r * T + t) * 16, c[r][t]);                            \
    }
#define MK_Q_R(R) MK_Q(R, 1) MK_Q(R, 2) MK_Q(R, 3) MK_Q(R, 4)
MK_Q_R(1) MK_Q_R(2) MK_Q_R(3) MK_Q_R(4)
typedef void (*mk_q_fn)(const int16_t *, const float *, const int16_t *, size_t, const float *, size_t, int, float *, int, int);
#define MK_Q_ROW(R) { mk_q_##R##_1, mk_q_##R##_2, mk_q_##R##_3, mk_q_##R##_4 }
static const mk_q_fn mk_q[4][4] = { MK_Q_ROW(1), MK_Q_ROW(2), MK_Q_ROW(3), MK_Q_ROW(4) };

static void pf_fp4(const int16_t *PW, const float *SW, int nr, const int16_t *AW, size_t ldaw,
                   const float *SAV, size_t ldsa, int T, int nblk, float *acc, int z) {
    int ngrp = (nblk + 1) / 2;
    for (int t0 = 0; t0 < T; t0 += 4) {
        int C = T - t0 < 4 ? T - t0 : 4;
        for (int r0 = 0; r0 < nr; r0 += 4) {
            int R = nr - r0 < 4 ? nr - r0 : 4;
            mk_q[R - 1][C - 1](PW + (size_t)r0 * KC, SW + (size_t)r0 * (KC / 4), AW + (size_t)t0 * ldaw, ldaw,
                               SAV + (size_t)t0 * ldsa, ldsa, ngrp, acc + ((size_t)r0 * T + t0) * 16, T, z);
        }
    }
}

/* One FP8 row of a prefill panel (linear_fast.h: pan_e4m3), 16 codes per step: the products
 * e4m3 * 2^-8 * (s * 2^8) are exact, the same floats as AVX2's 8 per step. */
static void pan_e4m3(const uint8_t *c, const uint8_t *st, int kc, float *p) {
    lut_fill();
    for (int b = 0; b < kc / 32; b++) {
        __m512 sc = _mm512_set1_ps(ue8_lut8[st[b]]);
        _mm512_store_ps(p + 32 * b, _mm512_mul_ps(e4m3x16_h(c + 32 * b), sc));
        _mm512_store_ps(p + 32 * b + 16, _mm512_mul_ps(e4m3x16_h(c + 32 * b + 16), sc));
    }
}

static const ds41_fast_ops ops = { "avx512", KC, dec_e4m3, dec_fp4, dec_bf16, dec_f32, few_e4m3, few_fp4, few_bf16, few_f32,
                                    mid_e4m3, mid_fp4, mid_bf16, pf_float, pf_fp4, dec_e4m3s, few_e4m3s, pan_e4m3 };
const ds41_fast_ops *ds41_fast_ops_avx512(void) { return &ops; }

#ifdef __clang__
#pragma clang attribute pop
#endif
