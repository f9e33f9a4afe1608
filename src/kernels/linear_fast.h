/* ds41 fast linears (ds41_ctx.exact == 0): the SIMD kernels behind the ds41_linear_* entry
 * points of linear.c, in one canonical order (linear_fast.c) with one implementation per ISA
 * (AVX2 + FMA + F16C in linear_fast.c, AVX-512 F/BW/VL/VNNI in linear_avx512.c), chosen at
 * first use from CPUID. Internal to src/kernels and its tests. */
#ifndef DS41_LINEAR_FAST_H
#define DS41_LINEAR_FAST_H

#include "kernels.h"

#include <immintrin.h>

#include <stddef.h>
#include <stdint.h>

/* FP8 (fp4 = 0: 32x32 tiles) or FP4 (fp4 = 1: per-row per-32 scales) linear, in % 32 == 0. */
void ds41_fast_qlin(const ds41_ctx *ctx, const uint8_t *w, const uint8_t *s, int fp4, int out, int in,
                    const float *x, int T, float *y);

/* kind 0: BF16 weights wb; 1: FP32 weights wf; 2: FP8 w8 dequantized on the fly, rows
 * [row0, row0 + out). x[t * x_stride + k], y[t * y_stride + r]. */
void ds41_fast_dense(const ds41_ctx *ctx, int kind, const uint16_t *wb, const float *wf, const ds41_fp8w *w8,
                     int row0, int out, int in, const float *x, int x_stride, int T, float *y, int y_stride,
                     int out_bf16);

/* Q8 of one row (in % 32 == 0) per 32 along K, bit-identical to ds41_q8_group followed by the
 * E4M3 decode and the multiplication by the group scale, times mult (a power of two): a[k] =
 * e4m3(x[k] / s) * s * mult. Exposed for tests/test_kernels.c. */
void ds41_fast_q8_row(const float *x, int in, float mult, float *a);

/* ---- per-ISA kernels (see linear_fast.c for the canonical order they all implement) ----
 * acc blocks: 16 floats per (row, token): lanes 0-7 accumulator A, 8-15 accumulator B. */
#define DS41_KC 256        /* K elements per prefill panel, AVX-512 (32 rows x 1 KiB of floats) */
#define DS41_KC_AVX2 512   /* the same, AVX2: the 4 x 3 micro-kernel's fixed cost per call (its
                            * accumulators loaded and stored per parity pass) spread over twice
                            * the K; see linear_fast.c */
#define DS41_FEW_MAX 8   /* T = 2 .. DS41_FEW_MAX: the few-row path (weights streamed once) */
#define DS41_MID_MAX 32  /* T = DS41_FEW_MAX + 1 .. DS41_MID_MAX: the mid path where the ISA has one
                          * (AVX2 FP4: up to 64, linear_fast.c) */
