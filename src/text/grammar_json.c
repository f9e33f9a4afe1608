/* ds41 grammar: JSON Schema -> GBNF text (grammar.h).
 *
 * Supported: type (one or a list), enum, const, properties, required, additionalProperties
 * (false or absent: only the listed properties; true / a schema: more pairs after them),
 * items, minItems, maxItems, anyOf, oneOf (branches of distinct types only, so that an output
 * cannot match two), allOf with one branch, $ref to #/$defs/.. or #/definitions/.. (recursion
 * allowed), nullable, string minLength / maxLength / pattern (grammar_regex.c) / format (date,
 * time, date-time, uuid, email, ipv4), and the annotations (title, description, default,
 * examples, ...). Anything else is refused naming the keyword and its schema path.
 *
 * The output is a subset of what the schema allows, chosen so that generation ends: listed
 * properties come in their listed order; whitespace between tokens is at most one space (a
 * model that likes blanks cannot spend its tokens on them); numbers have at most 16 integer and 16 fraction digits and a
 * two-digit exponent (finite as a double); dates
 * use days 01-28 (valid in every month). */
#include "grammar_internal.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sg {
    char *buf;            /* the rules */
    size_t len, cap;
    int nrule;
    json_t *root;
    json_t *refs;         /* "$ref" string -> rule name */
    char *err;
    size_t errcap;
    int failed, depth;
} sg;

static int sfail(sg *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sfail(sg *g, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = ds41_gerr_set(g->err, g->errcap, &g->failed, fmt, ap);
    va_end(ap);
    return rc;
}

/* A growing string for one rule's body. */
typedef struct sb { char *p; size_t n, cap; } sb;
#define SB(b, ...) (ds41_gbuf_printf(&(b)->p, &(b)->n, &(b)->cap, __VA_ARGS__) ? sfail(g, "schema: out of memory") : 0)

static const char *PRIMS =
    "ws ::= \" \"?\n"
    "json-char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "json-string ::= \"\\\"\" json-char* \"\\\"\"\n"
    "json-int ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"
    "json-number ::= json-int (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?\n"
    "json-bool ::= \"true\" | \"false\"\n"
    "json-null ::= \"null\"\n"
    "json-value ::= json-object | json-array | json-string | json-number | json-bool | json-null\n"
    "json-object ::= \"{\" ws (json-string ws \":\" ws json-value ws (\",\" ws json-string ws \":\" ws json-value ws)*)? \"}\"\n"
    "json-array ::= \"[\" ws (json-value ws (\",\" ws json-value ws)*)? \"]\"\n"
    "fmt-d2 ::= [0-9] [0-9]\n"
    "fmt-date ::= [0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8])\n"
    "fmt-time ::= ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? "
    "(\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])\n"
    "fmt-date-time ::= fmt-date \"T\" fmt-time\n"
    "fmt-hex ::= [0-9a-f]\n"
    "fmt-uuid ::= fmt-hex{8} \"-\" fmt-hex{4} \"-\" fmt-hex{4} \"-\" fmt-hex{4} \"-\" fmt-hex{12}\n"
    "fmt-email ::= [a-zA-Z0-9] [a-zA-Z0-9_+-]{0,31} \"@\" [a-z0-9]{1,32} \".\" [a-z]{2,8}\n"
    "fmt-octet ::= \"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9]? [0-9]\n"
    "fmt-ipv4 ::= fmt-octet \".\" fmt-octet \".\" fmt-octet \".\" fmt-octet\n";

static int gen(sg *g, const json_t *s, const char *path, char *name, size_t namecap);

/* A fresh rule name into name. */
static void new_name(sg *g, char *name, size_t cap) { snprintf(name, cap, "s%d", g->nrule++); }

static int add_rule(sg *g, const char *name, const sb *body) {
    if (ds41_gbuf_printf(&g->buf, &g->len, &g->cap, "%s ::= %s\n", name, body->p ? body->p : "\"\"")) return sfail(g, "schema: out of memory");
    if (g->len > DS41_GRAMMAR_MAX_TEXT) return sfail(g, "schema: the grammar grows past %d bytes (a limit)", DS41_GRAMMAR_MAX_TEXT);
    return 0;
}

/* A JSON value as a GBNF literal (its compact text). */
static int literal(sg *g, sb *b, const json_t *v) {
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t) return sfail(g, "schema: out of memory");
    int rc = ds41_gbnf_literal(&b->p, &b->n, &b->cap, t, strlen(t)) ? sfail(g, "schema: out of memory") : 0;
    free(t);
    return rc;
}

