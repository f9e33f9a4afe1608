/* ds41 public library API: load a model, open sessions (one per sequence), feed tokens,
 * read logits, sample, free.
 *
 * An engine is immutable after ds41_load and may be shared by any number of sessions; a
 * session owns one sequence's state (packed KV pages, SWA rings, compressor state, Engram
 * history) and its scratch, so sessions never share mutable memory.
 *
 * Threads: one session must not be used from two threads at once. Different sessions of one
 * engine may be used from different threads at the same time: a forward only reads the
 * engine, and with n_threads > 1 the engine's thread pool runs one parallel loop at a time
 * (a lock), so concurrent forwards take turns on the same n_threads threads -- they do not
 * get more of them -- and each gives bit for bit what it gives alone (the pool's split of a
 * loop depends only on the loop size and n_threads). ds41_load / ds41_unload must not run
 * concurrently with any use of the engine. ds41_batch_step / ds41_feed_batch is the entry point
 * a batching scheduler uses: the decode rows and verify blocks of all its sessions run in one
 * forward (weights read once per step), bit for bit what each gives alone. */
#ifndef DS41_H
#define DS41_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds41_engine ds41_engine;
typedef struct ds41_session ds41_session;

typedef struct ds41_load_params {
    int exact;             /* 1: exact kernels (exact-mode.md), 0: fast kernels (default) */
    int n_threads;         /* fast-mode threads (default 1) */
    long long ctx_size;    /* positions a session can hold (default min(4096, model max)) */
    int load;              /* DS41_LOAD_MMAP (default): weights read from the page cache through
                            * mmap; DS41_LOAD_COPY: read once into anonymous memory (huge pages
                            * advised) at load */
    int readahead;         /* 1: before each layer runs, madvise(MADV_WILLNEED) the next layer's
                            * weights (for checkpoints larger than the page cache); default 0 */
    int engram_mode;       /* DS41_ENGRAM_*: where the Engram tables live (docs/engram-offram.md);
                            * default AUTO: PREFETCH when they exceed half of the memory available
                            * (MemAvailable, or the memory cgroup's room), else MMAP */
    long long engram_cache;/* PREFETCH: bytes of the Engram row cache (CLOCK); 0: min(1 GiB, 1/16
                            * of the memory available); -1: none */
    int engram_verbose;    /* 1: always print where the Engram tables live (else only when they
                            * are not simply mapped into memory that holds them) */
} ds41_load_params;
enum { DS41_LOAD_MMAP = 0, DS41_LOAD_COPY = 1 };
/* "mmap" / "copy" -> DS41_LOAD_*; -1 if neither. */
int ds41_parse_load(const char *s, int *load);
/* Engram tables: read into anonymous memory at load (RAM), page-faulted through the mapping
 * (MMAP), or their rows read per step from the files with asynchronous I/O into a bounded row
 * buffer behind a row cache (PREFETCH). Every mode gives bit-identical results. */
enum { DS41_ENGRAM_AUTO = 0, DS41_ENGRAM_RAM = 1, DS41_ENGRAM_MMAP = 2, DS41_ENGRAM_PREFETCH = 3 };
/* "auto" / "ram" / "mmap" / "prefetch" -> DS41_ENGRAM_*; -1 if none. */
int ds41_parse_engram_mode(const char *s, int *mode);
const char *ds41_engram_mode_name(int mode);
/* Engram I/O counters since load (PREFETCH; zero otherwise): the mode in effect, io_uring or
 * pread, the row cache, the step lookups (distinct rows per step) and cache hits, rows and
 * bytes read from the files, retried reads, failed rows, and the time forwards waited for rows
 * (total and the worst step). */
typedef struct ds41_engram_stats {
    int mode, uring;
    long long table_bytes, cache_bytes, cache_rows, cache_used;
    long long steps, refs, lookups, hits, rows_read, bytes_read, retries, errors;
    double stall_s, stall_max_s;
    double issue_s, lead_s;   /* time in the steps' issue; from each issue to its first wait */
} ds41_engram_stats;
void ds41_engram_get_stats(ds41_engine *e, ds41_engram_stats *out);

enum { DS41_PREFILL_MODE_CED = 0, DS41_PREFILL_MODE_FULL = 1, DS41_PREFILL_MODE_REPLAY = 2 };
enum { DS41_INDEX_K_OWN = 0, DS41_INDEX_K_OFFICIAL = 1 };
/* Chunked prefill (ds41_session_params.chunk): a chunk of a prompt runs each decoder layer only
 * on the rows the prompt's end can still reach (the CED row plan of the whole feed), so chunks
 * cost what one forward over the prompt costs, in memory bounded by the chunk, and give
 * bit-identical logits and state for chunks of at least the window. */
enum { DS41_CHUNK_OFF = -1, DS41_CHUNK_AUTO = 2048 };

typedef struct ds41_session_params {
    int prefill;           /* DS41_PREFILL_MODE_*: how multi-token feeds skip rows (default ced) */
    int chunk;             /* > 0: feeds longer than this run in chunks of this many tokens;
                            * 0 (default): feeds longer than DS41_CHUNK_AUTO tokens run in
                            * about equal chunks of at most DS41_CHUNK_AUTO (never under the
                            * window); DS41_CHUNK_OFF: every feed in one forward */
    int index_k;           /* DS41_INDEX_K_* (spec 3.9 / 10.1) */
    int draft;             /* 1: keep the DSpark context rings so ds41_session_draft can propose */
    int no_meta_reuse;     /* P5 off: a proposal recomputes the context row and ring key of its
                            * position instead of reusing the ones the target side seeded */
} ds41_session_params;

void ds41_load_params_default(ds41_load_params *p);
void ds41_session_params_default(ds41_session_params *p);

/* dir: a checkpoint directory (config.json + safetensors; engram_token_map.i32 or
 * tokenizer.json when the config has Engram layers). NULL on failure, message in err. */
