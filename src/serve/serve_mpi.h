/* ds41 serve under mpiexec (docs/distributed.md, "serve"): rank 0 runs the HTTP front, the
 * scheduler, sampling and the prefix cache; the other ranks (followers) mirror every
 * sequence's engine state so that each batch step is the same collective forward on every
 * rank (attention replicated, routed experts exchanged as in every command).
 *
 * The mirror is a stream of operations that rank 0's scheduler records as it calls the
 * engine: a session opened or closed, a prefix-cache restore, publish or trim, a batch step
 * (each item's session, token ids and prefill look-ahead). Records are buffered and broadcast
 * before the first operation that runs a forward (restore, step), so every rank enters the
 * forward's collective calls in the same order; a follower replays each operation on its own
 * sessions and its own prefix cache, which therefore hold exactly rank 0's state (the cache's
 * LRU order included: the same calls in the same order). Sampling stays on rank 0: every
 * token a follower needs is in a step's ids. When idle, rank 0 sends an empty record now and
 * then, so that a follower sees a dead rank 0 within --mpi-timeout.
 *
 * Words on the wire: int32. Operations: OPEN id | CLOSE id | RESTORE id n ids[n] |
 * PUBLISH id n ids[n] | TRIM lo hi (bytes) | STEP count {id n ahead ids[n]}[count] | END |
 * OPEN_ON id rank | SAMPLE id temperature top_k top_p min_p seed_lo seed_hi n_top (floats as
 * their bits) | PROBE n ids[n] | DRAFT id t_next | CALIBRATE width prompt_len reps |
 * LPROC id freq pres rep eos min_tokens_lo min_tokens_hi think_end think_budget_lo
 * think_budget_hi n_bias n_ban n bias_ids[n_bias] bias_values[n_bias] ban_ids[n_ban] ids[n]
 * (floats as their bits; ids: the prompt's distinct ids, for the repetition penalty; think_budget
 * -1: no reasoning budget, else the reply starts in its reasoning and think_end ends it) | IMAGES id n dim flags[n] keys[k][8] rows[k][dim] |
 * PROBE_IMG n ids[n] flags[n] keys[k][8] (k = the flags set, at least 1; keys: each image
 * position's content key, 32 bytes; rows: float bits) |
 * BLOCKS id n ids[n] first nb nbytes bytes[nbytes, padded to words] (code 20) |
 * GMASK id on nw bits[nw] (code 21; on 0: no token constrained, nw 0; on 1: the allowed tokens,
 * nw = (vocab + 31) / 32 words) | GRAMMAR id (code 22) |
 * VMASK id T m {row form c words[c]}[m] (code 23: the allowed tokens of the rows of the verify
 * block of session id that rank 0's step verifies next, T = 1 + drafts rows; only the m rows
 * the grammar restricts, ascending, row r being the one after r drafts; form 1: a bitset of c =
 * (vocab + 31) / 32 words, form 2: the c allowed ids ascending, whichever is shorter; a row not
 * listed is not constrained, before the grammar's gate) |
 * INSTALL id n ids[n] first nb npage nres bytes[npage + nres, padded to words] (code 24, serve
 * --role decode: a remote prefill of blocks [first, first + nb) of the prompt ids[n] of session
 * id, (first + nb) x 128 < n: the fetched pages, block by block and in each block store by
 * store (npage bytes), then the RESUME payload (nres bytes, src/store/kvx_resume.h)) |
 * PD_SEQ id stop n ids[n] (code 25, serve --role prefill: session id prefills as a prefill
 * node's, CED rows, its forwards stopped at layer stop (0: none), no logits; every rank runs
 * the hit query rank 0 ran, the longest cached chain of ids, which moves those blocks to the
 * front of its cache's LRU) | PD_FWD id k n ids[n] (code 26: the forward of ids[k..n) from
 * position k, 0 <= k < n, no logits) |
 * DRAFTS n {id t_next}[n] (code 27, --dp-attention: the proposals of n sequences at once, each
 * as DRAFT would ask it; n >= 2).
 *
 * serve --role decode (replicated attention, docs/pd.md): rank 0's fetch thread only receives
 * a remote prefill; its scheduler thread then sends INSTALL (after BLOCKS, when its cache read
 * the local hit's blocks from its store), and every rank adds the pages to its prefix cache
 * (ds41_prefix_insert) and installs the pages and the state into the session
 * (ds41_pd_install): the same calls on the same state, so the same session on every rank (the
 * decoder stream's form runs a forward of the decoder layers there, collective as any). An
 * install refused for a reason (the hit evicted, a state that does not fit) is refused on
 * every rank alike; rank 0 then sends RESTORE, as after a failed fetch. Under --dp-attention
 * the fetch starts past the owner's local hit (its PROBE answer, ds41_smirror_held), INSTALL
 * is the same record and only the session's owner inserts and installs (its own cache and
 * store: no BLOCKS); every rank joins its forward (ds41_dist_dp_done) and the owner answers
 * rank 0 with the tokens installed (int64; 0: refused, then RESTORE on the owner), by which
 * rank 0 moves its copy on (ds41_session_absorb).
 *
 * --cache-dir (replicated attention): rank 0 alone reads and writes the store. Before a
 * RESTORE whose chain rank 0 had to read from disk (ds41_prefix_load), BLOCKS carries those
 * blocks' pages (blocks first..first+nb-1 of the prompt ids of session id, whose image
 * positions, if any, key the blocks as IMAGES gave them) and the followers add them to their
 * memory caches (ds41_prefix_insert_bytes), which so keep holding exactly rank 0's. A prefill
 * node (serve --role prefill) sends the same BLOCKS before PD_SEQ, for the chain of the
 * request's ids that rank 0's cache read from its store ahead of its hit query
 * (ds41_smirror_pd_load): every rank's hit query, restore and suffix forward then see it.
 *
 * Images: rank 0 encodes them (the tower runs no collective). After OPEN, IMAGES gives the
 * other ranks the prompt's image positions (flags over its n tokens), their content keys and
 * their embeddings; a rank keeps them with the session until CLOSE, and uses them as rank 0
 * does: a RESTORE of the session keys and replays its image blocks with them
 * (ds41_prefix_restore_img), a STEP item of the session that prefills prompt positions carries
 * their rows (batch items with image rows: the image prompt prefills in the steps with the
 * others), a PUBLISH keys the image blocks. Under --dp-attention an image prompt is routed with
 * PROBE_IMG (PROBE with the image positions keyed), and only its owner keeps the rows.
 *
 * --spec (replicated attention): a proposal (ds41_session_draft) runs DSpark's stages,
 * MoE layers included, so rank 0 sends DRAFT (the session, the token it drafts after) before
 * each one and the followers propose too; the --spec auto calibration's forwards likewise
 * (CALIBRATE, when rank 0 has no cached curve). A STEP item with ahead = -1 is a verify block
 * (ids[0] = t_next, then the drafts). Whether a draft is accepted is rank 0's decision (its
 * sampler stream and logits processor): inside each verify, after the forward, rank 0
 * broadcasts {accepted, next token} and the followers keep exactly those rows
 * (ds41_spec_set_outcome_hook).
 *
 * --spec with --split layers: the DSpark stages' taps are the inputs of their target layers,
 * all on the last stage (no stage starts after the first target: dist_stage.h), so the last stage alone proposes:
 * on DRAFT it runs the proposal and answers rank 0 point to point (ds41_pipe_answer: a status
 * word, the B drafts, their B confidences; after a failed proposal a second message of 248
 * bytes with its error), the middle stages do nothing. The verify blocks of a STEP run in the
 * pipelined micro-batches; their logits come to rank 0 with the step's, and their outcomes go
 * to every rank once per step (ds41_smirror_pipe_end), not inside each verify.
 *
 * --spec with --dp-attention: the owner of a sequence proposes (DRAFT: the other ranks join its
 * stages' exchanges, dist_dp.c) and answers rank 0 with the drafts and their confidences, from
 * which rank 0's scheduler plans the verify blocks as in one process (its grammar check, the
 * drafting gate of --spec auto); the owner runs the verify and, holding the sequence's sampler
 * (SAMPLE), decides it as one process does, and answers with the accepted count and the tokens
 * (with logprobs, an entry per token), with the sequence's logits processor (LPROC) if any. For
 * a sequence with a grammar (GRAMMAR: rank 0 holds the matcher) rank 0 sends, ahead of the step
 * that verifies its block, the allowed tokens of each of the block's rows (VMASK: the grammar
 * after the drafts before the row, as one process masks its verify rows); the owner masks each
 * row with them, decides, answers the tokens, and rank 0's grammar advances with them. The
 * calibration of --spec auto runs rank 0's forwards alone; the other ranks join them
 * (CALIBRATE). No outcome hook: each owner decides. The proposals of a step's rows go in one
 * DRAFTS record (one row alone: DRAFT): each owner proposes its own, the ranks' proposals
 * sharing the forward rounds of the expert exchange, and answers rank 0 in one message.
 *
 * --dp-attention (docs/distributed.md): rank 0 gives each new sequence to the least-loaded
 * rank (sequences open there, then tokens held) with OPEN_ON; only that rank holds it. Each
 * rank runs its own items of every STEP (rank 0 too; a rank with none joins the expert
 * exchanges with zero rows) and sends rank 0, per item in step order, a status word and,
 * where the forward computed logits, the token the owner drew (a sequence whose sampler moved
 * there with SAMPLE, and with LPROC its logits processor, a grammar's allowed tokens coming from
 * rank 0 ahead of each sampled row with GMASK) or else the
 * logits row, from which rank
 * 0 samples as from its own; the errors of failed items follow in a second message. Rank 0
 * keeps a session per sequence: for another rank's sequences it runs no forward
 * (ds41_session_absorb, ds41_session_absorb_token). Prefix cache: each rank keeps the blocks
 * of the sequences it held; before admitting a prompt rank 0 asks every rank how much of it
 * its cache holds (PROBE, each answers a block count) and gives it to the rank with the
 * longest hit, then the least-loaded; only the owner restores and publishes, and answers a
 * RESTORE with its hit (and, for a whole prompt, the token or logits of its last row). */