static const char *const ANNOTATIONS[] = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly",
    "writeOnly", "$defs", "definitions", "strict", "name", NULL,
};
static const char *const KNOWN[] = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
    "anyOf", "oneOf", "allOf", "$ref", "nullable", "minLength", "maxLength", "pattern", "format", NULL,
};

static int in_list(const char *k, const char *const *l) {
    for (int i = 0; l[i]; i++) if (!strcmp(k, l[i])) return 1;
    return 0;
}

/* The JSON type a branch is restricted to ("" when it is not one simple type). */
static const char *branch_type(const json_t *s) {
    const json_t *t = json_object_get(s, "type");
    if (json_is_string(t)) return json_string_value(t);
    const json_t *c = json_object_get(s, "const");
    if (c) return json_is_string(c) ? "string" : json_is_integer(c) ? "integer" : json_is_number(c) ? "number" :
                  json_is_boolean(c) ? "boolean" : json_is_null(c) ? "null" : json_is_array(c) ? "array" : "object";
    return "";
}

static int gen_string(sg *g, const json_t *s, const char *path, sb *b) {
    const json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
    const json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx))) return sfail(g, "%s: minLength and maxLength must be integers", path);
    if ((mn || mx) && (pat || fmt)) return sfail(g, "%s: minLength / maxLength together with pattern or format is not supported", path);
    if (pat && fmt) return sfail(g, "%s: pattern together with format is not supported", path);
    if (fmt) {
        static const char *const fmts[] = { "date", "time", "date-time", "uuid", "email", "ipv4", NULL };
        if (!json_is_string(fmt) || !in_list(json_string_value(fmt), fmts))
            return sfail(g, "%s.format: '%.40s' is not supported (date, time, date-time, uuid, email, ipv4)", path,
                         json_is_string(fmt) ? json_string_value(fmt) : "?");
        return SB(b, "\"\\\"\" fmt-%s \"\\\"\"", json_string_value(fmt));
    }
    if (pat) {
        if (!json_is_string(pat)) return sfail(g, "%s.pattern: expected a string", path);
        char rn[32], e2[200];
        new_name(g, rn, sizeof rn);
        if (ds41_regex_rule(json_string_value(pat), json_string_length(pat), rn, 1, &g->buf, &g->len, &g->cap, e2, sizeof e2))
            return sfail(g, "%s.pattern: %s", path, e2);
        return SB(b, "\"\\\"\" %s \"\\\"\"", rn);
    }
    long long lo = mn ? json_integer_value(mn) : 0, hi = mx ? json_integer_value(mx) : -1;
    if (lo < 0 || (mx && hi < lo)) return sfail(g, "%s: minLength / maxLength out of order", path);
    if (lo > DS41_GRAMMAR_MAX_REPEAT || hi > DS41_GRAMMAR_MAX_REPEAT)
        return sfail(g, "%s: minLength / maxLength above %d (a limit)", path, DS41_GRAMMAR_MAX_REPEAT);
    if (!mn && !mx) return SB(b, "json-string");
    if (hi < 0) return SB(b, "\"\\\"\" json-char{%lld,} \"\\\"\"", lo);
    return SB(b, "\"\\\"\" json-char{%lld,%lld} \"\\\"\"", lo, hi);
}