ds41_engine *ds41_load(const char *dir, const ds41_load_params *p, char *err, size_t errcap);
void ds41_unload(ds41_engine *e);
int ds41_vocab_size(const ds41_engine *e);
long long ds41_ctx_size(const ds41_engine *e);

ds41_session *ds41_session_open(ds41_engine *e, const ds41_session_params *p, char *err, size_t errcap);
void ds41_session_close(ds41_session *s);
/* Forgets the sequence and keeps the memory (KV pages stay allocated and are still counted
 * in global_kv_page_bytes): position 0, zero logits, the sampler's random stream back at its
 * seed, an earlier error cleared. The same calls then give bit-identical results to a fresh
 * session. A trace in progress keeps appending. */
void ds41_session_reset(ds41_session *s);
long long ds41_session_pos(const ds41_session *s);   /* tokens held */
const char *ds41_session_error(const ds41_session *s);

/* Appends ids[n] to the sequence (prefill, extend or decode) and computes the logits of the
 * last one. 0 on success, -1 on error (ds41_session_error). A feed refused before it starts
 * (n = 0, an id outside the vocabulary, more tokens than the context has left) changes
 * nothing; a feed that fails while running (out of memory) may have written part of the
 * state, so the session then refuses ds41_feed and ds41_session_draft until
 * ds41_session_reset. */
int ds41_feed(ds41_session *s, const int32_t *ids, size_t n);
/* A part of a prompt fed in several calls (a server's prefill chunks): ds41_feed of ids[n]
 * where the caller's next feeds on this session are the prompt's next `ahead` tokens (ahead = 0
 * for the last part). The CED row plan then reaches from the prompt's end, as in one ds41_feed
 * of the whole prompt, so a part runs each decoder layer only on the rows the prompt's last
 * logits or decode state can still reach. A part with ahead > 0 computes no logits
 * (ds41_logits is not valid until the last part), and a session that is then fed anything else
 * than those tokens has decoder windows missing rows. After the last part the logits and state
 * equal those of one ds41_feed over the whole prompt chunked at the same bounds. */
int ds41_feed_part(ds41_session *s, const int32_t *ids, size_t n, size_t ahead);
/* ds41_feed that also returns the logits of every fed token: out [n x ds41_vocab_size],
 * row i = the logits after ids[i] (the distribution of the token at position pos + i + 1);
 * ds41_logits then returns row n-1. For perplexity and speculative verification. Every layer
 * runs on every row and the final norm + head on every row (no CED row cut; the prefill mode
 * is ignored, replay included); the session's chunk setting applies as in ds41_feed. Works at
 * position 0 (prompt) and after it (extend; n = 1 is a decode step). Same checks, errors and
 * state afterwards as ds41_feed. In exact mode row i equals bit for bit the logits of feeding
 * the tokens one at a time while the SWA + compressed list of each layer fits one 64-wide
 * attention block (tests/test_feed_logits.c; README, Library). */
int ds41_feed_logits(ds41_session *s, const int32_t *ids, size_t n, float *out);
/* Several sequences at once (each with its own ids): ds41_batch_step with feed items (decode
 * rows and one prefill chunk in one forward, further chunks one at a time); returns the number
 * that failed. */
int ds41_feed_batch(ds41_session **ss, const int32_t *const *ids, const size_t *n, int count);
/* ds41_feed where the positions with is_image[i] != 0 take the embedding emb[i * dim ..]
 * (dim = ds41_model_dim; BF16 values, such as ds41_image_span's rows) instead of ids[i]'s:
 * image positions (docs/vision.md) route with gate.bias_vl and are dead tokens for Engram
 * (gate 0; no n-gram reaches across them). Rows of emb at text positions are not read.
 * is_image NULL or all zero: exactly ds41_feed. Not with the ced-replay prefill. Every image
 * position carries the same id, so the prefix cache holds the blocks of such a prompt only
 * through ds41_prefix_restore_img / _publish_img, which key image positions on the image's
 * content (ds41_prefix_insert and the plain calls would match another image). */
int ds41_feed_embeds(ds41_session *s, const int32_t *ids, size_t n, const float *emb, const uint8_t *is_image);
int ds41_model_dim(const ds41_engine *e);
/* The image span of pixels [3, H, W] (BF16 values, H and W multiples of the patch size) through
 * the checkpoint's vision tower and aligner: *rows positions (start, each token-grid row closed
 * by the newline vector, end), *out [rows, dim] malloc'd (the caller frees it). Every position
 * of the span carries the config's image_token_id (ds41_image_token_id). 0, or -1 with err. */
int ds41_image_span(ds41_engine *e, const float *pixels, int H, int W, float **out, int *rows, char *err,
                    size_t errcap);
int ds41_image_token_id(const ds41_engine *e);
/* ds41_image_span on a thread pool of its own with the engine's thread count (created and
 * destroyed by the call): the same kernels and split, so the same bits, but a thread running
 * it beside another that runs the engine's forwards never waits for the engine's pool, whose
 * jobs are one at a time (the server encodes images so, off its scheduler thread). */
int ds41_image_span_apart(ds41_engine *e, const float *pixels, int H, int W, float **out, int *rows, char *err,
                          size_t errcap);
/* 1 when the checkpoint holds its vision tower's tensors, whole and well shaped (a config with
 * a vision_config alone is not enough), else 0: ds41_image_span would refuse. */
int ds41_has_vision(const ds41_engine *e);
/* ds41_image_span of an encoded image: data[0..len) is a PNG or JPEG file's bytes, decoded and
 * preprocessed as the official image processor does with the checkpoint's vision parameters
 * (src/image/image.h; refused beyond its default limits: 64 MiB, 16384 pixels a side, 50 M
 * pixels). Errors name what was wrong (format, truncation, size, no tower). */
int ds41_image_span_encoded(ds41_engine *e, const uint8_t *data, size_t len, float **out, int *rows, char *err,
                            size_t errcap);
