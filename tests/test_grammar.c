/* Grammar engine (src/text/grammar*.c): GBNF, regex, choice and JSON Schema front ends; the
 * mask equals "advance succeeds" for every token; random walks over the mask produce outputs
 * the source accepts (a regex: PCRE2 full match; a schema: jansson parses it and the checks
 * below hold); errors and limits name what was wrong. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "check.h"
#include "grammar.h"
#include "grammar_internal.h"

#include <jansson.h>
#include <math.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

/* A vocabulary: the 256 bytes, some JSON-ish pieces and a few multi-byte characters. */
static const char *extra[] = { "true", "false", "null", "{\"", "\":", "\",\"", "\"}", "12", "3.5", "e+", "  ", "\n  ",
                               "ab", "abc", "-", "[1", ",2]", "\xc3\xa9", "\xe2\x82\xac", "x\"", "\\n", "\\u00", "09:", "20" };
#define NX (int)(sizeof extra / sizeof extra[0])
static int V;
static ds41_gvocab *voc;
static char tokb[256 + NX][8];
static const char *tokp[256 + NX];
static size_t tokl[256 + NX];

static void make_vocab(void) {
    V = 256 + NX + 2;   /* two ids with no bytes (special tokens) */
    const char **p = calloc((size_t)V, sizeof *p);
    size_t *l = calloc((size_t)V, sizeof *l);
    for (int i = 0; i < 256; i++) { tokb[i][0] = (char)i; p[i] = tokb[i]; l[i] = 1; }
    for (int i = 0; i < NX; i++) { p[256 + i] = extra[i]; l[256 + i] = strlen(extra[i]); }
    for (int i = 0; i < 256 + NX; i++) { tokp[i] = p[i]; tokl[i] = l[i]; }
    voc = ds41_gvocab_new(V, p, l);
    free(p);
    free(l);
}

static unsigned rng = 12345;
static unsigned rnd(void) { rng = rng * 1103515245u + 12345u; return rng >> 8; }

/* A random walk: returns the output (malloc'd) or NULL when it did not end within 400 tokens.
 * Checks the mask against advance for every token at every step. */
static char *walk(ds41_gmatch *m, int *mask_ok) {
    int s = ds41_gmatch_start(m);
    char *out = calloc(4096, 1);
    size_t n = 0;
    for (int step = 0; step < 400 && s >= 0; step++) {
        const uint32_t *mk = ds41_gmatch_mask(m, s);
        if (!mk) break;
        int allowed[512], na = 0;
        for (int id = 0; id < V; id++) {
            int bit = (mk[id >> 5] >> (id & 31)) & 1;
            int adv = ds41_gmatch_advance(m, s, id) >= 0;
            if (bit != adv) *mask_ok = 0;
            if (bit) allowed[na++] = id;
        }
        int can_end = ds41_gmatch_can_end(m, s);
        if (can_end && (na == 0 || rnd() % 4 == 0)) return out;
        if (na == 0) break;
        int id = allowed[rnd() % (unsigned)na];
        if (n + tokl[id] >= 4000) break;
        memcpy(out + n, tokp[id], tokl[id]);
        n += tokl[id];
        s = ds41_gmatch_advance(m, s, id);
    }
    free(out);
    return NULL;
}

static ds41_gmatch *compile(const char *gbnf, ds41_grammar **g) {
    char err[256];
    *g = ds41_grammar_gbnf(gbnf, strlen(gbnf), err, sizeof err);
    if (!*g) { printf("  grammar error: %s\n", err); return NULL; }
    return ds41_gmatch_new(*g, voc);
}

static int regex_full(const char *re, const char *s) {
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_ANCHORED | PCRE2_ENDANCHORED, &ec, &eo, NULL);
    if (!c) return -1;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(c, NULL);
    int rc = pcre2_match(c, (PCRE2_SPTR)s, strlen(s), 0, 0, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(c);
    return rc >= 0;
}