static int gen_array(sg *g, const json_t *s, const char *path, sb *b) {
    const json_t *it = json_object_get(s, "items"), *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
    if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx))) return sfail(g, "%s: minItems and maxItems must be integers", path);
    long long lo = mn ? json_integer_value(mn) : 0, hi = mx ? json_integer_value(mx) : -1;
    if (lo < 0 || (mx && hi < lo)) return sfail(g, "%s: minItems / maxItems out of order", path);
    if (lo > DS41_GRAMMAR_MAX_REPEAT || hi > DS41_GRAMMAR_MAX_REPEAT) return sfail(g, "%s: minItems / maxItems above %d (a limit)", path, DS41_GRAMMAR_MAX_REPEAT);
    char item[64];
    if (it && !json_is_boolean(it)) {
        char p2[256];
        snprintf(p2, sizeof p2, "%.200s.items", path);
        if (gen(g, it, p2, item, sizeof item)) return -1;
    } else {
        if (json_is_false(it) && lo > 0) return sfail(g, "%s: items false with minItems > 0 cannot be satisfied", path);
        snprintf(item, sizeof item, "%s", json_is_false(it) ? "" : "json-value");
    }
    if (!item[0] || hi == 0) return SB(b, "\"[\" ws \"]\"");
    /* [ item (, item){lo-1, hi-1} ] ; optional when lo == 0 */
    char more[64];
    long long rlo = lo > 0 ? lo - 1 : 0, rhi = hi > 0 ? hi - 1 : -1;
    if (rhi < 0) snprintf(more, sizeof more, "{%lld,}", rlo);
    else snprintf(more, sizeof more, "{%lld,%lld}", rlo, rhi);
    return SB(b, "\"[\" ws %s%s ws (\",\" ws %s ws)%s %s\"]\"", lo == 0 ? "(" : "", item, item, more, lo == 0 ? ")? " : "");
}

static int gen_object(sg *g, const json_t *s, const char *path, sb *b) {
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const json_t *ap = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return sfail(g, "%s.properties: expected an object", path);
    if (req && !json_is_array(req)) return sfail(g, "%s.required: expected an array", path);
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        const json_t *r = json_array_get(req, i);
        if (!json_is_string(r)) return sfail(g, "%s.required[%zu]: expected a string", path, i);
        if (!json_object_get(props, json_string_value(r)))
            return sfail(g, "%s.required: '%.60s' is not among the properties (not supported)", path, json_string_value(r));
    }
    /* the extra pairs' value: none, any JSON value, or a schema */
    char extra[64] = "";
    if (ap && json_is_object(ap)) {
        char p2[256];
        snprintf(p2, sizeof p2, "%.200s.additionalProperties", path);
        if (gen(g, ap, p2, extra, sizeof extra)) return -1;
    } else if (json_is_true(ap) || (!props && !ap)) {
        snprintf(extra, sizeof extra, "json-value");
    } else if (ap && !json_is_boolean(ap)) {
        return sfail(g, "%s.additionalProperties: expected a boolean or a schema", path);
    }
    size_t n = props ? json_object_size(props) : 0;
    char (*kv)[64] = calloc(n + 1, sizeof *kv);
    int *opt = calloc(n + 1, sizeof *opt);
    if (!kv || !opt) { free(kv); free(opt); return sfail(g, "schema: out of memory"); }
    const char *key;
    const json_t *val;
    size_t i = 0;
    int rc = 0;
    json_object_foreach((json_t *)props, key, val) {
        char p2[256];
        snprintf(p2, sizeof p2, "%.120s.properties.%.100s", path, key);
        char vr[64];
        if (gen(g, val, p2, vr, sizeof vr)) { rc = -1; break; }
        sb kb = { 0 };
        json_t *ks = json_string(key);
        rc = !ks || literal(g, &kb, ks) || SB(&kb, " ws \":\" ws %s", vr);
        json_decref(ks);
        if (!rc) { new_name(g, kv[i], sizeof kv[i]); rc = add_rule(g, kv[i], &kb); }
        free(kb.p);
        if (rc) { rc = -1; break; }
        opt[i] = 1;
        for (size_t r = 0; req && r < json_array_size(req); r++)
            if (!strcmp(json_string_value(json_array_get(req, r)), key)) opt[i] = 0;
        i++;
    }
    /* F_i: properties i.. with none written yet; R_i: at least one written (each needs a
     * comma first); the tail F_n / R_n holds the extra pairs */
    char (*F)[64] = calloc(n + 1, sizeof *F), (*R)[64] = calloc(n + 1, sizeof *R);
    if (!F || !R) rc = sfail(g, "schema: out of memory");
    for (size_t k = 0; k <= n && !rc; k++) { new_name(g, F[k], sizeof F[k]); new_name(g, R[k], sizeof R[k]); }
    if (!rc) {
        sb fb = { 0 }, rb = { 0 };
        if (extra[0]) {
            rc = SB(&fb, "(json-string ws \":\" ws %s ws (\",\" ws json-string ws \":\" ws %s ws)*)?", extra, extra) ||
                 SB(&rb, "(\",\" ws json-string ws \":\" ws %s ws)*", extra);
        }
        if (!rc) rc = add_rule(g, F[n], &fb) || add_rule(g, R[n], &rb);
        free(fb.p); free(rb.p);
    }
    for (size_t k = n; k-- > 0 && !rc;) {
        sb fb = { 0 }, rb = { 0 };
        rc = SB(&fb, "%s ws %s", kv[k], R[k + 1]) || (opt[k] && SB(&fb, " | %s", F[k + 1])) ||
             SB(&rb, "\",\" ws %s ws %s", kv[k], R[k + 1]) || (opt[k] && SB(&rb, " | %s", R[k + 1]));
        if (!rc) rc = add_rule(g, F[k], &fb) || add_rule(g, R[k], &rb);
        free(fb.p); free(rb.p);
    }
    if (!rc) rc = SB(b, "\"{\" ws %s \"}\"", F[0]);
    free(kv); free(opt); free(F); free(R);
    return rc ? -1 : 0;
}

