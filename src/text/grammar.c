/* ds41 grammar: GBNF text -> compiled grammar (grammar.h).
 *
 * The notation is llama.cpp's: `name ::= alternatives`, alternatives separated by `|`, items
 * "literal" (escapes \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH), [class] / [^class] with ranges,
 * `.` (any character), rule names, ( groups ), and the postfixes * + ? {m} {m,} {m,n}; `#`
 * starts a comment; a rule ends at a newline outside parentheses (after `::=` and `|` newlines
 * are skipped). Characters are Unicode code points matched as their UTF-8 bytes: a class
 * becomes alternatives of byte-range sequences (the standard split of a code point range at
 * the UTF-8 length and continuation-byte boundaries), so every accepted output is valid UTF-8.
 *
 * Repetitions become rules: x* -> R ::= x R | (empty); x+ -> x R; x? -> R ::= x | (empty);
 * x{m,n} -> m copies of x then n - m nested optionals. Right recursion keeps the runtime's
 * stacks flat; left recursion (a rule reaching itself before consuming a byte) would not
 * terminate and is refused here. */
#include "grammar_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct seqv { gel *e; int n, cap; } seqv;
typedef struct brule { char *name; seqv *alts; int nalt, capalt, defined; } brule;

typedef struct bld {
    const char *s;
    size_t n, i;
    brule *r;
    int nr, capr;
    uint32_t *cs;
    int ncs, capcs;
    long long n_elems;
    char *err;
    size_t errcap;
    int failed;
} bld;

int ds41_gerr_set(char *err, size_t cap, int *failed, const char *fmt, va_list ap) {
    if (*failed) return -1;
    *failed = 1;
    vsnprintf(err, cap, fmt, ap);
    for (char *p = err; *p; p++) if ((unsigned char)*p < 0x20) *p = ' ';
    return -1;
}

static int bfail(bld *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bfail(bld *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = ds41_gerr_set(b->err, b->errcap, &b->failed, fmt, ap);
    va_end(ap);
    return rc;
}

static int seq_push(bld *b, seqv *q, int kind, int arg) {
    if (++b->n_elems > DS41_GRAMMAR_MAX_ELEMS) return bfail(b, "grammar: more than %d elements", DS41_GRAMMAR_MAX_ELEMS);
    if (q->n == q->cap) {
        int nc = q->cap ? q->cap * 2 : 8;
        gel *p = realloc(q->e, (size_t)nc * sizeof *p);
        if (!p) return bfail(b, "grammar: out of memory");
        q->e = p;
        q->cap = nc;
    }
    q->e[q->n].kind = kind;
    q->e[q->n++].arg = arg;
    return 0;
}

static int rule_new(bld *b, const char *name, size_t len) {
    if (b->nr >= DS41_GRAMMAR_MAX_RULES) return bfail(b, "grammar: more than %d rules", DS41_GRAMMAR_MAX_RULES);
    if (b->nr == b->capr) {
        int nc = b->capr ? b->capr * 2 : 32;
        brule *p = realloc(b->r, (size_t)nc * sizeof *p);
        if (!p) return bfail(b, "grammar: out of memory");
        b->r = p;
        b->capr = nc;
    }
    brule *r = &b->r[b->nr];
    memset(r, 0, sizeof *r);
    r->name = malloc(len + 1);
    if (!r->name) return bfail(b, "grammar: out of memory");
    memcpy(r->name, name, len);
    r->name[len] = 0;
    return b->nr++;
}

static int rule_find(bld *b, const char *name, size_t len) {
    for (int i = 0; i < b->nr; i++)
        if (strlen(b->r[i].name) == len && !memcmp(b->r[i].name, name, len)) return i;
    return rule_new(b, name, len);
}

static int rule_anon(bld *b) {
    char nm[32];
    int k = snprintf(nm, sizeof nm, "\x01%d", b->nr);   /* cannot collide with a GBNF name */
    int r = rule_new(b, nm, (size_t)k);
    if (r >= 0) b->r[r].defined = 1;
    return r;
}

static seqv *alt_new(bld *b, int rule) {
    brule *r = &b->r[rule];
    if (r->nalt == r->capalt) {
        int nc = r->capalt ? r->capalt * 2 : 4;
        seqv *p = realloc(r->alts, (size_t)nc * sizeof *p);
        if (!p) { bfail(b, "grammar: out of memory"); return NULL; }
        r->alts = p;
        r->capalt = nc;
    }
    seqv *q = &r->alts[r->nalt++];
    memset(q, 0, sizeof *q);
    return q;
}

static int cs_new(bld *b) {
    if (b->ncs == b->capcs) {
        int nc = b->capcs ? b->capcs * 2 : 32;
        uint32_t *p = realloc(b->cs, (size_t)nc * 8 * sizeof *p);
        if (!p) return bfail(b, "grammar: out of memory");
        b->cs = p;
        b->capcs = nc;
    }
    memset(b->cs + (size_t)b->ncs * 8, 0, 8 * sizeof *b->cs);
    return b->ncs++;
}

static int cs_byte_range(bld *b, int lo, int hi) {
    int c = cs_new(b);
    if (c < 0) return -1;
    uint32_t *w = b->cs + (size_t)c * 8;
    for (int x = lo; x <= hi; x++) w[x >> 5] |= 1u << (x & 31);
    return c;
}

/* ------------------------------------------------------------------ lexing */

static void skip_space(bld *b, int newlines) {
    while (b->i < b->n) {
        char c = b->s[b->i];
        if (c == '#') {
            while (b->i < b->n && b->s[b->i] != '\n') b->i++;
        } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
            b->i++;
        } else {
            break;
        }
    }
}