typedef struct ds41_fast_ops {
    const char *name;
    int kc;   /* K elements per prefill panel (pf_float / pf_fp4 row stride): DS41_KC, DS41_KC_AVX2 */
    /* decode, nr rows at stride ld; out[r] = hsum8(A + B) */
    void (*dec_e4m3)(const uint8_t *w, size_t ld, int nr, int in, const float *a2, float *out);
    void (*dec_fp4)(const uint8_t *w, size_t ld, const uint8_t *s, size_t lds, int nr, int nb,
                    const int16_t *aw, const float *sav, float *out);
    void (*dec_bf16)(const uint16_t *w, size_t ld, int nr, int n16, const float *a, float *out);
    void (*dec_f32)(const float *w, size_t ld, int nr, int n8, const float *a, float *out);
    /* few rows (T = 2 .. DS41_FEW_MAX): nr weight rows streamed once for all T activation
     * rows (row t at a + t * lda), out[r * T + t] = the T = 1 result of (row r, token t) */
    void (*few_e4m3)(const uint8_t *w, size_t ld, int nr, int in, const float *a2, size_t lda, int T, float *out);
    void (*few_fp4)(const uint8_t *w, size_t ld, const uint8_t *s, size_t lds, int nr, int nb,
                    const int16_t *aw, size_t ldaw, const float *sav, size_t ldsa, int T, float *out);
    void (*few_bf16)(const uint16_t *w, size_t ld, int nr, int n16, const float *a, size_t lda, int T, float *out);
    void (*few_f32)(const float *w, size_t ld, int nr, int n8, const float *a, size_t lda, int T, float *out);
    /* mid rows (T = DS41_FEW_MAX + 1 .. DS41_MID_MAX; NULL where the ISA has none: the prefill
     * panels serve): one K block of nr weight rows (w, st, s at the block's first element, row
     * strides ld, lds; FP8: st the 32-row tile's scale bytes), each row decoded in registers
     * once for all T tokens (AVX2: once per token pass), accumulated into acc as prefill does. The activations a2 are
     * step-major (mid_acts in linear_fast.c), at the block's first step: per step, T tokens side
     * by side; FP8 (step 16 K, kc % 32 == 0): 16 floats per token; BF16 (step 32 K, n16
     * groups): 32 permuted floats; FP4 (step 64 K, nb blocks): 32 even int16 words, 32 odd, then
     * 16 pair-scale floats (96 int16 units, 192 bytes). */
    void (*mid_e4m3)(const uint8_t *w, size_t ld, const uint8_t *st, int nr, int kc, const float *a2, int T,
                     float *acc);
    void (*mid_fp4)(const uint8_t *w, size_t ld, const uint8_t *s, size_t lds, int nr, int nb, const int16_t *a2,
                    int T, float *acc);
    void (*mid_bf16)(const uint16_t *w, size_t ld, int nr, int n16, const float *a2, int T, float *acc);
    /* prefill over one K panel: nr rows of panel P (row stride kc), T tokens; z: the
     * accumulators start from +0 instead of acc's contents (the first panel) */
    void (*pf_float)(const float *P, int nr, const float *A, size_t lda, int T, int nch, float *acc, int z);
    void (*pf_fp4)(const int16_t *PW, const float *SW, int nr, const int16_t *AW, size_t ldaw,
                   const float *SAV, size_t ldsa, int T, int nblk, float *acc, int z);
    /* dec_e4m3 / few_e4m3 with the shuffle decode (weights e4m3 * 2^-120, activations a2 =
     * a * s_tile * 2^120; NULL where the ISA has none) */
    void (*dec_e4m3s)(const uint8_t *w, size_t ld, int nr, int in, const float *a2, float *out);
    void (*few_e4m3s)(const uint8_t *w, size_t ld, int nr, int in, const float *a2, size_t lda, int T, float *out);
    /* one FP8 row of a prefill panel: kc codes c (kc % 32 == 0) times their tile scales (bytes
     * st, one per 32 codes) into p (64-byte aligned), floats e4m3 * s */
    void (*pan_e4m3)(const uint8_t *c, const uint8_t *st, int kc, float *p);
} ds41_fast_ops;

/* FP8 decode of the T = 1 .. DS41_FEW_MAX kernels (AVX2 and AVX-512): -1 auto (the byte decode
 * on AMD CPUs, where FP32 subnormal operands cost nothing, F16C elsewhere; DS41_E4M3=f16c|shuffle|vbmi
 * overrides the auto choice), 0 F16C, 1 shuffle, 2 vbmi: the shuffle decode, but the AVX-512 T = 1
 * kernel takes 32 codes per byte permute (AVX-512 VBMI, where the CPU has it; elsewhere the same
 * as 1). Auto on AMD is 2. All give the same bits (tests run each).
 * The counters: 32-row items run with the shuffle / vbmi decode, and items that asked for it but
 * fell back to F16C because an activation operand was out of its range. */
