/* ds41 grammar: regular expressions and choice lists -> GBNF text (grammar.h).
 *
 * The regex subset (what guided_regex and JSON Schema "pattern" users write): literals,
 * escapes (\n \t \r \f \v \xHH \uHHHH and escaped metacharacters), `.` (any character but a
 * newline), classes [..] / [^..] with ranges and \d \w \s inside, \d \w \s \D \W \S, groups
 * ( ) (?: ) (?P<name> ) (?<name> ), alternation, the quantifiers * + ? {m} {m,} {m,n}, and ^ / $
 * at the very start / end (the whole output matches anyway). Refused with a message naming
 * them: lazy and possessive quantifiers, backreferences, lookaround, word boundaries, anchors
 * elsewhere, flags. Output: the same structure in GBNF, which has the same operators. */
#include "grammar_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ds41_gbuf_printf(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0) return -1;
    if (*len + (size_t)k + 1 > *cap) {
        size_t nc = (*cap ? *cap * 2 : 256) + (size_t)k + 1;
        char *p = realloc(*buf, nc);
        if (!p) return -1;
        *buf = p;
        *cap = nc;
    }
    va_start(ap, fmt);
    vsnprintf(*buf + *len, (size_t)k + 1, fmt, ap);
    va_end(ap);
    *len += (size_t)k;
    return 0;
}

typedef struct rx {
    const char *s;
    size_t n, i;
    int json_safe;
    char **buf;
    size_t *len, *cap;
    char *err;
    size_t errcap;
    int failed, depth;
} rx;