/* The span length (positions) ds41_image_span_encoded gives an image of width x height pixels,
 * from the checkpoint's preprocessing plan alone (no decoding, no tower); -1 with err when no
 * plan fits the image or the checkpoint has no vision config. */
int ds41_image_span_positions(const ds41_engine *e, int width, int height, char *err, size_t errcap);
/* The first half of ds41_image_span_encoded: data decoded and preprocessed into *pixels [3, H,
 * W] (malloc'd BF16 values, what ds41_image_span takes), and, when key != NULL, the image's
 * content key: SHA-256 of the preprocessed size and pixel bits, the same for two files that
 * give the same pixels, different for any other (the prefix cache keys image positions on it,
 * ds41_prefix_img). Milliseconds, against the tower's seconds at production width. */
int ds41_image_prepare(ds41_engine *e, const uint8_t *data, size_t len, float **pixels, int *H, int *W,
                       uint8_t key[32], char *err, size_t errcap);
/* Logits of the last fed token: ds41_vocab_size floats. */
const float *ds41_logits(const ds41_session *s);
/* The n bytes fn(row, vocab, arg, out) makes of those logits, computed where the row is: under
 * `mpiexec ... --split layers` (a command: ids after the last stage) the row stays on the last
 * stage, fn runs there and only its n bytes go to rank 0 (far fewer than the row: run --json's
 * top logprobs); the other ranks get n zero bytes. Elsewhere fn runs here on ds41_logits. Every
 * rank calls it at the same point (SPMD), as ds41_logits. */
void ds41_logits_reduce(ds41_session *s, void (*fn)(const float *row, int V, void *arg, void *out), void *arg, void *out,
                        size_t n);

/* Sampling (spec 3.15): temperature 0 = greedy (first maximum); top_k 0, top_p 1, min_p 0 = off.
 * A new session samples greedily with seed 0. */
void ds41_session_set_sampling(ds41_session *s, float temperature, int top_k, float top_p, float min_p, uint64_t seed);
int ds41_session_sample(ds41_session *s);           /* next token from the current logits */
/* A logits processor (src/engine/lproc.h: penalties, logit_bias, min_tokens, a grammar) for
 * every later sample of the session, plain or speculative; NULL removes it. The caller owns
 * it and accepts each emitted token into it. 0, or -1 out of memory. */
struct ds41_lproc;
int ds41_session_set_lproc(ds41_session *s, struct ds41_lproc *lp);

/* DSpark (spec 5.2): proposals for the positions after t_next, where t_next is the token
 * just sampled from the current logits (not yet fed). Needs params.draft and a model with
 * DSpark stages; writes ds41_draft_block_size ids and raw confidence logits (sigmoid =
 * acceptance probability). Greedy Markov loop. The trace (if any) records them. */
int ds41_draft_block_size(const ds41_engine *e);     /* 0 without DSpark stages */
int ds41_session_draft(ds41_session *s, int32_t t_next, int32_t *ids, float *conf);
/* The proposals of n sessions of one engine at once (t_next[i], ids[i], conf[i] as above): each
 * equals what ds41_session_draft gives that session alone, bit for bit, but the DSpark stages
 * run once over the n blocks and each draft's vocabulary head once over n rows (one weight
 * stream instead of n). ndraft: make only the first ndraft drafts of each block (the rest of
 * ids / conf 0; 0 or above the block size: all), for a caller that verifies no more.
 * rc[i] = 0, or -1 with ds41_session_error(s[i]) set; a session that fails its checks does not
 * hold the others back. Returns the number that failed. */
int ds41_session_draft_all(int n, ds41_session *const *s, const int32_t *t_next, int ndraft, int32_t *const *ids,
                           float *const *conf, int *rc);

/* ---- Speculative decoding (spec 5.3-5.4; README "Speculative decoding") ----
 * One step on a session: t_next = the pending token (see below) or a sample from the current
 * logits; the drafter proposes after it; the scheduler picks K drafts; one forward verifies
 * [t_next, d_1..d_K] with every row seeing exactly the KV list of a single-token decode (so in
 * exact mode greedy speculation gives the same tokens and bit-identical logits as plain greedy
 * decoding); the longest accepted prefix is kept (greedy: d_i == argmax; temperature > 0:
 * rejection sampling with the session's sampler and random stream, which keeps the target
 * distribution exactly: drafts are greedy, so q is a point mass and d_i is accepted with
 * probability p(d_i) of the filtered target distribution p; on a rejection the token is drawn
 * from p with d_i removed, renormalised); everything the rejected rows wrote is rolled back.
 * Emits: t_next (unless it was pending), the accepted drafts, and the next token (argmax /
 * residual / fresh sample of the last kept row), which stays pending: it is fed as the first
 * row of the next step. ds41_feed and ds41_session_reset drop a pending token (feed it
 * yourself if the context should hold it, as with plain decoding's last token).
 * Needs params.draft (a model with DSpark stages); mode OFF still uses the same step shape
 * (K = 0: a plain decode). */
enum { DS41_SPEC_OFF = 0, DS41_SPEC_FIXED = 1, DS41_SPEC_AUTO = 2 };
#define DS41_SPEC_MAX_DRAFTS 64
#define DS41_SPEC_MAX_WIDTH 128

/* Steps per second of one verify forward by its width in tokens (1 = a plain decode step),
 * measured by ds41_spec_calibrate; sps[w] for 1 <= w <= n, beyond n extrapolated linearly in
 * time from the last two points. The proposal's own cost: propose_s seconds for the DSpark
 * stages over the block (the part every proposal pays) and draft_s seconds per draft taken
 * (its head, Markov and confidence passes), so a drafting step of width 1 + K costs
 * 1 / sps[1 + K] + propose_s + K draft_s and a plain step 1 / sps[1]. propose_s = 0: the
 * proposal is not counted (a curve from before it was measured). flush_s: seconds to write a
 * window of deferred DSpark context rows into the stage rings, what a probe of a dormant gate
 * pays before its proposal (the gate defers those writes while it says no); cold_s: the
 * session's first probe, whose buffers are new (the flush's 64-row linear scratch, the
 * proposal's work buffer, the deferred rows' buffer: their pages fault in), measured whole
 * (flush, proposal, one draft); 0: not counted (a curve file from before they were measured). */
