/* ds41 attention pieces (spec 3.5-3.13): query path, SWA K, compressor, index keys and main
 * KV records, indexer with its three BF16 roundings, candidate pool, top-k, index lists,
 * sparse attention with sink, output projection.
 *
 * Conventions: activations are float arrays holding BF16 values where the spec says BF16;
 * rows are row-major; `pos[t]` is the absolute position of row t. Every function honours
 * ctx->exact (exact-mode.md) and otherwise uses the fast kernels. Nothing here owns state:
 * the caller (forward.c, dspark.c) passes the rows and writes the records where it keeps them. */
#ifndef DS41_ATTENTION_H
#define DS41_ATTENTION_H

#include "kernels.h"

/* ---- record sizes (spec 6.1), generic in the config ---- */
static inline int ds41_swa_rec_bytes(const ds41_config *c) { return c->head_dim + c->head_dim / 32; }      /* 528 */
static inline int ds41_kv_rec_bytes(const ds41_config *c) { return c->head_dim / 2 + c->head_dim / 16; }   /* 288 */
static inline int ds41_ik_rec_bytes(const ds41_config *c) { return c->index_head_dim / 2 + c->index_head_dim / 32; } /* 68 */

/* largest compress ratio the compressor pools (the shipped configs use 1 and 2) */
#define DS41_MAX_RATIO 16

/* fp32(head_dim^-0.5): the softmax scale of 3.12. */
float ds41_attn_scale(const ds41_config *cfg);

/* ---- 3.5 query path ----
 * x [T, dim] (the normalised attention input) -> cq [T, q_lora] = rmsnorm(wq_a x, q_norm) and
 * q [T, n_heads*head_dim] = wq_b cq with RoPE on the last rope_dim dims of every head at pos[t].
 * cq is also the indexer's input. */
void ds41_attn_query(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                     const ds41_rope *rope, const float *x, int T, const int *pos, float *cq, float *q);
/* Its two halves: cq = rmsnorm(wq_a x, q_norm); q = rope(wq_b cq) (P6 runs the indexer between). */
void ds41_attn_query_c(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw, const float *x,
                       int T, float *cq);
void ds41_attn_query_q(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                       const ds41_rope *rope, const float *cq, int T, const int *pos, float *q);

/* ---- 3.7 SWA K ----
 * k [T, head_dim] = Q8-QDQ(rope(rmsnorm(wkv x, kv_norm))) (the BF16 values attention reads);
 * rec (may be NULL): [T, swa_rec_bytes] packed records (head_dim E4M3 codes, then head_dim/32
 * UE8M0 scales) whose dequantization equals k exactly. */
void ds41_attn_swa_k(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                     const ds41_rope *rope, const float *x, int T, const int *pos, float *k, uint8_t *rec);
/* Dequantizes n packed SWA records (consecutive, rec_bytes apart) into out [n, head_dim]. */
void ds41_swa_rec_unpack(const ds41_config *cfg, const uint8_t *rec, int n, float *out);

/* ---- 3.8 compressor ----
 * Ratio 1: c [T, head_dim] = rmsnorm(BF16-linear(comp_wkv, x), comp_norm) (pre-RoPE latent).
 * Ratio r > 1: kv, sc [T, head_dim] FP32 projections; ds41_compress_pool pools r rows
 * (per-channel softmax over the r tokens, FP32 products summed, one BF16 rounding) and
 * normalises: c [head_dim] BF16 pre-RoPE latent. */
void ds41_compress_r1(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                      const float *x, int T, float *c);
void ds41_compress_proj(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                        const float *x, int T, float *kv, float *sc);
/* kv_rows[i], sc_rows[i] for i < r: the group's tokens in position order. */
void ds41_compress_pool(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                        const float *const *kv_rows, const float *const *sc_rows, int r, float *c);
/* From a pre-RoPE latent c (modified: RoPE applied in place) of compressed entry j (position
 * j*r) writes the index-K record ik_rec (Q4mx, 68 B) and the main-KV record kv_rec (Q4nv, 288 B).
 * Order as 3.8: index key from the pre-RoPE latent first, then RoPE + Q4nv of the latent. */
