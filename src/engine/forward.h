/* ds41 forward pass (spec 3.1-3.16, 4.1): the block loop over the layer plan, for one
 * sequence at a time. An engine (weights, kernels, RoPE tables, Engram constants) is shared
 * read-only by any number of sequences; all mutable state lives in ds41_seq (its cache and
 * scratch), so sequences never interfere. */
#ifndef DS41_FORWARD_H
#define DS41_FORWARD_H

#include <stdio.h>

#include "cache.h"
#include "engram.h"
#include "kernels.h"
#include "model.h"

typedef enum ds41_prefill_mode {
    DS41_PREFILL_CED = 0,     /* encoder on every row, decoder only on the rows the kept outputs reach (exact) */
    DS41_PREFILL_FULL = 1,    /* every layer on every row (the reference) */
    DS41_PREFILL_REPLAY = 2,  /* spec 4.1 Decoder SWA Bounded Replay (approximation) */
    DS41_PREFILL_RESTORE = 3  /* prefix-cache replay (restore.c): the CED row reach on every layer,
                               * KV sources included (their entries are restored, not recomputed) */
} ds41_prefill_mode;

typedef struct ds41_engine {
    ds41_model *model;        /* owned when own_model */
    int own_model;
    const ds41_config *cfg;
    const ds41_weights *w;
    ds41_ctx ctx;
    long long max_pos;        /* RoPE tables and caches cover positions < max_pos */
    int n_ropes;
    ds41_rope ropes[4];
    int *layer_rope;          /* per plan entry: index into ropes */
    int has_engram;
    ds41_engram_consts eg;
    int32_t *token_map;       /* Engram compressed ids [vocab] (NULL without Engram) */
    int n_compressed;
    struct ds41_readahead *ra;/* --readahead: per layer weight ranges (longctx.c), or NULL */
    ds41_side *side;          /* P6: the side worker the indexers run on (NULL: none, serial) */
    /* Step hook (NULL: none): called at the start of every forward with its plan (count
     * sequences at positions pos[i] running T[i] tokens each); a non-zero return fails the
     * forward with the message. Under MPI (src/dist/) it broadcasts rank 0's plan and checks
     * this rank's against it; the routed experts reach their owners through ctx.moe. */
    int (*step)(int count, const long long *pos, const int *T, const int32_t *const *tokens, char *err, size_t errcap);
    /* P4 (engram_place.c): where the Engram tables live; eio != NULL when prefetching */
    int eg_mode;
    struct ds41_engram_io *eio;
    /* under MPI: the tables sharded by rows, each step's rows exchanged (src/dist/dist_engram.c);
     * NULL: this process's own tables (mapped, in RAM, or through eio) */
    const struct ds41_engram_src *eg_src;
    void *eg_ram;             /* --engram-mode ram: the tables' copy */
    size_t eg_ram_len;
    struct ds41_twin *twin;   /* ds41 bench --configs: the CSA2-less twin's plan (twin.c), or NULL */
    /* --split layers under MPI (src/dist/dist_pipe.c): this rank runs one range of layers, the
     * stream crossing to the next rank in front of its first layer; NULL: every layer here */
    struct ds41_pipe *pipe;
    /* ds41_engine_route_count_start (route_count.c): the dispatch that counts the routing,
     * wrapped around ctx.moe; NULL: not counting */
    struct ds41_route_count *routes;
} ds41_engine;

/* The CSA2-less twin (twin.c; ds41 bench --configs only): on = 1 swaps e->cfg and e->w for
 * the twin's plan and weight table (built on first use), on = 0 back. Only while no session
 * of e is open. */
int ds41_engine_twin(ds41_engine *e, int on, ds41_err *err);
void ds41_engine_twin_free(ds41_engine *e);

/* Frees what ds41_engine_route_count_start made (route_count.c); NULL: nothing. */
void ds41_route_count_free(struct ds41_route_count *rc);

/* Read-ahead of the weights (longctx.c): ranges of every layer's tensors, and
 * madvise(MADV_WILLNEED) on those of layer l (l = n_layers: the head and the DSpark stages). */
int ds41_engine_readahead_init(ds41_engine *e, ds41_err *err);
void ds41_engine_readahead(const ds41_engine *e, int l);
void ds41_readahead_free(struct ds41_readahead *ra);

/* Per-forward trace output (docs/conformance.md); NULL fields are skipped. */
typedef struct ds41_trace {
    FILE **topk;              /* per plan layer (index sources) */
    FILE **experts;           /* per plan layer */
} ds41_trace;

