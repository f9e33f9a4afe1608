/* Internal to the forward pass (forward.c, fwd_attn.c): the buffers of one forward over
 * stacked rows, the per-sequence scratch, and the attention sublayer over the sequences of a
 * forward (one sequence is a batch of one). Not an API: ds41_forward* in forward.h is. */
#ifndef DS41_FWD_ATTN_H
#define DS41_FWD_ATTN_H

#include "forward.h"

/* LAYOUT_VERIFY (speculative verification, spec.c, docs/speculative.md): a multi-token forward
 * at P > 0 whose every row sees exactly the KV list of a single-token decode at its position. */
enum { LAYOUT_ONESHOT, LAYOUT_EXTEND, LAYOUT_DECODE, LAYOUT_VERIFY };

/* The sequence's part of a forward's scratch: what its indexers and attention keep between
 * layers (index keys, top-k lists, candidate pool) and the indexer's temporaries. Owned by the
 * sequence (ds41_seq.scratch) and grown when a forward needs more, so a decode step allocates
 * none of it; ds41_fwd_part_begin marks everything stale at the start of a forward. */
typedef struct seq_part {
    int n_layers, n_stores;
    int32_t **sel;        /* per layer: top-k lists [T, sel_w] (index sources) */
    size_t *sel_cap;      /* ints held */
    int *sel_w;
    uint8_t *pool;        /* candidate pool [T, nb] of the candidate source */
    size_t pool_cap;
    int pool_nb;
    float *scores;        /* indexer: [E] scores, [2E + 8] top-k scratch, [k] chosen */
    int *iscr, *chosen;
    size_t scores_cap, iscr_cap, chosen_cap;
} seq_part;

typedef struct fwd_buf {
    ds41_stream s;        /* the residual stream of the T rows */
    float *kc;
    uint8_t *rec;
    float *cq, *q, *o, *wos;
    float *ringf;
    int32_t *list;
    int *msel;
    int32_t *pos;
    int64_t *eg_ids;      /* [n_eg][T][cols] */
    float *gkv;           /* main-KV rows one layer's queries list, dequantized [n_gather, head_dim] */
    int32_t *gmap;        /* per entry j: its row in gkv + 1, 0 = not gathered (zero between layers) */
    int32_t *gent;        /* per gathered row: its entry, to clear gmap afterwards */
    seq_part *sp;         /* the sequence's part (not owned) */
    const uint8_t **grec; /* P2: per gathered row its packed record (read by the attention kernel) */
} fwd_buf;


static inline int ds41_fwd_eg_cols(const ds41_config *cfg) {
    return cfg->n_engram_layers > 0 ? (cfg->engram_max_ngram - 1) * cfg->engram_n_heads : 0;
}

/* The buffers of one forward over N stacked rows (one sequence: N = T), the longest
 * sequence having Tmax rows and at most Emax compressed entries per store. */
/* *buf holds at least n elements of size sz (grown to max(n, 2 x its size); contents lost). */
int ds41_fwd_grow(void **buf, size_t *cap, size_t n, size_t sz);
int ds41_fwd_buf_alloc(fwd_buf *b, const ds41_engine *e, size_t N, size_t Tmax, long long Emax);
void ds41_fwd_buf_free(fwd_buf *b);
/* A forward starts: nothing of an earlier one in p is valid. */
void ds41_fwd_part_begin(seq_part *p);

/* The sequence's scratch (ds41_seq.scratch): its seq_part and the row buffers of short
 * forwards. get creates it on first use (NULL when out of memory). */
struct ds41_fwd_scratch *ds41_fwd_scratch_get(ds41_seq *s);
seq_part *ds41_fwd_scratch_part(struct ds41_fwd_scratch *x);
void ds41_fwd_scratch_free(ds41_seq *s);
/* The buffers of a T-row forward of s alone reaching Emax entries: the scratch's (grown if
 * needed) or, past its row cap, new ones in *tmp (tmp_sp too) that ds41_fwd_release frees.
 * Marks the seq_part stale. NULL when out of memory. */
fwd_buf *ds41_fwd_acquire(ds41_seq *s, size_t T, long long Emax, fwd_buf *tmp, seq_part *tmp_sp);
void ds41_fwd_release(fwd_buf *b, fwd_buf *tmp);

/* The conformance trace of layer l (docs/conformance.md) of one sequence's T rows. */
void ds41_fwd_trace_layer(ds41_trace *tr, const ds41_layer_plan *lp, int l, const seq_part *sp, const int *msel, int T);

/* The sequences of one forward, stacked: sequence i has rows [r0[i], r0[i] + T[i]) of the
 * stack and a view v[i] of the stacked buffers (ds41_fwd_view). Sequence 0 alone may carry a
 * row plan (a prefill, a chunk, a restore or replay); the others compute every row. */
typedef struct fwd_seqs {
    ds41_seq *const *ss;
    fwd_buf *v;               /* per sequence: its view */
    const int *T;             /* rows per sequence */
    const size_t *r0;         /* first stacked row */
    const int *layout;
    int count;
    size_t N;                 /* stacked rows */
    float *cproj, *iq, *wt;   /* compressor projections [2N, head_dim] (count > 1), indexer queries and weights [N, ...] */
} fwd_seqs;

/* v := sequence view of b at stacked row r0 (its sp is set by the caller). */
void ds41_fwd_view(fwd_buf *v, const fwd_buf *b, const ds41_config *cfg, size_t r0);

/* The attention sublayer of layer l over the stack: x rows [k0, N) in b->s.xa, output rows
 * [q0, N) into b->s.y; lo: sequence 0's SWA window floor (replay). */
int ds41_fwd_attention(const fwd_seqs *fs, fwd_buf *b, int l, int k0, int q0, int lo, ds41_err *err);

/* --split layers, a cut that is not at a KV source (dist_stage.h ds41_cut_need; fwd_cut.c): the
 * bytes of what crosses besides the stream for the forward's sequences (0 when nd is NULL or
 * nothing crosses), packed by the stage before the cut after its layers and unpacked by the
 * stage after it (entries into its replica of the source's store, top-k lists and candidate
 * pool into each sequence's part) before its first layer. 0, or -1 with err. */
struct ds41_cut_need;
size_t ds41_fwd_cut_size(const fwd_seqs *fs, const struct ds41_cut_need *nd);
int ds41_fwd_cut_pack(const fwd_seqs *fs, const struct ds41_cut_need *nd, uint8_t *out, ds41_err *err);
int ds41_fwd_cut_unpack(const fwd_seqs *fs, const struct ds41_cut_need *nd, const uint8_t *in, ds41_err *err);

#endif