static void test_regex(void) {
    CASE_BEGIN();
    static const char *res[] = { "[a-c]{2,4}x?", "(ab|abc)+[0-9]", "\\d{3}-\\d{2}", "(true|false|null)", "[^a-z\\n\\x00]{1,3}",
                                 "\xc3\xa9+|\xe2\x82\xac{2}", "a.b", "(?:[A-F][0-9]){1,3}\\s?", "^\\w+$" };
    for (size_t i = 0; i < sizeof res / sizeof res[0]; i++) {
        char err[256];
        char *gb = ds41_regex_to_gbnf(res[i], strlen(res[i]), err, sizeof err);
        CHECK(gb, "regex %s: %s", res[i], err);
        if (!gb) continue;
        ds41_grammar *g;
        ds41_gmatch *m = compile(gb, &g);
        CHECK(m, "compile %s", gb);
        int mask_ok = 1, walks = 0;
        for (int k = 0; m && k < 40; k++) {
            char *o = walk(m, &mask_ok);
            if (!o) continue;
            walks++;
            CHECK(regex_full(res[i], o) == 1, "regex %s: output '%s' does not match", res[i], o);
            free(o);
        }
        CHECK(mask_ok, "regex %s: mask differs from advance", res[i]);
        CHECK(walks >= 30, "regex %s: only %d of 40 walks ended", res[i], walks);
        ds41_gmatch_free(m);
        ds41_grammar_free(g);
        free(gb);
    }
    static const char *bad[] = { "a*?", "(?=x)", "\\1", "a\\b", "(ab", "[z-a]", "*a", "a{2", "x^y" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[256] = "";
        char *gb = ds41_regex_to_gbnf(bad[i], strlen(bad[i]), err, sizeof err);
        ds41_grammar *g = gb ? ds41_grammar_gbnf(gb, strlen(gb), err, sizeof err) : NULL;
        CHECK(!g && err[0], "bad regex %s accepted", bad[i]);
        ds41_grammar_free(g);
        free(gb);
    }
    case_end("grammar_regex");
}

static void test_gbnf_errors(void) {
    CASE_BEGIN();
    static const struct { const char *g, *want; } c[] = {
        { "a ::= \"x\"", "no 'root'" }, { "root ::= foo", "'foo' is used but not defined" },
        { "root ::= root \"x\" | \"y\"", "left-recursive" }, { "root ::= a\na ::= b\nb ::= a \"x\"", "left-recursive" },
        { "root ::= \"abc", "unclosed string" }, { "root ::= [abc", "unclosed [" }, { "root ::= (\"a\"", "expected )" },
        { "root ::= \"a\"{5,2}", "max < min" }, { "root ::= \"a\"{5000}", "above 1000" }, { "root ::= \"\\q\"", "unknown escape" },
        { "root ::= \"a\"\nroot ::= \"b\"", "defined twice" }, { "root ::= x? y\nx ::= \"\"\ny ::= x root", "left-recursive" },
        { "root ::= [z-a]", "out of order" }, { "::= \"a\"", "expected a rule name" },
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char err[256] = "";
        ds41_grammar *g = ds41_grammar_gbnf(c[i].g, strlen(c[i].g), err, sizeof err);
        CHECK(!g && strstr(err, c[i].want), "'%s': got '%s', want '%s'", c[i].g, err, c[i].want);
        ds41_grammar_free(g);
    }
    /* a hostile repetition: 401 items of 1000 copies each are past the element limit */
    char *h = malloc(401 * 12 + 16);
    strcpy(h, "root ::=");
    for (int i = 0; i < 401; i++) strcat(h, " \"a\"{1000}");
    char err[256] = "";
    ds41_grammar *g = ds41_grammar_gbnf(h, strlen(h), err, sizeof err);
    free(h);
    CHECK(!g && strstr(err, "elements"), "nested repetitions: '%s'", err);
    ds41_grammar_free(g);
    case_end("grammar_gbnf_errors");
}

static void test_gbnf_walks(void) {
    CASE_BEGIN();
    /* llama.cpp-style arithmetic with comments and continuation lines */
    const char *gb = "root ::= expr   # comment\nexpr ::= term ([-+*/] term)*\nterm ::= num | \"(\" ws expr ws \")\"\n"
                     "num ::= [0-9]+\nws ::= [ ]?\n";
    ds41_grammar *g;
    ds41_gmatch *m = compile(gb, &g);
    CHECK(m, "compile");
    int mask_ok = 1, walks = 0;
    for (int k = 0; m && k < 60; k++) {
        char *o = walk(m, &mask_ok);
        if (!o) continue;
        walks++;
        CHECK(regex_full("[0-9( ][0-9()+*/ -]*", o) == 1 && o[0], "output '%s'", o);
        int depth = 0;
        for (char *p = o; *p; p++) { depth += *p == '('; depth -= *p == ')'; CHECK(depth >= 0, "unbalanced '%s'", o); }
        CHECK(depth == 0, "unbalanced '%s'", o);
        free(o);
    }
    CHECK(mask_ok && walks >= 20, "mask ok %d, %d walks", mask_ok, walks);
    long long st, comp, cached;
    if (m) ds41_gmatch_stats(m, &st, &comp, &cached);
    CHECK(m && cached > comp, "masks cached %lld, computed %lld", cached, comp);
    ds41_gmatch_free(m);
    ds41_grammar_free(g);
    case_end("grammar_gbnf_walks");
}

/* Checks value v against the test schemas' keywords (a small validator for what the walks
 * can produce; the server test validates with ajv). */