typedef struct ds41_spec_curve {
    int n;
    double sps[DS41_SPEC_MAX_WIDTH + 1];
    double propose_s, draft_s;
    double flush_s, cold_s;
} ds41_spec_curve;

typedef struct ds41_spec_params {
    int mode;                      /* DS41_SPEC_* */
    int k;                         /* FIXED: drafts verified per step (clamped to the block) */
    const ds41_spec_curve *curve;  /* AUTO: the throughput curve (NULL: tokens/step only) */
} ds41_spec_params;

typedef struct ds41_spec_step_info {
    int n_out;                     /* tokens emitted */
    int proposed;                  /* drafts the proposal made (the head passes run: fixed:K makes K,
                                      auto the ones it verifies; 0 when no proposal ran) */
    int proposal;                  /* 1: the drafter's stages ran this step (a proposal) */
    int drafted;                   /* K verified */
    int accepted;                  /* A accepted */
    float conf[DS41_SPEC_MAX_DRAFTS];   /* raw confidence logits of the proposals (conf[0..proposed)) */
    double expected;               /* scheduler: expected accepted drafts for K */
} ds41_spec_step_info;

/* Running totals (vLLM: spec_decode_num_draft_tokens_total = drafted, ..._accepted_tokens_total
 * = accepted, per position drafted_at[i] / accepted_at[i]). Zero it before the first step. */
typedef struct ds41_spec_stats {
    long long steps, drafted, accepted, emitted;
    long long drafted_at[DS41_SPEC_MAX_DRAFTS], accepted_at[DS41_SPEC_MAX_DRAFTS];
} ds41_spec_stats;

/* out_ids: room for max_out >= block size + 2 ids; out_logits (NULL or [max_out][vocab]): the
 * logits row each emitted token was drawn from. info, stats may be NULL. Returns the number
 * of tokens emitted (>= 1) or -1 (ds41_session_error; a failure inside the forward breaks the
 * session as ds41_feed does). The step never runs past the context: K is clamped so that
 * pos + 1 + K <= ctx size (and, with index_k official, K <= pos; docs/speculative.md). */
int ds41_spec_step(ds41_session *s, const ds41_spec_params *p, int32_t *out_ids, int max_out, float *out_logits,
                   ds41_spec_step_info *info, ds41_spec_stats *stats);
/* Lower level: verify given drafts after t_next (t_next emitted by the caller); writes the
 * accepted drafts + the next token (pending afterwards) to out; returns their number. */
int ds41_spec_verify(ds41_session *s, int32_t t_next, const int32_t *drafts, int k, int32_t *out, float *out_logits,
                     int *n_accepted);
int32_t ds41_spec_pending(const ds41_session *s);   /* -1: none */
/* The most drafts a verify at the session's current position may take, with the clamps of
 * ds41_spec_step: min(block size, ctx - pos - 1, window - 1, and pos - 1 with index_k
 * official); 0 when the session cannot draft (no DSpark stages, params.draft 0, fewer than 2
 * tokens held, an earlier error). For a caller that drafts (ds41_session_draft) and verifies
 * (ds41_spec_verify) itself: ds41 chat (to stop a block at a stop token), ds41 serve (the
 * scheduler over the batch). */
int ds41_spec_max_drafts(const ds41_session *s);
/* --spec auto's drafting gate, asked before a proposal (ds41_spec_step asks it itself; ds41
 * chat and ds41 serve before ds41_session_draft): 1 = propose, 0 = take a plain step (K = 0,
 * no proposal). With a curve that counts the proposal (propose_s > 0): 0 whenever even an
 * always-right drafter could not beat a plain step (max over K of (1 + K) / (1 / SPS(1 + K) +
 * propose_s + K draft_s) <= SPS(1)); else 1 when the session's recent acceptance (decayed
 * per-position counts of its verified drafts) predicts a higher Theta than a plain step, and
 * otherwise 1 only as a probe: at most 1 % of the decode time goes to probes, a probe costing
 * propose_s + draft_s + flush_s, the session's first cold_s (so it comes after cold_s x SPS(1)
 * / 1 % plain steps at least, the later ones propose_s + draft_s + flush_s apart, twice as far
 * each time one fails, up to 1024). Without such a curve: 1. */
int ds41_spec_want_draft(ds41_session *s, const ds41_spec_curve *curve);
/* The session's running estimate of P(the first j + 1 drafts of a block accepted), j = 0 ..
 * DS41_SPEC_MAX_DRAFTS - 1: what the gate above weighs (decayed counts of the drafts verified
 * by ds41_spec_verify, ds41_spec_step or ds41_batch_step, with a prior); -1 for j out of range. */
double ds41_spec_acceptance(const ds41_session *s, int j);