static int is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One UTF-8 code point at s[i..n) (invalid bytes read as themselves). */
static uint32_t utf8_next(const char *s, size_t n, size_t *i) {
    const unsigned char *u = (const unsigned char *)s;
    unsigned c = u[*i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (*i + (size_t)len > n) len = 1;
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < len; k++) {
        if ((u[*i + k] & 0xC0) != 0x80) { len = 1; cp = c; break; }
        cp = cp << 6 | (u[*i + k] & 0x3F);
    }
    *i += (size_t)len;
    return cp;
}

/* A character of a literal or class (an escape or a code point); -1 on error. */
static long read_char(bld *b) {
    if (b->i >= b->n) return bfail(b, "grammar: unexpected end at offset %zu", b->i);
    if (b->s[b->i] != '\\') return (long)utf8_next(b->s, b->n, &b->i);
    if (++b->i >= b->n) return bfail(b, "grammar: unfinished escape at offset %zu", b->i);
    char c = b->s[b->i++];
    int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (digits) {
        long v = 0;
        for (int k = 0; k < digits; k++) {
            int h = b->i < b->n ? hexval(b->s[b->i]) : -1;
            if (h < 0) return bfail(b, "grammar: bad \\%c escape at offset %zu", c, b->i);
            v = v * 16 + h;
            b->i++;
        }
        if (v > 0x10FFFF) return bfail(b, "grammar: code point %lx past U+10FFFF", v);
        return v;
    }
    switch (c) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '0': return 0;
    case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': case '/': return c;
    default: return bfail(b, "grammar: unknown escape \\%c at offset %zu", c, b->i - 1);
    }
}

/* ------------------------------------------------------------------ classes -> bytes */

typedef struct cprange { uint32_t lo, hi; } cprange;

static int enc_utf8(uint32_t cp, unsigned char *o) {
    if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { o[0] = (unsigned char)(0xC0 | cp >> 6); o[1] = (unsigned char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12); o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18); o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F)); o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Adds to rule `rule` the byte-range sequences matching code points lo..hi (surrogates
 * excluded); one-byte ranges go into the set *ascii (created on first use). */
