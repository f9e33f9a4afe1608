/* ds41 MoE (spec 3.14): router (sqrt-softplus, bias-steered top-k, renormalise, route scale),
 * routed FP4 experts with clamps and the routing weight before w2's quantization, expert-id
 * summation order, shared FP8 expert. */
#ifndef DS41_MOE_H
#define DS41_MOE_H
#include "kernels.h"

/* The routed experts of one MoE sublayer as a dispatch sees them: rows x [T, dim] (the
 * sublayer's normed input) and per row its k choices sel [T, k] (rank order) with their
 * routing weights wts [T, k]. lw identifies the layer (or DSpark stage) and holds its experts. */
typedef struct ds41_moe_rows {
    const ds41_config *cfg;
    const ds41_layer_weights *lw;
    const float *x;
    int T, k;
    const int *sel;
    const float *wts;
} ds41_moe_rows;

/* Dispatch and combine of the routed experts (ds41_ctx.moe; NULL = ds41_moe_local). begin hands
 * the rows to the experts' owners and may return before their outputs are back (the shared
 * expert runs in between); end adds into acc [T, dim], row by row, every routed output in
 * ascending expert id: the same additions in the same order as one process, so that the
 * result is bit-identical however the experts are placed. Every process of a job calls both,
 * with the same rows, for every MoE sublayer. A dispatch that cannot complete (a lost peer)
 * ends the job itself: the layer loop has no partial result to go on with. */
struct ds41_moe_dispatch {
    void *self;
    void (*begin)(void *self, const ds41_ctx *ctx, const ds41_moe_rows *r);
    void (*end)(void *self, const ds41_ctx *ctx, const ds41_moe_rows *r, float *acc);
};
/* One process: begin does nothing, end runs every expert here. */
extern const ds41_moe_dispatch ds41_moe_local;

/* Runs the experts e with own == NULL or own[e] != 0, in ascending id, over the rows routed to
 * them (gathered, so each weight row is decoded once per call). Each (row t, choice i) output,
 * routing weight applied before w2, goes to acc (acc[t] += out: the local sum, in ascending id)
 * or to slots (slots[t * k + i] = out, for an exchange); outputs of experts not run are left
 * alone. -1 when out of memory (nothing written). */
int ds41_moe_experts(const ds41_ctx *ctx, const ds41_moe_rows *r, const uint8_t *own, float *acc, float *slots);

/* x [T, dim] bf16 -> y [T, dim] bf16. is_image[t] (may be NULL) selects gate.bias_vl.
 * sel_out (may be NULL): [T, n_active] chosen expert ids in ascending id order. */
void ds41_moe(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
              const ds41_layer_plan *lp, const float *x, int T, const uint8_t *is_image,
              float *y, int *sel_out);
#endif