static int rfail(rx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int rfail(rx *x, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = ds41_gerr_set(x->err, x->errcap, &x->failed, fmt, ap);
    va_end(ap);
    return rc;
}

#define OUT(...) (ds41_gbuf_printf(x->buf, x->len, x->cap, __VA_ARGS__) ? rfail(x, "regex: out of memory") : 0)

/* A code point as a GBNF class member (escaped where the class syntax needs it). */
static int class_cp(rx *x, unsigned long cp) {
    if (x->json_safe && (cp == '"' || cp == '\\' || cp < 0x20))
        return rfail(x, "regex: the character U+%04lX cannot appear unescaped in a JSON string", cp);
    if (cp < 0x20 || cp == 0x7f || cp == '\\' || cp == ']' || cp == '[' || cp == '-' || cp == '^' || cp == '"')
        return OUT("\\x%02lX", cp);
    if (cp < 0x80) return OUT("%c", (int)cp);
    return OUT("\\U%08lX", cp);
}

static int hexv(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* One code point from s[i] (UTF-8). */
static unsigned long rx_cp(rx *x) {
    const unsigned char *u = (const unsigned char *)x->s;
    unsigned c = u[x->i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (x->i + (size_t)len > x->n) len = 1;
    unsigned long cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    int bad = c >= 0x80 && len == 1;
    for (int k = 1; k < len; k++) {
        bad |= (u[x->i + k] & 0xC0) != 0x80;
        cp = cp << 6 | (u[x->i + k] & 0x3F);
    }
    x->i += (size_t)len;
    if (bad || cp > 0x10FFFF) return (unsigned long)rfail(x, "regex: invalid UTF-8");
    return cp;
}

/* Escape after '\' (x->i at the letter): a class shorthand (writes its ranges, returns -2)
 * or one code point. in_class: inside [..] (no brackets written for shorthands). */
static long rx_escape(rx *x, int in_class) {
    if (x->i >= x->n) return rfail(x, "regex: a trailing backslash");
    char c = x->s[x->i++];
    const char *sh = NULL;
    int neg = 0;
    switch (c) {
    case 'd': sh = "0-9"; break;
    case 'w': sh = "a-zA-Z0-9_"; break;
    case 's': sh = " \\t\\n\\r\\x0B\\x0C"; break;
    case 'D': sh = "0-9"; neg = 1; break;
    case 'W': sh = "a-zA-Z0-9_"; neg = 1; break;
    case 'S': sh = " \\t\\n\\r\\x0B\\x0C"; neg = 1; break;
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case 'x': case 'u': {
        int nd = c == 'x' ? 2 : 4;
        long v = 0;
        for (int k = 0; k < nd; k++) {
            int h = x->i < x->n ? hexv(x->s[x->i]) : -1;
            if (h < 0) return rfail(x, "regex: bad \\%c escape", c);
            v = v * 16 + h;
            x->i++;
        }
        return v;
    }
    case 'b': case 'B': return rfail(x, "regex: word boundaries (\\%c) are not supported", c);
    default:
        if (c >= '1' && c <= '9') return rfail(x, "regex: backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
            return rfail(x, "regex: unknown escape \\%c", c);
        return (unsigned char)c;
    }
    if (neg && in_class) return rfail(x, "regex: \\%c inside a class is not supported", c);
    if (neg && x->json_safe) return rfail(x, "regex: \\%c inside a JSON string pattern is not supported", c);
    if (x->json_safe && (c == 's')) sh = " ";   /* tabs and newlines would need JSON escapes */
    if (OUT(in_class ? "%s" : neg ? "[^%s]" : "[%s]", sh)) return -1;
    return -2;
}

static int rx_class(rx *x) {
    x->i++;   /* [ */
    int neg = x->i < x->n && x->s[x->i] == '^';
    if (neg) {
        if (x->json_safe) return rfail(x, "regex: negated classes inside a JSON string pattern are not supported");
        x->i++;
    }
    if (OUT(neg ? "[^" : "[")) return -1;
    int first = 1;
    while (x->i < x->n && (x->s[x->i] != ']' || first)) {
        first = 0;
        long lo;
        if (x->s[x->i] == '\\') { x->i++; lo = rx_escape(x, 1); }
        else if (x->s[x->i] == '[' && x->i + 1 < x->n && x->s[x->i + 1] == ':') return rfail(x, "regex: POSIX classes [:..:] are not supported");
        else lo = (long)rx_cp(x);
        if (lo == -1 || x->failed) return -1;
        if (lo == -2) continue;
        if (class_cp(x, (unsigned long)lo)) return -1;
        if (x->i + 1 < x->n && x->s[x->i] == '-' && x->s[x->i + 1] != ']') {
            x->i++;
            long hi;
            if (x->s[x->i] == '\\') { x->i++; hi = rx_escape(x, 1); }
            else hi = (long)rx_cp(x);
            if (x->failed) return -1;
            if (hi < 0) return hi == -2 ? rfail(x, "regex: a range ending in a class shorthand") : -1;
            if (hi < lo) return rfail(x, "regex: class range out of order");
            if (OUT("-") || class_cp(x, (unsigned long)hi)) return -1;
        }
    }
    if (x->i >= x->n) return rfail(x, "regex: unclosed [");
    x->i++;
    return OUT("]");
}

static int rx_alt(rx *x);

static int rx_quant(rx *x) {
    if (x->i >= x->n) return 0;
    char c = x->s[x->i];
    if (c == '*' || c == '+' || c == '?') {
        x->i++;
        if (OUT("%c", c)) return -1;
    } else if (c == '{') {
        size_t j = x->i + 1;
        while (j < x->n && ((x->s[j] >= '0' && x->s[j] <= '9') || x->s[j] == ',')) j++;
        if (j >= x->n || x->s[j] != '}' || j == x->i + 1) return rfail(x, "regex: bad {m,n} quantifier");
        /* {m}, {m,}, {m,n} with m <= n (the compiler's limits on the counts apply after) */
        long m = -1, n = -1, *cur = &m;
        for (size_t k = x->i + 1; k < j; k++) {
            if (x->s[k] == ',') {
                if (cur == &n) return rfail(x, "regex: bad {m,n} quantifier");
                cur = &n;
                continue;
            }
            if (*cur < 0) *cur = 0;
            if (*cur < 100000) *cur = *cur * 10 + (x->s[k] - '0');
        }
        if (m < 0 || (n >= 0 && n < m)) return rfail(x, "regex: bad {m,n} quantifier (needs m <= n)");
        if (m > DS41_GRAMMAR_MAX_REPEAT || n > DS41_GRAMMAR_MAX_REPEAT)
            return rfail(x, "regex: a repetition count above %d (a limit)", DS41_GRAMMAR_MAX_REPEAT);
        int comma = memchr(x->s + x->i, ',', j - x->i) != NULL;
        if (comma ? (n >= 0 ? OUT("{%ld,%ld}", m, n) : OUT("{%ld,}", m)) : OUT("{%ld}", m)) return -1;
        x->i = j + 1;

    } else {
        return 0;
    }
    if (x->i < x->n && (x->s[x->i] == '?' || x->s[x->i] == '+'))
        return rfail(x, "regex: lazy and possessive quantifiers are not supported");
    if (x->i < x->n && (x->s[x->i] == '*' || x->s[x->i] == '{'))
        return rfail(x, "regex: a quantifier after a quantifier");
    return 0;
}

static int rx_seq(rx *x) {
    while (x->i < x->n && !x->failed) {
        char c = x->s[x->i];
        if (c == '|' || c == ')') return 0;
        if (c == '^' && x->i == 0) { x->i++; continue; }
        if (c == '$' && x->i + 1 == x->n) { x->i++; continue; }
        if (c == '^' || c == '$') return rfail(x, "regex: anchors inside the pattern are not supported");
        if (c == '*' || c == '+' || c == '?' || c == '{') return rfail(x, "regex: a quantifier with nothing to repeat");
        if (c == '(') {
            x->i++;
            if (x->i < x->n && x->s[x->i] == '?') {
                if (x->i + 1 < x->n && x->s[x->i + 1] == ':') x->i += 2;
                else if (x->i + 2 < x->n && (x->s[x->i + 1] == 'P' || x->s[x->i + 1] == '<') &&
                         x->s[x->i + 1 + (x->s[x->i + 1] == 'P')] == '<' && x->s[x->i + 2] != '=' && x->s[x->i + 2] != '!') {
                    const char *gt = memchr(x->s + x->i, '>', x->n - x->i);
                    if (!gt) return rfail(x, "regex: unclosed group name");
                    x->i = (size_t)(gt - x->s) + 1;
                } else {
                    return rfail(x, "regex: lookaround and inline flags are not supported");
                }
            }
            if (++x->depth > 64) return rfail(x, "regex: groups nested deeper than 64");
            if (OUT("(") || rx_alt(x)) return -1;
            x->depth--;
            if (x->i >= x->n || x->s[x->i] != ')') return rfail(x, "regex: unclosed (");
            x->i++;
            if (OUT(")")) return -1;
        } else if (c == '[') {
            if (rx_class(x)) return -1;
        } else if (c == '.') {
            x->i++;
            if (x->json_safe) return rfail(x, "regex: '.' inside a JSON string pattern is not supported");
            if (OUT("[^\\n]")) return -1;
        } else {
            long cp;
            if (c == '\\') { x->i++; cp = rx_escape(x, 0); }
            else cp = (long)rx_cp(x);
            if (cp == -1 || x->failed) return -1;
            if (cp >= 0) {
                if (x->json_safe && (cp == '"' || cp == '\\' || cp < 0x20))
                    return rfail(x, "regex: the character U+%04lX cannot appear unescaped in a JSON string", cp);
                if (OUT("[") || class_cp(x, (unsigned long)cp) || OUT("]")) return -1;
            }
        }
        if (rx_quant(x)) return -1;
        if (OUT(" ")) return -1;
    }
    return x->failed ? -1 : 0;
}

static int rx_alt(rx *x) {
    for (;;) {
        if (rx_seq(x)) return -1;
        if (x->i < x->n && x->s[x->i] == '|') {
            x->i++;
            if (OUT("| ")) return -1;
            continue;
        }
        return 0;
    }
}

int ds41_regex_rule(const char *re, size_t n, const char *name, int json_safe, char **buf, size_t *len, size_t *cap,
                    char *err, size_t errcap) {
    rx xs = { re, n, 0, json_safe, buf, len, cap, err, errcap, 0, 0 }, *x = &xs;
    if (n > 65536) return rfail(x, "regex: longer than 65536 bytes");
    if (OUT("%s ::= (", name) || rx_alt(x)) return -1;
    if (x->i < x->n) return rfail(x, "regex: unbalanced ) at offset %zu", x->i);
    return OUT(")\n");
}

char *ds41_regex_to_gbnf(const char *re, size_t len, char *err, size_t errcap) {
    char *buf = NULL;
    size_t l = 0, cap = 0;
    if (ds41_regex_rule(re, len, "root", 0, &buf, &l, &cap, err, errcap)) { free(buf); return NULL; }
    return buf;
}

char *ds41_choice_to_gbnf(const char *const *choices, const size_t *lens, int n, char *err, size_t errcap) {
    if (n < 1) { snprintf(err, errcap, "choice: an empty list"); return NULL; }
    char *buf = NULL;
    size_t l = 0, cap = 0;
    if (ds41_gbuf_printf(&buf, &l, &cap, "root ::= ")) goto oom;
    for (int i = 0; i < n; i++) {
        if (i && ds41_gbuf_printf(&buf, &l, &cap, " | ")) goto oom;
        if (lens[i] == 0) {
            snprintf(err, errcap, "choice[%d]: an empty string", i);
            free(buf);
            return NULL;
        }
        if (ds41_gbnf_literal(&buf, &l, &cap, choices[i], lens[i])) goto oom;
    }
    if (ds41_gbuf_printf(&buf, &l, &cap, "\n")) goto oom;
    return buf;
oom:
    free(buf);
    snprintf(err, errcap, "choice: out of memory");
    return NULL;
}