static int utf8_split(bld *b, int rule, uint32_t lo, uint32_t hi, int *ascii) {
    if (lo > hi || b->failed) return b->failed ? -1 : 0;
    if (lo < 0xD800 && hi > 0xDFFF) return utf8_split(b, rule, lo, 0xD7FF, ascii) || utf8_split(b, rule, 0xE000, hi, ascii);
    if (lo >= 0xD800 && lo <= 0xDFFF) return utf8_split(b, rule, 0xE000, hi, ascii);
    if (hi >= 0xD800 && hi <= 0xDFFF) return utf8_split(b, rule, lo, 0xD7FF, ascii);
    static const uint32_t lim[3] = { 0x7F, 0x7FF, 0xFFFF };
    for (int k = 0; k < 3; k++)
        if (lo <= lim[k] && hi > lim[k]) return utf8_split(b, rule, lo, lim[k], ascii) || utf8_split(b, rule, lim[k] + 1, hi, ascii);
    if (hi < 0x80) {
        if (*ascii < 0) {
            *ascii = cs_new(b);
            if (*ascii < 0) return -1;
        }
        uint32_t *w = b->cs + (size_t)*ascii * 8;
        for (uint32_t x = lo; x <= hi; x++) w[x >> 5] |= 1u << (x & 31);
        return 0;
    }
    for (int i = 1; i < 4; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) return utf8_split(b, rule, lo, lo | m, ascii) || utf8_split(b, rule, (lo | m) + 1, hi, ascii);
            if ((hi & m) != m) return utf8_split(b, rule, lo, (hi & ~m) - 1, ascii) || utf8_split(b, rule, hi & ~m, hi, ascii);
        }
    }
    unsigned char lb[4], hb[4];
    int n = enc_utf8(lo, lb);
    enc_utf8(hi, hb);
    seqv *q = alt_new(b, rule);
    if (!q) return -1;
    for (int k = 0; k < n; k++) {
        int c = cs_byte_range(b, lb[k], hb[k]);
        if (c < 0 || seq_push(b, q, GE_CHARS, c)) return -1;
    }
    return 0;
}

static int cmp_range(const void *a, const void *b) {
    const cprange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Appends to q the item matching one code point of ranges r[0..n) (negated: the others). */
static int class_item(bld *b, seqv **qp, int seq_rule, int seq_alt, cprange *r, int n, int negate) {
    qsort(r, (size_t)n, sizeof *r, cmp_range);
    cprange *u = malloc((size_t)(n + 1) * sizeof *u);
    if (!u) return bfail(b, "grammar: out of memory");
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && r[i].lo <= u[m - 1].hi + 1) { if (r[i].hi > u[m - 1].hi) u[m - 1].hi = r[i].hi; }
        else u[m++] = r[i];
    }
    if (negate) {
        cprange *v = malloc((size_t)(m + 1) * sizeof *v);
        if (!v) { free(u); return bfail(b, "grammar: out of memory"); }
        int k = 0;
        uint32_t next = 0;
        for (int i = 0; i < m; i++) {
            if (u[i].lo > next) v[k++] = (cprange){ next, u[i].lo - 1 };
            next = u[i].hi + 1;
        }
        if (next <= 0x10FFFF) v[k++] = (cprange){ next, 0x10FFFF };
        free(u);
        u = v;
        m = k;
    }
    if (m == 0) { free(u); return bfail(b, "grammar: a character class that matches nothing at offset %zu", b->i); }
    int all_ascii = u[m - 1].hi < 0x80;
    if (all_ascii) {
        int c = cs_new(b);
        if (c < 0) { free(u); return -1; }
        uint32_t *w = b->cs + (size_t)c * 8;
        for (int i = 0; i < m; i++)
            for (uint32_t x = u[i].lo; x <= u[i].hi; x++) w[x >> 5] |= 1u << (x & 31);
        free(u);
        return seq_push(b, *qp, GE_CHARS, c);
    }
    int rule = rule_anon(b);
    if (rule < 0) { free(u); return -1; }
    int ascii = -1;
    for (int i = 0; i < m && !b->failed; i++) utf8_split(b, rule, u[i].lo, u[i].hi, &ascii);
    free(u);
    if (b->failed) return -1;
    if (ascii >= 0) {
        seqv *q = alt_new(b, rule);
        if (!q || seq_push(b, q, GE_CHARS, ascii)) return -1;
    }
    /* alt_new may have moved the rule arrays: the caller's sequence is found again */
    *qp = &b->r[seq_rule].alts[seq_alt];
    return seq_push(b, *qp, GE_REF, rule);
}