void ds41_compress_entry(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                         const ds41_rope *rope, float *c, int pos, uint8_t *ik_rec, uint8_t *kv_rec);
/* P1, ratio 1: the compressor of rows x [T, dim] (entries j0 .. j0+T-1, at those positions)
 * fused per 16-row tile: projection, RMSNorm, the index-key projection of the tile, RoPE and both
 * records, written to ik_rec[t] / kv_rec[t]. The same records as ds41_compress_r1 followed by
 * ds41_compress_entry per row (the linears are row-order invariant). */
/* P1, ratio r > 1: n complete groups (group e's tokens: kv_rows / sc_rows [e * r .. e * r + r),
 * in position order; its entry at position pos[e]) pooled, normalised and turned into records
 * per 16-entry tile, the index-key projection of the tile as one multi-row product instead of
 * one single-row product per entry. The same records as ds41_compress_pool + ds41_compress_entry
 * per group. */
void ds41_compress_pool_fused(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                              const ds41_rope *rope, const float *const *kv_rows, const float *const *sc_rows, int r,
                              int n, const int *pos, uint8_t *const *ik_rec, uint8_t *const *kv_rec);
void ds41_compress_r1_fused(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                            const ds41_rope *rope, const float *x, int T, long long j0, uint8_t *const *ik_rec,
                            uint8_t *const *kv_rec);
/* Dequantize n consecutive records into [n, head_dim] / [n, index_head_dim]. */
void ds41_kv_rec_unpack(const ds41_config *cfg, const uint8_t *rec, int n, float *out);
void ds41_ik_rec_unpack(const ds41_config *cfg, const uint8_t *rec, int n, float *out);

/* ---- 3.9 indexer ----
 * iq [T, index_n_heads*index_head_dim] = Q4mx-QDQ(rope(wq_b_idx cq)) per head;
 * wt [T, index_n_heads] = bf16(bf16(weights_proj x) * index_head_dim^-0.5 * index_n_heads^-0.5). */
void ds41_indexer_query(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                        const ds41_rope *rope, const float *cq, const float *x, int T, const int *pos,
                        float *iq, float *wt);
/* scores[j] for j < E against dequantized index keys ik [E, index_head_dim]:
 * bf16(sum_h bf16(relu(bf16(iq_h . ik_j)) * wt_h)); entries j >= n_visible get -inf. */
void ds41_indexer_scores(const ds41_ctx *ctx, const ds41_config *cfg, const float *iq, const float *wt,
                         const float *ik, int E, int n_visible, float *scores);
/* The same by the scalar loop (the definition; ds41_indexer_scores computes every entry with
 * the same operations in SIMD lanes, tested bit-identical). */
void ds41_indexer_scores_ref(const ds41_ctx *ctx, const ds41_config *cfg, const float *iq, const float *wt,
                             const float *ik, int E, int n_visible, float *scores);

/* Index-K records as a store holds them: entry j's record at pages[j / per_page] + off +
 * (j % per_page) * rec_bytes (one contiguous array: pages = &array, per_page >= E, off 0). */
typedef struct ds41_ik_keys {
    const uint8_t *const *pages;
    long long per_page;
    size_t off;
    int rec_bytes;
} ds41_ik_keys;
/* ds41_indexer_scores against the packed records themselves (integer dots on the E2M1 codes
 * where they give the definition's value, which is nearly always; the definition's float dot
 * otherwise): bit-identical to ds41_indexer_scores on the dequantized keys, in both modes. */
extern long long ds41_indexer_dotf_pairs;   /* (head, entry) pairs that took the float dot (tests) */
void ds41_indexer_scores_packed(const ds41_ctx *ctx, const ds41_config *cfg, const float *iq, const float *wt,
                                const ds41_ik_keys *keys, int E, int n_visible, float *scores);