/* One batched engine step, what a serving scheduler calls once per step: each item either
 * feeds ids[0..n) (ds41_feed: a prefill chunk or a decode row) or, with verify = 1, verifies
 * the n - 1 drafts ids[1..n) after t_next = ids[0] (ds41_spec_verify: out (room for n ids)
 * gets the accepted drafts and the next token, out_logits (NULL or [n][vocab]) their logits
 * rows; n_out and n_accepted are set). failed: 1 when the item failed (ds41_session_error).
 * The decode rows (n = 1) and verify blocks of sessions that hold a prompt, and the first
 * prefill chunk of the list (n > 1 without verify, at any position, the first feed of an empty
 * session included; with the session's CED or full row plan as ds41_feed_part runs it, `ahead`
 * included: not in the replay mode, within the session's chunk setting) run in ONE forward
 * (every linear over the stacked rows of all of them, so each weight is read once per step;
 * the MoE grouped by expert across them; attention, indexer and caches per sequence; the
 * chunk's layers only on the rows its CED plan keeps). Further prefill chunks, sessions with a
 * trace open and items refused by the checks run one at a time through ds41_feed_part /
 * ds41_spec_verify in the same call; when a session is listed twice, every item of the call
 * runs one at a time, in list order. Every item gives bit for bit what it
 * gives alone, in exact and in fast mode (the fast kernels keep one order per row whatever
 * the batch: batch invariance; tests/test_batch.c). A refused item changes nothing and fails
 * alone; an error inside the batched forward (out of memory) fails and breaks every session
 * of that forward. An item without verify may carry image rows: is_image[t] != 0 makes row t
 * an image position embedded as emb[t * dim ..] (ds41_feed_embeds; both NULL: text); such an
 * item runs in the batched forward like any other (each row's embedding is its own). Returns
 * the number that failed. */
typedef struct ds41_batch_item {
    ds41_session *s;
    const int32_t *ids;
    size_t n;
    int verify;
    int32_t *out;
    float *out_logits;
    int n_out, n_accepted, failed;
    size_t ahead;          /* a prefill part (n > 1, no verify): as in ds41_feed_part */
    const float *emb;      /* [n][dim]: the image rows' embeddings (only those rows read) */
    const uint8_t *is_image;   /* [n] or NULL: every row text */
} ds41_batch_item;
int ds41_batch_step(ds41_batch_item *items, int count);

/* Confidence scheduler (spec 5.4, DSpark Algorithm 1) for a batch of R sequences: conf [R][stride]
 * raw confidence logits, max_len[r] drafts sequence r may verify (<= stride). Survival
 * a[r][j] = prod_{i<=j} sigmoid(conf[r][i]); positions are added in descending survival order
 * (prefixes) while Theta = (R + sum of chosen a) / step time improves, step time =
 * 1 / SPS(R + sum len) + D propose_s + (sum len) draft_s with D = the sequences that proposed
 * (max_len > 0): the proposals are part of the step. Writes len[r]; returns the expected
 * tokens per step (R + sum of chosen survivals). curve NULL: maximise expected tokens with
 * every step costing the same up to width 1 + max_len (takes all). */
double ds41_spec_schedule(const ds41_spec_curve *curve, int R, int stride, const float *conf, const int *max_len,
                          int *len);
double ds41_spec_curve_sps(const ds41_spec_curve *c, int width);
/* Times verify forwards of widths 1..max_width (max_width <= block size + 1) on a scratch
 * session after a random prompt of prompt_len tokens: rounds over the widths in turn, at least
 * reps and as many as fit in about 0.3 s (at most 64), the lower quartile of each width, timed
 * by the thread's CPU time when single-threaded (robust to other processes on a shared
 * machine), by the wall clock with a thread pool; and, on a model with DSpark stages,
 * the proposal: propose_s (the stages) and draft_s (one draft's head, Markov and confidence
 * passes), lower quartiles of 4 x reps, flush_s (one ds41_dspark_seed of a window of
 * context rows, the write a probe after a dormant spell makes), lower quartile of reps, and
 * cold_s (a first probe on new buffers: the thread's linear scratch released and the freed
 * memory returned to the kernel first), the median of reps. */
int ds41_spec_calibrate(ds41_engine *e, int max_width, int prompt_len, int reps, ds41_spec_curve *out, char *err,
                        size_t errcap);
/* The cache file of a model's curve: $DS41_SPEC_CURVE if set, else
 * ${XDG_CACHE_HOME:-$HOME/.cache}/ds41/spec-curve-<hash of the model dir, its config.json
 * size and mtime, threads, exact; and the format: a cache written before flush_s was measured
 * is not found, so it is measured again>.txt. Text: one "width steps_per_s" line per width,
 * then "propose_s SECONDS", "draft_s SECONDS", "flush_s SECONDS" and "cold_s SECONDS" (a
 * loader of the older format stops at them and keeps the widths). ds41_spec_curve_load refuses
 * a file without propose_s (-1: re-measure); one without flush_s or cold_s loads them as 0. */
int ds41_spec_curve_path(const char *model_dir, int n_threads, int exact, char *buf, size_t cap);
int ds41_spec_curve_load(const char *path, ds41_spec_curve *c);
int ds41_spec_curve_save(const char *path, const ds41_spec_curve *c);

/* Digest of the whole live sequence state (every ring, compressor, live KV / index-K record,
 * entry and page counts, Engram history, position) plus the current logits and the DSpark
 * context row the next proposal reads: equal digests = indistinguishable sessions. */
uint64_t ds41_session_digest(const ds41_session *s);

/* ---- Long-context measurement (ds41 bench --synthetic-context, --ablate; README "Long context") ----
 * Fills a fresh session (position 0) as if n tokens had been prefilled, without running the
 * model: valid packed records from seeded random BF16 values in every KV source's store (main KV
 * and index K), full SWA / DSpark rings, compressor state, Engram history, position n. Decode
 * steps after it do exactly the work they would after a real n-token prefill. 0 or -1
 * (ds41_session_error). */
int ds41_session_synthetic_context(ds41_session *s, long long n, unsigned long long seed);
/* Deployment performance points switched off for measurement (a set bit = off; 0 = all on; an
 * engine starts with 8, P6 off, the faster setting here): 1 = P1 fused compressor (both ratios), 2 = P2 sparse attention
 * reading the packed FP4 main-KV records, 4 = P3 one KV head's entries fetched once for all query
 * heads, 8 = P6 each index layer's indexer on a side thread beside the query projection (only
 * where the engine's threads leave a CPU free; otherwise serial whatever the bit). Every
 * setting gives bit-identical results. Not thread-safe against running forwards. */
