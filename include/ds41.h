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
 * concurrently with any use of the engine. ds41_feed_batch is the entry point a batching
 * scheduler uses; today it runs the sequences one after another. */
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
} ds41_load_params;

enum { DS41_PREFILL_MODE_CED = 0, DS41_PREFILL_MODE_FULL = 1, DS41_PREFILL_MODE_REPLAY = 2 };
enum { DS41_INDEX_K_OWN = 0, DS41_INDEX_K_OFFICIAL = 1 };

typedef struct ds41_session_params {
    int prefill;           /* DS41_PREFILL_MODE_*: how multi-token feeds skip rows (default ced) */
    int chunk;             /* > 0: feeds longer than this run in chunks of this many tokens */
    int index_k;           /* DS41_INDEX_K_* (spec 3.9 / 10.1) */
    int draft;             /* 1: keep the DSpark context rings so ds41_session_draft can propose */
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
/* Several sequences at once (each with its own ids); returns the number that failed. */
int ds41_feed_batch(ds41_session **ss, const int32_t *const *ids, const size_t *n, int count);
/* Logits of the last fed token: ds41_vocab_size floats. */
const float *ds41_logits(const ds41_session *s);

/* Sampling (spec 3.15): temperature 0 = greedy (first maximum); top_k 0, top_p 1, min_p 0 = off.
 * A new session samples greedily with seed 0. */
void ds41_session_set_sampling(ds41_session *s, float temperature, int top_k, float top_p, float min_p, uint64_t seed);
int ds41_session_sample(ds41_session *s);           /* next token from the current logits */

/* DSpark (spec 5.2): proposals for the positions after t_next, where t_next is the token
 * just sampled from the current logits (not yet fed). Needs params.draft and a model with
 * DSpark stages; writes ds41_draft_block_size ids and raw confidence logits (sigmoid =
 * acceptance probability). Greedy Markov loop. The trace (if any) records them. */
int ds41_draft_block_size(const ds41_engine *e);     /* 0 without DSpark stages */
int ds41_session_draft(ds41_session *s, int32_t t_next, int32_t *ids, float *conf);

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