#ifndef DS41_SERVE_MPI_H
#define DS41_SERVE_MPI_H

#include <stddef.h>
#include <stdint.h>

#include "ds41.h"

enum { DS41_SOP_OPEN = 1, DS41_SOP_CLOSE, DS41_SOP_RESTORE, DS41_SOP_PUBLISH, DS41_SOP_TRIM, DS41_SOP_STEP, DS41_SOP_END,
       DS41_SOP_OPEN_ON, DS41_SOP_SAMPLE, DS41_SOP_PROBE, DS41_SOP_DRAFT, DS41_SOP_CALIBRATE,
       /* 13 was EMBEDS (an image prompt fed alone), no longer sent */
       DS41_SOP_LPROC = 14, DS41_SOP_IMAGES = 18, DS41_SOP_PROBE_IMG = 19, DS41_SOP_BLOCKS = 20,
       DS41_SOP_GMASK = 21, DS41_SOP_GRAMMAR = 22, DS41_SOP_VMASK = 23, DS41_SOP_INSTALL = 24, DS41_SOP_PD_SEQ = 25, DS41_SOP_PD_FWD = 26,
       DS41_SOP_DRAFTS = 27 };
/* DRAFTS' bound on its sequences */
#define DS41_SOP_DRAFTS_MAX 65536
/* GMASK's bound on its words (a vocabulary of up to 2^26 tokens); also VMASK's on a row's
 * words (a bitset) or ids (a list, sent only when shorter than the bitset) */
