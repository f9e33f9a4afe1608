/* ds41 prefix-cache restore (spec 4.2, 4.3, 6; README "Prefix cache"): a sequence rebuilt from
 * the global KV pages of whole 128-token blocks plus a bounded replay of its tail.
 *
 * A cached block holds, per KV source, the page of its 128 positions (main KV + index K
 * records) and the 128 token ids. Nothing else is needed to resume at a block end:
 *   - the ratio-r compressor's partial group is empty there (r divides 128), which is the state
 *     a one-shot prefill leaves;
 *   - the Engram history is the compressed ids of the last tokens, known from the ids;
 *   - the SWA rings and DSpark rings are rebuilt by the replay.
 * Replay (ds41_seq_replay_rows):
 *   exact  : positions [M - R, M) with R = W + (L - 1)(W - 1) (every row a layer's window or
 *            ring can reach, the CED row reach applied to every layer, ds41_row_plan mode
 *            RESTORE); each computed row sees exactly the KV lists of a one-shot prefill, so
 *            the state, logits and continuation are bit-identical to a fresh prefill in exact
 *            mode (tests/test_prefix.c).
 *   approx : the last W positions only, every layer's window truncated to them (the deployment
 *            rule of spec 4.2 / 10.6); the global KV is exact, the rings approximate. */
#ifndef DS41_RESTORE_H
#define DS41_RESTORE_H

#include "ds41.h"
#include "forward.h"

enum { DS41_RESTORE_EXACT = 1, DS41_RESTORE_APPROX = 2 };

/* Rows the replay of a restored prefix of M tokens recomputes. */
long long ds41_seq_replay_rows(const ds41_config *cfg, int mode, long long M);
/* 1 when every KV source's ratio divides the page (a block end is a group end). */
int ds41_restore_supported(const ds41_config *cfg);
/* 1 when this process holds KV store i (cfg->kv_sources[i]): always in one process and under
 * the expert split; under --split layers a store of this rank's stage or the replica a stage
 * keeps of a source before it that its layers read (ds41_pipe_holds_store: a restore attaches
 * the replica's pages too, and publish keeps them). A block's page of a store held elsewhere is
 * NULL here: publish leaves it out, a restore attaches none (the layers
 * that read it run on the stage that holds it, which restores its own part of the same block). */
int ds41_store_here(const ds41_engine *e, int i);
/* The image positions of a restored prompt (ds41_prefix_img): img [n] flags from position 0,
 * emb [n * dim] their embeddings; the replay feeds the image rows it recomputes from them and
 * rebuilds the Engram history with those positions dead, as the prefill did. */
typedef struct ds41_restore_img {
    const uint8_t *img;
    const float *emb;
    size_t n;
} ds41_restore_img;
/* s at position 0. pages [M / 128][n_stores] (borrowed; s takes its own references), ids the M
 * token ids, im NULL for a text prompt. Attaches the pages, sets the state at the replay start
 * and runs the replay forward (want_logits: the logits of position M - 1 too). On failure the
 * sequence must be reset. */
int ds41_seq_restore(ds41_seq *s, const int32_t *ids, long long M, uint8_t *const *pages, int mode, int want_logits,
                     const ds41_restore_img *im, ds41_err *err);

/* The bounded state at a block end as a prefill node ships it (src/pd/, docs/pd.md): what a
 * prefill of M tokens leaves besides its global KV pages. Borrowed views (unaligned bytes, read
 * with memcpy): rings [n_layers][window][rec_bytes] (the layers' SWA rings, not the DSpark
 * stages'), comp per compressor (cache order) kv then score [ratio][dim] FP32, mh [mh_rows]
 * [n_dspark_targets * dim] BF16 (the forward's DSpark context input rows, ending at M - 1;
 * mh_rows 0: none). */
typedef struct ds41_resume_state {
    const uint8_t *rings, *comp, *mh;
    int mh_rows;
    int ik_owner;
    int32_t hist[16];
    /* the decoder split (stream_rows > 0, docs/pd.md): rings holds the layers before the first
     * decoder layer D only, and stream the block input of layer D at the last stream_rows
     * positions (ds41_decoder_stream_rows): X [stream_rows][hc * dim] then pre [stream_rows][hc]
     * FP32; the install runs the decoder layers on those rows, as the prefix cache's exact
     * replay would (mh_rows is then 0: the forward taps the DSpark context itself) */
    int stream_rows;
    const uint8_t *stream;
} ds41_resume_state;
/* The rows of the decoder split's stream for a prefix of M tokens: every row the decoder
 * layers' windows and rings reach, W + (L - D - 1)(W - 1) (D = cfg->first_decoder_layer), at
 * most M; 0 when the split does not apply (no decoder layer after the first, or a DSpark
 * target before D, whose context rows the decode node could not tap). */
long long ds41_decoder_stream_rows(const ds41_config *cfg, long long M);
/* s at position 0. Attaches the pages as ds41_seq_restore does and sets the state from st:
 * nothing is recomputed, except, for the decoder split, the decoder layers on st's stream rows.
 * Refuses a history that is not the one ids imply. On failure the sequence must be reset. */
int ds41_seq_install(ds41_seq *s, const int32_t *ids, long long M, uint8_t *const *pages, const ds41_resume_state *st,
                     ds41_err *err);

/* Session-level (session.c): ds41_seq_restore plus the DSpark ring seeding a feed does; the
 * session must be at position 0 and not broken. Returns 0 or -1 (ds41_session_error; the
 * session is then broken until reset). */
int ds41_session_restore(ds41_session *s, const int32_t *ids, long long M, uint8_t *const *pages, int mode,
                         int want_logits, const ds41_restore_img *im);
/* ds41_seq_install plus the DSpark ring seeding a feed does (from st's context rows). */
int ds41_session_install(ds41_session *s, const int32_t *ids, long long M, uint8_t *const *pages,
                         const ds41_resume_state *st);
/* 1 when the session drafts (DSpark): a prefill node then ships the context rows too. */
int ds41_session_drafts(const ds41_session *s);
/* The sequence of a session (for the prefix cache, which reads its pages and settings). */
ds41_seq *ds41_session_seq(ds41_session *s);
int ds41_session_index_k(const ds41_session *s);
/* serve --dp-attention (src/serve/serve_mpi.c): rank 0's copy of a sequence that another rank
 * runs. Its n tokens ran there: the position moves on by n and logits (vocab values; NULL: the
 * forward computed none, a prompt part) become its last row; err != NULL: the step failed
 * there, and the session is broken with that message. */
void ds41_session_absorb(ds41_session *s, size_t n, const float *logits, const char *err);
/* The same for a sequence whose owner samples (no logits travel): its n tokens ran there and
 * the owner drew id from them with the sequence's sampler; the next ds41_session_sample
 * returns id (once). */
void ds41_session_absorb_token(ds41_session *s, size_t n, int32_t id);
/* The same for a verify block of k drafts that the owner ran and decided (--spec): accepted
 * of them kept, so accepted + 1 positions more, and the drafting gate's acceptance counts as
 * ds41_batch_step records them (the scheduler's ds41_spec_want_draft reads them). 0, or -1
 * (out of memory for the speculative state; the session's error says so). */
int ds41_session_absorb_verify(ds41_session *s, int k, int accepted);

#endif