static int valid(const json_t *sc, const json_t *v, const json_t *root) {
    const json_t *ref = json_object_get(sc, "$ref");
    if (ref) return valid(json_object_get(json_object_get(root, "$defs"), json_string_value(ref) + 8), v, root);
    const json_t *en = json_object_get(sc, "enum");
    if (en) {
        for (size_t i = 0; i < json_array_size(en); i++) if (json_equal(json_array_get(en, i), (json_t *)v)) return 1;
        return 0;
    }
    const json_t *any = json_object_get(sc, "anyOf");
    if (any) {
        for (size_t i = 0; i < json_array_size(any); i++) if (valid(json_array_get(any, i), v, root)) return 1;
        return 0;
    }
    const char *t = json_string_value(json_object_get(sc, "type"));
    if (!t) return 1;
    if (!strcmp(t, "integer")) return json_is_integer(v);
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "string")) {
        if (!json_is_string(v)) return 0;
        const json_t *mx = json_object_get(sc, "maxLength");
        const char *fmt = json_string_value(json_object_get(sc, "format"));
        if (fmt && !strcmp(fmt, "date") && !regex_full("[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])", json_string_value(v))) return 0;
        if (mx) {
            size_t cps = 0;
            for (const char *p = json_string_value(v); *p; p++) cps += ((unsigned char)*p & 0xC0) != 0x80;
            if (cps > (size_t)json_integer_value(mx)) return 0;
        }
        return 1;
    }
    if (!strcmp(t, "array")) {
        if (!json_is_array(v)) return 0;
        const json_t *mx = json_object_get(sc, "maxItems"), *mn = json_object_get(sc, "minItems");
        if (mx && json_array_size(v) > (size_t)json_integer_value(mx)) return 0;
        if (mn && json_array_size(v) < (size_t)json_integer_value(mn)) return 0;
        for (size_t i = 0; i < json_array_size(v); i++) if (!valid(json_object_get(sc, "items"), json_array_get(v, i), root)) return 0;
        return 1;
    }
    if (!strcmp(t, "object")) {
        if (!json_is_object(v)) return 0;
        const json_t *props = json_object_get(sc, "properties"), *req = json_object_get(sc, "required");
        for (size_t i = 0; i < json_array_size(req); i++) if (!json_object_get(v, json_string_value(json_array_get(req, i)))) return 0;
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)v, k, x) {
            const json_t *ps = json_object_get(props, k);
            if (!ps || !valid(ps, x, root)) return 0;
        }
        return 1;
    }
    return 0;
}

static void test_schema(void) {
    CASE_BEGIN();
    static const char *schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\",\"maxLength\":3},"
        "\"c\":{\"type\":\"boolean\"}},\"required\":[\"b\"],\"additionalProperties\":false}",
        "{\"type\":\"array\",\"items\":{\"enum\":[\"x\",1,null,true]},\"minItems\":1,\"maxItems\":3}",
        "{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"null\"},{\"type\":\"string\",\"format\":\"date\"}]}",
        "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},"
        "{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"]}},\"$ref\":\"#/$defs/node\"}",
        "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":2},\"maxItems\":2}}}",
    };
    for (size_t i = 0; i < sizeof schemas / sizeof schemas[0]; i++) {
        char err[256];
        char *gb = ds41_schema_to_gbnf(schemas[i], strlen(schemas[i]), err, sizeof err);
        CHECK(gb, "schema %zu: %s", i, err);
        if (!gb) continue;
        ds41_grammar *g;
        ds41_gmatch *m = compile(gb, &g);
        CHECK(m, "schema %zu: compile", i);
        json_t *sc = json_loads(schemas[i], 0, NULL);
        int mask_ok = 1, walks = 0;
        for (int k = 0; m && k < 40; k++) {
            char *o = walk(m, &mask_ok);
            if (!o) continue;
            walks++;
            json_error_t je;
            json_t *v = json_loads(o, JSON_DECODE_ANY, &je);
            CHECK(v, "schema %zu: output '%s' is not JSON (%s)", i, o, je.text);
            if (v) CHECK(valid(sc, v, sc), "schema %zu: output '%s' is not valid", i, o);
            json_decref(v);
            free(o);
        }
        CHECK(mask_ok, "schema %zu: mask differs from advance", i);
        CHECK(walks >= 10, "schema %zu: only %d of 40 walks ended", i, walks);
        json_decref(sc);
        ds41_gmatch_free(m);
        ds41_grammar_free(g);
        free(gb);
    }
    static const struct { const char *s, *want; } bad[] = {
        { "{\"type\":\"integer\",\"minimum\":0}", "schema.minimum: not supported" },
        { "{\"type\":\"string\",\"format\":\"hostname\"}", "'hostname' is not supported" },
        { "{\"$ref\":\"http://x/y\"}", "is not supported" }, { "{\"$ref\":\"#/$defs/none\"}", "does not exist" },
        { "{\"oneOf\":[{\"type\":\"number\"},{\"type\":\"integer\"}]}", "may overlap" },
        { "{\"type\":\"object\",\"required\":[\"q\"]}", "not among the properties" },
        { "{\"type\":\"wizard\"}", "unknown type" }, { "false", "cannot be satisfied" }, { "{\"prefixItems\":[]}", "prefixItems: not supported" },
        { "{\"type\":\"string\",\"pattern\":\"a.b\"}", "'.' inside a JSON string" }, { "[", "invalid JSON" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[256] = "";
        char *gb = ds41_schema_to_gbnf(bad[i].s, strlen(bad[i].s), err, sizeof err);
        CHECK(!gb && strstr(err, bad[i].want), "%s: got '%s', want '%s'", bad[i].s, err, bad[i].want);
        free(gb);
    }
    /* deep nesting is refused by the depth limit, not by the C stack */
    char deep[8000] = "";
    for (int i = 0; i < 100; i++) strcat(deep, "{\"items\":");
    strcat(deep, "{}");
    for (int i = 0; i < 100; i++) strcat(deep, "}");
    char err[256] = "";
    char *gb = ds41_schema_to_gbnf(deep, strlen(deep), err, sizeof err);
    CHECK(!gb && strstr(err, "deeper than"), "deep schema: '%s'", err);
    free(gb);
    case_end("grammar_schema");
}