void ds41_engine_set_ablate(ds41_engine *e, unsigned mask);
unsigned ds41_engine_ablate(const ds41_engine *e);
/* "p1,p3,p6", "all" or "none" -> mask; -1 if malformed. */
int ds41_parse_ablate(const char *s, unsigned *mask);
/* Per-sublayer timers: acc (NULL: off, the default) gets seconds added at [0] the attention
 * sublayer, [1] the indexer, [2] dequantizing index-K stores (0 since the indexer reads the packed
 * records in place; the slot keeps the indices stable), [3] KV set + sparse attention,
 * [4] the compressor, for every forward of the engine's sessions; [5] is a byte count: KV rows
 * fetched by the sparse attention kernel plus the float copy of gathered entries (P2 off). */
enum { DS41_TIMER_ATTN = 0, DS41_TIMER_INDEXER, DS41_TIMER_IKEYS, DS41_TIMER_SPARSE, DS41_TIMER_COMPRESS,
       DS41_TIMER_KVBYTES, DS41_TIMER_N };
void ds41_engine_set_profile(ds41_engine *e, double *acc);

/* Where a decode step's time goes (ds41 bench --profile; docs/performance.md). Between start and
 * stop every second of the calling thread's wall time is charged to exactly one section: a
 * weight stream (the linears of one format: time and the bytes of weights they read) or a
 * part of the model outside the linears, nested sections excluded from their callers (the
 * attention sublayer's projections count as FP8, not as attention), the remainder as "rest".
 * So the seconds add up to `elapsed`. Only the thread that called start is timed (with -t N
 * its share of the pool's work and its waits for the others: the wall time of each call).
 * The timers read the clock twice per section entered (`switches` reads, about 20-40 ns
 * each); no result depends on them. Not thread-safe against forwards running on other
 * threads; the P6 side worker's indexer is not timed (its time shows where the caller waits). */
enum {
    DS41_BREAKDOWN_REST = 0, DS41_BREAKDOWN_FP8, DS41_BREAKDOWN_FP8DQ, DS41_BREAKDOWN_FP4, DS41_BREAKDOWN_HEADW,
    DS41_BREAKDOWN_BF16, DS41_BREAKDOWN_F32, DS41_BREAKDOWN_ATTN, DS41_BREAKDOWN_SPARSE, DS41_BREAKDOWN_INDEXER,
    DS41_BREAKDOWN_COMPRESS, DS41_BREAKDOWN_MHC, DS41_BREAKDOWN_NORM, DS41_BREAKDOWN_ROUTER, DS41_BREAKDOWN_MOE,
    DS41_BREAKDOWN_ENGRAM, DS41_BREAKDOWN_HEAD, DS41_BREAKDOWN_SAMPLE, DS41_BREAKDOWN_N
};
typedef struct ds41_breakdown {
    double seconds[DS41_BREAKDOWN_N];   /* exclusive wall seconds of the starting thread */
    double bytes[DS41_BREAKDOWN_N];     /* weight bytes read: the stream sections (FP8 .. F32) */
    long long calls[DS41_BREAKDOWN_N];  /* times each section was entered */
    double elapsed;                     /* seconds from start to stop */
    long long switches;                 /* section entries and exits (clock reads) */
} ds41_breakdown;
/* 0, or -1 (out of memory). A second start restarts from zero. */
int ds41_engine_breakdown_start(ds41_engine *e);
/* Ends the breakdown (the timers off) and copies it into out (may be NULL). */
void ds41_engine_breakdown_stop(ds41_engine *e, ds41_breakdown *out);
/* "fp8", "fp4", ..., "rest"; NULL outside 0..DS41_BREAKDOWN_N-1 */
const char *ds41_breakdown_name(int section);
/* 1 for the weight-stream sections (FP8, FP8 dequantized, FP4, BF16 head, BF16 other, FP32) */
int ds41_breakdown_is_stream(int section);
/* Routing counts (ds41 bench --routing-counts, docs/distributed.md "Placement of the experts"):
 * from this call on, every MoE sublayer of e's forwards counts the (token, choice) pairs its
 * router sends to each routed expert: the load a balanced --expert-map is built from. Under
 * mpiexec every rank counts the same (the router is replicated). 0, or -1 (out of memory). A
 * second start restarts from zero. */
int ds41_engine_route_count_start(ds41_engine *e);
/* The counts since the start, [*layers][*experts] (layers: the backbone's, then the DSpark
 * stages; experts: the most any layer has), owned by e; NULL before a start. */
const unsigned long long *ds41_engine_route_counts(const ds41_engine *e, int *layers, int *experts);
/* Streaming read bandwidth in GB/s with the engine's threads: a 256 MiB buffer (well past the
 * last-level cache) summed by the same static split the linears use, the median of 5 reads. */
double ds41_engine_read_bandwidth(ds41_engine *e);
/* ds41 bench --configs only: on = 1 runs the sessions opened afterwards as the cost-faithful
 * twin without CSA2's cross-layer sharing (every compressed layer computes and holds its own
 * KV, with its source layer's weights: the costs of such a model, not its numbers;
 * src/engine/twin.c); on = 0 returns to the model. Only while no session of e is open.
 * 0, or -1 with the message in err. */
int ds41_engine_set_csa2_twin(ds41_engine *e, int on, char *err, size_t errcap);

/* Bytes of state the session holds (spec 6). */
typedef struct ds41_state_info {
    long long tokens;
    long long global_kv_bytes;       /* main + index records written */
    long long global_kv_main_bytes, global_kv_index_bytes;
    long long global_kv_page_bytes;  /* allocated 128-token pages */
    long long swa_bytes, dspark_ring_bytes, compressor_bytes, engram_bytes;
    long long total_bytes;           /* everything held */
    double global_kv_bytes_per_token;
} ds41_state_info;
void ds41_session_state(const ds41_session *s, ds41_state_info *out);

