/* ds41 constrained decoding: grammars over bytes and the allowed-token mask per step.
 *
 *   grammar.c        llama.cpp's GBNF notation -> a compiled grammar (rules of alternatives of
 *                    byte sets and rule references; repetitions become right-recursive rules;
 *                    character classes become UTF-8 byte sequences; left recursion refused)
 *   grammar_json.c   JSON Schema / json_object -> GBNF text (then grammar.c)
 *   grammar_regex.c  a regular expression / a choice list -> GBNF text
 *   grammar_match.c  the runtime: a token trie of the vocabulary's bytes walked against the
 *                    grammar's state, with interned states and cached masks
 *   grammar_tables.c per grammar position, the tokens it accepts or refuses alone and the trie
 *                    nodes where the answer depends on the stack below (masks without the walk)
 *
 * A grammar's state is a set of stacks (llama.cpp's pushdown form): each stack the positions
 * still to match, its top a byte set. States are interned (one id per distinct set), so a
 * sequence's state is one int, the byte transitions of a state are computed once and the mask
 * of a state (which tokens can follow) once per grammar: the inside of a JSON string, for one,
 * is the same state after every character.
 *
 * Limits (a hostile grammar or schema gets an error, not unbounded memory or time): the text
 * size, rules, elements after expanding repetitions, repetition counts, schema depth, states,
 * stacks per state and stack depth (DS41_GRAMMAR_* below). */
#ifndef DS41_GRAMMAR_H
#define DS41_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

enum {
    DS41_GRAMMAR_MAX_TEXT = 1 << 20,      /* GBNF bytes (after a schema's translation too) */
    DS41_GRAMMAR_MAX_RULES = 20000,
    DS41_GRAMMAR_MAX_ELEMS = 400000,      /* after repetitions are expanded */
    DS41_GRAMMAR_MAX_REPEAT = 1000,       /* m and n of x{m,n} */
    DS41_GRAMMAR_MAX_STATES = 20000,      /* interned states per matcher */
    DS41_GRAMMAR_MAX_STACKS = 512,        /* stacks in one state */
    DS41_GRAMMAR_MAX_DEPTH = 256,         /* positions in one stack (nesting) */
    DS41_SCHEMA_MAX_DEPTH = 64,
};

typedef struct ds41_grammar ds41_grammar;   /* compiled rules, immutable */
typedef struct ds41_gvocab ds41_gvocab;     /* a vocabulary's token trie, immutable */
typedef struct ds41_gmatch ds41_gmatch;     /* grammar x vocabulary runtime; one thread at a time (but prefetch) */
typedef struct ds41_gtables ds41_gtables;   /* grammar x vocabulary precomputed token classes, immutable */

/* GBNF text[len] (the start rule is `root`). NULL with err set (one line, naming the rule or
 * the offset). */
ds41_grammar *ds41_grammar_gbnf(const char *text, size_t len, char *err, size_t errcap);
void ds41_grammar_free(ds41_grammar *g);
int ds41_grammar_n_rules(const ds41_grammar *g);

/* JSON Schema (JSON text) -> GBNF text (malloc'd, NUL-terminated), or NULL with err naming the
 * schema path and the unsupported keyword. schema NULL: any JSON object (json_object mode). */
char *ds41_schema_to_gbnf(const char *schema, size_t len, char *err, size_t errcap);
/* A forced tool call in V4.1's DSML form (as src/text/chat.c renders assistant calls): the
 * calls block with one invoke (parallel 0) or several, of the function named only (NULL: any
 * of tools, an OpenAI tools array as JSON text); string parameters raw (string="true"), others
 * JSON satisfying their schema. NULL with err naming the tool and keyword. */
char *ds41_tools_to_gbnf(const char *tools, size_t len, const char *only, int parallel, char *err, size_t errcap);
/* A regular expression (the whole output must match) -> GBNF text, or NULL with err. */
char *ds41_regex_to_gbnf(const char *re, size_t len, char *err, size_t errcap);
/* Output exactly one of the strings. */
char *ds41_choice_to_gbnf(const char *const *choices, const size_t *lens, int n, char *err, size_t errcap);
/* Appends to *buf (cap *cap, length *len) a GBNF string literal for s[n]: "..." with escapes.
 * 0, or -1 out of memory. Shared by the translators. */