extern int ds41_fast_e4m3_shuffle;
int ds41_fast_e4m3_shuffle_auto(void);   /* the choice at -1 (2 vbmi, 1 shuffle, 0 F16C): DS41_E4M3, else the CPU's */
int ds41_fast_e4m3_vbmi(void);   /* 1 when the AVX-512 T = 1 FP8 kernel takes the VBMI decode now */
extern long long ds41_fast_e4m3s_items, ds41_fast_e4m3s_fallbacks;
/* tests: the shuffle decode's operand verdict on one activation row a (K = 32 nb) against tile
 * scale bytes st, both ways: returns the per-call ranges' verdict (fp8_ranges + fp8_range_ok),
 * *per_item that of the per-item check on the scaled operands (fp8_acts); 1 in range */
int ds41_fast_fp8_range_verdicts(const float *a, const uint8_t *st, int nb, int *per_item);
/* the shuffle decode's byte control: code 4 L + i of a 16-code group to the top byte of dword i
 * of 128-bit lane L (AVX2 reads it as two halves, AVX-512 whole) */
extern const int8_t ds41_shuf_e4m3[64];
/* tests: 1 sends T = DS41_FEW_MAX + 1 .. 64 to the prefill panels instead of the mid kernels,
 * an independent implementation of the canonical order (AVX2 FP4: the int16 words of
 * ds41_e2m1x32_i16 against the T = 1 .. 64 kernels' words times 256) */
extern int ds41_fast_mid_off;
/* The outputs of nr rows x T tokens from their accumulator blocks (row r token t at acc + (r T +
 * t) 16, A in lanes 0-7, B in 8-15): y[t ys + r] = hsum8(A + B), rounded to BF16 when round
 * (the prefill panels of every road end here) */
void ds41_fast_store_outs(const float *acc, int T, int nr, float *y, size_t ys, int round);
/* tests: the FP4 linears' int16 activation words and pair scales of one row of Q8 values (in %
 * 32 == 0; aw: 64 per group of two blocks, sav: 16), as every FP4 road takes them */
void ds41_fast_fp4_act_row(const float *a, int in, int16_t *aw, float *sav);

/* The AVX-512 BF16 FP4 prefill panels (linear_avx512bf16.c): the int16 road's bits with
 * vdpbf16ps (3 instructions per 64 MACs instead of 5). pan_fp4b: one panel row, nblk blocks of
 * codes c and scale bytes st, as BF16 words 2 e2m1 * s_w in the int16 panel layout; 0 when a
 * scale byte is outside [1, 233] (the panel then takes the int16 road). pf_fp4b: pf_fp4 on that
 * panel and the BF16 activation words AB (the int16 words aw as BF16, the same layout).
 * probe: time per vdpbf16ps over time per zmm FMA on this core (24 chains, about 2 ms). */