/* ---- Prefix cache (spec 4.2, 4.3, 6; README "Prefix cache") ----
 * Whole 128-token blocks of prompts, keyed by a chained 128-bit hash of the model fingerprint and
 * the token ids (ids and the parent block compared on every hit), holding only the global KV
 * pages of every KV source (890 B/token at production size). In memory the pages are shared
 * with the sessions that use them (reference counts, copy on write); least recently used leaf
 * blocks are evicted past mem_bytes. With a dir, blocks are also written to a persistent store
 * (src/store/pstore.h) and read back after a restart. A hit rebuilds the sliding windows and
 * the DSpark rings by a bounded replay: exact (bit-identical to a fresh prefill in exact mode)
 * or approx (the last window only, truncated windows). One cache serves one engine and one
 * index-K reading; it is thread-safe. */
typedef struct ds41_prefix_cache ds41_prefix_cache;
enum { DS41_REPLAY_EXACT = 0, DS41_REPLAY_APPROX = 1 };
typedef struct ds41_prefix_params {
    long long mem_bytes;    /* in-memory capacity (0: 1 GiB) */
    const char *dir;        /* persistent store directory, or NULL */
    long long disk_bytes;   /* its capacity (0: unlimited) */
    int replay;             /* DS41_REPLAY_* */
    int index_k;            /* DS41_INDEX_K_* of the sessions that use it */
} ds41_prefix_params;
typedef struct ds41_prefix_stats {
    long long queries, hits;        /* tokens looked up / tokens restored (vLLM prefix_cache_*) */
    long long disk_hits, disk_writes, disk_errors;   /* blocks */
    long long blocks, bytes;        /* held in memory now */
    long long replay_rows;          /* rows recomputed by replays */
} ds41_prefix_stats;
ds41_prefix_cache *ds41_prefix_open(ds41_engine *e, const ds41_prefix_params *p, char *err, size_t errcap);
void ds41_prefix_close(ds41_prefix_cache *pc);
/* s at position 0: restores the longest cached prefix of ids[0..n) (whole blocks) and replays
 * it. Returns the tokens restored (0: nothing cached, the session untouched), -1 on failure
 * (ds41_session_error; reset the session). The caller feeds ids[ret..n) with ds41_feed; when
 * ret == n the logits of the last id are already there. */
long long ds41_prefix_restore(ds41_prefix_cache *pc, ds41_session *s, const int32_t *ids, size_t n);
/* Publishes the whole blocks of the first n tokens the session holds (ids = those tokens, n <=
 * its position) to memory and, with a dir, queues them for the disk writer thread (the caller
 * does not wait for the fsyncs). Returns the blocks newly stored or -1. */
long long ds41_prefix_publish(ds41_prefix_cache *pc, ds41_session *s, const int32_t *ids, size_t n);
void ds41_prefix_get_stats(ds41_prefix_cache *pc, ds41_prefix_stats *out);
/* A prompt with images (docs/vision.md, docs/prefix-cache.md): its first n positions
 * described as ds41_feed_embeds takes them, plus each image position's content key
 * (ds41_image_prepare), the same for every position of one image. A block that holds image
 * positions is keyed on their offsets and keys as well as on the ids (a text block's key does
 * not change), so a prompt hits only when the same text and the same images come again, and a
 * restore replays its image rows with their embeddings (in exact mode bit-identical to a cold
 * prefill). Positions from n on are text (a publish's generated tokens). */
typedef struct ds41_prefix_img {
    const uint8_t *is_image;   /* [n]: 1 at an image position */
    const uint8_t *key;        /* [n * 32]: the image's content key at image positions (others not read) */
    const float *emb;          /* [n * dim]: the embeddings at image positions (a publish needs none) */
    size_t n;
} ds41_prefix_img;
/* ds41_prefix_restore / _publish with images; im NULL or is_image NULL: the plain calls. A
 * restore without keys or embeddings restores nothing (returns 0). */
long long ds41_prefix_restore_img(ds41_prefix_cache *pc, ds41_session *s, const int32_t *ids, size_t n,
                                  const ds41_prefix_img *im);
long long ds41_prefix_publish_img(ds41_prefix_cache *pc, ds41_session *s, const int32_t *ids, size_t n,
                                  const ds41_prefix_img *im);
/* Several ranks with one store (serve under mpiexec, docs/prefix-cache.md): rank 0 alone reads
 * and writes the disk, the other ranks' caches stay in memory and mirror rank 0's.
 * ds41_prefix_load: brings the longest cached chain of ids' whole blocks (im: their image
 * positions keyed as ds41_prefix_restore_img does; NULL: text) into memory (memory,
 * then disk; not counted as a query) and returns how many blocks came from disk (0: none; -1:
 * out of memory), *first the first of them, and their pages in *bytes (malloc'd, *len bytes:
 * per block the page of every KV source in order). ds41_prefix_insert_bytes: adds blocks
 * [first, first + nb) of ids from such bytes (blocks before first must be cached); returns the
 * blocks added, or -1 when len does not match this model's blocks. */
long long ds41_prefix_load(ds41_prefix_cache *pc, const int32_t *ids, size_t n, const ds41_prefix_img *im, long long *first,
                           uint8_t **bytes, size_t *len);
long long ds41_prefix_insert_bytes(ds41_prefix_cache *pc, const int32_t *ids, size_t n, const ds41_prefix_img *im, long long first,
                                   long long nb, const uint8_t *bytes, size_t len);
/* ds41_prefix_restore_img restoring at most max_blocks blocks (< 0: no limit). */
long long ds41_prefix_restore_cap(ds41_prefix_cache *pc, ds41_session *s, const int32_t *ids, size_t n,
                                  const ds41_prefix_img *im, long long max_blocks);
/* The blocks of ids' longest cached chain (memory, then the store) that a restore would find,
 * changing nothing (no block read into memory, no LRU move, no query counted). */