int ds41_gbnf_literal(char **buf, size_t *len, size_t *cap, const char *s, size_t n);

/* The vocabulary: token id -> its bytes (n 0: the token is never allowed by a grammar, e.g. a
 * special or added token; the end tokens are handled by the caller). */
ds41_gvocab *ds41_gvocab_new(int V, const char *const *bytes, const size_t *lens);
void ds41_gvocab_free(ds41_gvocab *v);
int ds41_gvocab_size(const ds41_gvocab *v);

/* A matcher is used by one thread at a time, except that ds41_gmatch_prefetch may run on
 * another thread beside the owner's calls (every entry point takes the matcher's lock). */
ds41_gmatch *ds41_gmatch_new(const ds41_grammar *g, const ds41_gvocab *v);
void ds41_gmatch_free(ds41_gmatch *m);
/* The start state (-1 when a limit is hit at once: ds41_gmatch_error). */
int ds41_gmatch_start(ds41_gmatch *m);
/* The state after token id (its bytes), or -1: refused (or a limit: ds41_gmatch_error). */
int ds41_gmatch_advance(ds41_gmatch *m, int state, int id);
int ds41_gmatch_advance_bytes(ds41_gmatch *m, int state, const char *s, size_t n);
/* Whether the output may end here (some stack is empty). */
int ds41_gmatch_can_end(ds41_gmatch *m, int state);
/* The allowed tokens after state: bit id of words[(V + 31) / 32]; NULL on a limit. The
 * pointer stays valid until the next call on m. */
const uint32_t *ds41_gmatch_mask(ds41_gmatch *m, int state);
/* Computes and caches the mask of state s unless it is cached already or the cache is full
 * (then the owner's ds41_gmatch_mask computes it as before); 1 when it computed it. The server runs it on a helper
 * thread while the step's forward runs, so that the sampler finds the mask cached. The bits
 * are those ds41_gmatch_mask gives either way. */
int ds41_gmatch_prefetch(ds41_gmatch *m, int s);
const char *ds41_gmatch_error(const ds41_gmatch *m);
/* Sets row[i] = -inf for every i < V whose bit in mask is clear (words of 32 bits). */
void ds41_gmask_apply(const uint32_t *mask, float *row, int V);
/* Counters for measurements: states interned, masks computed, masks served from the cache. */
void ds41_gmatch_stats(ds41_gmatch *m, long long *states, long long *computed, long long *cached);

/* Precomputed token classes (grammar_tables.c), XGrammar's idea: for each grammar position (a
 * byte set that can be a stack's top), each token is accepted or refused by the position alone
 * (context-independent: a bitset or a list, computed once), or it can pop the position's
 * rule before its last byte (context-dependent: kept with the byte offsets of those pops, and
 * checked against the stack below at run time). A mask is then the union over the state's
 * stacks of their tops' accepted sets plus the context-dependent tokens the stack below
 * accepts: the same bits as the trie walk. Build once per grammar and vocabulary (it reads
 * both; they must outlive it); read-only afterwards, so matchers on any thread can share it.
 * NULL with err set (out of memory). A position is left to the trie walk when the build
 * budget runs out or a limit is hit while building it. */
ds41_gtables *ds41_gtables_new(const ds41_grammar *g, const ds41_gvocab *v, char *err, size_t errcap);
void ds41_gtables_free(ds41_gtables *t);
/* Bytes held, tables of one position and of a (below, position) pair, and tables left to the
 * trie walk (the build budget or a limit). */
void ds41_gtables_stats(const ds41_gtables *t, size_t *bytes, int *positions, int *pairs, int *skipped);
/* The memo (grammar_memo.c) that grows as the matchers using t compute masks: the
 * context-dependent sets per (pop node, stack below) and the finished masks per state, shared
 * by those matchers. Bytes held, sets served from it and sets walked, masks served from it. */
void ds41_gtables_memo_stats(const ds41_gtables *t, size_t *bytes, long long *hits, long long *misses, long long *mask_hits);
/* Masks of m from now on come from t (built for m's grammar and vocabulary): 0, or -1. */
int ds41_gmatch_use_tables(ds41_gmatch *m, const ds41_gtables *t);

#endif