typedef struct ds41_seq {
    ds41_engine *e;
    ds41_cache cache;
    ds41_prefill_mode prefill;
    int index_k_official;     /* spec 3.9 / 10.1 reading */
    float *logits;            /* [vocab]: the last row of the last forward that asked for it */
    /* --split layers (dist_pipe.h): the last forward's logits are on the last stage only;
     * ds41_logits fetches them, ds41_session_sample takes the last stage's token */
    int lg_unshared;
    /* DSpark context input of the last forward: main_hidden rows for positions
     * mh_pos0 .. mh_pos0 + mh_rows - 1 ([mh_rows, n_targets * dim] BF16 values). */
    float *main_hidden;
    int mh_rows;
    long long mh_pos0;
    ds41_trace *trace;
    /* speculative verification (src/engine/spec.c): verify = 1 makes a multi-token forward at
     * P > 0 use the verify layout (each row sees a decode's KV list); ik_owner0 = the
     * published index-K owner at the start of the current forward */
    int verify;
    int ik_owner0;
    /* prefix-cache replay (restore.c): 1 = exact, 2 = approx (windows truncated at the forward's
     * first position). The KV sources' entries for every position of the forward are already in
     * the stores, so their compressors do not run; the published index-K owner moves as if they
     * had emitted. */
    int restore;
    /* chunked prefill (ds41_feed): rows of the same prompt the caller feeds right after this
     * forward, the last of them wanting logits. A CED forward plans its rows against the
     * prompt's end instead of its own (ds41_row_plan over its rows + plan_ahead), so a chunk
     * runs a decoder layer only on the rows that the prompt's last logits or decode state can
     * still reach, as a one-shot prefill does. 0 = this forward ends the prompt. */
    long long plan_ahead;
    /* statistics */
    long long rows_computed, rows_full;   /* layer-rows computed vs. a full prefill's */
    /* called after each layer of a forward with that layer done (NULL: none); a prefill node
     * ships a KV source's finished pages from here while the next layers compute (src/pd/) */
    void (*layer_done)(void *arg, struct ds41_seq *s, int layer);
    void *layer_done_arg;
    /* the decoder split of a remote prefill (src/pd/, docs/pd.md): stop_layer > 0 ends a
     * forward at that layer's keys (its attention input, SWA keys and compressor on the plan's
     * rows; no output and no later layer); from_layer > 0 starts one at that layer with its
     * block input given for every row (from_X [T, hc * dim] after that layer's Engram, from_pre
     * [T, hc] FP32), the layers before it not run. stream: during a forward, its stacked rows
     * (stream_n of them; sequence 0's from row 0), so a layer_done hook can take a layer's
     * input. */
    int stop_layer, from_layer;
    const float *from_X, *from_pre;
    const struct ds41_stream *stream;
    size_t stream_n;
    /* forward scratch (forward.c): the indexers' per-sequence buffers and the row buffers of
     * short forwards, grown when a forward needs more, so decode steps allocate little */
    struct ds41_fwd_scratch *scratch;
    struct ds41_engram_step *eg_step;   /* P4 prefetch: this sequence's Engram rows in flight */
    /* image rows of the next forward (docs/vision.md), indexed from its first row, set by the
     * caller for that one forward (ds41_feed_embeds) and cleared by it; NULL: every row text.
     * ov_img[t] != 0: row t takes the embedding ov_emb[t * dim ..] (BF16 values) instead of
     * its token's, routes with gate.bias_vl and is a dead token for Engram (gate 0, and no
     * n-gram reaches across it) */
    const float *ov_emb;
    const uint8_t *ov_img;
} ds41_seq;

/* Takes over m when own_model. token_map may be NULL when the config has no Engram layer. */
int ds41_engine_init(ds41_engine *e, ds41_model *m, int own_model, int exact, int n_threads,
                     long long max_pos, int32_t *token_map, int n_compressed, ds41_err *err);
void ds41_engine_free(ds41_engine *e);

int ds41_seq_init(ds41_seq *s, ds41_engine *e, ds41_err *err);
void ds41_seq_free(ds41_seq *s);

/* Runs tokens[T] at positions cache.pos .. cache.pos+T-1 and advances the position.
 * Layout (docs/conformance.md): pos 0 -> one-shot prefill; T = 1 -> decode; else extend.
 * want_logits: compute s->logits for the last row (a prefill that only fills state skips the
 * head and, in CED, the rows only the logits need). The prefill mode applies to forwards
 * with T > 1. */
int ds41_forward(ds41_seq *s, const int32_t *tokens, int T, int want_logits, ds41_err *err);
/* ds41_forward with the final norm + head on every row: rows [T, vocab] gets the logits of
 * each row (s->logits the last one). Every layer runs on every row (the full row plan: no CED
 * cut, no replay), in the forward's usual layout (one-shot at pos 0, extend, decode). */
