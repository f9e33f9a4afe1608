/* ds41 MoE (spec 3.14): router (sqrt-softplus, bias-steered top-k, renormalise, route scale),
 * routed FP4 experts with clamps and the routing weight before w2's quantization, expert-id
 * summation order, shared FP8 expert. */
#ifndef DS41_MOE_H
#define DS41_MOE_H
#include "kernels.h"

/* x [T, dim] bf16 -> y [T, dim] bf16. is_image[t] (may be NULL) selects gate.bias_vl.
 * sel_out (may be NULL): [T, n_active] chosen expert ids in ascending id order. */
void ds41_moe(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
              const ds41_layer_plan *lp, const float *x, int T, const uint8_t *is_image,
              float *y, int *sel_out);
#endif