static int gen_type(sg *g, const json_t *s, const char *t, const char *path, sb *b) {
    if (!strcmp(t, "string")) return gen_string(g, s, path, b);
    if (!strcmp(t, "integer")) return SB(b, "json-int");
    if (!strcmp(t, "number")) return SB(b, "json-number");
    if (!strcmp(t, "boolean")) return SB(b, "json-bool");
    if (!strcmp(t, "null")) return SB(b, "json-null");
    if (!strcmp(t, "array")) return gen_array(g, s, path, b);
    if (!strcmp(t, "object")) return gen_object(g, s, path, b);
    return sfail(g, "%s.type: unknown type '%.40s'", path, t);
}

/* A $ref: its rule (generated on first use, so recursive schemas work). */
static int gen_ref(sg *g, const json_t *ref, const char *path, char *name, size_t cap) {
    if (!json_is_string(ref)) return sfail(g, "%s.$ref: expected a string", path);
    const char *r = json_string_value(ref);
    const json_t *have = json_object_get(g->refs, r);
    if (have) { snprintf(name, cap, "%s", json_string_value(have)); return 0; }
    const char *key = NULL;
    const json_t *defs = NULL;
    if (!strncmp(r, "#/$defs/", 8)) { key = r + 8; defs = json_object_get(g->root, "$defs"); }
    else if (!strncmp(r, "#/definitions/", 14)) { key = r + 14; defs = json_object_get(g->root, "definitions"); }
    else if (!strcmp(r, "#")) { key = ""; defs = NULL; }
    else return sfail(g, "%s.$ref: '%.80s' is not supported (only #, #/$defs/NAME, #/definitions/NAME)", path, r);
    const json_t *target = key[0] ? json_object_get(defs, key) : g->root;
    if (!target) return sfail(g, "%s.$ref: '%.80s' does not exist", path, r);
    char rn[64];
    new_name(g, rn, sizeof rn);
    json_object_set_new(g->refs, r, json_string(rn));
    snprintf(name, cap, "%s", rn);
    char inner[64];
    if (gen(g, target, r, inner, sizeof inner)) return -1;
    sb b = { 0 };
    int rc = SB(&b, "%s", inner) || add_rule(g, rn, &b);
    free(b.p);
    return rc;
}