static void test_choice(void) {
    CASE_BEGIN();
    const char *ch[] = { "yes", "no", "maybe not" };
    size_t ln[] = { 3, 2, 9 };
    char err[128];
    char *gb = ds41_choice_to_gbnf(ch, ln, 3, err, sizeof err);
    ds41_grammar *g;
    ds41_gmatch *m = gb ? compile(gb, &g) : NULL;
    CHECK(m, "compile");
    int mask_ok = 1;
    for (int k = 0; m && k < 30; k++) {
        char *o = walk(m, &mask_ok);
        CHECK(o && (!strcmp(o, "yes") || !strcmp(o, "no") || !strcmp(o, "maybe not")), "output '%s'", o ? o : "(none)");
        free(o);
    }
    CHECK(mask_ok, "mask");
    if (m) { ds41_gmatch_free(m); ds41_grammar_free(g); }
    free(gb);
    case_end("grammar_choice");
}

/* ds41_gmask_apply in each instruction set this CPU has (scalar, AVX2, AVX-512) against the
 * definition: row[i] becomes -inf exactly where bit i is clear and keeps its value elsewhere,
 * for masks all clear, all set, sparse and dense, at sizes that end inside a word and the
 * production's. */
static void test_mask_apply(void) {
    CASE_BEGIN();
    static const int sizes[] = { 1, 31, 32, 33, 4096, 4097, 129280 };
    unsigned r = 7;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int n = sizes[k], words = (n + 31) / 32;
        uint32_t *mk = malloc((size_t)words * sizeof *mk);
        float *row = malloc((size_t)n * sizeof *row);
        for (int isa = 0; isa <= ds41_gmask_isa(); isa++) {
            for (int kind = 0; kind < 4 && mk && row; kind++) {
                for (int w = 0; w < words; w++) {
                    r = r * 1103515245u + 12345u;
                    uint32_t x = r ^ (r << 13);
                    mk[w] = kind == 0 ? 0 : kind == 1 ? 0xFFFFFFFFu : kind == 2 ? (x & (x >> 7) & (x >> 11)) : (x | (x >> 5));
                    if (kind >= 2 && w % 5 == 0) mk[w] = w % 10 ? 0xFFFFFFFFu : 0;   /* whole words too */
                }
                for (int i = 0; i < n; i++) row[i] = (float)i * 0.5f - 7.0f;
                ds41_gmask_apply_isa(mk, row, n, isa);
                int bad = -1;
                for (int i = 0; i < n && bad < 0; i++) {
                    int on = mk[i >> 5] >> (i & 31) & 1;
                    if (on ? row[i] != (float)i * 0.5f - 7.0f : !(isinf(row[i]) && row[i] < 0)) bad = i;
                }
                CHECK(bad < 0, "mask_apply: isa %d size %d kind %d: entry %d is %g", isa, n, kind, bad, bad < 0 ? 0.0 : row[bad]);
            }
        }
        CHECK(mk && row, "mask_apply: out of memory");
        free(mk);
        free(row);
    }
    case_end("grammar_mask_apply");
}

int main(void) {
    test_mask_apply();
    make_vocab();
    CHECK(voc != NULL, "vocab");
    test_gbnf_errors();
    test_gbnf_walks();
    test_regex();
    test_schema();
    test_choice();
    ds41_gvocab_free(voc);
    return check_total_failed ? 1 : 0;
}