static int parse_class(bld *b, seqv **qp, int seq_rule, int seq_alt) {
    b->i++;   /* [ */
    int negate = b->i < b->n && b->s[b->i] == '^';
    if (negate) b->i++;
    cprange *r = NULL;
    int n = 0, cap = 0;
    while (b->i < b->n && b->s[b->i] != ']') {
        long lo = read_char(b), hi = lo;
        if (lo < 0) { free(r); return -1; }
        if (b->i + 1 < b->n && b->s[b->i] == '-' && b->s[b->i + 1] != ']') {
            b->i++;
            hi = read_char(b);
            if (hi < 0) { free(r); return -1; }
            if (hi < lo) { free(r); return bfail(b, "grammar: class range out of order at offset %zu", b->i); }
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            if (cap > 100000) { free(r); return bfail(b, "grammar: character class too long"); }
            cprange *p = realloc(r, (size_t)cap * sizeof *p);
            if (!p) { free(r); return bfail(b, "grammar: out of memory"); }
            r = p;
        }
        r[n++] = (cprange){ (uint32_t)lo, (uint32_t)hi };
    }
    if (b->i >= b->n) { free(r); return bfail(b, "grammar: unclosed [ class"); }
    b->i++;
    int rc = n || negate ? class_item(b, qp, seq_rule, seq_alt, r ? r : &(cprange){ 0, 0 }, n, negate)
                         : bfail(b, "grammar: empty character class at offset %zu", b->i);
    free(r);
    return rc;
}

/* ------------------------------------------------------------------ sequences */

static int parse_alternates(bld *b, int rule, int nested);

/* Wraps q->e[from..n) into one element (itself when it is one) and returns it. */
static int item_one(bld *b, seqv **qp, int seq_rule, int seq_alt, int from, gel *out) {
    seqv *q = *qp;
    if (q->n - from == 1) { *out = q->e[from]; q->n = from; return 0; }
    int r = rule_anon(b);
    if (r < 0) return -1;
    q = *qp = &b->r[seq_rule].alts[seq_alt];
    seqv *a = alt_new(b, r);
    if (!a) return -1;
    q = *qp = &b->r[seq_rule].alts[seq_alt];
    for (int k = from; k < q->n; k++) if (seq_push(b, a, q->e[k].kind, q->e[k].arg)) return -1;
    b->n_elems -= q->n - from;
    q->n = from;
    *out = (gel){ GE_REF, r };
    return 0;
}

/* R ::= x R | (empty): x* */
static int star_rule(bld *b, gel x) {
    int r = rule_anon(b);
    if (r < 0) return -1;
    seqv *a = alt_new(b, r);
    if (!a || seq_push(b, a, x.kind, x.arg) || seq_push(b, a, GE_REF, r)) return -1;
    return alt_new(b, r) ? r : -1;
}

static int parse_repeat(bld *b, seqv **qp, int seq_rule, int seq_alt, int from) {
    char c = b->s[b->i];
    long m = 0, n = -1;
    if (c == '*') { m = 0; n = -1; b->i++; }
    else if (c == '+') { m = 1; n = -1; b->i++; }
    else if (c == '?') { m = 0; n = 1; b->i++; }
    else {
        b->i++;
        skip_space(b, 1);
        int got = 0;
        while (b->i < b->n && b->s[b->i] >= '0' && b->s[b->i] <= '9' && m <= DS41_GRAMMAR_MAX_REPEAT) { m = m * 10 + (b->s[b->i++] - '0'); got = 1; }
        if (!got) return bfail(b, "grammar: expected a count after { at offset %zu", b->i);
        skip_space(b, 1);
        n = m;
        if (b->i < b->n && b->s[b->i] == ',') {
            b->i++;
            skip_space(b, 1);
            n = -1;
            if (b->i < b->n && b->s[b->i] >= '0' && b->s[b->i] <= '9') {
                n = 0;
                while (b->i < b->n && b->s[b->i] >= '0' && b->s[b->i] <= '9' && n <= DS41_GRAMMAR_MAX_REPEAT) n = n * 10 + (b->s[b->i++] - '0');
            }
            skip_space(b, 1);
        }
        if (b->i >= b->n || b->s[b->i] != '}') return bfail(b, "grammar: expected } at offset %zu", b->i);
        b->i++;
        if (m > DS41_GRAMMAR_MAX_REPEAT || n > DS41_GRAMMAR_MAX_REPEAT)
            return bfail(b, "grammar: a repetition count above %d", DS41_GRAMMAR_MAX_REPEAT);
        if (n >= 0 && n < m) return bfail(b, "grammar: repetition {%ld,%ld} with max < min", m, n);
    }
    gel x;
    if (item_one(b, qp, seq_rule, seq_alt, from, &x)) return -1;
    for (long k = 0; k < m; k++) if (seq_push(b, *qp, x.kind, x.arg)) return -1;
    if (n < 0) {
        int r = star_rule(b, x);
        if (r < 0) return -1;
        *qp = &b->r[seq_rule].alts[seq_alt];
        return seq_push(b, *qp, GE_REF, r);
    }
    /* n - m nested optionals: O_1 ::= x | (empty); O_k ::= x O_(k-1) | (empty) */
    int prev = -1;
    for (long k = 0; k < n - m; k++) {
        int r = rule_anon(b);
        if (r < 0) return -1;
        seqv *a = alt_new(b, r);
        if (!a || seq_push(b, a, x.kind, x.arg) || (prev >= 0 && seq_push(b, a, GE_REF, prev)) || !alt_new(b, r)) return -1;
        prev = r;
    }
    *qp = &b->r[seq_rule].alts[seq_alt];
    return prev >= 0 ? seq_push(b, *qp, GE_REF, prev) : 0;
}