/* Generates the rule for schema s; its name into name. */
static int gen(sg *g, const json_t *s, const char *path, char *name, size_t namecap) {
    if (g->failed) return -1;
    if (++g->depth > DS41_SCHEMA_MAX_DEPTH) return sfail(g, "%s: nested deeper than %d (a limit)", path, DS41_SCHEMA_MAX_DEPTH);
    int rc = -1;
    sb b = { 0 };
    if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) {
        snprintf(name, namecap, "json-value");
        g->depth--;
        return 0;
    }
    if (json_is_false(s)) { sfail(g, "%s: the schema false cannot be satisfied", path); goto out; }
    if (!json_is_object(s)) { sfail(g, "%s: expected a schema object", path); goto out; }
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v)
        if (!in_list(k, KNOWN) && !in_list(k, ANNOTATIONS)) { sfail(g, "%s.%.60s: not supported", path, k); goto out; }
    const json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (json_object_size(s) > 1) {
            json_object_foreach((json_t *)s, k, v)
                if (strcmp(k, "$ref") && !in_list(k, ANNOTATIONS)) { sfail(g, "%s: $ref next to '%.40s' is not supported", path, k); goto out; }
        }
        char rn[64];
        if (gen_ref(g, ref, path, rn, sizeof rn)) goto out;
        snprintf(name, namecap, "%s", rn);
        rc = 0;
        goto out;
    }
    const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    const json_t *any = json_object_get(s, "anyOf"), *one = json_object_get(s, "oneOf"), *all = json_object_get(s, "allOf");
    const json_t *ty = json_object_get(s, "type");
    int nullable = json_is_true(json_object_get(s, "nullable"));
    if (cn) {
        if (literal(g, &b, cn)) goto out;
    } else if (en) {
        if (!json_is_array(en) || json_array_size(en) == 0) { sfail(g, "%s.enum: expected a non-empty array", path); goto out; }
        for (size_t i = 0; i < json_array_size(en); i++)
            if ((i && SB(&b, " | ")) || literal(g, &b, json_array_get(en, i))) goto out;
    } else if (any || one) {
        const json_t *l = any ? any : one;
        const char *kw = any ? "anyOf" : "oneOf";
        if (any && one) { sfail(g, "%s: anyOf together with oneOf is not supported", path); goto out; }
        if (ty) { sfail(g, "%s: %s next to type is not supported", path, kw); goto out; }
        if (!json_is_array(l) || json_array_size(l) == 0) { sfail(g, "%s.%s: expected a non-empty array", path, kw); goto out; }
        for (size_t i = 0; i < json_array_size(l); i++) {
            if (one) {
                /* an output matching two branches would break oneOf: distinct simple types only */
                const char *ti = branch_type(json_array_get(l, i));
                for (size_t j = 0; j < i; j++) {
                    const char *tj = branch_type(json_array_get(l, j));
                    int clash = !ti[0] || !tj[0] || !strcmp(ti, tj) || (!strcmp(ti, "number") && !strcmp(tj, "integer")) ||
                                (!strcmp(ti, "integer") && !strcmp(tj, "number"));
                    if (clash) { sfail(g, "%s.oneOf: branches %zu and %zu may overlap (only branches of distinct types are supported)", path, j, i); goto out; }
                }
            }
            char p2[256], br[64];
            snprintf(p2, sizeof p2, "%.200s.%s[%zu]", path, kw, i);
            if (gen(g, json_array_get(l, i), p2, br, sizeof br)) goto out;
            if ((i && SB(&b, " | ")) || SB(&b, "%s", br)) goto out;
        }
    } else if (all) {
        if (!json_is_array(all) || json_array_size(all) != 1) { sfail(g, "%s.allOf: only one branch is supported", path); goto out; }
        char p2[256], br[64];
        snprintf(p2, sizeof p2, "%.200s.allOf[0]", path);
        if (gen(g, json_array_get(all, 0), p2, br, sizeof br) || SB(&b, "%s", br)) goto out;
    } else if (json_is_string(ty)) {
        if (gen_type(g, s, json_string_value(ty), path, &b)) goto out;
    } else if (json_is_array(ty)) {
        if (json_array_size(ty) == 0) { sfail(g, "%s.type: an empty list", path); goto out; }
        for (size_t i = 0; i < json_array_size(ty); i++) {
            const json_t *t = json_array_get(ty, i);
            if (!json_is_string(t)) { sfail(g, "%s.type[%zu]: expected a string", path, i); goto out; }
            if (i && SB(&b, " | ")) goto out;
            sb one_b = { 0 };
            int r2 = gen_type(g, s, json_string_value(t), path, &one_b) || SB(&b, "(%s)", one_b.p);
            free(one_b.p);
            if (r2) goto out;
        }
    } else if (ty) {
        sfail(g, "%s.type: expected a string or an array of strings", path);
        goto out;
    } else if (json_object_get(s, "properties") || json_object_get(s, "additionalProperties") || json_object_get(s, "required")) {
        if (gen_object(g, s, path, &b)) goto out;
    } else if (json_object_get(s, "items")) {
        if (gen_array(g, s, path, &b)) goto out;
    } else {
        if (SB(&b, "json-value")) goto out;
    }
    if (nullable && SB(&b, " | json-null")) goto out;
    new_name(g, name, namecap);
    rc = add_rule(g, name, &b);
