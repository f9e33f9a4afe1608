/* ds41 grammar internals shared by grammar.c (compiling) and grammar_match.c (running). */
#ifndef DS41_GRAMMAR_INTERNAL_H
#define DS41_GRAMMAR_INTERNAL_H

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

static inline int gcs_has(const uint32_t *cs, unsigned b) { return (cs[b >> 5] >> (b & 31)) & 1; }

#endif