static int parse_sequence(bld *b, int rule, int nested) {
    seqv *q = alt_new(b, rule);
    if (!q) return -1;
    int seq_alt = b->r[rule].nalt - 1;
    for (;;) {
        skip_space(b, nested);
        if (b->i >= b->n) return 0;
        char c = b->s[b->i];
        int from = q->n;
        if (c == '"') {
            b->i++;
            while (b->i < b->n && b->s[b->i] != '"') {
                long cp = read_char(b);
                if (cp < 0) return -1;
                unsigned char u[4];
                int k = enc_utf8((uint32_t)cp, u);
                for (int j = 0; j < k; j++) {
                    int cs = cs_byte_range(b, u[j], u[j]);
                    q = &b->r[rule].alts[seq_alt];
                    if (cs < 0 || seq_push(b, q, GE_CHARS, cs)) return -1;
                }
            }
            if (b->i >= b->n) return bfail(b, "grammar: unclosed string literal");
            b->i++;
            if (q->n == from) continue;   /* "" matches nothing: no item */
        } else if (c == '[') {
            if (parse_class(b, &q, rule, seq_alt)) return -1;
        } else if (c == '.') {
            b->i++;
            cprange all = { 0, 0x10FFFF };
            if (class_item(b, &q, rule, seq_alt, &all, 1, 0)) return -1;
        } else if (c == '(') {
            b->i++;
            int r = rule_anon(b);
            if (r < 0 || parse_alternates(b, r, 1)) return -1;
            skip_space(b, 1);
            if (b->i >= b->n || b->s[b->i] != ')') return bfail(b, "grammar: expected ) at offset %zu", b->i);
            b->i++;
            q = &b->r[rule].alts[seq_alt];
            if (seq_push(b, q, GE_REF, r)) return -1;
        } else if (is_name_char(c)) {
            size_t s0 = b->i;
            while (b->i < b->n && is_name_char(b->s[b->i])) b->i++;
            /* the next rule's "name ::=" ends this one (a newline was skipped inside parens) */
            size_t save = b->i;
            skip_space(b, 1);
            if (b->i + 2 < b->n + 0 && !strncmp(b->s + b->i, "::=", 3)) { b->i = s0; return nested ? bfail(b, "grammar: unclosed ( before rule '%.*s'", (int)(save - s0), b->s + s0) : 0; }
            b->i = save;
            int r = rule_find(b, b->s + s0, save - s0);
            q = &b->r[rule].alts[seq_alt];
            if (r < 0 || seq_push(b, q, GE_REF, r)) return -1;
        } else {
            return 0;   /* | ) newline or something the caller judges */
        }
        q = &b->r[rule].alts[seq_alt];
        if (b->i < b->n && (b->s[b->i] == '*' || b->s[b->i] == '+' || b->s[b->i] == '?' || b->s[b->i] == '{')) {
            if (parse_repeat(b, &q, rule, seq_alt, from)) return -1;
            q = &b->r[rule].alts[seq_alt];
        }
    }
}