out:
    free(b.p);
    g->depth--;
    return rc ? -1 : 0;
}

char *ds41_schema_to_gbnf(const char *schema, size_t len, char *err, size_t errcap) {
    sg g;
    memset(&g, 0, sizeof g);
    g.err = err;
    g.errcap = errcap;
    if (ds41_gbuf_printf(&g.buf, &g.len, &g.cap, "%s", PRIMS)) { snprintf(err, errcap, "schema: out of memory"); return NULL; }
    if (!schema) {
        if (ds41_gbuf_printf(&g.buf, &g.len, &g.cap, "root ::= json-object\n")) { free(g.buf); snprintf(err, errcap, "schema: out of memory"); return NULL; }
        return g.buf;
    }
    json_error_t je;
    g.root = json_loadb(schema, len, JSON_DECODE_ANY, &je);
    if (!g.root) {
        free(g.buf);
        sfail(&g, "schema: invalid JSON: %s", je.text);   /* sfail keeps the message one line */
        return NULL;
    }
    g.refs = json_object();
    char top[64];
    int rc = g.refs ? gen(&g, g.root, "schema", top, sizeof top) : sfail(&g, "schema: out of memory");
    if (!rc && ds41_gbuf_printf(&g.buf, &g.len, &g.cap, "root ::= ws %s ws\n", top)) rc = sfail(&g, "schema: out of memory");
    json_decref(g.root);
    json_decref(g.refs);
    if (rc) { free(g.buf); return NULL; }
    return g.buf;
}

/* ------------------------------------------------------------------ forced tool calls */

#define DSML "\xef\xbd\x9c" "DSML" "\xef\xbd\x9c"