#define DS41_SOP_GMASK_MAX_WORDS (1 << 21)
/* the prefix cache's block (tokens), as BLOCKS counts them */
#define DS41_PREFIX_BLOCK 128
/* a STEP item's ahead word for a verify block */
#define DS41_SOP_VERIFY (-1)

/* One decoded operation; ids / items point into the buffer. */
typedef struct ds41_sop {
    int op;
    int32_t id;
    int rank;                 /* OPEN_ON */
    const int32_t *ids;       /* RESTORE, PUBLISH, PROBE */
    size_t n;
    long long bytes;          /* TRIM */
    float temperature, top_p, min_p;   /* SAMPLE: the sequence's sampler (ds41_session_set_sampling) */
    int top_k, n_top;                  /* n_top: logprobs alternatives (-1: no logprobs) */
    uint64_t seed;
    int count;                /* STEP: items at items (words: id n ahead ids...) */
    const int32_t *items;
    int32_t t_next;           /* DRAFT; DRAFTS: its n {id t_next} pairs at ids */
    int width, prompt_len, reps;   /* CALIBRATE */
    const int32_t *flags;     /* IMAGES, PROBE_IMG: flags[n] (0 or 1), k content keys of 8 words at keys; */
    const int32_t *keys;
    int dim;                  /* IMAGES: k rows of dim float words at rows */
    size_t k;
    const int32_t *rows;
    float freq, pres, rep;    /* LPROC: the penalties; bias ids and values (float bits), ban ids, the prompt's ids at ids */
    int eos, n_bias, n_ban;
    long long min_tokens;
    int think_end;            /* LPROC: the reasoning budget (think_budget -1: none) */
    long long think_budget;
    const int32_t *bias_id, *bias_val, *ban;
    int stop;                 /* PD_SEQ: the layer its forwards stop at (0: none) */
    long long at_pos;         /* PD_FWD: the position the forward starts at (k) */
    int first, nb;            /* BLOCKS, INSTALL: blocks [first, first + nb) of ids, their pages in blk (blk_len bytes) */
    size_t blk_len;
    const uint8_t *blk;
    size_t res_len;           /* INSTALL: the RESUME payload at res (res_len bytes) */
    const uint8_t *res;
    int on;                   /* GMASK: 1 when bits[n] (the allowed tokens) follow, 0: none constrained */
    const int32_t *bits;      /* GMASK: the words; VMASK: the first of its k restricted rows of a block of n rows,
                               * each {row form count words[count]} (ascending rows; form 1: a bitset, 2: ascending ids) */
} ds41_sop;

