/* ds41 number formats (spec section 7): BF16, FP8 E4M3 (e4m3fn), UE8M0, E2M1,
 * and the Q8 / Q4mx / Q4nv quantizers. Bit-exact, plain IEEE FP32, no FMA.
 * No dependencies beyond libc. */
#ifndef DS41_FORMATS_H
#define DS41_FORMATS_H

#include <stdint.h>

/* ---- bit casts ---- */
static inline uint32_t ds41_f32_bits(float f) { union { float f; uint32_t u; } v = { .f = f }; return v.u; }
static inline float ds41_bits_f32(uint32_t u) { union { uint32_t u; float f; } v = { .u = u }; return v.f; }

/* ---- BF16 (7.1): top 16 bits after round-to-nearest-even; NaN stays NaN (quiet). ---- */
uint16_t ds41_bf16_from_f32(float f);
static inline float ds41_bf16_to_f32(uint16_t h) { return ds41_bits_f32((uint32_t)h << 16); }
/* f32 -> bf16 -> f32 */
static inline float ds41_bf16_round(float f) { return ds41_bf16_to_f32(ds41_bf16_from_f32(f)); }

/* ---- FP8 E4M3 "fn" (7.2): saturating encode (clamp to +-448, then RNE, subnormals). ---- */
uint8_t ds41_e4m3_from_f32(float f);   /* NaN -> 0x7F (sign kept) */
float ds41_e4m3_to_f32(uint8_t c);     /* 0x7F / 0xFF decode to NaN */

/* ---- UE8M0 (7.3): value 2^(e-127); 255 is NaN. ---- */
float ds41_ue8m0_to_f32(uint8_t e);

/* ---- E2M1 (7.3): code bit 3 = sign; magnitudes 0 .5 1 1.5 2 3 4 6. ---- */
uint8_t ds41_e2m1_from_f32(float f);   /* clamps to +-6 first; ties to even code; sign of input */
float ds41_e2m1_to_f32(uint8_t code);  /* low 4 bits used */
/* byte = code(x[2i]) | code(x[2i+1]) << 4 */
static inline uint8_t ds41_e2m1_pack(uint8_t lo, uint8_t hi) { return (uint8_t)((lo & 15) | (hi & 15) << 4); }

/* FP32 reciprocal constants used by pow2ceil. */
#define DS41_INV448_BITS 0x3B124925u   /* fp32(1/448) */
#define DS41_INV6_BITS   0x3E2AAAABu   /* fp32(1/6) */

/* pow2ceil(a, inv): t = fp32(a*inv); 2^(E-127+(M!=0)) from t's bits (t normal). */
float ds41_pow2ceil(float a, float inv);

/* ---- Quantizers (7.4). Inputs are BF16 values (given as their exact FP32 value
 * or as raw uint16 BF16). Each works on one group and writes codes and a scale;
 * the *_dq helpers produce the dequantized BF16 values (QDQ). ---- */

/* Q8: group of 32 (or n <= 32 for generality). codes[n] E4M3; *scale_byte = log2(s)+127.
 * Returns s. */
float ds41_q8_group(const float *x, int n, uint8_t *codes, uint8_t *scale_byte);
/* Q4mx: group of 32; codes[n] E2M1 (unpacked, one per byte); *scale_byte UE8M0. Returns s. */
float ds41_q4mx_group(const float *x, int n, uint8_t *codes, uint8_t *scale_byte);
/* Q4nv: group of 16; codes[n] E2M1 (unpacked); *scale_e4m3 = E4M3 code of s. Returns s. */
float ds41_q4nv_group(const float *x, int n, uint8_t *codes, uint8_t *scale_e4m3);

/* Whole-vector QDQ in place on BF16 values held as float (len a multiple of the group). */
void ds41_q8_qdq(float *x, int len);     /* groups of 32 */
void ds41_q4mx_qdq(float *x, int len);   /* groups of 32 */
void ds41_q4nv_qdq(float *x, int len);   /* groups of 16 */

/* Packed cache records (spec 6.1). */
/* main KV entry: 512 dims -> 256 B packed E2M1 + 32 B E4M3 scales (dim generic: d/2 + d/16). */
void ds41_pack_q4nv(const float *x, int d, uint8_t *codes_packed, uint8_t *scales);
void ds41_unpack_q4nv(const uint8_t *codes_packed, const uint8_t *scales, int d, float *out);
/* index K entry: d dims -> d/2 B packed E2M1 + d/32 UE8M0 scales. */
void ds41_pack_q4mx(const float *x, int d, uint8_t *codes_packed, uint8_t *scales);
void ds41_unpack_q4mx(const uint8_t *codes_packed, const uint8_t *scales, int d, float *out);
/* SWA entry: d dims -> d B E4M3 + d/32 UE8M0 scales. */
void ds41_pack_q8(const float *x, int d, uint8_t *codes, uint8_t *scales);
void ds41_unpack_q8(const uint8_t *codes, const uint8_t *scales, int d, float *out);

#endif