/* A string parameter's raw value (string="true": the text as is, up to the closing tag). */
static int raw_string(sg *g, const json_t *ps, const char *path, sb *b) {
    const json_t *en = json_object_get(ps, "enum"), *fmt = json_object_get(ps, "format"), *pat = json_object_get(ps, "pattern");
    const json_t *mn = json_object_get(ps, "minLength"), *mx = json_object_get(ps, "maxLength");
    if (en) {
        for (size_t i = 0; i < json_array_size(en); i++) {
            const json_t *v = json_array_get(en, i);
            if (!json_is_string(v)) return sfail(g, "%s.enum: a string parameter's values must be strings", path);
            if ((i && SB(b, " | ")) || ds41_gbnf_literal(&b->p, &b->n, &b->cap, json_string_value(v), json_string_length(v)))
                return sfail(g, "schema: out of memory");
        }
        return 0;
    }
    if (fmt) {
        sb tmp = { 0 };
        int rc = gen_string(g, ps, path, &tmp);   /* validates the format name */
        free(tmp.p);
        return rc ? -1 : SB(b, "fmt-%s", json_string_value(fmt));
    }
    if (pat) {
        char rn[32], e2[200];
        if (!json_is_string(pat)) return sfail(g, "%s.pattern: expected a string", path);
        new_name(g, rn, sizeof rn);
        if (ds41_regex_rule(json_string_value(pat), json_string_length(pat), rn, 0, &g->buf, &g->len, &g->cap, e2, sizeof e2))
            return sfail(g, "%s.pattern: %s", path, e2);
        return SB(b, "%s", rn);
    }
    long long lo = json_is_integer(mn) ? json_integer_value(mn) : 0, hi = json_is_integer(mx) ? json_integer_value(mx) : -1;
    if (lo < 0 || lo > DS41_GRAMMAR_MAX_REPEAT || hi > DS41_GRAMMAR_MAX_REPEAT || (hi >= 0 && hi < lo))
        return sfail(g, "%s: minLength / maxLength out of range", path);
    /* '<' could begin the closing tag: left out of raw values */
    return hi >= 0 ? SB(b, "[^<]{%lld,%lld}", lo, hi) : SB(b, "[^<]{%lld,}", lo);
}

/* One invoke of tool fn (its "function" object): the rule name into name. */
static int gen_invoke(sg *g, const json_t *fn, const char *path, char *name, size_t cap) {
    const char *fname = json_string_value(json_object_get(fn, "name"));
    const json_t *params = json_object_get(fn, "parameters");
    g->root = (json_t *)params;
    json_object_clear(g->refs);
    const json_t *props = json_object_get(params, "properties"), *req = json_object_get(params, "required");
    if (params && !json_is_object(params)) return sfail(g, "%s.parameters: expected a schema object", path);
    if (params && json_object_get(params, "type") && (!json_is_string(json_object_get(params, "type")) ||
                                                      strcmp(json_string_value(json_object_get(params, "type")), "object")))
        return sfail(g, "%s.parameters.type: expected \"object\"", path);
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)params, k, v)
        if (strcmp(k, "type") && strcmp(k, "properties") && strcmp(k, "required") && strcmp(k, "additionalProperties") &&
            !in_list(k, ANNOTATIONS))
            return sfail(g, "%s.parameters.%.40s: not supported for a forced call", path, k);
    size_t n = json_object_size(props);
    char (*pr)[64] = calloc(n + 1, sizeof *pr), (*F)[64] = calloc(n + 1, sizeof *F), (*R)[64] = calloc(n + 1, sizeof *R);
    int *opt = calloc(n + 1, sizeof *opt);
    int rc = !pr || !F || !R || !opt ? sfail(g, "schema: out of memory") : 0;
    size_t i = 0;
    json_object_foreach((json_t *)props, k, v) {
        if (rc) break;
        char p2[256];
        snprintf(p2, sizeof p2, "%.120s.parameters.properties.%.100s", path, k);
        const json_t *ty = json_object_get(v, "type");
        int is_str = json_is_string(ty) && !strcmp(json_string_value(ty), "string");
        sb b = { 0 };
        json_t *ks = json_string(k);
        rc = !ks || SB(&b, "\"<" DSML " parameter name=\\\"\" ") ||
             ds41_gbnf_literal(&b.p, &b.n, &b.cap, k, strlen(k)) ||
             SB(&b, " \"\\\" string=\\\"%s\\\">\" ", is_str ? "true" : "false");
        json_decref(ks);
        if (!rc) rc = SB(&b, "(");
        if (!rc) {
            if (is_str) rc = raw_string(g, v, p2, &b);
            else {
                char vr[64];
                rc = gen(g, v, p2, vr, sizeof vr) || SB(&b, "%s", vr);
            }
        }
        if (!rc) rc = SB(&b, ") \"</" DSML " parameter>\"");
        if (!rc) { new_name(g, pr[i], sizeof pr[i]); rc = add_rule(g, pr[i], &b); }
        free(b.p);
        opt[i] = 1;
        for (size_t r = 0; req && r < json_array_size(req); r++)
            if (json_is_string(json_array_get(req, r)) && !strcmp(json_string_value(json_array_get(req, r)), k)) opt[i] = 0;
        i++;
    }
    /* F_i: parameters i.. with none written yet; R_i: after one (a newline first) */
    for (size_t q = 0; q <= n && !rc; q++) { new_name(g, F[q], sizeof F[q]); new_name(g, R[q], sizeof R[q]); }
    if (!rc) {
        sb e1 = { 0 };
        rc = add_rule(g, F[n], &e1) || add_rule(g, R[n], &e1);
    }
    for (size_t q = n; q-- > 0 && !rc;) {
        sb fb = { 0 }, rb = { 0 };
        rc = SB(&fb, "%s %s", pr[q], R[q + 1]) || (opt[q] && SB(&fb, " | %s", F[q + 1])) ||
             SB(&rb, "\"\\n\" %s %s", pr[q], R[q + 1]) || (opt[q] && SB(&rb, " | %s", R[q + 1]));
        if (!rc) rc = add_rule(g, F[q], &fb) || add_rule(g, R[q], &rb);
        free(fb.p); free(rb.p);
    }
    if (!rc) {
        sb b = { 0 };
        new_name(g, name, cap);
        rc = SB(&b, "\"<" DSML " invoke name=\\\"\" ") || ds41_gbnf_literal(&b.p, &b.n, &b.cap, fname, strlen(fname)) ||
             SB(&b, " \"\\\">\\n\" %s \"\\n</" DSML " invoke>\"", F[0]) || add_rule(g, name, &b);
        free(b.p);
    }
    free(pr); free(F); free(R); free(opt);
    g->root = NULL;
    return rc ? -1 : 0;
}