/* Decodes the operation at w[*at] (n words in all), advancing *at. 1: one decoded; 0: the end
 * of the buffer; -1: malformed (err names the word and what was expected). */
int ds41_sop_next(const int32_t *w, size_t n, size_t *at, ds41_sop *op, char *err, size_t errcap);

/* ---- rank 0: the recorder (NULL-safe: every call with m == NULL does nothing) */
typedef struct ds41_smirror ds41_smirror;
ds41_smirror *ds41_smirror_new(void);
void ds41_smirror_free(ds41_smirror *m);
/* --dp-attention with a prefix cache (pc; NULL: none): the next ds41_smirror_open goes to the
 * rank whose cache holds the longest prefix of ids (im: its image positions keyed, NULL: text). */
void ds41_smirror_route(ds41_smirror *m, ds41_prefix_cache *pc, const int32_t *ids, size_t n, const ds41_prefix_img *im);
/* rank0: the sequence stays on rank 0 (under --dp-attention with --spec, one whose tokens rank 0
 * draws: one asking for more logprobs than the owner sends) */
void ds41_smirror_open(ds41_smirror *m, const ds41_session *s, int rank0);
void ds41_smirror_close(ds41_smirror *m, const ds41_session *s);
/* After ds41_session_set_sampling and (lp active) ds41_lproc_prompt: under --dp-attention the
 * rank that holds the sequence samples it and sends rank 0 the token only, and with logprobs
 * (n_top >= 0; -1: none) the token's logprob and the n_top best; a logits processor (lp,
 * NULL: none) goes with it (LPROC: logit_bias, min_tokens, the penalties, whose counts the
 * owner keeps from the tokens it draws). With a grammar, GRAMMAR follows: rank 0 keeps the
 * matcher and, ahead of every row the owner samples (a STEP item or a whole-prompt RESTORE),
 * sends its allowed tokens (GMASK, ds41_lproc_allowed), and ahead of a verify block (--spec)
 * those of each of its rows (VMASK), which the owner's processor applies in the grammar's place;
 * rank 0's processor advances the grammar with each token taken. */
struct ds41_lproc;
void ds41_smirror_sampling(ds41_smirror *m, const ds41_session *s, float temperature, int top_k, float top_p, float min_p,
                           uint64_t seed, int n_top, struct ds41_lproc *lp);
/* The logprobs the owner sent with s's last token (1), or 0: rank 0 computes them from the row. */
int ds41_smirror_logprobs(ds41_smirror *m, const ds41_session *s, int n_top, float *lp, int32_t *top_id, float *top_lp);
/* ds41_prefix_restore_img as every rank must see it (m == NULL: the restore alone; im NULL:
 * text, else the other ranks use the rows of ds41_smirror_images): the tokens restored, or -1
 * (ds41_session_error). Under --dp-attention the owner restores from its cache. */