long long ds41_prefix_held(ds41_prefix_cache *pc, const int32_t *ids, size_t n, const ds41_prefix_img *im);
/* 1 when the cache keeps a store on disk (a dir). */
int ds41_prefix_has_store(const ds41_prefix_cache *pc);
/* ds41_prefix_restore_img in a command's MPI job (src/store/prefix_job.c; every rank at the
 * same point, as for a forward; one process: the restore alone). store: the command was given
 * --cache-dir (the same on every rank). Attention replicated: rank 0 alone has the store; the
 * blocks it reads from disk (ds41_prefix_load) go to every rank (a broadcast), which adds them
 * to its memory cache (ds41_prefix_insert_bytes) before every rank restores the same chain.
 * --split layers: each stage has a store of its own layers' part (DIR/rank-R); every rank
 * counts the blocks it holds (ds41_prefix_held), the least of the counts is what every stage
 * restores (ds41_prefix_restore_cap), so that no stage restores a block another lacks. */
long long ds41_prefix_restore_job(ds41_prefix_cache *pc, ds41_session *s, const int32_t *ids, size_t n,
                                  const ds41_prefix_img *im, int store);
/* The store directory this rank opens for --cache-dir dir (*res; NULL: none, its cache stays in
 * memory): one process, dir; in a job with per_rank (serve --dp-attention, --split layers: each
 * rank keeps its own blocks) dir/rank-R written into out (R this rank; created when missing);
 * without, dir on rank 0 and none on the other ranks (rank 0's store; its blocks shipped).
 * 0, or -1 when dir/rank-R does not fit in cap bytes. */
int ds41_prefix_job_dir(const char *dir, int per_rank, char *out, size_t cap, const char **res);
/* Waits until every queued block is on disk (or failed: disk_errors). Close flushes too. */
void ds41_prefix_flush(ds41_prefix_cache *pc);
/* Evicts least recently used leaf blocks until the cache holds at most max_bytes in memory
 * (blocks on disk stay). Returns the bytes it holds afterwards. A serving pool calls it when a
 * waiting sequence needs the room. */
long long ds41_prefix_trim(ds41_prefix_cache *pc, long long max_bytes);
/* Moves the blocks of this cache's fingerprint from another store directory (src_dir) into
 * the cache's store (pstore.h ds41_pstore_adopt), before any block is written: *blocks and
 * *bytes moved, *dups the keys the store already held (the source's copy removed). 0, or -1
 * with a message in errbuf (no store, src_dir unreadable, a move that failed). */
int ds41_prefix_adopt(ds41_prefix_cache *pc, const char *src_dir, long long *blocks, long long *bytes, long long *dups,
                      char *errbuf, size_t errcap);
/* serve --dp-attention --cache-dir dir under mpiexec -n N, after ds41_prefix_open on every rank
 * (a collective: every rank calls it at the same point): the stores of ranks past N that an
 * earlier, larger job left (dir/rank-X, X >= N) are taken by rank X mod N, which moves their
 * blocks of this fingerprint into its own store (ds41_prefix_adopt), so that a job restarted
 * with fewer ranks finds every block; each rank says what it moved on its stderr, rank 0 sums
 * them and names any such store that still holds blocks (one it cannot see, on another host's
 * disk, or a move that failed): not read. Nothing without dir, in one process, or when no
 * such store exists. */
void ds41_prefix_job_adopt(ds41_prefix_cache *pc, const char *dir);
/* Bytes of the model fingerprint the cache keys on (32), hex for display (65 bytes). */
void ds41_prefix_fingerprint_hex(const ds41_prefix_cache *pc, char out[65]);
/* Bytes one cached token holds (global KV of every KV source, page granularity). */
double ds41_prefix_bytes_per_token(const ds41_engine *e);
/* Prefill/decode disaggregation (docs/pd.md): a remote prefill arrives as blocks of pages.
 * ds41_prefix_pages: the longest cached chain of ids' whole blocks without a replay; *pages =
 * [nb][n_kv_sources] page pointers, one reference each (ds41_prefix_pages_free releases them).
 * ds41_prefix_insert: adds blocks [first, first + nb) of ids with their pages ([nb][n_kv_sources],
 * borrowed: the cache takes its own references) under the cached chain of blocks [0, first);
 * returns the blocks added (fewer when a parent was evicted meanwhile: a later restore then hits
 * a shorter prefix and prefills the rest, never a wrong one). ds41_prefix_fingerprint: the 32
 * fingerprint bytes (the compatibility hash two nodes compare). */
long long ds41_prefix_pages(ds41_prefix_cache *pc, const int32_t *ids, size_t n, uint8_t ***pages);
/* ds41_prefix_pages with the prompt's image positions keyed (im as ds41_prefix_restore_img's;
 * NULL: ds41_prefix_pages) */
long long ds41_prefix_pages_img(ds41_prefix_cache *pc, const int32_t *ids, size_t n, const ds41_prefix_img *im,
                                uint8_t ***pages);
void ds41_prefix_pages_free(ds41_prefix_cache *pc, uint8_t **pages, long long nb);
long long ds41_prefix_insert(ds41_prefix_cache *pc, const int32_t *ids, size_t n, long long first, long long nb,
                             uint8_t *const *pages);
const uint8_t *ds41_prefix_fingerprint(const ds41_prefix_cache *pc);

/* Conformance trace (docs/conformance.md) into an existing or new directory: per-forward
 * files from now on; the state files are written by ds41_session_trace_finish (also on close,
 * and by a second ds41_session_trace before it starts the new trace). */
int ds41_session_trace(ds41_session *s, const char *dir);
int ds41_session_trace_finish(ds41_session *s);
/* Appends ids / a logits row to the trace's tokens.i32 / logits.f32 (the caller decides which
 * tokens are prompt and which generated). */
void ds41_session_trace_tokens(ds41_session *s, const int32_t *ids, size_t n);
void ds41_session_trace_logits(ds41_session *s);

#ifdef __cplusplus
}
#endif
#endif