typedef struct ds41_fast_bf16 {
    int (*pan_fp4b)(const uint8_t *c, const uint8_t *st, int nblk, int16_t *pw);
    void (*pf_fp4b)(const int16_t *PW, int nr, const int16_t *AB, size_t ldab, const float *SAV, size_t ldsa, int T,
                    int nblk, float *acc, int z);
    double (*probe)(void);
    /* ds41_fast_dense for BF16 weights (kind 0) on vdpbf16ps where the activations are BF16
     * values and the weights allow it (the conditions at its definition), the FMA road
     * elsewhere: the FMA road's bits either way. linear.c calls it instead of ds41_fast_dense
     * when the road is on (ds41_fast_bf16_on with the AVX-512 ops). */
    void (*dense)(const ds41_ctx *ctx, const uint16_t *wb, int out, int in, const float *x, int x_stride, int T,
                  float *y, int y_stride, int out_bf16);
    /* The FP4 linear of T tokens in the dot order (DS41_ISA=avx512dot; linear_avx512bf16.c, "FP4
     * in the dot order"): ad the activation words bf16(q u / 2) in K order (token stride ldad
     * words, 64-byte aligned), eamin / eamax the range of the biased exponents of their u / 2;
     * y[t ys + n], rounded to BF16. Returns 0, having written nothing, when a scale byte of w is
     * outside the range that keeps vdpbf16ps exact (the caller then takes the int16 road). */
    int (*dot_fp4)(const ds41_ctx *ctx, const uint8_t *w, const uint8_t *s, int out, int in, const uint16_t *ad,
                   size_t ldad, int T, int eamin, int eamax, float *y, size_t ys, int *srng);
    /* dot_fp4's activation words of one row from its Q8 values a (ds41_fast_q8_row), in words:
     * fp4_act_row's integers times their block's u / 2; 0 when one is not exact in BF16; widens
     * [*emin, *emax] to the exponents of the u / 2 */
    int (*dot_acts)(const float *a, int in, uint16_t *ad, int *emin, int *emax);
    /* The FP8 linear of one tile of T <= 64 tokens (9 .. 64 in use) on vdpbf16ps with the FMA road's bits
     * (linear_avx512bf16.c, "FP8 on vdpbf16ps"), rows [row0, row0 + out) of w (row0 % 16 ==
     * 0, else refused): a the Q8 activations, or the dequantized linear's BF16 ones (token
     * stride lda), lut ue8m0(e) * 2^8; y[t ys + n] rounded to BF16. Returns 0, having written
     * nothing to y, where the activations or the scale bytes rule the road out (the caller
     * then runs the tile on the FMA road). */
    int (*dense_fp8)(const ds41_ctx *ctx, const uint8_t *w, const uint8_t *s, int row0, int out, int in, const float *a,
                     size_t lda, int T, float *y, size_t ys, const float *lut, int *srng);
    /* The FP4 linear of one tile of T <= 64 tokens (9 .. 64 in use) on the canonical BF16 road
     * in wide panels (linear_avx512bf16.c, "FP4 in the canonical order, wide panels"): ab the
     * activation words as BF16 (fp4_act_row's layout, token stride ldab), sav the pair scale
     * vectors (stride ldsa); y[t ys + n] rounded to BF16, the int16 road's bits. Returns 0,
     * having written nothing, where a scale byte is outside [1, 233]. */
    int (*dense_fp4)(const ds41_ctx *ctx, const uint8_t *w, const uint8_t *s, int out, int in, const int16_t *ab,
                     size_t ldab, const float *sav, size_t ldsa, int T, float *y, size_t ys, int *srng);
    /* The FP8 linear of T = 1 .. 8 tokens on vdpbf16ps, rows streamed once (linear_avx512bf16.c,
     * "FP8 few rows on vdpbf16ps"), rows [row0, row0 + out) of w (row0 % 32 == 0): a the Q8
     * activations, or the dequantized linear's BF16 ones (token stride lda); y[t ys + n]
     * rounded to BF16, the FMA road's bits; 0 (nothing written) where refused. */
    int (*few_fp8)(const ds41_ctx *ctx, const uint8_t *w, const uint8_t *s, int row0, int out, int in, const float *a,
                   size_t lda, int T, float *y, size_t ys, int *srng);
    /* dot_fp4, dense_fp8, dense_fp4 and few_fp8 read the range of the call's scale bytes once
     * per call: srng is the caller's int[2] kept across its token tiles, { -1, -1 } at first */
} ds41_fast_bf16;
const ds41_fast_bf16 *ds41_fast_bf16_avx512(void);
/* 1 when the AVX-512 path uses the BF16 FP4 panels (set at first use from the probe, or by
 * DS41_ISA / ds41_kernels_set_isa: "avx512bf16" on, "avx512" off), 2 when it also takes the
 * FP4 prefill tiles in the dot order ("avx512dot", never auto: other bits than the canonical
 * order's); the probe's ratio (0: not run) and the threshold below which auto turns them on */
extern int ds41_fast_bf16_on;
extern double ds41_fast_bf16_ratio;
#define DS41_BF16_RATIO_MAX 1.5
/* panels that asked for the BF16 road and took the int16 one (a scale byte out of range, or an
 * activation word not exact in BF16), and those that took it (tests check both run) */