long long ds41_smirror_restore(ds41_smirror *m, ds41_engine *e, ds41_prefix_cache *pc, ds41_session *s, const int32_t *ids,
                               size_t n, const ds41_prefix_img *im);
/* before ds41_prefix_publish: 1 when rank 0 publishes too (it holds the session's state) */
int ds41_smirror_publish(ds41_smirror *m, const ds41_session *s, const int32_t *ids, size_t n);
/* --cache-dir under mpiexec (replicated attention): rank 0's cache reads and writes a store,
 * so ds41_smirror_restore ships the blocks it reads from disk (BLOCKS) */
void ds41_smirror_store(ds41_smirror *m);
/* before ds41_prefix_trim / ds41_batch_step */
void ds41_smirror_trim(ds41_smirror *m, long long bytes);
void ds41_smirror_step(ds41_smirror *m, const ds41_batch_item *it, int count);
/* ds41_session_draft(s, t_next, ids, conf) as every rank must see it (m == NULL: the proposal
 * alone); under --dp-attention the owner proposes and ids, conf come from it. 0, or -1
 * (ds41_session_error). */
int ds41_smirror_propose(ds41_smirror *m, ds41_engine *e, ds41_session *s, int32_t t_next, int32_t *ids, float *conf);
/* The proposals of n sequences, as n calls of ds41_smirror_propose (rc[i]: each one's result,
 * ids[i] and conf[i] its B drafts and confidences); under --dp-attention one DRAFTS record for
 * them all: each owner proposes its own in order, the ranks' proposals sharing the forward
 * rounds of the expert exchange (the rounds of a step are those of the rank with the most
 * proposals, not their sum), and each rank answers rank 0 in one message. ndraft: the drafts
 * each proposal needs (ds41_session_draft_all; 0: all), honoured where rank 0 proposes (one
 * process, replicated, its own under --dp-attention); the other ranks make every draft, which
 * only costs them their local head passes. */
void ds41_smirror_propose_all(ds41_smirror *m, ds41_engine *e, int n, ds41_session *const *s, const int32_t *t_next, int ndraft,
                              int32_t *const *ids, float *const *conf, int *rc);
/* ds41_spec_calibrate(e, width, prompt_len, reps, c, err, errcap) with the other ranks (their
 * own calibration, or under --dp-attention joining rank 0's forwards) */
int ds41_smirror_calibrate(ds41_smirror *m, ds41_engine *e, int width, int prompt_len, int reps, ds41_spec_curve *c,
                           char *err, size_t errcap);
/* After ds41_smirror_open of a prompt with images (im: its flags, keys and embeddings over its
 * im->n tokens, rows of dim floats): the other ranks keep them with the session (IMAGES). */
void ds41_smirror_images(ds41_smirror *m, const ds41_session *s, const ds41_prefix_img *im, int dim);
/* The scheduler's step: ds41_smirror_step and ds41_batch_step (m == NULL: the step alone);
 * under --dp-attention rank 0 runs only its own items and takes the others' answers. */
void ds41_smirror_batch_step(ds41_smirror *m, ds41_engine *e, ds41_batch_item *it, int count);
/* --split layers (m != NULL, no --dp-attention, stages): 1 when rank 0's scheduler may keep a
 * step in flight while it begins the next (ds41_smirror_batch_begin / _end), else 0. */
int ds41_smirror_overlap(const ds41_smirror *m, const ds41_engine *e);
/* ds41_smirror_batch_step in two parts: begin records the step and sends its forwards into
 * the stages, returning a handle; end (with that handle, steps ended in the order begun)
 * waits for their logits. Between the two, other records, restores and another step's begin
 * may run (disjoint sessions); the step's sessions are left alone until its end. */
int ds41_smirror_batch_begin(ds41_smirror *m, ds41_engine *e, ds41_batch_item *it, int count);
void ds41_smirror_batch_end(ds41_smirror *m, ds41_engine *e, ds41_batch_item *it, int count, int handle);
/* An empty record when nothing was sent for a while (the scheduler's idle wait). */
void ds41_smirror_beat(ds41_smirror *m);
/* The followers leave their loop (rank 0's serve ends). */
void ds41_smirror_end(ds41_smirror *m);
/* How long the scheduler may idle between beats (seconds). */
double ds41_smirror_beat_s(void);

