/* ds41 grammar internals shared by grammar.c (compiling) and grammar_match.c (running). */
#ifndef DS41_GRAMMAR_INTERNAL_H
#define DS41_GRAMMAR_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>

#include "grammar.h"

enum { GE_END = 0, GE_CHARS = 1, GE_REF = 2 };

typedef struct gel {
    int32_t kind;
    int32_t arg;       /* GE_CHARS: byte set index; GE_REF: rule */
} gel;

/* Each alternative is its elements then GE_END in el[]; a rule's alternatives start at
 * el[alts[rule_alt[r] + k]] for k < rule_nalt[r]. */
struct ds41_grammar {
    gel *el;
    int n_el;
    int32_t *alts;
    int n_alts;
    int32_t *rule_alt, *rule_nalt;
    int n_rules, root;
    uint32_t *cs;      /* byte sets: 8 words each */
    int n_cs;
};

/* Appends to *buf (length *len, capacity *cap) the GBNF rule `name ::= ...` for the regular
 * expression re[n] (a whole match). json_safe: the text goes inside a JSON string, so '.',
 * negated classes and characters that JSON escapes (", \, controls) are refused. 0, or -1 with
 * err set. */
int ds41_regex_rule(const char *re, size_t n, const char *name, int json_safe, char **buf, size_t *len, size_t *cap,
                    char *err, size_t errcap);
/* The first error of a translation or compilation: formats it into err (one line: controls
 * become spaces, as messages quote the input) unless *failed is set already; returns -1. */
