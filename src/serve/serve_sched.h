/* ds41 serve: the scheduler (continuous batching over ds41_batch_step: one forward per step).
 *
 * One scheduler thread owns every engine session. Each step it
 *   1. drops cancelled sequences (client gone) and closes their sessions,
 *   2. admits waiting sequences in arrival order while fewer than `parallel` run and the
 *      sequence's KV reservation fits the byte budget (head of line waits: no overtaking),
 *   3. builds ONE batch under the token budget: one row per decoding sequence first, then
 *      prefill chunks of the sequences still prefilling (a chunk other than a prompt's last is
 *      at least `min_chunk` tokens, the sliding window, so chunked prefill stays exact),
 *   4. calls the engine once over the batch (ds41_batch_step; ds41_feed_batch semantics),
 *   5. samples each sequence whose logits are new (its own session RNG, seeded per request),
 *      detokenizes, applies the stop conditions and wakes the HTTP thread waiting on it.
 *
 * Speculative decoding (--spec, docs/speculative.md): a decoding sequence's row becomes a
 * verify block [next, d_1..d_K] of the DSpark drafts proposed after its pending token; each
 * sequence verifies its own block inside the step and emits its accepted drafts and the next
 * token (which stays pending). K: fixed:K, or for auto the confidence scheduler
 * (ds41_spec_schedule): the greedy sequences of the step are scheduled together over the
 * step's cost model, each sampled sequence alone over the measured curve (its random stream
 * must not depend on the other requests). Greedy tokens do not depend on K in exact mode.
 *
 * Admission reserves a sequence's whole KV need up front: bounded per-sequence state +
 * global KV bytes/token x min(ctx, prompt + max_tokens) rounded up to 128-token pages. A
 * running sequence therefore never runs out and is never preempted; a sequence that does not
 * fit waits in the queue until running ones finish. A full queue refuses new requests (429).
 *
 * Prefix cache (params.pc): admission restores the longest cached prefix of the prompt (whole
 * 128-token blocks; the bounded replay runs on the scheduler thread, inside that step) and the
 * sequence prefills only the rest; when its prefill ends its whole prompt blocks are published
 * (so concurrent requests with the same prefix hit at once), and when it finishes (stop or
 * length) the blocks of prompt + generated tokens, for the next turn of a conversation. */
#ifndef DS41_SERVE_SCHED_H
#define DS41_SERVE_SCHED_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "ds41.h"
#include "lproc.h"
#include "serve_gcache.h"
#include "serve_metrics.h"
#include "serve_vcache.h"
#include "tokenizer.h"

typedef struct ds41_sched_params {
    int parallel;             /* sequences running at most */
    int batch_tokens;         /* tokens per step (decode rows + prefill chunks) */
    int max_queue;            /* waiting sequences at most; more -> 429 */
    int min_chunk;            /* smallest non-final prefill chunk (the window) */
    long long kv_budget;      /* bytes */
    double kv_per_token;      /* global KV bytes per token */
    long long bounded_bytes;  /* bounded per-sequence state */
    ds41_session_params sp;
    /* speculative decoding (README, ds41 serve): DS41_SPEC_* (sp.draft must be 1 unless OFF),
     * fixed K, and for AUTO the curve cache file ("" = none: measured, not saved) */
    int spec_mode, spec_k;
    char curve_path[4096];
    /* prefix cache (NULL: none; owned by the caller, outlives the scheduler): a prompt's
     * cached blocks are restored when its sequence is admitted, its whole blocks published
     * when its prefill ends and, with the generated tokens, when it finishes */
    ds41_prefix_cache *pc;
    /* prefill/decode disaggregation (docs/pd.md; start NULL: off). A sequence with at least
     * min_tokens prompt tokens past its prefix-cache hit and a whole block past it waits in
     * DS41_SEQ_REMOTE while `start`, on another thread (src/pd/), fetches the blocks
     * [first, n_fetch / 128) into pc and then restores the session s from pc (the replay runs
     * there, off the scheduler thread, which keeps stepping the other sequences; s is the
     * job's until poll says it is done); after a failed fetch it restores the local hit only,
     * unless fail. poll: 0 running, 1 done (bytes, seconds), -1 the fetch failed (msg); *hit:
     * the prompt tokens the session holds (-1: the restore failed); finish joins. fail = 1: a
     * failed fetch fails the request; 0: it is prefilled locally (the same answer). */
    struct {
        void *ctx;
        void *(*start)(void *ctx, ds41_session *s, const int32_t *ids, size_t n_prompt, size_t n_fetch, long long first);
        int (*poll)(void *job, long long *bytes, double *seconds, long long *hit, char *msg, size_t cap);
        void (*finish)(void *job);
        long long min_tokens;
        int fail;
    } remote;
    /* serve under mpiexec (serve_mpi.h): rank 0 records every engine call for the other ranks
     * (NULL: one process) */
    struct ds41_smirror *mirror;
    /* the image embedding cache (serve_vcache.h; NULL: none; owned by the caller) */
    ds41_vcache *vcache;
} ds41_sched_params;

enum { DS41_SEQ_WAITING, DS41_SEQ_PREFILL, DS41_SEQ_DECODE, DS41_SEQ_DONE, DS41_SEQ_REMOTE, DS41_SEQ_IMAGE };

typedef struct ds41_sgroup ds41_sgroup;