extern long long ds41_fast_bf16_panels, ds41_fast_bf16_fallbacks;
/* FP4 tiles that took the dot order (DS41_ISA=avx512dot), and those it refused (a scale byte
 * outside its range: the int16 road served them) */
extern long long ds41_fast_fp4_dot_tiles, ds41_fast_fp4_dot_refused;
/* the BF16 linears (dense above): 64-token tiles that took the vdpbf16ps road; tiles sent to
 * the FMA road by their activations (a value not BF16, or subnormal, infinite, NaN); 32-row
 * items (T <= 8) or panels (T > 8) sent there by their weights */
extern long long ds41_fast_bf16_dtiles, ds41_fast_bf16_dfall_x, ds41_fast_bf16_dfall_w;
/* FP8 prefill tiles that took vdpbf16ps (dense_fp8 above), and those it sent to the FMA road */
extern long long ds41_fast_fp8_bf16_tiles, ds41_fast_fp8_bf16_refused;
/* FP4 tiles that took the wide canonical panels (dense_fp4 above) */
extern long long ds41_fast_fp4_wide_tiles;
/* FP8 calls of T = 2 .. 8 tokens that took vdpbf16ps (few_fp8 above, where the CPU has AVX-512
 * VBMI too), and the switch (1; DS41_FP8_FEW=0 in the environment or tests set 0: the FMA road) */
extern long long ds41_fast_fp8_few_tiles;
extern int ds41_fast_fp8_few;
/* tests: 0 switches off the range conditions of that road (not the check that the activations
 * are BF16 values), to show that the cases they refuse would change bits; 1 otherwise */
extern int ds41_fast_bf16_dguard;

const ds41_fast_ops *ds41_fast_ops_avx2(void);
const ds41_fast_ops *ds41_fast_ops_avx512(void);   /* NULL when not compiled in */
const ds41_fast_ops *ds41_fast_ops_get(void);     /* the selected one */

/* 16 packed E2M1 bytes (one block) -> int16 of 2 * e2m1: *we = even elements, *wo = odd (the
 * prefill panels' words, every ISA) */
static inline __attribute__((always_inline)) void ds41_e2m1x32_i16(const uint8_t *p, __m256i *we, __m256i *wo) {
    const __m128i tab = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i m = _mm_set1_epi8(0x0F);
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    *we = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(tab, _mm_and_si128(v, m)));
    *wo = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(tab, _mm_and_si128(_mm_srli_epi16(v, 4), m)));
}

/* Software prefetch for R weight rows read side by side (row r at w + r * ldb): row r's byte
 * offb (the read position plus the prefetch distance), or, past its row's end, the same byte
 * of row r of the next R-row group (R * ldb further on), so that the next group does not start
 * on R cold rows (a short row, wq_b's 1,280 bytes, was otherwise mostly read by demand misses:
 * bench_kernels T = 1 FP8 wq_b 5.2-5.4 -> 9.5-9.6 GB/s on a Zen 3). Rows given by pointers:
 * ds41_pf_row with R the group's row count. */
static inline __attribute__((always_inline)) void ds41_pf_row(const void *row, size_t ldb, size_t offb, int R) {
    _mm_prefetch((const char *)row + offb + (offb >= ldb ? (size_t)(R - 1) * ldb : 0), _MM_HINT_T0);
}
static inline __attribute__((always_inline)) void ds41_pf_rows(const void *w, size_t ldb, size_t offb, int R) {
    for (int r = 0; r < R; r++) ds41_pf_row((const char *)w + r * ldb, ldb, offb, R);
}