/* ---- 3.10 candidate pool (candidate source layer, per query) ----
 * From the masked scores [E] of one query with n_visible entries: keep[b] (for b <
 * ceil(E/block)) = 1 if candidate block b is in the pool. scratch: >= 2*ceil(E/block) ints. */
void ds41_candidate_blocks(const ds41_config *cfg, const float *scores, int E, int n_visible,
                           uint8_t *keep, int *scratch);

/* ---- 3.11 top-k ----
 * The k largest of v[n] (values descending, equal values: lower index first), written to
 * out[k] sorted ascending by index. idx_scratch: n ints. Requires k <= n. */
void ds41_topk(const float *v, int n, int k, int *out, int *idx_scratch);

/* ---- 3.11 index lists (SWA part) ----
 * One-shot/extend layout for a forward over [P, P+T) (docs/conformance.md): width
 * W = min(P+T, window); query p lists positions base..base+W-1 (base = max(lo, p-window+1)),
 * each -1 if > p. lo = 0 normally; lo > 0 truncates the window (ced-replay, spec 4.1).
 * Positions are written as positions; the caller maps them to KV-list rows. */
int ds41_swa_width(const ds41_config *cfg, long long P, int T);
void ds41_swa_list_positions(const ds41_config *cfg, long long p, long long lo, int W, int32_t *list);
/* Decode layout (T = 1 at position P): ring slots o, o+1, ..., o-1 with o = (P+1) mod window,
 * each -1 if the slot index is > P; width window. Entries are ring slots. */
void ds41_swa_list_decode(const ds41_config *cfg, long long P, int32_t *list);

/* ---- 3.12 sparse attention with sink ----
 * The KV row set: up to three consecutive parts (e.g. [ring ; chunk keys ; compressed
 * entries]); list index r addresses part 0 for r < n[0], part 1 for r - n[0] < n[1], ...
 * Rows hold BF16 values (the QDQ values of the records), K = V. Unused parts: n = 0. */
#define DS41_KVSET_PARTS 3
typedef struct ds41_kvset {
    const float *part[DS41_KVSET_PARTS];
    int n[DS41_KVSET_PARTS];
    /* P2: a part with rec[p] != NULL holds packed main-KV records instead (row r is the Q4nv
     * record rec[p][r], read in the kernel; part[p] unused) */
    const uint8_t *const *rec[DS41_KVSET_PARTS];
} ds41_kvset;
/* One packed main-KV record decoded (the values of ds41_kv_rec_unpack, through a table). */
void ds41_kv_rec_decode(const uint8_t *rec, int head_dim, float *out);
/* q [T, n_heads*head_dim]; idx [T, L] rows of kv (or -1); sink [n_heads];
 * out [T, n_heads*head_dim] (BF16). Processes each list in blocks of 64 with the running-max
 * BF16 rounding of 3.12; -1 entries contribute nothing; an all -1 list gives exactly 0.
 * ctx->ablate: P3 on (default) fetches (P2: decodes) each block's rows once for a range of
 * heads, P3 off once per head; both give the same bits. */
void ds41_sparse_attn(const ds41_ctx *ctx, int n_heads, int head_dim, const float *q, int T,
                      const ds41_kvset *kv, const int32_t *idx, int L, const float *sink,
                      float scale, float *out);

/* ---- 3.13 output projection ----
 * o [T, n_heads*head_dim] (modified: inverse RoPE at pos[t] on each head's rope dims), then the
 * grouped wo_a (BF16 matmul on exactly dequantized FP8, no activation quantization) and the
 * FP8 wo_b: y [T, dim]. scratch: T*o_groups*o_lora_rank floats. */
void ds41_attn_output(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                      const ds41_rope *rope, float *o, int T, const int *pos, float *scratch, float *y);

#endif