char *ds41_tools_to_gbnf(const char *tools, size_t len, const char *only, int parallel, char *err, size_t errcap) {
    sg gs, *g = &gs;
    memset(g, 0, sizeof *g);
    g->err = err;
    g->errcap = errcap;
    json_error_t je;
    json_t *arr = json_loadb(tools, len, 0, &je);
    g->refs = json_object();
    int rc = !arr || !json_is_array(arr) ? sfail(g, "tools: expected an array") : 0;
    if (!rc && (!g->refs || ds41_gbuf_printf(&g->buf, &g->len, &g->cap, "%s", PRIMS))) rc = sfail(g, "schema: out of memory");
    sb alts = { 0 };
    int nalt = 0;
    for (size_t i = 0; !rc && i < json_array_size(arr); i++) {
        const json_t *fn = json_object_get(json_array_get(arr, i), "function");
        const char *nm = json_string_value(json_object_get(fn, "name"));
        if (!nm || (only && strcmp(nm, only))) continue;
        char path[64], inv[64];
        snprintf(path, sizeof path, "tools[%zu].function", i);
        rc = gen_invoke(g, fn, path, inv, sizeof inv) || (nalt && SB(&alts, " | ")) || SB(&alts, "%s", inv);
        nalt++;
    }
    if (!rc && !nalt) rc = sfail(g, "tools: no function to call");
    if (!rc)
        rc = ds41_gbuf_printf(&g->buf, &g->len, &g->cap,
                              "tool-invoke ::= %s\nroot ::= \"\\n\\n<" DSML " calls>\\n\" tool-invoke %s\"\\n</" DSML " calls>\"\n",
                              alts.p, parallel ? "(\"\\n\" tool-invoke)* " : "")
                 ? sfail(g, "schema: out of memory") : 0;
    free(alts.p);
    json_decref(arr);
    json_decref(g->refs);
    if (rc) { free(g->buf); return NULL; }
    return g->buf;
}