static int parse_alternates(bld *b, int rule, int nested) {
    for (;;) {
        if (parse_sequence(b, rule, nested)) return -1;
        skip_space(b, nested);
        if (b->i < b->n && b->s[b->i] == '|') { b->i++; skip_space(b, 1); continue; }
        return 0;
    }
}

/* ------------------------------------------------------------------ checks and layout */

/* Left recursion: edge r -> s when s can come first in r (after nullable references). */
static int check_left_recursion(bld *b) {
    int nr = b->nr;
    char *nullable = calloc((size_t)nr, 1);
    char *color = calloc((size_t)nr, 1);
    int *st = malloc((size_t)(nr + 1) * 2 * sizeof *st);
    if (!nullable || !color || !st) { free(nullable); free(color); free(st); return bfail(b, "grammar: out of memory"); }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < nr; r++) {
            if (nullable[r]) continue;
            for (int a = 0; a < b->r[r].nalt && !nullable[r]; a++) {
                seqv *q = &b->r[r].alts[a];
                int k = 0;
                while (k < q->n && q->e[k].kind == GE_REF && nullable[q->e[k].arg]) k++;
                if (k == q->n) { nullable[r] = 1; changed = 1; }
            }
        }
    }
    /* iterative DFS: st holds (rule, next edge index) pairs; an edge index walks the
     * alternatives' leading elements in order */
    int rc = 0;
    for (int s0 = 0; s0 < nr && !rc; s0++) {
        if (color[s0]) continue;
        int sp = 0;
        st[0] = s0; st[1] = 0;
        color[s0] = 1;
        sp = 1;
        while (sp > 0 && !rc) {
            int r = st[2 * (sp - 1)], *pos = &st[2 * (sp - 1) + 1];
            /* the pos-th leading reference of r */
            int found = -1, count = 0;
            for (int a = 0; a < b->r[r].nalt && found < 0; a++) {
                seqv *q = &b->r[r].alts[a];
                for (int k = 0; k < q->n && found < 0; k++) {
                    if (q->e[k].kind != GE_REF) break;
                    if (count++ == *pos) found = q->e[k].arg;
                    if (!nullable[q->e[k].arg]) break;
                }
            }
            if (found < 0) { color[r] = 2; sp--; continue; }
            (*pos)++;
            if (color[found] == 1) {
                if (b->r[found].name[0] == 1)
                    rc = bfail(b, "grammar: a group or repetition is left-recursive (e.g. a repeated item that can match "
                                  "nothing, as in (a?)*)");
                else
                    rc = bfail(b, "grammar: rule '%s' is left-recursive", b->r[found].name);
            } else if (color[found] == 0) {
                color[found] = 1;
                st[2 * sp] = found; st[2 * sp + 1] = 0;
                sp++;
            }
        }
    }
    free(nullable); free(color); free(st);
    return rc;
}

static ds41_grammar *layout(bld *b, int root) {
    ds41_grammar *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    long long nel = 0, nalt = 0;
    for (int r = 0; r < b->nr; r++) {
        nalt += b->r[r].nalt;
        for (int a = 0; a < b->r[r].nalt; a++) nel += b->r[r].alts[a].n + 1;
    }
    g->el = malloc((size_t)(nel + 1) * sizeof *g->el);
    g->alts = malloc((size_t)(nalt + 1) * sizeof *g->alts);
    g->rule_alt = malloc((size_t)b->nr * sizeof *g->rule_alt);
    g->rule_nalt = malloc((size_t)b->nr * sizeof *g->rule_nalt);
    g->cs = malloc((size_t)(b->ncs + 1) * 8 * sizeof *g->cs);
    if (!g->el || !g->alts || !g->rule_alt || !g->rule_nalt || !g->cs) { ds41_grammar_free(g); return NULL; }
    if (b->ncs) memcpy(g->cs, b->cs, (size_t)b->ncs * 8 * sizeof *g->cs);
    g->n_cs = b->ncs;
    for (int r = 0; r < b->nr; r++) {
        g->rule_alt[r] = g->n_alts;
        g->rule_nalt[r] = b->r[r].nalt;
        for (int a = 0; a < b->r[r].nalt; a++) {
            g->alts[g->n_alts++] = g->n_el;
            seqv *q = &b->r[r].alts[a];
            for (int k = 0; k < q->n; k++) g->el[g->n_el++] = q->e[k];
            g->el[g->n_el++] = (gel){ GE_END, 0 };
        }
    }
    g->n_rules = b->nr;
    g->root = root;
    return g;
}