/* serve --role decode under mpiexec: the local hit (whole blocks of ids[n]) that a remote
 * prefill of session s starts past, without moving anything: rank 0's cache
 * (ds41_prefix_held), or under --dp-attention the one the owner answered to the PROBE that
 * routed s (0 when s was not routed so: the whole prompt is fetched). */
long long ds41_smirror_held(ds41_smirror *m, ds41_prefix_cache *pc, const ds41_session *s, const int32_t *ids, size_t n);
/* Before rank 0 installs a remote prefill into s (blocks [first, first + nb) of ids[n], pages
 * [nb][n_kv_sources] of page_bytes[store] bytes each, the RESUME payload res[res_len]): the
 * hit's blocks it read from its store (BLOCKS; not under --dp-attention), then INSTALL, sent
 * at once (the install may run a forward). 1 when rank 0 installs too (it holds s: always,
 * but under --dp-attention only when it owns s); then ds41_smirror_install_end with what
 * rank 0's install gave (got; 0 when it did not install). */
int ds41_smirror_install(ds41_smirror *m, ds41_prefix_cache *pc, const ds41_session *s, const int32_t *ids, size_t n,
                         int first, int nb, uint8_t *const *pages, const size_t *page_bytes, int n_stores,
                         const uint8_t *res, size_t res_len);
/* The tokens s holds after the install (ds41_pd_install's result): got; under --dp-attention
 * rank 0 joins the owner's forward and, for another rank's s, takes the owner's answer (the
 * tokens installed, 0: refused) and moves its copy of s on by them (ds41_session_absorb);
 * -1 (s broken, ds41_session_error) on an answer out of range. */
long long ds41_smirror_install_end(ds41_smirror *m, ds41_engine *e, ds41_session *s, size_t n, long long got);
/* A follower's INSTALL of a session it holds (serve_pd.c; without UCX an error): the pages
 * into its prefix cache and the install into s, as rank 0 does; *got: the tokens s holds
 * (0: refused). 0, or -1 with err (the rank cannot go on). */
int ds41_serve_pd_follow_install(ds41_engine *e, ds41_prefix_cache *pc, ds41_session *s, const ds41_sop *op,
                                 long long *got, char *err, size_t errcap);

/* serve --role prefill under mpiexec (rank 0, the prefill node's compute, under its mutex):
 * pd_load before rank 0's own hit query over ids[n]: with --cache-dir (ds41_smirror_store) the
 * blocks of the chain that rank 0's cache reads from its store come into its memory and go to
 * the other ranks (BLOCKS), so that the hit query, the restore and the forward of the suffix
 * find the same chain on every rank (nothing without a store); PD_SEQ for s after rank 0's
 * own hit query over ids[n]; PD_FWD before its forward of ids[k..n), sent at once. */
void ds41_smirror_pd_load(ds41_smirror *m, ds41_prefix_cache *pc, const ds41_session *s, const int32_t *ids, size_t n);
void ds41_smirror_pd_seq(ds41_smirror *m, const ds41_session *s, int stop_layer, const int32_t *ids, size_t n);
void ds41_smirror_pd_forward(ds41_smirror *m, const ds41_session *s, long long k, const int32_t *ids, size_t n);

/* ---- followers: replays rank 0's operations until END. pc: this rank's prefix cache (NULL
 * when rank 0 has none), sp: the scheduler's session parameters. 0, or -1 with err. */
int ds41_smirror_follow(ds41_engine *e, ds41_prefix_cache *pc, const ds41_session_params *sp, char *err, size_t errcap);

/* ---- faults: rank 0's scheduler, installed for the job's lifetime; on a lost rank the MPI
 * layer calls it (on the scheduler thread) before ending the job, so that every request in
 * flight is answered with a 503 naming the fault. */
struct ds41_sched;
void ds41_smirror_on_fault(struct ds41_sched *S);

/* ---- the 503 guard (serve_mpi_guard.c): rank 0's own process, in a session of its own, that
 * answers the requests in flight when hydra kills rank 0 (after another rank died). */
