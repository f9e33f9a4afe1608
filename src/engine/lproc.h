/* ds41 logits processing before sampling: logit_bias, min_tokens, repetition / frequency /
 * presence penalties and a grammar's allowed-token mask (src/text/grammar.h).
 *
 * One processor belongs to one sequence and is applied in one place for every sampling path
 * (ds41_session_sample and the speculative verify of spec.c, in exact and fast mode alike):
 * the row is copied, processed, then sampled. It depends only on the sequence's own tokens,
 * so a processed sequence stays batch invariant and reproducible per seed.
 *
 * Order on a row (the vLLM order): min_tokens ban, logit_bias, repetition penalty (over
 * prompt and generated tokens: l > 0 ? l / r : l * r), frequency and presence penalties (over
 * generated tokens: l -= f * count + p * (count > 0)), then the grammar mask (-inf outside),
 * then the reasoning budget (a reply that starts as reasoning and has spent think_budget tokens
 * in it: every entry but the end of the reasoning -inf, that one kept, or 0 if it was -inf).
 *
 * The processor's state covers the tokens accepted so far (ds41_lproc_accept). A verify block
 * samples rows past tokens not accepted yet (the drafts before the row): they are passed as a
 * tail and counted as if accepted, without changing the state. */
#ifndef DS41_LPROC_H
#define DS41_LPROC_H

#include <stddef.h>
#include <stdint.h>

#include "grammar.h"

typedef struct ds41_lproc {
    int V;
    int eos;                      /* allowed alone when nothing else is (-1: none) */
    /* settings */
    float freq, pres, rep;        /* 0, 0, 1: off */
    int32_t *bias_id;
    float *bias_val;
    int n_bias;
    long long min_tokens;
    int32_t *ban_ids;             /* banned while fewer than min_tokens are generated */
    int n_ban;
    /* grammar: the compiled grammar (owned by the caller, shared by the choices of a request)
     * and this sequence's state; gate >= 0: the reply starts as reasoning, which that token
     * (</think>) ends and after which the grammar starts; gate_open: it has been accepted */
    ds41_gmatch *gm;
    int gstate;
    int gate, gate_open;
    int32_t *stop_ids;            /* also end a constrained sequence (allowed when it may end) */
    int n_stop_ids;
    /* reasoning budget (vLLM's thinking_token_budget, Anthropic's thinking.budget_tokens): the
     * reasoning before the gate may spend at most think_budget tokens; the row after that many
     * allows only the gate. think_budget < 0: off. n_think: the accepted tokens before the gate */
    long long think_budget;
    long long n_think;
    /* the allowed tokens of the row being processed, [(V + 31) / 32] bits (ds41_lproc_allowed);
     * remote: the grammar's matcher is held elsewhere (serve --dp-attention: rank 0 sends the
     * owner of the sequence these bits ahead of each row it samples, gm stays NULL here) and
     * xset says what the bits hold for the next row: 1 its allowed tokens, 0 none constrained
     * (before the grammar's gate), -1 nothing given */
    uint32_t *bits;
    int remote, xset;
    /* remote, a verify block (--spec): xrows > 0 when rank 0 gave the allowed tokens of each
     * of the block's xrows rows (ds41_lproc_xrows): the row after r drafts (tail n_tail = r)
     * takes the W = (V + 31) / 32 words at xbits + r * W when xon[r], else is not constrained
     * (before the grammar's gate); xset is not read meanwhile */
    uint32_t *xbits;
    uint8_t *xon;
    int xrows, xcap;
    /* state */
    uint32_t *count;              /* [V] generated occurrences */
    uint8_t *flag;                /* [V] 1: in the prompt, 2: generated */
    int32_t *gen_ids, *pr_ids;    /* distinct generated / prompt ids */
    size_t n_gen_ids, cap_gen_ids, n_pr_ids;
    long long n_gen;
    char err[160];                /* set when the grammar cannot continue (a limit) */
} ds41_lproc;

/* Zeroed processor for a vocabulary of V (all off). */
void ds41_lproc_init(ds41_lproc *lp, int V, int eos);
void ds41_lproc_free(ds41_lproc *lp);
/* Allocates the state (after the settings): 0, -1 out of memory. */
int ds41_lproc_ready(ds41_lproc *lp);
/* Whether the processor changes anything. */
int ds41_lproc_active(const ds41_lproc *lp);
/* The prompt, for the repetition penalty. */
int ds41_lproc_prompt(ds41_lproc *lp, const int32_t *ids, size_t n);
/* Processes row[V] for the token after the accepted ones plus tail[0..n_tail). Never leaves
 * every entry -inf: if nothing is allowed, eos (else token 0) is. */
void ds41_lproc_apply(ds41_lproc *lp, float *row, const int32_t *tail, int n_tail);
/* The grammar's part of ds41_lproc_apply for the row after the accepted tokens plus tail: 0
 * when the grammar constrains nothing there (none, or before its gate), else 1 with bits
 * [(V + 31) / 32] the allowed tokens: the grammar's mask with eos and the first 64 stop ids
 * allowed exactly when the grammar may end (a grammar that cannot continue: only those, and
 * err says why). ds41_lproc_apply sets every other entry to -inf, the same row as masking and
 * restoring the end tokens. */
int ds41_lproc_allowed(ds41_lproc *lp, const int32_t *tail, int n_tail, uint32_t *bits);
/* remote: room for the allowed tokens of a verify block of `rows` rows, none constrained yet
 * (xrows = rows, xon[0..rows) = 0); 0, or -1 out of memory. */
int ds41_lproc_xrows(ds41_lproc *lp, int rows);
/* Turns the reasoning budget on for a reply that starts inside its reasoning: gate = end
 * (</think>, a token id of the vocabulary), at most budget (>= 0) tokens before it. */
void ds41_lproc_think_budget(ds41_lproc *lp, int end, long long budget);
/* Accepts a generated token. */
void ds41_lproc_accept(ds41_lproc *lp, int32_t id);
/* How many of drafts[0..k) the grammar and the reasoning budget accept in order after the
 * accepted tokens (k when neither applies): drafts past a refusal cannot be accepted and are
 * not worth verifying. */
int ds41_lproc_valid_prefix(ds41_lproc *lp, const int32_t *drafts, int k);

#endif
