/* ds41 mHC (spec 3.4): mixes with Sinkhorn, apply_pre, apply_post. X is [T, hc, dim]. */
#ifndef DS41_MHC_H
#define DS41_MHC_H
#include "kernels.h"

/* pre [T, hc], post [T, hc], comb [T, hc*hc] (row-major C[i][j]); all FP32. */
void ds41_hc_mixes(const ds41_ctx *ctx, const ds41_config *cfg, const float *fn, const float *base,
                   const float *scale, const float *X, int T, float *pre, float *post, float *comb);
/* y [T, dim] = bf16(sum_c fp32(pre[c] * X[c])) */
void ds41_hc_apply_pre(const ds41_ctx *ctx, const float *X, const float *pre, int T, int hc, int dim, float *y);
/* out [T, hc, dim] = bf16(fp32(post[j]*y) + fp32(sum_i fp32(C[i][j]*R[i]))); out may not alias R. */
void ds41_hc_apply_post(const ds41_ctx *ctx, const float *y, const float *R, const float *post,
                        const float *comb, int T, int hc, int dim, float *out);
#endif