/* One sequence (one choice of a request). Inputs are set before submit and read-only after;
 * outputs are written by the scheduler under the group's mutex. */
typedef struct ds41_sseq {
    /* input */
    int32_t *prompt;
    size_t n_prompt;
    float temperature, top_p, min_p;
    int top_k;
    uint64_t seed;
    long long max_tokens;     /* resolved: > 0 */
    int n_top;                /* -1: no logprobs; else alternatives per position */
    ds41_lproc proc;          /* logits processing (set up by the HTTP thread, then the
                               * scheduler's alone; freed with the group) */
    /* output (group mutex) */
    int32_t *ids;             /* generated ids (EOS / stop ids included) */
    float *lp;                /* logprob of ids[i] (n_top >= 0) */
    int32_t *top_id;          /* [i * n_top + k] */
    float *top_lp;
    size_t *off;              /* text offset before ids[i] */
    size_t n_ids, cap_ids;
    char *text;               /* decoded text, cut at a stop string */
    size_t text_len, text_cap;
    int finished, finish;     /* DS41_FIN_* */
    long long cached;         /* prompt tokens restored from the prefix cache */
    int stop_hit;             /* 1 + the index of the stop string that ended it, 0: none */
    char err[256];
    /* scheduler private */
    ds41_sgroup *g;
    int state;
    ds41_session *s;
    void *rjob;               /* a remote prefill in flight (DS41_SEQ_REMOTE) */
    long long local_hit;      /* with rjob: the tokens the local prefix cache held before it */
    struct ds41_vjob *vjob;   /* the images being encoded off the scheduler thread (DS41_SEQ_IMAGE) */
    uint8_t *img_at, *img_key;   /* the expanded prompt's image flags and content keys (prefix cache) */
    float *img_emb;           /* its embeddings [n_prompt][dim] (image rows read) until its prefill ends */
    size_t fed;
    int32_t next;
    int in_flight;            /* in the step whose logits are still coming (overlapped steps) */
    long long reserve;
    ds41_detok_stream ds;
    double t_admit, t_first, t_last;
} ds41_sseq;

struct ds41_sgroup {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ds41_sseq *seq;
    int n_seq, n_finished, refs;
    atomic_int cancel;
    /* the request's images (PNG or JPEG bytes, in prompt order): each choice encodes them on a
     * thread of its own (serve_vision.h), restores what the prefix cache holds of the prompt
     * (image positions keyed on the images' content) and prefills the rest in the steps with
     * the other sequences (batch items with image rows); img_extra: the span positions past the one placeholder id each, set
     * at admission from the images' sizes (ds41_image_span_positions) for the budget, and again
     * by the expansion (the same number) */
    uint8_t **img;
    size_t *img_len;
    int n_img;
    long long img_extra;
    /* stop conditions shared by the choices */
    char **stop;
    int n_stop;
    size_t stop_hold;         /* longest stop string - 1: text the consumer must not show yet */
    int32_t *stop_ids;
    size_t n_stop_ids;
    int ignore_eos, skip_special;
    double t_arrival;
    /* constrained output: the grammar and its matcher, shared by the choices (the matcher is
     * used on the scheduler thread only); gent: the grammar table cache's entry holding the
     * grammar and its tables (then grammar is NULL), released with the group */
    ds41_grammar *grammar;
    ds41_gmatch *gm;
    ds41_gentry *gent;
    int one_call;             /* parallel_tool_calls false: stop after the first complete call */
};

typedef struct ds41_sched ds41_sched;

ds41_sched *ds41_sched_start(ds41_engine *e, const ds41_tokenizer *tok, const ds41_sched_params *p,
                             ds41_metrics *m, char *err, size_t errcap);
/* Aborts everything running or waiting, closes the sessions and joins the thread; submit then
 * answers 503. ds41_sched_free releases the memory once no other thread uses S. */
void ds41_sched_stop(ds41_sched *S);
void ds41_sched_free(ds41_sched *S);
/* A lost rank under mpiexec (serve_mpi.h), on the scheduler thread: every sequence running or
 * waiting ends with DS41_FIN_ABORT and msg (the handlers answer 503), new requests get 503,
 * and the call returns once the handlers let go of their requests or after wait_s. */
void ds41_sched_fail_all(ds41_sched *S, const char *msg, double wait_s);

/* A group with n_seq zeroed sequences and one reference (the caller's). */
ds41_sgroup *ds41_sgroup_new(int n_seq);
void ds41_sgroup_release(ds41_sgroup *g);
/* Reservation of a sequence with this prompt and max_tokens (bytes). */
long long ds41_sched_reserve_bytes(const ds41_sched *S, size_t n_prompt, long long max_tokens);
/* The log-softmax of the logits row lg[V] at id and the n_top best (values descending, ties
 * the lower id; fewer than n_top: the rest id 0, -inf): the logprobs of a reply. */
void ds41_sched_logprobs(const float *lg, int V, int32_t id, int n_top, float *lp, int32_t *top_id, float *top_lp);
/* Queues all sequences of g (the scheduler takes a reference). 0; -1 with status 429 when the
 * queue is full, 503 when the scheduler is stopping. */
int ds41_sched_submit(ds41_sched *S, ds41_sgroup *g, int *status);
void ds41_sched_cancel(ds41_sched *S, ds41_sgroup *g);
void ds41_sched_gauges(ds41_sched *S, ds41_gauges *out);

#endif