enum { DS41_SGUARD_OPEN = 1, DS41_SGUARD_DONE, DS41_SGUARD_BYE };
#define DS41_SGUARD_STREAM 1u
#define DS41_SGUARD_MAGIC 0x44534731u   /* "DSG1" */
#define DS41_SGUARD_HDR 32              /* u32 magic, op, id, flags; i64 written; u32 n_full, n_tail */
typedef struct ds41_sguard_msg {
    int op;
    uint32_t id, flags;
    int64_t written;                  /* OPEN: the socket's bytes written at registration */
    const uint8_t *full, *tail;       /* OPEN: the 503 reply; the stream's tail (into the buffer) */
    size_t n_full, n_tail;
} ds41_sguard_msg;
/* Decodes one message of n bytes that came with nfd descriptors: 0, or -1 with a one-line err. */
int ds41_sguard_decode(const uint8_t *b, size_t n, int nfd, ds41_sguard_msg *m, char *err, size_t errcap);
/* Writes a message's header (DS41_SGUARD_HDR bytes) at b. */
void ds41_sguard_header(uint8_t *b, uint32_t op, uint32_t id, uint32_t flags, int64_t written, uint32_t n_full, uint32_t n_tail);
/* The bytes written on a TCP socket since it opened (acked + queued), or -1. */
int64_t ds41_sguard_written(int fd);
/* rank 0: starts the guard (0, or -1 with err: serve goes on without it). */
int ds41_sguard_start(char *err, size_t errcap);
/* A generation request on client socket fd is in flight: full, the whole HTTP 503 reply for
 * when nothing was sent; tail, a stream's end (stream != 0) for when it had begun. The id for
 * ds41_sguard_done, or 0 (no guard, or its queue is full: the request is not covered). */
uint32_t ds41_sguard_open(int fd, int stream, const char *full, size_t n_full, const char *tail, size_t n_tail);
void ds41_sguard_done(uint32_t id);
/* adds s CPU seconds of a request thread's work for the guard (answers built, handed over, ended) to the stats */
void ds41_sguard_note(double s);
/* rank 0 answered its requests itself (clean exit, or the fault path's 503s): the guard closes
 * its sockets and exits; waits for it. */
void ds41_sguard_release(void);
/* requests handed over, requests not (the guard's queue full), the CPU seconds noted */
void ds41_sguard_stats(long long *opened, long long *dropped, double *cost_s);
/* the guard process (main.c: ds41 --serve-guard FD) */
int ds41_sguard_main(int argc, char **argv);

/* --split layers (serve_mpi_pipe.c), every rank, in place of ds41_batch_step: the step's
 * items in G = min(count, most) micro-batches of consecutive items (most: --pipe-batches,
 * default 2 x ranks), cut where the rows reach g / G of the step's (cut[0..G]; the same cut on
 * every rank), each a ds41_batch_step whose stages overlap the next one's; rank 0 collects the
 * logits at the end. Without stages: ds41_batch_step. Returns the items that failed. */
int ds41_smirror_pipe_groups(const ds41_batch_item *it, int count, int most, int *cut);
int ds41_smirror_pipe_step(ds41_engine *e, ds41_batch_item *it, int count);
/* ds41_smirror_pipe_step in two parts (rank 0's overlapped steps): begin runs the
 * micro-batches (the first stage, on rank 0) and sets *forwards to the forwards whose logits
 * are pending; end collects them (the oldest pending first: other forwards, a later step's,
 * may follow them and stay pending). Returns the items that failed.
 * --spec: a verify block's acceptance waits for its logits, so begin leaves it pending on
 * every rank (ds41_batch_end) and end, on every rank with the same items, ends the step's
 * verify blocks: rank 0 decides each and broadcasts the outcomes ({accepted, next token} per
 * verify item, 8 bytes each, one broadcast per step), and every stage keeps those rows and
 * rolls back its own layers' state before the next record. Under --spec the scheduler does
 * not overlap steps (a step's end is a collective the next step's proposals would wait on). */
int ds41_smirror_pipe_begin(ds41_engine *e, ds41_batch_item *it, int count, int *forwards);
int ds41_smirror_pipe_end(ds41_engine *e, ds41_batch_item *it, int count, int forwards);
/* The steps whose verify outcomes this rank broadcast or received, and their bytes. */
void ds41_smirror_pipe_outcomes(long long *steps, long long *bytes);

#endif