static void bld_free(bld *b) {
    for (int r = 0; r < b->nr; r++) {
        for (int a = 0; a < b->r[r].nalt; a++) free(b->r[r].alts[a].e);
        free(b->r[r].alts);
        free(b->r[r].name);
    }
    free(b->r);
    free(b->cs);
}

ds41_grammar *ds41_grammar_gbnf(const char *text, size_t len, char *err, size_t errcap) {
    char dummy[8];
    if (!err || !errcap) { err = dummy; errcap = sizeof dummy; }
    err[0] = 0;
    bld b;
    memset(&b, 0, sizeof b);
    b.s = text;
    b.n = len;
    b.err = err;
    b.errcap = errcap;
    if (len > DS41_GRAMMAR_MAX_TEXT) { bfail(&b, "grammar: %zu bytes, more than %d", len, DS41_GRAMMAR_MAX_TEXT); return NULL; }
    ds41_grammar *g = NULL;
    for (;;) {
        skip_space(&b, 1);
        if (b.i >= b.n) break;
        size_t s0 = b.i;
        while (b.i < b.n && is_name_char(b.s[b.i])) b.i++;
        if (b.i == s0) { bfail(&b, "grammar: expected a rule name at offset %zu", s0); goto out; }
        size_t s1 = b.i;
        skip_space(&b, 0);
        if (b.i + 3 > b.n || strncmp(b.s + b.i, "::=", 3)) {
            bfail(&b, "grammar: expected ::= after '%.*s' at offset %zu", (int)(s1 - s0 > 60 ? 60 : s1 - s0), b.s + s0, b.i);
            goto out;
        }
        b.i += 3;
        int r = rule_find(&b, b.s + s0, s1 - s0);
        if (r < 0) goto out;
        if (b.r[r].defined) { bfail(&b, "grammar: rule '%s' defined twice", b.r[r].name); goto out; }
        b.r[r].defined = 1;
        skip_space(&b, 1);
        if (parse_alternates(&b, r, 0)) goto out;
        skip_space(&b, 0);
        if (b.i < b.n && b.s[b.i] != '\n' && !is_name_char(b.s[b.i])) {
            bfail(&b, "grammar: unexpected '%c' at offset %zu in rule '%s'", b.s[b.i], b.i, b.r[r].name);
            goto out;
        }
    }
    int root = -1;
    for (int r = 0; r < b.nr; r++) {
        if (!b.r[r].defined) { bfail(&b, "grammar: rule '%.60s' is used but not defined", b.r[r].name); goto out; }
        if (!strcmp(b.r[r].name, "root")) root = r;
    }
    if (root < 0) { bfail(&b, "grammar: no 'root' rule"); goto out; }
    if (check_left_recursion(&b)) goto out;
    g = layout(&b, root);
    if (!g) bfail(&b, "grammar: out of memory");
out:
    bld_free(&b);
    return g;
}

void ds41_grammar_free(ds41_grammar *g) {
    if (!g) return;
    free(g->el); free(g->alts); free(g->rule_alt); free(g->rule_nalt); free(g->cs);
    free(g);
}

int ds41_grammar_n_rules(const ds41_grammar *g) { return g ? g->n_rules : 0; }

int ds41_gbnf_literal(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + 6 * n + 4 > *cap) {
        size_t nc = (*cap ? *cap * 2 : 256) + 6 * n + 4;
        char *p = realloc(*buf, nc);
        if (!p) return -1;
        *buf = p;
        *cap = nc;
    }
    char *o = *buf + *len;
    *o++ = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { *o++ = '\\'; *o++ = (char)c; }
        else if (c < 0x20 || c == 0x7f) o += sprintf(o, "\\x%02X", c);
        else *o++ = (char)c;
    }
    *o++ = '"';
    *o = 0;
    *len = (size_t)(o - *buf);
    return 0;
}