int ds41_gerr_set(char *err, size_t cap, int *failed, const char *fmt, va_list ap);
/* Appends printf text to a growing buffer; 0 or -1 out of memory. */
int ds41_gbuf_printf(char **buf, size_t *len, size_t *cap, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* ------------------------------------------------------------------ runtime (grammar_match.c) */

/* The vocabulary as a trie in preorder: node i has its byte, its depth and the index just past
 * its subtree; the tokens ending at node i are toks[tok0[i] .. tok0[i] + ntok[i]). */
struct ds41_gvocab {
    int V;
    int n_nodes, max_depth, n_toks;
    uint8_t *byte;
    uint16_t *depth;     /* 1 for the root's children */
    int32_t *end;        /* index past the subtree */
    int32_t *tok0, *ntok;
    int32_t *toks;       /* token ids in trie order */
    char *arena;         /* the tokens' bytes */
    size_t *off, *len;   /* per id */
};

enum { MASK_CACHE_BYTES = 64 << 20, ARENA_MAX = 16 << 20, WORK_MAX = 1 << 22, TOKEN_MAX = 1024 };

struct ds41_gmatch {
    pthread_mutex_t mu;        /* held by the public entry points (a prefetch may run beside) */
    const ds41_grammar *g;
    const ds41_gvocab *v;
    const ds41_gtables *tab;   /* NULL: masks by walking the trie */
    int words;                 /* mask words */
    /* interned states: stacks serialised as [n_stacks, (len, positions...)...] in arena */
    int32_t *arena;
    size_t an, acap;
    size_t *soff;
    int32_t **trans;           /* [256]: -2 unknown, -1 refused, else the state */
    uint16_t **tdep;           /* track_depth: [256] the longest stack pushed by that transition */
    uint32_t **mask;
    uint8_t *acc;
    int ns, scap;
    int32_t *ht;               /* open addressing over state ids, -1 empty */
    size_t hcap;
    size_t mask_bytes;
    uint32_t *mbuf;            /* a mask not kept (the cache is full) */
    int32_t *dst;              /* walk: the state per trie depth */
    /* building a state: stacks in out[] as (len, positions...), a worklist in work[] */
    int32_t *out, *work;
    size_t on, ocap, wn, wcap;
    int32_t *order;            /* stack offsets in out, sorted */
    size_t ordcap;
    int track_depth, push_max; /* push_max: the longest stack work_push was asked for */
    uint32_t *seen;            /* tables: per position, the mask computation that OR-ed it last */
    uint32_t *dep;             /* tables: a pop node's walk (words; zero between uses), for the memo */
    int32_t *work_pops, *work_ids;   /* tables: the pop nodes the memo missed; a walk's allowed ids */
    uint32_t stamp;
    long long computed, cached, prefetched, shared;   /* shared: masks copied from the tables' memo */
    char err[160];
};

/* Grows *p (capacity *cap) to hold need entries, doubling: 0, or -1 out of memory. */
int ds41_ggrow32(int32_t **p, size_t *cap, size_t need);
/* The state after byte from state s (-1: refused, or a limit with m->err set); cached. */
int ds41_gm_step(ds41_gmatch *m, int s, unsigned byte);
/* The state of one stack st[0..len) (its top expanded), or -1. */
int ds41_gm_stack_state(ds41_gmatch *m, const int32_t *st, int len);
/* Sets in mk the tokens of trie nodes lo..hi (a subtree's nodes, below depth d0) allowed
 * after state s, the state at depth d0: the walk skips the subtree of a refused byte. 0, or
 * -1 on a limit. The whole trie from s: lo 0, hi n_nodes, d0 0. */
int ds41_gm_walk(ds41_gmatch *m, int s, uint32_t *mk, int lo, int hi, int d0);
/* The mask of state s from m->tab into mk (zeroed): 0, 1 when the tables do not cover s (a
 * position past the depth guard or not precomputed: walk the trie instead), -1 on a limit. */
int ds41_gtables_mask(ds41_gmatch *m, int s, uint32_t *mk);

/* The memo of context-dependent token sets (grammar_memo.c), one per ds41_gtables, shared by
 * its matchers on any thread: per (pop node, the elements below), the tokens of the node's
 * subtree allowed from the state of that stack below. */
typedef struct ds41_gdep ds41_gdep;
ds41_gdep *ds41_gdep_new(void);
void ds41_gdep_free(ds41_gdep *d);
/* The hash of below[0..nb) that the calls below take. */
uint64_t ds41_gdep_hash(const int32_t *below, int nb);
/* ORs into mk the kept sets of nodes[0..n) over below; the nodes with none go to missed (room
 * for n), their count returned. */
size_t ds41_gdep_or(ds41_gdep *d, const int32_t *nodes, size_t n, const int32_t *below, int nb, uint64_t hb, uint32_t *mk,
                    int32_t *missed);
/* Keeps ids[0..n) for (node, below), unless the memo is full or has it already. */
void ds41_gdep_put(ds41_gdep *d, int node, const int32_t *below, int nb, uint64_t hb, const int32_t *ids, size_t n);
/* The mask kept for the state whose stacks serialise as st[0..n) (a matcher's arena form),
 * copied into mk (words): 1, or 0 when none is kept. */
int ds41_gdep_mask_get(ds41_gdep *d, const int32_t *st, size_t n, uint32_t *mk, int words);
/* Keeps mk as that state's mask, unless the memo is full or has it already. */
void ds41_gdep_mask_put(ds41_gdep *d, const int32_t *st, size_t n, const uint32_t *mk, int words);
/* Bytes held (sets and masks), sets served and walked, masks served. */
void ds41_gdep_stats(ds41_gdep *d, size_t *bytes, long long *hits, long long *misses, long long *mask_hits);
/* The memo of m's tables (NULL without tables). */
ds41_gdep *ds41_gtables_memo(const ds41_gtables *t);

/* ds41_gmask_apply with its instruction set named (2 AVX-512, 1 AVX2, 0 scalar; the caller
 * checks the CPU has it), and the one ds41_gmask_apply uses (the best the CPU has). */
void ds41_gmask_apply_isa(const uint32_t *mask, float *row, int V, int isa);
int ds41_gmask_isa(void);

static inline int gcs_has(const uint32_t *cs, unsigned b) { return (cs[b >> 5] >> (b & 31)) & 1; }

#endif