/* Short rows (R * ldb <= DS41_PF_NEXT_MAX bytes, the R rows contiguous: row r at w + r * ldb): at
 * read position offb (a multiple of 64) of the R rows, R lines of the next group's block
 * [w + R ldb, w + 2 R ldb), in address order, so that the whole next block is in L1 by the time
 * the group ends; the FP8 T = 1 kernels of both ISAs. Against ds41_pf_rows' R streams 1 KiB ahead
 * (each only 20 lines long for wq_b's 1,280-byte rows), on an Intel Xeon, bench_kernels T = 1
 * one thread FP8 wq_b: AVX-512 1.06-1.23x, AVX2 1.09-1.13x (FP4 w1 / w2: no change, not used). */
#define DS41_PF_NEXT_MAX 16384
static inline __attribute__((always_inline)) void ds41_pf_next(const void *w, size_t ldb, size_t offb, int R) {
    const char *n = (const char *)w + (size_t)R * ldb + (size_t)R * offb;
    for (int q = 0; q < R; q++) _mm_prefetch(n + 64 * q, _MM_HINT_T0);
}

/* ---- exact linears at speed (linear_exact.c, AVX2, double accumulation): bit-identical to
 * the scalar exact kernels of linear.c for finite inputs; linear.c calls them for ctx->exact
 * when ds41_exact_simd is 1 (the default; tests set 0 to run the scalar twins) and the shape
 * fits (quantized: in % 32 == 0; FP8-dequantized: in % 8 == 0). */
extern int ds41_exact_simd;
/* rows of the T = 1 dense exact kernels whose certified lane sum could not be certified and
 * that ran the contract's K-order chain instead (tests check both paths run) */
extern long long ds41_exact_chain_rows;
void ds41_exact_qlin(const ds41_ctx *ctx, const uint8_t *w, const uint8_t *s, int fp4, int out, int in,
                     const float *x, int T, float *y);
void ds41_exact_dense(const ds41_ctx *ctx, int kind, const uint16_t *wb, const float *wf, const ds41_fp8w *w8,
                      int row0, int out, int in, const float *x, int x_stride, int T, float *y, int y_stride,
                      int out_bf16);
/* AVX-512 token passes over one exact panel (linear_exact_avx512.c) */
void ds41_exact_panel_avx512(int quant, const double *wt, int kc, const double *x, size_t ldx, int T, double *acc);
/* the certified T = 1 dense lanes on zmm (8 rows p[0..7], K [0, kv), kv % 16 == 0): s = the
 * double lane sums of w x, b = the FP32 lane sums of |w| |x|; wkind 0 BF16, 1 E4M3 * 2^-8 */
/* FP8 certified lanes (AVX-512 VBMI): s[q] = double lane sums of e4m3(c) * 2^-1016 * xs[k] for 4
 * rows p[q], K [0, kv), kv % 64 == 0; mx[q] = twice the row's largest code magnitude */
void ds41_exact_cert_fp8_avx512(const uint8_t *const *p, int kv, const double *xs, double *s, int *mx);
void ds41_exact_cert_avx512(int wkind, const char *const *p, int kv, const double *x, const float *xa, double *s, float *b);
/* FP4 at T = 1, 8 rows p[r] (AVX-512 BW + VNNI), c8[8 b + r] = row r's s_w times sab[b]: acc8 =
 * the rows' double accumulators of linear_exact.c's e1_fp4_group, the same bits */
void ds41_exact_fp4_t1_avx512(const uint8_t *const *p, int nb, size_t ldb, const int16_t *aq, const double *c8,
                              double *acc8);
/* its c8 for 8 scale rows sr[r]: c8[8 b + r] = ue8[sr[r][b]] * sab[b] */
void ds41_exact_fp4_scales_avx512(const uint8_t *const *sr, int nb, const double *sab, const double *ue8, double *c8);

/* ds41_bf16_round of 8 floats: ds41_bf16_from_f32's integer steps (round to nearest even by
 * adding 0x7FFF plus the kept lsb; a NaN keeps its sign and top payload, quiet bit forced) */
static inline __m256 ds41_bf16_round8(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb),
                                 _mm256_set1_epi32((int)0xFFFF0000u));
    __m256i q = _mm256_slli_epi32(_mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), 16);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(r, q, nan));
}

#endif