int ds41_forward_rows(ds41_seq *s, const int32_t *tokens, int T, float *rows, ds41_err *err);
/* Several sequences in one forward (a serving step): sequence i runs tokens[i][0..T[i]) at
 * its position (> 0), a decode (T[i] = 1) or, with ss[i]->verify set, a verify block
 * (LAYOUT_VERIFY: every row sees a decode's KV list, as in ds41_forward_rows); sequence 0 may
 * instead feed a prefill chunk (T[0] > 1 without verify, at any position: what ds41_forward
 * with logits computes, its row plan from ss[0]->prefill, CED or full, on the rows that start
 * the stack, so that each layer's rows are a suffix of the stack; not a restore or replay, no
 * all-row logits). Every linear
 * (attention projections, compressor, indexer query, output, mHC, Engram, shared and routed
 * experts, head) runs once over the stacked rows of all sequences, the MoE grouped by expert
 * across them; attention, indexer scores, compressor pooling and ring writes run per sequence
 * over its own state with the lists it would use alone. rows (NULL, or per sequence NULL or
 * [T[i], vocab]) gets every row's logits; ss[i]->logits its last row. Each sequence ends
 * bit for bit as its own ds41_forward (decode) / ds41_forward_rows (verify) would leave it:
 * exact kernels compute every row independently, and the fast kernels keep one canonical
 * order per row whatever the number of rows (kernels/linear_fast.c). A sequence must appear
 * once and hold a prompt; on an error the sequences may be half-written. */
int ds41_forward_batch(ds41_seq *const *ss, const int32_t *const *tokens, const int *T, float *const *rows, int count,
                       ds41_err *err);
/* [verify] The published index-K owner (spec 3.9 official reading) that a sequence of decodes
 * over positions P..p leaves in front of layer upto_layer's indexer at p, starting from owner
 * (the owner after P-1); upto_layer = n_layers - 1 gives the owner after p. */
int ds41_ik_owner_after(const ds41_config *cfg, int owner, long long P, long long p, int upto_layer);

/* The residual stream of one block pass over n rows and the per-row mHC mixes (spec 3.1),
 * shared by the target forward and the DSpark draft blocks (dspark.c), which run the same
 * block on their own rows: X [n, hc, dim] the block input (and, after the FFN, its output),
 * X2 the stream between the sublayers, pre [n, hc] the mix that feeds the next sublayer
 * (the delayed hand-off), a_* / f_* the attention / FFN sublayer mixes, xin / xa / y [n, dim]
 * the collapsed input, its norm and the sublayer output. */
typedef struct ds41_stream {
    float *X, *X2, *pre, *a_pre, *a_post, *a_C, *f_pre, *f_post, *f_C, *xin, *xa, *y;
    const uint8_t *img;   /* per row: 1 = an image position (bias_vl routing, Engram gate 0); NULL: text */
} ds41_stream;
int ds41_stream_alloc(ds41_stream *b, const ds41_config *cfg, size_t n);   /* zeroed; -1 when out of memory */
void ds41_stream_free(ds41_stream *b);
/* Row t := token tok: hc copies of its embedding row, pre = one-hot copy 0; emb != NULL: the
 * given embedding (dim BF16 values, an image position) instead of the token's. */
void ds41_stream_embed(const ds41_config *cfg, const ds41_weights *w, ds41_stream *b, size_t t, int32_t tok,
                       const float *emb);
/* Before the attention sublayer: its mixes of rows [m0, m0+nm) (the rows it outputs) and
 * xa = rmsnorm(collapse with pre) of rows [x0, x0+nx) (the rows it reads). */
void ds41_block_attn_in(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw, ds41_stream *b,
                        size_t m0, int nm, size_t x0, int nx);
/* After the attention sublayer wrote y: X2 = post-mix of rows [r0, r0+n). */
void ds41_block_attn_out(const ds41_ctx *ctx, const ds41_config *cfg, ds41_stream *b, size_t r0, int n);
/* The MoE sublayer on rows [r0, r0+n): mixes of X2, input collapsed with the attention's pre,
 * X = post-mix, pre = the FFN's pre. msel: chosen experts [n, n_active] (or NULL). */
void ds41_block_ffn(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                    const ds41_layer_plan *lp, ds41_stream *b, size_t r0, int n, int *msel);
/* Head over rows [r0, r0+n): xin = collapse (apply_pre with pre), xa = rmsnorm(xin, norm),
 * logits [n, vocab] = head(xa) in FP32. */
void ds41_stream_head(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_weights *w, const uint16_t *norm,
                      ds41_stream *b, size_t r0, int n, float *logits);

/* Row plan of one forward over T rows (exposed for tests): layer l computes its attention
 * input and SWA K on rows [krow[l], T) and its attention/MoE output on rows [qrow[l], T);
 * lo[l] > 0 truncates the SWA window to rows >= lo[l] (replay only). need_logits = 0 leaves
 * the last layer with no output row (qrow = T) when nothing beyond the state is wanted. */
void ds41_row_plan(const ds41_config *cfg, ds41_prefill_mode mode, int T, int need_logits,
                   int *qrow, int *krow, int *lo);

#endif
